/* Helper kernels of test_cuda_backend.c: an engine-like writer that first
 * spins on a host flag (so a store is certainly queued before the KV it must
 * copy is written), and a plain copy kernel that reads a loaded layer. */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" int kvt_test_cuda_spin_then_fill(volatile int *flag, unsigned char *const *pieces,
                                            uint32_t n_pieces, uint32_t piece_bytes, void *stream);
extern "C" int kvt_test_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);

/* The byte a test expects at offset `off` of piece `p` after the writer ran. */
__host__ __device__ static unsigned char pattern(uint32_t p, uint32_t off) {
  return (unsigned char)(p * 131u + off * 7u + 1u);
}

__global__ void spin_then_fill(volatile int *flag, unsigned char *const *pieces, uint32_t n_pieces,
                               uint32_t piece_bytes) {
  if (threadIdx.x == 0) {
    /* Bounded (~10 s at H200 clocks) so a broken test cannot hang forever. */
    long long start = clock64();
    while (*flag == 0 && clock64() - start < (1ll << 34)) {
    }
  }
  __syncthreads();
  for (uint32_t p = 0; p < n_pieces; p++)
    for (uint32_t i = threadIdx.x; i < piece_bytes; i += blockDim.x) pieces[p][i] = pattern(p, i);
}

__global__ void copy_bytes(unsigned char *dst, const unsigned char *src, size_t bytes) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

extern "C" int kvt_test_cuda_spin_then_fill(volatile int *flag, unsigned char *const *pieces,
                                            uint32_t n_pieces, uint32_t piece_bytes, void *stream) {
  spin_then_fill<<<1, 256, 0, (cudaStream_t)stream>>>(flag, pieces, n_pieces, piece_bytes);
  return (int)cudaGetLastError();
}

extern "C" int kvt_test_cuda_copy(void *dst, const void *src, size_t bytes, void *stream) {
  copy_bytes<<<64, 256, 0, (cudaStream_t)stream>>>((unsigned char *)dst, (const unsigned char *)src, bytes);
  return (int)cudaGetLastError();
}
