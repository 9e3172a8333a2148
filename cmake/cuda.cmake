# CUDA kernels of the device backend (included by CMakeLists.txt when the
# toolkit is found). Builds src/dev/cuda/*.cu into kvtier_cuda_kernels, a PIC
# static library that kvtier and kvtier_static link. Code for sm_90 (H100,
# H200) plus PTX for compute_80 so newer GPUs (and A100) JIT it. Override
# with -DKVT_CUDA_ARCHITECTURES="..." (CMake CUDA_ARCHITECTURES syntax).
# Without a usable nvcc the backend is built without its kernel path.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  find_program(KVT_NVCC nvcc HINTS ${CUDAToolkit_BIN_DIR})
  if(KVT_NVCC)
    # nvcc runs the host C++ compiler even for .cu files without C++ code.
    message(WARNING "kvtier: ${KVT_NVCC} cannot compile a test program (is g++ installed? "
      "nvcc needs the host C++ compiler): CUDA backend without its copy kernel")
  else()
    message(WARNING "kvtier: CUDA runtime found but no nvcc: CUDA backend without its copy kernel")
  endif()
  return()
endif()
enable_language(CUDA)
set(KVT_CUDA_ARCHITECTURES "90-real;80-virtual" CACHE STRING "CUDA architectures of kvtier's kernels")

file(GLOB KVT_CUDA_KERNEL_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/../src/dev/cuda/*.cu)
add_library(kvtier_cuda_kernels STATIC ${KVT_CUDA_KERNEL_SOURCES})
set_target_properties(kvtier_cuda_kernels PROPERTIES
  CUDA_ARCHITECTURES "${KVT_CUDA_ARCHITECTURES}"
  CUDA_STANDARD 17
  POSITION_INDEPENDENT_CODE ON
  # The library links the shared cudart (CUDA::cudart); a second, static
  # runtime in the same process would not share streams or events with it.
  CUDA_RUNTIME_LIBRARY Shared
  CUDA_VISIBILITY_PRESET hidden
  CXX_VISIBILITY_PRESET hidden)
target_include_directories(kvtier_cuda_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src)
target_compile_options(kvtier_cuda_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
target_link_libraries(kvtier_cuda_kernels PUBLIC CUDA::cudart)
target_compile_definitions(kvtier_objects PRIVATE KVT_HAVE_CUDA_KERNELS)
