/* kvtier-bench gpu: the CUDA backend's copies next to cudaMemcpy's own
 * large-transfer bandwidth, measured in the same run.
 *
 *   micro section "gpu"   four rows: store/load at 2 MiB and 32 KiB pieces
 *   `kvtier-bench gpu`    the full set (bench/gpu-check.sh runs it): the
 *                         ceilings, scattered stores and loads at 32 KiB,
 *                         256 KiB and 2 MiB pieces for 1..4096 blocks on each
 *                         copy path, then stores and loads at once; full
 *                         numbers to DIR/gpu.csv and DIR/gpu.json.
 *
 * Transfers go through the backend's vtable exactly as the engine drives it
 * (submit, then done() from the completion thread); a figure is bytes moved
 * over the wall time from the first submit to the last done(). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static void gpu_usage(FILE *f) {
  fprintf(f, "usage: kvtier-bench gpu [--out DIR] [--quick]\n\n"
             "  cudaMemcpy ceilings, then scattered stores/loads at 32 KiB, 256 KiB, 2 MiB pieces\n"
             "  (1..4096 blocks, memcpy/batch/kernel paths), then both directions at once.\n"
             "  Full numbers: DIR/gpu.csv, DIR/gpu.json (DIR: gpu-check-out); a summary table on\n"
             "  stdout. Needs a CUDA build and a GPU; bench/gpu-check.sh builds and runs it.\n");
}

#ifndef KVT_HAVE_CUDA

static int gpu_micro(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  kvt_bench_row(rows, "device copies", "GB/s", 0, 0, 0, "built without the CUDA toolkit");
  return 0;
}

static int gpu_main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      gpu_usage(stdout);
      printf("\nThis kvtier-bench was built without the CUDA toolkit.\n");
      return 0;
    }
  fprintf(stderr, "kvtier-bench gpu: this build has no CUDA backend (the CUDA toolkit was not found,\n"
                  "or KVT_CUDA=0); see kvtier-bench gpu --help\n");
  return 1;
}

#else

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "dev/cuda/cuda_internal.h"

#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)
#define KIB ((size_t)1 << 10)
#define LAYERS 4 /* 2 segments each: 8 pieces per block */
#define SPL 2

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- one transfer slot the bench drives like the engine -------------- */

typedef struct bjob {
  kvt_dev_xfer x;
  pthread_mutex_t m;
  pthread_cond_t cv;
  int n_done, status;
} bjob;

static void bjob_done(kvt_dev_xfer *x, int status) {
  bjob *j = x->engine_data;
  pthread_mutex_lock(&j->m);
  if (status) j->status = status;
  j->n_done++;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->m);
}

static int bjob_wait(bjob *j, int n) {
  pthread_mutex_lock(&j->m);
  while (j->n_done < n) pthread_cond_wait(&j->cv, &j->m);
  int st = j->status;
  pthread_mutex_unlock(&j->m);
  return st;
}

/* ---- a scattered-block rig: device pools, host pool, slots ----------- */

typedef struct rig {
  const kvt_dev_backend *be;
  void *ctx;
  kvt_layout lay;
  kvt_segment segs[LAYERS * SPL];
  void *pool[LAYERS];
  size_t piece, block_bytes, pool_bytes, host_bytes;
  uint32_t max_blocks;
  unsigned char *host;
  int pinned;
  uint32_t *slots;  /* 2 * max_blocks distinct scattered slots */
  void **payload;   /* 2 * max_blocks host payloads */
  int last_path[2]; /* path the backend actually took, per direction (last rig_run) */
} rig;

static void rig_close(rig *r) {
  if (r->ctx) {
    if (r->host) r->be->host_free(r->ctx, r->host, r->host_bytes);
    r->be->close(r->ctx);
  }
  for (int l = 0; l < LAYERS; l++)
    if (r->pool[l]) cudaFree(r->pool[l]);
  free(r->slots);
  free(r->payload);
  memset(r, 0, sizeof *r);
}

static void rig_slots(rig *r, uint32_t n_slots) {
  uint32_t *perm = malloc(n_slots * sizeof *perm);
  for (uint32_t i = 0; perm && i < n_slots; i++) perm[i] = i;
  uint64_t s = 0x2545f4914f6cdd1dull;
  for (uint32_t i = n_slots - 1; perm && i > 0; i--) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    uint32_t j = (uint32_t)(s % (i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  r->slots = perm;
}

/* vLLM flash layout of `piece`-byte segments; 2 * max_blocks slots so both
 * directions of the bidirectional run use distinct, scattered slots. */
static int rig_open(rig *r, size_t piece, uint32_t max_blocks) {
  memset(r, 0, sizeof *r);
  r->be = kvt_dev_backend_cuda();
  r->piece = piece;
  r->max_blocks = max_blocks;
  r->block_bytes = (size_t)LAYERS * SPL * piece;
  uint32_t n_slots = 2 * max_blocks;
  r->pool_bytes = (size_t)SPL * n_slots * piece;
  for (int l = 0; l < LAYERS; l++) {
    if (cudaMalloc(&r->pool[l], r->pool_bytes) != cudaSuccess) return -ENOMEM;
    for (int s = 0; s < SPL; s++)
      r->segs[l * SPL + s] = (kvt_segment){(char *)r->pool[l] + (size_t)s * n_slots * piece, piece, piece};
  }
  kvt_layout_init(&r->lay);
  r->lay.num_layers = LAYERS;
  r->lay.segments_per_layer = SPL;
  r->lay.num_slots = n_slots;
  r->lay.segments = r->segs;
  kvt_dev_open_args a = {.layout = &r->lay, .cuda_device = 0, .copy_threads = 1};
  int rc = r->be->open(&a, &r->ctx);
  if (rc) return rc;
  /* Host slots as the engine lays them out: a 4 KiB record prefix each. */
  size_t rec = 4096 + r->block_bytes;
  r->host_bytes = rec * n_slots;
  rc = r->be->host_alloc(r->ctx, r->host_bytes, (void **)&r->host, &r->pinned);
  if (rc) return rc;
  memset(r->host, 0x5a, r->host_bytes);
  rig_slots(r, n_slots);
  r->payload = malloc(n_slots * sizeof *r->payload);
  if (!r->slots || !r->payload) return -ENOMEM;
  for (uint32_t i = 0; i < n_slots; i++) r->payload[i] = r->host + i * rec + 4096;
  return 0;
}

/* Runs `reps` transfers of n blocks per direction in dirs (bit 0: store,
 * bit 1: load; both = at once on both lanes). Returns GB/s or < 0. */
static double rig_run(rig *r, int dirs, uint32_t n, int reps) {
  bjob j[2];
  int active[2] = {dirs & 1, (dirs >> 1) & 1};
  for (int d = 0; d < 2; d++) {
    memset(&j[d], 0, sizeof j[d]);
    pthread_mutex_init(&j[d].m, NULL);
    pthread_cond_init(&j[d].cv, NULL);
    /* The store uses the first half of the slots, the load the second. */
    uint32_t off = d == 0 ? 0 : r->max_blocks;
    j[d].x = (kvt_dev_xfer){.dir = d == 0 ? KVT_XFER_D2H : KVT_XFER_H2D, .n_blocks = n,
                            .dev_slots = r->slots + off, .host_blocks = r->payload + off,
                            .done = bjob_done, .engine_data = &j[d]};
    if (active[d] && r->be->xfer_prepare(r->ctx, &j[d].x)) return -1;
  }
  double t0 = now_s();
  int err = 0;
  for (int k = 0; k < reps && !err; k++)
    for (int d = 0; d < 2; d++) {
      if (!active[d]) continue;
      if (r->be->submit(r->ctx, &j[d].x) || bjob_wait(&j[d], k + 1)) err = 1;
    }
  double t = now_s() - t0;
  for (int d = 0; d < 2; d++)
    if (active[d]) {
      r->last_path[d] = kvt__cuda_xfer_path(&j[d].x);
      r->be->xfer_release(r->ctx, &j[d].x);
    }
  if (err) return -1;
  return (double)r->block_bytes * n * reps * (active[0] + active[1]) / t / 1e9;
}

/* Bidirectional: the load and store lanes run concurrently, each waiting
 * only for its own previous transfer. */
static void *bidir_load_thread(void *arg);

typedef struct bidir_arg {
  rig *r;
  uint32_t n;
  int reps;
  double gbps;
} bidir_arg;

static void *bidir_load_thread(void *arg) {
  bidir_arg *a = arg;
  a->gbps = rig_run(a->r, 2, a->n, a->reps);
  return NULL;
}

static double rig_bidir(rig *r, uint32_t n, int reps) {
  bidir_arg load = {r, n, reps, 0};
  pthread_t t;
  double t0 = now_s();
  if (pthread_create(&t, NULL, bidir_load_thread, &load)) return -1;
  double st = rig_run(r, 1, n, reps);
  pthread_join(t, NULL);
  double el = now_s() - t0;
  if (st < 0 || load.gbps < 0) return -1;
  return 2.0 * r->block_bytes * n * reps / el / 1e9;
}

/* Enough repetitions for ~`seconds` of copying at `guess_gbps`, 2..200. */
static int reps_for(size_t bytes, double seconds, double guess_gbps) {
  double per = bytes / (guess_gbps * 1e9) + 20e-6;
  int reps = (int)(seconds / per);
  return reps < 2 ? 2 : reps > 200 ? 200 : reps;
}

/* ---- ceilings: cudaMemcpy of one large pinned buffer ------------------ */

typedef struct ceilings {
  double h2d, d2h, bidir;
} ceilings;

static double time_copies(void *dst[2], void *src[2], size_t bytes, cudaStream_t s[2], int both,
                          int reps) {
  double t0 = now_s();
  for (int k = 0; k < reps; k++)
    for (int i = 0; i <= both; i++) cudaMemcpyAsync(dst[i], src[i], bytes, cudaMemcpyDefault, s[i]);
  for (int i = 0; i <= both; i++) cudaStreamSynchronize(s[i]);
  return (double)bytes * reps * (both + 1) / (now_s() - t0) / 1e9;
}

static int measure_ceilings(size_t bytes, ceilings *c) {
  void *h[2] = {NULL, NULL}, *d[2] = {NULL, NULL};
  cudaStream_t s[2];
  int ok = cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking) == cudaSuccess &&
           cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking) == cudaSuccess;
  for (int i = 0; ok && i < 2; i++)
    ok = cudaHostAlloc(&h[i], bytes, cudaHostAllocDefault) == cudaSuccess &&
         cudaMalloc(&d[i], bytes) == cudaSuccess;
  if (ok) {
    memset(h[0], 1, bytes);
    memset(h[1], 2, bytes);
    void *h2d_dst[2] = {d[0], d[1]}, *h2d_src[2] = {h[0], h[1]};
    void *mix_dst[2] = {d[0], h[1]}, *mix_src[2] = {h[0], d[1]};
    time_copies(h2d_dst, h2d_src, bytes, s, 0, 1); /* warm up */
    c->h2d = time_copies(h2d_dst, h2d_src, bytes, s, 0, 8);
    c->d2h = time_copies(h2d_src, h2d_dst, bytes, s, 0, 8);
    c->bidir = time_copies(mix_dst, mix_src, bytes, s, 1, 8);
  }
  for (int i = 0; i < 2; i++) {
    if (h[i]) cudaFreeHost(h[i]);
    if (d[i]) cudaFree(d[i]);
  }
  cudaStreamDestroy(s[0]);
  cudaStreamDestroy(s[1]);
  return ok ? 0 : -ENOMEM;
}

static int have_device(const char **why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
    return 0;
  }
  return 1;
}

/* ---- micro section --------------------------------------------------- */

static void micro_pair(kvt_bench_rows *rows, const ceilings *c, size_t piece, uint32_t n, double target,
                       double seconds) {
  rig r;
  char name[64];
  if (rig_open(&r, piece, n) == 0) {
    int reps = reps_for(r.block_bytes * n, seconds, 20);
    snprintf(name, sizeof name, "store %zu KiB pieces x%u blocks", piece / KIB, n);
    kvt_bench_row(rows, name, "GB/s", rig_run(&r, 1, n, reps), c->d2h, target,
                  "limit: cudaMemcpy D2H, large pinned");
    snprintf(name, sizeof name, "load %zu KiB pieces x%u blocks", piece / KIB, n);
    kvt_bench_row(rows, name, "GB/s", rig_run(&r, 2, n, reps), c->h2d, target,
                  "limit: cudaMemcpy H2D, large pinned");
  }
  rig_close(&r);
}

static int gpu_micro(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  const char *why;
  if (!have_device(&why)) {
    char note[160];
    snprintf(note, sizeof note, "no CUDA device: %s", why);
    kvt_bench_row(rows, "device copies", "GB/s", 0, 0, 0, note);
    return 0;
  }
  ceilings c;
  if (measure_ceilings(o->quick ? 64 * MIB : 512 * MIB, &c)) return -ENOMEM;
  micro_pair(rows, &c, 2 * MIB, o->quick ? 8 : 32, 0.9, o->seconds);
  micro_pair(rows, &c, 32 * KIB, o->quick ? 128 : 1024, 0.5, o->seconds);
  return 0;
}

/* ---- the full set ---------------------------------------------------- */

typedef struct out {
  FILE *csv, *json;
  int n_json;
} out;

static const char *path_name(int p) {
  static const char *names[] = {"auto", "memcpy", "batch", "kernel"};
  return p >= 0 && p <= 3 ? names[p] : "?";
}

static void emit(out *o, const char *test, const char *dir, size_t piece, uint32_t n, const char *path,
                 double gbps, double ceiling, const char *note) {
  double ratio = ceiling > 0 && gbps > 0 ? gbps / ceiling : 0;
  fprintf(o->csv, "%s,%s,%zu,%u,%s,%.3f,%.3f,%.4f,%s\n", test, dir, piece, n, path, gbps, ceiling, ratio,
          note);
  fprintf(o->json,
          "%s\n {\"test\":\"%s\",\"dir\":\"%s\",\"piece_bytes\":%zu,\"blocks\":%u,\"path\":\"%s\","
          "\"gbps\":%.3f,\"ceiling_gbps\":%.3f,\"ratio\":%.4f,\"note\":\"%s\"}",
          o->n_json++ ? "," : "", test, dir, piece, n, path, gbps, ceiling, ratio, note);
}

/* Best GB/s at the largest block count, per piece size and direction. */
typedef struct best {
  double gbps[3][2];
  int path[3][2];
  double by_path[3][2][4];
  int fell_back[3][2][4]; /* path asked for, another taken (e.g. batch refused) */
  int unpinned;           /* a rig's host pool could not be pinned (cudaHostRegister refused) */
} best;

static void sweep_piece(out *o, const ceilings *c, int si, size_t piece, int quick, best *b) {
  static const uint32_t counts[] = {1, 8, 64, 512, 4096};
  size_t cap = quick ? GIB / 8 : GIB; /* bytes per transfer */
  uint32_t max_n = 1;
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
    if ((size_t)LAYERS * SPL * piece * counts[k] <= cap) max_n = counts[k];
  rig r;
  int orc = rig_open(&r, piece, max_n);
  if (orc) {
    char note[64];
    snprintf(note, sizeof note, "setup failed: %s", kvt_strerror(orc));
    emit(o, "scatter", "-", piece, 0, "-", 0, 0, note);
    rig_close(&r);
    return;
  }
  if (!r.pinned) b->unpinned = 1;
  for (int p = KVT__CUDA_PATH_MEMCPY; p <= KVT__CUDA_PATH_KERNEL; p++) {
    if (kvt__cuda_set_path(r.ctx, p)) {
      emit(o, "scatter", "both", piece, 0, path_name(p), 0, 0, "path not available");
      continue;
    }
    for (size_t k = 0; k < sizeof counts / sizeof *counts && counts[k] <= max_n; k++) {
      uint32_t n = counts[k];
      int reps = reps_for(r.block_bytes * n, quick ? 0.02 : 0.08, 20);
      for (int d = 0; d < 2; d++) {
        double g = rig_run(&r, d == 0 ? 1 : 2, n, reps);
        double ceil_ = d == 0 ? c->d2h : c->h2d;
        int used = r.last_path[d];
        char note[64] = "";
        if (g < 0) snprintf(note, sizeof note, "transfer failed");
        else if (used != p) snprintf(note, sizeof note, "asked %s; backend took %s", path_name(p), path_name(used));
        emit(o, "scatter", d == 0 ? "store" : "load", piece, n, path_name(used), g, ceil_, note);
        if (n == max_n) {
          b->fell_back[si][d][p] = g >= 0 && used != p;
          b->by_path[si][d][p] = g;
          if (g > b->gbps[si][d]) b->gbps[si][d] = g, b->path[si][d] = p;
        }
      }
      kvt_bench_progress("gpu", (si * 3 + p) / 9.0);
    }
  }
  kvt__cuda_set_path(r.ctx, KVT__CUDA_PATH_AUTO);
  double g = rig_bidir(&r, max_n, reps_for(r.block_bytes * max_n, quick ? 0.05 : 0.2, 20));
  emit(o, "bidir", "both", piece, max_n, "auto", g, c->bidir, g < 0 ? "transfer failed" : "");
  rig_close(&r);
}

static void print_table(const ceilings *c, const best *b, const size_t *pieces) {
  printf("\nceiling (cudaMemcpy, large pinned): H2D %.1f GB/s, D2H %.1f GB/s, both at once %.1f GB/s\n",
         c->h2d, c->d2h, c->bidir);
  printf("%-8s %-6s %10s %10s %10s %10s  %-7s %6s %6s\n", "piece", "dir", "memcpy", "batch", "kernel",
         "best GB/s", "path", "ratio", "target");
  for (int si = 0; si < 3; si++)
    for (int d = 0; d < 2; d++) {
      double ceil_ = d == 0 ? c->d2h : c->h2d, ratio = b->gbps[si][d] / ceil_;
      double target = pieces[si] >= 2 * MIB ? 0.9 : pieces[si] <= 32 * KIB ? 0.5 : 0;
      char tgt[16] = "-";
      if (target > 0) snprintf(tgt, sizeof tgt, ">=%.1f", target);
      printf("%5zuKiB %-6s %10.1f %10.1f %10.1f %10.1f  %-7s %6.3f %6s%s\n", pieces[si] / KIB,
             d == 0 ? "store" : "load", b->by_path[si][d][1], b->by_path[si][d][2], b->by_path[si][d][3],
             b->gbps[si][d], path_name(b->path[si][d]), ratio, tgt,
             target > 0 ? (ratio >= target ? " ok" : " MISSED") : "");
    }
  for (int si = 0; si < 3; si++)
    for (int d = 0; d < 2; d++)
      for (int p = 1; p < 4; p++)
        if (b->fell_back[si][d][p])
          printf("note: %zuKiB %s: the %s column is another path's figure (the backend fell back; see gpu.csv)\n",
                 pieces[si] / KIB, d == 0 ? "store" : "load", path_name(p));
}

static int open_out(out *o, const char *dir) {
  char path[4096];
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/gpu.csv", dir);
  o->csv = fopen(path, "w");
  snprintf(path, sizeof path, "%s/gpu.json", dir);
  o->json = fopen(path, "w");
  o->n_json = 0;
  if (!o->csv || !o->json) {
    fprintf(stderr, "gpu: cannot write to %s\n", dir);
    return -1;
  }
  fprintf(o->csv, "test,dir,piece_bytes,blocks,path,gbps,ceiling_gbps,ratio,note\n");
  fprintf(o->json, "[");
  return 0;
}

static int gpu_main(int argc, char **argv) {
  const char *dir = "gpu-check-out";
  int quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--out") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      gpu_usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "kvtier-bench gpu: unknown option or missing value '%s'\n\n", argv[i]);
      gpu_usage(stderr);
      return 2;
    }
  }
  const char *why;
  if (!have_device(&why)) {
    fprintf(stderr, "gpu: no CUDA device: %s\n", why);
    return 1;
  }
  out o;
  if (open_out(&o, dir)) return 1;
  ceilings c;
  if (measure_ceilings(quick ? 128 * MIB : GIB, &c)) return 1;
  emit(&o, "ceiling", "load", 0, 0, "cudaMemcpy", c.h2d, c.h2d, "large pinned buffer");
  emit(&o, "ceiling", "store", 0, 0, "cudaMemcpy", c.d2h, c.d2h, "large pinned buffer");
  emit(&o, "ceiling", "both", 0, 0, "cudaMemcpy", c.bidir, c.bidir, "H2D and D2H at once");
  static const size_t pieces[3] = {32 * KIB, 256 * KIB, 2 * MIB};
  best b;
  memset(&b, 0, sizeof b);
  for (int si = 0; si < 3; si++) sweep_piece(&o, &c, si, pieces[si], quick, &b);
  kvt_bench_progress_done();
  fprintf(o.json, "\n]\n");
  fclose(o.csv);
  fclose(o.json);
  print_table(&c, &b, pieces);
  printf("host pool: %s\n", b.unpinned ? "NOT pinned (cudaHostRegister refused): copies were pageable, "
                                          "no kernel path" : "pinned (cudaHostRegister, mapped)");
  printf("kernel path threshold in use: pieces < %u KiB (src/dev/cuda/cuda_tuning.h)\n",
         KVT_CUDA_KERNEL_MAX_PIECE_BYTES / 1024u);
  printf("full numbers: %s/gpu.csv, %s/gpu.json\n", dir, dir);
  return 0;
}

#endif

KVT_BENCH_MICRO(gpu, gpu_micro)
KVT_BENCH_COMMAND(gpu, "CUDA backend copies vs cudaMemcpy ceilings (full set: --out DIR)", gpu_main)
