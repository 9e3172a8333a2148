/* Jobs: asynchronous transfers between tiers, and what their completion
 * does to the tier map. Completions arrive on backend threads (the host
 * copy workers, CUDA's completion thread, the disk reaper) and change the
 * map only inside short critical sections under c->lock. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/engine.h"
#include "store/record.h"
#include "util/clock.h"

static void dev_done(kvt_dev_xfer *x, int status);
static void chunk_done(kvt_dev_xfer *x, int status);

int kvt__jobs_init(kvt_cache *c) {
  uint32_t n = c->cfg.max_jobs + KVT__JOBS_RESERVED, m = c->cfg.max_job_blocks, nh = c->cfg.max_jobs;
  c->jobs = calloc(n, sizeof *c->jobs);
  c->job_free = calloc(n, sizeof *c->job_free);
  c->submitq = calloc(n, sizeof *c->submitq);
  c->handles = calloc(nh, sizeof *c->handles);
  c->handle_free = calloc(nh, sizeof *c->handle_free);
  if (!c->jobs || !c->job_free || !c->submitq || !c->handles || !c->handle_free) return -ENOMEM;
  c->n_jobs = n;
  pthread_mutex_init(&c->cq_lock, NULL);
  pthread_cond_init(&c->cq_cond, NULL);
  c->cq_ready = 1;
  c->xchunks = calloc(KVT__STREAM_XFERS, sizeof *c->xchunks);
  c->xchunk_free = calloc(KVT__STREAM_XFERS, sizeof *c->xchunk_free);
  c->chunkq = calloc(KVT__STREAM_XFERS, sizeof *c->chunkq);
  if (!c->xchunks || !c->xchunk_free || !c->chunkq) return -ENOMEM;
  c->n_xchunks = KVT__STREAM_XFERS;
  for (uint32_t k = 0; k < KVT__STREAM_XFERS; k++) {
    c->xchunks[k].index = k;
    c->xchunks[k].xfer.engine_data = &c->xchunks[k];
    c->xchunks[k].xfer.done = chunk_done;
    c->xchunk_free[c->n_xchunk_free++] = KVT__STREAM_XFERS - 1 - k;
  }
  size_t per = c->block_bytes ? KVT__STREAM_BYTES / c->block_bytes : 1;
  c->stream_blocks = per ? (uint32_t)(per < m ? per : m) : 1;
  for (uint32_t h = 0; h < nh; h++) {
    c->handles[h].gen = c->salt + h * 0x9e3779b9u;
    c->handles[h].job = KVT__NONE;
    c->handle_free[c->n_handle_free++] = nh - 1 - h;
  }
  for (uint32_t j = 0; j < n; j++) {
    kvt__job *jb = &c->jobs[j];
    jb->ops = calloc(m, sizeof *jb->ops);
    jb->dev_slots = calloc(m, sizeof *jb->dev_slots);
    jb->host_blocks = calloc(m, sizeof *jb->host_blocks);
    if (!jb->ops || !jb->dev_slots || !jb->host_blocks) return -ENOMEM;
    jb->xfer.engine_data = jb;
    jb->xfer.done = dev_done;
    jb->c = c;
    jb->index = j;
    jb->gen = c->salt + j * 0x9e3779b9u;
    jb->req = KVT__NONE;
    jb->handle = KVT__NONE;
    c->job_free[c->n_job_free++] = n - 1 - j;
  }
  return 0;
}

void kvt__jobs_fini(kvt_cache *c) {
  for (uint32_t k = 0; c->xchunks && k < c->n_xchunks; k++)
    if (c->xchunks[k].xfer.backend_data) kvt__dev_xfer_release(&c->dev, &c->xchunks[k].xfer);
  free(c->xchunks);
  free(c->xchunk_free);
  free(c->chunkq);
  c->xchunks = NULL;
  if (c->cq_ready) {
    pthread_mutex_destroy(&c->cq_lock);
    pthread_cond_destroy(&c->cq_cond);
    c->cq_ready = 0;
  }
  free(c->handles);
  free(c->handle_free);
  c->handles = NULL;
  if (!c->jobs) return;
  for (uint32_t j = 0; j < c->n_jobs; j++) {
    if (c->jobs[j].xfer.backend_data) kvt__dev_xfer_release(&c->dev, &c->jobs[j].xfer);
    free(c->jobs[j].ops);
    free(c->jobs[j].dev_slots);
    free(c->jobs[j].host_blocks);
  }
  free(c->jobs);
  free(c->job_free);
  free(c->submitq);
  c->jobs = NULL;
}

int kvt__job_available(const kvt_cache *c, int kind, uint32_t flags) {
  if ((flags & KVT__JF_USER) && c->n_handle_free == 0) return 0;
  int internal = !(flags & KVT__JF_USER) && kind != KVT__JOB_LOAD;
  return c->n_job_free > (internal ? 0 : KVT__JOBS_RESERVED);
}

uint32_t kvt__job_new(kvt_cache *c, int kind, uint32_t flags) {
  if (!kvt__job_available(c, kind, flags)) return KVT__NONE;
  uint32_t j = c->job_free[--c->n_job_free];
  kvt__job *jb = &c->jobs[j];
  jb->gen++;
  jb->kind = (uint8_t)kind;
  jb->busy = 1;
  jb->done = 0;
  jb->phase = 0;
  jb->submitted = 0;
  jb->flags = flags;
  jb->status = 0;
  jb->n_ops = jb->n_fetch = jb->pending = 0;
  jb->req = KVT__NONE;
  jb->handle = KVT__NONE;
  jb->bytes = 0;
  jb->disk_started = 0;
  jb->copy_next = jb->scan = jb->chunks_out = jb->final_first = 0;
  jb->final_out = 0;
  if (flags & KVT__JF_USER) {
    uint32_t h = c->handle_free[--c->n_handle_free];
    kvt__handle *hd = &c->handles[h];
    hd->gen++;
    hd->busy = 1;
    hd->done = 0;
    hd->status = 0;
    hd->job = j;
    jb->handle = h;
  }
  return j;
}

void kvt__job_free(kvt_cache *c, uint32_t j) {
  c->jobs[j].busy = 0;
  c->job_free[c->n_job_free++] = j;
}

kvt__op *kvt__job_add_copy(kvt_cache *c, uint32_t j, uint32_t e, int from, int to, uint32_t dst) {
  kvt__job *jb = &c->jobs[j];
  kvt__op *op = &jb->ops[jb->n_ops++];
  const kvt__entry *en = kvt__E(c, e);
  memset(op, 0, sizeof *op);
  op->jb = jb;
  op->entry = e;
  op->ref = KVT__NONE;
  for (int t = 0; t < KVT__NTIERS; t++) op->slot[t] = en->slot[t];
  op->slot[to] = dst;
  kvt__index_pin(&c->map, e, from);
  kvt__index_set_state(&c->map, e, to, KVT__FILLING, dst);
  return op;
}

kvt_job kvt__job_handle(const kvt_cache *c, uint32_t j) {
  uint32_t h = c->jobs[j].handle;
  return ((uint64_t)c->handles[h].gen << 32) | (h + 1);
}

uint32_t kvt__job_from_handle(const kvt_cache *c, kvt_job hv) {
  uint32_t h = (uint32_t)hv - 1;
  if ((uint32_t)hv == 0 || h >= c->cfg.max_jobs) return KVT__NONE;
  const kvt__handle *hd = &c->handles[h];
  return hd->busy && hd->gen == (uint32_t)(hv >> 32) ? h : KVT__NONE;
}

void kvt__handle_release(kvt_cache *c, uint32_t h) {
  kvt__handle *hd = &c->handles[h];
  if (hd->job != KVT__NONE) { /* detached: it completes and frees itself */
    c->jobs[hd->job].flags &= ~KVT__JF_USER;
    c->jobs[hd->job].handle = KVT__NONE;
  }
  hd->busy = 0;
  hd->job = KVT__NONE;
  c->handle_free[c->n_handle_free++] = h;
}

/* ---- completion effects (c->lock held) ---- */

static kvt__ref *op_ref(kvt_cache *c, const kvt__job *jb, const kvt__op *op) {
  if (jb->req == KVT__NONE || op->ref == KVT__NONE) return NULL;
  return kvt__ref_at(c, op->ref);
}

/* The request gives up its claim on the entry; its slot becomes private
 * and the block, counted as a hit at acquire, becomes a miss. */
static void ref_go_private(kvt_cache *c, kvt__job *jb, kvt__op *op) {
  kvt__ref *r = op_ref(c, jb, op);
  if (r && r->entry == op->entry) {
    kvt__index_unpin(&c->map, op->entry, KVT__T_DEV);
    r->entry = KVT__NONE;
    r->failed = op->status != 0; /* else cancelled behind an earlier failure */
    if (op->from_disk) c->st.hits_disk--;
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
    kvt__index_set_state(&c->map, e, KVT__T_DEV, KVT__VALID, op->slot[KVT__T_DEV]);
    if (!c->metadata_only) { /* the device copy keeps its tokens for later stores */
      void *rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]);
      uint32_t ds = op->slot[KVT__T_DEV];
      c->dev_has_tokens[ds] = (((kvt__record_hdr *)rec)->flags & KVT_RECORD_F_TOKENS) != 0;
      if (c->dev_has_tokens[ds])
        memcpy(c->dev_tokens + (size_t)ds * c->bt, kvt__record_tokens(rec), (size_t)c->bt * sizeof(uint32_t));
    }
    c->st.blocks_h2d++;
    KVT__M_ADD(c, hit_blocks[op->from_disk ? KVT__T_DISK : KVT__T_HOST], 1);
    c->st.bytes_h2d += c->block_bytes;
  } else {
    kvt__index_set_state(&c->map, e, KVT__T_DEV, KVT__ABSENT, 0);
    ref_go_private(c, jb, op);
    c->st.copy_errors++;
    kvt__event_note(c, KVT__EV_COPY, op->status, UINT64_MAX);
  }
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
  if (op->status == 0) op->status = fetch_verify(c, op);
  kvt__index_unpin(&c->map, e, KVT__T_DISK);
  if (op->status == 0) {
    kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__VALID, op->slot[KVT__T_HOST]);
    c->st.blocks_disk2h++;
    c->st.bytes_disk2h += c->block_bytes;
    return;
  }
  kvt__index_set_state(&c->map, e, KVT__T_HOST, KVT__ABSENT, 0);
  kvt__slots_put(&c->slots[KVT__T_HOST], op->slot[KVT__T_HOST]);
  if (jb->flags & KVT__JF_LOAD_AFTER) kvt__index_unpin(&c->map, e, KVT__T_HOST);
  fetch_failed(c, e, op->status);
  if (!(jb->flags & KVT__JF_LOAD_AFTER)) kvt__maybe_remove(c, e);
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
  for (uint32_t i = keep; i < jb->n_ops; i++) {
    kvt__op *op = &jb->ops[i];
    if (op->status == 0) kvt__index_unpin(&c->map, op->entry, KVT__T_HOST);
    kvt__index_set_state(&c->map, op->entry, KVT__T_DEV, KVT__ABSENT, 0);
    ref_go_private(c, jb, op);
    kvt__maybe_remove(c, op->entry);
  }
  if (keep < jb->n_ops && !jb->status) jb->status = jb->ops[keep].status;
  jb->n_ops = keep;
  return keep;
}

static void observe(kvt_cache *c, kvt__job *jb, int path, uint64_t bytes) {
  int64_t ns = kvt__now_ns() - jb->t_start;
  double s = (double)ns * 1e-9;
  KVT__M_TRANSFER(c, jb, path, ns);
  if (c->have_cost && bytes) kvt__calib_observe_transfer(&c->calib, path, bytes, 1, s);
}

/* Write-through: blocks that just reached the host go on to disk. */
static uint32_t write_through(kvt_cache *c, kvt__job *jb) {
  if (c->cfg.write_policy != KVT_WRITE_THROUGH || !kvt__has_tier(c, KVT__T_DISK) || jb->kind != KVT__JOB_STORE)
    return KVT__NONE;
  uint32_t j = KVT__NONE;
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    uint32_t e = jb->ops[i].entry;
    kvt__entry *en = kvt__E(c, e);
    if (jb->ops[i].status || en->state[KVT__T_HOST] != KVT__VALID || en->state[KVT__T_DISK] != KVT__ABSENT) continue;
    if (kvt__make_room(c, KVT__T_DISK, 1, 0) != 0) break;
    if (j == KVT__NONE && (j = kvt__job_new(c, KVT__JOB_SPILL, 0)) == KVT__NONE) break;
    kvt__job_add_copy(c, j, e, KVT__T_HOST, KVT__T_DISK, kvt__slots_take(&c->slots[KVT__T_DISK]));
  }
  return j;
}

static void finish_job(kvt_cache *c, kvt__job *jb) {
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
  if (jb->req == KVT__NONE) kvt__job_free(c, jb->index);
}

/* ---- applying completions (c->lock held; a progress step) ---- */

static void queue_chunk(kvt_cache *c, kvt__job *jb);

/* Loads: moves the landed frontier over leading blocks whose reads are over
 * and good, and streams their device copy once a chunk's worth is there. */
static void stream_more(kvt_cache *c, kvt__job *jb) {
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
    if (!failed || op->status != 0) {
      load_done(c, jb, op);
    } else { /* landed behind a failure: given up, like the loads cut after a failed read */
      kvt__index_unpin(&c->map, op->entry, KVT__T_HOST);
      kvt__index_set_state(&c->map, op->entry, KVT__T_DEV, KVT__ABSENT, 0);
      ref_go_private(c, jb, op);
      kvt__maybe_remove(c, op->entry);
    }
    if (op->status != 0 && !failed) {
      failed = 1;
      if (!jb->status) jb->status = op->status;
    }
  }
  observe(c, jb, 0, jb->bytes);
  finish_job(c, jb);
}

/* The fetch phase of a load is over: cut at the first failed read, then
 * copy what no chunk has taken yet with the job's own xfer. */
static void reads_over(kvt_cache *c, kvt__job *jb) {
  uint32_t keep = cut_loads_at_first_failure(c, jb);
  jb->phase = 2;
  jb->final_first = jb->copy_next; /* streamed chunks cover leading good reads only: <= keep */
  if (keep > jb->copy_next) {
    jb->final_out = 1;
    kvt__queue_submit(c, jb->index);
  } else {
    jb->submitted = 1; /* nothing left to submit: layer waits look at the chunks */
    if (jb->chunks_out == 0) load_finish(c, jb);
  }
}

static void apply_disk_op(kvt_cache *c, kvt__op *op) {
  kvt__job *jb = op->jb;
  if (op->status == 0 && (jb->flags & KVT__JF_CANCEL)) op->status = KVT_ECANCELED;
  if (jb->kind == KVT__JOB_SPILL) spill_done(c, jb, op);
  else fetch_done(c, jb, op);
  op->landed = 1;
  if (op->status && !jb->status && jb->kind != KVT__JOB_LOAD) jb->status = op->status;
  if (--jb->pending == 0) {
    uint64_t n = jb->kind == KVT__JOB_LOAD ? jb->n_fetch : jb->n_ops;
    observe(c, jb, 1, n * c->block_bytes);
    if (jb->kind == KVT__JOB_LOAD) reads_over(c, jb);
    else finish_job(c, jb);
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

/* ---- posting (backend threads: the cq lock only, no engine work) ---- */

static _Thread_local int tl_draining;
static _Thread_local const kvt_cache *tl_progress;

static void cq_posted(kvt_cache *c) {
  atomic_fetch_add(&c->cq_n, 1);
  pthread_cond_signal(&c->cq_cond);
  pthread_mutex_unlock(&c->cq_lock);
  /* API threads waiting on c->cond apply completions themselves: wake them.
   * The lock orders the wakeup after their check; nothing runs under it. */
  if (atomic_load(&c->cq_waiters)) {
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
  }
}

static void disk_op_done(void *arg, int status) {
  kvt__op *op = arg;
  kvt_cache *c = op->jb->c;
  op->status = status;
  pthread_mutex_lock(&c->cq_lock);
  op->cq_next = c->cq_ops;
  c->cq_ops = op;
  cq_posted(c);
}

static void dev_done(kvt_dev_xfer *x, int status) {
  kvt__job *jb = x->engine_data;
  kvt_cache *c = jb->c;
  jb->xfer_status = status;
  pthread_mutex_lock(&c->cq_lock);
  jb->cq_next = c->cq_jobs;
  c->cq_jobs = jb;
  cq_posted(c);
}

static void chunk_done(kvt_dev_xfer *x, int status) {
  kvt__xchunk *ch = x->engine_data;
  kvt_cache *c = ch->jb->c;
  ch->status = status;
  pthread_mutex_lock(&c->cq_lock);
  ch->cq_next = c->cq_chunks;
  c->cq_chunks = ch;
  cq_posted(c);
}

/* ---- submission (c->lock NOT held) ---- */

/* A device transfer of ops [first, first + n) of jb into x. */
static int submit_dev(kvt_cache *c, kvt__job *jb, kvt_dev_xfer *x, uint32_t first, uint32_t n) {
  int src_tier = jb->kind == KVT__JOB_STORE ? KVT__T_DEV : KVT__T_HOST;
  for (uint32_t i = first; i < first + n; i++) {
    const kvt__op *op = &jb->ops[i];
    jb->dev_slots[i] = op->slot[KVT__T_DEV];
    void *rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]);
    if (src_tier == KVT__T_DEV && !c->metadata_only) kvt__fill_record_identity(c, op->entry, op->slot[KVT__T_DEV], op->slot[KVT__T_HOST]);
    jb->host_blocks[i] = c->metadata_only ? NULL : kvt__record_payload(rec, c->bt);
  }
  x->dir = jb->kind == KVT__JOB_STORE ? KVT_XFER_D2H : KVT_XFER_H2D;
  x->n_blocks = n;
  x->dev_slots = jb->dev_slots + first;
  x->host_blocks = jb->host_blocks + first;
  if (c->metadata_only) return 1; /* nothing moves: complete at once */
  return kvt__dev_submit(&c->dev, x);
}

static void submit_chunk(kvt_cache *c, kvt__xchunk *ch) {
  int rc = submit_dev(c, ch->jb, &ch->xfer, ch->first, ch->n);
  if (rc != 0) chunk_done(&ch->xfer, rc > 0 ? 0 : rc);
}

/* Disk ops go to the store in batches of up to DISK_BATCH (one backend
 * submission each), never waiting for a free op: returns 1 once every op
 * of the phase is handed over, 0 when the queue is full (the job resumes
 * from disk_next once completions free ops). */
#define DISK_BATCH 64u

static int submit_disk_ops(kvt_cache *c, kvt__job *jb) {
  int write = jb->kind == KVT__JOB_SPILL, load = jb->kind == KVT__JOB_LOAD;
  uint32_t n_ops = jb->n_ops, i = jb->disk_next, sent = jb->disk_sent, total = jb->disk_total;
  /* The job may finish (and be reused) as its last op completes: stop
   * touching it once every op has been handed over. Ops not yet handed
   * over keep it pending, so reading ops[] for the next batch is safe. */
  kvt__disk_io io[DISK_BATCH];
  uint32_t idx[DISK_BATCH];
  while (sent < total) {
    uint32_t k = 0;
    for (; i < n_ops && k < DISK_BATCH && sent + k < total; i++) {
      kvt__op *op = &jb->ops[i];
      if (load && !op->from_disk) continue;
      idx[k] = i;
      io[k++] = (kvt__disk_io){.slot = op->slot[KVT__T_DISK], .rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]),
                               .expected_key = write ? NULL : &kvt__E(c, op->entry)->key, .arg = op};
    }
    if (c->metadata_only) {
      sent += k;
      for (uint32_t b = 0; b < k; b++) disk_op_done(io[b].arg, 0);
      continue;
    }
    int q = write ? kvt__disk_try_write_batch(c->disk, io, k, disk_op_done)
                  : kvt__disk_try_read_batch(c->disk, io, k, disk_op_done);
    uint32_t b = 0;
    for (; b < k; b++) {
      int rc = q < 0 ? q : io[b].status;
      if (rc == KVT_EAGAIN) break;
      if (rc != 0) disk_op_done(io[b].arg, rc > 0 ? 0 : rc);
    }
    if (b < k) { /* queue full: idx[b] on are not handed over, so the job is still ours */
      jb->disk_next = idx[b];
      jb->disk_sent = sent + b;
      return 0;
    }
    sent += k;
  }
  return 1;
}

static int disk_phase(const kvt__job *jb) {
  return jb->kind == KVT__JOB_SPILL || jb->kind == KVT__JOB_FETCH || (jb->kind == KVT__JOB_LOAD && jb->phase == 1);
}

/* Starts a job's disk phase (lock NOT held): what it hands the store. */
static void disk_start(kvt_cache *c, kvt__job *jb) {
  pthread_mutex_lock(&c->lock);
  if (!jb->disk_started) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < jb->n_ops; i++) {
      kvt__op *op = &jb->ops[i];
      int disk = jb->kind != KVT__JOB_LOAD || op->from_disk;
      n += disk;
      op->landed = !disk; /* a load's host hits are on the host already */
    }
    jb->disk_started = 1;
    jb->disk_next = jb->disk_sent = 0;
    jb->disk_total = jb->pending = n;
    jb->t_start = kvt__now_ns();
    jb->bytes = (uint64_t)jb->n_ops * c->block_bytes;
  }
  pthread_mutex_unlock(&c->lock);
}

/* Submits a job's current phase. Disk ops reach the store only from the
 * progress thread (or at once in a metadata-only cache, where nothing
 * moves): no engine thread ever waits on the store. */
void kvt__job_submit(kvt_cache *c, uint32_t j) {
  kvt__job *jb = &c->jobs[j];
  if (disk_phase(jb)) {
    disk_start(c, jb);
    if (tl_progress == c || c->metadata_only) {
      if (!submit_disk_ops(c, jb)) c->diskwait[c->n_diskwait++] = j; /* only the progress thread gets here */
    } else {
      pthread_mutex_lock(&c->lock);
      kvt__progress_submit(c, j);
      pthread_mutex_unlock(&c->lock);
    }
    kvt__cq_drain(c); /* completions posted at once (metadata only, refusals) */
    return;
  }
  int load = jb->kind == KVT__JOB_LOAD;
  uint32_t first = load ? jb->final_first : 0, gen = jb->gen;
  jb->t_start = kvt__now_ns();
  jb->bytes = (uint64_t)(jb->n_ops - first) * c->block_bytes;
  int rc = submit_dev(c, jb, &jb->xfer, first, jb->n_ops - first);
  if (rc != 0) {
    dev_done(&jb->xfer, rc > 0 ? 0 : rc);
  } else if (load) {
    /* Layer waits go to the backend only once it holds the copy: a refused
     * submission must not leave a waiter blocked on layers never copied. */
    pthread_mutex_lock(&c->lock);
    if (jb->gen == gen && jb->busy) jb->submitted = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
  }
  kvt__cq_drain(c);
}

void kvt__queue_submit(kvt_cache *c, uint32_t j) { c->submitq[c->n_submitq++] = j; }

void kvt__flush_submits(kvt_cache *c) {
  for (;;) {
    pthread_mutex_lock(&c->lock);
    uint32_t ch = c->n_chunkq ? c->chunkq[--c->n_chunkq] : KVT__NONE;
    uint32_t j = ch == KVT__NONE && c->n_submitq ? c->submitq[--c->n_submitq] : KVT__NONE;
    pthread_mutex_unlock(&c->lock);
    if (ch != KVT__NONE) submit_chunk(c, &c->xchunks[ch]);
    else if (j != KVT__NONE) kvt__job_submit(c, j);
    else return;
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
  if (tl_draining) return; /* the outer step goes round again */
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
  c->n_diskwait = 0; /* submit_disk_ops may park again: appended after */
  for (uint32_t i = 0; i < n; i++) {
    uint32_t j = c->diskwait[i];
    if (!submit_disk_ops(c, &c->jobs[j])) c->diskwait[keep++] = j;
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
    kvt__cq_drain(c);
    if (c->n_diskwait) retry_diskwait(c);
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
