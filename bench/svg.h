/* A small SVG line-chart writer for kvtier-bench sweep: panels side by
 * side, each with axes, ticks, labels, a legend and one line per series. */
#ifndef KVT_BENCH_SVG_H
#define KVT_BENCH_SVG_H

#include <stddef.h>

typedef struct kvt_bench_svg_series {
  const char *label;
  const double *y; /* one value per x position; NaN = no point */
  int dashed;      /* baselines */
} kvt_bench_svg_series;

typedef struct kvt_bench_svg_panel {
  const char *title, *xlabel, *ylabel;
  size_t n_x;                      /* x positions, evenly spaced */
  const char *const *xticks;       /* a label per x position */
  const kvt_bench_svg_series *series;
  size_t n_series;
  double ymin, ymax;               /* equal: from the data (ymin 0); ymin is rounded down to a tick */
} kvt_bench_svg_panel;

/* Writes the chart; returns 0 or -errno. */
int kvt_bench_svg_write(const char *path, const char *title, const char *subtitle,
                        const kvt_bench_svg_panel *panels, size_t n_panels);

#endif
