/* test_static_api: a program with the (emulated) CUDA runtime linked statically, as nvcc
 * links by default, run under the shim. Its cudaMalloc never reaches the shim's runtime
 * hooks; it reaches the driver through cuGetProcAddress, which the shim answers with its
 * driver hooks. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL)");
  emu_counters_t e0 = emu_now();
  vmmshim_stats_t s0 = shim_stats();
  void *p[64];
  int bad = 0;
  for (int i = 0; i < 64; i++) {
    size_t n = (size_t)(i + 1) * 40000;
    if (cudaMalloc(&p[i], n) != cudaSuccess || ((uintptr_t)p[i] % 256)) {
      bad++;
      p[i] = NULL;
      continue;
    }
    if (emu_handle_info((CUdeviceptr)(uintptr_t)p[i], NULL, NULL, NULL) != 0 ||
        emu_handle_info((CUdeviceptr)(uintptr_t)p[i] + n - 1, NULL, NULL, NULL) != 0) {
      bad++;
      continue;
    }
    pat_fill(p[i], n, (unsigned long long)i);
  }
  CHECK(bad == 0, "%d allocations failed, misaligned or unmapped", bad);
  vmmshim_stats_t s1 = shim_stats();
  emu_counters_t e1 = emu_now();
  CHECK(s1.allocs[VMMSHIM_API_DRIVER] == s0.allocs[VMMSHIM_API_DRIVER] + 64,
        "static cudaMalloc not served through the driver hook: %llu of 64",
        (unsigned long long)(s1.allocs[VMMSHIM_API_DRIVER] - s0.allocs[VMMSHIM_API_DRIVER]));
  CHECK(e1.n_cuMemAlloc == e0.n_cuMemAlloc, "static cudaMalloc reached the driver %llu times",
        e1.n_cuMemAlloc - e0.n_cuMemAlloc);
  CHECK(e1.n_cuMemCreate > 0 && e1.n_cuMemMap > 0 && e1.n_cuMemSetAccess > 0, "no VMM calls");
  int corrupt = 0;
  for (int i = 0; i < 64; i += 2)
    if (p[i]) {
      CHECK(cudaFree(p[i]) == cudaSuccess, "free");
      p[i] = NULL;
    }
  for (int i = 1; i < 64; i += 2)
    if (p[i] && pat_check(p[i], (size_t)(i + 1) * 40000, (unsigned long long)i) != (size_t)-1) corrupt++;
  CHECK(corrupt == 0, "%d blocks corrupted", corrupt);
  for (int i = 1; i < 64; i += 2)
    if (p[i]) CHECK(cudaFree(p[i]) == cudaSuccess, "free");
  vmmshim_stats_t s2 = shim_stats();
  CHECK(s2.frees[VMMSHIM_API_DRIVER] == s0.frees[VMMSHIM_API_DRIVER] + 64, "frees counted %llu",
        (unsigned long long)(s2.frees[VMMSHIM_API_DRIVER] - s0.frees[VMMSHIM_API_DRIVER]));

  /* async, both default-stream flavours */
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *a = NULL, *b = NULL, *c = NULL;
  e0 = emu_now();
  CHECK(cudaMallocAsync(&a, 100000, s) == cudaSuccess, "async");
  CHECK(cudaMallocAsync_ptsz(&b, 100000, 0) == cudaSuccess, "async ptsz");
  CHECK(cudaMallocAsync(&c, 100000, 0) == cudaSuccess, "async legacy");
  e1 = emu_now();
  vmmshim_stats_t s3 = shim_stats();
  CHECK(s3.allocs[VMMSHIM_API_DRIVER_ASYNC] == s2.allocs[VMMSHIM_API_DRIVER_ASYNC] + 3, "async served %llu of 3",
        (unsigned long long)(s3.allocs[VMMSHIM_API_DRIVER_ASYNC] - s2.allocs[VMMSHIM_API_DRIVER_ASYNC]));
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync, "async reached the driver");
  CHECK(cudaFreeAsync(a, s) == cudaSuccess && cudaFreeAsync_ptsz(b, 0) == cudaSuccess &&
            cudaFreeAsync(c, 0) == cudaSuccess,
        "async frees");
  void *a2 = NULL;
  CHECK(cudaMallocAsync(&a2, 100000, s) == cudaSuccess && a2 == a, "stream reuse %p %p", a2, a);
  CHECK(cudaFreeAsync(a2, s) == cudaSuccess, "free");

  /* errors as the runtime reports them */
  void *q = NULL;
  CHECK(cudaMalloc(&q, 5000) == cudaSuccess, "alloc");
  CHECK(cudaFree(q) == cudaSuccess, "free");
  CHECK(cudaFree(q) == cudaErrorInvalidValue, "double free");
  cudaGetLastError();

  /* capture through the static runtime */
  int v0 = emu_violations();
  s0 = shim_stats();
  e0 = emu_now();
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  void *g = NULL;
  CHECK(cudaMallocAsync(&g, 4096, s) == cudaSuccess, "alloc in capture");
  CHECK(cudaFreeAsync(g, s) == cudaSuccess, "free in capture");
  cudaGraph_t graph = NULL;
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end");
  e1 = emu_now();
  s1 = shim_stats();
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync + 1, "capture alloc did not pass through");
  CHECK(s1.passthrough_allocs > s0.passthrough_allocs, "passthrough not counted");
  if (graph) cudaGraphDestroy(graph);
  CHECK(emu_violations() == v0, "violations");

  size_t f = 0, t = 0;
  CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && f >= t - emu_device_used(0), "meminfo adjusted: %zu < %zu", f,
        t - emu_device_used(0));
  CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "teardown");
  /* reset drops the pool; memory served again afterwards */
  CHECK(cudaDeviceReset() == cudaSuccess, "reset");
  emu_counters_t e2 = emu_now();
  CHECK(e2.live_mappings == 0 && e2.live_handles == 0, "after reset: %ld mappings %ld handles", e2.live_mappings,
        e2.live_handles);
  s0 = shim_stats();
  CHECK(cudaMalloc(&q, MiB) == cudaSuccess, "alloc after reset");
  CHECK(shim_stats().allocs[VMMSHIM_API_DRIVER] == s0.allocs[VMMSHIM_API_DRIVER] + 1, "not served after reset");
  CHECK(cudaFree(q) == cudaSuccess, "free");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
