#include "core/hash.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static kvt_key key_from(XXH128_hash_t h) {
  kvt_key k = {h.low64, h.high64};
  return k;
}

kvt_key kvt__namespace_key(const kvt__ns_input *in) {
  XXH3_state_t st;
  memset(&st, 0, sizeof st); /* xxhash 0.8.1 reads seed before reset writes it */
  XXH3_128bits_reset_withSeed(&st, 0x6b76746965722d31ull); /* "kvtier-1" */
  const char *fp = in->model_fingerprint ? in->model_fingerprint : "";
  uint64_t fp_len = strlen(fp);
  /* Length-prefixed fields: no two distinct inputs serialise alike. */
  XXH3_128bits_update(&st, &fp_len, sizeof fp_len);
  XXH3_128bits_update(&st, fp, fp_len);
  uint32_t fixed[6] = {in->dtype, in->tp_rank, in->tp_size, in->block_tokens, in->num_layers,
                       in->segments_per_layer};
  XXH3_128bits_update(&st, fixed, sizeof fixed);
  XXH3_128bits_update(&st, &in->tenant_salt, sizeof in->tenant_salt);
  if (in->segment_bytes)
    XXH3_128bits_update(&st, in->segment_bytes,
                        sizeof(uint64_t) * in->num_layers * in->segments_per_layer);
  return key_from(XXH3_128bits_digest(&st));
}

kvt_key kvt__xxh3_128(const void *data, size_t len, uint64_t seed) {
  return key_from(XXH3_128bits_withSeed(data, len, seed));
}

uint64_t kvt__xxh3_64(const void *data, size_t len, uint64_t seed) { return XXH3_64bits_withSeed(data, len, seed); }

kvt_key kvt__chain_key(const kvt_key *parent, const uint32_t *tokens, uint32_t block_tokens) {
  kvt_key k = kvt__xxh3_128(tokens, (size_t)block_tokens * sizeof(uint32_t), parent->lo);
  k.hi ^= parent->hi;
  return k;
}

void kvt__chain_keys(const kvt_key *parent, const uint32_t *tokens, size_t n_blocks,
                     uint32_t block_tokens, kvt_key *out) {
  kvt_key prev = *parent;
  for (size_t i = 0; i < n_blocks; i++) {
    prev = kvt__chain_key(&prev, tokens + i * block_tokens, block_tokens);
    out[i] = prev;
  }
}

kvt_key kvt__opaque_key(const kvt_key *ns, const void *bytes, size_t len) {
  kvt_key k = key_from(XXH3_128bits_withSeed(bytes, len, ns->lo ^ 0x6f70617175650000ull));
  k.hi ^= ns->hi;
  return k;
}
