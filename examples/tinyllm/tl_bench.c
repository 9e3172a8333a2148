/* tinyllm-serve --bench: (1) time to first token with restore vs recompute
 * at a few context lengths; (2) the decision grid: for contexts x host-link
 * throttles, measure both, ask the planner first, and score its picks and
 * its regret against the oracle (the faster of what was measured).
 *
 * Each measurement is a real request: the request of ctx tokens is first
 * served with nothing cached (recompute: every token computed), its KV is
 * offloaded to the host tier, then the same request is served again,
 * restoring. The planner's plan is the one kvt_plan_request returned at
 * the start of the restoring turn, from the state the turn found. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_serve.h"

typedef struct pair_result {
  tl_turn rc, rs, pl; /* recompute, restore, plan (when it was a split) */
  int split_measured;
  int exact;          /* restore's first-token logits equal recompute's, bit for bit */
} pair_result;

static int measure_pair(tl_engine *e, const tl_config *cfg, uint32_t ctx, uint64_t seed, uint32_t tag,
                        float *lg_a, float *lg_b, pair_result *pr) {
  tl_conv cv = {0};
  uint32_t *msg = malloc(ctx * sizeof *msg);
  if (!msg) return -ENOMEM;
  tl_fill_tokens(msg, ctx, cfg->vocab, seed, tag, ctx);
  memset(pr, 0, sizeof *pr);
  int rc = tl_engine_turn(e, &cv, msg, ctx, 1, TL_POLICY_RECOMPUTE, 0, lg_a, &pr->rc);
  if (rc == 0) rc = tl_engine_offload(e, &(tl_conv){msg, ctx, ctx});
  if (rc == 0) rc = tl_engine_turn(e, &cv, msg, ctx, 1, TL_POLICY_RESTORE, 0, lg_b, &pr->rs);
  if (rc == 0) pr->exact = memcmp(lg_a, lg_b, cfg->vocab * sizeof *lg_a) == 0;
  uint32_t k = pr->rs.plan.restore_blocks, usable = pr->rs.restore_asked;
  if (rc == 0 && k > 0 && k < usable) {
    rc = tl_engine_offload(e, &(tl_conv){msg, ctx, ctx});
    if (rc == 0) rc = tl_engine_turn(e, &cv, msg, ctx, 1, TL_POLICY_PLAN, 0, lg_b, &pr->pl);
    pr->split_measured = rc == 0;
  }
  /* Leave nothing of this request cached for the next one. */
  if (rc == 0) rc = tl_engine_offload(e, &(tl_conv){msg, ctx, ctx});
  free(msg);
  return rc;
}

static int open_for(const tl_opts *o, const char *preset, uint32_t max_ctx, tl_model **m, tl_engine **e,
                    tl_config *cfg) {
  if (tl_opts_config(o, preset, max_ctx + 32, cfg)) return -EINVAL;
  int rc = tl_model_create(cfg, m);
  uint32_t blocks = (max_ctx + 32) / cfg->block_tokens + 4;
  /* Device and host tiers hold one request; the bench restores from host. */
  tl_engine_opts eo = {blocks, (uint64_t)blocks * 2, NULL, 0, {0, 20e-6, 0, 100e-6}, 256};
  if (rc == 0) rc = tl_engine_open(*m, &eo, e);
  if (rc == 0) {
    kvt_hw_desc hw;
    kvt_get_calibrated_hw(tl_engine_cache(*e), &hw);
    fprintf(stderr, "tinyllm %s: %u layers, dim %u, %u/%u heads, %.1fM params, kv %llu B/token; "
            "measured %.1f GFLOP/s, copy %.2f GB/s\n",
            cfg->name, cfg->n_layers, cfg->dim, cfg->n_heads, cfg->n_kv_heads,
            kvt_model_params(tl_engine_model_desc(*e)) / 1e6,
            (unsigned long long)kvt_model_kv_bytes_per_token(tl_engine_model_desc(*e)),
            hw.flops_per_gpu * hw.mfu / 1e9, hw.device_host.bytes_per_s / 1e9);
  }
  return rc;
}

static int bench_ttft(const tl_opts *o) {
  uint32_t max_ctx = 0;
  for (uint32_t i = 0; i < o->n_ttft_ctx; i++) max_ctx = o->ttft_ctx[i] > max_ctx ? o->ttft_ctx[i] : max_ctx;
  tl_config cfg;
  tl_model *m = NULL;
  tl_engine *e = NULL;
  int rc = open_for(o, o->ttft_preset, max_ctx, &m, &e, &cfg);
  float *a = calloc(cfg.vocab, sizeof *a), *b = calloc(cfg.vocab, sizeof *b);
  if (rc == 0 && (!a || !b)) rc = -ENOMEM;
  if (rc == 0) {
    printf("\nTTFT, restore from host vs recompute (tinyllm %s, %u threads, unthrottled)\n", cfg.name, cfg.threads);
    printf("%7s | %12s %12s %8s | %12s %12s | %9s %s\n", "ctx", "recompute_ms", "restore_ms", "speedup",
           "est_rc_ms", "est_rs_ms", "restored", "exact");
  }
  for (uint32_t i = 0; rc == 0 && i < o->n_ttft_ctx; i++) {
    pair_result pr;
    fprintf(stderr, "  ttft ctx %u ...\n", o->ttft_ctx[i]);
    rc = measure_pair(e, &cfg, o->ttft_ctx[i], o->seed, 1000 + i, a, b, &pr);
    if (rc) break;
    printf("%7u | %12.1f %12.1f %7.1fx | %12.1f %12.1f | %4u blks %s\n", o->ttft_ctx[i], pr.rc.ttft_s * 1e3,
           pr.rs.ttft_s * 1e3, pr.rc.ttft_s / pr.rs.ttft_s, pr.rs.plan.est_recompute_all_s * 1e3,
           pr.rs.plan.est_restore_all_s * 1e3, pr.rs.n_ready, pr.exact ? "yes" : "NO");
    fflush(stdout);
  }
  free(a);
  free(b);
  tl_engine_close(e);
  tl_model_free(m);
  return rc;
}

typedef struct grid_score {
  uint32_t cells, right;
  double regret, oracle;
} grid_score;

static void score_add(grid_score *g, int right, double regret, double oracle) {
  g->cells++;
  g->right += right != 0;
  g->regret += regret;
  g->oracle += oracle;
}

static int grid_cell(const tl_opts *o, tl_engine *e, const tl_config *cfg, uint32_t ctx, double mbps, uint32_t cell,
                     float *a, float *b, grid_score *all, grid_score *after) {
  tl_throttle thr = {mbps * 1e6, o->thr.host_lat_s, 0, o->thr.disk_lat_s};
  tl_engine_set_throttle(e, &thr);
  pair_result pr;
  int rc = measure_pair(e, cfg, ctx, o->seed, 2000 + cell, a, b, &pr);
  if (rc) return rc;
  const kvt_plan *p = &pr.rs.plan;
  double t_rc = pr.rc.ttft_s, t_rs = pr.rs.ttft_s, t_pl;
  if (p->restore_blocks == 0) t_pl = t_rc;
  else if (p->restore_blocks >= pr.rs.restore_asked) t_pl = t_rs;
  else t_pl = pr.pl.ttft_s;
  double oracle = t_rc < t_rs ? t_rc : t_rs;
  if (pr.split_measured && t_pl < oracle) oracle = t_pl;
  double regret = t_pl - oracle;
  int right = regret <= 0;
  score_add(all, right, regret, oracle);
  if (cell >= o->grid_warmup) score_add(after, right, regret, oracle);
  char thr_s[16];
  snprintf(thr_s, sizeof thr_s, mbps > 0 ? "%.0f" : "none", mbps);
  printf("%4u %6u %6s | %9.1f %9.1f | %9.1f %9.1f | %-9s %4u/%-4u %9.1f %9.1f | %8.1f %s\n", cell, ctx, thr_s,
         t_rc * 1e3, t_rs * 1e3, p->est_recompute_all_s * 1e3, p->est_restore_all_s * 1e3,
         tl_decision_name(p->decision), p->restore_blocks, pr.rs.restore_asked, p->est_ttft_s * 1e3, t_pl * 1e3,
         regret * 1e3, right ? "" : "(miss)");
  fflush(stdout);
  return pr.exact ? 0 : -EPROTO;
}

static void print_score(const char *what, const grid_score *g) {
  if (!g->cells) return;
  printf("%s: picked the fastest in %u/%u cells; regret %.1f ms over an oracle total of %.1f ms = %.1f%%\n", what,
         g->right, g->cells, g->regret * 1e3, g->oracle * 1e3, g->oracle > 0 ? 100.0 * g->regret / g->oracle : 0.0);
}

static int bench_grid(const tl_opts *o) {
  uint32_t max_ctx = 0;
  for (uint32_t i = 0; i < o->n_grid_ctx; i++) max_ctx = o->grid_ctx[i] > max_ctx ? o->grid_ctx[i] : max_ctx;
  tl_config cfg;
  tl_model *m = NULL;
  tl_engine *e = NULL;
  int rc = open_for(o, o->preset, max_ctx, &m, &e, &cfg);
  float *a = calloc(cfg.vocab, sizeof *a), *b = calloc(cfg.vocab, sizeof *b);
  if (rc == 0 && (!a || !b)) rc = -ENOMEM;
  grid_score all = {0}, after = {0};
  if (rc == 0) {
    printf("\nDecision grid (tinyllm %s, %u threads; throttle = emulated host->device MB/s)\n", cfg.name, cfg.threads);
    printf("%4s %6s %6s | %9s %9s | %9s %9s | %-9s %9s %9s %9s | %8s\n", "cell", "ctx", "MB/s", "rc_ms", "rs_ms",
           "est_rc", "est_rs", "plan", "k/usable", "est_ms", "got_ms", "regret");
  }
  uint32_t cell = 0;
  for (uint32_t t = 0; rc == 0 && t < o->n_grid_mbps; t++)
    for (uint32_t i = 0; rc == 0 && i < o->n_grid_ctx; i++, cell++)
      rc = grid_cell(o, e, &cfg, o->grid_ctx[i], o->grid_mbps[t], cell, a, b, &all, &after);
  if (rc == 0) {
    print_score("all cells", &all);
    char what[64];
    snprintf(what, sizeof what, "after the first %u cells (calibration warm)", o->grid_warmup);
    print_score(what, &after);
  } else if (rc == -EPROTO) {
    fprintf(stderr, "restored logits differ from recomputed ones\n");
  }
  free(a);
  free(b);
  tl_engine_close(e);
  tl_model_free(m);
  return rc;
}

int tl_bench_main(const tl_opts *o) {
  int all = strcmp(o->bench, "all") == 0, rc = 0;
  if (!all && strcmp(o->bench, "ttft") != 0 && strcmp(o->bench, "grid") != 0) return -EINVAL;
  if (all || strcmp(o->bench, "grid") == 0) rc = bench_grid(o);
  if (rc == 0 && (all || strcmp(o->bench, "ttft") == 0)) rc = bench_ttft(o);
  if (rc) fprintf(stderr, "tinyllm-serve --bench: %s\n", kvt_strerror(rc));
  return rc;
}
