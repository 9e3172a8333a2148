/* Storage mode under concurrency: 4 threads put, check and get 8 shared
 * conversations through a small host tier and a disk tier, so puts of the
 * same keys race, spills and drops run under gets, and gets race evictions.
 * Every block a get reports landed must hold exactly the bytes put for its
 * key; once through staging, once with each thread's memory registered and
 * aligned, so disk I/O goes straight between it and the file (as io_uring
 * fixed buffers where the kernel takes them).
 * KVT_STRESS_SCALE scales the iterations (CI: 0.25 under TSan). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "helpers.h"
#include "kvtier/kvtier.h"

int kvt__check_invariants(kvt_cache *c, char *msg, size_t len); /* src/engine/check.c */

#define BT 16
#define BLOCK 8192u
#define CONVS 8
#define NBLK 6
#define THREADS 4

static kvt_cache *cache;
static kvt_key keys[CONVS][NBLK];
static uint32_t toks[CONVS][NBLK * BT];
static int iters = 2000;

static uint64_t seed_of(int conv, int b) { return (uint64_t)conv * 1000 + (uint64_t)b; }

/* Straight mode: each thread's blocks live in a registered region, a
 * block's two pages one page apart, so every disk put and get moves
 * straight between that memory and the file (no host tier). */
static int straight;

/* Promote mode: gets promote half the time (KVT_GET_PROMOTE), and two more
 * ops race them: removes and touches of a conversation. */
static int promote;

/* Block b's two pieces: unaligned pointers into buf, or (straight) pages
 * 0 and 2 of the block's 16 KiB place in the thread's region. */
static void pieces_of(kvt_piece *p, char *buf, kvt_region reg) {
  for (int b = 0; b < NBLK; b++) {
    if (straight) {
      p[2 * b] = (kvt_piece){.region = reg, .offset = (uint64_t)b * 2 * BLOCK, .len = 4096};
      p[2 * b + 1] = (kvt_piece){.region = reg, .offset = (uint64_t)b * 2 * BLOCK + 8192, .len = BLOCK - 4096};
      continue;
    }
    p[2 * b] = (kvt_piece){.ptr = buf + (size_t)b * BLOCK, .len = 3000};
    p[2 * b + 1] = (kvt_piece){.ptr = buf + (size_t)b * BLOCK + 3000, .len = BLOCK - 3000};
  }
}

/* The bytes of block b, wherever its pieces are, <-> img. */
static void block_bytes(char *buf, int b, char *img, int to_buf) {
  char *first = straight ? buf + (size_t)b * 2 * BLOCK : buf + (size_t)b * BLOCK;
  char *second = straight ? first + 8192 : first + 4096;
  if (to_buf) {
    memcpy(first, img, 4096);
    memcpy(second, img + 4096, BLOCK - 4096);
  } else {
    memcpy(img, first, 4096);
    memcpy(img + 4096, second, BLOCK - 4096);
  }
}

static void *worker(void *arg) {
  unsigned r = (unsigned)(uintptr_t)arg * 7919u + 1;
  size_t bytes = (size_t)NBLK * BLOCK * (straight ? 2 : 1);
  char *buf = aligned_alloc(4096, bytes), img[BLOCK];
  kvt_region reg = KVT_REGION_NONE;
  if (straight && kvt_register_memory(cache, buf, bytes, KVT_MEM_HOST_FIXED, &reg) != 0) {
    free(buf);
    return (void *)(intptr_t)1;
  }
  kvt_piece p[NBLK * 2];
  pieces_of(p, buf, reg);
  int bad = 0;
  for (int it = 0; it < iters && !bad; it++) {
    r = r * 1103515245u + 12345u;
    int conv = (int)((r >> 8) % CONVS), op = (int)((r >> 4) % (promote ? 5 : 3));
    kvt_batch bt;
    kvt_batch_init(&bt);
    bt.n_blocks = NBLK;
    bt.keys = keys[conv];
    bt.tokens = toks[conv];
    bt.pieces = p;
    bt.pieces_per_block = 2;
    bt.flags = promote && (r >> 16) & 1 ? KVT_GET_PROMOTE : 0;
    kvt_job job;
    int32_t res[NBLK];
    if (op == 0) {
      for (int b = 0; b < NBLK; b++) {
        kvt_test_fill(img, BLOCK, seed_of(conv, b));
        block_bytes(buf, b, img, 1);
      }
      bt.flags = 0;
      if (kvt_put_from(cache, &bt, &job) != 1) continue;
      int st = kvt_storage_wait(cache, job, -1);
      if (st != 0 && st != KVT_ENOSPACE && st != KVT_EAGAIN) {
        fprintf(stderr, "put: %s\n", kvt_strerror(st));
        bad = 1;
      }
      kvt_storage_release(cache, job);
    } else if (op == 1) {
      kvt_lookup_result lr = {.size = sizeof lr};
      bad |= kvt_exists(cache, NULL, keys[conv], NBLK, 0, &lr, NULL) != 0;
      bad |= lr.n_prefix > NBLK || lr.n_host + lr.n_disk != lr.n_prefix;
    } else if (op == 3) {
      size_t n = 0;
      bad |= kvt_remove(cache, &keys[conv][(r >> 20) % (NBLK - 1)], 1 + (r >> 24) % 2, &n) != 0;
    } else if (op == 4) {
      size_t n = 0;
      bad |= kvt_touch(cache, NULL, keys[conv], NBLK, 0, &n) != 0 || n > NBLK;
    } else {
      memset(buf, 0, bytes);
      if (kvt_get_into(cache, &bt, &job) != 1) continue;
      int st = kvt_storage_wait(cache, job, -1);
      if (st != 0) {
        fprintf(stderr, "get: %s\n", kvt_strerror(st));
        bad = 1;
      }
      uint32_t ok = 0;
      bad |= kvt_storage_results(cache, job, res, NBLK, &ok) != 0;
      for (int b = 0; b < NBLK; b++)
        if (res[b] == 0 && (block_bytes(buf, b, img, 0), !kvt_test_check(img, BLOCK, seed_of(conv, b)))) {
          fprintf(stderr, "get: block %d of %d holds other bytes\n", b, conv);
          bad = 1;
        }
      kvt_storage_release(cache, job);
    }
  }
  if (straight) bad |= kvt_unregister_memory(cache, reg) != 0;
  free(buf);
  return (void *)(intptr_t)bad;
}

static void run_threads(uint32_t host_blocks) {
  int scaled = 2000;
  const char *e = getenv("KVT_STRESS_SCALE");
  if (e) scaled = (int)(scaled * atof(e));
  iters = scaled < 10 ? 10 : scaled;
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "storage-conc";
  cfg.block_tokens = BT;
  cfg.host_blocks = host_blocks;
  cfg.copy_threads = 2;
  char path[4200];
  snprintf(path, sizeof path, "%s/conc-storage.kvt", kvt_test_tmpdir());
  cfg.disk_path = path;
  cfg.disk_blocks = 30;
  cfg.disk_reset = 1;
  assert_int_equal(kvt_open(&cfg, &cache), 0);
  assert_int_equal(kvt_test_register_storage(cache, BLOCK), 0);
  for (int c = 0; c < CONVS; c++) {
    for (int i = 0; i < NBLK * BT; i++) toks[c][i] = (uint32_t)(c * 100000 + i);
    size_t n;
    assert_int_equal(kvt_hash_tokens(cache, NULL, toks[c], NBLK * BT, keys[c], NBLK, &n), 0);
  }
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t);
  int bad = 0;
  for (int t = 0; t < THREADS; t++) {
    void *rv;
    pthread_join(th[t], &rv);
    bad |= (int)(intptr_t)rv;
  }
  assert_int_equal(bad, 0);
  kvt_drain(cache);
  char why[200] = "";
  if (kvt__check_invariants(cache, why, sizeof why) != 0) fprintf(stderr, "tier map: %s\n", why);
  assert_string_equal(why, "");
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(cache, &st);
  assert_int_equal(st.checksum_failures + st.io_errors + st.verify_mismatches, 0);
  assert_true(st.resident_host <= host_blocks && st.resident_disk <= 30);
  /* Straight on io_uring: the threads' regions are fixed buffers, and each
   * registers and unregisters its own while the others' I/O runs. */
  struct utsname u;
  int major = 0, minor = 0;
  if (uname(&u) == 0) sscanf(u.release, "%d.%d", &major, &minor);
  int sparse = major > 5 || (major == 5 && minor >= 19); /* io_uring's sparse buffer tables */
  if (straight && sparse && strcmp(kvt_disk_backend_name(cache), "io_uring") == 0)
    assert_true(st.storage_blocks_fixed > 0);
  if (!straight) assert_int_equal(st.storage_blocks_fixed, 0);
  if (promote) assert_true(st.blocks_disk2h > 0);
  kvt_close(cache);
}

static void four_threads_put_get_and_check(void **s) {
  straight = 0;
  promote = 0;
  run_threads(10);
}

/* The same through the straight path: engine memory <-> file, no staging,
 * with the disk tier full and its victims dropped under reads. */
static void four_threads_straight_to_disk(void **s) {
  straight = 1;
  promote = 0;
  run_threads(0);
}

/* Promoting gets race puts, gets, removes and touches of the same keys
 * and the evictions their host slots cause; staged, then straight. */
static void four_threads_promote_remove_and_touch(void **s) {
  straight = 0;
  promote = 1;
  run_threads(10);
}

static void four_threads_promote_straight(void **s) {
  straight = 1;
  promote = 1;
  run_threads(10);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(four_threads_put_get_and_check),
                                     cmocka_unit_test(four_threads_straight_to_disk),
                                     cmocka_unit_test(four_threads_promote_remove_and_touch),
                                     cmocka_unit_test(four_threads_promote_straight)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
