/* The write path the engine drives: store (offload), prefetch, and the
 * job handles they return. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

static int job_api_ok(const kvt_cache *c) { return c && !kvt__forked(c) && c->layout_ready; }

/* Entries among keys whose device copy has no host copy yet (lock held);
 * with evict, blocks already on the host leave the device at once. */
static uint32_t collect_stores(kvt_cache *c, const kvt_key *keys, size_t n, int evict, uint32_t *out) {
  uint32_t m = 0;
  for (size_t i = 0; i < n && m < c->cfg.max_job_blocks; i++) {
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE) continue;
    kvt__entry *en = kvt__E(c, e);
    if (en->state[KVT__T_DEV] != KVT__VALID) continue;
    if (en->state[KVT__T_HOST] == KVT__ABSENT) out[m++] = e;
    else if (evict && en->state[KVT__T_HOST] == KVT__VALID && en->pins[KVT__T_DEV] == 0) {
      kvt__drop_tier(c, e, KVT__T_DEV);
      c->st.evictions_device++;
    }
  }
  return m;
}

int kvt_store(kvt_cache *c, const kvt_key *keys, size_t n, uint32_t flags, kvt_job *job) {
  if (!job_api_ok(c)) return !c ? -EINVAL : kvt__forked(c) ? KVT_EFORKED : KVT_ELAYOUT;
  if ((n && !keys) || !job || (flags & ~KVT_STORE_EVICT)) return -EINVAL;
  *job = 0;
  if (!kvt__has_tier(c, KVT__T_HOST)) return KVT_EUNSUPPORTED;
  int evict = (flags & KVT_STORE_EVICT) != 0, rc = 0;
  uint32_t j = KVT__NONE;
  pthread_mutex_lock(&c->lock);
  uint32_t m = collect_stores(c, keys, n, evict, c->scratch_entries);
  if (m) {
    rc = kvt__make_room(c, KVT__T_HOST, m < c->cap[KVT__T_HOST] ? m : (uint32_t)c->cap[KVT__T_HOST], 1);
    /* make_room may have waited: the set of blocks to copy may have changed. */
    if (rc == 0) m = collect_stores(c, keys, n, evict, c->scratch_entries);
    if (rc == 0 && m) {
      j = kvt__start_store(c, c->scratch_entries, m, KVT__JF_USER | (evict ? KVT__JF_EVICT : 0));
      if (j == KVT__NONE) rc = KVT_EAGAIN;
      else *job = kvt__job_handle(c, j);
    }
  }
  pthread_mutex_unlock(&c->lock);
  kvt__flush_submits(c);
  if (j != KVT__NONE) kvt__job_submit(c, j);
  return rc < 0 ? rc : j != KVT__NONE;
}

/* The chain goes on past the local tiers from keys[i]: fetch what the
 * remote holds into host slots (lock held; dropped for the probe). Adds to
 * *j (made if NONE). Returns 0 or KVT_EAGAIN. */
static int prefetch_remote(kvt_cache *c, const kvt_key *keys, size_t n, size_t i, uint32_t *j) {
  pthread_mutex_unlock(&c->lock);
  uint32_t r = kvt__rtier_probe(c, keys + i, n - i);
  pthread_mutex_lock(&c->lock);
  int rc = 0;
  for (uint32_t k = 0; k < r; k++) {
    const kvt_key *key = &keys[i + k];
    if (kvt__index_find(&c->map, key) != KVT__NONE) break; /* fetched or computed meanwhile */
    if (*j == KVT__NONE ? !kvt__job_available(c, KVT__JOB_FETCH, KVT__JF_USER)
                        : c->jobs[*j].n_ops == c->cfg.max_job_blocks) {
      if (*j == KVT__NONE) rc = KVT_EAGAIN;
      break;
    }
    if ((rc = kvt__make_room(c, KVT__T_HOST, 1, 0)) != 0) break;
    if (*j == KVT__NONE && (*j = kvt__job_new(c, KVT__JOB_FETCH, KVT__JF_USER)) == KVT__NONE) {
      rc = KVT_EAGAIN;
      break;
    }
    uint32_t e = kvt__index_insert(&c->map, key, i + k ? &keys[i + k - 1] : &c->ns);
    if (e == KVT__NONE) break;
    kvt__job *jb = &c->jobs[*j];
    kvt__op *op = &jb->ops[jb->n_ops++];
    memset(op, 0, sizeof *op);
    op->jb = jb;
    op->entry = e;
    op->ref = KVT__NONE;
    op->remote = 1;
    op->slot[KVT__T_DEV] = op->slot[KVT__T_DISK] = KVT__NONE;
    op->slot[KVT__T_HOST] = kvt__slots_take(&c->slots[KVT__T_HOST]);
    kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__FILLING, op->slot[KVT__T_HOST]);
  }
  return rc;
}

/* How many blocks of keys' chain a prefetch would fetch from disk: one job's
 * worth at most, and no more than the host tier holds. Lock held. */
static uint32_t prefetch_need(kvt_cache *c, const kvt_key *keys, size_t n) {
  uint32_t need = 0, most = c->cfg.max_job_blocks < c->cap[KVT__T_HOST] ? c->cfg.max_job_blocks : (uint32_t)c->cap[KVT__T_HOST];
  for (size_t i = 0; i < n && need < most; i++) {
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE) break;
    const kvt__entry *en = kvt__E(c, e);
    if (en->state[KVT__T_DEV] == KVT__VALID || en->state[KVT__T_HOST] != KVT__ABSENT) continue;
    if (en->state[KVT__T_DISK] != KVT__VALID) break;
    need++;
  }
  return need;
}

int kvt_prefetch(kvt_cache *c, const kvt_key *keys, size_t n, kvt_job *job) {
  if (!job_api_ok(c)) return !c ? -EINVAL : kvt__forked(c) ? KVT_EFORKED : KVT_ELAYOUT;
  if ((n && !keys) || !job) return -EINVAL;
  *job = 0;
  if ((!kvt__has_tier(c, KVT__T_DISK) && !c->remote_on) || !kvt__has_tier(c, KVT__T_HOST)) return 0;
  uint32_t j = KVT__NONE;
  int rc = 0;
  size_t i = 0;
  pthread_mutex_lock(&c->lock);
  /* Room for the whole fetch first: when the host must spill for it, the
   * spills start and the caller asks again (KVT_EAGAIN), rather than get a
   * job for the few blocks that fitted at once. Only when the host cannot
   * hold them all (pinned blocks) does the fetch take what fits. */
  uint32_t need = prefetch_need(c, keys, n);
  if (need && kvt__job_available(c, KVT__JOB_FETCH, KVT__JF_USER) &&
      kvt__make_room(c, KVT__T_HOST, need, 0) == KVT_EAGAIN) {
    pthread_mutex_unlock(&c->lock);
    kvt__flush_submits(c);
    return KVT_EAGAIN;
  }
  for (; i < n; i++) {
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE) break;
    kvt__entry *en = kvt__E(c, e);
    if (en->state[KVT__T_DEV] == KVT__VALID || en->state[KVT__T_HOST] != KVT__ABSENT) continue;
    if (en->state[KVT__T_DISK] != KVT__VALID) break;
    /* A job slot must exist before room is made: room for a fetch that
     * cannot start would evict (with no job slot for spills: drop) host
     * blocks for nothing. It is taken only after, so that make_room may
     * still use the last one for a spill (and then say EAGAIN). */
    if (j == KVT__NONE ? !kvt__job_available(c, KVT__JOB_FETCH, KVT__JF_USER)
                       : c->jobs[j].n_ops == c->cfg.max_job_blocks) {
      if (j == KVT__NONE) rc = KVT_EAGAIN; /* every job slot busy: ask again */
      break;
    }
    if ((rc = kvt__make_room(c, KVT__T_HOST, 1, 0)) != 0) break; /* a hint: never wait */
    if (j == KVT__NONE && (j = kvt__job_new(c, KVT__JOB_FETCH, KVT__JF_USER)) == KVT__NONE) {
      rc = KVT_EAGAIN;
      break;
    }
    kvt__job_add_copy(c, j, e, KVT__T_DISK, KVT__T_HOST, kvt__slots_take(&c->slots[KVT__T_HOST]));
  }
  if (rc == 0 && i < n && c->remote_on && kvt__index_find(&c->map, &keys[i]) == KVT__NONE)
    rc = prefetch_remote(c, keys, n, i, &j);
  if (j != KVT__NONE && c->jobs[j].n_ops == 0) {
    kvt__job_free(c, j);
    j = KVT__NONE;
  }
  int deferred = 0;
  if (j != KVT__NONE) {
    c->inflight++;
    c->st.jobs_started++;
    *job = kvt__job_handle(c, j);
    /* Reads wait for free disk ops: the progress thread submits them. */
    if ((deferred = c->progress_running) != 0) kvt__progress_submit(c, j);
  }
  pthread_mutex_unlock(&c->lock);
  kvt__flush_submits(c);
  if (j != KVT__NONE && !deferred) kvt__job_submit(c, j);
  return j != KVT__NONE ? 1 : (rc < 0 ? rc : 0);
}

int kvt_job_poll(kvt_cache *c, kvt_job job) { return kvt_job_wait(c, job, 0); }

int kvt_job_wait(kvt_cache *c, kvt_job job, int64_t timeout_ns) {
  if (!job_api_ok(c)) return !c ? -EINVAL : kvt__forked(c) ? KVT_EFORKED : KVT_ELAYOUT;
  struct timespec dl;
  if (timeout_ns > 0) {
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ns / 1000000000;
    dl.tv_nsec += timeout_ns % 1000000000;
    if (dl.tv_nsec >= 1000000000) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000;
    }
  }
  kvt__cq_drain(c); /* a poll sees what backends posted, whatever the progress thread is doing */
  pthread_mutex_lock(&c->lock);
  uint32_t h = kvt__job_from_handle(c, job);
  int rc = h == KVT__NONE ? KVT_ENOJOB : 0;
  while (rc == 0 && !c->handles[h].done) {
    if (timeout_ns == 0) rc = 1;
    else if (timeout_ns < 0) kvt__wait(c, NULL);
    else if (kvt__wait(c, &dl) != 0 && !c->handles[h].done) rc = KVT_ETIMEDOUT;
    /* Another thread may have released the handle while this one waited. */
    if (rc == 0 && kvt__job_from_handle(c, job) != h) rc = KVT_ENOJOB;
  }
  if (rc == 0) rc = c->handles[h].status;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int kvt_job_cancel(kvt_cache *c, kvt_job job) {
  if (!job_api_ok(c)) return !c ? -EINVAL : kvt__forked(c) ? KVT_EFORKED : KVT_ELAYOUT;
  pthread_mutex_lock(&c->lock);
  uint32_t h = kvt__job_from_handle(c, job);
  if (h != KVT__NONE && c->handles[h].job != KVT__NONE) c->jobs[c->handles[h].job].flags |= KVT__JF_CANCEL;
  pthread_mutex_unlock(&c->lock);
  return h == KVT__NONE ? KVT_ENOJOB : 0;
}

int kvt_job_release(kvt_cache *c, kvt_job job) {
  if (!job_api_ok(c)) return !c ? -EINVAL : kvt__forked(c) ? KVT_EFORKED : KVT_ELAYOUT;
  pthread_mutex_lock(&c->lock);
  uint32_t h = kvt__job_from_handle(c, job);
  int rc = h == KVT__NONE ? KVT_ENOJOB : 0;
  if (rc == 0) kvt__handle_release(c, h);
  pthread_mutex_unlock(&c->lock);
  return rc;
}
