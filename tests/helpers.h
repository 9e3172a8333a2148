/* Shared test helpers (liburing's test/helpers.h is the model). */
#ifndef KVT_TEST_HELPERS_H
#define KVT_TEST_HELPERS_H
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#define KVT_TEST_SKIP 77

/* Prints why and exits 77 (CTest counts it as skipped). */
void kvt_test_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* $KVT_TRACES_DIR/name if the file exists, else NULL (the caller skips). */
const char *kvt_test_trace(const char *name);
/* A fresh temporary directory for this test (removed by the caller if it likes). */
const char *kvt_test_tmpdir(void);
/* Waits (up to a minute) until no one holds path's lock. The kernel tears
 * a killed process's io_uring down in the background and the ring keeps
 * the file, and its lock, until then; kvtier's open waits about a second
 * for that before KVT_ELOCKED, which a loaded machine can exceed. */
void kvt_test_wait_unlocked(const char *path);
/* Deterministic byte pattern for block b of conversation c. */
void kvt_test_fill(void *buf, size_t len, uint64_t seed);
int kvt_test_check(const void *buf, size_t len, uint64_t seed);
/* Registers a storage-mode layout of one layer with one segment of
 * block_bytes: kvt_register_layout's result. */
struct kvt_cache;
int kvt_test_register_storage(struct kvt_cache *c, size_t block_bytes);
#endif
