/* stats.c: process-wide counters (include/vmmshim.h) and the report printed at exit
 * when VMMSHIM_STATS=1.
 *
 * The counters touched by every allocation and free (counts per API, bytes in use,
 * bytes requested) live in a block per thread that only its thread writes: a shared
 * counter would bounce one cache line between every allocating thread. Readers sum the
 * blocks (each on cache lines of its own). Bytes in use are also folded into one shared
 * total once a thread's unfolded change reaches VS_FOLD or twice its largest allocation,
 * whichever is more, and the peak is kept from that total: exact for one allocating thread,
 * it may miss that much per other thread. (Folding every large allocation made threads cycling
 * large blocks share one cache line, several times slower: docs/rationale.md.) Rare events
 * (mappings, syncs, trims) stay shared atomics.
 * A block outlives its thread: the next new thread takes it over, totals intact.
 * The blocks also count the program's threads that can free device memory through the shim: a
 * thread is counted when it first allocates or frees (its block's slow path, never the hot
 * path) and uncounted by the key's destructor as it exits. A wait for memory that no such thread
 * besides the waiter could end fails at once (group.c): counting the process's threads instead
 * took the driver's and the runtime's unnamed helpers for the program's and waited forever. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/base.h"

vmmshim_stats_t _vs_stats_data;
vs_stitch_stats_t _vs_stitch_stats;

#define VS_FOLD ((int64_t)64 << 20)

typedef struct __attribute__((aligned(128))) vs_tstat_s {
  uint64_t allocs[VMMSHIM_API_COUNT];
  uint64_t frees[VMMSHIM_API_COUNT];
  int64_t in_use;    /* not yet folded into vs_in_use_folded */
  int64_t requested; /* this block's share of bytes_requested_in_use */
  int64_t fold_at;   /* unfolded change that is folded: VS_FOLD or twice the largest allocation */
  struct vs_tstat_s *next;
  atomic_bool owned;
} vs_tstat_t;

static vs_tstat_t *_Atomic vs_tstats; /* push-only list */
static atomic_int_least64_t vs_in_use_folded;
static vs_lock_t vs_tstats_lock = VS_LOCK_INITIALIZER(VS_RANK_TSTATS, "thread stats");
static pthread_key_t vs_tstats_key;
static pthread_once_t vs_tstats_once = PTHREAD_ONCE_INIT;
static _Thread_local vs_tstat_t *tl_stat;
static _Thread_local bool tl_counted; /* this thread is in vs_tstats_live */
static atomic_int vs_tstats_live;     /* the program's threads counted, alive */

/* Written only by the owning thread; read by anyone. */
#define OWN_ADD(field, n) __atomic_store_n(&(field), (field) + (n), __ATOMIC_RELAXED)

static void tstat_release(void *arg) {
  vs_tstat_t *t = arg;
  atomic_store(&t->owned, false);
  if (tl_counted) atomic_fetch_sub(&vs_tstats_live, 1);
  tl_counted = false;
}

/* A fork child runs only the thread that forked: the others' counts would keep it waiting. */
static void tstat_forked(void) { atomic_store(&vs_tstats_live, tl_counted ? 1 : 0); }

static void tstat_key_init(void) {
  pthread_key_create(&vs_tstats_key, tstat_release);
  pthread_atfork(NULL, NULL, tstat_forked);
}

/* Once per thread, after its block is the key's (whose destructor uncounts it); the shim's own
 * threads free nothing the program waits for. */
static void tstat_count(void) {
  if (tl_counted || _vs_thread_own_self()) return;
  tl_counted = true;
  atomic_fetch_add(&vs_tstats_live, 1);
}

int _vs_stat_threads_others(void) {
  int n = atomic_load(&vs_tstats_live) - (tl_counted ? 1 : 0);
  return n > 0 ? n : 0;
}

static vs_tstat_t *tstat_slow(void) {
  /* No host memory: one shared block, never worse than a miscount. */
  static vs_tstat_t fallback = {.fold_at = VS_FOLD};
  pthread_once(&vs_tstats_once, tstat_key_init);
  _vs_lock_take(&vs_tstats_lock);
  vs_tstat_t *t;
  for (t = atomic_load(&vs_tstats); t; t = t->next)
    if (t != &fallback && !atomic_load(&t->owned)) break;
  if (!t && (t = aligned_alloc(128, sizeof *t)) != NULL) {
    memset(t, 0, sizeof *t);
    t->next = atomic_load(&vs_tstats);
    atomic_store(&vs_tstats, t);
  }
  if (t) {
    if (t->fold_at < VS_FOLD) t->fold_at = VS_FOLD;
    atomic_store(&t->owned, true);
  }
  _vs_lock_release(&vs_tstats_lock);
  if (!t) {
    /* The fallback block gets the destructor too, so the count still drops when its thread exits. */
    pthread_setspecific(vs_tstats_key, &fallback);
    tstat_count();
    return &fallback;
  }
  pthread_setspecific(vs_tstats_key, t);
  tstat_count();
  tl_stat = t;
  return t;
}

static inline vs_tstat_t *tstat(void) {
  vs_tstat_t *t = tl_stat;
  return vs_likely(t != NULL) ? t : tstat_slow();
}

void _vs_stat_peak(uint64_t *peak, uint64_t value) {
  uint64_t cur = __atomic_load_n(peak, __ATOMIC_RELAXED);
  while (value > cur && !__atomic_compare_exchange_n(peak, &cur, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void in_use_add(vs_tstat_t *t, int64_t delta) {
  if (vs_unlikely(delta > t->fold_at / 2)) t->fold_at = 2 * delta;
  int64_t d = t->in_use + delta;
  int64_t folded = atomic_load_explicit(&vs_in_use_folded, memory_order_relaxed);
  if (d >= t->fold_at || d <= -t->fold_at) {
    folded = atomic_fetch_add_explicit(&vs_in_use_folded, d, memory_order_relaxed) + d;
    d = 0;
  }
  __atomic_store_n(&t->in_use, d, __ATOMIC_RELAXED);
  if (delta > 0 && folded + d > 0) _vs_stat_peak(&_vs_stats_data.peak_bytes_in_use, (uint64_t)(folded + d));
}

void _vs_stat_alloc(vmmshim_api_t api, size_t served, size_t requested) {
  vs_tstat_t *t = tstat();
  OWN_ADD(t->allocs[api], 1);
  OWN_ADD(t->requested, (int64_t)requested);
  in_use_add(t, (int64_t)served);
}

void _vs_stat_free(vmmshim_api_t api, size_t served, size_t requested) {
  vs_tstat_t *t = tstat();
  if ((unsigned)api < VMMSHIM_API_COUNT) OWN_ADD(t->frees[api], 1);
  OWN_ADD(t->requested, -(int64_t)requested);
  in_use_add(t, -(int64_t)served);
}

void _vs_stats_get(vmmshim_stats_t *out) {
  uint64_t *dst = (uint64_t *)out;
  const uint64_t *src = (const uint64_t *)&_vs_stats_data;
  for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
  int64_t in_use = atomic_load_explicit(&vs_in_use_folded, memory_order_relaxed), requested = 0;
  for (vs_tstat_t *t = atomic_load(&vs_tstats); t; t = t->next) {
    for (int a = 0; a < VMMSHIM_API_COUNT; a++) {
      out->allocs[a] += __atomic_load_n(&t->allocs[a], __ATOMIC_RELAXED);
      out->frees[a] += __atomic_load_n(&t->frees[a], __ATOMIC_RELAXED);
    }
    in_use += __atomic_load_n(&t->in_use, __ATOMIC_RELAXED);
    requested += __atomic_load_n(&t->requested, __ATOMIC_RELAXED);
  }
  out->bytes_in_use = in_use > 0 ? (uint64_t)in_use : 0;
  out->bytes_requested_in_use = requested > 0 ? (uint64_t)requested : 0;
  if (out->peak_bytes_in_use < out->bytes_in_use) out->peak_bytes_in_use = out->bytes_in_use;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

void _vs_stats_print(void) {
  vmmshim_stats_t s;
  _vs_stats_get(&s);
  _vs_note("stats: mode %s, granularity %llu MiB, free mode %s",
           atomic_load(&_vs_state) == 1 ? "pool" : "pass-through",
           (unsigned long long)(_vs_option(VS_OPT_GRANULARITY) >> 20),
           _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED ? "deferred" : "sync");
  _vs_note("stats: allocations served: cudaMalloc %llu, cudaMallocAsync %llu, cuMemAlloc %llu, cuMemAllocAsync %llu",
           (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME], (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME_ASYNC],
           (unsigned long long)s.allocs[VMMSHIM_API_DRIVER], (unsigned long long)s.allocs[VMMSHIM_API_DRIVER_ASYNC]);
  _vs_note("stats: frees: cudaFree %llu, cudaFreeAsync %llu, cuMemFree %llu, cuMemFreeAsync %llu",
           (unsigned long long)s.frees[VMMSHIM_API_RUNTIME], (unsigned long long)s.frees[VMMSHIM_API_RUNTIME_ASYNC],
           (unsigned long long)s.frees[VMMSHIM_API_DRIVER], (unsigned long long)s.frees[VMMSHIM_API_DRIVER_ASYNC]);
  _vs_note("stats: failed allocations %llu, passed to the real driver %llu",
           (unsigned long long)s.alloc_failures, (unsigned long long)s.passthrough_allocs);
  _vs_note("stats: in use %.1f MiB (peak %.1f MiB), mapped %.1f MiB (peak %.1f MiB)", mib(s.bytes_in_use),
           mib(s.peak_bytes_in_use), mib(s.bytes_mapped), mib(s.peak_bytes_mapped));
  _vs_note("stats: VMM calls %llu taking %.3f ms, synchronisations for frees %llu, handles released when idle %llu",
           (unsigned long long)s.vmm_calls, (double)s.vmm_ns / 1e6, (unsigned long long)s.syncs,
           (unsigned long long)s.trims);
  _vs_note("stats: pools %llu (one per context and arena in use)", (unsigned long long)s.pools);
  _vs_note("stats: stitches %llu (growths that mapped %llu idle handles again, %.1f MiB not created anew)",
           (unsigned long long)__atomic_load_n(&_vs_stitch_stats.stitches, __ATOMIC_RELAXED),
           (unsigned long long)__atomic_load_n(&_vs_stitch_stats.handles, __ATOMIC_RELAXED),
           mib(__atomic_load_n(&_vs_stitch_stats.bytes, __ATOMIC_RELAXED)));
  if (_vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED)
    _vs_note("stats: deferred frees in stream order: %s", _vs_order_describe());
}

/* Live blocks that died with their context: no longer in use, yet never freed. */
void _vs_stat_drop(size_t served, size_t requested) {
  vs_tstat_t *t = tstat();
  OWN_ADD(t->requested, -(int64_t)requested);
  in_use_add(t, -(int64_t)served);
}
