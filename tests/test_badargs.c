/* Bad input to every public function (everything KVT_API in include/kvtier):
 * oversized, misaligned and inconsistent arguments each get the documented
 * code, nothing crashes or leaks (ASan runs this file), and the next valid
 * call still works. Tests named regression_* pin library bugs
 * this file found (all fixed). */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>

#include "kv_fixture.h"
#include "kvtier/backend.h"
#include "util/fault.h"

#define BT 16

/* After every bad call the cache still serves a conversation end to end. */
static void still_works(fixture *f, uint32_t conv) {
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(f, conv, 3, k, t);
  uint32_t first = run_request(f, k, t, 3, conv);
  assert_true(first <= 3);
  assert_int_equal(run_request(f, k, t, 3, conv), 3);
}

static kvt_layout fixture_layout(fixture *f) {
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.segments_per_layer = 2;
  lay.num_slots = f->slots;
  lay.segments = f->seg;
  return lay;
}

/* ---- version, errors, init functions ---- */

static void strerror_never_null(void **state) {
  int codes[] = {0, 1, 2, -1, -EINVAL, -4095, -4096, -3000, -3016, -3999, -99999, INT_MIN, INT_MAX, 12345};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *s = kvt_strerror(codes[i]);
    assert_non_null(s);
    assert_true(s[0] != '\0');
  }
  assert_string_equal(kvt_strerror(12345), "unknown kvtier error code");
  assert_string_equal(kvt_strerror(KVT_ECANCELED), "job was cancelled");
  assert_non_null(kvt_version());
  assert_true(kvt_version_number() > 0);
}

static void init_functions_accept_null_and_set_defaults(void **state) {
  kvt_config_init(NULL);
  kvt_layout_init(NULL);
  kvt_model_init(NULL);
  kvt_hw_init(NULL);
  kvt_config cfg;
  memset(&cfg, 0xff, sizeof cfg);
  kvt_config_init(&cfg);
  assert_int_equal(cfg.size, sizeof cfg);
  assert_int_equal(cfg.block_tokens, 16);
  assert_null(cfg.model_fingerprint);
  assert_null(cfg.disk_path);
  kvt_layout lay;
  memset(&lay, 0xff, sizeof lay);
  kvt_layout_init(&lay);
  assert_int_equal(lay.size, sizeof lay);
  assert_null(lay.segments);
  assert_int_equal(lay.flags, 0);
}

/* ---- kvt_open ---- */

static void open_rejects_bad_configs(void **state) {
  kvt_cache *c = (kvt_cache *)0x1;
  kvt_config cfg = fixture_config(4);
  assert_int_equal(kvt_open(NULL, &c), -EINVAL);
  assert_int_equal(kvt_open(&cfg, NULL), -EINVAL);
  struct {
    const char *what;
    int expect;
  } cases[] = {
      {"size 0", KVT_EVERSION}, {"below v1", KVT_EVERSION}, {"bt 0", -EINVAL}, {"bt 8", -EINVAL},
      {"bt 24", -EINVAL}, {"bt 2048", -EINVAL}, {"fp NULL", -EINVAL}, {"fp empty", -EINVAL},
      {"tp 0", -EINVAL}, {"rank>=size", -EINVAL}, {"max_requests 0", -EINVAL},
      {"max_jobs 0", -EINVAL}, {"max_job_blocks 0", -EINVAL}, {"device 7", -EINVAL},
      {"device -1", -EINVAL}, {"disk backend 9", -EINVAL}, {"disk path, 0 blocks", -EINVAL},
      {"host blocks 2^32", -EINVAL}, {"disk blocks 2^32", -EINVAL},
      {"remote url empty", -EINVAL}, {"remote without host tier", -EINVAL}, {"remote conns 65", -EINVAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cfg = fixture_config(4);
    switch (i) {
    case 0: cfg.size = 0; break;
    case 1: cfg.size = KVT_CONFIG_SIZE_V1 - 4; break;
    case 2: cfg.block_tokens = 0; break;
    case 3: cfg.block_tokens = 8; break;
    case 4: cfg.block_tokens = 24; break;
    case 5: cfg.block_tokens = 2048; break;
    case 6: cfg.model_fingerprint = NULL; break;
    case 7: cfg.model_fingerprint = ""; break;
    case 8: cfg.tp_size = 0; break;
    case 9: cfg.tp_rank = 2, cfg.tp_size = 2; break;
    case 10: cfg.max_requests = 0; break;
    case 11: cfg.max_jobs = 0; break;
    case 12: cfg.max_job_blocks = 0; break;
    case 13: cfg.device = (kvt_device_kind)7; break;
    case 14: cfg.device = (kvt_device_kind)-1; break;
    case 15: cfg.disk_backend = (kvt_disk_backend)9; break;
    case 16: cfg.disk_path = "/nonexistent/x", cfg.disk_blocks = 0; break;
    case 17: cfg.host_blocks = 1ull << 32; break;
    case 18: cfg.disk_path = "/nonexistent/x", cfg.disk_blocks = 1ull << 32; break;
    case 19: cfg.remote_url = ""; break;
    case 20: cfg.remote_url = "redis://127.0.0.1:1", cfg.host_blocks = 0; break;
    case 21: cfg.remote_url = "redis://127.0.0.1:1", cfg.remote_conns_per_node = 65; break;
    }
    c = (kvt_cache *)0x1;
    int rc = kvt_open(&cfg, &c);
    if (rc != cases[i].expect) fail_msg("kvt_open(%s) = %d (%s), want %d", cases[i].what, rc, kvt_strerror(rc), cases[i].expect);
    assert_null(c); /* *out is cleared on failure */
  }
  /* The caller's fingerprint and path are copied: the cache outlives them. */
  char fp[32];
  snprintf(fp, sizeof fp, "model-%d", 7);
  cfg = fixture_config(4);
  cfg.model_fingerprint = fp;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  memset(fp, 'x', sizeof fp - 1);
  kvt_close(c);
  kvt_close(NULL);
}

/* Documented: "With cfg->device = KVT_DEVICE_CUDA and no GPU, returns
 * KVT_ENODEV" (from kvt_open). Builds with the toolkit but no GPU defer the
 * check to kvt_register_layout; either way nothing else may succeed. */
static void cuda_without_gpu_is_enodev(void **state) {
  fixture probe;
  fixture_open(&probe, 4, 0);
  int have_gpu = strcmp(kvt_device_backend_name(probe.c), "cuda") == 0;
  fixture_close(&probe);
  if (have_gpu) skip();
  kvt_config cfg = fixture_config(4);
  cfg.device = KVT_DEVICE_CUDA;
  kvt_cache *c = NULL;
  int rc = kvt_open(&cfg, &c);
  if (rc == 0) {
    fixture f = {.slots = 4};
    for (int i = 0; i < FIX_LAYERS * 2; i++) f.seg[i] = (kvt_segment){(void *)(uintptr_t)(0x1000 + 0x1000 * i), 64, 64};
    kvt_layout lay = fixture_layout(&f);
    rc = kvt_register_layout(c, &lay);
    kvt_close(c);
  }
  assert_int_equal(rc, KVT_ENODEV);
}

/* ---- kvt_register_layout ---- */

static void register_layout_rejects_bad_layouts(void **state) {
  kvt_config cfg = fixture_config(4);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  unsigned char *mem = calloc(8, 4096);
  kvt_segment seg[FIX_LAYERS * 2];
  for (int i = 0; i < FIX_LAYERS * 2; i++) seg[i] = (kvt_segment){mem + i * 512, 4096, 512};
  kvt_layout good;
  kvt_layout_init(&good);
  good.num_layers = FIX_LAYERS;
  good.num_slots = 8;
  good.segments = seg;
  assert_int_equal(kvt_register_layout(NULL, &good), -EINVAL);
  assert_int_equal(kvt_register_layout(c, NULL), -EINVAL);
  for (int i = 0; i < 11; i++) {
    kvt_layout l = good;
    kvt_segment s[FIX_LAYERS * 2];
    memcpy(s, seg, sizeof s);
    l.segments = s;
    int want = -EINVAL;
    switch (i) {
    case 0: l.size = 4, want = KVT_EVERSION; break;
    case 1: l.num_layers = 0; break;
    case 2: l.segments_per_layer = 0; break;
    case 3: l.num_slots = 0; break;
    case 4: l.num_slots = UINT32_MAX; break;
    case 5: l.segments = NULL; break;
    case 6: s[3].base = NULL; break;
    case 7: s[5].bytes = 0; break;
    case 8: s[1].stride = 100; break; /* stride < bytes: slots would overlap */
    case 9: l.num_layers = 65536, l.segments_per_layer = 2; break;
    case 10: l.num_layers = 1u << 31, l.segments_per_layer = 4; break; /* product overflows 32 bits */
    }
    int rc = kvt_register_layout(c, &l);
    if (rc != want) fail_msg("layout case %d: %d (%s), want %d", i, rc, kvt_strerror(rc), want);
  }
  /* None of those registered anything: block operations still say ELAYOUT. */
  kvt_key ns;
  assert_int_equal(kvt_namespace(c, &ns), KVT_ELAYOUT);
  assert_int_equal(kvt_block_bytes(c), 0);
  assert_string_equal(kvt_device_backend_name(c), "none");
  /* The good one works after all of them, once. */
  assert_int_equal(kvt_register_layout(c, &good), 0);
  assert_int_equal(kvt_block_bytes(c), FIX_LAYERS * 2 * 512);
  assert_int_equal(kvt_register_layout(c, &good), KVT_ESTATE);
  assert_int_equal(kvt_namespace(c, &ns), 0);
  kvt_close(c);
  free(mem);
}

static void metadata_only_layout_moves_no_bytes(void **state) {
  kvt_config cfg = fixture_config(8);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 4;
  l.num_slots = 8;
  l.flags = KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &l), 0);
  assert_int_equal(kvt_block_bytes(c), 0);
  assert_string_equal(kvt_device_backend_name(c), "metadata-only");
  uint32_t tok[2 * BT], slots[2];
  conv_tokens(tok, 2 * BT, 3);
  kvt_key k[2];
  size_t nk;
  assert_int_equal(kvt_hash_tokens(c, NULL, tok, 2 * BT, k, 2, &nk), 0);
  kvt_req r;
  assert_int_equal(kvt_acquire(c, k, tok, 2, 2, 0, 0, &r, slots, NULL), 0);
  assert_int_equal(kvt_commit(c, r, 2, NULL), 0);
  assert_int_equal(kvt_release(c, r), 0);
  kvt_job j;
  assert_int_equal(kvt_store(c, k, 2, KVT_STORE_EVICT, &j), 1);
  assert_int_equal(kvt_job_wait(c, j, -1), 0);
  assert_int_equal(kvt_job_release(c, j), 0);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(c, k, 2, &lr, NULL), 0);
  assert_int_equal(lr.n_host, 2);
  kvt_close(c);
}

/* ---- small accessors ---- */

static void accessors_on_null_and_unregistered(void **state) {
  assert_int_equal(kvt_block_bytes(NULL), 0);
  kvt_key ns;
  assert_int_equal(kvt_namespace(NULL, &ns), -EINVAL);
  assert_string_equal(kvt_device_backend_name(NULL), "none");
  assert_string_equal(kvt_disk_backend_name(NULL), "none");
  kvt_config cfg = fixture_config(4);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_namespace(c, NULL), -EINVAL);
  assert_int_equal(kvt_namespace(c, &ns), KVT_ELAYOUT);
  assert_string_equal(kvt_disk_backend_name(c), "none");
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0); /* stats work before the layout */
  assert_int_equal(st.acquires, 0);
  kvt_close(c);

  fixture f;
  fixture_open(&f, 8, 8);
  assert_string_equal(kvt_device_backend_name(f.c), "host");
  assert_string_equal(kvt_disk_backend_name(f.c), "none");
  assert_int_equal(kvt_get_stats(NULL, &st), -EINVAL);
  assert_int_equal(kvt_get_stats(f.c, NULL), -EINVAL);
  st.size = 8;
  assert_int_equal(kvt_get_stats(f.c, &st), KVT_EVERSION);
  st.size = sizeof st;
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.size, sizeof st);
  assert_true(st.metadata_bytes > 0);
  assert_int_equal(kvt_drain(NULL), -EINVAL);
  assert_int_equal(kvt_drain(f.c), 0);
  still_works(&f, 1);
  fixture_close(&f);
}

/* ---- keys ---- */

static void hash_tokens_bad_args(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  uint32_t tok[5 * BT + 3];
  conv_tokens(tok, 5 * BT + 3, 2);
  kvt_key keys[5], more[5], parent;
  size_t n = 99;
  assert_int_equal(kvt_hash_tokens(NULL, NULL, tok, BT, keys, 5, &n), -EINVAL);
  assert_int_equal(kvt_hash_tokens(f.c, NULL, NULL, BT, keys, 5, &n), -EINVAL);
  assert_int_equal(kvt_hash_tokens(f.c, NULL, tok, BT, keys, 5, NULL), -EINVAL);
  assert_int_equal(kvt_hash_tokens(f.c, NULL, tok, 2 * BT, NULL, 5, &n), -EINVAL);
  /* Too small a key array: -ENOBUFS and the count it needs, nothing written. */
  memset(keys, 0, sizeof keys);
  assert_int_equal(kvt_hash_tokens(f.c, NULL, tok, 5 * BT + 3, keys, 4, &n), -ENOBUFS);
  assert_int_equal(n, 5);
  assert_true(keys[0].lo == 0 && keys[0].hi == 0);
  /* Zero tokens, or only a partial block: zero keys, keys may be NULL. */
  assert_int_equal(kvt_hash_tokens(f.c, NULL, NULL, 0, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(kvt_hash_tokens(f.c, NULL, tok, BT - 1, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  /* The partial block is not keyed; chaining with a parent equals one pass. */
  assert_int_equal(kvt_hash_tokens(f.c, NULL, tok, 5 * BT + 3, keys, 5, &n), 0);
  assert_int_equal(n, 5);
  assert_int_equal(kvt_hash_tokens(f.c, NULL, tok, 2 * BT, more, 2, &n), 0);
  parent = more[1];
  assert_int_equal(kvt_hash_tokens(f.c, &parent, tok + 2 * BT, 3 * BT, more + 2, 3, &n), 0);
  assert_memory_equal(keys, more, sizeof keys);
  /* Another namespace key is not a valid parent of this chain. */
  kvt_key ns;
  assert_int_equal(kvt_namespace(f.c, &ns), 0);
  assert_int_equal(kvt_hash_tokens(f.c, &ns, tok, BT, more, 1, &n), 0);
  assert_memory_equal(&more[0], &keys[0], sizeof more[0]); /* NULL parent = the namespace */
  still_works(&f, 1);
  fixture_close(&f);
}

static void keys_from_opaque_bad_args(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  unsigned char op[3][32];
  for (int i = 0; i < 3; i++) memset(op[i], i + 1, 32);
  kvt_key k[3], k2[3];
  assert_int_equal(kvt_keys_from_opaque(NULL, op, 32, 3, k), -EINVAL);
  assert_int_equal(kvt_keys_from_opaque(f.c, NULL, 32, 3, k), -EINVAL);
  assert_int_equal(kvt_keys_from_opaque(f.c, op, 32, 3, NULL), -EINVAL);
  assert_int_equal(kvt_keys_from_opaque(f.c, op, 0, 3, k), -EINVAL);
  assert_int_equal(kvt_keys_from_opaque(f.c, NULL, 32, 0, NULL), 0);
  /* Misaligned opaque bytes are fine: same keys from an odd address. */
  unsigned char *odd = malloc(3 * 32 + 1);
  memcpy(odd + 1, op, sizeof op);
  assert_int_equal(kvt_keys_from_opaque(f.c, op, 32, 3, k), 0);
  assert_int_equal(kvt_keys_from_opaque(f.c, odd + 1, 32, 3, k2), 0);
  assert_memory_equal(k, k2, sizeof k);
  free(odd);
  /* Distinct opaque keys give distinct kvtier keys. */
  assert_false(k[0].lo == k[1].lo && k[0].hi == k[1].hi);
  kvt_config cfg = fixture_config(4);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_keys_from_opaque(c, op, 32, 3, k), KVT_ELAYOUT);
  size_t n;
  assert_int_equal(kvt_hash_tokens(c, NULL, NULL, 0, NULL, 0, &n), KVT_ELAYOUT);
  kvt_close(c);
  still_works(&f, 2);
  fixture_close(&f);
}

/* ---- lookup and plan ---- */

static void lookup_bad_args_and_foreign_keys(void **state) {
  fixture f, g;
  fixture_open(&f, 8, 8);
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(&f, 4, 3, k, t);
  run_request(&f, k, t, 3, 4);
  kvt_lookup_result lr = {.size = sizeof lr};
  uint8_t tiers[3];
  assert_int_equal(kvt_lookup(NULL, k, 3, &lr, NULL), -EINVAL);
  assert_int_equal(kvt_lookup(f.c, NULL, 3, &lr, NULL), -EINVAL);
  assert_int_equal(kvt_lookup(f.c, k, 3, NULL, NULL), -EINVAL);
  lr.size = KVT_LOOKUP_RESULT_SIZE_V1 - 1;
  assert_int_equal(kvt_lookup(f.c, k, 3, &lr, NULL), KVT_EVERSION);
  /* A first-version result (no n_remote) is filled as far as it goes. */
  kvt_lookup_result v1[2];
  memset(v1, 0xee, sizeof v1);
  v1[0].size = KVT_LOOKUP_RESULT_SIZE_V1;
  assert_int_equal(kvt_lookup(f.c, k, 3, &v1[0], NULL), 0);
  assert_int_equal(v1[0].size, KVT_LOOKUP_RESULT_SIZE_V1);
  assert_int_equal(v1[0].n_prefix, 3);
  assert_int_equal(((unsigned char *)v1)[KVT_LOOKUP_RESULT_SIZE_V1], 0xee);
  lr.size = sizeof lr;
  assert_int_equal(kvt_lookup(f.c, NULL, 0, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 0);
  assert_int_equal(kvt_lookup(f.c, k, 3, &lr, tiers), 0);
  assert_int_equal(lr.n_prefix, 3);
  assert_int_equal(tiers[2], KVT_TIER_DEVICE);
  /* Out of order: block 1 without its parent is not a prefix. */
  kvt_key swapped[3] = {k[1], k[0], k[2]};
  assert_int_equal(kvt_lookup(f.c, swapped, 3, &lr, tiers), 0);
  assert_int_equal(lr.n_prefix, 0);
  assert_int_equal(tiers[0], KVT_TIER_NONE);
  /* A skipped block breaks the chain at the gap. */
  kvt_key gap[2] = {k[0], k[2]};
  assert_int_equal(kvt_lookup(f.c, gap, 2, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 1);
  /* Wrong layout for the keys: keys made by a cache with another layout
   * (another namespace) never hit, for the same tokens. */
  kvt_config cfg = fixture_config(8);
  cfg.dtype = KVT_DTYPE_F16;
  fixture_open_cfg(&g, &cfg, 8);
  kvt_key kg[3];
  size_t n;
  assert_int_equal(kvt_hash_tokens(g.c, NULL, t, 3 * BT, kg, 3, &n), 0);
  assert_false(kg[0].lo == k[0].lo && kg[0].hi == k[0].hi);
  assert_int_equal(kvt_lookup(f.c, kg, 3, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 0);
  assert_int_equal(kvt_lookup(g.c, k, 3, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 0);
  uint32_t slots[3];
  kvt_req r;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(g.c, k, t, 3, 3, 0, 0, &r, slots, &info), 0);
  assert_int_equal(info.n_restore, 0);
  assert_int_equal(kvt_release(g.c, r), 0);
  fixture_close(&g);
  still_works(&f, 4);
  fixture_close(&f);
}

static void plan_request_bad_args(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(&f, 5, 3, k, t);
  kvt_plan plan = {.size = sizeof plan};
  assert_int_equal(kvt_plan_request(NULL, k, 3, 48, &plan), -EINVAL);
  assert_int_equal(kvt_plan_request(f.c, k, 3, 48, &plan), KVT_ESTATE);
  kvt_model_desc m;
  kvt_hw_desc hw;
  kvt_model_init(&m);
  kvt_hw_init(&hw);
  m.num_layers = FIX_LAYERS;
  m.hidden_size = 64;
  m.num_heads = 1;
  m.num_kv_heads = 1;
  m.head_dim = 16; /* 4 layers x 2 x 1 x 16 x 2 B x 16 tokens = 4096 B = the block */
  m.kv_dtype_bytes = 2;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), 0);
  assert_int_equal(kvt_plan_request(f.c, NULL, 3, 48, &plan), -EINVAL);
  assert_int_equal(kvt_plan_request(f.c, k, 3, 48, NULL), -EINVAL);
  plan.size = 4;
  assert_int_equal(kvt_plan_request(f.c, k, 3, 48, &plan), KVT_EVERSION);
  plan.size = sizeof plan;
  assert_int_equal(kvt_plan_request(f.c, k, 3, 47, &plan), -EINVAL); /* 3 full blocks need 48 tokens */
  assert_int_equal(kvt_plan_request(f.c, k, 0, 0, &plan), -EINVAL);   /* a request has tokens */
  kvt_key *many = calloc(300, sizeof *many);
  assert_int_equal(kvt_plan_request(f.c, many, 300, 300 * BT, &plan), -E2BIG); /* > max_job_blocks */
  free(many);
  assert_int_equal(kvt_plan_request(f.c, k, 3, 48, &plan), 0);
  assert_int_equal(plan.size, sizeof plan);
  assert_int_equal(plan.n_prefix, 0);
  assert_int_equal(plan.restore_blocks, 0);
  run_request(&f, k, t, 3, 5);
  assert_int_equal(kvt_plan_request(f.c, k, 3, 48, &plan), 0);
  assert_int_equal(plan.n_prefix, 3);
  assert_int_equal(plan.n_device, 3);
  assert_int_equal(plan.restore_blocks, 2); /* the last token must be computed */
  still_works(&f, 5);
  fixture_close(&f);
}

/* ---- acquire, poll, wait, layers, commit, release ---- */

/* The acquire info of the first version (no n_from_remote) is filled as far as it goes. */
static void acquire_info_first_version(void **state) {
  (void)state;
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * 16];
  fixture_keys(&f, 5, 2, k, t);
  run_request(&f, k, t, 2, 5);
  kvt_acquire_info info[2];
  memset(info, 0xee, sizeof info);
  info[0].size = KVT_ACQUIRE_INFO_SIZE_V1;
  kvt_req r;
  uint32_t slots[2];
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r, slots, &info[0]), 0);
  assert_int_equal(info[0].size, KVT_ACQUIRE_INFO_SIZE_V1);
  assert_int_equal(info[0].n_device_hits, 2);
  assert_int_equal(((unsigned char *)info)[KVT_ACQUIRE_INFO_SIZE_V1], 0xee);
  assert_int_equal(kvt_release(f.c, r), 0);
  fixture_close(&f);
}

static void acquire_bad_args(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[4];
  uint32_t t[4 * BT], slots[16];
  fixture_keys(&f, 6, 4, k, t);
  kvt_req r = 77;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(NULL, k, t, 2, 2, 0, 0, &r, slots, &info), -EINVAL);
  assert_int_equal(kvt_acquire(f.c, NULL, t, 2, 2, 0, 0, &r, slots, &info), -EINVAL);
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, NULL, slots, &info), -EINVAL);
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r, NULL, &info), -EINVAL);
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 3, 0, 0, &r, slots, &info), -EINVAL);
  assert_int_equal(kvt_acquire(f.c, k, t, 0, 0, 0, 0, &r, slots, &info), -EINVAL); /* nothing asked */
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0x80, &r, slots, &info), -EINVAL); /* unknown flag */
  assert_int_equal(kvt_acquire_after(f.c, NULL, k, t, 2, 2, 0, ~0u, &r, slots, &info), -EINVAL);
  info.size = 3;
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r, slots, &info), KVT_EVERSION);
  info.size = sizeof info;
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 5, 0, &r, slots, &info), -E2BIG); /* > device slots */
  assert_true(kvt_acquire(f.c, k, t, 2, 2, SIZE_MAX - 1, 0, &r, slots, &info) < 0); /* wraps to 0 */
  /* Keys without tokens, extra slots only, NOWAIT with room: all fine. */
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 2, 0, &r, slots, &info), 0);
  assert_true(slots[0] < 8 && slots[1] < 8 && slots[0] != slots[1]);
  assert_int_equal(kvt_commit(f.c, r, 0, NULL), 0);
  assert_int_equal(kvt_commit(f.c, r, 1, NULL), -EINVAL); /* no keyed blocks */
  assert_int_equal(kvt_release(f.c, r), 0);
  still_works(&f, 6);
  fixture_close(&f);
}

/* Slow device copies (DEV_DELAY site) so that a load is still in flight
 * when the bad call comes. */
static _Atomic int delay_us;
static int slow_copies(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_DEV_DELAY_US ? atomic_load(&delay_us) : 0;
}

static void request_handles_bad_and_stale(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT], slots[2], ready = 99;
  fixture_keys(&f, 7, 2, k, t);
  kvt_req r;
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r, slots, NULL), 0);
  kvt_req bad[] = {0, 12345, r + (1ull << 32), r ^ 0xffffffffull, UINT64_MAX, (uint64_t)f.slots << 40};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(kvt_request_poll(f.c, bad[i], &ready), KVT_ENOJOB);
    assert_int_equal(kvt_request_wait(f.c, bad[i], 1000, &ready), KVT_ENOJOB);
    assert_int_equal(kvt_request_layer_ready(f.c, bad[i], 0), KVT_ENOJOB);
    assert_int_equal(kvt_request_wait_layer(f.c, bad[i], 0, NULL), KVT_ENOJOB);
    assert_int_equal(kvt_commit(f.c, bad[i], 1, NULL), KVT_ENOJOB);
    assert_int_equal(kvt_release(f.c, bad[i]), KVT_ENOJOB);
  }
  assert_int_equal(kvt_request_poll(NULL, r, &ready), -EINVAL);
  assert_int_equal(kvt_request_wait(NULL, r, -1, &ready), -EINVAL);
  assert_int_equal(kvt_request_layer_ready(NULL, r, 0), -EINVAL);
  assert_int_equal(kvt_request_wait_layer(NULL, r, 0, NULL), -EINVAL);
  assert_int_equal(kvt_commit(NULL, r, 1, NULL), -EINVAL);
  assert_int_equal(kvt_release(NULL, r), -EINVAL);
  /* The real request is unaffected by all of that. */
  assert_int_equal(kvt_request_poll(f.c, r, NULL), 0);
  assert_int_equal(kvt_request_poll(f.c, r, &ready), 0);
  assert_int_equal(ready, 0);
  assert_int_equal(kvt_request_layer_ready(f.c, r, FIX_LAYERS), -EINVAL);
  assert_int_equal(kvt_request_layer_ready(f.c, r, UINT32_MAX), -EINVAL);
  assert_int_equal(kvt_request_wait_layer(f.c, r, FIX_LAYERS, NULL), -EINVAL);
  assert_int_equal(kvt_request_layer_ready(f.c, r, 0), 0); /* nothing loading */
  assert_int_equal(kvt_request_wait_layer(f.c, r, FIX_LAYERS - 1, NULL), 0);
  assert_int_equal(kvt_commit(f.c, r, 3, NULL), -EINVAL); /* more than its blocks */
  assert_int_equal(kvt_commit(f.c, r, SIZE_MAX, NULL), -EINVAL);
  for (int i = 0; i < 2; i++) fixture_write(&f, slots[i], block_seed(7, (uint32_t)i));
  assert_int_equal(kvt_commit(f.c, r, 2, NULL), 0);
  assert_int_equal(kvt_commit(f.c, r, 2, NULL), 0); /* again: nothing new */
  assert_int_equal(kvt_commit(f.c, r, 1, NULL), 0); /* fewer: no-op */
  assert_int_equal(kvt_release(f.c, r), 0);
  /* Double release, and every call on the released handle. */
  assert_int_equal(kvt_release(f.c, r), KVT_ENOJOB);
  assert_int_equal(kvt_request_poll(f.c, r, &ready), KVT_ENOJOB);
  assert_int_equal(kvt_commit(f.c, r, 1, NULL), KVT_ENOJOB);
  /* A new request reusing the same internal slot gets a new handle. */
  kvt_req r2;
  assert_int_equal(kvt_acquire(f.c, k, t, 2, 2, 0, 0, &r2, slots, NULL), 0);
  assert_true(r2 != r);
  assert_int_equal(kvt_release(f.c, r), KVT_ENOJOB);
  assert_int_equal(kvt_request_poll(f.c, r2, &ready), 0);
  assert_int_equal(ready, 2);
  for (int i = 0; i < 2; i++) assert_true(fixture_check(&f, slots[i], block_seed(7, (uint32_t)i)));
  assert_int_equal(kvt_release(f.c, r2), 0);
  still_works(&f, 7);
  fixture_close(&f);
}

static void calls_while_a_load_is_in_flight(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[4];
  uint32_t t[4 * BT], slots[4], ready = 99;
  fixture_keys(&f, 8, 4, k, t);
  run_request(&f, k, t, 4, 8);
  fixture_offload(&f, k, 4);
  fixture_scribble(&f);
  atomic_store(&delay_us, 100000);
  kvt__fault_set(slow_copies, NULL);
  kvt_req r;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 0, 0, &r, slots, &info), 1);
  assert_int_equal(info.n_loading, 4);
  assert_int_equal(kvt_request_poll(f.c, r, &ready), 1);
  assert_int_equal(ready, 0);
  assert_int_equal(kvt_request_wait(f.c, r, 1000, &ready), KVT_ETIMEDOUT);
  assert_int_equal(kvt_commit(f.c, r, 4, NULL), KVT_EBUSY); /* loads first */
  assert_int_equal(kvt_request_layer_ready(f.c, r, FIX_LAYERS - 1), 1);
  atomic_store(&delay_us, 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(kvt_request_wait(f.c, r, -1, &ready), 0);
  assert_int_equal(ready, 4);
  for (uint32_t i = 0; i < 4; i++) assert_true(fixture_check(&f, slots[i], block_seed(8, i)));
  assert_int_equal(kvt_commit(f.c, r, 4, NULL), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  /* Release while the load is in flight waits for it (documented). */
  fixture_offload(&f, k, 4);
  atomic_store(&delay_us, 50000);
  kvt__fault_set(slow_copies, NULL);
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 0, 0, &r, slots, &info), 1);
  assert_int_equal(kvt_release(f.c, r), 0);
  kvt__fault_set(NULL, NULL);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(f.c, k, 4, &lr, NULL), 0);
  assert_int_equal(lr.n_prefix, 4);
  assert_int_equal(lr.n_device, 4);
  assert_int_equal(run_request(&f, k, t, 4, 8), 4);
  fixture_close(&f);
}

/* Bug: while request A loads host blocks into device slots, request B for
 * the same blocks saw them VALID on the host, loaded them a second time
 * into other device slots and repointed the entry at its own slots: A's
 * slots were then never freed. Expected: B neither waits for A's load nor
 * shares A's slots (a copy still in flight, which could fail): B copies the
 * host copies into private slots of its own, the entry stays A's, B's
 * copies are freed at release, and both requests are byte-exact. */
static void regression_second_acquire_loads_into_a_filling_entry(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[4];
  uint32_t t[4 * BT], s1[4], s2[4], ready = 0;
  fixture_keys(&f, 8, 4, k, t);
  run_request(&f, k, t, 4, 8);
  fixture_offload(&f, k, 4);
  fixture_scribble(&f);
  atomic_store(&delay_us, 100000);
  kvt__fault_set(slow_copies, NULL);
  kvt_req r1, r2;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 0, 0, &r1, s1, NULL), 1);
  int rc = kvt_acquire(f.c, k, t, 4, 4, 0, KVT_ACQUIRE_NOWAIT, &r2, s2, &info);
  int r1_loading = kvt_request_poll(f.c, r1, NULL);
  kvt__fault_set(NULL, NULL);
  atomic_store(&delay_us, 0);
  assert_int_equal(rc, 1); /* 0 once: B waited for A's load and shared it (KVT_EAGAIN with NOWAIT) */
  assert_int_equal(r1_loading, 1);
  assert_int_equal(info.n_restore, 4);
  assert_int_equal(info.n_loading, 4);
  assert_int_equal(kvt_request_wait(f.c, r1, -1, &ready), 0);
  assert_int_equal(ready, 4);
  assert_int_equal(kvt_request_wait(f.c, r2, -1, &ready), 0);
  assert_int_equal(ready, 4);
  for (int i = 0; i < 4; i++) {
    for (int j = 0; j < 4; j++) assert_true(s1[i] != s2[j]);
    assert_true(fixture_check(&f, s1[i], block_seed(8, (uint32_t)i)));
    assert_true(fixture_check(&f, s2[i], block_seed(8, (uint32_t)i)));
  }
  assert_int_equal(kvt_release(f.c, r1), 0);
  assert_int_equal(kvt_release(f.c, r2), 0);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.resident_device, 4); /* A's slots, now the entries'; B's went back */
  kvt_lookup_result lr = fixture_lookup(&f, k, 4);
  assert_int_equal(lr.n_device, 4);
  uint32_t s3[4];
  assert_int_equal(kvt_acquire(f.c, k, t, 4, 4, 0, 0, &r1, s3, NULL), 0); /* device hits: A's slots */
  assert_memory_equal(s1, s3, sizeof s1);
  assert_int_equal(kvt_release(f.c, r1), 0);
  fixture_close(&f);
}

/* Bug: kvt_acquire's size check `n_blocks + extra_slots > cap` wraps:
 * n_blocks = 2, extra_slots = SIZE_MAX gives 1, passes, and the request
 * gets one ref while scan_prefix writes `restore` (2) refs: an out-of-bounds
 * write into the ref arena (ASan: heap-buffer-overflow, or another
 * request's refs). Expected: -E2BIG (or -EINVAL). */
static void regression_acquire_size_overflow(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT], slots[2];
  fixture_keys(&f, 6, 2, k, t);
  run_request(&f, k, t, 2, 6);
  kvt_req r;
  int rc = kvt_acquire(f.c, k, t, 2, 2, SIZE_MAX, 0, &r, slots, NULL);
  if (rc >= 0) kvt_release(f.c, r);
  assert_true(rc == -E2BIG || rc == -EINVAL);
  fixture_close(&f);
}

static void pinned_blocks_are_stored_not_evicted(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[3];
  uint32_t t[3 * BT], slots[3];
  fixture_keys(&f, 9, 3, k, t);
  run_request(&f, k, t, 3, 9);
  kvt_req r;
  kvt_acquire_info info = {.size = sizeof info};
  assert_int_equal(kvt_acquire(f.c, k, t, 3, 3, 0, 0, &r, slots, &info), 0);
  assert_int_equal(info.n_device_hits, 3);
  /* Offloading blocks an active request pins: copied, never evicted. */
  fixture_offload(&f, k, 3);
  kvt_lookup_result lr = {.size = sizeof lr};
  uint8_t tiers[3];
  assert_int_equal(kvt_lookup(f.c, k, 3, &lr, tiers), 0);
  assert_int_equal(lr.n_device, 3);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.blocks_d2h, 3);
  assert_int_equal(st.evictions_device, 0);
  for (uint32_t i = 0; i < 3; i++) assert_true(fixture_check(&f, slots[i], block_seed(9, i)));
  /* Requests pinning every device slot: acquire cannot be served. */
  kvt_req big;
  uint32_t bslots[8];
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 5, 0, &big, bslots, NULL), 0);
  kvt_req r3;
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 1, 0, &r3, bslots, NULL), KVT_ENOSPACE);
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 1, KVT_ACQUIRE_NOWAIT, &r3, bslots, NULL), KVT_ENOSPACE);
  assert_int_equal(kvt_release(f.c, big), 0);
  assert_int_equal(kvt_release(f.c, r), 0);
  /* Unpinned now: the same store evicts (the host copies exist). */
  fixture_offload(&f, k, 3);
  assert_int_equal(kvt_lookup(f.c, k, 3, &lr, NULL), 0);
  assert_int_equal(lr.n_device, 0);
  assert_int_equal(lr.n_host, 3);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k, t, 3, 9), 3);
  fixture_close(&f);
}

static void request_table_exhaustion(void **state) {
  kvt_config cfg = fixture_config(4);
  cfg.max_requests = 2;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_req a, b, c;
  uint32_t s[1];
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 1, 0, &a, s, NULL), 0);
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 1, 0, &b, s, NULL), 0);
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 1, 0, &c, s, NULL), KVT_ENOSPACE);
  assert_int_equal(kvt_release(f.c, a), 0);
  assert_int_equal(kvt_acquire(f.c, NULL, NULL, 0, 0, 1, 0, &c, s, NULL), 0);
  assert_int_equal(kvt_release(f.c, b), 0);
  assert_int_equal(kvt_release(f.c, c), 0);
  still_works(&f, 10);
  fixture_close(&f);
}

/* ---- store, prefetch, jobs ---- */

static void store_and_prefetch_bad_args(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_key k[2];
  uint32_t t[2 * BT];
  fixture_keys(&f, 11, 2, k, t);
  run_request(&f, k, t, 2, 11);
  kvt_job j = 55;
  assert_int_equal(kvt_store(NULL, k, 2, 0, &j), -EINVAL);
  assert_int_equal(kvt_store(f.c, NULL, 2, 0, &j), -EINVAL);
  assert_int_equal(kvt_store(f.c, k, 2, 0, NULL), -EINVAL);
  assert_int_equal(kvt_store(f.c, k, 2, 0x2, &j), -EINVAL);
  assert_int_equal(kvt_store(f.c, k, 2, UINT32_MAX, &j), -EINVAL);
  assert_int_equal(kvt_store(f.c, NULL, 0, 0, &j), 0);
  assert_int_equal(j, 0);
  kvt_key unknown[2] = {{1, 2}, {3, 4}};
  assert_int_equal(kvt_store(f.c, unknown, 2, KVT_STORE_EVICT, &j), 0);
  assert_int_equal(j, 0);
  assert_int_equal(kvt_prefetch(NULL, k, 2, &j), -EINVAL);
  assert_int_equal(kvt_prefetch(f.c, NULL, 2, &j), -EINVAL);
  assert_int_equal(kvt_prefetch(f.c, k, 2, NULL), -EINVAL);
  assert_int_equal(kvt_prefetch(f.c, k, 2, &j), 0); /* no disk tier: nothing to do */
  assert_int_equal(j, 0);
  /* Store twice: the second has nothing to copy. */
  assert_int_equal(kvt_store(f.c, k, 2, 0, &j), 1);
  assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
  assert_int_equal(kvt_job_release(f.c, j), 0);
  kvt_job j2;
  assert_int_equal(kvt_store(f.c, k, 2, 0, &j2), 0);
  still_works(&f, 11);
  fixture_close(&f);

  /* Before the layout, and with no host tier. */
  kvt_config cfg = fixture_config(0);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_store(c, k, 2, 0, &j), KVT_ELAYOUT);
  assert_int_equal(kvt_prefetch(c, k, 2, &j), KVT_ELAYOUT);
  assert_int_equal(kvt_job_poll(c, 1), KVT_ELAYOUT);
  assert_int_equal(kvt_job_release(c, 1), KVT_ELAYOUT);
  assert_int_equal(kvt_drain(c), 0);
  kvt_close(c);
  fixture_open(&f, 8, 0);
  fixture_keys(&f, 12, 2, k, t);
  run_request(&f, k, t, 2, 12);
  assert_int_equal(kvt_store(f.c, k, 2, 0, &j), KVT_EUNSUPPORTED);
  assert_int_equal(j, 0);
  still_works(&f, 12);
  fixture_close(&f);
}

static void job_handles_bad_stale_and_detached(void **state) {
  fixture f;
  fixture_open(&f, 16, 16);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 13, 4, k, t);
  run_request(&f, k, t, 4, 13);
  kvt_job bad[] = {0, 1, 777, UINT64_MAX, 1ull << 32};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(kvt_job_poll(f.c, bad[i]), KVT_ENOJOB);
    assert_int_equal(kvt_job_wait(f.c, bad[i], 1000), KVT_ENOJOB);
    assert_int_equal(kvt_job_wait(f.c, bad[i], -1), KVT_ENOJOB);
    assert_int_equal(kvt_job_release(f.c, bad[i]), KVT_ENOJOB);
  }
  assert_int_equal(kvt_job_poll(NULL, 1), -EINVAL);
  assert_int_equal(kvt_job_wait(NULL, 1, -1), -EINVAL);
  assert_int_equal(kvt_job_release(NULL, 1), -EINVAL);
  /* A slow store: poll says in progress, a short wait times out. */
  atomic_store(&delay_us, 100000);
  kvt__fault_set(slow_copies, NULL);
  kvt_job j;
  assert_int_equal(kvt_store(f.c, k, 2, 0, &j), 1);
  assert_int_equal(kvt_job_poll(f.c, j), 1);
  assert_int_equal(kvt_job_wait(f.c, j, 1000), KVT_ETIMEDOUT);
  assert_int_equal(kvt_job_poll(f.c, j + (1ull << 32)), KVT_ENOJOB); /* wrong generation */
  /* Released unfinished: detached, completes and frees itself. */
  assert_int_equal(kvt_job_release(f.c, j), 0);
  assert_int_equal(kvt_job_poll(f.c, j), KVT_ENOJOB);
  assert_int_equal(kvt_job_release(f.c, j), KVT_ENOJOB);
  atomic_store(&delay_us, 0);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(kvt_drain(f.c), 0);
  kvt_lookup_result lr = {.size = sizeof lr};
  uint8_t tiers[4];
  assert_int_equal(kvt_lookup(f.c, k, 4, &lr, tiers), 0);
  assert_int_equal(lr.n_device, 4); /* no EVICT: the device copies stay */
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(f.c, &st), 0);
  assert_int_equal(st.blocks_d2h, 2);
  /* Finished and released: the handle is dead, the results stay. */
  assert_int_equal(kvt_store(f.c, k, 4, KVT_STORE_EVICT, &j), 1);
  assert_int_equal(kvt_job_wait(f.c, j, -1), 0);
  assert_int_equal(kvt_job_poll(f.c, j), 0); /* polled again after done: still 0 */
  assert_int_equal(kvt_job_release(f.c, j), 0);
  assert_int_equal(kvt_job_wait(f.c, j, -1), KVT_ENOJOB);
  /* Hundreds of store jobs cycle through the 32-job table without leaking. */
  for (int round = 0; round < 100; round++) {
    assert_int_equal(run_request(&f, k, t, 4, 13), 4);
    assert_int_equal(kvt_store(f.c, k, 4, KVT_STORE_EVICT, &j), 0); /* host copies exist */
  }
  still_works(&f, 13);
  fixture_close(&f);
}

/* Job and request handles carry no cache identity: a handle of cache A is
 * accepted by cache B when B has a job at the same index and generation.
 * Documented: a "foreign job or request handle" gets KVT_ENOJOB. */
static void regression_foreign_handles_accepted(void **state) {
  fixture a, b;
  fixture_open(&a, 8, 8);
  fixture_open(&b, 8, 8);
  kvt_key ka[2], kb[2];
  uint32_t ta[2 * BT], tb[2 * BT], sa[2], sb[2];
  fixture_keys(&a, 1, 2, ka, ta);
  fixture_keys(&b, 2, 2, kb, tb);
  kvt_req ra, rb;
  assert_int_equal(kvt_acquire(a.c, ka, ta, 2, 2, 0, 0, &ra, sa, NULL), 0);
  assert_int_equal(kvt_acquire(b.c, kb, tb, 2, 2, 0, 0, &rb, sb, NULL), 0);
  assert_int_equal(kvt_release(b.c, ra), KVT_ENOJOB); /* fails: releases rb */
  assert_int_equal(kvt_release(a.c, ra), 0);
  assert_int_equal(kvt_release(b.c, rb), 0);
  fixture_close(&a);
  fixture_close(&b);
}

/* ---- cost model through the cache ---- */

static void set_model(kvt_model_desc *m, kvt_hw_desc *hw) {
  kvt_model_init(m);
  kvt_hw_init(hw);
  m->num_layers = FIX_LAYERS;
  m->hidden_size = 64;
  m->num_heads = 1;
  m->num_kv_heads = 1;
  m->head_dim = 16;
  m->kv_dtype_bytes = 2;
}

static void cost_model_calls_bad_args(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_model_desc m;
  kvt_hw_desc hw, out;
  set_model(&m, &hw);
  assert_int_equal(kvt_report_prefill(f.c, 0, 16, 0.1), KVT_ESTATE);
  assert_int_equal(kvt_get_calibrated_hw(f.c, &out), KVT_ESTATE);
  assert_int_equal(kvt_set_cost_model(NULL, &m, &hw), -EINVAL);
  assert_int_equal(kvt_set_cost_model(f.c, NULL, &hw), -EINVAL);
  assert_int_equal(kvt_set_cost_model(f.c, &m, NULL), -EINVAL);
  m.size = 1;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), KVT_EVERSION);
  set_model(&m, &hw);
  hw.size = 1;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), KVT_EVERSION);
  set_model(&m, &hw);
  m.num_layers = 0;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), -EINVAL);
  set_model(&m, &hw);
  hw.num_gpus = 0;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), -EINVAL);
  set_model(&m, &hw);
  hw.mfu = -1;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), -EINVAL);
  set_model(&m, &hw);
  m.num_kv_heads = 2; /* twice the layout's block bytes */
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), KVT_ELAYOUT);
  set_model(&m, &hw);
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), 0);
  assert_int_equal(kvt_report_prefill(NULL, 0, 16, 0.1), -EINVAL);
  assert_int_equal(kvt_report_prefill(f.c, 16, 16, 0.1), -EINVAL);
  assert_int_equal(kvt_report_prefill(f.c, 32, 16, 0.1), -EINVAL);
  assert_int_equal(kvt_report_prefill(f.c, 0, 16, 0), -EINVAL);
  assert_int_equal(kvt_report_prefill(f.c, 0, 16, -1), -EINVAL);
  assert_int_equal(kvt_report_prefill(f.c, 0, 16, NAN), -EINVAL);
  assert_int_equal(kvt_report_prefill(f.c, 0, 16, 0.01), 0);
  assert_int_equal(kvt_get_calibrated_hw(NULL, &out), -EINVAL);
  assert_int_equal(kvt_get_calibrated_hw(f.c, NULL), -EINVAL);
  assert_int_equal(kvt_get_calibrated_hw(f.c, &out), 0);
  assert_true(out.flops_per_gpu > 0 && isfinite(out.flops_per_gpu));
  kvt_key k[3];
  uint32_t t[3 * BT];
  fixture_keys(&f, 14, 3, k, t);
  kvt_plan plan = {.size = sizeof plan};
  assert_int_equal(kvt_plan_request(f.c, k, 3, 3 * BT, &plan), 0);
  assert_true(plan.est_ttft_s > 0 && isfinite(plan.est_ttft_s));
  still_works(&f, 14);
  fixture_close(&f);
}

/* NaN and infinite inputs are not rejected where the documented checks
 * would reject them: set_cost_model accepts a NaN mfu / peak and
 * report_prefill an infinite duration, after which every plan fails. */
static void regression_nonfinite_cost_inputs(void **state) {
  fixture f;
  fixture_open(&f, 8, 8);
  kvt_model_desc m;
  kvt_hw_desc hw;
  set_model(&m, &hw);
  hw.mfu = NAN;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), -EINVAL);
  set_model(&m, &hw);
  hw.device_host.bytes_per_s = 0;
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), -EINVAL);
  set_model(&m, &hw);
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), 0);
  assert_int_equal(kvt_report_prefill(f.c, 0, 16, INFINITY), -EINVAL);
  fixture_close(&f);
}

/* ---- cost.h pure functions ---- */

static void cost_functions_bad_args(void **state) {
  kvt_model_desc m, bad;
  kvt_hw_desc hw, badhw;
  kvt_plan plan = {.size = sizeof plan};
  assert_int_equal(kvt_model_preset(NULL, &m), -EINVAL);
  assert_int_equal(kvt_model_preset("llama3-8b", NULL), -EINVAL);
  assert_int_equal(kvt_model_preset("no-such-model", &m), -ENOENT);
  assert_int_equal(m.size, sizeof m); /* left as kvt_model_init made it */
  assert_int_equal(m.num_layers, 0);
  assert_int_equal(kvt_model_preset("llama3-70b", &m), 0);
  size_t n = 0;
  while (kvt_model_preset_name(n)) n++;
  assert_true(n >= 8);
  assert_null(kvt_model_preset_name(SIZE_MAX));
  kvt_model_init(&bad);
  assert_int_equal(kvt_model_kv_bytes_per_token(NULL), 0);
  assert_int_equal(kvt_model_kv_bytes_per_token(&bad), 0);
  assert_true(kvt_model_params(NULL) == 0);
  assert_true(kvt_model_params(&bad) == 0);
  assert_int_equal(kvt_model_kv_bytes_per_token(&m), 327680);
  kvt_hw_init(&hw);
  assert_true(kvt_cost_recompute_flops(NULL, 0, 10, NULL) == 0);
  assert_true(kvt_cost_recompute_flops(&m, 10, 10, NULL) == 0);
  assert_true(kvt_cost_recompute_flops(&m, 11, 10, NULL) == 0);
  assert_true(kvt_cost_recompute_flops(&m, 0, 10, NULL) > 0);
  assert_true(kvt_cost_compute_s(NULL, &hw, 0, 10) == 0);
  assert_true(kvt_cost_compute_s(&m, NULL, 0, 10) == 0);
  assert_true(kvt_cost_transfer_s(NULL, 1, 1) == 0);
  badhw = hw;
  badhw.device_host.bytes_per_s = NAN;
  assert_true(kvt_cost_transfer_s(&badhw, 1, 1) == 0);
  assert_true(kvt_cost_compute_s(&m, &badhw, 0, 10) >= 0);
  uint8_t tiers[4] = {KVT_TIER_HOST, KVT_TIER_HOST, KVT_TIER_DISK, 7};
  assert_int_equal(kvt_cost_plan(NULL, &hw, 16, 64, 2, tiers, &plan), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, NULL, 16, 64, 2, tiers, &plan), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, 0, 64, 2, tiers, &plan), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 0, 0, NULL, &plan), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 5, tiers, &plan), -EINVAL); /* prefix > blocks */
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 4, tiers, &plan), -EINVAL); /* tier 7 */
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 2, NULL, &plan), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 2, tiers, NULL), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &badhw, 16, 64, 2, tiers, &plan), -EINVAL);
  badhw = hw;
  badhw.num_gpus = 0;
  assert_int_equal(kvt_cost_plan(&m, &badhw, 16, 64, 2, tiers, &plan), -EINVAL);
  badhw = hw;
  badhw.host_disk.latency_s = -1;
  assert_int_equal(kvt_cost_plan(&m, &badhw, 16, 64, 2, tiers, &plan), -EINVAL);
  plan.size = 8;
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 2, tiers, &plan), -EINVAL);
  /* A first-version plan and hardware description (no remote fields) work:
   * the plan gets its own fields only, the remote link takes its default. */
  kvt_plan small;
  memset(&small, 0xee, sizeof small);
  small.size = KVT_PLAN_SIZE_V1;
  badhw = hw;
  badhw.size = KVT_HW_DESC_SIZE_V1;
  badhw.host_remote.bytes_per_s = -1; /* past its size: not read */
  assert_int_equal(kvt_cost_plan(&m, &badhw, 16, 64, 2, tiers, &small), 0);
  assert_int_equal(small.size, KVT_PLAN_SIZE_V1);
  assert_int_equal(((unsigned char *)&small)[KVT_PLAN_SIZE_V1], 0xee);
  badhw.size = KVT_HW_DESC_SIZE_V1 - 4;
  assert_int_equal(kvt_cost_plan(&m, &badhw, 16, 64, 2, tiers, &plan), -EINVAL);
  badhw = hw;
  badhw.host_remote.bytes_per_s = 0;
  assert_int_equal(kvt_cost_plan(&m, &badhw, 16, 64, 2, tiers, &plan), -EINVAL);
  uint8_t rtiers[4] = {KVT_TIER_HOST, KVT_TIER_REMOTE, KVT_TIER_REMOTE, KVT_TIER_REMOTE};
  plan.size = sizeof plan;
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 3, rtiers, &plan), 0);
  assert_int_equal(plan.n_remote, 2);
  assert_true(kvt_cost_transfer3_s(&hw, 0, 0, 1 << 20) > kvt_cost_transfer3_s(&hw, 0, 1 << 20, 0));
  assert_true(kvt_cost_transfer3_s(NULL, 0, 0, 1) == 0);
  plan.size = sizeof plan;
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 0, NULL, &plan), 0);
  assert_int_equal(kvt_cost_plan(&m, &hw, 16, 64, 3, tiers, &plan), 0);
  assert_true(plan.restore_blocks <= 3);
  assert_true(plan.recompute_tokens >= 1);
  double bw = 0;
  assert_int_equal(kvt_cost_breakeven(NULL, &hw, 1000, 500, &bw), -EINVAL);
  assert_int_equal(kvt_cost_breakeven(&m, NULL, 1000, 500, &bw), -EINVAL);
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 1000, 500, NULL), -EINVAL);
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 1000, 500, &bw), 0);
  assert_true(bw > 0);
}

/* ---- backends (backend.h) ---- */

static void backend_vtables_reject_bad_open_args(void **state) {
  const kvt_dev_backend *h = kvt_dev_backend_host();
  assert_non_null(h);
  assert_int_equal(h->version, KVT_DEV_BACKEND_VERSION);
  assert_string_equal(h->name, "host");
  const kvt_dev_backend *cu = kvt_dev_backend_cuda();
  if (cu) assert_string_equal(cu->name, "cuda");
  const kvt_io_backend *io[2] = {kvt_io_backend_threads(), kvt_io_backend_uring()};
  for (int i = 0; i < 2; i++) {
    assert_non_null(io[i]);
    assert_int_equal(io[i]->version, KVT_IO_BACKEND_VERSION);
    void *ctx = NULL;
    kvt_io_open_args a = {.fd = -1, .queue_depth = 8};
    int rc = io[i]->open(&a, &ctx);
    assert_true(rc < 0);
    assert_null(ctx);
    a.fd = 0;
    a.queue_depth = 0;
    rc = io[i]->open(&a, &ctx);
    assert_true(rc < 0);
    assert_null(ctx);
  }
}

/* Storage mode: every call refuses bad arguments, other modes and stale
 * handles, and a valid put/get still works afterwards. */
static void storage_mode_calls_bad_args(void **state) {
  kvt_key k[2] = {{1, 2}, {3, 4}};
  kvt_lookup_result lr = {.size = sizeof lr};
  kvt_job job = 0;
  kvt_batch b;
  kvt_batch_init(&b);
  kvt_batch_init(NULL);
  kvt_region reg = 0;
  size_t n = 0;
  int32_t res[2];
  int st[2];
  /* NULL cache. */
  assert_int_equal(kvt_register_memory(NULL, k, 8, KVT_MEM_HOST, &reg), -EINVAL);
  assert_int_equal(kvt_unregister_memory(NULL, 1), -EINVAL);
  assert_int_equal(kvt_exists(NULL, NULL, k, 2, 0, &lr, NULL), -EINVAL);
  assert_int_equal(kvt_touch(NULL, NULL, k, 2, 0, &n), -EINVAL);
  assert_int_equal(kvt_put_from(NULL, &b, &job), -EINVAL);
  assert_int_equal(kvt_get_into(NULL, &b, &job), -EINVAL);
  assert_int_equal(kvt_remove(NULL, k, 2, &n), -EINVAL);
  assert_int_equal(kvt_storage_poll(NULL, 1), -EINVAL);
  assert_int_equal(kvt_storage_wait(NULL, 1, 0), -EINVAL);
  assert_int_equal(kvt_storage_results(NULL, 1, res, 2, NULL), -EINVAL);
  assert_int_equal(kvt_storage_collect(NULL, &job, st, 1, &n), -EINVAL);
  assert_int_equal(kvt_storage_release(NULL, 1), -EINVAL);
  /* An owner-mode cache. */
  fixture f;
  fixture_open(&f, 8, 4);
  assert_int_equal(kvt_put_from(f.c, &b, &job), KVT_ESTATE);
  assert_int_equal(kvt_get_into(f.c, &b, &job), KVT_ESTATE);
  assert_int_equal(kvt_register_memory(f.c, k, 8, KVT_MEM_HOST, &reg), KVT_ESTATE);
  assert_int_equal(kvt_storage_collect(f.c, &job, st, 1, &n), KVT_ESTATE);
  assert_int_equal(kvt_remove(f.c, k, 2, &n), KVT_ESTATE);
  assert_int_equal(kvt_exists(f.c, NULL, k, 2, 0, &lr, NULL), 0); /* exists serves both modes */
  n = 99;
  assert_int_equal(kvt_touch(f.c, NULL, k, 2, 0, &n), 0); /* and so does touch */
  assert_int_equal(n, 0);
  fixture_close(&f);
  /* A storage-mode cache. */
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "badargs-storage";
  cfg.host_blocks = 4;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_put_from(c, &b, &job), KVT_ELAYOUT);
  assert_int_equal(kvt_exists(c, NULL, k, 2, 0, &lr, NULL), KVT_ELAYOUT);
  assert_int_equal(kvt_touch(c, NULL, k, 2, 0, NULL), KVT_ELAYOUT);
  kvt_segment seg = {NULL, 0, 4096};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.segments = &seg;
  l.flags = KVT_LAYOUT_STORAGE;
  l.num_slots = 3; /* storage mode owns no device slots */
  assert_int_equal(kvt_register_layout(c, &l), -EINVAL);
  l.num_slots = 0;
  l.flags |= KVT_LAYOUT_METADATA_ONLY;
  assert_int_equal(kvt_register_layout(c, &l), -EINVAL);
  l.flags = KVT_LAYOUT_STORAGE;
  seg.bytes = 0;
  assert_int_equal(kvt_register_layout(c, &l), -EINVAL);
  seg.bytes = 4096;
  assert_int_equal(kvt_register_layout(c, &l), 0);
  /* Owner-mode calls: there are no device slots to hand out or copy from. */
  kvt_req req;
  uint32_t slots[2];
  assert_int_equal(kvt_acquire(c, k, NULL, 2, 2, 0, 0, &req, slots, NULL), -E2BIG);
  assert_int_equal(kvt_store(c, k, 2, 0, &job), 0);
  char *mem = aligned_alloc(4096, 3 * 4096);
  assert_non_null(mem);
  /* Regions. */
  assert_int_equal(kvt_register_memory(c, NULL, 8, KVT_MEM_HOST, &reg), -EINVAL);
  assert_int_equal(kvt_register_memory(c, mem, 0, KVT_MEM_HOST, &reg), -EINVAL);
  assert_int_equal(kvt_register_memory(c, mem, 8, 7, &reg), -EINVAL);
  assert_int_equal(kvt_register_memory(c, mem, 8, KVT_MEM_HOST, NULL), -EINVAL);
  assert_int_equal(kvt_register_memory(c, (void *)(UINTPTR_MAX - 4), 8, KVT_MEM_HOST, &reg), -EINVAL);
#ifndef KVT_HAVE_CUDA
  assert_int_equal(kvt_register_memory(c, mem, 4096, KVT_MEM_DEVICE, &reg), KVT_EUNSUPPORTED);
#else
  assert_true(kvt_register_memory(c, mem, 4096, KVT_MEM_DEVICE, &reg) == KVT_ENODEV); /* host memory is not device memory */
#endif
  assert_int_equal(kvt_register_memory(c, mem, 2 * 4096, KVT_MEM_HOST, &reg), 0);
  kvt_region other;
  assert_int_equal(kvt_register_memory(c, mem + 4096, 4096, KVT_MEM_HOST, &other), -EINVAL); /* overlaps */
  assert_int_equal(kvt_unregister_memory(c, KVT_REGION_NONE), KVT_ENOJOB);
  assert_int_equal(kvt_unregister_memory(c, 65), KVT_ENOJOB);
  /* Batches. */
  kvt_piece p[2] = {{.region = reg, .offset = 0, .len = 4096}, {.region = reg, .offset = 4096, .len = 4096}};
  assert_int_equal(kvt_put_from(c, NULL, &job), -EINVAL);
  assert_int_equal(kvt_put_from(c, &b, NULL), -EINVAL);
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL); /* no blocks */
  b.n_blocks = 2;
  b.keys = k;
  b.pieces = p;
  b.size = 4;
  assert_int_equal(kvt_put_from(c, &b, &job), KVT_EVERSION);
  b.size = sizeof b;
  b.n_blocks = cfg.max_job_blocks + 1;
  assert_int_equal(kvt_put_from(c, &b, &job), -E2BIG);
  b.n_blocks = 2;
  p[1].len = 100; /* pieces do not add up to the block */
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL);
  assert_int_equal(kvt_get_into(c, &b, &job), -EINVAL); /* a get reads whole blocks too */
  p[1].len = 4096;
  p[1].offset = 4097; /* past the region */
  assert_int_equal(kvt_get_into(c, &b, &job), -EINVAL);
  p[1].offset = 4096;
  p[1].region = 9; /* unregistered */
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL);
  p[1] = (kvt_piece){.ptr = NULL, .len = 4096};
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL);
  p[1] = (kvt_piece){.region = reg, .offset = 4096, .len = 4096, .reserved = 1};
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL);
  p[1].reserved = 0;
  /* Exists. */
  assert_int_equal(kvt_exists(c, NULL, NULL, 2, 0, &lr, NULL), -EINVAL);
  assert_int_equal(kvt_touch(c, NULL, NULL, 2, 0, NULL), -EINVAL);
  assert_int_equal(kvt_touch(c, NULL, k, 2, 0x80, NULL), -EINVAL); /* unknown flag */
  assert_int_equal(kvt_touch(c, NULL, k, 2, KVT_GET_PROMOTE, NULL), -EINVAL);
  assert_int_equal(kvt_touch(c, NULL, NULL, 0, 0, NULL), 0);
  assert_int_equal(kvt_exists(c, NULL, k, 2, 0, NULL, NULL), -EINVAL);
  assert_int_equal(kvt_exists(c, NULL, k, 2, 0x80, &lr, NULL), -EINVAL); /* unknown flag */
  b.flags = 0x80;
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL);
  assert_int_equal(kvt_get_into(c, &b, &job), -EINVAL);
  b.flags = KVT_GET_PROMOTE; /* a get's flag only */
  assert_int_equal(kvt_put_from(c, &b, &job), -EINVAL);
  assert_int_equal(kvt_exists(c, NULL, k, 2, KVT_GET_PROMOTE, &lr, NULL), -EINVAL);
  b.flags = 0;
  lr.size = 4;
  assert_int_equal(kvt_exists(c, NULL, k, 2, 0, &lr, NULL), KVT_EVERSION);
  lr.size = sizeof lr;
  /* Job handles: never issued, then stale after release. */
  assert_int_equal(kvt_storage_poll(c, 0), KVT_ENOJOB);
  assert_int_equal(kvt_storage_wait(c, 12345, 0), KVT_ENOJOB);
  assert_int_equal(kvt_storage_results(c, 12345, res, 2, NULL), KVT_ENOJOB);
  assert_int_equal(kvt_storage_release(c, 12345), KVT_ENOJOB);
  assert_int_equal(kvt_storage_collect(c, NULL, st, 1, &n), -EINVAL);
  assert_int_equal(kvt_storage_collect(c, &job, st, 1, NULL), -EINVAL);
  assert_int_equal(kvt_remove(c, NULL, 2, &n), -EINVAL);
  /* And a valid round trip still works. */
  memset(mem, 0x3c, 2 * 4096);
  assert_int_equal(kvt_put_from(c, &b, &job), 1);
  assert_int_equal(kvt_storage_wait(c, job, -1), 0);
  assert_int_equal(kvt_storage_results(c, job, NULL, 2, NULL), -EINVAL);
  assert_int_equal(kvt_storage_results(c, job, res, 3, NULL), -EINVAL);
  assert_int_equal(kvt_storage_release(c, job), 0);
  assert_int_equal(kvt_storage_release(c, job), KVT_ENOJOB);
  assert_int_equal(kvt_storage_poll(c, job), KVT_ENOJOB);
  memset(mem, 0, 2 * 4096);
  assert_int_equal(kvt_get_into(c, &b, &job), 1);
  assert_int_equal(kvt_storage_wait(c, job, -1), 0);
  assert_int_equal(kvt_storage_release(c, job), 0);
  assert_int_equal((unsigned char)mem[5000], 0x3c);
  assert_int_equal(kvt_exists(c, NULL, k, 2, 0, &lr, NULL), 0);
  assert_int_equal(lr.n_host, 2);
  assert_int_equal(kvt_remove(c, k, 2, &n), 0);
  assert_int_equal(n, 2);
  kvt_close(c);
  free(mem);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(strerror_never_null),
      cmocka_unit_test(storage_mode_calls_bad_args),
      cmocka_unit_test(init_functions_accept_null_and_set_defaults),
      cmocka_unit_test(open_rejects_bad_configs),
      cmocka_unit_test(cuda_without_gpu_is_enodev),
      cmocka_unit_test(register_layout_rejects_bad_layouts),
      cmocka_unit_test(metadata_only_layout_moves_no_bytes),
      cmocka_unit_test(accessors_on_null_and_unregistered),
      cmocka_unit_test(hash_tokens_bad_args),
      cmocka_unit_test(keys_from_opaque_bad_args),
      cmocka_unit_test(lookup_bad_args_and_foreign_keys),
      cmocka_unit_test(plan_request_bad_args),
      cmocka_unit_test(acquire_bad_args),
      cmocka_unit_test(acquire_info_first_version),
      cmocka_unit_test(request_handles_bad_and_stale),
      cmocka_unit_test(calls_while_a_load_is_in_flight),
      cmocka_unit_test(regression_second_acquire_loads_into_a_filling_entry),
      cmocka_unit_test(regression_acquire_size_overflow),
      cmocka_unit_test(pinned_blocks_are_stored_not_evicted),
      cmocka_unit_test(request_table_exhaustion),
      cmocka_unit_test(store_and_prefetch_bad_args),
      cmocka_unit_test(job_handles_bad_stale_and_detached),
      cmocka_unit_test(regression_foreign_handles_accepted),
      cmocka_unit_test(cost_model_calls_bad_args),
      cmocka_unit_test(regression_nonfinite_cost_inputs),
      cmocka_unit_test(cost_functions_bad_args),
      cmocka_unit_test(backend_vtables_reject_bad_open_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
