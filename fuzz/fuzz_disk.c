/* libFuzzer target: the disk store's loader - superblock check and the
 * recovery scan (src/store/disk_recover.c) - over a damaged file.
 *
 * Each run writes a small valid store (superblock and four sealed records)
 * with the store itself, then damages it as the input says, reopens it and
 * recovers. Input: byte 0 = flags (bit 0: recover headers only; bit 1:
 * truncate the file to a length from bytes 1-2), then (offset u16 LE, xor
 * byte) triples applied to the file. Properties: open returns a documented
 * code; every record recovery hands out passes the full record check at its
 * slot; at most one record per key; a second open of the same file agrees. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/disk_store.h"
#include "store/record.h"

#define SLOTS 4
#define BT 16
#define PAYLOAD 512

static const kvt_key ns = {0xabcdef0123456789ull, 0x1122334455667788ull};
static char path[256];

typedef struct waiter {
  pthread_mutex_t m;
  pthread_cond_t cv;
  int left, bad;
} waiter;

static void done(void *arg, int status) {
  waiter *w = arg;
  pthread_mutex_lock(&w->m);
  if (status) w->bad++;
  if (--w->left == 0) pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->m);
}

static kvt__disk_cfg config(int reset, int headers_only) {
  kvt__disk_cfg c = {.path = path, .slots = SLOTS, .block_tokens = BT, .payload_bytes = PAYLOAD, .ns = ns,
                     .queue_depth = 8, .backend = KVT_DISK_THREADS, .reset = reset,
                     .recover_headers_only = headers_only};
  return c;
}

static void write_valid_store(void) {
  kvt__disk *d;
  kvt__disk_cfg c = config(1, 0);
  if (kvt__disk_open(&c, &d) != 0) abort();
  size_t len = kvt__record_bytes(BT, PAYLOAD);
  uint8_t *recs = aligned_alloc(4096, len * SLOTS);
  memset(recs, 0, len * SLOTS);
  waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, SLOTS, 0};
  for (uint32_t s = 0; s < SLOTS; s++) {
    uint8_t *r = recs + s * len;
    kvt__record_hdr *h = (kvt__record_hdr *)r;
    h->key = (kvt_key){s % 3 + 1, 42}; /* slots 0 and 3 hold the same key: newest wins */
    h->parent = ns;
    h->flags = s & 1 ? KVT_RECORD_F_TOKENS : 0;
    h->token_count = s & 1 ? BT : 0;
    for (uint32_t i = 0; i < BT; i++) kvt__record_tokens(r)[i] = s * 100 + i;
    memset(kvt__record_payload(r, BT), 0x30 + (int)s, PAYLOAD);
    if (kvt__disk_write(d, s, r, done, &w) != 0) abort();
  }
  pthread_mutex_lock(&w.m);
  while (w.left) pthread_cond_wait(&w.cv, &w.m);
  pthread_mutex_unlock(&w.m);
  if (w.bad) abort();
  kvt__disk_close(d);
  free(recs);
}

typedef struct seen {
  uint64_t slot[SLOTS + 1];
  kvt_key key[SLOTS + 1];
  int n;
} seen;

static void found(void *arg, uint64_t slot, const kvt_key *key, const kvt_key *parent) {
  seen *s = arg;
  if (slot >= SLOTS || s->n > SLOTS) abort();
  for (int i = 0; i < s->n; i++)
    if (s->slot[i] == slot || (s->key[i].lo == key->lo && s->key[i].hi == key->hi)) abort();
  s->slot[s->n] = slot;
  s->key[s->n++] = *key;
}

/* Opens, recovers; returns the open code and fills *s. */
static int load(int headers_only, seen *s) {
  kvt__disk *d = NULL;
  kvt__disk_cfg c = config(0, headers_only);
  memset(s, 0, sizeof *s);
  int rc = kvt__disk_open(&c, &d);
  if (rc != 0) {
    if (d) abort();
    /* Documented: -errno, KVT_ENAMESPACE, KVT_ECORRUPT, KVT_EBUSY. */
    if (rc > 0 || (rc <= -3001 && rc != KVT_ENAMESPACE && rc != KVT_ECORRUPT && rc != KVT_EBUSY)) abort();
    return rc;
  }
  uint64_t discarded = 0;
  int n = kvt__disk_recover(d, found, s, &discarded);
  if (n != s->n || discarded > SLOTS) abort();
  kvt__disk_close(d);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!path[0]) {
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(path, sizeof path, "%s/kvt-fuzz-disk-%d.kvt", dir, (int)getpid());
  }
  if (size < 1) return 0;
  write_valid_store();
  int fd = open(path, O_RDWR);
  if (fd < 0) abort();
  off_t file_len = lseek(fd, 0, SEEK_END);
  size_t i = 1;
  if ((data[0] & 2) && size >= 3) {
    off_t t = (off_t)(data[1] | data[2] << 8) * 8;
    if (t < file_len && ftruncate(fd, t) != 0) abort();
    i = 3;
  }
  for (; i + 3 <= size; i += 3) {
    off_t at = (off_t)(data[i] | data[i + 1] << 8) * 7 % (file_len ? file_len : 1);
    uint8_t b;
    if (pread(fd, &b, 1, at) == 1) {
      b ^= data[i + 2] ? data[i + 2] : 0x80;
      if (pwrite(fd, &b, 1, at) != 1) abort();
    }
  }
  close(fd);
  int headers_only = data[0] & 1;
  seen a, b;
  int rc = load(headers_only, &a);
  if (rc == 0) {
    /* Everything recovery handed out is a whole, valid record at its slot. */
    size_t len = kvt__record_bytes(BT, PAYLOAD);
    uint8_t *rec = aligned_alloc(4096, len);
    fd = open(path, O_RDONLY);
    for (int k = 0; k < a.n; k++) {
      if (pread(fd, rec, len, 4096 + (off_t)(a.slot[k] * len)) != (ssize_t)len) abort();
      int v = kvt__record_check(rec, len, &ns, BT, PAYLOAD, &a.key[k], !headers_only, NULL);
      if (v != 0) abort();
    }
    close(fd);
    free(rec);
    /* Recovery is idempotent: a second open finds the same records. */
    if (load(headers_only, &b) != 0 || b.n != a.n) abort();
  }
  unlink(path);
  return 0;
}
