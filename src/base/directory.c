/* directory.c: which pool owns an address. Every pool reservation is entered here, so
 * a free finds its pool (arena) with one binary search and no lock, instead of asking
 * every pool of every context in turn.
 *
 * A sorted array under a sequence lock: writers (a reservation added or a pool dropped:
 * rare) take a mutex and make the sequence odd while they edit; readers search, then
 * retry if the sequence moved. Entries are read and written with relaxed atomics, so a
 * reader racing a writer sees stale values it then discards, never a torn pointer. */
#include <pthread.h>

#include "vmmshim/base.h"

#define VS_DIR_MAX 1024

typedef struct vs_dir_entry_s {
  CUdeviceptr va, end;
  vs_pool_t *pool;
} vs_dir_entry_t;

static vs_dir_entry_t vs_dir[VS_DIR_MAX];
static unsigned vs_dir_n;
static atomic_uint vs_dir_seq;
static vs_lock_t vs_dir_lock = VS_LOCK_INITIALIZER(VS_RANK_DIR, "directory");

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static void write_begin(void) {
  _vs_lock_take(&vs_dir_lock);
  atomic_store_explicit(&vs_dir_seq, atomic_load_explicit(&vs_dir_seq, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

static void write_end(void) {
  atomic_store_explicit(&vs_dir_seq, atomic_load_explicit(&vs_dir_seq, memory_order_relaxed) + 1,
                        memory_order_release);
  _vs_lock_release(&vs_dir_lock);
}

static void copy_entry(unsigned to, unsigned from) {
  ST(vs_dir[to].va, LD(vs_dir[from].va));
  ST(vs_dir[to].end, LD(vs_dir[from].end));
  ST(vs_dir[to].pool, LD(vs_dir[from].pool));
}

int _vs_dir_add(CUdeviceptr va, size_t size, vs_pool_t *pool) {
  write_begin();
  unsigned n = vs_dir_n;
  int r = -1;
  if (n < VS_DIR_MAX) {
    unsigned i = n;
    while (i > 0 && LD(vs_dir[i - 1].va) > va) {
      copy_entry(i, i - 1);
      i--;
    }
    ST(vs_dir[i].va, va);
    ST(vs_dir[i].end, va + size);
    ST(vs_dir[i].pool, pool);
    __atomic_store_n(&vs_dir_n, n + 1, __ATOMIC_RELAXED);
    r = 0;
  }
  write_end();
  return r;
}

void _vs_dir_remove_pool(vs_pool_t *pool) {
  write_begin();
  unsigned k = 0;
  for (unsigned i = 0; i < vs_dir_n; i++) {
    if (LD(vs_dir[i].pool) == pool) continue;
    if (k != i) copy_entry(k, i);
    k++;
  }
  __atomic_store_n(&vs_dir_n, k, __ATOMIC_RELAXED);
  write_end();
}

vs_pool_t *_vs_dir_lookup(CUdeviceptr addr) {
  for (;;) {
    unsigned seq = atomic_load_explicit(&vs_dir_seq, memory_order_acquire);
    if (vs_unlikely(seq & 1)) continue; /* a writer is editing: its edit takes nanoseconds */
    unsigned lo = 0, hi = __atomic_load_n(&vs_dir_n, __ATOMIC_RELAXED);
    if (hi > VS_DIR_MAX) hi = VS_DIR_MAX;
    while (lo < hi) { /* first entry starting above addr */
      unsigned mid = (lo + hi) / 2;
      if (LD(vs_dir[mid].va) <= addr) lo = mid + 1;
      else hi = mid;
    }
    vs_pool_t *pool = NULL;
    if (lo > 0 && addr < LD(vs_dir[lo - 1].end)) pool = LD(vs_dir[lo - 1].pool);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&vs_dir_seq, memory_order_relaxed) == seq) return pool;
  }
}

void _vs_dir_visit_pools(void (*fn)(vs_pool_t *pool, void *arg), void *arg) {
  /* A snapshot of the distinct pools, taken under the writers' lock; fn runs without it (a
   * growth adds reservations under its pool's lock, so the lock order forbids holding both). */
  vs_pool_t *seen[VS_DIR_MAX];
  unsigned n = 0;
  _vs_lock_take(&vs_dir_lock);
  for (unsigned i = 0; i < vs_dir_n; i++) {
    vs_pool_t *pool = LD(vs_dir[i].pool);
    unsigned k = 0;
    while (k < n && seen[k] != pool) k++;
    if (k == n) seen[n++] = pool;
  }
  _vs_lock_release(&vs_dir_lock);
  for (unsigned k = 0; k < n; k++) fn(seen[k], arg);
}
