/* tinyllm's kernels: GEMM, RMSNorm, exp, paged causal attention, and the
 * pool that spreads their outputs over threads. See tl_kernels.h for the
 * determinism rule every loop here keeps. */
#include "tl_kernels.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- thread pool ---- */

struct tl_pool {
  uint32_t n;
  pthread_t *th;
  pthread_mutex_t lock;
  pthread_cond_t go, done;
  uint64_t round;     /* bumped per run */
  uint32_t pending;   /* workers still busy in this round */
  int stop;
  tl_task_fn fn;
  void *ctx;
  uint32_t n_tasks;
};

typedef struct worker_arg {
  tl_pool *p;
  uint32_t id;
} worker_arg;

static void run_share(tl_pool *p, uint32_t id) {
  for (uint32_t t = id; t < p->n_tasks; t += p->n) p->fn(p->ctx, t, id);
}

static void *pool_worker(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  free(arg);
  tl_pool *p = wa.p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (p->round == seen && !p->stop) pthread_cond_wait(&p->go, &p->lock);
    if (p->stop) break;
    seen = p->round;
    pthread_mutex_unlock(&p->lock);
    run_share(p, wa.id);
    pthread_mutex_lock(&p->lock);
    if (--p->pending == 0) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

int tl_pool_create(uint32_t n_threads, tl_pool **out) {
  tl_pool *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  p->n = n_threads ? n_threads : 1;
  p->th = calloc(p->n, sizeof *p->th);
  if (!p->th) {
    free(p);
    return -ENOMEM;
  }
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  for (uint32_t i = 1; i < p->n; i++) {
    worker_arg *wa = malloc(sizeof *wa);
    if (wa) {
      wa->p = p;
      wa->id = i;
    }
    if (!wa || pthread_create(&p->th[i], NULL, pool_worker, wa) != 0) {
      free(wa);
      p->n = i;
      tl_pool_free(p);
      return -EAGAIN;
    }
  }
  *out = p;
  return 0;
}

void tl_pool_free(tl_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->lock);
  for (uint32_t i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
  free(p->th);
  free(p);
}

uint32_t tl_pool_threads(const tl_pool *p) { return p ? p->n : 1; }

void tl_pool_run(tl_pool *p, tl_task_fn fn, void *ctx, uint32_t n_tasks) {
  if (!p || p->n == 1 || n_tasks <= 1) {
    for (uint32_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  pthread_mutex_lock(&p->lock);
  p->fn = fn;
  p->ctx = ctx;
  p->n_tasks = n_tasks;
  p->pending = p->n - 1;
  p->round++;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->lock);
  run_share(p, 0);
  pthread_mutex_lock(&p->lock);
  while (p->pending) pthread_cond_wait(&p->done, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

/* ---- GEMM ---- */

#define NR 32 /* output columns per task */
#define MR 8  /* rows per register tile */

/* 16 floats as one value (GNU C vector extension; one zmm with AVX-512).
 * With -ffp-contract=fast, a * b + c below is one fused multiply-add,
 * the same rounding as fmaf(). */
typedef float v16 __attribute__((vector_size(64)));

static inline v16 ld16(const float *p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void st16(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* MR rows x NR columns: element (r, j) = the fused chain over p = 0..k-1
 * from 0. Accumulators are values, so they stay in registers. */
static void gemm_8x32(const float *x, size_t ldx, const float *w, size_t ldw, float *y, size_t ldy,
                      uint32_t k) {
  v16 a[MR][NR / 16];
  memset(a, 0, sizeof a);
  for (uint32_t p = 0; p < k; p++) {
    const float *wr = w + (size_t)p * ldw;
    v16 w0 = ld16(wr), w1 = ld16(wr + 16);
    for (int r = 0; r < MR; r++) {
      float xv = x[(size_t)r * ldx + p];
      a[r][0] = xv * w0 + a[r][0];
      a[r][1] = xv * w1 + a[r][1];
    }
  }
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NR / 16; c++) st16(y + (size_t)r * ldy + 16 * c, a[r][c]);
}

/* One row of a full NR tile: the same chain per element as gemm_8x32. */
static void gemm_1x32(const float *x, const float *w, size_t ldw, float *y, uint32_t k) {
  v16 a[NR / 16];
  memset(a, 0, sizeof a);
  for (uint32_t p = 0; p < k; p++) {
    const float *wr = w + (size_t)p * ldw;
    float xv = x[p];
    for (int c = 0; c < NR / 16; c++) a[c] = xv * ld16(wr + 16 * c) + a[c];
  }
  for (int c = 0; c < NR / 16; c++) st16(y + 16 * c, a[c]);
}

/* One row of a partial tile (every row of those columns comes here). */
static void gemm_1xn(const float *x, const float *w, size_t ldw, float *y, uint32_t k, uint32_t nr) {
  float a[NR];
  memset(a, 0, sizeof a);
  for (uint32_t p = 0; p < k; p++) {
    const float *wr = w + (size_t)p * ldw;
    float xv = x[p];
    for (uint32_t j = 0; j < nr; j++) a[j] = fmaf(xv, wr[j], a[j]);
  }
  memcpy(y, a, nr * sizeof *a);
}

typedef struct gemm_ctx {
  const float *x, *w;
  float *y;
  uint32_t m, k, n;
} gemm_ctx;

static void gemm_task(void *arg, uint32_t task, uint32_t thread) {
  const gemm_ctx *g = arg;
  uint32_t j0 = task * NR, nr = g->n - j0 < NR ? g->n - j0 : NR;
  uint32_t i = 0;
  (void)thread;
  if (nr < NR) {
    for (; i < g->m; i++) gemm_1xn(g->x + (size_t)i * g->k, g->w + j0, g->n, g->y + (size_t)i * g->n + j0, g->k, nr);
    return;
  }
  for (; i + MR <= g->m; i += MR)
    gemm_8x32(g->x + (size_t)i * g->k, g->k, g->w + j0, g->n, g->y + (size_t)i * g->n + j0, g->n, g->k);
  for (; i < g->m; i++) gemm_1x32(g->x + (size_t)i * g->k, g->w + j0, g->n, g->y + (size_t)i * g->n + j0, g->k);
}

void tl_gemm(tl_pool *p, const float *x, const float *w, float *y, uint32_t m, uint32_t k, uint32_t n) {
  gemm_ctx g = {x, w, y, m, k, n};
  tl_pool_run(p, gemm_task, &g, (n + NR - 1) / NR);
}

/* ---- elementwise ---- */

#define LANES 16 /* fixed partial sums: the order of every sum below */

static float sum_fixed(const float *x, uint32_t n) {
  float part[LANES];
  memset(part, 0, sizeof part);
  uint32_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) part[l] += x[i + l];
  for (int l = 0; i < n; i++, l++) part[l] += x[i];
  float s = 0;
  for (int l = 0; l < LANES; l++) s += part[l];
  return s;
}

void tl_rmsnorm(const float *x, const float *g, float *out, uint32_t n) {
  float part[LANES];
  memset(part, 0, sizeof part);
  uint32_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) part[l] = fmaf(x[i + l], x[i + l], part[l]);
  for (int l = 0; i < n; i++, l++) part[l] = fmaf(x[i], x[i], part[l]);
  float ss = 0;
  for (int l = 0; l < LANES; l++) ss += part[l];
  float inv = 1.0f / sqrtf(ss / (float)n + 1e-5f);
  for (i = 0; i < n; i++) out[i] = x[i] * inv * g[i];
}

/* exp(x), x <= 0: 2^n * P(r), r = x - n ln2 in [-ln2/2, ln2/2], P degree 6
 * (relative error ~2e-7); below -87 it returns 0. */
void tl_exp_inplace(float *x, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    float v = x[i] < -87.0f ? -87.0f : x[i];
    float t = floorf(fmaf(v, 1.44269504f, 0.5f));
    float r = fmaf(t, -0.693145752f, v);
    r = fmaf(t, -1.42860677e-6f, r);
    float p = 1.38888889e-3f;
    p = fmaf(p, r, 8.33333333e-3f);
    p = fmaf(p, r, 4.16666667e-2f);
    p = fmaf(p, r, 1.66666667e-1f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t e = ((int32_t)t + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    x[i] = x[i] < -87.0f ? 0.0f : p * scale;
  }
}

/* ---- attention ---- */

typedef struct attn_ctx {
  const tl_attn_args *a;
  uint32_t n_tiles;
} attn_ctx;

/* Scores s[j] = q . k_j for keys j in block b (nk of them), the chain over
 * head dims in order, 16 keys per vector; lanes past a partial block are
 * computed from stale slot memory and never stored. */
static void scores_block(const float *kt, uint32_t bt, uint32_t hd, const float *q, float *s, uint32_t nk) {
  for (uint32_t j0 = 0; j0 < nk; j0 += 16) {
    v16 acc;
    memset(&acc, 0, sizeof acc);
    for (uint32_t d = 0; d < hd; d++) acc = q[d] * ld16(kt + (size_t)d * bt + j0) + acc;
    uint32_t take = nk - j0 < 16 ? nk - j0 : 16;
    memcpy(s + j0, &acc, take * sizeof(float));
  }
}

/* Softmax weights in place over s[0, n); returns 1 / their sum. */
static float softmax_row(float *s, uint32_t n) {
  float mx = s[0];
  for (uint32_t j = 1; j < n; j++) mx = s[j] > mx ? s[j] : mx;
  for (uint32_t j = 0; j < n; j++) s[j] -= mx;
  tl_exp_inplace(s, n);
  return 1.0f / sum_fixed(s, n);
}

static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

/* Task = (tile of TL_ATTN_TQ queries, kv head). Blocks are the outer loop
 * so that each K and V block serves every row of the tile from L1; per
 * element the order is still the fixed chain (over dims for a score, over
 * keys for an output). Scratch: rows x keys scores, then rows x hd sums. */
static void attn_task(void *arg, uint32_t task, uint32_t thread) {
  const attn_ctx *ac = arg;
  const tl_attn_args *a = ac->a;
  uint32_t tile = task % ac->n_tiles, g = task / ac->n_tiles;
  uint32_t grp = a->n_heads / a->n_kv_heads, hd = a->head_dim, bt = a->block_tokens;
  uint32_t q0 = tile * TL_ATTN_TQ, q1 = min_u32(q0 + TL_ATTN_TQ, a->nq), rows = (q1 - q0) * grp;
  uint32_t stride = a->pos0 + q1; /* keys of the tile's last query */
  float *scr = a->scratch[thread], *acc = scr + (size_t)rows * stride;
  for (uint32_t b = 0; b * bt < stride; b++) {
    const float *kt = a->kbase + (size_t)a->slots[b] * a->seg_floats + (size_t)g * hd * bt;
    for (uint32_t r = 0; r < rows; r++) {
      uint32_t qi = q0 + r / grp, nkeys = a->pos0 + qi + 1;
      if (b * bt >= nkeys) continue;
      const float *q = a->q + ((size_t)qi * a->n_heads + g * grp + r % grp) * hd;
      scores_block(kt, bt, hd, q, scr + (size_t)r * stride + b * bt, min_u32(nkeys - b * bt, bt));
    }
  }
  float inv[TL_ATTN_TQ * 64];
  for (uint32_t r = 0; r < rows; r++) inv[r] = softmax_row(scr + (size_t)r * stride, a->pos0 + q0 + r / grp + 1);
  memset(acc, 0, (size_t)rows * hd * sizeof *acc);
  for (uint32_t b = 0; b * bt < stride; b++) {
    const float *vb = a->vbase + (size_t)a->slots[b] * a->seg_floats + (size_t)g * bt * hd;
    for (uint32_t r = 0; r < rows; r++) {
      uint32_t nkeys = a->pos0 + q0 + r / grp + 1;
      if (b * bt >= nkeys) continue;
      uint32_t nk = min_u32(nkeys - b * bt, bt);
      const float *w = scr + (size_t)r * stride + b * bt;
      float *ar = acc + (size_t)r * hd;
      if (hd % 16 == 0 && hd <= 256) {
        v16 va[16];
        for (uint32_t c = 0; c < hd / 16; c++) va[c] = ld16(ar + 16 * c);
        for (uint32_t j = 0; j < nk; j++) {
          const float *vr = vb + (size_t)j * hd;
          float wj = w[j];
          for (uint32_t c = 0; c < hd / 16; c++) va[c] = wj * ld16(vr + 16 * c) + va[c];
        }
        for (uint32_t c = 0; c < hd / 16; c++) st16(ar + 16 * c, va[c]);
        continue;
      }
      for (uint32_t j = 0; j < nk; j++) {
        const float *vr = vb + (size_t)j * hd;
        float wj = w[j];
        for (uint32_t d = 0; d < hd; d++) ar[d] = fmaf(wj, vr[d], ar[d]);
      }
    }
  }
  for (uint32_t r = 0; r < rows; r++) {
    uint32_t qi = q0 + r / grp;
    float *o = a->out + ((size_t)qi * a->n_heads + g * grp + r % grp) * hd;
    for (uint32_t d = 0; d < hd; d++) o[d] = acc[(size_t)r * hd + d] * inv[r];
  }
}

void tl_attention(tl_pool *p, const tl_attn_args *a) {
  attn_ctx ac = {a, (a->nq + TL_ATTN_TQ - 1) / TL_ATTN_TQ};
  tl_pool_run(p, attn_task, &ac, ac.n_tiles * a->n_kv_heads);
}
