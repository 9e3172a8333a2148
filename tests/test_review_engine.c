/* Engine review: regression tests for bugs found by reading the engine
 * (state machine, slot ownership, job lifecycle, stats). Each test failed
 * before its fix; every fixture_close checks the tier-map invariants. */
#include <stdio.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kv_fixture.h"
#include "util/fault.h"

#define BT 16

static char disk_path[4200];

static kvt_config disk_config(uint32_t host, uint64_t disk) {
  kvt_config cfg = fixture_config(host);
  snprintf(disk_path, sizeof disk_path, "%s/review-engine.kvt", kvt_test_tmpdir());
  cfg.disk_path = disk_path;
  cfg.disk_blocks = disk;
  cfg.disk_backend = KVT_DISK_THREADS;
  cfg.disk_reset = 1;
  return cfg;
}

/* An engine offloads the finished requests of one batch in one call; they
 * share a system prompt, so its keys appear more than once. Each block must
 * be copied once, into one host slot: a second copy of the same entry would
 * overwrite the entry's host slot number and leak the first slot. */
static void store_with_repeated_keys_copies_each_block_once(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 1, 2, k, t);
  run_request(&f, k, t, 2, 1);
  kvt_key batch[4] = {k[0], k[1], k[0], k[1]};
  kvt_job j;
  assert_int_equal(kvt_store(f.c, batch, 4, KVT_STORE_EVICT, &j), 1);
  assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
  assert_int_equal(kvt_job_release(f.c, j), 0);
  kvt_drain(f.c);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.blocks_d2h, 2);
  assert_int_equal(st.resident_host, 2);
  assert_int_equal(st.resident_device, 0);
  assert_int_equal(fixture_lookup(&f, k, 2).n_host, 2);
  /* And the blocks come back byte-exact. */
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k, t, 2, 1), 2);
  fixture_close(&f); /* "slot leaked" before the fix */
}

/* With write-through, a store's completion starts the spill to disk: that
 * job is started like any other, so jobs_started counts it (and a failed
 * spill never makes jobs_failed exceed jobs_started). */
static void write_through_spill_is_a_started_job(void **state) {
  kvt_config cfg = disk_config(8, 16);
  cfg.write_policy = KVT_WRITE_THROUGH;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 2, 2, k, t);
  run_request(&f, k, t, 2, 2);
  kvt_drain(f.c);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.blocks_d2h, 2);
  assert_int_equal(st.blocks_h2disk, 2);
  assert_int_equal(st.jobs_started, 2); /* the store at commit, then its spill */
  assert_int_equal(st.jobs_failed, 0);
  fixture_close(&f);
  unlink(disk_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(store_with_repeated_keys_copies_each_block_once),
      cmocka_unit_test(write_through_spill_is_a_started_job),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
