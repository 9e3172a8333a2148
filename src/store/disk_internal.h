/* Private to disk_store.c (runtime I/O) and disk_recover.c (superblock,
 * open-time scan). Nothing else includes this. */
#ifndef KVT_STORE_DISK_INTERNAL_H
#define KVT_STORE_DISK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "io/io.h"
#include "store/disk_store.h"

#define KVT_DISK_SUPER_BYTES 4096u
#define KVT_DISK_FORMAT_VERSION 1u
#define KVT_DISK_MAX_RETRIES 8
#define KVT_DISK_MAX_HASHERS 8u
/* Writes of records under this size are sealed in the call: handing one
 * to a checksum thread costs more than hashing it. Larger ones are sealed
 * on the checksum threads. Reads are verified on the reaper at any size
 * (see disk_store.c). */
#define KVT_DISK_HANDOFF_BYTES (256u << 10)
/* Reads a recovery pass keeps in flight at least (headers of 4 KiB, or
 * whole small records): the backend is opened that deep even when the
 * store's own ops are fewer (large records: 10 ops at 2 MiB with two
 * checksum threads), since a reopen's scan is bound by latency, not
 * bandwidth. */
#define KVT_DISK_SCAN_MIN_WIDTH 64u
/* Such a record keeps its op out of the ring while it is hashed (a write
 * on a checksum thread, a read that landed on the reaper): the store holds
 * KVT_DISK_HASH_HEADROOM_PER_THREAD more ops for each checksum thread (at
 * most queue_depth more), so the disk keeps its queue while writes are
 * sealed, and reads wait in the disk queue for the reaper to send them as
 * others land, before it verifies those. More headroom only holds more of
 * the caller's buffers: a caller that reuses them as the store hands them
 * back (a staging ring) then spreads its I/O over more memory, which a
 * virtual disk that copies into guest memory pays for (raw depth 8
 * cycling 64 buffers against 8: 0.62-0.84 of the speed). One op per
 * thread against two, at depth 8 and 2 MiB records (10 ops against 12),
 * kvtier-bench's disk section on a two-CPU virtual machine, against raw
 * depth 8 in the same rounds: fetches 0.99-1.03 against 0.92-0.98, spills
 * 0.97-0.99 against 0.95-0.97 (see AUTO_INFLIGHT_LARGE_BYTES in
 * disk_store.c). Two per thread had been measured when reads were
 * verified on the checksum threads (a record in hand and one waiting for
 * each), and a whole queue depth before the store had a disk queue of its
 * own, when an I/O could start only once a checksum freed an op. */
#define KVT_DISK_HASH_HEADROOM_PER_THREAD 1u
/* Durable mode: writes that landed keep their ops until the fdatasync of
 * their group returns, out of the ring as well, so the store holds another
 * queue_depth ops and the disk keeps queue_depth I/Os while a group syncs. */

enum { OP_WRITE = 1, OP_READ, OP_TOMB };

typedef struct disk_op {
  int kind;
  int buf_index;
  int retries;
  uint64_t slot;
  uint64_t seq;             /* writes: sealed into the record */
  void *buf;                /* the record, or its prefix when iov is set */
  const struct iovec *iov;  /* the record in pieces (caller's), or NULL */
  uint32_t n_iov;
  kvt_key key;
  int check_key;
  int verify_later;         /* reads: the caller checks the record (kvt__disk_verify) */
  int zero_tail;            /* reads in pieces: iov covers part of the payload (kvt__disk_io) */
  uint64_t len;             /* bytes the I/O moves: the slot's, or iov's with zero_tail */
  int at_disk;              /* counted in the store's at_disk */
  kvt__disk_done_fn done;
  void *arg;
  /* A record in pieces that all lie in registered buffers goes as
   * READV_FIXED / WRITEV_FIXED: n_fx iovecs (0: not fixed), the backend's
   * buffer index of each and the store's table entry it holds a use of. */
  uint32_t n_fx;
  uint32_t fx_buf[KVT_IO_MAX_FIXED_VEC];
  uint8_t fx_ent[KVT_IO_MAX_FIXED_VEC];
  kvt_io_fixed_vec fv;
} disk_op;

/* A buffer registered with the backend (kvt__disk_buf_register). */
typedef struct disk_fixed {
  uintptr_t base;
  size_t len;
  uint32_t index;           /* the backend's */
  uint32_t users;           /* ops holding it, submitted or queued */
  uint8_t used, dying;      /* dying: being unregistered, no new users */
} disk_fixed;
#define KVT_DISK_MAX_FIXED 128u

typedef struct disk_fin {
  kvt__disk_done_fn done;
  void *arg;
  int status;
} disk_fin;

typedef struct disk_found {
  uint64_t slot, seq;
  kvt_key key, parent;
} disk_found;

struct kvt__disk {
  int fd, direct, is_blk;
  int vectored;             /* the backend declares KVT_IO_CAP_VECTORED */
  int fixed_vec;            /* ... and KVT_IO_CAP_FIXED_VEC: kvt__disk_buf_register works */
  disk_fixed fx[KVT_DISK_MAX_FIXED]; /* guarded by lock */
  uint32_t n_fx_used;       /* entries used (lookups skip the table when 0) */
  uint64_t slots, slot_bytes, data_off, payload_bytes;
  uint32_t block_tokens;
  uint32_t depth;           /* ops: queue_depth + headroom */
  uint32_t io_depth;        /* the backend's ring: depth, at least KVT_DISK_SCAN_MIN_WIDTH */
  uint32_t queue_depth;     /* as configured */
  kvt_key ns;
  kvt__io io;
  struct disk_region {      /* host-pool regions, to find a buffer's fixed index */
    uintptr_t base;         /* (copied from the cfg's lists) */
    size_t len;
  } *bufs;
  uint32_t n_bufs;
  void *zero_page;          /* 4 KiB of zeros: the tombstone */

  pthread_mutex_t lock;     /* guards free_ops, n_free, inflight, stop, at_disk, dq */
  pthread_cond_t cond;      /* an op was freed, one was taken, or stop */
  disk_op *ops;
  uint32_t *free_ops, n_free, inflight;
  /* I/Os at the disk (handed to the backend, not yet reaped) number at
   * most queue_depth; more wait in dq, oldest first (depth entries: no
   * more ops exist), and go as others leave the disk. */
  uint32_t at_disk;
  disk_op **dq;
  uint32_t dq_head, dq_count;
  disk_op **left;           /* the reaper's: ops of one reaped batch that left the disk */
  int stop;
  pthread_t reaper;
  int reaper_started;
  kvt_io_cqe *cqes;         /* the reaper's: one reaped batch */
  disk_fin *fin;
  disk_op **fin_ops;

  /* Large writes wait here to be sealed, which runs on a few checksum
   * threads: sealing in series on the caller holds its submissions to one
   * core's XXH3 speed of records read from memory. (Reads are verified on
   * the reaper, just landed.) */
  pthread_mutex_t hq_lock;  /* guards hq_head, hq_count, hq_stop */
  pthread_cond_t hq_cond;   /* an op was queued, or hq_stop */
  disk_op **hq;             /* ring of depth entries: no more ops exist */
  disk_op **hbatch;         /* the reaper's: landed reads of one reaped batch, to verify */
  uint32_t hq_head, hq_count, n_hashers;
  uint32_t want_hashers;    /* set at open (0 for records hashed in place) */
  int handoff;              /* slot_bytes >= KVT_DISK_HANDOFF_BYTES */
  int hq_stop;
  pthread_t hashers[KVT_DISK_MAX_HASHERS];

  /* Durable mode: writes and tombstones whose I/O completed wait here for
   * the sync thread, which covers everything queued with one fdatasync and
   * only then finishes them (group commit: while one fdatasync runs, the
   * next group gathers). Their ops and slots stay held until then. */
  pthread_mutex_t sq_lock;  /* guards sq, sq_count, sq_stop */
  pthread_cond_t sq_cond;   /* an op was queued, or sq_stop */
  disk_op **sq;             /* depth entries: no more ops exist */
  disk_op **sq_reap;        /* the reaper's: synced ops of one reaped batch */
  disk_op **sq_group;       /* the sync thread's: the group being synced */
  disk_fin *sq_fin;
  uint32_t sq_count;
  int sq_stop, syncer_started;
  pthread_t syncer;
  pthread_mutex_t sub_lock; /* one submission at a time (backends serialise
                               them anyway); keeps fault hooks' calls ordered */

  atomic_uchar *busy;       /* per slot: an op is in flight */
  atomic_uint_fast64_t next_seq;
  struct {
    atomic_uint_fast64_t writes, reads, invalidates, bytes_written, bytes_read;
    atomic_uint_fast64_t checksum_failures, mismatches, io_errors, retries, syncs;
  } st;

  /* Open-time recovery results, handed out once by kvt__disk_recover. */
  disk_found *found;
  uint64_t n_found, n_found_total, discarded, superseded, max_seq;
  int recovered;
  int recover_headers_only;
  void (*on_record)(void *arg, const kvt__record_hdr *h, const uint32_t *tokens); /* cfg's, open only */
  void *on_record_arg;

  /* Open-time state (disk_recover.c). */
  const char *path;         /* cfg's, valid during kvt__disk_open only */
  int created;              /* open created the file: a failed open removes it */
  int durable;              /* a write finishes only after an fdatasync that followed it */
  uint64_t scan_slots;      /* slots the file holds now (differs from slots on a resize) */
  uint32_t dio_align;       /* smallest direct read the file accepts (512 or 4096) */
  int fresh_start;          /* the superblock was damaged (or a device held another namespace) */
  uint64_t resize_moved, resize_dropped, recover_bytes;
  char *detail;             /* cfg's detail buffer: why open failed */
  size_t detail_len;
};

/* disk_recover.c: superblock, reset, resize, and the open-time scan. */
int kvt__disk_prepare_file(kvt__disk *d, int reset, int *fresh);
int kvt__disk_scan(kvt__disk *d);
/* Empties slots [from, to) of a block device (a file reads zeros there). */
int kvt__disk_sweep(kvt__disk *d, uint64_t from, uint64_t to);
/* After the scan of a file whose slot count changed: keeps what fits,
 * rewrites the superblock and gives the space back. */
int kvt__disk_finish_resize(kvt__disk *d);
void kvt__disk_detail(kvt__disk *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
