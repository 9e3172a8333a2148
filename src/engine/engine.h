/* Engine internals: the cache object, jobs and requests.
 *
 * Locking: c->lock guards the tier map, the slot stacks, jobs, requests and
 * stats. It is held only for bookkeeping; copies and I/O are submitted and
 * completed outside it. c->cond is broadcast whenever a job finishes or a
 * slot is freed (waiters: evictions, request waits, drain). */
#ifndef KVT_ENGINE_ENGINE_H
#define KVT_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/calib.h"
#include "core/hash.h"
#include "core/index.h"
#include "dev/dev.h"
#include "engine/metrics.h"
#include "kvtier/backend.h"
#include "store/disk_store.h"
#include "store/host_pool.h"
#include "util/fork.h"
#include "util/log.h"

enum { KVT__T_DEV = 0, KVT__T_HOST = 1, KVT__T_DISK = 2 };
/* The remote tier has no slots and no place in the tier map (the store
 * evicts on its own): a remote block is one the engine found there by a
 * probe, and becomes an entry only once it is fetched into a host slot. */
#define KVT__T_REMOTE 3

/* Job kinds: the path they move blocks on. RPUT: host slots to the remote. */
enum { KVT__JOB_STORE = 1, KVT__JOB_LOAD, KVT__JOB_SPILL, KVT__JOB_FETCH, KVT__JOB_RPUT };

#define KVT__JF_EVICT 0x1u   /* drop the source copy once the copy landed */
#define KVT__JF_USER 0x2u    /* an engine handle refers to the job */
#define KVT__JF_LOAD_AFTER 0x4u /* a request load: FETCH phase, then LOAD */
#define KVT__JF_DEMOTE 0x8u  /* an eviction's demotion: the slot is freed even if the copy fails */
#define KVT__JF_CANCEL 0x10u /* cancelled: completions discard what the copies did */
#define KVT__JF_RPUT 0x20u   /* a spill whose blocks then go on to the remote (eviction, write-through) */

struct kvt__job;

typedef struct kvt__op {
  struct kvt__job *jb;
  /* A disk op: the completion queue's link while posted. A follow op (never
   * posted) waits in the list of its host slot's fill (c->host_follow). */
  union {
    struct kvt__op *cq_next;
    struct kvt__op *follow_next;
  };
  uint32_t entry;
  uint32_t slot[KVT__NTIERS]; /* slots involved, per tier (KVT__NONE if not) */
  uint32_t ref;       /* request ref index (loads), else KVT__NONE */
  int status;
  uint8_t from_disk;  /* request loads: fetched from disk before the load */
  uint8_t landed;     /* request loads: on the host (read over, or a host hit); status says how */
  uint8_t remote;     /* its I/O is with the remote tier (a get for loads and fetches, a put for RPUT) */
  uint8_t evict;      /* RPUT: the host copy leaves once the put is over (counted in freeing) */
  /* Request loads: follow: its host copy is being fetched by another job
   * (a prefetch, another request's load): it lands when that fetch does.
   * dup: the entry's device copy is another request's load, not to be
   * shared: this op copies the host copy into the request's private slot
   * (the ref's dup says how that went; the entry's device state is not
   * touched). */
  uint8_t follow, dup;
  uint64_t tok_sum;   /* XXH3_64 of the request's tokens, 0 = unknown (fetch verify) */
} kvt__op;

typedef struct kvt__job {
  kvt_cache *c;
  uint32_t index;
  uint32_t gen;
  uint8_t kind, busy, done, phase;
  uint8_t submitted; /* loads: the device backend accepted the copy (layer waits may start) */
  uint32_t flags;
  int status;
  uint32_t n_ops, n_fetch; /* LOAD_AFTER: n_fetch of the ops are fetched first */
  uint32_t following;      /* loads: follow ops whose host fill has not landed yet */
  uint32_t pending;        /* outstanding disk ops of the current phase */
  uint32_t req;            /* owning request while loading, or KVT__NONE */
  uint32_t holders;        /* layer queries using xfer outside the lock (loads) */
  uint32_t handle;         /* the engine's handle (KVT__JF_USER), or KVT__NONE */
  int64_t t_start;
  uint64_t bytes;
  kvt__op *ops;
  uint32_t *dev_slots;     /* xfer arrays, max_job_blocks each (shared by the job's xfers, by op index) */
  void **host_blocks;
  kvt_dev_xfer xfer;       /* the job's own device copy: ops [final_first, n_ops) */
  /* Disk phase, handed to the store without waiting for free ops: resumed
   * from disk_next when completions free some (the progress thread). */
  uint8_t disk_started;
  uint32_t disk_next, disk_sent, disk_total;
  uint32_t remote_total;   /* of disk_total: remote ops, handed to the client first */
  uint8_t remote_handed;
  /* Streamed restores: ops [0, copy_next) have their device copy submitted
   * in chunks (kvt__xchunk) while later reads are in flight; ops
   * [copy_next, scan) have landed; the job's own xfer copies the rest. */
  uint32_t copy_next, scan, chunks_out, final_first;
  uint8_t final_out;       /* the job's own xfer is queued or in flight */
  int xfer_status;         /* its completion, as posted */
  struct kvt__job *cq_next;
} kvt__job;

/* A streamed piece of a restore's device copy: leading blocks of a load
 * whose reads have landed, copied while the rest are still being read. A
 * pool per cache, prepared at layout registration. */
typedef struct kvt__xchunk {
  kvt_dev_xfer xfer;
  kvt__job *jb;
  uint32_t first, n, index;
  int status;
  struct kvt__xchunk *cq_next;
} kvt__xchunk;
#define KVT__STREAM_XFERS 32u
/* A chunk is submitted once this many bytes of leading blocks have landed. */
#define KVT__STREAM_BYTES ((size_t)16 << 20)

/* An engine's job handle: outlives its job, which goes back to the pool
 * as soon as it finishes (a finished, unreleased handle holds no job). */
typedef struct kvt__handle {
  uint32_t gen;
  uint32_t job; /* while running, else KVT__NONE */
  int status;
  uint8_t busy, done;
} kvt__handle;

/* Jobs kept for internal work (demotions, spills, write-through): engine
 * handles and request loads never take the last ones. */
#define KVT__JOBS_RESERVED 2u

typedef struct kvt__ref {
  kvt_key key;
  uint32_t entry; /* entry whose device copy this request pins, or NONE (private slot) */
  uint32_t slot;  /* device slot */
  uint8_t tier;   /* restored blocks: the tier it is restored from */
  uint8_t failed; /* its load failed (kvt_request_block_states) */
  /* A private copy of a block another request is loading into its own
   * device slot (entry is NONE once the request is built): KVT__DUP_LOADING
   * while it copies, KVT__DUP_READY once it landed intact, 0 otherwise. */
  uint8_t dup;
  uint8_t unchecked; /* scanned while its host copy was FILLING: tokens not checked yet */
} kvt__ref;
enum { KVT__DUP_LOADING = 1, KVT__DUP_READY = 2 };

/* Refs come in chunks (refs.c); a ref id is chunk * KVT__REF_CHUNK + offset. */
#define KVT__REF_CHUNK 32u
#define KVT__SLAB_SHIFT 6u
#define KVT__SLAB_CHUNKS (1u << KVT__SLAB_SHIFT)

typedef struct kvt__ref_chunk {
  kvt__ref r[KVT__REF_CHUNK];
  uint32_t next, prev; /* the request's chunk list, or the free list (next) */
} kvt__ref_chunk;

typedef struct kvt__request {
  uint32_t gen;
  uint8_t busy;
  uint32_t n_blocks, n_extra, n_restore, n_committed;
  uint32_t job;   /* load job in flight, or KVT__NONE */
  uint32_t chunk0, chunk_last; /* the request's ref chunks, first and last */
  kvt_key parent; /* key before block 0: the namespace, or kvt_acquire_after's parent */
} kvt__request;

struct kvt_cache {
  kvt_config cfg;
  char *model_fp, *disk_path;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int layout_ready, metadata_only;
  int storage_mode;     /* KVT_LAYOUT_STORAGE: the engine owns its memory (storage.c) */
  struct kvt__storage *storage;
  struct kvt__object_memo *objects; /* object.c: headers of objects put or read (under lock) */
  int register_failed;  /* a failed kvt_register_layout leaves the cache only closable */
  uint32_t salt;        /* mixed into handle generations: foreign handles do not match */
  kvt_layout layout;
  kvt_segment *segments;
  size_t block_bytes, record_bytes;
  uint32_t bt; /* block tokens */
  kvt_key ns;

  kvt__dev dev;
  kvt__index map;
  kvt__slots slots[KVT__NTIERS];
  uint64_t cap[KVT__NTIERS];
  uint32_t freeing[KVT__NTIERS]; /* slots that in-flight evictions will free */
  kvt__host_pool host;
  kvt__disk *disk;
  const void *disk_bufs[1]; /* the host pool, registered with the disk backend (kept: the store refers to it) */
  size_t disk_buf_lens[1];
  /* Per host slot, while another job fetches into it: the request loads
   * that follow that fetch (follow ops, linked by follow_next), or NULL. */
  kvt__op **host_follow;
  uint32_t *dev_tokens;   /* block_tokens ids per device slot */
  uint8_t *dev_has_tokens;

  kvt__job *jobs;
  uint32_t *job_free;
  uint32_t n_jobs, n_job_free, inflight; /* n_jobs = max_jobs + KVT__JOBS_RESERVED */
  uint32_t n_jobs_allocated;             /* job slots whose op arrays exist (kvt__job_new) */
  kvt__handle *handles;    /* max_jobs engine handles */
  uint32_t *handle_free;
  uint32_t n_handle_free;
  uint32_t submitting;     /* library threads inside a submission (kvt_drain waits for them) */
  uint32_t *submitq;       /* jobs started under the lock, submitted after it */
  uint32_t n_submitq;
  /* Completions as data: backends post finished disk ops, device copies and
   * streamed chunks here (cq_lock only); a progress step (the progress
   * thread, or an API call that would otherwise wait) applies them under
   * c->lock and starts what follows. Lock order: c->lock, then cq_lock. */
  pthread_mutex_t cq_lock;
  pthread_cond_t cq_cond;  /* the progress thread sleeps on it */
  int cq_ready;
  kvt__op *cq_ops;         /* newest first */
  kvt__xchunk *cq_chunks;
  kvt__job *cq_jobs;
  _Atomic uint32_t cq_n;       /* posted, not yet taken */
  _Atomic uint32_t cq_waiters; /* API threads in kvt__wait (posters wake them) */
  /* The progress thread: the only one that hands disk ops to the store (it
   * never waits for a free op: a full queue parks the job in diskwait). */
  pthread_t progress_thread;
  int progress_running, progress_stop; /* progress_stop: under cq_lock */
  uint32_t *progq, progq_head, n_progq; /* ring of n_jobs job indices, under cq_lock */
  uint32_t *progq_take, *diskwait, n_diskwait; /* the progress thread's own */
  kvt__xchunk *xchunks;    /* streamed copies: pool, free stack, queue to submit (c->lock) */
  uint32_t *xchunk_free, n_xchunk_free, n_xchunks;
  uint32_t *chunkq, n_chunkq;
  uint32_t stream_blocks;  /* blocks per streamed chunk (KVT__STREAM_BYTES) */

  kvt__request *reqs;
  uint32_t *req_free;
  uint32_t n_req_free;
  kvt__ref_chunk **ref_slabs; /* request refs: slabs of KVT__SLAB_CHUNKS chunks */
  uint32_t n_ref_slabs, ref_slabs_cap;
  uint32_t chunk_free, n_chunk_free; /* free chunk list */
  uint8_t *scratch_tiers;  /* planner scratch, max_job_blocks */
  uint32_t *scratch_entries; /* commit scratch, max_job_blocks */

  kvt_model_desc model;
  kvt_hw_desc hw;
  kvt__calib calib;
  int have_cost;

  /* The remote tier (remote_tier.c): the client once connected (set once,
   * never cleared before kvt_close), the copied strings, a thread that
   * retries the connection while the server is unreachable, and the
   * negative cache of keys found absent. */
  _Atomic(struct kvt__remote *) remote;
  int remote_on;           /* a remote tier is configured for this cache */
  char *remote_url, *remote_user, *remote_password, *remote_prefix;
  pthread_mutex_t rlock;   /* the negative cache, probe counters and the retry thread; after c->lock */
  pthread_cond_t rcond;
  int rlock_ready, rthread_running, rthread_stop;
  pthread_t rthread;
  struct kvt__rneg *rneg;  /* negative cache: KVT__RNEG_SLOTS, direct mapped */
  uint64_t r_probes, r_probe_blocks, r_neg_hits, r_reconnects; /* rlock */
  uint32_t rput_building;  /* RPUT job gathering puts during a progress step, or KVT__NONE (c->lock) */
  uint32_t rput_jobs;      /* RPUT jobs submitted, not finished (c->lock): at most a quarter of the pool */

  kvt_stats st;
  kvt__metrics metrics; /* engine/metrics.h: atomics, no lock */
  kvt__log_sink log;    /* where this cache's messages go (from the config) */
  uint32_t fork_gen;   /* kvt__fork_gen() at open: another value means a forked child */
  char detail[256];    /* kvt_error_detail: why kvt_register_layout failed */
};

/* jobs.c: the pool, handles, submission to the backends, posting. */
/* A job from the pool, or KVT__NONE. Engine jobs (KVT__JF_USER, which also
 * takes a handle) and request loads leave KVT__JOBS_RESERVED for internal work. */
uint32_t kvt__job_new(kvt_cache *c, int kind, uint32_t flags);
int kvt__job_available(const kvt_cache *c, int kind, uint32_t flags);
void kvt__job_free(kvt_cache *c, uint32_t j);
/* Appends to job j a copy of entry e from tier `from` (pinned there as the
 * source) into slot dst of tier `to` (marked FILLING). Lock held. */
kvt__op *kvt__job_add_copy(kvt_cache *c, uint32_t j, uint32_t e, int from, int to, uint32_t dst);
kvt_job kvt__job_handle(const kvt_cache *c, uint32_t j);
/* The handle slot of h, or KVT__NONE. */
uint32_t kvt__job_from_handle(const kvt_cache *c, kvt_job h);
/* Forgets handle slot h: a job still running completes on its own. */
void kvt__handle_release(kvt_cache *c, uint32_t h);
/* Backend-facing submission (lock NOT held), used by progress.c: */
void kvt__job_copy(kvt_cache *c, kvt__job *jb);        /* its device copy */
int kvt__job_disk_phase(const kvt__job *jb);
void kvt__job_disk_start(kvt_cache *c, kvt__job *jb);  /* counts its disk ops */
int kvt__job_disk_ops(kvt_cache *c, kvt__job *jb);     /* 1: all handed over; 0: queue full */
void kvt__chunk_submit(kvt_cache *c, kvt__xchunk *ch);
void kvt__fill_record_identity(kvt_cache *c, uint32_t e, uint32_t dev_slot, uint32_t host_slot);
/* progress.c: submits a job's current phase (disk I/O via the progress
 * thread). Lock NOT held. */
void kvt__job_submit(kvt_cache *c, uint32_t j);
/* With the lock held: submit j once the lock is dropped (kvt__flush_submits). */
void kvt__queue_submit(kvt_cache *c, uint32_t j);
void kvt__flush_submits(kvt_cache *c);           /* lock NOT held */
/* The progress thread (a disk tier with real bytes): started at layout
 * registration, stopped by kvt_close after the drain. */
int kvt__progress_start(kvt_cache *c);
void kvt__progress_stop(kvt_cache *c);
/* With the lock held: the progress thread submits j (its next phase). */
void kvt__progress_submit(kvt_cache *c, uint32_t j);
/* Applies posted completions and submits what they start (lock NOT held).
 * A no-op on a thread already inside it. */
void kvt__cq_drain(kvt_cache *c);
/* In place of pthread_cond_wait(&c->cond) (lock held): applies posted
 * completions itself if there are any (then returns 0 at once), else waits,
 * until dl when non-NULL (ETIMEDOUT). Callers re-check their condition. */
int kvt__wait(kvt_cache *c, const struct timespec *dl);
int kvt__jobs_init(kvt_cache *c);
void kvt__jobs_fini(kvt_cache *c);

/* refs.c: request references, c->lock held. */
int kvt__refs_init(kvt_cache *c);
void kvt__refs_fini(kvt_cache *c);
size_t kvt__refs_bytes(const kvt_cache *c);
/* Chunks for n refs (grows the pool if it must): 0 or -ENOMEM. */
int kvt__refs_alloc(kvt_cache *c, uint32_t n, uint32_t *first_chunk, uint32_t *last_chunk);
void kvt__refs_free(kvt_cache *c, uint32_t first_chunk, uint32_t last_chunk, uint32_t n);
/* Id of ref i of the list starting at first_chunk: O(i / KVT__REF_CHUNK). */
uint32_t kvt__ref_id(const kvt_cache *c, uint32_t first_chunk, uint32_t i);

/* evict.c: called with c->lock held; never waits. */
int kvt__room_step(kvt_cache *c, int tier, uint32_t need, int keep);
void kvt__drop_tier(kvt_cache *c, uint32_t e, int tier);
void kvt__maybe_remove(kvt_cache *c, uint32_t e);
uint32_t kvt__start_store(kvt_cache *c, const uint32_t *entries, uint32_t n, uint32_t flags);

/* progress.c: room in a tier (lock held); may_wait: waits for demotions,
 * applying completions itself. 0, KVT_EAGAIN (!may_wait), KVT_ENOSPACE.
 * KVT__ROOM_KEEP or'd into may_wait: never drops a block no tier below
 * holds, even when it cannot be demoted (room for a best-effort copy,
 * KVT_GET_PROMOTE's: KVT_ENOSPACE then). */
#define KVT__ROOM_KEEP 2
int kvt__make_room(kvt_cache *c, int tier, uint32_t need, int may_wait);

/* storage.c: storage mode (KVT_LAYOUT_STORAGE). */
int kvt__storage_layout_ok(kvt_cache *c, const kvt_layout *l);
int kvt__storage_init(kvt_cache *c);  /* at the end of kvt_register_layout */
void kvt__storage_fini(kvt_cache *c); /* in kvt_close, after kvt_drain; NULL storage is fine */
void kvt__object_memo_free(kvt_cache *c); /* in kvt_close */
size_t kvt__object_memo_bytes(const kvt_cache *c); /* lock held */
uint32_t kvt__object_jobs(uint32_t n, size_t part_bytes, uint32_t workers); /* a get's or put's split */
/* The disk scan's on_record at open: remembers the objects whose part 0 it
 * reads (their header is that record's token ids). */
void kvt__object_on_record(void *cache, const kvt__record_hdr *h, const uint32_t *tokens);

/* remote_tier.c: the remote tier T3. */
struct kvt__remote;
/* At kvt_register_layout (namespace known): connects, or starts the retry
 * thread when the server is unreachable. 0, KVT_EAUTH, -EINVAL, -ENOMEM. */
int kvt__rtier_open(kvt_cache *c);
void kvt__rtier_close(kvt_cache *c); /* kvt_close, after the drain */
/* The client, or NULL (no remote tier, or not reachable yet). Any thread. */
static inline struct kvt__remote *kvt__rtier(kvt_cache *c) {
  return atomic_load_explicit(&c->remote, memory_order_acquire);
}
/* Leading keys of keys[0..n) the remote holds (c->lock NOT held): a round
 * trip per KVT__RPROBE_MAX keys while all are there, none when keys[0]
 * was found absent lately. */
#define KVT__RPROBE_MAX 256u
uint32_t kvt__rtier_probe(kvt_cache *c, const kvt_key *keys, size_t n);
/* Remote blocks after a local prefix of p: how many of keys[p..n) the
 * remote holds, leading (0 without a remote tier; lock NOT held). */
uint32_t kvt__rtier_after(kvt_cache *c, const kvt_key *keys, size_t n, uint32_t p);
void kvt__rtier_absent(kvt_cache *c, const kvt_key *key); /* a fetch found it absent (any lock) */
void kvt__rtier_stats(kvt_cache *c, kvt_stats *st);       /* c->lock NOT held */
/* Puts of host copies, gathered in one RPUT job per progress step (lock
 * held): 1 queued (pinned on the host; with evict the slot is counted in
 * freeing until the put is over), 0 no remote, no job free, or every put
 * job busy and the gathering one full (counted as skipped). */
int kvt__rput_add(kvt_cache *c, uint32_t e, int evict);
/* Submits the gathered job unless the cap of put jobs is in flight (then
 * the next put job to finish submits it). Lock held. */
void kvt__rput_flush(kvt_cache *c);
/* Completions, applied by a progress step (lock held): a put is over; a
 * fetched record's parent against the entry's (0 or KVT_EMISMATCH); a
 * fetch that failed, counted by its reason (an absent key is remembered). */
void kvt__rput_done(kvt_cache *c, kvt__op *op);
int kvt__rfetch_verify(kvt_cache *c, const kvt__op *op);
void kvt__rtier_fetch_failed(kvt_cache *c, const kvt_key *key, int status);

/* check.c: 0 if the tier map's invariants hold, else -1 with a reason. */
int kvt__check_invariants(kvt_cache *c, char *msg, size_t len);

/* A child of fork() has none of the cache's threads: every call refuses. */
static inline int kvt__forked(const kvt_cache *c) { return c->fork_gen != kvt__fork_gen(); }
/* The checks every request-path call starts with (returns from the caller). */
#define KVT__REQ_CHECK(c)                      \
  do {                                         \
    if (!(c)) return -EINVAL;                  \
    if (kvt__forked(c)) return KVT_EFORKED;    \
    if (!(c)->layout_ready) return KVT_ELAYOUT; \
  } while (0)

static inline kvt__entry *kvt__E(kvt_cache *c, uint32_t e) { return &c->map.entries[e]; }
static inline kvt__ref_chunk *kvt__chunk(const kvt_cache *c, uint32_t ch) {
  return &c->ref_slabs[ch >> KVT__SLAB_SHIFT][ch & (KVT__SLAB_CHUNKS - 1)];
}
static inline kvt__ref *kvt__ref_at(const kvt_cache *c, uint32_t id) {
  return &kvt__chunk(c, id / KVT__REF_CHUNK)->r[id % KVT__REF_CHUNK];
}
/* The ref after / before id in its request (KVT__NONE past either end). */
static inline uint32_t kvt__ref_next(const kvt_cache *c, uint32_t id) {
  if (id % KVT__REF_CHUNK != KVT__REF_CHUNK - 1) return id + 1;
  uint32_t ch = kvt__chunk(c, id / KVT__REF_CHUNK)->next;
  return ch == KVT__NONE ? KVT__NONE : ch * KVT__REF_CHUNK;
}
static inline uint32_t kvt__ref_prev(const kvt_cache *c, uint32_t id) {
  if (id % KVT__REF_CHUNK) return id - 1;
  uint32_t ch = kvt__chunk(c, id / KVT__REF_CHUNK)->prev;
  return ch == KVT__NONE ? KVT__NONE : ch * KVT__REF_CHUNK + KVT__REF_CHUNK - 1;
}
static inline uint32_t kvt__req_ref0(const kvt__request *rq) { return rq->chunk0 * KVT__REF_CHUNK; }

/* Walks a request's refs in order (or in reverse), one chunk lookup per
 * KVT__REF_CHUNK refs instead of one per ref: the per-block loops of
 * acquire, commit and release. A chunk is looked up only when a ref of it
 * is asked for, so a walk may stop anywhere. */
typedef struct kvt__ref_walk {
  kvt__ref *r;     /* the next ref to hand out */
  kvt__ref *end;   /* where its chunk ends (reverse: the chunk's first ref) */
  uint32_t chunk;  /* the chunk r lies in */
} kvt__ref_walk;

/* From ref id on. */
static inline void kvt__walk_from(const kvt_cache *c, kvt__ref_walk *w, uint32_t id) {
  kvt__ref_chunk *k = kvt__chunk(c, id / KVT__REF_CHUNK);
  w->chunk = id / KVT__REF_CHUNK;
  w->r = &k->r[id % KVT__REF_CHUNK];
  w->end = k->r + KVT__REF_CHUNK;
}

static inline kvt__ref *kvt__walk_next(const kvt_cache *c, kvt__ref_walk *w) {
  if (w->r == w->end) kvt__walk_from(c, w, kvt__chunk(c, w->chunk)->next * KVT__REF_CHUNK);
  return w->r++;
}

/* Id of the ref kvt__walk_next returned last. */
static inline uint32_t kvt__walk_id(const kvt__ref_walk *w) {
  return w->chunk * KVT__REF_CHUNK + (uint32_t)(w->r - 1 - (w->end - KVT__REF_CHUNK));
}

/* Backwards from ref id (inclusive) towards the request's first ref. */
static inline void kvt__walk_back_from(const kvt_cache *c, kvt__ref_walk *w, uint32_t id) {
  kvt__ref_chunk *k = kvt__chunk(c, id / KVT__REF_CHUNK);
  w->chunk = id / KVT__REF_CHUNK;
  w->r = &k->r[id % KVT__REF_CHUNK];
  w->end = k->r;
}

static inline kvt__ref *kvt__walk_prev(const kvt_cache *c, kvt__ref_walk *w) {
  kvt__ref *r = w->r;
  if (r == w->end) {
    uint32_t ch = kvt__chunk(c, w->chunk)->prev;
    if (ch != KVT__NONE) kvt__walk_back_from(c, w, ch * KVT__REF_CHUNK + KVT__REF_CHUNK - 1);
  } else {
    w->r--;
  }
  return r;
}

static inline int kvt__has_tier(const kvt_cache *c, int t) { return c->cap[t] > 0; }

#endif
