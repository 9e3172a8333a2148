/* llama.cpp conversations kept in kvtier: see kvt_llama.h. */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include "kvt_llama.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef PART_BYTES
#define PART_BYTES (256u << 10) /* object parts: states are megabytes */
#endif
#define KEY_TOKENS 32           /* a prefix key every 32 tokens */
#define EWMA 0.3

double kl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kl_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kl_options_init(kl_options *o) {
  memset(o, 0, sizeof *o);
  o->threads = 2;
  o->n_ctx = 4096;
  o->host_bytes = 256ull << 20;
  o->disk_bytes = 1ull << 30;
  o->write_through = 1;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ctx) {
  (void)ctx;
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* The namespace: the model and everything that shapes its state's bytes. */
static void fingerprint(kl_engine *e, char *buf, size_t len) {
  char desc[128];
  llama_model_desc(e->model, desc, sizeof desc);
  snprintf(buf, len, "llama.cpp:%s:%llu params:%d layers:%d embd:vocab %d:fa off", desc,
           (unsigned long long)llama_model_n_params(e->model), llama_model_n_layer(e->model),
           llama_model_n_embd(e->model), e->n_vocab);
}

static int open_cache(kl_engine *e) {
  char fp[512];
  fingerprint(e, fp, sizeof fp);
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = fp;
  cfg.block_tokens = KEY_TOKENS;
  cfg.device = KVT_DEVICE_HOST;
  cfg.host_blocks = e->opt.host_bytes / PART_BYTES;
  cfg.disk_path = e->opt.disk_path;
  cfg.disk_blocks = e->opt.disk_path ? e->opt.disk_bytes / PART_BYTES : 0;
  cfg.disk_reset = e->opt.disk_reset;
  cfg.write_policy = e->opt.write_through ? KVT_WRITE_THROUGH : KVT_WRITE_BACK;
  cfg.copy_threads = 2;
  int rc = kvt_open(&cfg, &e->cache);
  kvt_segment seg = {NULL, 0, PART_BYTES};
  kvt_layout l;
  kvt_layout_init(&l);
  l.num_layers = 1;
  l.segments_per_layer = 1;
  l.segments = &seg;
  l.flags = KVT_LAYOUT_STORAGE;
  if (rc == 0) rc = kvt_register_layout(e->cache, &l);
  if (rc) fprintf(stderr, "kvtier: %s %s\n", kvt_strerror(rc), e->cache ? kvt_error_detail(e->cache) : "");
  return rc;
}

/* The cost model's view of the model; the hardware is calibrated as turns run. */
static void describe(kl_engine *e) {
  kvt_model_init(&e->desc);
  snprintf(e->desc.name, sizeof e->desc.name, "llama.cpp");
  e->desc.num_layers = (uint32_t)llama_model_n_layer(e->model);
  e->desc.hidden_size = (uint32_t)llama_model_n_embd(e->model);
  e->desc.num_heads = (uint32_t)llama_model_n_head(e->model);
  e->desc.num_kv_heads = (uint32_t)llama_model_n_head_kv(e->model);
  e->desc.vocab_size = (uint32_t)e->n_vocab;
  e->desc.params = (double)llama_model_n_params(e->model);
  kvt_hw_init(&e->hw);
  e->hw.mfu = 1.0;                  /* flops_per_gpu holds the achieved rate */
  e->hw.flops_per_gpu = 20e9;       /* until the first prefill is measured */
  e->hw.overlap = 0;                /* a state is set whole before compute */
}

int kl_open(kl_engine *e, const kl_options *o) {
  memset(e, 0, sizeof *e);
  e->opt = *o;
  llama_log_set(quiet_log, NULL);
  llama_backend_init();
  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  if (!(e->model = llama_model_load_from_file(o->model_path, mp))) {
    fprintf(stderr, "llama.cpp: cannot load %s\n", o->model_path);
    return -EIO;
  }
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = o->n_ctx;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_seq_max = 1;
  cp.n_threads = o->threads;
  cp.n_threads_batch = o->threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED; /* exact truncation: see the README */
  cp.no_perf = true;
  if (!(e->ctx = llama_init_from_model(e->model, cp))) {
    fprintf(stderr, "llama.cpp: cannot make a context of %u tokens\n", o->n_ctx);
    return -EIO;
  }
  e->vocab = llama_model_get_vocab(e->model);
  e->n_vocab = llama_vocab_n_tokens(e->vocab);
  e->n_batch = cp.n_batch;
  e->batch = llama_batch_init((int32_t)e->n_batch, 0, 1);
  describe(e);
  return open_cache(e);
}

int kl_restart_cache(kl_engine *e) {
  kvt_close(e->cache);
  e->cache = NULL;
  e->opt.disk_reset = 0;
  return open_cache(e);
}

static void state_free(kl_engine *e);

void kl_close(kl_engine *e) {
  kvt_close(e->cache);
  if (e->batch.token) llama_batch_free(e->batch);
  if (e->ctx) llama_free(e->ctx);
  if (e->model) llama_model_free(e->model);
  state_free(e);
  memset(e, 0, sizeof *e);
}

/* Cells only: zeroing the buffers too (data = true) costs a pass over the
 * whole context (34 MB at 8k tokens of this bench's model) on every turn,
 * and unused cells are masked out of attention whatever they hold. */
void kl_clear(kl_engine *e) { llama_memory_clear(llama_get_memory(e->ctx), false); }

int kl_prefill(kl_engine *e, const llama_token *t, size_t from, size_t to, float *logits) {
  double t0 = kl_now();
  for (size_t at = from; at < to;) {
    int32_t n = (int32_t)(to - at < e->n_batch ? to - at : e->n_batch);
    e->batch.n_tokens = n;
    for (int32_t i = 0; i < n; i++) {
      e->batch.token[i] = t[at + (size_t)i];
      e->batch.pos[i] = (llama_pos)(at + (size_t)i);
      e->batch.n_seq_id[i] = 1;
      e->batch.seq_id[i][0] = 0;
      e->batch.logits[i] = at + (size_t)i == to - 1;
    }
    if (llama_decode(e->ctx, e->batch) != 0) {
      fprintf(stderr, "llama.cpp: decode failed at token %zu\n", at);
      return -EIO;
    }
    at += (size_t)n;
  }
  double s = kl_now() - t0;
  /* Calibration: the FLOP rate this prefill achieved (EWMA). */
  double flops = kvt_cost_recompute_flops(&e->desc, from, to, NULL);
  if (to - from >= 64 && s > 0 && flops > 0)
    e->hw.flops_per_gpu = e->hw.flops_per_gpu * (1 - EWMA) + flops / s * EWMA;
  if (logits && to > from) memcpy(logits, llama_get_logits_ith(e->ctx, -1), (size_t)e->n_vocab * sizeof(float));
  return 0;
}

/* The state's staging buffer: page-aligned, so that kvtier's disk tier
 * reads and writes it straight (kvt_object_get registers it for the call),
 * with no staging copy; and in transparent huge pages, asked for with
 * MADV_HUGEPAGE on 2 MiB-aligned memory. An O_DIRECT read lands in the
 * buffer's physical pages one segment each: into 4 KiB pages a 256 KiB
 * part is 64 segments, and a virtual disk that pays per segment read
 * restores at half the speed it reads into huge pages (llama_bench's
 * header has the figures). Only a hint: without THP it is plain pages. */
#define HUGE_BYTES ((size_t)2 << 20)

static void state_free(kl_engine *e) {
  if (e->state) munmap(e->state_map, e->state_map_len);
  e->state = NULL;
  e->state_map = NULL;
  e->state_cap = e->state_map_len = 0;
}

static int state_room(kl_engine *e, size_t need) {
  if (need <= e->state_cap) return 0;
  size_t cap = (need + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1), len = cap + HUGE_BYTES;
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return -ENOMEM;
  uint8_t *p = (uint8_t *)(((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
  (void)madvise(p, cap, MADV_HUGEPAGE);
  state_free(e);
  e->state = p;
  e->state_cap = cap;
  e->state_map = m;
  e->state_map_len = len;
  return 0;
}

int kl_park(kl_engine *e, const llama_token *t, size_t n) {
  size_t need = llama_state_seq_get_size(e->ctx, 0);
  int rc = state_room(e, need);
  if (rc) return rc;
  size_t len = llama_state_seq_get_data(e->ctx, e->state, need, 0);
  kl_clear(e);
  if (len == 0) return -EIO;
  rc = kvt_object_put(e->cache, (const uint32_t *)t, n, e->state, len);
  return rc == KVT_EAGAIN ? 1 : rc; /* parts of that key in flight (a spill): parking is best effort */
}

static void calibrate_link(kvt_link *l, double bytes, double s) {
  if (s > 0) l->bytes_per_s = l->bytes_per_s * (1 - EWMA) + bytes / s * EWMA;
}

/* Restores info's object into sequence 0, truncated to `keep` tokens. */
static int restore(kl_engine *e, const kvt_object_info *info, const llama_token *t, size_t keep, kl_turn *turn) {
  int rc = state_room(e, info->bytes);
  if (rc) return rc;
  double t0 = kl_now();
  rc = kvt_object_get(e->cache, info, (const uint32_t *)t, e->state, e->state_cap);
  double t1 = kl_now();
  turn->get_s = t1 - t0;
  if (rc) return rc;
  if (llama_state_seq_set_data(e->ctx, e->state, info->bytes, 0) == 0) {
    kl_clear(e);
    return -EIO;
  }
  if (keep < info->n_tokens && !llama_memory_seq_rm(llama_get_memory(e->ctx), 0, (llama_pos)keep, -1)) {
    kl_clear(e);
    return -EIO;
  }
  double t2 = kl_now();
  turn->set_s = t2 - t1;
  /* Calibration: a host-tier read plus set_data stands for the "PCIe" hop,
   * a disk-tier read for the disk one. */
  if (info->tier == KVT_TIER_DISK) {
    calibrate_link(&e->hw.host_disk, (double)info->bytes, t1 - t0);
    calibrate_link(&e->hw.device_host, (double)info->bytes, t2 - t1);
  } else {
    calibrate_link(&e->hw.device_host, (double)info->bytes, t2 - t0);
  }
  return 0;
}

int kl_serve(kl_engine *e, const llama_token *t, size_t n, float *logits, kl_turn *turn) {
  double t0 = kl_now();
  memset(turn, 0, sizeof *turn);
  turn->n_tokens = n;
  turn->tier = KVT_TIER_NONE;
  kl_clear(e);
  size_t have = 0;
  kvt_object_info info = {.size = sizeof info};
  double cpu0 = kl_cpu_now(), f0 = kl_now();
  int found = n > 1 && kvt_object_find(e->cache, (const uint32_t *)t, n, &info) == 0;
  turn->find_s = kl_now() - f0;
  if (found) {
    /* The first token's logits need one token computed. */
    size_t keep = info.match_tokens < n ? (size_t)info.match_tokens : n - 1;
    uint64_t bytes = info.bytes;
    turn->est_recompute_s = kvt_cost_compute_s(&e->desc, &e->hw, 0, n);
    turn->est_restore_s = kvt_cost_transfer_s(&e->hw, info.tier == KVT_TIER_DISK ? 0 : bytes,
                                              info.tier == KVT_TIER_DISK ? bytes : 0) +
                          kvt_cost_compute_s(&e->desc, &e->hw, keep, n);
    int go = e->opt.force > 0 || (e->opt.force == 0 && turn->est_restore_s < turn->est_recompute_s);
    if (!go) {
      turn->decided_recompute = 1;
    } else if (restore(e, &info, t, keep, turn) == 0) {
      have = keep;
      turn->tier = info.tier;
    } else {
      turn->refused = 1;
    }
  }
  turn->restore_cpu_s = kl_cpu_now() - cpu0;
  double t1 = kl_now();
  int rc = kl_prefill(e, t, have, n, logits);
  turn->prefill_s = kl_now() - t1;
  turn->restored = have;
  turn->computed = n - have;
  turn->ttft_s = kl_now() - t0;
  return rc;
}
