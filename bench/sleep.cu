/* bench/sleep.cu: what a sleep and a wake of a tag cost (docs/sleep.md), under the shim.
 *
 *   sleep CFG GIB   allocates GIB GiB in tag "bench" (64 MiB blocks, filled by a kernel), then:
 *     discard: sleep + wake (zeros), three cycles;
 *     host:    sleep + wake, three cycles (the first obtains host memory unless
 *              VMMSHIM_HOST_RESERVE made it ahead; later ones reuse it);
 *     mapped:  the same, and the bandwidth of a kernel reading and writing the memory while it is
 *              asleep in mapped mode, against the same kernel on device memory.
 * Prints "R sleep cfg=CFG mode=M cycle=N gib=G sleep_ms=.. wake_ms=.. sleep_gibps=.. wake_gibps=.."
 * per cycle and "R sleep cfg=CFG kernel=device|mapped gbps=.."; checks the bytes after every
 * host and mapped cycle (bad=N). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.cuh"

typedef int (*sleep_fn)(const char *, vmmshim_sleep_mode_t, vmmshim_sleep_result_t *, size_t);
typedef int (*wake_fn)(const char *, unsigned, vmmshim_sleep_result_t *, size_t);
typedef int (*tag_fn)(const char *);

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: sleep CFG GIB\n");
    return 2;
  }
  const char *cfg = argv[1];
  size_t gib = (size_t)atol(argv[2]);
  sleep_fn p_sleep = (sleep_fn)dlsym(RTLD_DEFAULT, "vmmshim_sleep");
  wake_fn p_wake = (wake_fn)dlsym(RTLD_DEFAULT, "vmmshim_wake");
  tag_fn p_tag = (tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  if (!p_sleep || !p_wake || !p_tag) {
    fprintf(stderr, "sleep: the shim is not preloaded\n");
    return 1;
  }
  CK(cudaSetDevice(0));
  const size_t block = 64ull << 20, nblk = gib * 16;
  uint32_t **b = (uint32_t **)calloc(nblk, sizeof *b);
  p_tag("bench");
  for (size_t i = 0; i < nblk; i++) CK(cudaMalloc(&b[i], block));
  p_tag(NULL);
  unsigned long long *bad;
  CK(cudaMalloc(&bad, sizeof *bad));
  for (size_t i = 0; i < nblk; i++) k_fill<<<132, 256>>>(b[i], block / 4, (uint32_t)i);
  CK(cudaDeviceSynchronize());
  double bytes = (double)gib * (1ull << 30);
  const char *modes[3] = {"discard", "host", "mapped"};
  for (int m = 0; m < 3; m++) {
    for (int cycle = 1; cycle <= 3; cycle++) {
      vmmshim_sleep_result_t r;
      double t0 = now_us() / 1e3;
      int rc = p_sleep("bench", (vmmshim_sleep_mode_t)m, &r, sizeof r);
      double ts = now_us() / 1e3 - t0;
      if (rc) fprintf(stderr, "sleep %s: %d %s\n", modes[m], rc, r.reason);
      if (m == 2 && cycle == 1) {
        /* A kernel on the memory while it sleeps in mapped mode, and on device memory after. */
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0));
        for (size_t i = 0; i < nblk; i++) k_touch<<<264, 256>>>(b[i], block / 4);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("R sleep cfg=%s kernel=mapped gbps=%.1f\n", cfg, 2 * bytes / (ms / 1e3) / 1e9);
        for (size_t i = 0; i < nblk; i++) k_touch<<<264, 256>>>(b[i], block / 4); /* back to the pattern */
        CK(cudaDeviceSynchronize());
      }
      t0 = now_us() / 1e3;
      rc = p_wake("bench", m == 0 ? VMMSHIM_WAKE_ZERO : 0, &r, sizeof r);
      double tw = now_us() / 1e3 - t0;
      if (rc) fprintf(stderr, "wake %s: %d %s\n", modes[m], rc, r.reason);
      unsigned long long nbad = 0;
      if (m > 0) {
        CK(cudaMemset(bad, 0, sizeof *bad));
        for (size_t i = 0; i < nblk; i++) k_bad<<<132, 256>>>(b[i], block / 4, (uint32_t)i, bad);
        CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
      } else {
        for (size_t i = 0; i < nblk; i++) k_fill<<<132, 256>>>(b[i], block / 4, (uint32_t)i);
        CK(cudaDeviceSynchronize());
      }
      printf("R sleep cfg=%s mode=%s cycle=%d gib=%zu sleep_ms=%.2f wake_ms=%.2f sleep_gibps=%.1f wake_gibps=%.1f "
             "bad=%llu rc=%d\n",
             cfg, modes[m], cycle, gib, ts, tw, bytes / (ts / 1e3) / (1ull << 30), bytes / (tw / 1e3) / (1ull << 30),
             nbad, rc);
      fflush(stdout);
    }
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (size_t i = 0; i < nblk; i++) k_touch<<<264, 256>>>(b[i], block / 4);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  printf("R sleep cfg=%s kernel=device gbps=%.1f\n", cfg, 2 * bytes / (ms / 1e3) / 1e9);
  for (size_t i = 0; i < nblk; i++) CK(cudaFree(b[i]));
  return 0;
}
