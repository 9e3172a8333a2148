/* The CUDA device backend (src/dev/cuda): scattered blocks survive a round
 * trip byte for byte on every copy path, a load's layer events order the
 * engine's stream, a store waits for the engine's compute (the missing-sync
 * bug of other offloaders), injected faults surface and leave the backend
 * usable, and without a device open says KVT_ENODEV.
 *
 * Without the CUDA toolkit, or without a device, it exits 77 (skipped); with
 * no device it still checks that open reports KVT_ENODEV first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#ifndef KVT_HAVE_CUDA
int main(void) { kvt_test_skip("no CUDA device: kvtier was built without the CUDA toolkit"); }
#else

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dev/cuda/cuda_internal.h"
#include "util/fault.h"

#ifdef KVT_TEST_CUDA_KERNELS
int kvt_test_cuda_spin_then_fill(volatile int *flag, unsigned char *const *pieces, uint32_t n_pieces,
                                 uint32_t piece_bytes, void *stream);
int kvt_test_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
#endif

#define CK(call) assert_int_equal((int)(call), 0)

#define LAYERS 4
#define SPL 2
#define SLOTS 64
#define NBLK 24
#define SEG_BYTES (32u * 1024u)
#define BLOCK_BYTES ((size_t)LAYERS * SPL * SEG_BYTES)
#define RECORD ((size_t)4096 + BLOCK_BYTES) /* prefix page + payload, like a host slot */

enum { LAYOUT_VLLM_FLASH, LAYOUT_FLASHINFER };

typedef struct job {
  kvt_dev_xfer x;
  pthread_mutex_t m;
  pthread_cond_t cv;
  int n_done, status;
} job;

typedef struct fix {
  const kvt_dev_backend *be;
  void *ctx;
  kvt_layout lay;
  kvt_segment segs[LAYERS * SPL];
  unsigned char *pool[LAYERS]; /* cudaMalloc'd, one per layer */
  unsigned char *host;         /* host pool from the backend */
  size_t host_bytes;
  int pinned;
  uint32_t slots[NBLK];
  void *payload[2][NBLK]; /* two sets of host slots: out and back */
} fix;

static void on_done(kvt_dev_xfer *x, int status) {
  job *j = x->engine_data;
  pthread_mutex_lock(&j->m);
  j->status = status;
  j->n_done++;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->m);
}

static void job_init(fix *f, job *j, int dir, uint32_t n, const uint32_t *slots, void *const *hosts) {
  memset(j, 0, sizeof *j);
  pthread_mutex_init(&j->m, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->x = (kvt_dev_xfer){.dir = dir, .n_blocks = n, .dev_slots = slots, .host_blocks = hosts,
                        .done = on_done, .engine_data = j};
  CK(f->be->xfer_prepare(f->ctx, &j->x));
}

static int job_wait(job *j, int n) {
  pthread_mutex_lock(&j->m);
  while (j->n_done < n) pthread_cond_wait(&j->cv, &j->m);
  int st = j->status;
  pthread_mutex_unlock(&j->m);
  return st;
}

static void job_fini(fix *f, job *j) {
  f->be->xfer_release(f->ctx, &j->x);
  pthread_mutex_destroy(&j->m);
  pthread_cond_destroy(&j->cv);
}

static void fix_open(fix *f, int kind) {
  memset(f, 0, sizeof *f);
  f->be = kvt_dev_backend_cuda();
  assert_non_null(f->be);
  size_t pool_bytes = (size_t)SPL * SLOTS * SEG_BYTES;
  for (int l = 0; l < LAYERS; l++) {
    CK(cudaMalloc((void **)&f->pool[l], pool_bytes));
    CK(cudaMemset(f->pool[l], 0xAB, pool_bytes));
    for (int s = 0; s < SPL; s++) {
      kvt_segment *sg = &f->segs[l * SPL + s];
      if (kind == LAYOUT_VLLM_FLASH) /* (2, slots, ...): K and V are the halves */
        *sg = (kvt_segment){f->pool[l] + (size_t)s * SLOTS * SEG_BYTES, SEG_BYTES, SEG_BYTES};
      else /* (slots, 2, ...): K and V of a slot are adjacent */
        *sg = (kvt_segment){f->pool[l] + (size_t)s * SEG_BYTES, 2 * SEG_BYTES, SEG_BYTES};
    }
  }
  kvt_layout_init(&f->lay);
  f->lay.num_layers = LAYERS;
  f->lay.segments_per_layer = SPL;
  f->lay.num_slots = SLOTS;
  f->lay.segments = f->segs;
  kvt_dev_open_args args = {.layout = &f->lay, .cuda_device = 0, .copy_threads = 1};
  CK(f->be->open(&args, &f->ctx));
  f->host_bytes = 2 * NBLK * RECORD;
  CK(f->be->host_alloc(f->ctx, f->host_bytes, (void **)&f->host, &f->pinned));
  if (!f->pinned) { /* say why, once: every kernel-path check below depends on it */
    static int said;
    void *probe = NULL;
    if (!said++ && posix_memalign(&probe, 4096, 1 << 20) == 0) {
      cudaError_t e = cudaHostRegister(probe, 1 << 20, cudaHostRegisterPortable | cudaHostRegisterMapped);
      fprintf(stderr, "test_cuda_backend: host pool NOT pinned; cudaHostRegister says: %s\n",
              cudaGetErrorString(e));
      if (e == cudaSuccess) cudaHostUnregister(probe);
      cudaGetLastError();
    }
    free(probe);
  }
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < NBLK; i++) f->payload[k][i] = f->host + ((size_t)k * NBLK + i) * RECORD + 4096;
  /* Distinct scattered slots: a fixed shuffle of 0..SLOTS-1. */
  uint32_t perm[SLOTS];
  for (uint32_t i = 0; i < SLOTS; i++) perm[i] = i;
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (uint32_t i = SLOTS - 1; i > 0; i--) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t j = (uint32_t)((s >> 33) % (i + 1));
    uint32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  memcpy(f->slots, perm, sizeof f->slots);
}

static void fix_close(fix *f) {
  f->be->host_free(f->ctx, f->host, f->host_bytes);
  f->be->close(f->ctx);
  for (int l = 0; l < LAYERS; l++) cudaFree(f->pool[l]);
}

static size_t seg_host_off(int j) { return (size_t)j * SEG_BYTES; }

/* Reads every piece of the pools back with plain cudaMemcpy: loaded slots
 * must hold their payload's bytes, every other slot the 0xAB fill. */
static void check_device(fix *f, void *const *payloads) {
  unsigned char *piece = malloc(SEG_BYTES), *ab = malloc(SEG_BYTES);
  assert_non_null(piece);
  assert_non_null(ab);
  memset(ab, 0xAB, SEG_BYTES);
  for (uint32_t slot = 0; slot < SLOTS; slot++) {
    int blk = -1;
    for (int i = 0; i < NBLK; i++)
      if (f->slots[i] == slot) blk = i;
    for (int j = 0; j < LAYERS * SPL; j++) {
      CK(cudaMemcpy(piece, (unsigned char *)f->segs[j].base + (size_t)slot * f->segs[j].stride,
                    SEG_BYTES, cudaMemcpyDeviceToHost));
      const unsigned char *want = blk < 0 ? ab : (unsigned char *)payloads[blk] + seg_host_off(j);
      assert_memory_equal(piece, want, SEG_BYTES);
    }
  }
  free(piece);
  free(ab);
}

static void round_trip(int kind, int path) {
  fix f;
  fix_open(&f, kind);
  int rc = kvt__cuda_set_path(f.ctx, path);
  if (rc == KVT_EUNSUPPORTED) {
    fix_close(&f);
    skip(); /* this build or driver has no such path */
  }
  CK(rc);
  for (int i = 0; i < NBLK; i++) kvt_test_fill(f.payload[0][i], BLOCK_BYTES, 100 + i);
  memset(f.payload[1][0], 0, (size_t)NBLK * RECORD - 4096);
  job load, store;
  job_init(&f, &load, KVT_XFER_H2D, NBLK, f.slots, f.payload[0]);
  job_init(&f, &store, KVT_XFER_D2H, NBLK, f.slots, f.payload[1]);
  CK(f.be->submit(f.ctx, &load.x));
  CK(job_wait(&load, 1));
  assert_int_equal(kvt__cuda_xfer_path(&load.x), path);
  check_device(&f, f.payload[0]);
  CK(f.be->submit(f.ctx, &store.x));
  CK(job_wait(&store, 1));
  assert_int_equal(kvt__cuda_xfer_path(&store.x), path);
  for (int i = 0; i < NBLK; i++) assert_true(kvt_test_check(f.payload[1][i], BLOCK_BYTES, 100 + i));
  job_fini(&f, &load);
  job_fini(&f, &store);
  fix_close(&f);
}

static void round_trip_vllm_memcpy(void **state) { round_trip(LAYOUT_VLLM_FLASH, KVT__CUDA_PATH_MEMCPY); }
static void round_trip_vllm_batch(void **state) { round_trip(LAYOUT_VLLM_FLASH, KVT__CUDA_PATH_BATCH); }
static void round_trip_vllm_kernel(void **state) { round_trip(LAYOUT_VLLM_FLASH, KVT__CUDA_PATH_KERNEL); }
static void round_trip_flashinfer_batch(void **state) { round_trip(LAYOUT_FLASHINFER, KVT__CUDA_PATH_BATCH); }
static void round_trip_flashinfer_kernel(void **state) { round_trip(LAYOUT_FLASHINFER, KVT__CUDA_PATH_KERNEL); }

/* After done() every layer event has fired; and a stream told to wait for
 * the last layer sees it loaded (a copy kernel reads it right after). */
static void layer_events_order_the_engine_stream(void **state) {
#ifndef KVT_TEST_CUDA_KERNELS
  skip();
#else
  fix f;
  fix_open(&f, LAYOUT_VLLM_FLASH);
  for (int i = 0; i < NBLK; i++) kvt_test_fill(f.payload[0][i], BLOCK_BYTES, 200 + i);
  unsigned char *scratch;
  size_t layer_bytes = (size_t)NBLK * SPL * SEG_BYTES;
  CK(cudaMalloc((void **)&scratch, layer_bytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  job load;
  job_init(&f, &load, KVT_XFER_H2D, NBLK, f.slots, f.payload[0]);
  const uint32_t last = LAYERS - 1;
  CK(f.be->submit(f.ctx, &load.x));
  CK(f.be->wait_layer(f.ctx, &load.x, last, s));
  for (int i = 0; i < NBLK; i++)
    for (int k = 0; k < SPL; k++) {
      const kvt_segment *sg = &f.segs[last * SPL + k];
      CK(kvt_test_cuda_copy(scratch + ((size_t)i * SPL + k) * SEG_BYTES,
                            (unsigned char *)sg->base + (size_t)f.slots[i] * sg->stride, SEG_BYTES, s));
    }
  unsigned char *got = malloc(layer_bytes);
  assert_non_null(got);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(got, scratch, layer_bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < NBLK; i++)
    assert_memory_equal(got + (size_t)i * SPL * SEG_BYTES,
                        (unsigned char *)f.payload[0][i] + seg_host_off(last * SPL), SPL * SEG_BYTES);
  CK(job_wait(&load, 1));
  for (uint32_t l = 0; l < LAYERS; l++) assert_int_equal(f.be->layer_ready(f.ctx, &load.x, l), 0);
  assert_int_equal(f.be->layer_ready(f.ctx, &load.x, LAYERS), -EINVAL);
  assert_int_equal(f.be->wait_layer(f.ctx, &load.x, LAYERS, s), -EINVAL);
  free(got);
  job_fini(&f, &load);
  cudaStreamDestroy(s);
  cudaFree(scratch);
  fix_close(&f);
#endif
}

#ifdef KVT_TEST_CUDA_KERNELS
/* One store after an engine kernel that writes the KV only once the host
 * lets it: the store is certainly queued before the data exists. */
static void store_after_compute(int path) {
  fix f;
  fix_open(&f, LAYOUT_VLLM_FLASH);
  int rc = kvt__cuda_set_path(f.ctx, path);
  if (rc == KVT_EUNSUPPORTED) {
    fix_close(&f);
    skip();
  }
  CK(rc);
  uint32_t n_pieces = NBLK * LAYERS * SPL;
  unsigned char **pieces_h = malloc(n_pieces * sizeof *pieces_h), **pieces_d;
  assert_non_null(pieces_h);
  for (uint32_t i = 0; i < NBLK; i++)
    for (uint32_t j = 0; j < LAYERS * SPL; j++)
      pieces_h[i * LAYERS * SPL + j] = (unsigned char *)f.segs[j].base + (size_t)f.slots[i] * f.segs[j].stride;
  CK(cudaMalloc((void **)&pieces_d, n_pieces * sizeof *pieces_d));
  CK(cudaMemcpy(pieces_d, pieces_h, n_pieces * sizeof *pieces_d, cudaMemcpyHostToDevice));
  volatile int *flag;
  CK(cudaHostAlloc((void **)&flag, sizeof *flag, cudaHostAllocMapped));
  *flag = 0;
  cudaStream_t engine;
  CK(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking));
  memset(f.payload[1][0], 0, (size_t)NBLK * RECORD - 4096);

  job store;
  job_init(&f, &store, KVT_XFER_D2H, NBLK, f.slots, f.payload[1]);
  CK(kvt_test_cuda_spin_then_fill(flag, pieces_d, n_pieces, SEG_BYTES, engine));
  CK(f.be->fence(f.ctx, engine));
  CK(f.be->submit(f.ctx, &store.x));
  /* The store stream waits on the spinning kernel: nothing can be ready. */
  assert_int_equal(f.be->layer_ready(f.ctx, &store.x, 0), 1);
  *flag = 1;
  CK(job_wait(&store, 1));
  assert_int_equal(f.be->layer_ready(f.ctx, &store.x, 0), 0);
  for (uint32_t i = 0; i < NBLK; i++)
    for (uint32_t j = 0; j < LAYERS * SPL; j++) {
      const unsigned char *h = (unsigned char *)f.payload[1][i] + seg_host_off((int)j);
      uint32_t p = i * LAYERS * SPL + j;
      for (uint32_t b = 0; b < SEG_BYTES; b += 997)
        assert_int_equal(h[b], (unsigned char)(p * 131u + b * 7u + 1u));
    }
  job_fini(&f, &store);
  cudaStreamDestroy(engine);
  cudaFreeHost((void *)flag);
  cudaFree(pieces_d);
  free(pieces_h);
  fix_close(&f);
}
#endif

static void store_waits_for_compute_copy_engines(void **state) {
#ifdef KVT_TEST_CUDA_KERNELS
  store_after_compute(KVT__CUDA_PATH_MEMCPY);
#else
  skip();
#endif
}

static void store_waits_for_compute_kernel_path(void **state) {
#ifdef KVT_TEST_CUDA_KERNELS
  store_after_compute(KVT__CUDA_PATH_KERNEL);
#else
  skip();
#endif
}

#ifdef KVT_FAULT_INJECTION
static int fail_once_code;
static int fault_fail_submit_once(void *ctx, int site, int64_t arg) {
  if (site != KVT_FAULT_DEV_SUBMIT || !fail_once_code) return 0;
  int c = fail_once_code;
  fail_once_code = 0;
  return c;
}
static int fault_fail_complete(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_DEV_COMPLETE ? -EIO : 0;
}
static int fault_refuse_pin(void *ctx, int site, int64_t arg) { return site == KVT_FAULT_PIN ? -EPERM : 0; }
#endif

/* A submit that fails after part of the copies was queued returns the
 * error, never calls done(), and leaves the lane usable for the next one. */
static void injected_submit_failure_leaves_backend_usable(void **state) {
#ifndef KVT_FAULT_INJECTION
  skip();
#else
  fix f;
  fix_open(&f, LAYOUT_VLLM_FLASH);
  for (int path = KVT__CUDA_PATH_MEMCPY; path <= KVT__CUDA_PATH_KERNEL; path++) {
    if (kvt__cuda_set_path(f.ctx, path) != 0) continue;
    for (int i = 0; i < NBLK; i++) kvt_test_fill(f.payload[0][i], BLOCK_BYTES, 300 + path * 64 + i);
    job load;
    job_init(&f, &load, KVT_XFER_H2D, NBLK, f.slots, f.payload[0]);
    fail_once_code = -EIO;
    kvt__fault_set(fault_fail_submit_once, NULL);
    assert_int_equal(f.be->submit(f.ctx, &load.x), -EIO);
    kvt__fault_set(NULL, NULL);
    CK(f.be->submit(f.ctx, &load.x));
    CK(job_wait(&load, 1));
    /* A lane completes in order: once a later load is done, a done() of the
     * failed submit would have come already. */
    job later;
    job_init(&f, &later, KVT_XFER_H2D, 1, f.slots, f.payload[0]);
    CK(f.be->submit(f.ctx, &later.x));
    CK(job_wait(&later, 1));
    job_fini(&f, &later);
    assert_int_equal(load.n_done, 1); /* the failed submit never completed */
    check_device(&f, f.payload[0]);
    job_fini(&f, &load);
  }
  /* Invalid slot: refused up front, no done(). */
  uint32_t bad[1] = {SLOTS};
  job j;
  job_init(&f, &j, KVT_XFER_D2H, 1, bad, f.payload[1]);
  assert_int_equal(f.be->submit(f.ctx, &j.x), -EINVAL);
  assert_int_equal(j.n_done, 0);
  job_fini(&f, &j);
  fix_close(&f);
#endif
}

static void injected_completion_error_reaches_done(void **state) {
#ifndef KVT_FAULT_INJECTION
  skip();
#else
  fix f;
  fix_open(&f, LAYOUT_VLLM_FLASH);
  job store;
  job_init(&f, &store, KVT_XFER_D2H, NBLK, f.slots, f.payload[1]);
  kvt__fault_set(fault_fail_complete, NULL);
  CK(f.be->submit(f.ctx, &store.x));
  assert_int_equal(job_wait(&store, 1), -EIO);
  kvt__fault_set(NULL, NULL);
  CK(f.be->submit(f.ctx, &store.x));
  CK(job_wait(&store, 2));
  job_fini(&f, &store);
  fix_close(&f);
#endif
}

/* Refused pinning still gives usable (pageable) memory, flagged unpinned;
 * the kernel path, which needs mapped memory, is not taken for it. */
static void refused_pinning_falls_back_to_pageable(void **state) {
#ifndef KVT_FAULT_INJECTION
  skip();
#else
  fix f;
  fix_open(&f, LAYOUT_VLLM_FLASH);
  assert_int_equal(f.pinned, 1);
  kvt__fault_set(fault_refuse_pin, NULL);
  unsigned char *mem;
  int pinned = -1;
  size_t bytes = (size_t)NBLK * RECORD;
  CK(f.be->host_alloc(f.ctx, bytes, (void **)&mem, &pinned));
  kvt__fault_set(NULL, NULL);
  assert_int_equal(pinned, 0);
  assert_int_equal((uintptr_t)mem % 4096, 0);
  void *payload[NBLK];
  for (int i = 0; i < NBLK; i++) {
    payload[i] = mem + (size_t)i * RECORD + 4096;
    kvt_test_fill(payload[i], BLOCK_BYTES, 400 + i);
  }
  kvt__cuda_set_path(f.ctx, KVT__CUDA_PATH_KERNEL); /* may be unsupported: auto then */
  job load;
  job_init(&f, &load, KVT_XFER_H2D, NBLK, f.slots, payload);
  CK(f.be->submit(f.ctx, &load.x));
  CK(job_wait(&load, 1));
  assert_int_not_equal(kvt__cuda_xfer_path(&load.x), KVT__CUDA_PATH_KERNEL);
  check_device(&f, payload);
  job_fini(&f, &load);
  f.be->host_free(f.ctx, mem, bytes);
  fix_close(&f);
#endif
}

/* KV in RAM (a CPU engine's layout) is not the CUDA backend's: open says
 * KVT_ENODEV, so KVT_DEVICE_AUTO falls back to the host backend, instead of
 * a copy kernel faulting on host pointers. */
static void host_memory_layout_is_enodev(void **state) {
  static unsigned char ram[2 * SEG_BYTES * 4];
  kvt_segment seg[2] = {{ram, 2 * SEG_BYTES, SEG_BYTES}, {ram + SEG_BYTES, 2 * SEG_BYTES, SEG_BYTES}};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.segments_per_layer = 2;
  lay.num_slots = 4;
  lay.segments = seg;
  kvt_dev_open_args args = {.layout = &lay, .cuda_device = 0, .copy_threads = 1};
  void *ctx = NULL;
  assert_int_equal(kvt_dev_backend_cuda()->open(&args, &ctx), KVT_ENODEV);
  assert_null(ctx);
  assert_int_equal(cudaGetLastError(), cudaSuccess); /* no error left behind */
}

/* Runs this test binary again with every device hidden: open must say
 * KVT_ENODEV (the child checks, its exit status reports). */
static int no_device_child(void) {
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.segments_per_layer = 1;
  lay.num_slots = 1;
  kvt_dev_open_args args = {.layout = &lay, .cuda_device = 0, .copy_threads = 1};
  void *ctx = NULL;
  int rc = kvt_dev_backend_cuda()->open(&args, &ctx);
  if (rc != KVT_ENODEV) fprintf(stderr, "open without a device returned %d\n", rc);
  return rc == KVT_ENODEV ? 0 : 1;
}

static void open_without_device_is_enodev(void **state) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char *argv[] = {"test_cuda_backend", "--no-device-child", NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--no-device-child")) return no_device_child();
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    /* What can be checked without a device is checked before skipping. */
    int rc = no_device_child();
    if (rc != 0) return 1;
    kvt_test_skip("no CUDA device: %s (the backend's open says KVT_ENODEV, as it must)",
                  e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_vllm_memcpy),
      cmocka_unit_test(round_trip_vllm_batch),
      cmocka_unit_test(round_trip_vllm_kernel),
      cmocka_unit_test(round_trip_flashinfer_batch),
      cmocka_unit_test(round_trip_flashinfer_kernel),
      cmocka_unit_test(layer_events_order_the_engine_stream),
      cmocka_unit_test(store_waits_for_compute_copy_engines),
      cmocka_unit_test(store_waits_for_compute_kernel_path),
      cmocka_unit_test(injected_submit_failure_leaves_backend_usable),
      cmocka_unit_test(injected_completion_error_reaches_done),
      cmocka_unit_test(refused_pinning_falls_back_to_pageable),
      cmocka_unit_test(host_memory_layout_is_enodev),
      cmocka_unit_test(open_without_device_is_enodev),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
