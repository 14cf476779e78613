/* alloc.c: what both hook layers call. Finds the pool of the current context (creating
 * it on first use), serves or frees through it, and keeps stats, log and trace.
 *
 * Where cudaFree lands: hook_rt.c cudaFree -> _vs_free (here) -> _vs_pool_free (pool.c).
 * A static runtime's cudaFree arrives at hook_drv.c cuMemFree_v2 -> _vs_free. */
#include <pthread.h>
#include <string.h>

#include "vmmshim/internal.h"

atomic_int _vs_state;
_Thread_local int _vs_guard;
atomic_int _vs_captures_active;

#define VS_MAX_POOLS 64

typedef struct vs_pool_slot_s {
  CUcontext ctx;
  vs_pool_t *pool; /* NULL: this context is passed through (no VMM support, no address space) */
} vs_pool_slot_t;

static vs_pool_slot_t vs_slots[VS_MAX_POOLS];
static atomic_int vs_nslots;
static atomic_uint vs_slots_gen; /* bumped when a pool is dropped: invalidates thread caches */
static pthread_mutex_t vs_slots_lock = PTHREAD_MUTEX_INITIALIZER;

static _Thread_local CUcontext tl_ctx;
static _Thread_local vs_pool_t *tl_pool;
static _Thread_local unsigned tl_gen;

static bool activate_slow(void) {
  _vs_init_once();
  int st = atomic_load(&_vs_state);
  if (st) return st == 1;
  int want = 1;
  if (_vs_option(VS_OPT_DISABLE)) {
    _vs_note("VMMSHIM_DISABLE is set: every allocation passes through to the CUDA driver");
    want = 2;
  } else if (_vs_cuda_resolve() != 0) {
    want = 2;
  }
  int expected = 0;
  atomic_compare_exchange_strong(&_vs_state, &expected, want);
  return atomic_load(&_vs_state) == 1;
}

bool _vs_active(void) {
  int st = atomic_load_explicit(&_vs_state, memory_order_acquire);
  if (vs_likely(st == 1)) return true;
  if (st == 2) return false;
  return activate_slow();
}

VS_API int vmmshim_active(void) { return _vs_active() ? 1 : 0; }

/* Set when the context given to pool_create_slow is destroyed (after cudaDeviceReset the
 * thread may still hold the old handle): the caller treats it as no context at all. */
static _Thread_local bool tl_dead_context;

static vs_pool_t *pool_create_slow(CUcontext ctx) {
  tl_dead_context = false;
  pthread_mutex_lock(&vs_slots_lock);
  int n = atomic_load(&vs_nslots);
  for (int i = 0; i < n; i++)
    if (vs_slots[i].ctx == ctx) {
      vs_pool_t *p = vs_slots[i].pool;
      pthread_mutex_unlock(&vs_slots_lock);
      return p;
    }
  vs_pool_t *pool = NULL;
  CUdevice dev = 0;
  vs_device_caps_t caps;
  CUresult r = _vs_cu.cuCtxGetDevice(&dev);
  if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT) {
    tl_dead_context = true;
    pthread_mutex_unlock(&vs_slots_lock);
    return NULL;
  }
  if (r == CUDA_SUCCESS) r = _vs_vmm_query(dev, &caps);
  if (r != CUDA_SUCCESS) {
    _vs_warn("device %d: cannot query VMM support (%s); its allocations pass through", (int)dev,
             _vs_cu_error_name(r));
  } else if (!caps.vmm_supported) {
    _vs_note("device %d has no virtual memory management support; its allocations pass through", (int)dev);
  } else {
    pool = _vs_pool_create(ctx, &caps);
  }
  if (n < VS_MAX_POOLS) {
    vs_slots[n].ctx = ctx;
    vs_slots[n].pool = pool;
    atomic_store(&vs_nslots, n + 1);
  } else {
    _vs_warn("more than %d contexts; context %p passes through", VS_MAX_POOLS, (void *)ctx);
    if (pool) _vs_pool_destroy(pool);
    pool = NULL;
  }
  pthread_mutex_unlock(&vs_slots_lock);
  return pool;
}

/* The pool of a context (created on first use); NULL when that context passes through. */
static vs_pool_t *pool_for(CUcontext ctx) {
  unsigned gen = atomic_load_explicit(&vs_slots_gen, memory_order_acquire);
  if (vs_likely(ctx == tl_ctx && gen == tl_gen)) return tl_pool;
  vs_pool_t *pool = NULL;
  bool found = false;
  int n = atomic_load_explicit(&vs_nslots, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (vs_slots[i].ctx == ctx) {
      pool = vs_slots[i].pool;
      found = true;
      break;
    }
  if (!found) {
    pool = pool_create_slow(ctx);
    if (tl_dead_context) return NULL;
  }
  tl_ctx = ctx;
  tl_pool = pool;
  tl_gen = gen;
  return pool;
}

/* The pool of the calling thread's current context, or of the stream's context when the
 * thread has none (the runtime binds no context to a thread whose first call is
 * cudaMallocAsync: the driver takes it from the stream). */
static vs_pool_t *current_pool(CUstream stream, CUcontext *ctx_out) {
  CUcontext ctx = NULL;
  if (_vs_cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) ctx = NULL;
  if (!ctx && stream != VS_NO_STREAM && stream != NULL && stream != CU_STREAM_LEGACY &&
      stream != CU_STREAM_PER_THREAD && _vs_cu.cuStreamGetCtx(stream, &ctx) != CUDA_SUCCESS)
    ctx = NULL;
  vs_pool_t *pool = ctx ? pool_for(ctx) : NULL;
  if (!pool && ctx && tl_dead_context) ctx = NULL;
  *ctx_out = ctx;
  return pool;
}

static bool stream_capturing(CUstream stream) {
  if (vs_likely(atomic_load_explicit(&_vs_captures_active, memory_order_relaxed) == 0)) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (_vs_cu.cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) return false;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

vs_alloc_result_t _vs_alloc(vmmshim_api_t api, size_t size, CUstream stream, CUdeviceptr *ptr, CUresult *err) {
  if (vs_unlikely(_vs_guard) || !_vs_active() || size == 0 || !ptr) return VS_ALLOC_PASS;
  if (stream != VS_NO_STREAM && stream_capturing(stream)) {
    /* Graph memory nodes: addresses fixed for the graph's life, GPU-ordered; the runtime's. */
    VS_STAT_ADD(passthrough_allocs, 1);
    return VS_ALLOC_PASS;
  }
  CUcontext ctx;
  vs_pool_t *pool = current_pool(stream, &ctx);
  if (vs_unlikely(!pool)) {
    if (!ctx) return VS_ALLOC_NO_CONTEXT;
    VS_STAT_ADD(passthrough_allocs, 1);
    return VS_ALLOC_PASS;
  }
  size_t served = 0;
  CUresult cerr = CUDA_SUCCESS;
  vs_pool_status_t st = _vs_pool_alloc(pool, size, stream, api, ptr, &served, &cerr);
  int dev = _vs_pool_device(pool);
  if (vs_likely(st == VS_POOL_OK)) {
    VS_STAT_ADD(allocs[api], 1);
    uint64_t in_use = VS_STAT_ADD(bytes_in_use, served) + served;
    VS_STAT_ADD(bytes_requested_in_use, size);
    _vs_stat_peak(&_vs_stats_data.peak_bytes_in_use, in_use);
    if (vs_unlikely(_vs_trace_on)) _vs_trace_alloc(api, size, served, *ptr, stream, dev);
    _vs_debug("alloc api %d size %zu -> 0x%llx (%zu bytes)", (int)api, size, (unsigned long long)*ptr, served);
    return VS_ALLOC_SERVED;
  }
  if (st == VS_POOL_ERROR) {
    _vs_warn("device %d: pool error %s for %zu bytes; passing the allocation to the driver", dev,
             _vs_cu_error_name(cerr), size);
    VS_STAT_ADD(passthrough_allocs, 1);
    return VS_ALLOC_PASS;
  }
  VS_STAT_ADD(alloc_failures, 1);
  if (vs_unlikely(_vs_trace_on)) _vs_trace_alloc_fail(api, size, stream, dev, CUDA_ERROR_OUT_OF_MEMORY);
  _vs_info("device %d: out of memory for %zu bytes%s", dev, size,
           st == VS_POOL_LIMIT ? " (VMMSHIM_LIMIT reached)" : "");
  *err = CUDA_ERROR_OUT_OF_MEMORY;
  return VS_ALLOC_FAILED;
}

/* The pool that owns ptr: the current context's first, then the others. */
static bool free_in(vs_pool_t *pool, vmmshim_api_t api, CUdeviceptr ptr, CUstream stream, CUresult *err,
                    bool switch_ctx) {
  size_t size = 0;
  CUcontext saved = NULL;
  if (switch_ctx) _vs_cu.cuCtxPushCurrent(_vs_pool_context(pool));
  vs_pool_status_t st = _vs_pool_free(pool, ptr, stream, api, &size, err);
  if (switch_ctx) _vs_cu.cuCtxPopCurrent(&saved);
  if (st != VS_POOL_OK) return false;
  VS_STAT_ADD(frees[api], 1);
  VS_STAT_SUB(bytes_in_use, size);
  _vs_debug("free api %d 0x%llx (%zu bytes)", (int)api, (unsigned long long)ptr, size);
  return true;
}

bool _vs_free(vmmshim_api_t api, CUdeviceptr ptr, CUstream stream, CUresult *err) {
  *err = CUDA_SUCCESS;
  if (vs_unlikely(_vs_guard) || !ptr || !_vs_active()) return false;
  int n = atomic_load_explicit(&vs_nslots, memory_order_acquire);
  if (stream != VS_NO_STREAM || _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED) {
    /* Nothing to synchronise: the owning pool needs no current context. */
    for (int i = 0; i < n; i++)
      if (vs_slots[i].pool && free_in(vs_slots[i].pool, api, ptr, stream, err, false)) return true;
    return false;
  }
  /* A sync-mode free synchronises the owning pool's context, made current if need be. */
  CUcontext ctx = NULL;
  if (_vs_cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) ctx = NULL;
  vs_pool_t *pool = ctx ? pool_for(ctx) : NULL;
  if (pool && free_in(pool, api, ptr, stream, err, false)) return true;
  for (int i = 0; i < n; i++) {
    vs_pool_t *other = vs_slots[i].pool;
    if (other && other != pool && free_in(other, api, ptr, stream, err, true)) return true;
  }
  return false;
}

bool _vs_lookup_range(CUdeviceptr addr, CUdeviceptr *base, size_t *size) {
  if (_vs_guard || atomic_load(&_vs_state) != 1) return false;
  int n = atomic_load_explicit(&vs_nslots, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (vs_slots[i].pool && _vs_pool_range(vs_slots[i].pool, addr, base, size)) return true;
  return false;
}

void _vs_adjust_mem_info(size_t *free_bytes, size_t *total_bytes) {
  if (_vs_guard || !_vs_active()) return;
  CUcontext ctx;
  vs_pool_t *pool = current_pool(VS_NO_STREAM, &ctx);
  size_t idle = pool ? _vs_pool_idle_bytes(pool) : 0;
  if (free_bytes) *free_bytes += idle;
  uint64_t limit = _vs_option(VS_OPT_LIMIT);
  if (limit) {
    size_t mapped = _vs_mapped_total();
    size_t left = limit > mapped ? (size_t)(limit - mapped) + idle : idle;
    if (free_bytes && *free_bytes > left) *free_bytes = left;
    if (total_bytes && *total_bytes > limit) *total_bytes = (size_t)limit;
  }
}

void _vs_stream_destroyed(CUstream stream) {
  if (_vs_guard || atomic_load(&_vs_state) != 1) return;
  int n = atomic_load_explicit(&vs_nslots, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (vs_slots[i].pool) _vs_pool_stream_destroyed(vs_slots[i].pool, stream);
}

/* The context is going away (cuCtxDestroy, cuDevicePrimaryCtxReset): its memory goes
 * with it, as cudaMalloc memory does. */
void _vs_drop_context(CUcontext ctx, int dev) {
  if (_vs_guard || atomic_load(&_vs_state) != 1) return;
  pthread_mutex_lock(&vs_slots_lock);
  int n = atomic_load(&vs_nslots);
  for (int i = 0; i < n; i++) {
    if (vs_slots[i].ctx != ctx) continue;
    vs_pool_t *pool = vs_slots[i].pool;
    vs_slots[i] = vs_slots[n - 1];
    atomic_store(&vs_nslots, n - 1);
    atomic_fetch_add(&vs_slots_gen, 1);
    if (pool) {
      _vs_info("context %p on device %d is going away: dropping its pool", (void *)ctx, dev);
      _vs_pool_destroy(pool);
    }
    break;
  }
  pthread_mutex_unlock(&vs_slots_lock);
}

size_t _vs_trim_all(void) {
  if (!_vs_active()) return 0;
  size_t total = 0;
  int n = atomic_load_explicit(&vs_nslots, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    vs_pool_t *pool = vs_slots[i].pool;
    if (!pool) continue;
    /* What is still pending (deferred frees, frees on streams) must complete first. */
    CUcontext popped;
    if (_vs_cu.cuCtxPushCurrent(_vs_pool_context(pool)) == CUDA_SUCCESS) {
      _vs_pool_reclaim(pool);
      _vs_cu.cuCtxPopCurrent(&popped);
    }
    total += _vs_pool_trim(pool, 0);
  }
  return total;
}

VS_API size_t vmmshim_trim(void) { return _vs_trim_all(); }
