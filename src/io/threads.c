/* pread/pwrite thread-pool storage backend, for kernels or sandboxes
 * without io_uring. A bounded request ring (queue_depth), N workers, and a
 * completion ring the single reaper drains. `inflight` counts requests from
 * submit until reaped, so the completion ring can never overflow. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvtier/backend.h"
#include "util/clock.h"

#define THREADS_MAX_WORKERS 16u

typedef struct thr_ctx {
  int fd;
  uint32_t depth, n_workers;
  pthread_mutex_t lock; /* guards everything below */
  pthread_cond_t work;  /* a request was queued, or stop */
  pthread_cond_t done;  /* a completion was posted */
  kvt_io_req *sq;
  kvt_io_cqe *cq;
  uint32_t sq_head, sq_count, cq_head, cq_count, inflight;
  int stop;
  pthread_t workers[THREADS_MAX_WORKERS];
} thr_ctx;

/* Whole-length pread/pwrite: a regular file may return short on a signal;
 * 0 (end of file) ends early and reports the bytes done. */
static int do_rw(int fd, const kvt_io_req *r) {
  size_t done = 0;
  while (done < r->len) {
    char *p = (char *)r->buf + done;
    ssize_t k = r->op == KVT_IO_READ ? pread(fd, p, r->len - done, (off_t)(r->offset + done))
                                     : pwrite(fd, p, r->len - done, (off_t)(r->offset + done));
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return done ? (int)done : -errno;
    if (k == 0) break;
    done += (size_t)k;
  }
  return (int)done;
}

/* Vectored: one preadv/pwritev, and the rest (a short transfer) one
 * iovec at a time through do_rw. */
static int do_rwv(int fd, const kvt_io_req *r) {
  const struct iovec *iov = r->buf;
  int rd = r->op == KVT_IO_READV;
  ssize_t k;
  do k = rd ? preadv(fd, iov, (int)r->len, (off_t)r->offset) : pwritev(fd, iov, (int)r->len, (off_t)r->offset);
  while (k < 0 && (errno == EINTR || errno == EAGAIN));
  if (k < 0) return -errno;
  size_t done = (size_t)k, at = 0;
  for (uint32_t i = 0; i < r->len; at += iov[i].iov_len, i++) {
    if (done >= at + iov[i].iov_len) continue;
    size_t skip = done > at ? done - at : 0;
    kvt_io_req one = {rd ? KVT_IO_READ : KVT_IO_WRITE, -1, r->offset + at + skip, (char *)iov[i].iov_base + skip,
                      (uint32_t)(iov[i].iov_len - skip), NULL};
    int got = do_rw(fd, &one);
    if (got < 0) return done ? (int)done : got;
    done += (size_t)got;
    if ((size_t)got < one.len) break; /* end of file */
  }
  return (int)done;
}

static int do_req(int fd, const kvt_io_req *r) {
  if (r->op == KVT_IO_FSYNC) return fdatasync(fd) < 0 ? -errno : 0;
  if (r->op == KVT_IO_READV || r->op == KVT_IO_WRITEV) return do_rwv(fd, r);
  return do_rw(fd, r);
}

static void *worker_main(void *arg) {
  thr_ctx *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->sq_count && !c->stop) pthread_cond_wait(&c->work, &c->lock);
    if (!c->sq_count) break;
    kvt_io_req r = c->sq[c->sq_head];
    c->sq_head = (c->sq_head + 1) % c->depth;
    c->sq_count--;
    pthread_mutex_unlock(&c->lock);
    int res = do_req(c->fd, &r);
    pthread_mutex_lock(&c->lock);
    c->cq[(c->cq_head + c->cq_count) % c->depth] = (kvt_io_cqe){r.user, res};
    c->cq_count++;
    pthread_cond_signal(&c->done);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

static void stop_workers(thr_ctx *c, uint32_t started) {
  pthread_mutex_lock(&c->lock);
  c->stop = 1;
  pthread_cond_broadcast(&c->work);
  pthread_mutex_unlock(&c->lock);
  for (uint32_t i = 0; i < started; i++) pthread_join(c->workers[i], NULL);
}

static void thr_free(thr_ctx *c) {
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->work);
  pthread_cond_destroy(&c->done);
  free(c->sq);
  free(c->cq);
  free(c);
}

static void thr_close(void *ctx) {
  thr_ctx *c = ctx;
  if (!c) return;
  stop_workers(c, c->n_workers);
  thr_free(c);
}

static thr_ctx *thr_alloc(const kvt_io_open_args *a) {
  thr_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = a->fd;
  c->depth = a->queue_depth;
  c->sq = calloc(c->depth, sizeof *c->sq);
  c->cq = calloc(c->depth, sizeof *c->cq);
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->work, NULL);
  kvt__cond_init_monotonic(&c->done);
  if (!c->sq || !c->cq) {
    thr_free(c);
    return NULL;
  }
  return c;
}

static int thr_open(const kvt_io_open_args *a, void **out) {
  if (!a || !out || a->fd < 0 || a->queue_depth == 0 || a->queue_depth > 32768) return -EINVAL;
  thr_ctx *c = thr_alloc(a);
  if (!c) return -ENOMEM;
  /* Each worker keeps one synchronous I/O in flight: as many as the queue
   * depth allows, up to a cap that keeps idle threads cheap. */
  uint32_t want = a->queue_depth < THREADS_MAX_WORKERS ? a->queue_depth : THREADS_MAX_WORKERS;
  for (; c->n_workers < want; c->n_workers++) {
    int rc = pthread_create(&c->workers[c->n_workers], NULL, worker_main, c);
    if (rc) {
      stop_workers(c, c->n_workers);
      thr_free(c);
      return -rc;
    }
    pthread_setname_np(c->workers[c->n_workers], "kvt-disk-io");
  }
  *out = c;
  return 0;
}

static int thr_submit(void *ctx, const kvt_io_req *reqs, uint32_t n) {
  thr_ctx *c = ctx;
  for (uint32_t i = 0; i < n; i++)
    if (reqs[i].op < KVT_IO_READ || reqs[i].op > KVT_IO_WRITEV) return -EINVAL;
  pthread_mutex_lock(&c->lock);
  uint32_t room = c->depth - c->inflight;
  if (n > room) n = room;
  for (uint32_t i = 0; i < n; i++) c->sq[(c->sq_head + c->sq_count + i) % c->depth] = reqs[i];
  c->sq_count += n;
  c->inflight += n;
  if (n == 1) pthread_cond_signal(&c->work);
  else if (n) pthread_cond_broadcast(&c->work);
  pthread_mutex_unlock(&c->lock);
  return (int)n;
}

static struct timespec deadline_after(int64_t ns) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t t = (int64_t)ts.tv_nsec + ns % 1000000000;
  ts.tv_sec += (time_t)(ns / 1000000000 + t / 1000000000);
  ts.tv_nsec = (long)(t % 1000000000);
  return ts;
}

/* `done` waits on CLOCK_MONOTONIC (set in thr_alloc). */
static void wait_done(thr_ctx *c, uint32_t want, int64_t timeout_ns) {
  if (timeout_ns < 0) {
    while (c->cq_count < want) pthread_cond_wait(&c->done, &c->lock);
    return;
  }
  struct timespec dl = deadline_after(timeout_ns);
  while (c->cq_count < want)
    if (pthread_cond_timedwait(&c->done, &c->lock, &dl) == ETIMEDOUT) break;
}

static int thr_reap(void *ctx, kvt_io_cqe *cqes, uint32_t max, uint32_t min_wait, int64_t timeout_ns) {
  thr_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  if (min_wait > max) min_wait = max;
  if (c->cq_count < min_wait) wait_done(c, min_wait, timeout_ns);
  uint32_t n = c->cq_count < max ? c->cq_count : max;
  for (uint32_t i = 0; i < n; i++) cqes[i] = c->cq[(c->cq_head + i) % c->depth];
  c->cq_head = (c->cq_head + n) % c->depth;
  c->cq_count -= n;
  c->inflight -= n;
  pthread_mutex_unlock(&c->lock);
  return (int)n;
}

static const kvt_io_backend threads_backend = {
    .version = KVT_IO_BACKEND_VERSION,
    .name = "threads",
    .open = thr_open,
    .close = thr_close,
    .submit = thr_submit,
    .reap = thr_reap,
    .caps = KVT_IO_CAP_VECTORED,
};

const kvt_io_backend *kvt_io_backend_threads(void) { return &threads_backend; }
