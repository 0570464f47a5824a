# What `cmake --install` installs, and the CMake package a program outside
# this repository finds with find_package(FsdpMlir) (docs/Embedding.md).
#
# The runtime is installed as one library, static and shared
# (libfsdp_runtime.a, libfsdp_runtime.so), made of the objects of FSDPRuntime
# and the plain C++ layers it is built on (FSDPPlan, FSDPFormat, FSDPLayout).
# Every rule names its component, so a project that adds this one as a
# subdirectory (python/) installs only what it asks for:
#   runtime  libfsdp_runtime.so: what a program linked to it needs to run
#   dev      headers, libfsdp_runtime.a, FsdpMlirConfig.cmake and its files
#   tools    fsdp-ckpt, and fsdp-opt and fsdp-translate when the compiler is
#            built (FSDP_BUILD_COMPILER), which fsdp_add_checkpoint_library runs
# No installed file names a path of the build tree; the third-party
# libraries are found again where the package is used.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The package's install rules by default only when this is the top project:
# a parent that adds it (python/, EXCLUDE_FROM_ALL) builds only what it links.
if(CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
  set(fsdp_install_default ON)
else()
  set(fsdp_install_default OFF)
endif()
option(FSDP_INSTALL "Add the install rules and the CMake package (components runtime, dev, tools)"
       ${fsdp_install_default})

# What the runtime's objects need, found again here (imported targets are
# visible only in the directory that found them).
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(MPI COMPONENTS C QUIET)

set(fsdp_runtime_parts FSDPRuntime FSDPPlan FSDPFormat FSDPLayout)
set(fsdp_runtime_objects)
foreach(part IN LISTS fsdp_runtime_parts)
  list(APPEND fsdp_runtime_objects $<TARGET_OBJECTS:${part}>)
endforeach()

add_library(fsdp_runtime_shared SHARED ${fsdp_runtime_objects})
add_library(fsdp_runtime_static STATIC ${fsdp_runtime_objects})
set_target_properties(fsdp_runtime_shared PROPERTIES
  OUTPUT_NAME fsdp_runtime
  EXPORT_NAME runtime_shared
  LINKER_LANGUAGE CXX
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  # The system directories of what it links (MPI's own directory on Debian).
  INSTALL_RPATH_USE_LINK_PATH ON)
set_target_properties(fsdp_runtime_static PROPERTIES
  OUTPUT_NAME fsdp_runtime
  EXPORT_NAME runtime_static
  LINKER_LANGUAGE CXX)

foreach(lib fsdp_runtime_shared fsdp_runtime_static)
  target_include_directories(${lib} INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${lib} INTERFACE cxx_std_17)
  if(MPI_C_FOUND)
    # MpiCommunicator.h includes mpi.h. Installed: FsdpMlir::mpi, which the
    # package config makes of MPI's C or C++ target, whichever language the
    # user's project has enabled.
    target_link_libraries(${lib} PUBLIC $<BUILD_INTERFACE:MPI::MPI_C>
                                        $<INSTALL_INTERFACE:FsdpMlir::mpi>)
  endif()
endforeach()

# The shared library carries its dependencies; the static one names them in
# its link interface: CMake packages where they have one, imported targets
# the package config makes (FsdpMlir::xxhash, FsdpMlir::isal) where not.
target_link_libraries(fsdp_runtime_shared PRIVATE ZLIB::ZLIB xxhash Threads::Threads
                      ${CMAKE_DL_LIBS})
target_link_libraries(fsdp_runtime_static PRIVATE ZLIB::ZLIB Threads::Threads ${CMAKE_DL_LIBS}
                      $<BUILD_INTERFACE:xxhash> $<INSTALL_INTERFACE:FsdpMlir::xxhash>)
set(FSDP_PACKAGE_WITH_ISAL OFF)
if(FSDP_ISAL_INCLUDE_DIR AND FSDP_ISAL_LIBRARY)
  set(FSDP_PACKAGE_WITH_ISAL ON)
  target_link_libraries(fsdp_runtime_shared PRIVATE ${FSDP_ISAL_LIBRARY})
  target_link_libraries(fsdp_runtime_static PRIVATE
                        $<BUILD_INTERFACE:${FSDP_ISAL_LIBRARY}> $<INSTALL_INTERFACE:FsdpMlir::isal>)
endif()
if(FSDP_CUDA_FOUND)
  # cudart static, as in FSDPRuntime (runtime/cuda); NCCL is dlopen'd.
  target_link_libraries(fsdp_runtime_shared PRIVATE CUDA::cudart_static)
  target_link_libraries(fsdp_runtime_static PRIVATE CUDA::cudart_static)
endif()
set(FSDP_PACKAGE_WITH_MPI ${MPI_C_FOUND})
set(FSDP_PACKAGE_WITH_CUDA ${FSDP_CUDA_FOUND})

# fsdp_add_checkpoint_library in this build too (the tools and the runtime
# are this build's targets).
include(${CMAKE_CURRENT_LIST_DIR}/FsdpMlirCheckpointLibrary.cmake)

if(NOT FSDP_INSTALL)
  return()
endif()

set(fsdp_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/FsdpMlir)

install(TARGETS fsdp_runtime_shared fsdp_runtime_static
  EXPORT FsdpMlirTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# The public headers of the runtime and of the layers they include; the C
# header also at the top, so `#include "fsdp_runtime.h"` works.
foreach(dir Runtime Plan Format Layout Support)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/fsdp/${dir}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdp COMPONENT dev
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/include/fsdp/Runtime/fsdp_runtime.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

# The tools, and an export of them for fsdp_add_checkpoint_library.
set(fsdp_tools fsdp-ckpt)
if(TARGET fsdp-opt AND TARGET fsdp-translate)
  list(APPEND fsdp_tools fsdp-opt fsdp-translate)
endif()
# Their RPATH keeps the system directories they link from (MPI's on Debian,
# LLVM's own), never the build tree.
set_target_properties(${fsdp_tools} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS ${fsdp_tools} EXPORT FsdpMlirToolTargets
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
install(EXPORT FsdpMlirToolTargets NAMESPACE FsdpMlir:: DESTINATION ${fsdp_cmake_dir}
        COMPONENT tools)

install(EXPORT FsdpMlirTargets NAMESPACE FsdpMlir:: DESTINATION ${fsdp_cmake_dir}
        COMPONENT dev)
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/FsdpMlirConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/FsdpMlirConfig.cmake
  INSTALL_DESTINATION ${fsdp_cmake_dir})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/FsdpMlirConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/FsdpMlirConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/FsdpMlirConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/FsdpMlirCheckpointLibrary.cmake
  DESTINATION ${fsdp_cmake_dir} COMPONENT dev)
