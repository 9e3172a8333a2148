/* kvtier-bench micro, core sections: block hashing vs raw XXH3, the tier
 * map with 1M resident blocks, host-tier store/load vs memcpy. Everything
 * goes through the public API. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bench.h"
#include "kvtier/kvtier.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile uint64_t sink; /* keeps measured work alive */

static kvt_cache *open_meta(uint32_t block_tokens, uint32_t slots, uint64_t host, uint32_t job_blocks) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.block_tokens = block_tokens;
  cfg.model_fingerprint = "kvtier-bench micro";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = host;
  cfg.max_jobs = 8;
  cfg.max_job_blocks = job_blocks;
  cfg.max_requests = 16;
  kvt_cache *c = NULL;
  if (kvt_open(&cfg, &c)) return NULL;
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = slots;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  if (kvt_register_layout(c, &lay)) {
    kvt_close(c);
    return NULL;
  }
  return c;
}

/* ---- hash ---- */

static int hash_one(const kvt_bench_micro_opts *o, kvt_bench_rows *rows, uint32_t bt, double target) {
  size_t n_tokens = o->quick ? (1u << 18) : (1u << 22); /* 1 or 16 MiB of token ids */
  size_t n_blocks = n_tokens / bt;
  uint32_t *tok = malloc(n_tokens * sizeof *tok);
  kvt_key *keys = malloc(n_blocks * sizeof *keys);
  kvt_cache *c = open_meta(bt, 16, 0, 64);
  int rc = tok && keys && c ? 0 : -ENOMEM;
  if (rc == 0) {
    for (size_t i = 0; i < n_tokens; i++) tok[i] = (uint32_t)(i * 2654435761u);
    double budget = o->seconds / 2, t0 = now_s(), t = 0;
    size_t reps = 0, nk;
    do { /* chained, through the API */
      rc = kvt_hash_tokens(c, NULL, tok, n_tokens, keys, n_blocks, &nk);
      sink += keys[nk - 1].lo;
      reps++;
    } while (rc == 0 && (t = now_s() - t0) < budget);
    double chained = (double)reps * (double)n_tokens * 4 / t;
    t0 = now_s();
    reps = 0;
    do { /* raw XXH3-128 over the same bytes, block by block, unchained */
      uint64_t acc = 0;
      for (size_t b = 0; b < n_blocks; b++) acc ^= XXH3_128bits(tok + b * bt, (size_t)bt * 4).low64;
      sink += acc;
      reps++;
    } while ((t = now_s() - t0) < budget);
    double raw = (double)reps * (double)n_tokens * 4 / t;
    char name[64], note[160];
    snprintf(name, sizeof name, "chained block keys, %u-token blocks", bt);
    snprintf(note, sizeof note, "limit: XXH3_128 over the same %u-byte blocks, unchained, one thread", bt * 4);
    kvt_bench_row(rows, name, "GB/s", chained / 1e9, raw / 1e9, target, note);
  }
  free(tok);
  free(keys);
  kvt_close(c);
  return rc;
}

static int micro_hash(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  int rc = hash_one(o, rows, 16, 0.5);
  return rc ? rc : hash_one(o, rows, 256, 0.9);
}
KVT_BENCH_MICRO(hash, micro_hash)

/* ---- map ---- */

#define MAP_CHAIN 256u

typedef struct map_bench {
  kvt_cache *c;
  kvt_key *keys;
  uint32_t n_chains;
  uint32_t slots[MAP_CHAIN];
} map_bench;

/* One request over chain ch: restore all (device hits), commit, release. */
static int map_request(map_bench *m, uint32_t ch, size_t restore) {
  kvt_req req;
  int rc = kvt_acquire(m->c, m->keys + (size_t)ch * MAP_CHAIN, NULL, MAP_CHAIN, restore, 0, 0, &req, m->slots, NULL);
  if (rc < 0) return rc;
  if (rc == 1 && (rc = kvt_request_wait(m->c, req, -1, NULL)) != 0) return rc;
  if ((rc = kvt_commit(m->c, req, MAP_CHAIN, NULL)) != 0) return rc;
  return kvt_release(m->c, req);
}

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int map_measure(map_bench *m, const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  uint64_t rng = 88172645463325252ull, ops = 0;
  kvt_lookup_result lr = {.size = sizeof lr};
  double budget = o->seconds / 2, t0 = now_s(), t = 0;
  int rc = 0;
  do { /* lookups of whole chains at random: every block a hit */
    for (int i = 0; i < 64 && rc == 0; i++) {
      rc = kvt_lookup(m->c, m->keys + (xorshift(&rng) % m->n_chains) * MAP_CHAIN, MAP_CHAIN, &lr, NULL);
      ops += lr.n_prefix;
    }
  } while (rc == 0 && (t = now_s() - t0) < budget);
  if (rc) return rc;
  kvt_bench_row(rows, "kvt_lookup, 1M resident, batches of 256", "Mops/s", (double)ops / t / 1e6, 10.0, 1.0,
                "blocks found per second, one thread; limit: a goal of 10M per core");
  ops = 0;
  t0 = now_s();
  do { /* acquire (lookup + pin) and release (unpin + touch) of device hits */
    rc = map_request(m, (uint32_t)(xorshift(&rng) % m->n_chains), MAP_CHAIN);
    ops += MAP_CHAIN;
  } while (rc == 0 && (t = now_s() - t0) < budget);
  if (rc) return rc;
  kvt_bench_row(rows, "acquire+release of device hits (pin, touch)", "Mops/s", (double)ops / t / 1e6, 10.0, 1.0,
                "blocks per second through kvt_acquire/commit/release, one thread");
  kvt_stats st = {.size = sizeof st};
  if ((rc = kvt_get_stats(m->c, &st)) != 0) return rc;
  char note[160];
  snprintf(note, sizeof note, "kvt_stats.metadata_bytes / resident blocks (map, jobs, refs) vs KVT_MAP_BYTES_PER_BLOCK; "
           "lower is better");
  kvt_bench_row(rows, "metadata bytes per resident block", "B", (double)st.metadata_bytes / (double)st.resident_device,
                KVT_MAP_BYTES_PER_BLOCK, 0, note);
  return 0;
}

static int micro_map(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  map_bench m;
  memset(&m, 0, sizeof m);
  m.n_chains = (o->quick ? (1u << 16) : (1u << 20)) / MAP_CHAIN;
  size_t n = (size_t)m.n_chains * MAP_CHAIN;
  uint64_t *ids = malloc(n * sizeof *ids);
  m.keys = malloc(n * sizeof *m.keys);
  m.c = open_meta(16, (uint32_t)n, 0, MAP_CHAIN);
  int rc = ids && m.keys && m.c ? 0 : -ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++) ids[i] = i * 0x9e3779b97f4a7c15ull;
  if (rc == 0) rc = kvt_keys_from_opaque(m.c, ids, sizeof *ids, n, m.keys);
  for (uint32_t ch = 0; rc == 0 && ch < m.n_chains; ch++) rc = map_request(&m, ch, 0); /* fill the device */
  if (rc == 0) rc = map_measure(&m, o, rows);
  if (rc > 0) rc = -EIO;
  free(ids);
  free(m.keys);
  kvt_close(m.c);
  return rc;
}
KVT_BENCH_MICRO(map, micro_map)

/* ---- host ---- */

typedef struct host_bench {
  kvt_cache *c;
  unsigned char *pool;
  size_t block_bytes;
  uint32_t n; /* blocks per round */
  kvt_key *keys;
  uint32_t *slots;
  uint64_t next_id;
} host_bench;

static int host_open(host_bench *h, size_t block_bytes, uint32_t n) {
  const uint32_t layers = 32, spl = 2, nseg = layers * spl;
  memset(h, 0, sizeof *h);
  h->block_bytes = block_bytes;
  h->n = n;
  h->pool = malloc((size_t)n * block_bytes);
  h->keys = calloc(n, sizeof *h->keys);
  h->slots = calloc(n, sizeof *h->slots);
  kvt_segment *segs = calloc(nseg, sizeof *segs);
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "kvtier-bench micro host";
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = 2 * (uint64_t)n;
  cfg.max_jobs = 8;
  cfg.max_job_blocks = n;
  int rc = h->pool && h->keys && h->slots && segs ? kvt_open(&cfg, &h->c) : -ENOMEM;
  if (rc == 0) {
    memset(h->pool, 0x5a, (size_t)n * block_bytes); /* fault the pages in */
    for (uint32_t i = 0; i < nseg; i++) {
      segs[i].base = h->pool + (size_t)i * (block_bytes / nseg);
      segs[i].stride = block_bytes;
      segs[i].bytes = block_bytes / nseg;
    }
    kvt_layout lay;
    kvt_layout_init(&lay);
    lay.num_layers = layers;
    lay.segments_per_layer = spl;
    lay.num_slots = n;
    lay.segments = segs;
    rc = kvt_register_layout(h->c, &lay);
  }
  free(segs);
  return rc;
}

static void host_close(host_bench *h) {
  kvt_close(h->c);
  free(h->pool);
  free(h->keys);
  free(h->slots);
}

/* One round: compute n fresh blocks; time storing them (evicting the device
 * copies) and loading them back. */
static int host_round(host_bench *h, double *store_s, double *load_s) {
  uint64_t *ids = malloc(h->n * sizeof *ids);
  if (!ids) return -ENOMEM;
  for (uint32_t i = 0; i < h->n; i++) ids[i] = h->next_id++;
  int rc = kvt_keys_from_opaque(h->c, ids, sizeof *ids, h->n, h->keys);
  free(ids);
  kvt_req req;
  kvt_job job;
  if (rc == 0 && (rc = kvt_acquire(h->c, h->keys, NULL, h->n, 0, 0, 0, &req, h->slots, NULL)) == 0) {
    rc = kvt_commit(h->c, req, h->n, NULL);
    kvt_release(h->c, req);
  }
  if (rc) return rc;
  double t0 = now_s();
  rc = kvt_store(h->c, h->keys, h->n, KVT_STORE_EVICT, &job);
  if (rc == 1) {
    rc = kvt_job_wait(h->c, job, -1);
    kvt_job_release(h->c, job);
  } else if (rc == 0) {
    rc = -EIO; /* nothing was stored: the measurement would be empty */
  }
  *store_s += now_s() - t0;
  if (rc) return rc;
  t0 = now_s();
  kvt_acquire_info info = {.size = sizeof info};
  rc = kvt_acquire(h->c, h->keys, NULL, h->n, h->n, 0, 0, &req, h->slots, &info);
  if (rc == 1) rc = kvt_request_wait(h->c, req, -1, NULL);
  *load_s += now_s() - t0;
  if (rc == 0 && info.n_loading != h->n) rc = -EIO;
  if (rc == 0) rc = kvt_commit(h->c, req, h->n, NULL);
  kvt_release(h->c, req);
  return rc;
}

/* memcpy of n blocks between two buffers: whole blocks (layer_major 0), or
 * as the host backend orders its copies to publish per-layer progress:
 * layer by layer, each layer's K and V segment of every block. */
static double memcpy_rate(size_t block_bytes, uint32_t n, double budget, int layer_major) {
  size_t bytes = (size_t)n * block_bytes;
  unsigned char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) {
    free(a);
    free(b);
    return 0;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double t0 = now_s(), t = 0;
  size_t reps = 0;
  do {
    if (!layer_major) {
      for (uint32_t i = 0; i < n; i++) memcpy(b + (size_t)i * block_bytes, a + (size_t)i * block_bytes, block_bytes);
    } else {
      size_t seg = block_bytes / 64;
      for (size_t l = 0; l < 32; l++)
        for (uint32_t i = 0; i < n; i++)
          for (size_t k = 0; k < 2; k++) {
            size_t off = (size_t)i * block_bytes + (l * 2 + k) * seg;
            memcpy(b + off, a + off, seg);
          }
    }
    sink += b[(reps * 4099) % bytes];
    reps++;
  } while ((t = now_s() - t0) < budget);
  free(a);
  free(b);
  return (double)reps * (double)bytes / t;
}

static int host_one(const kvt_bench_micro_opts *o, kvt_bench_rows *rows, size_t block_bytes) {
  uint32_t n = (uint32_t)((o->quick ? (64u << 20) : (512u << 20)) / block_bytes); /* 64 / 512 MiB a round */
  host_bench h;
  int rc = host_open(&h, block_bytes, n);
  double st = 0, ld = 0, budget = o->seconds / 3, t0 = now_s();
  uint32_t rounds = 0;
  for (int w = 0; rc == 0 && w < 2; w++) rc = host_round(&h, &st, &ld); /* warm: every host pool page */
  st = ld = 0;
  while (rc == 0 && (rounds < 2 || now_s() - t0 < 2 * budget)) {
    rc = host_round(&h, &st, &ld);
    rounds++;
  }
  host_close(&h);
  if (rc) return rc > 0 ? -EIO : rc;
  double bytes = (double)rounds * n * block_bytes, limit = memcpy_rate(block_bytes, n, budget, 0);
  double lm_rate = memcpy_rate(block_bytes, n, budget, 1);
  char name[64], note[160], sz[16];
  snprintf(sz, sizeof sz, block_bytes >= (1u << 20) ? "%zu MiB" : "%zu KiB",
           block_bytes >= (1u << 20) ? block_bytes >> 20 : block_bytes >> 10);
  snprintf(note, sizeof note, "%u blocks/job, 32 layers x K,V segments; limit: memcpy of the same %s blocks, 1 thread", n,
           sz);
  snprintf(name, sizeof name, "host store (device->host), %s blocks", sz);
  kvt_bench_row(rows, name, "GB/s", bytes / st / 1e9, limit / 1e9, 0.9, note);
  snprintf(name, sizeof name, "host load (host->device), %s blocks", sz);
  kvt_bench_row(rows, name, "GB/s", bytes / ld / 1e9, limit / 1e9, 0.9, note);
  snprintf(name, sizeof name, "memcpy layer-major, %s blocks", sz);
  snprintf(note, sizeof note, "the host backend's copy order (per layer: %zu-byte K,V of every block); vs whole blocks",
           block_bytes / 64);
  kvt_bench_row(rows, name, "GB/s", lm_rate / 1e9, limit / 1e9, 0, note);
  return 0;
}

static int micro_host(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  int rc = host_one(o, rows, 2u << 20);
  return rc ? rc : host_one(o, rows, 64u << 10);
}
KVT_BENCH_MICRO(host, micro_host)
