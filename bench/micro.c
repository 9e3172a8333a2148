/* kvtier-bench micro: each hot path next to the machine's own limit. */
#include <errno.h>
#include <math.h>
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
    char section[32], name[64], unit[16], note[400];
    double value, limit, target;
    int upper; /* target is an upper bound on the ratio */
    char detail[1536];
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
  rows->r[i].upper = 0;
  rows->r[i].detail[0] = 0;
}

void kvt_bench_row_max(kvt_bench_rows *rows, const char *name, const char *unit, double value, double limit,
                       double target, const char *note) {
  int before = rows->n;
  kvt_bench_row(rows, name, unit, value, limit, target, note);
  if (rows->n > before) rows->r[before].upper = 1;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double kvt_bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
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

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvtier-bench micro [--only SECTION] [--seconds S] [--quick] [--dir DIR] [--remote URL] [--json]\n\n"
          "Each hot path of kvtier next to the machine's own limit for the same work, measured\n"
          "in the same run, so the ratio means the same on any machine.\n\n"
          "sections (all by default):\n"
          "  gpu    CUDA backend copies vs cudaMemcpy (details: kvtier-bench gpu; needs a GPU)\n"
          "  hash   chained block keys (kvt_hash_tokens) vs raw XXH3_128 over the same bytes\n"
          "  map    kvt_lookup and acquire/release of device hits (blocks per CPU-second), and\n"
          "         16-block acquire latency with 256 live requests vs none\n"
          "  host   host-tier stores and loads (host backend) vs memcpy of the same blocks\n"
          "  disk   disk spill and fetch+verify vs raw O_DIRECT io_uring on the same file\n"
          "  storage storage mode: put-from / get-into of 2 MiB blocks vs raw O_DIRECT io_uring,\n"
          "         and kvt_exists over 1M resident keys\n"
          "  metrics acquire+release and host copies with counting on vs compiled out\n"
          "  restore restore_disk: a 10,000-token Llama-3-8B-shaped conversation from disk to the\n"
          "         device tier vs max(raw io_uring read of its records, memcpy of its pieces)\n"
          "  remote remote tier: put and get of 2 MiB records through kvtier's client vs a raw\n"
          "         hiredis pipeline of the same records to the same servers (--remote URL, else\n"
          "         a redis-server it starts itself when one is installed)\n\n"
          "  --only SECTION   run one section\n"
          "  --seconds S      target time per measurement, 0 < S <= 60 (0.5)\n"
          "  --quick          smaller sizes (a quick check, less stable figures)\n"
          "  --dir DIR        where the disk section puts its file (the system's temporary dir)\n"
          "  --remote URL     the remote section's store: redis://[user[:password]@]host:port[,...]\n"
          "  --json           one JSON array of rows\n\n"
          "Columns: value and limit in `unit`; ratio = value / limit (for cpu-s/GB, lower is\n"
          "better); target = the ratio kvtier aims for; ok or MISSED against it. The line under\n"
          "each row says how the limit was measured.\n");
}

static int has_section(const char *name) {
  for (int s = 0; s < n_sections; s++)
    if (!strcmp(sections[s].name, name)) return 1;
  return 0;
}

static int parse_seconds(const char *v, double *out) {
  char *end;
  errno = 0;
  double d = v ? strtod(v, &end) : 0;
  if (!v || !*v || errno || *end || !isfinite(d) || d <= 0 || d > 60) {
    fprintf(stderr, "kvtier-bench micro: --seconds '%s': expected a number of seconds, 0 < S <= 60\n",
            v ? v : "");
    return -1;
  }
  *out = d;
  return 0;
}

/* Why a row can miss its target, in terms of what the section measures;
 * printed once per section that missed. */
static const char *missed_reason(const char *section) {
  if (!strcmp(section, "hash"))
    return "kvtier hashes each block separately, chained to its parent's key, so it pays a call\n"
           "and a key per block; the limit streams the same bytes through XXH3 without that.";
  if (!strcmp(section, "map"))
    return "the cache's metadata lock and tier-map work per block cost more than the goal\n"
           "on this CPU (rates are per second of the thread's own CPU time, so other load\n"
           "lowers them only through the caches it shares; a slow CPU lowers them too).";
  if (!strcmp(section, "host"))
    return "kvtier copies each block as per-layer K and V pieces (so a restore can start computing\n"
           "layer by layer): 1 KiB pieces at 64 KiB blocks; memcpy of whole blocks moves the same\n"
           "bytes in fewer, larger copies. The 'memcpy layer-major' row is plain memcpy in\n"
           "kvtier's copy order. memcpy speed also varies with other load on a shared machine.";
  if (!strcmp(section, "disk"))
    return "small records pay per-record work (header, checksum, submission) that raw io_uring\n"
           "does not; the cpu-s/GB rows show where the time goes. A shared or throttled disk\n"
           "varies from run to run: compare the raw rounds in the note.";
  if (!strcmp(section, "restore"))
    return "a restore reads every record, verifies it, then copies its 64 pieces to the device; the\n"
           "limit is the slower of the raw read and the copy alone, so it is met only when copies\n"
           "overlap the reads. The acquire row: kvt_acquire must not wait for any disk read.";
  if (!strcmp(section, "storage"))
    return "kvtier checksums every block it writes or reads, so it reads each block's memory once\n"
           "more than raw I/O does. Where the disk is itself software sharing the host's memory\n"
           "(a virtual machine's disk copies every block), those reads slow the disk: the note's\n"
           "'checksumming' figure is raw I/O doing only that, and shows what it costs here.";
  if (!strcmp(section, "gpu")) return "see kvtier-bench gpu for the per-path figures.";
  if (!strcmp(section, "remote"))
    return "kvtier seals (put) or verifies (get) each record's checksums and routes it by slot;\n"
           "the raw pipeline does neither. A server on the same machine shares its CPUs with both.";
  if (!strcmp(section, "metrics"))
    return "both builds ran the same calls in alternating rounds; on a loaded machine one round's\n"
           "noise can exceed the cost of counting: run it again with a longer --seconds.";
  return "see the row's note.";
}

static void print_note(const char *note) {
  /* Wrapped to 100 columns under the row, indented. */
  const int indent = 6, width = 100 - indent;
  const char *p = note;
  while (*p) {
    int n = (int)strlen(p);
    if (n > width) {
      n = width;
      while (n > 0 && p[n] != ' ') n--;
      if (n == 0) n = width;
    }
    printf("%*s%.*s\n", indent, "", n, p);
    p += n;
    while (*p == ' ') p++;
  }
}

static int micro_main(int argc, char **argv) {
  kvt_bench_micro_opts o = {.quick = 0, .dir = NULL, .seconds = 0.5};
  int json = 0;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) json = 1;
    else if (!strcmp(a, "--quick")) o.quick = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!v && (!strcmp(a, "--dir") || !strcmp(a, "--seconds") || !strcmp(a, "--only") ||
                      !strcmp(a, "--remote"))) {
      fprintf(stderr, "kvtier-bench micro: %s needs a value\n", a);
      return 2;
    } else if (!strcmp(a, "--dir")) o.dir = argv[++i];
    else if (!strcmp(a, "--remote")) o.remote = argv[++i];
    else if (!strcmp(a, "--seconds")) {
      if (parse_seconds(argv[++i], &o.seconds)) return 2;
    } else if (!strcmp(a, "--only")) {
      only = argv[++i];
      if (!has_section(only)) {
        fprintf(stderr, "kvtier-bench micro: --only '%s': no such section; the sections are:", only);
        for (int s = 0; s < n_sections; s++) fprintf(stderr, " %s", sections[s].name);
        fprintf(stderr, "\n");
        return 2;
      }
    } else {
      fprintf(stderr, "kvtier-bench micro: unknown option '%s' (see kvtier-bench micro --help)\n", a);
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
      fprintf(stderr, "kvtier-bench micro: section %s failed: %s\n", sections[s].name, kvt_strerror(r));
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
      printf(",\"value\":%.6g,\"limit\":%.6g,\"ratio\":%.4f,\"target\":%.3g,%s\"note\":", rows.r[i].value,
             rows.r[i].limit, ratio, rows.r[i].target, rows.r[i].upper ? "\"target_is_max\":true," : "");
      json_str(stdout, rows.r[i].note);
      if (rows.r[i].detail[0]) printf(",\"detail\":"), json_str(stdout, rows.r[i].detail);
      printf("}");
    }
    printf("\n]\n");
    return rc;
  }
  /* 100 columns: the row, then its note wrapped underneath. */
  printf("%-5s %-44s %9s %9s %-8s %6s %6s\n", "sect.", "measure", "value", "limit", "unit", "ratio", "target");
  char missed[MAX_SECTIONS][32];
  int n_missed = 0;
  for (int i = 0; i < rows.n; i++) {
    double ratio = rows.r[i].limit > 0 ? rows.r[i].value / rows.r[i].limit : 0;
    int miss = rows.r[i].target > 0 && (rows.r[i].upper ? ratio > rows.r[i].target : ratio < rows.r[i].target);
    const char *mark = rows.r[i].target > 0 ? (miss ? " MISSED" : " ok") : "";
    char tgt[16] = "-";
    if (rows.r[i].target > 0) snprintf(tgt, sizeof tgt, "%s%.2g", rows.r[i].upper ? "<=" : ">=", rows.r[i].target);
    printf("%-5s %-44.44s %9.4g %9.4g %-8s %6.3f %6s%s\n", rows.r[i].section, rows.r[i].name, rows.r[i].value,
           rows.r[i].limit, rows.r[i].unit, ratio, tgt, mark);
    if (rows.r[i].note[0]) print_note(rows.r[i].note);
    int seen = 0;
    for (int m = 0; m < n_missed; m++) seen |= !strcmp(missed[m], rows.r[i].section);
    if (miss && !seen && n_missed < MAX_SECTIONS)
      snprintf(missed[n_missed++], sizeof missed[0], "%s", rows.r[i].section);
  }
  if (n_missed) printf("\nMISSED: the ratio is below what kvtier aims for on this machine. Why, by section:\n");
  for (int m = 0; m < n_missed; m++) {
    printf("  %s:\n", missed[m]);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", missed_reason(missed[m]));
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) printf("    %s\n", line);
  }
  return rc;
}

KVT_BENCH_COMMAND(micro, "hot paths next to the machine's limits (hash, map, host copy, disk, GPU)",
                  micro_main)
