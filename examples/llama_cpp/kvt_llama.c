/* llama.cpp conversations kept in kvtier: see kvt_llama.h. */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include "kvt_llama.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef PART_BYTES
/* Object parts: states are megabytes. Each part is a disk record with a
 * 4 KiB prefix of its own, read as one request unless the kernel merges it
 * with the next; parts of 512 KiB restored states from disk 3 to 4% faster
 * than parts of 256 KiB from 2k tokens on (fewer requests, half the
 * prefixes), and a state wastes at most one part's tail of its slots. */
#define PART_BYTES (512u << 10)
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
  o->chunk_tokens = 0;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ctx) {
  (void)ctx;
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* The namespace: the model and everything that shapes its state's bytes. */
static void fingerprint(kl_engine *e, char *buf, size_t len) {
  char desc[128];
  llama_model_desc(e->model, desc, sizeof desc);
  snprintf(buf, len, "llama.cpp:%s:%llu params:%d layers:%d embd:vocab %d:fa off:chunks %u", desc,
           (unsigned long long)llama_model_n_params(e->model), llama_model_n_layer(e->model),
           llama_model_n_embd(e->model), e->n_vocab, e->opt.chunk_tokens);
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
  if (rc) {
    fprintf(stderr, "kvtier: %s %s\n", kvt_strerror(rc), e->cache ? kvt_error_detail(e->cache) : "");
    kvt_close(e->cache); /* no cache rather than one without a layout: turns recompute */
    e->cache = NULL;
  }
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
  if (!o->host_bytes && !o->disk_path) {
    fprintf(stderr, "kvt_llama: neither a host tier nor a disk tier\n");
    return -EINVAL;
  }
  if (o->chunk_tokens && (o->chunk_tokens % KEY_TOKENS || o->chunk_tokens < 2 * KEY_TOKENS)) {
    fprintf(stderr, "kvt_llama: chunk_tokens %u is neither 0 nor a multiple of %d of at least %d\n",
            o->chunk_tokens, KEY_TOKENS, 2 * KEY_TOKENS);
    return -EINVAL;
  }
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
  cp.n_seq_max = 2;     /* 0: the conversation; 1: a chunk on its way in or out */
  cp.kv_unified = true; /* one cell array: a chunk joins sequence 0 by a tag (seq_cp), no copy */
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
static void fetcher_stop(kl_engine *e);

void kl_close(kl_engine *e) {
  fetcher_stop(e);
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
 * buffer's physical pages one segment each: into 4 KiB pages a 512 KiB
 * part is 128 segments, and a virtual disk that pays per segment read
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

/* ---- chunks ----
 *
 * With chunk_tokens set, a conversation's state goes to kvtier in chunks
 * (with 0, it is one chunk: the whole state): the cells of tokens
 * [s, end) as one llama.cpp sequence state (copied out of sequence 0 into
 * sequence 1 by a tag, llama_memory_seq_cp, then llama_state_seq_get_data
 * of sequence 1), filed as the object of the prefix t[0..end). Chunks start
 * at multiples of chunk_tokens (C); a chunk is full (C tokens) when at least
 * KEY_TOKENS more tokens follow it, else it is the conversation's last and
 * runs to its end. So a chunk's start follows from its end, and the chunks
 * of a prefix are the same objects in every conversation that shares it: a
 * conversation parked again stores only the chunks it does not have yet.
 * A restore finds the chain of chunks from token 0 (in memory: no reads),
 * then the engine's reading threads read them (kvt_object_get, in order)
 * while the serving thread hands each to llama.cpp as soon as it has
 * landed: set_data into sequence 1, then a tag joins its cells to sequence
 * 0. llama.cpp's own file load overlaps its set_data with the kernel's
 * read-ahead in the same way. */

/* Tokens a full chunk holds; chunk_tokens 0 (whole states): more than any
 * conversation. */
static size_t chunk_len(const kl_engine *e) {
  return e->opt.chunk_tokens ? e->opt.chunk_tokens : (SIZE_MAX / 4 / KEY_TOKENS) * KEY_TOKENS;
}

static size_t chunk_start(const kl_engine *e, size_t end) {
  size_t c = chunk_len(e);
  return end < c + KEY_TOKENS ? 0 : (end - KEY_TOKENS) / c * c;
}

/* Stores the cells of t[s..end) (sequence 0) as their chunk's object, unless
 * an object already stored there covers them. 0 stored or already there, 1
 * not stored this time (another object under its key, or its parts busy),
 * or a negative code. */
static int put_chunk(kl_engine *e, kvt_cache *into, const llama_token *t, size_t s, size_t end) {
  kvt_object_info in = {.size = sizeof in};
  int found = kvt_object_find(into, (const uint32_t *)t, end, &in) == 0 && chunk_start(e, in.n_tokens) == s;
  if (found && in.match_tokens >= end) {
    e->chunks_kept++;
    return 0;
  }
  /* A shorter version of this chunk (the same tokens, fewer of them) under
   * the same key, from an earlier park of this conversation in the same
   * 32-token block: replaced, else the tokens it lacks would be computed on
   * every return. */
  if (found && in.match_tokens == in.n_tokens && in.n_tokens / KEY_TOKENS == end / KEY_TOKENS)
    kvt_object_remove(into, (const uint32_t *)t, end);
  llama_memory_t mem = llama_get_memory(e->ctx);
  llama_memory_seq_cp(mem, 0, 1, (llama_pos)s, (llama_pos)end);
  size_t need = llama_state_seq_get_size(e->ctx, 1);
  int rc = state_room(e, need);
  size_t len = rc ? 0 : llama_state_seq_get_data(e->ctx, e->state, need, 1);
  llama_memory_seq_rm(mem, 1, -1, -1);
  if (rc) return rc;
  if (len == 0) return -EIO;
  rc = kvt_object_put(into, (const uint32_t *)t, end, e->state, len);
  if (rc == 0) e->chunks_put++;
  return rc == KVT_EAGAIN ? 1 : rc; /* parts of that key in flight (a spill): parking is best effort */
}

int kl_store(kl_engine *e, kvt_cache *into, const llama_token *t, size_t n) {
  if (!into) into = e->cache;
  if (!into) return KVT_ESTATE; /* kl_restart_cache failed */
  if (n < KEY_TOKENS) return -EINVAL;
  llama_memory_t mem = llama_get_memory(e->ctx);
  if (llama_memory_seq_pos_min(mem, 0) != 0 || llama_memory_seq_pos_max(mem, 0) + 1 < (llama_pos)n)
    return -EINVAL; /* the context does not hold t[0..n): a chunk would claim cells it lacks */
  size_t c = chunk_len(e);
  int busy = 0;
  for (size_t s = 0;; s += c) {
    size_t end = s + c + KEY_TOKENS <= n ? s + c : n;
    int rc = put_chunk(e, into, t, s, end);
    if (rc < 0) return rc;
    busy |= rc;
    if (end == n) break;
  }
  return busy;
}

int kl_park(kl_engine *e, const llama_token *t, size_t n) {
  int rc = kl_store(e, NULL, t, n);
  kl_clear(e);
  return rc;
}

/* One chunk of a restore: its object, the tokens it starts at and those of
 * it kept, where it lands in the state buffer, and how its read went. */
typedef struct kl_chunk {
  kvt_object_info info;
  size_t start, keep, off;
  int rc, landed;
  double get_s;
} kl_chunk;

/* The reading threads: they take a restore's chunks in order, two disk
 * reads in flight, so that one read's fixed costs (its submission, its
 * checksum tail, the wake-ups) overlap the other's transfer. A host-tier
 * chunk is read alone: its read is kvtier's copy workers' memcpy, which a
 * second read in flight would only share the CPUs with. */
#define READERS 2

typedef struct kl_fetcher {
  pthread_t threads[READERS];
  int n_threads;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int quit, stop;          /* quit: the threads end; stop: take no more chunks */
  kl_chunk *plan;
  uint32_t n, next, active; /* chunks asked for, the next one to take, reads in flight */
  const llama_token *t;
  kl_engine *e;
} kl_fetcher;

/* Reads a chunk into its place in the state buffer (ch->rc, ch->get_s). */
static void read_chunk(kl_engine *e, kl_chunk *ch, const llama_token *t) {
  double t0 = kl_now();
  ch->rc = kvt_object_get(e->cache, &ch->info, (const uint32_t *)t, e->state + ch->off, e->state_cap - ch->off);
  ch->get_s = kl_now() - t0;
}

static void *fetcher_main(void *arg) {
  kl_fetcher *f = arg;
  pthread_mutex_lock(&f->lock);
  for (;;) {
    while (!f->quit && (f->stop || f->next >= f->n || (f->active && f->plan[f->next].info.tier != KVT_TIER_DISK)))
      pthread_cond_wait(&f->cond, &f->lock);
    if (f->quit) break;
    kl_chunk *ch = &f->plan[f->next++];
    f->active++;
    pthread_mutex_unlock(&f->lock);
    read_chunk(f->e, ch, f->t);
    pthread_mutex_lock(&f->lock);
    ch->landed = 1;
    f->active--;
    if (ch->rc) f->stop = 1; /* the chunks after it are not wanted */
    pthread_cond_broadcast(&f->cond);
  }
  pthread_mutex_unlock(&f->lock);
  return NULL;
}

static void fetcher_stop(kl_engine *e) {
  kl_fetcher *f = e->fetch;
  if (!f) return;
  pthread_mutex_lock(&f->lock);
  f->quit = 1;
  pthread_cond_broadcast(&f->cond);
  pthread_mutex_unlock(&f->lock);
  for (int i = 0; i < f->n_threads; i++) pthread_join(f->threads[i], NULL);
  pthread_mutex_destroy(&f->lock);
  pthread_cond_destroy(&f->cond);
  free(f);
  e->fetch = NULL;
}

static int fetcher_start(kl_engine *e) {
  if (e->fetch) return 0;
  kl_fetcher *f = calloc(1, sizeof *f);
  if (!f) return -ENOMEM;
  pthread_mutex_init(&f->lock, NULL);
  pthread_cond_init(&f->cond, NULL);
  f->e = e;
  e->fetch = f;
  for (; f->n_threads < READERS; f->n_threads++)
    if (pthread_create(&f->threads[f->n_threads], NULL, fetcher_main, f)) break;
  if (f->n_threads == 0) {
    fetcher_stop(e);
    return -EAGAIN;
  }
  return 0;
}

/* The chain of stored chunks from token 0 for t[0..n): at most one per
 * start, each found (kvt_object_find, from memory) as the longest stored
 * prefix that ends where a chunk starting there can end. A chunk that runs
 * past the next start (a conversation's last) is cut there when a chunk
 * starts there, else kept whole. Returns how many; the last one's keep is
 * what the restore gives (never the last token, whose logits must be
 * computed). */
static uint32_t plan_chunks(kl_engine *e, const llama_token *t, size_t n, kl_chunk *plan, uint32_t max) {
  size_t c = chunk_len(e), p = 0, whole = 0;
  uint32_t k = 0;
  while (k < max && p + 1 < n) {
    size_t lim = p + c + KEY_TOKENS - 1 < n ? p + c + KEY_TOKENS - 1 : n;
    kl_chunk *ch = &plan[k];
    ch->info = (kvt_object_info){.size = sizeof ch->info};
    if (lim < KEY_TOKENS || kvt_object_find(e->cache, (const uint32_t *)t, lim, &ch->info)) break;
    if (chunk_start(e, ch->info.n_tokens) != p || ch->info.match_tokens <= p) break;
    ch->start = p;
    ch->keep = whole = ch->info.match_tokens < n - 1 ? (size_t)ch->info.match_tokens : n - 1;
    k++;
    if (ch->keep < p + c || ch->keep == n - 1) break;
    ch->keep = p + c; /* if the next chunk is there */
    p += c;
  }
  if (k) plan[k - 1].keep = whole;
  return k;
}

static void calibrate_link(kvt_link *l, double bytes, double s) {
  if (s > 0) l->bytes_per_s = l->bytes_per_s * (1 - EWMA) + bytes / s * EWMA;
}

/* Calibration: a disk-tier read stands for the disk hop; a host-tier read
 * plus set_data, and set_data after a disk read, for the "PCIe" one. */
static void calibrate_chunk(kl_engine *e, const kl_chunk *ch, double set_s) {
  double bytes = (double)ch->info.bytes;
  if (ch->info.tier == KVT_TIER_DISK) {
    calibrate_link(&e->hw.host_disk, bytes, ch->get_s);
    calibrate_link(&e->hw.device_host, bytes, set_s);
  } else {
    calibrate_link(&e->hw.device_host, bytes, ch->get_s + set_s);
  }
}

/* One landed chunk into sequence 0, cut to its keep. Its cells keep the
 * tag of sequence 1 until the next chunk's set_data clears that sequence
 * (it does, first thing) or the restore ends (restore() clears it): one
 * pass over the cells less per chunk. */
static int set_chunk(kl_engine *e, const kl_chunk *ch, int first) {
  llama_memory_t mem = llama_get_memory(e->ctx);
  llama_seq_id into = first ? 0 : 1;
  if (llama_state_seq_set_data(e->ctx, e->state + ch->off, ch->info.bytes, into) == 0) return -EIO;
  if (llama_memory_seq_pos_min(mem, into) != (llama_pos)ch->start ||
      llama_memory_seq_pos_max(mem, into) + 1 != (llama_pos)ch->info.n_tokens) {
    llama_memory_seq_rm(mem, into, -1, -1);
    return -EIO; /* not the cells its key says (another chunk size stored it): refused */
  }
  if (ch->keep < ch->info.n_tokens && !llama_memory_seq_rm(mem, into, (llama_pos)ch->keep, -1)) return -EIO;
  if (!first) llama_memory_seq_cp(mem, 1, 0, (llama_pos)ch->start, (llama_pos)ch->keep);
  return 0;
}

/* Hands a chunk that was read to llama.cpp and counts it in the turn.
 * Returns 0, or its read's or its set's error: the chunk is refused (found,
 * but evicted since, damaged, or not the cells its key says) and the
 * chunks before it stay (only sequence 1 was touched). */
static int take_chunk(kl_engine *e, const kl_chunk *ch, int first, kl_turn *turn) {
  double s0 = kl_now();
  int rc = ch->rc ? ch->rc : set_chunk(e, ch, first);
  double set_s = kl_now() - s0;
  turn->set_s += set_s;
  if (rc) {
    turn->refused = 1;
    if (first) kl_clear(e);
    else llama_memory_seq_rm(llama_get_memory(e->ctx), 1, -1, -1);
    return rc;
  }
  turn->chunks++;
  calibrate_chunk(e, ch, set_s);
  if (turn->tier == KVT_TIER_NONE || ch->info.tier > turn->tier) turn->tier = ch->info.tier;
  return 0;
}

/* Restores plan[0..k) into sequence 0: returns the tokens restored (those
 * of the chunks that landed and were set, in order). */
static size_t restore(kl_engine *e, kl_chunk *plan, uint32_t k, const llama_token *t, kl_turn *turn) {
  size_t total = 0;
  for (uint32_t j = 0; j < k; j++) {
    plan[j].off = total;
    total += (plan[j].info.bytes + 4095) & ~(size_t)4095;
  }
  if (state_room(e, total)) return 0;
  if (k == 1) { /* nothing to overlap: read on this thread */
    read_chunk(e, &plan[0], t);
    turn->get_s = plan[0].get_s;
    return take_chunk(e, &plan[0], 1, turn) ? 0 : plan[0].keep;
  }
  if (fetcher_start(e)) return 0;
  kl_fetcher *f = e->fetch;
  pthread_mutex_lock(&f->lock);
  f->plan = plan;
  f->n = k;
  f->next = 0;
  f->stop = 0;
  f->t = t;
  pthread_cond_broadcast(&f->cond);
  size_t have = 0;
  for (uint32_t j = 0; j < k; j++) {
    while (!plan[j].landed && !(f->stop && j >= f->next)) pthread_cond_wait(&f->cond, &f->lock);
    if (!plan[j].landed) { /* not read (the reads stopped) */
      turn->refused = 1;
      break;
    }
    pthread_mutex_unlock(&f->lock);
    int rc = take_chunk(e, &plan[j], j == 0, turn);
    pthread_mutex_lock(&f->lock);
    if (rc) break;
    have = plan[j].keep;
  }
  if (turn->chunks > 1) llama_memory_seq_rm(llama_get_memory(e->ctx), 1, -1, -1);
  f->stop = 1; /* what is not read yet is not wanted */
  while (f->active) pthread_cond_wait(&f->cond, &f->lock);
  for (uint32_t j = 0; j < k; j++)
    if (plan[j].landed) turn->get_s += plan[j].get_s;
  f->n = 0;
  pthread_mutex_unlock(&f->lock);
  if (!have) turn->tier = KVT_TIER_NONE;
  return have;
}

int kl_serve(kl_engine *e, const llama_token *t, size_t n, float *logits, kl_turn *turn) {
  if (n == 0) return -EINVAL;
  double t0 = kl_now();
  memset(turn, 0, sizeof *turn);
  turn->n_tokens = n;
  turn->tier = KVT_TIER_NONE;
  kl_clear(e);
  size_t have = 0, max = n / chunk_len(e) + 2;
  kl_chunk *plan = calloc(max, sizeof *plan);
  if (!plan) return -ENOMEM;
  double cpu0 = kl_cpu_now(), f0 = kl_now();
  uint32_t k = n > 1 ? plan_chunks(e, t, n, plan, (uint32_t)max) : 0;
  turn->find_s = kl_now() - f0;
  if (k) {
    size_t keep = plan[k - 1].keep;
    uint64_t host = 0, disk = 0;
    for (uint32_t j = 0; j < k; j++) *(plan[j].info.tier == KVT_TIER_DISK ? &disk : &host) += plan[j].info.bytes;
    turn->est_recompute_s = kvt_cost_compute_s(&e->desc, &e->hw, 0, n);
    turn->est_restore_s = kvt_cost_transfer_s(&e->hw, host, disk) + kvt_cost_compute_s(&e->desc, &e->hw, keep, n);
    int go = e->opt.force > 0 || (e->opt.force == 0 && turn->est_restore_s < turn->est_recompute_s);
    if (!go) {
      turn->decided_recompute = 1;
    } else {
      have = restore(e, plan, k, t, turn);
    }
  }
  free(plan);
  turn->restore_cpu_s = kl_cpu_now() - cpu0;
  double t1 = kl_now();
  turn->restore_s = t1 - f0;
  int rc = kl_prefill(e, t, have, n, logits);
  turn->prefill_s = kl_now() - t1;
  turn->restored = have;
  turn->computed = n - have;
  turn->ttft_s = kl_now() - t0;
  return rc;
}
