# Which GPU architectures the CUDA kernels are compiled for (docs/gpu.md, "Architectures").
#
#  1. -DCMAKE_CUDA_ARCHITECTURES=... wins (CMake's syntax: "89", "80-real;90-real;120",
#     "80-virtual" for PTX only, ...); scripts/setup.sh passes $RP_CUDA_ARCHS this way.
#  2. Otherwise, when nvidia-smi lists GPUs, their compute capabilities (deduplicated:
#     "8.9" -> 89), each as a cubin, so nothing is JIT-compiled at start.
#  3. Otherwise (a build machine without a GPU, CI) RP_CUDA_DEFAULT_ARCHS: a cubin for each
#     family most users own (an sm_80 cubin runs on 8.x: A100, RTX 3090, RTX 4090, L40S;
#     sm_90 on Hopper) and compute_100 PTX, which the driver JIT-compiles once (then caches)
#     on Blackwell (B200 sm_100, RTX 5090 sm_120) and on GPUs newer than this toolkit knows.
# The choice ends up in the cache, so a later configure keeps it; RP_CUDA_ARCHS_COMPILED is
# the list as compiled, which the runtime prints when a GPU is not covered.
set(RP_CUDA_DEFAULT_ARCHS "80-real;90-real;100-virtual"
    CACHE STRING "architectures for a build machine without a visible GPU (docs/gpu.md)")

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(_rp_archs "")
  set(_rp_why "")
  find_program(RP_NVIDIA_SMI nvidia-smi)
  if(RP_NVIDIA_SMI)
    execute_process(COMMAND ${RP_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE _rp_caps RESULT_VARIABLE _rp_rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 20)
    if(_rp_rc EQUAL 0 AND _rp_caps)
      string(REPLACE "\n" ";" _rp_caps "${_rp_caps}")
      foreach(_cap IN LISTS _rp_caps)
        string(STRIP "${_cap}" _cap)
        if(_cap MATCHES "^([0-9]+)\\.([0-9]+)$")
          list(APPEND _rp_archs "${CMAKE_MATCH_1}${CMAKE_MATCH_2}-real")
        endif()
      endforeach()
      list(REMOVE_DUPLICATES _rp_archs)
      set(_rp_why "the GPUs nvidia-smi lists")
    endif()
  endif()
  if(NOT _rp_archs)
    set(_rp_archs "${RP_CUDA_DEFAULT_ARCHS}")
    set(_rp_why "no GPU visible: RP_CUDA_DEFAULT_ARCHS")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_rp_archs}" CACHE STRING
      "GPU architectures of the CUDA kernels (docs/gpu.md, \"Architectures\")")
  message(STATUS "RoundPipe: CUDA architectures ${_rp_archs} (${_rp_why}; override with -DCMAKE_CUDA_ARCHITECTURES=...)")
else()
  message(STATUS "RoundPipe: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (as given)")
endif()

# Architectures below sm_80 cannot run the kernels (cp.async, bf16 tensor cores).
foreach(_a IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(_a MATCHES "^([0-9]+)" AND CMAKE_MATCH_1 LESS 80)
    message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES: ${_a} is below sm_80; RoundPipe's kernels need sm_80 or newer "
                        "(cp.async, bf16 tensor cores)")
  endif()
  if(_a MATCHES "^(all|all-major)$")
    message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES: '${_a}' includes architectures below sm_80; give numbers (e.g. 89 or 80-real;90-real) or native")
  endif()
endforeach()
string(REPLACE ";" "," RP_CUDA_ARCHS_COMPILED "${CMAKE_CUDA_ARCHITECTURES}")
