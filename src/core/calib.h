/* Online calibration of the cost model: measured prefills and transfers
 * pull the hardware description toward the machine the library runs on.
 *
 * Pure logic: no clock, no I/O, no allocation, no lock of its own. The
 * engine owns one kvt__calib, calls these under its metadata lock and hands
 * kvt__calib_hw()'s result to kvt_cost_plan.
 *
 * Scheme: each rate is kept as its inverse (seconds per FLOP, seconds per
 * byte) in an exponentially weighted moving average, because the planner
 * predicts times and a mean of times is the unbiased predictor of a time;
 * it also reacts to a collapse within a few samples. Each sample is first
 * clamped to [1/4, 4] x the current estimate so one descheduled thread or a
 * first-use warm-up cannot swing a plan. Transfers are split between the
 * two terms of latency + bytes / bandwidth: a sample updates the term that
 * dominates its predicted time, the other term taken from the estimate. */
#ifndef KVT_CORE_CALIB_H
#define KVT_CORE_CALIB_H

#include <stdint.h>

#include "kvtier/cost.h"

/* Transfer paths (kvt__calib_observe_transfer's `path`). */
#define KVT_CALIB_DEVICE_HOST 0 /* either direction across PCIe */
#define KVT_CALIB_HOST_DISK 1   /* either direction to or from the disk tier */
#define KVT_CALIB_HOST_REMOTE 2 /* fetches from the remote tier into the host */
#define KVT_CALIB_NPATHS 3

/* EWMA weight of one full-weight sample. */
#define KVT_CALIB_ALPHA 0.2
/* A sample is clamped to [est / CLAMP, est * CLAMP] before it is averaged. */
#define KVT_CALIB_CLAMP 4.0
/* Prefills shorter than this many tokens weigh proportionally less: short
 * forwards are bound by reading the weights, not by FLOPs, and would drag
 * the FLOP rate the planner uses for long recomputes down. */
#define KVT_CALIB_FULL_WEIGHT_TOKENS 128

typedef struct kvt__calib_path {
  double s_per_byte;  /* 1 / bandwidth; 0 = unknown, the first sample sets it */
  double latency_s;   /* per submission */
  uint64_t samples;   /* accepted samples */
} kvt__calib_path;

typedef struct kvt__calib {
  kvt_hw_desc nominal;  /* as given at init: GPUs, peak, overlap come from here */
  double s_per_flop;    /* 1 / achieved FLOP/s; 0 = unknown */
  uint64_t prefill_samples;
  kvt__calib_path path[KVT_CALIB_NPATHS];
  uint64_t ignored;     /* degenerate samples dropped (0 bytes, time <= 0, NaN...) */
} kvt__calib;

void kvt__calib_init(kvt__calib *c, const kvt_model_desc *m, const kvt_hw_desc *hw);

/* The engine measured a prefill of tokens [from, to) with a cached prefix of
 * `from` tokens, taking `seconds`. The achieved FLOP/s (the model's FLOPs
 * for that range over the time) moves the compute estimate. */
void kvt__calib_observe_prefill(kvt__calib *c, const kvt_model_desc *m, uint64_t from, uint64_t to,
                                double seconds);

/* The library measured a transfer on `path` (KVT_CALIB_*): n_transfers
 * submissions moving `bytes` in `seconds` of wall time. n_transfers counts
 * the fixed costs the time contains: for submissions that ran concurrently
 * (an io_uring queue) pass the number of rounds, not of I/Os. */
void kvt__calib_observe_transfer(kvt__calib *c, int path, uint64_t bytes, uint32_t n_transfers,
                                 double seconds);

/* The calibrated hardware description: equal to init's hw until samples
 * arrive. The compute estimate is expressed as mfu (achieved / (GPUs x
 * peak)), which may exceed 1 when the nominal peak was set too low. */
void kvt__calib_hw(const kvt__calib *c, kvt_hw_desc *out);

#endif
