/* The remote client's entry points: open (URL, credentials, one server or a
 * cluster), the batched calls that split work per node, completions and
 * stats. node.c moves the bytes; slots.c knows the key space. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote_internal.h"
#include "store/disk_store.h"
#include "util/clock.h"
#include "util/log.h"

#define RM_OPS_PER_CHUNK 256u

/* An exists call and its ops. The caller stops waiting at its deadline;
 * ops still out then finish later, so the wait lives on the heap and the
 * last of the caller and its ops frees it. */
struct rm_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t pending; /* ops not finished */
  int gone;         /* the caller returned: the last op frees this */
  int64_t deadline; /* kvt__now_ns() at which the caller stops waiting */
  uint8_t present[]; /* per key */
};

static void wait_free(rm_wait *w) {
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

int kvt__rm_op_expired(const rm_op *op, int64_t now) {
  return op->kind == RM_EXISTS && op->wait && now >= op->wait->deadline;
}

static void set_detail(const kvt__remote_cfg *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_detail(const kvt__remote_cfg *cfg, const char *fmt, ...) {
  if (!cfg->detail || !cfg->detail_len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cfg->detail, cfg->detail_len, fmt, ap);
  va_end(ap);
}

/* ---- URL: "redis://[user[:password]@]host:port[,host:port...]" ---- */

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* A percent-decoded copy of s[0..len), or NULL (bad escape, NUL, no memory). */
static char *decode(const char *s, size_t len) {
  char *d = malloc(len + 1), *o = d;
  if (!d) return NULL;
  for (size_t i = 0; i < len; i++) {
    int c = (unsigned char)s[i];
    if (c == '%') {
      int a = i + 1 < len ? hexval(s[i + 1]) : -1, b = i + 2 < len ? hexval(s[i + 2]) : -1;
      if (a < 0 || b < 0 || (a == 0 && b == 0)) {
        free(d);
        return NULL;
      }
      c = a * 16 + b;
      i += 2;
    }
    *o++ = (char)c;
  }
  *o = 0;
  return d;
}

static int parse_host(kvt__remote *r, const char *s, size_t len) {
  if (r->nseeds == RM_MAX_SEEDS || len == 0) return -EINVAL;
  const char *host = s, *port = NULL;
  size_t hl;
  if (s[0] == '[') { /* [v6]:port */
    const char *e = memchr(s, ']', len);
    if (!e) return -EINVAL;
    host = s + 1;
    hl = (size_t)(e - host);
    if ((size_t)(e - s) + 1 < len) {
      if (e[1] != ':') return -EINVAL;
      port = e + 2;
    }
  } else {
    const char *c = memchr(s, ':', len);
    hl = c ? (size_t)(c - s) : len;
    if (c) port = c + 1;
  }
  if (hl == 0 || hl >= RM_HOST_MAX) return -EINVAL;
  for (size_t i = 0; i < hl; i++) /* " " or a stray newline is a typo, not a host to retry forever */
    if (isspace((unsigned char)host[i]) || iscntrl((unsigned char)host[i])) return -EINVAL;
  long p = 6379;
  if (port) {
    size_t pl = len - (size_t)(port - s);
    if (pl == 0 || pl > 5) return -EINVAL;
    p = 0;
    for (size_t i = 0; i < pl; i++) {
      if (!isdigit((unsigned char)port[i])) return -EINVAL;
      p = p * 10 + (port[i] - '0');
    }
    if (p <= 0 || p > 65535) return -EINVAL;
  }
  memcpy(r->seeds[r->nseeds], host, hl);
  r->seeds[r->nseeds][hl] = 0;
  r->seed_ports[r->nseeds++] = (int)p;
  return 0;
}

static int parse_url(kvt__remote *r, const char *url) {
  const char *s = url;
  if (strncmp(s, "redis://", 8) == 0)
    s += 8;
  else if (strncmp(s, "valkey://", 9) == 0)
    s += 9;
  else if (strstr(s, "://"))
    return -EINVAL; /* rediss:// (TLS) and others: not supported */
  const char *at = strrchr(s, '@');
  if (at) {
    const char *colon = memchr(s, ':', (size_t)(at - s));
    size_t ul = colon ? (size_t)(colon - s) : (size_t)(at - s);
    if (ul) {
      if (!(r->user = decode(s, ul))) return -EINVAL;
    }
    if (colon) {
      if (!(r->password = decode(colon + 1, (size_t)(at - colon - 1)))) return -EINVAL;
    }
    s = at + 1;
  }
  size_t end = strlen(s);
  if (end && s[end - 1] == '/') end--; /* "host:port/" */
  if (memchr(s, '/', end) || memchr(s, '?', end)) return -EINVAL;
  while (end) {
    const char *comma = memchr(s, ',', end);
    size_t hl = comma ? (size_t)(comma - s) : end;
    if (parse_host(r, s, hl)) return -EINVAL;
    if (!comma) break;
    end -= hl + 1;
    s = comma + 1;
    if (!end) return -EINVAL;
  }
  return r->nseeds ? 0 : -EINVAL;
}

static void mask_url(kvt__remote *r) {
  size_t o = (size_t)snprintf(r->url_masked, sizeof r->url_masked, "redis://%s%s%s", r->user ? r->user : "",
                              r->password ? ":***" : "", r->user || r->password ? "@" : "");
  for (uint32_t i = 0; i < r->nseeds && o < sizeof r->url_masked; i++)
    o += (size_t)snprintf(r->url_masked + o, sizeof r->url_masked - o, "%s%s:%d", i ? "," : "", r->seeds[i],
                          r->seed_ports[i]);
}

/* ---- keys ---- */

static char *hex64(char *o, uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; i--) {
    o[i] = digits[v & 15];
    v >>= 4;
  }
  return o + 16;
}

size_t kvt__rm_key(const kvt__remote *r, const kvt_key *key, char *buf) {
  memcpy(buf, r->key_head, r->key_head_len);
  char *o = hex64(hex64(buf + r->key_head_len, key->hi), key->lo);
  *o = 0;
  return (size_t)(o - buf);
}

size_t kvt__remote_key_string(const kvt__remote *r, const kvt_key *key, char *buf, size_t cap) {
  if (!r || !key || !buf || cap < r->key_head_len + 33) return 0;
  char tmp[RM_KEY_MAX];
  size_t len = kvt__rm_key(r, key, tmp);
  memcpy(buf, tmp, len + 1);
  return len;
}

/* ---- ops ---- */

rm_op *kvt__rm_op_alloc(kvt__remote *r) {
  pthread_mutex_lock(&r->free_mu);
  if (!r->free_ops && r->nchunks < SIZE_MAX / 2) {
    rm_op *chunk = NULL;
    if (r->nchunks == r->cap_chunks) {
      size_t cap = r->cap_chunks ? r->cap_chunks * 2 : 16;
      void **c = realloc(r->chunks, cap * sizeof *c);
      if (c) {
        r->chunks = c;
        r->cap_chunks = cap;
      }
    }
    if (r->nchunks < r->cap_chunks && (chunk = calloc(RM_OPS_PER_CHUNK, sizeof *chunk))) {
      r->chunks[r->nchunks++] = chunk;
      for (uint32_t i = 0; i < RM_OPS_PER_CHUNK; i++) {
        chunk[i].next = r->free_ops;
        r->free_ops = &chunk[i];
      }
    }
  }
  rm_op *op = r->free_ops;
  if (op) r->free_ops = op->next;
  pthread_mutex_unlock(&r->free_mu);
  if (op) memset(op, 0, sizeof *op);
  return op;
}

static void op_free(kvt__remote *r, rm_op *op) {
  pthread_mutex_lock(&r->free_mu);
  op->next = r->free_ops;
  r->free_ops = op;
  pthread_mutex_unlock(&r->free_mu);
}

static void count_failure(kvt__remote *r, int status) {
  if (status == KVT_ETIMEDOUT)
    RM_ADD(r, timeouts, 1);
  else
    RM_ADD(r, errors, 1);
}

void kvt__rm_complete(kvt__remote *r, rm_op *op, int status) {
  int kind = op->kind;
  void *arg = op->arg;
  kvt__remote_done_fn done = op->done;
  rm_wait *w = op->wait;
  uint32_t index = op->index;
  op_free(r, op);
  switch (kind) {
  case RM_GET:
    if (status == 0)
      RM_ADD(r, get_hits, 1);
    else if (status == KVT_EMISS)
      RM_ADD(r, get_misses, 1);
    else if (status == KVT_ECORRUPT)
      RM_ADD(r, get_corrupt, 1);
    else if (status == KVT_EMISMATCH)
      RM_ADD(r, get_foreign, 1);
    else
      count_failure(r, status);
    done(arg, status);
    break;
  case RM_PUT:
    if (status == 0)
      RM_ADD(r, put_ok, 1);
    else if (status == KVT_ENOSPACE)
      RM_ADD(r, put_refused, 1);
    else
      count_failure(r, status);
    done(arg, status);
    break;
  case RM_EXISTS: {
    if (status < 0) count_failure(r, status);
    pthread_mutex_lock(&w->mu);
    if (status >= 0) w->present[index] = status > 0 ? KVT__RM_PRESENT : KVT__RM_ABSENT; /* else no answer */
    int last = --w->pending == 0;
    if (last) pthread_cond_signal(&w->cv);
    int free_it = last && w->gone;
    pthread_mutex_unlock(&w->mu);
    if (free_it) wait_free(w);
    break;
  }
  default:
    if (status < 0) count_failure(r, status);
    break;
  }
}

/* The node that owns key's slot now, or NULL (no owner known, backoff
 * running, closing). usable caches each node's health for one call. */
static rm_node *route(kvt__remote *r, const kvt_key *key, uint16_t *slot, int8_t *usable, int64_t now) {
  char buf[RM_KEY_MAX];
  size_t len = kvt__rm_key(r, key, buf);
  *slot = kvt__remote_hash_slot(buf, len);
  uint16_t idx = atomic_load_explicit(&r->slots[*slot], memory_order_relaxed);
  if (!idx || atomic_load(&r->stopping)) {
    kvt__rm_want_refresh(r);
    return NULL;
  }
  rm_node *n = kvt__rm_node_at(r, idx - 1u);
  if (usable[idx - 1] < 0) {
    usable[idx - 1] = (int8_t)kvt__rm_node_usable(n, now);
    if (!usable[idx - 1]) kvt__rm_want_refresh(r); /* after a failover the slot has another owner */
  }
  return usable[idx - 1] ? n : NULL;
}

typedef struct rm_lists {
  rm_op *head[RM_MAX_NODES], *tail[RM_MAX_NODES];
  int8_t usable[RM_MAX_NODES];
} rm_lists;

static void lists_add(rm_lists *l, rm_node *n, rm_op *op) {
  uint32_t i = n->index;
  op->next = NULL;
  if (l->tail[i])
    l->tail[i]->next = op;
  else
    l->head[i] = op;
  l->tail[i] = op;
}

static void lists_push(kvt__remote *r, rm_lists *l) {
  uint32_t nn = atomic_load_explicit(&r->nnodes, memory_order_acquire);
  for (uint32_t i = 0; i < nn; i++)
    if (l->head[i]) kvt__rm_node_push(kvt__rm_node_at(r, i), l->head[i], l->tail[i]);
}

/* Routes each key; calls fill for the ops it queues. Returns how many. */
static int submit(kvt__remote *r, int kind, const kvt_key *keys, size_t key_stride, uint32_t n,
                  int (*fill)(rm_op *op, uint32_t i, void *ctx), void *ctx, int *status_out, size_t status_stride) {
  rm_lists l;
  memset(&l, 0, sizeof l);
  memset(l.usable, -1, sizeof l.usable);
  int64_t now = kvt__now_ns();
  int queued = 0;
  for (uint32_t i = 0; i < n; i++) {
    const kvt_key *key = (const kvt_key *)((const char *)keys + (size_t)i * key_stride);
    int *st = status_out ? (int *)((char *)status_out + (size_t)i * status_stride) : NULL;
    uint16_t slot;
    rm_node *node = route(r, key, &slot, l.usable, now);
    rm_op *op = node ? kvt__rm_op_alloc(r) : NULL;
    if (!op) {
      int s = node ? -ENOMEM : KVT_EREMOTE;
      if (st) *st = s;
      count_failure(r, s);
      continue;
    }
    op->kind = (uint8_t)kind;
    op->key = *key;
    op->slot = slot;
    fill(op, i, ctx);
    if (st) *st = 0;
    lists_add(&l, node, op);
    queued++;
  }
  lists_push(r, &l);
  return queued;
}

typedef struct io_ctx {
  kvt__remote_io *ios;
  kvt__remote_done_fn done;
} io_ctx;

static int fill_io(rm_op *op, uint32_t i, void *ctx) {
  io_ctx *c = ctx;
  op->rec = c->ios[i].rec;
  op->arg = c->ios[i].arg;
  op->done = c->done;
  return 0;
}

static int submit_io(kvt__remote *r, int kind, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done) {
  if (!r || !done || (n && !ios)) return -EINVAL;
  for (uint32_t i = 0; i < n; i++) {
    if (!ios[i].rec) return -EINVAL;
    if (kind == RM_PUT && kvt__record_seal_check(ios[i].rec, r->block_tokens)) return -EINVAL;
  }
  if (kind == RM_GET)
    RM_ADD(r, gets, n);
  else
    RM_ADD(r, puts, n);
  io_ctx c = {ios, done};
  return submit(r, kind, &ios[0].key, sizeof *ios, n, fill_io, &c, n ? &ios[0].status : NULL, sizeof *ios);
}

int kvt__remote_get(kvt__remote *r, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done) {
  return submit_io(r, RM_GET, ios, n, done);
}

int kvt__remote_put(kvt__remote *r, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done) {
  return submit_io(r, RM_PUT, ios, n, done);
}

static int fill_exists(rm_op *op, uint32_t i, void *ctx) {
  rm_wait *w = ctx;
  op->wait = w;
  op->index = i;
  w->pending++; /* no op is pushed before submit's loop ends */
  return 0;
}

static int fill_none(rm_op *op, uint32_t i, void *ctx) { return 0; }

int kvt__remote_exists(kvt__remote *r, const kvt_key *keys, uint32_t n, uint8_t *present, int stop_at_first_miss) {
  if (!r || (n && (!keys || !present))) return -EINVAL;
  if (n) memset(present, KVT__RM_UNKNOWN, n);
  RM_ADD(r, exists_calls, 1);
  RM_ADD(r, exists_keys, n);
  rm_wait *w = calloc(1, sizeof *w + n);
  if (!w) return -ENOMEM;
  if (n) memset(w->present, KVT__RM_UNKNOWN, n); /* until answered */
  pthread_mutex_init(&w->mu, NULL);
  kvt__cond_init_monotonic(&w->cv);
  /* The whole call, queueing behind other ops included, within one timeout:
   * a key not answered by then stays KVT__RM_UNKNOWN. */
  w->deadline = kvt__now_ns() + (int64_t)r->timeout_ms * 1000000;
  struct timespec until = {(time_t)(w->deadline / 1000000000), (long)(w->deadline % 1000000000)};
  pthread_mutex_lock(&w->mu);
  submit(r, RM_EXISTS, keys, sizeof *keys, n, fill_exists, w, NULL, 0);
  while (w->pending && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT) {
  }
  if (n) memcpy(present, w->present, n);
  w->gone = 1;
  int free_it = w->pending == 0;
  pthread_mutex_unlock(&w->mu);
  if (free_it) wait_free(w);
  int found = 0;
  for (uint32_t i = 0; i < n; i++) found += present[i] == KVT__RM_PRESENT;
  return found;
}

int kvt__remote_remove(kvt__remote *r, const kvt_key *keys, uint32_t n) {
  if (!r || (n && !keys)) return -EINVAL;
  return submit(r, RM_DEL, keys, sizeof *keys, n, fill_none, NULL, NULL, 0);
}

/* ---- stats ---- */

#define RM_LOAD(f) (uint64_t) atomic_load_explicit(&r->st.f, memory_order_relaxed)

void kvt__remote_get_stats(kvt__remote *r, kvt__remote_stats *st) {
  if (!st) return;
  memset(st, 0, sizeof *st);
  if (!r) return;
  st->gets = RM_LOAD(gets);
  st->get_hits = RM_LOAD(get_hits);
  st->get_misses = RM_LOAD(get_misses);
  st->get_corrupt = RM_LOAD(get_corrupt);
  st->get_foreign = RM_LOAD(get_foreign);
  st->puts = RM_LOAD(puts);
  st->put_ok = RM_LOAD(put_ok);
  st->put_refused = RM_LOAD(put_refused);
  st->exists_calls = RM_LOAD(exists_calls);
  st->exists_keys = RM_LOAD(exists_keys);
  st->errors = RM_LOAD(errors);
  st->timeouts = RM_LOAD(timeouts);
  st->moved = RM_LOAD(moved);
  st->ask = RM_LOAD(ask);
  st->refreshes = RM_LOAD(refreshes);
  st->reconnects = RM_LOAD(reconnects);
  st->recoveries = RM_LOAD(recoveries);
  st->bytes_read = RM_LOAD(bytes_read);
  st->bytes_written = RM_LOAD(bytes_written);
  st->round_trips = RM_LOAD(round_trips);
  st->round_trip_ns = RM_LOAD(round_trip_ns);
  st->cluster = r->cluster;
  uint32_t nn = atomic_load_explicit(&r->nnodes, memory_order_acquire);
  for (uint32_t i = 0; i < nn; i++) {
    rm_node *n = kvt__rm_node_at(r, i);
    if (!atomic_load(&n->in_map)) continue;
    st->nodes++;
    pthread_mutex_lock(&n->mu);
    st->nodes_degraded += (uint32_t)n->degraded;
    pthread_mutex_unlock(&n->mu);
  }
}

/* ---- open / close ---- */

/* Connects to the seeds in turn and learns what they are. */
static int discover(kvt__remote *r, const kvt__remote_cfg *cfg) {
  char err[256] = "";
  int last = KVT_EREMOTE;
  for (uint32_t i = 0; i < r->nseeds; i++) {
    const char *host = r->seeds[i];
    int port = r->seed_ports[i];
    redisContext *c;
    int rc = kvt__rm_connect(r, host, port, &c, err, sizeof err);
    if (rc == KVT_EAUTH) {
      set_detail(cfg, "%s", err);
      return rc;
    }
    if (rc) {
      last = rc;
      continue;
    }
    redisReply *rep = redisCommand(c, "CLUSTER SLOTS");
    if (!rep) {
      snprintf(err, sizeof err, "%s:%d: %s", host, port, c->errstr);
      redisFree(c);
      continue;
    }
    rc = 0;
    if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOAUTH", 6) == 0) {
      snprintf(err, sizeof err, "%s:%d: the server wants credentials: %s", host, port, rep->str);
      rc = KVT_EAUTH;
    } else if (rep->type == REDIS_REPLY_ERROR) {
      /* Cluster support disabled: one server. (A user without the right to
       * CLUSTER lands here too; on a cluster its ops then learn the map
       * slot by slot from MOVED.) */
      rm_node *n = kvt__rm_node_get(r, host, port);
      if (!n)
        rc = -ENOMEM;
      else
        for (uint32_t s = 0; s < RM_SLOTS; s++) atomic_store(&r->slots[s], (uint16_t)(n->index + 1));
    } else {
      r->cluster = 1;
      rc = kvt__rm_apply_slots(r, rep, host);
      if (rc == 0 && rep->elements == 0) rc = KVT_EREMOTE;
      if (rc) snprintf(err, sizeof err, "%s:%d: the cluster has no slot map yet", host, port);
    }
    freeReplyObject(rep);
    redisFree(c);
    if (rc) set_detail(cfg, "%s", err);
    return rc;
  }
  set_detail(cfg, "no seed answered (last: %s)", err);
  return last == KVT_ETIMEDOUT ? KVT_EREMOTE : last;
}

static int copy_cfg(kvt__remote *r, const kvt__remote_cfg *cfg) {
  if (!cfg->url || cfg->block_tokens == 0 || cfg->block_tokens > (1u << 20) || cfg->payload_bytes == 0 ||
      cfg->payload_bytes > ((uint64_t)1 << 40))
    return -EINVAL;
  const char *prefix = cfg->key_prefix ? cfg->key_prefix : "kvt:";
  size_t pl = strlen(prefix);
  if (pl > RM_PREFIX_MAX) {
    set_detail(cfg, "remote_key_prefix is %zu bytes (at most %u)", pl, RM_PREFIX_MAX);
    return -EINVAL;
  }
  if (parse_url(r, cfg->url)) {
    set_detail(cfg, "bad remote URL (want redis://[user[:password]@]host:port[,host:port...])");
    return -EINVAL;
  }
  if (cfg->user) {
    free(r->user);
    if (!(r->user = strdup(cfg->user))) return -ENOMEM;
  }
  if (cfg->password) {
    free(r->password);
    if (!(r->password = strdup(cfg->password))) return -ENOMEM;
  }
  memcpy(r->key_head, prefix, pl);
  char *o = hex64(hex64(r->key_head + pl, cfg->ns.hi), cfg->ns.lo);
  *o++ = ':';
  r->key_head_len = (size_t)(o - r->key_head);
  r->ns = cfg->ns;
  r->block_tokens = cfg->block_tokens;
  r->payload_bytes = cfg->payload_bytes;
  r->rec_bytes = kvt__record_bytes(cfg->block_tokens, (size_t)cfg->payload_bytes);
  r->conns_per_node = cfg->conns_per_node ? cfg->conns_per_node : 2;
  r->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 2000;
  r->backoff_min_ms = cfg->backoff_min_ms ? cfg->backoff_min_ms : 100;
  r->backoff_max_ms = cfg->backoff_max_ms ? cfg->backoff_max_ms : 5000;
  r->max_batch = cfg->max_batch ? cfg->max_batch : 64;
  if (r->backoff_max_ms < r->backoff_min_ms || r->conns_per_node > 64 || r->max_batch > 4096) return -EINVAL;
  mask_url(r);
  return 0;
}

int kvt__remote_open(const kvt__remote_cfg *cfg, kvt__remote **out) {
  if (!cfg || !out) return -EINVAL;
  *out = NULL;
  if (cfg->detail && cfg->detail_len) cfg->detail[0] = 0;
  kvt__remote *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  pthread_mutex_init(&r->nodes_mu, NULL);
  pthread_mutex_init(&r->refresh_mu, NULL);
  pthread_cond_init(&r->refresh_cv, NULL);
  pthread_mutex_init(&r->free_mu, NULL);
  int rc = copy_cfg(r, cfg);
  if (!rc) {
    kvt__rm_sigpipe sp;
    kvt__rm_sigpipe_off(&sp);
    rc = discover(r, cfg);
    kvt__rm_sigpipe_on(&sp);
  }
  if (!rc && r->cluster) {
    if (pthread_create(&r->refresh_thread, NULL, kvt__rm_refresh_main, r) == 0)
      r->refresh_started = 1;
    else
      rc = -ENOMEM;
  }
  if (rc) {
    kvt__remote_close(r);
    return rc;
  }
  kvt__remote_stats st;
  kvt__remote_get_stats(r, &st);
  if (r->cluster)
    kvt__log(KVT_LOG_INFO, "remote tier: %s: a cluster of %u masters", r->url_masked, st.nodes);
  else
    kvt__log(KVT_LOG_INFO, "remote tier: %s: one server", r->url_masked);
  *out = r;
  return 0;
}

void kvt__remote_close(kvt__remote *r) {
  if (!r) return;
  /* Under nodes_mu: a redirect that makes a node (kvt__rm_node_get) either
   * did so before, and the node is stopped below, or sees stopping. */
  pthread_mutex_lock(&r->nodes_mu);
  atomic_store(&r->stopping, 1);
  pthread_mutex_unlock(&r->nodes_mu);
  if (r->refresh_started) {
    pthread_mutex_lock(&r->refresh_mu);
    pthread_cond_signal(&r->refresh_cv);
    pthread_mutex_unlock(&r->refresh_mu);
    pthread_join(r->refresh_thread, NULL);
  }
  uint32_t nn = atomic_load(&r->nnodes);
  for (uint32_t i = 0; i < nn; i++) kvt__rm_node_stop(kvt__rm_node_at(r, i));
  for (uint32_t i = 0; i < nn; i++) kvt__rm_node_free(kvt__rm_node_at(r, i));
  for (size_t i = 0; i < r->nchunks; i++) free(r->chunks[i]);
  free(r->chunks);
  if (r->password) {
    memset(r->password, 0, strlen(r->password));
    free(r->password);
  }
  free(r->user);
  pthread_mutex_destroy(&r->nodes_mu);
  pthread_mutex_destroy(&r->refresh_mu);
  pthread_cond_destroy(&r->refresh_cv);
  pthread_mutex_destroy(&r->free_mu);
  free(r);
}
