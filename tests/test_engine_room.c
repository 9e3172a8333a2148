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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_acquire_disk_hits_with_full_host_and_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
