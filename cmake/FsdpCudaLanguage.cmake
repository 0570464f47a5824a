# Finds a CUDA compiler (nvcc on PATH or CUDACXX, else under CUDAToolkit_ROOT,
# CUDA_HOME, CUDA_PATH or /usr/local/cuda) and enables the CUDA language with
# the project's settings (sm_90 and its PTX, C++17, ccache). Included, not
# called: enable_language works at file scope only, and must run in the top
# directory of every target that links CUDA code (the root, and python/,
# which adds the root as a subdirectory). CMAKE_CUDA_COMPILER is empty after
# it when none was found.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(FSDP_NVCC_ON_PATH nvcc)
  if(NOT FSDP_NVCC_ON_PATH)
    foreach(root IN ITEMS "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}"
                          "$ENV{CUDA_PATH}" /usr/local/cuda)
      if(root AND EXISTS "${root}/bin/nvcc")
        set(ENV{CUDACXX} "${root}/bin/nvcc") # what check_language tries
        break()
      endif()
    endforeach()
  endif()
endif()
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual" CACHE STRING "CUDA architectures (sm_90 and its PTX)")
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  if(CCACHE_PROGRAM AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  endif()
  enable_language(CUDA)
endif()
