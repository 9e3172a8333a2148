/* Online calibration (src/core/calib.c): estimates follow measured prefills
 * and transfers, degenerate and outlying samples cannot wreck them, and the
 * planner's decisions follow a collapsing link. */
#include <math.h>
#include <string.h>

#include "core/calib.h"
#include "helpers.h"
#include "kvtier/kvtier.h"

#define assert_near(a, b, rel)                                                              \
  do {                                                                                      \
    double a_ = (a), b_ = (b);                                                              \
    if (!(fabs(a_ - b_) <= (rel) * fabs(b_))) fail_msg("%s = %.9g, expected %.9g (rel %g)", \
                                                      #a, a_, b_, (double)(rel));           \
  } while (0)

static kvt_model_desc model70b(void) {
  kvt_model_desc m;
  assert_int_equal(kvt_model_preset("llama3-70b", &m), 0);
  return m;
}

static kvt_hw_desc hw8(void) {
  kvt_hw_desc hw;
  kvt_hw_init(&hw);
  hw.num_gpus = 8;
  hw.overlap = 0;
  return hw;
}

static kvt_hw_desc calibrated(const kvt__calib *c) {
  kvt_hw_desc hw;
  memset(&hw, 0, sizeof hw);
  kvt__calib_hw(c, &hw);
  return hw;
}

static void starts_at_the_nominal_hw(void **state) {
  (void)state;
  kvt_model_desc m = model70b();
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, &m, &hw);
  kvt_hw_desc out = calibrated(&c);
  assert_int_equal(out.size, sizeof out);
  assert_int_equal(out.num_gpus, 8);
  assert_int_equal(out.overlap, 0);
  assert_near(out.flops_per_gpu, hw.flops_per_gpu, 0);
  assert_near(out.mfu, hw.mfu, 1e-12);
  assert_near(out.device_host.bytes_per_s, hw.device_host.bytes_per_s, 1e-12);
  assert_near(out.device_host.latency_s, hw.device_host.latency_s, 0);
  assert_near(out.host_disk.bytes_per_s, hw.host_disk.bytes_per_s, 1e-12);
  assert_near(out.host_disk.latency_s, hw.host_disk.latency_s, 0);
}

static void prefill_at_twice_the_speed_raises_mfu(void **state) {
  (void)state;
  kvt_model_desc m = model70b();
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, &m, &hw);
  double rate = 8 * hw.flops_per_gpu * hw.mfu;
  double secs = kvt_cost_recompute_flops(&m, 2000, 6000, NULL) / (2 * rate);
  kvt__calib_observe_prefill(&c, &m, 2000, 6000, secs);
  double mfu1 = calibrated(&c).mfu;
  assert_true(mfu1 > 0.5 && mfu1 < 1.0);
  for (int i = 0; i < 60; i++) kvt__calib_observe_prefill(&c, &m, 2000, 6000, secs);
  assert_near(calibrated(&c).mfu, 1.0, 0.01);
  assert_int_equal(c.prefill_samples, 61);
  /* The planner now expects recompute to take half as long. */
  kvt_hw_desc now = calibrated(&c);
  assert_near(kvt_cost_compute_s(&m, &now, 0, 10000), kvt_cost_compute_s(&m, &hw, 0, 10000) / 2, 0.01);
  /* ...and it follows the machine back down. */
  for (int i = 0; i < 60; i++) kvt__calib_observe_prefill(&c, &m, 2000, 6000, 2 * secs);
  assert_near(calibrated(&c).mfu, 0.5, 0.01);
}

static void short_prefills_weigh_less(void **state) {
  (void)state;
  kvt_model_desc m = model70b();
  kvt_hw_desc hw = hw8();
  double rate = 8 * hw.flops_per_gpu * hw.mfu;
  kvt__calib lo, hi;
  kvt__calib_init(&lo, &m, &hw);
  kvt__calib_init(&hi, &m, &hw);
  /* Both at half the nominal speed: 16 tokens move the estimate 1/8 as far. */
  kvt__calib_observe_prefill(&lo, &m, 0, 16, 2 * kvt_cost_recompute_flops(&m, 0, 16, NULL) / rate);
  kvt__calib_observe_prefill(&hi, &m, 0, 1024, 2 * kvt_cost_recompute_flops(&m, 0, 1024, NULL) / rate);
  double d_lo = 1 / calibrated(&lo).mfu - 1 / 0.5, d_hi = 1 / calibrated(&hi).mfu - 1 / 0.5;
  assert_true(d_lo > 0);
  assert_near(d_lo, d_hi / 8, 1e-9);
}

static void transfers_at_twice_the_bandwidth(void **state) {
  (void)state;
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, NULL, &hw);
  /* 1 GiB in 4 submissions at 48 GB/s plus the nominal 10 us each. */
  uint64_t bytes = 1ull << 30;
  double secs = 4 * 10e-6 + (double)bytes / 48e9;
  kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, bytes, 4, secs);
  double bw1 = calibrated(&c).device_host.bytes_per_s;
  assert_true(bw1 > 24e9 && bw1 < 48e9);
  for (int i = 0; i < 60; i++) kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, bytes, 4, secs);
  kvt_hw_desc out = calibrated(&c);
  /* The latency was subtracted, so the estimate lands on 48 GB/s, not below. */
  assert_near(out.device_host.bytes_per_s, 48e9, 0.001);
  assert_near(out.device_host.latency_s, 10e-6, 0);
  /* The other path did not move. */
  assert_near(out.host_disk.bytes_per_s, hw.host_disk.bytes_per_s, 1e-12);
  assert_int_equal(c.path[KVT_CALIB_DEVICE_HOST].samples, 61);
  assert_int_equal(c.path[KVT_CALIB_HOST_DISK].samples, 0);
}

static void small_transfers_calibrate_latency(void **state) {
  (void)state;
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, NULL, &hw);
  /* 64 submissions of 4 KiB from an NVMe whose latency is 300 us, not 100. */
  uint64_t bytes = 64 * 4096;
  double secs = 64 * 300e-6 + (double)bytes / hw.host_disk.bytes_per_s;
  for (int i = 0; i < 60; i++) kvt__calib_observe_transfer(&c, KVT_CALIB_HOST_DISK, bytes, 64, secs);
  kvt_hw_desc out = calibrated(&c);
  assert_near(out.host_disk.latency_s, 300e-6, 0.001);
  assert_near(out.host_disk.bytes_per_s, hw.host_disk.bytes_per_s, 1e-9);
}

static void degenerate_samples_are_ignored(void **state) {
  (void)state;
  kvt_model_desc m = model70b();
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, &m, &hw);
  kvt_hw_desc before = calibrated(&c);
  kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, 0, 1, 1.0);
  kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, 4096, 0, 1.0);
  kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, 4096, 1, 0.0);
  kvt__calib_observe_transfer(&c, KVT_CALIB_HOST_DISK, 4096, 1, -1.0);
  kvt__calib_observe_transfer(&c, KVT_CALIB_HOST_DISK, 4096, 1, NAN);
  kvt__calib_observe_transfer(&c, KVT_CALIB_HOST_DISK, 4096, 1, INFINITY);
  kvt__calib_observe_transfer(&c, KVT_CALIB_NPATHS, 4096, 1, 1.0);
  kvt__calib_observe_transfer(&c, -1, 4096, 1, 1.0);
  kvt__calib_observe_prefill(&c, &m, 100, 100, 1.0);
  kvt__calib_observe_prefill(&c, &m, 200, 100, 1.0);
  kvt__calib_observe_prefill(&c, &m, 0, 100, 0.0);
  kvt__calib_observe_prefill(&c, &m, 0, 100, NAN);
  kvt__calib_observe_prefill(&c, NULL, 0, 100, 1.0);
  kvt_hw_desc after = calibrated(&c);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(c.ignored, 13);
  assert_int_equal(c.prefill_samples, 0);
  assert_int_equal(c.path[0].samples + c.path[1].samples, 0);
  /* NULL calib is harmless. */
  kvt__calib_observe_transfer(NULL, 0, 1, 1, 1.0);
  kvt__calib_observe_prefill(NULL, &m, 0, 1, 1.0);
  kvt__calib_hw(NULL, &after);
}

static void one_outlier_cannot_swing_the_estimate(void **state) {
  (void)state;
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, NULL, &hw);
  /* A copy descheduled for a second: 1000x its expected time. */
  uint64_t bytes = 256ull << 20;
  kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, bytes, 1, 1000 * (double)bytes / 24e9);
  double bw = calibrated(&c).device_host.bytes_per_s;
  /* Clamped to 4x the estimate, weighted 0.2: time per byte at most 1.6x. */
  assert_near(bw, 24e9 / (1 + KVT_CALIB_ALPHA * (KVT_CALIB_CLAMP - 1)), 1e-9);
  assert_true(bw > 24e9 / 1.7);
}

static void collapsed_link_changes_the_plan(void **state) {
  (void)state;
  kvt_model_desc m = model70b();
  kvt_hw_desc hw = hw8();
  kvt__calib c;
  kvt__calib_init(&c, &m, &hw);
  uint8_t tiers[625];
  memset(tiers, KVT_TIER_HOST, sizeof tiers);
  kvt_plan p = {.size = sizeof p};
  kvt_hw_desc now = calibrated(&c);
  assert_int_equal(kvt_cost_plan(&m, &now, 16, 10000, 625, tiers, &p), 0);
  assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
  /* PCIe now delivers 2 GB/s (a congested bus): the plan must follow. */
  uint64_t bytes = 64ull << 20;
  for (int i = 0; i < 20; i++)
    kvt__calib_observe_transfer(&c, KVT_CALIB_DEVICE_HOST, bytes, 1, 10e-6 + (double)bytes / 2e9);
  now = calibrated(&c);
  assert_near(now.device_host.bytes_per_s, 2e9, 0.05);
  assert_int_equal(kvt_cost_plan(&m, &now, 16, 10000, 625, tiers, &p), 0);
  assert_int_equal(p.decision, KVT_DECIDE_RECOMPUTE);
  assert_near(p.in_device_host.bytes_per_s, now.device_host.bytes_per_s, 0);

  /* Host half, disk half: a healthy disk restores all, a collapsed one
   * makes the planner stop at the host half. */
  kvt__calib_init(&c, &m, &hw);
  memset(tiers + 312, KVT_TIER_DISK, 625 - 312);
  now = calibrated(&c);
  now.host_disk.bytes_per_s = 50e9;
  kvt__calib_init(&c, &m, &now);
  assert_int_equal(kvt_cost_plan(&m, &now, 16, 10000, 625, tiers, &p), 0);
  assert_int_equal(p.decision, KVT_DECIDE_RESTORE);
  for (int i = 0; i < 30; i++)
    kvt__calib_observe_transfer(&c, KVT_CALIB_HOST_DISK, bytes, 1, 100e-6 + (double)bytes / 0.5e9);
  now = calibrated(&c);
  assert_int_equal(kvt_cost_plan(&m, &now, 16, 10000, 625, tiers, &p), 0);
  assert_int_equal(p.decision, KVT_DECIDE_SPLIT);
  assert_int_equal(p.restore_blocks, 312);
}

static void unknown_rates_take_the_first_sample(void **state) {
  (void)state;
  kvt_hw_desc hw = hw8();
  hw.host_disk.bytes_per_s = 0; /* not known when the cache was opened */
  kvt__calib c;
  kvt__calib_init(&c, NULL, &hw);
  kvt__calib_observe_transfer(&c, KVT_CALIB_HOST_DISK, 1ull << 30, 1, 100e-6 + (double)(1ull << 30) / 3e9);
  assert_near(calibrated(&c).host_disk.bytes_per_s, 3e9, 1e-9);
  /* NULL hw means the library defaults. */
  kvt__calib_init(&c, NULL, NULL);
  kvt_hw_desc def;
  kvt_hw_init(&def);
  kvt_hw_desc out = calibrated(&c);
  assert_near(out.device_host.bytes_per_s, def.device_host.bytes_per_s, 1e-12);
  assert_near(out.mfu, def.mfu, 1e-12);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(starts_at_the_nominal_hw),
      cmocka_unit_test(prefill_at_twice_the_speed_raises_mfu),
      cmocka_unit_test(short_prefills_weigh_less),
      cmocka_unit_test(transfers_at_twice_the_bandwidth),
      cmocka_unit_test(small_transfers_calibrate_latency),
      cmocka_unit_test(degenerate_samples_are_ignored),
      cmocka_unit_test(one_outlier_cannot_swing_the_estimate),
      cmocka_unit_test(collapsed_link_changes_the_plan),
      cmocka_unit_test(unknown_rates_take_the_first_sample),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
