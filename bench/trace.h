/* Request traces for kvtier-bench replay and sweep: the Mooncake JSON-lines
 * format, read with cJSON, and the built-in multiround workload. Both give
 * the same in-memory form: per request an arrival time, input and output
 * lengths and a run of block ids (one per block_tokens tokens; the last may
 * cover a partial block), ids forming a prefix tree. */
#ifndef KVT_BENCH_TRACE_H
#define KVT_BENCH_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvt_bench_req {
  double t_s;             /* arrival, seconds from the trace's start */
  uint64_t input_tokens;  /* prompt length */
  uint64_t output_tokens; /* generated tokens */
  uint64_t first_id;      /* index of its first block id in kvt_bench_trace.ids */
  uint32_t n_ids;         /* ceil(input_tokens / block_tokens) ids */
} kvt_bench_req;

typedef struct kvt_bench_trace {
  kvt_bench_req *reqs;
  size_t n_reqs, cap_reqs;
  uint64_t *ids; /* every request's ids, back to back */
  size_t n_ids, cap_ids;
  uint32_t block_tokens;
  uint32_t max_ids; /* longest request, in ids */
  char source[128]; /* "file NAME" or "multiround ..." */
} kvt_bench_trace;

/* Why a load failed: the 1-based line and a reason. */
typedef struct kvt_bench_trace_err {
  size_t line;
  char msg[160];
} kvt_bench_trace_err;

/* Parses one JSON line into t (appends a request). Returns 0, or -EINVAL
 * with err->msg set (line number left to the caller), or -ENOMEM. Checks:
 * an object with numeric timestamp >= 0, integral input_length >= 1 and
 * output_length >= 0, hash_ids an array of integral ids >= 0 whose length is
 * ceil(input_length / block_tokens). */
int kvt_bench_trace_parse_line(kvt_bench_trace *t, const char *line, kvt_bench_trace_err *err);

/* Longest line a trace may have. */
#define KVT_BENCH_TRACE_MAX_LINE (64u << 20)

/* Reads a whole JSON-lines file (blank lines are skipped). Returns 0, a
 * negative errno for I/O or memory (-ENOMEM, -EISDIR, -EIO...: never taken
 * for the end of the file), or -EINVAL with err->line and err->msg naming
 * the first malformed line (bad JSON, a NUL byte, a line longer than
 * KVT_BENCH_TRACE_MAX_LINE). On error *t is freed. */
int kvt_bench_trace_load(const char *path, uint32_t block_tokens, kvt_bench_trace *t,
                         kvt_bench_trace_err *err);

/* The built-in workload: `users` conversations that share a system prompt;
 * each runs `rounds` rounds of a question followed by an answer, and every
 * round's prompt is the system prompt plus the whole history so far plus the
 * new question. Conversations start at `rate` new users per second; a user's
 * next round comes a think time after the previous answer (exponential
 * with the given mean). Question and answer lengths are uniform in
 * [len/2, 3len/2]. Deterministic for a seed. */
typedef struct kvt_bench_multiround {
  uint32_t users;          /* 256 */
  uint32_t rounds;         /* 8 */
  uint32_t system_tokens;  /* 2048 */
  uint32_t question_tokens;/* 384 (mean) */
  uint32_t answer_tokens;  /* 512 (mean) */
  double rate;             /* new users per second (2) */
  double think_s;          /* mean think time between rounds, seconds (20) */
  uint32_t block_tokens;   /* 16 */
  uint64_t seed;           /* 1 */
} kvt_bench_multiround;

void kvt_bench_multiround_init(kvt_bench_multiround *o);
/* Returns 0, -EINVAL (zero users/rounds/block_tokens, rate <= 0), -ENOMEM. */
int kvt_bench_multiround_make(const kvt_bench_multiround *o, kvt_bench_trace *t);

/* Command-line source of requests, shared by replay and sweep. */
typedef struct kvt_bench_source {
  const char *trace_path;  /* --trace FILE */
  int multiround;          /* --workload multiround (the default with no --trace) */
  uint32_t block_tokens;   /* --block-tokens (0: 512 for traces, the workload's 16) */
  kvt_bench_multiround mr; /* --users --rounds --system-tokens ... */
} kvt_bench_source;

void kvt_bench_source_init(kvt_bench_source *s);
/* If argv[*i] is a source option, consumes it and its value (advancing *i)
 * and returns 1; 0 if it is not one; -1 on a bad value (message on stderr). */
int kvt_bench_source_option(kvt_bench_source *s, const char *cmd, int argc, char **argv, int *i);
/* Loads the trace or makes the workload; prints why on stderr and returns
 * negative on failure. */
int kvt_bench_source_load(const kvt_bench_source *s, const char *cmd, kvt_bench_trace *t);
/* The options above, for usage texts. */
extern const char kvt_bench_source_usage[];

void kvt_bench_trace_init(kvt_bench_trace *t, uint32_t block_tokens);
void kvt_bench_trace_free(kvt_bench_trace *t);

#endif
