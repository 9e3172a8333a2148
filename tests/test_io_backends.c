/* The storage backends (io_uring, threads) against one suite: byte-exact
 * round trips with O_DIRECT alignment, the registered-buffer path, queue
 * depth saturation, many requests in flight, end-of-file short reads, the
 * fault hooks of the io.c wrappers, the automatic fallback, and vectored
 * reads and writes. */
#include "helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "io/io.h"
#include "util/fault.h"

#define FILE_BYTES (16u << 20)

static const kvt_io_backend *g_be;

typedef struct fixture {
  int fd;
  char path[4200];
  void *ctx;
} fixture;

static int open_file(char *path, size_t cap) {
  static int n;
  snprintf(path, cap, "%s/io-%d-%d.bin", kvt_test_tmpdir(), (int)getpid(), n++);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644); /* tmpfs */
  return fd;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->fd = open_file(f->path, sizeof f->path);
  if (f->fd < 0 || ftruncate(f->fd, FILE_BYTES) < 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  if (f->ctx) g_be->close(f->ctx);
  close(f->fd);
  unlink(f->path);
  free(f);
  return 0;
}

static void be_open(fixture *f, uint32_t depth, const void *const *bufs, const size_t *lens, uint32_t n) {
  kvt_io_open_args a = {.fd = f->fd, .queue_depth = depth, .bufs = bufs, .buf_lens = lens, .n_bufs = n};
  assert_int_equal(g_be->open(&a, &f->ctx), 0);
}

static void *xalloc(size_t n) {
  void *p = aligned_alloc(4096, n);
  assert_non_null(p);
  return p;
}

/* Submits all n requests, reaping whenever the queue is full; checks each
 * completion transferred its full length. */
static void run_all(fixture *f, kvt_io_req *r, uint32_t n) {
  kvt_io_cqe cqes[64];
  uint32_t sent = 0, got = 0;
  while (got < n) {
    if (sent < n) {
      int k = g_be->submit(f->ctx, r + sent, n - sent);
      assert_true(k >= 0);
      sent += (uint32_t)k;
    }
    int k = g_be->reap(f->ctx, cqes, 64, sent > got ? 1 : 0, -1);
    assert_true(k >= 0);
    for (int i = 0; i < k; i++) {
      kvt_io_req *q = cqes[i].user;
      assert_int_equal(cqes[i].res, (int)q->len);
    }
    got += (uint32_t)k;
  }
}

static void make_reqs(kvt_io_req *r, uint32_t n, int op, char *buf, uint32_t len, int buf_index) {
  for (uint32_t i = 0; i < n; i++)
    r[i] = (kvt_io_req){op, buf_index, (uint64_t)i * len, buf + (size_t)i * len, len, &r[i]};
}

static void test_round_trip_byte_exact(void **state) {
  fixture *f = *state;
  be_open(f, 16, NULL, NULL, 0);
  enum { N = 24, LEN = 68 * 1024 }; /* a 64 KiB record plus its 4 KiB prefix */
  char *w = xalloc((size_t)N * LEN), *rd = xalloc((size_t)N * LEN);
  kvt_test_fill(w, (size_t)N * LEN, 11);
  memset(rd, 0, (size_t)N * LEN);
  kvt_io_req r[N];
  make_reqs(r, N, KVT_IO_WRITE, w, LEN, -1);
  run_all(f, r, N);
  make_reqs(r, N, KVT_IO_READ, rd, LEN, -1);
  run_all(f, r, N);
  assert_true(kvt_test_check(rd, (size_t)N * LEN, 11));
  free(w);
  free(rd);
}

static void test_registered_buffers(void **state) {
  fixture *f = *state;
  enum { N = 8, LEN = 256 * 1024 };
  char *pool = xalloc((size_t)2 * N * LEN);
  const void *bufs[1] = {pool};
  size_t lens[1] = {(size_t)2 * N * LEN};
  be_open(f, 8, bufs, lens, 1);
  kvt_test_fill(pool, (size_t)N * LEN, 5);
  memset(pool + (size_t)N * LEN, 0, (size_t)N * LEN);
  kvt_io_req r[N];
  make_reqs(r, N, KVT_IO_WRITE, pool, LEN, 0);
  run_all(f, r, N);
  make_reqs(r, N, KVT_IO_READ, pool + (size_t)N * LEN, LEN, 0);
  run_all(f, r, N);
  assert_true(kvt_test_check(pool + (size_t)N * LEN, (size_t)N * LEN, 5));
  /* A buffer outside the registered region with an index still works. */
  char *other = xalloc(LEN);
  kvt_io_req q = {KVT_IO_READ, 0, 0, other, LEN, &q};
  run_all(f, &q, 1);
  assert_memory_equal(other, pool, LEN);
  free(other);
  free(pool);
}

/* Submits one request and returns its completion's result. */
static int run_one(fixture *f, kvt_io_req *r) {
  assert_int_equal(g_be->submit(f->ctx, r, 1), 1);
  kvt_io_cqe cqe;
  assert_int_equal(g_be->reap(f->ctx, &cqe, 1, 1, -1), 1);
  assert_ptr_equal(cqe.user, r);
  return cqe.res;
}

/* A pool buffer the kernel will not pin (a shared file mapping: the
 * kernel refuses long-term pins of such pages) among pinnable ones: the
 * backend falls back to plain reads and writes for the whole pool rather
 * than half-register it (a half-registered pool failed every I/O from the
 * unregistered part with -EFAULT). Every buffer's writes and reads land. */
static void test_pool_the_kernel_cannot_pin(void **state) {
  fixture *f = *state;
  enum { LEN = 1 << 20 };
  char mpath[4200];
  int mfd = open_file(mpath, sizeof mpath);
  assert_true(mfd >= 0);
  assert_int_equal(ftruncate(mfd, LEN), 0);
  void *b[3] = {xalloc(LEN), xalloc(LEN), mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)};
  assert_true(b[2] != MAP_FAILED);
  size_t lens[3] = {LEN, LEN, LEN};
  be_open(f, 8, (const void *const *)b, lens, 3);
  for (int i = 0; i < 3; i++) {
    kvt_test_fill(b[i], LEN, 40 + (uint64_t)i);
    kvt_io_req w = {KVT_IO_WRITE, i, (uint64_t)i * LEN, b[i], LEN, &w};
    assert_int_equal(run_one(f, &w), LEN);
  }
  for (int i = 0; i < 3; i++) {
    memset(b[i], 0, LEN);
    kvt_io_req r = {KVT_IO_READ, i, (uint64_t)i * LEN, b[i], LEN, &r};
    assert_int_equal(run_one(f, &r), LEN);
    assert_true(kvt_test_check(b[i], LEN, 40 + (uint64_t)i));
  }
  munmap(b[2], LEN);
  free(b[0]);
  free(b[1]);
  close(mfd);
  unlink(mpath);
}


/* READV/WRITEV: a record written from pieces scattered in memory reads
 * back whole and into other pieces, byte-exact; the completion counts the
 * bytes of every iovec; a read past the end of the file comes back short. */
static void test_vectored_round_trip(void **state) {
  fixture *f = *state;
  assert_true(g_be->version >= 2 && (g_be->caps & KVT_IO_CAP_VECTORED));
  be_open(f, 8, NULL, NULL, 0);
  enum { LEN = 20 * 4096 };
  char *src = xalloc(LEN), *whole = xalloc(LEN), *back = xalloc(LEN);
  kvt_test_fill(src, LEN, 21);
  /* Pages 0 | 1-4 | 5-19, written from the end of src backwards. */
  struct iovec wv[3] = {{src + 16 * 4096, 4096}, {src + 12 * 4096, 4 * 4096}, {src, 12 * 4096}};
  kvt_io_req w = {KVT_IO_WRITEV, -1, 8 * 4096, wv, 3, &w};
  assert_int_equal(run_one(f, &w), LEN - 3 * 4096);
  struct iovec wv2[2] = {{src + 17 * 4096, 2 * 4096}, {src + 19 * 4096, 4096}};
  kvt_io_req w2 = {KVT_IO_WRITEV, -1, 8 * 4096 + LEN - 3 * 4096, wv2, 2, &w2};
  assert_int_equal(run_one(f, &w2), 3 * 4096);
  kvt_io_req r = {KVT_IO_READ, -1, 8 * 4096, whole, LEN, &r};
  assert_int_equal(run_one(f, &r), LEN);
  assert_memory_equal(whole, src + 16 * 4096, 4096);
  assert_memory_equal(whole + 4096, src + 12 * 4096, 4 * 4096);
  assert_memory_equal(whole + 5 * 4096, src, 12 * 4096);
  assert_memory_equal(whole + 17 * 4096, src + 17 * 4096, 3 * 4096);
  struct iovec rv[4] = {{back + 10 * 4096, 10 * 4096}, {back + 4096, 4096}, {back, 4096}, {back + 2 * 4096, 8 * 4096}};
  kvt_io_req q = {KVT_IO_READV, -1, 8 * 4096, rv, 4, &q};
  assert_int_equal(run_one(f, &q), LEN);
  assert_memory_equal(back + 10 * 4096, whole, 10 * 4096);
  assert_memory_equal(back + 4096, whole + 10 * 4096, 4096);
  assert_memory_equal(back, whole + 11 * 4096, 4096);
  assert_memory_equal(back + 2 * 4096, whole + 12 * 4096, 8 * 4096);
  kvt_io_req eof = {KVT_IO_READV, -1, FILE_BYTES - 4096, rv, 4, &eof};
  assert_int_equal(run_one(f, &eof), 4096);
  free(src);
  free(whole);
  free(back);
}

static void test_queue_depth_saturation(void **state) {
  fixture *f = *state;
  be_open(f, 8, NULL, NULL, 0);
  enum { N = 20, LEN = 4096 };
  char *buf = xalloc((size_t)N * LEN);
  kvt_io_req r[N];
  make_reqs(r, N, KVT_IO_WRITE, buf, LEN, -1);
  assert_int_equal(g_be->submit(f->ctx, r, N), 8); /* what fits */
  assert_int_equal(g_be->submit(f->ctx, r + 8, N - 8), 0);
  kvt_io_cqe c[8];
  int got = 0;
  while (got < 8) {
    int k = g_be->reap(f->ctx, c, 8, (uint32_t)(8 - got), -1);
    assert_true(k > 0);
    got += k;
  }
  assert_int_equal(g_be->submit(f->ctx, r + 8, 4), 4);
  for (got = 0; got < 4;) {
    int k = g_be->reap(f->ctx, c, 8, 1, -1);
    assert_true(k > 0);
    got += k;
  }
  run_all(f, r + 12, N - 12);
  free(buf);
}

static void test_many_in_flight(void **state) {
  fixture *f = *state;
  be_open(f, 32, NULL, NULL, 0);
  enum { N = 2048, LEN = 4096 };
  char *w = xalloc((size_t)N * LEN), *rd = xalloc((size_t)N * LEN);
  kvt_test_fill(w, (size_t)N * LEN, 77);
  kvt_io_req *r = calloc(N, sizeof *r);
  make_reqs(r, N, KVT_IO_WRITE, w, LEN, -1);
  run_all(f, r, N);
  make_reqs(r, N, KVT_IO_READ, rd, LEN, -1);
  run_all(f, r, N);
  assert_true(kvt_test_check(rd, (size_t)N * LEN, 77));
  free(r);
  free(w);
  free(rd);
}

static void test_short_read_at_eof_and_fsync(void **state) {
  fixture *f = *state;
  be_open(f, 4, NULL, NULL, 0);
  char *buf = xalloc(8192);
  kvt_io_req r = {KVT_IO_READ, -1, FILE_BYTES - 4096, buf, 8192, &r};
  kvt_io_cqe c;
  assert_int_equal(g_be->submit(f->ctx, &r, 1), 1);
  assert_int_equal(g_be->reap(f->ctx, &c, 1, 1, -1), 1);
  assert_int_equal(c.res, 4096); /* short: reported as is, never padded */
  kvt_io_req s = {KVT_IO_FSYNC, -1, 0, NULL, 0, &s};
  assert_int_equal(g_be->submit(f->ctx, &s, 1), 1);
  assert_int_equal(g_be->reap(f->ctx, &c, 1, 1, -1), 1);
  assert_int_equal(c.res, 0);
  assert_ptr_equal(c.user, &s);
  kvt_io_req bad = {99, -1, 0, buf, 4096, NULL};
  assert_int_equal(g_be->submit(f->ctx, &bad, 1), -EINVAL);
  free(buf);
}

static void test_reap_timeout_empty(void **state) {
  fixture *f = *state;
  be_open(f, 4, NULL, NULL, 0);
  kvt_io_cqe c;
  assert_int_equal(g_be->reap(f->ctx, &c, 1, 1, 1000000), 0);
  assert_int_equal(g_be->reap(f->ctx, &c, 1, 0, 0), 0);
}

/* ---- the io.c wrappers ---- */

static int fault_nth;   /* the submission (1-based) or completion to fault */
static int fault_code;
static int fault_seen;

static int fault_hook(void *ctx, int site, int64_t arg) {
  int want = *(int *)ctx;
  if (site != want) return 0;
  return ++fault_seen == fault_nth ? fault_code : 0;
}

static kvt__io open_io(fixture *f) {
  kvt__io io;
  const kvt_io_backend *list[1] = {g_be};
  kvt_io_open_args a = {.fd = f->fd, .queue_depth = 8};
  assert_int_equal(kvt__io_open_first(list, 1, &a, &io), 0);
  assert_string_equal(kvt__io_name(&io), g_be->name);
  return io;
}

static void test_wrapper_submit_fault(void **state) {
  fixture *f = *state;
  kvt__io io = open_io(f);
  char *buf = xalloc(4 * 4096);
  kvt_io_req r[4];
  make_reqs(r, 4, KVT_IO_WRITE, buf, 4096, -1);
  int site = KVT_FAULT_IO_SUBMIT;
  fault_nth = 3, fault_code = -ENOSPC, fault_seen = 0;
  kvt__fault_set(fault_hook, &site);
  assert_int_equal(kvt__io_submit(&io, r, 4), 2);      /* stops before the faulted one */
  /* The retried request keeps its fault (the hook fired once, for it). */
  assert_int_equal(kvt__io_submit(&io, r + 2, 2), -ENOSPC); /* which alone fails */
  assert_int_equal(fault_seen, 3);                     /* without asking the hook again */
  assert_int_equal(kvt__io_submit(&io, r + 3, 1), 1);  /* the rest goes through */
  kvt__fault_set(NULL, NULL);
  kvt_io_cqe c[4];
  int got = 0;
  while (got < 3) got += kvt__io_reap(&io, c + got, 4, 1, -1);
  for (int i = 0; i < 3; i++) assert_int_equal(c[i].res, 4096);
  kvt__io_close(&io);
  free(buf);
}

static void test_wrapper_complete_fault(void **state) {
  fixture *f = *state;
  kvt__io io = open_io(f);
  char *buf = xalloc(8192);
  int site = KVT_FAULT_IO_COMPLETE;
  int codes[2] = {-EIO, 4096};
  for (int k = 0; k < 2; k++) {
    kvt_io_req r = {KVT_IO_WRITE, -1, 0, buf, 8192, &r};
    fault_nth = 1, fault_code = codes[k], fault_seen = 0;
    kvt__fault_set(fault_hook, &site);
    assert_int_equal(kvt__io_submit(&io, &r, 1), 1);
    kvt_io_cqe c;
    assert_int_equal(kvt__io_reap(&io, &c, 1, 1, -1), 1);
    kvt__fault_set(NULL, NULL);
    assert_int_equal(c.res, codes[k]); /* -EIO, or short: 4096 of 8192 */
  }
  kvt__io_close(&io);
  free(buf);
}

static int refuse_open(const kvt_io_open_args *a, void **ctx) {
  (void)a, (void)ctx;
  return -EPERM;
}

static void test_auto_falls_back_when_refused(void **state) {
  fixture *f = *state;
  static const kvt_io_backend refusing = {KVT_IO_BACKEND_VERSION, "fake_uring", refuse_open,
                                          NULL, NULL, NULL, 0, NULL, NULL};
  const kvt_io_backend *list[2] = {&refusing, kvt_io_backend_threads()};
  kvt_io_open_args a = {.fd = f->fd, .queue_depth = 4};
  kvt__io io;
  assert_int_equal(kvt__io_open_first(list, 2, &a, &io), 0);
  assert_string_equal(kvt__io_name(&io), "threads");
  assert_non_null(strstr(io.fallback, "fake_uring"));
  kvt__io_close(&io);
  /* Only-this-backend: the refusal itself comes back. */
  assert_int_equal(kvt__io_open_first(list, 1, &a, &io), -EPERM);
}

#define CASE(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

static int run_suite(const char *name) {
  const struct CMUnitTest tests[] = {
      CASE(test_round_trip_byte_exact),     CASE(test_registered_buffers),
      CASE(test_queue_depth_saturation),    CASE(test_many_in_flight),
      CASE(test_short_read_at_eof_and_fsync), CASE(test_reap_timeout_empty),
      CASE(test_wrapper_submit_fault),      CASE(test_wrapper_complete_fault),
      CASE(test_auto_falls_back_when_refused), CASE(test_vectored_round_trip),
      CASE(test_pool_the_kernel_cannot_pin),
  };
  return _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
}

/* Whether this kernel gives us a ring; NULL if yes, else why not. */
static const char *uring_refusal(void) {
  static char why[160];
  char path[4200];
  int fd = open_file(path, sizeof path);
  if (fd < 0) return "cannot create a test file";
  kvt_io_open_args a = {.fd = fd, .queue_depth = 4};
  void *ctx = NULL;
  int rc = kvt_io_backend_uring()->open(&a, &ctx);
  if (rc == 0) kvt_io_backend_uring()->close(ctx);
  close(fd);
  unlink(path);
  if (rc == 0) return NULL;
  snprintf(why, sizeof why, "the kernel refuses io_uring (%s)%s", strerror(-rc),
           rc == -EPERM ? ": kernel.io_uring_disabled or a seccomp filter" : "");
  return why;
}

int main(void) {
  g_be = kvt_io_backend_threads();
  int failed = run_suite("io_backend_threads");
  const char *why = uring_refusal();
  if (why) {
    if (failed) return 1;
    kvt_test_skip("io_uring cases: %s (threads cases passed)", why);
  }
  g_be = kvt_io_backend_uring();
  failed += run_suite("io_backend_uring");
  return failed ? 1 : 0;
}
