/* Storage mode under KVT_WRITE_THROUGH: blocks a put has just landed in the
 * host tier go on to disk at once, as owner mode's committed blocks do: one
 * spill job (owner mode's kind, written by the progress thread) per put, so
 * a block put only into the host tier is not lost with the process. The put
 * job is reported done when its host copies are in; kvt_drain and kvt_close
 * wait for the spill too. */
#include "engine/storage.h"

/* The entry of put jb's block i if it is now valid on the host and absent
 * from disk, else KVT__NONE; with the lock held. Found again by key: an
 * entry may have gone since its commit. */
static uint32_t host_only(kvt_cache *c, const kvt__sjob *jb, uint32_t i) {
  if (jb->blocks[i].result != 0 || jb->blocks[i].tier != KVT__T_HOST) return KVT__NONE;
  uint32_t e = kvt__index_find(&c->map, &jb->keys[i]);
  if (e == KVT__NONE) return KVT__NONE;
  const kvt__entry *en = kvt__E(c, e);
  return en->state[KVT__T_HOST] == KVT__VALID && en->state[KVT__T_DISK] == KVT__ABSENT ? e : KVT__NONE;
}

/* Called by the worker that ran put jb, before the job is finished (so
 * kvt_drain, which waits for the job, then waits for the spill). */
void kvt__storage_write_through(kvt_cache *c, const kvt__sjob *jb) {
  if (c->cfg.write_policy != KVT_WRITE_THROUGH || jb->kind != KVT__SJ_PUT || !kvt__has_tier(c, KVT__T_HOST) ||
      !kvt__has_tier(c, KVT__T_DISK))
    return;
  pthread_mutex_lock(&c->lock);
  uint32_t n = 0;
  for (uint32_t i = 0; i < jb->n_blocks; i++) n += host_only(c, jb, i) != KVT__NONE;
  if (n > c->cap[KVT__T_DISK]) n = (uint32_t)c->cap[KVT__T_DISK];
  /* Room and a job may wait for evictions and spills in flight; waiting
   * drops the lock, so the blocks are looked up again after it. */
  uint32_t j = KVT__NONE;
  if (n && kvt__make_room(c, KVT__T_DISK, n, 1) == 0) {
    while (!kvt__job_available(c, KVT__JOB_SPILL, 0)) kvt__wait(c, NULL);
    j = kvt__job_new(c, KVT__JOB_SPILL, 0);
  }
  for (uint32_t i = 0; j != KVT__NONE && i < jb->n_blocks; i++) {
    uint32_t e = host_only(c, jb, i);
    if (e == KVT__NONE) continue;
    uint32_t slot = kvt__slots_take(&c->slots[KVT__T_DISK]);
    if (slot == KVT__NONE) break; /* taken while we waited, or a put larger than the disk: spilled when evicted */
    kvt__job_add_copy(c, j, e, KVT__T_HOST, KVT__T_DISK, slot);
  }
  if (j != KVT__NONE && c->jobs[j].n_ops == 0) {
    kvt__job_free(c, j);
  } else if (j != KVT__NONE) {
    c->inflight++;
    c->st.jobs_started++;
    kvt__queue_submit(c, j);
  }
  pthread_mutex_unlock(&c->lock);
  kvt__flush_submits(c);
}
