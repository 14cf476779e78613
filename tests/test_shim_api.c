/* test_shim_api: the shim preloaded into a program linked against the shared (emulated)
 * runtime and driver, default options.
 *
 * Interception by every route (runtime, _ptsz, driver symbols, dlsym on libcuda,
 * cuGetProcAddress), memory (alignment, mapped, no overlaps, data kept, blocks across
 * handle boundaries), the steady state making no VMM call, cudaFree completing earlier
 * work, stream-ordered reuse without host waits, stream capture pass-through, errors,
 * address-range queries, cuMemGetInfo, handle properties, stream destruction with
 * pending frees, and cudaDeviceReset dropping the pool. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

/* ------------------------------------------------------------------ interception */

static void test_runtime_paths(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL)");
  CHECK(shim_active() == 1, "vmmshim_active() = %d", shim_active());
  emu_counters_t e0 = emu_now();
  vmmshim_stats_t s0 = shim_stats();
  void *p = NULL;
  CHECK(cudaMalloc(&p, 1000) == cudaSuccess && p, "cudaMalloc");
  vmmshim_stats_t s1 = shim_stats();
  emu_counters_t e1 = emu_now();
  CHECK(s1.allocs[VMMSHIM_API_RUNTIME] == s0.allocs[VMMSHIM_API_RUNTIME] + 1, "cudaMalloc counted: %llu -> %llu",
        (unsigned long long)s0.allocs[VMMSHIM_API_RUNTIME], (unsigned long long)s1.allocs[VMMSHIM_API_RUNTIME]);
  CHECK(e1.n_cuMemAlloc == e0.n_cuMemAlloc, "cudaMalloc reached the driver's cuMemAlloc");
  CHECK(e1.n_cuMemCreate > 0 && e1.n_cuMemMap > 0 && e1.n_cuMemSetAccess > 0 && e1.n_cuMemAddressReserve > 0,
        "no VMM calls: create %llu map %llu access %llu", e1.n_cuMemCreate, e1.n_cuMemMap, e1.n_cuMemSetAccess);
  CHECK(emu_handle_info((CUdeviceptr)(uintptr_t)p, NULL, NULL, NULL) == 0, "cudaMalloc block not in a VMM mapping");
  CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
  CHECK(shim_stats().frees[VMMSHIM_API_RUNTIME] == s0.frees[VMMSHIM_API_RUNTIME] + 1, "cudaFree counted");

  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  s0 = shim_stats();
  e0 = emu_now();
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK(cudaMallocAsync(&a, 5000, s) == cudaSuccess && a, "cudaMallocAsync");
  CHECK(cudaMallocAsync(&b, 5000, 0) == cudaSuccess && b, "cudaMallocAsync legacy stream");
  CHECK(cudaMallocAsync_ptsz(&c, 5000, 0) == cudaSuccess && c, "cudaMallocAsync_ptsz");
  s1 = shim_stats();
  CHECK(s1.allocs[VMMSHIM_API_RUNTIME_ASYNC] == s0.allocs[VMMSHIM_API_RUNTIME_ASYNC] + 3, "async allocs counted: +%llu",
        (unsigned long long)(s1.allocs[VMMSHIM_API_RUNTIME_ASYNC] - s0.allocs[VMMSHIM_API_RUNTIME_ASYNC]));
  CHECK(cudaFreeAsync(a, s) == cudaSuccess, "cudaFreeAsync");
  CHECK(cudaFreeAsync(b, 0) == cudaSuccess, "cudaFreeAsync legacy");
  CHECK(cudaFreeAsync_ptsz(c, 0) == cudaSuccess, "cudaFreeAsync_ptsz");
  s1 = shim_stats();
  e1 = emu_now();
  CHECK(s1.frees[VMMSHIM_API_RUNTIME_ASYNC] == s0.frees[VMMSHIM_API_RUNTIME_ASYNC] + 3, "async frees counted");
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync && e1.n_cuMemFreeAsync == e0.n_cuMemFreeAsync,
        "async allocs reached the driver: %llu allocs %llu frees", e1.n_cuMemAllocAsync - e0.n_cuMemAllocAsync,
        e1.n_cuMemFreeAsync - e0.n_cuMemFreeAsync);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
}

static void test_driver_paths(void) {
  emu_counters_t e0 = emu_now();
  vmmshim_stats_t s0 = shim_stats();
  CUdeviceptr d = 0;
  CHECK(cuMemAlloc(&d, 3000) == CUDA_SUCCESS && d, "cuMemAlloc");
  CHECK(d % 256 == 0, "cuMemAlloc alignment");
  pat_fill((void *)(uintptr_t)d, 3000, 7);
  CHECK(pat_check((void *)(uintptr_t)d, 3000, 7) == (size_t)-1, "cuMemAlloc memory");
  CHECK(cuMemFree(d) == CUDA_SUCCESS, "cuMemFree");
  CUstream st;
  CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "cuStreamCreate");
  CHECK(cuMemAllocAsync(&d, 3000, st) == CUDA_SUCCESS && d, "cuMemAllocAsync");
  CHECK(cuMemFreeAsync(d, st) == CUDA_SUCCESS, "cuMemFreeAsync");
  vmmshim_stats_t s1 = shim_stats();
  emu_counters_t e1 = emu_now();
  CHECK(s1.allocs[VMMSHIM_API_DRIVER] == s0.allocs[VMMSHIM_API_DRIVER] + 1, "cuMemAlloc counted");
  CHECK(s1.frees[VMMSHIM_API_DRIVER] == s0.frees[VMMSHIM_API_DRIVER] + 1, "cuMemFree counted");
  CHECK(s1.allocs[VMMSHIM_API_DRIVER_ASYNC] == s0.allocs[VMMSHIM_API_DRIVER_ASYNC] + 1, "cuMemAllocAsync counted");
  CHECK(s1.frees[VMMSHIM_API_DRIVER_ASYNC] == s0.frees[VMMSHIM_API_DRIVER_ASYNC] + 1, "cuMemFreeAsync counted");
  CHECK(e1.n_cuMemAlloc == e0.n_cuMemAlloc && e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync &&
            e1.n_cuMemFree == e0.n_cuMemFree && e1.n_cuMemFreeAsync == e0.n_cuMemFreeAsync,
        "driver calls reached the emulation");

  /* dlsym on libcuda's handle */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(lib != NULL, "libcuda.so.1 not loaded");
  CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
  CUresult (*fr)(CUdeviceptr) = NULL;
  *(void **)&alloc = lib ? dlsym(lib, "cuMemAlloc_v2") : NULL;
  *(void **)&fr = lib ? dlsym(lib, "cuMemFree_v2") : NULL;
  CHECK(alloc && in_shim((void *)alloc), "dlsym(libcuda, cuMemAlloc_v2) = %p in %s", (void *)alloc,
        lib_of((void *)alloc));
  CHECK(fr && in_shim((void *)fr), "dlsym(libcuda, cuMemFree_v2) = %p in %s", (void *)fr, lib_of((void *)fr));
  void *other = lib ? dlsym(lib, "cuCtxGetCurrent") : NULL;
  CHECK(other && in_libcuda(other), "dlsym(libcuda, cuCtxGetCurrent) = %p in %s", other, lib_of(other));
  if (alloc && fr) {
    s0 = shim_stats();
    e0 = emu_now();
    CHECK(alloc(&d, 4096) == CUDA_SUCCESS, "alloc through dlsym");
    CHECK(fr(d) == CUDA_SUCCESS, "free through dlsym");
    s1 = shim_stats();
    e1 = emu_now();
    CHECK(s1.allocs[VMMSHIM_API_DRIVER] == s0.allocs[VMMSHIM_API_DRIVER] + 1, "dlsym'd cuMemAlloc_v2 not counted");
    CHECK(e1.n_cuMemAlloc == e0.n_cuMemAlloc, "dlsym'd cuMemAlloc_v2 reached the driver");
  }

  /* cuGetProcAddress */
  CUdriverProcAddressQueryResult qr = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  void *fn = NULL;
  CHECK(cuGetProcAddress("cuMemAlloc", &fn, 3020, 0, &qr) == CUDA_SUCCESS && qr == CU_GET_PROC_ADDRESS_SUCCESS,
        "cuGetProcAddress(cuMemAlloc, 3020)");
  CHECK(fn && in_shim(fn), "cuMemAlloc v3020 -> %p in %s", fn, lib_of(fn));
  if (fn && in_shim(fn)) {
    *(void **)&alloc = fn;
    s0 = shim_stats();
    CHECK(alloc(&d, 777) == CUDA_SUCCESS, "alloc through cuGetProcAddress");
    CHECK(shim_stats().allocs[VMMSHIM_API_DRIVER] == s0.allocs[VMMSHIM_API_DRIVER] + 1, "not counted");
    CHECK(cuMemFree(d) == CUDA_SUCCESS, "free");
  }
  void *def = NULL, *pt = NULL;
  CHECK(cuGetProcAddress("cuMemAllocAsync", &def, 11020, 0, &qr) == CUDA_SUCCESS, "cuMemAllocAsync lookup");
  CHECK(cuGetProcAddress("cuMemAllocAsync", &pt, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &qr) ==
            CUDA_SUCCESS,
        "cuMemAllocAsync ptds lookup");
  CHECK(def && in_shim(def), "cuMemAllocAsync -> %s", lib_of(def));
  CHECK(pt && in_shim(pt), "cuMemAllocAsync ptds -> %s", lib_of(pt));
  CHECK(def != pt, "default and per-thread hooks are the same function %p", def);
  Dl_info di;
  CHECK(pt && dladdr(pt, &di) && di.dli_sname && !strcmp(di.dli_sname, "cuMemAllocAsync_ptsz"),
        "ptds hook is %s", pt && dladdr(pt, &di) && di.dli_sname ? di.dli_sname : "?");
  if (pt && in_shim(pt)) {
    CUresult (*aa)(CUdeviceptr *, size_t, CUstream) = NULL;
    *(void **)&aa = pt;
    s0 = shim_stats();
    e0 = emu_now();
    CHECK(aa(&d, 4000, NULL) == CUDA_SUCCESS, "ptsz alloc");
    CHECK(shim_stats().allocs[VMMSHIM_API_DRIVER_ASYNC] == s0.allocs[VMMSHIM_API_DRIVER_ASYNC] + 1, "ptsz not counted");
    CHECK(emu_now().n_cuMemAllocAsync == e0.n_cuMemAllocAsync, "ptsz alloc reached the driver");
    void *fa = NULL;
    CUresult (*ff)(CUdeviceptr, CUstream) = NULL;
    CHECK(cuGetProcAddress("cuMemFreeAsync", &fa, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &qr) ==
              CUDA_SUCCESS && fa && in_shim(fa),
          "cuMemFreeAsync ptds lookup");
    *(void **)&ff = fa;
    if (ff) CHECK(ff(d, NULL) == CUDA_SUCCESS, "ptsz free");
  }
  fn = (void *)0x1;
  qr = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK(cuGetProcAddress("cuNoSuchThing", &fn, 12000, 0, &qr) == CUDA_ERROR_NOT_FOUND, "unknown symbol");
  CHECK(fn == NULL && qr == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown symbol: fn %p status %d", fn, (int)qr);
  fn = NULL;
  CHECK(cuGetProcAddress("cuMemAllocAsync", &fn, 11000, 0, &qr) == CUDA_ERROR_NOT_FOUND && fn == NULL,
        "version too old: %p", fn);
  fn = NULL;
  CHECK(cuGetProcAddress("cuCtxGetCurrent", &fn, 4000, 0, &qr) == CUDA_SUCCESS && fn, "cuCtxGetCurrent lookup");
  CHECK(fn && fn == other, "cuCtxGetCurrent through cuGetProcAddress %p (%s) != libcuda's %p", fn, lib_of(fn), other);
  CHECK(fn && dladdr(fn, &di) && di.dli_sname && !strcmp(di.dli_sname, "cuCtxGetCurrent") && in_libcuda(fn),
        "cuCtxGetCurrent answer is not libcuda's own");
  CHECK(cuStreamDestroy(st) == CUDA_SUCCESS, "stream destroy");
}

/* ------------------------------------------------------------------ memory */

typedef struct {
  uintptr_t p;
  size_t n;
  unsigned long long seed;
  int drv;
} blk_t;

static int blk_cmp(const void *a, const void *b) {
  uintptr_t x = ((const blk_t *)a)->p, y = ((const blk_t *)b)->p;
  return x < y ? -1 : x > y;
}

static int blk_alloc(blk_t *b, size_t n, unsigned long long seed, int drv) {
  b->n = n;
  b->seed = seed;
  b->drv = drv;
  b->p = 0;
  if (drv) {
    CUdeviceptr d = 0;
    if (cuMemAlloc(&d, n) != CUDA_SUCCESS) return -1;
    b->p = (uintptr_t)d;
  } else {
    void *v = NULL;
    if (cudaMalloc(&v, n) != cudaSuccess) return -1;
    b->p = (uintptr_t)v;
  }
  return 0;
}

static int blk_free(blk_t *b) {
  int r = b->drv ? (cuMemFree((CUdeviceptr)b->p) == CUDA_SUCCESS ? 0 : -1) : (cudaFree((void *)b->p) == cudaSuccess ? 0 : -1);
  b->p = 0;
  return r;
}

/* Both ends mapped and readable/writable for the device (the emulation maps them for the host too). */
static int blk_mapped(const blk_t *b) {
  unsigned acc0 = 0, acc1 = 0;
  return emu_handle_info(b->p, NULL, NULL, &acc0) == 0 && emu_handle_info(b->p + b->n - 1, NULL, NULL, &acc1) == 0 &&
         acc0 == CU_MEM_ACCESS_FLAGS_PROT_READWRITE && acc1 == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

static void test_memory(void) {
  enum { N = 400 };
  static blk_t b[N];
  unsigned long long rs = 12345;
  int bad_align = 0, unmapped = 0, failed_alloc = 0;
  size_t sizes_extra[] = {40 * MiB, 60 * MiB, 100 * MiB, 65 * MiB + 3};
  for (int i = 0; i < N; i++) {
    size_t n = i < 4 ? sizes_extra[i] : rnd_size(&rs, 3 * MiB);
    if (blk_alloc(&b[i], n, (unsigned long long)i * 77 + 1, i % 3 == 0) != 0) {
      failed_alloc++;
      continue;
    }
    if (b[i].p % 256) bad_align++;
    if (!blk_mapped(&b[i])) {
      unmapped++;
      continue;
    }
    pat_fill((void *)b[i].p, b[i].n, b[i].seed);
  }
  CHECK(failed_alloc == 0, "%d allocations failed", failed_alloc);
  CHECK(bad_align == 0, "%d blocks not 256-byte aligned", bad_align);
  CHECK(unmapped == 0, "%d blocks not wholly mapped read-write", unmapped);
  /* free every third, allocate more, check everything */
  for (int i = 0; i < N; i += 3)
    if (b[i].p) CHECK(blk_free(&b[i]) == 0, "free %d", i);
  for (int i = 0; i < N; i += 3) {
    if (blk_alloc(&b[i], rnd_size(&rs, 5 * MiB), 1000003ull + (unsigned long long)i, i % 2) != 0) {
      CHECK(0, "realloc %d failed", i);
      continue;
    }
    CHECK(b[i].p % 256 == 0, "alignment");
    if (blk_mapped(&b[i])) pat_fill((void *)b[i].p, b[i].n, b[i].seed);
    else CHECK(0, "block %d (%zu bytes at %#lx) not mapped", i, b[i].n, (unsigned long)b[i].p);
  }
  int corrupt = 0;
  for (int i = 0; i < N; i++)
    if (b[i].p && blk_mapped(&b[i])) {
      size_t off = pat_check((void *)b[i].p, b[i].n, b[i].seed);
      if (off != (size_t)-1) {
        if (corrupt++ < 5) printf("block %d (%zu bytes at %#lx) differs at offset %zu\n", i, b[i].n, (unsigned long)b[i].p, off);
      }
    }
  CHECK(corrupt == 0, "%d blocks corrupted by other allocations and frees", corrupt);
  static blk_t sorted[N];
  int m = 0;
  for (int i = 0; i < N; i++)
    if (b[i].p) sorted[m++] = b[i];
  qsort(sorted, (size_t)m, sizeof *sorted, blk_cmp);
  int ov = 0;
  for (int i = 1; i < m; i++)
    if (overlaps(sorted[i - 1].p, sorted[i - 1].n, sorted[i].p, sorted[i].n)) ov++;
  CHECK(ov == 0, "%d overlapping pairs", ov);
  for (int i = 0; i < N; i++)
    if (b[i].p) CHECK(blk_free(&b[i]) == 0, "final free %d", i);
}

/* The handle mapped under address p (the driver's answer), 0 when none. */
static CUmemGenericAllocationHandle handle_at(const void *p) {
  CUmemGenericAllocationHandle h = 0;
  if (cuMemRetainAllocationHandle(&h, (void *)p) != CUDA_SUCCESS) return 0;
  cuMemRelease(h); /* the retain's reference; the mapping keeps its own */
  return h;
}

/* A block that begins in the free tail of one handle and ends in the next one: the heap grows by
 * 40 MiB for a block of 40 MiB; once it is freed, 30 MiB of it serve the next request and leave a
 * free tail of 10 MiB; a request of 20 MiB makes the heap grow right after that tail (the two
 * join) and takes the tail and the start of the new handle. */
static void test_straddle(void) {
  shim_trim();
  vmmshim_stats_t s0 = shim_stats();
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK(cudaMalloc(&a, 40 * MiB) == cudaSuccess && cudaFree(a) == cudaSuccess, "40 MiB");
  CHECK(cudaMalloc(&b, 30 * MiB) == cudaSuccess, "30 MiB");
  CHECK(cudaMalloc(&c, 20 * MiB) == cudaSuccess, "20 MiB");
  vmmshim_stats_t s1 = shim_stats();
  CUmemGenericAllocationHandle hb = handle_at(b), h_first = handle_at(c), h_last = handle_at((char *)c + 20 * MiB - 1);
  printf("straddle: a=%p b=%p c=%p mapped %llu -> %llu MiB; handles: b 0x%llx, c's first byte 0x%llx, its last 0x%llx\n",
         a, b, c, (unsigned long long)(s0.bytes_mapped >> 20), (unsigned long long)(s1.bytes_mapped >> 20),
         (unsigned long long)hb, (unsigned long long)h_first, (unsigned long long)h_last);
  CHECK(c == (char *)b + 30 * MiB, "the 20 MiB block at %p, not in the tail right after the 30 MiB one (%p)", c, b);
  CHECK(hb && h_first == hb, "the 20 MiB block begins on handle 0x%llx, not on the 30 MiB block's 0x%llx",
        (unsigned long long)h_first, (unsigned long long)hb);
  CHECK(h_last && h_last != h_first, "the 20 MiB block ends on handle 0x%llx: the same it begins on",
        (unsigned long long)h_last);
  blk_t bc = {(uintptr_t)c, 20 * MiB, 99, 0};
  CHECK(c && blk_mapped(&bc), "20 MiB block not mapped");
  if (c && blk_mapped(&bc)) {
    pat_fill(c, 20 * MiB, 99);
    CHECK(pat_check(c, 20 * MiB, 99) == (size_t)-1, "straddling block data");
  }
  CHECK(cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess, "free");
}

/* ------------------------------------------------------------------ steady state */

static void test_steady_state(void) {
  static const size_t sizes[] = {1, 256, 1000, 4096, 65536, MiB, 3 * MiB, 5 * MiB, 17 * MiB};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  void *p[NS];
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < NS; i++) CHECK(cudaMalloc(&p[i], sizes[i]) == cudaSuccess, "warm-up");
    for (int i = 0; i < NS; i++) CHECK(cudaFree(p[i]) == cudaSuccess, "warm-up free");
    for (int i = 0; i < NS; i++) CHECK(cudaMallocAsync(&p[i], sizes[i], s) == cudaSuccess, "warm-up async");
    for (int i = 0; i < NS; i++) CHECK(cudaFreeAsync(p[i], s) == cudaSuccess, "warm-up async free");
  }
  emu_counters_t e0 = emu_now();
  int fails = 0;
  for (int round = 0; round < 300; round++)
    for (int i = 0; i < NS; i++) {
      void *q = NULL;
      if (cudaMalloc(&q, sizes[i]) != cudaSuccess || cudaFree(q) != cudaSuccess) fails++;
    }
  emu_counters_t e1 = emu_now();
  CHECK(fails == 0, "%d failures", fails);
  CHECK(emu_vmm_calls(&e1) == emu_vmm_calls(&e0),
        "steady state made VMM calls: create %llu map %llu access %llu unmap %llu release %llu",
        e1.n_cuMemCreate - e0.n_cuMemCreate, e1.n_cuMemMap - e0.n_cuMemMap, e1.n_cuMemSetAccess - e0.n_cuMemSetAccess,
        e1.n_cuMemUnmap - e0.n_cuMemUnmap, e1.n_cuMemRelease - e0.n_cuMemRelease);
  e0 = emu_now();
  for (int round = 0; round < 300; round++) {
    for (int i = 0; i < NS; i++)
      if (cudaMallocAsync(&p[i], sizes[i], s) != cudaSuccess) fails++;
    for (int i = 0; i < NS; i++)
      if (cudaFreeAsync(p[i], s) != cudaSuccess) fails++;
  }
  e1 = emu_now();
  CHECK(fails == 0, "%d async failures", fails);
  CHECK(emu_vmm_calls(&e1) == emu_vmm_calls(&e0), "async steady state made %llu VMM calls",
        emu_vmm_calls(&e1) - emu_vmm_calls(&e0));
  CHECK(e1.n_cuCtxSynchronize == e0.n_cuCtxSynchronize && e1.n_cuStreamSynchronize == e0.n_cuStreamSynchronize &&
            e1.n_cuEventSynchronize == e0.n_cuEventSynchronize,
        "async steady state waited: ctx %llu stream %llu event %llu", e1.n_cuCtxSynchronize - e0.n_cuCtxSynchronize,
        e1.n_cuStreamSynchronize - e0.n_cuStreamSynchronize, e1.n_cuEventSynchronize - e0.n_cuEventSynchronize);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "stream");
}

/* ------------------------------------------------------------------ free semantics */

typedef struct {
  unsigned char *p;
  size_t n;
  unsigned long long seed;
  int ran;
} work_t;

static void work_fill(void *arg) {
  work_t *w = arg;
  pat_fill(w->p, w->n, w->seed);
  w->ran++;
}

static void test_sync_free(void) {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *a = NULL;
  CHECK(cudaMalloc(&a, MiB) == cudaSuccess, "alloc");
  work_t w = {a, MiB, 5, 0};
  emu_launch((CUstream)s, work_fill, &w);
  work_t w2 = {(unsigned char *)a + 4096, 4096, 6, 0};
  emu_launch(NULL, work_fill, &w2);
  CHECK(emu_pending((CUstream)s) == 1 && w.ran == 0, "work should be pending");
  CHECK(cudaFree(a) == cudaSuccess, "cudaFree");
  CHECK(w.ran == 1 && w2.ran == 1, "cudaFree returned before earlier work completed (ran %d, %d)", w.ran, w2.ran);
  CHECK(emu_pending((CUstream)s) == 0 && emu_pending(NULL) == 0, "work still pending after cudaFree");
  void *b = NULL;
  CHECK(cudaMalloc(&b, MiB) == cudaSuccess, "realloc");
  /* the same range may come back: nothing can still write to it */
  pat_fill(b, MiB, 8);
  emu_complete_all();
  CHECK(pat_check(b, MiB, 8) == (size_t)-1, "new block overwritten by the old block's work");
  CHECK(cudaFree(b) == cudaSuccess, "free");

  /* the same through cuMemFree */
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 8192) == CUDA_SUCCESS, "cuMemAlloc");
  work_t w3 = {(unsigned char *)(uintptr_t)d, 8192, 9, 0};
  emu_launch((CUstream)s, work_fill, &w3);
  CHECK(cuMemFree(d) == CUDA_SUCCESS && w3.ran == 1, "cuMemFree returned before earlier work completed");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
}

static void test_async_reuse(void) {
  void *junk = NULL;
  (void)junk;
  shim_trim();
  cudaStream_t S, T;
  CHECK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking) == cudaSuccess, "S");
  CHECK(cudaStreamCreateWithFlags(&T, cudaStreamNonBlocking) == cudaSuccess, "T");
  const size_t N = 40 * MiB;
  emu_counters_t e0 = emu_now();
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
  CHECK(cudaMallocAsync(&a, N, S) == cudaSuccess, "a");
  work_t w = {a, 64 * 1024, 11, 0};
  emu_launch((CUstream)S, work_fill, &w);
  CHECK(cudaFreeAsync(a, S) == cudaSuccess, "free a on S");
  CHECK(cudaMallocAsync(&b, N, S) == cudaSuccess, "b");
  CHECK(b == a, "same stream, same size: %p, freed %p", b, a);
  CHECK(cudaFreeAsync(b, S) == cudaSuccess, "free b on S");
  CHECK(emu_pending((CUstream)S) == 1, "work on S pending");
  CHECK(cudaMallocAsync(&c, N, T) == cudaSuccess, "c on T");
  CHECK(!overlaps((uintptr_t)c, N, (uintptr_t)a, N), "T got %p, overlapping %p freed on S with work pending", c, a);
  CHECK(cudaMalloc(&d, N) == cudaSuccess, "d");
  CHECK(!overlaps((uintptr_t)d, N, (uintptr_t)a, N), "cudaMalloc got %p, overlapping %p freed on S with work pending",
        d, a);
  if (!overlaps((uintptr_t)c, N, (uintptr_t)a, N)) pat_fill(c, N, 21);
  if (!overlaps((uintptr_t)d, N, (uintptr_t)a, N)) pat_fill(d, N, 22);
  CHECK(w.ran == 0, "S's work ran early");
  vmmshim_stats_t s0 = shim_stats();
  CHECK(emu_complete((CUstream)S, -1) == 1 && w.ran == 1, "complete S");
  if (!overlaps((uintptr_t)c, N, (uintptr_t)a, N)) CHECK(pat_check(c, N, 21) == (size_t)-1, "c corrupted");
  if (!overlaps((uintptr_t)d, N, (uintptr_t)a, N)) CHECK(pat_check(d, N, 22) == (size_t)-1, "d corrupted");
  CHECK(cudaMallocAsync(&e, N, T) == cudaSuccess, "e on T");
  vmmshim_stats_t s1 = shim_stats();
  printf("async: a=%p c=%p d=%p e=%p mapped %llu -> %llu MiB\n", a, c, d, e,
         (unsigned long long)(s0.bytes_mapped >> 20), (unsigned long long)(s1.bytes_mapped >> 20));
  CHECK(e == a, "T did not reuse %p after S's work completed (got %p)", a, e);
  CHECK(s1.bytes_mapped == s0.bytes_mapped, "the pool grew (%llu -> %llu) instead of reusing the completed free",
        (unsigned long long)s0.bytes_mapped, (unsigned long long)s1.bytes_mapped);
  emu_counters_t e1 = emu_now();
  CHECK(e1.n_cuCtxSynchronize == e0.n_cuCtxSynchronize && e1.n_cuStreamSynchronize == e0.n_cuStreamSynchronize &&
            e1.n_cuEventSynchronize == e0.n_cuEventSynchronize,
        "the async path waited: ctx %llu stream %llu event %llu", e1.n_cuCtxSynchronize - e0.n_cuCtxSynchronize,
        e1.n_cuStreamSynchronize - e0.n_cuStreamSynchronize, e1.n_cuEventSynchronize - e0.n_cuEventSynchronize);
  CHECK(cudaFreeAsync(c, T) == cudaSuccess && cudaFreeAsync(e, T) == cudaSuccess, "free c e");
  CHECK(cudaFree(d) == cudaSuccess, "free d");

  /* destroying a stream with pending frees: no violation, memory reusable later */
  int v0 = emu_violations();
  void *f = NULL;
  CHECK(cudaMallocAsync(&f, MiB, S) == cudaSuccess, "f");
  work_t w2 = {f, 4096, 12, 0};
  emu_launch((CUstream)S, work_fill, &w2);
  CHECK(cudaFreeAsync(f, S) == cudaSuccess, "free f");
  CHECK(cudaStreamDestroy(S) == cudaSuccess, "destroy S");
  CHECK(w2.ran == 1, "stream destroy completes its work");
  cudaStream_t U;
  CHECK(cudaStreamCreate(&U) == cudaSuccess, "U");
  for (int i = 0; i < 4; i++) {
    void *g = NULL;
    CHECK(cudaMallocAsync(&g, MiB, U) == cudaSuccess, "g");
    CHECK(cudaFreeAsync(g, U) == cudaSuccess, "free g");
  }
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "device sync");
  CHECK(emu_violations() == v0, "violations: %d", emu_violations() - v0);
  CHECK(cudaStreamDestroy(U) == cudaSuccess && cudaStreamDestroy(T) == cudaSuccess, "destroy");
}

/* ------------------------------------------------------------------ capture */

static void test_capture(void) {
  cudaStream_t S;
  CHECK(cudaStreamCreate(&S) == cudaSuccess, "S");
  void *x = NULL;
  CHECK(cudaMalloc(&x, 4096) == cudaSuccess, "x");
  int v0 = emu_violations();
  vmmshim_stats_t s0 = shim_stats();
  emu_counters_t e0 = emu_now();
  CHECK(cudaStreamBeginCapture(S, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  void *p = NULL;
  CHECK(cudaMallocAsync(&p, 100000, S) == cudaSuccess, "alloc in capture");
  emu_launch((CUstream)S, NULL, NULL);
  vmmshim_stats_t s1 = shim_stats();
  emu_counters_t e1 = emu_now();
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync + 1, "capture alloc did not reach cuMemAllocAsync (%llu)",
        e1.n_cuMemAllocAsync - e0.n_cuMemAllocAsync);
  CHECK(s1.passthrough_allocs > s0.passthrough_allocs, "passthrough_allocs not counted");
  CHECK(s1.allocs[VMMSHIM_API_RUNTIME_ASYNC] == s0.allocs[VMMSHIM_API_RUNTIME_ASYNC], "capture alloc served by the pool");
  CHECK(cudaFreeAsync(p, S) == cudaSuccess, "free in capture");
  /* a pool block freed by another thread's code path during capture: no context sync */
  CHECK(cudaFree(x) == cudaSuccess, "cudaFree during capture");
  cudaGraph_t g = NULL;
  CHECK(cudaStreamEndCapture(S, &g) == cudaSuccess && g, "end capture");
  CHECK(emu_violations() == v0, "capture violations: %d", emu_violations() - v0);
  if (g) CHECK(cudaGraphDestroy(g) == cudaSuccess, "graph destroy");
  s0 = shim_stats();
  e0 = emu_now();
  CHECK(cudaMallocAsync(&p, 100000, S) == cudaSuccess, "alloc after capture");
  s1 = shim_stats();
  e1 = emu_now();
  CHECK(s1.allocs[VMMSHIM_API_RUNTIME_ASYNC] == s0.allocs[VMMSHIM_API_RUNTIME_ASYNC] + 1, "not served after capture");
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync, "passed through after capture");
  CHECK(cudaFreeAsync(p, S) == cudaSuccess, "free");
  /* the block freed during capture is reusable once the device has synchronised */
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
  CHECK(cudaStreamDestroy(S) == cudaSuccess, "destroy");
  CHECK(emu_violations() == v0, "violations: %d", emu_violations() - v0);
}

/* ------------------------------------------------------------------ errors */

static void test_errors(void) {
  void *p = NULL, *q = NULL;
  CHECK(cudaMalloc(&p, 4096) == cudaSuccess, "alloc");
  CHECK(cudaMalloc(&q, 10000) == cudaSuccess, "alloc");
  pat_fill(q, 10000, 31);
  CHECK(cudaFree(p) == cudaSuccess, "free");
  CHECK(cudaFree(p) == cudaErrorInvalidValue, "double free: %d", (int)cudaGetLastError());
  cudaGetLastError();
  CHECK(cudaFree((char *)q + 256) == cudaErrorInvalidValue, "interior pointer free");
  cudaGetLastError();
  CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL)");
  CHECK(cuMemFree((CUdeviceptr)0xdead0000ull) == CUDA_ERROR_INVALID_VALUE, "cuMemFree(garbage)");
  CHECK(cuMemFree((CUdeviceptr)(uintptr_t)q + 512) == CUDA_ERROR_INVALID_VALUE, "cuMemFree(interior)");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  CHECK(cudaFreeAsync((char *)q + 256, s) == cudaErrorInvalidValue, "cudaFreeAsync(interior)");
  cudaGetLastError();
  CHECK(pat_check(q, 10000, 31) == (size_t)-1, "block damaged by bad frees");
  void *r = NULL;
  CHECK(cudaMalloc(&r, 10000) == cudaSuccess, "alloc after errors");
  CHECK(!overlaps((uintptr_t)r, 10000, (uintptr_t)q, 10000), "new block %p overlaps live %p", r, q);
  pat_fill(r, 10000, 32);
  CHECK(pat_check(q, 10000, 31) == (size_t)-1 && pat_check(r, 10000, 32) == (size_t)-1, "data");
  CHECK(cudaFree(q) == cudaSuccess && cudaFree(r) == cudaSuccess, "free");
  void *z = (void *)0x1;
  CHECK(cudaMalloc(&z, 0) == cudaSuccess, "cudaMalloc(0)");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
}

/* ------------------------------------------------------------------ queries */

static void test_queries(void) {
  void *p = NULL;
  const size_t n = 1000000;
  CHECK(cudaMalloc(&p, n) == cudaSuccess, "alloc");
  CUdeviceptr base = 0;
  size_t size = 0;
  CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
  CHECK(cuMemGetAddressRange(&base, &size, dp + 12345) == CUDA_SUCCESS, "range");
  CHECK(base == dp && size == n, "range of interior pointer: %#llx + %zu, want %#llx + %zu", (unsigned long long)base,
        size, (unsigned long long)dp, n);
  CHECK(cuMemGetAddressRange(&base, &size, dp) == CUDA_SUCCESS && base == dp && size == n, "range of base");
  CUdeviceptr start = 0;
  size_t rsize = 0;
  CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dp + n - 1) == CUDA_SUCCESS &&
            start == dp,
        "RANGE_START_ADDR %#llx", (unsigned long long)start);
  CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dp + 100) == CUDA_SUCCESS && rsize == n,
        "RANGE_SIZE %zu", rsize);
  CUpointer_attribute at[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void *data[2] = {&start, &rsize};
  start = 0;
  rsize = 0;
  CHECK(cuPointerGetAttributes(2, at, data, dp + 77) == CUDA_SUCCESS && start == dp && rsize == n,
        "cuPointerGetAttributes %#llx %zu", (unsigned long long)start, rsize);
  unsigned long long types = 0;
  int rdma = 0;
  unsigned acc = 0;
  CHECK(emu_handle_info(dp, &types, &rdma, &acc) == 0, "handle info");
  CHECK(types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, "requestedHandleTypes %llu", types);
  CHECK(rdma == 1, "gpuDirectRDMACapable %d", rdma);
  CHECK(acc == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access %u", acc);

  size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0;
  vmmshim_stats_t s0 = shim_stats();
  CHECK(cuMemGetInfo(&f0, &t0) == CUDA_SUCCESS, "meminfo");
  CHECK(cudaFree(p) == cudaSuccess, "free");
  vmmshim_stats_t s1 = shim_stats();
  CHECK(cuMemGetInfo(&f1, &t1) == CUDA_SUCCESS, "meminfo");
  size_t served = (size_t)(s0.bytes_in_use - s1.bytes_in_use);
  CHECK(served >= n && f1 == f0 + served, "free %zu -> %zu after freeing %zu bytes", f0, f1, served);
  CHECK(t1 == t0, "total changed %zu -> %zu", t0, t1);
  size_t cf = 0, ct = 0;
  CHECK(cudaMemGetInfo(&cf, &ct) == cudaSuccess && cf == f1 && ct == t1, "cudaMemGetInfo %zu/%zu vs %zu/%zu", cf, ct,
        f1, t1);
  /* free memory counts the pool's idle bytes: the emulation's free + idle */
  CHECK(f1 >= t1 - emu_device_used(0), "free %zu below the device's %zu", f1, t1 - emu_device_used(0));
}

/* ------------------------------------------------------------------ trim */

/* vmmshim_trim "unmaps and releases every pool handle that holds no live block (after
 * waiting for pending frees)": stream-ordered and deferred frees included. */
static void test_trim(void) {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *a = NULL, *b = NULL;
  CHECK(cudaMalloc(&a, 3 * MiB) == cudaSuccess, "a");
  CHECK(cudaMallocAsync(&b, 5 * MiB, s) == cudaSuccess, "b");
  CHECK(cudaFree(a) == cudaSuccess, "free a");
  work_t w = {b, 4096, 51, 0};
  emu_launch((CUstream)s, work_fill, &w);
  CHECK(cudaFreeAsync(b, s) == cudaSuccess, "free b on s");
  size_t released = shim_trim();
  emu_counters_t e = emu_now();
  CHECK(w.ran == 1, "vmmshim_trim did not wait for the work enqueued before a pending free");
  CHECK(e.mapped_bytes == 0 && e.live_handles == 0,
        "nothing live, yet vmmshim_trim (released %zu) left %llu bytes mapped, %ld handles", released, e.mapped_bytes,
        e.live_handles);
  CHECK(shim_stats().bytes_mapped == 0, "stats: %llu bytes mapped", (unsigned long long)shim_stats().bytes_mapped);
  void *c = NULL;
  CHECK(cudaMallocAsync(&c, MiB, s) == cudaSuccess && c, "alloc after trim");
  if (c) {
    pat_fill(c, MiB, 52);
    CHECK(pat_check(c, MiB, 52) == (size_t)-1, "data after trim");
  }
  CHECK(cudaFreeAsync(c, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess, "free");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
}

/* ------------------------------------------------------------------ frees from elsewhere */
/* A block allocated by one thread and freed by another, and a block freed after the stream
 * it was allocated on is gone: the real calls accept both, so must the shim. */
static void *free_from_thread(void *arg) {
  uintptr_t rc = cudaFree(arg) == cudaSuccess;
  return (void *)rc;
}

static void test_foreign_frees(void) {
  uint64_t req0 = shim_stats().bytes_requested_in_use;
  void *p = NULL;
  CHECK(cudaMalloc(&p, 3 * MiB) == cudaSuccess, "alloc");
  pat_fill(p, 3 * MiB, 77);
  pthread_t t;
  void *ok = NULL;
  CHECK(pthread_create(&t, NULL, free_from_thread, p) == 0 && pthread_join(t, &ok) == 0, "thread");
  CHECK(ok == (void *)1, "cudaFree from another thread failed");
  CHECK(cudaFree(p) == cudaErrorInvalidValue, "the block is gone after the other thread's free");

  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *q = NULL;
  CHECK(cudaMallocAsync(&q, 5 * MiB, s) == cudaSuccess, "alloc async");
  pat_fill(q, 5 * MiB, 78);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "destroy stream");
  CHECK(pat_check(q, 5 * MiB, 78) == (size_t)-1, "data survives the stream");
  CHECK(cudaFree(q) == cudaSuccess, "cudaFree after the stream was destroyed");
  /* and the pool is intact */
  void *r = NULL;
  CHECK(cudaMalloc(&r, 5 * MiB) == cudaSuccess, "alloc after");
  pat_fill(r, 5 * MiB, 79);
  CHECK(pat_check(r, 5 * MiB, 79) == (size_t)-1, "data after");
  CHECK(cudaFree(r) == cudaSuccess, "free after");
  CHECK(shim_stats().bytes_requested_in_use == req0, "requested bytes in use %llu, %llu before",
        (unsigned long long)shim_stats().bytes_requested_in_use, (unsigned long long)req0);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ context teardown */

static void test_device_reset(void) {
  void *p[5];
  for (int i = 0; i < 5; i++) CHECK(cudaMalloc(&p[i], (size_t)(i + 1) * MiB) == cudaSuccess, "alloc");
  emu_counters_t e0 = emu_now();
  CHECK(e0.live_mappings > 0, "no mappings before reset");
  int v0 = emu_violations();
  CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
  emu_counters_t e1 = emu_now();
  CHECK(e1.live_mappings == 0 && e1.live_handles == 0 && e1.live_reservations == 0,
        "after reset: %ld mappings, %ld handles, %ld reservations", e1.live_mappings, e1.live_handles,
        e1.live_reservations);
  CHECK(emu_violations() == v0, "reset violations %d", emu_violations() - v0);
  vmmshim_stats_t s0 = shim_stats();
  void *q = NULL;
  CHECK(cudaMalloc(&q, 3 * MiB) == cudaSuccess && q, "alloc after reset");
  CHECK(shim_stats().allocs[VMMSHIM_API_RUNTIME] == s0.allocs[VMMSHIM_API_RUNTIME] + 1, "not served by a new pool");
  if (q && emu_handle_info((CUdeviceptr)(uintptr_t)q, NULL, NULL, NULL) == 0) {
    pat_fill(q, 3 * MiB, 41);
    CHECK(pat_check(q, 3 * MiB, 41) == (size_t)-1, "data after reset");
  } else {
    CHECK(0, "block after reset not mapped");
  }
  CHECK(cudaFree(q) == cudaSuccess, "free");
  CHECK(emu_violations() == v0, "violations %d", emu_violations() - v0);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120);
  test_runtime_paths();
  test_driver_paths();
  test_memory();
  test_straddle();
  test_steady_state();
  test_sync_free();
  test_async_reuse();
  test_capture();
  test_errors();
  test_queries();
  test_trim();
  test_foreign_frees();
  test_device_reset();
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
