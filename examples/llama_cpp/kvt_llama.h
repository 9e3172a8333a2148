/*
 * kvt_llama.h - llama.cpp conversations kept in kvtier.
 *
 * llama.cpp hands a sequence's KV cache over only as one opaque state
 * (llama_state_seq_get_data / set_data), so each idle conversation goes to
 * kvtier as an object filed under its prefix (kvt_object_put). A returning
 * conversation is restored from the longest stored prefix of its tokens,
 * truncated to the tokens that match (llama_memory_seq_rm), and only the
 * rest is prefilled, when the cost model (fed with the measured prefill
 * speed and copy bandwidths) says restoring beats recomputing.
 *
 * One llama.cpp context serves one conversation at a time in sequence 0:
 * the context's memory is what idle conversations are moved out of.
 * Not thread-safe: one kl_engine per serving thread.
 */
#ifndef KVT_LLAMA_H
#define KVT_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include <kvtier/kvtier.h>
#include <llama.h>

typedef struct kl_options {
  const char *model_path;
  int threads;             /* llama.cpp threads (2) */
  uint32_t n_ctx;          /* context tokens (4096) */
  const char *disk_path;   /* kvtier's disk tier; NULL: none */
  uint64_t host_bytes;     /* kvtier's host tier (256 MiB) */
  uint64_t disk_bytes;     /* kvtier's disk tier (1 GiB) */
  int disk_reset;          /* 1: start the disk tier empty */
  int write_through;       /* 1 (default): a parked state goes to disk at once too, so a restart keeps it */
  int force;               /* 0: the cost model decides; 1: always restore; -1: never */
} kl_options;

void kl_options_init(kl_options *o);

/* What kl_serve did for one turn. */
typedef struct kl_turn {
  uint64_t n_tokens;       /* the conversation's tokens this turn */
  uint64_t restored;       /* tokens whose KV came from kvtier */
  uint64_t computed;       /* tokens prefilled */
  uint32_t tier;           /* KVT_TIER_* of the object restored, else KVT_TIER_NONE */
  int refused;             /* an object was found but failed (corrupt, mismatch): recomputed */
  int decided_recompute;   /* the cost model chose recomputing over a stored object */
  double ttft_s;           /* from the call to the first token's logits */
  double est_restore_s, est_recompute_s;
  /* Where ttft_s went (wall seconds): kvt_object_find, kvt_object_get,
   * llama_state_seq_set_data plus the truncation, and the prefill. */
  double find_s, get_s, set_s, prefill_s;
  double restore_cpu_s;    /* process CPU time of find + get + set (every thread's) */
} kl_turn;

typedef struct kl_engine {
  struct llama_model *model;
  struct llama_context *ctx;
  const struct llama_vocab *vocab;
  int32_t n_vocab;
  kvt_cache *cache;
  kl_options opt;
  kvt_model_desc desc;
  kvt_hw_desc hw;          /* calibrated: achieved FLOP/s, set_data and disk speeds */
  uint8_t *state;          /* staging for one state: page-aligned, huge pages asked */
  size_t state_cap;
  void *state_map;         /* the mapping holding it */
  size_t state_map_len;
  llama_batch batch;
  uint32_t n_batch;
} kl_engine;

/* Loads the model, makes a context (flash attention off, fixed threads:
 * restores are bit-exact) and opens the kvtier cache. Returns 0 or a
 * negative code (kvtier's, or -EIO for llama.cpp failures, with a line on
 * stderr). */
int kl_open(kl_engine *e, const kl_options *o);
void kl_close(kl_engine *e);

/* Serves one turn of a conversation whose tokens are t[0..n): restores its
 * longest stored prefix (or not, as the cost model decides), prefills the
 * rest, and copies the last token's logits to logits (n_vocab floats, may be
 * NULL). The conversation then holds the context until kl_park. */
int kl_serve(kl_engine *e, const llama_token *t, size_t n, float *logits, kl_turn *turn);

/* The conversation in the context, t[0..n), goes idle: its state is put
 * into kvtier under its prefix and the context is cleared. Returns 0, 1 (an
 * object for that prefix was already stored, or kvtier was still moving
 * parts of the one stored there: not parked this time, which only costs a
 * recompute later) or a negative code. */
int kl_park(kl_engine *e, const llama_token *t, size_t n);

/* Closes kvtier's cache and opens it again on the same disk tier, as a
 * process restart does (llama.cpp's model and context stay): the host tier
 * starts empty, the disk tier is recovered. Returns 0 or kvt_open's code. */
int kl_restart_cache(kl_engine *e);

/* Drops the context's conversation without storing it (its cells; the
 * bytes left behind are masked out, never read). */
void kl_clear(kl_engine *e);

/* Prefills t[from..to) after what the context holds; logits as kl_serve. */
int kl_prefill(kl_engine *e, const llama_token *t, size_t from, size_t to, float *logits);

double kl_now(void);
double kl_cpu_now(void); /* the process's CPU time, every thread's (seconds) */

#endif
