/* The progress step: what a posted completion does to the tier map, and
 * the work it starts (write-through spills, a restore's next chunk or
 * stage). It runs on the progress thread, or inside an API call that
 * would otherwise wait (kvt__wait): never on a backend's thread. Also the
 * submission policy (disk I/O only from the progress thread) and making
 * room with waiting. Calls evict.c and jobs.c, never the other way. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/engine.h"
#include "store/record.h"
#include "util/clock.h"

static _Thread_local int tl_draining;
static _Thread_local const kvt_cache *tl_progress;

/* ---- completion effects (c->lock held) ---- */

static kvt__ref *op_ref(kvt_cache *c, const kvt__job *jb, const kvt__op *op) {
  if (jb->req == KVT__NONE || op->ref == KVT__NONE) return NULL;
  return kvt__ref_at(c, op->ref);
}

/* The request gives up its claim on the entry; its slot becomes private
 * and the block, counted as a hit at acquire, becomes a miss. A private
 * copy (dup) had no claim on the entry's device copy: it stops being one.
 * Its entry may be gone by then (its fetch failed, and the request that
 * loaded it dropped it), so nothing here reads it. */
static void ref_go_private(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  kvt__ref *r = op_ref(c, jb, op);
  int claimed = r && (op->dup ? r->dup == KVT__DUP_LOADING : r->entry == op->entry);
  if (claimed) {
    if (op->dup) {
      r->dup = 0;
    } else {
      kvt__index_unpin(&c->map, op->entry, KVT__T_DEV);
      r->entry = KVT__NONE;
    }
    r->failed = op->status != 0; /* else cancelled behind an earlier failure */
    if (op->remote) c->st.hits_remote--;
    else if (op->from_disk) c->st.hits_disk--;
    else c->st.hits_host--;
    c->st.misses++;
    KVT__M_ADD(c, miss_blocks[op->status == KVT_EMISMATCH ? KVT__MISS_MISMATCH : KVT__MISS_LOAD_ERROR], 1);
  }
}

static void store_done(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  uint32_t e = op->entry;
  kvt__index_unpin(&c->map, e, KVT__T_DEV);
  if (op->status == 0) {
    kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__VALID, op->slot[KVT__T_HOST]);
    c->st.blocks_d2h++;
    c->st.bytes_d2h += c->block_bytes;
  } else {
    kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__ABSENT, 0);
    kvt__slots_put(&c->slots[KVT__T_HOST], op->slot[KVT__T_HOST]);
    if (op->status != KVT_ECANCELED) c->st.copy_errors++;
    if (op->status != KVT_ECANCELED) kvt__event_note(c, KVT__EV_COPY, op->status, UINT64_MAX);
  }
  if (jb->flags & KVT__JF_EVICT) {
    kvt__entry *en = kvt__E(c, e);
    c->freeing[KVT__T_DEV]--;
    /* A failed demotion still frees the slot (the block is then dropped):
     * a copy path that keeps failing must not stall eviction forever. An
     * engine's kvt_store(EVICT) keeps the device copy when its copy fails. */
    int demote = (jb->flags & KVT__JF_DEMOTE) != 0;
    if ((op->status == 0 || demote) && en->pins[KVT__T_DEV] == 0 && en->state[KVT__T_DEV] == KVT__VALID) {
      kvt__drop_tier(c, e, KVT__T_DEV);
      c->st.evictions_device++;
      kvt__maybe_remove(c, e);
    }
  }
}

static void load_done(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  uint32_t e = op->entry;
  kvt__index_unpin(&c->map, e, KVT__T_HOST);
  if (op->status == 0) {
    kvt__ref *r = op_ref(c, jb, op);
    if (!op->dup) kvt__index_set_state(&c->map, e, KVT__T_DEV, KVT__VALID, op->slot[KVT__T_DEV]);
    else if (r) r->dup = KVT__DUP_READY; /* the request's private copy; the entry is untouched */
    if (!c->metadata_only) { /* the device copy keeps its tokens for later stores */
      void *rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]);
      uint32_t ds = op->slot[KVT__T_DEV];
      c->dev_has_tokens[ds] = (((kvt__record_hdr *)rec)->flags & KVT_RECORD_F_TOKENS) != 0;
      if (c->dev_has_tokens[ds])
        memcpy(c->dev_tokens + (size_t)ds * c->bt, kvt__record_tokens(rec), (size_t)c->bt * sizeof(uint32_t));
    }
    c->st.blocks_h2d++;
    KVT__M_ADD(c, hit_blocks[op->remote ? KVT__T_REMOTE : op->from_disk ? KVT__T_DISK : KVT__T_HOST], 1);
    c->st.bytes_h2d += c->block_bytes;
  } else {
    if (!op->dup) kvt__index_set_state(&c->map, e, KVT__T_DEV, KVT__ABSENT, 0);
    ref_go_private(c, jb, op);
    c->st.copy_errors++;
    kvt__event_note(c, KVT__EV_COPY, op->status, UINT64_MAX);
  }
}

/* A spill that leaves the host (or a write-through) goes on to the remote
 * once the disk write is over: the two never seal the host record at once.
 * Returns 1 when the put took over the host copy's departure. */
static int spill_then_put(kvt_cache *c, kvt__job *jb, uint32_t e) {
  kvt__entry *en = kvt__E(c, e);
  if (!(jb->flags & KVT__JF_RPUT) || en->state[KVT__T_HOST] != KVT__VALID) return 0;
  int evict = (jb->flags & KVT__JF_EVICT) != 0;
  if (evict && en->pins[KVT__T_HOST]) evict = 0; /* a request holds it: it stays */
  return kvt__rput_add(c, e, evict) && evict;
}

static void spill_done(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  uint32_t e = op->entry;
  kvt__index_unpin(&c->map, e, KVT__T_HOST);
  if (op->status == 0) {
    kvt__index_set_state(&c->map, e, KVT__T_DISK, KVT__VALID, op->slot[KVT__T_DISK]);
    c->st.blocks_h2disk++;
    c->st.bytes_h2disk += c->block_bytes;
  } else {
    kvt__index_set_state(&c->map, e, KVT__T_DISK, KVT__ABSENT, 0);
    kvt__slots_put(&c->slots[KVT__T_DISK], op->slot[KVT__T_DISK]);
    c->st.io_errors++;
    kvt__event_note(c, KVT__EV_IO, op->status, op->slot[KVT__T_DISK]);
  }
  if (op->status != KVT_ECANCELED && spill_then_put(c, jb, e)) {
    c->freeing[KVT__T_HOST]--; /* the put counts it now */
    return;
  }
  if (jb->flags & KVT__JF_EVICT) {
    kvt__entry *en = kvt__E(c, e);
    c->freeing[KVT__T_HOST]--;
    /* A failed spill still frees the host slot: the block is then dropped. */
    if (en->pins[KVT__T_HOST] == 0 && en->state[KVT__T_HOST] == KVT__VALID) {
      kvt__drop_tier(c, e, KVT__T_HOST);
      c->st.evictions_host++;
      kvt__maybe_remove(c, e);
    }
  }
}

/* Verifies a fetched record against the request's tokens (exactness). */
static int fetch_verify(kvt_cache *c, const kvt__op *op) {
  if (!op->tok_sum || c->metadata_only) return 0;
  void *rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]);
  const kvt__record_hdr *h = rec;
  if (!(h->flags & KVT_RECORD_F_TOKENS)) return 0;
  uint64_t sum = XXH3_64bits(kvt__record_tokens(rec), (size_t)c->bt * sizeof(uint32_t));
  return sum == op->tok_sum ? 0 : KVT_EMISMATCH;
}

/* A fetch that failed drops the disk copy, whatever the reason: a record
 * that fails its checks is never trusted again, and one whose read fails
 * (a bad sector, a file truncated under the cache) would fail every later
 * request too. Once dropped, the block is recomputed and written anew when
 * it is next demoted. A cancelled fetch keeps it. */
static void fetch_failed(kvt_cache *c, uint32_t e, int status) {
  kvt__entry *en = kvt__E(c, e);
  if (status == KVT_ECANCELED) return;
  if (status == KVT_ECORRUPT) c->st.checksum_failures++;
  else if (status == KVT_EMISMATCH) c->st.verify_mismatches++;
  else c->st.io_errors++;
  if (status != KVT_EMISMATCH) kvt__event_note(c, status == KVT_ECORRUPT ? KVT__EV_CHECKSUM : KVT__EV_IO, status, en->slot[KVT__T_DISK]);
  if (en->state[KVT__T_DISK] == KVT__VALID && en->pins[KVT__T_DISK] == 0) kvt__drop_tier(c, e, KVT__T_DISK);
}

static void fetch_done(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  uint32_t e = op->entry;
  if (op->status == 0 && op->remote) op->status = kvt__rfetch_verify(c, op);
  if (op->status == 0) op->status = fetch_verify(c, op);
  if (!op->remote) kvt__index_unpin(&c->map, e, KVT__T_DISK);
  if (op->status == 0) {
    kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__VALID, op->slot[KVT__T_HOST]);
    if (op->remote) {
      c->st.blocks_remote2h++;
      c->st.bytes_remote2h += c->block_bytes;
    } else {
      c->st.blocks_disk2h++;
      c->st.bytes_disk2h += c->block_bytes;
    }
    return;
  }
  kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__ABSENT, 0);
  kvt__slots_put(&c->slots[KVT__T_HOST], op->slot[KVT__T_HOST]);
  if (jb->flags & KVT__JF_LOAD_AFTER) kvt__index_unpin(&c->map, e, KVT__T_HOST);
  if (op->remote) kvt__rtier_fetch_failed(c, &kvt__E(c, e)->key, op->status);
  else fetch_failed(c, e, op->status);
  if (!(jb->flags & KVT__JF_LOAD_AFTER)) kvt__maybe_remove(c, e);
}

/* A load op behind the first failure of its restore: the request computes
 * the block into its slot, now its own. A read that failed gave its host
 * pin back already (fetch_done, or the fetch it followed); a private copy
 * leaves the entry alone (it may be gone). */
static void give_up_load(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  if (op->status == 0) kvt__index_unpin(&c->map, op->entry, KVT__T_HOST);
  if (!op->dup) kvt__index_set_state(&c->map, op->entry, KVT__T_DEV, KVT__ABSENT, 0);
  ref_go_private(c, jb, op);
  if (!op->dup) kvt__maybe_remove(c, op->entry);
}

/* After the fetch phase of a request load: loads go ahead for the leading
 * blocks now on the host; from the first failed read on the request
 * recomputes, so the rest of its loads are cancelled. Returns ops kept. */
static uint32_t cut_loads_at_first_failure(kvt_cache *c, kvt__job *jb) {
  uint32_t keep = jb->n_ops;
  /* Ops before copy_next read fine (their chunks' copy statuses are not
   * read failures): the first failed read is at or after it. */
  for (uint32_t i = jb->copy_next; i < jb->n_ops; i++)
    if (jb->ops[i].status != 0) {
      keep = i;
      break;
    }
  for (uint32_t i = keep; i < jb->n_ops; i++) give_up_load(c, jb, &jb->ops[i]);
  if (keep < jb->n_ops && !jb->status) jb->status = jb->ops[keep].status;
  jb->n_ops = keep;
  return keep;
}

static void observe(kvt_cache *c, kvt__job *jb, int path, uint64_t bytes) {
  int64_t ns = kvt__now_ns() - jb->t_start;
  double s = (double)ns * 1e-9;
  KVT__M_TRANSFER(c, jb, path, ns); /* KVT_CALIB_* numbers the metrics' paths too */
  if (c->have_cost && bytes) kvt__calib_observe_transfer(&c->calib, path, bytes, 1, s);
}

/* Write-through: blocks that just reached the host go on to disk, and on
 * to the remote (after the disk write; at once without a disk tier). */
static uint32_t write_through(kvt_cache *c, kvt__job *jb) {
  if (c->cfg.write_policy != KVT_WRITE_THROUGH || jb->kind != KVT__JOB_STORE) return KVT__NONE;
  int disk = kvt__has_tier(c, KVT__T_DISK), remote = kvt__rtier(c) != NULL;
  if (!disk && !remote) return KVT__NONE;
  uint32_t j = KVT__NONE;
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    uint32_t e = jb->ops[i].entry;
    kvt__entry *en = kvt__E(c, e);
    if (jb->ops[i].status || en->state[KVT__T_HOST] != KVT__VALID) continue;
    if (!disk) {
      kvt__rput_add(c, e, 0);
      continue;
    }
    if (en->state[KVT__T_DISK] != KVT__ABSENT) continue;
    if (kvt__make_room(c, KVT__T_DISK, 1, 0) != 0) break;
    if (j == KVT__NONE && (j = kvt__job_new(c, KVT__JOB_SPILL, remote ? KVT__JF_RPUT : 0)) == KVT__NONE) break;
    kvt__job_add_copy(c, j, e, KVT__T_HOST, KVT__T_DISK, kvt__slots_take(&c->slots[KVT__T_DISK]));
  }
  kvt__rput_flush(c);
  return j;
}

/* Blocks fetched from the remote go on to disk (when there is one) on the
 * way up: a later request on this node finds them locally. */
static void spill_fetched(kvt_cache *c, kvt__job *jb) {
  if (!kvt__has_tier(c, KVT__T_DISK)) return;
  uint32_t j = KVT__NONE;
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    const kvt__op *op = &jb->ops[i];
    if (!op->remote || op->status) continue;
    kvt__entry *en = kvt__E(c, op->entry);
    if (en->state[KVT__T_HOST] != KVT__VALID || en->state[KVT__T_DISK] != KVT__ABSENT) continue;
    if (kvt__make_room(c, KVT__T_DISK, 1, 0) != 0) break;
    if (j == KVT__NONE && (j = kvt__job_new(c, KVT__JOB_SPILL, 0)) == KVT__NONE) break;
    if (c->jobs[j].n_ops == c->cfg.max_job_blocks) break;
    kvt__job_add_copy(c, j, op->entry, KVT__T_HOST, KVT__T_DISK, kvt__slots_take(&c->slots[KVT__T_DISK]));
  }
  if (j == KVT__NONE) return;
  c->inflight++;
  c->st.jobs_started++;
  kvt__queue_submit(c, j);
}

static void finish_job(kvt_cache *c, kvt__job *jb) {
  if (jb->kind == KVT__JOB_RPUT) {
    c->rput_jobs--;
    kvt__rput_flush(c); /* one held back by the cap goes now */
  }
  if (jb->status == KVT_ECANCELED) c->st.jobs_cancelled++;
  else if (jb->status) c->st.jobs_failed++;
  jb->done = 1;
  c->inflight--;
  if (jb->flags & KVT__JF_USER) { /* the handle keeps the outcome; the job goes back */
    kvt__handle *hd = &c->handles[jb->handle];
    hd->done = 1;
    hd->status = jb->status;
    hd->job = KVT__NONE;
    jb->handle = KVT__NONE;
  }
  if (jb->req != KVT__NONE) { /* a request's load: its outcome is in the request's refs and the map */
    c->reqs[jb->req].job = KVT__NONE;
    jb->req = KVT__NONE;
  }
  if (!jb->holders) kvt__job_free(c, jb->index); /* else the last layer query frees it */
}

/* ---- applying completions (c->lock held; a progress step) ---- */

static void queue_chunk(kvt_cache *c, kvt__job *jb);

/* Loads: moves the landed frontier over leading blocks whose reads are over
 * and good, and streams their device copy once a chunk's worth is there. */
static void stream_more(kvt_cache *c, kvt__job *jb) {
  if (jb->status) return; /* a chunk's copy failed: the rest is recomputed anyway */
  while (jb->scan < jb->n_ops && jb->ops[jb->scan].landed && jb->ops[jb->scan].status == 0) jb->scan++;
  /* A chunk: KVT__STREAM_BYTES, and at most a quarter of the restore, so
   * that a small restore streams too. */
  uint32_t quarter = (jb->n_ops + 3) / 4, want = c->stream_blocks < quarter ? c->stream_blocks : quarter;
  if (jb->scan - jb->copy_next >= want && c->n_xchunk_free && !c->metadata_only) queue_chunk(c, jb);
}

static void queue_chunk(kvt_cache *c, kvt__job *jb) {
  kvt__xchunk *ch = &c->xchunks[c->xchunk_free[--c->n_xchunk_free]];
  ch->jb = jb;
  ch->first = jb->copy_next;
  ch->n = jb->scan - jb->copy_next;
  ch->status = 0;
  jb->copy_next = jb->scan;
  jb->chunks_out++;
  c->chunkq[c->n_chunkq++] = ch->index;
}

/* Every device copy of a load is over: the blocks land in order, and from
 * the first one that failed on, the request recomputes (a block after it
 * whose copy landed is not shared: its slot becomes the request's own). */
static void load_finish(kvt_cache *c, kvt__job *jb) {
  int failed = 0;
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    kvt__op *op = &jb->ops[i];
    if (op->status == 0 && (jb->flags & KVT__JF_CANCEL)) op->status = KVT_ECANCELED;
    if (!failed || op->status != 0) load_done(c, jb, op);
    else give_up_load(c, jb, op); /* landed behind a failure: given up, like the loads cut after a failed read */
    if (op->status != 0 && !failed) {
      failed = 1;
      if (!jb->status) jb->status = op->status;
    }
  }
  observe(c, jb, 0, jb->bytes);
  spill_fetched(c, jb);
  finish_job(c, jb);
}

/* The fetch phase of a load is over: cut at the first failed read, then
 * copy what no chunk has taken yet with the job's own xfer. */
static void reads_over(kvt_cache *c, kvt__job *jb) {
  int copy_failed = jb->status != 0; /* set only by a failed chunk so far */
  uint32_t keep = cut_loads_at_first_failure(c, jb);
  jb->phase = 2;
  jb->final_first = jb->copy_next; /* streamed chunks cover leading good reads only: <= keep */
  if (keep > jb->copy_next && !copy_failed) {
    jb->final_out = 1;
    kvt__queue_submit(c, jb->index);
  } else {
    jb->submitted = 1; /* nothing (more) to copy: layer waits look at the chunks */
    if (jb->chunks_out == 0) load_finish(c, jb);
  }
}

/* The fetch into host slot hs is over (status: its outcome, the host
 * state set): the request loads that follow it land with it, each checked
 * against its own request's tokens, or fail with it (their host pin goes
 * back; the request computes from there). A load whose last fetch this
 * was goes on to its device copy. */
static void follows_land(kvt_cache *c, uint32_t hs, int status) {
  if (!c->host_follow || hs >= c->cap[KVT__T_HOST]) return;
  kvt__op *f = c->host_follow[hs];
  c->host_follow[hs] = NULL;
  while (f) {
    kvt__op *next = f->follow_next; /* f's job may finish below */
    kvt__job *jb = f->jb;
    f->follow_next = NULL;
    f->status = status ? status : fetch_verify(c, f);
    if (f->status) {
      kvt__index_unpin(&c->map, f->entry, KVT__T_HOST);
      if (!status) c->st.verify_mismatches++;
    }
    f->landed = 1;
    if (--jb->following == 0 && (!jb->n_fetch || (jb->disk_started && jb->pending == 0))) reads_over(c, jb);
    else stream_more(c, jb);
    f = next;
  }
}

static void apply_disk_op(kvt_cache *c, kvt__op *op) {
  kvt__job *jb = op->jb;
  if (op->status == 0 && (jb->flags & KVT__JF_CANCEL)) {
    /* A cancelled prefetch's read that other requests follow lands for
     * them (the job still reports KVT_ECANCELED). */
    uint32_t hs = op->slot[KVT__T_HOST];
    int followed = jb->kind == KVT__JOB_FETCH && c->host_follow && hs < c->cap[KVT__T_HOST] && c->host_follow[hs];
    if (followed) jb->status = jb->status ? jb->status : KVT_ECANCELED;
    else op->status = KVT_ECANCELED;
  }
  if (jb->kind == KVT__JOB_SPILL) spill_done(c, jb, op);
  else if (jb->kind == KVT__JOB_RPUT) kvt__rput_done(c, op);
  else {
    fetch_done(c, jb, op);
    follows_land(c, op->slot[KVT__T_HOST], op->status);
  }
  op->landed = 1;
  if (op->status && !jb->status && jb->kind != KVT__JOB_LOAD) jb->status = op->status;
  if (--jb->pending == 0) {
    uint64_t n = jb->kind == KVT__JOB_LOAD ? jb->n_fetch : jb->n_ops;
    /* The fetch phase is timed as a whole: a phase that read from the
     * remote calibrates the remote link (it is the slower of the two). */
    int path = jb->remote_total ? KVT_CALIB_HOST_REMOTE : 1;
    if (jb->kind == KVT__JOB_RPUT) n = 0; /* puts do not predict restores */
    observe(c, jb, path, n * c->block_bytes);
    if (jb->kind == KVT__JOB_LOAD) {
      if (jb->following) stream_more(c, jb); /* the fetches it follows land later */
      else reads_over(c, jb);
    } else {
      if (jb->kind == KVT__JOB_FETCH) spill_fetched(c, jb);
      finish_job(c, jb);
    }
  } else if (jb->kind == KVT__JOB_LOAD) {
    stream_more(c, jb);
  }
}

static void apply_chunk(kvt_cache *c, kvt__xchunk *ch) {
  kvt__job *jb = ch->jb;
  for (uint32_t i = ch->first; i < ch->first + ch->n; i++) jb->ops[i].status = ch->status;
  ch->jb = NULL;
  c->xchunk_free[c->n_xchunk_free++] = ch->index;
  jb->chunks_out--;
  if (ch->status && !jb->status) jb->status = ch->status; /* no more chunks, no last copy */
  if (jb->phase == 2) {
    if (!jb->final_out && jb->chunks_out == 0) load_finish(c, jb);
  } else {
    stream_more(c, jb); /* a chunk is free again */
  }
}

static void apply_job_xfer(kvt_cache *c, kvt__job *jb) {
  int status = jb->xfer_status;
  if (status == 0 && (jb->flags & KVT__JF_CANCEL)) status = KVT_ECANCELED;
  if (jb->kind == KVT__JOB_LOAD) {
    for (uint32_t i = jb->final_first; i < jb->n_ops; i++) jb->ops[i].status = status;
    jb->final_out = 0;
    if (jb->chunks_out == 0) load_finish(c, jb);
    return;
  }
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    jb->ops[i].status = status;
    store_done(c, jb, &jb->ops[i]);
  }
  if (status && !jb->status) jb->status = status;
  observe(c, jb, 0, jb->bytes);
  uint32_t next = write_through(c, jb);
  if (next != KVT__NONE) {
    c->inflight++;
    c->st.jobs_started++; /* like every other job: jobs_failed never exceeds it */
    kvt__queue_submit(c, next);
  }
  finish_job(c, jb);
}

/* ---- submission (c->lock NOT held) ---- */

/* Submits a job's current phase. Disk ops reach the store only from the
 * progress thread (or at once in a metadata-only cache, where nothing
 * moves): no engine thread ever waits on the store. */
void kvt__job_submit(kvt_cache *c, uint32_t j) {
  kvt__job *jb = &c->jobs[j];
  if (kvt__job_disk_phase(jb)) {
    kvt__job_disk_start(c, jb);
    if (tl_progress == c || c->metadata_only) {
      if (!kvt__job_disk_ops(c, jb)) c->diskwait[c->n_diskwait++] = j; /* only the progress thread gets here */
    } else {
      pthread_mutex_lock(&c->lock);
      kvt__progress_submit(c, j);
      pthread_mutex_unlock(&c->lock);
    }
    kvt__cq_drain(c); /* completions posted at once (metadata only, refusals) */
    return;
  }
  kvt__job_copy(c, jb);
  kvt__cq_drain(c);
}

void kvt__flush_submits(kvt_cache *c) {
  for (;;) {
    pthread_mutex_lock(&c->lock);
    uint32_t ch = c->n_chunkq ? c->chunkq[--c->n_chunkq] : KVT__NONE;
    uint32_t j = ch == KVT__NONE && c->n_submitq ? c->submitq[--c->n_submitq] : KVT__NONE;
    pthread_mutex_unlock(&c->lock);
    if (ch != KVT__NONE) kvt__chunk_submit(c, &c->xchunks[ch]);
    else if (j != KVT__NONE) kvt__job_submit(c, j);
    else return;
  }
}

/* Room for `need` blocks in `tier` (evict.c starts evictions); with
 * may_wait, waits for demotions in flight, applying completions itself. */
int kvt__make_room(kvt_cache *c, int tier, uint32_t need, int may_wait) {
  for (;;) {
    int rc = kvt__room_step(c, tier, need, (may_wait & KVT__ROOM_KEEP) != 0);
    if (rc != KVT_EAGAIN) return rc;
    if (!may_wait) return KVT_EAGAIN;
    if (c->n_submitq || c->n_chunkq) {
      /* Our demotions must be under way before we wait for them. */
      pthread_mutex_unlock(&c->lock);
      kvt__flush_submits(c);
      pthread_mutex_lock(&c->lock);
      continue;
    }
    kvt__wait(c, NULL);
  }
}

/* ---- the progress step ---- */

static void cq_take(kvt_cache *c, kvt__op **ops, kvt__xchunk **chunks, kvt__job **jobs) {
  pthread_mutex_lock(&c->cq_lock);
  kvt__op *o = c->cq_ops;
  kvt__xchunk *x = c->cq_chunks;
  kvt__job *jb = c->cq_jobs;
  c->cq_ops = NULL;
  c->cq_chunks = NULL;
  c->cq_jobs = NULL;
  atomic_store(&c->cq_n, 0);
  pthread_mutex_unlock(&c->cq_lock);
  /* Posted newest first: applied oldest first. */
  *ops = NULL;
  while (o) {
    kvt__op *n = o->cq_next;
    o->cq_next = *ops;
    *ops = o;
    o = n;
  }
  *chunks = NULL;
  while (x) {
    kvt__xchunk *n = x->cq_next;
    x->cq_next = *chunks;
    *chunks = x;
    x = n;
  }
  *jobs = NULL;
  while (jb) {
    kvt__job *n = jb->cq_next;
    jb->cq_next = *jobs;
    *jobs = jb;
    jb = n;
  }
}

void kvt__cq_drain(kvt_cache *c) {
  if (tl_draining || !atomic_load(&c->cq_n)) return; /* on this thread already: the outer step goes round again */
  tl_draining = 1;
  for (int round = 0; round < 64 && atomic_load(&c->cq_n); round++) {
    kvt__op *ops;
    kvt__xchunk *chunks;
    kvt__job *jobs;
    cq_take(c, &ops, &chunks, &jobs);
    pthread_mutex_lock(&c->lock);
    for (kvt__op *o = ops, *n; o; o = n) {
      n = o->cq_next; /* the op may be reused once applied */
      apply_disk_op(c, o);
    }
    for (kvt__xchunk *x = chunks, *n; x; x = n) {
      n = x->cq_next;
      apply_chunk(c, x);
    }
    for (kvt__job *jb = jobs, *n; jb; jb = n) {
      n = jb->cq_next;
      apply_job_xfer(c, jb);
    }
    kvt__rput_flush(c); /* the puts these completions started */
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    kvt__events_flush(c);
    kvt__flush_submits(c);
  }
  tl_draining = 0;
}

int kvt__wait(kvt_cache *c, const struct timespec *dl) {
  if (tl_draining) return dl ? pthread_cond_timedwait(&c->cond, &c->lock, dl) : pthread_cond_wait(&c->cond, &c->lock);
  atomic_fetch_add(&c->cq_waiters, 1);
  int rc = 0;
  if (atomic_load(&c->cq_n)) {
    pthread_mutex_unlock(&c->lock);
    kvt__cq_drain(c);
    pthread_mutex_lock(&c->lock);
  } else {
    rc = dl ? pthread_cond_timedwait(&c->cond, &c->lock, dl) : pthread_cond_wait(&c->cond, &c->lock);
  }
  atomic_fetch_sub(&c->cq_waiters, 1);
  return rc;
}

/* ---- the progress thread ---- */

/* Resumes jobs parked on a full disk queue; keeps those still stuck. */
static void retry_diskwait(kvt_cache *c) {
  uint32_t keep = 0, n = c->n_diskwait;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t j = c->diskwait[i];
    if (!kvt__job_disk_ops(c, &c->jobs[j])) c->diskwait[keep++] = j;
  }
  c->n_diskwait = keep;
}

static void *progress_main(void *arg) {
  kvt_cache *c = arg;
  tl_progress = c;
  pthread_mutex_lock(&c->cq_lock);
  for (;;) {
    while (!atomic_load(&c->cq_n) && !c->n_progq && !c->progress_stop) {
      if (!c->n_diskwait) {
        pthread_cond_wait(&c->cq_cond, &c->cq_lock);
        continue;
      }
      /* Parked jobs resume on the next disk completion; the timeout covers
       * ops that other users of the store (storage mode) free. */
      struct timespec dl;
      clock_gettime(CLOCK_REALTIME, &dl);
      dl.tv_nsec += 1000000;
      if (dl.tv_nsec >= 1000000000) dl.tv_sec++, dl.tv_nsec -= 1000000000;
      if (pthread_cond_timedwait(&c->cq_cond, &c->cq_lock, &dl) != 0) break;
    }
    if (c->progress_stop && !atomic_load(&c->cq_n) && !c->n_progq && !c->n_diskwait) break;
    uint32_t n = 0;
    for (; c->n_progq; c->n_progq--) {
      c->progq_take[n++] = c->progq[c->progq_head];
      c->progq_head = (c->progq_head + 1) % c->n_jobs;
    }
    pthread_mutex_unlock(&c->cq_lock);
    /* Refill the disk queue first (completions freed ops), then apply. */
    if (c->n_diskwait) retry_diskwait(c);
    kvt__cq_drain(c);
    for (uint32_t i = 0; i < n; i++) {
      kvt__job_submit(c, c->progq_take[i]);
      pthread_mutex_lock(&c->lock);
      c->submitting--;
      pthread_cond_broadcast(&c->cond);
      pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_lock(&c->cq_lock);
  }
  pthread_mutex_unlock(&c->cq_lock);
  return NULL;
}

int kvt__progress_start(kvt_cache *c) {
  c->progq = calloc(c->n_jobs, sizeof *c->progq);
  c->progq_take = calloc(c->n_jobs, sizeof *c->progq_take);
  c->diskwait = calloc(c->n_jobs, sizeof *c->diskwait);
  if (!c->progq || !c->progq_take || !c->diskwait) return -ENOMEM;
  int rc = pthread_create(&c->progress_thread, NULL, progress_main, c);
  if (rc) return -rc;
  pthread_setname_np(c->progress_thread, "kvt-progress");
  c->progress_running = 1;
  return 0;
}

void kvt__progress_stop(kvt_cache *c) {
  if (c->progress_running) {
    pthread_mutex_lock(&c->cq_lock);
    c->progress_stop = 1;
    pthread_cond_signal(&c->cq_cond);
    pthread_mutex_unlock(&c->cq_lock);
    pthread_join(c->progress_thread, NULL);
    c->progress_running = 0;
  }
  free(c->progq);
  free(c->progq_take);
  free(c->diskwait);
  c->progq = c->progq_take = c->diskwait = NULL;
}

void kvt__progress_submit(kvt_cache *c, uint32_t j) {
  c->submitting++; /* kvt_drain waits for it */
  pthread_mutex_lock(&c->cq_lock);
  c->progq[(c->progq_head + c->n_progq++) % c->n_jobs] = j;
  pthread_cond_signal(&c->cq_cond);
  pthread_mutex_unlock(&c->cq_lock);
}
