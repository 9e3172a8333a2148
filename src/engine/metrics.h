/* Operator metrics and events: the counters behind kvt_metrics_write and the
 * log lines an operator reads.
 *
 * Counting is a relaxed atomic add on a per-cache counter: no lock of its
 * own, safe from any thread (API callers, copy workers, the disk reaper).
 * Most figures the exposition shows come from kvt_stats (kept under the
 * cache lock by the paths that already hold it); these counters add what
 * kvt_stats lacks: hits counted once a restore landed, misses by reason,
 * planner decisions and per-path transfer latency.
 *
 * Built with KVT_NO_METRICS (cmake -DKVT_METRICS=OFF) every KVT__M_* call
 * compiles to nothing, so a build can measure what counting costs. */
#ifndef KVT_ENGINE_METRICS_H
#define KVT_ENGINE_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvtier/kvtier.h"

struct kvt__job;

/* Why a keyed block of kvt_acquire was not restored. */
enum {
  KVT__MISS_ABSENT = 0,   /* in the restore range, not restored otherwise: not cached, or behind a block that was not restorable */
  KVT__MISS_PLANNED,      /* past the caller's restore count: the plan recomputes it */
  KVT__MISS_MISMATCH,     /* its stored tokens differ from the request's */
  KVT__MISS_LOAD_ERROR,   /* its copy failed (I/O, checksum, copy error) or was cut behind one */
  KVT__MISS_REASONS
};

/* Transfer paths, as (src, dst) tiers. */
/* The remote paths come last: they are shown only for a cache with a remote tier. */
enum { KVT__PATH_D2H = 0, KVT__PATH_H2D, KVT__PATH_H2DISK, KVT__PATH_DISK2H, KVT__PATH_REMOTE2H, KVT__PATH_H2REMOTE, KVT__PATHS };
#define KVT__LOCAL_PATHS 4

/* Upper bounds of the transfer latency buckets, seconds (+Inf follows). */
#define KVT__LAT_BOUNDS 14

/* Operator events that are rate-limited per cache (one line per second per kind). */
enum { KVT__EV_IO = 0, KVT__EV_CHECKSUM, KVT__EV_COPY, KVT__EV_REMOTE, KVT__EV_KINDS };

typedef struct kvt__metrics {
  _Atomic uint64_t acquire_blocks;
  _Atomic uint64_t hit_blocks[4];                 /* by tier (remote last), once the block is valid on the device */
  _Atomic uint64_t miss_blocks[KVT__MISS_REASONS];
  _Atomic uint64_t decisions[3];                  /* kvt_decision of kvt_plan_request */
  _Atomic uint64_t plan_restore_blocks;
  _Atomic uint64_t lat_bucket[KVT__PATHS][KVT__LAT_BOUNDS + 1]; /* not cumulative; last is +Inf */
  _Atomic uint64_t lat_sum_ns[KVT__PATHS];
  /* Events noted under c->lock, logged by kvt__events_flush once it is dropped. */
  _Atomic uint32_t ev_pending;
  uint64_t ev_count[KVT__EV_KINDS];  /* noted since the last line of that kind (c->lock) */
  int ev_status[KVT__EV_KINDS];      /* the latest one's code (c->lock) */
  uint64_t ev_slot[KVT__EV_KINDS];   /* its disk slot, or UINT64_MAX (c->lock) */
  int64_t ev_last_ns[KVT__EV_KINDS]; /* when a line of that kind was last logged (c->lock) */
} kvt__metrics;

extern const double kvt__lat_bounds_s[KVT__LAT_BOUNDS];

#ifdef KVT_NO_METRICS
#define KVT__M_ADD(c, field, n) ((void)(c))
#define KVT__M_ACQUIRE(c, n_blocks, restore, n_restored, mismatch, n_dev) ((void)(c))
#define KVT__M_PLAN(c, plan) ((void)(c))
#define KVT__M_TRANSFER(c, jb, path, ns) ((void)(c))
#else
/* Release: a hit or miss counted here is ordered after its block's
 * acquire_blocks add, which a scrape reads last (metrics_text.c). */
#define KVT__M_ADD(c, field, n) \
  atomic_fetch_add_explicit(&(c)->metrics.field, (uint64_t)(n), memory_order_release)
#define KVT__M_ACQUIRE(c, n_blocks, restore, n_restored, mismatch, n_dev) \
  kvt__metrics_acquire(c, n_blocks, restore, n_restored, mismatch, n_dev)
#define KVT__M_PLAN(c, plan) kvt__metrics_plan(c, plan)
#define KVT__M_TRANSFER(c, jb, path, ns) kvt__metrics_transfer(c, jb, path, ns)
#endif

/* kvt_acquire counted: n_blocks keyed, `restore` asked for, n_restored
 * pinned for restoring (n_dev of them device hits), mismatch 1 when
 * verification stopped the restore. */
void kvt__metrics_acquire(kvt_cache *c, size_t n_blocks, size_t restore, uint32_t n_restored, int mismatch,
                          uint32_t n_dev);
void kvt__metrics_plan(kvt_cache *c, const kvt_plan *plan);
/* A transfer job's phase finished after ns: path 0 device copy, 1 disk I/O, 2 remote I/O. */
void kvt__metrics_transfer(kvt_cache *c, const struct kvt__job *jb, int path, int64_t ns);

/* Notes an operator event (c->lock held): kind KVT__EV_*, its code, the disk
 * slot involved (UINT64_MAX: none). Logged by the next kvt__events_flush. */
void kvt__event_note(kvt_cache *c, int kind, int status, uint64_t slot);
/* Logs the events noted so far (c->lock NOT held: the handler runs outside it). */
void kvt__events_flush(kvt_cache *c);
/* The same, ignoring the rate limit (kvt_close, once transfers are drained). */
void kvt__events_flush_final(kvt_cache *c);

#endif
