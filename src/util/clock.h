#ifndef KVT_UTIL_CLOCK_H
#define KVT_UTIL_CLOCK_H
#include <pthread.h>
#include <stdint.h>
#include <time.h>
/* Monotonic nanoseconds. Only the engine and backends read the clock; core/ never does. */
static inline int64_t kvt__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A condition variable whose timed waits take deadlines on kvt__now_ns's
 * clock (CLOCK_MONOTONIC), so a change of the wall clock moves none. */
static inline void kvt__cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
}
#endif
