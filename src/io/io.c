#include "io/io.h"
#include "util/log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "util/fault.h"

/* Errors that mean "this mechanism is unavailable here", not "the file is bad". */
static int is_refusal(int rc) {
  return rc == -ENOSYS || rc == -EPERM || rc == -EACCES || rc == -ENOMEM || rc == -EOPNOTSUPP ||
         rc == -EINVAL;
}

static void note_fallback(kvt__io *io, const kvt_io_backend *be, int rc) {
  snprintf(io->fallback, sizeof io->fallback, "%s refused (%s)%s", be->name, strerror(-rc),
           rc == -EPERM ? ": io_uring_disabled sysctl or seccomp?" : "");
  kvt__log(KVT_LOG_WARN, "disk I/O falls back: %s", io->fallback);
}

int kvt__io_open_first(const kvt_io_backend *const *list, uint32_t n, const kvt_io_open_args *args,
                       kvt__io *io) {
  int rc = -ENOSYS;
  memset(io, 0, sizeof *io);
  for (uint32_t i = 0; i < n; i++) {
    const kvt_io_backend *be = list[i];
    if (!be || be->version < 1) continue;
    rc = be->open(args, &io->ctx);
    if (rc == 0) {
      io->be = be;
      return 0;
    }
    if (i + 1 == n || !is_refusal(rc)) return rc;
    note_fallback(io, be, rc);
  }
  return rc;
}

int kvt__io_open(kvt_disk_backend choice, const kvt_io_open_args *args, kvt__io *io) {
  const kvt_io_backend *list[2] = {kvt_io_backend_uring(), kvt_io_backend_threads()};
  switch (choice) {
  case KVT_DISK_AUTO: return kvt__io_open_first(list, 2, args, io);
  case KVT_DISK_URING: return kvt__io_open_first(list, 1, args, io);
  case KVT_DISK_THREADS: return kvt__io_open_first(list + 1, 1, args, io);
  default: return -EINVAL;
  }
}

void kvt__io_close(kvt__io *io) {
  if (io->be) io->be->close(io->ctx);
  io->be = NULL;
  io->ctx = NULL;
}

int kvt__io_submit(kvt__io *io, const kvt_io_req *reqs, uint32_t n) {
  uint32_t ok = 0;
  int f = 0;
  if (n && io->held_fault) { /* the request it was injected for comes first now */
    f = io->held_fault;
    io->held_fault = 0;
    return f < 0 ? f : -EIO;
  }
  while (ok < n && (f = kvt__fault_check(KVT_FAULT_IO_SUBMIT, reqs[ok].op)) == 0) ok++;
  if (ok == 0 && f != 0) return f < 0 ? f : -EIO;
  int rc = ok ? io->be->submit(io->ctx, reqs, ok) : 0;
  /* Requests after the accepted ones come back in the caller's next call:
   * the fault stays theirs. (Fault injection is single-threaded per test.) */
  if (f != 0 && rc == (int)ok) io->held_fault = f;
  return rc;
}

static void fault_delay(int res) {
  int us = kvt__fault_check(KVT_FAULT_IO_DELAY_US, res);
  if (us <= 0) return;
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

int kvt__io_reap(kvt__io *io, kvt_io_cqe *cqes, uint32_t max, uint32_t min_wait, int64_t timeout_ns) {
  int n = io->be->reap(io->ctx, cqes, max, min_wait, timeout_ns);
  for (int i = 0; i < n; i++) {
    int f = kvt__fault_check(KVT_FAULT_IO_COMPLETE, cqes[i].res);
    if (f < 0 || (f > 0 && f < cqes[i].res)) cqes[i].res = f;
    fault_delay(cqes[i].res);
  }
  return n;
}

/* 1 when every mapping over [base, base + len) is private (anonymous
 * memory, or a private copy of a file): /proc/self/maps' permissions. */
static int all_private(const void *base, size_t len) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return 0;
  uintptr_t lo = (uintptr_t)base, hi = lo + len, covered = lo;
  char line[512];
  int ok = 1;
  while (ok && covered < hi && fgets(line, sizeof line, f)) {
    unsigned long long a, b;
    char perms[8];
    if (sscanf(line, "%llx-%llx %7s", &a, &b, perms) != 3) continue;
    if (b <= covered || a >= hi) continue;
    if (a > covered || perms[3] != 'p') ok = 0; /* a hole, or shared */
    covered = (uintptr_t)b;
  }
  fclose(f);
  return ok && covered >= hi;
}

/* The backend pins a fixed buffer's pages holding its submission lock
 * (and the kernel its ring's), so no I/O of the cache is submitted
 * meanwhile; for pages never touched, faulting them in is most of that
 * time (2 GiB: 0.6-4.6 s, every disk I/O of the cache stalled behind it).
 * They are faulted in here first, with no lock held, as the pinning would
 * (writable, contents unchanged); the pinning then finds them present.
 * Private memory only: populating a shared mapping writable would dirty
 * its pages, and allocate a file's holes, even where the kernel then
 * refuses to pin it (a file on disk). Best effort: a kernel without
 * MADV_POPULATE_WRITE (before 5.14), shared memory or a region it cannot
 * populate is left to the registration, as before. */
static void prefault(void *base, size_t len) {
#ifdef MADV_POPULATE_WRITE
  if (all_private(base, len)) (void)madvise(base, len, MADV_POPULATE_WRITE);
#else
  (void)base, (void)len;
#endif
}

int kvt__io_buf_register(kvt__io *io, void *base, size_t len, uint32_t *index) {
  if (!kvt__io_fixed_vec(io)) return KVT_EUNSUPPORTED;
  prefault(base, len);
  int f = kvt__fault_check(KVT_FAULT_IO_BUF_REGISTER, (int64_t)len);
  if (f) return f < 0 ? f : -ENOMEM;
  return io->be->buf_register(io->ctx, base, len, index);
}

void kvt__io_buf_unregister(kvt__io *io, uint32_t index) {
  if (kvt__io_fixed_vec(io)) io->be->buf_unregister(io->ctx, index);
}
