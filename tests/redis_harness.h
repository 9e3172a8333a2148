/* Real Redis servers for the remote tier's tests: a standalone server or a
 * cluster (masters + replicas made by redis-cli --cluster create), on
 * 127.0.0.1 with ephemeral ports, in the test's temporary directory. Every
 * server started is killed at exit (atexit, and the kernel's parent-death
 * signal if the test itself dies). Tests that cannot have servers (no
 * redis-server, a build without hiredis) exit 77 with the reason. */
#ifndef KVT_TEST_REDIS_HARNESS_H
#define KVT_TEST_REDIS_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KVT_REDIS_MAX_NODES 8

typedef struct kvt_redis_opts {
  const char *requirepass;   /* the default user's password */
  const char *acl_user;      /* an extra ACL user with acl_pass, allowed all keys and commands */
  const char *acl_pass;
  uint64_t maxmemory;        /* bytes; with allkeys-lru */
  uint32_t node_timeout_ms;  /* cluster-node-timeout (0: 1000) */
} kvt_redis_opts;

typedef struct kvt_redis_node {
  pid_t pid;                 /* 0: not running */
  int port, bus_port;
  char dir[512];
} kvt_redis_node;

typedef struct kvt_redis {
  int cluster;
  int n;
  kvt_redis_node node[KVT_REDIS_MAX_NODES];
  kvt_redis_opts opts;
  char server[256];          /* the server binary */
  char url[1024];            /* "redis://127.0.0.1:p1,..." (no credentials) */
} kvt_redis;

/* Exits 77 unless servers can be started: hiredis built in, redis-server and
 * redis-cli found ($KVT_REDIS_SERVER may name valkey-server instead). */
void kvt_redis_require(void);
/* Starts one server and waits until it answers. 0 or -1 (why on stderr). */
int kvt_redis_start(kvt_redis *rs, const kvt_redis_opts *opts);
/* Starts masters + masters*replicas servers, makes them a cluster and waits
 * for cluster_state:ok on every node and every replica in sync. */
int kvt_redis_cluster_start(kvt_redis *rs, int masters, int replicas, const kvt_redis_opts *opts);
/* Kills every node and removes their files. */
void kvt_redis_stop(kvt_redis *rs);
/* Sends sig to node i (SIGKILL also waits for it and marks it stopped). */
void kvt_redis_signal(kvt_redis *rs, int i, int sig);
/* Starts node i again (same port, same files) and waits until it answers. */
int kvt_redis_restart(kvt_redis *rs, int i);
/* One command to node i, printf-like as hiredis's redisCommand (%s, %b with
 * pointer and length, %d...). The reply as text in out: a string or status
 * as it is, an integer in decimal, nil as "(nil)", an array's elements one a
 * line. Returns 0, or -1 for an error reply (its text in out) or no reply. */
int kvt_redis_cmd(kvt_redis *rs, int i, char *out, size_t cap, const char *fmt, ...);
/* Index of the node on port, or -1. */
int kvt_redis_node_of_port(const kvt_redis *rs, int port);
/* The cluster's master for slot, asked of node i: its index, or -1. */
int kvt_redis_slot_master(kvt_redis *rs, int i, int slot);
/* Waits until every live node says cluster_state:ok (up to timeout_ms). */
int kvt_redis_wait_cluster_ok(kvt_redis *rs, int timeout_ms);

#endif
