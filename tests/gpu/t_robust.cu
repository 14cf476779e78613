/* (h) Robustness under the shim. One program, one check group per run, chosen with
 * ROBUST_MODE (tests/gpu/run.sh passes it through the environment, as it does the VMMSHIM_*
 * options):
 *
 *   pressure        1 GiB blocks until cudaMalloc fails (must be cudaErrorMemoryAllocation; the
 *                   runner compares the error and the count with a run without the shim), free
 *                   half, allocate them again, verify every block; under the shim alloc_failures > 0.
 *                   Prints "RESULT pressure error=<name> blocks=<n>".
 *   limit           run with VMMSHIM_LIMIT=<ROBUST_CAP_MB>M: cudaMemGetInfo total == cap, free <= cap;
 *                   128 MiB blocks until cudaErrorMemoryAllocation, their sum within 384 MiB under
 *                   the cap; free all, allocate the same again, data verifies. With ROBUST_PEER_ME
 *                   and ROBUST_PEER_OTHER (two processes at once) each creates its own file once it
 *                   holds its cap and waits for the other's: both held their caps at the same time.
 *   stress          16 threads, each up to ROBUST_OPS (default 100000) allocations or frees or until
 *                   ROBUST_SECONDS (default 20) pass: cudaMalloc/cudaFree and cudaMallocAsync/
 *                   cudaFreeAsync on a per-thread stream, 256 B..8 MiB, filled by a kernel after
 *                   allocation and verified by a kernel before the free; alarm() catches deadlocks;
 *                   then all freed, vmmshim_trim(), bytes_mapped == 0.
 *   fork            allocates, forks a child that does not touch CUDA and exits(0) (atexit handlers
 *                   run): it must end within 10 s with status 0 while the parent keeps allocating;
 *                   then system() runs /bin/true and "$ROBUST_PYTHON -c pass" (LD_PRELOAD inherited):
 *                   exit 0 and nothing on their stderr.
 *   reset           allocate, cudaDeviceReset, allocate again (data verifies, memory came back);
 *                   the same with cuDevicePrimaryCtxReset.
 *   sanitize-clean  (under compute-sanitizer memcheck) clean allocations, fills and verifies.
 *   sanitize-far    a 1 MiB block, one write at block + 2 GiB (unmapped address space).
 *   sanitize-near   a 1 MiB block, one write at block + 1 MiB (past the block, inside the mapping).
 *
 * Without the shim (the reference runs of pressure and reset) the shim-only checks are left out;
 * tests/gpu/run.sh says with GPU_TEST_SHIM which runs are meant to be under it, and those check
 * first that it is loaded and active (gpu_test.cuh: shim_as_expected). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "gpu_test.cuh"

static const size_t MiB = 1ull << 20, GiB = 1ull << 30;
static bool g_shim = false;

static size_t env_size(const char *name, size_t def) {
  const char *v = getenv(name);
  return v && *v ? (size_t)strtoull(v, NULL, 10) : def;
}

/* Errors of all verify kernels since the last call (d_errs is reset). */
static unsigned long long take_errs(unsigned long long *d_errs, cudaStream_t s) {
  unsigned long long e = 0;
  CK(cudaMemcpyAsync(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemsetAsync(d_errs, 0, sizeof *d_errs, s));
  CK(cudaStreamSynchronize(s));
  return e;
}

/* Loads the fill and verify kernels before memory runs out (lazy module loading needs memory). */
static bool g_reset_invisible = false;
static void warm_kernels(void) {
  void *p;
  unsigned long long *e;
  CK(cudaMalloc(&p, 4096));
  CK(cudaMalloc((void **)&e, sizeof *e));
  CK(cudaMemset(e, 0, sizeof *e));
  fill(p, 4096, 1, 0);
  verify(p, 4096, 1, e, 0);
  CK(cudaDeviceSynchronize());
  CK(cudaFree(p));
  CK(cudaFree(e));
}

/* ------------------------------------------------------------------ 1. pressure */
static int mode_pressure(void) {
  warm_kernels();
  unsigned long long *d_errs;
  CK(cudaMalloc((void **)&d_errs, sizeof *d_errs));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  size_t free0 = 0, total0 = 0;
  CK(cudaMemGetInfo(&free0, &total0));
  printf("INFO pressure: cudaMemGetInfo free %.2f GiB of %.2f GiB before\n", (double)free0 / GiB,
         (double)total0 / GiB);
  std::vector<void *> blk;
  cudaError_t err = cudaSuccess;
  double t0 = now_ms();
  while (blk.size() < 4096) {
    void *p = NULL;
    err = cudaMalloc(&p, GiB);
    if (err != cudaSuccess) break;
    blk.push_back(p);
    fill(p, GiB, 5000u + (uint32_t)blk.size() - 1, 0);
  }
  cudaError_t last = cudaGetLastError(); /* clears the failed call's error */
  CK(cudaDeviceSynchronize());
  size_t n = blk.size();
  printf("RESULT pressure error=%s blocks=%zu\n", cudaGetErrorName(err), n);
  printf("INFO pressure: %zu blocks of 1 GiB in %.0f ms, then %s (cudaGetLastError: %s)\n", n, now_ms() - t0,
         cudaGetErrorName(err), cudaGetErrorName(last));
  check(err == cudaErrorMemoryAllocation, "oom-error", "the failing cudaMalloc returned %s, not cudaErrorMemoryAllocation",
        cudaGetErrorName(err));
  check(n >= 2, "oom-blocks", "only %zu blocks of 1 GiB before the failure", n);
  /* Nothing else is broken: a small allocation still works while the device is full? Not
   * guaranteed (the device may be full to the byte); free half, then everything must work. */
  size_t freed = 0;
  for (size_t i = 1; i < n; i += 2) {
    CK(cudaFree(blk[i]));
    blk[i] = NULL;
    freed++;
  }
  size_t again = 0;
  cudaError_t err2 = cudaSuccess;
  for (size_t i = 1; i < n; i += 2) {
    err2 = cudaMalloc(&blk[i], GiB);
    if (err2 != cudaSuccess) {
      blk[i] = NULL;
      break;
    }
    again++;
    fill(blk[i], GiB, 9000u + (uint32_t)i, 0);
  }
  cudaGetLastError();
  check(again == freed, "realloc-after-free", "%zu of %zu blocks allocated again after freeing them (%s)", again, freed,
        cudaGetErrorName(err2));
  for (size_t i = 0; i < n; i++)
    if (blk[i]) verify(blk[i], GiB, (i % 2 ? 9000u : 5000u) + (uint32_t)i, d_errs, 0);
  unsigned long long e = take_errs(d_errs, 0);
  check(e == 0, "data-after-pressure", "%llu words differ over the %zu blocks (kept and re-allocated)", e, n);
  if (g_shim) {
    vmmshim_stats_t s;
    shim_stats(&s);
    check(s.alloc_failures > 0, "shim-counted-failure", "alloc_failures is %llu", (unsigned long long)s.alloc_failures);
    print_stats("pressure", &s);
  }
  for (size_t i = 0; i < n; i++)
    if (blk[i]) CK(cudaFree(blk[i]));
  CK(cudaFree(d_errs));
  /* After everything is back, a big allocation works again. */
  void *p = NULL;
  cudaError_t r = cudaMalloc(&p, n / 2 * GiB);
  check(r == cudaSuccess, "big-alloc-after", "cudaMalloc(%zu GiB) after freeing all returned %s", n / 2,
        cudaGetErrorName(r));
  if (p) CK(cudaFree(p));
  return finish();
}

/* ------------------------------------------------------------------ 2./5. limit */
static bool wait_file(const char *path, double ms) {
  double t0 = now_ms();
  struct stat st;
  while (stat(path, &st) != 0) {
    if (now_ms() - t0 > ms) return false;
    usleep(20000);
  }
  return true;
}

static int mode_limit(void) {
  if (!require_shim()) return finish();
  size_t cap = env_size("ROBUST_CAP_MB", 2048) * MiB;
  const char *me = getenv("ROBUST_PEER_ME"), *other = getenv("ROBUST_PEER_OTHER");
  warm_kernels();
  unsigned long long *d_errs;
  CK(cudaMalloc((void **)&d_errs, sizeof *d_errs));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  size_t fr = 0, tot = 0;
  CK(cudaMemGetInfo(&fr, &tot));
  printf("INFO limit: cudaMemGetInfo free %zu total %zu, cap %zu\n", fr, tot, cap);
  check(tot == cap, "meminfo-total", "cudaMemGetInfo total is %zu, expected the cap %zu", tot, cap);
  check(fr <= cap, "meminfo-free", "cudaMemGetInfo free %zu is over the cap %zu", fr, cap);
  const size_t B = 128 * MiB;
  std::vector<void *> blk;
  cudaError_t err = cudaSuccess;
  while (blk.size() < 1024) {
    void *p = NULL;
    err = cudaMalloc(&p, B);
    if (err != cudaSuccess) break;
    blk.push_back(p);
    fill(p, B, 300u + (uint32_t)blk.size() - 1, 0);
  }
  cudaGetLastError();
  size_t n = blk.size(), sum = n * B;
  printf("INFO limit: %zu blocks of 128 MiB (%zu MiB) under a cap of %zu MiB, then %s\n", n, sum / MiB, cap / MiB,
         cudaGetErrorName(err));
  check(err == cudaErrorMemoryAllocation, "cap-error", "the allocation past the cap returned %s",
        cudaGetErrorName(err));
  check(sum <= cap && sum + 3 * B >= cap, "cap-reached", "%zu MiB allocated, the cap is %zu MiB (expected within 384 MiB under it)",
        sum / MiB, cap / MiB);
  CK(cudaMemGetInfo(&fr, &tot));
  printf("INFO limit: at the cap cudaMemGetInfo free %zu total %zu\n", fr, tot);
  check(fr <= cap - sum, "meminfo-free-at-cap", "free %zu but only %zu of the cap are left", fr, cap - sum);
  if (me && other) {
    FILE *f = fopen(me, "w");
    if (f) fclose(f);
    bool ok = wait_file(other, 30000);
    check(ok, "peer-at-cap-together", "the other process did not reach its cap within 30 s (%s missing)", other);
    usleep(300000);
  }
  for (size_t i = 0; i < n; i++) verify(blk[i], B, 300u + (uint32_t)i, d_errs, 0);
  unsigned long long e = take_errs(d_errs, 0);
  check(e == 0, "data-at-cap", "%llu words differ", e);
  for (size_t i = 0; i < n; i++) CK(cudaFree(blk[i]));
  size_t again = 0;
  for (size_t i = 0; i < n; i++) {
    if (cudaMalloc(&blk[i], B) != cudaSuccess) break;
    again++;
    fill(blk[i], B, 700u + (uint32_t)i, 0);
  }
  cudaGetLastError();
  for (size_t i = 0; i < again; i++) verify(blk[i], B, 700u + (uint32_t)i, d_errs, 0);
  e = take_errs(d_errs, 0);
  check(again == n && e == 0, "realloc-after-cap", "%zu of %zu blocks allocated again, %llu words differ", again, n, e);
  for (size_t i = 0; i < again; i++) CK(cudaFree(blk[i]));
  vmmshim_stats_t s;
  shim_stats(&s);
  check(s.alloc_failures > 0, "shim-counted-failure", "alloc_failures is %llu", (unsigned long long)s.alloc_failures);
  /* above zero too: the blocks up to the cap were mapped, so a peak of 0 is a counter never kept */
  check(s.peak_bytes_mapped > 0 && s.peak_bytes_mapped <= cap, "peak-mapped-under-cap",
        "peak_bytes_mapped %llu, expected above 0 and at most the cap %zu", (unsigned long long)s.peak_bytes_mapped, cap);
  print_stats("limit", &s);
  CK(cudaFree(d_errs));
  return finish();
}

/* ------------------------------------------------------------------ 3. stress */
enum { STRESS_THREADS = 16, STRESS_SLOTS = 8 };
static std::atomic<bool> g_stop(false);
static double g_deadline_ms;
static size_t g_target_ops;

struct stress_thread {
  int id;
  unsigned long long ops, allocs_sync, allocs_async, fails, errs;
  double ms;
};

static void on_alarm(int) {
  static const char msg[] = "FAIL robust/stress-no-deadlock: SIGALRM: the threads did not finish in time\n";
  ssize_t w = write(1, msg, sizeof msg - 1);
  (void)w;
  _exit(3);
}

static void *stress_main(void *arg) {
  stress_thread *t = (stress_thread *)arg;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t->id + 1);
  auto next = [&rng]() {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
  };
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long *d_errs;
  CK(cudaMalloc((void **)&d_errs, sizeof *d_errs));
  CK(cudaMemsetAsync(d_errs, 0, sizeof *d_errs, s));
  void *ptr[STRESS_SLOTS] = {0};
  size_t size[STRESS_SLOTS] = {0};
  uint32_t seed[STRESS_SLOTS] = {0};
  bool async[STRESS_SLOTS] = {0};
  uint32_t serial = 0;
  double t0 = now_ms();
  while (t->ops < g_target_ops && !g_stop.load(std::memory_order_relaxed)) {
    if ((t->ops & 63) == 0 && now_ms() > g_deadline_ms) break;
    int k = (int)(next() % STRESS_SLOTS);
    if (!ptr[k]) {
      double l = 8.0, h = 23.0; /* 256 B .. 8 MiB, log-uniform */
      size_t n = (size_t)exp2(l + (h - l) * (double)(next() >> 11) / 9007199254740992.0) + next() % 97;
      if (n > 8 * MiB) n = 8 * MiB;
      if (n < 256) n = 256;
      bool as = next() & 1;
      cudaError_t r = as ? cudaMallocAsync(&ptr[k], n, s) : cudaMalloc(&ptr[k], n);
      t->ops++;
      if (r != cudaSuccess) {
        t->fails++;
        ptr[k] = NULL;
        cudaGetLastError();
        continue;
      }
      (as ? t->allocs_async : t->allocs_sync)++;
      size[k] = n;
      async[k] = as;
      seed[k] = ((uint32_t)t->id << 24) ^ serial++;
      fill(ptr[k], n, seed[k], s);
    } else {
      verify(ptr[k], size[k], seed[k], d_errs, s);
      if (async[k]) {
        CK(cudaFreeAsync(ptr[k], s));
      } else {
        /* cudaFree does not order itself after work on a non-blocking stream: the verify
         * must be done first (the shim's sync mode synchronises anyway; deferred does not). */
        CK(cudaStreamSynchronize(s));
        CK(cudaFree(ptr[k]));
      }
      ptr[k] = NULL;
      t->ops++;
    }
  }
  for (int k = 0; k < STRESS_SLOTS; k++) {
    if (!ptr[k]) continue;
    verify(ptr[k], size[k], seed[k], d_errs, s);
    if (async[k]) {
      CK(cudaFreeAsync(ptr[k], s));
    } else {
      CK(cudaStreamSynchronize(s));
      CK(cudaFree(ptr[k]));
    }
  }
  CK(cudaMemcpyAsync(&t->errs, d_errs, sizeof t->errs, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaFree(d_errs));
  CK(cudaStreamDestroy(s));
  t->ms = now_ms() - t0;
  return NULL;
}

static int mode_stress(void) {
  if (!require_shim()) return finish();
  double secs = (double)env_size("ROBUST_SECONDS", 20);
  g_target_ops = env_size("ROBUST_OPS", 100000);
  warm_kernels();
  signal(SIGALRM, on_alarm);
  alarm((unsigned)secs + 45);
  g_deadline_ms = now_ms() + secs * 1e3;
  stress_thread th[STRESS_THREADS];
  pthread_t tid[STRESS_THREADS];
  double t0 = now_ms();
  for (int i = 0; i < STRESS_THREADS; i++) {
    memset(&th[i], 0, sizeof th[i]);
    th[i].id = i;
    pthread_create(&tid[i], NULL, stress_main, &th[i]);
  }
  unsigned long long ops = 0, min_ops = ~0ull, fails = 0, errs = 0, as = 0, sy = 0;
  for (int i = 0; i < STRESS_THREADS; i++) {
    pthread_join(tid[i], NULL);
    ops += th[i].ops;
    if (th[i].ops < min_ops) min_ops = th[i].ops;
    fails += th[i].fails;
    errs += th[i].errs;
    as += th[i].allocs_async;
    sy += th[i].allocs_sync;
  }
  double ms = now_ms() - t0;
  alarm(0);
  printf("INFO stress: %d threads, %llu ops in %.1f s (%.0f ops/s), fewest in a thread %llu, target %zu per thread%s; "
         "%llu cudaMalloc, %llu cudaMallocAsync\n",
         STRESS_THREADS, ops, ms / 1e3, ops / (ms / 1e3), min_ops, g_target_ops,
         min_ops >= g_target_ops ? " (reached)" : " (stopped by the time limit)", sy, as);
  check(errs == 0, "stress-data", "%llu words differed at verification", errs);
  check(fails == 0, "stress-no-alloc-failure", "%llu allocations failed", fails);
  check(min_ops >= 1000, "stress-progress", "a thread made only %llu ops", min_ops);
  /* The threads stop at the deadline: all of them joined well before the alarm's 45 s of grace (a
   * thread stuck on a lock until then ends the program through on_alarm's FAIL line). */
  check(ms <= secs * 1e3 + 15e3, "stress-stops-in-time", "the threads took %.1f s for a run of %.0f s", ms / 1e3,
        secs);
  vmmshim_stats_t sp;
  shim_stats(&sp);
  printf("INFO stress: the threads allocated from %llu pools (arenas)\n", (unsigned long long)sp.pools);
  CK(cudaDeviceSynchronize());
  typedef size_t (*trim_fn)(void);
  trim_fn trim = (trim_fn)dlsym(RTLD_DEFAULT, "vmmshim_trim");
  check(trim != NULL, "trim-found", "vmmshim_trim not found with dlsym");
  vmmshim_stats_t s;
  shim_stats(&s);
  print_stats("stress before trim", &s);
  size_t back = trim ? trim() : 0;
  shim_stats(&s);
  print_stats("stress after trim", &s);
  printf("INFO stress: vmmshim_trim gave back %zu bytes\n", back);
  check(s.bytes_mapped == 0, "trim-unmaps-all", "bytes_mapped is %llu after freeing all and vmmshim_trim (bytes_in_use %llu)",
        (unsigned long long)s.bytes_mapped, (unsigned long long)s.bytes_in_use);
  check(s.bytes_in_use == 0, "nothing-in-use", "bytes_in_use is %llu after freeing all", (unsigned long long)s.bytes_in_use);
  return finish();
}

/* ------------------------------------------------------------------ 4. fork */
static bool file_empty(const char *path, char *head, size_t n) {
  head[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return true;
  size_t got = fread(head, 1, n - 1, f);
  head[got] = 0;
  fclose(f);
  for (char *c = head; *c; c++)
    if (*c == '\n') *c = '|';
  return got == 0;
}

static int mode_fork(void) {
  warm_kernels();
  unsigned long long *d_errs;
  CK(cudaMalloc((void **)&d_errs, sizeof *d_errs));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  std::vector<void *> blk;
  std::vector<size_t> sz;
  for (int i = 0; i < 8; i++) {
    void *p;
    size_t n = (size_t)(i + 1) * 3 * MiB + 123;
    CK(cudaMalloc(&p, n));
    fill(p, n, 40u + i, 0);
    blk.push_back(p);
    sz.push_back(n);
  }
  CK(cudaDeviceSynchronize());
  fflush(stdout);
  fflush(stderr);
  double t0 = now_ms();
  pid_t pid = fork();
  if (pid < 0) {
    check(false, "fork", "fork failed: %s", strerror(errno));
    return finish();
  }
  if (pid == 0) {
    /* The child: no CUDA at all; a normal exit runs the atexit handlers (shim, runtime). */
    exit(0);
  }
  /* The parent keeps allocating while the child exits. */
  for (int i = 0; i < 8; i++) {
    void *p;
    size_t n = (size_t)(i + 1) * 5 * MiB + 7;
    CK(cudaMalloc(&p, n));
    fill(p, n, 80u + i, 0);
    blk.push_back(p);
    sz.push_back(n);
  }
  int status = 0;
  pid_t w = 0;
  while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() - t0 < 10000) usleep(10000);
  double child_ms = now_ms() - t0;
  if (w == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    check(false, "fork-child-exits", "the child did not exit within 10 s (killed)");
  } else {
    check(w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork-child-exits",
          "the child ended with %s %d", WIFEXITED(status) ? "exit status" : "signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    printf("INFO fork: the child ended after %.0f ms\n", child_ms);
  }
  for (size_t i = 0; i < blk.size(); i++) verify(blk[i], sz[i], (i < 8 ? 40u : 72u) + (uint32_t)i, d_errs, 0);
  unsigned long long e = take_errs(d_errs, 0);
  check(e == 0, "fork-parent-data", "%llu words differ in the parent's blocks", e);
  size_t before = blk.size();
  for (size_t i = 0; i < before; i++) CK(cudaFree(blk[i]));
  void *p;
  CK(cudaMalloc(&p, 64 * MiB));
  fill(p, 64 * MiB, 99u, 0);
  verify(p, 64 * MiB, 99u, d_errs, 0);
  e = take_errs(d_errs, 0);
  check(e == 0 && (!g_shim || is_vmm(p)), "fork-parent-goes-on", "%llu words differ, VMM %d", e, (int)is_vmm(p));
  CK(cudaFree(p));

  /* Programs started from here inherit LD_PRELOAD (and VMMSHIM_*): they never use CUDA. */
  const char *dir = getenv("ROBUST_TMP");
  const char *py = getenv("ROBUST_PYTHON");
  if (!dir || !*dir) dir = "/tmp";
  if (!py || !*py) py = "python3";
  const char *pre = getenv("LD_PRELOAD");
  printf("INFO fork: children inherit LD_PRELOAD=%s\n", pre ? pre : "(unset)");
  const char *cmds[2][2] = {{"true", "/bin/true"}, {"python", NULL}};
  char pycmd[512];
  snprintf(pycmd, sizeof pycmd, "%s -c pass", py);
  cmds[1][1] = pycmd;
  for (int i = 0; i < 2; i++) {
    char errf[512], cmd[1200], head[300];
    snprintf(errf, sizeof errf, "%s/robust-child-%s.%d.stderr", dir, cmds[i][0], (int)getpid());
    snprintf(cmd, sizeof cmd, "%s 2>'%s'", cmds[i][1], errf);
    double t1 = now_ms();
    int rc = system(cmd);
    double ms = now_ms() - t1;
    bool empty = file_empty(errf, head, sizeof head);
    char name[64];
    snprintf(name, sizeof name, "child-%s-unaffected", cmds[i][0]);
    check(rc == 0 && empty, name, "'%s' returned %d, its stderr: '%s'", cmds[i][1], rc, head);
    printf("INFO fork: '%s' took %.0f ms\n", cmds[i][1], ms);
    unlink(errf);
  }
  CK(cudaFree(d_errs));
  return finish();
}

/* ------------------------------------------------------------------ 6. reset */
/* Allocates a few blocks (one of 1 GiB), fills and verifies them; frees none of them when
 * keep is set (the reset must take them away). Returns true when the data verified. */
static bool round_trip(const char *tag, bool keep, std::vector<void *> *kept) {
  unsigned long long *d_errs = NULL;
  cudaError_t r = cudaMalloc((void **)&d_errs, sizeof *d_errs);
  if (r != cudaSuccess) {
    printf("INFO reset %s: cudaMalloc returned %s\n", tag, cudaGetErrorName(r));
    return false;
  }
  if (cudaMemset(d_errs, 0, sizeof *d_errs) != cudaSuccess) return false;
  size_t sizes[5] = {1000, 3 * MiB + 5, 64 * MiB, 200 * MiB + 1, GiB};
  void *p[5] = {0};
  int vmm = 0;
  for (int i = 0; i < 5; i++) {
    r = cudaMalloc(&p[i], sizes[i]);
    if (r != cudaSuccess) {
      printf("INFO reset %s: cudaMalloc(%zu) returned %s\n", tag, sizes[i], cudaGetErrorName(r));
      return false;
    }
    vmm += is_vmm(p[i]);
    fill(p[i], sizes[i], 1234u + i, 0);
  }
  for (int i = 0; i < 5; i++) verify(p[i], sizes[i], 1234u + i, d_errs, 0);
  unsigned long long e = 1;
  r = cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost);
  if (r != cudaSuccess) {
    printf("INFO reset %s: cudaMemcpy returned %s\n", tag, cudaGetErrorName(r));
    return false;
  }
  printf("INFO reset %s: %llu bad words, %d of 5 blocks VMM\n", tag, e, vmm);
  if (keep) {
    for (int i = 0; i < 5; i++) kept->push_back(p[i]);
    kept->push_back(d_errs);
  } else {
    for (int i = 0; i < 5; i++) CK(cudaFree(p[i]));
    CK(cudaFree(d_errs));
  }
  return e == 0 && (!g_shim || vmm == 5);
}

static int mode_reset(void) {
  CK(cudaFree(0));
  size_t free0 = 0, tot = 0;
  CK(cudaMemGetInfo(&free0, &tot));
  std::vector<void *> kept;
  check(round_trip("before", true, &kept), "before-reset", "allocation or data failed before any reset");
  vmmshim_stats_t s;
  if (g_shim) {
    shim_stats(&s);
    print_stats("before cudaDeviceReset", &s);
  }
  cudaError_t r = cudaDeviceReset();
  check(r == cudaSuccess, "device-reset", "cudaDeviceReset returned %s", cudaGetErrorName(r));
  if (g_shim) {
    shim_stats(&s);
    print_stats("after cudaDeviceReset", &s);
    /* A statically linked runtime resets through private driver entry points: the shim
     * cannot see it (README, limitations). The shared runtime's cudaDeviceReset is hooked. */
    bool shared_rt = dlsym(RTLD_DEFAULT, "cudaGetDeviceCount") != NULL;
    if (shared_rt)
      check(s.bytes_mapped == 0, "reset-drops-pool", "bytes_mapped is %llu after cudaDeviceReset",
            (unsigned long long)s.bytes_mapped);
    else
      printf("INFO reset (static runtime, documented limitation): %llu bytes still mapped after cudaDeviceReset\n",
             (unsigned long long)s.bytes_mapped);
    g_reset_invisible = !shared_rt;
  }
  size_t free1 = 0;
  r = cudaMemGetInfo(&free1, &tot);
  printf("INFO reset: free %zu MiB at start, %zu MiB after cudaDeviceReset (%s)\n", free0 / MiB, free1 / MiB,
         cudaGetErrorName(r));
  if (!g_reset_invisible)
    check(r == cudaSuccess && free1 + 512 * MiB >= free0, "reset-memory-back",
          "free %zu MiB after the reset, %zu MiB at start (%s)", free1 / MiB, free0 / MiB, cudaGetErrorName(r));
  check(round_trip("after cudaDeviceReset", false, NULL), "alloc-after-device-reset",
        "allocation or data failed after cudaDeviceReset");

  kept.clear();
  check(round_trip("before primary reset", true, &kept), "before-primary-reset", "allocation or data failed");
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CUresult cr = cuDevicePrimaryCtxReset((CUdevice)dev);
  const char *cn = "?";
  cuGetErrorName(cr, &cn);
  check(cr == CUDA_SUCCESS, "primary-ctx-reset", "cuDevicePrimaryCtxReset returned %s", cn);
  if (g_shim) {
    shim_stats(&s);
    print_stats("after cuDevicePrimaryCtxReset", &s);
    check(s.bytes_mapped == 0, "primary-reset-drops-pool", "bytes_mapped is %llu after cuDevicePrimaryCtxReset",
          (unsigned long long)s.bytes_mapped);
  }
  r = cudaMemGetInfo(&free1, &tot);
  printf("INFO reset: free %zu MiB after cuDevicePrimaryCtxReset (%s)\n", free1 / MiB, cudaGetErrorName(r));
  check(r == cudaSuccess && free1 + 512 * MiB >= free0, "primary-reset-memory-back",
        "free %zu MiB after the reset, %zu MiB at start (%s)", free1 / MiB, free0 / MiB, cudaGetErrorName(r));
  check(round_trip("after cuDevicePrimaryCtxReset", false, NULL), "alloc-after-primary-reset",
        "allocation or data failed after cuDevicePrimaryCtxReset");
  return finish();
}

/* ------------------------------------------------------------------ 7. sanitizer */
__global__ void k_poke(uint32_t *p) { *p = 0xdeadbeefu; }

static int mode_sanitize(const char *what) {
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  if (strcmp(what, "clean") == 0) {
    unsigned long long *d_errs;
    CK(cudaMalloc((void **)&d_errs, sizeof *d_errs));
    CK(cudaMemset(d_errs, 0, sizeof *d_errs));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p[12];
    size_t n[12];
    for (int i = 0; i < 12; i++) {
      n[i] = (size_t)777 << i;
      if (i % 2)
        CK(cudaMallocAsync(&p[i], n[i], s));
      else
        CK(cudaMalloc(&p[i], n[i]));
      fill(p[i], n[i], 60u + i, s);
    }
    for (int i = 0; i < 12; i++) verify(p[i], n[i], 60u + i, d_errs, s);
    unsigned long long e = take_errs(d_errs, s);
    int vmm = 0;
    for (int i = 0; i < 12; i++) vmm += is_vmm(p[i]);
    for (int i = 0; i < 12; i++) {
      if (i % 2)
        CK(cudaFreeAsync(p[i], s));
      else
        CK(cudaFree(p[i]));
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d_errs));
    printf("INFO sanitize-clean: %d of 12 blocks VMM\n", vmm);
    check(e == 0, "clean-data", "%llu words differ", e);
    return finish();
  }
  size_t n = MiB;
  uint8_t *p;
  CK(cudaMalloc((void **)&p, n));
  CUdeviceptr base = 0;
  size_t range = 0;
  CUresult cr = cuMemGetAddressRange(&base, &range, (CUdeviceptr)p);
  printf("INFO sanitize-%s: block %p, cuMemGetAddressRange -> base 0x%llx size %zu (%d), VMM %d\n", what, (void *)p,
         (unsigned long long)base, range, (int)cr, (int)is_vmm(p));
  uint32_t *target = (uint32_t *)(strcmp(what, "far") == 0 ? p + 2 * GiB : p + n);
  k_poke<<<1, 1>>>(target);
  cudaError_t launch = cudaGetLastError();
  cudaError_t sync = cudaDeviceSynchronize();
  printf("INFO sanitize-%s: write at %p: launch %s, synchronize %s\n", what, (void *)target, cudaGetErrorName(launch),
         cudaGetErrorName(sync));
  /* Exits normally (compute-sanitizer's report is the result; its teardown runs at exit). */
  return finish();
}

int main(void) {
  g_prog = "robust";
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_shim = shim_as_expected();
  const char *mode = getenv("ROBUST_MODE");
  if (!mode) mode = "";
  printf("INFO robust: mode %s, shim %s\n", mode, g_shim ? "loaded" : "not loaded");
  if (strcmp(mode, "pressure") == 0) return mode_pressure();
  if (strcmp(mode, "limit") == 0) return mode_limit();
  if (strcmp(mode, "stress") == 0) return mode_stress();
  if (strcmp(mode, "fork") == 0) return mode_fork();
  if (strcmp(mode, "reset") == 0) return mode_reset();
  if (strncmp(mode, "sanitize-", 9) == 0) return mode_sanitize(mode + 9);
  check(false, "mode", "ROBUST_MODE='%s': expected pressure, limit, stress, fork, reset, sanitize-clean|far|near",
        mode);
  return finish();
}
