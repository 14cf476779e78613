/* (c) Stream-ordered allocation on several streams.
 *  1. Cross-stream reuse: a block freed (cudaFreeAsync) on stream 1 while a kernel there still
 *     writes it must not reach stream 2 before that work completed. Stream 2 writes another
 *     pattern into its new block at once; after both streams finished, both patterns must be
 *     intact (stream 1's result was copied aside before its free).
 *  2. Loops: 4 streams, each cudaMallocAsync / fill / verify / cudaFreeAsync with mixed sizes,
 *     first from one host thread, then from 4 host threads (one stream each).
 * Checks that the pointers are VMM and the shim counted async allocations. */
#include <thread>
#include <vector>

#include "gpu_test.cuh"

static const int NS = 4;

static void cross_stream(cudaStream_t s1, cudaStream_t s2, size_t size, const char *label,
                         unsigned long long *d_errs) {
  char name[96];
  void *keep = NULL, *x = NULL, *y = NULL;
  CK(cudaMalloc(&keep, size));
  CK(cudaDeviceSynchronize());
  CK(cudaMallocAsync(&x, size, s1));
  spin_fill(x, size, 0x1111u, 100ull * 1000 * 1000, s1); /* still writing x for ~100 ms */
  CK(cudaMemcpyAsync(keep, x, size, cudaMemcpyDeviceToDevice, s1));
  CK(cudaFreeAsync(x, s1));
  CK(cudaMallocAsync(&y, size, s2)); /* must not be x before s1's work is done */
  fill(y, size, 0x2222u, s2);
  bool s1_busy = cudaStreamQuery(s1) == cudaErrorNotReady;
  CK(cudaStreamSynchronize(s1));
  CK(cudaStreamSynchronize(s2));
  printf("INFO streams/%s: stream 2 %s stream 1's freed block; stream 1 %s when stream 2 got it\n", label,
         x == y ? "got" : "did not get", s1_busy ? "was still busy" : "had finished");

  unsigned long long e1 = 0, e2 = 0;
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(y, size, 0x2222u, d_errs, s2);
  CK(cudaMemcpyAsync(&e2, d_errs, sizeof e2, cudaMemcpyDeviceToHost, s2));
  CK(cudaStreamSynchronize(s2));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(keep, size, 0x1111u, d_errs, s2);
  CK(cudaMemcpyAsync(&e1, d_errs, sizeof e1, cudaMemcpyDeviceToHost, s2));
  CK(cudaStreamSynchronize(s2));
  snprintf(name, sizeof name, "cross-stream-reuse-%s", label);
  check(e1 == 0 && e2 == 0, name, "stream 1's data: %llu bad words, stream 2's data: %llu bad words", e1, e2);
  snprintf(name, sizeof name, "async-alloc-is-vmm-%s", label);
  check(is_vmm(y), name, "cudaMallocAsync pointer %p is not VMM", y);
  CK(cudaFreeAsync(y, s2));
  CK(cudaStreamSynchronize(s2));
  CK(cudaFree(keep));
}

/* ITER rounds on one stream: allocate a few blocks, fill, verify, free them stream-ordered. */
static void loop_on_stream(cudaStream_t s, int sidx, int iters, unsigned long long *d_errs, int *not_vmm) {
  uint64_t r = 0x9E3779B97F4A7C15ull * (sidx + 1);
  for (int it = 0; it < iters; it++) {
    void *p[4];
    size_t n[4];
    uint32_t seed[4];
    for (int k = 0; k < 4; k++) {
      r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
      uint64_t x = r * 0x2545F4914F6CDD1Dull;
      n[k] = (size_t)256 << (x % 17); /* 256 B .. 16 MiB */
      n[k] += (x >> 20) % 1000;
      seed[k] = (uint32_t)(sidx * 100000 + it * 4 + k);
      CK(cudaMallocAsync(&p[k], n[k], s));
      if (it % 16 == 0 && !is_vmm(p[k])) (*not_vmm)++;
      fill(p[k], n[k], seed[k], s);
    }
    for (int k = 0; k < 4; k++) verify(p[k], n[k], seed[k], d_errs, s);
    for (int k = 0; k < 4; k++) CK(cudaFreeAsync(p[k], s));
  }
}

int main(void) {
  g_prog = "streams";
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  vmmshim_stats_t s0, s1;
  shim_stats(&s0);

  cudaStream_t st[NS];
  for (int i = 0; i < NS; i++) CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
  unsigned long long *d_errs;
  CK(cudaMalloc(&d_errs, NS * sizeof *d_errs));

  cross_stream(st[1], st[2], 4ull << 20, "4MiB", d_errs);
  cross_stream(st[1], st[2], 96ull << 20, "96MiB", d_errs);
  cross_stream(st[3], st[0], 1000, "1000B", d_errs);

  /* One host thread, four streams. */
  CK(cudaMemset(d_errs, 0, NS * sizeof *d_errs));
  int not_vmm = 0;
  for (int round = 0; round < 60; round++)
    for (int i = 0; i < NS; i++) loop_on_stream(st[i], i, 1, d_errs + i, &not_vmm);
  CK(cudaDeviceSynchronize());
  unsigned long long e[NS];
  CK(cudaMemcpy(e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  unsigned long long et = e[0] + e[1] + e[2] + e[3];
  check(et == 0, "four-streams-one-thread", "%llu bad words (per stream %llu %llu %llu %llu)", et, e[0], e[1],
        e[2], e[3]);

  /* Four host threads, one stream each. */
  CK(cudaMemset(d_errs, 0, NS * sizeof *d_errs));
  std::vector<std::thread> th;
  int nv[NS] = {0, 0, 0, 0};
  for (int i = 0; i < NS; i++)
    th.emplace_back([&, i] { loop_on_stream(st[i], i + 10, 150, d_errs + i, &nv[i]); });
  for (auto &t : th) t.join();
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  et = e[0] + e[1] + e[2] + e[3];
  check(et == 0, "four-streams-four-threads", "%llu bad words (per stream %llu %llu %llu %llu)", et, e[0], e[1],
        e[2], e[3]);
  not_vmm += nv[0] + nv[1] + nv[2] + nv[3];
  check(not_vmm == 0, "loop-allocs-are-vmm", "%d sampled cudaMallocAsync pointers are not VMM", not_vmm);

  shim_stats(&s1);
  uint64_t async_allocs = (s1.allocs[VMMSHIM_API_RUNTIME_ASYNC] + s1.allocs[VMMSHIM_API_DRIVER_ASYNC]) -
                          (s0.allocs[VMMSHIM_API_RUNTIME_ASYNC] + s0.allocs[VMMSHIM_API_DRIVER_ASYNC]);
  uint64_t expect = 6 + 60 * NS * 4 + NS * 150 * 4;
  check(async_allocs >= expect, "stats-count-async-allocs", "shim counted %llu async allocations, expected %llu",
        (unsigned long long)async_allocs, (unsigned long long)expect);
  print_stats("streams at end", &s1);

  for (int i = 0; i < NS; i++) CK(cudaStreamDestroy(st[i]));
  CK(cudaFree(d_errs));
  return finish();
}
