/* A node's connection threads: each takes a batch off the node's FIFO,
 * writes it as one pipeline and reads the replies in order, all against one
 * deadline (timeout_ms from the start of the round trip). hiredis connects
 * and authenticates; the data path is ours: commands go out in one gathered send
 * straight from the records, and a GET's bulk string is read from the
 * socket straight into the caller's record (hiredis's reader would copy it
 * into its buffer, then into a reply object: two more passes over 2 MiB).
 * The replies of GET, SET, EXISTS, DEL and ASKING are one line or one bulk
 * string; anything else is a protocol error that drops the connection. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "remote/remote_internal.h"
#include "store/disk_store.h"
#include "util/clock.h"
#include "util/log.h"

#define RM_HDR_BYTES 256u /* one command's header: "*3\r\n$3\r\nSET\r\n$len\r\nkey\r\n$len\r\n" */

/* ---- SIGPIPE ----
 * hiredis writes AUTH and CLUSTER SLOTS with write(): to a server that has
 * just closed the connection (maxclients, a restart) that raises SIGPIPE,
 * which by default kills the process. The client's own threads block it for
 * their lifetime; a caller's thread (open) blocks it around the calls and
 * takes back a SIGPIPE they raised. */

void kvt__rm_sigpipe_off(kvt__rm_sigpipe *s) {
  sigset_t pend, pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  sigpending(&pend);
  s->was_pending = sigismember(&pend, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &s->old);
}

void kvt__rm_sigpipe_on(const kvt__rm_sigpipe *s) {
  sigset_t pend, pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  sigpending(&pend);
  if (!s->was_pending && sigismember(&pend, SIGPIPE)) {
    struct timespec zero = {0, 0};
    sigtimedwait(&pipe, NULL, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &s->old, NULL);
}

/* ---- connecting ---- */

static struct timeval ms_tv(uint32_t ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

static int ctx_status(const redisContext *c) {
  return strstr(c->errstr, "timed out") || strstr(c->errstr, "temporarily unavailable") ? KVT_ETIMEDOUT
                                                                                       : KVT_EREMOTE;
}

int kvt__rm_connect(kvt__remote *r, const char *host, int port, redisContext **out, char *err,
                    size_t errlen) {
  return kvt__rm_connect_within(r, host, port, r->timeout_ms, out, err, errlen);
}

int kvt__rm_connect_within(kvt__remote *r, const char *host, int port, uint32_t timeout_ms, redisContext **out,
                           char *err, size_t errlen) {
  *out = NULL;
  redisContext *c = redisConnectWithTimeout(host, port, ms_tv(timeout_ms));
  if (!c) {
    snprintf(err, errlen, "%s:%d: out of memory", host, port);
    return KVT_EREMOTE;
  }
  int rc = 0;
  if (c->err) {
    snprintf(err, errlen, "%s:%d: %s", host, port, c->errstr);
    rc = ctx_status(c);
  } else if (redisSetTimeout(c, ms_tv(timeout_ms)) != REDIS_OK) {
    snprintf(err, errlen, "%s:%d: %s", host, port, c->errstr);
    rc = KVT_EREMOTE;
  } else if (r->password) {
    const char *argv[3] = {"AUTH", r->user ? r->user : r->password, r->password};
    size_t lens[3] = {4, strlen(argv[1]), strlen(r->password)};
    int argc = r->user ? 3 : 2;
    redisReply *rep = redisCommandArgv(c, argc, argv, lens);
    if (!rep) {
      snprintf(err, errlen, "%s:%d: AUTH: %s", host, port, c->errstr);
      rc = ctx_status(c);
    } else if (rep->type == REDIS_REPLY_ERROR) {
      /* The server's words name no secret ("WRONGPASS invalid username-password pair"). */
      snprintf(err, errlen, "%s:%d: credentials refused: %s", host, port, rep->str);
      rc = KVT_EAUTH;
    }
    if (rep) freeReplyObject(rep);
  }
  if (rc) {
    redisFree(c);
    return rc;
  }
  *out = c;
  return 0;
}

/* Opens cn's connection, connecting within timeout_ms. */
static int conn_open_within(rm_conn *cn, uint32_t timeout_ms) {
  kvt__remote *r = cn->node->r;
  char err[256];
  redisContext *c;
  int rc = kvt__rm_connect_within(r, cn->node->host, cn->node->port, timeout_ms, &c, err, sizeof err);
  if (rc) return rc;
  int fl = fcntl(c->fd, F_GETFL);
  if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    redisFree(c);
    return KVT_EREMOTE;
  }
  c->flags &= ~REDIS_BLOCK;
  cn->in_head = cn->in_tail = 0;
  cn->ctx = c;
  return 0;
}

static int conn_open(rm_conn *cn) { return conn_open_within(cn, cn->node->r->timeout_ms); }

static void conn_drop(rm_conn *cn) {
  if (cn->ctx) redisFree(cn->ctx);
  cn->ctx = NULL;
}

/* ---- node health ---- */

int kvt__rm_node_usable(rm_node *n, int64_t now) {
  pthread_mutex_lock(&n->mu);
  int ok = !n->degraded || now >= n->retry_at_ns;
  pthread_mutex_unlock(&n->mu);
  return ok;
}

/* 1 if this batch may go: the node is healthy, or its backoff is over and
 * this batch is the one probe (others fail at once until it ends). *gen
 * receives the node's failures so far. */
static int node_admit(rm_node *n, int64_t now, uint64_t *gen) {
  pthread_mutex_lock(&n->mu);
  int ok = !n->degraded;
  if (!ok && now >= n->retry_at_ns) {
    n->retry_at_ns = now + (int64_t)n->r->timeout_ms * 1000000;
    ok = 1;
  }
  *gen = n->gen;
  pthread_mutex_unlock(&n->mu);
  return ok;
}

static void node_ok(rm_node *n) {
  pthread_mutex_lock(&n->mu);
  int was = n->degraded;
  n->degraded = 0;
  n->backoff_ms = 0;
  pthread_mutex_unlock(&n->mu);
  if (was) {
    RM_ADD(n->r, recoveries, 1);
    kvt__log(KVT_LOG_INFO, "remote tier: %s:%d answers again", n->host, n->port);
  }
}

static void node_failed(rm_node *n, int status, const char *why) {
  kvt__remote *r = n->r;
  pthread_mutex_lock(&n->mu);
  int was = n->degraded;
  uint32_t b = was ? n->backoff_ms * 2 : r->backoff_min_ms;
  if (b > r->backoff_max_ms) b = r->backoff_max_ms;
  if (b < r->backoff_min_ms) b = r->backoff_min_ms;
  n->backoff_ms = b;
  n->degraded = 1;
  n->gen++;
  n->retry_at_ns = kvt__now_ns() + (int64_t)b * 1000000;
  pthread_mutex_unlock(&n->mu);
  if (!was)
    kvt__log(KVT_LOG_WARN, "remote tier: %s:%d %s (%s): its blocks are misses, retried in %u ms", n->host,
             n->port, status == KVT_ETIMEDOUT ? "timed out" : "failed", why, b);
  kvt__rm_want_refresh(r);
}

/* ---- one round trip ---- */

/* Waits for events on fd until the deadline: the revents, or 0 at the deadline. */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - kvt__now_ns();
    if (left <= 0) return 0;
    struct pollfd p = {fd, events, 0};
    int rc = poll(&p, 1, (int)((left + 999999) / 1000000));
    if (rc > 0) return p.revents;
    if (rc < 0 && errno != EINTR) return POLLERR;
  }
}

/* Reads what the socket has into the input buffer: 1 read something, 0
 * nothing yet (or no room), or a negative status (closed, error). */
static int read_some(rm_conn *cn) {
  if (cn->in_head == cn->in_tail) cn->in_head = cn->in_tail = 0;
  if (cn->in_tail == RM_IN_BYTES && cn->in_head > 0) {
    memmove(cn->in, cn->in + cn->in_head, cn->in_tail - cn->in_head);
    cn->in_tail -= cn->in_head;
    cn->in_head = 0;
  }
  if (cn->in_tail == RM_IN_BYTES) return 0;
  ssize_t got = read(cn->ctx->fd, cn->in + cn->in_tail, RM_IN_BYTES - cn->in_tail);
  if (got > 0) {
    cn->in_tail += (size_t)got;
    RM_ADD(cn->node->r, bytes_read, (uint64_t)got);
    return 1;
  }
  if (got == 0) return KVT_EREMOTE;
  return errno == EAGAIN || errno == EINTR ? 0 : KVT_EREMOTE;
}

/* At least one more byte in the input buffer, or a negative status. */
static int fill(rm_conn *cn, int64_t deadline) {
  for (;;) {
    int rc = read_some(cn);
    if (rc) return rc;
    if (cn->in_tail == RM_IN_BYTES && cn->in_head == 0) return KVT_EREMOTE; /* a line longer than the buffer */
    if (wait_fd(cn->ctx->fd, POLLIN, deadline) == 0) return KVT_ETIMEDOUT;
  }
}

static int write_all(rm_conn *cn, struct iovec *iov, int niov, int64_t deadline) {
  int fd = cn->ctx->fd;
  while (niov > 0) {
    /* sendmsg, not writev: MSG_NOSIGNAL, a server gone is no SIGPIPE for the engine */
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(niov < IOV_MAX ? niov : IOV_MAX)};
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w > 0) {
      RM_ADD(cn->node->r, bytes_written, (uint64_t)w);
      while (niov > 0 && (size_t)w >= iov->iov_len) {
        w -= (ssize_t)iov->iov_len;
        iov++;
        niov--;
      }
      if (niov > 0) {
        iov->iov_base = (char *)iov->iov_base + w;
        iov->iov_len -= (size_t)w;
      }
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN) return KVT_EREMOTE;
    /* Replies may come meanwhile: take them in while there is room (the
     * server buffers the rest). */
    short want = POLLOUT | (cn->in_tail < RM_IN_BYTES || cn->in_head > 0 ? POLLIN : 0);
    int ev = wait_fd(fd, want, deadline);
    if (ev == 0) return KVT_ETIMEDOUT;
    if (ev & POLLIN) {
      int rc = read_some(cn);
      if (rc < 0) return rc;
    }
  }
  return 0;
}

/* One reply line (without CRLF, cut to cap - 1 bytes) into out. */
static int read_line(rm_conn *cn, char *out, size_t cap, int64_t deadline) {
  for (;;) {
    char *start = cn->in + cn->in_head;
    size_t avail = cn->in_tail - cn->in_head;
    char *nl = avail >= 2 ? memmem(start, avail, "\r\n", 2) : NULL;
    if (nl) {
      size_t len = (size_t)(nl - start);
      size_t keep = len < cap - 1 ? len : cap - 1;
      memcpy(out, start, keep);
      out[keep] = 0;
      cn->in_head += len + 2;
      return 0;
    }
    int rc = fill(cn, deadline);
    if (rc < 0) return rc;
  }
}

/* len bytes of a bulk string into dst (NULL: dropped), then its CRLF. What
 * the input buffer holds is copied; the rest is read from the socket
 * straight into dst. */
static int read_bulk(rm_conn *cn, char *dst, size_t len, int64_t deadline) {
  size_t off = 0;
  while (off < len) {
    size_t avail = cn->in_tail - cn->in_head, take = len - off < avail ? len - off : avail;
    if (take) {
      if (dst) memcpy(dst + off, cn->in + cn->in_head, take);
      cn->in_head += take;
      off += take;
      continue;
    }
    if (!dst || len - off < RM_IN_BYTES / 4) { /* small or dropped: through the buffer */
      int rc = fill(cn, deadline);
      if (rc < 0) return rc;
      continue;
    }
    ssize_t got = read(cn->ctx->fd, dst + off, len - off);
    if (got > 0) {
      off += (size_t)got;
      RM_ADD(cn->node->r, bytes_read, (uint64_t)got);
    } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
      return KVT_EREMOTE;
    } else if (errno == EAGAIN && wait_fd(cn->ctx->fd, POLLIN, deadline) == 0) {
      return KVT_ETIMEDOUT;
    }
  }
  while (cn->in_tail - cn->in_head < 2) {
    int rc = fill(cn, deadline);
    if (rc < 0) return rc;
  }
  if (memcmp(cn->in + cn->in_head, "\r\n", 2) != 0) return KVT_EREMOTE;
  cn->in_head += 2;
  return 0;
}

/* The next reply; a GET's bulk string of record size lands in its record.
 * 0, or the status of a failed connection or a protocol error. */
static int next_reply(rm_conn *cn, rm_op *get, int64_t deadline, rm_reply *rep) {
  int rc = read_line(cn, rep->line, sizeof rep->line, deadline);
  if (rc) return rc;
  rep->type = rep->line[0];
  char *end;
  switch (rep->type) {
  case '+':
  case '-': return 0;
  case '_': rep->type = '_'; return 0; /* RESP3 null */
  case ':':
    rep->integer = strtoll(rep->line + 1, &end, 10);
    return *end ? KVT_EREMOTE : 0;
  case '$': {
    long long len = strtoll(rep->line + 1, &end, 10);
    if (*end || len < -1) return KVT_EREMOTE;
    if (len == -1) {
      rep->type = '_';
      return 0;
    }
    rep->bulk_len = (size_t)len;
    int into = get && rep->bulk_len == cn->node->r->rec_bytes;
    return read_bulk(cn, into ? get->rec : NULL, rep->bulk_len, deadline);
  }
  default: return KVT_EREMOTE; /* arrays, RESP3 types: not a reply these commands get */
  }
}

static size_t put_header(char *h, const char *fmt_head, const char *key, size_t klen) {
  return (size_t)snprintf(h, RM_HDR_BYTES, "%s$%zu\r\n%s\r\n", fmt_head, klen, key);
}

/* The commands of ops[0..n) as iovecs (4 at most per op). */
static int build_iov(rm_conn *cn, rm_op **ops, uint32_t n) {
  static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
  static const char crlf[] = "\r\n";
  kvt__remote *r = cn->node->r;
  int niov = 0;
  for (uint32_t i = 0; i < n; i++) {
    rm_op *op = ops[i];
    char *h = cn->hdrs + (size_t)i * RM_HDR_BYTES;
    char key[RM_KEY_MAX];
    size_t klen = kvt__rm_key(r, &op->key, key), hl = 0;
    if (op->asking) cn->iov[niov++] = (struct iovec){(void *)asking, sizeof asking - 1};
    switch (op->kind) {
    case RM_GET: hl = put_header(h, "*2\r\n$3\r\nGET\r\n", key, klen); break;
    case RM_EXISTS: hl = put_header(h, "*2\r\n$6\r\nEXISTS\r\n", key, klen); break;
    case RM_DEL: hl = put_header(h, "*2\r\n$3\r\nDEL\r\n", key, klen); break;
    case RM_PUT:
      hl = put_header(h, "*3\r\n$3\r\nSET\r\n", key, klen);
      hl += (size_t)snprintf(h + hl, RM_HDR_BYTES - hl, "$%zu\r\n", r->rec_bytes);
      break;
    }
    cn->iov[niov++] = (struct iovec){h, hl};
    if (op->kind == RM_PUT) {
      cn->iov[niov++] = (struct iovec){op->rec, r->rec_bytes};
      cn->iov[niov++] = (struct iovec){(void *)crlf, 2};
    }
  }
  return niov;
}

/* A get's status from the bytes the reader put in its record. */
static int check_get(kvt__remote *r, rm_op *op, size_t bulk_len) {
  if (bulk_len != r->rec_bytes) return KVT_ECORRUPT;
  int rc = kvt__record_check(op->rec, r->rec_bytes, &r->ns, r->block_tokens, r->payload_bytes, &op->key, 1,
                             NULL);
  return rc == KVT_EMISS ? KVT_ECORRUPT : rc; /* zeros under our key: garbage */
}

/* Follows MOVED / ASK: 1 if the op went on to another node. */
static int redirect(rm_conn *cn, rm_op *op, const char *msg, int ask) {
  kvt__remote *r = cn->node->r;
  const char *sp = strchr(msg, ' ');
  const char *addr = sp ? strchr(sp + 1, ' ') : NULL;
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  if (!colon) return 0;
  char host[RM_HOST_MAX];
  size_t hl = (size_t)(colon - addr - 1);
  if (hl >= sizeof host) return 0;
  memcpy(host, addr + 1, hl);
  host[hl] = 0;
  if (!hl) snprintf(host, sizeof host, "%s", cn->node->host);
  int port = atoi(colon + 1);
  if (port <= 0 || port > 65535 || ++op->redirects > RM_MAX_REDIRECTS) return 0;
  rm_node *t = kvt__rm_node_get(r, host, port);
  if (!t) return 0;
  if (ask) {
    RM_ADD(r, ask, 1);
    op->asking = 1;
  } else {
    RM_ADD(r, moved, 1);
    op->asking = 0;
    atomic_store(&t->in_map, 1);
    atomic_store_explicit(&r->slots[op->slot], (uint16_t)(t->index + 1), memory_order_relaxed);
    kvt__rm_want_refresh(r);
  }
  if (!kvt__rm_node_usable(t, kvt__now_ns())) return 0;
  op->next = NULL;
  kvt__rm_node_push(t, op, op);
  return 1;
}

static int error_status(rm_conn *cn, rm_op *op, const char *msg) {
  if (strncmp(msg, "MOVED ", 6) == 0 || strncmp(msg, "ASK ", 4) == 0)
    return redirect(cn, op, msg, msg[1] == 'S') ? 1 : KVT_EREMOTE;
  if (strncmp(msg, "OOM", 3) == 0) return KVT_ENOSPACE;
  if (strncmp(msg, "LOADING", 7) == 0 || strncmp(msg, "CLUSTERDOWN", 11) == 0 ||
      strncmp(msg, "TRYAGAIN", 8) == 0 || strncmp(msg, "MASTERDOWN", 10) == 0)
    node_failed(cn->node, KVT_EREMOTE, msg);
  return KVT_EREMOTE;
}

/* Completes op from its reply (or passes it on to another node). */
static void handle_reply(rm_conn *cn, rm_op *op, rm_reply *rep, int asking_ok) {
  kvt__remote *r = cn->node->r;
  int st = KVT_EREMOTE;
  switch (rep->type) {
  case '-':
    st = error_status(cn, op, rep->line + 1);
    if (st == 1) return;
    break;
  case '_': st = op->kind == RM_GET ? KVT_EMISS : op->kind == RM_EXISTS ? 0 : KVT_EREMOTE; break;
  case '$':
    if (op->kind == RM_GET) st = check_get(r, op, rep->bulk_len);
    break;
  case '+':
    if (op->kind == RM_PUT) st = strcmp(rep->line, "+OK") == 0 ? 0 : KVT_EREMOTE;
    break;
  case ':':
    if (op->kind == RM_EXISTS || op->kind == RM_DEL) st = rep->integer > 0;
    break;
  }
  if (!asking_ok && st >= 0) st = KVT_EREMOTE;
  kvt__rm_complete(r, op, st);
}

/* Writes ops as one pipeline and completes each from its reply; the node
 * counts as healthy from its first reply on. Returns 0, or the status of a
 * failed connection with *answered the ops completed before it failed. */
static int round_trip(rm_conn *cn, rm_op **ops, uint32_t n, int64_t start, uint32_t *answered) {
  kvt__remote *r = cn->node->r;
  int64_t deadline = start + (int64_t)r->timeout_ms * 1000000;
  for (uint32_t i = 0; i < n; i++)
    if (ops[i]->kind == RM_PUT)
      kvt__record_seal(ops[i]->rec, &r->ns, r->block_tokens, r->payload_bytes,
                       atomic_fetch_add_explicit(&r->seq, 1, memory_order_relaxed));
  int niov = build_iov(cn, ops, n);
  int rc = write_all(cn, cn->iov, niov, deadline);
  uint32_t i = 0;
  for (; rc == 0 && i < n; i++) {
    rm_op *op = ops[i];
    int asking_ok = 1;
    rm_reply rep;
    if (op->asking) {
      if ((rc = next_reply(cn, NULL, deadline, &rep))) break;
      asking_ok = rep.type == '+';
      op->asking = 0;
    }
    if ((rc = next_reply(cn, op->kind == RM_GET ? op : NULL, deadline, &rep))) break;
    if (i == 0) node_ok(cn->node);
    if (i == n - 1) { /* the round trip is over: counted before its last op completes (its done() may read stats) */
      RM_ADD(r, round_trips, 1);
      RM_ADD(r, round_trip_ns, (uint64_t)(kvt__now_ns() - start));
    }
    handle_reply(cn, op, &rep, asking_ok);
  }
  *answered = i;
  return rc;
}

static void fail_all(kvt__remote *r, rm_op **ops, uint32_t n, int status) {
  for (uint32_t i = 0; i < n; i++) kvt__rm_complete(r, ops[i], status);
}

static void run_batch(rm_conn *cn, rm_op **ops, uint32_t n) {
  rm_node *node = cn->node;
  kvt__remote *r = node->r;
  uint64_t gen;
  if (!node_admit(node, kvt__now_ns(), &gen)) {
    fail_all(r, ops, n, KVT_EREMOTE);
    return;
  }
  /* Opened before the node's latest failure: the server that failed it
   * (restarted, killed our connections) has likely closed this one too. */
  if (cn->ctx && cn->gen != gen) conn_drop(cn);
  int reused = cn->ctx != NULL;
  if (!cn->ctx) {
    int rc = conn_open(cn);
    if (rc) {
      node_failed(node, rc, rc == KVT_ETIMEDOUT ? "connect timed out" : "cannot connect");
      fail_all(r, ops, n, rc);
      return;
    }
    if (cn->connected_once) RM_ADD(r, reconnects, 1);
    cn->connected_once = 1;
    cn->gen = gen;
  }
  uint32_t answered;
  int64_t start = kvt__now_ns();
  int rc = round_trip(cn, ops, n, start, &answered);
  /* A connection the server closed while it sat idle (its idle timeout, a
   * restart, CLIENT KILL) fails on first use before any reply. Every command
   * is idempotent (SET of the same record, GET, EXISTS, DEL), so the batch
   * goes once more through a new connection, within the same deadline,
   * before anything fails. Not after a timeout (the deadline is spent) nor
   * once a reply came (the connection was alive: a real failure). */
  if (rc && rc != KVT_ETIMEDOUT && answered == 0 && reused) {
    conn_drop(cn);
    int64_t left_ms = (start + (int64_t)r->timeout_ms * 1000000 - kvt__now_ns()) / 1000000;
    if (left_ms > 0) {
      int orc = conn_open_within(cn, (uint32_t)left_ms);
      if (orc == 0) {
        RM_ADD(r, reconnects, 1);
        cn->gen = gen;
        rc = round_trip(cn, ops, n, start, &answered);
      } else {
        rc = orc;
      }
    }
  }
  if (rc) {
    conn_drop(cn); /* replies still due would answer the next batch's commands */
    node_failed(node, rc, rc == KVT_ETIMEDOUT ? "no reply within the timeout" : "connection lost");
    fail_all(r, ops + answered, n - answered, rc);
  }
}

static void *conn_main(void *arg) {
  rm_conn *cn = arg;
  rm_node *n = cn->node;
  kvt__remote *r = n->r;
  kvt__rm_sigpipe sp;
  kvt__rm_sigpipe_off(&sp); /* for the thread's life */
  rm_op **batch = cn->batch;
  for (;;) {
    pthread_mutex_lock(&n->mu);
    while (!n->head && !atomic_load(&r->stopping)) pthread_cond_wait(&n->cv, &n->mu);
    if (atomic_load(&r->stopping)) {
      pthread_mutex_unlock(&n->mu);
      break;
    }
    uint32_t k = 0;
    size_t bytes = 0;
    while (n->head && k < r->max_batch) {
      if (bytes >= RM_BATCH_BYTES) break;
      bytes += n->head->kind == RM_GET || n->head->kind == RM_PUT ? r->rec_bytes : 0;
      batch[k++] = n->head;
      n->head = n->head->next;
    }
    if (!n->head) n->tail = NULL;
    if (n->head) pthread_cond_signal(&n->cv); /* more for another connection */
    pthread_mutex_unlock(&n->mu);
    /* Exists ops whose callers stopped waiting while they queued end here. */
    int64_t now = kvt__now_ns();
    uint32_t keep = 0;
    for (uint32_t i = 0; i < k; i++)
      if (kvt__rm_op_expired(batch[i], now))
        kvt__rm_complete(r, batch[i], KVT_ETIMEDOUT);
      else
        batch[keep++] = batch[i];
    if (keep) run_batch(cn, batch, keep);
  }
  conn_drop(cn);
  return NULL;
}

/* ---- the node table ---- */

rm_node *kvt__rm_node_at(kvt__remote *r, uint32_t index) {
  return atomic_load_explicit(&r->nodes[index], memory_order_acquire);
}

void kvt__rm_node_push(rm_node *n, rm_op *head, rm_op *tail) {
  tail->next = NULL;
  pthread_mutex_lock(&n->mu);
  if (n->tail)
    n->tail->next = head;
  else
    n->head = head;
  n->tail = tail;
  pthread_cond_signal(&n->cv);
  pthread_mutex_unlock(&n->mu);
}

static rm_node *node_new(kvt__remote *r, uint32_t index, const char *host, int port) {
  rm_node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->r = r;
  n->index = index;
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  pthread_mutex_init(&n->mu, NULL);
  pthread_cond_init(&n->cv, NULL);
  atomic_init(&n->in_map, 1);
  n->conns = calloc(r->conns_per_node, sizeof *n->conns);
  if (!n->conns) {
    kvt__rm_node_free(n);
    return NULL;
  }
  for (uint32_t i = 0; i < r->conns_per_node; i++) {
    rm_conn *cn = &n->conns[i];
    cn->node = n;
    cn->in = malloc(RM_IN_BYTES);
    cn->hdrs = malloc((size_t)r->max_batch * RM_HDR_BYTES);
    cn->iov = malloc(sizeof *cn->iov * 4 * r->max_batch);
    cn->batch = malloc(sizeof *cn->batch * r->max_batch);
    if (!cn->in || !cn->hdrs || !cn->iov || !cn->batch) break;
    if (pthread_create(&cn->thread, NULL, conn_main, cn) != 0) break;
    cn->started = 1;
    n->nconns++;
  }
  if (n->nconns == 0) {
    kvt__rm_node_free(n);
    return NULL;
  }
  return n;
}

rm_node *kvt__rm_node_get(kvt__remote *r, const char *host, int port) {
  pthread_mutex_lock(&r->nodes_mu);
  uint32_t nn = atomic_load_explicit(&r->nnodes, memory_order_relaxed);
  rm_node *found = NULL;
  for (uint32_t i = 0; i < nn && !found; i++) {
    rm_node *n = kvt__rm_node_at(r, i);
    if (n->port == port && strcmp(n->host, host) == 0) found = n;
  }
  if (!found && nn < RM_MAX_NODES && !atomic_load(&r->stopping)) {
    found = node_new(r, nn, host, port);
    if (found) {
      atomic_store_explicit(&r->nodes[nn], found, memory_order_release);
      atomic_store_explicit(&r->nnodes, nn + 1, memory_order_release);
    }
  }
  pthread_mutex_unlock(&r->nodes_mu);
  return found;
}

void kvt__rm_node_stop(rm_node *n) {
  pthread_mutex_lock(&n->mu);
  pthread_cond_broadcast(&n->cv);
  pthread_mutex_unlock(&n->mu);
  for (uint32_t i = 0; i < n->r->conns_per_node; i++)
    if (n->conns[i].started) {
      pthread_join(n->conns[i].thread, NULL);
      n->conns[i].started = 0;
    }
}

void kvt__rm_node_free(rm_node *n) {
  if (!n) return;
  while (n->head) {
    rm_op *op = n->head;
    n->head = op->next;
    kvt__rm_complete(n->r, op, KVT_EREMOTE);
  }
  if (n->conns)
    for (uint32_t i = 0; i < n->r->conns_per_node; i++) {
      free(n->conns[i].in);
      free(n->conns[i].hdrs);
      free(n->conns[i].iov);
      free(n->conns[i].batch);
    }
  free(n->conns);
  pthread_mutex_destroy(&n->mu);
  pthread_cond_destroy(&n->cv);
  free(n);
}
