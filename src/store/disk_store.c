/* The disk store's runtime: open/close, the op pool, the reaper thread, the
 * checksum threads, the sync thread (durable mode) and the
 * write/read/invalidate paths. Open-time work
 * lives in disk_recover.c. Hot paths take an op from a free list set up at
 * open; nothing allocates.
 *
 * Where a record's bytes are hashed: writes of KVT_DISK_HANDOFF_BYTES and
 * more are sealed on the checksum threads, so a caller never hashes a
 * large payload in series with its submissions; smaller ones are sealed in
 * the call, where a thread handoff would cost more than the hash. Reads are
 * verified on the reaper: a large record that landed is hashed there right
 * after the disk was refilled, and finished (op back, done()) before the
 * next is hashed, so its caller sends the next read while the reaper
 * verifies the rest of the batch. The data just landed, and is hashed
 * before it leaves the cache (16-23 GB/s on the reaper here, against 10.5-13
 * from memory), with no wake-up of another thread in series with the read.
 * (kvtier-bench's disk section on a two-CPU virtual machine, five runs
 * each, alternating: fetches of 0.875 MiB records at 0.94-0.99 of raw
 * io_uring this way, 0.85-0.99 with the reads verified on two checksum
 * threads; of 2 MiB records 0.90-0.95 against 0.73-0.96; 0.051-0.070 CPU
 * seconds per GB against 0.063-0.092. In a standalone reader built the
 * same way, a reaper that handed landed reads to two checksum threads read
 * at 0.70-0.76 of one that hashed each read itself and handed it back at
 * once, and one that hashed a whole batch before handing any back at
 * 0.64-0.73.) One core's XXH3 of just-landed data is well above what one
 * disk delivers. A read whose caller waits for it
 * on a thread of its own (verify_later: storage mode's workers) is finished
 * unchecked, and that thread checks it (kvt__disk_verify) before it trusts
 * a byte. An op is in exactly one place at a time (caller, disk queue,
 * backend, reaper, checksum queue, sync queue), and there are queue_depth
 * of them (and one per checksum thread more for large records, see
 * KVT_DISK_HASH_HEADROOM_PER_THREAD).
 *
 * At most queue_depth I/Os are at the disk; the ops over that hold writes
 * being sealed, reads that landed and wait for the reaper's checksum, and
 * I/Os waiting in the disk queue for room. When a whole queue completes at
 * once (a virtual disk does), the reaper sends the waiting I/Os before it
 * verifies landed reads, so the disk refills at once, not as each checksum
 * frees an op and its caller gets a CPU. (2 MiB reads into engine memory
 * on two CPUs: unbounded, all 64 ops went to the disk, came back together
 * every 44 ms, and the disk stood idle for the 6 ms the checksums took to
 * free them.) */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "store/disk_internal.h"
#include "util/fault.h"

/* The default queue depth: I/Os enough for AUTO_INFLIGHT_BYTES of small
 * records at the disk, and for about AUTO_INFLIGHT_LARGE_BYTES of records
 * of KVT_DISK_HANDOFF_BYTES and more (the nearest whole count), between
 * AUTO_MIN_DEPTH and AUTO_MAX_DEPTH. A device reaches its bandwidth only
 * with megabytes in flight, and 32 I/Os of small records are 2 MiB: 64 KiB
 * records spilled at 0.69-0.74 of what raw io_uring wrote at depth 64 on
 * the same disk, and at 0.96-1.06 with 256 I/Os. A large record is a long
 * transfer of its own, so fewer of them keep a disk busy (how few a real
 * NVMe drive needs is not measured here: this machine has none), and each
 * I/O in flight pins a buffer of its caller's, so a deeper queue only
 * spreads the reads over more memory, which costs on a virtual disk that
 * copies into guest memory (raw O_DIRECT
 * reads of 2 MiB, 8 in flight, on this class of machine: 2.8-3.3 GB/s
 * cycling 8 or 16 buffers, 2.2-2.5 cycling 32 or 64). kvtier-bench's disk
 * section on a two-CPU virtual machine, fetches by a caller that reuses
 * its buffers as the store hands them back (a staging ring) against raw
 * depth 8 in the same rounds, median of 7 rounds a run, runs alternating
 * (leaving out those in which every setting fell to 0.6-0.8 of raw, the
 * disk's slow spells): 2 MiB records at depth 6 with 8 ops 1.04-1.11 (6
 * runs), at depth 8 with 10 ops 0.99-1.03 (9), with 12 ops 0.92-0.98 and
 * one 0.66 (12); 0.875 MiB records at depth 12 with 14 ops 0.95-0.98 (6),
 * 14 with 16 ops 0.95-0.96 (2), 18 with 22 ops 0.86-0.97 (22); spills
 * 0.95-1.02 at each. Reads into fresh memory (a restore into host slots,
 * storage mode's reads into the engine's region) span it either way, and
 * there depth counts: storage mode's get-into of 2 MiB blocks ran at
 * 0.79-0.81 of raw at depth 6 against 0.83-0.85 at 8 (three pairs of
 * alternating runs), so records of 2 MiB keep 8 (AUTO_MIN_DEPTH) and only
 * the headroom drops for them; the 10,000-token restore_disk row moved
 * within the noise (0.95-1.01 at depth 4 and 6 against 0.96-0.99 at 8).
 * An array of several drives wants more in flight: disk_queue_depth sets
 * it. */
#define AUTO_INFLIGHT_BYTES (16u << 20)
#define AUTO_INFLIGHT_LARGE_BYTES (12u << 20)
#define AUTO_MIN_DEPTH 8u
#define AUTO_DURABLE_MIN_DEPTH 32u /* see kvt__disk_auto_depth */
#define AUTO_MAX_DEPTH 256u
#define BATCH 64u                 /* requests prepared and submitted together */
#define REAP_TIMEOUT_NS 200000000 /* wake to re-check stop and deferred SQ flushes */
#define LOCK_TRIES 100            /* x 10 ms: a crashed owner's ring may still drain */

/* ---- op pool ---- */

/* The store whose reaper, checksum or sync thread is running on this thread, if any. */
static _Thread_local const kvt__disk *tl_completing;

/* Takes a free op; with `wait`, waits while all are in flight. The threads
 * that free ops must not wait on themselves, so from done() a full pool
 * returns NULL. */
static disk_op *op_get(kvt__disk *d, int wait) {
  int delay = kvt__fault_check(KVT_FAULT_STORE_OP_DELAY_US, wait);
  if (delay > 0) usleep((useconds_t)delay);
  disk_op *op = NULL;
  pthread_mutex_lock(&d->lock);
  int on_completion = tl_completing == d;
  while (wait && !d->n_free && !on_completion && !d->stop) pthread_cond_wait(&d->cond, &d->lock);
  if (d->n_free && !d->stop) {
    op = &d->ops[d->free_ops[--d->n_free]];
    if (d->inflight++ == 0) pthread_cond_broadcast(&d->cond); /* the reaper waits for this */
  }
  pthread_mutex_unlock(&d->lock);
  return op;
}

/* Returns finished ops in one critical section (the reaper's batch); the
 * fixed buffers they named are theirs no more. */
static void op_put_many(kvt__disk *d, disk_op *const *ops, uint32_t n) {
  if (!n) return;
  pthread_mutex_lock(&d->lock);
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t k = 0; k < ops[i]->n_fx; k++) d->fx[ops[i]->fx_ent[k]].users--;
    ops[i]->n_fx = 0;
    d->free_ops[d->n_free++] = (uint32_t)(ops[i] - d->ops);
  }
  d->inflight -= n;
  pthread_cond_broadcast(&d->cond);
  pthread_mutex_unlock(&d->lock);
}

static void op_put(kvt__disk *d, disk_op *op) { op_put_many(d, &op, 1); }

static int slot_claim(kvt__disk *d, uint64_t slot) {
  unsigned char idle = 0;
  return atomic_compare_exchange_strong(&d->busy[slot], &idle, 1);
}

static void slot_release(kvt__disk *d, uint64_t slot) { atomic_store(&d->busy[slot], 0); }

/* ---- the checksum threads' queue ---- */

/* Hands ops to the checksum threads in one critical section. The ring
 * holds depth entries and no more ops exist, so it cannot overflow. */
static void hq_push(kvt__disk *d, disk_op *const *ops, uint32_t n) {
  if (!n) return;
  pthread_mutex_lock(&d->hq_lock);
  for (uint32_t i = 0; i < n; i++) d->hq[(d->hq_head + d->hq_count + i) % d->depth] = ops[i];
  d->hq_count += n;
  if (n == 1) pthread_cond_signal(&d->hq_cond);
  else pthread_cond_broadcast(&d->hq_cond);
  pthread_mutex_unlock(&d->hq_lock);
}

/* Next op to hash, or NULL once the store stops and the ring is empty. */
static disk_op *hq_pop(kvt__disk *d) {
  pthread_mutex_lock(&d->hq_lock);
  while (!d->hq_count && !d->hq_stop) pthread_cond_wait(&d->hq_cond, &d->hq_lock);
  disk_op *op = NULL;
  if (d->hq_count) {
    op = d->hq[d->hq_head];
    d->hq_head = (d->hq_head + 1) % d->depth;
    d->hq_count--;
  }
  pthread_mutex_unlock(&d->hq_lock);
  return op;
}

/* ---- submission ---- */

static int buf_index_of(const kvt__disk *d, const void *p, size_t len) {
  for (uint32_t i = 0; i < d->n_bufs; i++) {
    uintptr_t b = d->bufs[i].base, q = (uintptr_t)p;
    if (q >= b && q - b <= d->bufs[i].len && d->bufs[i].len - (q - b) >= len) return (int)i;
  }
  return -1;
}

/* A record in pieces goes fixed when every piece lies in a registered
 * buffer: the op then holds a use of each until it is put back. */
static void fx_take(kvt__disk *d, disk_op *op) {
  op->n_fx = 0;
  if (!d->fixed_vec || !op->iov || op->n_iov > KVT_IO_MAX_FIXED_VEC) return;
  pthread_mutex_lock(&d->lock);
  uint32_t k = 0;
  for (; d->n_fx_used && k < op->n_iov; k++) {
    uintptr_t p = (uintptr_t)op->iov[k].iov_base;
    size_t len = op->iov[k].iov_len;
    uint32_t e = 0;
    for (; e < KVT_DISK_MAX_FIXED; e++) {
      const disk_fixed *f = &d->fx[e];
      if (f->used && !f->dying && p >= f->base && p - f->base <= f->len && f->len - (p - f->base) >= len) break;
    }
    if (e == KVT_DISK_MAX_FIXED) break;
    op->fx_ent[k] = (uint8_t)e;
    op->fx_buf[k] = d->fx[e].index;
  }
  if (d->n_fx_used && k == op->n_iov) {
    for (k = 0; k < op->n_iov; k++) d->fx[op->fx_ent[k]].users++;
    op->n_fx = op->n_iov;
  }
  pthread_mutex_unlock(&d->lock);
}

int kvt__disk_buf_register(kvt__disk *d, void *base, size_t len) {
  if (!d || !base || !len || ((uintptr_t)base & (KVT_RECORD_ALIGN - 1))) return -EINVAL;
  if (!d->fixed_vec) return KVT_EUNSUPPORTED;
  uint32_t index;
  int rc = kvt__io_buf_register(&d->io, base, len, &index);
  if (rc) return rc;
  pthread_mutex_lock(&d->lock);
  int h = -ENOSPC;
  for (uint32_t e = 0; e < KVT_DISK_MAX_FIXED && h < 0; e++)
    if (!d->fx[e].used) {
      d->fx[e] = (disk_fixed){.base = (uintptr_t)base, .len = len, .index = index, .used = 1};
      d->n_fx_used++;
      h = (int)e;
    }
  pthread_mutex_unlock(&d->lock);
  if (h < 0) kvt__io_buf_unregister(&d->io, index);
  return h;
}

void kvt__disk_buf_unregister(kvt__disk *d, int handle) {
  if (!d || handle < 0 || (uint32_t)handle >= KVT_DISK_MAX_FIXED) return;
  disk_fixed *f = &d->fx[handle];
  pthread_mutex_lock(&d->lock);
  if (!f->used || f->dying) {
    pthread_mutex_unlock(&d->lock);
    return;
  }
  f->dying = 1;
  while (f->users) pthread_cond_wait(&d->cond, &d->lock);
  uint32_t index = f->index;
  pthread_mutex_unlock(&d->lock);
  kvt__io_buf_unregister(&d->io, index);
  pthread_mutex_lock(&d->lock);
  *f = (disk_fixed){0};
  d->n_fx_used--;
  pthread_mutex_unlock(&d->lock);
}

static kvt_io_req op_req(const kvt__disk *d, disk_op *op) {
  uint64_t off = d->data_off + op->slot * d->slot_bytes;
  if (op->kind == OP_TOMB)
    return (kvt_io_req){KVT_IO_WRITE, -1, off, d->zero_page, KVT_DISK_SUPER_BYTES, op};
  if (op->n_fx) {
    op->fv = (kvt_io_fixed_vec){op->iov, op->fx_buf};
    return (kvt_io_req){op->kind == OP_WRITE ? KVT_IO_WRITEV_FIXED : KVT_IO_READV_FIXED, -1, off, &op->fv, op->n_fx, op};
  }
  if (op->iov)
    return (kvt_io_req){op->kind == OP_WRITE ? KVT_IO_WRITEV : KVT_IO_READV, -1, off, (void *)op->iov, op->n_iov, op};
  return (kvt_io_req){op->kind == OP_WRITE ? KVT_IO_WRITE : KVT_IO_READ, op->buf_index, off, op->buf,
                      (uint32_t)d->slot_bytes, op};
}

/* ---- the disk queue: at most queue_depth I/Os at the disk ---- */

/* I/Os that left the disk (reaped, or refused at submission): room for as
 * many queued ones. */
static void disk_left(kvt__disk *d, disk_op *const *ops, uint32_t n) {
  uint32_t left = 0;
  for (uint32_t i = 0; i < n; i++)
    if (ops[i]->at_disk) ops[i]->at_disk = 0, left++;
  if (!left) return;
  pthread_mutex_lock(&d->lock);
  d->at_disk -= left;
  pthread_mutex_unlock(&d->lock);
}

/* Takes queued I/Os, oldest first, while the disk has room. Lock held. */
static uint32_t dq_take(kvt__disk *d, disk_op **out, uint32_t max) {
  uint32_t k = 0;
  while (k < max && d->dq_count && d->at_disk < d->queue_depth) {
    disk_op *op = d->dq[d->dq_head];
    d->dq_head = (d->dq_head + 1) % d->depth;
    d->dq_count--;
    d->at_disk++;
    op->at_disk = 1;
    out[k++] = op;
  }
  return k;
}

static uint32_t submit_reqs(kvt__disk *d, disk_op **ops, const kvt_io_req *reqs, uint32_t k, int *st);

/* Sends queued I/Os while the disk has room. Their callers were told they
 * were accepted, so a refusal here reaches done(). */
static void disk_flow(kvt__disk *d) {
  disk_op *ops[BATCH];
  kvt_io_req reqs[BATCH];
  disk_fin fin[BATCH];
  int st[BATCH];
  for (;;) {
    pthread_mutex_lock(&d->lock);
    uint32_t k = dq_take(d, ops, BATCH);
    pthread_mutex_unlock(&d->lock);
    if (!k) return;
    for (uint32_t j = 0; j < k; j++) reqs[j] = op_req(d, ops[j]), fin[j] = (disk_fin){ops[j]->done, ops[j]->arg, 0};
    submit_reqs(d, ops, reqs, k, st); /* refused: slot and op released, room made */
    for (uint32_t j = 0; j < k; j++)
      if (st[j]) fin[j].done(fin[j].arg, st[j]);
  }
}

/* Hands ops[0..k) to the disk: those it has room for go now (a refusal is
 * that request's status, as submit_reqs gives it); the rest queue behind
 * any already waiting (status 0: accepted). Returns how many were accepted. */
static uint32_t disk_start(kvt__disk *d, disk_op **ops, const kvt_io_req *reqs, uint32_t k, int *st) {
  uint32_t now = 0;
  pthread_mutex_lock(&d->lock);
  if (!d->dq_count)
    for (; now < k && d->at_disk < d->queue_depth; now++) d->at_disk++, ops[now]->at_disk = 1;
  for (uint32_t j = now; j < k; j++) d->dq[(d->dq_head + d->dq_count++) % d->depth] = ops[j], st[j] = 0;
  pthread_mutex_unlock(&d->lock);
  uint32_t queued = now ? submit_reqs(d, ops, reqs, now, st) : 0;
  if (queued < k) disk_flow(d); /* refusals made room, or I/Os left the disk while these queued */
  return queued + (k - now);
}

/* Hands reqs[0..k) of ops[] to the backend in as few calls as it takes;
 * a request refused at submission fails alone (status[pos[j]] = its code,
 * no done()). The pool never holds more ops than the backend's depth, so
 * "accepted 0" only means the reaper has not collected a finished one yet. */
static uint32_t submit_reqs(kvt__disk *d, disk_op **ops, const kvt_io_req *reqs, uint32_t k, int *st) {
  uint32_t j = 0, queued = 0;
  while (j < k) {
    pthread_mutex_lock(&d->sub_lock);
    int n = kvt__io_submit(&d->io, reqs + j, k - j);
    pthread_mutex_unlock(&d->sub_lock);
    if (n == 0) sched_yield();
    for (int i = 0; i < n; i++) st[j + (uint32_t)i] = 0;
    if (n > 0) j += (uint32_t)n, queued += (uint32_t)n;
    if (n >= 0) continue;
    atomic_fetch_add(&d->st.io_errors, 1);
    st[j] = n;
    slot_release(d, ops[j]->slot);
    disk_left(d, &ops[j], 1);
    op_put(d, ops[j]);
    j++;
  }
  return queued;
}

/* Sends a retried op again. A refusal finishes it here, once: submit_reqs
 * has already counted the error and released its slot and op, so the
 * caller must not touch the op afterwards in either case. */
static void op_resubmit(kvt__disk *d, disk_op *op) {
  kvt__disk_done_fn done = op->done;
  void *done_arg = op->arg;
  kvt_io_req r = op_req(d, op);
  int st = 0;
  submit_reqs(d, &op, &r, 1, &st);
  if (!st) return;
  disk_flow(d); /* it left the disk: room for a queued one */
  done(done_arg, st);
}

static void op_seal(kvt__disk *d, disk_op *op) {
  if (op->iov) kvt__record_seal_iov(op->iov, op->n_iov, &d->ns, d->block_tokens, d->payload_bytes, op->seq);
  else kvt__record_seal(op->buf, &d->ns, d->block_tokens, d->payload_bytes, op->seq);
}

/* Claims the slot and an op for tmpl; waits for an op only when the caller
 * holds none unsubmitted (else it would wait on itself). */
static int op_claim(kvt__disk *d, const disk_op *tmpl, int may_wait, disk_op **out) {
  if (!slot_claim(d, tmpl->slot)) return KVT_EBUSY;
  disk_op *op = op_get(d, 0);
  if (!op && !may_wait) {
    slot_release(d, tmpl->slot);
    return 1; /* submit what is pending first, then ask again */
  }
  if (!op) op = op_get(d, 1);
  if (!op) {
    slot_release(d, tmpl->slot);
    return d->stop ? KVT_ESTATE : KVT_EAGAIN;
  }
  *op = *tmpl;
  *out = op;
  return 0;
}

/* A record in pieces: prefix first, the whole slot in all, and what
 * O_DIRECT needs of every piece. */
static int pieces_check(const kvt__disk *d, const struct iovec *iov, uint32_t n, int zero_tail, uint64_t *len) {
  if (!d->vectored) return KVT_EUNSUPPORTED;
  if (n < 2 || n > KVT_DISK_MAX_IOV || iov[0].iov_len != kvt__record_prefix_bytes(d->block_tokens)) return -EINVAL;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!iov[i].iov_base || !iov[i].iov_len || iov[i].iov_len > d->slot_bytes) return -EINVAL;
    if (d->direct && (((uintptr_t)iov[i].iov_base | iov[i].iov_len) & (KVT_RECORD_ALIGN - 1))) return -EINVAL;
    sum += iov[i].iov_len;
  }
  *len = sum;
  return sum == d->slot_bytes || (zero_tail && sum < d->slot_bytes) ? 0 : -EINVAL;
}

static int io_prep(kvt__disk *d, int kind, kvt__disk_io *io, kvt__disk_done_fn done, disk_op *t) {
  if (io->slot >= d->slots) return -EINVAL;
  uint64_t len = d->slot_bytes;
  int zero_tail = kind == OP_READ && io->iov && io->zero_tail;
  if (io->iov) {
    int rc = pieces_check(d, io->iov, io->n_iov, zero_tail, &len);
    if (rc) return rc;
  } else if (!io->rec || (d->direct && ((uintptr_t)io->rec & (KVT_RECORD_ALIGN - 1)))) {
    return -EINVAL;
  }
  void *rec = io->iov ? io->iov[0].iov_base : io->rec;
  if (kind == OP_WRITE) {
    int rc = kvt__record_seal_check(rec, d->block_tokens);
    if (rc) return rc;
  }
  *t = (disk_op){.kind = kind, .slot = io->slot, .buf = rec, .iov = io->iov, .n_iov = io->iov ? io->n_iov : 0,
                 .done = done, .arg = io->arg, .buf_index = io->iov ? -1 : buf_index_of(d, rec, d->slot_bytes),
                 .zero_tail = zero_tail, .len = len};
  if (kind == OP_WRITE) t->seq = atomic_fetch_add(&d->next_seq, 1); /* call order, not seal order */
  if (kind == OP_WRITE && !d->handoff) op_seal(d, t);
  if (kind == OP_READ && io->expected_key) t->key = *io->expected_key, t->check_key = 1;
  if (kind == OP_READ) t->verify_later = io->verify_later != 0;
  return 0;
}

/* Prepares up to BATCH of ios[*i..n) and submits them as one batch. */
static uint32_t batch_chunk(kvt__disk *d, int kind, kvt__disk_io *ios, uint32_t n, uint32_t *i,
                            kvt__disk_done_fn done, int nowait) {
  disk_op *ops[BATCH];
  kvt_io_req reqs[BATCH];
  int st[BATCH];
  uint32_t pos[BATCH], k = 0;
  while (*i < n && k < BATCH) {
    disk_op t;
    int rc = io_prep(d, kind, &ios[*i], done, &t);
    if (rc == 0) rc = op_claim(d, &t, k == 0 && !nowait, &ops[k]);
    if (rc == 1) break;
    ios[*i].status = rc;
    ios[*i].fixed = 0;
    if (rc == 0) {
      fx_take(d, ops[k]);
      ios[*i].fixed = ops[k]->n_fx > 0;
      reqs[k] = op_req(d, ops[k]), pos[k++] = *i;
    }
    (*i)++;
  }
  if (k == 0) return 0;
  if (kind == OP_WRITE && d->handoff) { /* sealed and submitted by the checksum threads */
    for (uint32_t j = 0; j < k; j++) ios[pos[j]].status = 0;
    hq_push(d, ops, k);
    return k;
  }
  uint32_t queued = disk_start(d, ops, reqs, k, st);
  for (uint32_t j = 0; j < k; j++) ios[pos[j]].status = st[j];
  return queued;
}

/* nowait: a full queue ends the batch; that entry and the rest get
 * KVT_EAGAIN, so the caller resumes from the first of them. */
static int batch_run(kvt__disk *d, int kind, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done,
                     int nowait) {
  if (!d || !done || (n && !ios)) return -EINVAL;
  uint32_t i = 0, queued = 0;
  while (i < n) {
    uint32_t from = i;
    queued += batch_chunk(d, kind, ios, n, &i, done, nowait);
    if (i == from)
      for (; i < n; i++) ios[i].status = KVT_EAGAIN;
  }
  return (int)queued;
}

/* ---- completion ---- */

static int read_status(kvt__disk *d, disk_op *op) {
  const kvt_key *want = op->check_key ? &op->key : NULL;
  int rc = op->iov ? kvt__record_check_iov(op->iov, op->n_iov, &d->ns, d->block_tokens, d->payload_bytes,
                                           op->zero_tail, want, NULL)
                   : kvt__record_check(op->buf, d->slot_bytes, &d->ns, d->block_tokens, d->payload_bytes, want, 1, NULL);
  if (rc == KVT_EMISS) rc = KVT_EMISMATCH; /* empty slot: not the block asked for */
  if (rc == KVT_ECORRUPT) atomic_fetch_add(&d->st.checksum_failures, 1);
  if (rc == KVT_EMISMATCH) atomic_fetch_add(&d->st.mismatches, 1);
  if (rc == 0) {
    atomic_fetch_add(&d->st.reads, 1);
    atomic_fetch_add(&d->st.bytes_read, op->len ? op->len : d->slot_bytes);
  }
  return rc;
}

int kvt__disk_verify(kvt__disk *d, const kvt__disk_io *io) {
  if (!d || !io || (!io->iov && !io->rec)) return -EINVAL;
  disk_op op = {.kind = OP_READ, .buf = io->iov ? io->iov[0].iov_base : io->rec, .iov = io->iov,
                .n_iov = io->iov ? io->n_iov : 0, .zero_tail = io->iov && io->zero_tail};
  if (op.zero_tail) {
    for (uint32_t i = 0; i < op.n_iov; i++) op.len += op.iov[i].iov_len;
  }
  if (io->expected_key) op.key = *io->expected_key, op.check_key = 1;
  return read_status(d, &op);
}

static void count_ok(kvt__disk *d, disk_op *op) {
  if (op->kind == OP_TOMB) {
    atomic_fetch_add(&d->st.invalidates, 1);
  } else {
    atomic_fetch_add(&d->st.writes, 1);
    atomic_fetch_add(&d->st.bytes_written, d->slot_bytes);
  }
}

/* Maps a completion to the op's I/O status; 1 means resubmitted (not
 * finished here: the op is no longer the caller's). A read that landed
 * whole still has its checksums to pass. */
static int op_status(kvt__disk *d, disk_op *op, int res) {
  uint32_t want = op->kind == OP_TOMB ? KVT_DISK_SUPER_BYTES : (uint32_t)(op->len ? op->len : d->slot_bytes);
  if ((res == -EAGAIN || res == -EINTR) && op->retries++ < KVT_DISK_MAX_RETRIES) {
    atomic_fetch_add(&d->st.retries, 1);
    op_resubmit(d, op);
    return 1;
  }
  if (res < 0 || (uint32_t)res != want) {
    atomic_fetch_add(&d->st.io_errors, 1);
    return res < 0 ? res : -EIO; /* short: O_DIRECT remainders are unaligned, so not retried */
  }
  if (op->kind != OP_READ && !d->durable) count_ok(d, op); /* durable: once synced */
  return 0;
}

/* Seals a write and hands it to the backend; a refusal there finishes it
 * at once, through done(). */
static void seal_and_submit(kvt__disk *d, disk_op *op) {
  kvt__disk_done_fn done = op->done;
  void *done_arg = op->arg;
  op_seal(d, op); /* checked at the call */
  kvt_io_req r = op_req(d, op);
  int st = 0;
  disk_start(d, &op, &r, 1, &st); /* on refusal: slot and op released, op no longer ours */
  if (st) done(done_arg, st);
}

static void verify_and_finish(kvt__disk *d, disk_op *op) {
  int status = read_status(d, op);
  kvt__disk_done_fn done = op->done;
  void *done_arg = op->arg;
  slot_release(d, op->slot);
  op_put(d, op); /* op and slot are reusable before done() runs */
  done(done_arg, status);
}

static void *hasher_main(void *arg) {
  kvt__disk *d = arg;
  tl_completing = d;
  disk_op *op;
  while ((op = hq_pop(d)) != NULL) seal_and_submit(d, op); /* only writes are queued */
  return NULL;
}

/* ---- the sync thread (durable mode) ---- */

/* Hands completed writes to the sync thread in one critical section. */
static void sq_push(kvt__disk *d, disk_op *const *ops, uint32_t n) {
  if (!n) return;
  pthread_mutex_lock(&d->sq_lock);
  memcpy(d->sq + d->sq_count, ops, n * sizeof *ops);
  d->sq_count += n;
  pthread_cond_signal(&d->sq_cond);
  pthread_mutex_unlock(&d->sq_lock);
}

/* Takes everything queued into sq_group; 0 once the store stops and the
 * queue is empty. */
static uint32_t sq_take(kvt__disk *d) {
  pthread_mutex_lock(&d->sq_lock);
  while (!d->sq_count && !d->sq_stop) pthread_cond_wait(&d->sq_cond, &d->sq_lock);
  uint32_t n = d->sq_count;
  memcpy(d->sq_group, d->sq, n * sizeof *d->sq);
  d->sq_count = 0;
  pthread_mutex_unlock(&d->sq_lock);
  return n;
}

/* One fdatasync for a whole group of completed writes and tombstones, then
 * each finishes as complete_batch finishes the rest: ops back in one
 * critical section, done() with no lock held. A failed fdatasync fails
 * every op of the group: none of them counts as on disk. */
static void sync_group(kvt__disk *d, uint32_t n) {
  int rc = kvt__fault_check(KVT_FAULT_DISK_SYNC, n);
  if (rc == 0 && fdatasync(d->fd) < 0) rc = -errno;
  atomic_fetch_add(&d->st.syncs, 1);
  for (uint32_t j = 0; j < n; j++) {
    disk_op *op = d->sq_group[j];
    if (rc == 0) count_ok(d, op);
    else atomic_fetch_add(&d->st.io_errors, 1);
    d->sq_fin[j] = (disk_fin){op->done, op->arg, rc};
    slot_release(d, op->slot);
  }
  op_put_many(d, d->sq_group, n);
  for (uint32_t j = 0; j < n; j++) d->sq_fin[j].done(d->sq_fin[j].arg, d->sq_fin[j].status);
}

static void *syncer_main(void *arg) {
  kvt__disk *d = arg;
  tl_completing = d;
  uint32_t n;
  while ((n = sq_take(d)) != 0) sync_group(d, n);
  return NULL;
}

/* One reaped batch: completed writes of a durable store go to the sync
 * thread; the rest gets its status here, the ops go back in one critical
 * section, then done() runs with no lock held and the slots already
 * reusable. Landed reads of large records come last, after the disk was
 * refilled: each is verified and finished (op back, done()) before the
 * next is hashed, so its caller can send the next read while the reaper
 * hashes the rest. */
static void complete_batch(kvt__disk *d, const kvt_io_cqe *cqes, int n) {
  uint32_t k = 0, nv = 0, ns = 0, left = 0;
  for (int i = 0; i < n; i++) {
    disk_op *op = cqes[i].user;
    int status = op_status(d, op, cqes[i].res);
    if (status == 1) continue;
    if (op->at_disk) d->left[left++] = op;
    if (status == 0 && op->kind == OP_READ && d->handoff && !op->verify_later) {
      d->hbatch[nv++] = op;
      continue;
    }
    if (status == 0 && op->kind != OP_READ && d->durable) {
      d->sq_reap[ns++] = op;
      continue;
    }
    if (status == 0 && op->kind == OP_READ && !op->verify_later) status = read_status(d, op);
    d->fin[k] = (disk_fin){op->done, op->arg, status};
    d->fin_ops[k++] = op;
    slot_release(d, op->slot);
  }
  if (left) { /* the disk refills before landed reads are verified */
    disk_left(d, d->left, left);
    disk_flow(d);
  }
  sq_push(d, d->sq_reap, ns);
  op_put_many(d, d->fin_ops, k);
  for (uint32_t j = 0; j < k; j++) d->fin[j].done(d->fin[j].arg, d->fin[j].status);
  for (uint32_t j = 0; j < nv; j++) verify_and_finish(d, d->hbatch[j]);
}

static int reaper_wait(kvt__disk *d) {
  pthread_mutex_lock(&d->lock);
  while (!d->inflight && !d->stop) pthread_cond_wait(&d->cond, &d->lock);
  int go = d->inflight > 0;
  pthread_mutex_unlock(&d->lock);
  return go;
}

/* Durable writes wait for their group's fdatasync: the deeper the queue,
 * the more writes each sync covers (at depth 8, 2 MiB records: 9.7 per
 * sync and 0.91 of a normal spill; at 32: 24 and 1.00). */
uint32_t kvt__disk_auto_depth(uint64_t slot_bytes, int durable) {
  uint64_t n = AUTO_MAX_DEPTH;
  if (slot_bytes && slot_bytes < KVT_DISK_HANDOFF_BYTES) n = AUTO_INFLIGHT_BYTES / slot_bytes;
  else if (slot_bytes) n = (AUTO_INFLIGHT_LARGE_BYTES + slot_bytes / 2) / slot_bytes; /* the nearest count */
  uint32_t least = durable ? AUTO_DURABLE_MIN_DEPTH : AUTO_MIN_DEPTH;
  return n < least ? least : n > AUTO_MAX_DEPTH ? AUTO_MAX_DEPTH : (uint32_t)n;
}

static void *reaper_main(void *arg) {
  kvt__disk *d = arg;
  tl_completing = d;
  while (reaper_wait(d)) {
    int n = kvt__io_reap(&d->io, d->cqes, d->depth, 1, REAP_TIMEOUT_NS);
    if (n > 0) complete_batch(d, d->cqes, n);
    if (n < 0 && n != -EINTR && n != -ETIME && n != -EAGAIN) sched_yield();
  }
  return NULL;
}

/* At least two: on a small machine shared with other work, each runnable
 * thread gets its share of the CPUs. (When reads were verified on these
 * threads as well, one thread's share capped fetches: 2 MiB records, two
 * CPUs under load: 2.41 GB/s with one, 2.67-2.90 with two, raw io_uring
 * 2.84, in interleaved rounds.) */
static uint32_t auto_hashers(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long n = cpus / 2;
  return n < 2 ? 2u : n > 4 ? 4u : (uint32_t)n;
}

/* Checksum and sync threads first: the reaper hands them ops as soon as it
 * runs. Each is named after its job (kvt-disk-sum, -sync, -reap), so a
 * per-thread profile (perf, top -H) shows which stage spends the time. */
static int start_threads(kvt__disk *d) {
  for (; d->n_hashers < d->want_hashers; d->n_hashers++) {
    int rc = pthread_create(&d->hashers[d->n_hashers], NULL, hasher_main, d);
    if (rc) return -rc;
    pthread_setname_np(d->hashers[d->n_hashers], "kvt-disk-sum");
  }
  if (d->durable) {
    int rc = pthread_create(&d->syncer, NULL, syncer_main, d);
    if (rc) return -rc;
    pthread_setname_np(d->syncer, "kvt-disk-sync");
    d->syncer_started = 1;
  }
  int rc = pthread_create(&d->reaper, NULL, reaper_main, d);
  d->reaper_started = rc == 0;
  if (rc == 0) pthread_setname_np(d->reaper, "kvt-disk-reap");
  return -rc;
}

/* After the last op came back: the reaper ends, then the sync thread, then
 * the checksum threads. */
static void stop_threads(kvt__disk *d) {
  if (d->reaper_started) pthread_join(d->reaper, NULL);
  pthread_mutex_lock(&d->sq_lock);
  d->sq_stop = 1;
  pthread_cond_broadcast(&d->sq_cond);
  pthread_mutex_unlock(&d->sq_lock);
  if (d->syncer_started) pthread_join(d->syncer, NULL);
  pthread_mutex_lock(&d->hq_lock);
  d->hq_stop = 1;
  pthread_cond_broadcast(&d->hq_cond);
  pthread_mutex_unlock(&d->hq_lock);
  for (uint32_t i = 0; i < d->n_hashers; i++) pthread_join(d->hashers[i], NULL);
}

/* ---- public paths ---- */

int kvt__disk_write_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done) {
  return batch_run(d, OP_WRITE, ios, n, done, 0);
}

int kvt__disk_try_write_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done) {
  return batch_run(d, OP_WRITE, ios, n, done, 1);
}

int kvt__disk_read_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done) {
  return batch_run(d, OP_READ, ios, n, done, 0);
}

int kvt__disk_try_read_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done) {
  return batch_run(d, OP_READ, ios, n, done, 1);
}

static int one(kvt__disk *d, int kind, kvt__disk_io *io, kvt__disk_done_fn done) {
  int rc = batch_run(d, kind, io, 1, done, 0);
  return rc < 0 ? rc : io->status;
}

int kvt__disk_write(kvt__disk *d, uint64_t slot, void *rec, kvt__disk_done_fn done, void *arg) {
  kvt__disk_io io = {.slot = slot, .rec = rec, .arg = arg};
  return one(d, OP_WRITE, &io, done);
}

int kvt__disk_read(kvt__disk *d, uint64_t slot, void *rec, const kvt_key *expected_key,
                   kvt__disk_done_fn done, void *arg) {
  kvt__disk_io io = {.slot = slot, .rec = rec, .expected_key = expected_key, .arg = arg};
  return one(d, OP_READ, &io, done);
}

int kvt__disk_invalidate_async(kvt__disk *d, uint64_t slot, kvt__disk_done_fn done, void *arg) {
  if (!d || !done || slot >= d->slots) return -EINVAL;
  disk_op t = {.kind = OP_TOMB, .slot = slot, .buf_index = -1, .done = done, .arg = arg}, *op;
  int rc = op_claim(d, &t, 1, &op);
  if (rc) return rc;
  kvt_io_req r = op_req(d, op);
  int st = 0;
  disk_start(d, &op, &r, 1, &st);
  return st;
}

typedef struct sync_wait {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done, status;
} sync_wait;

static void sync_done(void *arg, int status) {
  sync_wait *w = arg;
  pthread_mutex_lock(&w->lock);
  w->status = status;
  w->done = 1;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

/* Waits for the done() of an operation rc says was queued (0). */
static int sync_finish(sync_wait *w, int rc) {
  if (rc == 0) {
    pthread_mutex_lock(&w->lock);
    while (!w->done) pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
    rc = w->status;
  }
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->cond);
  return rc;
}

int kvt__disk_invalidate(kvt__disk *d, uint64_t slot) {
  sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  return sync_finish(&w, kvt__disk_invalidate_async(d, slot, sync_done, &w));
}

int kvt__disk_read_sync(kvt__disk *d, uint64_t slot, void *rec, const kvt_key *expected_key) {
  sync_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  return sync_finish(&w, kvt__disk_read(d, slot, rec, expected_key, sync_done, &w));
}

static int seq_order(const void *a, const void *b) {
  const disk_found *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int kvt__disk_recover(kvt__disk *d,
                      void (*fn)(void *arg, uint64_t slot, const kvt_key *key, const kvt_key *parent),
                      void *arg, uint64_t *discarded) {
  if (!d || !fn) return -EINVAL;
  if (d->recovered) return KVT_ESTATE;
  d->recovered = 1;
  /* Oldest write first: a caller that puts each block at the recent end of
   * an LRU list rebuilds it in write order (tails before their ancestors). */
  if (d->n_found) qsort(d->found, d->n_found, sizeof *d->found, seq_order);
  for (uint64_t i = 0; i < d->n_found; i++) fn(arg, d->found[i].slot, &d->found[i].key, &d->found[i].parent);
  if (discarded) *discarded = d->discarded;
  int n = d->n_found > INT32_MAX ? INT32_MAX : (int)d->n_found;
  free(d->found);
  d->found = NULL;
  return n;
}

const char *kvt__disk_backend_name(const kvt__disk *d) { return d ? kvt__io_name(&d->io) : "none"; }

void kvt__disk_get_info(const kvt__disk *d, kvt__disk_info *info) {
  *info = (kvt__disk_info){.direct = d->direct, .fixed_buffers = d->n_bufs > 0, .vectored = d->vectored, .fixed_vec = d->fixed_vec,
                           .fallback = d->io.fallback, .slots = d->slots,
                           .slot_bytes = d->slot_bytes, .data_offset = d->data_off,
                           .checksum_threads = d->n_hashers, .queue_depth = d->queue_depth,
                           .ops = d->depth, .scan_width = d->io_depth};
}

void kvt__disk_get_stats(const kvt__disk *d, kvt__disk_stats *s) {
  kvt__disk *m = (kvt__disk *)d; /* atomics are read-only here */
  *s = (kvt__disk_stats){
      atomic_load(&m->st.writes), atomic_load(&m->st.reads), atomic_load(&m->st.invalidates),
      atomic_load(&m->st.bytes_written), atomic_load(&m->st.bytes_read),
      atomic_load(&m->st.checksum_failures), atomic_load(&m->st.mismatches),
      atomic_load(&m->st.io_errors), atomic_load(&m->st.retries), atomic_load(&m->st.syncs), d->n_found_total, d->discarded,
      d->superseded, (uint64_t)d->fresh_start, d->resize_moved, d->resize_dropped, d->recover_bytes};
}

/* ---- open / close ---- */

static int open_mode(const char *path, int flags, int *created) {
  int fd = open(path, flags);
  if (fd >= 0 || errno != ENOENT) return fd;
  fd = open(path, flags | O_CREAT | O_EXCL, 0644);
  if (fd >= 0) *created = 1;
  else if (errno == EEXIST) fd = open(path, flags); /* created by someone else meanwhile */
  return fd;
}

/* O_DIRECT where the filesystem allows it (tmpfs refuses with EINVAL).
 * Durable mode does not open O_DSYNC (one flush per write): the sync
 * thread covers groups of completed writes with one fdatasync each. */
static int open_file(kvt__disk *d, const char *path) {
  int flags = O_RDWR | O_CLOEXEC;
  d->direct = 1;
  d->fd = open_mode(path, flags | O_DIRECT, &d->created);
  if (d->fd < 0 && errno == EINVAL) {
    d->direct = 0;
    d->fd = open_mode(path, flags, &d->created);
  }
  if (d->fd < 0) {
    int e = errno;
    kvt__disk_detail(d, "cannot open: %s", strerror(e));
    return -e;
  }
  for (int i = 0; i < LOCK_TRIES; i++) {
    if (flock(d->fd, LOCK_EX | LOCK_NB) == 0) return 0;
    if (errno != EWOULDBLOCK) return -errno;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  kvt__disk_detail(d, "locked by another open cache");
  return KVT_ELOCKED;
}

static int check_cfg(const kvt__disk_cfg *c) {
  if (!c || !c->path || !c->slots || !c->block_tokens || c->block_tokens > 65536 || !c->payload_bytes)
    return -EINVAL;
  if (kvt__record_bytes(c->block_tokens, c->payload_bytes) > (1u << 30)) return -EINVAL;
  if (c->slots > (UINT64_MAX / 2) / kvt__record_bytes(c->block_tokens, c->payload_bytes)) return -EINVAL;
  if (c->n_bufs && (!c->bufs || !c->buf_lens)) return -EINVAL;
  return 0;
}

static int alloc_runtime(kvt__disk *d, const kvt__disk_cfg *c) {
  d->ops = calloc(d->depth, sizeof *d->ops);
  d->free_ops = calloc(d->depth, sizeof *d->free_ops);
  d->cqes = calloc(d->depth, sizeof *d->cqes);
  d->fin = calloc(d->depth, sizeof *d->fin);
  d->fin_ops = calloc(d->depth, sizeof *d->fin_ops);
  d->busy = calloc(d->slots, sizeof *d->busy);
  d->zero_page = aligned_alloc(4096, KVT_DISK_SUPER_BYTES);
  d->hq = calloc(d->depth, sizeof *d->hq);
  d->hbatch = calloc(d->depth, sizeof *d->hbatch);
  d->dq = calloc(d->depth, sizeof *d->dq);
  d->left = calloc(d->depth, sizeof *d->left);
  if (d->durable) {
    d->sq = calloc(d->depth, sizeof *d->sq);
    d->sq_reap = calloc(d->depth, sizeof *d->sq_reap);
    d->sq_group = calloc(d->depth, sizeof *d->sq_group);
    d->sq_fin = calloc(d->depth, sizeof *d->sq_fin);
    if (!d->sq || !d->sq_reap || !d->sq_group || !d->sq_fin) return -ENOMEM;
  }
  if (!d->ops || !d->free_ops || !d->cqes || !d->fin || !d->fin_ops || !d->busy || !d->zero_page) return -ENOMEM;
  if (!d->hq || !d->hbatch || !d->dq || !d->left) return -ENOMEM;
  if (d->n_bufs && !(d->bufs = calloc(d->n_bufs, sizeof *d->bufs))) return -ENOMEM;
  for (uint32_t i = 0; i < d->n_bufs; i++) d->bufs[i] = (struct disk_region){(uintptr_t)c->bufs[i], c->buf_lens[i]};
  memset(d->zero_page, 0, KVT_DISK_SUPER_BYTES);
  for (uint32_t i = 0; i < d->depth; i++) d->free_ops[i] = d->depth - 1 - i;
  d->n_free = d->depth;
  return 0;
}

static kvt__disk *disk_new(const kvt__disk_cfg *c) {
  kvt__disk *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->fd = -1;
  d->slots = c->slots;
  d->block_tokens = c->block_tokens;
  d->payload_bytes = c->payload_bytes;
  d->slot_bytes = kvt__record_bytes(c->block_tokens, c->payload_bytes);
  d->handoff = d->slot_bytes >= KVT_DISK_HANDOFF_BYTES;
  d->data_off = KVT_DISK_SUPER_BYTES;
  d->ns = c->ns;
  d->queue_depth = c->queue_depth ? c->queue_depth : kvt__disk_auto_depth(d->slot_bytes, c->durable);
  d->want_hashers = !d->handoff ? 0 : c->checksum_threads ? c->checksum_threads : auto_hashers();
  if (d->want_hashers > KVT_DISK_MAX_HASHERS) d->want_hashers = KVT_DISK_MAX_HASHERS;
  uint32_t headroom = d->want_hashers * KVT_DISK_HASH_HEADROOM_PER_THREAD;
  d->depth = d->queue_depth + (headroom < d->queue_depth ? headroom : d->queue_depth) +
             (c->durable ? d->queue_depth : 0);
  d->io_depth = d->depth > KVT_DISK_SCAN_MIN_WIDTH ? d->depth : KVT_DISK_SCAN_MIN_WIDTH;
  d->n_bufs = c->n_bufs;
  d->recover_headers_only = c->recover_headers_only;
  d->on_record = c->on_record;
  d->on_record_arg = c->on_record_arg;
  d->durable = c->durable;
  d->path = c->path;
  d->detail = c->detail;
  d->detail_len = c->detail_len;
  if (d->detail && d->detail_len) d->detail[0] = '\0';
  pthread_mutex_init(&d->lock, NULL);
  pthread_cond_init(&d->cond, NULL);
  pthread_mutex_init(&d->hq_lock, NULL);
  pthread_mutex_init(&d->sub_lock, NULL);
  pthread_cond_init(&d->hq_cond, NULL);
  pthread_mutex_init(&d->sq_lock, NULL);
  pthread_cond_init(&d->sq_cond, NULL);
  atomic_init(&d->next_seq, 1);
  return d;
}

static int open_backend(kvt__disk *d, const kvt__disk_cfg *c) {
  kvt_io_open_args a = {.fd = d->fd, .queue_depth = d->io_depth, .bufs = c->bufs,
                        .buf_lens = c->buf_lens, .n_bufs = c->n_bufs};
  int rc = kvt__io_open(c->backend, &a, &d->io);
  if (rc == 0) d->vectored = d->io.be->version >= 2 && (d->io.be->caps & KVT_IO_CAP_VECTORED);
  /* Fixed buffers registered later: only when the backend takes one now
   * (io_uring with a sparse table: Linux 5.19). The probe is the zero page,
   * kept registered. */
  if (rc == 0 && d->vectored && kvt__io_fixed_vec(&d->io)) {
    uint32_t index;
    d->fixed_vec = kvt__io_buf_register(&d->io, d->zero_page, KVT_DISK_SUPER_BYTES, &index) == 0;
  }
  return rc;
}

static int open_steps(kvt__disk *d, const kvt__disk_cfg *c) {
  int fresh = 0;
  int rc = alloc_runtime(d, c);
  if (rc == 0) rc = open_file(d, c->path);
  if (rc == 0) rc = kvt__disk_prepare_file(d, c->reset, &fresh);
  if (rc == 0) rc = open_backend(d, c);
  if (rc == 0 && fresh == 0) rc = kvt__disk_scan(d);
  if (rc == 0 && fresh == 0) rc = kvt__disk_finish_resize(d);
  if (rc == 0 && fresh == 2) rc = kvt__disk_sweep(d, 0, d->slots);
  if (rc) return rc;
  d->n_found_total = d->n_found;
  atomic_store(&d->next_seq, d->max_seq + 1);
  return start_threads(d);
}

int kvt__disk_open(const kvt__disk_cfg *cfg, kvt__disk **out) {
  if (!out) return -EINVAL;
  *out = NULL;
  int rc = check_cfg(cfg);
  if (rc) return rc;
  kvt__disk *d = disk_new(cfg);
  if (!d) return -ENOMEM;
  rc = open_steps(d, cfg);
  if (rc) {
    /* A file this open created holds nothing of anyone's: leave no trace. */
    if (d->created && cfg->path && rc != KVT_ELOCKED) unlink(cfg->path);
    kvt__disk_close(d);
    return rc;
  }
  d->path = NULL; /* the caller's string is not ours to keep */
  *out = d;
  return 0;
}

void kvt__disk_close(kvt__disk *d) {
  if (!d) return;
  pthread_mutex_lock(&d->lock);
  while (d->inflight) pthread_cond_wait(&d->cond, &d->lock);
  d->stop = 1;
  pthread_cond_broadcast(&d->cond);
  pthread_mutex_unlock(&d->lock);
  stop_threads(d);
  kvt__io_close(&d->io);
  /* Unlock before close: a ring torn down by the kernel in the background
   * may hold the file a while longer, and with it an flock that the next
   * opener would wait for. Nothing is in flight by now. */
  if (d->fd >= 0) {
    flock(d->fd, LOCK_UN);
    close(d->fd);
  }
  pthread_mutex_destroy(&d->lock);
  pthread_cond_destroy(&d->cond);
  pthread_mutex_destroy(&d->hq_lock);
  pthread_mutex_destroy(&d->sub_lock);
  pthread_cond_destroy(&d->hq_cond);
  pthread_mutex_destroy(&d->sq_lock);
  pthread_cond_destroy(&d->sq_cond);
  free(d->sq);
  free(d->sq_reap);
  free(d->sq_group);
  free(d->sq_fin);
  free(d->hq);
  free(d->hbatch);
  free(d->dq);
  free(d->left);
  free(d->ops);
  free(d->free_ops);
  free(d->cqes);
  free(d->fin);
  free(d->fin_ops);
  free((void *)d->busy);
  free(d->zero_page);
  free(d->found);
  free(d->bufs);
  free(d);
}
