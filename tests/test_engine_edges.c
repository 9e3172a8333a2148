/* Engine edge cases: request state machine, slot ownership, job lifecycle
 * and stats. Every fixture_close checks the tier-map invariants. */
#include <stdio.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kv_fixture.h"
#include "util/fault.h"

#define BT 16

static char disk_path[4200];

static kvt_config disk_config(uint32_t host, uint64_t disk) {
  kvt_config cfg = fixture_config(host);
  snprintf(disk_path, sizeof disk_path, "%s/engine-edges.kvt", kvt_test_tmpdir());
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

/* Pin counts are 16 bits. A block shared by more concurrent requests than
 * that (a system prompt, with max_requests above 65535) must not wrap its
 * count to 0: that would put a block in use on the LRU, where eviction
 * hands its slot to another request. The request past the limit
 * recomputes instead. 65534 holders are simulated by pinning directly. */
static void device_hit_pins_do_not_wrap(void **state) {
  fixture f;
  fixture_open(&f, 4, 0);
  kvt_key k[1];
  uint32_t t[BT];
  fixture_keys(&f, 3, 1, k, t);
  run_request(&f, k, t, 1, 3);
  kvt_cache *c = f.c;
  uint32_t e = kvt__index_find(&c->map, &k[0]);
  assert_int_not_equal(e, KVT__NONE);
  for (uint32_t i = 0; i < UINT16_MAX - 1; i++) kvt__index_pin(&c->map, e, KVT__T_DEV);
  kvt_req r1, r2, r3;
  uint32_t s1[1], s2[1], s3[3];
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(c, k, t, 1, 1, 0, 0, &r1, s1, &info), 0);
  assert_int_equal(info.n_device_hits, 1); /* the 65535th holder */
  assert_int_equal(kvt_acquire(c, k, t, 1, 1, 0, 0, &r2, s2, &info), 0);
  assert_int_equal(info.n_device_hits, 0); /* one more would wrap: recompute */
  assert_int_not_equal(s2[0], s1[0]);
  /* 2 slots are free: 3 would take the shared block's, which is pinned. */
  assert_int_equal(kvt_acquire(c, NULL, NULL, 0, 0, 3, 0, &r3, s3, NULL), KVT_ENOSPACE);
  assert_int_equal(fixture_lookup(&f, k, 1).n_device, 1);
  assert_int_equal(kvt_release(c, r2), 0);
  assert_int_equal(kvt_release(c, r1), 0);
  for (uint32_t i = 0; i < UINT16_MAX - 1; i++) kvt__index_unpin(&c->map, e, KVT__T_DEV);
  fixture_close(&f);
}

/* kvt_prefetch with a full host tier whose blocks have no copy below: the
 * spills it needs start and it says "ask again"; once they are over, one
 * job fetches the whole prefix (it took one block per call before, each
 * reported as a success). */
static void prefetch_makes_room_for_the_whole_prefix(void **state) {
  enum { NB = 8 };
  kvt_config cfg = disk_config(NB, 4 * NB);
  cfg.write_policy = KVT_WRITE_BACK;
  fixture f;
  fixture_open_cfg(&f, &cfg, 2 * NB);
  kvt_key k[2][NB];
  uint32_t t[2][NB * BT];
  for (uint32_t c = 0; c < 2; c++) { /* conv 0 ends on disk, conv 1 fills the host */
    fixture_keys(&f, c, NB, k[c], t[c]);
    run_request(&f, k[c], t[c], NB, c);
    fixture_offload(&f, k[c], NB);
    kvt_drain(f.c);
  }
  assert_int_equal(fixture_lookup(&f, k[0], NB).n_disk, NB);
  assert_int_equal(fixture_lookup(&f, k[1], NB).n_host, NB);
  int jobs = 0, calls = 0, rc;
  kvt_job j;
  while ((rc = kvt_prefetch(f.c, k[0], NB, &j)) != 0) {
    assert_true(++calls < 20);
    if (rc == KVT_EAGAIN) {
      assert_int_equal(kvt_drain(f.c), 0);
      continue;
    }
    assert_int_equal(rc, 1);
    jobs++;
    assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
    assert_int_equal(kvt_job_release(f.c, j), 0);
    assert_int_equal(fixture_lookup(&f, k[0], NB).n_host, NB); /* the whole prefix, in one job */
  }
  assert_int_equal(jobs, 1);
  assert_int_equal(run_request(&f, k[0], t[0], NB, 0), NB); /* exact, from the host */
  assert_int_equal(run_request(&f, k[1], t[1], NB, 1), NB); /* spilled, not lost */
  fixture_close(&f);
}

/* kvt_prefetch is a hint. With every job slot held (finished store jobs
 * the engine has not released yet) it cannot start a fetch: it must say
 * "ask again" and leave the host tier alone, not drop a host-only block
 * to make room for a fetch it then cannot start, and answer "nothing to do". */
static void prefetch_without_a_job_slot_drops_nothing(void **state) {
  kvt_config cfg = disk_config(4, 16);
  cfg.max_jobs = 2;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[4][2];
  uint32_t t[4][2 * BT];
  for (uint32_t c = 0; c < 2; c++) { /* conv 0 then 1 fill the host tier */
    fixture_keys(&f, c, 2, k[c], t[c]);
    run_request(&f, k[c], t[c], 2, c);
    fixture_offload(&f, k[c], 2);
  }
  kvt_job held[2];
  for (uint32_t c = 2; c < 4; c++) { /* each store spills one of conv 0's blocks */
    fixture_keys(&f, c, 1, k[c], t[c]);
    run_request(&f, k[c], t[c], 1, c);
    assert_int_equal(kvt_store(f.c, k[c], 1, 0, &held[c - 2]), 1);
    assert_int_equal(kvt_job_wait(f.c, held[c - 2], -1), 0);
  }
  kvt_drain(f.c);
  assert_int_equal(fixture_lookup(&f, k[0], 2).n_disk, 2);
  assert_int_equal(fixture_lookup(&f, k[1], 2).n_host, 2);
  kvt_stats before = fixture_stats(&f);
  assert_int_equal(before.resident_host, 4);
  kvt_job j;
  assert_int_equal(kvt_prefetch(f.c, k[0], 2, &j), KVT_EAGAIN);
  kvt_stats after = fixture_stats(&f);
  assert_int_equal(after.evictions_host, before.evictions_host);
  assert_int_equal(after.resident_host, 4);
  assert_int_equal(fixture_lookup(&f, k[1], 2).n_host, 2);
  /* Once a job slot is free the hint works. */
  assert_int_equal(kvt_job_release(f.c, held[0]), 0);
  assert_int_equal(kvt_job_release(f.c, held[1]), 0);
  int rc = kvt_prefetch(f.c, k[0], 2, &j);
  assert_true(rc == 1 || rc == KVT_EAGAIN);
  if (rc == 1) {
    assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
    assert_int_equal(kvt_job_release(f.c, j), 0);
  }
  fixture_close(&f);
  unlink(disk_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(store_with_repeated_keys_copies_each_block_once),
      cmocka_unit_test(write_through_spill_is_a_started_job),
      cmocka_unit_test(device_hit_pins_do_not_wrap),
      cmocka_unit_test(prefetch_without_a_job_slot_drops_nothing),
      cmocka_unit_test(prefetch_makes_room_for_the_whole_prefix),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
