# test_cuda_backend: the CUDA runtime for its own calls, and helper kernels
# (an engine-like writer and reader) when nvcc is there (cmake/cuda.cmake
# enabled the CUDA language and built the library's kernels).
if(KVT_HAVE_CUDA)
  target_link_libraries(test_cuda_backend PRIVATE CUDA::cudart)
  if(TARGET kvtier_cuda_kernels)
    add_library(kvt_test_cuda_kernels STATIC ${CMAKE_CURRENT_SOURCE_DIR}/test_cuda_backend_kernels.cu)
    set_target_properties(kvt_test_cuda_kernels PROPERTIES
      CUDA_ARCHITECTURES "${KVT_CUDA_ARCHITECTURES}"
      CUDA_RUNTIME_LIBRARY Shared
      POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(test_cuda_backend PRIVATE kvt_test_cuda_kernels)
    target_compile_definitions(test_cuda_backend PRIVATE KVT_TEST_CUDA_KERNELS)
  endif()
endif()
