/* io_uring storage backend: the file registered as a fixed file, the host
 * pool registered as fixed buffers, one io_uring_submit per batch, and
 * completions reaped in batches from the CQ ring (a syscall only when the
 * ring is empty and the caller wants to wait). Records split between
 * kvtier's memory and the engine's go as READV/WRITEV. Submitters share the SQ under
 * a mutex; the single reaper touches only the CQ, which needs no lock. */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/backend.h"
#include "util/log.h"

/* The kernel refuses a registered buffer over 1 GiB: larger host-pool
 * regions are registered as consecutive chunks of this size. */
#define URING_BUF_CHUNK (1ull << 30)
#define URING_MAX_BUFS 16384u /* IORING_MAX_REG_BUFFERS */

typedef struct uring_buf {
  uintptr_t base;
  size_t len;
  uint32_t first_chunk; /* its first index in the registered table */
} uring_buf;

typedef struct uring_ctx {
  struct io_uring ring;
  pthread_mutex_t sq_lock; /* guards the SQ: get_sqe..submit */
  int fd;                  /* fixed-file index 0 when fixed_file, else the fd */
  int fixed_file;
  uint32_t depth;
  atomic_uint inflight;     /* accepted, not yet reaped: bounds CQ use */
  atomic_int need_flush;    /* SQEs left in the ring by an EAGAIN submit */
  uint32_t n_bufs;          /* 0: no fixed buffers (registration refused) */
  uring_buf *bufs;
  struct iovec *iov;
} uring_ctx;

static int count_chunks(const kvt_io_open_args *a, uint32_t *total) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < a->n_bufs; i++) {
    if (!a->bufs[i] || !a->buf_lens[i]) return -EINVAL;
    n += (a->buf_lens[i] + URING_BUF_CHUNK - 1) / URING_BUF_CHUNK;
  }
  if (n > URING_MAX_BUFS) return -E2BIG;
  *total = (uint32_t)n;
  return 0;
}

static void fill_chunks(uring_ctx *c, const kvt_io_open_args *a) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < a->n_bufs; i++) {
    c->bufs[i] = (uring_buf){(uintptr_t)a->bufs[i], a->buf_lens[i], k};
    for (size_t off = 0; off < a->buf_lens[i]; off += URING_BUF_CHUNK, k++) {
      size_t len = a->buf_lens[i] - off < URING_BUF_CHUNK ? a->buf_lens[i] - off : URING_BUF_CHUNK;
      c->iov[k] = (struct iovec){(char *)a->bufs[i] + off, len};
    }
  }
}

/* Fixed buffers are an optimisation: when the kernel refuses them
 * (RLIMIT_MEMLOCK, memory it cannot pin) I/O goes on with plain READ/WRITE. */
static int register_bufs(uring_ctx *c, const kvt_io_open_args *a) {
  uint32_t total = 0;
  if (a->n_bufs == 0) return 0;
  int rc = count_chunks(a, &total);
  if (rc < 0) return rc;
  c->bufs = calloc(a->n_bufs, sizeof *c->bufs);
  c->iov = calloc(total, sizeof *c->iov);
  if (!c->bufs || !c->iov) return -ENOMEM;
  fill_chunks(c, a);
  rc = io_uring_register_buffers(&c->ring, c->iov, total);
  if (rc < 0) {
    kvt__log(KVT_LOG_WARN, "io_uring fixed buffers refused (%s); using plain reads/writes", strerror(-rc));
    return 0;
  }
  c->n_bufs = a->n_bufs;
  return 0;
}

static void uring_close(void *ctx) {
  uring_ctx *c = ctx;
  if (!c) return;
  io_uring_queue_exit(&c->ring);
  pthread_mutex_destroy(&c->sq_lock);
  free(c->bufs);
  free(c->iov);
  free(c);
}

static int setup_ring(uring_ctx *c, const kvt_io_open_args *a) {
  int rc = io_uring_queue_init(a->queue_depth, &c->ring, 0);
  if (rc < 0) return rc;
  /* Timed waits without stealing an SQE need EXT_ARG (5.11); older kernels
   * get the thread pool. */
  if (!(c->ring.features & IORING_FEAT_EXT_ARG)) {
    io_uring_queue_exit(&c->ring);
    return -ENOSYS;
  }
  c->fd = a->fd;
  if (io_uring_register_files(&c->ring, &a->fd, 1) == 0) {
    c->fd = 0;
    c->fixed_file = 1;
  }
  return 0;
}

static int uring_open(const kvt_io_open_args *a, void **out) {
  if (!a || !out || a->fd < 0 || a->queue_depth == 0 || a->queue_depth > 32768) return -EINVAL;
  if (a->n_bufs && (!a->bufs || !a->buf_lens)) return -EINVAL;
  uring_ctx *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  int rc = setup_ring(c, a);
  if (rc < 0) {
    free(c);
    return rc;
  }
  pthread_mutex_init(&c->sq_lock, NULL);
  c->depth = a->queue_depth;
  rc = register_bufs(c, a);
  if (rc < 0) {
    uring_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

/* Index of the registered chunk wholly holding [buf, buf+len), or -1. */
static int fixed_index(const uring_ctx *c, const kvt_io_req *r) {
  if (r->buf_index < 0 || (uint32_t)r->buf_index >= c->n_bufs) return -1;
  const uring_buf *b = &c->bufs[r->buf_index];
  uintptr_t p = (uintptr_t)r->buf;
  if (p < b->base || p - b->base + r->len > b->len) return -1;
  uint64_t off = p - b->base;
  if (off / URING_BUF_CHUNK != (off + r->len - 1) / URING_BUF_CHUNK) return -1;
  return (int)(b->first_chunk + off / URING_BUF_CHUNK);
}

static void prep_one(uring_ctx *c, struct io_uring_sqe *sqe, const kvt_io_req *r) {
  int fi = r->op == KVT_IO_READ || r->op == KVT_IO_WRITE ? fixed_index(c, r) : -1;
  if (r->op == KVT_IO_FSYNC) io_uring_prep_fsync(sqe, c->fd, IORING_FSYNC_DATASYNC);
  else if (r->op == KVT_IO_READV) io_uring_prep_readv(sqe, c->fd, r->buf, r->len, r->offset);
  else if (r->op == KVT_IO_WRITEV) io_uring_prep_writev(sqe, c->fd, r->buf, r->len, r->offset);
  else if (r->op == KVT_IO_READ && fi >= 0)
    io_uring_prep_read_fixed(sqe, c->fd, r->buf, r->len, r->offset, fi);
  else if (r->op == KVT_IO_READ) io_uring_prep_read(sqe, c->fd, r->buf, r->len, r->offset);
  else if (fi >= 0) io_uring_prep_write_fixed(sqe, c->fd, r->buf, r->len, r->offset, fi);
  else io_uring_prep_write(sqe, c->fd, r->buf, r->len, r->offset);
  if (c->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, r->user);
}

/* Hands the queued SQEs to the kernel. EAGAIN/EBUSY (kernel short of
 * resources) leave them in the SQ ring: they stay accepted and the reaper
 * flushes them later. Caller holds sq_lock. */
static int flush_sq(uring_ctx *c) {
  int rc;
  do rc = io_uring_submit(&c->ring);
  while (rc == -EINTR);
  if (rc == -EAGAIN || rc == -EBUSY) {
    atomic_store(&c->need_flush, 1);
    return 0;
  }
  if (rc >= 0) atomic_store(&c->need_flush, 0);
  return rc < 0 ? rc : 0;
}

static int uring_submit(void *ctx, const kvt_io_req *reqs, uint32_t n) {
  uring_ctx *c = ctx;
  uint32_t done = 0;
  for (uint32_t i = 0; i < n; i++)
    if (reqs[i].op < KVT_IO_READ || reqs[i].op > KVT_IO_WRITEV) return -EINVAL;
  pthread_mutex_lock(&c->sq_lock);
  uint32_t room = c->depth - atomic_load(&c->inflight);
  if (n > room) n = room; /* more would overrun the CQ ring */
  for (; done < n; done++) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
    if (!sqe) break; /* SQ full: report what fits */
    prep_one(c, sqe, &reqs[done]);
  }
  atomic_fetch_add(&c->inflight, done);
  int rc = done ? flush_sq(c) : 0;
  pthread_mutex_unlock(&c->sq_lock);
  return rc < 0 && done == 0 ? rc : (int)done;
}

static uint32_t drain_cq(uring_ctx *c, kvt_io_cqe *out, uint32_t max) {
  struct io_uring_cqe *batch[64];
  uint32_t got = 0;
  while (got < max) {
    unsigned want = max - got < 64 ? max - got : 64;
    unsigned k = io_uring_peek_batch_cqe(&c->ring, batch, want);
    for (unsigned i = 0; i < k; i++)
      out[got + i] = (kvt_io_cqe){io_uring_cqe_get_data(batch[i]), batch[i]->res};
    io_uring_cq_advance(&c->ring, k);
    got += k;
    if (k < want) break;
  }
  atomic_fetch_sub(&c->inflight, got);
  return got;
}

static int uring_reap(void *ctx, kvt_io_cqe *cqes, uint32_t max, uint32_t min_wait, int64_t timeout_ns) {
  uring_ctx *c = ctx;
  if (atomic_load(&c->need_flush)) {
    pthread_mutex_lock(&c->sq_lock);
    flush_sq(c);
    pthread_mutex_unlock(&c->sq_lock);
  }
  uint32_t got = drain_cq(c, cqes, max);
  if (got >= min_wait || got == max) return (int)got;
  struct __kernel_timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
  struct io_uring_cqe *cqe;
  int rc = io_uring_wait_cqes(&c->ring, &cqe, min_wait - got, timeout_ns < 0 ? NULL : &ts, NULL);
  if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN) return got ? (int)got : rc;
  return (int)(got + drain_cq(c, cqes + got, max - got));
}

static const kvt_io_backend uring_backend = {
    .version = KVT_IO_BACKEND_VERSION,
    .name = "io_uring",
    .open = uring_open,
    .close = uring_close,
    .submit = uring_submit,
    .reap = uring_reap,
    .caps = KVT_IO_CAP_VECTORED,
};

const kvt_io_backend *kvt_io_backend_uring(void) { return &uring_backend; }
