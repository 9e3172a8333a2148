/* A RAM KV pool registered with kvtier through the host backend, as a CPU
 * engine would: per layer a K and a V segment, slot s at base + s * bytes. */
#ifndef KVT_TEST_KV_FIXTURE_H
#define KVT_TEST_KV_FIXTURE_H
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kvtier/kvtier.h"

int kvt__check_invariants(kvt_cache *c, char *msg, size_t len); /* src/engine/check.c */

#define FIX_LAYERS 4
#define FIX_SEG_BYTES 512

typedef struct fixture {
  kvt_cache *c;
  uint32_t slots, bt;
  unsigned char *pool[FIX_LAYERS][2];
  kvt_segment seg[FIX_LAYERS * 2];
} fixture;

static inline kvt_config fixture_config(uint32_t host_blocks) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "test-model@1";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = host_blocks;
  cfg.max_jobs = 32;
  cfg.max_job_blocks = 256;
  return cfg;
}

static inline void fixture_open_cfg(fixture *f, const kvt_config *cfg, uint32_t slots) {
  memset(f, 0, sizeof *f);
  f->slots = slots;
  f->bt = cfg->block_tokens;
  assert_int_equal(kvt_open(cfg, &f->c), 0);
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++) {
      f->pool[l][s] = calloc(slots, FIX_SEG_BYTES);
      assert_non_null(f->pool[l][s]);
      f->seg[l * 2 + s] = (kvt_segment){f->pool[l][s], FIX_SEG_BYTES, FIX_SEG_BYTES};
    }
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.segments_per_layer = 2;
  lay.num_slots = slots;
  lay.segments = f->seg;
  assert_int_equal(kvt_register_layout(f->c, &lay), 0);
}

static inline void fixture_open(fixture *f, uint32_t slots, uint32_t host_blocks) {
  kvt_config cfg = fixture_config(host_blocks);
  fixture_open_cfg(f, &cfg, slots);
}

/* Every test ends with the tier map's invariants checked (no slot leaked
 * or shared, LRU lists consistent, nothing pinned once idle). */
static inline void fixture_close(fixture *f) {
  char why[160] = "";
  if (f->c) {
    kvt_drain(f->c);
    if (kvt__check_invariants(f->c, why, sizeof why) != 0) print_error("tier map invariant: %s\n", why);
    assert_string_equal(why, "");
  }
  kvt_close(f->c);
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++) free(f->pool[l][s]);
}

/* "Prefill": writes block content derived from seed into device slot. */
static inline void fixture_write(fixture *f, uint32_t slot, uint64_t seed) {
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++)
      kvt_test_fill(f->pool[l][s] + (size_t)slot * FIX_SEG_BYTES, FIX_SEG_BYTES, seed * 131 + (uint64_t)(l * 2 + s));
}

static inline int fixture_check(const fixture *f, uint32_t slot, uint64_t seed) {
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++)
      if (!kvt_test_check(f->pool[l][s] + (size_t)slot * FIX_SEG_BYTES, FIX_SEG_BYTES, seed * 131 + (uint64_t)(l * 2 + s)))
        return 0;
  return 1;
}

static inline void fixture_scribble(fixture *f) {
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++) memset(f->pool[l][s], 0xA5, (size_t)f->slots * FIX_SEG_BYTES);
}

/* Conversation `conv`: tokens for n blocks, deterministic. */
static inline void conv_tokens(uint32_t *t, uint32_t n_tokens, uint32_t conv) {
  for (uint32_t i = 0; i < n_tokens; i++) t[i] = conv * 100003u + i * 7u + 1u;
}

static inline uint64_t block_seed(uint32_t conv, uint32_t block) { return (uint64_t)conv << 20 | block; }

/* Keys and tokens of conversation conv's first n blocks. */
static inline void fixture_keys(fixture *f, uint32_t conv, uint32_t n, kvt_key *keys, uint32_t *tok) {
  conv_tokens(tok, n * f->bt, conv);
  size_t nk = 0;
  assert_int_equal(kvt_hash_tokens(f->c, NULL, tok, n * f->bt, keys, n, &nk), 0);
  assert_int_equal(nk, n);
}

/* Offloads keys (kvt_store with EVICT) and asserts the copy succeeded. */
static inline void fixture_offload(fixture *f, const kvt_key *keys, uint32_t n) {
  kvt_job j;
  int rc = kvt_store(f->c, keys, n, KVT_STORE_EVICT, &j);
  assert_true(rc == 0 || rc == 1);
  if (rc == 1) {
    assert_int_equal(kvt_job_wait(f->c, j, -1), 0);
    assert_int_equal(kvt_job_release(f->c, j), 0);
  }
}

static inline kvt_lookup_result fixture_lookup(fixture *f, const kvt_key *keys, uint32_t n) {
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_lookup(f->c, keys, n, &r, NULL), 0);
  return r;
}

static inline kvt_stats fixture_stats(fixture *f) {
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f->c, &st), 0);
  return st;
}

/* Runs one request: restores what is cached, "computes" the rest, commits all. */
static inline uint32_t run_request(fixture *f, const kvt_key *keys, const uint32_t *tok, uint32_t n,
                                   uint32_t conv) {
  kvt_req r;
  uint32_t slots[256], ready = 0;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(f->c, keys, tok, n, n, 0, 0, &r, slots, &info);
  assert_true(rc == 0 || rc == 1);
  assert_int_equal(kvt_request_wait(f->c, r, -1, &ready), 0);
  assert_true(ready <= info.n_restore);
  for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(f, slots[i], block_seed(conv, i)));
  for (uint32_t i = ready; i < n; i++) fixture_write(f, slots[i], block_seed(conv, i));
  assert_int_equal(kvt_commit(f->c, r, n, NULL), 0);
  assert_int_equal(kvt_release(f->c, r), 0);
  return ready;
}
#endif
