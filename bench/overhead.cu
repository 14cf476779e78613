/* Steady-state overhead: allocate once (1 GiB), then run a memory-bound kernel over it
 * <launches> times (about 2 s on an H100), so that any cost the shim adds outside allocation
 * (hooks, memory mapped through VMM handles) shows up.
 *
 *   overhead <label> [launches]
 *
 * Prints R overhead cfg=<label> launches=.. kernel_ms=<events> loop_ms=<host clock> checksum=..
 * bench/run.sh also times the whole process. */
#include "bench.cuh"

__global__ void k_axpy(const float *x, float *y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = y[i] * 0.999f + x[i];
}

__global__ void k_init(float *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (float)(i % 1000) * 1e-3f;
}

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "run";
  int launches = argc > 2 ? atoi(argv[2]) : 4000;
  const size_t bytes = 1ull << 30, n = bytes / 2 / sizeof(float);
  CK(cudaSetDevice(0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *buf;
  CK(cudaMalloc(&buf, bytes));
  float *x = buf, *y = buf + n;
  k_init<<<sms * 8, 256>>>(buf, 2 * n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double t0 = now_us();
  CK(cudaEventRecord(e0));
  for (int i = 0; i < launches; i++) k_axpy<<<sms * 8, 256>>>(x, y, n);
  CK(cudaGetLastError());
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  double t1 = now_us();
  float ms = 0, h[4];
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaMemcpy(h, y + n / 2, sizeof h, cudaMemcpyDeviceToHost));
  printf("R overhead cfg=%s launches=%d kernel_ms=%.2f loop_ms=%.2f checksum=%.6g", label, launches, ms,
         (t1 - t0) / 1e3, (double)(h[0] + h[1] + h[2] + h[3]));
  print_shim_fields();
  printf("\n");
  CK(cudaFree(buf));
  return 0;
}
