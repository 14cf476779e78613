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

/* Pools off allocation (sleep.c): a tag's pools are parked while it sleeps. */
typedef struct vs_parked_s {
  vs_pool_t *pool;
  CUcontext ctx;
} vs_parked_t;
/* Takes every arena of tag, in every context, off allocation (new allocations of the tag get new
 * pools); returns the tag's parked pools, these and those parked before (at most max). */
int _vs_park_tag(int tag, vs_parked_t *out, int max);
/* The tag's parked pools. */
int _vs_parked_of(int tag, vs_parked_t *out, int max);
/* A woken pool back on allocation, in a free arena of its tag: false when none is free (it stays
 * parked, serving frees). */
bool _vs_unpark(vs_pool_t *pool);
/* Calls fn for every pool of tag (every tag when tag < 0), parked or not. */
void _vs_visit_tag(int tag, void (*fn)(vs_pool_t *pool, void *arg), void *arg);
/* Synchronises every context the shim serves (before memory moves). */
void _vs_sync_contexts(void);
/* Gives cached host memory back down to keep bytes; returns the bytes given back. */
size_t _vs_release_host(size_t keep);

/* ---------------------------------------------------------------- "limit.c" */
/* Bytes served from host memory at their own addresses, every pool (tags asleep in mapped mode,
 * growths past the limit): pointer queries look further only when it is not 0. */
extern atomic_size_t _vs_host_mapped_bytes;
/* The limit (or the device) refused an allocation after every pool gave back its idle memory:
 * VMMSHIM_ON_LIMIT says what now (wait, host). Returns the new status (VS_POOL_OK: served). */
vs_pool_status_t _vs_on_limit(vs_pool_t *pool, vs_pool_status_t st, size_t size, CUstream stream, vmmshim_api_t api,
                              CUdeviceptr *ptr, size_t *served, CUresult *err);

/* ---------------------------------------------------------------- "sleep.c" */
/* vmmshim_sleep, _wake, _sleep_level and _promote (vmmshim.h), out's size checked by the caller
 * (out may be NULL): each timed, logged and traced, its result copied to out. */
int _vs_sleep(const char *tag, int mode, vmmshim_sleep_result_t *out);
int _vs_wake(const char *tag, unsigned flags, vmmshim_sleep_result_t *out);
int _vs_sleep_level(int level, int mapped, vmmshim_sleep_result_t *out);
int _vs_promote(vmmshim_sleep_result_t *out);
int _vs_tag_stats(vmmshim_tag_stats_t *out, int max);
/* Whether addr is served from host memory at its own address (a tag asleep in mapped mode), and
 * its pool's device: pointer queries then answer device memory, as before the sleep. */
bool _vs_host_mapped(CUdeviceptr addr, int *dev);
/* vmmshim_host_copy (vmmshim.h): where the bytes of a sleeping address are kept. */
int _vs_host_copy_at(CUdeviceptr addr, CUdeviceptr *home, size_t *len);
/* vmmshim_host_view (vmmshim.h): the CPU address of a sleeping range's bytes, in place. */
int _vs_host_view_at(CUdeviceptr addr, size_t size, CUdeviceptr *home);

/* ---------------------------------------------------------------- "tags.c" */
#define VS_MAX_TAGS VMMSHIM_MAX_TAGS
extern atomic_int _vs_process_tag; /* the tag of threads that set none */
extern _Thread_local int _vs_tl_tag1; /* the thread's own tag + 1; 0: none */
/* The tag the calling thread's next allocation goes to: the allocation path asks every time. */
static inline int _vs_current_tag(void) {
  int t = _vs_tl_tag1;
  return vs_likely(t == 0) ? atomic_load_explicit(&_vs_process_tag, memory_order_relaxed) : t - 1;
}
void _vs_tags_init(void); /* VMMSHIM_TAG; before the first pool */
bool _vs_tag_name_ok(const char *name);
/* The index of a tag (created when create and the table has room); -EINVAL, -ENOENT, -ENOSPC. */
int _vs_tag_find(const char *name, bool create);
const char *_vs_tag_name(int id);
int _vs_tag_count(void);
bool _vs_tag_keep(int id);
/* vmmshim_set_tag (NULL: back to the process's tag), _set_process_tag, _get_tag (buf not NULL,
 * n > 0) and _set_tag_keep: 0 or a negative errno value (vmmshim.h). */
int _vs_set_thread_tag(const char *tag);
int _vs_set_process_tag(const char *tag);
int _vs_get_tag(char *buf, size_t n);
int _vs_set_tag_keep(const char *tag, bool keep);

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
