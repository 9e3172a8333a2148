/* Operator metrics: the counting side (relaxed atomics, called from the read
 * path, the planner and transfer completions), and operator events noted
 * under the cache lock and logged once it is dropped. The text side is in
 * metrics_text.c. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "util/clock.h"

/* 50 us .. 5 s: a host copy of one small block to a large batch from a slow disk. */
const double kvt__lat_bounds_s[KVT__LAT_BOUNDS] = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
                                                    10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0,   5.0};

static void add(_Atomic uint64_t *a, uint64_t n) { atomic_fetch_add_explicit(a, n, memory_order_relaxed); }
/* A hit or miss: ordered after the acquire_blocks add before it (see emit in metrics_text.c). */
static void add_outcome(_Atomic uint64_t *a, uint64_t n) { atomic_fetch_add_explicit(a, n, memory_order_release); }

void kvt__metrics_acquire(kvt_cache *c, size_t n_blocks, size_t restore, uint32_t n_restored, int mismatch,
                          uint32_t n_dev) {
  kvt__metrics *m = &c->metrics;
  add(&m->acquire_blocks, n_blocks);
  /* Device hits are valid at once; host and disk hits count when their load lands. */
  if (n_dev) add_outcome(&m->hit_blocks[KVT__T_DEV], n_dev);
  if (n_blocks > restore) add_outcome(&m->miss_blocks[KVT__MISS_PLANNED], n_blocks - restore);
  uint64_t refused = mismatch && restore > n_restored ? 1 : 0;
  if (refused) add_outcome(&m->miss_blocks[KVT__MISS_MISMATCH], 1);
  if (restore > n_restored + refused) add_outcome(&m->miss_blocks[KVT__MISS_ABSENT], restore - n_restored - refused);
}

void kvt__metrics_plan(kvt_cache *c, const kvt_plan *plan) {
  if ((unsigned)plan->decision < 3) add(&c->metrics.decisions[plan->decision], 1);
  add(&c->metrics.plan_restore_blocks, plan->restore_blocks);
}

static int job_path(const kvt__job *jb, int disk) {
  if (disk == 2) return jb->kind == KVT__JOB_RPUT ? KVT__PATH_H2REMOTE : KVT__PATH_REMOTE2H;
  if (disk) return jb->kind == KVT__JOB_SPILL ? KVT__PATH_H2DISK : KVT__PATH_DISK2H;
  return jb->kind == KVT__JOB_STORE ? KVT__PATH_D2H : KVT__PATH_H2D;
}

void kvt__metrics_transfer(kvt_cache *c, const kvt__job *jb, int disk, int64_t ns) {
  int p = job_path(jb, disk), b = 0;
  if (ns < 0) ns = 0;
  double s = (double)ns * 1e-9;
  while (b < KVT__LAT_BOUNDS && s > kvt__lat_bounds_s[b]) b++;
  add(&c->metrics.lat_bucket[p][b], 1);
  add(&c->metrics.lat_sum_ns[p], (uint64_t)ns);
}

/* ---- operator events ---- */

#define EVENT_INTERVAL_NS 1000000000 /* at most one line per kind per second */

void kvt__event_note(kvt_cache *c, int kind, int status, uint64_t slot) {
  kvt__metrics *m = &c->metrics;
  m->ev_count[kind]++;
  m->ev_status[kind] = status;
  m->ev_slot[kind] = slot;
  atomic_store_explicit(&m->ev_pending, 1, memory_order_release);
}

typedef struct event_line {
  int kind, status;
  uint64_t count, slot;
} event_line;

static const char *const event_what[KVT__EV_KINDS] = {
    [KVT__EV_IO] = "disk I/O error", [KVT__EV_CHECKSUM] = "disk record failed its checksum",
    [KVT__EV_COPY] = "device copy error", [KVT__EV_REMOTE] = "remote tier error"};

static void flush(kvt_cache *c, int final) {
  kvt__metrics *m = &c->metrics;
  if (!atomic_load_explicit(&m->ev_pending, memory_order_acquire)) return;
  event_line lines[KVT__EV_KINDS];
  int n = 0, left = 0;
  int64_t now = kvt__now_ns();
  pthread_mutex_lock(&c->lock);
  for (int k = 0; k < KVT__EV_KINDS; k++) {
    if (!m->ev_count[k]) continue;
    if (!final && m->ev_last_ns[k] && now - m->ev_last_ns[k] < EVENT_INTERVAL_NS) {
      left = 1; /* reported with the next line of its kind */
      continue;
    }
    lines[n++] = (event_line){k, m->ev_status[k], m->ev_count[k], m->ev_slot[k]};
    m->ev_count[k] = 0;
    m->ev_last_ns[k] = now;
  }
  atomic_store_explicit(&m->ev_pending, (uint32_t)left, memory_order_relaxed);
  pthread_mutex_unlock(&c->lock);
  for (int i = 0; i < n; i++) {
    const event_line *l = &lines[i];
    char where[4096 + 64] = ""; /* a disk path of up to PATH_MAX, whole */
    if (l->slot != UINT64_MAX && c->disk_path)
      snprintf(where, sizeof where, " (slot %llu of %s)", (unsigned long long)l->slot, c->disk_path);
    if (l->count > 1)
      kvt__log_to(&c->log, KVT_LOG_ERROR, "%s%s: %s (%llu since the last report)", event_what[l->kind], where,
                  kvt_strerror(l->status), (unsigned long long)l->count);
    else
      kvt__log_to(&c->log, KVT_LOG_ERROR, "%s%s: %s", event_what[l->kind], where, kvt_strerror(l->status));
  }
}

void kvt__events_flush(kvt_cache *c) { flush(c, 0); }

/* At close: what the rate limit held back is reported now, not never. */
void kvt__events_flush_final(kvt_cache *c) { flush(c, 1); }
