/* Engine: making room for an acquire across tiers. kvt_acquire must not
 * return KVT_ENOSPACE while every block is unpinned: it makes room on the
 * host for the disk hits first, then on the device, and the device's
 * demotions must not take the host slots just freed for disk staging.
 * Metadata-only, one request at a time: nothing is in flight or pinned. */
#include "helpers.h"

#include <string.h>

#include "kvtier/kvtier.h"

static kvt_cache *open_cache(void) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "engine-room";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = 2;
  cfg.disk_blocks = 8;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = 2;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  return c;
}

/* Computes (or restores) a two-block chain and releases it. Returns acquire's rc. */
static int run(kvt_cache *c, uint64_t id0, size_t restore) {
  uint64_t ids[2] = {id0, id0 + 1};
  kvt_key keys[2];
  uint32_t slots[2];
  kvt_req req;
  assert_int_equal(kvt_keys_from_opaque(c, ids, sizeof ids[0], 2, keys), 0);
  int rc = kvt_acquire(c, keys, NULL, 2, restore, 0, 0, &req, slots, NULL);
  if (rc < 0) return rc;
  if (rc == 1) assert_int_equal(kvt_request_wait(c, req, -1, NULL), 0);
  assert_int_equal(kvt_commit(c, req, 2, NULL), 0);
  assert_int_equal(kvt_release(c, req), 0);
  return rc;
}

static void offload(kvt_cache *c, uint64_t id0) {
  uint64_t ids[2] = {id0, id0 + 1};
  kvt_key keys[2];
  kvt_job job;
  assert_int_equal(kvt_keys_from_opaque(c, ids, sizeof ids[0], 2, keys), 0);
  int rc = kvt_store(c, keys, 2, KVT_STORE_EVICT, &job);
  assert_true(rc >= 0);
  if (rc == 1) {
    assert_int_equal(kvt_job_wait(c, job, -1), 0);
    kvt_job_release(c, job);
  }
}

static void test_acquire_disk_hits_with_full_host_and_device(void **state) {
  (void)state;
  kvt_cache *c = open_cache();
  assert_true(run(c, 100, 0) >= 0); /* A on device */
  offload(c, 100);                  /* A on host */
  assert_true(run(c, 200, 0) >= 0); /* B on device */
  offload(c, 200);                  /* B on host, A spilled to disk */
  assert_true(run(c, 300, 0) >= 0); /* C on device: device and host full */
  uint64_t ids[2] = {100, 101};
  kvt_key keys[2];
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_keys_from_opaque(c, ids, sizeof ids[0], 2, keys), 0);
  assert_int_equal(kvt_lookup(c, keys, 2, &lr, NULL), 0);
  assert_int_equal(lr.n_disk, 2); /* the setup is as intended */
  /* Restoring A needs 2 host slots (staging) and 2 device slots; B can
   * spill to disk and C can be demoted to host, so this must not fail. */
  int rc = run(c, 100, 2);
  if (rc < 0) print_message("kvt_acquire: %s\n", kvt_strerror(rc));
  assert_true(rc >= 0);
  kvt_close(c);
}

/* A finished kvt_store handle the engine has not released yet holds no
 * job: evictions still demote device-only blocks to the host (where 6 of
 * 8 slots are free) instead of dropping them, and a restore of host hits
 * still gets its load. One job slot in all. */
static void finished_store_handle_blocks_no_internal_work(void **state) {
  (void)state;
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "engine-room-jobs";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = 8;
  cfg.max_jobs = 1;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = 4;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  uint64_t a_ids[2] = {100, 101}, b_ids[2] = {200, 201};
  kvt_key a[2], b[2];
  assert_int_equal(kvt_keys_from_opaque(c, a_ids, sizeof a_ids[0], 2, a), 0);
  assert_int_equal(kvt_keys_from_opaque(c, b_ids, sizeof b_ids[0], 2, b), 0);
  assert_true(run(c, 100, 0) >= 0); /* A on device */
  kvt_job held;
  assert_int_equal(kvt_store(c, a, 2, 0, &held), 1); /* A also on host; handle kept */
  assert_int_equal(kvt_job_wait(c, held, -1), 0);
  assert_true(run(c, 200, 0) >= 0); /* B on device only: the device is full */
  assert_true(run(c, 300, 0) >= 0); /* C needs two slots: A's copy is dropped, or B's demoted */
  assert_true(run(c, 400, 0) >= 0); /* D needs two more */
  assert_int_equal(kvt_drain(c), 0);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(c, b, 2, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 2); /* B was demoted, not dropped */
  assert_int_equal(lr.n_host, 2);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0);
  assert_int_equal(st.resident_host, 4);
  /* Restoring A from the host needs a load job: the handle does not hold it. */
  kvt_req req;
  uint32_t slots[2];
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(c, a, NULL, 2, 2, 0, 0, &req, slots, &info);
  if (rc < 0) print_message("kvt_acquire: %s\n", kvt_strerror(rc));
  assert_int_equal(rc, 1);
  uint32_t n_ready = 0;
  assert_int_equal(kvt_request_wait(c, req, -1, &n_ready), 0);
  assert_int_equal(n_ready, 2);
  assert_int_equal(info.n_loading, 2);
  assert_int_equal(kvt_release(c, req), 0);
  assert_int_equal(kvt_job_poll(c, held), 0); /* the handle still answers */
  assert_int_equal(kvt_job_release(c, held), 0);
  assert_int_equal(kvt_job_release(c, held), KVT_ENOJOB);
  kvt_close(c);
}

/* A request whose restore has finished holds no job: with two job slots,
 * six live requests that each restored from the host are all served (the
 * loads are over, only their blocks stay pinned), and a store still gets
 * its job while they are held. */
static void finished_restores_hold_no_job(void **state) {
  (void)state;
  enum { CONVS = 6 };
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "engine-room-loads";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = 16;
  cfg.max_jobs = 2;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = 2 * CONVS + 2;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  for (uint64_t v = 0; v < CONVS; v++) {
    assert_true(run(c, 100 * (v + 1), 0) >= 0);
    offload(c, 100 * (v + 1)); /* on the host only */
  }
  kvt_req reqs[CONVS];
  for (uint64_t v = 0; v < CONVS; v++) {
    uint64_t ids[2] = {100 * (v + 1), 100 * (v + 1) + 1};
    kvt_key keys[2];
    uint32_t slots[2];
    assert_int_equal(kvt_keys_from_opaque(c, ids, sizeof ids[0], 2, keys), 0);
    kvt_acquire_info info = {.size = sizeof info};
    int rc = kvt_acquire(c, keys, NULL, 2, 2, 0, 0, &reqs[v], slots, &info);
    if (rc < 0) fail_msg("request %u of %u live: kvt_acquire %s", (unsigned)v + 1, CONVS, kvt_strerror(rc));
    assert_int_equal(info.n_loading, 2);
    uint32_t ready = 0;
    assert_int_equal(kvt_request_wait(c, reqs[v], -1, &ready), 0);
    assert_int_equal(ready, 2);
  }
  /* A store of a fresh conversation gets a job beside them. */
  uint64_t ids[2] = {900, 901};
  kvt_key keys[2];
  uint32_t slots[2];
  kvt_req req;
  assert_int_equal(kvt_keys_from_opaque(c, ids, sizeof ids[0], 2, keys), 0);
  assert_int_equal(kvt_acquire(c, keys, NULL, 2, 0, 0, 0, &req, slots, NULL), 0);
  assert_int_equal(kvt_commit(c, req, 2, NULL), 0);
  kvt_job job;
  int rc = kvt_store(c, keys, 2, 0, &job);
  if (rc < 0) fail_msg("kvt_store beside %u live requests: %s", CONVS, kvt_strerror(rc));
  assert_int_equal(rc, 1);
  assert_int_equal(kvt_job_wait(c, job, -1), 0);
  assert_int_equal(kvt_job_release(c, job), 0);
  assert_int_equal(kvt_release(c, req), 0);
  for (uint64_t v = 0; v < CONVS; v++) assert_int_equal(kvt_release(c, reqs[v]), 0);
  kvt_close(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_acquire_disk_hits_with_full_host_and_device),
      cmocka_unit_test(finished_store_handle_blocks_no_internal_work),
      cmocka_unit_test(finished_restores_hold_no_job),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
