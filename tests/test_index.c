/* Tier map: lookup/insert/remove against a reference, LRU order, pins. */
#include <stdlib.h>
#include <string.h>

#include "core/index.h"
#include "helpers.h"

static kvt_key K(uint64_t i) {
  kvt_key k = {i * 0x9e3779b97f4a7c15ull, i ^ 0x5555};
  return k;
}

static void insert_find_remove_match_reference(void **state) {
  enum { CAP = 4096, OPS = 200000 };
  kvt__index ix;
  assert_int_equal(kvt__index_init(&ix, CAP), 0);
  static uint32_t where[CAP * 4]; /* key id -> entry + 1, 0 = absent */
  memset(where, 0, sizeof where);
  uint64_t s = 1;
  for (int op = 0; op < OPS; op++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t id = (s >> 33) % (CAP * 4);
    kvt_key k = K(id);
    uint32_t e = kvt__index_find(&ix, &k);
    assert_int_equal(e == KVT__NONE ? 0 : e + 1, where[id]);
    if (e == KVT__NONE && ix.used < CAP) {
      kvt_key p = K(id + 1);
      e = kvt__index_insert(&ix, &k, &p);
      assert_int_not_equal(e, KVT__NONE);
      where[id] = e + 1;
    } else if (e != KVT__NONE) {
      kvt__index_remove(&ix, e);
      where[id] = 0;
    }
  }
  /* Full: insert fails cleanly. */
  uint32_t n = ix.used;
  for (uint64_t id = CAP * 4; n < CAP; id++, n++) {
    kvt_key k = K(id);
    assert_int_not_equal(kvt__index_insert(&ix, &k, &k), KVT__NONE);
  }
  kvt_key extra = K(1u << 30);
  assert_int_equal(kvt__index_insert(&ix, &extra, &extra), KVT__NONE);
  kvt__index_free(&ix);
}

static uint32_t add_valid(kvt__index *ix, uint64_t id, int tier) {
  kvt_key k = K(id);
  uint32_t e = kvt__index_insert(ix, &k, &k);
  kvt__index_set_state(ix, e, tier, KVT__VALID, (uint32_t)id);
  return e;
}

static void lru_order_and_pins(void **state) {
  kvt__index ix;
  assert_int_equal(kvt__index_init(&ix, 16), 0);
  uint32_t e[4];
  for (int i = 0; i < 4; i++) e[i] = add_valid(&ix, (uint64_t)i, 0);
  assert_int_equal(kvt__index_victim(&ix, 0), e[0]); /* oldest first */
  kvt__index_touch(&ix, e[0], 0);
  assert_int_equal(kvt__index_victim(&ix, 0), e[1]);
  /* Pinned means not on the LRU list: never a victim. */
  kvt__index_pin(&ix, e[1], 0);
  assert_int_equal(kvt__index_victim(&ix, 0), e[2]);
  assert_int_equal(ix.lru[0].count, 3);
  kvt__index_pin(&ix, e[1], 0);
  kvt__index_unpin(&ix, e[1], 0);
  assert_int_equal(ix.lru[0].count, 3); /* still pinned once */
  kvt__index_unpin(&ix, e[1], 0);
  assert_int_equal(ix.lru[0].head, e[1]); /* unpinned -> most recent */
  /* Tiers are independent lists. */
  kvt__index_set_state(&ix, e[2], 1, KVT__VALID, 7);
  assert_int_equal(kvt__index_victim(&ix, 1), e[2]);
  assert_int_equal(kvt__index_victim(&ix, 0), e[2]);
  kvt__index_set_state(&ix, e[2], 0, KVT__ABSENT, 0);
  assert_int_equal(kvt__index_victim(&ix, 0), e[3]);
  assert_int_equal(kvt__index_victim(&ix, 1), e[2]);
  /* FILLING is not evictable either. */
  kvt__index_set_state(&ix, e[3], 0, KVT__FILLING, 3);
  assert_int_equal(kvt__index_victim(&ix, 0), e[0]);
  assert_false(kvt__index_unused(&ix, e[2]));
  kvt__index_set_state(&ix, e[2], 1, KVT__ABSENT, 0);
  assert_true(kvt__index_unused(&ix, e[2]));
  kvt__index_free(&ix);
}

/* A request touches its chain last-to-first, so tails are evicted before
 * their ancestors, and a shared ancestor outlives every tail. */
static void reverse_touch_gives_tail_first(void **state) {
  kvt__index ix;
  assert_int_equal(kvt__index_init(&ix, 16), 0);
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; i++) a[i] = add_valid(&ix, (uint64_t)i, 0);
  for (int i = 0; i < 2; i++) b[i] = add_valid(&ix, (uint64_t)(10 + i), 0);
  /* chain A = a0 a1 a2 a3 used, then chain a0 b0 b1 */
  for (int i = 3; i >= 0; i--) kvt__index_touch(&ix, a[i], 0);
  kvt__index_touch(&ix, b[1], 0);
  kvt__index_touch(&ix, b[0], 0);
  kvt__index_touch(&ix, a[0], 0);
  uint32_t want[6] = {a[3], a[2], a[1], b[1], b[0], a[0]};
  for (int i = 0; i < 6; i++) {
    uint32_t v = kvt__index_victim(&ix, 0);
    assert_int_equal(v, want[i]);
    kvt__index_set_state(&ix, v, 0, KVT__ABSENT, 0);
  }
  assert_int_equal(kvt__index_victim(&ix, 0), KVT__NONE);
  kvt__index_free(&ix);
}

static void slots_stack(void **state) {
  kvt__slots s;
  assert_int_equal(kvt__slots_init(&s, 4), 0);
  assert_int_equal(kvt__slots_take(&s), 0);
  assert_int_equal(kvt__slots_take(&s), 1);
  kvt__slots_put(&s, 0);
  assert_int_equal(kvt__slots_take(&s), 0);
  uint8_t used[4] = {1, 0, 1, 0};
  kvt__slots_rebuild(&s, used);
  assert_int_equal(s.n_free, 2);
  assert_int_equal(kvt__slots_take(&s), 1);
  assert_int_equal(kvt__slots_take(&s), 3);
  assert_int_equal(kvt__slots_take(&s), KVT__NONE);
  kvt__slots_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(insert_find_remove_match_reference),
      cmocka_unit_test(lru_order_and_pins),
      cmocka_unit_test(reverse_touch_gives_tail_first),
      cmocka_unit_test(slots_stack),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
