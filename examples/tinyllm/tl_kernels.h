/* tinyllm's compute kernels and its small thread pool (internal).
 *
 * Every kernel computes each output element with one fixed sequence of
 * fmaf() steps: results never depend on the batch, the tiling or the
 * number of threads (threads split outputs, never a reduction). */
#ifndef TL_KERNELS_H
#define TL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* A pool that runs fn(ctx, task) for task in [0, n_tasks), task i on
 * thread i % n_threads (thread 0 is the caller). */
typedef struct tl_pool tl_pool;
typedef void (*tl_task_fn)(void *ctx, uint32_t task, uint32_t thread);
int tl_pool_create(uint32_t n_threads, tl_pool **out);
void tl_pool_free(tl_pool *p);
uint32_t tl_pool_threads(const tl_pool *p);
void tl_pool_run(tl_pool *p, tl_task_fn fn, void *ctx, uint32_t n_tasks);

/* y[m][n] = x[m][k] . w[k][n] (row-major, w stored input-major). */
void tl_gemm(tl_pool *p, const float *x, const float *w, float *y, uint32_t m, uint32_t k, uint32_t n);

/* out[i] = x[i] / rms(x) * g[i] for one row of n. */
void tl_rmsnorm(const float *x, const float *g, float *out, uint32_t n);

/* exp(x) for x <= 0 (softmax, silu): a fixed polynomial, vectorisable. */
void tl_exp_inplace(float *x, uint32_t n);

/* Causal attention over a paged cache for queries at positions pos0..pos0+nq-1.
 * q: [nq][n_heads][head_dim] (already rotated and scaled); out likewise.
 * kbase/vbase: layer l's segment arrays; slots: block table. */
typedef struct tl_attn_args {
  const float *q;
  float *out;
  uint32_t nq, pos0;
  uint32_t n_heads, n_kv_heads, head_dim, block_tokens;
  const float *kbase, *vbase;
  size_t seg_floats;
  const uint32_t *slots;
  float **scratch;      /* per thread: TL_ATTN_TQ * group * max_ctx floats */
} tl_attn_args;

#define TL_ATTN_TQ 8 /* queries per attention tile */

void tl_attention(tl_pool *p, const tl_attn_args *a);

#endif
