/* kvtier-bench micro, section "remote": the remote tier's client next to
 * the store's own limit, in the same run, on the same servers:
 *
 *   put   2 MiB records through kvt__remote_put (sealed: checksums, routed
 *         by slot, pipelined per node), vs raw hiredis pipelines of SET with
 *         the same keys and values (one connection per node; depths 4, 16
 *         and 32, the best as the limit)
 *   get   the same records back through kvt__remote_get (each verified:
 *         header, tokens, payload checksums), vs raw pipelined GETs
 *
 * Each round runs every pass in a rotated order; each pass counts by its
 * median round. The server is --remote URL, else a redis-server the bench
 * starts on 127.0.0.1 (the row says so), else the section says what it
 * needs and adds no row. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "remote/remote.h"
#include "store/record.h"
#include "util/clock.h"

#ifdef KVT_HAVE_HIREDIS
#include <netinet/in.h>
#include <sys/socket.h>

#include "remote/remote_internal.h"

#define PAYLOAD (2u << 20)
#define BT 16u
#define ROUNDS 5
#define NDEPTHS 3
static const int depths[NDEPTHS] = {4, 16, 32};

/* ---- a local server when no --remote is given ---- */

static pid_t local_pid;
static char local_dir[256];

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static const char *find_server(char *buf, size_t cap) {
  const char *dirs[] = {"/usr/bin", "/usr/sbin", "/usr/local/bin"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    snprintf(buf, cap, "%s/redis-server", dirs[i]);
    if (access(buf, X_OK) == 0) return buf;
  }
  return NULL;
}

static int start_local(char *url, size_t cap) {
  char bin[256];
  if (!find_server(bin, sizeof bin)) return -1;
  int port = free_port();
  const char *tmp = getenv("TMPDIR");
  snprintf(local_dir, sizeof local_dir, "%s/kvt-bench-redis-XXXXXX", tmp ? tmp : "/tmp");
  if (port < 0 || !mkdtemp(local_dir)) return -1;
  char ports[16];
  snprintf(ports, sizeof ports, "%d", port);
  pid_t parent = getpid();
  local_pid = fork();
  if (local_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (!freopen("/dev/null", "w", stdout)) _exit(127);
    execl(bin, bin, "--port", ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode",
          "no", "--dir", local_dir, (char *)NULL);
    _exit(127);
  }
  if (local_pid < 0) return -1;
  for (int t = 0; t < 250; t++) {
    redisContext *c = redisConnect("127.0.0.1", port);
    int ok = c && !c->err;
    if (c) redisFree(c);
    if (ok) {
      snprintf(url, cap, "redis://127.0.0.1:%d", port);
      return 0;
    }
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

static void stop_local(void) {
  if (local_pid > 0) {
    kill(local_pid, SIGKILL);
    waitpid(local_pid, NULL, 0);
    local_pid = 0;
    rmdir(local_dir);
  }
}

/* ---- the client's passes ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint32_t left, failed;

static void on_done(void *arg, int status) {
  pthread_mutex_lock(&mu);
  if (status) failed++;
  if (--left == 0) pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
}

/* One pass of n records: GB/s of payload, or -1 if an op failed. */
static double client_pass(kvt__remote *r, int put, kvt__remote_io *io, uint32_t n) {
  pthread_mutex_lock(&mu);
  left = n;
  failed = 0;
  pthread_mutex_unlock(&mu);
  int64_t t0 = kvt__now_ns();
  int q = put ? kvt__remote_put(r, io, n, on_done) : kvt__remote_get(r, io, n, on_done);
  if (q != (int)n) return -1;
  pthread_mutex_lock(&mu);
  while (left) pthread_cond_wait(&cv, &mu);
  uint32_t f = failed;
  pthread_mutex_unlock(&mu);
  double s = (kvt__now_ns() - t0) * 1e-9;
  return f ? -1 : (double)n * PAYLOAD / s / 1e9;
}

/* ---- raw hiredis pipelines, one connection per node ---- */

typedef struct raw {
  redisContext *ctx[RM_MAX_NODES];
  int node_of[256]; /* per key */
  char keys[256][RM_KEY_MAX];
  size_t klen[256];
} raw;

static int raw_open(raw *w, kvt__remote *r, const kvt_key *keys, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    w->klen[i] = kvt__rm_key(r, &keys[i], w->keys[i]);
    uint16_t idx = atomic_load(&r->slots[kvt__remote_hash_slot(w->keys[i], w->klen[i])]);
    if (!idx) return -1;
    w->node_of[i] = idx - 1;
    if (w->ctx[idx - 1]) continue;
    rm_node *node = kvt__rm_node_at(r, idx - 1u);
    char err[256];
    if (kvt__rm_connect(r, node->host, node->port, &w->ctx[idx - 1], err, sizeof err) != 0) {
      fprintf(stderr, "kvtier-bench micro remote: %s\n", err);
      return -1;
    }
  }
  return 0;
}

static void raw_close(raw *w) {
  for (uint32_t i = 0; i < RM_MAX_NODES; i++)
    if (w->ctx[i]) redisFree(w->ctx[i]);
}

/* n records in pipelines of depth per node: GB/s of payload, or -1. */
static double raw_pass(raw *w, int put, void **recs, size_t rec_bytes, uint32_t n, int depth) {
  int64_t t0 = kvt__now_ns();
  int ok = 1;
  for (uint32_t base = 0; base < n && ok; base += (uint32_t)depth) {
    uint32_t end = base + (uint32_t)depth < n ? base + (uint32_t)depth : n;
    for (uint32_t i = base; i < end; i++) {
      redisContext *c = w->ctx[w->node_of[i]];
      if (put)
        redisAppendCommand(c, "SET %b %b", w->keys[i], w->klen[i], recs[i], rec_bytes);
      else
        redisAppendCommand(c, "GET %b", w->keys[i], w->klen[i]);
    }
    for (uint32_t i = base; i < end; i++) {
      redisReply *rep = NULL;
      if (redisGetReply(w->ctx[w->node_of[i]], (void **)&rep) != REDIS_OK || !rep) {
        ok = 0;
        break;
      }
      if (put ? rep->type != REDIS_REPLY_STATUS : (rep->type != REDIS_REPLY_STRING || rep->len != rec_bytes)) ok = 0;
      freeReplyObject(rep);
    }
  }
  double s = (kvt__now_ns() - t0) * 1e-9;
  return ok ? (double)n * PAYLOAD / s / 1e9 : -1;
}

enum { P_KV_PUT, P_KV_GET, P_RAW_PUT, P_RAW_GET = P_RAW_PUT + NDEPTHS, NPASS = P_RAW_GET + NDEPTHS };

static int run(const kvt_bench_micro_opts *o, kvt_bench_rows *rows, const char *url, int local) {
  uint32_t n = o->quick ? 8 : 32;
  kvt_key ns = {0x62656e6368ull, 0x72656d6f7465ull};
  char detail[256] = "";
  /* One connection per node, as the raw side has: the same parallelism. */
  kvt__remote_cfg cfg = {.url = url, .ns = ns, .block_tokens = BT, .payload_bytes = PAYLOAD, .key_prefix = "kvt-bench:",
                         .conns_per_node = 1};
  cfg.detail = detail;
  cfg.detail_len = sizeof detail;
  kvt__remote *r = NULL;
  int rc = kvt__remote_open(&cfg, &r);
  if (rc) {
    fprintf(stderr, "kvtier-bench micro remote: cannot open %s: %s\n", local ? "the local server" : "--remote",
            detail[0] ? detail : kvt_strerror(rc));
    return rc;
  }
  size_t rec_bytes = kvt__record_bytes(BT, PAYLOAD);
  void **recs = calloc(n, sizeof *recs);
  kvt_key *keys = calloc(n, sizeof *keys);
  kvt__remote_io *io = calloc(n, sizeof *io);
  static raw w; /* 35 KiB of key strings */
  memset(&w, 0, sizeof w);
  rc = recs && keys && io ? 0 : -ENOMEM;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    keys[i] = (kvt_key){i + 1, 0x9e3779b97f4a7c15ull * (i + 1)};
    if (!(recs[i] = aligned_alloc(4096, rec_bytes))) rc = -ENOMEM;
    if (rc) break;
    memset(recs[i], 0, rec_bytes);
    kvt__record_hdr *h = recs[i];
    h->key = keys[i];
    h->flags = KVT_RECORD_F_TOKENS;
    h->token_count = BT;
    for (size_t b = KVT_RECORD_HDR_BYTES; b < rec_bytes; b += 8) *(uint64_t *)((char *)recs[i] + b) = b * 0x9e37u + i;
    io[i] = (kvt__remote_io){keys[i], recs[i], NULL, 0};
  }
  if (rc == 0 && raw_open(&w, r, keys, n) != 0) rc = KVT_EREMOTE;
  double v[NPASS][ROUNDS];
  int rounds = o->quick ? 3 : ROUNDS;
  /* the client's put first: the gets need the records there */
  if (rc == 0 && client_pass(r, 1, io, n) < 0) rc = KVT_EREMOTE;
  for (int round = 0; round < rounds && rc == 0; round++) {
    for (int k = 0; k < NPASS && rc == 0; k++) {
      int p = (k + round) % NPASS;
      double g;
      if (p == P_KV_PUT || p == P_KV_GET)
        g = client_pass(r, p == P_KV_PUT, io, n);
      else if (p < P_RAW_GET)
        g = raw_pass(&w, 1, recs, rec_bytes, n, depths[p - P_RAW_PUT]);
      else
        g = raw_pass(&w, 0, recs, rec_bytes, n, depths[p - P_RAW_GET]);
      if (g < 0) rc = KVT_EREMOTE;
      v[p][round] = g;
    }
  }
  if (rc == 0) {
    double med[NPASS];
    for (int p = 0; p < NPASS; p++) med[p] = kvt_bench_median(v[p], rounds);
    for (int put = 1; put >= 0; put--) {
      int base = put ? P_RAW_PUT : P_RAW_GET, best = 0;
      for (int d = 1; d < NDEPTHS; d++)
        if (med[base + d] > med[base + best]) best = d;
      kvt__remote_stats st;
      kvt__remote_get_stats(r, &st);
      char note[160], name[64];
      snprintf(note, sizeof note, "%s; limit: raw hiredis pipeline, depth %d best of 4/16/32 (%.2f/%.2f/%.2f GB/s)",
               local ? "local redis-server started by the bench" : (st.cluster ? "cluster" : "one server"),
               depths[best], med[base], med[base + 1], med[base + 2]);
      snprintf(name, sizeof name, "remote %s 2 MiB records (x%u)", put ? "put" : "get", n);
      kvt_bench_row(rows, name, "GB/s", med[put ? P_KV_PUT : P_KV_GET], med[base + best], 0.8, note);
    }
  } else {
    fprintf(stderr, "kvtier-bench micro remote: a pass failed against %s\n", local ? "the local server" : url);
  }
  raw_close(&w);
  kvt__remote_remove(r, keys, n);
  kvt__remote_close(r);
  for (uint32_t i = 0; recs && i < n; i++) free(recs[i]);
  free(recs);
  free(keys);
  free(io);
  return rc;
}

static int micro_remote(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  char url[128];
  if (o->remote) return run(o, rows, o->remote, 0);
  if (start_local(url, sizeof url) != 0) {
    stop_local();
    fprintf(stderr, "kvtier-bench micro: the remote rows need --remote URL (no redis-server installed to start)\n");
    return 0;
  }
  int rc = run(o, rows, url, 1);
  stop_local();
  return rc;
}

#else

static int micro_remote(const kvt_bench_micro_opts *o, kvt_bench_rows *rows) {
  fprintf(stderr, "kvtier-bench micro: no remote rows: kvtier was built without hiredis\n");
  return 0;
}

#endif

KVT_BENCH_MICRO(remote, micro_remote)
