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
  X(ARRAY_DESTROY, "cuArrayDestroy", 2000, cuArrayDestroy)

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

/* Whether a successful call is the program's, to be counted. */
static bool counted(CUresult r) { return r == CUDA_SUCCESS && !_vs_guard && _vs_active(); }

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
static void array_made(CUresult r, CUarray *arr, size_t before) {
  size_t after = r == CUDA_SUCCESS && arr ? free_now() : before;
  if (before > after) _vs_outside_made(VS_OUTSIDE_ARRAY, (uintptr_t)*arr, before - after, current_device(), 0,
                                       _vs_outside_caller(), NULL);
}

VS_API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
  typedef CUresult (*fn_t)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
  fn_t real = REAL(ARRAY, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  bool ours = !_vs_guard && _vs_active();
  size_t before = ours ? free_now() : 0;
  CUresult r = real(arr, desc);
  if (ours) array_made(r, arr, before);
  return r;
}

VS_API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
  typedef CUresult (*fn_t)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
  fn_t real = REAL(ARRAY_3D, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  bool ours = !_vs_guard && _vs_active();
  size_t before = ours ? free_now() : 0;
  CUresult r = real(arr, desc);
  if (ours) array_made(r, arr, before);
  return r;
}

VS_API CUresult cuArrayDestroy(CUarray arr) {
  typedef CUresult (*fn_t)(CUarray);
  fn_t real = REAL(ARRAY_DESTROY, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(arr);
  if (counted(r)) _vs_outside_freed(VS_OUTSIDE_ARRAY, (uintptr_t)arr);
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
