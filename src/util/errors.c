#include <string.h>

#include "kvtier/kvtier.h"

const char *kvt_version(void) { return KVT_VERSION_STRING; }

int kvt_version_number(void) { return KVT_VERSION_NUMBER; }

const char *kvt_strerror(int code) {
  switch (code) {
  case KVT_OK:
    return "success";
  case KVT_INPROGRESS:
    return "in progress";
#define KVT_XX_CASE(name, value, text) \
  case name:                           \
    return text;
    KVT_ERROR_MAP(KVT_XX_CASE)
#undef KVT_XX_CASE
  default:
    break;
  }
  /* strerror's buffer is static per libc and fine for errno values. */
  if (code < 0 && code > -4096) return strerror(-code);
  return "unknown kvtier error code";
}
