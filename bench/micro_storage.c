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
 * checksums, and the tier-map bookkeeping. Each round runs the four passes
 * in a rotated order, so drift and the place in a round hit all alike; each
 * pass counts by its median round (a shared disk swings single rounds by
 * several times). CPU seconds per GB of each side are in the row's detail (--json):
 * with them, a missed row says whether kvtier ran out of CPU (copy and
 * checksums) or waited on the disk like the raw passes. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bench.h"
#include "store/record.h"
#include "util/clock.h"

#define BLOCK_BYTES (2u << 20)
#define BT 16u
#define RAW_QD 32u
#define ENGINE_BLOCKS 32u
#define CHAIN 256u
#define ROUNDS 5 /* odd: the median is a round that was measured */
#define TMPFS_MAGIC_ 0x01021994

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int is_tmpfs(const char *dir) {
  struct statfs sf;
  return statfs(dir, &sf) == 0 && sf.f_type == TMPFS_MAGIC_;
}

/* --dir, else $TMPDIR, else /var/tmp: the first that is not tmpfs (as the
 * disk section chooses). */
static const char *pick_dir(const kvt_bench_micro_opts *o) {
  if (o->dir) return o->dir;
  const char *t = getenv("TMPDIR");
  if (t && !is_tmpfs(t)) return t;
  if (!is_tmpfs("/var/tmp")) return "/var/tmp";
  return t ? t : "/tmp";
}

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

/* One batch of every block, put (new keys of this round) or got. A put
 * first removes the blocks of the round before (untimed), so it measures
 * writes alone, never the making of room. */
static double storage_pass(sbench *b, int get, uint32_t round) {
  if (!get) {
    kvt_remove(b->c, b->keys, b->n, NULL);
    uint64_t *ids = malloc(b->n * sizeof *ids);
    if (!ids) return -1;
    for (uint64_t i = 0; i < b->n; i++) ids[i] = ((uint64_t)round << 32) | i;
    kvt_keys_from_opaque(b->c, ids, sizeof *ids, b->n, b->keys);
    free(ids);
  }
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = (uint32_t)b->n;
  bt.keys = b->keys;
  bt.pieces = b->pieces;
  bt.flags = KVT_KEYS_OPAQUE;
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

static double thread_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* What staging costs per GB, in CPU time of this thread (so other load on
 * the machine does not count): the copy of a block between engine memory
 * and a record, and the payload's checksum. */
static void staging_costs(const sbench *b, char *rec, double *copy_s, double *sum_s) {
  uint64_t acc = 0;
  double gb = 4.0 * ENGINE_BLOCKS * BLOCK_BYTES / 1e9, t0 = thread_cpu_now();
  for (uint32_t i = 0; i < 4 * ENGINE_BLOCKS; i++)
    memcpy(rec, b->engine + (size_t)(i % ENGINE_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES);
  double t1 = thread_cpu_now();
  for (uint32_t i = 0; i < 4 * ENGINE_BLOCKS; i++)
    acc += XXH3_64bits(b->engine + (size_t)(i % ENGINE_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES);
  double t2 = thread_cpu_now();
  *copy_s = (t1 - t0) / gb;
  *sum_s = acc == 1 ? 0 : (t2 - t1) / gb; /* acc keeps the sums from being optimized out */
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n odd: a measured round), with the worst and best. */
static double median(const double *v, int n, double *lo, double *hi) {
  double s[ROUNDS];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  *lo = s[0];
  *hi = s[n - 1];
  return s[n / 2];
}

static int disk_rows(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  char path[4200];
  snprintf(path, sizeof path, "%s/kvtier-bench-storage.kvt", pick_dir(o));
  sbench b = {.n = o->quick ? 32 : 128};
  size_t rec = kvt__record_bytes(BT, BLOCK_BYTES);
  char *raw = NULL;
  int rc = posix_memalign((void **)&b.engine, 2u << 20, (size_t)ENGINE_BLOCKS * BLOCK_BYTES) ? -ENOMEM : 0;
  if (rc == 0 && posix_memalign((void **)&raw, KVT_RECORD_ALIGN, RAW_QD * rec)) rc = -ENOMEM;
  b.keys = calloc(b.n, sizeof *b.keys);
  b.pieces = malloc(b.n * sizeof *b.pieces);
  if (!b.keys || !b.pieces) rc = -ENOMEM;
  if (rc == 0) {
    memset(b.engine, 0x5a, (size_t)ENGINE_BLOCKS * BLOCK_BYTES);
    memset(raw, 0xa5, RAW_QD * rec);
    rc = open_storage(&b, path);
  }
  /* Passes: raw write, put, raw read, get (a get reads the last put). */
  double gbs[4][ROUNDS], cpu[4][ROUNDS];
  int rounds = o->quick ? 3 : ROUNDS;
  for (int r = 0; rc == 0 && r < rounds; r++) {
    /* Alternate rounds put kvtier or raw first. The raw writes land on
     * kvtier's slots, so a get always follows its put before them. */
    static const int orders[2][4] = {{0, 1, 2, 3}, {1, 3, 0, 2}};
    const int *order = orders[r & 1];
    for (int k = 0; k < 4 && rc == 0; k++) {
      int p = order[k];
      double c0 = cpu_now();
      double v = p == 0 ? raw_pass(path, 1, b.n, rec, raw)
                 : p == 1 ? storage_pass(&b, 0, (uint32_t)r)
                 : p == 2 ? raw_pass(path, 0, b.n, rec, raw)
                          : storage_pass(&b, 1, (uint32_t)r);
      if (v < 0) rc = -EIO;
      gbs[p][r] = v;
      cpu[p][r] = v > 0 ? (cpu_now() - c0) / ((double)b.n * BLOCK_BYTES / 1e9) : 0;
    }
    kvt_bench_progress("storage", (r + 1.0) / rounds);
  }
  if (rc == 0) {
    double med[4], lo[4], hi[4], cmed[4];
    for (int p = 0; p < 4; p++) {
      med[p] = median(gbs[p], rounds, &lo[p], &hi[p]);
      double clo, chi;
      cmed[p] = median(cpu[p], rounds, &clo, &chi);
    }
    double copy_s = 0, sum_s = 0;
    staging_costs(&b, raw, &copy_s, &sum_s);
    static const char *name[2] = {"put-from 2 MiB blocks, engine memory -> disk",
                                  "get-into 2 MiB blocks, disk -> engine memory"};
    for (int w = 0; w < 2; w++) {
      int raw_p = w ? 2 : 0, kv = w ? 3 : 1;
      char note[160], detail[512];
      snprintf(note, sizeof note, "limit: raw O_DIRECT io_uring %s of the same records, same file, best of depth "
               "8/32; medians of %d rounds", w ? "reads" : "writes", rounds);
      snprintf(detail, sizeof detail, "GB/s median (worst..best): kvtier %.3f (%.3f..%.3f), raw %.3f (%.3f..%.3f); "
               "cpu-s/GB median: kvtier %.3f, raw %.3f; of kvtier's, a staging copy costs %.3f and a checksum %.3f "
               "(thread CPU here)", med[kv], lo[kv], hi[kv], med[raw_p], lo[raw_p], hi[raw_p], cmed[kv], cmed[raw_p],
               copy_s, sum_s);
      kvt_bench_row(rows, name[w], "GB/s", med[kv], med[raw_p], 0.9, note);
      kvt_bench_row_detail(rows, detail);
    }
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
