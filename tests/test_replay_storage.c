/* kvtier-bench replay --mode storage (bench/replay_storage.c) against owner
 * mode (bench/replay_core.c) on the bundled Mooncake trace, same capacities:
 * the hit ratios are the same.
 *
 * Storage mode's engine keeps its own device pool with the LRU owner mode's
 * device tier follows (hit prefix pinned, touched last to first at the end),
 * puts its victims into kvtier as owner mode demotes them to the host, and
 * gets its restores with kvt_get_into, which touches the loaded blocks last
 * to first as kvt_release does. So with capacities where kvtier's own tiers
 * evict nothing, every request sees the same cached prefix, split the same
 * way between device and the tiers below, block for block.
 *
 * Where kvtier's tiers evict, the two may choose different victims, for
 * principled reasons this test does not paper over with a tolerance:
 *  - owner mode stages a disk hit through a host slot (the fetched block
 *    stays on the host too, taking room there); storage mode reads it
 *    straight into the engine's memory;
 *  - owner mode's kvt_release touches the host and disk copies of every
 *    block of the request, also those on the device; storage mode's engine
 *    tells kvtier only about the blocks it gets and puts.
 * kvtier-bench replay --mode both prints both modes' figures side by side
 * for any capacities. */
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replay_core.h"
#include "trace.h"

/* Enough requests for thousands of hits, few enough to run in seconds. */
#define N_REQS 1200u

static kvt_bench_replay_result run(const kvt_bench_trace *t, int storage, uint64_t dev, uint64_t host, uint64_t disk) {
  kvt_bench_replay_opts o;
  kvt_bench_replay_opts_init(&o);
  o.device_blocks = dev;
  o.host_blocks = host;
  o.disk_blocks = disk;
  o.restore = KVT_BENCH_RESTORE_ALL;
  o.payload_real = 1;
  o.payload_scale = 8192; /* 8 KiB blocks: quick, still real bytes */
  o.device_only_baseline = 0;
  o.storage_mode = storage;
  const char *tmp = getenv("KVT_TEST_TMPDIR");
  char path[512];
  snprintf(path, sizeof path, "%s/replay-storage-%d.kvt", tmp ? tmp : "/tmp", (int)getpid());
  o.disk_path = disk ? path : NULL; /* owner mode with no disk: NULL is fine */
  kvt_bench_replay_result r;
  char err[256] = "";
  if (kvt_bench_replay_run(t, &o, &r, err, sizeof err) != 0)
    fail_msg("replay (%s mode): %s", storage ? "storage" : "owner", err);
  if (disk) unlink(path);
  /* Every restored block came back byte-exact, in both modes. */
  assert_int_equal(r.payload_corrupt, 0);
  assert_int_equal(r.blocks_load_failed, 0);
  assert_int_equal(r.payload_verified, r.blocks_restored);
  return r;
}

static void load(kvt_bench_trace *t) {
  const char *path = kvt_test_trace("mooncake_synthetic_trace.jsonl");
  if (!path) kvt_test_skip("mooncake_synthetic_trace.jsonl not found (KVT_TRACES_DIR)");
  kvt_bench_trace_err err;
  assert_int_equal(kvt_bench_trace_load(path, 512, t, &err), 0);
  assert_true(t->n_reqs > N_REQS);
  t->n_reqs = N_REQS;
}

/* Blocks the first N_REQS requests key: a kvtier tier this large never evicts. */
static uint64_t distinct_upper_bound(const kvt_bench_trace *t) {
  uint64_t n = 0;
  for (size_t i = 0; i < t->n_reqs; i++) n += kvt_bench_replay_keyed(t, &t->reqs[i], 0);
  return n;
}

static void compare(const kvt_bench_trace *t, uint64_t dev, uint64_t host, uint64_t disk) {
  kvt_bench_replay_result o = run(t, 0, dev, host, disk), s = run(t, 1, dev, host, disk);
  print_message("  device %llu host %llu disk %llu: owner %llu/%llu (device %llu host %llu disk %llu), "
                "storage %llu/%llu (device %llu host %llu disk %llu)\n",
                (unsigned long long)dev, (unsigned long long)host, (unsigned long long)disk,
                (unsigned long long)o.blocks_hit, (unsigned long long)o.blocks_total,
                (unsigned long long)o.hits_device, (unsigned long long)o.hits_host, (unsigned long long)o.hits_disk,
                (unsigned long long)s.blocks_hit, (unsigned long long)s.blocks_total,
                (unsigned long long)s.hits_device, (unsigned long long)s.hits_host, (unsigned long long)s.hits_disk);
  assert_true(o.blocks_hit > 0);
  assert_int_equal(s.blocks_total, o.blocks_total);
  assert_int_equal(s.blocks_hit, o.blocks_hit);
  assert_int_equal(s.tokens_hit, o.tokens_hit);
  assert_int_equal(s.hits_device, o.hits_device);
  assert_int_equal(s.hits_host, o.hits_host);
  assert_int_equal(s.hits_disk, o.hits_disk);
}

/* The engine holds only the running request: every hit is kvtier's. */
static void test_same_hits_below_a_running_request(void **state) {
  (void)state;
  kvt_bench_trace t;
  load(&t);
  compare(&t, 0, distinct_upper_bound(&t), 0);
  kvt_bench_trace_free(&t);
}

/* A device pool that evicts: the engine's LRU and its victims put into
 * kvtier give owner mode's device and host hits, block for block. */
static void test_same_hits_with_an_evicting_device_pool(void **state) {
  (void)state;
  kvt_bench_trace t;
  load(&t);
  compare(&t, 256, distinct_upper_bound(&t), 0);
  compare(&t, 1024, distinct_upper_bound(&t), 0);
  kvt_bench_trace_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_hits_below_a_running_request),
      cmocka_unit_test(test_same_hits_with_an_evicting_device_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
