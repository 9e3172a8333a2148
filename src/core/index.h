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

/* Entry index of key, or KVT__NONE. */
uint32_t kvt__index_find(const kvt__index *ix, const kvt_key *key);
/* Prefetches the index lines of keys[0..n) (batch lookups overlap misses). */
void kvt__index_prefetch(const kvt__index *ix, const kvt_key *keys, size_t n);
/* New entry with every tier ABSENT, or KVT__NONE when full. Key must be absent. */
uint32_t kvt__index_insert(kvt__index *ix, const kvt_key *key, const kvt_key *parent);
/* Removes an entry that is ABSENT everywhere and unpinned. */
void kvt__index_remove(kvt__index *ix, uint32_t e);

/* State changes keep the LRU rule. */
void kvt__index_set_state(kvt__index *ix, uint32_t e, int tier, int state, uint32_t slot);
void kvt__index_pin(kvt__index *ix, uint32_t e, int tier);
void kvt__index_unpin(kvt__index *ix, uint32_t e, int tier);
/* Moves e to the MRU end of tier's list if it is on it. */
void kvt__index_touch(kvt__index *ix, uint32_t e, int tier);
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
