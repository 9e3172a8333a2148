/*
 * kvtier/backend.h - backend vtables, for people who add a backend.
 *
 * A backend is a versioned struct of function pointers (SQLite's VFS is the
 * model): methods are only ever appended, and `version` says how many the
 * struct has. The engine reaches a backend only through the one-line
 * wrappers in its layer (src/dev/dev.c, src/io/io.c), which also host the
 * fault-injection hooks. Nothing here is needed to *use* kvtier.
 */
#ifndef KVTIER_BACKEND_H
#define KVTIER_BACKEND_H

#include "kvtier/kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Device backends: move whole blocks between the engine's KV pool     */
/* (device slots) and host-pool slots.                                 */
/* ------------------------------------------------------------------ */

enum { KVT_XFER_D2H = 0, KVT_XFER_H2D = 1 };

/* One asynchronous transfer of n_blocks blocks. The engine owns the struct
 * (one per job, set up at registration) and fills the request fields before
 * submit; the backend calls done() exactly once, from one of its own
 * threads, with none of its locks held, and must not touch the struct after
 * done() returns. */
typedef struct kvt_dev_xfer {
  int dir;                   /* KVT_XFER_D2H or KVT_XFER_H2D */
  uint32_t n_blocks;
  const uint32_t *dev_slots; /* device slot of block i */
  void *const *host_blocks;  /* host payload of block i: block-major, its
                                segments contiguous in layout order */
  void (*done)(struct kvt_dev_xfer *x, int status);
  void *engine_data;         /* the engine's; the backend ignores it */
  void *backend_data;        /* the backend's, set by xfer_prepare */
} kvt_dev_xfer;

typedef struct kvt_dev_open_args {
  const kvt_layout *layout; /* segments are valid for the backend's lifetime */
  int cuda_device;
  uint32_t copy_threads;
} kvt_dev_open_args;

#define KVT_DEV_BACKEND_VERSION 1

typedef struct kvt_dev_backend {
  int version; /* KVT_DEV_BACKEND_VERSION the struct was written for */
  const char *name;
  /* KVT_ENODEV when the device is missing. */
  int (*open)(const kvt_dev_open_args *args, void **ctx);
  void (*close)(void *ctx);
  /* Host memory for the host pool: pinned where the backend can pin
   * (*pinned = 1), else page-aligned pageable memory (*pinned = 0). */
  int (*host_alloc)(void *ctx, size_t bytes, void **ptr, int *pinned);
  void (*host_free)(void *ctx, void *ptr, size_t bytes);
  /* Per-transfer state (events...), set up once per job slot. */
  int (*xfer_prepare)(void *ctx, kvt_dev_xfer *x);
  void (*xfer_release)(void *ctx, kvt_dev_xfer *x);
  /* Queues the copies; returns 0 (done() will follow) or a negative code
   * (done() will not be called). */
  int (*submit)(void *ctx, kvt_dev_xfer *x);
  /* 0 if layer `layer` of an H2D transfer has landed, 1 if not yet. */
  int (*layer_ready)(void *ctx, kvt_dev_xfer *x, uint32_t layer);
  /* Orders `stream`'s later work after layer `layer` (CUDA: no CPU wait). */
  int (*wait_layer)(void *ctx, kvt_dev_xfer *x, uint32_t layer, void *stream);
  /* D2H transfers submitted after this call start only after the work
   * queued on `stream` so far (NULL: nothing to wait for). */
  int (*fence)(void *ctx, void *stream);
} kvt_dev_backend;

/* The built-in backends. kvt_dev_backend_cuda() is NULL in builds without
 * the CUDA toolkit. */
KVT_API const kvt_dev_backend *kvt_dev_backend_host(void);
KVT_API const kvt_dev_backend *kvt_dev_backend_cuda(void);

/* ------------------------------------------------------------------ */
/* Storage backends: block I/O under the disk store. Offsets and       */
/* lengths are multiples of 4096 and buffers 4096-aligned (O_DIRECT).  */
/* ------------------------------------------------------------------ */

/* READV/WRITEV (backends declaring KVT_IO_CAP_VECTORED) move one record
 * between the file and several buffers, as io_uring's IORING_OP_READV does:
 * buf is a `const struct iovec *` (owned by the caller until the
 * completion), len the number of iovecs (at most 1024), and the completion
 * counts the bytes of all of them. */
enum { KVT_IO_READ = 0, KVT_IO_WRITE = 1, KVT_IO_FSYNC = 2, KVT_IO_READV = 3, KVT_IO_WRITEV = 4,
       KVT_IO_READV_FIXED = 5, KVT_IO_WRITEV_FIXED = 6 };

/* READV_FIXED/WRITEV_FIXED (backends declaring KVT_IO_CAP_FIXED_VEC): as
 * READV/WRITEV, but every iovec lies inside a buffer registered with
 * buf_register, named per iovec: buf is a `const kvt_io_fixed_vec *`
 * (owned by the caller until the completion), len the number of iovecs (at
 * most KVT_IO_MAX_FIXED_VEC). io_uring issues it as one READ_FIXED /
 * WRITE_FIXED per iovec (the kernel then pins nothing per I/O) and reports
 * one completion: the bytes of all of them, or the first error. */
#define KVT_IO_MAX_FIXED_VEC 8u
struct iovec;
typedef struct kvt_io_fixed_vec {
  const struct iovec *iov;
  const uint32_t *buf_index; /* per iovec: the index buf_register gave its buffer */
} kvt_io_fixed_vec;

typedef struct kvt_io_req {
  int op;            /* KVT_IO_* */
  int buf_index;     /* index of the registered buffer holding buf, or -1 */
  uint64_t offset;
  void *buf;
  uint32_t len;
  void *user;        /* handed back in the completion */
} kvt_io_req;

typedef struct kvt_io_cqe {
  void *user;
  int res;           /* bytes transferred, or -errno */
} kvt_io_cqe;

typedef struct kvt_io_open_args {
  int fd;                   /* opened by the disk store (O_DIRECT where possible) */
  uint32_t queue_depth;
  const void *const *bufs;  /* memory to register as fixed buffers (host pool) */
  const size_t *buf_lens;
  uint32_t n_bufs;
} kvt_io_open_args;

/* Version 2 appended `caps`; version 3 buf_register and buf_unregister. */
#define KVT_IO_BACKEND_VERSION 3

#define KVT_IO_CAP_VECTORED 0x1u  /* takes KVT_IO_READV / KVT_IO_WRITEV */
#define KVT_IO_CAP_FIXED_VEC 0x2u /* takes KVT_IO_READV_FIXED / KVT_IO_WRITEV_FIXED (version 3) */

typedef struct kvt_io_backend {
  int version;
  const char *name;
  /* -ENOSYS/-EPERM when the kernel refuses the mechanism. */
  int (*open)(const kvt_io_open_args *args, void **ctx);
  void (*close)(void *ctx);
  /* Queues n requests; returns how many were accepted (>= 0) or -errno.
   * Safe to call from several threads. */
  int (*submit)(void *ctx, const kvt_io_req *reqs, uint32_t n);
  /* Reaps up to max completions, waiting for at least min_wait of them
   * (timeout_ns < 0: forever). Returns the count or -errno. One thread reaps. */
  int (*reap)(void *ctx, kvt_io_cqe *cqes, uint32_t max, uint32_t min_wait, int64_t timeout_ns);
  /* Version >= 2: KVT_IO_CAP_* bits. The disk store sends a backend only
   * the ops its caps name (READ, WRITE and FSYNC always). */
  uint32_t caps;
  /* Version >= 3 with KVT_IO_CAP_FIXED_VEC: registers [base, base+len)
   * (4096-aligned) as a fixed buffer after open, into room the backend
   * reserved at open; *index names it in READV_FIXED/WRITEV_FIXED requests.
   * Returns 0, -ENOSPC (no room left), or the kernel's refusal (-ENOMEM
   * past RLIMIT_MEMLOCK, -EFAULT...). May block (the kernel pins the pages).
   * Safe to call while requests are in flight. */
  int (*buf_register)(void *ctx, void *base, size_t len, uint32_t *index);
  /* Forgets a buffer buf_register gave; the caller has no request naming
   * it in flight any more. */
  void (*buf_unregister)(void *ctx, uint32_t index);
} kvt_io_backend;

KVT_API const kvt_io_backend *kvt_io_backend_uring(void);
KVT_API const kvt_io_backend *kvt_io_backend_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_BACKEND_H */
