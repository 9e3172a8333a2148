/* Online calibration: the scheme is described in calib.h. */
#include "core/calib.h"

#include <math.h>
#include <string.h>

static int good_seconds(double s) { return s > 0 && !isinf(s); } /* NaN fails s > 0 */

static double inverse(double x) { return x > 0 && !isinf(x) ? 1.0 / x : 0; }

/* Moves est toward sample by weight x KVT_CALIB_ALPHA, after clamping the
 * sample to within KVT_CALIB_CLAMP of est. An unknown (0) estimate takes
 * the sample as it is. */
static double follow(double est, double sample, double weight) {
  if (!(est > 0)) return sample;
  double lo = est / KVT_CALIB_CLAMP, hi = est * KVT_CALIB_CLAMP;
  if (sample < lo) sample = lo;
  if (sample > hi) sample = hi;
  return est + weight * KVT_CALIB_ALPHA * (sample - est);
}

void kvt__calib_init(kvt__calib *c, const kvt_model_desc *m, const kvt_hw_desc *hw) {
  (void)m; /* FLOPs are computed per sample from the model the engine passes */
  if (!c) return;
  memset(c, 0, sizeof *c);
  if (hw)
    c->nominal = *hw;
  else
    kvt_hw_init(&c->nominal);
  const kvt_hw_desc *n = &c->nominal;
  c->s_per_flop = inverse(n->num_gpus * n->flops_per_gpu * n->mfu);
  const kvt_link *links[KVT_CALIB_NPATHS] = {&n->device_host, &n->host_disk, &n->host_remote};
  for (int i = 0; i < KVT_CALIB_NPATHS; i++) {
    c->path[i].s_per_byte = inverse(links[i]->bytes_per_s);
    double lat = links[i]->latency_s;
    c->path[i].latency_s = lat > 0 && !isinf(lat) ? lat : 0;
  }
}

void kvt__calib_observe_prefill(kvt__calib *c, const kvt_model_desc *m, uint64_t from, uint64_t to,
                                double seconds) {
  if (!c) return;
  double flops = to > from ? kvt_cost_recompute_flops(m, from, to, NULL) : 0;
  if (!(flops > 0) || !good_seconds(seconds)) {
    c->ignored++;
    return;
  }
  double weight = (double)(to - from) / KVT_CALIB_FULL_WEIGHT_TOKENS;
  if (weight > 1) weight = 1;
  c->s_per_flop = follow(c->s_per_flop, seconds / flops, weight);
  c->prefill_samples++;
}

void kvt__calib_observe_transfer(kvt__calib *c, int path, uint64_t bytes, uint32_t n_transfers,
                                 double seconds) {
  if (!c) return;
  if (path < 0 || path >= KVT_CALIB_NPATHS || bytes == 0 || n_transfers == 0 ||
      !good_seconds(seconds)) {
    c->ignored++;
    return;
  }
  kvt__calib_path *p = &c->path[path];
  double b = (double)bytes;
  double fixed = n_transfers * p->latency_s; /* predicted latency part */
  double wire = b * p->s_per_byte;           /* predicted bytes part */
  if (!(p->s_per_byte > 0)) {
    /* No bandwidth yet: all the time beyond the known latency is the bytes'. */
    double t = seconds > fixed ? seconds - fixed : seconds;
    p->s_per_byte = t / b;
  } else if (wire >= fixed) {
    double t = seconds > fixed ? seconds - fixed : 0; /* 0 clamps to est / 4 */
    p->s_per_byte = follow(p->s_per_byte, t / b, 1.0);
  } else {
    double t = seconds > wire ? seconds - wire : 0;
    p->latency_s = follow(p->latency_s, t / n_transfers, 1.0);
  }
  p->samples++;
}

void kvt__calib_hw(const kvt__calib *c, kvt_hw_desc *out) {
  if (!c || !out) return;
  *out = c->nominal;
  double peak = out->num_gpus * out->flops_per_gpu;
  if (c->s_per_flop > 0 && peak > 0) out->mfu = 1.0 / (c->s_per_flop * peak);
  kvt_link *links[KVT_CALIB_NPATHS] = {&out->device_host, &out->host_disk, &out->host_remote};
  for (int i = 0; i < KVT_CALIB_NPATHS; i++) {
    if (c->path[i].s_per_byte > 0) links[i]->bytes_per_s = 1.0 / c->path[i].s_per_byte;
    links[i]->latency_s = c->path[i].latency_s;
  }
}
