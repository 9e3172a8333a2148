/* kvtier-bench: shared pieces. Each subcommand file registers itself with
 * KVT_BENCH_COMMAND; main.c dispatches. Human tables go to stdout, progress
 * bars to stderr (only when it is a terminal), `--json` prints one object. */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H
#include <stdio.h>

#include "kvtier/kvtier.h"

typedef int (*kvt_bench_fn)(int argc, char **argv);

void kvt_bench_register(const char *name, const char *summary, kvt_bench_fn fn);

#define KVT_BENCH_COMMAND(name, summary, fn)                                   \
  __attribute__((constructor)) static void kvt_bench_register_##name(void) {   \
    kvt_bench_register(#name, summary, fn);                                    \
  }

/* Progress bar on stderr when it is a terminal; silent otherwise. */
void kvt_bench_progress(const char *label, double fraction);
void kvt_bench_progress_done(void);

/* ---- hardware flags shared by cost, replay and sweep (hwflags.c) ---- */
extern const char kvt_bench_hw_usage[];
/* 1: opt is a flag without a value (--overlap, --no-overlap); 2: a flag that
 * takes a value; 0: not a hardware flag. */
int kvt_bench_hw_flag(const char *opt);
/* Applies opt (and its value v) to hw; prints the error for command cmd and
 * returns -1 on a bad value. */
int kvt_bench_hw_option(const char *cmd, const char *opt, const char *v, kvt_hw_desc *hw);
void kvt_bench_hw_print(FILE *f, const char *indent, const kvt_hw_desc *hw);
void kvt_bench_hw_json(FILE *f, const kvt_hw_desc *hw); /* "hardware":{...} */

#endif

/* ---- kvtier-bench micro: sections register rows of value vs limit ---- */
typedef struct kvt_bench_micro_opts {
  int quick;            /* --quick: smaller sizes (CI smoke) */
  const char *dir;      /* --dir: where disk sections put their file */
  double seconds;       /* --seconds: target time per measurement (0.5) */
  const char *remote;   /* --remote: a Redis server or cluster for the remote section */
} kvt_bench_micro_opts;

typedef struct kvt_bench_rows kvt_bench_rows;

/* One measured figure next to the limit it is bounded by, as measured in
 * the same run. ratio = value / limit (for "higher is better" units).
 * `target` is the ratio kvtier aims for (0 = none); `note` says why a
 * missed target was missed, or how the limit was measured. */
void kvt_bench_row(kvt_bench_rows *rows, const char *name, const char *unit, double value,
                   double limit, double target, const char *note);

/* The same for a figure whose ratio must stay at or below `target`. */
void kvt_bench_row_max(kvt_bench_rows *rows, const char *name, const char *unit, double value,
                       double limit, double target, const char *note);

/* The median of v[0..n), n > 0 (v[n / 2] once sorted: for odd n, a value
 * that was measured); sorts v in place. */
double kvt_bench_median(double *v, int n);

/* Longer detail for the row just added: printed in --json only. */
void kvt_bench_row_detail(kvt_bench_rows *rows, const char *detail);
/* 1 when the kernel backs all of [p, p+n) with transparent huge pages
 * (micro_disk.c). */
int kvt_bench_huge_pages(const void *p, size_t n);

typedef int (*kvt_bench_micro_fn)(const kvt_bench_micro_opts *opts, kvt_bench_rows *rows);
void kvt_bench_micro_register(const char *name, kvt_bench_micro_fn fn);

#define KVT_BENCH_MICRO(name, fn)                                              \
  __attribute__((constructor)) static void kvt_bench_micro_register_##name(void) { \
    kvt_bench_micro_register(#name, fn);                                       \
  }
