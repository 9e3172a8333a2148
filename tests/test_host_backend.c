/* The host device backend (src/dev/host.c) and the host pool it backs
 * (src/store/host_pool.c), driven through the backend wrappers: every store
 * and restore is byte-exact for the layouts engines use, at one and at
 * several copy threads, small and large (split, streamed) transfers alike;
 * layer l reads as ready only once every block's layer l has landed; a
 * stalled or failed copy is reported, and never leaves a waiter hanging;
 * the host pool is resident before its first use. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dev/dev.h"
#include "helpers.h"
#include "store/host_pool.h"
#include "util/fault.h"

#define MAX_SEGS 128

enum { SLOT_PACKED, LAYER_POOLS, FLASHINFER };

/* A device pool in RAM, host payloads `pitch` apart, and one transfer. */
typedef struct rig {
  kvt_layout lay;
  kvt_segment segs[MAX_SEGS];
  unsigned char *dev, *host;
  size_t dev_bytes, block_bytes, pitch;
  uint32_t n;
  uint32_t *slots;
  void **hosts;
  kvt__dev d;
  kvt_dev_xfer x;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done_calls, status;
} rig;

static void on_done(kvt_dev_xfer *x, int status) {
  rig *r = x->engine_data;
  pthread_mutex_lock(&r->lock);
  r->done_calls++;
  r->status = status;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

/* seg_bytes need not be a multiple of anything: odd sizes put runs at odd
 * addresses, which the streaming copy must handle at both ends. */
static void rig_open(rig *r, int kind, uint32_t layers, size_t seg_bytes, uint32_t num_slots, uint32_t threads) {
  memset(r, 0, sizeof *r);
  uint32_t nseg = layers * 2;
  assert_true(nseg <= MAX_SEGS);
  kvt_layout_init(&r->lay);
  r->lay.num_layers = layers;
  r->lay.segments_per_layer = 2;
  r->lay.num_slots = num_slots;
  r->lay.segments = r->segs;
  r->block_bytes = nseg * seg_bytes;
  r->dev_bytes = (size_t)num_slots * r->block_bytes;
  r->dev = malloc(r->dev_bytes);
  assert_non_null(r->dev);
  for (uint32_t j = 0; j < nseg; j++) {
    uint32_t l = j / 2, s = j % 2;
    if (kind == SLOT_PACKED) r->segs[j] = (kvt_segment){r->dev + j * seg_bytes, r->block_bytes, seg_bytes};
    else if (kind == LAYER_POOLS)
      r->segs[j] = (kvt_segment){r->dev + (size_t)j * num_slots * seg_bytes, seg_bytes, seg_bytes};
    else
      r->segs[j] = (kvt_segment){r->dev + (size_t)l * num_slots * 2 * seg_bytes + s * seg_bytes, 2 * seg_bytes, seg_bytes};
  }
  kvt_dev_open_args a = {.layout = &r->lay, .cuda_device = 0, .copy_threads = threads};
  assert_int_equal(kvt__dev_open(&r->d, kvt_dev_backend_host(), &a), 0);
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  r->x.done = on_done;
  r->x.engine_data = r;
  assert_int_equal(kvt__dev_xfer_prepare(&r->d, &r->x), 0);
}

/* n blocks at scattered slots; payloads a record header (4 KiB) apart. */
static void rig_blocks(rig *r, uint32_t n) {
  r->n = n;
  r->pitch = r->block_bytes + 4096 + 8; /* +8: payloads off 64-byte alignment */
  r->host = malloc((size_t)n * r->pitch);
  r->slots = calloc(n, sizeof *r->slots);
  r->hosts = calloc(n, sizeof *r->hosts);
  assert_non_null(r->host);
  assert_non_null(r->slots);
  assert_non_null(r->hosts);
  for (uint32_t i = 0; i < n; i++) {
    r->slots[i] = (uint32_t)(((uint64_t)i * 7919 + 3) % r->lay.num_slots); /* distinct: num_slots prime to 7919 */
    r->hosts[i] = r->host + (size_t)i * r->pitch;
  }
}

/* The device may already be closed (a test that joined its threads early):
 * the host backend's per-transfer state needs no context to be freed. */
static void rig_close(rig *r) {
  kvt__dev_close(&r->d);
  kvt__dev_xfer_release(&r->d, &r->x);
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  free(r->dev);
  free(r->host);
  free(r->slots);
  free(r->hosts);
}

static unsigned char *piece(rig *r, uint32_t i, uint32_t j) {
  return (unsigned char *)r->segs[j].base + (size_t)r->slots[i] * r->segs[j].stride;
}

static size_t piece_off(rig *r, uint32_t j) { return (size_t)j * r->segs[0].bytes; }

static void submit(rig *r, int dir) {
  r->x.dir = dir;
  r->x.n_blocks = r->n;
  r->x.dev_slots = r->slots;
  r->x.host_blocks = (void *const *)r->hosts;
  pthread_mutex_lock(&r->lock);
  r->done_calls = 0;
  r->status = 1;
  pthread_mutex_unlock(&r->lock);
  assert_int_equal(kvt__dev_submit(&r->d, &r->x), 0);
}

static int wait_done(rig *r) {
  pthread_mutex_lock(&r->lock);
  while (r->done_calls == 0) pthread_cond_wait(&r->cond, &r->lock);
  int status = r->status;
  pthread_mutex_unlock(&r->lock);
  return status;
}

/* Layer l of block i on the device equals the host payload's copy. */
static int layer_matches(rig *r, uint32_t i, uint32_t l) {
  for (uint32_t s = 0; s < 2; s++) {
    uint32_t j = l * 2 + s;
    if (memcmp(piece(r, i, j), (unsigned char *)r->hosts[i] + piece_off(r, j), r->segs[j].bytes)) return 0;
  }
  return 1;
}

/* Store random device blocks, wipe the device, restore, compare both ways;
 * the bytes of slots outside the transfer stay untouched. */
static void round_trip(rig *r) {
  size_t host_bytes = (size_t)r->n * r->pitch;
  kvt_test_fill(r->dev, r->dev_bytes, 1);
  kvt_test_fill(r->host, host_bytes, 2);
  unsigned char *want_dev = malloc(r->dev_bytes), *old_host = malloc(host_bytes ? host_bytes : 1);
  assert_non_null(want_dev);
  assert_non_null(old_host);
  memcpy(want_dev, r->dev, r->dev_bytes);
  memcpy(old_host, r->host, host_bytes);
  submit(r, KVT_XFER_D2H);
  assert_int_equal(wait_done(r), 0);
  for (uint32_t i = 0; i < r->n; i++) {
    for (uint32_t l = 0; l < r->lay.num_layers; l++) assert_true(layer_matches(r, i, l));
    /* The room after a payload (the next record's header) is not written. */
    size_t gap = (size_t)i * r->pitch + r->block_bytes;
    assert_memory_equal(r->host + gap, old_host + gap, r->pitch - r->block_bytes);
  }
  free(old_host);
  kvt_test_fill(r->dev, r->dev_bytes, 4); /* the device forgets */
  unsigned char *untouched = malloc(r->dev_bytes);
  assert_non_null(untouched);
  memcpy(untouched, r->dev, r->dev_bytes);
  submit(r, KVT_XFER_H2D);
  assert_int_equal(wait_done(r), 0);
  for (uint32_t l = 0; l < r->lay.num_layers; l++) assert_int_equal(kvt__dev_layer_ready(&r->d, &r->x, l), 0);
  /* Every piece of the transfer is back as stored; everything else is as the
   * device had it before the restore. */
  for (uint32_t i = 0; i < r->n; i++)
    for (uint32_t j = 0; j < r->lay.num_layers * 2; j++) {
      size_t off = (size_t)(piece(r, i, j) - r->dev);
      assert_memory_equal(r->dev + off, want_dev + off, r->segs[j].bytes);
      memcpy(untouched + off, want_dev + off, r->segs[j].bytes);
    }
  assert_memory_equal(r->dev, untouched, r->dev_bytes);
  free(untouched);
  free(want_dev);
}

static void small_transfers_are_byte_exact_for_every_layout(void **state) {
  (void)state;
  const uint32_t threads[] = {1, 2, 3, 0};
  for (int kind = SLOT_PACKED; kind <= FLASHINFER; kind++)
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
      rig r;
      rig_open(&r, kind, 5, 1000, 31, threads[t]);
      rig_blocks(&r, 12);
      round_trip(&r);
      rig_close(&r);
    }
}

/* Big enough to be cut into many units per step and copied with streaming
 * stores (>= 64 MiB in all, runs >= 32 KiB), with odd piece sizes. */
static void large_transfers_split_and_streamed_are_byte_exact(void **state) {
  (void)state;
  const uint32_t threads[] = {1, 2, 4};
  for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
    rig r;
    rig_open(&r, t == 1 ? LAYER_POOLS : SLOT_PACKED, 8, 33333, 131, threads[t]);
    rig_blocks(&r, 127); /* 127 x 16 x 33333 B = 68 MB */
    round_trip(&r);
    rig_close(&r);
  }
}

/* Tiny pieces (1 KiB per layer and segment) across many blocks: several
 * layers per step, many blocks per unit. */
static void many_small_blocks_are_byte_exact(void **state) {
  (void)state;
  rig r;
  rig_open(&r, SLOT_PACKED, 32, 1024, 2003, 2);
  rig_blocks(&r, 2000);
  round_trip(&r);
  rig_close(&r);
}

typedef struct watcher {
  rig *r;
  int use_wait;
  uint32_t checked; /* layers verified while the load was in flight or after */
  int bad;
} watcher;

/* Follows a load layer by layer: as soon as layer l reads as ready (polled,
 * or waited for), every block's layer l must hold its final bytes. */
static void *watch(void *arg) {
  watcher *w = arg;
  rig *r = w->r;
  for (uint32_t l = 0; l < r->lay.num_layers; l++) {
    if (w->use_wait) {
      if (kvt__dev_wait_layer(&r->d, &r->x, l, NULL) != 0) w->bad++;
    } else {
      while (kvt__dev_layer_ready(&r->d, &r->x, l) != 0) sched_yield();
    }
    for (uint32_t i = 0; i < r->n; i++)
      if (!layer_matches(r, i, l)) w->bad++;
    for (uint32_t k = 0; k < l; k++) /* readiness never goes back */
      if (kvt__dev_layer_ready(&r->d, &r->x, k) != 0) w->bad++;
    w->checked++;
  }
  return NULL;
}

static void ready_layer_means_every_block_has_it(void **state) {
  (void)state;
  for (int use_wait = 0; use_wait < 2; use_wait++)
    for (uint32_t threads = 1; threads <= 3; threads += 2) {
      rig r;
      rig_open(&r, use_wait ? LAYER_POOLS : SLOT_PACKED, 32, 8192, 131, threads);
      rig_blocks(&r, 128); /* 64 MiB: several steps, many units each */
      kvt_test_fill(r.host, (size_t)r.n * r.pitch, 9);
      memset(r.dev, 0, r.dev_bytes);
      watcher w = {.r = &r, .use_wait = use_wait};
      pthread_t th;
      submit(&r, KVT_XFER_H2D);
      assert_int_equal(pthread_create(&th, NULL, watch, &w), 0);
      assert_int_equal(wait_done(&r), 0);
      pthread_join(th, NULL);
      assert_int_equal(w.checked, 32);
      assert_int_equal(w.bad, 0);
      rig_close(&r);
    }
}

#ifdef KVT_FAULT_INJECTION
/* Holds a copy at its stall point until the test lets it go. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int held, released, fail_complete;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};

static int gate_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  (void)arg;
  if (site == KVT_FAULT_DEV_COMPLETE) return gate.fail_complete;
  if (site != KVT_FAULT_DEV_DELAY_US) return 0;
  pthread_mutex_lock(&gate.lock);
  gate.held++;
  pthread_cond_broadcast(&gate.cond);
  while (!gate.released) pthread_cond_wait(&gate.cond, &gate.lock);
  pthread_mutex_unlock(&gate.lock);
  return 0;
}

/* While the first unit of a load is stalled, the other threads copy the rest,
 * yet no layer reads as ready and done() is not called; once it goes on,
 * everything lands. */
static void stalled_first_unit_holds_back_every_layer(void **state) {
  (void)state;
  rig r;
  rig_open(&r, SLOT_PACKED, 8, 65536, 67, 2);
  rig_blocks(&r, 64); /* 64 MiB: many units */
  kvt_test_fill(r.host, (size_t)r.n * r.pitch, 5);
  gate.held = gate.released = gate.fail_complete = 0;
  kvt__fault_set(gate_hook, NULL);
  submit(&r, KVT_XFER_H2D);
  pthread_mutex_lock(&gate.lock);
  while (!gate.held) pthread_cond_wait(&gate.cond, &gate.lock);
  pthread_mutex_unlock(&gate.lock);
  for (uint32_t l = 0; l < 8; l++) assert_int_equal(kvt__dev_layer_ready(&r.d, &r.x, l), 1);
  pthread_mutex_lock(&r.lock);
  assert_int_equal(r.done_calls, 0);
  pthread_mutex_unlock(&r.lock);
  pthread_mutex_lock(&gate.lock);
  gate.released = 1;
  pthread_cond_broadcast(&gate.cond);
  pthread_mutex_unlock(&gate.lock);
  assert_int_equal(kvt__dev_wait_layer(&r.d, &r.x, 7, NULL), 0);
  assert_int_equal(wait_done(&r), 0);
  kvt__fault_set(NULL, NULL);
  for (uint32_t i = 0; i < r.n; i++)
    for (uint32_t l = 0; l < 8; l++) assert_true(layer_matches(&r, i, l));
  pthread_mutex_lock(&r.lock);
  assert_int_equal(r.done_calls, 1);
  pthread_mutex_unlock(&r.lock);
  rig_close(&r);
}

/* An injected completion error reaches done(), once, for split transfers. */
static void completion_error_is_reported_once(void **state) {
  (void)state;
  rig r;
  rig_open(&r, SLOT_PACKED, 4, 131072, 67, 3);
  rig_blocks(&r, 64);
  gate.released = 1;
  gate.fail_complete = -EIO;
  kvt__fault_set(gate_hook, NULL);
  for (int dir = 0; dir < 2; dir++) {
    submit(&r, dir);
    assert_int_equal(wait_done(&r), -EIO);
  }
  kvt__dev_close(&r.d); /* joins the copy threads: every unit has ended */
  kvt__fault_set(NULL, NULL);
  gate.fail_complete = 0;
  pthread_mutex_lock(&r.lock);
  assert_int_equal(r.done_calls, 1);
  pthread_mutex_unlock(&r.lock);
  rig_close(&r);
}
#endif

/* A unit that cannot be copied (a slot outside the pool) fails the transfer
 * with -EINVAL, the other units still complete, and a waiter on the last
 * layer returns instead of sleeping forever. */
static void bad_slot_fails_the_transfer_without_hanging(void **state) {
  (void)state;
  rig r;
  rig_open(&r, SLOT_PACKED, 4, 131072, 67, 2);
  rig_blocks(&r, 64);
  r.slots[40] = 67;
  submit(&r, KVT_XFER_H2D);
  assert_int_equal(kvt__dev_wait_layer(&r.d, &r.x, 3, NULL), 0);
  assert_int_equal(wait_done(&r), -EINVAL);
  kvt__dev_close(&r.d);
  pthread_mutex_lock(&r.lock);
  assert_int_equal(r.done_calls, 1);
  pthread_mutex_unlock(&r.lock);
  rig_close(&r);
}

static void empty_transfer_completes(void **state) {
  (void)state;
  rig r;
  rig_open(&r, SLOT_PACKED, 3, 512, 8, 2);
  rig_blocks(&r, 0);
  submit(&r, KVT_XFER_H2D);
  assert_int_equal(wait_done(&r), 0);
  assert_int_equal(kvt__dev_layer_ready(&r.d, &r.x, 2), 0);
  rig_close(&r);
}

/* The host pool is resident (every page) once initialised: no copy pays for
 * first-touch faults. Big pools are 2 MiB aligned, for huge pages. */
static void host_pool_is_resident_at_init(void **state) {
  (void)state;
  rig r;
  rig_open(&r, SLOT_PACKED, 2, 4096, 4, 1);
  kvt__host_pool p;
  assert_int_equal(kvt__host_pool_init(&p, &r.d, 200, 16384, 0), 0); /* 3.1 MiB */
  assert_int_equal(p.pinned, 0);
  assert_int_equal((uintptr_t)p.base % (2u << 20), 0);
  long page = sysconf(_SC_PAGESIZE);
  size_t pages = (p.bytes + (size_t)page - 1) / (size_t)page;
  unsigned char *vec = malloc(pages);
  assert_non_null(vec);
  assert_int_equal(mincore(p.base, p.bytes, vec), 0);
  for (size_t i = 0; i < pages; i++) assert_true(vec[i] & 1);
  free(vec);
  memset(p.base, 0xab, p.bytes); /* and it is ours to write */
  kvt__host_pool_fini(&p, &r.d);
  assert_null(p.base);
  /* A pool under the huge-page size is plain page-aligned memory. */
  assert_int_equal(kvt__host_pool_init(&p, &r.d, 2, 4096, 0), 0);
  assert_int_equal((uintptr_t)p.base % (uintptr_t)page, 0);
  unsigned char two[2] = {0, 0};
  assert_int_equal(mincore(p.base, p.bytes, two), 0);
  assert_true((two[0] & 1) && (two[1] & 1));
  kvt__host_pool_fini(&p, &r.d);
  rig_close(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(small_transfers_are_byte_exact_for_every_layout),
      cmocka_unit_test(large_transfers_split_and_streamed_are_byte_exact),
      cmocka_unit_test(many_small_blocks_are_byte_exact),
      cmocka_unit_test(ready_layer_means_every_block_has_it),
#ifdef KVT_FAULT_INJECTION
      cmocka_unit_test(stalled_first_unit_holds_back_every_layer),
      cmocka_unit_test(completion_error_is_reported_once),
#endif
      cmocka_unit_test(bad_slot_fails_the_transfer_without_hanging),
      cmocka_unit_test(empty_transfer_completes),
      cmocka_unit_test(host_pool_is_resident_at_init),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
