/* Trace replay through the real engine; the rules are in replay_core.h. */
#include "replay_core.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void kvt_bench_replay_opts_init(kvt_bench_replay_opts *o) {
  memset(o, 0, sizeof *o);
  o->model = "llama3-8b";
  o->payload_ram_max = 2ull << 30;
  o->payload_disk_max = 8ull << 30;
  o->device_only_baseline = 1;
  kvt_hw_init(&o->hw);
}

uint32_t kvt_bench_replay_keyed(const kvt_bench_trace *t, const kvt_bench_req *q, int whole_ids) {
  if (whole_ids) return q->n_ids;
  uint64_t full = q->input_tokens / t->block_tokens;
  return full < q->n_ids ? (uint32_t)full : q->n_ids;
}

__attribute__((format(printf, 3, 4))) static int set_err(char *err, size_t len, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return -EINVAL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- one engine instance ---- */

typedef struct replay_engine {
  kvt_cache *c;
  kvt_key *keys;
  uint32_t *slots;
  uint8_t *tiers;
  uint64_t dev_slots, host_blocks;
  /* Scaled payload: the engine's blocks are not the model's, which
   * kvt_set_cost_model refuses; plans then come from kvt_lookup and
   * kvt_cost_plan with the full-size model (no online calibration). */
  const kvt_model_desc *plan_model;
  kvt_hw_desc hw;
  int offload_after; /* device capacity 0: offload each request's blocks */
  /* Real payload: the engine's KV pool in RAM, one contiguous block per slot. */
  unsigned char *pool;
  size_t block_bytes, seg_bytes;
  uint32_t n_seg;
  char tmpdir[256], disk_file[320];
} replay_engine;

typedef struct engine_args {
  uint64_t dev_slots, host_blocks, disk_blocks;
  uint32_t block_tokens, max_keyed;
  const kvt_model_desc *model;
  const char *fingerprint;
  int real;
  uint32_t scale;
  const char *disk_path;
  const kvt_hw_desc *hw;
  const char *remote_url, *remote_key_prefix;
  int write_through;
} engine_args;

static int fail_kvt(char *err, size_t len, const char *what, int rc) {
  set_err(err, len, "%s: %s", what, kvt_strerror(rc));
  return rc < 0 ? rc : -EIO;
}

static void engine_close(replay_engine *e) {
  kvt_close(e->c);
  free(e->keys);
  free(e->slots);
  free(e->tiers);
  free(e->pool);
  if (e->tmpdir[0]) {
    unlink(e->disk_file);
    rmdir(e->tmpdir);
  }
  memset(e, 0, sizeof *e);
}

static int make_disk_file(replay_engine *e, const char *path, char *err, size_t len) {
  if (path) {
    snprintf(e->disk_file, sizeof e->disk_file, "%s", path);
    return 0;
  }
  const char *base = getenv("TMPDIR");
  snprintf(e->tmpdir, sizeof e->tmpdir, "%s/kvtier-replay-XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(e->tmpdir)) {
    int rc = -errno;
    e->tmpdir[0] = '\0';
    set_err(err, len, "cannot create a temporary directory: %s", strerror(-rc));
    return rc;
  }
  snprintf(e->disk_file, sizeof e->disk_file, "%s/disk.kvt", e->tmpdir);
  return 0;
}

static int register_layout(replay_engine *e, const engine_args *a, char *err, size_t len) {
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_slots = (uint32_t)e->dev_slots;
  if (!a->real) {
    lay.num_layers = a->model->num_layers;
    lay.flags = KVT_LAYOUT_METADATA_ONLY;
    int rc = kvt_register_layout(e->c, &lay);
    return rc ? fail_kvt(err, len, "kvt_register_layout", rc) : 0;
  }
  uint32_t spl = a->model->mla_latent_dim ? 1 : 2;
  uint64_t per_tok = kvt_model_kv_bytes_per_token(a->model);
  e->n_seg = a->model->num_layers * spl;
  e->seg_bytes = (size_t)(per_tok * a->block_tokens / e->n_seg / a->scale);
  e->block_bytes = e->seg_bytes * e->n_seg;
  if (e->seg_bytes < 16) return set_err(err, len, "payload scale %u leaves segments under 16 bytes", a->scale);
  if (e->block_bytes && e->dev_slots > SIZE_MAX / e->block_bytes) return set_err(err, len, "device pool too large");
  e->pool = malloc(e->dev_slots * e->block_bytes);
  kvt_segment *segs = calloc(e->n_seg, sizeof *segs);
  if (!e->pool || !segs) {
    free(segs);
    return set_err(err, len, "out of memory for a %zu-byte device pool", (size_t)(e->dev_slots * e->block_bytes));
  }
  for (uint32_t i = 0; i < e->n_seg; i++) {
    segs[i].base = e->pool + (size_t)i * e->seg_bytes;
    segs[i].stride = e->block_bytes;
    segs[i].bytes = e->seg_bytes;
  }
  lay.num_layers = a->model->num_layers;
  lay.segments_per_layer = spl;
  lay.segments = segs;
  int rc = kvt_register_layout(e->c, &lay);
  free(segs);
  return rc ? fail_kvt(err, len, "kvt_register_layout", rc) : 0;
}

static int engine_open(replay_engine *e, const engine_args *a, char *err, size_t len) {
  memset(e, 0, sizeof *e);
  e->dev_slots = a->dev_slots ? a->dev_slots : (a->max_keyed ? a->max_keyed : 1);
  e->offload_after = a->dev_slots == 0;
  if (e->dev_slots >= UINT32_MAX) return set_err(err, len, "device tier too large");
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.block_tokens = a->block_tokens;
  cfg.model_fingerprint = a->fingerprint;
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = a->host_blocks;
  cfg.disk_blocks = a->disk_blocks;
  cfg.disk_reset = 1;
  cfg.max_jobs = 64;
  cfg.max_job_blocks = a->max_keyed + 1 > 1024 ? a->max_keyed + 1 : 1024;
  cfg.remote_url = a->real ? a->remote_url : NULL;
  cfg.remote_key_prefix = a->remote_key_prefix;
  cfg.write_policy = a->write_through ? KVT_WRITE_THROUGH : KVT_WRITE_BACK;
  int rc = 0;
  if (a->real && a->disk_blocks) {
    if ((rc = make_disk_file(e, a->disk_path, err, len)) != 0) return rc;
    cfg.disk_path = e->disk_file;
  }
  if ((rc = kvt_open(&cfg, &e->c)) != 0) return fail_kvt(err, len, "kvt_open", rc);
  if ((rc = register_layout(e, a, err, len)) != 0) return rc;
  e->hw = *a->hw;
  if (a->real && a->scale > 1) e->plan_model = a->model;
  else if ((rc = kvt_set_cost_model(e->c, a->model, &e->hw)) != 0)
    return fail_kvt(err, len, "kvt_set_cost_model", rc);
  e->keys = calloc(a->max_keyed + 1, sizeof *e->keys);
  e->slots = calloc(a->max_keyed + 1, sizeof *e->slots);
  e->tiers = calloc(a->max_keyed + 1, 1);
  e->host_blocks = a->host_blocks;
  if (!e->keys || !e->slots || !e->tiers) return set_err(err, len, "out of memory");
  return 0;
}

/* ---- one request ---- */

typedef struct step_out {
  kvt_plan plan;
  kvt_acquire_info info;
  uint32_t n_keyed, n_ready;
  uint64_t verified, corrupt;
  int clipped;
} step_out;

/* The stamp a "computed" segment carries: its block key and segment index. */
static void stamp(replay_engine *e, uint32_t slot, const kvt_key *k) {
  for (uint32_t s = 0; s < e->n_seg; s++) {
    uint64_t w[2] = {k->lo, k->hi ^ s};
    memcpy(e->pool + (size_t)slot * e->block_bytes + (size_t)s * e->seg_bytes, w, sizeof w);
  }
}

static int stamp_ok(replay_engine *e, uint32_t slot, const kvt_key *k) {
  for (uint32_t s = 0; s < e->n_seg; s++) {
    uint64_t w[2] = {k->lo, k->hi ^ s};
    if (memcmp(e->pool + (size_t)slot * e->block_bytes + (size_t)s * e->seg_bytes, w, sizeof w)) return 0;
  }
  return 1;
}

static int offload(replay_engine *e, uint32_t n, char *err, size_t len) {
  kvt_job job = 0;
  int rc = kvt_store(e->c, e->keys, n, KVT_STORE_EVICT, &job);
  if (rc < 0) return fail_kvt(err, len, "kvt_store", rc);
  if (rc == 1) {
    rc = kvt_job_wait(e->c, job, -1);
    kvt_job_release(e->c, job);
    if (rc < 0) return fail_kvt(err, len, "kvt_job_wait (offload)", rc);
  }
  return 0;
}

/* The longest restore whose disk blocks fit the host tier. */
static size_t clip_to_host(replay_engine *e, uint32_t n, size_t restore) {
  kvt_lookup_result lr = {.size = sizeof lr};
  if (kvt_lookup(e->c, e->keys, n, &lr, e->tiers) != 0) return 0;
  size_t k = 0;
  uint64_t disk = 0;
  for (; k < restore && k < lr.n_prefix; k++) {
    disk += e->tiers[k] == KVT_TIER_DISK || e->tiers[k] == KVT_TIER_REMOTE; /* both stage through host slots */
    if (disk > e->host_blocks) break;
  }
  return k;
}

static int step(replay_engine *e, const kvt_bench_trace *t, const kvt_bench_req *q, const kvt_bench_replay_opts *o,
                kvt_bench_restore mode, step_out *so, char *err, size_t len) {
  memset(so, 0, sizeof *so);
  uint32_t n = kvt_bench_replay_keyed(t, q, o->whole_ids);
  if (n > e->dev_slots) n = (uint32_t)e->dev_slots;
  uint64_t bt = t->block_tokens, n_tokens = q->input_tokens;
  if (o->whole_ids && n_tokens < (uint64_t)q->n_ids * bt) n_tokens = (uint64_t)q->n_ids * bt;
  so->n_keyed = n;
  int rc = kvt_keys_from_opaque(e->c, t->ids + q->first_id, sizeof(uint64_t), n, e->keys);
  if (rc) return fail_kvt(err, len, "kvt_keys_from_opaque", rc);
  so->plan.size = sizeof so->plan;
  if (e->plan_model) {
    kvt_lookup_result lr = {.size = sizeof lr};
    if ((rc = kvt_lookup(e->c, e->keys, n, &lr, e->tiers)) != 0) return fail_kvt(err, len, "kvt_lookup", rc);
    rc = kvt_cost_plan(e->plan_model, &e->hw, t->block_tokens, n_tokens, lr.n_prefix, e->tiers, &so->plan);
    if (rc) return fail_kvt(err, len, "kvt_cost_plan", rc);
  } else if ((rc = kvt_plan_request(e->c, e->keys, n, n_tokens, &so->plan)) != 0) {
    return fail_kvt(err, len, "kvt_plan_request", rc);
  }
  if (n == 0) return 0;
  size_t restore = mode == KVT_BENCH_RESTORE_PLAN ? so->plan.restore_blocks : mode == KVT_BENCH_RESTORE_ALL ? n : 0;
  kvt_req req;
  so->info.size = sizeof so->info;
  rc = kvt_acquire(e->c, e->keys, NULL, n, restore, 0, 0, &req, e->slots, &so->info);
  /* Disk hits are staged through host slots, so a request cannot restore
   * more disk blocks than the host tier holds; kvt_acquire then fails
   * rather than restoring less. Restore the longest prefix that fits. */
  if (rc == KVT_ENOSPACE && restore) {
    size_t k = clip_to_host(e, n, restore);
    if (k < restore) {
      so->clipped = 1;
      rc = kvt_acquire(e->c, e->keys, NULL, n, k, 0, 0, &req, e->slots, &so->info);
    }
  }
  if (rc < 0) return fail_kvt(err, len, "kvt_acquire", rc);
  so->n_ready = so->info.n_restore;
  if (rc == 1 && (rc = kvt_request_wait(e->c, req, -1, &so->n_ready)) != 0) {
    kvt_release(e->c, req);
    return fail_kvt(err, len, "kvt_request_wait", rc);
  }
  if (e->pool) {
    for (uint32_t i = 0; i < so->n_ready; i++) {
      if (stamp_ok(e, e->slots[i], &e->keys[i])) so->verified++;
      else so->corrupt++;
    }
    for (uint32_t i = so->n_ready; i < n; i++) stamp(e, e->slots[i], &e->keys[i]);
  }
  rc = kvt_commit(e->c, req, n, NULL);
  int rrc = kvt_release(e->c, req);
  if (rc) return fail_kvt(err, len, "kvt_commit", rc);
  if (rrc) return fail_kvt(err, len, "kvt_release", rrc);
  return e->offload_after ? offload(e, n, err, len) : 0;
}

/* ---- the replay ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of v[0..n) (sorts v). */
static double percentile(double *v, size_t n, double p) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t k = (size_t)(p * (double)n + 0.999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

static double mean(const double *v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += v[i];
  return n ? s / (double)n : 0;
}

/* Smallest power of two that fits the pools into the RAM and disk budgets. */
static uint32_t auto_scale(const kvt_bench_replay_opts *o, uint64_t dev_slots, uint64_t block_bytes) {
  uint32_t s = 1;
  while (s < (1u << 20)) {
    uint64_t b = block_bytes / s;
    if ((dev_slots + o->host_blocks) * b <= o->payload_ram_max && o->disk_blocks * b <= o->payload_disk_max) break;
    s *= 2;
  }
  return s;
}

typedef struct replay_state {
  replay_engine main, base;
  int have_base;
  double *ttft, *ttft_rc, *ttft_dev;
  size_t n_run; /* requests this node ran (all of them with one node) */
} replay_state;

static void account(kvt_bench_replay_result *r, const kvt_bench_trace *t, const kvt_bench_req *q,
                    const step_out *so, uint32_t counted) {
  uint64_t bt = t->block_tokens;
  r->blocks_total += counted;
  r->blocks_hit += so->plan.n_prefix;
  uint64_t tok_total = q->input_tokens, tok_hit = (uint64_t)so->plan.n_prefix * bt;
  r->tokens_total += tok_total;
  r->tokens_hit += tok_hit < tok_total ? tok_hit : tok_total;
  r->hits_device += so->plan.n_device;
  r->hits_host += so->plan.n_host;
  r->hits_disk += so->plan.n_disk;
  r->hits_remote += so->plan.n_remote;
  r->blocks_from_remote += so->info.n_from_remote;
  r->blocks_restored += so->n_ready;
  r->blocks_reused += so->info.n_device_hits;
  r->blocks_loaded += so->n_ready > so->info.n_device_hits ? so->n_ready - so->info.n_device_hits : 0;
  r->blocks_from_disk += so->info.n_from_disk;
  r->blocks_load_failed += so->info.n_restore - so->n_ready;
  r->blocks_recomputed += counted - so->n_ready;
  if (so->plan.decision <= KVT_DECIDE_SPLIT) r->decisions[so->plan.decision]++;
  r->payload_verified += so->verified;
  r->payload_corrupt += so->corrupt;
  r->restores_clipped += so->clipped;
}

static int run_loop(replay_state *s, const kvt_bench_trace *t, const kvt_bench_replay_opts *o,
                    const kvt_model_desc *m, kvt_bench_replay_result *r, char *err, size_t len) {
  step_out so, sb;
  s->n_run = 0;
  for (size_t i = 0; i < t->n_reqs; i++) {
    if (o->nodes > 1 && i % o->nodes != o->node) continue; /* another node's request */
    const kvt_bench_req *q = &t->reqs[i];
    size_t k = s->n_run++;
    int rc = step(&s->main, t, q, o, o->restore, &so, err, len);
    if (rc) return rc;
    uint32_t counted = kvt_bench_replay_keyed(t, q, o->whole_ids);
    r->truncated_requests += so.n_keyed < counted;
    account(r, t, q, &so, counted);
    kvt_plan none = {.size = sizeof none};
    rc = kvt_cost_plan(m, &o->hw, t->block_tokens, so.plan.n_tokens, 0, NULL, &none);
    if (rc) return fail_kvt(err, len, "kvt_cost_plan", rc);
    s->ttft_rc[k] = none.est_ttft_s;
    s->ttft[k] = o->restore == KVT_BENCH_RESTORE_PLAN ? so.plan.est_ttft_s
                 : o->restore == KVT_BENCH_RESTORE_ALL ? so.plan.est_restore_all_s
                                                       : none.est_ttft_s;
    s->ttft_dev[k] = none.est_ttft_s;
    if (s->have_base) {
      if ((rc = step(&s->base, t, q, o, KVT_BENCH_RESTORE_PLAN, &sb, err, len)) != 0) return rc;
      s->ttft_dev[k] = sb.plan.est_ttft_s;
      r->device_only_blocks_hit += sb.plan.n_prefix;
    }
    if (o->progress && (i & 63) == 0) o->progress((double)i / (double)t->n_reqs);
  }
  if (o->progress) o->progress(1.0);
  return 0;
}

static int open_engines(replay_state *s, const kvt_bench_trace *t, const kvt_bench_replay_opts *o,
                        const kvt_model_desc *m, kvt_bench_replay_result *r, char *err, size_t len) {
  uint32_t max_keyed = 0;
  for (size_t i = 0; i < t->n_reqs; i++) {
    uint32_t k = kvt_bench_replay_keyed(t, &t->reqs[i], o->whole_ids);
    if (k > max_keyed) max_keyed = k;
  }
  if (o->device_blocks && max_keyed > o->device_blocks) max_keyed = (uint32_t)o->device_blocks;
  if (!o->device_blocks && !o->host_blocks)
    return set_err(err, len, "device capacity 0 (device holds only the running request) needs a host tier");
  if (o->disk_blocks && !o->host_blocks)
    return set_err(err, len, "a disk tier needs a host tier (device blocks reach disk through the host)");
  engine_args a = {.dev_slots = o->device_blocks, .host_blocks = o->host_blocks, .disk_blocks = o->disk_blocks,
                   .block_tokens = t->block_tokens, .max_keyed = max_keyed, .model = m,
                   .fingerprint = m->name, .real = o->payload_real, .scale = 1, .disk_path = o->disk_path, .hw = &o->hw,
                   .remote_url = o->remote_url, .remote_key_prefix = o->remote_key_prefix,
                   .write_through = o->write_through};
  if (o->remote_url && !o->payload_real) return set_err(err, len, "--remote moves real bytes: it needs --payload real");
  if (a.real) {
    uint64_t dev = o->device_blocks ? o->device_blocks : (max_keyed ? max_keyed : 1);
    a.scale = o->payload_scale ? o->payload_scale : auto_scale(o, dev, r->model_block_bytes);
  }
  int rc = engine_open(&s->main, &a, err, len);
  if (rc) return rc;
  r->device_slots = s->main.dev_slots;
  r->payload_scale = a.real ? a.scale : 0;
  r->payload_block_bytes = s->main.block_bytes;
  snprintf(r->device_backend, sizeof r->device_backend, "%s", kvt_device_backend_name(s->main.c));
  snprintf(r->disk_backend, sizeof r->disk_backend, "%s", kvt_disk_backend_name(s->main.c));
  if (!o->device_only_baseline || !o->device_blocks) return 0;
  engine_args b = a;
  b.host_blocks = b.disk_blocks = 0;
  b.real = 0;
  b.remote_url = NULL;
  b.write_through = 0;
  s->have_base = 1;
  return engine_open(&s->base, &b, err, len);
}

/* Storage mode: the same capacities and payload scale rules as owner mode. */
static int replay_storage(const kvt_bench_trace *t, const kvt_bench_replay_opts *o, const kvt_model_desc *m,
                          kvt_bench_replay_result *r, char *err, size_t len) {
  uint32_t max_keyed = 0;
  for (size_t i = 0; i < t->n_reqs; i++) {
    uint32_t k = kvt_bench_replay_keyed(t, &t->reqs[i], o->whole_ids);
    if (k > max_keyed) max_keyed = k;
  }
  if (o->device_blocks && max_keyed > o->device_blocks) max_keyed = (uint32_t)o->device_blocks;
  if (!o->host_blocks && !o->disk_blocks) return set_err(err, len, "storage mode needs a host or a disk tier");
  if (o->metrics_out) return set_err(err, len, "--metrics-out is for owner mode");
  uint64_t dev = o->device_blocks ? o->device_blocks : (max_keyed ? max_keyed : 1);
  uint32_t scale = o->payload_scale ? o->payload_scale : auto_scale(o, dev, r->model_block_bytes);
  return kvt_bench_replay_storage(t, o, m, max_keyed, scale, r, err, len);
}

/* The engine's metrics exposition into path (JSON for *.json). */
static int write_metrics(kvt_cache *c, const char *path, char *err, size_t errlen) {
  size_t n = strlen(path);
  int fmt = n >= 5 && !strcmp(path + n - 5, ".json") ? KVT_METRICS_JSON : KVT_METRICS_PROMETHEUS;
  size_t len = 0;
  kvt_metrics_write(c, fmt, NULL, &len);
  size_t cap = len + 4096; /* counters may grow a digit between the calls */
  char *buf = malloc(cap);
  int rc = buf ? kvt_metrics_write(c, fmt, buf, &cap) : -ENOMEM;
  FILE *f = rc == 0 ? fopen(path, "w") : NULL;
  if (rc == 0 && !f) rc = -errno;
  if (f && (fputs(buf, f) < 0 || fclose(f) != 0)) rc = -EIO;
  free(buf);
  return rc ? set_err(err, errlen, "--metrics-out %s: %s", path, kvt_strerror(rc)) : 0;
}

int kvt_bench_replay_run(const kvt_bench_trace *t, const kvt_bench_replay_opts *o, kvt_bench_replay_result *r,
                         char *err, size_t errlen) {
  if (!t || !o || !r || !t->n_reqs || !t->block_tokens) return set_err(err, errlen, "empty trace");
  memset(r, 0, sizeof *r);
  kvt_model_desc m;
  if (kvt_model_preset(o->model ? o->model : "llama3-8b", &m) != 0)
    return set_err(err, errlen, "unknown model '%s' (kvtier-bench cost --model list)", o->model);
  r->model_block_bytes = kvt_model_kv_bytes_per_token(&m) * t->block_tokens;
  if (o->storage_mode) return replay_storage(t, o, &m, r, err, errlen);
  replay_state s;
  memset(&s, 0, sizeof s);
  s.ttft = malloc(t->n_reqs * sizeof *s.ttft);
  s.ttft_rc = malloc(t->n_reqs * sizeof *s.ttft_rc);
  s.ttft_dev = malloc(t->n_reqs * sizeof *s.ttft_dev);
  int rc = s.ttft && s.ttft_rc && s.ttft_dev ? 0 : set_err(err, errlen, "out of memory");
  if (rc == 0) rc = open_engines(&s, t, o, &m, r, err, errlen);
  double t0 = now_s();
  if (rc == 0) rc = run_loop(&s, t, o, &m, r, err, errlen);
  if (rc == 0) {
    kvt_drain(s.main.c);
    r->wall_s = now_s() - t0;
    r->requests = s.n_run;
    r->st.size = sizeof r->st;
    kvt_get_stats(s.main.c, &r->st);
    size_t n = s.n_run;
    r->ttft_mean_s = mean(s.ttft, n);
    r->ttft_recompute_mean_s = mean(s.ttft_rc, n);
    r->ttft_device_only_mean_s = mean(s.ttft_dev, n);
    r->ttft_p50_s = percentile(s.ttft, n, 0.5);
    r->ttft_p99_s = percentile(s.ttft, n, 0.99);
    r->ttft_recompute_p50_s = percentile(s.ttft_rc, n, 0.5);
    r->ttft_recompute_p99_s = percentile(s.ttft_rc, n, 0.99);
    r->ttft_device_only_p50_s = percentile(s.ttft_dev, n, 0.5);
    r->ttft_device_only_p99_s = percentile(s.ttft_dev, n, 0.99);
    if (o->metrics_out) rc = write_metrics(s.main.c, o->metrics_out, err, errlen);
  }
  engine_close(&s.main);
  engine_close(&s.base);
  free(s.ttft);
  free(s.ttft_rc);
  free(s.ttft_dev);
  return rc;
}

int kvt_bench_restore_option(const char *cmd, const char *v, int allow_none, kvt_bench_restore *out) {
  if (!strcmp(v, "plan")) *out = KVT_BENCH_RESTORE_PLAN;
  else if (!strcmp(v, "all")) *out = KVT_BENCH_RESTORE_ALL;
  else if (allow_none && !strcmp(v, "none")) *out = KVT_BENCH_RESTORE_NONE;
  else {
    fprintf(stderr, "kvtier-bench %s: --restore '%s': expected %s\n", cmd, v, allow_none ? "plan, all or none" : "plan or all");
    return -1;
  }
  return 0;
}
