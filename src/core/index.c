#include "core/index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/hash.h"

/* Per block of capacity: the entry, two table words, a free-slot stack word. */
_Static_assert(sizeof(kvt__entry) + 2 * sizeof(uint64_t) + sizeof(uint32_t) == KVT_MAP_BYTES_PER_BLOCK,
               "KVT_MAP_BYTES_PER_BLOCK in kvtier.h is the tier map's bytes per block");

static inline uint32_t home_of(const kvt__index *ix, uint64_t lo) { return kvt__index_home(ix, lo); }
static inline uint32_t step(const kvt__index *ix, uint32_t h) { return h + 1 == ix->size ? 0 : h + 1; }

/* Zeroed memory for the entry slab and the table. A large map asks for huge
 * pages over its whole 2 MiB pieces (the tail keeps small ones: nothing is
 * allocated beyond what metadata_bytes counts): its probes land on random
 * pages, and with 4 KiB pages nearly every block of a lookup would also
 * miss the TLB. Only a hint; freed with free(). */
#define HUGE_BYTES ((size_t)2 << 20)
static void *map_alloc(size_t n, size_t size) {
  if (n > SIZE_MAX / size) return NULL;
  size_t bytes = n * size;
  if (bytes < HUGE_BYTES) return calloc(n, size);
  void *p = NULL;
  if (posix_memalign(&p, HUGE_BYTES, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(p, bytes / HUGE_BYTES * HUGE_BYTES, MADV_HUGEPAGE);
#endif
  return memset(p, 0, bytes);
}

int kvt__index_init(kvt__index *ix, uint32_t capacity) {
  memset(ix, 0, sizeof *ix);
  if (capacity == 0 || capacity > (1u << 30)) return -EINVAL;
  uint64_t tsize = (uint64_t)capacity * 2; /* load factor <= 0.5 */
  if (tsize < 16) tsize = 16;
  ix->entries = map_alloc(capacity, sizeof *ix->entries);
  ix->table = map_alloc(tsize, sizeof *ix->table);
  if (!ix->entries || !ix->table) {
    kvt__index_free(ix);
    return -ENOMEM;
  }
  ix->capacity = capacity;
  ix->size = (uint32_t)tsize;
  uint32_t bits = 1;
  while (((uint64_t)1 << bits) <= capacity) bits++; /* entry + 1 <= capacity fits */
  ix->idx_mask = ((uint64_t)1 << bits) - 1;
  for (uint32_t i = 0; i < capacity; i++) ix->entries[i].next[0] = i + 1 < capacity ? i + 1 : KVT__NONE;
  ix->free_head = 0;
  for (int t = 0; t < KVT__NTIERS; t++) ix->lru[t].head = ix->lru[t].tail = KVT__NONE;
  return 0;
}

void kvt__index_free(kvt__index *ix) {
  free(ix->entries);
  free(ix->table);
  memset(ix, 0, sizeof *ix);
}

size_t kvt__index_bytes(const kvt__index *ix) {
  return (size_t)ix->capacity * sizeof(kvt__entry) + (size_t)ix->size * sizeof(uint64_t);
}

uint32_t kvt__index_insert(kvt__index *ix, const kvt_key *key, const kvt_key *parent) {
  uint32_t e = ix->free_head;
  if (e == KVT__NONE) return KVT__NONE;
  kvt__entry *en = &ix->entries[e];
  ix->free_head = en->next[0];
  memset(en, 0, sizeof *en);
  en->key = *key;
  en->parent = *parent;
  for (int t = 0; t < KVT__NTIERS; t++) en->slot[t] = en->prev[t] = en->next[t] = KVT__NONE;
  uint32_t h = home_of(ix, key->lo);
  while (ix->table[h]) h = step(ix, h);
  ix->table[h] = (key->lo & ~ix->idx_mask) | (e + 1);
  ix->used++;
  return e;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void table_delete(kvt__index *ix, uint32_t e) {
  uint32_t h = home_of(ix, ix->entries[e].key.lo);
  while ((ix->table[h] & ix->idx_mask) != (uint64_t)e + 1) h = step(ix, h);
  uint32_t hole = h;
  for (uint32_t j = step(ix, hole); ix->table[j]; j = step(ix, j)) {
    uint32_t home = home_of(ix, ix->table[j]); /* the word keeps key.lo's top bits */
    /* Move j into the hole unless its home lies cyclically in (hole, j]. */
    int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!stays) {
      ix->table[hole] = ix->table[j];
      hole = j;
    }
  }
  ix->table[hole] = 0;
}

void kvt__index_remove(kvt__index *ix, uint32_t e) {
  table_delete(ix, e);
  kvt__entry *en = &ix->entries[e];
  memset(&en->key, 0, sizeof en->key);
  en->next[0] = ix->free_head;
  ix->free_head = e;
  ix->used--;
}

void kvt__lru_unlink(kvt__index *ix, uint32_t e, int t) {
  kvt__entry *en = &ix->entries[e];
  kvt__lru *l = &ix->lru[t];
  if (en->prev[t] != KVT__NONE) ix->entries[en->prev[t]].next[t] = en->next[t];
  else l->head = en->next[t];
  if (en->next[t] != KVT__NONE) ix->entries[en->next[t]].prev[t] = en->prev[t];
  else l->tail = en->prev[t];
  en->prev[t] = en->next[t] = KVT__NONE;
  en->on_lru &= (uint8_t)~(1u << t);
  l->count--;
}

void kvt__lru_push_head(kvt__index *ix, uint32_t e, int t) {
  kvt__entry *en = &ix->entries[e];
  kvt__lru *l = &ix->lru[t];
  en->prev[t] = KVT__NONE;
  en->next[t] = l->head;
  if (l->head != KVT__NONE) ix->entries[l->head].prev[t] = e;
  else l->tail = e;
  l->head = e;
  en->on_lru |= (uint8_t)(1u << t);
  l->count++;
}

void kvt__index_set_state(kvt__index *ix, uint32_t e, int tier, int state, uint32_t slot) {
  kvt__entry *en = &ix->entries[e];
  en->state[tier] = (uint8_t)state;
  en->slot[tier] = state == KVT__ABSENT ? KVT__NONE : slot;
  kvt__index_lru_sync(ix, e, tier);
}

int kvt__index_unused(const kvt__index *ix, uint32_t e) {
  const kvt__entry *en = &ix->entries[e];
  for (int t = 0; t < KVT__NTIERS; t++)
    if (en->state[t] != KVT__ABSENT || en->pins[t]) return 0;
  return 1;
}

int kvt__slots_init(kvt__slots *s, uint32_t capacity) {
  s->capacity = capacity;
  s->n_free = capacity;
  s->free = capacity ? malloc(sizeof(uint32_t) * capacity) : NULL;
  if (capacity && !s->free) return -ENOMEM;
  /* Stack order hands out slot 0 first: predictable for tests and locality. */
  for (uint32_t i = 0; i < capacity; i++) s->free[i] = capacity - 1 - i;
  return 0;
}

void kvt__slots_free(kvt__slots *s) {
  free(s->free);
  memset(s, 0, sizeof *s);
}

void kvt__slots_rebuild(kvt__slots *s, const uint8_t *used) {
  s->n_free = 0;
  for (uint32_t i = s->capacity; i-- > 0;)
    if (!used[i]) s->free[s->n_free++] = i;
}
