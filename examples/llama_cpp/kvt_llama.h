/*
 * kvt_llama.h - llama.cpp conversations kept in kvtier.
 *
 * llama.cpp hands a sequence's KV cache over only as opaque states
 * (llama_state_seq_get_data / set_data), so each idle conversation goes to
 * kvtier as objects (kvt_object_put) filed under its prefix: its whole
 * state as one object (chunk_tokens 0, the default), or one object per
 * chunk of chunk_tokens tokens, the state of that chunk's cells, filed
 * under the prefix that ends with it. Conversations that share a prefix
 * share its chunks, and a conversation parked again stores only its new
 * ones. A returning conversation is restored from the longest stored
 * prefix (in chunks: the longest chain of stored chunks) that matches its
 * tokens, truncated to the tokens that match (llama_memory_seq_rm), and
 * only the rest is prefilled, when the cost model (fed with the measured
 * prefill speed and copy bandwidths) says restoring beats recomputing.
 * Chunks are read on two threads of the engine's while each one that has
 * landed is handed to llama.cpp, so set_data overlaps the reads.
 *
 * One llama.cpp context serves one conversation at a time in sequence 0
 * (sequence 1 carries chunks in and out): the context's memory is what
 * idle conversations are moved out of. Not thread-safe: one kl_engine per
 * serving thread.
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
  uint32_t chunk_tokens;   /* 0 (the default): a parked conversation's state is one object,
                              restored whole; else it is stored in chunks of this many
                              tokens (a multiple of 32, at least 64; 512 is a good size),
                              shared by prefix and restored with the reads overlapping
                              set_data. Part of the cache's namespace. */
} kl_options;

void kl_options_init(kl_options *o);

/* What kl_serve did for one turn. */
typedef struct kl_turn {
  uint64_t n_tokens;       /* the conversation's tokens this turn */
  uint64_t restored;       /* tokens whose KV came from kvtier */
  uint64_t computed;       /* tokens prefilled */
  uint32_t tier;           /* KVT_TIER_* of the slowest chunk restored, else KVT_TIER_NONE */
  uint32_t chunks;         /* chunks restored */
  int refused;             /* a chunk was found but not restored (damaged, evicted since): the
                              tokens from it on were computed */
  int decided_recompute;   /* the cost model chose recomputing over a stored object */
  double ttft_s;           /* from the call to the first token's logits */
  double est_restore_s, est_recompute_s;
  /* Where ttft_s went (wall seconds): the restore (restore_s: finding the
   * chunks, then reading them while earlier ones are handed to llama.cpp)
   * and the prefill. Within the restore: kvt_object_find of every chunk
   * (find_s); kvt_object_get of every chunk (get_s, on the reading threads)
   * and llama_state_seq_set_data plus the truncation and tagging (set_s),
   * which overlap, so restore_s < find_s + get_s + set_s. */
  double restore_s, find_s, get_s, set_s, prefill_s;
  double restore_cpu_s;    /* process CPU time of the restore (every thread's) */
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
  struct kl_fetcher *fetch; /* the two threads that read a restore's chunks */
  uint64_t chunks_put;     /* chunks stored by kl_store / kl_park */
  uint64_t chunks_kept;    /* chunks kl_store found stored already (shared prefixes, earlier parks) */
} kl_engine;

/* Loads the model, makes a context (flash attention off, fixed threads:
 * restores are bit-exact) and opens the kvtier cache. Returns 0 or a
 * negative code (kvtier's, -EINVAL for options it refuses, or -EIO for
 * llama.cpp failures, with a line on stderr); after a failure too,
 * kl_close frees what was made. */
int kl_open(kl_engine *e, const kl_options *o);
void kl_close(kl_engine *e);

/* Serves one turn of a conversation whose tokens are t[0..n): restores its
 * longest stored prefix (or not, as the cost model decides), prefills the
 * rest, and copies the last token's logits to logits (n_vocab floats, may be
 * NULL). The conversation then holds the context until kl_park. */
int kl_serve(kl_engine *e, const llama_token *t, size_t n, float *logits, kl_turn *turn);

/* The conversation in the context, t[0..n) (n >= 32), goes idle: its
 * state is put into kvtier, whole or chunk by chunk (the chunks already
 * stored are kept as they are), and the context is cleared. The context
 * must hold the cells of t[0..n) (positions 0 to n - 1; a sampled token not
 * yet decoded is not in it): else -EINVAL and nothing is stored. Returns 0,
 * 1 (a chunk was not stored this time: another object under its prefix,
 * or kvtier was still moving parts of the one stored there; that only
 * costs a recompute later) or a negative code. A shorter state of the same
 * tokens under the same key (the conversation grew within its last
 * 32-token block) is replaced. */
int kl_park(kl_engine *e, const llama_token *t, size_t n);

/* kl_park without clearing the context, into the cache `into` (NULL: the
 * engine's own; another kl_engine's cache of the same model and
 * chunk_tokens). */
int kl_store(kl_engine *e, kvt_cache *into, const llama_token *t, size_t n);

/* Closes kvtier's cache and opens it again on the same disk tier, as a
 * process restart does (llama.cpp's model and context stay): the host tier
 * starts empty, the disk tier is recovered. Returns 0, or kvt_open's or
 * kvt_register_layout's code (say, the disk tier's path cannot be opened):
 * the engine then has no cache (e->cache NULL) until a kl_restart_cache
 * succeeds; kl_serve recomputes every turn and kl_park returns KVT_ESTATE. */
int kl_restart_cache(kl_engine *e);

/* Drops the context's conversation without storing it (its cells; the
 * bytes left behind are masked out, never read). */
void kl_clear(kl_engine *e);

/* Prefills t[from..to) after what the context holds; logits as kl_serve. */
int kl_prefill(kl_engine *e, const llama_token *t, size_t from, size_t to, float *logits);

double kl_now(void);
double kl_cpu_now(void); /* the process's CPU time, every thread's (seconds) */

#endif
