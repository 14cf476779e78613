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
 *             leaks at exit). */
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

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(120);
    if (!strcmp(sc, "sizes")) scenario_sizes();
    else if (!strcmp(sc, "noreserve")) scenario_noreserve();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  run_sizes();
  check_run_child("noreserve", NULL);
  return check_summary();
}
