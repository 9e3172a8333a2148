/* The CUDA device backend's shared state (compiled only with KVT_HAVE_CUDA).
 *
 *   cuda_backend.c  open/close, per-transfer events, layer queries, fence
 *   cuda_submit.c   coalescing + issue (batch API, per-run memcpy, kernel),
 *                   completion threads
 *   cuda_host.c     the host pool: one mmap region pinned in chunks
 *
 * Two lanes, one per direction, each with its own stream, submit lock and
 * completion thread: loads (H2D, high priority) never queue behind stores. */
#ifndef KVT_DEV_CUDA_INTERNAL_H
#define KVT_DEV_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "dev/coalesce.h"
#include "dev/cuda/cuda_kernels.h"
#include "dev/cuda/cuda_tuning.h"
#include "kvtier/backend.h"

/* cudaMemcpyBatchAsync appeared in CUDA 12.8; 13.0 dropped its failIdx. */
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
#define KVT_CUDA_HAVE_BATCH 1
#else
#define KVT_CUDA_HAVE_BATCH 0
#endif

/* Copy paths; kvt__cuda_set_path forces one (bench, tests). */
enum {
  KVT__CUDA_PATH_AUTO = 0,
  KVT__CUDA_PATH_MEMCPY = 1, /* one cudaMemcpyAsync per run */
  KVT__CUDA_PATH_BATCH = 2,  /* cudaMemcpyBatchAsync over the runs */
  KVT__CUDA_PATH_KERNEL = 3  /* gather/scatter kernel over mapped host memory */
};

#define KVT__CUDA_MAX_REGIONS 16

typedef struct cuda_xfer {
  kvt_dev_xfer *x;
  struct cuda_xfer *next;  /* lane queue link, guarded by lane->lock */
  cudaEvent_t *layer_ev;   /* num_layers events (loads) */
  cudaEvent_t done_ev;     /* recorded after every copy; BlockingSync */
  uint64_t ring_end;       /* lane ring position to release at completion */
  int path;                /* path of the last submission */
} cuda_xfer;

typedef struct cuda_lane {
  int dir;
  cudaStream_t stream;
  pthread_mutex_t submit_lock; /* one issuer at a time: stream order == queue order */
  /* Scratch of the issuer (submit_lock). */
  kvt__copy_run *runs;
  void **b_dst;
  const void **b_src;
  size_t *b_size;
  kvt__cuda_block_desc *ring; /* mapped pinned; KVT_CUDA_DESC_RING_ENTRIES */
  uint64_t ring_head;         /* entries handed out (submit_lock) */
  _Atomic uint64_t ring_tail; /* entries released by the completion thread */
  /* Completion queue (lock). */
  pthread_mutex_t lock;
  pthread_cond_t cv;
  cuda_xfer *head, *tail;
  int inited, stop, started;
  pthread_t thread;
  struct cuda_ctx *ctx;
} cuda_lane;

typedef struct cuda_region {
  uintptr_t base;
  size_t len;    /* mapped length */
  int pinned;    /* every chunk registered (mapped) */
} cuda_region;

typedef struct cuda_ctx {
  int device;
  const kvt_layout *layout; /* the engine's; valid for the backend's lifetime */
  size_t block_bytes, max_seg_bytes;
  size_t piece_bytes[2];    /* typical run bytes per direction (path choice) */
  cuda_lane lane[2];        /* indexed by KVT_XFER_D2H / KVT_XFER_H2D */
  cudaEvent_t fence_ev;     /* guarded by lane[D2H].submit_lock */
  kvt__cuda_seg_desc *dev_segs; /* kernel path: the layout in device memory */
  int segs_vec16;
  int kernel_ok;            /* kernels built, host memory mappable at the same VA */
  _Atomic int batch_ok;     /* cudaMemcpyBatchAsync compiled and accepted */
  unsigned max_ctas;
  _Atomic int force_path;
  pthread_mutex_t region_lock;
  cuda_region regions[KVT__CUDA_MAX_REGIONS];
  uint32_t n_regions;
} cuda_ctx;

/* cudaError_t -> kvtier return code. */
int kvt__cuda_status(cudaError_t err);

/* Makes the backend's device current on the calling thread and returns the
 * one that was current, for kvt__cuda_leave: an engine thread may have
 * another device current, and the backend must neither create its events
 * there nor leave its own device current behind. */
static inline int kvt__cuda_enter(const cuda_ctx *c) {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (prev != c->device) cudaSetDevice(c->device);
  return prev;
}
static inline void kvt__cuda_leave(const cuda_ctx *c, int prev) {
  if (prev >= 0 && prev != c->device) cudaSetDevice(prev);
}

int kvt__cuda_host_alloc(void *ctx, size_t bytes, void **ptr, int *pinned);
void kvt__cuda_host_free(void *ctx, void *ptr, size_t bytes);
/* Snapshot of the pinned regions as coalescing spans; returns the count. */
uint32_t kvt__cuda_host_spans(cuda_ctx *c, kvt__host_span *spans, uint32_t max);
/* 1 if [p, p + len) lies in one pinned (mapped) region. */
int kvt__cuda_host_is_pinned(const kvt__host_span *spans, uint32_t n, const void *p, size_t len);

int kvt__cuda_lanes_start(cuda_ctx *c);
void kvt__cuda_lanes_stop(cuda_ctx *c);
int kvt__cuda_submit(void *ctx, kvt_dev_xfer *x);

/* Bench and test controls (not part of the vtable). */
int kvt__cuda_set_path(void *ctx, int path);
int kvt__cuda_xfer_path(const kvt_dev_xfer *x);

#endif
