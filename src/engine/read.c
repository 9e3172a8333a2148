/* The read path: acquire (pin hits, schedule restores, hand
 * out fresh slots), request progress, commit and release. */
#include <errno.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/hash.h"
#include "engine/engine.h"
#include "store/record.h"
#include "util/abi.h"
#include "util/clock.h"

/* The key before keys[i]: the request's chain parent (the namespace for a
 * request that starts the sequence) before keys[0]. */
static const kvt_key *chain_parent_of(const kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t i) {
  return i ? &keys[i - 1] : parent ? parent : &c->ns;
}

/* Fastest tier holding a valid copy, or -1. */
static int fastest_valid(const kvt__entry *en) {
  for (int t = 0; t < KVT__NTIERS; t++)
    if (en->state[t] == KVT__VALID) return t;
  return -1;
}

/* ---- requests ---- */

static uint32_t req_from_handle(const kvt_cache *c, kvt_req h) {
  uint32_t r = (uint32_t)h - 1;
  if ((uint32_t)h == 0 || r >= c->cfg.max_requests) return KVT__NONE;
  const kvt__request *rq = &c->reqs[r];
  return rq->busy && rq->gen == (uint32_t)(h >> 32) ? r : KVT__NONE;
}

static int tokens_match(kvt_cache *c, const kvt__entry *en, int tier, const uint32_t *tok) {
  if (!tok || c->metadata_only) return 1;
  size_t bytes = (size_t)c->bt * sizeof(uint32_t);
  if (tier == KVT__T_DEV) {
    uint32_t s = en->slot[KVT__T_DEV];
    return !c->dev_has_tokens[s] || memcmp(c->dev_tokens + (size_t)s * c->bt, tok, bytes) == 0;
  }
  if (tier == KVT__T_HOST) {
    void *rec = kvt__host_slot(&c->host, en->slot[KVT__T_HOST]);
    const kvt__record_hdr *h = rec;
    return !(h->flags & KVT_RECORD_F_TOKENS) || memcmp(kvt__record_tokens(rec), tok, bytes) == 0;
  }
  return 1; /* disk: verified by checksum of the tokens once fetched */
}

typedef struct scan_result {
  uint32_t n, per_tier[KVT__NTIERS + 1]; /* the remote tier last */
  uint32_t n_dup; /* of the host blocks: private copies (another request loads them) */
  int must_wait;  /* no_dup: stopped at a block another request is loading */
  int mismatch; /* stopped at a block whose tokens or parent differ */
} scan_result;

/* Pins the restorable prefix in its fastest tier, noting entry and tier in
 * the request's refs (which survive the waits of make_room). */
/* A device hit after a block that must be copied would be shared with
 * other requests, yet if that copy failed the engine would recompute from
 * there on, into the shared slot. Restoring stops before such a hit: the
 * hit and what follows get private slots. */
static int shared_after_copy(const scan_result *sr, int tier) {
  return tier == KVT__T_DEV && sr->n > sr->per_tier[KVT__T_DEV];
}

/* Blocks [from, from + n) of a request that a remote probe found. */
typedef struct remote_run {
  uint32_t from, n;
} remote_run;

/* Blocks ahead of the scan whose index words are prefetched. (Prefetching
 * entries too, once their word has landed, cost more than it saved: a
 * chain's entries are mostly neighbours, which the hardware streams.) */
#define SCAN_WORDS_AHEAD 16u

/* A block another job is copying into a faster tier (another request's
 * load, a prefetch) restores from its host copy without waiting for that
 * job: the host copy is valid, or being fetched into a host slot by it,
 * and then the load follows that fetch (its copy starts when the fetch
 * lands, in a progress step; a failed fetch fails the block). A device
 * copy in flight is another request's slot, never shared: the load copies
 * into a private slot of its own (a duplicate, freed at release). */
static int host_followable(const kvt_cache *c, const kvt__entry *en) {
  if (en->state[KVT__T_HOST] == KVT__VALID) return 1;
  return en->state[KVT__T_HOST] == KVT__FILLING && c->host_follow && !c->storage_mode &&
         en->slot[KVT__T_HOST] < c->cap[KVT__T_HOST];
}

static void scan_prefix(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, const uint32_t *tokens,
                        size_t restore, uint32_t chunk0, const remote_run *rr, int no_dup, scan_result *sr) {
  memset(sr, 0, sizeof *sr);
  kvt__ref_walk w;
  kvt__walk_from(c, &w, chunk0 * KVT__REF_CHUNK);
  kvt__index_prefetch(&c->map, keys, restore < SCAN_WORDS_AHEAD ? restore : SCAN_WORDS_AHEAD);
  const kvt_key *par = chain_parent_of(c, parent, keys, 0);
  for (size_t i = 0; i < restore; par = &keys[i++]) {
    if (i + SCAN_WORDS_AHEAD < restore) kvt__index_prefetch_key(&c->map, &keys[i + SCAN_WORDS_AHEAD]);
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE) {
      /* Only on the remote: fetched through a host slot like a disk block
       * (the entry is made by fill_request; the fetch verifies it). */
      if (i < rr->from || i >= rr->from + rr->n) break;
      if (sr->per_tier[KVT__T_DISK] + sr->per_tier[KVT__T_REMOTE] + sr->per_tier[KVT__T_HOST] >= c->cap[KVT__T_HOST]) break;
      kvt__ref *r = kvt__walk_next(c, &w);
      r->entry = KVT__NONE;
      r->key = keys[i];
      r->tier = KVT__T_REMOTE;
      r->dup = 0;
      sr->per_tier[KVT__T_REMOTE]++;
      sr->n++;
      continue;
    }
    kvt__entry *en = kvt__E(c, e);
    if (!kvt__key_eq(&en->parent, par)) break;
    int t = fastest_valid(en);
    if (shared_after_copy(sr, t)) break;
    int dup = 0;
    if (t != KVT__T_DEV && (en->state[KVT__T_DEV] == KVT__FILLING || en->state[KVT__T_HOST] == KVT__FILLING)) {
      if (!host_followable(c, en)) break;
      dup = en->state[KVT__T_DEV] == KVT__FILLING;
      if (dup && no_dup) {
        sr->must_wait = 1;
        break;
      }
      t = KVT__T_HOST; /* pinned there, valid or not yet */
    }
    if (t < 0) break;
    /* Disk blocks stage through host slots: restore no more of them than
     * the host tier can hold beside the host blocks this request pins (the
     * rest of the prefix is recomputed). */
    if (t == KVT__T_DISK && sr->per_tier[KVT__T_DISK] + sr->per_tier[KVT__T_REMOTE] + sr->per_tier[KVT__T_HOST] >= c->cap[KVT__T_HOST])
      break;
    /* Pin counts are 16 bits: a block already shared by that many
     * requests is recomputed rather than let its count wrap to 0 (which
     * would put a block in use on the LRU, free to be evicted). */
    if (en->pins[t] == UINT16_MAX) break;
    /* A host copy still being fetched is checked when it lands. */
    if (en->state[t] == KVT__VALID && !tokens_match(c, en, t, tokens ? tokens + i * c->bt : NULL)) {
      sr->mismatch = 1; /* counted once per acquire, however often it re-scans */
      break;
    }
    kvt__index_pin(&c->map, e, t);
    kvt__ref *r = kvt__walk_next(c, &w);
    r->entry = e;
    r->tier = (uint8_t)t;
    r->dup = (uint8_t)(dup ? KVT__DUP_LOADING : 0);
    r->unchecked = en->state[t] != KVT__VALID; /* checked when it lands, or by a re-scan */
    sr->n_dup += (uint32_t)dup;
    r->slot = en->slot[KVT__T_DEV]; /* a device hit's slot; fill_request sets the others' */
    sr->per_tier[t]++;
    sr->n++;
  }
}

/* Last pinned first, as kvt_release does. */
static void unpin_prefix(kvt_cache *c, uint32_t chunk0, uint32_t n) {
  if (n == 0) return;
  kvt__ref_walk w;
  kvt__walk_back_from(c, &w, kvt__ref_id(c, chunk0, n - 1));
  for (uint32_t i = n; i-- > 0;) {
    const kvt__ref *r = kvt__walk_prev(c, &w);
    if (r->tier == KVT__T_REMOTE) continue;
    kvt__index_unpin(&c->map, r->entry, r->tier);
    if (r->tier == KVT__T_HOST) kvt__maybe_remove(c, r->entry); /* a followed fetch failed meanwhile */
  }
}

static void set_dev_tokens(kvt_cache *c, uint32_t slot, const uint32_t *tok) {
  if (c->metadata_only) return;
  c->dev_has_tokens[slot] = tok != NULL;
  if (tok) memcpy(c->dev_tokens + (size_t)slot * c->bt, tok, (size_t)c->bt * sizeof(uint32_t));
}

/* Builds the request's refs and its load job (lock held, room made). */
static void fill_request(kvt_cache *c, kvt__request *rq, uint32_t job, const kvt_key *keys,
                         const uint32_t *tokens, uint32_t *slots) {
  uint32_t total = rq->n_blocks + rq->n_extra;
  kvt__job *jb = job == KVT__NONE ? NULL : &c->jobs[job];
  uint32_t staged = 0; /* host slots held in jb->dev_slots by kvt_acquire */
  kvt__ref_walk w;
  kvt__walk_from(c, &w, kvt__req_ref0(rq));
  for (uint32_t i = 0; i < total; i++) {
    kvt__ref *r = kvt__walk_next(c, &w);
    const uint32_t *tok = tokens && i < rq->n_blocks ? tokens + (size_t)i * c->bt : NULL;
    if (i >= rq->n_restore) { /* fresh slot for the engine to compute into */
      memset(r, 0, sizeof *r);
      r->entry = KVT__NONE;
      if (i < rq->n_blocks) r->key = keys[i];
      r->slot = slots[i] = kvt__slots_take(&c->slots[KVT__T_DEV]);
      set_dev_tokens(c, r->slot, tok);
      continue;
    }
    r->key = keys[i];
    r->failed = 0;
    if (r->tier == KVT__T_DEV) { /* scan_prefix noted its slot */
      slots[i] = r->slot;
      continue;
    }
    if (r->tier == KVT__T_REMOTE) /* room was made and the key is absent (prefix_moved): the entry fits */
      r->entry = kvt__index_insert(&c->map, &keys[i], i ? &keys[i - 1] : &rq->parent);
    kvt__entry *en = kvt__E(c, r->entry);
    r->slot = slots[i] = kvt__slots_take(&c->slots[KVT__T_DEV]);
    kvt__op *op = &jb->ops[jb->n_ops++];
    memset(op, 0, sizeof *op);
    op->jb = jb;
    op->entry = r->entry;
    op->ref = kvt__walk_id(&w);
    op->slot[KVT__T_DEV] = r->slot;
    op->slot[KVT__T_DISK] = KVT__NONE;
    if (r->tier == KVT__T_HOST) {
      op->slot[KVT__T_HOST] = en->slot[KVT__T_HOST];
      op->landed = 1;
      if (en->state[KVT__T_HOST] == KVT__FILLING) { /* lands with another job's fetch */
        op->follow = 1;
        op->landed = 0;
        op->tok_sum = tok ? XXH3_64bits(tok, (size_t)c->bt * sizeof(uint32_t)) : 0;
        kvt__op **head = &c->host_follow[op->slot[KVT__T_HOST]];
        op->follow_next = *head;
        *head = op;
        jb->following++;
      }
      if (r->dup) { /* a private copy: the entry's device copy is another request's */
        op->dup = 1;
        r->entry = KVT__NONE;
        if (c->dev_has_tokens) c->dev_has_tokens[r->slot] = 0; /* set from the record on landing */
        continue;
      }
    } else { /* disk or remote: stage through a host slot, kept pinned for the load */
      uint32_t hs = jb->dev_slots[staged++];
      op->slot[KVT__T_HOST] = hs;
      op->remote = r->tier == KVT__T_REMOTE;
      op->slot[KVT__T_DISK] = op->remote ? KVT__NONE : en->slot[KVT__T_DISK];
      op->from_disk = 1;
      op->tok_sum = tok ? XXH3_64bits(tok, (size_t)c->bt * sizeof(uint32_t)) : 0;
      kvt__index_set_state(&c->map, r->entry, KVT__T_HOST, KVT__FILLING, hs);
      kvt__index_pin(&c->map, r->entry, KVT__T_HOST);
      jb->n_fetch++;
    }
    kvt__index_set_state(&c->map, r->entry, KVT__T_DEV, KVT__FILLING, r->slot);
    kvt__index_pin(&c->map, r->entry, KVT__T_DEV);
    if (c->dev_has_tokens) c->dev_has_tokens[r->slot] = 0; /* set from the record on landing */
  }
}

/* Leading keys the tier map holds in this chain (lock held): where a
 * remote probe starts. */
static uint32_t local_chain(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n) {
  uint32_t i = 0;
  for (; i < n; i++) {
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE || !kvt__key_eq(&kvt__E(c, e)->parent, chain_parent_of(c, parent, keys, i))) break;
  }
  return i;
}

static int acquire_args_ok(const kvt_cache *c, const kvt_key *keys, size_t n_blocks, size_t restore,
                           size_t extra, const kvt_req *req, const uint32_t *slots,
                           const kvt_acquire_info *info) {
  if ((n_blocks && !keys) || !req || !slots || restore > n_blocks) return 0;
  return n_blocks + extra > 0;
}

/* Undoes what reserve() held: pins, staged host slots, the job. */
static void unreserve(kvt_cache *c, uint32_t chunk0, const scan_result *sr, uint32_t job, uint32_t n_stage) {
  for (uint32_t i = 0; i < n_stage; i++) kvt__slots_put(&c->slots[KVT__T_HOST], c->jobs[job].dev_slots[i]);
  unpin_prefix(c, chunk0, sr->n);
  if (job != KVT__NONE) kvt__job_free(c, job);
}

/* While make_room waited, another request may have started copying a
 * pinned block into a faster tier (or finished doing so): restoring it
 * again would overwrite that copy's slot. */
static int prefix_moved(kvt_cache *c, uint32_t chunk0, uint32_t n) {
  kvt__ref_walk w;
  kvt__walk_from(c, &w, chunk0 * KVT__REF_CHUNK);
  for (uint32_t i = 0; i < n; i++) {
    const kvt__ref *r = kvt__walk_next(c, &w);
    if (r->tier == KVT__T_DEV) continue; /* nothing is faster */
    if (r->tier == KVT__T_REMOTE) { /* someone else fetched or computed it meanwhile */
      if (kvt__index_find(&c->map, &r->key) != KVT__NONE) return 1;
      continue;
    }
    const kvt__entry *en = kvt__E(c, r->entry);
    if (en->state[r->tier] == KVT__ABSENT) return 1; /* a followed fetch failed */
    /* Landed while make_room waited: no follow will check its tokens, the re-scan does. */
    if (r->unchecked && en->state[r->tier] != KVT__FILLING) return 1;
    if (r->dup) { /* a private copy, whatever the device copy in flight does, unless it landed */
      if (en->state[KVT__T_DEV] == KVT__VALID) return 1;
      continue;
    }
    for (int t = 0; t < r->tier; t++)
      if (en->state[t] != KVT__ABSENT) return 1;
  }
  return 0;
}

/* Pins the restorable prefix and makes room for the request: host slots
 * to stage its disk blocks (held in the job's dev_slots array) and device
 * slots for everything not already on the device. Lock held; may wait. */
static int reserve(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, const uint32_t *tokens, size_t restore,
                   uint32_t chunk0, uint32_t total, int may_wait, const remote_run *rr, scan_result *sr,
                   uint32_t *job_out) {
  int no_dup = 0;
  for (;;) {
    scan_prefix(c, parent, keys, tokens, restore, chunk0, rr, no_dup, sr);
    if (sr->must_wait) { /* the device had no room for private copies: share the other load's slots */
      unpin_prefix(c, chunk0, sr->n);
      if (!may_wait) return KVT_EAGAIN;
      kvt__wait(c, NULL);
      continue;
    }
    uint32_t n_copy = sr->n - sr->per_tier[KVT__T_DEV], n_stage = 0, job = KVT__NONE;
    uint32_t staging = sr->per_tier[KVT__T_DISK] + sr->per_tier[KVT__T_REMOTE];
    int rc = 0, no_job = 0, dev_short = 0;
    if (n_copy && (job = kvt__job_new(c, KVT__JOB_LOAD, 0)) == KVT__NONE) {
      rc = may_wait ? KVT_ENOSPACE : KVT_EAGAIN;
      no_job = 1;
    }
    else if ((rc = kvt__make_room(c, KVT__T_HOST, staging, may_wait)) == 0) {
      /* Hold the staging slots now: the device's demotions below need host
       * slots too, and must make their own room rather than take these. */
      for (; n_stage < staging; n_stage++)
        c->jobs[job].dev_slots[n_stage] = kvt__slots_take(&c->slots[KVT__T_HOST]);
      rc = kvt__make_room(c, KVT__T_DEV, total - sr->per_tier[KVT__T_DEV], may_wait);
      dev_short = rc == KVT_ENOSPACE;
    }
    if (rc == 0 && c->n_req_free == 0) rc = KVT_ENOSPACE;
    if (rc == 0 && !prefix_moved(c, chunk0, sr->n)) {
      *job_out = job;
      c->st.verify_mismatches += (uint64_t)sr->mismatch;
      return 0;
    }
    unreserve(c, chunk0, sr, job, n_stage);
    if (no_job && may_wait && c->inflight) {
      /* Every job is busy with transfers (spills, remote puts): one of
       * them frees a job when it finishes. */
      kvt__wait(c, NULL);
      continue;
    }
    if (dev_short && sr->n_dup && !no_dup) {
      /* No device room for private copies of blocks another request is
       * loading: wait for that load instead and share its slots (device
       * hits need none), as a request that only waits would. */
      no_dup = 1;
      continue;
    }
    if (rc == KVT_ENOSPACE && staging) {
      /* The host cannot stage the disk or remote blocks now (its slots are
       * pinned): restore only the prefix before the first of them. */
      uint32_t i = 0;
      for (uint32_t id = chunk0 * KVT__REF_CHUNK;
           i < sr->n && kvt__ref_at(c, id)->tier != KVT__T_DISK && kvt__ref_at(c, id)->tier != KVT__T_REMOTE;
           id = kvt__ref_next(c, id))
        i++;
      restore = i;
      continue;
    }
    if (rc != 0) {
      c->st.verify_mismatches += (uint64_t)sr->mismatch;
      return rc;
    }
  }
}

int kvt_acquire(kvt_cache *c, const kvt_key *keys, const uint32_t *tokens, size_t n_blocks, size_t restore,
                size_t extra_slots, uint32_t flags, kvt_req *req, uint32_t *slots, kvt_acquire_info *info) {
  return kvt_acquire_after(c, NULL, keys, tokens, n_blocks, restore, extra_slots, flags, req, slots, info);
}

int kvt_acquire_after(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, const uint32_t *tokens,
                      size_t n_blocks, size_t restore, size_t extra_slots, uint32_t flags, kvt_req *req,
                      uint32_t *slots, kvt_acquire_info *info) {
  KVT__REQ_CHECK(c);
  if (!acquire_args_ok(c, keys, n_blocks, restore, extra_slots, req, slots, info) || (flags & ~KVT_ACQUIRE_NOWAIT))
    return -EINVAL;
  if (info && info->size < KVT_ACQUIRE_INFO_SIZE_V1) return KVT_EVERSION;
  uint64_t limit = c->cap[KVT__T_DEV] < c->cfg.max_job_blocks ? c->cap[KVT__T_DEV] : c->cfg.max_job_blocks;
  if (n_blocks > limit || extra_slots > limit - n_blocks) return -E2BIG; /* no wrap-around */
  int may_wait = !(flags & KVT_ACQUIRE_NOWAIT), rc = 0;
  uint32_t total = (uint32_t)(n_blocks + extra_slots), job = KVT__NONE, chunk0, chunk_last;
  scan_result sr;
  remote_run rr = {0, 0};
  if (c->remote_on && restore) {
    /* Blocks after the local chain: one probe, before the lock (a round trip). */
    pthread_mutex_lock(&c->lock);
    uint32_t p = local_chain(c, parent, keys, restore);
    pthread_mutex_unlock(&c->lock);
    rr.from = p;
    rr.n = kvt__rtier_after(c, keys, restore, p);
  }
  pthread_mutex_lock(&c->lock);
  if (c->n_req_free == 0 || (rc = kvt__refs_alloc(c, total, &chunk0, &chunk_last)) != 0) {
    pthread_mutex_unlock(&c->lock);
    return rc ? rc : KVT_ENOSPACE;
  }
  rc = reserve(c, parent, keys, tokens, restore, chunk0, total, may_wait, &rr, &sr, &job);
  if (rc != 0) {
    kvt__refs_free(c, chunk0, chunk_last, total);
    pthread_mutex_unlock(&c->lock);
    kvt__flush_submits(c);
    return rc;
  }
  uint32_t n_copy = sr.n - sr.per_tier[KVT__T_DEV];
  uint32_t r = c->req_free[--c->n_req_free];
  kvt__request *rq = &c->reqs[r];
  rq->gen++;
  rq->busy = 1;
  rq->n_blocks = (uint32_t)n_blocks;
  rq->n_extra = (uint32_t)extra_slots;
  rq->n_restore = sr.n;
  rq->n_committed = 0;
  rq->chunk0 = chunk0;
  rq->chunk_last = chunk_last;
  rq->job = job;
  rq->parent = parent ? *parent : c->ns;
  fill_request(c, rq, job, keys, tokens, slots);
  int following_only = 0;
  if (job != KVT__NONE) {
    kvt__job *jb = &c->jobs[job];
    jb->req = r;
    jb->phase = jb->n_fetch || jb->following ? 1 : 2;
    jb->final_out = jb->phase == 2; /* host hits only: one copy, the job's own */
    if (jb->n_fetch) jb->flags |= KVT__JF_LOAD_AFTER;
    /* Only other jobs' fetches to wait for: nothing to submit now, the
     * progress step that lands the last of them starts the copy. */
    following_only = !jb->n_fetch && jb->following;
    if (jb->following) jb->t_start = kvt__now_ns();
    c->inflight++;
    c->st.jobs_started++;
  }
  c->st.acquires++;
  c->st.hits_device += sr.per_tier[KVT__T_DEV];
  c->st.hits_host += sr.per_tier[KVT__T_HOST];
  c->st.hits_disk += sr.per_tier[KVT__T_DISK];
  c->st.hits_remote += sr.per_tier[KVT__T_REMOTE];
  c->st.misses += n_blocks - sr.n;
  KVT__M_ACQUIRE(c, n_blocks, restore, sr.n, sr.mismatch, sr.per_tier[KVT__T_DEV]);
  *req = ((uint64_t)rq->gen << 32) | (r + 1);
  /* Disk reads wait for free queue slots: the progress thread submits
   * them, and the caller returns at once. */
  int deferred = job != KVT__NONE && c->jobs[job].n_fetch && c->progress_running;
  if (deferred) kvt__progress_submit(c, job);
  if (info) {
    kvt_acquire_info full = {sizeof full, sr.n, sr.per_tier[KVT__T_DEV], n_copy, sr.per_tier[KVT__T_DISK],
                             sr.per_tier[KVT__T_REMOTE]};
    kvt__struct_out(info, &full, sizeof full, KVT_ACQUIRE_INFO_SIZE_V1);
  }
  pthread_mutex_unlock(&c->lock);
  kvt__flush_submits(c);
  if (job == KVT__NONE) return 0;
  if (!deferred && !following_only) kvt__job_submit(c, job);
  return 1;
}

/* Leading restored blocks whose device copy is valid (lock held, loads done). */
static uint32_t ready_prefix(kvt_cache *c, const kvt__request *rq) {
  uint32_t i = 0;
  for (uint32_t id = kvt__req_ref0(rq); i < rq->n_restore; i++, id = kvt__ref_next(c, id)) {
    const kvt__ref *r = kvt__ref_at(c, id);
    if (r->dup == KVT__DUP_READY) continue; /* a private copy that landed */
    if (r->entry == KVT__NONE) break;
    const kvt__entry *en = kvt__E(c, r->entry);
    if (en->state[KVT__T_DEV] != KVT__VALID || en->slot[KVT__T_DEV] != r->slot) break;
  }
  return i;
}

static int loading(const kvt_cache *c, const kvt__request *rq) {
  return rq->job != KVT__NONE && !c->jobs[rq->job].done;
}

int kvt_request_poll(kvt_cache *c, kvt_req req, uint32_t *n_ready) {
  return kvt_request_wait(c, req, 0, n_ready);
}

static void deadline_after(struct timespec *ts, int64_t ns) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ns / 1000000000;
  ts->tv_nsec += ns % 1000000000;
  if (ts->tv_nsec >= 1000000000) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000;
  }
}

int kvt_request_wait(kvt_cache *c, kvt_req req, int64_t timeout_ns, uint32_t *n_ready) {
  KVT__REQ_CHECK(c);
  struct timespec dl;
  if (timeout_ns > 0) deadline_after(&dl, timeout_ns);
  kvt__cq_drain(c); /* a poll sees what backends posted, whatever the progress thread is doing */
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req);
  int rc = 0;
  while (r != KVT__NONE && loading(c, &c->reqs[r]) && rc == 0) {
    if (timeout_ns == 0) {
      rc = 1;
      break;
    }
    int late = kvt__wait(c, timeout_ns < 0 ? NULL : &dl) != 0;
    r = req_from_handle(c, req); /* another thread may have released it meanwhile */
    if (late && r != KVT__NONE && loading(c, &c->reqs[r])) rc = KVT_ETIMEDOUT;
  }
  if (r == KVT__NONE) rc = KVT_ENOJOB;
  else if (n_ready) *n_ready = rc == 0 ? ready_prefix(c, &c->reqs[r]) : 0;
  if (timeout_ns == 0 && rc == KVT_ETIMEDOUT) rc = 1;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* One block's outcome once the loads are over (lock held). Past n_ready
 * every slot is the request's own: shared_after_copy() saw to that. */
static uint8_t block_state(const kvt_cache *c, const kvt__request *rq, uint32_t i, uint32_t id, uint32_t n_ready) {
  if (i < n_ready) return KVT_BLOCK_READY;
  return i < rq->n_restore && kvt__ref_at(c, id)->failed ? KVT_BLOCK_FAILED : KVT_BLOCK_COMPUTE;
}

int kvt_request_block_states(kvt_cache *c, kvt_req req, uint8_t *states, size_t n) {
  KVT__REQ_CHECK(c);
  if (n && !states) return -EINVAL;
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req);
  int rc = r == KVT__NONE ? KVT_ENOJOB : n > c->reqs[r].n_blocks ? -EINVAL : loading(c, &c->reqs[r]) ? 1 : 0;
  if (rc == 0) {
    const kvt__request *rq = &c->reqs[r];
    uint32_t n_ready = ready_prefix(c, rq);
    uint32_t id = kvt__req_ref0(rq);
    for (uint32_t i = 0; i < n; i++, id = kvt__ref_next(c, id)) states[i] = block_state(c, rq, i, id, n_ready);
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* A load job that a layer query uses outside the lock: finish_job leaves
 * it to the last holder to free (lock held for job_hold). */
static kvt__job *job_hold(kvt_cache *c, uint32_t j) {
  kvt__job *jb = &c->jobs[j];
  jb->holders++;
  return jb;
}

static void job_unhold(kvt_cache *c, kvt__job *jb) {
  pthread_mutex_lock(&c->lock);
  if (--jb->holders == 0 && jb->done && jb->req == KVT__NONE && jb->busy) kvt__job_free(c, jb->index);
  pthread_mutex_unlock(&c->lock);
}

/* A load's device copy of a layer may be waited for once every copy of the
 * job is with the backend: its streamed chunks are over (they go back to
 * the pool as they finish) and its own xfer, if any, is submitted. Lock held. */
static int copies_settled(const kvt_cache *c, const kvt__request *rq) {
  const kvt__job *jb = &c->jobs[rq->job];
  return jb->submitted && jb->chunks_out == 0;
}

int kvt_request_layer_ready(kvt_cache *c, kvt_req req, uint32_t layer) {
  KVT__REQ_CHECK(c);
  if (layer >= c->layout.num_layers) return -EINVAL;
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req);
  int rc = r == KVT__NONE ? KVT_ENOJOB : 0;
  kvt__job *jb = NULL;
  if (rc == 0 && loading(c, &c->reqs[r])) {
    if (!copies_settled(c, &c->reqs[r]) || c->metadata_only) rc = 1;
    else jb = job_hold(c, c->reqs[r].job);
  }
  pthread_mutex_unlock(&c->lock);
  /* The backend's query (cudaEventQuery) runs outside the metadata lock;
   * held, the job is not reused meanwhile. */
  if (!jb) return rc;
  rc = kvt__dev_layer_ready(&c->dev, &jb->xfer, layer);
  job_unhold(c, jb);
  return rc;
}

int kvt_request_wait_layer(kvt_cache *c, kvt_req req, uint32_t layer, void *stream) {
  KVT__REQ_CHECK(c);
  if (layer >= c->layout.num_layers) return -EINVAL;
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req);
  if (r == KVT__NONE) {
    pthread_mutex_unlock(&c->lock);
    return KVT_ENOJOB;
  }
  /* The device copy of a layer exists only once the fetch phase is over
   * and the backend has accepted the load. */
  while (r != KVT__NONE && loading(c, &c->reqs[r]) && !copies_settled(c, &c->reqs[r])) {
    kvt__wait(c, NULL);
    r = req_from_handle(c, req); /* another thread may have released it meanwhile */
  }
  if (r == KVT__NONE) {
    pthread_mutex_unlock(&c->lock);
    return KVT_ENOJOB;
  }
  kvt__job *jb = loading(c, &c->reqs[r]) && !c->metadata_only ? job_hold(c, c->reqs[r].job) : NULL;
  pthread_mutex_unlock(&c->lock);
  /* Held, the job is not reused while the backend waits on it. */
  if (!jb) return 0;
  int rc = kvt__dev_wait_layer(&c->dev, &jb->xfer, layer, stream);
  job_unhold(c, jb);
  return rc;
}

/* ---- commit and release ---- */

int kvt_request_extend(kvt_cache *c, kvt_req req, const kvt_key *keys, const uint32_t *tokens, size_t n) {
  KVT__REQ_CHECK(c);
  if (n && !keys) return -EINVAL;
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req);
  int rc = r == KVT__NONE ? KVT_ENOJOB : (n > c->reqs[r].n_extra ? -EINVAL : 0);
  if (rc == 0) {
    kvt__request *rq = &c->reqs[r];
    uint32_t id = n ? kvt__ref_id(c, rq->chunk0, rq->n_blocks) : KVT__NONE;
    for (size_t i = 0; i < n; i++, id = kvt__ref_next(c, id)) {
      kvt__ref *ref = kvt__ref_at(c, id);
      ref->key = keys[i];
      set_dev_tokens(c, ref->slot, tokens ? tokens + i * c->bt : NULL);
    }
    rq->n_blocks += (uint32_t)n;
    rq->n_extra -= (uint32_t)n;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static uint32_t commit_blocks(kvt_cache *c, kvt__request *rq, uint32_t n_valid, uint32_t *stores) {
  uint32_t n_store = 0;
  if (rq->n_committed >= n_valid) return 0;
  uint32_t id = kvt__ref_id(c, rq->chunk0, rq->n_committed);
  const kvt_key *parent = rq->n_committed ? &kvt__ref_at(c, kvt__ref_prev(c, id))->key : &rq->parent;
  kvt__ref_walk w;
  kvt__walk_from(c, &w, id);
  for (uint32_t i = rq->n_committed; i < n_valid; i++) {
    kvt__ref *r = kvt__walk_next(c, &w);
    const kvt_key *par = parent;
    parent = &r->key;
    if (r->entry != KVT__NONE) continue; /* restored or a device hit */
    uint32_t e = kvt__index_find(&c->map, &r->key);
    if (e == KVT__NONE) e = kvt__index_insert(&c->map, &r->key, par);
    if (e == KVT__NONE) break;
    kvt__entry *en = kvt__E(c, e);
    /* Someone else computed it first: ours stays private and is freed. */
    if (en->state[KVT__T_DEV] != KVT__ABSENT) continue;
    kvt__index_set_state(&c->map, e, KVT__T_DEV, KVT__VALID, r->slot);
    kvt__index_pin(&c->map, e, KVT__T_DEV);
    r->entry = e;
    c->st.blocks_committed++;
    if (en->state[KVT__T_HOST] == KVT__ABSENT) stores[n_store++] = e;
  }
  if (n_valid > rq->n_committed) rq->n_committed = n_valid;
  return n_store;
}

int kvt_commit(kvt_cache *c, kvt_req req, size_t n_valid, void *stream) {
  KVT__REQ_CHECK(c);
  if (stream && !c->metadata_only) {
    int frc = kvt__dev_fence(&c->dev, stream); /* before any store of these blocks */
    if (frc < 0) return frc;
  }
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req), job = KVT__NONE;
  int rc = 0;
  if (r == KVT__NONE) rc = KVT_ENOJOB;
  else if (n_valid > c->reqs[r].n_blocks) rc = -EINVAL;
  else if (loading(c, &c->reqs[r])) rc = KVT_EBUSY; /* wait for the loads first */
  if (rc == 0) {
    uint32_t *stores = c->scratch_entries;
    uint32_t n = commit_blocks(c, &c->reqs[r], (uint32_t)n_valid, stores);
    if (n && c->cfg.write_policy == KVT_WRITE_THROUGH && kvt__has_tier(c, KVT__T_HOST)) {
      if (kvt__make_room(c, KVT__T_HOST, n, 0) != 0 && c->slots[KVT__T_HOST].n_free < n)
        n = c->slots[KVT__T_HOST].n_free;
      if (n) job = kvt__start_store(c, stores, n, 0);
    }
  }
  pthread_mutex_unlock(&c->lock);
  kvt__flush_submits(c);
  if (job != KVT__NONE) kvt__job_submit(c, job);
  return rc;
}

int kvt_release(kvt_cache *c, kvt_req req) {
  KVT__REQ_CHECK(c);
  pthread_mutex_lock(&c->lock);
  uint32_t r = req_from_handle(c, req);
  if (r == KVT__NONE) {
    pthread_mutex_unlock(&c->lock);
    return KVT_ENOJOB;
  }
  while (loading(c, &c->reqs[r])) {
    kvt__wait(c, NULL);
    if ((r = req_from_handle(c, req)) == KVT__NONE) { /* released by another thread meanwhile */
      pthread_mutex_unlock(&c->lock);
      return KVT_ENOJOB;
    }
  }
  kvt__request *rq = &c->reqs[r];
  /* Last block first: ancestors end up more recent than their tails. */
  uint32_t total = rq->n_blocks + rq->n_extra;
  kvt__ref_walk w;
  kvt__walk_back_from(c, &w, rq->chunk_last * KVT__REF_CHUNK + (total - 1) % KVT__REF_CHUNK);
  for (uint32_t i = total; i-- > 0;) {
    kvt__ref *ref = kvt__walk_prev(c, &w);
    if (ref->entry == KVT__NONE) {
      kvt__slots_put(&c->slots[KVT__T_DEV], ref->slot);
      if (c->dev_has_tokens) c->dev_has_tokens[ref->slot] = 0;
      continue;
    }
    kvt__index_unpin(&c->map, ref->entry, KVT__T_DEV);
    kvt__index_touch(&c->map, ref->entry, KVT__T_DEV);
    kvt__index_touch(&c->map, ref->entry, KVT__T_HOST);
    kvt__index_touch(&c->map, ref->entry, KVT__T_DISK);
  }
  kvt__refs_free(c, rq->chunk0, rq->chunk_last, total);
  rq->job = KVT__NONE; /* its load job went back when the loads finished */
  rq->busy = 0;
  c->req_free[c->n_req_free++] = r;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  return 0;
}
