/* test_unit_trace: src/trace.c linked straight in (no preload).
 *
 * Every record kind written and read back (native and rmm), %p/%r expansion, an
 * unopenable path, crashes (SIGSEGV, abort, kill -9) and a chained SIGTERM handler in
 * forked children, fork children never writing into the parent's file, and many threads
 * writing at once (nothing lost, each thread's records in its order). Runs from the repository root (tests/run.sh does); when python3 is there,
 * the traces it writes are also fed to scripts/vmmshim-report. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vmmshim/internal.h"

#include "check.h"

static char dir[256];
static char exe[1024];      /* /proc/self/exe */
static const char *exe_arg0; /* argv[0] */

static void open_trace(const char *path, const char *format) {
  setenv("VMMSHIM_TRACE", path, 1);
  if (format) setenv("VMMSHIM_TRACE_FORMAT", format, 1);
  else unsetenv("VMMSHIM_TRACE_FORMAT");
  _vs_config_reload();
  _vs_trace_open();
}

/* Splits a line into space-separated fields (in place). */
static int fields(char *line, char **f, int max) {
  int n = 0;
  for (char *tok = strtok(line, " "); tok && n < max; tok = strtok(NULL, " ")) f[n++] = tok;
  return n;
}

static unsigned long long hx(const char *s) { return strtoull(s, NULL, 16); }

static void run_report(const char *path) {
  if (system("command -v python3 >/dev/null 2>&1") != 0) return;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 scripts/vmmshim-report '%s' >/dev/null 2>&1", path);
  int rc = system(cmd);
  CHECK(rc == 0, "vmmshim-report on %s exited with %d", path, rc);
}

/* ------------------------------------------------------------------ native records */
static void test_native(void) {
  char path[512], tmpl[512];
  snprintf(tmpl, sizeof tmpl, "%s/native-%%p-%%r.trace", dir);
  setenv("RANK", "3", 1);
  open_trace(tmpl, NULL);
  unsetenv("RANK");
  snprintf(path, sizeof path, "%s/native-%d-3.trace", dir, (int)getpid());
  CHECK(_vs_trace_on == 1, "tracing on");
  CHECK(access(path, F_OK) == 0, "%%p and %%r expanded into %s", path);
  CUstream s = (CUstream)(uintptr_t)0xabc0;
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 1000, 1024, 0x7f0000000000ull, VS_NO_STREAM, 0);
  _vs_trace_alloc(VMMSHIM_API_RUNTIME_ASYNC, 5, 512, 0x7f0000000400ull, s, 1);
  _vs_trace_free(VMMSHIM_API_DRIVER, 0x7f0000000000ull, 1024, VS_NO_STREAM, 0);
  _vs_trace_free(VMMSHIM_API_DRIVER_ASYNC, 0x7f0000000400ull, 512, s, 1);
  _vs_trace_alloc_fail(VMMSHIM_API_RUNTIME, 1ull << 40, VS_NO_STREAM, 0, CUDA_ERROR_OUT_OF_MEMORY);
  for (int op = VS_VMM_RESERVE; op <= VS_VMM_ADDRESS_FREE; op++)
    _vs_trace_vmm((vs_vmm_op_t)op, 0x7f0000000000ull, 2ull << 20, op == VS_VMM_CREATE ? 0x55 : 0,
                  op == VS_VMM_SET_ACCESS ? 3 : 0, 0, CUDA_SUCCESS, 1000 + (uint64_t)op);
  _vs_trace_close();
  CHECK(_vs_trace_on == 0, "tracing off after close");

  char *text = check_slurp(path, NULL);
  CHECK(text != NULL, "read %s", path);
  if (!text) return;
  char *save = NULL;
  int n = 0, na = 0, nf = 0, no = 0, nm = 0, ne = 0;
  unsigned long long last_t = 0;
  bool t_monotonic = true;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), n++) {
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", line);
    char *f[16];
    int k = fields(copy, f, 16);
    if (n == 0) {
      CHECK(k == 4 && !strcmp(f[0], "v") && !strcmp(f[1], "4") && !strcmp(f[2], "vmmshim"), "version line '%s'", line);
      continue;
    }
    switch (line[0]) {
    case 'x': CHECK(!strcmp(line + 2, exe), "exe line '%s' (expected %s)", line, exe); break;
    case 'c': CHECK(!strncmp(line + 2, exe_arg0, strlen(exe_arg0)), "command line '%s'", line); break;
    case 'p':
      CHECK(k == 4 && hx(f[1]) == (unsigned long long)getpid() && hx(f[3]) == 3, "pid line '%s'", line);
      break;
    case 's': CHECK(k == 3 && hx(f[1]) > 1600000000ull * 1000000000ull, "start line '%s'", line); break;
    case 'a':
      CHECK(k == 10 && !strcmp(f[9], "0"), "alloc fields '%s' (no stack: stacks are off)", line);
      if (k == 10) {
        CHECK(hx(f[2]) == (unsigned long long)syscall(SYS_gettid), "tid '%s'", line);
        if (na == 0)
          CHECK(!strcmp(f[3], "0") && !strcmp(f[4], "0") && !strcmp(f[5], "-") && hx(f[6]) == 0x7f0000000000ull &&
                    hx(f[7]) == 1000 && hx(f[8]) == 1024, "alloc 0 '%s'", line);
        else
          CHECK(!strcmp(f[3], "1") && !strcmp(f[4], "1") && hx(f[5]) == 0xabc0 && hx(f[7]) == 5 && hx(f[8]) == 512,
                "alloc 1 '%s'", line);
      }
      na++;
      break;
    case 'f':
      CHECK(k == 8, "free fields '%s'", line);
      if (k == 8)
        CHECK(hx(f[3]) == 2 + (unsigned)nf && hx(f[7]) == (nf ? 512u : 1024u), "free %d '%s'", nf, line);
      nf++;
      break;
    case 'o':
      CHECK(k == 8 && hx(f[6]) == 1ull << 40 && hx(f[7]) == CUDA_ERROR_OUT_OF_MEMORY, "failure '%s'", line);
      no++;
      break;
    case 'm':
      CHECK(k == 11 && hx(f[3]) == (unsigned)nm && hx(f[6]) == 2ull << 20 && hx(f[9]) == 0 &&
                hx(f[10]) == 1000u + (unsigned)nm, "vmm '%s'", line);
      if (k == 11 && nm == VS_VMM_SET_ACCESS) CHECK(hx(f[8]) == 3, "set-access flags '%s'", line);
      if (k == 11 && nm == VS_VMM_CREATE) CHECK(hx(f[7]) == 0x55, "create handle '%s'", line);
      nm++;
      break;
    case 'e': ne++; break;
    default: CHECK(0, "unexpected line '%s'", line);
    }
    if (strchr("afom", line[0]) && k > 1) {
      if (hx(f[1]) < last_t) t_monotonic = false;
      last_t = hx(f[1]);
    }
  }
  CHECK(na == 2 && nf == 2 && no == 1 && nm == 7 && ne == 1, "counts a%d f%d o%d m%d e%d", na, nf, no, nm, ne);
  CHECK(t_monotonic, "times never go back");
  free(text);
  run_report(path);
}

/* ------------------------------------------------------------------ rmm records */
static bool rmm_line_ok(const char *line, const char *action, const char *tail) {
  /* <tid>,HH:MM:SS.uuuuuu,<action>,<tail> */
  const char *p = line;
  if (!(*p >= '0' && *p <= '9')) return false;
  while (*p >= '0' && *p <= '9') p++;
  if (*p++ != ',') return false;
  const char *shape = "dd:dd:dd.dddddd,";
  for (const char *s = shape; *s; s++, p++) {
    if (*s == 'd' ? !(*p >= '0' && *p <= '9') : *p != *s) return false;
  }
  size_t al = strlen(action);
  if (strncmp(p, action, al) || p[al] != ',') return false;
  return strcmp(p + al + 1, tail) == 0;
}

static void test_rmm(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/rmm.csv", dir);
  open_trace(path, "rmm");
  CHECK(_vs_trace_on == 1, "tracing on (rmm)");
  CUstream s = (CUstream)(uintptr_t)0x5a5a00;
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 1000, 1024, 0x7f0000000000ull, VS_NO_STREAM, 0);
  _vs_trace_alloc(VMMSHIM_API_RUNTIME_ASYNC, 100, 512, 0x7f0000000400ull, s, 0);
  _vs_trace_vmm(VS_VMM_MAP, 0x7f0000000000ull, 2 << 20, 1, 0, 0, CUDA_SUCCESS, 5); /* not in rmm */
  _vs_trace_free(VMMSHIM_API_RUNTIME, 0x7f0000000000ull, 1024, VS_NO_STREAM, 0);
  _vs_trace_alloc_fail(VMMSHIM_API_RUNTIME_ASYNC, 4096, s, 0, CUDA_ERROR_OUT_OF_MEMORY);
  _vs_trace_close();
  char *text = check_slurp(path, NULL);
  CHECK(text != NULL, "read %s", path);
  if (!text) return;
  char *lines[16];
  int n = 0;
  char *save = NULL;
  for (char *l = strtok_r(text, "\n", &save); l && n < 16; l = strtok_r(NULL, "\n", &save)) lines[n++] = l;
  CHECK(n == 5, "rmm: %d lines", n);
  if (n == 5) {
    CHECK(!strcmp(lines[0], "Thread,Time,Action,Pointer,Size,Stream"), "rmm header '%s'", lines[0]);
    CHECK(rmm_line_ok(lines[1], "allocate", "0x7f0000000000,1024,0x0"), "rmm alloc '%s'", lines[1]);
    CHECK(rmm_line_ok(lines[2], "allocate", "0x7f0000000400,512,0x5a5a00"), "rmm alloc '%s'", lines[2]);
    CHECK(rmm_line_ok(lines[3], "free", "0x7f0000000000,1024,0x0"), "rmm free '%s'", lines[3]);
    CHECK(rmm_line_ok(lines[4], "allocate failure", "0x0,4096,0x5a5a00"), "rmm failure '%s'", lines[4]);
    char tid[32];
    snprintf(tid, sizeof tid, "%ld,", (long)syscall(SYS_gettid));
    CHECK(!strncmp(lines[1], tid, strlen(tid)), "rmm thread is the decimal tid '%s'", lines[1]);
    /* The clock is local wall time: within a few seconds of now. */
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    int h, m, sec;
    if (sscanf(strchr(lines[1], ',') + 1, "%d:%d:%d", &h, &m, &sec) == 3) {
      long diff = labs((long)(h * 3600 + m * 60 + sec) - (long)(tm.tm_hour * 3600 + tm.tm_min * 60 + tm.tm_sec));
      CHECK(diff <= 5 || diff >= 86400 - 5, "rmm time %02d:%02d:%02d is local time", h, m, sec);
    }
  }
  free(text);
  snprintf(path, sizeof path, "%s/rmm.csv", dir);
  run_report(path);
}

/* ------------------------------------------------------------------ bad path */
static int count_allocs(const char *path, bool *in_order, bool *whole);

/* A trace path that cannot be opened: tracing stays off through records, a flush and a close,
 * nothing is made there, and a later good path traces as usual (the failure left no state). */
static void test_unopenable(void) {
  open_trace("/nonexistent-vmmshim-dir/sub/trace", NULL);
  CHECK(_vs_trace_on == 0, "unopenable path: tracing stays off");
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 1, 1, 1, VS_NO_STREAM, 0);
  _vs_trace_free(VMMSHIM_API_RUNTIME, 1, 1, VS_NO_STREAM, 0);
  _vs_trace_flush();
  CHECK(_vs_trace_on == 0, "unopenable path: records turned tracing on");
  _vs_trace_close();
  struct stat st;
  CHECK(stat("/nonexistent-vmmshim-dir", &st) != 0 && errno == ENOENT, "the unopenable path was made");
  char path[512];
  snprintf(path, sizeof path, "%s/after-unopenable.trace", dir);
  open_trace(path, NULL);
  CHECK(_vs_trace_on == 1, "tracing on for a good path after an unopenable one");
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 100, 256, 1, VS_NO_STREAM, 0);
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 100, 256, 2, VS_NO_STREAM, 0);
  _vs_trace_close();
  bool in_order = false, whole = false;
  int n = count_allocs(path, &in_order, &whole);
  CHECK(n == 2 && in_order && whole, "the good path after an unopenable one: %d allocations (want 2), in order %d, whole %d",
        n, in_order, whole);
}

/* ------------------------------------------------------------------ crashes */
/* Counts the complete 'a' records of a native trace; checks they carry pointers 1..n in
 * order (no record lost in the middle) and that the file ends at a line boundary. */
static int count_allocs(const char *path, bool *in_order, bool *whole) {
  size_t len = 0;
  char *text = check_slurp(path, &len);
  if (!text) return -1;
  *whole = len > 0 && text[len - 1] == '\n';
  /* A final line without its newline is a write cut short by a fatal signal (the kernel
   * may stop a write at a page boundary): readers ignore it, and so does this count. */
  if (!*whole) {
    char *last_nl = memrchr(text, '\n', len);
    len = last_nl ? (size_t)(last_nl - text) + 1 : 0;
    text[len] = 0;
  }
  *in_order = true;
  int n = 0;
  char *save = NULL;
  for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (l[0] != 'a') continue;
    char *f[16];
    if (fields(l, f, 16) != 10) { *in_order = false; continue; }
    if (hx(f[6]) != (unsigned long long)(n + 1)) *in_order = false;
    n++;
  }
  free(text);
  return n;
}

enum crash_kind { CRASH_SEGV, CRASH_ABORT, CRASH_CHAINED_TERM };

static void chained_term(int sig) {
  (void)sig;
  _exit(42);
}

static void test_crash(enum crash_kind kind, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/crash-%s.trace", dir, name);
  const int records = 1000; /* ~40 KiB: many flushes, and a tail in the buffer */
  pid_t pid = fork();
  if (pid == 0) {
    if (kind == CRASH_CHAINED_TERM) signal(SIGTERM, chained_term); /* the program's own handler */
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); /* no core files from the deliberate crashes */
    open_trace(path, NULL);
    for (int i = 1; i <= records; i++) _vs_trace_alloc(VMMSHIM_API_RUNTIME, 256, 256, (CUdeviceptr)i, VS_NO_STREAM, 0);
    if (kind == CRASH_SEGV) *(volatile int *)(uintptr_t)16 = 1;
    if (kind == CRASH_ABORT) abort();
    if (kind == CRASH_CHAINED_TERM) kill(getpid(), SIGTERM);
    _exit(99);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (kind == CRASH_SEGV) CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "%s: status %#x", name, status);
  if (kind == CRASH_ABORT) CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s: status %#x", name, status);
  if (kind == CRASH_CHAINED_TERM) CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42, "%s: chained handler ran, status %#x", name, status);
  bool in_order, whole;
  int n = count_allocs(path, &in_order, &whole);
  CHECK(n == records, "%s: %d of %d records in the file", name, n, records);
  CHECK(in_order && whole, "%s: records in order, file ends with a whole line", name);
}

static void test_kill9(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/crash-kill9.trace", dir);
  int pfd[2];
  if (pipe(pfd) != 0) { CHECK(0, "pipe"); return; }
  pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    open_trace(path, NULL);
    for (long i = 1;; i++) {
      _vs_trace_alloc(VMMSHIM_API_RUNTIME, 256, 256, (CUdeviceptr)i, VS_NO_STREAM, 0);
      if (i == 20000) { char c = 1; if (write(pfd[1], &c, 1) != 1) _exit(3); }
    }
  }
  close(pfd[1]);
  char c;
  ssize_t r = read(pfd[0], &c, 1);
  close(pfd[0]);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(r == 1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "kill -9: status %#x", status);
  bool in_order, whole;
  int n = count_allocs(path, &in_order, &whole);
  CHECK(n >= 20000 - 8192 / 20, "kill -9: %d records survive (at least all but one buffer of the first 20000)", n);
  CHECK(in_order, "kill -9: a valid prefix: every whole line a record, in order (last line whole: %d)", whole);
  run_report(path);
}

/* ------------------------------------------------------------------ fork */
static void test_fork(bool per_pid) {
  char tmpl[512], path[512];
  snprintf(tmpl, sizeof tmpl, per_pid ? "%s/fork-%%p.trace" : "%s/fork-shared.trace", dir);
  open_trace(tmpl, NULL);
  snprintf(path, sizeof path, per_pid ? "%s/fork-%d.trace" : "%s/fork-shared.trace", dir, (int)getpid());
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 256, 256, 1, VS_NO_STREAM, 0); /* stays in the buffer over the fork */
  pid_t pid = fork();
  if (pid == 0) {
    int on = _vs_trace_on;
    for (int i = 0; i < 300; i++) _vs_trace_alloc(VMMSHIM_API_RUNTIME, 256, 256, 0x1000 + (CUdeviceptr)i, VS_NO_STREAM, 0);
    _vs_trace_close();
    _exit(on == (per_pid ? 1 : 0) ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork(%s): child tracing state right", per_pid ? "%p" : "shared");
  _vs_trace_alloc(VMMSHIM_API_RUNTIME, 256, 256, 2, VS_NO_STREAM, 0);
  _vs_trace_close();
  bool in_order, whole;
  int n = count_allocs(path, &in_order, &whole);
  CHECK(n == 2 && in_order && whole, "fork(%s): the parent's file holds the parent's 2 records only (found %d)",
        per_pid ? "%p" : "shared", n);
  char child_path[512];
  snprintf(child_path, sizeof child_path, "%s/fork-%d.trace", dir, (int)pid);
  if (per_pid) {
    size_t len = 0;
    char *text = check_slurp(child_path, &len);
    CHECK(text != NULL, "fork(%%p): the child wrote its own file %s", child_path);
    if (text) {
      int a = 0;
      for (char *l = text; (l = strstr(l, "\na ")) != NULL; l++) a++;
      char pidline[64];
      snprintf(pidline, sizeof pidline, "\np %x %x ", (unsigned)pid, (unsigned)getpid());
      CHECK(a == 300 && strstr(text, pidline) != NULL && !strncmp(text, "v 4 ", 4),
            "fork(%%p): child file has a header with its pid and parent, and its 300 records (found %d)", a);
      free(text);
    }
  } else {
    CHECK(access(child_path, F_OK) != 0, "fork(shared): no file for the child");
  }
}


/* ------------------------------------------------------------------ threads */
/* Threads that write at once through the shared ring: every record reaches the file once,
 * each thread's records in the order it wrote them, times never going back within a
 * thread; a free record written before the allocation that reuses its pointer (another
 * thread, ordered by a handoff) precedes it in the file. */
enum { TH_THREADS = 6, TH_RECORDS = 20000 };
static atomic_uint_least64_t th_handoff; /* pointer freed by one thread, for the next alloc */

static void *th_writer(void *arg) {
  uint64_t id = (uint64_t)(uintptr_t)arg;
  for (uint64_t i = 1; i <= TH_RECORDS; i++) {
    CUdeviceptr p = (CUdeviceptr)((id << 32) | i);
    _vs_trace_alloc(VMMSHIM_API_RUNTIME, 256, 256, p, VS_NO_STREAM, 0);
    if (i % 100 == 0) {
      /* Hand a freed pointer over: the free record is written before the handoff. */
      CUdeviceptr shared = (CUdeviceptr)(0xf00000000000ull | (id << 24) | i);
      _vs_trace_alloc(VMMSHIM_API_RUNTIME, 64, 64, shared, VS_NO_STREAM, 0);
      _vs_trace_free(VMMSHIM_API_RUNTIME, shared, 64, VS_NO_STREAM, 0);
      atomic_store(&th_handoff, shared);
    } else if (i % 100 == 50) {
      uint64_t got = atomic_exchange(&th_handoff, 0);
      if (got) _vs_trace_alloc(VMMSHIM_API_RUNTIME, 64, 64, (CUdeviceptr)got, VS_NO_STREAM, 1);
    }
  }
  return NULL;
}

static void test_threads(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/threads.trace", dir);
  open_trace(path, NULL);
  pthread_t th[TH_THREADS];
  for (int i = 0; i < TH_THREADS; i++) pthread_create(&th[i], NULL, th_writer, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < TH_THREADS; i++) pthread_join(th[i], NULL);
  _vs_trace_close();
  size_t len = 0;
  char *text = check_slurp(path, &len);
  CHECK(text != NULL, "threads: trace written");
  if (!text) return;
  uint64_t next[TH_THREADS + 1] = {0}, last_t[TH_THREADS + 1] = {0};
  unsigned long long tid_of[TH_THREADS + 1] = {0};
  int plain = 0, order_bad = 0, time_bad = 0, tid_bad = 0, reuse_bad = 0, reused = 0, ended = 0;
  /* Pointers handed over: state 1 after its free record, 2 after the reusing alloc. */
  static unsigned char state[TH_THREADS + 1][TH_RECORDS + 1];
  memset(state, 0, sizeof state);
  char *save = NULL;
  for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (l[0] == 'e') ended++;
    if (l[0] != 'a' && l[0] != 'f') continue;
    char *f[12];
    int n = fields(l, f, 12);
    if (n < 8) continue;
    unsigned long long t = hx(f[1]), tid = hx(f[2]), ptr = hx(f[6]);
    if ((ptr >> 44) == 0xf) {
      uint64_t id = (ptr >> 24) & 0xfffff, i = ptr & 0xffffff;
      if (id < 1 || id > TH_THREADS || i > TH_RECORDS) continue;
      if (l[0] == 'f') state[id][i] = 1;
      else if (!strcmp(f[4], "1")) { /* the reuse runs on device field 1 */
        reused++;
        if (state[id][i] != 1) reuse_bad++;
        state[id][i] = 2;
      }
      continue;
    }
    uint64_t id = ptr >> 32, i = ptr & 0xffffffffu;
    if (id < 1 || id > TH_THREADS) continue;
    plain++;
    if (i != next[id] + 1) order_bad++;
    next[id] = i;
    if (t < last_t[id]) time_bad++;
    last_t[id] = t;
    if (!tid_of[id]) tid_of[id] = tid;
    else if (tid_of[id] != tid) tid_bad++;
  }
  CHECK(plain == TH_THREADS * TH_RECORDS, "threads: %d of %d records in the file", plain, TH_THREADS * TH_RECORDS);
  CHECK(order_bad == 0 && tid_bad == 0, "threads: each thread's records in order (%d out of order, %d wrong tid)",
        order_bad, tid_bad);
  CHECK(time_bad == 0, "threads: times never go back within a thread (%d did)", time_bad);
  CHECK(reused > 0 && reuse_bad == 0, "threads: %d handed-over pointers, %d reused before their free record",
        reused, reuse_bad);
  CHECK(ended == 1, "threads: one end record");
  free(text);
}

int main(int argc, char **argv) {
  (void)argc;
  exe_arg0 = argv[0];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[k > 0 ? k : 0] = '\0';
  setvbuf(stdout, NULL, _IOLBF, 0);
  snprintf(dir, sizeof dir, "%s/vmmshim-trace-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  test_native();
  test_rmm();
  test_unopenable();
  test_crash(CRASH_SEGV, "segv");
  test_crash(CRASH_ABORT, "abort");
  test_crash(CRASH_CHAINED_TERM, "term-chained");
  test_kill9();
  test_threads();
  test_fork(false);
  test_fork(true);
  if (check_failed == 0) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
  } else {
    printf("traces kept in %s\n", dir);
  }
  return check_summary();
}
