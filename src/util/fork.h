/* fork() detection: a child inherits a cache's memory but none of its
 * threads, and its locks may be held by threads that no longer exist. */
#ifndef KVT_UTIL_FORK_H
#define KVT_UTIL_FORK_H

#include <stdint.h>

/* Counts fork()s in this process's ancestry since the library was loaded
 * (a pthread_atfork child handler bumps it); kvt__fork_watch arms it. */
void kvt__fork_watch(void);
uint32_t kvt__fork_gen(void);

#endif
