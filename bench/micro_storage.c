/* kvtier-bench micro, section "storage": storage mode (the engine owns its
 * memory) next to the machine's limit, in the same run:
 *
 *   put-from   2 MiB blocks from registered engine host memory to the disk
 *              tier (no host tier: engine memory straight to disk), vs raw
 *              O_DIRECT io_uring writes of whole records (the better of
 *              queue depth 8 and 32),
 *              on the same file
 *   get-into   the same blocks back from disk into engine memory, vs raw
 *              O_DIRECT io_uring reads of the same records
 *   exists     kvt_exists of whole 256-block chains over 1M resident keys
 *              (the tier map shared by both modes, filled through owner
 *              mode's metadata-only path), vs a goal of 10M keys/s
 *
 * kvtier's side includes everything it does per block: the copy between
 * the engine's memory and a staging record (header, tokens, payload), the
 * checksums, and the tier-map bookkeeping. Rounds alternate raw and kvtier;
 * the best round of each counts. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "store/record.h"
#include "util/clock.h"

#define BLOCK_BYTES (2u << 20)
#define BT 16u
#define RAW_QD 32u
#define ENGINE_BLOCKS 32u
#define CHAIN 256u

static double secs_since(int64_t t0) { return (kvt__now_ns() - t0) * 1e-9; }

/* Raw O_DIRECT io_uring over n records of the file (the limit). */
static double raw_pass_qd(const char *path, int write, uint64_t n, size_t rec, char *bufs, uint32_t qd) {
  int fd = open(path, O_RDWR | O_DIRECT);
  if (fd < 0) fd = open(path, O_RDWR); /* a file system without O_DIRECT: both sides buffered */
  if (fd < 0) return -1;
  struct io_uring ring;
  if (io_uring_queue_init(qd, &ring, 0) != 0) {
    close(fd);
    return -1;
  }
  int64_t t0 = kvt__now_ns();
  uint64_t sent = 0, done = 0;
  int bad = 0;
  while (done < n && !bad) {
    while (sent < n && sent - done < qd) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      char *buf = bufs + (sent % qd) * rec;
      off_t off = (off_t)(KVT_RECORD_ALIGN + sent * rec);
      if (write) io_uring_prep_write(sqe, fd, buf, (unsigned)rec, off);
      else io_uring_prep_read(sqe, fd, buf, (unsigned)rec, off);
      sent++;
    }
    io_uring_submit(&ring);
    struct io_uring_cqe *cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) break;
    bad |= cqe->res != (int)rec;
    io_uring_cqe_seen(&ring, cqe);
    done++;
  }
  double s = secs_since(t0);
  io_uring_queue_exit(&ring);
  close(fd);
  return bad ? -1 : (double)n * BLOCK_BYTES / s / 1e9;
}

/* The limit: the better of depth 8 and depth 32. */
static double raw_pass(const char *path, int write, uint64_t n, size_t rec, char *bufs) {
  double a = raw_pass_qd(path, write, n, rec, bufs, 8), b = raw_pass_qd(path, write, n, rec, bufs, RAW_QD);
  return a < 0 || b < 0 ? -1 : a > b ? a : b;
}

typedef struct sbench {
  kvt_cache *c;
  char *engine;
  kvt_region reg;
  uint64_t n;
  kvt_key *keys;
  kvt_piece *pieces;
} sbench;

/* One batch of every block, put (new keys of this round) or got. */
static double storage_pass(sbench *b, int get, uint32_t round) {
  uint64_t *ids = malloc(b->n * sizeof *ids);
  if (!ids) return -1;
  for (uint64_t i = 0; i < b->n; i++) ids[i] = ((uint64_t)round << 32) | i;
  kvt_keys_from_opaque(b->c, ids, sizeof *ids, b->n, b->keys);
  free(ids);
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = (uint32_t)b->n;
  bt.keys = b->keys;
  bt.pieces = b->pieces;
  kvt_job job;
  int64_t t0 = kvt__now_ns();
  int rc = get ? kvt_get_into(b->c, &bt, &job) : kvt_put_from(b->c, &bt, &job);
  if (rc != 1) return -1;
  rc = kvt_storage_wait(b->c, job, -1);
  double s = secs_since(t0);
  uint32_t ok = 0;
  kvt_storage_results(b->c, job, NULL, 0, &ok);
  kvt_storage_release(b->c, job);
  return rc == 0 && ok == b->n ? (double)b->n * BLOCK_BYTES / s / 1e9 : -1;
}

static int open_storage(sbench *b, const char *path) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "bench-storage";
  cfg.block_tokens = BT;
  cfg.host_blocks = 0;
  cfg.disk_path = path;
  cfg.disk_blocks = b->n;
  cfg.disk_reset = 1;
  cfg.copy_threads = 2;
  int rc = kvt_open(&cfg, &b->c);
  kvt_segment seg = {.bytes = BLOCK_BYTES};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.segments = &seg;
  l.flags = KVT_LAYOUT_STORAGE;
  if (rc == 0) rc = kvt_register_layout(b->c, &l);
  if (rc == 0) rc = kvt_register_memory(b->c, b->engine, (size_t)ENGINE_BLOCKS * BLOCK_BYTES, KVT_MEM_HOST, &b->reg);
  for (uint64_t i = 0; rc == 0 && i < b->n; i++)
    b->pieces[i] = (kvt_piece){.region = b->reg, .offset = (i % ENGINE_BLOCKS) * BLOCK_BYTES, .len = BLOCK_BYTES};
  return rc;
}

static int disk_rows(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  char path[4200];
  snprintf(path, sizeof path, "%s/kvtier-bench-storage.kvt", o->dir);
  sbench b = {.n = o->quick ? 32 : 128};
  size_t rec = kvt__record_bytes(BT, BLOCK_BYTES);
  char *raw = NULL;
  int rc = posix_memalign((void **)&b.engine, 2u << 20, (size_t)ENGINE_BLOCKS * BLOCK_BYTES) ? -ENOMEM : 0;
  if (rc == 0 && posix_memalign((void **)&raw, KVT_RECORD_ALIGN, RAW_QD * rec)) rc = -ENOMEM;
  b.keys = malloc(b.n * sizeof *b.keys);
  b.pieces = malloc(b.n * sizeof *b.pieces);
  if (!b.keys || !b.pieces) rc = -ENOMEM;
  if (rc == 0) {
    memset(b.engine, 0x5a, (size_t)ENGINE_BLOCKS * BLOCK_BYTES);
    memset(raw, 0xa5, RAW_QD * rec);
    rc = open_storage(&b, path);
  }
  double best[4] = {0, 0, 0, 0}; /* raw write, put, raw read, get */
  int rounds = o->quick ? 2 : 3;
  for (int r = 0; rc == 0 && r < rounds; r++) {
    double v[4] = {raw_pass(path, 1, b.n, rec, raw), storage_pass(&b, 0, (uint32_t)r),
                   raw_pass(path, 0, b.n, rec, raw), storage_pass(&b, 1, (uint32_t)r)};
    for (int k = 0; k < 4; k++) {
      if (v[k] < 0) rc = -EIO;
      if (v[k] > best[k]) best[k] = v[k];
    }
    kvt_bench_progress("storage", (r + 1.0) / rounds);
  }
  if (rc == 0) {
    kvt_bench_row(rows, "put-from 2 MiB blocks, engine memory -> disk", "GB/s", best[1], best[0], 0.9,
                  "limit: raw O_DIRECT io_uring writes of the same records, best of depth 8/32, same file");
    kvt_bench_row(rows, "get-into 2 MiB blocks, disk -> engine memory", "GB/s", best[3], best[2], 0.9,
                  "limit: raw O_DIRECT io_uring reads of the same records, best of depth 8/32, same file");
  }
  kvt_close(b.c);
  unlink(path);
  free(b.engine);
  free(raw);
  free(b.keys);
  free(b.pieces);
  return rc;
}

/* kvt_exists over 1M resident keys: whole chains, every key found. */
static int exists_row(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  uint32_t n_chains = (o->quick ? (1u << 16) : (1u << 20)) / CHAIN;
  size_t n = (size_t)n_chains * CHAIN;
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "bench-exists";
  cfg.block_tokens = BT;
  cfg.device = KVT_DEVICE_HOST;
  cfg.max_job_blocks = CHAIN;
  kvt_cache *c = NULL;
  int rc = kvt_open(&cfg, &c);
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.num_slots = (uint32_t)n;
  l.flags = KVT_LAYOUT_METADATA_ONLY;
  if (rc == 0) rc = kvt_register_layout(c, &l);
  uint64_t *ids = malloc(n * sizeof *ids);
  kvt_key *keys = malloc(n * sizeof *keys);
  uint32_t *slots = malloc(CHAIN * sizeof *slots);
  if (!ids || !keys || !slots) rc = -ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++) ids[i] = i * 0x9e3779b97f4a7c15ull;
  if (rc == 0) rc = kvt_keys_from_opaque(c, ids, sizeof *ids, n, keys);
  for (uint32_t ch = 0; rc == 0 && ch < n_chains; ch++) { /* make every key resident */
    kvt_req req;
    rc = kvt_acquire(c, keys + (size_t)ch * CHAIN, NULL, CHAIN, 0, 0, 0, &req, slots, NULL);
    if (rc == 0) rc = kvt_commit(c, req, CHAIN, NULL);
    if (rc == 0) rc = kvt_release(c, req);
  }
  uint64_t found = 0, rng = 88172645463325252ull;
  double t = 0;
  int64_t t0 = kvt__now_ns();
  kvt_lookup_result lr = {.size = sizeof lr};
  while (rc == 0 && (t = secs_since(t0)) < o->seconds / 2) {
    for (int i = 0; i < 64 && rc == 0; i++) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      rc = kvt_exists(c, NULL, keys + (rng % n_chains) * CHAIN, CHAIN, 0, &lr, NULL);
      found += lr.n_prefix;
    }
  }
  if (rc == 0) {
    char name[80];
    snprintf(name, sizeof name, "kvt_exists, %zuM resident, batches of %u", n >> 20 ? n >> 20 : 1, CHAIN);
    if (!(n >> 20)) snprintf(name, sizeof name, "kvt_exists, %zuK resident, batches of %u", n >> 10, CHAIN);
    kvt_bench_row(rows, name, "Mkeys/s", (double)found / t / 1e6, 10.0, 1.0,
                  "keys found per second, one thread; limit: a goal of 10M");
  }
  free(ids);
  free(keys);
  free(slots);
  kvt_close(c);
  return rc;
}

static int micro_storage(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  int rc = exists_row(o, rows);
  return rc ? rc : disk_rows(o, rows);
}

KVT_BENCH_MICRO(storage, micro_storage)
