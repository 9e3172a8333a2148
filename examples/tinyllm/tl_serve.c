/* tinyllm-serve: many conversations, several rounds each, served through
 * kvtier. Between rounds a conversation is idle and its KV is offloaded
 * (device -> host -> disk as capacity demands); when it returns the
 * planner decides what to restore, the rest is recomputed, and the answer
 * is generated greedily. One line per request. --bench runs the benches
 * (tl_bench.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_serve.h"

static void usage(void) {
  fprintf(stderr,
          "usage: tinyllm-serve [options]\n"
          "  --preset tiny|default|large   model (default)\n"
          "  --threads N                   compute threads (2); results do not depend on it\n"
          "  --block-tokens N              KV block tokens (16)\n"
          "  --convs N --rounds N          conversations and rounds each (6, 3)\n"
          "  --first-msg N --msg N --gen N tokens of the first / later messages, answer (384, 64, 8)\n"
          "  --dev-slots N                 KV pool slots, kvtier's device tier (128)\n"
          "  --host-blocks N               host tier blocks (96)\n"
          "  --disk PATH --disk-blocks N   disk tier (none; 4096)\n"
          "  --throttle-host MBps          emulate a slower host->device link (off)\n"
          "  --host-lat-us US              its latency per load (20)\n"
          "  --throttle-disk MBps          emulate a slower disk (off)\n"
          "  --disk-lat-us US              its latency per load (100)\n"
          "  --policy plan|restore|recompute  (plan)\n"
          "  --seed N                      message tokens (1)\n"
          "  --bench ttft|grid|all         benches instead of the serving loop\n"
          "  --ttft-preset NAME            model of the TTFT bench (large)\n"
          "  --ttft-ctx a,b,c              its contexts (1024,4096,16384)\n"
          "  --grid-ctx a,b,...            decision grid contexts (256,512,1024,2048)\n"
          "  --grid-mbps a,b,...           its host link throttles, 0 = none (0,32,16,8,4)\n"
          "  --grid-warmup N               cells before calibration counts (3)\n");
}

static uint32_t parse_list_u32(const char *s, uint32_t *out) {
  uint32_t n = 0;
  while (s && *s && n < TL_MAX_LIST) {
    out[n++] = (uint32_t)strtoul(s, (char **)&s, 10);
    if (*s == ',') s++;
  }
  return n;
}

static uint32_t parse_list_f64(const char *s, double *out) {
  uint32_t n = 0;
  while (s && *s && n < TL_MAX_LIST) {
    out[n++] = strtod(s, (char **)&s);
    if (*s == ',') s++;
  }
  return n;
}

static void opts_default(tl_opts *o) {
  memset(o, 0, sizeof *o);
  o->preset = "default";
  o->threads = 2;
  o->block_tokens = 16;
  o->chunk = 256;
  o->convs = 6;
  o->rounds = 3;
  o->first_msg = 384;
  o->msg = 64;
  o->gen = 8;
  o->dev_slots = 128;
  o->host_blocks = 96;
  o->disk_blocks = 4096;
  o->thr.host_lat_s = 20e-6;
  o->thr.disk_lat_s = 100e-6;
  o->seed = 1;
  o->ttft_preset = "large";
  o->n_ttft_ctx = parse_list_u32("1024,4096,16384", o->ttft_ctx);
  o->n_grid_ctx = parse_list_u32("256,512,1024,2048", o->grid_ctx);
  o->n_grid_mbps = parse_list_f64("0,32,16,8,4", o->grid_mbps);
  o->grid_warmup = 3;
}

static int parse_policy(const char *s, tl_policy *p) {
  if (strcmp(s, "plan") == 0) *p = TL_POLICY_PLAN;
  else if (strcmp(s, "restore") == 0) *p = TL_POLICY_RESTORE;
  else if (strcmp(s, "recompute") == 0) *p = TL_POLICY_RECOMPUTE;
  else return -1;
  return 0;
}

static int parse_args(int argc, char **argv, tl_opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
#define U32(name, field) else if (strcmp(a, name) == 0 && v) o->field = (uint32_t)strtoul(v, NULL, 10)
#define U64(name, field) else if (strcmp(a, name) == 0 && v) o->field = strtoull(v, NULL, 10)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
    else if (strcmp(a, "--preset") == 0 && v) o->preset = v;
    U32("--threads", threads);
    U32("--block-tokens", block_tokens);
    U32("--chunk", chunk);
    U32("--convs", convs);
    U32("--rounds", rounds);
    U32("--first-msg", first_msg);
    U32("--msg", msg);
    U32("--gen", gen);
    U32("--dev-slots", dev_slots);
    U64("--host-blocks", host_blocks);
    U64("--disk-blocks", disk_blocks);
    U64("--seed", seed);
    U32("--grid-warmup", grid_warmup);
    else if (strcmp(a, "--disk") == 0 && v) o->disk_path = v;
    else if (strcmp(a, "--throttle-host") == 0 && v) o->thr.host_bps = strtod(v, NULL) * 1e6;
    else if (strcmp(a, "--host-lat-us") == 0 && v) o->thr.host_lat_s = strtod(v, NULL) * 1e-6;
    else if (strcmp(a, "--throttle-disk") == 0 && v) o->thr.disk_bps = strtod(v, NULL) * 1e6;
    else if (strcmp(a, "--disk-lat-us") == 0 && v) o->thr.disk_lat_s = strtod(v, NULL) * 1e-6;
    else if (strcmp(a, "--policy") == 0 && v) {
      if (parse_policy(v, &o->policy)) return -1;
    } else if (strcmp(a, "--bench") == 0 && v) o->bench = v;
    else if (strcmp(a, "--ttft-preset") == 0 && v) o->ttft_preset = v;
    else if (strcmp(a, "--ttft-ctx") == 0 && v) o->n_ttft_ctx = parse_list_u32(v, o->ttft_ctx);
    else if (strcmp(a, "--grid-ctx") == 0 && v) o->n_grid_ctx = parse_list_u32(v, o->grid_ctx);
    else if (strcmp(a, "--grid-mbps") == 0 && v) o->n_grid_mbps = parse_list_f64(v, o->grid_mbps);
    else return -1;
#undef U32
#undef U64
    i += used;
  }
  return 0;
}

int tl_opts_config(const tl_opts *o, const char *preset, uint32_t max_ctx, tl_config *cfg) {
  if (tl_config_preset(preset, cfg)) return -EINVAL;
  cfg->threads = o->threads;
  cfg->block_tokens = o->block_tokens;
  cfg->chunk = o->chunk;
  if (max_ctx) cfg->max_ctx = max_ctx;
  return 0;
}

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void tl_fill_tokens(uint32_t *tok, size_t n, uint32_t vocab, uint64_t seed, uint32_t conv, uint32_t round) {
  uint64_t s = mix(seed ^ mix(((uint64_t)conv << 32) | round));
  for (size_t i = 0; i < n; i++) tok[i] = (uint32_t)((s = mix(s)) % vocab);
}

const char *tl_decision_name(kvt_decision d) {
  return d == KVT_DECIDE_RESTORE ? "restore" : d == KVT_DECIDE_SPLIT ? "split" : "recompute";
}

static void print_header(void) {
  printf("%4s %3s %6s %5s | %-27s | %-24s | %9s %9s %s\n", "conv", "rnd", "ctx", "blk",
         "plan: dev/host/disk  k dec", "got: dev host disk recomp", "est_ms", "ttft_ms", "tok");
}

static void print_turn(uint32_t conv, uint32_t round, const tl_turn *t) {
  const kvt_plan *p = &t->plan;
  uint32_t host = t->info.n_loading - t->info.n_from_disk;
  printf("%4u %3u %6llu %5u | %4u/%4u/%4u %4u %-9s | %4u %4u %4u %7llu | %9.1f %9.1f %u\n", conv, round,
         (unsigned long long)t->ctx_tokens, t->n_blocks, p->n_device, p->n_host, p->n_disk, t->restore_asked,
         tl_decision_name(p->decision), t->info.n_device_hits, host, t->info.n_from_disk,
         (unsigned long long)t->recomputed, p->est_ttft_s * 1e3, t->ttft_s * 1e3, t->first_token);
}

static void print_stats(kvt_cache *c) {
  kvt_stats st = {.size = sizeof st};
  if (kvt_get_stats(c, &st)) return;
  printf("kvtier: hits dev/host/disk %llu/%llu/%llu, misses %llu, d2h %llu h2d %llu h2disk %llu disk2h %llu "
         "blocks, evictions dev/host/disk %llu/%llu/%llu, mismatches %llu\n",
         (unsigned long long)st.hits_device, (unsigned long long)st.hits_host, (unsigned long long)st.hits_disk,
         (unsigned long long)st.misses, (unsigned long long)st.blocks_d2h, (unsigned long long)st.blocks_h2d,
         (unsigned long long)st.blocks_h2disk, (unsigned long long)st.blocks_disk2h,
         (unsigned long long)st.evictions_device, (unsigned long long)st.evictions_host,
         (unsigned long long)st.evictions_disk, (unsigned long long)st.verify_mismatches);
}

static int serve(const tl_opts *o) {
  uint32_t max_ctx = o->first_msg + (o->rounds ? o->rounds - 1 : 0) * o->msg + o->rounds * o->gen + 16;
  tl_config cfg;
  if (tl_opts_config(o, o->preset, max_ctx, &cfg)) return -EINVAL;
  tl_model *m = NULL;
  tl_engine *e = NULL;
  tl_conv *cv = calloc(o->convs ? o->convs : 1, sizeof *cv);
  uint32_t *msg = calloc(o->first_msg > o->msg ? o->first_msg : o->msg, sizeof *msg);
  int rc = !cv || !msg ? -ENOMEM : tl_model_create(&cfg, &m);
  tl_engine_opts eo = {o->dev_slots, o->host_blocks, o->disk_path, o->disk_blocks, o->thr, 128};
  if (rc == 0) rc = tl_engine_open(m, &eo, &e);
  if (rc == 0) {
    kvt_hw_desc hw;
    kvt_get_calibrated_hw(tl_engine_cache(e), &hw);
    printf("tinyllm %s: %u layers, dim %u, %u/%u heads, ffn %u, vocab %u, %.1fM params; kv %zu B/token; "
           "measured %.1f GFLOP/s, copy %.2f GB/s; disk %s\n",
           cfg.name, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab,
           kvt_model_params(tl_engine_model_desc(e)) / 1e6,
           (size_t)kvt_model_kv_bytes_per_token(tl_engine_model_desc(e)), hw.flops_per_gpu * hw.mfu / 1e9,
           hw.device_host.bytes_per_s / 1e9, kvt_disk_backend_name(tl_engine_cache(e)));
    print_header();
  }
  double sum_ttft = 0, sum_est = 0;
  for (uint32_t r = 0; rc == 0 && r < o->rounds; r++)
    for (uint32_t i = 0; rc == 0 && i < o->convs; i++) {
      uint32_t n = r == 0 ? o->first_msg : o->msg;
      tl_fill_tokens(msg, n, cfg.vocab, o->seed, i, r);
      tl_turn t;
      rc = tl_engine_turn(e, &cv[i], msg, n, o->gen, o->policy, 1, NULL, &t);
      if (rc == 0) {
        print_turn(i, r, &t);
        sum_ttft += t.ttft_s;
        sum_est += t.plan.est_ttft_s;
        rc = tl_engine_offload(e, &cv[i]); /* idle until its next round */
      }
    }
  if (rc == 0) {
    printf("total ttft %.1f ms (planner estimated %.1f ms)\n", sum_ttft * 1e3, sum_est * 1e3);
    print_stats(tl_engine_cache(e));
  } else {
    fprintf(stderr, "tinyllm-serve: %s\n", kvt_strerror(rc));
  }
  for (uint32_t i = 0; cv && i < o->convs; i++) tl_conv_free(&cv[i]);
  free(cv);
  free(msg);
  tl_engine_close(e);
  tl_model_free(m);
  return rc;
}

int main(int argc, char **argv) {
  tl_opts o;
  opts_default(&o);
  int rc = parse_args(argc, argv, &o);
  if (rc) {
    usage();
    return rc > 0 ? 0 : 2;
  }
  rc = o.bench ? tl_bench_main(&o) : serve(&o);
  return rc ? 1 : 0;
}
