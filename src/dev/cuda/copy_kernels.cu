/* Gather/scatter of whole blocks between device slots and mapped pinned host
 * memory. Each CTA takes work items (a piece of one block, one layer, one
 * segment, cut at KVT_CUDA_KERNEL_ITEM_BYTES) in a grid-stride loop; threads
 * move 16-byte vectors, four loads in flight each before storing, so enough
 * PCIe reads are outstanding to fill the link. */
#include <cuda_runtime.h>

#include "cuda_kernels.h"
#include "cuda_tuning.h"

#define UNROLL 4

__device__ static void copy_vec16(char *dst, const char *src, size_t len) {
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
  uint4 *d = reinterpret_cast<uint4 *>(dst);
  size_t n = len / 16;
  for (size_t i = threadIdx.x; i < n; i += (size_t)blockDim.x * UNROLL) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; k++) {
      size_t idx = i + (size_t)k * blockDim.x;
      if (idx < n) v[k] = s[idx];
    }
#pragma unroll
    for (int k = 0; k < UNROLL; k++) {
      size_t idx = i + (size_t)k * blockDim.x;
      if (idx < n) d[idx] = v[k];
    }
  }
}

__device__ static void copy_bytes(char *dst, const char *src, size_t len) {
  for (size_t i = threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
}

__global__ void kvt__cuda_copy_kernel(kvt__cuda_copy_args a, uint32_t items_per_piece) {
  __shared__ kvt__cuda_seg_desc seg;
  __shared__ kvt__cuda_block_desc blk;
  const uint32_t per_block = a.n_layers * a.spl;
  const size_t items = (size_t)a.n_blocks * per_block * items_per_piece;
  for (size_t it = blockIdx.x; it < items; it += gridDim.x) {
    size_t piece = it / items_per_piece;
    uint64_t start = (uint64_t)(it % items_per_piece) * KVT_CUDA_KERNEL_ITEM_BYTES;
    uint32_t b = (uint32_t)(piece / per_block), r = (uint32_t)(piece % per_block);
    __syncthreads(); /* the previous item is done with seg/blk */
    if (threadIdx.x == 0) {
      seg = a.segs[(size_t)(a.layer_first + r / a.spl) * a.spl + r % a.spl];
      blk = a.blocks[b]; /* one zero-copy read per item, not one per thread */
    }
    __syncthreads();
    if (start >= seg.bytes) continue;
    uint64_t len = seg.bytes - start;
    if (len > KVT_CUDA_KERNEL_ITEM_BYTES) len = KVT_CUDA_KERNEL_ITEM_BYTES;
    char *dev = reinterpret_cast<char *>(seg.dev_base + (uint64_t)blk.slot * seg.stride + start);
    char *host = reinterpret_cast<char *>(blk.host + seg.host_off + start);
    char *dst = a.to_host ? host : dev;
    const char *src = a.to_host ? dev : host;
    if (a.vec16) copy_vec16(dst, src, len);
    else copy_bytes(dst, src, len);
  }
}

extern "C" int kvt__cuda_launch_copy(const kvt__cuda_copy_args *a, unsigned max_ctas, void *stream) {
  uint32_t items_per_piece =
      (uint32_t)((a->max_seg_bytes + KVT_CUDA_KERNEL_ITEM_BYTES - 1) / KVT_CUDA_KERNEL_ITEM_BYTES);
  size_t items = (size_t)a->n_blocks * a->n_layers * a->spl * items_per_piece;
  if (items == 0) return (int)cudaSuccess;
  unsigned ctas = items < max_ctas ? (unsigned)items : max_ctas;
  /* cudaLaunchKernel returns this launch's own error; cudaGetLastError
   * after <<<>>> would also report (and clear) a stale error of the
   * engine's thread as ours. */
  kvt__cuda_copy_args args = *a;
  void *params[2] = {&args, &items_per_piece};
  return (int)cudaLaunchKernel((const void *)kvt__cuda_copy_kernel, dim3(ctas ? ctas : 1),
                               dim3(KVT_CUDA_KERNEL_THREADS), params, 0, (cudaStream_t)stream);
}

extern "C" int kvt__cuda_kernel_load(void) {
  cudaFuncAttributes attr;
  return (int)cudaFuncGetAttributes(&attr, (const void *)kvt__cuda_copy_kernel);
}
