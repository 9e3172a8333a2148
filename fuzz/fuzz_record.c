/* libFuzzer target: the on-disk record parser, kvt__record_check().
 *
 * Input byte 0 picks a mode:
 *  even: the rest is raw bytes checked as a record of a geometry taken from
 *        byte 1 (never crashes, never reads past len, any alignment);
 *  odd:  the rest seeds a well-formed record (tokens and payload from the
 *        input), sealed with kvt__record_seal(), then one byte at a chosen
 *        offset is flipped: a flip in the bytes the checksums cover must be
 *        caught, and the untouched record must pass (a round trip). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/disk_store.h"
#include "store/record.h"

static const kvt_key ns = {0x1234567890abcdefull, 0x0fedcba987654321ull};

static void raw(const uint8_t *d, size_t n) {
  if (n < 1) return;
  uint32_t bt = 16u << (d[0] & 3);           /* 16..128 tokens */
  uint64_t payload = 64u * (1 + (d[0] >> 2)); /* 64..4096 bytes */
  kvt_key want = {0, 0};
  const kvt_key *expect = NULL;
  if (n > 17 && (d[0] & 0x80)) {
    memcpy(&want, d + 1, sizeof want);
    expect = &want;
  }
  /* An exact-size heap copy so ASan sees any read past the end. */
  uint8_t *buf = malloc(n - 1 ? n - 1 : 1);
  memcpy(buf, d + 1, n - 1);
  kvt__record_hdr h;
  int rc = kvt__record_check(buf, n - 1, &ns, bt, payload, expect, (d[0] >> 6) & 1, &h);
  if (rc == 0 && (h.magic != KVT_RECORD_MAGIC || h.payload_len != payload)) abort();
  if (rc != 0 && rc != KVT_EMISS && rc != KVT_ECORRUPT && rc != KVT_EMISMATCH) abort();
  /* Unaligned: the same answer from an odd address. */
  uint8_t *odd = malloc(n);
  memcpy(odd + 1, d + 1, n - 1);
  if (kvt__record_check(odd + 1, n - 1, &ns, bt, payload, expect, (d[0] >> 6) & 1, NULL) != rc) abort();
  free(odd);
  free(buf);
}

static void sealed_flip(const uint8_t *d, size_t n) {
  if (n < 5) return;
  uint32_t bt = 16;
  uint64_t payload = 256u * (1 + (d[0] >> 4)); /* 256..4096 */
  size_t len = kvt__record_bytes(bt, payload);
  uint8_t *rec = aligned_alloc(4096, len);
  memset(rec, 0, len);
  kvt__record_hdr *h = (kvt__record_hdr *)rec;
  h->key = (kvt_key){d[1] * 0x9e3779b97f4a7c15ull, 7};
  h->parent = ns;
  if (d[0] & 2) {
    h->flags = KVT_RECORD_F_TOKENS;
    h->token_count = bt;
  }
  const uint8_t *src = d + 5;
  size_t m = n - 5;
  for (size_t i = 0; m && i < (size_t)bt * 4; i++) ((uint8_t *)kvt__record_tokens(rec))[i] = src[i % m];
  for (size_t i = 0; m && i < payload; i++) ((uint8_t *)kvt__record_payload(rec, bt))[i] = src[(i * 7) % m];
  if (kvt__record_seal(rec, &ns, bt, payload, 1 + d[1]) != 0) abort();
  if (kvt__record_check(rec, len, &ns, bt, payload, &h->key, 1, NULL) != 0) abort(); /* round trip */
  kvt_key other = h->key;
  other.hi ^= 1;
  if (kvt__record_check(rec, len, &ns, bt, payload, &other, 1, NULL) != KVT_EMISMATCH) abort();
  size_t at = ((size_t)d[2] << 8 | d[3]) * 97 % len;
  uint8_t x = d[4] ? d[4] : 1;
  rec[at] ^= x;
  size_t tok_end = KVT_RECORD_HDR_BYTES + (size_t)h->token_count * 4;
  size_t pay_off = kvt__record_prefix_bytes(bt);
  int covered = at < offsetof(kvt__record_hdr, hdr_sum) + 8 || (at >= KVT_RECORD_HDR_BYTES && at < tok_end) ||
                (at >= pay_off && at < pay_off + payload);
  /* token_count covers how many token bytes are summed; a flip there is in the header. */
  int rc = kvt__record_check(rec, len, &ns, bt, payload, NULL, 1, NULL);
  if (covered && rc == 0) abort(); /* a corrupt record would have been returned */
  if (!covered && rc != 0) abort(); /* padding and reserved bytes are not part of the record */
  free(rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) sealed_flip(data + 1, size - 1);
  else raw(data + 1, size - 1);
  return 0;
}
