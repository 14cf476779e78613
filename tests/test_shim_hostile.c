/* test_shim_hostile: values and files a careless or hostile user can hand the shim, each in a
 * process of its own (the shim reads its options once).
 *
 *   sizes     a table of extreme sizes for every size option (2^64 - 1, 2^64 - 2 MiB, 2^63,
 *             17179869183G, 1 PiB + 1, 1): the program allocates, writes and reads back blocks of
 *             1 B to 70 MiB and frees them without a crash; a refused value gets one message
 *             naming the variable, and the default is used (VMMSHIM_VERBOSE shows it); the sizes
 *             only compared (VMMSHIM_LIMIT, VMMSHIM_RELEASE_THRESHOLD, VMMSHIM_TRACE_STACKS_MIN)
 *             take any value.
 *   noreserve the pool's first address reservation fails (injected): the allocation passes to
 *             the driver, and nothing of the pool is left behind (the sanitizer pass checks for
 *             leaks at exit).
 *   files     the log and the trace: a symbolic link (to a file the program could write) is not
 *             followed, and the file it names is left as it was; a trace path that is a device,
 *             a directory; a FIFO with no reader does not stop the program (no trace, a message),
 *             one with a reader gets the trace; a log path of 600 bytes is used whole, one longer
 *             than PATH_MAX is refused with a message (both once cut at ~488 bytes). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB ((size_t)1 << 20)

/* ------------------------------------------------------------------ sizes */

static void scenario_sizes(void) {
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  static const size_t sizes[] = {1, 300 << 10, 3 * MiB, 70 * MiB, 5 * MiB + 17};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < N; i++) {
      p[i] = must_malloc(sizes[i]);
      if (p[i]) pat_fill_sparse(p[i], sizes[i], (unsigned)(i + 10 * round));
    }
    for (int i = 0; i < N; i++) {
      if (!p[i]) continue;
      CHECK(pat_check_sparse(p[i], sizes[i], (unsigned)(i + 10 * round)) == (size_t)-1, "block %d intact", i);
      CHECK(cudaFree(p[i]) == cudaSuccess, "free");
    }
  }
  CHECK(shim_active() == 1, "the shim is active");
  vmmshim_stats_t st = shim_stats();
  if (getenv("EXPECT_PASSTHROUGH"))
    CHECK(st.passthrough_allocs == 2 * N, "passed to the driver: %llu", (unsigned long long)st.passthrough_allocs);
  else
    CHECK(st.allocs[VMMSHIM_API_RUNTIME] == 2 * N && !st.passthrough_allocs, "served by the pools: %llu, %llu passed",
          (unsigned long long)st.allocs[VMMSHIM_API_RUNTIME], (unsigned long long)st.passthrough_allocs);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

static void sizes_output(const char *env, const char *name, bool refused, const char *default_shown);

/* Runs the sizes scenario with NAME=value; refused: one message naming the variable, and the
 * default in use (shown as `default_shown`); else the value in use, and no message about it. */
static void sizes_case(const char *name, const char *value, bool refused, const char *default_shown) {
  static char env[256];
  snprintf(env, sizeof env, "%s=%s", name, value);
  printf("-- %s\n", env);
  check_run_child("sizes", env, "VMMSHIM_VERBOSE=1", NULL);
  sizes_output(env, name, refused, default_shown);
}

static void sizes_output(const char *env, const char *name, bool refused, const char *default_shown) {
  const char *out = check_child_output;
  char want[160];
  if (refused) {
    snprintf(want, sizeof want, "vmmshim: warning: %s=", name);
    const char *m = strstr(out, want);
    CHECK(m != NULL, "%s: a warning naming the variable", env);
    CHECK(m && !strstr(m + 1, want), "%s: one warning, not several", env);
    CHECK(m && strstr(m, "default"), "%s: the warning says the default is used", env);
    snprintf(want, sizeof want, "option %s = %s (default)", name, default_shown);
    CHECK(strstr(out, want) != NULL, "%s: '%s' in the verbose output", env, want);
  } else {
    snprintf(want, sizeof want, "warning: %s", name);
    CHECK(strstr(out, want) == NULL, "%s: taken without a warning", env);
    snprintf(want, sizeof want, "option %s = ", name);
    const char *m = strstr(out, want);
    CHECK(m && !strncmp(m + strlen(want), default_shown, strlen(default_shown)) &&
              strncmp(m + strlen(want) + strlen(default_shown), " (default)", 10),
          "%s: %s%s in use", env, want, default_shown);
  }
}

static void run_sizes(void) {
  /* Sizes the pool rounds: near 2^64 they wrapped to 0 (SIGFPE at the first cudaMalloc). */
  static const char *huge[] = {"18446744073709551615", "18446744073709551614", "18446744073707454464",
                               "18446744073707454465", "9223372036854775808", "17179869183G", "16777215T",
                               "1125899906842625"};
  static const struct {
    const char *name, *shown;
  } rounded[] = {{"VMMSHIM_GRANULARITY", "67108864"}, {"VMMSHIM_MAX_HANDLE", "0"}, {"VMMSHIM_RESERVE", "0"}};
  for (size_t v = 0; v < sizeof rounded / sizeof *rounded; v++)
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) sizes_case(rounded[v].name, huge[i], true, rounded[v].shown);
  /* The largest taken, and tiny ones: rounded up to the device's granularity, no crash. */
  /* Handles of 1 PiB: the pool cannot reserve room for one, and says so; the program runs on. */
  printf("-- VMMSHIM_GRANULARITY=1125899906842624\n");
  check_run_child("sizes", "VMMSHIM_GRANULARITY=1125899906842624", "VMMSHIM_VERBOSE=1", "EXPECT_PASSTHROUGH=1", NULL);
  sizes_output("VMMSHIM_GRANULARITY=1125899906842624", "VMMSHIM_GRANULARITY", false, "1125899906842624");
  CHECK(strstr(check_child_output, "cannot reserve") != NULL, "a message says the pool cannot reserve that much");
  sizes_case("VMMSHIM_MAX_HANDLE", "1125899906842624", false, "1125899906842624");
  sizes_case("VMMSHIM_MAX_HANDLE", "1", false, "1");
  sizes_case("VMMSHIM_RESERVE", "1", false, "1");
  /* Sizes only compared: any value is a valid bound. */
  sizes_case("VMMSHIM_LIMIT", "18446744073709551615", false, "18446744073709551615");
  sizes_case("VMMSHIM_RELEASE_THRESHOLD", "18446744073709551614", false, "18446744073709551614");
  sizes_case("VMMSHIM_RELEASE_THRESHOLD", "0", false, "0");
  sizes_case("VMMSHIM_TRACE_STACKS_MIN", "18446744073709551615", false, "18446744073709551615");
}

/* ------------------------------------------------------------------ noreserve */

static void scenario_noreserve(void) {
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  emu_fail_next("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY, 1);
  void *p = must_malloc(MiB);
  CHECK(shim_stats().passthrough_allocs == 1, "passed to the driver: %llu",
        (unsigned long long)shim_stats().passthrough_allocs);
  if (p) memset(p, 1, MiB);
  CHECK(cudaFree(p) == cudaSuccess, "free");
  emu_counters_t c = emu_now();
  CHECK(c.live_reservations == 0 && c.live_plain == 0, "nothing left: %ld reservations, %ld plain",
        c.live_reservations, c.live_plain);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ files */

/* A little CUDA work and one warning of the program's own (a double free). */
static void scenario_work(void) {
  alarm(20); /* a program stopped at its first CUDA call fails here, not after the whole run's limit */
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  void *p = must_malloc(MiB);
  CHECK(cudaFree(p) == cudaSuccess, "free");
  CHECK(cudaFree(p) != cudaSuccess, "a double free is refused");
  cudaGetLastError();
}

static char g_dir[64];

static void put_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  CHECK(f != NULL, "create %s", path);
}

static void is_file(const char *path, const char *text, const char *what) {
  char buf[256];
  CHECK(check_read_file(path, buf, sizeof buf) && !strcmp(buf, text), "%s: %s holds '%s'", what, path, buf);
}

/* Runs the work scenario with one setting; true when it ended well within its time. */
static void run_work(const char *env, double max_s) {
  printf("-- %.120s%s\n", env, strlen(env) > 120 ? "..." : "");
  double t0 = now_s();
  check_run_child("work", env, NULL);
  CHECK(now_s() - t0 < max_s, "%.120s: the program ran through in %.1f s", env, now_s() - t0);
}

static void run_files(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/vmmshim-hostile.%d", (int)getpid());
  CHECK(mkdir(g_dir, 0700) == 0, "mkdir %s: %s", g_dir, strerror(errno));
  char victim[128], link[128], env[512];
  snprintf(victim, sizeof victim, "%s/victim", g_dir);
  put_file(victim, "precious\n");

  /* The log through a symbolic link: refused, the program's warning on standard error. */
  snprintf(link, sizeof link, "%s/log-link", g_dir);
  CHECK(symlink(victim, link) == 0, "symlink");
  snprintf(env, sizeof env, "VMMSHIM_LOG=warn:%s", link);
  run_work(env, 10);
  is_file(victim, "precious\n", "the log's link");
  CHECK(strstr(check_child_output, "symbolic link") && strstr(check_child_output, "VMMSHIM_LOG"),
        "the log's link: a message says why");
  CHECK(strstr(check_child_output, "not a live allocation") != NULL, "the program's warning went to standard error");

  /* The trace through a symbolic link: not truncated, not written. */
  snprintf(link, sizeof link, "%s/trace-link", g_dir);
  CHECK(symlink(victim, link) == 0, "symlink");
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", link);
  run_work(env, 10);
  is_file(victim, "precious\n", "the trace's link");
  CHECK(strstr(check_child_output, "symbolic link") && strstr(check_child_output, "trace"),
        "the trace's link: a message says why");

  /* A trace that is neither a regular file nor a FIFO. */
  run_work("VMMSHIM_TRACE=/dev/null", 10);
  CHECK(strstr(check_child_output, "not a regular file or a FIFO") != NULL, "/dev/null as the trace: refused");
  static char dir_env[160];
  snprintf(dir_env, sizeof dir_env, "VMMSHIM_TRACE=%s", g_dir);
  run_work(dir_env, 10);
  CHECK(strstr(check_child_output, "cannot open trace file") != NULL, "a directory as the trace: refused");

  /* A FIFO with no reader: the program runs on without a trace; with a reader, the trace. */
  char fifo[128];
  snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", fifo);
  run_work(env, 10);
  CHECK(strstr(check_child_output, "FIFO with no reader") != NULL, "a FIFO with no reader: a message");
  int rd = open(fifo, O_RDONLY | O_NONBLOCK);
  CHECK(rd >= 0, "open the FIFO's reading end");
  run_work(env, 10);
  char buf[4096];
  ssize_t n = rd >= 0 ? read(rd, buf, sizeof buf - 1) : -1;
  buf[n > 0 ? n : 0] = 0;
  CHECK(!strncmp(buf, "v ", 2) && strstr(buf, " vmmshim ") && strstr(buf, "\n"), "the reader got the trace: '%.40s'",
        buf);
  if (rd >= 0) close(rd);

  /* Long log paths: 600 bytes, used whole; longer than PATH_MAX, refused. */
  char longp[700];
  int o = snprintf(longp, sizeof longp, "%s", g_dir);
  for (int i = 0; i < 5; i++) {
    o += snprintf(longp + o, sizeof longp - (size_t)o, "/%0100d", i);
    CHECK(mkdir(longp, 0700) == 0, "mkdir (%d)", i);
  }
  o += snprintf(longp + o, sizeof longp - (size_t)o, "/%s", "a-log-file-of-a-long-path.log");
  CHECK(o > 550, "a path of %d bytes", o);
  static char long_env[800];
  snprintf(long_env, sizeof long_env, "VMMSHIM_LOG=warn:%s", longp);
  run_work(long_env, 10);
  CHECK(check_read_file(longp, buf, sizeof buf) && strstr(buf, "not a live allocation"),
        "the program's warning is in the %d-byte log path", o);
  static char huge_env[5200];
  int h = snprintf(huge_env, sizeof huge_env, "VMMSHIM_LOG=warn:%s", g_dir);
  while (h < 5000) h += snprintf(huge_env + h, sizeof huge_env - (size_t)h, "/%0100d", h);
  run_work(huge_env, 10);
  CHECK(strstr(check_child_output, "VMMSHIM_LOG") && strstr(check_child_output, "too long"),
        "a log path longer than PATH_MAX: a message");
  CHECK(strstr(check_child_output, "not a live allocation") != NULL, "and the log on standard error");

  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  CHECK(system(cmd) == 0, "clean up");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(120);
    if (!strcmp(sc, "sizes")) scenario_sizes();
    else if (!strcmp(sc, "noreserve")) scenario_noreserve();
    else if (!strcmp(sc, "work")) scenario_work();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  run_sizes();
  check_run_child("noreserve", NULL);
  run_files();
  return check_summary();
}
