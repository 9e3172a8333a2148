/* tinyllm-serve's options, shared by the serving loop and the bench. */
#ifndef TL_SERVE_H
#define TL_SERVE_H

#include "tl_engine.h"

#define TL_MAX_LIST 16

typedef struct tl_opts {
  const char *preset;
  uint32_t threads, block_tokens, chunk;
  /* serving loop */
  uint32_t convs, rounds, first_msg, msg, gen;
  uint32_t dev_slots;
  uint64_t host_blocks, disk_blocks;
  const char *disk_path;
  tl_throttle thr;
  tl_policy policy;
  uint64_t seed;
  /* bench */
  const char *bench; /* NULL, "ttft", "grid" or "all" */
  const char *ttft_preset;
  uint32_t ttft_ctx[TL_MAX_LIST], n_ttft_ctx;
  uint32_t grid_ctx[TL_MAX_LIST], n_grid_ctx;
  double grid_mbps[TL_MAX_LIST]; /* 0 = unthrottled */
  uint32_t n_grid_mbps;
  uint32_t grid_warmup; /* cells left out of the "after calibration" figures */
} tl_opts;

/* Fills a config from a preset and the options that override it. */
int tl_opts_config(const tl_opts *o, const char *preset, uint32_t max_ctx, tl_config *cfg);
/* Message tokens for conversation `conv`, round `round`. */
void tl_fill_tokens(uint32_t *tok, size_t n, uint32_t vocab, uint64_t seed, uint32_t conv, uint32_t round);
const char *tl_decision_name(kvt_decision d);

int tl_bench_main(const tl_opts *o);

#endif
