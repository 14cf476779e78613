/* test_shim_report: the memory report (src/report.c) under the shim, one process per
 * scenario (the shim reads its options once; the emulated device is set up before first use).
 *
 *   oom      a 256 MiB device filled with 8 MiB blocks: the out-of-memory answer writes the report
 *            at warn level, and every figure in it equals the shim's counters and the
 *            emulation's (live, blocks, mapped, handles, per-heap sums, device free and total,
 *            idle); a second answer within a second writes nothing, one after a pause reports
 *            again and counts the one it left out; vmmshim_dump() and SIGUSR2 write the report
 *            on demand.
 *   limit    VMMSHIM_LIMIT=64M: the report names the limit and says to raise it.
 *   frag     idle memory pinned by live blocks in shared handles: the report says why it
 *            was not given back and names VMMSHIM_GRANULARITY.
 *   quiet    VMMSHIM_LOG=error: no report at out-of-memory.
 *   nosignal VMMSHIM_DUMP_SIGNAL=0: SIGUSR2 keeps its default action.
 *   usr1     VMMSHIM_DUMP_SIGNAL=USR1: SIGUSR1 writes the report; SIGUSR2 is left alone.
 *   ownhandler  the program handles SIGUSR2 itself: the shim leaves that handler alone. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

static char g_log[256];

/* The log file as a string (static buffer). */
static const char *read_log(void) {
  static char buf[1 << 16];
  check_read_file(g_log, buf, sizeof buf);
  return buf;
}

/* The exact byte count of the first figure after `key` at or after `from`: "12.00 MiB
 * (12582912 B)" or "512 B". -1 when there is none. */
static long long exact_after(const char *from, const char *key) {
  const char *p = from ? strstr(from, key) : NULL;
  if (!p) return -1;
  p += strlen(key);
  double v;
  char unit[16];
  if (sscanf(p, "%lf %15s", &v, unit) != 2) return -1;
  if (!strcmp(unit, "B") || !strncmp(unit, "B,", 2) || !strncmp(unit, "B;", 2)) return (long long)v;
  long long n = -1;
  p = strchr(p, '(');
  if (!p || sscanf(p, "(%lld B)", &n) != 1) return -1;
  return n;
}

/* An integer right after `key` (e.g. "in " -> blocks), or -1. */
static long long int_after(const char *from, const char *key) {
  const char *p = from ? strstr(from, key) : NULL;
  long long v = -1;
  if (!p || sscanf(p + strlen(key), "%lld", &v) != 1) return -1;
  return v;
}

/* Waits up to 2 s for the log to hold `n` copies of `needle`. */
static int wait_for(const char *needle, int n) {
  for (int i = 0; i < 200; i++) {
    if (check_count(read_log(), needle) >= n) return 1;
    sleep_ms(10);
  }
  return 0;
}

static void scenario_oom(void) {
  emu_set_device_memory(0, 256 * MiB);
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  enum { M = 64 };
  void *p[M];
  int n = 0;
  while (n < M && cudaMalloc(&p[n], 8 * MiB) == cudaSuccess) n++;
  cudaGetLastError();
  void *small[3];
  for (int i = 0; i < 3; i++) small[i] = NULL;
  CHECK(n >= 24 && n < M, "%d blocks of 8 MiB on a 256 MiB device", n);
  const char *log = read_log();
  const char *r = strstr(log, "warning: out of memory: cudaMalloc of 8.00 MiB (8388608 B) on device 0");
  CHECK(r != NULL, "no out-of-memory report naming the request; log:\n%s", log);
  if (!r) return;
  vmmshim_stats_t s = shim_stats();
  emu_counters_t e = emu_now();
  CHECK(exact_after(r, "device 0: live ") == (long long)s.bytes_in_use, "live %lld, stats say %llu",
        exact_after(r, "device 0: live "), (unsigned long long)s.bytes_in_use);
  CHECK(exact_after(r, "device 0: live ") == (long long)n * 8 * (long long)MiB, "live = the blocks held");
  CHECK(int_after(strstr(r, "device 0: live "), ") in ") == n, "blocks %lld, want %d",
        int_after(strstr(r, "device 0: live "), ") in "), n);
  CHECK(exact_after(r, "; mapped ") == (long long)s.bytes_mapped, "mapped %lld, stats say %llu",
        exact_after(r, "; mapped "), (unsigned long long)s.bytes_mapped);
  CHECK(int_after(strstr(r, "; mapped "), ") in ") == e.live_mappings, "handles %lld, emulation has %ld mappings",
        int_after(strstr(r, "; mapped "), ") in "), e.live_mappings);
  /* The heap lines add up to the totals. */
  long long heap_mapped = 0, heap_live = 0, heap_idle = 0;
  for (const char *h = strstr(r, "heap"); h; h = strstr(h + 4, "heap: mapped")) {
    if (strncmp(h, "heap", 4) || !strstr(h, "mapped")) continue;
    const char *line_end = strchr(h, '\n');
    long long m = exact_after(h, "mapped "), l = exact_after(h, ", live "), i = exact_after(h, ", idle ");
    if (m < 0 || (line_end && strstr(h, "mapped ") > line_end)) continue;
    heap_mapped += m;
    heap_live += l;
    heap_idle += i;
  }
  CHECK(heap_mapped == (long long)s.bytes_mapped, "heap lines map %lld, stats %llu", heap_mapped,
        (unsigned long long)s.bytes_mapped);
  CHECK(heap_live == (long long)s.bytes_in_use, "heap lines hold %lld live, stats %llu", heap_live,
        (unsigned long long)s.bytes_in_use);
  CHECK(heap_idle == (long long)(s.bytes_mapped - s.bytes_in_use), "heap lines idle %lld, want %llu", heap_idle,
        (unsigned long long)(s.bytes_mapped - s.bytes_in_use));
  /* What the driver reports: the emulation's free and total memory. */
  long long dfree = exact_after(r, "the driver reports ");
  long long dtotal = exact_after(strstr(r, " free of "), " free of ");
  CHECK(dtotal == (long long)(256 * MiB), "device total %lld", dtotal);
  CHECK(dfree == (long long)(256 * MiB - emu_device_used(0)), "device free %lld, emulation says %llu", dfree,
        (unsigned long long)(256 * MiB - emu_device_used(0)));
  CHECK(strstr(r, "what may help: ") != NULL, "the report says what may help");
  CHECK(strstr(r, "process: ") && int_after(strstr(r, "allocations served"), ", ") >= 1, "the process line");

  /* A second answer at once is the same burst: nothing more is written. */
  int reports = check_count(read_log(), "warning: out of memory:");
  CHECK(cuMemAlloc(&(CUdeviceptr){0}, 64 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc on a full device");
  CHECK(check_count(read_log(), "warning: out of memory:") == reports, "a second report within the burst");
  sleep_ms(1100);
  CHECK(cuMemAlloc(&(CUdeviceptr){0}, 64 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc after a pause");
  log = read_log();
  CHECK(check_count(log, "warning: out of memory:") == reports + 1, "a new burst reports again");
  CHECK(strstr(log, "warning: out of memory: cuMemAlloc of 64.00 MiB") && strstr(log, "(1 earlier out-of-memory"),
        "the new report counts the answer left out");

  /* On demand. */
  for (int i = 0; i < 2; i++) cudaFree(p[--n]);
  CHECK(cudaMalloc(&small[0], 1000) == cudaSuccess, "a small block");
  int (*dump)(void) = NULL;
  *(void **)&dump = dlsym(RTLD_DEFAULT, "vmmshim_dump");
  CHECK(dump != NULL, "vmmshim_dump is exported");
  if (dump) CHECK(dump() == 0, "vmmshim_dump returns 0");
  log = read_log();
  const char *d = strstr(log, "memory report (vmmshim_dump");
  CHECK(d != NULL, "vmmshim_dump wrote the report");
  s = shim_stats();
  CHECK(d && exact_after(d, "device 0: live ") == (long long)s.bytes_in_use, "dump: live %lld, stats %llu",
        exact_after(d, "device 0: live "), (unsigned long long)s.bytes_in_use);
  CHECK(d && strstr(d, "kept mapped for reuse"), "dump: idle memory is explained");
  CHECK(d && !strstr(d, "what may help"), "dump: no advice without a failed request");
  raise(SIGUSR2);
  CHECK(wait_for("memory report (vmmshim_dump", 2), "SIGUSR2 wrote the report");
  for (int i = 0; i < n; i++) cudaFree(p[i]);
  cudaFree(small[0]);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

static void scenario_limit(void) {
  void *p[8];
  int n = 0;
  while (n < 8 && cudaMalloc(&p[n], 16 * MiB) == cudaSuccess) n++;
  cudaGetLastError();
  const char *log = read_log();
  const char *r = strstr(log, "warning: out of memory:");
  CHECK(r && strstr(r, "(VMMSHIM_LIMIT reached)"), "the report says the limit was reached");
  CHECK(r && strstr(r, "VMMSHIM_LIMIT=67108864: the process maps"), "the report names the limit");
  CHECK(r && strstr(r, "what may help: VMMSHIM_LIMIT=67108864"), "the report says to raise the limit");
  for (int i = 0; i < n; i++) cudaFree(p[i]);
}

static void scenario_frag(void) {
  emu_set_device_memory(0, 64 * MiB);
  /* 2 MiB granularity: the large heap shares 2 MiB handles; 1 MiB blocks two per handle. */
  enum { M = 64 };
  void *p[M];
  int n = 0;
  while (n < M && cudaMalloc(&p[n], MiB) == cudaSuccess) n++;
  cudaGetLastError();
  /* Free every other block: half the memory idle, none of it in a whole idle handle. */
  for (int i = 0; i < n; i += 2) cudaFree(p[i]);
  void *big = NULL;
  CHECK(cudaMalloc(&big, 24 * MiB) == cudaErrorMemoryAllocation, "24 MiB cannot fit");
  cudaGetLastError();
  const char *r = strstr(read_log(), "warning: out of memory:");
  CHECK(r && strstr(r, "not given back: it lies in handles that also hold live"), "idle memory explained");
  CHECK(r && strstr(r, "(fragmentation)") && strstr(r, "VMMSHIM_GRANULARITY"), "fragmentation advice");
  for (int i = 1; i < n; i += 2) cudaFree(p[i]);
}

static void scenario_quiet(void) {
  emu_set_device_memory(0, 32 * MiB);
  void *p = NULL;
  CHECK(cudaMalloc(&p, 64 * MiB) == cudaErrorMemoryAllocation, "too large");
  cudaGetLastError();
  CHECK(!strstr(read_log(), "out of memory"), "no report at level error");
}

static void disposition(int sig, struct sigaction *out) { sigaction(sig, NULL, out); }

/* The shim initialises on its first served call. */
static void first_use(void) {
  void *p = NULL;
  CHECK(cudaMalloc(&p, 1000) == cudaSuccess, "first allocation");
  cudaFree(p);
}

static void scenario_nosignal(void) {
  first_use();
  struct sigaction sa;
  disposition(SIGUSR2, &sa);
  CHECK(!(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL, "SIGUSR2 keeps its default action");
}

static void scenario_usr1(void) {
  first_use();
  struct sigaction sa;
  disposition(SIGUSR2, &sa);
  CHECK(sa.sa_handler == SIG_DFL, "SIGUSR2 keeps its default action");
  disposition(SIGUSR1, &sa);
  CHECK(sa.sa_handler != SIG_DFL, "SIGUSR1 has the shim's handler");
  raise(SIGUSR1);
  CHECK(wait_for("memory report (vmmshim_dump", 1), "SIGUSR1 wrote the report");
}

static volatile sig_atomic_t g_own;
static void own_handler(int sig) { g_own = sig; }

static void scenario_ownhandler(void) {
  signal(SIGUSR2, own_handler);
  first_use();
  raise(SIGUSR2);
  CHECK(g_own == SIGUSR2, "the program's handler ran");
  sleep_ms(100);
  CHECK(!strstr(read_log(), "memory report"), "the shim did not answer the program's signal");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(60);
    snprintf(g_log, sizeof g_log, "/tmp/vmmshim-report-test.%d.log", (int)getpid());
    if (!strcmp(sc, "oom")) scenario_oom();
    else if (!strcmp(sc, "limit")) scenario_limit();
    else if (!strcmp(sc, "frag")) scenario_frag();
    else if (!strcmp(sc, "quiet")) scenario_quiet();
    else if (!strcmp(sc, "nosignal")) scenario_nosignal();
    else if (!strcmp(sc, "usr1")) scenario_usr1();
    else if (!strcmp(sc, "ownhandler")) scenario_ownhandler();
    else CHECK(0, "unknown scenario %s", sc);
    if (check_failed) printf("log %s:\n%s\n", g_log, read_log());
    unlink(g_log);
    return check_child_summary(sc);
  }
  check_run_child("oom", "VMMSHIM_LOG=warn:/tmp/vmmshim-report-test.%p.log", NULL);
  check_run_child("limit", "VMMSHIM_LIMIT=64M", "VMMSHIM_LOG=warn:/tmp/vmmshim-report-test.%p.log", NULL);
  check_run_child("frag", "VMMSHIM_GRANULARITY=2M", "VMMSHIM_LOG=warn:/tmp/vmmshim-report-test.%p.log", NULL);
  check_run_child("quiet", "VMMSHIM_LOG=error:/tmp/vmmshim-report-test.%p.log", NULL);
  check_run_child("nosignal", "VMMSHIM_DUMP_SIGNAL=0", "VMMSHIM_LOG=warn:/tmp/vmmshim-report-test.%p.log", NULL);
  check_run_child("usr1", "VMMSHIM_DUMP_SIGNAL=USR1", "VMMSHIM_LOG=warn:/tmp/vmmshim-report-test.%p.log", NULL);
  check_run_child("ownhandler", "VMMSHIM_LOG=warn:/tmp/vmmshim-report-test.%p.log", NULL);
  return check_summary();
}
