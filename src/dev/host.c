/* The host device backend: the engine's KV pool lives in RAM (CPU engines,
 * tests). Copies run on worker threads (memcpy, or streaming stores for
 * large transfers) so that they are as asynchronous as the CUDA ones; a
 * load publishes its progress per layer.
 *
 * A transfer is planned once at submit: a load is cut into steps of a few
 * layers, each step into units of about HOST_UNIT_BYTES (a range of blocks),
 * and the copy threads take units in order, step by step, as each finishes
 * its last one, so one large transfer keeps every core busy and a thread
 * the OS preempts holds up one unit, not a fixed share. A unit is one
 * coalescer pass in block order over its step's layers (pieces contiguous on
 * both sides become one copy). Layer l is ready once every unit of the steps
 * up to l's has landed. A store is one step of all layers. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dev/coalesce.h"
#include "dev/dev.h"
#include "util/fault.h"

/* How a load walks its blocks: a step of layers at a time, block by block
 * within the step. A block's step is contiguous in its host payload (and on
 * the device when the layout packs a slot's layers together), so it is one
 * run; runs of at least this much stream at memory speed, while 1-2 KiB
 * pieces copied layer by layer across thousands of blocks ran at half of it
 * and 64 KiB ones at 0.7-0.8 (every run restarts the prefetchers). A step
 * still never covers more than a quarter of the layers, so progress is
 * published at least HOST_MIN_STEPS times per load. */
#define HOST_STEP_BYTES (512u << 10)
#define HOST_MIN_STEPS 4u

/* The work one thread takes at a time: big enough that taking it (a lock,
 * a coalescer pass) costs nothing next to the copy, small enough that the
 * threads finish a transfer together. */
#define HOST_UNIT_BYTES ((size_t)1 << 20)

/* Runs taken from the coalescer per call: the hot path's only buffer, on the
 * worker's stack. */
#define HOST_RUNS_PER_CALL 64

#define HOST_MAX_THREADS 256u

/* Transfers as big as the last-level cache (counted between these bounds)
 * are copied with streaming stores: their destination would be evicted
 * before anyone reads it anyway, and a plain memcpy reads every destination
 * line before writing it (a third of its memory traffic). Measured: 1.3-1.6x
 * memcpy's rate on runs of 32 KiB to 2 MiB. */
#define HOST_STREAM_MIN_BYTES ((size_t)8 << 20)
#define HOST_STREAM_MAX_BYTES ((size_t)64 << 20)
/* Streaming stores pay off on long runs only: scattered 2-16 KiB runs ran at
 * 0.6-0.8x memcpy's rate with them, 32 KiB ones at par. */
#define HOST_STREAM_RUN_BYTES ((size_t)32 << 10)

#if defined(__SSE2__)
/* memcpy with non-temporal stores; the caller fences (copy_fence) before
 * publishing what it copied, since such stores are not ordered. */
static void copy_stream(void *dst, const void *src, size_t n) {
  char *d = dst;
  const char *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 63); /* whole destination lines */
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  memcpy(d, s, n);
}
static void copy_fence(void) { _mm_sfence(); }
#define HOST_HAVE_STREAM 1
#else
#define HOST_HAVE_STREAM 0
static void copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void copy_fence(void) {}
#endif

typedef struct host_xfer {
  kvt_dev_xfer *x;
  struct host_xfer *next; /* queue link, guarded by ctx->lock */
  uint32_t next_unit;     /* next unit to hand out, guarded by ctx->lock */
  uint32_t steps_done;    /* leading steps fully landed, guarded by ctx->lock */
  /* The plan, written at submit before the transfer is queued. */
  uint32_t step_layers, n_steps, units_per_step, n_units;
  int stream;
  _Atomic uint32_t layers_done; /* release-ordered after the bytes */
  _Atomic uint32_t units_left;  /* the unit that brings it to 0 calls done() */
  _Atomic int status;           /* first error of a unit */
  _Atomic uint32_t *step_left;  /* [num_layers]: units of step s not landed */
} host_xfer;

typedef struct host_ctx {
  kvt_layout layout;
  size_t block_bytes;
  size_t stream_bytes; /* transfers from this size on use streaming stores */
  uint32_t load_step;  /* layers per step of a load */
  pthread_mutex_t lock;
  pthread_cond_t work, progress;
  host_xfer *head, *tail; /* FIFO of transfers with units not yet taken */
  int stop;
  uint32_t n_threads;
  pthread_t *threads;
} host_ctx;

/* 0 means one copy thread per core this process may run on. */
static uint32_t resolve_threads(uint32_t asked) {
  if (asked) return asked < HOST_MAX_THREADS ? asked : HOST_MAX_THREADS;
  cpu_set_t set;
  long n = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n <= 0) n = 1;
  return n < (long)HOST_MAX_THREADS ? (uint32_t)n : HOST_MAX_THREADS;
}

static void plan(const host_ctx *h, host_xfer *hx) {
  const kvt_dev_xfer *x = hx->x;
  uint32_t n_layers = h->layout.num_layers;
  hx->step_layers = x->dir == KVT_XFER_H2D ? h->load_step : n_layers;
  hx->n_steps = (n_layers + hx->step_layers - 1) / hx->step_layers;
  uint64_t bytes = (uint64_t)x->n_blocks * h->block_bytes;
  uint64_t per_step = bytes / hx->n_steps, units = (per_step + HOST_UNIT_BYTES - 1) / HOST_UNIT_BYTES;
  if (h->n_threads == 1 || units == 0) units = 1; /* nobody to share with */
  if (units > x->n_blocks) units = x->n_blocks ? x->n_blocks : 1;
  hx->units_per_step = (uint32_t)units;
  hx->n_units = hx->n_steps * hx->units_per_step;
  hx->stream = bytes >= h->stream_bytes;
}

/* A unit has landed: count it against its step and move the ready-layer
 * frontier over every step that is now complete, in order. */
static void unit_landed(host_ctx *h, host_xfer *hx, uint32_t step) {
  /* acq_rel: whoever takes a step's count to 0 sees that step's bytes. */
  if (atomic_fetch_sub_explicit(&hx->step_left[step], 1, memory_order_acq_rel) != 1) return;
  pthread_mutex_lock(&h->lock);
  uint32_t s = hx->steps_done;
  while (s < hx->n_steps && atomic_load_explicit(&hx->step_left[s], memory_order_acquire) == 0) s++;
  if (s != hx->steps_done) {
    hx->steps_done = s;
    uint32_t layers = s * hx->step_layers;
    if (layers > h->layout.num_layers) layers = h->layout.num_layers;
    atomic_store_explicit(&hx->layers_done, layers, memory_order_release);
    pthread_cond_broadcast(&h->progress);
  }
  pthread_mutex_unlock(&h->lock);
}

/* Copies unit u: the layers of step u / units_per_step of a range of blocks,
 * block by block. */
static int copy_unit(host_ctx *h, host_xfer *hx, uint32_t u) {
  kvt_dev_xfer *x = hx->x;
  uint32_t step = u / hx->units_per_step, c = u % hx->units_per_step;
  uint32_t b0 = (uint32_t)((uint64_t)x->n_blocks * c / hx->units_per_step);
  uint32_t b1 = (uint32_t)((uint64_t)x->n_blocks * (c + 1) / hx->units_per_step);
  if (b0 == b1) return 0;
  uint32_t first = step * hx->step_layers, left = h->layout.num_layers - first;
  kvt__coalesce_args a = {.layout = &h->layout, .dir = x->dir, .order = KVT__ORDER_BY_BLOCK,
                          .n_blocks = b1 - b0, .dev_slots = x->dev_slots + b0,
                          .host_blocks = x->host_blocks + b0, .first_layer = first,
                          .n_layers = left < hx->step_layers ? left : hx->step_layers};
  kvt__coalesce_iter it;
  int rc = kvt__coalesce_begin(&it, &a);
  if (rc) return rc;
  kvt__copy_run runs[HOST_RUNS_PER_CALL];
  size_t k;
  while ((k = kvt__coalesce_next(&it, runs, HOST_RUNS_PER_CALL, NULL)) > 0) {
    for (size_t r = 0; r < k; r++) {
      if (hx->stream && runs[r].bytes >= HOST_STREAM_RUN_BYTES) copy_stream(runs[r].dst, runs[r].src, runs[r].bytes);
      else memcpy(runs[r].dst, runs[r].src, runs[r].bytes);
    }
  }
  if (hx->stream) copy_fence(); /* before anyone is told the bytes landed */
  return 0;
}

static void run_unit(host_ctx *h, host_xfer *hx, uint32_t u) {
  kvt_dev_xfer *x = hx->x;
  if (u == 0) { /* one stall per transfer, ahead of its first layers */
    int delay = kvt__fault_check(KVT_FAULT_DEV_DELAY_US, x->dir);
    if (delay > 0) usleep((useconds_t)delay);
  }
  int rc = copy_unit(h, hx, u), ok = 0;
  if (rc < 0) atomic_compare_exchange_strong(&hx->status, &ok, rc);
  /* A failed unit counts as landed too: done() carries the error, and no
   * waiter may sleep forever on a transfer that has ended. */
  unit_landed(h, hx, u / hx->units_per_step);
  if (atomic_fetch_sub_explicit(&hx->units_left, 1, memory_order_acq_rel) != 1) return;
  int status = atomic_load_explicit(&hx->status, memory_order_relaxed);
  int f = kvt__fault_check(KVT_FAULT_DEV_COMPLETE, x->dir);
  x->done(x, status < 0 ? status : f < 0 ? f : 0);
}

static void *worker(void *arg) {
  host_ctx *h = arg;
  pthread_mutex_lock(&h->lock);
  for (;;) {
    while (!h->head && !h->stop) pthread_cond_wait(&h->work, &h->lock);
    if (!h->head) break; /* stop, queue drained */
    host_xfer *hx = h->head;
    uint32_t u = hx->next_unit++;
    if (hx->next_unit == hx->n_units) { /* every unit handed out */
      h->head = hx->next;
      if (!h->head) h->tail = NULL;
    }
    pthread_mutex_unlock(&h->lock);
    run_unit(h, hx, u);
    pthread_mutex_lock(&h->lock);
  }
  pthread_mutex_unlock(&h->lock);
  return NULL;
}

static void host_close(void *ctx) {
  host_ctx *h = ctx;
  pthread_mutex_lock(&h->lock);
  h->stop = 1;
  pthread_cond_broadcast(&h->work);
  pthread_mutex_unlock(&h->lock);
  for (uint32_t i = 0; i < h->n_threads; i++) pthread_join(h->threads[i], NULL);
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->work);
  pthread_cond_destroy(&h->progress);
  free(h->threads);
  free(h);
}

static size_t stream_threshold(void) {
  if (!HOST_HAVE_STREAM) return SIZE_MAX;
  long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  /* Some machines report a cache shared by many cores or sockets: past
   * HOST_STREAM_MAX_BYTES a copy outgrows this core's share anyway. */
  if (llc <= 0 || (size_t)llc > HOST_STREAM_MAX_BYTES) return HOST_STREAM_MAX_BYTES;
  return (size_t)llc > HOST_STREAM_MIN_BYTES ? (size_t)llc : HOST_STREAM_MIN_BYTES;
}

static uint32_t load_step_for(const kvt_layout *lay, size_t block_bytes) {
  uint32_t most = (lay->num_layers + HOST_MIN_STEPS - 1) / HOST_MIN_STEPS;
  size_t layer_bytes = block_bytes / lay->num_layers;
  size_t step = layer_bytes ? (HOST_STEP_BYTES + layer_bytes - 1) / layer_bytes : most;
  return step < most ? (step ? (uint32_t)step : 1) : most;
}

static int host_open(const kvt_dev_open_args *args, void **out) {
  const kvt_layout *lay = args->layout;
  host_ctx *h = calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  h->layout = *lay;
  uint32_t nseg = lay->num_layers * lay->segments_per_layer;
  for (uint32_t j = 0; j < nseg && lay->segments; j++) h->block_bytes += lay->segments[j].bytes;
  h->load_step = lay->num_layers ? load_step_for(lay, h->block_bytes) : 1;
  h->stream_bytes = stream_threshold();
  h->n_threads = resolve_threads(args->copy_threads);
  h->threads = calloc(h->n_threads, sizeof *h->threads);
  if (!h->threads) {
    free(h);
    return -ENOMEM;
  }
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->work, NULL);
  pthread_cond_init(&h->progress, NULL);
  for (uint32_t i = 0; i < h->n_threads; i++) {
    if (pthread_create(&h->threads[i], NULL, worker, h) != 0) {
      h->n_threads = i;
      host_close(h);
      return -EAGAIN;
    }
    pthread_setname_np(h->threads[i], "kvt-copy"); /* per-thread profiles name it */
  }
  *out = h;
  return 0;
}

/* Big pools start on a 2 MiB boundary and ask for transparent huge pages,
 * so that a copy across them needs 512 times fewer page-table entries; the
 * kernel may refuse (THP "never"), and then they are ordinary pages. */
#define HOST_HUGE_BYTES ((size_t)2 << 20)

static int host_alloc(void *ctx, size_t bytes, void **ptr, int *pinned) {
  (void)ctx;
  *pinned = 0; /* nothing to pin for: there is no DMA engine */
  if (bytes < HOST_HUGE_BYTES || bytes > SIZE_MAX - HOST_HUGE_BYTES) return kvt__host_mem_alloc(bytes, ptr);
  size_t span = bytes + HOST_HUGE_BYTES;
  char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -errno;
  char *base = (char *)(((uintptr_t)p + HOST_HUGE_BYTES - 1) & ~(uintptr_t)(HOST_HUGE_BYTES - 1));
  /* Give back the slack around the aligned range, so host_free's munmap of
   * exactly [base, base + bytes) releases everything. */
  if (base > p) munmap(p, (size_t)(base - p));
  if (p + span > base + bytes) munmap(base + bytes, (size_t)(p + span - (base + bytes)));
#ifdef MADV_HUGEPAGE
  (void)madvise(base, bytes, MADV_HUGEPAGE);
#endif
  *ptr = base;
  return 0;
}

static void host_free(void *ctx, void *ptr, size_t bytes) {
  (void)ctx;
  kvt__host_mem_free(ptr, bytes);
}

static int host_xfer_prepare(void *ctx, kvt_dev_xfer *x) {
  host_ctx *h = ctx;
  host_xfer *hx = calloc(1, sizeof *hx);
  if (!hx) return -ENOMEM;
  hx->step_left = calloc(h->layout.num_layers ? h->layout.num_layers : 1, sizeof *hx->step_left);
  if (!hx->step_left) {
    free(hx);
    return -ENOMEM;
  }
  hx->x = x;
  x->backend_data = hx;
  return 0;
}

static void host_xfer_release(void *ctx, kvt_dev_xfer *x) {
  (void)ctx;
  host_xfer *hx = x->backend_data;
  if (hx) free(hx->step_left);
  free(hx);
  x->backend_data = NULL;
}

static int host_submit(void *ctx, kvt_dev_xfer *x) {
  host_ctx *h = ctx;
  host_xfer *hx = x->backend_data;
  plan(h, hx);
  for (uint32_t s = 0; s < hx->n_steps; s++)
    atomic_store_explicit(&hx->step_left[s], hx->units_per_step, memory_order_relaxed);
  atomic_store_explicit(&hx->units_left, hx->n_units, memory_order_relaxed);
  atomic_store_explicit(&hx->status, 0, memory_order_relaxed);
  atomic_store_explicit(&hx->layers_done, 0, memory_order_relaxed);
  pthread_mutex_lock(&h->lock);
  hx->next = NULL;
  hx->next_unit = 0;
  hx->steps_done = 0;
  if (h->tail) h->tail->next = hx;
  else h->head = hx;
  h->tail = hx;
  if (hx->n_units > 1) pthread_cond_broadcast(&h->work);
  else pthread_cond_signal(&h->work);
  pthread_mutex_unlock(&h->lock);
  return 0;
}

static int host_layer_ready(void *ctx, kvt_dev_xfer *x, uint32_t layer) {
  (void)ctx;
  host_xfer *hx = x->backend_data;
  return atomic_load_explicit(&hx->layers_done, memory_order_acquire) > layer ? 0 : 1;
}

/* No stream to order on the CPU: the caller's thread waits. */
static int host_wait_layer(void *ctx, kvt_dev_xfer *x, uint32_t layer, void *stream) {
  (void)stream;
  host_ctx *h = ctx;
  host_xfer *hx = x->backend_data;
  if (atomic_load_explicit(&hx->layers_done, memory_order_acquire) > layer) return 0;
  pthread_mutex_lock(&h->lock);
  while (atomic_load_explicit(&hx->layers_done, memory_order_acquire) <= layer)
    pthread_cond_wait(&h->progress, &h->lock);
  pthread_mutex_unlock(&h->lock);
  return 0;
}

/* The engine's CPU writes are complete when it calls us. */
static int host_fence(void *ctx, void *stream) {
  (void)ctx;
  (void)stream;
  return 0;
}

static const kvt_dev_backend host_backend = {
    .version = KVT_DEV_BACKEND_VERSION,
    .name = "host",
    .open = host_open,
    .close = host_close,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .xfer_prepare = host_xfer_prepare,
    .xfer_release = host_xfer_release,
    .submit = host_submit,
    .layer_ready = host_layer_ready,
    .wait_layer = host_wait_layer,
    .fence = host_fence,
};

const kvt_dev_backend *kvt_dev_backend_host(void) { return &host_backend; }
