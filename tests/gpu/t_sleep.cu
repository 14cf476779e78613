/* t_sleep: tags leave the GPU and come back at the same addresses (docs/sleep.md), on a GPU.
 * Runs only under the shim (its API is found with dlsym; missing, the test fails).
 *
 * SLEEP_MODE=graph (default): weights (cudaMalloc, a known pattern) and kv (cudaMallocAsync on
 *   two streams) in their own tags; a CUDA graph that reads both and writes a checksum; kv is
 *   slept (discard) and weights (host) while a long kernel still runs on kv; the free memory the
 *   driver reports rises by what was given back; a second process allocates that memory, fills it
 *   and exits; both tags wake; kv is filled again; the same graph replays to the same checksum at
 *   the same addresses.
 * SLEEP_MODE=mapped: weights asleep in mapped mode serve kernels that read and write all of
 *   them, with the right results; the kernel's bandwidth on host-mapped and on device memory;
 *   pointer queries answer device memory; the wake keeps what the kernels wrote.
 * SLEEP_MODE=cycles: 50 sleep/wake cycles (host and discard): the process's resident memory,
 *   the shim's mapped bytes and the host memory it holds do not grow after the second cycle.
 * SLEEP_MODE=child: the second process of graph mode (allocates SLEEP_CHILD_MB and fills it). */
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test.cuh"

typedef int (*sleep_fn)(const char *, vmmshim_sleep_mode_t, vmmshim_sleep_result_t *, size_t);
typedef int (*wake_fn)(const char *, unsigned, vmmshim_sleep_result_t *, size_t);
typedef int (*tag_fn)(const char *);
typedef int (*host_fn)(uint64_t *, uint64_t *);

static sleep_fn p_sleep;
static wake_fn p_wake;
static tag_fn p_tag;
static host_fn p_host;

static bool find_api(void) {
  p_sleep = (sleep_fn)dlsym(RTLD_DEFAULT, "vmmshim_sleep");
  p_wake = (wake_fn)dlsym(RTLD_DEFAULT, "vmmshim_wake");
  p_tag = (tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  p_host = (host_fn)dlsym(RTLD_DEFAULT, "vmmshim_host_memory");
  return p_sleep && p_wake && p_tag && p_host;
}

__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

__global__ void k_count_bad(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != ((uint32_t)(i * 2654435761u) ^ seed);
  if (b) atomicAdd(bad, b);
}

__global__ void k_count_nonzero(const uint32_t *p, size_t n, unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) b += p[i] != 0;
  if (b) atomicAdd(bad, b);
}

__global__ void k_sum(const uint32_t *a, size_t na, const uint32_t *b, size_t nb, unsigned long long *out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < na; i += (size_t)gridDim.x * blockDim.x) s += a[i];
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nb; i += (size_t)gridDim.x * blockDim.x) s += b[i];
  atomicAdd(out, s);
}

/* Reads and writes every word: x = x * 3 + 1 (the host checks the result). */
__global__ void k_touch(uint32_t *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = p[i] * 3u + 1u;
}

__global__ void k_spin(uint32_t *p, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (threadIdx.x == 0) p[0] += 1;
}

static unsigned long long count_bad(const uint32_t *p, size_t n, uint32_t seed) {
  unsigned long long *bad;
  CK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  k_count_bad<<<264, 256>>>(p, n, seed, bad);
  CK(cudaDeviceSynchronize());
  unsigned long long r = *bad;
  CK(cudaFree(bad));
  return r;
}

static unsigned long long count_nonzero(const uint32_t *p, size_t n) {
  unsigned long long *bad;
  CK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  k_count_nonzero<<<264, 256>>>(p, n, bad);
  CK(cudaDeviceSynchronize());
  unsigned long long r = *bad;
  CK(cudaFree(bad));
  return r;
}

static void *tagged(const char *tag, size_t n) {
  p_tag(tag);
  void *p = NULL;
  CK(cudaMalloc(&p, n));
  p_tag(NULL);
  return p;
}

static size_t free_mem(void) {
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

static int mode_child(void) {
  size_t n = (size_t)atol(getenv("SLEEP_CHILD_MB") ? getenv("SLEEP_CHILD_MB") : "0") << 20;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, n);
  check(e == cudaSuccess, "child-alloc", "cudaMalloc(%zu MiB) in the second process: %s", n >> 20, cudaGetErrorName(e));
  if (e == cudaSuccess) {
    CK(cudaMemset(p, 0xab, n));
    CK(cudaDeviceSynchronize());
    CK(cudaFree(p));
  }
  return finish();
}

static int mode_graph(const char *self) {
  const size_t wn = 2ull << 30, kn = 1ull << 30; /* bytes */
  uint32_t *w = (uint32_t *)tagged("weights", wn);
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  p_tag("kv");
  uint32_t *k1 = NULL, *k2 = NULL;
  CK(cudaMallocAsync((void **)&k1, kn, s1));
  CK(cudaMallocAsync((void **)&k2, kn, s2));
  p_tag(NULL);
  unsigned long long *sum;
  CK(cudaMalloc(&sum, sizeof *sum));
  k_fill<<<264, 256, 0, s1>>>(w, wn / 4, 1);
  k_fill<<<264, 256, 0, s1>>>(k1, kn / 4, 2);
  k_fill<<<264, 256, 0, s2>>>(k2, kn / 4, 3);
  CK(cudaDeviceSynchronize());

  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  CK(cudaMemsetAsync(sum, 0, sizeof *sum, s1));
  k_sum<<<264, 256, 0, s1>>>(w, wn / 4, k1, kn / 4, sum);
  k_sum<<<264, 256, 0, s1>>>(k2, kn / 4, k2, 0, sum);
  CK(cudaStreamEndCapture(s1, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  unsigned long long c0 = 0, c1 = 0;
  CK(cudaGraphLaunch(ge, s1));
  CK(cudaMemcpyAsync(&c0, sum, sizeof c0, cudaMemcpyDeviceToHost, s1));
  CK(cudaStreamSynchronize(s1));

  /* A long kernel still runs on kv when the sleeps begin. */
  size_t free0 = free_mem();
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  k_spin<<<1, 32, 0, s2>>>(k2, (long long)clock_khz * 300); /* ~300 ms */
  vmmshim_sleep_result_t r;
  double t0 = now_ms();
  int rc = p_sleep("kv", VMMSHIM_SLEEP_DISCARD, &r, sizeof r);
  double t_kv = now_ms() - t0;
  check(rc == 0 && r.released >= 2 * kn, "sleep-kv", "rc %d released %llu (%s)", rc, (unsigned long long)r.released,
        r.reason);
  check(t_kv >= 200, "sleep-waits-kernel", "the sleep waited for the running kernel: %.0f ms", t_kv);
  t0 = now_ms();
  rc = p_sleep("weights", VMMSHIM_SLEEP_HOST, &r, sizeof r);
  double t_w = now_ms() - t0;
  check(rc == 0 && r.to_host >= wn, "sleep-weights", "rc %d to host %llu in %.1f ms (%.1f GiB/s) %s", rc,
        (unsigned long long)r.to_host, t_w, wn / (t_w / 1e3) / (1 << 30), r.reason);
  check(cudaGetLastError() == cudaSuccess, "no-fault", "no error after sleeping under a running kernel");
  size_t free1 = free_mem();
  check(free1 >= free0 + wn + 2 * kn - (64u << 20), "driver-free", "free memory %zu -> %zu MiB", free0 >> 20,
        free1 >> 20);

  /* A second process takes that memory and gives it back. */
  char mb[32];
  snprintf(mb, sizeof mb, "%zu", (wn + 2 * kn) >> 20);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("SLEEP_MODE", "child", 1);
    setenv("SLEEP_CHILD_MB", mb, 1);
    unsetenv("LD_PRELOAD");
    execl(self, self, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "second-process", "the second process allocated %s MiB: status %d", mb,
        st);

  t0 = now_ms();
  rc = p_wake("weights", 0, &r, sizeof r);
  double t_ww = now_ms() - t0;
  check(rc == 0 && r.restored >= wn, "wake-weights", "rc %d restored %llu in %.1f ms (%.1f GiB/s) %s", rc,
        (unsigned long long)r.restored, t_ww, wn / (t_ww / 1e3) / (1 << 30), r.reason);
  rc = p_wake("kv", VMMSHIM_WAKE_ZERO, &r, sizeof r);
  check(rc == 0, "wake-kv", "rc %d %s", rc, r.reason);
  check(count_bad(w, wn / 4, 1) == 0, "weights-intact", "weights hold their pattern after the host sleep");
  unsigned long long nz = count_nonzero(k1, kn / 4) + count_nonzero(k2, kn / 4);
  check(nz == 0, "kv-zeroed", "discarded kv wakes as zeros (%llu words are not)", nz);
  k_fill<<<264, 256, 0, s1>>>(k1, kn / 4, 2);
  k_fill<<<264, 256, 0, s1>>>(k2, kn / 4, 3);
  CK(cudaGraphLaunch(ge, s1));
  CK(cudaMemcpyAsync(&c1, sum, sizeof c1, cudaMemcpyDeviceToHost, s1));
  CK(cudaStreamSynchronize(s1));
  check(c1 == c0, "graph-replay", "the same graph after sleep and wake: checksum %llx, before %llx", c1, c0);
  printf("VALUE sleep_discard_kv_ms %.1f\nVALUE sleep_host_gibps %.1f\nVALUE wake_host_gibps %.1f\n", t_kv,
         wn / (t_w / 1e3) / (1 << 30), wn / (t_ww / 1e3) / (1 << 30));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(w));
  CK(cudaFreeAsync(k1, s1));
  CK(cudaFreeAsync(k2, s2));
  CK(cudaFree(sum));
  CK(cudaDeviceSynchronize());
  return finish();
}

static double kernel_gbps(uint32_t *p, size_t n) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  k_touch<<<528, 256>>>(p, n);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 2.0 * n * 4 / (ms / 1e3) / 1e9; /* read and write */
}

static int mode_mapped(void) {
  const size_t wn = 1ull << 30;
  uint32_t *w = (uint32_t *)tagged("weights", wn);
  k_fill<<<264, 256>>>(w, wn / 4, 7);
  CK(cudaDeviceSynchronize());
  double dev_gbps = kernel_gbps(w, wn / 4); /* x*3+1 once */
  vmmshim_sleep_result_t r;
  double t0 = now_ms();
  int rc = p_sleep("weights", VMMSHIM_SLEEP_MAPPED, &r, sizeof r);
  double ts = now_ms() - t0;
  check(rc == 0 && r.host_mapped >= wn, "sleep-mapped", "rc %d host mapped %llu in %.1f ms %s", rc,
        (unsigned long long)r.host_mapped, ts, r.reason);
  cudaPointerAttributes pa;
  CK(cudaPointerGetAttributes(&pa, w));
  check(pa.type == cudaMemoryTypeDevice && pa.device == 0, "pointer-type", "cudaPointerGetAttributes: type %d device %d",
        (int)pa.type, pa.device);
  double host_gbps = kernel_gbps(w, wn / 4); /* x*3+1 again, on host memory */
  check(cudaGetLastError() == cudaSuccess, "kernel-on-mapped", "kernels run on memory asleep in mapped mode");
  /* Expected: seed 7 pattern, twice x*3+1. */
  uint32_t *h = (uint32_t *)malloc(wn);
  CK(cudaMemcpy(h, w, wn, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < wn / 4; i++) {
    uint32_t x = (uint32_t)(i * 2654435761u) ^ 7u;
    x = x * 3u + 1u;
    x = x * 3u + 1u;
    bad += h[i] != x;
  }
  check(bad == 0, "mapped-results", "%zu wrong words after kernels on host-mapped memory", bad);
  t0 = now_ms();
  rc = p_wake("weights", 0, &r, sizeof r);
  double tw = now_ms() - t0;
  check(rc == 0, "wake-mapped", "rc %d in %.1f ms %s", rc, tw, r.reason);
  CK(cudaMemcpy(h, w, wn, cudaMemcpyDeviceToHost));
  bad = 0;
  for (size_t i = 0; i < wn / 4; i++) {
    uint32_t x = (uint32_t)(i * 2654435761u) ^ 7u;
    x = x * 3u + 1u;
    x = x * 3u + 1u;
    bad += h[i] != x;
  }
  check(bad == 0, "wake-keeps-writes", "%zu wrong words after the wake", bad);
  printf("VALUE mapped_kernel_gbps %.1f\nVALUE device_kernel_gbps %.1f\nVALUE sleep_mapped_gibps %.1f\n"
         "VALUE wake_mapped_gibps %.1f\n",
         host_gbps, dev_gbps, wn / (ts / 1e3) / (1 << 30), wn / (tw / 1e3) / (1 << 30));
  free(h);
  CK(cudaFree(w));
  return finish();
}

static long rss_kb(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = -1;
  fclose(f);
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int mode_cycles(void) {
  const size_t wn = 512ull << 20, kn = 256ull << 20;
  uint32_t *w = (uint32_t *)tagged("weights", wn);
  uint32_t *k = (uint32_t *)tagged("kv", kn);
  k_fill<<<264, 256>>>(w, wn / 4, 9);
  CK(cudaDeviceSynchronize());
  typedef int (*stats_fn)(vmmshim_stats_t *, size_t);
  stats_fn p_stats = (stats_fn)dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  long rss2 = 0;
  uint64_t mapped2 = 0, host2 = 0;
  int failures = 0;
  for (int i = 0; i < 50; i++) {
    vmmshim_sleep_result_t r;
    failures += p_sleep("weights", VMMSHIM_SLEEP_HOST, &r, sizeof r) != 0;
    failures += p_sleep("kv", VMMSHIM_SLEEP_DISCARD, &r, sizeof r) != 0;
    failures += p_wake(NULL, 0, &r, sizeof r) != 0;
    k_fill<<<264, 256>>>(k, kn / 4, (uint32_t)i);
    CK(cudaDeviceSynchronize());
    if (i == 1) {
      vmmshim_stats_t st;
      p_stats(&st, sizeof st);
      rss2 = rss_kb();
      mapped2 = st.bytes_mapped;
      p_host(NULL, &host2);
    }
  }
  vmmshim_stats_t st;
  p_stats(&st, sizeof st);
  uint64_t host = 0;
  p_host(NULL, &host);
  long rss = rss_kb();
  check(failures == 0, "cycles-ok", "%d failed calls in 50 cycles", failures);
  check(count_bad(w, wn / 4, 9) == 0, "cycles-intact", "weights intact after 50 cycles");
  check(rss <= rss2 + 16 * 1024, "rss", "resident memory %ld -> %ld KiB", rss2, rss);
  check(st.bytes_mapped <= mapped2, "mapped", "mapped bytes %llu -> %llu", (unsigned long long)mapped2,
        (unsigned long long)st.bytes_mapped);
  check(host <= host2, "host", "host memory kept %llu -> %llu", (unsigned long long)host2, (unsigned long long)host);
  CK(cudaFree(w));
  CK(cudaFree(k));
  return finish();
}

int main(int argc, char **argv) {
  (void)argc;
  const char *mode = getenv("SLEEP_MODE") ? getenv("SLEEP_MODE") : "graph";
  static char prog[64];
  snprintf(prog, sizeof prog, "sleep-%s", mode);
  g_prog = prog;
  if (!strcmp(mode, "child")) return mode_child();
  bool api = find_api();
  check(api, "shim", "the shim's sleep API is there (preloaded)");
  if (!api) return finish();
  CK(cudaSetDevice(0));
  if (!strcmp(mode, "graph")) return mode_graph(argv[0]);
  if (!strcmp(mode, "mapped")) return mode_mapped();
  if (!strcmp(mode, "cycles")) return mode_cycles();
  check(false, "mode", "unknown SLEEP_MODE %s", mode);
  return finish();
}
