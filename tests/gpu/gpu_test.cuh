/* Helpers shared by the GPU test programs of tests/gpu/.
 *
 * Every program prints one line per check, "PASS name" or "FAIL name: reason",
 * and ends with "<prog>: N passed, N failed"; it exits non-zero when a check failed
 * or a CUDA call returned an error it did not expect (CK/CKD print the call and abort).
 * The shim is found with dlsym (vmmshim_get_stats); the programs never link against it.
 * tests/gpu/run.sh prefixes each PASS/FAIL line with the run's name (runtime, free mode). */
#ifndef VS_GPU_TEST_CUH
#define VS_GPU_TEST_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmmshim.h"

static int g_pass = 0, g_fail = 0;
static const char *g_prog = "test";

/* Aborts the program on an unexpected runtime error (counted as a failure by run.sh). */
#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t ck_e_ = (call);                                                                \
    if (ck_e_ != cudaSuccess) {                                                                \
      printf("FAIL %s: %s returned %s (%s) at %s:%d\n", g_prog, #call, cudaGetErrorName(ck_e_), \
             cudaGetErrorString(ck_e_), __FILE__, __LINE__);                                   \
      printf("%s: %d passed, %d failed\n", g_prog, g_pass, g_fail + 1);                        \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

/* The same for driver calls. */
#define CKD(call)                                                                        \
  do {                                                                                   \
    CUresult ckd_r_ = (call);                                                            \
    if (ckd_r_ != CUDA_SUCCESS) {                                                        \
      const char *ckd_n_ = "?";                                                          \
      cuGetErrorName(ckd_r_, &ckd_n_);                                                   \
      printf("FAIL %s: %s returned %s (%d) at %s:%d\n", g_prog, #call, ckd_n_, (int)ckd_r_, \
             __FILE__, __LINE__);                                                        \
      printf("%s: %d passed, %d failed\n", g_prog, g_pass, g_fail + 1);                  \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

/* Records one check: "PASS name" or "FAIL name: <printf reason>". */
static inline void check(bool ok, const char *name, const char *fmt, ...) {
  if (ok) {
    g_pass++;
    printf("PASS %s/%s\n", g_prog, name);
  } else {
    g_fail++;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("FAIL %s/%s: %s\n", g_prog, name, why);
  }
  fflush(stdout);
}

static inline int finish(void) {
  printf("%s: %d passed, %d failed\n", g_prog, g_pass, g_fail);
  return g_fail ? 1 : 0;
}

static inline double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- the shim, seen from outside ---- */
typedef int (*vs_get_stats_fn)(vmmshim_stats_t *, size_t);

/* Fills *s from the shim; false when the shim is not loaded. */
static inline bool shim_stats(vmmshim_stats_t *s) {
  vs_get_stats_fn get = (vs_get_stats_fn)dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  memset(s, 0, sizeof *s);
  return get && get(s, sizeof *s) == 0;
}

static inline uint64_t stats_allocs(const vmmshim_stats_t *s) {
  uint64_t n = 0;
  for (int i = 0; i < VMMSHIM_API_COUNT; i++) n += s->allocs[i];
  return n;
}

static inline uint64_t stats_frees(const vmmshim_stats_t *s) {
  uint64_t n = 0;
  for (int i = 0; i < VMMSHIM_API_COUNT; i++) n += s->frees[i];
  return n;
}

static inline void print_stats(const char *label, const vmmshim_stats_t *s) {
  printf("INFO %s: allocs rt=%llu rt_async=%llu drv=%llu drv_async=%llu frees rt=%llu rt_async=%llu "
         "drv=%llu drv_async=%llu passthrough=%llu in_use=%llu peak_in_use=%llu mapped=%llu "
         "peak_mapped=%llu vmm_calls=%llu syncs=%llu\n",
         label, (unsigned long long)s->allocs[0], (unsigned long long)s->allocs[1],
         (unsigned long long)s->allocs[2], (unsigned long long)s->allocs[3],
         (unsigned long long)s->frees[0], (unsigned long long)s->frees[1],
         (unsigned long long)s->frees[2], (unsigned long long)s->frees[3],
         (unsigned long long)s->passthrough_allocs, (unsigned long long)s->bytes_in_use,
         (unsigned long long)s->peak_bytes_in_use, (unsigned long long)s->bytes_mapped,
         (unsigned long long)s->peak_bytes_mapped, (unsigned long long)s->vmm_calls,
         (unsigned long long)s->syncs);
}

/* True when ptr lies in VMM memory: cuMemRetainAllocationHandle succeeds only there. */
static inline bool is_vmm(const void *ptr) {
  CUmemGenericAllocationHandle h;
  if (cuMemRetainAllocationHandle(&h, (void *)ptr) != CUDA_SUCCESS) return false;
  cuMemRelease(h);
  return true;
}

/* ---- data patterns: word i of a buffer with seed s holds pattern_word(s, i) ---- */
__host__ __device__ static inline uint32_t pattern_word(uint32_t seed, uint64_t i) {
  uint64_t x = ((uint64_t)seed << 32) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0xD1B54A32D192ED03ull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

/* Writes the pattern over bytes [0, n); the tail that is not a whole word byte by byte. */
__global__ void k_fill(uint8_t *p, size_t n, uint32_t seed) {
  size_t words = n / 4;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    ((uint32_t *)p)[w] = pattern_word(seed, w);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (size_t o = words * 4; o < n; o++) p[o] = (uint8_t)(pattern_word(seed, o / 4) >> (8 * (o % 4)));
}

/* Counts the bytes-in-words that differ from the pattern into *errs. */
__global__ void k_verify(const uint8_t *p, size_t n, uint32_t seed, unsigned long long *errs) {
  size_t words = n / 4;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long bad = 0;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    bad += ((const uint32_t *)p)[w] != pattern_word(seed, w);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (size_t o = words * 4; o < n; o++)
      bad += p[o] != (uint8_t)(pattern_word(seed, o / 4) >> (8 * (o % 4)));
  if (bad) atomicAdd(errs, bad);
}

/* Spins until the GPU's global timer passed ns nanoseconds from the call. */
__device__ inline void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

/* Spins ns nanoseconds, then writes the pattern over [0, n). Launch with at most one wave of
 * blocks. */
__global__ void k_spin_fill(uint8_t *p, size_t n, uint32_t seed, unsigned long long ns) {
  spin_ns(ns);
  size_t words = n / 4;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    ((uint32_t *)p)[w] = pattern_word(seed, w);
}

static inline int grid_for(size_t n) {
  size_t words = n / 4 + 1;
  size_t blocks = (words + 255) / 256;
  return (int)(blocks < 1024 ? blocks : 1024);
}

static inline int sm_count(void) {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

static inline void fill(void *p, size_t n, uint32_t seed, cudaStream_t s) {
  k_fill<<<grid_for(n), 256, 0, s>>>((uint8_t *)p, n, seed);
  CK(cudaGetLastError());
}

static inline void verify(const void *p, size_t n, uint32_t seed, unsigned long long *d_errs, cudaStream_t s) {
  k_verify<<<grid_for(n), 256, 0, s>>>((const uint8_t *)p, n, seed, d_errs);
  CK(cudaGetLastError());
}

/* Words of [0, n) at p that differ from the pattern, counted on the current device (synchronous). */
static inline size_t errors_in(const void *p, size_t n, uint32_t seed) {
  unsigned long long *d_errs, errs = 0;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(p, n, seed, d_errs, 0);
  CK(cudaMemcpy(&errs, d_errs, sizeof errs, cudaMemcpyDeviceToHost));
  CK(cudaFree(d_errs));
  return (size_t)errs;
}

/* A 200 ms (or ns) spinning writer on stream s: one wave of blocks, so all of them spin at once. */
static inline void spin_fill(void *p, size_t n, uint32_t seed, unsigned long long ns, cudaStream_t s) {
  k_spin_fill<<<sm_count(), 256, 0, s>>>((uint8_t *)p, n, seed, ns);
  CK(cudaGetLastError());
}

/* Deterministic generator for sizes and orders (xorshift64*). */
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static inline uint64_t rnd(void) {
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 0x2545F4914F6CDD1Dull;
}
/* Log-uniform-ish size in [lo, hi]. */
static inline size_t rnd_size(size_t lo, size_t hi) {
  double l = log2((double)lo), h = log2((double)hi);
  double x = l + (h - l) * (double)(rnd() >> 11) / 9007199254740992.0;
  size_t s = (size_t)exp2(x);
  s += rnd() % 97; /* odd sizes */
  return s < lo ? lo : (s > hi ? hi : s);
}

static inline void shuffle(int *a, int n) {
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rnd() % (uint64_t)(i + 1));
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* Whether the shim is loaded and serves allocations (vmmshim_active() == 1); *loaded: whether its
 * symbols are there at all. */
static inline bool shim_on(bool *loaded) {
  typedef int (*active_fn)(void);
  active_fn active = (active_fn)dlsym(RTLD_DEFAULT, "vmmshim_active");
  if (loaded) *loaded = active != NULL;
  return active && active() == 1;
}

/* The one "shim-loaded" (or "shim-absent") check of a program; later calls return its answer. */
static int g_shim_checked = -1;

/* The shim must be loaded and active for the checks to mean anything: checked once and counted.
 * For the programs that only make sense under it. */
static inline bool require_shim(void) {
  if (g_shim_checked >= 0) return g_shim_checked == 1;
  bool loaded;
  bool on = shim_on(&loaded);
  check(on, "shim-loaded", loaded ? "vmmshim_active() is not 1: the shim passes every allocation through"
                                   : "vmmshim_active not found: run under LD_PRELOAD=build/libvmmshim.so");
  g_shim_checked = on;
  return on;
}

/* For the programs run both with and without the shim: tests/gpu/run.sh says which a run is with
 * GPU_TEST_SHIM (1: under the shim, which must then be loaded and active, or a preload that failed
 * would turn every shim check off and the runner would compare a plain run with a plain run; 0:
 * a reference run, where it must be absent). Checked once and counted; unset (a program started
 * by hand), nothing is checked. Returns whether the shim is active. */
static inline bool shim_as_expected(void) {
  const char *want = getenv("GPU_TEST_SHIM");
  if (want && !strcmp(want, "1")) return require_shim();
  bool loaded;
  bool on = shim_on(&loaded);
  if (want && !strcmp(want, "0") && g_shim_checked < 0) {
    check(!loaded, "shim-absent", "the shim is loaded in a run meant to be without it (LD_PRELOAD=%s)",
          getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    g_shim_checked = on;
  }
  return on;
}

#endif
