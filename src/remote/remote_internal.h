/* The remote client's insides: nodes, their connection threads, the slot
 * map and the op free list. remote.h is the contract; this is how it is kept.
 *
 * Shape: every node (one server, or one cluster master) has a FIFO of ops
 * guarded by its mutex and conns_per_node threads, each owning one hiredis
 * connection. A thread takes up to max_batch ops at once, writes them as one
 * pipeline (one gathered send, no copy of the values) and parses the replies in order,
 * a GET's bulk string read from the socket into the caller's record. Redirected ops are
 * pushed onto the target node's FIFO. A refresh thread (cluster only) reloads
 * the slot map when asked to. */
#ifndef KVT_REMOTE_INTERNAL_H
#define KVT_REMOTE_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "remote/remote.h"

#define RM_SLOTS 16384u
#define RM_MAX_NODES 64u   /* masters and redirect targets known at once */
#define RM_MAX_SEEDS 16u
#define RM_MAX_REDIRECTS 5u
#define RM_HOST_MAX 64u
#define RM_PREFIX_MAX 60u  /* keeps a key string under 128 bytes */
#define RM_KEY_MAX 128u
/* A round trip takes no more records once it holds this many bytes of them:
 * deeper pipelines of large records only make the server buffer more (2 MiB
 * records: 4 per round trip measured best, kvtier-bench micro --only remote). */
#define RM_BATCH_BYTES (8u << 20)
#define RM_IN_BYTES (64u * 1024u) /* a connection's input buffer */
#define RM_LINE_MAX 512u          /* reply lines kept (error messages are cut) */

enum { RM_GET, RM_PUT, RM_EXISTS, RM_DEL };

typedef struct rm_wait rm_wait; /* an exists call waiting for its ops */

typedef struct rm_op {
  struct rm_op *next;
  uint8_t kind;
  uint8_t asking;     /* send ASKING first (an ASK redirect) */
  uint8_t redirects;
  uint16_t slot;
  kvt_key key;
  void *rec;          /* get: destination; put: the record image */
  void *arg;
  kvt__remote_done_fn done;
  rm_wait *wait;      /* exists */
  uint32_t index;     /* exists: position in present[] */
} rm_op;

/* One parsed reply: '+' status, '-' error (line holds it), ':' integer,
 * '$' bulk string (bulk_len; a GET's is in its record), '_' nil. */
typedef struct rm_reply {
  char type;
  long long integer;
  size_t bulk_len;
  char line[RM_LINE_MAX];
} rm_reply;

typedef struct rm_node rm_node;

typedef struct rm_conn {
  rm_node *node;
  pthread_t thread;
  int started;         /* the thread runs */
  int connected_once;  /* later connects count as reconnects */
  redisContext *ctx;  /* NULL: not connected; hiredis's reader is not used */
  uint64_t gen;        /* the node's failures when ctx was opened */
  char *in;           /* RM_IN_BYTES of replies read, [in_head, in_tail) unparsed */
  size_t in_head, in_tail;
  char *hdrs;         /* max_batch command headers */
  struct iovec *iov;  /* 4 per op */
  rm_op **batch;      /* max_batch: the round trip's ops */
} rm_conn;

struct rm_node {
  kvt__remote *r;
  uint32_t index;
  char host[RM_HOST_MAX];
  int port;
  pthread_mutex_t mu;   /* guards the FIFO and the health fields */
  pthread_cond_t cv;
  rm_op *head, *tail;
  int degraded;         /* a failure since the last success */
  int64_t retry_at_ns;  /* degraded: ops fail at once before this */
  uint32_t backoff_ms;
  /* Failures so far: a connection opened before the latest one is not
   * trusted (a restart or a kill closes every connection at once). */
  uint64_t gen;
  atomic_int in_map;    /* owns slots in the latest map */
  uint32_t nconns;
  rm_conn *conns;
};

struct kvt__remote {
  /* configuration (read-only after open) */
  char seeds[RM_MAX_SEEDS][RM_HOST_MAX];
  int seed_ports[RM_MAX_SEEDS];
  uint32_t nseeds;
  char *user, *password;
  char key_head[RM_PREFIX_MAX + 40]; /* "<prefix><ns hex>:" */
  size_t key_head_len;
  char url_masked[256];
  kvt_key ns;
  uint32_t block_tokens;
  uint64_t payload_bytes;
  size_t rec_bytes;
  uint32_t conns_per_node, timeout_ms, backoff_min_ms, backoff_max_ms, max_batch;
  int cluster;

  atomic_int stopping;
  atomic_uint_fast64_t seq;

  /* nodes: appended under nodes_mu, published by nnodes (release) */
  pthread_mutex_t nodes_mu;
  rm_node *_Atomic nodes[RM_MAX_NODES];
  atomic_uint nnodes;
  _Atomic uint16_t slots[RM_SLOTS]; /* node index + 1; 0: no owner known */

  /* refresh (cluster) */
  pthread_mutex_t refresh_mu;
  pthread_cond_t refresh_cv;
  int refresh_wanted;
  int refresh_started;
  pthread_t refresh_thread;

  /* op free list */
  pthread_mutex_t free_mu;
  rm_op *free_ops;
  void **chunks;
  size_t nchunks, cap_chunks;

  struct {
    atomic_uint_fast64_t gets, get_hits, get_misses, get_corrupt, get_foreign;
    atomic_uint_fast64_t puts, put_ok, put_refused;
    atomic_uint_fast64_t exists_calls, exists_keys;
    atomic_uint_fast64_t errors, timeouts, moved, ask, refreshes, reconnects, recoveries;
    atomic_uint_fast64_t bytes_read, bytes_written;
    atomic_uint_fast64_t round_trips, round_trip_ns;
  } st;
};

#define RM_ADD(r, f, v) atomic_fetch_add_explicit(&(r)->st.f, (v), memory_order_relaxed)

/* node.c: SIGPIPE blocked in this thread until _on (see node.c). */
typedef struct kvt__rm_sigpipe {
  sigset_t old;
  int was_pending;
} kvt__rm_sigpipe;
void kvt__rm_sigpipe_off(kvt__rm_sigpipe *s);
void kvt__rm_sigpipe_on(const kvt__rm_sigpipe *s);

/* slots.c */
/* Asks the refresh thread for a new slot map (cluster; no-op otherwise). */
void kvt__rm_want_refresh(kvt__remote *r);
/* Loads CLUSTER SLOTS' reply into the map: 0, or -EPROTO if it is not one. */
int kvt__rm_apply_slots(kvt__remote *r, const redisReply *rep, const char *asked_host);
void *kvt__rm_refresh_main(void *arg);

/* node.c */
/* The node at host:port, made (with its threads) if new; NULL when the table
 * is full, the client is closing or a thread cannot start. */
rm_node *kvt__rm_node_get(kvt__remote *r, const char *host, int port);
rm_node *kvt__rm_node_at(kvt__remote *r, uint32_t index);
/* 1 if ops may go to the node now, 0 while its backoff runs. */
int kvt__rm_node_usable(rm_node *n, int64_t now);
/* Appends a list of ops to the node's FIFO and wakes a thread. */
void kvt__rm_node_push(rm_node *n, rm_op *head, rm_op *tail);
void kvt__rm_node_stop(rm_node *n); /* joins its threads, fails what is left */
void kvt__rm_node_free(rm_node *n);
/* A connection to host:port, authenticated, blocking with the client's
 * timeout: 0, KVT_ETIMEDOUT, KVT_EREMOTE or KVT_EAUTH (why in err). */
int kvt__rm_connect(kvt__remote *r, const char *host, int port, redisContext **out, char *err,
                    size_t errlen);
/* The same, connecting within timeout_ms instead. */
int kvt__rm_connect_within(kvt__remote *r, const char *host, int port, uint32_t timeout_ms, redisContext **out,
                           char *err, size_t errlen);

/* remote.c */
rm_op *kvt__rm_op_alloc(kvt__remote *r);
/* Gives the op its one completion (done, the exists count) and frees it. */
void kvt__rm_complete(kvt__remote *r, rm_op *op, int status);
/* An exists op whose caller has stopped waiting (its deadline passed): not
 * worth a round trip. */
int kvt__rm_op_expired(const rm_op *op, int64_t now);
size_t kvt__rm_key(const kvt__remote *r, const kvt_key *key, char *buf);

#endif
