/* tinyllm served through kvtier: see tl_engine.h. */
#include "tl_engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tl_engine {
  tl_model *m;
  const tl_config *cfg;
  tl_kv kv;
  kvt_cache *c;
  kvt_model_desc md;
  tl_throttle thr;
  size_t block_bytes;
  uint32_t max_blocks;
  kvt_key *keys;
  uint32_t *slots;
  uint32_t *prompt;
  float *logits;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
  double d = t - now_s();
  if (d <= 0) return;
  struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
  nanosleep(&ts, NULL);
}

void tl_conv_free(tl_conv *cv) {
  free(cv->tok);
  memset(cv, 0, sizeof *cv);
}

static int conv_reserve(tl_conv *cv, size_t n) {
  if (n <= cv->cap) return 0;
  size_t cap = cv->cap ? cv->cap : 256;
  while (cap < n) cap *= 2;
  uint32_t *t = realloc(cv->tok, cap * sizeof *t);
  if (!t) return -ENOMEM;
  cv->tok = t;
  cv->cap = cap;
  return 0;
}

static void model_desc(const tl_config *c, kvt_model_desc *md) {
  kvt_model_init(md);
  snprintf(md->name, sizeof md->name, "tinyllm-%.20s", c->name);
  md->num_layers = c->n_layers;
  md->hidden_size = c->dim;
  md->num_heads = c->n_heads;
  md->num_kv_heads = c->n_kv_heads;
  md->head_dim = c->head_dim;
  md->intermediate_size = c->ffn_dim;
  md->vocab_size = c->vocab;
  md->kv_dtype_bytes = sizeof(float);
}

kvt_cache *tl_engine_cache(tl_engine *e) { return e->c; }
const kvt_model_desc *tl_engine_model_desc(const tl_engine *e) { return &e->md; }

/* The planner's links: the throttle where one is set, else what kvtier
 * has calibrated from its own copies. Compute calibration carries over. */
static int anchor_cost_model(tl_engine *e) {
  kvt_hw_desc hw;
  int rc = kvt_get_calibrated_hw(e->c, &hw);
  if (rc) return rc;
  if (e->thr.host_bps > 0) hw.device_host = (kvt_link){e->thr.host_bps, e->thr.host_lat_s};
  if (e->thr.disk_bps > 0) hw.host_disk = (kvt_link){e->thr.disk_bps, e->thr.disk_lat_s};
  return kvt_set_cost_model(e->c, &e->md, &hw);
}

void tl_engine_set_throttle(tl_engine *e, const tl_throttle *t) {
  static const tl_throttle none;
  e->thr = t ? *t : none;
}

/* memcpy bandwidth of this machine over a buffer bigger than the caches. */
static double measure_copy_bps(void) {
  size_t n = (size_t)64 << 20;
  char *a = malloc(n), *b = malloc(n);
  double bps = 5e9;
  if (a && b) {
    memset(a, 1, n);
    memset(b, 2, n);
    double t0 = now_s();
    memcpy(b, a, n);
    __asm__ __volatile__("" : : "r"(a), "r"(b) : "memory"); /* keeps the copies */
    memcpy(a, b, n);
    __asm__ __volatile__("" : : "r"(a), "r"(b) : "memory");
    double t = now_s() - t0;
    if (t > 0) bps = 2.0 * (double)n / t;
  }
  free(a);
  free(b);
  return bps;
}

/* Runs `tokens` tokens in private slots (no keys) and returns the seconds. */
static int timed_private_prefill(tl_engine *e, uint32_t tokens, double *sec) {
  uint32_t bt = e->cfg->block_tokens, nb = (tokens + bt - 1) / bt;
  kvt_req req;
  int rc = kvt_acquire(e->c, NULL, NULL, 0, 0, nb, 0, &req, e->slots, NULL);
  if (rc < 0) return rc;
  for (uint32_t i = 0; i < tokens; i++) e->prompt[i] = (i * 2654435761u) % e->cfg->vocab;
  double t0 = now_s();
  rc = tl_forward(e->m, &e->kv, e->slots, e->prompt, 0, tokens, e->logits, NULL, NULL);
  *sec = now_s() - t0;
  kvt_release(e->c, req);
  return rc;
}

static int set_initial_cost_model(tl_engine *e, uint32_t warm) {
  double sec = 0;
  int rc = timed_private_prefill(e, warm, &sec); /* first touch of the weights */
  if (rc == 0) rc = timed_private_prefill(e, warm, &sec);
  if (rc) return rc;
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  hw.num_gpus = 1;
  hw.flops_per_gpu = kvt_cost_recompute_flops(&e->md, 0, warm, NULL) / sec;
  hw.mfu = 1.0;
  hw.device_host = (kvt_link){measure_copy_bps(), 20e-6};
  hw.host_disk = (kvt_link){1e9, 100e-6}; /* kvtier calibrates it from its spills and fetches */
  hw.overlap = 1;
  return kvt_set_cost_model(e->c, &e->md, &hw);
}

static int open_cache(tl_engine *e, const tl_engine_opts *o) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.block_tokens = e->cfg->block_tokens;
  cfg.model_fingerprint = e->md.name;
  cfg.dtype = KVT_DTYPE_F32;
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = o->host_blocks;
  cfg.disk_path = o->disk_path;
  cfg.disk_blocks = o->disk_path ? o->disk_blocks : 0;
  cfg.disk_reset = 1;
  if (cfg.max_job_blocks < e->max_blocks) cfg.max_job_blocks = e->max_blocks;
  int rc = kvt_open(&cfg, &e->c);
  if (rc) return rc;
  uint32_t L = e->cfg->n_layers;
  kvt_segment *seg = calloc(2 * (size_t)L, sizeof *seg);
  if (!seg) return -ENOMEM;
  size_t sb = tl_config_seg_bytes(e->cfg);
  for (uint32_t l = 0; l < L; l++) {
    seg[2 * l] = (kvt_segment){e->kv.k[l], sb, sb};
    seg[2 * l + 1] = (kvt_segment){e->kv.v[l], sb, sb};
  }
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = L;
  lay.segments_per_layer = 2;
  lay.num_slots = e->kv.n_slots;
  lay.segments = seg;
  rc = kvt_register_layout(e->c, &lay);
  free(seg);
  return rc;
}

int tl_engine_open(tl_model *m, const tl_engine_opts *o, tl_engine **out) {
  if (!m || !o || !out || o->dev_slots == 0) return -EINVAL;
  tl_engine *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->m = m;
  e->cfg = tl_model_config(m);
  e->thr = o->throttle;
  model_desc(e->cfg, &e->md);
  e->block_bytes = 2 * tl_config_seg_bytes(e->cfg) * e->cfg->n_layers;
  e->max_blocks = e->cfg->max_ctx / e->cfg->block_tokens + 2;
  e->keys = calloc(e->max_blocks, sizeof *e->keys);
  e->slots = calloc(e->max_blocks, sizeof *e->slots);
  e->prompt = calloc(e->cfg->max_ctx, sizeof *e->prompt);
  e->logits = calloc(e->cfg->vocab, sizeof *e->logits);
  int rc = !e->keys || !e->slots || !e->prompt || !e->logits ? -ENOMEM : 0;
  if (rc == 0) rc = tl_kv_create(e->cfg, o->dev_slots, &e->kv);
  if (rc == 0) rc = open_cache(e, o);
  uint32_t warm = o->warmup_tokens ? o->warmup_tokens : 128;
  if (warm > e->cfg->max_ctx) warm = e->cfg->max_ctx;
  if (rc == 0) rc = set_initial_cost_model(e, warm);
  if (rc) {
    tl_engine_close(e);
    return rc;
  }
  *out = e;
  return 0;
}

void tl_engine_close(tl_engine *e) {
  if (!e) return;
  kvt_close(e->c);
  tl_kv_free(&e->kv);
  free(e->keys);
  free(e->slots);
  free(e->prompt);
  free(e->logits);
  free(e);
}

/* ---- one turn ---- */

typedef struct load_wait {
  tl_engine *e;
  kvt_req req;
  int loading;
  double t_acq, disk_s, host_s, host_lat, waited;
} load_wait;

/* Before layer l reads the cache: the throttled link's deadline, then
 * kvtier's own copy of that layer. */
static int wait_layer(void *arg, uint32_t l) {
  load_wait *w = arg;
  if (!w->loading) return 0;
  double t0 = now_s();
  uint32_t L = w->e->cfg->n_layers;
  if (w->disk_s > 0 || w->host_s > 0)
    sleep_until(w->t_acq + w->disk_s + w->host_lat + w->host_s * (double)(l + 1) / L);
  int rc = kvt_request_wait_layer(w->e->c, w->req, l, NULL);
  w->waited += now_s() - t0;
  return rc < 0 ? rc : 0;
}

static void throttle_times(const tl_engine *e, const kvt_acquire_info *in, load_wait *w) {
  double host_bytes = (double)in->n_loading * (double)e->block_bytes;
  double disk_bytes = (double)in->n_from_disk * (double)e->block_bytes;
  if (e->thr.disk_bps > 0 && in->n_from_disk) w->disk_s = e->thr.disk_lat_s + disk_bytes / e->thr.disk_bps;
  if (e->thr.host_bps > 0 && in->n_loading) {
    w->host_lat = e->thr.host_lat_s;
    w->host_s = host_bytes / e->thr.host_bps;
  }
}

static uint32_t restore_for(const tl_engine *e, tl_policy pol, const kvt_plan *p, size_t n_tokens) {
  uint32_t bt = e->cfg->block_tokens, usable = p->n_prefix;
  if ((uint64_t)usable * bt >= n_tokens) usable = (uint32_t)((n_tokens - 1) / bt);
  if (pol == TL_POLICY_RESTORE) return usable;
  if (pol == TL_POLICY_RECOMPUTE) return 0;
  return p->restore_blocks;
}

/* Prefill of the prompt over what was restored; confirms the restore and
 * recomputes what failed to land. */
static int prefill(tl_engine *e, size_t n, load_wait *w, tl_turn *rep, float *logits) {
  uint32_t bt = e->cfg->block_tokens;
  uint32_t from = rep->info.n_restore * bt;
  double t0 = now_s();
  int rc = tl_forward(e->m, &e->kv, e->slots, e->prompt, from, (uint32_t)n, logits, wait_layer, w);
  uint32_t ready = rep->info.n_restore;
  if (rc == 0 && w->loading) {
    double t1 = now_s();
    rc = kvt_request_wait(e->c, w->req, -1, &ready);
    w->waited += now_s() - t1;
  }
  if (rc == 0 && ready < rep->info.n_restore) { /* a block failed to load: recompute from there */
    from = ready * bt;
    rc = tl_forward(e->m, &e->kv, e->slots, e->prompt, from, (uint32_t)n, logits, NULL, NULL);
  }
  rep->n_ready = ready;
  rep->recomputed = n - from;
  rep->wait_s = w->waited;
  rep->compute_s = now_s() - t0 - w->waited;
  return rc;
}

static int decode(tl_engine *e, size_t n, uint32_t n_gen, uint32_t first, tl_turn *rep) {
  uint32_t tok = first;
  rep->n_generated = n_gen ? 1 : 0;
  for (uint32_t i = 1; i < n_gen; i++) {
    e->prompt[n + i - 1] = tok;
    int rc = tl_forward(e->m, &e->kv, e->slots, e->prompt, (uint32_t)(n + i - 1), (uint32_t)(n + i), e->logits,
                        NULL, NULL);
    if (rc) return rc;
    tok = tl_argmax(e->logits, e->cfg->vocab);
    rep->n_generated++;
  }
  if (n_gen) e->prompt[n + n_gen - 1] = tok;
  return 0;
}

static int plan_turn(tl_engine *e, size_t n, tl_turn *rep) {
  size_t nk = 0;
  int rc = kvt_hash_tokens(e->c, NULL, e->prompt, n, e->keys, e->max_blocks, &nk);
  if (rc == 0) rc = anchor_cost_model(e);
  rep->plan.size = sizeof rep->plan;
  if (rc == 0) rc = kvt_plan_request(e->c, e->keys, nk, n, &rep->plan);
  rep->n_blocks = (uint32_t)nk;
  return rc;
}

int tl_engine_turn(tl_engine *e, tl_conv *cv, const uint32_t *msg, size_t n_msg, uint32_t n_gen, tl_policy pol,
                   int append, float *logits, tl_turn *rep) {
  if (!e || !cv || !rep || (n_msg && !msg)) return -EINVAL;
  size_t n = cv->n + n_msg, bt = e->cfg->block_tokens;
  if (n == 0 || n + n_gen > e->cfg->max_ctx) return -EINVAL;
  memset(rep, 0, sizeof *rep);
  if (cv->n) memcpy(e->prompt, cv->tok, cv->n * sizeof *cv->tok);
  if (n_msg) memcpy(e->prompt + cv->n, msg, n_msg * sizeof *msg);
  rep->ctx_tokens = n;
  double t0 = now_s();
  int rc = plan_turn(e, n, rep);
  if (rc) return rc;
  rep->restore_asked = restore_for(e, pol, &rep->plan, n);
  size_t extra = (n + n_gen + bt - 1) / bt - rep->n_blocks;
  load_wait w = {.e = e};
  rep->info.size = sizeof rep->info;
  rc = kvt_acquire(e->c, e->keys, e->prompt, rep->n_blocks, rep->restore_asked, extra, 0, &w.req, e->slots,
                   &rep->info);
  if (rc < 0) return rc;
  w.loading = rc == 1;
  w.t_acq = now_s();
  throttle_times(e, &rep->info, &w);
  float *lg = logits ? logits : e->logits;
  rc = prefill(e, n, &w, rep, lg);
  if (rc == 0) {
    rep->first_token = tl_argmax(lg, e->cfg->vocab);
    rep->ttft_s = now_s() - t0;
    if (rep->recomputed) kvt_report_prefill(e->c, n - rep->recomputed, n, rep->compute_s);
    rc = kvt_commit(e->c, w.req, rep->n_blocks, NULL);
  }
  if (rc == 0) rc = decode(e, n, n_gen, rep->first_token, rep);
  int rrc = kvt_release(e->c, w.req);
  if (rc == 0) rc = rrc;
  if (rc == 0 && append) {
    rc = conv_reserve(cv, n + n_gen);
    if (rc == 0) {
      memcpy(cv->tok, e->prompt, (n + n_gen) * sizeof *cv->tok);
      cv->n = n + n_gen;
    }
  }
  return rc;
}

int tl_engine_offload(tl_engine *e, const tl_conv *cv) {
  size_t nk = 0;
  int rc = kvt_hash_tokens(e->c, NULL, cv->tok, cv->n, e->keys, e->max_blocks, &nk);
  if (rc || nk == 0) return rc;
  kvt_job job;
  rc = kvt_store(e->c, e->keys, nk, KVT_STORE_EVICT, &job);
  if (rc == 1) {
    rc = kvt_job_wait(e->c, job, -1);
    int rrc = kvt_job_release(e->c, job);
    if (rc == 0) rc = rrc;
  }
  return rc;
}
