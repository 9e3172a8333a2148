/* Objects under concurrency: 4 threads put, find, get and remove objects
 * of 6 shared conversations through a small host tier and a disk tier,
 * with 64 KiB parts and page-aligned buffers (so gets and puts register
 * their memory and move parts straight to and from the file while other
 * threads do the same), so puts and removes of one key race gets of it.
 * An object is put with bytes that depend only on its conversation and
 * its length, so every get that succeeds must return exactly the bytes of
 * the length find described; a race may only make it a miss.
 * KVT_STRESS_SCALE scales the iterations (CI: 0.25 under TSan). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kvtier/kvtier.h"

#define BT 16
#define BLOCK 65536u
#define CONVS 6
#define NTOK (8 * BT)
#define THREADS 4

static kvt_cache *cache;
static uint32_t toks[CONVS][NTOK];
static int iters = 400;

/* Conversation v's object of len bytes: its seed. */
static uint64_t seed_of(int v, size_t len) { return (uint64_t)v * 1000003u + len; }

static size_t len_of(int v, unsigned r) { return (size_t)(v + 1) * 23456u + (r % 3) * BLOCK; }

typedef struct worker {
  unsigned id;
  int hits, misses, bad;
} worker;

static void *run(void *arg) {
  worker *w = arg;
  unsigned r = w->id * 7919u + 1;
  size_t cap = 8 * BLOCK;
  char *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, cap)) return NULL;
  for (int i = 0; i < iters; i++) {
    r = r * 1103515245u + 12345u;
    int v = (int)((r >> 16) % CONVS), op = (int)((r >> 8) % 8);
    if (op == 0) {
      kvt_object_remove(cache, toks[v], NTOK);
    } else if (op <= 2) {
      size_t len = len_of(v, r >> 4);
      kvt_test_fill(buf, len, seed_of(v, len));
      int rc = kvt_object_put(cache, toks[v], NTOK, buf, len);
      /* KVT_EAGAIN: another thread's get or put held parts of the key. */
      if (rc != 0 && rc != 1 && rc != KVT_ENOSPACE && rc != KVT_EAGAIN) w->bad++;
    } else {
      kvt_object_info info = {.size = sizeof info};
      int rc = kvt_object_find(cache, toks[v], NTOK, &info);
      if (rc == KVT_EMISS) {
        w->misses++;
        continue;
      }
      if (rc != 0 || info.bytes > cap) {
        w->bad++;
        continue;
      }
      rc = kvt_object_get(cache, &info, toks[v], buf, cap);
      if (rc == 0) {
        w->hits++;
        if (!kvt_test_check(buf, info.bytes, seed_of(v, info.bytes))) w->bad++;
      } else if (rc == KVT_EMISS || rc == KVT_ECORRUPT) {
        w->misses++; /* evicted, removed or put again since find */
      } else {
        w->bad++;
      }
    }
  }
  free(buf);
  return NULL;
}

static void threads_put_find_get_and_remove_objects(void **s) {
  (void)s;
  const char *scale = getenv("KVT_STRESS_SCALE");
  if (scale && atof(scale) > 0) iters = (int)(iters * atof(scale)) + 1;
  char path[4200];
  snprintf(path, sizeof path, "%s/conc_object.kvt", kvt_test_tmpdir());
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "conc-object";
  cfg.block_tokens = BT;
  cfg.host_blocks = 12;
  cfg.disk_path = path;
  cfg.disk_blocks = 48;
  cfg.disk_reset = 1;
  cfg.copy_threads = 2;
  assert_int_equal(kvt_open(&cfg, &cache), 0);
  kvt_segment seg = {NULL, 0, BLOCK};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.segments = &seg;
  l.flags = KVT_LAYOUT_STORAGE;
  assert_int_equal(kvt_register_layout(cache, &l), 0);
  for (int v = 0; v < CONVS; v++)
    for (int t = 0; t < NTOK; t++) toks[v][t] = (uint32_t)(v * 7777 + t * 3 + 1);
  pthread_t th[THREADS];
  worker w[THREADS];
  for (unsigned i = 0; i < THREADS; i++) {
    w[i] = (worker){.id = i};
    assert_int_equal(pthread_create(&th[i], NULL, run, &w[i]), 0);
  }
  int hits = 0;
  for (unsigned i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].bad, 0);
    hits += w[i].hits;
  }
  assert_true(hits > 0);
  /* Whatever the races left reads back exactly, or is refused whole (a
   * get refuses parts that are not all of one put: KVT_ECORRUPT, removed;
   * puts, removes and gets of one key exclude each other, so races should
   * leave none). Never other bytes. */
  char *buf = NULL;
  assert_int_equal(posix_memalign((void **)&buf, 4096, 8 * BLOCK), 0);
  for (int v = 0; v < CONVS; v++) {
    kvt_object_info info = {.size = sizeof info};
    if (kvt_object_find(cache, toks[v], NTOK, &info) != 0) continue;
    int rc = kvt_object_get(cache, &info, toks[v], buf, 8 * BLOCK);
    if (rc == KVT_ECORRUPT) {
      assert_int_equal(kvt_object_find(cache, toks[v], NTOK, &info), KVT_EMISS);
      continue;
    }
    assert_int_equal(rc, 0);
    assert_true(kvt_test_check(buf, info.bytes, seed_of(v, info.bytes)));
  }
  free(buf);
  kvt_close(cache);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(threads_put_find_get_and_remove_objects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
