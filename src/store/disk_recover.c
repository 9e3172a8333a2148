/* The disk store's open-time work: superblock check or creation, reset, and
 * the recovery scan. It runs before the reaper thread starts, so it drives
 * the backend itself: a pipelined pass keeps `width` reads in flight,
 * submits each refill as one batch, and checks records as they land. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "store/disk_internal.h"
#include "util/fault.h"
#include "util/log.h"

#define SUPER_MAGIC 0x314b53494454564bull /* "KVTDISK1" little-endian */
#define SCAN_BUF_BYTES (64u << 20)        /* read buffers of one recovery pass */

typedef struct disk_super {
  uint64_t magic;
  uint32_t format_version, record_version;
  kvt_key ns;
  uint64_t slots, slot_bytes, payload_bytes, data_offset;
  uint32_t block_tokens, flags;
  uint64_t sum; /* XXH3_64 of the bytes before it */
} disk_super;

enum { SUPER_EMPTY, SUPER_MATCH, SUPER_RESIZE, SUPER_OTHER_NS, SUPER_FOREIGN, SUPER_CORRUPT };

void kvt__disk_detail(kvt__disk *d, const char *fmt, ...) {
  if (!d->detail || !d->detail_len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->detail, d->detail_len, fmt, ap);
  va_end(ap);
}

static void super_fill(const kvt__disk *d, disk_super *s) {
  memset(s, 0, sizeof *s);
  *s = (disk_super){.magic = SUPER_MAGIC, .format_version = KVT_DISK_FORMAT_VERSION,
                    .record_version = KVT_RECORD_VERSION, .ns = d->ns, .slots = d->slots,
                    .slot_bytes = d->slot_bytes, .payload_bytes = d->payload_bytes,
                    .data_offset = d->data_off, .block_tokens = d->block_tokens};
  s->sum = XXH3_64bits(s, offsetof(disk_super, sum));
}

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* A magic within a few flipped bits of ours is a damaged kvtier superblock;
 * anything further off is another program's data. */
static int near_magic(uint64_t m) { return __builtin_popcountll(m ^ SUPER_MAGIC) <= 4; }

static int super_classify(const kvt__disk *d, const void *page, uint64_t *old_slots) {
  disk_super s, want;
  if (all_zero(page, KVT_DISK_SUPER_BYTES)) return SUPER_EMPTY;
  memcpy(&s, page, sizeof s);
  if (!near_magic(s.magic)) return SUPER_FOREIGN;
  if (s.magic != SUPER_MAGIC || s.sum != XXH3_64bits(&s, offsetof(disk_super, sum))) return SUPER_CORRUPT;
  super_fill(d, &want);
  if (memcmp(&s, &want, sizeof s) == 0) return SUPER_MATCH;
  *old_slots = s.slots;
  s.slots = want.slots;
  s.sum = want.sum;
  /* Only the slot count differs: a resize of the same tier. */
  return memcmp(&s, &want, sizeof s) == 0 && *old_slots > 0 ? SUPER_RESIZE : SUPER_OTHER_NS;
}

static int device_size(kvt__disk *d, uint64_t *size) {
  struct stat sb;
  if (fstat(d->fd, &sb) < 0) return -errno;
  d->is_blk = S_ISBLK(sb.st_mode);
  if (!d->is_blk && !S_ISREG(sb.st_mode)) return -EINVAL;
  if (!d->is_blk) {
    *size = (uint64_t)sb.st_size;
    return 0;
  }
  return ioctl(d->fd, BLKGETSIZE64, size) < 0 ? -errno : 0;
}

int kvt__disk_side_file_ok(const char *path) {
  struct stat sb;
  return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static uint64_t bytes_for(const kvt__disk *d, uint64_t slots) { return d->data_off + slots * d->slot_bytes; }

/* Refuses before allocating anything when the filesystem cannot hold the
 * rest of the file, so a failure never leaves it full. */
static int space_for(kvt__disk *d, uint64_t need) {
  struct stat sb;
  struct statfs fs;
  if (fstat(d->fd, &sb) < 0 || fstatfs(d->fd, &fs) < 0) return 0; /* let fallocate decide */
  uint64_t have = (uint64_t)sb.st_blocks * 512, avail = (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize;
  if (need <= have || need - have <= avail) return 0;
  kvt__disk_detail(d, "needs %llu MiB more, the filesystem has %llu MiB free",
                   (unsigned long long)((need - have) >> 20), (unsigned long long)(avail >> 20));
  return -ENOSPC;
}

/* Every byte of the file allocated: a sparse file (a copy, an old
 * ftruncate) would otherwise fail its spills with ENOSPC later, silently.
 * On failure the file gets its old size back. */
static int ensure_size(kvt__disk *d, uint64_t have, uint64_t need) {
  if (d->is_blk) {
    if (have >= need) return 0;
    kvt__disk_detail(d, "block device of %llu bytes, the tier needs %llu", (unsigned long long)have,
                     (unsigned long long)need);
    return -ENOSPC;
  }
  int rc = space_for(d, need);
  if (rc == 0) rc = kvt__fault_check(KVT_FAULT_PREALLOC, (int64_t)need);
  if (rc == 0 && fallocate(d->fd, 0, 0, (off_t)need) != 0) rc = -errno;
  if (rc == -EOPNOTSUPP) { /* the filesystem cannot preallocate: sparse it is */
    kvt__log(KVT_LOG_WARN, "%s: cannot preallocate (%s); a full filesystem will fail spills", d->path,
             strerror(EOPNOTSUPP));
    rc = have < need && ftruncate(d->fd, (off_t)need) < 0 ? -errno : 0;
  }
  if (rc < 0) {
    if (have < need && ftruncate(d->fd, (off_t)have) < 0) rc = -errno;
    if (d->detail && !d->detail[0]) kvt__disk_detail(d, "preallocating %llu bytes: %s", (unsigned long long)need, strerror(-rc));
    kvt__log(KVT_LOG_ERROR, "%s: preallocating %llu bytes failed: %s", d->path, (unsigned long long)need,
             strerror(-rc));
  }
  return rc;
}

static int write_super(kvt__disk *d, void *page) {
  memset(page, 0, KVT_DISK_SUPER_BYTES);
  super_fill(d, page);
  ssize_t k = pwrite(d->fd, page, KVT_DISK_SUPER_BYTES, 0);
  if (k != (ssize_t)KVT_DISK_SUPER_BYTES) return k < 0 ? -errno : -EIO;
  return fdatasync(d->fd) < 0 ? -errno : 0;
}

/* A fresh file is truncated first so that every slot reads as zeros (empty);
 * a block device cannot be, so *fresh = 2 asks for a sweep of its slots. */
static int start_fresh(kvt__disk *d, void *page, uint64_t have, int *fresh) {
  if (!d->is_blk && have > 0) {
    if (ftruncate(d->fd, 0) < 0) return -errno;
    have = 0;
  }
  int rc = ensure_size(d, have, bytes_for(d, d->slots));
  if (rc == 0) rc = write_super(d, page);
  *fresh = d->is_blk ? 2 : 1;
  return rc;
}

/* The smallest direct read the file takes: recovery reads each slot's
 * header and tokens in that granularity, not the whole 4 KiB prefix. */
static uint32_t probe_dio_align(kvt__disk *d, void *page, uint64_t have) {
  if (!d->direct || have < d->data_off + 512) return 512;
  return pread(d->fd, page, 512, (off_t)d->data_off) == 512 ? 512 : 4096;
}

int kvt__disk_prepare_file(kvt__disk *d, int reset, int *fresh) {
  uint64_t have = 0, old_slots = 0;
  int rc = device_size(d, &have);
  if (rc < 0) return rc;
  void *page = aligned_alloc(4096, KVT_DISK_SUPER_BYTES);
  if (!page) return -ENOMEM;
  memset(page, 0, KVT_DISK_SUPER_BYTES);
  /* A file cut short reads as far as it goes: a whole superblock is
   * recognised (and the cut logged below), part of ours is damaged. */
  if (have > 0 && pread(d->fd, page, KVT_DISK_SUPER_BYTES, 0) < 0) rc = -errno;
  int state = rc == 0 ? super_classify(d, page, &old_slots) : SUPER_EMPTY;
  d->scan_slots = d->slots;
  d->dio_align = probe_dio_align(d, page, have);
  if (rc == 0 && !reset && state == SUPER_CORRUPT) {
    kvt__log(KVT_LOG_WARN, "%s: superblock damaged; the disk tier starts empty", d->path);
    d->fresh_start = 1;
  } else if (rc == 0 && !reset && state == SUPER_OTHER_NS && d->is_blk) {
    /* A device has no room for a file beside it: a tier of another model
     * or layout on it is a cache like any other, and gives way. */
    kvt__log(KVT_LOG_WARN, "%s: device held another namespace; the disk tier starts empty", d->path);
    d->fresh_start = 1;
  }
  if (rc == 0 && (state == SUPER_MATCH || state == SUPER_RESIZE) && !reset && !d->is_blk &&
      have < bytes_for(d, state == SUPER_MATCH ? d->slots : old_slots))
    kvt__log(KVT_LOG_WARN, "%s: the file is shorter than its tier (%llu of %llu bytes): blocks past its end are gone",
             d->path, (unsigned long long)have,
             (unsigned long long)bytes_for(d, state == SUPER_MATCH ? d->slots : old_slots));
  if (rc == 0 && state == SUPER_MATCH && !reset) {
    *fresh = 0;
    rc = ensure_size(d, have, bytes_for(d, d->slots));
  } else if (rc == 0 && state == SUPER_RESIZE && !reset) {
    *fresh = 0;
    d->scan_slots = old_slots;
    uint64_t keep = old_slots > d->slots ? old_slots : d->slots; /* shrinking gives space back after the moves */
    rc = ensure_size(d, have, bytes_for(d, keep));
  } else if (rc == 0 && (state == SUPER_OTHER_NS || state == SUPER_FOREIGN) && !reset && !d->fresh_start) {
    kvt__disk_detail(d, "holds %s; disk_reset = 1 discards it",
                     state == SUPER_FOREIGN ? "data that is not a kvtier tier" : "another model's, layout's or format's tier");
    rc = KVT_ENAMESPACE;
  } else if (rc == 0) {
    rc = start_fresh(d, page, have, fresh);
  }
  free(page);
  return rc;
}

/* ---- pipelined passes over slots ---- */

typedef struct pass pass;
struct pass {
  int op;               /* KVT_IO_READ (scan) or KVT_IO_WRITE (tombstones) */
  uint32_t len, width;
  char *bufs;           /* width * len read buffers; NULL: writes of zero_page */
  uint64_t n;
  const uint64_t *slots; /* item i's slot; NULL: slot first + i */
  uint64_t first;
  void (*on_done)(kvt__disk *d, pass *p, uint64_t slot, const void *buf, int res);
  uint64_t *kill, n_kill; /* slots to tombstone afterwards */
  uint32_t *free_pos, n_free;
  uint64_t *pos_slot;
  kvt_io_req *reqs;
  kvt_io_cqe *cqes;
};

static kvt_io_req pass_req(kvt__disk *d, pass *p, uint32_t pos, uint64_t slot) {
  void *buf = p->bufs ? p->bufs + (size_t)pos * p->len : d->zero_page;
  return (kvt_io_req){.op = p->op, .buf_index = -1, .offset = d->data_off + slot * d->slot_bytes,
                      .buf = buf, .len = p->len, .user = (void *)(uintptr_t)pos};
}

static void pass_finish(kvt__disk *d, pass *p, uint32_t pos, int res) {
  p->on_done(d, p, p->pos_slot[pos], p->bufs ? p->bufs + (size_t)pos * p->len : NULL, res);
  p->free_pos[p->n_free++] = pos;
}

/* Submits reqs[0..k) as batches; a request refused at submission completes
 * with its error. Returns how many are now in flight. */
static uint32_t pass_submit(kvt__disk *d, pass *p, uint32_t k) {
  uint32_t done = 0, sent = 0;
  while (done < k) {
    int s = kvt__io_submit(&d->io, p->reqs + done, k - done);
    if (s < 0) pass_finish(d, p, (uint32_t)(uintptr_t)p->reqs[done].user, s);
    if (s < 0) done++;
    if (s > 0) done += (uint32_t)s, sent += (uint32_t)s;
    if (s == 0) sched_yield();
  }
  return sent;
}

static int run_pass(kvt__disk *d, pass *p) {
  uint64_t next = 0, active = 0;
  while (next < p->n || active) {
    uint32_t k = 0;
    while (next < p->n && p->n_free) {
      uint32_t pos = p->free_pos[--p->n_free];
      p->pos_slot[pos] = p->slots ? p->slots[next] : p->first + next;
      p->reqs[k++] = pass_req(d, p, pos, p->pos_slot[pos]);
      next++;
    }
    active += pass_submit(d, p, k);
    if (!active) continue;
    int got = kvt__io_reap(&d->io, p->cqes, p->width, 1, -1);
    if (got < 0 && got != -EINTR && got != -ETIME && got != -EAGAIN) return got;
    for (int i = 0; i < got; i++) pass_finish(d, p, (uint32_t)(uintptr_t)p->cqes[i].user, p->cqes[i].res);
    active -= got > 0 ? (uint64_t)got : 0;
  }
  return 0;
}

static void pass_free(pass *p) {
  free(p->bufs);
  free(p->free_pos);
  free(p->pos_slot);
  free(p->reqs);
  free(p->cqes);
  free(p->kill);
}

static int pass_init(kvt__disk *d, pass *p, int op, uint32_t len, int with_bufs) {
  uint64_t w = SCAN_BUF_BYTES / len;
  p->op = op;
  p->len = len;
  p->width = (uint32_t)(w < 1 ? 1 : w > d->io_depth ? d->io_depth : w);
  p->n_free = p->width;
  /* aligned_alloc wants a multiple of the alignment (one 512 B header at queue depth 1 is not). */
  p->bufs = with_bufs ? aligned_alloc(4096, ((size_t)p->width * len + 4095) & ~(size_t)4095) : NULL;
  p->free_pos = malloc(p->width * sizeof *p->free_pos);
  p->pos_slot = malloc(p->width * sizeof *p->pos_slot);
  p->reqs = malloc(p->width * sizeof *p->reqs);
  p->cqes = malloc(p->width * sizeof *p->cqes);
  uint64_t most = d->slots > d->scan_slots ? d->slots : d->scan_slots;
  p->kill = malloc((most ? most : 1) * sizeof *p->kill);
  if ((with_bufs && !p->bufs) || !p->free_pos || !p->pos_slot || !p->reqs || !p->cqes || !p->kill)
    return -ENOMEM;
  for (uint32_t i = 0; i < p->width; i++) p->free_pos[i] = p->width - 1 - i;
  return 0;
}

static void tomb_done(kvt__disk *d, pass *p, uint64_t slot, const void *buf, int res) {
  if (res != (int)p->len) atomic_fetch_add(&d->st.io_errors, 1);
}

/* Zeroes the header page of each slot in kill[0..n). */
static int tombstone_all(kvt__disk *d, const uint64_t *kill, uint64_t n) {
  pass t = {0};
  int rc = pass_init(d, &t, KVT_IO_WRITE, 4096, 0);
  t.n = n;
  t.slots = kill;
  t.on_done = tomb_done;
  if (rc == 0 && n) rc = run_pass(d, &t);
  /* Durable mode: the emptied slots stay empty through a power loss. */
  if (rc == 0 && n && d->durable && fdatasync(d->fd) < 0) rc = -errno;
  pass_free(&t);
  return rc;
}

/* ---- recovery scan ---- */

static void scan_done(kvt__disk *d, pass *p, uint64_t slot, const void *buf, int res) {
  kvt__record_hdr h;
  if (res != (int)p->len) {
    atomic_fetch_add(&d->st.io_errors, 1);
    d->discarded++;
    return;
  }
  d->recover_bytes += p->len;
  int rc = kvt__record_check(buf, p->len, &d->ns, d->block_tokens, d->payload_bytes, NULL,
                             !d->recover_headers_only, &h);
  if (rc == KVT_EMISS) return;
  if (rc) {
    d->discarded++;
    return;
  }
  if (h.seq > d->max_seq) d->max_seq = h.seq;
  d->found[d->n_found++] = (disk_found){slot, h.seq, h.key, h.parent};
  if (d->on_record)
    d->on_record(d->on_record_arg, &h, h.flags & KVT_RECORD_F_TOKENS ? kvt__record_tokens((void *)(uintptr_t)buf) : NULL);
}

/* Same key together, newest seq first. */
static int found_cmp(const void *a, const void *b) {
  const disk_found *x = a, *y = b;
  if (x->key.hi != y->key.hi) return x->key.hi < y->key.hi ? -1 : 1;
  if (x->key.lo != y->key.lo) return x->key.lo < y->key.lo ? -1 : 1;
  return x->seq > y->seq ? -1 : x->seq < y->seq;
}

/* Keeps the newest record of each key; older copies go to p->kill. */
static void dedupe(kvt__disk *d, pass *p) {
  uint64_t w = 0;
  qsort(d->found, d->n_found, sizeof *d->found, found_cmp);
  for (uint64_t i = 0; i < d->n_found; i++) {
    if (w && d->found[w - 1].key.lo == d->found[i].key.lo && d->found[w - 1].key.hi == d->found[i].key.hi)
      p->kill[p->n_kill++] = d->found[i].slot;
    else
      d->found[w++] = d->found[i];
  }
  d->superseded = d->n_found - w;
  d->n_found = w;
}

/* Bytes recovery reads per slot: the header and token ids (what recovery
 * needs: key, parent, seq, and tokens to check), in the file's direct-I/O
 * granularity; the whole record when payloads are checked too. */
static uint32_t scan_len(const kvt__disk *d) {
  if (!d->recover_headers_only) return (uint32_t)d->slot_bytes;
  size_t need = kvt__align_up(KVT_RECORD_HDR_BYTES + (size_t)d->block_tokens * 4u, d->dio_align ? d->dio_align : 4096);
  size_t prefix = kvt__record_prefix_bytes(d->block_tokens);
  return (uint32_t)(need < prefix ? need : prefix);
}

int kvt__disk_scan(kvt__disk *d) {
  pass p = {0};
  int rc = pass_init(d, &p, KVT_IO_READ, scan_len(d), 1);
  uint64_t n = d->scan_slots > d->slots ? d->scan_slots : d->slots;
  d->found = malloc((n ? n : 1) * sizeof *d->found);
  if (rc == 0 && !d->found) rc = -ENOMEM;
  p.n = d->scan_slots; /* the slots the file holds (the old count on a resize) */
  p.on_done = scan_done;
  if (rc == 0) rc = run_pass(d, &p);
  if (rc == 0) dedupe(d, &p);
  if (rc == 0) rc = tombstone_all(d, p.kill, p.n_kill);
  pass_free(&p);
  return rc;
}

static void sweep_done(kvt__disk *d, pass *p, uint64_t slot, const void *buf, int res) {
  if (res != (int)p->len || !all_zero(buf, KVT_RECORD_HDR_BYTES)) p->kill[p->n_kill++] = slot;
}

int kvt__disk_sweep(kvt__disk *d, uint64_t from, uint64_t to) {
  pass p = {0};
  int rc = pass_init(d, &p, KVT_IO_READ, 4096, 1);
  p.first = from;
  p.n = to > from ? to - from : 0;
  p.on_done = sweep_done;
  if (rc == 0) rc = run_pass(d, &p);
  if (rc == 0) rc = tombstone_all(d, p.kill, p.n_kill);
  pass_free(&p);
  return rc;
}

/* ---- resize ---- */

/* Records below the new end (arg) first, where they stay, then the rest
 * newest first. */
static int resize_order(const void *a, const void *b, void *arg) {
  const disk_found *x = a, *y = b;
  uint64_t end = *(const uint64_t *)arg;
  int xb = x->slot >= end, yb = y->slot >= end;
  if (xb != yb) return xb - yb;
  return x->seq > y->seq ? -1 : x->seq < y->seq;
}

/* Copies slot `from` to slot `to` (both within the file), synchronously. */
static int copy_slot(kvt__disk *d, void *buf, uint64_t from, uint64_t to) {
  off_t src = (off_t)(d->data_off + from * d->slot_bytes), dst = (off_t)(d->data_off + to * d->slot_bytes);
  ssize_t k = pread(d->fd, buf, d->slot_bytes, src);
  if (k != (ssize_t)d->slot_bytes) return k < 0 ? -errno : -EIO;
  k = pwrite(d->fd, buf, d->slot_bytes, dst);
  if (k != (ssize_t)d->slot_bytes) return k < 0 ? -errno : -EIO;
  return 0;
}

/* Shrinking: records past the new end move into empty slots below it,
 * newest first; what does not fit is dropped. A crash half way leaves the
 * old superblock and two copies of some records (recovery keeps one). */
static int move_into_range(kvt__disk *d) {
  uint8_t *used = calloc(d->slots ? d->slots : 1, 1);
  void *buf = aligned_alloc(4096, d->slot_bytes);
  int rc = used && buf ? 0 : -ENOMEM;
  uint64_t w = 0, beyond = 0;
  for (uint64_t i = 0; rc == 0 && i < d->n_found; i++) {
    if (d->found[i].slot < d->slots) used[d->found[i].slot] = 1, w++;
    else beyond++;
  }
  if (rc == 0) qsort_r(d->found, d->n_found, sizeof *d->found, resize_order, &d->slots);
  uint64_t free_at = 0;
  for (uint64_t i = 0; rc == 0 && i < beyond; i++) {
    while (free_at < d->slots && used[free_at]) free_at++;
    if (free_at == d->slots) break;
    rc = copy_slot(d, buf, d->found[w + i].slot, free_at);
    if (rc) break;
    used[free_at] = 1;
    d->found[w + i].slot = free_at;
    d->resize_moved++;
  }
  if (rc == 0) {
    d->resize_dropped = beyond - d->resize_moved;
    d->n_found = w + d->resize_moved;
    if (d->resize_moved && fdatasync(d->fd) < 0) rc = -errno;
  }
  free(used);
  free(buf);
  return rc;
}

int kvt__disk_finish_resize(kvt__disk *d) {
  if (d->scan_slots == d->slots) return 0;
  uint64_t old = d->scan_slots;
  int rc = 0;
  if (old > d->slots) rc = move_into_range(d);
  /* Slots past the old end of a device still hold whatever was there. */
  if (rc == 0 && old < d->slots && d->is_blk) rc = kvt__disk_sweep(d, old, d->slots);
  if (rc == 0 && old > d->slots && d->is_blk) {
    /* A device keeps the bytes past the new end: empty those slots so a
     * later grow cannot bring back blocks dropped in between. */
    uint64_t *kill = malloc((old - d->slots) * sizeof *kill);
    if (!kill) return -ENOMEM;
    for (uint64_t s = d->slots; s < old; s++) kill[s - d->slots] = s;
    rc = tombstone_all(d, kill, old - d->slots);
    free(kill);
  }
  void *page = aligned_alloc(4096, KVT_DISK_SUPER_BYTES);
  if (rc == 0 && !page) rc = -ENOMEM;
  if (rc == 0) rc = write_super(d, page);
  free(page);
  if (rc == 0 && old > d->slots && !d->is_blk && ftruncate(d->fd, (off_t)bytes_for(d, d->slots)) < 0) rc = -errno;
  d->scan_slots = d->slots;
  if (rc == 0)
    kvt__log(KVT_LOG_INFO, "%s: resized from %llu to %llu slots; %llu records moved, %llu dropped", d->path,
             (unsigned long long)old, (unsigned long long)d->slots, (unsigned long long)d->resize_moved,
             (unsigned long long)d->resize_dropped);
  return rc;
}
