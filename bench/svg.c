/* SVG line charts for kvtier-bench sweep (see svg.h). */
#include "svg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#define PANEL_W 520.0
#define PANEL_H 400.0
#define MARGIN_L 70.0
#define MARGIN_R 45.0
#define MARGIN_T 40.0
#define LEGEND_Y 62.0 /* legend rows start this far below the x axis */

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf",
                                     "#7f7f7f"};

static void esc(FILE *f, const char *s) {
  for (; s && *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else fputc(*s, f);
  }
}

/* A "nice" tick step for a range split in about n steps. */
static double nice_step(double range, int n) {
  double raw = range / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static void y_range(const kvt_bench_svg_panel *p, double *lo, double *hi, double *step) {
  *lo = p->ymin;
  *hi = p->ymax;
  if (*lo == *hi) {
    *lo = 0;
    *hi = 0;
    for (size_t s = 0; s < p->n_series; s++)
      for (size_t i = 0; i < p->n_x; i++)
        if (isfinite(p->series[s].y[i]) && p->series[s].y[i] > *hi) *hi = p->series[s].y[i];
    if (*hi <= 0) *hi = 1;
  }
  *step = nice_step(*hi - *lo, 5);
  *lo = floor(*lo / *step + 1e-9) * *step; /* ticks at multiples of the step */
  *hi = *lo + ceil((*hi - *lo) / *step - 1e-9) * *step;
}

static void panel(FILE *f, const kvt_bench_svg_panel *p, double ox, double oy) {
  double w = PANEL_W - MARGIN_L - MARGIN_R, h = PANEL_H - MARGIN_T - 60.0, x0 = ox + MARGIN_L, y0 = oy + MARGIN_T;
  double lo, hi, step;
  y_range(p, &lo, &hi, &step);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">", x0 + w / 2,
          oy + 24);
  esc(f, p->title);
  fprintf(f, "</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", x0, y0,
          w, h);
  for (double v = lo; v <= hi + step * 1e-6; v += step) { /* y ticks and grid */
    double y = y0 + h - (v - lo) / (hi - lo) * h;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, y, x0 + w, y);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">%g</text>\n", x0 - 6, y + 4, v);
  }
  double dx = p->n_x > 1 ? w / (double)(p->n_x - 1) : 0;
  for (size_t i = 0; i < p->n_x; i++) { /* x ticks */
    double x = p->n_x > 1 ? x0 + dx * (double)i : x0 + w / 2;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, y0 + h, x, y0 + h + 5);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">", x, y0 + h + 19);
    esc(f, p->xticks[i]);
    fputs("</text>\n", f);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">", x0 + w / 2, y0 + h + 40);
  esc(f, p->xlabel);
  fprintf(f, "</text>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" "
             "transform=\"rotate(-90 %.1f %.1f)\">", ox + 18, y0 + h / 2, ox + 18, y0 + h / 2);
  esc(f, p->ylabel);
  fputs("</text>\n", f);
  for (size_t s = 0; s < p->n_series; s++) {
    const kvt_bench_svg_series *se = &p->series[s];
    const char *col = colors[s % (sizeof colors / sizeof colors[0])];
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col,
            se->dashed ? " stroke-dasharray=\"6 4\"" : "");
    for (size_t i = 0; i < p->n_x; i++)
      if (isfinite(se->y[i]))
        fprintf(f, "%.1f,%.1f ", x0 + dx * (double)i, y0 + h - (se->y[i] - lo) / (hi - lo) * h);
    fputs("\"/>\n", f);
    for (size_t i = 0; !se->dashed && i < p->n_x; i++)
      if (isfinite(se->y[i]))
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x0 + dx * (double)i,
                y0 + h - (se->y[i] - lo) / (hi - lo) * h, col);
    double ly = y0 + h + LEGEND_Y + 18.0 * (double)s; /* legend below the axis */
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", x0, ly,
            x0 + 28, ly, col, se->dashed ? " stroke-dasharray=\"6 4\"" : "");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", x0 + 36, ly + 4);
    esc(f, se->label);
    fputs("</text>\n", f);
  }
}

int kvt_bench_svg_write(const char *path, const char *title, const char *subtitle,
                        const kvt_bench_svg_panel *panels, size_t n_panels) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  size_t max_series = 0;
  for (size_t i = 0; i < n_panels; i++)
    if (panels[i].n_series > max_series) max_series = panels[i].n_series;
  double W = PANEL_W * (double)n_panels, H = 50 + MARGIN_T + (PANEL_H - MARGIN_T - 60) + LEGEND_Y + 18.0 * (double)max_series + 10;
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
             "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fprintf(f, "<text x=\"%.1f\" y=\"24\" font-size=\"17\" font-weight=\"bold\" text-anchor=\"middle\">", W / 2);
  esc(f, title);
  fprintf(f, "</text>\n<text x=\"%.1f\" y=\"44\" font-size=\"12\" fill=\"#555\" text-anchor=\"middle\">", W / 2);
  esc(f, subtitle);
  fputs("</text>\n", f);
  for (size_t i = 0; i < n_panels; i++) panel(f, &panels[i], PANEL_W * (double)i, 50);
  fputs("</svg>\n", f);
  int rc = ferror(f) ? -EIO : 0;
  if (fclose(f) != 0 && rc == 0) rc = -errno;
  return rc;
}
