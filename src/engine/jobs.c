/* Jobs: the pool and the engine's handles, and the edge that faces the
 * backends: submitting a job's device copies and disk I/O, and posting
 * their completions to the completion queue as data (the backends' done()
 * callbacks, which do nothing else). What a completion does to the tier
 * map is progress.c's; this file calls no engine layer above it.
 *
 * Layers, top down: the API (read.c, write.c, storage*.c) -> progress.c
 * (completions, follow-on work, waiting) -> evict.c (room, demotions) ->
 * jobs.c -> the backends (dev/, store/). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "remote/remote.h"
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
  /* A job's op arrays (max_job_blocks entries each) are allocated the first
   * time its slot is taken (kvt__job_new): slots are reused last-freed
   * first, so the memory follows the most jobs ever in use at once, not
   * max_jobs. */
  for (uint32_t j = 0; j < n; j++) {
    kvt__job *jb = &c->jobs[j];
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

/* The op arrays of job slot j, on its first use. Lock held. */
static int job_arrays(kvt_cache *c, kvt__job *jb) {
  if (jb->ops) return 0;
  size_t m = c->cfg.max_job_blocks;
  kvt__op *ops = calloc(m, sizeof *ops);
  uint32_t *dev_slots = calloc(m, sizeof *dev_slots);
  void **host_blocks = calloc(m, sizeof *host_blocks);
  if (!ops || !dev_slots || !host_blocks) {
    free(ops);
    free(dev_slots);
    free(host_blocks);
    return -ENOMEM;
  }
  jb->ops = ops;
  jb->dev_slots = dev_slots;
  jb->host_blocks = host_blocks;
  c->n_jobs_allocated++;
  return 0;
}

uint32_t kvt__job_new(kvt_cache *c, int kind, uint32_t flags) {
  if (!kvt__job_available(c, kind, flags)) return KVT__NONE;
  uint32_t j = c->job_free[c->n_job_free - 1];
  kvt__job *jb = &c->jobs[j];
  if (job_arrays(c, jb) != 0) return KVT__NONE; /* out of memory: as if every job were busy */
  c->n_job_free--;
  jb->gen++;
  jb->kind = (uint8_t)kind;
  jb->busy = 1;
  jb->done = 0;
  jb->phase = 0;
  jb->submitted = 0;
  jb->flags = flags;
  jb->status = 0;
  jb->n_ops = jb->n_fetch = jb->pending = jb->following = 0;
  jb->req = KVT__NONE;
  jb->handle = KVT__NONE;
  jb->bytes = 0;
  jb->disk_started = 0;
  jb->remote_total = 0;
  jb->remote_handed = 0;
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

/* ---- posting (backend threads: the cq lock only, no engine work) ---- */

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

void kvt__chunk_submit(kvt_cache *c, kvt__xchunk *ch) {
  int rc = submit_dev(c, ch->jb, &ch->xfer, ch->first, ch->n);
  if (rc != 0) chunk_done(&ch->xfer, rc > 0 ? 0 : rc);
}

/* Disk ops go to the store in batches of up to DISK_BATCH (one backend
 * submission each), never waiting for a free op: returns 1 once every op
 * of the phase is handed over, 0 when the queue is full (the job resumes
 * from disk_next once completions free ops). */
#define DISK_BATCH 64u

/* Hands every remote op of jb to the client, in batches of DISK_BATCH
 * (gets for loads and fetches, puts for RPUT). The client queues without
 * waiting; a refusal is posted like a completion. The job is not touched
 * once its last op is handed over when nothing else keeps it pending. */
static void remote_ops(kvt_cache *c, kvt__job *jb, uint32_t n_remote, int more_after) {
  kvt__remote *r = kvt__rtier(c);
  int put = jb->kind == KVT__JOB_RPUT;
  kvt__remote_io io[DISK_BATCH];
  uint32_t handed = 0, i = 0, n_ops = jb->n_ops;
  while (handed < n_remote) {
    uint32_t k = 0;
    for (; i < n_ops && k < DISK_BATCH && handed + k < n_remote; i++) {
      kvt__op *op = &jb->ops[i];
      if (!op->remote) continue;
      io[k++] = (kvt__remote_io){.key = kvt__E(c, op->entry)->key, .rec = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]),
                                 .arg = op};
    }
    handed += k;
    /* From the last batch on (when no disk op keeps it pending) jb may be
     * reused at once: only io[] and locals are read after it. */
    (void)more_after;
    int q = !r ? KVT_EREMOTE
               : put ? kvt__remote_put(r, io, k, disk_op_done) : kvt__remote_get(r, io, k, disk_op_done);
    for (uint32_t b = 0; b < k; b++) {
      int rc = q < 0 ? q : io[b].status;
      if (rc != 0) disk_op_done(io[b].arg, rc > 0 ? 0 : rc);
    }
  }
}

int kvt__job_disk_ops(kvt_cache *c, kvt__job *jb) {
  int write = jb->kind == KVT__JOB_SPILL, load = jb->kind == KVT__JOB_LOAD;
  if (jb->remote_total && !jb->remote_handed) {
    uint32_t n_remote = jb->remote_total, disk_left = jb->disk_total - jb->disk_sent - n_remote;
    jb->remote_handed = 1;
    jb->disk_sent += n_remote;
    remote_ops(c, jb, n_remote, disk_left > 0);
    if (disk_left == 0) return 1;
  }
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
      if ((load && !op->from_disk) || op->remote) continue;
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

int kvt__job_disk_phase(const kvt__job *jb) {
  return jb->kind == KVT__JOB_SPILL || jb->kind == KVT__JOB_FETCH || jb->kind == KVT__JOB_RPUT ||
         (jb->kind == KVT__JOB_LOAD && jb->phase == 1);
}

/* Starts a job's disk phase (lock NOT held): what it hands the store. */
void kvt__job_disk_start(kvt_cache *c, kvt__job *jb) {
  pthread_mutex_lock(&c->lock);
  if (!jb->disk_started) {
    uint32_t n = 0, n_remote = 0;
    for (uint32_t i = 0; i < jb->n_ops; i++) {
      kvt__op *op = &jb->ops[i];
      if (op->follow) continue; /* lands with the fetch it follows (progress.c) */
      int disk = jb->kind != KVT__JOB_LOAD || op->from_disk;
      n += disk;
      n_remote += disk && op->remote;
      op->landed = !disk; /* a load's host hits are on the host already */
    }
    jb->disk_started = 1;
    jb->disk_next = jb->disk_sent = 0;
    jb->disk_total = jb->pending = n;
    jb->remote_total = n_remote;
    jb->remote_handed = 0;
    jb->t_start = kvt__now_ns();
    jb->bytes = (uint64_t)jb->n_ops * c->block_bytes;
  }
  pthread_mutex_unlock(&c->lock);
}

/* Submits a job's device copy (STORE, LOAD, or a load's last stage: ops
 * [final_first, n_ops)); a refusal is posted like a completion. */
void kvt__job_copy(kvt_cache *c, kvt__job *jb) {
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
}

void kvt__fill_record_identity(kvt_cache *c, uint32_t e, uint32_t dev_slot, uint32_t host_slot) {
  void *rec = kvt__host_slot(&c->host, host_slot);
  kvt__record_hdr *h = rec;
  const kvt__entry *en = kvt__E(c, e);
  memset(h, 0, sizeof *h);
  h->magic = KVT_RECORD_MAGIC;
  h->version = KVT_RECORD_VERSION;
  h->ns = c->ns;
  h->key = en->key;
  h->parent = en->parent;
  h->payload_len = c->block_bytes;
  if (c->dev_has_tokens[dev_slot]) {
    h->flags |= KVT_RECORD_F_TOKENS;
    h->token_count = c->bt;
    memcpy(kvt__record_tokens(rec), c->dev_tokens + (size_t)dev_slot * c->bt, (size_t)c->bt * sizeof(uint32_t));
  }
}

void kvt__queue_submit(kvt_cache *c, uint32_t j) { c->submitq[c->n_submitq++] = j; }
