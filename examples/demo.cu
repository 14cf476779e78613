/* A plain CUDA program, knowing nothing of vmmshim: it allocates a few hundred buffers of mixed
 * sizes with cudaMalloc, fills each from a kernel, checks them with another kernel, frees them and
 * prints what it did. scripts/demo.sh builds it (nvcc, static runtime) and runs it under
 * LD_PRELOAD=build/libvmmshim.so VMMSHIM_LOG=info VMMSHIM_STATS=1.
 * The only nod to the shim: a dlsym lookup of vmmshim_get_stats, to say who served the memory. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "vmmshim.h"

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "demo: %s failed: %s (%s)\n", #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

__global__ void k_fill(uint32_t *p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
    p[i] = seed * 2654435761u + (uint32_t)i;
}

__global__ void k_check(const uint32_t *p, size_t words, uint32_t seed, unsigned long long *bad) {
  unsigned long long n = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
    n += p[i] != seed * 2654435761u + (uint32_t)i;
  if (n) atomicAdd(bad, n);
}

int main(int argc, char **argv) {
  int count = argc > 1 ? atoi(argv[1]) : 300;
  if (count < 1 || count > 100000) count = 300;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("demo: %s, %d buffers\n", prop.name, count);

  uint32_t **buf = (uint32_t **)calloc(count, sizeof *buf);
  size_t *words = (size_t *)calloc(count, sizeof *words);
  unsigned long long *d_bad, bad = 0;
  CK(cudaMalloc(&d_bad, sizeof *d_bad));
  CK(cudaMemset(d_bad, 0, sizeof *d_bad));

  /* Sizes from 1 KiB to 64 MiB: mostly small, a few large. */
  uint64_t r = 88172645463325252ull;
  size_t total = 0;
  for (int i = 0; i < count; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    size_t bytes = (size_t)1024 << (r % 17); /* 1 KiB .. 64 MiB */
    if (r % 7 != 0 && bytes > (1u << 20)) bytes >>= 6; /* keep most of them small */
    bytes += (r >> 32) % 4096 & ~(size_t)3;
    words[i] = bytes / 4;
    CK(cudaMalloc((void **)&buf[i], bytes));
    total += bytes;
  }
  for (int i = 0; i < count; i++) k_fill<<<256, 256>>>(buf[i], words[i], (uint32_t)i);
  CK(cudaGetLastError());
  for (int i = 0; i < count; i++) k_check<<<256, 256>>>(buf[i], words[i], (uint32_t)i, d_bad);
  CK(cudaGetLastError());
  CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
  for (int i = 0; i < count; i++) CK(cudaFree(buf[i]));
  CK(cudaFree(d_bad));

  printf("demo: allocated %.1f MiB in %d buffers, wrote and checked them: %s\n", total / 1048576.0, count,
         bad ? "MISMATCH" : "all correct");
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
