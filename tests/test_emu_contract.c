/* Tests of the host emulation of the CUDA driver and runtime (tests/emu): it must enforce
 * the driver's contract, or the shim's CPU tests prove nothing. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "emu.h"

#include "check.h"

/* expr must return err and count exactly one contract violation */
#define CHECK_VIOLATION(expr, err)                 \
  do {                                             \
    int v0_ = emu_violations();                    \
    CUresult r_ = (expr);                          \
    CHECK_COND(r_ == (err));                            \
    CHECK_COND(emu_violations() == v0_ + 1);            \
  } while (0)
/* expr must return err and count no violation */
#define CHECK_NO_VIOLATION(expr, err)              \
  do {                                             \
    int v0_ = emu_violations();                    \
    CUresult r_ = (expr);                          \
    CHECK_COND(r_ == (err));                            \
    CHECK_COND(emu_violations() == v0_);                \
  } while (0)

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static CUmemAllocationProp g_prop;
static size_t G;

/* 0: the access did not fault; SIGSEGV (or SIGBUS) number otherwise */
static int access_faults(CUdeviceptr p, int write) {
  pid_t pid = fork();
  if (pid == 0) {
    if (write)
      *(volatile char *)(uintptr_t)p = 1;
    else
      (void)*(volatile char *)(uintptr_t)p;
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) return WTERMSIG(st);
  return 0;
}

static void test_init(void) {
  CUcontext c = NULL;
  CHECK_COND(cuCtxGetCurrent(&c) == CUDA_ERROR_NOT_INITIALIZED);
  int v = 0;
  CHECK_COND(cuDriverGetVersion(&v) == CUDA_SUCCESS && v == 13000);
  CHECK_COND(cuInit(0) == CUDA_SUCCESS);
  int n = 0;
  CHECK_COND(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 1);
  CUdevice d = -1;
  CHECK_COND(cuDeviceGet(&d, 0) == CUDA_SUCCESS && d == 0);
  CHECK_COND(cuDeviceGet(&d, 1) == CUDA_ERROR_INVALID_DEVICE);
  int a = 0;
  CHECK_COND(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) == CUDA_SUCCESS && a == 1);
  CHECK_COND(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0) == CUDA_SUCCESS &&
        a == 1);
  size_t total = 0;
  CHECK_COND(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS && total == 4 * GiB);
  /* no context yet */
  CUdeviceptr p;
  CHECK_NO_VIOLATION(cuMemAlloc(&p, 100), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_COND(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS && c != NULL);
  CHECK_COND(cuCtxSetCurrent(c) == CUDA_SUCCESS);
  CUcontext c2 = NULL;
  CHECK_COND(cuCtxGetCurrent(&c2) == CUDA_SUCCESS && c2 == c);
  CHECK_COND(cuCtxGetDevice(&d) == CUDA_SUCCESS && d == 0);
  memset(&g_prop, 0, sizeof g_prop);
  g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  g_prop.location.id = 0;
  g_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  g_prop.allocFlags.gpuDirectRDMACapable = 1;
  CHECK_COND(cuMemGetAllocationGranularity(&G, &g_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && G == 2 * MiB);
  size_t g2 = 0;
  CHECK_COND(cuMemGetAllocationGranularity(&g2, &g_prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS &&
        g2 == 2 * MiB);
}

typedef CUresult (*gp2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gp1_t)(const char *, void **, int, cuuint64_t);

static void test_lookup(void) {
  emu_counters_t c0, c1;
  emu_get_counters(&c0);
  CUdriverProcAddressQueryResult st = -1;
  void *v2 = NULL, *v1 = NULL, *p = NULL, *q = NULL;
  CHECK_COND(cuGetProcAddress_v2("cuMemAlloc", &v2, 12000, 0, &st) == CUDA_SUCCESS && v2 && st == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK_COND(cuGetProcAddress_v2("cuMemAlloc", &v1, 3000, 0, &st) == CUDA_SUCCESS && v1 && v1 != v2);
  CHECK_COND(cuGetProcAddress_v2("cuMemAlloc", &p, 3020, 0, &st) == CUDA_SUCCESS && p == v2);
  /* the looked-up cuMemAlloc is the _v2 one: it works with 64-bit pointers */
  CUdeviceptr d = 0;
  CHECK_COND(((CUresult(*)(CUdeviceptr *, size_t))v2)(&d, 1000) == CUDA_SUCCESS && d != 0);
  CHECK_COND(cuMemFree(d) == CUDA_SUCCESS);

  static const char *const ptsz_syms[] = {"cuMemAllocAsync", "cuMemFreeAsync", "cuStreamBeginCapture",
                                          "cuStreamEndCapture", "cuStreamSynchronize", "cuStreamQuery",
                                          "cuEventRecord", "cuStreamIsCapturing", "cuStreamWaitEvent"};
  for (size_t i = 0; i < sizeof ptsz_syms / sizeof ptsz_syms[0]; i++) {
    p = q = NULL;
    CHECK_COND(cuGetProcAddress_v2(ptsz_syms[i], &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS && p);
    CHECK_COND(cuGetProcAddress_v2(ptsz_syms[i], &q, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) ==
              CUDA_SUCCESS &&
          q);
    CHECK_COND(p != q);
  }
  /* the _ptsz cuStreamBeginCapture of version 10010 is cuStreamBeginCapture_v2_ptsz */
  void *exp_sym = dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2_ptsz");
  CHECK_COND(cuGetProcAddress_v2("cuStreamBeginCapture", &q, 10010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) ==
            CUDA_SUCCESS &&
        q == exp_sym);
  void *b1 = NULL;
  CHECK_COND(cuGetProcAddress_v2("cuStreamBeginCapture", &b1, 10000, 0, &st) == CUDA_SUCCESS && b1 &&
        b1 == dlsym(RTLD_DEFAULT, "cuStreamBeginCapture"));
  /* unknown symbol, insufficient version */
  p = (void *)1;
  CHECK_COND(cuGetProcAddress_v2("cuNoSuchThing", &p, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND && p == NULL &&
        st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  p = (void *)1;
  CHECK_COND(cuGetProcAddress_v2("cuMemCreate", &p, 9000, 0, &st) == CUDA_ERROR_NOT_FOUND && p == NULL &&
        st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  /* cuGetProcAddress: v2 from 12000, v1 below */
  void *g2 = NULL, *g1 = NULL;
  CHECK_COND(cuGetProcAddress_v2("cuGetProcAddress", &g2, 12000, 0, &st) == CUDA_SUCCESS && g2 &&
        g2 == dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
  CHECK_COND(cuGetProcAddress_v2("cuGetProcAddress", &g1, 11030, 0, &st) == CUDA_SUCCESS && g1 &&
        g1 == dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
  CHECK_COND(((gp1_t)g1)("cuMemFree", &p, 3020, 0) == CUDA_SUCCESS && p == dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
  /* the _v2 variants by version */
  static const struct { const char *name; int ver; const char *sym; } vers[] = {
      {"cuMemFree", 3020, "cuMemFree_v2"},           {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
      {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2"}, {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
      {"cuCtxCreate", 3020, "cuCtxCreate_v2"},       {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
      {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"}, {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
      {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
      {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
      {"cuMemAllocAsync", 11020, "cuMemAllocAsync"}};
  for (size_t i = 0; i < sizeof vers / sizeof vers[0]; i++) {
    p = NULL;
    CHECK_COND(cuGetProcAddress_v2(vers[i].name, &p, vers[i].ver, 0, &st) == CUDA_SUCCESS && p == dlsym(RTLD_DEFAULT, vers[i].sym));
  }
  emu_get_counters(&c1);
  CHECK_COND(c1.lookups >= c0.lookups + 30);
  CHECK_COND(c1.lookups_not_found == c0.lookups_not_found + 2);
}

static void test_vmm(void) {
  emu_counters_t c;
  /* reservations */
  CUdeviceptr big = 0;
  CHECK_COND(cuMemAddressReserve(&big, 512 * GiB, GiB, 0, 0) == CUDA_SUCCESS && big && big % GiB == 0);
  CHECK_COND(cuMemAddressFree(big, 512 * GiB) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  CHECK_VIOLATION(cuMemAddressReserve(&va, 3 * MiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemAddressReserve(&va, 4 * MiB, 6 * MiB, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0) == CUDA_SUCCESS && va % G == 0);
  CHECK_VIOLATION(cuMemAddressFree(va, 32 * MiB), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemAddressFree(va + G, 62 * MiB), CUDA_ERROR_INVALID_VALUE);

  /* handles */
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CHECK_VIOLATION(cuMemCreate(&h, 3 * MiB, &g_prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemCreate(&h, 4 * MiB, &g_prop, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad = g_prop;
  bad.location.id = 3;
  CHECK_VIOLATION(cuMemCreate(&h, 4 * MiB, &bad, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemCreate(&h, 4 * MiB, &g_prop, 0) == CUDA_SUCCESS && h != 0);
  CHECK_COND(cuMemCreate(&h2, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS && h2 != 0 && h2 != h);
  CHECK_COND(emu_device_used(0) == 6 * MiB);

  /* map: misaligned, partial, outside, too big */
  CHECK_VIOLATION(cuMemMap(va + 4096, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemMap(va, 3 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemMap(va, 8 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemMap(va + 62 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* runs past the end */
  CHECK_VIOLATION(cuMemMap(va - 64 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* outside */
  CHECK_VIOLATION(cuMemMap(va, 4 * MiB, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemMap(va, 4 * MiB, 0, 0xdead, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemMap(va, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
  CHECK_VIOLATION(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* overlaps */
  CHECK_COND(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h2, 0) == CUDA_SUCCESS);

  /* no access before cuMemSetAccess */
  CHECK_COND(access_faults(va, 0) == SIGSEGV);
  CHECK_COND(access_faults(va + 4 * MiB + 100, 1) == SIGSEGV);
  unsigned flags = 99;
  unsigned long long types = 0;
  int rdma = -1;
  CHECK_COND(emu_handle_info(va + 100, &types, &rdma, &flags) == 0 && flags == 0 &&
        types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && rdma == 1);
  CHECK_COND(emu_handle_info(va + 6 * MiB, NULL, NULL, NULL) == -1);

  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_VIOLATION(cuMemSetAccess(va, 8 * MiB, &acc, 1), CUDA_ERROR_INVALID_VALUE); /* part unmapped */
  CHECK_VIOLATION(cuMemSetAccess(va + 4096, 2 * MiB, &acc, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemSetAccess(va, 6 * MiB, &acc, 1) == CUDA_SUCCESS); /* spans both mappings */
  CHECK_COND(access_faults(va, 1) == 0);
  CHECK_COND(emu_handle_info(va + 5 * MiB, NULL, NULL, &flags) == 0 && flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  unsigned long long f64 = 0;
  CHECK_COND(cuMemGetAccess(&f64, &acc.location, va + 10) == CUDA_SUCCESS && f64 == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (size_t i = 0; i < 4 * MiB; i += 4096) ((volatile uint32_t *)(uintptr_t)va)[i / 4] = (uint32_t)(i ^ 0x5a5a5a5a);

  /* read-only access: writes fault, reads do not */
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  CHECK_COND(cuMemSetAccess(va + 4 * MiB, 2 * MiB, &acc, 1) == CUDA_SUCCESS);
  CHECK_COND(access_faults(va + 4 * MiB, 1) == SIGSEGV);
  CHECK_COND(access_faults(va + 4 * MiB, 0) == 0);
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  /* address range of a VMM address: the mapping holding it */
  CUdeviceptr base = 0;
  size_t sz = 0;
  CHECK_COND(cuMemGetAddressRange(&base, &sz, va + 5 * MiB) == CUDA_SUCCESS && base == va + 4 * MiB && sz == 2 * MiB);
  CHECK_COND(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 123) == CUDA_SUCCESS && base == va);

  /* unmap must cover whole mappings */
  CHECK_VIOLATION(cuMemUnmap(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemUnmap(va + 2 * MiB, 4 * MiB), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemUnmap(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemAddressFree(va, 64 * MiB), CUDA_ERROR_INVALID_VALUE); /* live mappings */
  CHECK_COND(cuMemUnmap(va, 6 * MiB) == CUDA_SUCCESS); /* two adjacent mappings at once */
  CHECK_COND(access_faults(va, 0) == SIGSEGV);
  emu_get_counters(&c);
  CHECK_COND(c.live_mappings == 0 && c.live_handles == 2);

  /* the data persists in the handle: remap elsewhere, set access, read back */
  CHECK_COND(cuMemMap(va + 32 * MiB, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemSetAccess(va + 32 * MiB, 4 * MiB, &acc, 1) == CUDA_SUCCESS);
  int same = 1;
  for (size_t i = 0; i < 4 * MiB; i += 4096)
    if (((volatile uint32_t *)(uintptr_t)(va + 32 * MiB))[i / 4] != (uint32_t)(i ^ 0x5a5a5a5a)) same = 0;
  CHECK_COND(same);

  /* release while mapped: memory lives until the last unmap */
  CHECK_COND(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK_COND(((volatile uint32_t *)(uintptr_t)(va + 32 * MiB))[1024] == (uint32_t)(4096 ^ 0x5a5a5a5a));
  CHECK_VIOLATION(cuMemMap(va, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* released handle */
  CHECK_VIOLATION(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  /* retain by address (interior) revives a reference */
  CUmemGenericAllocationHandle hr = 0;
  CHECK_COND(cuMemRetainAllocationHandle(&hr, (void *)(uintptr_t)(va + 33 * MiB)) == CUDA_SUCCESS && hr == h);
  CHECK_COND(cuMemRetainAllocationHandle(&hr, (void *)(uintptr_t)(va + 40 * MiB)) == CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemRelease(hr) == CUDA_SUCCESS);
  emu_get_counters(&c);
  CHECK_COND(c.live_handles == 2 && c.live_mappings == 1);
  CHECK_COND(cuMemUnmap(va + 32 * MiB, 4 * MiB) == CUDA_SUCCESS);
  emu_get_counters(&c);
  CHECK_COND(c.live_handles == 1 && c.live_mappings == 0);
  CHECK_COND(emu_device_used(0) == 2 * MiB);
  CHECK_COND(cuMemRelease(h2) == CUDA_SUCCESS);
  CHECK_COND(cuMemAddressFree(va, 64 * MiB) == CUDA_SUCCESS);
  emu_get_counters(&c);
  CHECK_COND(c.live_handles == 0 && c.live_mappings == 0 && c.live_reservations == 0 && c.handle_bytes == 0);
  CHECK_COND(emu_device_used(0) == 0);

  /* capabilities: requesting what the device lacks is a violation */
  emu_set_caps(1, 0, 0);
  CHECK_VIOLATION(cuMemCreate(&h, 2 * MiB, &g_prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  CUmemAllocationProp plain_prop = g_prop;
  plain_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  plain_prop.allocFlags.gpuDirectRDMACapable = 0;
  CHECK_COND(cuMemCreate(&h, 2 * MiB, &plain_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemRelease(h) == CUDA_SUCCESS);
  int a = -1;
  CHECK_COND(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0) == CUDA_SUCCESS &&
        a == 0);
  emu_set_caps(1, 1, 1);
}

static void test_oom(void) {
  emu_set_device_memory(0, 16 * MiB);
  CUmemGenericAllocationHandle h1, h2;
  CHECK_COND(cuMemCreate(&h1, 12 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuMemCreate(&h2, 6 * MiB, &g_prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr p = 0, q = 0;
  CHECK_NO_VIOLATION(cuMemAlloc(&p, 5 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_COND(cuMemAlloc(&p, 3 * MiB) == CUDA_SUCCESS);
  size_t fr = 0, tot = 0;
  CHECK_COND(cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS && tot == 16 * MiB && fr == 1 * MiB);
  CHECK_NO_VIOLATION(cuMemAllocAsync(&q, 2 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_COND(cuMemRelease(h1) == CUDA_SUCCESS);
  CHECK_COND(cuMemCreate(&h2, 12 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemRelease(h2) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(p) == CUDA_SUCCESS);
  emu_set_device_memory(0, 4 * GiB);
  /* fault injection: not a violation, and only count calls */
  emu_fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 1);
  CHECK_NO_VIOLATION(cuMemCreate(&h1, 2 * MiB, &g_prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_COND(cuMemCreate(&h1, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemRelease(h1) == CUDA_SUCCESS);
  emu_fail_next("cuMemAlloc_v2", CUDA_ERROR_UNKNOWN, 2);
  CHECK_COND(cuMemAlloc(&p, 10) == CUDA_ERROR_UNKNOWN);
  CHECK_COND(cuMemAlloc(&p, 10) == CUDA_ERROR_UNKNOWN);
  CHECK_COND(cuMemAlloc(&p, 10) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(p) == CUDA_SUCCESS);
}

static void test_plain(void) {
  CUdeviceptr p = 0;
  CHECK_NO_VIOLATION(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemAlloc(&p, 1000) == CUDA_SUCCESS && p % 256 == 0);
  memset((void *)(uintptr_t)p, 7, 1000); /* plain memory is host-accessible */
  CUdeviceptr b = 0;
  size_t n = 0;
  CHECK_COND(cuMemGetAddressRange(&b, &n, p + 999) == CUDA_SUCCESS && b == p && n == 1000);
  CHECK_COND(cuMemGetAddressRange(&b, &n, p + 1000 + 1 * MiB) == CUDA_ERROR_NOT_FOUND);
  unsigned type = 0;
  int ord = -1;
  CUcontext ctx = NULL, cur = NULL;
  size_t rs = 0;
  cuCtxGetCurrent(&cur);
  CHECK_COND(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 5) == CUDA_SUCCESS &&
        type == CU_MEMORYTYPE_DEVICE);
  CHECK_COND(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS && ord == 0);
  CHECK_COND(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p) == CUDA_SUCCESS && ctx == cur);
  CHECK_COND(cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 10) == CUDA_SUCCESS && rs == 1000);
  CHECK_COND(cuPointerGetAttribute(&b, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 0x10) == CUDA_ERROR_INVALID_VALUE);
  CUpointer_attribute at[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  void *data[2] = {&type, &b};
  CHECK_COND(cuPointerGetAttributes(2, at, data, p + 3) == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE && b == p);
  /* frees the real driver rejects: no violation, its answer */
  CHECK_NO_VIOLATION(cuMemFree(p + 8), CUDA_ERROR_INVALID_VALUE);
  CHECK_NO_VIOLATION(cuMemFree(0x1234000), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemFree(0) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(p) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  emu_counters_t c;
  emu_get_counters(&c);
  CHECK_COND(c.live_plain == 0 && c.plain_bytes == 0);
}

static void k_write(void *arg) { *(volatile int *)arg = 42; }
static int g_order[8], g_norder;
static void k_order(void *arg) { g_order[g_norder++] = (int)(intptr_t)arg; }

static void test_streams(void) {
  CUstream s1, s2, nb;
  CHECK_COND(cuStreamCreate(&s1, 0) == CUDA_SUCCESS);
  CHECK_COND(cuStreamCreate(&s2, 0) == CUDA_SUCCESS);
  CHECK_COND(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent e;
  CHECK_COND(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  CHECK_COND(cuEventQuery(e) == CUDA_SUCCESS); /* never recorded */
  CUdeviceptr p;
  CHECK_COND(cuMemAlloc(&p, 256) == CUDA_SUCCESS);
  volatile int *x = (volatile int *)(uintptr_t)p;
  *x = 0;
  emu_launch(s1, k_write, (void *)x);
  CHECK_COND(emu_pending(s1) == 1);
  CHECK_COND(cuStreamQuery(s1) == CUDA_ERROR_NOT_READY);
  CHECK_COND(cuEventRecord(e, s1) == CUDA_SUCCESS);
  CHECK_COND(cuEventQuery(e) == CUDA_ERROR_NOT_READY);
  CHECK_COND(*x == 0);
  CHECK_COND(emu_complete(s1, 1) == 1);
  CHECK_COND(*x == 42);
  CHECK_COND(cuEventQuery(e) == CUDA_SUCCESS);
  CHECK_COND(cuStreamQuery(s1) == CUDA_SUCCESS);

  /* event records only work enqueued before it */
  emu_launch(s1, NULL, NULL);
  CHECK_COND(cuEventRecord(e, s1) == CUDA_SUCCESS);
  emu_launch(s1, NULL, NULL);
  CHECK_COND(emu_complete(s1, 1) == 1);
  CHECK_COND(cuEventQuery(e) == CUDA_SUCCESS);
  CHECK_COND(cuStreamQuery(s1) == CUDA_ERROR_NOT_READY);
  CHECK_COND(cuStreamSynchronize(s1) == CUDA_SUCCESS && emu_pending(s1) == 0);

  /* cuEventSynchronize forces the work */
  emu_launch(s2, NULL, NULL);
  CHECK_COND(cuEventRecord(e, s2) == CUDA_SUCCESS);
  CHECK_COND(cuEventSynchronize(e) == CUDA_SUCCESS && emu_pending(s2) == 0);

  /* stream-ordered free takes effect when the stream reaches it */
  CUdeviceptr q = 0;
  emu_counters_t c0, c1;
  emu_launch(s1, NULL, NULL);
  CHECK_COND(cuMemAllocAsync(&q, 4096, s1) == CUDA_SUCCESS && q);
  emu_get_counters(&c0);
  CHECK_COND(cuMemFreeAsync(q, s1) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuMemFreeAsync(q, s1), CUDA_ERROR_INVALID_VALUE); /* already being freed */
  emu_get_counters(&c1);
  CHECK_COND(c1.live_plain == c0.live_plain);
  CHECK_COND(emu_complete(s1, -1) == 1);
  emu_get_counters(&c1);
  CHECK_COND(c1.live_plain == c0.live_plain - 1);

  /* cuStreamWaitEvent: completing s2's later work forces s1's earlier work */
  g_norder = 0;
  emu_launch(s1, k_order, (void *)1);
  CHECK_COND(cuEventRecord(e, s1) == CUDA_SUCCESS);
  CHECK_COND(cuStreamWaitEvent(s2, e, 0) == CUDA_SUCCESS);
  emu_launch(s2, k_order, (void *)2);
  CHECK_COND(emu_complete(s2, 1) == 1);
  CHECK_COND(g_norder == 2 && g_order[0] == 1 && g_order[1] == 2);
  CHECK_COND(emu_pending(s1) == 0);

  /* legacy stream: implicit synchronisation with blocking streams, not with non-blocking ones */
  g_norder = 0;
  emu_launch(s1, k_order, (void *)1);
  emu_launch(nb, k_order, (void *)3);
  emu_launch(NULL, k_order, (void *)2);
  CHECK_COND(cuEventRecord(e, CU_STREAM_LEGACY) == CUDA_SUCCESS);
  CHECK_COND(cuEventQuery(e) == CUDA_ERROR_NOT_READY);
  CHECK_COND(emu_complete(NULL, -1) == 1);
  CHECK_COND(g_norder == 2 && g_order[0] == 1 && g_order[1] == 2);
  CHECK_COND(cuEventQuery(e) == CUDA_SUCCESS);
  CHECK_COND(emu_pending(nb) == 1);
  emu_launch(NULL, k_order, (void *)4);
  emu_launch(s2, k_order, (void *)5);
  CHECK_COND(emu_complete(s2, -1) == 1);
  CHECK_COND(g_norder == 4 && g_order[2] == 4 && g_order[3] == 5);

  /* cuCtxSynchronize completes everything */
  emu_launch(s1, NULL, NULL);
  emu_launch(CU_STREAM_PER_THREAD, NULL, NULL);
  CHECK_COND(emu_pending(CU_STREAM_PER_THREAD) == 1);
  CHECK_COND(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK_COND(emu_pending(s1) == 0 && emu_pending(nb) == 0 && emu_pending(CU_STREAM_PER_THREAD) == 0);

  /* _ptsz: the NULL stream is the per-thread stream */
  void *fa = NULL, *ff = NULL, *fs = NULL;
  CUdriverProcAddressQueryResult st;
  cuGetProcAddress_v2("cuMemAllocAsync", &fa, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  cuGetProcAddress_v2("cuMemFreeAsync", &ff, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  cuGetProcAddress_v2("cuStreamSynchronize", &fs, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  emu_launch(CU_STREAM_PER_THREAD, NULL, NULL);
  CHECK_COND(((CUresult(*)(CUdeviceptr *, size_t, CUstream))fa)(&q, 100, NULL) == CUDA_SUCCESS);
  CHECK_COND(((CUresult(*)(CUdeviceptr, CUstream))ff)(q, NULL) == CUDA_SUCCESS);
  emu_get_counters(&c0);
  CHECK_COND(emu_pending(CU_STREAM_PER_THREAD) == 1);
  CHECK_COND(((CUresult(*)(CUstream))fs)(NULL) == CUDA_SUCCESS); /* the per-thread stream */
  emu_get_counters(&c1);
  CHECK_COND(c1.live_plain == c0.live_plain - 1);
  CHECK_COND(emu_pending(CU_STREAM_PER_THREAD) == 0);
  /* synchronising the legacy stream waits for the (blocking) per-thread stream */
  emu_launch(CU_STREAM_PER_THREAD, NULL, NULL);
  CHECK_COND(cuStreamSynchronize(NULL) == CUDA_SUCCESS);
  CHECK_COND(emu_pending(CU_STREAM_PER_THREAD) == 0);

  /* stream destroy completes its work; invalid handles are violations */
  emu_launch(s2, k_write, (void *)x);
  *x = 0;
  CHECK_COND(cuStreamDestroy(s2) == CUDA_SUCCESS && *x == 42);
  CHECK_VIOLATION(cuStreamQuery(s2), CUDA_ERROR_INVALID_HANDLE);
  CHECK_COND(cuMemFree(p) == CUDA_SUCCESS);
  CHECK_COND(cuEventDestroy(e) == CUDA_SUCCESS);
  CHECK_COND(cuStreamDestroy(s1) == CUDA_SUCCESS);
  CHECK_COND(cuStreamDestroy(nb) == CUDA_SUCCESS);
}

static void test_capture(void) {
  CUstream s, o;
  CUgraph g = NULL;
  CHECK_COND(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  CHECK_COND(cuStreamCreate(&o, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK_VIOLATION(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK_VIOLATION(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);

  /* a clean capture */
  emu_counters_t c0, c1;
  emu_get_counters(&c0);
  CHECK_COND(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK_COND(cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUdeviceptr p = 0;
  CHECK_COND(cuMemAllocAsync(&p, 1 * MiB, s) == CUDA_SUCCESS && p);
  emu_launch(s, k_write, NULL); /* recorded, never run (it would crash) */
  CHECK_COND(emu_pending(s) == 0 && emu_captured(s) == 2);
  CHECK_COND(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CUevent e;
  CHECK_COND(cuEventCreate(&e, 0) == CUDA_SUCCESS);
  CHECK_COND(cuEventRecord(e, s) == CUDA_SUCCESS);
  CHECK_VIOLATION(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
  CHECK_COND(cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* unsafe calls in global mode */
  CUdeviceptr q = 0;
  CHECK_VIOLATION(cuMemAlloc(&q, 100), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK_COND(cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CHECK_COND(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL);

  /* relaxed mode allows them */
  CHECK_COND(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK_COND(cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS && m == CU_STREAM_CAPTURE_MODE_GLOBAL);
  CHECK_COND(cuMemAlloc(&q, 100) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(q) == CUDA_SUCCESS);
  CHECK_COND(cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS && m == CU_STREAM_CAPTURE_MODE_RELAXED);
  /* the legacy stream is unusable while a blocking stream captures */
  CHECK_COND(cuStreamIsCapturing(NULL, &cs) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CHECK_COND(cuStreamIsCapturing(o, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK_COND(cuMemAllocAsync(&p, 1 * MiB, s) == CUDA_SUCCESS);
  CHECK_COND(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK_COND(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g != NULL);
  CHECK_COND(cuGraphDestroy(g) == CUDA_SUCCESS);
  emu_get_counters(&c1);
  CHECK_COND(c1.live_plain == c0.live_plain + 1); /* the first capture's allocation (its graph never existed) */

  /* synchronising a capturing stream or the context is a violation */
  CHECK_COND(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK_VIOLATION(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK_COND(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK_COND(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK_VIOLATION(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK_VIOLATION(cuEventRecord(e, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CHECK_COND(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* _ptsz capture entry points on the per-thread stream */
  void *b = NULL, *en = NULL;
  CUdriverProcAddressQueryResult st;
  cuGetProcAddress_v2("cuStreamBeginCapture", &b, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  cuGetProcAddress_v2("cuStreamEndCapture", &en, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  CHECK_COND(((CUresult(*)(CUstream, CUstreamCaptureMode))b)(NULL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  CHECK_COND(cuStreamIsCapturing(CU_STREAM_PER_THREAD, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK_COND(((CUresult(*)(CUstream, CUgraph *))en)(NULL, &g) == CUDA_SUCCESS && g);
  CHECK_COND(cuGraphDestroy(g) == CUDA_SUCCESS);
  CHECK_COND(cuEventDestroy(e) == CUDA_SUCCESS);
  CHECK_COND(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK_COND(cuStreamDestroy(o) == CUDA_SUCCESS);
}

typedef int (*rt_malloc_t)(void **, size_t);
typedef int (*rt_free_t)(void *);
typedef int (*rt_err_t)(void);
typedef int (*rt_malloc_async_t)(void **, size_t, CUstream);
typedef int (*rt_free_async_t)(void *, CUstream);

static void test_runtime(void) {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
  CHECK_COND(n > 0);
  if (n <= 0) return;
  path[n] = 0;
  char *slash = strrchr(path, '/');
  strcpy(slash, "/../emu/libcudart.so.13");
  void *rt = dlopen(path, RTLD_NOW);
  CHECK_COND(rt != NULL);
  if (!rt) {
    fprintf(stderr, "%s\n", dlerror());
    return;
  }
  rt_malloc_t m = (rt_malloc_t)dlsym(rt, "cudaMalloc");
  rt_free_t f = (rt_free_t)dlsym(rt, "cudaFree");
  rt_err_t last = (rt_err_t)dlsym(rt, "cudaGetLastError");
  rt_err_t peek = (rt_err_t)dlsym(rt, "cudaPeekAtLastError");
  rt_malloc_async_t ma = (rt_malloc_async_t)dlsym(rt, "cudaMallocAsync_ptsz");
  rt_free_async_t fa = (rt_free_async_t)dlsym(rt, "cudaFreeAsync_ptsz");
  CHECK_COND(m && f && last && peek && ma && fa);
  if (!(m && f && last && peek && ma && fa)) return;
  emu_reset_counters();
  void *p = NULL;
  CHECK_COND(f(NULL) == 0); /* initialises */
  CHECK_COND(emu_lookup_count("cuInit") == 1 && emu_lookup_count("cuGetProcAddress") == 1);
  CHECK_COND(emu_lookup_count("cuMemAlloc") == 1 && emu_lookup_count("cuMemFree") == 1);
  CHECK_COND(emu_lookup_count("cuMemAllocAsync") == 2); /* legacy and per-thread variants */
  emu_counters_t c;
  emu_get_counters(&c);
  CHECK_COND(c.lookups > 20 && c.n_cuInit == 1);
  CHECK_COND(m(&p, 1000) == 0 && p != NULL);
  emu_get_counters(&c);
  CHECK_COND(c.n_cuMemAlloc == 1);
  CHECK_COND(f(p) == 0);
  emu_get_counters(&c);
  CHECK_COND(c.n_cuMemFree == 1 && c.n_cuCtxSynchronize == 1); /* cudaFree synchronises first */
  CHECK_COND(m(&p, 64 * GiB) == 2);                            /* cudaErrorMemoryAllocation */
  CHECK_COND(peek() == 2 && last() == 2 && last() == 0);
  CHECK_COND(f((void *)0x1234) == 1); /* cudaErrorInvalidValue */
  CHECK_COND(last() == 1);
  CHECK_COND(ma(&p, 4096, NULL) == 0 && p);
  CHECK_COND(fa(p, NULL) == 0);
  emu_get_counters(&c);
  CHECK_COND(c.n_cuMemAllocAsync == 1 && c.n_cuMemFreeAsync == 1);
  CHECK_COND(f(NULL) == 0);
  /* per-thread stream work completes at a device synchronisation */
  CHECK_COND(cuCtxSynchronize() == CUDA_SUCCESS);
}

static void *thread_main(void *arg) {
  CUcontext ctx = arg;
  cuCtxSetCurrent(ctx);
  CUdeviceptr va;
  if (cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0)) return (void *)1;
  for (int i = 0; i < 50; i++) {
    CUmemGenericAllocationHandle h;
    if (cuMemCreate(&h, 2 * MiB, &g_prop, 0)) return (void *)2;
    if (cuMemMap(va, 2 * MiB, 0, h, 0)) return (void *)3;
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (cuMemSetAccess(va, 2 * MiB, &acc, 1)) return (void *)4;
    *(volatile int *)(uintptr_t)va = i;
    if (cuMemUnmap(va, 2 * MiB) || cuMemRelease(h)) return (void *)5;
    CUdeviceptr p;
    if (cuMemAlloc(&p, 100) || cuMemFree(p)) return (void *)6;
  }
  return cuMemAddressFree(va, 16 * MiB) ? (void *)7 : NULL;
}

static void test_threads(void) {
  CUcontext ctx;
  cuCtxGetCurrent(&ctx);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_main, ctx);
  for (int i = 0; i < 4; i++) {
    void *r = (void *)1;
    pthread_join(t[i], &r);
    CHECK_COND(r == NULL);
  }
  emu_counters_t c;
  emu_get_counters(&c);
  CHECK_COND(c.live_handles == 0 && c.live_mappings == 0 && c.live_reservations == 0);
}

static void test_errors(void) {
  const char *s = NULL;
  CHECK_COND(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s) == CUDA_SUCCESS && strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
  CHECK_COND(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s) == CUDA_SUCCESS && s && *s);
  s = "x";
  CHECK_COND(cuGetErrorName((CUresult)12345, &s) == CUDA_ERROR_INVALID_VALUE && s == NULL);
  CHECK_COND(emu_calls("cuMemMap") > 0 && emu_calls("cuMemMap_v2") == emu_calls("cuMemMap") && emu_calls("nope") == -1);
}

int main(void) {
  test_init();
  test_lookup();
  test_vmm();
  test_oom();
  test_plain();
  test_streams();
  test_capture();
  test_runtime();
  test_threads();
  test_errors();
  return check_summary();
}
