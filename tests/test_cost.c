/* Cost model and planner (src/core/cost.c): the README's worked example
 * (docs/cost-model.md), the flips to recompute, the host/disk split, pipelined splits,
 * monotonicity, MLA, device-resident blocks and argument checking. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "helpers.h"
#include "kvtier/kvtier.h"

#define BT 16

/* |a - b| <= rel * |b| */
#define assert_near(a, b, rel)                                                              \
  do {                                                                                      \
    double a_ = (a), b_ = (b);                                                              \
    if (!(fabs(a_ - b_) <= (rel) * fabs(b_))) fail_msg("%s = %.9g, expected %.9g (rel %g)", \
                                                      #a, a_, b_, (double)(rel));           \
  } while (0)

static kvt_model_desc model(const char *name) {
  kvt_model_desc m;
  assert_int_equal(kvt_model_preset(name, &m), 0);
  return m;
}

/* The README's worked example: 8 GPUs of 989 TFLOP/s at 0.5, PCIe 24 GB/s. */
static kvt_hw_desc hw_example(int overlap) {
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  hw.num_gpus = 8;
  hw.flops_per_gpu = 989e12;
  hw.mfu = 0.5;
  hw.device_host = (kvt_link){24e9, 10e-6};
  hw.overlap = overlap;
  return hw;
}

static uint8_t tiers[1u << 17];

static void fill_tiers(uint32_t from, uint32_t to, uint8_t t) { memset(tiers + from, t, to - from); }

static kvt_plan plan_of(const kvt_model_desc *m, const kvt_hw_desc *hw, uint32_t bt, uint64_t n,
                        uint32_t n_prefix) {
  kvt_plan p;
  memset(&p, 0xa5, sizeof p);
  p.size = sizeof p;
  assert_int_equal(kvt_cost_plan(m, hw, bt, n, n_prefix, tiers, &p), 0);
  return p;
}

static void worked_example_figures(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  kvt_hw_desc hw = hw_example(0);
  uint64_t bpt = kvt_model_kv_bytes_per_token(&m);
  assert_int_equal(bpt, 327680);
  assert_int_equal(bpt * 10000, 3276800000ull);
  assert_near(kvt_cost_transfer_s(&hw, bpt * 10000, 0), 0.137, 0.005);
  assert_near(kvt_cost_transfer_s(&hw, bpt * 10000, 0), 10e-6 + 3.2768e9 / 24e9, 1e-12);

  double linear, flops = kvt_cost_recompute_flops(&m, 0, 10000, &linear);
  assert_near(kvt_model_params(&m), 70.55e9, 0.005); /* published: 70.6B */
  assert_near(linear, 1.4e15, 0.02);
  assert_near(linear, 2.0 * kvt_model_params(&m) * 10000, 1e-12);
  /* Attention: 4 x 80 layers x 64 heads x 128 x sum_{p=1}^{10000} p. */
  assert_near(flops - linear, 4.0 * 80 * 64 * 128 * (10000.0 * 10001 / 2), 1e-9);
  assert_near(linear / (8 * 989e12 * 0.5), 0.357, 0.01);
  assert_near(kvt_cost_compute_s(&m, &hw, 0, 10000), flops / (8 * 989e12 * 0.5), 1e-12);
  assert_true(kvt_cost_compute_s(&m, &hw, 0, 10000) > 0.38);
}

/* The remote link is slower than disk by default, and a plan reads it:
 * remote blocks cost more than the same blocks on disk or host, and with a
 * slow enough network the planner recomputes rather than fetch them. */
static void remote_blocks_cost_more_than_local_ones(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  kvt_hw_desc hw = hw_example(0);
  uint64_t n = 625 * BT + 1;
  fill_tiers(0, 625, KVT_TIER_HOST);
  kvt_plan host = plan_of(&m, &hw, BT, n, 625);
  fill_tiers(0, 625, KVT_TIER_DISK);
  kvt_plan disk = plan_of(&m, &hw, BT, n, 625);
  fill_tiers(0, 625, KVT_TIER_REMOTE);
  kvt_plan remote = plan_of(&m, &hw, BT, n, 625);
  assert_int_equal(remote.n_remote, 625);
  assert_true(remote.est_restore_all_s > disk.est_restore_all_s);
  assert_true(disk.est_restore_all_s > host.est_restore_all_s);
  uint64_t bytes = 625ull * BT * kvt_model_kv_bytes_per_token(&m);
  assert_near(remote.est_restore_all_s - host.est_restore_all_s, hw.host_remote.latency_s + bytes / hw.host_remote.bytes_per_s, 1e-9);
  assert_int_equal(remote.in_host_remote.bytes_per_s, hw.host_remote.bytes_per_s);
  /* Disk and remote reads overlap: a mixed prefix pays the slower of the two. */
  fill_tiers(0, 300, KVT_TIER_DISK);
  fill_tiers(300, 625, KVT_TIER_REMOTE);
  kvt_plan mixed = plan_of(&m, &hw, BT, n, 625);
  assert_true(mixed.est_restore_all_s < remote.est_restore_all_s);
  assert_near(kvt_cost_transfer3_s(&hw, 0, 300 * bytes / 625, 325 * bytes / 625),
              hw.host_remote.latency_s + 325.0 * bytes / 625 / hw.host_remote.bytes_per_s + hw.device_host.latency_s +
                  (double)bytes / hw.device_host.bytes_per_s,
              1e-9);
  /* A 100 Mb/s network: fetching loses to recomputing. */
  hw.host_remote.bytes_per_s = 12.5e6;
  fill_tiers(0, 625, KVT_TIER_REMOTE);
  kvt_plan slow = plan_of(&m, &hw, BT, n, 625);
  assert_int_equal(slow.decision, KVT_DECIDE_RECOMPUTE);
  assert_int_equal(slow.bytes_from_remote, 0);
}

static void worked_example_plan_restores(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  kvt_hw_desc hw = hw_example(0);
  fill_tiers(0, 625, KVT_TIER_HOST);
  kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
  /* 10000 = 625 blocks exactly: the last block is recomputed for the logits. */
  assert_int_equal(p.restore_blocks, 624);
  assert_int_equal(p.recompute_tokens, 16);
  assert_int_equal(p.n_blocks, 625);
  assert_int_equal(p.n_prefix, 625);
  assert_int_equal(p.n_host, 625);
  assert_int_equal(p.n_device + p.n_disk, 0);
  assert_int_equal(p.bytes_from_host, 624ull * BT * 327680);
  assert_int_equal(p.bytes_from_disk, 0);
  assert_near(p.est_transfer_s, 10e-6 + 624.0 * BT * 327680 / 24e9, 1e-12);
  assert_near(p.est_compute_s, kvt_cost_compute_s(&m, &hw, 9984, 10000), 1e-12);
  assert_near(p.est_ttft_s, p.est_transfer_s + p.est_compute_s, 1e-12);
  assert_near(p.est_restore_all_s, p.est_ttft_s, 1e-12);
  assert_near(p.est_recompute_all_s, kvt_cost_compute_s(&m, &hw, 0, 10000), 1e-12);
  assert_true(p.est_recompute_all_s > 2.0 * p.est_restore_all_s); /* "more than 2:1" */
  /* The inputs that produced the estimates. */
  assert_near(p.in_flops_per_s, 8 * 989e12 * 0.5, 1e-12);
  assert_near(p.in_device_host.bytes_per_s, 24e9, 0);
  assert_near(p.in_host_disk.bytes_per_s, hw.host_disk.bytes_per_s, 0);
  assert_int_equal(p.in_kv_bytes_per_token, 327680);
  assert_int_equal(p.in_overlap, 0);
  assert_int_equal(p.block_tokens, BT);
  assert_int_equal(p.n_tokens, 10000);
}

static void flip_small_model_recomputes(void **state) {
  (void)state;
  /* Llama-3-8B stores 3.5x more KV per parameter than 70B: on the same 8 GPUs
   * its 10k-token prefill (0.047 s) beats the 1.3 GB copy (0.055 s). */
  kvt_model_desc m = model("llama3-8b");
  kvt_hw_desc hw = hw_example(0);
  fill_tiers(0, 625, KVT_TIER_HOST);
  kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_RECOMPUTE);
  assert_int_equal(p.restore_blocks, 0);
  assert_int_equal(p.recompute_tokens, 10000);
  assert_int_equal(p.bytes_from_host, 0);
  assert_near(p.est_transfer_s, 0, 0);
  assert_near(p.est_ttft_s, p.est_recompute_all_s, 1e-12);
  assert_true(p.est_restore_all_s > p.est_recompute_all_s);
}

static void flip_slow_link_recomputes(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  kvt_hw_desc hw = hw_example(0);
  hw.device_host.bytes_per_s = 6e9; /* 0.55 s to copy vs 0.39 s to recompute */
  fill_tiers(0, 625, KVT_TIER_HOST);
  kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_RECOMPUTE);
  assert_int_equal(p.restore_blocks, 0);
  hw.device_host.bytes_per_s = 12e9; /* 0.27 s: restore again */
  p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
}

static void flip_short_context_recomputes(void **state) {
  (void)state;
  /* Attention makes late tokens dearer to recompute, so for Llama-3-8B on 8
   * GPUs a long context restores while a short one recomputes. */
  kvt_model_desc m = model("llama3-8b");
  kvt_hw_desc hw = hw_example(0);
  fill_tiers(0, 8192, KVT_TIER_HOST);
  assert_int_equal(plan_of(&m, &hw, BT, 4096, 256).decision, KVT_DECIDE_RECOMPUTE);
  assert_int_equal(plan_of(&m, &hw, BT, 131072, 8192).decision, KVT_DECIDE_RESTORE);
  /* A fixed latency (a remote or queued link) makes short prefixes recompute
   * even for the 70B model, which restores the long one over the same link. */
  kvt_model_desc big = model("llama3-70b");
  hw.device_host.latency_s = 2e-3;
  assert_int_equal(plan_of(&big, &hw, BT, 64, 4).decision, KVT_DECIDE_RECOMPUTE);
  assert_int_equal(plan_of(&big, &hw, BT, 10000, 625).decision, KVT_DECIDE_RESTORE);
}

static void split_host_half_slow_disk_half(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  for (int overlap = 0; overlap <= 1; overlap++) {
    kvt_hw_desc hw = hw_example(overlap);
    hw.host_disk = (kvt_link){1e9, 100e-6}; /* a slow disk: 0.33 ms per token */
    fill_tiers(0, 312, KVT_TIER_HOST);
    fill_tiers(312, 625, KVT_TIER_DISK);
    kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
    assert_int_equal(p.decision, KVT_DECIDE_SPLIT);
    assert_int_equal(p.restore_blocks, 312);
    assert_int_equal(p.recompute_tokens, 10000 - 312 * BT);
    assert_int_equal(p.n_host, 312);
    assert_int_equal(p.n_disk, 313);
    assert_int_equal(p.bytes_from_host, 312ull * BT * 327680);
    assert_int_equal(p.bytes_from_disk, 0);
    assert_true(p.est_ttft_s < p.est_restore_all_s);
    assert_true(p.est_ttft_s < p.est_recompute_all_s);
    /* With a fast disk the whole prefix is worth restoring. */
    hw.host_disk = (kvt_link){100e9, 100e-6};
    p = plan_of(&m, &hw, BT, 10000, 625);
    if (!overlap) {
      assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
      assert_int_equal(p.bytes_from_disk, 312ull * BT * 327680);
      /* Disk blocks pay the disk, then PCIe. */
      assert_near(p.est_transfer_s,
                  100e-6 + 312.0 * BT * 327680 / 100e9 + 10e-6 + 624.0 * BT * 327680 / 24e9, 1e-12);
    }
  }
  /* All on a slow disk: nothing is worth fetching. */
  kvt_hw_desc hw = hw_example(0);
  hw.host_disk = (kvt_link){1e9, 100e-6};
  fill_tiers(0, 625, KVT_TIER_DISK);
  assert_int_equal(plan_of(&m, &hw, BT, 10000, 625).decision, KVT_DECIDE_RECOMPUTE);
}

static void overlap_balances_copy_and_compute(void **state) {
  (void)state;
  /* Pipelined, copying the whole prefix (0.137 s) leaves compute idle: the
   * best plan copies a shorter prefix while the GPUs recompute the tail. */
  kvt_model_desc m = model("llama3-70b");
  kvt_hw_desc hw = hw_example(1);
  fill_tiers(0, 625, KVT_TIER_HOST);
  kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_SPLIT);
  assert_true(p.restore_blocks > 312 && p.restore_blocks < 624);
  assert_true(p.est_ttft_s < p.est_restore_all_s && p.est_ttft_s < p.est_recompute_all_s);
  int copy_slower = p.est_transfer_s > p.est_compute_s;
  double hi = copy_slower ? p.est_transfer_s : p.est_compute_s;
  double lo = copy_slower ? p.est_compute_s : p.est_transfer_s;
  assert_near(p.est_ttft_s, hi + lo / 80, 1e-12);
  /* At the optimum the two stages finish within a block's work of each other. */
  assert_true(hi - lo < 2e-3);
  /* Overlap never makes a plan slower than the serial one. */
  kvt_hw_desc serial = hw_example(0);
  assert_true(p.est_ttft_s <= plan_of(&m, &serial, BT, 10000, 625).est_ttft_s);
}

static void more_bandwidth_never_hurts_restore(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  for (int overlap = 0; overlap <= 1; overlap++) {
    for (int mix = 0; mix <= 1; mix++) {
      fill_tiers(0, 625, KVT_TIER_HOST);
      if (mix) fill_tiers(200, 625, KVT_TIER_DISK);
      kvt_plan prev = {0};
      int flipped = 0;
      for (double gbs = 0.5; gbs <= 200; gbs *= 1.1) {
        kvt_hw_desc hw = hw_example(overlap);
        if (mix)
          hw.host_disk.bytes_per_s = gbs * 1e9;
        else
          hw.device_host.bytes_per_s = gbs * 1e9;
        kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
        if (prev.size) {
          assert_true(p.est_restore_all_s <= prev.est_restore_all_s);
          assert_true(p.est_ttft_s <= prev.est_ttft_s);
          assert_true(p.restore_blocks >= prev.restore_blocks);
          assert_near(p.est_recompute_all_s, prev.est_recompute_all_s, 1e-12);
        }
        flipped |= p.decision != KVT_DECIDE_RECOMPUTE;
        prev = p;
      }
      assert_true(flipped);
      /* Pipelined, even a fast link leaves a tail worth recomputing under the copy. */
      assert_int_equal(prev.decision, overlap ? KVT_DECIDE_SPLIT : KVT_DECIDE_RESTORE);
    }
  }
}

static void longer_context_never_cheaper_per_token(void **state) {
  (void)state;
  for (size_t i = 0; kvt_model_preset_name(i); i++) {
    kvt_model_desc m = model(kvt_model_preset_name(i));
    double prev_avg = 0, prev_block = 0;
    for (uint64_t n = 16; n <= 262144; n *= 2) {
      double avg = kvt_cost_recompute_flops(&m, 0, n, NULL) / (double)n;
      double block = kvt_cost_recompute_flops(&m, n - 16, n, NULL); /* the last block */
      assert_true(avg > prev_avg);
      assert_true(block > prev_block);
      prev_avg = avg;
      prev_block = block;
    }
    /* Splitting a range never changes its cost (the closed form adds up). */
    double whole = kvt_cost_recompute_flops(&m, 100, 5000, NULL);
    double parts = kvt_cost_recompute_flops(&m, 100, 1234, NULL) +
                   kvt_cost_recompute_flops(&m, 1234, 5000, NULL);
    assert_near(parts, whole, 1e-12);
  }
}

static void mla_kv_bytes_deepseek_v3(void **state) {
  (void)state;
  kvt_model_desc m = model("deepseek-v3");
  /* 61 layers x (512 latent + 64 rope) x 2 bytes, no per-head K and V. */
  assert_int_equal(kvt_model_kv_bytes_per_token(&m), 61u * 576 * 2);
  assert_int_equal(kvt_model_kv_bytes_per_token(&m), 70272);
  assert_near(kvt_model_params(&m), 37e9, 0);
  double linear, f = kvt_cost_recompute_flops(&m, 0, 1000, &linear);
  assert_near(linear, 2 * 37e9 * 1000, 1e-12);
  /* Q.K over 192 dims, A.V over 128, 128 heads. */
  assert_near(f - linear, 2.0 * 61 * 128 * (192 + 128) * (1000.0 * 1001 / 2), 1e-9);
  /* Without MLA the same heads would cache 61 x 2 x 128 x 192 x 2 bytes. */
  m.mla_latent_dim = 0;
  assert_int_equal(kvt_model_kv_bytes_per_token(&m), 61u * 2 * 128 * 192 * 2);
}

static void presets_have_published_shapes(void **state) {
  (void)state;
  static const struct {
    const char *name;
    uint64_t kv_bytes;
    double params;
  } want[] = {
      {"llama3-8b", 32 * 2 * 8 * 128 * 2, 8.03e9},     {"llama3-70b", 80 * 2 * 8 * 128 * 2, 70.55e9},
      {"llama3.1-405b", 126 * 2 * 8 * 128 * 2, 405.9e9}, {"mistral-7b", 32 * 2 * 8 * 128 * 2, 7.25e9},
      {"qwen2.5-7b", 28 * 2 * 4 * 128 * 2, 7.62e9},     {"qwen2.5-72b", 80 * 2 * 8 * 128 * 2, 72.7e9},
      {"tinyllm", 8 * 2 * 2 * 64 * 4, 0},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    kvt_model_desc m = model(want[i].name);
    assert_string_equal(m.name, want[i].name);
    assert_int_equal(m.size, sizeof m);
    assert_int_equal(kvt_model_kv_bytes_per_token(&m), want[i].kv_bytes);
    if (want[i].params > 0) assert_near(kvt_model_params(&m), want[i].params, 0.005);
  }
  kvt_model_desc t = model("tinyllm");
  assert_int_equal(t.num_layers, 8);
  assert_int_equal(t.hidden_size, 512);
  assert_int_equal(t.num_heads, 8);
  assert_int_equal(t.num_kv_heads, 2);
  assert_int_equal(t.head_dim, 64);
  assert_int_equal(t.vocab_size, 4096);
  assert_int_equal(t.kv_dtype_bytes, 4);
  /* Derived from the shape: per layer Q and O, K and V for 2 KV heads, the
   * gated MLP and two norms; untied embeddings and a final norm. */
  double attn = 512.0 * 512 * 2 + 2.0 * 512 * 2 * 64;
  assert_near(kvt_model_params(&t), 8 * (attn + 3.0 * 512 * 1408 + 2 * 512) + 2.0 * 4096 * 512 + 512, 1e-12);

  size_t n = 0;
  while (kvt_model_preset_name(n)) n++;
  assert_true(n >= 8);
  kvt_model_desc m;
  assert_int_equal(kvt_model_preset("gpt-17", &m), -ENOENT);
  assert_int_equal(m.size, sizeof m);
  assert_int_equal(m.num_layers, 0);
  assert_int_equal(kvt_model_preset(NULL, &m), -EINVAL);
  assert_int_equal(kvt_model_preset("llama3-8b", NULL), -EINVAL);
  /* Defaults: MHA when num_kv_heads is 0, head_dim from hidden / heads. */
  kvt_model_init(&m);
  m.num_layers = 2;
  m.hidden_size = 256;
  m.num_heads = 4;
  assert_int_equal(kvt_model_kv_bytes_per_token(&m), 2u * 2 * 4 * 64 * 2);
}

static void device_resident_blocks_cost_nothing(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  kvt_hw_desc hw = hw_example(0);
  /* 100 blocks on the device, then host behind a collapsed link. */
  fill_tiers(0, 100, KVT_TIER_DEVICE);
  fill_tiers(100, 625, KVT_TIER_HOST);
  hw.device_host.bytes_per_s = 1e6;
  kvt_plan p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_RECOMPUTE);
  assert_int_equal(p.restore_blocks, 100);
  assert_int_equal(p.recompute_tokens, 10000 - 100 * BT);
  assert_int_equal(p.n_device, 100);
  assert_int_equal(p.bytes_from_host, 0);
  assert_near(p.est_transfer_s, 0, 0);
  assert_near(p.est_ttft_s, kvt_cost_compute_s(&m, &hw, 1600, 10000), 1e-12);
  assert_near(p.est_recompute_all_s, p.est_ttft_s, 1e-12);
  /* A fast link restores the rest. */
  hw.device_host.bytes_per_s = 24e9;
  p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
  assert_int_equal(p.bytes_from_host, 524ull * BT * 327680);
  /* Device blocks inside the prefix are free too: only host blocks move. */
  for (uint32_t i = 0; i < 625; i++) tiers[i] = i % 2 ? KVT_TIER_DEVICE : KVT_TIER_HOST;
  p = plan_of(&m, &hw, BT, 10000, 625);
  assert_int_equal(p.restore_blocks, 624);
  assert_int_equal(p.bytes_from_host, 312ull * BT * 327680);
  /* Everything on the device, tokens an exact multiple: the last block is
   * still computed, nothing is copied, which is a recompute of one block. */
  fill_tiers(0, 4, KVT_TIER_DEVICE);
  p = plan_of(&m, &hw, BT, 64, 4);
  assert_int_equal(p.restore_blocks, 3);
  assert_int_equal(p.recompute_tokens, 16);
  assert_int_equal(p.decision, KVT_DECIDE_RECOMPUTE);
  /* A partial trailing block: all full blocks restore, the rest computes. */
  fill_tiers(0, 4, KVT_TIER_HOST);
  p = plan_of(&m, &hw, BT, 70, 4);
  assert_int_equal(p.restore_blocks, 4);
  assert_int_equal(p.recompute_tokens, 6);
  assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
  /* No cached prefix at all. */
  p = plan_of(&m, &hw, BT, 70, 0);
  assert_int_equal(p.restore_blocks, 0);
  assert_int_equal(p.decision, KVT_DECIDE_RECOMPUTE);
  assert_near(p.est_ttft_s, kvt_cost_compute_s(&m, &hw, 0, 70), 1e-12);
  assert_near(p.est_restore_all_s, p.est_recompute_all_s, 1e-12);
}

static void breakeven_is_where_the_costs_meet(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-70b");
  for (int overlap = 0; overlap <= 1; overlap++) {
    kvt_hw_desc hw = hw_example(overlap);
    double bw;
    assert_int_equal(kvt_cost_breakeven(&m, &hw, 10000, 10000, &bw), 0);
    if (!overlap) assert_near(bw, 9999.0 * 327680 / (0.38976 - 10e-6), 0.001);
    /* With one-token blocks the planner's restore-all is the same 9999 tokens. */
    fill_tiers(0, 10000, KVT_TIER_HOST);
    hw.device_host.bytes_per_s = bw;
    kvt_plan p = plan_of(&m, &hw, 1, 10000, 10000);
    assert_near(p.est_restore_all_s, p.est_recompute_all_s, 1e-9);
    hw.device_host.bytes_per_s = bw * 1.05;
    p = plan_of(&m, &hw, 1, 10000, 10000);
    assert_true(p.est_restore_all_s < p.est_recompute_all_s);
    hw.device_host.bytes_per_s = bw * 0.95;
    p = plan_of(&m, &hw, 1, 10000, 10000);
    assert_true(p.est_restore_all_s > p.est_recompute_all_s);
  }
  /* Latency larger than the compute saved: restore never wins. */
  kvt_hw_desc hw = hw_example(0);
  hw.device_host.latency_s = 1.0;
  double bw;
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 1000, 1000, &bw), 0);
  assert_true(isinf(bw));
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 1000, 0, &bw), 0);
  assert_true(isinf(bw));
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 1000, 1001, &bw), -EINVAL);
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 0, 0, &bw), -EINVAL);
  assert_int_equal(kvt_cost_breakeven(NULL, &hw, 10, 5, &bw), -EINVAL);
  assert_int_equal(kvt_cost_breakeven(&m, &hw, 10, 5, NULL), -EINVAL);
}

static void invalid_arguments_are_einval(void **state) {
  (void)state;
  kvt_model_desc m = model("llama3-8b");
  kvt_hw_desc hw = hw_example(1);
  kvt_plan p;
  memset(&p, 0, sizeof p);
  p.size = sizeof p;
  fill_tiers(0, 8, KVT_TIER_HOST);
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 8, tiers, &p), 0);
  assert_int_equal(kvt_cost_plan(NULL, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, NULL, BT, 128, 8, tiers, &p), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 8, tiers, NULL), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, 0, 128, 8, tiers, &p), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 0, 0, tiers, &p), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 127, 8, tiers, &p), -EINVAL); /* 7 full blocks */
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 8, NULL, &p), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 0, NULL, &p), 0);
  tiers[3] = KVT_TIER_NONE;
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  tiers[3] = KVT_TIER_REMOTE + 1;
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 3, tiers, &p), 0); /* before the bad one */
  tiers[3] = KVT_TIER_HOST;
  p.size = 0;
  assert_int_equal(kvt_cost_plan(&m, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  p.size = sizeof p;

  kvt_model_desc bad = m;
  bad.num_layers = 0;
  assert_int_equal(kvt_cost_plan(&bad, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  assert_int_equal(kvt_model_kv_bytes_per_token(&bad), 0);
  assert_near(kvt_model_params(&bad), 0, 0);
  assert_near(kvt_cost_recompute_flops(&bad, 0, 10, NULL), 0, 0);
  bad = m;
  bad.kv_dtype_bytes = 0;
  assert_int_equal(kvt_cost_plan(&bad, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  bad = m;
  bad.size = 0; /* not initialised */
  assert_int_equal(kvt_cost_plan(&bad, &hw, BT, 128, 8, tiers, &p), -EINVAL);
  bad = m;
  bad.params = NAN;
  assert_int_equal(kvt_cost_plan(&bad, &hw, BT, 128, 8, tiers, &p), -EINVAL);

  const struct {
    size_t off;
    double v;
  } bad_doubles[] = {
      {offsetof(kvt_hw_desc, flops_per_gpu), 0},
      {offsetof(kvt_hw_desc, mfu), NAN},
      {offsetof(kvt_hw_desc, mfu), -0.5},
      {offsetof(kvt_hw_desc, device_host.bytes_per_s), 0},
      {offsetof(kvt_hw_desc, host_disk.bytes_per_s), INFINITY},
      {offsetof(kvt_hw_desc, device_host.latency_s), -1e-6},
      {offsetof(kvt_hw_desc, host_disk.latency_s), NAN},
  };
  for (size_t i = 0; i < sizeof bad_doubles / sizeof bad_doubles[0]; i++) {
    kvt_hw_desc h = hw;
    memcpy((char *)&h + bad_doubles[i].off, &bad_doubles[i].v, sizeof(double));
    assert_int_equal(kvt_cost_plan(&m, &h, BT, 128, 8, tiers, &p), -EINVAL);
    assert_near(kvt_cost_transfer_s(&h, 1000, 1000), 0, 0);
  }
  kvt_hw_desc h = hw;
  h.num_gpus = 0;
  assert_int_equal(kvt_cost_plan(&m, &h, BT, 128, 8, tiers, &p), -EINVAL);

  assert_near(kvt_cost_recompute_flops(&m, 10, 10, NULL), 0, 0);
  double lin = 5;
  assert_near(kvt_cost_recompute_flops(&m, 11, 10, &lin), 0, 0);
  assert_near(lin, 0, 0);
  assert_near(kvt_cost_transfer_s(&hw, 0, 0), 0, 0);
  assert_int_equal(kvt_model_kv_bytes_per_token(NULL), 0);
  kvt_model_init(NULL);
  kvt_hw_init(NULL);
}

static void hw_defaults(void **state) {
  (void)state;
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  assert_int_equal(hw.size, sizeof hw);
  assert_int_equal(hw.num_gpus, 1);
  assert_near(hw.flops_per_gpu, 989e12, 0);
  assert_near(hw.mfu, 0.5, 0);
  assert_near(hw.device_host.bytes_per_s, 24e9, 0);
  assert_near(hw.device_host.latency_s, 10e-6, 0);
  assert_near(hw.host_disk.bytes_per_s, 6.5e9, 0);
  assert_near(hw.host_disk.latency_s, 100e-6, 0);
  assert_int_equal(hw.overlap, 1);
  kvt_model_desc m;
  kvt_model_init(&m);
  assert_int_equal(m.size, sizeof m);
  assert_int_equal(m.kv_dtype_bytes, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(worked_example_figures),
      cmocka_unit_test(worked_example_plan_restores),
      cmocka_unit_test(flip_small_model_recomputes),
      cmocka_unit_test(flip_slow_link_recomputes),
      cmocka_unit_test(flip_short_context_recomputes),
      cmocka_unit_test(split_host_half_slow_disk_half),
      cmocka_unit_test(overlap_balances_copy_and_compute),
      cmocka_unit_test(more_bandwidth_never_hurts_restore),
      cmocka_unit_test(longer_context_never_cheaper_per_token),
      cmocka_unit_test(mla_kv_bytes_deepseek_v3),
      cmocka_unit_test(presets_have_published_shapes),
      cmocka_unit_test(device_resident_blocks_cost_nothing),
      cmocka_unit_test(breakeven_is_where_the_costs_meet),
      cmocka_unit_test(invalid_arguments_are_einval),
      cmocka_unit_test(hw_defaults),
      cmocka_unit_test(remote_blocks_cost_more_than_local_ones),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
