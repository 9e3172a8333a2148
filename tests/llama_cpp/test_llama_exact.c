/* llama.cpp on kvtier, exactness: a conversation restored from kvtier gives
 * the same logits, bit for bit, as an uninterrupted run of the same tokens
 * through the same decode calls (flash attention off, fixed threads:
 * llama.cpp computes a batch of one token by another kernel than a longer
 * batch, so the runs compared split the tokens alike); so does a restored state truncated
 * to a shorter prefix and extended with new tokens, one restored from disk
 * after the engine restarts, one whose stored record was corrupted (it
 * is refused and the conversation recomputed), one that shares a prefix
 * with another conversation's chunks, and one whose chain of chunks has a
 * gap. States go in chunks of 128 tokens here, so every conversation but
 * the shortest is several chunks. Runs on the small random model that
 * scripts/llama-deps.sh writes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "kvt_llama.h"

#define N_CTX 1024

static char disk[4200];
static int disks; /* a file per engine history: a failed test leaves its cache open */

static void options(kl_options *o, uint64_t host_bytes, int reset) {
  kl_options_init(o);
  o->model_path = KVT_LLAMA_MODEL;
  o->threads = 2;
  o->n_ctx = N_CTX;
  if (reset) disks++;
  snprintf(disk, sizeof disk, "%s/llama%d.kvt", kvt_test_tmpdir(), disks);
  o->disk_path = disk;
  o->host_bytes = host_bytes;
  o->disk_bytes = 64ull << 20;
  o->disk_reset = reset;
  o->force = 1; /* restore whenever something is stored: these tests check exactness */
  o->chunk_tokens = 128;
}

static void engine_open(kl_engine *e, uint64_t host_bytes, int reset) {
  kl_options o;
  options(&o, host_bytes, reset);
  assert_int_equal(kl_open(e, &o), 0);
}

/* A second engine, of another chunk size, on a disk file of its own. */
static void engine_open_chunks(kl_engine *e, uint32_t chunk_tokens) {
  kl_options o;
  options(&o, 64ull << 20, 1);
  o.chunk_tokens = chunk_tokens;
  assert_int_equal(kl_open(e, &o), 0);
}

/* A conversation: token ids from a fixed generator, inside the vocabulary. */
static void tokens_of(llama_token *t, size_t n, uint32_t seed, int32_t n_vocab) {
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    t[i] = (llama_token)(3 + (x >> 8) % (uint32_t)(n_vocab - 3));
  }
}

/* The logits of an uninterrupted run of t[0..n) in a cleared context,
 * decoded as t[0..split) then t[split..n). */
static float *reference(kl_engine *e, const llama_token *t, size_t split, size_t n) {
  float *l = malloc((size_t)e->n_vocab * sizeof *l);
  assert_non_null(l);
  kl_clear(e);
  assert_int_equal(kl_prefill(e, t, 0, split, NULL), 0);
  assert_int_equal(kl_prefill(e, t, split, n, l), 0);
  kl_clear(e);
  return l;
}

/* Serves t[0..n), which must restore want_restored tokens from tier, and
 * compares with the uninterrupted run that decodes the same batches. */
static void serve_exact(kl_engine *e, const llama_token *t, size_t n, uint64_t want_restored, uint32_t tier) {
  float *want = reference(e, t, want_restored, n);
  float *got = malloc((size_t)e->n_vocab * sizeof *got);
  assert_non_null(got);
  kl_turn turn;
  assert_int_equal(kl_serve(e, t, n, got, &turn), 0);
  assert_int_equal(turn.restored, want_restored);
  assert_int_equal(turn.computed, n - want_restored);
  if (want_restored) assert_int_equal(turn.tier, tier);
  assert_memory_equal(got, want, (size_t)e->n_vocab * sizeof *got);
  free(want);
  free(got);
}

/* A first turn of t[0..n) (nothing stored for it yet), then parked. */
static void serve_and_park(kl_engine *e, const llama_token *t, size_t n) {
  kl_turn turn;
  assert_int_equal(kl_serve(e, t, n, NULL, &turn), 0);
  assert_int_equal(kl_park(e, t, n), 0);
}

static void restored_logits_are_bit_exact(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 64ull << 20, 1);
  llama_token t[400];
  tokens_of(t, 400, 1, e.n_vocab);
  kl_turn turn;
  assert_int_equal(kl_serve(&e, t, 300, NULL, &turn), 0);
  assert_int_equal(turn.restored, 0);
  assert_int_equal(kl_park(&e, t, 300), 0);
  assert_int_equal(e.chunks_put, 3); /* [0, 128), [128, 256), [256, 300) */
  /* The next turn: all 300 tokens restored, 100 new ones prefilled. */
  serve_exact(&e, t, 400, 300, KVT_TIER_HOST);
  /* The same 300 again: the last one is recomputed for its logits. */
  serve_exact(&e, t, 300, 299, KVT_TIER_HOST);
  kl_close(&e);
}

static void truncated_state_with_a_new_suffix_is_exact(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 64ull << 20, 1);
  llama_token t[400], u[400];
  tokens_of(t, 400, 2, e.n_vocab);
  serve_and_park(&e, t, 200); /* filed under 192 tokens, covers 200 */
  /* Another branch leaves it at token 195: the state is cut to the 192
   * tokens of its key, then 208 new ones follow. */
  tokens_of(u, 400, 3, e.n_vocab);
  memcpy(u, t, 195 * sizeof *u);
  serve_exact(&e, u, 400, 192, KVT_TIER_HOST);
  /* Leaving it at 200: all 200 stored tokens are kept. */
  memcpy(u, t, 200 * sizeof *u);
  serve_exact(&e, u, 400, 200, KVT_TIER_HOST);
  kl_close(&e);
}

static void restore_from_disk_after_a_restart_is_exact(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 0, 1); /* no host tier: objects go straight to disk */
  llama_token t[3][500];
  for (uint32_t c = 0; c < 3; c++) {
    tokens_of(t[c], 500, 10 + c, e.n_vocab);
    serve_and_park(&e, t[c], 320 + 40 * c);
  }
  kl_close(&e); /* the process's engine goes away; the disk file stays */
  engine_open(&e, 0, 0);
  for (uint32_t c = 0; c < 3; c++) serve_exact(&e, t[c], 500, 320 + 40 * c, KVT_TIER_DISK);
  kl_close(&e);
}

/* A restart whose disk tier cannot be opened (its path is a directory
 * now) leaves the engine without a cache: turns recompute, exactly, and
 * parks say so; a later restart on the file again restores from it. */
static void a_failed_restart_serves_by_recomputing(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 0, 1);
  llama_token t[500];
  tokens_of(t, 500, 20, e.n_vocab);
  serve_and_park(&e, t, 300);
  char aside[4300];
  snprintf(aside, sizeof aside, "%s.aside", disk);
  assert_int_equal(rename(disk, aside), 0);
  assert_int_equal(mkdir(disk, 0700), 0);
  assert_true(kl_restart_cache(&e) != 0);
  assert_null(e.cache);
  serve_exact(&e, t, 400, 0, KVT_TIER_NONE);
  assert_int_equal(kl_park(&e, t, 400), KVT_ESTATE);
  kl_clear(&e);
  assert_int_equal(rmdir(disk), 0);
  assert_int_equal(rename(aside, disk), 0);
  assert_int_equal(kl_restart_cache(&e), 0);
  serve_exact(&e, t, 400, 300, KVT_TIER_DISK);
  kl_close(&e);
}

/* Flips a byte every 4 KiB from the first record on: every payload. */
static void corrupt_disk_file(void) {
  int fd = open(disk, O_RDWR);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  for (off_t at = 8192 + 777; at < st.st_size; at += 4096) {
    char b;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x21;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
  }
  fsync(fd);
  close(fd);
}

static void a_corrupted_record_is_refused_and_recomputed_exactly(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 0, 1);
  llama_token t[400];
  tokens_of(t, 400, 20, e.n_vocab);
  serve_and_park(&e, t, 300);
  corrupt_disk_file();
  serve_exact(&e, t, 400, 0, KVT_TIER_NONE);
  kvt_stats st = {.size = sizeof st};
  assert_int_equal(kvt_get_stats(e.cache, &st), 0);
  assert_true(st.checksum_failures >= 1); /* refused by its checksum, not just absent */
  kl_close(&e);
}

/* Conversation B shares A's first 256 tokens: it restores A's first two
 * chunks and computes the rest; parked, it stores only its own chunks. */
static void a_shared_prefix_restores_the_shared_chunks(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 64ull << 20, 1);
  llama_token a[400], b[400];
  tokens_of(a, 400, 30, e.n_vocab);
  tokens_of(b, 400, 31, e.n_vocab);
  memcpy(b, a, 256 * sizeof *b);
  serve_and_park(&e, a, 300);
  assert_int_equal(e.chunks_put, 3);
  serve_exact(&e, b, 350, 256, KVT_TIER_HOST);
  kl_turn again;
  assert_int_equal(kl_serve(&e, b, 350, NULL, &again), 0);
  assert_int_equal(again.chunks, 2);
  assert_int_equal(kl_park(&e, b, 350), 0);
  assert_int_equal(e.chunks_put, 4);  /* b's [256, 350) */
  assert_int_equal(e.chunks_kept, 2); /* [0, 128) and [128, 256) were there */
  serve_exact(&e, b, 400, 350, KVT_TIER_HOST);
  serve_exact(&e, a, 400, 300, KVT_TIER_HOST);
  kl_close(&e);
}

/* A's last chunk, [256, 400), runs past 384, where B (A's 400 tokens and
 * more) has a chunk of its own: restoring B cuts A's chunk at 384 and
 * goes on with B's; restoring A keeps its chunk whole. */
static void a_last_chunk_is_cut_where_a_longer_chain_goes_on(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 64ull << 20, 1);
  llama_token a[700], b[700];
  tokens_of(a, 700, 50, e.n_vocab);
  tokens_of(b, 700, 51, e.n_vocab);
  memcpy(b, a, 400 * sizeof *b);
  kl_turn turn;
  serve_and_park(&e, a, 400);
  assert_int_equal(kl_serve(&e, b, 600, NULL, &turn), 0);
  assert_int_equal(turn.restored, 400);
  assert_int_equal(kl_park(&e, b, 600), 0);
  assert_int_equal(e.chunks_kept, 3); /* A's three: its last serves as B's [256, 384) */
  assert_int_equal(e.chunks_put, 3 + 2); /* B's [384, 512) and [512, 600) */
  serve_exact(&e, b, 700, 600, KVT_TIER_HOST);
  kl_serve(&e, b, 700, NULL, &turn);
  assert_int_equal(turn.chunks, 5);
  serve_exact(&e, a, 500, 400, KVT_TIER_HOST);
  kl_close(&e);
}

/* chunk_tokens 0: each parked conversation is one object, restored whole;
 * a chunk size that is not a multiple of 32 is refused, and so is a park of
 * tokens the context does not hold; a park of the conversation grown within
 * its last 32-token block replaces the shorter state. */
static void chunk_tokens_0_keeps_whole_states(void **s) {
  (void)s;
  kl_engine e;
  kl_options o;
  options(&o, 64ull << 20, 1);
  o.chunk_tokens = 100;
  assert_int_equal(kl_open(&e, &o), -EINVAL);
  kl_close(&e);
  o.chunk_tokens = 0;
  assert_int_equal(kl_open(&e, &o), 0);
  llama_token t[700];
  tokens_of(t, 700, 60, e.n_vocab);
  kl_turn turn;
  assert_int_equal(kl_serve(&e, t, 600, NULL, &turn), 0);
  /* A park of tokens the context does not hold (one not decoded yet) stores nothing. */
  assert_int_equal(kl_store(&e, NULL, t, 601), -EINVAL);
  assert_int_equal(e.chunks_put, 0);
  assert_int_equal(kl_park(&e, t, 600), 0);
  assert_int_equal(e.chunks_put, 1);
  assert_int_equal(kl_park(&e, t, 600), -EINVAL); /* the context is empty now */
  /* The conversation grows within its last 32-token block (600 -> 607,
   * both filed under the key of 576 tokens): parked again, the longer state
   * replaces the shorter under that key. */
  assert_int_equal(kl_serve(&e, t, 607, NULL, &turn), 0);
  assert_int_equal(turn.restored, 600);
  assert_int_equal(kl_park(&e, t, 607), 0);
  assert_int_equal(e.chunks_put, 2);
  serve_exact(&e, t, 700, 607, KVT_TIER_HOST);
  assert_int_equal(kl_serve(&e, t, 700, NULL, &turn), 0);
  assert_int_equal(turn.chunks, 1);
  kl_close(&e);
}

/* Chunks of 128 stored into the cache of an engine that uses 512 (which
 * its namespace keeps apart, unless kl_store is handed that cache): the
 * chunk its plan finds holds other cells than its key says, so it is
 * refused and the conversation computed exactly. */
static void a_chunk_of_another_size_is_refused(void **s) {
  (void)s;
  kl_engine a, b;
  engine_open(&a, 64ull << 20, 1);
  engine_open_chunks(&b, 512);
  llama_token t[700];
  tokens_of(t, 700, 70, a.n_vocab);
  kl_turn turn;
  assert_int_equal(kl_serve(&a, t, 600, NULL, &turn), 0);
  assert_int_equal(kl_store(&a, b.cache, t, 600), 0);
  serve_exact(&b, t, 640, 0, KVT_TIER_NONE);
  kl_close(&a);
  kl_close(&b);
}

/* A later chunk that is refused (under its key, cells of another chunk
 * size: [0, 256) where [128, 256) belongs) ends the restore there: the
 * chunk before it stays, the rest is computed, exactly. */
static void a_refused_later_chunk_keeps_the_chunks_before_it(void **s) {
  (void)s;
  kl_engine a, b;
  engine_open(&a, 64ull << 20, 1);
  engine_open_chunks(&b, 256);
  llama_token t[500];
  tokens_of(t, 500, 75, a.n_vocab);
  serve_and_park(&a, t, 500); /* [0, 128), [128, 256), [256, 384), [384, 500) */
  assert_int_equal(kvt_object_remove(a.cache, (const uint32_t *)t, 256), 0);
  kl_turn turn;
  assert_int_equal(kl_serve(&b, t, 300, NULL, &turn), 0);
  assert_int_equal(kl_store(&b, a.cache, t, 256), 0); /* [0, 256) under the key of 256 */
  serve_exact(&a, t, 500, 128, KVT_TIER_HOST);
  kl_close(&a);
  kl_close(&b);
}

/* A chunk in the middle of the chain gone (removed, as an eviction does):
 * the chunks before it are restored, the rest computed. */
static void a_gap_in_the_chain_restores_up_to_it(void **s) {
  (void)s;
  kl_engine e;
  engine_open(&e, 0, 1);
  llama_token t[500];
  tokens_of(t, 500, 40, e.n_vocab);
  serve_and_park(&e, t, 420);
  assert_int_equal(e.chunks_put, 4); /* 0, 128, 256, then [384, 420) */
  assert_int_equal(kvt_object_remove(e.cache, (const uint32_t *)t, 256), 0);
  serve_exact(&e, t, 500, 128, KVT_TIER_DISK);
  kl_close(&e);
}

int main(void) {
  if (access(KVT_LLAMA_MODEL, R_OK) != 0) kvt_test_skip("the test model %s is missing: run scripts/llama-deps.sh", KVT_LLAMA_MODEL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(restored_logits_are_bit_exact),
      cmocka_unit_test(truncated_state_with_a_new_suffix_is_exact),
      cmocka_unit_test(restore_from_disk_after_a_restart_is_exact),
      cmocka_unit_test(a_failed_restart_serves_by_recomputing),
      cmocka_unit_test(a_corrupted_record_is_refused_and_recomputed_exactly),
      cmocka_unit_test(a_shared_prefix_restores_the_shared_chunks),
      cmocka_unit_test(a_gap_in_the_chain_restores_up_to_it),
      cmocka_unit_test(a_last_chunk_is_cut_where_a_longer_chain_goes_on),
      cmocka_unit_test(chunk_tokens_0_keeps_whole_states),
      cmocka_unit_test(a_chunk_of_another_size_is_refused),
      cmocka_unit_test(a_refused_later_chunk_keeps_the_chunks_before_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
