/* tinyllm: configuration, weights, KV pool and the forward pass. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinyllm.h"
#include "tl_kernels.h"

typedef struct tl_layer {
  float *attn_norm, *wqkv, *wo, *ffn_norm, *w13, *w2;
} tl_layer;

struct tl_model {
  tl_config cfg;
  tl_pool *pool;
  float *weights; /* one allocation; the pointers below index it */
  tl_layer *layers;
  float *emb, *out_norm, *head;
  float *rope_cos, *rope_sin; /* [max_ctx][head_dim / 2] */
  /* activations for one chunk */
  float *x, *h, *qkv, *q, *att, *o, *gu, *tmp;
  float **scratch;
};

int tl_config_preset(const char *name, tl_config *c) {
  memset(c, 0, sizeof *c);
  c->block_tokens = 16;
  c->max_ctx = 4096;
  c->chunk = 256;
  c->threads = 1;
  c->seed = 0x74696e79ull;
  c->rope_theta = 10000.0f;
  if (!name || strcmp(name, "default") == 0) {
    *c = (tl_config){8, 512, 8, 2, 64, 1408, 4096, c->block_tokens, c->max_ctx, c->chunk, c->threads,
                     c->seed, c->rope_theta, "default"};
  } else if (strcmp(name, "tiny") == 0) {
    *c = (tl_config){2, 128, 4, 2, 32, 256, 512, c->block_tokens, 1024, 64, 1, c->seed, c->rope_theta, "tiny"};
  } else if (strcmp(name, "large") == 0) {
    *c = (tl_config){12, 768, 12, 4, 64, 2048, 8192, c->block_tokens, 16384 + 256, c->chunk, c->threads,
                     c->seed, c->rope_theta, "large"};
  } else {
    return -1;
  }
  return 0;
}

static int config_ok(const tl_config *c) {
  if (!c->n_layers || !c->dim || !c->n_heads || !c->n_kv_heads || !c->vocab || !c->ffn_dim) return 0;
  if (c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > 64) return 0;
  if (c->head_dim % 2 || c->head_dim > 256 || c->head_dim == 0) return 0;
  if (c->block_tokens < 16 || (c->block_tokens & (c->block_tokens - 1))) return 0;
  return c->max_ctx > 0 && c->chunk > 0;
}

double tl_config_params(const tl_config *c) {
  double d = c->dim, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
  double layer = d * (qd + 2 * kvd) + qd * d + 3.0 * d * c->ffn_dim + 2 * d;
  return c->n_layers * layer + 2.0 * c->vocab * d + d;
}

size_t tl_config_seg_bytes(const tl_config *c) {
  return (size_t)c->n_kv_heads * c->head_dim * c->block_tokens * sizeof(float);
}

const tl_config *tl_model_config(const tl_model *m) { return &m->cfg; }

/* ---- weights ---- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-scale, scale) (variance scale^2 / 3). */
static void fill_uniform(float *w, size_t n, float scale, uint64_t *s) {
  for (size_t i = 0; i < n; i++) {
    float u = (float)(splitmix(s) >> 40) * (1.0f / 16777216.0f);
    w[i] = (2.0f * u - 1.0f) * scale;
  }
}

static void fill_norm(float *w, size_t n, uint64_t *s) {
  fill_uniform(w, n, 0.1f, s);
  for (size_t i = 0; i < n; i++) w[i] += 1.0f;
}

static size_t weight_floats(const tl_config *c) {
  size_t d = c->dim, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
  size_t layer = 2 * d + d * (qd + 2 * kvd) + qd * d + 2 * d * c->ffn_dim + (size_t)c->ffn_dim * d;
  return c->n_layers * layer + 2 * (size_t)c->vocab * d + d;
}

static void init_weights(tl_model *m) {
  const tl_config *c = &m->cfg;
  size_t d = c->dim, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
  size_t f = c->ffn_dim;
  uint64_t s = c->seed;
  float *p = m->weights;
  /* sqrt(3 / fan_in): unit-variance outputs for unit-variance inputs. */
  float in_d = sqrtf(3.0f / (float)d), in_q = sqrtf(3.0f / (float)qd), in_f = sqrtf(3.0f / (float)f);
  for (uint32_t l = 0; l < c->n_layers; l++) {
    tl_layer *L = &m->layers[l];
    L->attn_norm = p, p += d;
    L->wqkv = p, p += d * (qd + 2 * kvd);
    L->wo = p, p += qd * d;
    L->ffn_norm = p, p += d;
    L->w13 = p, p += d * 2 * f;
    L->w2 = p, p += f * d;
    fill_norm(L->attn_norm, d, &s);
    fill_uniform(L->wqkv, d * (qd + 2 * kvd), in_d, &s);
    fill_uniform(L->wo, qd * d, in_q * 0.5f, &s);
    fill_norm(L->ffn_norm, d, &s);
    fill_uniform(L->w13, d * 2 * f, in_d, &s);
    fill_uniform(L->w2, f * d, in_f * 0.5f, &s);
  }
  m->emb = p, p += (size_t)c->vocab * d;
  m->out_norm = p, p += d;
  m->head = p, p += d * c->vocab;
  fill_uniform(m->emb, (size_t)c->vocab * d, 1.7f, &s);
  fill_norm(m->out_norm, d, &s);
  fill_uniform(m->head, d * c->vocab, in_d * 4.0f, &s);
}

static void init_rope(tl_model *m) {
  const tl_config *c = &m->cfg;
  uint32_t half = c->head_dim / 2;
  for (uint32_t pos = 0; pos < c->max_ctx; pos++)
    for (uint32_t i = 0; i < half; i++) {
      double freq = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
      m->rope_cos[(size_t)pos * half + i] = (float)cos(pos * freq);
      m->rope_sin[(size_t)pos * half + i] = (float)sin(pos * freq);
    }
}

static size_t scratch_floats(const tl_config *c) {
  size_t rows = (size_t)TL_ATTN_TQ * (c->n_heads / c->n_kv_heads);
  return rows * (c->max_ctx + c->head_dim);
}

static int alloc_acts(tl_model *m) {
  const tl_config *c = &m->cfg;
  size_t n = c->chunk, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
  m->x = calloc((size_t)c->max_ctx * c->dim, sizeof(float)); /* every token's residual */
  m->h = calloc(n * c->dim, sizeof(float));
  m->qkv = calloc(n * (qd + 2 * kvd), sizeof(float));
  m->q = calloc(n * qd, sizeof(float));
  m->att = calloc(n * qd, sizeof(float));
  m->o = calloc(n * c->dim, sizeof(float));
  m->gu = calloc(n * 2 * c->ffn_dim, sizeof(float));
  m->tmp = calloc(c->ffn_dim, sizeof(float));
  m->scratch = calloc(c->threads, sizeof *m->scratch);
  if (!m->tmp || !m->x || !m->h || !m->qkv || !m->q || !m->att || !m->o || !m->gu || !m->scratch) return -ENOMEM;
  for (uint32_t t = 0; t < c->threads; t++)
    if (!(m->scratch[t] = calloc(scratch_floats(c), sizeof(float)))) return -ENOMEM;
  return 0;
}

int tl_model_create(const tl_config *cfg, tl_model **out) {
  if (!cfg || !out || !config_ok(cfg)) return -EINVAL;
  tl_model *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  m->cfg = *cfg;
  if (m->cfg.threads == 0) m->cfg.threads = 1;
  size_t half = cfg->head_dim / 2;
  m->weights = malloc(weight_floats(cfg) * sizeof(float));
  m->layers = calloc(cfg->n_layers, sizeof *m->layers);
  m->rope_cos = malloc((size_t)cfg->max_ctx * half * sizeof(float));
  m->rope_sin = malloc((size_t)cfg->max_ctx * half * sizeof(float));
  int rc = !m->weights || !m->layers || !m->rope_cos || !m->rope_sin ? -ENOMEM : alloc_acts(m);
  if (rc == 0) rc = tl_pool_create(m->cfg.threads, &m->pool);
  if (rc != 0) {
    tl_model_free(m);
    return rc;
  }
  init_weights(m);
  init_rope(m);
  *out = m;
  return 0;
}

void tl_model_free(tl_model *m) {
  if (!m) return;
  tl_pool_free(m->pool);
  if (m->scratch)
    for (uint32_t t = 0; t < m->cfg.threads; t++) free(m->scratch[t]);
  free(m->scratch);
  free(m->x), free(m->h), free(m->qkv), free(m->q), free(m->att), free(m->o), free(m->gu), free(m->tmp);
  free(m->rope_cos), free(m->rope_sin);
  free(m->layers);
  free(m->weights);
  free(m);
}

/* ---- KV pool ---- */

int tl_kv_create(const tl_config *cfg, uint32_t n_slots, tl_kv *kv) {
  memset(kv, 0, sizeof *kv);
  kv->n_layers = cfg->n_layers;
  kv->n_slots = n_slots;
  kv->seg_floats = tl_config_seg_bytes(cfg) / sizeof(float);
  kv->k = calloc(cfg->n_layers, sizeof *kv->k);
  kv->v = calloc(cfg->n_layers, sizeof *kv->v);
  if (!kv->k || !kv->v) {
    tl_kv_free(kv);
    return -ENOMEM;
  }
  for (uint32_t l = 0; l < cfg->n_layers; l++) {
    /* calloc: lanes past a partial block read zeros, never garbage. */
    kv->k[l] = calloc((size_t)n_slots * kv->seg_floats, sizeof(float));
    kv->v[l] = calloc((size_t)n_slots * kv->seg_floats, sizeof(float));
    if (!kv->k[l] || !kv->v[l]) {
      tl_kv_free(kv);
      return -ENOMEM;
    }
  }
  return 0;
}

void tl_kv_free(tl_kv *kv) {
  for (uint32_t l = 0; kv->k && kv->v && l < kv->n_layers; l++) {
    free(kv->k[l]);
    free(kv->v[l]);
  }
  free(kv->k);
  free(kv->v);
  memset(kv, 0, sizeof *kv);
}

/* ---- forward ---- */

static void rope(const tl_model *m, float *v, uint32_t pos) {
  uint32_t half = m->cfg.head_dim / 2;
  const float *cs = m->rope_cos + (size_t)pos * half, *sn = m->rope_sin + (size_t)pos * half;
  for (uint32_t i = 0; i < half; i++) {
    float a = v[i], b = v[i + half];
    v[i] = a * cs[i] - b * sn[i];
    v[i + half] = b * cs[i] + a * sn[i];
  }
}

/* Splits qkv rows into rotated, scaled queries and the cache's K and V. */
static void scatter_qkv(tl_model *m, const tl_kv *kv, uint32_t l, const uint32_t *slots, uint32_t p0, uint32_t n) {
  const tl_config *c = &m->cfg;
  uint32_t hd = c->head_dim, bt = c->block_tokens, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
  float scale = 1.0f / sqrtf((float)hd);
  for (uint32_t t = 0; t < n; t++) {
    float *row = m->qkv + (size_t)t * (qd + 2 * kvd);
    uint32_t pos = p0 + t, off = pos % bt;
    size_t slot = slots[pos / bt];
    for (uint32_t h = 0; h < c->n_heads; h++) {
      float *q = m->q + (size_t)t * qd + (size_t)h * hd;
      memcpy(q, row + (size_t)h * hd, hd * sizeof *q);
      rope(m, q, pos);
      for (uint32_t d = 0; d < hd; d++) q[d] *= scale;
    }
    for (uint32_t g = 0; g < c->n_kv_heads; g++) {
      float *k = row + qd + (size_t)g * hd, *v = row + qd + kvd + (size_t)g * hd;
      rope(m, k, pos);
      float *kt = kv->k[l] + slot * kv->seg_floats + (size_t)g * hd * bt;
      float *vb = kv->v[l] + slot * kv->seg_floats + (size_t)g * bt * hd + (size_t)off * hd;
      for (uint32_t d = 0; d < hd; d++) kt[(size_t)d * bt + off] = k[d];
      memcpy(vb, v, hd * sizeof *v);
    }
  }
}

static void silu_mul(float *gu, float *act, uint32_t n, uint32_t f, float *tmp) {
  for (uint32_t t = 0; t < n; t++) {
    const float *g = gu + (size_t)t * 2 * f, *u = g + f;
    for (uint32_t i = 0; i < f; i++) tmp[i] = -fabsf(g[i]);
    tl_exp_inplace(tmp, f); /* exp(-|g|) <= 1: no overflow */
    for (uint32_t i = 0; i < f; i++) {
      float sig = g[i] >= 0 ? 1.0f / (1.0f + tmp[i]) : tmp[i] / (1.0f + tmp[i]);
      act[(size_t)t * f + i] = g[i] * sig * u[i];
    }
  }
}

static void layer_forward(tl_model *m, const tl_kv *kv, uint32_t l, const uint32_t *slots, float *x, uint32_t p0,
                          uint32_t n) {
  const tl_config *c = &m->cfg;
  const tl_layer *L = &m->layers[l];
  uint32_t d = c->dim, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, f = c->ffn_dim;
  for (uint32_t t = 0; t < n; t++) tl_rmsnorm(x + (size_t)t * d, L->attn_norm, m->h + (size_t)t * d, d);
  tl_gemm(m->pool, m->h, L->wqkv, m->qkv, n, d, qd + 2 * kvd);
  scatter_qkv(m, kv, l, slots, p0, n);
  tl_attn_args a = {m->q, m->att, n, p0, c->n_heads, c->n_kv_heads, c->head_dim, c->block_tokens,
                    kv->k[l], kv->v[l], kv->seg_floats, slots, m->scratch};
  tl_attention(m->pool, &a);
  tl_gemm(m->pool, m->att, L->wo, m->o, n, qd, d);
  for (size_t i = 0; i < (size_t)n * d; i++) x[i] += m->o[i];
  for (uint32_t t = 0; t < n; t++) tl_rmsnorm(x + (size_t)t * d, L->ffn_norm, m->h + (size_t)t * d, d);
  tl_gemm(m->pool, m->h, L->w13, m->gu, n, d, 2 * f);
  /* act row t goes to gu + t * f: below row t's inputs, so in place is safe. */
  silu_mul(m->gu, m->gu, n, f, m->tmp);
  tl_gemm(m->pool, m->gu, L->w2, m->o, n, f, d);
  for (size_t i = 0; i < (size_t)n * d; i++) x[i] += m->o[i];
}

/* Layer-major: layer l runs over every chunk before layer l + 1 starts, so
 * the wait for a restored layer overlaps with the whole prefill of the
 * layers before it (as the cost model's overlap assumes). m->x holds the
 * residual stream of every token; chunks bound the other activations. */
int tl_forward(tl_model *m, const tl_kv *kv, const uint32_t *slots, const uint32_t *tokens, uint32_t from,
               uint32_t to, float *logits, tl_layer_wait_fn wait, void *wait_ctx) {
  if (!m || !kv || !slots || !tokens || from >= to || to > m->cfg.max_ctx) return -EINVAL;
  const tl_config *c = &m->cfg;
  uint32_t d = c->dim, n = to - from;
  for (uint32_t t = 0; t < n; t++) {
    uint32_t tok = tokens[from + t] % c->vocab;
    memcpy(m->x + (size_t)t * d, m->emb + (size_t)tok * d, d * sizeof(float));
  }
  for (uint32_t l = 0; l < c->n_layers; l++) {
    if (wait) {
      int rc = wait(wait_ctx, l);
      if (rc) return rc;
    }
    for (uint32_t t0 = 0; t0 < n; t0 += c->chunk) {
      uint32_t nc = n - t0 < c->chunk ? n - t0 : c->chunk;
      layer_forward(m, kv, l, slots, m->x + (size_t)t0 * d, from + t0, nc);
    }
  }
  if (logits) {
    tl_rmsnorm(m->x + (size_t)(n - 1) * d, m->out_norm, m->h, d);
    tl_gemm(m->pool, m->h, m->head, logits, 1, d, c->vocab);
  }
  return 0;
}

uint32_t tl_argmax(const float *logits, uint32_t n) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  return best;
}
