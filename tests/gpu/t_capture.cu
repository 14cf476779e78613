/* (d) Stream capture. A graph captured from cudaMallocAsync + kernels + cudaFreeAsync (graph
 * memory nodes: the shim passes these through to the runtime) is instantiated and launched 10
 * times; each launch fills the graph's buffer and adds its verification result and a checksum
 * into buffers allocated outside the capture. Done in the global and the thread-local capture
 * modes. Allocations made outside the capture, before and after, must still be VMM memory. */
#include "gpu_test.cuh"

/* Adds the words of p into *sum (to show the graph's kernels ran, once per launch). */
__global__ void k_sum(const uint32_t *p, size_t words, unsigned long long *sum) {
  unsigned long long acc = 0;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (size_t)gridDim.x * blockDim.x)
    acc += p[w];
  if (acc) atomicAdd(sum, acc);
}

static void run_mode(cudaStreamCaptureMode mode, const char *label, size_t size) {
  char name[96];
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long *d_out; /* [0] mismatches, [1] checksum */
  CK(cudaMalloc(&d_out, 2 * sizeof *d_out));
  CK(cudaMemset(d_out, 0, 2 * sizeof *d_out));
  CK(cudaDeviceSynchronize());
  snprintf(name, sizeof name, "outside-before-capture-is-vmm-%s", label);
  check(is_vmm(d_out), name, "buffer allocated before the capture is not VMM");

  vmmshim_stats_t st0, st1;
  shim_stats(&st0);

  cudaGraph_t g;
  cudaGraphExec_t ge;
  void *p = NULL;
  CK(cudaStreamBeginCapture(s, mode));
  CK(cudaMallocAsync(&p, size, s));
  fill(p, size, 0xC0FFEEu, s);
  verify(p, size, 0xC0FFEEu, d_out, s);
  k_sum<<<grid_for(size), 256, 0, s>>>((const uint32_t *)p, size / 4, d_out + 1);
  CK(cudaGetLastError());
  CK(cudaFreeAsync(p, s));
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));

  shim_stats(&st1);
  printf("INFO capture/%s: shim allocations during capture %llu, pass-through %llu\n", label,
         (unsigned long long)(stats_allocs(&st1) - stats_allocs(&st0)),
         (unsigned long long)(st1.passthrough_allocs - st0.passthrough_allocs));

  const int LAUNCHES = 10;
  for (int i = 0; i < LAUNCHES; i++) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));

  unsigned long long out[2];
  CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
  unsigned long long want = 0;
  for (size_t w = 0; w < size / 4; w++) want += pattern_word(0xC0FFEEu, w);
  want *= LAUNCHES;
  snprintf(name, sizeof name, "graph-data-%s", label);
  check(out[0] == 0, name, "%llu words of the graph's buffer differ from the pattern", out[0]);
  snprintf(name, sizeof name, "graph-ran-10-times-%s", label);
  check(out[1] == want, name, "checksum %llu, expected %llu (10 launches)", out[1], want);

  /* Outside the capture again: the shim serves. */
  void *q = NULL;
  CK(cudaMallocAsync(&q, size, s));
  fill(q, size, 7u, s);
  CK(cudaMemsetAsync(d_out, 0, sizeof *d_out, s));
  verify(q, size, 7u, d_out, s);
  CK(cudaMemcpyAsync(out, d_out, sizeof *d_out, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  snprintf(name, sizeof name, "after-capture-async-is-vmm-%s", label);
  check(is_vmm(q) && out[0] == 0, name, "cudaMallocAsync after the capture: vmm %d, %llu bad words", is_vmm(q),
        out[0]);
  CK(cudaFreeAsync(q, s));
  void *r = NULL;
  CK(cudaMalloc(&r, 1 << 20));
  snprintf(name, sizeof name, "after-capture-malloc-is-vmm-%s", label);
  check(is_vmm(r), name, "cudaMalloc after the capture is not VMM");
  CK(cudaFree(r));

  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d_out));
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGraphMemTrim(dev));
}

int main(void) {
  g_prog = "capture";
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  run_mode(cudaStreamCaptureModeGlobal, "global", 8ull << 20);
  run_mode(cudaStreamCaptureModeThreadLocal, "threadlocal", (3ull << 20) + 1000);
  vmmshim_stats_t s;
  shim_stats(&s);
  check(stats_allocs(&s) >= 6, "stats-count", "shim counted %llu allocations", (unsigned long long)stats_allocs(&s));
  print_stats("capture at end", &s);
  return finish();
}
