#include "util/fault.h"

#ifdef KVT_FAULT_INJECTION
#include <stdatomic.h>
#include <stddef.h>

/* The pair is swapped by tests while no transfer runs; readers see either. */
static _Atomic(kvt__fault_fn) fault_fn;
static void *_Atomic fault_ctx;

void kvt__fault_set(kvt__fault_fn fn, void *ctx) {
  atomic_store(&fault_ctx, ctx);
  atomic_store(&fault_fn, fn);
}

int kvt__fault_check(int site, int64_t arg) {
  kvt__fault_fn fn = atomic_load_explicit(&fault_fn, memory_order_acquire);
  return fn ? fn(atomic_load(&fault_ctx), site, arg) : 0;
}
#endif
