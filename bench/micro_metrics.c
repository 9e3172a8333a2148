/* kvtier-bench micro, section "metrics": what counting costs on the hot
 * paths. The same workload runs through two builds of the library, loaded
 * side by side in this process: libkvtier.so as built, and the same sources
 * built with counting compiled out (cmake -DKVT_METRICS=OFF's code, built
 * for the bench as libkvtier_nometrics.so). Rounds alternate between the
 * two; the best round of each is compared, so a noisy neighbour costs both
 * alike. Both libraries are reached through dlsym, so calls cost the same. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kvtier/kvtier.h"

#ifndef KVT_BENCH_LIB_ON
#define KVT_BENCH_LIB_ON ""
#endif
#ifndef KVT_BENCH_LIB_OFF
#define KVT_BENCH_LIB_OFF ""
#endif

typedef struct api {
  void *dl;
  void (*config_init)(kvt_config *);
  void (*layout_init)(kvt_layout *);
  int (*open)(const kvt_config *, kvt_cache **);
  int (*register_layout)(kvt_cache *, const kvt_layout *);
  void (*close)(kvt_cache *);
  int (*keys_from_opaque)(const kvt_cache *, const void *, size_t, size_t, kvt_key *);
  int (*acquire)(kvt_cache *, const kvt_key *, const uint32_t *, size_t, size_t, size_t, uint32_t, kvt_req *,
                 uint32_t *, kvt_acquire_info *);
  int (*request_wait)(kvt_cache *, kvt_req, int64_t, uint32_t *);
  int (*commit)(kvt_cache *, kvt_req, size_t, void *);
  int (*release)(kvt_cache *, kvt_req);
  int (*store)(kvt_cache *, const kvt_key *, size_t, uint32_t, kvt_job *);
  int (*job_wait)(kvt_cache *, kvt_job, int64_t);
  int (*job_release)(kvt_cache *, kvt_job);
  int (*metrics_write)(kvt_cache *, int, char *, size_t *);
} api;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define SYM(a, f, name) ((*(void **)&(a)->f = dlsym((a)->dl, name)) != NULL)

static int api_load(api *a, const char *path) {
  memset(a, 0, sizeof *a);
  if (!path[0] || !(a->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL))) return -ENOENT;
  int ok = SYM(a, config_init, "kvt_config_init") && SYM(a, layout_init, "kvt_layout_init") &&
           SYM(a, open, "kvt_open") && SYM(a, register_layout, "kvt_register_layout") &&
           SYM(a, close, "kvt_close") && SYM(a, keys_from_opaque, "kvt_keys_from_opaque") &&
           SYM(a, acquire, "kvt_acquire") && SYM(a, request_wait, "kvt_request_wait") &&
           SYM(a, commit, "kvt_commit") && SYM(a, release, "kvt_release") && SYM(a, store, "kvt_store") &&
           SYM(a, job_wait, "kvt_job_wait") && SYM(a, job_release, "kvt_job_release") &&
           SYM(a, metrics_write, "kvt_metrics_write");
  return ok ? 0 : -ENOENT;
}

#define CHAIN 64u
#define SEG_BYTES 1024u /* 8 layers x K, V: 16 KiB blocks, so per-block work shows */

typedef struct wl {
  const api *a;
  kvt_cache *c;
  kvt_key keys[CHAIN];
  uint32_t slots[CHAIN];
  unsigned char *pool;
  kvt_segment seg[16];
} wl;

/* A cache of the host backend: real bytes (copy path) or metadata only. */
static int wl_open(wl *w, const api *a, int real) {
  memset(w, 0, sizeof *w);
  w->a = a;
  kvt_config cfg;
  a->config_init(&cfg);
  cfg.model_fingerprint = "kvtier-bench micro metrics";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = real ? CHAIN : 0;
  cfg.copy_threads = 1;
  cfg.max_jobs = 8;
  cfg.max_job_blocks = CHAIN;
  cfg.max_requests = 8;
  int rc = a->open(&cfg, &w->c);
  if (rc) return rc;
  kvt_layout lay;
  a->layout_init(&lay);
  lay.num_slots = CHAIN;
  if (real) {
    lay.num_layers = 8;
    w->pool = calloc(16, (size_t)CHAIN * SEG_BYTES);
    if (!w->pool) return -ENOMEM;
    for (int s = 0; s < 16; s++)
      w->seg[s] = (kvt_segment){w->pool + (size_t)s * CHAIN * SEG_BYTES, SEG_BYTES, SEG_BYTES};
    lay.segments = w->seg;
  } else {
    lay.num_layers = 1;
    lay.flags = KVT_LAYOUT_METADATA_ONLY;
  }
  if ((rc = a->register_layout(w->c, &lay)) != 0) return rc;
  uint64_t ids[CHAIN];
  for (uint32_t i = 0; i < CHAIN; i++) ids[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
  return a->keys_from_opaque(w->c, ids, sizeof ids[0], CHAIN, w->keys);
}

static void wl_close(wl *w) {
  if (w->c) w->a->close(w->c);
  free(w->pool);
  w->c = NULL;
  w->pool = NULL;
}

static int wl_request(wl *w) {
  kvt_req r;
  int rc = w->a->acquire(w->c, w->keys, NULL, CHAIN, CHAIN, 0, 0, &r, w->slots, NULL);
  if (rc == 1) rc = w->a->request_wait(w->c, r, -1, NULL);
  if (rc == 0) rc = w->a->commit(w->c, r, CHAIN, NULL);
  if (rc == 0) rc = w->a->release(w->c, r);
  return rc;
}

static int wl_offload(wl *w) {
  kvt_job j;
  int rc = w->a->store(w->c, w->keys, CHAIN, KVT_STORE_EVICT, &j);
  if (rc == 1 && (rc = w->a->job_wait(w->c, j, -1)) == 0) rc = w->a->job_release(w->c, j);
  return rc;
}

/* Blocks per second over one round of `budget` seconds: acquire+release of
 * device hits (copy 0), or offload + restore through the host tier (copy 1). */
static int wl_round(wl *w, int copy, double budget, double *rate) {
  uint64_t blocks = 0;
  double t0 = now_s(), t;
  int rc = 0;
  do {
    for (int i = 0; i < 16 && rc == 0; i++) {
      if (copy) rc = wl_offload(w);
      if (rc == 0) rc = wl_request(w);
      blocks += CHAIN;
    }
  } while (rc == 0 && (t = now_s() - t0) < budget);
  if (rc) return rc < 0 ? rc : -EIO;
  *rate = (double)blocks / t;
  return 0;
}

/* The cache counts (or not) as its library claims in kvtier_info. */
static int counting_is(wl *w, const char *want) {
  static char text[32768];
  size_t len = sizeof text;
  char label[32];
  snprintf(label, sizeof label, "counting=\"%s\"", want);
  return w->a->metrics_write(w->c, KVT_METRICS_PROMETHEUS, text, &len) == 0 && strstr(text, label) ? 0 : -EINVAL;
}

static int measure(const api *on, const api *off, int copy, int rounds, double budget, double best[2]) {
  wl w[2];
  int rc = wl_open(&w[0], on, copy);
  if (rc == 0) rc = wl_open(&w[1], off, copy);
  if (rc == 0) rc = counting_is(&w[1], "off");
  for (int k = 0; rc == 0 && k < 2; k++) rc = wl_request(&w[k]); /* computed once: then every block is cached */
  best[0] = best[1] = 0;
  for (int r = 0; rc == 0 && r < rounds; r++)
    for (int k = 0; rc == 0 && k < 2; k++) {
      int which = (r + k) % 2; /* alternate who goes first */
      double rate = 0;
      rc = wl_round(&w[which], copy, budget, &rate);
      if (rate > best[which]) best[which] = rate;
    }
  wl_close(&w[0]);
  wl_close(&w[1]);
  return rc;
}

static int micro_metrics(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  api on, off;
  if (api_load(&on, KVT_BENCH_LIB_ON) || api_load(&off, KVT_BENCH_LIB_OFF)) {
    kvt_bench_row(rows, "counting on vs compiled out (not run)", "-", 0, 0, 0,
                  "needs libkvtier.so and libkvtier_nometrics.so of the build tree (kvtier-bench as built, "
                  "not installed)");
    return 0;
  }
  int rounds = o->quick ? 3 : 7, rc;
  double budget = o->seconds / 4, best[2];
  char note[160];
  if ((rc = measure(&on, &off, 0, rounds, budget, best)) == 0) {
    snprintf(note, sizeof note, "blocks/s through kvt_acquire+commit+release of %u device hits; limit: the same "
             "with counting compiled out; best of %d alternating rounds", CHAIN, rounds);
    kvt_bench_row(rows, "acquire+release, counting on vs compiled out", "Mblk/s", best[0] / 1e6, best[1] / 1e6,
                  0.97, note);
  }
  if (rc == 0 && (rc = measure(&on, &off, 1, rounds, budget, best)) == 0) {
    snprintf(note, sizeof note, "blocks/s of %u x 16 KiB offloaded to host and restored (one copy thread); "
             "limit: the same with counting compiled out; best of %d rounds", CHAIN, rounds);
    kvt_bench_row(rows, "host copy round trip, counting on vs compiled out", "Mblk/s", best[0] / 1e6,
                  best[1] / 1e6, 0.97, note);
  }
  return rc; /* both stay loaded: their fork handlers stay registered until exit */
}
KVT_BENCH_MICRO(metrics, micro_metrics)
