/* A Prometheus text-format (0.0.4) parser for the tests: every line must be
 * a HELP, a TYPE or a sample with a valid name, labels and value, under the
 * family its TYPE declared; histograms must be cumulative with +Inf equal to
 * _count. Fails the running cmocka test at the first bad line. */
#ifndef KVT_TEST_PROM_PARSE_H
#define KVT_TEST_PROM_PARSE_H
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define MAX_SAMPLES 512

typedef struct sample {
  char name[96], labels[192]; /* labels as written, without the braces ("" if none) */
  double value;
} sample;

typedef struct expo {
  sample s[MAX_SAMPLES];
  int n;
  char text[65536];
} expo;

static inline int name_ok(const char *p, size_t n, int colon) {
  if (n == 0 || !(isalpha((unsigned char)p[0]) || p[0] == '_' || (colon && p[0] == ':'))) return 0;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)p[i]) || p[i] == '_' || (colon && p[i] == ':'))) return 0;
  return 1;
}

/* Checks `labels` (between braces) is name="value"{,name="value"}; returns 1 if so. */
static inline int labels_ok(const char *p) {
  while (*p) {
    const char *eq = strchr(p, '=');
    if (!eq || !name_ok(p, (size_t)(eq - p), 0) || eq[1] != '"') return 0;
    p = eq + 2;
    while (*p && *p != '"') {
      if (*p == '\\') {
        if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') return 0;
        p++;
      }
      if (*p == '\n') return 0;
      p++;
    }
    if (*p != '"') return 0;
    p++;
    if (*p == ',') p++;
    else if (*p) return 0;
  }
  return 1;
}

static inline const char *family_of(const char *name, const char *fam, const char *type) {
  size_t n = strlen(fam);
  if (strncmp(name, fam, n)) return NULL;
  if (!name[n]) return strcmp(type, "histogram") ? name : NULL;
  if (strcmp(type, "histogram")) return NULL;
  return !strcmp(name + n, "_bucket") || !strcmp(name + n, "_sum") || !strcmp(name + n, "_count") ? name : NULL;
}

/* Parses the text format line by line; fails the test at the first bad line. */
static inline void parse_prometheus(const char *text, expo *e) {
  char fam[96] = "", type[16] = "";
  char seen_help[96][96];
  int n_help = 0;
  e->n = 0;
  const char *line = text;
  assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
  while (*line) {
    const char *end = strchr(line, '\n');
    assert_non_null(end);
    char buf[512];
    size_t len = (size_t)(end - line);
    assert_true(len > 0 && len < sizeof buf);
    memcpy(buf, line, len);
    buf[len] = 0;
    line = end + 1;
    if (!strncmp(buf, "# HELP ", 7)) {
      char *sp = strchr(buf + 7, ' ');
      assert_non_null(sp);
      assert_true(name_ok(buf + 7, (size_t)(sp - buf - 7), 1));
      assert_true(strlen(sp + 1) > 0);
      *sp = 0;
      for (int i = 0; i < n_help; i++) assert_string_not_equal(seen_help[i], buf + 7); /* once per family */
      snprintf(seen_help[n_help++], sizeof seen_help[0], "%s", buf + 7);
      continue;
    }
    if (!strncmp(buf, "# TYPE ", 7)) {
      char *sp = strchr(buf + 7, ' ');
      assert_non_null(sp);
      *sp = 0;
      assert_true(name_ok(buf + 7, strlen(buf + 7), 1));
      assert_string_equal(seen_help[n_help - 1], buf + 7); /* HELP came first */
      const char *t = sp + 1;
      assert_true(!strcmp(t, "counter") || !strcmp(t, "gauge") || !strcmp(t, "histogram"));
      if (!strcmp(t, "counter")) assert_non_null(strstr(buf + 7, "_total")); /* counters end in _total */
      snprintf(fam, sizeof fam, "%s", buf + 7);
      snprintf(type, sizeof type, "%s", t);
      continue;
    }
    assert_true(buf[0] != '#'); /* no other comments from kvtier */
    /* name{labels} value */
    size_t nl = strcspn(buf, "{ ");
    assert_true(name_ok(buf, nl, 1));
    assert_true(e->n < MAX_SAMPLES);
    sample *s = &e->s[e->n++];
    snprintf(s->name, sizeof s->name, "%.*s", (int)nl, buf);
    assert_non_null(family_of(s->name, fam, type)); /* under its family's TYPE */
    const char *p = buf + nl;
    s->labels[0] = 0;
    if (*p == '{') {
      const char *close = strstr(p, "} ");
      assert_non_null(close);
      snprintf(s->labels, sizeof s->labels, "%.*s", (int)(close - p - 1), p + 1);
      assert_true(labels_ok(s->labels));
      p = close + 1;
    }
    assert_true(*p == ' ');
    p++;
    char *vend;
    s->value = strtod(p, &vend);
    assert_true(vend != p && *vend == 0);
    assert_false(isnan(s->value));
    if (strcmp(type, "gauge")) assert_true(s->value >= 0);
  }
}

static inline double value_of(const expo *e, const char *name, const char *labels) {
  for (int i = 0; i < e->n; i++)
    if (!strcmp(e->s[i].name, name) && !strcmp(e->s[i].labels, labels ? labels : "")) return e->s[i].value;
  fail_msg("no sample %s{%s}", name, labels ? labels : "");
  return -1;
}

/* Every histogram: per label set, buckets in increasing le, counts
 * cumulative, the last le="+Inf" and equal to _count; _sum present. */
static inline void check_histograms(const expo *e) {
  for (int i = 0; i < e->n; i++) {
    const char *suffix = strstr(e->s[i].name, "_count");
    if (!suffix || suffix[6]) continue;
    char base[96], want[256];
    snprintf(base, sizeof base, "%.*s", (int)(suffix - e->s[i].name), e->s[i].name);
    snprintf(want, sizeof want, "%s_bucket", base);
    double prev_le = -INFINITY, prev = 0;
    int buckets = 0, inf = 0;
    for (int k = 0; k < e->n; k++) {
      if (strcmp(e->s[k].name, want)) continue;
      const char *le = strstr(e->s[k].labels, "le=\"");
      assert_non_null(le);
      if (strncmp(e->s[k].labels, e->s[i].labels, strlen(e->s[i].labels))) continue; /* another label set */
      double bound = !strncmp(le + 4, "+Inf", 4) ? INFINITY : strtod(le + 4, NULL);
      assert_true(bound > prev_le);
      assert_true(e->s[k].value >= prev);
      prev_le = bound;
      prev = e->s[k].value;
      buckets++;
      inf = isinf(bound);
    }
    assert_true(buckets >= 2);
    assert_true(inf);
    assert_true(prev == e->s[i].value);
    snprintf(want, sizeof want, "%s_sum", base);
    assert_true(value_of(e, want, e->s[i].labels) >= 0);
  }
}

#endif
