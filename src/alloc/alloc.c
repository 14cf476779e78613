/* alloc.c: what both hook layers call. Finds the pool of the current context (creating
 * it on first use), serves or frees through it, and keeps stats, log and trace.
 *
 * Where cudaFree lands: hook_rt.c cudaFree -> _vs_free (here: directory.c names the arena, and
 *   free_kind says how the block goes: sync, deferred, ordered or stream) -> _vs_pool_free (pool.c).
 * A static runtime's cudaFree arrives at hook_drv.c cuMemFree_v2 -> _vs_free. */
#include <pthread.h>
#include <string.h>

#include "vmmshim/alloc.h"

#define VS_MAX_POOLS 64 /* contexts */

#define VS_MAX_PARKED 8 /* pools of one tag off allocation, per context */

/* A context's pools: its arenas, per tag. A thread allocates from one arena of its tag; when
 * it finds that arena's lock taken too often, it moves to another (created on first use), so
 * threads that allocate at the same time stop sharing a lock, while a program whose threads
 * do not contend keeps all its memory in arena 0. Frees go to the arena that owns the address,
 * whichever thread frees. Each tag has pools of its own: no handle ever holds two tags.
 * A pool whose tag sleeps is parked: off allocation (its free blocks may be unmapped), still
 * found by frees, reports and trims; a woken pool returns to a free arena of its tag, or stays
 * parked (serving frees only) when every arena has a pool again. */
typedef struct vs_pool_slot_s {
  CUcontext ctx;           /* NULL: free slot (its context was dropped) */
  bool passthrough;        /* no VMM support, no address space: allocations pass through */
  vs_device_caps_t caps;
  vs_pool_t *_Atomic arenas[VS_MAX_TAGS][VS_MAX_ARENAS];
  vs_pool_t *parked[VS_MAX_TAGS][VS_MAX_PARKED]; /* under vs_slots_lock */
  atomic_uint_least64_t taken; /* arenas a thread has moved to (bit i: arena i) */
} vs_pool_slot_t;

static vs_pool_slot_t vs_slots[VS_MAX_POOLS];
static atomic_int vs_nslots;      /* slots ever used; dropped ones have ctx NULL */
static atomic_uint vs_slots_gen;  /* bumped when a pool is dropped: invalidates thread caches */
static atomic_uint vs_arena_next; /* where the next thread that moves goes */
static vs_lock_t vs_slots_lock = VS_LOCK_INITIALIZER(VS_RANK_SLOTS, "context slots");

static _Thread_local CUcontext tl_ctx;
static _Thread_local vs_pool_slot_t *tl_slot;
static _Thread_local vs_pool_t *tl_pool;
static _Thread_local unsigned tl_gen;
static _Thread_local int tl_pool_tag;
static _Thread_local unsigned tl_arena;          /* this thread's arena index */
static _Thread_local unsigned tl_window, tl_hits; /* allocations and contended ones, this window */

#define VS_CONTEND_WINDOW 64
#define VS_CONTEND_MOVE 4 /* contended allocations per window that make a thread move */


/* Set when the context given to slot_create_slow is destroyed (after cudaDeviceReset the
 * thread may still hold the old handle): the caller treats it as no context at all. */
static _Thread_local bool tl_dead_context;

static vs_pool_slot_t *slot_find(CUcontext ctx) {
  int n = atomic_load_explicit(&vs_nslots, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (vs_slots[i].ctx == ctx) return &vs_slots[i];
  return NULL;
}

static void slots_lock(void) { _vs_lock_take(&vs_slots_lock); }
static void slots_unlock(void) { _vs_lock_release(&vs_slots_lock); }

/* A context's first allocation: its device is queried and its first pool created with no
 * lock held (both are driver calls), then the slot is filled under the lock. A thread that
 * raced us there keeps its pool; ours is dropped. */
static vs_pool_slot_t *slot_create_slow(CUcontext ctx) {
  tl_dead_context = false;
  slots_lock();
  vs_pool_slot_t *slot = slot_find(ctx);
  slots_unlock();
  if (slot) return slot;
  CUdevice dev = 0;
  vs_device_caps_t caps;
  memset(&caps, 0, sizeof caps);
  CUresult r = _vs_cu.cuCtxGetDevice(&dev);
  if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT) {
    tl_dead_context = true;
    return NULL;
  }
  vs_pool_t *pool = NULL;
  _vs_tags_init();
  _vs_group_join();
  if (r == CUDA_SUCCESS) r = _vs_vmm_query(dev, &caps);
  if (r != CUDA_SUCCESS) {
    _vs_warn("device %d: cannot query VMM support (%s); its allocations pass through", (int)dev,
             _vs_cu_error_name(r));
  } else if (!caps.vmm_supported) {
    _vs_note("device %d has no virtual memory management support; its allocations pass through", (int)dev);
  } else {
    pool = _vs_pool_create(ctx, &caps, _vs_peer_state(ctx, (int)caps.device)); /* tag 0's arena 0 */
    uint64_t ahead = _vs_option(VS_OPT_HOST_RESERVE);
    if (pool && ahead && _vs_host_reserve(&caps, (size_t)ahead) != CUDA_SUCCESS)
      _vs_warn("VMMSHIM_HOST_RESERVE: could not make %llu bytes of host memory ahead (device %d)",
               (unsigned long long)ahead, (int)dev);
  }
  vs_pool_t *unused = NULL;
  slots_lock();
  slot = slot_find(ctx);
  if (slot) {
    unused = pool;
  } else {
    int n = atomic_load(&vs_nslots), i;
    for (i = 0; i < n && vs_slots[i].ctx; i++) {
    }
    if (i < VS_MAX_POOLS) {
      slot = &vs_slots[i];
      slot->caps = caps;
      slot->passthrough = pool == NULL;
      for (int t = 0; t < VS_MAX_TAGS; t++)
        for (int a = 0; a < VS_MAX_ARENAS; a++) atomic_store(&slot->arenas[t][a], NULL);
      memset(slot->parked, 0, sizeof slot->parked);
      atomic_store(&slot->arenas[0][0], pool);
      atomic_store(&slot->taken, 1);
      slot->ctx = ctx;
      if (i == n) atomic_store(&vs_nslots, n + 1);
    } else {
      _vs_warn("more than %d contexts; context %p passes through", VS_MAX_POOLS, (void *)ctx);
      unused = pool;
    }
  }
  slots_unlock();
  if (unused) _vs_pool_destroy(unused);
  return slot;
}

/* Arena idx of a slot's tag, created on first use (outside the lock: creating reserves
 * address space); that tag's arena 0 if it cannot be, NULL if neither can (the allocation then
 * passes through: a tag never borrows another's handles). */
static vs_pool_t *arena_get(vs_pool_slot_t *slot, int tag, unsigned idx) {
  vs_pool_t *pool = atomic_load_explicit(&slot->arenas[tag][idx], memory_order_acquire);
  if (vs_likely(pool != NULL)) return pool;
  for (;;) {
    slots_lock();
    CUcontext ctx = slot->ctx;
    vs_device_caps_t caps = slot->caps;
    slots_unlock();
    vs_pool_t *made = ctx ? _vs_pool_create(ctx, &caps, _vs_peer_state(ctx, (int)caps.device)) : NULL;
    if (made) {
      _vs_pool_set_tag(made, tag);
      slots_lock();
      vs_pool_t *expected = NULL;
      if (slot->ctx == ctx && atomic_compare_exchange_strong(&slot->arenas[tag][idx], &expected, made)) made = NULL;
      slots_unlock();
      if (made) _vs_pool_destroy(made); /* another thread made it first, or the context went away */
    }
    pool = atomic_load_explicit(&slot->arenas[tag][idx], memory_order_acquire);
    if (pool || idx == 0) return pool;
    idx = 0;
    if ((pool = atomic_load_explicit(&slot->arenas[tag][0], memory_order_acquire)) != NULL) return pool;
  }
}

/* The calling thread's arena of a context and tag (created on first use); NULL when that
 * context passes through. */
static vs_pool_t *pool_for(CUcontext ctx, int tag) {
  unsigned gen = atomic_load_explicit(&vs_slots_gen, memory_order_acquire);
  if (vs_likely(ctx == tl_ctx && gen == tl_gen && tag == tl_pool_tag)) return tl_pool;
  vs_pool_slot_t *slot = slot_find(ctx);
  if (!slot) {
    slot = slot_create_slow(ctx);
    if (tl_dead_context || !slot) return NULL;
  }
  vs_pool_t *pool = slot->passthrough ? NULL : arena_get(slot, tag, tl_arena % (unsigned)_vs_option(VS_OPT_ARENAS));
  tl_ctx = ctx;
  tl_slot = slot;
  tl_pool = pool;
  tl_gen = gen;
  tl_pool_tag = tag;
  return pool;
}

/* The arena a contending thread moves to: one no other thread has moved to yet, so that
 * N contending threads end up on N arenas; once all are taken, the next in turn. */
static unsigned arena_to_move_to(vs_pool_slot_t *slot, unsigned n) {
  for (unsigned i = 1; slot && i < n; i++) {
    uint64_t bit = 1ull << i;
    if (!(atomic_load_explicit(&slot->taken, memory_order_relaxed) & bit) &&
        !(atomic_fetch_or_explicit(&slot->taken, bit, memory_order_relaxed) & bit))
      return i;
  }
  return atomic_fetch_add_explicit(&vs_arena_next, 1, memory_order_relaxed) % n;
}

/* Counts how often this thread found its arena's lock taken by another allocating thread;
 * past a threshold it moves to another arena. */
static void note_contention(bool contended) {
  tl_hits += contended;
  if (vs_unlikely(tl_hits >= VS_CONTEND_MOVE)) {
    unsigned n = (unsigned)_vs_option(VS_OPT_ARENAS);
    if (n > 1) {
      unsigned to = arena_to_move_to(tl_ctx ? tl_slot : NULL, n);
      if (to == tl_arena % n) to = (to + 1) % n;
      tl_arena = to;
      tl_ctx = NULL; /* resolve the arena again on the next allocation */
    }
    tl_window = tl_hits = 0;
  } else if (++tl_window >= VS_CONTEND_WINDOW) {
    tl_window = tl_hits = 0;
  }
}

/* Puts the calling thread on arena idx (modulo VMMSHIM_ARENAS) from its next allocation,
 * as contention would; lets tests place threads where they want them. */
void _vs_arena_select(unsigned idx) {
  if (tl_ctx && tl_slot && idx < 64) atomic_fetch_or(&tl_slot->taken, 1ull << idx);
  tl_arena = idx;
  tl_ctx = NULL;
  tl_window = tl_hits = 0;
}

/* The pool of the calling thread's current context, or of the stream's context when the
 * thread has none (the runtime binds no context to a thread whose first call is
 * cudaMallocAsync: the driver takes it from the stream). */
static vs_pool_t *current_pool(CUstream stream, int tag, CUcontext *ctx_out) {
  CUcontext ctx = NULL;
  if (_vs_cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) ctx = NULL;
  if (!ctx && stream != VS_NO_STREAM && stream != NULL && stream != CU_STREAM_LEGACY &&
      stream != CU_STREAM_PER_THREAD && _vs_cu.cuStreamGetCtx(stream, &ctx) != CUDA_SUCCESS)
    ctx = NULL;
  vs_pool_t *pool = ctx ? pool_for(ctx, tag) : NULL;
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

#define VS_SLOT_POOLS (VS_MAX_TAGS * (VS_MAX_ARENAS + VS_MAX_PARKED))

/* Every pool of a slot (each tag's arenas, then the parked ones), copied under the slots lock
 * for the caller to use without it; *parked_from: the index where the parked ones start. */
static int slot_pools(vs_pool_slot_t *slot, vs_pool_t **out, int *parked_from) {
  int n = 0;
  slots_lock();
  if (slot->ctx) {
    for (int t = 0; t < VS_MAX_TAGS; t++)
      for (int a = 0; a < VS_MAX_ARENAS; a++)
        if ((out[n] = atomic_load(&slot->arenas[t][a])) != NULL) n++;
    if (parked_from) *parked_from = n;
    for (int t = 0; t < VS_MAX_TAGS; t++)
      for (int k = 0; k < VS_MAX_PARKED; k++)
        if ((out[n] = slot->parked[t][k]) != NULL) n++;
  } else if (parked_from) {
    *parked_from = 0;
  }
  slots_unlock();
  return n;
}

/* Calls fn for every pool of every live context (rare paths). */
/* Every pool of the process, or those of one tag and/or one device (-1: any). */
static void visit(int tag, int dev, void (*fn)(vs_pool_t *pool, void *arg), void *arg) {
  vs_pool_t *pools[VS_SLOT_POOLS];
  for (int s_ = 0, n_ = atomic_load_explicit(&vs_nslots, memory_order_acquire); s_ < n_; s_++) {
    int n = slot_pools(&vs_slots[s_], pools, NULL);
    for (int i = 0; i < n; i++)
      if ((tag < 0 || _vs_pool_tag(pools[i]) == tag) && (dev < 0 || _vs_pool_device(pools[i]) == dev))
        fn(pools[i], arg);
  }
}

static void visit_all(void (*fn)(vs_pool_t *pool, void *arg), void *arg) { visit(-1, -1, fn, arg); }

/* Out of memory in one arena: the process's other pools give back what they hold idle (after
 * their pending frees complete), and the allocation is tried once more. Which pools: the
 * context's others (its other arenas, other tags' and parked ones), the other contexts of the
 * same device (their memory is the same device's), and, when a limit refused (limit: it counts
 * every device, or a group's members, together), every pool of the process. Other processes' idle
 * memory is theirs. Returns the bytes given back: memory that was scattered over idle handles. */
static size_t release_elsewhere(vs_pool_t *self, bool limit) {
  vs_pool_slot_t *own = slot_find(_vs_pool_context(self));
  int dev = _vs_pool_device(self);
  vs_pool_t *pools[VS_SLOT_POOLS];
  size_t got = 0;
  for (int s_ = 0, n_ = atomic_load_explicit(&vs_nslots, memory_order_acquire); s_ < n_; s_++) {
    vs_pool_slot_t *slot = &vs_slots[s_];
    if (slot != own && !limit && (int)slot->caps.device != dev) continue;
    int n = slot_pools(slot, pools, NULL);
    CUcontext popped;
    bool pushed = slot != own && n && _vs_cu.cuCtxPushCurrent(_vs_pool_context(pools[0])) == CUDA_SUCCESS;
    for (int i = 0; i < n; i++) {
      if (pools[i] == self) continue;
      if (slot == own || pushed) _vs_pool_reclaim(pools[i]); /* needs the pool's context current */
      got += _vs_pool_trim(pools[i], 0);
    }
    if (pushed) _vs_cu.cuCtxPopCurrent(&popped);
  }
  return got;
}

vs_alloc_result_t _vs_alloc(vmmshim_api_t api, size_t size, CUstream stream, CUdeviceptr *ptr, CUresult *err) {
  if (vs_unlikely(_vs_guard) || !_vs_active() || size == 0 || !ptr) return VS_ALLOC_PASS;
  if (stream != VS_NO_STREAM && stream_capturing(stream)) {
    /* Graph memory nodes: addresses fixed for the graph's life, GPU-ordered; the runtime's. */
    VS_STAT_ADD(passthrough_allocs, 1);
    return VS_ALLOC_PASS;
  }
  CUcontext ctx;
  const vs_rule_t *rule;
  vs_pool_t *pool = current_pool(stream, _vs_alloc_tag(size, &rule), &ctx);
  if (vs_unlikely(!pool)) {
    if (!ctx) return VS_ALLOC_NO_CONTEXT;
    VS_STAT_ADD(passthrough_allocs, 1);
    return VS_ALLOC_PASS;
  }
  size_t served = 0;
  CUresult cerr = CUDA_SUCCESS;
  bool contended = false;
  vs_pool_status_t st = _vs_pool_alloc(pool, size, stream, api, ptr, &served, &cerr, &contended);
  size_t scattered = 0;
  if (vs_unlikely(st == VS_POOL_OOM || st == VS_POOL_LIMIT)) {
    scattered = release_elsewhere(pool, st == VS_POOL_LIMIT);
    if (scattered) st = _vs_pool_alloc(pool, size, stream, api, ptr, &served, &cerr, &contended);
    if ((st == VS_POOL_OOM || st == VS_POOL_LIMIT) && _vs_option(VS_OPT_ON_LIMIT) != VS_ON_LIMIT_FAIL)
      st = _vs_on_limit(pool, st, size, stream, api, ptr, &served, &cerr);
  }
  note_contention(contended);
  int dev = _vs_pool_device(pool);
  if (vs_likely(st == VS_POOL_OK)) {
    _vs_stat_alloc(api, served, size);
    if (vs_unlikely(_vs_trace_on)) {
      if (rule) _vs_trace_rule(*ptr, rule->index, dev, _vs_tag_name(rule->tag), rule->text);
      _vs_trace_alloc(api, size, served, *ptr, stream, dev);
    }
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
  _vs_report_oom(api, size, dev, st == VS_POOL_LIMIT, scattered);
  *err = CUDA_ERROR_OUT_OF_MEMORY;
  return VS_ALLOC_FAILED;
}

/* How a free of pool's block lets it go (pool.h), decided here and nowhere else: on a stream,
 * in that stream's order; without one, as the free mode says, except that in deferred mode,
 * while all work so far has gone to one stream of the pool's context, in that stream's order
 * (order.c; the order is never on in sync mode). */
static vs_free_kind_t free_kind(vs_pool_t *pool, CUstream stream) {
  if (stream != VS_NO_STREAM) return VS_FREE_KIND_STREAM;
  vs_order_view_t order = _vs_order_view();
  if (order.state == VS_ORDER_ONE && order.ctx == _vs_pool_context(pool)) return VS_FREE_KIND_ORDERED;
  return _vs_option(VS_OPT_FREE_MODE) == VS_FREE_SYNC ? VS_FREE_KIND_SYNC : VS_FREE_KIND_DEFERRED;
}

/* Where cudaFree lands: the directory names the arena that reserved the address, and that
 * arena frees the block (or says it is not the start of a live one). A sync-mode free
 * synchronises the arena's context, made current for the call if another one is. */
bool _vs_free(vmmshim_api_t api, CUdeviceptr ptr, CUstream stream, CUresult *err) {
  *err = CUDA_SUCCESS;
  if (vs_unlikely(_vs_guard) || !ptr || !_vs_active()) return false;
  vs_pool_t *pool = _vs_dir_lookup(ptr);
  if (!pool) return false;
  vs_free_kind_t kind = free_kind(pool, stream);
  bool switch_ctx = false;
  if (kind == VS_FREE_KIND_SYNC) {
    CUcontext cur = NULL;
    if (_vs_cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS) cur = NULL;
    switch_ctx = cur != _vs_pool_context(pool);
  }
  size_t size = 0, requested = 0;
  CUcontext saved = NULL;
  if (switch_ctx) _vs_cu.cuCtxPushCurrent(_vs_pool_context(pool));
  vs_pool_status_t st = _vs_pool_free(pool, ptr, kind, stream, api, &size, &requested, err);
  /* A block shared by IPC (the pool marks it): ipc.c decides; it unmarks one it lets go. */
  for (int tries = 0; vs_unlikely(st == VS_POOL_EXPORTED) && tries < 4; tries++) {
    vs_ipc_free_t f = _vs_ipc_on_free(pool, ptr, api);
    if (f != VS_IPC_FREE_NOW) {
      if (switch_ctx) _vs_cu.cuCtxPopCurrent(&saved);
      if (f == VS_IPC_FREE_TWICE) return false; /* freed already: the driver answers for an unknown pointer */
      _vs_stat_free(api, size, requested);       /* another process has it open: the pool gets it back later */
      return true;
    }
    st = _vs_pool_free(pool, ptr, kind, stream, api, &size, &requested, err);
  }
  if (switch_ctx) _vs_cu.cuCtxPopCurrent(&saved);
  if (st != VS_POOL_OK) return false;
  _vs_stat_free(api, size, requested);
  _vs_debug("free api %d 0x%llx (%zu bytes)", (int)api, (unsigned long long)ptr, size);
  return true;
}

bool _vs_lookup_range(CUdeviceptr addr, CUdeviceptr *base, size_t *size) {
  if (_vs_guard || atomic_load(&_vs_state) != 1) return false;
  vs_pool_t *pool = _vs_dir_lookup(addr);
  return pool && _vs_pool_range(pool, addr, base, size);
}

void _vs_adjust_mem_info(size_t *free_bytes, size_t *total_bytes) {
  if (_vs_guard || !_vs_active()) return;
  CUcontext ctx;
  current_pool(VS_NO_STREAM, _vs_current_tag(), &ctx);
  vs_pool_slot_t *slot = ctx ? slot_find(ctx) : NULL;
  size_t idle = 0;
  vs_pool_t *pools[VS_SLOT_POOLS];
  int n = slot ? slot_pools(slot, pools, NULL) : 0;
  for (int i = 0; i < n; i++)
    if (!_vs_pool_asleep(pools[i], NULL, NULL)) idle += _vs_pool_idle_bytes(pools[i]); /* asleep: not on the device */
  if (free_bytes) *free_bytes += idle;
  uint64_t limit = _vs_limit();
  if (limit) {
    size_t mapped = _vs_mapped_total();
    size_t left = limit > mapped ? (size_t)(limit - mapped) + idle : idle;
    if (free_bytes && *free_bytes > left) *free_bytes = left;
    if (total_bytes && *total_bytes > limit) *total_bytes = (size_t)limit;
  }
  /* The budget (a group's, or per device): what is left under it, never below zero. */
  size_t left = 0, cap = 0;
  if (slot && _vs_group_headroom((int)slot->caps.device, &left, &cap)) {
    left = left > SIZE_MAX - idle ? SIZE_MAX : left + idle;
    if (free_bytes && *free_bytes > left) *free_bytes = left;
    if (total_bytes && *total_bytes > cap) *total_bytes = cap;
  }
  /* Never more free than the device has (as reported). */
  if (free_bytes && total_bytes && *free_bytes > *total_bytes) *free_bytes = *total_bytes;
}

static void stream_destroyed(vs_pool_t *pool, void *stream) { _vs_pool_stream_destroyed(pool, (CUstream)stream); }

void _vs_stream_destroyed(CUstream stream) {
  if (_vs_guard || atomic_load(&_vs_state) != 1) return;
  visit_all(stream_destroyed, (void *)stream);
}

/* The context is going away (cuCtxDestroy, cuDevicePrimaryCtxReset): its memory goes
 * with it, as cudaMalloc memory does. */
void _vs_drop_context(CUcontext ctx, int dev) {
  if (_vs_guard || atomic_load(&_vs_state) != 1) return;
  vs_pool_t *dropped[VS_SLOT_POOLS];
  int n = 0;
  slots_lock();
  vs_pool_slot_t *slot = slot_find(ctx);
  if (slot) {
    slot->ctx = NULL;
    atomic_fetch_add(&vs_slots_gen, 1);
    if (!slot->passthrough) _vs_info("context %p on device %d is going away: dropping its pools", (void *)ctx, dev);
    for (int t = 0; t < VS_MAX_TAGS; t++) {
      for (int a = 0; a < VS_MAX_ARENAS; a++) {
        vs_pool_t *pool = atomic_exchange(&slot->arenas[t][a], NULL);
        if (pool) dropped[n++] = pool;
      }
      for (int k = 0; k < VS_MAX_PARKED; k++) {
        if (slot->parked[t][k]) dropped[n++] = slot->parked[t][k];
        slot->parked[t][k] = NULL;
      }
    }
  }
  slots_unlock();
  /* Unmapping is a driver call: outside the lock, the pools already out of every table. */
  for (int i = 0; i < n; i++) {
    _vs_ipc_forget_pool(dropped[i]);
    _vs_pool_destroy(dropped[i]);
  }
  _vs_peer_forget(ctx);
}

static void trim_one(vs_pool_t *pool, void *total) {
  /* What is still pending (deferred frees, frees on streams) must complete first. */
  CUcontext popped;
  if (_vs_cu.cuCtxPushCurrent(_vs_pool_context(pool)) == CUDA_SUCCESS) {
    _vs_pool_reclaim(pool);
    _vs_cu.cuCtxPopCurrent(&popped);
  }
  *(size_t *)total += _vs_pool_trim(pool, 0);
  /* Host memory served past the limit that no block uses any more goes back too. */
  atomic_fetch_sub(&_vs_host_mapped_bytes, _vs_pool_drop_idle_spilled(pool));
}

size_t _vs_trim_all(void) {
  if (!_vs_active()) return 0;
  size_t total = 0;
  visit_all(trim_one, &total);
  return total;
}

/* ------------------------------------------------------------------ for sleep.c */

void _vs_sync_contexts(void) {
  for (int s_ = 0, n_ = atomic_load_explicit(&vs_nslots, memory_order_acquire); s_ < n_; s_++) {
    slots_lock();
    CUcontext ctx = vs_slots[s_].passthrough ? NULL : vs_slots[s_].ctx;
    slots_unlock();
    CUcontext popped;
    if (!ctx || _vs_cu.cuCtxPushCurrent(ctx) != CUDA_SUCCESS) continue;
    CUresult r = _vs_cu.cuCtxSynchronize();
    if (r != CUDA_SUCCESS) _vs_warn("context %p: cuCtxSynchronize before moving memory: %s", (void *)ctx, _vs_cu_error_name(r));
    _vs_cu.cuCtxPopCurrent(&popped);
  }
}

size_t _vs_release_host(size_t keep) {
  for (int s_ = 0, n_ = atomic_load_explicit(&vs_nslots, memory_order_acquire); s_ < n_; s_++) {
    slots_lock();
    bool usable = vs_slots[s_].ctx && !vs_slots[s_].passthrough;
    vs_device_caps_t caps = vs_slots[s_].caps;
    slots_unlock();
    if (usable) return _vs_host_trim(&caps, keep); /* any device's caps: each buffer knows its own */
  }
  return 0;
}

int _vs_park_tag(int tag, vs_parked_t *out, int max) {
  int n = 0;
  slots_lock();
  for (int s_ = 0, ns = atomic_load(&vs_nslots); s_ < ns; s_++) {
    vs_pool_slot_t *slot = &vs_slots[s_];
    if (!slot->ctx || slot->passthrough) continue;
    for (int a = 0; a < VS_MAX_ARENAS; a++) {
      vs_pool_t *pool = atomic_load(&slot->arenas[tag][a]);
      if (!pool) continue;
      int k = 0;
      while (k < VS_MAX_PARKED && slot->parked[tag][k]) k++;
      if (k == VS_MAX_PARKED || n == max) break; /* no room: the rest stays on allocation, awake */
      slot->parked[tag][k] = pool;
      atomic_store(&slot->arenas[tag][a], NULL);
    }
    for (int k = 0; k < VS_MAX_PARKED && n < max; k++)
      if (slot->parked[tag][k]) out[n++] = (vs_parked_t){slot->parked[tag][k], slot->ctx};
  }
  atomic_fetch_add(&vs_slots_gen, 1); /* threads resolve their arena again: none is parked */
  slots_unlock();
  return n;
}

int _vs_parked_of(int tag, vs_parked_t *out, int max) {
  int n = 0;
  slots_lock();
  for (int s_ = 0, ns = atomic_load(&vs_nslots); s_ < ns; s_++) {
    vs_pool_slot_t *slot = &vs_slots[s_];
    if (!slot->ctx) continue;
    for (int k = 0; k < VS_MAX_PARKED && n < max; k++)
      if (slot->parked[tag][k]) out[n++] = (vs_parked_t){slot->parked[tag][k], slot->ctx};
  }
  slots_unlock();
  return n;
}

bool _vs_unpark(vs_pool_t *pool) {
  int tag = _vs_pool_tag(pool);
  bool back = false;
  slots_lock();
  vs_pool_slot_t *slot = slot_find(_vs_pool_context(pool));
  for (int k = 0; slot && k < VS_MAX_PARKED; k++) {
    if (slot->parked[tag][k] != pool) continue;
    for (int a = 0; a < VS_MAX_ARENAS && !back; a++) {
      vs_pool_t *expected = NULL;
      back = atomic_compare_exchange_strong(&slot->arenas[tag][a], &expected, pool);
    }
    if (back) slot->parked[tag][k] = NULL;
    break;
  }
  slots_unlock();
  return back;
}

void _vs_visit_tag(int tag, void (*fn)(vs_pool_t *pool, void *arg), void *arg) { visit(tag, -1, fn, arg); }

void _vs_visit_device_arenas(int dev, void (*fn)(vs_pool_t *pool, void *arg), void *arg) {
  if (_vs_active() && dev >= 0) visit(-1, dev, fn, arg);
}
