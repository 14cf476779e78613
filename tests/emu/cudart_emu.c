/* Host emulation of the CUDA runtime for the CPU tests of vmmshim.
 *
 * Built twice: as build/emu/libcudart.so.13 (shared, like libcudart.so) and, with
 * -DEMU_STATIC_RUNTIME, into build/emu/libcudart_static.a (linked into the program like
 * nvcc's default static runtime; its symbols are then hidden).
 *
 * Like the real runtime, it reaches the driver only through cuGetProcAddress: on first
 * use it dlopen()s libcuda.so.1, takes cuGetProcAddress_v2 with a plain dlsym() (which a
 * preloaded library may intercept), asks that only for cuInit and cuGetProcAddress,
 * calls cuInit(0), and looks every other driver function up through the
 * cuGetProcAddress it got back (the _ptsz entry points with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "cudart_emu.h"

#ifdef EMU_STATIC_RUNTIME
#define RT_VIS "hidden"
#else
#define RT_VIS "default"
#endif
#define EXPORT(sym, impl) \
  extern __typeof__(impl) rt_x_##impl __asm__(#sym) __attribute__((alias(#impl), visibility(RT_VIS)));

#define RT_MAXDEV 16

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Driver functions the runtime uses: name, version, flags-variant, type. */
#define RT_DRIVER(X)                                                                                  \
  X(cuDeviceGetCount, 2000, 0, CUresult (*)(int *))                                                   \
  X(cuDeviceGet, 2000, 0, CUresult (*)(CUdevice *, int))                                              \
  X(cuDevicePrimaryCtxRetain, 7000, 0, CUresult (*)(CUcontext *, CUdevice))                           \
  X(cuDevicePrimaryCtxRelease, 11000, 0, CUresult (*)(CUdevice))                                      \
  X(cuDevicePrimaryCtxReset, 11000, 0, CUresult (*)(CUdevice))                                        \
  X(cuCtxGetCurrent, 4000, 0, CUresult (*)(CUcontext *))                                              \
  X(cuCtxSetCurrent, 4000, 0, CUresult (*)(CUcontext))                                                \
  X(cuCtxGetDevice, 2000, 0, CUresult (*)(CUdevice *))                                                \
  X(cuCtxSynchronize, 2000, 0, CUresult (*)(void))                                                    \
  X(cuMemAlloc, 3020, 0, CUresult (*)(CUdeviceptr *, size_t))                                         \
  X(cuMemFree, 3020, 0, CUresult (*)(CUdeviceptr))                                                    \
  X(cuMemGetInfo, 3020, 0, CUresult (*)(size_t *, size_t *))                                          \
  X(cuMemAllocAsync, 11020, 0, CUresult (*)(CUdeviceptr *, size_t, CUstream))                         \
  X(cuMemFreeAsync, 11020, 0, CUresult (*)(CUdeviceptr, CUstream))                                    \
  X(cuPointerGetAttributes, 7000, 0, CUresult (*)(unsigned, CUpointer_attribute *, void **, CUdeviceptr)) \
  X(cuStreamCreate, 2000, 0, CUresult (*)(CUstream *, unsigned))                                      \
  X(cuStreamDestroy, 4000, 0, CUresult (*)(CUstream))                                                 \
  X(cuStreamSynchronize, 2000, 0, CUresult (*)(CUstream))                                             \
  X(cuStreamQuery, 2000, 0, CUresult (*)(CUstream))                                                   \
  X(cuStreamWaitEvent, 3020, 0, CUresult (*)(CUstream, CUevent, unsigned))                            \
  X(cuStreamBeginCapture, 10010, 0, CUresult (*)(CUstream, CUstreamCaptureMode))                      \
  X(cuStreamEndCapture, 10000, 0, CUresult (*)(CUstream, CUgraph *))                                  \
  X(cuStreamIsCapturing, 10000, 0, CUresult (*)(CUstream, CUstreamCaptureStatus *))                   \
  X(cuThreadExchangeStreamCaptureMode, 10010, 0, CUresult (*)(CUstreamCaptureMode *))                 \
  X(cuGraphDestroy, 10000, 0, CUresult (*)(CUgraph))                                                  \
  X(cuEventCreate, 2000, 0, CUresult (*)(CUevent *, unsigned))                                        \
  X(cuEventRecord, 2000, 0, CUresult (*)(CUevent, CUstream))                                          \
  X(cuEventQuery, 2000, 0, CUresult (*)(CUevent))                                                     \
  X(cuEventSynchronize, 2000, 0, CUresult (*)(CUevent))                                               \
  X(cuEventDestroy, 4000, 0, CUresult (*)(CUevent))                                                   \
  X(cuDriverGetVersion, 2020, 0, CUresult (*)(int *))                                                 \
  X(cuDeviceCanAccessPeer, 4000, 0, CUresult (*)(int *, CUdevice, CUdevice))                          \
  X(cuCtxEnablePeerAccess, 4000, 0, CUresult (*)(CUcontext, unsigned))                                \
  X(cuCtxDisablePeerAccess, 4000, 0, CUresult (*)(CUcontext))                                         \
  X(cuDeviceGetDefaultMemPool, 11020, 0, CUresult (*)(CUmemoryPool *, CUdevice))                      \
  X(cuMemPoolSetAccess, 11020, 0, CUresult (*)(CUmemoryPool, const CUmemAccessDesc *, size_t))        \
  X(cuMemPoolGetAccess, 11020, 0, CUresult (*)(CUmemAccess_flags *, CUmemoryPool, CUmemLocation *))   \
  X(cuDeviceGetMemPool, 11020, 0, CUresult (*)(CUmemoryPool *, CUdevice))                             \
  X(cuMemPoolGetAttribute, 11020, 0, CUresult (*)(CUmemoryPool, CUmemPool_attribute, void *))         \
  X(cuMemPoolSetAttribute, 11020, 0, CUresult (*)(CUmemoryPool, CUmemPool_attribute, void *))         \
  X(cuMemPoolTrimTo, 11020, 0, CUresult (*)(CUmemoryPool, size_t))                                    \
  X(cuIpcGetMemHandle, 4010, 0, CUresult (*)(CUipcMemHandle *, CUdeviceptr))                          \
  X(cuIpcOpenMemHandle, 11000, 0, CUresult (*)(CUdeviceptr *, CUipcMemHandle, unsigned))              \
  X(cuIpcCloseMemHandle, 4010, 0, CUresult (*)(CUdeviceptr))                                          \
  X(cuLaunchKernel, 4000, 0, CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,  \
                                          unsigned, unsigned, CUstream, void **, void **))             \
  /* per-thread default stream variants */                                                            \
  X(cuMemAllocAsync_ptsz, 11020, 1, CUresult (*)(CUdeviceptr *, size_t, CUstream))                    \
  X(cuMemFreeAsync_ptsz, 11020, 1, CUresult (*)(CUdeviceptr, CUstream))                               \
  X(cuStreamSynchronize_ptsz, 7000, 1, CUresult (*)(CUstream))                                        \
  X(cuStreamQuery_ptsz, 7000, 1, CUresult (*)(CUstream))                                              \
  X(cuStreamWaitEvent_ptsz, 7000, 1, CUresult (*)(CUstream, CUevent, unsigned))                       \
  X(cuEventRecord_ptsz, 7000, 1, CUresult (*)(CUevent, CUstream))                                     \
  X(cuStreamBeginCapture_ptsz, 10010, 1, CUresult (*)(CUstream, CUstreamCaptureMode))                 \
  X(cuStreamEndCapture_ptsz, 10000, 1, CUresult (*)(CUstream, CUgraph *))                             \
  X(cuStreamIsCapturing_ptsz, 10000, 1, CUresult (*)(CUstream, CUstreamCaptureStatus *))

static struct {
#define RT_FIELD(name, ver, ptsz, type) __typeof__(type) name;
  RT_DRIVER(RT_FIELD)
#undef RT_FIELD
} D;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_err = cudaErrorInitializationError;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_pctx[RT_MAXDEV];
static int g_retained[RT_MAXDEV];
static int g_devcount;

static _Thread_local cudaError_t tl_err = cudaSuccess;
static _Thread_local int tl_dev = 0;

/* ------------------------------------------------------------------ errors */

static cudaError_t map_err(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_NOT_PERMITTED: return cudaErrorNotPermitted;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_MERGE: return cudaErrorStreamCaptureMerge;
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: return cudaErrorStreamCaptureUnmatched;
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: return cudaErrorStreamCaptureUnjoined;
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: return cudaErrorStreamCaptureIsolation;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return cudaErrorStreamCaptureImplicit;
    case CUDA_ERROR_CAPTURED_EVENT: return cudaErrorCapturedEvent;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return cudaErrorStreamCaptureWrongThread;
    case CUDA_ERROR_MAP_FAILED: return cudaErrorMapBufferObjectFailed;
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return cudaErrorPeerAccessUnsupported;
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return cudaErrorPeerAccessAlreadyEnabled;
    case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: return cudaErrorPeerAccessNotEnabled;
    case CUDA_ERROR_TOO_MANY_PEERS: return cudaErrorTooManyPeers;
    default: return cudaErrorUnknown;
  }
}

/* Records a failure as the thread's last error (cudaErrorNotReady is not an error). */
static cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) tl_err = e;
  return e;
}
static cudaError_t ret_cu(CUresult r) { return ret(map_err(r)); }

static const struct {
  cudaError_t e;
  const char *name, *text;
} g_names[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported", "peer access is not supported between these two devices"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorTooManyPeers, "cudaErrorTooManyPeers", "peer mapping resources exhausted"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const char *r_cudaGetErrorName(cudaError_t e) {
  for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++)
    if (g_names[i].e == e) return g_names[i].name;
  return "cudaErrorUnknown";
}
static const char *r_cudaGetErrorString(cudaError_t e) {
  for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++)
    if (g_names[i].e == e) return g_names[i].text;
  return "unrecognized error code";
}
static cudaError_t r_cudaGetLastError(void) {
  cudaError_t e = tl_err;
  tl_err = cudaSuccess;
  return e;
}
static cudaError_t r_cudaPeekAtLastError(void) { return tl_err; }

/* ------------------------------------------------------------------ initialisation */

static void rt_init(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) {
    fprintf(stderr, "emu cudart: dlopen(libcuda.so.1): %s\n", dlerror());
    g_init_err = cudaErrorInsufficientDriver;
    return;
  }
  get_proc_fn gp2 = (get_proc_fn)dlsym(h, "cuGetProcAddress_v2");
  if (!gp2) {
    fprintf(stderr, "emu cudart: no cuGetProcAddress_v2 in libcuda.so.1\n");
    g_init_err = cudaErrorInsufficientDriver;
    return;
  }
  CUdriverProcAddressQueryResult st;
  CUresult (*init)(unsigned) = NULL;
  get_proc_fn gp = NULL;
  if (gp2("cuInit", (void **)&init, 13000, 0, &st) != CUDA_SUCCESS || !init ||
      gp2("cuGetProcAddress", (void **)&gp, 13000, 0, &st) != CUDA_SUCCESS || !gp) {
    fprintf(stderr, "emu cudart: cannot look up cuInit / cuGetProcAddress\n");
    g_init_err = cudaErrorInsufficientDriver;
    return;
  }
  CUresult r = init(0);
  if (r != CUDA_SUCCESS) {
    g_init_err = map_err(r);
    return;
  }
  char name[64];
#define RT_LOOKUP(fname, ver, ptsz, type)                                                          \
  do {                                                                                             \
    snprintf(name, sizeof name, "%s", #fname);                                                     \
    if (ptsz) name[strlen(name) - 5] = 0;                                                          \
    void *p = NULL;                                                                                \
    r = gp(name, &p, ver, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);          \
    if (r != CUDA_SUCCESS || !p) {                                                                 \
      fprintf(stderr, "emu cudart: cuGetProcAddress(%s, %d) failed: %d\n", name, ver, (int)r);     \
      g_init_err = cudaErrorInsufficientDriver;                                                    \
      return;                                                                                      \
    }                                                                                              \
    memcpy(&D.fname, &p, sizeof p);                                                                \
  } while (0);
  RT_DRIVER(RT_LOOKUP)
#undef RT_LOOKUP
  int n = 0;
  r = D.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS || n <= 0) {
    g_init_err = r ? map_err(r) : cudaErrorNoDevice;
    return;
  }
  g_devcount = n > RT_MAXDEV ? RT_MAXDEV : n;
  g_init_err = cudaSuccess;
}

static cudaError_t rt_ready(void) {
  pthread_once(&g_once, rt_init);
  return g_init_err;
}

/* Retains (again, after a reset) the primary context of dev. */
static CUresult retain_primary(int dev) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&g_mu);
  if (!g_retained[dev]) {
    r = D.cuDevicePrimaryCtxRetain(&g_pctx[dev], dev);
    if (r == CUDA_SUCCESS) g_retained[dev] = 1;
  }
  pthread_mutex_unlock(&g_mu);
  return r;
}

/* Makes sure a usable context is current on the calling thread. */
static cudaError_t rt_ctx(void) {
  cudaError_t e = rt_ready();
  if (e) return e;
  CUcontext c = NULL;
  CUresult r = D.cuCtxGetCurrent(&c);
  if (r) return map_err(r);
  if (c) {
    int stale = 0;
    pthread_mutex_lock(&g_mu);
    for (int d = 0; d < g_devcount; d++)
      if (g_pctx[d] == c && !g_retained[d]) stale = 1;
    pthread_mutex_unlock(&g_mu);
    if (!stale) return cudaSuccess;
  }
  r = retain_primary(tl_dev);
  if (r) return map_err(r);
  r = D.cuCtxSetCurrent(g_pctx[tl_dev]);
  return map_err(r);
}

#define NEED_CTX()                        \
  do {                                    \
    cudaError_t e_ = rt_ctx();            \
    if (e_ != cudaSuccess) return ret(e_); \
  } while (0)

/* ------------------------------------------------------------------ devices */

static cudaError_t r_cudaGetDeviceCount(int *n) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  if (!n) return ret(cudaErrorInvalidValue);
  *n = g_devcount;
  return cudaSuccess;
}

static cudaError_t r_cudaSetDevice(int dev) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  if (dev < 0 || dev >= g_devcount) return ret(cudaErrorInvalidDevice);
  tl_dev = dev;
  CUresult r = retain_primary(dev);
  if (r) return ret_cu(r);
  return ret_cu(D.cuCtxSetCurrent(g_pctx[dev]));
}

static cudaError_t r_cudaGetDevice(int *dev) {
  if (!dev) return ret(cudaErrorInvalidValue);
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  CUcontext c = NULL;
  if (D.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c) {
    CUdevice d;
    if (D.cuCtxGetDevice(&d) == CUDA_SUCCESS) {
      *dev = d;
      return cudaSuccess;
    }
  }
  *dev = tl_dev;
  return cudaSuccess;
}

static cudaError_t r_cudaDeviceSynchronize(void) {
  NEED_CTX();
  return ret_cu(D.cuCtxSynchronize());
}

static cudaError_t r_cudaDeviceReset(void) {
  NEED_CTX();
  CUdevice dev = tl_dev;
  if (D.cuCtxGetDevice(&dev) != CUDA_SUCCESS) dev = tl_dev;
  CUresult r = D.cuDevicePrimaryCtxReset(dev);
  pthread_mutex_lock(&g_mu);
  g_retained[dev] = 0;
  pthread_mutex_unlock(&g_mu);
  return ret_cu(r);
}

static cudaError_t r_cudaDriverGetVersion(int *v) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuDriverGetVersion(v));
}
static cudaError_t r_cudaRuntimeGetVersion(int *v) {
  if (!v) return ret(cudaErrorInvalidValue);
  *v = 13000;
  return cudaSuccess;
}

/* ------------------------------------------------------------------ memory */

static cudaError_t r_cudaMalloc(void **p, size_t size) {
  if (!p) return ret(cudaErrorInvalidValue);
  NEED_CTX();
  if (size == 0) {
    *p = NULL;
    return cudaSuccess;
  }
  CUdeviceptr d = 0;
  CUresult r = D.cuMemAlloc(&d, size);
  if (r) return ret_cu(r);
  *p = (void *)(uintptr_t)d;
  return cudaSuccess;
}

static cudaError_t r_cudaFree(void *p) {
  NEED_CTX();
  if (!p) return cudaSuccess;
  CUresult r = D.cuCtxSynchronize();
  if (r) return ret_cu(r);
  return ret_cu(D.cuMemFree((CUdeviceptr)(uintptr_t)p));
}

static cudaError_t malloc_async(void **p, size_t size, cudaStream_t s, int ptsz) {
  if (!p) return ret(cudaErrorInvalidValue);
  NEED_CTX();
  CUdeviceptr d = 0;
  CUresult r = ptsz ? D.cuMemAllocAsync_ptsz(&d, size, s) : D.cuMemAllocAsync(&d, size, s);
  if (r) return ret_cu(r);
  *p = (void *)(uintptr_t)d;
  return cudaSuccess;
}
static cudaError_t r_cudaMallocAsync(void **p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, 0); }
static cudaError_t r_cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, 1); }

static cudaError_t free_async(void *p, cudaStream_t s, int ptsz) {
  NEED_CTX();
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
  return ret_cu(ptsz ? D.cuMemFreeAsync_ptsz(d, s) : D.cuMemFreeAsync(d, s));
}
static cudaError_t r_cudaFreeAsync(void *p, cudaStream_t s) { return free_async(p, s, 0); }
static cudaError_t r_cudaFreeAsync_ptsz(void *p, cudaStream_t s) { return free_async(p, s, 1); }

static cudaError_t r_cudaMemGetInfo(size_t *f, size_t *t) {
  NEED_CTX();
  return ret_cu(D.cuMemGetInfo(f, t));
}

static cudaError_t r_cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr) {
  if (!a) return ret(cudaErrorInvalidValue);
  NEED_CTX();
  unsigned type = 0;
  int ordinal = -2;
  CUpointer_attribute at[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void *data[2] = {&type, &ordinal};
  CUresult r = D.cuPointerGetAttributes(2, at, data, (CUdeviceptr)(uintptr_t)ptr);
  if (r) return ret_cu(r);
  memset(a, 0, sizeof *a);
  if (type == CU_MEMORYTYPE_DEVICE) {
    a->type = cudaMemoryTypeDevice;
    a->device = ordinal;
    a->devicePointer = (void *)ptr;
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

/* ------------------------------------------------------------------ peers, memory pools, IPC */

static cudaError_t r_cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuDeviceCanAccessPeer(can, dev, peer));
}

/* From the current context (the current device's primary context) to the peer device's
 * primary context, which is retained (initialised) first as the real runtime does. */
static cudaError_t r_cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  NEED_CTX();
  if (peer < 0 || peer >= g_devcount) return ret(cudaErrorInvalidDevice);
  CUresult r = retain_primary(peer);
  if (r) return ret_cu(r);
  pthread_mutex_lock(&g_mu);
  CUcontext pc = g_pctx[peer];
  pthread_mutex_unlock(&g_mu);
  return ret_cu(D.cuCtxEnablePeerAccess(pc, flags));
}

static cudaError_t r_cudaDeviceDisablePeerAccess(int peer) {
  NEED_CTX();
  if (peer < 0 || peer >= g_devcount) return ret(cudaErrorInvalidDevice);
  pthread_mutex_lock(&g_mu);
  CUcontext pc = g_retained[peer] ? g_pctx[peer] : NULL;
  pthread_mutex_unlock(&g_mu);
  if (!pc) return ret(cudaErrorPeerAccessNotEnabled); /* its primary context was never made */
  return ret_cu(D.cuCtxDisablePeerAccess(pc));
}

static cudaError_t r_cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuDeviceGetDefaultMemPool(pool, dev));
}

static cudaError_t r_cudaMemPoolSetAccess(cudaMemPool_t pool, const struct cudaMemAccessDesc *list, size_t count) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  CUmemAccessDesc *d = NULL;
  if (list && count > 0) {
    d = calloc(count, sizeof *d);
    if (!d) return ret(cudaErrorMemoryAllocation);
    for (size_t i = 0; i < count; i++) {
      d[i].location.type = (CUmemLocationType)list[i].location.type;
      d[i].location.id = list[i].location.id;
      d[i].flags = (CUmemAccess_flags)list[i].flags;
    }
  }
  CUresult r = D.cuMemPoolSetAccess(pool, d, count);
  free(d);
  return ret_cu(r);
}

static cudaError_t r_cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t pool,
                                          struct cudaMemLocation *location) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  CUmemLocation loc;
  memset(&loc, 0, sizeof loc);
  if (location) {
    loc.type = (CUmemLocationType)location->type;
    loc.id = location->id;
  }
  CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CUresult r = D.cuMemPoolGetAccess(flags ? &f : NULL, pool, location ? &loc : NULL);
  if (r == CUDA_SUCCESS) *flags = (enum cudaMemAccessFlags)f;
  return ret_cu(r);
}

static cudaError_t r_cudaDeviceGetMemPool(cudaMemPool_t *pool, int dev) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuDeviceGetMemPool(pool, dev));
}

/* cudaMemPoolAttr and CUmemPool_attribute share their values. */
_Static_assert((int)cudaMemPoolAttrUsedMemHigh == (int)CU_MEMPOOL_ATTR_USED_MEM_HIGH, "pool attributes");

static cudaError_t r_cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuMemPoolGetAttribute(pool, (CUmemPool_attribute)attr, value));
}

static cudaError_t r_cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuMemPoolSetAttribute(pool, (CUmemPool_attribute)attr, value));
}

static cudaError_t r_cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuMemPoolTrimTo(pool, keep));
}

_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle), "IPC handles of the same size");

static cudaError_t r_cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p) {
  NEED_CTX();
  CUipcMemHandle h;
  CUresult r = D.cuIpcGetMemHandle(handle ? &h : NULL, (CUdeviceptr)(uintptr_t)p);
  if (r == CUDA_SUCCESS) memcpy(handle, &h, sizeof h);
  return ret_cu(r);
}

static cudaError_t r_cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle, unsigned int flags) {
  NEED_CTX();
  CUipcMemHandle h;
  memcpy(&h, &handle, sizeof h);
  CUdeviceptr d = 0;
  CUresult r = D.cuIpcOpenMemHandle(p ? &d : NULL, h, flags);
  if (r == CUDA_SUCCESS) *p = (void *)(uintptr_t)d;
  return ret_cu(r);
}

static cudaError_t r_cudaIpcCloseMemHandle(void *p) {
  NEED_CTX();
  return ret_cu(D.cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)p));
}

/* ------------------------------------------------------------------ streams, events, capture */

static cudaError_t r_cudaStreamCreate(cudaStream_t *s) {
  NEED_CTX();
  return ret_cu(D.cuStreamCreate(s, 0));
}
static cudaError_t r_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  NEED_CTX();
  return ret_cu(D.cuStreamCreate(s, flags));
}
static cudaError_t r_cudaStreamDestroy(cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuStreamDestroy(s));
}
static cudaError_t r_cudaStreamSynchronize(cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuStreamSynchronize(s));
}
static cudaError_t r_cudaStreamSynchronize_ptsz(cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuStreamSynchronize_ptsz(s));
}
/* The emulation's kernels run nothing (tests/emu/cuda_emu.c): the host function's address stands
 * for its CUfunction, as the real runtime maps a registered stub to one. */
static cudaError_t r_cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                                      cudaStream_t s) {
  NEED_CTX();
  if (!func) return ret(cudaErrorInvalidDeviceFunction);
  return ret_cu(D.cuLaunchKernel((CUfunction)(uintptr_t)func, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                 (unsigned)shmem, s, args, NULL));
}
static cudaError_t r_cudaStreamQuery(cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuStreamQuery(s));
}
static cudaError_t r_cudaStreamQuery_ptsz(cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuStreamQuery_ptsz(s));
}
static cudaError_t r_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
  NEED_CTX();
  return ret_cu(D.cuStreamWaitEvent(s, e, f));
}
static cudaError_t r_cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned int f) {
  NEED_CTX();
  return ret_cu(D.cuStreamWaitEvent_ptsz(s, e, f));
}
static cudaError_t r_cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
  NEED_CTX();
  return ret_cu(D.cuStreamBeginCapture(s, (CUstreamCaptureMode)m));
}
static cudaError_t r_cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode m) {
  NEED_CTX();
  return ret_cu(D.cuStreamBeginCapture_ptsz(s, (CUstreamCaptureMode)m));
}
static cudaError_t r_cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  NEED_CTX();
  return ret_cu(D.cuStreamEndCapture(s, g));
}
static cudaError_t r_cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g) {
  NEED_CTX();
  return ret_cu(D.cuStreamEndCapture_ptsz(s, g));
}
static cudaError_t r_cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  NEED_CTX();
  return ret_cu(D.cuStreamIsCapturing(s, (CUstreamCaptureStatus *)st));
}
static cudaError_t r_cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  NEED_CTX();
  return ret_cu(D.cuStreamIsCapturing_ptsz(s, (CUstreamCaptureStatus *)st));
}
static cudaError_t r_cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) {
  cudaError_t e = rt_ready();
  if (e) return ret(e);
  return ret_cu(D.cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)m));
}
static cudaError_t r_cudaGraphDestroy(cudaGraph_t g) {
  NEED_CTX();
  return ret_cu(D.cuGraphDestroy(g));
}

static cudaError_t r_cudaEventCreate(cudaEvent_t *e) {
  NEED_CTX();
  return ret_cu(D.cuEventCreate(e, 0));
}
static cudaError_t r_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  NEED_CTX();
  return ret_cu(D.cuEventCreate(e, flags));
}
static cudaError_t r_cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuEventRecord(e, s));
}
static cudaError_t r_cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  NEED_CTX();
  return ret_cu(D.cuEventRecord_ptsz(e, s));
}
static cudaError_t r_cudaEventQuery(cudaEvent_t e) {
  NEED_CTX();
  return ret_cu(D.cuEventQuery(e));
}
static cudaError_t r_cudaEventSynchronize(cudaEvent_t e) {
  NEED_CTX();
  return ret_cu(D.cuEventSynchronize(e));
}
static cudaError_t r_cudaEventDestroy(cudaEvent_t e) {
  NEED_CTX();
  return ret_cu(D.cuEventDestroy(e));
}

/* ------------------------------------------------------------------ exports */

EXPORT(cudaGetErrorName, r_cudaGetErrorName)
EXPORT(cudaGetErrorString, r_cudaGetErrorString)
EXPORT(cudaGetLastError, r_cudaGetLastError)
EXPORT(cudaPeekAtLastError, r_cudaPeekAtLastError)
EXPORT(cudaGetDeviceCount, r_cudaGetDeviceCount)
EXPORT(cudaSetDevice, r_cudaSetDevice)
EXPORT(cudaGetDevice, r_cudaGetDevice)
EXPORT(cudaDeviceSynchronize, r_cudaDeviceSynchronize)
EXPORT(cudaDeviceReset, r_cudaDeviceReset)
EXPORT(cudaDriverGetVersion, r_cudaDriverGetVersion)
EXPORT(cudaRuntimeGetVersion, r_cudaRuntimeGetVersion)
EXPORT(cudaMalloc, r_cudaMalloc)
EXPORT(cudaFree, r_cudaFree)
EXPORT(cudaMallocAsync, r_cudaMallocAsync)
EXPORT(cudaMallocAsync_ptsz, r_cudaMallocAsync_ptsz)
EXPORT(cudaFreeAsync, r_cudaFreeAsync)
EXPORT(cudaFreeAsync_ptsz, r_cudaFreeAsync_ptsz)
EXPORT(cudaMemGetInfo, r_cudaMemGetInfo)
EXPORT(cudaPointerGetAttributes, r_cudaPointerGetAttributes)
EXPORT(cudaDeviceCanAccessPeer, r_cudaDeviceCanAccessPeer)
EXPORT(cudaDeviceEnablePeerAccess, r_cudaDeviceEnablePeerAccess)
EXPORT(cudaDeviceDisablePeerAccess, r_cudaDeviceDisablePeerAccess)
EXPORT(cudaDeviceGetDefaultMemPool, r_cudaDeviceGetDefaultMemPool)
EXPORT(cudaMemPoolSetAccess, r_cudaMemPoolSetAccess)
EXPORT(cudaMemPoolGetAccess, r_cudaMemPoolGetAccess)
EXPORT(cudaDeviceGetMemPool, r_cudaDeviceGetMemPool)
EXPORT(cudaMemPoolGetAttribute, r_cudaMemPoolGetAttribute)
EXPORT(cudaMemPoolSetAttribute, r_cudaMemPoolSetAttribute)
EXPORT(cudaMemPoolTrimTo, r_cudaMemPoolTrimTo)
EXPORT(cudaIpcGetMemHandle, r_cudaIpcGetMemHandle)
EXPORT(cudaIpcOpenMemHandle, r_cudaIpcOpenMemHandle)
EXPORT(cudaIpcCloseMemHandle, r_cudaIpcCloseMemHandle)
EXPORT(cudaStreamCreate, r_cudaStreamCreate)
EXPORT(cudaStreamCreateWithFlags, r_cudaStreamCreateWithFlags)
EXPORT(cudaStreamDestroy, r_cudaStreamDestroy)
EXPORT(cudaStreamSynchronize, r_cudaStreamSynchronize)
EXPORT(cudaStreamSynchronize_ptsz, r_cudaStreamSynchronize_ptsz)
EXPORT(cudaStreamQuery, r_cudaStreamQuery)
EXPORT(cudaLaunchKernel, r_cudaLaunchKernel)
EXPORT(cudaStreamQuery_ptsz, r_cudaStreamQuery_ptsz)
EXPORT(cudaStreamWaitEvent, r_cudaStreamWaitEvent)
EXPORT(cudaStreamWaitEvent_ptsz, r_cudaStreamWaitEvent_ptsz)
EXPORT(cudaStreamBeginCapture, r_cudaStreamBeginCapture)
EXPORT(cudaStreamBeginCapture_ptsz, r_cudaStreamBeginCapture_ptsz)
EXPORT(cudaStreamEndCapture, r_cudaStreamEndCapture)
EXPORT(cudaStreamEndCapture_ptsz, r_cudaStreamEndCapture_ptsz)
EXPORT(cudaStreamIsCapturing, r_cudaStreamIsCapturing)
EXPORT(cudaStreamIsCapturing_ptsz, r_cudaStreamIsCapturing_ptsz)
EXPORT(cudaThreadExchangeStreamCaptureMode, r_cudaThreadExchangeStreamCaptureMode)
EXPORT(cudaGraphDestroy, r_cudaGraphDestroy)
EXPORT(cudaEventCreate, r_cudaEventCreate)
EXPORT(cudaEventCreateWithFlags, r_cudaEventCreateWithFlags)
EXPORT(cudaEventRecord, r_cudaEventRecord)
EXPORT(cudaEventRecord_ptsz, r_cudaEventRecord_ptsz)
EXPORT(cudaEventQuery, r_cudaEventQuery)
EXPORT(cudaEventSynchronize, r_cudaEventSynchronize)
EXPORT(cudaEventDestroy, r_cudaEventDestroy)
