/* Crash consistency through the engine's disk tier. A child process runs
 * conversations through a cache whose small device and host tiers push
 * blocks down to disk, and is killed with SIGKILL at a random moment. The
 * parent then reopens the same path and namespace and checks that every
 * block it can restore is byte-exact (block bytes are a function of the
 * key), that no record fails its checksum after recovery, and that every
 * block the child reported durable is there.
 *
 * "Reported durable", from the API alone: after kvt_drain() returned,
 * kvt_lookup() reported the block in the disk tier as its fastest tier,
 * i.e. its only copy is the disk record, whose write completed (the tier
 * map marks a spill valid only in its completion). Only leading blocks of
 * a conversation are reported (a lookup stops at the first gap). The
 * library never fsyncs records, so this is durability against a process
 * crash (the page cache survives), not against power loss.
 * KVT_CRASH_ITERS overrides the iteration count; KVT_CRASH_SEED the seed. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv_fixture.h"

#define BT 16
#define NB 4            /* blocks per conversation */
#define CONVS_PER_LIFE 32
#define DISK_BLOCKS 256 /* two lives' worth: a life never evicts from disk */

typedef struct report {
  uint32_t conv, durable;
} report;

static char path[4200];

static uint64_t key_seed(const kvt_key *k) { return k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull); }

static kvt_config crash_config(uint32_t host, int reset) {
  kvt_config cfg = fixture_config(host);
  cfg.disk_path = path;
  cfg.disk_blocks = DISK_BLOCKS;
  cfg.disk_reset = reset;
  return cfg;
}

static void conv_keys(fixture *f, uint32_t conv, kvt_key *k, uint32_t *t) {
  conv_tokens(t, NB * BT, conv);
  size_t nk;
  if (kvt_hash_tokens(f->c, NULL, t, NB * BT, k, NB, &nk) != 0 || nk != NB) _exit(3);
}

/* The child: no cmocka asserts (they would longjmp in a forked process);
 * any unexpected code exits with a distinct status. */
static void child(int fd, uint32_t base, int reset) {
  fixture f;
  kvt_config cfg = crash_config(4, reset);
  memset(&f, 0, sizeof f);
  f.slots = 8;
  if (kvt_open(&cfg, &f.c) != 0) _exit(2);
  for (int l = 0; l < FIX_LAYERS; l++)
    for (int s = 0; s < 2; s++) {
      f.pool[l][s] = calloc(8, FIX_SEG_BYTES);
      f.seg[l * 2 + s] = (kvt_segment){f.pool[l][s], FIX_SEG_BYTES, FIX_SEG_BYTES};
    }
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.num_slots = 8;
  lay.segments = f.seg;
  if (kvt_register_layout(f.c, &lay) != 0) _exit(2);
  static kvt_key keys[CONVS_PER_LIFE][NB];
  static uint32_t tok[CONVS_PER_LIFE][NB * BT];
  uint32_t reported[CONVS_PER_LIFE] = {0};
  for (uint32_t i = 0; i < CONVS_PER_LIFE; i++) {
    conv_keys(&f, base + i, keys[i], tok[i]);
    kvt_req r;
    uint32_t slots[NB], ready;
    int rc = kvt_acquire(f.c, keys[i], tok[i], NB, NB, 0, 0, &r, slots, NULL);
    if (rc < 0) _exit(4);
    if (kvt_request_wait(f.c, r, -1, &ready) != 0) _exit(4);
    for (uint32_t b = ready; b < NB; b++) fixture_write(&f, slots[b], key_seed(&keys[i][b]));
    if (kvt_commit(f.c, r, NB, NULL) != 0 || kvt_release(f.c, r) != 0) _exit(4);
    kvt_job j;
    rc = kvt_store(f.c, keys[i], NB, KVT_STORE_EVICT, &j);
    if (rc == 1 && (kvt_job_wait(f.c, j, -1) != 0 || kvt_job_release(f.c, j) != 0)) _exit(5);
    if (kvt_drain(f.c) != 0) _exit(5);
    kvt_stats st = {.size = sizeof st};
    kvt_get_stats(f.c, &st);
    if (st.evictions_disk) continue; /* a dropped disk block would be a lie */
    for (uint32_t k = 0; k <= i; k++) {
      uint8_t tiers[NB];
      kvt_lookup_result lr = {.size = sizeof lr};
      if (kvt_lookup(f.c, keys[k], NB, &lr, tiers) != 0) _exit(6);
      uint32_t d = 0;
      while (d < NB && tiers[d] == KVT_TIER_DISK) d++;
      if (d > reported[k]) {
        report rep = {base + k, d};
        if (write(fd, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(7);
        reported[k] = d;
      }
    }
  }
  /* Done writing: stay alive until killed, so every kill lands in a life. */
  for (;;) pause();
}

typedef struct totals {
  uint64_t recovered, discarded, durable, verified, restored;
} totals;

/* Reopens and checks conversations [first, end): restorable blocks are
 * exact, durable ones are all there. Returns resident disk blocks. */
static uint64_t verify(uint32_t first, uint32_t end, const uint32_t *durable, totals *tot) {
  fixture f;
  kvt_config cfg = crash_config(8, 0);
  fixture_open_cfg(&f, &cfg, 8);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  tot->recovered += st.disk_recovered;
  tot->discarded += st.disk_discarded;
  uint64_t resident = st.resident_disk;
  for (uint32_t conv = first; conv < end; conv++) {
    kvt_key k[NB];
    uint32_t t[NB * BT], slots[NB], ready = 0;
    conv_keys(&f, conv, k, t);
    uint32_t want = durable[conv - first];
    kvt_lookup_result lr = {.size = sizeof lr};
    assert_int_equal(kvt_lookup(f.c, k, NB, &lr, NULL), 0);
    if (lr.n_prefix < want) fail_msg("conversation %u: %u blocks reported durable, %u found", conv, want, lr.n_prefix);
    kvt_req r;
    int rc = kvt_acquire(f.c, k, t, NB, NB, 0, 0, &r, slots, NULL);
    assert_true(rc == 0 || rc == 1);
    assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
    if (ready < want) fail_msg("conversation %u: %u durable blocks, %u restored", conv, want, ready);
    for (uint32_t b = 0; b < ready; b++)
      if (!fixture_check(&f, slots[b], key_seed(&k[b]))) fail_msg("conversation %u block %u: wrong bytes", conv, b);
    assert_int_equal(kvt_release(f.c, r), 0);
    tot->durable += want;
    tot->restored += ready;
    tot->verified++;
  }
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.checksum_failures, 0); /* recovery kept only whole records */
  assert_int_equal(st.verify_mismatches, 0);
  fixture_close(&f);
  return resident;
}

static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void sigkill_at_random_points(void **state) {
  snprintf(path, sizeof path, "%s/crash-engine.kvt", kvt_test_tmpdir());
  const char *it_env = getenv("KVT_CRASH_ITERS"), *seed_env = getenv("KVT_CRASH_SEED");
  int iters = it_env ? atoi(it_env) : 24;
  uint64_t rng = seed_env ? strtoull(seed_env, NULL, 0) : 0xc0ffee;
  printf("crash: %d iterations, seed 0x%llx\n", iters, (unsigned long long)rng);
  totals tot = {0};
  uint32_t since_reset = 0; /* first conversation on the current file */
  static uint32_t durable[2 * CONVS_PER_LIFE * 64];
  memset(durable, 0, sizeof durable);
  int reset = 1, kills = 0;
  for (int it = 0; it < iters; it++) {
    uint32_t base = (uint32_t)it * CONVS_PER_LIFE;
    if (reset) since_reset = base;
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(p[0]);
      child(p[1], base, reset);
    }
    close(p[1]);
    /* Every fourth life is killed only after its first durable block (or
     * after a generous bound), so that a slow build (sanitizers, a loaded
     * machine) still kills lives with durable blocks in them. */
    report first;
    int have_first = 0;
    if (it % 4 == 3) {
      struct pollfd pfd = {.fd = p[0], .events = POLLIN};
      if (poll(&pfd, 1, 60000) == 1 && read(p[0], &first, sizeof first) == (ssize_t)sizeof first) have_first = 1;
    }
    /* Kill somewhere in the first ~60 ms of the child's life (opening,
     * recovering, writing), or after it finished (then all is durable). */
    uint64_t us = 500 + rnd(&rng) % 60000;
    nanosleep(&(struct timespec){0, (long)us * 1000}, NULL);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status)) fail_msg("child exited with %d before the kill", WEXITSTATUS(status));
    kills++;
    report rep;
    for (;;) {
      if (have_first) {
        rep = first;
        have_first = 0;
      } else if (read(p[0], &rep, sizeof rep) != (ssize_t)sizeof rep) {
        break;
      }
      assert_true(rep.conv >= since_reset && rep.conv < base + CONVS_PER_LIFE);
      if (rep.durable > durable[rep.conv - since_reset]) durable[rep.conv - since_reset] = rep.durable;
    }
    close(p[0]);
    uint64_t resident = verify(since_reset, base + CONVS_PER_LIFE, durable, &tot);
    /* A file more than half full would let the next life evict from disk. */
    reset = resident > DISK_BLOCKS / 2;
    if (reset) memset(durable, 0, sizeof durable);
  }
  printf("crash: %d kills; reopened %d times: %llu records recovered, %llu discarded (torn), "
         "%llu blocks reported durable, all found; %llu blocks restored byte-exact over %llu conversation checks\n",
         kills, iters, (unsigned long long)tot.recovered, (unsigned long long)tot.discarded,
         (unsigned long long)tot.durable, (unsigned long long)tot.restored, (unsigned long long)tot.verified);
  assert_true(tot.durable > 0);  /* the test saw durable blocks at all */
  assert_true(tot.restored >= tot.durable);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sigkill_at_random_points),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
