/*
 * kvtier/cost.h - the restore-vs-recompute cost model (included by kvtier.h).
 *
 * Pure functions: no I/O, no clock, no allocation; safe from any thread.
 */
#ifndef KVTIER_COST_H
#define KVTIER_COST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVT_API
#if defined(KVT_BUILDING) && (defined(__GNUC__) || defined(__clang__))
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif
#endif

/* A model's shape, as far as KV size and prefill FLOPs go. Fields left 0
 * take the defaults noted (head_dim = hidden_size / num_heads, num_kv_heads
 * = num_heads, v_head_dim = head_dim); a model needs at least num_layers,
 * hidden_size, num_heads and kv_dtype_bytes. */
typedef struct kvt_model_desc {
  uint32_t size;              /* sizeof(kvt_model_desc); set by kvt_model_init */
  char name[32];
  uint32_t num_layers;
  uint32_t hidden_size;
  uint32_t num_heads;         /* query heads */
  uint32_t num_kv_heads;      /* K/V heads (GQA); ignored with MLA */
  uint32_t head_dim;          /* per-head dim of Q.K (and V) */
  uint32_t intermediate_size; /* MLP width (per expert for MoE) */
  uint32_t vocab_size;
  double params;              /* parameters active per token; 0 = derive from the shape */
  uint32_t kv_dtype_bytes;    /* bytes per KV element (2) */
  uint32_t mla_latent_dim;    /* MLA: cached latent width per token per layer; 0 = K and V */
  uint32_t mla_rope_dim;      /* MLA: decoupled rope key width cached next to the latent */
  uint32_t v_head_dim;        /* per-head dim of V when it differs from head_dim (MLA: 128) */
} kvt_model_desc;

KVT_API void kvt_model_init(kvt_model_desc *m);
/* Fills *m with a preset: "llama3-8b", "llama3-70b", "llama3.1-405b",
 * "mistral-7b", "qwen2.5-7b", "qwen2.5-72b", "deepseek-v3", "tinyllm" (the
 * CPU example model). Returns 0, -EINVAL (NULL), or -ENOENT (unknown name;
 * *m is then left as kvt_model_init made it). */
KVT_API int kvt_model_preset(const char *name, kvt_model_desc *m);
/* Name of preset i, NULL past the last one. */
KVT_API const char *kvt_model_preset_name(size_t i);
/* layers x 2 x kv_heads x head_dim x dtype bytes, or with MLA layers x
 * (latent + rope) x dtype bytes. 0 for an invalid model. */
KVT_API uint64_t kvt_model_kv_bytes_per_token(const kvt_model_desc *m);
/* m->params if set, else derived from the shape: attention projections,
 * a gated (SwiGLU) MLP, norms, and untied input and output embeddings, which
 * matches the published counts of dense models. MoE models must set params
 * (active per token). 0 for an invalid model. */
KVT_API double kvt_model_params(const kvt_model_desc *m);

/* A copy path: fixed latency per transfer plus bytes / bandwidth. */
typedef struct kvt_link {
  double bytes_per_s;
  double latency_s;
} kvt_link;

typedef struct kvt_hw_desc {
  uint32_t size;         /* sizeof(kvt_hw_desc); set by kvt_hw_init */
  uint32_t num_gpus;     /* (1) */
  double flops_per_gpu;  /* peak FLOP/s of one GPU (989e12, H100 dense BF16) */
  double mfu;            /* achieved fraction of peak during prefill (0.5) */
  kvt_link device_host;  /* PCIe (24 GB/s, 10 us) */
  kvt_link host_disk;    /* NVMe (6.5 GB/s, 100 us) */
  int overlap;           /* 1: loads of layer l+1 run under compute of layer l (1) */
  /* Appended: the remote tier's network path into the host (fetches of
   * whole records, concurrent with disk reads: 1.25 GB/s, 500 us, a
   * 10 Gb/s link). Calibrated online from measured fetches. */
  kvt_link host_remote;
} kvt_hw_desc;
/* The planner rejects (-EINVAL) a description without GPUs, with a peak, mfu
 * or bandwidth that is not a positive finite number, or a negative latency.
 * A description of the first version (size KVT_HW_DESC_SIZE_V1, no
 * host_remote) is accepted, the remote link taking kvt_hw_init's value. */

KVT_API void kvt_hw_init(kvt_hw_desc *hw);

/* "Device lead": the leading blocks of the prefix already on the device;
 * using them costs nothing, so every plan restores at least those. */
typedef enum kvt_decision {
  KVT_DECIDE_RECOMPUTE = 0, /* restore nothing beyond the device lead (no copy) */
  KVT_DECIDE_RESTORE = 1,   /* copy in the whole usable cached prefix */
  KVT_DECIDE_SPLIT = 2      /* copy in part of it, recompute the rest */
} kvt_decision;

/* A plan is plain data: it can cross a process boundary. */
typedef struct kvt_plan {
  uint32_t size;            /* sizeof(kvt_plan); the caller sets it */
  uint32_t block_tokens;
  uint64_t n_tokens;        /* tokens of the request */
  uint32_t n_blocks;        /* full blocks of the request */
  uint32_t n_prefix, n_device, n_host, n_disk; /* cached prefix by tier */
  /* k: restore blocks [0, k), recompute tokens [k * block_tokens, n_tokens).
   * The first-token logits need at least one computed token, so when the
   * prefix covers every token the last block is recomputed: k is at most
   * min(n_prefix, (n_tokens - 1) / block_tokens), the "usable" prefix. */
  uint32_t restore_blocks;
  kvt_decision decision;
  uint64_t recompute_tokens; /* n_tokens - k * block_tokens, >= 1 */
  /* Estimates, seconds. With D = disk time, P = PCIe time, C = compute and
   * L layers: without overlap TTFT = D + P + C; with overlap the disk part
   * (whole-block records) still comes first, and P and C pipeline by layer:
   * TTFT = D + max(P, C) + min(P, C) / L. */
  double est_ttft_s;          /* of the chosen plan */
  double est_transfer_s;      /* its copies (disk then PCIe) */
  double est_compute_s;       /* its recompute */
  double est_recompute_all_s; /* restoring only what is on the device */
  double est_restore_all_s;   /* restoring the whole usable cached prefix */
  uint64_t bytes_from_host, bytes_from_disk;
  /* The inputs behind the estimates. */
  double in_flops_per_s;      /* achieved FLOP/s used */
  kvt_link in_device_host, in_host_disk;
  uint64_t in_kv_bytes_per_token;
  int in_overlap;
  /* Appended: remote blocks of the prefix (KVT_TIER_REMOTE), the bytes the
   * plan fetches from the remote, and the link it assumed. Remote and disk
   * reads run side by side: the fetch part of TTFT is the slower of them. */
  uint32_t n_remote;
  uint64_t bytes_from_remote;
  kvt_link in_host_remote;
} kvt_plan;

/* FLOPs to recompute tokens [from, to) given a cached prefix of `from`:
 * linear part 2 x params per token, plus attention, which grows with each
 * token's position: the token at position p attends to p + 1 keys, costing
 * 2 x layers x heads x (head_dim + v_head_dim) FLOPs per key (QK^T and AV),
 * summed in closed form. MLA counts its decompressed per-head dims (the
 * form prefill kernels run). *linear (may be NULL) receives the linear part.
 * 0 for an invalid model or from >= to. */
KVT_API double kvt_cost_recompute_flops(const kvt_model_desc *m, uint64_t from, uint64_t to,
                                        double *linear);

/* Seconds to compute tokens [from, to): their FLOPs over num_gpus x
 * flops_per_gpu x mfu. 0 for invalid arguments. */
KVT_API double kvt_cost_compute_s(const kvt_model_desc *m, const kvt_hw_desc *hw, uint64_t from,
                                  uint64_t to);

/* Seconds to copy host_bytes from the host tier and disk_bytes from the disk
 * tier to the device: disk_bytes first pay the disk (latency + bytes / bw),
 * then all of them cross PCIe (latency + bytes / bw). A path that moves no
 * bytes costs nothing. 0 for invalid arguments. */
KVT_API double kvt_cost_transfer_s(const kvt_hw_desc *hw, uint64_t host_bytes, uint64_t disk_bytes);
/* As kvt_cost_transfer_s with remote_bytes fetched from the remote tier
 * besides: disk and remote reads run side by side (the slower counts),
 * then everything crosses PCIe. */
KVT_API double kvt_cost_transfer3_s(const kvt_hw_desc *hw, uint64_t host_bytes, uint64_t disk_bytes,
                                    uint64_t remote_bytes);

/* The planner. tier_of_block[0..n_prefix) gives the fastest tier of each
 * cached block (KVT_TIER_*; may be NULL when n_prefix is 0); blocks past
 * n_prefix are misses. Chooses k in [0, usable prefix] (see restore_blocks)
 * minimising the estimated time to first token, in O(n_prefix); ties go to
 * the smaller k (fewer copies). Fills every field of *plan, whose size the
 * caller sets. Returns 0 or -EINVAL (NULL, invalid model or hardware,
 * block_tokens 0, n_tokens 0, n_prefix past the request's full blocks, a
 * tier that is not device, host, disk or remote, plan->size below
 * KVT_PLAN_SIZE_V1). A smaller plan (an older caller's) gets its fields only. */
KVT_API int kvt_cost_plan(const kvt_model_desc *m, const kvt_hw_desc *hw, uint32_t block_tokens,
                          uint64_t n_tokens, uint32_t n_prefix, const uint8_t *tier_of_block,
                          kvt_plan *plan);

/* Break-even bandwidth: the device_host bytes/s at which restoring the first
 * cached_tokens of an n_tokens request from the host tier (at most
 * n_tokens - 1, then computing the rest) takes as long as recomputing all
 * of it, under hw's latency and overlap. Faster links favour restore.
 * *bytes_per_s = INFINITY when restore cannot win at any bandwidth (the
 * latency alone exceeds the compute it saves). Returns 0 or -EINVAL. */
KVT_API int kvt_cost_breakeven(const kvt_model_desc *m, const kvt_hw_desc *hw, uint64_t n_tokens,
                               uint64_t cached_tokens, double *bytes_per_s);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_COST_H */
