/* What the remote tier's tests share: records to store, a client open on a
 * harness server, and waiting for completions. */
#ifndef KVT_TEST_REMOTE_FIXTURE_H
#define KVT_TEST_REMOTE_FIXTURE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "redis_harness.h"
#include "remote/remote.h"
#include "store/record.h"

/* Counts completions; statuses land in status[index] (arg = index). */
typedef struct rf_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t done;
  int status[4096];
} rf_wait;

static rf_wait rf_w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, {0}};

static inline void rf_done(void *arg, int status) {
  uintptr_t i = (uintptr_t)arg;
  pthread_mutex_lock(&rf_w.mu);
  rf_w.status[i] = status;
  rf_w.done++;
  pthread_cond_broadcast(&rf_w.cv);
  pthread_mutex_unlock(&rf_w.mu);
}

static inline void rf_reset(void) {
  pthread_mutex_lock(&rf_w.mu);
  rf_w.done = 0;
  for (int i = 0; i < 4096; i++) rf_w.status[i] = 1; /* not yet */
  pthread_mutex_unlock(&rf_w.mu);
}

/* Waits for n completions. A minute is no bound on the client (the tests
 * never assert times): it is how long a test waits before calling a hang. */
static inline void rf_wait_n(uint32_t n) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 60;
  pthread_mutex_lock(&rf_w.mu);
  while (rf_w.done < n)
    if (pthread_cond_timedwait(&rf_w.cv, &rf_w.mu, &ts) != 0) break;
  uint32_t got = rf_w.done;
  pthread_mutex_unlock(&rf_w.mu);
  if (got < n) fail_msg("only %u of %u remote ops completed within a minute: a hang", got, n);
}

typedef struct rf_geom {
  uint32_t bt;
  uint64_t payload;
  size_t rec;
} rf_geom;

static inline rf_geom rf_geometry(uint32_t bt, uint64_t payload) {
  rf_geom g = {bt, payload, kvt__record_bytes(bt, (size_t)payload)};
  return g;
}

static inline void *rf_alloc(size_t bytes) {
  void *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  assert_non_null(p);
  memset(p, 0, bytes);
  return p;
}

static inline kvt_key rf_key(uint64_t i) {
  kvt_key k = {0x1234567800000000ull + i, 0xabcdef0000000000ull ^ (i * 0x9e3779b97f4a7c15ull)};
  return k;
}

/* An unsealed record image of block key with a pattern from seed. */
static inline void rf_record(void *rec, const rf_geom *g, kvt_key key, uint64_t seed) {
  memset(rec, 0, KVT_RECORD_HDR_BYTES);
  kvt__record_hdr *h = rec;
  h->key = key;
  h->parent = rf_key(seed ^ 0x55);
  h->flags = KVT_RECORD_F_TOKENS;
  h->token_count = g->bt;
  uint32_t *t = kvt__record_tokens(rec);
  for (uint32_t i = 0; i < g->bt; i++) t[i] = (uint32_t)(seed * 31 + i);
  kvt_test_fill(kvt__record_payload(rec, g->bt), g->payload, seed);
}

static inline int rf_payload_ok(void *rec, const rf_geom *g, uint64_t seed) {
  return kvt_test_check(kvt__record_payload(rec, g->bt), g->payload, seed);
}

static inline kvt__remote_cfg rf_cfg(const char *url, kvt_key ns, const rf_geom *g) {
  kvt__remote_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.url = url;
  cfg.ns = ns;
  cfg.block_tokens = g->bt;
  cfg.payload_bytes = g->payload;
  /* Tests that are not about faults must not see one on a loaded machine
   * (sanitizers, parallel tests): a long timeout. Fault tests set theirs. */
  cfg.timeout_ms = 10000;
  return cfg;
}

static inline kvt__remote *rf_open(const kvt__remote_cfg *cfg) {
  char detail[256] = "";
  kvt__remote_cfg c = *cfg;
  c.detail = detail;
  c.detail_len = sizeof detail;
  kvt__remote *r = NULL;
  int rc = kvt__remote_open(&c, &r);
  if (rc) fail_msg("kvt__remote_open(%s): %d (%s)", cfg->url, rc, detail);
  return r;
}

/* Synchronous batch helpers: the statuses in rf_w.status[0..n). */
static inline void rf_put(kvt__remote *r, void **recs, const kvt_key *keys, uint32_t n) {
  kvt__remote_io io[256];
  assert_true(n <= 256);
  rf_reset();
  for (uint32_t i = 0; i < n; i++) io[i] = (kvt__remote_io){keys[i], recs[i], (void *)(uintptr_t)i, 0};
  int q = kvt__remote_put(r, io, n, rf_done);
  assert_true(q >= 0);
  for (uint32_t i = 0; i < n; i++)
    if (io[i].status) rf_done((void *)(uintptr_t)i, io[i].status);
  rf_wait_n(n);
}

static inline void rf_get(kvt__remote *r, void **recs, const kvt_key *keys, uint32_t n) {
  kvt__remote_io io[256];
  assert_true(n <= 256);
  rf_reset();
  for (uint32_t i = 0; i < n; i++) io[i] = (kvt__remote_io){keys[i], recs[i], (void *)(uintptr_t)i, 0};
  int q = kvt__remote_get(r, io, n, rf_done);
  assert_true(q >= 0);
  for (uint32_t i = 0; i < n; i++)
    if (io[i].status) rf_done((void *)(uintptr_t)i, io[i].status);
  rf_wait_n(n);
}

static inline void rf_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

#endif
