/* mempool.c: the stream-ordered allocator's pool, as a program sees it.
 *
 * The shim serves every cudaMallocAsync / cuMemAllocAsync from its own pools, so the driver's
 * default pool of each device stays empty; programs read its attributes all the same (CuPy's
 * MemoryAsyncPool.used_bytes/total_bytes, PyTorch's memory_stats with
 * backend:cudaMallocAsync, RMM over the default pool). For the pools the shim stands in for,
 * each device's default pool, the answers are the driver's plus the shim's (pool.h,
 * vs_pool_usage_t), summed over the device's pools:
 *   reserve (RESERVED_MEM_CURRENT)  what the shim maps on the device less what live
 *       synchronous allocations (cudaMalloc, cuMemAlloc) hold: the memory stream-ordered
 *       allocations hold or could be given. Memory serves both kinds, so a cudaFree makes the
 *       reserve grow and a cudaMalloc served from idle memory makes it shrink;
 *   used (USED_MEM_CURRENT)  the bytes live stream-ordered allocations asked for (the driver
 *       counts them so, unrounded);
 *   high watermarks  the highest value since the last reset (setting the attribute to 0
 *       resets it to the current value, as the driver does). A device with several arenas
 *       (threads that allocate at the same time) reports the sum of theirs: at least the true
 *       peak, equal to it with one arena;
 *   release threshold  the driver keeps it and answers it (0 until set); the shim applies it
 *       to each of the device's pools, at once and at every free (pool.c), where the driver
 *       does at each synchronisation: whole idle handles go back while the reserve is above it.
 *       VMMSHIM_RELEASE_THRESHOLD binds too (the lower wins). Until a program sets one, the
 *       shim keeps idle memory as VMMSHIM_RELEASE_THRESHOLD says (by default all of it);
 *   trim (cuMemPoolTrimTo)  pending frees are waited for first (a context synchronisation
 *       for each pool that has any, as vmmshim_trim makes; none while a graph is being
 *       captured), then whole idle handles go back while the reserve stays at or above `keep`.
 * A pool the program creates (cuMemPoolCreate) is the driver's alone: allocations from it
 * (cuMemAllocFromPoolAsync) pass through, and so do its queries. */
#include "vmmshim/alloc.h"

/* The device whose default pool `pool` is, or -1 (not a pool the shim stands in for). */
static int device_of_pool(CUmemoryPool pool) {
  if (!pool || _vs_guard || !_vs_active() || !_vs_cu.cuDeviceGetDefaultMemPool || !_vs_cu.cuDeviceGetCount) return -1;
  int n = 0;
  if (_vs_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS) return -1;
  for (int d = 0; d < n && d < VS_MAX_DEVICES; d++) {
    CUmemoryPool def = NULL;
    if (_vs_cu.cuDeviceGetDefaultMemPool(&def, d) == CUDA_SUCCESS && def == pool) return d;
  }
  return -1;
}

static void add_usage(vs_pool_t *pool, void *arg) {
  vs_pool_usage_t *sum = arg, u;
  _vs_pool_usage(pool, &u);
  sum->reserved += u.reserved;
  sum->reserved_high += u.reserved_high;
  sum->used += u.used;
  sum->used_high += u.used_high;
  sum->idle += u.idle;
}

void _vs_mempool_got_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  if (!value || (attr != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH &&
                 attr != CU_MEMPOOL_ATTR_USED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH))
    return;
  int dev = device_of_pool(pool);
  if (dev < 0) return;
  vs_pool_usage_t sum = {0, 0, 0, 0, 0};
  _vs_visit_device_arenas(dev, add_usage, &sum);
  cuuint64_t *v = value;
  switch (attr) {
  case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v += sum.reserved; break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v += sum.reserved_high; break;
  case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v += sum.used; break;
  default: *v += sum.used_high; break;
  }
}

static void reset_reserved_high(vs_pool_t *pool, void *arg) {
  (void)arg;
  _vs_pool_reset_high(pool, true, false);
}
static void reset_used_high(vs_pool_t *pool, void *arg) {
  (void)arg;
  _vs_pool_reset_high(pool, false, true);
}
static void apply_threshold(vs_pool_t *pool, void *arg) {
  size_t *released = arg;
  *released += _vs_pool_apply_release_threshold(pool);
}

void _vs_mempool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, const void *value) {
  if (!value || (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH &&
                 attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH))
    return;
  int dev = device_of_pool(pool);
  if (dev < 0) return;
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
    _vs_visit_device_arenas(dev, reset_reserved_high, NULL);
  } else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
    _vs_visit_device_arenas(dev, reset_used_high, NULL);
  } else {
    cuuint64_t bytes = *(const cuuint64_t *)value;
    _vs_pool_set_release_threshold(dev, bytes);
    size_t released = 0;
    _vs_visit_device_arenas(dev, apply_threshold, &released);
    _vs_info("device %d: release threshold of the default pool set to %llu bytes; %zu idle bytes given back", dev,
             (unsigned long long)bytes, released);
  }
}

/* Pending frees become idle: the pool's context is made current for its synchronisation. The
 * reserve that results is added up in *arg. */
static void reclaim_and_count(vs_pool_t *pool, void *arg) {
  CUcontext popped;
  if (_vs_cu.cuCtxPushCurrent(_vs_pool_context(pool)) == CUDA_SUCCESS) {
    _vs_pool_reclaim(pool);
    _vs_cu.cuCtxPopCurrent(&popped);
  }
  vs_pool_usage_t u;
  _vs_pool_usage(pool, &u);
  *(size_t *)arg += u.reserved;
}

typedef struct vs_trim_s {
  size_t keep, reserved, released;
} vs_trim_t;

/* Gives back what is over the device's `keep`, from this pool's idle memory, handles that
 * fit only. */
static void trim_pool(vs_pool_t *pool, void *arg) {
  vs_trim_t *t = arg;
  if (t->reserved <= t->keep) return;
  vs_pool_usage_t u;
  _vs_pool_usage(pool, &u);
  size_t over = t->reserved - t->keep;
  size_t got = _vs_pool_trim_exact(pool, u.idle > over ? u.idle - over : 0);
  t->reserved -= got < t->reserved ? got : t->reserved;
  t->released += got;
}

size_t _vs_mempool_trim(CUmemoryPool pool, size_t keep) {
  int dev = device_of_pool(pool);
  if (dev < 0) return keep;
  vs_trim_t t = {keep, 0, 0};
  _vs_visit_device_arenas(dev, reclaim_and_count, &t.reserved);
  _vs_visit_device_arenas(dev, trim_pool, &t);
  _vs_info("device %d: default pool trimmed to %zu bytes: %zu bytes given back, %zu reserved", dev, keep, t.released,
           t.reserved);
  return keep > t.reserved ? keep - t.reserved : 0;
}
