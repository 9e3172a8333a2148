/* Storage mode honours the write policy: under KVT_WRITE_THROUGH a block
 * put into the host tier is also written to disk at once (kvt_drain waits
 * for it), so it survives a reopen, and evicting it from the host later
 * costs no second write; under KVT_WRITE_BACK (the default) it reaches the
 * disk only when evicted. Objects (kvt_object_put) follow the same policy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kvtier/kvtier.h"

#define BT 16
#define BLOCK 16384u
#define NB 12

static char path[4200];

static kvt_cache *open_storage(uint32_t host, uint64_t disk, int reset, kvt_write_policy wp) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "storage-through-test";
  cfg.block_tokens = BT;
  cfg.host_blocks = host;
  cfg.copy_threads = 2;
  cfg.write_policy = wp;
  snprintf(path, sizeof path, "%s/storage-through.kvt", kvt_test_tmpdir());
  cfg.disk_path = path;
  cfg.disk_blocks = disk;
  cfg.disk_reset = reset;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_test_register_storage(c, BLOCK), 0);
  return c;
}

typedef struct blocks {
  uint32_t tokens[NB * BT];
  kvt_key keys[NB];
  char *mem;
  kvt_piece p[NB];
} blocks;

static void blocks_make(blocks *b, kvt_cache *c, uint64_t seed) {
  for (uint32_t i = 0; i < NB * BT; i++) b->tokens[i] = 500 + i * 3;
  size_t n = 0;
  assert_int_equal(kvt_hash_tokens(c, NULL, b->tokens, NB * BT, b->keys, NB, &n), 0);
  b->mem = malloc((size_t)NB * BLOCK);
  assert_non_null(b->mem);
  for (uint32_t i = 0; i < NB; i++) {
    kvt_test_fill(b->mem + (size_t)i * BLOCK, BLOCK, seed + i);
    b->p[i] = (kvt_piece){.ptr = b->mem + (size_t)i * BLOCK, .len = BLOCK};
  }
}

static int run(kvt_cache *c, blocks *b, int get, uint32_t *n_ok) {
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = NB;
  bt.keys = b->keys;
  bt.tokens = b->tokens;
  bt.pieces = b->p;
  kvt_job job = 0;
  assert_int_equal(get ? kvt_get_into(c, &bt, &job) : kvt_put_from(c, &bt, &job), 1);
  int rc = kvt_storage_wait(c, job, -1);
  int32_t res[NB];
  assert_int_equal(kvt_storage_results(c, job, res, NB, n_ok), 0);
  assert_int_equal(kvt_storage_release(c, job), 0);
  return rc;
}

static kvt_stats stats(kvt_cache *c) {
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0);
  return st;
}

static kvt_lookup_result exists(kvt_cache *c, const blocks *b) {
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(c, NULL, b->keys, NB, 0, &r, NULL), 0);
  return r;
}

/* Puts NB blocks into a host tier that holds them all, closes, reopens
 * with no host tier: what the disk holds then is what the policy wrote. */
static uint32_t on_disk_after_reopen(kvt_write_policy wp, uint64_t *written) {
  kvt_cache *c = open_storage(NB, 64, 1, wp);
  blocks b;
  blocks_make(&b, c, 40);
  uint32_t ok = 0;
  assert_int_equal(run(c, &b, 0, &ok), 0);
  assert_int_equal(ok, NB);
  assert_int_equal(kvt_drain(c), 0);
  assert_int_equal(exists(c, &b).n_host, NB); /* served from the host tier all the same */
  *written = stats(c).blocks_h2disk;
  kvt_close(c);
  c = open_storage(0, 64, 0, wp);
  kvt_lookup_result r = exists(c, &b);
  assert_int_equal(r.n_disk, r.n_prefix);
  if (r.n_prefix) {
    memset(b.mem, 0, (size_t)NB * BLOCK);
    assert_int_equal(run(c, &b, 1, &ok), 0);
    assert_int_equal(ok, r.n_prefix);
    for (uint32_t i = 0; i < ok; i++) assert_true(kvt_test_check(b.mem + (size_t)i * BLOCK, BLOCK, 40 + i));
  }
  kvt_close(c);
  free(b.mem);
  return r.n_prefix;
}

static void write_through_puts_reach_disk_at_once(void **s) {
  (void)s;
  uint64_t written = 0;
  assert_int_equal(on_disk_after_reopen(KVT_WRITE_THROUGH, &written), NB);
  assert_int_equal(written, NB);
}

static void write_back_puts_stay_on_the_host(void **s) {
  (void)s;
  uint64_t written = 1;
  assert_int_equal(on_disk_after_reopen(KVT_WRITE_BACK, &written), 0);
  assert_int_equal(written, 0);
}

/* A host tier of 4 blocks: under write-through every block is written once,
 * at its put, and host victims (already on disk) are dropped, not written
 * again; every block is still served, from one tier or the other. */
static void written_through_victims_are_not_written_twice(void **s) {
  (void)s;
  kvt_cache *c = open_storage(4, 64, 1, KVT_WRITE_THROUGH);
  blocks b;
  blocks_make(&b, c, 70);
  uint32_t ok = 0;
  for (uint32_t i = 0; i < NB; i += 2) { /* two blocks a put, so earlier ones get evicted */
    kvt_batch bt;
    kvt_batch_init(&bt);
    bt.n_blocks = 2;
    bt.keys = &b.keys[i];
    bt.parent = i ? &b.keys[i - 1] : NULL;
    bt.tokens = &b.tokens[i * BT];
    bt.pieces = &b.p[i];
    kvt_job job = 0;
    assert_int_equal(kvt_put_from(c, &bt, &job), 1);
    assert_int_equal(kvt_storage_wait(c, job, -1), 0);
    assert_int_equal(kvt_storage_release(c, job), 0);
    assert_int_equal(kvt_drain(c), 0);
  }
  kvt_stats st = stats(c);
  assert_int_equal(st.blocks_h2disk, NB);
  assert_true(st.evictions_host >= NB - 4);
  kvt_lookup_result r = exists(c, &b);
  assert_int_equal(r.n_prefix, NB);
  assert_int_equal(r.n_host + r.n_disk, NB);
  assert_true(r.n_disk >= NB - 4);
  memset(b.mem, 0, (size_t)NB * BLOCK);
  assert_int_equal(run(c, &b, 1, &ok), 0);
  assert_int_equal(ok, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(kvt_test_check(b.mem + (size_t)i * BLOCK, BLOCK, 70 + i));
  kvt_close(c);
  free(b.mem);
}

/* An object put into the host tier under write-through is found on disk
 * after a reopen, byte for byte. */
static void objects_put_through_survive_a_reopen(void **s) {
  (void)s;
  kvt_cache *c = open_storage(64, 64, 1, KVT_WRITE_THROUGH);
  uint32_t tokens[5 * BT];
  for (uint32_t i = 0; i < 5 * BT; i++) tokens[i] = 9000 + i;
  size_t len = 3 * BLOCK + 1234;
  char *data = malloc(len), *back = malloc(len);
  assert_non_null(data);
  assert_non_null(back);
  kvt_test_fill(data, len, 99);
  assert_int_equal(kvt_object_put(c, tokens, 5 * BT, data, len), 0);
  kvt_object_info info = {.size = sizeof info};
  assert_int_equal(kvt_object_find(c, tokens, 5 * BT, &info), 0);
  assert_int_equal(info.tier, KVT_TIER_HOST);
  kvt_close(c); /* waits for the disk copies */
  c = open_storage(64, 64, 0, KVT_WRITE_THROUGH);
  assert_int_equal(kvt_object_find(c, tokens, 5 * BT, &info), 0);
  assert_int_equal(info.tier, KVT_TIER_DISK);
  assert_int_equal(info.bytes, len);
  assert_int_equal(kvt_object_get(c, &info, tokens, back, len), 0);
  assert_memory_equal(back, data, len);
  kvt_close(c);
  free(data);
  free(back);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(write_through_puts_reach_disk_at_once),
      cmocka_unit_test(write_back_puts_stay_on_the_host),
      cmocka_unit_test(written_through_victims_are_not_written_twice),
      cmocka_unit_test(objects_put_through_survive_a_reopen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
