/* The host pool of the CUDA backend: one contiguous mmap region (host slots
 * are addressed by offset, so it must be one range), pinned and mapped with
 * cudaHostRegister chunk by chunk. When pinning is refused the same memory
 * stays in use, pageable, and *pinned = 0 tells the engine (stats). */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dev/cuda/cuda_internal.h"
#include "util/fault.h"
#include "util/log.h"

static size_t page_round(size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (bytes + pg - 1) / pg * pg;
}

static void unregister_chunks(char *base, size_t done) {
  for (size_t off = 0; off < done; off += KVT_CUDA_PIN_CHUNK_BYTES) cudaHostUnregister(base + off);
}

/* Pins [base, base + len) chunk by chunk; all or nothing. */
static int pin_region(char *base, size_t len) {
  if (kvt__fault_check(KVT_FAULT_PIN, (int64_t)len) != 0) return 0;
  for (size_t off = 0; off < len; off += KVT_CUDA_PIN_CHUNK_BYTES) {
    size_t n = len - off < KVT_CUDA_PIN_CHUNK_BYTES ? len - off : KVT_CUDA_PIN_CHUNK_BYTES;
    if (cudaHostRegister(base + off, n, cudaHostRegisterPortable | cudaHostRegisterMapped) !=
        cudaSuccess) {
      cudaGetLastError(); /* not sticky: clear it so later calls do not see it */
      unregister_chunks(base, off);
      return 0;
    }
  }
  return 1;
}

int kvt__cuda_host_alloc(void *ctx, size_t bytes, void **ptr, int *pinned) {
  cuda_ctx *c = ctx;
  if (!ptr || !pinned || bytes == 0) return -EINVAL;
  size_t len = page_round(bytes);
  pthread_mutex_lock(&c->region_lock);
  int full = c->n_regions == KVT__CUDA_MAX_REGIONS;
  pthread_mutex_unlock(&c->region_lock);
  if (full) return -ENOMEM;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -errno;
  if (len >= ((size_t)2 << 20)) madvise(p, len, MADV_HUGEPAGE); /* fewer pages to pin */
  int prev = kvt__cuda_enter(c);
  int ok = pin_region(p, len);
  kvt__cuda_leave(c, prev);
  if (!ok) kvt__log(KVT_LOG_WARN, "host pool: CUDA refused to pin %zu bytes; using pageable memory (slower copies)", len);
  pthread_mutex_lock(&c->region_lock);
  full = c->n_regions == KVT__CUDA_MAX_REGIONS; /* a racing alloc took the last entry */
  if (!full) c->regions[c->n_regions++] = (cuda_region){(uintptr_t)p, len, ok};
  pthread_mutex_unlock(&c->region_lock);
  if (full) {
    if (ok) unregister_chunks(p, len);
    munmap(p, len);
    return -ENOMEM;
  }
  *ptr = p;
  *pinned = ok;
  return 0;
}

void kvt__cuda_host_free(void *ctx, void *ptr, size_t bytes) {
  cuda_ctx *c = ctx;
  if (!ptr) return;
  cuda_region r = {0, 0, 0};
  pthread_mutex_lock(&c->region_lock);
  for (uint32_t i = 0; i < c->n_regions; i++) {
    if (c->regions[i].base != (uintptr_t)ptr) continue;
    r = c->regions[i];
    c->regions[i] = c->regions[--c->n_regions];
    break;
  }
  pthread_mutex_unlock(&c->region_lock);
  if (!r.base) return; /* not ours: refuse to unmap what we did not map */
  if (r.pinned) unregister_chunks(ptr, r.len);
  munmap(ptr, r.len);
}

uint32_t kvt__cuda_host_spans(cuda_ctx *c, kvt__host_span *spans, uint32_t max) {
  uint32_t n = 0;
  pthread_mutex_lock(&c->region_lock);
  for (uint32_t i = 0; i < c->n_regions && n < max; i++)
    if (c->regions[i].pinned)
      spans[n++] = (kvt__host_span){c->regions[i].base, c->regions[i].len, KVT_CUDA_PIN_CHUNK_BYTES};
  pthread_mutex_unlock(&c->region_lock);
  return n;
}

int kvt__cuda_host_is_pinned(const kvt__host_span *spans, uint32_t n, const void *p, size_t len) {
  uintptr_t a = (uintptr_t)p;
  for (uint32_t i = 0; i < n; i++)
    if (a >= spans[i].base && a - spans[i].base + len <= spans[i].len) return 1;
  return 0;
}
