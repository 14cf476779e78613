/* pool.c: one arena's sub-allocator, built on the handle layer (handles.c). Its entry points:
 * create and destroy, allocate (a fast path under the lock, then the slow-path ladder),
 * free, and the lookups. The vocabulary and every block state are in vmmshim/pool.h.
 *
 * When a freed block may be reused:
 *   - sync free, default mode: the context was synchronised before the block was taken
 *     back, as cudaFree does; the block is FREE at once.
 *   - sync free, deferred mode: PENDING on the deferred list until a synchronisation that
 *     started after the free completes (reclaim.c's background thread).
 *   - async free on stream S: PENDING on S's list, reusable at once by allocations on S
 *     (stream order protects it), and by everyone once an event recorded on S after the
 *     free has completed (queried, never waited for) or a later context sync ended.
 * Locking: one mutex per pool, never held across a driver call. */
#define VS_POOL_UNIT
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

#include "pool_blocks.c"
#include "pool_streams.c"

void _vs_uthash_fatal(const char *msg) {
  _vs_error("address map: %s (out of host memory)", msg);
  abort();
}

/* ------------------------------------------------------------------ lifetime */

vs_pool_t *_vs_pool_create(CUcontext ctx, const vs_device_caps_t *caps, const vs_access_state_t *access) {
  vs_pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  _vs_lock_init(&p->lock, VS_RANK_POOL, "pool");
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->sealed, NULL);
  p->ctx = ctx;
  p->caps = *caps;
  p->access = access;
  p->map_anchor.state = B_USED;
  HASH_ADD(hh, p->map, addr, sizeof p->map_anchor.addr, &p->map_anchor);
  /* config.c bounds these sizes (VS_SIZE_OPTION_MAX); each rounding is checked all the same, as
   * a wrap to 0 would divide by zero later. */
  size_t g = (size_t)_vs_option(VS_OPT_GRANULARITY);
  if (g % caps->min_granularity) {
    size_t fixed = round_up_checked(g, caps->min_granularity);
    if (!fixed) fixed = round_up(VS_DEFAULT_GRANULARITY, caps->min_granularity);
    _vs_warn("VMMSHIM_GRANULARITY=%zu is not a multiple of device %d's minimum granularity %zu; using %zu", g,
             (int)caps->device, caps->min_granularity, fixed);
    g = fixed;
  }
  p->gran = g;
  size_t mh = (size_t)_vs_option(VS_OPT_MAX_HANDLE);
  p->chunk = mh ? round_up_checked(mh, caps->min_granularity) : SIZE_MAX / 2;
  if (!p->chunk) {
    _vs_warn("VMMSHIM_MAX_HANDLE=%zu cannot be rounded to device %d's granularity; handles are not bounded", mh,
             (int)caps->device);
    p->chunk = SIZE_MAX / 2;
  }
  p->stitch = _vs_option(VS_OPT_STITCH) != 0;
  size_t resv = (size_t)_vs_option(VS_OPT_RESERVE);
  if (!resv) {
    /* Address space is nearly free to reserve (3-20 us for 64 TiB): room for 4x the device. */
    resv = caps->total_mem * 4;
    if (resv < (64ull << 30)) resv = 64ull << 30;
  }
  resv = round_up_checked(resv, g);
  size_t dev_size = round_up_checked(caps->total_mem ? caps->total_mem : resv, g);
  if (!resv || !dev_size || _vs_pool_add_reservation(p, VS_HEAP_LARGE, resv) != 0 ||
      _vs_pool_add_reservation(p, VS_HEAP_SMALL, dev_size) != 0) {
    _vs_dir_remove_pool(p);
    _vs_pool_unmap_all(p);
    _vs_pool_free_blocks(p);
    _vs_warn("device %d: cannot reserve %zu bytes of address space; this context is passed through",
             (int)caps->device, resv);
    HASH_CLEAR(hh, p->map); /* the anchor's entry made the map's table */
    _vs_lock_fini(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->sealed);
    free(p);
    return NULL;
  }
  VS_STAT_ADD(pools, 1);
  _vs_info("pool for context %p on device %d: reserved %zu GiB, handles of %zu MiB, free mode %s", (void *)ctx,
           (int)caps->device, resv >> 30, g >> 20,
           _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED ? "deferred" : "sync");
  return p;
}

void _vs_pool_destroy(vs_pool_t *p) {
  _vs_dir_remove_pool(p);
  VS_STAT_SUB(pools, 1);
  _vs_pool_stop_reclaimer(p);
  _vs_pool_forget_asleep(p);
  _vs_pool_unmap_all(p);
  /* The live blocks die with the context, as cudaMalloc memory does. */
  for (vs_block_t *b = p->map; b; b = b->hh.next) _vs_stat_drop(b->size, b->requested);
  HASH_CLEAR(hh, p->map);
  vs_stream_t *s, *tmp;
  HASH_ITER(hh, p->streams, s, tmp) {
    HASH_DEL(p->streams, s);
    free(s);
  }
  _vs_pool_free_batches(p);
  _vs_pool_free_blocks(p);
  _vs_segs_clear(&p->segs);
  _vs_lock_fini(&p->lock);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->sealed);
  free(p);
}

CUcontext _vs_pool_context(const vs_pool_t *p) { return p->ctx; }
int _vs_pool_device(const vs_pool_t *p) { return (int)p->caps.device; }
int _vs_pool_tag(const vs_pool_t *p) { return p->tag; }
void _vs_pool_set_tag(vs_pool_t *p, int tag) { p->tag = tag; }

/* ------------------------------------------------------------------ allocation */

/* One allocation request, as the fast path and every step of the slow path see it. */
typedef struct vs_request_s {
  size_t req;    /* bytes the program asked for */
  size_t size;   /* bytes the block will have */
  size_t align;
  int heap_id;
  CUstream stream; /* VS_NO_STREAM for synchronous allocations */
  CUstream key;
  const void *owner;
  bool *contended; /* out: the lock was held by another allocating thread */
  /* the pool's figures at the last failed try, for the slow path's decisions */
  size_t pending, deferred, used, mapped;
  size_t own_pending; /* a stream request: bytes freed on its stream and not yet free */
  uint64_t sync_since_ns; /* start of the oldest context sync in flight, 0 if none */
  uint64_t last_sync_ns;  /* how long the last context sync took */
} vs_request_t;

/* Bytes freed on stream s that wait for its work: its pending list and the batches sealed on it
 * (those a thread holds outside the lock are not counted). Lock held. */
static size_t stream_waiting(const vs_pool_t *p, const vs_stream_t *s) {
  size_t n = s->pending.bytes;
  for (const vs_batch_t *bt = p->batches; bt; bt = bt->next)
    if (bt->key == s->key && bt->epoch == p->stream_epoch) n += bt->blocks.bytes;
  return n;
}

/* The reserve of the stream-ordered allocator (pool.h): what the pool maps, less what live
 * synchronous blocks hold. Lock held. */
static inline size_t stream_reserve(const vs_pool_t *p) { return p->mapped - (p->used - p->stream_served); }

/* The reserve may have grown (a growth, or a synchronous block freed): its high watermark
 * follows. Lock held. */
static inline void note_reserve(vs_pool_t *p) {
  size_t r = stream_reserve(p);
  if (vs_unlikely(r > p->reserved_high)) p->reserved_high = r;
}

/* The carved block b becomes the request's: in the map, counted. Lock held. */
static inline void serve_block(vs_pool_t *p, vs_block_t *b, const vs_request_t *rq) {
  b->requested = rq->req;
  b->exported = false;
  HASH_ADD(hh, p->map, addr, sizeof b->addr, b);
  p->used += b->size;
  p->allocs++;
  b->stream_ordered = rq->stream != VS_NO_STREAM;
  if (b->stream_ordered) {
    p->stream_served += b->size;
    p->stream_requested += b->requested;
    if (vs_unlikely(p->stream_requested > p->stream_requested_high)) p->stream_requested_high = p->stream_requested;
  }
  note_reserve(p);
}

/* Takes a block for the request under the lock: from the stream's own pending blocks, else
 * from the bins. Returns it USED and in the map, or NULL (and the pool's figures in rq). */
static vs_block_t *take_block(vs_pool_t *p, vs_request_t *rq) {
  bool waited = false;
  if (vs_unlikely(!pool_trylock(p))) {
    waited = true;
    pool_lock(p);
  }
  /* Contention counts only against another allocating thread (the caller may then move to
   * another arena); the reclaimer and cross-thread frees take the lock too. */
  const void *self = _vs_thread_tag();
  if (vs_unlikely(p->last_allocator != self)) {
    *rq->contended |= waited && p->last_allocator != NULL;
    p->last_allocator = self;
  }
  vs_block_t *b = NULL;
  vs_stream_t *s = NULL;
  if (rq->stream != VS_NO_STREAM) {
    s = _vs_stream_get(p, rq->key, rq->stream, rq->owner, false);
    if (s && s->pending.head) {
      b = take_from_stream(p, s, rq->heap_id, rq->size, rq->align);
      if (b) b = carve(p, b, rq->size, rq->align, s);
    }
  }
  if (!b) {
    vs_heap_t *heap = &p->heaps[rq->heap_id];
    b = bin_find(heap, rq->size, rq->align);
    if (b) {
      _vs_bin_remove(p, b);
      b = carve(p, b, rq->size, rq->align, NULL);
    }
  }
  if (vs_likely(b != NULL)) {
    vs_assert(b->state == B_USED && b->size >= rq->size && _vs_align_pad(b->addr, rq->align) == 0);
    serve_block(p, b, rq);
  } else {
    rq->pending = p->pending_bytes;
    rq->deferred = p->deferred.bytes;
    rq->used = p->used;
    rq->mapped = p->mapped;
    rq->own_pending = s ? stream_waiting(p, s) : 0;
    rq->sync_since_ns = p->sync_since_ns;
    rq->last_sync_ns = p->last_sync_ns;
  }
  pool_unlock(p);
  return b;
}

/* A stream request's own freed memory, however loose the fit (pool_streams.c). */
static vs_block_t *take_block_loose(vs_pool_t *p, vs_request_t *rq) {
  if (rq->stream == VS_NO_STREAM) return NULL;
  pool_lock(p);
  vs_block_t *b = NULL;
  vs_stream_t *s = _vs_stream_get(p, rq->key, rq->stream, rq->owner, false);
  if (s) {
    b = take_from_stream_loose(p, s, rq->heap_id, rq->size, rq->align);
    if (b) b = carve(p, b, rq->size, rq->align, s);
  }
  if (b) serve_block(p, b, rq);
  VS_POOL_CHECK(p);
  pool_unlock(p);
  return b;
}

/* The slow path, as named steps tried in order; after each that makes room the request is
 * tried again. Returns the block, or NULL with the status in *st and the error in *err. */
static vs_block_t *alloc_slow(vs_pool_t *p, vs_request_t *rq, vs_pool_status_t *st, CUresult *err) {
  vs_block_t *b;
  /* 0. A stream request: its stream's own freed blocks, sealed ones too, in any fit. */
  if (rq->pending && (b = take_block_loose(p, rq)) != NULL) return b;
  /* 1. Blocks freed on streams whose events completed: free without waiting. */
  if (rq->pending) {
    _vs_pool_reclaim_by_events(p, _vs_thread_tag(), 0);
    if ((b = take_block(p, rq)) != NULL) return b;
  }
  /* 2. Freed memory that waits for the GPU, when growing would hold too much (policy.h): wait
   *    for it; once free it serves the request, or is given back before the growth. A
   *    synchronous request waits for the deferred frees (a context sync, as the reclaimer
   *    makes); a stream request for its own stream's frees (a sync of that stream only: other
   *    streams' work may run long). Never while a graph is captured: a sync would invalidate
   *    the capture. */
  if (!atomic_load(&_vs_captures_active)) {
    bool on_stream = rq->stream != VS_NO_STREAM;
    size_t waiting = on_stream ? rq->own_pending : rq->deferred;
    /* The deferred frees lag when the last context sync took long, or the one in flight runs
     * long (the GPU is busy); a stream's, whenever they could not be reused (only the stream's
     * own sync frees them). */
    bool lagging = on_stream || rq->last_sync_ns >= VS_LAG_NS ||
                   (rq->sync_since_ns && _vs_now_ns() - rq->sync_since_ns >= VS_LAG_NS);
    if (vs_policy_sync_before_growth(rq->size, p->gran, waiting, lagging, rq->used, rq->mapped) &&
        (on_stream ? _vs_pool_sync_stream_and_reclaim(p, rq->key, rq->stream) : _vs_pool_sync_and_reclaim(p)) ==
            CUDA_SUCCESS &&
        (b = take_block(p, rq)) != NULL)
      return b;
  }
  /* 3. Grow (again, while another thread takes what was grown). */
  for (;;) {
    CUresult r = _vs_pool_grow(p, rq->heap_id, rq->size, rq->align, false);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) break;
    if (r != CUDA_SUCCESS) {
      *err = r;
      *st = VS_POOL_ERROR;
      return NULL;
    }
    if ((b = take_block(p, rq)) != NULL) return b;
  }
  /* 4. Out of memory: wait for every pending free. */
  if (rq->pending && _vs_pool_sync_and_reclaim(p) == CUDA_SUCCESS && (b = take_block(p, rq)) != NULL) return b;
  /* 5. Give back every idle handle, and grow by exactly what is missing. */
  _vs_pool_trim(p, 0);
  CUresult r = _vs_pool_grow(p, rq->heap_id, rq->size, rq->align, true);
  if (r == CUDA_SUCCESS && (b = take_block(p, rq)) != NULL) return b;
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY) {
    *err = r;
    *st = VS_POOL_ERROR;
    return NULL;
  }
  /* (6. The process's other pools give back their idle memory: alloc.c.) */
  *err = CUDA_ERROR_OUT_OF_MEMORY;
  size_t want = round_up(rq->size, p->caps.min_granularity);
  *st = _vs_over_limit(want) || _vs_group_over((int)p->caps.device, want) ? VS_POOL_LIMIT : VS_POOL_OOM;
  return NULL;
}

/* A request of req bytes on stream: its block size, alignment and heap (policy.h), its stream. */
static inline vs_request_t request(const vs_pool_t *p, size_t req, CUstream stream, bool *contended) {
  vs_request_t rq = {.req = req, .stream = stream, .contended = contended};
  rq.size = vs_policy_block_size(req, p->gran, p->caps.min_granularity);
  rq.align = vs_policy_align(rq.size);
  rq.heap_id = vs_policy_heap_for(rq.size);
  rq.key = stream == VS_NO_STREAM ? NULL : _vs_stream_key(stream, &rq.owner);
  return rq;
}

vs_pool_status_t _vs_pool_alloc(vs_pool_t *p, size_t req, CUstream stream, vmmshim_api_t api, CUdeviceptr *ptr_out,
                                size_t *served_out, CUresult *cu_err, bool *contended) {
  (void)api;
  *cu_err = CUDA_SUCCESS;
  if (req > (SIZE_MAX >> 2)) {
    *cu_err = CUDA_ERROR_OUT_OF_MEMORY;
    return VS_POOL_OOM;
  }
  vs_request_t rq = request(p, req, stream, contended);
  vs_block_t *b = take_block(p, &rq);
  vs_pool_status_t st = VS_POOL_OK;
  if (vs_unlikely(!b)) b = alloc_slow(p, &rq, &st, cu_err);
  if (!b) return st;
  *ptr_out = b->addr;
  *served_out = b->size;
  return VS_POOL_OK;
}

vs_pool_status_t _vs_pool_alloc_host(vs_pool_t *p, size_t req, CUstream stream, CUdeviceptr *ptr_out,
                                     size_t *served_out, CUresult *cu_err, size_t *grown_out) {
  bool contended = false;
  vs_request_t rq = request(p, req, stream, &contended);
  *cu_err = CUDA_SUCCESS;
  *grown_out = 0;
  /* Grown, then taken: another thread may take what was grown, so a few times. */
  for (int tries = 0; tries < 4; tries++) {
    vs_block_t *b = take_block(p, &rq);
    if (b) {
      *ptr_out = b->addr;
      *served_out = b->size;
      return VS_POOL_OK;
    }
    size_t len = 0;
    CUresult r = _vs_pool_grow_host(p, rq.heap_id, rq.size, rq.align, &len);
    *grown_out += len;
    if (r != CUDA_SUCCESS) {
      *cu_err = r;
      return VS_POOL_OOM;
    }
  }
  *cu_err = CUDA_ERROR_OUT_OF_MEMORY;
  return VS_POOL_OOM;
}

/* ------------------------------------------------------------------ free */

/* The release threshold each device's program set on its default pool (pool.h); UINT64_MAX:
 * none. Read at every free: written only by cuMemPoolSetAttribute, so the line stays shared. */
static _Atomic uint64_t vs_release_threshold[VS_MAX_DEVICES] = {[0 ... VS_MAX_DEVICES - 1] = UINT64_MAX};

void _vs_pool_set_release_threshold(int dev, uint64_t bytes) {
  if (dev >= 0 && dev < VS_MAX_DEVICES) atomic_store_explicit(&vs_release_threshold[dev], bytes, memory_order_relaxed);
}

/* The idle bytes the pool may keep: VMMSHIM_RELEASE_THRESHOLD, or less where the program's
 * threshold binds. The program's counts the whole reserve, as the driver's does, so what
 * stream-ordered blocks hold or wait for comes off it; as the driver does, whole handles go
 * back while the reserve is above it, even if that takes it below. Lock held. */
static size_t idle_allowed(const vs_pool_t *p) {
  uint64_t env = _vs_option(VS_OPT_RELEASE_THRESHOLD);
  size_t allowed = env > SIZE_MAX ? SIZE_MAX : (size_t)env;
  unsigned dev = (unsigned)p->caps.device;
  uint64_t program =
      dev < VS_MAX_DEVICES ? atomic_load_explicit(&vs_release_threshold[dev], memory_order_relaxed) : UINT64_MAX;
  if (vs_unlikely(program != UINT64_MAX)) {
    uint64_t held = (uint64_t)p->stream_served + p->pending_bytes;
    uint64_t left = program > held ? program - held : 0;
    if (left < allowed) allowed = (size_t)left;
  }
  return allowed;
}

/* even_exported: free a block marked exported too (IPC gives back a block it held). */
/* A sync-mode free: cudaFree waits for the device, and so do we, before the block can be
 * reused; done before the block leaves the map, so the lock is never held across it. Returns
 * VS_POOL_OK to go on (*sync_mode false when the wait failed: the block then waits for a later
 * synchronisation), or what free_block returns at once. */
static vs_pool_status_t sync_before_free(vs_pool_t *p, CUdeviceptr ptr, bool even_exported, bool *sync_mode,
                                         size_t *size_out, size_t *requested_out, CUresult *err_out) {
  vs_block_t *b;
  pool_lock(p);
  HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
  bool exported = b && b->exported && !even_exported;
  if (exported) {
    *size_out = b->size;
    *requested_out = b->requested;
  }
  pool_unlock(p);
  if (!b) return VS_POOL_NOT_OWNED;
  if (exported) return VS_POOL_EXPORTED;
  /* A sync while another thread captures a graph would invalidate its capture. */
  CUresult r =
      atomic_load(&_vs_captures_active) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : _vs_pool_sync_and_reclaim(p);
  if (r != CUDA_SUCCESS) {
    /* Not waited for: the block is reused only after a later synchronisation succeeds. */
    _vs_debug("free 0x%llx: cuCtxSynchronize: %s; block reused after a later synchronisation",
              (unsigned long long)ptr, _vs_cu_error_name(r));
    *sync_mode = false;
    if (r != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT &&
        r != CUDA_ERROR_DEINITIALIZED && r != CUDA_ERROR_CONTEXT_IS_DESTROYED)
      *err_out = r; /* a sticky context error: the real cudaFree reports it too */
  }
  return VS_POOL_OK;
}

/* Where a block out of the map goes, as its free's kind says (under the pool lock). True when
 * the stream's older freed blocks are to be sealed after the unlock. */
static bool place_freed(vs_pool_t *p, vs_block_t *b, vs_free_kind_t kind, bool sync_mode, CUstream key,
                        CUstream stream, const void *owner) {
  if (sync_mode) {
    _vs_block_make_free(p, b);
    return false;
  }
  if (kind == VS_FREE_KIND_ORDERED) {
    /* Free for the stream's later work at once; its handle stays mapped until work queued
     * before this free is known done (space.c: unmap_idle). */
    p->ordered_need = p->sync_seq + 1;
    _vs_block_make_free(p, b);
    return false;
  }
  vs_stream_t *s = kind == VS_FREE_KIND_STREAM ? _vs_stream_get(p, key, stream, owner, true) : NULL;
  if (s) return pend_on_stream(p, b, s);
  /* Deferred; or a sync-mode free whose synchronisation failed, or a stream's free with no
   * host memory for the stream's record: those wait as the mode's cudaFree would. */
  b->state = B_PENDING;
  b->freed_seq = p->sync_seq;
  p->pending_bytes += b->size;
  list_push(&p->deferred, b);
  if (kind == VS_FREE_KIND_DEFERRED ||
      (kind == VS_FREE_KIND_STREAM && _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED)) {
    _vs_pool_start_reclaimer(p);
    pthread_cond_signal(&p->wake);
  }
  return false;
}

/* Whether idle memory goes back after this free, and down to what (under the pool lock).
 * VMMSHIM_RELEASE_THRESHOLD and the program's release_threshold bound idle memory; a try is
 * repeated only once idle memory has grown by a handle since the last one, so a pool whose idle
 * memory sits in partly used handles does not rescan on every free. A member of the budget
 * waiting for bytes (VMMSHIM_ON_LIMIT=wait) has idle memory go back now. */
static bool trim_after_free(vs_pool_t *p, size_t *threshold) {
  *threshold = idle_allowed(p);
  bool trim = vs_unlikely(p->free_bytes > *threshold) && p->free_bytes >= p->trim_retry_at;
  if (trim) p->trim_retry_at = p->free_bytes + p->gran;
  if (vs_unlikely(_vs_budget_wanted()) && p->free_bytes >= p->caps.min_granularity) {
    trim = true;
    *threshold = 0;
  }
  return trim;
}

static vs_pool_status_t free_block(vs_pool_t *p, CUdeviceptr ptr, vs_free_kind_t kind, CUstream stream,
                                   vmmshim_api_t api, size_t *size_out, size_t *requested_out, CUresult *err_out,
                                   bool even_exported) {
  *err_out = CUDA_SUCCESS;
  if (!ptr) return VS_POOL_NOT_OWNED; /* address 0 is the map's anchor */
  vs_assert((kind == VS_FREE_KIND_STREAM) == (stream != VS_NO_STREAM));
  const void *owner = NULL;
  CUstream key = kind == VS_FREE_KIND_STREAM ? _vs_stream_key(stream, &owner) : NULL;
  bool sync_mode = kind == VS_FREE_KIND_SYNC;
  if (sync_mode) {
    vs_pool_status_t st = sync_before_free(p, ptr, even_exported, &sync_mode, size_out, requested_out, err_out);
    if (st != VS_POOL_OK) return st;
  }
  vs_block_t *b;
  pool_lock(p);
  HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
  if (!b) {
    pool_unlock(p);
    return VS_POOL_NOT_OWNED;
  }
  vs_assert(b->state == B_USED);
  *size_out = b->size;
  *requested_out = b->requested;
  if (vs_unlikely(b->exported) && !even_exported) {
    pool_unlock(p);
    return VS_POOL_EXPORTED;
  }
  HASH_DELETE(hh, p->map, b);
  p->used -= b->size;
  if (b->stream_ordered) {
    p->stream_served -= b->size;
    p->stream_requested -= b->requested;
  } else {
    note_reserve(p);
  }
  bool seal = place_freed(p, b, kind, sync_mode, key, stream, owner);
  size_t threshold;
  bool trim = trim_after_free(p, &threshold);
  /* The free's record takes its place in the trace before another thread can have the
   * range, and is written after the unlock (nothing else is traced in between). */
  vs_trace_place_t at = {NULL, 0};
  if (vs_unlikely(_vs_trace_on)) at = _vs_trace_place();
  pool_unlock(p);
  if (vs_unlikely(at.rec != NULL)) _vs_trace_free_at(at, api, ptr, *size_out, stream, (int)p->caps.device);
  if (seal) _vs_pool_reclaim_by_events(p, _vs_thread_tag(), VS_SEAL_KEEP);
  if (trim) {
    _vs_pool_trim(p, threshold);
    pool_lock(p);
    if (p->free_bytes <= threshold) p->trim_retry_at = 0;
    pool_unlock(p);
  }
  return VS_POOL_OK;
}

vs_pool_status_t _vs_pool_free(vs_pool_t *p, CUdeviceptr ptr, vs_free_kind_t kind, CUstream stream, vmmshim_api_t api,
                               size_t *size_out, size_t *requested_out, CUresult *err_out) {
  return free_block(p, ptr, kind, stream, api, size_out, requested_out, err_out, false);
}

vs_pool_status_t _vs_pool_free_exported(vs_pool_t *p, CUdeviceptr ptr, vmmshim_api_t api, size_t *size_out,
                                        size_t *requested_out, CUresult *err_out) {
  /* The program's free was long ago: whatever order held then, the block waits as the mode says. */
  vs_free_kind_t kind = _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED ? VS_FREE_KIND_DEFERRED : VS_FREE_KIND_SYNC;
  return free_block(p, ptr, kind, VS_NO_STREAM, api, size_out, requested_out, err_out, true);
}

bool _vs_pool_set_exported(vs_pool_t *p, CUdeviceptr ptr, bool exported) {
  if (!ptr) return false;
  pool_lock(p);
  vs_block_t *b;
  HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
  if (b) b->exported = exported;
  pool_unlock(p);
  return b != NULL;
}

/* ------------------------------------------------------------------ lookups */

bool _vs_pool_range(vs_pool_t *p, CUdeviceptr addr, CUdeviceptr *base_out, size_t *size_out) {
  bool found = false;
  if (!addr) return false;
  pool_lock(p);
  vs_block_t *b;
  HASH_FIND(hh, p->map, &addr, sizeof addr, b);
  if (!b) {
    /* Interior pointer: rare (cuMemGetAddressRange, cuPointerGetAttribute); a scan is fine. */
    for (vs_block_t *c = p->map; c; c = c->hh.next)
      if (addr >= c->addr && addr < c->addr + c->requested) {
        b = c;
        break;
      }
  }
  if (b) {
    *base_out = b->addr;
    *size_out = b->requested;
    found = true;
  }
  pool_unlock(p);
  return found;
}

bool _vs_pool_block(vs_pool_t *p, CUdeviceptr ptr, size_t *served_out, size_t *requested_out) {
  if (!ptr) return false;
  pool_lock(p);
  vs_block_t *b;
  HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
  bool found = b && b != &p->map_anchor && b->state == B_USED;
  if (found) {
    *served_out = b->size;
    *requested_out = b->requested;
  }
  pool_unlock(p);
  return found;
}

size_t _vs_pool_idle_bytes(vs_pool_t *p) {
  pool_lock(p);
  size_t n = p->free_bytes;
  pool_unlock(p);
  return n;
}

void _vs_pool_usage(vs_pool_t *p, vs_pool_usage_t *out) {
  pool_lock(p);
  out->reserved = stream_reserve(p);
  out->reserved_high = p->reserved_high > out->reserved ? p->reserved_high : out->reserved;
  out->used = p->stream_requested;
  out->used_high = p->stream_requested_high;
  out->idle = p->free_bytes;
  pool_unlock(p);
}

void _vs_pool_reset_high(vs_pool_t *p, bool reserved, bool used) {
  pool_lock(p);
  if (reserved) p->reserved_high = stream_reserve(p);
  if (used) p->stream_requested_high = p->stream_requested;
  pool_unlock(p);
}

size_t _vs_pool_apply_release_threshold(vs_pool_t *p) {
  pool_lock(p);
  size_t keep = idle_allowed(p);
  bool over = p->free_bytes > keep;
  p->trim_retry_at = 0;
  pool_unlock(p);
  return over ? _vs_pool_trim(p, keep) : 0;
}

static void add_pending(vs_pool_t *p, const vs_list_t *l, vs_pool_figures_t *f) {
  for (const vs_block_t *b = l->head; b; b = b->fnext) f->pending[heap_id_of(p, b)] += b->size;
}

void _vs_pool_figures(vs_pool_t *p, vs_pool_figures_t *f) {
  memset(f, 0, sizeof *f);
  pool_lock(p);
  for (int heap_id = 0; heap_id < VS_NHEAPS; heap_id++) {
    vs_heap_t *heap = &p->heaps[heap_id];
    f->mapped[heap_id] = heap->mapped;
    f->idle[heap_id] = heap->free_bytes;
    for (unsigned i = 0; i < VS_NBINS; i++)
      for (vs_block_t *b = heap->bins[i]; b; b = b->fnext) f->idle_whole += _vs_pool_whole_handles_in(p, b);
  }
  add_pending(p, &p->deferred, f);
  for (vs_stream_t *s = p->streams; s; s = s->hh.next) add_pending(p, &s->pending, f);
  for (vs_batch_t *bt = p->batches; bt; bt = bt->next) add_pending(p, &bt->blocks, f);
  for (vs_block_t *b = p->map; b; b = b->hh.next) {
    if (b == &p->map_anchor) continue;
    f->live[heap_id_of(p, b)] += b->size;
    f->live_blocks++;
    f->requested += b->requested;
  }
  f->handles = p->segs.n;
  pool_unlock(p);
}

void _vs_pool_figures_add(vs_pool_figures_t *sum, const vs_pool_figures_t *f) {
  for (int h = 0; h < VS_NHEAPS; h++) {
    sum->mapped[h] += f->mapped[h];
    sum->live[h] += f->live[h];
    sum->idle[h] += f->idle[h];
    sum->pending[h] += f->pending[h];
  }
  sum->idle_whole += f->idle_whole;
  sum->live_blocks += f->live_blocks;
  sum->requested += f->requested;
  sum->handles += f->handles;
}
