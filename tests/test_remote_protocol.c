/* Nothing read from the network is trusted, the protocol included: against
 * a fake server answering every GET with a scripted reply (an array, a bad
 * length, a bulk string of the wrong size, a length the server never
 * sends, a line without end, redirects that go round in circles), each get
 * completes with a miss or a failure, never a hit and never a crash. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "remote_fixture.h"

static int listen_fd, fake_port;
static pthread_mutex_t script_mu = PTHREAD_MUTEX_INITIALIZER; /* guards script */
static char script[200 * 1024];
static size_t script_len;
static atomic_int gets_seen;

/* Answers CLUSTER SLOTS with "no cluster", ASKING with +OK and every GET
 * with the script, until the client closes. */
static void *serve(void *arg) {
  int fd = (int)(intptr_t)arg;
  char buf[4096], acc[8192];
  size_t n = 0;
  for (;;) {
    ssize_t got = read(fd, buf, sizeof buf);
    if (got <= 0) break;
    if (n + (size_t)got > sizeof acc) n = 0; /* the fake keeps only what it needs to match */
    memcpy(acc + n, buf, (size_t)got);
    n += (size_t)got;
    for (;;) {
      /* the earliest command in what has come: GET, ASKING or CLUSTER */
      static const char *const tok[3] = {"\r\nGET\r\n", "\r\nASKING\r\n", "CLUSTER"};
      static const char *const ans[3] = {NULL, "+OK\r\n", "-ERR This instance has cluster support disabled\r\n"};
      char *first = NULL;
      const char *reply = NULL;
      size_t rlen = 0, skip = 0;
      for (int t = 0; t < 3; t++) {
        char *at = memmem(acc, n, tok[t], strlen(tok[t]));
        if (at && (!first || at < first)) {
          first = at;
          reply = ans[t] ? ans[t] : script;
          rlen = ans[t] ? strlen(ans[t]) : 0; /* the script's: below, under its lock */
          skip = strlen(tok[t]);
        }
      }
      if (!first) break;
      char *copy = NULL;
      if (reply == script) { /* a snapshot: the test changes it for the next client */
        atomic_fetch_add(&gets_seen, 1);
        pthread_mutex_lock(&script_mu);
        rlen = script_len;
        copy = malloc(rlen);
        if (copy) memcpy(copy, script, rlen);
        pthread_mutex_unlock(&script_mu);
        if (!copy) goto out;
        reply = copy;
      }
      ssize_t sent = send(fd, reply, rlen, MSG_NOSIGNAL);
      free(copy);
      if (sent < 0) goto out;
      size_t used = (size_t)(first - acc) + skip;
      memmove(acc, acc + used, n - used);
      n -= used;
    }
  }
out:
  close(fd);
  return NULL;
}

static void *accept_loop(void *arg) {
  for (;;) {
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    pthread_t th;
    if (pthread_create(&th, NULL, serve, (void *)(intptr_t)fd) == 0)
      pthread_detach(th);
    else
      close(fd);
  }
}

static int start_fake(void **state) {
  listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(listen_fd, 64) != 0 ||
      getsockname(listen_fd, (struct sockaddr *)&a, &len) != 0)
    return -1;
  fake_port = ntohs(a.sin_port);
  pthread_t th;
  if (pthread_create(&th, NULL, accept_loop, NULL) != 0) return -1;
  pthread_detach(th);
  return 0;
}

/* One get against the fake answering with reply: its status. */
static int get_with(const char *reply, size_t len) {
  pthread_mutex_lock(&script_mu);
  memcpy(script, reply, len);
  script_len = len;
  pthread_mutex_unlock(&script_mu);
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fake_port);
  rf_geom g = rf_geometry(16, 4096);
  kvt__remote_cfg cfg = rf_cfg(url, (kvt_key){5, 5}, &g);
  cfg.conns_per_node = 1;
  cfg.timeout_ms = 300;
  kvt__remote *r = rf_open(&cfg);
  void *rec = rf_alloc(g.rec);
  kvt_key k = rf_key(1);
  rf_get(r, &rec, &k, 1);
  int st = rf_w.status[0];
  kvt__remote_stats s;
  kvt__remote_get_stats(r, &s);
  assert_int_equal(s.get_hits, 0);
  free(rec);
  kvt__remote_close(r);
  return st;
}

#define GET_WITH(lit) get_with(lit, sizeof lit - 1)

static void replies_that_are_not_a_record(void **state) {
  int before = atomic_load(&gets_seen);
  assert_int_equal(GET_WITH("$-1\r\n"), KVT_EMISS);
  assert_int_equal(GET_WITH("_\r\n"), KVT_EMISS);
  assert_int_equal(GET_WITH("$5\r\nhello\r\n"), KVT_ECORRUPT);
  assert_int_equal(GET_WITH("$0\r\n\r\n"), KVT_ECORRUPT);
  assert_int_equal(GET_WITH("*1\r\n$1\r\nx\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH("$-5\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH("$12x\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH("+OK\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH(":1\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH("-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH("$5\r\nhelloXY"), KVT_EREMOTE); /* no CRLF after the bulk */
  assert_int_equal(GET_WITH("?what\r\n"), KVT_EREMOTE);
  /* a length it never sends: the round trip's deadline ends it */
  assert_int_equal(GET_WITH("$99999999999\r\nabc"), KVT_ETIMEDOUT);
  assert_int_equal(GET_WITH("$8\r\nabc"), KVT_ETIMEDOUT);
  assert_true(atomic_load(&gets_seen) - before >= 14);
}

static void a_line_without_end(void **state) {
  size_t n = 100 * 1024;
  char *line = malloc(n);
  assert_non_null(line);
  line[0] = '-';
  memset(line + 1, 'x', n - 1);
  assert_int_equal(get_with(line, n), KVT_EREMOTE); /* longer than the input buffer */
  free(line);
}

/* MOVED and ASK that point back at the same server forever: given up after
 * 5 redirections; a MOVED to a port nobody listens on fails. */
static void redirects_in_circles(void **state) {
  char reply[128];
  int n = snprintf(reply, sizeof reply, "-MOVED 1 127.0.0.1:%d\r\n", fake_port);
  assert_int_equal(get_with(reply, (size_t)n), KVT_EREMOTE);
  n = snprintf(reply, sizeof reply, "-ASK 1 :%d\r\n", fake_port);
  assert_int_equal(get_with(reply, (size_t)n), KVT_EREMOTE);
  assert_int_equal(GET_WITH("-MOVED 1 127.0.0.1:1\r\n"), KVT_EREMOTE);
  assert_int_equal(GET_WITH("-MOVED nonsense\r\n"), KVT_EREMOTE);
}

int main(void) {
#ifndef KVT_HAVE_HIREDIS
  kvt_test_skip("kvtier was built without hiredis: no remote tier to test");
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(replies_that_are_not_a_record),
      cmocka_unit_test(a_line_without_end),
      cmocka_unit_test(redirects_in_circles),
  };
  return cmocka_run_group_tests(tests, start_fake, NULL);
}
