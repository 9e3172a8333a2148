/* The restore-vs-recompute cost model: model presets, KV size, prefill
 * FLOPs, copy times and the planner. Pure: no I/O, no clock, no allocation;
 * the only data is the const preset table. docs/cost-model.md explains the
 * model with the worked example. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvtier/kvtier.h"

/* Published shapes (the models' config.json). params = 0 derives the count
 * from the shape, which matches the published totals of these dense models
 * within 0.5%; the MoE model gives its active parameters per token. */
typedef struct preset {
  const char *name;
  uint32_t layers, hidden, heads, kv_heads, head_dim, inter, vocab;
  double params;
  uint32_t dtype_bytes, mla_latent, mla_rope, v_head_dim;
} preset;

static const preset presets[] = {
    {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 0, 2, 0, 0, 0},
    {"llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 0, 2, 0, 0, 0},
    {"llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, 0, 2, 0, 0, 0},
    /* v0.3: no sliding window, 32768 vocabulary. */
    {"mistral-7b", 32, 4096, 32, 8, 128, 14336, 32768, 0, 2, 0, 0, 0},
    {"qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 0, 2, 0, 0, 0},
    {"qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, 0, 2, 0, 0, 0},
    /* MLA: caches a 512-wide latent plus a 64-wide rope key per layer; Q.K
     * runs over 128 + 64 dims per head, V over 128. 37B of 671B parameters
     * are active per token (8 of 256 routed experts + 1 shared). */
    {"deepseek-v3", 61, 7168, 128, 128, 192, 2048, 129280, 37e9, 2, 512, 64, 128},
    /* The CPU example model (examples/tinyllm) in its default configuration:
     * 26.8 M parameters, fp32 KV. Its "large" timing configuration (12 x 768,
     * 88 M) builds its own description from its shape. */
    {"tinyllm", 8, 512, 8, 2, 64, 1408, 4096, 0, 4, 0, 0, 0},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

void kvt_model_init(kvt_model_desc *m) {
  if (!m) return;
  memset(m, 0, sizeof *m);
  m->size = sizeof *m;
  m->kv_dtype_bytes = 2;
}

int kvt_model_preset(const char *name, kvt_model_desc *m) {
  if (!name || !m) return -EINVAL;
  kvt_model_init(m);
  for (size_t i = 0; i < N_PRESETS; i++) {
    const preset *p = &presets[i];
    if (strcmp(p->name, name) != 0) continue;
    snprintf(m->name, sizeof m->name, "%s", p->name);
    m->num_layers = p->layers;
    m->hidden_size = p->hidden;
    m->num_heads = p->heads;
    m->num_kv_heads = p->kv_heads;
    m->head_dim = p->head_dim;
    m->intermediate_size = p->inter;
    m->vocab_size = p->vocab;
    m->params = p->params;
    m->kv_dtype_bytes = p->dtype_bytes;
    m->mla_latent_dim = p->mla_latent;
    m->mla_rope_dim = p->mla_rope;
    m->v_head_dim = p->v_head_dim;
    return 0;
  }
  return -ENOENT;
}

const char *kvt_model_preset_name(size_t i) { return i < N_PRESETS ? presets[i].name : NULL; }

/* ---- model shape ---- */

static int model_valid(const kvt_model_desc *m) {
  return m && m->size >= sizeof *m && m->num_layers > 0 && m->hidden_size > 0 &&
         m->num_heads > 0 && m->kv_dtype_bytes > 0 && (m->head_dim > 0 || m->hidden_size >= m->num_heads) &&
         !(m->params < 0) && !isnan(m->params) && !isinf(m->params);
}

static double head_dim(const kvt_model_desc *m) {
  return m->head_dim ? m->head_dim : (double)(m->hidden_size / m->num_heads);
}
static double v_head_dim(const kvt_model_desc *m) {
  return m->v_head_dim ? m->v_head_dim : head_dim(m);
}
static double kv_heads(const kvt_model_desc *m) {
  return m->num_kv_heads ? m->num_kv_heads : m->num_heads;
}

uint64_t kvt_model_kv_bytes_per_token(const kvt_model_desc *m) {
  if (!model_valid(m)) return 0;
  uint64_t per_layer;
  if (m->mla_latent_dim)
    per_layer = (uint64_t)m->mla_latent_dim + m->mla_rope_dim;
  else
    per_layer = 2 * (uint64_t)kv_heads(m) * (uint64_t)head_dim(m);
  return (uint64_t)m->num_layers * per_layer * m->kv_dtype_bytes;
}

/* Attention projection weights of one layer. */
static double attn_params(const kvt_model_desc *m) {
  double h = m->hidden_size, nh = m->num_heads, dq = head_dim(m), dv = v_head_dim(m);
  double q = h * nh * dq, o = nh * dv * h;
  if (m->mla_latent_dim) {
    /* Down-projection to latent + rope key, up-projection of the latent to
     * per-head K (without its rope part) and V. Q taken as a full projection
     * (DeepSeek's low-rank Q is a little smaller). */
    double lat = m->mla_latent_dim, rope = m->mla_rope_dim;
    return q + o + h * (lat + rope) + lat * nh * ((dq - rope) + dv);
  }
  return q + o + 2.0 * h * kv_heads(m) * dq;
}

double kvt_model_params(const kvt_model_desc *m) {
  if (!model_valid(m)) return 0;
  if (m->params > 0) return m->params;
  double h = m->hidden_size;
  double mlp = 3.0 * h * m->intermediate_size; /* gate, up, down */
  double per_layer = attn_params(m) + mlp + 2.0 * h;
  return m->num_layers * per_layer + 2.0 * (double)m->vocab_size * h + h;
}

double kvt_cost_recompute_flops(const kvt_model_desc *m, uint64_t from, uint64_t to, double *linear) {
  if (linear) *linear = 0;
  if (!model_valid(m) || from >= to) return 0;
  double n = (double)(to - from);
  double lin = 2.0 * kvt_model_params(m) * n;
  /* Token p attends to p + 1 keys: sum_{p=from}^{to-1} (p + 1) = n (from + to + 1) / 2. */
  double keys = n * ((double)from + (double)to + 1.0) / 2.0;
  double per_key = 2.0 * m->num_layers * (double)m->num_heads * (head_dim(m) + v_head_dim(m));
  if (linear) *linear = lin;
  return lin + per_key * keys;
}

/* ---- hardware ---- */

void kvt_hw_init(kvt_hw_desc *hw) {
  if (!hw) return;
  memset(hw, 0, sizeof *hw);
  hw->size = sizeof *hw;
  hw->num_gpus = 1;
  hw->flops_per_gpu = 989e12;
  hw->mfu = 0.5;
  hw->device_host = (kvt_link){.bytes_per_s = 24e9, .latency_s = 10e-6};
  hw->host_disk = (kvt_link){.bytes_per_s = 6.5e9, .latency_s = 100e-6};
  hw->overlap = 1;
  hw->host_remote = (kvt_link){.bytes_per_s = 1.25e9, .latency_s = 500e-6};
}

/* A description of any accepted version, grown to this one (the remote
 * link of a first-version caller takes its default). */
static const kvt_hw_desc *hw_full(const kvt_hw_desc *hw, kvt_hw_desc *tmp) {
  if (!hw || hw->size >= sizeof *hw) return hw;
  if (hw->size < KVT_HW_DESC_SIZE_V1) return NULL;
  kvt_hw_init(tmp);
  memcpy(tmp, hw, hw->size);
  tmp->size = sizeof *tmp;
  return tmp;
}

static int pos_finite(double x) { return x > 0 && !isinf(x); }

static int link_valid(const kvt_link *l) {
  return pos_finite(l->bytes_per_s) && l->latency_s >= 0 && !isinf(l->latency_s);
}

static int hw_valid(const kvt_hw_desc *hw) {
  return hw && hw->size >= sizeof *hw && hw->num_gpus > 0 && pos_finite(hw->flops_per_gpu) &&
         pos_finite(hw->mfu) && link_valid(&hw->device_host) && link_valid(&hw->host_disk) &&
         link_valid(&hw->host_remote);
}

static double flops_per_s(const kvt_hw_desc *hw) { return hw->num_gpus * hw->flops_per_gpu * hw->mfu; }

static double link_s(const kvt_link *l, uint64_t bytes) {
  return bytes ? l->latency_s + (double)bytes / l->bytes_per_s : 0;
}

double kvt_cost_compute_s(const kvt_model_desc *m, const kvt_hw_desc *hw_in, uint64_t from, uint64_t to) {
  kvt_hw_desc tmp;
  const kvt_hw_desc *hw = hw_full(hw_in, &tmp);
  if (!hw_valid(hw)) return 0;
  return kvt_cost_recompute_flops(m, from, to, NULL) / flops_per_s(hw);
}

double kvt_cost_transfer_s(const kvt_hw_desc *hw, uint64_t host_bytes, uint64_t disk_bytes) {
  return kvt_cost_transfer3_s(hw, host_bytes, disk_bytes, 0);
}

/* Disk and remote reads run side by side into host slots: the slower one counts. */
static double fetch_s(const kvt_hw_desc *hw, uint64_t disk_bytes, uint64_t remote_bytes) {
  double d = link_s(&hw->host_disk, disk_bytes), r = link_s(&hw->host_remote, remote_bytes);
  return d > r ? d : r;
}

double kvt_cost_transfer3_s(const kvt_hw_desc *hw_in, uint64_t host_bytes, uint64_t disk_bytes,
                            uint64_t remote_bytes) {
  kvt_hw_desc tmp;
  const kvt_hw_desc *hw = hw_full(hw_in, &tmp);
  if (!hw_valid(hw)) return 0;
  return fetch_s(hw, disk_bytes, remote_bytes) + link_s(&hw->device_host, host_bytes + disk_bytes + remote_bytes);
}

/* TTFT of a plan from its parts (the formula in cost.h at kvt_plan): the
 * disk read is whole records, so it precedes; PCIe loads and compute form a
 * two-stage pipeline over the layers, whose length is the slower stage plus
 * one layer of the faster. */
static double ttft(const kvt_model_desc *m, const kvt_hw_desc *hw, double disk_s, double pcie_s,
                   double compute_s) {
  if (!hw->overlap) return disk_s + pcie_s + compute_s;
  double hi = pcie_s > compute_s ? pcie_s : compute_s;
  double lo = pcie_s > compute_s ? compute_s : pcie_s;
  return disk_s + hi + lo / m->num_layers;
}

/* ---- planner ---- */

/* Estimates of one candidate k, from the counts of host and disk blocks in [0, k). */
typedef struct candidate {
  double ttft, transfer, compute;
  uint64_t host_bytes, disk_bytes, remote_bytes;
} candidate;

static candidate evaluate(const kvt_model_desc *m, const kvt_hw_desc *hw, uint64_t block_bytes,
                          uint64_t from_token, uint64_t n_tokens, uint64_t n_host, uint64_t n_disk,
                          uint64_t n_remote) {
  candidate c;
  c.host_bytes = n_host * block_bytes;
  c.disk_bytes = n_disk * block_bytes;
  c.remote_bytes = n_remote * block_bytes;
  double disk_s = fetch_s(hw, c.disk_bytes, c.remote_bytes);
  double pcie_s = link_s(&hw->device_host, c.host_bytes + c.disk_bytes + c.remote_bytes);
  c.compute = kvt_cost_recompute_flops(m, from_token, n_tokens, NULL) / flops_per_s(hw);
  c.transfer = disk_s + pcie_s;
  c.ttft = ttft(m, hw, disk_s, pcie_s, c.compute);
  return c;
}

int kvt_cost_plan(const kvt_model_desc *m, const kvt_hw_desc *hw_in, uint32_t block_tokens,
                  uint64_t n_tokens, uint32_t n_prefix, const uint8_t *tier_of_block, kvt_plan *out) {
  kvt_hw_desc tmp;
  const kvt_hw_desc *hw = hw_full(hw_in, &tmp);
  kvt_plan full, *plan = &full;
  if (!out || out->size < KVT_PLAN_SIZE_V1 || !model_valid(m) || !hw_valid(hw) || block_tokens == 0 ||
      n_tokens == 0 || (n_prefix > 0 && !tier_of_block))
    return -EINVAL;
  uint64_t n_blocks = n_tokens / block_tokens;
  if (n_blocks > UINT32_MAX || n_prefix > n_blocks) return -EINVAL;

  uint32_t n_dev = 0, n_host = 0, n_disk = 0, n_remote = 0, lead = 0;
  for (uint32_t i = 0; i < n_prefix; i++) {
    switch (tier_of_block[i]) {
    case KVT_TIER_DEVICE: n_dev++; if (lead == i) lead = i + 1; break;
    case KVT_TIER_HOST: n_host++; break;
    case KVT_TIER_DISK: n_disk++; break;
    case KVT_TIER_REMOTE: n_remote++; break;
    default: return -EINVAL;
    }
  }
  /* At least one token is computed for the first-token logits. */
  uint32_t usable = n_prefix;
  if ((uint64_t)usable * block_tokens >= n_tokens) usable = (uint32_t)((n_tokens - 1) / block_tokens);
  if (lead > usable) lead = usable;

  uint64_t block_bytes = (uint64_t)block_tokens * kvt_model_kv_bytes_per_token(m);
  /* k below the device lead only adds compute: start there. One pass with
   * running counts (the prefix sums) keeps the search O(n_prefix). */
  uint64_t h = 0, d = 0, r = 0;
  candidate best = evaluate(m, hw, block_bytes, (uint64_t)lead * block_tokens, n_tokens, 0, 0, 0);
  candidate lead_c = best, c = best;
  uint32_t best_k = lead;
  for (uint32_t k = lead + 1; k <= usable; k++) {
    uint8_t t = tier_of_block[k - 1];
    h += t == KVT_TIER_HOST;
    d += t == KVT_TIER_DISK;
    r += t == KVT_TIER_REMOTE;
    c = evaluate(m, hw, block_bytes, (uint64_t)k * block_tokens, n_tokens, h, d, r);
    if (c.ttft < best.ttft) {
      best = c;
      best_k = k;
    }
  }

  memset(plan, 0, sizeof *plan);
  plan->size = sizeof *plan;
  plan->block_tokens = block_tokens;
  plan->n_tokens = n_tokens;
  plan->n_blocks = (uint32_t)n_blocks;
  plan->n_prefix = n_prefix;
  plan->n_device = n_dev;
  plan->n_host = n_host;
  plan->n_disk = n_disk;
  plan->restore_blocks = best_k;
  plan->decision = best_k <= lead      ? KVT_DECIDE_RECOMPUTE
                   : best_k == usable ? KVT_DECIDE_RESTORE
                                      : KVT_DECIDE_SPLIT;
  plan->recompute_tokens = n_tokens - (uint64_t)best_k * block_tokens;
  plan->est_ttft_s = best.ttft;
  plan->est_transfer_s = best.transfer;
  plan->est_compute_s = best.compute;
  plan->est_recompute_all_s = lead_c.ttft;
  plan->est_restore_all_s = c.ttft; /* the loop ended at k = usable */
  plan->bytes_from_host = best.host_bytes;
  plan->bytes_from_disk = best.disk_bytes;
  plan->in_flops_per_s = flops_per_s(hw);
  plan->in_device_host = hw->device_host;
  plan->in_host_disk = hw->host_disk;
  plan->in_kv_bytes_per_token = kvt_model_kv_bytes_per_token(m);
  plan->in_overlap = hw->overlap;
  plan->n_remote = n_remote;
  plan->bytes_from_remote = best.remote_bytes;
  plan->in_host_remote = hw->host_remote;
  /* An older caller's smaller plan gets the fields it knows. */
  size_t n = out->size < sizeof full ? out->size : sizeof full;
  memcpy(out, &full, n);
  out->size = (uint32_t)n;
  return 0;
}

int kvt_cost_breakeven(const kvt_model_desc *m, const kvt_hw_desc *hw_in, uint64_t n_tokens,
                       uint64_t cached_tokens, double *bytes_per_s) {
  kvt_hw_desc tmp;
  const kvt_hw_desc *hw = hw_full(hw_in, &tmp);
  if (!bytes_per_s || !model_valid(m) || !hw_valid(hw) || n_tokens == 0 || cached_tokens > n_tokens)
    return -EINVAL;
  uint64_t k = cached_tokens < n_tokens ? cached_tokens : n_tokens - 1;
  double rate = flops_per_s(hw);
  double c_all = kvt_cost_recompute_flops(m, 0, n_tokens, NULL) / rate;
  double c_rest = kvt_cost_recompute_flops(m, k, n_tokens, NULL) / rate;
  double bytes = (double)k * (double)kvt_model_kv_bytes_per_token(m);
  /* The copy time T* at which restore's TTFT equals c_all; TTFT grows with T. */
  double t_star;
  if (!hw->overlap) {
    t_star = c_all - c_rest;
  } else {
    double layers = m->num_layers;
    t_star = c_all - c_rest / layers; /* branch T >= c_rest: T + c_rest / L = c_all */
    if (t_star < c_rest) t_star = layers * (c_all - c_rest); /* c_rest + T / L = c_all */
  }
  double wire = t_star - hw->device_host.latency_s;
  *bytes_per_s = bytes > 0 && wire > 0 ? bytes / wire : INFINITY;
  return 0;
}
