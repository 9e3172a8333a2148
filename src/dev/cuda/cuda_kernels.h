/* The gather/scatter kernel of the CUDA backend: moves whole blocks between
 * device slots and mapped pinned host memory with SM loads and stores, for
 * pieces too small for the copy engines (cuda_tuning.h). Built by nvcc
 * (cmake/cuda.cmake), called from C. */
#ifndef KVT_DEV_CUDA_KERNELS_H
#define KVT_DEV_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One segment of the layout, in device memory (uploaded at open). */
typedef struct kvt__cuda_seg_desc {
  uint64_t dev_base, stride, bytes;
  uint64_t host_off; /* offset of this segment inside a block's host payload */
} kvt__cuda_seg_desc;

/* One block of a transfer, in mapped pinned memory the kernel reads. */
typedef struct kvt__cuda_block_desc {
  uint64_t host; /* device-visible address of the block's host payload */
  uint32_t slot;
  uint32_t pad;
} kvt__cuda_block_desc;

typedef struct kvt__cuda_copy_args {
  const kvt__cuda_seg_desc *segs;     /* device memory, num_layers * spl entries */
  const kvt__cuda_block_desc *blocks; /* device-visible, n_blocks entries */
  uint32_t n_blocks;
  uint32_t spl;         /* segments per layer */
  uint32_t layer_first; /* layers [layer_first, layer_first + n_layers) */
  uint32_t n_layers;
  uint64_t max_seg_bytes; /* largest segment: sizes the work grid */
  int to_host;          /* 1: device -> host (store), 0: host -> device (load) */
  int vec16;            /* 1: every address and size is 16-byte aligned */
} kvt__cuda_copy_args;

/* Launches the copy on `stream` (a cudaStream_t) with at most max_ctas CTAs.
 * Returns the cudaError_t of the launch (0 = queued). */
int kvt__cuda_launch_copy(const kvt__cuda_copy_args *a, unsigned max_ctas, void *stream);

/* Loads the copy kernel on the current device (0 = it can run there, else
 * the cudaError_t, e.g. no code in this build for the GPU's architecture). */
int kvt__cuda_kernel_load(void);

#ifdef __cplusplus
}
#endif
#endif
