/* (b) Free semantics. A kernel on a non-blocking stream spins ~200 ms and then writes buffer A;
 * the host calls cudaFree(A) right after launching it.
 *   sync mode (default): cudaFree must not return before the kernel finished (host time and
 *     cudaStreamQuery tell).
 *   deferred mode (VMMSHIM_FREE_MODE=deferred, read here too): cudaFree returns in < 5 ms while
 *     the kernel still runs.
 * In both modes a cudaMalloc of the same size right after the free gets memory that the kernel's
 * late writes must not touch: the new buffer is written on another stream at once, then, after
 * the spinning kernel finished, verified. */
#include "gpu_test.cuh"

static const unsigned long long SPIN_NS = 200ull * 1000 * 1000;

static void one_round(bool deferred, size_t size, const char *label, cudaStream_t s1, cudaStream_t s2,
                      unsigned long long *d_errs) {
  char name[96];
  void *a = NULL, *b = NULL;
  CK(cudaMalloc(&a, size));
  CK(cudaMemset(a, 0, size));
  CK(cudaDeviceSynchronize());

  spin_fill(a, size, 0xBADu, SPIN_NS, s1); /* the late writer */
  double t0 = now_ms();
  CK(cudaFree(a));
  double t1 = now_ms();
  cudaError_t q = cudaStreamQuery(s1); /* cudaSuccess: kernel done; cudaErrorNotReady: still running */
  if (q != cudaSuccess && q != cudaErrorNotReady) CK(q);
  double free_ms = t1 - t0;
  printf("INFO free/%s: cudaFree took %.3f ms, kernel %s right after\n", label, free_ms,
         q == cudaSuccess ? "finished" : "still running");

  if (!deferred) {
    snprintf(name, sizeof name, "sync-free-waits-%s", label);
    check(free_ms >= 150.0 && q == cudaSuccess, name,
          "cudaFree returned after %.3f ms, kernel %s (it spins %.0f ms)", free_ms,
          q == cudaSuccess ? "finished" : "still running", SPIN_NS / 1e6);
  } else {
    snprintf(name, sizeof name, "deferred-free-returns-fast-%s", label);
    check(free_ms < 5.0 && q == cudaErrorNotReady, name, "cudaFree took %.3f ms, kernel %s", free_ms,
          q == cudaSuccess ? "already finished" : "still running");
  }

  /* The same size again at once; written on another stream while s1 may still run. */
  double t2 = now_ms();
  CK(cudaMalloc(&b, size));
  double t3 = now_ms();
  printf("INFO free/%s: cudaMalloc after the free took %.3f ms, %s the freed address\n", label, t3 - t2,
         a == b ? "same as" : "not");
  fill(b, size, 0x600Du, s2);
  CK(cudaStreamSynchronize(s1)); /* the late writes have landed now */
  CK(cudaStreamSynchronize(s2));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(b, size, 0x600Du, d_errs, s2);
  unsigned long long e = 0;
  CK(cudaMemcpyAsync(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost, s2));
  CK(cudaStreamSynchronize(s2));
  snprintf(name, sizeof name, "%s-new-alloc-not-overwritten-%s", deferred ? "deferred" : "sync", label);
  check(e == 0, name, "%llu words of the new allocation were overwritten by the kernel that wrote the freed one",
        e);
  check(is_vmm(b), deferred ? "deferred-new-alloc-is-vmm" : "sync-new-alloc-is-vmm", "new allocation is not VMM");
  CK(cudaFree(b));
}

int main(void) {
  g_prog = "free";
  const char *mode = getenv("VMMSHIM_FREE_MODE");
  bool deferred = mode && strcmp(mode, "deferred") == 0;
  printf("INFO free: mode %s\n", deferred ? "deferred" : "sync");
  CK(cudaFree(0));
  if (!require_shim()) return finish();

  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  unsigned long long *d_errs;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));

  /* Warm the pool so that the measured free is not the first one. */
  void *w;
  CK(cudaMalloc(&w, 1 << 20));
  CK(cudaFree(w));

  one_round(deferred, 1ull << 20, "1MiB", s1, s2, d_errs);
  one_round(deferred, 64ull << 20, "64MiB", s1, s2, d_errs);
  one_round(deferred, 3000, "3000B", s1, s2, d_errs);

  /* Several frees pending at once (deferred), then allocations of the same sizes. */
  {
    const int K = 8;
    void *a[K], *b[K];
    size_t sz = 8ull << 20;
    for (int i = 0; i < K; i++) CK(cudaMalloc(&a[i], sz));
    for (int i = 0; i < K; i++) spin_fill(a[i], sz, 0xBAD0u + i, SPIN_NS / 4, s1);
    for (int i = 0; i < K; i++) CK(cudaFree(a[i]));
    for (int i = 0; i < K; i++) {
      CK(cudaMalloc(&b[i], sz));
      fill(b[i], sz, 0x7000u + i, s2);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemset(d_errs, 0, sizeof *d_errs));
    for (int i = 0; i < K; i++) verify(b[i], sz, 0x7000u + i, d_errs, 0);
    unsigned long long e = 0;
    CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
    check(e == 0, deferred ? "deferred-many-pending-frees" : "sync-many-frees",
          "%llu words of new allocations overwritten by late writers", e);
    for (int i = 0; i < K; i++) CK(cudaFree(b[i]));
  }

  CK(cudaFree(d_errs));
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
  vmmshim_stats_t s;
  shim_stats(&s);
  print_stats("free at end", &s);
  return finish();
}
