/* A serving loop over llama.cpp's C API with kvtier under it.
 *
 * Several conversations take turns on one llama.cpp context. Each turn adds
 * a user message to a conversation, restores the conversation from the
 * longest prefix kvtier holds (or recomputes it, as the cost model decides),
 * prefills the rest, generates a few tokens greedily, and parks the
 * conversation back in kvtier. The host tier holds only a few states, so
 * older ones spill to disk and both tiers serve. Then the engine is closed
 * and opened again, as after a process restart, and every conversation
 * takes one more turn: those on disk come back from it. Every third
 * conversation's user answers at once (a second turn right after the
 * first), so its state is still in the host tier.
 *
 *   llama_serving --model M.gguf [--dir D] [--convs 6] [--turns 3]
 *                 [--threads 2] [--quiet]
 * Exits 1 when the tiers did not both serve, or nothing came back after the
 * restart. (Exactness against uninterrupted runs: tests/llama_cpp.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_llama.h"

#define MAX_TOKENS 2048
#define FIRST_TOKENS 160
#define USER_TOKENS 48
#define GEN_TOKENS 4

typedef struct conv {
  llama_token t[MAX_TOKENS];
  size_t n;
  uint32_t seed;
} conv;

static int quiet;
static uint64_t served[3], recomputed, refused;

static void user_message(conv *c, int32_t n_vocab, size_t len) {
  for (size_t i = 0; i < len && c->n < MAX_TOKENS; i++) {
    c->seed = c->seed * 1664525u + 1013904223u;
    c->t[c->n++] = (llama_token)(3 + (c->seed >> 8) % (uint32_t)(n_vocab - 3));
  }
}

static int argmax(const float *l, int32_t n) {
  int best = 0;
  for (int32_t i = 1; i < n; i++)
    if (l[i] > l[best]) best = i;
  return best;
}

static int turn(kl_engine *e, conv *c, int id, float *logits) {
  user_message(c, e->n_vocab, c->n ? USER_TOKENS : FIRST_TOKENS);
  kl_turn tr;
  if (kl_serve(e, c->t, c->n, logits, &tr)) return -1;
  if (tr.restored) served[tr.tier]++;
  if (tr.decided_recompute) recomputed++;
  refused += (uint64_t)tr.refused;
  if (!quiet)
    printf("conv %d: %5zu tokens, %5llu restored (%s), %5llu computed, TTFT %7.2f ms%s\n", id, c->n,
           (unsigned long long)tr.restored,
           tr.restored ? (tr.tier == KVT_TIER_DISK ? "disk" : "host") : "-",
           (unsigned long long)tr.computed, tr.ttft_s * 1e3,
           tr.decided_recompute ? " (cost model: recompute)" : "");
  /* Generation: greedy tokens, each one decoded after the last. */
  for (int g = 0; g < GEN_TOKENS && c->n < MAX_TOKENS; g++) {
    c->t[c->n] = argmax(logits, e->n_vocab);
    c->n++;
    if (kl_prefill(e, c->t, c->n - 1, c->n, logits)) return -1;
  }
  int rc = kl_park(e, c->t, c->n);
  return rc < 0 ? rc : 0;
}

int main(int argc, char **argv) {
  kl_options o;
  kl_options_init(&o);
  const char *dir = "/tmp";
  int convs = 6, turns = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc) o.model_path = argv[++i];
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--convs") && i + 1 < argc) convs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--turns") && i + 1 < argc) turns = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quiet")) quiet = 1;
    else {
      fprintf(stderr, "usage: %s --model M.gguf [--dir D] [--convs N] [--turns N] [--threads N] [--quiet]\n",
              argv[0]);
      return 2;
    }
  }
  if (!o.model_path || convs < 2 || convs > 64 || turns < 1) {
    fprintf(stderr, "%s: --model is required; --convs 2..64, --turns >= 1\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/llama_serving.kvt", dir);
  o.disk_path = path;
  o.n_ctx = MAX_TOKENS;
  o.host_bytes = 2u << 20; /* room for one or two states: the rest spills to disk */
  o.disk_bytes = 256u << 20;
  o.disk_reset = 1;
  kl_engine e;
  if (kl_open(&e, &o)) return 1;
  conv *cv = calloc((size_t)convs, sizeof *cv);
  float *logits = malloc((size_t)e.n_vocab * sizeof *logits);
  if (!cv || !logits) return 1;
  for (int i = 0; i < convs; i++) cv[i].seed = 7u + (uint32_t)i;
  int rc = 0;
  for (int r = 0; r < turns && !rc; r++)
    for (int i = 0; i < convs && !rc; i++) {
      rc = turn(&e, &cv[i], i, logits);
      if (!rc && i % 3 == 0) rc = turn(&e, &cv[i], i, logits);
    }
  uint64_t before_host = served[KVT_TIER_HOST], before_disk = served[KVT_TIER_DISK];

  /* A restart: everything in RAM is gone, the disk tier stays. */
  kl_close(&e);
  if (!quiet) printf("-- engine restarted --\n");
  o.disk_reset = 0;
  if (!rc && kl_open(&e, &o)) return 1;
  for (int i = 0; i < convs && !rc; i++) rc = turn(&e, &cv[i], i, logits);
  uint64_t after_disk = served[KVT_TIER_DISK] - before_disk;
  printf("llama_serving: %d conversations x %d turns, then a restart: restored from host %llu, from disk %llu "
         "(%llu after the restart), recomputed by the cost model's choice %llu, refused %llu\n",
         convs, turns, (unsigned long long)before_host, (unsigned long long)before_disk,
         (unsigned long long)after_disk, (unsigned long long)recomputed, (unsigned long long)refused);
  kl_close(&e);
  free(cv);
  free(logits);
  if (rc) return 1;
  if (!before_host || !before_disk || !after_disk) {
    fprintf(stderr, "llama_serving: expected restores from both tiers and from disk after the restart\n");
    return 1;
  }
  return 0;
}
