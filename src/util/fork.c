#include "util/fork.h"

#include <pthread.h>
#include <stdatomic.h>

static atomic_uint gen;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void in_child(void) { atomic_fetch_add(&gen, 1); }

static void arm(void) { pthread_atfork(NULL, NULL, in_child); }

void kvt__fork_watch(void) { pthread_once(&once, arm); }

uint32_t kvt__fork_gen(void) { return atomic_load_explicit(&gen, memory_order_relaxed); }
