/* Injected faults at the backend wrappers (util/fault.h): device copy
 * submission and completion errors, slow copies, disk EIO / ENOSPC / short
 * transfers / EAGAIN at submission and completion, slow disk completions,
 * host pool allocation failure, host pool exhaustion, corrupt records. For
 * each: only the affected job fails, every other block stays readable and
 * byte-exact, stats count the error, and the answer is "recompute" (a
 * smaller n_ready), never wrong bytes. Tests named regression_* pin
 * library bugs this file found (all fixed). */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kv_fixture.h"
#include "kvtier/backend.h"
#include "store/record.h"
#include "util/fault.h"

#define BT 16

/* ---- the fault plan: one rule at a time, read from backend threads ---- */

/* Atomic fields: a backend thread may still be inside the hook when the
 * test disarms it. */
typedef struct rule {
  _Atomic int site;
  _Atomic int64_t arg; /* match this arg only; -1: any */
  _Atomic int value;   /* returned when the rule fires */
  _Atomic int skip;    /* matching calls let through first */
  _Atomic int count;   /* fires at most this often; -1: always */
} rule;

static rule plan;
static atomic_int seen, fired;
static atomic_int gate_closed; /* DELAY sites hold completions while set */
static atomic_int gate_waiting;
static long tried[KVT_FAULT_SITE_COUNT]; /* faults injected, per site, over the run */

static int hook(void *ctx, int site, int64_t arg) {
  if ((site == KVT_FAULT_DEV_DELAY_US || site == KVT_FAULT_IO_DELAY_US || site == KVT_FAULT_STORE_OP_DELAY_US) &&
      atomic_load(&gate_closed) &&
      (plan.site == site)) {
    atomic_fetch_add(&gate_waiting, 1);
    while (atomic_load(&gate_closed)) usleep(200);
    atomic_fetch_sub(&gate_waiting, 1);
    atomic_fetch_add(&fired, 1);
    return 0;
  }
  if (site != plan.site || (plan.arg >= 0 && arg != plan.arg)) return 0;
  int n = atomic_fetch_add(&seen, 1);
  if (n < plan.skip || (plan.count >= 0 && n >= plan.skip + plan.count)) return 0;
  atomic_fetch_add(&fired, 1);
  return plan.value;
}

static void arm(int site, int64_t arg, int value, int skip, int count) {
  kvt__fault_set(NULL, NULL);
  atomic_store(&plan.site, site);
  atomic_store(&plan.arg, arg);
  atomic_store(&plan.value, value);
  atomic_store(&plan.skip, skip);
  atomic_store(&plan.count, count);
  atomic_store(&seen, 0);
  atomic_store(&fired, 0);
  kvt__fault_set(hook, NULL);
}

/* Disarms and returns how many faults fired (added to the run's tally). */
static int disarm(void) {
  kvt__fault_set(NULL, NULL);
  int n = atomic_load(&fired), site = atomic_load(&plan.site);
  if (site > 0 && site < KVT_FAULT_SITE_COUNT) tried[site] += n;
  atomic_store(&plan.site, 0);
  return n;
}

static void close_gate(int site) {
  atomic_store(&gate_closed, 1);
  arm(site, -1, 0, 0, -1);
}

static void wait_gate_holds(void) {
  while (atomic_load(&gate_waiting) == 0) usleep(200);
}

static void open_gate(void) { atomic_store(&gate_closed, 0); }

/* ---- fixtures ---- */

static char disk_path[4200];
static int path_seq;

static kvt_config disk_config(uint32_t host, uint64_t disk, kvt_write_policy wp) {
  kvt_config cfg = fixture_config(host);
  cfg.write_policy = wp;
  snprintf(disk_path, sizeof disk_path, "%s/faults-%d.kvt", kvt_test_tmpdir(), path_seq++);
  cfg.disk_path = disk_path;
  cfg.disk_blocks = disk;
  cfg.disk_backend = KVT_DISK_THREADS; /* deterministic everywhere; io_uring is covered by test_engine_disk */
  cfg.disk_reset = 1;
  return cfg;
}

/* Write-back: blocks reach the disk only when the host evicts them (spill
 * tests). Write-through: every block is on disk at once, so host evictions
 * drop copies without I/O and the only disk I/O of a restore is its reads. */
static void open_disk(fixture *f, uint32_t slots, uint32_t host, uint64_t disk, kvt_write_policy wp) {
  kvt_config cfg = disk_config(host, disk, wp);
  fixture_open_cfg(f, &cfg, slots);
}

static void close_disk(fixture *f) {
  fixture_close(f);
  unlink(disk_path);
}

/* Offload; returns the store job's result (0 when there was nothing to copy). */
static int offload(fixture *f, const kvt_key *keys, uint32_t n) {
  kvt_job j;
  int rc = kvt_store(f->c, keys, n, KVT_STORE_EVICT, &j);
  assert_true(rc == 0 || rc == 1);
  if (rc == 0) return 0;
  rc = kvt_job_wait(f->c, j, -1);
  assert_int_equal(kvt_job_release(f->c, j), 0);
  return rc;
}

enum { NCONV = 3, NB = 4 };
typedef struct world {
  kvt_key k[NCONV][NB];
  uint32_t t[NCONV][NB * BT];
} world;

/* A prefetch of conversation 0 whose reads are held at the gate. */
static kvt_job gated_prefetch(fixture *f, const world *w) {
  close_gate(KVT_FAULT_IO_DELAY_US);
  kvt_job j = 0;
  assert_int_equal(kvt_prefetch(f->c, w->k[0], NB, &j), 1);
  wait_gate_holds();
  return j;
}

/* Device 8, host 4, disk 32: conversations 0 and 1 end on disk, 2 on the
 * host. No block is valid on the device afterwards, so the device pool is
 * scribbled: only a restore can make a block's bytes right again. */
static void fill(fixture *f, world *w) {
  for (uint32_t c = 0; c < NCONV; c++) {
    fixture_keys(f, c, NB, w->k[c], w->t[c]);
    assert_int_equal(run_request(f, w->k[c], w->t[c], NB, c), 0);
    assert_int_equal(kvt_drain(f->c), 0); /* write-through copies land first */
    offload(f, w->k[c], NB);
    assert_int_equal(kvt_drain(f->c), 0);
  }
  for (uint32_t c = 0; c < NCONV; c++) assert_int_equal(fixture_lookup(f, w->k[c], NB).n_device, 0);
  fixture_scribble(f);
}

/* Restores conversation c: ready blocks are byte-exact (checked), the rest
 * is recomputed and committed. Returns n_ready. */
static uint32_t restore(fixture *f, world *w, uint32_t c) {
  return run_request(f, w->k[c], w->t[c], NB, c);
}

/* Every conversation is readable and exact (all blocks restore, or the
 * ones lost are recomputed) and a second pass hits everything. */
static void all_readable(fixture *f, world *w) {
  for (uint32_t c = 0; c < NCONV; c++) {
    restore(f, w, c);
    assert_int_equal(run_request(f, w->k[c], w->t[c], NB, c), NB);
  }
}

/* ---- device copy faults ---- */

static void store_copy_failure_keeps_device_copies(void **state) {
  int sites[2] = {KVT_FAULT_DEV_COMPLETE, KVT_FAULT_DEV_SUBMIT};
  for (int i = 0; i < 2; i++) {
    fixture f;
    fixture_open(&f, 16, 16);
    world w;
    for (uint32_t c = 0; c < NCONV; c++) {
      fixture_keys(&f, c, NB, w.k[c], w.t[c]);
      run_request(&f, w.k[c], w.t[c], NB, c);
    }
    assert_int_equal(offload(&f, w.k[2], NB), 0); /* a good store first */
    arm(sites[i], KVT_XFER_D2H, -EIO, 0, 1);
    assert_int_equal(offload(&f, w.k[0], NB), -EIO);
    assert_int_equal(disarm(), 1);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.copy_errors, NB);
    assert_int_equal(st.jobs_failed, 1);
    assert_int_equal(st.blocks_d2h, NB);
    /* The failed store lost nothing: still on the device, exact. */
    kvt_lookup_result lr = fixture_lookup(&f, w.k[0], NB);
    assert_int_equal(lr.n_device, NB);
    assert_int_equal(st.resident_host, NB); /* only conversation 2's copies */
    assert_int_equal(run_request(&f, w.k[0], w.t[0], NB, 0), NB);
    /* The store is retried and works; all three restore exact from the host. */
    assert_int_equal(offload(&f, w.k[0], NB), 0);
    assert_int_equal(offload(&f, w.k[1], NB), 0);
    assert_int_equal(fixture_lookup(&f, w.k[0], NB).n_host, NB);
    all_readable(&f, &w);
    fixture_close(&f);
  }
}

static void load_copy_failure_means_recompute(void **state) {
  int sites[2] = {KVT_FAULT_DEV_COMPLETE, KVT_FAULT_DEV_SUBMIT};
  for (int i = 0; i < 2; i++) {
    fixture f;
    fixture_open(&f, 16, 16);
    world w;
    for (uint32_t c = 0; c < NCONV; c++) {
      fixture_keys(&f, c, NB, w.k[c], w.t[c]);
      run_request(&f, w.k[c], w.t[c], NB, c);
      offload(&f, w.k[c], NB);
    }
    fixture_scribble(&f);
    arm(sites[i], KVT_XFER_H2D, -EIO, 0, 1);
    assert_int_equal(restore(&f, &w, 1), 0); /* all four recomputed */
    assert_int_equal(disarm(), 1);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.copy_errors, NB);
    assert_int_equal(st.jobs_failed, 1);
    assert_int_equal(st.hits_host, 0); /* a failed load is counted a miss, not a hit */
    assert_int_equal(st.misses, NCONV * NB + NB); /* the first computes, and these four */
    /* The other conversations, and 1's host copies, are untouched. */
    assert_int_equal(restore(&f, &w, 0), NB);
    assert_int_equal(restore(&f, &w, 2), NB);
    offload(&f, w.k[1], NB);
    assert_int_equal(restore(&f, &w, 1), NB);
    fixture_close(&f);
  }
}

/* A device demotion (eviction device -> host) that fails: the acquire that
 * needed the room still gets it or fails cleanly, and no block is lost. */
static void demotion_copy_failure_loses_no_block(void **state) {
  fixture f;
  fixture_open(&f, 8, 16);
  world w;
  fixture_keys(&f, 0, NB, w.k[0], w.t[0]);
  fixture_keys(&f, 1, NB, w.k[1], w.t[1]);
  fixture_keys(&f, 2, NB, w.k[2], w.t[2]);
  run_request(&f, w.k[0], w.t[0], NB, 0);
  run_request(&f, w.k[1], w.t[1], NB, 1); /* device full */
  arm(KVT_FAULT_DEV_COMPLETE, KVT_XFER_D2H, -EIO, 0, 1);
  /* Conversation 2 needs 4 slots: 0's blocks are demoted; the first copy fails. */
  assert_int_equal(run_request(&f, w.k[2], w.t[2], NB, 2), 0);
  assert_int_equal(disarm(), 1);
  assert_int_equal(kvt_drain(f.c), 0);
  kvt_stats st = fixture_stats(&f);
  assert_true(st.copy_errors >= 1);
  assert_true(st.jobs_failed >= 1);
  all_readable(&f, &w);
  fixture_close(&f);
}

/* Bug: a device demotion copy that keeps failing (a broken device backend)
 * turns kvt__make_room into a busy loop: each pass queues a new demotion,
 * it fails at once, freeing[] drops back, and the loop queues another.
 * The acquire never returns. Expected: drop the victims or KVT_ENOSPACE. */
static void regression_persistent_demotion_failure_hangs_acquire(void **state) {
  fixture f;
  fixture_open(&f, 8, 16);
  world w;
  for (uint32_t c = 0; c < NCONV; c++) fixture_keys(&f, c, NB, w.k[c], w.t[c]);
  run_request(&f, w.k[0], w.t[0], NB, 0);
  run_request(&f, w.k[1], w.t[1], NB, 1);
  arm(KVT_FAULT_DEV_SUBMIT, KVT_XFER_D2H, -EIO, 0, -1);
  alarm(10); /* SIGALRM ends the process: the test fails instead of hanging CI */
  kvt_req r;
  uint32_t slots[NB];
  int rc = kvt_acquire(f.c, w.k[2], w.t[2], NB, NB, 0, 0, &r, slots, NULL);
  alarm(0);
  disarm();
  assert_true(rc == 0 || rc == KVT_ENOSPACE);
  if (rc == 0) kvt_release(f.c, r);
  fixture_close(&f);
}

/* Slow copies: the metadata lock is not held across a copy, so lookups,
 * stats and other requests proceed while it is held back. */
static void slow_copies_do_not_block_other_calls(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  world w;
  for (uint32_t c = 0; c < NCONV; c++) {
    fixture_keys(&f, c, NB, w.k[c], w.t[c]);
    run_request(&f, w.k[c], w.t[c], NB, c);
  }
  offload(&f, w.k[0], NB);
  close_gate(KVT_FAULT_DEV_DELAY_US);
  kvt_job j;
  assert_int_equal(kvt_store(f.c, w.k[1], NB, KVT_STORE_EVICT, &j), 1);
  wait_gate_holds();
  /* While the store is held: lookups, stats, a device-hit request, a load. */
  assert_int_equal(kvt_job_poll(f.c, j), 1);
  kvt_lookup_result lr = fixture_lookup(&f, w.k[1], NB);
  assert_int_equal(lr.n_device, NB); /* still on the device until the copy lands */
  assert_int_equal(run_request(&f, w.k[2], w.t[2], NB, 2), NB);
  kvt_req r;
  uint32_t slots[NB], ready = 9;
  assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, 0, &r, slots, NULL), 1);
  assert_int_equal(kvt_request_poll(f.c, r, &ready), 1); /* queued behind the held copy */
  assert_int_equal(kvt_request_wait(f.c, r, 1000000, &ready), KVT_ETIMEDOUT);
  assert_int_equal(kvt_commit(f.c, r, NB, NULL), KVT_EBUSY);
  assert_int_equal(kvt_job_poll(f.c, j), 1);
  open_gate();
  assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_true(disarm() >= 1);
  assert_int_equal(ready, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
  assert_int_equal(kvt_commit(f.c, r, NB, NULL), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(kvt_job_release(f.c, j), 0);
  assert_int_equal(fixture_lookup(&f, w.k[1], NB).n_host, NB);
  all_readable(&f, &w);
  fixture_close(&f);
}

/* There is no cancel call (KVT_ECANCELED exists, no function returns it):
 * the nearest is releasing a job mid-way, which detaches it. The blocks it
 * carries still land whole; nothing leaks (ASan). */
static void job_released_midway_completes_whole(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  world w;
  fixture_keys(&f, 0, NB, w.k[0], w.t[0]);
  run_request(&f, w.k[0], w.t[0], NB, 0);
  close_gate(KVT_FAULT_DEV_DELAY_US);
  kvt_job j;
  assert_int_equal(kvt_store(f.c, w.k[0], NB, KVT_STORE_EVICT, &j), 1);
  wait_gate_holds();
  assert_int_equal(kvt_job_release(f.c, j), 0);
  assert_int_equal(kvt_job_poll(f.c, j), KVT_ENOJOB);
  open_gate();
  assert_int_equal(kvt_drain(f.c), 0);
  disarm();
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.blocks_d2h, NB);
  assert_int_equal(st.jobs_failed, 0);
  assert_int_equal(fixture_lookup(&f, w.k[0], NB).n_host, NB);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, w.k[0], w.t[0], NB, 0), NB);
  fixture_close(&f);
}

/* ---- host pool ---- */

static void host_alloc_failure_at_register(void **state) {
  kvt_config cfg = fixture_config(8);
  fixture f = {.slots = 8, .bt = BT};
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++) {
      f.pool[l][s] = calloc(8, FIX_SEG_BYTES);
      f.seg[l * 2 + s] = (kvt_segment){f.pool[l][s], FIX_SEG_BYTES, FIX_SEG_BYTES};
    }
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.num_slots = 8;
  lay.segments = f.seg;
  int codes[2] = {-ENOMEM, -EAGAIN};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(kvt_open(&cfg, &f.c), 0);
    arm(KVT_FAULT_HOST_ALLOC, -1, codes[i], 0, 1);
    assert_int_equal(kvt_register_layout(f.c, &lay), codes[i]);
    assert_int_equal(disarm(), 1);
    /* Not registered: block calls say so, and close frees what was set up. */
    kvt_lookup_result lr = {.size = sizeof lr};
    kvt_key k = {1, 2};
    assert_int_equal(kvt_lookup(f.c, &k, 1, &lr, NULL), KVT_ELAYOUT);
    kvt_close(f.c);
  }
  /* A fresh cache with the same layout works. */
  assert_int_equal(kvt_open(&cfg, &f.c), 0);
  assert_int_equal(kvt_register_layout(f.c, &lay), 0);
  kvt_key k[NB];
  uint32_t t[NB * BT];
  fixture_keys(&f, 3, NB, k, t);
  run_request(&f, k, t, NB, 3);
  assert_int_equal(offload(&f, k, NB), 0);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k, t, NB, 3), NB);
  fixture_close(&f);
}

/* Bug: a kvt_register_layout that failed part-way (here: host pool
 * allocation) cannot be retried on the same cache: the retry allocates the
 * segments, tier map, slot stacks and jobs again over the first attempt's
 * (leaked) and adds the block bytes a second time. Expected: the retry
 * works (or KVT_ESTATE), and nothing leaks. */
static void regression_register_retry_after_failure(void **state) {
  fixture f;
  kvt_config cfg = fixture_config(8);
  memset(&f, 0, sizeof f);
  f.slots = 8;
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++) {
      f.pool[l][s] = calloc(8, FIX_SEG_BYTES);
      f.seg[l * 2 + s] = (kvt_segment){f.pool[l][s], FIX_SEG_BYTES, FIX_SEG_BYTES};
    }
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.num_slots = 8;
  lay.segments = f.seg;
  assert_int_equal(kvt_open(&cfg, &f.c), 0);
  arm(KVT_FAULT_HOST_ALLOC, -1, -ENOMEM, 0, 1);
  assert_int_equal(kvt_register_layout(f.c, &lay), -ENOMEM);
  disarm();
  int rc = kvt_register_layout(f.c, &lay);
  assert_true(rc == 0 || rc == KVT_ESTATE);
  if (rc == 0) assert_int_equal(kvt_block_bytes(f.c), FIX_LAYERS * 2 * FIX_SEG_BYTES);
  fixture_close(&f);
}

/* Host tier smaller than what is stored: what fits is copied (and evicted
 * from the device), the rest stays on the device; nothing is lost. */
static void host_pool_exhaustion(void **state) {
  fixture f;
  fixture_open(&f, 16, 4);
  kvt_key k[6];
  uint32_t t[6 * BT];
  fixture_keys(&f, 4, 6, k, t);
  run_request(&f, k, t, 6, 4);
  assert_int_equal(offload(&f, k, 6), 0);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.resident_host, 4);
  assert_int_equal(st.blocks_d2h, 4);
  uint8_t tiers[6];
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(f.c, k, 6, &lr, tiers), 0);
  assert_int_equal(lr.n_prefix, 6);
  assert_int_equal(lr.n_host + lr.n_device, 6);
  assert_int_equal(lr.n_host, 4);
  fixture_scribble(&f);
  /* Scribbling hit the device copies too: only the host copies are
   * restorable, so restore the prefix the host holds. */
  kvt_req r;
  uint32_t slots[6], ready;
  uint32_t n_host_prefix = 0;
  while (n_host_prefix < 6 && tiers[n_host_prefix] == KVT_TIER_HOST) n_host_prefix++;
  assert_int_equal(kvt_acquire(f.c, k, t, 6, n_host_prefix, 0, 0, &r, slots, NULL), n_host_prefix ? 1 : 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, n_host_prefix);
  for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(&f, slots[i], block_seed(4, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  /* A second conversation pushes the first out of the full host tier
   * (no disk: dropped), and it restores exact. */
  kvt_key k2[4];
  uint32_t t2[4 * BT];
  fixture_keys(&f, 5, 4, k2, t2);
  run_request(&f, k2, t2, 4, 5);
  assert_int_equal(offload(&f, k2, 4), 0);
  st = fixture_stats(&f);
  assert_int_equal(st.resident_host, 4);
  assert_true(st.evictions_host >= 4);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k2, t2, 4, 5), 4);
  fixture_close(&f);
}

/* A request whose disk blocks need more host staging slots than the host
 * tier has: it restores what it can stage (or recomputes), never waits forever. */
static void disk_restore_larger_than_host_tier(void **state) {
  fixture f;
  open_disk(&f, 16, 2, 32, KVT_WRITE_BACK);
  kvt_key k[6];
  uint32_t t[6 * BT];
  fixture_keys(&f, 6, 6, k, t);
  run_request(&f, k, t, 6, 6);
  /* Each store copies what the 2-slot host tier takes; the previous
   * pair spills to disk. */
  for (int round = 0; round < 6 && fixture_lookup(&f, k, 6).n_device > 0; round++) offload(&f, k, 6);
  kvt_key k2[4];
  uint32_t t2[4 * BT];
  fixture_keys(&f, 7, 4, k2, t2);
  run_request(&f, k2, t2, 4, 7);
  for (int round = 0; round < 6 && fixture_lookup(&f, k2, 4).n_device > 0; round++) offload(&f, k2, 4);
  kvt_drain(f.c);
  kvt_lookup_result lr = fixture_lookup(&f, k, 6);
  assert_int_equal(lr.n_prefix, 6);
  assert_true(lr.n_disk >= 4);
  fixture_scribble(&f);
  kvt_req r;
  uint32_t slots[6], ready = 0;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(f.c, k, t, 6, 6, 0, 0, &r, slots, &info);
  assert_true(rc == 0 || rc == 1 || rc == KVT_ENOSPACE);
  if (rc >= 0) {
    assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
    for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(&f, slots[i], block_seed(6, i)));
    assert_int_equal(kvt_release(f.c, r), 0);
  }
  /* Restoring no more than the host tier holds always works. */
  rc = kvt_acquire(f.c, k, t, 6, 2, 0, 0, &r, slots, &info);
  assert_int_equal(rc, info.n_loading ? 1 : 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, 2);
  for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(&f, slots[i], block_seed(6, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  close_disk(&f);
}

/* ---- disk faults ---- */

/* Spill writes that fail: the blocks they carried are dropped (a cache
 * may lose a copy), counted as I/O errors; nothing else is lost. */
static void spill_write_failures(void **state) {
  struct {
    int site, value;
  } cases[] = {
      {KVT_FAULT_IO_COMPLETE, -EIO},
      {KVT_FAULT_IO_COMPLETE, -ENOSPC},
      {KVT_FAULT_IO_COMPLETE, 4096}, /* short write: half a record */
      {KVT_FAULT_IO_COMPLETE, 0},    /* (almost) nothing written: 1 byte */
      {KVT_FAULT_IO_SUBMIT, -EIO},
      {KVT_FAULT_IO_SUBMIT, -ENOSPC},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_BACK);
    world w;
    /* Fail the 2nd and 3rd disk writes (conversation 0's spill). */
    /* A 0 from the hook means "no fault": a zero-byte write is reported as one byte. */
    arm(cases[i].site, cases[i].site == KVT_FAULT_IO_SUBMIT ? KVT_IO_WRITE : -1, cases[i].value ? cases[i].value : 1, 1, 2);
    fill(&f, &w);
    int n = disarm();
    assert_int_equal(n, 2);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.io_errors, 2);
    assert_true(st.jobs_failed >= 1);
    assert_int_equal(st.blocks_h2disk, 2 * NB - 2);
    assert_int_equal(st.resident_disk, 2 * NB - 2);
    assert_int_equal(st.checksum_failures, 0);
    /* Conversation 0 lost two blocks' only copies: it restores a shorter
     * prefix (exact) and recomputes the rest; 1 and 2 restore whole. */
    assert_true(fixture_lookup(&f, w.k[0], NB).n_prefix < NB);
    assert_true(restore(&f, &w, 0) < NB);
    assert_int_equal(restore(&f, &w, 1), NB);
    assert_int_equal(restore(&f, &w, 2), NB);
    all_readable(&f, &w);
    close_disk(&f);
  }
}

/* Fetch reads that fail: the request restores the blocks before the first
 * failure and recomputes the rest; an I/O error keeps the disk copy (a
 * retry may work), a checksum failure drops it. */
static void fetch_read_failures(void **state) {
  struct {
    int site, value, keeps_copy;
  } cases[] = {
      {KVT_FAULT_IO_COMPLETE, -EIO, 1},
      {KVT_FAULT_IO_COMPLETE, 4096, 1}, /* short read */
      {KVT_FAULT_IO_COMPLETE, -ENOSPC, 1},
      {KVT_FAULT_IO_SUBMIT, -EIO, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (int skip = 0; skip < NB; skip++) {
      fixture f;
      open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
      world w;
      fill(&f, &w);
      kvt_stats before = fixture_stats(&f);
      arm(cases[i].site, cases[i].site == KVT_FAULT_IO_SUBMIT ? KVT_IO_READ : -1, cases[i].value, skip, 1);
      uint32_t ready = restore(&f, &w, 0);
      assert_int_equal(disarm(), 1);
      if (ready >= NB) fail_msg("case %zu skip %d: ready %u", i, skip, ready);
      kvt_stats st = fixture_stats(&f);
      assert_int_equal(st.io_errors - before.io_errors, 1);
      assert_true(ready < NB);
      /* Completion order is the backend's: the failed block is one of the
       * four, so at most `skip` of them were read before it. */
      assert_true(ready <= (uint32_t)NB - 1);
      assert_int_equal(st.checksum_failures, 0);
      /* Others are untouched. */
      assert_int_equal(restore(&f, &w, 1), NB);
      assert_int_equal(restore(&f, &w, 2), NB);
      all_readable(&f, &w);
      close_disk(&f);
    }
  }
}

/* EAGAIN / EINTR completions are resubmitted: no error, exact bytes. */
static void transient_errors_are_retried(void **state) {
  int values[2] = {-EAGAIN, -EINTR};
  for (int i = 0; i < 2; i++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_BACK);
    world w;
    arm(KVT_FAULT_IO_COMPLETE, -1, values[i], 0, 3); /* three spill writes retried */
    fill(&f, &w);
    assert_int_equal(disarm(), 3);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.io_errors, 0);
    assert_int_equal(st.blocks_h2disk, 2 * NB);
    arm(KVT_FAULT_IO_COMPLETE, -1, values[i], 0, 2); /* and two fetch reads */
    assert_int_equal(restore(&f, &w, 0), NB);
    assert_int_equal(disarm(), 2);
    assert_int_equal(fixture_stats(&f).io_errors, 0);
    all_readable(&f, &w);
    close_disk(&f);
  }
}

/* A read completes with EAGAIN and its resubmission is refused: the read
 * fails once (one I/O error, that block recomputed), its op and slot go
 * back once, and the store keeps serving and closes. */
static atomic_int retry_stage;

static int refused_retry_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  if (site == KVT_FAULT_IO_COMPLETE && arg > 0) {
    int idle = 0;
    if (atomic_compare_exchange_strong(&retry_stage, &idle, 1)) return -EAGAIN;
  }
  if (site == KVT_FAULT_IO_SUBMIT && arg == KVT_IO_READ) {
    int retrying = 1;
    if (atomic_compare_exchange_strong(&retry_stage, &retrying, 2)) return -EIO;
  }
  return 0;
}

static void regression_refused_retry_finishes_once(void **state) {
  (void)state;
  for (int round = 0; round < 3; round++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
    world w;
    fill(&f, &w);
    kvt_stats before = fixture_stats(&f);
    atomic_store(&retry_stage, 0);
    kvt__fault_set(refused_retry_hook, NULL);
    uint32_t ready = restore(&f, &w, 0);
    kvt__fault_set(NULL, NULL);
    assert_int_equal(atomic_load(&retry_stage), 2);
    assert_true(ready < NB);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.io_errors - before.io_errors, 1);
    assert_int_equal(st.checksum_failures, 0);
    /* Every op is free again: the store serves a burst of reads and writes
     * from all its ops, and none of them is handed out twice. */
    for (int pass = 0; pass < 4; pass++) all_readable(&f, &w);
    close_disk(&f);
  }
}

/* Two threads release the same request while its disk restore is held
 * back: exactly one release returns 0 and the other KVT_ENOJOB (both
 * returned 0 before, and the second put the request back twice: a heap
 * overflow of the free list, then broken references), and every
 * conversation restores exact afterwards. */
typedef struct release_arg {
  kvt_cache *c;
  kvt_req r;
  int rc;
} release_arg;

static void *release_thread(void *p) {
  release_arg *a = p;
  a->rc = kvt_release(a->c, a->r);
  return NULL;
}

static void regression_concurrent_releases_of_a_loading_request(void **state) {
  (void)state;
  for (int round = 0; round < 3; round++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
    world w;
    fill(&f, &w);
    close_gate(KVT_FAULT_IO_DELAY_US);
    kvt_req r;
    uint32_t slots[NB];
    assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, 0, &r, slots, NULL), 1);
    wait_gate_holds();
    release_arg a[2] = {{f.c, r, 99}, {f.c, r, 99}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, release_thread, &a[i]), 0);
    usleep(20000); /* both wait for the loads */
    open_gate();
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    disarm();
    if (!((a[0].rc == 0 && a[1].rc == KVT_ENOJOB) || (a[0].rc == KVT_ENOJOB && a[1].rc == 0)))
      fail_msg("releases returned %d and %d", a[0].rc, a[1].rc);
    assert_int_equal(kvt_request_wait(f.c, r, -1, NULL), KVT_ENOJOB);
    assert_int_equal(kvt_release(f.c, r), KVT_ENOJOB);
    /* Twice: a request slot pushed twice on the free list shows only when
     * later acquires take it again. */
    all_readable(&f, &w);
    all_readable(&f, &w);
    close_disk(&f);
  }
}

/* A prefetch whose read fails reports the error on its job; the block
 * leaves the disk (a read that failed is not retried forever) and a later
 * restore recomputes it from there. */
static void prefetch_read_failure(void **state) {
  fixture f;
  open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
  world w;
  fill(&f, &w);
  kvt_stats before = fixture_stats(&f);
  arm(KVT_FAULT_IO_COMPLETE, -1, -EIO, 0, 1);
  kvt_job j;
  assert_int_equal(kvt_prefetch(f.c, w.k[1], NB, &j), 1);
  assert_int_equal(kvt_job_wait(f.c, j, -1), -EIO);
  assert_int_equal(kvt_job_release(f.c, j), 0);
  assert_int_equal(disarm(), 1);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.io_errors - before.io_errors, 1);
  assert_int_equal(st.jobs_failed - before.jobs_failed, 1);
  assert_int_equal(st.blocks_disk2h - before.blocks_disk2h, NB - 1);
  kvt_lookup_result lr = fixture_lookup(&f, w.k[1], NB);
  assert_true(lr.n_prefix < NB); /* the failed block left the disk */
  assert_int_equal(restore(&f, &w, 1), lr.n_prefix);
  all_readable(&f, &w);
  close_disk(&f);
}

/* kvt_acquire never waits for disk reads: with one I/O in flight at most
 * and the first read's completion held back, a 4-block disk restore
 * still returns at once (1), and every block lands exact afterwards. A
 * watchdog opens the gate if kvt_acquire does not return without it. */
static atomic_int acquire_back;

static void *open_gate_if_stuck(void *arg) {
  (void)arg;
  for (int i = 0; i < 20000 && !atomic_load(&acquire_back); i++) usleep(500);
  if (!atomic_load(&acquire_back)) open_gate();
  return NULL;
}

static void acquire_returns_before_disk_reads(void **state) {
  fixture f;
  kvt_config cfg = disk_config(4, 32, KVT_WRITE_THROUGH);
  cfg.disk_queue_depth = 1;
  fixture_open_cfg(&f, &cfg, 8);
  world w;
  fill(&f, &w);
  close_gate(KVT_FAULT_IO_DELAY_US);
  atomic_store(&acquire_back, 0);
  pthread_t wd;
  assert_int_equal(pthread_create(&wd, NULL, open_gate_if_stuck, NULL), 0);
  kvt_req r;
  uint32_t slots[NB], ready = 9;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, 0, &r, slots, &info);
  int held = atomic_load(&gate_closed);
  atomic_store(&acquire_back, 1);
  assert_int_equal(rc, 1);
  assert_int_equal(info.n_from_disk, NB);
  if (!held) fail_msg("kvt_acquire waited until the gated disk read completed");
  wait_gate_holds();
  assert_int_equal(kvt_request_poll(f.c, r, &ready), 1);
  open_gate();
  assert_int_equal(pthread_join(wd, NULL), 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_true(disarm() >= 1);
  assert_int_equal(ready, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  all_readable(&f, &w);
  close_disk(&f);
}

/* ---- restores that follow another job's copy ---- */

/* kvt_acquire does not wait for another job's copy of a block it restores
 * either: the load follows that copy. The leader (a kvt_prefetch, or
 * another request's load) reads the blocks from disk with every read's
 * completion held back; the follower's acquire still returns 1 at once,
 * and once the reads land both are byte-exact. A request the leader loads
 * into its own device slots is never shared while its copies are in
 * flight: the follower copies into slots of its own, freed at release.
 * The watchdog opens the gate if kvt_acquire does not return without it
 * (the code before waited for the leader: ~15 ms per disk read). */
static void start_watchdog(pthread_t *wd) {
  atomic_store(&acquire_back, 0);
  assert_int_equal(pthread_create(wd, NULL, open_gate_if_stuck, NULL), 0);
}

/* Acquires conversation c while the gate is closed; fails the test if the
 * call waited for the gate. */
static void acquire_ungated(fixture *f, world *w, uint32_t c, uint32_t flags, kvt_req *r, uint32_t *slots,
                            kvt_acquire_info *info) {
  pthread_t wd;
  start_watchdog(&wd);
  int rc = kvt_acquire(f->c, w->k[c], w->t[c], NB, NB, 0, flags, r, slots, info);
  int held = atomic_load(&gate_closed);
  atomic_store(&acquire_back, 1);
  assert_int_equal(pthread_join(wd, NULL), 0);
  if (!held) fail_msg("kvt_acquire waited until the leader's gated copies completed (rc %d)", rc);
  assert_int_equal(rc, 1);
  assert_int_equal(kvt_request_poll(f->c, *r, NULL), 1); /* its loads wait for the leader's */
}

static void acquire_follows_a_prefetch_in_flight(void **state) {
  for (int nowait = 0; nowait < 2; nowait++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
    world w;
    fill(&f, &w);
    kvt_stats before = fixture_stats(&f);
    kvt_job j = gated_prefetch(&f, &w);
    kvt_req r;
    uint32_t slots[NB], ready = 9;
    kvt_acquire_info info = {.size = sizeof info};
    acquire_ungated(&f, &w, 0, nowait ? KVT_ACQUIRE_NOWAIT : 0, &r, slots, &info);
    assert_int_equal(info.n_restore, NB);
    assert_int_equal(info.n_loading, NB);
    assert_int_equal(info.n_from_disk, 0); /* the prefetch reads them; this load copies them up */
    assert_int_equal(kvt_request_layer_ready(f.c, r, 0), 1);
    open_gate();
    for (uint32_t l = 0; l < FIX_LAYERS; l++) assert_int_equal(kvt_request_wait_layer(f.c, r, l, NULL), 0);
    assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
    assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
    assert_int_equal(kvt_job_release(f.c, j), 0);
    assert_true(disarm() >= 1);
    assert_int_equal(ready, NB);
    for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.blocks_disk2h - before.blocks_disk2h, NB); /* read once, by the prefetch */
    assert_int_equal(st.hits_host - before.hits_host, NB);
    assert_int_equal(st.io_errors + st.checksum_failures + st.copy_errors, 0);
    assert_int_equal(kvt_commit(f.c, r, NB, NULL), 0);
    assert_int_equal(kvt_release(f.c, r), 0);
    kvt_lookup_result lr = fixture_lookup(&f, w.k[0], NB);
    assert_int_equal(lr.n_device, NB); /* the follower's slots hold the blocks now */
    all_readable(&f, &w);
    close_disk(&f);
  }
}

/* Two requests for the same prefix, from disk (the leader's reads held
 * back) and from the host (its device copies held back): the second
 * acquire returns at once, both are byte-exact in slots of their own, and
 * after both releases the device holds one copy of each block. */
static void second_request_follows_the_first_load(void **state) {
  for (int from_host = 0; from_host < 2; from_host++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
    world w;
    fill(&f, &w);
    uint32_t c = from_host ? 2 : 0; /* conversation 2 is on the host */
    assert_int_equal(fixture_lookup(&f, w.k[c], NB).n_host, from_host ? NB : 0);
    kvt_stats before = fixture_stats(&f);
    close_gate(from_host ? KVT_FAULT_DEV_DELAY_US : KVT_FAULT_IO_DELAY_US);
    kvt_req ra, rb;
    uint32_t sa[NB], sb[NB], ready = 9;
    kvt_acquire_info info = {.size = sizeof info};
    assert_int_equal(kvt_acquire(f.c, w.k[c], w.t[c], NB, NB, 0, 0, &ra, sa, &info), 1);
    assert_int_equal(info.n_from_disk, from_host ? 0 : NB);
    wait_gate_holds();
    acquire_ungated(&f, &w, c, 0, &rb, sb, &info);
    assert_int_equal(info.n_restore, NB);
    assert_int_equal(info.n_device_hits, 0); /* the leader's slots are not shared while they fill */
    assert_int_equal(info.n_from_disk, 0);   /* nor are its blocks read twice */
    assert_int_equal(kvt_request_layer_ready(f.c, rb, FIX_LAYERS - 1), 1);
    open_gate();
    for (uint32_t l = 0; l < FIX_LAYERS; l++) {
      assert_int_equal(kvt_request_wait_layer(f.c, rb, l, NULL), 0);
      assert_int_equal(kvt_request_layer_ready(f.c, rb, l), 0);
    }
    assert_int_equal(kvt_request_wait(f.c, rb, -1, &ready), 0);
    assert_int_equal(ready, NB);
    assert_int_equal(kvt_request_wait(f.c, ra, -1, &ready), 0);
    assert_int_equal(ready, NB);
    assert_true(disarm() >= 1);
    for (uint32_t i = 0; i < NB; i++) {
      for (uint32_t k = 0; k < NB; k++) assert_true(sa[i] != sb[k]);
      assert_true(fixture_check(&f, sa[i], block_seed(c, i)));
      assert_true(fixture_check(&f, sb[i], block_seed(c, i)));
    }
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.blocks_disk2h - before.blocks_disk2h, from_host ? 0 : NB);
    assert_int_equal(st.blocks_h2d - before.blocks_h2d, 2 * NB);
    assert_int_equal(st.resident_device, 2 * NB);
    assert_int_equal(kvt_commit(f.c, rb, NB, NULL), 0);
    assert_int_equal(kvt_commit(f.c, ra, NB, NULL), 0);
    assert_int_equal(kvt_release(f.c, rb), 0);
    assert_int_equal(kvt_release(f.c, ra), 0);
    assert_int_equal(kvt_drain(f.c), 0);
    st = fixture_stats(&f);
    assert_int_equal(st.resident_device, NB); /* the follower's copies went back */
    assert_int_equal(st.resident_host, NB);
    assert_int_equal(st.io_errors + st.checksum_failures + st.copy_errors, 0);
    kvt_lookup_result lr = fixture_lookup(&f, w.k[c], NB);
    assert_int_equal(lr.n_device, NB);
    uint32_t s3[NB];
    assert_int_equal(kvt_acquire(f.c, w.k[c], w.t[c], NB, NB, 0, 0, &ra, s3, NULL), 0);
    assert_memory_equal(s3, sa, sizeof sa); /* device hits: the leader's slots */
    assert_int_equal(kvt_release(f.c, ra), 0);
    all_readable(&f, &w);
    close_disk(&f);
  }
}

/* No device room for a private copy: the second request waits for the
 * first one's load (a wait for room, which kvt_acquire keeps) and shares
 * its slots, rather than fail with KVT_ENOSPACE; with NOWAIT it returns
 * KVT_EAGAIN. (As the code before following did.) */
static void *open_gate_soon(void *arg) {
  (void)arg;
  usleep(50000);
  open_gate();
  return NULL;
}

static void no_room_for_a_private_copy_shares_after_waiting(void **state) {
  fixture f;
  open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
  world w;
  fill(&f, &w);
  close_gate(KVT_FAULT_DEV_DELAY_US);
  kvt_req ra, rb;
  uint32_t sa[NB], sb[NB + 1], ready = 9;
  assert_int_equal(kvt_acquire(f.c, w.k[2], w.t[2], NB, NB, 0, 0, &ra, sa, NULL), 1);
  wait_gate_holds();
  /* Four private copies and an extra slot: 5 slots, 4 free, none evictable. */
  assert_int_equal(kvt_acquire(f.c, w.k[2], w.t[2], NB, NB, 1, KVT_ACQUIRE_NOWAIT, &rb, sb, NULL), KVT_EAGAIN);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, open_gate_soon, NULL), 0);
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, w.k[2], w.t[2], NB, NB, 1, 0, &rb, sb, &info), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_true(disarm() >= 1);
  assert_int_equal(info.n_device_hits, NB);
  assert_memory_equal(sb, sa, sizeof sa);
  assert_int_equal(kvt_request_wait(f.c, ra, -1, &ready), 0);
  assert_int_equal(ready, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, sa[i], block_seed(2, i)));
  assert_int_equal(kvt_release(f.c, rb), 0);
  assert_int_equal(kvt_release(f.c, ra), 0);
  all_readable(&f, &w);
  close_disk(&f);
}

/* The followed fetch fails (an injected read error or short read, or a
 * record corrupt on the medium): the follower's ready prefix stops before
 * that block (FAILED, the rest COMPUTE), nothing before it is wrong, its
 * slots from there on are its own (the device holds no copy of them), and
 * what it then computes and commits restores exact. Leaders: a prefetch,
 * and another request's load (which fails at the same block). */
static int corrupt_records(const char *path, const kvt_key *keys, uint32_t n, size_t off_in_record);
static atomic_int follow_fail_left;
static atomic_int follow_fail_value;

static int follow_fail_hook(void *ctx, int site, int64_t arg) {
  if (site == KVT_FAULT_IO_COMPLETE && arg > 0 && atomic_fetch_sub(&follow_fail_left, 1) > 0)
    return atomic_load(&follow_fail_value);
  return hook(ctx, site, arg); /* the gate */
}

static void followed_fetch_failure_fails_the_follower(void **state) {
  int values[3] = {-EIO, 4096 /* short read */, 0 /* block 1 corrupt on disk */};
  for (int v = 0; v < 3; v++) {
    for (int leader_req = 0; leader_req < 2; leader_req++) {
      fixture f;
      open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
      world w;
      fill(&f, &w);
      if (!values[v]) assert_int_equal(corrupt_records(disk_path, &w.k[0][1], 1, kvt__record_prefix_bytes(BT) + 100), 1);
      kvt_stats before = fixture_stats(&f);
      close_gate(KVT_FAULT_IO_DELAY_US);
      atomic_store(&follow_fail_value, values[v]);
      atomic_store(&follow_fail_left, values[v] ? 1 : 0);
      kvt__fault_set(follow_fail_hook, NULL);
      kvt_job j = 0;
      kvt_req ra = 0, rb;
      uint32_t sa[NB], sb[NB], ready_a = 9, ready_b = 9;
      if (leader_req) assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, 0, &ra, sa, NULL), 1);
      else assert_int_equal(kvt_prefetch(f.c, w.k[0], NB, &j), 1);
      wait_gate_holds();
      kvt_acquire_info info = {.size = sizeof info};
      acquire_ungated(&f, &w, 0, 0, &rb, sb, &info);
      assert_int_equal(info.n_restore, NB);
      open_gate();
      assert_int_equal(kvt_request_wait(f.c, rb, -1, &ready_b), 0);
      if (leader_req) {
        assert_int_equal(kvt_request_wait(f.c, ra, -1, &ready_a), 0);
        assert_int_equal(ready_a, ready_b); /* the same block failed for both */
      } else {
        assert_true(kvt_job_wait(f.c, j, -1) < 0);
        assert_int_equal(kvt_job_release(f.c, j), 0);
      }
      disarm();
      assert_int_equal(atomic_load(&follow_fail_left) <= 0, 1);
      if (ready_b >= NB) fail_msg("value %d leader %d: the follower restored all %u blocks", values[v], leader_req, ready_b);
      if (!values[v]) assert_int_equal(ready_b, 1);
      uint8_t states[NB];
      assert_int_equal(kvt_request_block_states(f.c, rb, states, NB), 0);
      for (uint32_t i = 0; i < NB; i++)
        assert_int_equal(states[i], i < ready_b ? KVT_BLOCK_READY : i == ready_b ? KVT_BLOCK_FAILED : KVT_BLOCK_COMPUTE);
      for (uint32_t i = 0; i < ready_b; i++) assert_true(fixture_check(&f, sb[i], block_seed(0, i)));
      /* No device copy from the failed block on: nobody else reads the slots
       * the follower (and the leader) now compute into. */
      assert_int_equal(fixture_lookup(&f, w.k[0], NB).n_device, ready_b);
      kvt_stats st = fixture_stats(&f);
      assert_int_equal(st.io_errors - before.io_errors + st.checksum_failures - before.checksum_failures, 1);
      assert_int_equal(st.copy_errors, 0);
      for (uint32_t i = ready_b; i < NB; i++) fixture_write(&f, sb[i], block_seed(0, i));
      if (leader_req)
        for (uint32_t i = ready_a; i < NB; i++) {
          for (uint32_t k = 0; k < NB; k++) assert_true(sa[i] != sb[k]);
          fixture_write(&f, sa[i], block_seed(0, i));
        }
      assert_int_equal(kvt_commit(f.c, rb, NB, NULL), 0);
      assert_int_equal(kvt_release(f.c, rb), 0);
      if (leader_req) {
        assert_int_equal(kvt_commit(f.c, ra, NB, NULL), 0);
        assert_int_equal(kvt_release(f.c, ra), 0);
      }
      assert_int_equal(fixture_lookup(&f, w.k[0], NB).n_device, NB);
      assert_int_equal(restore(&f, &w, 0), NB);
      all_readable(&f, &w);
      close_disk(&f);
    }
  }
}

/* ---- restores that follow another job's copy: the edges ---- */

/* A block acquire scanned while a prefetch was fetching it into the host
 * has its tokens checked when the fetch lands. If the fetch lands while
 * acquire waits for device room, the request no longer follows it: the
 * scan runs again and checks the tokens there. A request whose tokens
 * differ from the stored block's must not get the stored block as ready. */
static void followed_fetch_landing_during_a_room_wait_still_checks_tokens(void **state) {
  fixture f;
  open_disk(&f, 8, 4, 32, KVT_WRITE_BACK);
  world w;
  fill(&f, &w); /* conv 0, 1 on disk; conv 2 on the host */
  /* Four device blocks with no host copy, unpinned (write-back: no store at commit). */
  kvt_key k3[NB];
  uint32_t t3[NB * BT];
  fixture_keys(&f, 3, NB, k3, t3);
  assert_int_equal(run_request(&f, k3, t3, NB, 3), 0);
  /* Make host room for the prefetch first (spills conv 2), ungated. */
  kvt_job j;
  int prc = kvt_prefetch(f.c, w.k[0], NB, &j);
  if (prc == KVT_EAGAIN) {
    assert_int_equal(kvt_drain(f.c), 0);
    close_gate(KVT_FAULT_IO_DELAY_US);
    prc = kvt_prefetch(f.c, w.k[0], NB, &j);
  } else {
    fail_msg("expected the first prefetch to need room (rc %d)", prc);
  }
  assert_int_equal(prc, 1);
  wait_gate_holds();
  /* B: conv 0's keys with conv 1's tokens (a different block for the same key). */
  kvt_stats before = fixture_stats(&f);
  kvt_req rb;
  uint32_t sb[NB + 1], ready = 9;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, open_gate_soon, NULL), 0);
  int rc = kvt_acquire(f.c, w.k[0], w.t[1], NB, NB, 1, 0, &rb, sb, NULL); /* waits for device room */
  assert_int_equal(pthread_join(th, NULL), 0);
  disarm();
  assert_true(rc == 0 || rc == 1);
  assert_int_equal(kvt_request_wait(f.c, rb, -1, &ready), 0);
  assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
  assert_int_equal(kvt_job_release(f.c, j), 0);
  kvt_stats st = fixture_stats(&f);
  assert_true(st.verify_mismatches > before.verify_mismatches); /* the re-scan checked them */
  int wrong = 0;
  for (uint32_t i = 0; i < ready && i < NB; i++) wrong += fixture_check(&f, sb[i], block_seed(0, i));
  if (ready > 0)
    fail_msg("%u block(s) reported ready for tokens that differ from the stored block's (%d hold conv 0's KV)", ready, wrong);
  for (uint32_t i = 0; i < NB; i++) fixture_write(&f, sb[i], block_seed(1, i));
  assert_int_equal(kvt_release(f.c, rb), 0);
  close_disk(&f);
}

/* Cancelling a prefetch does not fail another request's restore that
 * follows it: the fetch lands for the follower (the prefetch's handle
 * still reports the cancel). */
static void cancelled_prefetch_still_lands_for_its_followers(void **state) {
  fixture f;
  open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
  world w;
  fill(&f, &w);
  kvt_job j = gated_prefetch(&f, &w);
  kvt_req rb;
  uint32_t sb[NB], ready = 9;
  assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, 0, &rb, sb, NULL), 1);
  assert_int_equal(kvt_job_cancel(f.c, j), 0);
  open_gate();
  assert_int_equal(kvt_request_wait(f.c, rb, -1, &ready), 0);
  kvt_job_wait(f.c, j, -1);
  assert_int_equal(kvt_job_release(f.c, j), 0);
  disarm();
  uint8_t states[NB];
  assert_int_equal(kvt_request_block_states(f.c, rb, states, NB), 0);
  assert_int_equal(states[0], ready ? KVT_BLOCK_READY : KVT_BLOCK_FAILED);
  for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(&f, sb[i], block_seed(0, i)));
  for (uint32_t i = ready; i < NB; i++) fixture_write(&f, sb[i], block_seed(0, i));
  assert_int_equal(kvt_commit(f.c, rb, NB, NULL), 0);
  assert_int_equal(kvt_release(f.c, rb), 0);
  int lost = ready < NB;
  all_readable(&f, &w);
  close_disk(&f);
  if (lost) fail_msg("another user's kvt_job_cancel turned %u intact disk hits of this request into FAILED", NB - ready);
}

/* The prefetch's handle is released (or not) before its reads land, and
 * the cache is closed with a follower and a private-copy follower still
 * acquired, their loads in flight (the gate opens from another thread):
 * no hang, no leak or use-after-free (ASan). */
static void close_with_followers_in_flight(void **state) {
  for (int release_handle = 0; release_handle < 2; release_handle++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
    world w;
    fill(&f, &w);
    kvt_job j = gated_prefetch(&f, &w);
    kvt_req rb, rc2;
    uint32_t sb[NB], sc[NB];
    assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, KVT_ACQUIRE_NOWAIT, &rb, sb, NULL), 1);
    /* and a dup follower behind rb's device copies */
    assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, KVT_ACQUIRE_NOWAIT, &rc2, sc, NULL), 1);
    if (release_handle) assert_int_equal(kvt_job_release(f.c, j), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, open_gate_soon, NULL), 0);
    kvt_close(f.c); /* drains */
    f.c = NULL;
    assert_int_equal(pthread_join(th, NULL), 0);
    disarm();
    close_disk(&f);
  }
}

/* A request and a private-copy follower both copy from the host; exactly
 * one of the two device copies fails (which one is up to the workers). The
 * other is ready and exact, slots are never shared, the failed one
 * computes into slots of its own, and after commits and releases the
 * device holds one exact copy. */
static atomic_int one_copy_fail_left;
static int one_copy_fails_hook(void *ctx, int site, int64_t arg) {
  if (site == KVT_FAULT_DEV_COMPLETE && arg == KVT_XFER_H2D && atomic_fetch_sub(&one_copy_fail_left, 1) > 0) return -EIO;
  return hook(ctx, site, arg);
}

static void one_of_two_device_copies_fails(void **state) {
  for (int round = 0; round < 6; round++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
    world w;
    fill(&f, &w);
    close_gate(KVT_FAULT_DEV_DELAY_US);
    atomic_store(&one_copy_fail_left, 1);
    kvt__fault_set(one_copy_fails_hook, NULL);
    kvt_req ra, rb;
    uint32_t sa[NB], sb[NB], na = 9, nb = 9;
    kvt_acquire_info ia = {.size = sizeof ia}, ib = {.size = sizeof ib};
    assert_int_equal(kvt_acquire(f.c, w.k[2], w.t[2], NB, NB, 0, 0, &ra, sa, &ia), 1);
    wait_gate_holds();
    assert_int_equal(kvt_acquire(f.c, w.k[2], w.t[2], NB, NB, 0, KVT_ACQUIRE_NOWAIT, &rb, sb, &ib), 1);
    assert_int_equal(ib.n_device_hits, 0);
    open_gate();
    assert_int_equal(kvt_request_wait(f.c, ra, -1, &na), 0);
    assert_int_equal(kvt_request_wait(f.c, rb, -1, &nb), 0);
    disarm();
    kvt__fault_set(NULL, NULL);
    if (!((na == NB && nb == 0) || (na == 0 && nb == NB))) fail_msg("ready: first request %u, follower %u", na, nb);
    for (uint32_t i = 0; i < NB; i++)
      for (uint32_t k = 0; k < NB; k++) assert_true(sa[i] != sb[k]);
    for (uint32_t i = 0; i < na; i++) assert_true(fixture_check(&f, sa[i], block_seed(2, i)));
    for (uint32_t i = 0; i < nb; i++) assert_true(fixture_check(&f, sb[i], block_seed(2, i)));
    assert_int_equal(fixture_lookup(&f, w.k[2], NB).n_device, na); /* a dup never becomes the device copy before commit */
    for (uint32_t i = na; i < NB; i++) fixture_write(&f, sa[i], block_seed(2, i));
    for (uint32_t i = nb; i < NB; i++) fixture_write(&f, sb[i], block_seed(2, i));
    assert_int_equal(kvt_commit(f.c, rb, NB, NULL), 0);
    assert_int_equal(kvt_commit(f.c, ra, NB, NULL), 0);
    assert_int_equal(kvt_release(f.c, rb), 0);
    assert_int_equal(kvt_release(f.c, ra), 0);
    assert_int_equal(kvt_drain(f.c), 0);
    assert_int_equal(fixture_stats(&f).resident_device, NB);
    assert_int_equal(restore(&f, &w, 2), NB);
    all_readable(&f, &w);
    close_disk(&f);
  }
}

/* Write-through spills wait for free disk ops off the device's completion
 * thread: with one copy worker, one disk op, and disk completions held
 * back, a restore from the host still completes (its copy's completion is
 * not queued behind a spill waiting for the disk). The watchdog opens the
 * gate if it does not. */
static atomic_int restore_back;

static void *open_gate_if_restore_stuck(void *arg) {
  (void)arg;
  for (int i = 0; i < 20000 && !atomic_load(&restore_back); i++) usleep(500);
  if (!atomic_load(&restore_back)) open_gate();
  return NULL;
}

static void spills_never_stall_device_completions(void **state) {
  fixture f;
  kvt_config cfg = disk_config(16, 32, KVT_WRITE_THROUGH);
  cfg.disk_queue_depth = 1;
  cfg.copy_threads = 1;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key ka[NB], kb[NB];
  uint32_t ta[NB * BT], tb[NB * BT];
  fixture_keys(&f, 0, NB, ka, ta);
  fixture_keys(&f, 1, NB, kb, tb);
  assert_int_equal(run_request(&f, ka, ta, NB, 0), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  offload(&f, ka, NB); /* A: host and disk only */
  assert_int_equal(fixture_lookup(&f, ka, NB).n_host, NB);
  fixture_scribble(&f);
  close_gate(KVT_FAULT_IO_DELAY_US);
  atomic_store(&restore_back, 0);
  pthread_t wd;
  assert_int_equal(pthread_create(&wd, NULL, open_gate_if_restore_stuck, NULL), 0);
  /* B's commit copies it to the host, then spills it: 4 writes for one disk op. */
  assert_int_equal(run_request(&f, kb, tb, NB, 1), 0);
  kvt_req r;
  uint32_t slots[NB], ready = 0;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(f.c, ka, ta, NB, NB, 0, 0, &r, slots, &info);
  assert_int_equal(rc, 1);
  assert_int_equal(info.n_loading, NB);
  assert_int_equal(info.n_from_disk, 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  int held = atomic_load(&gate_closed);
  atomic_store(&restore_back, 1);
  open_gate();
  assert_int_equal(pthread_join(wd, NULL), 0);
  if (!held) fail_msg("the host restore waited for a spill held on the disk");
  assert_int_equal(ready, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  assert_true(disarm() >= 1);
  assert_int_equal(fixture_lookup(&f, kb, NB).n_prefix, NB);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.io_errors, 0);
  close_disk(&f);
}

/* The same with the store itself slow: an injected delay inside its op
 * allocation (where a spill submission waits for a free op) holds the
 * write-through spill, yet a restore from the host completes meanwhile:
 * no device completion waits for the thread that talks to the store (the
 * waiting caller applies completions itself). The watchdog opens the gate
 * if it does not. */
static void store_op_delay_never_stalls_device_completions(void **state) {
  fixture f;
  kvt_config cfg = disk_config(16, 32, KVT_WRITE_THROUGH);
  cfg.copy_threads = 1;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key ka[NB], kb[NB];
  uint32_t ta[NB * BT], tb[NB * BT];
  fixture_keys(&f, 0, NB, ka, ta);
  fixture_keys(&f, 1, NB, kb, tb);
  assert_int_equal(run_request(&f, ka, ta, NB, 0), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  offload(&f, ka, NB); /* A: host and disk only */
  assert_int_equal(fixture_lookup(&f, ka, NB).n_host, NB);
  fixture_scribble(&f);
  close_gate(KVT_FAULT_STORE_OP_DELAY_US);
  atomic_store(&restore_back, 0);
  pthread_t wd;
  assert_int_equal(pthread_create(&wd, NULL, open_gate_if_restore_stuck, NULL), 0);
  /* B's commit copies it to the host, then its spill stalls in the store. */
  assert_int_equal(run_request(&f, kb, tb, NB, 1), 0);
  wait_gate_holds();
  kvt_req r;
  uint32_t slots[NB], ready = 0;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, ka, ta, NB, NB, 0, 0, &r, slots, &info), 1);
  assert_int_equal(info.n_loading, NB);
  assert_int_equal(info.n_from_disk, 0);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(kvt_request_layer_ready(f.c, r, 0), 0);
  int held = atomic_load(&gate_closed);
  atomic_store(&restore_back, 1);
  open_gate();
  assert_int_equal(pthread_join(wd, NULL), 0);
  if (!held) fail_msg("the host restore waited for a spill stalled in the store");
  assert_int_equal(ready, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  assert_true(disarm() >= 1);
  assert_int_equal(fixture_lookup(&f, kb, NB).n_prefix, NB);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.io_errors, 0);
  assert_true(st.blocks_h2disk >= 2 * NB); /* A's and B's write-through spills */
  close_disk(&f);
}

/* A restore from disk streams: reads land one at a time (queue depth 1,
 * each completion slowed), and the first device copy starts before the
 * last read has landed; the blocks still arrive in order and exact. */
enum { NS = 16 };
static atomic_int reads_landed, h2d_copies, reads_at_first_copy;

static int stream_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  if (site == KVT_FAULT_IO_DELAY_US) {
    atomic_fetch_add(&reads_landed, 1);
    return 3000;
  }
  if (site == KVT_FAULT_DEV_SUBMIT && arg == KVT_XFER_H2D && atomic_fetch_add(&h2d_copies, 1) == 0)
    atomic_store(&reads_at_first_copy, atomic_load(&reads_landed));
  return 0;
}

static void disk_restore_streams_device_copies(void **state) {
  kvt_config cfg = disk_config(2 * NS, 4 * NS, KVT_WRITE_THROUGH);
  cfg.disk_queue_depth = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 2 * NS);
  kvt_key k[NS];
  uint32_t t[NS * BT];
  fixture_keys(&f, 7, NS, k, t);
  assert_int_equal(run_request(&f, k, t, NS, 7), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  fixture_close(&f);
  cfg.disk_reset = 0; /* reopened: the conversation is on disk only */
  fixture_open_cfg(&f, &cfg, 2 * NS);
  assert_int_equal(fixture_lookup(&f, k, NS).n_disk, NS);
  atomic_store(&reads_landed, 0);
  atomic_store(&h2d_copies, 0);
  atomic_store(&reads_at_first_copy, -1);
  kvt__fault_set(stream_hook, NULL);
  kvt_req r;
  uint32_t slots[NS], ready = 0;
  assert_int_equal(kvt_acquire(f.c, k, t, NS, NS, 0, 0, &r, slots, NULL), 1);
  /* Per-layer readiness spans every copy of the restore, streamed or not:
   * once each layer has been waited for, every block's bytes are there. */
  for (uint32_t l = 0; l < FIX_LAYERS; l++) {
    assert_int_equal(kvt_request_wait_layer(f.c, r, l, NULL), 0);
    assert_int_equal(kvt_request_layer_ready(f.c, r, l), 0);
  }
  for (uint32_t i = 0; i < NS; i++) assert_true(fixture_check(&f, slots[i], block_seed(7, i)));
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ready, NS);
  int first = atomic_load(&reads_at_first_copy);
  if (first < 0 || first >= NS) fail_msg("the first device copy started after %d of %d reads", first, NS);
  assert_true(atomic_load(&h2d_copies) >= 2);
  for (uint32_t i = 0; i < NS; i++) assert_true(fixture_check(&f, slots[i], block_seed(7, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(run_request(&f, k, t, NS, 7), NS);
  close_disk(&f);
}

/* A streamed restore whose first chunk's device copy fails: from that block
 * on the request recomputes, even where a later chunk's copy landed (its
 * slot is the request's own, never shared); nothing wrong is ever ready. */
static void streamed_copy_failure_cuts_the_rest(void **state) {
  kvt_config cfg = disk_config(2 * NS, 4 * NS, KVT_WRITE_THROUGH);
  cfg.disk_queue_depth = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 2 * NS);
  kvt_key k[NS];
  uint32_t t[NS * BT];
  fixture_keys(&f, 8, NS, k, t);
  assert_int_equal(run_request(&f, k, t, NS, 8), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  fixture_close(&f);
  cfg.disk_reset = 0;
  fixture_open_cfg(&f, &cfg, 2 * NS);
  fixture_scribble(&f);
  arm(KVT_FAULT_DEV_COMPLETE, KVT_XFER_H2D, -EIO, 0, 1);
  kvt_req r;
  uint32_t slots[NS], ready = 9;
  uint8_t states[NS];
  assert_int_equal(kvt_acquire(f.c, k, t, NS, NS, 0, 0, &r, slots, NULL), 1);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(disarm(), 1);
  assert_int_equal(kvt_request_block_states(f.c, r, states, NS), 0);
  for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(&f, slots[i], block_seed(8, i)));
  for (uint32_t i = ready; i < NS; i++) {
    assert_int_not_equal(states[i], KVT_BLOCK_READY);
    fixture_write(&f, slots[i], block_seed(8, i)); /* recomputed into the request's own slots */
  }
  assert_true(ready < NS);
  assert_int_equal(kvt_commit(f.c, r, NS, NULL), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_true(fixture_stats(&f).copy_errors >= 1);
  assert_int_equal(run_request(&f, k, t, NS, 8), NS);
  close_disk(&f);
}

/* Completions are data: a backend thread only posts them. What a failed
 * copy or write does to the tier map, and the log line it causes, happen in
 * a progress step (the progress thread, or a caller that waits), never on
 * the copy worker or the disk reaper that saw the failure. The hook records
 * those threads as it injects the errors; the log hook checks it is on none
 * of them. */
#define MAX_BACKEND_THREADS 16
static pthread_t backend_threads[MAX_BACKEND_THREADS];
static atomic_int n_backend_threads, fail_dev_left, fail_io_left, lines_logged, lines_on_backend;
static pthread_mutex_t backend_threads_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_backend_thread(void) {
  pthread_mutex_lock(&backend_threads_lock);
  int n = atomic_load(&n_backend_threads), known = 0;
  for (int i = 0; i < n; i++) known |= pthread_equal(backend_threads[i], pthread_self());
  if (!known && n < MAX_BACKEND_THREADS) backend_threads[n] = pthread_self(), atomic_store(&n_backend_threads, n + 1);
  pthread_mutex_unlock(&backend_threads_lock);
}

static int backend_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  if (site == KVT_FAULT_DEV_COMPLETE) {
    note_backend_thread();
    if (arg == KVT_XFER_D2H && atomic_fetch_sub(&fail_dev_left, 1) > 0) return -EIO;
  }
  if (site == KVT_FAULT_IO_COMPLETE) {
    note_backend_thread();
    if (atomic_fetch_sub(&fail_io_left, 1) > 0) return -EIO;
  }
  return 0;
}

static void backend_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  (void)level;
  if (!strstr(msg, "device copy error") && !strstr(msg, "disk I/O error")) return;
  atomic_fetch_add(&lines_logged, 1);
  pthread_mutex_lock(&backend_threads_lock);
  for (int i = 0; i < atomic_load(&n_backend_threads); i++)
    if (pthread_equal(backend_threads[i], pthread_self())) atomic_fetch_add(&lines_on_backend, 1);
  pthread_mutex_unlock(&backend_threads_lock);
}

static void completions_are_applied_off_backend_threads(void **state) {
  kvt_config cfg = disk_config(4, 32, KVT_WRITE_BACK);
  cfg.log_fn = backend_log;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key ka[NB], kb[NB];
  uint32_t ta[NB * BT], tb[NB * BT];
  fixture_keys(&f, 0, NB, ka, ta);
  fixture_keys(&f, 1, NB, kb, tb);
  atomic_store(&n_backend_threads, 0);
  atomic_store(&lines_logged, 0);
  atomic_store(&lines_on_backend, 0);
  atomic_store(&fail_dev_left, 1);
  atomic_store(&fail_io_left, 0);
  kvt__fault_set(backend_hook, NULL);
  /* A's store to the host fails on the copy worker: A stays on the device. */
  assert_int_equal(run_request(&f, ka, ta, NB, 0), 0);
  assert_int_equal(offload(&f, ka, NB), -EIO);
  assert_int_equal(fixture_lookup(&f, ka, NB).n_device, NB);
  assert_int_equal(offload(&f, ka, NB), 0); /* now on the host */
  /* B's store pushes A to disk: its first write fails on the reaper. */
  atomic_store(&fail_io_left, 1);
  assert_int_equal(run_request(&f, kb, tb, NB, 1), 0);
  assert_int_equal(offload(&f, kb, NB), 0);
  assert_int_equal(kvt_drain(f.c), 0);
  kvt__fault_set(NULL, NULL);
  kvt_stats st = fixture_stats(&f);
  assert_true(st.copy_errors >= 1);
  assert_int_equal(st.io_errors, 1);
  fixture_close(&f); /* reports what the rate limit held back */
  unlink(disk_path);
  assert_true(atomic_load(&n_backend_threads) >= 2);
  assert_true(atomic_load(&lines_logged) >= 2);
  assert_int_equal(atomic_load(&lines_on_backend), 0);
}

/* Slow disk completions: a request waits (poll says in progress), layers
 * are not ready, commit is refused until the loads land; then exact. */
static void slow_disk_completions(void **state) {
  fixture f;
  open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
  world w;
  fill(&f, &w);
  fixture_scribble(&f);
  close_gate(KVT_FAULT_IO_DELAY_US);
  kvt_req r;
  uint32_t slots[NB], ready = 9;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, w.k[0], w.t[0], NB, NB, 0, 0, &r, slots, &info), 1);
  assert_int_equal(info.n_from_disk, NB);
  wait_gate_holds();
  assert_int_equal(kvt_request_poll(f.c, r, &ready), 1);
  assert_int_equal(kvt_request_layer_ready(f.c, r, 0), 1);
  assert_int_equal(kvt_commit(f.c, r, NB, NULL), KVT_EBUSY);
  /* Meanwhile: lookups, and a new conversation computed on the device. */
  assert_int_equal(fixture_lookup(&f, w.k[1], NB).n_disk, NB);
  kvt_key k9[2];
  uint32_t t9[2 * BT];
  fixture_keys(&f, 9, 2, k9, t9);
  assert_int_equal(run_request(&f, k9, t9, 2, 9), 0);
  assert_int_equal(run_request(&f, k9, t9, 2, 9), 2);
  open_gate();
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_true(disarm() >= 1);
  assert_int_equal(ready, NB);
  for (uint32_t i = 0; i < NB; i++) assert_true(fixture_check(&f, slots[i], block_seed(0, i)));
  assert_int_equal(kvt_release(f.c, r), 0);
  all_readable(&f, &w);
  close_disk(&f);
}

/* A load from disk whose second phase (host -> device copy) fails. The
 * copy streams in chunks as reads land: blocks before the failed chunk may
 * be ready (checked exact), none from it on. */
static void disk_load_copy_failure(void **state) {
  fixture f;
  open_disk(&f, 8, 4, 32, KVT_WRITE_THROUGH);
  world w;
  fill(&f, &w);
  arm(KVT_FAULT_DEV_COMPLETE, KVT_XFER_H2D, -EIO, 0, 1);
  assert_true(restore(&f, &w, 1) < NB);
  assert_int_equal(disarm(), 1);
  assert_true(fixture_stats(&f).copy_errors >= 1);
  all_readable(&f, &w);
  close_disk(&f);
}

/* ---- corruption on the medium ---- */

/* Flips one byte in each record of conversation `conv` (found by key). */
static int corrupt_records(const char *path, const kvt_key *keys, uint32_t n, size_t off_in_record) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  size_t slot_bytes = kvt__record_bytes(BT, FIX_LAYERS * 2 * FIX_SEG_BYTES);
  unsigned char *rec = malloc(slot_bytes);
  int hit = 0;
  for (uint64_t s = 0;; s++) {
    off_t at = 4096 + (off_t)(s * slot_bytes);
    if (pread(fd, rec, slot_bytes, at) != (ssize_t)slot_bytes) break;
    const kvt__record_hdr *h = (const void *)rec;
    for (uint32_t i = 0; i < n; i++)
      if (h->key.lo == keys[i].lo && h->key.hi == keys[i].hi) {
        rec[off_in_record] ^= 0x5a;
        assert_int_equal(pwrite(fd, rec, slot_bytes, at), (ssize_t)slot_bytes);
        hit++;
      }
  }
  free(rec);
  fsync(fd);
  close(fd);
  return hit;
}

static void corrupt_records_are_counted_misses(void **state) {
  size_t payload_off = kvt__record_prefix_bytes(BT);
  size_t where[3] = {payload_off + 100, KVT_RECORD_HDR_BYTES + 8 /* tokens */, 40 /* header: key */};
  for (int i = 0; i < 3; i++) {
    fixture f;
    open_disk(&f, 8, 4, 32, KVT_WRITE_BACK);
    world w;
    fill(&f, &w);
    assert_int_equal(corrupt_records(disk_path, w.k[0], NB, where[i]), NB);
    kvt_stats before = fixture_stats(&f);
    assert_int_equal(restore(&f, &w, 0), 0); /* never the corrupt bytes */
    kvt_stats st = fixture_stats(&f);
    uint64_t bad = (st.checksum_failures - before.checksum_failures) +
                   (st.verify_mismatches - before.verify_mismatches);
    assert_true(bad >= 1);
    tried[0] += NB;
    /* The record is not trusted again: dropped from the disk tier. */
    assert_int_equal(restore(&f, &w, 1), NB);
    assert_int_equal(restore(&f, &w, 2), NB);
    all_readable(&f, &w);
    close_disk(&f);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(store_copy_failure_keeps_device_copies),
      cmocka_unit_test(load_copy_failure_means_recompute),
      cmocka_unit_test(demotion_copy_failure_loses_no_block),
      cmocka_unit_test(regression_persistent_demotion_failure_hangs_acquire),
      cmocka_unit_test(slow_copies_do_not_block_other_calls),
      cmocka_unit_test(job_released_midway_completes_whole),
      cmocka_unit_test(host_alloc_failure_at_register),
      cmocka_unit_test(regression_register_retry_after_failure),
      cmocka_unit_test(host_pool_exhaustion),
      cmocka_unit_test(disk_restore_larger_than_host_tier),
      cmocka_unit_test(spill_write_failures),
      cmocka_unit_test(fetch_read_failures),
      cmocka_unit_test(transient_errors_are_retried),
      cmocka_unit_test(regression_refused_retry_finishes_once),
      cmocka_unit_test(regression_concurrent_releases_of_a_loading_request),
      cmocka_unit_test(prefetch_read_failure),
      cmocka_unit_test(slow_disk_completions),
      cmocka_unit_test(acquire_returns_before_disk_reads),
      cmocka_unit_test(acquire_follows_a_prefetch_in_flight),
      cmocka_unit_test(second_request_follows_the_first_load),
      cmocka_unit_test(no_room_for_a_private_copy_shares_after_waiting),
      cmocka_unit_test(followed_fetch_failure_fails_the_follower),
      cmocka_unit_test(followed_fetch_landing_during_a_room_wait_still_checks_tokens),
      cmocka_unit_test(cancelled_prefetch_still_lands_for_its_followers),
      cmocka_unit_test(close_with_followers_in_flight),
      cmocka_unit_test(one_of_two_device_copies_fails),
      cmocka_unit_test(spills_never_stall_device_completions),
      cmocka_unit_test(store_op_delay_never_stalls_device_completions),
      cmocka_unit_test(disk_restore_streams_device_copies),
      cmocka_unit_test(streamed_copy_failure_cuts_the_rest),
      cmocka_unit_test(completions_are_applied_off_backend_threads),
      cmocka_unit_test(disk_load_copy_failure),
      cmocka_unit_test(corrupt_records_are_counted_misses),
  };
  if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  static const char *names[KVT_FAULT_SITE_COUNT] = {"corrupt records", "DEV_SUBMIT", "DEV_COMPLETE", "DEV_DELAY",
                                                    "IO_SUBMIT", "IO_COMPLETE", "IO_DELAY", "HOST_ALLOC", "PIN",
                                                    "ALLOC", "PREALLOC", "DISK_SYNC", "STORE_OP_DELAY",
                                                    "IO_BUF_REGISTER"};
  long total = 0;
  printf("faults injected:");
  for (int s = 0; s < KVT_FAULT_SITE_COUNT; s++) {
    printf(" %s=%ld", names[s], tried[s]);
    total += tried[s];
  }
  printf(" (total %ld)\n", total);
  return rc;
}
