/* hook_drv.c: the driver-level entry points.
 *
 * A program reaches a driver function in one of three ways, and each is covered:
 *   1. by symbol (linked with -lcuda): the shim exports cuMemAlloc_v2 and friends;
 *   2. by dlsym(libcuda, "cuMemAlloc_v2"): the shim's dlsym answers with its hook;
 *   3. through cuGetProcAddress: the CUDA runtime (static or shared), CuPy and JAX ask
 *      dlsym only for cuGetProcAddress_v2, then look up everything else through the
 *      pointer it returns; the shim wraps both and answers from the hook list below, then
 *      from hook_gated.c's (the entry points that submit GPU work).
 * A lookup the shim does not handle is passed on untouched. A hook is handed out only
 * when the driver's answer is the very function the shim was compiled against (same
 * ABI), so a newer variant of a function is never wrapped with an older signature. */
#include <dlfcn.h>
#include <string.h>

#include "vmmshim/hook.h"

/* cuda.h maps cuGetProcAddress to _v2; the shim also exports the original (CUDA 11.3) one. */
#undef cuGetProcAddress
/* ... and cuIpcOpenMemHandle to _v2 (CUDA 11.0, same arguments); both are exported. */
#undef cuIpcOpenMemHandle
/* ... and cuStreamBeginCapture to _v2; both are exported. */
#undef cuStreamBeginCapture

#define PTDS CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

/* The hook list: id, base name for cuGetProcAddress, minimum version, per-thread-stream
 * variant (1) or not (0), exported symbol. Every other table is generated from it. */
#define VS_HOOKS(X)                                                        \
  X(GET_PROC_V2, "cuGetProcAddress", 12000, 0, cuGetProcAddress_v2)        \
  X(GET_PROC_V1, "cuGetProcAddress", 11030, 0, cuGetProcAddress)           \
  X(MEM_ALLOC, "cuMemAlloc", 3020, 0, cuMemAlloc_v2)                       \
  X(MEM_FREE, "cuMemFree", 3020, 0, cuMemFree_v2)                          \
  X(MEM_ALLOC_ASYNC, "cuMemAllocAsync", 11020, 0, cuMemAllocAsync)         \
  X(MEM_ALLOC_ASYNC_PTSZ, "cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz) \
  X(MEM_FREE_ASYNC, "cuMemFreeAsync", 11020, 0, cuMemFreeAsync)            \
  X(MEM_FREE_ASYNC_PTSZ, "cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz)  \
  X(MEM_GET_INFO, "cuMemGetInfo", 3020, 0, cuMemGetInfo_v2)                \
  X(MEM_GET_RANGE, "cuMemGetAddressRange", 3020, 0, cuMemGetAddressRange_v2) \
  X(PTR_GET_ATTR, "cuPointerGetAttribute", 4000, 0, cuPointerGetAttribute) \
  X(PTR_GET_ATTRS, "cuPointerGetAttributes", 7000, 0, cuPointerGetAttributes) \
  X(BEGIN_CAPTURE, "cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2) \
  X(BEGIN_CAPTURE_PTSZ, "cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz) \
  X(BEGIN_CAPTURE_V1, "cuStreamBeginCapture", 10000, 0, cuStreamBeginCapture) \
  X(BEGIN_CAPTURE_V1_PTSZ, "cuStreamBeginCapture", 10000, 1, cuStreamBeginCapture_ptsz) \
  X(BEGIN_CAPTURE_GRAPH, "cuStreamBeginCaptureToGraph", 12030, 0, cuStreamBeginCaptureToGraph) \
  X(BEGIN_CAPTURE_GRAPH_PTSZ, "cuStreamBeginCaptureToGraph", 12030, 1, cuStreamBeginCaptureToGraph_ptsz) \
  X(END_CAPTURE, "cuStreamEndCapture", 10000, 0, cuStreamEndCapture)       \
  X(END_CAPTURE_PTSZ, "cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz) \
  X(STREAM_DESTROY, "cuStreamDestroy", 4000, 0, cuStreamDestroy_v2)        \
  X(CTX_DESTROY, "cuCtxDestroy", 4000, 0, cuCtxDestroy_v2)                 \
  X(PRIMARY_RESET, "cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2) \
  X(PEER_ENABLE, "cuCtxEnablePeerAccess", 4000, 0, cuCtxEnablePeerAccess) \
  X(PEER_DISABLE, "cuCtxDisablePeerAccess", 4000, 0, cuCtxDisablePeerAccess) \
  X(MEMPOOL_SET_ACCESS, "cuMemPoolSetAccess", 11020, 0, cuMemPoolSetAccess) \
  X(MEMPOOL_GET_ATTR, "cuMemPoolGetAttribute", 11020, 0, cuMemPoolGetAttribute) \
  X(MEMPOOL_SET_ATTR, "cuMemPoolSetAttribute", 11020, 0, cuMemPoolSetAttribute) \
  X(MEMPOOL_TRIM, "cuMemPoolTrimTo", 11020, 0, cuMemPoolTrimTo) \
  X(IPC_GET, "cuIpcGetMemHandle", 4010, 0, cuIpcGetMemHandle) \
  X(IPC_OPEN_V2, "cuIpcOpenMemHandle", 11000, 0, cuIpcOpenMemHandle_v2) \
  X(IPC_OPEN, "cuIpcOpenMemHandle", 4010, 0, cuIpcOpenMemHandle) \
  X(IPC_CLOSE, "cuIpcCloseMemHandle", 4010, 0, cuIpcCloseMemHandle)

typedef enum vs_hook_e {
#define VS_HOOK_ENUM(id, base, ver, ptsz, sym) VS_HOOK_##id,
  VS_HOOKS(VS_HOOK_ENUM)
#undef VS_HOOK_ENUM
  VS_HOOK_COUNT
} vs_hook_t;

/* The hooks themselves (defined below under their exported names). */
#define VS_HOOK_DECL(id, base, ver, ptsz, sym) static void *vs_hook_addr_##id(void);
VS_HOOKS(VS_HOOK_DECL)
#undef VS_HOOK_DECL

static const vs_hook_desc_t vs_hooks[VS_HOOK_COUNT] = {
#define VS_HOOK_DESC(id, base, ver, ptsz, sym) {base, #sym, VS_PTSZ_VERSION(ver, ptsz), ptsz, vs_hook_addr_##id},
    VS_HOOKS(VS_HOOK_DESC)
#undef VS_HOOK_DESC
};

/* The real function behind each hook, filled by whichever route meets it first. */
static void *vs_real[VS_HOOK_COUNT];

/* Every hook the lookups answer from: this file's, then the submissions' (hook_gated.c), in
 * that order (a lookup takes the first that fits). */
#define VS_HOOK_GATED_END (VS_HOOK_COUNT + _vs_gated_count)
#define VS_HOOK_ALL (VS_HOOK_GATED_END + _vs_outside_count) /* then hook_outside.c's */
static const vs_hook_desc_t *hook_at(int i) {
  return i < VS_HOOK_COUNT ? &vs_hooks[i] : i < VS_HOOK_GATED_END ? &_vs_gated_hooks[i - VS_HOOK_COUNT]
                                                                  : &_vs_outside_hooks[i - VS_HOOK_GATED_END];
}
static void **real_at(int i) {
  return i < VS_HOOK_COUNT ? &vs_real[i] : i < VS_HOOK_GATED_END ? &_vs_gated_real[i - VS_HOOK_COUNT]
                                                                 : &_vs_outside_real[i - VS_HOOK_GATED_END];
}

void *_vs_hook_resolve(const vs_hook_desc_t *h, void **real) {
  void *fn = __atomic_load_n(real, __ATOMIC_ACQUIRE);
  if (vs_likely(fn != NULL)) return fn;
  _vs_init_once();
  if (h == &vs_hooks[VS_HOOK_GET_PROC_V2] || h == &vs_hooks[VS_HOOK_GET_PROC_V1]) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    fn = lib ? _vs_real_dlsym(lib, h->symbol) : NULL;
  } else if (_vs_cuda_resolve() == 0 || _vs_real_get_proc_v2) {
    CUdriverProcAddressQueryResult st;
    if (_vs_real_get_proc_v2(h->base, &fn, h->min_version, h->ptsz ? PTDS : 0, &st) != CUDA_SUCCESS) fn = NULL;
  }
  if (!fn) {
    _vs_error("cannot find the driver's %s", h->symbol);
    return NULL;
  }
  __atomic_store_n(real, fn, __ATOMIC_RELEASE);
  return fn;
}

static void *real_fn(vs_hook_t id) { return _vs_hook_real(&vs_hooks[id], &vs_real[id]); }

#define REAL(id, type) ((type)real_fn(VS_HOOK_##id))
#define CALL_REAL(id, type, ...)                                        \
  do {                                                                  \
    type fn_ = REAL(id, type);                                          \
    if (!fn_) return CUDA_ERROR_NOT_INITIALIZED;                        \
    return fn_(__VA_ARGS__);                                            \
  } while (0)

/* Which hook answers a lookup of (symbol, version, flags), or -1. */
static int hook_for_lookup(const char *symbol, int version, cuuint64_t flags) {
  if (!symbol || symbol[0] != 'c' || symbol[1] != 'u') return -1;
  int want_ptsz = (flags & PTDS) ? 1 : 0;
  int fallback = -1;
  for (int i = 0; i < VS_HOOK_ALL; i++) {
    const vs_hook_desc_t *h = hook_at(i);
    if (strcmp(symbol, h->base) != 0 || version < h->min_version) continue;
    if (i == VS_HOOK_GET_PROC_V1 && version >= 12000) continue;
    if (h->ptsz == want_ptsz) return i;
    if (!h->ptsz) fallback = i;
  }
  /* A per-thread lookup of a function that has a _ptsz variant never falls back. */
  if (fallback >= 0 && want_ptsz)
    for (int i = 0; i < VS_HOOK_ALL; i++)
      if (hook_at(i)->ptsz && !strcmp(hook_at(i)->base, symbol)) return -1;
  return fallback;
}

/* Whether a hook submits work (or begins a capture): order.c must see every such call. */
static bool submits(int id) {
  return (id >= VS_HOOK_COUNT && id < VS_HOOK_GATED_END) ||
         (id >= VS_HOOK_BEGIN_CAPTURE && id <= VS_HOOK_BEGIN_CAPTURE_GRAPH_PTSZ);
}

/* Whether a driver symbol is a variant of a function that submits work: its base name,
 * maybe with a suffix (_v2, _ptsz ...). */
static bool submission_symbol(const char *symbol) {
  for (int i = 0; i < VS_HOOK_ALL; i++) {
    if (!submits(i)) continue;
    size_t n = strlen(hook_at(i)->base);
    if (!strncmp(symbol, hook_at(i)->base, n) && (symbol[n] == '\0' || symbol[n] == '_')) return true;
  }
  return false;
}

/* A submission path handed out without a hook (an ABI the shim was not written for): the
 * shim no longer sees all of the program's work. */
static void unseen_path(const char *symbol, int version, cuuint64_t flags) {
  if (_vs_order_view().state == VS_ORDER_OFF)
    _vs_debug("%s (version %d, flags %llu) is handed out without the shim's hook", symbol, version,
              (unsigned long long)flags);
  else
    _vs_info("%s (version %d, flags %llu) is handed out without the shim's hook", symbol, version,
             (unsigned long long)flags);
  _vs_order_leave("a submission entry point the shim does not wrap", true);
}

/* Called with the driver's answer to a lookup: swap in the hook when the answer is the
 * function the hook was written for. */
static void answer_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  if (!pfn || !*pfn) return;
  int id = hook_for_lookup(symbol, version, flags);
  if (id < 0) {
    if (symbol && submission_symbol(symbol)) unseen_path(symbol, version, flags);
    return;
  }
  const vs_hook_desc_t *h = hook_at(id);
  void *hook = h->hook();
  if (*pfn == hook) return;
  if (id != VS_HOOK_GET_PROC_V2 && id != VS_HOOK_GET_PROC_V1 && version != h->min_version &&
      _vs_real_get_proc_v2) {
    /* Wrap only the ABI the hook was written for: a newer version may have other arguments. */
    void *known = NULL;
    CUdriverProcAddressQueryResult st;
    if (_vs_real_get_proc_v2(symbol, &known, h->min_version, flags, &st) != CUDA_SUCCESS || known != *pfn) {
      if (submits(id)) unseen_path(symbol, version, flags);
      return;
    }
  }
  void *prev = NULL;
  __atomic_compare_exchange_n(real_at(id), &prev, *pfn, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  *pfn = hook;
}

/* ------------------------------------------------------------------ lookups */

typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);

VS_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
  vs_get_proc_v2_fn real = REAL(GET_PROC_V2, vs_get_proc_v2_fn);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  if (!_vs_real_get_proc_v2) _vs_real_get_proc_v2 = real;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS) answer_lookup(symbol, pfn, version, flags); /* even under the guard: the table outlives this call */
  return r;
}

VS_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  get_proc_v1_fn real = REAL(GET_PROC_V1, get_proc_v1_fn);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS) answer_lookup(symbol, pfn, version, flags); /* even under the guard: the table outlives this call */
  return r;
}

/* dlsym: glibc's answer, with a hook swapped in for the driver functions the shim wraps.
 * Note: dlsym(RTLD_NEXT, ...) called by the program resolves relative to the shim. */
VS_API VS_NO_SANITIZE void *dlsym(void *handle, const char *symbol) {
  void *r = _vs_real_dlsym(handle, symbol);
  if (!r || symbol[0] != 'c' || symbol[1] != 'u') return r;
  for (int i = 0; i < VS_HOOK_ALL; i++) {
    if (strcmp(symbol, hook_at(i)->symbol) != 0) continue;
    void *hook = hook_at(i)->hook();
    if (r != hook) {
      void *prev = NULL;
      __atomic_compare_exchange_n(real_at(i), &prev, r, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
      if (i == VS_HOOK_GET_PROC_V2 && !_vs_real_get_proc_v2) _vs_real_get_proc_v2 = (vs_get_proc_v2_fn)r;
    }
    return hook;
  }
  if (submission_symbol(symbol)) unseen_path(symbol, 0, 0);
  return r;
}

/* ------------------------------------------------------------------ allocation */

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

VS_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  _vs_tl_alloc_caller = __builtin_return_address(0); /* the call site, for tag rules */
  CUresult err;
  switch (_vs_alloc(VMMSHIM_API_DRIVER, bytesize, VS_NO_STREAM, dptr, &err)) {
  case VS_ALLOC_SERVED: return CUDA_SUCCESS;
  case VS_ALLOC_FAILED: return err;
  default: break;
  }
  alloc_fn real = REAL(MEM_ALLOC, alloc_fn);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  _vs_guard++;
  CUresult r = real(dptr, bytesize);
  _vs_guard--;
  return r;
}

static CUresult report_bad_free(const char *api, CUdeviceptr ptr, CUresult r) {
  if (r != CUDA_SUCCESS && _vs_active())
    _vs_warn("%s(0x%llx): not a live allocation of this process: %s", api, (unsigned long long)ptr,
             _vs_cu_error_name(r));
  return r;
}

VS_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  CUresult err;
  if (_vs_free(VMMSHIM_API_DRIVER, dptr, VS_NO_STREAM, &err)) return err;
  free_fn real = REAL(MEM_FREE, free_fn);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  _vs_guard++;
  CUresult r = real(dptr);
  _vs_guard--;
  if (r == CUDA_SUCCESS && dptr) _vs_hook_outside_freed(dptr); /* managed memory (hook_outside.c) */
  return dptr && !_vs_guard ? report_bad_free("cuMemFree", dptr, r) : r;
}

static CUresult alloc_async(vs_hook_t id, CUdeviceptr *dptr, size_t bytesize, CUstream stream, CUstream key) {
  CUresult err;
  switch (_vs_alloc(VMMSHIM_API_DRIVER_ASYNC, bytesize, key, dptr, &err)) {
  case VS_ALLOC_SERVED: return CUDA_SUCCESS;
  case VS_ALLOC_FAILED: return err;
  default: break;
  }
  alloc_async_fn real = (alloc_async_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  _vs_guard++;
  CUresult r = real(dptr, bytesize, stream);
  _vs_guard--;
  return r;
}

static CUresult free_async(vs_hook_t id, CUdeviceptr dptr, CUstream stream, CUstream key) {
  CUresult err;
  if (_vs_free(VMMSHIM_API_DRIVER_ASYNC, dptr, key, &err)) return err;
  free_async_fn real = (free_async_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  _vs_guard++;
  CUresult r = real(dptr, stream);
  _vs_guard--;
  return dptr && !_vs_guard ? report_bad_free("cuMemFreeAsync", dptr, r) : r;
}

VS_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream h) {
  _vs_tl_alloc_caller = __builtin_return_address(0); /* the call site, for tag rules */
  return alloc_async(VS_HOOK_MEM_ALLOC_ASYNC, dptr, bytesize, h, _vs_stream_named(h, 0));
}
VS_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream h) {
  _vs_tl_alloc_caller = __builtin_return_address(0); /* the call site, for tag rules */
  return alloc_async(VS_HOOK_MEM_ALLOC_ASYNC_PTSZ, dptr, bytesize, h, _vs_stream_named(h, 1));
}
VS_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h) {
  return free_async(VS_HOOK_MEM_FREE_ASYNC, dptr, h, _vs_stream_named(h, 0));
}
VS_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h) {
  return free_async(VS_HOOK_MEM_FREE_ASYNC_PTSZ, dptr, h, _vs_stream_named(h, 1));
}

/* ------------------------------------------------------------------ queries */

VS_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  typedef CUresult (*fn_t)(size_t *, size_t *);
  fn_t real = REAL(MEM_GET_INFO, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(free_bytes, total_bytes);
  if (r == CUDA_SUCCESS) _vs_adjust_mem_info(free_bytes, total_bytes);
  return r;
}

VS_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
  CUdeviceptr base;
  size_t size;
  if (_vs_lookup_range(dptr, &base, &size)) {
    if (pbase) *pbase = base;
    if (psize) *psize = size;
    return CUDA_SUCCESS;
  }
  typedef CUresult (*fn_t)(CUdeviceptr *, size_t *, CUdeviceptr);
  CALL_REAL(MEM_GET_RANGE, fn_t, pbase, psize, dptr);
}

/* Range attributes describe the program's allocation, not the pool handle under it. Memory of a
 * tag asleep in mapped mode is host memory at the block's address: it is still described as the
 * device memory the program allocated (libraries check pointer types). */
static bool range_attribute(CUpointer_attribute a, void *data, CUdeviceptr ptr) {
  int dev = 0;
  if ((a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE || a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) && data &&
      _vs_host_mapped(ptr, &dev)) {
    if (a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
    else *(int *)data = dev;
    return true;
  }
  if (a != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && a != CU_POINTER_ATTRIBUTE_RANGE_SIZE) return false;
  CUdeviceptr base;
  size_t size;
  if (!data || !_vs_lookup_range(ptr, &base, &size)) return false;
  if (a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *(CUdeviceptr *)data = base;
  else *(size_t *)data = size;
  return true;
}

VS_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  typedef CUresult (*fn_t)(void *, CUpointer_attribute, CUdeviceptr);
  fn_t real = REAL(PTR_GET_ATTR, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(data, attribute, ptr);
  if (r == CUDA_SUCCESS) range_attribute(attribute, data, ptr);
  return r;
}

VS_API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr) {
  typedef CUresult (*fn_t)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
  fn_t real = REAL(PTR_GET_ATTRS, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(n, attrs, data, ptr);
  if (r == CUDA_SUCCESS && attrs && data)
    for (unsigned i = 0; i < n; i++) range_attribute(attrs[i], data[i], ptr);
  return r;
}

/* ------------------------------------------------------------------ capture, streams, contexts */

/* A capture begins at the gate too: none starts while the shim moves memory (a sleep waits for
 * those in progress to end before it closes the gate). It ends the one-stream order first
 * (order.c): once it runs, the order's waits would join the captured graph. */
static vs_gate_line_t *capture_enter(void) {
  _vs_order_leave("a stream capture", true);
  return _vs_gate_enter();
}
static CUresult capture_entered(vs_gate_line_t *line, CUresult r) {
  if (r == CUDA_SUCCESS) atomic_fetch_add(&_vs_captures_active, 1);
  _vs_gate_leave(line);
  return r;
}

typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
static CUresult begin_capture(vs_hook_t id, CUstream s, CUstreamCaptureMode mode) {
  begin_fn real = (begin_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  vs_gate_line_t *line = capture_enter();
  return capture_entered(line, real(s, mode));
}
VS_API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture(VS_HOOK_BEGIN_CAPTURE, s, mode);
}
VS_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture(VS_HOOK_BEGIN_CAPTURE_PTSZ, s, mode);
}

/* The first ABI (CUDA 10.0): no capture mode. */
typedef CUresult (*begin_v1_fn)(CUstream);
static CUresult begin_capture_v1(vs_hook_t id, CUstream s) {
  begin_v1_fn real = (begin_v1_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  vs_gate_line_t *line = capture_enter();
  return capture_entered(line, real(s));
}
VS_API CUresult cuStreamBeginCapture(CUstream s);
VS_API CUresult cuStreamBeginCapture(CUstream s) { return begin_capture_v1(VS_HOOK_BEGIN_CAPTURE_V1, s); }
VS_API CUresult cuStreamBeginCapture_ptsz(CUstream s);
VS_API CUresult cuStreamBeginCapture_ptsz(CUstream s) { return begin_capture_v1(VS_HOOK_BEGIN_CAPTURE_V1_PTSZ, s); }

typedef CUresult (*begin_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                                   CUstreamCaptureMode);
static CUresult begin_capture_to_graph(vs_hook_t id, CUstream s, CUgraph g, const CUgraphNode *deps,
                                       const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode) {
  begin_graph_fn real = (begin_graph_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  vs_gate_line_t *line = capture_enter();
  return capture_entered(line, real(s, g, deps, edges, n, mode));
}
VS_API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                            const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode) {
  return begin_capture_to_graph(VS_HOOK_BEGIN_CAPTURE_GRAPH, s, g, deps, edges, n, mode);
}
VS_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode) {
  return begin_capture_to_graph(VS_HOOK_BEGIN_CAPTURE_GRAPH_PTSZ, s, g, deps, edges, n, mode);
}

typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
static CUresult end_capture(vs_hook_t id, CUstream s, CUgraph *g) {
  end_capture_fn real = (end_capture_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  bool was = _vs_active() && _vs_cu.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = real(s, g);
  if (was && atomic_load(&_vs_captures_active) > 0) atomic_fetch_sub(&_vs_captures_active, 1);
  return r;
}
VS_API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(VS_HOOK_END_CAPTURE, s, g); }
VS_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end_capture(VS_HOOK_END_CAPTURE_PTSZ, s, g); }

VS_API CUresult cuStreamDestroy_v2(CUstream s) {
  typedef CUresult (*fn_t)(CUstream);
  fn_t real = REAL(STREAM_DESTROY, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  _vs_order_stream_destroyed(s);
  _vs_stream_destroyed(s);
  return real(s);
}

VS_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  typedef CUresult (*fn_t)(CUcontext);
  fn_t real = REAL(CTX_DESTROY, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  _vs_order_context_gone(ctx);
  _vs_drop_context(ctx, -1);
  CUresult r = real(ctx);
  if (r == CUDA_SUCCESS) _vs_ctxmem_gone((uintptr_t)ctx); /* its figure of the residue */
  return r;
}

VS_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  typedef CUresult (*fn_t)(CUdevice);
  fn_t real = REAL(PRIMARY_RESET, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  if (atomic_load(&_vs_state) == 1 && !_vs_guard) {
    CUcontext primary = NULL;
    if (_vs_cu.cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS) {
      /* The pool's memory dies with the context, as cudaMalloc memory does. The context
       * must be current while the pool synchronises and unmaps. */
      _vs_cu.cuCtxPushCurrent(primary);
      _vs_order_context_gone(primary);
      _vs_drop_context(primary, (int)dev);
      CUcontext popped;
      _vs_cu.cuCtxPopCurrent(&popped);
      _vs_cu.cuDevicePrimaryCtxRelease(dev);
    }
  }
  CUresult r = real(dev);
  if (r == CUDA_SUCCESS) _vs_ctxmem_primary_gone((int)dev); /* its figure of the residue */
  return r;
}

/* ------------------------------------------------------------------ peers and IPC */

/* Peer access and pool access lists reach the driver first; when it agrees, the shim gives
 * (or takes) the same access on its own mappings (peer.c). */
VS_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  typedef CUresult (*fn_t)(CUcontext, unsigned int);
  fn_t real = REAL(PEER_ENABLE, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(peer, flags);
  if (r == CUDA_SUCCESS) _vs_peer_access_changed(peer, true);
  return r;
}

VS_API CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  typedef CUresult (*fn_t)(CUcontext);
  fn_t real = REAL(PEER_DISABLE, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(peer);
  if (r == CUDA_SUCCESS) _vs_peer_access_changed(peer, false);
  return r;
}

VS_API CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  typedef CUresult (*fn_t)(CUmemoryPool, const CUmemAccessDesc *, size_t);
  fn_t real = REAL(MEMPOOL_SET_ACCESS, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(pool, map, count);
  if (r == CUDA_SUCCESS) _vs_mempool_access_changed(pool, map, count);
  return r;
}

/* ------------------------------------------------------------------ the stream-ordered pool */

/* A device's default pool is where its cudaMallocAsync memory comes from: the driver answers
 * for what it holds (what passed through), the shim adds its own (mempool.c). */
VS_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  typedef CUresult (*fn_t)(CUmemoryPool, CUmemPool_attribute, void *);
  fn_t real = REAL(MEMPOOL_GET_ATTR, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(pool, attr, value);
  if (r == CUDA_SUCCESS) _vs_mempool_got_attribute(pool, attr, value);
  return r;
}

/* The driver checks the value (a high watermark resets only to 0) and keeps the threshold. */
VS_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  typedef CUresult (*fn_t)(CUmemoryPool, CUmemPool_attribute, void *);
  fn_t real = REAL(MEMPOOL_SET_ATTR, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(pool, attr, value);
  if (r == CUDA_SUCCESS) _vs_mempool_set_attribute(pool, attr, value);
  return r;
}

VS_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  typedef CUresult (*fn_t)(CUmemoryPool, size_t);
  fn_t real = REAL(MEMPOOL_TRIM, fn_t);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  return real(pool, _vs_mempool_trim(pool, keep));
}

VS_API CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
  CUresult err;
  _vs_order_leave("an IPC export (another process orders its own work)", true);
  if (_vs_ipc_get_handle(dptr, handle, &err)) return err;
  typedef CUresult (*fn_t)(CUipcMemHandle *, CUdeviceptr);
  CALL_REAL(IPC_GET, fn_t, handle, dptr);
}

typedef CUresult (*ipc_open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
static CUresult ipc_open(vs_hook_t id, CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  CUresult err;
  if (_vs_ipc_open(pdptr, &handle, &err)) return err;
  ipc_open_fn real = (ipc_open_fn)real_fn(id);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  return real(pdptr, handle, flags);
}
VS_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  return ipc_open(VS_HOOK_IPC_OPEN_V2, pdptr, handle, flags);
}
VS_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
VS_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  return ipc_open(VS_HOOK_IPC_OPEN, pdptr, handle, flags);
}

VS_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  CUresult err;
  if (_vs_ipc_close(dptr, &err)) return err;
  typedef CUresult (*fn_t)(CUdeviceptr);
  CALL_REAL(IPC_CLOSE, fn_t, dptr);
}

/* Hook addresses for the table (the exported functions above). */
#define VS_HOOK_ADDR(id, base, ver, ptsz, sym) \
  static void *vs_hook_addr_##id(void) { return (void *)(sym); }
VS_HOOKS(VS_HOOK_ADDR)
#undef VS_HOOK_ADDR
