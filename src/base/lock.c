/* lock.c: the lock order's check (debug builds): each thread's held locks, and an abort naming
 * both locks when one is taken out of order (lock.h has the rules). Release builds compile
 * nothing here: vs_lock_t's functions are the pthread ones, inline. */
#include <stdlib.h>

#include "vmmshim/base.h"

#if VS_DEBUG

_Thread_local int _vs_locks_held;

/* Deeper than any path of the shim nests (about four): more is a leak of a held lock. */
#define VS_LOCK_DEPTH 16

/* The locks this thread holds, in the order taken (trylock may add one below the top). */
static _Thread_local const vs_lock_t *tl_held[VS_LOCK_DEPTH];
static _Thread_local int tl_nheld;

static void order_abort(const char *what, const vs_lock_t *l, const vs_lock_t *held) {
  if (held)
    _vs_note("error: lock order: %s lock '%s' (rank %d) while holding lock '%s' (rank %d): a lock's rank must be "
              "greater than every rank the thread holds (lock.h, docs/design.md)",
              what, l->name, l->rank, held->name, held->rank);
  else
    _vs_note("error: lock order: %s lock '%s' (rank %d)", what, l->name, l->rank);
  abort();
}

void _vs_lock_check(const vs_lock_t *l) {
  for (int i = 0; i < tl_nheld; i++)
    if (tl_held[i]->rank >= l->rank) order_abort(tl_held[i] == l ? "taking again" : "taking", l, tl_held[i]);
  /* A counted mutex not yet on vs_lock_t (VS_LOCK_HELD) ranks above every outer lock. */
  if (l->rank < VS_RANK_COUNTED && _vs_locks_held > 0)
    order_abort("taking (with a counted lock held that is not a vs_lock_t)", l, NULL);
}

void _vs_lock_taken(const vs_lock_t *l) {
  if (tl_nheld == VS_LOCK_DEPTH) order_abort("too many locks held (one not released?) taking", l, NULL);
  tl_held[tl_nheld++] = l;
  if (l->rank >= VS_RANK_COUNTED) VS_LOCK_HELD(1);
}

void _vs_lock_released(const vs_lock_t *l) {
  int i = tl_nheld - 1;
  while (i >= 0 && tl_held[i] != l) i--;
  if (i < 0) order_abort("releasing, not held by this thread,", l, NULL);
  for (; i + 1 < tl_nheld; i++) tl_held[i] = tl_held[i + 1];
  tl_nheld--;
  if (l->rank >= VS_RANK_COUNTED) VS_LOCK_HELD(-1);
}

void _vs_lock_check_wait(const vs_lock_t *l) {
  bool mine = false;
  for (int i = 0; i < tl_nheld; i++) {
    if (tl_held[i] == l) mine = true;
    else if (tl_held[i]->rank >= l->rank) order_abort("waiting on (and so retaking)", l, tl_held[i]);
  }
  if (!mine) order_abort("waiting on, not held by this thread,", l, NULL);
}

#endif
