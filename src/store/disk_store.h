/* The disk tier's store, as the engine sees it. The engine owns slot
 * allocation for every tier (the tier map holds each block's disk slot);
 * the store owns the file: its superblock, the record checksums, the I/O
 * backend, and recovery.
 *
 * File layout: a 4 KiB superblock (magic, format version, namespace,
 * geometry: slots, slot bytes, block_tokens, payload bytes; its own XXH3),
 * then `slots` fixed slots of kvt__record_bytes(block_tokens, payload_bytes).
 * A slot whose 128-byte header is all zero is empty (never written, or a
 * tombstone). The file is preallocated (fallocate); a block device works too.
 *
 * Opening a regular file that holds another namespace, geometry or format
 * version (or is not a kvtier file at all) returns KVT_ENAMESPACE and
 * touches nothing, unless cfg->reset = 1, which discards the old contents.
 * A block device holding another kvtier namespace is taken over (started
 * empty); one holding anything else is KVT_ENAMESPACE. Another slot count
 * is a resize, not another namespace: records that fit are kept (moved
 * below the new end when it shrinks). A damaged superblock (checksum, or a
 * magic a few bits off) starts the tier empty, counted in fresh_starts.
 * The file is preallocated in full (holes of a sparse file included);
 * -ENOSPC when the filesystem cannot hold it, leaving the file as it was
 * (a file the open created is removed).
 * The file is flock()ed: a second opener waits up to ~1 s (a crashed
 * owner's ring may still be draining), then gets KVT_ELOCKED.
 *
 * Recovery runs inside kvt__disk_open: every slot is read in batches
 * through the backend and checked (header, tokens and, by default, payload
 * checksum; recover_headers_only reads just each slot's 4 KiB prefix and
 * leaves payloads to the check every read does). Records of the same key
 * keep the newest seq; older copies are tombstoned. kvt__disk_recover then
 * hands the survivors to the engine.
 *
 * Records are the host-slot images of record.h; rec must be 4 KiB aligned
 * and kvt__record_bytes() long. Writes are not torn-proof on their own, but
 * a torn record fails its checksum, so it is discarded, never returned.
 *
 * Writes of records of 256 KiB and more are sealed on the store's checksum
 * threads, then handed to the backend; smaller ones in the call, which
 * costs less than the handoff. Reads are verified on the reaper as they
 * land: records of 256 KiB and more after the reaper sent the I/Os waiting
 * for room at the disk, each finished before the next is hashed; smaller
 * ones before that, finished together. Completions are delivered through
 * done(arg, status) on the store's own threads (the reaper; the sync
 * thread for durable writes), except an I/O that waited in the store for
 * room and is refused by the backend when sent: its done() runs on the
 * thread that sent it (the reaper, a checksum thread, or a caller in a
 * store call). So done() may run on several threads at once, with no store
 * lock held; most reads' done() run on the reaper, and every completion
 * waits while one runs: keep it short (hand the work on, as the engine
 * does). status is 0, -errno (EIO,
 * ENOSPC...; a short transfer is -EIO, not retried), KVT_ECORRUPT
 * (checksum) or KVT_EMISMATCH (the slot holds another key or namespace, or
 * is empty). EAGAIN/EINTR completions are resubmitted (up to 8 times).
 * done() may start new I/O; from there a full queue returns KVT_EAGAIN
 * instead of blocking.
 *
 * Threads: every call but open/recover/close may come from any thread. At
 * most one operation per slot may be in flight: a second one returns
 * KVT_EBUSY (the tier map's storing/loading states make this the engine's
 * normal behaviour anyway). Submission blocks while queue_depth operations
 * are in flight; for records sealed on the checksum threads, one more per
 * checksum thread, at most queue_depth more (a write being sealed or
 * waiting for a checksum thread, a read being verified, or an I/O waiting
 * for room at the disk holds its operation but no place at the disk, which
 * keeps queue_depth I/Os). */
#ifndef KVT_STORE_DISK_STORE_H
#define KVT_STORE_DISK_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvtier/backend.h"
#include "store/record.h"

typedef struct kvt__disk kvt__disk;
typedef void (*kvt__disk_done_fn)(void *arg, int status);

typedef struct kvt__disk_cfg {
  const char *path;
  uint64_t slots;            /* record slots */
  uint32_t block_tokens;
  uint64_t payload_bytes;    /* per block */
  kvt_key ns;                /* namespace; a file of another one: KVT_ENAMESPACE unless reset */
  uint32_t queue_depth;      /* I/Os at the disk (see Threads above); 0: kvt__disk_auto_depth */
  kvt_disk_backend backend;
  int reset;                 /* discard the file's contents */
  const void *const *bufs;   /* host pool memory to register with the backend */
  const size_t *buf_lens;    /* (both lists are copied: they may go after open) */
  uint32_t n_bufs;
  int recover_headers_only;  /* 1: recovery reads each slot's header and tokens
                                only (fast on huge files); payloads are still
                                verified on read */
  /* Optional: called by the open's recovery for every record it keeps
   * reading (header and token checksums passed), with its header and token
   * ids (NULL without KVT_RECORD_F_TOKENS), before older copies of a key
   * are dropped: a caller keeping something per key keeps the newest seq.
   * On the opening thread, one record at a time. */
  void (*on_record)(void *arg, const kvt__record_hdr *h, const uint32_t *tokens);
  void *on_record_arg;
  int durable;               /* 1: a write or tombstone reports done() only after an
                                fdatasync issued after its I/O completed returned
                                (one per group of completions): it survives power
                                loss; a failed fdatasync fails the whole group */
  char *detail;              /* optional: why an open failed, in words */
  size_t detail_len;
  uint32_t checksum_threads; /* threads that seal writes of records of
                                256 KiB and more (else none; reads are
                                verified on the reaper), at most 8; 0: one
                                per two online CPUs, 2 to 4 */
} kvt__disk_cfg;

/* Opens (creating or extending) the file, checks its superblock, starts the
 * backend and recovers. Returns 0, -errno, KVT_ENAMESPACE, KVT_ECORRUPT,
 * KVT_ELOCKED (another cache holds the file). May block. */
/* The default queue depth for records of slot_bytes: enough of them for
 * 16 MiB at the disk, of KVT_DISK_HANDOFF_BYTES and larger ones about 12
 * MiB (the nearest count), 8 to 256 (durable: 32 to 256). */
uint32_t kvt__disk_auto_depth(uint64_t slot_bytes, int durable);

int kvt__disk_open(const kvt__disk_cfg *cfg, kvt__disk **out);
void kvt__disk_close(kvt__disk *d); /* waits for I/O in flight; NULL is fine */

/* Calls fn once per valid record found at open (namespace and format match,
 * checksums good, newest seq per key), then frees that list: call it once,
 * before the first write (a second call returns KVT_ESTATE). Records that
 * failed are counted in *discarded (may be NULL). Returns the number of
 * records handed to fn. */
int kvt__disk_recover(kvt__disk *d,
                      void (*fn)(void *arg, uint64_t slot, const kvt_key *key, const kvt_key *parent),
                      void *arg, uint64_t *discarded);

/* Asynchronous write of the record image `rec` (in host-pool memory) to
 * slot; fills in magic, version, namespace, payload_len, seq and checksums
 * first (the engine fills key, parent, flags, token_count, tokens, payload),
 * in the call or, for records of 256 KiB and more, on a checksum thread:
 * rec belongs to the store until done(). seq follows the order of the
 * calls. Returns 0 when queued (done() follows) or a negative code (it does
 * not): -EINVAL, KVT_EBUSY, KVT_EAGAIN (from done() with a full queue),
 * -errno. A backend that refuses the request at submission fails it in
 * the call (small records) or through done() (records sealed on a checksum
 * thread): callers treat both alike. */
int kvt__disk_write(kvt__disk *d, uint64_t slot, void *rec, kvt__disk_done_fn done, void *arg);
/* Asynchronous read of slot into `rec`, then verification against
 * expected_key (NULL: any key) and the checksums. Returns as kvt__disk_write. */
int kvt__disk_read(kvt__disk *d, uint64_t slot, void *rec, const kvt_key *expected_key,
                   kvt__disk_done_fn done, void *arg);
/* The same, waited for: 0 or the read's (or the call's) error. */
int kvt__disk_read_sync(kvt__disk *d, uint64_t slot, void *rec, const kvt_key *expected_key);
/* Batches: one submission to the backend per up to 64 records. Each
 * ios[i].status receives 0 (queued: done(ios[i].arg, status) follows) or
 * the code a single call would have returned (not queued, no done()).
 * Returns how many were queued, or -EINVAL for a NULL d/done/ios. */
typedef struct kvt__disk_io {
  uint64_t slot;
  void *rec;
  const kvt_key *expected_key; /* reads: NULL = any key */
  void *arg;
  int status;                  /* out */
  const struct iovec *iov;     /* non-NULL: the record in pieces; rec is ignored */
  uint32_t n_iov;
  /* Reads: 1 = done() reports the I/O alone (0: the record landed whole,
   * NOT yet checked) and the caller checks it with kvt__disk_verify before
   * it trusts a byte; for a caller that waits for each read on a thread of
   * its own anyway, so the checksum runs there, off the reaper. */
  int verify_later;
  /* Reads of a record in pieces: 1 = iov may cover the prefix and only the
   * first part of the payload (whole 4 KiB pages on an O_DIRECT file), and
   * only that is read; the checksum takes the payload's bytes past it as
   * zeros, so a record whose writer left them zero (the last part of an
   * object) passes, and any change to the bytes read fails it. */
  int zero_tail;
  /* Out: 1 when the record in pieces went as fixed-buffer I/O (every
   * piece inside a buffer of kvt__disk_buf_register), 0 otherwise. */
  int fixed;
} kvt__disk_io;
/* A record in pieces (stores whose kvt__disk_info.vectored is 1; else
 * KVT_EUNSUPPORTED) moves straight between the file and memory that is
 * not one record image, in one vectored I/O: iov[0] is the prefix (header
 * and tokens, kvt__record_prefix_bytes long), iov[1..n_iov) the payload
 * laid end to end, kvt__record_bytes in all; n_iov <= KVT_DISK_MAX_IOV and,
 * on an O_DIRECT file, every base and length a multiple of 4096 (else
 * -EINVAL). Writes seal iov[0]; checksums are computed and verified over
 * the pieces in place, with the values the contiguous image gets, so a
 * record written one way reads back the other way. The array and the
 * memory it names belong to the store until done(); a read that fails
 * (I/O error, short, checksum, mismatch) may have left any bytes there. */
#define KVT_DISK_MAX_IOV 1024u
/* Checks a read whose io had verify_later, on the memory it landed in (io
 * as submitted): 0, KVT_ECORRUPT (a checksum failed), KVT_EMISMATCH
 * (another block's record, or an empty slot), as done() reports them for
 * the other reads; counted in the store's stats the same way. */
int kvt__disk_verify(kvt__disk *d, const kvt__disk_io *io);
int kvt__disk_write_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done);
int kvt__disk_read_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done);
/* The same, never waiting for a free op (the batch calls above wait while
 * queue_depth operations are in flight): the entry that finds the queue
 * full and every one after it get KVT_EAGAIN (not queued, no done()). A
 * restore submits what fits, then resumes from the first KVT_EAGAIN entry
 * when done() reports completions; that keeps the queue full without ever
 * blocking the caller on I/O. */
int kvt__disk_try_write_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done);
int kvt__disk_try_read_batch(kvt__disk *d, kvt__disk_io *ios, uint32_t n, kvt__disk_done_fn done);

/* Marks slot empty so recovery never returns it (the block was dropped):
 * writes a tombstone (a zeroed header page) and waits for it. Returns 0 or
 * the write's error. May block; call it without engine locks held. */
int kvt__disk_invalidate(kvt__disk *d, uint64_t slot);
/* The same, asynchronous: the slot may be reused once done() has run. */
int kvt__disk_invalidate_async(kvt__disk *d, uint64_t slot, kvt__disk_done_fn done, void *arg);

/* 1 if a tier of another namespace at `path` may be left alone and a file
 * made beside it: only for an existing regular file. Never beside a block
 * device (its folder is /dev, a devtmpfs in RAM). */
int kvt__disk_side_file_ok(const char *path);

/* "io_uring" or "threads". */
const char *kvt__disk_backend_name(const kvt__disk *d);

/* Fixed buffers (stores whose kvt__disk_info.fixed_vec is 1: io_uring on a
 * kernel with sparse buffer tables; else KVT_EUNSUPPORTED): registers
 * [base, base+len) (4096-aligned) with the backend, which pins it once. A
 * record in pieces (iov) whose every piece lies inside such buffers, with
 * at most KVT_IO_MAX_FIXED_VEC pieces, then goes as fixed-buffer I/O (one
 * READ_FIXED / WRITE_FIXED per piece, one completion), with no pinning per
 * I/O; any other goes as READV/WRITEV. Returns a handle (>= 0), -ENOSPC
 * (table full), or the backend's refusal (the kernel's -ENOMEM...): the
 * caller goes on without. May block (pinning). */
int kvt__disk_buf_register(kvt__disk *d, void *base, size_t len);
/* Waits until no op naming the buffer is in flight or queued, then
 * unregisters it (new records stop using it at once). */
void kvt__disk_buf_unregister(kvt__disk *d, int handle);

typedef struct kvt__disk_info {
  int direct;               /* 1: O_DIRECT; 0: the filesystem refused it (tmpfs), buffered I/O */
  int fixed_buffers;        /* host pool memory was handed to the backend for registration */
  int vectored;             /* the backend takes records in pieces (kvt__disk_io.iov) */
  int fixed_vec;            /* ... and fixed buffers registered later (kvt__disk_buf_register) */
  const char *fallback;     /* why io_uring is not used under KVT_DISK_AUTO ("" if it is) */
  uint64_t slots, slot_bytes, data_offset;
  uint32_t checksum_threads; /* threads sealing writes (reads: the reaper) */
  uint32_t queue_depth;      /* as configured (or the default) */
  uint32_t ops;              /* operations in flight at most: queue_depth, plus one per
                                checksum thread when records are sealed on them (at
                                most queue_depth), plus queue_depth in durable mode
                                (writes waiting for a sync) */
  uint32_t scan_width;       /* reads a recovery pass keeps in flight at most (the
                                backend's depth: ops, at least 64) */
} kvt__disk_info;

typedef struct kvt__disk_stats {
  uint64_t writes, reads, invalidates;        /* completed ok */
  uint64_t bytes_written, bytes_read;
  uint64_t checksum_failures;                 /* reads failing KVT_ECORRUPT */
  uint64_t mismatches;                        /* reads failing KVT_EMISMATCH */
  uint64_t io_errors;                         /* -errno or short, at submit or completion */
  uint64_t retries;                           /* EAGAIN/EINTR completions resubmitted */
  uint64_t syncs;                             /* durable mode: fdatasync calls, one per
                                                 group of completed writes (failed ones too) */
  uint64_t recovered, discarded, superseded;  /* at open */
  uint64_t fresh_starts;                      /* at open: damaged superblock, started empty */
  uint64_t resize_moved, resize_dropped;      /* at open after a slot count change */
  uint64_t recover_bytes;                     /* bytes the open-time scan read */
} kvt__disk_stats;

void kvt__disk_get_info(const kvt__disk *d, kvt__disk_info *info);
void kvt__disk_get_stats(const kvt__disk *d, kvt__disk_stats *st);

/* ---- record helpers (record.c) ---- */

/* XXH3_64 of the header bytes before hdr_sum. */
uint64_t kvt__record_hdr_sum(const kvt__record_hdr *h);
/* Fills magic, version, ns, payload_len, seq and the three checksums of a
 * record image whose identity fields are set. -EINVAL if flags/token_count
 * are inconsistent. */
int kvt__record_seal(void *rec, const kvt_key *ns, uint32_t block_tokens, uint64_t payload_bytes,
                     uint64_t seq);
/* The part of kvt__record_seal that can fail, without the hashing: 0, or
 * -EINVAL if flags/token_count are inconsistent. */
int kvt__record_seal_check(const void *rec, uint32_t block_tokens);
/* Checks len bytes at buf (any alignment, any content) as a record of this
 * geometry: 0 valid (header copied to *out when non-NULL), KVT_EMISS for an
 * all-zero header (empty slot), KVT_ECORRUPT (checksum, magic, version or
 * geometry), KVT_EMISMATCH (another namespace, or not expected_key when that
 * is non-NULL), -EINVAL for bad arguments. verify_payload = 0 skips the
 * payload checksum (then len may cover just the prefix). */
int kvt__record_check(const void *buf, size_t len, const kvt_key *ns, uint32_t block_tokens,
                      uint64_t payload_bytes, const kvt_key *expected_key, int verify_payload,
                      kvt__record_hdr *out);
/* The same for a record in pieces: iov[0] is the prefix (header and tokens,
 * exactly kvt__record_prefix_bytes long), iov[1..n) the payload laid end to
 * end (bytes past payload_bytes are padding). The payload sum is the one
 * the contiguous image gets, so either form reads back the other's. -EINVAL
 * when iov does not have that shape. A check with zero_tail takes a record
 * read in part: iov[1..n) may end before payload_bytes, and the payload's
 * bytes past them count as zeros (its writer left them so; bytes never read
 * are never checked, nor used). */
int kvt__record_seal_iov(const struct iovec *iov, uint32_t n, const kvt_key *ns, uint32_t block_tokens,
                         uint64_t payload_bytes, uint64_t seq);
int kvt__record_check_iov(const struct iovec *iov, uint32_t n, const kvt_key *ns, uint32_t block_tokens,
                          uint64_t payload_bytes, int zero_tail, const kvt_key *expected_key,
                          kvt__record_hdr *out);

#endif
