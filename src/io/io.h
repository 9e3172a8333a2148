/* The disk store's only way to a kvt_io_backend: one-line wrappers that also
 * host the fault-injection hooks (util/fault.h), and the automatic choice of
 * backend (io_uring first, the thread pool when the kernel refuses a ring). */
#ifndef KVT_IO_IO_H
#define KVT_IO_IO_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/backend.h"

typedef struct kvt__io {
  const kvt_io_backend *be;
  void *ctx;
  char fallback[128]; /* why io_uring was not used under KVT_DISK_AUTO; "" if it was */
  int held_fault;     /* a submission fault injected behind accepted requests: the next call's first */
} kvt__io;

/* Opens the backend `choice` asks for. KVT_DISK_AUTO tries io_uring and falls
 * back to threads when the ring cannot be set up (ENOSYS, EPERM, EACCES,
 * ENOMEM, io_uring_disabled, seccomp); the reason is kept in io->fallback and
 * reported through the log handler (util/log.h). Returns 0 or -errno. */
int kvt__io_open(kvt_disk_backend choice, const kvt_io_open_args *args, kvt__io *io);
/* The same over an explicit list tried in order (tests pass a refusing fake). */
int kvt__io_open_first(const kvt_io_backend *const *list, uint32_t n, const kvt_io_open_args *args,
                       kvt__io *io);
void kvt__io_close(kvt__io *io);

/* As kvt_io_backend.submit. KVT_FAULT_IO_SUBMIT (arg: the request's op) may
 * refuse a request: those before it are submitted and counted; when it is
 * the first, its code is returned, so a caller that retries the rest fails
 * only the faulted request. */
int kvt__io_submit(kvt__io *io, const kvt_io_req *reqs, uint32_t n);
/* As kvt_io_backend.reap. Per completion, KVT_FAULT_IO_COMPLETE (arg: the
 * real result) may replace the result with -errno or a shorter byte count,
 * and KVT_FAULT_IO_DELAY_US (arg: the result) may stall it. */
int kvt__io_reap(kvt__io *io, kvt_io_cqe *cqes, uint32_t max, uint32_t min_wait, int64_t timeout_ns);

/* The backend takes READV_FIXED / WRITEV_FIXED and registers buffers. */
static inline int kvt__io_fixed_vec(const kvt__io *io) {
  return io->be && io->be->version >= 3 && (io->be->caps & KVT_IO_CAP_FIXED_VEC) && io->be->buf_register &&
         io->be->buf_unregister;
}
/* As kvt_io_backend.buf_register; KVT_FAULT_IO_BUF_REGISTER (arg: len) may
 * refuse it as the kernel would. KVT_EUNSUPPORTED without the capability. */
int kvt__io_buf_register(kvt__io *io, void *base, size_t len, uint32_t *index);
void kvt__io_buf_unregister(kvt__io *io, uint32_t index);

static inline const char *kvt__io_name(const kvt__io *io) { return io->be ? io->be->name : "none"; }

#endif
