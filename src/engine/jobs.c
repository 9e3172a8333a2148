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

int kvt__jobs_init(kvt_cache *c) {
  uint32_t n = c->cfg.max_jobs + KVT__JOBS_RESERVED, m = c->cfg.max_job_blocks, nh = c->cfg.max_jobs;
  c->jobs = calloc(n, sizeof *c->jobs);
  c->job_free = calloc(n, sizeof *c->job_free);
  c->submitq = calloc(n, sizeof *c->submitq);
  c->handles = calloc(nh, sizeof *c->handles);
  c->handle_free = calloc(nh, sizeof *c->handle_free);
  if (!c->jobs || !c->job_free || !c->submitq || !c->handles || !c->handle_free) return -ENOMEM;
  c->n_jobs = n;
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
 * blocks now on the host; from the first failure on the request
 * recomputes, so the rest of its loads are cancelled. Returns ops kept. */
static uint32_t cut_loads_at_first_failure(kvt_cache *c, kvt__job *jb) {
  uint32_t keep = jb->n_ops;
  for (uint32_t i = 0; i < jb->n_ops; i++)
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

/* ---- submission (c->lock NOT held) ---- */

static void disk_op_done(void *arg, int status);

/* A device transfer of every op of jb (STORE, LOAD, or phase 2 of a load). */
static int submit_dev(kvt_cache *c, kvt__job *jb) {
  int src_tier = jb->kind == KVT__JOB_STORE ? KVT__T_DEV : KVT__T_HOST;
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    const kvt__op *op = &jb->ops[i];
    jb->dev_slots[i] = op->slot[KVT__T_DEV];
    void *rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]);
    if (src_tier == KVT__T_DEV && !c->metadata_only) kvt__fill_record_identity(c, op->entry, op->slot[KVT__T_DEV], op->slot[KVT__T_HOST]);
    jb->host_blocks[i] = c->metadata_only ? NULL : kvt__record_payload(rec, c->bt);
  }
  jb->xfer.dir = jb->kind == KVT__JOB_STORE ? KVT_XFER_D2H : KVT_XFER_H2D;
  jb->xfer.n_blocks = jb->n_ops;
  jb->xfer.dev_slots = jb->dev_slots;
  jb->xfer.host_blocks = jb->host_blocks;
  if (c->metadata_only) return 1; /* nothing moves: complete at once */
  return kvt__dev_submit(&c->dev, &jb->xfer);
}

static void dev_done(kvt_dev_xfer *x, int status);

/* Disk ops go to the store in batches of up to DISK_BATCH (one backend
 * submission each); the batch call waits only while the queue is full. */
#define DISK_BATCH 64u

static void submit_disk_ops(kvt_cache *c, kvt__job *jb) {
  int write = jb->kind == KVT__JOB_SPILL, load = jb->kind == KVT__JOB_LOAD;
  uint32_t n = 0, n_ops = jb->n_ops, sent = 0;
  for (uint32_t i = 0; i < n_ops; i++) n += (!load || jb->ops[i].from_disk);
  pthread_mutex_lock(&c->lock);
  jb->pending = n;
  pthread_mutex_unlock(&c->lock);
  /* The job may finish (and be reused) as the last op completes: stop
   * touching it once every op has been handed over. Ops not yet handed
   * over keep it pending, so reading ops[] for the next batch is safe. */
  kvt__disk_io io[DISK_BATCH];
  for (uint32_t i = 0; sent < n;) {
    uint32_t k = 0;
    for (; i < n_ops && k < DISK_BATCH && sent + k < n; i++) {
      kvt__op *op = &jb->ops[i];
      if (load && !op->from_disk) continue;
      io[k++] = (kvt__disk_io){.slot = op->slot[KVT__T_DISK], .rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]),
                               .expected_key = write ? NULL : &kvt__E(c, op->entry)->key, .arg = op};
    }
    sent += k;
    if (c->metadata_only) {
      for (uint32_t b = 0; b < k; b++) disk_op_done(io[b].arg, 0);
      continue;
    }
    int q = write ? kvt__disk_write_batch(c->disk, io, k, disk_op_done) : kvt__disk_read_batch(c->disk, io, k, disk_op_done);
    for (uint32_t b = 0; b < k; b++) {
      int rc = q < 0 ? q : io[b].status;
      if (rc != 0) disk_op_done(io[b].arg, rc > 0 ? 0 : rc);
    }
  }
}

/* Submits a job's current phase. */
void kvt__job_submit(kvt_cache *c, uint32_t j) {
  kvt__job *jb = &c->jobs[j];
  jb->t_start = kvt__now_ns();
  jb->bytes = (uint64_t)jb->n_ops * c->block_bytes;
  if (jb->kind == KVT__JOB_SPILL || jb->kind == KVT__JOB_FETCH || (jb->kind == KVT__JOB_LOAD && jb->phase == 1)) {
    submit_disk_ops(c, jb);
    return;
  }
  jb->xfer.done = dev_done;
  uint32_t gen = jb->gen;
  int load = jb->kind == KVT__JOB_LOAD;
  int rc = submit_dev(c, jb);
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
}

void kvt__queue_submit(kvt_cache *c, uint32_t j) { c->submitq[c->n_submitq++] = j; }

/* ---- the progress thread: submissions that may wait on a full queue ---- */

static void *progress_main(void *arg) {
  kvt_cache *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->n_progq && !c->progress_stop) pthread_cond_wait(&c->progress_cond, &c->lock);
    if (!c->n_progq) break;
    uint32_t j = c->progq[c->progq_head];
    c->progq_head = (c->progq_head + 1) % c->n_jobs;
    c->n_progq--;
    pthread_mutex_unlock(&c->lock);
    kvt__job_submit(c, j);
    pthread_mutex_lock(&c->lock);
    c->submitting--;
    pthread_cond_broadcast(&c->cond);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

int kvt__progress_start(kvt_cache *c) {
  c->progq = calloc(c->n_jobs, sizeof *c->progq);
  if (!c->progq) return -ENOMEM;
  pthread_cond_init(&c->progress_cond, NULL);
  int rc = pthread_create(&c->progress_thread, NULL, progress_main, c);
  if (rc) {
    pthread_cond_destroy(&c->progress_cond);
    return -rc;
  }
  c->progress_running = 1;
  return 0;
}

void kvt__progress_stop(kvt_cache *c) {
  if (c->progress_running) {
    pthread_mutex_lock(&c->lock);
    c->progress_stop = 1;
    pthread_cond_signal(&c->progress_cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->progress_thread, NULL);
    pthread_cond_destroy(&c->progress_cond);
    c->progress_running = 0;
  }
  free(c->progq);
  c->progq = NULL;
}

void kvt__progress_submit(kvt_cache *c, uint32_t j) {
  c->progq[(c->progq_head + c->n_progq++) % c->n_jobs] = j;
  c->submitting++; /* kvt_drain waits for it */
  pthread_cond_signal(&c->progress_cond);
}

void kvt__flush_submits(kvt_cache *c) {
  for (;;) {
    pthread_mutex_lock(&c->lock);
    uint32_t j = c->n_submitq ? c->submitq[--c->n_submitq] : KVT__NONE;
    pthread_mutex_unlock(&c->lock);
    if (j == KVT__NONE) return;
    kvt__job_submit(c, j);
  }
}

/* ---- completion entry points (backend threads) ---- */

/* A completion that starts the next job: its copy may finish before the
 * submit call returns, so kvt_drain also waits for c->submitting. */
static void submit_from_library_thread(kvt_cache *c, uint32_t j) {
  kvt__job_submit(c, j);
  pthread_mutex_lock(&c->lock);
  c->submitting--;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

static void dev_done(kvt_dev_xfer *x, int status) {
  kvt__job *jb = x->engine_data;
  kvt_cache *c = jb->c;
  pthread_mutex_lock(&c->lock);
  if (status == 0 && (jb->flags & KVT__JF_CANCEL)) status = KVT_ECANCELED;
  for (uint32_t i = 0; i < jb->n_ops; i++) {
    kvt__op *op = &jb->ops[i];
    op->status = status;
    if (jb->kind == KVT__JOB_STORE) store_done(c, jb, op);
    else load_done(c, jb, op);
  }
  if (status && !jb->status) jb->status = status;
  observe(c, jb, 0, jb->bytes);
  uint32_t next = write_through(c, jb);
  int here = 0;
  if (next != KVT__NONE) {
    c->inflight++;
    c->st.jobs_started++; /* like every other job: jobs_failed never exceeds it */
    /* The spill may wait for free disk ops: never on this (the device's
     * completion) thread, so later copies' completions are not held up. */
    if (c->progress_running) kvt__progress_submit(c, next);
    else here = 1, c->submitting++;
  }
  finish_job(c, jb);
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  kvt__events_flush(c);
  if (here) submit_from_library_thread(c, next);
}

static void disk_op_done(void *arg, int status) {
  kvt__op *op = arg;
  kvt__job *jb = op->jb;
  kvt_cache *c = jb->c;
  int load_next = 0;
  pthread_mutex_lock(&c->lock);
  if (status == 0 && (jb->flags & KVT__JF_CANCEL)) status = KVT_ECANCELED;
  op->status = status;
  if (jb->kind == KVT__JOB_SPILL) spill_done(c, jb, op);
  else fetch_done(c, jb, op);
  if (op->status && !jb->status && jb->kind != KVT__JOB_LOAD) jb->status = op->status;
  if (--jb->pending == 0) {
    uint64_t n = jb->kind == KVT__JOB_LOAD ? jb->n_fetch : jb->n_ops;
    observe(c, jb, 1, n * c->block_bytes);
    if (jb->kind == KVT__JOB_LOAD) {
      if (cut_loads_at_first_failure(c, jb) > 0) {
        jb->phase = 2;
        /* The device copy is submitted off the reaper, which reaps on. */
        if (c->progress_running) kvt__progress_submit(c, jb->index);
        else load_next = 1, c->submitting++;
      } else {
        finish_job(c, jb);
      }
    } else {
      finish_job(c, jb);
    }
  }
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  kvt__events_flush(c);
  if (load_next) submit_from_library_thread(c, jb->index);
}
