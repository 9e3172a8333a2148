/* The CUDA device backend: the engine's KV pool in GPU memory, copies on
 * two streams the library owns (loads at high priority), one event per
 * layer per load, stores ordered after the engine's compute by fence(). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dev/cuda/cuda_internal.h"

int kvt__cuda_status(cudaError_t err) {
  switch (err) {
  case cudaSuccess: return 0;
  case cudaErrorMemoryAllocation: return -ENOMEM;
  case cudaErrorInvalidValue:
  case cudaErrorInvalidDevicePointer:
  case cudaErrorInvalidResourceHandle: return -EINVAL;
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorInvalidDevice: return KVT_ENODEV;
  case cudaErrorNotSupported: return KVT_EUNSUPPORTED;
  default: return -EIO;
  }
}

/* Segment table for the kernel path, plus the facts the path choice needs. */
static int upload_layout(cuda_ctx *c) {
  const kvt_layout *lay = c->layout;
  uint32_t nseg = lay->num_layers * lay->segments_per_layer;
  if (!lay->segments || nseg == 0) return 0; /* metadata-only: nothing will move */
  kvt__cuda_seg_desc *t = calloc(nseg, sizeof *t);
  if (!t) return -ENOMEM;
  uint64_t off = 0, align = 0;
  for (uint32_t j = 0; j < nseg; j++) {
    const kvt_segment *s = &lay->segments[j];
    t[j] = (kvt__cuda_seg_desc){(uintptr_t)s->base, s->stride, s->bytes, off};
    align |= (uintptr_t)s->base | s->stride | s->bytes | off;
    off += s->bytes;
    if (s->bytes > c->max_seg_bytes) c->max_seg_bytes = s->bytes;
  }
  c->block_bytes = off;
  c->segs_vec16 = (align & 15) == 0;
  for (int d = 0; d < 2; d++) {
    size_t runs = kvt__coalesce_runs_per_block(lay, d == KVT_XFER_H2D ? KVT__ORDER_BY_LAYER
                                                                     : KVT__ORDER_BY_BLOCK);
    c->piece_bytes[d] = runs ? c->block_bytes / runs : c->block_bytes;
  }
  cudaError_t e = cudaMalloc((void **)&c->dev_segs, nseg * sizeof *t);
  if (e == cudaSuccess) e = cudaMemcpy(c->dev_segs, t, nseg * sizeof *t, cudaMemcpyHostToDevice);
  free(t);
  return kvt__cuda_status(e);
}

/* The layout's memory must be this device's: a CPU engine's KV in RAM
 * (tinyllm, the engine tests) belongs to the host backend - KVT_ENODEV lets
 * KVT_DEVICE_AUTO fall back to it - and the copy kernel would fault on it.
 * Memory of another GPU is a caller's mistake (-EINVAL, no fallback). */
static int check_segments(const cuda_ctx *c) {
  const kvt_layout *lay = c->layout;
  uint32_t nseg = lay->num_layers * lay->segments_per_layer;
  for (uint32_t j = 0; lay->segments && j < nseg; j++) {
    const kvt_segment *s = &lay->segments[j];
    if (!s->base || !s->bytes || lay->num_slots == 0) return -EINVAL;
    const char *end = (const char *)s->base + (size_t)(lay->num_slots - 1) * s->stride + s->bytes - 1;
    const void *ptrs[2] = {s->base, end};
    for (int k = 0; k < 2; k++) {
      struct cudaPointerAttributes pa;
      memset(&pa, 0, sizeof pa);
      if (cudaPointerGetAttributes(&pa, ptrs[k]) != cudaSuccess) {
        cudaGetLastError();
        return KVT_ENODEV;
      }
      if (pa.type != cudaMemoryTypeDevice && pa.type != cudaMemoryTypeManaged) return KVT_ENODEV;
      if (pa.device != c->device) return -EINVAL;
    }
  }
  return 0;
}

static void probe_paths(cuda_ctx *c) {
  int same_va = 0, map = 0, sms = 0;
  cudaDeviceGetAttribute(&same_va, cudaDevAttrCanUseHostPointerForRegisteredMem, c->device);
  cudaDeviceGetAttribute(&map, cudaDevAttrCanMapHostMemory, c->device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device);
#ifdef KVT_HAVE_CUDA_KERNELS
  /* Loads the copy kernel now (lazy loading would do it at the first
   * submit, and can deadlock against an engine kernel that spins), and
   * finds out whether the build has code for this GPU at all. */
  c->kernel_ok = same_va && map && c->dev_segs && kvt__cuda_kernel_load() == 0;
  cudaGetLastError();
#else
  c->kernel_ok = 0;
#endif
  c->max_ctas = (unsigned)(sms > 0 ? sms : 1) * KVT_CUDA_KERNEL_CTAS_PER_SM;
  c->batch_ok = KVT_CUDA_HAVE_BATCH;
}

static int create_streams(cuda_ctx *c) {
  int least = 0, greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  /* Non-blocking: never serialize with the engine's legacy default stream. */
  if (e == cudaSuccess)
    e = cudaStreamCreateWithPriority(&c->lane[KVT_XFER_H2D].stream, cudaStreamNonBlocking, greatest);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithPriority(&c->lane[KVT_XFER_D2H].stream, cudaStreamNonBlocking, least);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->fence_ev, cudaEventDisableTiming);
  return kvt__cuda_status(e);
}

static void cuda_close(void *ctx) {
  cuda_ctx *c = ctx;
  if (!c) return;
  int prev = kvt__cuda_enter(c);
  kvt__cuda_lanes_stop(c); /* waits for every transfer in flight */
  for (int d = 0; d < 2; d++)
    if (c->lane[d].stream) cudaStreamDestroy(c->lane[d].stream);
  if (c->fence_ev) cudaEventDestroy(c->fence_ev);
  if (c->dev_segs) cudaFree(c->dev_segs);
  pthread_mutex_destroy(&c->region_lock);
  kvt__cuda_leave(c, prev);
  free(c);
}

static int cuda_open(const kvt_dev_open_args *args, void **out) {
  if (!args || !args->layout || !out) return -EINVAL;
  int n = 0;
  /* No driver, no GPU, or CUDA_VISIBLE_DEVICES hiding them all. */
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return KVT_ENODEV;
  }
  if (args->cuda_device < 0 || args->cuda_device >= n) return KVT_ENODEV;
  cuda_ctx *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->device = args->cuda_device;
  c->layout = args->layout;
  pthread_mutex_init(&c->region_lock, NULL);
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (cudaSetDevice(c->device) != cudaSuccess) {
    cudaGetLastError();
    pthread_mutex_destroy(&c->region_lock);
    free(c);
    return KVT_ENODEV;
  }
  int rc = check_segments(c);
  if (rc == 0) rc = upload_layout(c);
  if (rc == 0) rc = create_streams(c);
  if (rc == 0) probe_paths(c);
  if (rc == 0) rc = kvt__cuda_lanes_start(c);
  if (rc) {
    cuda_close(c); /* restores nothing: c->device is current here */
    cudaGetLastError(); /* leave no error of ours to the caller's next call */
  } else {
    *out = c;
  }
  if (prev >= 0 && prev != args->cuda_device) cudaSetDevice(prev);
  return rc;
}

static void xfer_free(cuda_xfer *cx, uint32_t n_layers) {
  for (uint32_t l = 0; cx->layer_ev && l < n_layers; l++)
    if (cx->layer_ev[l]) cudaEventDestroy(cx->layer_ev[l]);
  if (cx->done_ev) cudaEventDestroy(cx->done_ev);
  free(cx->layer_ev);
  free(cx);
}

static int cuda_xfer_prepare(void *ctx, kvt_dev_xfer *x) {
  cuda_ctx *c = ctx;
  uint32_t L = c->layout->num_layers;
  cuda_xfer *cx = calloc(1, sizeof *cx);
  if (!cx) return -ENOMEM;
  cx->x = x;
  /* Events belong to the device current at creation; recording one on a
   * stream of another device fails. */
  int prev = kvt__cuda_enter(c);
  cx->layer_ev = calloc(L ? L : 1, sizeof *cx->layer_ev);
  cudaError_t e = cx->layer_ev ? cudaSuccess : cudaErrorMemoryAllocation;
  for (uint32_t l = 0; e == cudaSuccess && l < L; l++)
    e = cudaEventCreateWithFlags(&cx->layer_ev[l], cudaEventDisableTiming);
  /* The completion thread sleeps on this one instead of spinning a core. */
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&cx->done_ev, cudaEventDisableTiming | cudaEventBlockingSync);
  if (e != cudaSuccess) xfer_free(cx, L);
  else x->backend_data = cx;
  kvt__cuda_leave(c, prev);
  return kvt__cuda_status(e);
}

static void cuda_xfer_release(void *ctx, kvt_dev_xfer *x) {
  cuda_ctx *c = ctx;
  if (!x || !x->backend_data) return;
  xfer_free(x->backend_data, c->layout->num_layers);
  x->backend_data = NULL;
}

/* A store has no per-layer events: every layer lands with the whole copy. */
static cudaEvent_t layer_event(cuda_ctx *c, kvt_dev_xfer *x, uint32_t layer) {
  cuda_xfer *cx = x->backend_data;
  if (x->dir == KVT_XFER_H2D) return cx->layer_ev[layer];
  return cx->done_ev;
}

static int cuda_layer_ready(void *ctx, kvt_dev_xfer *x, uint32_t layer) {
  cuda_ctx *c = ctx;
  if (!x || !x->backend_data || layer >= c->layout->num_layers) return -EINVAL;
  cudaError_t e = cudaEventQuery(layer_event(c, x, layer));
  if (e == cudaErrorNotReady) return 1;
  return kvt__cuda_status(e);
}

/* Stream-ordered: the engine's stream waits on the GPU, its CPU does not. */
static int cuda_wait_layer(void *ctx, kvt_dev_xfer *x, uint32_t layer, void *stream) {
  cuda_ctx *c = ctx;
  if (!x || !x->backend_data || layer >= c->layout->num_layers) return -EINVAL;
  return kvt__cuda_status(cudaStreamWaitEvent((cudaStream_t)stream, layer_event(c, x, layer), 0));
}

/* The store stream waits, on the GPU, for everything queued on the engine's
 * stream so far: no copy may read KV that a kernel is still writing. The
 * wait is taken at once, under the store lane's submit lock, so it sits
 * between the submissions before and after this call. */
static int cuda_fence(void *ctx, void *stream) {
  cuda_ctx *c = ctx;
  if (!stream) return 0;
  cuda_lane *ln = &c->lane[KVT_XFER_D2H];
  pthread_mutex_lock(&ln->submit_lock);
  cudaError_t e = cudaEventRecord(c->fence_ev, (cudaStream_t)stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(ln->stream, c->fence_ev, 0);
  pthread_mutex_unlock(&ln->submit_lock);
  return kvt__cuda_status(e);
}

int kvt__cuda_set_path(void *ctx, int path) {
  cuda_ctx *c = ctx;
  if (!c || path < KVT__CUDA_PATH_AUTO || path > KVT__CUDA_PATH_KERNEL) return -EINVAL;
  if (path == KVT__CUDA_PATH_BATCH && !c->batch_ok) return KVT_EUNSUPPORTED;
  if (path == KVT__CUDA_PATH_KERNEL && !c->kernel_ok) return KVT_EUNSUPPORTED;
  atomic_store(&c->force_path, path);
  return 0;
}

int kvt__cuda_xfer_path(const kvt_dev_xfer *x) {
  const cuda_xfer *cx = x ? x->backend_data : NULL;
  return cx ? cx->path : -EINVAL;
}

static const kvt_dev_backend cuda_backend = {
    .version = KVT_DEV_BACKEND_VERSION,
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .host_alloc = kvt__cuda_host_alloc,
    .host_free = kvt__cuda_host_free,
    .xfer_prepare = cuda_xfer_prepare,
    .xfer_release = cuda_xfer_release,
    .submit = kvt__cuda_submit,
    .layer_ready = cuda_layer_ready,
    .wait_layer = cuda_wait_layer,
    .fence = cuda_fence,
};

const kvt_dev_backend *kvt_dev_backend_cuda(void) { return &cuda_backend; }
