/* The block record: the image of one block, identical in a host-pool slot and
 * in a disk slot, so a spill or a fetch is one aligned transfer.
 *
 *   [ header (128 B) | token ids (token_count x u32) | pad to 4 KiB ]  prefix
 *   [ payload: the block's segments, layer-major, padded to 4 KiB   ]
 *
 * The engine fills the identity fields (key, parent, namespace, tokens)
 * when a block lands on the host; the disk store computes the checksums when
 * it writes and verifies them when it reads. */
#ifndef KVT_STORE_RECORD_H
#define KVT_STORE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/kvtier.h"

#define KVT_RECORD_MAGIC 0x5254564bu /* "KVTR" little-endian */
#define KVT_RECORD_VERSION 1u
#define KVT_RECORD_ALIGN 4096u
#define KVT_RECORD_HDR_BYTES 128u

#define KVT_RECORD_F_TOKENS 0x1u /* token ids are present (verification possible) */

typedef struct kvt__record_hdr {
  uint32_t magic;
  uint32_t version;
  kvt_key ns;
  kvt_key key;
  kvt_key parent;
  uint32_t token_count;   /* block_tokens when F_TOKENS, else 0 */
  uint32_t flags;
  uint64_t payload_len;
  uint64_t seq;           /* write sequence number: newest wins at recovery */
  uint64_t tokens_sum;    /* XXH3_64 of the token ids */
  uint64_t payload_sum;   /* XXH3_64 of the payload */
  uint64_t hdr_sum;       /* XXH3_64 of the header bytes before this field */
  uint8_t reserved[KVT_RECORD_HDR_BYTES - 4 * 2 - 16 * 3 - 4 * 2 - 8 * 5];
} kvt__record_hdr;

_Static_assert(sizeof(kvt__record_hdr) == KVT_RECORD_HDR_BYTES, "record header is 128 bytes");

static inline size_t kvt__align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Bytes of the header + tokens part, a multiple of 4 KiB. */
static inline size_t kvt__record_prefix_bytes(uint32_t block_tokens) {
  return kvt__align_up(KVT_RECORD_HDR_BYTES + (size_t)block_tokens * 4u, KVT_RECORD_ALIGN);
}
/* Bytes of a whole record (= one host slot = one disk slot). */
static inline size_t kvt__record_bytes(uint32_t block_tokens, size_t payload) {
  return kvt__record_prefix_bytes(block_tokens) + kvt__align_up(payload, KVT_RECORD_ALIGN);
}
static inline uint32_t *kvt__record_tokens(void *rec) {
  return (uint32_t *)((char *)rec + KVT_RECORD_HDR_BYTES);
}
static inline void *kvt__record_payload(void *rec, uint32_t block_tokens) {
  return (char *)rec + kvt__record_prefix_bytes(block_tokens);
}

#endif
