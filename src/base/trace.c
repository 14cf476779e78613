/* trace.c: the allocation trace (VMMSHIM_TRACE=path, VMMSHIM_TRACE_FORMAT=native|rmm).
 *
 * Owns the trace file: its header, one line per event, the ring the events wait in,
 * and the moments the ring leaves the process early (exit, fatal signal, fork).
 *
 *   - An event is a fixed 64-byte binary record in a ring of 128 shared by all threads.
 *     A thread takes the next position with one atomic add, reads the raw clock, fills
 *     the record and publishes it through the slot's sequence number: no lock, no
 *     formatting, no syscall. Text is made later, in batches: the thread whose record
 *     is the 96th since the last trigger drains every published record in position
 *     order (formatting the lines, converting the times) and writes them with write(2);
 *     a thread that finds the ring full drains it first. A quarter of the ring stays
 *     free for the other threads while one drains. Each write(2) carries whole lines,
 *     so after kill -9 the file is a prefix of complete records (readers ignore a final
 *     partial line all the same), missing at most the records still in the ring and
 *     the lines of a drain in progress.
 *   - Fatal signals (SEGV, BUS, ABRT, FPE, ILL, TERM, INT) drain the ring with write(2)
 *     only, then chain to the handler the program had, or restore the default action
 *     and re-raise so the process dies the way it would have.
 *   - fork: the child drops the inherited ring and the parent's file; it opens its own
 *     file when the path holds %p, and stops tracing otherwise.
 *   - VMMSHIM_TRACE_MAX caps the file. The drain counts the bytes it writes (no call of its
 *     own) and checks each line before it keeps it; the first line that would pass the cap
 *     is replaced by the end record with the cap as a second field ("e T MAX", room for it
 *     is kept under the cap), tracing stops and one warning says so. Every line in the file
 *     is whole, and each record follows the lines it refers to.
 *
 * Records become text in trace_format.c; their times come from clock.c. The native format
 * is documented column by column in README.md ("Trace format"). */
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

#include "vmmshim/clock.h"
#include "vmmshim/base.h"
#include "vmmshim/stacks.h"
#include "vmmshim/trace.h"

#define VS_TRACE_SLOTS 128      /* records the ring holds (a power of two): 8 KiB */
#define VS_TRACE_DRAIN_EVERY 96 /* the record at every 96th position drains the ring */
#define VS_TRACE_TEXT_SIZE 8192 /* lines go out in write(2)s of at most this */
#define VS_TRACE_END_MAX 40     /* the longest end record: 'e' and two 16-digit fields */

int _vs_trace_on;

static int vs_trace_fd = -1;
static vs_trace_fmt_t vs_fmt;                  /* format and time origin */
static char vs_trace_template[PATH_MAX];       /* VMMSHIM_TRACE as given */
static char vs_trace_path[PATH_MAX];           /* after %p / %r expansion */
static atomic_int vs_trace_write_errors;
/* VMMSHIM_TRACE_MAX (0: none); the bytes written so far, and how many the lines may take in
 * all: the cap less room for the end record (UINT64_MAX: no cap). Under the lock. */
static uint64_t vs_trace_max;
static uint64_t vs_trace_bytes;
static uint64_t vs_trace_room = UINT64_MAX;
static bool vs_trace_cut;          /* the cap was reached: nothing more is written */
static atomic_int vs_trace_cut_untold; /* the warning about it is still to be given */

static vs_trace_rec_t vs_ring[VS_TRACE_SLOTS];
/* The next position to hand out, alone on its cache line: every record's one atomic. */
static struct {
  _Alignas(64) atomic_uint_least64_t pos;
} vs_ring_next;
static uint64_t vs_ring_drained; /* next position to drain; under the lock */

static char vs_text[VS_TRACE_TEXT_SIZE]; /* lines of one drain; under the lock */
static atomic_uint vs_lock_owner;        /* the drain lock. 0: free; else the owner's thread id */

static _Thread_local uint32_t vs_tid; /* cached gettid(); reset in a forked child */

/* ------------------------------------------------------------------ small helpers */

static inline uint32_t trace_tid(void) {
  uint32_t t = vs_tid;
  if (vs_unlikely(t == 0)) vs_tid = t = (uint32_t)syscall(SYS_gettid);
  return t;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Test before the compare-and-swap: threads waiting for a drain read the word from their
 * own cache instead of taking its line from the drainer on every try. */
static inline bool lock_try(uint32_t me) {
  if (atomic_load_explicit(&vs_lock_owner, memory_order_relaxed) != 0) return false;
  unsigned expected = 0;
  return atomic_compare_exchange_strong_explicit(&vs_lock_owner, &expected, me, memory_order_acquire,
                                                 memory_order_relaxed);
}

static inline void lock_take(uint32_t me) {
  unsigned spins = 0;
  while (!lock_try(me)) {
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

/* ------------------------------------------------------------------ the ring */

static void text_out(size_t len) {
  if (!len || vs_trace_fd < 0) return;
  if (write_all(vs_trace_fd, vs_text, len) != 0) atomic_fetch_add_explicit(&vs_trace_write_errors, 1, memory_order_relaxed);
  else vs_trace_bytes += len;
}

/* Which stacks, modules and strings the file has had (each is written once, before the
 * first record that refers to it). Under the lock; cleared when a file is opened. */
static uint8_t vs_stack_written[(VS_STACKS_MAX + 8) / 8];
static uint8_t vs_module_written[(VS_MODULES_MAX + 8) / 8];
static uint8_t vs_string_written[(VS_STRINGS_MAX + 8) / 8];

static bool first_time(uint8_t *bits, uint32_t id) {
  uint8_t bit = (uint8_t)(1u << (id & 7));
  if (bits[id >> 3] & bit) return false;
  bits[id >> 3] |= bit;
  return true;
}

/* Room for `need` more bytes of text at *len, writing out what is there if not. */
static char *text_room(size_t *len, size_t need) {
  if (*len + need > sizeof vs_text) {
    text_out(*len);
    *len = 0;
  }
  return vs_text + *len;
}

/* A line was formatted at p, up to end. Keeps it when the file stays within the cap (true);
 * else drops it (false), and the caller cuts the trace there. */
static bool line_kept(size_t *len, char *p, char *end) {
  size_t at = (size_t)(p - vs_text);
  if (vs_unlikely(vs_trace_bytes + at + (size_t)(end - p) > vs_trace_room)) {
    *len = at;
    return false;
  }
  *len = at + (size_t)(end - p);
  return true;
}

/* The cap is reached: the end record with the cap as its second field, then nothing more.
 * Tracing stops (no more records taken, no stacks captured); the warning waits for a caller
 * that may print (not a signal handler). The rmm format has no place for a marker. */
static void trace_cut(size_t *len, uint64_t mono_ns) {
  vs_trace_cut = true;
  _vs_trace_on = 0;
  if (vs_fmt.format == VS_TRACE_NATIVE) {
    char *p = text_room(len, VS_TRACE_END_MAX);
    char *end = _vs_trace_format_end(p, mono_ns, &vs_fmt);
    uint64_t cap = vs_trace_max;
    char hex[17];
    int n = 0;
    do {
      hex[n++] = "0123456789abcdef"[cap & 15];
      cap >>= 4;
    } while (cap);
    end[-1] = ' ';
    while (n) *end++ = hex[--n];
    *end++ = '\n';
    *len += (size_t)(end - p);
  }
  atomic_store_explicit(&vs_trace_cut_untold, 1, memory_order_relaxed);
}

static void tell_cut(void) {
  if (vs_unlikely(atomic_load_explicit(&vs_trace_cut_untold, memory_order_relaxed)) &&
      atomic_exchange_explicit(&vs_trace_cut_untold, 0, memory_order_relaxed))
    _vs_warn("trace %s reached VMMSHIM_TRACE_MAX (%llu bytes); later events are not recorded (the program runs on)",
             vs_trace_path, (unsigned long long)vs_trace_max);
}

/* The lines a stack needs before an allocation can refer to it: its modules, its strings,
 * the stack itself. False when the cap cut one of them. Async-signal-safe: the entries are
 * published and immutable. */
static bool emit_stack(uint32_t id, size_t *len) {
  const vs_stack_t *st = _vs_stack_get(id);
  if (!st || !first_time(vs_stack_written, id)) return true;
  for (unsigned i = 0; i < st->nnative; i++) {
    uint32_t m = st->modules[i];
    const vs_module_t *mod = _vs_module_get(m);
    if (!mod || !first_time(vs_module_written, m)) continue;
    char *p = text_room(len, VS_TRACE_MODULE_MAX);
    if (!line_kept(len, p, _vs_trace_format_module(p, m, mod))) return false;
  }
  for (unsigned i = 0; i < st->npy; i++) {
    uint32_t ids[2] = {st->py[i].file, st->py[i].func};
    for (int k = 0; k < 2; k++) {
      const char *text = _vs_string_get(ids[k]);
      if (!text || !first_time(vs_string_written, ids[k])) continue;
      char *p = text_room(len, VS_TRACE_STRING_MAX);
      if (!line_kept(len, p, _vs_trace_format_string(p, ids[k], text))) return false;
    }
  }
  char *p = text_room(len, VS_TRACE_STACK_MAX);
  return line_kept(len, p, _vs_trace_format_stack(p, st));
}

/* Formats and writes every published record, in position order, up to the first one not
 * yet published (its writer is between taking the position and publishing; it goes out
 * with the next drain). With no file open, or the trace cut, the records are dropped.
 * Caller holds the lock. Async-signal-safe: static tables, the stack, write(2). */
static uint64_t drain_locked(void) {
  uint64_t first = vs_ring_drained, pos = first;
  size_t len = 0;
  for (;; pos++) {
    vs_trace_rec_t *r = &vs_ring[pos & (VS_TRACE_SLOTS - 1)];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != pos + 1) break;
    if (vs_trace_fd >= 0 && !vs_trace_cut) {
      uint64_t ns = _vs_clock_to_ns(r->t);
      bool kept = !((r->type == 'a' || r->type == 'u') && r->e) || emit_stack(r->e, &len); /* 'u': its stack too */
      if (kept) {
        char *p = text_room(&len, VS_TRACE_REC_MAX);
        kept = line_kept(&len, p, _vs_trace_format_record(p, r, ns, &vs_fmt));
      }
      if (!kept) trace_cut(&len, ns);
    }
    atomic_store_explicit(&r->seq, pos + VS_TRACE_SLOTS, memory_order_release);
  }
  vs_ring_drained = pos;
  text_out(len);
  return pos - first;
}

/* A drain of at least half a drain period (48 records) also starts a clock segment. No
 * drain passes a record not yet published, and fewer than VS_TRACE_SLOTS (128) records
 * precede one in the ring, so at most 3 segments start between a record's clock read and
 * its drain: the 8 kept always hold the one its ticks fall in. */
static void drain(void) {
  if (drain_locked() >= VS_TRACE_DRAIN_EVERY / 2) _vs_clock_calibrate();
  tell_cut();
}

/* The slot still holds the record from one lap before: drain, or wait for the thread that
 * is draining. Only when the ring is full. */
static __attribute__((noinline)) void wait_for_slot(vs_trace_rec_t *r, uint64_t pos) {
  unsigned spins = 0;
  while (atomic_load_explicit(&r->seq, memory_order_acquire) != pos) {
    if (lock_try(trace_tid())) {
      drain();
      lock_drop();
      continue;
    }
    /* Someone drains: wait on our own slot, not on the lock word. */
    if (++spins < 256) {
      cpu_relax();
    } else {
      sched_yield();
      spins = 0;
    }
  }
}

/* Takes the next position: the record's place in the file. */
static inline vs_trace_rec_t *rec_place(uint64_t *pos_out) {
  uint64_t pos = atomic_fetch_add_explicit(&vs_ring_next.pos, 1, memory_order_relaxed);
  vs_trace_rec_t *r = &vs_ring[pos & (VS_TRACE_SLOTS - 1)];
  if (vs_unlikely(atomic_load_explicit(&r->seq, memory_order_acquire) != pos)) wait_for_slot(r, pos);
  *pos_out = pos;
  return r;
}

/* The fields every record has: time, thread, type, API or operation, device. */
static inline void rec_head(vs_trace_rec_t *r, char type, unsigned sub, int device) {
  r->t = _vs_clock_raw();
  r->tid = trace_tid();
  r->type = (uint8_t)type;
  r->sub = (uint8_t)sub;
  r->dev = device;
}

static inline vs_trace_rec_t *rec_take(char type, unsigned sub, int device, uint64_t *pos_out) {
  vs_trace_rec_t *r = rec_place(pos_out);
  rec_head(r, type, sub, device);
  return r;
}

static inline void rec_publish(vs_trace_rec_t *r, uint64_t pos) {
  atomic_store_explicit(&r->seq, pos + 1, memory_order_release);
  /* Not waiting for a drain in progress: it, the next drain or a full ring takes these. */
  if (vs_unlikely(pos % VS_TRACE_DRAIN_EVERY == VS_TRACE_DRAIN_EVERY - 1) && lock_try(trace_tid())) {
    drain();
    lock_drop();
  }
}

/* Forgets every record in the ring (a forked child; a trace opened again). */
static void ring_reset(void) {
  for (uint64_t i = 0; i < VS_TRACE_SLOTS; i++) atomic_store_explicit(&vs_ring[i].seq, i, memory_order_relaxed);
  atomic_store_explicit(&vs_ring_next.pos, 0, memory_order_relaxed);
  vs_ring_drained = 0;
}

/* ------------------------------------------------------------------ hot records */

void _vs_trace_alloc(vmmshim_api_t api, size_t requested, size_t served, CUdeviceptr ptr, CUstream stream,
                     int device) {
  if (!_vs_trace_on) return;
  /* The stack first: its unwinding must not hold up the ring at this record's position. */
  uint32_t stack = vs_unlikely(_vs_stacks_on) ? _vs_stack_capture(requested) : 0;
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('a', api, device, &pos);
  r->a = (uint64_t)ptr;
  r->b = requested;
  r->c = served;
  r->d = (uint64_t)(uintptr_t)stream;
  r->e = stack;
  rec_publish(r, pos);
}

vs_trace_place_t _vs_trace_place(void) {
  vs_trace_place_t at = {NULL, 0};
  if (_vs_trace_on) at.rec = rec_place(&at.pos);
  return at;
}

void _vs_trace_free_at(vs_trace_place_t at, vmmshim_api_t api, CUdeviceptr ptr, size_t served, CUstream stream,
                       int device) {
  vs_trace_rec_t *r = at.rec;
  if (!r) return;
  rec_head(r, 'f', api, device);
  r->a = (uint64_t)ptr;
  r->c = served;
  r->d = (uint64_t)(uintptr_t)stream;
  rec_publish(r, at.pos);
}

void _vs_trace_free(vmmshim_api_t api, CUdeviceptr ptr, size_t served, CUstream stream, int device) {
  if (!_vs_trace_on) return;
  _vs_trace_free_at(_vs_trace_place(), api, ptr, served, stream, device);
}

void _vs_trace_alloc_fail(vmmshim_api_t api, size_t requested, CUstream stream, int device, CUresult err) {
  if (!_vs_trace_on) return;
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('o', api, device, &pos);
  r->b = requested;
  r->d = (uint64_t)(uintptr_t)stream;
  r->e = (uint32_t)err;
  rec_publish(r, pos);
}

void _vs_trace_vmm(vs_vmm_op_t op, CUdeviceptr va, size_t size, uint64_t handle, unsigned access_flags, int device,
                   CUresult result, uint64_t duration_ns) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return; /* rmm has no pool events */
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('m', op, device, &pos);
  r->a = (uint64_t)va;
  r->b = size;
  r->c = handle;
  r->d = duration_ns;
  r->e = (uint32_t)result;
  r->flags = (uint8_t)access_flags;
  rec_publish(r, pos);
}

/* A name of up to 31 bytes kept in a record's a-d (trace_format.c's put_index_name writes it);
 * blanks: its spaces and newlines made '_'. */
static void rec_name(vs_trace_rec_t *r, const char *name, bool blanks) {
  char buf[32] = {0};
  strncpy(buf, name, sizeof buf - 1);
  for (int i = 0; blanks && i < 32; i++)
    if (buf[i] == ' ' || buf[i] == '\n') buf[i] = '_';
  memcpy(&r->a, buf, 8), memcpy(&r->b, buf + 8, 8), memcpy(&r->c, buf + 16, 8), memcpy(&r->d, buf + 24, 8);
}

void _vs_trace_sleep(int wake, int tag, const char *name, int mode, uint64_t device_bytes, uint64_t host_bytes,
                     int result, uint64_t duration_ns) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return; /* rmm has no such events */
  uint64_t pos;
  if (name) { /* the tag's name first, in a record of its own: a 'w' line carries numbers */
    vs_trace_rec_t *g = rec_take('g', 0, -1, &pos);
    rec_name(g, name, false);
    g->e = (uint32_t)tag;
    rec_publish(g, pos);
  }
  vs_trace_rec_t *r = rec_take('w', wake ? 1 : 0, -1, &pos);
  r->a = device_bytes;
  r->b = host_bytes;
  r->c = tag < 0 ? ~0ull : (uint64_t)tag;
  r->d = duration_ns;
  r->e = (uint32_t)result;
  r->flags = (uint8_t)mode;
  rec_publish(r, pos);
}

void _vs_trace_stitch(CUdeviceptr va, size_t size, unsigned handles, size_t fresh, int device,
                      uint64_t duration_ns) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return; /* rmm has no pool events */
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('h', 0, device, &pos);
  r->a = (uint64_t)va;
  r->b = size;
  r->c = fresh;
  r->d = duration_ns;
  r->e = handles;
  rec_publish(r, pos);
}

void _vs_trace_rule(CUdeviceptr ptr, int rule, int device, const char *tag, const char *text) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return; /* rmm has no tags */
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('j', (uint8_t)rule, device, &pos);
  r->a = (uint64_t)ptr;
  r->c = (uint64_t)(uintptr_t)tag;
  r->d = (uint64_t)(uintptr_t)text;
  rec_publish(r, pos);
}

void _vs_trace_group(int kind, int peer, uint64_t bytes, int result, uint64_t duration_ns) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return; /* rmm has no such events */
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('b', (uint8_t)kind, -1, &pos);
  r->a = peer > 0 ? (uint64_t)peer : 0;
  r->b = bytes;
  r->d = duration_ns;
  r->e = (uint32_t)result;
  rec_publish(r, pos);
}

void _vs_trace_outside(int kind, int freed, int device, uint64_t key, size_t size, uintptr_t caller, uint32_t stack) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return;
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('u', (unsigned)(2 * kind + (freed ? 1 : 0)), device, &pos);
  r->a = key;
  r->b = size;
  r->c = caller;
  r->e = stack;
  rec_publish(r, pos);
}

void _vs_trace_residue(int owner, int device, uint64_t seq, uint64_t bytes, unsigned lib) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return;
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('r', (unsigned)owner, device, &pos);
  r->a = seq;
  r->b = bytes;
  r->e = lib;
  rec_publish(r, pos);
}

void _vs_trace_residue_name(unsigned lib, const char *name) {
  if (!_vs_trace_on || vs_fmt.format == VS_TRACE_RMM) return;
  uint64_t pos;
  vs_trace_rec_t *r = rec_take('r', VS_RESIDUE_NAME, -1, &pos);
  rec_name(r, name, true);
  r->e = lib;
  rec_publish(r, pos);
}

void _vs_trace_flush(void) {
  if (vs_trace_fd < 0) return;
  lock_take(trace_tid());
  drain();
  lock_drop();
}

/* ------------------------------------------------------------------ fatal signals */

static const int vs_fatal_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTERM, SIGINT};
#define VS_NSIG 65
static struct sigaction vs_old_action[VS_NSIG];

/* Async-signal-safe: syscalls and atomics only. If this very thread was interrupted while
 * draining, the text buffer is mid-update: skip (the records stay unwritten). Another
 * thread drains for the time of one batch: wait for it a little, then give up rather than
 * hang a dying process. A record this thread had taken but not published stops the drain
 * there: at most the records after it are lost. */
static void flush_from_signal(void) {
  if (vs_trace_fd < 0) return;
  unsigned me = (unsigned)syscall(SYS_gettid);
  if (atomic_load_explicit(&vs_lock_owner, memory_order_relaxed) == me) return;
  for (int tries = 0; tries < 2000; tries++) {
    if (lock_try(me)) {
      drain_locked();
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

/* false when the expanded path does not fit in cap bytes (nothing is cut silently). */
static bool expand_path(const char *tmpl, char *out, size_t cap) {
  const char *rank = job_rank();
  size_t o = 0;
  for (const char *s = tmpl; *s; s++) {
    if (o + 1 >= cap) return false;
    char num[24];
    const char *ins = NULL;
    if (s[0] == '%' && s[1] == 'p') { snprintf(num, sizeof num, "%d", (int)getpid()); ins = num; }
    else if (s[0] == '%' && s[1] == 'r') ins = rank;
    else if (s[0] == '%' && s[1] == '%') ins = "%";
    if (ins) {
      s++;
      size_t n = strlen(ins);
      if (o + n >= cap) return false;
      memcpy(out + o, ins, n);
      o += n;
    } else {
      out[o++] = *s;
    }
  }
  out[o] = '\0';
  return true;
}

static void write_header(void) {
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  _vs_clock_open();
  vs_fmt.mono0 = _vs_clock_to_ns(_vs_clock_raw());
  vs_fmt.real0 = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
  struct tm tm;
  time_t now = rt.tv_sec;
  vs_fmt.tzoff = localtime_r(&now, &tm) ? (int64_t)tm.tm_gmtoff : 0;
  char h[VS_TRACE_HEADER_MAX];
  size_t n = _vs_trace_format_header(h, sizeof h, &vs_fmt, job_rank());
  if (_vs_stacks_on && n + 64 < sizeof h) { /* the stack capture settings */
    unsigned frames, sample;
    uint64_t min_size;
    _vs_stacks_settings(&frames, &min_size, &sample);
    n += (size_t)snprintf(h + n, sizeof h - n, "t %x %llx %x\n", frames, (unsigned long long)min_size, sample);
  }
  if (write_all(vs_trace_fd, h, n) == 0) vs_trace_bytes += n;
}

/* Opens vs_trace_path (already expanded) and writes the header. Returns 0 or -1. A regular file
 * or a FIFO only, never through a symbolic link; a FIFO must have its reader already (log.c's
 * _vs_open_output says why). */
static int open_file(void) {
  int fd = _vs_open_output(vs_trace_path, true, false);
  if (fd < 0) {
    int e = errno;
    _vs_warn("cannot open trace file %s: %s (errno %d); the program runs without a trace", vs_trace_path,
             _vs_open_output_error(e), e);
    return -1;
  }
  lock_take(trace_tid());
  ring_reset(); /* records of an earlier trace, or taken while none was open */
  memset(vs_stack_written, 0, sizeof vs_stack_written); /* a new file has had none of them */
  memset(vs_module_written, 0, sizeof vs_module_written);
  memset(vs_string_written, 0, sizeof vs_string_written);
  vs_trace_bytes = 0;
  vs_trace_cut = false;
  vs_trace_fd = fd;
  write_header();
  if (vs_trace_bytes > vs_trace_room) { /* a cap smaller than the header: the end record at once */
    size_t len = 0;
    trace_cut(&len, _vs_clock_to_ns(_vs_clock_raw()));
    text_out(len);
  }
  lock_drop();
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
  ring_reset(); /* the parent writes these records, not us */
  close(vs_trace_fd);
  vs_trace_fd = -1;
  if (!strstr(vs_trace_template, "%p")) return; /* one file per process needs %p */
  if (!expand_path(vs_trace_template, vs_trace_path, sizeof vs_trace_path)) return;
  if (open_file() == 0) _vs_trace_on = !vs_trace_cut;
}

void _vs_trace_open(void) {
  static bool atfork_done;
  _vs_trace_format_init();
  if (vs_trace_fd >= 0) return;
  const char *tmpl = _vs_option_string(VS_OPT_TRACE);
  if (!tmpl || !*tmpl) return;
  size_t len = strlen(tmpl);
  if (len >= sizeof vs_trace_template) {
    _vs_warn("trace path too long (%zu bytes); the program runs without a trace", len);
    return;
  }
  memcpy(vs_trace_template, tmpl, len + 1);
  vs_fmt.format = _vs_option(VS_OPT_TRACE_FORMAT) == VS_TRACE_RMM ? VS_TRACE_RMM : VS_TRACE_NATIVE;
  vs_trace_max = _vs_option(VS_OPT_TRACE_MAX);
  vs_trace_room = !vs_trace_max ? UINT64_MAX : vs_trace_max > VS_TRACE_END_MAX ? vs_trace_max - VS_TRACE_END_MAX : 0;
  if (!expand_path(vs_trace_template, vs_trace_path, sizeof vs_trace_path)) {
    _vs_warn("trace path too long once %%p and %%r are expanded; the program runs without a trace");
    return;
  }
  _vs_stacks_open();
  if (open_file() != 0) {
    _vs_stacks_on = 0;
    return;
  }
  if (!atfork_done) {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atfork_done = true;
  }
  install_signal_handlers();
  _vs_trace_on = !vs_trace_cut;
  tell_cut();
  _vs_info("tracing to %s (%s format)", vs_trace_path, vs_fmt.format == VS_TRACE_RMM ? "rmm" : "native");
}

void _vs_trace_close(void) {
  if (vs_trace_fd < 0) return;
  _vs_trace_on = 0;
  lock_take(trace_tid());
  drain_locked();
  if (vs_fmt.format == VS_TRACE_NATIVE && !vs_trace_cut) /* a cut trace has its end record */
    text_out((size_t)(_vs_trace_format_end(vs_text, _vs_clock_to_ns(_vs_clock_raw()), &vs_fmt) - vs_text));
  int fd = vs_trace_fd;
  vs_trace_fd = -1;
  uint64_t bytes = vs_trace_bytes;
  bool cut = vs_trace_cut;
  lock_drop();
  close(fd);
  tell_cut();
  int errs = atomic_exchange(&vs_trace_write_errors, 0);
  if (errs) _vs_warn("%d writes to trace file %s failed; the trace is incomplete", errs, vs_trace_path);
  if (_vs_option(VS_OPT_STATS) || _vs_option(VS_OPT_VERBOSE))
    _vs_note("stats: trace %s: %llu bytes%s", vs_trace_path, (unsigned long long)bytes,
             cut ? ", cut at VMMSHIM_TRACE_MAX: later events are not in it" : "");
}
