#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static kvt_log_fn sink_fn;
static void *sink_ctx;

void kvt_set_log_handler(kvt_log_fn fn, void *ctx) {
  pthread_mutex_lock(&sink_lock);
  sink_fn = fn;
  sink_ctx = ctx;
  pthread_mutex_unlock(&sink_lock);
}

void kvt__log(int level, const char *fmt, ...) {
  pthread_mutex_lock(&sink_lock);
  kvt_log_fn fn = sink_fn;
  void *ctx = sink_ctx;
  pthread_mutex_unlock(&sink_lock);
  if (!fn) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fn(ctx, level, msg); /* outside the lock: the handler may log or swap itself */
}
