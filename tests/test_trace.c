/* bench/trace.c: the Mooncake JSON-lines reader rejects malformed lines
 * with their line number and reason; the multiround workload has the shape
 * its options describe. */
#include "helpers.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trace.h"

static const char *write_file(const char *name, const char *text) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", kvt_test_tmpdir(), name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

#define GOOD "{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}\n"

static void test_reads_good_lines(void **state) {
  (void)state;
  const char *p = write_file("good.jsonl", GOOD "\n{\"timestamp\": 1500, \"input_length\": 512, \"output_length\": 0, "
                                              "\"hash_ids\": [1]}\n");
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load(p, 512, &t, &e), 0);
  assert_int_equal(t.n_reqs, 2);
  assert_int_equal(t.reqs[0].input_tokens, 1030);
  assert_int_equal(t.reqs[0].output_tokens, 7);
  assert_int_equal(t.reqs[0].n_ids, 3);
  assert_true(t.reqs[1].t_s == 1.5);
  assert_int_equal(t.ids[t.reqs[0].first_id + 2], 3);
  assert_int_equal(t.ids[t.reqs[1].first_id], 1);
  assert_int_equal(t.max_ids, 3);
  kvt_bench_trace_free(&t);
}

/* Line 3 of a file whose first two lines are good is `bad`. */
static void expect_bad(const char *bad, const char *reason) {
  char text[1024];
  snprintf(text, sizeof text, GOOD GOOD "%s\n" GOOD, bad);
  const char *p = write_file("bad.jsonl", text);
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load(p, 512, &t, &e), -EINVAL);
  assert_int_equal(e.line, 3);
  if (!strstr(e.msg, reason)) fail_msg("for %s: got '%s', wanted '%s'", bad, e.msg, reason);
  assert_int_equal(t.n_reqs, 0); /* nothing half-loaded */
}

static void test_rejects_malformed_lines_with_line_and_reason(void **state) {
  (void)state;
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7", "invalid JSON");
  expect_bad("[1, 2]", "not a JSON object");
  expect_bad("{\"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}", "missing field \"timestamp\"");
  expect_bad("{\"timestamp\": 5, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}", "missing field \"input_length\"");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"hash_ids\": [1, 2, 3]}", "missing field \"output_length\"");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7}", "missing field \"hash_ids\"");
  expect_bad("{\"timestamp\": \"5\", \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}",
             "\"timestamp\" is not a number");
  expect_bad("{\"timestamp\": 5, \"input_length\": -1030, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}",
             "\"input_length\" is negative");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": -7, \"hash_ids\": [1, 2, 3]}",
             "\"output_length\" is negative");
  expect_bad("{\"timestamp\": -5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}",
             "\"timestamp\" is negative");
  expect_bad("{\"timestamp\": 5, \"input_length\": 10.5, \"output_length\": 7, \"hash_ids\": [1]}",
             "\"input_length\" must be an integer");
  expect_bad("{\"timestamp\": 5, \"input_length\": 0, \"output_length\": 7, \"hash_ids\": []}",
             "\"input_length\" must be an integer >= 1");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": 3}",
             "\"hash_ids\" is not an array");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, 2]}",
             "hash_ids has 2 ids, but input_length 1030 needs ceil(1030/512) = 3");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1024, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}",
             "hash_ids has 3 ids");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, \"x\", 3]}",
             "hash_ids[1] is not an integer");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, -2, 3]}",
             "hash_ids[1] is not an integer >= 0");
  expect_bad("{\"timestamp\": 5, \"input_length\": 1030, \"output_length\": 7, \"hash_ids\": [1, 2, 3]} x",
             "trailing characters");
}

static void test_missing_file_and_empty_file(void **state) {
  (void)state;
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load("/nonexistent/trace.jsonl", 512, &t, &e), -ENOENT);
  const char *p = write_file("empty.jsonl", "\n\n");
  assert_int_equal(kvt_bench_trace_load(p, 512, &t, &e), -EINVAL);
  assert_non_null(strstr(e.msg, "no requests"));
}

static void test_bundled_trace_loads(void **state) {
  (void)state;
  const char *path = kvt_test_trace("mooncake_synthetic_trace.jsonl");
  if (!path) kvt_test_skip("mooncake_synthetic_trace.jsonl not found");
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load(path, 512, &t, &e), 0);
  assert_int_equal(t.n_reqs, 3993);
  assert_int_equal(t.n_ids, 121877);
  kvt_bench_trace_free(&t);
  /* The same file does not fit another block size: every line is checked. */
  assert_int_equal(kvt_bench_trace_load(path, 256, &t, &e), -EINVAL);
  assert_int_equal(e.line, 1);
}

static void test_multiround_shape(void **state) {
  (void)state;
  kvt_bench_multiround o;
  kvt_bench_multiround_init(&o);
  o.users = 10;
  o.rounds = 4;
  o.system_tokens = 100; /* 6 full blocks of 16, then a shared-prefix partial */
  o.question_tokens = 40;
  o.answer_tokens = 30;
  o.rate = 5;
  kvt_bench_trace t;
  assert_int_equal(kvt_bench_multiround_make(&o, &t), 0);
  assert_int_equal(t.n_reqs, 40);
  assert_int_equal(t.block_tokens, 16);
  uint64_t last_input[10] = {0}, last_output[10] = {0};
  const uint64_t *last_ids[10] = {0};
  uint32_t rounds_seen[10] = {0};
  for (size_t i = 0; i < t.n_reqs; i++) {
    const kvt_bench_req *q = &t.reqs[i];
    const uint64_t *ids = t.ids + q->first_id;
    if (i) assert_true(q->t_s >= t.reqs[i - 1].t_s); /* arrival order */
    assert_int_equal(q->n_ids, (q->input_tokens + 15) / 16);
    for (uint32_t k = 0; k < 6; k++) assert_int_equal(ids[k], k); /* the shared system prompt */
    assert_true(q->output_tokens >= 15 && q->output_tokens <= 45);
    /* Which user: the one whose last prompt this one extends. */
    int u = -1;
    for (int c = 0; c < 10 && u < 0; c++) {
      if (!last_ids[c]) continue;
      uint32_t full = (uint32_t)(last_input[c] / 16);
      if (full > 6 && q->n_ids > full && !memcmp(ids, last_ids[c], full * sizeof *ids)) u = c;
    }
    if (u < 0) { /* a first round: system prompt + one question */
      for (u = 0; u < 10 && last_ids[u]; u++) {}
      assert_true(u < 10);
      assert_true(q->input_tokens >= 100 + 20 && q->input_tokens <= 100 + 60);
    } else { /* history + answer + a new question */
      uint64_t grow = q->input_tokens - last_input[u] - last_output[u];
      assert_true(grow >= 20 && grow <= 60);
      if (last_input[u] % 16) /* the old partial block was replaced by a new id */
        assert_true(ids[last_input[u] / 16] != last_ids[u][last_input[u] / 16]);
    }
    last_ids[u] = ids;
    last_input[u] = q->input_tokens;
    last_output[u] = q->output_tokens;
    rounds_seen[u]++;
  }
  for (int u = 0; u < 10; u++) assert_int_equal(rounds_seen[u], 4);
  /* Users start 1/rate apart; the last first round is no earlier than 9/5 s. */
  assert_true(t.reqs[t.n_reqs - 1].t_s >= 1.8);
  /* Same seed, same workload; another seed, another one. */
  kvt_bench_trace t2;
  assert_int_equal(kvt_bench_multiround_make(&o, &t2), 0);
  assert_int_equal(t2.n_ids, t.n_ids);
  assert_memory_equal(t2.ids, t.ids, t.n_ids * sizeof *t.ids);
  kvt_bench_trace_free(&t2);
  o.seed = 2;
  assert_int_equal(kvt_bench_multiround_make(&o, &t2), 0);
  assert_true(t2.n_ids != t.n_ids || memcmp(t2.ids, t.ids, t.n_ids * sizeof *t.ids) != 0);
  kvt_bench_trace_free(&t2);
  kvt_bench_trace_free(&t);
  o.users = 0;
  assert_int_equal(kvt_bench_multiround_make(&o, &t), -EINVAL);
}

/* A directory is not "Input/output error". */
static void test_directory_is_named_as_such(void **state) {
  (void)state;
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load(kvt_test_tmpdir(), 512, &t, &e), -EISDIR);
}

/* /dev/zero: refused at its first byte instead of growing one line forever. */
static void test_dev_zero_is_refused_at_once(void **state) {
  (void)state;
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load("/dev/zero", 512, &t, &e), -EINVAL);
  assert_int_equal(e.line, 1);
  assert_non_null(strstr(e.msg, "NUL"));
}

static void *endless_writer(void *arg) {
  int fd = *(int *)arg;
  static char xs[65536];
  memset(xs, 'x', sizeof xs);
  while (write(fd, xs, sizeof xs) > 0) {
  }
  close(fd);
  return NULL;
}

/* An endless line without NULs stops at the line limit. */
static void test_endless_line_stops_at_the_limit(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  signal(SIGPIPE, SIG_IGN);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, endless_writer, &p[1]), 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", p[0]);
  kvt_bench_trace t;
  kvt_bench_trace_err e;
  assert_int_equal(kvt_bench_trace_load(path, 512, &t, &e), -EINVAL);
  assert_non_null(strstr(e.msg, "longer than 64 MiB"));
  close(p[0]); /* the writer gets EPIPE and ends */
  pthread_join(th, NULL);
}

/* Under a memory limit the long line's buffer cannot grow: that is -ENOMEM,
 * not an end of file after the requests read so far. */
static void test_out_of_memory_is_not_end_of_file(void **state) {
  (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  skip(); /* sanitizers reserve more address space than any limit leaves */
#else
  char path[4096];
  snprintf(path, sizeof path, "%s/bigline.jsonl", kvt_test_tmpdir());
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(GOOD GOOD, f);
  fputs("{\"timestamp\": 5, \"pad\": \"", f);
  for (int i = 0; i < 40 * 1024; i++) fprintf(f, "%01024d", 0);
  fputs("\"}\n" GOOD, f);
  fclose(f);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    FILE *st = fopen("/proc/self/statm", "r");
    if (!st || fscanf(st, "%ld", &pages) != 1) _exit(5);
    fclose(st);
    struct rlimit rl = {(rlim_t)pages * 4096 + (16u << 20), RLIM_INFINITY};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(6);
    kvt_bench_trace t;
    kvt_bench_trace_err e;
    int rc = kvt_bench_trace_load(path, 512, &t, &e);
    _exit(rc == -ENOMEM ? 0 : 7);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reads_good_lines),
      cmocka_unit_test(test_rejects_malformed_lines_with_line_and_reason),
      cmocka_unit_test(test_missing_file_and_empty_file),
      cmocka_unit_test(test_bundled_trace_loads),
      cmocka_unit_test(test_multiround_shape),
      cmocka_unit_test(test_directory_is_named_as_such),
      cmocka_unit_test(test_dev_zero_is_refused_at_once),
      cmocka_unit_test(test_endless_line_stops_at_the_limit),
      cmocka_unit_test(test_out_of_memory_is_not_end_of_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
