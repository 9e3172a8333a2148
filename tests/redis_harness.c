#include "redis_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#ifdef KVT_HAVE_HIREDIS
#include <hiredis/hiredis.h>

/* Every server this process started, for the exit handler. */
static pid_t live[64];
static int exit_handler_set;

static void forget(pid_t pid) {
  for (int i = 0; i < 64; i++)
    if (live[i] == pid) live[i] = 0;
}

static void remember(pid_t pid) {
  for (int i = 0; i < 64; i++)
    if (!live[i]) {
      live[i] = pid;
      return;
    }
}

/* Each server leads its own process group (with the children it forks for
 * replication): the group gets the signal. */
static void kill_group(pid_t pid) {
  kill(-pid, SIGCONT);
  kill(-pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static void kill_all(void) {
  for (int i = 0; i < 64; i++)
    if (live[i] > 0) {
      kill_group(live[i]);
      live[i] = 0;
    }
}

static char *which(const char *name, char *buf, size_t cap) {
  const char *path = getenv("PATH");
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s:/usr/bin:/usr/sbin:/usr/local/bin", path ? path : "");
  for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    snprintf(buf, cap, "%s/%s", d, name);
    if (access(buf, X_OK) == 0) return buf;
  }
  return NULL;
}

static char server_bin[256], cli_bin[256];

void kvt_redis_require(void) {
  const char *srv = getenv("KVT_REDIS_SERVER");
  if (srv && *srv) {
    if (access(srv, X_OK) != 0 && !which(srv, server_bin, sizeof server_bin))
      kvt_test_skip("KVT_REDIS_SERVER=%s is not an executable", srv);
    if (access(srv, X_OK) == 0) snprintf(server_bin, sizeof server_bin, "%s", srv);
  } else if (!which("redis-server", server_bin, sizeof server_bin)) {
    kvt_test_skip("redis-server is not installed (scripts/deps.sh --test installs it)");
  }
  if (!which("redis-cli", cli_bin, sizeof cli_bin) && !which("valkey-cli", cli_bin, sizeof cli_bin))
    kvt_test_skip("redis-cli is not installed (scripts/deps.sh --test installs redis-tools)");
}

static int free_port(void) {
  for (int tries = 0; tries < 100; tries++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
      port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    if (port > 0) return port;
  }
  return -1;
}

static int write_conf(kvt_redis *rs, kvt_redis_node *nd) {
  char path[600];
  snprintf(path, sizeof path, "%s/redis.conf", nd->dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const kvt_redis_opts *o = &rs->opts;
  fprintf(f, "bind 127.0.0.1\nport %d\nprotected-mode no\ndaemonize no\nsave \"\"\nappendonly no\n", nd->port);
  fprintf(f, "dir %s\nlogfile %s/redis.log\nrepl-diskless-sync yes\nrepl-diskless-sync-delay 0\n", nd->dir, nd->dir);
  if (o->requirepass) fprintf(f, "requirepass %s\nmasterauth %s\n", o->requirepass, o->requirepass);
  if (o->acl_user) fprintf(f, "user %s on >%s ~* &* +@all\n", o->acl_user, o->acl_pass ? o->acl_pass : "");
  if (o->maxmemory) fprintf(f, "maxmemory %llu\nmaxmemory-policy allkeys-lru\n", (unsigned long long)o->maxmemory);
  if (rs->cluster)
    fprintf(f, "cluster-enabled yes\ncluster-config-file %s/nodes.conf\ncluster-node-timeout %u\ncluster-port %d\n",
            nd->dir, o->node_timeout_ms ? o->node_timeout_ms : 1000, nd->bus_port);
  fclose(f);
  return 0;
}

static pid_t spawn(char *const argv[], const char *log) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that died */
    if (getppid() != parent) _exit(127);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(argv[0], argv);
    _exit(127);
  }
  if (pid > 0) setpgid(pid, pid);
  return pid;
}

static redisContext *connect_node(kvt_redis *rs, int i, int timeout_ms) {
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", rs->node[i].port, tv);
  if (!c || c->err) {
    if (c) redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  if (rs->opts.requirepass) {
    redisReply *r = redisCommand(c, "AUTH %s", rs->opts.requirepass);
    if (r) freeReplyObject(r);
  }
  return c;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static void log_tail(const kvt_redis_node *nd) {
  char path[600], line[512];
  snprintf(path, sizeof path, "%s/redis.log", nd->dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  fprintf(stderr, "--- %s (last lines)\n", path);
  long size = (fseek(f, 0, SEEK_END), ftell(f));
  fseek(f, size > 2000 ? size - 2000 : 0, SEEK_SET);
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fclose(f);
}

/* Waits until node i answers (PONG, or NOAUTH: it is up). */
static int wait_up(kvt_redis *rs, int i) {
  for (int t = 0; t < 500; t++) {
    int status;
    if (waitpid(rs->node[i].pid, &status, WNOHANG) == rs->node[i].pid) {
      forget(rs->node[i].pid);
      rs->node[i].pid = 0;
      fprintf(stderr, "redis harness: the server on port %d exited\n", rs->node[i].port);
      log_tail(&rs->node[i]);
      return -1;
    }
    redisContext *c = connect_node(rs, i, 200);
    redisReply *r = c ? redisCommand(c, "PING") : NULL;
    int ok = r && (r->type == REDIS_REPLY_STATUS || (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOAUTH", 6)));
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    if (ok) return 0;
    sleep_ms(20);
  }
  fprintf(stderr, "redis harness: the server on port %d does not answer\n", rs->node[i].port);
  log_tail(&rs->node[i]);
  return -1;
}

static int start_node(kvt_redis *rs, int i) {
  kvt_redis_node *nd = &rs->node[i];
  char conf[600], log[600];
  snprintf(conf, sizeof conf, "%s/redis.conf", nd->dir);
  snprintf(log, sizeof log, "%s/stdout.log", nd->dir);
  char *argv[] = {rs->server, conf, NULL};
  nd->pid = spawn(argv, log);
  if (nd->pid < 0) return -1;
  remember(nd->pid);
  return wait_up(rs, i);
}

static int setup(kvt_redis *rs, int n, int cluster, const kvt_redis_opts *opts) {
  kvt_redis_require();
  memset(rs, 0, sizeof *rs);
  if (opts) rs->opts = *opts;
  rs->cluster = cluster;
  rs->n = n;
  snprintf(rs->server, sizeof rs->server, "%s", server_bin);
  const char *tmp = kvt_test_tmpdir(); /* before our exit handler: it runs after the servers are dead */
  if (!exit_handler_set) {
    atexit(kill_all);
    exit_handler_set = 1;
  }
  /* A port picked free can be taken before the server binds it (another
   * test, an outgoing connection): then new ports, up to 3 times. */
  for (int i = 0; i < n; i++) {
    kvt_redis_node *nd = &rs->node[i];
    int up = 0;
    for (int attempt = 0; attempt < 3 && !up; attempt++) {
      nd->port = free_port();
      nd->bus_port = free_port();
      if (nd->port < 0 || nd->bus_port < 0 || nd->port == nd->bus_port) continue;
      snprintf(nd->dir, sizeof nd->dir, "%s/redis-%d", tmp, nd->port);
      if (mkdir(nd->dir, 0755) != 0 || write_conf(rs, nd) != 0) return -1;
      up = start_node(rs, i) == 0;
      if (!up && nd->pid > 0) { /* up but mute: not this one either */
        kill_group(nd->pid);
        forget(nd->pid);
        nd->pid = 0;
      }
    }
    if (!up) return -1;
  }
  size_t o = (size_t)snprintf(rs->url, sizeof rs->url, "redis://");
  for (int i = 0; i < n && i < 3; i++)
    o += (size_t)snprintf(rs->url + o, sizeof rs->url - o, "%s127.0.0.1:%d", i ? "," : "", rs->node[i].port);
  return 0;
}

int kvt_redis_start(kvt_redis *rs, const kvt_redis_opts *opts) {
  if (setup(rs, 1, 0, opts) != 0) {
    kvt_redis_stop(rs);
    return -1;
  }
  return 0;
}

static int text_has(kvt_redis *rs, int i, const char *cmd, const char *want) {
  char out[8192];
  return kvt_redis_cmd(rs, i, out, sizeof out, cmd) == 0 && strstr(out, want) != NULL;
}

int kvt_redis_wait_cluster_ok(kvt_redis *rs, int timeout_ms) {
  for (int t = 0; t < timeout_ms / 50; t++) {
    int ok = 1;
    for (int i = 0; i < rs->n && ok; i++)
      if (rs->node[i].pid) ok = text_has(rs, i, "CLUSTER INFO", "cluster_state:ok");
    if (ok) return 0;
    sleep_ms(50);
  }
  return -1;
}

int kvt_redis_cluster_start(kvt_redis *rs, int masters, int replicas, const kvt_redis_opts *opts) {
  int n = masters * (1 + replicas);
  if (n > KVT_REDIS_MAX_NODES || setup(rs, n, 1, opts) != 0) goto fail;
  char *argv[32], addrs[KVT_REDIS_MAX_NODES][32], reps[16], log[600];
  int a = 0;
  argv[a++] = cli_bin;
  if (rs->opts.requirepass) {
    argv[a++] = "-a";
    argv[a++] = (char *)rs->opts.requirepass;
    argv[a++] = "--no-auth-warning";
  }
  argv[a++] = "--cluster";
  argv[a++] = "create";
  for (int i = 0; i < n; i++) {
    snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", rs->node[i].port);
    argv[a++] = addrs[i];
  }
  snprintf(reps, sizeof reps, "%d", replicas);
  argv[a++] = "--cluster-replicas";
  argv[a++] = reps;
  argv[a++] = "--cluster-yes";
  argv[a] = NULL;
  snprintf(log, sizeof log, "%s/../cluster-create-%d.log", rs->node[0].dir, rs->node[0].port);
  pid_t pid = spawn(argv, log);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "redis harness: redis-cli --cluster create failed (see %s)\n", log);
    goto fail;
  }
  /* Ready: every node sees the whole cluster and says ok, every replica is in sync. */
  char want[64];
  snprintf(want, sizeof want, "cluster_known_nodes:%d", n);
  for (int t = 0; t < 600; t++) {
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
      char out[8192];
      ok = kvt_redis_cmd(rs, i, out, sizeof out, "CLUSTER INFO") == 0 && strstr(out, "cluster_state:ok") &&
           strstr(out, want);
      if (ok && kvt_redis_cmd(rs, i, out, sizeof out, "INFO replication") == 0 && strstr(out, "role:slave"))
        ok = strstr(out, "master_link_status:up") != NULL;
    }
    if (ok) return 0;
    sleep_ms(50);
  }
  fprintf(stderr, "redis harness: the cluster did not become ready\n");
fail:
  for (int i = 0; i < rs->n; i++)
    if (rs->node[i].pid) log_tail(&rs->node[i]);
  kvt_redis_stop(rs);
  return -1;
}

static int remove_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(p);
  return 0;
}

void kvt_redis_stop(kvt_redis *rs) {
  for (int i = 0; i < rs->n; i++) {
    if (rs->node[i].pid > 0) {
      kill_group(rs->node[i].pid);
      forget(rs->node[i].pid);
      rs->node[i].pid = 0;
    }
    if (rs->node[i].dir[0] && !(getenv("KVT_TEST_KEEP") && getenv("KVT_TEST_KEEP")[0] == '1'))
      nftw(rs->node[i].dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  }
  rs->n = 0;
}

void kvt_redis_signal(kvt_redis *rs, int i, int sig) {
  pid_t pid = rs->node[i].pid;
  if (pid <= 0) return;
  if (sig == SIGKILL) {
    kill_group(pid);
    forget(pid);
    rs->node[i].pid = 0;
  } else {
    kill(-pid, sig);
  }
}

int kvt_redis_restart(kvt_redis *rs, int i) {
  if (rs->node[i].pid) kvt_redis_signal(rs, i, SIGKILL);
  return start_node(rs, i);
}

static size_t render(const redisReply *r, char *out, size_t cap, size_t o) {
  if (o >= cap) return o;
  switch (r->type) {
  case REDIS_REPLY_STRING:
  case REDIS_REPLY_STATUS:
  case REDIS_REPLY_ERROR:
    o += (size_t)snprintf(out + o, cap - o, "%.*s", (int)r->len, r->str);
    break;
  case REDIS_REPLY_INTEGER: o += (size_t)snprintf(out + o, cap - o, "%lld", r->integer); break;
  case REDIS_REPLY_NIL: o += (size_t)snprintf(out + o, cap - o, "(nil)"); break;
  case REDIS_REPLY_ARRAY:
    for (size_t k = 0; k < r->elements && o < cap; k++) {
      if (k) o += (size_t)snprintf(out + o, cap - o, "\n");
      o = render(r->element[k], out, cap, o);
    }
    break;
  }
  return o;
}

int kvt_redis_cmd(kvt_redis *rs, int i, char *out, size_t cap, const char *fmt, ...) {
  if (cap) out[0] = 0;
  redisContext *c = connect_node(rs, i, 2000);
  if (!c) {
    snprintf(out, cap, "no connection");
    return -1;
  }
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  int rc = -1;
  if (r) {
    render(r, out, cap, 0);
    rc = r->type == REDIS_REPLY_ERROR ? -1 : 0;
    freeReplyObject(r);
  } else {
    snprintf(out, cap, "%s", c->errstr);
  }
  redisFree(c);
  return rc;
}

int kvt_redis_node_of_port(const kvt_redis *rs, int port) {
  for (int i = 0; i < rs->n; i++)
    if (rs->node[i].port == port) return i;
  return -1;
}

int kvt_redis_slot_master(kvt_redis *rs, int i, int slot) {
  redisContext *c = connect_node(rs, i, 2000);
  redisReply *r = c ? redisCommand(c, "CLUSTER SLOTS") : NULL;
  int found = -1;
  for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
    redisReply *e = r->element[k];
    if (e->elements >= 3 && slot >= e->element[0]->integer && slot <= e->element[1]->integer)
      found = kvt_redis_node_of_port(rs, (int)e->element[2]->element[1]->integer);
  }
  if (r) freeReplyObject(r);
  if (c) redisFree(c);
  return found;
}

#else /* no hiredis: the client is compiled out, nothing to test against */

void kvt_redis_require(void) { kvt_test_skip("kvtier was built without hiredis: no remote tier to test"); }
int kvt_redis_start(kvt_redis *rs, const kvt_redis_opts *opts) { kvt_redis_require(); return -1; }
int kvt_redis_cluster_start(kvt_redis *rs, int masters, int replicas, const kvt_redis_opts *opts) {
  kvt_redis_require();
  return -1;
}
void kvt_redis_stop(kvt_redis *rs) {}
void kvt_redis_signal(kvt_redis *rs, int i, int sig) {}
int kvt_redis_restart(kvt_redis *rs, int i) { return -1; }
int kvt_redis_cmd(kvt_redis *rs, int i, char *out, size_t cap, const char *fmt, ...) { return -1; }
int kvt_redis_node_of_port(const kvt_redis *rs, int port) { return -1; }
int kvt_redis_slot_master(kvt_redis *rs, int i, int slot) { return -1; }
int kvt_redis_wait_cluster_ok(kvt_redis *rs, int timeout_ms) { return -1; }

#endif
