/* test_shim_gate: every entry point of the shim's gated tables (VS_GATED in
 * src/hook/hook_gated.c: launches, copies, memsets, stream memory operations) is the shim's by
 * every route a program takes to it, and a call through it waits at the gate while a sleep
 * moves memory.
 *
 * The table below is the expectation, kept by hand: an entry point dropped from the shim's list
 * fails here (its symbol resolves to the driver, and its calls run during a move). The table is
 * also compared with the list in the source, so that an entry point added there is added here.
 *
 * For each entry: dlsym(RTLD_DEFAULT) gives the shim's function. For each one the emulation
 * implements (tests/emu/cuda_emu.c): dlsym(RTLD_NEXT) and dlsym on libcuda.so.1 give it too,
 * cuGetProcAddress at its version (per-thread-stream flag for _ptsz/_ptds) gives that same
 * function, and a call of it made while a sleep holds the gate (the sleep parked in cuMemUnmap
 * by emu_hold_next) has not returned after GATE_HOLD_MS; once the move ends, each returns
 * CUDA_SUCCESS and did its work. The others cannot be called on the emulation (no such entry
 * point there: the shim answers CUDA_ERROR_NOT_INITIALIZED before the gate); they are listed. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#pragma weak vmmshim_sleep
#pragma weak vmmshim_wake
#pragma weak vmmshim_set_tag

#define MiB (1ull << 20)
#define GATE_HOLD_MS 300 /* a call that passes an open gate returns well within this, even under load */

/* How an entry point is called on the emulation (C_NONE: it has no such entry point). */
typedef enum {
  C_NONE = 0,
  C_LAUNCH,
  C_DTOD,
  C_DTOD_ASYNC,
  C_SET8,
  C_SET16,
  C_SET32,
  C_SET8_ASYNC,
  C_SET16_ASYNC,
  C_SET32_ASYNC,
  C_SET2D8,
  C_SET2D8_ASYNC,
  C_WRITE32,
  C_WRITE64,
  C_WAIT32,
  C_WAIT64,
  C_MEMOP,
  C_DTOH,
  C_HTOD,
  C_DTOH_ASYNC,
  C_HTOD_ASYNC,
} call_t;

typedef struct {
  const char *sym, *base;
  int ver, ptsz;
  call_t call;
} entry_t;

/* Every gated entry point: exported symbol, cuGetProcAddress name, version, per-thread variant. */
static const entry_t g_table[] = {
    {"cuLaunchKernel", "cuLaunchKernel", 4000, 0, C_LAUNCH},
    {"cuLaunchKernel_ptsz", "cuLaunchKernel", 4000, 1, C_LAUNCH},
    {"cuLaunchKernelEx", "cuLaunchKernelEx", 11060, 0, C_NONE},
    {"cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", 11060, 1, C_NONE},
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 9000, 0, C_NONE},
    {"cuLaunchCooperativeKernel_ptsz", "cuLaunchCooperativeKernel", 9000, 1, C_NONE},
    {"cuGraphLaunch", "cuGraphLaunch", 10000, 0, C_NONE},
    {"cuGraphLaunch_ptsz", "cuGraphLaunch", 10000, 1, C_NONE},
    {"cuMemcpy", "cuMemcpy", 4000, 0, C_NONE},
    {"cuMemcpy_ptds", "cuMemcpy", 4000, 1, C_NONE},
    {"cuMemcpyAsync", "cuMemcpyAsync", 4000, 0, C_NONE},
    {"cuMemcpyAsync_ptsz", "cuMemcpyAsync", 4000, 1, C_NONE},
    {"cuMemcpyHtoD_v2", "cuMemcpyHtoD", 3020, 0, C_HTOD},
    {"cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD", 3020, 1, C_NONE},
    {"cuMemcpyDtoH_v2", "cuMemcpyDtoH", 3020, 0, C_DTOH},
    {"cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoH", 3020, 1, C_NONE},
    {"cuMemcpyDtoD_v2", "cuMemcpyDtoD", 3020, 0, C_DTOD},
    {"cuMemcpyDtoD_v2_ptds", "cuMemcpyDtoD", 3020, 1, C_NONE},
    {"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync", 3020, 0, C_HTOD_ASYNC},
    {"cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoDAsync", 3020, 1, C_NONE},
    {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync", 3020, 0, C_DTOH_ASYNC},
    {"cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyDtoHAsync", 3020, 1, C_NONE},
    {"cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync", 3020, 0, C_DTOD_ASYNC},
    {"cuMemcpyDtoDAsync_v2_ptsz", "cuMemcpyDtoDAsync", 3020, 1, C_DTOD_ASYNC},
    {"cuMemcpy2D_v2", "cuMemcpy2D", 3020, 0, C_NONE},
    {"cuMemcpy2D_v2_ptds", "cuMemcpy2D", 3020, 1, C_NONE},
    {"cuMemcpy2DAsync_v2", "cuMemcpy2DAsync", 3020, 0, C_NONE},
    {"cuMemcpy2DAsync_v2_ptsz", "cuMemcpy2DAsync", 3020, 1, C_NONE},
    {"cuMemcpy3D_v2", "cuMemcpy3D", 3020, 0, C_NONE},
    {"cuMemcpy3D_v2_ptds", "cuMemcpy3D", 3020, 1, C_NONE},
    {"cuMemcpy3DAsync_v2", "cuMemcpy3DAsync", 3020, 0, C_NONE},
    {"cuMemcpy3DAsync_v2_ptsz", "cuMemcpy3DAsync", 3020, 1, C_NONE},
    {"cuMemcpyPeer", "cuMemcpyPeer", 4000, 0, C_NONE},
    {"cuMemcpyPeer_ptds", "cuMemcpyPeer", 4000, 1, C_NONE},
    {"cuMemcpyPeerAsync", "cuMemcpyPeerAsync", 4000, 0, C_NONE},
    {"cuMemcpyPeerAsync_ptsz", "cuMemcpyPeerAsync", 4000, 1, C_NONE},
    {"cuMemsetD8_v2", "cuMemsetD8", 3020, 0, C_SET8},
    {"cuMemsetD8_v2_ptds", "cuMemsetD8", 3020, 1, C_SET8},
    {"cuMemsetD16_v2", "cuMemsetD16", 3020, 0, C_SET16},
    {"cuMemsetD16_v2_ptds", "cuMemsetD16", 3020, 1, C_SET16},
    {"cuMemsetD32_v2", "cuMemsetD32", 3020, 0, C_SET32},
    {"cuMemsetD32_v2_ptds", "cuMemsetD32", 3020, 1, C_SET32},
    {"cuMemsetD8Async", "cuMemsetD8Async", 3020, 0, C_SET8_ASYNC},
    {"cuMemsetD8Async_ptsz", "cuMemsetD8Async", 3020, 1, C_SET8_ASYNC},
    {"cuMemsetD16Async", "cuMemsetD16Async", 3020, 0, C_SET16_ASYNC},
    {"cuMemsetD16Async_ptsz", "cuMemsetD16Async", 3020, 1, C_SET16_ASYNC},
    {"cuMemsetD32Async", "cuMemsetD32Async", 3020, 0, C_SET32_ASYNC},
    {"cuMemsetD32Async_ptsz", "cuMemsetD32Async", 3020, 1, C_SET32_ASYNC},
    {"cuMemsetD2D8_v2", "cuMemsetD2D8", 3020, 0, C_SET2D8},
    {"cuMemsetD2D8_v2_ptds", "cuMemsetD2D8", 3020, 1, C_NONE},
    {"cuMemsetD2D16_v2", "cuMemsetD2D16", 3020, 0, C_NONE},
    {"cuMemsetD2D16_v2_ptds", "cuMemsetD2D16", 3020, 1, C_NONE},
    {"cuMemsetD2D32_v2", "cuMemsetD2D32", 3020, 0, C_NONE},
    {"cuMemsetD2D32_v2_ptds", "cuMemsetD2D32", 3020, 1, C_NONE},
    {"cuMemsetD2D8Async", "cuMemsetD2D8Async", 3020, 0, C_SET2D8_ASYNC},
    {"cuMemsetD2D8Async_ptsz", "cuMemsetD2D8Async", 3020, 1, C_SET2D8_ASYNC},
    {"cuMemsetD2D16Async", "cuMemsetD2D16Async", 3020, 0, C_NONE},
    {"cuMemsetD2D16Async_ptsz", "cuMemsetD2D16Async", 3020, 1, C_NONE},
    {"cuMemsetD2D32Async", "cuMemsetD2D32Async", 3020, 0, C_NONE},
    {"cuMemsetD2D32Async_ptsz", "cuMemsetD2D32Async", 3020, 1, C_NONE},
    {"cuMemcpy3DPeer", "cuMemcpy3DPeer", 4000, 0, C_NONE},
    {"cuMemcpy3DPeer_ptds", "cuMemcpy3DPeer", 4000, 1, C_NONE},
    {"cuMemcpy3DPeerAsync", "cuMemcpy3DPeerAsync", 4000, 0, C_NONE},
    {"cuMemcpy3DPeerAsync_ptsz", "cuMemcpy3DPeerAsync", 4000, 1, C_NONE},
    {"cuMemcpyDtoA_v2", "cuMemcpyDtoA", 3020, 0, C_NONE},
    {"cuMemcpyDtoA_v2_ptds", "cuMemcpyDtoA", 3020, 1, C_NONE},
    {"cuMemcpyAtoD_v2", "cuMemcpyAtoD", 3020, 0, C_NONE},
    {"cuMemcpyAtoD_v2_ptds", "cuMemcpyAtoD", 3020, 1, C_NONE},
    {"cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned", 3020, 0, C_NONE},
    {"cuMemcpy2DUnaligned_v2_ptds", "cuMemcpy2DUnaligned", 3020, 1, C_NONE},
    {"cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync", 13000, 0, C_NONE},
    {"cuMemcpyBatchAsync_v2_ptsz", "cuMemcpyBatchAsync", 13000, 1, C_NONE},
    {"cuMemcpyBatchAsync", "cuMemcpyBatchAsync", 12080, 0, C_NONE},
    {"cuMemcpyBatchAsync_ptsz", "cuMemcpyBatchAsync", 12080, 1, C_NONE},
    {"cuMemcpy3DBatchAsync_v2", "cuMemcpy3DBatchAsync", 13000, 0, C_NONE},
    {"cuMemcpy3DBatchAsync_v2_ptsz", "cuMemcpy3DBatchAsync", 13000, 1, C_NONE},
    {"cuMemcpy3DBatchAsync", "cuMemcpy3DBatchAsync", 12080, 0, C_NONE},
    {"cuMemcpy3DBatchAsync_ptsz", "cuMemcpy3DBatchAsync", 12080, 1, C_NONE},
    {"cuMemBatchDecompressAsync", "cuMemBatchDecompressAsync", 12060, 0, C_NONE},
    {"cuMemBatchDecompressAsync_ptsz", "cuMemBatchDecompressAsync", 12060, 1, C_NONE},
    {"cuLaunch", "cuLaunch", 2000, 0, C_NONE},
    {"cuLaunchGrid", "cuLaunchGrid", 2000, 0, C_NONE},
    {"cuLaunchGridAsync", "cuLaunchGridAsync", 2000, 0, C_NONE},
    {"cuStreamWriteValue32_v2", "cuStreamWriteValue32", 11070, 0, C_WRITE32},
    {"cuStreamWriteValue32_v2_ptsz", "cuStreamWriteValue32", 11070, 1, C_WRITE32},
    {"cuStreamWriteValue32", "cuStreamWriteValue32", 8000, 0, C_WRITE32},
    {"cuStreamWriteValue32_ptsz", "cuStreamWriteValue32", 8000, 1, C_WRITE32},
    {"cuStreamWriteValue64_v2", "cuStreamWriteValue64", 11070, 0, C_WRITE64},
    {"cuStreamWriteValue64_v2_ptsz", "cuStreamWriteValue64", 11070, 1, C_WRITE64},
    {"cuStreamWriteValue64", "cuStreamWriteValue64", 9000, 0, C_WRITE64},
    {"cuStreamWriteValue64_ptsz", "cuStreamWriteValue64", 9000, 1, C_WRITE64},
    {"cuStreamWaitValue32_v2", "cuStreamWaitValue32", 11070, 0, C_WAIT32},
    {"cuStreamWaitValue32_v2_ptsz", "cuStreamWaitValue32", 11070, 1, C_WAIT32},
    {"cuStreamWaitValue32", "cuStreamWaitValue32", 8000, 0, C_WAIT32},
    {"cuStreamWaitValue32_ptsz", "cuStreamWaitValue32", 8000, 1, C_WAIT32},
    {"cuStreamWaitValue64_v2", "cuStreamWaitValue64", 11070, 0, C_WAIT64},
    {"cuStreamWaitValue64_v2_ptsz", "cuStreamWaitValue64", 11070, 1, C_WAIT64},
    {"cuStreamWaitValue64", "cuStreamWaitValue64", 9000, 0, C_WAIT64},
    {"cuStreamWaitValue64_ptsz", "cuStreamWaitValue64", 9000, 1, C_WAIT64},
    {"cuStreamBatchMemOp_v2", "cuStreamBatchMemOp", 11070, 0, C_MEMOP},
    {"cuStreamBatchMemOp_v2_ptsz", "cuStreamBatchMemOp", 11070, 1, C_MEMOP},
    {"cuStreamBatchMemOp", "cuStreamBatchMemOp", 8000, 0, C_MEMOP},
    {"cuStreamBatchMemOp_ptsz", "cuStreamBatchMemOp", 8000, 1, C_MEMOP},
};
#define N_ENTRIES (sizeof g_table / sizeof g_table[0])

static int kernel_stub;
static unsigned char *g_buf;   /* 64 KiB the memsets and copies write: one slice per entry */
static uint64_t *g_words;      /* a word per entry for the value writes; g_words[N_ENTRIES] is 1 for the waits */
static volatile int g_returned[N_ENTRIES];
static CUresult g_result[N_ENTRIES];
static void *g_fn[N_ENTRIES];

#define SLICE 512
static unsigned char g_host[2][SLICE]; /* the host side of cuMemcpyDtoH (0) and cuMemcpyHtoD (1) */
/* The same for the async copies, which take pinned memory only (cuMemHostAlloc, made in main). */
static unsigned char *g_pinned[2];

static CUresult call_entry(size_t i) {
  void *f = g_fn[i];
  CUdeviceptr at = (CUdeviceptr)(uintptr_t)(g_buf + i * SLICE), word = (CUdeviceptr)(uintptr_t)&g_words[i];
  CUdeviceptr one = (CUdeviceptr)(uintptr_t)&g_words[N_ENTRIES];
  CUstream s = NULL; /* the legacy stream, or (_ptsz) the thread's own */
  CUstreamBatchMemOpParams op;
  switch (g_table[i].call) {
  case C_LAUNCH:
    return ((CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                         void **, void **))f)((CUfunction)&kernel_stub, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
  case C_DTOD: return ((CUresult(*)(CUdeviceptr, CUdeviceptr, size_t))f)(at, at + SLICE / 2, SLICE / 2);
  case C_DTOH: return ((CUresult(*)(void *, CUdeviceptr, size_t))f)(g_host[0], at + SLICE / 2, SLICE / 2);
  case C_HTOD:
    memset(g_host[1], 0x5a, SLICE);
    return ((CUresult(*)(CUdeviceptr, const void *, size_t))f)(at, g_host[1], SLICE);
  case C_DTOH_ASYNC:
    return ((CUresult(*)(void *, CUdeviceptr, size_t, CUstream))f)(g_pinned[0], at + SLICE / 2, SLICE / 2, s);
  case C_HTOD_ASYNC:
    memset(g_pinned[1], 0x5a, SLICE);
    return ((CUresult(*)(CUdeviceptr, const void *, size_t, CUstream))f)(at, g_pinned[1], SLICE, s);
  case C_DTOD_ASYNC: return ((CUresult(*)(CUdeviceptr, CUdeviceptr, size_t, CUstream))f)(at, at + SLICE / 2, SLICE / 2, s);
  case C_SET8: return ((CUresult(*)(CUdeviceptr, unsigned char, size_t))f)(at, 0x5a, SLICE);
  case C_SET16: return ((CUresult(*)(CUdeviceptr, unsigned short, size_t))f)(at, 0x5a5a, SLICE / 2);
  case C_SET32: return ((CUresult(*)(CUdeviceptr, unsigned int, size_t))f)(at, 0x5a5a5a5a, SLICE / 4);
  case C_SET8_ASYNC: return ((CUresult(*)(CUdeviceptr, unsigned char, size_t, CUstream))f)(at, 0x5a, SLICE, s);
  case C_SET16_ASYNC: return ((CUresult(*)(CUdeviceptr, unsigned short, size_t, CUstream))f)(at, 0x5a5a, SLICE / 2, s);
  case C_SET32_ASYNC:
    return ((CUresult(*)(CUdeviceptr, unsigned int, size_t, CUstream))f)(at, 0x5a5a5a5a, SLICE / 4, s);
  case C_SET2D8: return ((CUresult(*)(CUdeviceptr, size_t, unsigned char, size_t, size_t))f)(at, SLICE / 2, 0x5a, SLICE / 2, 2);
  case C_SET2D8_ASYNC:
    return ((CUresult(*)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream))f)(at, SLICE / 2, 0x5a, SLICE / 2,
                                                                                          2, s);
  case C_WRITE32: return ((CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned))f)(s, word, 0x5a, 0);
  case C_WRITE64: return ((CUresult(*)(CUstream, CUdeviceptr, cuuint64_t, unsigned))f)(s, word, 0x5a, 0);
  case C_WAIT32: return ((CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned))f)(s, one, 1, CU_STREAM_WAIT_VALUE_EQ);
  case C_WAIT64: return ((CUresult(*)(CUstream, CUdeviceptr, cuuint64_t, unsigned))f)(s, one, 1, CU_STREAM_WAIT_VALUE_GEQ);
  case C_MEMOP:
    memset(&op, 0, sizeof op);
    op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = word;
    op.writeValue.value = 0x5a;
    return ((CUresult(*)(CUstream, unsigned, CUstreamBatchMemOpParams *, unsigned))f)(s, 1, &op, 0);
  default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

/* Whether entry i's work is there once everything ran. */
static int work_done(size_t i) {
  switch (g_table[i].call) {
  case C_LAUNCH:
  case C_WAIT32:
  case C_WAIT64: return 1; /* nothing to see (a wait met at once) */
  case C_WRITE32:
  case C_WRITE64:
  case C_MEMOP: return g_words[i] == 0x5a;
  case C_DTOD:
  case C_DTOD_ASYNC: return g_buf[i * SLICE] == 0xee;
  case C_DTOH: return g_host[0][0] == 0xee && g_host[0][SLICE / 2 - 1] == 0xee;
  case C_DTOH_ASYNC: return g_pinned[0][0] == 0xee && g_pinned[0][SLICE / 2 - 1] == 0xee;
  default: return g_buf[i * SLICE] == 0x5a && g_buf[i * SLICE + SLICE - 1] == 0x5a;
  }
}

static void *caller(void *arg) {
  size_t i = (size_t)(uintptr_t)arg;
  cudaSetDevice(0);
  g_result[i] = call_entry(i);
  __atomic_store_n(&g_returned[i], 1, __ATOMIC_RELEASE);
  return NULL;
}

static vmmshim_sleep_result_t g_res;
static void *sleeper(void *arg) {
  (void)arg;
  cudaSetDevice(0);
  memset(&g_res, 0, sizeof g_res);
  int r = vmmshim_sleep("weights", VMMSHIM_SLEEP_DISCARD, &g_res, sizeof g_res);
  CHECK(r == 0, "sleep: %d (%s)", r, g_res.reason);
  return NULL;
}

/* Every gated symbol named in the shim's source (VS_GATED, VS_GATED_2D, VS_GATED_MORE) is in the
 * table, and the other way round. */
static void compare_with_source(void) {
  static char src[1 << 17];
  if (!check_read_file("src/hook/hook_gated.c", src, sizeof src)) {
    CHECK(0, "src/hook/hook_gated.c not found (run from the repository root)");
    return;
  }
  char *start = strstr(src, "#define VS_GATED(X)");
  char *end = start ? strstr(start, "/* The hooks themselves") : NULL;
  CHECK(start && end, "the gated lists not found in hook_gated.c");
  if (!start || !end) return;
  *end = 0;
  int named = 0, missing = 0;
  for (char *p = start; (p = strstr(p, "\"cu")) != NULL; p++) { /* X(ID, "base", ver, ptsz, sym or VS_BOTH(X, ID, "base", ver, sym */
    char base[96], sym[128];
    int ver, ptsz;
    int both = 0;
    for (char *q = p; q > start && q > p - 64; q--)
      if (!strncmp(q, "VS_BOTH(", 8)) { both = 1; break; }
    if (both ? sscanf(p, "\"%95[^\"]\", %d, %127[A-Za-z0-9_]", base, &ver, sym) != 3
             : sscanf(p, "\"%95[^\"]\", %d, %d, %127[A-Za-z0-9_]", base, &ver, &ptsz, sym) != 4)
      continue;
    for (int v = 0; v <= both; v++) {
      char name[160];
      snprintf(name, sizeof name, "%s%s", sym, v ? "_ptsz" : "");
      named++;
      size_t i;
      for (i = 0; i < N_ENTRIES; i++)
        if (!strcmp(g_table[i].sym, name)) break;
      if (i == N_ENTRIES) {
        missing++;
        CHECK(0, "%s is gated in hook_gated.c but not in this test's table", name);
      }
    }
  }
  CHECK(named == (int)N_ENTRIES, "hook_gated.c gates %d entry points, the table has %zu (%d not in the table)", named,
        N_ENTRIES, missing);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120); /* a call that never comes back from the gate fails the test, not the runner's timeout */
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(shim_active() == 1 && vmmshim_sleep, "the shim is active");
  if (!vmmshim_sleep) return check_summary();
  compare_with_source();
  CHECK(cuMemHostAlloc((void **)&g_pinned[0], SLICE, 0) == CUDA_SUCCESS &&
            cuMemHostAlloc((void **)&g_pinned[1], SLICE, 0) == CUDA_SUCCESS,
        "pinned host memory for the async copies");
  if (!g_pinned[0] || !g_pinned[1]) return check_summary();

  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(cuda != NULL, "libcuda.so.1 loaded");
  int callable = 0;
  for (size_t i = 0; i < N_ENTRIES; i++) {
    const entry_t *e = &g_table[i];
    void *d = dlsym(RTLD_DEFAULT, e->sym), *n = dlsym(RTLD_NEXT, e->sym), *c = cuda ? dlsym(cuda, e->sym) : NULL;
    CHECK(d && in_shim(d), "dlsym(RTLD_DEFAULT, %s) is not the shim's (%s)", e->sym, lib_of(d));
    g_fn[i] = d;
    if (e->call == C_NONE) { /* the driver has none: the shim hands out no hook for it */
      CHECK(!n && !c, "dlsym(RTLD_NEXT / libcuda.so.1, %s) found a function the emulation lacks", e->sym);
      continue;
    }
    CHECK(n == d, "dlsym(RTLD_NEXT, %s) differs from RTLD_DEFAULT's (%s)", e->sym, lib_of(n));
    CHECK(!cuda || c == d, "dlsym(libcuda.so.1, %s) is not the shim's (%s)", e->sym, lib_of(c));
    callable++;
    void *g = NULL;
    CUdriverProcAddressQueryResult st;
    int ver = e->ptsz && e->ver < 7000 ? 7000 : e->ver;
    CUresult r = cuGetProcAddress(e->base, &g, ver, e->ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
    CHECK(r == CUDA_SUCCESS && g == d, "cuGetProcAddress(%s, %d%s) is not %s (%s, %s)", e->base, ver,
          e->ptsz ? ", per-thread" : "", e->sym, cudaGetErrorName((cudaError_t)r), lib_of(g));
  }
  printf("%zu gated entry points; %d called during a move, the others have no emulation:", N_ENTRIES, callable);
  for (size_t i = 0; i < N_ENTRIES; i++)
    if (g_table[i].call == C_NONE) printf(" %s", g_table[i].sym);
  printf("\n");

  /* What the calls write, and the block the sleep moves. */
  CHECK(vmmshim_set_tag("weights") == 0, "tag");
  void *w = must_malloc(8 * MiB);
  vmmshim_set_tag(NULL);
  g_buf = must_malloc(N_ENTRIES * SLICE);
  g_words = must_malloc((N_ENTRIES + 1) * sizeof *g_words);
  if (!w || !g_buf || !g_words) return check_summary();
  memset(g_buf, 0, N_ENTRIES * SLICE);
  memset(g_words, 0, N_ENTRIES * sizeof *g_words);
  g_words[N_ENTRIES] = 1;
  for (size_t i = 0; i < N_ENTRIES; i++) memset(g_buf + i * SLICE + SLICE / 2, 0xee, SLICE / 2); /* the copies' source */

  emu_hold_next("cuMemUnmap");
  pthread_t sl, th[N_ENTRIES];
  pthread_create(&sl, NULL, sleeper, NULL);
  int held = emu_wait_held(30000);
  CHECK(held, "the sleep reached cuMemUnmap");
  for (size_t i = 0; i < N_ENTRIES; i++)
    if (g_table[i].call != C_NONE) pthread_create(&th[i], NULL, caller, (void *)(uintptr_t)i);
  sleep_ms(GATE_HOLD_MS);
  for (size_t i = 0; i < N_ENTRIES; i++)
    if (g_table[i].call != C_NONE)
      CHECK(!__atomic_load_n(&g_returned[i], __ATOMIC_ACQUIRE), "%s returned while the sleep held the gate", g_table[i].sym);
  emu_release_hold();
  pthread_join(sl, NULL);
  for (size_t i = 0; i < N_ENTRIES; i++)
    if (g_table[i].call != C_NONE) pthread_join(th[i], NULL);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
  for (size_t i = 0; i < N_ENTRIES; i++) {
    if (g_table[i].call == C_NONE) continue;
    CHECK(g_result[i] == CUDA_SUCCESS, "%s: %s", g_table[i].sym, cudaGetErrorName((cudaError_t)g_result[i]));
    CHECK(work_done(i), "%s did not do its work", g_table[i].sym);
  }
  /* The per-thread streams of the callers are the emulation's: they ran when synchronised. */
  memset(&g_res, 0, sizeof g_res);
  CHECK(vmmshim_wake("weights", 0, &g_res, sizeof g_res) == 0, "wake: %s", g_res.reason);
  cudaFree(w), cudaFree(g_buf), cudaFree(g_words);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
