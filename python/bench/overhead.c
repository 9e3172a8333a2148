/* The C side of python/bench/overhead.py: the same calls on the same cache
 * shape, timed the same way, so the difference is the binding's cost.
 * Prints one line per operation: name, best microseconds per call. */
#include <kvtier/kvtier.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { LAYERS = 2, SEGS = 2, SEG_BYTES = 256, BT = 16, N = 16, SLOTS = 64 };

static unsigned char pool[LAYERS * SEGS][SLOTS * SEG_BYTES];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHECK(call)                                                          \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ < 0) {                                                           \
      fprintf(stderr, "%s: %s (%d)\n", #call, kvt_strerror(rc_), rc_);       \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static kvt_cache *c;
static kvt_key keys[N];
static uint32_t slots[N];

static void op_lookup(void) {
  kvt_lookup_result r = {.size = sizeof r};
  CHECK(kvt_lookup(c, keys, N, &r, NULL));
}

static void op_acquire(void) { /* device hits: acquire, commit, release */
  kvt_req req;
  kvt_acquire_info info = {.size = sizeof info};
  CHECK(kvt_acquire(c, keys, NULL, N, N, 0, 0, &req, slots, &info));
  CHECK(kvt_commit(c, req, N, NULL));
  CHECK(kvt_release(c, req));
}

static void op_store(void) { /* store(evict) + wait, then restore from host + wait */
  kvt_job job;
  kvt_req req;
  kvt_acquire_info info = {.size = sizeof info};
  if (kvt_store(c, keys, N, KVT_STORE_EVICT, &job) == 1) {
    CHECK(kvt_job_wait(c, job, -1));
    CHECK(kvt_job_release(c, job));
  }
  CHECK(kvt_acquire(c, keys, NULL, N, N, 0, 0, &req, slots, &info));
  CHECK(kvt_request_wait(c, req, -1, NULL));
  CHECK(kvt_commit(c, req, N, NULL));
  CHECK(kvt_release(c, req));
}

/* Storage mode: 16 blocks of the engine's memory, by opaque keys. */
enum { SBLOCK = LAYERS * SEGS * SEG_BYTES };
static kvt_cache *sc;
static kvt_key skeys[N];
static unsigned char src[N][SBLOCK], dst[N][SBLOCK];
static kvt_piece put_pieces[N], get_pieces[N];

static void storage_run(const kvt_piece *pieces, int get) {
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = N, b.keys = skeys, b.pieces = pieces, b.pieces_per_block = 1, b.flags = KVT_KEYS_OPAQUE;
  kvt_job job;
  int32_t res[N];
  CHECK(get ? kvt_get_into(sc, &b, &job) : kvt_put_from(sc, &b, &job));
  CHECK(kvt_storage_wait(sc, job, -1));
  CHECK(kvt_storage_results(sc, job, res, N, NULL));
  CHECK(kvt_storage_release(sc, job));
}

static void op_exists(void) {
  kvt_lookup_result r = {.size = sizeof r};
  CHECK(kvt_exists(sc, NULL, skeys, N, KVT_KEYS_OPAQUE, &r, NULL));
}

static void op_put(void) { /* remove, so that every put copies its 16 blocks */
  CHECK(kvt_remove(sc, skeys, N, NULL));
  storage_run(put_pieces, 0);
}

static void op_get(void) { storage_run(get_pieces, 1); }

static void storage_open(void) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "overhead-bench-storage";
  cfg.device = KVT_DEVICE_HOST;
  cfg.copy_threads = 1;
  cfg.host_blocks = 64;
  cfg.block_tokens = BT;
  CHECK(kvt_open(&cfg, &sc));
  kvt_segment seg = {NULL, 0, SBLOCK};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1, lay.segments_per_layer = 1, lay.segments = &seg, lay.flags = KVT_LAYOUT_STORAGE;
  CHECK(kvt_register_layout(sc, &lay));
  unsigned char raw[N][32];
  for (int i = 0; i < N; i++) {
    memset(raw[i], i + 1, sizeof raw[i]);
    memset(src[i], i * 7 + 1, SBLOCK);
    put_pieces[i] = (kvt_piece){.ptr = src[i], .len = SBLOCK};
    get_pieces[i] = (kvt_piece){.ptr = dst[i], .len = SBLOCK};
  }
  CHECK(kvt_keys_from_opaque(sc, raw, 32, N, skeys));
  storage_run(put_pieces, 0);
}

static double best_us(void (*op)(void), int iters, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; r++) {
    double t0 = now_s();
    for (int i = 0; i < iters; i++) op();
    double us = (now_s() - t0) / iters * 1e6;
    if (us < best) best = us;
  }
  return best;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000, rounds = argc > 2 ? atoi(argv[2]) : 5;
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "overhead-bench";
  cfg.device = KVT_DEVICE_HOST;
  cfg.copy_threads = 1;
  cfg.host_blocks = 64;
  cfg.block_tokens = BT;
  CHECK(kvt_open(&cfg, &c));
  kvt_segment seg[LAYERS * SEGS];
  for (int i = 0; i < LAYERS * SEGS; i++) seg[i] = (kvt_segment){pool[i], SEG_BYTES, SEG_BYTES};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = LAYERS, lay.segments_per_layer = SEGS, lay.num_slots = SLOTS, lay.segments = seg;
  CHECK(kvt_register_layout(c, &lay));
  uint32_t tokens[N * BT];
  for (uint32_t i = 0; i < N * BT; i++) tokens[i] = 1000 + i;
  size_t n;
  CHECK(kvt_hash_tokens(c, NULL, tokens, N * BT, keys, N, &n));
  op_acquire(); /* the blocks become cached on the device */
  printf("lookup %.3f\n", best_us(op_lookup, iters, rounds));
  printf("acquire %.3f\n", best_us(op_acquire, iters, rounds));
  printf("store %.3f\n", best_us(op_store, iters / 10 + 1, rounds));
  kvt_close(c);
  storage_open();
  printf("exists %.3f\n", best_us(op_exists, iters, rounds));
  printf("get %.3f\n", best_us(op_get, iters / 10 + 1, rounds));
  printf("put %.3f\n", best_us(op_put, iters / 10 + 1, rounds));
  if (memcmp(src, dst, sizeof src)) {
    fprintf(stderr, "storage get: the bytes differ\n");
    return 1;
  }
  kvt_close(sc);
  return 0;
}
