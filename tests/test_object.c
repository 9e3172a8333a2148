/* Objects keyed by prefix: byte-exact round trips of objects of any size
 * across the host and disk tiers, the longest stored prefix found (and how
 * many of the caller's tokens it is valid for), a corrupted part refused as
 * a miss, objects restored from disk after a reopen, a second put kept,
 * removal, and bad arguments. Every test runs twice: with parts of 16 KiB
 * (a part's header and trailer take 80 bytes) and of 64 KiB (they take a
 * page, and page-aligned buffers move straight between the file and the
 * caller's memory); buffers that are not page-aligned, or that cannot be
 * registered, go through staging. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "kvtier/kvtier.h"
#include "engine/engine.h"
#include "store/record.h"
#include "util/fault.h"

#define BT 16
#define BLOCK block_bytes
#define PAGE 4096u

static size_t block_bytes; /* the group's part size */

/* Bytes of a part that carry the object's. */
static size_t per_part(void) { return block_bytes >= 8 * PAGE ? block_bytes - PAGE : block_bytes - 80; }

/* Page-aligned, as an engine that wants the straight path allocates. */
static char *alloc_buf(size_t len) {
  void *p = NULL;
  assert_int_equal(posix_memalign(&p, PAGE, (len + PAGE - 1) / PAGE * PAGE), 0);
  return p;
}
#define NTOK (16 * BT)

static char path[4200];
static kvt_write_policy write_policy; /* KVT_WRITE_BACK unless a test says */

static kvt_cache *open_objects(uint32_t host, uint64_t disk, int reset, uint32_t flags) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "object-test";
  cfg.block_tokens = BT;
  cfg.host_blocks = host;
  cfg.copy_threads = 2;
  cfg.write_policy = write_policy;
  snprintf(path, sizeof path, "%s/object.kvt", kvt_test_tmpdir());
  cfg.disk_path = disk ? path : NULL;
  cfg.disk_blocks = disk;
  cfg.disk_reset = reset;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_segment seg = {NULL, 0, BLOCK};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.segments = &seg;
  l.flags = flags;
  if (!(flags & KVT_LAYOUT_STORAGE)) {
    l.num_slots = 4;
    seg.base = malloc(4 * BLOCK);
    seg.stride = BLOCK;
    assert_non_null(seg.base);
  }
  assert_int_equal(kvt_register_layout(c, &l), 0);
  if (!(flags & KVT_LAYOUT_STORAGE)) free(seg.base); /* never touched by these tests */
  return c;
}

static void conversation(uint32_t *tokens, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) tokens[i] = seed * 100003u + (uint32_t)i * 7u;
}

static kvt_object_info find(kvt_cache *c, const uint32_t *tokens, size_t n, int want) {
  kvt_object_info info = {.size = sizeof info};
  assert_int_equal(kvt_object_find(c, tokens, n, &info), want);
  return info;
}

/* Gets the object find() names and checks it holds the pattern of seed. */
static void get_exact(kvt_cache *c, const uint32_t *tokens, size_t n, size_t len, uint64_t seed,
                      uint32_t tier) {
  kvt_object_info info = find(c, tokens, n, 0);
  assert_int_equal(info.bytes, len);
  assert_int_equal(info.tier, tier);
  char *buf = alloc_buf(len);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, len), 0);
  assert_true(kvt_test_check(buf, len, seed));
  free(buf);
}

static void put_pattern(kvt_cache *c, const uint32_t *tokens, size_t n, size_t len, uint64_t seed, int want) {
  char *buf = alloc_buf(len);
  kvt_test_fill(buf, len, seed);
  assert_int_equal(kvt_object_put(c, tokens, n, buf, len), want);
  free(buf);
}

static void objects_of_any_size_round_trip_exactly(void **s) {
  (void)s;
  kvt_cache *c = open_objects(64, 0, 1, KVT_LAYOUT_STORAGE);
  /* One byte, one part exactly full (its header and trailer besides), one
   * byte over, two parts full, many, odd tails. */
  const size_t per = per_part();
  const size_t sizes[] = {1, per, per + 1, 2 * per, 5 * BLOCK + 12345, 100003, 3 * per - 1};
  uint32_t tokens[NTOK];
  for (uint32_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    conversation(tokens, NTOK, i + 1);
    put_pattern(c, tokens, BT * 2 + i, sizes[i], 50 + i, 0);
  }
  for (uint32_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    conversation(tokens, NTOK, i + 1);
    get_exact(c, tokens, NTOK, sizes[i], 50 + i, KVT_TIER_HOST);
    kvt_object_info info = find(c, tokens, NTOK, 0);
    assert_int_equal(info.n_tokens, BT * 2 + i);
    assert_int_equal(info.match_tokens, BT * 2 + i);
    assert_int_equal(info.parts, (sizes[i] + per - 1) / per);
  }
  kvt_close(c);
}

static void host_victims_serve_from_disk(void **s) {
  (void)s;
  kvt_cache *c = open_objects(16, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  const size_t len = 6 * BLOCK + 999; /* 7 parts: three objects overflow 16 host blocks */
  for (uint32_t i = 0; i < 3; i++) {
    conversation(tokens, NTOK, 10 + i);
    put_pattern(c, tokens, NTOK, len, 70 + i, 0);
  }
  conversation(tokens, NTOK, 10);
  get_exact(c, tokens, NTOK, len, 70, KVT_TIER_DISK);
  conversation(tokens, NTOK, 12);
  get_exact(c, tokens, NTOK, len, 72, KVT_TIER_HOST);
  kvt_close(c);
}

static void the_longest_stored_prefix_is_found(void **s) {
  (void)s;
  kvt_cache *c = open_objects(64, 0, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 3);
  put_pattern(c, tokens, 3 * BT + 5, 3000, 1, 0);  /* covers 3 blocks and 5 tokens */
  put_pattern(c, tokens, 7 * BT, 40000, 2, 0);     /* covers 7 blocks */
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.n_tokens, 7 * BT);
  assert_int_equal(info.match_tokens, 7 * BT);
  get_exact(c, tokens, NTOK, 40000, 2, KVT_TIER_HOST);
  {
    char *b2 = malloc(40000);
    assert_non_null(b2);
    tokens[7 * BT - 1] ^= 1; /* all covered tokens checked against the header */
    assert_int_equal(kvt_object_get(c, &info, tokens, b2, 40000), KVT_EMISMATCH);
    tokens[7 * BT - 1] ^= 1;
    free(b2);
  }
  /* A conversation that leaves the stored one in block 5: the 3-block
   * object, all of whose 53 tokens still match. */
  tokens[5 * BT + 2] ^= 1;
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.n_tokens, 3 * BT + 5);
  assert_int_equal(info.match_tokens, 3 * BT + 5);
  get_exact(c, tokens, NTOK, 3000, 1, KVT_TIER_HOST);
  /* Leaving it inside the object's partial block: valid for the 48 tokens
   * of its key only. */
  tokens[3 * BT + 1] ^= 1;
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.match_tokens, 3 * BT);
  char buf[3000];
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, sizeof buf), 0);
  assert_true(kvt_test_check(buf, sizeof buf, 1));
  /* Other tokens than the key's are refused. */
  tokens[BT + 3] ^= 1;
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, sizeof buf), KVT_EMISMATCH);
  tokens[BT + 3] ^= 1;
  /* Too few tokens, or other ones from the start: nothing. */
  find(c, tokens, 3 * BT - 1, KVT_EMISS);
  tokens[0] ^= 1;
  find(c, tokens, NTOK, KVT_EMISS);
  kvt_close(c);
}

static void a_second_put_is_kept_and_remove_forgets(void **s) {
  (void)s;
  kvt_cache *c = open_objects(64, 0, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 4);
  put_pattern(c, tokens, 4 * BT, 20000, 1, 0);
  put_pattern(c, tokens, 4 * BT + 3, 30000, 2, 1); /* same key: kept as it is */
  get_exact(c, tokens, 4 * BT, 20000, 1, KVT_TIER_HOST);
  /* Also when the second is of more parts (its own part keys are not all
   * stored) or fewer. */
  put_pattern(c, tokens, 4 * BT + 5, 5 * per_part() + 1, 3, 1);
  put_pattern(c, tokens, 4 * BT + 7, 100, 4, 1);
  get_exact(c, tokens, 4 * BT, 20000, 1, KVT_TIER_HOST);
  assert_int_equal(kvt_object_remove(c, tokens, 4 * BT + 3), 0);
  find(c, tokens, NTOK, KVT_EMISS);
  assert_int_equal(kvt_object_remove(c, tokens, 4 * BT), KVT_EMISS);
  put_pattern(c, tokens, 4 * BT + 3, 30000, 2, 0);
  get_exact(c, tokens, NTOK, 30000, 2, KVT_TIER_HOST);
  kvt_close(c);
}

/* One byte at offset `at` of every slot's payload flipped. */
static void flip_payload_at(uint64_t slots, size_t at) {
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  for (uint64_t slot = 0; slot < slots; slot++) {
    off_t o = 4096 + (off_t)slot * (off_t)rec + (off_t)kvt__record_prefix_bytes(BT) + (off_t)at;
    char b;
    assert_int_equal(pread(fd, &b, 1, o), 1);
    b ^= 0x21;
    assert_int_equal(pwrite(fd, &b, 1, o), 1);
  }
  fsync(fd);
  close(fd);
}

static void flip_every_payload(uint64_t slots) { flip_payload_at(slots, 100); }

static void a_corrupted_part_is_a_miss(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 16, 1, KVT_LAYOUT_STORAGE); /* parts go straight to disk */
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 5);
  put_pattern(c, tokens, NTOK, 3 * BLOCK, 9, 0);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.tier, KVT_TIER_DISK);
  flip_every_payload(16);
  char *buf = alloc_buf(3 * BLOCK);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, 3 * BLOCK), KVT_ECORRUPT);
  find(c, tokens, NTOK, KVT_EMISS);
  /* Stored again, it serves again. */
  put_pattern(c, tokens, NTOK, 3 * BLOCK, 9, 0);
  get_exact(c, tokens, NTOK, 3 * BLOCK, 9, KVT_TIER_DISK);
  /* Damaged after find described it (from what the put left in memory):
   * the get refuses it. */
  flip_every_payload(16);
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, 3 * BLOCK), KVT_ECORRUPT);
  find(c, tokens, NTOK, KVT_EMISS);
  /* Damaged on disk while no cache had it open: the reopen finds the
   * object from part 0's header and token ids (whole), the get refuses
   * the damaged parts and drops them. */
  put_pattern(c, tokens, NTOK, 3 * BLOCK, 9, 0);
  kvt_close(c);
  c = open_objects(0, 16, 0, KVT_LAYOUT_STORAGE);
  get_exact(c, tokens, NTOK, 3 * BLOCK, 9, KVT_TIER_DISK);
  kvt_close(c);
  flip_every_payload(16);
  c = open_objects(0, 16, 0, KVT_LAYOUT_STORAGE);
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, 3 * BLOCK), KVT_ECORRUPT);
  find(c, tokens, NTOK, KVT_EMISS);
  free(buf);
  kvt_close(c);
}

/* One byte of slot's payload flipped (the file read behind the cache's back). */
static void flip_one_payload(uint64_t slot) {
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  off_t at = 4096 + (off_t)slot * (off_t)rec + (off_t)kvt__record_prefix_bytes(BT) + 4321;
  char b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= 0x18;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  fsync(fd);
  close(fd);
}

/* An object of more parts than a storage worker keeps in flight (each
 * worker's reads go in batches, and its ring of stages is reused), read
 * from disk: byte-exact, and one damaged part among them, whichever it
 * is, fails the get and removes the object. */
static void a_many_part_object_from_disk(void **s) {
  (void)s;
  enum { PARTS = 300 };
  kvt_cache *c = open_objects(0, PARTS + 16, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 40);
  const size_t len = (PARTS - 1) * per_part() + 777;
  put_pattern(c, tokens, NTOK, len, 71, 0);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.parts, PARTS);
  get_exact(c, tokens, NTOK, len, 71, KVT_TIER_DISK);
  get_exact(c, tokens, NTOK, len, 71, KVT_TIER_DISK);
  flip_one_payload(PARTS - 37); /* the slots hold the object's parts only */
  char *buf = alloc_buf(len);
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, len), KVT_ECORRUPT);
  find(c, tokens, NTOK, KVT_EMISS);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(c, &st);
  assert_int_equal(st.checksum_failures, 1);
  free(buf);
  kvt_close(c);
}

/* Reads at the disk at once during a get: each storage worker keeps a
 * window of records in flight (a quarter of its share of the object, 4 to
 * 64; 8 staged), not every record of its share, so that the records that
 * landed are checked while the next ones are read. */
static atomic_int io_now, io_most;

static int in_flight_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  (void)arg;
  if (site == KVT_FAULT_IO_SUBMIT) {
    int n = atomic_fetch_add(&io_now, 1) + 1, m = atomic_load(&io_most);
    while (n > m && !atomic_compare_exchange_weak(&io_most, &m, n)) {
    }
  }
  if (site == KVT_FAULT_IO_COMPLETE) atomic_fetch_sub(&io_now, 1);
  return 0;
}

static void a_get_keeps_a_window_of_reads_in_flight(void **s) {
  (void)s;
  enum { PARTS = 300, WORKERS = 2 /* copy_threads */ };
  kvt_cache *c = open_objects(0, PARTS + 16, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 41);
  const size_t len = (PARTS - 1) * per_part() + 99;
  put_pattern(c, tokens, NTOK, len, 72, 0);
  assert_int_equal(kvt_drain(c), 0);
  const int straight = block_bytes >= 8 * PAGE;
  const int window = straight ? PARTS / WORKERS / 4 : 8; /* the parts split between the workers */
  atomic_store(&io_now, 0);
  atomic_store(&io_most, 0);
  kvt__fault_set(in_flight_hook, NULL);
  get_exact(c, tokens, NTOK, len, 72, KVT_TIER_DISK);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(atomic_load(&io_now), 0);
  /* The store would take them all (its default depth: 12-16 MiB of records). */
  assert_in_range(atomic_load(&io_most), 2, WORKERS * window);
  kvt_close(c);
}

/* A get's or put's parts go to the storage workers in jobs of four parts
 * each at least, or fewer if they make 1 MiB. */
static void parts_are_split_while_each_job_has_four_or_1_mib(void **s) {
  (void)s;
  const size_t K = 1024;
  assert_int_equal(kvt__object_jobs(4, 512 * K, 2), 2); /* 2 MiB: two jobs of 1 MiB */
  assert_int_equal(kvt__object_jobs(3, 512 * K, 2), 1);
  assert_int_equal(kvt__object_jobs(8, 256 * K, 2), 2);
  assert_int_equal(kvt__object_jobs(7, 256 * K, 2), 1);
  assert_int_equal(kvt__object_jobs(8, 64 * K, 2), 2); /* small parts: four a job */
  assert_int_equal(kvt__object_jobs(7, 64 * K, 2), 1);
  assert_int_equal(kvt__object_jobs(16, 16 * K, 4), 4);
  assert_int_equal(kvt__object_jobs(12, 16 * K, 4), 3);
  assert_int_equal(kvt__object_jobs(12, 16 * K, 8), 3); /* four jobs at most */
  assert_int_equal(kvt__object_jobs(100, 16 * K, 8), 4);
  assert_int_equal(kvt__object_jobs(2, 2048 * K, 2), 2);
  assert_int_equal(kvt__object_jobs(1, 2048 * K, 2), 1);
  assert_int_equal(kvt__object_jobs(100, 64 * K, 1), 1);
  assert_int_equal(kvt__object_jobs(100, 64 * K, 0), 1);
  assert_int_equal(kvt__object_jobs(0, 64 * K, 2), 1);
  assert_int_equal(kvt__object_jobs(2, 768 * K, 2), 1); /* 1 MiB a job, not one part of 768 KiB */
  assert_int_equal(kvt__object_jobs(4, 768 * K, 2), 2);
  assert_int_equal(kvt__object_jobs(6, 300 * K, 2), 1); /* four of 300 KiB make 1 MiB, three do not */
  assert_int_equal(kvt__object_jobs(8, 300 * K, 2), 2);
  assert_int_equal(kvt__object_jobs(8, 0, 2), 2); /* no part size: four a job */
  assert_int_equal(kvt__object_jobs(7, 0, 2), 1);
}

/* The threads that submitted reads during a get, the calling thread's
 * apart (a find reading a part 0); completions are slowed, so a worker is
 * still draining its job when the next job is queued. */
static pthread_mutex_t sub_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t submitters[8], get_thread;
static int n_submitters;

static int submitter_hook(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  if (site == KVT_FAULT_IO_DELAY_US) return 20000;
  if (site != KVT_FAULT_IO_SUBMIT || pthread_equal(pthread_self(), get_thread)) return 0;
  pthread_mutex_lock(&sub_lock);
  int seen = 0;
  for (int i = 0; i < n_submitters && !seen; i++) seen = pthread_equal(submitters[i], pthread_self());
  if (!seen && n_submitters < 8) submitters[n_submitters++] = pthread_self();
  pthread_mutex_unlock(&sub_lock);
  return 0;
}

/* An object of five parts of 512 KiB: the four read after its part 0
 * (2 MiB) go to both storage workers, two jobs of 1 MiB. */
static void a_get_of_2_mib_in_large_parts_uses_both_workers(void **s) {
  (void)s;
  const size_t group_bytes = block_bytes;
  block_bytes = 512 * 1024;
  kvt_cache *c = open_objects(0, 16, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 57);
  const size_t len = 4 * per_part() + 99;
  put_pattern(c, tokens, NTOK, len, 93, 0);
  assert_int_equal(kvt_drain(c), 0);
  n_submitters = 0;
  get_thread = pthread_self();
  kvt__fault_set(submitter_hook, NULL);
  get_exact(c, tokens, NTOK, len, 93, KVT_TIER_DISK);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(n_submitters, 2);
  kvt_close(c);
  block_bytes = group_bytes;
}

/* Every record of the disk file (slots of them), read whole. */
static char *read_records(uint64_t slots) {
  size_t rec = kvt__record_bytes(BT, BLOCK);
  char *all = malloc(slots * rec);
  assert_non_null(all);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(pread(fd, all, slots * rec, 4096), (ssize_t)(slots * rec));
  close(fd);
  return all;
}

/* A part from another put of the same key (its record intact: the right key,
 * a good checksum) is not one object with the others: refused, removed. */
static void a_part_of_another_put_is_refused(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 16, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 8);
  put_pattern(c, tokens, NTOK, 3 * BLOCK, 31, 0);
  char *old = read_records(16);
  assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
  put_pattern(c, tokens, NTOK, 3 * BLOCK, 32, 0);
  char *now = read_records(16);
  /* One of the first put's records back in place of the second's part with
   * the same key. */
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDWR), swapped = 0;
  assert_true(fd >= 0);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  for (uint64_t a = 0; a < 16 && !swapped; a++) {
    const kvt__record_hdr *ha = (const kvt__record_hdr *)(const void *)(old + a * rec);
    if (ha->magic != KVT_RECORD_MAGIC) continue;
    for (uint64_t b = 0; b < 16 && !swapped; b++) {
      const kvt__record_hdr *hb = (const kvt__record_hdr *)(const void *)(now + b * rec);
      if (hb->magic != KVT_RECORD_MAGIC || memcmp(&ha->key, &hb->key, sizeof ha->key) ||
          !memcmp(old + a * rec, now + b * rec, rec))
        continue;
      assert_int_equal(pwrite(fd, old + a * rec, rec, 4096 + (off_t)(b * rec)), (ssize_t)rec);
      swapped = 1;
    }
  }
  fsync(fd);
  close(fd);
  assert_true(swapped);
  char *buf = alloc_buf(3 * BLOCK);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, 3 * BLOCK), KVT_ECORRUPT);
  find(c, tokens, NTOK, KVT_EMISS);
  free(buf);
  free(old);
  free(now);
  kvt_close(c);
}

static void objects_on_disk_survive_a_reopen(void **s) {
  (void)s;
  kvt_cache *c = open_objects(4, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  for (uint32_t i = 0; i < 3; i++) {
    conversation(tokens, NTOK, 20 + i);
    put_pattern(c, tokens, NTOK - i, 2 * BLOCK + 77 * i, 90 + i, 0);
  }
  kvt_close(c);
  c = open_objects(4, 64, 0, KVT_LAYOUT_STORAGE);
  /* 9 parts through 4 host blocks: the first object spilled whole to disk
   * and comes back; the others kept parts (their headers among them) in
   * RAM, lost at close, so they are misses rather than half objects. */
  conversation(tokens, NTOK, 20);
  get_exact(c, tokens, NTOK, 2 * BLOCK, 90, KVT_TIER_DISK);
  for (uint32_t i = 1; i < 3; i++) {
    conversation(tokens, NTOK, 20 + i);
    find(c, tokens, NTOK, KVT_EMISS);
  }
  kvt_close(c);
}

/* Disk-tier records read by storage calls so far (puts count too). */
static uint64_t disk_records(kvt_cache *c) {
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0);
  return st.storage_blocks_straight + st.storage_blocks_staged;
}

/* After a reopen, find answers from memory: part 0 carries its object's
 * header as its token ids, which the reopen read with every record's
 * header. The get then reads each part once. A put or a remove since find
 * makes the get answer for what is stored then. */
static void a_find_and_get_after_a_reopen_read_each_part_once(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK], other[NTOK];
  const size_t lens[2] = {5 * per_part() + 99, per_part() / 2}; /* six parts, and one */
  conversation(tokens, NTOK, 50);
  conversation(other, NTOK, 51);
  put_pattern(c, tokens, NTOK, lens[0], 81, 0);
  put_pattern(c, other, NTOK, lens[1], 82, 0);
  kvt_close(c);
  c = open_objects(0, 64, 0, KVT_LAYOUT_STORAGE);
  uint64_t r0 = disk_records(c);
  kvt_object_info fi = find(c, tokens, NTOK, 0);
  assert_int_equal(fi.bytes, lens[0]);
  assert_int_equal(fi.parts, 6);
  assert_int_equal(fi.tier, KVT_TIER_DISK);
  find(c, other, NTOK, 0);
  assert_int_equal(disk_records(c) - r0, 0); /* nothing read to find them */
  get_exact(c, tokens, NTOK, lens[0], 81, KVT_TIER_DISK);
  assert_int_equal(disk_records(c) - r0, 6);
  r0 = disk_records(c);
  get_exact(c, other, NTOK, lens[1], 82, KVT_TIER_DISK);
  assert_int_equal(disk_records(c) - r0, 1);
  /* Found from memory since (the header is remembered): all parts read. */
  r0 = disk_records(c);
  get_exact(c, tokens, NTOK, lens[0], 81, KVT_TIER_DISK);
  assert_int_equal(disk_records(c) - r0, 6);

  kvt_close(c);
  c = open_objects(0, 64, 0, KVT_LAYOUT_STORAGE);
  char *buf = alloc_buf(lens[0]);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, lens[0]), KVT_EMISS);
  /* Put again since find, of another length: the get reads what is there
   * and finds another object than find described. */
  put_pattern(c, tokens, NTOK, lens[0], 83, 0);
  kvt_close(c);
  c = open_objects(0, 64, 0, KVT_LAYOUT_STORAGE);
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
  put_pattern(c, tokens, NTOK, lens[0] - 4096, 84, 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, lens[0]), KVT_EMISS);
  get_exact(c, tokens, NTOK, lens[0] - 4096, 84, KVT_TIER_DISK);
  free(buf);
  kvt_close(c);
}

/* The object key of tokens[0..n): the chain key of its last full block. */
static kvt_key object_key(kvt_cache *c, const uint32_t *tokens, size_t n) {
  kvt_key keys[NTOK / BT];
  size_t nk = 0;
  assert_int_equal(kvt_hash_tokens(c, NULL, tokens, n, keys, NTOK / BT, &nk), 0);
  return keys[nk - 1];
}

/* Fills t[0..BUCKET_N) with conversations (from seed on) whose object
 * keys share one bucket of the memory of a 64-block cache (256 places, 8
 * to a bucket, chosen by the key's low bits): one more than it holds. */
enum { BUCKET_N = 9, BUCKETS_64 = 32 };

static void one_bucket(kvt_cache *c, uint32_t t[BUCKET_N][NTOK], uint32_t seed) {
  conversation(t[0], NTOK, seed++);
  const uint64_t bucket = object_key(c, t[0], NTOK).lo % BUCKETS_64;
  for (int k = 1; k < BUCKET_N; k++)
    do conversation(t[k], NTOK, seed++);
    while (object_key(c, t[k], NTOK).lo % BUCKETS_64 != bucket);
}

/* Objects a reopen could not remember (here: nine whose headers share one
 * bucket of the memory, which keeps eight) are found as before, by
 * reading part 0, and the get that follows takes that part 0 as find read
 * it: each part of each object is read once, finds and gets together. */
static void objects_a_reopen_forgot_are_found_by_reading_part_0(void **s) {
  (void)s;
  enum { N = BUCKET_N };
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t t[N][NTOK];
  one_bucket(c, t, 600);
  const size_t len = 2 * per_part() + 5; /* three parts each */
  for (int k = 0; k < N; k++) put_pattern(c, t[k], NTOK, len, 71 + (uint64_t)k, 0);
  kvt_close(c);
  c = open_objects(0, 64, 0, KVT_LAYOUT_STORAGE);
  char *buf = alloc_buf(len);
  uint64_t found_reading = 0;
  for (int k = 0; k < N; k++) {
    uint64_t r0 = disk_records(c);
    kvt_object_info info = find(c, t[k], NTOK, 0);
    found_reading += disk_records(c) - r0;
    assert_int_equal(kvt_object_get(c, &info, t[k], buf, len), 0);
    assert_true(kvt_test_check(buf, len, 71 + (uint64_t)k));
    assert_int_equal(disk_records(c) - r0, 3);
  }
  assert_true(found_reading >= 1); /* at least one found by reading its part 0 */
  free(buf);
  kvt_close(c);
}

/* When a bucket of the memory is full, a new header takes the place of
 * the one entered or found longest ago: with eight objects in a bucket,
 * the first one found again, then a ninth put, the second one (not the
 * first, not the last) is forgotten and is found by reading its part 0. */
static void a_full_bucket_forgets_the_header_used_longest_ago(void **s) {
  (void)s;
  enum { N = BUCKET_N };
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t t[N][NTOK];
  one_bucket(c, t, 800);
  const size_t len = per_part() / 2; /* one part each */
  for (int k = 0; k < N - 1; k++) put_pattern(c, t[k], NTOK, len, 80 + (uint64_t)k, 0);
  find(c, t[0], NTOK, 0); /* found: the first is now the most recent */
  put_pattern(c, t[N - 1], NTOK, len, 80 + N - 1, 0);
  uint64_t r0 = disk_records(c); /* (puts count too) */
  for (int k = 0; k < N; k++) {
    if (k == 1) continue;
    find(c, t[k], NTOK, 0);
  }
  assert_int_equal(disk_records(c) - r0, 0); /* all remembered but the second */
  find(c, t[1], NTOK, 0);
  assert_int_equal(disk_records(c) - r0, 1);
  get_exact(c, t[1], NTOK, len, 81, KVT_TIER_DISK);
  kvt_close(c);
}

/* A find that read a header from disk while the object was removed and
 * put again (finds take no claim) does not remember what it read: a get
 * after it returns the object stored now, not the one the find read (an
 * object of one part would otherwise be served from the kept part 0). */
static atomic_int keep_delay_us;

static int keep_delay_hook(void *ctx, int site, int64_t arg) {
  (void)ctx;
  (void)arg;
  return site == KVT_FAULT_OBJECT_KEEP_DELAY_US ? atomic_exchange(&keep_delay_us, 0) : 0;
}

typedef struct find_arg {
  kvt_cache *c;
  const uint32_t *t;
  int rc;
} find_arg;

static void *find_thread(void *p) {
  find_arg *a = p;
  kvt_object_info info = {.size = sizeof info};
  a->rc = kvt_object_find(a->c, a->t, NTOK, &info);
  return NULL;
}

static void a_find_racing_a_put_again_remembers_nothing_stale(void **s) {
  (void)s;
  enum { N = BUCKET_N };
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t t[N][NTOK];
  one_bucket(c, t, 900);
  const size_t len = per_part() / 2; /* one part each */
  for (int k = 0; k < N; k++) put_pattern(c, t[k], NTOK, len, 90 + (uint64_t)k, 0);
  /* The ninth put took the first one's place: finding it reads part 0. */
  atomic_store(&keep_delay_us, 300000);
  kvt__fault_set(keep_delay_hook, NULL);
  find_arg a = {.c = c, .t = t[0]};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, find_thread, &a), 0);
  for (int ms = 0; atomic_load(&keep_delay_us) != 0 && ms < 10000; ms++) usleep(1000);
  assert_int_equal(atomic_load(&keep_delay_us), 0); /* it read part 0 and sleeps */
  assert_int_equal(kvt_object_remove(c, t[0], NTOK), 0);
  put_pattern(c, t[0], NTOK, len, 99, 0); /* the same length: only its bytes differ */
  pthread_join(th, NULL);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(a.rc, 0);
  get_exact(c, t[0], NTOK, len, 99, KVT_TIER_DISK);
  kvt_close(c);
}

/* Hundreds of objects are all remembered: after a reopen, finding each
 * reads nothing from disk (the memory is sized to the tiers). */
static void a_reopen_remembers_hundreds_of_objects(void **s) {
  (void)s;
  enum { N = 300 };
  kvt_cache *c = open_objects(0, 1024, 1, KVT_LAYOUT_STORAGE);
  static uint32_t t[N][NTOK];
  for (int k = 0; k < N; k++) {
    conversation(t[k], NTOK, 700 + (uint32_t)k);
    put_pattern(c, t[k], NTOK, per_part() / 2, 700 + (uint64_t)k, 0);
  }
  kvt_close(c);
  c = open_objects(0, 1024, 0, KVT_LAYOUT_STORAGE);
  uint64_t r0 = disk_records(c);
  for (int k = 0; k < N; k++) find(c, t[k], NTOK, 0);
  assert_int_equal(disk_records(c) - r0, 0);
  get_exact(c, t[N - 1], NTOK, per_part() / 2, 700 + N - 1, KVT_TIER_DISK);
  kvt_close(c);
}

/* Bytes the storage backend moved (every completion's result). */
static _Atomic uint64_t moved;

static int count_moved(void *ctx, int site, int64_t arg) {
  (void)ctx;
  if (site == KVT_FAULT_IO_COMPLETE && arg > 0) atomic_fetch_add(&moved, (uint64_t)arg);
  return 0;
}

/* A get from disk reads an object's last part only up to the object's
 * last page (when parts go straight: whole pages, four at least), not the
 * whole part:
 * the disk's checksum takes the rest as the zeros the put wrote. The pages
 * read are still checked: a flipped byte there fails the get; one in the
 * padding past them is never read. Through staging (parts of 16 KiB here)
 * every record is read and checked whole. */
static void the_last_part_is_read_no_further_than_the_object(void **s) {
  (void)s;
  const size_t per = per_part(), prefix = kvt__record_prefix_bytes(BT), rec = kvt__record_bytes(BT, BLOCK);
  const int straight = block_bytes >= 8 * PAGE;
  const size_t tails[] = {1, PAGE - 1, PAGE, PAGE + 1, per - 1, per};
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  for (uint32_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
    size_t len = 2 * per + tails[i];
    conversation(tokens, NTOK, 60 + i);
    put_pattern(c, tokens, NTOK, len, 90 + i, 0);
    assert_int_equal(kvt_drain(c), 0);
    atomic_store(&moved, 0);
    kvt__fault_set(count_moved, NULL);
    get_exact(c, tokens, NTOK, len, 90 + i, KVT_TIER_DISK);
    kvt__fault_set(NULL, NULL);
    size_t last = (tails[i] + PAGE - 1) / PAGE * PAGE; /* and 3 pages at least: 4 whole-page pieces */
    if (last < 3 * PAGE) last = 3 * PAGE;
    uint64_t want = straight ? 2 * rec + prefix + PAGE + last : 3 * rec;
    assert_int_equal(atomic_load(&moved), want);
  }
  kvt_close(c);
  /* One object of one part, its last page partly filled: the only record.
   * Its header is remembered from the put, so find reads nothing. */
  c = open_objects(0, 16, 1, KVT_LAYOUT_STORAGE);
  conversation(tokens, NTOK, 70);
  const size_t len = per / 2 + 5;
  put_pattern(c, tokens, NTOK, len, 99, 0);
  assert_int_equal(kvt_drain(c), 0);
  flip_payload_at(16, BLOCK - 1); /* padding: past the object's last page */
  char *buf = alloc_buf(len);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, len), straight ? 0 : KVT_ECORRUPT);
  if (straight) {
    assert_true(kvt_test_check(buf, len, 99));
    flip_payload_at(16, (block_bytes - per) + len - 1); /* the object's last byte */
    info = find(c, tokens, NTOK, 0);
    assert_int_equal(kvt_object_get(c, &info, tokens, buf, len), KVT_ECORRUPT);
  }
  find(c, tokens, NTOK, KVT_EMISS); /* a damaged object is removed */
  free(buf);
  kvt_close(c);
}

/* kvtier's own (engine/storage.h): the keys of an object's parts. */
void kvt__object_part_keys(kvt_cache *c, const kvt_key *key, uint32_t first, uint32_t n, kvt_key *out);

/* A storage completion held until the test lets it go: the block it
 * belongs to stays "being stored" meanwhile. */
static struct {
  pthread_mutex_t m;
  pthread_cond_t cv;
  int armed, holding, released;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};

static int gate_hook(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  if (site != KVT_FAULT_IO_DELAY_US) return 0;
  pthread_mutex_lock(&gate.m);
  if (gate.armed) {
    gate.armed = 0;
    gate.holding = 1;
    pthread_cond_broadcast(&gate.cv);
    while (!gate.released) pthread_cond_wait(&gate.cv, &gate.m);
  }
  pthread_mutex_unlock(&gate.m);
  return 0;
}

/* A put under a key while another call holds one of its parts (here a put
 * of that part's key still being written; a get reading it alike) stores
 * nothing and says so (KVT_EAGAIN): written then, the object would hold
 * parts of two puts, which every get refuses. Once the other call is
 * over, the put stores it whole. */
static void a_put_while_another_call_holds_a_part_is_eagain(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 16, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 80);
  kvt_key keys[NTOK / BT], parts[3];
  size_t n_keys = 0;
  assert_int_equal(kvt_hash_tokens(c, NULL, tokens, NTOK, keys, NTOK / BT, &n_keys), 0);
  kvt__object_part_keys(c, &keys[n_keys - 1], 0, 3, parts);
  const size_t len = 2 * per_part() + 999; /* three parts */
  char *other = alloc_buf(BLOCK);
  memset(other, 0x77, BLOCK);
  kvt_piece piece = {.ptr = other, .len = BLOCK};
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = 1;
  b.keys = &parts[1];
  b.pieces = &piece;
  b.pieces_per_block = 1;
  b.flags = KVT_KEYS_OPAQUE;
  gate.armed = 1, gate.holding = 0, gate.released = 0;
  kvt__fault_set(gate_hook, NULL);
  kvt_job job = 0;
  assert_int_equal(kvt_put_from(c, &b, &job), 1);
  pthread_mutex_lock(&gate.m);
  while (!gate.holding) pthread_cond_wait(&gate.cv, &gate.m);
  pthread_mutex_unlock(&gate.m);
  put_pattern(c, tokens, NTOK, len, 120, KVT_EAGAIN);
  pthread_mutex_lock(&gate.m);
  gate.released = 1;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.m);
  assert_int_equal(kvt_storage_wait(c, job, -1), 0);
  assert_int_equal(kvt_storage_release(c, job), 0);
  kvt__fault_set(NULL, NULL);
  find(c, tokens, NTOK, KVT_EMISS); /* nothing of the refused put was written */
  assert_int_equal(kvt_remove(c, &parts[1], 1, NULL), 0);
  put_pattern(c, tokens, NTOK, len, 121, 0);
  get_exact(c, tokens, NTOK, len, 121, KVT_TIER_DISK);
  free(other);
  kvt_close(c);
}

/* The token ids of the first record on disk that has any: an object's
 * part 0, whose token ids are its object's header. 1 when found. */
static int part0_tokens_on_disk(uint64_t slots, uint32_t *out) {
  size_t rec = kvt__record_bytes(BT, BLOCK);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  int found = 0;
  for (uint64_t slot = 0; slot < slots && !found; slot++) {
    char prefix[KVT_RECORD_HDR_BYTES + BT * 4];
    assert_int_equal(pread(fd, prefix, sizeof prefix, 4096 + (off_t)slot * (off_t)rec), (ssize_t)sizeof prefix);
    kvt__record_hdr h;
    memcpy(&h, prefix, sizeof h);
    if (h.magic != KVT_RECORD_MAGIC || !(h.flags & KVT_RECORD_F_TOKENS)) continue;
    memcpy(out, prefix + KVT_RECORD_HDR_BYTES, BT * 4);
    found = 1;
  }
  close(fd);
  return found;
}

/* A block stored under an object's part-0 key with a whole object header
 * for token ids (the header a real put wrote there, that object removed
 * since), but with other bytes: a reopen remembers the header from the
 * token ids and find names the object, and the get refuses it (part 0's
 * bytes hold no header) and drops it. No byte of the block is ever
 * returned as the object; a real put serves again. */
static void a_block_that_looks_like_a_part_0_is_refused(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 16, 1, KVT_LAYOUT_STORAGE); /* parts go straight to disk */
  uint32_t tokens[NTOK], header[BT];
  conversation(tokens, NTOK, 140);
  const size_t len = per_part() / 2; /* one part */
  put_pattern(c, tokens, NTOK, len, 141, 0);
  assert_int_equal(kvt_drain(c), 0);
  assert_true(part0_tokens_on_disk(16, header));
  assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
  kvt_key keys[NTOK / BT], p0;
  size_t n_keys = 0;
  assert_int_equal(kvt_hash_tokens(c, NULL, tokens, NTOK, keys, NTOK / BT, &n_keys), 0);
  kvt__object_part_keys(c, &keys[n_keys - 1], 0, 1, &p0);
  char *junk = alloc_buf(BLOCK);
  kvt_test_fill(junk, BLOCK, 142);
  kvt_piece piece = {.ptr = junk, .len = BLOCK};
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = 1;
  b.keys = &p0;
  b.tokens = header;
  b.pieces = &piece;
  b.pieces_per_block = 1;
  b.flags = KVT_KEYS_OPAQUE;
  kvt_job job = 0;
  assert_int_equal(kvt_put_from(c, &b, &job), 1);
  assert_int_equal(kvt_storage_wait(c, job, -1), 0);
  assert_int_equal(kvt_storage_release(c, job), 0);
  assert_int_equal(kvt_drain(c), 0);
  kvt_close(c);
  c = open_objects(0, 16, 0, KVT_LAYOUT_STORAGE);
  kvt_object_info info = find(c, tokens, NTOK, 0); /* from the remembered header: a hint */
  assert_int_equal(info.bytes, len);
  char *buf = alloc_buf(BLOCK);
  memset(buf, 0, BLOCK);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, BLOCK), KVT_ECORRUPT);
  find(c, tokens, NTOK, KVT_EMISS);
  put_pattern(c, tokens, NTOK, len, 143, 0);
  get_exact(c, tokens, NTOK, len, 143, KVT_TIER_DISK);
  free(junk);
  free(buf);
  kvt_close(c);
}

/* Two threads put objects of the same tokens at once, each of its own
 * bytes and length. Each put stores its object (0), finds one stored (1),
 * says another put of the key is in progress (KVT_EAGAIN) or that the
 * small host tier had no room at the moment (KVT_ENOSPACE); never both 0.
 * What is stored after is one put's object whole, never a mix; and after
 * a put that stored, something is stored. Parts spill from a small host
 * tier to disk meanwhile (write-back). */
typedef struct racer {
  kvt_cache *c;
  const uint32_t *tokens;
  size_t len;
  uint64_t seed;
  pthread_barrier_t *start;
  int rc;
} racer;

static void *race_put(void *arg) {
  racer *r = arg;
  void *buf = NULL;
  if (posix_memalign(&buf, PAGE, r->len)) {
    r->rc = -ENOMEM;
    pthread_barrier_wait(r->start);
    return NULL;
  }
  kvt_test_fill(buf, r->len, r->seed);
  pthread_barrier_wait(r->start);
  r->rc = kvt_object_put(r->c, r->tokens, NTOK, buf, r->len);
  free(buf);
  return NULL;
}

static void racing_puts_of_one_key_store_one_whole_object(void **s) {
  (void)s;
  kvt_cache *c = open_objects(8, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  const size_t lens[2] = {3 * per_part() + 11, 2 * per_part() + 7};
  char *buf = alloc_buf(lens[0]);
  int outcomes[3] = {0}; /* rounds with a put stored, with KVT_EAGAIN, with nothing stored */
  for (uint32_t round = 0; round < 40; round++) {
    conversation(tokens, NTOK, 150 + round % 4);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    racer r[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
      r[k] = (racer){c, tokens, lens[k], 1000 + 2 * round + (uint64_t)k, &start, -1};
      assert_int_equal(pthread_create(&th[k], NULL, race_put, &r[k]), 0);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&start);
    int stored = 0;
    for (int k = 0; k < 2; k++) {
      int ok = r[k].rc == 0 || r[k].rc == 1 || r[k].rc == KVT_EAGAIN || r[k].rc == KVT_ENOSPACE;
      if (!ok) fail_msg("round %u put %d: %d", round, k, r[k].rc);
      stored += r[k].rc == 0;
      outcomes[1] += r[k].rc == KVT_EAGAIN;
    }
    assert_true(stored <= 1);
    outcomes[0] += stored;
    kvt_object_info info = {.size = sizeof info};
    int rc = kvt_object_find(c, tokens, NTOK, &info);
    if (stored && rc != 0) fail_msg("round %u: puts %d and %d, then find %d", round, r[0].rc, r[1].rc, rc);
    if (rc == 0) {
      int k = info.bytes == lens[0] ? 0 : 1;
      assert_int_equal(info.bytes, lens[k]);
      assert_int_equal(kvt_object_get(c, &info, tokens, buf, lens[0]), 0);
      assert_true(kvt_test_check(buf, lens[k], r[k].seed));
      assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
    } else {
      assert_int_equal(rc, KVT_EMISS);
      outcomes[2]++;
    }
    assert_int_equal(kvt_drain(c), 0);
  }
  print_message("racing puts: %d stored, %d told KVT_EAGAIN, %d rounds with nothing stored\n", outcomes[0],
                outcomes[1], outcomes[2]);
  free(buf);
  kvt_close(c);
}

/* One thread puts objects under one key (two lengths, in turn) while
 * another removes it: a remove waits for a put in progress, and a put
 * while a remove runs is KVT_EAGAIN, so no put fails half way (never
 * KVT_ENOSPACE: the tiers hold both) and what is stored at the end is one
 * put's object whole. */
typedef struct remover {
  kvt_cache *c;
  const uint32_t *tokens;
  atomic_int stop;
  int bad; /* a remove's code other than 0 or KVT_EMISS */
} remover;

static void *remove_loop(void *arg) {
  remover *r = arg;
  while (!atomic_load(&r->stop)) {
    int rc = kvt_object_remove(r->c, r->tokens, NTOK);
    if (rc != 0 && rc != KVT_EMISS) r->bad = rc;
  }
  return NULL;
}

static void a_remove_racing_puts_takes_whole_objects(void **s) {
  (void)s;
  kvt_cache *c = open_objects(16, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 170);
  enum { PUTS = 60 };
  const size_t lens[2] = {3 * per_part() + 11, 2 * per_part() + 7};
  int rcs[PUTS];
  char *data = alloc_buf(lens[0]);
  remover r = {c, tokens, 0, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, remove_loop, &r), 0);
  for (int i = 0; i < PUTS; i++) {
    kvt_test_fill(data, lens[i % 2], 3000 + (uint64_t)i);
    rcs[i] = kvt_object_put(c, tokens, NTOK, data, lens[i % 2]);
  }
  atomic_store(&r.stop, 1);
  pthread_join(th, NULL);
  assert_int_equal(r.bad, 0);
  for (int i = 0; i < PUTS; i++)
    if (rcs[i] != 0 && rcs[i] != 1 && rcs[i] != KVT_EAGAIN) fail_msg("put %d: %d", i, rcs[i]);
  kvt_object_info info = {.size = sizeof info};
  int rc = kvt_object_find(c, tokens, NTOK, &info);
  if (rc == 0) {
    assert_int_equal(kvt_object_get(c, &info, tokens, data, lens[0]), 0);
    int match = 0;
    for (int i = 0; i < PUTS && !match; i++)
      match = rcs[i] == 0 && lens[i % 2] == info.bytes && kvt_test_check(data, info.bytes, 3000 + (uint64_t)i);
    assert_true(match);
  } else {
    assert_int_equal(rc, KVT_EMISS);
  }
  free(data);
  kvt_close(c);
}

/* Write-back: parts spilled from RAM by later puts and then damaged on
 * disk are refused by the get (KVT_ECORRUPT) and dropped; the object whose
 * parts are in RAM is untouched. */
static void parts_spilled_from_ram_and_damaged_on_disk_are_refused(void **s) {
  (void)s;
  kvt_cache *c = open_objects(4, 16, 1, KVT_LAYOUT_STORAGE);
  uint32_t a[NTOK], b[NTOK];
  conversation(a, NTOK, 160);
  conversation(b, NTOK, 161);
  const size_t len = 2 * per_part() + 99; /* three parts */
  put_pattern(c, a, NTOK, len, 162, 0);
  put_pattern(c, b, NTOK, len, 163, 0); /* four host blocks: two of a's parts spill */
  assert_int_equal(kvt_drain(c), 0);
  kvt_object_info info = find(c, a, NTOK, 0);
  assert_int_equal(info.tier, KVT_TIER_DISK);
  flip_every_payload(16);
  char *buf = alloc_buf(len);
  assert_int_equal(kvt_object_get(c, &info, a, buf, len), KVT_ECORRUPT);
  find(c, a, NTOK, KVT_EMISS);
  get_exact(c, b, NTOK, len, 163, KVT_TIER_HOST);
  free(buf);
  kvt_close(c);
}

/* The first storage completion stalls for 300 ms (not waiting for the
 * test: a call that waits for it returns); slow_started tells it began. */
static atomic_int slow_armed, slow_started;

static int slow_hook(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  if (site != KVT_FAULT_IO_DELAY_US || !atomic_exchange(&slow_armed, 0)) return 0;
  atomic_store(&slow_started, 1);
  return 300000;
}

/* One thread, KVT_WRITE_THROUGH: an object put, removed and put again
 * while the disk copies of its first put are still being written (the
 * put does not wait for them) is replaced, as kvt_object_remove promises:
 * no other call holds its parts. */
static void an_object_removed_while_its_disk_copies_are_written_is_put_again(void **s) {
  (void)s;
  write_policy = KVT_WRITE_THROUGH;
  kvt_cache *c = open_objects(16, 64, 1, KVT_LAYOUT_STORAGE);
  write_policy = KVT_WRITE_BACK;
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 81);
  const size_t len = 2 * per_part() + 999; /* three parts */
  atomic_store(&slow_armed, 1);
  atomic_store(&slow_started, 0);
  kvt__fault_set(slow_hook, NULL);
  put_pattern(c, tokens, NTOK, len, 130, 0);
  while (!atomic_load(&slow_started)) usleep(1000); /* its disk copies in flight */
  assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
  char *buf = alloc_buf(len);
  kvt_test_fill(buf, len, 131);
  int rc = kvt_object_put(c, tokens, NTOK, buf, len);
  assert_int_equal(kvt_drain(c), 0);
  kvt__fault_set(NULL, NULL);
  if (rc != 0) {
    free(buf);
    kvt_close(c);
    fail_msg("put again after the remove: %d", rc);
  }
  get_exact(c, tokens, NTOK, len, 131, KVT_TIER_HOST);
  free(buf);
  kvt_close(c);
}

/* The first storage completion blocks until the test releases it. */
static atomic_int hold_armed, hold_started, hold_release;

static int hold_hook(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  if (site != KVT_FAULT_IO_DELAY_US || !atomic_exchange(&hold_armed, 0)) return 0;
  atomic_store(&hold_started, 1);
  while (!atomic_load(&hold_release)) usleep(1000);
  return 0;
}

typedef struct caller {
  kvt_cache *c;
  const uint32_t *tokens;
  kvt_object_info info;
  char *buf;
  size_t len;
  int remove; /* 1: kvt_object_remove, else kvt_object_get */
  int rc;
  atomic_int done;
} caller;

static void *call_one(void *arg) {
  caller *a = arg;
  a->rc = a->remove ? kvt_object_remove(a->c, a->tokens, NTOK)
                    : kvt_object_get(a->c, &a->info, a->tokens, a->buf, a->len);
  atomic_store(&a->done, 1);
  return NULL;
}

/* A get in progress holds its key. A put of it meanwhile writes nothing
 * (it would rewrite the parts the get reads, and the get would call the
 * mix damaged and remove the new put's parts): 1, as without the get, the
 * object being stored whole. A remove waits for the get, and a put while
 * the remove waits is KVT_EAGAIN. A get that comes while the remove waits
 * waits behind it (gets overlapping on several threads would otherwise
 * keep a remove waiting for good) and then misses. The first get returns
 * the object whole. */
static void a_get_in_progress_holds_its_key(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 90);
  const size_t len = 2 * BLOCK + 77; /* three parts, on disk */
  put_pattern(c, tokens, NTOK, len, 91, 0);
  assert_int_equal(kvt_drain(c), 0);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.tier, KVT_TIER_DISK);
  caller g = {.c = c, .tokens = tokens, .info = info, .buf = alloc_buf(len), .len = len, .rc = -1};
  caller later = {.c = c, .tokens = tokens, .info = info, .buf = alloc_buf(len), .len = len, .rc = -1};
  caller r = {.c = c, .tokens = tokens, .remove = 1, .rc = -1};
  atomic_store(&hold_release, 0);
  atomic_store(&hold_started, 0);
  atomic_store(&hold_armed, 1);
  kvt__fault_set(hold_hook, NULL);
  pthread_t tg, tr, tl;
  assert_int_equal(pthread_create(&tg, NULL, call_one, &g), 0);
  while (!atomic_load(&hold_started)) usleep(1000); /* the get's first read is held */
  char *other = alloc_buf(len);
  kvt_test_fill(other, len, 92);
  int put_during_get = kvt_object_put(c, tokens, NTOK, other, len);
  assert_int_equal(pthread_create(&tr, NULL, call_one, &r), 0);
  int put_rc = 1, tries = 0;
  for (; put_rc == 1 && tries < 5000; tries++) { /* until the remove waits */
    put_rc = kvt_object_put(c, tokens, NTOK, other, len);
    if (put_rc == 1) usleep(1000);
  }
  assert_int_equal(pthread_create(&tl, NULL, call_one, &later), 0);
  usleep(20000);
  int r_done = atomic_load(&r.done), later_done = atomic_load(&later.done);
  atomic_store(&hold_release, 1);
  pthread_join(tg, NULL);
  pthread_join(tr, NULL);
  pthread_join(tl, NULL);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(put_during_get, 1);
  if (put_rc != KVT_EAGAIN) fail_msg("a put while the remove waits: %d after %d tries", put_rc, tries);
  assert_false(r_done);     /* the remove waited for the held get */
  assert_false(later_done); /* the later get waited behind the remove */
  assert_int_equal(g.rc, 0);
  assert_true(kvt_test_check(g.buf, len, 91));
  assert_int_equal(r.rc, 0);
  assert_int_equal(later.rc, KVT_EMISS);
  find(c, tokens, NTOK, KVT_EMISS);
  put_pattern(c, tokens, NTOK, len, 92, 0); /* the key is free again */
  get_exact(c, tokens, NTOK, len, 92, KVT_TIER_DISK);
  free(other);
  free(g.buf);
  free(later.buf);
  kvt_close(c);
}

static void bad_arguments(void **s) {
  (void)s;
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 6);
  char buf[100] = {0};
  kvt_object_info info = {.size = sizeof info};
  assert_int_equal(kvt_object_put(NULL, tokens, NTOK, buf, sizeof buf), -EINVAL);
  assert_int_equal(kvt_object_find(NULL, tokens, NTOK, &info), -EINVAL);
  assert_int_equal(kvt_object_get(NULL, &info, tokens, buf, sizeof buf), -EINVAL);
  assert_int_equal(kvt_object_remove(NULL, tokens, NTOK), -EINVAL);

  kvt_cache *c = open_objects(8, 0, 1, KVT_LAYOUT_STORAGE);
  assert_int_equal(kvt_object_put(c, NULL, NTOK, buf, sizeof buf), -EINVAL);
  assert_int_equal(kvt_object_put(c, tokens, NTOK, NULL, sizeof buf), -EINVAL);
  assert_int_equal(kvt_object_put(c, tokens, NTOK, buf, 0), -EINVAL);
  assert_int_equal(kvt_object_put(c, tokens, BT - 1, buf, sizeof buf), -EINVAL); /* no full block */
  char *big = calloc(9, BLOCK);
  assert_non_null(big);
  assert_int_equal(kvt_object_put(c, tokens, BT, big, 9 * BLOCK), KVT_ENOSPACE); /* more than the tiers hold */
  find(c, tokens, NTOK, KVT_EMISS);
  free(big);
  assert_int_equal(kvt_object_find(c, tokens, NTOK, NULL), -EINVAL);
  info.size = 4;
  assert_int_equal(kvt_object_find(c, tokens, NTOK, &info), KVT_EVERSION);
  info.size = sizeof info;
  assert_int_equal(kvt_object_put(c, tokens, NTOK, buf, sizeof buf), 0);
  info = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_get(c, &info, tokens, buf, sizeof buf - 1), -ENOBUFS);
  assert_int_equal(kvt_object_get(c, &info, NULL, buf, sizeof buf), -EINVAL);
  kvt_object_info forged = info;
  forged.parts = 3; /* does not fit the bytes */
  assert_int_equal(kvt_object_get(c, &forged, tokens, buf, sizeof buf), -EINVAL);
  kvt_close(c);

  c = open_objects(8, 0, 1, 0); /* owner mode: objects need storage mode */
  assert_int_equal(kvt_object_put(c, tokens, NTOK, buf, sizeof buf), KVT_ESTATE);
  kvt_close(c);
}

/* find described one object; another was put under its key before the
 * get: a miss (find again), not a damaged object, which stays. Also when
 * find took the header from what this cache remembered of the first put. */
static void an_object_put_since_find_is_a_miss(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  conversation(tokens, NTOK, 40);
  put_pattern(c, tokens, NTOK, 2 * BLOCK, 41, 0);
  kvt_object_info old = find(c, tokens, NTOK, 0);
  assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
  put_pattern(c, tokens, NTOK - 3, 3 * BLOCK + 5, 42, 0);
  char *buf = alloc_buf(4 * BLOCK);
  assert_int_equal(kvt_object_get(c, &old, tokens, buf, 4 * BLOCK), KVT_EMISS);
  get_exact(c, tokens, NTOK, 3 * BLOCK + 5, 42, KVT_TIER_DISK);
  free(buf);
  kvt_close(c);
}

/* find described one object; another, longer but of as many parts, was
 * put under the same key before the get. Its last part has bytes past the
 * pages the get reads of the described one's: still a miss, not a damaged
 * object (nothing counted as a checksum failure), and the new one stays,
 * whole. Also for an object of one part. */
static void a_longer_object_put_since_find_is_a_miss(void **s) {
  (void)s;
  const size_t per = per_part();
  const size_t lens[][2] = {{2 * per + 10, 3 * per}, {100, per}};
  for (uint32_t i = 0; i < 2; i++) {
    kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
    uint32_t tokens[NTOK];
    conversation(tokens, NTOK, 45 + i);
    put_pattern(c, tokens, NTOK, lens[i][0], 46, 0);
    assert_int_equal(kvt_drain(c), 0);
    kvt_object_info old = find(c, tokens, NTOK, 0);
    assert_int_equal(kvt_object_remove(c, tokens, NTOK), 0);
    put_pattern(c, tokens, NTOK, lens[i][1], 47, 0);
    assert_int_equal(kvt_drain(c), 0);
    assert_int_equal(find(c, tokens, NTOK, 0).parts, old.parts);
    char *buf = alloc_buf(lens[i][1]);
    assert_int_equal(kvt_object_get(c, &old, tokens, buf, lens[i][1]), KVT_EMISS);
    kvt_stats st = {.size = sizeof st};
    assert_int_equal(kvt_get_stats(c, &st), 0);
    assert_int_equal(st.checksum_failures, 0);
    get_exact(c, tokens, NTOK, lens[i][1], 47, KVT_TIER_DISK);
    free(buf);
    kvt_close(c);
  }
}

/* Buffers the disk tier cannot move straight: one byte off a page, and
 * page-aligned ones when every region of the storage table is taken (the
 * object's calls register theirs for the call only). Both go through
 * staging, byte-exact. */
static void unaligned_or_unregistered_buffers_round_trip(void **s) {
  (void)s;
  kvt_cache *c = open_objects(0, 64, 1, KVT_LAYOUT_STORAGE);
  uint32_t tokens[NTOK];
  const size_t len = 3 * BLOCK + 4321;
  char *mem = alloc_buf(len + 1);
  kvt_test_fill(mem + 1, len, 61);
  conversation(tokens, NTOK, 30);
  assert_int_equal(kvt_object_put(c, tokens, NTOK, mem + 1, len), 0);
  memset(mem, 0, len + 1);
  kvt_object_info info = find(c, tokens, NTOK, 0);
  assert_int_equal(info.tier, KVT_TIER_DISK);
  assert_int_equal(kvt_object_get(c, &info, tokens, mem + 1, len), 0);
  assert_true(kvt_test_check(mem + 1, len, 61));
  free(mem);

  enum { REGIONS = 64 };
  char *pages = alloc_buf(REGIONS * PAGE);
  kvt_region r[REGIONS];
  uint32_t n = 0;
  while (n < REGIONS && kvt_register_memory(c, pages + (size_t)n * PAGE, PAGE, KVT_MEM_HOST, &r[n]) == 0) n++;
  assert_true(n > 0);
  conversation(tokens, NTOK, 31);
  put_pattern(c, tokens, NTOK, len, 62, 0);
  get_exact(c, tokens, NTOK, len, 62, KVT_TIER_DISK);
  for (uint32_t i = 0; i < n; i++) assert_int_equal(kvt_unregister_memory(c, r[i]), 0);
  free(pages);
  /* With the table free again, straight, the same bytes. */
  get_exact(c, tokens, NTOK, len, 62, KVT_TIER_DISK);
  kvt_close(c);
}

static int small_parts(void **s) {
  (void)s;
  block_bytes = 16384;
  return 0;
}

static int page_parts(void **s) {
  (void)s;
  block_bytes = 65536;
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(objects_of_any_size_round_trip_exactly),
      cmocka_unit_test(host_victims_serve_from_disk),
      cmocka_unit_test(the_longest_stored_prefix_is_found),
      cmocka_unit_test(a_second_put_is_kept_and_remove_forgets),
      cmocka_unit_test(a_corrupted_part_is_a_miss),
      cmocka_unit_test(a_many_part_object_from_disk),
      cmocka_unit_test(a_get_keeps_a_window_of_reads_in_flight),
      cmocka_unit_test(parts_are_split_while_each_job_has_four_or_1_mib),
      cmocka_unit_test(a_get_of_2_mib_in_large_parts_uses_both_workers),
      cmocka_unit_test(a_part_of_another_put_is_refused),
      cmocka_unit_test(objects_on_disk_survive_a_reopen),
      cmocka_unit_test(a_find_and_get_after_a_reopen_read_each_part_once),
      cmocka_unit_test(objects_a_reopen_forgot_are_found_by_reading_part_0),
      cmocka_unit_test(a_reopen_remembers_hundreds_of_objects),
      cmocka_unit_test(a_full_bucket_forgets_the_header_used_longest_ago),
      cmocka_unit_test(a_find_racing_a_put_again_remembers_nothing_stale),
      cmocka_unit_test(an_object_put_since_find_is_a_miss),
      cmocka_unit_test(a_longer_object_put_since_find_is_a_miss),
      cmocka_unit_test(unaligned_or_unregistered_buffers_round_trip),
      cmocka_unit_test(the_last_part_is_read_no_further_than_the_object),
      cmocka_unit_test(a_put_while_another_call_holds_a_part_is_eagain),
      cmocka_unit_test(an_object_removed_while_its_disk_copies_are_written_is_put_again),
      cmocka_unit_test(a_block_that_looks_like_a_part_0_is_refused),
      cmocka_unit_test(racing_puts_of_one_key_store_one_whole_object),
      cmocka_unit_test(a_remove_racing_puts_takes_whole_objects),
      cmocka_unit_test(a_get_in_progress_holds_its_key),
      cmocka_unit_test(parts_spilled_from_ram_and_damaged_on_disk_are_refused),
      cmocka_unit_test(bad_arguments),
  };
  int failed = cmocka_run_group_tests_name("parts of 16 KiB", tests, small_parts, NULL);
  return failed + cmocka_run_group_tests_name("parts of 64 KiB", tests, page_parts, NULL);
}
