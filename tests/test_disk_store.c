/* The disk store through both backends: byte-exact round trips, checksums
 * catching flipped bytes and torn records (at read and at recovery),
 * persistence across reopen, namespace/geometry mismatch, tombstones, seq
 * order, injected EIO / ENOSPC / short writes failing only their own
 * request, and durable mode's group fdatasync before a write's done(). */
#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "store/disk_store.h"
#include "util/fault.h"

#define BT 16u
#define PAYLOAD (64u * 1024u + 100u) /* not 4 KiB-aligned: the record pads it */
/* Records this big are sealed on the store's checksum threads and verified
 * on its reaper. */
#define BIG_PAYLOAD (512u * 1024u + 100u)

static size_t g_payload = PAYLOAD; /* of the open fixture */
#define SLOTS 24u

static kvt_disk_backend g_backend;
static const char *g_name;
static const kvt_key NS1 = {0x1111, 0xaaaa}, NS2 = {0x2222, 0xbbbb};

typedef struct fx {
  char path[4200];
  size_t rec_bytes;
  char *pool; /* SLOTS host slots, registered with the backend */
  kvt__disk *d;
} fx;

static kvt__disk_cfg cfg_of(fx *f, kvt_key ns) {
  static const void *bufs[1];
  static size_t lens[1];
  bufs[0] = f->pool;
  lens[0] = f->rec_bytes * SLOTS;
  return (kvt__disk_cfg){.path = f->path, .slots = SLOTS, .block_tokens = BT, .payload_bytes = g_payload,
                         .ns = ns, .queue_depth = 8, .backend = g_backend, .bufs = bufs,
                         .buf_lens = lens, .n_bufs = 1};
}

static void reopen(fx *f, kvt_key ns) {
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, ns);
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
}

static int setup(void **state) {
  static int n;
  fx *f = calloc(1, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s/disk-%d-%d.kvt", kvt_test_tmpdir(), (int)getpid(), n++);
  g_payload = PAYLOAD;
  f->rec_bytes = kvt__record_bytes(BT, PAYLOAD);
  f->pool = aligned_alloc(4096, f->rec_bytes * SLOTS);
  kvt__disk_cfg c = cfg_of(f, NS1);
  if (kvt__disk_open(&c, &f->d) != 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  kvt__fault_set(NULL, NULL);
  kvt__disk_close(f->d);
  unlink(f->path);
  free(f->pool);
  free(f);
  return 0;
}

static void *host(fx *f, uint32_t i) { return f->pool + (size_t)i * f->rec_bytes; }
static kvt_key key_of(uint64_t seed) { return (kvt_key){seed * 0x9e3779b97f4a7c15ull, seed}; }

/* A record image as the engine builds it: identity, tokens, payload. */
static void make_rec(void *rec, uint64_t seed) {
  kvt__record_hdr *h = rec;
  memset(h, 0, sizeof *h);
  h->key = key_of(seed);
  h->parent = key_of(seed + 1000);
  h->flags = KVT_RECORD_F_TOKENS;
  h->token_count = BT;
  for (uint32_t t = 0; t < BT; t++) kvt__record_tokens(rec)[t] = (uint32_t)(seed * 100 + t);
  kvt_test_fill(kvt__record_payload(rec, BT), g_payload, seed);
}

static int rec_ok(void *rec, uint64_t seed) {
  kvt__record_hdr *h = rec;
  if (h->key.lo != key_of(seed).lo || h->parent.hi != key_of(seed + 1000).hi) return 0;
  for (uint32_t t = 0; t < BT; t++)
    if (kvt__record_tokens(rec)[t] != (uint32_t)(seed * 100 + t)) return 0;
  return kvt_test_check(kvt__record_payload(rec, BT), g_payload, seed);
}

typedef struct waiter {
  pthread_mutex_t m;
  pthread_cond_t c;
  int pending;
  int status[SLOTS];
  int n_done;
} waiter;

typedef struct wslot {
  waiter *w;
  int i;
} wslot;

static void on_done(void *arg, int status) {
  wslot *s = arg;
  pthread_mutex_lock(&s->w->m);
  s->w->status[s->i] = status;
  s->w->pending--;
  s->w->n_done++;
  pthread_cond_broadcast(&s->w->c);
  pthread_mutex_unlock(&s->w->m);
}

static waiter *waiter_new(void) {
  waiter *w = calloc(1, sizeof *w);
  pthread_mutex_init(&w->m, NULL);
  pthread_cond_init(&w->c, NULL);
  return w;
}

static void waiter_wait(waiter *w) {
  pthread_mutex_lock(&w->m);
  while (w->pending) pthread_cond_wait(&w->c, &w->m);
  pthread_mutex_unlock(&w->m);
}

static wslot g_ws[SLOTS];

static int start(waiter *w, int i, int rc) {
  if (rc == 0) {
    pthread_mutex_lock(&w->m);
    w->pending++;
    pthread_mutex_unlock(&w->m);
  }
  return rc;
}

static int write_async(fx *f, waiter *w, uint32_t slot, uint32_t i) {
  g_ws[i] = (wslot){w, (int)i};
  pthread_mutex_lock(&w->m);
  w->pending++;
  pthread_mutex_unlock(&w->m);
  int rc = kvt__disk_write(f->d, slot, host(f, i), on_done, &g_ws[i]);
  if (rc) {
    pthread_mutex_lock(&w->m);
    w->pending--;
    pthread_mutex_unlock(&w->m);
  }
  return rc;
}

static int read_async(fx *f, waiter *w, uint32_t slot, uint32_t i, const kvt_key *k) {
  g_ws[i] = (wslot){w, (int)i};
  pthread_mutex_lock(&w->m);
  w->pending++;
  pthread_mutex_unlock(&w->m);
  int rc = kvt__disk_read(f->d, slot, host(f, i), k, on_done, &g_ws[i]);
  if (rc) {
    pthread_mutex_lock(&w->m);
    w->pending--;
    pthread_mutex_unlock(&w->m);
  }
  return rc;
}

static int write_sync(fx *f, uint32_t slot, uint64_t seed) {
  waiter *w = waiter_new();
  make_rec(host(f, 0), seed);
  int rc = write_async(f, w, slot, 0);
  waiter_wait(w);
  if (rc == 0) rc = w->status[0];
  free(w);
  return rc;
}

static int read_sync(fx *f, uint32_t slot, uint64_t seed) {
  waiter *w = waiter_new();
  memset(host(f, 1), 0xee, f->rec_bytes);
  kvt_key k = key_of(seed);
  int rc = read_async(f, w, slot, 1, &k);
  waiter_wait(w);
  if (rc == 0) rc = w->status[1];
  if (rc == 0 && !rec_ok(host(f, 1), seed)) rc = -9999; /* returned wrong bytes */
  free(w);
  return rc;
}

/* ---- recovery results ---- */

typedef struct found {
  int n;
  uint64_t slot[SLOTS];
  kvt_key key[SLOTS], parent[SLOTS];
} found;

static void on_found(void *arg, uint64_t slot, const kvt_key *key, const kvt_key *parent) {
  found *r = arg;
  r->slot[r->n] = slot;
  r->key[r->n] = *key;
  r->parent[r->n++] = *parent;
}

static int found_slot(const found *r, uint64_t slot, uint64_t seed) {
  for (int i = 0; i < r->n; i++)
    if (r->slot[i] == slot) return r->key[i].lo == key_of(seed).lo && r->parent[i].hi == key_of(seed + 1000).hi;
  return 0;
}

static found recover(fx *f, uint64_t *discarded) {
  found r = {0};
  int n = kvt__disk_recover(f->d, on_found, &r, discarded);
  assert_int_equal(n, r.n); /* n is stored first: r.n is read after the call */
  return r;
}

/* Overwrites one byte of the file, bypassing the store. */
static void poke(fx *f, uint64_t slot, size_t off, unsigned char x) {
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  int fd = open(f->path, O_RDWR);
  assert_true(fd >= 0);
  off_t at = (off_t)(in.data_offset + slot * in.slot_bytes + off);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= x;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

/* ---- cases ---- */

static void test_backend_is_the_one_asked_for(void **state) {
  fx *f = *state;
  assert_string_equal(kvt__disk_backend_name(f->d), g_name);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.slot_bytes, f->rec_bytes);
  assert_int_equal(in.slots, SLOTS);
}

static void test_round_trip_byte_exact(void **state) {
  fx *f = *state;
  waiter *w = waiter_new();
  for (uint32_t i = 0; i < 8; i++) make_rec(host(f, i), 40 + i);
  for (uint32_t i = 0; i < 8; i++) assert_int_equal(write_async(f, w, 15 - i, i), 0);
  waiter_wait(w);
  for (uint32_t i = 0; i < 8; i++) assert_int_equal(w->status[i], 0);
  memset(f->pool, 0, f->rec_bytes * 8);
  for (uint32_t i = 0; i < 8; i++) {
    kvt_key k = key_of(40 + i);
    assert_int_equal(read_async(f, w, 15 - i, i, &k), 0);
  }
  waiter_wait(w);
  for (uint32_t i = 0; i < 8; i++) {
    assert_int_equal(w->status[i], 0);
    assert_true(rec_ok(host(f, i), 40 + i));
  }
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.writes, 8);
  assert_int_equal(st.reads, 8);
  assert_int_equal(st.bytes_read, 8 * f->rec_bytes);
  free(w);
}

/* The cfg's buffer lists need not outlive kvt__disk_open: a store that
 * kept the caller's arrays would look a buffer's registered index up in
 * freed memory (a caller passing lists on its stack, as a bench did). */
static void test_buffer_lists_may_go_after_open(void **state) {
  fx *f = *state;
  kvt__disk_close(f->d);
  const void **bufs = malloc(sizeof *bufs);
  size_t *lens = malloc(sizeof *lens);
  assert_non_null(bufs);
  assert_non_null(lens);
  bufs[0] = f->pool, lens[0] = f->rec_bytes * SLOTS;
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.bufs = bufs, c.buf_lens = lens;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  bufs[0] = NULL, lens[0] = 0;
  free(bufs);
  free(lens);
  for (uint32_t s = 0; s < 4; s++) {
    assert_int_equal(write_sync(f, s, 70 + s), 0);
    assert_int_equal(read_sync(f, s, 70 + s), 0);
  }
}

static void test_unregistered_buffer_round_trip(void **state) {
  fx *f = *state;
  char *own = aligned_alloc(4096, f->rec_bytes);
  make_rec(own, 7);
  waiter *w = waiter_new();
  g_ws[0] = (wslot){w, 0};
  start(w, 0, 0);
  assert_int_equal(kvt__disk_write(f->d, 2, own, on_done, &g_ws[0]), 0);
  waiter_wait(w);
  assert_int_equal(w->status[0], 0);
  assert_int_equal(read_sync(f, 2, 7), 0);
  free(own);
  free(w);
}

static void test_wrong_key_is_mismatch(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 4, 1), 0);
  assert_int_equal(read_sync(f, 4, 2), KVT_EMISMATCH);
  assert_int_equal(read_sync(f, 5, 1), KVT_EMISMATCH); /* empty slot */
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.mismatches, 2);
  assert_int_equal(st.checksum_failures, 0);
}

static void flip_case(fx *f, size_t off) {
  assert_int_equal(write_sync(f, 3, 10), 0);
  assert_int_equal(write_sync(f, 6, 11), 0);
  poke(f, 3, off, 0x40);
  assert_int_equal(read_sync(f, 3, 10), KVT_ECORRUPT);
  assert_int_equal(read_sync(f, 6, 11), 0);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.checksum_failures, 1);
  reopen(f, NS1);
  uint64_t discarded = 0;
  found r = recover(f, &discarded);
  assert_int_equal(r.n, 1);
  assert_true(found_slot(&r, 6, 11));
  assert_int_equal(discarded, 1);
  assert_int_equal(read_sync(f, 3, 10), KVT_ECORRUPT); /* still not trusted */
}

static void test_flipped_payload_byte(void **state) { flip_case(*state, kvt__record_prefix_bytes(BT) + 5000); }
static void test_flipped_header_byte(void **state) { flip_case(*state, offsetof(kvt__record_hdr, key) + 3); }
static void test_flipped_token_byte(void **state) { flip_case(*state, KVT_RECORD_HDR_BYTES + 9); }
static void test_flipped_last_payload_byte(void **state) {
  flip_case(*state, kvt__record_prefix_bytes(BT) + PAYLOAD - 1);
}

/* A torn record: the new header landed, the old payload stayed. */
static void test_torn_record_is_discarded(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 9, 20), 0);
  make_rec(host(f, 2), 21);
  assert_int_equal(kvt__record_seal(host(f, 2), &NS1, BT, PAYLOAD, 1000), 0);
  int fd = open(f->path, O_RDWR);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(pwrite(fd, host(f, 2), 4096, (off_t)(in.data_offset + 9 * in.slot_bytes)), 4096);
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  assert_int_equal(read_sync(f, 9, 21), KVT_ECORRUPT);
  reopen(f, NS1);
  uint64_t discarded = 0;
  found r = recover(f, &discarded);
  assert_int_equal(r.n, 0);
  assert_int_equal(discarded, 1);
  /* Headers-only recovery lists it, but the read still refuses it. */
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.recover_headers_only = 1;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  r = recover(f, &discarded);
  assert_int_equal(r.n, 1);
  assert_int_equal(read_sync(f, 9, 21), KVT_ECORRUPT);
}

static void test_reopen_after_clean_close(void **state) {
  fx *f = *state;
  for (uint32_t s = 0; s < SLOTS; s += 2) assert_int_equal(write_sync(f, s, 100 + s), 0);
  reopen(f, NS1);
  uint64_t discarded = 99;
  found r = recover(f, &discarded);
  assert_int_equal(r.n, SLOTS / 2);
  assert_int_equal(discarded, 0);
  for (uint32_t s = 0; s < SLOTS; s += 2) {
    assert_true(found_slot(&r, s, 100 + s));
    assert_int_equal(read_sync(f, s, 100 + s), 0);
  }
  assert_int_equal(kvt__disk_recover(f->d, on_found, &r, NULL), KVT_ESTATE);
}

static void test_newest_copy_of_a_key_wins(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 1, 30), 0);
  assert_int_equal(write_sync(f, 2, 30), 0); /* same key, later seq */
  reopen(f, NS1);
  found r = recover(f, NULL);
  assert_int_equal(r.n, 1);
  assert_int_equal(r.slot[0], 2);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.superseded, 1);
  /* The old copy was tombstoned: a write to slot 2 under another key would
   * otherwise let slot 1 come back. */
  assert_int_equal(write_sync(f, 2, 31), 0);
  reopen(f, NS1);
  r = recover(f, NULL);
  assert_int_equal(r.n, 1);
  assert_true(found_slot(&r, 2, 31));
}

/* What on_record saw during an open's scan. */
typedef struct seen_recs {
  uint32_t n, with_tokens;
  uint64_t seq_of_30[2];
  uint32_t n_30;
  int tokens_ok;
} seen_recs;

static void on_record_seen(void *arg, const kvt__record_hdr *h, const uint32_t *tokens) {
  seen_recs *v = arg;
  v->n++;
  if (tokens) {
    v->with_tokens++;
    uint64_t seed = h->key.hi;
    for (uint32_t t = 0; t < BT; t++)
      if (tokens[t] != (uint32_t)(seed * 100 + t)) v->tokens_ok = 0;
  }
  if (h->key.hi == 30 && v->n_30 < 2) v->seq_of_30[v->n_30++] = h->seq;
}

/* An open's scan hands every record it keeps reading to on_record, with its
 * checked header and its token ids (NULL for a record without them), older
 * copies of a key included (their seq tells them apart); a damaged record
 * and an empty slot are not handed over. */
static void test_the_scan_hands_each_record_to_on_record(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 1, 30), 0);
  assert_int_equal(write_sync(f, 2, 30), 0); /* same key, later seq */
  assert_int_equal(write_sync(f, 3, 40), 0);
  make_rec(host(f, 0), 41);
  kvt__record_hdr *h = host(f, 0);
  h->flags = 0; /* no tokens */
  h->token_count = 0;
  waiter *w = waiter_new();
  assert_int_equal(write_async(f, w, 4, 0), 0);
  waiter_wait(w);
  assert_int_equal(w->status[0], 0);
  free(w);
  assert_int_equal(write_sync(f, 5, 42), 0);
  kvt__disk_close(f->d);
  int fd = open(f->path, O_RDWR); /* slot 5's header damaged */
  assert_true(fd >= 0);
  char b = 0x5a;
  assert_int_equal(pwrite(fd, &b, 1, 4096 + 5 * (off_t)f->rec_bytes + 40), 1);
  close(fd);
  seen_recs v = {.tokens_ok = 1};
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.recover_headers_only = 1;
  c.on_record = on_record_seen;
  c.on_record_arg = &v;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  assert_int_equal(v.n, 4);
  assert_int_equal(v.with_tokens, 3);
  assert_true(v.tokens_ok);
  assert_int_equal(v.n_30, 2);
  assert_true(v.seq_of_30[0] != v.seq_of_30[1]);
  found r = recover(f, NULL);
  assert_int_equal(r.n, 3); /* key 30 once (the newer), 40, 41 */
}

static void test_seq_keeps_growing_across_reopen(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 1, 50), 0);
  assert_int_equal(write_sync(f, 1, 51), 0);
  reopen(f, NS1);
  (void)recover(f, NULL);
  assert_int_equal(write_sync(f, 7, 51), 0); /* same key again after restart */
  reopen(f, NS1);
  found r = recover(f, NULL);
  assert_int_equal(r.n, 1);
  assert_int_equal(r.slot[0], 7);
}

static void test_tombstone_is_never_resurrected(void **state) {
  fx *f = *state;
  for (uint32_t s = 0; s < 3; s++) assert_int_equal(write_sync(f, s, 60 + s), 0);
  assert_int_equal(kvt__disk_invalidate(f->d, 1), 0);
  assert_int_equal(read_sync(f, 1, 61), KVT_EMISMATCH);
  reopen(f, NS1);
  uint64_t discarded = 9;
  found r = recover(f, &discarded);
  assert_int_equal(r.n, 2);
  assert_int_equal(discarded, 0);
  assert_false(found_slot(&r, 1, 61));
  assert_true(found_slot(&r, 2, 62));
}

static void test_namespace_mismatch_keeps_old_data(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 5, 70), 0);
  kvt__disk_close(f->d);
  f->d = NULL;
  kvt__disk_cfg c = cfg_of(f, NS2);
  assert_int_equal(kvt__disk_open(&c, &f->d), KVT_ENAMESPACE);
  c = cfg_of(f, NS1);
  c.payload_bytes = PAYLOAD + 4096; /* other geometry */
  assert_int_equal(kvt__disk_open(&c, &f->d), KVT_ENAMESPACE);
  reopen(f, NS1); /* untouched */
  found r = recover(f, NULL);
  assert_int_equal(r.n, 1);
  assert_int_equal(read_sync(f, 5, 70), 0);
  kvt__disk_close(f->d);
  c = cfg_of(f, NS2);
  c.reset = 1;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  r = recover(f, NULL);
  assert_int_equal(r.n, 0);
  kvt__disk_close(f->d);
  c = cfg_of(f, NS1);
  assert_int_equal(kvt__disk_open(&c, &f->d), KVT_ENAMESPACE); /* it is NS2's now */
  reopen(f, NS2);
}

static void test_foreign_file_untouched(void **state) {
  fx *f = *state;
  kvt__disk_close(f->d);
  f->d = NULL;
  int fd = open(f->path, O_RDWR | O_TRUNC);
  char junk[8192];
  kvt_test_fill(junk, sizeof junk, 3);
  assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);
  kvt__disk_cfg c = cfg_of(f, NS1);
  assert_int_equal(kvt__disk_open(&c, &f->d), KVT_ENAMESPACE);
  char back[8192];
  fd = open(f->path, O_RDONLY);
  assert_int_equal(read(fd, back, sizeof back), (ssize_t)sizeof back);
  assert_int_equal(lseek(fd, 0, SEEK_END), (off_t)sizeof junk);
  close(fd);
  assert_memory_equal(back, junk, sizeof junk);
  c.reset = 1;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  assert_int_equal(write_sync(f, 0, 1), 0);
}

static void test_bad_arguments(void **state) {
  fx *f = *state;
  make_rec(host(f, 0), 1);
  assert_int_equal(kvt__disk_write(NULL, 0, host(f, 0), on_done, NULL), -EINVAL);
  assert_int_equal(kvt__disk_write(f->d, SLOTS, host(f, 0), on_done, NULL), -EINVAL);
  assert_int_equal(kvt__disk_write(f->d, 0, NULL, on_done, NULL), -EINVAL);
  assert_int_equal(kvt__disk_write(f->d, 0, host(f, 0), NULL, NULL), -EINVAL);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  if (in.direct) assert_int_equal(kvt__disk_read(f->d, 0, f->pool + 512, NULL, on_done, NULL), -EINVAL);
  ((kvt__record_hdr *)host(f, 0))->token_count = 3; /* inconsistent with F_TOKENS */
  assert_int_equal(kvt__disk_write(f->d, 0, host(f, 0), on_done, NULL), -EINVAL);
  assert_int_equal(kvt__disk_invalidate(f->d, SLOTS), -EINVAL);
  kvt__disk_cfg c = cfg_of(f, NS1);
  kvt__disk *d2 = NULL;
  c.slots = 0;
  assert_int_equal(kvt__disk_open(&c, &d2), -EINVAL);
  c = cfg_of(f, NS1);
  c.path = NULL;
  assert_int_equal(kvt__disk_open(&c, &d2), -EINVAL);
  assert_null(d2);
  kvt__disk_close(NULL);
}

/* ---- injected faults ---- */

typedef struct fault_plan {
  int site;
  int code;
  atomic_int left; /* how many more to inject */
} fault_plan;

static int fault_hook(void *ctx, int site, int64_t arg) {
  fault_plan *p = ctx;
  if (site != p->site) return 0;
  return atomic_fetch_sub(&p->left, 1) > 0 ? p->code : 0;
}

/* Eight writes in flight; the first completion to reach the hook is failed. */
static void completion_fault_case(fx *f, int code, int expect) {
  fault_plan p = {KVT_FAULT_IO_COMPLETE, code, 1};
  waiter *w = waiter_new();
  for (uint32_t i = 0; i < 8; i++) make_rec(host(f, i), 80 + i);
  kvt__fault_set(fault_hook, &p);
  for (uint32_t i = 0; i < 8; i++) assert_int_equal(write_async(f, w, i, i), 0);
  waiter_wait(w);
  kvt__fault_set(NULL, NULL);
  int failed = -1, n_failed = 0;
  for (int i = 0; i < 8; i++)
    if (w->status[i]) failed = i, n_failed++;
  assert_int_equal(n_failed, 1);
  assert_int_equal(w->status[failed], expect);
  for (uint32_t i = 0; i < 8; i++)
    if ((int)i != failed) assert_int_equal(read_sync(f, i, 80 + i), 0);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.io_errors, 1);
  assert_int_equal(st.writes, 7);
  /* The store goes on: the failed slot takes a new write. */
  assert_int_equal(write_sync(f, (uint32_t)failed, 99), 0);
  assert_int_equal(read_sync(f, (uint32_t)failed, 99), 0);
  free(w);
}

static void test_eio_on_one_write(void **state) { completion_fault_case(*state, -EIO, -EIO); }
static void test_enospc_on_one_write(void **state) { completion_fault_case(*state, -ENOSPC, -ENOSPC); }
static void test_short_write_is_eio(void **state) { completion_fault_case(*state, 4096, -EIO); }

/* A backend that refuses a request at submission fails only that request,
 * and its slot is not left busy. A small write is sealed and submitted in
 * the call, which returns the refusal; a big one is sealed and submitted on
 * a checksum thread, so done() reports it. Reads: always the call. */
static void submit_fault_case(fx *f, int big) {
  fault_plan p = {KVT_FAULT_IO_SUBMIT, -ENOSPC, 0};
  waiter *w = waiter_new();
  for (uint32_t i = 0; i < 4; i++) make_rec(host(f, i), 90 + i);
  kvt__fault_set(fault_hook, &p);
  assert_int_equal(write_async(f, w, 0, 0), 0);
  waiter_wait(w);
  atomic_store(&p.left, 1);
  assert_int_equal(write_async(f, w, 1, 1), big ? 0 : -ENOSPC);
  waiter_wait(w);
  assert_int_equal(atomic_load(&p.left), 0);
  assert_int_equal(write_async(f, w, 2, 2), 0);
  waiter_wait(w);
  assert_int_equal(w->n_done, big ? 3 : 2);
  assert_int_equal(w->status[0], 0);
  assert_int_equal(w->status[1], big ? -ENOSPC : 0);
  assert_int_equal(w->status[2], 0);
  atomic_store(&p.left, 1);
  kvt_key k0 = key_of(90);
  assert_int_equal(read_async(f, w, 0, 3, &k0), -ENOSPC); /* no done() */
  kvt__fault_set(NULL, NULL);
  assert_int_equal(w->n_done, big ? 3 : 2);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.io_errors, 2);
  assert_int_equal(st.writes, 2);
  assert_int_equal(read_sync(f, 0, 90), 0);
  assert_int_equal(read_sync(f, 2, 92), 0);
  assert_int_equal(read_sync(f, 1, 91), KVT_EMISMATCH); /* never written */
  assert_int_equal(write_sync(f, 1, 91), 0);            /* slot not left busy */
  assert_int_equal(read_sync(f, 1, 91), 0);
  free(w);
}

static void test_submit_fault_fails_only_that_request(void **state) { submit_fault_case(*state, 0); }

static void test_eio_on_read_then_read_again(void **state) {
  fx *f = *state;
  assert_int_equal(write_sync(f, 3, 5), 0);
  fault_plan p = {KVT_FAULT_IO_COMPLETE, -EIO, 1};
  kvt__fault_set(fault_hook, &p);
  assert_int_equal(read_sync(f, 3, 5), -EIO);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(read_sync(f, 3, 5), 0);
}

static void test_second_op_on_busy_slot(void **state) {
  fx *f = *state;
  fault_plan p = {KVT_FAULT_IO_DELAY_US, 100000, 1}; /* holds the first completion back */
  waiter *w = waiter_new();
  make_rec(host(f, 0), 1);
  make_rec(host(f, 1), 2);
  kvt__fault_set(fault_hook, &p);
  assert_int_equal(write_async(f, w, 4, 0), 0);
  assert_int_equal(kvt__disk_write(f->d, 4, host(f, 1), on_done, &g_ws[1]), KVT_EBUSY);
  waiter_wait(w);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(w->status[0], 0);
  assert_int_equal(read_sync(f, 4, 1), 0);
  free(w);
}

static void test_batches_fail_only_bad_entries(void **state) {
  fx *f = *state;
  waiter *w = waiter_new();
  kvt__disk_io io[10];
  for (uint32_t i = 0; i < 10; i++) {
    make_rec(host(f, i), 200 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .arg = &g_ws[i], .status = 12345};
  }
  io[3].slot = SLOTS;  /* out of range */
  io[7].slot = 6;      /* same slot as io[6], in the same batch: busy */
  pthread_mutex_lock(&w->m);
  w->pending = 8;
  pthread_mutex_unlock(&w->m);
  assert_int_equal(kvt__disk_write_batch(f->d, io, 10, on_done), 8);
  waiter_wait(w);
  assert_int_equal(io[3].status, -EINVAL);
  assert_int_equal(io[7].status, KVT_EBUSY);
  for (uint32_t i = 0; i < 10; i++)
    if (i != 3 && i != 7) assert_int_equal(io[i].status, 0), assert_int_equal(w->status[i], 0);
  memset(f->pool, 0, f->rec_bytes * 10);
  kvt_key keys[10];
  for (uint32_t i = 0; i < 10; i++) {
    keys[i] = key_of(200 + i);
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = 10;
  pthread_mutex_unlock(&w->m);
  assert_int_equal(kvt__disk_read_batch(f->d, io, 10, on_done), 10);
  waiter_wait(w);
  for (uint32_t i = 0; i < 10; i++) {
    int want = i == 3 || i == 7 ? KVT_EMISMATCH : 0; /* never written */
    assert_int_equal(w->status[i], want);
    if (!want) assert_true(rec_ok(host(f, i), 200 + i));
  }
  assert_int_equal(kvt__disk_write_batch(f->d, NULL, 1, on_done), -EINVAL);
  free(w);
}

/* ---- durable mode ---- */

/* Reopens the fixture's file as a durable store. */
static void reopen_durable(fx *f) {
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.durable = 1;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  uint64_t discarded;
  recover(f, &discarded);
}

/* What the sync hook and done() see: ops handed to fdatasync so far, and
 * done() calls so far. */
typedef struct sync_watch {
  atomic_int synced, done, syncs, bad, fail_left;
  atomic_int done_at_sync[64];
} sync_watch;

static sync_watch g_sw;

static int sync_hook(void *ctx, int site, int64_t arg) {
  sync_watch *w = ctx;
  if (site != KVT_FAULT_DISK_SYNC) return 0;
  int k = atomic_fetch_add(&w->syncs, 1);
  int done = atomic_load(&w->done);
  if (k < 64) atomic_store(&w->done_at_sync[k], done);
  /* Every op of the groups before this one has had its done() by now (the
   * same thread ran them), and none of this group's. */
  if (done != atomic_load(&w->synced)) atomic_store(&w->bad, 1);
  atomic_fetch_add(&w->synced, (int)arg);
  return atomic_fetch_sub(&w->fail_left, 1) > 0 ? -EIO : 0;
}

static void sync_checked_done(void *arg, int status) {
  /* This op's own group went through the hook before its done(). */
  if (atomic_fetch_add(&g_sw.done, 1) + 1 > atomic_load(&g_sw.synced)) atomic_store(&g_sw.bad, 1);
  on_done(arg, status);
}

static void write_group(fx *f, waiter *w, uint32_t n, uint64_t seed) {
  for (uint32_t i = 0; i < n; i++) make_rec(host(f, i), seed + i);
  for (uint32_t i = 0; i < n; i++) {
    g_ws[i] = (wslot){w, (int)i};
    pthread_mutex_lock(&w->m);
    w->pending++;
    pthread_mutex_unlock(&w->m);
    assert_int_equal(kvt__disk_write(f->d, i, host(f, i), sync_checked_done, &g_ws[i]), 0);
  }
  waiter_wait(w);
}

/* Durable: each write's done() comes after an fdatasync that the write's
 * completion preceded; completions that meet one group share one sync.
 * Tombstones too. Normal mode never syncs. */
static void test_durable_write_is_synced_before_done(void **state) {
  fx *f = *state;
  memset(&g_sw, 0, sizeof g_sw);
  kvt__fault_set(sync_hook, &g_sw);
  waiter *w = waiter_new();
  write_group(f, w, 8, 300); /* normal mode */
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.syncs, 0);
  assert_int_equal(atomic_load(&g_sw.syncs), 0);
  assert_int_equal(kvt__disk_invalidate(f->d, 7), 0);
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.syncs, 0);

  reopen_durable(f);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.ops, 16); /* writes waiting for a sync get headroom */
  memset(&g_sw, 0, sizeof g_sw);
  free(w);
  w = waiter_new();
  write_group(f, w, 8, 400);
  for (int i = 0; i < 8; i++) assert_int_equal(w->status[i], 0);
  assert_int_equal(atomic_load(&g_sw.bad), 0);
  assert_int_equal(atomic_load(&g_sw.synced), 8);
  kvt__disk_get_stats(f->d, &st);
  print_message("8 durable writes: %llu fdatasync calls\n", (unsigned long long)st.syncs);
  assert_true(st.syncs >= 1 && st.syncs <= 8);
  assert_int_equal(st.syncs, (uint64_t)atomic_load(&g_sw.syncs));
  assert_int_equal(st.writes, 8);
  assert_int_equal(st.io_errors, 0);
  uint64_t before = st.syncs;
  assert_int_equal(kvt__disk_invalidate(f->d, 7), 0);
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.syncs, before + 1);
  assert_int_equal(st.invalidates, 1);
  kvt__fault_set(NULL, NULL);
  for (uint32_t i = 0; i < 7; i++) assert_int_equal(read_sync(f, i, 400 + i), 0);
  assert_int_equal(read_sync(f, 7, 407), KVT_EMISMATCH);
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.syncs, before + 1); /* reads never sync */
  /* What was synced is there after a reopen. */
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.durable = 1;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  found r = recover(f, NULL);
  assert_int_equal(r.n, 7);
  for (uint32_t i = 0; i < 7; i++) assert_true(found_slot(&r, i, 400 + i));
  free(w);
}

/* A failed fdatasync fails every write of its group with its error (each
 * counted as an I/O error, none as written); the slots take new writes,
 * and the store syncs again. */
static void test_durable_failed_sync_fails_its_group(void **state) {
  fx *f = *state;
  reopen_durable(f);
  memset(&g_sw, 0, sizeof g_sw);
  atomic_store(&g_sw.fail_left, 1);
  kvt__fault_set(sync_hook, &g_sw);
  waiter *w = waiter_new();
  write_group(f, w, 8, 500);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(atomic_load(&g_sw.bad), 0);
  int n_failed = 0;
  for (int i = 0; i < 8; i++) {
    assert_true(w->status[i] == 0 || w->status[i] == -EIO);
    n_failed += w->status[i] != 0;
  }
  /* The first group failed: it held at least one write, and only it. */
  int first = atomic_load(&g_sw.syncs) > 1 ? atomic_load(&g_sw.done_at_sync[1]) : 8;
  assert_true(n_failed >= 1);
  assert_int_equal(n_failed, first);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.io_errors, (uint64_t)n_failed);
  assert_int_equal(st.writes, (uint64_t)(8 - n_failed));
  for (uint32_t i = 0; i < 8; i++)
    if (w->status[i] != 0) {
      assert_int_equal(write_sync(f, i, 600 + i), 0);
      assert_int_equal(read_sync(f, i, 600 + i), 0);
    } else {
      assert_int_equal(read_sync(f, i, 500 + i), 0);
    }
  free(w);
}

/* ---- checksum threads ---- */

/* Opens the fixture's store (closed) asking for n checksum threads, and
 * returns what it reports. */
static kvt__disk_info open_asking_threads(fx *f, uint32_t n) {
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.checksum_threads = n;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  return in;
}

/* Reopens the fixture as a fresh store of BIG_PAYLOAD records (hashed on
 * n checksum threads); keep_file reopens the same file. */
static void reopen_big(fx *f, uint32_t n, int keep_file) {
  kvt__disk_close(f->d);
  if (!keep_file) {
    unlink(f->path);
    free(f->pool);
    g_payload = BIG_PAYLOAD;
    f->rec_bytes = kvt__record_bytes(BT, BIG_PAYLOAD);
    f->pool = aligned_alloc(4096, f->rec_bytes * SLOTS);
  }
  assert_int_equal(open_asking_threads(f, n).checksum_threads, n);
}

/* A done() that holds its thread until the test lets it go. */
typedef struct gate {
  pthread_mutex_t m;
  pthread_cond_t c;
  int entered, open, left, status;
} gate;

static void gated_done(void *arg, int status) {
  gate *g = arg;
  pthread_mutex_lock(&g->m);
  g->entered = 1;
  g->status = status;
  pthread_cond_broadcast(&g->c);
  while (!g->open) pthread_cond_wait(&g->c, &g->m);
  g->left = 1;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
}

static void gate_wait(gate *g, int *flag) {
  pthread_mutex_lock(&g->m);
  while (!*flag) pthread_cond_wait(&g->c, &g->m);
  pthread_mutex_unlock(&g->m);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->m);
  g->open = 1;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
  gate_wait(g, &g->left);
}

/* Writes are sealed on several threads at once, but the newest call wins:
 * seq is taken in call order, so recovery keeps the last write of a key. */
static void test_newest_call_wins_with_parallel_sealing(void **state) {
  fx *f = *state;
  reopen_big(f, 4, 0);
  waiter *w = waiter_new();
  kvt__disk_io io[SLOTS];
  for (uint32_t i = 0; i < SLOTS; i++) {
    make_rec(host(f, i), 300 + i);
    ((kvt__record_hdr *)host(f, i))->key = key_of(300); /* one key, SLOTS copies */
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = SLOTS;
  pthread_mutex_unlock(&w->m);
  for (uint32_t i = 0; i < SLOTS; i += 4) assert_int_equal(kvt__disk_write_batch(f->d, io + i, 4, on_done), 4);
  waiter_wait(w);
  for (uint32_t i = 0; i < SLOTS; i++) assert_int_equal(w->status[i], 0);
  reopen_big(f, 4, 1);
  uint64_t discarded = 0;
  found r = recover(f, &discarded);
  assert_int_equal(r.n, 1);
  assert_int_equal(r.slot[0], SLOTS - 1);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.superseded, SLOTS - 1);
  free(w);
}

static void test_submit_fault_of_a_sealed_write_reaches_done(void **state) {
  reopen_big(*state, 2, 0);
  submit_fault_case(*state, 1);
}

/* Checksums of big records (sealed on the checksum threads, verified on
 * the reaper) still catch every corruption. */
static void test_flipped_byte_of_a_big_record(void **state) {
  fx *f = *state;
  reopen_big(f, 2, 0);
  flip_case(f, kvt__record_prefix_bytes(BT) + BIG_PAYLOAD - 1);
}

/* ---- never-waiting batches ---- */

/* Holds the reaper inside its first reaped completion until released, so
 * every op in flight stays taken: the queue is full for as long as we like. */
typedef struct reap_hold {
  pthread_mutex_t m;
  pthread_cond_t c;
  int held, released;
} reap_hold;

static int hold_hook(void *ctx, int site, int64_t arg) {
  reap_hold *h = ctx;
  if (site != KVT_FAULT_IO_DELAY_US) return 0;
  pthread_mutex_lock(&h->m);
  h->held = 1;
  pthread_cond_broadcast(&h->c);
  while (!h->released) pthread_cond_wait(&h->c, &h->m);
  pthread_mutex_unlock(&h->m);
  return 0;
}

/* Waits until the reaper is held (when any of the n reads was queued),
 * lets `us` pass, lets it go, and waits for every read queued (q of n)
 * with the fault hook cleared: a test asserts only after this, so a failed
 * assert never leaves the reaper held. */
static void release_reaper(reap_hold *h, waiter *w, int n, int q, useconds_t us) {
  if (q > 0) {
    pthread_mutex_lock(&h->m);
    while (!h->held) pthread_cond_wait(&h->c, &h->m);
    pthread_mutex_unlock(&h->m);
    usleep(us);
  }
  pthread_mutex_lock(&h->m);
  h->released = 1;
  pthread_cond_broadcast(&h->c);
  pthread_mutex_unlock(&h->m);
  pthread_mutex_lock(&w->m);
  w->pending -= n - (q > 0 ? q : 0);
  pthread_mutex_unlock(&w->m);
  waiter_wait(w);
  kvt__fault_set(NULL, NULL);
}

/* What each read's done() saw: the store's verified reads so far, and
 * the thread it ran on. */
typedef struct seen_read {
  waiter *w;
  kvt__disk *d;
  int i;
  uint64_t reads_then;
  char thread[16];
} seen_read;

static void seen_done(void *arg, int status) {
  seen_read *r = arg;
  kvt__disk_stats st;
  kvt__disk_get_stats(r->d, &st);
  r->reads_then = st.reads;
  pthread_getname_np(pthread_self(), r->thread, sizeof r->thread);
  on_done(&(wslot){r->w, r->i}, status);
}

/* Landed reads of big records are verified on the reaper, each finished
 * before the next is hashed: with the reaper held so that reads land
 * together, the k-th done() sees k verified reads (hashing a whole batch
 * before the first done() would show more), every one on the reaper, and
 * each read byte-exact (one asks for another key and fails alone). */
static void test_big_reads_finish_one_at_a_time_on_the_reaper(void **state) {
  fx *f = *state;
  enum { N = 8, WRONG = 5 };
  reopen_big(f, 2, 0);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(write_sync(f, i, 900 + i), 0);
  kvt__disk_stats st0;
  kvt__disk_get_stats(f->d, &st0);
  reap_hold h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  waiter *w = waiter_new();
  static seen_read seen[N];
  kvt__disk_io io[N];
  kvt_key keys[N];
  memset(f->pool, 0, f->rec_bytes * N);
  for (uint32_t i = 0; i < N; i++) {
    keys[i] = key_of(i == WRONG ? 999 : 900 + i);
    seen[i] = (seen_read){w, f->d, (int)i, 0, ""};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &seen[i]};
  }
  w->pending = N;
  kvt__fault_set(hold_hook, &h);
  int q = kvt__disk_read_batch(f->d, io, N, seen_done);
  release_reaper(&h, w, N, q, 50000); /* the others land meanwhile: the next reap takes them together */
  assert_int_equal(q, N);
  /* The reads that passed saw 1, 2, ... 7 verified reads, each count once;
   * the mismatch (not counted as a read) saw how many passed before it. */
  int counted[N] = {0};
  for (uint32_t i = 0; i < N; i++) {
    assert_string_equal(seen[i].thread, "kvt-disk-reap");
    assert_int_equal(w->status[i], i == WRONG ? KVT_EMISMATCH : 0);
    uint64_t k = seen[i].reads_then - st0.reads;
    if (i == WRONG) {
      assert_in_range(k, 0, N - 1);
      continue;
    }
    assert_true(rec_ok(host(f, i), 900 + i));
    assert_in_range(k, 1, N - 1);
    assert_int_equal(counted[k]++, 0);
  }
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.reads - st0.reads, N - 1);
  assert_int_equal(st.mismatches - st0.mismatches, 1);
  free(w);
}

/* The first read to finish starts two blocking reads from its done(), on
 * the reaper, with every op taken (2 checksum threads: 8 + 2 ops, 10 reads
 * queued): the first takes the op that read just gave back, the second
 * gets KVT_EAGAIN instead of waiting for an op only the reaper can free. */
static fx *g_df;
static waiter *g_dw;
static int g_drc[2];
static kvt_key g_dkeys[2];
static atomic_int g_donce;

static void reading_done(void *arg, int status) {
  if (!atomic_exchange(&g_donce, 1)) {
    for (int j = 0; j < 2; j++) {
      g_drc[j] = kvt__disk_read(g_df->d, 10 + j, host(g_df, 10 + j), &g_dkeys[j], on_done, &g_ws[10 + j]);
      if (g_drc[j] == 0) {
        pthread_mutex_lock(&g_dw->m);
        g_dw->pending++;
        pthread_mutex_unlock(&g_dw->m);
      }
    }
  }
  on_done(arg, status);
}

static void test_a_read_done_may_start_reads(void **state) {
  fx *f = *state;
  enum { N = 8 + 2 }; /* depth 8, one op of headroom for each of 2 checksum threads */
  reopen_big(f, 2, 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.ops, N);
  for (uint32_t i = 0; i < N + 2; i++) assert_int_equal(write_sync(f, i, 820 + i), 0);
  reap_hold h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  waiter *w = waiter_new();
  g_df = f, g_dw = w, g_drc[0] = g_drc[1] = 1;
  atomic_store(&g_donce, 0);
  kvt__disk_io io[N];
  kvt_key keys[N];
  memset(f->pool, 0, f->rec_bytes * (N + 2));
  for (uint32_t i = 0; i < N + 2; i++) {
    if (i < N) keys[i] = key_of(820 + i);
    else g_dkeys[i - N] = key_of(820 + i);
    g_ws[i] = (wslot){w, (int)i};
    if (i < N) io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  w->pending = N;
  kvt__fault_set(hold_hook, &h);
  int q = kvt__disk_read_batch(f->d, io, N, reading_done);
  release_reaper(&h, w, N, q, 20000);
  assert_int_equal(q, N);
  assert_int_equal(g_drc[0], 0);
  assert_int_equal(g_drc[1], KVT_EAGAIN);
  for (uint32_t i = 0; i < N + 1; i++) {
    assert_int_equal(w->status[i], 0);
    assert_true(rec_ok(host(f, i), 820 + i));
  }
  free(w);
}

static void test_try_batch_never_waits(void **state) {
  fx *f = *state;
  enum { N = 12, DEPTH = 8 }; /* cfg_of: queue_depth 8 */
  for (uint32_t i = 0; i < N; i++) assert_int_equal(write_sync(f, i, 400 + i), 0);
  reap_hold h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  waiter *w = waiter_new();
  kvt__disk_io io[N];
  kvt_key keys[N];
  memset(f->pool, 0, f->rec_bytes * N);
  for (uint32_t i = 0; i < N; i++) {
    keys[i] = key_of(400 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = DEPTH;
  pthread_mutex_unlock(&w->m);
  kvt__fault_set(hold_hook, &h);
  int q = kvt__disk_try_read_batch(f->d, io, N, on_done);
  release_reaper(&h, w, DEPTH, q, 0);
  assert_int_equal(q, DEPTH);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(io[i].status, i < DEPTH ? 0 : KVT_EAGAIN);
  pthread_mutex_lock(&w->m);
  w->pending = N - DEPTH;
  pthread_mutex_unlock(&w->m);
  assert_int_equal(kvt__disk_try_read_batch(f->d, io + DEPTH, N - DEPTH, on_done), N - DEPTH);
  waiter_wait(w);
  for (uint32_t i = 0; i < N; i++) {
    assert_int_equal(w->status[i], 0);
    assert_true(rec_ok(host(f, i), 400 + i));
  }
  assert_int_equal(kvt__disk_try_read_batch(NULL, io, 1, on_done), -EINVAL);
  free(w);
}

/* Queue depth 0 takes enough I/Os for 16 MiB of small records at the disk,
 * and for about 12 MiB of records of 256 KiB and more (the nearest count),
 * 8 to 256 of them: small records keep the disk as busy as large ones, and
 * large ones pin no more buffers than that takes. A durable store keeps at
 * least 32, for its group syncs. The store then reads and writes at that
 * depth like at any other. */
static void test_default_queue_depth_follows_record_size(void **state) {
  fx *f = *state;
  assert_int_equal(kvt__disk_auto_depth(8u << 20, 0), 8); /* 64 MiB: never under 8 */
  assert_int_equal(kvt__disk_auto_depth((2u << 20) + 4096, 0), 8);
  assert_int_equal(kvt__disk_auto_depth(4u << 20, 0), 8);
  assert_int_equal(kvt__disk_auto_depth(1u << 20, 0), 12);
  assert_int_equal(kvt__disk_auto_depth((896u + 4) << 10, 0), 14); /* 13.65: the nearest */
  assert_int_equal(kvt__disk_auto_depth(260u << 10, 0), 47);
  assert_int_equal(kvt__disk_auto_depth(256u << 10, 0), 48);
  assert_int_equal(kvt__disk_auto_depth(255u << 10, 0), 64); /* small: 16 MiB */
  assert_int_equal(kvt__disk_auto_depth(64u << 10, 0), 256);
  assert_int_equal(kvt__disk_auto_depth(16u << 10, 0), 256); /* never over 256 */
  assert_int_equal(kvt__disk_auto_depth(4096, 0), 256);
  assert_int_equal(kvt__disk_auto_depth(0, 0), 256);
  assert_int_equal(kvt__disk_auto_depth((2u << 20) + 4096, 1), 32); /* durable: never under 32 */
  assert_int_equal(kvt__disk_auto_depth(64u << 10, 1), 256);
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.queue_depth = 0;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.queue_depth, kvt__disk_auto_depth(f->rec_bytes, 0));
  assert_true(in.queue_depth > 8);
  assert_true(in.ops >= in.queue_depth);
  /* Durable stores of 2 MiB records (a file of their own): 32 by default,
   * a depth set stays as set. */
  char path[4300];
  snprintf(path, sizeof path, "%s.durable", f->path);
  kvt__disk_cfg dc = c;
  kvt__disk *dd;
  dc.path = path, dc.payload_bytes = 2u << 20, dc.slots = 2, dc.reset = 1, dc.durable = 1;
  dc.bufs = NULL, dc.buf_lens = NULL, dc.n_bufs = 0;
  /* Each store is closed before its asserts: a failed one leaves no
   * threads behind for the tests after it. */
  assert_int_equal(kvt__disk_open(&dc, &dd), 0);
  kvt__disk_get_info(dd, &in);
  kvt__disk_close(dd);
  assert_int_equal(in.queue_depth, 32);
  assert_int_equal(in.ops, 32 + in.checksum_threads + 32); /* disk, checksums, syncs */
  dc.queue_depth = 4, dc.checksum_threads = 8;
  assert_int_equal(kvt__disk_open(&dc, &dd), 0);
  kvt__disk_get_info(dd, &in);
  kvt__disk_close(dd);
  assert_int_equal(in.queue_depth, 4);
  assert_int_equal(in.checksum_threads, 8);
  assert_int_equal(in.ops, 4 + 4 + 4); /* headroom capped at the depth */
  dc.queue_depth = 0, dc.durable = 0, dc.checksum_threads = 0;
  assert_int_equal(kvt__disk_open(&dc, &dd), 0);
  kvt__disk_get_info(dd, &in);
  kvt__disk_close(dd);
  assert_int_equal(in.queue_depth, 8);
  assert_int_equal(in.ops, 8 + in.checksum_threads); /* 2 to 4 threads by default */
  assert_int_equal(in.scan_width, 64); /* a reopen's scan stays 64 reads deep */
  unlink(path);
  for (uint32_t i = 0; i < SLOTS; i++) assert_int_equal(write_sync(f, i, 700 + i), 0);
  waiter *w = waiter_new();
  kvt__disk_io io[SLOTS];
  kvt_key keys[SLOTS];
  memset(f->pool, 0, f->rec_bytes * SLOTS);
  for (uint32_t i = 0; i < SLOTS; i++) {
    keys[i] = key_of(700 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = SLOTS;
  pthread_mutex_unlock(&w->m);
  /* With the reaper held, a never-waiting batch takes as many reads as the
   * disk may have: all of them (at depth 8 it would take 8). */
  reap_hold h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  kvt__fault_set(hold_hook, &h);
  int q = kvt__disk_try_read_batch(f->d, io, SLOTS, on_done);
  release_reaper(&h, w, SLOTS, q, 0);
  assert_int_equal(q, SLOTS);
  for (uint32_t i = 0; i < SLOTS; i++) {
    assert_int_equal(w->status[i], 0);
    assert_true(rec_ok(host(f, i), 700 + i));
  }
  free(w);
}

/* Big records get one more op per checksum thread (a write holds its op
 * while a checksum thread seals it, a read that landed while the reaper
 * verifies it, and I/Os wait in the disk queue for room): with the reaper held
 * (every op stays taken), a never-waiting batch queues 8 + 2, and each
 * of those reads is verified on its own (one asks for another key and
 * fails alone). */
static void test_hashed_records_get_headroom(void **state) {
  fx *f = *state;
  enum { DEPTH = 8, OPS = DEPTH + 2, N = 2 * OPS, WRONG = 5 };
  reopen_big(f, 2, 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.queue_depth, DEPTH);
  assert_int_equal(in.ops, OPS);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(write_sync(f, i, 500 + i), 0);
  reap_hold h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  waiter *w = waiter_new();
  kvt__disk_io io[N];
  kvt_key keys[N];
  memset(f->pool, 0, f->rec_bytes * N);
  for (uint32_t i = 0; i < N; i++) {
    keys[i] = key_of(i == WRONG ? 999 : 500 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = OPS;
  pthread_mutex_unlock(&w->m);
  kvt__fault_set(hold_hook, &h);
  int q = kvt__disk_try_read_batch(f->d, io, N, on_done);
  release_reaper(&h, w, OPS, q, 0);
  assert_int_equal(q, OPS);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(io[i].status, i < OPS ? 0 : KVT_EAGAIN);
  pthread_mutex_lock(&w->m);
  w->pending = N - OPS;
  pthread_mutex_unlock(&w->m);
  assert_int_equal(kvt__disk_try_read_batch(f->d, io + OPS, N - OPS, on_done), N - OPS);
  waiter_wait(w);
  for (uint32_t i = 0; i < N; i++) {
    assert_int_equal(w->status[i], i == WRONG ? KVT_EMISMATCH : 0);
    if (i != WRONG) assert_true(rec_ok(host(f, i), 500 + i));
  }
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.reads, N - 1);
  assert_int_equal(st.mismatches, 1);
  free(w);
}

/* The headroom follows the checksum threads (one op each), never more
 * than the queue depth again: more would only hold more of the caller's
 * buffers. */
static void test_headroom_follows_checksum_threads(void **state) {
  fx *f = *state;
  static const uint32_t threads[] = {1, 3, 4, 8}, ops[] = {8 + 1, 8 + 3, 8 + 4, 8 + 8};
  kvt__disk_info in;
  for (unsigned i = 0; i < sizeof threads / sizeof threads[0]; i++) {
    reopen_big(f, threads[i], i > 0);
    kvt__disk_get_info(f->d, &in);
    assert_int_equal(in.queue_depth, 8);
    assert_int_equal(in.ops, ops[i]);
  }
  /* Asked for more checksum threads than the store runs: as many as it
   * runs (8), one op each (a depth under 8 caps it: see
   * test_default_queue_depth_follows_record_size). */
  kvt__disk_close(f->d);
  in = open_asking_threads(f, 100);
  assert_int_equal(in.checksum_threads, 8);
  assert_int_equal(in.ops, 8 + 8);
  /* Every op usable: a whole headroom of reads, each verified. */
  for (uint32_t i = 0; i < in.ops; i++) assert_int_equal(write_sync(f, i, 800 + i), 0);
  waiter *w = waiter_new();
  kvt__disk_io io[SLOTS];
  kvt_key keys[SLOTS];
  memset(f->pool, 0, f->rec_bytes * in.ops);
  for (uint32_t i = 0; i < in.ops; i++) {
    keys[i] = key_of(800 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = (int)in.ops;
  pthread_mutex_unlock(&w->m);
  assert_int_equal(kvt__disk_try_read_batch(f->d, io, in.ops, on_done), (int)in.ops);
  waiter_wait(w);
  for (uint32_t i = 0; i < in.ops; i++) {
    assert_int_equal(w->status[i], 0);
    assert_true(rec_ok(host(f, i), 800 + i));
  }
  free(w);
}

/* With the headroom's reads all in flight, an I/O error on one of them
 * fails that block alone; the others are verified and returned. */
static void test_eio_on_one_read_of_a_full_hashed_queue(void **state) {
  fx *f = *state;
  enum { OPS = 10 }; /* queue_depth 8 + one op for each of 2 checksum threads */
  reopen_big(f, 2, 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.ops, OPS);
  for (uint32_t i = 0; i < OPS; i++) assert_int_equal(write_sync(f, i, 600 + i), 0);
  fault_plan p = {KVT_FAULT_IO_COMPLETE, -EIO, 1};
  waiter *w = waiter_new();
  kvt__disk_io io[OPS];
  kvt_key keys[OPS];
  memset(f->pool, 0, f->rec_bytes * OPS);
  for (uint32_t i = 0; i < OPS; i++) {
    keys[i] = key_of(600 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  pthread_mutex_lock(&w->m);
  w->pending = OPS;
  pthread_mutex_unlock(&w->m);
  kvt__fault_set(fault_hook, &p);
  assert_int_equal(kvt__disk_read_batch(f->d, io, OPS, on_done), OPS);
  waiter_wait(w);
  kvt__fault_set(NULL, NULL);
  int n_failed = 0;
  for (uint32_t i = 0; i < OPS; i++) {
    if (w->status[i]) {
      assert_int_equal(w->status[i], -EIO);
      n_failed++;
    } else {
      assert_true(rec_ok(host(f, i), 600 + i));
    }
  }
  assert_int_equal(n_failed, 1);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.io_errors, 1);
  assert_int_equal(st.reads, OPS - 1);
  free(w);
}

/* Counts I/Os between the two fault sites every request passes (its
 * submission and its completion), and the most at once. */
typedef struct disk_count {
  atomic_int now, most, done;
} disk_count;

static int count_hook(void *ctx, int site, int64_t arg) {
  (void)arg;
  disk_count *n = ctx;
  if (site == KVT_FAULT_IO_SUBMIT) {
    int v = atomic_fetch_add(&n->now, 1) + 1, m = atomic_load(&n->most);
    while (v > m && !atomic_compare_exchange_weak(&n->most, &m, v)) {
    }
  } else if (site == KVT_FAULT_IO_COMPLETE) {
    atomic_fetch_sub(&n->now, 1);
    atomic_fetch_add(&n->done, 1);
  }
  return 0;
}

/* The first read to finish holds the reaper in its done() (gated), the
 * others report to their waiter. */
static gate *g_first;
static atomic_int g_first_taken;

static void first_held_done(void *arg, int status) {
  if (!atomic_exchange(&g_first_taken, 1)) gated_done(g_first, status);
  on_done(arg, status);
}

/* At most queue_depth I/Os are at the disk, writes and reads; the ops over
 * it wait in the store and go as I/Os come back, sent by the reaper before
 * it verifies what landed: when the first read's done() runs (and holds the
 * reaper there), at least one of the 2 reads of headroom (2 checksum
 * threads) has been sent after the 8; all 10 verify byte-exact once it is
 * let go. */
static void test_disk_gets_queue_depth_and_refills_before_checksums(void **state) {
  fx *f = *state;
  enum { DEPTH = 8, N = DEPTH + 2 };
  reopen_big(f, 2, 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.ops, N);
  disk_count wc = {0};
  waiter *w = waiter_new();
  kvt__disk_io io[N];
  kvt_key keys[N];
  for (uint32_t i = 0; i < N; i++) {
    make_rec(host(f, 3 + i), 700 + i);
    g_ws[i] = (wslot){w, (int)i};
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, 3 + i), .arg = &g_ws[i]};
  }
  w->pending = N;
  kvt__fault_set(count_hook, &wc);
  assert_int_equal(kvt__disk_write_batch(f->d, io, N, on_done), N);
  waiter_wait(w);
  kvt__fault_set(NULL, NULL);
  assert_in_range(atomic_load(&wc.most), 1, DEPTH);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(w->status[i], 0);
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
  g_first = &g;
  atomic_store(&g_first_taken, 0);
  disk_count rc = {0};
  for (uint32_t i = 0; i < N; i++) {
    keys[i] = key_of(700 + i);
    memset(host(f, 3 + i), 0, f->rec_bytes);
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, 3 + i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  w->n_done = 0;
  w->pending = N;
  kvt__fault_set(count_hook, &rc);
  int q = kvt__disk_read_batch(f->d, io, N, first_held_done);
  int sent = 0;
  if (q > 0) {
    gate_wait(&g, &g.entered); /* the reaper is in the first done() */
    sent = atomic_load(&rc.now) + atomic_load(&rc.done);
    gate_open(&g); /* before any assert: a failed one must not leave the reaper held */
  }
  pthread_mutex_lock(&w->m);
  w->pending -= N - (q > 0 ? q : 0);
  pthread_mutex_unlock(&w->m);
  waiter_wait(w);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(q, N);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(io[i].status, 0);
  assert_int_equal(g.status, 0);
  assert_in_range(sent, DEPTH + 1, N);
  assert_int_equal(atomic_load(&rc.done), N);
  assert_int_equal(atomic_load(&rc.most), DEPTH);
  for (uint32_t i = 0; i < N; i++) {
    assert_int_equal(w->status[i], 0);
    assert_true(rec_ok(host(f, 3 + i), 700 + i));
  }
  free(w);
}

/* Holds the reaper like hold_hook, and refuses the next `refuse`
 * submissions. */
typedef struct hold_refuse {
  reap_hold h;
  atomic_int refuse;
} hold_refuse;

static int hold_refuse_hook(void *ctx, int site, int64_t arg) {
  hold_refuse *r = ctx;
  if (site == KVT_FAULT_IO_SUBMIT) return atomic_fetch_sub(&r->refuse, 1) > 0 ? -ENOSPC : 0;
  return hold_hook(&r->h, site, arg);
}

/* A read that waited for room at the disk and is refused when the reaper
 * sends it fails alone, through its done() (its caller was told it was
 * accepted), and leaves its slot free; the other reads land byte-exact. */
static void test_refused_queued_read_fails_alone_through_done(void **state) {
  fx *f = *state;
  enum { N = 10, DEPTH = 8 }; /* every op: 8 at the disk, 1 for each of 2 checksum threads */
  reopen_big(f, 2, 0);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(write_sync(f, i, 800 + i), 0);
  hold_refuse r = {{PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0}, 0};
  waiter *w = waiter_new();
  kvt__disk_io io[N];
  kvt_key keys[N];
  for (uint32_t i = 0; i < N; i++) {
    keys[i] = key_of(800 + i);
    g_ws[i] = (wslot){w, (int)i};
    memset(host(f, 3 + i), 0, f->rec_bytes);
    io[i] = (kvt__disk_io){.slot = i, .rec = host(f, 3 + i), .expected_key = &keys[i], .arg = &g_ws[i]};
  }
  w->pending = N;
  kvt__fault_set(hold_refuse_hook, &r);
  int q = kvt__disk_try_read_batch(f->d, io, N, on_done); /* 8 at the disk, 2 waiting */
  if (q > 0) {
    pthread_mutex_lock(&r.h.m);
    while (!r.h.held) pthread_cond_wait(&r.h.c, &r.h.m); /* the reaper holds the first completion */
    pthread_mutex_unlock(&r.h.m);
    atomic_store(&r.refuse, 1); /* the first read it sends is refused */
  }
  release_reaper(&r.h, w, N, q, 0); /* asserts only after: a failed one leaves nothing held */
  assert_int_equal(q, N);
  for (uint32_t i = 0; i < N; i++) assert_int_equal(io[i].status, 0);
  for (uint32_t i = 0; i < N; i++) {
    assert_int_equal(w->status[i], i == DEPTH ? -ENOSPC : 0); /* the oldest waiting one */
    if (i != DEPTH) assert_true(rec_ok(host(f, 3 + i), 800 + i));
  }
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.io_errors, 1);
  assert_int_equal(st.reads, N - 1);
  assert_int_equal(read_sync(f, DEPTH, 800 + DEPTH), 0); /* slot not left busy */
  free(w);
}

/* By default big records get two to four checksum threads (two on a
 * small machine), which seal writes. */
static void test_default_checksum_threads(void **state) {
  fx *f = *state;
  reopen_big(f, 1, 0);
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.checksum_threads = 0;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_in_range(in.checksum_threads, 2, 4);
  assert_int_equal(write_sync(f, 0, 77), 0);
  waiter *w = waiter_new();
  kvt_key k = key_of(77);
  memset(host(f, 1), 0, f->rec_bytes);
  assert_int_equal(read_async(f, w, 0, 1, &k), 0);
  waiter_wait(w);
  assert_int_equal(w->status[1], 0);
  assert_true(rec_ok(host(f, 1), 77));
  free(w);
}

/* Small records are hashed in place and hold no op while hashed: no headroom. */
static void test_small_records_get_no_headroom(void **state) {
  fx *f = *state;
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.checksum_threads, 0);
  assert_int_equal(in.queue_depth, 8);
  assert_int_equal(in.ops, 8);
  /* Checksum threads asked for: none run, and no headroom. */
  kvt__disk_close(f->d);
  in = open_asking_threads(f, 4);
  assert_int_equal(in.checksum_threads, 0);
  assert_int_equal(in.ops, 8);
}

/* ---- records in pieces ---- */

/* A record split as storage mode splits it: the prefix in one page, the
 * payload (padded to whole pages) as one iovec per page, laid out in
 * reverse page order in `pay`, so no two iovecs are adjacent. */
typedef struct pieces {
  char *prefix, *pay;
  uint32_t n_pages, n_iov;
  struct iovec iov[1 + 160];
} pieces;

static void pieces_init(fx *f, pieces *p) {
  p->n_pages = (uint32_t)((f->rec_bytes - kvt__record_prefix_bytes(BT)) / 4096);
  assert_true(p->n_pages + 1 <= sizeof p->iov / sizeof p->iov[0]);
  p->prefix = aligned_alloc(4096, kvt__record_prefix_bytes(BT));
  p->pay = aligned_alloc(4096, (size_t)p->n_pages * 4096);
  p->iov[0] = (struct iovec){p->prefix, kvt__record_prefix_bytes(BT)};
  for (uint32_t k = 0; k < p->n_pages; k++)
    p->iov[1 + k] = (struct iovec){p->pay + (size_t)(p->n_pages - 1 - k) * 4096, 4096};
  p->n_iov = 1 + p->n_pages;
}

static void pieces_free(pieces *p) {
  free(p->prefix);
  free(p->pay);
}

/* The record image `rec` into the pieces, or the pieces into `rec`. */
static void pieces_scatter(fx *f, pieces *p, char *rec, int into_rec) {
  size_t off = 0;
  for (uint32_t k = 0; k < p->n_iov; off += p->iov[k].iov_len, k++) {
    if (into_rec) memcpy(rec + off, p->iov[k].iov_base, p->iov[k].iov_len);
    else memcpy(p->iov[k].iov_base, rec + off, p->iov[k].iov_len);
  }
  assert_int_equal(off, f->rec_bytes);
}

/* The record in the first n_iov pieces, written or read (zero_tail: a read
 * in part) as one I/O; its status or done()'s. */
static int pieces_part_io(fx *f, pieces *p, int write, uint32_t slot, uint64_t seed, uint32_t n_iov, int zero_tail) {
  waiter *w = waiter_new();
  kvt_key k = key_of(seed);
  g_ws[0] = (wslot){w, 0};
  kvt__disk_io io = {.slot = slot, .expected_key = &k, .arg = &g_ws[0], .iov = p->iov, .n_iov = n_iov,
                     .zero_tail = zero_tail};
  start(w, 0, 0);
  int rc = write ? kvt__disk_write_batch(f->d, &io, 1, on_done) : kvt__disk_read_batch(f->d, &io, 1, on_done);
  assert_int_equal(rc, io.status ? 0 : 1);
  if (io.status) {
    pthread_mutex_lock(&w->m);
    w->pending--;
    pthread_mutex_unlock(&w->m);
  }
  waiter_wait(w);
  rc = io.status ? io.status : w->status[0];
  free(w);
  return rc;
}

static int pieces_io(fx *f, pieces *p, int write, uint32_t slot, uint64_t seed) {
  return pieces_part_io(f, p, write, slot, seed, p->n_iov, 0);
}

static int pieces_write(fx *f, pieces *p, uint32_t slot, uint64_t seed) {
  make_rec(host(f, 4), seed);
  pieces_scatter(f, p, host(f, 4), 0);
  return pieces_io(f, p, 1, slot, seed);
}

/* Reads slot into the pieces and checks them against seed's record. */
static int pieces_read(fx *f, pieces *p, uint32_t slot, uint64_t seed) {
  memset(p->prefix, 0xee, p->iov[0].iov_len);
  memset(p->pay, 0xee, (size_t)p->n_pages * 4096);
  int rc = pieces_io(f, p, 0, slot, seed);
  if (rc) return rc;
  memset(host(f, 5), 0, f->rec_bytes);
  pieces_scatter(f, p, host(f, 5), 1);
  return rec_ok(host(f, 5), seed) ? 0 : -9999;
}

/* A record written in pieces reads back whole and in pieces, and one
 * written whole reads back in pieces; recovery finds both. */
static void pieces_case(fx *f) {
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  assert_int_equal(in.vectored, 1);
  pieces p;
  pieces_init(f, &p);
  assert_int_equal(pieces_write(f, &p, 2, 61), 0);
  assert_int_equal(read_sync(f, 2, 61), 0);
  assert_int_equal(pieces_read(f, &p, 2, 61), 0);
  assert_int_equal(write_sync(f, 7, 62), 0);
  assert_int_equal(pieces_read(f, &p, 7, 62), 0);
  assert_int_equal(pieces_read(f, &p, 7, 61), KVT_EMISMATCH);
  reopen(f, NS1);
  found r = recover(f, NULL);
  assert_int_equal(r.n, 2);
  assert_true(found_slot(&r, 2, 61));
  assert_true(found_slot(&r, 7, 62));
  assert_int_equal(pieces_read(f, &p, 2, 61), 0);
  pieces_free(&p);
}

static void test_pieces_round_trip_both_ways(void **state) { pieces_case(*state); }

static void test_pieces_round_trip_of_a_big_record(void **state) {
  fx *f = *state;
  reopen_big(f, 2, 0); /* sealed on the checksum threads, verified on the reaper */
  pieces_case(f);
}

/* Checksums over the pieces catch a flipped byte; injected I/O errors and
 * short transfers fail the one request. */
static void test_pieces_fail_like_records(void **state) {
  fx *f = *state;
  pieces p;
  pieces_init(f, &p);
  assert_int_equal(pieces_write(f, &p, 3, 71), 0);
  assert_int_equal(pieces_write(f, &p, 4, 72), 0);
  poke(f, 3, kvt__record_prefix_bytes(BT) + 3 * 4096 + 17, 0x10);
  assert_int_equal(pieces_read(f, &p, 3, 71), KVT_ECORRUPT);
  assert_int_equal(pieces_read(f, &p, 4, 72), 0);
  fault_plan fp = {KVT_FAULT_IO_COMPLETE, -EIO, 1};
  kvt__fault_set(fault_hook, &fp);
  assert_int_equal(pieces_read(f, &p, 4, 72), -EIO);
  atomic_store(&fp.left, 1);
  fp.code = 8192; /* short */
  assert_int_equal(pieces_write(f, &p, 5, 73), -EIO);
  atomic_store(&fp.left, 1);
  fp.site = KVT_FAULT_IO_SUBMIT, fp.code = -ENOSPC;
  assert_int_equal(pieces_read(f, &p, 4, 72), -ENOSPC);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(pieces_read(f, &p, 4, 72), 0);
  kvt__disk_stats st;
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.checksum_failures, 1);
  assert_int_equal(st.io_errors, 3);
  pieces_free(&p);
}

/* A read with verify_later: done() reports the I/O alone, and
 * kvt__disk_verify then gives what done() gives the other reads. *check
 * receives kvt__disk_verify's answer (when the I/O landed). */
static int later_read(fx *f, pieces *p, uint32_t slot, uint64_t seed, int *check) {
  waiter *w = waiter_new();
  kvt_key k = key_of(seed);
  g_ws[0] = (wslot){w, 0};
  kvt__disk_io io = {.slot = slot, .expected_key = &k, .arg = &g_ws[0], .iov = p->iov, .n_iov = p->n_iov,
                     .verify_later = 1};
  memset(p->prefix, 0xee, p->iov[0].iov_len);
  start(w, 0, 0);
  assert_int_equal(kvt__disk_read_batch(f->d, &io, 1, on_done), 1);
  waiter_wait(w);
  int rc = w->status[0];
  free(w);
  *check = rc == 0 ? kvt__disk_verify(f->d, &io) : 1;
  if (*check == 0) {
    pieces_scatter(f, p, host(f, 5), 1);
    if (!rec_ok(host(f, 5), seed)) *check = -9999;
  }
  return rc;
}

static void later_case(fx *f) {
  pieces p;
  pieces_init(f, &p);
  assert_int_equal(pieces_write(f, &p, 3, 81), 0);
  assert_int_equal(pieces_write(f, &p, 4, 82), 0);
  poke(f, 3, kvt__record_prefix_bytes(BT) + 2 * 4096 + 5, 0x08);
  kvt__disk_stats st0, st;
  kvt__disk_get_stats(f->d, &st0);
  int check;
  assert_int_equal(later_read(f, &p, 3, 81, &check), 0); /* landed: the damage is not done()'s to see */
  assert_int_equal(check, KVT_ECORRUPT);
  assert_int_equal(later_read(f, &p, 4, 82, &check), 0);
  assert_int_equal(check, 0);
  assert_int_equal(later_read(f, &p, 4, 83, &check), 0); /* another block's record */
  assert_int_equal(check, KVT_EMISMATCH);
  assert_int_equal(later_read(f, &p, 9, 84, &check), 0); /* a slot never written */
  assert_int_equal(check, KVT_EMISMATCH);
  fault_plan fp = {KVT_FAULT_IO_COMPLETE, -EIO, 1}; /* an I/O error still reaches done() */
  kvt__fault_set(fault_hook, &fp);
  assert_int_equal(later_read(f, &p, 4, 82, &check), -EIO);
  kvt__fault_set(NULL, NULL);
  kvt__disk_get_stats(f->d, &st);
  assert_int_equal(st.checksum_failures - st0.checksum_failures, 1);
  assert_int_equal(st.mismatches - st0.mismatches, 2);
  assert_int_equal(st.reads - st0.reads, 1);
  pieces_free(&p);
}

static void test_verify_later_reads_are_checked_by_the_caller(void **state) { later_case(*state); }

/* The same with records big enough for the checksum threads: a
 * verify_later read is finished unchecked on the reaper all the same. */
static void test_verify_later_reads_of_big_records(void **state) {
  fx *f = *state;
  reopen_big(f, 2, 0);
  later_case(f);
}

/* A read in part (zero_tail): the prefix and the payload's first pages
 * only, whose checksum takes the rest of the payload as zeros. It passes
 * for a record whose writer left that rest zero, byte-exact; it fails
 * (checksum) for one whose rest is not zero and for a flipped byte in the
 * pages read. Writes are whole records only, zero_tail or not. */
static void test_pieces_read_in_part(void **state) {
  fx *f = *state;
  pieces p;
  pieces_init(f, &p);
  const uint32_t pages = 3; /* payload pages read: iov[1..4) hold payload pages 0..2 */
  const size_t keep = (size_t)pages * 4096;
  char *rec = host(f, 4), *pay = kvt__record_payload(rec, BT);
  make_rec(rec, 71);
  memset(pay + keep - 1000, 0, g_payload - (keep - 1000)); /* the object ends inside the last page read */
  char want[3 * 4096];
  memcpy(want, pay, keep);
  pieces_scatter(f, &p, rec, 0);
  assert_int_equal(pieces_io(f, &p, 1, 3, 71), 0);
  memset(p.pay, 0xee, (size_t)p.n_pages * 4096);
  assert_int_equal(pieces_part_io(f, &p, 0, 3, 71, 1 + pages, 1), 0);
  for (uint32_t k = 0; k < pages; k++) assert_memory_equal(p.iov[1 + k].iov_base, want + (size_t)k * 4096, 4096);
  assert_int_equal(pieces_part_io(f, &p, 0, 3, 71, 1 + pages, 0), -EINVAL); /* short, without zero_tail */
  /* Not zero past the pages read: the checksum fails. */
  assert_int_equal(write_sync(f, 5, 72), 0);
  assert_int_equal(pieces_part_io(f, &p, 0, 5, 72, 1 + pages, 1), KVT_ECORRUPT);
  /* A byte flipped in the pages read. */
  poke(f, 3, kvt__record_prefix_bytes(BT) + 2 * 4096 + 7, 0x40);
  assert_int_equal(pieces_part_io(f, &p, 0, 3, 71, 1 + pages, 1), KVT_ECORRUPT);
  /* A write in part is refused, zero_tail or not. */
  make_rec(rec, 73);
  pieces_scatter(f, &p, rec, 0);
  assert_int_equal(pieces_part_io(f, &p, 1, 6, 73, 1 + pages, 1), -EINVAL);
  pieces_free(&p);
}

/* Pieces the store cannot move in one vectored I/O are refused. */
static void test_pieces_of_the_wrong_shape(void **state) {
  fx *f = *state;
  pieces p;
  pieces_init(f, &p);
  make_rec(host(f, 4), 1);
  pieces_scatter(f, &p, host(f, 4), 0);
  kvt__disk_io io = {.slot = 0, .arg = NULL, .iov = p.iov, .n_iov = p.n_iov - 1}; /* a page short */
  assert_int_equal(kvt__disk_write_batch(f->d, &io, 1, on_done), 0);
  assert_int_equal(io.status, -EINVAL);
  io.n_iov = 1;
  assert_int_equal(kvt__disk_write_batch(f->d, &io, 1, on_done), 0);
  assert_int_equal(io.status, -EINVAL);
  io.n_iov = KVT_DISK_MAX_IOV + 1;
  assert_int_equal(kvt__disk_read_batch(f->d, &io, 1, on_done), 0);
  assert_int_equal(io.status, -EINVAL);
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  if (in.direct) { /* O_DIRECT takes whole pages only */
    io.n_iov = p.n_iov;
    p.iov[2].iov_base = (char *)p.iov[2].iov_base + 512;
    assert_int_equal(kvt__disk_read_batch(f->d, &io, 1, on_done), 0);
    assert_int_equal(io.status, -EINVAL);
    p.iov[2].iov_base = (char *)p.iov[2].iov_base - 512;
    p.iov[1].iov_len -= 512, p.iov[2].iov_len += 512;
    assert_int_equal(kvt__disk_read_batch(f->d, &io, 1, on_done), 0);
    assert_int_equal(io.status, -EINVAL);
  }
  pieces_free(&p);
}

/* Threads named after their job, so a per-thread profile (perf, top -H)
 * reads which part of the store spends the time. */
static int threads_named(const char *name) {
  int n = 0;
  char path[300], comm[32];
  DIR *dir = opendir("/proc/self/task");
  struct dirent *de;
  while (dir && (de = readdir(dir)) != NULL) {
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
    FILE *fp = de->d_name[0] != '.' ? fopen(path, "r") : NULL;
    if (!fp) continue;
    if (fgets(comm, sizeof comm, fp) && strncmp(comm, name, strlen(name)) == 0 && comm[strlen(name)] == '\n') n++;
    fclose(fp);
  }
  if (dir) closedir(dir);
  return n;
}

static void test_store_threads_are_named(void **state) {
  fx *f = *state;
  if (access("/proc/self/task", R_OK) != 0) skip();
  reopen_big(f, 3, 0);
  assert_int_equal(threads_named("kvt-disk-reap"), 1);
  assert_int_equal(threads_named("kvt-disk-sum"), 3);
  assert_int_equal(threads_named("kvt-disk-sync"), 0);
  kvt__disk_close(f->d);
  kvt__disk_cfg c = cfg_of(f, NS1);
  c.durable = 1;
  assert_int_equal(kvt__disk_open(&c, &f->d), 0);
  assert_int_equal(threads_named("kvt-disk-sync"), 1);
  assert_int_equal(threads_named("kvt-disk-reap"), 1); /* the first store's are gone */
}

/* ---- fixed buffers (records in pieces inside registered buffers) ---- */

/* The record as three pieces: the prefix, then the payload's pages in two
 * runs of `pay`, the second run first (not adjacent). */
typedef struct fixed_rec {
  char *prefix, *pay;
  size_t pay_len;
  struct iovec iov[3];
} fixed_rec;

static void fixed_rec_init(fx *f, fixed_rec *r) {
  size_t pre = kvt__record_prefix_bytes(BT);
  r->pay_len = f->rec_bytes - pre;
  r->prefix = aligned_alloc(4096, pre);
  r->pay = aligned_alloc(4096, r->pay_len);
  size_t half = r->pay_len / 4096 / 2 * 4096;
  r->iov[0] = (struct iovec){r->prefix, pre};
  r->iov[1] = (struct iovec){r->pay + half, r->pay_len - half};
  r->iov[2] = (struct iovec){r->pay, half};
}

static void fixed_rec_free(fixed_rec *r) {
  free(r->prefix);
  free(r->pay);
}

/* Record image <-> pieces. */
static void fixed_rec_scatter(fixed_rec *r, char *rec, int into_rec) {
  size_t off = 0;
  for (int k = 0; k < 3; off += r->iov[k].iov_len, k++) {
    if (into_rec) memcpy(rec + off, r->iov[k].iov_base, r->iov[k].iov_len);
    else memcpy(r->iov[k].iov_base, rec + off, r->iov[k].iov_len);
  }
}

/* Submits the pieces' write or read of slot; *fixed receives io.fixed. */
static int fixed_rec_submit(fx *f, fixed_rec *r, waiter *w, int write, uint32_t slot, const kvt_key *k, int *fixed) {
  g_ws[0] = (wslot){w, 0};
  kvt__disk_io io = {.slot = slot, .expected_key = k, .arg = &g_ws[0], .iov = r->iov, .n_iov = 3};
  start(w, 0, 0);
  int rc = write ? kvt__disk_write_batch(f->d, &io, 1, on_done) : kvt__disk_read_batch(f->d, &io, 1, on_done);
  assert_int_equal(rc, 1);
  assert_int_equal(io.status, 0);
  *fixed = io.fixed;
  return 0;
}

static int fixed_rec_io(fx *f, fixed_rec *r, int write, uint32_t slot, uint64_t seed, int *fixed) {
  waiter *w = waiter_new();
  kvt_key k = key_of(seed);
  if (write) {
    make_rec(host(f, 4), seed);
    fixed_rec_scatter(r, host(f, 4), 0);
  } else {
    memset(r->prefix, 0xee, r->iov[0].iov_len);
    memset(r->pay, 0xee, r->pay_len);
  }
  fixed_rec_submit(f, r, w, write, slot, &k, fixed);
  waiter_wait(w);
  int rc = w->status[0];
  free(w);
  if (rc || write) return rc;
  memset(host(f, 5), 0, f->rec_bytes);
  fixed_rec_scatter(r, host(f, 5), 1);
  return rec_ok(host(f, 5), seed) ? 0 : -9999;
}

/* With io_uring, a record whose pieces all lie in registered buffers goes
 * as fixed-buffer I/O, byte-exact both ways and readable whole; one piece
 * outside them sends it vectored. The thread pool registers nothing. */
static void test_fixed_pieces_round_trip(void **state) {
  fx *f = *state;
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  struct utsname u;
  int major = 0, minor = 0;
  if (uname(&u) == 0) sscanf(u.release, "%d.%d", &major, &minor);
  if (g_backend == KVT_DISK_URING && (major > 5 || (major == 5 && minor >= 19)))
    assert_int_equal(in.fixed_vec, 1); /* sparse buffer tables */
  fixed_rec r;
  fixed_rec_init(f, &r);
  int hp = kvt__disk_buf_register(f->d, r.prefix, r.iov[0].iov_len);
  int hb = kvt__disk_buf_register(f->d, r.pay, r.pay_len);
  int fixed = -1;
  if (!in.fixed_vec) {
    assert_int_equal(hp, KVT_EUNSUPPORTED);
    assert_int_equal(fixed_rec_io(f, &r, 1, 3, 71, &fixed), 0);
    assert_int_equal(fixed, 0);
    assert_int_equal(fixed_rec_io(f, &r, 0, 3, 71, &fixed), 0);
    assert_int_equal(fixed, 0);
    fixed_rec_free(&r);
    return;
  }
  assert_true(hp >= 0 && hb >= 0);
  assert_int_equal(kvt__disk_buf_register(f->d, r.pay + 1, 4096), -EINVAL); /* not page-aligned */
  assert_int_equal(fixed_rec_io(f, &r, 1, 3, 71, &fixed), 0);
  assert_int_equal(fixed, 1);
  assert_int_equal(read_sync(f, 3, 71), 0);
  assert_int_equal(fixed_rec_io(f, &r, 0, 3, 71, &fixed), 0);
  assert_int_equal(fixed, 1);
  assert_int_equal(write_sync(f, 4, 72), 0);
  assert_int_equal(fixed_rec_io(f, &r, 0, 4, 72, &fixed), 0);
  assert_int_equal(fixed, 1);
  kvt__disk_buf_unregister(f->d, hp); /* the prefix outside: vectored */
  assert_int_equal(fixed_rec_io(f, &r, 1, 5, 73, &fixed), 0);
  assert_int_equal(fixed, 0);
  assert_int_equal(fixed_rec_io(f, &r, 0, 5, 73, &fixed), 0);
  assert_int_equal(fixed, 0);
  kvt__disk_buf_unregister(f->d, hb);
  fixed_rec_free(&r);
}

/* Completions held by the fault hook while g_hold is set. */
static atomic_int g_hold, g_held;
static int gate_hook(void *ctx, int site, int64_t arg) {
  (void)ctx, (void)arg;
  if (site != KVT_FAULT_IO_DELAY_US) return 0;
  atomic_fetch_add(&g_held, 1);
  while (atomic_load(&g_hold)) usleep(200);
  return 0;
}

typedef struct unreg_arg {
  fx *f;
  int h;
  atomic_int returned;
  int held_when_returned;
} unreg_arg;

static void *unreg_main(void *p) {
  unreg_arg *a = p;
  kvt__disk_buf_unregister(a->f->d, a->h);
  a->held_when_returned = atomic_load(&g_hold);
  atomic_store(&a->returned, 1);
  return NULL;
}

/* Unregistering a buffer waits for the I/O in flight that uses it (its
 * completion held back here: the op is given back, before done() runs,
 * only once the kernel is done with the memory), and later records go
 * vectored. */
static void test_fixed_unregister_waits_for_io_in_flight(void **state) {
  fx *f = *state;
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  if (!in.fixed_vec) return; /* the thread pool: nothing registered */
  fixed_rec r;
  fixed_rec_init(f, &r);
  int hp = kvt__disk_buf_register(f->d, r.prefix, r.iov[0].iov_len);
  int hb = kvt__disk_buf_register(f->d, r.pay, r.pay_len);
  assert_true(hp >= 0 && hb >= 0);
  make_rec(host(f, 4), 81);
  fixed_rec_scatter(&r, host(f, 4), 0);
  atomic_store(&g_held, 0);
  atomic_store(&g_hold, 1);
  kvt__fault_set(gate_hook, NULL);
  waiter *w = waiter_new();
  int fixed = 0;
  fixed_rec_submit(f, &r, w, 1, 6, NULL, &fixed);
  assert_int_equal(fixed, 1);
  unreg_arg a = {.f = f, .h = hb};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, unreg_main, &a), 0);
  usleep(100000);
  assert_int_equal(atomic_load(&a.returned), 0); /* still waiting */
  atomic_store(&g_hold, 0);
  pthread_join(t, NULL);
  kvt__fault_set(NULL, NULL);
  assert_true(atomic_load(&g_held) >= 1);
  assert_int_equal(a.held_when_returned, 0); /* it returned once the write's completion was let through */
  waiter_wait(w);
  assert_int_equal(w->status[0], 0);
  free(w);
  assert_int_equal(read_sync(f, 6, 81), 0);
  assert_int_equal(fixed_rec_io(f, &r, 0, 6, 81, &fixed), 0);
  assert_int_equal(fixed, 0); /* the payload's buffer is gone from the table */
  kvt__disk_buf_unregister(f->d, hp);
  fixed_rec_free(&r);
}

/* An I/O error or a short transfer of a fixed record fails it as a whole
 * (the store's status), and the buffers' uses are given back. */
static void test_fixed_io_error_fails_the_record(void **state) {
  fx *f = *state;
  kvt__disk_info in;
  kvt__disk_get_info(f->d, &in);
  if (!in.fixed_vec) return;
  fixed_rec r;
  fixed_rec_init(f, &r);
  int hp = kvt__disk_buf_register(f->d, r.prefix, r.iov[0].iov_len);
  int hb = kvt__disk_buf_register(f->d, r.pay, r.pay_len);
  assert_true(hp >= 0 && hb >= 0);
  int fixed = 0;
  fault_plan p = {KVT_FAULT_IO_COMPLETE, -EIO, 1};
  kvt__fault_set(fault_hook, &p);
  assert_int_equal(fixed_rec_io(f, &r, 1, 7, 91, &fixed), -EIO);
  assert_int_equal(fixed, 1);
  p = (fault_plan){KVT_FAULT_IO_COMPLETE, 4096, 1};
  assert_int_equal(fixed_rec_io(f, &r, 1, 7, 91, &fixed), -EIO); /* short */
  kvt__fault_set(NULL, NULL);
  assert_int_equal(fixed_rec_io(f, &r, 1, 7, 92, &fixed), 0);
  assert_int_equal(fixed_rec_io(f, &r, 0, 7, 92, &fixed), 0);
  assert_int_equal(fixed, 1);
  kvt__disk_buf_unregister(f->d, hp); /* returns: no use left behind */
  kvt__disk_buf_unregister(f->d, hb);
  fixed_rec_free(&r);
}

#define CASE(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

static int run_suite(const char *name) {
  const struct CMUnitTest tests[] = {
      CASE(test_backend_is_the_one_asked_for), CASE(test_round_trip_byte_exact),
      CASE(test_buffer_lists_may_go_after_open),
      CASE(test_unregistered_buffer_round_trip), CASE(test_wrong_key_is_mismatch),
      CASE(test_flipped_payload_byte), CASE(test_flipped_header_byte), CASE(test_flipped_token_byte),
      CASE(test_flipped_last_payload_byte), CASE(test_torn_record_is_discarded),
      CASE(test_reopen_after_clean_close), CASE(test_newest_copy_of_a_key_wins),
      CASE(test_seq_keeps_growing_across_reopen), CASE(test_tombstone_is_never_resurrected),
      CASE(test_namespace_mismatch_keeps_old_data), CASE(test_foreign_file_untouched),
      CASE(test_bad_arguments), CASE(test_eio_on_one_write), CASE(test_enospc_on_one_write),
      CASE(test_short_write_is_eio), CASE(test_submit_fault_fails_only_that_request),
      CASE(test_eio_on_read_then_read_again), CASE(test_second_op_on_busy_slot),
      CASE(test_batches_fail_only_bad_entries), CASE(test_big_reads_finish_one_at_a_time_on_the_reaper),
      CASE(test_a_read_done_may_start_reads),
      CASE(test_newest_call_wins_with_parallel_sealing),
      CASE(test_submit_fault_of_a_sealed_write_reaches_done), CASE(test_flipped_byte_of_a_big_record),
      CASE(test_try_batch_never_waits), CASE(test_hashed_records_get_headroom),
      CASE(test_headroom_follows_checksum_threads),
      CASE(test_default_queue_depth_follows_record_size),
      CASE(test_the_scan_hands_each_record_to_on_record),
      CASE(test_small_records_get_no_headroom), CASE(test_default_checksum_threads),
      CASE(test_eio_on_one_read_of_a_full_hashed_queue),
      CASE(test_disk_gets_queue_depth_and_refills_before_checksums),
      CASE(test_refused_queued_read_fails_alone_through_done),
      CASE(test_durable_write_is_synced_before_done), CASE(test_durable_failed_sync_fails_its_group),
      CASE(test_pieces_round_trip_both_ways), CASE(test_pieces_round_trip_of_a_big_record),
      CASE(test_pieces_fail_like_records), CASE(test_pieces_of_the_wrong_shape), CASE(test_pieces_read_in_part),
      CASE(test_verify_later_reads_are_checked_by_the_caller), CASE(test_verify_later_reads_of_big_records),
      CASE(test_store_threads_are_named), CASE(test_fixed_pieces_round_trip),
      CASE(test_fixed_unregister_waits_for_io_in_flight), CASE(test_fixed_io_error_fails_the_record),
  };
  return _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
}

static int uring_usable(char *why, size_t n) {
  char path[4200];
  snprintf(path, sizeof path, "%s/probe-%d.kvt", kvt_test_tmpdir(), (int)getpid());
  kvt__disk_cfg c = {.path = path, .slots = 1, .block_tokens = BT, .payload_bytes = 4096,
                     .backend = KVT_DISK_URING};
  kvt__disk *d = NULL;
  int rc = kvt__disk_open(&c, &d);
  kvt__disk_close(d);
  unlink(path);
  snprintf(why, n, "the kernel refuses io_uring (%s)", strerror(-rc));
  return rc == 0 || (rc != -ENOSYS && rc != -EPERM && rc != -EACCES);
}

int main(void) {
  g_backend = KVT_DISK_THREADS, g_name = "threads";
  int failed = run_suite("disk_store_threads");
  char why[160];
  if (!uring_usable(why, sizeof why)) {
    if (failed) return 1;
    kvt_test_skip("io_uring cases: %s (threads cases passed)", why);
  }
  g_backend = KVT_DISK_URING, g_name = "io_uring";
  failed += run_suite("disk_store_uring");
  g_backend = KVT_DISK_AUTO, g_name = "io_uring";
  const struct CMUnitTest autos[] = {CASE(test_backend_is_the_one_asked_for), CASE(test_round_trip_byte_exact)};
  failed += _cmocka_run_group_tests("disk_store_auto", autos, 2, NULL, NULL);
  return failed ? 1 : 0;
}
