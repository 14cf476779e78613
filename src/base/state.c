/* state.c: the words every layer reads, base's own files included: whether the shim is active
 * (init.c decides it), the guard of the shim's own calls into CUDA, the captures in progress,
 * and each thread's number. They live below every other file of base, so that those files read
 * them without calling up into init.c (docs/design.md, "Layers"). */
#include "vmmshim/base.h"

atomic_int _vs_state;
_Thread_local int _vs_guard;
atomic_int _vs_captures_active;

_Thread_local uintptr_t _vs_thread_no;
static atomic_uintptr_t vs_threads_numbered;

uintptr_t _vs_thread_no_slow(void) {
  _vs_thread_no = (atomic_fetch_add(&vs_threads_numbered, 1) + 1) << 1 | 1;
  return _vs_thread_no;
}
