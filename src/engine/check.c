/* Invariant check of the tier map, for tests: every slot of every tier is
 * exactly one of free, held by an entry, or (device) private to a request;
 * LRU membership follows the rule; with nothing in flight nothing is pinned
 * but by requests, and no load follows another job's fetch. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"

static int fail(char *msg, size_t len, const char *what, uint64_t a, uint64_t b) {
  if (msg && len) snprintf(msg, len, "%s (%llu, %llu)", what, (unsigned long long)a, (unsigned long long)b);
  return -1;
}

static int check_tier(kvt_cache *c, int t, uint8_t *owner, char *msg, size_t len) {
  uint64_t cap = c->cap[t];
  for (uint32_t i = 0; i < c->slots[t].n_free; i++) {
    uint32_t s = c->slots[t].free[i];
    if (s >= cap || owner[s]) return fail(msg, len, "free slot twice or out of range", (uint64_t)t, s);
    owner[s] = 1;
  }
  uint32_t on_lru = 0;
  for (uint32_t e = 0; e < c->map.capacity; e++) {
    const kvt__entry *en = &c->map.entries[e];
    if (kvt__index_find(&c->map, &en->key) != e) continue; /* free entry */
    int want = en->state[t] == KVT__VALID && en->pins[t] == 0;
    if (want != ((en->on_lru >> t) & 1)) return fail(msg, len, "LRU membership broken", (uint64_t)t, e);
    on_lru += want;
    if (en->state[t] == KVT__ABSENT) continue;
    uint32_t s = en->slot[t];
    if (s >= cap || owner[s]) return fail(msg, len, "slot of an entry is free or shared", (uint64_t)t, s);
    owner[s] = 2;
  }
  if (on_lru != c->map.lru[t].count) return fail(msg, len, "LRU count", on_lru, c->map.lru[t].count);
  if (t == KVT__T_DEV)
    for (uint32_t r = 0; r < c->cfg.max_requests; r++) {
      const kvt__request *rq = &c->reqs[r];
      uint32_t id = rq->busy ? kvt__req_ref0(rq) : KVT__NONE;
      for (uint32_t i = 0; rq->busy && i < rq->n_blocks + rq->n_extra; i++, id = kvt__ref_next(c, id)) {
        const kvt__ref *ref = kvt__ref_at(c, id);
        if (ref->entry != KVT__NONE) continue;
        if (ref->slot >= cap || owner[ref->slot]) return fail(msg, len, "private slot shared", r, ref->slot);
        owner[ref->slot] = 3;
      }
    }
  for (uint64_t s = 0; s < cap; s++)
    if (!owner[s]) return fail(msg, len, "slot leaked (neither free nor held)", (uint64_t)t, s);
  return 0;
}

int kvt__check_invariants(kvt_cache *c, char *msg, size_t len) {
  if (!c || !c->layout_ready) return -1;
  pthread_mutex_lock(&c->lock);
  int rc = 0;
  for (int t = 0; rc == 0 && t < KVT__NTIERS; t++) {
    uint8_t *owner = calloc(c->cap[t] ? c->cap[t] : 1, 1);
    rc = owner ? check_tier(c, t, owner, msg, len) : fail(msg, len, "out of memory", 0, 0);
    free(owner);
  }
  int idle = c->inflight == 0 && c->n_req_free == c->cfg.max_requests;
  for (uint32_t e = 0; rc == 0 && idle && e < c->map.capacity; e++) {
    const kvt__entry *en = &c->map.entries[e];
    if (kvt__index_find(&c->map, &en->key) != e) continue;
    for (int t = 0; t < KVT__NTIERS; t++)
      if (en->pins[t] || en->state[t] == KVT__FILLING) rc = fail(msg, len, "pinned or filling while idle", e, (uint64_t)t);
  }
  for (int t = 0; rc == 0 && idle && t < KVT__NTIERS; t++)
    if (c->freeing[t]) rc = fail(msg, len, "freeing count while idle", (uint64_t)t, c->freeing[t]);
  for (uint64_t s = 0; rc == 0 && idle && c->host_follow && s < c->cap[KVT__T_HOST]; s++)
    if (c->host_follow[s]) rc = fail(msg, len, "a load follows a host fetch while idle", s, 0);
  pthread_mutex_unlock(&c->lock);
  return rc;
}
