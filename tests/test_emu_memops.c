/* test_emu_memops: the host emulation's stream memory operations and 16/32-bit memsets
 * (tests/emu/cuda_emu.c), on their own: the shim's tests of the one-stream order and the gate
 * prove nothing unless these behave as the driver does.
 *
 *   wait       a cuStreamWaitValue32 holds its stream: work queued behind it does not run, and a
 *              synchronisation of that stream blocks, until another stream's cuStreamWriteValue32
 *              (queued by another thread meanwhile) meets it; then both complete, in order.
 *   conditions EQ, GEQ (cyclic: 0xfffffff0 is before 0x10), AND, NOR, on 32 and 64 bits: a wait
 *              met at once completes at its synchronisation with nothing else run; one that is not
 *              met runs another stream's pending write that meets it, first.
 *   batch      cuStreamBatchMemOp: writes of 32 and 64 bits, a wait, a barrier, in order; an
 *              unknown operation, flags or a misaligned address are refused with nothing queued.
 *   refusals   misaligned addresses, unknown flags: CUDA_ERROR_INVALID_VALUE and a violation.
 *   memsets    cuMemsetD16/D32 (sync, Async) fill elements, the address aligned to them.
 *   pinned     cuMemHostAlloc memory: cuMemcpyDtoHAsync and cuMemcpyHtoDAsync move bytes in stream
 *              order through it; a pageable host range is refused (a violation), and so is a
 *              cuMemFreeHost of an address it did not give; a copy completing after its pinned
 *              memory was freed is a device fault.
 *   lookup     cuGetProcAddress gives the original forms at 8000/9000, _v2 at 11070, _ptsz with
 *              the per-thread flag; dlsym finds every exported name. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "emu.h"

#include "check.h"

static CUstream g_a, g_b;
static CUcontext g_ctx;
static volatile int g_synced;

static void *sync_a(void *arg) {
  (void)arg;
  cuCtxSetCurrent(g_ctx);
  CUresult r = cuStreamSynchronize(g_a);
  CHECK(r == CUDA_SUCCESS, "sync of the waiting stream: %d", (int)r);
  __atomic_store_n(&g_synced, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void test_wait(CUdeviceptr flag, unsigned char *buf) {
  *(volatile uint32_t *)(uintptr_t)flag = 0;
  memset(buf, 0, 4096);
  int v0 = emu_violations();
  CHECK(cuStreamWaitValue32(g_a, flag, 1, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS, "wait queued");
  CHECK(cuMemsetD8Async((CUdeviceptr)(uintptr_t)buf, 0x11, 4096, g_a) == CUDA_SUCCESS, "memset behind the wait");
  CHECK(cuStreamQuery(g_a) == CUDA_ERROR_NOT_READY, "the waiting stream is not done");
  pthread_t t;
  pthread_create(&t, NULL, sync_a, NULL);
  sleep_ms(200); /* the synchronisation has had time to run what it could */
  CHECK(!__atomic_load_n(&g_synced, __ATOMIC_ACQUIRE), "the synchronisation returned before the value came");
  CHECK(buf[0] == 0 && buf[4095] == 0, "work behind the wait ran before the value came");
  CHECK(cuStreamWriteValue32(g_b, flag, 1, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS, "write queued on b");
  pthread_join(t, NULL);
  CHECK(g_synced && buf[0] == 0x11 && buf[4095] == 0x11, "after the value: the memset ran (%02x)", buf[0]);
  CHECK(*(volatile uint32_t *)(uintptr_t)flag == 1, "the value written");
  CHECK(cuStreamQuery(g_b) == CUDA_SUCCESS, "the writing stream is done too");
  CHECK(emu_violations() == v0, "%d violations", emu_violations() - v0);
}

/* A wait on g_a whose condition what is at the flag now already meets: it completes at the
 * stream's synchronisation without anything else running (a wait not met would block 10 s and
 * count a hang). */
static int met_now(CUdeviceptr flag, int wide, uint64_t now, uint64_t v, unsigned fl) {
  if (wide) *(volatile uint64_t *)(uintptr_t)flag = now;
  else *(volatile uint32_t *)(uintptr_t)flag = (uint32_t)now;
  int v0 = emu_violations();
  CUresult r = wide ? cuStreamWaitValue64(g_a, flag, v, fl) : cuStreamWaitValue32(g_a, flag, (cuuint32_t)v, fl);
  return r == CUDA_SUCCESS && cuStreamSynchronize(g_a) == CUDA_SUCCESS && emu_violations() == v0;
}

static void test_conditions(CUdeviceptr flag) {
  int v0 = emu_violations();
  CHECK(met_now(flag, 0, 5, 5, CU_STREAM_WAIT_VALUE_EQ), "EQ met");
  CHECK(met_now(flag, 0, 7, 5, CU_STREAM_WAIT_VALUE_GEQ), "GEQ met");
  CHECK(met_now(flag, 0, 0x10, 0xfffffff0u, CU_STREAM_WAIT_VALUE_GEQ), "cyclic GEQ met: 0x10 is after 0xfffffff0");
  CHECK(met_now(flag, 0, 6, 2, CU_STREAM_WAIT_VALUE_AND), "AND met");
  CHECK(met_now(flag, 0, 0x0f, 0xf0, CU_STREAM_WAIT_VALUE_NOR), "NOR met");
  CHECK(met_now(flag, 1, 1ull << 40, 1ull << 40, CU_STREAM_WAIT_VALUE_EQ | CU_STREAM_WAIT_VALUE_FLUSH), "EQ 64 met");
  CHECK(met_now(flag, 1, 3ull << 40, 1ull << 40, CU_STREAM_WAIT_VALUE_GEQ), "GEQ 64 met");
  /* Not met now: b's pending write meets it, and runs first. */
  static const struct { uint64_t before, v, w; unsigned fl; int wide; } c[] = {
      {0xfffffff0u, 0x10, 0x10, CU_STREAM_WAIT_VALUE_GEQ, 0}, /* cyclic: 0xfffffff0 is before 0x10 */
      {4, 5, 5, CU_STREAM_WAIT_VALUE_EQ, 0},
      {1, 6, 2, CU_STREAM_WAIT_VALUE_AND, 0},
      {0xffffffffu, 0, 0x7fffffff, CU_STREAM_WAIT_VALUE_NOR, 0},
      {1ull << 33, 1ull << 34, 1ull << 34, CU_STREAM_WAIT_VALUE_EQ, 1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    if (c[i].wide) *(volatile uint64_t *)(uintptr_t)flag = c[i].before;
    else *(volatile uint32_t *)(uintptr_t)flag = (uint32_t)c[i].before;
    CUresult r = c[i].wide ? cuStreamWaitValue64(g_a, flag, c[i].v, c[i].fl)
                           : cuStreamWaitValue32(g_a, flag, (cuuint32_t)c[i].v, c[i].fl);
    CUresult w = c[i].wide ? cuStreamWriteValue64(g_b, flag, c[i].w, 0) : cuStreamWriteValue32(g_b, flag, (cuuint32_t)c[i].w, 0);
    CHECK(r == CUDA_SUCCESS && w == CUDA_SUCCESS, "case %zu queued", i);
    CHECK(cuStreamQuery(g_b) == CUDA_ERROR_NOT_READY, "case %zu: the write waits for its stream", i);
    CHECK(cuStreamSynchronize(g_a) == CUDA_SUCCESS && cuStreamQuery(g_b) == CUDA_SUCCESS,
          "case %zu: the wait ran b's write", i);
  }
  CHECK(emu_violations() == v0, "%d violations", emu_violations() - v0);
}

static void test_batch(CUdeviceptr flag, unsigned char *buf) {
  CUdeviceptr w32 = (CUdeviceptr)(uintptr_t)buf, w64 = w32 + 8;
  memset(buf, 0, 16);
  *(volatile uint32_t *)(uintptr_t)flag = 0;
  CUstreamBatchMemOpParams ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = w32;
  ops[0].writeValue.value = 0xabcd;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = w64;
  ops[1].writeValue.value64 = 0x123456789ull;
  ops[2].flushRemoteWrites.operation = CU_STREAM_MEM_OP_BARRIER;
  ops[3].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[3].waitValue.address = flag;
  ops[3].waitValue.value = 0;
  ops[3].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  int v0 = emu_violations();
  CHECK(cuStreamBatchMemOp(g_a, 4, ops, 0) == CUDA_SUCCESS, "batch queued");
  CHECK(*(volatile uint32_t *)buf == 0, "nothing written before the stream runs");
  CHECK(cuStreamSynchronize(g_a) == CUDA_SUCCESS, "batch ran");
  CHECK(*(volatile uint32_t *)buf == 0xabcd && *(volatile uint64_t *)(buf + 8) == 0x123456789ull, "batch wrote");
  CHECK(emu_violations() == v0, "%d violations", emu_violations() - v0);
  /* Refused, nothing queued: an unknown operation, flags, a misaligned address. */
  ops[1].writeValue.operation = (CUstreamBatchMemOpType)99;
  memset(buf, 0, 16);
  CHECK(cuStreamBatchMemOp(g_a, 2, ops, 0) == CUDA_ERROR_INVALID_VALUE, "unknown operation refused");
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  CHECK(cuStreamBatchMemOp(g_a, 2, ops, 1) == CUDA_ERROR_INVALID_VALUE, "flags refused");
  ops[1].writeValue.address = w64 + 4;
  CHECK(cuStreamBatchMemOp(g_a, 2, ops, 0) == CUDA_ERROR_INVALID_VALUE, "misaligned 64-bit write refused");
  CHECK(cuStreamSynchronize(g_a) == CUDA_SUCCESS && *(volatile uint32_t *)buf == 0, "a refused batch queued nothing");
  CHECK(emu_violations() == v0 + 3, "each refusal a violation (%d)", emu_violations() - v0);
}

static void test_refusals(CUdeviceptr flag) {
  int v0 = emu_violations();
  CHECK(cuStreamWaitValue32(g_a, flag + 2, 0, 0) == CUDA_ERROR_INVALID_VALUE, "misaligned wait");
  CHECK(cuStreamWriteValue64(g_a, flag + 4, 0, 0) == CUDA_ERROR_INVALID_VALUE, "misaligned 64-bit write");
  CHECK(cuStreamWaitValue32(g_a, flag, 0, 7) == CUDA_ERROR_INVALID_VALUE, "unknown wait flags");
  CHECK(cuStreamWriteValue32(g_a, flag, 0, 2) == CUDA_ERROR_INVALID_VALUE, "unknown write flags");
  CHECK(emu_violations() == v0 + 4, "each a violation (%d)", emu_violations() - v0);
}

static void test_memsets(unsigned char *buf) {
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)buf;
  memset(buf, 0, 64);
  CHECK(cuMemsetD16(p, 0xbeef, 4) == CUDA_SUCCESS, "D16");
  CHECK(((uint16_t *)buf)[0] == 0xbeef && ((uint16_t *)buf)[3] == 0xbeef && ((uint16_t *)buf)[4] == 0, "D16 filled 4");
  CHECK(cuMemsetD32Async(p + 16, 0xcafef00d, 3, g_a) == CUDA_SUCCESS, "D32 async");
  CHECK(((uint32_t *)buf)[4] == 0, "an async memset waits for its stream");
  CHECK(cuStreamSynchronize(g_a) == CUDA_SUCCESS && ((uint32_t *)buf)[4] == 0xcafef00d &&
            ((uint32_t *)buf)[6] == 0xcafef00d && ((uint32_t *)buf)[7] == 0,
        "D32 filled 3");
  CHECK(cuMemsetD16(p + 1, 0, 1) == CUDA_ERROR_INVALID_VALUE, "D16 misaligned");
  CHECK(cuMemsetD32(p + 2, 0, 1) == CUDA_ERROR_INVALID_VALUE, "D32 misaligned");
}

static void test_pinned(CUdeviceptr dev) {
  void *h = NULL;
  CHECK(cuMemHostAlloc(&h, 8192, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS && h && ((uintptr_t)h & 4095) == 0,
        "cuMemHostAlloc: page-aligned");
  if (!h) return;
  memset(h, 0x5a, 4096);
  CHECK(cuMemcpyHtoDAsync(dev, h, 4096, g_a) == CUDA_SUCCESS, "HtoD queued");
  memset((char *)h + 4096, 0, 4096);
  CHECK(cuMemcpyDtoHAsync((char *)h + 4096, dev, 4096, g_a) == CUDA_SUCCESS, "DtoH queued");
  CHECK(((unsigned char *)h)[4096] == 0, "an async copy waits for its stream");
  CHECK(cuStreamSynchronize(g_a) == CUDA_SUCCESS && memcmp(h, (char *)h + 4096, 4096) == 0, "round trip, in order");
  int v0 = emu_violations();
  static char pageable[64];
  CHECK(cuMemcpyDtoHAsync(pageable, dev, sizeof pageable, g_a) == CUDA_ERROR_INVALID_VALUE &&
            cuMemcpyHtoDAsync(dev, pageable, sizeof pageable, g_a) == CUDA_ERROR_INVALID_VALUE,
        "pageable host memory refused");
  CHECK(cuMemcpyDtoHAsync((char *)h + 4096, dev, 8192, g_a) == CUDA_ERROR_INVALID_VALUE, "a range past the end refused");
  CHECK(emu_violations() == v0 + 3, "each a violation (%d)", emu_violations() - v0);
  CHECK(cuMemFreeHost(pageable) == CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost of another address refused");
  long f0 = emu_device_faults();
  CHECK(cuMemcpyDtoHAsync(h, dev, 64, g_b) == CUDA_SUCCESS, "a copy queued (it runs at the synchronisation)");
  CHECK(cuMemFreeHost(h) == CUDA_SUCCESS, "cuMemFreeHost");
  cuStreamSynchronize(g_b);
  CHECK(emu_device_faults() == f0 + 1, "the copy into freed pinned memory faults");
}

static void test_lookup(void) {
  static const char *const names[] = {"cuStreamWaitValue32", "cuStreamWaitValue64", "cuStreamWriteValue32",
                                      "cuStreamWriteValue64", "cuStreamBatchMemOp"};
  static const int v1[] = {8000, 9000, 8000, 9000, 8000};
  for (int i = 0; i < 5; i++) {
    char n1[64], n2[64], n1p[64], n2p[64];
    snprintf(n1, sizeof n1, "%s", names[i]);
    snprintf(n2, sizeof n2, "%s_v2", names[i]);
    snprintf(n1p, sizeof n1p, "%s_ptsz", names[i]);
    snprintf(n2p, sizeof n2p, "%s_v2_ptsz", names[i]);
    void *s1 = dlsym(RTLD_DEFAULT, n1), *s2 = dlsym(RTLD_DEFAULT, n2), *s1p = dlsym(RTLD_DEFAULT, n1p),
         *s2p = dlsym(RTLD_DEFAULT, n2p);
    CHECK(s1 && s2 && s1p && s2p && s1 != s2 && s1p != s2p, "%s: the four exported forms", names[i]);
    void *g = NULL;
    CHECK(cuGetProcAddress(names[i], &g, v1[i], 0, NULL) == CUDA_SUCCESS && g == s1, "%s at %d: the original",
          names[i], v1[i]);
    CHECK(cuGetProcAddress(names[i], &g, 11070, 0, NULL) == CUDA_SUCCESS && g == s2, "%s at 11070: _v2", names[i]);
    CHECK(cuGetProcAddress(names[i], &g, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL) == CUDA_SUCCESS &&
              g == s2p,
          "%s per-thread: _v2_ptsz", names[i]);
    CHECK(cuGetProcAddress(names[i], &g, v1[i] - 1, 0, NULL) == CUDA_ERROR_NOT_FOUND, "%s before %d: none", names[i],
          v1[i]);
  }
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120);
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  CHECK(cuDevicePrimaryCtxRetain(&g_ctx, 0) == CUDA_SUCCESS && cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS, "context");
  CHECK(cuStreamCreate(&g_a, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream a");
  CHECK(cuStreamCreate(&g_b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream b");
  CUdeviceptr mem = 0;
  CHECK(cuMemAlloc(&mem, 8192) == CUDA_SUCCESS && mem, "memory");
  if (!mem) return check_summary();
  CUdeviceptr flag = mem;
  unsigned char *buf = (unsigned char *)(uintptr_t)(mem + 4096);
  test_wait(flag, buf);
  test_conditions(flag);
  test_batch(flag, buf);
  test_refusals(flag);
  test_memsets(buf);
  test_pinned(mem);
  test_lookup();
  CHECK(cuMemFree(mem) == CUDA_SUCCESS, "free");
  cuStreamDestroy(g_a);
  cuStreamDestroy(g_b);
  return check_summary();
}
