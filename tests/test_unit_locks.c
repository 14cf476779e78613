/* test_unit_locks: vs_lock_t (lock.h, src/base/lock.c) linked straight in. Everywhere: lock,
 * trylock, unlock and condition wait work as the pthread ones. In debug builds (VS_DEBUG >= 1:
 * the sanitizer builds) the lock order is checked: each case runs in a forked child, and a lock
 * taken out of order (a lower rank, the same rank, the same lock again), a condition wait with a
 * higher lock held, an outer lock taken with a counted mutex held, or a release of a lock not
 * held must abort the child with a message that names both locks and their ranks; locks taken in
 * order, and a trylock out of order, must not. The count vmm.c asserts on follows counted locks
 * only. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vmmshim/internal.h"
#include "check.h"

static vs_lock_t lk_slots = VS_LOCK_INITIALIZER(VS_RANK_SLOTS, "test slots");
static vs_lock_t lk_pool_a = VS_LOCK_INITIALIZER(VS_RANK_POOL, "test pool A");
static vs_lock_t lk_pool_b = VS_LOCK_INITIALIZER(VS_RANK_POOL, "test pool B");
static vs_lock_t lk_host = VS_LOCK_INITIALIZER(VS_RANK_HOST, "test host");
static vs_lock_t lk_gate = VS_LOCK_INITIALIZER(VS_RANK_GATE, "test gate");
static vs_lock_t lk_sleep = VS_LOCK_INITIALIZER(VS_RANK_SLEEP, "test sleep");
static vs_lock_t lk_access = VS_LOCK_INITIALIZER(VS_RANK_ACCESS, "test access");
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* ------------------------------------------------------------------ the cases */

static void in_order(void) {
  _vs_lock_take(&lk_sleep);
  _vs_lock_take(&lk_access);
  _vs_lock_take(&lk_slots);
  _vs_lock_take(&lk_pool_a);
  _vs_lock_take(&lk_host);
  _vs_lock_take(&lk_gate);
  /* released in any order */
  _vs_lock_release(&lk_pool_a);
  _vs_lock_release(&lk_gate);
  _vs_lock_release(&lk_sleep);
  _vs_lock_take(&lk_gate); /* above everything still held */
  _vs_lock_release(&lk_gate);
  _vs_lock_release(&lk_host);
  _vs_lock_release(&lk_slots);
  _vs_lock_release(&lk_access);
}

static void out_of_order(void) {
  _vs_lock_take(&lk_pool_a);
  _vs_lock_take(&lk_slots);
}

#if VS_DEBUG
static void same_rank(void) {
  _vs_lock_take(&lk_pool_a);
  _vs_lock_take(&lk_pool_b);
}

static void again(void) {
  _vs_lock_take(&lk_host);
  _vs_lock_take(&lk_host);
}

/* A trylock does not wait: out of order, it is allowed, and then counts as held. */
static void try_out_of_order(void) {
  _vs_lock_take(&lk_host);
  if (!_vs_lock_try(&lk_slots)) _exit(3);
  _vs_lock_take(&lk_gate);
  _vs_lock_release(&lk_gate);
  _vs_lock_release(&lk_slots);
  _vs_lock_release(&lk_host);
}

static void after_try(void) {
  if (!_vs_lock_try(&lk_host)) _exit(3);
  _vs_lock_take(&lk_pool_a); /* below the trylocked host lock */
}

static void release_not_held(void) { _vs_lock_release(&lk_host); }

static void wait_with_higher_held(void) {
  _vs_lock_take(&lk_pool_a);
  _vs_lock_take(&lk_host);
  _vs_lock_wait(&lk_pool_a, &cond); /* checked before it blocks */
}

/* An outer lock (may be held across driver calls) with a counted mutex held that is not a
 * vs_lock_t (ipc.c's, counted with VS_LOCK_HELD). */
static void outer_under_counted(void) {
  VS_LOCK_HELD(1);
  _vs_lock_take(&lk_access);
}

typedef struct {
  const char *name;
  void (*fn)(void);
  const char *message; /* NULL: the child must exit 0; else a format of the two ranks */
  int rank, held_rank;
} lock_case_t;

static const lock_case_t cases[] = {
    {"in order", in_order, NULL, 0, 0},
    {"trylock out of order", try_out_of_order, NULL, 0, 0},
    {"lower rank", out_of_order,
     "vmmshim: error: lock order: taking lock 'test slots' (rank %d) while holding lock 'test pool A' (rank %d)",
     VS_RANK_SLOTS, VS_RANK_POOL},
    {"same rank", same_rank, "lock order: taking lock 'test pool B' (rank %d) while holding lock 'test pool A' (rank %d)",
     VS_RANK_POOL, VS_RANK_POOL},
    {"same lock again", again,
     "lock order: taking again lock 'test host' (rank %d) while holding lock 'test host' (rank %d)", VS_RANK_HOST,
     VS_RANK_HOST},
    {"after a trylock", after_try,
     "lock order: taking lock 'test pool A' (rank %d) while holding lock 'test host' (rank %d)", VS_RANK_POOL,
     VS_RANK_HOST},
    {"release not held", release_not_held, "lock order: releasing, not held by this thread, lock 'test host' (rank %d)",
     VS_RANK_HOST, 0},
    {"wait with a higher lock held", wait_with_higher_held,
     "lock order: waiting on (and so retaking) lock 'test pool A' (rank %d) while holding lock 'test host' (rank %d)",
     VS_RANK_POOL, VS_RANK_HOST},
    {"outer lock under a counted mutex", outer_under_counted,
     "lock order: taking (with a counted lock held that is not a vs_lock_t) lock 'test access' (rank %d)",
     VS_RANK_ACCESS, 0},
};

#endif

/* Runs fn in a child with its stderr in out; returns its wait status. */
static int run_child(void (*fn)(void), char *out, size_t cap) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    alarm(20); /* without the check, taking a held lock again deadlocks: end as a failure */
    fn();
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < cap && ((r = read(fds[0], out + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
    if (r > 0) n += (size_t)r;
  out[n] = 0;
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

/* ------------------------------------------------------------------ everywhere */

static atomic_bool signalled;
static void *signaller(void *arg) {
  (void)arg;
  while (!atomic_load(&signalled)) {
    _vs_lock_take(&lk_pool_b);
    pthread_cond_broadcast(&cond);
    _vs_lock_release(&lk_pool_b);
    usleep(1000);
  }
  return NULL;
}

/* Whether another thread can have the lock (it gives it back at once). */
static void *try_from_other(void *arg) {
  bool got = _vs_lock_try((vs_lock_t *)arg);
  if (got) _vs_lock_release((vs_lock_t *)arg);
  return (void *)(uintptr_t)got;
}

static void basics(void) {
  /* A lock another thread holds cannot be had by trylock; a free one can. */
  _vs_lock_take(&lk_host);
  pthread_t t;
  void *got = (void *)1;
  pthread_create(&t, NULL, try_from_other, &lk_host);
  pthread_join(t, &got);
  CHECK(got == NULL, "trylock of a lock another thread holds succeeded");
  _vs_lock_release(&lk_host);
  pthread_create(&t, NULL, try_from_other, &lk_host);
  pthread_join(t, &got);
  CHECK(got != NULL, "trylock of a free lock failed");

  /* A condition wait gives the lock up and has it again when it returns. */
  atomic_store(&signalled, false);
  _vs_lock_take(&lk_pool_b);
  pthread_create(&t, NULL, signaller, NULL);
  _vs_lock_wait(&lk_pool_b, &cond); /* the signaller needs the lock to signal */
  atomic_store(&signalled, true);
  _vs_lock_release(&lk_pool_b);
  pthread_join(t, NULL);
  CHECK_COND(_vs_lock_try(&lk_pool_b));
  _vs_lock_release(&lk_pool_b);
}

#if VS_DEBUG
static void counted(void) {
  CHECK(_vs_locks_held == 0, "%d", _vs_locks_held);
  _vs_lock_take(&lk_sleep); /* outer: not counted */
  _vs_lock_take(&lk_access);
  CHECK(_vs_locks_held == 0, "outer locks counted: %d", _vs_locks_held);
  _vs_lock_take(&lk_slots);
  CHECK(_vs_locks_held == 1, "%d", _vs_locks_held);
  CHECK_COND(_vs_lock_try(&lk_pool_a));
  CHECK(_vs_locks_held == 2, "%d", _vs_locks_held);
  _vs_lock_release(&lk_slots);
  _vs_lock_release(&lk_pool_a);
  _vs_lock_release(&lk_access);
  _vs_lock_release(&lk_sleep);
  CHECK(_vs_locks_held == 0, "%d", _vs_locks_held);
}
#endif

int main(void) {
  basics();
#if VS_DEBUG
  counted();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const lock_case_t *c = &cases[i];
    char out[4096], want[512];
    int st = run_child(c->fn, out, sizeof out);
    printf("-- %s: %s", c->name, out[0] ? out : "(no output)\n");
    if (!c->message) {
      CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: child ended with status 0x%x", c->name, st);
      CHECK(!strstr(out, "lock order"), "%s: %s", c->name, out);
      continue;
    }
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "%s: child did not abort (status 0x%x)", c->name, st);
    snprintf(want, sizeof want, c->message, c->rank, c->held_rank);
    CHECK(strstr(out, want) != NULL, "%s: message '%s' missing from: %s", c->name, want, out);
  }
#else
  /* Release builds check no order: the same out-of-order take goes through. */
  char out[512];
  int st = run_child(out_of_order, out, sizeof out);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !out[0], "release build: status 0x%x: %s", st, out);
  st = run_child(in_order, out, sizeof out);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "release build: status 0x%x", st);
#endif
  return check_summary();
}
