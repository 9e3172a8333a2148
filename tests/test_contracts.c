/* The public contracts around the calls themselves: struct sizes that grow
 * in both directions, layouts that cannot wrap or overlap, fork(), the
 * error detail string, bookkeeping limits, and failed allocations. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kv_fixture.h"
#include "kvtier/backend.h"
#include "util/fault.h"

#define BT 16

static kvt_layout fixture_layout(fixture *f) {
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.segments_per_layer = 2;
  lay.num_slots = f->slots;
  lay.segments = f->seg;
  return lay;
}

/* ---- struct sizes ---- */

/* A caller built against the first version of kvt_config (no tail padding
 * counted, 4 bytes short of today's sizeof) still opens a cache. */
static void config_of_the_first_version_opens(void **state) {
  kvt_config cfg = fixture_config(4);
  cfg.size = KVT_CONFIG_SIZE_V1;
  assert_true(KVT_CONFIG_SIZE_V1 <= sizeof cfg);
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_close(c);
  cfg.size = KVT_CONFIG_SIZE_V1 - 1;
  assert_int_equal(kvt_open(&cfg, &c), KVT_EVERSION);
  assert_null(c);
}

/* A newer caller's larger struct: zero bytes past what this library knows
 * are accepted (their fields keep defaults), a nonzero one is refused. */
static void larger_config_needs_a_zero_tail(void **state) {
  struct {
    kvt_config cfg;
    unsigned char newer[16];
  } big;
  memset(&big, 0, sizeof big);
  big.cfg = fixture_config(4);
  big.cfg.size = sizeof big;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&big.cfg, &c), 0);
  kvt_close(c);
  big.newer[9] = 1;
  assert_int_equal(kvt_open(&big.cfg, &c), KVT_EVERSION);
  /* An unset size (garbage far past any version) is refused unread. */
  kvt_config cfg = fixture_config(4);
  cfg.size = 0x7fffffff;
  assert_int_equal(kvt_open(&cfg, &c), KVT_EVERSION);
}

static void layout_of_the_first_version_registers(void **state) {
  fixture f = {.slots = 4};
  kvt_config cfg = fixture_config(4);
  assert_int_equal(kvt_open(&cfg, &f.c), 0);
  unsigned char *pool = calloc(FIX_LAYERS * 2, 4 * 256);
  for (int i = 0; i < FIX_LAYERS * 2; i++) f.seg[i] = (kvt_segment){pool + i * 4 * 256, 256, 256};
  kvt_layout lay = fixture_layout(&f);
  lay.size = KVT_LAYOUT_SIZE_V1;
  assert_int_equal(kvt_register_layout(f.c, &lay), 0);
  assert_int_equal(kvt_block_bytes(f.c), FIX_LAYERS * 2 * 256);
  kvt_close(f.c);
  free(pool);
}

/* Output structs: an older caller's smaller kvt_stats gets its own fields
 * and nothing written past them; size says how much was written. */
static void short_stats_written_up_to_the_callers_size(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 1, 2, k, t);
  run_request(&f, k, t, 2, 1);
  kvt_stats st;
  memset(&st, 0xEE, sizeof st);
  st.size = KVT_STATS_SIZE_V1;
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.size, KVT_STATS_SIZE_V1);
  assert_int_equal(st.acquires, 1);
  assert_int_equal(st.misses, 2);
  const unsigned char *tail = (const unsigned char *)&st + KVT_STATS_SIZE_V1;
  for (size_t i = 0; i < sizeof st - KVT_STATS_SIZE_V1; i++) assert_int_equal(tail[i], 0xEE);
  /* A newer caller's larger struct: our fields, size = what we wrote. */
  struct {
    kvt_stats st;
    uint64_t newer;
  } big;
  big.st.size = sizeof big;
  big.newer = 0x1234;
  assert_int_equal(kvt_get_stats(f.c, &big.st), 0);
  assert_int_equal(big.st.size, sizeof(kvt_stats));
  assert_int_equal(big.newer, 0x1234);
  assert_int_equal(big.st.acquires, 1);
  st.size = KVT_STATS_SIZE_V1 - 8;
  assert_int_equal(kvt_get_stats(f.c, &st), KVT_EVERSION);
  fixture_close(&f);
}

static void small_lookup_and_acquire_info_are_filled(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 2, 2, k, t);
  run_request(&f, k, t, 2, 2);
  kvt_lookup_result lr = {.size = KVT_LOOKUP_RESULT_SIZE_V1};
  assert_int_equal(kvt_lookup(f.c, k, 2, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 2);
  assert_int_equal(lr.n_device, 2);
  kvt_acquire_info info = {.size = KVT_ACQUIRE_INFO_SIZE_V1};
  kvt_req r;
  uint32_t slots[2];
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r, slots, &info), 0);
  assert_int_equal(info.n_restore, 2);
  assert_int_equal(info.n_device_hits, 2);
  assert_int_equal(kvt_release(f.c, r), 0);
  fixture_close(&f);
}

/* ---- layout validation ---- */

static int register_with(kvt_cache **c, const kvt_segment *seg, uint32_t n_layers, uint32_t spl, uint32_t slots) {
  kvt_config cfg = fixture_config(4);
  assert_int_equal(kvt_open(&cfg, c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = n_layers;
  lay.segments_per_layer = spl;
  lay.num_slots = slots;
  lay.segments = seg;
  return kvt_register_layout(*c, &lay);
}

/* stride = 2^62: slot 3 lies past the end of the address space. */
static void stride_past_the_address_space_is_refused(void **state) {
  static unsigned char buf[4096];
  kvt_segment seg[2] = {{buf, (size_t)1 << 62, 64}, {buf + 2048, 64, 64}};
  kvt_cache *c;
  assert_int_equal(register_with(&c, seg, 1, 2, 4), -EINVAL);
  assert_non_null(strstr(kvt_error_detail(c), "segment 0"));
  assert_int_equal(kvt_block_bytes(c), 0);
  kvt_close(c);
}

/* Segment bytes whose sum wraps size_t (block bytes would become 0). */
static void block_bytes_that_wrap_are_refused(void **state) {
  static unsigned char buf[4096];
  size_t half = (size_t)1 << 63;
  kvt_segment seg[2] = {{buf, half, half}, {buf + 1, half, half}};
  kvt_cache *c;
  assert_int_equal(register_with(&c, seg, 1, 2, 1), -EINVAL);
  assert_true(kvt_error_detail(c)[0] != '\0');
  assert_int_equal(kvt_block_bytes(c), 0);
  kvt_close(c);
}

static void overlapping_segments_are_refused(void **state) {
  static unsigned char buf[64 * 1024];
  kvt_cache *c;
  /* Same base twice. */
  kvt_segment same[2] = {{buf, 256, 256}, {buf, 256, 256}};
  assert_int_equal(register_with(&c, same, 1, 2, 8), -EINVAL);
  assert_non_null(strstr(kvt_error_detail(c), "segments 0 and 1 overlap"));
  kvt_close(c);
  /* V starts one byte inside K's last slot. */
  kvt_segment tail[2] = {{buf, 256, 256}, {buf + 7 * 256 + 255, 256, 256}};
  assert_int_equal(register_with(&c, tail, 1, 2, 8), -EINVAL);
  kvt_close(c);
  /* Interleaved with one stride, but V's slot reaches into K's next one. */
  kvt_segment inter[2] = {{buf, 512, 256}, {buf + 300, 512, 256}};
  assert_int_equal(register_with(&c, inter, 1, 2, 8), -EINVAL);
  kvt_close(c);
  /* Interleaved K and V of one block (FlashInfer's (blocks, 2, ...)): fine. */
  kvt_segment fi[2] = {{buf, 512, 256}, {buf + 256, 512, 256}};
  assert_int_equal(register_with(&c, fi, 1, 2, 8), 0);
  assert_string_equal(kvt_error_detail(c), "");
  kvt_close(c);
  /* vLLM's halves: K then V, each contiguous. */
  kvt_segment halves[4] = {{buf, 256, 256}, {buf + 2048, 256, 256}, {buf + 4096, 256, 256}, {buf + 6144, 256, 256}};
  assert_int_equal(register_with(&c, halves, 2, 2, 8), 0);
  kvt_close(c);
}

/* ---- fork ---- */

/* The child's first call used to hang on a lock held by a parent thread or
 * wait for workers that do not exist there: now every call says so. */
static void a_forked_child_gets_eforked(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 3, 2, k, t);
  run_request(&f, k, t, 2, 3);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(20); /* a hang shows up as SIGALRM, not as a stuck test */
    kvt_lookup_result lr = {.size = sizeof lr};
    kvt_stats st = {.size = sizeof st};
    kvt_req r;
    kvt_job j;
    uint32_t slots[2];
    int bad = 0;
    bad |= kvt_lookup(f.c, k, 2, &lr, NULL) != KVT_EFORKED;
    bad |= kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r, slots, NULL) != KVT_EFORKED;
    bad |= kvt_store(f.c, k, 2, 0, &j) != KVT_EFORKED;
    bad |= kvt_get_stats(f.c, &st) != KVT_EFORKED;
    bad |= kvt_drain(f.c) != KVT_EFORKED;
    kvt_close(f.c); /* frees nothing in the child, and returns */
    _exit(bad ? 3 : 0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  /* The parent's cache is untouched by all that. */
  assert_int_equal(fixture_lookup(&f, k, 2).n_device, 2);
  assert_int_equal(run_request(&f, k, t, 2, 3), 2);
  fixture_close(&f);
}

/* ---- limits and small contracts ---- */

static void open_checks_queue_depth_and_request_limits(void **state) {
  kvt_config cfg = fixture_config(4);
  kvt_cache *c = NULL;
  kvt_config def;
  kvt_config_init(&def);
  assert_int_equal(def.disk_queue_depth, 0); /* the default: chosen from the record size */
  cfg.disk_queue_depth = 1u << 20;
  assert_int_equal(kvt_open(&cfg, &c), -EINVAL);
  cfg = fixture_config(4);
  cfg.max_requests = UINT32_MAX;
  assert_int_equal(kvt_open(&cfg, &c), -EINVAL);
  assert_null(c);
}

static uint64_t metadata_with_requests(uint32_t max_requests) {
  kvt_config cfg = fixture_config(4);
  cfg.max_requests = max_requests;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_stats st = fixture_stats(&f);
  fixture_close(&f);
  return st.metadata_bytes;
}

/* The request table is allocated at registration, so it is counted. */
static void metadata_bytes_count_the_request_table(void **state) {
  uint64_t few = metadata_with_requests(16), many = metadata_with_requests(16 + 4096);
  assert_true(many > few);
  assert_true(many - few >= 4096 * 16);
}

static void locked_disk_file_says_so(void **state) {
  char path[4200];
  snprintf(path, sizeof path, "%s/locked.kvt", kvt_test_tmpdir());
  kvt_config cfg = fixture_config(4);
  cfg.disk_path = path;
  cfg.disk_blocks = 8;
  cfg.disk_backend = KVT_DISK_THREADS;
  cfg.disk_reset = 1;
  fixture a;
  fixture_open_cfg(&a, &cfg, 8);
  kvt_cache *b;
  assert_int_equal(kvt_open(&cfg, &b), 0);
  fixture g = {.slots = 8};
  memcpy(g.seg, a.seg, sizeof g.seg);
  kvt_layout lay = fixture_layout(&g);
  assert_int_equal(kvt_register_layout(b, &lay), KVT_ELOCKED);
  assert_non_null(strstr(kvt_error_detail(b), path));
  assert_non_null(strstr(kvt_strerror(KVT_ELOCKED), "in use"));
  kvt_close(b);
  fixture_close(&a);
}

static void bad_disk_path_is_named_in_the_detail(void **state) {
  kvt_config cfg = fixture_config(4);
  cfg.disk_path = "/nonexistent-dir-for-kvtier/cache.kvt";
  cfg.disk_blocks = 8;
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  fixture g = {.slots = 8};
  unsigned char *pool = calloc(FIX_LAYERS * 2, 8 * 64);
  for (int i = 0; i < FIX_LAYERS * 2; i++) g.seg[i] = (kvt_segment){pool + i * 8 * 64, 64, 64};
  kvt_layout lay = fixture_layout(&g);
  assert_int_equal(kvt_register_layout(c, &lay), -ENOENT);
  assert_non_null(strstr(kvt_error_detail(c), "/nonexistent-dir-for-kvtier/cache.kvt"));
  assert_int_equal(kvt_register_layout(c, &lay), KVT_ESTATE);
  kvt_close(c);
  free(pool);
  assert_string_equal(kvt_error_detail(NULL), "");
}

#ifdef KVT_FAULT_INJECTION
static int fail_alloc_arg;
static int fail_alloc(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_ALLOC && arg == fail_alloc_arg ? -ENOMEM : 0;
}

/* Both out-of-memory paths of kvt_open return -ENOMEM, leak nothing and
 * leave no half-made cache behind (ASan checks the rest). */
static void open_out_of_memory_is_clean(void **state) {
  kvt_config cfg = fixture_config(4);
  cfg.disk_path = "/tmp/unused-by-this-test.kvt";
  cfg.disk_blocks = 8;
  int args[] = {KVT_ALLOC_OPEN_FINGERPRINT, KVT_ALLOC_OPEN_DISK_PATH};
  for (int i = 0; i < 2; i++) {
    fail_alloc_arg = args[i];
    kvt__fault_set(fail_alloc, NULL);
    kvt_cache *c = (kvt_cache *)0x1;
    assert_int_equal(kvt_open(&cfg, &c), -ENOMEM);
    assert_null(c);
    kvt__fault_set(NULL, NULL);
  }
}

/* Without its geometry the namespace could alias another layout's: a
 * failed allocation there fails the registration instead. */
static void namespace_allocation_failure_fails_registration(void **state) {
  kvt_config cfg = fixture_config(4);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  fixture g = {.slots = 8};
  unsigned char *pool = calloc(FIX_LAYERS * 2, 8 * 64);
  for (int i = 0; i < FIX_LAYERS * 2; i++) g.seg[i] = (kvt_segment){pool + i * 8 * 64, 64, 64};
  kvt_layout lay = fixture_layout(&g);
  fail_alloc_arg = KVT_ALLOC_NAMESPACE;
  kvt__fault_set(fail_alloc, NULL);
  assert_int_equal(kvt_register_layout(c, &lay), -ENOMEM);
  kvt__fault_set(NULL, NULL);
  kvt_key ns;
  assert_int_equal(kvt_namespace(c, &ns), KVT_ELAYOUT);
  kvt_close(c);
  free(pool);
}
#endif

/* ---- per-block load results ---- */

#ifdef KVT_FAULT_INJECTION
static int fail_h2d(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_DEV_COMPLETE && arg == KVT_XFER_H2D ? -EIO : 0;
}

/* Block 0 only on the host, block 1 on the device (shared). When block 0's
 * load fails, n_ready = 0, and the engine recomputes [0, 2): block 1's slot
 * must then be the request's own, not the shared one another request may
 * be reading. The per-block states say which load failed. */
static void a_failed_load_never_hands_out_a_shared_slot(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(&f, 7, 3, k, t);
  run_request(&f, k, t, 3, 7);
  fixture_offload(&f, k, 1); /* block 0 -> host; blocks 1, 2 stay on the device */
  uint32_t e1 = kvt__index_find(&f.c->map, &k[1]);
  assert_int_not_equal(e1, KVT__NONE);
  uint32_t shared = kvt__E(f.c, e1)->slot[0];
  assert_int_equal(kvt__E(f.c, e1)->state[0], KVT__VALID);
  kvt__fault_set(fail_h2d, NULL);
  kvt_req r;
  uint32_t slots[3], ready = 99;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, k, t, 3, 3, 0, 0, &r, slots, &info), 1);
  uint8_t st[3] = {9, 9, 9};
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(ready, 0);
  assert_int_equal(info.n_restore, 1); /* restoring stopped before the shared hit */
  assert_int_equal(info.n_device_hits, 0);
  for (int i = 0; i < 3; i++) assert_int_not_equal(slots[i], shared);
  assert_int_equal(kvt_request_block_states(f.c, r, st, 3), 0);
  assert_int_equal(st[0], KVT_BLOCK_FAILED);
  assert_int_equal(st[1], KVT_BLOCK_COMPUTE);
  assert_int_equal(st[2], KVT_BLOCK_COMPUTE);
  assert_int_equal(kvt_request_block_states(f.c, r, st, 4), -EINVAL);
  /* The engine recomputes into its own slots; the shared copy is intact. */
  for (int i = 0; i < 3; i++) fixture_write(&f, slots[i], block_seed(7, (uint32_t)i) ^ 0xdead);
  assert_true(fixture_check(&f, shared, block_seed(7, 1)));
  assert_int_equal(kvt_release(f.c, r), 0);
  fixture_close(&f);
}
#endif

/* A leading run of device hits is still shared and READY. */
static void block_states_after_a_clean_restore(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(&f, 8, 3, k, t);
  run_request(&f, k, t, 2, 8);
  kvt_req r;
  uint32_t slots[3];
  assert_int_equal(kvt_acquire(f.c, k, t, 3, 3, 0, 0, &r, slots, NULL), 0);
  uint8_t st[3];
  assert_int_equal(kvt_request_block_states(f.c, r, st, 3), 0);
  assert_int_equal(st[0], KVT_BLOCK_READY);
  assert_int_equal(st[1], KVT_BLOCK_READY);
  assert_int_equal(st[2], KVT_BLOCK_COMPUTE);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(kvt_request_block_states(f.c, r, st, 3), KVT_ENOJOB);
  fixture_close(&f);
}

/* ---- keys that continue a chain ---- */

/* A tail (blocks 2, 3 hashed with block 1's key as parent) acquired with
 * its parent is cached under that parent: the full chain then restores all
 * four blocks (it restored 2, the tail being recorded as if it started the
 * sequence). */
static void a_tail_acquired_after_its_parent_joins_the_chain(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 9, 4, k, t);
  run_request(&f, k, t, 2, 9); /* blocks 0, 1 */
  kvt_key tail[2];
  size_t nk = 0;
  assert_int_equal(kvt_hash_tokens(f.c, &k[1], t + 2 * BT, 2 * BT, tail, 2, &nk), 0);
  assert_memory_equal(tail, k + 2, sizeof tail);
  kvt_req r;
  uint32_t slots[2];
  assert_int_equal(kvt_acquire_after(f.c, &k[1], tail, t + 2 * BT, 2, 2, 0, 0, &r, slots, NULL), 0);
  fixture_write(&f, slots[0], block_seed(9, 2));
  fixture_write(&f, slots[1], block_seed(9, 3));
  assert_int_equal(kvt_commit(f.c, r, 2, NULL), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  assert_int_equal(fixture_lookup(&f, k, 4).n_prefix, 4);
  assert_int_equal(run_request(&f, k, t, 4, 9), 4);
  /* The same tail through kvt_acquire (no parent) finds nothing. */
  assert_int_equal(kvt_acquire(f.c, tail, t + 2 * BT, 2, 2, 0, 0, &r, slots, NULL), 0);
  uint8_t st[2];
  assert_int_equal(kvt_request_block_states(f.c, r, st, 2), 0);
  assert_int_equal(st[0], KVT_BLOCK_COMPUTE);
  assert_int_equal(kvt_release(f.c, r), 0);
  fixture_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(config_of_the_first_version_opens),
      cmocka_unit_test(larger_config_needs_a_zero_tail),
      cmocka_unit_test(layout_of_the_first_version_registers),
      cmocka_unit_test(short_stats_written_up_to_the_callers_size),
      cmocka_unit_test(small_lookup_and_acquire_info_are_filled),
      cmocka_unit_test(stride_past_the_address_space_is_refused),
      cmocka_unit_test(block_bytes_that_wrap_are_refused),
      cmocka_unit_test(overlapping_segments_are_refused),
      cmocka_unit_test(a_forked_child_gets_eforked),
      cmocka_unit_test(open_checks_queue_depth_and_request_limits),
      cmocka_unit_test(metadata_bytes_count_the_request_table),
      cmocka_unit_test(locked_disk_file_says_so),
      cmocka_unit_test(bad_disk_path_is_named_in_the_detail),
      cmocka_unit_test(block_states_after_a_clean_restore),
      cmocka_unit_test(a_tail_acquired_after_its_parent_joins_the_chain),
#ifdef KVT_FAULT_INJECTION
      cmocka_unit_test(open_out_of_memory_is_clean),
      cmocka_unit_test(namespace_allocation_failure_fails_registration),
      cmocka_unit_test(a_failed_load_never_hands_out_a_shared_slot),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
