/* Eviction: LRU per tier, cascading down. Device victims are demoted to
 * the host (copied when the host has no copy), host victims to disk,
 * disk victims are dropped. Pinned blocks are not on the LRU lists, so they
 * are never chosen. Tail-first order within a chain comes from how blocks
 * are touched: a request touches its blocks from the last to the first, so
 * a parent is always more recent than its children. All with c->lock held;
 * nothing here waits (progress.c's kvt__make_room does). Calls jobs.c only. */
#include <errno.h>
#include <string.h>

#include "engine/engine.h"

void kvt__drop_tier(kvt_cache *c, uint32_t e, int tier) {
  uint32_t slot = kvt__E(c, e)->slot[tier];
  kvt__index_set_state(&c->map, e, tier, KVT__ABSENT, 0);
  kvt__slots_put(&c->slots[tier], slot);
  if (tier == KVT__T_DEV && c->dev_has_tokens) c->dev_has_tokens[slot] = 0;
}

void kvt__maybe_remove(kvt_cache *c, uint32_t e) {
  if (kvt__index_unused(&c->map, e)) kvt__index_remove(&c->map, e);
}

static int lower_tier(const kvt_cache *c, int tier) {
  /* Device blocks reach the disk only through the host. */
  if (tier == KVT__T_DEV) return kvt__has_tier(c, KVT__T_HOST) ? KVT__T_HOST : -1;
  if (tier == KVT__T_HOST) return kvt__has_tier(c, KVT__T_DISK) ? KVT__T_DISK : -1;
  return -1;
}

static int held_below(const kvt_cache *c, const kvt__entry *en, int tier) {
  for (int t = tier + 1; t < KVT__NTIERS; t++)
    if (en->state[t] == KVT__VALID) return 1;
  return 0;
}

static void count_eviction(kvt_cache *c, int tier) {
  if (tier == KVT__T_DEV) c->st.evictions_device++;
  else if (tier == KVT__T_HOST) c->st.evictions_host++;
  else c->st.evictions_disk++;
}

static int evict_some(kvt_cache *c, int tier, uint32_t want, int drop_only);

/* A free slot in `tier` now, evicting without waiting; KVT__NONE if none.
 * `want` is how many the caller will need in all: the tier below starts
 * freeing that many at once (less what it is already freeing), so a full
 * cascade costs one round of copies per tier, not one per block. */
static uint32_t take_slot_nowait(kvt_cache *c, int tier, uint32_t want) {
  uint32_t s = kvt__slots_take(&c->slots[tier]);
  if (s != KVT__NONE) return s;
  if (c->freeing[tier] < want) evict_some(c, tier, want - c->freeing[tier], 0);
  return kvt__slots_take(&c->slots[tier]);
}

/* Starts freeing up to `want` slots of `tier`: drops victims that have a
 * copy below, demotes the others in one batched job. Returns slots freed
 * at once; c->freeing[tier] counts those that demotions will free. */
static int evict_some(kvt_cache *c, int tier, uint32_t want, int drop_only) {
  int lower = drop_only ? -1 : lower_tier(c, tier), freed = 0;
  uint32_t job = KVT__NONE;
  uint32_t e = kvt__index_victim(&c->map, tier);
  while (want > 0 && e != KVT__NONE) {
    uint32_t newer = kvt__index_newer(&c->map, e, tier);
    kvt__entry *en = kvt__E(c, e);
    /* No disk below the host: a victim leaves through a remote put when
     * there is a remote tier (the slot is freed once the put is over). */
    if (tier == KVT__T_HOST && lower < 0 && !drop_only && kvt__rput_add(c, e, 1)) {
      want--;
      e = newer;
      continue;
    }
    if (lower < 0 || held_below(c, en, tier)) {
      kvt__drop_tier(c, e, tier);
      count_eviction(c, tier);
      kvt__maybe_remove(c, e);
      freed++;
      want--;
    } else {
      if (job == KVT__NONE) {
        /* Host victims spilled to disk go on to the remote once written. */
        uint32_t rput = tier == KVT__T_HOST && kvt__rtier(c) ? KVT__JF_RPUT : 0;
        job = kvt__job_new(c, tier == KVT__T_DEV ? KVT__JOB_STORE : KVT__JOB_SPILL, KVT__JF_EVICT | KVT__JF_DEMOTE | rput);
        if (job == KVT__NONE) break; /* every job busy: wait for one */
      }
      kvt__job *jb = &c->jobs[job];
      if (jb->n_ops == c->cfg.max_job_blocks) break;
      uint32_t s = take_slot_nowait(c, lower, want);
      if (s == KVT__NONE) break; /* the tier below is freeing; wait for it */
      kvt__job_add_copy(c, job, e, tier, lower, s);
      c->freeing[tier]++;
      want--;
    }
    e = newer;
  }
  kvt__rput_flush(c);
  if (job != KVT__NONE) {
    if (c->jobs[job].n_ops == 0) {
      kvt__job_free(c, job);
    } else {
      c->inflight++;
      c->st.jobs_started++;
      kvt__queue_submit(c, job);
    }
  }
  return freed;
}

/* One step of making room for `need` blocks in `tier`, never waiting:
 * 0 (room now), KVT_EAGAIN (demotions under way will free the rest: wait
 * for their completions, progress.c's kvt__make_room), KVT_ENOSPACE. */
int kvt__room_step(kvt_cache *c, int tier, uint32_t need, int keep) {
  if (need > c->cap[tier]) return KVT_ENOSPACE;
  uint32_t have = c->slots[tier].n_free;
  if (have >= need) return 0;
  uint32_t coming = c->freeing[tier];
  if (have + coming < need) evict_some(c, tier, need - have - coming, 0);
  if (c->slots[tier].n_free >= need) return 0;
  if (c->inflight == 0) {
    /* No copy in flight can free a slot, and the tier below has no room
     * for more copies (its slots are pinned or staged): drop victims
     * rather than fail the request. Pinned blocks are never dropped, and
     * with keep, neither is any: what is left has no copy below. */
    if (keep) return KVT_ENOSPACE;
    evict_some(c, tier, need - c->slots[tier].n_free, 1);
    return c->slots[tier].n_free >= need ? 0 : KVT_ENOSPACE;
  }
  return KVT_EAGAIN;
}

/* Copies device-resident entries down to the host in one job (kvt_store,
 * write-through). Host slots must have been made room for. */
uint32_t kvt__start_store(kvt_cache *c, const uint32_t *entries, uint32_t n, uint32_t flags) {
  uint32_t j = kvt__job_new(c, KVT__JOB_STORE, flags);
  if (j == KVT__NONE) return KVT__NONE;
  kvt__job *jb = &c->jobs[j];
  for (uint32_t i = 0; i < n && jb->n_ops < c->cfg.max_job_blocks; i++) {
    /* entries[] may name a block twice (kvt_store of a batch that shares a
     * prefix): the first op already claimed its host copy, and a second
     * would overwrite the entry's host slot and leak the first one. */
    if (kvt__E(c, entries[i])->state[KVT__T_HOST] != KVT__ABSENT) continue;
    uint32_t s = kvt__slots_take(&c->slots[KVT__T_HOST]);
    if (s == KVT__NONE) break;
    kvt__job_add_copy(c, j, entries[i], KVT__T_DEV, KVT__T_HOST, s);
    if (flags & KVT__JF_EVICT) c->freeing[KVT__T_DEV]++;
  }
  c->inflight++;
  c->st.jobs_started++;
  return j;
}
