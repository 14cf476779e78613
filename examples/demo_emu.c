/* demo.cu's program in C, for a machine without a GPU: it allocates a few hundred buffers of
 * mixed sizes with cudaMalloc, fills each, checks them, frees half and allocates them again,
 * frees everything and prints what it did. `make demo-emu` builds it against the host
 * emulation of the CUDA driver and runtime (build/emu) and runs it under the launcher.
 *
 * The emulation runs no kernels, and its device memory is host memory: the host fills and
 * checks the buffers here, where demo.cu launches kernels. That is the one thing that ties
 * this program to the emulation; every allocation goes through the CUDA runtime API as in
 * any program. The only nod to the shim: a dlsym lookup of vmmshim_get_stats, to say who
 * served the memory. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "vmmshim.h"

#define CK(call)                                                                                           \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      fprintf(stderr, "demo: %s failed: %s (%s)\n", #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

static void fill(uint32_t *p, size_t words, uint32_t seed) {
  for (size_t i = 0; i < words; i++) p[i] = seed * 2654435761u + (uint32_t)i;
}

static unsigned long long check(const uint32_t *p, size_t words, uint32_t seed) {
  unsigned long long n = 0;
  for (size_t i = 0; i < words; i++) n += p[i] != seed * 2654435761u + (uint32_t)i;
  return n;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the shim's lines on stderr */
  int count = argc > 1 ? atoi(argv[1]) : 300;
  if (count < 2 || count > 100000) count = 300;
  int devices = 0, driver = 0;
  CK(cudaGetDeviceCount(&devices));
  CK(cudaDriverGetVersion(&driver));
  printf("demo: %d device(s), driver API %d, %d buffers\n", devices, driver, count);

  uint32_t **buf = calloc((size_t)count, sizeof *buf);
  size_t *words = calloc((size_t)count, sizeof *words);
  if (!buf || !words) return 1;

  /* Sizes from 1 KiB to 4 MiB: mostly small, a few large (demo.cu's mix, scaled down so
   * that the host, which stands in for the kernels, fills them quickly). */
  uint64_t r = 88172645463325252ull;
  size_t total = 0;
  for (int i = 0; i < count; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    size_t bytes = (size_t)1024 << (r % 13);
    if (r % 7 != 0 && bytes > (1u << 18)) bytes >>= 4;
    bytes += (r >> 32) % 4096 & ~(size_t)3;
    words[i] = bytes / 4;
    CK(cudaMalloc((void **)&buf[i], bytes));
    total += bytes;
  }
  unsigned long long bad = 0;
  for (int i = 0; i < count; i++) fill(buf[i], words[i], (uint32_t)i);
  for (int i = 0; i < count; i++) bad += check(buf[i], words[i], (uint32_t)i);

  /* Half of them freed and allocated again: a pool serves these from the blocks just freed. */
  for (int i = 0; i < count; i += 2) CK(cudaFree(buf[i]));
  for (int i = 0; i < count; i += 2) {
    CK(cudaMalloc((void **)&buf[i], words[i] * 4));
    fill(buf[i], words[i], (uint32_t)i + 1);
    bad += check(buf[i], words[i], (uint32_t)i + 1);
  }
  for (int i = 0; i < count; i++) CK(cudaFree(buf[i]));

  printf("demo: allocated %.1f MiB in %d buffers, then half of them again; wrote and checked them: %s\n",
         total / 1048576.0, count, bad ? "MISMATCH" : "all correct");
  if (bad) printf("demo: %llu words differ\n", bad);

  int (*get)(vmmshim_stats_t *, size_t) = (int (*)(vmmshim_stats_t *, size_t))dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  vmmshim_stats_t s;
  if (get && get(&s, sizeof s) == 0) {
    unsigned long long n = 0;
    for (int i = 0; i < VMMSHIM_API_COUNT; i++) n += s.allocs[i];
    printf("demo: vmmshim served %llu allocations; peak %.1f MiB in use, %.1f MiB mapped\n", n,
           s.peak_bytes_in_use / 1048576.0, s.peak_bytes_mapped / 1048576.0);
  } else {
    printf("demo: vmmshim is not loaded: the CUDA runtime's own allocator served the memory\n");
  }
  free(buf);
  free(words);
  return bad ? 1 : 0;
}
