/* hook_rt.c: the runtime-level entry points a shared-runtime program (PyTorch, a program
 * built with -cudart shared) binds to: cudaMalloc, cudaFree, cudaMallocAsync,
 * cudaFreeAsync and their per-thread-default-stream (_ptsz) variants.
 *
 * They serve straight from the pool (alloc.c) and reach the real runtime (found with
 * RTLD_NEXT) only for what the shim does not own: a pointer it did not hand out, an
 * allocation made while a stream is being captured, a context the runtime has not
 * initialised yet. A statically linked runtime never calls these: its allocations
 * arrive at the driver hooks instead (hook_drv.c). */
#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include "vmmshim/alloc.h"

typedef cudaError_t (*rt_malloc_fn)(void **, size_t);
typedef cudaError_t (*rt_free_fn)(void *);
typedef cudaError_t (*rt_malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*rt_free_async_fn)(void *, cudaStream_t);

static void *rt_real(void **slot, const char *name) {
  void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (vs_likely(fn != NULL)) return fn;
  fn = _vs_real_dlsym(RTLD_NEXT, name);
  if (!fn) _vs_error("%s: no CUDA runtime library after the shim to forward to", name);
  __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
  return fn;
}

static void *real_malloc, *real_free, *real_malloc_async, *real_free_async, *real_malloc_async_ptsz,
    *real_free_async_ptsz;

static cudaError_t to_cuda_error(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS: return cudaSuccess;
  case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
  case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
  case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
  case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
  case CUDA_ERROR_LAUNCH_FAILED: return cudaErrorLaunchFailure;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
  case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
  default: return cudaErrorUnknown;
  }
}

/* The runtime creates the primary context on its first call; cudaFree(NULL) is the
 * conventional way to make it do so without side effects. */
static void rt_init_context(void) {
  rt_free_fn f = (rt_free_fn)rt_real(&real_free, "cudaFree");
  if (!f) return;
  _vs_guard++;
  f(NULL);
  _vs_guard--;
}

/* Serves an allocation from the pool. Returns true when handled (result in *out). */
static bool rt_alloc(vmmshim_api_t api, void **ptr, size_t size, CUstream key, cudaError_t *out) {
  if (!ptr) return false;
  for (int tries = 0; tries < 2; tries++) {
    CUdeviceptr p = 0;
    CUresult err = CUDA_SUCCESS;
    switch (_vs_alloc(api, size, key, &p, &err)) {
    case VS_ALLOC_SERVED: *ptr = (void *)(uintptr_t)p; *out = cudaSuccess; return true;
    case VS_ALLOC_FAILED: *out = to_cuda_error(err); return true;
    case VS_ALLOC_NO_CONTEXT: rt_init_context(); break;
    default: return false;
    }
  }
  return false;
}

static cudaError_t rt_bad_free(const char *api, void *ptr, cudaError_t r) {
  if (r != cudaSuccess && ptr && _vs_active())
    _vs_warn("%s(%p): not a live allocation of this process: error %d", api, ptr, (int)r);
  return r;
}

VS_API cudaError_t cudaMalloc(void **devPtr, size_t size) {
  _vs_tl_alloc_caller = __builtin_return_address(0); /* the call site, for tag rules */
  cudaError_t out;
  if (rt_alloc(VMMSHIM_API_RUNTIME, devPtr, size, VS_NO_STREAM, &out)) return out;
  rt_malloc_fn real = (rt_malloc_fn)rt_real(&real_malloc, "cudaMalloc");
  if (!real) return cudaErrorInitializationError;
  _vs_guard++;
  cudaError_t r = real(devPtr, size);
  _vs_guard--;
  return r;
}

VS_API cudaError_t cudaFree(void *devPtr) {
  CUresult err;
  if (devPtr && _vs_free(VMMSHIM_API_RUNTIME, (CUdeviceptr)(uintptr_t)devPtr, VS_NO_STREAM, &err))
    return to_cuda_error(err);
  rt_free_fn real = (rt_free_fn)rt_real(&real_free, "cudaFree");
  if (!real) return cudaErrorInitializationError;
  _vs_guard++;
  cudaError_t r = real(devPtr);
  _vs_guard--;
  return _vs_guard ? r : rt_bad_free("cudaFree", devPtr, r);
}

static cudaError_t malloc_async(void **slot, const char *name, void **devPtr, size_t size, cudaStream_t s,
                                CUstream key) {
  cudaError_t out;
  if (rt_alloc(VMMSHIM_API_RUNTIME_ASYNC, devPtr, size, key, &out)) return out;
  rt_malloc_async_fn real = (rt_malloc_async_fn)rt_real(slot, name);
  if (!real) return cudaErrorInitializationError;
  _vs_guard++;
  cudaError_t r = real(devPtr, size, s);
  _vs_guard--;
  return r;
}

static cudaError_t free_async(void **slot, const char *name, void *devPtr, cudaStream_t s, CUstream key) {
  CUresult err;
  if (devPtr && _vs_free(VMMSHIM_API_RUNTIME_ASYNC, (CUdeviceptr)(uintptr_t)devPtr, key, &err))
    return to_cuda_error(err);
  rt_free_async_fn real = (rt_free_async_fn)rt_real(slot, name);
  if (!real) return cudaErrorInitializationError;
  _vs_guard++;
  cudaError_t r = real(devPtr, s);
  _vs_guard--;
  return _vs_guard ? r : rt_bad_free(name, devPtr, r);
}

/* cudaDeviceReset destroys every allocation of the device's primary context. The runtime
 * does it through private driver entry points the shim cannot see, so the pool of the
 * current context is dropped here first (a statically linked runtime's reset stays
 * invisible: see README). */
VS_API cudaError_t cudaDeviceReset(void) {
  typedef cudaError_t (*reset_fn)(void);
  static void *real_reset;
  reset_fn real = (reset_fn)rt_real(&real_reset, "cudaDeviceReset");
  if (!real) return cudaErrorInitializationError;
  if (!_vs_guard && _vs_active()) {
    CUcontext ctx = NULL;
    if (_vs_cu.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx) {
      _vs_cu.cuCtxSynchronize(); /* nothing may still run on memory about to be unmapped */
      _vs_drop_context(ctx, -1);
    }
  }
  _vs_guard++;
  cudaError_t r = real();
  _vs_guard--;
  return r;
}

/* Stream 0 means the legacy default stream, or in the _ptsz variants the thread's own. */
VS_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s) {
  _vs_tl_alloc_caller = __builtin_return_address(0); /* the call site, for tag rules */
  return malloc_async(&real_malloc_async, "cudaMallocAsync", devPtr, size, s, _vs_stream_named((CUstream)s, 0));
}
VS_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s) {
  _vs_tl_alloc_caller = __builtin_return_address(0); /* the call site, for tag rules */
  return malloc_async(&real_malloc_async_ptsz, "cudaMallocAsync_ptsz", devPtr, size, s,
                      _vs_stream_named((CUstream)s, 1));
}
VS_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s) {
  return free_async(&real_free_async, "cudaFreeAsync", devPtr, s, _vs_stream_named((CUstream)s, 0));
}
VS_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s) {
  return free_async(&real_free_async_ptsz, "cudaFreeAsync_ptsz", devPtr, s, _vs_stream_named((CUstream)s, 1));
}
