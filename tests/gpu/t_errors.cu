/* (f) Error paths, as the real runtime answers them (H100, CUDA 13.0):
 * cudaFree of a freed pointer and of an interior pointer return cudaErrorInvalidValue (also
 * seen by cudaGetLastError), cudaFree(NULL) succeeds; the interior free leaves the block alive
 * and its data intact; after all that, allocation works and data verifies. */
#include "gpu_test.cuh"

int main(void) {
  g_prog = "errors";
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  unsigned long long *d_errs, e = 0;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));

  /* Double free. */
  void *p = NULL;
  CK(cudaMalloc(&p, 1 << 20));
  CK(cudaFree(p));
  cudaError_t r = cudaFree(p);
  check(r == cudaErrorInvalidValue, "double-free", "cudaFree of a freed pointer returned %s", cudaGetErrorName(r));
  cudaError_t last = cudaGetLastError();
  check(last == cudaErrorInvalidValue, "double-free-last-error", "cudaGetLastError returned %s after it",
        cudaGetErrorName(last));
  check(cudaGetLastError() == cudaSuccess, "last-error-cleared", "cudaGetLastError did not clear");

  /* Interior pointer: an error, and the block stays alive. */
  size_t n = (3u << 20) + 100;
  uint8_t *q = NULL;
  CK(cudaMalloc((void **)&q, n));
  fill(q, n, 42u, 0);
  CK(cudaDeviceSynchronize());
  r = cudaFree(q + 256);
  check(r == cudaErrorInvalidValue, "interior-free", "cudaFree(base + 256) returned %s", cudaGetErrorName(r));
  cudaGetLastError();
  r = cudaFree(q + n / 2);
  check(r == cudaErrorInvalidValue, "interior-free-middle", "cudaFree(base + n/2) returned %s", cudaGetErrorName(r));
  cudaGetLastError();
  /* A new allocation must not land on the still-live block. */
  uint8_t *o = NULL;
  CK(cudaMalloc((void **)&o, n));
  check(o + n <= q || q + n <= o, "no-reuse-of-live-block", "new block %p overlaps the live block %p", (void *)o,
        (void *)q);
  fill(o, n, 43u, 0);
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(q, n, 42u, d_errs, 0);
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  check(e == 0, "interior-free-keeps-data", "%llu words of the block changed", e);
  CK(cudaFree(o));
  r = cudaFree(q);
  check(r == cudaSuccess, "free-after-interior", "cudaFree of the base afterwards returned %s", cudaGetErrorName(r));

  /* NULL. */
  r = cudaFree(NULL);
  check(r == cudaSuccess, "free-null", "cudaFree(NULL) returned %s", cudaGetErrorName(r));
  r = cudaFreeAsync(NULL, 0);
  printf("INFO errors: cudaFreeAsync(NULL) returned %s\n", cudaGetErrorName(r));
  cudaGetLastError();

  /* Still works. */
  const int K = 32;
  void *b[K];
  int vmm = 0;
  for (int i = 0; i < K; i++) {
    size_t sz = (size_t)1000 << (i % 14);
    CK(cudaMalloc(&b[i], sz));
    vmm += is_vmm(b[i]);
    fill(b[i], sz, 900u + i, 0);
  }
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  for (int i = 0; i < K; i++) verify(b[i], (size_t)1000 << (i % 14), 900u + i, d_errs, 0);
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  check(e == 0 && vmm == K, "alloc-after-errors", "%llu bad words, %d of %d VMM", e, vmm, K);
  for (int i = 0; i < K; i++) CK(cudaFree(b[i]));
  CK(cudaFree(d_errs));
  check(cudaGetLastError() == cudaSuccess, "no-error-left", "an error was left behind");
  vmmshim_stats_t s;
  shim_stats(&s);
  print_stats("errors at end", &s);
  return finish();
}
