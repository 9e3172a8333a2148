/* kvtier-bench: shared pieces. Each subcommand file registers itself with
 * KVT_BENCH_COMMAND; main.c dispatches. Human tables go to stdout, progress
 * bars to stderr (only when it is a terminal), `--json` prints one object. */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H
#include <stdio.h>

typedef int (*kvt_bench_fn)(int argc, char **argv);

void kvt_bench_register(const char *name, const char *summary, kvt_bench_fn fn);

#define KVT_BENCH_COMMAND(name, summary, fn)                                   \
  __attribute__((constructor)) static void kvt_bench_register_##name(void) {   \
    kvt_bench_register(#name, summary, fn);                                    \
  }

/* Progress bar on stderr when it is a terminal; silent otherwise. */
void kvt_bench_progress(const char *label, double fraction);
void kvt_bench_progress_done(void);

#endif

/* ---- kvtier-bench micro: sections register rows of value vs limit ---- */
typedef struct kvt_bench_micro_opts {
  int quick;            /* --quick: smaller sizes (CI smoke) */
  const char *dir;      /* --dir: where disk sections put their file */
  double seconds;       /* --seconds: target time per measurement (0.5) */
} kvt_bench_micro_opts;

typedef struct kvt_bench_rows kvt_bench_rows;

/* One measured figure next to the limit it is bounded by, as measured in
 * the same run. ratio = value / limit (for "higher is better" units).
 * `target` is the ratio the issue asks for (0 = none); `note` says why a
 * missed target was missed, or how the limit was measured. */
void kvt_bench_row(kvt_bench_rows *rows, const char *name, const char *unit, double value,
                   double limit, double target, const char *note);

/* Longer detail for the row just added: printed in --json only. */
void kvt_bench_row_detail(kvt_bench_rows *rows, const char *detail);

typedef int (*kvt_bench_micro_fn)(const kvt_bench_micro_opts *opts, kvt_bench_rows *rows);
void kvt_bench_micro_register(const char *name, kvt_bench_micro_fn fn);

#define KVT_BENCH_MICRO(name, fn)                                              \
  __attribute__((constructor)) static void kvt_bench_micro_register_##name(void) { \
    kvt_bench_micro_register(#name, fn);                                       \
  }
