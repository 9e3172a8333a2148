/* libFuzzer target: the trace reader's line parser (bench/trace.c,
 * kvt_bench_trace_parse_line). Byte 0 picks block_tokens; the rest is one
 * line. Properties: 0 or -EINVAL (never a crash or a leak); on success one
 * request is appended whose id count is ceil(input_length / block_tokens)
 * and whose ids fit the ids array; on failure nothing is appended. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint32_t bt = 16u << (data[0] % 6); /* 16..512 */
  char *line = malloc(size);
  memcpy(line, data + 1, size - 1);
  line[size - 1] = '\0';
  kvt_bench_trace t;
  kvt_bench_trace_init(&t, bt);
  kvt_bench_trace_err err;
  memset(&err, 0, sizeof err);
  /* Twice into one trace: the second append must not disturb the first. */
  for (int round = 0; round < 2; round++) {
    size_t before = t.n_reqs, ids_before = t.n_ids;
    int rc = kvt_bench_trace_parse_line(&t, line, &err);
    if (rc != 0 && rc != -EINVAL && rc != -ENOMEM) abort();
    if (rc != 0) {
      if (t.n_reqs != before || t.n_ids != ids_before) abort();
      if (!memchr(err.msg, '\0', sizeof err.msg)) abort();
      continue;
    }
    if (t.n_reqs != before + 1) abort();
    const kvt_bench_req *r = &t.reqs[before];
    if (r->input_tokens < 1 || r->n_ids != (r->input_tokens + bt - 1) / bt) abort();
    if (r->first_id != ids_before || r->first_id + r->n_ids != t.n_ids || t.n_ids > t.cap_ids) abort();
    if (!(r->t_s >= 0)) abort();
  }
  kvt_bench_trace_free(&t);
  free(line);
  return 0;
}
