/* Coalescing of scattered block copies (src/dev/coalesce.c): for the layouts
 * engines use, the runs move exactly the bytes a piece-by-piece copy would,
 * every byte once, with the merges each layout allows and the per-layer
 * grouping loads rely on. "Device" memory is RAM here; the logic is pure. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dev/coalesce.h"
#include "helpers.h"

#define MAX_SEGS 64

/* A layout over one RAM arena standing in for device memory, plus host
 * payloads inside one buffer at `host_pitch` apart (gaps in between). */
typedef struct fixture {
  kvt_layout lay;
  kvt_segment segs[MAX_SEGS];
  unsigned char *arena;
  size_t arena_bytes;
  unsigned char *host;
  size_t host_pitch, block_bytes;
  uint32_t n;
  uint32_t slots[64];
  void *hosts[64];
} fixture;

static void fixture_blocks(fixture *f, uint32_t n, const uint32_t *slots, size_t host_pitch) {
  f->block_bytes = 0;
  for (uint32_t j = 0; j < f->lay.num_layers * f->lay.segments_per_layer; j++)
    f->block_bytes += f->segs[j].bytes;
  f->n = n;
  f->host_pitch = host_pitch ? host_pitch : f->block_bytes + 4096;
  f->host = calloc(n ? n : 1, f->host_pitch);
  assert_non_null(f->host);
  for (uint32_t i = 0; i < n; i++) {
    f->slots[i] = slots[i];
    f->hosts[i] = f->host + (size_t)i * f->host_pitch;
  }
}

static void fixture_arena(fixture *f, uint32_t layers, uint32_t spl, uint32_t num_slots,
                          size_t arena_bytes) {
  memset(f, 0, sizeof *f);
  kvt_layout_init(&f->lay);
  f->lay.num_layers = layers;
  f->lay.segments_per_layer = spl;
  f->lay.num_slots = num_slots;
  f->lay.segments = f->segs;
  f->arena_bytes = arena_bytes;
  f->arena = calloc(1, arena_bytes);
  assert_non_null(f->arena);
}

static void fixture_free(fixture *f) {
  free(f->arena);
  free(f->host);
}

/* vLLM FlashAttention: per layer (2, slots, bytes): K and V are the halves. */
static void layout_vllm_flash(fixture *f, uint32_t layers, uint32_t num_slots, size_t bytes) {
  fixture_arena(f, layers, 2, num_slots, (size_t)layers * 2 * num_slots * bytes);
  for (uint32_t l = 0; l < layers; l++)
    for (uint32_t s = 0; s < 2; s++)
      f->segs[l * 2 + s] = (kvt_segment){f->arena + ((size_t)l * 2 + s) * num_slots * bytes, bytes, bytes};
}

/* FlashInfer: per layer (slots, 2, bytes): K and V of a slot are adjacent. */
static void layout_flashinfer(fixture *f, uint32_t layers, uint32_t num_slots, size_t bytes) {
  fixture_arena(f, layers, 2, num_slots, (size_t)layers * num_slots * 2 * bytes);
  for (uint32_t l = 0; l < layers; l++) {
    unsigned char *pool = f->arena + (size_t)l * num_slots * 2 * bytes;
    f->segs[l * 2] = (kvt_segment){pool, 2 * bytes, bytes};
    f->segs[l * 2 + 1] = (kvt_segment){pool + bytes, 2 * bytes, bytes};
  }
}

/* vLLM cross-layer blocks (slots, layers, 2, bytes), described per layer. */
static void layout_cross_layer(fixture *f, uint32_t layers, uint32_t num_slots, size_t bytes) {
  size_t slot_bytes = (size_t)layers * 2 * bytes;
  fixture_arena(f, layers, 2, num_slots, num_slots * slot_bytes);
  for (uint32_t j = 0; j < layers * 2; j++)
    f->segs[j] = (kvt_segment){f->arena + j * bytes, slot_bytes, bytes};
}

/* MLA: one latent segment per layer, per-layer pools. */
static void layout_mla(fixture *f, uint32_t layers, uint32_t num_slots, size_t bytes) {
  fixture_arena(f, layers, 1, num_slots, (size_t)layers * num_slots * bytes);
  for (uint32_t l = 0; l < layers; l++)
    f->segs[l] = (kvt_segment){f->arena + (size_t)l * num_slots * bytes, bytes, bytes};
}

static kvt__coalesce_args args_of(fixture *f, int dir, int order) {
  kvt__coalesce_args a = {.layout = &f->lay, .dir = dir, .order = order, .n_blocks = f->n,
                          .dev_slots = f->slots, .host_blocks = f->hosts};
  return a;
}

static size_t host_side(const kvt__copy_run *r, int dir, const unsigned char **p) {
  *p = dir == KVT_XFER_D2H ? r->dst : r->src;
  return r->bytes;
}

static size_t dev_side(const kvt__copy_run *r, int dir, const unsigned char **p) {
  *p = dir == KVT_XFER_D2H ? r->src : r->dst;
  return r->bytes;
}

/* Every run lies in the arena / host buffer, and the bytes it covers are
 * exactly the blocks' pieces (device) and payloads (host), each once. */
static void check_coverage(fixture *f, int dir, const kvt__copy_run *runs, size_t n_runs) {
  unsigned char *dev_count = calloc(1, f->arena_bytes);
  unsigned char *host_count = calloc(f->n ? f->n : 1, f->host_pitch);
  assert_non_null(dev_count);
  assert_non_null(host_count);
  size_t total = 0;
  for (size_t r = 0; r < n_runs; r++) {
    const unsigned char *d, *h;
    size_t len = dev_side(&runs[r], dir, &d);
    host_side(&runs[r], dir, &h);
    assert_true(len > 0);
    assert_true(d >= f->arena && d + len <= f->arena + f->arena_bytes);
    assert_true(h >= f->host && h + len <= f->host + (size_t)f->n * f->host_pitch);
    for (size_t b = 0; b < len; b++) {
      dev_count[d - f->arena + b]++;
      host_count[h - f->host + b]++;
    }
    total += len;
  }
  assert_int_equal(total, (size_t)f->n * f->block_bytes);
  for (size_t b = 0; b < (size_t)f->n * f->host_pitch; b++)
    assert_int_equal(host_count[b], (b % f->host_pitch) < f->block_bytes ? 1 : 0);
  /* Device: unmark each piece once; what remains must be all zero. */
  for (uint32_t i = 0; i < f->n; i++)
    for (uint32_t j = 0; j < f->lay.num_layers * f->lay.segments_per_layer; j++) {
      size_t off = (size_t)((unsigned char *)f->segs[j].base - f->arena) + f->slots[i] * f->segs[j].stride;
      for (size_t b = 0; b < f->segs[j].bytes; b++) {
        assert_int_equal(dev_count[off + b], 1);
        dev_count[off + b] = 0;
      }
    }
  for (size_t b = 0; b < f->arena_bytes; b++) assert_int_equal(dev_count[b], 0);
  free(dev_count);
  free(host_count);
}

/* Executes the runs with memcpy and compares with a piece-by-piece copy. */
static void check_data(fixture *f, int dir, const kvt__copy_run *runs, size_t n_runs) {
  size_t host_bytes = (size_t)f->n * f->host_pitch;
  kvt_test_fill(f->arena, f->arena_bytes, 11);
  kvt_test_fill(f->host, host_bytes, 12);
  unsigned char *want_dev = malloc(f->arena_bytes), *want_host = malloc(host_bytes ? host_bytes : 1);
  assert_non_null(want_dev);
  assert_non_null(want_host);
  memcpy(want_dev, f->arena, f->arena_bytes);
  memcpy(want_host, f->host, host_bytes);
  for (uint32_t i = 0; i < f->n; i++) {
    size_t hoff = (size_t)i * f->host_pitch;
    for (uint32_t j = 0; j < f->lay.num_layers * f->lay.segments_per_layer; j++) {
      size_t doff = (size_t)((unsigned char *)f->segs[j].base - f->arena) + f->slots[i] * f->segs[j].stride;
      if (dir == KVT_XFER_D2H) memcpy(want_host + hoff, f->arena + doff, f->segs[j].bytes);
      else memcpy(want_dev + doff, f->host + hoff, f->segs[j].bytes);
      hoff += f->segs[j].bytes;
    }
  }
  for (size_t r = 0; r < n_runs; r++) memcpy(runs[r].dst, runs[r].src, runs[r].bytes);
  assert_memory_equal(f->arena, want_dev, f->arena_bytes);
  assert_memory_equal(f->host, want_host, host_bytes);
  free(want_dev);
  free(want_host);
}

/* Runs of layer l are runs[layer_end[l-1], layer_end[l]), and nothing else. */
static void check_layer_groups(fixture *f, const kvt__copy_run *runs, size_t n_runs,
                               const uint32_t *layer_end) {
  uint32_t start = 0;
  for (uint32_t l = 0; l < f->lay.num_layers; l++) {
    assert_true(layer_end[l] >= start);
    for (uint32_t r = start; r < layer_end[l]; r++) assert_int_equal(runs[r].layer, l);
    start = layer_end[l];
  }
  assert_int_equal(start, n_runs);
}

/* Coalesces, checks everything, returns the run count. */
static size_t coalesce_checked(fixture *f, int dir, int order) {
  size_t max = kvt__coalesce_max_runs(&f->lay, f->n);
  kvt__copy_run *runs = calloc(max ? max : 1, sizeof *runs);
  uint32_t layer_end[MAX_SEGS];
  size_t n_runs = 0;
  kvt__coalesce_args a = args_of(f, dir, order);
  assert_int_equal(kvt__coalesce(&a, runs, max, &n_runs, layer_end), 0);
  check_coverage(f, dir, runs, n_runs);
  check_data(f, dir, runs, n_runs);
  if (order == KVT__ORDER_BY_LAYER) check_layer_groups(f, runs, n_runs, layer_end);
  for (uint32_t l = 0; order == KVT__ORDER_BY_BLOCK && l < f->lay.num_layers; l++)
    assert_int_equal(layer_end[l], n_runs);
  free(runs);
  return n_runs;
}

static const uint32_t scattered[8] = {13, 2, 7, 30, 3, 21, 0, 31};

static void vllm_flash_layout_never_merges_k_with_v(void **state) {
  fixture f;
  layout_vllm_flash(&f, 4, 32, 512);
  fixture_blocks(&f, 8, scattered, 0);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 8 * 4 * 2);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK), 8 * 4 * 2);
  assert_int_equal(kvt__coalesce_runs_per_block(&f.lay, KVT__ORDER_BY_LAYER), 8);
  fixture_free(&f);
}

static void flashinfer_layout_merges_k_and_v_of_a_slot(void **state) {
  fixture f;
  layout_flashinfer(&f, 4, 32, 512);
  fixture_blocks(&f, 8, scattered, 0);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 8 * 4);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK), 8 * 4);
  assert_int_equal(kvt__coalesce_runs_per_block(&f.lay, KVT__ORDER_BY_LAYER), 4);
  fixture_free(&f);
}

static void cross_layer_block_is_one_run_when_stored(void **state) {
  fixture f;
  layout_cross_layer(&f, 4, 32, 512);
  fixture_blocks(&f, 8, scattered, 0);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK), 8);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_BLOCK), 8);
  /* Loads keep layers apart so each can be signalled. */
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 8 * 4);
  assert_int_equal(kvt__coalesce_runs_per_block(&f.lay, KVT__ORDER_BY_BLOCK), 1);
  assert_int_equal(kvt__coalesce_runs_per_block(&f.lay, KVT__ORDER_BY_LAYER), 4);
  fixture_free(&f);
}

static void consecutive_slots_merge_when_host_is_consecutive(void **state) {
  fixture f;
  layout_cross_layer(&f, 3, 16, 256);
  const uint32_t slots[6] = {4, 5, 6, 10, 11, 1};
  fixture_blocks(&f, 6, slots, 3 * 2 * 256); /* payloads back to back */
  /* 4-5-6 and 10-11 merge, 1 stands alone. */
  assert_int_equal(coalesce_checked(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK), 3);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_BLOCK), 3);
  fixture_free(&f);

  layout_mla(&f, 1, 16, 1024); /* one layer, one segment: SGLang-like pages */
  fixture_blocks(&f, 6, slots, 1024);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 3);
  fixture_free(&f);

  layout_mla(&f, 1, 16, 1024);
  fixture_blocks(&f, 6, slots, 0); /* host gaps: nothing merges */
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 6);
  fixture_free(&f);
}

static void mla_one_segment_per_layer(void **state) {
  fixture f;
  layout_mla(&f, 5, 32, 768);
  fixture_blocks(&f, 8, scattered, 0);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 8 * 5);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK), 8 * 5);
  fixture_free(&f);
}

static void load_groups_runs_by_layer_in_order(void **state) {
  fixture f;
  layout_flashinfer(&f, 6, 32, 256);
  fixture_blocks(&f, 8, scattered, 0);
  kvt__copy_run runs[6 * 8];
  uint32_t layer_end[6];
  size_t n = 0;
  kvt__coalesce_args a = args_of(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER);
  assert_int_equal(kvt__coalesce(&a, runs, 48, &n, layer_end), 0);
  assert_int_equal(n, 48);
  for (uint32_t l = 0; l < 6; l++) {
    assert_int_equal(layer_end[l], 8 * (l + 1));
    /* Within a layer, blocks in the order given; each run lands in that layer's pool. */
    for (uint32_t i = 0; i < 8; i++) {
      const kvt__copy_run *r = &runs[l * 8 + i];
      assert_ptr_equal(r->dst, (unsigned char *)f.segs[l * 2].base + f.slots[i] * f.segs[l * 2].stride);
      assert_int_equal(r->bytes, 512);
    }
  }
  fixture_free(&f);
}

/* Copies window by window, then checks the result against a piece-by-piece
 * copy of the whole transfer. Returns the total run count. */
static size_t coalesce_windows(fixture *f, int dir, int order, uint32_t width) {
  size_t max = kvt__coalesce_max_runs(&f->lay, f->n), total = 0;
  kvt__copy_run *runs = calloc(max ? max : 1, sizeof *runs);
  assert_non_null(runs);
  for (uint32_t first = 0; first < f->lay.num_layers; first += width) {
    uint32_t left = f->lay.num_layers - first;
    uint32_t layer_end[MAX_SEGS], n = left < width ? left : width;
    size_t k = 0;
    kvt__coalesce_args a = args_of(f, dir, order);
    a.first_layer = first;
    a.n_layers = n;
    assert_int_equal(kvt__coalesce(&a, runs + total, max - total, &k, layer_end), 0);
    for (uint32_t l = 0; l < f->lay.num_layers; l++) /* the window's runs, and only its */
      assert_int_equal(layer_end[l], l < first ? 0 : l >= first + n - 1 ? k : layer_end[l]);
    for (size_t r = total; r < total + k; r++) {
      assert_true(runs[r].layer >= first);
      assert_true(runs[r].layer < first + n);
    }
    total += k;
  }
  check_coverage(f, dir, runs, total);
  check_data(f, dir, runs, total);
  free(runs);
  return total;
}

static void layer_windows_merge_a_slots_layers_in_block_order(void **state) {
  fixture f;
  layout_cross_layer(&f, 5, 32, 512);
  fixture_blocks(&f, 8, scattered, 0);
  /* Windows [0,2) [2,4) [4,5): one run per block and window. */
  assert_int_equal(coalesce_windows(&f, KVT_XFER_H2D, KVT__ORDER_BY_BLOCK, 2), 8 * 3);
  assert_int_equal(coalesce_windows(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK, 2), 8 * 3);
  assert_int_equal(coalesce_windows(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER, 2), 8 * 5);
  kvt__copy_run runs[8];
  size_t n = 0;
  kvt__coalesce_args a = args_of(&f, KVT_XFER_H2D, KVT__ORDER_BY_BLOCK);
  a.first_layer = 2;
  a.n_layers = 2;
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), 0);
  assert_int_equal(n, 8);
  for (uint32_t i = 0; i < 8; i++) { /* block i's layers 2 and 3, block by block */
    assert_ptr_equal(runs[i].dst, (unsigned char *)f.segs[4].base + f.slots[i] * f.segs[4].stride);
    assert_ptr_equal(runs[i].src, (unsigned char *)f.hosts[i] + 2 * 2 * 512);
    assert_int_equal(runs[i].bytes, 2 * 2 * 512);
    assert_int_equal(runs[i].layer, 2);
  }
  kvt__coalesce_iter it;
  uint32_t done = 99;
  a.n_layers = 0; /* from layer 2 to the end */
  assert_int_equal(kvt__coalesce_begin(&it, &a), 0);
  assert_int_equal(kvt__coalesce_next(&it, runs, 8, &done), 8);
  assert_int_equal(done, 5);
  assert_int_equal(runs[0].bytes, 3 * 2 * 512);
  a.first_layer = 5; /* outside the layout */
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), -EINVAL);
  a.first_layer = 4;
  a.n_layers = 2;
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), -EINVAL);
  fixture_free(&f);

  /* Per-layer pools and per-layer K,V: windows change the order, never the bytes. */
  layout_vllm_flash(&f, 5, 32, 256);
  fixture_blocks(&f, 8, scattered, 0);
  assert_int_equal(coalesce_windows(&f, KVT_XFER_H2D, KVT__ORDER_BY_BLOCK, 3), 8 * 5 * 2);
  fixture_free(&f);
  layout_flashinfer(&f, 4, 32, 200);
  fixture_blocks(&f, 8, scattered, 0);
  assert_int_equal(coalesce_windows(&f, KVT_XFER_D2H, KVT__ORDER_BY_BLOCK, 3), 8 * 4);
  fixture_free(&f);
}

static void small_buffer_iteration_matches_one_shot(void **state) {
  fixture f;
  layout_flashinfer(&f, 5, 32, 300);
  fixture_blocks(&f, 8, scattered, 0);
  for (int order = 0; order < 2; order++) {
    kvt__copy_run all[40], part[3];
    size_t n_all = 0, n_iter = 0;
    kvt__coalesce_args a = args_of(&f, KVT_XFER_D2H, order);
    assert_int_equal(kvt__coalesce(&a, all, 40, &n_all, NULL), 0);
    kvt__coalesce_iter it;
    assert_int_equal(kvt__coalesce_begin(&it, &a), 0);
    uint32_t done = 0, prev_done = 0;
    size_t k;
    while ((k = kvt__coalesce_next(&it, part, 3, &done)) > 0) {
      assert_true(k <= 3);
      assert_true(done >= prev_done);
      for (size_t r = 0; r < k; r++) {
        assert_ptr_equal(part[r].dst, all[n_iter + r].dst);
        assert_int_equal(part[r].bytes, all[n_iter + r].bytes);
        /* BY_LAYER: one call never mixes layers, and no run comes after its
         * layer was reported done. */
        if (order == KVT__ORDER_BY_LAYER) {
          assert_int_equal(part[r].layer, part[0].layer);
          assert_true(part[r].layer <= done);
          assert_true(part[r].layer >= prev_done);
        }
      }
      n_iter += k;
      prev_done = done;
    }
    assert_int_equal(n_iter, n_all);
    assert_int_equal(done, 5);
  }
  fixture_free(&f);
}

static void runs_never_cross_a_pinned_chunk(void **state) {
  fixture f;
  layout_cross_layer(&f, 2, 16, 1000);
  const uint32_t slots[4] = {1, 2, 3, 9};
  fixture_blocks(&f, 4, slots, 4000); /* back to back: would be 2 runs */
  kvt__host_span span = {(uintptr_t)f.host, 4 * 4000, 3072};
  kvt__copy_run runs[64];
  size_t n = 0;
  for (int dir = 0; dir < 2; dir++) {
    kvt__coalesce_args a = args_of(&f, dir, KVT__ORDER_BY_BLOCK);
    a.spans = &span;
    a.n_spans = 1;
    assert_int_equal(kvt__coalesce(&a, runs, 64, &n, NULL), 0);
    for (size_t r = 0; r < n; r++) {
      const unsigned char *h;
      size_t len = host_side(&runs[r], dir, &h);
      size_t off = (size_t)(h - f.host);
      assert_int_equal(off / 3072, (off + len - 1) / 3072);
    }
    /* 16000 host bytes cut at 5 chunk ends, plus the 3|9 slot break. */
    assert_int_equal(n, 7);
    check_coverage(&f, dir, runs, n);
    check_data(&f, dir, runs, n);
  }
  fixture_free(&f);
}

static void zero_byte_segments_are_skipped(void **state) {
  fixture f;
  layout_vllm_flash(&f, 3, 8, 128);
  f.segs[3].bytes = 0; /* layer 1's V carries nothing */
  const uint32_t slots[2] = {1, 5};
  fixture_blocks(&f, 2, slots, 0);
  assert_int_equal(coalesce_checked(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER), 2 * 5);
  fixture_free(&f);
}

static void bad_arguments_are_refused(void **state) {
  fixture f;
  layout_flashinfer(&f, 2, 8, 64);
  const uint32_t slots[2] = {1, 8};
  fixture_blocks(&f, 2, slots, 0);
  kvt__copy_run runs[8];
  size_t n = 99;
  kvt__coalesce_args a = args_of(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER);
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), -EINVAL); /* slot 8 of 8 */
  f.slots[1] = 7;
  f.hosts[0] = NULL;
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), -EINVAL);
  f.hosts[0] = f.host;
  a.dir = 7;
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), -EINVAL);
  a.dir = KVT_XFER_H2D;
  a.order = 9;
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), -EINVAL);
  a.order = KVT__ORDER_BY_LAYER;
  assert_int_equal(kvt__coalesce(&a, runs, 3, &n, NULL), -ENOBUFS); /* needs 4 */
  assert_int_equal(kvt__coalesce(&a, runs, 4, &n, NULL), 0);
  assert_int_equal(n, 4);
  f.lay.segments = NULL; /* metadata-only layout */
  assert_int_equal(kvt__coalesce(&a, runs, 8, &n, NULL), KVT_ELAYOUT);
  assert_int_equal(kvt__coalesce_runs_per_block(&f.lay, KVT__ORDER_BY_LAYER), 0);
  assert_int_equal(kvt__coalesce(NULL, runs, 8, &n, NULL), -EINVAL);
  fixture_free(&f);
}

static void no_blocks_means_no_runs(void **state) {
  fixture f;
  layout_flashinfer(&f, 3, 8, 64);
  fixture_blocks(&f, 0, NULL, 0);
  size_t n = 99;
  uint32_t layer_end[3] = {9, 9, 9};
  kvt__coalesce_args a = args_of(&f, KVT_XFER_H2D, KVT__ORDER_BY_LAYER);
  a.dev_slots = NULL;
  a.host_blocks = NULL;
  assert_int_equal(kvt__coalesce(&a, NULL, 0, &n, layer_end), 0);
  assert_int_equal(n, 0);
  for (int l = 0; l < 3; l++) assert_int_equal(layer_end[l], 0);
  fixture_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(vllm_flash_layout_never_merges_k_with_v),
      cmocka_unit_test(flashinfer_layout_merges_k_and_v_of_a_slot),
      cmocka_unit_test(cross_layer_block_is_one_run_when_stored),
      cmocka_unit_test(layer_windows_merge_a_slots_layers_in_block_order),
      cmocka_unit_test(consecutive_slots_merge_when_host_is_consecutive),
      cmocka_unit_test(mla_one_segment_per_layer),
      cmocka_unit_test(load_groups_runs_by_layer_in_order),
      cmocka_unit_test(small_buffer_iteration_matches_one_shot),
      cmocka_unit_test(runs_never_cross_a_pinned_chunk),
      cmocka_unit_test(zero_byte_segments_are_skipped),
      cmocka_unit_test(bad_arguments_are_refused),
      cmocka_unit_test(no_blocks_means_no_runs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
