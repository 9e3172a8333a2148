/* Mooncake JSON-lines traces (cJSON) and the built-in multiround workload. */
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

void kvt_bench_trace_init(kvt_bench_trace *t, uint32_t block_tokens) {
  memset(t, 0, sizeof *t);
  t->block_tokens = block_tokens;
}

void kvt_bench_trace_free(kvt_bench_trace *t) {
  free(t->reqs);
  free(t->ids);
  uint32_t bt = t->block_tokens;
  kvt_bench_trace_init(t, bt);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap : 1024;
  while (n < need) n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = n;
  return 0;
}

/* Appends a request with room for n_ids ids; returns it or NULL. */
static kvt_bench_req *append_req(kvt_bench_trace *t, uint32_t n_ids) {
  if (grow((void **)&t->reqs, &t->cap_reqs, t->n_reqs + 1, sizeof *t->reqs) ||
      grow((void **)&t->ids, &t->cap_ids, t->n_ids + n_ids, sizeof *t->ids))
    return NULL;
  kvt_bench_req *r = &t->reqs[t->n_reqs++];
  memset(r, 0, sizeof *r);
  r->first_id = t->n_ids;
  r->n_ids = n_ids;
  t->n_ids += n_ids;
  if (n_ids > t->max_ids) t->max_ids = n_ids;
  return r;
}

__attribute__((format(printf, 2, 3))) static int fail(kvt_bench_trace_err *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err) vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

/* A non-negative integer that a double holds exactly. */
static int integral(double v) { return isfinite(v) && v >= 0 && v <= 9007199254740992.0 && v == floor(v); }

static int number_field(const cJSON *o, const char *name, double *out, kvt_bench_trace_err *err) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
  if (!f) return fail(err, "missing field \"%s\"", name);
  if (!cJSON_IsNumber(f)) return fail(err, "field \"%s\" is not a number", name);
  *out = f->valuedouble;
  if (!isfinite(*out)) return fail(err, "field \"%s\" is not finite", name);
  if (*out < 0) return fail(err, "field \"%s\" is negative (%g)", name, *out);
  return 0;
}

static int parse_object(kvt_bench_trace *t, const cJSON *o, kvt_bench_trace_err *err) {
  double ts, in, out;
  int rc;
  if (!cJSON_IsObject(o)) return fail(err, "not a JSON object");
  if ((rc = number_field(o, "timestamp", &ts, err)) || (rc = number_field(o, "input_length", &in, err)) ||
      (rc = number_field(o, "output_length", &out, err)))
    return rc;
  if (!integral(in) || in < 1) return fail(err, "field \"%s\" must be an integer >= 1 (%g)", "input_length", in);
  if (!integral(out)) return fail(err, "field \"%s\" must be an integer (%g)", "output_length", out);
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
  if (!ids) return fail(err, "missing field \"%s\"", "hash_ids");
  if (!cJSON_IsArray(ids)) return fail(err, "field \"%s\" is not an array", "hash_ids");
  uint64_t bt = t->block_tokens, want = ((uint64_t)in + bt - 1) / bt;
  int n = cJSON_GetArraySize(ids);
  if ((uint64_t)n != want) {
    if (err)
      snprintf(err->msg, sizeof err->msg,
               "hash_ids has %d ids, but input_length %.0f needs ceil(%.0f/%u) = %llu", n, in, in,
               (unsigned)bt, (unsigned long long)want);
    return -EINVAL;
  }
  size_t mark_reqs = t->n_reqs, mark_ids = t->n_ids;
  uint32_t mark_max = t->max_ids;
  kvt_bench_req *r = append_req(t, (uint32_t)n);
  if (!r) return -ENOMEM;
  r->t_s = ts / 1000.0;
  r->input_tokens = (uint64_t)in;
  r->output_tokens = (uint64_t)out;
  int i = 0;
  const cJSON *id;
  cJSON_ArrayForEach(id, ids) {
    if (!cJSON_IsNumber(id) || !integral(id->valuedouble)) {
      t->n_reqs = mark_reqs;
      t->n_ids = mark_ids;
      t->max_ids = mark_max;
      if (err)
        snprintf(err->msg, sizeof err->msg, "hash_ids[%d] is not an integer >= 0", i);
      return -EINVAL;
    }
    t->ids[r->first_id + (size_t)i++] = (uint64_t)id->valuedouble;
  }
  return 0;
}

int kvt_bench_trace_parse_line(kvt_bench_trace *t, const char *line, kvt_bench_trace_err *err) {
  if (!t || !line || t->block_tokens == 0) return -EINVAL;
  const char *end = NULL;
  cJSON *o = cJSON_ParseWithOpts(line, &end, 0);
  if (!o) {
    if (err) {
      size_t at = end ? (size_t)(end - line) : 0;
      snprintf(err->msg, sizeof err->msg, "invalid JSON near byte %zu", at + 1);
    }
    return -EINVAL;
  }
  for (; end && *end; end++)
    if (*end != ' ' && *end != '\t' && *end != '\r' && *end != '\n') {
      cJSON_Delete(o);
      if (err) snprintf(err->msg, sizeof err->msg, "trailing characters after the JSON object");
      return -EINVAL;
    }
  int rc = parse_object(t, o, err);
  cJSON_Delete(o);
  return rc;
}

static int blank(const char *s) {
  for (; *s; s++)
    if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return 0;
  return 1;
}

/* Reads one line (without its newline) into *buf. Returns its length, -1
 * at end of file, or a negative errno: -ENOMEM (a failed allocation is not
 * an end of file), -E2BIG (longer than KVT_BENCH_TRACE_MAX_LINE: /dev/zero
 * must not grow memory without bound), -EILSEQ (a NUL byte), or a read
 * error. */
static ssize_t read_line(FILE *f, char **buf, size_t *cap) {
  size_t n = 0;
  int ch;
  errno = 0;
  while ((ch = getc_unlocked(f)) != EOF && ch != '\n') {
    if (ch == 0) return -EILSEQ;
    if (n + 1 >= *cap) {
      if (*cap >= KVT_BENCH_TRACE_MAX_LINE) return -E2BIG;
      size_t want = *cap ? *cap * 2 : 4096;
      if (want > KVT_BENCH_TRACE_MAX_LINE) want = KVT_BENCH_TRACE_MAX_LINE;
      char *q = realloc(*buf, want);
      if (!q) return -ENOMEM;
      *buf = q;
      *cap = want;
    }
    (*buf)[n++] = (char)ch;
  }
  if (ferror(f)) return errno ? -errno : -EIO;
  if (ch == EOF && n == 0) return -1;
  if (!*buf && !(*buf = malloc(*cap = 4096))) return -ENOMEM;
  (*buf)[n] = '\0';
  return (ssize_t)n;
}

static int line_error(ssize_t len, kvt_bench_trace_err *err) {
  if (!err) return (int)len;
  if (len == -E2BIG)
    snprintf(err->msg, sizeof err->msg, "line longer than %u MiB", (unsigned)(KVT_BENCH_TRACE_MAX_LINE >> 20));
  else if (len == -EILSEQ)
    snprintf(err->msg, sizeof err->msg, "NUL byte inside the line");
  else
    return (int)len; /* an I/O or memory error: not the file's format */
  return -EINVAL;
}

static int open_trace(const char *path, FILE **out) {
  FILE *f = fopen(path, "r");
  if (!f) return -errno;
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fclose(f);
    return -EISDIR;
  }
  *out = f;
  return 0;
}

int kvt_bench_trace_load(const char *path, uint32_t block_tokens, kvt_bench_trace *t,
                         kvt_bench_trace_err *err) {
  if (!path || !t || !block_tokens) return -EINVAL;
  kvt_bench_trace_init(t, block_tokens);
  if (err) memset(err, 0, sizeof *err);
  FILE *f = NULL;
  int rc = open_trace(path, &f);
  if (rc) return rc;
  char *line = NULL;
  size_t cap = 0, lineno = 0;
  ssize_t len;
  while ((len = read_line(f, &line, &cap)) >= 0) {
    lineno++;
    if (blank(line)) continue;
    rc = kvt_bench_trace_parse_line(t, line, err);
    if (rc) break;
  }
  if (len < -1) {
    lineno++;
    rc = line_error(len, err);
  }
  if (rc && err && rc == -EINVAL) err->line = lineno;
  free(line);
  fclose(f);
  if (rc == 0 && t->n_reqs == 0) {
    rc = -EINVAL;
    if (err) snprintf(err->msg, sizeof err->msg, "no requests in the file");
  }
  if (rc) kvt_bench_trace_free(t);
  else {
    const char *base = strrchr(path, '/');
    snprintf(t->source, sizeof t->source, "trace %s", base ? base + 1 : path);
  }
  return rc;
}

/* ---- the multiround workload ---- */

void kvt_bench_multiround_init(kvt_bench_multiround *o) {
  o->users = 256;
  o->rounds = 8;
  o->system_tokens = 2048;
  o->question_tokens = 384;
  o->answer_tokens = 512;
  o->rate = 2.0;
  o->think_s = 20.0;
  o->block_tokens = 16;
  o->seed = 1;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Uniform in [mean/2, 3 mean/2], at least 1. */
static uint32_t around(uint64_t *s, uint32_t mean) {
  double v = mean * (0.5 + uniform01(s));
  return v < 1 ? 1 : (uint32_t)v;
}

typedef struct mr_user {
  uint64_t *blocks;  /* ids of the full blocks of its conversation so far */
  uint32_t n_blocks, cap;
  uint64_t hist_tokens; /* system prompt + earlier rounds */
  double next_t;
} mr_user;

typedef struct mr_pending {
  double t;
  uint32_t user, round;
  uint64_t first_id;
  uint32_t n_ids;
  uint64_t input, output;
} mr_pending;

static int by_time(const void *a, const void *b) {
  const mr_pending *x = a, *y = b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  if (x->user != y->user) return x->user < y->user ? -1 : 1;
  return x->round < y->round ? -1 : x->round > y->round;
}

/* Generates every round of one user into the scratch id list. */
static int gen_user(const kvt_bench_multiround *o, uint32_t u, mr_user *us, uint64_t *rng, uint64_t *next_id,
                    mr_pending *pend, uint64_t **scratch, size_t *n_scratch, size_t *cap_scratch) {
  uint32_t bt = o->block_tokens, sys_blocks = o->system_tokens / bt;
  us->cap = 64;
  us->blocks = malloc(us->cap * sizeof *us->blocks);
  if (!us->blocks) return -ENOMEM;
  for (uint32_t i = 0; i < sys_blocks; i++) {
    if (us->n_blocks == us->cap) {
      uint64_t *nb = realloc(us->blocks, 2 * us->cap * sizeof *nb);
      if (!nb) return -ENOMEM;
      us->blocks = nb;
      us->cap *= 2;
    }
    us->blocks[us->n_blocks++] = i; /* the shared system prompt's ids */
  }
  us->hist_tokens = o->system_tokens;
  us->next_t = u / o->rate;
  for (uint32_t r = 0; r < o->rounds; r++) {
    uint64_t input = us->hist_tokens + around(rng, o->question_tokens);
    uint32_t full = (uint32_t)(input / bt), n_ids = (uint32_t)((input + bt - 1) / bt);
    /* Blocks that became full this round get new ids; content only ever
     * grows, so a full block keeps its id for the rest of the conversation. */
    while (us->n_blocks < full) {
      if (us->n_blocks == us->cap) {
        uint64_t *nb = realloc(us->blocks, 2 * us->cap * sizeof *nb);
        if (!nb) return -ENOMEM;
        us->blocks = nb;
        us->cap *= 2;
      }
      us->blocks[us->n_blocks++] = (*next_id)++;
    }
    if (grow((void **)scratch, cap_scratch, *n_scratch + n_ids, sizeof **scratch)) return -ENOMEM;
    mr_pending *p = &pend[(size_t)u * o->rounds + r];
    p->t = us->next_t;
    p->user = u;
    p->round = r;
    p->first_id = *n_scratch;
    p->n_ids = n_ids;
    p->input = input;
    p->output = around(rng, o->answer_tokens);
    memcpy(*scratch + *n_scratch, us->blocks, (size_t)full * sizeof **scratch);
    if (n_ids > full) (*scratch)[*n_scratch + full] = (*next_id)++; /* the partial block: this round only */
    *n_scratch += n_ids;
    us->hist_tokens = input + p->output;
    us->next_t += -log(1.0 - uniform01(rng)) * o->think_s;
  }
  return 0;
}

int kvt_bench_multiround_make(const kvt_bench_multiround *o, kvt_bench_trace *t) {
  if (!o || !t || !o->users || !o->rounds || !o->block_tokens || !(o->rate > 0) || o->think_s < 0) return -EINVAL;
  kvt_bench_trace_init(t, o->block_tokens);
  size_t n = (size_t)o->users * o->rounds;
  mr_pending *pend = calloc(n, sizeof *pend);
  mr_user us;
  uint64_t rng = o->seed, next_id = o->system_tokens / o->block_tokens, *scratch = NULL;
  size_t n_scratch = 0, cap_scratch = 0;
  int rc = pend ? 0 : -ENOMEM;
  for (uint32_t u = 0; rc == 0 && u < o->users; u++) {
    memset(&us, 0, sizeof us);
    rc = gen_user(o, u, &us, &rng, &next_id, pend, &scratch, &n_scratch, &cap_scratch);
    free(us.blocks);
  }
  if (rc == 0) qsort(pend, n, sizeof *pend, by_time);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    kvt_bench_req *r = append_req(t, pend[i].n_ids);
    if (!r) {
      rc = -ENOMEM;
      break;
    }
    r->t_s = pend[i].t;
    r->input_tokens = pend[i].input;
    r->output_tokens = pend[i].output;
    memcpy(t->ids + r->first_id, scratch + pend[i].first_id, (size_t)pend[i].n_ids * sizeof *t->ids);
  }
  free(pend);
  free(scratch);
  if (rc) kvt_bench_trace_free(t);
  else
    snprintf(t->source, sizeof t->source, "multiround %u users x %u rounds, system %u, q %u, a %u tokens",
             o->users, o->rounds, o->system_tokens, o->question_tokens, o->answer_tokens);
  return rc;
}

/* ---- command-line source ---- */

const char kvt_bench_source_usage[] =
    "  --trace FILE          Mooncake JSON-lines trace (timestamp ms, input_length,\n"
    "                        output_length, hash_ids)\n"
    "  --workload multiround built-in workload (the default without --trace):\n"
    "    --users N (256) --rounds R (8) --system-tokens T (2048)\n"
    "    --question-tokens Q (384) --answer-tokens A (512)   means; uniform in [x/2, 3x/2]\n"
    "    --rate U (2 new users/s) --think-s S (20, mean) --seed X (1)\n"
    "  --block-tokens B      tokens per block id (512 for traces, 16 for the workload)\n";

void kvt_bench_source_init(kvt_bench_source *s) {
  memset(s, 0, sizeof *s);
  s->multiround = 1;
  kvt_bench_multiround_init(&s->mr);
}

static int parse_u64_arg(const char *v, uint64_t max, uint64_t *out) {
  char *end;
  if (!v || !*v || *v == '-') return -1;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || x > max) return -1;
  *out = x;
  return 0;
}

static int parse_pos_double(const char *v, double *out) {
  char *end;
  if (!v || !*v) return -1;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || *end || !isfinite(x) || x < 0) return -1;
  *out = x;
  return 0;
}

int kvt_bench_source_option(kvt_bench_source *s, const char *cmd, int argc, char **argv, int *i) {
  static const char *const names[] = {"--trace", "--workload", "--block-tokens", "--users", "--rounds",
                                      "--system-tokens", "--question-tokens", "--answer-tokens", "--rate",
                                      "--think-s", "--seed"};
  const char *a = argv[*i];
  size_t k = 0, nn = sizeof names / sizeof names[0];
  while (k < nn && strcmp(a, names[k])) k++;
  if (k == nn) return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "kvtier-bench %s: %s needs a value\n", cmd, a);
    return -1;
  }
  const char *v = argv[++*i];
  uint64_t u = 0;
  double d = 0;
  int bad = 0;
  switch (k) {
  case 0: s->trace_path = v; s->multiround = 0; break;
  case 1: bad = strcmp(v, "multiround") != 0; s->multiround = 1; s->trace_path = NULL; break;
  case 2: bad = parse_u64_arg(v, 1024, &u) || u < 16 || (u & (u - 1)); s->block_tokens = (uint32_t)u; break;
  case 3: bad = parse_u64_arg(v, 1u << 20, &u) || !u; s->mr.users = (uint32_t)u; break;
  case 4: bad = parse_u64_arg(v, 4096, &u) || !u; s->mr.rounds = (uint32_t)u; break;
  case 5: bad = parse_u64_arg(v, 1u << 24, &u); s->mr.system_tokens = (uint32_t)u; break;
  case 6: bad = parse_u64_arg(v, 1u << 24, &u) || !u; s->mr.question_tokens = (uint32_t)u; break;
  case 7: bad = parse_u64_arg(v, 1u << 24, &u) || !u; s->mr.answer_tokens = (uint32_t)u; break;
  case 8: bad = parse_pos_double(v, &d) || d <= 0; s->mr.rate = d; break;
  case 9: bad = parse_pos_double(v, &d); s->mr.think_s = d; break;
  default: bad = parse_u64_arg(v, UINT64_MAX, &u); s->mr.seed = u; break;
  }
  if (bad) {
    fprintf(stderr, "kvtier-bench %s: %s '%s': %s\n", cmd, a, v,
            k == 1 ? "the only built-in workload is 'multiround'"
            : k == 2 ? "expected a power of two in 16..1024" : "out of range");
    return -1;
  }
  return 1;
}

int kvt_bench_source_load(const kvt_bench_source *s, const char *cmd, kvt_bench_trace *t) {
  if (s->trace_path) {
    kvt_bench_trace_err e;
    int rc = kvt_bench_trace_load(s->trace_path, s->block_tokens ? s->block_tokens : 512, t, &e);
    if (rc == -EINVAL && e.line)
      fprintf(stderr, "kvtier-bench %s: %s:%zu: %s\n", cmd, s->trace_path, e.line, e.msg);
    else if (rc == -EINVAL)
      fprintf(stderr, "kvtier-bench %s: %s: %s\n", cmd, s->trace_path, e.msg);
    else if (rc)
      fprintf(stderr, "kvtier-bench %s: %s: %s\n", cmd, s->trace_path, strerror(-rc));
    return rc;
  }
  kvt_bench_multiround mr = s->mr;
  if (s->block_tokens) mr.block_tokens = s->block_tokens;
  int rc = kvt_bench_multiround_make(&mr, t);
  if (rc) fprintf(stderr, "kvtier-bench %s: multiround workload: %s\n", cmd, strerror(-rc));
  return rc;
}
