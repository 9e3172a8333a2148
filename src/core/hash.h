/* Block keys: namespace and prefix-chained XXH3-128. Pure functions. */
#ifndef KVT_CORE_HASH_H
#define KVT_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/kvtier.h"

typedef struct kvt__ns_input {
  const char *model_fingerprint;
  uint32_t dtype, tp_rank, tp_size, block_tokens;
  uint64_t tenant_salt;
  /* KV geometry: blocks of different shapes must never alias. */
  uint32_t num_layers, segments_per_layer;
  const uint64_t *segment_bytes; /* num_layers * segments_per_layer */
} kvt__ns_input;

kvt_key kvt__namespace_key(const kvt__ns_input *in);

/* The XXH3 primitives every kvtier hash goes through (tested against
 * xxHash's own sanity vectors). */
kvt_key kvt__xxh3_128(const void *data, size_t len, uint64_t seed);
uint64_t kvt__xxh3_64(const void *data, size_t len, uint64_t seed);

/* key = XXH3_128(block tokens, seed = parent.lo), hi ^= parent.hi: both halves
 * of the parent shape the child, and hashing the tokens in place (no copy of
 * parent||tokens) keeps the chained hash near raw XXH3 speed. */
kvt_key kvt__chain_key(const kvt_key *parent, const uint32_t *tokens, uint32_t block_tokens);

/* Chains n_blocks full blocks starting after `parent`. */
void kvt__chain_keys(const kvt_key *parent, const uint32_t *tokens, size_t n_blocks,
                     uint32_t block_tokens, kvt_key *out);

/* Opaque engine key -> kvtier key in namespace ns. */
kvt_key kvt__opaque_key(const kvt_key *ns, const void *bytes, size_t len);

static inline int kvt__key_eq(const kvt_key *a, const kvt_key *b) {
  return a->lo == b->lo && a->hi == b->hi;
}

#endif
