/* Helpers shared by the benchmark programs of bench/.
 * Every program prints its figures as single lines "R <section> key=value ...", which
 * bench/report.py collects from the logs into the tables; anything else is commentary.
 * The shim is looked up with dlsym (vmmshim_get_stats): the programs run with and without it. */
#ifndef VS_BENCH_CUH
#define VS_BENCH_CUH

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmmshim.h"

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t ck_e_ = (call);                                                                    \
    if (ck_e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "bench: %s failed: %s (%s) at %s:%d\n", #call, cudaGetErrorName(ck_e_),      \
              cudaGetErrorString(ck_e_), __FILE__, __LINE__);                                      \
      printf("ERROR %s: %s\n", #call, cudaGetErrorName(ck_e_));                                   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static inline double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* A pattern in 32-bit words that a kernel writes (k_fill), flips (k_touch: twice is the pattern
 * again) and checks (k_bad: words that differ, added to *bad). */
__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}
__global__ void k_touch(uint32_t *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] ^= 1u;
}
__global__ void k_bad(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != ((uint32_t)(i * 2654435761u) ^ seed);
  if (b) atomicAdd(bad, b);
}

/* The shim's counters; false when it is not loaded. */
static inline bool shim_stats(vmmshim_stats_t *s) {
  typedef int (*get_fn)(vmmshim_stats_t *, size_t);
  get_fn get = (get_fn)dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  memset(s, 0, sizeof *s);
  return get && get(s, sizeof *s) == 0;
}

static inline unsigned long long shim_allocs(const vmmshim_stats_t *s) {
  unsigned long long n = 0;
  for (int i = 0; i < VMMSHIM_API_COUNT; i++) n += s->allocs[i];
  return n;
}

/* Appends " pool_reserved_high=.. pool_used_high=.." of a cudaMallocAsync pool. */
static inline void print_pool_high(cudaMemPool_t pool) {
  uint64_t reserved_high = 0, used_high = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  printf(" pool_reserved_high=%llu pool_used_high=%llu", (unsigned long long)reserved_high, (unsigned long long)used_high);
}

/* Appends " shim_allocs=.. shim_peak_mapped=.. shim_peak_in_use=.. shim_vmm_calls=.." (or " shim=0"). */
static inline void print_shim_fields(void) {
  vmmshim_stats_t s;
  if (!shim_stats(&s)) {
    printf(" shim=0");
    return;
  }
  printf(" shim=1 shim_allocs=%llu shim_peak_mapped=%llu shim_peak_in_use=%llu shim_vmm_calls=%llu shim_vmm_ms=%.3f "
         "shim_syncs=%llu shim_passthrough=%llu shim_pools=%llu",
         shim_allocs(&s), (unsigned long long)s.peak_bytes_mapped, (unsigned long long)s.peak_bytes_in_use,
         (unsigned long long)s.vmm_calls, s.vmm_ns / 1e6, (unsigned long long)s.syncs,
         (unsigned long long)s.passthrough_allocs, (unsigned long long)s.pools);
}

/* Parses 256, 4K, 64M, 1G. */
static inline size_t parse_size(const char *t) {
  char *end;
  double v = strtod(t, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1048576.0; break;
    case 'g': case 'G': v *= 1073741824.0; break;
    default: break;
  }
  return (size_t)v;
}

#endif
