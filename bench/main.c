#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier/kvtier.h"

#define MAX_COMMANDS 16
static struct {
  const char *name, *summary;
  kvt_bench_fn fn;
} commands[MAX_COMMANDS];
static int n_commands;

void kvt_bench_register(const char *name, const char *summary, kvt_bench_fn fn) {
  if (n_commands < MAX_COMMANDS) {
    commands[n_commands].name = name;
    commands[n_commands].summary = summary;
    commands[n_commands].fn = fn;
    n_commands++;
  }
}

static int progress_active;

void kvt_bench_progress(const char *label, double fraction) {
  if (!isatty(STDERR_FILENO)) return;
  int width = 40, filled = (int)(fraction * width + 0.5);
  if (filled > width) filled = width;
  fprintf(stderr, "\r%-12s [", label);
  for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
  fprintf(stderr, "] %5.1f%%", fraction * 100.0);
  progress_active = 1;
}

void kvt_bench_progress_done(void) {
  if (progress_active) fprintf(stderr, "\r%*s\r", 70, "");
  progress_active = 0;
}

static void usage(FILE *f) {
  fprintf(f, "kvtier-bench %s - measure kvtier against the machine's limits\n\n"
             "usage: kvtier-bench COMMAND [options]   (COMMAND --help for its options)\n\n",
          kvt_version());
  for (int i = 0; i < n_commands; i++) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("kvtier-bench %s\n", kvt_version());
    return 0;
  }
  for (int i = 0; i < n_commands; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "kvtier-bench: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
