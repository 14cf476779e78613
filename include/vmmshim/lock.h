/* vmmshim lock.h: the one counted lock of the shim, with its rank in the lock order.
 *
 * Every mutex of src/ is a vs_lock_t with a rank from vs_lock_rank_t below: a thread takes locks
 * in increasing rank only, so no two threads can each hold what the other waits for
 * (docs/design.md, "Locks", has the table). Two kinds of rank:
 *   outer (below VS_RANK_COUNTED): may be held across a driver call (a whole sleep, a report,
 *        the resolve of the driver's entry points); taken with no counted lock held.
 *   counted (VS_RANK_COUNTED and above): held for bookkeeping only; no driver call is made under
 *        one (vmm.c asserts the count, _vs_locks_held, is 0 before each call).
 *
 * Debug builds (VS_DEBUG >= 1, the sanitizer builds) keep, per thread, the locks it holds and
 * abort with both locks' names and ranks when one is taken out of order:
 *   - _vs_lock_take of a lock whose rank is not greater than every rank the thread holds aborts;
 *     that includes a lock the thread already holds (re-entry: the mutex is not recursive, so it
 *     would deadlock) and a second lock of the same rank (two pools: nothing orders them).
 *   - _vs_lock_try never aborts for the order: it does not wait, so it cannot close a cycle. The
 *     lock it gets is recorded like any other, and a later take is checked against it.
 *   - _vs_lock_wait (a condition wait) retakes the lock: it must be the highest rank held.
 *   - _vs_lock_release of a lock the thread does not hold aborts.
 * Release builds: the functions are pthread_mutex_* and nothing else. */
#ifndef VMMSHIM_LOCK_H
#define VMMSHIM_LOCK_H

#include <pthread.h>
#include <stdbool.h>

#include "vmmshim/base.h"

/* The lock order, outermost first. */
typedef enum vs_lock_rank_e {
  VS_RANK_NONE = 0,
  /* outer: may be held across driver calls */
  VS_RANK_CONTROL,  /* control.c: the control channel's start */
  VS_RANK_RESOLVE,  /* cuda.c: the driver's entry points, resolved once (dlopen) */
  VS_RANK_SLEEP,    /* sleep.c: one sleep, wake or promote at a time */
  VS_RANK_REPORT,   /* report.c: one memory report at a time */
  VS_RANK_ORDER,    /* order.c: the one-stream order and its end */
  VS_RANK_STACKS,   /* stacks.c: the stack table (Python's collector may allocate under it) */
  VS_RANK_ACCESS,   /* handles.c: access changes against growths */
  /* counted: never held across a driver call */
  VS_RANK_COUNTED,
  VS_RANK_SLOTS = VS_RANK_COUNTED, /* alloc.c: the context slots */
  VS_RANK_IPC,      /* ipc.c: the exports (a block's export is checked in its pool under it) */
  VS_RANK_IMPORT,   /* ipc.c: the imports */
  VS_RANK_POOL,     /* pool_internal.h: one pool (all pools share the rank: one at a time) */
  VS_RANK_PEER,     /* peer.c: the peer table */
  VS_RANK_HOST,     /* host.c: the host buffer cache */
  VS_RANK_BUDGET,   /* group.c: the limit's budget (then the segment's flock) */
  VS_RANK_TAGS,     /* tags.c: new tag names */
  VS_RANK_DIR,      /* directory.c: the address directory's writers */
  VS_RANK_TSTATS,   /* stats.c: the per-thread stats blocks */
  VS_RANK_GATE,     /* gate.c: the submission gate */
  VS_RANK_BALLOON,  /* balloon.c: the memory this member lent (a leaf) */
  VS_RANK_SERVER,   /* server.c: one server's connection table (a leaf: nothing is taken under it) */
} vs_lock_rank_t;

typedef struct vs_lock_s {
  pthread_mutex_t m;
#if VS_DEBUG
  int rank;
  const char *name;
#endif
} vs_lock_t;

#if VS_DEBUG
#define VS_LOCK_INITIALIZER(rank, name) {PTHREAD_MUTEX_INITIALIZER, (rank), (name)}
/* The order check and the count (lock.c). */
void _vs_lock_check(const vs_lock_t *l);
void _vs_lock_taken(const vs_lock_t *l);
void _vs_lock_released(const vs_lock_t *l);
void _vs_lock_check_wait(const vs_lock_t *l);
#else
#define VS_LOCK_INITIALIZER(rank, name) {PTHREAD_MUTEX_INITIALIZER}
#endif

static inline void _vs_lock_init(vs_lock_t *l, vs_lock_rank_t rank, const char *name) {
  pthread_mutex_init(&l->m, NULL);
#if VS_DEBUG
  l->rank = (int)rank;
  l->name = name;
#else
  (void)rank;
  (void)name;
#endif
}

static inline void _vs_lock_fini(vs_lock_t *l) { pthread_mutex_destroy(&l->m); }

static inline void _vs_lock_take(vs_lock_t *l) {
#if VS_DEBUG
  _vs_lock_check(l);
#endif
  pthread_mutex_lock(&l->m);
#if VS_DEBUG
  _vs_lock_taken(l);
#endif
}

/* A fork handler's take: pthread_atfork runs the prepare handlers of the modules in the reverse
 * order of their registration, which follows no rank, so this take is recorded and counted
 * (the parent and the child each release it) but not checked against the order. */
static inline void _vs_lock_take_at_fork(vs_lock_t *l) {
  pthread_mutex_lock(&l->m);
#if VS_DEBUG
  _vs_lock_taken(l);
#endif
}

static inline bool _vs_lock_try(vs_lock_t *l) {
  if (pthread_mutex_trylock(&l->m) != 0) return false;
#if VS_DEBUG
  _vs_lock_taken(l);
#endif
  return true;
}

static inline void _vs_lock_release(vs_lock_t *l) {
#if VS_DEBUG
  _vs_lock_released(l);
#endif
  pthread_mutex_unlock(&l->m);
}

/* pthread_cond_wait on l, which the thread holds. It stays recorded and counted as held: the
 * thread is blocked until it has l again. */
static inline void _vs_lock_wait(vs_lock_t *l, pthread_cond_t *cond) {
#if VS_DEBUG
  _vs_lock_check_wait(l);
#endif
  pthread_cond_wait(cond, &l->m);
}

#endif
