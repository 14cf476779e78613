/* threads.c: the shim's own threads (the reclaimer, the control and IPC servers, the dump
 * thread): started with every signal blocked, so the program's signals stay with its own
 * threads, and marked, so a wait for memory can tell the program's threads from them. Low in
 * base: the server and init.c both start threads here. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "vmmshim/base.h"

typedef struct vs_thread_boot_s {
  void *(*fn)(void *);
  void *arg;
  atomic_int started;
} vs_thread_boot_t;

static _Thread_local bool tl_own; /* the calling thread is one of them */

bool _vs_thread_own_self(void) { return tl_own; }

static void *thread_boot(void *p) {
  vs_thread_boot_t *boot = p;
  void *(*fn)(void *) = boot->fn;
  void *arg = boot->arg;
  tl_own = true;
  atomic_store_explicit(&boot->started, 1, memory_order_release); /* boot is the creator's: not after this */
  return fn(arg);
}

/* The creator returns once the thread runs fn: a thread starting up allocates (glibc reads its
 * attributes), and a program that forks right then can find its child's allocator locked under
 * AddressSanitizer (glibc's own malloc is safe across fork, the sanitizer's of GCC 12 is not).
 * Tens of microseconds, once per thread of the shim. */
int _vs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg) {
  vs_thread_boot_t boot = {fn, arg, 0};
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  sigset_t all, prev;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &prev);
  int rc = pthread_create(out, &at, thread_boot, &boot);
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  pthread_attr_destroy(&at);
  while (rc == 0 && !atomic_load_explicit(&boot.started, memory_order_acquire)) _vs_sleep_us(20);
  return rc;
}
