#include "helpers.h"

#include "kvtier/kvtier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

void kvt_test_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "SKIP: ");
  vfprintf(stdout, fmt, ap);
  fprintf(stdout, "\n");
  va_end(ap);
  fflush(stdout);
  exit(KVT_TEST_SKIP);
}

#ifndef KVT_TEST_DATA_DIR
#define KVT_TEST_DATA_DIR "data"
#endif

/* The shipped data (data/ in the source tree); KVT_TRACES_DIR overrides it,
 * e.g. to run a test binary against other traces. */
const char *kvt_test_trace(const char *name) {
  static char path[4096];
  const char *dir = getenv("KVT_TRACES_DIR");
  if (!dir || !*dir) dir = KVT_TEST_DATA_DIR;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, R_OK) == 0 ? path : NULL;
}

static char tmp_path[4096];
static pid_t tmp_owner;

static int remove_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(p);
  return 0;
}

/* The directory goes at exit, in the process that made it only (children of
 * crash tests share it with their parent); KVT_TEST_KEEP=1 keeps it. */
static void remove_tmpdir(void) {
  const char *keep = getenv("KVT_TEST_KEEP");
  if (tmp_path[0] && getpid() == tmp_owner && !(keep && *keep == '1'))
    nftw(tmp_path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *kvt_test_tmpdir(void) {
#define path tmp_path
  if (path[0]) return path;
  const char *base = getenv("KVT_TEST_TMPDIR");
  if (!base) base = getenv("TMPDIR");
  if (!base) base = "/tmp";
  snprintf(path, sizeof path, "%s/kvt-test-XXXXXX", base);
  if (!mkdtemp(path)) {
    snprintf(path, sizeof path, "/tmp/kvt-test-XXXXXX");
    if (!mkdtemp(path)) kvt_test_skip("cannot create a temporary directory");
  }
  tmp_owner = getpid();
  atexit(remove_tmpdir);
  return path;
#undef path
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void kvt_test_fill(void *buf, size_t len, uint64_t seed) {
  unsigned char *p = buf;
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, 8);
  }
  if (i < len) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, len - i);
  }
}

int kvt_test_check(const void *buf, size_t len, uint64_t seed) {
  const unsigned char *p = buf;
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t v = splitmix(&s);
    if (memcmp(p + i, &v, 8) != 0) return 0;
  }
  if (i < len) {
    uint64_t v = splitmix(&s);
    if (memcmp(p + i, &v, len - i) != 0) return 0;
  }
  return 1;
}

void kvt_test_wait_unlocked(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return; /* no file: nothing holds it */
  for (int i = 0; i < 6000 && flock(fd, LOCK_EX | LOCK_NB) != 0; i++)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  close(fd); /* our lock, if we got it, goes with the descriptor */
}

int kvt_test_register_storage(kvt_cache *c, size_t block_bytes) {
  kvt_segment seg = {NULL, 0, block_bytes};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.segments = &seg;
  l.flags = KVT_LAYOUT_STORAGE;
  return kvt_register_layout(c, &l);
}
