/* init.c: once-only initialisation, the exit flush, and fork.
 *
 * The library's constructor does nothing with CUDA (and nothing at all that could
 * disturb a process that never uses CUDA). The first call into a hook runs
 * _vs_init_once (options, log, trace, atexit); the pools are built later, per
 * context, when the first allocation arrives (alloc.c). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "vmmshim/internal.h"

static pthread_once_t vs_once = PTHREAD_ONCE_INIT;

static void vs_at_exit(void) {
  if (_vs_option(VS_OPT_STATS) || _vs_option(VS_OPT_VERBOSE)) _vs_stats_print();
  _vs_trace_close();
}

static void init_once(void) {
  _vs_config_init();
  vs_log_level_t level = (vs_log_level_t)_vs_option(VS_OPT_LOG);
  _vs_log_open(_vs_option_string(VS_OPT_LOG), &level);
  _vs_config_report();
  if (_vs_option(VS_OPT_VERBOSE)) _vs_config_print();
  _vs_trace_open();
  _vs_report_init();
  atexit(vs_at_exit);
}

void _vs_init_once(void) { pthread_once(&vs_once, init_once); }

int _vs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg) {
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  sigset_t all, prev;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &prev);
  int rc = pthread_create(out, &at, fn, arg);
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  pthread_attr_destroy(&at);
  return rc;
}
