/* t_ctl: a program that never calls the shim, put to sleep and woken entirely from outside with
 * `vmmshim ctl` (tests/gpu/ctl_drive.sh drives it; docs/control.md). It waits between phases:
 * at each it writes the phase's name to $CTL_DIR/phase and waits for the file $CTL_DIR/go.<phase>
 * (60 s at most, then it fails).
 *
 *   started    one small allocation made (the shim is active, its channel open); the driver
 *              sets the process's tag to weights
 *   loaded     weights (2 GiB, cudaMalloc, a known pattern) allocated; the driver sets the tag to kv
 *   filled     kv (two 1 GiB blocks, cudaMallocAsync on two streams) filled; a CUDA graph that reads
 *              weights and kv captured and replayed (checksum); a ~300 ms kernel still runs on kv.
 *              The driver sleeps kv (discard) and weights (host), and checks status
 *   asleep     the program sees the driver's free memory rise by what was given back
 *   checked    the driver wakes weights, and kv with --zero
 *   capturing  after the program's checks (weights intact, kv zeros, the same graph replays to the
 *              same checksum at the same addresses), a stream capture is in progress: the driver's
 *              sleep is refused with EBUSY after VMMSHIM_SLEEP_WAIT; the capture then ends whole. */
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_test.cuh"

static const char *g_dir;

static void phase(const char *name) {
  char path[1024], go[1024];
  snprintf(path, sizeof path, "%s/phase.tmp", g_dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%s\n", name);
    fclose(f);
  }
  char final_path[1024];
  snprintf(final_path, sizeof final_path, "%s/phase", g_dir);
  rename(path, final_path);
  snprintf(go, sizeof go, "%s/go.%s", g_dir, name);
  double t0 = now_ms();
  struct stat st;
  while (stat(go, &st) != 0) {
    if (now_ms() - t0 > 60000) {
      check(false, name, "the driver did not say go within 60 s (%s)", go);
      exit(finish());
    }
    usleep(10000);
  }
}

__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

__global__ void k_count_bad(const uint32_t *p, size_t n, uint32_t seed, bool zero, unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != (zero ? 0u : ((uint32_t)(i * 2654435761u) ^ seed));
  if (b) atomicAdd(bad, b);
}

__global__ void k_sum(const uint32_t *a, size_t na, const uint32_t *b, size_t nb, unsigned long long *out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < na; i += (size_t)gridDim.x * blockDim.x) s += a[i];
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nb; i += (size_t)gridDim.x * blockDim.x) s += b[i];
  atomicAdd(out, s);
}

__global__ void k_spin(uint32_t *p, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (threadIdx.x == 0) p[0] += 1;
}

static unsigned long long count_bad(const uint32_t *p, size_t n, uint32_t seed, bool zero) {
  unsigned long long *bad;
  CK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  k_count_bad<<<264, 256>>>(p, n, seed, zero, bad);
  CK(cudaDeviceSynchronize());
  unsigned long long r = *bad;
  CK(cudaFree(bad));
  return r;
}

static size_t free_mem(void) {
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

int main(void) {
  g_prog = "ctl";
  g_dir = getenv("CTL_DIR");
  if (!g_dir) {
    check(false, "setup", "CTL_DIR is not set (tests/gpu/ctl_drive.sh runs this program)");
    return finish();
  }
  check(dlsym(RTLD_DEFAULT, "vmmshim_api_version") != NULL, "shim", "the shim is preloaded");
  char path[1024];
  snprintf(path, sizeof path, "%s/pid", g_dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
  }
  CK(cudaSetDevice(0));
  void *first;
  CK(cudaMalloc(&first, 1 << 20)); /* the shim activates: its control channel opens */
  phase("started");

  const size_t wn = 2ull << 30, kn = 1ull << 30;
  uint32_t *w;
  CK(cudaMalloc(&w, wn)); /* tag weights, set from outside */
  k_fill<<<264, 256>>>(w, wn / 4, 1);
  CK(cudaDeviceSynchronize());
  phase("loaded");

  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  uint32_t *k1, *k2;
  CK(cudaMallocAsync((void **)&k1, kn, s1)); /* tag kv */
  CK(cudaMallocAsync((void **)&k2, kn, s2));
  unsigned long long *sum;
  CK(cudaMalloc(&sum, sizeof *sum));
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
  size_t free0 = free_mem();
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  k_spin<<<1, 32, 0, s2>>>(k2, (long long)clock_khz * 300); /* still running when the sleep begins */
  phase("filled");

  size_t free1 = free_mem();
  check(free1 >= free0 + wn + 2 * kn - (64u << 20), "memory-given-back",
        "the driver reports %zu MiB free, %zu before the sleeps (weights and kv: %zu MiB)", free1 >> 20, free0 >> 20,
        (wn + 2 * kn) >> 20);
  check(cudaGetLastError() == cudaSuccess, "no-fault", "no error after the sleeps from outside");
  phase("asleep");
  phase("checked");

  check(count_bad(w, wn / 4, 1, false) == 0, "weights-intact", "weights hold their pattern after the host sleep");
  check(count_bad(k1, kn / 4, 0, true) == 0 && count_bad(k2, kn / 4, 0, true) == 0, "kv-zeroed",
        "kv woke as zeros (--zero)");
  k_fill<<<264, 256, 0, s1>>>(k1, kn / 4, 2);
  k_fill<<<264, 256, 0, s1>>>(k2, kn / 4, 3);
  CK(cudaGraphLaunch(ge, s1));
  CK(cudaMemcpyAsync(&c1, sum, sizeof c1, cudaMemcpyDeviceToHost, s1));
  CK(cudaStreamSynchronize(s1));
  check(c1 == c0, "graph-replay", "the graph captured before the sleeps: checksum %llx, before %llx", c1, c0);

  cudaGraph_t g2;
  CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  k_sum<<<264, 256, 0, s1>>>(k1, kn / 4, k2, 0, sum);
  phase("capturing");
  check(cudaStreamEndCapture(s1, &g2) == cudaSuccess, "capture-whole", "the capture ended whole after the refused sleep");
  CK(cudaGraphDestroy(g2));

  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(w));
  CK(cudaFreeAsync(k1, s1));
  CK(cudaFreeAsync(k2, s2));
  CK(cudaFree(sum));
  CK(cudaFree(first));
  CK(cudaDeviceSynchronize());
  return finish();
}
