# Installation as a CMake package: find_package(ember) + ember::ember.
include(CMakePackageConfigHelpers)

install(TARGETS ember EXPORT emberTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY lib/include/ember DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES "${PROJECT_BINARY_DIR}/lib/include/ember/version.h"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ember)
install(EXPORT emberTargets NAMESPACE ember::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ember)

configure_package_config_file(cmake/emberConfig.cmake.in
  "${PROJECT_BINARY_DIR}/emberConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ember)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/emberConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/emberConfig.cmake" "${PROJECT_BINARY_DIR}/emberConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ember)
