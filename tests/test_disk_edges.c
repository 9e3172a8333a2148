/* The disk tier's edges through the public API: a changed disk_blocks is a
 * resize (what fits is kept), a damaged superblock starts the tier empty
 * (counted, logged, never printed), preallocation failures leave nothing
 * behind and sparse files are filled, reopening reads headers only, the
 * disk LRU comes back in write order, and durable mode covers every spill
 * with an fdatasync before the block counts as on disk (a failed one drops
 * the blocks it covered). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "kv_fixture.h"
#include "kvtier/backend.h"
#include "store/disk_store.h"
#include "util/fault.h"

#define BT 16

static char disk_path[4200];

static kvt_config disk_config(const char *name, uint32_t host, uint64_t disk) {
  kvt_config cfg = fixture_config(host);
  snprintf(disk_path, sizeof disk_path, "%s/%s.kvt", kvt_test_tmpdir(), name);
  cfg.disk_path = disk_path;
  cfg.disk_blocks = disk;
  cfg.disk_backend = KVT_DISK_THREADS;
  return cfg;
}

/* Conversations first..first+n-1 (4 blocks each) computed, offloaded, and
 * pushed through a 4-block host tier: all but the last end on disk, in
 * conversation order. */
static void fill_convs(fixture *f, uint32_t first, uint32_t n, kvt_key k[][4], uint32_t t[][4 * BT]) {
  for (uint32_t c = 0; c < n; c++) {
    fixture_keys(f, first + c, 4, k[c], t[c]);
    run_request(f, k[c], t[c], 4, first + c);
    fixture_offload(f, k[c], 4);
    kvt_drain(f->c);
  }
}

static int count_side_files(const char *name) {
  DIR *dir = opendir(kvt_test_tmpdir());
  int n = 0;
  struct dirent *e;
  size_t len = strlen(name);
  while (dir && (e = readdir(dir)))
    if (strncmp(e->d_name, name, len) == 0 && e->d_name[len] == '.' && strcmp(e->d_name + len, ".kvt") != 0) n++;
  if (dir) closedir(dir);
  return n;
}

static off_t file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? sb.st_size : -1;
}

static void poke_byte(const char *path, off_t off, unsigned char mask) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= mask;
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

/* ---- resize ---- */

/* 64 -> 128 -> 32 slots: no side file, blocks kept while they fit, the
 * file follows the size, and a second change never fails. */
static void resize_keeps_what_fits(void **state) {
  kvt_config cfg = disk_config("resize", 4, 64);
  cfg.disk_reset = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[11][4];
  uint32_t t[11][4 * BT];
  fill_convs(&f, 100, 11, k, t); /* 40 blocks on disk */
  assert_int_equal(fixture_stats(&f).resident_disk, 40);
  fixture_close(&f);
  off_t size64 = file_size(disk_path);

  cfg.disk_reset = 0;
  cfg.disk_blocks = 128;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.disk_recovered, 40);
  assert_int_equal(st.resident_disk, 40);
  assert_int_equal(count_side_files("resize"), 0);
  assert_true(file_size(disk_path) > size64);
  for (uint32_t c = 0; c < 10; c++) assert_int_equal(fixture_lookup(&f, k[c], 4).n_disk, 4);
  kvt_key m[4][4];
  uint32_t mt[4][4 * BT];
  fill_convs(&f, 120, 4, m, mt); /* more blocks, in slots past 64 */
  uint64_t stored = fixture_stats(&f).resident_disk;
  assert_true(stored > 48);
  fixture_close(&f);
  /* Three damaged records low in the file leave room below the new end. */
  size_t rec = 4096 + FIX_LAYERS * 2 * FIX_SEG_BYTES;
  for (int i = 0; i < 3; i++) poke_byte(disk_path, (off_t)(4096 + i * rec + 40), 0x01);

  /* Shrink below what is stored: 48 stay (some moved below the new end),
   * the rest are dropped, and what stays restores byte-exact. */
  cfg.disk_blocks = 48;
  fixture_open_cfg(&f, &cfg, 8);
  st = fixture_stats(&f);
  print_message("resize 128 -> 48: %llu stored, %llu moved, %llu dropped\n", (unsigned long long)stored,
                (unsigned long long)st.disk_resize_moved, (unsigned long long)st.disk_resize_dropped);
  assert_int_equal(st.disk_recovered, 48);
  assert_int_equal(st.disk_discarded, 3);
  assert_int_equal(st.disk_resize_moved, stored - 45 < 3 ? stored - 45 : 3);
  assert_int_equal(st.disk_resize_dropped, stored - 3 - 48);
  assert_int_equal(st.resident_disk, 48);
  assert_int_equal(count_side_files("resize"), 0);
  assert_true(file_size(disk_path) < size64);
  uint32_t restored = 0;
  for (uint32_t c = 0; c < 14; c++) {
    const kvt_key *kc = c < 10 ? k[c] : m[c - 10];
    const uint32_t *tc = c < 10 ? t[c] : mt[c - 10];
    uint32_t conv = c < 10 ? 100 + c : 120 + c - 10;
    kvt_lookup_result lr = fixture_lookup(&f, kc, 4);
    if (lr.n_prefix == 0) continue;
    fixture_scribble(&f);
    restored += run_request(&f, kc, tc, 4, conv); /* run_request checks every restored byte */
  }
  assert_true(restored > 0);
  fixture_close(&f);

  /* Grown again after all that: still no side file, nothing lost. */
  cfg.disk_blocks = 64;
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(fixture_stats(&f).disk_recovered, fixture_stats(&f).resident_disk);
  assert_true(fixture_stats(&f).disk_recovered >= 40);
  assert_int_equal(count_side_files("resize"), 0);
  fixture_close(&f);
}

/* ---- damaged superblock ---- */

static char logged[512];
static int n_logged;
static void capture_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  (void)level;
  snprintf(logged, sizeof logged, "%s", msg);
  n_logged++;
}

/* One flipped bit (in the namespace field, then in the magic) used to
 * disable every tier (KVT_ECORRUPT) or start a second full-size file: now
 * the tier starts empty in place, counted and logged, with nothing on stderr. */
static void damaged_superblock_starts_empty(void **state) {
  kvt_config cfg = disk_config("super", 4, 32);
  cfg.disk_reset = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[3][4];
  uint32_t t[3][4 * BT];
  fill_convs(&f, 200, 3, k, t);
  fixture_close(&f);
  cfg.disk_reset = 0;
  kvt_set_log_handler(capture_log, NULL);
  off_t offsets[2] = {16 + 3 /* namespace */, 2 /* magic */};
  for (int i = 0; i < 2; i++) {
    fixture_open_cfg(&f, &cfg, 8); /* write something again */
    fill_convs(&f, 200, 3, k, t);
    fixture_close(&f);
    poke_byte(disk_path, offsets[i], 0x10);
    n_logged = 0;
    fflush(stderr);
    int saved = dup(2);
    char errpath[4300];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", kvt_test_tmpdir());
    int errfd = open(errpath, O_RDWR | O_CREAT | O_TRUNC, 0644);
    dup2(errfd, 2);
    fixture_open_cfg(&f, &cfg, 8);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(lseek(errfd, 0, SEEK_END), 0); /* the library printed nothing */
    close(errfd);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.disk_fresh_starts, 1);
    assert_int_equal(st.disk_recovered, 0);
    assert_int_equal(n_logged, 1);
    assert_non_null(strstr(logged, "superblock damaged"));
    assert_int_equal(count_side_files("super"), 0);
    /* Every tier works: blocks go down to disk and come back. */
    fill_convs(&f, 210, 3, k, t);
    assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
    fixture_scribble(&f);
    assert_int_equal(run_request(&f, k[0], t[0], 4, 210), 4);
    fixture_close(&f);
  }
  kvt_set_log_handler(NULL, NULL);
}

/* A tier file cut short (a copy or a disk that ran out): cut inside the
 * superblock's 80 bytes it is damaged (starts empty, counted, logged); cut
 * after it, the tier opens, says that the blocks past the end are gone,
 * and recovers what is left. An empty file is a new tier. */
static void truncated_tier_file_is_logged(void **state) {
  kvt_config cfg = disk_config("cut", 4, 32);
  kvt_key k[3][4];
  uint32_t t[3][4 * BT];
  struct {
    off_t at;
    int damaged;
  } cuts[] = {{40, 1}, {100, 0}, {4096, 0}};
  kvt_set_log_handler(capture_log, NULL);
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    fixture f;
    cfg.disk_reset = 1;
    fixture_open_cfg(&f, &cfg, 8);
    fill_convs(&f, 300, 3, k, t);
    fixture_close(&f);
    cfg.disk_reset = 0;
    assert_int_equal(truncate(disk_path, cuts[i].at), 0);
    n_logged = 0;
    logged[0] = 0;
    fixture_open_cfg(&f, &cfg, 8);
    kvt_stats st = fixture_stats(&f);
    assert_int_equal(st.disk_fresh_starts, cuts[i].damaged);
    assert_int_equal(st.disk_recovered, 0);
    assert_true(n_logged >= 1);
    assert_non_null(strstr(logged, cuts[i].damaged ? "superblock damaged" : "shorter than its tier"));
    assert_int_equal(count_side_files("cut"), 0);
    fill_convs(&f, 310, 3, k, t); /* the tier works */
    assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
    fixture_close(&f);
  }
  kvt_set_log_handler(NULL, NULL);
  assert_int_equal(truncate(disk_path, 0), 0);
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(fixture_stats(&f).disk_fresh_starts, 0);
  fixture_close(&f);
}

/* A file of another program (far from the magic) is still left alone. */
static void foreign_file_gets_a_side_file(void **state) {
  kvt_config cfg = disk_config("foreign", 4, 16);
  int fd = open(disk_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  char junk[8192];
  kvt_test_fill(junk, sizeof junk, 9);
  assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(fixture_stats(&f).disk_fresh_starts, 0);
  fixture_close(&f);
  assert_int_equal(file_size(disk_path), (off_t)sizeof junk);
  assert_int_equal(count_side_files("foreign"), 1);
}

/* ---- block devices ---- */

/* A tier of another namespace gets a file beside it only when it is a
 * regular file: beside a block device that file would land in /dev. */
static void no_side_file_beside_a_device(void **state) {
  kvt_config cfg = disk_config("plain", 4, 16);
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  fixture_close(&f);
  assert_int_equal(kvt__disk_side_file_ok(disk_path), 1);
  assert_int_equal(kvt__disk_side_file_ok(kvt_test_tmpdir()), 0);
  assert_int_equal(kvt__disk_side_file_ok("/dev/null"), 0);
  assert_int_equal(kvt__disk_side_file_ok("/nonexistent/x.kvt"), 0);
  DIR *dev = opendir("/dev");
  struct dirent *e;
  int seen = 0;
  char p[300];
  struct stat sb;
  while (dev && (e = readdir(dev)) && !seen) {
    snprintf(p, sizeof p, "/dev/%s", e->d_name);
    if (stat(p, &sb) == 0 && S_ISBLK(sb.st_mode)) {
      assert_int_equal(kvt__disk_side_file_ok(p), 0);
      seen = 1;
    }
  }
  if (dev) closedir(dev);
  if (!seen) print_message("no block device in /dev to check\n");
}

/* ---- preallocation ---- */

#ifdef KVT_FAULT_INJECTION
static int enospc(void *ctx, int site, int64_t arg) { return site == KVT_FAULT_PREALLOC ? -ENOSPC : 0; }

/* A failed preallocation leaves no partial file: a new file is removed, a
 * grown one gets its old size back; the error names the path. */
static void failed_preallocation_leaves_nothing(void **state) {
  kvt_config cfg = disk_config("prealloc", 4, 16);
  unlink(disk_path);
  fixture g = {.slots = 8};
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  unsigned char *pool = calloc(FIX_LAYERS * 2, 8 * 512);
  for (int i = 0; i < FIX_LAYERS * 2; i++) g.seg[i] = (kvt_segment){pool + i * 8 * 512, 512, 512};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = FIX_LAYERS;
  lay.num_slots = 8;
  lay.segments = g.seg;
  kvt__fault_set(enospc, NULL);
  assert_int_equal(kvt_register_layout(c, &lay), -ENOSPC);
  kvt__fault_set(NULL, NULL);
  assert_non_null(strstr(kvt_error_detail(c), disk_path));
  kvt_close(c);
  assert_int_equal(file_size(disk_path), -1); /* removed */
  /* An existing tier asked to grow: the file keeps its size. */
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  fixture_close(&f);
  off_t before = file_size(disk_path);
  cfg.disk_blocks = 4096;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  kvt__fault_set(enospc, NULL);
  assert_int_equal(kvt_register_layout(c, &lay), -ENOSPC);
  kvt__fault_set(NULL, NULL);
  kvt_close(c);
  assert_int_equal(file_size(disk_path), before);
  free(pool);
}
#endif

/* A tier bigger than the filesystem's free space is refused before a byte
 * is allocated (fallocate used to fill the filesystem, then fail), and the
 * file the attempt created is gone. */
static void tier_larger_than_free_space_is_refused_up_front(void **state) {
  enum { SEG = 512 * 1024, SLOTS = 4 };
  const uint64_t disk = 1u << 20; /* x 1 MiB blocks = 1 TiB */
  kvt_config cfg = disk_config("toobig", 0, disk);
  struct statvfs fs;
  assert_int_equal(statvfs(kvt_test_tmpdir(), &fs), 0);
  if ((uint64_t)fs.f_bavail * fs.f_frsize > disk * (SEG * 2 + 4096)) skip(); /* a filesystem that big */
  unlink(disk_path);
  unsigned char *pool = calloc(2, (size_t)SLOTS * SEG);
  kvt_segment seg[2] = {{pool, SEG, SEG}, {pool + (size_t)SLOTS * SEG, SEG, SEG}};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = SLOTS;
  lay.segments = seg;
  kvt_cache *c;
  assert_int_equal(kvt_open(&cfg, &c), 0);
  assert_int_equal(kvt_register_layout(c, &lay), -ENOSPC);
  assert_non_null(strstr(kvt_error_detail(c), "free"));
  kvt_close(c);
  assert_int_equal(file_size(disk_path), -1);
  free(pool);
}

/* A file of the right size but sparse (copied, or made with ftruncate) is
 * preallocated on open, so spills cannot fail ENOSPC later. */
static void sparse_file_is_preallocated(void **state) {
  kvt_config cfg = disk_config("sparse", 4, 64);
  cfg.disk_reset = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  fixture_close(&f);
  off_t size = file_size(disk_path);
  int fd = open(disk_path, O_RDWR);
  assert_true(fd >= 0);
  /* Punch the data region out, keeping the superblock: same size, sparse. */
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, size - 4096) != 0) {
    close(fd);
    skip(); /* the filesystem cannot punch holes */
  }
  struct stat sb;
  fstat(fd, &sb);
  assert_true((off_t)sb.st_blocks * 512 < size / 2);
  close(fd);
  cfg.disk_reset = 0;
  fixture_open_cfg(&f, &cfg, 8);
  stat(disk_path, &sb);
  assert_true((off_t)sb.st_blocks * 512 >= size);
  fixture_close(&f);
}

/* ---- reopen cost ---- */

/* A full tier of 64 KiB blocks: reopening reads headers and tokens only,
 * at most 1/16 of the file (it read and checksummed every byte). */
static void reopen_reads_headers_only(void **state) {
  enum { SEG = 32 * 1024, SLOTS = 8, DISK = 48 };
  kvt_config cfg = disk_config("reopen", 4, DISK);
  cfg.disk_reset = 1;
  unsigned char *pool = calloc(2, (size_t)SLOTS * SEG);
  kvt_segment seg[2] = {{pool, SEG, SEG}, {pool + (size_t)SLOTS * SEG, SEG, SEG}};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = 1;
  lay.num_slots = SLOTS;
  lay.segments = seg;
  uint64_t recovered_bytes = 0;
  for (int round = 0; round < 2; round++) {
    kvt_cache *c;
    assert_int_equal(kvt_open(&cfg, &c), 0);
    assert_int_equal(kvt_register_layout(c, &lay), 0);
    kvt_stats st = {.size = sizeof st};
    if (round == 1) {
      assert_int_equal(kvt_get_stats(c, &st), 0);
      assert_int_equal(st.disk_recovered, DISK);
      recovered_bytes = st.disk_recover_bytes;
    }
    for (uint32_t conv = 0; round == 0 && conv < DISK / 4 + 1; conv++) {
      uint32_t tok[4 * BT];
      kvt_key k[4];
      size_t nk;
      conv_tokens(tok, 4 * BT, 300 + conv);
      assert_int_equal(kvt_hash_tokens(c, NULL, tok, 4 * BT, k, 4, &nk), 0);
      kvt_req r;
      uint32_t slots[4];
      assert_true(kvt_acquire(c, k, tok, 4, 4, 0, 0, &r, slots, NULL) >= 0);
      assert_int_equal(kvt_commit(c, r, 4, NULL), 0);
      assert_int_equal(kvt_release(c, r), 0);
      kvt_job j;
      if (kvt_store(c, k, 4, KVT_STORE_EVICT, &j) == 1) {
        assert_int_equal(kvt_job_wait(c, j, -1), 0);
        kvt_job_release(c, j);
      }
      kvt_drain(c);
    }
    if (round == 0) {
      assert_int_equal(kvt_get_stats(c, &st), 0);
      assert_int_equal(st.resident_disk, DISK); /* full */
    }
    kvt_close(c);
    cfg.disk_reset = 0;
  }
  off_t size = file_size(disk_path);
  print_message("reopen of a %lld-byte tier read %llu bytes (1/%.1f)\n", (long long)size,
                (unsigned long long)recovered_bytes, (double)size / (double)recovered_bytes);
  assert_true(recovered_bytes > 0);
  assert_true(recovered_bytes <= (uint64_t)size / 16);
  free(pool);
}

/* ---- LRU order after a restart ---- */

/* Five conversations go to disk in order; after a restart, new spills must
 * evict the oldest conversation whole (tails first), not blocks picked by
 * key hash, which cut chains in the middle and left their tails unreachable. */
static void restart_rebuilds_lru_in_write_order(void **state) {
  kvt_config cfg = disk_config("lru", 4, 20);
  cfg.disk_reset = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[6][4];
  uint32_t t[6][4 * BT];
  fill_convs(&f, 400, 6, k, t); /* disk: conversations 0..4, host: 5 */
  assert_int_equal(fixture_stats(&f).resident_disk, 20);
  fixture_close(&f);
  cfg.disk_reset = 0;
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(fixture_stats(&f).disk_recovered, 20);
  kvt_key n[3][4];
  uint32_t nt[3][4 * BT];
  fill_convs(&f, 500, 3, n, nt); /* 8 new blocks reach the full disk */
  kvt_stats st = fixture_stats(&f);
  assert_int_equal(st.evictions_disk, 8);
  /* The two oldest conversations left; every other one is whole. */
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_prefix, 0);
  assert_int_equal(fixture_lookup(&f, k[1], 4).n_prefix, 0);
  for (int c = 2; c < 5; c++) assert_int_equal(fixture_lookup(&f, k[c], 4).n_prefix, 4);
  fixture_close(&f);
}

/* ---- a disk copy that cannot be read ---- */

#ifdef KVT_FAULT_INJECTION
static int fail_reads(void *ctx, int site, int64_t arg) {
  return site == KVT_FAULT_IO_SUBMIT && arg == KVT_IO_READ ? -EIO : 0;
}

/* A's disk copies cannot be read (a bad sector). They leave the disk at
 * the first failure, so the recomputed copies are written anew, and once
 * the bad region is gone from the file (truncated under the cache) A still
 * comes back from disk byte-exact. The bad copies used to stay: every
 * later request failed its read and recomputed, for the life of the cache. */
static void unreadable_disk_copy_is_dropped_and_rewritten(void **state) {
  kvt_config cfg = disk_config("unreadable", 4, 32);
  cfg.disk_reset = 1;
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[2][4];
  uint32_t t[2][4 * BT];
  fill_convs(&f, 700, 2, k, t); /* A on disk, B on the host */
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  kvt__fault_set(fail_reads, NULL);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 700), 0); /* recomputes all four */
  kvt__fault_set(NULL, NULL);
  assert_true(fixture_stats(&f).io_errors >= 1);
  kvt_lookup_result lr = fixture_lookup(&f, k[0], 4);
  assert_int_equal(lr.n_device, 4);
  assert_int_equal(lr.n_disk, 0);
  assert_int_equal(truncate(disk_path, 4096), 0); /* the old records are gone for good */
  fixture_offload(&f, k[0], 4);                  /* A to the host ... */
  kvt_key b2[4];
  uint32_t tb2[4 * BT];
  fixture_keys(&f, 710, 4, b2, tb2);
  run_request(&f, b2, tb2, 4, 710);
  fixture_offload(&f, b2, 4); /* ... and on to disk, written anew */
  kvt_drain(f.c);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 700), 4);
  fixture_close(&f);
}
#endif

/* ---- durability ---- */

#ifdef KVT_FAULT_INJECTION
typedef struct sync_count {
  atomic_int calls, ops, fail;
} sync_count;

static int count_syncs(void *ctx, int site, int64_t arg) {
  sync_count *s = ctx;
  if (site != KVT_FAULT_DISK_SYNC) return 0;
  atomic_fetch_add(&s->calls, 1);
  atomic_fetch_add(&s->ops, (int)arg);
  return atomic_load(&s->fail) ? -EIO : 0;
}

/* disk_durable = 1: every record write is covered by an fdatasync before
 * the block counts as on disk (writes completing together share one); the
 * default never syncs. */
static void durable_mode_syncs_every_write(void **state) {
  kvt_config cfg = disk_config("durable", 4, 16);
  cfg.disk_reset = 1;
  sync_count sc = {0};
  kvt__fault_set(count_syncs, &sc);
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[2][4];
  uint32_t t[2][4 * BT];
  fill_convs(&f, 600, 2, k, t);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  fixture_close(&f);
  assert_int_equal(atomic_load(&sc.calls), 0);

  cfg.disk_durable = 1;
  fixture_open_cfg(&f, &cfg, 8);
  fill_convs(&f, 610, 2, k, t);
  kvt_stats st = fixture_stats(&f);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  assert_int_equal(st.io_errors, 0);
  assert_true(st.blocks_h2disk >= 4);
  print_message("durable: %llu blocks spilled, %d fdatasync calls\n", (unsigned long long)st.blocks_h2disk,
                atomic_load(&sc.calls));
  assert_true(atomic_load(&sc.calls) >= 1);
  assert_true((uint64_t)atomic_load(&sc.ops) >= st.blocks_h2disk);
  fixture_close(&f);
  /* Reopened, the synced blocks are there and restore byte-exact. */
  cfg.disk_reset = 0;
  fixture_open_cfg(&f, &cfg, 8);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 610), 4);
  fixture_close(&f);
}

/* A failing fdatasync fails the spills it covered: each is an I/O error,
 * the block is not on disk (dropped, recomputed when asked for, never
 * restored from a write that was not synced), and once syncs work again
 * the block is written anew and comes back byte-exact. */
static void failed_sync_drops_the_blocks(void **state) {
  kvt_config cfg = disk_config("durable-fail", 4, 16);
  cfg.disk_reset = 1;
  cfg.disk_durable = 1;
  sync_count sc = {0};
  atomic_store(&sc.fail, 1);
  kvt__fault_set(count_syncs, &sc);
  fixture f;
  fixture_open_cfg(&f, &cfg, 8);
  kvt_key k[2][4];
  uint32_t t[2][4 * BT];
  fill_convs(&f, 620, 2, k, t); /* A's spill fails its syncs, B on the host */
  kvt_stats st = fixture_stats(&f);
  assert_true(atomic_load(&sc.calls) >= 1);
  assert_int_equal(st.io_errors, (uint64_t)atomic_load(&sc.ops));
  assert_true(st.io_errors >= 4);
  assert_int_equal(st.blocks_h2disk, 0);
  assert_int_equal(st.resident_disk, 0);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 0);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 620), 0); /* recomputed, never restored */
  atomic_store(&sc.fail, 0);
  fixture_offload(&f, k[0], 4); /* A to the host ... */
  kvt_key b2[4];
  uint32_t tb2[4 * BT];
  fixture_keys(&f, 630, 4, b2, tb2);
  run_request(&f, b2, tb2, 4, 630);
  fixture_offload(&f, b2, 4); /* ... and on to disk, synced this time */
  kvt_drain(f.c);
  kvt__fault_set(NULL, NULL);
  assert_int_equal(fixture_lookup(&f, k[0], 4).n_disk, 4);
  fixture_scribble(&f);
  assert_int_equal(run_request(&f, k[0], t[0], 4, 620), 4);
  fixture_close(&f);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resize_keeps_what_fits),
      cmocka_unit_test(damaged_superblock_starts_empty),
      cmocka_unit_test(truncated_tier_file_is_logged),
      cmocka_unit_test(foreign_file_gets_a_side_file),
      cmocka_unit_test(no_side_file_beside_a_device),
#ifdef KVT_FAULT_INJECTION
      cmocka_unit_test(failed_preallocation_leaves_nothing),
#endif
      cmocka_unit_test(tier_larger_than_free_space_is_refused_up_front),
      cmocka_unit_test(sparse_file_is_preallocated),
      cmocka_unit_test(reopen_reads_headers_only),
      cmocka_unit_test(restart_rebuilds_lru_in_write_order),
#ifdef KVT_FAULT_INJECTION
      cmocka_unit_test(unreadable_disk_copy_is_dropped_and_rewritten),
#endif
#ifdef KVT_FAULT_INJECTION
      cmocka_unit_test(durable_mode_syncs_every_write),
      cmocka_unit_test(failed_sync_drops_the_blocks),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
