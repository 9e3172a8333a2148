/* The remote client under 4 threads sharing one client and one key space:
 * batches of puts, gets, exists and removes mixed at random, every hit
 * byte-exact (a block's content depends only on its key, whoever put it),
 * every op completed exactly once, the counters adding up. Run under TSan
 * in CI. */
#include <stdatomic.h>

#include "remote_fixture.h"

#define THREADS 4
#define KEYS 48
#define ROUNDS 150
#define MAXB 12

static kvt_redis srv;
static kvt__remote *cli;
static rf_geom geom;

typedef struct slot_done {
  atomic_int left;
  atomic_int *calls; /* per op: done() calls seen */
  int *status;
} slot_done;

typedef struct op_arg {
  slot_done *batch;
  int i;
} op_arg;

static void op_done(void *arg, int status) {
  op_arg *a = arg;
  a->batch->status[a->i] = status;
  atomic_fetch_add(&a->batch->calls[a->i], 1);
  atomic_fetch_sub(&a->batch->left, 1);
}

typedef struct worker {
  int id;
  uint64_t rng;
  uint64_t hits, misses, puts_ok, exists_found;
  int bad;
  const char *why;
} worker;

static uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void *work(void *arg) {
  worker *w = arg;
  void *recs[MAXB];
  for (int i = 0; i < MAXB; i++) recs[i] = rf_alloc(geom.rec);
  for (int round = 0; round < ROUNDS && !w->bad; round++) {
    int n = 1 + (int)(next(&w->rng) % MAXB), kind = (int)(next(&w->rng) % 8);
    kvt_key keys[MAXB];
    uint64_t ids[MAXB];
    for (int i = 0; i < n; i++) {
      ids[i] = next(&w->rng) % KEYS;
      keys[i] = rf_key(ids[i]);
    }
    if (kind == 0) { /* exists */
      uint8_t present[MAXB];
      int found = kvt__remote_exists(cli, keys, (uint32_t)n, present, 0);
      if (found < 0 || found > n) w->bad = 1, w->why = "exists count";
      w->exists_found += (uint64_t)(found > 0 ? found : 0);
      continue;
    }
    if (kind == 1) { /* remove a few */
      if (kvt__remote_remove(cli, keys, (uint32_t)(n < 3 ? n : 3)) < 0) w->bad = 1, w->why = "remove";
      continue;
    }
    int put = kind < 5;
    atomic_int calls[MAXB];
    int status[MAXB];
    slot_done b = {n, calls, status};
    op_arg args[MAXB];
    kvt__remote_io io[MAXB];
    for (int i = 0; i < n; i++) {
      atomic_init(&calls[i], 0);
      args[i] = (op_arg){&b, i};
      if (put)
        rf_record(recs[i], &geom, keys[i], ids[i]);
      else
        memset(recs[i], 0xee, KVT_RECORD_HDR_BYTES);
      io[i] = (kvt__remote_io){keys[i], recs[i], &args[i], 0};
    }
    int q = put ? kvt__remote_put(cli, io, (uint32_t)n, op_done) : kvt__remote_get(cli, io, (uint32_t)n, op_done);
    if (q < 0) {
      w->bad = 1, w->why = "submission";
      break;
    }
    for (int i = 0; i < n; i++)
      if (io[i].status) {
        status[i] = io[i].status;
        atomic_fetch_add(&calls[i], 1);
        atomic_fetch_sub(&b.left, 1);
      }
    for (int t = 0; atomic_load(&b.left) > 0; t++) {
      if (t > 60000) {
        w->bad = 1, w->why = "a batch did not complete within a minute: a hang";
        return NULL;
      }
      rf_sleep_ms(1);
    }
    for (int i = 0; i < n; i++) {
      if (atomic_load(&calls[i]) != 1) w->bad = 1, w->why = "an op completed more than once";
      if (put) {
        if (status[i] == 0) w->puts_ok++;
        else w->bad = 1, w->why = "a put failed";
      } else if (status[i] == 0) {
        w->hits++;
        if (!rf_payload_ok(recs[i], &geom, ids[i])) w->bad = 1, w->why = "a hit with wrong bytes";
      } else if (status[i] == KVT_EMISS) {
        w->misses++;
      } else {
        w->bad = 1, w->why = "a get failed";
      }
    }
  }
  for (int i = 0; i < MAXB; i++) free(recs[i]);
  return NULL;
}

static void four_threads(void **state) {
  assert_int_equal(kvt_redis_start(&srv, NULL), 0);
  geom = rf_geometry(16, 32 * 1024);
  kvt__remote_cfg cfg = rf_cfg(srv.url, (kvt_key){7, 7}, &geom);
  cfg.max_batch = 8; /* batches of 12 split in two round trips */
  cli = rf_open(&cfg);
  pthread_t th[THREADS];
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.id = i, .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)};
    assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  uint64_t hits = 0, misses = 0, puts = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    if (w[i].bad) fail_msg("thread %d: %s", i, w[i].why);
    hits += w[i].hits;
    misses += w[i].misses;
    puts += w[i].puts_ok;
  }
  kvt__remote_stats st;
  kvt__remote_get_stats(cli, &st);
  assert_int_equal(st.get_hits, hits);
  assert_int_equal(st.get_misses, misses);
  assert_int_equal(st.put_ok, puts);
  assert_int_equal(st.gets, hits + misses);
  assert_int_equal(st.errors + st.timeouts + st.get_corrupt + st.get_foreign, 0);
  assert_true(hits > 0 && puts > 0);
  kvt__remote_close(cli);
  kvt_redis_stop(&srv);
}

int main(void) {
  kvt_redis_require();
  const struct CMUnitTest tests[] = {cmocka_unit_test(four_threads)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
