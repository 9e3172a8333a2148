/*
 * kvtier.h - KV-cache tiering for LLM inference: the public C API.
 *
 * This is the only header an engine needs. kvtier keeps the KV cache of idle
 * conversations in three tiers - T0 device (the engine's own KV pool, on the
 * GPU or in RAM), T1 pinned host pool, T2 disk - and brings it back when a
 * conversation returns, whenever restoring is cheaper than recomputing. An
 * optional T3, remote (a Redis server or cluster), is shared by every cache
 * that points at it (the config's remote_url).
 *
 * Conventions (stated once, they hold for every function below):
 *
 *  - Return values: 0 success, 1 "in progress" for asynchronous calls, and a
 *    negative code on error: -errno for OS errors, or one of the KVT_E* codes
 *    below. kvt_strerror() names every code. No function aborts or exits on
 *    bad input; NULL or inconsistent arguments return -EINVAL or a KVT_E*.
 *  - Thread safety: one kvt_cache may be used from any number of threads at
 *    once. Every call takes the cache's metadata lock only for O(1)/O(n
 *    blocks) bookkeeping, never across a copy or an I/O. Exceptions: kvt_open,
 *    kvt_register_layout and kvt_close must not race other calls on the same
 *    cache. Functions marked "may block" wait for copies or I/O;
 *    kvt_acquire and kvt_prefetch never wait for disk reads, their own or
 *    another job's (a block another request's load or a prefetch is
 *    already copying into a faster tier is restored by following that
 *    copy, never by waiting for it), except that kvt_acquire without
 *    KVT_ACQUIRE_NOWAIT may wait for room: for evictions, which may wait
 *    for transfers in flight (with a remote
 *    tier, lookups, plans, kvt_acquire, kvt_prefetch and storage mode's
 *    exists and get wait for existence round trips to the server, one per
 *    256 blocks after the local prefix, each wait, queueing behind the
 *    cache's other remote work included, bounded by remote_timeout_ms;
 *    never for its data).
 *    kvtier's own threads (docs/pipeline.md): device copy workers (host
 *    backend) or CUDA's completion thread, the disk reaper and checksum
 *    threads, and one progress thread per cache. Backend threads only post
 *    completion records (job, op, status) to the cache's completion queue;
 *    applying them to the tier map and starting what follows (eviction,
 *    spills, write-through, a restore's next stage) runs on the progress
 *    thread, or inside a call that polls or waits for them
 *    (kvt_request_poll/wait, kvt_job_poll/wait, kvt_release, kvt_drain, an
 *    acquire waiting for evictions). Only the progress thread hands I/O to
 *    the disk store, and it never waits for a free queue entry.
 *  - Callbacks: none but the optional log hook (kvt_set_log_handler, or
 *    the config's log_fn).
 *    kvtier never calls into the engine from its threads otherwise;
 *    completion is learned by polling or waiting.
 *  - Structs only ever grow, and `size` says which version the caller was
 *    built with. Structs the engine fills have an *_init() that sets the
 *    defaults and `size`; set fields after calling it. Any size from the
 *    struct's first version (KVT_*_SIZE_V1) up is accepted: fields the
 *    caller's version lacks take their defaults, and a larger size (up to 4 KiB
 *    more) is accepted when every byte this library does not know is zero
 *    (else KVT_EVERSION, as for a size below the first version). Structs the
 *    library fills (stats, lookup results, acquire info, plans): the caller
 *    sets `size`; at most that many bytes are written and `size` becomes the
 *    bytes written (fields past it are left untouched).
 *  - fork(): a cache belongs to the process that opened it. In a child,
 *    every call on an inherited cache returns KVT_EFORKED (its threads and
 *    transfers stayed in the parent) and kvt_close frees nothing; open a new
 *    cache in the child (with another disk_path: the parent keeps its file).
 *    Python engines using multiprocessing's "fork" start method hit this.
 *  - Logging: the library never writes to stdout; its warnings and errors
 *    go to stderr unless the config's log_fn, a process-wide handler
 *    (kvt_set_log_handler) or log_level = KVT_LOG_NONE says otherwise.
 *  - Memory: block slots, jobs and requests are allocated at open / layout
 *    registration; lookup, commit, release and the copy paths do not
 *    allocate. Acquire allocates only when the block references of all live
 *    requests together pass their previous peak (requests sharing a cached
 *    prefix each hold references to its slots); a request that fits in the
 *    free device slots is never refused for lack of reference space.
 */
#ifndef KVTIER_KVTIER_H
#define KVTIER_KVTIER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVT_BUILDING) && (defined(__GNUC__) || defined(__clang__))
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

/* ------------------------------------------------------------------ */
/* Version and errors                                                  */
/* ------------------------------------------------------------------ */

/* The library's version string ("0.1.0"); the header's is KVT_VERSION_STRING. */
KVT_API const char *kvt_version(void);
/* KVT_VERSION_NUMBER of the library actually linked. */
KVT_API int kvt_version_number(void);

#define KVT_OK 0
#define KVT_INPROGRESS 1

/* kvtier's own codes: -3001..-3999. Codes are never renumbered or reused. */
#define KVT_ERROR_MAP(XX)                                                                   \
  XX(KVT_EMISS, -3001, "block is not cached in any tier")                                   \
  XX(KVT_EMISMATCH, -3002, "stored tokens or parent key differ from the request's")         \
  XX(KVT_ENOSPACE, -3003, "tier is full: every slot is pinned or in flight")                \
  XX(KVT_ENODEV, -3004, "no usable device: no GPU, or the driver is unavailable")           \
  XX(KVT_ECORRUPT, -3005, "stored record failed its checksum")                              \
  XX(KVT_ECANCELED, -3006, "job was cancelled")                                             \
  XX(KVT_EBUSY, -3007, "object is pinned or has transfers in flight")                       \
  XX(KVT_ELAYOUT, -3008, "no KV layout registered, or the arguments do not fit it")         \
  XX(KVT_ESTATE, -3009, "call is not valid in the object's current state")                  \
  XX(KVT_EVERSION, -3010, "struct size or version is not supported by this library")        \
  XX(KVT_EAGAIN, -3011, "busy: copies in flight, or every job handle held until kvt_job_release; ask again later") \
  XX(KVT_ENOJOB, -3012, "unknown, finished-and-released, or foreign job or request handle") \
  XX(KVT_EUNSUPPORTED, -3013, "not supported by this backend or build")                     \
  XX(KVT_ENAMESPACE, -3014, "stored data belongs to another model, layout or format")       \
  XX(KVT_ETIMEDOUT, -3015, "timed out before the transfer finished")                      \
  XX(KVT_EFORKED, -3016, "cache belongs to the parent process: a forked child cannot use it") \
  XX(KVT_ELOCKED, -3017, "disk file is in use by another open cache")                       \
  XX(KVT_EREMOTE, -3018, "remote tier unreachable, failing or degraded")                     \
  XX(KVT_EAUTH, -3019, "remote tier refused the credentials")

enum {
#define KVT_XX_ENUM(name, value, text) name = (value),
  KVT_ERROR_MAP(KVT_XX_ENUM)
#undef KVT_XX_ENUM
};

/* A static string for any return code (0, 1, -errno, KVT_E*). Never NULL. */
KVT_API const char *kvt_strerror(int code);

/* Log levels, most severe first. KVT_LOG_NONE as a cache's log_level: no messages. */
enum { KVT_LOG_NONE = -1, KVT_LOG_ERROR = 0, KVT_LOG_WARN = 1, KVT_LOG_INFO = 2 };
typedef void (*kvt_log_fn)(void *ctx, int level, const char *msg);
/* The log hook. A cache's messages go to its config's log_fn when set, else
 * to the process-wide handler installed here, else to stderr as
 * "kvtier: warning: ..." lines; the cache's log_level (KVT_LOG_WARN by
 * default) drops the less severe ones wherever they go.
 * A handler is called on whichever thread notices the event, kvtier's own
 * copy workers and disk completion thread included (the one documented
 * exception to "no callbacks"), with a one-line message, no trailing
 * newline, and no kvtier lock held; it must return promptly and must not
 * call into the cache. One line per operator event, never per block:
 *  - warning: disk I/O backend fallback ("io_uring refused (...)"), io_uring
 *    fixed buffers refused, host pool pinning refused (pageable memory),
 *    a disk file of another namespace set aside (both paths named), a
 *    damaged superblock (tier started empty), a disk that cannot preallocate;
 *  - error: disk I/O errors, records failing their checksum, device copy
 *    errors: the first at once, then at most one line per second per kind,
 *    counting the ones in between (those still held back at kvt_close
 *    are reported then); read errors while recovering the disk tier;
 *    preallocation failures;
 *  - info: a disk tier resized or recovered (blocks found, discarded).
 * A line is written after the lock that found its event is released, so it
 * may arrive just after a wait that saw the failure returns. A replaced
 * handler may still be running on another thread for a moment after this
 * call returns: keep its ctx alive until kvt_close of every cache (or
 * process exit).
 * NULL restores the default. */
KVT_API void kvt_set_log_handler(kvt_log_fn fn, void *ctx);

/* ------------------------------------------------------------------ */
/* Keys                                                                */
/* ------------------------------------------------------------------ */

/* A 128-bit block key. Keys made by kvtier are prefix-chained:
 * key[i] = H(tokens of block i, chained by key[i-1]), key[-1] = namespace,
 * so equal keys mean equal prefixes (up to 2^-128 collisions, which the
 * token verification of restores catches anyway). */
typedef struct kvt_key {
  uint64_t lo;
  uint64_t hi;
} kvt_key;

/* ------------------------------------------------------------------ */
/* Configuration                                                       */
/* ------------------------------------------------------------------ */

typedef enum kvt_dtype {
  KVT_DTYPE_F16 = 1,
  KVT_DTYPE_BF16 = 2,
  KVT_DTYPE_F32 = 3,
  KVT_DTYPE_FP8_E4M3 = 4,
  KVT_DTYPE_FP8_E5M2 = 5,
  KVT_DTYPE_INT8 = 6,
  KVT_DTYPE_OTHER = 255
} kvt_dtype;

typedef enum kvt_device_kind {
  KVT_DEVICE_AUTO = 0, /* CUDA if a GPU is usable, else the host backend */
  KVT_DEVICE_HOST = 1, /* engine KV in RAM; copies are memcpy on a worker */
  KVT_DEVICE_CUDA = 2  /* engine KV in GPU memory; fails with KVT_ENODEV without one */
} kvt_device_kind;

typedef enum kvt_disk_backend {
  KVT_DISK_AUTO = 0,    /* io_uring, falling back to threads if the kernel refuses it */
  KVT_DISK_URING = 1,   /* io_uring only */
  KVT_DISK_THREADS = 2  /* pread/pwrite on a thread pool */
} kvt_disk_backend;

typedef enum kvt_write_policy {
  KVT_WRITE_BACK = 0,   /* copy a block down only when it is evicted (default) */
  KVT_WRITE_THROUGH = 1 /* copy every committed (or, in storage mode, put) block down at once */
} kvt_write_policy;

typedef struct kvt_config {
  uint32_t size;         /* sizeof(kvt_config); set by kvt_config_init */
  uint32_t block_tokens; /* tokens per block: power of two, 16..1024 (16) */

  /* Namespace: caches of different models, layouts, ranks or tenants never alias. */
  const char *model_fingerprint; /* required: model id, revision, adapter... */
  kvt_dtype dtype;               /* KV dtype (KVT_DTYPE_BF16) */
  uint32_t tp_rank, tp_size;     /* tensor-parallel rank and size (0, 1) */
  uint64_t tenant_salt;          /* optional per-tenant salt (0) */

  /* Device tier. */
  kvt_device_kind device;    /* KVT_DEVICE_AUTO */
  int cuda_device;           /* CUDA ordinal (0) */
  uint32_t copy_threads;     /* host backend copy workers (0: one per available core) */

  /* Host tier (T1). */
  uint64_t host_blocks;      /* slots in the pinned host pool; 0 = no host tier.
                              * kvt_register_layout faults every page in (huge
                              * pages where the kernel allows): about 0.05-0.3 s
                              * per GiB with huge pages, 0.4-1 s without */
  int host_mlock;            /* mlock the host pool when no CUDA pinning (0) */

  /* Disk tier (T2): a file (preallocated in full, holes of a sparse file
   * included; kvt_register_layout fails with -ENOSPC, leaving the file as
   * it was, when the filesystem cannot hold it) or a block device.
   * - Another namespace or format (another model, layout, rank, tenant or
   *   kvtier version): a regular file is left untouched and kvtier starts
   *   clean in "<disk_path>.<namespace hex>" beside it; a block device
   *   holding another kvtier namespace is taken over (started empty; never
   *   a file beside it), one holding other data is refused (KVT_ENAMESPACE).
   *   disk_reset = 1 discards whatever the path holds instead.
   * - Resize: another disk_blocks for the same namespace is not another
   *   namespace. Growing keeps every block; shrinking keeps what fits
   *   (blocks past the new end move into free slots below it, newest
   *   first) and drops the rest (stats: disk_resize_moved/_dropped); a file
   *   follows the new size.
   * - A damaged superblock starts the tier empty in place: counted in
   *   disk_fresh_starts and logged, never an error.
   * - Reopen cost: kvt_register_layout reads each slot's record header and
   *   token ids only (512 B per slot where the file takes direct reads of
   *   512 B, else 4 KiB), never payloads: a fetch verifies the payload's
   *   checksum anyway. A full 1 GiB tier of 64 KiB blocks reads 7.9 MB
   *   (1/136 of it); of 4 KiB blocks, 1/16. Records whose payload was torn
   *   by a crash are found at their first fetch, a counted miss.
   * - Durability: a block is "on disk" once its record write completed.
   *   Such blocks survive a process crash or kill with the same path and
   *   namespace. By default records are not flushed from the OS's cache:
   *   after a power loss or kernel crash recent blocks may be missing (never
   *   wrong: every record is checksummed). With disk_durable = 1 a block
   *   counts as on disk only after an fdatasync that followed its record
   *   write completed (writes completing together share one): such blocks
   *   survive power loss too, at a cost in spill throughput that depends
   *   on the drive. A failed fdatasync fails every spill it covered (I/O
   *   errors; the blocks are dropped, recomputed when next asked for).
   *   Blocks only in RAM survive nothing. */
  const char *disk_path;     /* file or block device; NULL = no disk tier */
  uint64_t disk_blocks;      /* record slots on disk */
  uint32_t disk_queue_depth; /* I/Os at the disk at once (0, the default: enough for
                              * 16 MiB of records under 256 KiB, about 12 MiB of larger
                              * ones, 8 to 256 of them, at least 32 with disk_durable;
                              * at most 4096; an array of several drives may want more) */
  kvt_disk_backend disk_backend; /* KVT_DISK_AUTO */
  int disk_reset;            /* 1: discard whatever the file holds (0) */
  kvt_write_policy write_policy; /* KVT_WRITE_BACK */

  /* Capacities of preallocated bookkeeping. */
  uint32_t max_requests;     /* concurrently acquired requests (1024; at most 2^20) */
  uint32_t max_jobs;         /* job handles (kvt_store, kvt_prefetch) and request loads
                              * in flight (256); internal work (demotions, spills,
                              * write-through) has jobs of its own besides. A finished
                              * job holds only its handle until kvt_job_release; a
                              * request whose loads are over holds no job */
  uint32_t max_job_blocks;   /* blocks one transfer may carry (8192) */

  /* Appended after the first version (KVT_CONFIG_SIZE_V1). */
  int disk_durable;          /* 1: a block counts as on disk only after an fdatasync
                                that followed its write completed: it survives
                                power loss (0) */
  /* The log hook (see kvt_set_log_handler). log_fn NULL: the process-wide
   * handler, else stderr. It may be called from kvtier's threads. */
  kvt_log_fn log_fn;         /* (NULL) */
  void *log_ctx;             /* passed to log_fn (NULL) */
  int log_level;             /* KVT_LOG_* or KVT_LOG_NONE (KVT_LOG_WARN) */

  /* Remote tier (T3): a Redis server or Redis Cluster (Valkey alike) that
   * every cache pointing at it shares, below disk (below host without a
   * disk tier). Needs a host tier (host_blocks > 0): remote blocks stage
   * through it. What reaches it: a block leaving the host (evicted: spilled
   * to disk and put to the remote; without disk, put), or every block that
   * reaches the host with KVT_WRITE_THROUGH. What comes back: lookups,
   * plans and kvt_acquire probe the remote for the blocks after the local
   * prefix (one pipelined round trip), kvt_acquire and kvt_prefetch fetch
   * remote hits into host slots (and write them to disk on the way up).
   * Keys are "<remote_key_prefix><namespace>:<block key>" (hex): caches of
   * different models never alias. Values are the disk's self-checking
   * records; nothing read back is trusted (namespace, key, parent, tokens
   * and checksums are verified; a bad or foreign value is a counted miss).
   * kvt_register_layout connects: an unreachable server is not an error
   * (the tier starts degraded, is logged, and comes back by itself, with
   * backoff), refused credentials are (KVT_EAUTH), a malformed URL is
   * -EINVAL, a build without hiredis says KVT_EUNSUPPORTED. A cache with a
   * metadata-only layout has no bytes to share and ignores the remote tier.
   * The server's maxmemory policy evicts; kvtier keeps no remote index,
   * only a short-lived negative cache of keys found absent. */
  /* "redis://[user[:password]@]host:port[,host:port...]": one server, or
   * seed nodes of a cluster (the scheme may be omitted; "valkey://" too;
   * a host without ":port" is port 6379; user and password may be
   * %-encoded).
   * NULL: no remote tier (the default). Copied by kvt_open. */
  const char *remote_url;
  const char *remote_user;       /* ACL user (NULL: the URL's, else "default") */
  /* AUTH password (NULL: the URL's, else none). Copied by kvt_open, wiped
   * from memory at kvt_close; never in stats, metrics or log lines (URLs
   * are logged with the password masked). */
  const char *remote_password;
  /* (NULL: "kvt:"; at most 60 bytes, else kvt_register_layout says -EINVAL) */
  const char *remote_key_prefix;
  uint32_t remote_timeout_ms;    /* connect and every round trip (0: 2000) */
  uint32_t remote_conns_per_node;/* connections per server node (0: 2; at most 64) */
  uint32_t remote_negative_ms;   /* how long a key found absent is not asked again (0: 1000) */
} kvt_config;

/* Size of each struct's first version: the smallest `size` accepted. */
#define KVT_CONFIG_SIZE_V1 (offsetof(kvt_config, max_job_blocks) + sizeof(uint32_t))

KVT_API void kvt_config_init(kvt_config *cfg);

/* ------------------------------------------------------------------ */
/* Layout of the engine's KV pool                                      */
/* ------------------------------------------------------------------ */

/* One segment of one layer: K, V, or an MLA latent. Block slot s of this
 * segment is the `bytes` bytes at base + s * stride. Every engine layout
 * reduces to this: vLLM FlashAttention (2, blocks, ...) per layer = two
 * segments whose bases are the halves; FlashInfer (blocks, 2, ...) = stride
 * of two segments; cross-layer blocks = one layer, one segment. */
typedef struct kvt_segment {
  void *base;
  size_t stride;
  size_t bytes;
} kvt_segment;

typedef struct kvt_layout {
  uint32_t size;               /* sizeof(kvt_layout); set by kvt_layout_init */
  uint32_t num_layers;         /* >= 1 */
  uint32_t segments_per_layer; /* 2 for K and V, 1 for MLA or packed blocks */
  uint32_t num_slots;          /* block slots in the engine's pool (the device tier) */
  /* num_layers * segments_per_layer entries, layer-major. NULL with
   * KVT_LAYOUT_METADATA_ONLY: no bytes move (simulation, planning). */
  const kvt_segment *segments;
  uint32_t flags;
} kvt_layout;

#define KVT_LAYOUT_METADATA_ONLY 0x1u
/* Storage mode (see "Storage mode" below): the engine owns its KV memory and
 * kvtier is only the tiers below it. num_slots must be 0 (kvtier hands out
 * no device slots); the segments give the geometry of one block (their
 * `bytes`; base and stride are ignored and may be NULL / 0), which sizes the
 * records and enters the namespace exactly as in owner mode. */
#define KVT_LAYOUT_STORAGE 0x2u
#define KVT_LAYOUT_SIZE_V1 (offsetof(kvt_layout, flags) + sizeof(uint32_t))

KVT_API void kvt_layout_init(kvt_layout *layout);

/* ------------------------------------------------------------------ */
/* Lifecycle                                                           */
/* ------------------------------------------------------------------ */

typedef struct kvt_cache kvt_cache;

/* Opens a cache: checks and copies the configuration (strings included).
 * The tier map, jobs, requests, host pool and disk file come with
 * kvt_register_layout, once the layout is known. Returns 0, -EINVAL (a
 * field out of range; an ERROR line to cfg->log_fn, or the process-wide
 * handler, else stderr, names it), KVT_EVERSION (cfg->size), -ENOMEM, or KVT_ENODEV:
 * with cfg->device = KVT_DEVICE_CUDA, a build without the CUDA backend
 * returns it here; a build with it but no usable GPU returns it from
 * kvt_register_layout. On success *out owns everything; free it with
 * kvt_close. Does not block. */
KVT_API int kvt_open(const kvt_config *cfg, kvt_cache **out);

/* Registers the engine's KV layout; must precede every block operation.
 * Computes the namespace (config + layout geometry), allocates the host
 * pool (pinned through the device backend when it can), and recovers the
 * disk tier's blocks written under the same namespace. Once per cache.
 * The segments array is copied. May block.
 * Layout rules (else -EINVAL, the cache unchanged and the call may be
 * repeated): every segment's slots, base + s * stride for s < num_slots plus
 * bytes, lie inside the address space (spans below 2^56 bytes); no two
 * segments share a byte in any slot (interleaved segments of one stride are
 * fine); a block's bytes (sum over segments) are at most 1 GiB.
 * Returns 0, -EINVAL, KVT_EVERSION (struct size), -E2BIG (more than 2^30
 * slots in all), KVT_ENODEV, -ENOMEM, or for the disk tier -errno (the
 * path cannot be opened, created or preallocated: -ENOENT, -EACCES,
 * -ENOSPC...), KVT_ELOCKED (another open cache holds disk_path).
 * kvt_error_detail() names the segment or path at fault. After a failure
 * past validation the cache can only be closed (KVT_ESTATE). */
KVT_API int kvt_register_layout(kvt_cache *c, const kvt_layout *layout);

/* Waits for every transfer in flight, then frees everything. NULL is fine.
 * In a forked child it frees nothing (see fork() above). */
KVT_API void kvt_close(kvt_cache *c);

/* Bytes of one block (sum of segment bytes over layers); 0 for metadata-only. */
KVT_API size_t kvt_block_bytes(const kvt_cache *c);
/* Why the last failed kvt_register_layout failed, naming the path or the
 * segment at fault ("disk_path /x: cannot open: Permission denied"), or ""
 * when it did not fail. Valid until the next kvt_register_layout or
 * kvt_close of this cache; like kvt_register_layout it must not race them. */
KVT_API const char *kvt_error_detail(const kvt_cache *c);
/* The namespace key (valid after kvt_register_layout). */
KVT_API int kvt_namespace(const kvt_cache *c, kvt_key *ns);
/* Name of the device backend in use ("host", "cuda") and of the disk backend
 * ("io_uring", "threads", or "none"). Static strings. */
KVT_API const char *kvt_device_backend_name(const kvt_cache *c);
KVT_API const char *kvt_disk_backend_name(const kvt_cache *c);

/* ------------------------------------------------------------------ */
/* Keys from tokens or from the engine's own hashes                    */
/* ------------------------------------------------------------------ */

/* Hashes the full blocks of tokens[0..n_tokens) into prefix-chained keys;
 * the trailing partial block is not keyed. `parent` is the key of the block
 * before tokens[0] (NULL: the namespace, i.e. tokens start the sequence), so
 * a growing conversation can extend its chain. Writes n_tokens/block_tokens
 * keys (at most max_keys, else -ENOBUFS) and stores the count in *n_keys. */
KVT_API int kvt_hash_tokens(const kvt_cache *c, const kvt_key *parent, const uint32_t *tokens,
                            size_t n_tokens, kvt_key *keys, size_t max_keys, size_t *n_keys);

/* Turns n opaque engine keys of key_bytes each (vLLM block hashes, SGLang
 * page hashes) into kvtier keys within this cache's namespace. The engine's
 * keys must already be prefix-chained; no token verification is possible
 * unless tokens are also passed to kvt_acquire. */
KVT_API int kvt_keys_from_opaque(const kvt_cache *c, const void *opaque, size_t key_bytes, size_t n,
                                 kvt_key *keys);

/* ------------------------------------------------------------------ */
/* Read path: lookup, plan, acquire                                    */
/* ------------------------------------------------------------------ */

enum { KVT_TIER_DEVICE = 0, KVT_TIER_HOST = 1, KVT_TIER_DISK = 2, KVT_TIER_REMOTE = 3, KVT_TIER_NONE = 255 };

typedef struct kvt_lookup_result {
  uint32_t size;     /* sizeof(kvt_lookup_result); the caller sets it */
  uint32_t n_blocks; /* keys asked about */
  uint32_t n_prefix; /* longest prefix cached in some tier */
  /* The prefix's blocks counted by the fastest tier holding each. */
  uint32_t n_device, n_host, n_disk;
  /* Appended: blocks of the prefix found only on the remote tier (after
   * the local ones: a remote probe extends the local prefix). A probe says
   * a key is stored; the fetch still verifies it, so a remote block may
   * turn out a miss at kvt_acquire. */
  uint32_t n_remote;
} kvt_lookup_result;
#define KVT_LOOKUP_RESULT_SIZE_V1 (offsetof(kvt_lookup_result, n_disk) + sizeof(uint32_t))

/* Longest cached prefix of keys[0..n), split by tier. No side effects: it
 * neither pins nor touches, so a scheduler may ask again later. Optional
 * tier_of_block[n] receives KVT_TIER_* per block (NONE after the prefix).
 * With a remote tier, the keys after the local prefix are asked of the
 * remote (a round trip per 256 of them; the call waits at most
 * remote_timeout_ms for each, queueing behind other remote work included,
 * and a key not answered by then is a miss for this call, asked again the
 * next; skipped for a key the server said was absent within
 * remote_negative_ms): may block that long. */
KVT_API int kvt_lookup(kvt_cache *c, const kvt_key *keys, size_t n, kvt_lookup_result *res,
                       uint8_t *tier_of_block);

#include "kvtier/cost.h"

#define KVT_MODEL_DESC_SIZE_V1 (offsetof(kvt_model_desc, v_head_dim) + sizeof(uint32_t))
#define KVT_HW_DESC_SIZE_V1 (offsetof(kvt_hw_desc, overlap) + sizeof(int))
#define KVT_PLAN_SIZE_V1 (offsetof(kvt_plan, in_overlap) + sizeof(int))

/* Plans a request of n_tokens tokens whose full blocks have keys[0..n_blocks):
 * looks the prefix up and asks the cost model (kvt_set_cost_model) how many
 * leading blocks to restore; the rest is recomputed. The plan carries the
 * estimates and the inputs behind them. No side effects. */
KVT_API int kvt_plan_request(kvt_cache *c, const kvt_key *keys, size_t n_blocks, size_t n_tokens,
                             kvt_plan *plan);

/* A request in flight: its blocks hold device slots until kvt_release. */
typedef uint64_t kvt_req;

typedef struct kvt_acquire_info {
  uint32_t size;         /* sizeof(kvt_acquire_info); the caller sets it */
  uint32_t n_restore;    /* blocks [0, n_restore) hold cached KV once loaded */
  uint32_t n_device_hits;/* of which already on the device (no copy) */
  uint32_t n_loading;    /* of which copied from host or disk */
  uint32_t n_from_disk;  /* of which fetched from disk first (by this request: blocks
                            another job is fetching count as host blocks) */
  uint32_t n_from_remote;/* appended: of which fetched from the remote tier first */
} kvt_acquire_info;
#define KVT_ACQUIRE_INFO_SIZE_V1 (offsetof(kvt_acquire_info, n_from_disk) + sizeof(uint32_t))

#define KVT_ACQUIRE_NOWAIT 0x1u /* KVT_EAGAIN instead of waiting for room (evictions, a free job) */

/* Gives a request device slots for n_blocks keyed blocks plus extra_slots
 * more (partial block, decode). The first `restore` keyed blocks are
 * restored where cached (device hits are shared and pinned; host and disk
 * blocks are loaded asynchronously); the rest get fresh slots for the
 * engine to compute into. Restoring stops at the first miss or, when tokens
 * (n_blocks * block_tokens ids, may be NULL) are given, at the first block
 * whose stored tokens or parent differ (counted as a mismatch).
 * slots[n_blocks + extra_slots] receives the slot of every block.
 * May block while evicted blocks are copied down (never with NOWAIT); never
 * waits for disk reads: blocks restored from disk are read by kvtier's
 * progress thread, in batches, after the call has returned 1, and their
 * device copies start chunk by chunk as the reads land. Nor for another
 * job's copy of a block it restores: a block a prefetch or another
 * request's load is fetching into the host is not read twice, its device
 * copy starts when that fetch lands (if the fetch fails, the block fails
 * here too: n_ready stops before it); a block another request is copying
 * into its own device slot is copied again, from the host, into a slot of
 * this request's own (that slot is not shared: if the other copy failed,
 * both requests would compute into it), freed at kvt_release. Both return 1
 * at once (unless the device has no room for the private copy: that is a
 * wait for room, for the other load among others, after which the call
 * shares its slots).
 * With a remote tier, the keys of the restore range after the local chain
 * are asked of the remote first (one round trip, bounded by
 * remote_timeout_ms, none for a key found absent lately); the remote hits
 * are fetched like disk blocks (through host slots, in the background) and
 * verified: a block that fails (gone, corrupt, foreign, timed out, the
 * server down) becomes a miss, and the request computes from there
 * (kvt_request_block_states: FAILED). Fetched blocks are written to disk
 * on the way up when there is a disk tier.
 * Returns 0 (nothing to load), 1 (loads in flight: kvt_request_wait), or
 * KVT_ENOSPACE when the device tier cannot free enough unpinned slots now;
 * KVT_EAGAIN with KVT_ACQUIRE_NOWAIT where it would wait for evictions (or
 * for a free job while every job is busy); -E2BIG when
 * n_blocks + extra_slots exceeds the device slots or max_job_blocks (it can
 * never fit: split the request); -EINVAL for bad arguments or unknown flags. */
KVT_API int kvt_acquire(kvt_cache *c, const kvt_key *keys, const uint32_t *tokens, size_t n_blocks,
                        size_t restore, size_t extra_slots, uint32_t flags, kvt_req *req,
                        uint32_t *slots, kvt_acquire_info *info);

/* kvt_acquire for keys that continue a chain: keys[0]'s parent is *parent
 * (the key of the block before it, e.g. from an earlier request), not the
 * namespace. kvt_acquire, kvt_lookup and kvt_plan_request take keys that
 * start the sequence: a tail passed to them is looked up and cached as if
 * its first block had no predecessor, so it neither finds nor leaves
 * entries the full chain can use. parent NULL is kvt_acquire. */
KVT_API int kvt_acquire_after(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, const uint32_t *tokens,
                              size_t n_blocks, size_t restore, size_t extra_slots, uint32_t flags, kvt_req *req,
                              uint32_t *slots, kvt_acquire_info *info);

/* Load progress of a request. *n_ready (may be NULL) receives the number of
 * leading blocks whose KV is valid on the device: when the call returns 0
 * it is final, and blocks [n_ready, n_blocks) must be computed into the
 * slots they were given. Every one of those slots is the request's own:
 * a device hit (a slot shared with other requests) is only ever restored
 * in the leading run before the first block that is copied, so a failed
 * copy never leaves a shared slot after n_ready. */
KVT_API int kvt_request_poll(kvt_cache *c, kvt_req req, uint32_t *n_ready);

/* Per-block outcome of a request's restore (kvt_request_block_states). */
enum {
  KVT_BLOCK_READY = 0,   /* holds valid KV (restored or a device hit): do not write it */
  KVT_BLOCK_FAILED = 1,  /* its copy failed (I/O error, checksum, mismatch): compute it */
  KVT_BLOCK_COMPUTE = 2  /* not restored (a miss, past the plan, or cancelled after a failure): compute it */
};
/* states[0..n) (n <= the request's keyed blocks) receive KVT_BLOCK_* per
 * block once the loads are over: [0, n_ready) READY, the rest FAILED or
 * COMPUTE, all in slots of the request's own. Returns 0, 1 while loads are
 * in flight (nothing written), KVT_ENOJOB, -EINVAL. Never blocks. */
KVT_API int kvt_request_block_states(kvt_cache *c, kvt_req req, uint8_t *states, size_t n);
/* As poll, but waits: timeout_ns < 0 forever, 0 not at all (exactly
 * kvt_request_poll: 1 while loading), else up to timeout_ns, then
 * KVT_ETIMEDOUT. KVT_ENOJOB if another thread releases the request
 * meanwhile. May block. */
KVT_API int kvt_request_wait(kvt_cache *c, kvt_req req, int64_t timeout_ns, uint32_t *n_ready);
/* 0 when layer `layer` of every loading block has landed, 1 if not yet.
 * The backend is queried outside the metadata lock. Never blocks. */
KVT_API int kvt_request_layer_ready(kvt_cache *c, kvt_req req, uint32_t layer);
/* Orders the engine's work after layer `layer` has landed: with CUDA,
 * `stream` (a cudaStream_t) waits on the layer's event and the CPU does not
 * block; with the host backend the CPU waits (may block). Layer readiness is
 * provisional until kvt_request_wait/poll confirms the final n_ready. */
KVT_API int kvt_request_wait_layer(kvt_cache *c, kvt_req req, uint32_t layer, void *stream);

/* Decode filled the request's first n extra slots with full blocks: they
 * become keyed blocks n_blocks .. n_blocks+n-1 with keys[0..n) (continuing
 * the request's chain, e.g. from kvt_hash_tokens with the last key as
 * parent) and tokens (n * block_tokens ids, may be NULL), so kvt_commit can
 * cache them. Slots do not move: extra slot j is block n_blocks + j.
 * -EINVAL when n exceeds the extra slots left. */
KVT_API int kvt_request_extend(kvt_cache *c, kvt_req req, const kvt_key *keys, const uint32_t *tokens, size_t n);

/* The engine has written valid KV for keyed blocks [0, n_valid) of the
 * request (restored plus computed); blocks it computed become cached on the
 * device. `stream` (CUDA: the compute stream that wrote them, else NULL)
 * orders later copies of these blocks after that work; NULL means "nothing
 * to wait for", so an engine computing on the legacy default stream passes
 * cudaStreamLegacy ((void *)1), not NULL. With write-through
 * a store to host starts at once. */
KVT_API int kvt_commit(kvt_cache *c, kvt_req req, size_t n_valid, void *stream);

/* Ends a request: unpins its blocks (they stay cached on the device, on the
 * LRU) and frees its uncommitted slots. Waits for loads still in flight
 * (may block). A second release returns KVT_ENOJOB. With CUDA, freed slots
 * may be reloaded at once on kvtier's load stream, which is not ordered
 * after the engine's kernels: release only once the kernels that read the
 * request's slots have completed (e.g. after the step's synchronisation). */
KVT_API int kvt_release(kvt_cache *c, kvt_req req);

/* ------------------------------------------------------------------ */
/* Write path and jobs                                                 */
/* ------------------------------------------------------------------ */

typedef uint64_t kvt_job;

#define KVT_STORE_EVICT 0x1u /* free the device slots once copied (offload) */

/* Copies device-resident blocks among keys[0..n) down to the host tier (and
 * on to disk with write-through); blocks already on host are skipped. Use it
 * when a conversation goes idle. One call copies at most what the host tier
 * can take at once (its capacity, max_job_blocks); call again for the rest,
 * e.g. tail-first halves. Returns 0 (nothing to copy) or 1 with *job;
 * KVT_ENOSPACE when every host slot is pinned, KVT_EAGAIN when every job
 * slot is busy or every handle is held (finished jobs not yet released with
 * kvt_job_release: release them), KVT_EUNSUPPORTED without a host tier.
 * May block while host slots are freed (spills). Blocks pinned by a request
 * are copied but not evicted. */
KVT_API int kvt_store(kvt_cache *c, const kvt_key *keys, size_t n, uint32_t flags, kvt_job *job);

/* Promotes the disk-resident blocks of keys' cached prefix to the host tier
 * ahead of the request's turn (the scheduler's hint); with a remote tier,
 * also the blocks after the local chain that the remote holds (asked in
 * one round trip: the only wait). Never waits for reads: when the
 * host must first spill to make room, the spills are started and
 * KVT_EAGAIN is returned (ask again); KVT_EAGAIN too when every job slot is
 * busy (nothing is dropped then). 0 nothing to do, 1 with *job. */
KVT_API int kvt_prefetch(kvt_cache *c, const kvt_key *keys, size_t n, kvt_job *job);

/* 0 done ok, 1 in progress, or the job's error. */
KVT_API int kvt_job_poll(kvt_cache *c, kvt_job job);
/* Waits (timeout_ns < 0: forever). May block. */
KVT_API int kvt_job_wait(kvt_cache *c, kvt_job job, int64_t timeout_ns);
/* Cancels a job of kvt_store or kvt_prefetch. Copies already under way
 * finish, but what they did is discarded: the blocks stay where they were
 * (a cancelled store leaves no host copy and keeps the device copy, a
 * cancelled prefetch leaves the block on disk, except a block another
 * request's restore is following: that fetch lands in the host for it)
 * and the job reports KVT_ECANCELED; release it as usual. A finished job
 * is not undone. Returns 0 or KVT_ENOJOB. */
KVT_API int kvt_job_cancel(kvt_cache *c, kvt_job job);
/* Every job handle must be released once. Releasing an unfinished job
 * detaches it: it completes on its own and frees itself. */
KVT_API int kvt_job_release(kvt_cache *c, kvt_job job);

/* Waits until no transfer is in flight (evictions, spills and storage
 * jobs included). May block. */
KVT_API int kvt_drain(kvt_cache *c);

/* ------------------------------------------------------------------ */
/* Cost model and calibration                                          */
/* ------------------------------------------------------------------ */

/* Sets the model and hardware the planner uses (copied). With real bytes
 * registered, the model's KV per block (block_tokens x KV bytes per token /
 * tp_size) must equal the layout's block bytes, else KVT_ELAYOUT. */
KVT_API int kvt_set_cost_model(kvt_cache *c, const kvt_model_desc *model, const kvt_hw_desc *hw);
/* Reports a measured prefill: tokens [from_token, to_token) took `seconds`.
 * Later plans follow such reports (EWMA). Transfers the library runs are
 * measured and fed back the same way. */
KVT_API int kvt_report_prefill(kvt_cache *c, uint64_t from_token, uint64_t to_token, double seconds);
/* The hardware description as calibrated so far: a whole kvt_hw_desc of
 * this library's version (its size field set); the caller's size is not
 * read. KVT_ESTATE before kvt_set_cost_model. */
KVT_API int kvt_get_calibrated_hw(kvt_cache *c, kvt_hw_desc *hw);

/* ------------------------------------------------------------------ */
/* Stats                                                               */
/* ------------------------------------------------------------------ */

typedef struct kvt_stats {
  uint32_t size; /* sizeof(kvt_stats); the caller sets it */
  uint32_t host_pool_pinned; /* 1 pinned by the device backend, 0 pageable (warning) */
  uint64_t lookups, lookup_blocks;  /* kvt_lookup and kvt_plan_request calls, keys asked */
  /* kvt_acquire: blocks restored by the tier they came from, and blocks not
   * restored (absent, past the plan's k, refused by verification, or whose
   * load failed: a failed load moves its block from hits to misses). */
  uint64_t acquires, hits_device, hits_host, hits_disk, misses;
  uint64_t blocks_committed;        /* computed blocks that became cached */
  uint64_t blocks_d2h, blocks_h2d, blocks_h2disk, blocks_disk2h; /* copies that landed */
  uint64_t bytes_d2h, bytes_h2d, bytes_h2disk, bytes_disk2h;
  uint64_t evictions_device, evictions_host, evictions_disk; /* blocks that left each tier */
  uint64_t verify_mismatches;       /* token/parent checks that refused a restore */
  uint64_t checksum_failures;       /* disk records that failed their checksum (then dropped) */
  uint64_t io_errors, copy_errors;  /* failed disk I/Os, failed device copies (per block) */
  uint64_t jobs_started, jobs_failed; /* failed: finished with an error (cancelled ones apart) */
  uint64_t resident_device, resident_host, resident_disk; /* slots in use per tier */
  uint64_t disk_recovered, disk_discarded; /* at kvt_register_layout */
  uint64_t metadata_bytes; /* tier map, jobs, request table and request refs, object headers remembered */
  uint64_t jobs_cancelled;
  /* At kvt_register_layout: the disk tier started empty because its
   * superblock was damaged (or a block device held another namespace). */
  uint64_t disk_fresh_starts;
  /* At kvt_register_layout after disk_blocks changed: records moved below
   * the new end, and records that did not fit (dropped). */
  uint64_t disk_resize_moved, disk_resize_dropped;
  uint64_t disk_recover_bytes; /* bytes read from the disk tier to recover it */
  /* Remote tier (all 0 without one). Blocks restored from it for
   * kvt_acquire (a failed fetch moves its block to misses, as for disk). */
  uint64_t hits_remote;
  uint64_t blocks_remote2h, bytes_remote2h; /* fetches that landed on the host, verified */
  uint64_t blocks_h2remote, bytes_h2remote; /* puts the server acknowledged */
  uint64_t remote_probes, remote_probe_blocks; /* existence round trips, keys asked */
  uint64_t remote_negative_hits; /* probes skipped: the key was found absent lately */
  uint64_t remote_misses;   /* fetches of a key the server no longer holds (evicted) */
  uint64_t remote_corrupt;  /* values that failed their checks: garbage, truncated, another namespace's */
  uint64_t remote_errors;   /* fetches and puts that failed: node down, reset, degraded
                               (ops failed at once while a node is degraded count here) */
  uint64_t remote_timeouts; /* fetches and puts past remote_timeout_ms (not also in
                               remote_errors: the two never count the same op) */
  uint64_t remote_put_refused; /* puts the server refused for memory (maxmemory) */
  /* The tier came back after being unreachable: at kvt_register_layout's
   * server, or a node that failed mid-run answering again. */
  uint64_t remote_reconnects;
  /* Blocks that left the host without a put: puts are best effort; while
   * a quarter of max_jobs are putting (a slow server) the next puts gather
   * in one job of up to max_job_blocks, and past that are skipped. */
  uint64_t remote_puts_skipped;
  uint32_t remote_nodes;    /* server nodes known (1 for one server) */
  uint32_t remote_nodes_degraded; /* of which failing now (ops for them fail at once until backoff ends) */
  uint32_t remote_degraded; /* 1: unreachable or some node degraded: its blocks are misses for now */
  uint32_t remote_cluster;  /* 1: a Redis Cluster, 0: one server */
  /* Storage mode: blocks that landed between the engine's memory and the
   * disk tier (kvt_put_from to disk, kvt_get_into from disk), straight (one
   * vectored I/O, no staging copy) and through a worker's staging record. */
  uint64_t storage_blocks_straight, storage_blocks_staged;
  /* Appended: of storage_blocks_straight, the blocks whose I/O went as
   * io_uring fixed-buffer ops (every piece in a registered region that
   * kvtier handed to io_uring: see kvt_register_memory). */
  uint64_t storage_blocks_fixed;
} kvt_stats;
#define KVT_STATS_SIZE_V1 offsetof(kvt_stats, jobs_cancelled)

KVT_API int kvt_get_stats(kvt_cache *c, kvt_stats *st);

/* ------------------------------------------------------------------ */
/* Storage mode: kvtier as the tiers under an engine's own memory      */
/* ------------------------------------------------------------------ */

/* An engine that owns its KV pools (vLLM, SGLang, LMCache, a custom loop
 * with its own allocator) registers the layout with KVT_LAYOUT_STORAGE and
 * then moves blocks between its own memory and kvtier's tiers (the host
 * pool, optional: host_blocks = 0 sends blocks straight to disk; the disk)
 * with the batch calls below. Keys, namespace, records, checksums, token
 * verification, LRU cascade (host victims spill to disk, disk victims are
 * dropped) and restart recovery are those of owner mode. There are no device
 * slots: kvt_acquire has none to give (-E2BIG) and kvt_store nothing
 * to copy; kvt_lookup, kvt_plan_request, kvt_prefetch (disk to kvtier's
 * host pool) and kvt_drain work as in owner mode.
 *
 * Copies run on kvtier's storage workers (copy_threads of them, at most 4;
 * 0: 2), never on the caller: each batch call returns at once with a job,
 * whose per-block results are polled or collected in batches. Engine memory named
 * by a job must stay valid, and (for puts) unchanged, until the job is over.
 * Memory regions are only needed for device memory. Registering host memory
 * is optional; it lets pieces name region + offset, as an allocator's page
 * indices do, and it opens the straight path: a block moved to or from the
 * disk tier whose pieces all lie in registered host regions, each starting
 * on a 4 KiB boundary and a multiple of 4 KiB long, goes between the
 * engine's memory and the file in one vectored I/O, without kvtier's
 * staging copy (its checksum is computed and verified over the pieces in
 * place, with the same value either way, so records written one way read
 * back the other). Any other block goes through staging.
 * With the io_uring disk backend (Linux 5.19 and later), kvt_register_memory
 * also hands the region's whole 4 KiB pages (from its first 4 KiB boundary
 * to its last) to io_uring as a fixed buffer: the kernel pins them once, at
 * registration, instead of at every I/O, and a straight block of at most 7
 * runs of adjacent pieces then goes as one READ_FIXED / WRITE_FIXED per run
 * plus one for its header page (kvtier's, also fixed), completed together;
 * a block of more runs goes vectored. Where io_uring refuses (the thread
 * pool backend, an older kernel, RLIMIT_MEMLOCK without CAP_IPC_LOCK, a
 * full table), the region works as before, vectored.
 * kvt_stats.storage_blocks_straight / _staged count the blocks that landed
 * each way, storage_blocks_fixed those of the straight ones that went as
 * fixed-buffer I/O. */

typedef uint32_t kvt_region;
#define KVT_REGION_NONE 0u

enum { KVT_MEM_HOST = 0, KVT_MEM_DEVICE = 1, KVT_MEM_HOST_FIXED = 2 };

/* Registers len bytes of the engine's memory at base as a region (*region,
 * never KVT_REGION_NONE). KVT_MEM_HOST: host memory, nothing pinned; with
 * a disk tier, straight blocks go as one vectored I/O each. Does not block.
 * KVT_MEM_HOST_FIXED: host memory whose pages stay put while it is
 * registered; with a disk tier on io_uring its whole pages become an
 * io_uring fixed buffer (above): the kernel pins them (all of it becomes
 * resident) until kvt_unregister_memory or kvt_close. That takes time
 * proportional to len: pages never touched are faulted in first (0.3-2 s
 * per GiB measured here; the cache's I/O goes on meanwhile), then pinned
 * (per GiB: 2 ms in huge pages, 27-42 ms in 4 KiB pages), during which
 * the disk's submissions wait: register pools once, up front. The engine must not
 * unmap, remap (mremap, MAP_FIXED) or discard (MADV_DONTNEED, MADV_FREE)
 * those pages while registered: io_uring keeps the pages it pinned, so a
 * put would write their old bytes under a checksum of the new ones (the
 * block then fails its checksum when read: lost, never wrong). When
 * io_uring refuses (the thread pool, RLIMIT_MEMLOCK, memory it cannot pin,
 * the table full), the region is registered all the same as KVT_MEM_HOST
 * (logged at KVT_LOG_INFO). It pays where the engine's memory is in 4 KiB
 * pages (measured here: put-from 2.59 against 1.97 GB/s, get-into 1.35
 * against 1.11); in huge pages it saves little (under 3% of the CPU).
 * May block (the pinning). KVT_MEM_DEVICE: CUDA device
 * memory, copied by the CUDA runtime to and from kvtier's record images
 * (the host pool, or a worker's staging records), never given to io_uring;
 * KVT_EUNSUPPORTED in a build without CUDA, KVT_ENODEV when no GPU is
 * usable or base is not device memory. At most 64 regions; -ENOSPC past
 * that, -EINVAL for NULL base, len 0 or a range that overlaps a registered
 * region. Does not wait for I/O. */
KVT_API int kvt_register_memory(kvt_cache *c, void *base, size_t len, int kind, kvt_region *region);
/* Forgets a region. KVT_EBUSY while a job in flight uses it, or while
 * kvt_register_memory of it has not returned; KVT_ENOJOB for an unknown
 * region. A host region given to io_uring is taken out of its table and
 * unpinned, after the disk I/Os still using its pages (none once its jobs
 * are over) have completed: may block that long. */
KVT_API int kvt_unregister_memory(kvt_cache *c, kvt_region region);

/* One contiguous piece of a block in the engine's memory: `ptr` (host
 * memory, region KVT_REGION_NONE), or `offset` into a registered region.
 * A block's pieces, in order, are its bytes (kvt_block_bytes in all): K and
 * V per layer, one MLA page, one vLLM chunk... Fixed ABI (like iovec). */
typedef struct kvt_piece {
  void *ptr;
  kvt_region region;
  uint32_t reserved; /* 0 */
  uint64_t offset;
  uint64_t len;
} kvt_piece;

/* A batch of blocks for kvt_put_from / kvt_get_into. The keys are a prefix
 * chain that continues after *parent (NULL: the sequence starts, the parent
 * is the namespace). Every array is read during the call only (it is copied). */
typedef struct kvt_batch {
  uint32_t size;             /* sizeof(kvt_batch); set by kvt_batch_init */
  uint32_t n_blocks;         /* 1..max_job_blocks */
  const kvt_key *keys;       /* n_blocks keys */
  const kvt_key *parent;     /* key before keys[0], or NULL */
  /* n_blocks * block_tokens ids, or NULL. Puts store them with each block;
   * gets verify them (a block stored with other tokens fails KVT_EMISMATCH). */
  const uint32_t *tokens;
  const kvt_piece *pieces;   /* every block's pieces, block after block */
  uint32_t pieces_per_block; /* >= 1, the same for every block */
  /* kvt_get_into: load at most this many leading blocks (the planner's k;
   * 0: the whole cached prefix). Ignored by kvt_put_from. */
  uint32_t max_blocks;
  uint32_t flags;            /* KVT_KEYS_OPAQUE, KVT_GET_PROMOTE, or 0 */
} kvt_batch;
#define KVT_BATCH_SIZE_V1 (offsetof(kvt_batch, flags) + sizeof(uint32_t))

/* The keys are an engine's own prefix-chained hashes (kvt_keys_from_opaque):
 * each key stands for its whole prefix on its own, so no parent is recorded
 * or checked (parent is ignored) and a block may be asked about alone, as
 * vLLM's per-key lookup does. Without it, keys[i]'s parent must be keys[i-1]
 * as for kvt_hash_tokens chains. Puts and lookups of one key must agree. */
#define KVT_KEYS_OPAQUE 0x1u
/* kvt_get_into: the blocks it loads from disk also land in kvtier's host
 * tier, as the most recent there, as owner mode's restores do (a disk hit
 * goes through a host slot), so a conversation that returns again soon is
 * served from RAM. For an engine whose own memory is the only tier above
 * kvtier; an engine with its own host tier above kvtier (vLLM's CPU tier)
 * leaves it off, or each block would be held twice. It costs one copy of
 * each such block in memory and, when the host tier is full, its least
 * recent blocks (spilled first where the disk has no copy, which the job
 * waits for; one that cannot spill, the disk's slots all pinned, is never
 * dropped for it). Best effort: a block is loaded all the same, unpromoted,
 * when no host slot can be had (host blocks all in use, no host tier);
 * blocks from the remote tier are not promoted. -EINVAL on kvt_put_from. */
#define KVT_GET_PROMOTE 0x2u

KVT_API void kvt_batch_init(kvt_batch *b);

/* Batch exists: the longest prefix of keys[0..n) (chained after *parent,
 * NULL: the namespace; flags KVT_KEYS_OPAQUE: each key alone) that a tier holds, split by the fastest tier holding
 * each block; tier_of_block[n] (may be NULL) receives KVT_TIER_* per block,
 * KVT_TIER_NONE after the prefix. Blocks still being stored do not count.
 * No side effects (no pin, no LRU touch): ask again as often as you like.
 * Returns 0, -EINVAL, KVT_EVERSION (res->size), KVT_ELAYOUT. Does not block
 * on I/O (takes the metadata lock), except that with a remote tier the keys
 * after the local prefix are asked of the remote (as kvt_lookup: one round
 * trip; they count as KVT_TIER_REMOTE, n_remote). */
KVT_API int kvt_exists(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
                       kvt_lookup_result *res, uint8_t *tier_of_block);

/* Marks the blocks of keys[0..n) that kvtier holds as the most recent in
 * every tier holding them, last key first (ancestors end more recent than
 * their tails), as owner mode's kvt_release does for a request's blocks.
 * For an engine whose own memory served a request's blocks (a hit on its
 * pages): without it, kvtier's copies of a conversation in use age as if
 * idle and are the next victims (vLLM's OffloadingManager.touch). Chained
 * keys (after *parent, NULL: the namespace): the cached prefix, as
 * kvt_exists finds it; KVT_KEYS_OPAQUE: every key held. Blocks still being
 * stored are not touched. *n_touched (may be NULL) receives how many were.
 * Returns 0, -EINVAL, KVT_ELAYOUT, KVT_EFORKED. Does not block on I/O
 * (takes the metadata lock); no remote round trip. */
KVT_API int kvt_touch(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
                      size_t *n_touched);

/* Put-from: copies the batch's blocks from the engine's memory into the host
 * tier (or, with no host tier, to disk). A key already stored, or being
 * stored by an earlier job, is not written twice: its result is 1 (skipped).
 * Under KVT_WRITE_THROUGH the blocks that landed in the host tier are also
 * written to disk at once, by a spill that starts as the job finishes (the
 * job does not wait for it; kvt_drain and kvt_close do); under
 * KVT_WRITE_BACK they reach the disk only when evicted from the host.
 * Returns 1 with *job (always a job, even when every block is skipped), or
 * -EINVAL (arguments; pieces that do not add up to kvt_block_bytes),
 * KVT_ESTATE (not a storage-mode cache), KVT_EUNSUPPORTED (no host and no
 * disk tier), -E2BIG (n_blocks > max_job_blocks), KVT_EAGAIN (every job slot
 * busy: collect and release some). Does not block (may allocate to grow the
 * job's piece table to the largest batch seen). */
KVT_API int kvt_put_from(kvt_cache *c, const kvt_batch *b, kvt_job *job);

/* Get-into: loads the longest cached prefix of the batch's keys (at most
 * max_blocks) into the engine's memory. The blocks are pinned in their tier
 * by this call, so the job loads exactly the prefix kvt_exists would have
 * reported now (less max_blocks). Per-block results: 0 landed, 1 not loaded
 * (past the prefix or max_blocks: compute it), or the block's error
 * (KVT_ECORRUPT checksum, KVT_EMISMATCH tokens, -EIO...: compute it; a disk
 * record that failed is dropped). A block whose result is not 0 may have
 * had any bytes written into its pieces (the straight path reads the file
 * into them before the checksum can be verified): treat its memory as
 * garbage. With a remote tier the blocks after the
 * local chain that the remote holds (asked in one round trip, the call's
 * only wait) are fetched by the workers into their staging records and
 * verified (namespace, key, parent, tokens, checksums) before they reach
 * the engine's memory; a remote block that fails is that block's error
 * (KVT_EMISS gone, KVT_ECORRUPT / KVT_EMISMATCH bad or foreign value,
 * KVT_EREMOTE / KVT_ETIMEDOUT server down or slow). Puts feed the remote as
 * owner mode's blocks do: when they leave the host tier. Returns 1 with
 * *job, or the errors of kvt_put_from. */
KVT_API int kvt_get_into(kvt_cache *c, const kvt_batch *b, kvt_job *job);

/* Removes keys[0..n) from every tier (a disk record is tombstoned so a
 * restart does not bring it back; a remote tier is asked to delete them,
 * best effort and in the background: a node that is down keeps its copy,
 * which the store's own eviction takes in time). Blocks in use by a job in
 * flight are kept. *n_removed (may be NULL) receives how many were removed
 * locally. May block (the tombstone writes). */
KVT_API int kvt_remove(kvt_cache *c, const kvt_key *keys, size_t n, size_t *n_removed);

/* A storage job: 1 while in flight, else 0 (every block landed or was
 * skipped) or the first block error. Never blocks. */
KVT_API int kvt_storage_poll(kvt_cache *c, kvt_job job);
/* As poll, waiting up to timeout_ns (< 0: forever; else KVT_ETIMEDOUT).
 * May block. */
KVT_API int kvt_storage_wait(kvt_cache *c, kvt_job job, int64_t timeout_ns);
/* Per-block results of a finished job: results[0..n) (n <= the job's
 * blocks) as described at kvt_put_from / kvt_get_into; *n_ok (may be NULL)
 * receives the length of the leading run of blocks with result 0 (for a get:
 * the prefix now valid in the engine's memory). Returns 0, 1 while in flight
 * (nothing written), KVT_ENOJOB, -EINVAL. Never blocks. */
KVT_API int kvt_storage_results(kvt_cache *c, kvt_job job, int32_t *results, size_t n, uint32_t *n_ok);
/* Finished jobs, each reported once, oldest first: up to max handles in
 * jobs[] and their status (as poll) in status[] (may be NULL); *n receives
 * the count. The handles stay valid for kvt_storage_results until released.
 * Returns 0. Never blocks (the shape of vLLM's get_finished_jobs). */
KVT_API int kvt_storage_collect(kvt_cache *c, kvt_job *jobs, int *status, size_t max, size_t *n);
/* Every storage job is released once; releasing one in flight detaches it
 * (it completes on its own and is then freed, never collected). */
KVT_API int kvt_storage_release(kvt_cache *c, kvt_job job);

/* ------------------------------------------------------------------ */
/* Metrics for an operator                                             */
/* ------------------------------------------------------------------ */

enum { KVT_METRICS_PROMETHEUS = 0, KVT_METRICS_JSON = 1 };

/* Writes the cache's metrics as text into buf: KVT_METRICS_PROMETHEUS is
 * the Prometheus text exposition format (version 0.0.4: # HELP and # TYPE
 * lines, then samples), KVT_METRICS_JSON one JSON object with the same
 * figures (docs/metrics.md lists every name). Names start with "kvtier_";
 * per-tier figures carry a tier label (device, host, disk), transfers src
 * and dst labels. There is no server in the library: serve the text from
 * the engine's own /metrics endpoint.
 * On entry *len is buf's size in bytes; on return it is the text's length
 * without its terminating NUL, whether or not it fit. Returns 0 when the
 * text and its NUL fit, -ENOBUFS when they did not (buf then holds a
 * truncated, NUL-terminated prefix when *len was at least 1; call again
 * with a buffer of at least the returned *len + 1 bytes, plus headroom:
 * counters grow between calls). buf may be NULL when *len is 0 (a size
 * query). Takes the metadata lock briefly; does not allocate; valid
 * before kvt_register_layout (capacities 0). Returns -EINVAL for a NULL
 * cache or len, an unknown format, or buf NULL with *len > 0. Counters are
 * monotonic for the cache's lifetime; figures exact once transfers are
 * drained (a restore counts as a hit when it landed). */
KVT_API int kvt_metrics_write(kvt_cache *c, int format, char *buf, size_t *len);

/* Tier-map memory per block of capacity (device + host + disk slots),
 * allocated at registration: an 80-byte entry, 16 bytes of index (load
 * factor 1/2) and 4 bytes of free-slot stack; kvtier-bench micro measures
 * it. Besides, per cache: a real (not metadata-only) layout keeps the token
 * ids of each device slot (block_tokens x 4 + 1 bytes per device slot);
 * each host slot has 8 bytes for the restores that follow a fetch into it;
 * jobs take max_job_blocks x 68 bytes each, allocated when a job slot is
 * first used (as many as were ever in use at once, at most max_jobs + 2);
 * requests and their block references (32 bytes each, allocated when live
 * references pass their previous peak) take the rest; in storage mode, its
 * job slots, its workers' tables (256 KiB each with a disk tier) and each
 * job slot's tables, grown to the largest batch it has carried (28 bytes
 * per block, 24 per piece, 4 per token given); with objects, the headers
 * of objects remembered (88 bytes a place, four places per host and disk
 * slot, 256 to 65,536 places: at most 5.5 MiB), allocated at the first
 * object call. kvt_stats's metadata_bytes counts all of it. */
#define KVT_MAP_BYTES_PER_BLOCK 100

/* ------------------------------------------------------------------ */
/* Objects: an engine's opaque state, of any size, keyed by prefix     */
/* ------------------------------------------------------------------ */

/* An engine that cannot hand over its KV cache block by block (llama.cpp's
 * state API, recurrent or sliding-window state) stores one opaque object per
 * prefix instead, in a storage-mode cache (KVT_LAYOUT_STORAGE). The object
 * is filed under the chain key of the last full block of the tokens it
 * covers (kvt_hash_tokens from the namespace) and split into parts of
 * kvt_block_bytes each, stored as storage-mode blocks under keys derived
 * from that key: the same tiers, records, checksums, namespace, LRU and
 * restart recovery as blocks. Every part starts with a meta area: the
 * first part's holds a 64-byte header (the object's length, the tokens it
 * covers, a hash of its tokens, a value unique to its put), every part's a
 * 16-byte trailer naming that put and the part's index. A part evicted,
 * failing its record checksum (disk), or of another put (a put racing
 * another under the same key) makes the whole object a miss. The parts
 * lie straight in the caller's buffer (pieces of storage-mode blocks): a
 * put or a get copies the bytes once, split between the storage workers.
 * When the block size is a multiple of 4 KiB and at least 32 KiB, the meta
 * area is a 4 KiB page, so that with a page-aligned buffer every part's
 * bytes are whole pages: these calls then register the buffer as a region
 * for their duration, with a page-aligned scratch of their own
 * (kvt_register_memory; skipped when it overlaps one of the caller's, or
 * the table is full; meanwhile a region of the caller's over the same
 * memory is refused, and each call in flight holds two of the table's 64
 * entries) and the disk tier moves the parts straight between the file
 * and the buffer, without a staging copy. Each thread keeps that scratch
 * (up to 16 MiB) between calls. Else
 * the meta area is the 80 bytes. Pick the block size near a few hundred
 * KiB for objects of megabytes: parts are whole blocks. An object needs at
 * most max_job_blocks parts (-E2BIG past that). These calls wait for
 * their copies (may block); like every call they may run from several
 * threads at once. */

typedef struct kvt_object_info {
  uint32_t size;          /* sizeof(kvt_object_info); the caller sets it */
  uint32_t parts;         /* storage blocks holding the object */
  uint64_t bytes;         /* the object's length */
  uint64_t n_tokens;      /* tokens the object's state covers */
  /* Leading tokens of the caller's that the object is valid for: n_tokens
   * when all of them match the caller's, else the full blocks of the key
   * (the engine truncates its state to this many and computes the rest). */
  uint64_t match_tokens;
  kvt_key key;            /* the prefix key it is filed under */
  uint32_t tier;          /* KVT_TIER_* of the slowest part */
} kvt_object_info;
#define KVT_OBJECT_INFO_SIZE_V1 (offsetof(kvt_object_info, tier) + sizeof(uint32_t))

/* Stores len bytes of data (1..2^40) as the object of tokens[0..n_tokens)
 * (n_tokens >= block_tokens; the key is that of the last full block).
 * Returns 0 stored; 1 when an object is already stored under that key, of
 * any length (kept as it is, as find sees it: one damaged on disk is
 * dropped by the get that reads it; kvt_object_remove first to replace
 * it; also while gets of the key are in progress); KVT_EAGAIN (another
 * kvt_object_put or a kvt_object_remove of that key is in progress or
 * waiting in this cache, a get of it is in progress and no object is
 * stored whole, or another call holds parts of that key; nothing of this
 * put is kept, put again later: of puts of one key racing, one stores its
 * object whole); or -EINVAL,
 * KVT_ELAYOUT, KVT_ESTATE (not a storage-mode cache), -E2BIG, -ENOMEM,
 * KVT_ENOSPACE (the tiers cannot hold every part at once; nothing is
 * kept), or a part's error (also one
 * reading the stored object's first part). data is read during the call
 * only. Its parts follow the write policy as kvt_put_from's blocks do
 * (KVT_WRITE_THROUGH: on disk too, once the spill it starts is over).
 * May block. */
KVT_API int kvt_object_put(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, const void *data,
                           size_t len);

/* Finds the object of the longest prefix of tokens[0..n_tokens) stored
 * whole (every part in a tier, the header readable and its tokens equal to
 * the caller's) and describes it in *info. Returns 0 found, KVT_EMISS when
 * no prefix has one, or the errors of kvt_object_put. Reads the first part
 * of each candidate, unless this cache put that object, read its header
 * before, or found it in the disk tier's records when it opened (part 0's
 * record carries the header as its token ids: a find after a restart reads
 * nothing from disk). It remembers the headers of recent objects, checked
 * against the tiers at every find; get checks them again. The part 0 it last read
 * from disk (its record's checksum passed) is kept for the get that
 * follows, which takes it instead of reading it again when it names the
 * same object (key and put) and that part is still in a tier; a put or a
 * remove under the key drops it. May block. */
KVT_API int kvt_object_find(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, kvt_object_info *info);

/* Reads the object that kvt_object_find described into buf (cap >=
 * info->bytes). tokens are the caller's, at least info->match_tokens long,
 * checked again against the header. Returns 0 (buf holds exactly the bytes
 * put), KVT_EMISS (evicted since, or another object put under its key
 * since: find again), KVT_ECORRUPT (a part failed its checksum, or the
 * parts are not all of one put: the object is damaged and removed),
 * KVT_EMISMATCH (other tokens), -ENOBUFS (cap too small), -EINVAL. A
 * kvt_object_put or kvt_object_remove of the key in progress (or a remove
 * waiting for it) finishes first; gets of one key run together. May
 * block. A buffer in transparent huge pages (MADV_HUGEPAGE) reads fastest
 * from the disk tier: an O_DIRECT read pays per segment of
 * the memory it lands in, one per 4 KiB page otherwise (up to 2x the time
 * on a virtual disk, examples/llama_cpp/llama_bench.c). */
KVT_API int kvt_object_get(kvt_cache *c, const kvt_object_info *info, const uint32_t *tokens, void *buf,
                           size_t cap);

/* Removes the object filed under the last full block of tokens[0..n_tokens)
 * from every tier; a kvt_object_put of that key in progress finishes first
 * (its object is then removed), and so do gets of it in progress; gets
 * that come while it waits wait for it. Returns 0 (removed), KVT_EMISS
 * (none), -EINVAL. May block. */
KVT_API int kvt_object_remove(kvt_cache *c, const uint32_t *tokens, size_t n_tokens);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_KVTIER_H */
