/* Storage mode internals: the engine owns its memory, kvtier is the tiers
 * below it (kvtier.h, "Storage mode").
 *
 * A batch call claims its blocks in the tier map under c->lock (puts: an
 * entry FILLING in the destination tier, so a second put of the key skips
 * it; gets: a pin on the source tier, so the block stays while it is read)
 * and queues the job for a storage worker. The worker makes room (the owner
 * mode cascade: host victims spill to disk, disk victims are dropped), moves
 * the bytes between the engine's pieces and a record image (a host slot, or
 * its staging ring for disk I/O), and commits each block's result under
 * c->lock. A disk block whose pieces are all registered host memory, 4 KiB
 * aligned in address and length, skips the staging copy: its record goes
 * straight between the file and the engine's pieces, in one vectored I/O
 * with the staging record holding only its prefix (header and tokens).
 * With io_uring, registered host regions (their page-aligned part) and each
 * worker's prefixes are also the disk store's fixed buffers, so such a
 * record goes as one READ_FIXED / WRITE_FIXED per run of pieces instead
 * (no pinning of the engine's pages per I/O; storage_blocks_fixed).
 * Disk completions only mark a staging buffer done (data, not
 * callbacks); the worker retires it, each as soon as its I/O is over, and
 * checks a read's checksums itself (kvt__disk_verify) before it copies or
 * commits a byte of it. A get's disk reads are submitted in batches. Job and region tables are guarded by
 * c->lock; a staging ring by its worker's own lock. */
#ifndef KVT_ENGINE_STORAGE_H
#define KVT_ENGINE_STORAGE_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/uio.h>

#include "engine/engine.h"

#define KVT__MAX_REGIONS 64u
#define KVT__STAGE_DEPTH 8u /* staged records in flight per worker */
/* Records moved straight in flight per worker: each holds a prefix page,
 * not a record, so a worker keeps the disk's whole queue busy on its own,
 * and as many again waiting for checksums or retirement; what the store's
 * ops cannot take yet waits in the store for one. On two CPUs shared with
 * other work (load 8-10), a few runs of kvtier-bench micro storage gave
 * 2 MiB puts at 0.41-0.98 of raw io_uring with 32 and 0.98-1.02 with 64;
 * gets 0.54-0.76 and 0.79-0.90 (the store's default depth was 32 then; it
 * is 8 for 2 MiB records now, with 16 ops then: puts 0.91, gets 0.94 in
 * one run; 10 ops now, one per checksum thread). */
#define KVT__STRAIGHT_DEPTH 64u
/* A get's straight reads in flight per worker: a quarter of the blocks
 * its job reads from disk, between KVT__STRAIGHT_MIN_WINDOW and
 * KVT__STRAIGHT_DEPTH. A
 * virtual disk completes the reads it was handed together, so a short job
 * that hands over all its records at once (an 8.4 MB object of 256 KiB
 * parts: two jobs of 16 and 17) waits for all of them, then checks every
 * checksum in series; in windows, the records that landed are checked
 * while the next are at the disk, and only the last window's checksums
 * are left at the end. Objects of 256 KiB parts read from disk, medians of
 * 41 gets interleaved in one run: 8.4 MB 4.7-5.1 ms in windows of 8
 * against 5.5-6.1 all at once; 33.6 MB 19.5-19.8 in windows of 8 or 16
 * against 20.5. A long job keeps the whole ring: 512 blocks of 2 MiB got in
 * windows of 8 ran at 0.78-0.82 of raw, at 0.89-0.93 with 64. Small jobs
 * gain a little from windows of 4 rather than 8 (a 2.1 MB object, two jobs
 * of 4 and 5 parts: 1.73-1.83 ms against 1.80-1.91, three alternating
 * pairs; 8.4 MB 5.41-5.64 against 5.57-5.79; llama_bench's 512-token
 * restore from disk 0.93-0.97 of llama.cpp's cold file against 0.98-1.06). */
#define KVT__STRAIGHT_MIN_WINDOW 4u
/* iovecs of a record moved straight: its prefix and the runs of its
 * pieces (adjacent pieces merge); a block needing more goes through
 * staging. */
#define KVT__STRAIGHT_IOV 256u

typedef struct kvt__region {
  char *base;
  size_t len;
  int kind;       /* KVT_MEM_* */
  uint32_t users; /* jobs in flight naming it */
  uint8_t used;
  uint8_t busy;   /* being registered with the disk store (usable meanwhile) */
  uint8_t dying;  /* being unregistered from it (no new job may name it) */
  int fixed;      /* the disk store's fixed-buffer handle of its pages, or -1 */
} kvt__region;

typedef struct kvt__spiece {
  char *ptr;
  uint64_t len;
  uint8_t device;
  uint8_t registered; /* inside a region the engine registered */
} kvt__spiece;

enum { KVT__SJ_PUT = 1, KVT__SJ_GET = 2 };

typedef struct kvt__sblock {
  uint32_t entry; /* KVT__NONE: skipped or not loaded (or a get from the remote tier) */
  uint8_t tier;   /* put: destination; get: source (KVT__T_REMOTE: fetched from the remote, no entry) */
  int32_t result;
  uint32_t host_slot; /* KVT_GET_PROMOTE: the host slot (FILLING) a disk block also lands in, or KVT__NONE */
} kvt__sblock;

typedef struct kvt__sjob {
  uint32_t gen;
  uint8_t busy, done, user, kind, has_tokens;
  uint8_t opaque;   /* KVT_KEYS_OPAQUE: records carry the namespace as parent */
  uint8_t zero_tail; /* a get whose blocks' pieces may end early (kvt__get_into_part) */
  uint8_t promote;   /* KVT_GET_PROMOTE: disk blocks also land in the host tier */
  kvt_key parent0;  /* chained keys: the parent of keys[0] */
  int status;
  uint32_t n_blocks, ppb;
  uint64_t regions; /* bit r: region r+1 is named by a piece */
  kvt__sblock *blocks; /* blocks_cap entries, grown to the largest batch seen */
  kvt_key *keys;
  size_t blocks_cap;
  kvt__spiece *pieces;
  size_t pieces_cap;
  uint32_t *tokens;
  size_t tokens_cap;
} kvt__sjob;

typedef struct kvt__stage {
  void *rec;         /* a staged record, or (straight ring) a record's prefix */
  struct iovec *iov; /* straight ring: rec, then the engine's pieces */
  uint32_t n_iov;    /* 0: the block is staged whole in rec */
  int fixed;         /* its I/O went as fixed-buffer ops (kvt__disk_io.fixed) */
  uint32_t block; /* block index in the job, KVT__NONE when idle */
  int in_flight;
  int status;
  struct kvt__sworker *w;
} kvt__stage;

typedef struct kvt__sworker {
  kvt_cache *c;
  pthread_t thread;
  pthread_mutex_t lock; /* guards the ring's in_flight / status */
  pthread_cond_t cond;
  kvt__stage stage[KVT__STAGE_DEPTH];
  kvt__stage straight[KVT__STRAIGHT_DEPTH]; /* when the store takes records in pieces */
  uint32_t next, next_straight;
  int prefix_fixed; /* the disk store's fixed-buffer handle of the straight prefixes, or -1 */
} kvt__sworker;

typedef struct kvt__storage {
  kvt__region regions[KVT__MAX_REGIONS];
  kvt__sjob *jobs;
  uint32_t *free_jobs, n_free;
  uint32_t *queue, q_head, q_len;  /* jobs waiting for a worker */
  uint32_t *done_q, d_head, d_len; /* finished user jobs not yet collected */
  uint32_t active;                 /* jobs queued or running (kvt_drain waits for them) */
  uint32_t promoting;              /* host slots promoting gets hold FILLING (a put waits for them) */
  pthread_cond_t work;             /* with c->lock: the queue grew or stop */
  int stop;
  uint32_t n_workers;
  kvt__sworker *workers;
  int straight;                    /* the disk store takes records in pieces */
  size_t ring_bytes;               /* each worker's staging ring */
  int started;
  _Atomic size_t job_table_bytes;  /* jobs' block, key, piece and token tables, as grown */
} kvt__storage;

/* Bytes of storage mode's bookkeeping: job slots and queues, the workers,
 * their straight iovec tables and the jobs' tables as grown so far
 * (kvt_stats.metadata_bytes). 0 for a cache not in storage mode. */
size_t kvt__storage_metadata_bytes(const kvt_cache *c);

/* kvt_get_into for a caller inside kvtier whose blocks' pieces may cover
 * just the first part of a block (objects' last parts): the rest of the
 * block is not read, and its writer must have left it zero, since the
 * disk's checksums take it as zeros (kvt__disk_io.zero_tail). Blocks read
 * from the host tier or through staging are checked whole as usual. */
int kvt__get_into_part(kvt_cache *c, const kvt_batch *b, kvt_job *job);

/* object.c: the storage keys of parts [first, first + n) of the object
 * filed under key (tests name them to hold a part). */
void kvt__object_part_keys(kvt_cache *c, const kvt_key *key, uint32_t first, uint32_t n, kvt_key *out);

/* storage_run.c: the worker thread. */
void *kvt__storage_worker(void *arg);
/* storage_through.c: KVT_WRITE_THROUGH's disk copies of a put (lock NOT held). */
void kvt__storage_write_through(kvt_cache *c, const kvt__sjob *jb);
/* storage_dev.c: device memory (CUDA builds). */
int kvt__storage_dev_check(void *base, size_t len);
int kvt__storage_dev_copy(void *dst, const void *src, size_t len, int to_device);

#endif
