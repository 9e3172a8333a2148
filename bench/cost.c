/* kvtier-bench cost: restore-vs-recompute figures from the library's own cost
 * model (include/kvtier/cost.h), for one request (--tokens) or as a table
 * over context lengths and links. The formulas are in docs/cost-model.md. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvtier/kvtier.h"

#define COST_BLOCK_TOKENS 16u            /* the library's default block size */
#define COST_MAX_TOKENS (16ull << 20)    /* keeps the planner's tier array small */

typedef struct cost_link {
  const char *name, *label;
  kvt_link link;
} cost_link;

/* Effective rates of common links; NVMe drives are the slower leg of a
 * disk restore, so their columns model the KV crossing that one drive. */
static const cost_link table_links[] = {
    {"pcie4", "PCIe4 25 GB/s", {25e9, 10e-6}},
    {"pcie5", "PCIe5 50 GB/s", {50e9, 10e-6}},
    {"nvme4", "NVMe4 6.5 GB/s", {6.5e9, 100e-6}},
    {"nvme5", "NVMe5 13 GB/s", {13e9, 100e-6}},
};
#define N_TABLE_LINKS (sizeof table_links / sizeof table_links[0])

typedef struct cost_opts {
  const char *model;
  uint64_t tokens, cached;
  int have_tokens, have_cached, have_link, json;
  kvt_hw_desc hw;
} cost_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvtier-bench cost --model NAME [--tokens N [--cached K]] [hardware] [--json]\n\n"
          "  --model NAME          a preset; 'list' prints them\n"
          "  --tokens N            one request of N tokens (else: a table over 1k..128k tokens)\n"
          "  --cached K            of which the first K are cached on the host tier (N)\n"
          "  --json                one JSON object\n\n"
          "%s"
          "cost copies, then computes, unless --overlap; --link-gbs adds a table column.\n",
          kvt_bench_hw_usage);
}

static int bad_arg(const char *opt, const char *val, const char *why) {
  if (val)
    fprintf(stderr, "kvtier-bench cost: %s '%s': %s\n", opt, val, why);
  else
    fprintf(stderr, "kvtier-bench cost: %s: %s\n", opt, why);
  return 2;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  if (!s || !*s || *s == '-') return -EINVAL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end) return -EINVAL;
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, cost_opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *eq = strchr(a, '=');
    char opt[32];
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    if (len >= sizeof opt) return bad_arg("option", a, "unknown");
    memcpy(opt, a, len);
    opt[len] = '\0';
    if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
      usage(stdout);
      return 1;
    }
    if (!strcmp(opt, "--json")) { o->json = 1; continue; }
    if (kvt_bench_hw_flag(opt) == 1) {
      kvt_bench_hw_option("cost", opt, NULL, &o->hw);
      continue;
    }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!v) return bad_arg(opt, NULL, "needs a value");
    uint64_t u = 0;
    if (!strcmp(opt, "--model")) {
      o->model = v;
    } else if (!strcmp(opt, "--tokens")) {
      if (parse_u64(v, &u) || u == 0) return bad_arg(opt, v, "expected a token count >= 1");
      if (u > COST_MAX_TOKENS) return bad_arg(opt, v, "at most 16M tokens");
      o->tokens = u;
      o->have_tokens = 1;
    } else if (!strcmp(opt, "--cached")) {
      if (parse_u64(v, &u)) return bad_arg(opt, v, "expected a token count");
      o->cached = u;
      o->have_cached = 1;
    } else if (kvt_bench_hw_flag(opt) == 2) {
      if (kvt_bench_hw_option("cost", opt, v, &o->hw)) return 2;
      if (!strcmp(opt, "--link-gbs")) o->have_link = 1;
    } else {
      return bad_arg("option", a, "unknown (see kvtier-bench cost --help)");
    }
  }
  if (o->have_cached && !o->have_tokens) return bad_arg("--cached", NULL, "needs --tokens");
  if (o->have_cached && o->cached > o->tokens) return bad_arg("--cached", NULL, "exceeds --tokens");
  if (!o->have_cached) o->cached = o->tokens;
  return 0;
}

static void list_presets(FILE *f) {
  fprintf(f, "%-14s %6s %6s %9s %8s %12s %10s\n", "preset", "layers", "hidden", "heads/kv", "head_dim",
          "KV B/token", "params");
  for (size_t i = 0; kvt_model_preset_name(i); i++) {
    kvt_model_desc m;
    kvt_model_preset(kvt_model_preset_name(i), &m);
    char heads[24];
    if (m.mla_latent_dim)
      snprintf(heads, sizeof heads, "%u/MLA", m.num_heads);
    else
      snprintf(heads, sizeof heads, "%u/%u", m.num_heads, m.num_kv_heads);
    fprintf(f, "%-14s %6u %6u %9s %8u %12llu %9.2fB\n", m.name, m.num_layers, m.hidden_size, heads,
            m.head_dim, (unsigned long long)kvt_model_kv_bytes_per_token(&m), kvt_model_params(&m) / 1e9);
  }
}

static const char *decision_name(kvt_decision d) {
  return d == KVT_DECIDE_RESTORE ? "restore" : d == KVT_DECIDE_SPLIT ? "split" : "recompute";
}

static double rate_of(const kvt_hw_desc *hw) { return hw->num_gpus * hw->flops_per_gpu * hw->mfu; }

/* The planner's view of an n-token request whose first `cached` tokens sit
 * on the host tier behind hw's device_host link. */
static int plan_host_prefix(const kvt_model_desc *m, const kvt_hw_desc *hw, uint64_t n, uint64_t cached,
                            kvt_plan *p) {
  uint32_t n_prefix = (uint32_t)(cached / COST_BLOCK_TOKENS);
  uint8_t *tiers = malloc(n_prefix ? n_prefix : 1);
  if (!tiers) return -ENOMEM;
  memset(tiers, KVT_TIER_HOST, n_prefix);
  memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  int rc = kvt_cost_plan(m, hw, COST_BLOCK_TOKENS, n, n_prefix, tiers, p);
  free(tiers);
  return rc;
}

static void json_gbs(const char *key, double bytes_per_s) {
  if (isinf(bytes_per_s))
    printf("\"%s\":null", key);
  else
    printf("\"%s\":%.6g", key, bytes_per_s / 1e9);
}

static int one_request(const kvt_model_desc *m, const cost_opts *o) {
  const kvt_hw_desc *hw = &o->hw;
  uint64_t bpt = kvt_model_kv_bytes_per_token(m), kv_bytes = o->cached * bpt;
  double transfer = kvt_cost_transfer_s(hw, kv_bytes, 0);
  double linear, flops = kvt_cost_recompute_flops(m, 0, o->tokens, &linear);
  double recompute = flops / rate_of(hw), breakeven;
  kvt_plan p;
  int rc = plan_host_prefix(m, hw, o->tokens, o->cached, &p);
  if (!rc) rc = kvt_cost_breakeven(m, hw, o->tokens, o->cached, &breakeven);
  if (rc) {
    fprintf(stderr, "kvtier-bench cost: %s\n", kvt_strerror(rc));
    return 1;
  }
  uint64_t restore_tokens = (uint64_t)p.restore_blocks * p.block_tokens;
  if (o->json) {
    printf("{\"model\":\"%s\",\"tokens\":%llu,\"cached_tokens\":%llu,\"block_tokens\":%u,"
           "\"kv_bytes_per_token\":%llu,\"kv_bytes\":%llu,\"params\":%.6g,"
           "\"link_gbs\":%.6g,\"link_latency_us\":%.6g,\"flops_per_s\":%.6g,\"overlap\":%s,"
           "\"transfer_s\":%.6g,\"recompute_flops_linear\":%.6g,\"recompute_flops\":%.6g,"
           "\"recompute_s\":%.6g,\"restore_s\":%.6g,\"decision\":\"%s\",\"restore_tokens\":%llu,"
           "\"recompute_tokens\":%llu,\"ttft_s\":%.6g,",
           m->name, (unsigned long long)o->tokens, (unsigned long long)o->cached, p.block_tokens,
           (unsigned long long)bpt, (unsigned long long)kv_bytes, kvt_model_params(m),
           hw->device_host.bytes_per_s / 1e9, hw->device_host.latency_s * 1e6, rate_of(hw),
           hw->overlap ? "true" : "false", transfer, linear, flops, recompute, p.est_restore_all_s,
           decision_name(p.decision), (unsigned long long)restore_tokens,
           (unsigned long long)p.recompute_tokens, p.est_ttft_s);
    json_gbs("breakeven_gbs", breakeven);
    printf("}\n");
    return 0;
  }
  printf("model            %s: %u layers, %u heads, ", m->name, m->num_layers, m->num_heads);
  if (m->mla_latent_dim)
    printf("MLA latent %u + rope %u", m->mla_latent_dim, m->mla_rope_dim);
  else
    printf("%u KV heads x %u", m->num_kv_heads, m->head_dim);
  printf(", %.4g B params\n", kvt_model_params(m) / 1e9);
  printf("hardware         %u x %.4g TFLOP/s at mfu %.2f = %.4g TFLOP/s; link %.1f GB/s + %.0f us; "
         "pipelining %s\n",
         hw->num_gpus, hw->flops_per_gpu / 1e12, hw->mfu, rate_of(hw) / 1e12,
         hw->device_host.bytes_per_s / 1e9, hw->device_host.latency_s * 1e6, hw->overlap ? "on" : "off");
  printf("request          %llu tokens, %llu cached on the host tier (blocks of %u)\n\n",
         (unsigned long long)o->tokens, (unsigned long long)o->cached, p.block_tokens);
  printf("KV bytes/token   %llu B\n", (unsigned long long)bpt);
  printf("KV bytes         %.3g GB (%llu B, the cached tokens)\n", kv_bytes / 1e9, (unsigned long long)kv_bytes);
  printf("transfer         %.3f s\n", transfer);
  printf("recompute FLOPs  %.3g linear + %.3g attention = %.3g\n", linear, flops - linear, flops);
  printf("recompute        %.3f s (all %llu tokens)\n", recompute, (unsigned long long)o->tokens);
  printf("restore          %.3f s (copy the usable prefix, compute the rest)\n", p.est_restore_all_s);
  printf("decision         %s: restore %llu tokens, recompute %llu; TTFT %.3f s\n", decision_name(p.decision),
         (unsigned long long)restore_tokens, (unsigned long long)p.recompute_tokens, p.est_ttft_s);
  if (isinf(breakeven))
    printf("break-even link  none: the latency alone costs more than the recompute it saves\n");
  else
    printf("break-even link  %.2f GB/s (restore wins on faster links)\n", breakeven / 1e9);
  return 0;
}

typedef struct cell {
  double ttft;
  kvt_decision decision;
  uint64_t restore_tokens;
} cell;

static int table(const kvt_model_desc *m, const cost_opts *o) {
  cost_link links[N_TABLE_LINKS + 1];
  size_t n_links = N_TABLE_LINKS;
  memcpy(links, table_links, sizeof table_links);
  static char custom_label[32];
  if (o->have_link) {
    snprintf(custom_label, sizeof custom_label, "link %.3g GB/s", o->hw.device_host.bytes_per_s / 1e9);
    links[n_links++] = (cost_link){"custom", custom_label, o->hw.device_host};
  }
  uint64_t bpt = kvt_model_kv_bytes_per_token(m);
  if (o->json) {
    printf("{\"model\":\"%s\",\"kv_bytes_per_token\":%llu,\"params\":%.6g,\"flops_per_s\":%.6g,"
           "\"overlap\":%s,\"block_tokens\":%u,\"links\":[",
           m->name, (unsigned long long)bpt, kvt_model_params(m), rate_of(&o->hw),
           o->hw.overlap ? "true" : "false", COST_BLOCK_TOKENS);
    for (size_t l = 0; l < n_links; l++)
      printf("%s{\"name\":\"%s\",\"gbs\":%.6g,\"latency_us\":%.6g}", l ? "," : "", links[l].name,
             links[l].link.bytes_per_s / 1e9, links[l].link.latency_s * 1e6);
    printf("],\"rows\":[");
  } else {
    printf("%s: %llu B/token KV, %.4g B params; %u x %.4g TFLOP/s at mfu %.2f; pipelining %s\n",
           m->name, (unsigned long long)bpt, kvt_model_params(m) / 1e9, o->hw.num_gpus,
           o->hw.flops_per_gpu / 1e12, o->hw.mfu, o->hw.overlap ? "on" : "off");
    printf("whole context cached behind each link; cells: est. TTFT in s and the planner's choice;\n"
           "even: the break-even bandwidth in GB/s, where restoring all equals recomputing all (%.0f us)\n\n",
           o->hw.device_host.latency_s * 1e6);
    /* 100 columns with the four standard links. */
    printf("%6s %6s %8s |", "ctx", "KV GB", "recomp s");
    for (size_t l = 0; l < n_links; l++) printf(" %-16s", links[l].label);
    printf("| %s\n", "even");
  }
  for (uint64_t n = 1024, row = 0; n <= 131072; n *= 2, row++) {
    double recompute = kvt_cost_compute_s(m, &o->hw, 0, n), breakeven;
    kvt_cost_breakeven(m, &o->hw, n, n, &breakeven);
    cell cells[N_TABLE_LINKS + 1];
    for (size_t l = 0; l < n_links; l++) {
      kvt_hw_desc hw = o->hw;
      hw.device_host = links[l].link;
      kvt_plan p;
      int rc = plan_host_prefix(m, &hw, n, n, &p);
      if (rc) {
        fprintf(stderr, "kvtier-bench cost: %s\n", kvt_strerror(rc));
        return 1;
      }
      cells[l] = (cell){p.est_ttft_s, p.decision, (uint64_t)p.restore_blocks * p.block_tokens};
    }
    if (o->json) {
      printf("%s{\"tokens\":%llu,\"kv_bytes\":%llu,\"recompute_s\":%.6g,", row ? "," : "",
             (unsigned long long)n, (unsigned long long)(n * bpt), recompute);
      json_gbs("breakeven_gbs", breakeven);
      printf(",\"cells\":[");
      for (size_t l = 0; l < n_links; l++)
        printf("%s{\"link\":\"%s\",\"ttft_s\":%.6g,\"decision\":\"%s\",\"restore_tokens\":%llu}",
               l ? "," : "", links[l].name, cells[l].ttft, decision_name(cells[l].decision),
               (unsigned long long)cells[l].restore_tokens);
      printf("]}");
      continue;
    }
    printf("%5lluk %6.2f %8.4f |", (unsigned long long)(n / 1024), n * bpt / 1e9, recompute);
    for (size_t l = 0; l < n_links; l++) {
      char what[16];
      if (cells[l].decision == KVT_DECIDE_SPLIT)
        snprintf(what, sizeof what, "split %2.0f%%", 100.0 * cells[l].restore_tokens / n);
      else
        snprintf(what, sizeof what, "%s", decision_name(cells[l].decision));
      printf(" %6.3f %-9s", cells[l].ttft, what);
    }
    if (isinf(breakeven))
      printf("|  never\n");
    else
      printf("| %6.2f\n", breakeven / 1e9);
  }
  if (o->json) printf("]}\n");
  return 0;
}

static int cost_main(int argc, char **argv) {
  cost_opts o;
  memset(&o, 0, sizeof o);
  kvt_hw_init(&o.hw);
  o.hw.overlap = 0; /* cost's figures copy, then compute, unless --overlap */
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc == 1 ? 0 : rc;
  if (!o.model) {
    fprintf(stderr, "kvtier-bench cost: --model is required\n\n");
    usage(stderr);
    return 2;
  }
  if (!strcmp(o.model, "list")) {
    list_presets(stdout);
    return 0;
  }
  kvt_model_desc m;
  if (kvt_model_preset(o.model, &m)) {
    fprintf(stderr, "kvtier-bench cost: unknown model '%s'; the presets are:\n\n", o.model);
    list_presets(stderr);
    return 2;
  }
  return o.have_tokens ? one_request(&m, &o) : table(&m, &o);
}

KVT_BENCH_COMMAND(cost, "restore-vs-recompute figures and tables from the cost model", cost_main)
