/* cuda.c: finds the real driver.
 *
 * The shim links against neither libcuda nor libcudart. On first use it opens
 * libcuda.so.1 (a CUDA program has it loaded already, or is about to), takes the
 * driver's own cuGetProcAddress_v2 with glibc's dlsym, and asks it for every driver
 * function the shim calls. Those pointers are the real ones, so the shim's own calls
 * never pass through its hooks. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "vmmshim/base.h"

vs_real_driver_t _vs_cu;
vs_get_proc_v2_fn _vs_real_get_proc_v2;

typedef void *(*vs_dlsym_fn)(void *, const char *);
static vs_dlsym_fn vs_glibc_dlsym;

VS_NO_SANITIZE void *_vs_real_dlsym(void *handle, const char *symbol) {
  vs_dlsym_fn fn = __atomic_load_n(&vs_glibc_dlsym, __ATOMIC_ACQUIRE);
  if (!fn) {
    /* dlvsym is not interposed; glibc 2.34 moved dlsym into libc under a new version. */
    fn = (vs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!fn) fn = (vs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!fn) return NULL;
    __atomic_store_n(&vs_glibc_dlsym, fn, __ATOMIC_RELEASE);
  }
  return fn(handle, symbol);
}

static int vs_resolve_status = 1; /* 1: not yet, 0: ok, -1: failed */
static vs_lock_t vs_resolve_lock = VS_LOCK_INITIALIZER(VS_RANK_RESOLVE, "resolve");

static int resolve_locked(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    _vs_warn("cannot load libcuda.so.1 (%s); passing every call through", dlerror());
    return -1;
  }
  vs_get_proc_v2_fn gpa = (vs_get_proc_v2_fn)_vs_real_dlsym(lib, "cuGetProcAddress_v2");
  if (!gpa) {
    _vs_warn("libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12.0?); passing every call through");
    return -1;
  }
  _vs_real_get_proc_v2 = gpa;
  int missing = 0;
#define VS_RESOLVE(name, ver, ret, args)                                                                \
  do {                                                                                               \
    void *fn = NULL;                                                                                 \
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                        \
    CUresult r = gpa(#name, &fn, ver, CU_GET_PROC_ADDRESS_DEFAULT, &st);                                                 \
    if (r != CUDA_SUCCESS || !fn) {                                                                  \
      _vs_warn("the driver has no %s (%s)", #name, _vs_cu_error_name(r));                            \
      missing++;                                                                                     \
    }                                                                                                \
    _vs_cu.name = (ret(*) args)fn;                                                                   \
  } while (0);
  VS_REAL_DRIVER(VS_RESOLVE)
#undef VS_RESOLVE
#define VS_RESOLVE_OPTIONAL(name, ver, ret, args)                                                  \
  do {                                                                                          \
    void *fn = NULL;                                                                            \
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                   \
    if (gpa(#name, &fn, ver, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS) fn = NULL;      \
    _vs_cu.name = (ret(*) args)fn;                                                              \
  } while (0);
  VS_REAL_DRIVER_OPTIONAL(VS_RESOLVE_OPTIONAL)
#undef VS_RESOLVE_OPTIONAL
  if (missing) {
    _vs_warn("%d driver functions missing; passing every call through", missing);
    return -1;
  }
  return 0;
}

int _vs_cuda_resolve(void) {
  int st = __atomic_load_n(&vs_resolve_status, __ATOMIC_ACQUIRE);
  if (st != 1) return st;
  _vs_lock_take(&vs_resolve_lock);
  st = vs_resolve_status;
  if (st == 1) {
    _vs_guard++; /* dlopen may run constructors that call back into CUDA */
    st = resolve_locked();
    _vs_guard--;
    __atomic_store_n(&vs_resolve_status, st, __ATOMIC_RELEASE);
  }
  _vs_lock_release(&vs_resolve_lock);
  return st;
}

/* The common codes by name with no driver; the driver names the rest once it is resolved. */
const char *_vs_cu_error_name(CUresult r) {
  switch (r) {
#define VS_ERR(e) case e: return #e;
    VS_ERR(CUDA_SUCCESS)
    VS_ERR(CUDA_ERROR_INVALID_VALUE)
    VS_ERR(CUDA_ERROR_OUT_OF_MEMORY)
    VS_ERR(CUDA_ERROR_NOT_INITIALIZED)
    VS_ERR(CUDA_ERROR_DEINITIALIZED)
    VS_ERR(CUDA_ERROR_NOT_PERMITTED)
    VS_ERR(CUDA_ERROR_NOT_SUPPORTED)
    VS_ERR(CUDA_ERROR_NO_DEVICE)
    VS_ERR(CUDA_ERROR_INVALID_DEVICE)
    VS_ERR(CUDA_ERROR_INVALID_CONTEXT)
    VS_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    VS_ERR(CUDA_ERROR_NOT_FOUND)
    VS_ERR(CUDA_ERROR_NOT_READY)
    VS_ERR(CUDA_ERROR_ILLEGAL_ADDRESS)
    VS_ERR(CUDA_ERROR_LAUNCH_FAILED)
    VS_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    VS_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    VS_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    VS_ERR(CUDA_ERROR_INVALID_HANDLE)
    VS_ERR(CUDA_ERROR_ALREADY_MAPPED)
    VS_ERR(CUDA_ERROR_NOT_MAPPED)
    VS_ERR(CUDA_ERROR_UNKNOWN)
#undef VS_ERR
  default: break;
  }
  const char *name = NULL;
  if (_vs_cu.cuGetErrorName && _vs_cu.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
  return "CUDA_ERROR_(unknown code)";
}
