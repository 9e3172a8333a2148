/* serving_loop: a minimal custom serving loop on kvtier.
 *
 * Users hold multi-turn conversations that share a system prompt. Each turn
 * the loop hashes the conversation, asks kvtier for a plan, acquires device
 * slots (restoring what the plan restores), "prefills" the rest (writes KV
 * derived from the tokens), commits and releases. Between turns an idle
 * conversation is offloaded to the host tier (and on to disk when
 * --disk-blocks is set). Every restored block is checked byte for byte
 * against what the prefill wrote for it.
 *
 *   serving_loop [--users N] [--rounds R] [--device-blocks D] [--host-blocks H]
 *                [--disk-blocks B --disk-path FILE] [--quiet]
 */
#include <kvtier/kvtier.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 8
#define SEG_BYTES 4096 /* per layer, per K/V, per 16-token block */
#define BT 16
#define MAX_BLOCKS 512

typedef struct opts {
  uint32_t users, rounds, device_blocks, system_tokens, turn_tokens;
  uint64_t host_blocks, disk_blocks;
  const char *disk_path;
  const char *metrics_out; /* the cache's Prometheus metrics at the end, as an engine's /metrics would serve them */
  int quiet;
} opts;

/* The KV a prefill writes for a block depends only on its tokens' prefix:
 * derive it from the block key, so a restore can be checked exactly. */
static void kv_bytes(const kvt_key *key, int layer, int seg, unsigned char *out) {
  uint64_t s = key->lo ^ (key->hi * 31) ^ (uint64_t)(layer * 2 + seg) * 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < SEG_BYTES; i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    memcpy(out + i, &s, 8);
  }
}

static unsigned char *pool[LAYERS][2];

static void prefill(const kvt_key *key, uint32_t slot) {
  for (int l = 0; l < LAYERS; l++)
    for (int s = 0; s < 2; s++) kv_bytes(key, l, s, pool[l][s] + (size_t)slot * SEG_BYTES);
}

static int restored_ok(const kvt_key *key, uint32_t slot) {
  unsigned char want[SEG_BYTES];
  for (int l = 0; l < LAYERS; l++)
    for (int s = 0; s < 2; s++) {
      kv_bytes(key, l, s, want);
      if (memcmp(want, pool[l][s] + (size_t)slot * SEG_BYTES, SEG_BYTES)) return 0;
    }
  return 1;
}

/* Conversation u after round r: system prompt, then r question/answer turns. */
static uint32_t conversation(const opts *o, uint32_t u, uint32_t r, uint32_t *tok) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < o->system_tokens; i++) tok[n++] = 1000 + i;
  for (uint32_t t = 0; t <= r; t++)
    for (uint32_t i = 0; i < o->turn_tokens && n < MAX_BLOCKS * BT; i++) tok[n++] = 50000 + u * 7919 + t * 131 + i;
  return n;
}

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){.users = 8, .rounds = 4, .device_blocks = 96, .host_blocks = 1024, .system_tokens = 256, .turn_tokens = 200};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--quiet")) o->quiet = 1;
    else if (!v) return -1;
    else if (!strcmp(a, "--users")) o->users = (uint32_t)atoi(v), i++;
    else if (!strcmp(a, "--rounds")) o->rounds = (uint32_t)atoi(v), i++;
    else if (!strcmp(a, "--device-blocks")) o->device_blocks = (uint32_t)atoi(v), i++;
    else if (!strcmp(a, "--host-blocks")) o->host_blocks = (uint64_t)atoll(v), i++;
    else if (!strcmp(a, "--disk-blocks")) o->disk_blocks = (uint64_t)atoll(v), i++;
    else if (!strcmp(a, "--disk-path")) o->disk_path = v, i++;
    else if (!strcmp(a, "--metrics-out")) o->metrics_out = v, i++;
    else return -1;
  }
  return o->users && o->device_blocks ? 0 : -1;
}

static kvt_cache *open_cache(const opts *o) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "serving-loop-demo@1";
  cfg.block_tokens = BT;
  cfg.device = KVT_DEVICE_HOST; /* the "device" pool lives in RAM here */
  cfg.host_blocks = o->host_blocks;
  cfg.disk_path = o->disk_blocks ? o->disk_path : NULL;
  cfg.disk_blocks = o->disk_blocks;
  cfg.disk_reset = 1;
  kvt_cache *c = NULL;
  int rc = kvt_open(&cfg, &c);
  if (rc) {
    fprintf(stderr, "kvt_open: %s\n", kvt_strerror(rc));
    return NULL;
  }
  static kvt_segment seg[LAYERS * 2];
  for (int l = 0; l < LAYERS; l++)
    for (int s = 0; s < 2; s++) {
      pool[l][s] = calloc(o->device_blocks, SEG_BYTES);
      seg[l * 2 + s] = (kvt_segment){pool[l][s], SEG_BYTES, SEG_BYTES};
    }
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = LAYERS;
  lay.segments_per_layer = 2;
  lay.num_slots = o->device_blocks;
  lay.segments = seg;
  if ((rc = kvt_register_layout(c, &lay)) != 0) {
    fprintf(stderr, "kvt_register_layout: %s\n", kvt_strerror(rc));
    kvt_close(c);
    return NULL;
  }
  /* The planner's model must describe these blocks: 8 layers x K,V x 1 KV
   * head of 128 x 2 bytes = 4 KiB per token; a 1B-class shape otherwise. */
  kvt_model_desc m;
  kvt_model_init(&m);
  snprintf(m.name, sizeof m.name, "demo-1b");
  m.num_layers = LAYERS;
  m.hidden_size = 2048;
  m.num_heads = 16;
  m.num_kv_heads = 1;
  m.head_dim = 128;
  m.intermediate_size = 8192;
  m.vocab_size = 32000;
  m.kv_dtype_bytes = 2;
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  if ((rc = kvt_set_cost_model(c, &m, &hw)) != 0) {
    fprintf(stderr, "kvt_set_cost_model: %s\n", kvt_strerror(rc));
    kvt_close(c);
    return NULL;
  }
  return c;
}

typedef struct totals {
  uint64_t turns, restored, recomputed, bad;
} totals;

static int serve_turn(kvt_cache *c, const opts *o, uint32_t u, uint32_t r, totals *t) {
  static uint32_t tok[MAX_BLOCKS * BT], slots[MAX_BLOCKS + 1];
  static kvt_key keys[MAX_BLOCKS];
  uint32_t n_tok = conversation(o, u, r, tok);
  size_t n;
  kvt_hash_tokens(c, NULL, tok, n_tok, keys, MAX_BLOCKS, &n);
  kvt_plan plan = {.size = sizeof plan};
  int rc = kvt_plan_request(c, keys, n, n_tok, &plan);
  if (rc) return rc;
  kvt_req req;
  kvt_acquire_info info = {.size = sizeof info};
  rc = kvt_acquire(c, keys, tok, n, plan.restore_blocks, 1, 0, &req, slots, &info);
  if (rc < 0) return rc;
  uint32_t ready = 0;
  if ((rc = kvt_request_wait(c, req, -1, &ready)) != 0) return rc;
  for (uint32_t i = 0; i < ready; i++) t->bad += !restored_ok(&keys[i], slots[i]);
  for (uint32_t i = ready; i < n; i++) prefill(&keys[i], slots[i]);
  kvt_commit(c, req, n, NULL);
  kvt_release(c, req);
  t->turns++;
  t->restored += ready - info.n_device_hits;
  t->recomputed += n - ready;
  if (!o->quiet)
    printf("user %2u round %u: %4u tokens %3zu blocks | plan %-9s k=%3u | device %3u host %3u disk %3u | "
           "restored %3u recomputed %3zu | est ttft %.2f ms\n",
           u, r, n_tok, n, plan.decision == KVT_DECIDE_RESTORE ? "restore" : plan.decision == KVT_DECIDE_SPLIT ? "split" : "recompute",
           plan.restore_blocks, info.n_device_hits, info.n_loading - info.n_from_disk, info.n_from_disk,
           ready - info.n_device_hits, n - ready, plan.est_ttft_s * 1e3);
  /* The user goes idle: offload the conversation (device -> host [-> disk]). */
  kvt_job job;
  if (kvt_store(c, keys, n, KVT_STORE_EVICT, &job) == 1) {
    kvt_job_wait(c, job, -1);
    kvt_job_release(c, job);
  }
  return 0;
}

/* What an engine's /metrics handler does: size the text, then write it. */
static int write_metrics(kvt_cache *c, const char *path) {
  size_t len = 0;
  kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, NULL, &len); /* -ENOBUFS: len is the size */
  size_t cap = len + 1024;                                  /* headroom: counters gain digits */
  char *text = malloc(cap);
  int rc = text ? kvt_metrics_write(c, KVT_METRICS_PROMETHEUS, text, &cap) : -ENOMEM;
  FILE *f = rc == 0 ? fopen(path, "w") : NULL;
  if (f) {
    fputs(text, f);
    rc = fclose(f) == 0 ? 0 : -EIO;
  } else if (rc == 0) {
    rc = -EIO;
  }
  if (rc) fprintf(stderr, "--metrics-out %s: %s\n", path, kvt_strerror(rc));
  free(text);
  return rc;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) {
    fprintf(stderr, "usage: serving_loop [--users N] [--rounds R] [--device-blocks D] [--host-blocks H]\n"
                    "                    [--disk-blocks B --disk-path FILE] [--metrics-out FILE] [--quiet]\n");
    return 2;
  }
  kvt_cache *c = open_cache(&o);
  if (!c) return 1;
  printf("kvtier %s serving loop: %u users x %u rounds; device %u blocks (%s), host %llu, disk %llu (%s); block %zu KiB\n",
         kvt_version(), o.users, o.rounds, o.device_blocks, kvt_device_backend_name(c),
         (unsigned long long)o.host_blocks, (unsigned long long)o.disk_blocks, kvt_disk_backend_name(c),
         kvt_block_bytes(c) >> 10);
  totals t = {0};
  for (uint32_t r = 0; r < o.rounds; r++)
    for (uint32_t u = 0; u < o.users; u++) {
      int rc = serve_turn(c, &o, u, r, &t);
      if (rc) {
        fprintf(stderr, "turn failed: %s\n", kvt_strerror(rc));
        kvt_close(c);
        return 1;
      }
    }
  kvt_drain(c);
  kvt_stats st = {.size = sizeof st};
  kvt_get_stats(c, &st);
  printf("\n%llu turns: %llu blocks restored from host/disk, %llu recomputed, %llu device hits; "
         "restored bytes checked: %s (%llu bad)\n",
         (unsigned long long)t.turns, (unsigned long long)t.restored, (unsigned long long)t.recomputed,
         (unsigned long long)st.hits_device, t.bad ? "MISMATCH" : "all exact", (unsigned long long)t.bad);
  printf("moved: d2h %llu blocks (%.1f MiB), h2d %llu (%.1f MiB), h2disk %llu, disk2h %llu; evictions device %llu host %llu disk %llu\n",
         (unsigned long long)st.blocks_d2h, st.bytes_d2h / 1048576.0, (unsigned long long)st.blocks_h2d,
         st.bytes_h2d / 1048576.0, (unsigned long long)st.blocks_h2disk, (unsigned long long)st.blocks_disk2h,
         (unsigned long long)st.evictions_device, (unsigned long long)st.evictions_host,
         (unsigned long long)st.evictions_disk);
  if (o.metrics_out && write_metrics(c, o.metrics_out) != 0) t.bad++;
  kvt_close(c);
  return t.bad ? 1 : 0;
}
