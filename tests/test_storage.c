/* Storage mode: blocks put from and got into the engine's own memory, over
 * the host and disk tiers. Byte-exact round trips (aligned and unaligned
 * pieces, one and many per block), skips of keys already stored, the
 * cascade, per-block results under injected I/O errors, corrupt records and
 * token mismatches, removal, collection of finished jobs, and recovery of
 * blocks put through storage mode after a reopen. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "kvtier/kvtier.h"
#include "store/record.h"
#include "util/fault.h"

#define BT 16
#define NSEG 4
static const size_t seg_bytes[NSEG] = {1000, 3000, 4096, 8288}; /* 16384 in all */
#define BLOCK 16384u
#define NB 12

static char path[4200];

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
  snprintf(path, sizeof path, "%s/storage.kvt", kvt_test_tmpdir());
  cfg.disk_path = disk ? path : NULL;
  cfg.disk_blocks = disk;
  cfg.disk_reset = reset;
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
  kvt_job job = 0;
  int rc = get ? kvt_get_into(f->c, &b, &job) : kvt_put_from(f->c, &b, &job);
  assert_int_equal(rc, 1);
  int st = kvt_storage_wait(f->c, job, -1);
  assert_int_equal(kvt_storage_results(f->c, job, results, n, n_ok), 0);
  assert_int_equal(kvt_storage_release(f->c, job), 0);
  return st;
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
  assert_int_equal(kvt_unregister_memory(f.c, reg) == KVT_EBUSY || kvt_storage_poll(f.c, job) != 1, 1);
  assert_int_equal(kvt_storage_wait(f.c, job, -1), 0);
  assert_int_equal(kvt_storage_release(f.c, job), 0);
  for (int b = 0; b < 4; b++) assert_true(kvt_test_check(pool + (size_t)b * BLOCK, BLOCK, 70 + b));
  assert_int_equal(kvt_unregister_memory(f.c, reg), 0);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_host_one_piece),
      cmocka_unit_test(round_trip_host_many_pieces),
      cmocka_unit_test(round_trip_disk_only_one_piece),
      cmocka_unit_test(round_trip_disk_only_many_pieces),
      cmocka_unit_test(round_trip_through_the_cascade),
      cmocka_unit_test(registered_region_round_trip),
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
