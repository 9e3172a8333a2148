/* The library's one voice to its user: messages go to the sink installed
 * with kvt_set_log_handler (none by default), never to stderr on their own. */
#ifndef KVT_UTIL_LOG_H
#define KVT_UTIL_LOG_H

#include "kvtier/kvtier.h"

void kvt__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
