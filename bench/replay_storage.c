/* Trace replay through storage mode (replay_core.h, "Storage mode").
 *
 * The engine owns its device pool: device_blocks pages in RAM with its own
 * LRU (or, at capacity 0, as many pages as the running request needs).
 * kvtier is only the host and disk tiers below it. Per request:
 *  - hit: the longest prefix whose blocks are each on the engine's pages or
 *    in kvtier (kvt_exists from the first block not on a page, opaque keys);
 *  - the blocks already on pages are pinned; pages for the rest come from
 *    the engine's LRU victims, which are first put into kvtier
 *    (kvt_put_from: owner mode demotes device victims to the host the same
 *    way, and a key kvtier holds is not written again);
 *  - kvt_get_into loads the restored blocks not on pages (the planner's k,
 *    the whole prefix, or none), with KVT_GET_PROMOTE: a disk hit also lands
 *    in kvtier's host tier, as owner mode stages a disk hit through a host
 *    slot (--no-promote: plain gets); every other block is "computed" (stamped);
 *  - the request's pages are touched last to first, and so are kvtier's
 *    copies of its blocks (kvt_touch, as owner mode's release); at capacity 0 its
 *    blocks are put into kvtier and the pages freed (owner mode's
 *    kvt_store(KVT_STORE_EVICT)).
 * Blocks are real bytes (storage mode has no metadata-only layout), scaled
 * as for owner mode. Plans come from kvt_cost_plan with the full-size model. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "replay_core.h"

#define NONE UINT32_MAX

typedef struct spage {
  kvt_key key;
  uint32_t prev, next, hnext; /* LRU links (head = most recent), hash chain */
  uint8_t used, pinned;
} spage;

typedef struct sengine {
  kvt_cache *c;
  const kvt_model_desc *model;
  kvt_hw_desc hw;
  uint32_t n_pages, n_free, *free_pages, lru_head, lru_tail;
  uint32_t *buckets, mask;
  spage *pages;
  unsigned char *pool;
  size_t block_bytes;
  int offload_after; /* capacity 0: the pages hold only the running request */
  /* per request, max_keyed + 1 each */
  kvt_key *keys, *batch_keys;
  uint32_t *page_of, *batch_pages;
  uint8_t *tiers;
  kvt_piece *pieces;
  int32_t *results;
  char tmpdir[256], disk_file[320];
} sengine;

__attribute__((format(printf, 3, 4))) static int serr(char *err, size_t len, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return -EINVAL;
}

static int skvt(char *err, size_t len, const char *what, int rc) {
  serr(err, len, "%s: %s", what, kvt_strerror(rc));
  return rc < 0 ? rc : -EIO;
}

/* ---- the engine's pages: hash by key, LRU list ---- */

static uint32_t bucket(const sengine *e, const kvt_key *k) {
  return (uint32_t)((k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull)) >> 20) & e->mask;
}

static uint32_t page_find(const sengine *e, const kvt_key *k) {
  for (uint32_t p = e->buckets[bucket(e, k)]; p != NONE; p = e->pages[p].hnext)
    if (e->pages[p].key.lo == k->lo && e->pages[p].key.hi == k->hi) return p;
  return NONE;
}

static void lru_unlink(sengine *e, uint32_t p) {
  spage *g = &e->pages[p];
  if (g->prev != NONE) e->pages[g->prev].next = g->next;
  else e->lru_head = g->next;
  if (g->next != NONE) e->pages[g->next].prev = g->prev;
  else e->lru_tail = g->prev;
  g->prev = g->next = NONE;
}

static void lru_push_head(sengine *e, uint32_t p) {
  spage *g = &e->pages[p];
  g->prev = NONE;
  g->next = e->lru_head;
  if (e->lru_head != NONE) e->pages[e->lru_head].prev = p;
  e->lru_head = p;
  if (e->lru_tail == NONE) e->lru_tail = p;
}

static void page_drop(sengine *e, uint32_t p) {
  uint32_t *at = &e->buckets[bucket(e, &e->pages[p].key)];
  while (*at != p) at = &e->pages[*at].hnext;
  *at = e->pages[p].hnext;
  lru_unlink(e, p);
  e->pages[p].used = 0;
  e->free_pages[e->n_free++] = p;
}

static uint32_t page_take(sengine *e, const kvt_key *k) {
  uint32_t p = e->free_pages[--e->n_free];
  spage *g = &e->pages[p];
  g->key = *k;
  g->used = 1;
  g->pinned = 1;
  g->prev = g->next = NONE;
  uint32_t b = bucket(e, k);
  g->hnext = e->buckets[b];
  e->buckets[b] = p;
  return p;
}

static unsigned char *page_bytes(const sengine *e, uint32_t p) { return e->pool + (size_t)p * e->block_bytes; }

/* The stamp a "computed" block carries: its key, at both ends. */
static void stamp(sengine *e, uint32_t p, const kvt_key *k) {
  memcpy(page_bytes(e, p), k, sizeof *k);
  memcpy(page_bytes(e, p) + e->block_bytes - sizeof *k, k, sizeof *k);
}

static int stamp_ok(const sengine *e, uint32_t p, const kvt_key *k) {
  return !memcmp(page_bytes(e, p), k, sizeof *k) &&
         !memcmp(page_bytes(e, p) + e->block_bytes - sizeof *k, k, sizeof *k);
}

/* ---- batches ---- */

/* Puts (get = 0) or gets n blocks of batch_keys / batch_pages; per-block
 * results land in e->results. Returns 0 or an error with err set. */
static int batch(sengine *e, uint32_t n, int get, uint32_t flags, char *err, size_t len) {
  if (n == 0) return 0;
  for (uint32_t i = 0; i < n; i++)
    e->pieces[i] = (kvt_piece){.ptr = page_bytes(e, e->batch_pages[i]), .len = e->block_bytes};
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = n;
  b.keys = e->batch_keys;
  b.pieces = e->pieces;
  b.flags = KVT_KEYS_OPAQUE | flags;
  kvt_job job = 0;
  int rc = get ? kvt_get_into(e->c, &b, &job) : kvt_put_from(e->c, &b, &job);
  if (rc != 1) return skvt(err, len, get ? "kvt_get_into" : "kvt_put_from", rc);
  int wrc = kvt_storage_wait(e->c, job, -1);
  rc = kvt_storage_results(e->c, job, e->results, n, NULL);
  kvt_storage_release(e->c, job);
  if (rc) return skvt(err, len, "kvt_storage_results", rc);
  /* A put that found no room, or a block that failed, is the cache's loss,
   * not the replay's: per-block results say which. */
  (void)wrc;
  return 0;
}

/* ---- open / close ---- */

static void sengine_close(sengine *e) {
  kvt_close(e->c);
  free(e->free_pages);
  free(e->buckets);
  free(e->pages);
  free(e->pool);
  free(e->keys);
  free(e->batch_keys);
  free(e->page_of);
  free(e->batch_pages);
  free(e->tiers);
  free(e->pieces);
  free(e->results);
  if (e->tmpdir[0]) {
    unlink(e->disk_file);
    rmdir(e->tmpdir);
  }
  memset(e, 0, sizeof *e);
}

static int layout(sengine *e, const kvt_model_desc *m, uint32_t bt, uint32_t scale, char *err, size_t len) {
  uint32_t spl = m->mla_latent_dim ? 1 : 2, n_seg = m->num_layers * spl;
  size_t seg = (size_t)(kvt_model_kv_bytes_per_token(m) * bt / n_seg / scale);
  if (seg < 16) return serr(err, len, "payload scale %u leaves segments under 16 bytes", scale);
  e->block_bytes = seg * n_seg;
  kvt_segment *segs = calloc(n_seg, sizeof *segs);
  if (!segs) return serr(err, len, "out of memory");
  for (uint32_t i = 0; i < n_seg; i++) segs[i].bytes = seg;
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = m->num_layers;
  lay.segments_per_layer = spl;
  lay.segments = segs;
  lay.flags = KVT_LAYOUT_STORAGE;
  int rc = kvt_register_layout(e->c, &lay);
  free(segs);
  return rc ? skvt(err, len, "kvt_register_layout", rc) : 0;
}

static int sengine_open(sengine *e, const kvt_bench_trace *t, const kvt_bench_replay_opts *o,
                        const kvt_model_desc *m, uint32_t max_keyed, uint32_t scale, char *err, size_t len) {
  memset(e, 0, sizeof *e);
  e->model = m;
  e->hw = o->hw;
  e->offload_after = o->device_blocks == 0;
  e->n_pages = (uint32_t)(o->device_blocks ? o->device_blocks : (max_keyed ? max_keyed : 1));
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.block_tokens = t->block_tokens;
  cfg.model_fingerprint = m->name;
  cfg.host_blocks = o->host_blocks;
  cfg.disk_blocks = o->disk_blocks;
  cfg.disk_reset = 1;
  cfg.max_jobs = 64;
  cfg.max_job_blocks = max_keyed + 1 > 1024 ? max_keyed + 1 : 1024;
  if (o->disk_blocks) {
    if (o->disk_path) {
      snprintf(e->disk_file, sizeof e->disk_file, "%s", o->disk_path);
    } else {
      const char *base = getenv("TMPDIR");
      snprintf(e->tmpdir, sizeof e->tmpdir, "%s/kvtier-replay-XXXXXX", base && *base ? base : "/tmp");
      if (!mkdtemp(e->tmpdir)) {
        e->tmpdir[0] = '\0';
        return serr(err, len, "cannot create a temporary directory: %s", strerror(errno));
      }
      snprintf(e->disk_file, sizeof e->disk_file, "%s/disk.kvt", e->tmpdir);
    }
    cfg.disk_path = e->disk_file;
  }
  int rc = kvt_open(&cfg, &e->c);
  if (rc) return skvt(err, len, "kvt_open", rc);
  if ((rc = layout(e, m, t->block_tokens, scale, err, len)) != 0) return rc;
  uint32_t nb = 1;
  while (nb < 2 * e->n_pages) nb <<= 1;
  e->mask = nb - 1;
  size_t k = (size_t)max_keyed + 1;
  e->pool = malloc((size_t)e->n_pages * e->block_bytes);
  e->pages = calloc(e->n_pages, sizeof *e->pages);
  e->free_pages = malloc(e->n_pages * sizeof *e->free_pages);
  e->buckets = malloc(nb * sizeof *e->buckets);
  e->keys = calloc(k, sizeof *e->keys);
  e->batch_keys = calloc(k, sizeof *e->batch_keys);
  e->page_of = calloc(k, sizeof *e->page_of);
  e->batch_pages = calloc(k, sizeof *e->batch_pages);
  e->tiers = calloc(k, 1);
  e->pieces = calloc(k, sizeof *e->pieces);
  e->results = calloc(k, sizeof *e->results);
  if (!e->pool || !e->pages || !e->free_pages || !e->buckets || !e->keys || !e->batch_keys || !e->page_of ||
      !e->batch_pages || !e->tiers || !e->pieces || !e->results)
    return serr(err, len, "out of memory for a %u-page engine pool", e->n_pages);
  memset(e->buckets, 0xff, nb * sizeof *e->buckets);
  for (uint32_t p = e->n_pages; p-- > 0;) e->free_pages[e->n_free++] = p;
  e->lru_head = e->lru_tail = NONE;
  return 0;
}

/* ---- one request ---- */

typedef struct sstep {
  kvt_plan plan;
  uint32_t n_keyed, reused, loaded, from_disk, failed;
  uint64_t verified, corrupt;
} sstep;

/* The hit prefix: blocks on the engine's pages or in kvtier, with tiers. */
static int hit_prefix(sengine *e, uint32_t n, uint32_t *prefix, char *err, size_t len) {
  uint32_t i = 0;
  for (uint32_t k = 0; k < n; k++) e->page_of[k] = page_find(e, &e->keys[k]);
  while (i < n) {
    if (e->page_of[i] != NONE) {
      e->tiers[i++] = KVT_TIER_DEVICE;
      continue;
    }
    kvt_lookup_result lr = {.size = sizeof lr};
    int rc = kvt_exists(e->c, NULL, e->keys + i, n - i, KVT_KEYS_OPAQUE, &lr, e->tiers + i);
    if (rc) return skvt(err, len, "kvt_exists", rc);
    if (lr.n_prefix == 0) break;
    for (uint32_t k = i; k < i + lr.n_prefix; k++)
      if (e->page_of[k] != NONE) e->tiers[k] = KVT_TIER_DEVICE;
    i += lr.n_prefix;
  }
  for (uint32_t k = i; k < n; k++) e->tiers[k] = KVT_TIER_NONE;
  *prefix = i;
  return 0;
}

/* Pages for the request's blocks not on one: LRU victims, put first. */
static int take_pages(sengine *e, uint32_t n, char *err, size_t len) {
  uint32_t need = 0, nv = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (e->page_of[i] == NONE) need++;
    else e->pages[e->page_of[i]].pinned = 1;
  }
  for (uint32_t p = e->lru_tail; e->n_free + nv < need && p != NONE; p = e->pages[p].prev) {
    if (e->pages[p].pinned) continue;
    e->batch_keys[nv] = e->pages[p].key;
    e->batch_pages[nv++] = p;
  }
  if (e->n_free + nv < need) return serr(err, len, "engine pool: no room for a request");
  int rc = batch(e, nv, 0, 0, err, len);
  if (rc) return rc;
  for (uint32_t v = 0; v < nv; v++) page_drop(e, e->batch_pages[v]);
  for (uint32_t i = 0; i < n; i++)
    if (e->page_of[i] == NONE) e->page_of[i] = page_take(e, &e->keys[i]);
  return 0;
}

static int sstep_run(sengine *e, const kvt_bench_trace *t, const kvt_bench_req *q, const kvt_bench_replay_opts *o,
                     sstep *so, char *err, size_t len) {
  memset(so, 0, sizeof *so);
  uint32_t n = kvt_bench_replay_keyed(t, q, o->whole_ids);
  if (n > e->n_pages) n = e->n_pages;
  uint64_t n_tokens = q->input_tokens;
  if (o->whole_ids && n_tokens < (uint64_t)q->n_ids * t->block_tokens) n_tokens = (uint64_t)q->n_ids * t->block_tokens;
  so->n_keyed = n;
  int rc = kvt_keys_from_opaque(e->c, t->ids + q->first_id, sizeof(uint64_t), n, e->keys);
  if (rc) return skvt(err, len, "kvt_keys_from_opaque", rc);
  uint32_t prefix = 0;
  if ((rc = hit_prefix(e, n, &prefix, err, len)) != 0) return rc;
  so->plan.size = sizeof so->plan;
  rc = kvt_cost_plan(e->model, &e->hw, t->block_tokens, n_tokens, prefix, e->tiers, &so->plan);
  if (rc) return skvt(err, len, "kvt_cost_plan", rc);
  if (n == 0) return 0;
  if ((rc = take_pages(e, n, err, len)) != 0) return rc;
  uint32_t k = o->restore == KVT_BENCH_RESTORE_PLAN ? so->plan.restore_blocks
               : o->restore == KVT_BENCH_RESTORE_ALL ? prefix
                                                     : 0;
  if (k > prefix) k = prefix;
  uint32_t nb = 0;
  for (uint32_t i = 0; i < k; i++) {
    if (e->tiers[i] == KVT_TIER_DEVICE) continue;
    so->from_disk += e->tiers[i] == KVT_TIER_DISK;
    e->batch_keys[nb] = e->keys[i];
    e->batch_pages[nb++] = e->page_of[i];
  }
  if ((rc = batch(e, nb, 1, o->storage_no_promote ? 0 : KVT_GET_PROMOTE, err, len)) != 0) return rc;
  for (uint32_t i = 0, b = 0; i < n; i++) {
    uint32_t p = e->page_of[i];
    int kept = 0;
    if (i < k && e->tiers[i] == KVT_TIER_DEVICE) {
      so->reused++;
      kept = 1;
    } else if (i < k) {
      kept = e->results[b++] == 0;
      so->loaded += kept;
      so->failed += !kept;
    } else if (e->tiers[i] == KVT_TIER_DEVICE) {
      kept = 1; /* on a page but not restored: the engine keeps it anyway */
    }
    if (kept && i < k) {
      if (stamp_ok(e, p, &e->keys[i])) so->verified++;
      else so->corrupt++;
    }
    if (!kept) stamp(e, p, &e->keys[i]);
  }
  /* Last block first: ancestors end up more recent than their tails. */
  for (uint32_t i = n; i-- > 0;) {
    uint32_t p = e->page_of[i];
    e->pages[p].pinned = 0;
    if (e->pages[p].prev != NONE || e->lru_head == p) lru_unlink(e, p);
    lru_push_head(e, p);
  }
  /* The request's blocks kvtier holds become its most recent, as owner
   * mode's kvt_release makes them (those served by pages included). */
  if ((rc = kvt_touch(e->c, NULL, e->keys, n, KVT_KEYS_OPAQUE, NULL)) != 0) return skvt(err, len, "kvt_touch", rc);
  if (!e->offload_after) return 0;
  for (uint32_t i = 0; i < n; i++) {
    e->batch_keys[i] = e->keys[i];
    e->batch_pages[i] = e->page_of[i];
  }
  if ((rc = batch(e, n, 0, 0, err, len)) != 0) return rc;
  for (uint32_t i = 0; i < n; i++) page_drop(e, e->page_of[i]);
  return 0;
}

/* ---- the replay ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t k = (size_t)(p * (double)n + 0.999999);
  return v[(k < 1 ? 1 : k > n ? n : k) - 1];
}

static void account(kvt_bench_replay_result *r, const kvt_bench_trace *t, const kvt_bench_req *q, const sstep *so,
                    uint32_t counted) {
  r->blocks_total += counted;
  r->blocks_hit += so->plan.n_prefix;
  uint64_t tok_hit = (uint64_t)so->plan.n_prefix * t->block_tokens;
  r->tokens_total += q->input_tokens;
  r->tokens_hit += tok_hit < q->input_tokens ? tok_hit : q->input_tokens;
  r->hits_device += so->plan.n_device;
  r->hits_host += so->plan.n_host;
  r->hits_disk += so->plan.n_disk;
  r->blocks_restored += so->reused + so->loaded;
  r->blocks_reused += so->reused;
  r->blocks_loaded += so->loaded;
  r->blocks_from_disk += so->from_disk;
  r->blocks_load_failed += so->failed;
  r->blocks_recomputed += counted - so->reused - so->loaded;
  r->truncated_requests += so->n_keyed < counted;
  if (so->plan.decision <= KVT_DECIDE_SPLIT) r->decisions[so->plan.decision]++;
  r->payload_verified += so->verified;
  r->payload_corrupt += so->corrupt;
}

int kvt_bench_replay_storage(const kvt_bench_trace *t, const kvt_bench_replay_opts *o, const kvt_model_desc *m,
                             uint32_t max_keyed, uint32_t scale, kvt_bench_replay_result *r, char *err, size_t len) {
  sengine e;
  memset(&e, 0, sizeof e);
  double *ttft = malloc(t->n_reqs * sizeof *ttft), *ttft_rc = malloc(t->n_reqs * sizeof *ttft_rc);
  int rc = ttft && ttft_rc ? sengine_open(&e, t, o, m, max_keyed, scale, err, len) : serr(err, len, "out of memory");
  r->device_slots = e.n_pages;
  r->payload_scale = scale;
  r->payload_block_bytes = e.block_bytes;
  if (e.c) snprintf(r->disk_backend, sizeof r->disk_backend, "%s", kvt_disk_backend_name(e.c));
  snprintf(r->device_backend, sizeof r->device_backend, "engine-owned");
  double t0 = now_s(), sum = 0, sum_rc = 0;
  for (size_t i = 0; rc == 0 && i < t->n_reqs; i++) {
    const kvt_bench_req *q = &t->reqs[i];
    sstep so;
    if ((rc = sstep_run(&e, t, q, o, &so, err, len)) != 0) break;
    account(r, t, q, &so, kvt_bench_replay_keyed(t, q, o->whole_ids));
    kvt_plan none = {.size = sizeof none};
    if ((rc = kvt_cost_plan(m, &o->hw, t->block_tokens, so.plan.n_tokens, 0, NULL, &none)) != 0) {
      rc = skvt(err, len, "kvt_cost_plan", rc);
      break;
    }
    ttft_rc[i] = none.est_ttft_s;
    ttft[i] = o->restore == KVT_BENCH_RESTORE_PLAN  ? so.plan.est_ttft_s
              : o->restore == KVT_BENCH_RESTORE_ALL ? so.plan.est_restore_all_s
                                                    : none.est_ttft_s;
    sum += ttft[i];
    sum_rc += ttft_rc[i];
    if (o->progress && (i & 63) == 0) o->progress((double)i / (double)t->n_reqs);
  }
  if (rc == 0) {
    if (o->progress) o->progress(1.0);
    kvt_drain(e.c);
    r->wall_s = now_s() - t0;
    r->requests = t->n_reqs;
    r->st.size = sizeof r->st;
    kvt_get_stats(e.c, &r->st);
    r->ttft_mean_s = sum / (double)t->n_reqs;
    r->ttft_recompute_mean_s = sum_rc / (double)t->n_reqs;
    r->ttft_p50_s = pct(ttft, t->n_reqs, 0.5);
    r->ttft_p99_s = pct(ttft, t->n_reqs, 0.99);
    r->ttft_recompute_p50_s = pct(ttft_rc, t->n_reqs, 0.5);
    r->ttft_recompute_p99_s = pct(ttft_rc, t->n_reqs, 0.99);
  }
  sengine_close(&e);
  free(ttft);
  free(ttft_rc);
  return rc;
}
