# The Python module roundpipe._roundpipe (python/, docs/python.md): pybind11 (Debian's
# pybind11-dev) over the same static libraries as the command. Built for the Python that
# `python3` on PATH resolves to (pyenv's shim included: its sys.executable), unless
# Python_EXECUTABLE is given (scikit-build-core, `pip install .`, passes the one running pip).
# Sets RP_PYTHON_MODULE_BUILT, and RP_PYTHON_MODULE_WHY when it is not built.
set(RP_PYTHON_MODULE_BUILT OFF)
if(NOT DEFINED Python_EXECUTABLE)
  find_program(rp_python3 python3 NO_CACHE)
  if(rp_python3)
    execute_process(COMMAND ${rp_python3} -c "import sys; print(sys.executable)"
                    OUTPUT_VARIABLE rp_python3_exe OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rp_rc ERROR_QUIET)
    if(rp_rc EQUAL 0 AND EXISTS "${rp_python3_exe}")
      set(Python_EXECUTABLE "${rp_python3_exe}")
    endif()
  endif()
endif()
find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
if(Python_FOUND)
  set(PYBIND11_FINDPYTHON ON)  # use the Python found above, not pybind11's own search
  find_package(pybind11 2.9 CONFIG QUIET)
endif()
if(NOT Python_FOUND)
  set(RP_PYTHON_MODULE_WHY "no Python 3 with its headers (python3 on PATH: '${Python_EXECUTABLE}')")
elseif(NOT pybind11_FOUND)
  set(RP_PYTHON_MODULE_WHY "pybind11 not found (Debian/Ubuntu: apt-get install pybind11-dev)")
else()
  file(GLOB rp_py_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/python/*.cpp)
  pybind11_add_module(_roundpipe ${rp_py_srcs})
  target_include_directories(_roundpipe PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/generated)
  add_dependencies(_roundpipe rp_git_commit)  # roundpipe_version.hpp's commit
  target_link_libraries(_roundpipe PRIVATE rp_cli)
  # pybind11 links the module with -flto; GCC's link then warns that it runs its LTO jobs one
  # after another unless told how many: as many as the machine has (the last -flto counts)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_link_options(_roundpipe PRIVATE -flto=auto)
  endif()
  # build/python/roundpipe/ is the importable package (PYTHONPATH=build/python): the compiled
  # module beside links to the pure-Python files, so edits to them need no rebuild
  set(rp_py_pkg ${CMAKE_CURRENT_BINARY_DIR}/python/roundpipe)
  set_target_properties(_roundpipe PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${rp_py_pkg})
  file(MAKE_DIRECTORY ${rp_py_pkg})
  file(GLOB rp_py_files CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/python/roundpipe/*.py)
  foreach(f ${rp_py_files})
    get_filename_component(n ${f} NAME)
    file(CREATE_LINK ${f} ${rp_py_pkg}/${n} SYMBOLIC)
  endforeach()
  if(SKBUILD)  # pip install .: the module goes into the wheel's package folder beside the .py files
    install(TARGETS _roundpipe LIBRARY DESTINATION roundpipe COMPONENT python)
  endif()
  set(RP_PYTHON_MODULE_BUILT ON)
  message(STATUS "RoundPipe: Python module ON (${Python_EXECUTABLE}, Python ${Python_VERSION}, pybind11 ${pybind11_VERSION})")
endif()
if(NOT RP_PYTHON_MODULE_BUILT)
  message(STATUS "RoundPipe: Python module OFF: ${RP_PYTHON_MODULE_WHY}")
endif()
