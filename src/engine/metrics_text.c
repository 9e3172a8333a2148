/* kvt_metrics_write: the cache's figures as Prometheus text exposition or
 * JSON, from one walk over the metric families so both say the same. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"

typedef struct out {
  char *buf;
  size_t cap, len;
  int json;
  int n_families, n_samples; /* written so far (JSON separators) */
  int n_tiers, n_paths;      /* shown: the remote ones only with a remote tier */
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...) {
  size_t room = o->len < o->cap ? o->cap - o->len : 0;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
  va_end(ap);
  if (k > 0) o->len += (size_t)k;
}

typedef struct label {
  const char *name, *value;
} label;

static void family_end(out *o) {
  if (o->json && o->n_families) put(o, "]}");
}

static void family(out *o, const char *name, const char *type, const char *help) {
  family_end(o);
  if (o->json) put(o, "%s\n{\"name\":\"%s\",\"type\":\"%s\",\"help\":\"%s\",\"samples\":[", o->n_families ? "," : "",
                   name, type, help);
  else put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  o->n_families++;
  o->n_samples = 0;
}

/* Label values are kvtier's own words and backend names: no quote,
 * backslash or newline to escape in either format. */
static void labels(out *o, const label *l, int n, const char *le) {
  if (o->json) {
    put(o, "\"labels\":{");
    for (int i = 0; i < n; i++) put(o, "%s\"%s\":\"%s\"", i ? "," : "", l[i].name, l[i].value);
    put(o, "}");
    return;
  }
  if (!n && !le) return;
  put(o, "{");
  for (int i = 0; i < n; i++) put(o, "%s%s=\"%s\"", i ? "," : "", l[i].name, l[i].value);
  if (le) put(o, "%sle=\"%s\"", n ? "," : "", le);
  put(o, "}");
}

static void sample(out *o, const char *name, const label *l, int n, uint64_t v) {
  if (o->json) {
    put(o, "%s{", o->n_samples ? "," : "");
    labels(o, l, n, NULL);
    put(o, ",\"value\":%llu}", (unsigned long long)v);
  } else {
    put(o, "%s", name);
    labels(o, l, n, NULL);
    put(o, " %llu\n", (unsigned long long)v);
  }
  o->n_samples++;
}

static void counter(out *o, const char *name, const char *help, uint64_t v) {
  family(o, name, "counter", help);
  sample(o, name, NULL, 0, v);
}

static void gauge(out *o, const char *name, const char *help, uint64_t v) {
  family(o, name, "gauge", help);
  sample(o, name, NULL, 0, v);
}

static const char *const tier_name[] = {"device", "host", "disk", "remote"};

/* Tiers and paths shown: the remote ones only for a cache with a remote tier. */
/* One sample per tier of this cache (remote joins when that tier exists). */
static void per_tier(out *o, const char *name, const char *type, const char *help, const uint64_t v[KVT__NTIERS + 1]) {
  family(o, name, type, help);
  for (int t = 0; t < o->n_tiers; t++) sample(o, name, &(label){"tier", tier_name[t]}, 1, v[t]);
}

static const int path_src[KVT__PATHS] = {KVT__T_DEV, KVT__T_HOST, KVT__T_HOST, KVT__T_DISK, KVT__T_REMOTE, KVT__T_HOST};
static const int path_dst[KVT__PATHS] = {KVT__T_HOST, KVT__T_DEV, KVT__T_DISK, KVT__T_HOST, KVT__T_HOST, KVT__T_REMOTE};

static void per_path(out *o, const char *name, const char *help, const uint64_t v[KVT__PATHS]) {
  family(o, name, "counter", help);
  for (int p = 0; p < o->n_paths; p++) {
    label l[2] = {{"src", tier_name[path_src[p]]}, {"dst", tier_name[path_dst[p]]}};
    sample(o, name, l, 2, v[p]);
  }
}

static void histogram(out *o, const kvt__metrics *m) {
  const char *name = "kvtier_transfer_seconds";
  family(o, name, "histogram",
         "Duration of transfer jobs (one batch of blocks on one path, from submission to completion)");
  for (int p = 0; p < o->n_paths; p++) {
    label l[2] = {{"src", tier_name[path_src[p]]}, {"dst", tier_name[path_dst[p]]}};
    uint64_t cum = 0;
    double sum = (double)atomic_load_explicit(&m->lat_sum_ns[p], memory_order_relaxed) * 1e-9;
    if (o->json) {
      put(o, "%s{", o->n_samples ? "," : "");
      labels(o, l, 2, NULL);
      put(o, ",\"buckets\":[");
    }
    for (int b = 0; b <= KVT__LAT_BOUNDS; b++) {
      cum += atomic_load_explicit(&m->lat_bucket[p][b], memory_order_relaxed);
      char le[32];
      if (b < KVT__LAT_BOUNDS) snprintf(le, sizeof le, "%g", kvt__lat_bounds_s[b]);
      else snprintf(le, sizeof le, "+Inf");
      if (o->json) {
        put(o, "%s{\"le\":\"%s\",\"count\":%llu}", b ? "," : "", le, (unsigned long long)cum);
      } else {
        put(o, "%s_bucket", name);
        labels(o, l, 2, le);
        put(o, " %llu\n", (unsigned long long)cum);
      }
    }
    if (o->json) {
      put(o, "],\"count\":%llu,\"sum\":%.9g}", (unsigned long long)cum, sum);
    } else {
      put(o, "%s_sum", name);
      labels(o, l, 2, NULL);
      put(o, " %.9g\n%s_count", sum, name);
      labels(o, l, 2, NULL);
      put(o, " %llu\n", (unsigned long long)cum);
    }
    o->n_samples++;
  }
}

static uint64_t load(const _Atomic uint64_t *a) { return atomic_load_explicit(a, memory_order_relaxed); }

static void emit(out *o, kvt_cache *c, const kvt_stats *st, uint64_t inflight, const uint64_t cap[KVT__NTIERS]) {
  const kvt__metrics *m = &c->metrics;
  uint64_t bt = c->bt, v[KVT__NTIERS + 1 > KVT__PATHS ? KVT__NTIERS + 1 : KVT__PATHS];
#ifdef KVT_NO_METRICS
  const char *counting = "off";
#else
  const char *counting = "on";
#endif
  if (o->json) put(o, "{\"format\":\"kvtier-metrics\",\"version\":\"%s\",\"metrics\":[", kvt_version());
  family(o, "kvtier_info", "gauge", "kvtier version and backends in use (value 1)");
  label info[4] = {{"version", kvt_version()}, {"device_backend", kvt_device_backend_name(c)},
                   {"disk_backend", kvt_disk_backend_name(c)}, {"counting", counting}};
  sample(o, "kvtier_info", info, 4, 1);
  counter(o, "kvtier_lookups_total", "kvt_lookup and kvt_plan_request calls", st->lookups);
  counter(o, "kvtier_lookup_blocks_total", "Blocks asked about by lookups", st->lookup_blocks);
  counter(o, "kvtier_lookup_tokens_total", "Tokens asked about by lookups (blocks x block_tokens)",
          st->lookup_blocks * bt);
  counter(o, "kvtier_acquires_total", "kvt_acquire calls that got device slots", st->acquires);
  /* Hits and misses before the blocks acquired: every block is added to
   * acquire_blocks before it counts as a hit or a miss (release adds), so
   * one scrape never shows more outcomes than blocks, even while requests
   * run (a hit ratio from one scrape stays <= 1). */
  uint64_t miss[KVT__MISS_REASONS];
  for (int t = 0; t < KVT__NTIERS + 1; t++) v[t] = atomic_load_explicit(&m->hit_blocks[t], memory_order_acquire);
  for (int r = 0; r < KVT__MISS_REASONS; r++) miss[r] = atomic_load_explicit(&m->miss_blocks[r], memory_order_acquire);
  counter(o, "kvtier_acquire_blocks_total", "Keyed blocks of acquired requests", load(&m->acquire_blocks));
  per_tier(o, "kvtier_hit_blocks_total", "counter",
           "Blocks restored for a request, by the tier they came from (counted once valid on the device)", v);
  for (int t = 0; t < KVT__NTIERS + 1; t++) v[t] *= bt;
  per_tier(o, "kvtier_hit_tokens_total", "counter", "Tokens restored for a request, by tier (blocks x block_tokens)", v);
  static const char *const reason[KVT__MISS_REASONS] = {"absent", "planned_recompute", "verify_mismatch",
                                                         "load_error"};
  family(o, "kvtier_miss_blocks_total", "counter", "Keyed blocks of acquired requests that were not restored, by reason");
  for (int r = 0; r < KVT__MISS_REASONS; r++)
    sample(o, "kvtier_miss_blocks_total", &(label){"reason", reason[r]}, 1, miss[r]);
  counter(o, "kvtier_committed_blocks_total", "Computed blocks that became cached on the device",
          st->blocks_committed);
  uint64_t blocks[KVT__PATHS] = {st->blocks_d2h, st->blocks_h2d, st->blocks_h2disk, st->blocks_disk2h,
                                 st->blocks_remote2h, st->blocks_h2remote};
  uint64_t bytes[KVT__PATHS] = {st->bytes_d2h, st->bytes_h2d, st->bytes_h2disk, st->bytes_disk2h,
                                st->bytes_remote2h, st->bytes_h2remote};
  per_path(o, "kvtier_transfer_blocks_total", "Blocks copied between tiers (copies that landed)", blocks);
  per_path(o, "kvtier_transfer_bytes_total", "Bytes copied between tiers (copies that landed)", bytes);
  histogram(o, m);
  /* The remote tier evicts on the server and has no slots of ours: local tiers only. */
  int shown = o->n_tiers;
  o->n_tiers = KVT__NTIERS;
  uint64_t ev[KVT__NTIERS + 1] = {st->evictions_device, st->evictions_host, st->evictions_disk, 0};
  per_tier(o, "kvtier_evictions_total", "counter", "Blocks that left a tier to make room (demoted or dropped)", ev);
  uint64_t res[KVT__NTIERS + 1] = {st->resident_device, st->resident_host, st->resident_disk, 0};
  per_tier(o, "kvtier_resident_blocks", "gauge", "Slots in use per tier", res);
  uint64_t caps[KVT__NTIERS + 1] = {cap[0], cap[1], cap[2], 0};
  per_tier(o, "kvtier_capacity_blocks", "gauge", "Slots per tier (0: the tier is off)", caps);
  o->n_tiers = shown;
  counter(o, "kvtier_jobs_started_total", "Transfer jobs started (engine's and internal)", st->jobs_started);
  counter(o, "kvtier_jobs_failed_total", "Transfer jobs that finished with an error", st->jobs_failed);
  counter(o, "kvtier_jobs_cancelled_total", "Transfer jobs cancelled", st->jobs_cancelled);
  gauge(o, "kvtier_jobs_in_flight", "Transfer jobs in flight", inflight);
  family(o, "kvtier_errors_total", "counter", "Errors by kind: failed disk I/Os, failed device copies, records failing their checksum");
  sample(o, "kvtier_errors_total", &(label){"kind", "io"}, 1, st->io_errors);
  sample(o, "kvtier_errors_total", &(label){"kind", "copy"}, 1, st->copy_errors);
  sample(o, "kvtier_errors_total", &(label){"kind", "checksum"}, 1, st->checksum_failures);
  if (c->remote_on) {
    /* The remote tier's own figures (tier="remote"); never its address or credentials. */
    label rt = {"tier", "remote"};
    family(o, "kvtier_remote_probes_total", "counter", "Existence round trips to the remote tier");
    sample(o, "kvtier_remote_probes_total", &rt, 1, st->remote_probes);
    family(o, "kvtier_remote_negative_hits_total", "counter", "Remote probes skipped: the key was found absent lately");
    sample(o, "kvtier_remote_negative_hits_total", &rt, 1, st->remote_negative_hits);
    family(o, "kvtier_remote_fetch_failures_total", "counter", "Remote fetches that were misses, by reason");
    label fr[2][2] = {{rt, {"reason", "absent"}}, {rt, {"reason", "corrupt"}}};
    sample(o, "kvtier_remote_fetch_failures_total", fr[0], 2, st->remote_misses);
    sample(o, "kvtier_remote_fetch_failures_total", fr[1], 2, st->remote_corrupt);
    family(o, "kvtier_remote_errors_total", "counter", "Remote fetches and puts that failed, by kind");
    label er[3][2] = {{rt, {"kind", "error"}}, {rt, {"kind", "timeout"}}, {rt, {"kind", "refused"}}};
    sample(o, "kvtier_remote_errors_total", er[0], 2, st->remote_errors);
    sample(o, "kvtier_remote_errors_total", er[1], 2, st->remote_timeouts);
    sample(o, "kvtier_remote_errors_total", er[2], 2, st->remote_put_refused);
    family(o, "kvtier_remote_degraded", "gauge", "1 while the remote tier is unreachable or a node of it is failing");
    sample(o, "kvtier_remote_degraded", &rt, 1, st->remote_degraded);
    family(o, "kvtier_remote_nodes", "gauge", "Remote server nodes known");
    sample(o, "kvtier_remote_nodes", &rt, 1, st->remote_nodes);
    family(o, "kvtier_remote_reconnects_total", "counter", "Times the remote tier came back after being unreachable");
    sample(o, "kvtier_remote_reconnects_total", &rt, 1, st->remote_reconnects);
  }
  static const char *const decision[3] = {"recompute", "restore", "split"};
  family(o, "kvtier_plan_decisions_total", "counter", "kvt_plan_request decisions");
  for (int d = 0; d < 3; d++)
    sample(o, "kvtier_plan_decisions_total", &(label){"decision", decision[d]}, 1, load(&m->decisions[d]));
  counter(o, "kvtier_plan_restore_blocks_total", "Blocks the planner chose to restore (sum of restore_blocks)",
          load(&m->plan_restore_blocks));
  counter(o, "kvtier_disk_recovered_blocks_total", "Disk blocks found at kvt_register_layout", st->disk_recovered);
  counter(o, "kvtier_disk_discarded_blocks_total", "Disk records discarded at kvt_register_layout (torn, foreign, duplicate)",
          st->disk_discarded);
  counter(o, "kvtier_disk_fresh_starts_total", "Disk tiers started empty because the superblock was damaged",
          st->disk_fresh_starts);
  gauge(o, "kvtier_host_pool_pinned", "1 if the host pool is pinned by the device backend, 0 if pageable",
        st->host_pool_pinned);
  gauge(o, "kvtier_metadata_bytes", "Bytes of tier map, jobs and request tables", st->metadata_bytes);
  family_end(o);
  if (o->json) put(o, "\n]}\n");
}

int kvt_metrics_write(kvt_cache *c, int format, char *buf, size_t *len) {
  if (!c || !len || (format != KVT_METRICS_PROMETHEUS && format != KVT_METRICS_JSON) || (!buf && *len)) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  kvt_stats st = {.size = sizeof st};
  int rc = kvt_get_stats(c, &st);
  if (rc < 0) return rc;
  uint64_t cap[KVT__NTIERS];
  pthread_mutex_lock(&c->lock);
  uint64_t inflight = c->inflight;
  memcpy(cap, c->cap, sizeof cap);
  pthread_mutex_unlock(&c->lock);
  out o = {.buf = buf, .cap = *len, .json = format == KVT_METRICS_JSON, .n_tiers = c->remote_on ? KVT__NTIERS + 1 : KVT__NTIERS,
           .n_paths = c->remote_on ? KVT__PATHS : KVT__LOCAL_PATHS};
  emit(&o, c, &st, inflight, cap);
  *len = o.len;
  return o.len < o.cap ? 0 : -ENOBUFS;
}
