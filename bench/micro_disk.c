/* kvtier-bench micro, section "disk": spill (write) and fetch (read +
 * verify) through the disk store, next to the disk's own ceiling measured
 * several ways in the same run, on the same file system:
 *
 *   u8, u32, uD    raw O_DIRECT io_uring at queue depth 8 / 32 / D, whole
 *                  records into reused registered buffers of huge-page
 *                  memory (what the host tier allocates); D is the store's
 *                  own depth when deeper than 64, else 64 (u64)
 *   u32a           the same at depth 32 with IOSQE_ASYNC (every request
 *                  punted to io_uring's workers)
 *   u32/4k         depth 32 into plain 4 KiB-page memory, unregistered
 *   fpb16          16 threads doing O_DIRECT pread/pwrite of whole records,
 *                  one file per block, opened per request: what a
 *                  file-per-block store driven by a thread pool gets
 *
 * The best of them is the limit (target 0.9); fpb16 gets its own row
 * (target 1.0). Each way cycles as many buffers as it keeps in flight
 * (u8 eight, fpb16 one per thread), and so does the store: it is offered
 * the buffers it can hold (its ops: its default queue depth, enough I/Os
 * for 12-16 MiB of records, plus its headroom for records being hashed) and
 * kept as full as it lets itself be, as a restore keeps it (try batches,
 * resumed on done()): the store row is a caller that reuses its buffers as
 * the store hands them back, as a staging ring does. How much memory the
 * buffers span changes what a virtual disk gives: u8/wide, the u8 way
 * cycling the whole pool, shows by how much (in the detail; not part of
 * the limit); reads into fresh memory, as a restore into host slots does,
 * are that case (the restore section measures one). Rounds alternate the ways and the
 * store, each round in a rotated order, so drift and the place in a round
 * hit all alike; each way and the store count by their median
 * round (a shared disk swings single rounds by several times). CPU time
 * per GB comes from getrusage (all threads, io-wq workers included); the
 * cpu row sets it beside one core's XXH3 of the same records, hot in cache
 * and read from memory (where a record that just landed from a disk is).
 * Figures per way, worst and best rounds, CPU, and the store beside
 * each way within the same rounds (the median of the per-round ratios)
 * are in the row's JSON detail. A last row puts durable mode's spill
 * (completed writes covered by group fdatasyncs) against a normal spill
 * of the same records. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "bench.h"
#include "dev/dev.h"
#include "store/disk_internal.h" /* KVT_DISK_HANDOFF_BYTES */
#include "store/disk_store.h"
#include "util/clock.h"

#define QD 32u          /* the u32 ways' depth */
#define MAX_POOL_RECS 512u /* buffers: the deepest raw way, or the store's ops, if more */
#define FPB_THREADS 16u
#define FPB_MAX_FILES 4096u
#define BT 16u
#define ROUNDS 5 /* odd: the median is a round that was measured */
#define TMPFS_MAGIC_ 0x01021994

typedef struct measure {
  double gbs, cpu_per_gb;
} measure;

/* The ways that make the limit, then two that show why a figure differs:
 * u32+sum, u32 hashing every record on its one thread (seal before a
 * write, verify after a read), what checksums cost when they run in series
 * behind the ring; u8/wide, u8 cycling every buffer of the pool instead of
 * eight, what spreading the same I/O over more memory costs. */
enum { W_U8, W_U32, W_UD, W_U32A, W_U32_4K, W_FPB, N_LIMIT_WAYS, W_U32_SUM = N_LIMIT_WAYS, W_U8_WIDE, N_WAYS };
static const char *const way_names[N_WAYS] = {"u8", "u32", NULL, "u32a", "u32/4k", "fpb16", "u32+sum", "u8/wide"};

typedef struct run {
  char path[4096], fpb_dir[4096];
  uint64_t payload, rec, slots, fpb_files;
  double seconds;
  char *pool;   /* pool_recs record images in huge-page memory, as the host tier has */
  size_t pool_bytes;
  uint32_t pool_recs; /* the deep way's depth, or the store's ops if more */
  uint32_t deep;      /* the deep way's depth: the store's queue depth, at least 64 */
  char deep_name[16]; /* "u64", "u256" */
  char *small;  /* QD records in 4 KiB pages */
  kvt__disk *d;
  int direct, huge;
  uint32_t hashers, ops, store_qd;
} run;

static const char *way_name(const run *r, int w) { return w == W_UD ? r->deep_name : way_names[w]; }

static double cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

static measure finish(int64_t t0, double c0, uint64_t bytes) {
  double secs = (kvt__now_ns() - t0) * 1e-9, gb = (double)bytes / 1e9;
  return gb > 0 ? (measure){gb / secs, (cpu_now() - c0) / gb} : (measure){0, 0};
}

static int is_tmpfs(const char *dir) {
  struct statfs sf;
  return statfs(dir, &sf) == 0 && sf.f_type == TMPFS_MAGIC_;
}

/* --dir, else $TMPDIR, else /var/tmp: the first that is not tmpfs. */
static const char *pick_dir(const kvt_bench_micro_opts *o) {
  if (o->dir) return o->dir;
  const char *t = getenv("TMPDIR");
  if (t && !is_tmpfs(t)) return t;
  if (!is_tmpfs("/var/tmp")) return "/var/tmp";
  return t ? t : "/tmp";
}

/* 1 when the kernel backs [p, p+n) with transparent huge pages. */
int kvt_bench_huge_pages(const void *p, size_t n) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[256];
  int in = 0, huge = 0;
  unsigned long lo, hi, kb;
  while (fgets(line, sizeof line, f)) {
    char *dash = strchr(line, '-'), *sp = strchr(line, ' ');
    if (dash && sp && dash < sp && sscanf(line, "%lx-%lx", &lo, &hi) == 2)
      in = lo <= (uintptr_t)p && (uintptr_t)p + n <= hi;
    else if (in && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) huge = kb > 0;
  }
  fclose(f);
  return huge;
}

/* ---- raw io_uring ---- */

typedef struct raw_cfg {
  uint32_t qd;
  int async, small, sum; /* IOSQE_ASYNC; 4 KiB-page buffers, unregistered; checksums */
  int wide;              /* cycle every buffer of the pool, not the first qd */
} raw_cfg;

/* The buffer of I/O number `next`. */
static char *raw_buf(const run *r, const raw_cfg *w, uint64_t next) {
  return (w->small ? r->small : r->pool) + (next % (w->wide ? r->pool_recs : w->qd)) * r->rec;
}

static void raw_prep(const run *r, const raw_cfg *w, struct io_uring_sqe *sqe, uint64_t next,
                     int write, int fixed) {
  char *buf = raw_buf(r, w, next);
  uint64_t off = 4096 + (next % r->slots) * r->rec;
  if (write && w->sum) kvt__record_seal(buf, &(kvt_key){1, 2}, BT, r->payload, next + 1);
  io_uring_sqe_set_data64(sqe, next);
  if (write && fixed) io_uring_prep_write_fixed(sqe, 0, buf, (unsigned)r->rec, off, 0);
  else if (write) io_uring_prep_write(sqe, 0, buf, (unsigned)r->rec, off);
  else if (fixed) io_uring_prep_read_fixed(sqe, 0, buf, (unsigned)r->rec, off, 0);
  else io_uring_prep_read(sqe, 0, buf, (unsigned)r->rec, off);
  sqe->flags |= IOSQE_FIXED_FILE | (w->async ? IOSQE_ASYNC : 0);
}

static measure raw_loop(run *r, const raw_cfg *w, int write) {
  struct io_uring ring;
  measure m = {0, 0};
  int fd = open(r->path, (write ? O_WRONLY : O_RDONLY) | O_DIRECT);
  if (fd < 0) fd = open(r->path, write ? O_WRONLY : O_RDONLY);
  if (fd < 0) return m;
  if (io_uring_queue_init(w->qd, &ring, 0) < 0) {
    close(fd);
    return m;
  }
  struct iovec iov = {r->pool, r->pool_bytes};
  int fixed = !w->small && io_uring_register_buffers(&ring, &iov, 1) == 0;
  io_uring_register_files(&ring, &fd, 1);
  uint64_t next = 0, done = 0, inflight = 0;
  int64_t t0 = kvt__now_ns(), end = t0 + (int64_t)(r->seconds * 1e9);
  double c0 = cpu_now();
  int stop = 0;
  while (!stop || inflight) {
    for (; !stop && inflight < w->qd; inflight++, next++)
      raw_prep(r, w, io_uring_get_sqe(&ring), next, write, fixed);
    io_uring_submit_and_wait(&ring, 1);
    struct io_uring_cqe *cq[64];
    unsigned k;
    while ((k = io_uring_peek_batch_cqe(&ring, cq, 64)) > 0) {
      for (unsigned i = 0; i < k; i++) {
        if (cq[i]->res != (int)r->rec) stop = 2;
        char *buf = raw_buf(r, w, io_uring_cqe_get_data64(cq[i]));
        if (!write && w->sum && kvt__record_check(buf, r->rec, &(kvt_key){1, 2}, BT, r->payload, NULL, 1, NULL))
          stop = 2;
      }
      io_uring_cq_advance(&ring, k);
      inflight -= k;
      done += k;
    }
    if (kvt__now_ns() >= end && !stop) stop = 1;
  }
  if (stop == 1) m = finish(t0, c0, done * r->rec);
  io_uring_queue_exit(&ring);
  close(fd);
  return m;
}

/* ---- 16 threads, one file per block ---- */

typedef struct fpb_pool {
  const run *r;
  int write;
  int64_t end;
  atomic_uint_fast64_t next, done, errors;
} fpb_pool;

typedef struct fpb_arg {
  fpb_pool *p;
  char *buf;
} fpb_arg;

static void fpb_path(const run *r, uint64_t i, char *out, size_t n) {
  snprintf(out, n, "%s/%llu", r->fpb_dir, (unsigned long long)i);
}

/* A file-per-block store's request: open the block's file, move the whole
 * record, close it. */
static int fpb_one(const run *r, uint64_t block, char *buf, int write) {
  char path[4200];
  fpb_path(r, block, path, sizeof path);
  int fd = open(path, (write ? O_WRONLY | O_CREAT : O_RDONLY) | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EINVAL) fd = open(path, (write ? O_WRONLY | O_CREAT : O_RDONLY) | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  ssize_t k = write ? pwrite(fd, buf, r->rec, 0) : pread(fd, buf, r->rec, 0);
  int rc = k == (ssize_t)r->rec ? 0 : k < 0 ? -errno : -EIO;
  close(fd);
  return rc;
}

static void *fpb_worker(void *arg) {
  fpb_arg *a = arg;
  fpb_pool *p = a->p;
  while (kvt__now_ns() < p->end) {
    uint64_t n = atomic_fetch_add(&p->next, 1);
    if (fpb_one(p->r, n % p->r->fpb_files, a->buf, p->write)) atomic_fetch_add(&p->errors, 1);
    else atomic_fetch_add(&p->done, 1);
  }
  return NULL;
}

static measure fpb_loop(run *r, int write) {
  fpb_pool p = {.r = r, .write = write};
  fpb_arg args[FPB_THREADS];
  pthread_t t[FPB_THREADS];
  uint32_t started = 0;
  int64_t t0 = kvt__now_ns();
  double c0 = cpu_now();
  p.end = t0 + (int64_t)(r->seconds * 1e9);
  for (; started < FPB_THREADS; started++) {
    args[started] = (fpb_arg){&p, r->pool + (size_t)started * r->rec};
    if (pthread_create(&t[started], NULL, fpb_worker, &args[started])) break;
  }
  for (uint32_t i = 0; i < started; i++) pthread_join(t[i], NULL);
  if (started < FPB_THREADS || atomic_load(&p.errors)) return (measure){0, 0};
  return finish(t0, c0, atomic_load(&p.done) * r->rec);
}

static int fpb_setup(run *r) {
  if (mkdir(r->fpb_dir, 0755) && errno != EEXIST) return -errno;
  for (uint64_t i = 0; i < r->fpb_files; i++) {
    int rc = fpb_one(r, i, r->pool + (i % r->pool_recs) * r->rec, 1);
    if (rc) return rc;
  }
  return 0;
}

static void fpb_cleanup(const run *r) {
  char path[4200];
  for (uint64_t i = 0; i < r->fpb_files; i++) {
    fpb_path(r, i, path, sizeof path);
    unlink(path);
  }
  rmdir(r->fpb_dir);
}

/* ---- the store ---- */

typedef struct store_loop {
  pthread_mutex_t m;
  pthread_cond_t c;
  uint32_t free_idx[MAX_POOL_RECS], n_free;
  uint64_t done, errors;
  int first_error;
} store_loop;

typedef struct loop_arg {
  store_loop *l;
  uint32_t idx;
} loop_arg;

/* Called from the store's threads (several at once for reads). */
static void loop_done(void *arg, int status) {
  loop_arg *a = arg;
  pthread_mutex_lock(&a->l->m);
  a->l->free_idx[a->l->n_free++] = a->idx;
  a->l->done++;
  if (status && !a->l->errors++) a->l->first_error = status;
  pthread_cond_signal(&a->l->c);
  pthread_mutex_unlock(&a->l->m);
}

/* Gives back the buffers the store did not take; with `wait`, then waits
 * for a completion after `seen` (the store was full), and takes every free
 * buffer. */
static uint32_t loop_take(store_loop *l, const uint32_t *back, uint32_t n_back, uint64_t seen,
                          uint32_t *out) {
  pthread_mutex_lock(&l->m);
  for (uint32_t i = 0; i < n_back; i++) l->free_idx[l->n_free++] = back[i];
  while (!l->n_free || (n_back && l->done == seen)) pthread_cond_wait(&l->c, &l->m);
  uint32_t n = l->n_free;
  memcpy(out, l->free_idx, n * sizeof *out);
  l->n_free = 0;
  pthread_mutex_unlock(&l->m);
  return n;
}

static uint64_t loop_seen(store_loop *l) {
  pthread_mutex_lock(&l->m);
  uint64_t d = l->done;
  pthread_mutex_unlock(&l->m);
  return d;
}

/* A round the store could not finish counts 0, and says why. */
static measure store_failed(int write, int status) {
  fprintf(stderr, "micro disk: a store %s failed: %s\n", write ? "write" : "read", kvt_strerror(status));
  return (measure){0, 0};
}

/* Keeps the store as full as it lets itself be for r->seconds (or `count`
 * ops), as a restore does: submit what fits (the try batches), resume when
 * done() hands buffers back. The store takes its queue depth of I/Os, plus
 * its headroom for records sealed on its checksum threads
 * (kvt__disk_info.ops <= pool_recs): it is offered that many buffers, the
 * first of the pool, as the raw ways are offered their depth's worth. */
static measure store_loop_run(run *r, int write, uint64_t count) {
  const uint32_t recs = r->ops && r->ops < r->pool_recs ? r->ops : r->pool_recs;
  store_loop l = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, recs, 0, 0, 0};
  loop_arg args[MAX_POOL_RECS];
  kvt__disk_io io[MAX_POOL_RECS];
  uint32_t idx[MAX_POOL_RECS], back[MAX_POOL_RECS], n_back = 0;
  for (uint32_t i = 0; i < recs; i++) l.free_idx[i] = i, args[i] = (loop_arg){&l, i};
  int64_t t0 = kvt__now_ns(), end = t0 + (int64_t)(r->seconds * 1e9);
  double c0 = cpu_now();
  uint64_t next = 0, seen = 0;
  int refused = 0;
  while (count ? next < count : kvt__now_ns() < end) {
    uint32_t n = loop_take(&l, back, n_back, seen, idx);
    n_back = 0;
    if (count && n > count - next) {
      for (uint32_t k = (uint32_t)(count - next); k < n; k++) back[n_back++] = idx[k];
      n = (uint32_t)(count - next);
    }
    for (uint32_t k = 0; k < n; k++)
      io[k] = (kvt__disk_io){.slot = (next + k) % r->slots, .rec = r->pool + (size_t)idx[k] * r->rec,
                             .arg = &args[idx[k]]};
    seen = loop_seen(&l);
    int q = write ? kvt__disk_try_write_batch(r->d, io, n, loop_done) : kvt__disk_try_read_batch(r->d, io, n, loop_done);
    for (uint32_t k = 0; k < n; k++) {
      if (io[k].status != 0) back[n_back++] = idx[k]; /* not taken */
      if (io[k].status != 0 && io[k].status != KVT_EAGAIN && !refused) refused = io[k].status;
    }
    if (q < 0 && !refused) refused = q;
    if (refused) break;
    next += (uint32_t)q;
  }
  /* Every buffer back before l leaves the stack: the store still calls
   * done() for what it took, also after a refusal. */
  pthread_mutex_lock(&l.m);
  for (uint32_t i = 0; i < n_back; i++) l.free_idx[l.n_free++] = back[i];
  while (l.n_free < recs) pthread_cond_wait(&l.c, &l.m);
  pthread_mutex_unlock(&l.m);
  if (refused) return store_failed(write, refused);
  if (l.errors) return store_failed(write, l.first_error);
  return finish(t0, c0, l.done * r->rec);
}

static void make_images(run *r) {
  for (uint32_t i = 0; i < r->pool_recs; i++) {
    char *rec = r->pool + (size_t)i * r->rec;
    kvt__record_hdr *h = (kvt__record_hdr *)rec;
    memset(h, 0, sizeof *h);
    h->key = (kvt_key){i + 1, 0xbe9c};
    for (uint64_t b = 0; b < r->payload; b += 8) memcpy((char *)kvt__record_payload(rec, BT) + b, &b, 8);
    kvt__record_seal(rec, &(kvt_key){1, 2}, BT, r->payload, 1);
  }
  memcpy(r->small, r->pool, QD * r->rec);
}

static int open_store_at(run *r, const char *path, int durable, kvt__disk **out) {
  const void *bufs[1] = {r->pool};
  size_t lens[1] = {r->pool_bytes};
  kvt__disk_cfg c = {.path = path, .slots = r->slots, .block_tokens = BT, .payload_bytes = r->payload,
                     .ns = {1, 2}, .queue_depth = 0, .backend = KVT_DISK_AUTO, .reset = 1,
                     .bufs = bufs, .buf_lens = lens, .n_bufs = 1, .durable = durable};
  return kvt__disk_open(&c, out);
}

static int open_store(run *r) {
  int rc = open_store_at(r, r->path, 0, &r->d);
  if (rc == 0) {
    kvt__disk_info in;
    kvt__disk_get_info(r->d, &in);
    r->direct = in.direct;
    r->hashers = in.checksum_threads;
    r->ops = in.ops;
    r->store_qd = in.queue_depth;
  }
  return rc;
}

/* One core sealing records (XXH3 of the payload, as the store runs it):
 * what checksums cost. Twice: the same record over and over (hot in
 * cache), and records laid end to end over more memory than any cache
 * holds, each hashed once, as a record that just landed from the disk is
 * (the device wrote it to memory, not into this core's cache). The second
 * is what verifying a fetch costs; the gap between the two is memory.
 * Each is the best of three short runs: other work on the CPUs only ever
 * slows one down. */
typedef struct hashing {
  double hot, cold; /* GB/s on one core */
} hashing;

#define COLD_BYTES ((size_t)256 << 20)

static double seal_loop(const run *r, char *base, uint64_t n_recs) {
  double best = 0;
  for (int rep = 0, at = 0; rep < 3; rep++) {
    uint64_t n = 0;
    int64_t t0 = kvt__now_ns();
    while (kvt__now_ns() - t0 < 50000000 || n < 4) {
      char *rec = base + (size_t)(at++ % n_recs) * r->rec; /* a cold run never revisits a record soon */
      memset(rec, 0, sizeof(kvt__record_hdr));
      kvt__record_seal(rec, &(kvt_key){1, 2}, BT, r->payload, 1), n++;
    }
    double gbs = (double)n * r->payload / 1e9 / ((kvt__now_ns() - t0) * 1e-9);
    if (gbs > best) best = gbs;
  }
  return best;
}

static hashing seal_gbs(const run *r) {
  hashing h = {seal_loop(r, r->pool, 1), 0};
  uint64_t n_recs = COLD_BYTES / r->rec;
  char *mem = n_recs ? mmap(NULL, n_recs * r->rec, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
  if (mem == MAP_FAILED) return h;
  memset(mem, 0x5a, n_recs * r->rec);
  h.cold = seal_loop(r, mem, n_recs);
  munmap(mem, n_recs * r->rec);
  return h;
}

/* ---- rounds and rows ---- */

#define MAX_ROUNDS 9

/* Every way's and the store's figure per round; each is summed up by its
 * median round (the disk's own swings, and other load, move single rounds
 * by several times), its worst and its best. `paired` sets the store
 * beside each way within the rounds: the median over rounds of the
 * store's figure over the way's in the same round, which a swing that
 * hits a whole round leaves alone, where the ratio of the two medians
 * takes each side's luck in other rounds. */
typedef struct side {
  measure samp[N_WAYS + 1][MAX_ROUNDS]; /* [N_WAYS]: the store */
  int rounds;
  measure way[N_WAYS], way_lo[N_WAYS], way_hi[N_WAYS], store, store_lo, store_hi;
  double paired[N_WAYS];
} side;

static measure way_run(run *r, int way, int write) {
  raw_cfg cfg[] = {{8, 0, 0, 0, 0}, {32, 0, 0, 0, 0}, {r->deep, 0, 0, 0, 0}, {32, 1, 0, 0, 0}, {32, 0, 1, 0, 0},
                   {0, 0, 0, 0, 0}, {32, 0, 0, 1, 0}, {8, 0, 0, 0, 1}};
  return way == W_FPB ? fpb_loop(r, write) : raw_loop(r, &cfg[way], write);
}

/* Each round starts at another place in the order: a disk that slows down
 * after some gigabytes of writes (a host's write cache filling) would
 * otherwise always charge the same ways. */
static void one_round(run *r, side *s, int write) {
  for (int i = 0; i <= N_WAYS; i++) {
    int w = (i + s->rounds * 3) % (N_WAYS + 1);
    s->samp[w][s->rounds] = w == N_WAYS ? store_loop_run(r, write, 0) : way_run(r, w, write);
  }
  s->rounds++;
}

static int by_gbs(const void *a, const void *b) {
  const measure *x = a, *y = b;
  return x->gbs < y->gbs ? -1 : x->gbs > y->gbs;
}

static void sum_up(measure *v, int n, measure *mid, measure *lo, measure *hi) {
  qsort(v, (size_t)n, sizeof *v, by_gbs);
  *mid = v[n / 2], *lo = v[0], *hi = v[n - 1];
}

/* Before sum_up, which sorts each side's rounds and so loses the pairs. */
static void pair_up(side *s) {
  for (int w = 0; w < N_WAYS; w++) {
    double v[MAX_ROUNDS];
    int n = 0;
    for (int i = 0; i < s->rounds; i++)
      if (s->samp[w][i].gbs > 0) v[n++] = s->samp[N_WAYS][i].gbs / s->samp[w][i].gbs;
    s->paired[w] = n ? kvt_bench_median(v, n) : 0;
  }
}

static void summarize(side *s) {
  pair_up(s);
  for (int w = 0; w < N_WAYS; w++) sum_up(s->samp[w], s->rounds, &s->way[w], &s->way_lo[w], &s->way_hi[w]);
  sum_up(s->samp[N_WAYS], s->rounds, &s->store, &s->store_lo, &s->store_hi);
}

static int best_way(const side *s) {
  int b = 0;
  for (int w = 1; w < N_LIMIT_WAYS; w++)
    if (s->way[w].gbs > s->way[b].gbs) b = w;
  return b;
}

/* Each way's median round, short enough for the table's note column. */
static size_t ways_note(char *note, size_t n, const run *r, const side *s) {
  size_t used = 0;
  for (int w = 0; w < N_LIMIT_WAYS && used < n; w++)
    used += (size_t)snprintf(note + used, n - used, "%s%s %.2f", w ? " " : "", way_name(r, w), s->way[w].gbs);
  return used < n ? used : n;
}

static void ways_detail(char *out, size_t n, const run *r, const side *s, hashing xxh, const char *which) {
  size_t used = (size_t)snprintf(out, n,
                                 "%s; %s; pool in %s; store qd %u (%u ops), %u checksum threads;"
                                 " seal %.1f GB/s/core in cache, %.1f from memory; %d rounds, GB/s median (worst..best) cpu-s/GB:",
                                 which, r->direct ? "O_DIRECT" : "BUFFERED (O_DIRECT refused)",
                                 r->huge ? "huge pages" : "4 KiB pages (no THP)", r->store_qd, r->ops, r->hashers, xxh.hot, xxh.cold,
                                 s->rounds);
  for (int w = 0; w < N_WAYS && used < n; w++)
    used += (size_t)snprintf(out + used, n - used, " %s %.2f (%.2f..%.2f) %.3f;", way_name(r, w), s->way[w].gbs,
                             s->way_lo[w].gbs, s->way_hi[w].gbs, s->way[w].cpu_per_gb);
  if (used < n)
    used += (size_t)snprintf(out + used, n - used, " store %.2f (%.2f..%.2f) %.3f; store / way in the same round, median:",
                             s->store.gbs, s->store_lo.gbs, s->store_hi.gbs, s->store.cpu_per_gb);
  for (int w = 0; w < N_WAYS && used < n; w++)
    used += (size_t)snprintf(out + used, n - used, " %s %.3f", way_name(r, w), s->paired[w]);
}

/* Why a row fell short of the way `w`, in a user's terms. */
static void shortfall(char *note, size_t n, const run *r, const side *s, int w) {
  double lim = s->way[w].gbs, sum = s->way[W_U32_SUM].gbs;
  if (!r->direct) snprintf(note, n, "page cache, not the disk (O_DIRECT refused)");
  else if (s->store_hi.gbs >= lim)
    snprintf(note, n, "within the disk's spread: store %.2f-%.2f", s->store_lo.gbs, s->store_hi.gbs);
  else if (sum < 0.95 * lim)
    snprintf(note, n, "verifying reads each record back from memory, slow here: u32+sum %.2f", sum);
  else if (r->rec < (256u << 10))
    snprintf(note, n, "a round trip per small record (%s %.2f)", way_name(r, w), lim);
  else snprintf(note, n, "store overhead (%s %.2f); see --json", way_name(r, w), lim);
  size_t used = strlen(note);
  if (s->rounds > 1 && used + 40 < n)
    snprintf(note + used, n - used, "; %.2f of %s in the same rounds", s->paired[w], way_name(r, w));
}

static void emit(kvt_bench_rows *rows, const run *r, const char *what, const char *model, const side *s,
                 hashing xxh) {
  char name[64], note[200], detail[1536];
  int b = best_way(s);
  double lim = s->way[b].gbs, ratio = lim > 0 ? s->store.gbs / lim : 0;
  snprintf(name, sizeof name, "%s %s", what, model);
  size_t used = ways_note(note, sizeof note, r, s);
  if (ratio < 0.9 && used + 2 < sizeof note) {
    memcpy(note + used, "; ", 3);
    shortfall(note + used + 2, sizeof note - used - 2, r, s, b);
  }
  ways_detail(detail, sizeof detail, r, s, xxh, "limit = best way");
  kvt_bench_row(rows, name, "GB/s", s->store.gbs, lim, 0.9, note);
  kvt_bench_row_detail(rows, detail);
  snprintf(name, sizeof name, "%s %s vs fpb16", what, model);
  double fr = s->way[W_FPB].gbs > 0 ? s->store.gbs / s->way[W_FPB].gbs : 0;
  used = (size_t)snprintf(note, sizeof note, "16 threads, O_DIRECT, file per block");
  if (fr < 1.0) {
    memcpy(note + used, "; ", 3);
    shortfall(note + used + 2, sizeof note - used - 2, r, s, W_FPB);
  }
  kvt_bench_row(rows, name, "GB/s", s->store.gbs, s->way[W_FPB].gbs, 1.0, note);
  kvt_bench_row_detail(rows, detail);
  snprintf(name, sizeof name, "%s %s cpu", what, model);
  snprintf(note, sizeof note, "lower is better; limit: %s; hashing alone %.3f in cache, %.3f from memory", way_name(r, b),
           xxh.hot > 0 ? 1.0 / xxh.hot : 0, xxh.cold > 0 ? 1.0 / xxh.cold : 0);
  kvt_bench_row(rows, name, "cpu-s/GB", s->store.cpu_per_gb, s->way[b].cpu_per_gb, 0, note);
}

/* As deep as the store: its default depth, and room for the ops it may
 * hold (at most its depth again for large records: one per checksum
 * thread); the store is offered only its ops' worth. */
static void size_pool(run *r) {
  r->store_qd = kvt__disk_auto_depth(r->rec, 0);
  r->deep = r->store_qd > 64 ? r->store_qd : 64;
  snprintf(r->deep_name, sizeof r->deep_name, "u%u", r->deep);
  r->pool_recs = r->rec >= KVT_DISK_HANDOFF_BYTES ? 2 * r->store_qd : r->store_qd;
  if (r->pool_recs < r->deep) r->pool_recs = r->deep;
  if (r->pool_recs > MAX_POOL_RECS) r->pool_recs = MAX_POOL_RECS;
}

static int alloc_run(run *r) {
  r->pool_bytes = (size_t)r->pool_recs * r->rec;
  int rc = kvt__host_mem_alloc(r->pool_bytes, (void **)&r->pool); /* the host tier's allocator */
  if (rc) return rc;
  r->small = mmap(NULL, QD * r->rec, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r->small == MAP_FAILED) {
    r->small = NULL;
    return -errno;
  }
  madvise(r->small, QD * r->rec, MADV_NOHUGEPAGE);
  make_images(r);
  r->huge = kvt_bench_huge_pages(r->pool, r->pool_bytes);
  return 0;
}

static void free_run(run *r) {
  if (r->d) kvt__disk_close(r->d);
  unlink(r->path);
  fpb_cleanup(r);
  if (r->pool) kvt__host_mem_free(r->pool, r->pool_bytes);
  if (r->small) munmap(r->small, QD * r->rec);
}

static int one_size(const kvt_bench_micro_opts *o, kvt_bench_rows *rows, const char *dir,
                    uint64_t payload, const char *model) {
  run r = {.payload = payload, .rec = kvt__record_bytes(BT, payload)};
  uint64_t file_bytes = o->quick ? (64ull << 20) : (1ull << 30);
  size_pool(&r);
  r.slots = file_bytes / r.rec < r.pool_recs * 2 ? r.pool_recs * 2 : file_bytes / r.rec;
  r.fpb_files = r.slots < FPB_MAX_FILES ? r.slots : FPB_MAX_FILES;
  r.seconds = o->quick ? (o->seconds < 0.15 ? o->seconds : 0.15) : o->seconds * 0.6;
  snprintf(r.path, sizeof r.path, "%s/kvtier-bench-disk-%d.kvt", dir, (int)getpid());
  snprintf(r.fpb_dir, sizeof r.fpb_dir, "%s/kvtier-bench-fpb-%d", dir, (int)getpid());
  int rc = alloc_run(&r);
  if (rc == 0) rc = open_store(&r);
  if (rc == 0) rc = fpb_setup(&r);
  if (rc) {
    free_run(&r);
    return rc;
  }
  store_loop_run(&r, 1, r.slots); /* fill every slot so fetches verify real records */
  side wr = {0}, rd = {0};
  for (int round = 0; round < (o->quick ? 1 : ROUNDS); round++) {
    one_round(&r, &wr, 1);
    one_round(&r, &rd, 0);
  }
  summarize(&wr);
  summarize(&rd);
  hashing xxh = seal_gbs(&r);
  emit(rows, &r, "spill", model, &wr, xxh);
  emit(rows, &r, "fetch+verify", model, &rd, xxh);
  free_run(&r);
  return 0;
}

/* Durable mode (disk_durable = 1: a write finishes only after an
 * fdatasync issued once it completed, one for each group of writes that
 * completed meanwhile) against a normal spill of the same 2 MiB records to
 * a second file of the same size, in rotating rounds of this run; each
 * side counts by its median round. The detail adds a third side: a normal
 * spill followed by one fdatasync, timed together, about what the drive
 * takes to stable storage (a drive whose flush writes back a large cache,
 * as a virtual disk's does, holds durable spills to that, not to the
 * normal spill). */
static int durable_row(const kvt_bench_micro_opts *o, kvt_bench_rows *rows, const char *dir) {
  run r = {.payload = 2u << 20, .rec = kvt__record_bytes(BT, 2u << 20)};
  uint64_t file_bytes = o->quick ? (64ull << 20) : (1ull << 30);
  size_pool(&r);
  /* Room for the durable store's ops, at most its depth for each of the
   * disk, the checksum threads and the syncs; it is offered what it
   * reports (in.ops). */
  uint32_t d_ops = 3 * kvt__disk_auto_depth(r.rec, 1), n_ops = 0;
  if (r.pool_recs < d_ops) r.pool_recs = d_ops > MAX_POOL_RECS ? MAX_POOL_RECS : d_ops;
  r.slots = file_bytes / r.rec < r.pool_recs * 2 ? r.pool_recs * 2 : file_bytes / r.rec;
  r.seconds = o->quick ? (o->seconds < 0.15 ? o->seconds : 0.15) : o->seconds * 0.6;
  char dpath[4200];
  snprintf(r.path, sizeof r.path, "%s/kvtier-bench-disk-%d.kvt", dir, (int)getpid());
  snprintf(dpath, sizeof dpath, "%s/kvtier-bench-durable-%d.kvt", dir, (int)getpid());
  kvt__disk *normal = NULL, *durable = NULL;
  int rc = alloc_run(&r);
  if (rc == 0) rc = open_store_at(&r, r.path, 0, &normal);
  if (rc == 0) rc = open_store_at(&r, dpath, 1, &durable);
  if (rc == 0) {
    kvt__disk_info in;
    kvt__disk_get_info(durable, &in);
    r.direct = in.direct;
    d_ops = in.ops;
    kvt__disk_get_info(normal, &in);
    n_ops = in.ops;
  }
  measure nm[MAX_ROUNDS], dm[MAX_ROUNDS], sm[MAX_ROUNDS], n_mid = {0, 0}, d_mid = {0, 0}, s_mid = {0, 0}, lo, hi;
  int rounds = o->quick ? 1 : ROUNDS;
  /* The third side: a normal spill and then one fdatasync of its file,
   * timed together. */
  int sync_fd = rc == 0 ? open(r.path, O_RDWR | O_CLOEXEC) : -1;
  if (rc == 0 && sync_fd < 0) rc = -errno;
  for (int i = 0; rc == 0 && i < rounds; i++) {
    for (int k = 0; k < 3; k++) {
      int which = (i + k) % 3; /* 0 normal, 1 durable, 2 normal + fdatasync */
      r.d = which == 1 ? durable : normal;
      r.ops = which == 1 ? d_ops : n_ops; /* each store offered the buffers it can hold */
      int64_t t0 = kvt__now_ns();
      measure m = store_loop_run(&r, 1, 0);
      if (which == 2) {
        int64_t t1 = kvt__now_ns();
        if (fdatasync(sync_fd) < 0) rc = -errno;
        int64_t t2 = kvt__now_ns();
        m.gbs = t2 > t0 ? m.gbs * (double)(t1 - t0) / (double)(t2 - t0) : m.gbs;
      }
      (which == 0 ? nm : which == 1 ? dm : sm)[i] = m;
    }
  }
  if (sync_fd >= 0) close(sync_fd);
  r.d = NULL;
  kvt__disk_stats ds = {0};
  if (durable) kvt__disk_get_stats(durable, &ds);
  kvt__disk_close(normal);
  kvt__disk_close(durable);
  unlink(dpath);
  if (rc == 0) {
    sum_up(nm, rounds, &n_mid, &lo, &hi);
    sum_up(dm, rounds, &d_mid, &lo, &hi);
    sum_up(sm, rounds, &s_mid, &lo, &hi);
    char note[160];
    snprintf(note, sizeof note,
             "durable %.2f vs normal %.2f GB/s: durable spills survive power loss, normal ones a process crash",
             d_mid.gbs, n_mid.gbs);
    kvt_bench_row(rows, "spill 2MiB durable (group fdatasync)", "GB/s", d_mid.gbs, n_mid.gbs, 0, note);
    char detail[512];
    snprintf(detail, sizeof detail,
             "limit = normal spill of the same records, same run; %s; %d rounds alternating, medians;"
             " cpu-s/GB durable %.3f normal %.3f; durable writes per fdatasync %.1f;"
             " normal spill then one fdatasync %.2f GB/s (durable at %.2f of it)",
             r.direct ? "O_DIRECT" : "BUFFERED (O_DIRECT refused)", rounds, d_mid.cpu_per_gb, n_mid.cpu_per_gb,
             ds.syncs ? (double)ds.writes / (double)ds.syncs : 0.0, s_mid.gbs,
             s_mid.gbs > 0 ? d_mid.gbs / s_mid.gbs : 0.0);
    kvt_bench_row_detail(rows, detail);
  }
  free_run(&r);
  return rc;
}

static int micro_disk(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  const char *dir = pick_dir(o);
  static const struct {
    uint64_t payload;
    const char *model;
  } sizes[] = {{2u << 20, "2MiB"}, {917504, "0.875MiB"}, {64u << 10, "64KiB"}};
  for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int rc = one_size(o, rows, dir, sizes[i].payload, sizes[i].model);
    if (rc) {
      fprintf(stderr, "micro disk: %s in %s: %d (%s)\n", sizes[i].model, dir, rc, strerror(rc < 0 ? -rc : rc));
      return rc;
    }
  }
  int rc = durable_row(o, rows, dir);
  if (rc) fprintf(stderr, "micro disk: durable spill in %s: %d (%s)\n", dir, rc, strerror(rc < 0 ? -rc : rc));
  return rc;
}

KVT_BENCH_MICRO(disk, micro_disk)
