# The installed C++ library (`cmake --install BUILD --prefix PREFIX`):
#   PREFIX/lib/libshardsafe.so        every module, whole (one library to link)
#   PREFIX/lib/libshardsafe_mpi.so    MakeMpiComm (shardsafe/mpi_comm.h), when built with MPI
#   PREFIX/include/shardsafe/         the public headers (no third-party header among them)
#   PREFIX/lib/cmake/shardsafe/       find_package(shardsafe [COMPONENTS mpi]): shardsafe::shardsafe,
#                                     and with the component, shardsafe::mpi
#   PREFIX/lib/pkgconfig/             shardsafe.pc, shardsafe-mpi.pc
#   PREFIX/bin/shardsafe              the command-line tool
# The module libraries stay static and internal: the shared library carries
# their dependencies (ISA-L, RE2, libcurl, OpenSSL, pugixml) as its own, so a program links
# shardsafe::shardsafe and nothing else. tests/install builds the README's
# C++ examples against the installed package.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_shardsafe_modules ss_base ss_format ss_layout ss_storage ss_s3 ss_comm ss_engine_catalog
    ss_engine_save ss_engine_shared_reads ss_engine_load ss_engine_tools ss_engine ss_hf)
list(JOIN _shardsafe_modules "," _shardsafe_whole)
add_library(shardsafe_lib SHARED ${PROJECT_SOURCE_DIR}/cmake/shardsafe_lib.cc)
target_link_libraries(shardsafe_lib PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${_shardsafe_whole}>")
target_include_directories(shardsafe_lib INTERFACE
                           $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(shardsafe_lib INTERFACE cxx_std_20)
set_target_properties(shardsafe_lib PROPERTIES OUTPUT_NAME shardsafe EXPORT_NAME shardsafe
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
add_library(shardsafe::shardsafe ALIAS shardsafe_lib)

install(TARGETS shardsafe_lib EXPORT shardsafeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The MPI component, exported apart (shardsafeMpiTargets.cmake) so that only
# a consumer that asks for it (find_package(shardsafe COMPONENTS mpi)) needs
# MPI; the package config links the consumer's own MPI target into it. Its
# consumers compile without MPI's C++ bindings (libmpi_cxx, which nothing
# links): a program that includes <mpi.h> itself links all the same.
if(SHARDSAFE_MPI)
  add_library(shardsafe_mpi SHARED ${PROJECT_SOURCE_DIR}/src/comm/mpi/mpi_comm.cc)
  target_link_libraries(shardsafe_mpi PUBLIC shardsafe_lib PRIVATE MPI::MPI_C)
  target_include_directories(shardsafe_mpi PRIVATE
                             $<TARGET_PROPERTY:ss_comm,INTERFACE_INCLUDE_DIRECTORIES>)
  target_compile_definitions(shardsafe_mpi INTERFACE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  # INSTALL_RPATH: it finds libshardsafe.so beside it, also for a program
  # that calls nothing else of it (the linker's --as-needed then drops it).
  set_target_properties(shardsafe_mpi PROPERTIES EXPORT_NAME mpi VERSION ${PROJECT_VERSION}
                        SOVERSION ${PROJECT_VERSION_MAJOR} INSTALL_RPATH "$ORIGIN")
  add_library(shardsafe::mpi ALIAS shardsafe_mpi)
  install(TARGETS shardsafe_mpi EXPORT shardsafeMpiTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shardsafe
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET shardsafe)  # the CLI
  install(TARGETS shardsafe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(_shardsafe_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/shardsafe)
install(EXPORT shardsafeTargets NAMESPACE shardsafe:: DESTINATION ${_shardsafe_cmake_dir})
if(SHARDSAFE_MPI)
  install(EXPORT shardsafeMpiTargets NAMESPACE shardsafe:: DESTINATION ${_shardsafe_cmake_dir})
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shardsafeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/shardsafeConfig.cmake
                              INSTALL_DESTINATION ${_shardsafe_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardsafeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardsafeConfig.cmake
              ${PROJECT_BINARY_DIR}/shardsafeConfigVersion.cmake
        DESTINATION ${_shardsafe_cmake_dir})

# Relocatable: the prefix is found from where the .pc file lies.
file(RELATIVE_PATH SHARDSAFE_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
foreach(pc shardsafe shardsafe-mpi)
  if(pc STREQUAL "shardsafe-mpi" AND NOT SHARDSAFE_MPI)
    continue()
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
