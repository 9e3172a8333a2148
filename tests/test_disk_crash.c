/* Crash consistency of the disk store: a forked child writes records in a
 * loop and reports each completed slot through a pipe; the parent SIGKILLs
 * it at a seeded random point, reopens the file, and checks that every
 * reported record is recovered byte-exact and that no slot ever reads back
 * wrong bytes (a torn record is discarded, or fails its checksum). */
#include "helpers.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/disk_store.h"

#define BT 16u
#define PAYLOAD (512u * 1024u) /* long writes: more chances to be killed mid-way */
#define SLOTS 48u
#define ITERS 6

static const kvt_key NS = {0xc0ffee, 0x5eed};
static char g_path[4200];
static int g_pipe = -1;

static kvt_key key_of(uint64_t seed) { return (kvt_key){seed * 0x9e3779b97f4a7c15ull + 1, seed}; }

static void make_rec(void *rec, uint64_t seed) {
  kvt__record_hdr *h = rec;
  memset(h, 0, sizeof *h);
  h->key = key_of(seed);
  h->parent = key_of(seed ^ 0xffff);
  h->flags = KVT_RECORD_F_TOKENS;
  h->token_count = BT;
  for (uint32_t t = 0; t < BT; t++) kvt__record_tokens(rec)[t] = (uint32_t)(seed + t);
  kvt_test_fill(kvt__record_payload(rec, BT), PAYLOAD, seed);
}

static kvt__disk_cfg cfg_for(kvt_disk_backend be, int reset) {
  return (kvt__disk_cfg){.path = g_path, .slots = SLOTS, .block_tokens = BT, .payload_bytes = PAYLOAD,
                         .ns = NS, .queue_depth = 8, .backend = be, .reset = reset};
}

/* ---- the child ---- */

typedef struct child_slot {
  uint32_t slot;
  pthread_mutex_t *m;
  pthread_cond_t *c;
  int *busy;
} child_slot;

static void child_done(void *arg, int status) {
  child_slot *s = arg;
  if (status == 0 && write(g_pipe, &s->slot, sizeof s->slot) != sizeof s->slot) _exit(3);
  pthread_mutex_lock(s->m);
  s->busy[s->slot % 8] = 0;
  pthread_cond_signal(s->c);
  pthread_mutex_unlock(s->m);
}

/* Writes slot 0, 1, ... with up to 8 in flight, then waits to be killed. */
static void child_main(kvt_disk_backend be, uint64_t base) {
  kvt__disk *d;
  kvt__disk_cfg c = cfg_for(be, 1);
  if (kvt__disk_open(&c, &d) != 0) _exit(2);
  size_t rb = kvt__record_bytes(BT, PAYLOAD);
  char *bufs = aligned_alloc(4096, 8 * rb);
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  int busy[8] = {0};
  child_slot cs[8];
  for (uint32_t s = 0; s < SLOTS; s++) {
    uint32_t k = s % 8;
    pthread_mutex_lock(&m);
    while (busy[k]) pthread_cond_wait(&cv, &m);
    busy[k] = 1;
    pthread_mutex_unlock(&m);
    make_rec(bufs + k * rb, base + s);
    cs[k] = (child_slot){s, &m, &cv, busy};
    if (kvt__disk_write(d, s, bufs + k * rb, child_done, &cs[k]) != 0) _exit(4);
  }
  for (;;) pause();
}

/* ---- the parent ---- */

typedef struct sync_read {
  pthread_mutex_t m;
  pthread_cond_t c;
  int done, status;
} sync_read;

static void read_done(void *arg, int status) {
  sync_read *r = arg;
  pthread_mutex_lock(&r->m);
  r->status = status;
  r->done = 1;
  pthread_cond_signal(&r->c);
  pthread_mutex_unlock(&r->m);
}

static int read_slot(kvt__disk *d, uint32_t slot, uint64_t seed, void *buf) {
  sync_read r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  kvt_key k = key_of(seed);
  memset(buf, 0xab, kvt__record_bytes(BT, PAYLOAD));
  int rc = kvt__disk_read(d, slot, buf, &k, read_done, &r);
  if (rc) return rc;
  pthread_mutex_lock(&r.m);
  while (!r.done) pthread_cond_wait(&r.c, &r.m);
  pthread_mutex_unlock(&r.m);
  if (r.status) return r.status;
  const kvt__record_hdr *h = buf;
  if (h->key.lo != k.lo || !kvt_test_check(kvt__record_payload(buf, BT), PAYLOAD, seed)) return -9999;
  return 0;
}

typedef struct recovered {
  int present[SLOTS];
  int n, bad_key;
  uint64_t base;
} recovered;

static void on_found(void *arg, uint64_t slot, const kvt_key *key, const kvt_key *parent) {
  recovered *r = arg;
  if (slot >= SLOTS || key->lo != key_of(r->base + slot).lo || parent->hi != key_of((r->base + slot) ^ 0xffff).hi)
    r->bad_key++;
  else
    r->present[slot] = 1;
  r->n++;
}

/* Reads reports until `stop_after` arrived (or the child finished). */
static int collect(int fd, int *reported, int stop_after, int block) {
  int n = 0;
  uint32_t s;
  while (n < stop_after) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, block ? 5000 : 0) <= 0) break;
    ssize_t k = read(fd, &s, sizeof s);
    if (k != (ssize_t)sizeof s) break;
    assert_true(s < SLOTS);
    reported[s] = 1;
    n++;
  }
  return n;
}

static void one_iteration(kvt_disk_backend be, unsigned *seed, int iter) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  uint64_t base = 1000u * (uint64_t)(iter + 1);
  int stop_after = (int)(rand_r(seed) % SLOTS); /* reports to wait for before the kill */
  useconds_t jitter = (useconds_t)(rand_r(seed) % 3000);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    g_pipe = fds[1];
    child_main(be, base);
  }
  close(fds[1]);
  int reported[SLOTS] = {0};
  collect(fds[0], reported, stop_after, 1);
  usleep(jitter);
  kill(pid, SIGKILL);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st)); /* killed, not failed on its own */
  collect(fds[0], reported, SLOTS, 0); /* reports written before death */
  close(fds[0]);

  kvt__disk *d;
  kvt__disk_cfg c = cfg_for(be, 0);
  kvt_test_wait_unlocked(g_path);
  assert_int_equal(kvt__disk_open(&c, &d), 0);
  recovered r = {.base = base};
  uint64_t discarded = 0;
  int n_found = kvt__disk_recover(d, on_found, &r, &discarded);
  assert_int_equal(n_found, r.n);
  assert_int_equal(r.bad_key, 0);
  void *buf = aligned_alloc(4096, kvt__record_bytes(BT, PAYLOAD));
  int n_rep = 0;
  for (uint32_t s = 0; s < SLOTS; s++) {
    n_rep += reported[s];
    if (reported[s]) assert_true(r.present[s]); /* every reported write survived */
    int rc = read_slot(d, s, base + s, buf);
    if (r.present[s]) assert_int_equal(rc, 0); /* recovered = byte-exact */
    else assert_true(rc == KVT_EMISMATCH || rc == KVT_ECORRUPT); /* never wrong bytes */
  }
  printf("  iter %d (%s): kill after %d reports: %d reported, %d recovered, %llu discarded\n", iter,
         kvt__disk_backend_name(d), stop_after, n_rep, r.n, (unsigned long long)discarded);
  free(buf);
  kvt__disk_close(d);
}

static void test_sigkill_mid_writes_recovers_reported(void **state) {
  (void)state;
  const char *env = getenv("KVT_CRASH_SEED");
  unsigned seed = env ? (unsigned)strtoul(env, NULL, 0) : 20240601u;
  printf("  seed %u (KVT_CRASH_SEED)\n", seed);
  snprintf(g_path, sizeof g_path, "%s/crash-%d.kvt", kvt_test_tmpdir(), (int)getpid());
  for (int i = 0; i < ITERS; i++) one_iteration(i % 2 ? KVT_DISK_THREADS : KVT_DISK_AUTO, &seed, i);
  unlink(g_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sigkill_mid_writes_recovers_reported)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
