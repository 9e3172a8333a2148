/* The remote tier's client against a real Redis Cluster (3 masters, 3
 * replicas, a password): keys spread over every master by hash slot, the
 * client's slot function agrees with the server's, MOVED and ASK followed
 * during a real slot migration, and a master killed mid-run: requests keep
 * completing (misses allowed, never a hang) and after the failover the
 * promoted replica is used. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>

#include "remote_fixture.h"

#define PASS "cluster-pw"
static kvt_redis cl;
static char url[1200];
static const kvt_key NS = {0x3333, 0xcccc};

static int setup_cluster(void **state) {
  kvt_redis_opts o = {.requirepass = PASS, .node_timeout_ms = 1000};
  if (kvt_redis_cluster_start(&cl, 3, 1, &o) != 0) return -1;
  snprintf(url, sizeof url, "redis://:" PASS "@%s", cl.url + strlen("redis://"));
  return 0;
}

static int teardown_cluster(void **state) {
  kvt_redis_stop(&cl);
  return 0;
}

/* timeout_ms: long where no fault is expected (a loaded machine must not
 * make one), short where a node dies. */
static kvt__remote *cluster_client(const rf_geom *g, uint32_t timeout_ms) {
  kvt__remote_cfg cfg = rf_cfg(url, NS, g);
  cfg.timeout_ms = timeout_ms;
  cfg.backoff_min_ms = 20;
  cfg.backoff_max_ms = 200;
  return rf_open(&cfg);
}

static int is_master(int i) {
  char out[4096];
  return kvt_redis_cmd(&cl, i, out, sizeof out, "ROLE") == 0 && strncmp(out, "master", 6) == 0;
}

/* The client's hash slot is the server's, hash tags included. */
static void slots_agree(void **state) {
  const char *keys[] = {"kvt:0:0", "a", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "{}x", "x{y"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    char out[64];
    assert_int_equal(kvt_redis_cmd(&cl, 0, out, sizeof out, "CLUSTER KEYSLOT %s", keys[i]), 0);
    assert_int_equal(kvt__remote_hash_slot(keys[i], strlen(keys[i])), atoi(out));
  }
}

/* 60 blocks land on all 3 masters and come back byte for byte. */
static void keys_spread(void **state) {
  rf_geom g = rf_geometry(16, 64 * 1024);
  kvt__remote *r = cluster_client(&g, 10000);
  enum { N = 60 };
  void *recs[N];
  kvt_key keys[N];
  for (int i = 0; i < N; i++) {
    keys[i] = rf_key(100 + (uint64_t)i);
    recs[i] = rf_alloc(g.rec);
    rf_record(recs[i], &g, keys[i], 100 + (uint64_t)i);
  }
  rf_put(r, recs, keys, N);
  for (int i = 0; i < N; i++) assert_int_equal(rf_w.status[i], 0);
  for (int i = 0; i < N; i++) memset(recs[i], 0, g.rec);
  rf_get(r, recs, keys, N);
  for (int i = 0; i < N; i++) {
    assert_int_equal(rf_w.status[i], 0);
    assert_true(rf_payload_ok(recs[i], &g, 100 + (uint64_t)i));
  }
  int masters = 0;
  for (int i = 0; i < cl.n; i++) {
    if (!is_master(i)) continue;
    char out[64];
    assert_int_equal(kvt_redis_cmd(&cl, i, out, sizeof out, "DBSIZE"), 0);
    assert_true(atoi(out) > 0);
    masters++;
  }
  assert_int_equal(masters, 3);
  uint8_t present[N];
  assert_int_equal(kvt__remote_exists(r, keys, N, present, 0), N);
  kvt__remote_stats st;
  kvt__remote_get_stats(r, &st);
  assert_int_equal(st.cluster, 1);
  assert_int_equal(st.nodes, 3);
  assert_int_equal(st.nodes_degraded, 0);
  assert_int_equal(st.moved, 0);
  for (int i = 0; i < N; i++) free(recs[i]);
  kvt__remote_close(r);
}

static void node_id(int i, char *id, size_t cap) {
  assert_int_equal(kvt_redis_cmd(&cl, i, id, cap, "CLUSTER MYID"), 0);
}

/* A slot moves from one master to another while the client works: a key
 * already migrated is answered with ASK (the client sends ASKING and gets it
 * from the target), a key not yet migrated from the source; once the slot
 * belongs to the target, the source answers MOVED and the client learns. */
static void migration_moved_ask(void **state) {
  rf_geom g = rf_geometry(16, 4096);
  kvt__remote *r = cluster_client(&g, 10000);
  /* two blocks in one slot */
  kvt_key k[2];
  char ks[2][128];
  uint16_t first_slot[4096];
  int found = 0;
  for (uint64_t i = 0; i < 4096 && !found; i++) {
    kvt_key key = rf_key(20000 + i);
    kvt__remote_key_string(r, &key, ks[0], sizeof ks[0]);
    first_slot[i] = kvt__remote_hash_slot(ks[0], strlen(ks[0]));
    for (uint64_t j = 0; j < i && !found; j++)
      if (first_slot[j] == first_slot[i]) {
        k[0] = rf_key(20000 + j);
        k[1] = key;
        found = 1;
      }
  }
  assert_true(found);
  for (int i = 0; i < 2; i++) kvt__remote_key_string(r, &k[i], ks[i], sizeof ks[i]);
  int slot = kvt__remote_hash_slot(ks[0], strlen(ks[0]));
  void *recs[2] = {rf_alloc(g.rec), rf_alloc(g.rec)};
  for (int i = 0; i < 2; i++) rf_record(recs[i], &g, k[i], 50 + (uint64_t)i);
  rf_put(r, recs, k, 2);
  assert_int_equal(rf_w.status[0], 0);
  assert_int_equal(rf_w.status[1], 0);

  int src = kvt_redis_slot_master(&cl, 0, slot), dst = -1;
  assert_true(src >= 0);
  for (int i = 0; i < cl.n && dst < 0; i++)
    if (i != src && is_master(i)) dst = i;
  assert_true(dst >= 0);
  char src_id[64], dst_id[64], out[256];
  node_id(src, src_id, sizeof src_id);
  node_id(dst, dst_id, sizeof dst_id);
  assert_int_equal(kvt_redis_cmd(&cl, dst, out, sizeof out, "CLUSTER SETSLOT %d IMPORTING %s", slot, src_id), 0);
  assert_int_equal(kvt_redis_cmd(&cl, src, out, sizeof out, "CLUSTER SETSLOT %d MIGRATING %s", slot, dst_id), 0);
  assert_int_equal(kvt_redis_cmd(&cl, src, out, sizeof out, "MIGRATE 127.0.0.1 %d %s 0 5000 AUTH %s KEYS %s",
                                 cl.node[dst].port, "", PASS, ks[0]),
                   0);

  /* k0 is on the target now (ASK), k1 still on the source */
  for (int i = 0; i < 2; i++) memset(recs[i], 0, g.rec);
  rf_get(r, recs, k, 2);
  assert_int_equal(rf_w.status[0], 0);
  assert_int_equal(rf_w.status[1], 0);
  assert_true(rf_payload_ok(recs[0], &g, 50));
  assert_true(rf_payload_ok(recs[1], &g, 51));
  kvt__remote_stats st;
  kvt__remote_get_stats(r, &st);
  assert_true(st.ask >= 1);
  assert_int_equal(st.moved, 0);
  uint8_t present[2];
  assert_int_equal(kvt__remote_exists(r, k, 2, present, 0), 2); /* EXISTS follows ASK too */

  /* the rest moves, the slot is the target's */
  assert_int_equal(kvt_redis_cmd(&cl, src, out, sizeof out, "MIGRATE 127.0.0.1 %d %s 0 5000 AUTH %s KEYS %s",
                                 cl.node[dst].port, "", PASS, ks[1]),
                   0);
  for (int i = 0; i < cl.n; i++)
    if (is_master(i))
      assert_int_equal(kvt_redis_cmd(&cl, i, out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, dst_id), 0);
  for (int i = 0; i < 2; i++) memset(recs[i], 0, g.rec);
  rf_get(r, recs, k, 2);
  assert_int_equal(rf_w.status[0], 0);
  assert_int_equal(rf_w.status[1], 0);
  assert_true(rf_payload_ok(recs[1], &g, 51));
  kvt__remote_get_stats(r, &st);
  assert_true(st.moved >= 1);
  uint64_t moved = st.moved;
  /* learnt: the next gets go straight to the target */
  rf_get(r, recs, k, 2);
  assert_int_equal(rf_w.status[0], 0);
  kvt__remote_get_stats(r, &st);
  assert_int_equal(st.moved, moved);
  assert_int_equal(st.get_hits, 6);
  free(recs[0]);
  free(recs[1]);
  kvt__remote_close(r);
}

/* ---- a master killed mid-run ---- */

typedef struct runner {
  kvt__remote *r;
  rf_geom g;
  atomic_int stop;
  atomic_int rounds, clean_rounds_after; /* rounds with every op ok, counted after arm */
  atomic_int armed;
  atomic_uint_fast64_t ok, failed;
  atomic_int bad; /* cmocka's asserts belong to the main thread: the runner counts */
  const char *why;
} runner;

static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t run_cv = PTHREAD_COND_INITIALIZER;
static int run_left;
static int run_status[32];

static void run_done(void *arg, int status) {
  pthread_mutex_lock(&run_mu);
  run_status[(uintptr_t)arg] = status;
  if (--run_left == 0) pthread_cond_signal(&run_cv);
  pthread_mutex_unlock(&run_mu);
}

/* Puts then gets 24 blocks, round after round, each batch waited for. */
static void *run_main(void *arg) {
  runner *u = arg;
  enum { N = 24 };
  void *recs[N];
  kvt_key keys[N];
  for (int i = 0; i < N; i++) {
    keys[i] = rf_key(30000 + (uint64_t)i);
    recs[i] = rf_alloc(u->g.rec);
  }
  while (!atomic_load(&u->stop)) {
    int all_ok = 1;
    for (int phase = 0; phase < 2; phase++) {
      kvt__remote_io io[N];
      pthread_mutex_lock(&run_mu);
      run_left = N;
      pthread_mutex_unlock(&run_mu);
      for (int i = 0; i < N; i++) {
        if (phase == 0) rf_record(recs[i], &u->g, keys[i], 30000 + (uint64_t)i);
        io[i] = (kvt__remote_io){keys[i], recs[i], (void *)(uintptr_t)i, 0};
      }
      int q = phase == 0 ? kvt__remote_put(u->r, io, N, run_done) : kvt__remote_get(u->r, io, N, run_done);
      if (q < 0) {
        u->why = "a submission failed";
        atomic_fetch_add(&u->bad, 1);
        return NULL;
      }
      for (int i = 0; i < N; i++)
        if (io[i].status) run_done((void *)(uintptr_t)i, io[i].status);
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 60;
      pthread_mutex_lock(&run_mu);
      while (run_left > 0)
        if (pthread_cond_timedwait(&run_cv, &run_mu, &ts) != 0) break;
      int left = run_left;
      int st[N];
      memcpy(st, run_status, sizeof st);
      pthread_mutex_unlock(&run_mu);
      if (left > 0) {
        u->why = "a batch did not complete within a minute: a hang";
        atomic_fetch_add(&u->bad, 1);
        return NULL; /* its records stay: the client may still write them */
      }
      for (int i = 0; i < N; i++) {
        if (st[i] == 0) {
          atomic_fetch_add(&u->ok, 1);
          if (phase == 1 && !rf_payload_ok(recs[i], &u->g, 30000 + (uint64_t)i)) {
            u->why = "a hit with wrong bytes";
            atomic_fetch_add(&u->bad, 1);
          }
        } else {
          if (st[i] != KVT_EREMOTE && st[i] != KVT_ETIMEDOUT && st[i] != KVT_EMISS) {
            u->why = "a status that is neither success nor a miss";
            atomic_fetch_add(&u->bad, 1);
          }
          atomic_fetch_add(&u->failed, 1);
          all_ok = 0;
        }
      }
    }
    atomic_fetch_add(&u->rounds, 1);
    if (all_ok && atomic_load(&u->armed)) atomic_fetch_add(&u->clean_rounds_after, 1);
  }
  for (int i = 0; i < N; i++) free(recs[i]);
  return NULL;
}

static void master_killed(void **state) {
  runner u;
  memset(&u, 0, sizeof u);
  u.g = rf_geometry(16, 64 * 1024);
  u.r = cluster_client(&u.g, 1000);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, run_main, &u), 0);
  while (atomic_load(&u.rounds) < 3 && !atomic_load(&u.bad)) rf_sleep_ms(10);

  /* the master of the first block's slot dies while rounds are in flight */
  char key[128];
  kvt_key k0 = rf_key(30000);
  kvt__remote_key_string(u.r, &k0, key, sizeof key);
  int slot = kvt__remote_hash_slot(key, strlen(key));
  int victim = kvt_redis_slot_master(&cl, 0, slot);
  assert_true(victim >= 0);
  kvt_redis_signal(&cl, victim, SIGKILL);
  int other = victim == 0 ? 1 : 0;

  /* a replica takes over */
  int promoted = -1;
  for (int t = 0; t < 600 && (promoted < 0 || promoted == victim); t++) {
    promoted = kvt_redis_slot_master(&cl, other, slot);
    if (promoted < 0 || promoted == victim) rf_sleep_ms(50);
  }
  assert_true(promoted >= 0 && promoted != victim);
  assert_int_equal(kvt_redis_wait_cluster_ok(&cl, 30000), 0);

  /* the client finds the new master by itself: whole rounds succeed again */
  atomic_store(&u.armed, 1);
  for (int t = 0; t < 600 && atomic_load(&u.clean_rounds_after) < 2 && !atomic_load(&u.bad); t++) rf_sleep_ms(50);
  atomic_store(&u.stop, 1);
  pthread_join(th, NULL);
  if (atomic_load(&u.bad)) fail_msg("%s", u.why);
  assert_true(atomic_load(&u.clean_rounds_after) >= 2);
  kvt__remote_stats st;
  kvt__remote_get_stats(u.r, &st);
  assert_true(st.refreshes >= 1);
  assert_true(st.errors + st.timeouts > 0); /* the dead master's blocks failed meanwhile */
  assert_int_equal(st.nodes, 3);
  assert_int_equal(st.nodes_degraded, 0);
  kvt__remote_close(u.r);
}

int main(void) {
  kvt_redis_require();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(slots_agree),
      cmocka_unit_test(keys_spread),
      cmocka_unit_test(migration_moved_ask),
      cmocka_unit_test(master_killed), /* last: it leaves the cluster with a node less */
  };
  return cmocka_run_group_tests(tests, setup_cluster, teardown_cluster);
}
