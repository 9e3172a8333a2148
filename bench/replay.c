/* kvtier-bench replay: a request trace (or the built-in multiround
 * workload) through the real engine; hits per tier, bytes moved, restore
 * decisions and estimated TTFT against two baselines. Rules: replay_core.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier/kvtier.h"
#include "replay_core.h"
#include "trace.h"

/* Default capacities, in tokens so that they mean the same at any block
 * size: a 256k-token device KV pool (32 GiB of llama3-8b KV, what an 80 GB
 * GPU has left beside the weights), 1M tokens of host RAM, 4M on disk. */
#define DEFAULT_DEVICE_TOKENS (256u << 10)
#define DEFAULT_HOST_TOKENS (1u << 20)
#define DEFAULT_DISK_TOKENS (4u << 20)

typedef struct replay_cli {
  kvt_bench_source src;
  kvt_bench_replay_opts ro;
  int have_dev, have_host, have_disk, json;
  int mode; /* MODE_* */
  uint32_t nodes; /* > 1: the multi-node replay */
} replay_cli;

enum { MODE_OWNER = 0, MODE_STORAGE = 1, MODE_BOTH = 2 };

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvtier-bench replay [--trace FILE | --workload multiround [opts]] [options]\n\n"
          "Replays requests one at a time through the real engine: lookup, plan, restore\n"
          "(load or fetch), recompute, commit, release, with eviction across the tiers.\n"
          "With no options: the built-in multiround workload, metadata only.\n\n"
          "%s"
          "  --device-blocks N     device tier (default 256k tokens' worth); 0 = the device\n"
          "                        holds only the running request, offloaded after it\n"
          "  --host-blocks N       host tier (1M tokens' worth); 0 = none\n"
          "  --disk-blocks N       disk tier (4M tokens' worth); 0 = none\n"
          "  --model NAME          cost-model preset (llama3-8b); 'kvtier-bench cost --model list'\n"
          "  --payload none|real   metadata only (none), or real bytes through host and disk\n"
          "  --payload-scale S     real payload: blocks of 1/S the model's size (default: the\n"
          "                        smallest power of two fitting 2 GiB of RAM and 8 GiB of disk)\n"
          "  --disk-path FILE      real payload: disk file (overwritten; default: a temp dir)\n"
          "  --restore plan|all|none  restore the planner's k blocks (plan), the whole\n"
          "                        cached prefix, or nothing\n"
"  --mode owner|storage|both  owner: kvtier hands out the device slots (default);\n"
          "                        storage: the engine owns its device pool (pages in RAM\n"
          "                        with its own LRU) and kvtier is the host and disk tiers\n"
          "                        below it (exists, get-into, put-from per request; real\n"
          "                        payload); both: each in turn, hit ratios side by side\n"
          "  --no-promote          storage mode: disk hits go to the engine's pages only\n"
          "                        (kvt_get_into without KVT_GET_PROMOTE; by default they\n"
          "                        also land in kvtier's host tier, as owner mode's do)\n"
          "  --whole-ids           count a trace's partial last id as a block (as the trace's\n"
          "                        published LRU figures do); default: full blocks only\n"
          "  --metrics-out FILE    at the end, the engine's metrics in Prometheus text format\n"
          "                        (JSON when FILE ends in .json)\n"
          "  --remote URL          a remote tier (Redis server or cluster seed list:\n"
          "                        redis://[user:pass@]host:port[,host:port...]); real payload\n"
          "  --remote-prefix P     its key prefix (default: one of this run's own, so runs\n"
          "                        never see each other's blocks)\n"
          "  --write-through       every computed block goes down the tiers at once\n"
          "  --nodes N             multi-node replay (with --remote): N processes, each its\n"
          "                        own cache with its own host and disk tiers, request i on\n"
          "                        node i %% N, run with the shared remote tier and again\n"
          "                        without it; hit ratio and estimated TTFT side by side\n"
          "  --json                one JSON object\n\n%s",
          kvt_bench_source_usage, kvt_bench_hw_usage);
}

static int parse_count(const char *opt, const char *v, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long x = v && *v != '-' ? strtoull(v, &end, 10) : 0;
  if (!v || *v == '-' || errno || *end || x >= UINT32_MAX) {
    fprintf(stderr, "kvtier-bench replay: %s '%s': expected a block count\n", opt, v ? v : "");
    return -1;
  }
  *out = x;
  return 0;
}

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse(int argc, char **argv, replay_cli *o) {
  for (int i = 1; i < argc; i++) {
    int s = kvt_bench_source_option(&o->src, "replay", argc, argv, &i);
    if (s < 0) return 2;
    if (s > 0) continue;
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 1;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--write-through")) {
      o->ro.write_through = 1;
    } else if (!strcmp(a, "--whole-ids")) {
      o->ro.whole_ids = 1;
    } else if (!strcmp(a, "--no-promote")) {
      o->ro.storage_no_promote = 1;
    } else if (kvt_bench_hw_flag(a)) {
      if (kvt_bench_hw_option("replay", a, kvt_bench_hw_flag(a) == 2 ? (i++, v) : NULL, &o->ro.hw)) return 2;
    } else if (!v) {
      fprintf(stderr, "kvtier-bench replay: unknown option or missing value '%s'\n", a);
      return 2;
    } else if (i++, !strcmp(a, "--device-blocks")) {
      if (parse_count(a, v, &o->ro.device_blocks)) return 2;
      o->have_dev = 1;
    } else if (!strcmp(a, "--host-blocks")) {
      if (parse_count(a, v, &o->ro.host_blocks)) return 2;
      o->have_host = 1;
    } else if (!strcmp(a, "--disk-blocks")) {
      if (parse_count(a, v, &o->ro.disk_blocks)) return 2;
      o->have_disk = 1;
    } else if (!strcmp(a, "--model")) {
      o->ro.model = v;
    } else if (!strcmp(a, "--payload")) {
      if (strcmp(v, "none") && strcmp(v, "real")) {
        fprintf(stderr, "kvtier-bench replay: --payload '%s': expected none or real\n", v);
        return 2;
      }
      o->ro.payload_real = !strcmp(v, "real");
    } else if (!strcmp(a, "--payload-scale")) {
      uint64_t sc;
      if (parse_count(a, v, &sc)) return 2;
      if (!sc) {
        fprintf(stderr, "kvtier-bench replay: --payload-scale '%s': must be at least 1\n", v);
        return 2;
      }
      o->ro.payload_scale = (uint32_t)sc;
    } else if (!strcmp(a, "--mode")) {
      if (!strcmp(v, "owner")) o->mode = MODE_OWNER;
      else if (!strcmp(v, "storage")) o->mode = MODE_STORAGE;
      else if (!strcmp(v, "both")) o->mode = MODE_BOTH;
      else {
        fprintf(stderr, "kvtier-bench replay: --mode '%s': expected owner, storage or both\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--disk-path")) {
      o->ro.disk_path = v;
    } else if (!strcmp(a, "--metrics-out")) {
      o->ro.metrics_out = v;
    } else if (!strcmp(a, "--restore")) {
      if (kvt_bench_restore_option("replay", v, 1, &o->ro.restore)) return 2;
    } else if (!strcmp(a, "--remote")) {
      o->ro.remote_url = v;
    } else if (!strcmp(a, "--remote-prefix")) {
      o->ro.remote_key_prefix = v;
    } else if (!strcmp(a, "--nodes")) {
      uint64_t n = 0;
      if (parse_count(a, v, &n)) return 2;
      if (n < 1 || n > 64) {
        fprintf(stderr, "kvtier-bench replay: --nodes '%s': 1 to 64\n", v);
        return 2;
      }
      o->nodes = (uint32_t)n;
    } else {
      fprintf(stderr, "kvtier-bench replay: unknown option '%s'\n", a);
      return 2;
    }
  }
  return 0;
}

static void progress(double f) { kvt_bench_progress("replay", f); }

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

static void print_json(const kvt_bench_trace *t, const replay_cli *o, const kvt_bench_replay_result *r) {
  const kvt_stats *st = &r->st;
  uint64_t mb = r->model_block_bytes;
  printf("{\"mode\":\"%s\",", o->ro.storage_mode ? "storage" : "owner");
  if (o->ro.storage_mode) printf("\"promote\":%s,", o->ro.storage_no_promote ? "false" : "true");
  printf("\"source\":\"%s\",\"model\":\"%s\",\"block_tokens\":%u,\"payload\":\"%s\",\"payload_scale\":%u,"
         "\"restore\":\"%s\",\"whole_ids\":%d,",
         t->source, o->ro.model, t->block_tokens, o->ro.payload_real ? "real" : "none", r->payload_scale,
         o->ro.restore == KVT_BENCH_RESTORE_PLAN ? "plan" : o->ro.restore == KVT_BENCH_RESTORE_ALL ? "all" : "none",
         o->ro.whole_ids);
  kvt_bench_hw_json(stdout, &o->ro.hw);
  printf(",\"device_blocks\":%llu,\"device_slots\":%llu,\"host_blocks\":%llu,\"disk_blocks\":%llu,",
         (unsigned long long)o->ro.device_blocks, (unsigned long long)r->device_slots,
         (unsigned long long)o->ro.host_blocks, (unsigned long long)o->ro.disk_blocks);
  printf("\"requests\":%llu,\"blocks_total\":%llu,\"blocks_hit\":%llu,\"block_hit_ratio\":%.6f,"
         "\"tokens_total\":%llu,\"tokens_hit\":%llu,\"token_hit_ratio\":%.6f,",
         (unsigned long long)r->requests, (unsigned long long)r->blocks_total, (unsigned long long)r->blocks_hit,
         ratio(r->blocks_hit, r->blocks_total), (unsigned long long)r->tokens_total,
         (unsigned long long)r->tokens_hit, ratio(r->tokens_hit, r->tokens_total));
  printf("\"hits_device\":%llu,\"hits_host\":%llu,\"hits_disk\":%llu,\"hits_remote\":%llu,\"blocks_restored\":%llu,"
         "\"blocks_reused_device\":%llu,\"blocks_loaded\":%llu,\"blocks_from_disk\":%llu,"
         "\"blocks_recomputed\":%llu,\"blocks_load_failed\":%llu,\"truncated_requests\":%llu,"
         "\"restores_clipped\":%llu,",
         (unsigned long long)r->hits_device, (unsigned long long)r->hits_host, (unsigned long long)r->hits_disk,
         (unsigned long long)r->hits_remote, (unsigned long long)r->blocks_restored, (unsigned long long)r->blocks_reused,
         (unsigned long long)r->blocks_loaded, (unsigned long long)r->blocks_from_disk,
         (unsigned long long)r->blocks_recomputed, (unsigned long long)r->blocks_load_failed,
         (unsigned long long)r->truncated_requests, (unsigned long long)r->restores_clipped);
  printf("\"decisions\":{\"recompute\":%llu,\"restore\":%llu,\"split\":%llu},",
         (unsigned long long)r->decisions[0], (unsigned long long)r->decisions[1], (unsigned long long)r->decisions[2]);
  printf("\"blocks_moved\":{\"d2h\":%llu,\"h2d\":%llu,\"h2disk\":%llu,\"disk2h\":%llu},",
         (unsigned long long)st->blocks_d2h, (unsigned long long)st->blocks_h2d,
         (unsigned long long)st->blocks_h2disk, (unsigned long long)st->blocks_disk2h);
  printf("\"model_block_bytes\":%llu,\"model_bytes_moved\":{\"d2h\":%llu,\"h2d\":%llu,\"h2disk\":%llu,\"disk2h\":%llu},",
         (unsigned long long)mb, (unsigned long long)(st->blocks_d2h * mb), (unsigned long long)(st->blocks_h2d * mb),
         (unsigned long long)(st->blocks_h2disk * mb), (unsigned long long)(st->blocks_disk2h * mb));
  printf("\"bytes_moved\":{\"d2h\":%llu,\"h2d\":%llu,\"h2disk\":%llu,\"disk2h\":%llu},",
         (unsigned long long)st->bytes_d2h, (unsigned long long)st->bytes_h2d, (unsigned long long)st->bytes_h2disk,
         (unsigned long long)st->bytes_disk2h);
  printf("\"evictions\":{\"device\":%llu,\"host\":%llu,\"disk\":%llu},",
         (unsigned long long)st->evictions_device, (unsigned long long)st->evictions_host,
         (unsigned long long)st->evictions_disk);
  printf("\"payload_verified\":%llu,\"payload_corrupt\":%llu,\"io_errors\":%llu,\"checksum_failures\":%llu,",
         (unsigned long long)r->payload_verified, (unsigned long long)r->payload_corrupt,
         (unsigned long long)st->io_errors, (unsigned long long)st->checksum_failures);
  printf("\"ttft_p50_s\":%.6g,\"ttft_p99_s\":%.6g,\"ttft_mean_s\":%.6g,"
         "\"ttft_recompute_only_p50_s\":%.6g,\"ttft_recompute_only_p99_s\":%.6g,\"ttft_recompute_only_mean_s\":%.6g,"
         "\"ttft_device_only_p50_s\":%.6g,\"ttft_device_only_p99_s\":%.6g,\"ttft_device_only_mean_s\":%.6g,"
         "\"device_only_block_hit_ratio\":%.6f,\"wall_s\":%.4f}\n",
         r->ttft_p50_s, r->ttft_p99_s, r->ttft_mean_s, r->ttft_recompute_p50_s, r->ttft_recompute_p99_s,
         r->ttft_recompute_mean_s, r->ttft_device_only_p50_s, r->ttft_device_only_p99_s, r->ttft_device_only_mean_s,
         ratio(r->device_only_blocks_hit, r->blocks_total), r->wall_s);
}

static void human_bytes(char *buf, size_t n, double b) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (b >= 1024 && i < 5) {
    b /= 1024;
    i++;
  }
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void print_path(const char *name, uint64_t blocks, uint64_t model_bytes, uint64_t bytes, int real) {
  char a[32], b[32];
  human_bytes(a, sizeof a, (double)model_bytes);
  human_bytes(b, sizeof b, (double)bytes);
  printf("  %-16s %10llu blocks  %12s", name, (unsigned long long)blocks, a);
  if (real) printf("  (%s moved here)", b);
  printf("\n");
}

/* One line per percentile: kvtier against both baselines, and how many
 * times faster than the better of them (below 1: slower). */
static void verdict_line(const char *label, double ours, double dev_only, double recompute, int have_dev) {
  double best = have_dev && dev_only < recompute ? dev_only : recompute;
  double x = ours > 0 ? best / ours : 0;
  if (have_dev)
    printf("%s %.1f ms vs %.1f ms device-only cache, %.1f ms recompute: %.1fx%s\n", label, ours * 1e3,
           dev_only * 1e3, recompute * 1e3, x, x < 1 ? " (slower)" : "");
  else
    printf("%s %.1f ms vs %.1f ms recompute: %.1fx%s\n", label, ours * 1e3, recompute * 1e3, x,
           x < 1 ? " (slower)" : "");
}

static void print_human(const kvt_bench_trace *t, const replay_cli *o, const kvt_bench_replay_result *r) {
  const kvt_stats *st = &r->st;
  uint64_t mb = r->model_block_bytes;
  char bb[32], tier[3][32];
  human_bytes(bb, sizeof bb, (double)mb);
  uint64_t caps[3] = {o->ro.device_blocks, o->ro.host_blocks, o->ro.disk_blocks};
  for (int i = 0; i < 3; i++) human_bytes(tier[i], sizeof tier[i], (double)caps[i] * (double)mb);
  int dev_base = o->ro.device_blocks && !o->ro.storage_mode; /* storage mode runs no device-only baseline */
  printf("kvtier replay%s: %s\n",
         !o->ro.storage_mode         ? ""
         : o->ro.storage_no_promote ? " (storage mode: the engine owns the device pool; disk hits not promoted)"
                                     : " (storage mode: the engine owns the device pool)",
         t->source);
  printf("  model %s, %u tokens/block = %s of KV per block; payload %s", o->ro.model, t->block_tokens, bb,
         o->ro.payload_real ? "real" : "none (metadata only)");
  if (o->ro.payload_real) {
    char pb[32];
    human_bytes(pb, sizeof pb, (double)r->payload_block_bytes);
    printf(", %s per block (1/%u scale), disk backend %s", pb, r->payload_scale, r->disk_backend);
  }
  printf("\n  tiers: device %llu blocks (%s)%s, host %llu (%s), disk %llu (%s)\n  restore: %s%s\n\n",
         (unsigned long long)caps[0], tier[0], caps[0] ? "" : ": the running request",
         (unsigned long long)caps[1], tier[1], (unsigned long long)caps[2], tier[2],
         o->ro.restore == KVT_BENCH_RESTORE_PLAN ? "planner" : o->ro.restore == KVT_BENCH_RESTORE_ALL ? "all" : "none",
         o->ro.whole_ids ? "; partial ids counted as blocks" : "; full blocks only");
  printf("  requests          %10llu   (%.3f s wall, %.0f requests/s)\n", (unsigned long long)r->requests,
         r->wall_s, r->wall_s > 0 ? r->requests / r->wall_s : 0);
  printf("  blocks            %10llu   hit %llu: block hit ratio %.4f, token hit ratio %.4f\n",
         (unsigned long long)r->blocks_total, (unsigned long long)r->blocks_hit, ratio(r->blocks_hit, r->blocks_total),
         ratio(r->tokens_hit, r->tokens_total));
  printf("  hits by tier      device %llu (%.1f%%)  host %llu (%.1f%%)  disk %llu (%.1f%%)",
         (unsigned long long)r->hits_device, 100 * ratio(r->hits_device, r->blocks_hit),
         (unsigned long long)r->hits_host, 100 * ratio(r->hits_host, r->blocks_hit),
         (unsigned long long)r->hits_disk, 100 * ratio(r->hits_disk, r->blocks_hit));
  if (o->ro.remote_url)
    printf("  remote %llu (%.1f%%)", (unsigned long long)r->hits_remote, 100 * ratio(r->hits_remote, r->blocks_hit));
  printf("\n");
  if (o->ro.remote_url)
    printf("  remote tier       %llu blocks put, %llu fetched (%llu for restores), %llu misses, %llu corrupt, "
           "%llu errors, %llu timeouts\n",
           (unsigned long long)st->blocks_h2remote, (unsigned long long)st->blocks_remote2h,
           (unsigned long long)r->blocks_from_remote, (unsigned long long)st->remote_misses,
           (unsigned long long)st->remote_corrupt, (unsigned long long)st->remote_errors,
           (unsigned long long)st->remote_timeouts);
  printf("  blocks restored   %10llu   (%llu reused on device, %llu loaded, of which %llu from disk)\n",
         (unsigned long long)r->blocks_restored, (unsigned long long)r->blocks_reused,
         (unsigned long long)r->blocks_loaded, (unsigned long long)r->blocks_from_disk);
  printf("  blocks recomputed %10llu   (%llu requests longer than the device tier; %llu loads failed)\n",
         (unsigned long long)r->blocks_recomputed, (unsigned long long)r->truncated_requests,
         (unsigned long long)r->blocks_load_failed);
  if (r->restores_clipped)
    printf("  restores clipped  %10llu   (more disk hits than host slots to stage them)\n",
           (unsigned long long)r->restores_clipped);
  printf("  planner decisions recompute %llu, restore %llu, split %llu\n", (unsigned long long)r->decisions[0],
         (unsigned long long)r->decisions[1], (unsigned long long)r->decisions[2]);
  printf("  evictions         device %llu, host %llu, disk %llu\n", (unsigned long long)st->evictions_device,
         (unsigned long long)st->evictions_host, (unsigned long long)st->evictions_disk);
  printf("\n  moved (KV bytes at the model's block size%s):\n", o->ro.payload_real ? "; in brackets, as replayed" : "");
  print_path("device -> host", st->blocks_d2h, st->blocks_d2h * mb, st->bytes_d2h, o->ro.payload_real);
  print_path("host -> device", st->blocks_h2d, st->blocks_h2d * mb, st->bytes_h2d, o->ro.payload_real);
  print_path("host -> disk", st->blocks_h2disk, st->blocks_h2disk * mb, st->bytes_h2disk, o->ro.payload_real);
  print_path("disk -> host", st->blocks_disk2h, st->blocks_disk2h * mb, st->bytes_disk2h, o->ro.payload_real);
  if (o->ro.payload_real)
    printf("  restored blocks verified %llu, corrupt %llu; io errors %llu, checksum failures %llu\n",
           (unsigned long long)r->payload_verified, (unsigned long long)r->payload_corrupt,
           (unsigned long long)st->io_errors, (unsigned long long)st->checksum_failures);
  printf("\n");
  kvt_bench_hw_print(stdout, "  ", &o->ro.hw);
  printf("  estimated TTFT (cost model)                 p50        p99       mean   block hits\n");
  printf("  %-40s %9.4f s %9.4f s %9.4f s   %.4f\n", "kvtier (these tiers)", r->ttft_p50_s, r->ttft_p99_s,
         r->ttft_mean_s, ratio(r->blocks_hit, r->blocks_total));
  if (dev_base)
    printf("  %-40s %9.4f s %9.4f s %9.4f s   %.4f\n", "device-only prefix cache (same device)",
           r->ttft_device_only_p50_s, r->ttft_device_only_p99_s, r->ttft_device_only_mean_s,
           ratio(r->device_only_blocks_hit, r->blocks_total));
  printf("  %-40s %9.4f s %9.4f s %9.4f s   %.4f\n", "always recompute", r->ttft_recompute_p50_s,
         r->ttft_recompute_p99_s, r->ttft_recompute_mean_s, 0.0);
  printf("\n");
  verdict_line("verdict: kvtier TTFT p50", r->ttft_p50_s, r->ttft_device_only_p50_s, r->ttft_recompute_p50_s,
               dev_base);
  verdict_line("         kvtier TTFT p99", r->ttft_p99_s, r->ttft_device_only_p99_s, r->ttft_recompute_p99_s,
               dev_base);
}

/* Both modes on the same trace and capacities. */
static void print_side_by_side(const kvt_bench_replay_result r[2]) {
  printf("\nboth modes, same trace and capacities:\n");
  printf("  %-8s %16s %16s %12s %12s %12s\n", "mode", "block hit ratio", "token hit ratio", "hits device",
         "hits host", "hits disk");
  static const char *name[2] = {"owner", "storage"};
  for (int m = 0; m < 2; m++)
    printf("  %-8s %16.6f %16.6f %12llu %12llu %12llu\n", name[m], ratio(r[m].blocks_hit, r[m].blocks_total),
           ratio(r[m].tokens_hit, r[m].tokens_total), (unsigned long long)r[m].hits_device,
           (unsigned long long)r[m].hits_host, (unsigned long long)r[m].hits_disk);
  printf("  hit blocks %s (owner %llu, storage %llu of %llu)\n",
         r[0].blocks_hit == r[1].blocks_hit ? "agree" : "differ", (unsigned long long)r[0].blocks_hit,
         (unsigned long long)r[1].blocks_hit, (unsigned long long)r[0].blocks_total);
}

/* ---- multi-node replay ---- */

/* Node k of n in a child process: its result comes back through fd. */
static void node_child(const kvt_bench_trace *t, kvt_bench_replay_opts ro, uint32_t k, uint32_t n, int fd) {
  ro.node = k;
  ro.nodes = n;
  ro.progress = NULL;
  ro.disk_path = NULL; /* a temporary file per node */
  ro.device_only_baseline = 0;
  static kvt_bench_replay_result r;
  char err[256] = "";
  int rc = kvt_bench_replay_run(t, &ro, &r, err, sizeof err);
  if (rc) fprintf(stderr, "kvtier-bench replay: node %u: %s\n", k, err);
  ssize_t w = rc ? -1 : write(fd, &r, sizeof r);
  _exit(w == (ssize_t)sizeof r ? 0 : 1);
}

typedef struct fleet {
  uint64_t requests, blocks_total, blocks_hit, hits[4], from_remote, corrupt, verified;
  uint64_t to_remote, remote_errors, puts_skipped;
  double ttft_sum, ttft_rc_sum, ttft_p50_max, wall_s;
} fleet;

/* Runs n nodes at once (one process each) and sums their figures. */
static int run_fleet(const kvt_bench_trace *t, const kvt_bench_replay_opts *ro, uint32_t n, fleet *f) {
  memset(f, 0, sizeof *f);
  int fds[64];
  pid_t pids[64];
  for (uint32_t k = 0; k < n; k++) {
    int p[2];
    if (pipe(p) != 0) return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -errno;
    if (pid == 0) {
      close(p[0]);
      node_child(t, *ro, k, n, p[1]);
    }
    close(p[1]);
    fds[k] = p[0];
    pids[k] = pid;
  }
  int rc = 0;
  for (uint32_t k = 0; k < n; k++) {
    static kvt_bench_replay_result r;
    size_t got = 0;
    while (got < sizeof r) {
      ssize_t m = read(fds[k], (char *)&r + got, sizeof r - got);
      if (m <= 0) break;
      got += (size_t)m;
    }
    close(fds[k]);
    int status = 0;
    waitpid(pids[k], &status, 0);
    if (got != sizeof r || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      rc = -EIO;
      continue;
    }
    f->requests += r.requests;
    f->blocks_total += r.blocks_total;
    f->blocks_hit += r.blocks_hit;
    f->hits[0] += r.hits_device;
    f->hits[1] += r.hits_host;
    f->hits[2] += r.hits_disk;
    f->hits[3] += r.hits_remote;
    f->from_remote += r.blocks_from_remote;
    f->corrupt += r.payload_corrupt;
    f->verified += r.payload_verified;
    f->to_remote += r.st.blocks_h2remote;
    f->remote_errors += r.st.remote_errors + r.st.remote_timeouts;
    f->puts_skipped += r.st.remote_puts_skipped;
    f->ttft_sum += r.ttft_mean_s * (double)r.requests;
    f->ttft_rc_sum += r.ttft_recompute_mean_s * (double)r.requests;
    if (r.ttft_p50_s > f->ttft_p50_max) f->ttft_p50_max = r.ttft_p50_s;
    if (r.wall_s > f->wall_s) f->wall_s = r.wall_s;
  }
  return rc;
}

static void print_fleet(const char *name, const fleet *f) {
  double req = f->requests ? (double)f->requests : 1;
  printf("  %-14s %10.4f %10llu %10llu %10llu %10llu %12.4f %12.4f %12.4f %8.1f\n", name,
         ratio(f->blocks_hit, f->blocks_total), (unsigned long long)f->hits[0], (unsigned long long)f->hits[1],
         (unsigned long long)f->hits[2], (unsigned long long)f->hits[3], f->ttft_sum / req, f->ttft_p50_max,
         f->ttft_rc_sum / req, f->wall_s);
}

static int multi_node(const kvt_bench_trace *t, replay_cli *o) {
  if (!o->ro.remote_url || !o->ro.payload_real) {
    fprintf(stderr, "kvtier-bench replay: --nodes needs --remote URL and --payload real\n");
    return 2;
  }
  fleet shared, alone;
  printf("kvtier multi-node replay: %s, %u nodes, request i on node i %% %u\n", t->source, o->nodes, o->nodes);
  printf("  each node: device %llu, host %llu, disk %llu blocks; %s; shared tier %s\n",
         (unsigned long long)o->ro.device_blocks, (unsigned long long)o->ro.host_blocks,
         (unsigned long long)o->ro.disk_blocks, o->ro.write_through ? "write-through" : "write-back",
         o->ro.remote_url);
  int rc = run_fleet(t, &o->ro, o->nodes, &shared);
  kvt_bench_replay_opts none = o->ro;
  none.remote_url = NULL;
  if (rc == 0) rc = run_fleet(t, &none, o->nodes, &alone);
  if (rc) {
    fprintf(stderr, "kvtier-bench replay: a node failed (%s)\n", kvt_strerror(rc));
    return 1;
  }
  printf("\n  %-14s %10s %10s %10s %10s %10s %12s %12s %12s %8s\n", "", "hit ratio", "device", "host", "disk",
         "remote", "TTFT mean s", "p50 max s", "recompute s", "wall s");
  print_fleet("shared tier", &shared);
  print_fleet("no shared", &alone);
  printf("\n  shared/no-shared: hit ratio %.3fx, mean TTFT %.3fx (estimates of the cost model)\n",
         ratio(shared.blocks_hit, shared.blocks_total) / (ratio(alone.blocks_hit, alone.blocks_total) > 0 ? ratio(alone.blocks_hit, alone.blocks_total) : 1),
         alone.ttft_sum > 0 ? shared.ttft_sum / alone.ttft_sum : 0);
  printf("  remote: %llu blocks put (%llu skipped while puts were busy), %llu fetched for restores, %llu errors;\n"
         "  restored payload verified %llu, corrupt %llu\n",
         (unsigned long long)shared.to_remote, (unsigned long long)shared.puts_skipped, (unsigned long long)shared.from_remote,
         (unsigned long long)shared.remote_errors, (unsigned long long)(shared.verified + alone.verified),
         (unsigned long long)(shared.corrupt + alone.corrupt));
  return shared.corrupt + alone.corrupt ? 1 : 0;
}

static int replay_main(int argc, char **argv) {
  static replay_cli o;
  memset(&o, 0, sizeof o);
  kvt_bench_source_init(&o.src);
  kvt_bench_replay_opts_init(&o.ro);
  int rc = parse(argc, argv, &o);
  if (rc) return rc == 1 ? 0 : rc;
  kvt_bench_trace t;
  if (kvt_bench_source_load(&o.src, "replay", &t)) return 1;
  uint32_t bt = t.block_tokens;
  if (!o.have_dev) o.ro.device_blocks = DEFAULT_DEVICE_TOKENS / bt;
  if (!o.have_host) o.ro.host_blocks = DEFAULT_HOST_TOKENS / bt;
  if (!o.have_disk) o.ro.disk_blocks = DEFAULT_DISK_TOKENS / bt;
  o.ro.progress = progress;
  char prefix[64];
  if (o.ro.remote_url && !o.ro.remote_key_prefix) {
    /* This run's own keys: another run's blocks (an earlier replay of the
     * same trace) would otherwise be hits. */
    snprintf(prefix, sizeof prefix, "kvtb:%ld.%d:", (long)time(NULL), (int)getpid());
    o.ro.remote_key_prefix = prefix;
  }
  if (o.nodes > 1) {
    rc = multi_node(&t, &o);
    kvt_bench_trace_free(&t);
    return rc;
  }
  static kvt_bench_replay_result r[2];
  for (int m = 0; m < 2; m++) {
    if ((m == 0 && o.mode == MODE_STORAGE) || (m == 1 && o.mode == MODE_OWNER)) continue;
    o.ro.storage_mode = m;
    if (m == 1) o.ro.payload_real = 1; /* storage mode moves real bytes */
    char err[256] = "";
    rc = kvt_bench_replay_run(&t, &o.ro, &r[m], err, sizeof err);
    kvt_bench_progress_done();
    if (rc) {
      fprintf(stderr, "kvtier-bench replay%s: %s\n", m ? " (storage mode)" : "", err);
      kvt_bench_trace_free(&t);
      return 1;
    }
    if (o.json) print_json(&t, &o, &r[m]);
    else print_human(&t, &o, &r[m]);
  }
  if (o.mode == MODE_BOTH && !o.json) print_side_by_side(r);
  kvt_bench_trace_free(&t);
  return 0;
}

KVT_BENCH_COMMAND(replay, "replay a trace or the multiround workload through the engine (hits, TTFT)",
                  replay_main)
