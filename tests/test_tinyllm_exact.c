/* tinyllm (examples/tinyllm) served through kvtier is exact: the first
 * generated token's logits after a restore from the host or the disk tier
 * are bit-identical to those of a run where the conversation never left
 * the device tier, and to a full recompute; a block whose stored tokens
 * differ from the request's is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "tl_engine.h"

#define MSG0 70 /* 4 full blocks + 6 tokens */
#define MSG1 21
#define GEN 3

typedef struct fixture {
  tl_model *m;
  tl_config cfg;
  float ref[512];       /* logits of round 1 when the conversation stayed on the device */
  uint32_t ref_token;
} fixture;

static fixture fx;

static void fill(uint32_t *t, size_t n, uint32_t salt) {
  uint64_t s = 0x1234567ull ^ salt;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[i] = (uint32_t)(s >> 33) % fx.cfg.vocab;
  }
}

static tl_engine *open_engine(uint64_t host_blocks, const char *disk) {
  tl_engine_opts o = {64, host_blocks, disk, disk ? 256 : 0, {0, 0, 0, 0}, 64};
  tl_engine *e = NULL;
  int rc = tl_engine_open(fx.m, &o, &e);
  if (rc) fail_msg("tl_engine_open: %s", kvt_strerror(rc));
  return e;
}

/* Round 0 of conversation `salt` (MSG0 tokens, GEN answer tokens). */
static void round0(tl_engine *e, tl_conv *cv, uint32_t salt) {
  uint32_t msg[MSG0];
  fill(msg, MSG0, salt);
  tl_turn t;
  assert_int_equal(tl_engine_turn(e, cv, msg, MSG0, GEN, TL_POLICY_RECOMPUTE, 1, NULL, &t), 0);
  assert_int_equal(cv->n, MSG0 + GEN);
}

static void round1(tl_engine *e, tl_conv *cv, tl_policy pol, float *logits, tl_turn *t) {
  uint32_t msg[MSG1];
  fill(msg, MSG1, 99);
  assert_int_equal(tl_engine_turn(e, cv, msg, MSG1, GEN, pol, 0, logits, t), 0);
  assert_int_equal(t->ctx_tokens, MSG0 + GEN + MSG1);
}

static int setup(void **state) {
  (void)state;
  if (tl_config_preset("tiny", &fx.cfg)) return -1;
  if (fx.cfg.vocab > sizeof fx.ref / sizeof fx.ref[0]) return -1;
  if (tl_model_create(&fx.cfg, &fx.m)) return -1;
  /* The reference: the conversation never leaves the device tier. */
  tl_engine *e = open_engine(64, NULL);
  tl_conv cv = {0};
  round0(e, &cv, 1);
  tl_turn t;
  round1(e, &cv, TL_POLICY_RESTORE, fx.ref, &t);
  int ok = t.info.n_restore == 4 && t.info.n_device_hits == 4 && t.info.n_loading == 0;
  fx.ref_token = t.first_token;
  tl_conv_free(&cv);
  tl_engine_close(e);
  return ok ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  tl_model_free(fx.m);
  return 0;
}

static void assert_same_as_reference(const float *logits, const tl_turn *t) {
  assert_int_equal(t->first_token, fx.ref_token);
  assert_memory_equal(logits, fx.ref, fx.cfg.vocab * sizeof *logits);
}

static void test_restore_from_host_is_bit_exact(void **state) {
  (void)state;
  tl_engine *e = open_engine(64, NULL);
  tl_conv cv = {0};
  round0(e, &cv, 1);
  assert_int_equal(tl_engine_offload(e, &cv), 0);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(tl_engine_cache(e), &st), 0);
  assert_int_equal(st.resident_host, 4); /* the 4 full blocks of round 0's prompt */
  float lg[512];
  tl_turn t;
  round1(e, &cv, TL_POLICY_RESTORE, lg, &t);
  assert_int_equal(t.info.n_restore, 4);
  assert_int_equal(t.info.n_device_hits, 0);
  assert_int_equal(t.info.n_loading, 4);
  assert_int_equal(t.info.n_from_disk, 0);
  assert_int_equal(t.n_ready, 4);
  assert_int_equal(t.recomputed, MSG0 + GEN + MSG1 - 4 * 16);
  assert_same_as_reference(lg, &t);
  tl_conv_free(&cv);
  tl_engine_close(e);
}

/* Batch invariance: recomputing every token gives the same bits too. */
static void test_recompute_is_bit_exact(void **state) {
  (void)state;
  tl_engine *e = open_engine(64, NULL);
  tl_conv cv = {0};
  round0(e, &cv, 1);
  assert_int_equal(tl_engine_offload(e, &cv), 0);
  float lg[512];
  tl_turn t;
  round1(e, &cv, TL_POLICY_RECOMPUTE, lg, &t);
  assert_int_equal(t.info.n_restore, 0);
  assert_int_equal(t.recomputed, MSG0 + GEN + MSG1);
  assert_same_as_reference(lg, &t);
  tl_conv_free(&cv);
  tl_engine_close(e);
}

static const char *disk_file(const char *name) {
  static char path[4200];
  snprintf(path, sizeof path, "%s/%s", kvt_test_tmpdir(), name);
  unlink(path);
  return path;
}

/* Host tier of 4 blocks: offloading a second conversation spills the
 * first one's blocks to disk; its restore fetches them back. */
static void test_restore_from_disk_is_bit_exact(void **state) {
  (void)state;
  const char *path = disk_file("tinyllm-disk.kvt");
  tl_engine *e = open_engine(4, path);
  tl_conv a = {0}, b = {0};
  round0(e, &a, 1);
  assert_int_equal(tl_engine_offload(e, &a), 0);
  round0(e, &b, 2);
  assert_int_equal(tl_engine_offload(e, &b), 0);
  assert_int_equal(kvt_drain(tl_engine_cache(e)), 0);
  float lg[512];
  tl_turn t;
  round1(e, &a, TL_POLICY_RESTORE, lg, &t);
  assert_int_equal(t.info.n_restore, 4);
  assert_true(t.info.n_from_disk > 0);
  assert_int_equal(t.n_ready, 4);
  assert_same_as_reference(lg, &t);
  tl_conv_free(&a);
  tl_conv_free(&b);
  tl_engine_close(e);
  unlink(path);
}

/* Keys of the true history but other tokens in block `bad` (a colliding
 * prefix): kvtier restores the blocks before it and refuses it. */
static uint32_t acquire_with_bad_block(tl_engine *e, const tl_conv *cv, uint32_t bad, uint32_t *n_ready) {
  kvt_cache *c = tl_engine_cache(e);
  kvt_key keys[4];
  size_t nk = 0;
  assert_int_equal(kvt_hash_tokens(c, NULL, cv->tok, 64, keys, 4, &nk), 0);
  assert_int_equal(nk, 4);
  uint32_t tok[64], slots[5];
  memcpy(tok, cv->tok, sizeof tok);
  tok[bad * 16 + 5] = (tok[bad * 16 + 5] + 1) % fx.cfg.vocab;
  kvt_req req;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(c, keys, tok, 4, 4, 1, 0, &req, slots, &info);
  assert_true(rc == 0 || rc == 1);
  assert_int_equal(kvt_request_wait(c, req, -1, n_ready), 0);
  assert_int_equal(kvt_release(c, req), 0);
  return info.n_restore;
}

static void test_token_mismatch_is_refused(void **state) {
  (void)state;
  tl_engine *e = open_engine(64, NULL);
  tl_conv cv = {0};
  round0(e, &cv, 1);
  assert_int_equal(tl_engine_offload(e, &cv), 0);
  kvt_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
  assert_int_equal(kvt_get_stats(tl_engine_cache(e), &st0), 0);
  uint32_t ready = 99;
  assert_int_equal(acquire_with_bad_block(e, &cv, 2, &ready), 2);
  assert_int_equal(ready, 2);
  assert_int_equal(kvt_drain(tl_engine_cache(e)), 0);
  assert_int_equal(tl_engine_offload(e, &cv), 0);
  assert_int_equal(acquire_with_bad_block(e, &cv, 0, &ready), 0);
  assert_int_equal(ready, 0);
  assert_int_equal(kvt_get_stats(tl_engine_cache(e), &st1), 0);
  assert_int_equal(st1.verify_mismatches - st0.verify_mismatches, 2);
  /* The good history still restores, exactly. */
  assert_int_equal(tl_engine_offload(e, &cv), 0);
  float lg[512];
  tl_turn t;
  round1(e, &cv, TL_POLICY_RESTORE, lg, &t);
  assert_int_equal(t.n_ready, 4);
  assert_same_as_reference(lg, &t);
  tl_conv_free(&cv);
  tl_engine_close(e);
}

/* The same refusal when the block comes from disk (checked once fetched). */
static void test_token_mismatch_from_disk_is_refused(void **state) {
  (void)state;
  const char *path = disk_file("tinyllm-mismatch.kvt");
  tl_engine *e = open_engine(4, path);
  tl_conv a = {0}, b = {0};
  round0(e, &a, 1);
  assert_int_equal(tl_engine_offload(e, &a), 0);
  round0(e, &b, 2);
  assert_int_equal(tl_engine_offload(e, &b), 0);
  assert_int_equal(kvt_drain(tl_engine_cache(e)), 0);
  uint32_t ready = 99;
  acquire_with_bad_block(e, &a, 0, &ready);
  assert_int_equal(ready, 0);
  tl_conv_free(&a);
  tl_conv_free(&b);
  tl_engine_close(e);
  unlink(path);
}

/* The "tinyllm" cost preset describes the default model. */
static void test_cost_preset_matches_default_model(void **state) {
  (void)state;
  tl_config c;
  assert_int_equal(tl_config_preset("default", &c), 0);
  kvt_model_desc p;
  assert_int_equal(kvt_model_preset("tinyllm", &p), 0);
  uint64_t kv = (uint64_t)c.n_layers * 2 * c.n_kv_heads * c.head_dim * sizeof(float);
  assert_int_equal(kvt_model_kv_bytes_per_token(&p), kv);
  double ours = tl_config_params(&c), theirs = kvt_model_params(&p);
  assert_true(ours > theirs * 0.999 && ours < theirs * 1.001);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restore_from_host_is_bit_exact),
      cmocka_unit_test(test_recompute_is_bit_exact),
      cmocka_unit_test(test_restore_from_disk_is_bit_exact),
      cmocka_unit_test(test_token_mismatch_is_refused),
      cmocka_unit_test(test_token_mismatch_from_disk_is_refused),
      cmocka_unit_test(test_cost_preset_matches_default_model),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
