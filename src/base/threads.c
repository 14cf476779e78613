/* threads.c: the shim's own threads (the reclaimer, the control and IPC servers, the dump
 * thread): started with every signal blocked, so the program's signals stay with its own
 * threads, and counted, so a wait for memory can tell the program's threads from them. Low in
 * base: the server and init.c both start threads here. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "vmmshim/base.h"

typedef struct vs_thread_boot_s {
  void *(*fn)(void *);
  void *arg;
  atomic_int started;
} vs_thread_boot_t;

static atomic_int vs_threads_own, vs_threads_pid; /* the count, and the process it counts */

/* The count is the process's: the first change in a fork child starts it again at zero. */
static void threads_own_add(int d) {
  int pid = (int)getpid(), seen = atomic_load(&vs_threads_pid);
  if (seen != pid && atomic_compare_exchange_strong(&vs_threads_pid, &seen, pid)) atomic_store(&vs_threads_own, 0);
  atomic_fetch_add(&vs_threads_own, d);
}

int _vs_threads_own(void) {
  return atomic_load(&vs_threads_pid) == (int)getpid() ? atomic_load(&vs_threads_own) : 0;
}

static void *thread_boot(void *p) {
  vs_thread_boot_t *boot = p;
  void *(*fn)(void *) = boot->fn;
  void *arg = boot->arg;
  threads_own_add(1);
  atomic_store_explicit(&boot->started, 1, memory_order_release); /* boot is the creator's: not after this */
  void *r = fn(arg);
  threads_own_add(-1);
  return r;
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
