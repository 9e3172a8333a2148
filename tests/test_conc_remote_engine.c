/* Four threads, two caches sharing one Redis server (the harness's): each
 * thread runs requests on conversations the others also run, offloads them,
 * and small host tiers push blocks to the server while other threads fetch
 * them back. Every restored block is checked byte for byte; the tier maps'
 * invariants hold at the end. Meant for the TSan build too. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "kv_fixture.h"
#include "redis_harness.h"

#define NB 4
#define CONVS 10
#define ROUNDS 60

static kvt_redis srv;
static fixture caches[2];
static _Atomic uint64_t bad_bytes, failures, restored;

typedef struct worker {
  fixture *f;
  uint32_t seed;
} worker;

/* One request on conversation conv: restore, verify, compute the rest, commit. */
static void one_request(fixture *f, uint32_t conv, int offload) {
  kvt_key keys[NB];
  uint32_t tok[NB * 16], slots[NB], ready = 0;
  size_t nk = 0;
  conv_tokens(tok, NB * f->bt, conv);
  if (kvt_hash_tokens(f->c, NULL, tok, NB * f->bt, keys, NB, &nk) != 0) {
    failures++;
    return;
  }
  kvt_req r;
  int rc = kvt_acquire(f->c, keys, tok, NB, NB, 0, 0, &r, slots, NULL);
  if (rc == KVT_ENOSPACE) return; /* every device slot pinned by the other thread: try later */
  if (rc != 0 && rc != 1) {
    failures++;
    return;
  }
  if (kvt_request_wait(f->c, r, -1, &ready) != 0) failures++;
  for (uint32_t i = 0; i < ready; i++)
    if (!fixture_check(f, slots[i], block_seed(conv, i))) bad_bytes++;
  restored += ready;
  /* Blocks shared with another request are valid already; compute ours. */
  for (uint32_t i = ready; i < NB; i++) fixture_write(f, slots[i], block_seed(conv, i));
  if (kvt_commit(f->c, r, NB, NULL) != 0) failures++;
  if (kvt_release(f->c, r) != 0) failures++;
  if (offload) {
    kvt_job j;
    rc = kvt_store(f->c, keys, NB, KVT_STORE_EVICT, &j);
    if (rc == 1) {
      kvt_job_wait(f->c, j, -1);
      kvt_job_release(f->c, j);
    } else if (rc < 0 && rc != KVT_EAGAIN && rc != KVT_ENOSPACE) {
      failures++;
    }
  }
}

static void *run(void *arg) {
  worker *w = arg;
  uint32_t x = w->seed;
  for (int i = 0; i < ROUNDS; i++) {
    x = x * 1664525u + 1013904223u;
    uint32_t conv = (x >> 8) % CONVS;
    one_request(w->f, conv + 1, (x >> 20) & 1);
    if (((x >> 24) & 7) == 0) {
      kvt_job j;
      kvt_key keys[NB];
      uint32_t tok[NB * 16];
      size_t nk;
      conv_tokens(tok, NB * w->f->bt, conv + 1);
      if (kvt_hash_tokens(w->f->c, NULL, tok, NB * w->f->bt, keys, NB, &nk) == 0 &&
          kvt_prefetch(w->f->c, keys, NB, &j) == 1) {
        kvt_job_wait(w->f->c, j, -1);
        kvt_job_release(w->f->c, j);
      }
    }
  }
  return NULL;
}

static void four_threads_two_caches_one_server(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    kvt_config cfg = fixture_config(NB);
    cfg.remote_url = srv.url;
    cfg.remote_timeout_ms = 2000;
    cfg.remote_negative_ms = 1;
    cfg.copy_threads = 2;
    fixture_open_cfg(&caches[k], &cfg, 4 * NB);
  }
  pthread_t th[4];
  worker w[4];
  for (int t = 0; t < 4; t++) {
    w[t] = (worker){&caches[t % 2], 0x9e3779b9u * (uint32_t)(t + 1)};
    assert_int_equal(pthread_create(&th[t], NULL, run, &w[t]), 0);
  }
  for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
  assert_int_equal(atomic_load(&bad_bytes), 0);
  assert_int_equal(atomic_load(&failures), 0);
  assert_true(atomic_load(&restored) > 0);
  uint64_t from_remote = 0, to_remote = 0;
  for (int k = 0; k < 2; k++) {
    kvt_drain(caches[k].c);
    kvt_stats st = fixture_stats(&caches[k]);
    from_remote += st.blocks_remote2h;
    to_remote += st.blocks_h2remote;
    assert_int_equal(st.remote_corrupt, 0);
  }
  assert_true(to_remote > 0);
  assert_true(from_remote > 0);
  print_message("restored %llu blocks, %llu fetched from the server, %llu put\n",
                (unsigned long long)atomic_load(&restored), (unsigned long long)from_remote,
                (unsigned long long)to_remote);
  for (int k = 0; k < 2; k++) fixture_close(&caches[k]);
}

int main(void) {
  kvt_redis_require();
  if (kvt_redis_start(&srv, NULL) != 0) return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(four_threads_two_caches_one_server)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  kvt_redis_stop(&srv);
  return rc;
}
