/* End to end through the host backend: offload and restore byte-exact,
 * token verification, eviction cascade and its order, pins, faults. */
#include "kv_fixture.h"
#include "kvtier/backend.h"
#include "util/fault.h"

#define BT 16

static void multi_conversation_offload_restore_exact(void **state) {
  fixture f;
  fixture_open(&f, 40, 64);
  enum { CONVS = 6 };
  kvt_key keys[CONVS][6];
  uint32_t tok[CONVS][6 * BT];
  for (uint32_t c = 0; c < CONVS; c++) {
    fixture_keys(&f, c, 6, keys[c], tok[c]);
    assert_int_equal(run_request(&f, keys[c], tok[c], 4, c), 0);
  }
  for (uint32_t c = 0; c < CONVS; c++) fixture_offload(&f, keys[c], 4);
  for (uint32_t c = 0; c < CONVS; c++) {
    kvt_lookup_result r = fixture_lookup(&f, keys[c], 6);
    assert_int_equal(r.n_prefix, 4);
    assert_int_equal(r.n_host, 4);
    assert_int_equal(r.n_device, 0);
  }
  fixture_scribble(&f); /* the device copies are gone: only the host can answer */
  /* Round 2: each conversation grew by two blocks; its 4 blocks come back exact. */
  for (uint32_t c = 0; c < CONVS; c++) assert_int_equal(run_request(&f, keys[c], tok[c], 6, c), 4);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.blocks_d2h, CONVS * 4);
  assert_int_equal(st.blocks_h2d, CONVS * 4);
  assert_int_equal(st.bytes_h2d, (uint64_t)CONVS * 4 * kvt_block_bytes(f.c));
  assert_int_equal(st.hits_host, CONVS * 4);
  assert_int_equal(st.evictions_device, CONVS * 4);
  /* Round 3 hits the device copies made in round 2. */
  for (uint32_t c = 0; c < CONVS; c++) assert_int_equal(run_request(&f, keys[c], tok[c], 6, c), 6);
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.hits_device, CONVS * 6);
  fixture_close(&f);
}

static void token_mismatch_is_refused(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key keys[4];
  uint32_t tok[4 * BT], bad[4 * BT];
  fixture_keys(&f, 7, 4, keys, tok);
  run_request(&f, keys, tok, 4, 7);
  memcpy(bad, tok, sizeof tok);
  bad[2 * BT + 3] ^= 0x40; /* as if block 2's key collided with other tokens */
  kvt_req r;
  uint32_t slots[4];
  kvt_acquire_info info = {.size = sizeof info};
  /* On the device tier... */
  assert_true(kvt_acquire(f.c, keys, bad, 4, 4, 0, 0, &r, slots, &info) >= 0);
  assert_int_equal(info.n_restore, 2);
  assert_int_equal(kvt_release(f.c, r), 0);
  /* ... and on the host tier. */
  fixture_offload(&f, keys, 4);
  assert_true(kvt_acquire(f.c, keys, bad, 4, 4, 0, 0, &r, slots, &info) >= 0);
  assert_int_equal(info.n_restore, 2);
  uint32_t ready;
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, 2);
  assert_true(fixture_check(&f, slots[0], block_seed(7, 0)) && fixture_check(&f, slots[1], block_seed(7, 1)));
  assert_int_equal(kvt_release(f.c, r), 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.verify_mismatches, 2);
  /* The right tokens still restore everything. */
  assert_int_equal(run_request(&f, keys, tok, 4, 7), 4);
  fixture_close(&f);
}

static void eviction_cascades_tail_first(void **state) {
  fixture f;
  fixture_open(&f, 8, 6); /* device 8, host 6, no disk: host victims are dropped */
  kvt_key k[5][4];
  uint32_t t[5][4 * BT];
  for (uint32_t c = 0; c < 5; c++) fixture_keys(&f, c, 4, k[c], t[c]);
  run_request(&f, k[0], t[0], 4, 0);
  run_request(&f, k[1], t[1], 4, 1);
  run_request(&f, k[2], t[2], 4, 2); /* device full: A (oldest) demoted to host */
  kvt_lookup_result r = fixture_lookup(&f, k[0], 4);
  assert_int_equal(r.n_host, 4);
  assert_int_equal(fixture_lookup(&f, k[1], 4).n_device, 4);
  run_request(&f, k[3], t[3], 2, 3); /* needs 2 slots: B's tail goes, B's head stays */
  r = fixture_lookup(&f, k[1], 4);
  assert_int_equal(r.n_prefix, 4);
  assert_int_equal(r.n_device, 2);
  assert_int_equal(r.n_host, 2);
  uint8_t tiers[4];
  assert_int_equal(kvt_lookup(f.c, k[1], 4, &r, tiers), 0);
  assert_int_equal(tiers[0], KVT_TIER_DEVICE);
  assert_int_equal(tiers[1], KVT_TIER_DEVICE);
  assert_int_equal(tiers[2], KVT_TIER_HOST);
  assert_int_equal(tiers[3], KVT_TIER_HOST);
  /* Host now full (A0-3, B2-3). Two more device victims push the host's
   * oldest out, tail first: A3 and A2 are dropped, A0-1 stay. */
  run_request(&f, k[4], t[4], 2, 4);
  r = fixture_lookup(&f, k[0], 4);
  assert_int_equal(r.n_prefix, 2);
  assert_int_equal(r.n_host, 2);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.evictions_device, 8);
  assert_int_equal(st.evictions_host, 2);
  /* Every surviving block is still exact (run_request checks the bytes);
   * B comes back whole from the host, pushing out A's unpinned remainder. */
  assert_int_equal(run_request(&f, k[1], t[1], 4, 1), 4);
  assert_true(run_request(&f, k[0], t[0], 4, 0) <= 2);
  fixture_close(&f);
}

static void pinned_blocks_are_never_evicted(void **state) {
  fixture f;
  fixture_open(&f, 8, 0);
  kvt_key a[6], b[4];
  uint32_t ta[6 * BT], tb[4 * BT], slots[6];
  fixture_keys(&f, 1, 6, a, ta);
  fixture_keys(&f, 2, 4, b, tb);
  kvt_req ra, rb;
  assert_int_equal(kvt_acquire(f.c, a, ta, 6, 6, 0, 0, &ra, slots, NULL), 0);
  for (int i = 0; i < 6; i++) fixture_write(&f, slots[i], block_seed(1, (uint32_t)i));
  assert_int_equal(kvt_commit(f.c, ra, 6, NULL), 0);
  /* 2 free slots, 6 pinned: a 4-block request cannot be served. */
  assert_int_equal(kvt_acquire(f.c, b, tb, 4, 4, 0, 0, &rb, slots, NULL), KVT_ENOSPACE);
  assert_int_equal(kvt_acquire(f.c, b, tb, 4, 4, 0, KVT_ACQUIRE_NOWAIT, &rb, slots, NULL), KVT_ENOSPACE);
  assert_int_equal(fixture_lookup(&f, a, 6).n_device, 6);
  assert_int_equal(kvt_release(f.c, ra), 0);
  assert_int_equal(run_request(&f, b, tb, 4, 2), 0);
  /* a's tail made room; its head is still there and exact. */
  assert_int_equal(fixture_lookup(&f, a, 6).n_prefix, 4);
  assert_int_equal(run_request(&f, a, ta, 4, 1), 4);
  fixture_close(&f);
}

static void layerwise_load_progress(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[8];
  uint32_t t[8 * BT], slots[8], ready = 0;
  fixture_keys(&f, 3, 8, k, t);
  run_request(&f, k, t, 8, 3);
  fixture_offload(&f, k, 8);
  fixture_scribble(&f);
  kvt_req r;
  assert_int_equal(kvt_acquire(f.c, k, t, 8, 8, 0, 0, &r, slots, NULL), 1);
  for (uint32_t l = 0; l < FIX_LAYERS; l++) {
    assert_int_equal(kvt_request_wait_layer(f.c, r, l, NULL), 0);
    assert_int_equal(kvt_request_layer_ready(f.c, r, l), 0);
    /* layer l of every block has landed, whatever the later layers do */
    for (uint32_t i = 0; i < 8; i++)
      assert_true(kvt_test_check(f.pool[l][0] + (size_t)slots[i] * FIX_SEG_BYTES, FIX_SEG_BYTES,
                                 block_seed(3, i) * 131 + (uint64_t)(l * 2)));
  }
  assert_int_equal(kvt_request_layer_ready(f.c, r, FIX_LAYERS), -EINVAL);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, 8);
  assert_int_equal(kvt_release(f.c, r), 0);
  fixture_close(&f);
}

static int fail_h2d(void *ctx, int site, int64_t arg) {
  int *count = ctx;
  if (site == KVT_FAULT_DEV_COMPLETE && arg == KVT_XFER_H2D) {
    (*count)++;
    return -EIO;
  }
  return 0;
}

static void failed_load_means_recompute(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[4];
  uint32_t t[4 * BT], slots[4], ready = 99;
  fixture_keys(&f, 5, 4, k, t);
  run_request(&f, k, t, 4, 5);
  fixture_offload(&f, k, 4);
  int injected = 0;
  kvt__fault_set(fail_h2d, &injected);
  kvt_req r;
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 0, 0, &r, slots, NULL), 1);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(injected, 1);
  assert_int_equal(ready, 0); /* the engine recomputes all four */
  for (uint32_t i = 0; i < 4; i++) fixture_write(&f, slots[i], block_seed(5, i));
  assert_int_equal(kvt_commit(f.c, r, 4, NULL), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.copy_errors, 4);
  assert_int_equal(st.jobs_failed, 1);
  /* The host copies were untouched by the failed copy. */
  assert_int_equal(fixture_lookup(&f, k, 4).n_device, 4);
  fixture_offload(&f, k, 4);
  assert_int_equal(run_request(&f, k, t, 4, 5), 4);
  fixture_close(&f);
}

static int refuse_h2d_submit(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_DEV_SUBMIT && arg == KVT_XFER_H2D ? -EIO : 0;
}

/* A load the backend refuses: layer waits return, and the request recomputes. */
static void refused_load_does_not_hang_layer_waits(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[4];
  uint32_t t[4 * BT], slots[4], ready = 99;
  fixture_keys(&f, 6, 4, k, t);
  run_request(&f, k, t, 4, 6);
  fixture_offload(&f, k, 4);
  kvt__fault_set(refuse_h2d_submit, NULL);
  kvt_req r;
  assert_true(kvt_acquire(f.c, k, t, 4, 4, 0, 0, &r, slots, NULL) >= 0);
  for (uint32_t l = 0; l < FIX_LAYERS; l++) assert_int_equal(kvt_request_wait_layer(f.c, r, l, NULL), 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ready, 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(run_request(&f, k, t, 4, 6), 4); /* the host copies were never at risk */
  fixture_close(&f);
}

/* Blocks filled by decode become cacheable through kvt_request_extend. */
static void decode_blocks_extend_the_request(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[6];
  uint32_t t[6 * BT], slots[6];
  fixture_keys(&f, 12, 6, k, t); /* 4 blocks of prompt, 2 generated */
  kvt_req r;
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 2, 0, &r, slots, NULL), 0);
  for (uint32_t i = 0; i < 6; i++) fixture_write(&f, slots[i], block_seed(12, i));
  assert_int_equal(kvt_request_extend(f.c, r, k + 4, t + 4 * BT, 3), -EINVAL); /* only 2 extra */
  assert_int_equal(kvt_request_extend(f.c, r, k + 4, t + 4 * BT, 2), 0);
  assert_int_equal(kvt_commit(f.c, r, 6, NULL), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(fixture_lookup(&f, k, 6).n_device, 6);
  fixture_offload(&f, k, 6);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k, t, 6, 12), 6); /* all six come back exact */
  fixture_close(&f);
}

/* A full cascade frees room in batches: one round of spills, then one of
 * stores, per tier — not a round trip per block. Metadata only, so every
 * copy completes at once and the count is exact. */
static void full_cascade_runs_in_batches(void **state) {
  kvt_config cfg = fixture_config(4);
  cfg.disk_blocks = 64; /* a metadata-only disk tier: no file */
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = 8;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  uint64_t ids[3][8];
  kvt_key k[3][8];
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 8; i++) ids[r][i] = (uint64_t)(r * 100 + i);
    assert_int_equal(kvt_keys_from_opaque(c, ids[r], sizeof ids[r][0], 8, k[r]), 0);
  }
  kvt_req req;
  uint32_t slots[8];
  kvt_job job;
  assert_int_equal(kvt_acquire(c, k[0], NULL, 4, 4, 0, 0, &req, slots, NULL), 0);
  assert_int_equal(kvt_commit(c, req, 4, NULL), 0);
  assert_int_equal(kvt_release(c, req), 0);
  assert_int_equal(kvt_store(c, k[0], 4, KVT_STORE_EVICT, &job), 1); /* host full of A */
  assert_int_equal(kvt_job_wait(c, job, -1), 0);
  kvt_job_release(c, job);
  assert_int_equal(kvt_acquire(c, k[1], NULL, 8, 8, 0, 0, &req, slots, NULL), 0); /* device full of B */
  assert_int_equal(kvt_commit(c, req, 8, NULL), 0);
  assert_int_equal(kvt_release(c, req), 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(c, &st);
  uint64_t before = st.jobs_started;
  assert_int_equal(kvt_acquire(c, k[2], NULL, 8, 8, 0, 0, &req, slots, NULL), 0);
  assert_int_equal(kvt_release(c, req), 0);
  kvt_get_stats(c, &st);
  /* A spills (1 job), half of B is stored (1), B's half spills (1), the other half is stored (1). */
  assert_int_equal(st.jobs_started - before, 4);
  assert_int_equal(st.evictions_device, 8 + 4);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(c, k[1], 8, &lr, NULL), 0);
  assert_int_equal(lr.n_host + lr.n_disk, 8);
  assert_int_equal(kvt__check_invariants(c, NULL, 0), 0);
  kvt_close(c);
}

static int slow_d2h(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_DEV_DELAY_US && arg == KVT_XFER_D2H ? 50000 : 0;
}

/* A cancelled store discards its copies: no host copy, the device copy stays. */
static void cancelled_store_discards_its_copies(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 8, 4, k, t);
  run_request(&f, k, t, 4, 8);
  kvt__fault_set(slow_d2h, NULL);
  kvt_job j;
  assert_int_equal(kvt_store(f.c, k, 4, KVT_STORE_EVICT, &j), 1);
  assert_int_equal(kvt_job_cancel(f.c, j), 0);
  assert_int_equal(kvt_job_wait(f.c, j, -1), KVT_ECANCELED);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(kvt_job_cancel(f.c, j), 0); /* finished: nothing to undo */
  assert_int_equal(kvt_job_release(f.c, j), 0);
  assert_int_equal(kvt_job_cancel(f.c, j), KVT_ENOJOB);
  kvt_lookup_result r = fixture_lookup(&f, k, 4);
  assert_int_equal(r.n_device, 4);
  assert_int_equal(r.n_host, 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.jobs_cancelled, 1);
  assert_int_equal(st.copy_errors, 0);
  assert_int_equal(st.resident_host, 0);
  fixture_offload(&f, k, 4); /* a second store goes through */
  assert_int_equal(fixture_lookup(&f, k, 4).n_host, 4);
  assert_int_equal(run_request(&f, k, t, 4, 8), 4);
  fixture_close(&f);
}

static void write_through_copies_at_commit(void **state) {
  kvt_config cfg = fixture_config(16);
  cfg.write_policy = KVT_WRITE_THROUGH;
  fixture f;
  fixture_open_cfg(&f, &cfg, 16);
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(&f, 9, 3, k, t);
  run_request(&f, k, t, 3, 9);
  assert_int_equal(kvt_drain(f.c), 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.blocks_d2h, 3);
  assert_int_equal(st.resident_host, 3);
  assert_int_equal(fixture_lookup(&f, k, 3).n_device, 3);
  fixture_close(&f);
}

static void bad_arguments_get_codes(void **state) {
  kvt_config cfg = fixture_config(4);
  kvt_cache *c;
  assert_int_equal(kvt_open(NULL, &c), -EINVAL);
  cfg.size = 8;
  assert_int_equal(kvt_open(&cfg, &c), KVT_EVERSION);
  cfg = fixture_config(4);
  cfg.block_tokens = 24;
  assert_int_equal(kvt_open(&cfg, &c), -EINVAL);
  cfg = fixture_config(4);
  cfg.model_fingerprint = NULL;
  assert_int_equal(kvt_open(&cfg, &c), -EINVAL);
  cfg = fixture_config(4);
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_key k[2] = {{1, 2}, {3, 4}};
  kvt_req r;
  uint32_t slots[2];
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(c, k, 2, &lr, NULL), KVT_ELAYOUT);
  assert_int_equal(kvt_acquire(c, k, NULL, 2, 2, 0, 0, &r, slots, NULL), KVT_ELAYOUT);
  kvt_layout lay;
  kvt_layout_init(&lay);
  assert_int_equal(kvt_register_layout(c, &lay), -EINVAL); /* no layers */
  kvt_close(c);
  kvt_close(NULL);

  fixture f;
  fixture_open(&f, 8, 8);
  assert_int_equal(kvt_register_layout(f.c, &lay), KVT_ESTATE); /* once only */
  assert_int_equal(kvt_lookup(f.c, NULL, 2, &lr, NULL), -EINVAL);
  lr.size = 0;
  assert_int_equal(kvt_lookup(f.c, k, 2, &lr, NULL), KVT_EVERSION);
  assert_int_equal(kvt_acquire(f.c, k, NULL, 2, 3, 0, 0, &r, slots, NULL), -EINVAL); /* restore > n */
  assert_int_equal(kvt_acquire(f.c, k, NULL, 2, 2, 9, 0, &r, slots, NULL), -E2BIG);
  assert_int_equal(kvt_acquire(f.c, k, NULL, 2, 2, 0, 0, NULL, slots, NULL), -EINVAL);
  assert_int_equal(kvt_acquire(f.c, k, NULL, 2, 2, 0, 0, &r, slots, NULL), 0);
  assert_int_equal(kvt_commit(f.c, r, 3, NULL), -EINVAL);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(kvt_release(f.c, r), KVT_ENOJOB); /* double release */
  assert_int_equal(kvt_commit(f.c, r, 1, NULL), KVT_ENOJOB);
  assert_int_equal(kvt_release(f.c, 12345), KVT_ENOJOB);
  assert_int_equal(kvt_job_poll(f.c, 777), KVT_ENOJOB);
  assert_int_equal(kvt_job_release(f.c, 0), KVT_ENOJOB);
  kvt_job j;
  assert_int_equal(kvt_store(f.c, k, 2, 0x80, &j), -EINVAL);
  kvt_plan plan = {.size = sizeof plan};
  assert_int_equal(kvt_plan_request(f.c, k, 2, 32, &plan), KVT_ESTATE); /* no cost model yet */
  assert_int_equal(kvt_plan_request(f.c, k, 3, 32, &plan), -EINVAL);   /* more blocks than tokens */
  /* The next valid call still works. */
  kvt_key keys[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 1, 2, keys, t);
  assert_int_equal(run_request(&f, keys, t, 2, 1), 0);
  assert_int_equal(run_request(&f, keys, t, 2, 1), 2);
  fixture_close(&f);
}

/* Without a GPU (or without the toolkit) CUDA fails cleanly and AUTO
 * falls back to the host backend. */
static void no_device_fails_cleanly(void **state) {
  kvt_config cfg = fixture_config(4);
  cfg.device = KVT_DEVICE_CUDA;
  fixture f;
  memset(&f, 0, sizeof f);
  kvt_cache *c = NULL;
  int rc = kvt_open(&cfg, &c);
  if (rc == 0) {
    static unsigned char pool[FIX_SEG_BYTES * 4];
    kvt_segment seg[2] = {{pool, FIX_SEG_BYTES, FIX_SEG_BYTES}, {pool + FIX_SEG_BYTES * 2, FIX_SEG_BYTES, FIX_SEG_BYTES}};
    kvt_layout lay;
    kvt_layout_init(&lay);
    lay.num_layers = 1;
    lay.num_slots = 2;
    lay.segments = seg;
    rc = kvt_register_layout(c, &lay);
    kvt_close(c);
  }
  if (rc == 0) skip(); /* a GPU is present: test_cuda_backend covers it */
  assert_int_equal(rc, KVT_ENODEV);
  cfg.device = KVT_DEVICE_AUTO;
  fixture_open_cfg(&f, &cfg, 8);
  assert_string_equal(kvt_device_backend_name(f.c), "host");
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 4, 2, k, t);
  assert_int_equal(run_request(&f, k, t, 2, 4), 0);
  fixture_offload(&f, k, 2);
  assert_int_equal(run_request(&f, k, t, 2, 4), 2);
  fixture_close(&f);
}

/* A small cache with the default max_jobs (256) and max_job_blocks (8192)
 * does not pay for every job's op arrays up front (they were 258 x 8192
 * entries, over 100 MB for a 64-slot cache): a job slot's arrays come with
 * its first use, and slots are reused, so sequential work allocates one
 * or two. */
static void job_memory_follows_the_jobs_in_use(void **state) {
  (void)state;
  kvt_config cfg = fixture_config(64);
  kvt_config dflt;
  kvt_config_init(&dflt);
  cfg.max_jobs = dflt.max_jobs;
  cfg.max_job_blocks = dflt.max_job_blocks;
  fixture f;
  fixture_open_cfg(&f, &cfg, 64);
  const uint64_t one_job = (uint64_t)dflt.max_job_blocks * 56; /* at least: one op each */
  uint64_t m0 = fixture_stats(&f).metadata_bytes;
  assert_true(m0 < one_job);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 9, 4, k, t);
  assert_int_equal(run_request(&f, k, t, 4, 9), 0);
  for (int round = 0; round < 3; round++) {
    fixture_offload(&f, k, 4);                        /* a store job */
    assert_int_equal(run_request(&f, k, t, 4, 9), 4); /* a load job */
  }
  uint64_t m1 = fixture_stats(&f).metadata_bytes;
  assert_true(m1 > m0);                 /* the jobs used are counted */
  assert_true(m1 - m0 <= 4 * one_job); /* two job slots at most (68 bytes an entry) */
  fixture_close(&f);
}

static void every_code_has_a_name(void **state) {
  int codes[] = {
#define XX(name, value, text) name,
      KVT_ERROR_MAP(XX)
#undef XX
  };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *s = kvt_strerror(codes[i]);
    assert_non_null(s);
    assert_string_not_equal(s, "unknown kvtier error code");
    for (size_t j = 0; j < i; j++) assert_string_not_equal(s, kvt_strerror(codes[j]));
  }
  assert_string_equal(kvt_strerror(0), "success");
  assert_string_equal(kvt_strerror(1), "in progress");
  assert_string_equal(kvt_strerror(-ENOMEM), strerror(ENOMEM));
  assert_string_equal(kvt_version(), KVT_VERSION_STRING);
  assert_int_equal(kvt_version_number(), KVT_VERSION_NUMBER);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(multi_conversation_offload_restore_exact),
      cmocka_unit_test(token_mismatch_is_refused),
      cmocka_unit_test(eviction_cascades_tail_first),
      cmocka_unit_test(pinned_blocks_are_never_evicted),
      cmocka_unit_test(layerwise_load_progress),
      cmocka_unit_test(failed_load_means_recompute),
      cmocka_unit_test(refused_load_does_not_hang_layer_waits),
      cmocka_unit_test(cancelled_store_discards_its_copies),
      cmocka_unit_test(decode_blocks_extend_the_request),
      cmocka_unit_test(full_cascade_runs_in_batches),
      cmocka_unit_test(write_through_copies_at_commit),
      cmocka_unit_test(bad_arguments_get_codes),
      cmocka_unit_test(no_device_fails_cleanly),
      cmocka_unit_test(job_memory_follows_the_jobs_in_use),
      cmocka_unit_test(every_code_has_a_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
