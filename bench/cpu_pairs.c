/* The shim's own cost per allocation + free pair, on the host emulation of the driver
 * (no GPU): `make bench-cpu`. A proxy for section 1 of `make bench` that any machine can
 * run: in the steady state a pair makes no driver call, so what is timed is the shim's
 * code (hook, arena lookup, bins, map, stats) plus the emulation's cuCtxGetCurrent.
 *
 *   cpu_pairs <async|malloc> <size> [size...]
 *
 * async: cudaMallocAsync + cudaFreeAsync on one stream; malloc: cudaMalloc + cudaFree (run it
 * with VMMSHIM_FREE_MODE=deferred: sync mode times the emulation's cuCtxSynchronize). For
 * each size: 20,000 warm-up pairs, then 25 rounds of 20,000 pairs, each round timed as a
 * whole; prints the median and the best round in ns per pair:
 *   R cpu-pairs mode=<m> size=<bytes> median_ns=<..> best_ns=<..>
 * CPU_PAIRS_DEPTH=N makes the pairs from N nested calls down (a real program allocates from
 * deep in its stack: what a traced stack costs depends on it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define ROUNDS 25
#define PAIRS 20000

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int pairs_at(int async, size_t size, cudaStream_t s, int n) {
  for (int i = 0; i < n; i++) {
    void *p = NULL;
    cudaError_t r = async ? cudaMallocAsync(&p, size, s) : cudaMalloc(&p, size);
    if (r != cudaSuccess) return -1;
    r = async ? cudaFreeAsync(p, s) : cudaFree(p);
    if (r != cudaSuccess) return -1;
  }
  return 0;
}

/* pairs_at, `depth` calls further down the stack */
static __attribute__((noinline)) int pairs_deep(int depth, int async, size_t size, cudaStream_t s, int n) {
  if (depth <= 0) return pairs_at(async, size, s, n);
  int r = pairs_deep(depth - 1, async, size, s, n);
  __asm__ volatile("" ::: "memory"); /* no tail call: every level stays a frame */
  return r;
}

static int g_depth;
static int pairs(int async, size_t size, cudaStream_t s, int n) { return pairs_deep(g_depth, async, size, s, n); }

int main(int argc, char **argv) {
  const char *d = getenv("CPU_PAIRS_DEPTH");
  g_depth = d ? atoi(d) : 0;
  if (argc < 3 || (strcmp(argv[1], "async") && strcmp(argv[1], "malloc"))) {
    fprintf(stderr, "usage: cpu_pairs <async|malloc> <size> [size...]\n");
    return 2;
  }
  int async = !strcmp(argv[1], "async");
  cudaStream_t s = NULL;
  if (async && cudaStreamCreate(&s) != cudaSuccess) {
    fprintf(stderr, "cpu_pairs: cudaStreamCreate failed\n");
    return 1;
  }
  for (int a = 2; a < argc; a++) {
    size_t size = strtoull(argv[a], NULL, 0);
    if (pairs(async, size, s, PAIRS) != 0) {
      fprintf(stderr, "cpu_pairs: allocation of %zu bytes failed\n", size);
      return 1;
    }
    double t[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
      double t0 = now_ns();
      if (pairs(async, size, s, PAIRS) != 0) return 1;
      t[r] = (now_ns() - t0) / PAIRS;
    }
    qsort(t, ROUNDS, sizeof t[0], cmp);
    printf("R cpu-pairs mode=%s size=%zu depth=%d median_ns=%.1f best_ns=%.1f\n", argv[1], size, g_depth, t[ROUNDS / 2],
           t[0]);
  }
  if (s) cudaStreamDestroy(s);
  return 0;
}
