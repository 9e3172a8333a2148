/* The disk store's open-time work: superblock check or creation, reset, and
 * the recovery scan. It runs before the reaper thread starts, so it drives
 * the backend itself: a pipelined pass keeps `width` reads in flight,
 * submits each refill as one batch, and checks records as they land. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "store/disk_internal.h"

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

enum { SUPER_EMPTY, SUPER_MATCH, SUPER_MISMATCH, SUPER_CORRUPT };

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

static int super_classify(const kvt__disk *d, const void *page) {
  disk_super s, want;
  if (all_zero(page, KVT_DISK_SUPER_BYTES)) return SUPER_EMPTY;
  memcpy(&s, page, sizeof s);
  if (s.magic != SUPER_MAGIC) return SUPER_MISMATCH; /* not a kvtier file */
  if (s.sum != XXH3_64bits(&s, offsetof(disk_super, sum))) return SUPER_CORRUPT;
  super_fill(d, &want);
  return memcmp(&s, &want, sizeof s) == 0 ? SUPER_MATCH : SUPER_MISMATCH;
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

static int ensure_size(kvt__disk *d, uint64_t have) {
  uint64_t need = d->data_off + d->slots * d->slot_bytes;
  if (have >= need) return 0;
  if (d->is_blk) return -ENOSPC;
  if (fallocate(d->fd, 0, 0, (off_t)need) == 0) return 0;
  if (errno != EOPNOTSUPP) return -errno;
  return ftruncate(d->fd, (off_t)need) < 0 ? -errno : 0; /* sparse: ENOSPC shows up on write */
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
  int rc = ensure_size(d, have);
  if (rc == 0) rc = write_super(d, page);
  *fresh = d->is_blk ? 2 : 1;
  return rc;
}

int kvt__disk_prepare_file(kvt__disk *d, int reset, int *fresh) {
  uint64_t have = 0;
  int rc = device_size(d, &have);
  if (rc < 0) return rc;
  void *page = aligned_alloc(4096, KVT_DISK_SUPER_BYTES);
  if (!page) return -ENOMEM;
  memset(page, 0, KVT_DISK_SUPER_BYTES);
  if (have >= KVT_DISK_SUPER_BYTES && pread(d->fd, page, KVT_DISK_SUPER_BYTES, 0) < 0) rc = -errno;
  int state = super_classify(d, page);
  if (rc == 0 && state == SUPER_MATCH && !reset) {
    *fresh = 0;
    rc = ensure_size(d, have);
  } else if (rc == 0 && state != SUPER_EMPTY && !reset) {
    rc = state == SUPER_CORRUPT ? KVT_ECORRUPT : KVT_ENAMESPACE;
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
  const uint64_t *slots; /* item i's slot; NULL: slot i */
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
      p->pos_slot[pos] = p->slots ? p->slots[next] : next;
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
  p->width = (uint32_t)(w < 1 ? 1 : w > d->depth ? d->depth : w);
  p->n_free = p->width;
  p->bufs = with_bufs ? aligned_alloc(4096, (size_t)p->width * len) : NULL;
  p->free_pos = malloc(p->width * sizeof *p->free_pos);
  p->pos_slot = malloc(p->width * sizeof *p->pos_slot);
  p->reqs = malloc(p->width * sizeof *p->reqs);
  p->cqes = malloc(p->width * sizeof *p->cqes);
  p->kill = malloc((d->slots ? d->slots : 1) * sizeof *p->kill);
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
  int rc = kvt__record_check(buf, p->len, &d->ns, d->block_tokens, d->payload_bytes, NULL,
                             !d->recover_headers_only, &h);
  if (rc == KVT_EMISS) return;
  if (rc) {
    d->discarded++;
    return;
  }
  if (h.seq > d->max_seq) d->max_seq = h.seq;
  d->found[d->n_found++] = (disk_found){slot, h.seq, h.key, h.parent};
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

int kvt__disk_scan(kvt__disk *d) {
  pass p = {0};
  uint32_t len = (uint32_t)(d->recover_headers_only ? kvt__record_prefix_bytes(d->block_tokens) : d->slot_bytes);
  int rc = pass_init(d, &p, KVT_IO_READ, len, 1);
  d->found = malloc((d->slots ? d->slots : 1) * sizeof *d->found);
  if (rc == 0 && !d->found) rc = -ENOMEM;
  p.n = d->slots;
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

int kvt__disk_sweep(kvt__disk *d) {
  pass p = {0};
  int rc = pass_init(d, &p, KVT_IO_READ, 4096, 1);
  p.n = d->slots;
  p.on_done = sweep_done;
  if (rc == 0) rc = run_pass(d, &p);
  if (rc == 0) rc = tombstone_all(d, p.kill, p.n_kill);
  pass_free(&p);
  return rc;
}
