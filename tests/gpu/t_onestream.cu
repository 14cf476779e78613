/* Deferred mode while all work goes to one stream (VMMSHIM_FREE_MODE=deferred, the legacy
 * stream): a block freed while a kernel queued before the free still reads it is handed out
 * again at once, and the next owner's kernel (queued behind on the same stream) writes it
 * without the reader seeing those bytes. Then the first launch on a second stream: it must wait
 * on the GPU (not the host) for the reader still queued on the legacy stream before writing a
 * block reused in stream order. After that, frees wait for a synchronisation again.
 * Run with VMMSHIM_ONE_STREAM=0 too: no reuse while the reader runs, same results. */
#include "gpu_test.cuh"

static const unsigned long long SPIN_NS = 200ull * 1000 * 1000;

/* Spins ns nanoseconds, then counts the words of [0, n) that differ from the pattern. */
__global__ void k_spin_verify(const uint8_t *p, size_t n, uint32_t seed, unsigned long long ns,
                              unsigned long long *errs) {
  spin_ns(ns);
  size_t words = n / 4;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long bad = 0;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    bad += ((const uint32_t *)p)[w] != pattern_word(seed, w);
  if (bad) atomicAdd(errs, bad);
}

/* A block of size bytes with pattern seed, and a 200 ms reader of it queued on the legacy stream. */
static void *read_later(size_t size, uint32_t seed, unsigned long long *d_errs) {
  void *p = NULL;
  CK(cudaMalloc(&p, size));
  fill(p, size, seed, 0);
  k_spin_verify<<<sm_count(), 256, 0, 0>>>((const uint8_t *)p, size, seed, SPIN_NS, d_errs);
  CK(cudaGetLastError());
  return p;
}

static unsigned long long take(unsigned long long *d_errs) {
  unsigned long long e = 0;
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  return e;
}

int main(void) {
  g_prog = "onestream";
  const char *env = getenv("VMMSHIM_ONE_STREAM");
  bool on = !env || strcmp(env, "0") != 0;
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  unsigned long long *d_errs;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  CK(cudaDeviceSynchronize());
  const size_t sizes[] = {3000, 1ull << 20, 64ull << 20};
  vmmshim_stats_t s0;
  shim_stats(&s0);

  /* 1. Reuse on the one stream while the reader runs. */
  for (size_t size : sizes) {
    char name[96];
    void *a = read_later(size, 0x1111u, d_errs);
    double t0 = now_ms();
    CK(cudaFree(a));
    void *b = NULL;
    CK(cudaMalloc(&b, size));
    double host_ms = now_ms() - t0;
    cudaError_t q = cudaStreamQuery(0);
    fill(b, size, 0x2222u, 0); /* the next owner writes, behind the reader */
    printf("INFO onestream %zu B: free + malloc %.3f ms, reader %s, %s address\n", size, host_ms,
           q == cudaErrorNotReady ? "still running" : "done", a == b ? "same" : "another");
    if (on) {
      snprintf(name, sizeof name, "onestream-reused-at-once-%zu", size);
      check(host_ms < 20.0 && q == cudaErrorNotReady && a == b, name,
            "free + malloc took %.3f ms, reader %s, freed %p, got %p", host_ms,
            q == cudaErrorNotReady ? "running" : "done", a, b);
    } else {
      snprintf(name, sizeof name, "onestream-off-not-reused-while-read-%zu", size);
      check(a != b || q == cudaSuccess, name, "freed %p handed out while its reader ran", a);
    }
    unsigned long long e = take(d_errs);
    snprintf(name, sizeof name, "onestream-reader-intact-%zu", size);
    check(e == 0, name, "the reader queued before the free saw %llu words of the next owner's", e);
    snprintf(name, sizeof name, "onestream-new-owner-bytes-%zu", size);
    size_t bad = errors_in(b, size, 0x2222u);
    check(bad == 0, name, "%zu words of the new owner's data wrong", bad);
    CK(cudaFree(b));
  }
  vmmshim_stats_t s1;
  shim_stats(&s1);
  printf("INFO onestream: synchronisations for frees %llu\n", (unsigned long long)(s1.syncs - s0.syncs));

  /* 2. The first launch on another stream, writing a block reused in stream order. */
  void *c = read_later(64ull << 20, 0x3333u, d_errs);
  CK(cudaFree(c));
  void *d = NULL;
  CK(cudaMalloc(&d, 64ull << 20));
  cudaStream_t x;
  CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  double t0 = now_ms();
  fill(d, 64ull << 20, 0x4444u, x);
  double launch_ms = now_ms() - t0;
  cudaError_t q = cudaStreamQuery(0);
  if (on) /* (off, the malloc waited for the reader: nothing is left to wait for) */
    check(launch_ms < 20.0 && q == cudaErrorNotReady, "onestream-second-stream-no-host-wait",
          "the launch on the second stream took %.3f ms, reader %s", launch_ms,
          q == cudaErrorNotReady ? "running" : "done");
  CK(cudaStreamSynchronize(x));
  CK(cudaDeviceSynchronize());
  unsigned long long e = take(d_errs);
  check(e == 0, "onestream-second-stream-waits-on-gpu", "the reader saw %llu words of the second stream's write", e);
  check(errors_in(d, 64ull << 20, 0x4444u) == 0, "onestream-second-stream-write", "the second stream's write is wrong");
  CK(cudaFree(d));

  /* 3. Two streams now: a block freed while read is not handed out before the read is done. */
  void *f = read_later(64ull << 20, 0x5555u, d_errs);
  CK(cudaFree(f));
  void *g = NULL;
  CK(cudaMalloc(&g, 64ull << 20));
  fill(g, 64ull << 20, 0x6666u, x);
  CK(cudaDeviceSynchronize());
  e = take(d_errs);
  check(e == 0, "onestream-after-two-streams-intact", "the reader saw %llu words of a later owner's write", e);
  CK(cudaFree(g));

  CK(cudaStreamDestroy(x));
  CK(cudaFree(d_errs));
  vmmshim_stats_t s;
  shim_stats(&s);
  print_stats("onestream at end", &s);
  return finish();
}
