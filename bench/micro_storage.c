/* kvtier-bench micro, section "storage": storage mode (the engine owns its
 * memory) next to the machine's limit, in the same run:
 *
 *   put-from   2 MiB blocks from registered engine host memory to the disk
 *              tier (no host tier: the straight path, engine memory to the
 *              file in one vectored I/O per block), vs raw O_DIRECT
 *              io_uring writes of the same records on the same file (the
 *              best of whole records at queue depth 8, 32, and 32 with
 *              registered buffers, and the straight path's own vectored
 *              I/O from the engine's memory at 32); 512 blocks, 1 GiB, a
 *              pass
 *   get-into   the same blocks back from disk into engine memory, vs raw
 *              O_DIRECT io_uring reads of the same records
 *   exists     kvt_exists of whole 256-block chains over 1M resident keys
 *              (the tier map shared by both modes, filled through owner
 *              mode's metadata-only path), vs a goal of 10M keys/s
 *
 * kvtier's side includes everything it does per block: the checksums, the
 * header and tokens, and the tier-map bookkeeping. A third side puts and
 * gets the same blocks by unregistered pointers, so they go through
 * staging (a copy between the engine's memory and a staging record): the
 * row's detail (--json) sets its CPU next to the straight path's, with the
 * saving the copy's own cost predicts. Each round runs the four units (raw
 * writes, straight put+get, raw reads, staged put+get) starting at another
 * place, so drift and the place in a round hit all alike; each pass counts
 * by its median round (a shared disk swings single rounds by several
 * times). CPU seconds per GB are process CPU: with them, a missed row says
 * whether kvtier ran out of CPU or waited on the disk like the raw passes.
 *
 * Not in the limit, but in the row's note: the raw vectored pass once more,
 * hashing each block's payload with the disk tier's checksum (before its
 * write is submitted; after its read lands, before the next is sent). Where
 * the disk is software on the same host (a virtual machine's), the disk's
 * copies and the checksum's reads share the memory system, and the
 * checksum alone costs a measurable share of the disk's throughput: this
 * figure shows how much, on the machine the row ran on. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>
/* The payload checksum as the disk tier computes it (record.c): XXH3 in
 * its AVX2/AVX-512 form where the library has one. */
#ifdef KVT_HAVE_XXH_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define payload_hash XXH3_64bits_dispatch
#else
#define payload_hash XXH3_64bits
#endif

#include "bench.h"
#include "dev/dev.h"
#include "store/record.h"
#include "util/clock.h"
#include "util/fault.h"

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

/* Raw O_DIRECT io_uring over n records of the file (the limit). fixed:
 * the buffers registered with the ring (READ_FIXED / WRITE_FIXED); engine
 * (non-NULL): the straight path's own I/O, READV/WRITEV of a 4 KiB page
 * of bufs and a 2 MiB block of the engine's memory. */
/* sum (with engine): each block's payload hashed as the disk tier's
 * checksum is, in this thread, before its write or after its read. */
static double raw_pass_qd(const char *path, int write, uint64_t n, size_t rec, char *bufs, uint32_t qd, int fixed,
                          char *engine, int sum) {
  struct iovec vec[RAW_QD][2];
  int fd = open(path, O_RDWR | O_DIRECT);
  if (fd < 0) fd = open(path, O_RDWR); /* a file system without O_DIRECT: both sides buffered */
  if (fd < 0) return -1;
  struct io_uring ring;
  if (io_uring_queue_init(qd, &ring, 0) != 0) {
    close(fd);
    return -1;
  }
  struct iovec all = {bufs, RAW_QD * rec};
  if (fixed && io_uring_register_buffers(&ring, &all, 1) != 0) fixed = 0;
  int64_t t0 = kvt__now_ns();
  uint64_t sent = 0, done = 0, acc = 0;
  int bad = 0;
  while (done < n && !bad) {
    while (sent < n && sent - done < qd) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      char *buf = bufs + (sent % qd) * rec;
      off_t off = (off_t)(KVT_RECORD_ALIGN + sent * rec);
      struct iovec *v = vec[sent % qd];
      if (engine) {
        v[0] = (struct iovec){buf, KVT_RECORD_ALIGN};
        v[1] = (struct iovec){engine + (sent % ENGINE_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES};
      }
      if (engine && write && sum) acc += payload_hash(v[1].iov_base, BLOCK_BYTES);
      if (engine && write) io_uring_prep_writev(sqe, fd, v, 2, off);
      else if (engine) io_uring_prep_readv(sqe, fd, v, 2, off);
      else if (write && fixed) io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)rec, off, 0);
      else if (write) io_uring_prep_write(sqe, fd, buf, (unsigned)rec, off);
      else if (fixed) io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)rec, off, 0);
      else io_uring_prep_read(sqe, fd, buf, (unsigned)rec, off);
      io_uring_sqe_set_data64(sqe, sent);
      sent++;
    }
    io_uring_submit(&ring);
    struct io_uring_cqe *cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) break;
    bad |= cqe->res != (int)rec;
    uint64_t landed = io_uring_cqe_get_data64(cqe);
    io_uring_cqe_seen(&ring, cqe);
    if (engine && !write && sum) acc += payload_hash(engine + (landed % ENGINE_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES);
    done++;
  }
  double s = secs_since(t0);
  io_uring_queue_exit(&ring);
  close(fd);
  if (acc == 1) bad = 1; /* keeps the sums from being optimized out (never 1 in practice) */
  return bad ? -1 : (double)n * BLOCK_BYTES / s / 1e9;
}

/* The limit's ways: whole records at depth 8 and 32, with registered
 * buffers at 32, and the straight path's vectored I/O at 32. */
#define RAW_WAYS 4
static const struct {
  uint32_t qd;
  int fixed, vec;
  const char *name;
} raw_ways[RAW_WAYS] = {{8, 0, 0, "qd8"}, {RAW_QD, 0, 0, "qd32"}, {RAW_QD, 1, 0, "qd32 fixed"}, {RAW_QD, 0, 1, "qd32 vec"}};

/* The best of the ways; *cpu gets the CPU per GB of the best, *way its
 * index, *summed the vectored way with checksums (not a candidate). */
static double raw_pass(const char *path, int write, uint64_t n, size_t rec, char *bufs, char *engine, double *cpu,
                       int *way, double *summed) {
  double best = 0;
  for (int w = 0; w < RAW_WAYS; w++) {
    double c0 = cpu_now();
    double v = raw_pass_qd(path, write, n, rec, bufs, raw_ways[w].qd, raw_ways[w].fixed,
                           raw_ways[w].vec ? engine : NULL, 0);
    if (v < 0) return -1;
    if (v > best) best = v, *cpu = (cpu_now() - c0) / ((double)n * BLOCK_BYTES / 1e9), *way = w;
  }
  *summed = raw_pass_qd(path, write, n, rec, bufs, RAW_QD, 0, engine, 1);
  return *summed < 0 ? -1 : best;
}

typedef struct sbench {
  kvt_cache *c;
  char *engine;
  kvt_region reg;
  uint64_t n;
  kvt_key *keys;
  kvt_piece *pieces; /* by region + offset: the straight path */
  kvt_piece *staged; /* the same memory by unregistered pointer: staging */
  int best_way[2][ROUNDS]; /* writes, reads: the raw way that won each round */
  double summed[2][ROUNDS]; /* writes, reads: the raw vectored way with checksums */
} sbench;

/* One batch of every block, put (new keys of this round) or got. A put
 * first removes the blocks of the put before (untimed), so it measures
 * writes alone, never the making of room. */
static double storage_pass(sbench *b, int get, uint32_t round, int staged, double *cpu) {
  if (!get) {
    kvt_remove(b->c, b->keys, b->n, NULL);
    uint64_t *ids = malloc(b->n * sizeof *ids);
    if (!ids) return -1;
    for (uint64_t i = 0; i < b->n; i++) ids[i] = ((uint64_t)round << 32) | ((uint64_t)staged << 31) | i;
    kvt_keys_from_opaque(b->c, ids, sizeof *ids, b->n, b->keys);
    free(ids);
  }
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = (uint32_t)b->n;
  bt.keys = b->keys;
  bt.pieces = staged ? b->staged : b->pieces;
  bt.flags = KVT_KEYS_OPAQUE;
  kvt_job job;
  double c0 = cpu_now();
  int64_t t0 = kvt__now_ns();
  int rc = get ? kvt_get_into(b->c, &bt, &job) : kvt_put_from(b->c, &bt, &job);
  if (rc != 1) return -1;
  rc = kvt_storage_wait(b->c, job, -1);
  double s = secs_since(t0);
  *cpu = (cpu_now() - c0) / ((double)b->n * BLOCK_BYTES / 1e9);
  uint32_t ok = 0;
  kvt_storage_results(b->c, job, NULL, 0, &ok);
  kvt_storage_release(b->c, job);
  return rc == 0 && ok == b->n ? (double)b->n * BLOCK_BYTES / s / 1e9 : -1;
}

/* KVT_BENCH_STORAGE_VECTORED=1: the engine's region is refused as an
 * io_uring fixed buffer (as a kernel past RLIMIT_MEMLOCK would), so the
 * straight path goes as one READV / WRITEV per block: the same binary and
 * file, for comparing the two ways in alternating runs. */
static int refuse_fixed(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  return site == KVT_FAULT_IO_BUF_REGISTER ? -ENOMEM : 0;
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
  const char *vec = getenv("KVT_BENCH_STORAGE_VECTORED");
  if (vec && *vec == '1') kvt__fault_set(refuse_fixed, NULL);
  if (rc == 0) rc = kvt_register_memory(b->c, b->engine, (size_t)ENGINE_BLOCKS * BLOCK_BYTES, KVT_MEM_HOST_FIXED, &b->reg);
  kvt__fault_set(NULL, NULL);
  for (uint64_t i = 0; rc == 0 && i < b->n; i++) {
    b->pieces[i] = (kvt_piece){.region = b->reg, .offset = (i % ENGINE_BLOCKS) * BLOCK_BYTES, .len = BLOCK_BYTES};
    b->staged[i] = (kvt_piece){.ptr = b->engine + (i % ENGINE_BLOCKS) * BLOCK_BYTES, .len = BLOCK_BYTES};
  }
  return rc;
}

static double thread_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* What staging costs per GB, in CPU time of this thread (so other load on
 * the machine does not count): the copy of a block between engine memory
 * and a record, and the payload's checksum. The copies go to RAW_QD
 * records in turn (64 MiB), as staging's go to records the disk has just
 * filled or will read, not to one record that stays in cache. */
static void staging_costs(const sbench *b, char *recs, size_t rec, double *copy_s, double *sum_s) {
  uint64_t acc = 0;
  double gb = 4.0 * ENGINE_BLOCKS * BLOCK_BYTES / 1e9, t0 = thread_cpu_now();
  for (uint32_t i = 0; i < 4 * ENGINE_BLOCKS; i++)
    memcpy(recs + (i % RAW_QD) * rec, b->engine + (size_t)(i % ENGINE_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES);
  double t1 = thread_cpu_now();
  for (uint32_t i = 0; i < 4 * ENGINE_BLOCKS; i++)
    acc += payload_hash(b->engine + (size_t)(i % ENGINE_BLOCKS) * BLOCK_BYTES, BLOCK_BYTES);
  double t2 = thread_cpu_now();
  *copy_s = (t1 - t0) / gb;
  *sum_s = acc == 1 ? 0 : (t2 - t1) / gb; /* acc keeps the sums from being optimized out */
}

/* The median of v[0..n) (n odd: a measured round), with the worst and best. */
static double median(const double *v, int n, double *lo, double *hi) {
  double s[ROUNDS];
  memcpy(s, v, (size_t)n * sizeof *s);
  double mid = kvt_bench_median(s, n);
  *lo = s[0];
  *hi = s[n - 1];
  return mid;
}

/* Passes of a round, by unit: raw writes; straight put, get; raw reads;
 * staged put, get. A get reads its own side's put, so each side's put and
 * get stay together (the raw writes land on kvtier's slots). */
enum { P_RAW_W, P_PUT, P_GET, P_RAW_R, P_PUT_STAGED, P_GET_STAGED, N_PASSES };

static int run_unit(sbench *b, const char *path, size_t rec, char *raw, int unit, uint32_t r, double *gbs,
                    double *cpu) {
  static const int first[4] = {P_RAW_W, P_PUT, P_RAW_R, P_PUT_STAGED};
  int n = unit == 0 || unit == 2 ? 1 : 2;
  for (int k = 0; k < n; k++) {
    int p = first[unit] + k;
    double v = p == P_RAW_W   ? raw_pass(path, 1, b->n, rec, raw, b->engine, &cpu[p], &b->best_way[0][r], &b->summed[0][r])
               : p == P_RAW_R ? raw_pass(path, 0, b->n, rec, raw, b->engine, &cpu[p], &b->best_way[1][r], &b->summed[1][r])
                              : storage_pass(b, p == P_GET || p == P_GET_STAGED, r, p >= P_PUT_STAGED, &cpu[p]);
    if (v < 0) return -EIO;
    gbs[p] = v;
  }
  return 0;
}

static void storage_detail(char *out, size_t n, const sbench *b, int rounds, const double *med, const double *lo,
                           const double *hi, const double *cmed, int get, double copy_s, double sum_s) {
  int kv = get ? P_GET : P_PUT, st = get ? P_GET_STAGED : P_PUT_STAGED, raw = get ? P_RAW_R : P_RAW_W;
  int won[RAW_WAYS] = {0};
  for (int r = 0; r < rounds; r++) won[b->best_way[get][r]]++;
  int k = snprintf(out, n, "engine memory in huge pages: %s; raw ways won rounds: %s %d, %s %d, %s %d, %s %d; ",
                   kvt_bench_huge_pages(b->engine, (size_t)ENGINE_BLOCKS * BLOCK_BYTES) ? "yes" : "no",
                   raw_ways[0].name, won[0], raw_ways[1].name, won[1], raw_ways[2].name, won[2], raw_ways[3].name, won[3]);
  if (k < 0 || (size_t)k >= n) return;
  out += k, n -= (size_t)k;
  snprintf(out, n, "GB/s median (worst..best): straight %.3f (%.3f..%.3f), staged %.3f (%.3f..%.3f), raw %.3f "
           "(%.3f..%.3f); cpu-s/GB median: straight %.3f, staged %.3f, raw %.3f; straight saves %.3f of the staged "
           "path's CPU, predicted %.3f (one staging copy; a checksum costs %.3f; thread CPU here)",
           med[kv], lo[kv], hi[kv], med[st], lo[st], hi[st], med[raw], lo[raw], hi[raw], cmed[kv], cmed[st], cmed[raw],
           cmed[st] - cmed[kv], copy_s, sum_s);
}

static int disk_rows(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  char path[4200];
  snprintf(path, sizeof path, "%s/kvtier-bench-storage.kvt", pick_dir(o));
  sbench b = {.n = o->quick ? 32 : 512}; /* 1 GiB per pass: short passes are at the mercy of the scheduler */
  size_t rec = kvt__record_bytes(BT, BLOCK_BYTES);
  char *raw = NULL;
  /* The engine's pool and the raw passes' buffers come from the host
   * tier's allocator (huge pages where the kernel gives them): the disk's
   * speed depends on how many physical segments a record spans, and both
   * sides get the same kind of memory. */
  int rc = kvt__host_mem_alloc((size_t)ENGINE_BLOCKS * BLOCK_BYTES, (void **)&b.engine);
  if (rc == 0) rc = kvt__host_mem_alloc(RAW_QD * rec, (void **)&raw);
  b.keys = calloc(b.n, sizeof *b.keys);
  b.pieces = malloc(b.n * sizeof *b.pieces);
  b.staged = malloc(b.n * sizeof *b.staged);
  if (!b.keys || !b.pieces || !b.staged) rc = -ENOMEM;
  /* KVT_BENCH_STORAGE_SMALL_PAGES=1: the engine's memory in 4 KiB pages
   * (an engine that does not ask for huge pages), before it is touched. */
  const char *small = getenv("KVT_BENCH_STORAGE_SMALL_PAGES");
  if (rc == 0 && small && *small == '1') madvise(b.engine, (size_t)ENGINE_BLOCKS * BLOCK_BYTES, MADV_NOHUGEPAGE);
  if (rc == 0) {
    memset(b.engine, 0x5a, (size_t)ENGINE_BLOCKS * BLOCK_BYTES);
    memset(raw, 0xa5, RAW_QD * rec);
    rc = open_storage(&b, path);
  }
  double gbs[N_PASSES][ROUNDS], cpu[N_PASSES][ROUNDS], g[N_PASSES], cp[N_PASSES];
  int rounds = o->quick ? 3 : ROUNDS;
  for (int r = 0; rc == 0 && r < rounds; r++) {
    for (int u = 0; u < 4 && rc == 0; u++) rc = run_unit(&b, path, rec, raw, (u + r) % 4, (uint32_t)r, g, cp);
    for (int p = 0; p < N_PASSES; p++) gbs[p][r] = g[p], cpu[p][r] = cp[p];
    kvt_bench_progress("storage", (r + 1.0) / rounds);
  }
  if (rc == 0) {
    double med[N_PASSES], lo[N_PASSES], hi[N_PASSES], cmed[N_PASSES];
    for (int p = 0; p < N_PASSES; p++) {
      med[p] = median(gbs[p], rounds, &lo[p], &hi[p]);
      double clo, chi;
      cmed[p] = median(cpu[p], rounds, &clo, &chi);
    }
    double copy_s = 0, sum_s = 0;
    staging_costs(&b, raw, rec, &copy_s, &sum_s);
    static const char *name[2] = {"put-from 2 MiB blocks, engine memory -> disk",
                                  "get-into 2 MiB blocks, disk -> engine memory"};
    kvt_stats st = {.size = sizeof st};
    kvt_get_stats(b.c, &st);
    for (int w = 0; w < 2; w++) {
      char note[400], detail[1000];
      double slo, shi, summed = median(b.summed[w], rounds, &slo, &shi), kv = med[w ? P_GET : P_PUT];
      snprintf(note, sizeof note, "straight path; limit: raw O_DIRECT io_uring %s (same records and file; best of "
               "qd8/qd32/qd32 fixed/qd32 vectored), medians of %d rounds. Raw qd32 vectored %s checksumming each "
               "block as kvtier does (not in the limit): %.3f GB/s, %.2f of the limit; kvtier %.2f of it",
               w ? "reads" : "writes", rounds, w ? "reads" : "writes", summed, summed / med[w ? P_RAW_R : P_RAW_W],
               kv / summed);
      storage_detail(detail, sizeof detail, &b, rounds, med, lo, hi, cmed, w, copy_s, sum_s);
      size_t dl = strlen(detail);
      snprintf(detail + dl, sizeof detail - dl, "; blocks straight %llu (of which io_uring fixed buffers %llu), staged %llu",
               (unsigned long long)st.storage_blocks_straight, (unsigned long long)st.storage_blocks_fixed,
               (unsigned long long)st.storage_blocks_staged);
      kvt_bench_row(rows, name[w], "GB/s", med[w ? P_GET : P_PUT], med[w ? P_RAW_R : P_RAW_W], 0.9, note);
      kvt_bench_row_detail(rows, detail);
    }
  }
  kvt_close(b.c);
  unlink(path);
  kvt__host_mem_free(b.engine, (size_t)ENGINE_BLOCKS * BLOCK_BYTES);
  kvt__host_mem_free(raw, RAW_QD * rec);
  free(b.keys);
  free(b.pieces);
  free(b.staged);
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
