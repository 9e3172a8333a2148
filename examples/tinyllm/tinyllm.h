/*
 * tinyllm.h - a small decoder-only transformer in plain C (float32) whose KV
 * cache lives in block slots, as a paged-attention GPU engine's does.
 *
 * Token embedding, RMSNorm, rotary positions, grouped-query attention,
 * SwiGLU MLP, output head; weights from a fixed-seed generator.
 *
 * KV layout: per layer one K and one V segment. Block slot s of layer l is
 * k[l] + s * seg_floats (and likewise v[l]); inside a block K is stored
 * [kv_head][head_dim][block_tokens] (transposed: scores vectorise over
 * keys) and V [kv_head][block_tokens][head_dim]. Attention reads K and V
 * through a slot table: block b of the sequence lives in slot slots[b].
 *
 * Determinism: every reduction runs in a fixed order that depends only on
 * the element computed, never on the batch it is computed in, the chunk
 * size or the thread count (threads split output columns). So a token's K,
 * V and logits are bit-identical whether its prefix was computed in one
 * prefill, in several, or restored from a copy.
 */
#ifndef TINYLLM_H
#define TINYLLM_H

#include <stddef.h>
#include <stdint.h>

typedef struct tl_config {
  uint32_t n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab;
  uint32_t block_tokens; /* tokens per KV block (kvtier's block_tokens) */
  uint32_t max_ctx;      /* longest sequence (rotary table, scratch) */
  uint32_t chunk;        /* prefill tokens per forward chunk */
  uint32_t threads;      /* compute threads (results do not depend on it) */
  uint64_t seed;         /* weight generator seed */
  float rope_theta;
  char name[32];
} tl_config;

/* "tiny" (tests), "default" (8 x 512, 8 q heads, 2 kv heads, vocab 4096;
 * matches kvtier's "tinyllm" cost preset), "large" (timing). 0 or -1. */
int tl_config_preset(const char *name, tl_config *cfg);
/* Parameters of the model (as kvtier's cost model counts them). */
double tl_config_params(const tl_config *cfg);
/* Bytes of one block's K (or V) segment of one layer. */
size_t tl_config_seg_bytes(const tl_config *cfg);

typedef struct tl_model tl_model;

/* Builds the weights (deterministic in cfg->seed). 0 or -errno. */
int tl_model_create(const tl_config *cfg, tl_model **out);
void tl_model_free(tl_model *m);
const tl_config *tl_model_config(const tl_model *m);

/* The KV pool: n_slots block slots per layer and segment. */
typedef struct tl_kv {
  uint32_t n_layers, n_slots;
  size_t seg_floats;
  float **k, **v; /* [n_layers] */
} tl_kv;

int tl_kv_create(const tl_config *cfg, uint32_t n_slots, tl_kv *kv);
void tl_kv_free(tl_kv *kv);

/* Called before layer `layer` (of any token) reads the cache: the
 * engine waits there for restored blocks of that layer to land. Nonzero
 * aborts the forward with that code. */
typedef int (*tl_layer_wait_fn)(void *ctx, uint32_t layer);

/* Runs tokens[from, to) (positions from..to-1) over the cached KV of
 * positions [0, from), writing their K and V into the slots of slots[]
 * (slots[b] holds block b), and the logits of position to-1 into
 * logits[vocab] (may be NULL). Returns 0 or -errno. */
int tl_forward(tl_model *m, const tl_kv *kv, const uint32_t *slots, const uint32_t *tokens,
               uint32_t from, uint32_t to, float *logits, tl_layer_wait_fn wait, void *wait_ctx);

/* Index of the largest logit (the lowest index on ties). */
uint32_t tl_argmax(const float *logits, uint32_t n);

#endif
