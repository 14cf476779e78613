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
#include <sys/socket.h>
#include <sys/uio.h>
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

/* CPU access descriptors (HOST, HOST_NUMA node 0): granted on host-location memory only (on
 * device memory, as on the driver, a violation), read back by cuMemGetAccess; refused without a
 * violation when the emulated driver is told not to grant them. */
static void test_cpu_access(void) {
  CUmemAllocationProp hp;
  memset(&hp, 0, sizeof hp);
  hp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle hh = 0, hd = 0;
  CHECK_COND(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemCreate(&hh, 2 * MiB, &hp, 0) == CUDA_SUCCESS && cuMemCreate(&hd, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemMap(va, 2 * MiB, 0, hh, 0) == CUDA_SUCCESS && cuMemMap(va + 2 * MiB, 2 * MiB, 0, hd, 0) == CUDA_SUCCESS);
  CUmemAccessDesc two[2];
  memset(two, 0, sizeof two);
  two[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  two[0].flags = two[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  two[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  CUmemLocation numa = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, host = {CU_MEM_LOCATION_TYPE_HOST, 0};
  unsigned long long f = 99;
  CHECK_COND(cuMemSetAccess(va, 2 * MiB, two, 1) == CUDA_SUCCESS);
  CHECK_COND(cuMemGetAccess(&f, &numa, va) == CUDA_SUCCESS && f == 0); /* the device's only */
  CHECK_COND(cuMemSetAccess(va, 2 * MiB, two, 2) == CUDA_SUCCESS);
  CHECK_COND(cuMemGetAccess(&f, &numa, va) == CUDA_SUCCESS && f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_COND(cuMemGetAccess(&f, &host, va + 4096) == CUDA_SUCCESS && f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_VIOLATION(cuMemSetAccess(va + 2 * MiB, 2 * MiB, two, 2), CUDA_ERROR_INVALID_VALUE); /* device memory */
  CHECK_VIOLATION(cuMemSetAccess(va, 4 * MiB, two, 2), CUDA_ERROR_INVALID_VALUE);          /* spans onto it */
  two[1].location.id = 1;
  CHECK_VIOLATION(cuMemSetAccess(va, 2 * MiB, two, 2), CUDA_ERROR_INVALID_VALUE); /* no node 1 here */
  two[1].location.id = 0;
  emu_set_host_cpu_access(0);
  CHECK_NO_VIOLATION(cuMemSetAccess(va, 2 * MiB, two, 2), CUDA_ERROR_NOT_SUPPORTED);
  emu_set_host_cpu_access(1);
  CHECK_COND(cuMemUnmap(va, 4 * MiB) == CUDA_SUCCESS);
  CHECK_COND(cuMemRelease(hh) == CUDA_SUCCESS && cuMemRelease(hd) == CUDA_SUCCESS);
  CHECK_COND(cuMemAddressFree(va, 8 * MiB) == CUDA_SUCCESS);
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
  /* after some calls succeed; a failed unmap leaves the mapping as it was */
  CUdeviceptr va = 0;
  CHECK_COND(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemCreate(&h1, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  emu_fail_after("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE, 1);
  CHECK_COND(emu_faults_left("cuMemMap") == 1);
  CHECK_COND(cuMemMap(va, 2 * MiB, 0, h1, 0) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(emu_faults_left("cuMemMap") == 0 && emu_faults_left("cuNoSuchThing") == -1);
  emu_fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  CHECK_NO_VIOLATION(cuMemUnmap(va, 2 * MiB), CUDA_ERROR_UNKNOWN);
  emu_counters_t c;
  emu_get_counters(&c);
  CHECK(c.live_mappings == 1 && c.mapped_bytes == 2 * MiB, "the failed unmap left the mapping: %ld, %llu",
        c.live_mappings, c.mapped_bytes);
  CHECK_COND(cuMemUnmap(va, 2 * MiB) == CUDA_SUCCESS);
  CHECK_COND(cuMemRelease(h1) == CUDA_SUCCESS);
  CHECK_COND(cuMemAddressFree(va, 4 * MiB) == CUDA_SUCCESS);
  emu_fail_after("cuMemCreate", 3, CUDA_ERROR_OUT_OF_MEMORY, 0); /* count 0: nothing fails */
  CHECK_COND(emu_faults_left("cuMemCreate") == 0);
  CHECK_COND(cuMemCreate(&h1, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS && cuMemRelease(h1) == CUDA_SUCCESS);
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
typedef int (*rt_ipc_get_t)(CUipcMemHandle *, void *);
typedef int (*rt_ipc_open_t)(void **, CUipcMemHandle, unsigned);

/* The emulated shared runtime, build/emu/libcudart.so.13 next to this program's directory. */
static void *open_runtime(void) {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
  CHECK_COND(n > 0);
  if (n <= 0) return NULL;
  path[n] = 0;
  char *slash = strrchr(path, '/');
  strcpy(slash, "/../emu/libcudart.so.13");
  void *rt = dlopen(path, RTLD_NOW);
  CHECK_COND(rt != NULL);
  if (!rt) fprintf(stderr, "%s\n", dlerror());
  return rt;
}

static void test_runtime(void) {
  void *rt = open_runtime();
  if (!rt) return;
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

  /* legacy IPC through the runtime: cudaIpcMemHandle_t is the driver's 64 bytes */
  rt_ipc_get_t ig = (rt_ipc_get_t)dlsym(rt, "cudaIpcGetMemHandle");
  rt_ipc_open_t io = (rt_ipc_open_t)dlsym(rt, "cudaIpcOpenMemHandle");
  rt_free_t ic = (rt_free_t)dlsym(rt, "cudaIpcCloseMemHandle");
  CHECK_COND(ig && io && ic);
  if (!(ig && io && ic)) return;
  CUipcMemHandle h;
  void *o = NULL;
  CHECK_COND(m(&p, 4096) == 0);
  CHECK_COND(ig(&h, p) == 0 && memcmp(h.reserved, "EMUIPC", 6) == 0);
  CHECK_COND(io(&o, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == 201 && o == NULL); /* cudaErrorDeviceUninitialized */
  CHECK_COND(last() == 201);
  CHECK_COND(ic(p) == 1); /* nothing opened: cudaErrorInvalidValue */
  CHECK_COND(ig(&h, (char *)p + 64) == 1);
  int v0 = emu_violations();
  CHECK_COND(ig(NULL, p) == 1 && emu_violations() == v0 + 1);
  CHECK_COND(f(p) == 0);
  emu_get_counters(&c);
  CHECK_COND(c.n_cuIpcGetMemHandle == 3 && c.n_cuIpcOpenMemHandle == 1 && c.n_cuIpcCloseMemHandle == 1);
  CHECK_COND(emu_lookup_count("cuIpcOpenMemHandle") == 1);
  last();
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

/* ---- legacy IPC (one device, this process) ---- */

/* A child process makes a cuMemAlloc allocation and writes its IPC handle to fd, then waits
 * until `wait_fd` reaches end of file (-1: exits at once); it closes `close_fd` (the other end
 * of wait_fd's pipe) first. */
static pid_t ipc_child(int fd, int wait_fd, int close_fd) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    if (close_fd >= 0) close(close_fd);
    CUdeviceptr p = 0;
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    if (cuMemAlloc(&p, 12345) != CUDA_SUCCESS || cuIpcGetMemHandle(&h, p) != CUDA_SUCCESS) _exit(1);
    if (write(fd, &h, sizeof h) != (ssize_t)sizeof h) _exit(2);
    char c;
    if (wait_fd >= 0)
      while (read(wait_fd, &c, 1) > 0) {
      }
    _exit(0);
  }
  return pid;
}

static int read_handle(int fd, CUipcMemHandle *h) {
  size_t got = 0;
  while (got < sizeof *h) {
    ssize_t n = read(fd, (char *)h + got, sizeof *h - got);
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

static void test_ipc(void) {
  CUdeviceptr p = 0, q = 0, o = 0;
  CHECK_COND(cuMemAlloc(&p, 5000) == CUDA_SUCCESS);
  CUipcMemHandle h, h2;
  memset(&h, 0xab, sizeof h);
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
  uint64_t pid = 0, base = 0, size = 0;
  memcpy(&pid, h.reserved + 8, 8);
  memcpy(&base, h.reserved + 16, 8);
  memcpy(&size, h.reserved + 24, 8);
  int pad = 1;
  for (int i = 32; i < CU_IPC_HANDLE_SIZE; i++)
    if (h.reserved[i]) pad = 0;
  CHECK_COND(memcmp(h.reserved, "EMUIPC\0", 8) == 0 && pid == (uint64_t)getpid() && base == p && size == 5000 && pad);
  CHECK_VIOLATION(cuIpcGetMemHandle(NULL, p), CUDA_ERROR_INVALID_VALUE);
  /* not the base of a cuMemAlloc allocation: the driver's answer, not a violation */
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, p + 256), CUDA_ERROR_INVALID_VALUE);
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, 0x1000), CUDA_ERROR_INVALID_VALUE);
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, 0), CUDA_ERROR_INVALID_VALUE);
  /* memory-pool allocations are not legacy IPC capable */
  CHECK_COND(cuMemAllocAsync(&q, 4096, NULL) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, q), CUDA_ERROR_INVALID_VALUE);
  unsigned capable = 7;
  CHECK_COND(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p + 1) == CUDA_SUCCESS &&
             capable == 1);
  CHECK_COND(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q) == CUDA_SUCCESS &&
             capable == 0);
  CUmemoryPool mp = NULL, pool0 = NULL;
  CHECK_COND(cuDeviceGetDefaultMemPool(&pool0, 0) == CUDA_SUCCESS && pool0);
  CHECK_COND(cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, q) == CUDA_SUCCESS && mp == pool0);
  CHECK_COND(cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS && mp == NULL);
  CHECK_COND(cuMemFreeAsync(q, NULL) == CUDA_SUCCESS && cuStreamSynchronize(NULL) == CUDA_SUCCESS);
  /* VMM memory: refused like the real driver (measured on an H100), not a violation */
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle vh = 0;
  CHECK_COND(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemCreate(&vh, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemMap(va, 2 * MiB, 0, vh, 0) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, va), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(cuMemUnmap(va, 2 * MiB) == CUDA_SUCCESS && cuMemRelease(vh) == CUDA_SUCCESS &&
             cuMemAddressFree(va, 2 * MiB) == CUDA_SUCCESS);

  /* opening: this very process's handle */
  long long opens = emu_calls("cuIpcOpenMemHandle");
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, h, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_VIOLATION(cuIpcOpenMemHandle(&o, h, 2), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuIpcOpenMemHandle(NULL, h, 0), CUDA_ERROR_INVALID_VALUE);
  /* the unversioned export and the proc table: _v2 from 11000 */
  typedef CUresult (*open_t)(CUdeviceptr *, CUipcMemHandle, unsigned);
  open_t v1 = (open_t)dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle");
  void *v2 = dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle_v2"), *f = NULL;
  CHECK_COND(v1 && v2 && (void *)v1 != v2);
  if (v1) CHECK_NO_VIOLATION(v1(&o, h, 0), CUDA_ERROR_INVALID_CONTEXT);
  CUdriverProcAddressQueryResult st;
  CHECK_COND(cuGetProcAddress_v2("cuIpcOpenMemHandle", &f, 11000, 0, &st) == CUDA_SUCCESS && f == v2);
  CHECK_COND(cuGetProcAddress_v2("cuIpcOpenMemHandle", &f, 4010, 0, &st) == CUDA_SUCCESS && f == (void *)v1);
  CHECK_COND(cuGetProcAddress_v2("cuIpcOpenMemHandle", &f, 4000, 0, &st) == CUDA_ERROR_NOT_FOUND &&
             st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_COND(emu_calls("cuIpcOpenMemHandle") == opens + 5 && emu_calls("cuIpcOpenMemHandle_v2") == opens + 5);
  /* bytes that are no emulation handle */
  CUipcMemHandle junk;
  memset(&junk, 0x5a, sizeof junk);
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, junk, 0), CUDA_ERROR_INVALID_VALUE);
  memset(&junk, 0, sizeof junk);
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, junk, 0), CUDA_ERROR_INVALID_VALUE);
  junk = h;
  junk.reserved[40] = 1; /* padding must be zero */
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, junk, 0), CUDA_ERROR_INVALID_VALUE);

  /* a process that no longer exists */
  int fds[2];
  CHECK_COND(pipe(fds) == 0);
  pid_t child = ipc_child(fds[1], -1, -1);
  CHECK_COND(child > 0 && read_handle(fds[0], &h2) == 0);
  int wst = 0;
  CHECK_COND(waitpid(child, &wst, 0) == child && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  memcpy(&pid, h2.reserved + 8, 8);
  CHECK_COND(pid == (uint64_t)child);
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, h2, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_MAP_FAILED);
  close(fds[0]);
  close(fds[1]);

  /* a live process: the emulation shares no plain memory between processes */
  int rel[2];
  CHECK_COND(pipe(fds) == 0 && pipe(rel) == 0);
  child = ipc_child(fds[1], rel[0], rel[1]);
  CHECK_COND(child > 0 && read_handle(fds[0], &h2) == 0);
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, h2, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_NOT_SUPPORTED);
  close(rel[1]);
  CHECK_COND(waitpid(child, &wst, 0) == child && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  close(rel[0]);
  close(fds[0]);
  close(fds[1]);

  /* closing: nothing was opened */
  CHECK_NO_VIOLATION(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
  CHECK_NO_VIOLATION(cuIpcCloseMemHandle(0), CUDA_ERROR_INVALID_VALUE);

  /* without a current context: the driver's answer, not a violation */
  CUcontext cur = NULL;
  cuCtxGetCurrent(&cur);
  CHECK_COND(cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, p), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_NO_VIOLATION(cuIpcOpenMemHandle(&o, h, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_NO_VIOLATION(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_COND(cuCtxSetCurrent(cur) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(p) == CUDA_SUCCESS);
  /* a freed allocation has no handle any more */
  CHECK_NO_VIOLATION(cuIpcGetMemHandle(&h2, p), CUDA_ERROR_INVALID_VALUE);
}

/* The new entry points in the proc table, at their versions and not below. */
static void test_lookup_new(void) {
  static const struct { const char *name; int ver; } syms[] = {
      {"cuDeviceCanAccessPeer", 4000},      {"cuCtxEnablePeerAccess", 4000}, {"cuCtxDisablePeerAccess", 4000},
      {"cuDeviceGetDefaultMemPool", 11020}, {"cuDeviceGetMemPool", 11020},   {"cuMemPoolSetAccess", 11020},
      {"cuMemPoolGetAccess", 11020},        {"cuIpcGetMemHandle", 4010},     {"cuIpcCloseMemHandle", 4010},
      {"cuMemPoolGetAttribute", 11020},     {"cuMemPoolSetAttribute", 11020}, {"cuMemPoolTrimTo", 11020}};
  CUdriverProcAddressQueryResult st;
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = NULL;
    CHECK(cuGetProcAddress_v2(syms[i].name, &p, syms[i].ver, 0, &st) == CUDA_SUCCESS && p &&
              p == dlsym(RTLD_DEFAULT, syms[i].name),
          "%s", syms[i].name);
    CHECK(cuGetProcAddress_v2(syms[i].name, &p, syms[i].ver - 10, 0, &st) == CUDA_ERROR_NOT_FOUND,
          "%s below %d", syms[i].name, syms[i].ver);
  }
  const char *s = NULL;
  CHECK_COND(cuGetErrorName(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, &s) == CUDA_SUCCESS &&
             strcmp(s, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED") == 0);
  CHECK_COND(cuGetErrorName(CUDA_ERROR_MAP_FAILED, &s) == CUDA_SUCCESS && strcmp(s, "CUDA_ERROR_MAP_FAILED") == 0);
}

/* ---- the default pool keeps freed memory: attributes, release threshold, trim ---- */

static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0xdeadull;
  CHECK(cuMemPoolGetAttribute(pool, a, &v) == CUDA_SUCCESS, "cuMemPoolGetAttribute(%d)", (int)a);
  return v;
}
#define RESERVED(p) pool_attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
#define USED(p) pool_attr(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)

typedef int (*rt_pool_attr_t)(CUmemoryPool, int, void *);
typedef int (*rt_pool_trim_t)(CUmemoryPool, size_t);
typedef int (*rt_pool_get_t)(CUmemoryPool *, int);

static void test_pool_attributes(void) {
  CUmemoryPool pool = NULL;
  CHECK_COND(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS && pool);
  CHECK_COND(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 0 && USED(pool) == 0);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0); /* the driver's default */
  for (int a = CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES; a <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES; a++) {
    int on = -1;
    CHECK(cuMemPoolGetAttribute(pool, (CUmemPool_attribute)a, &on) == CUDA_SUCCESS && on == 1, "reuse flag %d: %d", a, on);
  }
  cuuint64_t zero = 0, one = 1;
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero), CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 0 && pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 0);

  CUstream s;
  CHECK_COND(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  size_t dev0 = emu_device_used(0);
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK_COND(cuMemAllocAsync(&a, 1 * MiB, s) == CUDA_SUCCESS && cuMemAllocAsync(&b, 3 * MiB, s) == CUDA_SUCCESS);
  CHECK_COND(USED(pool) == 4 * MiB && RESERVED(pool) == 4 * MiB && emu_device_used(0) == dev0 + 4 * MiB);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 4 * MiB);
  /* a stream-ordered free counts at once in the use, in the reserve until its stream reaches it */
  CHECK_COND(cuMemFreeAsync(b, s) == CUDA_SUCCESS);
  CHECK_COND(USED(pool) == 1 * MiB && RESERVED(pool) == 4 * MiB);
  CHECK_NO_VIOLATION(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 4 * MiB); /* not reached yet: outstanding */
  emu_complete(s, -1);
  CHECK_COND(RESERVED(pool) == 4 * MiB && emu_device_used(0) == dev0 + 4 * MiB); /* kept by the pool */
  emu_counters_t ec;
  emu_get_counters(&ec);
  CHECK_COND(ec.pool_idle_bytes == 3 * MiB);
  /* the next allocation takes the kept memory */
  CHECK_COND(cuMemAllocAsync(&c, 2 * MiB, s) == CUDA_SUCCESS);
  CHECK_COND(USED(pool) == 3 * MiB && RESERVED(pool) == 4 * MiB && emu_device_used(0) == dev0 + 4 * MiB);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 4 * MiB);
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 3 * MiB); /* reset to the current value */
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 4 * MiB);
  /* trims keep at least what they are asked to, and never what is in use */
  CHECK_NO_VIOLATION(cuMemPoolTrimTo(pool, 3 * MiB + MiB / 2), CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 3 * MiB + MiB / 2);
  CHECK_NO_VIOLATION(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 3 * MiB && emu_device_used(0) == dev0 + 3 * MiB);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 4 * MiB);
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero), CUDA_SUCCESS);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 3 * MiB);

  /* the release threshold: what the pool keeps through a synchronisation */
  cuuint64_t keep_all = UINT64_MAX, some = 3 * MiB / 2;
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all), CUDA_SUCCESS);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == UINT64_MAX);
  CHECK_COND(cuMemFreeAsync(c, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 3 * MiB && USED(pool) == 1 * MiB);
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &some), CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 3 * MiB); /* applied at the next synchronisation, not before */
  CHECK_COND(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == some);
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero), CUDA_SUCCESS);
  CHECK_COND(cuCtxSynchronize() == CUDA_SUCCESS && RESERVED(pool) == 1 * MiB);
  /* a synchronous free of pool memory: kept until a synchronisation (an event's here) */
  CHECK_COND(cuMemFree(a) == CUDA_SUCCESS);
  CHECK_COND(USED(pool) == 0 && RESERVED(pool) == 1 * MiB);
  CUevent ev;
  CHECK_COND(cuEventCreate(&ev, 0) == CUDA_SUCCESS && cuEventRecord(ev, s) == CUDA_SUCCESS);
  CHECK_COND(cuEventSynchronize(ev) == CUDA_SUCCESS && cuEventDestroy(ev) == CUDA_SUCCESS);
  CHECK_COND(RESERVED(pool) == 0 && emu_device_used(0) == dev0);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 3 * MiB);

  /* graph allocations are not the pool's */
  CUgraph g = NULL;
  CUdeviceptr ga = 0;
  CHECK_COND(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK_COND(cuMemAllocAsync(&ga, 8 * MiB, s) == CUDA_SUCCESS);
  CHECK_COND(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  CHECK_COND(USED(pool) == 0 && RESERVED(pool) == 0);
  CHECK_COND(cuGraphDestroy(g) == CUDA_SUCCESS && cuMemFree(ga) == CUDA_SUCCESS);

  /* the reuse flags are kept */
  int off = 0, on = 1, got = -1;
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off), CUDA_SUCCESS);
  CHECK_COND(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &got) == CUDA_SUCCESS && got == 0);
  CHECK_NO_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on), CUDA_SUCCESS);

  /* what the driver rejects */
  CUmemoryPool unknown = (CUmemoryPool)(uintptr_t)&off;
  cuuint64_t v = 0;
  CHECK_VIOLATION(cuMemPoolGetAttribute(unknown, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolGetAttribute(pool, (CUmemPool_attribute)99, &v), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &one), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolTrimTo(unknown, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_COND(pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);

  /* the same through the runtime */
  void *rt = open_runtime();
  rt_malloc_async_t ma = rt ? (rt_malloc_async_t)dlsym(rt, "cudaMallocAsync") : NULL;
  rt_free_async_t fa = rt ? (rt_free_async_t)dlsym(rt, "cudaFreeAsync") : NULL;
  rt_pool_attr_t rget = rt ? (rt_pool_attr_t)dlsym(rt, "cudaMemPoolGetAttribute") : NULL;
  rt_pool_attr_t rset = rt ? (rt_pool_attr_t)dlsym(rt, "cudaMemPoolSetAttribute") : NULL;
  rt_pool_trim_t rtrim = rt ? (rt_pool_trim_t)dlsym(rt, "cudaMemPoolTrimTo") : NULL;
  rt_pool_get_t rcur = rt ? (rt_pool_get_t)dlsym(rt, "cudaDeviceGetMemPool") : NULL;
  CHECK_COND(ma && fa && rget && rset && rtrim && rcur);
  if (ma && fa && rget && rset && rtrim && rcur) {
    CUmemoryPool cur = NULL;
    void *p = NULL;
    CHECK_COND(rcur(&cur, 0) == 0 && cur == pool);
    CHECK_COND(ma(&p, 5 * MiB, s) == 0);
    CHECK_COND(rget(pool, 7 /* cudaMemPoolAttrUsedMemCurrent */, &v) == 0 && v == 5 * MiB);
    CHECK_COND(rset(pool, 8 /* cudaMemPoolAttrUsedMemHigh */, &zero) == 0);
    CHECK_COND(rset(pool, 8, &one) == 1); /* cudaErrorInvalidValue */
    CHECK_COND(fa(p, s) == 0 && cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK_COND(rget(pool, 5 /* cudaMemPoolAttrReservedMemCurrent */, &v) == 0 && v == 0);
    CHECK_COND(rtrim(pool, 0) == 0);
  }
  CHECK_COND(cuStreamDestroy(s) == CUDA_SUCCESS);
}

/* ---- a VMM handle exported as a file descriptor, imported in another process ---- */

static void test_import(void) {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  int fd = -1, sv[2] = {-1, -1};
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK_COND(cuMemCreate(&h, 4 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemMap(va, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemSetAccess(va, 4 * MiB, &acc, 1) == CUDA_SUCCESS);
  pat_fill_sparse((void *)(uintptr_t)va, 2 * MiB, 11);
  memset((void *)(uintptr_t)(va + 2 * MiB), 0, 2 * MiB);
  CHECK_COND(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS &&
             fd >= 0);
  /* the descriptor travels over a Unix socket (SCM_RIGHTS) to a new process: this program run
   * again as scenario "import", which inherits the socket's other end */
  CHECK_COND(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  char byte = 'f';
  struct iovec iov = {&byte, 1};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = u.buf;
  msg.msg_controllen = sizeof u.buf;
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  CHECK_COND(sendmsg(sv[0], &msg, 0) == 1);
  close(fd); /* the message in flight holds the file */
  static char env[64];
  snprintf(env, sizeof env, "EMU_IMPORT_SOCK=%d", sv[1]);
  CHECK_COND(check_run_child("import", env, (char *)NULL) == 0);
  close(sv[0]);
  close(sv[1]);
  /* the child's writes through its own mapping are here */
  CHECK_COND(pat_check_sparse((void *)(uintptr_t)(va + 2 * MiB), 2 * MiB, 12) == (size_t)-1);
  CHECK_COND(cuMemUnmap(va, 4 * MiB) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS &&
             cuMemAddressFree(va, 4 * MiB) == CUDA_SUCCESS);
}

static void set_prop(int dev) {
  memset(&g_prop, 0, sizeof g_prop);
  g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  g_prop.location.id = dev;
  g_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Scenario "import": a fresh process with its own emulation. */
static void scenario_import(void) {
  const char *e = getenv("EMU_IMPORT_SOCK");
  CHECK_COND(e != NULL);
  if (!e) return;
  int sock = atoi(e);
  char byte = 0;
  struct iovec iov = {&byte, 1};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = u.buf;
  msg.msg_controllen = sizeof u.buf;
  CHECK_COND(recvmsg(sock, &msg, 0) == 1 && byte == 'f');
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  CHECK_COND(cm && cm->cmsg_type == SCM_RIGHTS);
  if (!cm) return;
  int fd = -1;
  memcpy(&fd, CMSG_DATA(cm), sizeof fd);
  CUcontext c = NULL;
  CHECK_COND(cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS &&
             cuCtxSetCurrent(c) == CUDA_SUCCESS);
  set_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CHECK_COND(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
             CUDA_SUCCESS);
  close(fd);
  CUmemAllocationProp prop;
  CHECK_COND(cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS && prop.location.id == 0);
  CUdeviceptr va = 0;
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK_COND(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemMap(va + 2 * MiB, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemSetAccess(va + 2 * MiB, 4 * MiB, &acc, 1) == CUDA_SUCCESS);
  CHECK_COND(emu_device_access(0, va + 2 * MiB, 4 * MiB, 1) == 0);
  CHECK_COND(pat_check_sparse((void *)(uintptr_t)(va + 2 * MiB), 2 * MiB, 11) == (size_t)-1);
  pat_fill_sparse((void *)(uintptr_t)(va + 4 * MiB), 2 * MiB, 12);
  CHECK_COND(cuMemUnmap(va + 2 * MiB, 4 * MiB) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS &&
             cuMemAddressFree(va, 8 * MiB) == CUDA_SUCCESS);
  CHECK_COND(emu_violations() == 0);
}

/* ---- several devices: scenario "mgpu", a fresh process set up with 3 devices ---- */

/* expr (an emu_device_access) must allow the access: 0, nothing counted */
#define CHECK_ACCESS_OK(expr)                                                  \
  do {                                                                         \
    int v0_ = emu_violations();                                                \
    long f0_ = emu_device_faults();                                            \
    CHECK_COND((expr) == 0);                                                   \
    CHECK_COND(emu_violations() == v0_ && emu_device_faults() == f0_);         \
  } while (0)
/* expr must refuse it: -1, one violation, one device fault */
#define CHECK_ACCESS_FAULT(expr)                                               \
  do {                                                                         \
    int v0_ = emu_violations();                                                \
    long f0_ = emu_device_faults();                                            \
    CHECK_COND((expr) == -1);                                                  \
    CHECK_COND(emu_violations() == v0_ + 1 && emu_device_faults() == f0_ + 1); \
  } while (0)

static void mgpu_peer(CUcontext c0, CUcontext c1) {
  int can = -1;
  CHECK_NO_VIOLATION(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
  CHECK_COND(can == 1);
  CHECK_COND(cuDeviceCanAccessPeer(&can, 1, 0) == CUDA_SUCCESS && can == 1);
  CHECK_COND(cuDeviceCanAccessPeer(&can, 2, 1) == CUDA_SUCCESS && can == 1);
  CHECK_COND(cuDeviceCanAccessPeer(&can, 1, 1) == CUDA_SUCCESS && can == 0);
  CHECK_VIOLATION(cuDeviceCanAccessPeer(&can, 0, 3), CUDA_ERROR_INVALID_DEVICE);
  CHECK_VIOLATION(cuDeviceCanAccessPeer(&can, -1, 0), CUDA_ERROR_INVALID_DEVICE);
  CHECK_VIOLATION(cuDeviceCanAccessPeer(NULL, 0, 1), CUDA_ERROR_INVALID_VALUE);
  emu_set_peer_capable(1, 0, 0); /* one direction only */
  CHECK_COND(cuDeviceCanAccessPeer(&can, 1, 0) == CUDA_SUCCESS && can == 0);
  CHECK_COND(cuDeviceCanAccessPeer(&can, 0, 1) == CUDA_SUCCESS && can == 1);
  emu_set_peer_capable(1, 0, 1);
  CHECK_COND(cuDeviceCanAccessPeer(&can, 1, 0) == CUDA_SUCCESS && can == 1);

  /* cuMemAlloc memory of device 1, cuMemAllocAsync memory of device 1, cuMemAlloc memory of 0 */
  CUdeviceptr p1 = 0, q1 = 0, p0 = 0;
  CHECK_COND(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK_COND(cuMemAlloc(&p1, 8192) == CUDA_SUCCESS);
  CHECK_COND(cuMemAllocAsync(&q1, 8192, NULL) == CUDA_SUCCESS);
  CHECK_COND(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  CHECK_COND(cuMemAlloc(&p0, 4096) == CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(1, p1, 8192, 1)); /* its own device */
  CHECK_ACCESS_OK(emu_device_access(1, q1 + 100, 100, 0));
  CHECK_ACCESS_OK(emu_device_access(0, p0, 4096, 1));
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 4096, 0));
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 4096, 1));
  CHECK_ACCESS_FAULT(emu_device_access(1, p1 + 4096, 8192, 0)); /* runs past the allocation */

  /* enabling: no current context is the driver's answer, the rest are violations */
  CHECK_COND(cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_NO_VIOLATION(cuCtxDisablePeerAccess(c1), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_COND(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  CHECK_VIOLATION(cuCtxEnablePeerAccess(c1, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuCtxEnablePeerAccess(NULL, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_VIOLATION(cuCtxEnablePeerAccess((CUcontext)(uintptr_t)&can, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_VIOLATION(cuCtxEnablePeerAccess(c0, 0), CUDA_ERROR_INVALID_DEVICE); /* itself */
  CUcontext c0b = NULL, popped = NULL;
  CHECK_COND(cuCtxCreate(&c0b, NULL, 0, 0) == CUDA_SUCCESS && cuCtxPopCurrent(&popped) == CUDA_SUCCESS && popped == c0b);
  CHECK_VIOLATION(cuCtxEnablePeerAccess(c0b, 0), CUDA_ERROR_INVALID_DEVICE); /* another context, same device */
  CHECK_NO_VIOLATION(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK_VIOLATION(cuCtxDisablePeerAccess(NULL), CUDA_ERROR_INVALID_CONTEXT);

  long long en0 = emu_calls("cuCtxEnablePeerAccess");
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  CHECK_COND(emu_calls("cuCtxEnablePeerAccess") == en0 + 2);
  CHECK_ACCESS_OK(emu_device_access(0, p1, 8192, 0));
  CHECK_ACCESS_OK(emu_device_access(0, p1 + 10, 100, 1));
  CHECK_ACCESS_FAULT(emu_device_access(0, q1, 4096, 0)); /* peer access does not reach pool memory */
  CHECK_ACCESS_FAULT(emu_device_access(1, p0, 16, 0));   /* one direction */
  CHECK_ACCESS_FAULT(emu_device_access(2, p1, 16, 0));   /* device 2 has no context with access */
  CHECK_NO_VIOLATION(cuCtxDisablePeerAccess(c1), CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 16, 0));
  CHECK_NO_VIOLATION(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  /* the other direction */
  CHECK_COND(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c0, 0), CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(1, p0, 16, 1));
  CHECK_NO_VIOLATION(cuCtxDisablePeerAccess(c0), CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(1, p0, 16, 1));

  /* any context of the device counts; destroying it drops its records */
  CHECK_COND(cuCtxPushCurrent(c0b) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(0, p1, 16, 1));
  CHECK_COND(cuCtxDestroy(c0b) == CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 16, 1));

  /* not capable: the driver's answer */
  emu_set_peer_capable(0, 1, 0);
  CHECK_COND(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  emu_set_peer_capable(0, 1, 1);

  /* resetting the peer's (primary) context drops the records pointing to it */
  CHECK_NO_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
  CHECK_COND(cuDevicePrimaryCtxReset(1) == CUDA_SUCCESS); /* frees p1 and q1 */
  CHECK_VIOLATION(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_CONTEXT); /* destroyed */
  CHECK_VIOLATION(cuCtxDisablePeerAccess(c1), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 16, 0)); /* in no allocation now */
  CUcontext again = NULL;
  CHECK_COND(cuDevicePrimaryCtxRetain(&again, 1) == CUDA_SUCCESS && again == c1);
  CHECK_NO_VIOLATION(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK_COND(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK_COND(cuMemAlloc(&p1, 4096) == CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 16, 0));
  CHECK_COND(cuMemFree(p1) == CUDA_SUCCESS);
  CHECK_COND(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(p0) == CUDA_SUCCESS);

  /* an address in no allocation; n == 0; a bad device is the test's mistake, not counted */
  CHECK_ACCESS_FAULT(emu_device_access(0, 0x1000, 16, 0));
  CHECK_ACCESS_OK(emu_device_access(0, 0x1000, 0, 0));
  int v0 = emu_violations();
  long f0 = emu_device_faults();
  CHECK_COND(emu_device_access(3, 0x1000, 16, 0) == -1 && emu_violations() == v0 && emu_device_faults() == f0);
}

static void mgpu_pools(CUcontext c0, CUcontext c1) {
  CUmemoryPool pool0 = NULL, pool1 = NULL, cur = NULL;
  CHECK_NO_VIOLATION(cuDeviceGetDefaultMemPool(&pool0, 0), CUDA_SUCCESS);
  CHECK_COND(cuDeviceGetDefaultMemPool(&pool1, 1) == CUDA_SUCCESS && pool1 && pool0 && pool1 != pool0);
  CHECK_NO_VIOLATION(cuDeviceGetMemPool(&cur, 1), CUDA_SUCCESS);
  CHECK_COND(cur == pool1);
  CHECK_VIOLATION(cuDeviceGetDefaultMemPool(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuDeviceGetDefaultMemPool(&cur, 3), CUDA_ERROR_INVALID_DEVICE);
  CHECK_VIOLATION(cuDeviceGetMemPool(NULL, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuDeviceGetMemPool(&cur, -1), CUDA_ERROR_INVALID_DEVICE);

  CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1},
                l2 = {CU_MEM_LOCATION_TYPE_DEVICE, 2}, l3 = {CU_MEM_LOCATION_TYPE_DEVICE, 3};
  CUmemAccess_flags fl = (CUmemAccess_flags)99;
  CHECK_NO_VIOLATION(cuMemPoolGetAccess(&fl, pool1, &l1), CUDA_SUCCESS);
  CHECK_COND(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE); /* the owner */
  CHECK_COND(cuMemPoolGetAccess(&fl, pool1, &l0) == CUDA_SUCCESS && fl == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK_VIOLATION(cuMemPoolGetAccess(&fl, (CUmemoryPool)(uintptr_t)&fl, &l0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolGetAccess(NULL, pool1, &l0), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolGetAccess(&fl, pool1, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolGetAccess(&fl, pool1, &l3), CUDA_ERROR_INVALID_VALUE);

  /* pool memory of device 1, before and after the pool grants device 0 access */
  CUdeviceptr q1 = 0, q2 = 0, p1 = 0;
  CHECK_COND(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK_COND(cuMemAllocAsync(&q1, 1 * MiB, NULL) == CUDA_SUCCESS);
  CHECK_COND(cuMemAlloc(&p1, 4096) == CUDA_SUCCESS);
  CUmemoryPool mp = NULL;
  CHECK_COND(cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, q1 + 5) == CUDA_SUCCESS && mp == pool1);
  CHECK_ACCESS_FAULT(emu_device_access(0, q1, 4096, 0));
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READ};
  long long sa0 = emu_calls("cuMemPoolSetAccess");
  CHECK_NO_VIOLATION(cuMemPoolSetAccess(pool1, &d, 1), CUDA_SUCCESS);
  CHECK_COND(emu_calls("cuMemPoolSetAccess") == sa0 + 1);
  CHECK_COND(cuMemPoolGetAccess(&fl, pool1, &l0) == CUDA_SUCCESS && fl == CU_MEM_ACCESS_FLAGS_PROT_READ);
  CHECK_COND(cuMemPoolGetAccess(&fl, pool1, &l2) == CUDA_SUCCESS && fl == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK_COND(cuMemPoolGetAccess(&fl, pool0, &l1) == CUDA_SUCCESS && fl == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK_ACCESS_OK(emu_device_access(0, q1, 1 * MiB, 0)); /* an existing allocation */
  CHECK_ACCESS_FAULT(emu_device_access(0, q1, 4096, 1)); /* READ: no writes */
  CHECK_ACCESS_FAULT(emu_device_access(2, q1, 4096, 0));
  CHECK_ACCESS_FAULT(emu_device_access(0, p1, 16, 0)); /* pool access does not reach cuMemAlloc memory */
  CHECK_COND(cuMemAllocAsync(&q2, 100, NULL) == CUDA_SUCCESS); /* a later allocation */
  CHECK_ACCESS_OK(emu_device_access(0, q2, 100, 0));
  CHECK_COND(USED(pool1) == 1 * MiB + 100 && RESERVED(pool1) == 1 * MiB + 100); /* each device its own pool */
  CHECK_COND(USED(pool0) == 0 && RESERVED(pool0) == 0);
  CUmemAccessDesc two[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                            {{CU_MEM_LOCATION_TYPE_DEVICE, 2}, CU_MEM_ACCESS_FLAGS_PROT_READ}};
  CHECK_NO_VIOLATION(cuMemPoolSetAccess(pool1, two, 2), CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(0, q1, 4096, 1));
  CHECK_ACCESS_OK(emu_device_access(2, q2, 100, 0));
  CHECK_ACCESS_FAULT(emu_device_access(2, q2, 100, 1));
  /* a graph allocation (captured cuMemAllocAsync) is not the pool's */
  CUstream s;
  CUgraph g = NULL;
  CUdeviceptr ga = 0;
  CHECK_COND(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK_COND(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK_COND(cuMemAllocAsync(&ga, 4096, s) == CUDA_SUCCESS);
  CHECK_COND(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(1, ga, 4096, 1));
  CHECK_ACCESS_FAULT(emu_device_access(0, ga, 4096, 0));
  CHECK_COND(cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ga) == CUDA_SUCCESS && mp == NULL);
  CHECK_COND(cuGraphDestroy(g) == CUDA_SUCCESS && cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(ga) == CUDA_SUCCESS);

  /* violations: each counted once, nothing applied */
  CHECK_VIOLATION(cuMemPoolSetAccess((CUmemoryPool)(uintptr_t)&d, &d, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, NULL, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, &d, 0), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc bad = {{CU_MEM_LOCATION_TYPE_HOST, 0}, CU_MEM_ACCESS_FLAGS_PROT_READ};
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  bad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  bad.location.id = 3;
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  bad.location.id = 0;
  bad.flags = (CUmemAccess_flags)2;
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  /* the owner keeps read-write */
  bad.location.id = 1;
  bad.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
  bad.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
  bad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_NO_VIOLATION(cuMemPoolSetAccess(pool1, &bad, 1), CUDA_SUCCESS);
  CUmemAccessDesc mixed[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_NONE},
                              {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READ}};
  CHECK_VIOLATION(cuMemPoolSetAccess(pool1, mixed, 2), CUDA_ERROR_INVALID_DEVICE);
  CHECK_COND(cuMemPoolGetAccess(&fl, pool1, &l0) == CUDA_SUCCESS && fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_COND(cuMemPoolGetAccess(&fl, pool1, &l1) == CUDA_SUCCESS && fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  /* revoked */
  CHECK_NO_VIOLATION(cuMemPoolSetAccess(pool1, mixed, 1), CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(0, q1, 16, 0));
  CHECK_COND(cuMemFreeAsync(q1, NULL) == CUDA_SUCCESS && cuMemFreeAsync(q2, NULL) == CUDA_SUCCESS);
  CHECK_COND(cuMemFree(p1) == CUDA_SUCCESS && cuStreamSynchronize(NULL) == CUDA_SUCCESS);
  CHECK_COND(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
}

static void mgpu_vmm(void) {
  size_t gran = 0;
  set_prop(1);
  CHECK_COND(cuMemGetAllocationGranularity(&gran, &g_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
             gran == 2 * MiB);
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CHECK_COND(cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemCreate(&h, 4 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemCreate(&h2, 2 * MiB, &g_prop, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemMap(va, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
  CHECK_COND(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h2, 0) == CUDA_SUCCESS);
  /* mapped, no access set: even the owner may not touch it */
  CHECK_ACCESS_FAULT(emu_device_access(1, va, 4096, 0));
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK_COND(cuMemSetAccess(va, 6 * MiB, &acc, 1) == CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(1, va, 4096, 0));
  CHECK_ACCESS_OK(emu_device_access(1, va, 6 * MiB, 1)); /* across both mappings */
  CHECK_ACCESS_FAULT(emu_device_access(0, va, 4096, 0));
  CHECK_ACCESS_FAULT(emu_device_access(0, va, 4096, 1));
  /* device 0 may read the first mapping only */
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  CHECK_COND(cuMemSetAccess(va, 4 * MiB, &acc, 1) == CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(0, va + 100, 4 * MiB - 100, 0));
  CHECK_ACCESS_FAULT(emu_device_access(0, va, 4096, 1));
  CHECK_ACCESS_OK(emu_device_access(1, va, 4096, 1)); /* device 1 keeps read-write */
  CHECK_ACCESS_FAULT(emu_device_access(0, va + 3 * MiB, 2 * MiB, 0)); /* into the second mapping */
  CHECK_ACCESS_FAULT(emu_device_access(2, va, 16, 0));
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_COND(cuMemSetAccess(va, 6 * MiB, &acc, 1) == CUDA_SUCCESS);
  CHECK_ACCESS_OK(emu_device_access(0, va, 6 * MiB, 1));
  /* partly unmapped ranges */
  CHECK_ACCESS_FAULT(emu_device_access(1, va + 6 * MiB - 4096, 8192, 0));
  CHECK_ACCESS_FAULT(emu_device_access(1, va + 6 * MiB, 16, 0)); /* reserved, not mapped */
  CHECK_ACCESS_FAULT(emu_device_access(0, va + 6 * MiB - 4096, 8192, 1));
  CHECK_COND(cuMemUnmap(va + 4 * MiB, 2 * MiB) == CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(1, va + 3 * MiB, 2 * MiB, 0)); /* a hole where a mapping was */
  CHECK_ACCESS_OK(emu_device_access(1, va + 3 * MiB, 1 * MiB, 0));
  /* a new mapping starts with no access */
  CHECK_COND(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h2, 0) == CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(1, va + 4 * MiB, 16, 0));
  CHECK_COND(cuMemUnmap(va, 6 * MiB) == CUDA_SUCCESS);
  CHECK_COND(cuMemRelease(h) == CUDA_SUCCESS && cuMemRelease(h2) == CUDA_SUCCESS);
  CHECK_COND(cuMemAddressFree(va, 16 * MiB) == CUDA_SUCCESS);
  CHECK_ACCESS_FAULT(emu_device_access(1, va, 16, 0));
}

typedef int (*rt_can_t)(int *, int, int);
typedef int (*rt_int_t)(int);
typedef int (*rt_enable_t)(int, unsigned);
typedef int (*rt_getpool_t)(CUmemoryPool *, int);
typedef int (*rt_setacc_t)(CUmemoryPool, const CUmemAccessDesc *, size_t);
typedef int (*rt_getacc_t)(CUmemAccess_flags *, CUmemoryPool, CUmemLocation *);

/* The runtime's peer and pool calls (cudaError_t values: cudaErrorInvalidValue 1,
 * cudaErrorInvalidDevice 101, cudaErrorPeerAccessAlreadyEnabled 704,
 * cudaErrorPeerAccessNotEnabled 705). Ends with a cudaDeviceReset of device 0. */
static void mgpu_runtime(void) {
  void *rt = open_runtime();
  if (!rt) return;
  rt_can_t can_fn = (rt_can_t)dlsym(rt, "cudaDeviceCanAccessPeer");
  rt_enable_t en = (rt_enable_t)dlsym(rt, "cudaDeviceEnablePeerAccess");
  rt_int_t dis = (rt_int_t)dlsym(rt, "cudaDeviceDisablePeerAccess");
  rt_int_t set_dev = (rt_int_t)dlsym(rt, "cudaSetDevice");
  rt_getpool_t getpool = (rt_getpool_t)dlsym(rt, "cudaDeviceGetDefaultMemPool");
  rt_setacc_t setacc = (rt_setacc_t)dlsym(rt, "cudaMemPoolSetAccess");
  rt_getacc_t getacc = (rt_getacc_t)dlsym(rt, "cudaMemPoolGetAccess");
  rt_malloc_t m = (rt_malloc_t)dlsym(rt, "cudaMalloc");
  rt_free_t f = (rt_free_t)dlsym(rt, "cudaFree");
  rt_err_t reset = (rt_err_t)dlsym(rt, "cudaDeviceReset");
  rt_err_t last = (rt_err_t)dlsym(rt, "cudaGetLastError");
  CHECK_COND(can_fn && en && dis && set_dev && getpool && setacc && getacc && m && f && reset && last);
  if (!(can_fn && en && dis && set_dev && getpool && setacc && getacc && m && f && reset && last)) return;
  int n = 0, can = -1;
  CHECK_COND(can_fn(&can, 0, 1) == 0 && can == 1);
  CHECK_COND(can_fn(&can, 1, 1) == 0 && can == 0);
  int v0 = emu_violations();
  CHECK_COND(can_fn(&can, 0, 7) == 101 && emu_violations() == v0 + 1);
  /* memory of device 1 made through the runtime */
  void *p1 = NULL;
  CHECK_COND(set_dev(1) == 0 && m(&p1, 4096) == 0 && p1);
  CUdeviceptr d1 = (CUdeviceptr)(uintptr_t)p1;
  CHECK_COND(set_dev(0) == 0);
  CHECK_ACCESS_FAULT(emu_device_access(0, d1, 4096, 1));
  v0 = emu_violations();
  CHECK_COND(en(1, 0) == 0);
  CHECK_ACCESS_OK(emu_device_access(0, d1, 4096, 1));
  CHECK_COND(en(1, 0) == 704 && last() == 704);
  CHECK_COND(en(5, 0) == 101); /* no such device: the runtime's own answer */
  CHECK_COND(emu_violations() == v0);
  CHECK_COND(en(0, 0) == 101 && emu_violations() == v0 + 1); /* itself */
  CHECK_COND(en(1, 4) == 1 && emu_violations() == v0 + 2);
  CHECK_COND(dis(1) == 0);
  CHECK_ACCESS_FAULT(emu_device_access(0, d1, 4096, 1));
  v0 = emu_violations();
  CHECK_COND(dis(1) == 705 && dis(2) == 705 && dis(9) == 101 && emu_violations() == v0);
  /* enabling retains the peer's primary context */
  unsigned flags = 0;
  int active = 0;
  CHECK_COND(cuDevicePrimaryCtxGetState(2, &flags, &active) == CUDA_SUCCESS && active == 0);
  CHECK_COND(en(2, 0) == 0);
  CHECK_COND(cuDevicePrimaryCtxGetState(2, &flags, &active) == CUDA_SUCCESS && active == 1);
  CHECK_COND(dis(2) == 0);
  /* the default pool */
  CUmemoryPool pool = NULL, drv = NULL;
  CHECK_COND(getpool(&pool, 1) == 0 && cuDeviceGetDefaultMemPool(&drv, 1) == CUDA_SUCCESS && pool == drv);
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK_COND(setacc(pool, &d, 1) == 0);
  CUmemAccess_flags fl = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CHECK_COND(getacc(&fl, pool, &l0) == 0 && fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  d.location.id = 1;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  v0 = emu_violations();
  CHECK_COND(setacc(pool, &d, 1) == 101 && emu_violations() == v0 + 1);
  CHECK_COND(getpool(&pool, 3) == 101 && emu_violations() == v0 + 2);
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CHECK_COND(setacc(pool, &d, 1) == 0);
  /* cudaDeviceReset of device 0 drops its peer access */
  CHECK_COND(en(1, 0) == 0);
  CHECK_ACCESS_OK(emu_device_access(0, d1, 16, 0));
  CHECK_COND(reset() == 0);
  CHECK_ACCESS_FAULT(emu_device_access(0, d1, 16, 0));
  CHECK_COND(set_dev(0) == 0 && en(1, 0) == 0); /* enabled again on the new context */
  CHECK_ACCESS_OK(emu_device_access(0, d1, 16, 0));
  CHECK_COND(set_dev(1) == 0 && f(p1) == 0);
  last();
  (void)n;
}

static void scenario_mgpu(void) {
  emu_set_device_count(3);
  CHECK_COND(cuInit(0) == CUDA_SUCCESS);
  int n = 0;
  CHECK_COND(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 3);
  CUcontext c0 = NULL, c1 = NULL;
  CHECK_COND(cuDevicePrimaryCtxRetain(&c0, 0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
  CHECK_COND(c0 && c1 && c0 != c1);
  CHECK_COND(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  emu_counters_t c;
  emu_get_counters(&c);
  unsigned long long peer0 = c.n_cuDeviceCanAccessPeer, pool0 = c.n_cuDeviceGetDefaultMemPool;
  mgpu_peer(c0, c1);
  mgpu_pools(c0, c1);
  mgpu_vmm();
  emu_get_counters(&c);
  CHECK_COND(c.n_cuDeviceCanAccessPeer == peer0 + 10 && c.n_cuDeviceGetDefaultMemPool == pool0 + 4);
  CHECK_COND(c.n_cuCtxDisablePeerAccess > 0 && c.n_cuDeviceGetMemPool == 3 && c.n_cuMemPoolGetAccess > 0);
  mgpu_runtime();
  CHECK_COND(emu_device_faults() > 0);
}

int main(int argc, char **argv) {
  const char *scenario = check_child_main(argc, argv);
  if (scenario) {
    if (strcmp(scenario, "mgpu") == 0)
      scenario_mgpu();
    else if (strcmp(scenario, "import") == 0)
      scenario_import();
    else
      CHECK(0, "unknown scenario %s", scenario);
    return check_child_summary(scenario);
  }
  test_init();
  test_lookup();
  test_vmm();
  test_cpu_access();
  test_oom();
  test_plain();
  test_streams();
  test_capture();
  test_runtime();
  test_threads();
  test_errors();
  test_lookup_new();
  test_pool_attributes();
  test_ipc();
  test_import();
  check_run_child("mgpu", (char *)NULL);
  return check_summary();
}
