/* Objects: an engine's opaque state of any size, filed under the chain key
 * of the last full block it covers and stored as storage-mode blocks
 * ("parts") under keys derived from that key. Built on the public storage
 * calls only, so tiers, records, checksums, LRU and recovery are theirs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "engine/engine.h"

#define OBJECT_MAGIC 0x31304a424f54564bull /* "KVTOBJ01" */

/* At the start of part 0; the object's bytes follow it. */
typedef struct object_header {
  uint64_t magic;
  uint64_t bytes;
  uint64_t n_tokens;
  uint64_t tokens_hash; /* XXH3-64 of tokens[0..n_tokens) */
  uint64_t data_hash;   /* XXH3-64 of the object's bytes */
  kvt_key key;
  uint32_t parts;
  uint32_t reserved;
} object_header;

_Static_assert(sizeof(object_header) == 64, "object header layout");

#define HEADER_BYTES sizeof(object_header)
#define MAX_OBJECT_BYTES ((uint64_t)1 << 40)

/* Part i's key: the prefix key and i, as an opaque key of this namespace. */
static void part_keys(kvt_cache *c, const kvt_key *key, uint32_t first, uint32_t n, kvt_key *out) {
  for (uint32_t i = 0; i < n; i++) {
    uint64_t in[4] = {key->lo, key->hi, first + i, OBJECT_MAGIC};
    out[i] = kvt__opaque_key(&c->ns, in, sizeof in);
  }
}

static int parts_present(kvt_cache *c, const struct object_header *h, uint32_t *tier);

static uint32_t parts_for(uint64_t bytes, size_t block) {
  return (uint32_t)((bytes + HEADER_BYTES + block - 1) / block);
}

/* The prefix keys of tokens' full blocks: *keys (malloc'd, n of them). */
static int prefix_keys(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, kvt_key **keys, size_t *n) {
  if (!c || !tokens) return -EINVAL;
  int rc = kvt_hash_tokens(c, NULL, tokens, n_tokens, NULL, 0, n);
  if (rc != -ENOBUFS && rc != 0) return rc;
  if (*n == 0) return -EINVAL;
  if (!(*keys = malloc(*n * sizeof(kvt_key)))) return -ENOMEM;
  rc = kvt_hash_tokens(c, NULL, tokens, n_tokens, *keys, *n, n);
  if (rc) free(*keys);
  return rc;
}

/* Runs one opaque-keyed storage batch, one piece per part, and waits. */
static int run_parts(kvt_cache *c, int get, const kvt_key *keys, const kvt_piece *pieces, uint32_t n) {
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = n;
  b.keys = keys;
  b.pieces = pieces;
  b.pieces_per_block = 1;
  b.flags = KVT_KEYS_OPAQUE;
  kvt_job job;
  int rc = get ? kvt_get_into(c, &b, &job) : kvt_put_from(c, &b, &job);
  if (rc != 1) return rc;
  rc = kvt_storage_wait(c, job, -1);
  uint32_t n_ok = 0;
  if (rc == 0 && get) {
    int32_t *res = malloc(n * sizeof *res);
    if (!res) rc = -ENOMEM;
    else if ((rc = kvt_storage_results(c, job, res, n, &n_ok)) == 0 && n_ok < n)
      rc = res[n_ok] == 1 ? KVT_EMISS : res[n_ok];
    free(res);
  }
  kvt_storage_release(c, job);
  return rc;
}

/* The pieces of an object of `bytes` in buf: part 0 and the last part go
 * through scratch blocks (header, tail padding), the parts between straight
 * to or from buf. */
static void object_pieces(char *buf, uint64_t bytes, size_t block, uint32_t parts, char *first, char *last,
                          kvt_piece *p) {
  for (uint32_t i = 0; i < parts; i++) {
    char *at = i == 0 ? first : i == parts - 1 ? last : buf + (size_t)i * block - HEADER_BYTES;
    p[i] = (kvt_piece){.ptr = at, .len = block};
  }
  (void)bytes;
}

/* The bytes of part 0 after the header and of the last part. */
static size_t first_len(uint64_t bytes, size_t block) {
  return (size_t)(bytes < block - HEADER_BYTES ? bytes : block - HEADER_BYTES);
}
static size_t last_off(uint32_t parts, size_t block) { return (size_t)(parts - 1) * block - HEADER_BYTES; }

int kvt_object_put(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, const void *data, size_t len) {
  if (!c || !tokens || !data || len == 0 || len > MAX_OBJECT_BYTES) return -EINVAL;
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  int rc = prefix_keys(c, tokens, n_tokens, &keys, &n_keys);
  if (rc) return rc;
  size_t block = kvt_block_bytes(c);
  object_header h = {.magic = OBJECT_MAGIC,
                     .bytes = len,
                     .n_tokens = n_tokens,
                     .tokens_hash = kvt__xxh3_64(tokens, n_tokens * sizeof *tokens, 0),
                     .data_hash = kvt__xxh3_64(data, len, 0),
                     .key = keys[n_keys - 1],
                     .parts = parts_for(len, block)};
  free(keys);
  kvt_key *pk = malloc(h.parts * sizeof *pk);
  kvt_piece *p = malloc(h.parts * sizeof *p);
  char *first = calloc(2, block), *last = first ? first + block : NULL;
  if (!pk || !p || !first) {
    rc = -ENOMEM;
    goto out;
  }
  part_keys(c, &h.key, 0, h.parts, pk);
  kvt_lookup_result res = {.size = sizeof res};
  if ((rc = kvt_exists(c, NULL, pk, h.parts, KVT_KEYS_OPAQUE, &res, NULL)) != 0) goto out;
  if (res.n_prefix == h.parts) {
    rc = 1;
    goto out;
  }
  /* Parts left by an object partly evicted would be skipped by the put. */
  kvt_remove(c, pk, h.parts, NULL);
  memcpy(first, &h, HEADER_BYTES);
  memcpy(first + HEADER_BYTES, data, first_len(len, block));
  if (h.parts > 1) memcpy(last, (const char *)data + last_off(h.parts, block), len - last_off(h.parts, block));
  object_pieces((char *)(uintptr_t)data, len, block, h.parts, first, last, p);
  /* The header's part last, so that a reader never finds it before the rest. */
  if (h.parts > 1 && (rc = run_parts(c, 0, pk + 1, p + 1, h.parts - 1)) != 0) goto out;
  if ((rc = run_parts(c, 0, pk, p, 1)) != 0) goto out;
  /* Parts evicted by the object's own later parts: larger than the tiers. */
  uint32_t tier;
  if (parts_present(c, &h, &tier) == KVT_EMISS) {
    kvt_remove(c, pk, h.parts, NULL);
    rc = KVT_ENOSPACE;
  }
out:
  free(pk);
  free(p);
  free(first);
  return rc;
}

/* Reads and checks the header of the object filed under key into *h. */
static int read_header(kvt_cache *c, const kvt_key *key, char *scratch, size_t block, object_header *h) {
  kvt_key k0;
  part_keys(c, key, 0, 1, &k0);
  kvt_lookup_result res = {.size = sizeof res};
  int rc = kvt_exists(c, NULL, &k0, 1, KVT_KEYS_OPAQUE, &res, NULL);
  if (rc) return rc;
  if (res.n_prefix != 1) return KVT_EMISS;
  kvt_piece p = {.ptr = scratch, .len = block};
  if ((rc = run_parts(c, 1, &k0, &p, 1)) != 0) return rc;
  memcpy(h, scratch, HEADER_BYTES);
  if (h->magic != OBJECT_MAGIC || !kvt__key_eq(&h->key, key) || h->bytes == 0 ||
      h->bytes > MAX_OBJECT_BYTES || h->parts != parts_for(h->bytes, block))
    return KVT_ECORRUPT;
  return 0;
}

/* Every part in a tier: 0 and the slowest tier in *tier, else KVT_EMISS. */
static int parts_present(kvt_cache *c, const struct object_header *h, uint32_t *tier) {
  kvt_key *pk = malloc(h->parts * sizeof *pk);
  uint8_t *tiers = malloc(h->parts);
  int rc = -ENOMEM;
  if (pk && tiers) {
    part_keys(c, &h->key, 0, h->parts, pk);
    kvt_lookup_result res = {.size = sizeof res};
    rc = kvt_exists(c, NULL, pk, h->parts, KVT_KEYS_OPAQUE, &res, tiers);
    if (rc == 0 && res.n_prefix != h->parts) rc = KVT_EMISS;
    *tier = KVT_TIER_DEVICE;
    for (uint32_t i = 0; rc == 0 && i < h->parts; i++)
      if (tiers[i] > *tier) *tier = tiers[i];
  }
  free(pk);
  free(tiers);
  return rc;
}

int kvt_object_find(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, kvt_object_info *info) {
  if (!info || info->size < KVT_OBJECT_INFO_SIZE_V1) return info ? KVT_EVERSION : -EINVAL;
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  int rc = prefix_keys(c, tokens, n_tokens, &keys, &n_keys);
  if (rc) return rc == -EINVAL && c && tokens ? KVT_EMISS : rc;
  size_t block = kvt_block_bytes(c);
  char *scratch = malloc(block);
  rc = scratch ? KVT_EMISS : -ENOMEM;
  for (size_t i = n_keys; scratch && i-- > 0;) {
    object_header h;
    uint32_t tier;
    int r = read_header(c, &keys[i], scratch, block, &h);
    if (r == 0) r = parts_present(c, &h, &tier);
    if (r == -ENOMEM || r == -EINVAL) {
      rc = r;
      break;
    }
    if (r) continue;
    uint64_t prefix = (uint64_t)(i + 1) * c->bt;
    uint64_t match = prefix;
    if (h.n_tokens <= n_tokens && kvt__xxh3_64(tokens, h.n_tokens * sizeof *tokens, 0) == h.tokens_hash)
      match = h.n_tokens;
    else if (h.n_tokens < prefix)
      continue; /* a header that does not cover its own key */
    kvt_object_info out = {.size = KVT_OBJECT_INFO_SIZE_V1,
                           .parts = h.parts,
                           .bytes = h.bytes,
                           .n_tokens = h.n_tokens,
                           .match_tokens = match,
                           .key = h.key,
                           .tier = tier};
    memcpy(info, &out, KVT_OBJECT_INFO_SIZE_V1);
    rc = 0;
    break;
  }
  free(scratch);
  free(keys);
  return rc;
}

static void remove_parts(kvt_cache *c, const kvt_key *key, uint32_t parts) {
  kvt_key *pk = malloc(parts * sizeof *pk);
  if (!pk) return;
  part_keys(c, key, 0, parts, pk);
  kvt_remove(c, pk, parts, NULL);
  free(pk);
}

/* The caller's first n tokens are the prefix filed under key. */
static int tokens_have_key(kvt_cache *c, const uint32_t *tokens, uint64_t n, const kvt_key *key) {
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  if (n % c->bt || prefix_keys(c, tokens, (size_t)n, &keys, &n_keys)) return 0;
  int same = kvt__key_eq(&keys[n_keys - 1], key);
  free(keys);
  return same;
}

int kvt_object_get(kvt_cache *c, const kvt_object_info *info, const uint32_t *tokens, void *buf, size_t cap) {
  if (!c || !info || !tokens || !buf || info->size < KVT_OBJECT_INFO_SIZE_V1 || !info->parts || !info->bytes)
    return -EINVAL;
  if (cap < info->bytes) return -ENOBUFS;
  size_t block = kvt_block_bytes(c);
  if (!block || info->parts != parts_for(info->bytes, block)) return -EINVAL;
  uint32_t parts = info->parts;
  kvt_key *pk = malloc(parts * sizeof *pk);
  kvt_piece *p = malloc(parts * sizeof *p);
  char *first = malloc(2 * block), *last = first ? first + block : NULL;
  int rc = -ENOMEM;
  if (!pk || !p || !first) goto out;
  part_keys(c, &info->key, 0, parts, pk);
  object_pieces(buf, info->bytes, block, parts, first, last, p);
  if ((rc = run_parts(c, 1, pk, p, parts)) != 0) {
    if (rc == KVT_ECORRUPT) remove_parts(c, &info->key, parts);
    goto out;
  }
  object_header h;
  memcpy(&h, first, HEADER_BYTES);
  if (h.magic != OBJECT_MAGIC || !kvt__key_eq(&h.key, &info->key) || h.bytes != info->bytes ||
      h.parts != parts) {
    rc = KVT_ECORRUPT;
  } else {
    memcpy(buf, first + HEADER_BYTES, first_len(h.bytes, block));
    if (parts > 1) memcpy((char *)buf + last_off(parts, block), last, h.bytes - last_off(parts, block));
    if (info->match_tokens >= h.n_tokens ? kvt__xxh3_64(tokens, h.n_tokens * sizeof *tokens, 0) != h.tokens_hash
                                          : !tokens_have_key(c, tokens, info->match_tokens, &h.key))
      rc = KVT_EMISMATCH;
    else if (kvt__xxh3_64(buf, h.bytes, 0) != h.data_hash)
      rc = KVT_ECORRUPT;
  }
  if (rc == KVT_ECORRUPT) remove_parts(c, &info->key, parts);
out:
  free(pk);
  free(p);
  free(first);
  return rc;
}

int kvt_object_remove(kvt_cache *c, const uint32_t *tokens, size_t n_tokens) {
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  int rc = prefix_keys(c, tokens, n_tokens, &keys, &n_keys);
  if (rc) return rc;
  size_t block = kvt_block_bytes(c);
  char *scratch = malloc(block);
  object_header h;
  rc = scratch ? read_header(c, &keys[n_keys - 1], scratch, block, &h) : -ENOMEM;
  if (rc == 0 || rc == KVT_ECORRUPT) {
    /* A damaged header still names its part 0; the other parts age out. */
    uint32_t parts = rc == 0 ? h.parts : 1;
    remove_parts(c, &keys[n_keys - 1], parts);
    rc = 0;
  }
  free(scratch);
  free(keys);
  return rc;
}
