/* kvtier-bench sweep: how much host RAM and NVMe does a workload need?
 * Replays one trace or workload (metadata only) over a range of host
 * capacities, for each disk capacity, and prints hit ratio and estimated
 * TTFT per point; --svg draws them. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvtier/kvtier.h"
#include "replay_core.h"
#include "svg.h"
#include "trace.h"

#define MAX_POINTS 32
#define DEFAULT_DEVICE_TOKENS (256u << 10) /* as replay */
#define DEFAULT_DISK_TOKENS (4u << 20)

typedef struct sweep_cli {
  kvt_bench_source src;
  kvt_bench_replay_opts ro;
  uint64_t host[MAX_POINTS], disk[MAX_POINTS];
  size_t n_host, n_disk;
  int have_dev, json;
  const char *svg;
} sweep_cli;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvtier-bench sweep [--trace FILE | --workload multiround [opts]] [options]\n\n"
          "Hit ratio and estimated TTFT over host (and disk) capacities, metadata only.\n\n"
          "%s"
          "  --device-blocks N     device tier (256k tokens' worth)\n"
          "  --host-list A,B,...   host capacities in blocks (0 and 1/2..16 x the device)\n"
          "  --disk-list A,B,...   disk capacities, one line each (0 and 4M tokens' worth)\n"
          "  --model NAME          cost-model preset (llama3-8b)\n"
          "  --restore plan|all    (plan)\n"
          "  --whole-ids           count a trace's partial last id as a block\n"
          "  --svg FILE            write the chart\n"
          "  --metrics-out FILE    the engine's metrics at the end of the last point (the last\n"
          "                        of --disk-list and --host-list); JSON when FILE ends in .json\n"
          "  --json                one JSON object\n\n%s",
          kvt_bench_source_usage, kvt_bench_hw_usage);
}

static int parse_list(const char *opt, const char *v, uint64_t *out, size_t *n) {
  *n = 0;
  const char *p = v;
  while (*p) {
    char *end;
    errno = 0;
    if (*p == '-' || *n == MAX_POINTS) goto bad;
    unsigned long long x = strtoull(p, &end, 10);
    if (errno || end == p || x >= UINT32_MAX || (*end && *end != ',')) goto bad;
    out[(*n)++] = x;
    p = *end ? end + 1 : end;
  }
  if (*n) return 0;
bad:
  fprintf(stderr, "kvtier-bench sweep: %s '%s': expected up to %d comma-separated block counts\n", opt, v,
          MAX_POINTS);
  return -1;
}

static int parse(int argc, char **argv, sweep_cli *o) {
  for (int i = 1; i < argc; i++) {
    int s = kvt_bench_source_option(&o->src, "sweep", argc, argv, &i);
    if (s < 0) return 2;
    if (s > 0) continue;
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 1;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--whole-ids")) {
      o->ro.whole_ids = 1;
    } else if (kvt_bench_hw_flag(a)) {
      if (kvt_bench_hw_option("sweep", a, kvt_bench_hw_flag(a) == 2 ? (i++, v) : NULL, &o->ro.hw)) return 2;
    } else if (!v) {
      fprintf(stderr, "kvtier-bench sweep: unknown option or missing value '%s'\n", a);
      return 2;
    } else if (i++, !strcmp(a, "--device-blocks")) {
      size_t n;
      if (parse_list(a, v, &o->ro.device_blocks, &n) || n != 1 || !o->ro.device_blocks) {
        fprintf(stderr, "kvtier-bench sweep: --device-blocks: one count >= 1\n");
        return 2;
      }
      o->have_dev = 1;
    } else if (!strcmp(a, "--host-list")) {
      if (parse_list(a, v, o->host, &o->n_host)) return 2;
    } else if (!strcmp(a, "--disk-list")) {
      if (parse_list(a, v, o->disk, &o->n_disk)) return 2;
    } else if (!strcmp(a, "--model")) {
      o->ro.model = v;
    } else if (!strcmp(a, "--svg")) {
      o->svg = v;
    } else if (!strcmp(a, "--metrics-out")) {
      o->ro.metrics_out = v;
    } else if (!strcmp(a, "--restore")) {
      if (kvt_bench_restore_option("sweep", v, 0, &o->ro.restore)) return 2;
    } else {
      fprintf(stderr, "kvtier-bench sweep: unknown option '%s'\n", a);
      return 2;
    }
  }
  return 0;
}

static void fmt_bytes(char *buf, size_t n, double b) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (b >= 1024 && i < 5) {
    b /= 1024;
    i++;
  }
  snprintf(buf, n, b < 10 && i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

typedef struct sweep_point {
  int valid;
  double hit, ttft_p50, ttft_p99;
} sweep_point;

static void progress(double f) { kvt_bench_progress("sweep", f); }

/* One TTFT panel's series: a line per disk capacity, the device-only cache
 * (dashed), and always-recompute (dashed) unless it lies far above the
 * tiered range, where it would squash the lines that matter: then it is
 * named in the legend with its value and drawn nowhere. */
static size_t ttft_series(const sweep_cli *o, const kvt_bench_replay_result *base, sweep_point pts[][MAX_POINTS],
                          int p99, char labels[][64], double ys[][MAX_POINTS], kvt_bench_svg_series *out,
                          double *ymin, double *ymax) {
  size_t nd = o->n_disk;
  double dev = (p99 ? base->ttft_device_only_p99_s : base->ttft_device_only_p50_s) * 1e3;
  double rc = (p99 ? base->ttft_recompute_p99_s : base->ttft_recompute_p50_s) * 1e3;
  double top = dev, bottom = dev;
  for (size_t d = 0; d < nd; d++) {
    for (size_t h = 0; h < o->n_host; h++) {
      ys[d][h] = pts[d][h].valid ? (p99 ? pts[d][h].ttft_p99 : pts[d][h].ttft_p50) * 1e3 : NAN;
      if (isfinite(ys[d][h]) && ys[d][h] > top) top = ys[d][h];
      if (isfinite(ys[d][h]) && ys[d][h] < bottom) bottom = ys[d][h];
    }
    out[d] = (kvt_bench_svg_series){labels[d], ys[d], 0};
  }
  int rc_fits = rc <= 1.5 * top;
  if (rc_fits && rc > top) top = rc;
  for (size_t h = 0; h < o->n_host; h++) {
    ys[nd][h] = dev;
    ys[nd + 1][h] = rc_fits ? rc : NAN;
  }
  snprintf(labels[nd], sizeof labels[nd], "device-only prefix cache (%.1f ms)", dev);
  if (rc_fits) snprintf(labels[nd + 1], sizeof labels[nd + 1], "always recompute (%.1f ms)", rc);
  else snprintf(labels[nd + 1], sizeof labels[nd + 1], "always recompute: %.1f ms, above this scale", rc);
  out[nd] = (kvt_bench_svg_series){labels[nd], ys[nd], 1};
  out[nd + 1] = (kvt_bench_svg_series){labels[nd + 1], ys[nd + 1], 1};
  /* The axis starts near the lowest point, not at 0, so that the tiered
   * lines' differences are visible; the tick labels show the offset. */
  *ymin = bottom * 0.8;
  *ymax = top + (top - *ymin) * 0.1;
  return nd + 2;
}

static int write_svg(const sweep_cli *o, const kvt_bench_trace *t, const kvt_bench_replay_result *base,
                     sweep_point pts[][MAX_POINTS], uint64_t block_bytes) {
  static char tick_buf[MAX_POINTS][32], label_buf[MAX_POINTS + 2][64], p50_labels[MAX_POINTS + 2][64],
      p99_labels[MAX_POINTS + 2][64];
  static double hit_y[MAX_POINTS + 1][MAX_POINTS], p50_y[MAX_POINTS + 2][MAX_POINTS],
      p99_y[MAX_POINTS + 2][MAX_POINTS];
  const char *ticks[MAX_POINTS];
  kvt_bench_svg_series hs[MAX_POINTS + 1], s50[MAX_POINTS + 2], s99[MAX_POINTS + 2];
  for (size_t h = 0; h < o->n_host; h++) {
    fmt_bytes(tick_buf[h], sizeof tick_buf[h], (double)o->host[h] * (double)block_bytes);
    ticks[h] = tick_buf[h];
  }
  for (size_t d = 0; d < o->n_disk; d++) {
    char b[32];
    fmt_bytes(b, sizeof b, (double)o->disk[d] * (double)block_bytes);
    if (o->disk[d]) snprintf(label_buf[d], sizeof label_buf[d], "device + host + disk %s", b);
    else snprintf(label_buf[d], sizeof label_buf[d], "device + host");
    memcpy(p50_labels[d], label_buf[d], sizeof label_buf[d]);
    memcpy(p99_labels[d], label_buf[d], sizeof label_buf[d]);
    for (size_t h = 0; h < o->n_host; h++) hit_y[d][h] = pts[d][h].valid ? pts[d][h].hit : NAN;
    hs[d] = (kvt_bench_svg_series){label_buf[d], hit_y[d], 0};
  }
  size_t nd = o->n_disk;
  double dev_hit = base->blocks_total ? (double)base->device_only_blocks_hit / (double)base->blocks_total : 0;
  for (size_t h = 0; h < o->n_host; h++) hit_y[nd][h] = dev_hit;
  hs[nd] = (kvt_bench_svg_series){"device-only prefix cache", hit_y[nd], 1};
  double min50, max50, min99, max99;
  size_t n50 = ttft_series(o, base, pts, 0, p50_labels, p50_y, s50, &min50, &max50);
  size_t n99 = ttft_series(o, base, pts, 1, p99_labels, p99_y, s99, &min99, &max99);
  char xl[96], sub[256], dev[32];
  fmt_bytes(dev, sizeof dev, (double)o->ro.device_blocks * (double)block_bytes);
  snprintf(xl, sizeof xl, "host tier capacity (%s KV, %u-token blocks; points evenly spaced)", o->ro.model, t->block_tokens);
  snprintf(sub, sizeof sub, "%s; device %llu blocks (%s); restore %s; estimated TTFT from the cost model", t->source,
           (unsigned long long)o->ro.device_blocks, dev, o->ro.restore == KVT_BENCH_RESTORE_ALL ? "all" : "planner");
  kvt_bench_svg_panel panels[3] = {
      {"Block hit ratio", xl, "block hit ratio", o->n_host, ticks, hs, nd + 1, 0, 1},
      {"Estimated TTFT, median", xl, "TTFT p50 (ms)", o->n_host, ticks, s50, n50, min50, max50},
      {"Estimated TTFT, 99th percentile", xl, "TTFT p99 (ms)", o->n_host, ticks, s99, n99, min99, max99},
  };
  return kvt_bench_svg_write(o->svg, "kvtier sweep: hit ratio and TTFT vs host capacity", sub, panels, 3);
}

static void print_table(const sweep_cli *o, const kvt_bench_trace *t, const kvt_bench_replay_result *base,
                        sweep_point pts[][MAX_POINTS], uint64_t block_bytes) {
  char dev[32];
  fmt_bytes(dev, sizeof dev, (double)o->ro.device_blocks * (double)block_bytes);
  printf("kvtier sweep: %s\n  model %s, %u tokens/block, device %llu blocks (%s)\n", t->source, o->ro.model,
         t->block_tokens, (unsigned long long)o->ro.device_blocks, dev);
  kvt_bench_hw_print(stdout, "  ", &o->ro.hw);
  printf("\n");
  printf("  %10s %10s %10s |", "disk", "host", "host KV");
  printf(" %9s %12s %12s\n", "hit ratio", "TTFT p50 ms", "TTFT p99 ms");
  for (size_t d = 0; d < o->n_disk; d++)
    for (size_t h = 0; h < o->n_host; h++) {
      if (!pts[d][h].valid) continue;
      char hb[32];
      fmt_bytes(hb, sizeof hb, (double)o->host[h] * (double)block_bytes);
      printf("  %10llu %10llu %10s | %9.4f %12.2f %12.2f\n", (unsigned long long)o->disk[d],
             (unsigned long long)o->host[h], hb, pts[d][h].hit, pts[d][h].ttft_p50 * 1e3, pts[d][h].ttft_p99 * 1e3);
    }
  printf("\n  baselines: device-only prefix cache hit ratio %.4f, TTFT p50 %.2f ms, p99 %.2f ms;\n"
         "             always recompute TTFT p50 %.2f ms, p99 %.2f ms\n",
         base->blocks_total ? (double)base->device_only_blocks_hit / (double)base->blocks_total : 0,
         base->ttft_device_only_p50_s * 1e3, base->ttft_device_only_p99_s * 1e3, base->ttft_recompute_p50_s * 1e3,
         base->ttft_recompute_p99_s * 1e3);
}

static void print_json(const sweep_cli *o, const kvt_bench_trace *t, const kvt_bench_replay_result *base,
                       sweep_point pts[][MAX_POINTS]) {
  printf("{\"source\":\"%s\",\"model\":\"%s\",\"block_tokens\":%u,\"device_blocks\":%llu,", t->source,
         o->ro.model, t->block_tokens, (unsigned long long)o->ro.device_blocks);
  kvt_bench_hw_json(stdout, &o->ro.hw);
  printf(",\"points\":[");
  int first = 1;
  for (size_t d = 0; d < o->n_disk; d++)
    for (size_t h = 0; h < o->n_host; h++) {
      if (!pts[d][h].valid) continue;
      printf("%s{\"disk_blocks\":%llu,\"host_blocks\":%llu,\"block_hit_ratio\":%.6f,\"ttft_p50_s\":%.6g,"
             "\"ttft_p99_s\":%.6g}",
             first ? "" : ",", (unsigned long long)o->disk[d], (unsigned long long)o->host[h], pts[d][h].hit,
             pts[d][h].ttft_p50, pts[d][h].ttft_p99);
      first = 0;
    }
  printf("],\"device_only_block_hit_ratio\":%.6f,\"ttft_device_only_p50_s\":%.6g,\"ttft_device_only_p99_s\":%.6g,"
         "\"ttft_recompute_only_p50_s\":%.6g,\"ttft_recompute_only_p99_s\":%.6g}\n",
         base->blocks_total ? (double)base->device_only_blocks_hit / (double)base->blocks_total : 0,
         base->ttft_device_only_p50_s, base->ttft_device_only_p99_s, base->ttft_recompute_p50_s,
         base->ttft_recompute_p99_s);
}

static int sweep_main(int argc, char **argv) {
  static sweep_cli o;
  memset(&o, 0, sizeof o);
  kvt_bench_source_init(&o.src);
  kvt_bench_replay_opts_init(&o.ro);
  int rc = parse(argc, argv, &o);
  if (rc) return rc == 1 ? 0 : rc;
  kvt_bench_trace t;
  if (kvt_bench_source_load(&o.src, "sweep", &t)) return 1;
  uint32_t bt = t.block_tokens;
  if (!o.have_dev) o.ro.device_blocks = DEFAULT_DEVICE_TOKENS / bt;
  if (!o.n_host) {
    static const double mult[] = {0, 0.5, 1, 2, 4, 8, 16};
    for (size_t i = 0; i < sizeof mult / sizeof mult[0]; i++) o.host[o.n_host++] = (uint64_t)(mult[i] * o.ro.device_blocks);
  }
  if (!o.n_disk) {
    o.disk[o.n_disk++] = 0;
    o.disk[o.n_disk++] = DEFAULT_DISK_TOKENS / bt;
  }
  kvt_model_desc m;
  if (kvt_model_preset(o.ro.model, &m)) {
    fprintf(stderr, "kvtier-bench sweep: unknown model '%s'\n", o.ro.model);
    kvt_bench_trace_free(&t);
    return 2;
  }
  uint64_t block_bytes = kvt_model_kv_bytes_per_token(&m) * bt;
  static sweep_point pts[MAX_POINTS][MAX_POINTS];
  memset(pts, 0, sizeof pts);
  kvt_bench_replay_result r, base;
  memset(&base, 0, sizeof base);
  char err[256];
  size_t done = 0, total = o.n_disk * o.n_host;
  int have_base = 0;
  for (size_t d = 0; d < o.n_disk && rc == 0; d++)
    for (size_t h = 0; h < o.n_host && rc == 0; h++, done++) {
      if (o.disk[d] && !o.host[h]) continue; /* disk is reached through the host */
      kvt_bench_replay_opts ro = o.ro;
      ro.host_blocks = o.host[h];
      ro.disk_blocks = o.disk[d];
      ro.device_only_baseline = !have_base; /* the same for every point */
      if ((rc = kvt_bench_replay_run(&t, &ro, &r, err, sizeof err)) != 0) {
        fprintf(stderr, "kvtier-bench sweep: host %llu, disk %llu: %s\n", (unsigned long long)o.host[h],
                (unsigned long long)o.disk[d], err);
        break;
      }
      if (!have_base) base = r;
      have_base = 1;
      pts[d][h] = (sweep_point){1, r.blocks_total ? (double)r.blocks_hit / (double)r.blocks_total : 0, r.ttft_p50_s,
                                r.ttft_p99_s};
      progress((double)(done + 1) / (double)total);
    }
  kvt_bench_progress_done();
  if (rc == 0 && o.svg && (rc = write_svg(&o, &t, &base, pts, block_bytes)) != 0)
    fprintf(stderr, "kvtier-bench sweep: %s: %s\n", o.svg, strerror(-rc));
  if (rc == 0) {
    if (o.json) print_json(&o, &t, &base, pts);
    else print_table(&o, &t, &base, pts, block_bytes);
    if (o.svg && !o.json) printf("\n  chart: %s\n", o.svg);
  }
  kvt_bench_trace_free(&t);
  return rc ? 1 : 0;
}

KVT_BENCH_COMMAND(sweep, "hit ratio and estimated TTFT over host/disk capacities (table, --svg chart)", sweep_main)
