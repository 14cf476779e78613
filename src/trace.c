/* trace.c: the allocation trace (VMMSHIM_TRACE=path, VMMSHIM_TRACE_FORMAT=native|rmm).
 *
 * Owns the trace file: its header, one line per event, the buffer the lines wait in,
 * and the three moments the buffer leaves the process early (exit, fatal signal, fork).
 *
 *   - Records are formatted by hand into a small stack buffer (no printf, no allocation)
 *     and copied into one shared 8 KiB buffer under a tiny lock whose word holds the
 *     owner's thread id. The buffer goes out with write(2) when the next record does
 *     not fit, so every write(2) carries whole lines: after kill -9 the file is a
 *     prefix of complete records (readers ignore a final partial line all the same).
 *   - Fatal signals (SEGV, BUS, ABRT, FPE, ILL, TERM, INT) flush the buffer with
 *     write(2) only, then chain to the handler the program had, or restore the default
 *     action and re-raise so the process dies the way it would have.
 *   - fork: the child drops the inherited buffer and the parent's file; it opens its
 *     own file when the path holds %p, and stops tracing otherwise.
 *
 * The native format is documented column by column in README.md ("Trace format"). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "vmmshim/internal.h"

#define VS_TRACE_FORMAT_VERSION 1
#define VS_TRACE_BUF_SIZE 8192
#define VS_TRACE_REC_MAX 192 /* longest hot record: 'm' with ten 16-digit fields */

int _vs_trace_on;

static int vs_trace_fd = -1;
static int vs_trace_format;                    /* vs_trace_format_t */
static char vs_trace_template[PATH_MAX];       /* VMMSHIM_TRACE as given */
static char vs_trace_path[PATH_MAX];           /* after %p / %r expansion */
static uint64_t vs_trace_mono0;                /* CLOCK_MONOTONIC at open: time origin */
static uint64_t vs_trace_real0;                /* CLOCK_REALTIME at open */
static int64_t vs_trace_tzoff;                 /* local time offset (s), for the rmm clock */
static atomic_int vs_trace_write_errors;

static char vs_buf[VS_TRACE_BUF_SIZE];
static size_t vs_buf_len;
static atomic_uint vs_lock_owner; /* 0: free; else the owner's thread id */

static _Thread_local uint32_t vs_tid; /* cached gettid(); reset in a forked child */

/* ------------------------------------------------------------------ small helpers */

static inline uint32_t trace_tid(void) {
  uint32_t t = vs_tid;
  if (vs_unlikely(t == 0)) vs_tid = t = (uint32_t)syscall(SYS_gettid);
  return t;
}

static inline uint64_t clock_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Record times come from the CPU's time-stamp counter where it ticks at a constant rate
 * on every core (Linux's constant_tsc and nonstop_tsc flags): reading it costs a few ns,
 * a third of clock_gettime, and a pair of records reads it twice. Ticks become
 * CLOCK_MONOTONIC nanoseconds through base + (ticks - base_tsc) * mult; every flush
 * re-measures mult over the whole time since the trace opened and moves the base so that
 * times stay continuous. The three values sit under a sequence count: a reader that
 * raced an update reads again. Without a usable counter, clock_gettime is used. */
#if defined(__x86_64__)
#include <x86intrin.h>
static bool vs_tsc_ok;
static uint64_t vs_tsc_open, vs_mono_open; /* first calibration point */
static uint64_t vs_clk_base_tsc, vs_clk_base_ns, vs_clk_mult; /* mult: ns per tick << 32 */
static atomic_uint vs_clk_seq;

static bool tsc_invariant(void) {
  int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8192];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  char *flags = strstr(buf, "\nflags");
  if (!flags) return false;
  char *eol = strchr(flags + 1, '\n');
  if (eol) *eol = 0;
  return strstr(flags, " constant_tsc") && strstr(flags, " nonstop_tsc");
}

/* Called with the trace lock held (or before tracing starts). */
static void clock_calibrate(void) {
  if (!vs_tsc_ok) return;
  uint64_t t = __rdtsc(), ns = clock_mono_ns();
  if (t <= vs_tsc_open) return;
  uint64_t mult = (uint64_t)(((unsigned __int128)(ns - vs_mono_open) << 32) / (t - vs_tsc_open));
  uint64_t now_old = vs_clk_base_ns + (uint64_t)(((unsigned __int128)(t - vs_clk_base_tsc) * vs_clk_mult) >> 32);
  unsigned seq = atomic_load_explicit(&vs_clk_seq, memory_order_relaxed);
  atomic_store_explicit(&vs_clk_seq, seq + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  __atomic_store_n(&vs_clk_base_tsc, t, __ATOMIC_RELAXED);
  __atomic_store_n(&vs_clk_base_ns, now_old, __ATOMIC_RELAXED);
  __atomic_store_n(&vs_clk_mult, mult, __ATOMIC_RELAXED);
  atomic_store_explicit(&vs_clk_seq, seq + 2, memory_order_release);
}

static void clock_open(void) {
  vs_tsc_ok = tsc_invariant();
  if (!vs_tsc_ok) return;
  /* A first rate over 1 ms; every flush refines it. */
  vs_tsc_open = __rdtsc();
  vs_mono_open = clock_mono_ns();
  uint64_t until = vs_mono_open + 1000000;
  while (clock_mono_ns() < until) {
  }
  uint64_t t = __rdtsc(), ns = clock_mono_ns();
  vs_clk_mult = (uint64_t)(((unsigned __int128)(ns - vs_mono_open) << 32) / (t - vs_tsc_open));
  vs_clk_base_tsc = t;
  vs_clk_base_ns = ns;
}

static inline uint64_t mono_ns(void) {
  if (!vs_tsc_ok) return clock_mono_ns();
  for (;;) {
    unsigned seq = atomic_load_explicit(&vs_clk_seq, memory_order_acquire);
    uint64_t t = __rdtsc();
    uint64_t bt = __atomic_load_n(&vs_clk_base_tsc, __ATOMIC_RELAXED);
    uint64_t bn = __atomic_load_n(&vs_clk_base_ns, __ATOMIC_RELAXED);
    uint64_t m = __atomic_load_n(&vs_clk_mult, __ATOMIC_RELAXED);
    atomic_thread_fence(memory_order_acquire);
    if (vs_likely(!(seq & 1) && atomic_load_explicit(&vs_clk_seq, memory_order_relaxed) == seq))
      return t > bt ? bn + (uint64_t)(((unsigned __int128)(t - bt) * m) >> 32) : bn;
  }
}
#else
static void clock_calibrate(void) {}
static void clock_open(void) {}
static inline uint64_t mono_ns(void) { return clock_mono_ns(); }
#endif

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void lock_take(uint32_t me) {
  unsigned spins = 0;
  for (;;) {
    unsigned expected = 0;
    if (atomic_compare_exchange_weak_explicit(&vs_lock_owner, &expected, me, memory_order_acquire,
                                              memory_order_relaxed))
      return;
    if (++spins < 128) cpu_relax();
    else { sched_yield(); spins = 0; }
  }
}

static inline void lock_drop(void) { atomic_store_explicit(&vs_lock_owner, 0, memory_order_release); }

/* write(2) until done; async-signal-safe. Returns 0 or -1. */
static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Caller holds the lock. Async-signal-safe. */
static void flush_locked(void) {
  if (vs_buf_len && vs_trace_fd >= 0 && write_all(vs_trace_fd, vs_buf, vs_buf_len) != 0)
    atomic_fetch_add_explicit(&vs_trace_write_errors, 1, memory_order_relaxed);
  vs_buf_len = 0;
}

static void emit(const char *rec, size_t n) {
  lock_take(trace_tid());
  if (vs_likely(vs_trace_fd >= 0)) {
    if (vs_unlikely(vs_buf_len + n > sizeof vs_buf)) {
      flush_locked();
      clock_calibrate();
    }
    memcpy(vs_buf + vs_buf_len, rec, n);
    vs_buf_len += n;
  }
  lock_drop();
}

static const char vs_hex[16] = "0123456789abcdef";

/* Two digits per step from a 512-byte table: half the loop of one digit at a time, and
 * formatting is most of what a record costs. */
static char vs_hex2[256][2];

static void hex2_init(void) {
  for (int i = 0; i < 256; i++) {
    vs_hex2[i][0] = vs_hex[i >> 4];
    vs_hex2[i][1] = vs_hex[i & 15];
  }
}

static inline char *put_hex(char *p, uint64_t v) {
  if (v == 0) { *p++ = '0'; return p; }
  unsigned digits = (unsigned)(67 - __builtin_clzll(v)) / 4;
  char *end = p + digits, *q = end;
  while (q - p >= 2) {
    q -= 2;
    memcpy(q, vs_hex2[v & 0xff], 2);
    v >>= 8;
  }
  if (q > p) *--q = vs_hex[v & 15];
  return end;
}

static inline char *put_dec(char *p, uint64_t v) {
  char tmp[20];
  int n = 0;
  do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

static inline char *put_sp_hex(char *p, uint64_t v) { *p++ = ' '; return put_hex(p, v); }

/* Streams: "-" for the synchronous sentinel. Devices: "-" when unknown (< 0). */
static inline char *put_sp_stream(char *p, CUstream s) {
  *p++ = ' ';
  if (s == VS_NO_STREAM) { *p++ = '-'; return p; }
  return put_hex(p, (uint64_t)(uintptr_t)s);
}
static inline char *put_sp_dev(char *p, int d) {
  *p++ = ' ';
  if (d < 0) { *p++ = '-'; return p; }
  return put_hex(p, (uint64_t)d);
}

/* Common head of the native hot records: "<type> <t> <tid>". */
static inline char *native_head(char *p, char type) {
  *p++ = type;
  p = put_sp_hex(p, mono_ns() - vs_trace_mono0);
  return put_sp_hex(p, trace_tid());
}

/* rmm: "<tid>,<HH:MM:SS.uuuuuu>," as spdlog's "%t,%H:%M:%S.%f," (local time). */
static char *rmm_head(char *p) {
  p = put_dec(p, trace_tid());
  *p++ = ',';
  uint64_t real = mono_ns() - vs_trace_mono0 + vs_trace_real0;
  int64_t secs = (int64_t)(real / 1000000000ull) + vs_trace_tzoff;
  unsigned day = (unsigned)(((secs % 86400) + 86400) % 86400);
  unsigned us = (unsigned)((real / 1000u) % 1000000u);
  unsigned f[3] = {day / 3600, day / 60 % 60, day % 60};
  for (int i = 0; i < 3; i++) {
    *p++ = (char)('0' + f[i] / 10);
    *p++ = (char)('0' + f[i] % 10);
    *p++ = i < 2 ? ':' : '.';
  }
  for (unsigned div = 100000; div; div /= 10) *p++ = (char)('0' + us / div % 10);
  *p++ = ',';
  return p;
}

static char *rmm_tail(char *p, uint64_t ptr, uint64_t size, CUstream s) {
  *p++ = '0'; *p++ = 'x';
  p = put_hex(p, ptr);
  *p++ = ',';
  p = put_dec(p, size);
  *p++ = ','; *p++ = '0'; *p++ = 'x';
  p = put_hex(p, s == VS_NO_STREAM ? 0 : (uint64_t)(uintptr_t)s);
  *p++ = '\n';
  return p;
}

static char *put_str(char *p, const char *s) {
  while (*s) *p++ = *s++;
  return p;
}

/* ------------------------------------------------------------------ hot records */

void _vs_trace_alloc(vmmshim_api_t api, size_t requested, size_t served, CUdeviceptr ptr, CUstream stream,
                     int device) {
  if (!_vs_trace_on) return;
  char rec[VS_TRACE_REC_MAX], *p = rec;
  if (vs_trace_format == VS_TRACE_RMM) {
    p = rmm_head(p);
    p = put_str(p, "allocate,");
    p = rmm_tail(p, (uint64_t)ptr, served, stream);
  } else {
    p = native_head(p, 'a');
    p = put_sp_hex(p, (uint64_t)api);
    p = put_sp_dev(p, device);
    p = put_sp_stream(p, stream);
    p = put_sp_hex(p, (uint64_t)ptr);
    p = put_sp_hex(p, requested);
    p = put_sp_hex(p, served);
    *p++ = '\n';
  }
  emit(rec, (size_t)(p - rec));
}

void _vs_trace_free(vmmshim_api_t api, CUdeviceptr ptr, size_t served, CUstream stream, int device) {
  if (!_vs_trace_on) return;
  char rec[VS_TRACE_REC_MAX], *p = rec;
  if (vs_trace_format == VS_TRACE_RMM) {
    p = rmm_head(p);
    p = put_str(p, "free,");
    p = rmm_tail(p, (uint64_t)ptr, served, stream);
  } else {
    p = native_head(p, 'f');
    p = put_sp_hex(p, (uint64_t)api);
    p = put_sp_dev(p, device);
    p = put_sp_stream(p, stream);
    p = put_sp_hex(p, (uint64_t)ptr);
    p = put_sp_hex(p, served);
    *p++ = '\n';
  }
  emit(rec, (size_t)(p - rec));
}

void _vs_trace_alloc_fail(vmmshim_api_t api, size_t requested, CUstream stream, int device, CUresult err) {
  if (!_vs_trace_on) return;
  char rec[VS_TRACE_REC_MAX], *p = rec;
  if (vs_trace_format == VS_TRACE_RMM) {
    p = rmm_head(p);
    p = put_str(p, "allocate failure,");
    p = rmm_tail(p, 0, requested, stream);
  } else {
    p = native_head(p, 'o');
    p = put_sp_hex(p, (uint64_t)api);
    p = put_sp_dev(p, device);
    p = put_sp_stream(p, stream);
    p = put_sp_hex(p, requested);
    p = put_sp_hex(p, (uint64_t)err);
    *p++ = '\n';
  }
  emit(rec, (size_t)(p - rec));
}

void _vs_trace_vmm(vs_vmm_op_t op, CUdeviceptr va, size_t size, uint64_t handle, unsigned access_flags, int device,
                   CUresult result, uint64_t duration_ns) {
  if (!_vs_trace_on || vs_trace_format == VS_TRACE_RMM) return; /* rmm has no pool events */
  char rec[VS_TRACE_REC_MAX], *p = rec;
  p = native_head(p, 'm');
  p = put_sp_hex(p, (uint64_t)op);
  p = put_sp_dev(p, device);
  p = put_sp_hex(p, (uint64_t)va);
  p = put_sp_hex(p, size);
  p = put_sp_hex(p, handle);
  p = put_sp_hex(p, access_flags);
  p = put_sp_hex(p, (uint64_t)result);
  p = put_sp_hex(p, duration_ns);
  *p++ = '\n';
  emit(rec, (size_t)(p - rec));
}

void _vs_trace_flush(void) {
  if (vs_trace_fd < 0) return;
  lock_take(trace_tid());
  flush_locked();
  lock_drop();
}

/* ------------------------------------------------------------------ fatal signals */

static const int vs_fatal_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTERM, SIGINT};
#define VS_NSIG 65
static struct sigaction vs_old_action[VS_NSIG];

/* Async-signal-safe: syscalls and atomics only. If this very thread was interrupted
 * while holding the lock, the buffer may be mid-update: skip it (at most one record's
 * worth of work is in flight). Another thread holds the lock only for a memcpy or one
 * write(2): wait for it a little, then give up rather than hang a dying process. */
static void flush_from_signal(void) {
  if (vs_trace_fd < 0) return;
  unsigned me = (unsigned)syscall(SYS_gettid);
  if (atomic_load_explicit(&vs_lock_owner, memory_order_relaxed) == me) return;
  for (int tries = 0; tries < 2000; tries++) {
    unsigned expected = 0;
    if (atomic_compare_exchange_strong_explicit(&vs_lock_owner, &expected, me, memory_order_acquire,
                                                memory_order_relaxed)) {
      flush_locked();
      lock_drop();
      return;
    }
    struct timespec ts = {0, 50000}; /* 50 us, up to 100 ms in all */
    nanosleep(&ts, NULL);
  }
}

static void on_fatal_signal(int sig, siginfo_t *info, void *uctx) {
  int saved_errno = errno;
  flush_from_signal();
  struct sigaction *old = &vs_old_action[sig];
  if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
    old->sa_sigaction(sig, info, uctx);
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && !(old->sa_flags & SA_SIGINFO)) {
    old->sa_handler(sig);
  } else if (old->sa_handler == SIG_DFL) {
    /* Die the way the program would have: default action, signal again. The signal is
     * blocked while we run, so it is delivered as soon as this handler returns (and a
     * faulting instruction, re-executed, faults again under the default action). */
    sigaction(sig, old, NULL);
    raise(sig);
  }
  errno = saved_errno;
}

static void install_signal_handlers(void) {
  for (size_t i = 0; i < sizeof vs_fatal_signals / sizeof vs_fatal_signals[0]; i++) {
    int sig = vs_fatal_signals[i];
    struct sigaction old;
    if (sigaction(sig, NULL, &old) != 0) continue;
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_fatal_signal) continue; /* still ours */
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue; /* e.g. nohup: keep ignoring */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    vs_old_action[sig] = old;
    sigaction(sig, &sa, NULL);
  }
}

/* ------------------------------------------------------------------ open, header, fork */

/* The job rank as the launchers set it (torchrun, Open MPI, Slurm), "0" when none does. */
static const char *job_rank(void) {
  static const char *vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return v;
  }
  return "0";
}

static void expand_path(const char *tmpl, char *out, size_t cap) {
  const char *rank = job_rank();
  size_t o = 0;
  for (const char *s = tmpl; *s && o + 1 < cap; s++) {
    char num[24];
    const char *ins = NULL;
    if (s[0] == '%' && s[1] == 'p') { snprintf(num, sizeof num, "%d", (int)getpid()); ins = num; }
    else if (s[0] == '%' && s[1] == 'r') ins = rank;
    else if (s[0] == '%' && s[1] == '%') ins = "%";
    if (ins) {
      s++;
      size_t n = strlen(ins);
      if (o + n >= cap) break;
      memcpy(out + o, ins, n);
      o += n;
    } else {
      out[o++] = *s;
    }
  }
  out[o] = '\0';
}

static void write_header(void) {
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_open();
  vs_trace_mono0 = mono_ns();
  vs_trace_real0 = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
  struct tm tm;
  time_t now = rt.tv_sec;
  vs_trace_tzoff = localtime_r(&now, &tm) ? (int64_t)tm.tm_gmtoff : 0;
  if (vs_trace_format == VS_TRACE_RMM) {
    static const char hdr[] = "Thread,Time,Action,Pointer,Size,Stream\n";
    write_all(vs_trace_fd, hdr, sizeof hdr - 1);
    return;
  }
  char h[4096];
  size_t n = 0;
  n += (size_t)snprintf(h + n, sizeof h - n, "v %x vmmshim %s\n", VS_TRACE_FORMAT_VERSION, VMMSHIM_VERSION);
  char exe[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k < 0) k = 0;
  exe[k] = '\0';
  for (ssize_t i = 0; i < k; i++)
    if (exe[i] == '\n') exe[i] = '?';
  n += (size_t)snprintf(h + n, sizeof h - n, "x %s\n", exe);
  /* The command line: arguments separated by one space (a newline inside becomes a space). */
  char cmd[2048];
  size_t c = 0;
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t r;
    while (c < sizeof cmd - 1 && (r = read(fd, cmd + c, sizeof cmd - 1 - c)) > 0) c += (size_t)r;
    close(fd);
  }
  while (c > 0 && cmd[c - 1] == '\0') c--;
  for (size_t i = 0; i < c; i++)
    if (cmd[i] == '\0' || cmd[i] == '\n' || cmd[i] == '\r') cmd[i] = ' ';
  cmd[c] = '\0';
  n += (size_t)snprintf(h + n, sizeof h - n, "c %s\n", cmd);
  long rk = strtol(job_rank(), NULL, 10);
  n += (size_t)snprintf(h + n, sizeof h - n, "p %x %x %lx\n", (unsigned)getpid(), (unsigned)getppid(),
                        (unsigned long)(rk < 0 ? 0 : rk));
  n += (size_t)snprintf(h + n, sizeof h - n, "s %llx %llx\n", (unsigned long long)vs_trace_real0,
                        (unsigned long long)vs_trace_mono0);
  if (n > sizeof h) n = sizeof h;
  write_all(vs_trace_fd, h, n);
}

/* Opens vs_trace_path (already expanded) and writes the header. Returns 0 or -1. */
static int open_file(void) {
  int fd = open(vs_trace_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    _vs_warn("cannot open trace file %s: %s (errno %d); the program runs without a trace", vs_trace_path,
             strerror(e), e);
    return -1;
  }
  vs_trace_fd = fd;
  vs_buf_len = 0;
  write_header();
  return 0;
}

static void atfork_prepare(void) {
  if (vs_trace_fd >= 0) lock_take(trace_tid());
}

static void atfork_parent(void) {
  if (vs_trace_fd >= 0) lock_drop();
}

/* In the child: never write into the parent's file. */
static void atfork_child(void) {
  vs_tid = 0;
  atomic_store_explicit(&vs_lock_owner, 0, memory_order_relaxed);
  if (vs_trace_fd < 0) return;
  _vs_trace_on = 0;
  vs_buf_len = 0; /* the parent writes these records, not us */
  close(vs_trace_fd);
  vs_trace_fd = -1;
  if (!strstr(vs_trace_template, "%p")) return; /* one file per process needs %p */
  expand_path(vs_trace_template, vs_trace_path, sizeof vs_trace_path);
  if (open_file() == 0) _vs_trace_on = 1;
}

void _vs_trace_open(void) {
  static bool atfork_done;
  hex2_init();
  if (vs_trace_fd >= 0) return;
  const char *tmpl = _vs_option_string(VS_OPT_TRACE);
  if (!tmpl || !*tmpl) return;
  size_t len = strlen(tmpl);
  if (len >= sizeof vs_trace_template) {
    _vs_warn("trace path too long (%zu bytes); the program runs without a trace", len);
    return;
  }
  memcpy(vs_trace_template, tmpl, len + 1);
  vs_trace_format = _vs_option(VS_OPT_TRACE_FORMAT) == VS_TRACE_RMM ? VS_TRACE_RMM : VS_TRACE_NATIVE;
  expand_path(vs_trace_template, vs_trace_path, sizeof vs_trace_path);
  if (open_file() != 0) return;
  if (!atfork_done) {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atfork_done = true;
  }
  install_signal_handlers();
  _vs_trace_on = 1;
  _vs_info("tracing to %s (%s format)", vs_trace_path, vs_trace_format == VS_TRACE_RMM ? "rmm" : "native");
}

void _vs_trace_close(void) {
  if (vs_trace_fd < 0) return;
  _vs_trace_on = 0;
  lock_take(trace_tid());
  if (vs_trace_format == VS_TRACE_NATIVE) {
    char rec[64], *p = rec;
    *p++ = 'e';
    p = put_sp_hex(p, mono_ns() - vs_trace_mono0);
    *p++ = '\n';
    if (vs_buf_len + (size_t)(p - rec) > sizeof vs_buf) flush_locked();
    memcpy(vs_buf + vs_buf_len, rec, (size_t)(p - rec));
    vs_buf_len += (size_t)(p - rec);
  }
  flush_locked();
  int fd = vs_trace_fd;
  vs_trace_fd = -1;
  lock_drop();
  close(fd);
  int errs = atomic_exchange(&vs_trace_write_errors, 0);
  if (errs) _vs_warn("%d writes to trace file %s failed; the trace is incomplete", errs, vs_trace_path);
}
