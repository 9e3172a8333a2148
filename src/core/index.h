/* The tier map: key -> entry {state and slot per tier, pins, LRU links}.
 *
 * Pure data structure: no locks, no I/O, no allocation after init (the
 * engine guards it with its metadata lock). Entries live in one slab; the
 * index is open addressing with linear probing over words that hold the
 * entry and the key's first 64 bits above it, so neither a miss nor a
 * deletion's shifting reads an entry: a probe compares 43+ key bits (at
 * 1M capacity) in the table word and reads the entry only on a match.
 *
 * LRU rule (SQLite pcache style): an entry is on tier t's LRU list iff it
 * is VALID in t and pins[t] == 0. "Pinned means not on the LRU list." The
 * head of a list is the most recently used end; victims come from the tail.
 */
#ifndef KVT_CORE_INDEX_H
#define KVT_CORE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/kvtier.h"

#define KVT__NONE UINT32_MAX
#define KVT__NTIERS 3

enum { KVT__ABSENT = 0, KVT__VALID = 1, KVT__FILLING = 2 };

typedef struct kvt__entry {
  kvt_key key;
  kvt_key parent;
  uint32_t slot[KVT__NTIERS];
  uint32_t prev[KVT__NTIERS], next[KVT__NTIERS]; /* LRU links; next[0] chains the free list */
  uint16_t pins[KVT__NTIERS];  /* copies reading/writing the slot, requests (device) */
  uint8_t state[KVT__NTIERS];  /* KVT__ABSENT / VALID / FILLING */
  uint8_t on_lru;              /* bit t: on tier t's LRU list */
} kvt__entry;

typedef struct kvt__lru {
  uint32_t head, tail, count;
} kvt__lru;

typedef struct kvt__index {
  kvt__entry *entries;
  uint64_t *table; /* 0 = empty, else (key.lo & ~idx_mask) | (entry + 1) */
  uint64_t idx_mask; /* low bits of a word that hold entry + 1 */
  uint32_t capacity, used, size, free_head; /* size: table words, 2 per entry */
  kvt__lru lru[KVT__NTIERS];
} kvt__index;

int kvt__index_init(kvt__index *ix, uint32_t capacity);
void kvt__index_free(kvt__index *ix);
size_t kvt__index_bytes(const kvt__index *ix);

/* Home word of a key: from the top 32 bits of key.lo (which its word keeps). */
static inline uint32_t kvt__index_home(const kvt__index *ix, uint64_t lo) {
  return (uint32_t)(((lo >> 32) * (uint64_t)ix->size) >> 32);
}

/* Entry index of key, or KVT__NONE. Inline: the read path calls it per block. */
static inline uint32_t kvt__index_find(const kvt__index *ix, const kvt_key *key) {
  uint64_t tag = key->lo & ~ix->idx_mask;
  for (uint32_t h = kvt__index_home(ix, key->lo);;) {
    uint64_t w = ix->table[h];
    if (!w) return KVT__NONE;
    if ((w & ~ix->idx_mask) == tag) {
      uint32_t e = (uint32_t)(w & ix->idx_mask) - 1;
      if (ix->entries[e].key.hi == key->hi && ix->entries[e].key.lo == key->lo) return e;
    }
    h = h + 1 == ix->size ? 0 : h + 1;
  }
}

/* A prefetch the compiler keeps: GCC 12 deletes __builtin_prefetch from
 * some inlined code (a loop it proves finite; a prefetch behind a compare of
 * loaded words), which silently takes the prefetches off the read path. */
static inline void kvt__prefetch(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
#else
  __builtin_prefetch(p);
#endif
}

/* Prefetches the index word of one key: what a lookup loop issues per block. */
static inline void kvt__index_prefetch_key(const kvt__index *ix, const kvt_key *key) {
  kvt__prefetch(&ix->table[kvt__index_home(ix, key->lo)]);
}

/* Prefetches the index words of keys[0..n) (batch lookups overlap misses). */
static inline void kvt__index_prefetch(const kvt__index *ix, const kvt_key *keys, size_t n) {
  for (size_t i = 0; i < n; i++) kvt__index_prefetch_key(ix, &keys[i]);
}

/* New entry with every tier ABSENT, or KVT__NONE when full. Key must be absent. */
uint32_t kvt__index_insert(kvt__index *ix, const kvt_key *key, const kvt_key *parent);
/* Removes an entry that is ABSENT everywhere and unpinned. */
void kvt__index_remove(kvt__index *ix, uint32_t e);

/* State changes keep the LRU rule. */
void kvt__index_set_state(kvt__index *ix, uint32_t e, int tier, int state, uint32_t slot);
/* The list operations behind them (index.c). */
void kvt__lru_unlink(kvt__index *ix, uint32_t e, int tier);
void kvt__lru_push_head(kvt__index *ix, uint32_t e, int tier);

/* Re-establishes "on LRU iff VALID and unpinned" for one tier. */
static inline void kvt__index_lru_sync(kvt__index *ix, uint32_t e, int tier) {
  const kvt__entry *en = &ix->entries[e];
  int want = en->state[tier] == KVT__VALID && en->pins[tier] == 0;
  int have = (en->on_lru >> tier) & 1;
  if (want && !have) kvt__lru_push_head(ix, e, tier);
  else if (!want && have) kvt__lru_unlink(ix, e, tier);
}

/* Inline: a device hit pins and unpins once per block. */
static inline void kvt__index_pin(kvt__index *ix, uint32_t e, int tier) {
  ix->entries[e].pins[tier]++;
  kvt__index_lru_sync(ix, e, tier);
}

static inline void kvt__index_unpin(kvt__index *ix, uint32_t e, int tier) {
  if (ix->entries[e].pins[tier]) ix->entries[e].pins[tier]--;
  kvt__index_lru_sync(ix, e, tier);
}

/* Moves e to the MRU end of tier's list if it is on it. */
static inline void kvt__index_touch(kvt__index *ix, uint32_t e, int tier) {
  if (!((ix->entries[e].on_lru >> tier) & 1) || ix->lru[tier].head == e) return;
  kvt__lru_unlink(ix, e, tier);
  kvt__lru_push_head(ix, e, tier);
}
/* LRU tail of tier (oldest unpinned VALID entry), or KVT__NONE. */
static inline uint32_t kvt__index_victim(const kvt__index *ix, int tier) {
  return ix->lru[tier].tail;
}
/* The entry before e in tier's LRU order (towards the MRU end). */
static inline uint32_t kvt__index_newer(const kvt__index *ix, uint32_t e, int tier) {
  return ix->entries[e].prev[tier];
}
/* 1 if e is ABSENT in every tier and unpinned (removable). */
int kvt__index_unused(const kvt__index *ix, uint32_t e);

/* A stack of free slot numbers for one tier. */
typedef struct kvt__slots {
  uint32_t *free;
  uint32_t n_free, capacity;
} kvt__slots;

int kvt__slots_init(kvt__slots *s, uint32_t capacity);
void kvt__slots_free(kvt__slots *s);
static inline uint32_t kvt__slots_take(kvt__slots *s) {
  return s->n_free ? s->free[--s->n_free] : KVT__NONE;
}
static inline void kvt__slots_put(kvt__slots *s, uint32_t slot) { s->free[s->n_free++] = slot; }
/* Refills the stack with every slot whose used[] byte is 0 (recovery). */
void kvt__slots_rebuild(kvt__slots *s, const uint8_t *used);

#endif
