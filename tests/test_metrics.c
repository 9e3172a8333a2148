/* kvt_metrics_write and the log hook. The exposition is parsed as a
 * Prometheus scraper would (every line: HELP, TYPE, or a sample with a valid
 * name, labels and value; histogram buckets cumulative, +Inf = _count); the
 * JSON is parsed with cJSON and must say the same; every counter equals what
 * a scripted run did against known capacities; and the log hook sees each
 * operator event under injected faults. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_fixture.h"
#include "prom_parse.h"
#include "kvtier/backend.h"
#include "store/record.h"
#include "util/fault.h"

#define BT 16

/* ---- the exposition, parsed (prom_parse.h) and its JSON ---- */

/* The JSON says what the text says, sample for sample. */
static void check_json_matches(kvt_cache *c, const expo *e) {
  size_t len = 0;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_JSON, NULL, &len), -ENOBUFS);
  char *buf = malloc(len + 1);
  size_t cap = len + 1;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_JSON, buf, &cap), 0);
  assert_int_equal(cap, len);
  cJSON *root = cJSON_Parse(buf);
  assert_non_null(root);
  assert_string_equal(cJSON_GetObjectItem(root, "version")->valuestring, kvt_version());
  cJSON *fams = cJSON_GetObjectItem(root, "metrics"), *fam;
  assert_true(cJSON_IsArray(fams));
  int n_values = 0;
  cJSON_ArrayForEach(fam, fams) {
    const char *name = cJSON_GetObjectItem(fam, "name")->valuestring;
    const char *type = cJSON_GetObjectItem(fam, "type")->valuestring;
    assert_non_null(cJSON_GetObjectItem(fam, "help"));
    cJSON *smp;
    cJSON_ArrayForEach(smp, cJSON_GetObjectItem(fam, "samples")) {
      char labels[192] = "";
      size_t at = 0;
      cJSON *l;
      cJSON_ArrayForEach(l, cJSON_GetObjectItem(smp, "labels"))
        at += (size_t)snprintf(labels + at, sizeof labels - at, "%s%s=\"%s\"", at ? "," : "", l->string, l->valuestring);
      char full[256], nm[128];
      if (!strcmp(type, "histogram")) {
        cJSON *b;
        cJSON_ArrayForEach(b, cJSON_GetObjectItem(smp, "buckets")) {
          snprintf(full, sizeof full, "%s,le=\"%s\"", labels, cJSON_GetObjectItem(b, "le")->valuestring);
          snprintf(nm, sizeof nm, "%s_bucket", name);
          assert_true(value_of(e, nm, full) == cJSON_GetObjectItem(b, "count")->valuedouble);
          n_values++;
        }
        snprintf(nm, sizeof nm, "%s_count", name);
        assert_true(value_of(e, nm, labels) == cJSON_GetObjectItem(smp, "count")->valuedouble);
        snprintf(nm, sizeof nm, "%s_sum", name);
        assert_true(fabs(value_of(e, nm, labels) - cJSON_GetObjectItem(smp, "sum")->valuedouble) < 1e-6);
        n_values += 2;
      } else {
        assert_true(value_of(e, name, labels) == cJSON_GetObjectItem(smp, "value")->valuedouble);
        n_values++;
      }
    }
  }
  assert_int_equal(n_values, e->n); /* nothing in the text the JSON lacks */
  cJSON_Delete(root);
  free(buf);
}

/* Writes, parses and checks the exposition; returns it parsed. */
static void scrape(kvt_cache *c, expo *e) {
  size_t len = 0;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, NULL, &len), -ENOBUFS);
  assert_true(len > 0 && len < sizeof e->text);
  size_t cap = sizeof e->text;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, e->text, &cap), 0);
  assert_int_equal(cap, strlen(e->text));
  parse_prometheus(e->text, e);
  check_histograms(e);
  check_json_matches(c, e);
}

static expo ex; /* large: not on the stack */

static double tier_v(const char *name, const char *tier) {
  char l[64];
  snprintf(l, sizeof l, "tier=\"%s\"", tier);
  return value_of(&ex, name, l);
}

static double path_v(const char *name, const char *src, const char *dst) {
  char l[64];
  snprintf(l, sizeof l, "src=\"%s\",dst=\"%s\"", src, dst);
  return value_of(&ex, name, l);
}

static double lab_v(const char *name, const char *key, const char *val) {
  char l[64];
  snprintf(l, sizeof l, "%s=\"%s\"", key, val);
  return value_of(&ex, name, l);
}

/* ---- the log hook: messages collected from any thread ---- */

typedef struct logbook {
  pthread_mutex_t lock;
  char lines[64][512];
  int level[64];
  int n;
} logbook;

static logbook book = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void collect(void *ctx, int level, const char *msg) {
  logbook *b = ctx;
  pthread_mutex_lock(&b->lock);
  if (b->n < 64) {
    snprintf(b->lines[b->n], sizeof b->lines[0], "%s", msg);
    b->level[b->n++] = level;
  }
  pthread_mutex_unlock(&b->lock);
}

static void book_clear(void) {
  pthread_mutex_lock(&book.lock);
  book.n = 0;
  pthread_mutex_unlock(&book.lock);
}

/* Lines at `level` containing every one of the (up to 2) needles. */
static int book_count(int level, const char *a, const char *b) {
  int n = 0;
  pthread_mutex_lock(&book.lock);
  for (int i = 0; i < book.n; i++)
    if (book.level[i] == level && strstr(book.lines[i], a) && (!b || strstr(book.lines[i], b))) n++;
  pthread_mutex_unlock(&book.lock);
  return n;
}

/* Lines are written after the lock that found their event is released, so
 * a wait can return just before its line is out: wait for `want` lines
 * (bounded, generously: a missing line still fails), then count them. */
static int book_wait(int level, const char *a, const char *b, int want) {
  for (int i = 0; i < 10000 && book_count(level, a, b) < want; i++) usleep(1000);
  return book_count(level, a, b);
}

/* Events the lines containing `what` report: 1 per line, or its "(N since the last report)". */
static int book_events(const char *what) {
  int n = 0;
  pthread_mutex_lock(&book.lock);
  for (int i = 0; i < book.n; i++) {
    if (!strstr(book.lines[i], what)) continue;
    const char *since = strstr(book.lines[i], " since the last report)");
    const char *open = since ? since : NULL;
    while (open && open > book.lines[i] && open[-1] != '(') open--;
    n += since ? atoi(open) : 1;
  }
  pthread_mutex_unlock(&book.lock);
  return n;
}

static char disk_path[4200];

static kvt_config disk_config(uint32_t host, uint64_t disk, const char *name) {
  kvt_config cfg = fixture_config(host);
  snprintf(disk_path, sizeof disk_path, "%s/%s.kvt", kvt_test_tmpdir(), name);
  cfg.disk_path = disk_path;
  cfg.disk_blocks = disk;
  cfg.disk_reset = 1;
  cfg.log_fn = collect;
  cfg.log_ctx = &book;
  cfg.log_level = KVT_LOG_INFO;
  return cfg;
}

/* Acquires n blocks restoring `restore`, waits, computes the rest, commits,
 * releases. Returns the blocks that arrived restored. */
static uint32_t request(fixture *f, const kvt_key *k, const uint32_t *t, uint32_t n, uint32_t restore, uint32_t conv) {
  kvt_req r;
  uint32_t slots[64], ready = 0;
  int rc = kvt_acquire(f->c, k, t, n, restore, 0, 0, &r, slots, NULL);
  assert_true(rc == 0 || rc == 1);
  assert_int_equal(kvt_request_wait(f->c, r, -1, &ready), 0);
  for (uint32_t i = 0; i < ready; i++) assert_true(fixture_check(f, slots[i], block_seed(conv, i)));
  for (uint32_t i = ready; i < n; i++) fixture_write(f, slots[i], block_seed(conv, i));
  assert_int_equal(kvt_commit(f->c, r, n, NULL), 0);
  assert_int_equal(kvt_release(f->c, r), 0);
  return ready;
}

/* ---- the tests ---- */

/* Counters of engine/metrics.h stay 0 in a build with counting compiled out. */
#ifdef KVT_NO_METRICS
#define REQUIRE_COUNTING() skip()
static const int counting = 0;
#else
#define REQUIRE_COUNTING() ((void)0)
static const int counting = 1;
#endif

static void exposition_before_layout_and_buffer_rules(void **state) {
  kvt_config cfg = fixture_config(4);
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  scrape(c, &ex); /* valid before the layout: capacities 0 */
  assert_true(tier_v("kvtier_capacity_blocks", "device") == 0);
  assert_true(value_of(&ex, "kvtier_lookups_total", NULL) == 0);
  size_t need = 0;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, NULL, &need), -ENOBUFS);
  /* One byte short (no room for the NUL): -ENOBUFS, a NUL-terminated prefix, the full length. */
  char *buf = malloc(need + 1);
  size_t len = need;
  memset(buf, 'x', need + 1);
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, buf, &len), -ENOBUFS);
  assert_int_equal(len, need);
  assert_int_equal(strlen(buf), need - 1);
  len = need + 1;
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, buf, &len), 0);
  assert_int_equal(strlen(buf), need);
  free(buf);
  len = 10;
  assert_int_equal(kvt_metrics_write(c, 7, ex.text, &len), -EINVAL);
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_JSON, NULL, &len), -EINVAL); /* NULL with a size */
  assert_int_equal(kvt_metrics_write(NULL, KVT_METRICS_JSON, ex.text, &len), -EINVAL);
  assert_int_equal(kvt_metrics_write(c, KVT_METRICS_JSON, ex.text, NULL), -EINVAL);
  kvt_close(c);
}

/* A scripted run against 8 device, 4 host and 16 disk slots; every counter
 * is the number the script implies. */
static void counters_equal_what_the_run_did(void **state) {
  REQUIRE_COUNTING();
  kvt_config cfg = disk_config(4, 16, "counters");
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  size_t bb = kvt_block_bytes(f.c);
  kvt_key kA[4], kB[4];
  uint32_t tA[4 * BT], tB[4 * BT];
  fixture_keys(&f, 1, 4, kA, tA);
  fixture_keys(&f, 2, 4, kB, tB);

  assert_int_equal(request(&f, kA, tA, 4, 4, 1), 0);     /* 4 absent, computed, committed */
  assert_int_equal(fixture_lookup(&f, kA, 4).n_device, 4); /* a lookup of 4 blocks */
  assert_int_equal(request(&f, kA, tA, 4, 4, 1), 4);     /* 4 device hits */
  assert_int_equal(request(&f, kA, tA, 4, 1, 1), 1);     /* 1 device hit, 3 planned recomputes */
  uint32_t wrong[4 * BT];
  memcpy(wrong, tA, sizeof wrong);
  wrong[2 * BT] ^= 1;                                    /* block 2's tokens differ */
  assert_int_equal(request(&f, kA, wrong, 4, 4, 1), 2); /* 2 hits, 1 mismatch, 1 absent behind it */
  fixture_offload(&f, kA, 4);                            /* job 1: 4 device -> host, 4 device evictions */
  assert_int_equal(request(&f, kA, tA, 4, 4, 1), 4);     /* job 2: 4 host -> device, 4 host hits */
  fixture_offload(&f, kA, 4);                            /* on host already: no job; 4 device evictions */
  assert_int_equal(request(&f, kB, tB, 4, 4, 2), 0);     /* 4 absent */
  fixture_offload(&f, kB, 4);                            /* host full: job 3 spills A (host -> disk, 4 host
                                                            evictions), job 4 stores B, 4 device evictions */
  kvt_drain(f.c);
  assert_int_equal(fixture_lookup(&f, kA, 4).n_disk, 4);
  /* A back from disk: its 4 staging host slots spill B first (job 5), then job 6 fetches A and loads it. */
  assert_int_equal(request(&f, kA, tA, 4, 4, 1), 4);
  kvt_drain(f.c);

  scrape(f.c, &ex);
  kvt_stats st = fixture_stats(&f);
  assert_true(value_of(&ex, "kvtier_lookups_total", NULL) == 2);
  assert_true(value_of(&ex, "kvtier_lookup_blocks_total", NULL) == 8);
  assert_true(value_of(&ex, "kvtier_lookup_tokens_total", NULL) == 8 * BT);
  assert_true(value_of(&ex, "kvtier_acquires_total", NULL) == 7);
  assert_true(value_of(&ex, "kvtier_acquire_blocks_total", NULL) == 28);
  assert_true(tier_v("kvtier_hit_blocks_total", "device") == 4 + 1 + 2);
  assert_true(tier_v("kvtier_hit_blocks_total", "host") == 4);
  assert_true(tier_v("kvtier_hit_blocks_total", "disk") == 4);
  assert_true(tier_v("kvtier_hit_tokens_total", "disk") == 4 * BT);
  assert_true(lab_v("kvtier_miss_blocks_total", "reason", "absent") == 4 + 1 + 4);
  assert_true(lab_v("kvtier_miss_blocks_total", "reason", "planned_recompute") == 3);
  assert_true(lab_v("kvtier_miss_blocks_total", "reason", "verify_mismatch") == 1);
  assert_true(lab_v("kvtier_miss_blocks_total", "reason", "load_error") == 0);
  /* hits + misses = keyed blocks acquired, and agree with kvt_stats */
  assert_int_equal(st.hits_device + st.hits_host + st.hits_disk + st.misses, 28);
  assert_true(value_of(&ex, "kvtier_committed_blocks_total", NULL) == 8);
  assert_true(path_v("kvtier_transfer_blocks_total", "device", "host") == 8);
  assert_true(path_v("kvtier_transfer_bytes_total", "device", "host") == 8.0 * bb);
  assert_true(path_v("kvtier_transfer_blocks_total", "host", "device") == 8);
  assert_true(path_v("kvtier_transfer_blocks_total", "host", "disk") == 8);
  assert_true(path_v("kvtier_transfer_blocks_total", "disk", "host") == 4);
  assert_true(path_v("kvtier_transfer_bytes_total", "disk", "host") == 4.0 * bb);
  /* One latency observation per job phase on its path. */
  assert_true(path_v("kvtier_transfer_seconds_count", "device", "host") == 2);
  assert_true(path_v("kvtier_transfer_seconds_count", "host", "device") == 2);
  assert_true(path_v("kvtier_transfer_seconds_count", "host", "disk") == 2);
  assert_true(path_v("kvtier_transfer_seconds_count", "disk", "host") == 1);
  assert_true(tier_v("kvtier_evictions_total", "device") == 12);
  assert_true(tier_v("kvtier_evictions_total", "host") == 8);
  assert_true(tier_v("kvtier_evictions_total", "disk") == 0);
  assert_true(tier_v("kvtier_capacity_blocks", "device") == 8);
  assert_true(tier_v("kvtier_capacity_blocks", "host") == 4);
  assert_true(tier_v("kvtier_capacity_blocks", "disk") == 16);
  assert_true(tier_v("kvtier_resident_blocks", "device") == 4); /* A, back on the device */
  assert_true(tier_v("kvtier_resident_blocks", "host") == 4);   /* A's staged copies */
  assert_true(tier_v("kvtier_resident_blocks", "disk") == 8);   /* A and B */
  assert_true(value_of(&ex, "kvtier_jobs_started_total", NULL) == 6);
  assert_true(value_of(&ex, "kvtier_jobs_failed_total", NULL) == 0);
  assert_true(value_of(&ex, "kvtier_jobs_in_flight", NULL) == 0);
  assert_true(lab_v("kvtier_errors_total", "kind", "io") == 0);
  assert_true(value_of(&ex, "kvtier_metadata_bytes", NULL) == (double)st.metadata_bytes);
  assert_true(value_of(&ex, "kvtier_metadata_bytes", NULL) > 0);
  char info[256];
  snprintf(info, sizeof info, "version=\"%s\",device_backend=\"host\",disk_backend=\"%s\",counting=\"on\"",
           kvt_version(), kvt_disk_backend_name(f.c));
  assert_true(value_of(&ex, "kvtier_info", info) == 1);
  fixture_close(&f);
}

/* Planner decisions: each kvt_plan_request counts its decision once, and
 * the blocks it chose to restore. */
static void plan_decisions_are_counted(void **state) {
  REQUIRE_COUNTING();
  kvt_config cfg = fixture_config(8);
  fixture f;
  fixture_open_cfg(&f, &cfg, 16);
  kvt_model_desc m;
  kvt_model_init(&m);
  m.num_layers = FIX_LAYERS, m.hidden_size = 256, m.num_heads = 8, m.num_kv_heads = 1, m.head_dim = 32;
  m.intermediate_size = 512, m.vocab_size = 1000, m.kv_dtype_bytes = 1;
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  assert_int_equal(kvt_set_cost_model(f.c, &m, &hw), 0);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 3, 4, k, t);
  uint64_t want[3] = {0, 0, 0}, restore = 0;
  for (int round = 0; round < 3; round++) {
    kvt_plan p = {.size = sizeof p};
    assert_int_equal(kvt_plan_request(f.c, k, 4, 4 * BT + 1, &p), 0);
    want[p.decision]++;
    restore += p.restore_blocks;
    if (round == 0) assert_int_equal(request(&f, k, t, 4, 4, 3), 0);
    if (round == 1) fixture_offload(&f, k, 4);
  }
  scrape(f.c, &ex);
  assert_true(lab_v("kvtier_plan_decisions_total", "decision", "recompute") == (double)want[0]);
  assert_true(lab_v("kvtier_plan_decisions_total", "decision", "restore") == (double)want[1]);
  assert_true(lab_v("kvtier_plan_decisions_total", "decision", "split") == (double)want[2]);
  assert_true(value_of(&ex, "kvtier_plan_restore_blocks_total", NULL) == (double)restore);
  assert_true(restore >= 4); /* the device hits of round 2 at least */
  assert_true(value_of(&ex, "kvtier_lookups_total", NULL) == 3);
  fixture_close(&f);
}

/* ---- injected faults: counted in the metrics, and one line in the log ---- */

static _Atomic int fault_site, fault_value, fault_left;

static int hook(void *ctx, int site, int64_t arg) {
  if (site != atomic_load(&fault_site) || atomic_load(&fault_left) <= 0) return 0;
  if (site == KVT_FAULT_DEV_COMPLETE && arg != KVT_XFER_H2D) return 0;
  atomic_fetch_sub(&fault_left, 1);
  return atomic_load(&fault_value);
}

static void arm(int site, int value, int count) {
  atomic_store(&fault_site, site);
  atomic_store(&fault_value, value);
  atomic_store(&fault_left, count);
  kvt__fault_set(hook, NULL);
}

static void disarm(void) { kvt__fault_set(NULL, NULL); }

static void io_errors_logged_once_then_counted(void **state) {
  kvt_config cfg = disk_config(4, 16, "ioerr");
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key kA[4], kB[4], kC[4];
  uint32_t tA[4 * BT], tB[4 * BT], tC[4 * BT];
  fixture_keys(&f, 1, 4, kA, tA);
  fixture_keys(&f, 2, 4, kB, tB);
  fixture_keys(&f, 3, 4, kC, tC);
  request(&f, kA, tA, 4, 4, 1);
  fixture_offload(&f, kA, 4);
  request(&f, kB, tB, 4, 4, 2);
  book_clear();
  arm(KVT_FAULT_IO_COMPLETE, -EIO, 4); /* every write of A's spill fails */
  fixture_offload(&f, kB, 4);
  kvt_drain(f.c);
  disarm();
  scrape(f.c, &ex);
  assert_true(lab_v("kvtier_errors_total", "kind", "io") == 4);
  assert_true(value_of(&ex, "kvtier_jobs_failed_total", NULL) == 1);
  /* Four failed writes within a second: one line, naming the file. */
  assert_int_equal(book_wait(KVT_LOG_ERROR, "disk I/O error", disk_path, 1), 1);
  assert_int_equal(book_count(KVT_LOG_ERROR, "disk I/O error", "I/O error"), 1);
  /* A second later, the next error's line counts those held back and itself. */
  usleep(1100 * 1000);
  request(&f, kA, tA, 4, 4, 1); /* A was dropped with its failed spill: computed again */
  arm(KVT_FAULT_IO_COMPLETE, -EIO, 1);
  fixture_offload(&f, kA, 4);   /* B spills: one of its writes fails */
  kvt_drain(f.c);
  disarm();
  /* The first line reported the errors applied before it (one, or a few
   * applied in the same progress step); a later line, over a second after
   * it, reports those held back. Whether this spill's error is in that
   * line or held for the next depends on when the progress thread flushed
   * (any completion flushes), so only the total is checked, at close. */
  assert_int_equal(book_wait(KVT_LOG_ERROR, "disk I/O error", NULL, 2), 2);
  assert_true(book_count(KVT_LOG_ERROR, "disk I/O error", "since the last report)") >= 1);
  assert_true(book_events("disk I/O error") >= 4 && book_events("disk I/O error") <= 4 + 1);
  /* Errors held back by the rate limit are reported at kvt_close, not lost.
   * A third conversation (B's disk copies depend on which of its writes
   * finished first) pushes A's four blocks to disk: two writes fail. */
  request(&f, kC, tC, 4, 4, 3);
  arm(KVT_FAULT_IO_COMPLETE, -EIO, 2);
  fixture_offload(&f, kC, 4);
  kvt_drain(f.c);
  assert_int_equal(atomic_load(&fault_left), 0);
  disarm();
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.io_errors, 4 + 1 + 2);
  fixture_close(&f);
  assert_int_equal(book_events("disk I/O error"), 4 + 1 + 2);
  assert_true(book_count(KVT_LOG_ERROR, "disk I/O error", NULL) < 4 + 1 + 2); /* rate-limited */
}

static void load_errors_are_misses_and_logged(void **state) {
  kvt_config cfg = disk_config(4, 16, "copyerr");
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[4];
  uint32_t t[4 * BT];
  fixture_keys(&f, 1, 4, k, t);
  request(&f, k, t, 4, 4, 1);
  fixture_offload(&f, k, 4);
  book_clear();
  arm(KVT_FAULT_DEV_COMPLETE, -EIO, 1);
  assert_int_equal(request(&f, k, t, 4, 4, 1), 0); /* the load fails: all 4 recomputed */
  disarm();
  scrape(f.c, &ex);
  if (counting) assert_true(lab_v("kvtier_miss_blocks_total", "reason", "load_error") == 4);
  if (counting) assert_true(tier_v("kvtier_hit_blocks_total", "host") == 0); /* never counted as hits */
  assert_true(lab_v("kvtier_errors_total", "kind", "copy") == 4);
  assert_int_equal(book_wait(KVT_LOG_ERROR, "device copy error", NULL, 1), 1);
  fixture_close(&f);
}

/* Flips a payload byte of every record on the disk file. */
static int corrupt_all(const char *path, size_t slot_bytes) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char *rec = malloc(slot_bytes);
  int hit = 0;
  for (uint64_t s = 0;; s++) {
    off_t at = 4096 + (off_t)(s * slot_bytes);
    if (pread(fd, rec, slot_bytes, at) != (ssize_t)slot_bytes) break;
    if (((const kvt__record_hdr *)rec)->magic != KVT_RECORD_MAGIC) continue;
    rec[kvt__record_prefix_bytes(BT) + 100] ^= 0x5a;
    assert_int_equal(pwrite(fd, rec, slot_bytes, at), (ssize_t)slot_bytes);
    hit++;
  }
  free(rec);
  fsync(fd);
  close(fd);
  return hit;
}

static void checksum_failures_counted_and_logged(void **state) {
  kvt_config cfg = disk_config(4, 16, "checksum");
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key kA[4], kB[4];
  uint32_t tA[4 * BT], tB[4 * BT];
  fixture_keys(&f, 1, 4, kA, tA);
  fixture_keys(&f, 2, 4, kB, tB);
  request(&f, kA, tA, 4, 4, 1);
  fixture_offload(&f, kA, 4);
  request(&f, kB, tB, 4, 4, 2);
  fixture_offload(&f, kB, 4); /* A spills to disk */
  kvt_drain(f.c);
  assert_int_equal(corrupt_all(disk_path, kvt__record_bytes(BT, kvt_block_bytes(f.c))), 4);
  book_clear();
  assert_int_equal(request(&f, kA, tA, 4, 4, 1), 0); /* never the corrupt bytes */
  kvt_drain(f.c);
  scrape(f.c, &ex);
  assert_true(lab_v("kvtier_errors_total", "kind", "checksum") >= 1);
  if (counting) assert_true(lab_v("kvtier_miss_blocks_total", "reason", "load_error") == 4);
  assert_int_equal(book_wait(KVT_LOG_ERROR, "failed its checksum", disk_path, 1), 1);
  fixture_close(&f);
}

/* Reads that fail while the disk tier is recovered: one error line, the slots discarded. */
static void recovery_io_errors_are_logged(void **state) {
  kvt_config cfg = disk_config(4, 16, "recover");
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key kA[4], kB[4];
  uint32_t tA[4 * BT], tB[4 * BT];
  fixture_keys(&f, 1, 4, kA, tA);
  fixture_keys(&f, 2, 4, kB, tB);
  request(&f, kA, tA, 4, 4, 1);
  fixture_offload(&f, kA, 4);
  request(&f, kB, tB, 4, 4, 2);
  fixture_offload(&f, kB, 4); /* A spills to disk */
  fixture_close(&f);
  book_clear();
  cfg.disk_reset = 0;
  arm(KVT_FAULT_IO_COMPLETE, -EIO, 2);
  fixture_open_cfg(&f, &cfg, 8);
  disarm();
  kvt_stats st = fixture_stats(&f);
  /* The two failed reads are discarded slots, whether or not they held one of A's 4 records. */
  assert_true(st.disk_discarded >= 2 && st.disk_recovered <= 4 && st.disk_recovered + st.disk_discarded <= 6);
  assert_int_equal(book_count(KVT_LOG_ERROR, "I/O errors while recovering", disk_path), 1);
  scrape(f.c, &ex);
  assert_true(value_of(&ex, "kvtier_disk_discarded_blocks_total", NULL) == (double)st.disk_discarded);
  assert_true(value_of(&ex, "kvtier_disk_recovered_blocks_total", NULL) == (double)st.disk_recovered);
  fixture_close(&f);
}

/* A file of another model at disk_path is set aside: a warning names both paths. */
static void foreign_disk_file_set_aside_is_logged(void **state) {
  kvt_config cfg = disk_config(4, 16, "shared");
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  fixture_close(&f);
  book_clear();
  cfg.disk_reset = 0;
  cfg.model_fingerprint = "another-model@2";
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(book_count(KVT_LOG_WARN, "set aside", disk_path), 1);
  char side[4300];
  snprintf(side, sizeof side, "%s.", disk_path);
  assert_int_equal(book_count(KVT_LOG_WARN, "set aside", side), 1);
  assert_int_equal(book_count(KVT_LOG_INFO, "recovered 0 blocks", NULL), 1);
  fixture_close(&f);
}

/* Whole lines, however long: a message naming two long paths is not cut. */
static char long_line[16384], long_io_line[16384];
static int long_lines, long_newlines;
static void collect_long(void *ctx, int level, const char *msg) {
  (void)ctx;
  if (level == KVT_LOG_WARN && strstr(msg, "set aside")) snprintf(long_line, sizeof long_line, "%s", msg);
  if (level == KVT_LOG_ERROR && strstr(msg, "disk I/O error")) snprintf(long_io_line, sizeof long_io_line, "%s", msg);
  if (strchr(msg, '\n') || strchr(msg, '\r')) long_newlines++;
  long_lines++;
}

/* A disk path of 3000+ bytes with a newline in it: the set-aside warning
 * still names both paths in full, and no message holds a line break. */
static void long_paths_and_newlines_keep_one_whole_line(void **state) {
  (void)state;
  static char dir[4096];
  snprintf(dir, sizeof dir, "%s/long", kvt_test_tmpdir());
  mkdir(dir, 0755);
  while (strlen(dir) < 3000) {
    strcat(dir, "/dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
    assert_true(mkdir(dir, 0755) == 0 || errno == EEXIST);
  }
  kvt_config cfg = disk_config(4, 16, "unused");
  snprintf(disk_path, sizeof disk_path, "%s/kv\nfake: injected.kvt", dir);
  cfg.log_fn = collect_long;
  cfg.log_ctx = NULL;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  fixture_close(&f);
  long_lines = long_newlines = 0;
  long_line[0] = 0;
  cfg.disk_reset = 0;
  cfg.model_fingerprint = "another-model@2";
  fixture_open_cfg(&f, &cfg, 8);
  /* A failed spill: the I/O error line names the slot and the whole path. */
  kvt_key kA[4], kB[4];
  uint32_t tA[4 * BT], tB[4 * BT];
  fixture_keys(&f, 1, 4, kA, tA);
  fixture_keys(&f, 2, 4, kB, tB);
  request(&f, kA, tA, 4, 4, 1);
  fixture_offload(&f, kA, 4);
  request(&f, kB, tB, 4, 4, 2);
  arm(KVT_FAULT_IO_COMPLETE, -EIO, 4);
  fixture_offload(&f, kB, 4);
  kvt_drain(f.c);
  disarm();
  fixture_close(&f);
  assert_true(long_lines >= 1);
  assert_int_equal(long_newlines, 0);
  /* Both paths, with the newline shown as '?'. */
  char shown[4300], side[4400];
  snprintf(shown, sizeof shown, "%s/kv?fake: injected.kvt", dir);
  snprintf(side, sizeof side, "uses %s.", shown);
  assert_non_null(strstr(long_line, shown));
  assert_non_null(strstr(long_line, side));
  snprintf(side, sizeof side, " of %s", shown);
  if (!strstr(long_io_line, side) || !strstr(long_io_line, "): ")) print_message("I/O error line: %s\n", long_io_line + (strlen(long_io_line) > 200 ? strlen(long_io_line) - 200 : 0));
  assert_non_null(strstr(long_io_line, side));
  assert_non_null(strstr(long_io_line, "): "));
}

/* Defaults: no log_fn and no process-wide handler: warnings to stderr, info
 * not; KVT_LOG_NONE silences the cache. */
static void default_warnings_go_to_stderr(void **state) {
  char path[4300];
  snprintf(path, sizeof path, "%s/stderr.txt", kvt_test_tmpdir());
  for (int quiet = 0; quiet < 2; quiet++) {
    kvt_config cfg = disk_config(4, 16, "stderr");
    cfg.log_fn = NULL;
    cfg.log_level = quiet ? KVT_LOG_NONE : KVT_LOG_WARN;
    fixture f;
    fixture_open_cfg(&f, &cfg, 8);
    fixture_close(&f);
    cfg.disk_reset = 0;
    cfg.model_fingerprint = quiet ? "quiet-model@2" : "loud-model@2";
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    fixture_open_cfg(&f, &cfg, 8);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    fixture_close(&f);
    char text[4096] = "";
    FILE *in = fopen(path, "r");
    size_t n = fread(text, 1, sizeof text - 1, in);
    fclose(in);
    text[n] = 0;
    if (quiet) {
      assert_string_equal(text, "");
    } else {
      assert_non_null(strstr(text, "kvtier: warning: "));
      assert_non_null(strstr(text, "set aside"));
      assert_null(strstr(text, "recovered")); /* info is below the default level */
    }
  }
}

/* io_uring refused by the kernel (seccomp here): KVT_DISK_AUTO falls back to
 * threads and says so, once, through the cache's hook. In a child process:
 * the filter cannot be lifted. */
static void uring_refused_fallback_is_logged(void **state) {
  kvt_config cfg = disk_config(4, 16, "fallback");
  cfg.disk_backend = KVT_DISK_AUTO;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct sock_filter filt[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {sizeof filt / sizeof filt[0], filt};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) _exit(77);
    static unsigned char pool[2][8 * 512];
    kvt_segment seg[2] = {{pool[0], 512, 512}, {pool[1], 512, 512}};
    kvt_layout lay;
    kvt_layout_init(&lay);
    lay.num_layers = 1;
    lay.num_slots = 8;
    lay.segments = seg;
    kvt_cache *c;
    book_clear();
    if (kvt_open(&cfg, &c) || kvt_register_layout(c, &lay)) _exit(3);
    int ok = !strcmp(kvt_disk_backend_name(c), "threads") &&
             book_count(KVT_LOG_WARN, "disk I/O falls back", "io_uring refused") == 1;
    kvt_close(c);
    _exit(ok ? 0 : 4);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) skip(); /* no seccomp here */
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- scrapes while requests run ---- */

typedef struct hammer {
  fixture *f;
  uint32_t conv;
  atomic_int *stop;
} hammer;

static void *hammer_main(void *arg) {
  hammer *h = arg;
  kvt_key k[4];
  uint32_t t[4 * BT], slots[4];
  fixture_keys(h->f, h->conv, 4, k, t);
  while (!atomic_load(h->stop)) {
    kvt_req r;
    int rc = kvt_acquire(h->f->c, k, t, 4, 2, 0, 0, &r, slots, NULL);
    if (rc < 0) continue;
    kvt_request_wait(h->f->c, r, -1, NULL);
    kvt_commit(h->f->c, r, 4, NULL);
    kvt_release(h->f->c, r);
  }
  return NULL;
}

static expo live; /* large: not on the stack */

/* A scrape taken while other threads acquire never shows more hits plus
 * misses than keyed blocks acquired (each block is added to
 * acquire_blocks before it is counted as a hit or a miss), so a hit ratio
 * computed from one scrape never exceeds 1. */
static void scrape_never_counts_more_outcomes_than_blocks(void **state) {
  REQUIRE_COUNTING();
  fixture f;
  fixture_open(&f, 16, 0);
  atomic_int stop = 0;
  hammer h[2] = {{&f, 1, &stop}, {&f, 2, &stop}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, hammer_main, &h[i]), 0);
  int bad = 0;
  for (int n = 0; n < 3000 && !bad; n++) {
    size_t cap = sizeof live.text;
    assert_int_equal(kvt_metrics_write(f.c, KVT_METRICS_PROMETHEUS, live.text, &cap), 0);
    parse_prometheus(live.text, &live);
    double out = 0;
    for (int i = 0; i < live.n; i++)
      if (!strcmp(live.s[i].name, "kvtier_hit_blocks_total") || !strcmp(live.s[i].name, "kvtier_miss_blocks_total"))
        out += live.s[i].value;
    double blocks = value_of(&live, "kvtier_acquire_blocks_total", NULL);
    if (out > blocks) {
      print_message("scrape %d: hits + misses %.0f > acquire_blocks %.0f\n", n, out, blocks);
      bad = 1;
    }
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  assert_int_equal(bad, 0);
  fixture_close(&f);
}

/* A refused open has no cache to ask what was wrong: kvt_open says which
 * field, at ERROR, to the config's log_fn, and returns -EINVAL. */
static void refused_open_names_the_field(void **state) {
  (void)state;
  static const struct {
    int field;
    const char *says;
  } cases[] = {{0, "disk_queue_depth is at most 4096"}, {1, "block_tokens must be a power of two"},
               {2, "disk_path needs disk_blocks"}, {3, "max_requests is at most 2^20"}};
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kvt_config cfg = disk_config(8, 16, "refused");
    if (cases[i].field == 0) cfg.disk_queue_depth = 4097;
    if (cases[i].field == 1) cfg.block_tokens = 48;
    if (cases[i].field == 2) cfg.disk_blocks = 0;
    if (cases[i].field == 3) cfg.max_requests = (1u << 20) + 1;
    book_clear();
    kvt_cache *c = NULL;
    assert_int_equal(kvt_open(&cfg, &c), -EINVAL);
    assert_null(c);
    assert_int_equal(book_count(KVT_LOG_ERROR, "kvt_open: ", cases[i].says), 1);
    assert_int_equal(book_count(KVT_LOG_ERROR, "kvt_open: ", NULL), 1);
  }
  kvt_config cfg = disk_config(8, 16, "refused");
  cfg.disk_queue_depth = 4096; /* the most: accepted */
  book_clear();
  kvt_cache *c = NULL;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(book_count(KVT_LOG_ERROR, "kvt_open: ", NULL), 0);
  kvt_close(c);
  unlink(disk_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exposition_before_layout_and_buffer_rules),
      cmocka_unit_test(counters_equal_what_the_run_did),
      cmocka_unit_test(plan_decisions_are_counted),
      cmocka_unit_test(io_errors_logged_once_then_counted),
      cmocka_unit_test(load_errors_are_misses_and_logged),
      cmocka_unit_test(checksum_failures_counted_and_logged),
      cmocka_unit_test(recovery_io_errors_are_logged),
      cmocka_unit_test(foreign_disk_file_set_aside_is_logged),
      cmocka_unit_test(default_warnings_go_to_stderr),
      cmocka_unit_test(uring_refused_fallback_is_logged),
      cmocka_unit_test(long_paths_and_newlines_keep_one_whole_line),
      cmocka_unit_test(scrape_never_counts_more_outcomes_than_blocks),
      cmocka_unit_test(refused_open_names_the_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
