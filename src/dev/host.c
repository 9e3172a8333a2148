/* The host device backend: the engine's KV pool lives in RAM (CPU engines,
 * tests). Copies are memcpy on worker threads so that they are as
 * asynchronous as the CUDA ones; a load publishes its progress per layer.
 *
 * A transfer is planned once with the shared coalescer: pieces contiguous on
 * both sides become one memcpy, and the blocks are split into parts, one per
 * copy thread, so that one large transfer uses every core. Each part walks
 * its blocks a step of layers at a time, block by block within the step (the
 * host payload's own order), and publishes how many leading layers it has
 * copied; layer l is ready once every part has passed it. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dev/coalesce.h"
#include "dev/dev.h"
#include "util/fault.h"

/* Bytes of one block that a load copies before moving to the next block.
 * A step of layers is contiguous in a host payload (and on the device when
 * the layout packs a slot's layers together), so it is one memcpy of at
 * least this much: 1-2 KiB pieces copied layer by layer across thousands of
 * blocks ran at half the speed of memcpy (a new page on both sides every
 * piece), 16 KiB and more run at memcpy speed. Smaller steps publish
 * progress more often; layers bigger than this are one step each. */
#define HOST_STEP_BYTES (16u << 10)

/* A part below this is not worth waking another thread for (a wake-up costs
 * tens of microseconds; 1 MiB copies in about a hundred). */
#define HOST_PART_MIN_BYTES (1u << 20)

/* Runs taken from the coalescer per call: the hot path's only buffer, on the
 * worker's stack. */
#define HOST_RUNS_PER_CALL 64

#define HOST_MAX_THREADS 256u

typedef struct host_xfer {
  kvt_dev_xfer *x;
  struct host_xfer *next; /* queue link, guarded by ctx->lock */
  uint32_t next_part;     /* next part to hand to a worker, guarded by ctx->lock */
  _Atomic uint32_t n_parts;   /* set at submit */
  _Atomic uint32_t parts_left; /* the worker that brings it to 0 calls done() */
  _Atomic uint32_t *part_layers; /* [n_threads]: leading layers copied by part p;
                                    release-ordered after the bytes */
} host_xfer;

typedef struct host_ctx {
  kvt_layout layout;
  size_t block_bytes;
  uint32_t load_step; /* layers per step of a load */
  pthread_mutex_t lock;
  pthread_cond_t work, progress;
  host_xfer *head, *tail; /* FIFO of transfers with parts not yet taken */
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

/* How many parts a transfer is cut into: one per thread, none smaller than
 * HOST_PART_MIN_BYTES, and no more than its blocks. */
static uint32_t parts_for(const host_ctx *h, const kvt_dev_xfer *x) {
  uint64_t bytes = (uint64_t)x->n_blocks * h->block_bytes;
  uint64_t n = bytes / HOST_PART_MIN_BYTES;
  if (n > h->n_threads) n = h->n_threads;
  if (n > x->n_blocks) n = x->n_blocks;
  return n ? (uint32_t)n : 1;
}

static uint32_t layers_done(const host_xfer *hx) {
  uint32_t n = atomic_load_explicit(&hx->n_parts, memory_order_acquire), done = UINT32_MAX;
  if (n == 0) return 0; /* never submitted */
  for (uint32_t p = 0; p < n; p++) {
    uint32_t d = atomic_load_explicit(&hx->part_layers[p], memory_order_acquire);
    if (d < done) done = d;
  }
  return done;
}

static void publish(host_ctx *h, host_xfer *hx, uint32_t part, uint32_t layers) {
  atomic_store_explicit(&hx->part_layers[part], layers, memory_order_release);
  /* Under the lock, so a waiter between its check and its wait sees it. */
  pthread_mutex_lock(&h->lock);
  pthread_cond_broadcast(&h->progress);
  pthread_mutex_unlock(&h->lock);
}

/* Copies part `part` of a transfer: blocks [b0, b1). */
static int copy_part(host_ctx *h, host_xfer *hx, uint32_t part, uint32_t n_parts) {
  kvt_dev_xfer *x = hx->x;
  uint32_t b0 = (uint32_t)((uint64_t)x->n_blocks * part / n_parts);
  uint32_t b1 = (uint32_t)((uint64_t)x->n_blocks * (part + 1) / n_parts);
  int load = x->dir == KVT_XFER_H2D;
  if (b0 == b1) return 0;
  kvt__coalesce_args a = {.layout = &h->layout, .dir = x->dir,
                          .order = load ? KVT__ORDER_BY_LAYER : KVT__ORDER_BY_BLOCK,
                          .n_blocks = b1 - b0, .dev_slots = x->dev_slots + b0,
                          .host_blocks = x->host_blocks + b0, .layers_per_step = h->load_step};
  kvt__coalesce_iter it;
  int rc = kvt__coalesce_begin(&it, &a);
  if (rc) return rc;
  kvt__copy_run runs[HOST_RUNS_PER_CALL];
  uint32_t done = 0, published = 0;
  size_t k;
  while ((k = kvt__coalesce_next(&it, runs, HOST_RUNS_PER_CALL, &done)) > 0) {
    for (size_t r = 0; r < k; r++) memcpy(runs[r].dst, runs[r].src, runs[r].bytes);
    if (load && done > published) publish(h, hx, part, published = done);
  }
  return 0;
}

static void run_part(host_ctx *h, host_xfer *hx, uint32_t part) {
  kvt_dev_xfer *x = hx->x;
  uint32_t n_parts = atomic_load_explicit(&hx->n_parts, memory_order_relaxed);
  if (part == 0) { /* one stall per transfer; its progress waits for it */
    int delay = kvt__fault_check(KVT_FAULT_DEV_DELAY_US, x->dir);
    if (delay > 0) usleep((useconds_t)delay);
  }
  int status = copy_part(h, hx, part, n_parts);
  /* Every layer counts as published even on error: done() carries the error,
   * and a waiter must not sleep forever on a transfer that has ended. */
  publish(h, hx, part, h->layout.num_layers);
  /* acq_rel: the last part sees the others' bytes before it reports done. */
  if (atomic_fetch_sub_explicit(&hx->parts_left, 1, memory_order_acq_rel) != 1) return;
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
    uint32_t part = hx->next_part++;
    if (hx->next_part == atomic_load_explicit(&hx->n_parts, memory_order_relaxed)) {
      h->head = hx->next; /* every part taken */
      if (!h->head) h->tail = NULL;
    }
    pthread_mutex_unlock(&h->lock);
    run_part(h, hx, part);
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

static uint32_t load_step_for(const kvt_layout *lay, size_t block_bytes) {
  size_t layer_bytes = block_bytes / lay->num_layers;
  if (layer_bytes == 0 || layer_bytes >= HOST_STEP_BYTES) return 1;
  size_t step = (HOST_STEP_BYTES + layer_bytes - 1) / layer_bytes;
  return step < lay->num_layers ? (uint32_t)step : lay->num_layers;
}

static int host_open(const kvt_dev_open_args *args, void **out) {
  const kvt_layout *lay = args->layout;
  host_ctx *h = calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  h->layout = *lay;
  uint32_t nseg = lay->num_layers * lay->segments_per_layer;
  for (uint32_t j = 0; j < nseg && lay->segments; j++) h->block_bytes += lay->segments[j].bytes;
  h->load_step = lay->num_layers ? load_step_for(lay, h->block_bytes) : 1;
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
  hx->part_layers = calloc(h->n_threads, sizeof *hx->part_layers);
  if (!hx->part_layers) {
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
  if (hx) free(hx->part_layers);
  free(hx);
  x->backend_data = NULL;
}

static int host_submit(void *ctx, kvt_dev_xfer *x) {
  host_ctx *h = ctx;
  host_xfer *hx = x->backend_data;
  uint32_t n = parts_for(h, x);
  for (uint32_t p = 0; p < n; p++) atomic_store_explicit(&hx->part_layers[p], 0, memory_order_relaxed);
  atomic_store_explicit(&hx->parts_left, n, memory_order_relaxed);
  atomic_store_explicit(&hx->n_parts, n, memory_order_release);
  hx->next = NULL;
  pthread_mutex_lock(&h->lock);
  hx->next_part = 0;
  if (h->tail) h->tail->next = hx;
  else h->head = hx;
  h->tail = hx;
  if (n > 1) pthread_cond_broadcast(&h->work);
  else pthread_cond_signal(&h->work);
  pthread_mutex_unlock(&h->lock);
  return 0;
}

static int host_layer_ready(void *ctx, kvt_dev_xfer *x, uint32_t layer) {
  (void)ctx;
  return layers_done(x->backend_data) > layer ? 0 : 1;
}

/* No stream to order on the CPU: the caller's thread waits. */
static int host_wait_layer(void *ctx, kvt_dev_xfer *x, uint32_t layer, void *stream) {
  (void)stream;
  host_ctx *h = ctx;
  host_xfer *hx = x->backend_data;
  if (layers_done(hx) > layer) return 0;
  pthread_mutex_lock(&h->lock);
  while (layers_done(hx) <= layer) pthread_cond_wait(&h->progress, &h->lock);
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
