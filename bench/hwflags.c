/* The hardware flags of kvtier-bench cost, replay and sweep: one parser, one
 * usage text and one printout, so the three commands describe a machine the
 * same way. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const char kvt_bench_hw_usage[] =
    "hardware the cost model assumes (defaults: one H100, PCIe 4, one NVMe drive):\n"
    "  --gpus G              GPUs sharing the prefill (1)\n"
    "  --gpu-tflops F        peak TFLOP/s per GPU (989, H100 dense BF16)\n"
    "  --mfu M               achieved fraction of peak, 0 < M <= 1 (0.5)\n"
    "  --link-gbs B          device<->host link, GB/s (24)\n"
    "  --link-latency-us L   fixed latency per link transfer (10)\n"
    "  --disk-gbs B          disk read bandwidth, GB/s (6.5)\n"
    "  --disk-latency-us L   fixed latency per disk read (100)\n"
    "  --remote-gbs B        remote tier's network into the host, GB/s (1.25)\n"
    "  --remote-latency-us L fixed latency per remote round trip (500)\n"
    "  --overlap, --no-overlap  layer-wise loads under compute, or copy then compute\n";

static int number(const char *s, double *out) {
  char *end;
  if (!s || !*s) return -EINVAL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return -EINVAL;
  *out = v;
  return 0;
}

static int bad(const char *cmd, const char *opt, const char *v, const char *why) {
  fprintf(stderr, "kvtier-bench %s: %s '%s': %s\n", cmd, opt, v ? v : "", why);
  return -1;
}

int kvt_bench_hw_flag(const char *opt) {
  return !strcmp(opt, "--overlap") || !strcmp(opt, "--no-overlap") ? 1
         : !strcmp(opt, "--gpus") || !strcmp(opt, "--gpu-tflops") || !strcmp(opt, "--mfu") ||
                 !strcmp(opt, "--link-gbs") || !strcmp(opt, "--link-latency-us") ||
                 !strcmp(opt, "--disk-gbs") || !strcmp(opt, "--disk-latency-us") ||
                 !strcmp(opt, "--remote-gbs") || !strcmp(opt, "--remote-latency-us")
             ? 2
             : 0;
}

int kvt_bench_hw_option(const char *cmd, const char *opt, const char *v, kvt_hw_desc *hw) {
  double d = 0;
  if (!strcmp(opt, "--overlap")) {
    hw->overlap = 1;
    return 0;
  }
  if (!strcmp(opt, "--no-overlap")) {
    hw->overlap = 0;
    return 0;
  }
  if (!v) return bad(cmd, opt, v, "needs a value");
  int rc = number(v, &d);
  if (!strcmp(opt, "--gpus")) {
    if (rc || d < 1 || d > 65536 || d != floor(d)) return bad(cmd, opt, v, "expected a GPU count, 1..65536");
    hw->num_gpus = (uint32_t)d;
  } else if (!strcmp(opt, "--gpu-tflops")) {
    if (rc || d <= 0) return bad(cmd, opt, v, "expected TFLOP/s > 0");
    hw->flops_per_gpu = d * 1e12;
  } else if (!strcmp(opt, "--mfu")) {
    if (rc || d <= 0 || d > 1) return bad(cmd, opt, v, "expected 0 < mfu <= 1");
    hw->mfu = d;
  } else if (!strcmp(opt, "--link-gbs")) {
    if (rc || d <= 0) return bad(cmd, opt, v, "expected GB/s > 0");
    hw->device_host.bytes_per_s = d * 1e9;
  } else if (!strcmp(opt, "--link-latency-us")) {
    if (rc || d < 0) return bad(cmd, opt, v, "expected microseconds >= 0");
    hw->device_host.latency_s = d * 1e-6;
  } else if (!strcmp(opt, "--disk-gbs")) {
    if (rc || d <= 0) return bad(cmd, opt, v, "expected GB/s > 0");
    hw->host_disk.bytes_per_s = d * 1e9;
  } else if (!strcmp(opt, "--disk-latency-us")) {
    if (rc || d < 0) return bad(cmd, opt, v, "expected microseconds >= 0");
    hw->host_disk.latency_s = d * 1e-6;
  } else if (!strcmp(opt, "--remote-gbs")) {
    if (rc || d <= 0) return bad(cmd, opt, v, "expected GB/s > 0");
    hw->host_remote.bytes_per_s = d * 1e9;
  } else if (!strcmp(opt, "--remote-latency-us")) {
    if (rc || d < 0) return bad(cmd, opt, v, "expected microseconds >= 0");
    hw->host_remote.latency_s = d * 1e-6;
  } else {
    return bad(cmd, opt, v, "not a hardware flag");
  }
  return 0;
}

void kvt_bench_hw_print(FILE *f, const char *indent, const kvt_hw_desc *hw) {
  fprintf(f, "%shardware: %u GPU%s x %.4g TFLOP/s at MFU %.2f; link %.3g GB/s + %.0f us; disk %.3g GB/s + %.0f us;\n"
             "%s  remote %.3g GB/s + %.0f us; layer pipelining %s (--gpus --gpu-tflops --mfu --link-gbs --disk-gbs ... to change)\n",
          indent, hw->num_gpus, hw->num_gpus == 1 ? "" : "s", hw->flops_per_gpu / 1e12, hw->mfu,
          hw->device_host.bytes_per_s / 1e9, hw->device_host.latency_s * 1e6, hw->host_disk.bytes_per_s / 1e9,
          hw->host_disk.latency_s * 1e6, indent, hw->host_remote.bytes_per_s / 1e9, hw->host_remote.latency_s * 1e6,
          hw->overlap ? "on" : "off");
}

void kvt_bench_hw_json(FILE *f, const kvt_hw_desc *hw) {
  fprintf(f,
          "\"hardware\":{\"gpus\":%u,\"gpu_tflops\":%.6g,\"mfu\":%.6g,\"link_gbs\":%.6g,\"link_latency_us\":%.6g,"
          "\"disk_gbs\":%.6g,\"disk_latency_us\":%.6g,\"remote_gbs\":%.6g,\"remote_latency_us\":%.6g,\"overlap\":%s}",
          hw->num_gpus, hw->flops_per_gpu / 1e12, hw->mfu, hw->device_host.bytes_per_s / 1e9,
          hw->device_host.latency_s * 1e6, hw->host_disk.bytes_per_s / 1e9, hw->host_disk.latency_s * 1e6,
          hw->host_remote.bytes_per_s / 1e9, hw->host_remote.latency_s * 1e6, hw->overlap ? "true" : "false");
}
