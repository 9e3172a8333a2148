/* Fault injection at the backend wrappers (compiled in with KVT_FAULT_INJECTION).
 * A test installs one process-wide hook; each wrapper asks it, at its site,
 * whether to fail. The hook returns 0 (no fault) or the code to inject. */
#ifndef KVT_UTIL_FAULT_H
#define KVT_UTIL_FAULT_H

#include <stdint.h>

typedef enum kvt__fault_site {
  KVT_FAULT_DEV_SUBMIT = 1,   /* device copy submission (arg: KVT_XFER_*) */
  KVT_FAULT_DEV_COMPLETE,     /* status handed to done() of a device copy */
  KVT_FAULT_DEV_DELAY_US,     /* microseconds to stall a device copy (return > 0) */
  KVT_FAULT_IO_SUBMIT,        /* storage request submission (arg: KVT_IO_*) */
  KVT_FAULT_IO_COMPLETE,      /* result of a storage request: -EIO, -ENOSPC, or
                                 a positive byte count for a short transfer */
  KVT_FAULT_IO_DELAY_US,      /* microseconds to stall a storage completion */
  KVT_FAULT_HOST_ALLOC,       /* host pool allocation */
  KVT_FAULT_PIN,              /* pinning of host memory (CUDA) */
  KVT_FAULT_ALLOC,            /* an engine allocation (arg: KVT_ALLOC_*) */
  KVT_FAULT_PREALLOC,         /* disk file preallocation (arg: bytes wanted) */
  KVT_FAULT_DISK_SYNC,        /* durable mode's fdatasync of a group of completed
                                 writes, just before it (arg: ops in the group):
                                 -errno fails it without calling fdatasync */
  KVT_FAULT_STORE_OP_DELAY_US, /* microseconds to stall the disk store's op allocation
                                  (arg: 1 if the caller may wait for a free op) */
  KVT_FAULT_IO_BUF_REGISTER,  /* registration of a fixed buffer with the storage backend
                                 (arg: its length): -errno as the kernel's refusal */
  KVT_FAULT_OBJECT_KEEP_DELAY_US, /* microseconds to stall an object find between its disk
                                     read of part 0 and remembering it (return > 0) */
  KVT_FAULT_SITE_COUNT
} kvt__fault_site;

/* Allocations KVT_FAULT_ALLOC can fail, named by its arg. */
enum { KVT_ALLOC_OPEN_FINGERPRINT = 1, KVT_ALLOC_OPEN_DISK_PATH, KVT_ALLOC_NAMESPACE, KVT_ALLOC_OPEN_REMOTE };

/* site, arg (site-specific: direction, op, length) -> 0 or injected value. */
typedef int (*kvt__fault_fn)(void *ctx, int site, int64_t arg);

#ifdef KVT_FAULT_INJECTION
void kvt__fault_set(kvt__fault_fn fn, void *ctx);
int kvt__fault_check(int site, int64_t arg);
#else
static inline void kvt__fault_set(kvt__fault_fn fn, void *ctx) { (void)fn; (void)ctx; }
static inline int kvt__fault_check(int site, int64_t arg) { (void)site; (void)arg; return 0; }
#endif

#endif
