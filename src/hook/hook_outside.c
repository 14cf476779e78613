/* hook_outside.c: the driver entry points that make memory outside the shim's pools, and map it.
 *
 * Libraries make memory of their own: NCCL and JAX's allocator map cuMemCreate handles, programs
 * ask for managed memory and pinned host buffers. The shim serves none of it: each hook calls the
 * driver, and when it agreed, tells src/alloc/outside.c what was made or freed and who asked (the
 * residue after a sleep names them, docs/sleep.md). The shim's own VMM calls go to the driver
 * directly (src/vmm/vmm.c through _vs_cu), never through these hooks, and calls made under the
 * guard (the shim's calls into the runtime) are not counted. hook_drv.c answers lookups from
 * this list after its own and hook_gated.c's. */
#include "vmmshim/hook.h"

#define VS_OUTSIDE_HOOKS(X)                                                                   \
  X(CREATE, "cuMemCreate", 10020, cuMemCreate)                                                \
  X(RELEASE, "cuMemRelease", 10020, cuMemRelease)                                             \
  X(MAP, "cuMemMap", 10020, cuMemMap)                                                         \
  X(UNMAP, "cuMemUnmap", 10020, cuMemUnmap)                                                   \
  X(SET_ACCESS, "cuMemSetAccess", 10020, cuMemSetAccess)                                      \
  X(IMPORT, "cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle)          \
  X(MANAGED, "cuMemAllocManaged", 6000, cuMemAllocManaged)                                    \
  X(HOST, "cuMemAllocHost", 3020, cuMemAllocHost_v2)                                          \
  X(HOST_ALLOC, "cuMemHostAlloc", 2020, cuMemHostAlloc)                                       \
  X(FREE_HOST, "cuMemFreeHost", 2000, cuMemFreeHost)                                         \
  X(ARRAY, "cuArrayCreate", 3020, cuArrayCreate_v2)                                           \
  X(ARRAY_3D, "cuArray3DCreate", 3020, cuArray3DCreate_v2)                                    \
  X(ARRAY_DESTROY, "cuArrayDestroy", 2000, cuArrayDestroy)                                    \
  X(MIPMAP, "cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate)                           \
  X(MIPMAP_DESTROY, "cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy)                 \
  X(CTX_CREATE_V4, "cuCtxCreate", 12050, cuCtxCreate_v4)                                      \
  X(CTX_CREATE_V3, "cuCtxCreate", 11040, cuCtxCreate_v3)                                      \
  X(CTX_CREATE_V2, "cuCtxCreate", 3020, cuCtxCreate_v2)                                       \
  X(PRIMARY_RETAIN, "cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain)               \
  X(PRIMARY_RELEASE, "cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2)        \
  X(MODULE_LOAD, "cuModuleLoad", 2000, cuModuleLoad)                                          \
  X(MODULE_LOAD_DATA, "cuModuleLoadData", 2000, cuModuleLoadData)                             \
  X(MODULE_LOAD_DATA_EX, "cuModuleLoadDataEx", 2010, cuModuleLoadDataEx)                      \
  X(MODULE_LOAD_FATBIN, "cuModuleLoadFatBinary", 2000, cuModuleLoadFatBinary)                 \
  X(MODULE_UNLOAD, "cuModuleUnload", 2000, cuModuleUnload)                                    \
  X(LIBRARY_LOAD_DATA, "cuLibraryLoadData", 12000, cuLibraryLoadData)                         \
  X(LIBRARY_LOAD_FILE, "cuLibraryLoadFromFile", 12000, cuLibraryLoadFromFile)                 \
  X(LIBRARY_UNLOAD, "cuLibraryUnload", 12000, cuLibraryUnload)

typedef enum vs_outside_hook_e {
#define VS_OUT_ENUM(id, base, ver, sym) VS_OUT_##id,
  VS_OUTSIDE_HOOKS(VS_OUT_ENUM)
#undef VS_OUT_ENUM
  VS_OUT_COUNT
} vs_outside_hook_t;

#define VS_OUT_DECL(id, base, ver, sym) static void *vs_out_addr_##id(void);
VS_OUTSIDE_HOOKS(VS_OUT_DECL)
#undef VS_OUT_DECL

const vs_hook_desc_t _vs_outside_hooks[] = {
#define VS_OUT_DESC(id, base, ver, sym) {base, #sym, ver, 0, vs_out_addr_##id},
    VS_OUTSIDE_HOOKS(VS_OUT_DESC)
#undef VS_OUT_DESC
};
const int _vs_outside_count = VS_OUT_COUNT;
void *_vs_outside_real[VS_OUT_COUNT];

#define REAL(id, type) ((type)_vs_hook_real(&_vs_outside_hooks[VS_OUT_##id], &_vs_outside_real[VS_OUT_##id]))

/* Whether a call is the program's (not the shim's own, under the guard) while the shim is
 * active: only those are counted and measured. */
static bool measured(void) { return !_vs_guard && _vs_active(); }

/* Whether a successful call is the program's, to be counted. */
static bool counted(CUresult r) { return r == CUDA_SUCCESS && measured(); }

static int current_device(void) {
  CUdevice d = -1;
  return _vs_cu.cuCtxGetDevice && _vs_cu.cuCtxGetDevice(&d) == CUDA_SUCCESS ? (int)d : -1;
}

VS_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  fn_t real = REAL(CREATE, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(handle, size, prop, flags);
  if (counted(r) && handle && prop) {
    bool on_host = prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE; /* host-location handles: host memory */
    _vs_outside_made(on_host ? VS_OUTSIDE_HOST : VS_OUTSIDE_VMM, *handle, size, on_host ? -1 : prop->location.id,
                     prop->requestedHandleTypes ? VS_OUTSIDE_EXPORTABLE : 0, _vs_outside_caller(), prop);
  }
  return r;
}

/* A handle a foreign wake made again is known to the program by its old value: translated. One
 * still asleep was released by the shim already: its copy goes, and the release is done. */
VS_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle);
  fn_t real = REAL(RELEASE, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  void *asleep = NULL;
  if (!_vs_guard && atomic_load(&_vs_state) == 1) handle = _vs_outside_release_begin(handle, &asleep);
  if (asleep) {
    _vs_outside_freed(VS_OUTSIDE_VMM, handle);
    _vs_foreign_drop(asleep);
    return CUDA_SUCCESS;
  }
  CUresult r = real(handle);
  if (counted(r) && !_vs_outside_freed(VS_OUTSIDE_VMM, handle)) _vs_outside_freed(VS_OUTSIDE_HOST, handle);
  return r;
}

VS_API CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
  typedef CUresult (*fn_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  fn_t real = REAL(MAP, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  bool ours = !_vs_guard && atomic_load(&_vs_state) == 1;
  if (ours) handle = _vs_outside_current(handle);
  CUresult r = real(va, size, offset, handle, flags);
  if (ours && r == CUDA_SUCCESS) _vs_outside_mapped(va, size, offset, handle);
  return r;
}

/* An unmap of memory a foreign sleep took is done already. */
VS_API CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  typedef CUresult (*fn_t)(CUdeviceptr, size_t);
  fn_t real = REAL(UNMAP, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  bool ours = !_vs_guard && atomic_load(&_vs_state) == 1;
  if (ours && _vs_outside_unmapped(va, size, true)) return CUDA_SUCCESS;
  CUresult r = real(va, size);
  if (ours && r == CUDA_SUCCESS) _vs_outside_unmapped(va, size, false);
  return r;
}

VS_API CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count) {
  typedef CUresult (*fn_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  fn_t real = REAL(SET_ACCESS, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(va, size, desc, count);
  if (r == CUDA_SUCCESS && desc && !_vs_guard && atomic_load(&_vs_state) == 1) _vs_outside_access(va, size, desc, count);
  return r;
}

/* An imported handle is another process's memory: noted (a foreign sleep leaves it), not counted. */
VS_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                               CUmemAllocationHandleType type) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
  fn_t real = REAL(IMPORT, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(handle, os_handle, type);
  if (counted(r) && handle) _vs_outside_made(VS_OUTSIDE_VMM, *handle, 0, -1, VS_OUTSIDE_IMPORTED, _vs_outside_caller(), NULL);
  return r;
}

VS_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
  typedef CUresult (*fn_t)(CUdeviceptr *, size_t, unsigned int);
  fn_t real = REAL(MANAGED, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(dptr, size, flags);
  if (counted(r) && dptr) _vs_outside_made(VS_OUTSIDE_MANAGED, *dptr, size, current_device(), 0, _vs_outside_caller(), NULL);
  return r;
}

VS_API CUresult cuMemAllocHost_v2(void **pp, size_t size) {
  typedef CUresult (*fn_t)(void **, size_t);
  fn_t real = REAL(HOST, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(pp, size);
  if (counted(r) && pp) _vs_outside_made(VS_OUTSIDE_HOST, (uintptr_t)*pp, size, -1, 0, _vs_outside_caller(), NULL);
  return r;
}

VS_API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
  typedef CUresult (*fn_t)(void **, size_t, unsigned int);
  fn_t real = REAL(HOST_ALLOC, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(pp, size, flags);
  if (counted(r) && pp) _vs_outside_made(VS_OUTSIDE_HOST, (uintptr_t)*pp, size, -1, 0, _vs_outside_caller(), NULL);
  return r;
}

VS_API CUresult cuMemFreeHost(void *p) {
  typedef CUresult (*fn_t)(void *);
  fn_t real = REAL(FREE_HOST, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(p);
  if (counted(r)) _vs_outside_freed(VS_OUTSIDE_HOST, (uintptr_t)p);
  return r;
}

/* An array's size is the driver's own (padding, alignment): it counts as the free memory its
 * creation took in the current context (what another thread allocates meanwhile counts too; an
 * array made of memory the driver already held counts nothing). */
static size_t free_now(void) {
  size_t f = 0, t = 0;
  return _vs_cu.cuMemGetInfo && _vs_cu.cuMemGetInfo(&f, &t) == CUDA_SUCCESS ? f : 0;
}
static void array_made(CUresult r, uintptr_t key, size_t before) {
  size_t after = r == CUDA_SUCCESS && key ? free_now() : before;
  if (before > after) _vs_outside_made(VS_OUTSIDE_ARRAY, key, before - after, current_device(), 0,
                                       _vs_outside_caller(), NULL);
}

/* Calls the driver with the free memory measured around the call, for the array it makes in
 * *arr. */
#define VS_ARRAY_MADE(arr, call)                                                             \
  do {                                                                                       \
    bool ours_ = measured();                                                                 \
    size_t before_ = ours_ ? free_now() : 0;                                                 \
    CUresult r_ = (call);                                                                    \
    if (ours_) array_made(r_, r_ == CUDA_SUCCESS && (arr) ? (uintptr_t)*(arr) : 0, before_); \
    return r_;                                                                               \
  } while (0)

/* An array (or mipmapped array) destroyed: the driver's answer, the array uncounted. */
static CUresult array_gone(CUresult r, uintptr_t key) {
  if (counted(r)) _vs_outside_freed(VS_OUTSIDE_ARRAY, key);
  return r;
}

VS_API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
  typedef CUresult (*fn_t)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
  fn_t real = REAL(ARRAY, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  VS_ARRAY_MADE(arr, real(arr, desc));
}

VS_API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
  typedef CUresult (*fn_t)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
  fn_t real = REAL(ARRAY_3D, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  VS_ARRAY_MADE(arr, real(arr, desc));
}

VS_API CUresult cuArrayDestroy(CUarray arr) {
  typedef CUresult (*fn_t)(CUarray);
  fn_t real = REAL(ARRAY_DESTROY, fn_t);
  return real ? array_gone(real(arr), (uintptr_t)arr) : CUDA_ERROR_NOT_INITIALIZED;
}

/* A mipmapped array counts as an array, by the free memory its creation took. */
VS_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
  typedef CUresult (*fn_t)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
  fn_t real = REAL(MIPMAP, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  VS_ARRAY_MADE(arr, real(arr, desc, levels));
}

VS_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr) {
  typedef CUresult (*fn_t)(CUmipmappedArray);
  fn_t real = REAL(MIPMAP_DESTROY, fn_t);
  return real ? array_gone(real(arr), (uintptr_t)arr) : CUDA_ERROR_NOT_INITIALIZED;
}

/* ------------------------------------------------------------------ contexts and modules */
/* What a context or module takes is the free memory its creation took (src/alloc/ctxmem.c).
 * Only the program's calls are measured, and only while the shim is active. */

/* cuCtxCreate_v2 and _v3 are not declared by CUDA 13's header. */
VS_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
VS_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev);

#define VS_MEASURED(kind, dev, call, key, primary)                        \
  do {                                                                    \
    bool on_ = measured();                                                \
    vs_ctxmem_probe_t p_;                                                 \
    if (on_) _vs_ctxmem_before(&p_, (dev), (kind));                       \
    CUresult r_ = (call);                                                 \
    if (on_ && r_ == CUDA_SUCCESS) _vs_ctxmem_after(&p_, (key), primary); \
    return r_;                                                            \
  } while (0)

VS_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
  typedef CUresult (*fn_t)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
  fn_t real = REAL(CTX_CREATE_V4, fn_t);
  if (!real || !pctx) return real ? real(pctx, params, flags, dev) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_CONTEXT, dev, real(pctx, params, flags, dev), (uintptr_t)*pctx, false);
}

VS_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev) {
  typedef CUresult (*fn_t)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
  fn_t real = REAL(CTX_CREATE_V3, fn_t);
  if (!real || !pctx) return real ? real(pctx, params, n, flags, dev) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_CONTEXT, dev, real(pctx, params, n, flags, dev), (uintptr_t)*pctx, false);
}

VS_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  typedef CUresult (*fn_t)(CUcontext *, unsigned int, CUdevice);
  fn_t real = REAL(CTX_CREATE_V2, fn_t);
  if (!real || !pctx) return real ? real(pctx, flags, dev) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_CONTEXT, dev, real(pctx, flags, dev), (uintptr_t)*pctx, false);
}

/* Only a retain that makes the primary context (it was inactive) takes memory. */
VS_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  typedef CUresult (*fn_t)(CUcontext *, CUdevice);
  fn_t real = REAL(PRIMARY_RETAIN, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  unsigned flags = 0;
  int active = 1;
  if (!pctx || !measured() || !_vs_cu.cuDevicePrimaryCtxGetState ||
      _vs_cu.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || active)
    return real(pctx, dev);
  VS_MEASURED(VS_CTXMEM_CONTEXT, dev, real(pctx, dev), (uintptr_t)*pctx, true);
}

/* The last release ends the primary context: its figure goes. */
VS_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  typedef CUresult (*fn_t)(CUdevice);
  fn_t real = REAL(PRIMARY_RELEASE, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(dev);
  unsigned flags = 0;
  int active = 1;
  if (r == CUDA_SUCCESS && measured() && _vs_cu.cuDevicePrimaryCtxGetState &&
      _vs_cu.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active)
    _vs_ctxmem_primary_gone(dev);
  return r;
}

VS_API CUresult cuModuleLoad(CUmodule *mod, const char *fname) {
  typedef CUresult (*fn_t)(CUmodule *, const char *);
  fn_t real = REAL(MODULE_LOAD, fn_t);
  if (!real || !mod) return real ? real(mod, fname) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_MODULE, -1, real(mod, fname), (uintptr_t)*mod, false);
}

VS_API CUresult cuModuleLoadData(CUmodule *mod, const void *image) {
  typedef CUresult (*fn_t)(CUmodule *, const void *);
  fn_t real = REAL(MODULE_LOAD_DATA, fn_t);
  if (!real || !mod) return real ? real(mod, image) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_MODULE, -1, real(mod, image), (uintptr_t)*mod, false);
}

VS_API CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, CUjit_option *opts, void **vals) {
  typedef CUresult (*fn_t)(CUmodule *, const void *, unsigned int, CUjit_option *, void **);
  fn_t real = REAL(MODULE_LOAD_DATA_EX, fn_t);
  if (!real || !mod) return real ? real(mod, image, n, opts, vals) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_MODULE, -1, real(mod, image, n, opts, vals), (uintptr_t)*mod, false);
}

VS_API CUresult cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin) {
  typedef CUresult (*fn_t)(CUmodule *, const void *);
  fn_t real = REAL(MODULE_LOAD_FATBIN, fn_t);
  if (!real || !mod) return real ? real(mod, fatbin) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_MODULE, -1, real(mod, fatbin), (uintptr_t)*mod, false);
}

VS_API CUresult cuModuleUnload(CUmodule mod) {
  typedef CUresult (*fn_t)(CUmodule);
  fn_t real = REAL(MODULE_UNLOAD, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(mod);
  if (counted(r)) _vs_ctxmem_gone((uintptr_t)mod);
  return r;
}

/* A library loads into the current context at once, or (lazy loading, no context) later: a
 * load measured without a current context would be none of its memory, and is not counted. */
VS_API CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int njo,
                                  CUlibraryOption *lo, void **lv, unsigned int nlo) {
  typedef CUresult (*fn_t)(CUlibrary *, const void *, CUjit_option *, void **, unsigned int, CUlibraryOption *,
                           void **, unsigned int);
  fn_t real = REAL(LIBRARY_LOAD_DATA, fn_t);
  if (!real || !lib) return real ? real(lib, code, jo, jv, njo, lo, lv, nlo) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_MODULE, -1, real(lib, code, jo, jv, njo, lo, lv, nlo), (uintptr_t)*lib, false);
}

VS_API CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *file, CUjit_option *jo, void **jv, unsigned int njo,
                                      CUlibraryOption *lo, void **lv, unsigned int nlo) {
  typedef CUresult (*fn_t)(CUlibrary *, const char *, CUjit_option *, void **, unsigned int, CUlibraryOption *,
                           void **, unsigned int);
  fn_t real = REAL(LIBRARY_LOAD_FILE, fn_t);
  if (!real || !lib) return real ? real(lib, file, jo, jv, njo, lo, lv, nlo) : CUDA_ERROR_NOT_INITIALIZED;
  VS_MEASURED(VS_CTXMEM_MODULE, -1, real(lib, file, jo, jv, njo, lo, lv, nlo), (uintptr_t)*lib, false);
}

VS_API CUresult cuLibraryUnload(CUlibrary lib) {
  typedef CUresult (*fn_t)(CUlibrary);
  fn_t real = REAL(LIBRARY_UNLOAD, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(lib);
  if (counted(r)) _vs_ctxmem_gone((uintptr_t)lib);
  return r;
}

/* Managed memory leaves through cuMemFree: hook_drv.c tells, after the driver agreed. */
void _vs_hook_outside_freed(CUdeviceptr dptr) {
  if (!_vs_guard && atomic_load(&_vs_state) == 1) _vs_outside_freed(VS_OUTSIDE_MANAGED, dptr);
}

#define VS_OUT_ADDR(id, base, ver, sym) \
  static void *vs_out_addr_##id(void) { return (void *)(sym); }
VS_OUTSIDE_HOOKS(VS_OUT_ADDR)
#undef VS_OUT_ADDR
