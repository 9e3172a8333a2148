/* The host device backend: the engine's KV pool lives in RAM (CPU engines,
 * tests). Copies are memcpy on worker threads so that they are as
 * asynchronous as the CUDA ones; a load publishes its progress per layer. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev/dev.h"
#include "util/fault.h"

typedef struct host_xfer {
  kvt_dev_xfer *x;
  struct host_xfer *next;      /* queue link, guarded by ctx->lock */
  atomic_uint layers_done;     /* layers fully copied; release-ordered after the bytes */
} host_xfer;

typedef struct host_ctx {
  kvt_layout layout;
  size_t *seg_offset; /* offset of segment j inside a host block */
  pthread_mutex_t lock;
  pthread_cond_t work, progress;
  host_xfer *head, *tail; /* FIFO of submitted transfers */
  int stop;
  uint32_t n_threads;
  pthread_t *threads;
} host_ctx;

static void copy_layer(host_ctx *h, const kvt_dev_xfer *x, uint32_t l) {
  uint32_t spl = h->layout.segments_per_layer;
  for (uint32_t i = 0; i < x->n_blocks; i++) {
    char *hb = x->host_blocks[i];
    for (uint32_t s = 0; s < spl; s++) {
      const kvt_segment *sg = &h->layout.segments[l * spl + s];
      char *dev = (char *)sg->base + (size_t)x->dev_slots[i] * sg->stride;
      char *host = hb + h->seg_offset[l * spl + s];
      if (x->dir == KVT_XFER_D2H) memcpy(host, dev, sg->bytes);
      else memcpy(dev, host, sg->bytes);
    }
  }
}

/* Stores have no layer consumer: copy block by block, so the host side is
 * written sequentially (each block's segments are contiguous there). */
static void copy_blocks(host_ctx *h, const kvt_dev_xfer *x) {
  uint32_t nseg = h->layout.num_layers * h->layout.segments_per_layer;
  for (uint32_t i = 0; i < x->n_blocks; i++) {
    char *host = x->host_blocks[i];
    for (uint32_t j = 0; j < nseg; j++) {
      const kvt_segment *sg = &h->layout.segments[j];
      memcpy(host + h->seg_offset[j], (char *)sg->base + (size_t)x->dev_slots[i] * sg->stride, sg->bytes);
    }
  }
}

static void run_xfer(host_ctx *h, host_xfer *hx) {
  kvt_dev_xfer *x = hx->x;
  int delay = kvt__fault_check(KVT_FAULT_DEV_DELAY_US, x->dir);
  if (delay > 0) usleep((useconds_t)delay);
  if (x->dir == KVT_XFER_D2H) {
    copy_blocks(h, x);
    atomic_store_explicit(&hx->layers_done, h->layout.num_layers, memory_order_release);
  }
  /* Loads go layer by layer so layer l can be consumed while later ones copy. */
  for (uint32_t l = 0; x->dir == KVT_XFER_H2D && l < h->layout.num_layers; l++) {
    copy_layer(h, x, l);
    atomic_store_explicit(&hx->layers_done, l + 1, memory_order_release);
    pthread_mutex_lock(&h->lock);
    pthread_cond_broadcast(&h->progress);
    pthread_mutex_unlock(&h->lock);
  }
  int status = kvt__fault_check(KVT_FAULT_DEV_COMPLETE, x->dir);
  x->done(x, status < 0 ? status : 0);
}

static void *worker(void *arg) {
  host_ctx *h = arg;
  pthread_mutex_lock(&h->lock);
  for (;;) {
    while (!h->head && !h->stop) pthread_cond_wait(&h->work, &h->lock);
    if (!h->head) break; /* stop, queue drained */
    host_xfer *hx = h->head;
    h->head = hx->next;
    if (!h->head) h->tail = NULL;
    pthread_mutex_unlock(&h->lock);
    run_xfer(h, hx);
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
  free(h->seg_offset);
  free(h);
}

static int host_open(const kvt_dev_open_args *args, void **out) {
  const kvt_layout *lay = args->layout;
  host_ctx *h = calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  h->layout = *lay;
  uint32_t nseg = lay->num_layers * lay->segments_per_layer;
  h->seg_offset = calloc(nseg ? nseg : 1, sizeof *h->seg_offset);
  h->n_threads = args->copy_threads ? args->copy_threads : 1;
  h->threads = calloc(h->n_threads, sizeof *h->threads);
  if (!h->seg_offset || !h->threads) {
    free(h->seg_offset);
    free(h->threads);
    free(h);
    return -ENOMEM;
  }
  size_t off = 0;
  for (uint32_t j = 0; j < nseg && lay->segments; j++) {
    h->seg_offset[j] = off;
    off += lay->segments[j].bytes;
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

static int host_alloc(void *ctx, size_t bytes, void **ptr, int *pinned) {
  *pinned = 0; /* nothing to pin for: there is no DMA engine */
  return kvt__host_mem_alloc(bytes, ptr);
}

static void host_free(void *ctx, void *ptr, size_t bytes) { kvt__host_mem_free(ptr, bytes); }

static int host_xfer_prepare(void *ctx, kvt_dev_xfer *x) {
  host_xfer *hx = calloc(1, sizeof *hx);
  if (!hx) return -ENOMEM;
  hx->x = x;
  x->backend_data = hx;
  return 0;
}

static void host_xfer_release(void *ctx, kvt_dev_xfer *x) {
  free(x->backend_data);
  x->backend_data = NULL;
}

static int host_submit(void *ctx, kvt_dev_xfer *x) {
  host_ctx *h = ctx;
  host_xfer *hx = x->backend_data;
  atomic_store_explicit(&hx->layers_done, 0, memory_order_relaxed);
  hx->next = NULL;
  pthread_mutex_lock(&h->lock);
  if (h->tail) h->tail->next = hx;
  else h->head = hx;
  h->tail = hx;
  pthread_cond_signal(&h->work);
  pthread_mutex_unlock(&h->lock);
  return 0;
}

static int host_layer_ready(void *ctx, kvt_dev_xfer *x, uint32_t layer) {
  host_xfer *hx = x->backend_data;
  return atomic_load_explicit(&hx->layers_done, memory_order_acquire) > layer ? 0 : 1;
}

/* No stream to order on the CPU: the caller's thread waits. */
static int host_wait_layer(void *ctx, kvt_dev_xfer *x, uint32_t layer, void *stream) {
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
static int host_fence(void *ctx, void *stream) { return 0; }

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
