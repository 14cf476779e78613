/* check.h: the tiny harness of the CPU tests.
 *
 *   CHECK(cond, fmt, ...)  counts a pass, or prints "FAIL file:line: cond: message" and
 *                          counts a failure; the test goes on either way.
 *   check_summary()        prints "N passed, N failed" and returns the exit code (0 when
 *                          nothing failed); end main() with `return check_summary();`.
 *
 * Helpers for programs that run a scenario in a child process with its own environment
 * (the shim reads its options once per process):
 *   check_child_main(argc, argv) returns the scenario name in a child, NULL in the parent;
 *   check_run_child(name, env...) re-executes this program with argv[1] = name and the
 *   given "NAME=value" settings added to the environment (the runner's LD_PRELOAD and
 *   LD_LIBRARY_PATH are inherited), echoes its output, and adds the counts of its
 *   closing "name: N passed, N failed" line to this process's counts; a crash, a
 *   non-zero exit with no failure counted, or a missing line counts as a failure.
 *   check_child_summary(name) closes a child: prints "name: N passed, N failed". */
#ifndef VMMSHIM_TEST_CHECK_H
#define VMMSHIM_TEST_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (cond) {                                                            \
      check_passed++;                                                      \
    } else {                                                               \
      check_failed++;                                                      \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
      printf(__VA_ARGS__);                                                 \
      printf("\n");                                                        \
      fflush(stdout);                                                      \
    }                                                                      \
  } while (0)

static inline int check_summary(void) {
  printf("%d passed, %d failed\n", check_passed, check_failed);
  fflush(stdout);
  return check_failed ? 1 : 0;
}

static inline int check_child_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
  fflush(stdout);
  return check_failed ? 1 : 0;
}

static inline const char *check_child_main(int argc, char **argv) {
  return argc > 1 ? argv[1] : NULL;
}

/* Runs this program again as scenario `name` with extra settings (NULL-terminated list of
 * "NAME=value"); returns the child's exit status (or -1). */
static inline int check_run_child(const char *name, ...) {
  int fds[2];
  if (pipe(fds) != 0) {
    CHECK(0, "pipe failed");
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    CHECK(0, "fork failed");
    return -1;
  }
  if (pid == 0) {
    va_list ap;
    va_start(ap, name);
    for (const char *kv = va_arg(ap, const char *); kv; kv = va_arg(ap, const char *)) putenv((char *)kv);
    va_end(ap);
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    char *args[] = {(char *)"child", (char *)name, NULL};
    extern char **environ;
    execve("/proc/self/exe", args, environ);
    _exit(127);
  }
  close(fds[1]);
  FILE *in = fdopen(fds[0], "r");
  char line[1024];
  int p = -1, f = -1;
  size_t nlen = strlen(name);
  while (in && fgets(line, sizeof line, in)) {
    fputs(line, stdout);
    int a, b;
    if (!strncmp(line, name, nlen) && line[nlen] == ':' &&
        sscanf(line + nlen + 1, " %d passed, %d failed", &a, &b) == 2) {
      p = a;
      f = b;
    }
  }
  if (in) fclose(in);
  fflush(stdout);
  int status = 0;
  waitpid(pid, &status, 0);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (p < 0) {
    check_failed++;
    printf("FAIL %s:%d: scenario %s printed no summary (exit status %d)\n", __FILE__, __LINE__, name, rc);
  } else {
    check_passed += p;
    check_failed += f;
    if (rc != 0 && f == 0) {
      check_failed++;
      printf("FAIL %s:%d: scenario %s exited with %d\n", __FILE__, __LINE__, name, rc);
    }
  }
  fflush(stdout);
  return rc;
}

#endif
