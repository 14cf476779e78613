/* vmmshim alloc layer (src/alloc/): what the entry points (src/hook/) call. */
#ifndef VMMSHIM_ALLOC_H
#define VMMSHIM_ALLOC_H

#include "vmmshim/share.h"

/* ---------------------------------------------------------------- "alloc.c" */
/* Entry points shared by the runtime and driver hooks. They return CUresult values;
 * the runtime hooks translate them. A non-owned pointer is reported, not touched. */

typedef enum vs_alloc_result_e {
  VS_ALLOC_SERVED = 0,    /* *ptr is a pool block */
  VS_ALLOC_PASS = 1,      /* not for the shim: call the real function */
  VS_ALLOC_FAILED = 2,    /* out of memory: *err says which error to return */
  VS_ALLOC_NO_CONTEXT = 3 /* no current context: the runtime must initialise one first */
} vs_alloc_result_t;

vs_alloc_result_t _vs_alloc(vmmshim_api_t api, size_t size, CUstream stream, CUdeviceptr *ptr, CUresult *err);
/* Returns true if ptr belonged to the shim and was freed (or queued); false: pass through.
 * *err: CUDA_SUCCESS, or the error of the synchronisation a sync-mode free made. */
bool _vs_free(vmmshim_api_t api, CUdeviceptr ptr, CUstream stream, CUresult *err);
/* Lookup for cuMemGetAddressRange / cuPointerGetAttribute. */
bool _vs_lookup_range(CUdeviceptr addr, CUdeviceptr *base, size_t *size);
/* Idle bytes of the current context's pool and the cap, for cuMemGetInfo. */
void _vs_adjust_mem_info(size_t *free_bytes, size_t *total_bytes);
void _vs_stream_destroyed(CUstream stream);
/* Drop the pools of a context that is being destroyed or reset (ctx NULL: all of device dev). */
void _vs_drop_context(CUcontext ctx, int dev);
size_t _vs_trim_all(void);
/* Calls fn for every arena of every live context on device dev (rare paths: the pool queries). */
void _vs_visit_device_arenas(int dev, void (*fn)(vs_pool_t *pool, void *arg), void *arg);
/* Moves the calling thread to arena idx (mod VMMSHIM_ARENAS); contention does it by itself. */
void _vs_arena_select(unsigned idx);

/* ---------------------------------------------------------------- "mempool.c" */
/* The queries a program makes about the stream-ordered allocator's pool, on a pool the shim
 * stands in for: each device's default pool (its stream-ordered allocations are the shim's).
 * The driver answers first (its pool holds what passed through); these add the shim's part.
 * Any other pool (one the program created) is the driver's alone. */
/* cuMemPoolGetAttribute succeeded: the shim's figures are added to the reserve, use and their
 * high watermarks. */
void _vs_mempool_got_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
/* cuMemPoolSetAttribute succeeded: a release threshold is applied to the device's pools, a
 * reset of a high watermark resets theirs. */
void _vs_mempool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, const void *value);
/* cuMemPoolTrimTo(pool, keep): the device's pools give back idle memory down to `keep` bytes of
 * reserve (never below); returns what the driver's pool is to keep, for the reserve of both
 * to stay at or above `keep`. */
size_t _vs_mempool_trim(CUmemoryPool pool, size_t keep);

#endif
