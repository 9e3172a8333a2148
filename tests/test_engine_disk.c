/* The three tiers through the engine, for both storage backends: cascade
 * order, byte-exact round trips via disk, prefetch, persistence across a
 * reopen, corrupt records as counted misses, injected I/O errors. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kv_fixture.h"
#include "kvtier/backend.h"
#include "util/fault.h"

#define BT 16

static int backend_under_test;
static char disk_path[4200];

static kvt_config disk_config(uint32_t host, uint64_t disk, int reset) {
  kvt_config cfg = fixture_config(host);
  snprintf(disk_path, sizeof disk_path, "%s/engine-%d.kvt", kvt_test_tmpdir(), backend_under_test);
  cfg.disk_path = disk_path;
  cfg.disk_blocks = disk;
  cfg.disk_backend = backend_under_test;
  cfg.disk_reset = reset;
  return cfg;
}

/* Opens the fixture on cfg; skips the test when io_uring is under test but
 * the kernel refused it (the cache fell back to threads). */
static void open_cfg_or_skip(fixture *f, const kvt_config *cfg, uint32_t slots) {
  fixture_open_cfg(f, cfg, slots);
  if (backend_under_test == KVT_DISK_URING && strcmp(kvt_disk_backend_name(f->c), "io_uring") != 0) {
    fixture_close(f);
    skip();
  }
}

static void open_disk_fixture(fixture *f, uint32_t slots, uint32_t host, uint64_t disk, int reset) {
  kvt_config cfg = disk_config(host, disk, reset);
  open_cfg_or_skip(f, &cfg, slots);
}

/* Three conversations through a host tier that holds one: A and B spill. */
static void fill_three(fixture *f, kvt_key k[3][4], uint32_t t[3][4 * BT]) {
  for (uint32_t c = 0; c < 3; c++) {
    fixture_keys(f, c, 4, k[c], t[c]);
    assert_int_equal(run_request(f, k[c], t[c], 4, c), 0);
    fixture_offload(f, k[c], 4);
  }
  kvt_drain(f->c);
}

static void cascade_and_round_trip_via_disk(void **state) {
  fixture f;
  open_disk_fixture(&f, 8, 4, 32, 1);
  kvt_key k[3][4];
  uint32_t t[3][4 * BT];
  fill_three(&f, k, t);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4); /* device -> host -> disk */
  assert_int_equal(fixture_lookup(&f, k[1], 4).n_disk, 4);
  assert_int_equal(fixture_lookup(&f, k[2], 4).n_host, 4);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.blocks_h2disk, 8);
  assert_int_equal(st.evictions_host, 8);
  fixture_scribble(&f);
  /* A comes back from disk through the host, byte-exact. */
  kvt_req r;
  uint32_t slots[4], ready;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, k[0], t[0], 4, 4, 0, 0, &r, slots, &info), 1);
  assert_int_equal(info.n_from_disk, 4);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, 4);
  for (uint32_t i = 0; i < 4; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
  kvt_release(f.c, r);
  st = fixture_stats(&f);
  assert_int_equal(st.blocks_disk2h, 4);
  assert_int_equal(st.hits_disk, 4);
  /* Prefetch moves B up to the host ahead of its turn. */
  kvt_job j;
  assert_int_equal(kvt_prefetch(f.c, k[1], 4, &j), 1);
  assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
  kvt_job_release(f.c, j);
  kvt_lookup_result lr = fixture_lookup(&f, k[1], 4);
  assert_int_equal(lr.n_host + lr.n_device, 4);
  assert_int_equal(run_request(&f, k[1], t[1], 4, 1), 4);
  fixture_close(&f);
}

/* A prefix on disk longer than the host tier restores what can be staged
 * and recomputes the rest, instead of failing. */
static void disk_prefix_longer_than_host_is_clipped(void **state) {
  fixture f;
  open_disk_fixture(&f, 16, 4, 32, 1);
  kvt_key k[2][8];
  uint32_t t[2][8 * BT];
  for (uint32_t c = 0; c < 2; c++) {
    fixture_keys(&f, 20 + c, 8, k[c], t[c]);
    run_request(&f, k[c], t[c], 8, 20 + c);
    fixture_offload(&f, k[c] + 4, 4); /* the host holds 4: offload in two halves, tail first */
    fixture_offload(&f, k[c], 4);
  }
  kvt_drain(f.c);
  assert_int_equal(fixture_lookup(&f, k[0], 8).n_disk, 8);
  kvt_req r;
  uint32_t slots[8], ready;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, k[0], t[0], 8, 8, 0, 0, &r, slots, &info), 1);
  assert_int_equal(info.n_restore, 4);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, 4);
  for (uint32_t i = 0; i < 4; i++) assert_true(fixture_check(&f, slots[i], block_seed(20, i)));
  kvt_release(f.c, r);
  fixture_close(&f);
}

/* A full cascade (device full of blocks with no host copy, host full of
 * blocks with no disk copy) moves everything down and back exactly; a
 * disk prefix the host cannot stage beside its own pinned blocks is
 * restored as far as it can be (test_engine.c counts the batches). */
static void full_cascade_and_back(void **state) {
  fixture f;
  open_disk_fixture(&f, 8, 4, 64, 1);
  kvt_key a[4], b[8], d[8];
  uint32_t ta[4 * BT], tb[8 * BT], td[8 * BT];
  fixture_keys(&f, 30, 4, a, ta);
  fixture_keys(&f, 31, 8, b, tb);
  fixture_keys(&f, 32, 8, d, td);
  run_request(&f, a, ta, 4, 30);
  fixture_offload(&f, a, 4);     /* host: A, no disk copy */
  run_request(&f, b, tb, 8, 31); /* device: B, no host copy */
  run_request(&f, d, td, 8, 32); /* needs the whole device: B -> host -> disk, A -> disk */
  kvt_drain(f.c);
  assert_int_equal(fixture_lookup(&f, a, 4).n_disk, 4);
  kvt_lookup_result lr = fixture_lookup(&f, b, 8);
  assert_int_equal(lr.n_prefix, 8);
  assert_int_equal(lr.n_host + lr.n_disk, 8);
  /* B's host blocks are pinned by its own restore, so its disk blocks are
   * staged only through a host slot that is not: the head that is on the
   * host comes back exact, and blocks after it too when a host slot can
   * be had to stage them (one the cascade left free, or one of B's own
   * past the head); run_request checks every block it gets, and the rest
   * is recomputed. Which of B's blocks stayed on the host
   * follows the order its copies finished in, so the head is measured,
   * not assumed. */
  uint32_t head = 0;
  while (head < 8 && fixture_lookup(&f, b, head + 1).n_host == head + 1) head++;
  assert_true(head >= 1);
  assert_true(run_request(&f, b, tb, 8, 31) >= head);
  assert_int_equal(run_request(&f, a, ta, 4, 30), 4); /* four from disk, exact */
  fixture_close(&f);
}

static void reopen_finds_completed_blocks(void **state) {
  fixture f;
  open_disk_fixture(&f, 8, 4, 32, 1);
  kvt_key k[3][4];
  uint32_t t[3][4 * BT];
  fill_three(&f, k, t);
  fixture_close(&f); /* clean close: A and B are on disk, C was only in RAM */
  open_disk_fixture(&f, 8, 4, 32, 0);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.disk_recovered, 8);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  assert_int_equal(fixture_lookup(&f, k[1], 4).n_disk, 4);
  assert_int_equal(fixture_lookup(&f, k[2], 4).n_prefix, 0);
  assert_int_equal(run_request(&f, k[1], t[1], 4, 1), 4); /* exact after restart */
  fixture_close(&f);
  /* Another model's cache must not see these blocks, nor touch them: it
   * starts clean in a file of its own. */
  kvt_config cfg = disk_config(4, 32, 0);
  cfg.model_fingerprint = "another-model";
  fixture g;
  fixture_open_cfg(&g, &cfg, 8);
  assert_int_equal(fixture_stats(&g).disk_recovered, 0);
  assert_int_equal(fixture_lookup(&g, k[1], 4).n_prefix, 0);
  fixture_close(&g);
  open_disk_fixture(&f, 8, 4, 32, 0);
  assert_int_equal(fixture_stats(&f).disk_recovered, 8);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 0), 4);
  fixture_close(&f);
}

static void corrupt_record_is_a_counted_miss(void **state) {
  fixture f;
  open_disk_fixture(&f, 8, 4, 32, 1);
  kvt_key k[3][4];
  uint32_t t[3][4 * BT];
  fill_three(&f, k, t);
  /* Flip one payload byte of A's block 2 on disk. */
  uint32_t e = kvt__index_find(&f.c->map, &k[0][2]);
  assert_int_not_equal(e, KVT__NONE);
  kvt__disk_info di;
  kvt__disk_get_info(f.c->disk, &di);
  off_t off = (off_t)(di.data_offset + (uint64_t)f.c->map.entries[e].slot[KVT__T_DISK] * di.slot_bytes +
                      kvt__record_prefix_bytes(BT) + 100);
  int fd = open(disk_path, O_RDWR);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= 0x10;
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
  fsync(fd);
  close(fd);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 0), 2); /* blocks 0-1 restored, 2-3 recomputed */
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.checksum_failures, 1);
  fixture_close(&f);
}

static int fail_first_writes(void *ctx, int site, int64_t arg) {
  int *left = ctx;
  if (site == KVT_FAULT_IO_SUBMIT && arg == KVT_IO_WRITE && *left > 0) {
    (*left)--;
    return -ENOSPC;
  }
  return 0;
}

static int fail_reads(void *ctx, int site, int64_t arg) {
  int *left = ctx;
  if (site == KVT_FAULT_IO_SUBMIT && arg == KVT_IO_READ && *left > 0) {
    (*left)--;
    return -EIO;
  }
  return 0;
}

static void io_errors_fail_only_their_blocks(void **state) {
  fixture f;
  open_disk_fixture(&f, 8, 4, 32, 1);
  kvt_key k[3][4];
  uint32_t t[3][4 * BT];
  int left = 2; /* a full disk for A's first two spills */
  kvt__fault_set(fail_first_writes, &left);
  fill_three(&f, k, t);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(left, 0);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.io_errors, 2);
  assert_int_equal(st.blocks_h2disk, 6);
  /* The two failed blocks are gone, everything else is intact and exact. */
  kvt_lookup_result lr = fixture_lookup(&f, k[0], 4);
  assert_true(lr.n_prefix < 4);
  assert_int_equal(fixture_lookup(&f, k[1], 4).n_disk, 4);
  assert_int_equal(run_request(&f, k[1], t[1], 4, 1), 4);
  assert_int_equal(run_request(&f, k[2], t[2], 4, 2), 4);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 0), lr.n_prefix);
  /* An EIO on a fetch: the engine recomputes, and the record stays good. */
  fixture_offload(&f, k[0], 4);
  fixture_offload(&f, k[1], 4);
  fixture_offload(&f, k[2], 4);
  kvt_drain(f.c);
  lr = fixture_lookup(&f, k[1], 4);
  assert_int_equal(lr.n_prefix, 4);
  uint32_t on_disk = lr.n_disk;
  left = 1;
  kvt__fault_set(fail_reads, &left);
  uint32_t ready = run_request(&f, k[1], t[1], 4, 1);
  kvt__fault_set(NULL, NULL);
  if (on_disk) assert_true(ready < 4);
  fixture_close(&f);
}

/* Write-through: every committed block goes down to disk at once, so a
 * restart finds it although it never left the device. */
static void write_through_reaches_disk(void **state) {
  kvt_config cfg = disk_config(8, 32, 1);
  cfg.write_policy = KVT_WRITE_THROUGH;
  fixture f;
  open_cfg_or_skip(&f, &cfg, 8);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 11, 4, k, t);
  assert_int_equal(run_request(&f, k, t, 4, 11), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.blocks_d2h, 4);
  assert_int_equal(st.blocks_h2disk, 4);
  assert_int_equal(st.resident_disk, 4);
  assert_int_equal(fixture_lookup(&f, k, 4).n_device, 4);
  fixture_close(&f);
  cfg.disk_reset = 0;
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(fixture_stats(&f).disk_recovered, 4);
  assert_int_equal(run_request(&f, k, t, 4, 11), 4);
  fixture_close(&f);
}

static int setup_threads(void **state) {
  backend_under_test = KVT_DISK_THREADS;
  return 0;
}

static int setup_uring(void **state) {
  backend_under_test = KVT_DISK_URING;
  return 0;
}

#define BOTH(fn) cmocka_unit_test_setup(fn, setup_threads), cmocka_unit_test_setup(fn, setup_uring)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOTH(cascade_and_round_trip_via_disk),
      BOTH(full_cascade_and_back),
      BOTH(reopen_finds_completed_blocks),
      BOTH(disk_prefix_longer_than_host_is_clipped),
      BOTH(corrupt_record_is_a_counted_miss),
      BOTH(io_errors_fail_only_their_blocks),
      BOTH(write_through_reaches_disk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
