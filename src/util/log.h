/* The library's one voice to its user. A cache's messages go to its
 * config's log_fn, else to the process-wide handler (kvt_set_log_handler),
 * else to stderr; each cache filters by its config's log_level. */
#ifndef KVT_UTIL_LOG_H
#define KVT_UTIL_LOG_H

#include "kvtier/kvtier.h"

/* Where one cache's messages go (copied from its config at kvt_open). */
typedef struct kvt__log_sink {
  kvt_log_fn fn; /* NULL: the process-wide handler, else stderr */
  void *ctx;
  int level;     /* deliver messages of this severity or worse; KVT_LOG_NONE: none */
} kvt__log_sink;

/* A message to the sink of the cache this thread is opening (kvt__log_scope),
 * or, outside any scope, to the process-wide handler only (never stderr:
 * tests and fuzzers drive the store and backends without a cache). */
void kvt__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A message to a cache's sink (sink NULL: as kvt__log). */
void kvt__log_to(const kvt__log_sink *sink, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sends this thread's kvt__log messages to sink until kvt__log_scope(NULL):
 * messages of the disk store and backends, which know no cache, during a
 * kvt_register_layout. */
void kvt__log_scope(const kvt__log_sink *sink);

#endif
