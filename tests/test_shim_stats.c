/* test_shim_stats: every counter of vmmshim_get_stats (include/vmmshim.h) against an answer
 * known beforehand: what the test itself did, or what the emulation counted on its side. Each
 * scenario runs in a fresh process (tests/check.h), where every counter starts at zero; after
 * each step, every counter the step must not move is checked unchanged.
 *
 *   counts    one allocation and one free through each API: allocs and frees of that API
 *             only, bytes_in_use by the served size (the request rounded up to 256 bytes),
 *             bytes_requested_in_use by the request, peak_bytes_in_use the highest total in
 *             use (kept after the frees), pools one per context (a second context adds one,
 *             destroying it takes it away; cudaDeviceReset takes the primary's).
 *   mapping   bytes_mapped = the emulation's mapped bytes after every step; peak_bytes_mapped 0
 *             before anything is mapped, then the highest mapped so far: it moves with growth
 *             and stays after vmmshim_trim; vmm_calls = the VMM calls the emulation counted
 *             (none in a steady state); vmm_ns > 0 after a VMM call, unchanged without one, and
 *             within the time the step took; trims = the handles vmmshim_trim released.
 *   syncs     sync-mode cudaFree and cuMemFree: one synchronisation each, the emulation's
 *             cuCtxSynchronize calls; stream-ordered frees: none.
 *   limit     VMMSHIM_LIMIT=64M: allocations past the cap: alloc_failures + 1 each, nothing
 *             counted as served or passed through.
 *   capture   an allocation on a capturing stream: passthrough_allocs + 1, not served.
 *   novmm     a device without VMM: every allocation passes through and is counted; no pool. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ------------------------------------------------------------------ the counters by name */

typedef struct {
  const char *name;
  size_t off;
} stat_field_t;

#define FIELD(f) {#f, offsetof(vmmshim_stats_t, f)}
static const stat_field_t stat_fields[] = {
    FIELD(allocs[0]),        FIELD(allocs[1]),          FIELD(allocs[2]),
    FIELD(allocs[3]),        FIELD(frees[0]),           FIELD(frees[1]),
    FIELD(frees[2]),         FIELD(frees[3]),           FIELD(alloc_failures),
    FIELD(passthrough_allocs), FIELD(bytes_in_use),     FIELD(peak_bytes_in_use),
    FIELD(bytes_requested_in_use), FIELD(bytes_mapped), FIELD(peak_bytes_mapped),
    FIELD(vmm_calls),        FIELD(vmm_ns),             FIELD(syncs),
    FIELD(trims),            FIELD(pools),
};
#undef FIELD
enum { NFIELDS = sizeof stat_fields / sizeof stat_fields[0] };
_Static_assert(NFIELDS * sizeof(uint64_t) == sizeof(vmmshim_stats_t), "a counter of vmmshim_stats_t is not listed");

static uint64_t field_value(const vmmshim_stats_t *s, int i) {
  uint64_t v;
  memcpy(&v, (const char *)s + stat_fields[i].off, sizeof v);
  return v;
}

/* Whether `name` is one of the space-separated names in `list`. */
static int named_in(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
  return 0;
}

/* Every counter not named in `moved` is the same in a and b. */
static void same_except(const char *step, const vmmshim_stats_t *a, const vmmshim_stats_t *b, const char *moved) {
  for (int i = 0; i < NFIELDS; i++) {
    if (named_in(moved, stat_fields[i].name)) continue;
    uint64_t x = field_value(a, i), y = field_value(b, i);
    CHECK(x == y, "%s: %s moved %llu -> %llu", step, stat_fields[i].name, (unsigned long long)x,
          (unsigned long long)y);
  }
}

/* The counters that follow the driver's mappings, checked on their own (mapping_ok). */
#define MAPPING "bytes_mapped peak_bytes_mapped vmm_calls vmm_ns trims"

/* ------------------------------------------------------------------ mappings, against the emulation */

/* What the emulation and the clock said at the start of a step. */
typedef struct {
  vmmshim_stats_t s;
  emu_counters_t e;
  double t;
  uint64_t peak_mapped; /* the highest bytes_mapped seen so far in this process */
} step_t;

static step_t step_begin(uint64_t peak_mapped) {
  step_t st;
  st.s = shim_stats();
  st.e = emu_now();
  st.peak_mapped = peak_mapped;
  st.t = now_s();
  return st;
}

/* After a step: the shim's mapping counters against the emulation's (the shim's only VMM calls are
 * the seven vmmshim.h names, none of them retried in these scenarios), and against the time the
 * step took. Returns the highest bytes_mapped seen so far. The process's VMM calls and mapped
 * bytes are all the shim's: the counters are compared in absolute terms, not only as changes.
 * Every handle released is a trim (an idle handle given back), except in a step that drops a
 * context (`dropped`): its handles go with it, and no trim is counted. */
static uint64_t mapping_ok_drop(const char *step, const step_t *st, vmmshim_stats_t *out, int dropped) {
  double took_ns = (now_s() - st->t) * 1e9;
  vmmshim_stats_t s = shim_stats();
  emu_counters_t e = emu_now();
  unsigned long long calls = emu_vmm_calls(&e), calls0 = emu_vmm_calls(&st->e);
  CHECK(s.bytes_mapped == e.mapped_bytes, "%s: bytes_mapped %llu, the emulation maps %llu", step,
        (unsigned long long)s.bytes_mapped, e.mapped_bytes);
  uint64_t peak = st->peak_mapped > s.bytes_mapped ? st->peak_mapped : s.bytes_mapped;
  CHECK(s.peak_bytes_mapped == peak, "%s: peak_bytes_mapped %llu, the highest mapped so far %llu", step,
        (unsigned long long)s.peak_bytes_mapped, (unsigned long long)peak);
  CHECK(s.vmm_calls == calls, "%s: vmm_calls %llu, the emulation counted %llu VMM calls", step,
        (unsigned long long)s.vmm_calls, calls);
  uint64_t dns = s.vmm_ns - st->s.vmm_ns;
  if (calls > calls0) {
    /* each call takes some time; all of them took place within the step */
    CHECK(dns >= calls - calls0 && (double)dns <= took_ns, "%s: vmm_ns +%llu for %llu VMM calls in a step of %.0f ns",
          step, (unsigned long long)dns, calls - calls0, took_ns);
  } else {
    CHECK(dns == 0, "%s: vmm_ns +%llu without a VMM call", step, (unsigned long long)dns);
  }
  unsigned long long released = e.n_cuMemRelease - st->e.n_cuMemRelease;
  unsigned long long trims = dropped ? 0 : released;
  CHECK(s.trims - st->s.trims == trims, "%s: trims +%llu, want %llu (the emulation released %llu handles)", step,
        (unsigned long long)(s.trims - st->s.trims), trims, released);
  if (out) *out = s;
  return peak;
}

static uint64_t mapping_ok(const char *step, const step_t *st, vmmshim_stats_t *out) {
  return mapping_ok_drop(step, st, out, 0);
}

static void all_zero(const char *step, const vmmshim_stats_t *s) {
  vmmshim_stats_t zero;
  memset(&zero, 0, sizeof zero);
  same_except(step, &zero, s, "");
}

/* ------------------------------------------------------------------ counts */

/* One API's allocation of `req` bytes (served as `served`) and its free, each step checked. */
typedef enum { VIA_RT, VIA_RT_ASYNC, VIA_DRV, VIA_DRV_ASYNC } via_t;

/* `first`: the process's first allocation, which creates the pool. */
static uint64_t one_api(via_t via, size_t req, size_t served, cudaStream_t st, uint64_t peak_mapped, int first) {
  static const char *alloc_name[] = {"cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemAllocAsync"};
  static const char *moved_alloc[] = {
      "allocs[0] bytes_in_use bytes_requested_in_use peak_bytes_in_use " MAPPING,
      "allocs[1] bytes_in_use bytes_requested_in_use peak_bytes_in_use " MAPPING,
      "allocs[2] bytes_in_use bytes_requested_in_use peak_bytes_in_use " MAPPING,
      "allocs[3] bytes_in_use bytes_requested_in_use peak_bytes_in_use " MAPPING};
  /* a synchronous free synchronises the context (default free mode), a stream-ordered one does not */
  static const char *moved_free[] = {"frees[0] bytes_in_use bytes_requested_in_use syncs " MAPPING,
                                     "frees[1] bytes_in_use bytes_requested_in_use " MAPPING,
                                     "frees[2] bytes_in_use bytes_requested_in_use syncs " MAPPING,
                                     "frees[3] bytes_in_use bytes_requested_in_use " MAPPING};
  char step[96];
  snprintf(step, sizeof step, "%s(%zu)", alloc_name[via], req);
  step_t b = step_begin(peak_mapped);
  CUdeviceptr d = 0;
  void *p = NULL;
  int ok = 0;
  switch (via) {
  case VIA_RT: ok = cudaMalloc(&p, req) == cudaSuccess; break;
  case VIA_RT_ASYNC: ok = cudaMallocAsync(&p, req, st) == cudaSuccess; break;
  case VIA_DRV: ok = cuMemAlloc(&d, req) == CUDA_SUCCESS; break;
  case VIA_DRV_ASYNC: ok = cuMemAllocAsync(&d, req, (CUstream)st) == CUDA_SUCCESS; break;
  }
  if (via == VIA_DRV || via == VIA_DRV_ASYNC) p = (void *)(uintptr_t)d;
  CHECK(ok && p, "%s failed", step);
  vmmshim_stats_t s1;
  peak_mapped = mapping_ok(step, &b, &s1);
  char moved[256];
  snprintf(moved, sizeof moved, "%s%s", moved_alloc[via], first ? " pools" : "");
  same_except(step, &b.s, &s1, moved);
  CHECK(s1.allocs[via] == b.s.allocs[via] + 1, "%s: allocs[%d] +%llu, want 1", step, (int)via,
        (unsigned long long)(s1.allocs[via] - b.s.allocs[via]));
  CHECK(s1.bytes_in_use == b.s.bytes_in_use + served, "%s: bytes_in_use +%lld, want %zu", step,
        (long long)(s1.bytes_in_use - b.s.bytes_in_use), served);
  CHECK(s1.bytes_requested_in_use == b.s.bytes_requested_in_use + req, "%s: bytes_requested_in_use +%lld, want %zu",
        step, (long long)(s1.bytes_requested_in_use - b.s.bytes_requested_in_use), req);
  uint64_t peak = b.s.peak_bytes_in_use > s1.bytes_in_use ? b.s.peak_bytes_in_use : s1.bytes_in_use;
  CHECK(s1.peak_bytes_in_use == peak, "%s: peak_bytes_in_use %llu, want %llu", step,
        (unsigned long long)s1.peak_bytes_in_use, (unsigned long long)peak);

  snprintf(step, sizeof step, "free of %s(%zu)", alloc_name[via], req);
  b = step_begin(peak_mapped);
  switch (via) {
  case VIA_RT: ok = cudaFree(p) == cudaSuccess; break;
  case VIA_RT_ASYNC: ok = cudaFreeAsync(p, st) == cudaSuccess; break;
  case VIA_DRV: ok = cuMemFree(d) == CUDA_SUCCESS; break;
  case VIA_DRV_ASYNC: ok = cuMemFreeAsync(d, (CUstream)st) == CUDA_SUCCESS; break;
  }
  CHECK(ok, "%s failed", step);
  emu_counters_t e = emu_now();
  peak_mapped = mapping_ok(step, &b, &s1);
  same_except(step, &b.s, &s1, moved_free[via]);
  CHECK(s1.frees[via] == b.s.frees[via] + 1, "%s: frees[%d] +%llu, want 1", step, (int)via,
        (unsigned long long)(s1.frees[via] - b.s.frees[via]));
  CHECK(b.s.bytes_in_use - s1.bytes_in_use == served && b.s.bytes_requested_in_use - s1.bytes_requested_in_use == req,
        "%s: bytes_in_use -%lld (want %zu), requested -%lld (want %zu)", step,
        (long long)(b.s.bytes_in_use - s1.bytes_in_use), served,
        (long long)(b.s.bytes_requested_in_use - s1.bytes_requested_in_use), req);
  unsigned long long ctx_syncs = e.n_cuCtxSynchronize - b.e.n_cuCtxSynchronize;
  int sync_free = via == VIA_RT || via == VIA_DRV;
  CHECK(s1.syncs - b.s.syncs == (sync_free ? 1u : 0u) && ctx_syncs == s1.syncs - b.s.syncs,
        "%s: syncs +%llu (want %d), the emulation's cuCtxSynchronize +%llu", step,
        (unsigned long long)(s1.syncs - b.s.syncs), sync_free, ctx_syncs);
  return peak_mapped;
}

static void scenario_counts(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  CHECK(shim_active() == 1, "vmmshim_active() = %d", shim_active());
  vmmshim_stats_t s = shim_stats();
  all_zero("a fresh process, before any allocation", &s);
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
  uint64_t pm = 0;
  /* served: 256-byte multiples */
  pm = one_api(VIA_RT, 1000, 1024, st, pm, 1);
  CHECK(shim_stats().pools == 1, "pools %llu after the first allocation, want 1", (unsigned long long)shim_stats().pools);
  pm = one_api(VIA_RT_ASYNC, 5000, 5120, st, pm, 0);
  pm = one_api(VIA_DRV, 3000, 3072, st, pm, 0);
  pm = one_api(VIA_DRV_ASYNC, 7000, 7168, st, pm, 0);
  pm = one_api(VIA_RT, 3 * MiB + 1, 3 * MiB + 256, st, pm, 0);

  /* peak_bytes_in_use: the highest total, kept after frees */
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  uint64_t base = shim_stats().bytes_in_use;
  CHECK(base == 0, "%llu bytes in use with nothing allocated", (unsigned long long)base);
  CHECK(cudaMalloc(&a, 3 * MiB) == cudaSuccess && cudaMalloc(&b, 5 * MiB) == cudaSuccess, "3 + 5 MiB");
  CHECK(cudaFree(a) == cudaSuccess && cudaMalloc(&c, MiB) == cudaSuccess, "free 3, take 1");
  s = shim_stats();
  CHECK(s.bytes_in_use == 6 * MiB && s.peak_bytes_in_use == 8 * MiB, "in use %llu (want 6 MiB), peak %llu (want 8 MiB)",
        (unsigned long long)s.bytes_in_use, (unsigned long long)s.peak_bytes_in_use);
  CHECK(cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess, "free");
  s = shim_stats();
  CHECK(s.bytes_in_use == 0 && s.bytes_requested_in_use == 0 && s.peak_bytes_in_use == 8 * MiB,
        "all freed: in use %llu, requested %llu, peak %llu (want 8 MiB)", (unsigned long long)s.bytes_in_use,
        (unsigned long long)s.bytes_requested_in_use, (unsigned long long)s.peak_bytes_in_use);
  CHECK(cudaMalloc(&d, 9 * MiB) == cudaSuccess, "9 MiB");
  CHECK(shim_stats().peak_bytes_in_use == 9 * MiB, "peak %llu, want 9 MiB", (unsigned long long)shim_stats().peak_bytes_in_use);
  CHECK(cudaFree(d) == cudaSuccess, "free");

  /* pools: one per context */
  CUcontext primary = NULL, other = NULL;
  CHECK(cuCtxGetCurrent(&primary) == CUDA_SUCCESS && primary, "the primary context");
  step_t bs = step_begin(pm);
  CHECK(cuCtxCreate(&other, NULL, 0, 0) == CUDA_SUCCESS && other, "cuCtxCreate");
  CUdeviceptr q = 0;
  CHECK(cuMemAlloc(&q, 4096) == CUDA_SUCCESS && q, "cuMemAlloc in the second context");
  vmmshim_stats_t s1;
  pm = mapping_ok("second context", &bs, &s1);
  CHECK(s1.pools == 2, "pools %llu with two contexts, want 2", (unsigned long long)s1.pools);
  same_except("second context", &bs.s, &s1, "allocs[2] bytes_in_use bytes_requested_in_use pools " MAPPING);
  CHECK(cuMemFree(q) == CUDA_SUCCESS, "free");
  bs = step_begin(pm);
  CHECK(cuCtxDestroy(other) == CUDA_SUCCESS, "cuCtxDestroy");
  pm = mapping_ok_drop("second context destroyed", &bs, &s1, 1);
  CHECK(s1.pools == 1, "pools %llu after destroying the second context, want 1", (unsigned long long)s1.pools);
  same_except("second context destroyed", &bs.s, &s1, "pools " MAPPING);
  CHECK(cuCtxSetCurrent(primary) == CUDA_SUCCESS, "back to the primary context");
  bs = step_begin(pm);
  CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
  pm = mapping_ok_drop("cudaDeviceReset", &bs, &s1, 1);
  CHECK(s1.pools == 0 && s1.bytes_mapped == 0, "after cudaDeviceReset: pools %llu, %llu bytes mapped, want none",
        (unsigned long long)s1.pools, (unsigned long long)s1.bytes_mapped);
  void *r = NULL;
  CHECK(cudaMalloc(&r, 4096) == cudaSuccess, "alloc after the reset");
  CHECK(shim_stats().pools == 1, "pools %llu after the reset and an allocation, want 1",
        (unsigned long long)shim_stats().pools);
  CHECK(cudaFree(r) == cudaSuccess, "free");
  (void)pm;
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ mapping */

static void scenario_mapping(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  vmmshim_stats_t s = shim_stats();
  emu_counters_t e = emu_now();
  all_zero("before any allocation", &s);
  CHECK(e.mapped_bytes == 0 && emu_vmm_calls(&e) == 0, "the emulation saw VMM calls before any allocation");
  /* Growth: what is mapped only grows while nothing is freed, so its peak is the last value. */
  static const size_t sizes[] = {1000, 3 * MiB, 20 * MiB, 100 * KiB, 70 * MiB, 200 * MiB + 5};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  uint64_t pm = 0;
  for (int i = 0; i < N; i++) {
    char step[64];
    snprintf(step, sizeof step, "grow: cudaMalloc(%zu)", sizes[i]);
    step_t b = step_begin(pm);
    CHECK(cudaMalloc(&p[i], sizes[i]) == cudaSuccess, "%s", step);
    vmmshim_stats_t s1;
    pm = mapping_ok(step, &b, &s1);
    same_except(step, &b.s, &s1,
                i ? "allocs[0] bytes_in_use bytes_requested_in_use peak_bytes_in_use " MAPPING
                  : "allocs[0] bytes_in_use bytes_requested_in_use peak_bytes_in_use pools " MAPPING);
  }
  CHECK(shim_stats().pools == 1, "pools %llu, want 1", (unsigned long long)shim_stats().pools);
  s = shim_stats();
  CHECK(s.bytes_mapped > 200 * MiB && s.peak_bytes_mapped == s.bytes_mapped && s.vmm_calls > 0 && s.vmm_ns > 0,
        "after growth: mapped %llu, peak %llu, %llu VMM calls in %llu ns", (unsigned long long)s.bytes_mapped,
        (unsigned long long)s.peak_bytes_mapped, (unsigned long long)s.vmm_calls, (unsigned long long)s.vmm_ns);
  uint64_t peak1 = s.peak_bytes_mapped;

  /* Steady state: the same sizes again and again, no VMM call. */
  step_t b = step_begin(pm);
  for (int round = 0; round < 20; round++)
    for (int i = 0; i < N; i++) {
      void *q = NULL;
      CHECK(cudaFree(p[i]) == cudaSuccess && cudaMalloc(&q, sizes[i]) == cudaSuccess, "steady state, round %d", round);
      p[i] = q;
    }
  vmmshim_stats_t s1;
  pm = mapping_ok("steady state", &b, &s1);
  CHECK(s1.vmm_calls == b.s.vmm_calls && s1.bytes_mapped == b.s.bytes_mapped,
        "steady state: vmm_calls %llu -> %llu, mapped %llu -> %llu", (unsigned long long)b.s.vmm_calls,
        (unsigned long long)s1.vmm_calls, (unsigned long long)b.s.bytes_mapped, (unsigned long long)s1.bytes_mapped);
  CHECK(s1.allocs[0] - b.s.allocs[0] == 20 * N && s1.frees[0] - b.s.frees[0] == 20 * N &&
            s1.syncs - b.s.syncs == 20 * N,
        "steady state: %llu allocations, %llu frees, %llu syncs, want %d each",
        (unsigned long long)(s1.allocs[0] - b.s.allocs[0]), (unsigned long long)(s1.frees[0] - b.s.frees[0]),
        (unsigned long long)(s1.syncs - b.s.syncs), 20 * N);
  same_except("steady state", &b.s, &s1, "allocs[0] frees[0] syncs " MAPPING);

  /* Everything freed and trimmed: nothing mapped, the peak stays. */
  for (int i = 0; i < N; i++) CHECK(cudaFree(p[i]) == cudaSuccess, "free");
  b = step_begin(pm);
  size_t back = shim_trim();
  pm = mapping_ok("vmmshim_trim", &b, &s1);
  CHECK(s1.bytes_mapped == 0 && back == b.s.bytes_mapped, "vmmshim_trim gave back %zu of %llu mapped; %llu left", back,
        (unsigned long long)b.s.bytes_mapped, (unsigned long long)s1.bytes_mapped);
  CHECK(s1.peak_bytes_mapped == peak1, "peak_bytes_mapped %llu after the trim, want %llu (the peak stays)",
        (unsigned long long)s1.peak_bytes_mapped, (unsigned long long)peak1);
  CHECK(s1.trims > b.s.trims, "vmmshim_trim released no handle (trims %llu)", (unsigned long long)s1.trims);
  same_except("vmmshim_trim", &b.s, &s1, MAPPING);

  /* Below the peak it stays; past it, it follows. */
  void *small = NULL, *big = NULL;
  b = step_begin(pm);
  CHECK(cudaMalloc(&small, 3 * MiB) == cudaSuccess, "3 MiB after the trim");
  pm = mapping_ok("3 MiB after the trim", &b, &s1);
  CHECK(s1.bytes_mapped > 0 && s1.bytes_mapped < peak1 && s1.peak_bytes_mapped == peak1,
        "3 MiB after the trim: mapped %llu, peak %llu (want %llu)", (unsigned long long)s1.bytes_mapped,
        (unsigned long long)s1.peak_bytes_mapped, (unsigned long long)peak1);
  b = step_begin(pm);
  CHECK(cudaMalloc(&big, (size_t)peak1 + 64 * MiB) == cudaSuccess, "past the old peak");
  pm = mapping_ok("past the old peak", &b, &s1);
  CHECK(s1.peak_bytes_mapped == s1.bytes_mapped && s1.peak_bytes_mapped > peak1 + 64 * MiB,
        "past the old peak: mapped %llu, peak %llu, old peak %llu", (unsigned long long)s1.bytes_mapped,
        (unsigned long long)s1.peak_bytes_mapped, (unsigned long long)peak1);
  CHECK(cudaFree(small) == cudaSuccess && cudaFree(big) == cudaSuccess, "free");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ syncs */

static void scenario_syncs(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
  /* warm: the sizes below are served without growth */
  void *w = NULL, *wa = NULL;
  CHECK(cudaMalloc(&w, 4 * MiB) == cudaSuccess && cudaFree(w) == cudaSuccess, "warm");
  CHECK(cudaMallocAsync(&wa, MiB, st) == cudaSuccess && cudaFreeAsync(wa, st) == cudaSuccess, "warm async");
  vmmshim_stats_t s0 = shim_stats();
  emu_counters_t e0 = emu_now();
  for (int i = 0; i < 5; i++) {
    void *p = NULL;
    CUdeviceptr d = 0;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess && cudaFree(p) == cudaSuccess, "cudaMalloc/cudaFree");
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS && cuMemFree(d) == CUDA_SUCCESS, "cuMemAlloc/cuMemFree");
  }
  vmmshim_stats_t s1 = shim_stats();
  emu_counters_t e1 = emu_now();
  CHECK(s1.syncs - s0.syncs == 10, "10 synchronous frees: syncs +%llu, want 10", (unsigned long long)(s1.syncs - s0.syncs));
  CHECK(e1.n_cuCtxSynchronize - e0.n_cuCtxSynchronize == 10, "the emulation counted %llu cuCtxSynchronize, want 10",
        e1.n_cuCtxSynchronize - e0.n_cuCtxSynchronize);
  for (int i = 0; i < 5; i++) {
    void *p = NULL;
    CUdeviceptr d = 0;
    CHECK(cudaMallocAsync(&p, MiB, st) == cudaSuccess && cudaFreeAsync(p, st) == cudaSuccess, "async");
    CHECK(cuMemAllocAsync(&d, MiB, (CUstream)st) == CUDA_SUCCESS && cuMemFreeAsync(d, (CUstream)st) == CUDA_SUCCESS,
          "driver async");
  }
  vmmshim_stats_t s2 = shim_stats();
  emu_counters_t e2 = emu_now();
  CHECK(s2.syncs == s1.syncs, "stream-ordered frees: syncs +%llu, want 0", (unsigned long long)(s2.syncs - s1.syncs));
  CHECK(e2.n_cuCtxSynchronize == e1.n_cuCtxSynchronize && e2.n_cuStreamSynchronize == e1.n_cuStreamSynchronize,
        "stream-ordered frees synchronised: ctx +%llu, stream +%llu", e2.n_cuCtxSynchronize - e1.n_cuCtxSynchronize,
        e2.n_cuStreamSynchronize - e1.n_cuStreamSynchronize);
  same_except("stream-ordered pairs", &s1, &s2, "allocs[1] frees[1] allocs[3] frees[3] " MAPPING);
  CHECK(cudaStreamSynchronize(st) == cudaSuccess && cudaStreamDestroy(st) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ limit */

static void scenario_limit(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  void *a = NULL;
  CHECK(cudaMalloc(&a, 48 * MiB) == cudaSuccess, "48 MiB under a cap of 64 MiB");
  step_t b = step_begin(0);
  b.peak_mapped = b.s.peak_bytes_mapped;
  void *p = (void *)0x1;
  CHECK(cudaMalloc(&p, 32 * MiB) == cudaErrorMemoryAllocation, "32 MiB more: past the cap");
  cudaGetLastError();
  vmmshim_stats_t s1;
  uint64_t pm = mapping_ok("cudaMalloc past the cap", &b, &s1);
  CHECK(s1.alloc_failures == 1, "alloc_failures %llu, want 1", (unsigned long long)s1.alloc_failures);
  same_except("cudaMalloc past the cap", &b.s, &s1, "alloc_failures " MAPPING);
  b = step_begin(pm);
  CUdeviceptr d = 0;
  CHECK(cuMemAlloc(&d, 20 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc past the cap");
  mapping_ok("cuMemAlloc past the cap", &b, &s1);
  CHECK(s1.alloc_failures == 2, "alloc_failures %llu, want 2", (unsigned long long)s1.alloc_failures);
  same_except("cuMemAlloc past the cap", &b.s, &s1, "alloc_failures " MAPPING);
  CHECK(cudaFree(a) == cudaSuccess, "free");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ pass-through */

static void scenario_capture(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
  void *warm = NULL;
  CHECK(cudaMallocAsync(&warm, 4096, st) == cudaSuccess && cudaFreeAsync(warm, st) == cudaSuccess, "warm");
  CHECK(cudaStreamSynchronize(st) == cudaSuccess, "sync");
  vmmshim_stats_t s0 = shim_stats();
  emu_counters_t e0 = emu_now();
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  void *p = NULL, *q = NULL;
  CHECK(cudaMallocAsync(&p, 100000, st) == cudaSuccess && p, "cudaMallocAsync in the capture");
  CHECK(cudaMallocAsync(&q, 5000, st) == cudaSuccess && q, "another");
  vmmshim_stats_t s1 = shim_stats();
  emu_counters_t e1 = emu_now();
  CHECK(e1.n_cuMemAllocAsync - e0.n_cuMemAllocAsync == 2, "the driver made %llu allocations, want 2",
        e1.n_cuMemAllocAsync - e0.n_cuMemAllocAsync);
  CHECK(s1.passthrough_allocs - s0.passthrough_allocs == 2, "passthrough_allocs +%llu, want 2",
        (unsigned long long)(s1.passthrough_allocs - s0.passthrough_allocs));
  same_except("allocations in a capture", &s0, &s1, "passthrough_allocs");
  CHECK(cudaFreeAsync(p, st) == cudaSuccess && cudaFreeAsync(q, st) == cudaSuccess, "frees in the capture");
  cudaGraph_t g = NULL;
  CHECK(cudaStreamEndCapture(st, &g) == cudaSuccess && g, "end capture");
  if (g) CHECK(cudaGraphDestroy(g) == cudaSuccess, "graph destroy");
  vmmshim_stats_t s2 = shim_stats();
  same_except("frees in a capture", &s1, &s2, "");
  CHECK(cudaStreamDestroy(st) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

static void scenario_novmm(void) {
  emu_set_caps(0, 0, 0);
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  vmmshim_stats_t s0 = shim_stats();
  void *p = NULL;
  CUdeviceptr d = 0;
  CHECK(cudaMalloc(&p, 3 * MiB) == cudaSuccess && p, "cudaMalloc");
  CHECK(cuMemAlloc(&d, 5000) == CUDA_SUCCESS && d, "cuMemAlloc");
  vmmshim_stats_t s1 = shim_stats();
  CHECK(s1.passthrough_allocs - s0.passthrough_allocs == 2, "passthrough_allocs +%llu, want 2",
        (unsigned long long)(s1.passthrough_allocs - s0.passthrough_allocs));
  same_except("no VMM", &s0, &s1, "passthrough_allocs");
  CHECK(cudaFree(p) == cudaSuccess && cuMemFree(d) == CUDA_SUCCESS, "frees");
  vmmshim_stats_t s2 = shim_stats();
  same_except("no VMM, frees", &s1, &s2, "");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(120);
    if (!strcmp(sc, "counts")) scenario_counts();
    else if (!strcmp(sc, "mapping")) scenario_mapping();
    else if (!strcmp(sc, "syncs")) scenario_syncs();
    else if (!strcmp(sc, "limit")) scenario_limit();
    else if (!strcmp(sc, "capture")) scenario_capture();
    else if (!strcmp(sc, "novmm")) scenario_novmm();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  check_run_child("counts", NULL);
  check_run_child("mapping", NULL);
  check_run_child("syncs", NULL);
  check_run_child("limit", "VMMSHIM_LIMIT=64M", NULL);
  check_run_child("capture", NULL);
  check_run_child("novmm", NULL);
  return check_summary();
}
