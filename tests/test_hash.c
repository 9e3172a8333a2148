/* Block keys: prefix chaining, namespaces, partial blocks, XXH3 vectors. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "helpers.h"
#include "kvtier/kvtier.h"

static kvt_cache *open_cache(const char *model, uint64_t salt, uint32_t rank, uint32_t bt) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = model;
  cfg.tenant_salt = salt;
  cfg.tp_size = 4;
  cfg.tp_rank = rank;
  cfg.block_tokens = bt;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 2;
  lay.num_slots = 8;
  lay.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  return c;
}

static void make_tokens(uint32_t *t, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

static void same_prefix_same_keys(void **state) {
  kvt_cache *c = open_cache("llama3-8b@rev1", 0, 0, 16);
  uint32_t a[64], b[80];
  make_tokens(a, 64, 7);
  memcpy(b, a, sizeof a);
  make_tokens(b + 64, 16, 99);
  kvt_key ka[4], kb[5];
  size_t na, nb;
  assert_int_equal(kvt_hash_tokens(c, NULL, a, 64, ka, 4, &na), 0);
  assert_int_equal(kvt_hash_tokens(c, NULL, b, 80, kb, 5, &nb), 0);
  assert_int_equal(na, 4);
  assert_int_equal(nb, 5);
  assert_memory_equal(ka, kb, sizeof ka);
  /* Extending a chain from its last key gives the same keys as hashing it whole. */
  kvt_key ext;
  size_t ne;
  assert_int_equal(kvt_hash_tokens(c, &kb[3], b + 64, 16, &ext, 1, &ne), 0);
  assert_memory_equal(&ext, &kb[4], sizeof ext);
  kvt_close(c);
}

static void changed_token_changes_rest(void **state) {
  kvt_cache *c = open_cache("m", 0, 0, 16);
  uint32_t a[128], b[128];
  make_tokens(a, 128, 1);
  memcpy(b, a, sizeof a);
  b[3 * 16 + 5] ^= 1; /* one token of block 3 */
  kvt_key ka[8], kb[8];
  size_t n;
  assert_int_equal(kvt_hash_tokens(c, NULL, a, 128, ka, 8, &n), 0);
  assert_int_equal(kvt_hash_tokens(c, NULL, b, 128, kb, 8, &n), 0);
  for (int i = 0; i < 3; i++) assert_memory_equal(&ka[i], &kb[i], sizeof(kvt_key));
  for (int i = 3; i < 8; i++) assert_memory_not_equal(&ka[i], &kb[i], sizeof(kvt_key));
  /* Same tokens in block 4 but a different parent: still a different key. */
  assert_memory_not_equal(&ka[4], &kb[4], sizeof(kvt_key));
  kvt_close(c);
}

static void namespaces_never_alias(void **state) {
  kvt_cache *cs[6] = {open_cache("m", 0, 0, 16), open_cache("m", 1, 0, 16), open_cache("m", 2, 0, 16),
                      open_cache("m2", 0, 0, 16), open_cache("m", 0, 1, 16), open_cache("m", 0, 0, 32)};
  uint32_t t[64];
  make_tokens(t, 64, 5);
  kvt_key k[6][4], ns[6];
  size_t n;
  for (int i = 0; i < 6; i++) {
    assert_int_equal(kvt_hash_tokens(cs[i], NULL, t, 64, k[i], 4, &n), 0);
    assert_int_equal(kvt_namespace(cs[i], &ns[i]), 0);
  }
  for (int i = 0; i < 6; i++)
    for (int j = i + 1; j < 6; j++) {
      assert_memory_not_equal(&ns[i], &ns[j], sizeof(kvt_key));
      assert_memory_not_equal(&k[i][0], &k[j][0], sizeof(kvt_key));
      assert_memory_not_equal(&k[i][1], &k[j][1], sizeof(kvt_key));
    }
  /* Opaque engine keys are namespaced too. */
  uint64_t opaque[2] = {42, 43};
  kvt_key o0[2], o1[2];
  assert_int_equal(kvt_keys_from_opaque(cs[0], opaque, 8, 2, o0), 0);
  assert_int_equal(kvt_keys_from_opaque(cs[1], opaque, 8, 2, o1), 0);
  assert_memory_not_equal(&o0[0], &o1[0], sizeof(kvt_key));
  assert_memory_not_equal(&o0[0], &o0[1], sizeof(kvt_key));
  for (int i = 0; i < 6; i++) kvt_close(cs[i]);
}

static void partial_block_not_keyed(void **state) {
  kvt_cache *c = open_cache("m", 0, 0, 16);
  uint32_t t[47];
  make_tokens(t, 47, 3);
  kvt_key k[4];
  size_t n = 99;
  assert_int_equal(kvt_hash_tokens(c, NULL, t, 47, k, 4, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(kvt_hash_tokens(c, NULL, t, 15, k, 4, &n), 0);
  assert_int_equal(n, 0);
  /* Too small an output array is an error, with the needed count. */
  assert_int_equal(kvt_hash_tokens(c, NULL, t, 47, k, 1, &n), -ENOBUFS);
  assert_int_equal(n, 2);
  assert_int_equal(kvt_hash_tokens(NULL, NULL, t, 47, k, 4, &n), -EINVAL);
  kvt_close(c);
}

static void chain_is_seeded_xxh3(void **state) {
  uint32_t t[16];
  make_tokens(t, 16, 11);
  kvt_key parent = {0x1234, 0}, k = kvt__chain_key(&parent, t, 16);
  kvt_key raw = kvt__xxh3_128(t, sizeof t, 0x1234);
  assert_memory_equal(&k, &raw, sizeof k);
  parent.hi = 0xabcdef;
  kvt_key k2 = kvt__chain_key(&parent, t, 16);
  assert_true(k2.lo == raw.lo && k2.hi == (raw.hi ^ 0xabcdef));
}

static void xxh3_sanity_vectors(void **state) {
  const char *path = kvt_test_trace("xxh3_sanity_vectors.csv");
  if (!path) skip();
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static uint8_t buf[2367];
  uint64_t g = 2654435761u;
  for (size_t i = 0; i < sizeof buf; i++) {
    buf[i] = (uint8_t)(g >> 56);
    g *= 11400714785074694797ull;
  }
  char line[512];
  int checked = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || !strncmp(line, "func", 4)) continue;
    char func[64];
    unsigned long long len, seed, lo, hi = 0;
    int nf = sscanf(line, "%63[^,],%llu,%llu,%llx,%llx", func, &len, &seed, &lo, &hi);
    assert_true(nf >= 4);
    assert_true(len <= sizeof buf);
    if (!strcmp(func, "XXH3_64bits_withSeed")) {
      assert_true(kvt__xxh3_64(buf, len, seed) == lo);
    } else {
      assert_string_equal(func, "XXH3_128bits_withSeed");
      kvt_key k = kvt__xxh3_128(buf, len, seed);
      assert_true(k.lo == lo && k.hi == hi);
    }
    checked++;
  }
  fclose(f);
  assert_int_equal(checked, 54);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_prefix_same_keys),   cmocka_unit_test(changed_token_changes_rest),
      cmocka_unit_test(namespaces_never_alias),  cmocka_unit_test(partial_block_not_keyed),
      cmocka_unit_test(chain_is_seeded_xxh3),    cmocka_unit_test(xxh3_sanity_vectors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
