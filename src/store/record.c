/* Record checksums and validation. kvt__record_check is written to be safe
 * on arbitrary bytes (it is a fuzz target): it never reads past len, never
 * assumes alignment, and trusts no length field until the header checksum
 * and the expected geometry both vouch for it. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: hashing allocates nothing */
#include <xxhash.h>

#include "store/disk_store.h"
#include "store/record.h"

/* Payloads are most of the bytes the disk tier moves, and hashing them is
 * most of its CPU: use XXH3's AVX2/AVX-512 code where the library has it
 * (the hash values are the same). */
#ifdef KVT_HAVE_XXH_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define payload_hash XXH3_64bits_dispatch
#define payload_hash_update XXH3_64bits_update_dispatch
#else
#define payload_hash XXH3_64bits
#define payload_hash_update XXH3_64bits_update
#endif

#define RECORD_MAX_TOKENS (1u << 20)

uint64_t kvt__record_hdr_sum(const kvt__record_hdr *h) {
  return XXH3_64bits(h, offsetof(kvt__record_hdr, hdr_sum));
}

static int key_eq(const kvt_key *a, const kvt_key *b) { return a->lo == b->lo && a->hi == b->hi; }

int kvt__record_seal_check(const void *rec, uint32_t block_tokens) {
  const kvt__record_hdr *h = rec;
  int with_tokens = (h->flags & KVT_RECORD_F_TOKENS) != 0;
  if (h->flags & ~KVT_RECORD_F_TOKENS) return -EINVAL;
  if (h->token_count != (with_tokens ? block_tokens : 0)) return -EINVAL;
  return 0;
}

int kvt__record_seal(void *rec, const kvt_key *ns, uint32_t block_tokens, uint64_t payload_bytes,
                     uint64_t seq) {
  kvt__record_hdr *h = rec;
  int rc = kvt__record_seal_check(rec, block_tokens);
  if (rc) return rc;
  h->magic = KVT_RECORD_MAGIC;
  h->version = KVT_RECORD_VERSION;
  h->ns = *ns;
  h->payload_len = payload_bytes;
  h->seq = seq;
  h->tokens_sum = XXH3_64bits(kvt__record_tokens(rec), (size_t)h->token_count * 4u);
  h->payload_sum = payload_hash(kvt__record_payload(rec, block_tokens), payload_bytes);
  h->hdr_sum = kvt__record_hdr_sum(h);
  memset(h->reserved, 0, sizeof h->reserved);
  return 0;
}

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* Header alone: checksum, then identity, then geometry. */
static int check_header(const kvt__record_hdr *h, const kvt_key *ns, uint32_t block_tokens,
                        uint64_t payload_bytes, const kvt_key *expected_key) {
  if (h->magic != KVT_RECORD_MAGIC || h->hdr_sum != kvt__record_hdr_sum(h)) return KVT_ECORRUPT;
  if (h->version != KVT_RECORD_VERSION) return KVT_ECORRUPT;
  if (!key_eq(&h->ns, ns) || (expected_key && !key_eq(&h->key, expected_key))) return KVT_EMISMATCH;
  if (h->flags & ~KVT_RECORD_F_TOKENS) return KVT_ECORRUPT;
  if (h->token_count != ((h->flags & KVT_RECORD_F_TOKENS) ? block_tokens : 0)) return KVT_ECORRUPT;
  if (h->payload_len != payload_bytes) return KVT_ECORRUPT;
  return 0;
}

int kvt__record_check(const void *buf, size_t len, const kvt_key *ns, uint32_t block_tokens,
                      uint64_t payload_bytes, const kvt_key *expected_key, int verify_payload,
                      kvt__record_hdr *out) {
  if (!buf || !ns || block_tokens == 0 || block_tokens > RECORD_MAX_TOKENS) return -EINVAL;
  if (payload_bytes > SIZE_MAX / 2) return -EINVAL;
  if (len < KVT_RECORD_HDR_BYTES) return KVT_ECORRUPT;
  kvt__record_hdr h;
  memcpy(&h, buf, sizeof h);
  if (all_zero(buf, KVT_RECORD_HDR_BYTES)) return KVT_EMISS; /* never written, or a tombstone */
  int rc = check_header(&h, ns, block_tokens, payload_bytes, expected_key);
  if (rc) return rc;
  size_t prefix = kvt__record_prefix_bytes(block_tokens);
  if (len < KVT_RECORD_HDR_BYTES + (size_t)h.token_count * 4u) return KVT_ECORRUPT;
  if (XXH3_64bits((const char *)buf + KVT_RECORD_HDR_BYTES, (size_t)h.token_count * 4u) != h.tokens_sum)
    return KVT_ECORRUPT;
  if (verify_payload) {
    if (len < prefix || len - prefix < payload_bytes) return KVT_ECORRUPT;
    if (payload_hash((const char *)buf + prefix, payload_bytes) != h.payload_sum) return KVT_ECORRUPT;
  }
  if (out) *out = h;
  return 0;
}

/* ---- records in pieces ---- */

/* XXH3_64 of the first `bytes` of iov[0..n): the same value as the one-shot
 * hash of those bytes laid end to end (XXH3's streaming and one-shot forms
 * agree), so a record's payload sum does not depend on how it was split.
 * With zero_tail, the bytes past iov[0..n) count as zeros (a record read in
 * part: its writer left them zero). */
static uint64_t pieces_hash(const struct iovec *iov, uint32_t n, uint64_t bytes, int zero_tail) {
  static const unsigned char zeros[16384];
  if (n >= 1 && iov[0].iov_len >= bytes) return payload_hash(iov[0].iov_base, bytes);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  for (uint32_t i = 0; i < n && bytes; i++) {
    size_t k = iov[i].iov_len < bytes ? iov[i].iov_len : bytes;
    payload_hash_update(&st, iov[i].iov_base, k);
    bytes -= k;
  }
  while (zero_tail && bytes) {
    size_t k = bytes < sizeof zeros ? (size_t)bytes : sizeof zeros;
    payload_hash_update(&st, zeros, k);
    bytes -= k;
  }
  return XXH3_64bits_digest(&st);
}

/* The prefix, then the payload's pieces: all of it (at least
 * payload_bytes), or with zero_tail any part of it. */
static int pieces_ok(const struct iovec *iov, uint32_t n, uint32_t block_tokens, uint64_t payload_bytes,
                     int zero_tail) {
  if (!iov || n < 2 || iov[0].iov_len != kvt__record_prefix_bytes(block_tokens)) return 0;
  uint64_t sum = 0;
  for (uint32_t i = 1; i < n; i++) sum += iov[i].iov_len;
  return sum >= payload_bytes || (zero_tail && sum > 0);
}

int kvt__record_seal_iov(const struct iovec *iov, uint32_t n, const kvt_key *ns, uint32_t block_tokens,
                         uint64_t payload_bytes, uint64_t seq) {
  if (!pieces_ok(iov, n, block_tokens, payload_bytes, 0)) return -EINVAL;
  kvt__record_hdr *h = iov[0].iov_base;
  int rc = kvt__record_seal_check(h, block_tokens);
  if (rc) return rc;
  h->magic = KVT_RECORD_MAGIC;
  h->version = KVT_RECORD_VERSION;
  h->ns = *ns;
  h->payload_len = payload_bytes;
  h->seq = seq;
  h->tokens_sum = XXH3_64bits(kvt__record_tokens(h), (size_t)h->token_count * 4u);
  h->payload_sum = pieces_hash(iov + 1, n - 1, payload_bytes, 0);
  h->hdr_sum = kvt__record_hdr_sum(h);
  memset(h->reserved, 0, sizeof h->reserved);
  return 0;
}

int kvt__record_check_iov(const struct iovec *iov, uint32_t n, const kvt_key *ns, uint32_t block_tokens,
                          uint64_t payload_bytes, int zero_tail, const kvt_key *expected_key,
                          kvt__record_hdr *out) {
  if (!pieces_ok(iov, n, block_tokens, payload_bytes, zero_tail)) return -EINVAL;
  kvt__record_hdr h;
  int rc = kvt__record_check(iov[0].iov_base, iov[0].iov_len, ns, block_tokens, payload_bytes, expected_key, 0, &h);
  if (rc) return rc;
  if (pieces_hash(iov + 1, n - 1, payload_bytes, zero_tail) != h.payload_sum) return KVT_ECORRUPT;
  if (out) *out = h;
  return 0;
}
