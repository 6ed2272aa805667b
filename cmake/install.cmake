# `cmake --install build --prefix P` installs the `roundpipe` command (P/bin), the public
# headers (include/roundpipe/), the static libraries and a CMake package, so that an outside
# project does
#   find_package(RoundPipe REQUIRED)      # or find_package(roundpipe): one config for both spellings
#   target_link_libraries(app PRIVATE roundpipe::roundpipe)
#   add_custom_command(... COMMAND roundpipe::cli train spec.json)   # the installed command
# with CMAKE_PREFIX_PATH=P. The files are named roundpipe-config.cmake and
# roundpipe-config-version.cmake, the lower-case form find_package looks for under any
# spelling of the package name. The package config finds the libraries ours link (CAF by its
# absolute paths, the others through their own CMake or pkg-config files).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/roundpipe)
install(DIRECTORY include/roundpipe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
install(TARGETS rp_api rp_trainer rp_dist rp_actors rp_formats rp_model rp_optimizer rp_scheduler rp_trace rp_tier rp_kernels rp_data rp_base caf_core
        EXPORT roundpipeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT roundpipeTargets NAMESPACE roundpipe:: DESTINATION ${RP_INSTALL_CMAKEDIR})

set(RP_PACKAGE_WITH_CUDA ${RP_HAVE_CUDA})
set(RP_PACKAGE_WITH_MPI ${RP_HAVE_MPI})
configure_package_config_file(cmake/roundpipeConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/roundpipe-config.cmake
                              INSTALL_DESTINATION ${RP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/roundpipe-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/roundpipe-config.cmake ${CMAKE_CURRENT_BINARY_DIR}/roundpipe-config-version.cmake
        DESTINATION ${RP_INSTALL_CMAKEDIR})
