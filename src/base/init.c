/* init.c: once-only initialisation, activation, the exit flush, the dump signal.
 *
 * The top of base: it calls the other files of base (options, log, trace, the driver, the
 * one-stream order, stats) and none of them calls it; what they read of the shim's state
 * (_vs_state, which activation sets here) lives in state.c, below them.
 *
 * The library's constructor does nothing with CUDA (and nothing at all that could
 * disturb a process that never uses CUDA). The first call into a hook runs
 * _vs_init_once (options, log, trace, atexit, the dump signal); the first that needs the
 * driver activates the shim (_vs_active: the driver's functions resolved); the pools are
 * built later, per context, when the first allocation arrives (alloc.c).
 *
 * The dump signal is installed here, with nothing of CUDA: a pipe, a thread that waits on
 * it, and a handler that writes one byte. What the thread then does (write the memory
 * report) belongs to a layer above: it registers itself with _vs_set_dump_handler. So does
 * what starts with the shim (the control channel, src/hook/control.c): the thread that
 * activates it runs the handler registered with _vs_set_activate_handler, once. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/base.h"

static pthread_once_t vs_once = PTHREAD_ONCE_INIT;
static void (*vs_dump_handler)(void);
static void (*vs_activate_handler)(void);
static void install_dump_signal(void);

static void vs_at_exit(void) {
  if (_vs_option(VS_OPT_STATS) || _vs_option(VS_OPT_VERBOSE)) _vs_stats_print();
  _vs_trace_close();
}

static void init_once(void) {
  _vs_config_init();
  vs_log_level_t level = (vs_log_level_t)_vs_option(VS_OPT_LOG);
  _vs_log_open(_vs_option_string(VS_OPT_LOG), &level);
  _vs_config_report();
  _vs_order_configure(_vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED && _vs_option(VS_OPT_ONE_STREAM));
  if (_vs_option(VS_OPT_VERBOSE)) _vs_config_print();
  _vs_trace_open();
  install_dump_signal();
  atexit(vs_at_exit);
}

void _vs_init_once(void) { pthread_once(&vs_once, init_once); }

bool _vs_activate_slow(void) {
  _vs_init_once();
  int st = atomic_load(&_vs_state);
  if (st) return st == 1;
  int want = 1;
  if (_vs_option(VS_OPT_DISABLE)) {
    _vs_note("VMMSHIM_DISABLE is set: every allocation passes through to the CUDA driver");
    want = 2;
  } else if (_vs_cuda_resolve() != 0) {
    want = 2;
  }
  int expected = 0;
  if (atomic_compare_exchange_strong(&_vs_state, &expected, want) && want == 1 && vs_activate_handler)
    vs_activate_handler();
  return atomic_load(&_vs_state) == 1;
}

void _vs_set_activate_handler(void (*fn)(void)) { vs_activate_handler = fn; }

/* ------------------------------------------------------------------ the dump signal */

void _vs_set_dump_handler(void (*fn)(void)) { vs_dump_handler = fn; }

static int vs_dump_pipe[2] = {-1, -1};

static void on_dump_signal(int sig) {
  (void)sig;
  int saved = errno;
  char c = 1;
  if (vs_dump_pipe[1] >= 0 && write(vs_dump_pipe[1], &c, 1) < 0) {
    /* a full pipe already holds a request: one report serves them all */
  }
  errno = saved;
}

static void *dump_thread(void *arg) {
  (void)arg;
  char buf[64];
  for (;;) {
    ssize_t n = read(vs_dump_pipe[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return NULL;
    if (vs_dump_handler) vs_dump_handler();
  }
}

/* A forked child has no dump thread, and the pipe is its parent's: the signal does
 * nothing there (rather than make the parent report). */
static void atfork_child(void) {
  int r = vs_dump_pipe[0], w = vs_dump_pipe[1];
  vs_dump_pipe[0] = vs_dump_pipe[1] = -1;
  if (r >= 0) close(r);
  if (w >= 0) close(w);
}

static void install_dump_signal(void) {
  int sig = (int)_vs_option(VS_OPT_DUMP_SIGNAL);
  if (!sig) return;
  struct sigaction old;
  if (sigaction(sig, NULL, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
    /* The program handles (or ignores) this signal itself: it stays the program's. */
    _vs_info("VMMSHIM_DUMP_SIGNAL %d (%s) has a handler of the program; the shim leaves it alone", sig, strsignal(sig));
    return;
  }
  if (pipe2(vs_dump_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
  fcntl(vs_dump_pipe[0], F_SETFL, 0); /* the thread blocks on the read end; the handler never does */
  pthread_t t;
  int rc = _vs_thread_start(&t, dump_thread, NULL);
  if (rc != 0) {
    close(vs_dump_pipe[0]);
    close(vs_dump_pipe[1]);
    vs_dump_pipe[0] = vs_dump_pipe[1] = -1;
    return;
  }
  pthread_atfork(NULL, NULL, atfork_child);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_dump_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}
