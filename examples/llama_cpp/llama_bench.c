/* Time to first token for a returning llama.cpp conversation: kvtier's
 * restore (host tier, disk tier, disk after a restart) against recomputing
 * and against llama.cpp's own mechanism (llama_state_seq_save_file /
 * load_file, what its server's slot save/restore calls), per context length;
 * then a multi-conversation run through a host tier that holds a few states.
 *
 *   llama_bench --model M.gguf [--dir D] [--lengths 512,2048,4096,8192]
 *               [--new 32] [--threads 2] [--reps 3] [--convs 8] [--conv-tokens 2048]
 * A returning conversation has `length` tokens stored and `new` tokens more.
 * Every figure is the median of --reps runs, in milliseconds, with its ratio
 * to recomputing measured in the same run. The disk tier and llama.cpp's
 * files are read through the OS's page cache (just written) in both cases.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_llama.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static void tokens_of(llama_token *t, size_t n, uint32_t seed, int32_t n_vocab) {
  uint32_t x = seed * 2654435761u + 99u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    t[i] = (llama_token)(3 + (x >> 8) % (uint32_t)(n_vocab - 3));
  }
}

typedef struct bench {
  kl_options o;
  const char *dir;
  char disk[4096], file[4096];
  int reps;
  size_t fresh;
} bench;

/* kvtier: store the state of t[0..len), then serve t[0..len+fresh). */
static double kvtier_ttft(kl_engine *e, const llama_token *t, size_t len, size_t fresh, uint32_t want_tier) {
  kl_turn tr;
  kl_clear(e);
  if (kl_prefill(e, t, 0, len, NULL) || kl_park(e, t, len) < 0) return -1;
  if (kl_serve(e, t, len + fresh, NULL, &tr) || tr.restored != len || tr.tier != want_tier) {
    fprintf(stderr, "llama_bench: kvtier restored %llu of %zu tokens (tier %u)\n", (unsigned long long)tr.restored,
            len, tr.tier);
    return -1;
  }
  return tr.ttft_s;
}

static int remove_object(kl_engine *e, const llama_token *t, size_t len) {
  return kvt_object_remove(e->cache, (const uint32_t *)t, len);
}

/* llama.cpp's own: the sequence's state saved to a file, loaded back. */
static double llama_file_ttft(kl_engine *e, const char *path, const llama_token *t, size_t len, size_t fresh,
                              llama_token *scratch) {
  kl_clear(e);
  if (kl_prefill(e, t, 0, len, NULL)) return -1;
  if (llama_state_seq_save_file(e->ctx, path, 0, t, len) == 0) return -1;
  kl_clear(e);
  double t0 = kl_now();
  size_t n = 0;
  if (llama_state_seq_load_file(e->ctx, path, 0, scratch, len + fresh, &n) == 0 || n != len) return -1;
  if (kl_prefill(e, t, len, len + fresh, NULL)) return -1;
  return kl_now() - t0;
}

static int per_length(bench *b, const size_t *lengths, int n_len) {
  size_t max = 0;
  for (int i = 0; i < n_len; i++) max = lengths[i] > max ? lengths[i] : max;
  b->o.n_ctx = (uint32_t)(max + b->fresh + 64);
  b->o.host_bytes = 1ull << 30;
  b->o.disk_bytes = 4ull << 30;
  b->o.disk_path = b->disk;
  b->o.disk_reset = 1;
  b->o.force = 1;
  kl_engine host, disk;
  if (kl_open(&host, &b->o)) return -1;
  llama_token *t = malloc((max + b->fresh) * sizeof *t), *scratch = malloc((max + b->fresh) * sizeof *t);
  double *v = malloc((size_t)b->reps * sizeof *v);
  double (*res)[6] = calloc((size_t)n_len, sizeof *res);
  size_t *bytes = calloc((size_t)n_len, sizeof *bytes);
  if (!t || !scratch || !v || !res || !bytes) return -1;
  /* Warm up (first decode allocates its buffers); calibrates the prefill rate. */
  tokens_of(t, 256, 1, host.n_vocab);
  kl_prefill(&host, t, 0, 256, NULL);
  kl_clear(&host);
  for (int i = 0; i < n_len; i++) {
    size_t len = lengths[i];
    tokens_of(t, len + b->fresh, 100 + (uint32_t)i, host.n_vocab);
    for (int r = 0; r < b->reps; r++) { /* recompute */
      kl_clear(&host);
      double t0 = kl_now();
      if (kl_prefill(&host, t, 0, len + b->fresh, NULL)) return -1;
      v[r] = kl_now() - t0;
    }
    res[i][0] = median(v, b->reps);
    kl_clear(&host);
    if (kl_prefill(&host, t, 0, len, NULL)) return -1;
    bytes[i] = llama_state_seq_get_size(host.ctx, 0);
    for (int r = 0; r < b->reps; r++) { /* kvtier, host tier */
      if ((v[r] = kvtier_ttft(&host, t, len, b->fresh, KVT_TIER_HOST)) < 0) return -1;
      remove_object(&host, t, len);
    }
    res[i][1] = median(v, b->reps);
    for (int r = 0; r < b->reps; r++) /* llama.cpp's state file */
      if ((v[r] = llama_file_ttft(&host, b->file, t, len, b->fresh, scratch)) < 0) return -1;
    res[i][4] = median(v, b->reps);
  }
  kl_close(&host);

  /* The disk tier alone (no host tier: the state goes straight to disk),
   * then the same after a restart of the engine. */
  b->o.host_bytes = 0;
  if (kl_open(&disk, &b->o)) return -1;
  for (int i = 0; i < n_len; i++) {
    size_t len = lengths[i];
    tokens_of(t, len + b->fresh, 100 + (uint32_t)i, disk.n_vocab);
    for (int r = 0; r < b->reps; r++) {
      if ((v[r] = kvtier_ttft(&disk, t, len, b->fresh, KVT_TIER_DISK)) < 0) return -1;
      if (r + 1 < b->reps) remove_object(&disk, t, len);
    }
    res[i][2] = median(v, b->reps);
  }
  kl_close(&disk);
  b->o.disk_reset = 0;
  for (int r = 0; r < b->reps; r++) {
    if (kl_open(&disk, &b->o)) return -1;
    for (int i = 0; i < n_len; i++) {
      size_t len = lengths[i];
      kl_turn tr;
      tokens_of(t, len + b->fresh, 100 + (uint32_t)i, disk.n_vocab);
      if (kl_serve(&disk, t, len + b->fresh, NULL, &tr) || tr.restored != len) {
        fprintf(stderr, "llama_bench: nothing restored after the restart at %zu tokens\n", len);
        return -1;
      }
      res[i][3] += tr.ttft_s / b->reps; /* mean over restarts */
    }
    kl_close(&disk);
  }

  printf("\nTTFT of a returning conversation: <length> tokens stored, %zu new (ms; x = speedup over recompute)\n",
         b->fresh);
  printf("%7s %9s %10s %16s %16s %19s %18s\n", "tokens", "state MB", "recompute", "kvtier host", "kvtier disk",
         "kvtier disk+restart", "llama.cpp file");
  for (int i = 0; i < n_len; i++) {
    double rc = res[i][0];
    printf("%7zu %9.1f %10.1f %9.2f (%4.0fx) %9.2f (%4.0fx) %12.2f (%4.0fx) %11.2f (%4.0fx)\n", lengths[i],
           (double)bytes[i] / 1e6, rc * 1e3, res[i][1] * 1e3, rc / res[i][1], res[i][2] * 1e3, rc / res[i][2],
           res[i][3] * 1e3, rc / res[i][3], res[i][4] * 1e3, rc / res[i][4]);
  }
  free(t);
  free(scratch);
  free(v);
  free(res);
  free(bytes);
  return 0;
}

/* Conversations taking turns (the trace shape: a long first prompt, then
 * short user turns) through a host tier that holds about a quarter of them;
 * total TTFT under kvtier (cost model deciding), recomputing everything, and
 * llama.cpp's state files. */
static int conversations(bench *b, int convs, size_t conv_tokens) {
  const int turns = 4;
  const size_t first = conv_tokens / 2, step = (conv_tokens - first) / turns;
  b->o.n_ctx = (uint32_t)(conv_tokens + 64);
  b->o.disk_path = b->disk;
  b->o.disk_reset = 1;
  b->o.force = 0;
  kl_engine e;
  if (kl_open(&e, &b->o)) return -1;
  /* Each conversation's state is about bytes_per_token x tokens. */
  llama_token *t = malloc((size_t)convs * conv_tokens * sizeof *t), *scratch = malloc(conv_tokens * sizeof *t);
  if (!t || !scratch) return -1;
  for (int c = 0; c < convs; c++) tokens_of(t + (size_t)c * conv_tokens, conv_tokens, 500 + (uint32_t)c, e.n_vocab);
  kl_prefill(&e, t, 0, 256, NULL); /* warm up and calibrate */
  kl_clear(&e);
  size_t per_token = 0;
  {
    kl_prefill(&e, t, 0, 64, NULL);
    per_token = llama_state_seq_get_size(e.ctx, 0) / 64;
    kl_clear(&e);
  }
  kl_close(&e);
  b->o.host_bytes = (uint64_t)per_token * conv_tokens * (uint64_t)convs / 4;
  b->o.disk_bytes = (uint64_t)per_token * conv_tokens * (uint64_t)convs * 3;
  const char *mode_name[3] = {"kvtier (cost model)", "recompute", "llama.cpp files"};
  double total[3] = {0};
  uint64_t tiers[3] = {0};
  for (int mode = 0; mode < 3; mode++) {
    b->o.force = mode == 1 ? -1 : 0;
    if (kl_open(&e, &b->o)) return -1;
    for (int r = 0; r <= turns; r++) {
      size_t len = r == 0 ? first : first + (size_t)r * step;
      size_t prev = r == 0 ? 0 : first + (size_t)(r - 1) * step;
      for (int c = 0; c < convs; c++) {
        llama_token *ct = t + (size_t)c * conv_tokens;
        if (mode < 2) {
          kl_turn tr;
          if (kl_serve(&e, ct, len, NULL, &tr)) return -1;
          total[mode] += tr.ttft_s;
          if (mode == 0 && tr.restored) tiers[tr.tier]++;
          if (kl_park(&e, ct, len) < 0) return -1;
        } else {
          char path[4200];
          snprintf(path, sizeof path, "%s/llama_bench_conv%d.state", b->dir, c);
          kl_clear(&e);
          double t0 = kl_now();
          size_t n = 0;
          if (r > 0 && (llama_state_seq_load_file(e.ctx, path, 0, scratch, conv_tokens, &n) == 0 || n != prev))
            return -1;
          if (kl_prefill(&e, ct, n, len, NULL)) return -1;
          total[mode] += kl_now() - t0;
          if (llama_state_seq_save_file(e.ctx, path, 0, ct, len) == 0) return -1;
          kl_clear(&e);
        }
      }
    }
    kl_close(&e);
    b->o.disk_reset = 1;
  }
  for (int c = 0; c < convs; c++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/llama_bench_conv%d.state", b->dir, c);
    remove(path);
  }
  printf("\n%d conversations x %d turns (%zu tokens first, +%zu a turn, up to %zu), host tier %.0f MB "
         "(a quarter of the states), the rest on disk\n",
         convs, turns + 1, first, step, conv_tokens - (conv_tokens - first) % turns, (double)b->o.host_bytes / 1e6);
  printf("kvtier restores: %llu from host, %llu from disk\n", (unsigned long long)tiers[KVT_TIER_HOST],
         (unsigned long long)tiers[KVT_TIER_DISK]);
  for (int mode = 0; mode < 3; mode++)
    printf("%-22s total TTFT %9.1f ms  (%.2fx recompute's)\n", mode_name[mode], total[mode] * 1e3,
           total[mode] / total[1]);
  free(t);
  free(scratch);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines as they come, also into a file */
  bench b;
  memset(&b, 0, sizeof b);
  kl_options_init(&b.o);
  b.dir = "/tmp";
  b.reps = 3;
  b.fresh = 32;
  size_t lengths[16] = {512, 2048, 4096, 8192};
  int n_len = 4, convs = 8;
  size_t conv_tokens = 2048;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc) b.o.model_path = argv[++i];
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) b.dir = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) b.o.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) b.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--new") && i + 1 < argc) b.fresh = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--convs") && i + 1 < argc) convs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--conv-tokens") && i + 1 < argc) conv_tokens = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) {
      n_len = 0;
      for (char *s = argv[++i]; *s && n_len < 16;) {
        lengths[n_len++] = (size_t)strtoul(s, &s, 10);
        if (*s == ',') s++;
      }
    } else {
      fprintf(stderr, "usage: %s --model M.gguf [--dir D] [--lengths 512,2048,...] [--new N] [--threads N] "
                      "[--reps N] [--convs N] [--conv-tokens N]\n", argv[0]);
      return 2;
    }
  }
  for (int i = 0; i < n_len; i++)
    if (lengths[i] < 64) n_len = 0;
  if (!b.o.model_path || b.reps < 1 || b.fresh < 1 || n_len < 1 || convs < 1 || conv_tokens < 256) {
    fprintf(stderr, "%s: --model is required; lengths >= 64, --conv-tokens >= 256\n", argv[0]);
    return 2;
  }
  snprintf(b.disk, sizeof b.disk, "%s/llama_bench.kvt", b.dir);
  snprintf(b.file, sizeof b.file, "%s/llama_bench.state", b.dir);
  printf("llama_bench: %s, %d threads, flash attention off\n", b.o.model_path, b.o.threads);
  int rc = per_length(&b, lengths, n_len);
  if (rc == 0 && convs > 0) rc = conversations(&b, convs, conv_tokens);
  remove(b.file);
  remove(b.disk);
  if (rc) fprintf(stderr, "llama_bench: failed\n");
  return rc ? 1 : 0;
}
