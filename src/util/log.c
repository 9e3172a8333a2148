#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static kvt_log_fn sink_fn;
static void *sink_ctx;
static _Thread_local const kvt__log_sink *scope;

void kvt_set_log_handler(kvt_log_fn fn, void *ctx) {
  pthread_mutex_lock(&sink_lock);
  sink_fn = fn;
  sink_ctx = ctx;
  pthread_mutex_unlock(&sink_lock);
}

void kvt__log_scope(const kvt__log_sink *sink) { scope = sink; }

static const char *level_name(int level) {
  return level <= KVT_LOG_ERROR ? "error" : level == KVT_LOG_WARN ? "warning" : "info";
}

__attribute__((format(printf, 3, 0))) static void vlog(const kvt__log_sink *s, int level, const char *fmt, va_list ap) {
  if (s && level > s->level) return;
  kvt_log_fn fn = s ? s->fn : NULL;
  void *ctx = s ? s->ctx : NULL;
  if (!fn) {
    pthread_mutex_lock(&sink_lock);
    fn = sink_fn;
    ctx = sink_ctx;
    pthread_mutex_unlock(&sink_lock);
  }
  /* Outside any cache (internal code driven directly): the process-wide handler only. */
  if (!s && !fn) return;
  /* Room for two full paths (a file set aside and the one used instead) and
   * the text; control characters (a newline in a path) would break the
   * one-line-per-event promise, so they become '?'. */
  char msg[2 * 4096 + 512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  for (char *p = msg; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  if (fn) fn(ctx, level, msg); /* outside the lock: the handler may log or swap itself */
  else fprintf(stderr, "kvtier: %s: %s\n", level_name(level), msg);
}

void kvt__log_to(const kvt__log_sink *sink, int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(sink ? sink : scope, level, fmt, ap);
  va_end(ap);
}

void kvt__log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(scope, level, fmt, ap);
  va_end(ap);
}
