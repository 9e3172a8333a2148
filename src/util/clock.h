#ifndef KVT_UTIL_CLOCK_H
#define KVT_UTIL_CLOCK_H
#include <stdint.h>
#include <time.h>
/* Monotonic nanoseconds. Only the engine and backends read the clock; core/ never does. */
static inline int64_t kvt__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
#endif
