/* Trace replay through the real engine (kvtier-bench replay and sweep, and
 * tests/test_replay_lru.c).
 *
 * Per request, in arrival order and one at a time: keys = kvt_keys_from_opaque
 * over its block ids (8 bytes each); kvt_plan_request (its lookup is what
 * counts as the hit: the longest prefix cached in any tier before the request
 * runs, split by tier); kvt_acquire restoring the planner's k blocks (or all
 * of the cached prefix, or none, by option); kvt_request_wait; the engine
 * "computes" the rest (with real payload: stamps each computed segment so
 * restores can be verified); kvt_commit of every keyed block; kvt_release,
 * which touches the request's blocks last to first. So after a request all
 * its keyed blocks are resident on the device.
 *
 * Rules, stated once:
 *  - Partial last block: kvtier caches full blocks only, so by default a
 *    request keys input_tokens / block_tokens blocks and its trailing
 *    partial block is recomputed, neither keyed nor counted in blocks_total.
 *    With whole_ids every id is keyed and counted as a block (the request is
 *    taken as rounded up to whole blocks), which is how the trace's own
 *    published LRU figures count.
 *  - Device capacity 0 means the device holds only the running request:
 *    the device tier gets as many slots as the longest request, and after
 *    each request its blocks are offloaded with kvt_store(KVT_STORE_EVICT)
 *    (so every later hit is on host or disk). It needs a host tier.
 *  - A request longer than the device tier keys only its first
 *    device_blocks blocks (the engine cannot hold more); the rest are
 *    counted as missed blocks and recomputed, never cached.
 *  - Disk hits are staged through host slots: a request whose restore
 *    would stage more disk blocks than the host tier has restores the
 *    longest prefix that fits (counted as restores_clipped).
 *  - The partial block and decode tokens get no device slots (extra_slots
 *    0): only keyed blocks compete for the device tier.
 *  - Real payload at the model's block size: the engine's planner also
 *    calibrates itself from the copies it times (this machine's memcpy and
 *    disk speeds). Scaled down (payload_scale > 1), the engine's blocks are
 *    not the model's, so plans come from kvt_lookup + kvt_cost_plan with the
 *    full-size model and the given hardware, without calibration.
 *  - TTFT figures are the cost model's estimates (kvt_plan.est_ttft_s), not
 *    measured times. Baselines on the same requests: always recompute (the
 *    planner with nothing cached) and a device-only prefix cache of the same
 *    device capacity (a second, metadata-only engine with no host or disk).
 */
#ifndef KVT_BENCH_REPLAY_CORE_H
#define KVT_BENCH_REPLAY_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/kvtier.h"
#include "trace.h"

typedef enum kvt_bench_restore {
  KVT_BENCH_RESTORE_PLAN = 0, /* the planner's k */
  KVT_BENCH_RESTORE_ALL = 1,  /* the whole cached prefix */
  KVT_BENCH_RESTORE_NONE = 2  /* recompute everything (cached blocks unused) */
} kvt_bench_restore;

/* Parses a --restore value ("plan", "all", and "none" when allow_none) for
 * subcommand cmd; prints the error and returns -1 on a bad value. */
int kvt_bench_restore_option(const char *cmd, const char *v, int allow_none, kvt_bench_restore *out);

typedef struct kvt_bench_replay_opts {
  uint64_t device_blocks, host_blocks, disk_blocks; /* 0 removes a tier (device: see above) */
  const char *model;        /* cost-model preset ("llama3-8b") */
  int payload_real;         /* 0: KVT_LAYOUT_METADATA_ONLY; 1: real bytes */
  uint32_t payload_scale;   /* real payload: divide the model's block bytes by this (0 = auto) */
  uint64_t payload_ram_max; /* auto scale: device + host pools at most this (2 GiB) */
  uint64_t payload_disk_max;/* auto scale: disk file at most this (8 GiB) */
  const char *disk_path;    /* real payload: disk file (overwritten); NULL = temporary dir */
  kvt_bench_restore restore;
  int whole_ids;            /* count the partial last id as a block (see above) */
  int device_only_baseline; /* run the second engine (1) */
  int storage_mode;         /* drive storage mode instead (bench/replay_storage.c): the engine
                               owns its device pool, kvtier is the host and disk tiers; real
                               payload always, no device-only baseline */
  int storage_no_promote;   /* storage mode: plain gets (no KVT_GET_PROMOTE): disk hits are
                               read into the engine's pages only, not also into the host tier */
  kvt_hw_desc hw;           /* the hardware the cost model assumes (kvt_hw_init) */
  const char *metrics_out;  /* at the end, the engine's kvt_metrics_write text here (NULL: none);
                               JSON when the name ends in ".json", else Prometheus text */
  void (*progress)(double fraction); /* may be NULL */
  /* A remote tier (real payload only) shared with whoever points at the
   * same server: its URL, the key prefix that keeps one run's blocks apart
   * from another's, and write-through (every computed block reaches the
   * remote at once, not only when it leaves the host). */
  const char *remote_url, *remote_key_prefix;
  int write_through;
  /* Multi-node replay: this process is node `node` of `nodes` (> 1): it
   * runs requests i with i % nodes == node, in trace order. */
  uint32_t node, nodes;
} kvt_bench_replay_opts;

void kvt_bench_replay_opts_init(kvt_bench_replay_opts *o);

typedef struct kvt_bench_replay_result {
  uint64_t requests, blocks_total, blocks_hit, tokens_total, tokens_hit;
  uint64_t hits_device, hits_host, hits_disk;   /* the hit prefix by fastest tier */
  uint64_t hits_remote;       /* found only on the remote tier */
  uint64_t blocks_from_remote;/* restores fetched from the remote first */
  uint64_t blocks_restored;   /* kept from the cache: reused on device + loaded */
  uint64_t blocks_reused;     /* of which already on the device */
  uint64_t blocks_loaded;     /* of which copied from host or disk */
  uint64_t blocks_from_disk;  /* of which fetched from disk first */
  uint64_t blocks_recomputed; /* keyed blocks computed (misses + planner's choice) */
  uint64_t blocks_load_failed;/* restores that did not land (recomputed) */
  uint64_t truncated_requests;/* longer than the device tier */
  uint64_t restores_clipped;  /* more disk hits than host slots: restored a shorter prefix */
  uint64_t decisions[3];      /* kvt_decision counts */
  uint64_t device_slots;      /* device tier actually configured */
  uint64_t model_block_bytes; /* KV bytes of one block of the model */
  uint64_t payload_block_bytes; /* bytes moved per block (real payload), else 0 */
  uint32_t payload_scale;
  uint64_t payload_verified, payload_corrupt; /* restored blocks checked */
  kvt_stats st;               /* the engine's own counters at the end */
  double ttft_p50_s, ttft_p99_s, ttft_mean_s;
  double ttft_recompute_p50_s, ttft_recompute_p99_s, ttft_recompute_mean_s;
  double ttft_device_only_p50_s, ttft_device_only_p99_s, ttft_device_only_mean_s;
  uint64_t device_only_blocks_hit;
  double wall_s;              /* replay loop, both engines */
  char device_backend[24], disk_backend[24];
} kvt_bench_replay_result;

/* Replays t through a fresh engine configured by o. Returns 0, or a
 * negative code with a message in err (engine errors carry kvt_strerror). */
int kvt_bench_replay_run(const kvt_bench_trace *t, const kvt_bench_replay_opts *o, kvt_bench_replay_result *r,
                         char *err, size_t errlen);

/* Storage mode's replay (bench/replay_storage.c), called by
 * kvt_bench_replay_run with the longest keyed request and the payload scale. */
int kvt_bench_replay_storage(const kvt_bench_trace *t, const kvt_bench_replay_opts *o, const kvt_model_desc *m,
                             uint32_t max_keyed, uint32_t scale, kvt_bench_replay_result *r, char *err, size_t len);

/* The number of blocks request q keys under o's rules (before truncation). */
uint32_t kvt_bench_replay_keyed(const kvt_bench_trace *t, const kvt_bench_req *q, int whole_ids);

#endif
