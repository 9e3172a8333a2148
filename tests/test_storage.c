/* Storage mode: blocks put from and got into the engine's own memory, over
 * the host and disk tiers. Byte-exact round trips (aligned and unaligned
 * pieces, one and many per block), skips of keys already stored, the
 * cascade, per-block results under injected I/O errors, corrupt records and
 * token mismatches, removal, collection of finished jobs, and recovery of
 * blocks put through storage mode after a reopen. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "kvtier/backend.h"
#include "kvtier/kvtier.h"
#include "store/record.h"
#include "util/fault.h"

#define BT 16
#define NSEG 4
static const size_t seg_bytes[NSEG] = {1000, 3000, 4096, 8288}; /* 16384 in all */
#define BLOCK 16384u
#define NB 12

static char path[4200];
static kvt_disk_backend backend = KVT_DISK_AUTO;

typedef struct sfix {
  kvt_cache *c;
  char *mem;  /* the engine's pool: NB blocks, each at an odd offset */
  kvt_key keys[NB];
  uint32_t tokens[NB * BT];
} sfix;

static kvt_cache *open_storage(uint32_t host, uint64_t disk, int reset) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "storage-test";
  cfg.block_tokens = BT;
  cfg.host_blocks = host;
  cfg.copy_threads = 2;
  /* A file of its own for each fresh start (a reopen takes the last one):
   * a test that fails leaves its cache open, holding its file's lock, and
   * the tests after it must not fail for that. */
  static unsigned files;
  if (reset) snprintf(path, sizeof path, "%s/storage-%u.kvt", kvt_test_tmpdir(), files++);
  cfg.disk_path = disk ? path : NULL;
  cfg.disk_blocks = disk;
  cfg.disk_reset = reset;
  cfg.disk_backend = backend;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_segment seg[NSEG];
  for (int i = 0; i < NSEG; i++) seg[i] = (kvt_segment){NULL, 0, seg_bytes[i]};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 2;
  l.segments_per_layer = 2;
  l.num_slots = 0;
  l.segments = seg;
  l.flags = KVT_LAYOUT_STORAGE;
  assert_int_equal(kvt_register_layout(c, &l), 0);
  assert_int_equal(kvt_block_bytes(c), BLOCK);
  return c;
}

static void sfix_open(sfix *f, uint32_t host, uint64_t disk, int reset) {
  memset(f, 0, sizeof *f);
  f->c = open_storage(host, disk, reset);
  f->mem = malloc((size_t)NB * (BLOCK + 64) + 64);
  assert_non_null(f->mem);
  for (uint32_t i = 0; i < NB * BT; i++) f->tokens[i] = 1000 + i * 7;
  size_t n = 0;
  assert_int_equal(kvt_hash_tokens(f->c, NULL, f->tokens, NB * BT, f->keys, NB, &n), 0);
  assert_int_equal(n, NB);
}

static void sfix_close(sfix *f) {
  kvt_close(f->c);
  free(f->mem);
}

/* Block b in the engine's pool: 3 bytes past a 64-byte boundary. */
static char *blk(sfix *f, uint32_t b) { return f->mem + 3 + (size_t)b * (BLOCK + 64); }

/* Pieces of blocks [0, n): one per block, or the NSEG segments. */
static void make_pieces(sfix *f, uint32_t n, int many, kvt_piece *p) {
  for (uint32_t b = 0; b < n; b++) {
    if (!many) {
      p[b] = (kvt_piece){.ptr = blk(f, b), .len = BLOCK};
      continue;
    }
    size_t off = 0;
    for (int s = 0; s < NSEG; s++) {
      p[b * NSEG + s] = (kvt_piece){.ptr = blk(f, b) + off, .len = seg_bytes[s]};
      off += seg_bytes[s];
    }
  }
}

/* Runs batch b as a put or get to its end: the job's status, with its
 * per-block results in results[0..n) and the landed prefix in *n_ok. */
static int run_job(sfix *f, int get, const kvt_batch *b, uint32_t n, int32_t *results, uint32_t *n_ok) {
  kvt_job job = 0;
  assert_int_equal(get ? kvt_get_into(f->c, b, &job) : kvt_put_from(f->c, b, &job), 1);
  int st = kvt_storage_wait(f->c, job, -1);
  assert_int_equal(kvt_storage_results(f->c, job, results, n, n_ok), 0);
  assert_int_equal(kvt_storage_release(f->c, job), 0);
  return st;
}

static int do_batch(sfix *f, int get, uint32_t first, uint32_t n, int many, const uint32_t *tokens, uint32_t max,
                    int32_t *results, uint32_t *n_ok) {
  kvt_piece p[NB * NSEG];
  make_pieces(f, n, many, p);
  /* make_pieces numbers blocks from 0: shift to the batch's first block. */
  for (uint32_t i = 0; i < n * (many ? NSEG : 1); i++) p[i].ptr = (char *)p[i].ptr + (size_t)first * (BLOCK + 64);
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = n;
  b.keys = &f->keys[first];
  b.parent = first ? &f->keys[first - 1] : NULL;
  b.tokens = tokens;
  b.pieces = p;
  b.pieces_per_block = many ? NSEG : 1;
  b.max_blocks = max;
  return run_job(f, get, &b, n, results, n_ok);
}

static void fill_blocks(sfix *f, uint32_t n, uint64_t seed) {
  for (uint32_t b = 0; b < n; b++) kvt_test_fill(blk(f, b), BLOCK, seed * 100 + b);
}

static int blocks_match(sfix *f, uint32_t first, uint32_t n, uint64_t seed) {
  for (uint32_t b = first; b < first + n; b++)
    if (!kvt_test_check(blk(f, b), BLOCK, seed * 100 + b)) return 0;
  return 1;
}

static kvt_lookup_result exists(sfix *f, uint32_t n) {
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(f->c, NULL, f->keys, n, 0, &r, NULL), 0);
  return r;
}

static void round_trip(uint32_t host, int many) {
  sfix f;
  sfix_open(&f, host, 64, 1);
  int32_t res[NB];
  uint32_t ok = 0;
  fill_blocks(&f, NB, 1);
  assert_int_equal(do_batch(&f, 0, 0, NB, many, f.tokens, 0, res, &ok), 0);
  assert_int_equal(ok, NB);
  kvt_lookup_result r = exists(&f, NB);
  assert_int_equal(r.n_prefix, NB);
  assert_int_equal(r.n_host + r.n_disk, NB);
  if (host >= NB) assert_int_equal(r.n_host, NB);
  if (host == 0) assert_int_equal(r.n_disk, NB);
  /* A second put writes nothing: every block is skipped. */
  assert_int_equal(do_batch(&f, 0, 0, NB, many, f.tokens, 0, res, &ok), 0);
  for (int i = 0; i < NB; i++) assert_int_equal(res[i], 1);
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64) + 64);
  assert_int_equal(do_batch(&f, 1, 0, NB, !many, f.tokens, 0, res, &ok), 0);
  assert_int_equal(ok, NB);
  assert_true(blocks_match(&f, 0, NB, 1));
  sfix_close(&f);
}

static void round_trip_host_one_piece(void **s) { round_trip(NB, 0); }
static void round_trip_host_many_pieces(void **s) { round_trip(NB, 1); }
static void round_trip_disk_only_one_piece(void **s) { round_trip(0, 0); }
static void round_trip_disk_only_many_pieces(void **s) { round_trip(0, 1); }
static void round_trip_through_the_cascade(void **s) {
  round_trip(4, 1);
  sfix f;
  sfix_open(&f, 4, 64, 0);
  kvt_lookup_result r = exists(&f, NB); /* the reopen found the spilled ones */
  assert_true(r.n_disk >= NB - 4);
  sfix_close(&f);
}

/* Aligned pieces out of a registered region, by region + offset. */
static void registered_region_round_trip(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  char *pool = aligned_alloc(4096, (size_t)4 * BLOCK);
  assert_non_null(pool);
  kvt_region reg = 0;
  assert_int_equal(kvt_register_memory(f.c, pool, (size_t)4 * BLOCK, KVT_MEM_HOST, &reg), 0);
  assert_int_not_equal(reg, KVT_REGION_NONE);
  for (int b = 0; b < 4; b++) kvt_test_fill(pool + (size_t)b * BLOCK, BLOCK, 70 + b);
  kvt_piece p[4];
  for (int b = 0; b < 4; b++) p[b] = (kvt_piece){.region = reg, .offset = (uint64_t)b * BLOCK, .len = BLOCK};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = 4;
  bt.keys = f.keys;
  bt.pieces = p;
  kvt_job job;
  assert_int_equal(kvt_put_from(f.c, &bt, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  memset(pool, 0, (size_t)4 * BLOCK);
  assert_int_equal(kvt_get_into(f.c, &bt, &job), 1);
  /* Refused while the get is in flight; if the get has already finished,
   * the region goes now (either can happen: it races the I/O). */
  int unreg = kvt_unregister_memory(f.c, reg);
  if (unreg == 0)
    assert_int_not_equal(kvt_storage_poll(f.c, job), 1);
  else
    assert_int_equal(unreg, KVT_EBUSY);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  for (int b = 0; b < 4; b++) assert_true(kvt_test_check(pool + (size_t)b * BLOCK, BLOCK, 70 + b));
  if (unreg != 0) assert_int_equal(kvt_unregister_memory(f.c, reg), 0);
  assert_int_equal(kvt_unregister_memory(f.c, reg), KVT_ENOJOB);
  sfix_close(&f);
  free(pool);
}

/* max_blocks is the planner's k; blocks past the prefix are not loaded. */
static void get_stops_at_k_and_at_the_prefix(void **s) {
  sfix f;
  sfix_open(&f, NB, 0, 1);
  int32_t res[NB];
  uint32_t ok;
  fill_blocks(&f, 6, 2);
  assert_int_equal(do_batch(&f, 0, 0, 6, 0, NULL, 0, res, &ok), 0);
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64));
  assert_int_equal(do_batch(&f, 1, 0, NB, 0, NULL, 4, res, &ok), 0);
  assert_int_equal(ok, 4);
  for (int i = 0; i < NB; i++) assert_int_equal(res[i], i < 4 ? 0 : 1);
  assert_true(blocks_match(&f, 0, 4, 2));
  assert_int_equal(do_batch(&f, 1, 0, NB, 0, NULL, 0, res, &ok), 0);
  assert_int_equal(ok, 6);
  assert_int_equal(res[6], 1);
  assert_true(blocks_match(&f, 0, 6, 2));
  sfix_close(&f);
}

static void tokens_that_differ_fail_their_block(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  int32_t res[NB];
  uint32_t ok;
  fill_blocks(&f, 4, 3);
  assert_int_equal(do_batch(&f, 0, 0, 4, 0, f.tokens, 0, res, &ok), 0);
  uint32_t other[NB * BT];
  memcpy(other, f.tokens, sizeof other);
  other[2 * BT + 5] ^= 1;
  assert_int_equal(do_batch(&f, 1, 0, 4, 0, other, 0, res, &ok), KVT_EMISMATCH);
  assert_int_equal(ok, 2);
  assert_int_equal(res[2], KVT_EMISMATCH);
  assert_int_equal(res[3], 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.verify_mismatches, 1);
  sfix_close(&f);
}

static int fail_io(void *ctx, int site, int64_t arg) { return site == KVT_FAULT_IO_COMPLETE ? -EIO : 0; }

static void io_errors_fail_their_blocks_only(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  int32_t res[NB];
  uint32_t ok;
  fill_blocks(&f, 8, 4);
  kvt__fault_set(fail_io, NULL);
  assert_int_equal(do_batch(&f, 0, 0, 4, 0, NULL, 0, res, &ok), -EIO);
  kvt__fault_set(NULL, NULL);
  for (int i = 0; i < 4; i++) assert_int_equal(res[i], -EIO);
  assert_int_equal(exists(&f, 4).n_prefix, 0); /* nothing half-stored */
  assert_int_equal(do_batch(&f, 0, 0, 8, 0, NULL, 0, res, &ok), 0); /* stored anew */
  assert_int_equal(ok, 8);
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64));
  kvt__fault_set(fail_io, NULL);
  assert_int_equal(do_batch(&f, 1, 0, 8, 0, NULL, 0, res, &ok), -EIO);
  kvt__fault_set(NULL, NULL);
  for (int i = 0; i < 8; i++) assert_int_equal(res[i], -EIO);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_true(st.io_errors >= 12);
  assert_int_equal(exists(&f, 8).n_prefix, 0); /* failed records are dropped */
  sfix_close(&f);
}

static void corrupt_records_are_counted_misses(void **s) {
  sfix f;
  sfix_open(&f, 0, 8, 1);
  int32_t res[NB];
  uint32_t ok;
  fill_blocks(&f, 4, 5);
  assert_int_equal(do_batch(&f, 0, 0, 4, 0, f.tokens, 0, res, &ok), 0);
  /* Flip a payload byte of every slot behind the cache's back. */
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  for (int slot = 0; slot < 8; slot++) {
    off_t at = 4096 + (off_t)slot * (off_t)rec + (off_t)kvt__record_prefix_bytes(BT) + 100;
    char b;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
  }
  fsync(fd);
  close(fd);
  assert_int_equal(do_batch(&f, 1, 0, 4, 0, f.tokens, 0, res, &ok), KVT_ECORRUPT);
  assert_int_equal(ok, 0);
  for (int i = 0; i < 4; i++) assert_int_equal(res[i], KVT_ECORRUPT);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.checksum_failures, 4);
  assert_int_equal(exists(&f, 4).n_prefix, 0);
  sfix_close(&f);
}

static void blocks_put_in_storage_mode_survive_a_reopen(void **s) {
  sfix f;
  sfix_open(&f, 2, 64, 1);
  int32_t res[NB];
  uint32_t ok;
  fill_blocks(&f, NB, 6);
  assert_int_equal(do_batch(&f, 0, 0, NB, 1, f.tokens, 0, res, &ok), 0);
  size_t removed = 0;
  sfix_close(&f);
  /* Host-only blocks are lost with the process; spilled ones come back. */
  sfix_open(&f, 0, 64, 0);
  kvt_lookup_result r = exists(&f, NB);
  assert_true(r.n_prefix >= NB - 2);
  assert_int_equal(r.n_disk, r.n_prefix);
  uint32_t n = r.n_prefix;
  assert_int_equal(do_batch(&f, 1, 0, NB, 0, f.tokens, 0, res, &ok), 0);
  assert_int_equal(ok, n);
  assert_true(blocks_match(&f, 0, n, 6));
  /* Removal tombstones the record: the next reopen does not bring it back. */
  assert_int_equal(kvt_remove(f.c, &f.keys[0], 1, &removed), 0);
  assert_int_equal(removed, 1);
  assert_int_equal(exists(&f, NB).n_prefix, 0);
  sfix_close(&f);
  sfix_open(&f, 0, 64, 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.disk_recovered, n - 1);
  assert_int_equal(exists(&f, NB).n_prefix, 0);
  kvt_lookup_result r2 = {.size = sizeof r2};
  assert_int_equal(kvt_exists(f.c, &f.keys[0], &f.keys[1], n - 1, 0, &r2, NULL), 0);
  assert_int_equal(r2.n_prefix, n - 1);
  sfix_close(&f);
}

static void finished_jobs_are_collected_once(void **s) {
  sfix f;
  sfix_open(&f, NB, 0, 1);
  fill_blocks(&f, NB, 7);
  kvt_piece p[NB];
  make_pieces(&f, NB, 0, p);
  kvt_job jobs[3];
  for (int j = 0; j < 3; j++) {
    kvt_batch b;
    kvt_batch_init(&b);
    b.n_blocks = 4;
    b.keys = &f.keys[4 * j];
    b.parent = j ? &f.keys[4 * j - 1] : NULL;
    b.pieces = &p[4 * j];
    assert_int_equal(kvt_put_from(f.c, &b, &jobs[j]), 1);
  }
  size_t got = 0, n;
  kvt_job done[8];
  int status[8];
  for (int spin = 0; got < 3 && spin < 100000; spin++) {
    assert_int_equal(kvt_storage_collect(f.c, &done[got], &status[got], 8 - got, &n), 0);
    got += n;
    if (!n) usleep(100);
  }
  assert_int_equal(got, 3);
  for (int j = 0; j < 3; j++) {
    assert_int_equal(status[j], 0);
    int found = 0;
    for (int k = 0; k < 3; k++) found += done[k] == jobs[j];
    assert_int_equal(found, 1);
    assert_int_equal(kvt_storage_release(f.c, jobs[j]), 0);
  }
  assert_int_equal(kvt_storage_collect(f.c, done, status, 8, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(exists(&f, NB).n_prefix, NB);
  sfix_close(&f);
}

/* Engine keys (vLLM: 32-byte hash + 4-byte group) stand alone: a block put
 * in a batch is found when asked about on its own, and got out of order. */
static void opaque_engine_keys_stand_alone(void **s) {
  sfix f;
  sfix_open(&f, NB, 0, 1);
  unsigned char raw[NB][36];
  for (int i = 0; i < NB; i++)
    for (int j = 0; j < 36; j++) raw[i][j] = (unsigned char)(i * 31 + j * 7 + 1);
  assert_int_equal(kvt_keys_from_opaque(f.c, raw, 36, NB, f.keys), 0);
  fill_blocks(&f, 6, 8);
  kvt_piece p[NB];
  make_pieces(&f, NB, 0, p);
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = 6;
  b.keys = f.keys;
  b.pieces = p;
  b.flags = KVT_KEYS_OPAQUE;
  kvt_job job;
  assert_int_equal(kvt_put_from(f.c, &b, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(f.c, NULL, &f.keys[3], 1, KVT_KEYS_OPAQUE, &r, NULL), 0);
  assert_int_equal(r.n_prefix, 1);
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, NB, KVT_KEYS_OPAQUE, &r, NULL), 0);
  assert_int_equal(r.n_prefix, 6);
  /* Blocks 4 and 1, in that order, into the first two buffers. */
  kvt_key two[2] = {f.keys[4], f.keys[1]};
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64));
  b.n_blocks = 2;
  b.keys = two;
  assert_int_equal(kvt_get_into(f.c, &b, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  assert_true(kvt_test_check(blk(&f, 0), BLOCK, 8 * 100 + 4));
  assert_true(kvt_test_check(blk(&f, 1), BLOCK, 8 * 100 + 1));
  sfix_close(&f);
}

/* A key being stored by an earlier job, or twice in one batch, is written
 * once: the later copies report 1 (skipped). */
static void keys_in_flight_are_not_written_twice(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  fill_blocks(&f, NB, 9);
  kvt_piece p[NB];
  make_pieces(&f, NB, 0, p);
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = 6;
  b.keys = f.keys;
  b.pieces = p;
  kvt_job first, second;
  assert_int_equal(kvt_put_from(f.c, &b, &first), 1);
  assert_int_equal(kvt_put_from(f.c, &b, &second), 1); /* queued behind the first */
  assert_int_equal(kvt_storage_wait(f.c, second, -1), 0);
  assert_int_equal(kvt_storage_wait(f.c, first, -1), 0);
  int32_t r1[6], r2[6];
  assert_int_equal(kvt_storage_results(f.c, first, r1, 6, NULL), 0);
  assert_int_equal(kvt_storage_results(f.c, second, r2, 6, NULL), 0);
  for (int i = 0; i < 6; i++) {
    assert_int_equal(r1[i], 0);
    assert_int_equal(r2[i], 1);
  }
  kvt_storage_release(f.c, first);
  kvt_storage_release(f.c, second);
  kvt_key dup[3] = {f.keys[6], f.keys[6], f.keys[7]};
  b.n_blocks = 3;
  b.keys = dup;
  b.flags = KVT_KEYS_OPAQUE;
  assert_int_equal(kvt_put_from(f.c, &b, &first), 1);
  assert_int_equal(kvt_storage_wait(f.c, first, -1), 0);
  assert_int_equal(kvt_storage_results(f.c, first, r1, 3, NULL), 0);
  assert_int_equal(r1[0], 0);
  assert_int_equal(r1[1], 1);
  assert_int_equal(r1[2], 0);
  kvt_storage_release(f.c, first);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.resident_disk, 8);
  sfix_close(&f);
}

/* Owner mode's prefetch works on storage mode's tiers: disk blocks of a
 * prefix come up to kvtier's host pool ahead of the get. */
static void prefetch_promotes_disk_blocks_to_host(void **s) {
  sfix f;
  sfix_open(&f, 4, 64, 1);
  int32_t res[NB];
  uint32_t ok;
  fill_blocks(&f, NB, 10);
  assert_int_equal(do_batch(&f, 0, 0, NB, 0, f.tokens, 0, res, &ok), 0);
  kvt_drain(f.c);
  uint8_t tiers[NB];
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, NB, 0, &r, tiers), 0);
  assert_int_equal(r.n_prefix, NB);
  assert_int_equal(r.n_disk, NB - 4); /* the oldest blocks spilled */
  for (int i = 0; i < 3; i++) assert_int_equal(tiers[i], KVT_TIER_DISK);
  /* One call fetches what the host has room for; ask until nothing is left. */
  kvt_job job;
  int rc, fetched = 0;
  for (int round = 0; round < 20; round++) {
    rc = kvt_prefetch(f.c, f.keys, 3, &job);
    if (rc == 0) break;
    if (rc == KVT_EAGAIN) {
      kvt_drain(f.c);
      continue;
    }
    assert_int_equal(rc, 1);
    assert_int_equal(kvt_job_wait(f.c, job, -1), 0);
    assert_int_equal(kvt_job_release(f.c, job), 0);
    fetched++;
  }
  assert_int_equal(rc, 0);
  assert_true(fetched >= 1);
  r = exists(&f, 3);
  assert_int_equal(r.n_host, 3);
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64));
  assert_int_equal(do_batch(&f, 1, 0, 3, 0, f.tokens, 0, res, &ok), 0);
  assert_int_equal(ok, 3);
  assert_true(blocks_match(&f, 0, 3, 10));
  sfix_close(&f);
}

/* A get makes its blocks the most recent last block first, as owner mode's
 * release does: the tail of a chain is evicted before its ancestors. */
static void a_get_leaves_ancestors_more_recent_than_tails(void **s) {
  (void)s;
  sfix f;
  sfix_open(&f, 4, 0, 1);
  int32_t res[NB];
  uint32_t ok = 0;
  fill_blocks(&f, 5, 6);
  assert_int_equal(do_batch(&f, 0, 0, 4, 0, NULL, 0, res, &ok), 0);
  assert_int_equal(do_batch(&f, 1, 0, 4, 0, NULL, 0, res, &ok), 0);
  assert_int_equal(ok, 4);
  /* One more block: the host tier is full, its least recent block goes. */
  assert_int_equal(do_batch(&f, 0, 4, 1, 0, NULL, 0, res, &ok), 0);
  kvt_lookup_result r = exists(&f, 5);
  assert_int_equal(r.n_prefix, 3);
  uint8_t tiers[1];
  kvt_lookup_result one = {.size = sizeof one};
  assert_int_equal(kvt_exists(f.c, &f.keys[3], &f.keys[4], 1, 0, &one, tiers), 0);
  assert_int_equal(one.n_prefix, 1);
  sfix_close(&f);
}

/* kvt_touch makes the blocks held the most recent, last key first: with a
 * full host tier and no disk, the next put evicts an untouched block
 * instead. Chained keys touch the cached prefix only; opaque keys, every
 * key held. */
static void touch_makes_held_blocks_the_most_recent(void **s) {
  (void)s;
  sfix f;
  sfix_open(&f, 4, 0, 1);
  int32_t res[NB];
  uint32_t ok = 0;
  fill_blocks(&f, 5, 8);
  assert_int_equal(do_batch(&f, 0, 0, 4, 0, NULL, 0, res, &ok), 0); /* block 0 least recent */
  size_t n = 99;
  assert_int_equal(kvt_touch(f.c, NULL, f.keys, 2, 0, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(do_batch(&f, 0, 4, 1, 0, NULL, 0, res, &ok), 0); /* evicts block 2 */
  kvt_lookup_result one = {.size = sizeof one};
  assert_int_equal(exists(&f, 5).n_prefix, 2);
  assert_int_equal(kvt_exists(f.c, &f.keys[2], &f.keys[3], 2, 0, &one, NULL), 0);
  assert_int_equal(one.n_prefix, 2); /* blocks 3 and 4 stayed */
  /* Chained: the prefix ends at block 2 (gone). Opaque: each key alone. */
  assert_int_equal(kvt_touch(f.c, NULL, f.keys, 5, 0, &n), 0);
  assert_int_equal(n, 2);
  kvt_key some[3] = {f.keys[3], f.keys[2], f.keys[4]};
  assert_int_equal(kvt_touch(f.c, NULL, some, 3, KVT_KEYS_OPAQUE, &n), 0);
  assert_int_equal(n, 2);
  /* Now 0 and 1 are the least recent (touched before 3 and 4). */
  fill_blocks(&f, 8, 8);
  assert_int_equal(do_batch(&f, 0, 5, 2, 0, NULL, 0, res, &ok), 0);
  assert_int_equal(exists(&f, 2).n_prefix, 0);
  assert_int_equal(kvt_exists(f.c, &f.keys[2], &f.keys[3], 2, 0, &one, NULL), 0);
  assert_int_equal(one.n_prefix, 2);
  sfix_close(&f);
}

/* kvt_drain waits for storage jobs too: blocks put are in their tier when
 * it returns, before the engine has waited for the job itself. */
static void drain_waits_for_storage_jobs(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1); /* no host pool: every put is a disk write */
  fill_blocks(&f, NB, 7);
  kvt_piece p[NB];
  make_pieces(&f, NB, 0, p);
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = NB;
  b.keys = f.keys;
  b.tokens = f.tokens;
  b.pieces = p;
  b.pieces_per_block = 1;
  kvt_job job = 0;
  assert_int_equal(kvt_put_from(f.c, &b, &job), 1);
  assert_int_equal(kvt_drain(f.c), 0);
  assert_int_equal(kvt_storage_poll(f.c, job), 0); /* finished, as drain said */
  assert_int_equal(exists(&f, NB).n_disk, NB);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  sfix_close(&f);
}

/* kvt_stats.metadata_bytes counts a storage job's tables as they grow to
 * its batches: 28 bytes per block, 24 per piece and 4 per token at least,
 * and nothing more for a batch of the same size in the same job slot. */
static uint64_t metadata_now(kvt_cache *c) {
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0);
  return st.metadata_bytes;
}

static void metadata_counts_storage_job_tables(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  fill_blocks(&f, NB, 9);
  uint64_t fresh = metadata_now(f.c);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(do_batch(&f, 0, 0, NB, 1, f.tokens, NB, res, &ok), 0);
  uint64_t grown = metadata_now(f.c);
  assert_true(grown >= fresh + (uint64_t)NB * (28 + NSEG * 24 + BT * 4));
  assert_int_equal(do_batch(&f, 1, 0, NB, 1, f.tokens, NB, res, &ok), 0);
  assert_int_equal(ok, NB);
  assert_int_equal(metadata_now(f.c), grown);
  sfix_close(&f);
}

/* ---- the straight path: engine memory <-> file, no staging copy ---- */

/* Counts the storage requests submitted, by op (the fault hook sees every
 * one), and fails the `fail_nth` completion (1-based) with `fail_code`. */
typedef struct io_tally {
  atomic_int ops[KVT_IO_WRITEV_FIXED + 1];
  atomic_int completions;
  int fail_nth, fail_code;
  int refuse_register; /* the kernel's refusal of fixed buffers, injected */
} io_tally;

static int tally_hook(void *ctx, int site, int64_t arg) {
  io_tally *t = ctx;
  if (site == KVT_FAULT_IO_SUBMIT && arg >= 0 && arg <= KVT_IO_WRITEV_FIXED) atomic_fetch_add(&t->ops[arg], 1);
  if (site == KVT_FAULT_IO_COMPLETE && atomic_fetch_add(&t->completions, 1) + 1 == t->fail_nth) return t->fail_code;
  if (site == KVT_FAULT_IO_BUF_REGISTER) return t->refuse_register;
  return 0;
}

/* Records in pieces submitted: vectored, or as fixed-buffer ops. */
static int vec_ops(io_tally *t, int write) {
  return atomic_load(&t->ops[write ? KVT_IO_WRITEV : KVT_IO_READV]) +
         atomic_load(&t->ops[write ? KVT_IO_WRITEV_FIXED : KVT_IO_READV_FIXED]);
}

/* The straight path goes as fixed-buffer ops: io_uring on a kernel with
 * sparse buffer tables (5.19). */
static int fixed_expected(kvt_cache *c) {
  struct utsname u;
  int major = 0, minor = 0;
  if (strcmp(kvt_disk_backend_name(c), "io_uring") != 0 || uname(&u) != 0) return 0;
  sscanf(u.release, "%d.%d", &major, &minor);
  return major > 5 || (major == 5 && minor >= 19);
}

static void tally_start(io_tally *t, int fail_nth, int fail_code) {
  memset(t, 0, sizeof *t);
  t->fail_nth = fail_nth;
  t->fail_code = fail_code;
  kvt__fault_set(tally_hook, t);
}

/* The engine's registered pool: NB block places of 2 * BLOCK each, 4 KiB
 * aligned. A block is stored in one piece at the start of its place, or in
 * BLOCK / 4096 one-page pieces on every other page (no two adjacent). */
typedef struct pool {
  char *mem;
  kvt_region reg;
} pool;

#define PLACE (2u * BLOCK)
#define PAGES (BLOCK / 4096u)

static void pool_open(sfix *f, pool *p) {
  p->mem = aligned_alloc(4096, (size_t)NB * PLACE);
  assert_non_null(p->mem);
  memset(p->mem, 0, (size_t)NB * PLACE);
  assert_int_equal(kvt_register_memory(f->c, p->mem, (size_t)NB * PLACE, KVT_MEM_HOST_FIXED, &p->reg), 0);
}

static void pool_close(sfix *f, pool *p) {
  assert_int_equal(kvt_unregister_memory(f->c, p->reg), 0);
  free(p->mem);
}

/* Piece k of block b's place (many: page k on every other page). */
static uint64_t piece_off(uint32_t b, uint32_t k, int many) {
  return (uint64_t)b * PLACE + (many ? (uint64_t)k * 8192 : 0);
}

/* The engine's block bytes at place b <-> a contiguous image. */
static void pool_copy(pool *p, uint32_t b, int many, char *img, int to_pool) {
  for (uint32_t k = 0; k < (many ? PAGES : 1); k++) {
    char *at = p->mem + piece_off(b, k, many);
    size_t len = many ? 4096 : BLOCK;
    if (to_pool) memcpy(at, img + (size_t)k * 4096, len);
    else memcpy(img + (size_t)k * 4096, at, len);
  }
}

static void pool_fill(pool *p, uint32_t b, int many, uint64_t seed) {
  char img[BLOCK];
  kvt_test_fill(img, BLOCK, seed);
  pool_copy(p, b, many, img, 1);
}

static int pool_check(pool *p, uint32_t b, int many, uint64_t seed) {
  char img[BLOCK];
  pool_copy(p, b, many, img, 0);
  return kvt_test_check(img, BLOCK, seed);
}

/* How block i of a mixed batch is given: straight (registered, aligned),
 * registered at an offset O_DIRECT refuses, or by a pointer kvtier has not
 * registered; the last two are staged. */
enum { GIVE_STRAIGHT, GIVE_MISALIGNED, GIVE_UNREGISTERED };

static int pool_batch(sfix *f, pool *p, int get, uint32_t n, int many, const int *give, int32_t *res, uint32_t *ok) {
  kvt_piece pc[NB * PAGES];
  uint32_t ppb = many ? PAGES : 1;
  for (uint32_t b = 0; b < n; b++)
    for (uint32_t k = 0; k < ppb; k++) {
      uint64_t off = piece_off(b, k, many);
      int how = give ? give[b] : GIVE_STRAIGHT;
      size_t len = many ? 4096 : BLOCK;
      if (how == GIVE_UNREGISTERED) pc[b * ppb + k] = (kvt_piece){.ptr = blk(f, b) + (size_t)k * len, .len = len};
      else pc[b * ppb + k] = (kvt_piece){.region = p->reg, .offset = off, .len = len};
    }
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = n;
  bt.keys = f->keys;
  bt.tokens = f->tokens;
  bt.pieces = pc;
  bt.pieces_per_block = ppb;
  return run_job(f, get, &bt, n, res, ok);
}

/* Aligned pieces of registered memory go to the file and back in one
 * vectored I/O per block (no plain READ/WRITE of a staged record). */
static void straight_round_trip(int many) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  pool p;
  pool_open(&f, &p);
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, many, 300 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  io_tally t;
  tally_start(&t, 0, 0);
  assert_int_equal(pool_batch(&f, &p, 0, NB, many, NULL, res, &ok), 0);
  assert_int_equal(ok, NB);
  assert_int_equal(vec_ops(&t, 1), NB);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_WRITE]), 0);
  memset(p.mem, 0, (size_t)NB * PLACE);
  assert_int_equal(pool_batch(&f, &p, 1, NB, many, NULL, res, &ok), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ok, NB);
  assert_int_equal(vec_ops(&t, 0), NB);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_READ]), 0);
  for (uint32_t b = 0; b < NB; b++) assert_true(pool_check(&p, b, many, 300 + b));
  /* With io_uring every record went as fixed-buffer ops: the region and
   * the prefixes are in its table. */
  int fx = fixed_expected(f.c);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_WRITEV_FIXED]), fx ? NB : 0);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_READV_FIXED]), fx ? NB : 0);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_straight, 2 * NB);
  assert_int_equal(st.storage_blocks_fixed, fx ? 2 * NB : 0);
  /* Pages between the pieces were never written. */
  if (many)
    for (uint32_t b = 0; b < NB; b++)
      for (uint32_t k = 0; k < PAGES; k++)
        for (uint32_t i = 0; i < 4096; i += 512) assert_int_equal(p.mem[piece_off(b, k, 1) + 4096 + i], 0);
  pool_close(&f, &p);
  sfix_close(&f);
}

static void straight_round_trip_one_piece(void **s) { straight_round_trip(0); }
static void straight_round_trip_many_pieces(void **s) { straight_round_trip(1); }
static void straight_round_trip_on_the_thread_backend(void **s) {
  backend = KVT_DISK_THREADS; /* preadv / pwritev */
  straight_round_trip(1);
  backend = KVT_DISK_AUTO;
}

/* A fixed region's pages are faulted in before the backend pins them
 * under its submission lock, so that the cache's I/O is not held up behind
 * the page faults of memory never touched: when the registration reaches
 * the backend (the fault site), every page of such a region is resident. */
static struct {
  uint8_t *base;
  size_t len;
  long resident; /* pages resident at the fault site; -1: not reached */
} pf;

static int prefault_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  if (site != KVT_FAULT_IO_BUF_REGISTER || (size_t)arg != pf.len) return 0;
  size_t pages = pf.len / 4096;
  unsigned char *vec = malloc(pages);
  pf.resident = 0;
  if (vec && mincore(pf.base, pf.len, vec) == 0)
    for (size_t i = 0; i < pages; i++) pf.resident += vec[i] & 1;
  free(vec);
  return 0;
}

static void fixed_region_is_faulted_in_before_it_is_pinned(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  void *probe = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(probe != MAP_FAILED);
#ifdef MADV_POPULATE_WRITE
  int populate = madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
#else
  int populate = 0;
#endif
  munmap(probe, 4096);
  if (!fixed_expected(f.c) || !populate) {
    sfix_close(&f);
    skip(); /* no fixed buffers here, or a kernel before 5.14 */
  }
  pf.len = (size_t)8 << 20;
  pf.resident = -1;
  pf.base = mmap(NULL, pf.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(pf.base != MAP_FAILED);
  kvt__fault_set(prefault_hook, NULL);
  kvt_region r;
  int rc = kvt_register_memory(f.c, pf.base, pf.len, KVT_MEM_HOST_FIXED, &r);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(rc, 0);
  assert_int_equal(pf.resident, (long)(pf.len / 4096));
  assert_int_equal(kvt_unregister_memory(f.c, r), 0);
  munmap(pf.base, pf.len);
  sfix_close(&f);
}

/* A file the engine maps shared (a sparse one here) and registers as
 * fixed memory is not written by the registration: its holes stay holes
 * (no disk space taken, no page dirtied for writeback), whether or not the
 * kernel takes its pages as a fixed buffer. */
static void a_shared_file_mapping_registered_fixed_is_not_written(void **s) {
  (void)s;
  sfix f;
  sfix_open(&f, 0, 64, 1);
  char fpath[4200];
  snprintf(fpath, sizeof fpath, "%s/sparse.map", kvt_test_tmpdir());
  int fd = open(fpath, O_RDWR | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  const size_t len = (size_t)8 << 20;
  assert_int_equal(ftruncate(fd, (off_t)len), 0);
  void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(base != MAP_FAILED);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  const blkcnt_t before = st.st_blocks;
  kvt_region r;
  assert_int_equal(kvt_register_memory(f.c, base, len, KVT_MEM_HOST_FIXED, &r), 0);
  assert_int_equal(kvt_unregister_memory(f.c, r), 0);
  assert_int_equal(fstat(fd, &st), 0);
  const blkcnt_t after = st.st_blocks;
  munmap(base, len);
  close(fd);
  unlink(fpath);
  sfix_close(&f);
  assert_int_equal(after, before);
}

/* When the kernel refuses to register a region's pages (RLIMIT_MEMLOCK,
 * memory it cannot pin), its blocks still go straight, as one vectored
 * I/O each, byte-exact; registered again (the kernel takes it now), they
 * go as fixed-buffer ops. */
static void fixed_registration_refused_falls_back(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  int fx = fixed_expected(f.c);
  io_tally t;
  tally_start(&t, 0, 0);
  t.refuse_register = -ENOMEM;
  pool p;
  pool_open(&f, &p);
  t.refuse_register = 0;
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, 1, 350 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pool_batch(&f, &p, 0, NB, 1, NULL, res, &ok), 0);
  memset(p.mem, 0, (size_t)NB * PLACE);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 1, NULL, res, &ok), 0);
  assert_int_equal(ok, NB);
  for (uint32_t b = 0; b < NB; b++) assert_true(pool_check(&p, b, 1, 350 + b));
  assert_int_equal(atomic_load(&t.ops[KVT_IO_WRITEV]), NB);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_READV]), NB);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_WRITEV_FIXED]) + atomic_load(&t.ops[KVT_IO_READV_FIXED]), 0);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_straight, 2 * NB);
  assert_int_equal(st.storage_blocks_fixed, 0);
  /* The same memory registered again, and taken. */
  assert_int_equal(kvt_unregister_memory(f.c, p.reg), 0);
  assert_int_equal(kvt_register_memory(f.c, p.mem, (size_t)NB * PLACE, KVT_MEM_HOST_FIXED, &p.reg), 0);
  memset(p.mem, 0, (size_t)NB * PLACE);
  tally_start(&t, 0, 0);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 1, NULL, res, &ok), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ok, NB);
  for (uint32_t b = 0; b < NB; b++) assert_true(pool_check(&p, b, 1, 350 + b));
  assert_int_equal(atomic_load(&t.ops[KVT_IO_READV_FIXED]), fx ? NB : 0);
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_fixed, fx ? NB : 0);
  pool_close(&f, &p);
  sfix_close(&f);
}

/* Completions held by the fault hook while g_hold is set. */
static atomic_int g_hold, g_held;
static int hold_hook(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  if (site != KVT_FAULT_IO_DELAY_US) return 0;
  atomic_fetch_add(&g_held, 1);
  while (atomic_load(&g_hold)) usleep(200);
  return 0;
}

/* A region whose fixed-buffer I/O is in flight cannot be unregistered
 * (the job uses it: KVT_EBUSY); once the job is over it can, and the
 * memory can be registered again. */
static void unregister_while_fixed_io_in_flight(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  pool p;
  pool_open(&f, &p);
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, 0, 370 + b);
  kvt_piece pc[NB];
  for (uint32_t b = 0; b < NB; b++) pc[b] = (kvt_piece){.region = p.reg, .offset = piece_off(b, 0, 0), .len = BLOCK};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = NB;
  bt.keys = f.keys;
  bt.tokens = f.tokens;
  bt.pieces = pc;
  atomic_store(&g_held, 0);
  atomic_store(&g_hold, 1);
  kvt__fault_set(hold_hook, NULL);
  kvt_job job;
  assert_int_equal(kvt_put_from(f.c, &bt, &job), 1);
  while (atomic_load(&g_held) == 0) usleep(200);
  assert_int_equal(kvt_unregister_memory(f.c, p.reg), KVT_EBUSY);
  atomic_store(&g_hold, 0);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_fixed, fixed_expected(f.c) ? NB : 0);
  assert_int_equal(kvt_unregister_memory(f.c, p.reg), 0);
  assert_int_equal(kvt_register_memory(f.c, p.mem, (size_t)NB * PLACE, KVT_MEM_HOST_FIXED, &p.reg), 0);
  int32_t res[NB];
  uint32_t ok = 0;
  memset(p.mem, 0, (size_t)NB * PLACE);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 0, NULL, res, &ok), 0);
  assert_int_equal(ok, NB);
  for (uint32_t b = 0; b < NB; b++) assert_true(pool_check(&p, b, 0, 370 + b));
  pool_close(&f, &p);
  sfix_close(&f);
}

/* One batch mixing straight and staged blocks runs both paths; records
 * written straight read back staged and the other way round. */
static void straight_and_staged_blocks_in_one_batch(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  pool p;
  pool_open(&f, &p);
  int give[NB], other[NB];
  uint32_t straight = 0;
  for (uint32_t b = 0; b < NB; b++) {
    give[b] = (int)(b % 3);
    other[b] = give[b] == GIVE_STRAIGHT ? GIVE_UNREGISTERED : GIVE_STRAIGHT;
    straight += give[b] == GIVE_STRAIGHT;
  }
  /* Misaligned blocks sit 512 bytes into their place. */
  for (uint32_t b = 0; b < NB; b++) {
    char img[BLOCK];
    kvt_test_fill(img, BLOCK, 400 + b);
    if (give[b] == GIVE_UNREGISTERED) memcpy(blk(&f, b), img, BLOCK);
    else memcpy(p.mem + piece_off(b, 0, 0) + (give[b] == GIVE_MISALIGNED ? 512 : 0), img, BLOCK);
  }
  kvt_piece pc[NB];
  for (uint32_t b = 0; b < NB; b++)
    pc[b] = give[b] == GIVE_UNREGISTERED ? (kvt_piece){.ptr = blk(&f, b), .len = BLOCK}
            : (kvt_piece){.region = p.reg, .offset = piece_off(b, 0, 0) + (give[b] == GIVE_MISALIGNED ? 512 : 0),
                          .len = BLOCK};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = NB;
  bt.keys = f.keys;
  bt.tokens = f.tokens;
  bt.pieces = pc;
  kvt_job job;
  io_tally t;
  tally_start(&t, 0, 0);
  assert_int_equal(kvt_put_from(f.c, &bt, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  assert_int_equal(vec_ops(&t, 1), straight);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_WRITE]), NB - straight);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_straight, straight);
  assert_int_equal(st.storage_blocks_staged, NB - straight);
  /* Back with the kinds swapped: straight where it was staged. */
  memset(p.mem, 0, (size_t)NB * PLACE);
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64));
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pool_batch(&f, &p, 1, NB, 0, other, res, &ok), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ok, NB);
  assert_int_equal(vec_ops(&t, 0), NB - straight);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_READ]), straight);
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_straight, NB); /* straight + (NB - straight) */
  assert_int_equal(st.storage_blocks_staged, NB);
  for (uint32_t b = 0; b < NB; b++) {
    if (other[b] == GIVE_STRAIGHT) assert_true(pool_check(&p, b, 0, 400 + b));
    else assert_true(kvt_test_check(blk(&f, b), BLOCK, 400 + b));
  }
  pool_close(&f, &p);
  sfix_close(&f);
}

/* An I/O error or a short transfer on the straight path fails its own
 * block only: a failed put leaves nothing stored, a failed get reports
 * its block not landed while the others land byte-exact. */
static void straight_io_errors_fail_their_blocks(int code) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  pool p;
  pool_open(&f, &p);
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, 1, 500 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  io_tally t;
  tally_start(&t, 3, code);
  assert_int_equal(pool_batch(&f, &p, 0, NB, 1, NULL, res, &ok), -EIO);
  kvt__fault_set(NULL, NULL);
  int bad = -1, n_bad = 0;
  for (int b = 0; b < NB; b++)
    if (res[b]) bad = b, n_bad++;
  assert_int_equal(n_bad, 1);
  assert_int_equal(res[bad], -EIO);
  assert_int_equal(ok, (uint32_t)bad);
  assert_int_equal(exists(&f, NB).n_prefix, (uint32_t)bad);
  assert_int_equal(pool_batch(&f, &p, 0, NB, 1, NULL, res, &ok), 0); /* the failed one stored anew */
  for (int b = 0; b < NB; b++) assert_int_equal(res[b], b == bad ? 0 : 1);
  memset(p.mem, 0, (size_t)NB * PLACE);
  tally_start(&t, 5, code);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 1, NULL, res, &ok), -EIO);
  kvt__fault_set(NULL, NULL);
  n_bad = 0;
  for (int b = 0; b < NB; b++) {
    if (res[b]) bad = b, n_bad++;
    else assert_true(pool_check(&p, (uint32_t)b, 1, 500 + b));
  }
  assert_int_equal(n_bad, 1);
  assert_int_equal(res[bad], -EIO);
  assert_int_equal(ok, (uint32_t)bad);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.io_errors, 2);
  /* Failed blocks did not land: puts NB - 1, then the one again, gets NB - 1. */
  assert_int_equal(st.storage_blocks_straight, NB + NB - 1);
  assert_int_equal(st.storage_blocks_fixed, fixed_expected(f.c) ? NB + NB - 1 : 0);
  assert_int_equal(st.storage_blocks_staged, 0);
  pool_close(&f, &p);
  sfix_close(&f);
}

static void straight_io_error_fails_its_block(void **s) { straight_io_errors_fail_their_blocks(-EIO); }
static void straight_short_transfer_fails_its_block(void **s) { straight_io_errors_fail_their_blocks(8192); }

/* With a kvtier host pool, puts land there (a copy) and spill to disk as
 * whole records; a get of the blocks held only on disk reads them straight
 * into the engine's memory, the others are copied from the host pool. */
static void straight_gets_of_spilled_blocks(void **s) {
  sfix f;
  sfix_open(&f, 4, 64, 1);
  pool p;
  pool_open(&f, &p);
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, 0, 800 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pool_batch(&f, &p, 0, NB, 0, NULL, res, &ok), 0);
  assert_int_equal(ok, NB);
  kvt_drain(f.c);
  kvt_lookup_result r = exists(&f, NB);
  assert_int_equal(r.n_prefix, NB);
  assert_true(r.n_disk >= NB - 4);
  memset(p.mem, 0, (size_t)NB * PLACE);
  io_tally t;
  tally_start(&t, 0, 0);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 1, NULL, res, &ok), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ok, NB);
  assert_int_equal(vec_ops(&t, 0), r.n_disk);
  assert_int_equal(atomic_load(&t.ops[KVT_IO_READ]), 0);
  for (uint32_t b = 0; b < NB; b++) assert_true(pool_check(&p, b, 1, 800 + b));
  /* Only the gets from disk count: puts to the host pool and their spills do not. */
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_straight, r.n_disk);
  assert_int_equal(st.storage_blocks_staged, 0);
  pool_close(&f, &p);
  sfix_close(&f);
}

/* The disk slot holding key k (read behind the cache's back), or -1. */
static int slot_of(const kvt_key *k, uint64_t slots) {
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  int found = -1;
  for (uint64_t sl = 0; sl < slots && found < 0; sl++) {
    kvt__record_hdr h;
    assert_int_equal(pread(fd, &h, sizeof h, 4096 + (off_t)(sl * rec)), (ssize_t)sizeof h);
    if (h.key.lo == k->lo && h.key.hi == k->hi) found = (int)sl;
  }
  close(fd);
  return found;
}

static void flip_payload_byte(int slot, size_t at) {
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  off_t off = 4096 + (off_t)slot * (off_t)rec + (off_t)kvt__record_prefix_bytes(BT) + (off_t)at;
  char b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= 0x21;
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

/* A record that fails its checksum on the straight path fails its block
 * (the engine's bytes there are not to be used; the block is not landed),
 * is counted, and is dropped; the other blocks land byte-exact. The
 * checksum covers every piece: a byte flipped in the last one is caught. */
static void straight_checksum_failures_fail_their_blocks(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  pool p;
  pool_open(&f, &p);
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, 1, 600 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pool_batch(&f, &p, 0, NB, 1, NULL, res, &ok), 0);
  int s5 = slot_of(&f.keys[5], 64), s9 = slot_of(&f.keys[9], 64);
  assert_true(s5 >= 0 && s9 >= 0);
  flip_payload_byte(s5, 100);
  flip_payload_byte(s9, BLOCK - 1);
  memset(p.mem, 0, (size_t)NB * PLACE);
  io_tally t;
  tally_start(&t, 0, 0);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 1, NULL, res, &ok), KVT_ECORRUPT);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(vec_ops(&t, 0), NB);
  assert_int_equal(ok, 5);
  for (uint32_t b = 0; b < NB; b++) {
    if (b == 5 || b == 9) assert_int_equal(res[b], KVT_ECORRUPT);
    else assert_true(res[b] == 0 && pool_check(&p, b, 1, 600 + b));
  }
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.checksum_failures, 2);
  assert_int_equal(exists(&f, NB).n_prefix, 5); /* block 5's record was dropped */
  pool_close(&f, &p);
  sfix_close(&f);
}

/* ---- KVT_GET_PROMOTE ---- */

/* A get or put of blocks [first, first + n) with flags: the pool's aligned
 * places (straight) or the unaligned pool of sfix (staged). */
static int pro_batch(sfix *f, pool *p, int get, uint32_t first, uint32_t n, uint32_t flags, const uint32_t *tokens,
                     int32_t *res, uint32_t *ok) {
  kvt_piece pc[NB];
  for (uint32_t b = 0; b < n; b++)
    pc[b] = p ? (kvt_piece){.region = p->reg, .offset = piece_off(first + b, 0, 0), .len = BLOCK}
              : (kvt_piece){.ptr = blk(f, first + b), .len = BLOCK};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = n;
  bt.keys = &f->keys[first];
  bt.parent = first ? &f->keys[first - 1] : NULL;
  bt.tokens = tokens;
  bt.pieces = pc;
  bt.flags = flags;
  return run_job(f, get, &bt, n, res, ok);
}

static int pro_match(sfix *f, pool *p, uint32_t b, uint64_t seed) {
  return p ? pool_check(p, b, 0, seed) : kvt_test_check(blk(f, b), BLOCK, seed);
}

static void pro_clear(sfix *f, pool *p) {
  if (p) memset(p->mem, 0, (size_t)NB * PLACE);
  else memset(f->mem, 0, (size_t)NB * (BLOCK + 64) + 64);
}

/* Twelve blocks put through a host tier of 4: blocks 0-7 end on disk only. */
static void pro_setup(sfix *f, pool *p, int straight) {
  sfix_open(f, 4, 64, 1);
  if (straight) pool_open(f, p);
  for (uint32_t b = 0; b < NB; b++) {
    if (straight) pool_fill(p, b, 0, 900 + b);
    else kvt_test_fill(blk(f, b), BLOCK, 900 + b);
  }
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pro_batch(f, straight ? p : NULL, 0, 0, NB, 0, f->tokens, res, &ok), 0);
  assert_int_equal(ok, NB);
  kvt_drain(f->c);
  uint8_t tiers[NB];
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(f->c, NULL, f->keys, NB, 0, &r, tiers), 0);
  assert_int_equal(r.n_prefix, NB);
  for (uint32_t b = 0; b < NB - 4; b++) assert_int_equal(tiers[b], KVT_TIER_DISK);
}

static kvt_stats pro_stats(sfix *f) {
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f->c, &st), 0);
  return st;
}

/* Blocks a KVT_GET_PROMOTE get loads from disk also land in the host tier,
 * as the most recent there (the host's least recent blocks spill to make
 * room), with their tokens and bytes: the host copy serves the next get
 * even once the disk record is damaged. A plain get leaves them on disk. */
static void promoting_get(int straight) {
  sfix f;
  pool pl, *p = straight ? &pl : NULL;
  pro_setup(&f, &pl, straight);
  int32_t res[NB];
  uint32_t ok = 0;
  uint8_t tiers[NB];
  kvt_lookup_result r = {.size = sizeof r};
  pro_clear(&f, p);
  assert_int_equal(pro_batch(&f, p, 1, 0, 3, 0, f.tokens, res, &ok), 0);
  assert_int_equal(ok, 3);
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, 3, 0, &r, tiers), 0);
  assert_int_equal(r.n_disk, 3); /* a plain get promotes nothing */
  kvt_stats before = pro_stats(&f);
  pro_clear(&f, p);
  assert_int_equal(pro_batch(&f, p, 1, 0, 3, KVT_GET_PROMOTE, f.tokens, res, &ok), 0);
  assert_int_equal(ok, 3);
  for (uint32_t b = 0; b < 3; b++) assert_true(pro_match(&f, p, b, 900 + b));
  kvt_stats after = pro_stats(&f);
  assert_int_equal(after.blocks_disk2h - before.blocks_disk2h, 3);
  assert_int_equal(after.storage_blocks_straight - before.storage_blocks_straight, straight ? 3 : 0);
  assert_int_equal(after.resident_host, 4);
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, NB, 0, &r, tiers), 0);
  assert_int_equal(r.n_prefix, NB); /* the host's victims went to disk */
  assert_int_equal(r.n_host, 4);
  for (uint32_t b = 0; b < 3; b++) assert_int_equal(tiers[b], KVT_TIER_HOST);
  assert_int_equal(tiers[NB - 1], KVT_TIER_HOST); /* the most recent put stays */
  /* The host copies serve: damaged disk records are not read. */
  for (uint32_t b = 0; b < 3; b++) {
    int sl = slot_of(&f.keys[b], 64);
    assert_true(sl >= 0);
    flip_payload_byte(sl, 1000);
  }
  pro_clear(&f, p);
  before = pro_stats(&f);
  assert_int_equal(pro_batch(&f, p, 1, 0, 3, KVT_GET_PROMOTE, f.tokens, res, &ok), 0);
  assert_int_equal(ok, 3);
  for (uint32_t b = 0; b < 3; b++) assert_true(pro_match(&f, p, b, 900 + b));
  after = pro_stats(&f);
  assert_int_equal(after.checksum_failures, before.checksum_failures);
  assert_int_equal(after.blocks_disk2h, before.blocks_disk2h);
  /* The host copy kept the block's tokens: other tokens are refused. */
  uint32_t other[BT];
  memcpy(other, f.tokens, sizeof other);
  other[BT - 1] ^= 1;
  assert_int_equal(pro_batch(&f, p, 1, 0, 1, 0, other, res, &ok), KVT_EMISMATCH);
  if (p) pool_close(&f, p);
  sfix_close(&f);
}

static void promoting_get_staged(void **s) { promoting_get(0); }
static void promoting_get_straight(void **s) { promoting_get(1); }

/* A promoting get whose reads fail: the blocks fail (and their records are
 * dropped), and the host slots taken for them go back: a later promoting
 * get fills the whole host tier. */
static void promoting_get_io_errors_give_back_host_slots(void **s) {
  for (int straight = 0; straight < 2; straight++) {
    sfix f;
    pool pl, *p = straight ? &pl : NULL;
    pro_setup(&f, &pl, straight);
    int32_t res[NB];
    uint32_t ok = 0;
    kvt__fault_set(fail_io, NULL);
    assert_int_equal(pro_batch(&f, p, 1, 0, 4, KVT_GET_PROMOTE, f.tokens, res, &ok), -EIO);
    kvt__fault_set(NULL, NULL);
    for (int i = 0; i < 4; i++) assert_int_equal(res[i], -EIO);
    kvt_stats st = pro_stats(&f);
    assert_int_equal(st.resident_host, 0); /* made room for 4, none landed */
    assert_int_equal(exists(&f, NB).n_prefix, 0);
    pro_clear(&f, p);
    assert_int_equal(pro_batch(&f, p, 1, 4, 4, KVT_GET_PROMOTE, &f.tokens[4 * BT], res, &ok), 0);
    assert_int_equal(ok, 4);
    for (uint32_t b = 4; b < 8; b++) assert_true(pro_match(&f, p, b, 900 + b));
    st = pro_stats(&f);
    assert_int_equal(st.resident_host, 4);
    kvt_lookup_result r = {.size = sizeof r};
    assert_int_equal(kvt_exists(f.c, &f.keys[3], &f.keys[4], 4, 0, &r, NULL), 0);
    assert_int_equal(r.n_host, 4);
    if (p) pool_close(&f, p);
    sfix_close(&f);
  }
}

static int slow_io(void *ctx, int site, int64_t arg) {
  (void)ctx;
  (void)arg;
  return site == KVT_FAULT_IO_DELAY_US ? 300000 : 0;
}

/* The host slots a promoting get holds while its reads are in flight are
 * not evictable yet: a put that needs them waits for the get to land them
 * (then evicts them, as their disk copies stay) instead of failing for
 * want of room. */
static void a_put_waits_for_host_slots_a_promoting_get_holds(void **s) {
  sfix f;
  sfix_open(&f, 4, 64, 1);
  for (uint32_t b = 0; b < 8; b++) kvt_test_fill(blk(&f, b), BLOCK, 900 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pro_batch(&f, NULL, 0, 0, 8, 0, f.tokens, res, &ok), 0);
  kvt_drain(f.c);
  size_t gone = 0;
  assert_int_equal(kvt_remove(f.c, &f.keys[4], 4, &gone), 0); /* the host's 4, with no spill */
  assert_int_equal(gone, 4);
  assert_int_equal(exists(&f, 4).n_disk, 4);
  char *dst = malloc((size_t)4 * BLOCK);
  assert_non_null(dst);
  kvt_piece pc[4];
  for (uint32_t b = 0; b < 4; b++) pc[b] = (kvt_piece){.ptr = dst + (size_t)b * BLOCK, .len = BLOCK};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = 4;
  bt.keys = f.keys;
  bt.pieces = pc;
  bt.flags = KVT_GET_PROMOTE;
  kvt__fault_set(slow_io, NULL);
  kvt_job get = 0;
  assert_int_equal(kvt_get_into(f.c, &bt, &get), 1);
  usleep(100000); /* the get has taken the host's 4 slots; its reads are in flight */
  assert_int_equal(kvt_storage_poll(f.c, get), 1);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(pro_batch(&f, NULL, 0, 4, 1, 0, &f.tokens[4 * BT], res, &ok), 0);
  assert_int_equal(res[0], 0);
  assert_int_equal(kvt_storage_wait(f.c, get, -1), 0);
  assert_int_equal(kvt_storage_results(f.c, get, res, 4, &ok), 0);
  assert_int_equal(ok, 4);
  assert_int_equal(kvt_storage_release(f.c, get), 0);
  for (uint32_t b = 0; b < 4; b++) assert_true(kvt_test_check(dst + (size_t)b * BLOCK, BLOCK, 900 + b));
  assert_int_equal(exists(&f, 5).n_prefix, 5);
  free(dst);
  sfix_close(&f);
}

/* A promote is best effort: it spills the host's least recent blocks for
 * room, but never drops one whose only copy is on the host. With every
 * disk slot pinned by the get's own reads, those blocks cannot spill: the
 * get loads its blocks unpromoted and the host keeps its own. */
static void a_promote_never_drops_blocks_held_only_on_the_host(void **s) {
  sfix f;
  sfix_open(&f, 4, 8, 1);
  for (uint32_t b = 0; b < NB; b++) kvt_test_fill(blk(&f, b), BLOCK, 900 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pro_batch(&f, NULL, 0, 0, NB, 0, f.tokens, res, &ok), 0);
  assert_int_equal(ok, NB);
  kvt_drain(f.c);
  uint8_t tiers[NB];
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, NB, 0, &r, tiers), 0);
  assert_int_equal(r.n_prefix, NB);
  assert_int_equal(r.n_disk, 8);
  assert_int_equal(r.n_host, 4);
  pro_clear(&f, NULL);
  assert_int_equal(pro_batch(&f, NULL, 1, 0, 8, KVT_GET_PROMOTE, f.tokens, res, &ok), 0);
  assert_int_equal(ok, 8);
  for (uint32_t b = 0; b < 8; b++) assert_true(pro_match(&f, NULL, b, 900 + b));
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, NB, 0, &r, tiers), 0);
  assert_int_equal(r.n_prefix, NB); /* blocks 8-11 were not dropped */
  pro_clear(&f, NULL);
  assert_int_equal(pro_batch(&f, NULL, 1, 8, 4, 0, &f.tokens[8 * BT], res, &ok), 0);
  assert_int_equal(ok, 4);
  for (uint32_t b = 8; b < NB; b++) assert_true(pro_match(&f, NULL, b, 900 + b));
  sfix_close(&f);
}

/* Opaque keys may name a block twice: its host slot is taken once, and
 * room is made for the blocks promoted, not for the keys (a host block
 * evicted per duplicate would be evicted for nothing). */
static void a_key_twice_in_a_promoting_get_takes_one_host_slot(void **s) {
  sfix f;
  pro_setup(&f, NULL, 0); /* blocks 8-11 on the host, 0-7 on disk only */
  kvt_key dup[3] = {f.keys[0], f.keys[0], f.keys[1]};
  kvt_piece pc[3] = {{.ptr = blk(&f, 0), .len = BLOCK}, {.ptr = blk(&f, 1), .len = BLOCK},
                     {.ptr = blk(&f, 2), .len = BLOCK}};
  pro_clear(&f, NULL);
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = 3;
  bt.keys = dup;
  bt.pieces = pc;
  bt.flags = KVT_KEYS_OPAQUE | KVT_GET_PROMOTE;
  kvt_job job = 0;
  int32_t res[3];
  uint32_t ok = 0;
  assert_int_equal(kvt_get_into(f.c, &bt, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_results(f.c, job, res, 3, &ok), 0);
  assert_int_equal(ok, 3);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  assert_true(kvt_test_check(blk(&f, 0), BLOCK, 900) && kvt_test_check(blk(&f, 1), BLOCK, 900) &&
              kvt_test_check(blk(&f, 2), BLOCK, 901));
  kvt_stats st = pro_stats(&f);
  assert_int_equal(st.blocks_disk2h, 2);
  assert_int_equal(st.resident_host, 4); /* two promoted, two of 8-11 evicted */
  uint8_t tiers[NB];
  kvt_lookup_result r = {.size = sizeof r};
  assert_int_equal(kvt_exists(f.c, NULL, f.keys, NB, 0, &r, tiers), 0);
  assert_int_equal(r.n_prefix, NB);
  assert_int_equal(r.n_host, 4);
  assert_int_equal(tiers[0], KVT_TIER_HOST);
  assert_int_equal(tiers[1], KVT_TIER_HOST);
  sfix_close(&f);
}

/* KVT_GET_PROMOTE is a get's flag; a put refuses it. Without a host tier a
 * get ignores it. */
static void promote_is_a_get_flag(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  fill_blocks(&f, 2, 3);
  kvt_piece pc[2] = {{.ptr = blk(&f, 0), .len = BLOCK}, {.ptr = blk(&f, 1), .len = BLOCK}};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = 2;
  bt.keys = f.keys;
  bt.pieces = pc;
  bt.flags = KVT_GET_PROMOTE;
  kvt_job job = 0;
  assert_int_equal(kvt_put_from(f.c, &bt, &job), -EINVAL);
  bt.flags = 0x4;
  assert_int_equal(kvt_get_into(f.c, &bt, &job), -EINVAL);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pro_batch(&f, NULL, 0, 0, 2, 0, NULL, res, &ok), 0);
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64) + 64);
  assert_int_equal(pro_batch(&f, NULL, 1, 0, 2, KVT_GET_PROMOTE, NULL, res, &ok), 0);
  assert_int_equal(ok, 2);
  assert_true(blocks_match(&f, 0, 2, 3));
  assert_int_equal(exists(&f, 2).n_disk, 2);
  sfix_close(&f);
}

/* Blocks written straight are recovered after a reopen and read back
 * both ways. */
static void straight_blocks_survive_a_reopen(void **s) {
  sfix f;
  sfix_open(&f, 0, 64, 1);
  pool p;
  pool_open(&f, &p);
  for (uint32_t b = 0; b < NB; b++) pool_fill(&p, b, 0, 700 + b);
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(pool_batch(&f, &p, 0, NB, 0, NULL, res, &ok), 0);
  pool_close(&f, &p);
  sfix_close(&f);
  sfix_open(&f, 0, 64, 0);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(f.c, &st);
  assert_int_equal(st.disk_recovered, NB);
  assert_int_equal(exists(&f, NB).n_disk, NB);
  pool_open(&f, &p);
  assert_int_equal(pool_batch(&f, &p, 1, NB, 1, NULL, res, &ok), 0); /* straight, other pieces */
  assert_int_equal(ok, NB);
  for (uint32_t b = 0; b < NB; b++) assert_true(pool_check(&p, b, 1, 700 + b));
  memset(f.mem, 0, (size_t)NB * (BLOCK + 64));
  assert_int_equal(do_batch(&f, 1, 0, NB, 1, f.tokens, 0, res, &ok), 0); /* staged */
  assert_int_equal(ok, NB);
  assert_true(blocks_match(&f, 0, NB, 7)); /* seeds 700 + b */
  pool_close(&f, &p);
  sfix_close(&f);
}

/* A KVT_MEM_HOST region is not pinned: the engine may discard and refill
 * its pages while it is registered (an allocator giving memory back), and
 * puts and gets still move the bytes it holds now. */
static void plain_host_region_pages_may_be_replaced(void **s) {
  (void)s;
  sfix f;
  sfix_open(&f, 0, 64, 1);
  size_t len = (size_t)NB * PLACE;
  char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(mem != MAP_FAILED);
  memset(mem, 0x5a, len);
  kvt_region reg;
  assert_int_equal(kvt_register_memory(f.c, mem, len, KVT_MEM_HOST, &reg), 0);
  assert_int_equal(madvise(mem, len, MADV_DONTNEED), 0);
  kvt_piece pc[NB];
  for (uint32_t b = 0; b < NB; b++) {
    kvt_test_fill(mem + (size_t)b * PLACE, BLOCK, 990 + b);
    pc[b] = (kvt_piece){.region = reg, .offset = (uint64_t)b * PLACE, .len = BLOCK};
  }
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = NB;
  bt.keys = f.keys;
  bt.tokens = f.tokens;
  bt.pieces = pc;
  kvt_job job;
  int32_t res[NB];
  uint32_t ok = 0;
  assert_int_equal(kvt_put_from(f.c, &bt, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  memset(mem, 0, len);
  assert_int_equal(kvt_get_into(f.c, &bt, &job), 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_results(f.c, job, res, NB, &ok), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  assert_int_equal(ok, NB);
  for (uint32_t b = 0; b < NB; b++) assert_true(kvt_test_check(mem + (size_t)b * PLACE, BLOCK, 990 + b));
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.storage_blocks_fixed, 0); /* never pinned */
  assert_int_equal(kvt_unregister_memory(f.c, reg), 0);
  munmap(mem, len);
  sfix_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_host_one_piece),
      cmocka_unit_test(promoting_get_staged),
      cmocka_unit_test(promoting_get_straight),
      cmocka_unit_test(promoting_get_io_errors_give_back_host_slots),
      cmocka_unit_test(promote_is_a_get_flag),
      cmocka_unit_test(a_put_waits_for_host_slots_a_promoting_get_holds),
      cmocka_unit_test(a_promote_never_drops_blocks_held_only_on_the_host),
      cmocka_unit_test(a_key_twice_in_a_promoting_get_takes_one_host_slot),
      cmocka_unit_test(touch_makes_held_blocks_the_most_recent),
      cmocka_unit_test(round_trip_host_many_pieces),
      cmocka_unit_test(round_trip_disk_only_one_piece),
      cmocka_unit_test(round_trip_disk_only_many_pieces),
      cmocka_unit_test(round_trip_through_the_cascade),
      cmocka_unit_test(registered_region_round_trip),
      cmocka_unit_test(plain_host_region_pages_may_be_replaced),
      cmocka_unit_test(get_stops_at_k_and_at_the_prefix),
      cmocka_unit_test(tokens_that_differ_fail_their_block),
      cmocka_unit_test(io_errors_fail_their_blocks_only),
      cmocka_unit_test(corrupt_records_are_counted_misses),
      cmocka_unit_test(blocks_put_in_storage_mode_survive_a_reopen),
      cmocka_unit_test(finished_jobs_are_collected_once),
      cmocka_unit_test(opaque_engine_keys_stand_alone),
      cmocka_unit_test(keys_in_flight_are_not_written_twice),
      cmocka_unit_test(prefetch_promotes_disk_blocks_to_host),
      cmocka_unit_test(a_get_leaves_ancestors_more_recent_than_tails),
      cmocka_unit_test(drain_waits_for_storage_jobs),
      cmocka_unit_test(metadata_counts_storage_job_tables),
      cmocka_unit_test(straight_round_trip_one_piece),
      cmocka_unit_test(straight_round_trip_many_pieces),
      cmocka_unit_test(straight_round_trip_on_the_thread_backend),
      cmocka_unit_test(fixed_registration_refused_falls_back),
      cmocka_unit_test(unregister_while_fixed_io_in_flight),
      cmocka_unit_test(fixed_region_is_faulted_in_before_it_is_pinned),
      cmocka_unit_test(a_shared_file_mapping_registered_fixed_is_not_written),
      cmocka_unit_test(straight_and_staged_blocks_in_one_batch),
      cmocka_unit_test(straight_gets_of_spilled_blocks),
      cmocka_unit_test(straight_io_error_fails_its_block),
      cmocka_unit_test(straight_short_transfer_fails_its_block),
      cmocka_unit_test(straight_checksum_failures_fail_their_blocks),
      cmocka_unit_test(straight_blocks_survive_a_reopen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
