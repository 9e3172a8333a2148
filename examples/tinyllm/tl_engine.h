/*
 * tl_engine.h - tinyllm served through kvtier: one KV pool whose block
 * slots kvtier manages (host device backend: the "device" is RAM), turns of
 * conversations that plan, restore, recompute and generate, and offload.
 *
 * Throttling: kvtier's host device backend copies at memcpy speed, so to
 * show the regime where recompute wins the engine emulates a slower link in
 * its own loop: a load of B bytes lands layer by layer, layer l no earlier
 * than t_acquire + D + lat + (l + 1) / L x B / bw (D: the disk part, whole
 * records first, for blocks that came from disk). The engine sleeps until
 * that deadline and then also waits for kvtier's real copy of the layer.
 * The library cannot see these sleeps, so the engine tells its planner the
 * throttled links before each plan (kvt_set_cost_model with the calibrated
 * compute rate carried over); unthrottled paths keep kvtier's own
 * calibration of its copies.
 */
#ifndef TL_ENGINE_H
#define TL_ENGINE_H

#include <kvtier/kvtier.h>

#include "tinyllm.h"

typedef struct tl_throttle {
  double host_bps, host_lat_s; /* host -> device; bps 0 = not throttled */
  double disk_bps, disk_lat_s; /* disk -> host;   bps 0 = not throttled */
} tl_throttle;

typedef struct tl_engine_opts {
  uint32_t dev_slots;    /* block slots of the KV pool (kvtier's device tier) */
  uint64_t host_blocks;  /* kvtier host tier */
  const char *disk_path; /* NULL: no disk tier */
  uint64_t disk_blocks;
  tl_throttle throttle;
  uint32_t warmup_tokens; /* tokens of the start-up FLOP-rate measurement (0: 128) */
} tl_engine_opts;

typedef enum tl_policy {
  TL_POLICY_PLAN = 0,      /* restore what kvtier's planner chooses */
  TL_POLICY_RESTORE = 1,   /* restore the whole usable cached prefix */
  TL_POLICY_RECOMPUTE = 2  /* restore nothing, recompute every token */
} tl_policy;

/* A conversation: its token history (prompts and answers). */
typedef struct tl_conv {
  uint32_t *tok;
  size_t n, cap;
} tl_conv;

void tl_conv_free(tl_conv *cv);

/* What one turn did. Times are seconds, measured. */
typedef struct tl_turn {
  uint64_t ctx_tokens;       /* prompt tokens (history + message) */
  uint32_t n_blocks;         /* full blocks of the prompt */
  kvt_plan plan;             /* the planner's view before the turn */
  uint32_t restore_asked;    /* blocks asked of kvt_acquire */
  kvt_acquire_info info;     /* what kvt_acquire granted */
  uint32_t n_ready;          /* blocks whose restore was confirmed */
  uint64_t recomputed;       /* tokens computed for the first token */
  double ttft_s;             /* plan + acquire + restore + prefill + head */
  double compute_s;          /* of which the model ran */
  double wait_s;             /* of which waiting for restores (throttle included) */
  uint32_t first_token;
  uint32_t n_generated;
} tl_turn;

typedef struct tl_engine tl_engine;

/* Opens kvtier over a fresh KV pool for model m (not owned), measures the
 * model's FLOP rate and the copy bandwidth, and sets the cost model. */
int tl_engine_open(tl_model *m, const tl_engine_opts *o, tl_engine **out);
void tl_engine_close(tl_engine *e);
kvt_cache *tl_engine_cache(tl_engine *e);
const kvt_model_desc *tl_engine_model_desc(const tl_engine *e);
void tl_engine_set_throttle(tl_engine *e, const tl_throttle *t);

/* One turn: prompt = history + msg; plan, acquire (restoring per policy),
 * prefill the rest, first token, n_gen - 1 more tokens greedily. With
 * append the message and the answer join the history. logits (may be NULL)
 * receives the first token's logits. Returns 0 or a negative code. */
int tl_engine_turn(tl_engine *e, tl_conv *cv, const uint32_t *msg, size_t n_msg, uint32_t n_gen,
                   tl_policy pol, int append, float *logits, tl_turn *rep);

/* The conversation went idle: offload its cached blocks (kvt_store with
 * KVT_STORE_EVICT) and wait for the copies. */
int tl_engine_offload(tl_engine *e, const tl_conv *cv);

#endif
