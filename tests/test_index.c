/* Tier map: lookup/insert/remove against a reference, LRU order, pins. */
#include <stdlib.h>
#include <string.h>

#include "core/index.h"
#include "helpers.h"

static kvt_key K(uint64_t i) {
  kvt_key k = {i * 0x9e3779b97f4a7c15ull, i ^ 0x5555};
  return k;
}

/* Random inserts, finds and removes against a reference, then fills the map. */
static void match_reference(uint32_t cap, int ops) {
  kvt__index ix;
  assert_int_equal(kvt__index_init(&ix, cap), 0);
  uint32_t *where = calloc((size_t)cap * 4, sizeof *where); /* key id -> entry + 1, 0 = absent */
  assert_non_null(where);
  uint64_t s = 1;
  for (int op = 0; op < ops; op++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t id = (s >> 33) % ((uint64_t)cap * 4);
    kvt_key k = K(id);
    kvt__index_prefetch_key(&ix, &k); /* a hint only: finds must not depend on it */
    uint32_t e = kvt__index_find(&ix, &k);
    assert_int_equal(e == KVT__NONE ? 0 : e + 1, where[id]);
    if (e == KVT__NONE && ix.used < cap) {
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
  for (uint64_t id = (uint64_t)cap * 4; n < cap; id++, n++) {
    kvt_key k = K(id);
    assert_int_not_equal(kvt__index_insert(&ix, &k, &k), KVT__NONE);
  }
  kvt_key extra = K(1u << 30);
  assert_int_equal(kvt__index_insert(&ix, &extra, &extra), KVT__NONE);
  free(where);
  kvt__index_free(&ix);
}

static void insert_find_remove_match_reference(void **state) { match_reference(4096, 200000); }

/* A map whose entries and table pass 2 MiB takes them from the huge-page
 * path: it must start as empty as a small one and behave the same. */
static void large_map_starts_empty_and_matches_reference(void **state) {
  enum { CAP = 1 << 17 }; /* 10 MiB of entries, 2 MiB of table words */
  kvt__index ix;
  assert_int_equal(kvt__index_init(&ix, CAP), 0);
  for (uint32_t i = 0; i < ix.size; i++) assert_true(ix.table[i] == 0);
  for (uint32_t i = 0; i < CAP; i++)
    for (int t = 0; t < KVT__NTIERS; t++) {
      assert_int_equal(ix.entries[i].state[t], KVT__ABSENT);
      assert_int_equal(ix.entries[i].pins[t], 0);
    }
  for (int t = 0; t < KVT__NTIERS; t++) assert_int_equal(kvt__index_victim(&ix, t), KVT__NONE);
  kvt__index_free(&ix);
  match_reference(CAP, 400000);
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
      cmocka_unit_test(large_map_starts_empty_and_matches_reference),
      cmocka_unit_test(lru_order_and_pins),
      cmocka_unit_test(reverse_touch_gives_tail_first),
      cmocka_unit_test(slots_stack),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
