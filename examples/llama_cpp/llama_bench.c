/* Time to first token for a returning llama.cpp conversation: kvtier's
 * restore (host tier, disk tier, disk tier after a restart) against
 * recomputing and against llama.cpp's own mechanism
 * (llama_state_seq_save_file / load_file, what its server's slot
 * save/restore calls), per context length; then conversations taking turns
 * through a host tier that holds a quarter of their states.
 *
 *   llama_bench --model M.gguf [--dir D] [--lengths 512,2048,4096,8192]
 *               [--new 32] [--threads 2] [--rounds 15] [--reps 3]
 *               [--convs 8] [--conv-tokens 2048] [--chunk 0]
 *
 * A returning conversation has `length` tokens stored and `new` more. Every
 * mode restores the same cells (kvtier holds them whole, or in chunks of
 * --chunk tokens, kl_store; llama.cpp's file holds them whole, saved from
 * the same context) and prefills the same new tokens.
 * The modes run interleaved, in a rotating order, for --rounds rounds
 * (recomputing, which takes seconds, in the first --reps of them); each
 * figure is a median. The time to first token is mostly the new tokens'
 * prefill, the same work in every mode, so on a loaded machine its noise
 * hides the restores: they are also reported on their own, in wall time and
 * in process CPU time (every thread's: kvtier's workers and disk threads
 * included), which the load disturbs far less. kvtier's restore is the
 * wall time from its first kvt_object_find to its last set_data; its steps
 * column sums the finds, the reads and the set_data of its chunks (in
 * chunks, the reads run on kvt_llama's reading threads, two disk reads in
 * flight, and overlap set_data, so the steps add up to more than it).
 *
 * Page cache, stated: kvtier's disk tier reads with O_DIRECT, so it always
 * reads the device. llama.cpp's file is read twice per round: once just
 * written (in the OS's page cache, the counterpart of kvtier's host tier)
 * and once after fdatasync + POSIX_FADV_DONTNEED have dropped it (from the
 * device, the counterpart of kvtier's disk tier).
 *
 * The last column, "device reads/KiB", is what the block device under
 * --dir completed during the restore (medians; from its /sys stat file, so
 * other jobs' I/O on that device counts too): the number of read requests
 * after the kernel merged them, and KiB read. It shows that the cold file
 * really is read from the device (all its bytes, every round), and how
 * each side's reads reach it: the file in a few large requests of the
 * kernel's read-ahead, kvtier in its parts' records (512 KiB and a 4 KiB
 * prefix each, their meta pages making 1.6 to 2.2% more bytes than the state;
 * the last part read only up to the state's last page), merged when
 * adjacent.
 *
 * Why kvtier's disk tier once lost to the cold file, and by how much it
 * varied: on the virtual disk this bench ran on, an O_DIRECT read costs
 * per segment of the memory it lands in, one per physical page: reads
 * into 4 KiB pages ran at 1x to 2x the time of the same reads into
 * transparent huge pages, and the factor changed from one run to the next
 * (the page cache's large folios, which the file's reads land in, are few
 * segments). kvt_llama's state buffer is now in huge pages (MADV_HUGEPAGE),
 * as the disk tier's own staging records were already.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "kvt_llama.h"

enum { M_RECOMPUTE, M_HOST, M_DISK, M_RESTART, M_FILE_WARM, M_FILE_COLD, N_MODES };
static const char *mode_names[N_MODES] = {"recompute",          "kvtier host",     "kvtier disk",
                                          "kvtier disk+restart", "llama file warm", "llama file cold"};

typedef struct sample {
  double ttft, restore, cpu; /* seconds: first token, restore alone (wall), restore's process CPU */
  double find, get, set;     /* kvtier: the restore's steps (wall) */
  double ios, kib;           /* the device's reads during the restore, and KiB read */
} sample;

/* The block device under --dir: its /sys stat file (reads completed, sectors read). */
static char dev_stat_path[128];

static void dev_stat_find(const char *dir) {
  struct stat st;
  if (stat(dir, &st) == 0)
    snprintf(dev_stat_path, sizeof dev_stat_path, "/sys/dev/block/%u:%u/stat", major(st.st_dev), minor(st.st_dev));
}

static void dev_reads(double *ios, double *sectors) {
  unsigned long long v[3] = {0};
  FILE *f = dev_stat_path[0] ? fopen(dev_stat_path, "r") : NULL;
  if (f) {
    if (fscanf(f, "%llu %llu %llu", &v[0], &v[1], &v[2]) != 3) v[0] = v[2] = 0;
    fclose(f);
  }
  *ios = (double)v[0];
  *sectors = (double)v[2];
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void tokens_of(llama_token *t, size_t n, uint32_t seed, int32_t n_vocab) {
  uint32_t x = seed * 2654435761u + 99u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    t[i] = (llama_token)(3 + (x >> 8) % (uint32_t)(n_vocab - 3));
  }
}

static double load_avg(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

/* The file's pages out of the OS's page cache (written back first). */
static void drop_cached(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

/* A saved file's writes, finished (outside the timed turn): else the
 * kernel writes it back while the next mode's turn runs. */
static void sync_file(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  close(fd);
}

typedef struct bench {
  kl_options o;
  const char *dir;
  char disk_h[4096], disk_d[4096], file[4096];
  int rounds, reps;
  size_t fresh;
} bench;

/* One kvtier turn: the state of t[0..len) restored from want_tier, then
 * the new tokens prefilled. */
static int kvtier_sample(kl_engine *e, const llama_token *t, size_t len, size_t fresh, uint32_t want, sample *s) {
  kl_turn tr;
  double i0, s0, i1, s1;
  kl_clear(e);
  dev_reads(&i0, &s0);
  int rc = kl_serve(e, t, len + fresh, NULL, &tr);
  dev_reads(&i1, &s1);
  if (rc || tr.restored != len || tr.tier != want) {
    fprintf(stderr, "llama_bench: kvtier restored %llu of %zu tokens (tier %u, wanted %u)\n",
            (unsigned long long)tr.restored, len, tr.tier, want);
    return -1;
  }
  *s = (sample){tr.ttft_s, tr.restore_s, tr.restore_cpu_s, tr.find_s, tr.get_s, tr.set_s, i1 - i0, (s1 - s0) / 2};
  return 0;
}

/* llama.cpp's own: the sequence's state loaded from its file. */
static int file_sample(kl_engine *e, const char *path, const llama_token *t, size_t len, size_t fresh,
                       llama_token *scratch, sample *s) {
  kl_clear(e);
  double i0, s0, i1, s1;
  dev_reads(&i0, &s0);
  double t0 = kl_now(), c0 = kl_cpu_now();
  size_t n = 0;
  if (llama_state_seq_load_file(e->ctx, path, 0, scratch, len + fresh, &n) == 0 || n != len) return -1;
  double t1 = kl_now(), c1 = kl_cpu_now();
  dev_reads(&i1, &s1);
  if (kl_prefill(e, t, len, len + fresh, NULL)) return -1;
  *s = (sample){kl_now() - t0, t1 - t0, c1 - c0, 0, 0, 0, i1 - i0, (s1 - s0) / 2};
  return 0;
}

static int recompute_sample(kl_engine *e, const llama_token *t, size_t n, sample *s) {
  kl_clear(e);
  double t0 = kl_now();
  if (kl_prefill(e, t, 0, n, NULL)) return -1;
  *s = (sample){kl_now() - t0, 0, 0, 0, 0, 0, 0, 0};
  return 0;
}

/* The state of t[0..len) into both caches (in chunks, kl_store) and
 * llama.cpp's file (whole): the same cells. */
static int store_state(bench *b, kl_engine *h, kl_engine *d, const llama_token *t, size_t len, size_t *bytes) {
  kl_clear(h);
  if (kl_prefill(h, t, 0, len, NULL)) return -1;
  if (llama_state_seq_save_file(h->ctx, b->file, 0, t, len) == 0) return -1;
  *bytes = llama_state_seq_get_size(h->ctx, 0);
  int rc = kl_store(h, h->cache, t, len) || kl_store(h, d->cache, t, len);
  kvt_drain(h->cache);
  kvt_drain(d->cache);
  kl_clear(h);
  return rc ? -1 : 0;
}

static int run_mode(bench *b, int m, kl_engine *h, kl_engine *d, const llama_token *t, size_t len,
                    llama_token *scratch, sample *s) {
  switch (m) {
  case M_RECOMPUTE: return recompute_sample(h, t, len + b->fresh, s);
  case M_HOST: return kvtier_sample(h, t, len, b->fresh, KVT_TIER_HOST, s);
  case M_DISK: return kvtier_sample(d, t, len, b->fresh, KVT_TIER_DISK, s);
  case M_RESTART:
    if (kl_restart_cache(d)) return -1;
    return kvtier_sample(d, t, len, b->fresh, KVT_TIER_DISK, s);
  case M_FILE_WARM: return file_sample(h, b->file, t, len, b->fresh, scratch, s);
  default: drop_cached(b->file); return file_sample(h, b->file, t, len, b->fresh, scratch, s);
  }
}

static void print_length(bench *b, size_t len, size_t bytes, sample (*v)[64], const int *n) {
  double med[N_MODES][8];
  for (int m = 0; m < N_MODES; m++) {
    double x[8][64];
    for (int i = 0; i < n[m]; i++) {
      const sample *s = &v[m][i];
      x[0][i] = s->ttft, x[1][i] = s->restore, x[2][i] = s->cpu, x[3][i] = s->find, x[4][i] = s->get, x[5][i] = s->set;
      x[6][i] = s->ios, x[7][i] = s->kib;
    }
    for (int k = 0; k < 8; k++) med[m][k] = median(x[k], n[m]);
  }
  printf("\n%zu tokens stored + %zu new; state %.2f MB; medians of %d rounds (recompute: %d), load average now %.1f\n",
         len, b->fresh, (double)bytes / 1e6, n[M_HOST], n[M_RECOMPUTE], load_avg());
  printf("  %-20s %11s %9s %14s %14s %22s %16s\n", "mode", "TTFT ms", "speedup", "restore ms", "restore CPU ms",
         "find / get / set ms", "device reads/KiB");
  for (int m = 0; m < N_MODES; m++) {
    char speed[32] = "-", steps[64] = "";
    if (n[M_RECOMPUTE] && m != M_RECOMPUTE) snprintf(speed, sizeof speed, "%.0fx", med[0][0] / med[m][0]);
    if (m == M_HOST || m == M_DISK || m == M_RESTART)
      snprintf(steps, sizeof steps, "%.2f / %.2f / %.2f", med[m][3] * 1e3, med[m][4] * 1e3, med[m][5] * 1e3);
    if (m == M_RECOMPUTE) {
      if (n[m]) printf("  %-20s %11.1f %9s %14s %14s\n", mode_names[m], med[m][0] * 1e3, "1x", "-", "-");
    } else {
      char dev[40];
      snprintf(dev, sizeof dev, "%.0f / %.0f", med[m][6], med[m][7]);
      printf("  %-20s %11.1f %9s %14.2f %14.2f %22s %16s\n", mode_names[m], med[m][0] * 1e3, speed, med[m][1] * 1e3,
             med[m][2] * 1e3, steps, dev);
    }
  }
  printf("  kvtier / llama.cpp file, restore (wall, CPU): host/warm %.2f, %.2f; disk/cold %.2f, %.2f; "
         "disk+restart/cold %.2f, %.2f\n",
         med[M_HOST][1] / med[M_FILE_WARM][1], med[M_HOST][2] / med[M_FILE_WARM][2],
         med[M_DISK][1] / med[M_FILE_COLD][1], med[M_DISK][2] / med[M_FILE_COLD][2],
         med[M_RESTART][1] / med[M_FILE_COLD][1], med[M_RESTART][2] / med[M_FILE_COLD][2]);
}

static int per_length(bench *b, const size_t *lengths, int n_len) {
  size_t max = 0;
  for (int i = 0; i < n_len; i++) max = lengths[i] > max ? lengths[i] : max;
  b->o.n_ctx = (uint32_t)(max + b->fresh + 64);
  b->o.disk_bytes = 4ull << 30;
  b->o.disk_reset = 1;
  b->o.force = 1;
  kl_engine h, d; /* a host tier over a disk tier; a disk tier alone */
  b->o.host_bytes = 1ull << 30;
  b->o.disk_path = b->disk_h;
  if (kl_open(&h, &b->o)) return -1;
  b->o.host_bytes = 0;
  b->o.disk_path = b->disk_d;
  if (kl_open(&d, &b->o)) return -1;
  llama_token *t = malloc((max + b->fresh) * sizeof *t), *scratch = malloc((max + b->fresh) * sizeof *t);
  sample(*v)[64] = calloc(N_MODES, sizeof *v);
  if (!t || !scratch || !v) return -1;
  /* Warm up (the first decodes allocate their buffers). */
  tokens_of(t, 256, 1, h.n_vocab);
  kl_prefill(&h, t, 0, 256, NULL);
  kl_prefill(&d, t, 0, 256, NULL);
  printf("\nTTFT of a returning conversation (ms; speedup over recomputing in the same rounds). Restore: "
         "kvtier's finds, then its reads overlapped with set_data; llama.cpp's load_file (its read + set_data)\n");
  for (int i = 0; i < n_len; i++) {
    size_t len = lengths[i], bytes = 0;
    tokens_of(t, len + b->fresh, 100 + (uint32_t)i, h.n_vocab);
    if (store_state(b, &h, &d, t, len, &bytes)) return -1;
    int n[N_MODES] = {0};
    for (int r = 0; r < b->rounds; r++) {
      for (int k = 0; k < N_MODES; k++) {
        int m = (k + r) % N_MODES;
        if (m == M_RECOMPUTE && r >= b->reps) continue;
        sample s;
        if (run_mode(b, m, &h, &d, t, len, scratch, &s)) {
          fprintf(stderr, "llama_bench: %s failed at %zu tokens\n", mode_names[m], len);
          return -1;
        }
        v[m][n[m]++] = s;
      }
      fprintf(stderr, "\r%zu tokens: round %d/%d", len, r + 1, b->rounds);
    }
    fprintf(stderr, "\n");
    print_length(b, len, bytes, v, n);
  }
  kl_close(&h);
  kl_close(&d);
  free(t);
  free(scratch);
  free(v);
  return 0;
}

/* Conversations taking turns (the trace shape: a long first prompt, then
 * short user turns) through a host tier that holds a quarter of their
 * states, the rest on disk; total TTFT under kvtier (the cost model
 * deciding), recomputing everything, and llama.cpp's state files (read
 * from the page cache, or from the device). The modes take each turn one
 * after another, on the same context, so the machine's load falls on all. */
enum { C_KVTIER, C_RECOMPUTE, C_FILE_WARM, C_FILE_COLD, N_CMODES };
static const char *cmode_names[N_CMODES] = {"kvtier (cost model)", "recompute", "llama file warm",
                                            "llama file cold"};

static int file_turn(bench *b, kl_engine *e, int mode, int c, const llama_token *ct, size_t prev, size_t len,
                     llama_token *scratch, size_t cap, double *ttft) {
  char path[4200];
  snprintf(path, sizeof path, "%s/llama_bench_conv%d_%d.state", b->dir, c, mode);
  if (prev && mode == C_FILE_COLD) drop_cached(path);
  kl_clear(e);
  double t0 = kl_now();
  size_t n = 0;
  if (prev && (llama_state_seq_load_file(e->ctx, path, 0, scratch, cap, &n) == 0 || n != prev)) return -1;
  if (kl_prefill(e, ct, n, len, NULL)) return -1;
  *ttft = kl_now() - t0;
  if (llama_state_seq_save_file(e->ctx, path, 0, ct, len) == 0) return -1;
  sync_file(path);
  kl_clear(e);
  return 0;
}

static int conversations(bench *b, int convs, size_t conv_tokens) {
  const int turns = 4;
  const size_t first = conv_tokens / 2, step = (conv_tokens - first) / turns;
  b->o.n_ctx = (uint32_t)(conv_tokens + 64);
  b->o.disk_path = b->disk_h;
  b->o.disk_reset = 1;
  b->o.force = 0;
  b->o.host_bytes = 64ull << 20;
  kl_engine e;
  if (kl_open(&e, &b->o)) return -1;
  llama_token *t = malloc((size_t)convs * conv_tokens * sizeof *t), *scratch = malloc(conv_tokens * sizeof *t);
  if (!t || !scratch) return -1;
  for (int c = 0; c < convs; c++) tokens_of(t + (size_t)c * conv_tokens, conv_tokens, 500 + (uint32_t)c, e.n_vocab);
  kl_prefill(&e, t, 0, 64, NULL);
  size_t per_token = llama_state_seq_get_size(e.ctx, 0) / 64;
  kl_prefill(&e, t, 64, 256, NULL); /* warm up and calibrate */
  kl_clear(&e);
  kl_close(&e);
  b->o.host_bytes = (uint64_t)per_token * conv_tokens * (uint64_t)convs / 4;
  b->o.disk_bytes = (uint64_t)per_token * conv_tokens * (uint64_t)convs * 3;
  if (kl_open(&e, &b->o)) return -1;
  double total[N_CMODES] = {0};
  uint64_t tiers[3] = {0}, recomputed = 0;
  for (int r = 0; r <= turns; r++) {
    size_t len = r == 0 ? first : first + (size_t)r * step;
    size_t prev = r == 0 ? 0 : first + (size_t)(r - 1) * step;
    for (int c = 0; c < convs; c++) {
      const llama_token *ct = t + (size_t)c * conv_tokens;
      for (int k = 0; k < N_CMODES; k++) {
        int m = (k + c + r) % N_CMODES;
        double s = 0;
        if (m == C_KVTIER) {
          kl_turn tr;
          if (kl_serve(&e, ct, len, NULL, &tr)) return -1;
          s = tr.ttft_s;
          if (tr.restored) tiers[tr.tier]++;
          recomputed += (uint64_t)tr.decided_recompute;
          if (kl_park(&e, ct, len) < 0) return -1;
          kvt_drain(e.cache); /* its write-through spill, as llama.cpp's file is synced */
        } else if (m == C_RECOMPUTE) {
          kl_clear(&e);
          double t0 = kl_now();
          if (kl_prefill(&e, ct, 0, len, NULL)) return -1;
          s = kl_now() - t0;
          kl_clear(&e);
        } else if (file_turn(b, &e, m, c, ct, prev, len, scratch, conv_tokens, &s)) {
          return -1;
        }
        total[m] += s;
      }
    }
    fprintf(stderr, "\rconversations: turn %d/%d", r + 1, turns + 1);
  }
  fprintf(stderr, "\n");
  kl_close(&e);
  for (int c = 0; c < convs; c++)
    for (int m = C_FILE_WARM; m <= C_FILE_COLD; m++) {
      char path[4200];
      snprintf(path, sizeof path, "%s/llama_bench_conv%d_%d.state", b->dir, c, m);
      remove(path);
    }
  printf("\n%d conversations x %d turns (%zu tokens first, +%zu a turn), kvtier's host tier %.0f MB (a quarter of "
         "the states), the rest on disk; modes interleaved turn by turn, each one's writes finished before the next "
         "turn; load average now %.1f\n",
         convs, turns + 1, first, step, (double)b->o.host_bytes / 1e6, load_avg());
  printf("kvtier restores: %llu from host, %llu from disk; %llu recomputed by the cost model's choice\n",
         (unsigned long long)tiers[KVT_TIER_HOST], (unsigned long long)tiers[KVT_TIER_DISK],
         (unsigned long long)recomputed);
  for (int m = 0; m < N_CMODES; m++)
    printf("  %-20s total TTFT %9.1f ms  (%.2fx recompute's)\n", cmode_names[m], total[m] * 1e3,
           total[m] / total[C_RECOMPUTE]);
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
  b.rounds = 15;
  b.reps = 3;
  b.fresh = 32;
  size_t lengths[16] = {512, 2048, 4096, 8192};
  int n_len = 4, convs = 8;
  size_t conv_tokens = 2048;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc) b.o.model_path = argv[++i];
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) b.dir = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) b.o.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) b.rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) b.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--new") && i + 1 < argc) b.fresh = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--convs") && i + 1 < argc) convs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) b.o.chunk_tokens = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--conv-tokens") && i + 1 < argc) conv_tokens = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) {
      n_len = 0;
      for (char *s = argv[++i]; *s && n_len < 16;) {
        lengths[n_len++] = (size_t)strtoul(s, &s, 10);
        if (*s == ',') s++;
      }
    } else {
      fprintf(stderr, "usage: %s --model M.gguf [--dir D] [--lengths 512,2048,...] [--new N] [--threads N] "
                      "[--rounds N] [--reps N (0: no recompute)] [--convs N (0: none)] [--conv-tokens N] [--chunk N]\n", argv[0]);
      return 2;
    }
  }
  for (int i = 0; i < n_len; i++)
    if (lengths[i] < 64) n_len = 0;
  if (!b.o.model_path || b.rounds < 1 || b.rounds > 64 || b.reps < 0 || b.fresh < 1 || n_len < 1 || convs < 0 ||
      conv_tokens < 256) {
    fprintf(stderr, "%s: --model is required; lengths >= 64, 1 <= --rounds <= 64, --conv-tokens >= 256\n", argv[0]);
    return 2;
  }
  dev_stat_find(b.dir);
  snprintf(b.disk_h, sizeof b.disk_h, "%s/llama_bench_h.kvt", b.dir);
  snprintf(b.disk_d, sizeof b.disk_d, "%s/llama_bench_d.kvt", b.dir);
  snprintf(b.file, sizeof b.file, "%s/llama_bench.state", b.dir);
  printf("llama_bench: %s, %d threads, flash attention off, load average %.1f\n", b.o.model_path, b.o.threads,
         load_avg());
  int rc = per_length(&b, lengths, n_len);
  if (rc == 0 && convs > 0) rc = conversations(&b, convs, conv_tokens);
  remove(b.file);
  remove(b.disk_h);
  remove(b.disk_d);
  if (rc) fprintf(stderr, "llama_bench: failed\n");
  return rc ? 1 : 0;
}
