/* The whole cache on a GPU: owner mode with the engine's KV pool in device
 * memory (cudaMalloc) offloads conversations to the pinned host pool and to
 * disk and restores them byte for byte, layer by layer, also after a
 * restart, also when requests follow a prefetch and each other;
 * KVT_DEVICE_AUTO picks the CUDA backend; storage mode moves
 * blocks whose pieces lie in registered device memory through the host and
 * disk tiers and back, byte for byte.
 *
 * Without the CUDA toolkit, or without a device, it exits 77 (skipped):
 * test_badargs and test_engine check the "no device" answers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kvtier/kvtier.h"

#ifndef KVT_HAVE_CUDA
int main(void) { kvt_test_skip("no CUDA device: kvtier was built without the CUDA toolkit"); }
#else

#include <cuda_runtime_api.h>

int kvt__check_invariants(kvt_cache *c, char *msg, size_t len); /* src/engine/check.c */

#define CK(call) assert_int_equal((int)(call), 0)

#define BT 16
#define LAYERS 4
#define SEG (16u * 1024u) /* one K or V segment of one block: 16 KiB */
#define SLOTS 32
#define HOST 16
#define DISK 128
#define CONVS 6
#define NBLK 8 /* blocks per conversation */

static char disk_path[4200];

/* Each test its own file: one that failed with its cache open keeps its lock. */
static void use_disk_file(const char *name) {
  snprintf(disk_path, sizeof disk_path, "%s/%s.kvt", kvt_test_tmpdir(), name);
}

typedef struct gfix {
  kvt_cache *c;
  unsigned char *pool[LAYERS]; /* (2, SLOTS, SEG) per layer: vLLM's layout */
  kvt_segment seg[LAYERS * 2];
  unsigned char *shadow; /* one segment, on the host */
  cudaStream_t stream;   /* the "compute" stream that writes the KV */
} gfix;

static kvt_config gconfig(kvt_device_kind dev, int reset) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "cuda-engine-test";
  cfg.block_tokens = BT;
  cfg.device = dev;
  cfg.host_blocks = HOST;
  cfg.disk_path = disk_path;
  cfg.disk_blocks = DISK;
  cfg.disk_reset = reset;
  cfg.max_job_blocks = 64;
  return cfg;
}

static void gfix_register(gfix *f, kvt_device_kind dev, int reset) {
  kvt_config cfg = gconfig(dev, reset);
  CK(kvt_open(&cfg, &f->c));
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = LAYERS;
  lay.segments_per_layer = 2;
  lay.num_slots = SLOTS;
  lay.segments = f->seg;
  int rc = kvt_register_layout(f->c, &lay);
  if (rc != 0) print_error("kvt_register_layout: %s (%s)\n", kvt_strerror(rc), kvt_error_detail(f->c));
  CK(rc);
  assert_string_equal(kvt_device_backend_name(f->c), "cuda");
}

static void gfix_open(gfix *f, kvt_device_kind dev) {
  memset(f, 0, sizeof *f);
  for (int l = 0; l < LAYERS; l++) {
    CK(cudaMalloc((void **)&f->pool[l], (size_t)2 * SLOTS * SEG));
    CK(cudaMemset(f->pool[l], 0xA5, (size_t)2 * SLOTS * SEG));
    for (int s = 0; s < 2; s++) f->seg[l * 2 + s] = (kvt_segment){f->pool[l] + (size_t)s * SLOTS * SEG, SEG, SEG};
  }
  f->shadow = malloc(SEG);
  assert_non_null(f->shadow);
  CK(cudaStreamCreateWithFlags(&f->stream, cudaStreamNonBlocking));
  gfix_register(f, dev, 1);
}

static void gfix_close_cache(gfix *f) {
  char why[160] = "";
  CK(kvt_drain(f->c));
  if (kvt__check_invariants(f->c, why, sizeof why) != 0) print_error("tier map invariant: %s\n", why);
  assert_string_equal(why, "");
  kvt_close(f->c);
  f->c = NULL;
}

static void gfix_close(gfix *f) {
  if (f->c) gfix_close_cache(f);
  for (int l = 0; l < LAYERS; l++) cudaFree(f->pool[l]);
  cudaStreamDestroy(f->stream);
  free(f->shadow);
}

static uint64_t seed_of(uint32_t conv, uint32_t block, int piece) {
  return ((uint64_t)conv << 24 | (uint64_t)block << 8 | (uint64_t)piece) * 0x9e3779b97f4a7c15ull + 1;
}

static unsigned char *piece_at(gfix *f, uint32_t slot, int piece) {
  return f->pool[piece / 2] + (size_t)(piece % 2) * SLOTS * SEG + (size_t)slot * SEG;
}

/* "Prefill": the KV of block `block` of `conv` into device slot `slot`,
 * written on the compute stream (kvt_commit is told about it). */
static void write_block(gfix *f, uint32_t slot, uint32_t conv, uint32_t block) {
  for (int p = 0; p < LAYERS * 2; p++) {
    kvt_test_fill(f->shadow, SEG, seed_of(conv, block, p));
    CK(cudaMemcpyAsync(piece_at(f, slot, p), f->shadow, SEG, cudaMemcpyHostToDevice, f->stream));
    CK(cudaStreamSynchronize(f->stream)); /* the shadow is reused */
  }
}

static int check_piece(gfix *f, uint32_t slot, uint32_t conv, uint32_t block, int p) {
  CK(cudaMemcpy(f->shadow, piece_at(f, slot, p), SEG, cudaMemcpyDeviceToHost));
  return kvt_test_check(f->shadow, SEG, seed_of(conv, block, p));
}

static int check_block(gfix *f, uint32_t slot, uint32_t conv, uint32_t block) {
  for (int p = 0; p < LAYERS * 2; p++)
    if (!check_piece(f, slot, conv, block, p)) return 0;
  return 1;
}

static void conv_keys(gfix *f, uint32_t conv, kvt_key *keys, uint32_t *tok) {
  for (uint32_t i = 0; i < NBLK * BT; i++) tok[i] = conv * 7919u + i * 3u + 11u;
  size_t nk = 0;
  CK(kvt_hash_tokens(f->c, NULL, tok, NBLK * BT, keys, NBLK, &nk));
  assert_int_equal(nk, NBLK);
}

/* One request: restores what is cached (checking every restored byte on
 * the device, layer by layer when asked), computes the rest, commits all.
 * Returns the blocks restored. */
static uint32_t run_conv(gfix *f, uint32_t conv, int by_layer) {
  kvt_key keys[NBLK];
  uint32_t tok[NBLK * BT], slots[NBLK], ready = 0;
  conv_keys(f, conv, keys, tok);
  kvt_req r;
  kvt_acquire_info info = {.size = sizeof info};
  int rc = kvt_acquire(f->c, keys, tok, NBLK, NBLK, 0, 0, &r, slots, &info);
  assert_true(rc == 0 || rc == 1);
  if (by_layer) {
    /* Layer l of every restored block is exact once its wait returns,
     * whatever the later layers are doing. */
    for (uint32_t l = 0; l < LAYERS; l++) {
      CK(kvt_request_wait_layer(f->c, r, l, NULL));
      for (uint32_t i = 0; i < info.n_restore; i++) {
        assert_true(check_piece(f, slots[i], conv, i, (int)(2 * l)));
        assert_true(check_piece(f, slots[i], conv, i, (int)(2 * l + 1)));
      }
    }
  }
  CK(kvt_request_wait(f->c, r, -1, &ready));
  assert_true(ready <= info.n_restore);
  for (uint32_t i = 0; i < ready; i++) assert_true(check_block(f, slots[i], conv, i));
  for (uint32_t i = ready; i < NBLK; i++) write_block(f, slots[i], conv, i);
  CK(kvt_commit(f->c, r, NBLK, f->stream));
  CK(kvt_release(f->c, r));
  return ready;
}

static void offload(gfix *f, uint32_t conv) {
  kvt_key keys[NBLK];
  uint32_t tok[NBLK * BT];
  conv_keys(f, conv, keys, tok);
  kvt_job j;
  int rc = kvt_store(f->c, keys, NBLK, KVT_STORE_EVICT, &j);
  assert_true(rc == 0 || rc == 1);
  if (rc == 1) {
    CK(kvt_job_wait(f->c, j, -1));
    CK(kvt_job_release(f->c, j));
  }
}

static kvt_lookup_result lookup(gfix *f, uint32_t conv) {
  kvt_key keys[NBLK];
  uint32_t tok[NBLK * BT];
  conv_keys(f, conv, keys, tok);
  kvt_lookup_result res = {.size = sizeof res};
  CK(kvt_lookup(f->c, keys, NBLK, &res, NULL));
  return res;
}

static void scribble(gfix *f) {
  for (int l = 0; l < LAYERS; l++) CK(cudaMemset(f->pool[l], 0x5A, (size_t)2 * SLOTS * SEG));
  CK(cudaDeviceSynchronize());
}

/* Six conversations of 8 blocks through 32 device slots, 16 host slots and
 * a disk: each is computed, offloaded, and brought back exact from
 * whichever tier kept it; then the cache is closed and reopened, and what
 * the disk kept comes back exact again. */
static void owner_mode_offloads_and_restores_exact(void **state) {
  (void)state;
  gfix f;
  use_disk_file("owner");
  gfix_open(&f, KVT_DEVICE_CUDA);
  kvt_stats st = {.size = sizeof st};
  CK(kvt_get_stats(f.c, &st));
  if (!st.host_pool_pinned) print_message("note: the host pool is not pinned on this machine\n");
  for (uint32_t c = 0; c < CONVS; c++) assert_int_equal(run_conv(&f, c, 0), 0);
  for (uint32_t c = 0; c < CONVS; c++) offload(&f, c); /* 48 blocks: 16 stay in the host, the rest spill */
  CK(kvt_drain(f.c));
  uint32_t on_disk = 0, on_host = 0;
  for (uint32_t c = 0; c < CONVS; c++) {
    kvt_lookup_result r = lookup(&f, c);
    assert_int_equal(r.n_prefix, NBLK);
    assert_int_equal(r.n_device, 0);
    on_disk += r.n_disk;
    on_host += r.n_host;
  }
  assert_true(on_disk > 0 && on_host > 0);
  scribble(&f); /* only the host and the disk can answer now */
  /* Newest first: the last offloaded are still in the host tier, the
   * first went on to disk (a disk restore stages through host slots and
   * pushes host blocks down, so the other order would find none there). */
  for (uint32_t c = CONVS; c-- > 0;) {
    assert_int_equal(run_conv(&f, c, c % 2), NBLK);
    offload(&f, c); /* room for the next conversation's restore */
  }
  CK(kvt_get_stats(f.c, &st));
  assert_true(st.hits_host > 0);
  assert_true(st.hits_disk > 0);
  assert_int_equal(st.copy_errors, 0);
  assert_int_equal(st.io_errors, 0);
  assert_int_equal(st.checksum_failures, 0);
  /* Restart: what the disk holds survives; write-back leaves the host's
   * blocks that never spilled behind, which are recomputed. */
  gfix_close_cache(&f);
  scribble(&f);
  gfix_register(&f, KVT_DEVICE_CUDA, 0);
  uint32_t restored = 0;
  for (uint32_t c = 0; c < CONVS; c++) {
    uint32_t expect = lookup(&f, c).n_prefix;
    assert_int_equal(run_conv(&f, c, 1), expect);
    restored += expect;
  }
  assert_true(restored > 0);
  gfix_close(&f);
}

/* Restores that follow another job's copy, on the GPU: a conversation on
 * disk is prefetched, and two requests acquire it while the prefetch
 * reads (the first follows the prefetch's fetches, the second copies into
 * private slots of its own or shares the first's finished copies). Both
 * get every byte; after release nothing is left pinned (the invariants are
 * checked at close). */
static void requests_following_a_prefetch_and_each_other(void **state) {
  (void)state;
  gfix f;
  use_disk_file("follow");
  gfix_open(&f, KVT_DEVICE_CUDA);
  for (uint32_t c = 0; c < CONVS; c++) assert_int_equal(run_conv(&f, c, 0), 0);
  for (uint32_t c = 0; c < CONVS; c++) offload(&f, c);
  CK(kvt_drain(f.c));
  kvt_lookup_result lr = lookup(&f, 0);
  assert_int_equal(lr.n_prefix, NBLK);
  assert_true(lr.n_disk > 0); /* the oldest went on to disk */
  scribble(&f);
  kvt_key keys[NBLK];
  uint32_t tok[NBLK * BT], sa[NBLK], sb[NBLK], ra_ready = 0, rb_ready = 0;
  conv_keys(&f, 0, keys, tok);
  kvt_job pj = 0;
  int prc = kvt_prefetch(f.c, keys, NBLK, &pj);
  assert_true(prc == 0 || prc == 1 || prc == KVT_EAGAIN);
  kvt_req ra, rb;
  int rc = kvt_acquire(f.c, keys, tok, NBLK, NBLK, 0, 0, &ra, sa, NULL);
  assert_true(rc == 0 || rc == 1);
  rc = kvt_acquire(f.c, keys, tok, NBLK, NBLK, 0, 0, &rb, sb, NULL);
  assert_true(rc == 0 || rc == 1);
  CK(kvt_request_wait(f.c, ra, -1, &ra_ready));
  CK(kvt_request_wait(f.c, rb, -1, &rb_ready));
  assert_int_equal(ra_ready, NBLK);
  assert_int_equal(rb_ready, NBLK);
  for (uint32_t i = 0; i < NBLK; i++) {
    assert_true(check_block(&f, sa[i], 0, i));
    assert_true(check_block(&f, sb[i], 0, i));
  }
  CK(kvt_commit(f.c, ra, NBLK, f.stream));
  CK(kvt_commit(f.c, rb, NBLK, f.stream));
  CK(kvt_release(f.c, rb));
  CK(kvt_release(f.c, ra));
  if (prc == 1) {
    CK(kvt_job_wait(f.c, pj, -1));
    CK(kvt_job_release(f.c, pj));
  }
  kvt_stats st = {.size = sizeof st};
  CK(kvt_get_stats(f.c, &st));
  assert_int_equal(st.copy_errors, 0);
  assert_int_equal(st.io_errors, 0);
  gfix_close(&f);
}

/* With a GPU present, KVT_DEVICE_AUTO is the CUDA backend, and device hits
 * are shared without a copy. */
static void auto_uses_the_gpu(void **state) {
  (void)state;
  gfix f;
  use_disk_file("auto");
  gfix_open(&f, KVT_DEVICE_AUTO);
  assert_int_equal(run_conv(&f, 1, 0), 0);
  assert_int_equal(run_conv(&f, 1, 0), NBLK); /* device hits */
  kvt_stats st = {.size = sizeof st};
  CK(kvt_get_stats(f.c, &st));
  assert_int_equal(st.hits_device, NBLK);
  assert_int_equal(st.blocks_h2d, 0);
  gfix_close(&f);
}

/* Storage mode: the engine's blocks live in device memory it allocated and
 * registered (KVT_MEM_DEVICE); put-from and get-into move them through the
 * host pool and the disk (host_blocks 4 < 12 blocks, so most spill; with
 * host_blocks 0 they go straight to disk). */
#define SNB 12
static void storage_round_trip(uint32_t host_blocks) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  use_disk_file(host_blocks ? "storage-host" : "storage-disk");
  cfg.model_fingerprint = "cuda-storage-test";
  cfg.block_tokens = BT;
  cfg.host_blocks = host_blocks;
  cfg.disk_path = disk_path;
  cfg.disk_blocks = 64;
  cfg.disk_reset = 1;
  kvt_cache *c = NULL;
  CK(kvt_open(&cfg, &c));
  kvt_segment seg[LAYERS * 2];
  for (int i = 0; i < LAYERS * 2; i++) seg[i] = (kvt_segment){NULL, 0, SEG};
  kvt_layout lay;
  kvt_layout_init(&lay);
  lay.num_layers = LAYERS;
  lay.segments_per_layer = 2;
  lay.segments = seg;
  lay.flags = KVT_LAYOUT_STORAGE;
  CK(kvt_register_layout(c, &lay));
  const size_t bb = (size_t)LAYERS * 2 * SEG;
  assert_int_equal(kvt_block_bytes(c), bb);

  unsigned char *src = NULL, *dst = NULL, *shadow = malloc(bb);
  assert_non_null(shadow);
  CK(cudaMalloc((void **)&src, SNB * bb));
  CK(cudaMalloc((void **)&dst, SNB * bb));
  CK(cudaMemset(dst, 0x5A, SNB * bb));
  kvt_region rs = 0, rd = 0;
  CK(kvt_register_memory(c, src, SNB * bb, KVT_MEM_DEVICE, &rs));
  CK(kvt_register_memory(c, dst, SNB * bb, KVT_MEM_DEVICE, &rd));
  for (uint32_t b = 0; b < SNB; b++) {
    kvt_test_fill(shadow, bb, 0xC0DA0000u + b);
    CK(cudaMemcpy(src + b * bb, shadow, bb, cudaMemcpyHostToDevice));
  }
  uint32_t tok[SNB * BT];
  for (uint32_t i = 0; i < SNB * BT; i++) tok[i] = 500 + i;
  kvt_key keys[SNB];
  size_t nk = 0;
  CK(kvt_hash_tokens(c, NULL, tok, SNB * BT, keys, SNB, &nk));
  /* Pieces: K and V of each layer, in the region, in the layout's order
   * (a block's pieces are its bytes in order; here a block is contiguous
   * in its region but split as an engine's per-layer tensors would be). */
  kvt_piece put_p[SNB * LAYERS * 2], get_p[SNB * LAYERS * 2];
  for (uint32_t b = 0; b < SNB; b++)
    for (uint32_t p = 0; p < LAYERS * 2; p++) {
      put_p[b * LAYERS * 2 + p] = (kvt_piece){.region = rs, .offset = b * bb + (uint64_t)p * SEG, .len = SEG};
      get_p[b * LAYERS * 2 + p] = (kvt_piece){.region = rd, .offset = b * bb + (uint64_t)p * SEG, .len = SEG};
    }
  kvt_batch bt;
  kvt_batch_init(&bt);
  bt.n_blocks = SNB;
  bt.keys = keys;
  bt.tokens = tok;
  bt.pieces = put_p;
  bt.pieces_per_block = LAYERS * 2;
  kvt_job job;
  int32_t res[SNB];
  uint32_t n_ok = 0;
  assert_int_equal(kvt_put_from(c, &bt, &job), 1);
  CK(kvt_storage_wait(c, job, -1));
  CK(kvt_storage_results(c, job, res, SNB, &n_ok));
  assert_int_equal(n_ok, SNB);
  CK(kvt_storage_release(c, job));
  CK(kvt_drain(c));
  kvt_lookup_result lr = {.size = sizeof lr};
  CK(kvt_exists(c, NULL, keys, SNB, 0, &lr, NULL));
  assert_int_equal(lr.n_prefix, SNB);
  assert_true(lr.n_disk > 0);

  bt.pieces = get_p;
  assert_int_equal(kvt_get_into(c, &bt, &job), 1);
  CK(kvt_storage_wait(c, job, -1));
  CK(kvt_storage_results(c, job, res, SNB, &n_ok));
  assert_int_equal(n_ok, SNB);
  CK(kvt_storage_release(c, job));
  for (uint32_t b = 0; b < SNB; b++) {
    CK(cudaMemcpy(shadow, dst + b * bb, bb, cudaMemcpyDeviceToHost));
    assert_true(kvt_test_check(shadow, bb, 0xC0DA0000u + b));
  }
  CK(kvt_unregister_memory(c, rs));
  CK(kvt_unregister_memory(c, rd));
  kvt_close(c);
  cudaFree(src);
  cudaFree(dst);
  free(shadow);
}

static void storage_mode_device_pieces_through_host_and_disk(void **state) {
  (void)state;
  storage_round_trip(4);
}

static void storage_mode_device_pieces_straight_to_disk(void **state) {
  (void)state;
  storage_round_trip(0);
}

int main(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    kvt_test_skip("no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(owner_mode_offloads_and_restores_exact),
      cmocka_unit_test(requests_following_a_prefetch_and_each_other),
      cmocka_unit_test(auto_uses_the_gpu),
      cmocka_unit_test(storage_mode_device_pieces_through_host_and_disk),
      cmocka_unit_test(storage_mode_device_pieces_straight_to_disk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
