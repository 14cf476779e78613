/* check.h: the tiny harness of the CPU tests.
 *
 *   CHECK(cond, fmt, ...)  counts a pass, or prints "FAIL file:line: cond: message" and
 *                          counts a failure; the test goes on either way.
 *   check_summary()        prints "N passed, N failed" and returns the exit code (0 when
 *                          nothing failed); end main() with `return check_summary();`.
 *
 * Helpers for programs that run a scenario in a child process with its own environment
 * (the shim reads its options once per process):
 *   check_child_main(argc, argv) returns the scenario name in a child, NULL in the parent;
 *   check_run_child(name, env...) re-executes this program with argv[1] = name and the
 *   given "NAME=value" settings added to the environment (the runner's LD_PRELOAD and
 *   LD_LIBRARY_PATH are inherited), echoes its output, and adds the counts of its
 *   closing "name: N passed, N failed" line to this process's counts; a crash, a
 *   non-zero exit with no failure counted, or a missing line counts as a failure.
 *   check_child_summary(name) closes a child: prints "name: N passed, N failed". */
#ifndef VMMSHIM_TEST_CHECK_H
#define VMMSHIM_TEST_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int check_passed, check_failed;
/* Everything the last check_run_child printed (stdout and stderr), for strstr. */
static char check_child_output[1 << 16];

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (cond) {                                                            \
      check_passed++;                                                      \
    } else {                                                               \
      check_failed++;                                                      \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
      printf(__VA_ARGS__);                                                 \
      printf("\n");                                                        \
      fflush(stdout);                                                      \
    }                                                                      \
  } while (0)

/* A check whose condition says it all: the failure line shows the condition alone. */
#define CHECK_COND(cond) CHECK(cond, "%s", "")

/* How many times needle occurs in hay, without overlaps. */
static inline int check_count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

static inline int check_summary(void) {
  printf("%d passed, %d failed\n", check_passed, check_failed);
  fflush(stdout);
  return check_failed ? 1 : 0;
}

static inline int check_child_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
  fflush(stdout);
  return check_failed ? 1 : 0;
}

static inline const char *check_child_main(int argc, char **argv) {
  return argc > 1 ? argv[1] : NULL;
}

/* Runs this program again as scenario `name` with extra settings (NULL-terminated list of
 * "NAME=value"); returns the child's exit status (or -1). */
static inline int check_run_child(const char *name, ...) {
  int fds[2];
  if (pipe(fds) != 0) {
    CHECK(0, "pipe failed");
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    CHECK(0, "fork failed");
    return -1;
  }
  if (pid == 0) {
    va_list ap;
    va_start(ap, name);
    for (const char *kv = va_arg(ap, const char *); kv; kv = va_arg(ap, const char *)) putenv((char *)kv);
    va_end(ap);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    char *args[] = {(char *)"child", (char *)name, NULL};
    extern char **environ;
    execve("/proc/self/exe", args, environ);
    _exit(127);
  }
  close(fds[1]);
  FILE *in = fdopen(fds[0], "r");
  char line[1024];
  int p = -1, f = -1;
  size_t nlen = strlen(name), used = 0;
  check_child_output[0] = 0;
  while (in && fgets(line, sizeof line, in)) {
    fputs(line, stdout);
    size_t ln = strlen(line);
    if (used + ln < sizeof check_child_output) {
      memcpy(check_child_output + used, line, ln + 1);
      used += ln;
    }
    int a, b;
    if (!strncmp(line, name, nlen) && line[nlen] == ':' &&
        sscanf(line + nlen + 1, " %d passed, %d failed", &a, &b) == 2) {
      p = a;
      f = b;
    }
  }
  if (in) fclose(in);
  fflush(stdout);
  int status = 0;
  waitpid(pid, &status, 0);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (p < 0) {
    check_failed++;
    printf("FAIL %s:%d: scenario %s printed no summary (exit status %d)\n", __FILE__, __LINE__, name, rc);
  } else {
    check_passed += p;
    check_failed += f;
    if (rc != 0 && f == 0) {
      check_failed++;
      printf("FAIL %s:%d: scenario %s exited with %d\n", __FILE__, __LINE__, name, rc);
    }
  }
  fflush(stdout);
  return rc;
}


/* ---- for unit tests that drive src/ directly on the host emulation (define
 * CHECK_UNIT_HELPERS before including; needs vmmshim/internal.h): the primary context of
 * device 0 made current, the driver entry points resolved, the device's caps; a pool on it. ---- */
#ifdef CHECK_UNIT_HELPERS
static inline CUcontext check_unit_context(vs_device_caps_t *caps) {
  CUcontext ctx = NULL;
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS && ctx, "retain");
  CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "set current");
  CHECK(_vs_cuda_resolve() == 0, "_vs_cuda_resolve");
  CHECK(_vs_vmm_query(0, caps) == CUDA_SUCCESS, "query");
  return ctx;
}

/* A pool of device 0 in that context, the device given 16 GiB (granularity 64 MiB); NULL,
 * counted as a failure, when it cannot be made. Needs emu.h. */
static inline vs_pool_t *check_unit_pool(void) {
  vs_device_caps_t caps;
  CUcontext ctx = check_unit_context(&caps);
  emu_set_device_memory(0, 16ull << 30);
  vs_pool_t *pool = _vs_pool_create(ctx, &caps, _vs_peer_state(ctx, (int)caps.device));
  CHECK(pool != NULL, "pool");
  return pool;
}
#endif

/* ---- helpers for programs that run under the shim (define CHECK_SHIM_HELPERS before
 * including; needs emu.h and vmmshim.h) ---- */
#ifdef CHECK_SHIM_HELPERS
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>

/* The shim's counters, found at run time as a program would find them. */
static inline vmmshim_stats_t shim_stats(void) {
  static int (*fn)(vmmshim_stats_t *, size_t);
  vmmshim_stats_t s;
  memset(&s, 0, sizeof s);
  if (!fn) *(void **)&fn = dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  if (!fn || fn(&s, sizeof s) != 0) {
    static int said;
    if (!said++) CHECK(0, "vmmshim_get_stats not found or failed (is the shim preloaded?)");
  }
  return s;
}

static inline size_t shim_trim(void) {
  size_t (*fn)(void) = NULL;
  *(void **)&fn = dlsym(RTLD_DEFAULT, "vmmshim_trim");
  return fn ? fn() : 0;
}

static inline int shim_active(void) {
  int (*fn)(void) = NULL;
  *(void **)&fn = dlsym(RTLD_DEFAULT, "vmmshim_active");
  return fn ? fn() : -1;
}

static inline emu_counters_t emu_now(void) {
  emu_counters_t c;
  emu_get_counters(&c);
  return c;
}

/* The counters of tag name (all zero when the shim has no such tag); the program declares
 * vmmshim_tag_stats weak when it may run without the shim. */
static inline vmmshim_tag_stats_t shim_tag_stats(const char *name) {
  vmmshim_tag_stats_t all[VMMSHIM_MAX_TAGS], none;
  memset(&none, 0, sizeof none);
  int n = vmmshim_tag_stats(all, VMMSHIM_MAX_TAGS, sizeof all[0]);
  for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++)
    if (!strcmp(all[i].name, name)) return all[i];
  return none;
}

/* Sum of the VMM calls that change mappings (what a steady state must not make). */
static inline unsigned long long emu_vmm_calls(const emu_counters_t *c) {
  return c->n_cuMemCreate + c->n_cuMemMap + c->n_cuMemSetAccess + c->n_cuMemUnmap + c->n_cuMemRelease +
         c->n_cuMemAddressReserve + c->n_cuMemAddressFree;
}

/* The file a code address lies in ("" when unknown). */
static inline const char *lib_of(const void *fn) {
  Dl_info di;
  if (!fn || !dladdr(fn, &di) || !di.dli_fname) return "";
  return di.dli_fname;
}
static inline int in_shim(const void *fn) { return strstr(lib_of(fn), "libvmmshim") != NULL; }
static inline int in_libcuda(const void *fn) { return strstr(lib_of(fn), "libcuda.so") != NULL; }

/* A connection to the control channel of process pid of user uid (its abstract socket
 * "vmmshim-ctl-UID-PID"), with a 10 s receive timeout; -1 when none. */
static inline int ctl_connect(pid_t pid, uid_t uid) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "vmmshim-ctl-%u-%d", (unsigned)uid, (int)pid);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  struct timeval tmo = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo);
  return fd;
}

/* cudaMalloc that must succeed (a failure is counted, and NULL returned). */
static inline void *must_malloc(size_t n) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, n);
  CHECK(e == cudaSuccess && p, "cudaMalloc(%zu): %s", n, cudaGetErrorName(e));
  return p;
}
#endif

/* Whether [a, a+an) and [b, b+bn) share a byte. */
static inline int overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

/* Byte patterns: byte i of a block with seed s. */
static inline unsigned char pat_byte(unsigned long long seed, size_t i) {
  unsigned long long x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i >> 3) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (unsigned char)(x >> (8 * (i & 7)));
}
static inline void pat_fill(void *p, size_t n, unsigned long long seed) {
  unsigned char *c = (unsigned char *)p;
  for (size_t i = 0; i < n; i++) c[i] = pat_byte(seed, i);
}
/* Returns the offset of the first wrong byte, or (size_t)-1. */
static inline size_t pat_check(const void *p, size_t n, unsigned long long seed) {
  const unsigned char *c = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != pat_byte(seed, i)) return i;
  return (size_t)-1;
}
/* Sparse versions for big blocks: every byte of the first and last 4 KiB, and 8 bytes
 * of every 4 KiB page in between. */
static inline void pat_fill_sparse(void *p, size_t n, unsigned long long seed) {
  unsigned char *c = (unsigned char *)p;
  if (n <= 8192) { pat_fill(p, n, seed); return; }
  for (size_t i = 0; i < 4096; i++) c[i] = pat_byte(seed, i);
  for (size_t i = n - 4096; i < n; i++) c[i] = pat_byte(seed, i);
  for (size_t pg = 4096; pg + 8 <= n - 4096; pg += 4096)
    for (size_t i = pg; i < pg + 8; i++) c[i] = pat_byte(seed, i);
}
static inline size_t pat_check_sparse(const void *p, size_t n, unsigned long long seed) {
  const unsigned char *c = (const unsigned char *)p;
  if (n <= 8192) return pat_check(p, n, seed);
  for (size_t i = 0; i < 4096; i++) if (c[i] != pat_byte(seed, i)) return i;
  for (size_t i = n - 4096; i < n; i++) if (c[i] != pat_byte(seed, i)) return i;
  for (size_t pg = 4096; pg + 8 <= n - 4096; pg += 4096)
    for (size_t i = pg; i < pg + 8; i++) if (c[i] != pat_byte(seed, i)) return i;
  return (size_t)-1;
}

/* xorshift64* */
static inline unsigned long long rnd_next(unsigned long long *s) {
  unsigned long long x = *s;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}
/* Log-uniform size in [1, max]. */
static inline size_t rnd_size(unsigned long long *s, size_t max) {
  int bits = 0;
  while ((1ull << bits) < max) bits++;
  size_t hi = (size_t)1 << (rnd_next(s) % (unsigned)(bits + 1));
  size_t v = hi / 2 + (size_t)(rnd_next(s) % (hi / 2 + 1)) + (hi == 1);
  if (v < 1) v = 1;
  return v > max ? max : v;
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The file at path, NUL-terminated in buf (at most cap - 1 bytes); NULL (and buf empty) when
 * it cannot be opened. */
static inline char *check_read_file(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* The whole file at path in malloc'd memory (free it), NUL-terminated, its length in *len when
 * len is not NULL; NULL when it cannot be opened or read into memory. */
static inline char *check_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0, r;
  char *buf = malloc(cap + 1);
  while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *w = realloc(buf, (cap *= 2) + 1);
      if (!w) free(buf);
      buf = w;
    }
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

#endif
