/* Lifecycle (open, layout registration, close), keys, stats, cost model. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "core/hash.h"
#include "engine/engine.h"
#include "engine/storage.h"
#include "store/record.h"
#include "util/abi.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/fork.h"
#include "util/log.h"

/* Bookkeeping caps: far above any real deployment, low enough that the
 * tables they size cannot overflow 32-bit indices or exhaust memory by typo. */
#define MAX_REQUESTS (1u << 20)
#define MAX_QUEUE_DEPTH 4096u
#define MAX_BLOCK_BYTES ((size_t)1 << 30)
#define MAX_SEGMENT_SPAN (UINT64_C(1) << 56)

void kvt_config_init(kvt_config *cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->size = sizeof *cfg;
  cfg->block_tokens = 16;
  cfg->dtype = KVT_DTYPE_BF16;
  cfg->tp_size = 1;
  cfg->device = KVT_DEVICE_AUTO;
  cfg->copy_threads = 0; /* one per available core */
  cfg->disk_queue_depth = 0; /* kvt__disk_auto_depth: 12-16 MiB of records */
  cfg->max_requests = 1024;
  cfg->max_jobs = 256;
  cfg->max_job_blocks = 8192;
  cfg->log_level = KVT_LOG_WARN;
}

void kvt_layout_init(kvt_layout *layout) {
  if (!layout) return;
  memset(layout, 0, sizeof *layout);
  layout->size = sizeof *layout;
  layout->segments_per_layer = 2;
}

/* NULL, or what is wrong with the config, in its fields' words (kvt_open
 * logs it with its -EINVAL: a refused open has no cache to ask). */
static const char *config_bad(const kvt_config *cfg) {
  uint32_t bt = cfg->block_tokens;
  if (bt < 16 || bt > 1024 || (bt & (bt - 1))) return "block_tokens must be a power of two from 16 to 1024";
  if (!cfg->model_fingerprint || !cfg->model_fingerprint[0]) return "model_fingerprint is required";
  if (cfg->tp_size == 0 || cfg->tp_rank >= cfg->tp_size) return "tp_rank must be under tp_size (at least 1)";
  if (cfg->max_requests == 0 || cfg->max_jobs == 0 || cfg->max_job_blocks == 0)
    return "max_requests, max_jobs and max_job_blocks must be at least 1";
  if (cfg->max_requests > MAX_REQUESTS) return "max_requests is at most 2^20";
  if (cfg->device < KVT_DEVICE_AUTO || cfg->device > KVT_DEVICE_CUDA) return "device is not a kvt_device";
  if (cfg->disk_backend < KVT_DISK_AUTO || cfg->disk_backend > KVT_DISK_THREADS)
    return "disk_backend is not a kvt_disk_backend";
  if (cfg->disk_path && !cfg->disk_blocks) return "disk_path needs disk_blocks";
  if (cfg->disk_queue_depth > MAX_QUEUE_DEPTH) return "disk_queue_depth is at most 4096 (0: the default)";
  if (cfg->disk_blocks > UINT32_MAX - 1 || cfg->host_blocks > UINT32_MAX - 1)
    return "disk_blocks and host_blocks are at most 2^32 - 2";
  if (cfg->log_level < KVT_LOG_NONE || cfg->log_level > KVT_LOG_INFO) return "log_level is not a kvt_log_level";
  if (cfg->remote_url && (!cfg->remote_url[0] || cfg->host_blocks == 0)) /* remote blocks stage through the host */
    return "remote_url needs host_blocks (remote blocks stage through the host tier) and may not be empty";
  if (cfg->remote_conns_per_node > 64) return "remote_conns_per_node is at most 64";
  return NULL;
}

/* The password leaves memory with the cache. */
static void wipe_free(char *s) {
  if (!s) return;
  volatile char *v = s;
  while (*v) *v++ = 0;
  free(s);
}

/* Test hook: KVT_FAULT_ALLOC makes the allocation numbered `what` fail. */
static void *alloc_or_fault(int what, void *p) {
  if (p && kvt__fault_check(KVT_FAULT_ALLOC, what)) {
    free(p);
    return NULL;
  }
  return p;
}

static char *dup_or_fault(int what, const char *s) { return s ? alloc_or_fault(what, strdup(s)) : NULL; }

int kvt_open(const kvt_config *user, kvt_cache **out) {
  if (!user || !out) return -EINVAL;
  *out = NULL;
  kvt_config cfg_v;
  kvt_config_init(&cfg_v);
  int rc = kvt__struct_in(&cfg_v, sizeof cfg_v, user, user->size, KVT_CONFIG_SIZE_V1);
  if (rc) return rc;
  const kvt_config *cfg = &cfg_v;
  const char *bad = config_bad(cfg);
  if (bad) {
    int ok_level = cfg->log_level >= KVT_LOG_NONE && cfg->log_level <= KVT_LOG_INFO;
    kvt__log_sink sink = {cfg->log_fn, cfg->log_ctx, ok_level ? cfg->log_level : KVT_LOG_WARN};
    kvt__log_to(&sink, KVT_LOG_ERROR, "kvt_open: %s", bad);
    return -EINVAL;
  }
  if (cfg->device == KVT_DEVICE_CUDA && !kvt_dev_backend_cuda()) return KVT_ENODEV;
  kvt__fork_watch();
  kvt_cache *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  /* The lock first: kvt_close destroys it on every path below. */
  pthread_mutex_init(&c->lock, NULL);
  kvt__cond_init_monotonic(&c->cond);
  c->fork_gen = kvt__fork_gen();
  c->cfg = *cfg;
  c->model_fp = dup_or_fault(KVT_ALLOC_OPEN_FINGERPRINT, cfg->model_fingerprint);
  c->disk_path = dup_or_fault(KVT_ALLOC_OPEN_DISK_PATH, cfg->disk_path);
  if (!c->model_fp || (cfg->disk_path && !c->disk_path)) {
    kvt_close(c);
    return -ENOMEM;
  }
  c->cfg.model_fingerprint = c->model_fp;
  c->cfg.disk_path = c->disk_path;
  c->remote_url = dup_or_fault(KVT_ALLOC_OPEN_REMOTE, cfg->remote_url);
  c->remote_user = dup_or_fault(KVT_ALLOC_OPEN_REMOTE, cfg->remote_user);
  c->remote_password = dup_or_fault(KVT_ALLOC_OPEN_REMOTE, cfg->remote_password);
  c->remote_prefix = dup_or_fault(KVT_ALLOC_OPEN_REMOTE, cfg->remote_key_prefix);
  if ((cfg->remote_url && !c->remote_url) || (cfg->remote_user && !c->remote_user) ||
      (cfg->remote_password && !c->remote_password) || (cfg->remote_key_prefix && !c->remote_prefix)) {
    kvt_close(c);
    return -ENOMEM;
  }
  /* The cache's copy of the config points at its own strings, never the
   * caller's; the password is reachable only through c->remote_password. */
  c->cfg.remote_url = c->remote_url;
  c->cfg.remote_user = c->remote_user;
  c->cfg.remote_password = NULL;
  c->cfg.remote_key_prefix = c->remote_prefix;
  c->rput_building = KVT__NONE;
  c->bt = cfg->block_tokens;
  c->log = (kvt__log_sink){cfg->log_fn, cfg->log_ctx, cfg->log_level};
  c->st.size = sizeof c->st;
  struct {
    void *p;
    int64_t t;
  } seed = {c, kvt__now_ns()};
  c->salt = (uint32_t)kvt__xxh3_64(&seed, sizeof seed, 0);
  *out = c;
  return 0;
}

static void set_detail(kvt_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_detail(kvt_cache *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->detail, sizeof c->detail, fmt, ap);
  va_end(ap);
}

/* Slot s of a segment is [base + s * stride, + bytes): the whole segment
 * must lie inside the address space, or a copy would wrap to low memory. */
static int segment_ok(kvt_cache *c, const kvt_segment *s, uint32_t i, uint32_t num_slots) {
  uintptr_t base = (uintptr_t)s->base;
  if (!s->base || !s->bytes || s->stride < s->bytes) {
    set_detail(c, "segment %u: base NULL, bytes 0, or stride %zu below bytes %zu", i, s->stride, s->bytes);
    return 0;
  }
  /* Bytes from base to the top of the address space, and no more than any
   * machine maps (user space ends at 2^47..2^56 on 64-bit CPUs). */
  uintptr_t room = UINTPTR_MAX - base;
  if (UINTPTR_MAX > MAX_SEGMENT_SPAN && room > MAX_SEGMENT_SPAN) room = (uintptr_t)MAX_SEGMENT_SPAN;
  if (s->bytes > room || (num_slots > 1 && s->stride > (room - s->bytes) / (num_slots - 1))) {
    set_detail(c, "segment %u: %u slots of stride %zu from %p pass the end of the address space", i, num_slots,
               s->stride, s->base);
    return 0;
  }
  return 1;
}

typedef struct seg_span {
  uintptr_t lo, hi; /* [lo, hi): first slot's start to last slot's end */
  uint32_t index;
} seg_span;

static int span_cmp(const void *a, const void *b) {
  const seg_span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Two segments collide when some slot of one shares a byte with a slot of
 * the other. Disjoint spans never do; interleaved spans with one stride
 * (K and V of a FlashInfer block) do not when their offsets within the
 * stride keep apart; anything else whose spans meet is refused. */
static int segments_collide(const kvt_segment *a, const kvt_segment *b, const seg_span *sa, const seg_span *sb) {
  if (sa->hi <= sb->lo || sb->hi <= sa->lo) return 0;
  if (a->stride != b->stride) return 1;
  size_t st = a->stride;
  uintptr_t pa = (uintptr_t)a->base, pb = (uintptr_t)b->base;
  size_t d = pb >= pa ? (size_t)((pb - pa) % st) : (size_t)(st - (pa - pb) % st) % st; /* b's offset from a */
  return !(a->bytes <= d && d + b->bytes <= st);
}

static int segments_disjoint(kvt_cache *c, const kvt_segment *seg, uint32_t n, uint32_t num_slots) {
  seg_span *sp = malloc(sizeof *sp * n);
  if (!sp) return -ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    sp[i].lo = (uintptr_t)seg[i].base;
    sp[i].hi = sp[i].lo + (uintptr_t)(num_slots - 1) * seg[i].stride + seg[i].bytes;
    sp[i].index = i;
  }
  qsort(sp, n, sizeof *sp, span_cmp);
  int ok = 1;
  for (uint32_t i = 0; ok && i < n; i++)
    for (uint32_t j = i + 1; ok && j < n && sp[j].lo < sp[i].hi; j++)
      if (segments_collide(&seg[sp[i].index], &seg[sp[j].index], &sp[i], &sp[j])) {
        set_detail(c, "segments %u and %u overlap", sp[i].index < sp[j].index ? sp[i].index : sp[j].index,
                   sp[i].index < sp[j].index ? sp[j].index : sp[i].index);
        ok = 0;
      }
  free(sp);
  return ok ? 0 : -EINVAL;
}

static int layout_ok(kvt_cache *c, const kvt_layout *l) {
  if (l->flags & KVT_LAYOUT_STORAGE) return kvt__storage_layout_ok(c, l);
  if (!l->num_layers || !l->segments_per_layer || !l->num_slots || l->num_slots == UINT32_MAX) {
    set_detail(c, "num_layers, segments_per_layer and num_slots must be at least 1");
    return -EINVAL;
  }
  if ((uint64_t)l->num_layers * l->segments_per_layer > 65536) {
    set_detail(c, "more than 65536 segments");
    return -EINVAL;
  }
  if (l->flags & KVT_LAYOUT_METADATA_ONLY) return 0;
  if (!l->segments) {
    set_detail(c, "segments is NULL without KVT_LAYOUT_METADATA_ONLY");
    return -EINVAL;
  }
  uint32_t n = l->num_layers * l->segments_per_layer;
  size_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!segment_ok(c, &l->segments[i], i, l->num_slots)) return -EINVAL;
    if (l->segments[i].bytes > MAX_BLOCK_BYTES - total) {
      set_detail(c, "a block's bytes (sum over segments) pass %zu", MAX_BLOCK_BYTES);
      return -EINVAL;
    }
    total += l->segments[i].bytes;
  }
  return segments_disjoint(c, l->segments, n, l->num_slots);
}

static int open_device(kvt_cache *c) {
  kvt_dev_open_args a = {.layout = &c->layout, .cuda_device = c->cfg.cuda_device, .copy_threads = c->cfg.copy_threads};
  int rc = KVT_ENODEV;
  /* Storage mode owns no device slots: the host backend allocates the pool. */
  if (c->storage_mode) return kvt__dev_open(&c->dev, kvt_dev_backend_host(), &a);
  if (c->cfg.device != KVT_DEVICE_HOST && kvt_dev_backend_cuda()) rc = kvt__dev_open(&c->dev, kvt_dev_backend_cuda(), &a);
  if (rc == KVT_ENODEV && c->cfg.device == KVT_DEVICE_AUTO) rc = kvt__dev_open(&c->dev, kvt_dev_backend_host(), &a);
  else if (c->cfg.device == KVT_DEVICE_HOST) rc = kvt__dev_open(&c->dev, kvt_dev_backend_host(), &a);
  if (rc < 0) c->dev.be = NULL;
  return rc;
}

static int compute_namespace(kvt_cache *c) {
  uint32_t n = c->layout.num_layers * c->layout.segments_per_layer;
  /* Without the geometry two layouts could share a namespace: fail instead. */
  uint64_t *bytes = alloc_or_fault(KVT_ALLOC_NAMESPACE, calloc(n, sizeof *bytes));
  if (!bytes) return -ENOMEM;
  for (uint32_t i = 0; i < n; i++) bytes[i] = c->metadata_only ? 0 : c->segments[i].bytes;
  kvt__ns_input in = {
      .model_fingerprint = c->cfg.model_fingerprint, .dtype = (uint32_t)c->cfg.dtype,
      .tp_rank = c->cfg.tp_rank, .tp_size = c->cfg.tp_size, .block_tokens = c->bt,
      .tenant_salt = c->cfg.tenant_salt, .num_layers = c->layout.num_layers,
      .segments_per_layer = c->layout.segments_per_layer, .segment_bytes = bytes};
  c->ns = kvt__namespace_key(&in);
  free(bytes);
  return 0;
}

static int alloc_tables(kvt_cache *c) {
  /* Storage mode: room for the entries of blocks being put before their slots exist. */
  uint64_t cap = c->cap[0] + c->cap[1] + c->cap[2] + (c->storage_mode ? 2ull * c->cfg.max_job_blocks : 0);
  if (cap > (1u << 30)) return -E2BIG;
  int rc = kvt__index_init(&c->map, (uint32_t)cap);
  for (int t = 0; rc == 0 && t < KVT__NTIERS; t++) rc = kvt__slots_init(&c->slots[t], (uint32_t)c->cap[t]);
  if (rc) return rc;
  uint32_t n = c->layout.num_slots, m = c->cfg.max_job_blocks;
  if (!c->metadata_only) { /* token ids of device copies, for verification */
    c->dev_tokens = calloc((size_t)n * c->bt, sizeof *c->dev_tokens);
    c->dev_has_tokens = calloc(n, 1);
    if (!c->dev_tokens || !c->dev_has_tokens) return -ENOMEM;
  }
  if (c->cap[KVT__T_HOST]) { /* restores that follow another job's fetch into a host slot */
    c->host_follow = calloc(c->cap[KVT__T_HOST], sizeof *c->host_follow);
    if (!c->host_follow) return -ENOMEM;
  }
  c->reqs = calloc(c->cfg.max_requests, sizeof *c->reqs);
  c->req_free = calloc(c->cfg.max_requests, sizeof *c->req_free);
  c->scratch_tiers = calloc(m, 1);
  c->scratch_entries = calloc(m, sizeof *c->scratch_entries);
  if (!c->reqs || !c->req_free || !c->scratch_tiers || !c->scratch_entries)
    return -ENOMEM;
  for (uint32_t i = 0; i < c->cfg.max_requests; i++) {
    c->req_free[c->n_req_free++] = c->cfg.max_requests - 1 - i;
    c->reqs[i].gen = c->salt + i * 0x9e3779b9u;
  }
  int rc2 = kvt__refs_init(c);
  return rc2 ? rc2 : kvt__jobs_init(c);
}

typedef struct recovery {
  kvt_cache *c;
  uint8_t *used;
} recovery;

static void recovered_block(void *arg, uint64_t slot, const kvt_key *key, const kvt_key *parent) {
  recovery *rv = arg;
  kvt_cache *c = rv->c;
  if (slot >= c->cap[KVT__T_DISK] || rv->used[slot] || kvt__index_find(&c->map, key) != KVT__NONE) return;
  uint32_t e = kvt__index_insert(&c->map, key, parent);
  if (e == KVT__NONE) return;
  kvt__index_set_state(&c->map, e, KVT__T_DISK, KVT__VALID, (uint32_t)slot);
  rv->used[slot] = 1;
  c->st.disk_recovered++;
}

static int disk_open_at(kvt_cache *c, kvt__disk_cfg *dc, const char *path) {
  dc->path = path;
  int rc = kvt__disk_open(dc, &c->disk);
  if (rc < 0 && !c->detail[0])
    set_detail(c, "disk_path %s: %s", path, dc->detail[0] ? dc->detail : kvt_strerror(rc));
  return rc;
}

static int open_disk(kvt_cache *c) {
  if (!c->disk_path || c->metadata_only) return 0;
  char why[160] = "";
  c->disk_bufs[0] = c->host.base;
  c->disk_buf_lens[0] = c->host.bytes;
  /* Recovery reads headers only: every fetch verifies the payload anyway,
   * so reopening a full tier costs a fraction of its size, not all of it. */
  kvt__disk_cfg dc = {.path = c->disk_path, .slots = c->cap[KVT__T_DISK], .block_tokens = c->bt,
                      .payload_bytes = c->block_bytes, .ns = c->ns, .queue_depth = c->cfg.disk_queue_depth,
                      .backend = c->cfg.disk_backend, .reset = c->cfg.disk_reset,
                      .bufs = c->disk_bufs, .buf_lens = c->disk_buf_lens, .n_bufs = c->host.base ? 1 : 0,
                      .recover_headers_only = 1, .durable = c->cfg.disk_durable,
                      .on_record = kvt__object_on_record, .on_record_arg = c,
                      .detail = why, .detail_len = sizeof why};
  int rc = kvt__disk_open(&dc, &c->disk);
  if (rc == KVT_ENAMESPACE && !c->cfg.disk_reset && kvt__disk_side_file_ok(c->disk_path)) {
    /* Another model, layout or format owns that file: start clean in a
     * file of our own beside it and leave theirs untouched. */
    char *alt = malloc(strlen(c->disk_path) + 40);
    if (!alt) return -ENOMEM;
    sprintf(alt, "%s.%016llx%016llx", c->disk_path, (unsigned long long)c->ns.hi, (unsigned long long)c->ns.lo);
    kvt__log_to(&c->log, KVT_LOG_WARN, "%s holds another model, layout or format: set aside untouched; this cache uses %s", c->disk_path, alt);
    free(c->disk_path);
    c->disk_path = alt;
    c->cfg.disk_path = alt;
    rc = disk_open_at(c, &dc, alt);
  } else if (rc < 0) {
    set_detail(c, "disk_path %s: %s", c->disk_path, why[0] ? why : kvt_strerror(rc));
  }
  if (rc < 0) return rc;
  recovery rv = {c, calloc(c->cap[KVT__T_DISK], 1)};
  if (!rv.used) return -ENOMEM;
  uint64_t discarded = 0;
  rc = kvt__disk_recover(c->disk, recovered_block, &rv, &discarded);
  c->st.disk_discarded = discarded;
  kvt__slots_rebuild(&c->slots[KVT__T_DISK], rv.used);
  free(rv.used);
  kvt__disk_stats ds;
  kvt__disk_get_stats(c->disk, &ds);
  c->st.disk_fresh_starts = ds.fresh_starts;
  c->st.disk_resize_moved = ds.resize_moved;
  c->st.disk_resize_dropped = ds.resize_dropped;
  c->st.disk_recover_bytes = ds.recover_bytes;
  if (ds.io_errors) kvt__log_to(&c->log, KVT_LOG_ERROR, "%s: %llu I/O errors while recovering the disk tier; the slots they hit were discarded", c->disk_path, (unsigned long long)ds.io_errors);
  kvt__log_to(&c->log, KVT_LOG_INFO, "%s: recovered %llu blocks, discarded %llu records", c->disk_path, (unsigned long long)c->st.disk_recovered, (unsigned long long)discarded);
  return rc < 0 ? rc : 0;
}

int kvt_register_layout(kvt_cache *c, const kvt_layout *user) {
  if (!c || !user) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (c->layout_ready || c->register_failed) return KVT_ESTATE;
  c->detail[0] = '\0';
  kvt_layout lv;
  kvt_layout_init(&lv);
  int rc = kvt__struct_in(&lv, sizeof lv, user, user->size, KVT_LAYOUT_SIZE_V1);
  if (rc) {
    set_detail(c, "kvt_layout size %u is not one this library knows", user->size);
    return rc;
  }
  const kvt_layout *layout = &lv;
  if ((rc = layout_ok(c, layout)) != 0) return rc;
  if (c->cfg.host_blocks + c->cfg.disk_blocks + layout->num_slots > (1u << 30)) {
    set_detail(c, "device + host + disk slots pass 2^30");
    return -E2BIG;
  }
  c->layout = *layout;
  c->metadata_only = (layout->flags & KVT_LAYOUT_METADATA_ONLY) != 0;
  c->storage_mode = (layout->flags & KVT_LAYOUT_STORAGE) != 0;
  uint32_t nseg = layout->num_layers * layout->segments_per_layer;
  if (!c->metadata_only) {
    c->segments = malloc(sizeof *c->segments * nseg);
    if (!c->segments) return -ENOMEM;
    memcpy(c->segments, layout->segments, sizeof *c->segments * nseg);
    for (uint32_t i = 0; i < nseg; i++) c->block_bytes += c->segments[i].bytes;
    c->record_bytes = kvt__record_bytes(c->bt, c->block_bytes);
  }
  c->layout.segments = c->segments;
  c->cap[KVT__T_DEV] = layout->num_slots;
  c->cap[KVT__T_HOST] = c->cfg.host_blocks;
  c->cap[KVT__T_DISK] = c->cfg.disk_path || c->metadata_only ? c->cfg.disk_blocks : 0;
  rc = compute_namespace(c);
  if (rc == 0 && !c->metadata_only) rc = open_device(c);
  if (rc < 0 && !c->detail[0]) set_detail(c, "device backend: %s", kvt_strerror(rc));
  if (rc == 0) rc = alloc_tables(c);
  for (uint32_t j = 0; rc == 0 && !c->metadata_only && j < c->n_jobs; j++)
    rc = kvt__dev_xfer_prepare(&c->dev, &c->jobs[j].xfer);
  for (uint32_t k = 0; rc == 0 && !c->metadata_only && k < c->n_xchunks; k++)
    rc = kvt__dev_xfer_prepare(&c->dev, &c->xchunks[k].xfer);
  kvt__log_scope(&c->log); /* the host pool, disk store and I/O backends log as this cache */
  if (rc == 0 && !c->metadata_only)
    rc = kvt__host_pool_init(&c->host, &c->dev, c->cap[KVT__T_HOST], c->record_bytes, c->cfg.host_mlock);
  if (rc < 0 && !c->detail[0]) set_detail(c, "tables and host pool: %s", kvt_strerror(rc));
  if (rc == 0) rc = open_disk(c);
  if (rc == 0 && c->storage_mode) rc = kvt__storage_init(c);
  if (rc == 0) rc = kvt__rtier_open(c); /* after the disk: an unreachable server is a degraded tier, not a failure */
  kvt__log_scope(NULL);
  if (rc < 0 && !c->detail[0]) set_detail(c, "disk_path %s: %s", c->disk_path, kvt_strerror(rc));
  if (rc < 0) {
    c->register_failed = 1; /* kvt_close frees what was set up */
    return rc;
  }
  rc = kvt__progress_start(c);
  if (rc < 0) {
    set_detail(c, "progress thread: %s", kvt_strerror(rc));
    c->register_failed = 1;
    return rc;
  }
  c->st.host_pool_pinned = (uint32_t)c->host.pinned;
  c->layout_ready = 1;
  return 0;
}

int kvt_drain(kvt_cache *c) {
  if (!c) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  kvt__flush_submits(c);
  pthread_mutex_lock(&c->lock);
  while (c->inflight || c->submitting || (c->storage && c->storage->active)) kvt__wait(c, NULL);
  pthread_mutex_unlock(&c->lock);
  return 0;
}

void kvt_close(kvt_cache *c) {
  if (!c) return;
  /* A forked child: the workers, the ring and maybe a holder of c->lock
   * stayed in the parent. Joining or freeing here could hang or corrupt
   * the copy-on-write image, so the child's copy is left as it is. */
  if (kvt__forked(c)) return;
  if (c->jobs) kvt_drain(c);
  kvt__storage_fini(c); /* waits for storage jobs in flight */
  kvt__progress_stop(c);
  kvt__rtier_close(c); /* nothing is in flight on it after the drain */
  kvt__events_flush_final(c);
  if (c->disk) kvt__disk_close(c->disk);
  kvt__jobs_fini(c);
  kvt__host_pool_fini(&c->host, &c->dev);
  kvt__dev_close(&c->dev);
  kvt__index_free(&c->map);
  for (int t = 0; t < KVT__NTIERS; t++) kvt__slots_free(&c->slots[t]);
  free(c->dev_tokens);
  free(c->dev_has_tokens);
  free(c->host_follow);
  free(c->reqs);
  free(c->req_free);
  kvt__refs_fini(c);
  kvt__object_memo_free(c);
  free(c->scratch_tiers);
  free(c->scratch_entries);
  free(c->segments);
  free(c->model_fp);
  free(c->disk_path);
  free(c->remote_url);
  free(c->remote_user);
  wipe_free(c->remote_password);
  free(c->remote_prefix);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c);
}

size_t kvt_block_bytes(const kvt_cache *c) { return c ? c->block_bytes : 0; }

const char *kvt_error_detail(const kvt_cache *c) { return c ? c->detail : ""; }

int kvt_namespace(const kvt_cache *c, kvt_key *ns) {
  if (!c || !ns) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (!c->layout_ready) return KVT_ELAYOUT;
  *ns = c->ns;
  return 0;
}

const char *kvt_device_backend_name(const kvt_cache *c) {
  if (!c || !c->layout_ready) return "none";
  return c->metadata_only ? "metadata-only" : c->dev.be->name;
}

const char *kvt_disk_backend_name(const kvt_cache *c) {
  if (!c || !c->disk) return c && c->metadata_only && c->cap[KVT__T_DISK] ? "metadata-only" : "none";
  return kvt__disk_backend_name(c->disk);
}

int kvt_hash_tokens(const kvt_cache *c, const kvt_key *parent, const uint32_t *tokens, size_t n_tokens,
                    kvt_key *keys, size_t max_keys, size_t *n_keys) {
  if (!c || (n_tokens && !tokens) || !n_keys) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (!c->layout_ready) return KVT_ELAYOUT;
  size_t n = n_tokens / c->bt;
  *n_keys = n;
  if (n > max_keys) return -ENOBUFS;
  if (n && !keys) return -EINVAL;
  kvt__chain_keys(parent ? parent : &c->ns, tokens, n, c->bt, keys);
  return 0;
}

int kvt_keys_from_opaque(const kvt_cache *c, const void *opaque, size_t key_bytes, size_t n, kvt_key *keys) {
  if (!c || (n && (!opaque || !keys)) || key_bytes == 0) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (!c->layout_ready) return KVT_ELAYOUT;
  for (size_t i = 0; i < n; i++) keys[i] = kvt__opaque_key(&c->ns, (const char *)opaque + i * key_bytes, key_bytes);
  return 0;
}

/* Everything allocated for bookkeeping (lock held): the tier map and its
 * free-slot stacks, device-slot tokens, the host slots' follower lists,
 * jobs, handles, requests and their refs, storage mode's jobs, and the
 * headers of objects remembered. */
static size_t metadata_bytes(const kvt_cache *c) {
  size_t b = kvt__index_bytes(&c->map), m = c->cfg.max_job_blocks;
  for (int t = 0; t < KVT__NTIERS; t++) b += (size_t)c->slots[t].capacity * sizeof(uint32_t);
  if (c->host_follow) b += (size_t)c->cap[KVT__T_HOST] * sizeof(kvt__op *);
  if (c->dev_tokens) b += (size_t)c->cap[KVT__T_DEV] * (c->bt * sizeof(uint32_t) + 1);
  b += (size_t)c->n_jobs * (sizeof(kvt__job) + (c->progq ? 5 : 2) * sizeof(uint32_t));
  b += (size_t)c->n_jobs_allocated * m * (sizeof(kvt__op) + sizeof(uint32_t) + sizeof(void *));
  b += (size_t)c->n_xchunks * (sizeof(kvt__xchunk) + 2 * sizeof(uint32_t)); /* streamed copies */
  b += (size_t)c->cfg.max_jobs * (sizeof(kvt__handle) + sizeof(uint32_t));
  b += (size_t)c->cfg.max_requests * (sizeof(kvt__request) + sizeof(uint32_t)) + kvt__refs_bytes(c);
  b += kvt__storage_metadata_bytes(c) + kvt__object_memo_bytes(c);
  return b + m * (1 + sizeof(uint32_t)); /* planner and commit scratch */
}

int kvt_get_stats(kvt_cache *c, kvt_stats *out) {
  if (!c || !out) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (out->size < KVT_STATS_SIZE_V1) return KVT_EVERSION;
  kvt_stats st;
  pthread_mutex_lock(&c->lock);
  st = c->st;
  st.resident_device = c->cap[0] - c->slots[0].n_free;
  st.resident_host = c->cap[1] - c->slots[1].n_free;
  st.resident_disk = c->cap[2] - c->slots[2].n_free;
  st.metadata_bytes = metadata_bytes(c);
  pthread_mutex_unlock(&c->lock);
  kvt__rtier_stats(c, &st);
  st.size = sizeof st;
  return kvt__struct_out(out, &st, sizeof st, KVT_STATS_SIZE_V1);
}

int kvt_set_cost_model(kvt_cache *c, const kvt_model_desc *user_model, const kvt_hw_desc *user_hw) {
  if (!c || !user_model || !user_hw) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  kvt_model_desc mv;
  kvt_hw_desc hv;
  kvt_model_init(&mv);
  kvt_hw_init(&hv);
  int vrc = kvt__struct_in(&mv, sizeof mv, user_model, user_model->size, KVT_MODEL_DESC_SIZE_V1);
  if (vrc == 0) vrc = kvt__struct_in(&hv, sizeof hv, user_hw, user_hw->size, KVT_HW_DESC_SIZE_V1);
  if (vrc) return vrc;
  const kvt_model_desc *model = &mv;
  const kvt_hw_desc *hw = &hv;
  if (!model->num_layers || hw->num_gpus == 0 || !(isfinite(hw->flops_per_gpu) && hw->flops_per_gpu > 0) ||
      !(isfinite(hw->mfu) && hw->mfu > 0))
    return -EINVAL;
  const kvt_link *links[3] = {&hw->device_host, &hw->host_disk, &hw->host_remote};
  for (int i = 0; i < 3; i++)
    if (!(isfinite(links[i]->bytes_per_s) && links[i]->bytes_per_s > 0) ||
        !(isfinite(links[i]->latency_s) && links[i]->latency_s >= 0))
      return -EINVAL;
  /* Calibration measures the bytes this cache really moves; a model that
   * describes other blocks would mix two sizes in one estimate. */
  uint64_t per_rank = kvt_model_kv_bytes_per_token(model) * c->bt / c->cfg.tp_size;
  if (c->layout_ready && !c->metadata_only && per_rank != c->block_bytes) return KVT_ELAYOUT;
  pthread_mutex_lock(&c->lock);
  c->model = *model;
  c->hw = *hw;
  kvt__calib_init(&c->calib, model, hw);
  c->have_cost = 1;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

int kvt_report_prefill(kvt_cache *c, uint64_t from_token, uint64_t to_token, double seconds) {
  if (!c || to_token <= from_token || !(isfinite(seconds) && seconds > 0)) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  pthread_mutex_lock(&c->lock);
  int rc = c->have_cost ? 0 : KVT_ESTATE;
  if (rc == 0) kvt__calib_observe_prefill(&c->calib, &c->model, from_token, to_token, seconds);
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int kvt_get_calibrated_hw(kvt_cache *c, kvt_hw_desc *hw) {
  if (!c || !hw) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  pthread_mutex_lock(&c->lock);
  int rc = c->have_cost ? 0 : KVT_ESTATE;
  if (rc == 0) kvt__calib_hw(&c->calib, hw);
  pthread_mutex_unlock(&c->lock);
  return rc;
}
