"""The C declarations of include/kvtier/kvtier.h and cost.h, for cffi's ABI mode.

ABI mode reads no header at run time: these declarations must match the
header's (the tests compare every struct's size with the size the library's
own *_init functions write, and check field values set on the C side).
Structs only grow at the end within a major version, so a newer library
accepts these sizes.
"""

CDEF = r"""
const char *kvt_version(void);
int kvt_version_number(void);
const char *kvt_strerror(int code);

typedef void (*kvt_log_fn)(void *ctx, int level, const char *msg);
void kvt_set_log_handler(kvt_log_fn fn, void *ctx);

typedef struct kvt_key { uint64_t lo; uint64_t hi; } kvt_key;

typedef enum kvt_dtype {
  KVT_DTYPE_F16 = 1, KVT_DTYPE_BF16 = 2, KVT_DTYPE_F32 = 3, KVT_DTYPE_FP8_E4M3 = 4,
  KVT_DTYPE_FP8_E5M2 = 5, KVT_DTYPE_INT8 = 6, KVT_DTYPE_OTHER = 255
} kvt_dtype;
typedef enum kvt_device_kind { KVT_DEVICE_AUTO = 0, KVT_DEVICE_HOST = 1, KVT_DEVICE_CUDA = 2 } kvt_device_kind;
typedef enum kvt_disk_backend { KVT_DISK_AUTO = 0, KVT_DISK_URING = 1, KVT_DISK_THREADS = 2 } kvt_disk_backend;
typedef enum kvt_write_policy { KVT_WRITE_BACK = 0, KVT_WRITE_THROUGH = 1 } kvt_write_policy;

typedef struct kvt_config {
  uint32_t size;
  uint32_t block_tokens;
  const char *model_fingerprint;
  kvt_dtype dtype;
  uint32_t tp_rank, tp_size;
  uint64_t tenant_salt;
  kvt_device_kind device;
  int cuda_device;
  uint32_t copy_threads;
  uint64_t host_blocks;
  int host_mlock;
  const char *disk_path;
  uint64_t disk_blocks;
  uint32_t disk_queue_depth;
  kvt_disk_backend disk_backend;
  int disk_reset;
  kvt_write_policy write_policy;
  uint32_t max_requests;
  uint32_t max_jobs;
  uint32_t max_job_blocks;
  int disk_durable;
  kvt_log_fn log_fn;
  void *log_ctx;
  int log_level;
  const char *remote_url;
  const char *remote_user;
  const char *remote_password;
  const char *remote_key_prefix;
  uint32_t remote_timeout_ms;
  uint32_t remote_conns_per_node;
  uint32_t remote_negative_ms;
} kvt_config;
void kvt_config_init(kvt_config *cfg);

typedef struct kvt_segment { void *base; size_t stride; size_t bytes; } kvt_segment;
typedef struct kvt_layout {
  uint32_t size;
  uint32_t num_layers;
  uint32_t segments_per_layer;
  uint32_t num_slots;
  const kvt_segment *segments;
  uint32_t flags;
} kvt_layout;
void kvt_layout_init(kvt_layout *layout);

typedef struct kvt_cache kvt_cache;
int kvt_open(const kvt_config *cfg, kvt_cache **out);
int kvt_register_layout(kvt_cache *c, const kvt_layout *layout);
void kvt_close(kvt_cache *c);
size_t kvt_block_bytes(const kvt_cache *c);
const char *kvt_error_detail(const kvt_cache *c);
int kvt_namespace(const kvt_cache *c, kvt_key *ns);
const char *kvt_device_backend_name(const kvt_cache *c);
const char *kvt_disk_backend_name(const kvt_cache *c);

int kvt_hash_tokens(const kvt_cache *c, const kvt_key *parent, const uint32_t *tokens,
                    size_t n_tokens, kvt_key *keys, size_t max_keys, size_t *n_keys);
int kvt_keys_from_opaque(const kvt_cache *c, const void *opaque, size_t key_bytes, size_t n,
                         kvt_key *keys);

typedef struct kvt_lookup_result {
  uint32_t size; uint32_t n_blocks; uint32_t n_prefix;
  uint32_t n_device, n_host, n_disk;
  uint32_t n_remote;
} kvt_lookup_result;
int kvt_lookup(kvt_cache *c, const kvt_key *keys, size_t n, kvt_lookup_result *res,
               uint8_t *tier_of_block);

typedef struct kvt_model_desc {
  uint32_t size;
  char name[32];
  uint32_t num_layers;
  uint32_t hidden_size;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t intermediate_size;
  uint32_t vocab_size;
  double params;
  uint32_t kv_dtype_bytes;
  uint32_t mla_latent_dim;
  uint32_t mla_rope_dim;
  uint32_t v_head_dim;
} kvt_model_desc;
void kvt_model_init(kvt_model_desc *m);
int kvt_model_preset(const char *name, kvt_model_desc *m);
const char *kvt_model_preset_name(size_t i);
uint64_t kvt_model_kv_bytes_per_token(const kvt_model_desc *m);
double kvt_model_params(const kvt_model_desc *m);

typedef struct kvt_link { double bytes_per_s; double latency_s; } kvt_link;
typedef struct kvt_hw_desc {
  uint32_t size;
  uint32_t num_gpus;
  double flops_per_gpu;
  double mfu;
  kvt_link device_host;
  kvt_link host_disk;
  int overlap;
  kvt_link host_remote;
} kvt_hw_desc;
void kvt_hw_init(kvt_hw_desc *hw);

typedef enum kvt_decision { KVT_DECIDE_RECOMPUTE = 0, KVT_DECIDE_RESTORE = 1, KVT_DECIDE_SPLIT = 2 } kvt_decision;
typedef struct kvt_plan {
  uint32_t size;
  uint32_t block_tokens;
  uint64_t n_tokens;
  uint32_t n_blocks;
  uint32_t n_prefix, n_device, n_host, n_disk;
  uint32_t restore_blocks;
  kvt_decision decision;
  uint64_t recompute_tokens;
  double est_ttft_s;
  double est_transfer_s;
  double est_compute_s;
  double est_recompute_all_s;
  double est_restore_all_s;
  uint64_t bytes_from_host, bytes_from_disk;
  double in_flops_per_s;
  kvt_link in_device_host, in_host_disk;
  uint64_t in_kv_bytes_per_token;
  int in_overlap;
  uint32_t n_remote;
  uint64_t bytes_from_remote;
  kvt_link in_host_remote;
} kvt_plan;
double kvt_cost_recompute_flops(const kvt_model_desc *m, uint64_t from, uint64_t to, double *linear);
double kvt_cost_compute_s(const kvt_model_desc *m, const kvt_hw_desc *hw, uint64_t from, uint64_t to);
double kvt_cost_transfer_s(const kvt_hw_desc *hw, uint64_t host_bytes, uint64_t disk_bytes);
double kvt_cost_transfer3_s(const kvt_hw_desc *hw, uint64_t host_bytes, uint64_t disk_bytes,
                            uint64_t remote_bytes);
int kvt_cost_plan(const kvt_model_desc *m, const kvt_hw_desc *hw, uint32_t block_tokens,
                  uint64_t n_tokens, uint32_t n_prefix, const uint8_t *tier_of_block, kvt_plan *plan);
int kvt_cost_breakeven(const kvt_model_desc *m, const kvt_hw_desc *hw, uint64_t n_tokens,
                       uint64_t cached_tokens, double *bytes_per_s);

int kvt_plan_request(kvt_cache *c, const kvt_key *keys, size_t n_blocks, size_t n_tokens,
                     kvt_plan *plan);

typedef uint64_t kvt_req;
typedef struct kvt_acquire_info {
  uint32_t size; uint32_t n_restore; uint32_t n_device_hits; uint32_t n_loading; uint32_t n_from_disk;
  uint32_t n_from_remote;
} kvt_acquire_info;
int kvt_acquire(kvt_cache *c, const kvt_key *keys, const uint32_t *tokens, size_t n_blocks,
                size_t restore, size_t extra_slots, uint32_t flags, kvt_req *req,
                uint32_t *slots, kvt_acquire_info *info);
int kvt_acquire_after(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, const uint32_t *tokens,
                      size_t n_blocks, size_t restore, size_t extra_slots, uint32_t flags, kvt_req *req,
                      uint32_t *slots, kvt_acquire_info *info);
int kvt_request_block_states(kvt_cache *c, kvt_req req, uint8_t *states, size_t n);
int kvt_request_poll(kvt_cache *c, kvt_req req, uint32_t *n_ready);
int kvt_request_wait(kvt_cache *c, kvt_req req, int64_t timeout_ns, uint32_t *n_ready);
int kvt_request_layer_ready(kvt_cache *c, kvt_req req, uint32_t layer);
int kvt_request_wait_layer(kvt_cache *c, kvt_req req, uint32_t layer, void *stream);
int kvt_request_extend(kvt_cache *c, kvt_req req, const kvt_key *keys, const uint32_t *tokens, size_t n);
int kvt_commit(kvt_cache *c, kvt_req req, size_t n_valid, void *stream);
int kvt_release(kvt_cache *c, kvt_req req);

typedef uint64_t kvt_job;
int kvt_store(kvt_cache *c, const kvt_key *keys, size_t n, uint32_t flags, kvt_job *job);
int kvt_prefetch(kvt_cache *c, const kvt_key *keys, size_t n, kvt_job *job);
int kvt_job_poll(kvt_cache *c, kvt_job job);
int kvt_job_wait(kvt_cache *c, kvt_job job, int64_t timeout_ns);
int kvt_job_cancel(kvt_cache *c, kvt_job job);
int kvt_job_release(kvt_cache *c, kvt_job job);
int kvt_drain(kvt_cache *c);

int kvt_set_cost_model(kvt_cache *c, const kvt_model_desc *model, const kvt_hw_desc *hw);
int kvt_report_prefill(kvt_cache *c, uint64_t from_token, uint64_t to_token, double seconds);
int kvt_get_calibrated_hw(kvt_cache *c, kvt_hw_desc *hw);

typedef struct kvt_stats {
  uint32_t size;
  uint32_t host_pool_pinned;
  uint64_t lookups, lookup_blocks;
  uint64_t acquires, hits_device, hits_host, hits_disk, misses;
  uint64_t blocks_committed;
  uint64_t blocks_d2h, blocks_h2d, blocks_h2disk, blocks_disk2h;
  uint64_t bytes_d2h, bytes_h2d, bytes_h2disk, bytes_disk2h;
  uint64_t evictions_device, evictions_host, evictions_disk;
  uint64_t verify_mismatches;
  uint64_t checksum_failures;
  uint64_t io_errors, copy_errors;
  uint64_t jobs_started, jobs_failed;
  uint64_t resident_device, resident_host, resident_disk;
  uint64_t disk_recovered, disk_discarded;
  uint64_t metadata_bytes;
  uint64_t jobs_cancelled;
  uint64_t disk_fresh_starts;
  uint64_t disk_resize_moved, disk_resize_dropped;
  uint64_t disk_recover_bytes;
  uint64_t hits_remote;
  uint64_t blocks_remote2h, bytes_remote2h;
  uint64_t blocks_h2remote, bytes_h2remote;
  uint64_t remote_probes, remote_probe_blocks;
  uint64_t remote_negative_hits;
  uint64_t remote_misses;
  uint64_t remote_corrupt;
  uint64_t remote_errors;
  uint64_t remote_timeouts;
  uint64_t remote_put_refused;
  uint64_t remote_reconnects;
  uint64_t remote_puts_skipped;
  uint32_t remote_nodes;
  uint32_t remote_nodes_degraded;
  uint32_t remote_degraded;
  uint32_t remote_cluster;
  uint64_t storage_blocks_straight, storage_blocks_staged;
  uint64_t storage_blocks_fixed;
} kvt_stats;
int kvt_get_stats(kvt_cache *c, kvt_stats *st);

typedef uint32_t kvt_region;
int kvt_register_memory(kvt_cache *c, void *base, size_t len, int kind, kvt_region *region);
int kvt_unregister_memory(kvt_cache *c, kvt_region region);
typedef struct kvt_piece {
  void *ptr;
  kvt_region region;
  uint32_t reserved;
  uint64_t offset;
  uint64_t len;
} kvt_piece;
typedef struct kvt_batch {
  uint32_t size;
  uint32_t n_blocks;
  const kvt_key *keys;
  const kvt_key *parent;
  const uint32_t *tokens;
  const kvt_piece *pieces;
  uint32_t pieces_per_block;
  uint32_t max_blocks;
  uint32_t flags;
} kvt_batch;
void kvt_batch_init(kvt_batch *b);
int kvt_exists(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
               kvt_lookup_result *res, uint8_t *tier_of_block);
int kvt_touch(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
              size_t *n_touched);
int kvt_put_from(kvt_cache *c, const kvt_batch *b, kvt_job *job);
int kvt_get_into(kvt_cache *c, const kvt_batch *b, kvt_job *job);
int kvt_remove(kvt_cache *c, const kvt_key *keys, size_t n, size_t *n_removed);
int kvt_storage_poll(kvt_cache *c, kvt_job job);
int kvt_storage_wait(kvt_cache *c, kvt_job job, int64_t timeout_ns);
int kvt_storage_results(kvt_cache *c, kvt_job job, int32_t *results, size_t n, uint32_t *n_ok);
int kvt_storage_collect(kvt_cache *c, kvt_job *jobs, int *status, size_t max, size_t *n);
int kvt_storage_release(kvt_cache *c, kvt_job job);

typedef struct kvt_object_info {
  uint32_t size;
  uint32_t parts;
  uint64_t bytes;
  uint64_t n_tokens;
  uint64_t match_tokens;
  kvt_key key;
  uint32_t tier;
} kvt_object_info;
int kvt_object_put(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, const void *data, size_t len);
int kvt_object_find(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, kvt_object_info *info);
int kvt_object_get(kvt_cache *c, const kvt_object_info *info, const uint32_t *tokens, void *buf, size_t cap);
int kvt_object_remove(kvt_cache *c, const uint32_t *tokens, size_t n_tokens);

int kvt_metrics_write(kvt_cache *c, int format, char *buf, size_t *len);
"""

# Error codes of KVT_ERROR_MAP (never renumbered or reused).
ERRORS = {
    "EMISS": -3001,
    "EMISMATCH": -3002,
    "ENOSPACE": -3003,
    "ENODEV": -3004,
    "ECORRUPT": -3005,
    "ECANCELED": -3006,
    "EBUSY": -3007,
    "ELAYOUT": -3008,
    "ESTATE": -3009,
    "EVERSION": -3010,
    "EAGAIN": -3011,
    "ENOJOB": -3012,
    "EUNSUPPORTED": -3013,
    "ENAMESPACE": -3014,
    "ETIMEDOUT": -3015,
    "EFORKED": -3016,
    "ELOCKED": -3017,
    "EREMOTE": -3018,
    "EAUTH": -3019,
}
