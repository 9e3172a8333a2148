/* The remote tier in a build without hiredis: open says it is not there;
 * the other calls see no client. */
#include <errno.h>
#include <string.h>

#include "remote/remote.h"

int kvt__remote_open(const kvt__remote_cfg *cfg, kvt__remote **out) {
  if (out) *out = NULL;
  if (!cfg || !out) return -EINVAL;
  if (cfg->detail && cfg->detail_len) {
    strncpy(cfg->detail, "built without hiredis: no remote tier", cfg->detail_len - 1);
    cfg->detail[cfg->detail_len - 1] = 0;
  }
  return KVT_EUNSUPPORTED;
}
void kvt__remote_close(kvt__remote *r) { (void)r; }
int kvt__remote_get(kvt__remote *r, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done) { return -EINVAL; }
int kvt__remote_put(kvt__remote *r, kvt__remote_io *ios, uint32_t n, kvt__remote_done_fn done) { return -EINVAL; }
int kvt__remote_exists(kvt__remote *r, const kvt_key *keys, uint32_t n, uint8_t *present, int stop_at_first_miss) {
  return -EINVAL;
}
int kvt__remote_remove(kvt__remote *r, const kvt_key *keys, uint32_t n) { return -EINVAL; }
void kvt__remote_get_stats(kvt__remote *r, kvt__remote_stats *st) {
  if (st) memset(st, 0, sizeof *st);
}
size_t kvt__remote_key_string(const kvt__remote *r, const kvt_key *key, char *buf, size_t cap) { return 0; }
