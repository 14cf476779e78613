/* gate.c: the program's new GPU work waits while the shim moves memory under it.
 *
 * A sleep or a wake unmaps device memory and maps other memory at the same addresses. Work the
 * program submits meanwhile could touch an address that is half moved. So the driver entry
 * points that submit work (launches, copies, memsets: hook_drv.c) pass through this gate: while
 * it is closed they wait before calling the driver; once it opens they go on, and find the
 * memory where the move left it.
 *
 * Open, a pass costs an atomic add on the thread's own line and a load (Dekker's handshake with
 * the closer): the closer sets the flag, then waits until no thread is inside a submission, so
 * a submission either saw the gate closed or finished before the move began.
 * Per-thread lines, never freed: a thread's line goes to the next new thread when it exits. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/base.h"

atomic_int _vs_gate_closed;

static vs_gate_line_t *_Atomic vs_lines; /* push-only */
static vs_lock_t vs_gate_lock = VS_LOCK_INITIALIZER(VS_RANK_GATE, "gate");
static pthread_cond_t vs_gate_opened = PTHREAD_COND_INITIALIZER;
static pthread_key_t vs_gate_key;
static pthread_once_t vs_gate_once = PTHREAD_ONCE_INIT;
_Thread_local vs_gate_line_t *_vs_gate_line;

static void line_release(void *arg) { atomic_store(&((vs_gate_line_t *)arg)->owned, false); }
static void key_init(void) { pthread_key_create(&vs_gate_key, line_release); }

vs_gate_line_t *_vs_gate_line_slow(void) {
  static vs_gate_line_t fallback; /* no host memory: threads share one line (still correct) */
  pthread_once(&vs_gate_once, key_init);
  _vs_lock_take(&vs_gate_lock);
  vs_gate_line_t *l;
  for (l = atomic_load(&vs_lines); l; l = l->next)
    if (l != &fallback && !atomic_load(&l->owned) && !atomic_load(&l->inside)) break;
  if (!l && (l = aligned_alloc(64, sizeof *l)) != NULL) {
    memset(l, 0, sizeof *l);
    l->next = atomic_load(&vs_lines);
    atomic_store(&vs_lines, l);
  }
  if (l) atomic_store(&l->owned, true);
  _vs_lock_release(&vs_gate_lock);
  if (!l) {
    l = &fallback;
    _vs_lock_take(&vs_gate_lock);
    if (!fallback.owned) { /* listed once */
      fallback.owned = true;
      fallback.next = atomic_load(&vs_lines);
      atomic_store(&vs_lines, &fallback);
    }
    _vs_lock_release(&vs_gate_lock);
    return l;
  }
  pthread_setspecific(vs_gate_key, l);
  _vs_gate_line = l;
  return l;
}

void _vs_gate_wait(vs_gate_line_t *l) {
  for (;;) {
    atomic_fetch_sub_explicit(&l->inside, 1, memory_order_release);
    _vs_lock_take(&vs_gate_lock);
    while (atomic_load(&_vs_gate_closed)) _vs_lock_wait(&vs_gate_lock, &vs_gate_opened);
    _vs_lock_release(&vs_gate_lock);
    atomic_fetch_add(&l->inside, 1);
    if (!atomic_load(&_vs_gate_closed)) return;
  }
}

/* Closes nest: a group's quiesce holds the gate while the sleep it precedes closes and opens it
 * again; the gate opens when the last holder lets go. */
void _vs_gate_close(void) {
  _vs_lock_take(&vs_gate_lock);
  atomic_fetch_add(&_vs_gate_closed, 1);
  _vs_lock_release(&vs_gate_lock);
  /* Submissions already past the gate finish (a synchronous copy may take a while). */
  for (vs_gate_line_t *l = atomic_load(&vs_lines); l; l = l->next)
    while (atomic_load(&l->inside) > 0 && l != _vs_gate_line) _vs_sleep_us(50);
}

void _vs_gate_open(void) {
  _vs_lock_take(&vs_gate_lock);
  if (atomic_load(&_vs_gate_closed) > 0 && atomic_fetch_sub(&_vs_gate_closed, 1) == 1)
    pthread_cond_broadcast(&vs_gate_opened);
  _vs_lock_release(&vs_gate_lock);
}
