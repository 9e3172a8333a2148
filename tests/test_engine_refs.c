/* Engine: request references have no capacity of their own. Requests that
 * share a cached prefix each hold references to the same device slots, so
 * a request that fits in the free device slots must never be refused for
 * lack of reference space, however many requests share, and however
 * releases left the references that are free. Metadata-only: 64 device
 * slots, a 32-block prefix cached on the device. */
#include "helpers.h"

#include <string.h>

#include "kvtier/kvtier.h"

int kvt__check_invariants(kvt_cache *c, char *msg, size_t len); /* src/engine/check.c */

enum { SLOTS = 64, PREFIX = 32 };

static kvt_cache *open_cache(uint32_t max_requests) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "engine-refs";
  cfg.device = KVT_DEVICE_HOST;
  cfg.max_requests = max_requests;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = SLOTS;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  return c;
}

static void keys_of(kvt_cache *c, uint64_t id0, size_t n, kvt_key *keys) {
  uint64_t ids[SLOTS];
  for (size_t i = 0; i < n; i++) ids[i] = id0 + i;
  assert_int_equal(kvt_keys_from_opaque(c, ids, sizeof ids[0], n, keys), 0);
}

/* Caches keys[0..PREFIX) on the device and returns the slots they hold. */
static void cache_prefix(kvt_cache *c, const kvt_key *keys, uint32_t *slots) {
  kvt_req req;
  assert_int_equal(kvt_acquire(c, keys, NULL, PREFIX, 0, 0, 0, &req, slots, NULL), 0);
  assert_int_equal(kvt_commit(c, req, PREFIX, NULL), 0);
  assert_int_equal(kvt_release(c, req), 0);
}

/* A sharer: the whole prefix restored from the device, in the same slots. */
static kvt_req share(kvt_cache *c, const kvt_key *keys, const uint32_t *want) {
  kvt_req req;
  uint32_t slots[PREFIX];
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(c, keys, NULL, PREFIX, PREFIX, 0, 0, &req, slots, &info);
  if (rc < 0) print_error("kvt_acquire: %s\n", kvt_strerror(rc));
  assert_int_equal(rc, 0);
  assert_int_equal(info.n_device_hits, PREFIX);
  assert_memory_equal(slots, want, sizeof slots);
  return req;
}

static void seventh_sharer_of_a_cached_prefix_is_served(void **state) {
  (void)state;
  kvt_cache *c = open_cache(64);
  kvt_key keys[PREFIX];
  uint32_t cached[PREFIX];
  keys_of(c, 1000, PREFIX, keys);
  cache_prefix(c, keys, cached);
  /* Forty sharers: 1280 references to 32 slots, with 32 slots still free. */
  kvt_req reqs[40];
  for (int i = 0; i < 40; i++) reqs[i] = share(c, keys, cached);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0);
  assert_int_equal(st.resident_device, PREFIX);
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  for (int i = 0; i < 40; i++) assert_int_equal(kvt_release(c, reqs[i]), 0);
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  kvt_close(c);
}

static void request_after_scattered_releases_is_served(void **state) {
  (void)state;
  kvt_cache *c = open_cache(64);
  kvt_key keys[PREFIX + 11];
  uint32_t cached[PREFIX];
  keys_of(c, 2000, PREFIX + 11, keys);
  cache_prefix(c, keys, cached);
  kvt_req reqs[6];
  for (int i = 0; i < 6; i++) reqs[i] = share(c, keys, cached);
  for (int i = 1; i < 6; i += 2) assert_int_equal(kvt_release(c, reqs[i]), 0); /* free refs in holes */
  /* 32 shared blocks and 11 computed ones: 43 references, 11 free slots used. */
  kvt_req req;
  uint32_t slots[PREFIX + 11];
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(c, keys, NULL, PREFIX + 11, PREFIX + 11, 0, 0, &req, slots, &info);
  if (rc < 0) print_error("kvt_acquire: %s\n", kvt_strerror(rc));
  assert_int_equal(rc, 0);
  assert_int_equal(info.n_restore, PREFIX);
  assert_memory_equal(slots, cached, sizeof cached);
  for (int i = PREFIX; i < PREFIX + 11; i++)
    for (int k = 0; k < PREFIX; k++) assert_int_not_equal(slots[i], cached[k]);
  assert_int_equal(kvt_commit(c, req, PREFIX + 11, NULL), 0);
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  assert_int_equal(kvt_release(c, req), 0);
  for (int i = 0; i < 6; i += 2) assert_int_equal(kvt_release(c, reqs[i]), 0);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(c, keys, PREFIX + 11, &lr, NULL), 0);
  assert_int_equal(lr.n_device, PREFIX + 11); /* the computed tail was cached too */
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  kvt_close(c);
}

/* Requests of every size come and go in a shuffled order: the slots each
 * request is given stay its own, and the map stays consistent. */
static void mixed_sizes_churn_keeps_slots_private(void **state) {
  (void)state;
  kvt_cache *c = open_cache(32);
  enum { LIVE = 12 };
  kvt_req live[LIVE] = {0};
  uint32_t n_of[LIVE] = {0}, held[LIVE][SLOTS];
  uint64_t rng = 12345;
  for (int round = 0; round < 2000; round++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t k = (uint32_t)(rng >> 33) % LIVE;
    if (live[k]) {
      assert_int_equal(kvt_release(c, live[k]), 0);
      live[k] = 0;
      continue;
    }
    uint32_t used = 0;
    for (int i = 0; i < LIVE; i++) used += live[i] ? n_of[i] : 0;
    uint32_t n = 1 + (uint32_t)(rng >> 45) % 40;
    if (n > SLOTS - used) continue;
    kvt_key keys[SLOTS];
    keys_of(c, (uint64_t)round << 8, n, keys);
    int rc = kvt_acquire(c, keys, NULL, n, 0, 0, KVT_ACQUIRE_NOWAIT, &live[k], held[k], NULL);
    if (rc < 0) print_error("round %d: kvt_acquire of %u with %u slots in use: %s\n", round, n, used,
                            kvt_strerror(rc));
    assert_int_equal(rc, 0);
    n_of[k] = n;
    for (int i = 0; i < LIVE; i++) /* no slot handed out twice */
      for (uint32_t a = 0; live[i] && i != (int)k && a < n_of[i]; a++)
        for (uint32_t b = 0; b < n; b++) assert_int_not_equal(held[i][a], held[k][b]);
  }
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  for (int i = 0; i < LIVE; i++)
    if (live[i]) assert_int_equal(kvt_release(c, live[i]), 0);
  kvt_close(c);
}

/* A request over two chunks of references, restored in part, committed in
 * two pieces that end inside a chunk: release walks its references back
 * across the chunk boundary, so the chain's tail is evicted before its
 * ancestors, and every block the request computed is cached behind the
 * right parent. */
static void release_across_chunks_evicts_tails_first(void **state) {
  (void)state;
  enum { N = 45, CACHED = 20, SPLIT = 33, EVICT = 10 };
  kvt_cache *c = open_cache(8);
  kvt_key keys[N], other[SLOTS];
  keys_of(c, 3000, N, keys);
  keys_of(c, 9000, SLOTS, other);
  kvt_req req;
  uint32_t slots[N];
  assert_int_equal(kvt_acquire(c, keys, NULL, CACHED, 0, 0, 0, &req, slots, NULL), 0);
  assert_int_equal(kvt_commit(c, req, CACHED, NULL), 0);
  assert_int_equal(kvt_release(c, req), 0);
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(c, keys, NULL, N, N, 0, 0, &req, slots, &info), 0);
  assert_int_equal(info.n_restore, CACHED);
  assert_int_equal(info.n_device_hits, CACHED);
  assert_int_equal(kvt_commit(c, req, SPLIT, NULL), 0);
  assert_int_equal(kvt_commit(c, req, N, NULL), 0);
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  assert_int_equal(kvt_release(c, req), 0);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(c, keys, N, &lr, NULL), 0);
  assert_int_equal(lr.n_device, N); /* every parent link holds */
  /* EVICT more slots than are free: the oldest blocks go, the chain's last ones. */
  uint32_t fresh[SLOTS];
  assert_int_equal(kvt_acquire(c, other, NULL, SLOTS - N + EVICT, 0, 0, 0, &req, fresh, NULL), 0);
  assert_int_equal(kvt_lookup(c, keys, N, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, N - EVICT);
  assert_int_equal(lr.n_device, N - EVICT);
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  assert_int_equal(kvt_release(c, req), 0);
  kvt_close(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(seventh_sharer_of_a_cached_prefix_is_served),
      cmocka_unit_test(request_after_scattered_releases_is_served),
      cmocka_unit_test(mixed_sizes_churn_keeps_slots_private),
      cmocka_unit_test(release_across_chunks_evicts_tails_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
