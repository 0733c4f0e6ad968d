# `cmake --install` for C++ users: the static library, the public headers, a CMake package (qkvConfig.cmake:
# find_package(qkv CONFIG REQUIRED), then link qkv::qkv) and a pkg-config file (qkv.pc). The public headers
# include only the standard library, so a consumer compiles against them alone; the library's own
# dependencies (OpenMP, oneDNN, zlib) are link-time only, and qkvConfig.cmake finds them for the link.
# Not used by the Python wheel (scikit-build-core installs the module and the command, python/CMakeLists.txt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS qkv EXPORT qkvTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/qkv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/qkv/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/qkv)
if(TARGET qkv_cli)
  install(TARGETS qkv_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY ${PROJECT_BINARY_DIR}/share/qkv DESTINATION ${CMAKE_INSTALL_DATADIR})  # its default model
endif()

set(qkv_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)
install(EXPORT qkvTargets NAMESPACE qkv:: DESTINATION ${qkv_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qkvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/qkvConfig.cmake INSTALL_DESTINATION ${qkv_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qkvConfig.cmake ${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake
        DESTINATION ${qkv_cmake_dir})

# pkg-config: the static library needs its dependencies on the link line (Libs.private for --static).
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv.pc.in ${PROJECT_BINARY_DIR}/qkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/qkv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
