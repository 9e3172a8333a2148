/* The remote tier through the engine, against real Redis servers (the
 * harness starts them on ephemeral ports): blocks leave one cache's host
 * for the server and come back byte-exact in another cache; namespaces stay
 * apart; a value that is garbage or another namespace's record is a counted
 * miss; a server killed mid-run leaves requests completing (misses,
 * recomputed) and local data intact, and the tier comes back by itself;
 * refused credentials fail the registration; the password never shows. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "kv_fixture.h"
#include "redis_harness.h"
#include "remote/remote.h"

#define NB 4 /* blocks per conversation */

static kvt_redis srv;

static kvt_config remote_config(const char *url, const char *fp) {
  kvt_config cfg = fixture_config(NB); /* the host holds one conversation */
  cfg.model_fingerprint = fp;
  cfg.remote_url = url;
  cfg.remote_timeout_ms = 500;
  cfg.remote_negative_ms = 1; /* tests ask again at once */
  return cfg;
}

static void open_remote(fixture *f, const char *url, const char *fp) {
  kvt_config cfg = remote_config(url, fp);
  fixture_open_cfg(f, &cfg, 2 * NB);
}

/* Conversation conv computed in f, then pushed out of its host by the next
 * conversation: its blocks reach the remote on their way out. */
static void compute_and_push_out(fixture *f, uint32_t conv) {
  kvt_key keys[NB], other[NB];
  uint32_t tok[NB * 16], tok2[NB * 16];
  fixture_keys(f, conv, NB, keys, tok);
  assert_int_equal(run_request(f, keys, tok, NB, conv), 0);
  fixture_offload(f, keys, NB);
  fixture_keys(f, conv + 1000, NB, other, tok2);
  run_request(f, other, tok2, NB, conv + 1000);
  fixture_offload(f, other, NB); /* the host evicts conv's blocks: remote puts */
  assert_int_equal(kvt_drain(f->c), 0);
}

static void setup_server(void) {
  kvt_redis_require();
  assert_int_equal(kvt_redis_start(&srv, NULL), 0);
}

static void flush_server(void) {
  char out[64];
  assert_int_equal(kvt_redis_cmd(&srv, 0, out, sizeof out, "FLUSHALL"), 0);
}

static void two_caches_share_blocks_byte_exact(void **state) {
  (void)state;
  flush_server();
  fixture a, b;
  open_remote(&a, srv.url, "model-A@1");
  compute_and_push_out(&a, 1);
  kvt_stats sa = fixture_stats(&a);
  assert_true(sa.blocks_h2remote >= NB);
  assert_int_equal(sa.remote_degraded, 0);
  assert_int_equal(sa.remote_nodes, 1);

  open_remote(&b, srv.url, "model-A@1");
  kvt_key keys[NB];
  uint32_t tok[NB * 16];
  fixture_keys(&b, 1, NB, keys, tok);
  uint8_t tiers[NB];
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_lookup(b.c, keys, NB, &lr, tiers), 0);
  assert_int_equal(lr.n_prefix, NB);
  assert_int_equal(lr.n_remote, NB);
  assert_int_equal(tiers[0], KVT_TIER_REMOTE);
  /* Restored in b from a's bytes: run_request checks every byte. */
  assert_int_equal(run_request(&b, keys, tok, NB, 1), NB);
  kvt_stats sb = fixture_stats(&b);
  assert_int_equal(sb.hits_remote, NB);
  assert_int_equal(sb.blocks_remote2h, NB);
  assert_int_equal(sb.remote_corrupt, 0);
  /* Now local in b: the next request is a device hit, no remote traffic. */
  assert_int_equal(run_request(&b, keys, tok, NB, 1), NB);
  assert_int_equal(fixture_stats(&b).blocks_remote2h, NB);
  fixture_close(&b);
  fixture_close(&a);
}

static void plan_and_prefetch_see_remote_blocks(void **state) {
  (void)state;
  flush_server();
  fixture a, b;
  open_remote(&a, srv.url, "model-A@1");
  compute_and_push_out(&a, 2);
  open_remote(&b, srv.url, "model-A@1");
  kvt_key keys[NB];
  uint32_t tok[NB * 16];
  fixture_keys(&b, 2, NB, keys, tok);
  kvt_model_desc m;
  kvt_hw_desc hw;
  kvt_model_init(&m);
  m.num_layers = FIX_LAYERS;
  m.hidden_size = 512;
  m.num_heads = 8;
  m.num_kv_heads = 1;
  m.head_dim = FIX_SEG_BYTES / 16 / 2; /* 4 layers x K,V x 16 x 2 B = 256 B a token: the fixture's block / 16 */
  m.kv_dtype_bytes = 2;
  kvt_hw_init(&hw);
  assert_int_equal(kvt_set_cost_model(b.c, &m, &hw), 0);
  kvt_plan plan = {.size = sizeof plan};
  assert_int_equal(kvt_plan_request(b.c, keys, NB, NB * 16 + 1, &plan), 0);
  assert_int_equal(plan.n_remote, NB);
  assert_int_equal(plan.n_prefix, NB);
  /* Prefetch brings them to b's host: afterwards a lookup says host. */
  kvt_job j;
  assert_int_equal(kvt_prefetch(b.c, keys, NB, &j), 1);
  assert_int_equal(kvt_job_wait(b.c, j, -1), 0);
  assert_int_equal(kvt_job_release(b.c, j), 0);
  /* The fetch was timed: the remote link is calibrated like the others. */
  kvt_hw_desc cal;
  assert_int_equal(kvt_get_calibrated_hw(b.c, &cal), 0);
  assert_true(cal.host_remote.bytes_per_s != hw.host_remote.bytes_per_s ||
              cal.host_remote.latency_s != hw.host_remote.latency_s);
  assert_true(cal.host_disk.bytes_per_s == hw.host_disk.bytes_per_s);
  kvt_lookup_result lr = fixture_lookup(&b, keys, NB);
  assert_int_equal(lr.n_host, NB);
  assert_int_equal(lr.n_remote, 0);
  assert_int_equal(run_request(&b, keys, tok, NB, 2), NB);
  fixture_close(&b);
  fixture_close(&a);
}

static void namespaces_stay_apart(void **state) {
  (void)state;
  flush_server();
  fixture a, c;
  open_remote(&a, srv.url, "model-A@1");
  compute_and_push_out(&a, 3);
  open_remote(&c, srv.url, "model-B@1");
  kvt_key keys[NB], akeys[NB];
  uint32_t tok[NB * 16];
  fixture_keys(&c, 3, NB, keys, tok); /* the same tokens, another model */
  assert_int_equal(fixture_lookup(&c, keys, NB).n_prefix, 0);
  fixture_keys(&a, 3, NB, akeys, tok); /* even a's own keys: filed under a's namespace */
  assert_int_equal(fixture_lookup(&c, akeys, NB).n_prefix, 0);
  assert_int_equal(run_request(&c, keys, tok, NB, 3), 0);
  assert_int_equal(fixture_stats(&c).hits_remote, 0);
  fixture_close(&c);
  fixture_close(&a);
}

/* Key names of conv's blocks in cache f. */
static void key_name(fixture *f, const kvt_key *k, char *buf) {
  assert_true(kvt__remote_key_string(kvt__rtier(f->c), k, buf, 128) > 0);
}

static void garbage_and_foreign_values_are_misses(void **state) {
  (void)state;
  flush_server();
  fixture a, b, other;
  open_remote(&a, srv.url, "model-A@1");
  compute_and_push_out(&a, 4);
  open_remote(&other, srv.url, "model-B@1");
  compute_and_push_out(&other, 4);
  open_remote(&b, srv.url, "model-A@1");
  kvt_key keys[NB], okeys[NB];
  uint32_t tok[NB * 16];
  fixture_keys(&b, 4, NB, keys, tok);
  fixture_keys(&other, 4, NB, okeys, tok);
  char name[128], oname[128], out[256];
  /* Block 2: garbage of a record's length; block 1: another namespace's record. */
  key_name(&b, &keys[2], name);
  static char junk[64 << 10];
  memset(junk, 0x5a, sizeof junk);
  assert_int_equal(kvt_redis_cmd(&srv, 0, out, sizeof out, "SET %s %b", name, junk, sizeof junk), 0);
  key_name(&b, &keys[1], name);
  key_name(&other, &okeys[1], oname);
  assert_int_equal(kvt_redis_cmd(&srv, 0, out, sizeof out, "COPY %s %s REPLACE", oname, name), 0);
  assert_string_equal(out, "1");
  /* The probe still says "stored"; the fetch refuses block 1: the request
   * restores block 0 and computes from block 1 on. */
  kvt_req r;
  uint32_t slots[NB], ready = 99;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(b.c, keys, tok, NB, NB, 0, 0, &r, slots, &info);
  assert_int_equal(rc, 1);
  assert_int_equal(info.n_from_remote, NB);
  assert_int_equal(kvt_request_wait(b.c, r, -1, &ready), 0);
  assert_int_equal(ready, 1);
  uint8_t st[NB];
  assert_int_equal(kvt_request_block_states(b.c, r, st, NB), 0);
  assert_int_equal(st[0], KVT_BLOCK_READY);
  assert_int_equal(st[1], KVT_BLOCK_FAILED);
  assert_true(fixture_check(&b, slots[0], block_seed(4, 0)));
  for (uint32_t i = 1; i < NB; i++) fixture_write(&b, slots[i], block_seed(4, i));
  assert_int_equal(kvt_commit(b.c, r, NB, NULL), 0);
  assert_int_equal(kvt_release(b.c, r), 0);
  assert_int_equal(kvt_drain(b.c), 0);
  kvt_stats sb = fixture_stats(&b);
  assert_true(sb.remote_corrupt >= 1);
  assert_int_equal(sb.hits_remote, 1);
  fixture_close(&b);
  fixture_close(&other);
  fixture_close(&a);
}

/* Waits (up to 20 s) until a lookup of keys in f finds n remote blocks. */
static int wait_remote(fixture *f, const kvt_key *keys, uint32_t n) {
  for (int i = 0; i < 400; i++) {
    kvt_lookup_result lr = fixture_lookup(f, keys, n);
    if (lr.n_remote == n) return 1;
    usleep(50000);
  }
  return 0;
}

static void server_killed_mid_run_then_back(void **state) {
  (void)state;
  flush_server();
  fixture a, b;
  open_remote(&a, srv.url, "model-A@1");
  open_remote(&b, srv.url, "model-A@1");
  compute_and_push_out(&a, 5);
  kvt_key keys[NB], local[NB];
  uint32_t tok[NB * 16], ltok[NB * 16];
  fixture_keys(&b, 5, NB, keys, tok);
  fixture_keys(&a, 5 + 1000, NB, local, ltok); /* still on a's host */
  assert_int_equal(fixture_lookup(&a, local, NB).n_host, NB);

  kvt_redis_signal(&srv, 0, SIGKILL);
  /* Requests complete: b computes everything; a restores its host blocks. */
  assert_int_equal(run_request(&b, keys, tok, NB, 5), 0);
  assert_int_equal(run_request(&a, local, ltok, NB, 5 + 1000), NB);
  compute_and_push_out(&a, 6); /* puts to a dead server: counted, never waited for past the timeout */
  kvt_stats sa = fixture_stats(&a);
  assert_true(sa.remote_errors + sa.remote_timeouts >= 1);
  kvt_stats sb = fixture_stats(&b);
  assert_int_equal(sb.hits_remote, 0);

  assert_int_equal(kvt_redis_restart(&srv, 0), 0);
  /* The restarted server is empty: a's next evictions fill it, and b finds
   * them once the client's backoff has let it reconnect. */
  kvt_key k7[NB];
  uint32_t t7[NB * 16];
  fixture_keys(&b, 7, NB, k7, t7);
  int back = 0;
  for (int round = 0; round < 40 && !back; round++) {
    compute_and_push_out(&a, 7 + 2000 * (uint32_t)round);
    fixture_keys(&b, 7 + 2000 * (uint32_t)round, NB, k7, t7);
    back = fixture_lookup(&b, k7, NB).n_remote == NB;
    if (!back) usleep(250000);
  }
  assert_true(back);
  /* Both saw the server fail and come back: counted. */
  sa = fixture_stats(&a);
  sb = fixture_stats(&b);
  assert_int_equal(sa.remote_degraded, 0);
  assert_int_equal(sb.remote_degraded, 0);
  assert_true(sa.remote_reconnects >= 1);
  assert_true(sb.remote_reconnects >= 1);
  fixture_close(&b);
  fixture_close(&a);
}

/* A server that stops answering (SIGSTOP: connections stay open, nothing
 * comes back) with few jobs: puts time out, requests never stall, local
 * restores work, and the tier is used again once it answers. */
static void stopped_server_never_stalls_requests(void **state) {
  (void)state;
  flush_server();
  kvt_config cfg = remote_config(srv.url, "model-A@1");
  cfg.max_jobs = 4;
  cfg.remote_timeout_ms = 200;
  fixture a;
  fixture_open_cfg(&a, &cfg, 2 * NB);
  compute_and_push_out(&a, 30);
  kvt_redis_signal(&srv, 0, SIGSTOP);
  for (uint32_t conv = 31; conv < 37; conv++) compute_and_push_out(&a, conv);
  kvt_key keys[NB];
  uint32_t tok[NB * 16];
  fixture_keys(&a, 36 + 1000, NB, keys, tok); /* on a's host */
  assert_int_equal(run_request(&a, keys, tok, NB, 36 + 1000), NB);
  fixture_keys(&a, 30, NB, keys, tok); /* on the stopped server: computed again */
  assert_int_equal(run_request(&a, keys, tok, NB, 30), 0);
  kvt_stats st = fixture_stats(&a);
  assert_true(st.remote_timeouts + st.remote_errors >= 1);
  kvt_redis_signal(&srv, 0, SIGCONT);
  fixture b;
  open_remote(&b, srv.url, "model-A@1");
  int back = 0;
  for (uint32_t round = 0; round < 40 && !back; round++) {
    compute_and_push_out(&a, 40 + 2000 * round);
    fixture_keys(&b, 40 + 2000 * round, NB, keys, tok);
    back = fixture_lookup(&b, keys, NB).n_remote == NB;
    if (!back) usleep(250000);
  }
  assert_true(back);
  fixture_close(&b);
  fixture_close(&a);
}

static void unreachable_at_open_is_degraded_then_back(void **state) {
  (void)state;
  flush_server();
  /* A port nothing listens on yet: node 0 of a second server, stopped. */
  kvt_redis later;
  assert_int_equal(kvt_redis_start(&later, NULL), 0);
  char url[1100];
  snprintf(url, sizeof url, "%s", later.url);
  kvt_redis_signal(&later, 0, SIGKILL);
  fixture b;
  open_remote(&b, url, "model-A@1"); /* registration succeeds */
  kvt_stats sb = fixture_stats(&b);
  assert_int_equal(sb.remote_degraded, 1);
  kvt_key keys[NB];
  uint32_t tok[NB * 16];
  fixture_keys(&b, 8, NB, keys, tok);
  assert_int_equal(run_request(&b, keys, tok, NB, 8), 0); /* works as a local cache */
  assert_int_equal(kvt_redis_restart(&later, 0), 0);
  int back = 0;
  for (int i = 0; i < 400 && !back; i++) {
    back = fixture_stats(&b).remote_reconnects == 1;
    if (!back) usleep(50000);
  }
  assert_true(back);
  fixture a;
  open_remote(&a, url, "model-A@1");
  compute_and_push_out(&a, 9);
  fixture_keys(&b, 9, NB, keys, tok);
  assert_true(wait_remote(&b, keys, NB));
  assert_int_equal(run_request(&b, keys, tok, NB, 9), NB);
  fixture_close(&a);
  fixture_close(&b);
  kvt_redis_stop(&later);
}

typedef struct log_capture {
  char text[16384];
  size_t len;
} log_capture;

static void capture(void *ctx, int level, const char *msg) {
  (void)level;
  log_capture *lc = ctx;
  size_t n = strlen(msg);
  if (lc->len + n + 2 < sizeof lc->text) {
    memcpy(lc->text + lc->len, msg, n);
    lc->len += n;
    lc->text[lc->len++] = '\n';
    lc->text[lc->len] = 0;
  }
}

static void refused_credentials_fail_registration(void **state) {
  (void)state;
  kvt_redis locked;
  kvt_redis_opts o = {.requirepass = "right-pw-3141"};
  assert_int_equal(kvt_redis_start(&locked, &o), 0);
  const char *pw = "wrong-pw-2718";
  log_capture lc = {.len = 0};
  kvt_config cfg = remote_config(locked.url, "model-A@1");
  cfg.remote_password = pw;
  cfg.log_fn = capture;
  cfg.log_ctx = &lc;
  cfg.log_level = KVT_LOG_INFO;
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_layout lay;
  kvt_layout_init(&lay);
  unsigned char *pool = calloc(8, 4096);
  kvt_segment seg[2] = {{pool, 4096, 2048}, {pool + 2048, 4096, 2048}};
  lay.num_layers = 1;
  lay.num_slots = 8;
  lay.segments = seg;
  assert_int_equal(kvt_register_layout(c, &lay), KVT_EAUTH);
  assert_null(strstr(kvt_error_detail(c), pw));
  kvt_close(c);
  /* The right password works; it shows in no log line, stat or metric. */
  cfg.remote_password = "right-pw-3141";
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(c, &st), 0);
  assert_int_equal(st.remote_degraded, 0);
  static char text[65536];
  size_t len = sizeof text;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, text, &len), 0);
  assert_non_null(strstr(text, "tier=\"remote\""));
  assert_null(strstr(text, "right-pw"));
  kvt_close(c);
  /* A malformed URL, or a scheme without support (TLS): -EINVAL, named. */
  const char *bad_urls[] = {"redis://127.0.0.1:99999", "rediss://127.0.0.1:6379", "redis://127.0.0.1:63x9", "redis://host/0"};
  for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++) {
    cfg.remote_url = bad_urls[i];
    assert_int_equal(kvt_open(&cfg, &c), 0);
    assert_int_equal(kvt_register_layout(c, &lay), -EINVAL);
    assert_non_null(strstr(kvt_error_detail(c), "remote tier"));
    kvt_close(c);
  }
  /* A key prefix past 60 bytes: -EINVAL, and the detail says which field. */
  char prefix[62];
  memset(prefix, 'p', sizeof prefix - 1);
  prefix[sizeof prefix - 1] = 0;
  cfg.remote_url = locked.url;
  cfg.remote_key_prefix = prefix;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_register_layout(c, &lay), -EINVAL);
  assert_non_null(strstr(kvt_error_detail(c), "remote_key_prefix"));
  kvt_close(c);
  prefix[60] = 0; /* 60 bytes: fine */
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_register_layout(c, &lay), 0);
  kvt_close(c);
  cfg.remote_key_prefix = NULL;
  /* A URL carrying the password is logged masked. */
  char url[1200];
  snprintf(url, sizeof url, "redis://:right-pw-3141@127.0.0.1:1");
  cfg.remote_url = url;
  cfg.remote_password = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_register_layout(c, &lay), 0); /* unreachable: degraded, not an error */
  kvt_close(c);
  assert_non_null(strstr(lc.text, "unreachable"));
  assert_null(strstr(lc.text, "right-pw"));
  assert_null(strstr(lc.text, pw));
  free(pool);
  kvt_redis_stop(&locked);
}

/* ---- storage mode ---- */

#define SBLOCK 8192u
#define SNB 8

static kvt_cache *open_storage_disk(const char *url, uint32_t host, uint64_t disk) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "storage-remote";
  cfg.host_blocks = host;
  cfg.copy_threads = 2;
  char path[512];
  snprintf(path, sizeof path, "%s/storage-remote.kvt", kvt_test_tmpdir());
  cfg.disk_path = disk ? path : NULL;
  cfg.disk_blocks = disk;
  cfg.disk_reset = 1;
  cfg.remote_url = url;
  cfg.remote_negative_ms = 1;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt_segment seg[2] = {{NULL, 0, SBLOCK / 2}, {NULL, 0, SBLOCK / 2}};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.num_slots = 0;
  l.segments = seg;
  l.flags = KVT_LAYOUT_STORAGE;
  assert_int_equal(kvt_register_layout(c, &l), 0);
  return c;
}

static kvt_cache *open_storage(const char *url, uint32_t host) { return open_storage_disk(url, host, 0); }

static int storage_job(kvt_cache *c, const kvt_key *keys, const uint32_t *tok, char *mem, uint32_t n, int get,
                       int32_t *res, uint32_t *n_ok) {
  kvt_piece pc[SNB];
  for (uint32_t i = 0; i < n; i++) pc[i] = (kvt_piece){.ptr = mem + (size_t)i * SBLOCK, .len = SBLOCK};
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = n;
  b.keys = keys;
  b.tokens = tok;
  b.pieces = pc;
  kvt_job j;
  assert_int_equal(get ? kvt_get_into(c, &b, &j) : kvt_put_from(c, &b, &j), 1);
  int rc = kvt_storage_wait(c, j, -1);
  assert_int_equal(kvt_storage_results(c, j, res, n, n_ok), 0);
  assert_int_equal(kvt_storage_release(c, j), 0);
  return rc;
}

static void storage_mode_puts_and_gets_through_the_server(void **state) {
  (void)state;
  flush_server();
  kvt_cache *a = open_storage(srv.url, 2), *b = open_storage(srv.url, 2);
  static char src[SNB * SBLOCK], dst[SNB * SBLOCK], more[SNB * SBLOCK];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (char)(i * 131 + 7), more[i] = (char)(i * 17);
  uint32_t tok[SNB * 16], tok2[SNB * 16];
  for (uint32_t i = 0; i < SNB * 16; i++) tok[i] = 500 + i, tok2[i] = 90000 + i;
  kvt_key keys[SNB], keys2[SNB];
  size_t nk;
  assert_int_equal(kvt_hash_tokens(a, NULL, tok, SNB * 16, keys, SNB, &nk), 0);
  assert_int_equal(kvt_hash_tokens(a, NULL, tok2, SNB * 16, keys2, SNB, &nk), 0);
  int32_t res[SNB];
  uint32_t ok = 0;
  /* a's host holds 2 blocks: putting 8, then 8 more, sends the first ones on. */
  assert_int_equal(storage_job(a, keys, tok, src, SNB, 0, res, &ok), 0);
  assert_int_equal(storage_job(a, keys2, tok2, more, SNB, 0, res, &ok), 0);
  assert_int_equal(kvt_drain(a), 0);
  kvt_stats sa = {.size = sizeof sa};
  assert_int_equal(kvt_get_stats(a, &sa), 0);
  assert_true(sa.blocks_h2remote >= SNB);
  /* b has never seen them: exists says remote, get_into brings every byte. */
  kvt_lookup_result lr = {.size = sizeof lr};
  uint8_t tiers[SNB];
  assert_int_equal(kvt_exists(b, NULL, keys, SNB, 0, &lr, tiers), 0);
  assert_int_equal(lr.n_prefix, SNB);
  assert_int_equal(lr.n_remote, SNB);
  assert_int_equal(tiers[SNB - 1], KVT_TIER_REMOTE);
  memset(dst, 0, sizeof dst);
  assert_int_equal(storage_job(b, keys, tok, dst, SNB, 1, res, &ok), 0);
  assert_int_equal(ok, SNB);
  assert_memory_equal(dst, src, sizeof src);
  /* Other tokens under the same keys: refused, never wrong bytes. */
  uint32_t bad[SNB * 16];
  memcpy(bad, tok, sizeof bad);
  bad[5 * 16 + 3] ^= 1;
  memset(dst, 0, sizeof dst);
  assert_int_equal(storage_job(b, keys, bad, dst, SNB, 1, res, &ok), KVT_EMISMATCH);
  assert_int_equal(ok, 5);
  assert_int_equal(res[5], KVT_EMISMATCH);
  assert_memory_equal(dst, src, 5 * SBLOCK);
  kvt_stats sb = {.size = sizeof sb};
  assert_int_equal(kvt_get_stats(b, &sb), 0);
  assert_int_equal(sb.blocks_remote2h, SNB + 5 + (res[6] == 0) + (res[7] == 0));
  kvt_close(b);
  kvt_close(a);
}

/* A cache with a disk tier reads disk blocks straight into registered,
 * aligned engine memory; blocks that come from the remote arrive as whole
 * records and must go through staging into that same memory, byte-exact. */
static void storage_mode_remote_into_registered_memory(void **state) {
  (void)state;
  flush_server();
  kvt_cache *a = open_storage(srv.url, 2), *b = open_storage_disk(srv.url, 2, 64);
  static char src[SNB * SBLOCK];
  char *dst = aligned_alloc(4096, SNB * SBLOCK);
  assert_non_null(dst);
  kvt_region reg;
  assert_int_equal(kvt_register_memory(b, dst, SNB * SBLOCK, KVT_MEM_HOST, &reg), 0);
  for (size_t i = 0; i < sizeof src; i++) src[i] = (char)(i * 29 + 3);
  uint32_t tok[SNB * 16];
  for (uint32_t i = 0; i < SNB * 16; i++) tok[i] = 7000 + i;
  kvt_key keys[SNB];
  size_t nk;
  assert_int_equal(kvt_hash_tokens(a, NULL, tok, SNB * 16, keys, SNB, &nk), 0);
  int32_t res[SNB];
  uint32_t ok = 0;
  assert_int_equal(storage_job(a, keys, tok, src, SNB, 0, res, &ok), 0);
  /* a's host holds 2: two more puts push every one of them to the server. */
  static char filler[SNB * SBLOCK];
  uint32_t tok2[SNB * 16];
  for (uint32_t i = 0; i < SNB * 16; i++) tok2[i] = 900000 + i;
  kvt_key keys2[SNB];
  assert_int_equal(kvt_hash_tokens(a, NULL, tok2, SNB * 16, keys2, SNB, &nk), 0);
  assert_int_equal(storage_job(a, keys2, tok2, filler, SNB, 0, res, &ok), 0);
  assert_int_equal(kvt_drain(a), 0);
  memset(dst, 0, SNB * SBLOCK);
  kvt_piece pc[SNB];
  for (uint32_t i = 0; i < SNB; i++) pc[i] = (kvt_piece){.region = reg, .offset = (uint64_t)i * SBLOCK, .len = SBLOCK};
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = SNB;
  bt.keys = keys;
  bt.tokens = tok;
  bt.pieces = pc;
  kvt_job j;
  assert_int_equal(kvt_get_into(b, &bt, &j), 1);
  assert_int_equal(kvt_storage_wait(b, j, -1), 0);
  assert_int_equal(kvt_storage_results(b, j, res, SNB, &ok), 0);
  assert_int_equal(kvt_storage_release(b, j), 0);
  assert_int_equal(ok, SNB);
  assert_memory_equal(dst, src, SNB * SBLOCK);
  /* Again (storage mode keeps no copy of a block fetched from the remote). */
  assert_int_equal(kvt_drain(b), 0);
  memset(dst, 0, SNB * SBLOCK);
  assert_int_equal(kvt_get_into(b, &bt, &j), 1);
  assert_int_equal(kvt_storage_wait(b, j, -1), 0);
  assert_int_equal(kvt_storage_results(b, j, res, SNB, &ok), 0);
  assert_int_equal(kvt_storage_release(b, j), 0);
  assert_int_equal(ok, SNB);
  assert_memory_equal(dst, src, SNB * SBLOCK);
  assert_int_equal(kvt_unregister_memory(b, reg), 0);
  kvt_close(b);
  kvt_close(a);
  free(dst);
}

/* A prefix longer than one probe's batch is found whole; kvt_remove takes
 * the server's copies too. */
static void long_prefixes_and_removal(void **state) {
  (void)state;
  flush_server();
  enum { N = 600 };
  kvt_cache *a = open_storage(srv.url, 2), *b = open_storage(srv.url, 2);
  static char mem[64 * SBLOCK];
  static uint32_t tok[N * 16];
  static kvt_key keys[N];
  for (size_t i = 0; i < sizeof mem; i++) mem[i] = (char)(i * 29 + 1);
  for (uint32_t i = 0; i < N * 16; i++) tok[i] = 7000 + i;
  size_t nk;
  assert_int_equal(kvt_hash_tokens(a, NULL, tok, N * 16, keys, N, &nk), 0);
  int32_t res[SNB];
  uint32_t ok;
  for (uint32_t i = 0; i < N; i += SNB) {
    /* Chained batches: each continues after the last key of the one before. */
    kvt_piece pc[SNB];
    for (uint32_t k = 0; k < SNB; k++) pc[k] = (kvt_piece){.ptr = mem + (size_t)((i + k) % 64) * SBLOCK, .len = SBLOCK};
    kvt_batch bt;
    kvt_batch_init(&bt);
    bt.n_blocks = SNB;
    bt.keys = keys + i;
    bt.parent = i ? &keys[i - 1] : NULL;
    bt.tokens = tok + (size_t)i * 16;
    bt.pieces = pc;
    kvt_job j;
    assert_int_equal(kvt_put_from(a, &bt, &j), 1);
    assert_int_equal(kvt_storage_wait(a, j, -1), 0);
    assert_int_equal(kvt_storage_results(a, j, res, SNB, &ok), 0);
    assert_int_equal(ok, SNB);
    assert_int_equal(kvt_storage_release(a, j), 0);
  }
  assert_int_equal(kvt_drain(a), 0);
  kvt_stats sa = {.size = sizeof sa};
  assert_int_equal(kvt_get_stats(a, &sa), 0);
  assert_int_equal(sa.remote_puts_skipped, 0);
  kvt_lookup_result lr = {.size = sizeof lr};
  assert_int_equal(kvt_exists(b, NULL, keys, N, 0, &lr, NULL), 0);
  assert_int_equal(lr.n_remote, N - 2); /* a's host keeps the last two */
  kvt_stats sb = {.size = sizeof sb};
  assert_int_equal(kvt_get_stats(b, &sb), 0);
  assert_int_equal(sb.remote_probes, (N - 2 + KVT__RPROBE_MAX - 1) / KVT__RPROBE_MAX);
  size_t removed = 0;
  assert_int_equal(kvt_remove(a, keys, N, &removed), 0);
  assert_int_equal(removed, 2);
  int gone = 0;
  for (int i = 0; i < 400 && !gone; i++) {
    assert_int_equal(kvt_exists(b, NULL, keys, N, 0, &lr, NULL), 0);
    gone = lr.n_prefix == 0;
    if (!gone) usleep(10000);
  }
  assert_true(gone);
  kvt_close(b);
  kvt_close(a);
}

/* ---- a cluster ---- */

static void cluster_shares_blocks(void **state) {
  (void)state;
  kvt_redis cl;
  if (kvt_redis_cluster_start(&cl, 3, 0, NULL) != 0) fail_msg("cluster did not start");
  fixture a, b;
  open_remote(&a, cl.url, "model-A@1");
  for (uint32_t conv = 20; conv < 26; conv++) compute_and_push_out(&a, conv);
  open_remote(&b, cl.url, "model-A@1");
  kvt_stats sb = fixture_stats(&b);
  assert_int_equal(sb.remote_cluster, 1);
  assert_int_equal(sb.remote_nodes, 3);
  for (uint32_t conv = 20; conv < 26; conv++) {
    kvt_key keys[NB];
    uint32_t tok[NB * 16];
    fixture_keys(&b, conv, NB, keys, tok);
    assert_int_equal(run_request(&b, keys, tok, NB, conv), NB);
  }
  assert_int_equal(fixture_stats(&b).hits_remote, 6 * NB);
  /* The blocks went to every master: keys spread over all the slots. */
  char out[64];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(kvt_redis_cmd(&cl, i, out, sizeof out, "DBSIZE"), 0);
    assert_true(atoi(out) > 0);
  }
  fixture_close(&b);
  fixture_close(&a);
  kvt_redis_stop(&cl);
}

/* A master killed mid-run: requests complete (its blocks are misses),
 * local data stays, and once a replica is promoted the whole key space is
 * used again. */
static void cluster_master_killed_then_failover(void **state) {
  (void)state;
  kvt_redis cl;
  kvt_redis_opts o = {.node_timeout_ms = 1000};
  if (kvt_redis_cluster_start(&cl, 3, 1, &o) != 0) fail_msg("cluster did not start");
  fixture a, b;
  open_remote(&a, cl.url, "model-A@1");
  open_remote(&b, cl.url, "model-A@1");
  for (uint32_t conv = 50; conv < 54; conv++) compute_and_push_out(&a, conv);
  int victim = kvt_redis_slot_master(&cl, 0, 0);
  assert_true(victim >= 0);
  kvt_redis_signal(&cl, victim, SIGKILL);
  /* Requests complete whatever the state of the cluster. */
  for (uint32_t conv = 50; conv < 54; conv++) {
    kvt_key keys[NB];
    uint32_t tok[NB * 16];
    fixture_keys(&b, conv, NB, keys, tok);
    uint32_t ready = run_request(&b, keys, tok, NB, conv);
    assert_true(ready <= NB);
  }
  kvt_key local[NB];
  uint32_t ltok[NB * 16];
  fixture_keys(&a, 53 + 1000, NB, local, ltok); /* on a's host */
  assert_int_equal(run_request(&a, local, ltok, NB, 53 + 1000), NB);
  /* After the failover every slot has a master again: new blocks of many
   * conversations (keys over all slots) all come back through b. */
  int back = 0;
  for (uint32_t round = 0; round < 60 && !back; round++) {
    back = 1;
    for (uint32_t k = 0; k < 8 && back; k++) { /* 32 keys: some on every master */
      uint32_t conv = 60 + 3000 * round + k;
      compute_and_push_out(&a, conv);
      kvt_key keys[NB];
      uint32_t tok[NB * 16];
      fixture_keys(&b, conv, NB, keys, tok);
      back = fixture_lookup(&b, keys, NB).n_remote == NB;
    }
    if (!back) usleep(250000);
  }
  assert_true(back);
  fixture_close(&b);
  fixture_close(&a);
  kvt_redis_stop(&cl);
}

/* A lookup the server cannot answer in time (stopped) remembers nothing:
 * once the server runs again the blocks are found, long before the
 * negative window (10 s) of a key the server said was absent would end. */
static void unanswered_probe_is_not_remembered_absent(void **state) {
  (void)state;
  for (uint32_t round = 0; round < 3; round++) {
    flush_server();
    fixture a, b;
    open_remote(&a, srv.url, "model-A@1");
    compute_and_push_out(&a, 500 + round);
    kvt_config cfg = remote_config(srv.url, "model-A@1");
    cfg.remote_timeout_ms = 300;
    cfg.remote_negative_ms = 10000;
    fixture_open_cfg(&b, &cfg, 2 * NB);
    kvt_key keys[NB];
    uint32_t tok[NB * 16];
    fixture_keys(&b, 500 + round, NB, keys, tok);
    assert_int_equal(fixture_lookup(&b, keys, NB).n_remote, NB);
    kvt_redis_signal(&srv, 0, SIGSTOP);
    assert_int_equal(fixture_lookup(&b, keys, NB).n_remote, 0); /* no answer: a miss now */
    kvt_redis_signal(&srv, 0, SIGCONT);
    int back = 0;
    for (int t = 0; t < 40 && !back; t++) {
      usleep(100000);
      back = fixture_lookup(&b, keys, NB).n_remote == NB;
    }
    assert_true(back);
    assert_int_equal(fixture_stats(&b).remote_negative_hits, 0);
    fixture_close(&b);
    fixture_close(&a);
  }
}

int main(void) {
  setup_server();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(two_caches_share_blocks_byte_exact),
      cmocka_unit_test(plan_and_prefetch_see_remote_blocks),
      cmocka_unit_test(namespaces_stay_apart),
      cmocka_unit_test(garbage_and_foreign_values_are_misses),
      cmocka_unit_test(server_killed_mid_run_then_back),
      cmocka_unit_test(stopped_server_never_stalls_requests),
      cmocka_unit_test(unanswered_probe_is_not_remembered_absent),
      cmocka_unit_test(unreachable_at_open_is_degraded_then_back),
      cmocka_unit_test(refused_credentials_fail_registration),
      cmocka_unit_test(storage_mode_puts_and_gets_through_the_server),
      cmocka_unit_test(storage_mode_remote_into_registered_memory),
      cmocka_unit_test(long_prefixes_and_removal),
      cmocka_unit_test(cluster_shares_blocks),
      cmocka_unit_test(cluster_master_killed_then_failover),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  kvt_redis_stop(&srv);
  return rc;
}
