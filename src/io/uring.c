/* io_uring storage backend: the file registered as a fixed file, the host
 * pool registered as fixed buffers (in a sparse table with room for
 * buffers registered later: the engine's regions), one io_uring_submit per
 * batch, and completions reaped in batches from the CQ ring (a syscall
 * only when the ring is empty and the caller wants to wait). Records split
 * between kvtier's memory and the engine's go as READV/WRITEV, or, when
 * every piece lies in a registered buffer, as one READ_FIXED/WRITE_FIXED
 * per piece reported as one completion. Submitters share the SQ under
 * a mutex; the single reaper touches only the CQ, which needs no lock. */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier/backend.h"
#include "util/log.h"

/* The kernel refuses a registered buffer over 1 GiB: larger host-pool
 * regions are registered as consecutive chunks of this size. */
#define URING_BUF_CHUNK (1ull << 30)
#define URING_MAX_BUFS 16384u /* IORING_MAX_REG_BUFFERS */
/* Table entries reserved at open (a sparse table) for buffers registered
 * later (buf_register: the engine's regions, staging prefixes), one per
 * GiB of each. */
#define URING_DYN_BUFS 512u
/* SQEs per request the ring is sized for: a READV_FIXED of n iovecs is n
 * READ_FIXEDs, one more per GiB boundary an iovec crosses. */
#define URING_SQE_PER_REQ (2u * KVT_IO_MAX_FIXED_VEC)

/* A request issued as several SQEs: one completion once all are reaped. */
typedef struct uring_multi {
  void *user;
  /* SQEs not reaped yet: stored (release) after the rest is set, before
   * the SQEs go, so the reaper's first decrement (acquire) sees the rest
   * (the ring's shared memory orders it too, but no tool sees that). */
  atomic_uint left;
  int err;       /* the first error */
  uint64_t bytes;
  uint32_t next_free;
} uring_multi;

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
  atomic_uint inflight;     /* requests accepted, not yet reaped: at most depth */
  atomic_uint inflight_sqes; /* their SQEs: at most entries, so the CQ cannot overrun */
  atomic_int need_flush;    /* SQEs left in the ring by an EAGAIN submit */
  uint32_t n_bufs;          /* 0: no fixed buffers (registration refused) */
  uring_buf *bufs;
  struct iovec *iov;
  uint32_t entries;         /* SQ entries (CQ: twice that); bounds inflight */
  /* Buffers registered after open: table entries [dyn_base, dyn_base +
   * URING_DYN_BUFS); dyn_len[k] is the chunk count of a buffer starting at
   * entry k (0: free), dyn_ptr[k] its base. Guarded by sq_lock. */
  int sparse;               /* the table was reserved sparse: buf_register works */
  uint32_t dyn_base;
  uint32_t dyn_len[URING_DYN_BUFS];
  uintptr_t dyn_ptr[URING_DYN_BUFS];
  /* Multi-SQE requests in flight: a free list under its own lock (taken
   * at submission, given back by the reaper, which must never wait for
   * sq_lock: a submitter holds it through the submit system call). */
  pthread_mutex_t multi_lock;
  uring_multi *multi;
  uint32_t multi_free;      /* head, UINT32_MAX when empty */
  uint32_t n_multi;
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
 * (RLIMIT_MEMLOCK, memory it cannot pin) I/O goes on with plain READ/WRITE.
 * The table is reserved sparse, the host pool's chunks first and room for
 * URING_DYN_BUFS more (buf_register); a kernel without sparse tables
 * (before 5.19) gets the host pool's alone, and no buf_register. */
/* Registers iov[0..n) at table entries off..off+n-1, all or none: the
 * kernel registers entries in order and, when one fails partway, returns
 * how many it did (not an error); those are emptied again here. 0 or
 * -errno. Caller serialises updates of the table. */
static int update_all(uring_ctx *c, uint32_t off, const struct iovec *iov, uint32_t n) {
  int rc = io_uring_register_buffers_update_tag(&c->ring, off, iov, NULL, n);
  if (rc == (int)n) return 0;
  if (rc >= 0) {
    /* The entry that stopped it, alone, for its errno. */
    int why = rc < (int)n ? io_uring_register_buffers_update_tag(&c->ring, off + (uint32_t)rc, iov + rc, NULL, 1) : -EIO;
    uint32_t set = (uint32_t)rc + (why == 1);
    struct iovec *none = calloc(set ? set : 1, sizeof *none);
    if (!none || (set && io_uring_register_buffers_update_tag(&c->ring, off, none, NULL, set) < 0))
      kvt__log(KVT_LOG_WARN, "io_uring: a partly registered fixed buffer could not be emptied");
    free(none);
    rc = why < 0 ? why : -EFAULT;
  }
  return rc;
}

static int register_bufs(uring_ctx *c, const kvt_io_open_args *a) {
  uint32_t total = 0;
  int rc = a->n_bufs ? count_chunks(a, &total) : 0;
  if (rc < 0) return rc;
  if (a->n_bufs) {
    c->bufs = calloc(a->n_bufs, sizeof *c->bufs);
    c->iov = calloc(total, sizeof *c->iov);
    if (!c->bufs || !c->iov) return -ENOMEM;
    fill_chunks(c, a);
  }
  c->dyn_base = total;
  if (total + URING_DYN_BUFS <= URING_MAX_BUFS && io_uring_register_buffers_sparse(&c->ring, total + URING_DYN_BUFS) == 0) {
    c->sparse = 1;
    rc = total ? update_all(c, 0, c->iov, total) : 0;
    if (rc == 0) {
      c->n_bufs = a->n_bufs;
      return 0;
    }
    kvt__log(KVT_LOG_WARN, "io_uring fixed buffers refused (%s); using plain reads/writes", strerror(-rc));
    return 0; /* the table stays, empty where the pool was: buf_register still works */
  }
  if (!total) return 0;
  rc = io_uring_register_buffers(&c->ring, c->iov, total);
  if (rc < 0) {
    kvt__log(KVT_LOG_WARN, "io_uring fixed buffers refused (%s); using plain reads/writes", strerror(-rc));
    return 0;
  }
  c->n_bufs = a->n_bufs;
  return 0;
}

static int uring_buf_register(void *ctx, void *base, size_t len, uint32_t *index) {
  uring_ctx *c = ctx;
  if (!c->sparse || c->entries < URING_SQE_PER_REQ) return KVT_EUNSUPPORTED;
  if (!base || !len || ((uintptr_t)base & 4095)) return -EINVAL;
  if (len > (uint64_t)URING_DYN_BUFS * URING_BUF_CHUNK) return -ENOSPC;
  uint32_t need = (uint32_t)((len + URING_BUF_CHUNK - 1) / URING_BUF_CHUNK);
  struct iovec *iov = calloc(need, sizeof *iov);
  if (!iov) return -ENOMEM;
  for (uint32_t k = 0; k < need; k++) {
    size_t off = (size_t)k * URING_BUF_CHUNK;
    iov[k] = (struct iovec){(char *)base + off, len - off < URING_BUF_CHUNK ? len - off : URING_BUF_CHUNK};
  }
  pthread_mutex_lock(&c->sq_lock);
  uint32_t at = UINT32_MAX;
  for (uint32_t k = 0, run = 0; k < URING_DYN_BUFS && at == UINT32_MAX; k++) {
    if (c->dyn_len[k]) {
      k += c->dyn_len[k] - 1;
      run = 0;
      continue;
    }
    if (++run == need) at = k + 1 - need;
  }
  int rc = -ENOSPC;
  if (at != UINT32_MAX) {
    /* The kernel pins the pages here, holding the ring's lock: submissions
     * wait meanwhile (per GiB: 2 ms in huge pages, 27-42 ms in 4 KiB pages;
     * pages never touched were faulted in before, with no lock held:
     * kvt__io_buf_register), so this lock is held too. */
    rc = update_all(c, c->dyn_base + at, iov, need);
    if (rc == 0) {
      c->dyn_len[at] = need;
      c->dyn_ptr[at] = (uintptr_t)base;
      *index = c->dyn_base + at;
    }
  }
  pthread_mutex_unlock(&c->sq_lock);
  free(iov);
  return rc;
}

static void uring_buf_unregister(void *ctx, uint32_t index) {
  uring_ctx *c = ctx;
  if (!c->sparse || index < c->dyn_base || index - c->dyn_base >= URING_DYN_BUFS) return;
  uint32_t at = index - c->dyn_base;
  pthread_mutex_lock(&c->sq_lock);
  uint32_t n = c->dyn_len[at];
  struct iovec *none = n ? calloc(n, sizeof *none) : NULL;
  /* Empty entries: the kernel unpins the pages once no request holds them. */
  if (n && (!none || io_uring_register_buffers_update_tag(&c->ring, index, none, NULL, n) < 0))
    kvt__log(KVT_LOG_WARN, "io_uring: a fixed buffer could not be unregistered");
  free(none);
  c->dyn_len[at] = 0;
  c->dyn_ptr[at] = 0;
  pthread_mutex_unlock(&c->sq_lock);
}

static void uring_close(void *ctx) {
  uring_ctx *c = ctx;
  if (!c) return;
  io_uring_queue_exit(&c->ring);
  pthread_mutex_destroy(&c->sq_lock);
  pthread_mutex_destroy(&c->multi_lock);
  free(c->bufs);
  free(c->iov);
  free(c->multi);
  free(c);
}

static int setup_ring(uring_ctx *c, const kvt_io_open_args *a) {
  uint32_t entries = a->queue_depth * URING_SQE_PER_REQ;
  if (entries > 32768) entries = 32768;
  int rc = io_uring_queue_init(entries, &c->ring, 0);
  /* A kernel that charges rings to RLIMIT_MEMLOCK (before 5.12) may refuse
   * the larger ring: the configured depth then, without fixed-buffer
   * records (buf_register refuses). */
  if (rc == -ENOMEM && entries > a->queue_depth) rc = io_uring_queue_init(a->queue_depth, &c->ring, 0);
  if (rc < 0) return rc;
  c->entries = c->ring.sq.ring_entries;
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
  pthread_mutex_init(&c->multi_lock, NULL);
  c->depth = a->queue_depth;
  c->n_multi = c->entries;
  c->multi = calloc(c->n_multi, sizeof *c->multi);
  if (!c->multi) {
    uring_close(c);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < c->n_multi; i++) c->multi[i].next_free = i + 1 < c->n_multi ? i + 1 : UINT32_MAX;
  c->multi_free = 0;
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

/* The table entry holding [p, p+len) of the buffer registered at index,
 * len cut at the end of its chunk (a GiB from the buffer's base). Caller
 * holds sq_lock. */
static uint32_t fixed_chunk(const uring_ctx *c, uint32_t index, uintptr_t p, size_t *len) {
  uintptr_t base = index >= c->dyn_base && index - c->dyn_base < URING_DYN_BUFS ? c->dyn_ptr[index - c->dyn_base] : 0;
  if (!base) return index;
  uint64_t off = p - base;
  uint64_t room = URING_BUF_CHUNK - off % URING_BUF_CHUNK;
  if (*len > room) *len = room;
  return index + (uint32_t)(off / URING_BUF_CHUNK);
}

/* SQEs a READV_FIXED / WRITEV_FIXED request takes: one per iovec, one
 * more per chunk boundary inside it (as prep_fixed splits them). Caller
 * holds sq_lock. */
static uint32_t fixed_sqes(const uring_ctx *c, const kvt_io_req *r) {
  const kvt_io_fixed_vec *fv = r->buf;
  uint32_t n = 0;
  for (uint32_t k = 0; k < r->len; k++) {
    uintptr_t p = (uintptr_t)fv->iov[k].iov_base;
    for (size_t left = fv->iov[k].iov_len, len; left; p += len, left -= len, n++) {
      len = left;
      fixed_chunk(c, fv->buf_index[k], p, &len);
    }
  }
  return n;
}

/* One READ_FIXED / WRITE_FIXED per iovec (split at GiB chunks), their
 * user data the request's tracker (an address in c->multi). The caller
 * checked there are fixed_sqes() SQEs free. */
static void prep_fixed(uring_ctx *c, const kvt_io_req *r, uint32_t n_sqe) {
  const kvt_io_fixed_vec *fv = r->buf;
  pthread_mutex_lock(&c->multi_lock);
  uint32_t t = c->multi_free;
  uring_multi *m = &c->multi[t];
  c->multi_free = m->next_free;
  pthread_mutex_unlock(&c->multi_lock);
  m->user = r->user;
  m->err = 0;
  m->bytes = 0;
  atomic_store_explicit(&m->left, n_sqe, memory_order_release);
  uint64_t off = r->offset;
  for (uint32_t k = 0; k < r->len; k++) {
    uintptr_t p = (uintptr_t)fv->iov[k].iov_base;
    size_t left = fv->iov[k].iov_len;
    while (left) {
      size_t len = left;
      uint32_t idx = fixed_chunk(c, fv->buf_index[k], p, &len);
      struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
      if (r->op == KVT_IO_READV_FIXED) io_uring_prep_read_fixed(sqe, c->fd, (void *)p, (unsigned)len, off, (int)idx);
      else io_uring_prep_write_fixed(sqe, c->fd, (const void *)p, (unsigned)len, off, (int)idx);
      if (c->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, m);
      p += len, off += len, left -= len;
    }
  }
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
  /* A short count leaves SQEs in the ring: the reaper flushes them (a
   * record of several SQEs completes only once all are in). */
  if (rc >= 0) atomic_store(&c->need_flush, io_uring_sq_ready(&c->ring) > 0);
  return rc < 0 ? rc : 0;
}

static int uring_submit(void *ctx, const kvt_io_req *reqs, uint32_t n) {
  uring_ctx *c = ctx;
  uint32_t done = 0, sqes = 0;
  for (uint32_t i = 0; i < n; i++) {
    int op = reqs[i].op;
    if (op < KVT_IO_READ || op > KVT_IO_WRITEV_FIXED) return -EINVAL;
    if ((op == KVT_IO_READV_FIXED || op == KVT_IO_WRITEV_FIXED) &&
        (!c->sparse || !reqs[i].buf || !reqs[i].len || reqs[i].len > KVT_IO_MAX_FIXED_VEC))
      return -EINVAL;
    if (op == KVT_IO_READV_FIXED || op == KVT_IO_WRITEV_FIXED) { /* an empty piece would never complete */
      const kvt_io_fixed_vec *fv = reqs[i].buf;
      for (uint32_t k = 0; k < reqs[i].len; k++)
        if (!fv->iov[k].iov_len) return -EINVAL;
    }
  }
  pthread_mutex_lock(&c->sq_lock);
  /* At most depth requests and `entries` SQEs outstanding (the CQ holds
   * twice that), and whole requests only. */
  uint32_t room = c->depth - atomic_load(&c->inflight);
  uint32_t sq_room = c->entries - atomic_load(&c->inflight_sqes);
  if (n > room) n = room;
  for (; done < n; done++) {
    const kvt_io_req *r = &reqs[done];
    if (r->op == KVT_IO_READV_FIXED || r->op == KVT_IO_WRITEV_FIXED) {
      uint32_t k = fixed_sqes(c, r);
      if (k > sq_room - sqes || k > io_uring_sq_space_left(&c->ring)) break;
      prep_fixed(c, r, k);
      sqes += k;
      continue;
    }
    if (sqes == sq_room) break;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
    if (!sqe) break; /* SQ full: report what fits */
    prep_one(c, sqe, r);
    sqes++;
  }
  atomic_fetch_add(&c->inflight, done);
  atomic_fetch_add(&c->inflight_sqes, sqes);
  int rc = done ? flush_sq(c) : 0;
  pthread_mutex_unlock(&c->sq_lock);
  return rc < 0 && done == 0 ? rc : (int)done;
}

/* A reaped SQE of a multi-SQE request: 1 (and *out set) when it was the
 * request's last. A short one makes the sum short, which the caller sees
 * as a short transfer of the whole request. */
static int multi_reaped(uring_ctx *c, uring_multi *m, int res, kvt_io_cqe *out, uint32_t *freed) {
  if (atomic_fetch_sub_explicit(&m->left, 1, memory_order_acq_rel) != 1) {
    if (res < 0 && !m->err) m->err = res;
    if (res > 0) m->bytes += (uint64_t)res;
    return 0;
  }
  if (res < 0 && !m->err) m->err = res;
  if (res > 0) m->bytes += (uint64_t)res;
  int r = m->err ? m->err : m->bytes > INT32_MAX ? -EIO : (int)m->bytes;
  *out = (kvt_io_cqe){m->user, r};
  freed[0] = (uint32_t)(m - c->multi);
  return 1;
}

static uint32_t drain_cq(uring_ctx *c, kvt_io_cqe *out, uint32_t max) {
  struct io_uring_cqe *batch[64];
  uint32_t freed[64];
  uint32_t got = 0, reaped = 0;
  while (got < max) {
    unsigned want = max - got < 64 ? max - got : 64;
    unsigned k = io_uring_peek_batch_cqe(&c->ring, batch, want), nf = 0;
    for (unsigned i = 0; i < k; i++) {
      uintptr_t u = (uintptr_t)io_uring_cqe_get_data(batch[i]), m0 = (uintptr_t)c->multi;
      if (u >= m0 && u < m0 + c->n_multi * sizeof *c->multi) {
        if (multi_reaped(c, (uring_multi *)u, batch[i]->res, &out[got], &freed[nf])) got++, nf++;
      } else {
        out[got++] = (kvt_io_cqe){(void *)u, batch[i]->res};
      }
    }
    io_uring_cq_advance(&c->ring, k);
    reaped += k;
    if (nf) {
      pthread_mutex_lock(&c->multi_lock);
      for (unsigned i = 0; i < nf; i++) c->multi[freed[i]].next_free = c->multi_free, c->multi_free = freed[i];
      pthread_mutex_unlock(&c->multi_lock);
    }
    if (k < want) break;
  }
  atomic_fetch_sub(&c->inflight_sqes, reaped);
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
  /* A request of several SQEs completes with its last one: wait again
   * until min_wait requests did, or the time is up. */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int64_t left = timeout_ns;
    if (timeout_ns >= 0) {
      struct timespec t1;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      left = timeout_ns - ((int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec));
      if (left < 0) left = 0;
    }
    struct __kernel_timespec ts = {left / 1000000000, left % 1000000000};
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqes(&c->ring, &cqe, min_wait - got, left < 0 ? NULL : &ts, NULL);
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN) return got ? (int)got : rc;
    got += drain_cq(c, cqes + got, max - got);
    if (got >= min_wait || got == max || rc == -ETIME || left == 0 || rc == -EINTR) return (int)got;
  }
}

static const kvt_io_backend uring_backend = {
    .version = KVT_IO_BACKEND_VERSION,
    .name = "io_uring",
    .open = uring_open,
    .close = uring_close,
    .submit = uring_submit,
    .reap = uring_reap,
    .caps = KVT_IO_CAP_VECTORED | KVT_IO_CAP_FIXED_VEC,
    .buf_register = uring_buf_register,
    .buf_unregister = uring_buf_unregister,
};

const kvt_io_backend *kvt_io_backend_uring(void) { return &uring_backend; }
