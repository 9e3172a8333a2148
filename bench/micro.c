/* kvtier-bench micro: each hot path next to the machine's own limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_SECTIONS 16
#define MAX_ROWS 128

static struct {
  const char *name;
  kvt_bench_micro_fn fn;
} sections[MAX_SECTIONS];
static int n_sections;

struct kvt_bench_rows {
  int n;
  struct {
    char section[32], name[64], unit[16], note[160];
    double value, limit, target;
    char detail[1024];
  } r[MAX_ROWS];
  const char *section;
};

void kvt_bench_micro_register(const char *name, kvt_bench_micro_fn fn) {
  if (n_sections < MAX_SECTIONS) {
    sections[n_sections].name = name;
    sections[n_sections].fn = fn;
    n_sections++;
  }
}

void kvt_bench_row(kvt_bench_rows *rows, const char *name, const char *unit, double value,
                   double limit, double target, const char *note) {
  if (rows->n >= MAX_ROWS) return;
  int i = rows->n++;
  snprintf(rows->r[i].section, sizeof rows->r[i].section, "%s", rows->section);
  snprintf(rows->r[i].name, sizeof rows->r[i].name, "%s", name);
  snprintf(rows->r[i].unit, sizeof rows->r[i].unit, "%s", unit);
  snprintf(rows->r[i].note, sizeof rows->r[i].note, "%s", note ? note : "");
  rows->r[i].value = value;
  rows->r[i].limit = limit;
  rows->r[i].target = target;
  rows->r[i].detail[0] = 0;
}

void kvt_bench_row_detail(kvt_bench_rows *rows, const char *detail) {
  if (rows->n > 0) snprintf(rows->r[rows->n - 1].detail, sizeof rows->r[0].detail, "%s", detail);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static int micro_main(int argc, char **argv) {
  kvt_bench_micro_opts o = {.quick = 0, .dir = NULL, .seconds = 0.5};
  int json = 0;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--quick")) o.quick = 1;
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) o.dir = argv[++i];
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) o.seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--help")) {
      printf("kvtier-bench micro [--json] [--quick] [--dir DIR] [--seconds S] [--only SECTION]\n"
             "sections:");
      for (int s = 0; s < n_sections; s++) printf(" %s", sections[s].name);
      printf("\n");
      return 0;
    } else {
      fprintf(stderr, "micro: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  static kvt_bench_rows rows;
  int rc = 0;
  for (int s = 0; s < n_sections; s++) {
    if (only && strcmp(only, sections[s].name)) continue;
    rows.section = sections[s].name;
    kvt_bench_progress(sections[s].name, (double)s / n_sections);
    int r = sections[s].fn(&o, &rows);
    if (r < 0) {
      fprintf(stderr, "micro: section %s failed (%d)\n", sections[s].name, r);
      rc = 1;
    }
  }
  kvt_bench_progress_done();
  if (json) {
    printf("[");
    for (int i = 0; i < rows.n; i++) {
      double ratio = rows.r[i].limit > 0 ? rows.r[i].value / rows.r[i].limit : 0;
      printf("%s\n {\"section\":", i ? "," : "");
      json_str(stdout, rows.r[i].section);
      printf(",\"name\":");
      json_str(stdout, rows.r[i].name);
      printf(",\"unit\":");
      json_str(stdout, rows.r[i].unit);
      printf(",\"value\":%.6g,\"limit\":%.6g,\"ratio\":%.4f,\"target\":%.3g,\"note\":", rows.r[i].value,
             rows.r[i].limit, ratio, rows.r[i].target);
      json_str(stdout, rows.r[i].note);
      if (rows.r[i].detail[0]) printf(",\"detail\":"), json_str(stdout, rows.r[i].detail);
      printf("}");
    }
    printf("\n]\n");
    return rc;
  }
  printf("%-10s %-40s %12s %12s %-8s %6s %7s  %s\n", "section", "measure", "value", "limit", "unit",
         "ratio", "target", "note");
  for (int i = 0; i < rows.n; i++) {
    double ratio = rows.r[i].limit > 0 ? rows.r[i].value / rows.r[i].limit : 0;
    const char *mark = rows.r[i].target > 0 ? (ratio >= rows.r[i].target ? " ok" : " MISSED") : "";
    char tgt[16] = "-";
    if (rows.r[i].target > 0) snprintf(tgt, sizeof tgt, ">=%.2g", rows.r[i].target);
    printf("%-10s %-40s %12.4g %12.4g %-8s %6.3f %7s%s  %s\n", rows.r[i].section, rows.r[i].name,
           rows.r[i].value, rows.r[i].limit, rows.r[i].unit, ratio, tgt, mark, rows.r[i].note);
  }
  return rc;
}

KVT_BENCH_COMMAND(micro, "hot paths next to the machine's limits (hash, map, host copy, disk, GPU)",
                  micro_main)
