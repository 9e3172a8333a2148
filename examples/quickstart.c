/* kvtier quick start: offload a conversation's KV, bring it back, check it.
 * Build: cc quickstart.c $(pkg-config --cflags --libs kvtier)
 * Run:   ./quickstart [DIR]   (DIR holds the disk tier's file; default /tmp) */
#include <kvtier/kvtier.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                          \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ < 0) {                                                           \
      fprintf(stderr, "%s: %s (%d)\n", #call, kvt_strerror(rc_), rc_);       \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

enum { LAYERS = 4, KV_HEADS = 2, HEAD_DIM = 64, BT = 16, SLOTS = 32 };
#define SEG_BYTES ((size_t)BT * KV_HEADS * HEAD_DIM * 2) /* one block of K (or V), fp16 */

static unsigned char pool[LAYERS][2][SLOTS * SEG_BYTES]; /* the engine's KV pool: [layer][K/V] */

/* What "computing" token position p of layer l writes (K and V differ). */
static unsigned char kv_byte(uint32_t l, uint32_t kv, size_t pos, size_t i) {
  return (unsigned char)(pos * 31 + i * 7 + l * 3 + kv);
}

static void compute_block(uint32_t slot, size_t block) {
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t i = 0; i < SEG_BYTES; i++)
        pool[l][kv][slot * SEG_BYTES + i] = kv_byte(l, kv, block * BT + i / (SEG_BYTES / BT), i);
}

static int block_ok(uint32_t slot, size_t block) {
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t i = 0; i < SEG_BYTES; i++)
        if (pool[l][kv][slot * SEG_BYTES + i] != kv_byte(l, kv, block * BT + i / (SEG_BYTES / BT), i))
          return 0;
  return 1;
}

/* One turn of a conversation: plan, acquire, compute what was not restored,
 * commit, release. Returns the number of blocks restored (and checked). */
static size_t turn(kvt_cache *c, const uint32_t *tokens, size_t n_tokens) {
  kvt_key keys[SLOTS];
  uint32_t slots[SLOTS + 1], ready = 0;
  size_t n;
  CHECK(kvt_hash_tokens(c, NULL, tokens, n_tokens, keys, SLOTS, &n)); /* full blocks only */
  kvt_plan plan = {.size = sizeof plan};
  CHECK(kvt_plan_request(c, keys, n, n_tokens, &plan)); /* advice: restore the first k blocks */
  printf("%zu tokens: %u blocks cached, planner restores %u (est. TTFT %.2f ms vs %.2f ms recomputing)\n",
         n_tokens, plan.n_prefix, plan.restore_blocks, plan.est_ttft_s * 1e3, plan.est_recompute_all_s * 1e3);
  kvt_req req;
  kvt_acquire_info info = {.size = sizeof info};
  /* restore = plan.restore_blocks; extra_slots = 1 for the partial last block; flags = 0 */
  CHECK(kvt_acquire(c, keys, tokens, n, plan.restore_blocks, 1, 0, &req, slots, &info));
  CHECK(kvt_request_wait(c, req, -1, &ready)); /* blocks [ready, n) must be computed */
  for (size_t b = 0; b < ready; b++)
    if (!block_ok(slots[b], b)) {
      fprintf(stderr, "block %zu restored with wrong bytes\n", b);
      exit(1);
    }
  for (size_t b = ready; b < n; b++) compute_block(slots[b], b);
  CHECK(kvt_commit(c, req, n, NULL)); /* computed blocks become cached */
  CHECK(kvt_release(c, req));         /* they stay on the device, unpinned */

  kvt_job job; /* the conversation goes idle: offload it to the host tier */
  int rc = kvt_store(c, keys, n, KVT_STORE_EVICT, &job); /* 0: nothing to copy */
  CHECK(rc);
  if (rc == 1) {
    CHECK(kvt_job_wait(c, job, -1)); /* on the host only once the job is done */
    CHECK(kvt_job_release(c, job));
  }
  return ready;
}

int main(int argc, char **argv) {
  char disk_path[4096];
  snprintf(disk_path, sizeof disk_path, "%s/kvtier-quickstart.cache", argc > 1 ? argv[1] : "/tmp");
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "quickstart-model@v1"; /* caches of other models never alias */
  cfg.dtype = KVT_DTYPE_F16;
  cfg.device = KVT_DEVICE_HOST; /* the pool above is in RAM; KVT_DEVICE_CUDA for GPU memory */
  cfg.host_blocks = 64;         /* 64 x 32 KiB blocks = 2 MiB pinned */
  cfg.disk_path = disk_path;
  cfg.disk_blocks = 256;        /* 8 MiB file */
  cfg.disk_reset = 1;
  kvt_cache *c;
  CHECK(kvt_open(&cfg, &c));

  kvt_segment seg[LAYERS * 2]; /* per layer: K and V, block slot s at base + s * stride */
  for (int l = 0; l < LAYERS; l++)
    for (int kv = 0; kv < 2; kv++) seg[2 * l + kv] = (kvt_segment){pool[l][kv], SEG_BYTES, SEG_BYTES};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = LAYERS;
  lay.segments_per_layer = 2;
  lay.num_slots = SLOTS;
  lay.segments = seg;
  CHECK(kvt_register_layout(c, &lay)); /* also opens and recovers the disk tier */

  /* The planner needs the model (its KV bytes per block must equal the
   * layout's: 4 layers x 2 x 2 heads x 64 x 2 bytes x 16 tokens) and the
   * hardware: here a CPU at ~50 GFLOP/s with memcpy at 10 GB/s. */
  kvt_model_desc m;
  kvt_model_init(&m);
  snprintf(m.name, sizeof m.name, "quickstart");
  m.num_layers = LAYERS, m.hidden_size = 512, m.num_heads = 8, m.num_kv_heads = KV_HEADS;
  m.head_dim = HEAD_DIM, m.intermediate_size = 1408, m.vocab_size = 32000, m.kv_dtype_bytes = 2;
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  hw.flops_per_gpu = 100e9, hw.mfu = 0.5, hw.device_host.bytes_per_s = 10e9;
  CHECK(kvt_set_cost_model(c, &m, &hw));

  uint32_t tokens[200];
  for (uint32_t i = 0; i < 200; i++) tokens[i] = 1000 + i * 13 % 997;
  size_t first = turn(c, tokens, 100);  /* round 1: nothing cached, 6 blocks computed */
  size_t second = turn(c, tokens, 200); /* round 2: the 6 blocks come back from the host */
  printf("round 1 restored %zu blocks, round 2 restored %zu; every restored byte checked\n", first, second);
  kvt_close(c);
  remove(disk_path);
  return first == 0 && second == 6 ? 0 : 1;
}
