/* Remote tier T3: a client for Redis (one server, or a Redis Cluster; Valkey
 * alike) holding kvtier records, shared by every cache that points at the
 * same store.
 *
 * Keys: "<key_prefix><namespace hex>:<block key hex>" (no hash tags: blocks
 * spread over every slot). Values: a block record image exactly as on disk
 * (record.h), sealed by kvt__remote_put. Nothing read back is trusted: every
 * GET is checked with kvt__record_check against the namespace, geometry,
 * expected key and checksums before it counts; a bad, foreign or truncated
 * value is a miss (status KVT_ECORRUPT / KVT_EMISMATCH), never an error the
 * caller has to handle differently from KVT_EMISS.
 *
 * Threads: the client owns its I/O threads (a bounded number of connections
 * per node, each with its own thread). A batch is split per node and
 * pipelined: one round trip per batch per node, a batch being at most
 * max_batch ops, closed once it holds 8 MiB of records (deeper pipelines of
 * large records only make the server buffer more). done() runs on a client thread and must not
 * block (the engine posts a completion record); it may run before the
 * submitting call returns.
 *
 * Cluster: learnt from CLUSTER SLOTS at open and refreshed after MOVED, a
 * connection failure or a timeout; ops follow MOVED (and refresh) and ASK
 * (ASKING + the command on the target, no refresh), at most 5 redirections.
 * A single non-cluster server is detected (CLUSTER SLOTS answers an error)
 * and used directly.
 *
 * Faults: every operation has a timeout. A node that fails (connect error,
 * reset, timeout, LOADING, CLUSTERDOWN, TRYAGAIN) fails the ops in flight
 * on it (KVT_EREMOTE or KVT_ETIMEDOUT: the engine treats them as misses)
 * and is marked degraded: ops for it fail at once until its backoff
 * (doubling from backoff_min_ms to backoff_max_ms) expires, then one
 * reconnect is tried. Nothing ever waits past timeout_ms per round trip. */
#ifndef KVT_REMOTE_REMOTE_H
#define KVT_REMOTE_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/kvtier.h"
#include "store/record.h"

typedef struct kvt__remote kvt__remote;

typedef struct kvt__remote_cfg {
  /* "redis://[user[:password]@]host:port[,host:port...]" (seed nodes; the
   * scheme may be omitted; "valkey://" is accepted). */
  const char *url;
  const char *user;          /* ACL user (NULL: the URL's, else default) */
  const char *password;      /* NULL: the URL's, else none. Never logged or
                                kept in stats; the URL is logged with it masked */
  const char *key_prefix;    /* NULL: "kvt:" */
  kvt_key ns;                /* the cache's namespace */
  uint32_t block_tokens;     /* record geometry, for verification */
  uint64_t payload_bytes;
  uint32_t conns_per_node;   /* 0: 2 */
  uint32_t timeout_ms;       /* 0: 2000; connect and each round trip */
  uint32_t backoff_min_ms;   /* 0: 100 */
  uint32_t backoff_max_ms;   /* 0: 5000 */
  uint32_t max_batch;        /* ops per pipelined round trip (0: 64) */
  char *detail;              /* optional: why an open failed, in words */
  size_t detail_len;
} kvt__remote_cfg;

/* Connects to a seed, authenticates, learns the topology. Returns 0,
 * KVT_EREMOTE (no seed reachable; detail says why), KVT_EAUTH (the server
 * refused the credentials), -EINVAL (bad URL or cfg), -ENOMEM, or
 * KVT_EUNSUPPORTED in a build without hiredis. May block (up to timeout_ms
 * per seed). */
int kvt__remote_open(const kvt__remote_cfg *cfg, kvt__remote **out);
void kvt__remote_close(kvt__remote *r); /* fails what is queued, waits for threads */

typedef void (*kvt__remote_done_fn)(void *arg, int status);

typedef struct kvt__remote_io {
  kvt_key key;
  void *rec;     /* get: destination of record_bytes; put: the record image
                    (key, parent, flags, tokens, payload filled; sealed here).
                    Belongs to the client until done() */
  void *arg;
  int status;    /* out, at submission: 0 queued (done follows) or an error */
} kvt__remote_io;

/* Each queued io gets exactly one done(arg, status):
 *   get:    0 (verified record in rec), KVT_EMISS (no such key),
 *           KVT_ECORRUPT / KVT_EMISMATCH (bad or foreign value: a miss),
 *           KVT_EREMOTE / KVT_ETIMEDOUT (node down, degraded, slow).
 *   put:    0 (stored), KVT_EREMOTE / KVT_ETIMEDOUT, KVT_ENOSPACE (the
 *           server's maxmemory refused it: OOM reply).
 * Returns how many were queued, or -EINVAL. */
int kvt__remote_get(kvt__remote *r, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done);
int kvt__remote_put(kvt__remote *r, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done);

/* Synchronous batched existence: present[i] = KVT__RM_PRESENT if keys[i]
 * is stored (a hint: the GET still verifies), KVT__RM_ABSENT if the server
 * said it is not, KVT__RM_UNKNOWN when no answer came (the node failed or
 * is degraded, the key could not be routed, or the call's time ran out).
 * One pipelined round trip per node; the whole call waits at most
 * timeout_ms, queueing behind other work included. stop_at_first_miss = 1
 * may skip keys after the first absent one (prefix probes). Returns the
 * number present, -EINVAL or -ENOMEM. */
enum { KVT__RM_ABSENT = 0, KVT__RM_PRESENT = 1, KVT__RM_UNKNOWN = 2 };
int kvt__remote_exists(kvt__remote *r, const kvt_key *keys, uint32_t n, uint8_t *present,
                       int stop_at_first_miss);

/* Removes keys (best effort, asynchronous, no result). Returns how many
 * were queued (keys of a degraded node are skipped), or -EINVAL. */
int kvt__remote_remove(kvt__remote *r, const kvt_key *keys, uint32_t n);

typedef struct kvt__remote_stats {
  uint64_t gets, get_hits, get_misses, get_corrupt, get_foreign;
  uint64_t puts, put_ok, put_refused;
  uint64_t exists_calls, exists_keys;
  uint64_t errors, timeouts, moved, ask, refreshes, reconnects;
  uint64_t recoveries;         /* a degraded node answered again */
  uint64_t bytes_read, bytes_written;
  uint32_t nodes, nodes_degraded;
  int cluster;                 /* 1: Redis Cluster, 0: one server */
  /* Round trips that got every reply, and their total wall time from the
   * first byte sent to the last reply read: with bytes_read/written, what
   * the link delivers (for the cost model's calibration). */
  uint64_t round_trips, round_trip_ns;
} kvt__remote_stats;
void kvt__remote_get_stats(kvt__remote *r, kvt__remote_stats *st);

/* Redis Cluster's hash slot of a key string (CRC16 mod 16384, {hash tag}
 * rule), as the server computes it. Pure; in every build. */
uint16_t kvt__remote_hash_slot(const char *key, size_t len);

/* For tests and the bench: key string of a block ("<prefix><ns>:<key>"),
 * returns its length (buf of at least 128 bytes). */
size_t kvt__remote_key_string(const kvt__remote *r, const kvt_key *key, char *buf, size_t cap);

#endif
