/* test_shim_group: one memory budget for a group of processes (src/handle/group.c), what an
 * allocation does at the limit (src/alloc/limit.c) and the client (vmmshim ctl --group), on the
 * emulation, with several processes.
 *
 * Each scenario runs in a process of its own; the members are "agents": this program executed
 * again under the shim (a fresh process with its own emulated device of 64 GiB, so the group's
 * budget is what limits them), which do what the scenario asks over a pair of pipes (allocate,
 * free, mark and check bytes, read cudaMemGetInfo, promote) and answer with the results. The
 * scenario reads the group's segment itself (include/vmmshim/group.h), under the segment's lock
 * where it needs a consistent view. Group names carry the test's pid: runs side by side do not
 * meet. Messages of the shim are read from log files (VMMSHIM_LOG=warn:FILE).
 *
 *   four       4 members under an 8 GiB budget: driven one step at a time with random sizes, the
 *              segment is read after every step (total <= 8 GiB, the totals the sums of the
 *              members, each member's count what its shim maps); then all four race, allocating
 *              random sizes at once until refused, while a reader checks the total; every refusal
 *              is a clean cudaErrorMemoryAllocation the budget explains (total + the growth >
 *              limit); the out-of-memory report names the group; clean exits leave the group empty.
 *   kill       a member killed with SIGKILL: its 6 GiB go back at the next admission that needs
 *              them; a slot whose pid is alive but started at another time (a recycled pid) is
 *              returned too; a live member's slot is not.
 *   sequential members started one after another reuse the segment (same inode, counts right);
 *              an unconfigured member keeps the group's limit; with no member left a member's
 *              VMMSHIM_LIMIT is taken; a limit set by vmmshim ctl is kept (and the member says so).
 *   user       (as root) a member running as another user gets its own segment, owned by it; one
 *              that finds a segment of its name owned by someone else (0666, with a limit in it
 *              or none) refuses it at once, without waiting for its lock even while that user
 *              holds it, says why, and every device allocation fails: it never runs uncapped; the
 *              client run as that user refuses it too, at once. Not root: not runnable (a failure
 *              when CI=true).
 *   locked     a segment of this user whose lock a process keeps (a member stopped in a change):
 *              the join gives up after the bound with the message, the process's allocations
 *              fail (it neither hangs nor runs uncapped); the client gives up too (exit 1); once
 *              the lock is let go, the next process joins.
 *   hopeless   VMMSHIM_ON_LIMIT=wait that could never end fails at once, with the reason: a
 *              request larger than the group's limit itself, or larger than what is left with no
 *              group and no other thread of the program that allocated or freed (a helper thread
 *              that never does, like the driver's, does not count); with another thread that
 *              allocated and frees, the same wait waits and proceeds; once that thread has
 *              exited, the wait fails at once again.
 *   live       the client lowers the limit below what a member holds: its next growth is refused,
 *              its bytes stay, cudaMemGetInfo says 0 free (never below zero); raised: it grows
 *              again; status lists the member and its share; bad arguments are refused.
 *   wait       VMMSHIM_ON_LIMIT=wait: the allocation blocks, without spinning, until another
 *              member frees (woken by the release), then proceeds; it says at the default log
 *              level what it waits for (bytes, limit, group); wait:1 times out as fail does.
 *   host       VMMSHIM_ON_LIMIT=host: growths past the limit are served from host memory at the
 *              device addresses (data intact, pointer queries say device, the tag's host_mapped);
 *              promote without room keeps them there; with the limit raised moves them back at
 *              the same addresses, bytes intact; host:SIZE caps them.
 *   corrupt    a segment with a bad checksum, of another version, or not a segment at all: refused
 *              with the message, untouched, and every device allocation of the process fails.
 *   scattered  two devices under one group budget: idle memory in device 1's pool is given back
 *              before device 0's allocation fails; when it still fails, the report says how much
 *              was scattered.
 *   perdevice  VMMSHIM_LIMIT=0:256M,1:512M without a group: each device capped on its own,
 *              cudaMemGetInfo's total is the device's cap. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#include "vmmshim/group.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

#pragma weak vmmshim_promote
#pragma weak vmmshim_tag_stats

/* ------------------------------------------------------------------ the segment, from outside */

static char g_group[64];
static char g_path[128];

static void group_name(const char *what) {
  snprintf(g_group, sizeof g_group, "t%d-%s", (int)getppid(), what);
  snprintf(g_path, sizeof g_path, "/dev/shm/vmmshim-%u-%s", (unsigned)geteuid(), g_group);
}

static char g_env_group[96];
static const char *env_group(void) {
  snprintf(g_env_group, sizeof g_env_group, "VMMSHIM_LIMIT_GROUP=%s", g_group);
  return g_env_group;
}

typedef struct seg_s {
  int fd;
  vs_group_header_t *h;
} seg_t;

static seg_t seg_open(const char *path) {
  seg_t s = {open(path, O_RDWR | O_CLOEXEC), NULL};
  if (s.fd >= 0) {
    void *m = mmap(NULL, VS_GROUP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
    s.h = m == MAP_FAILED ? NULL : m;
  }
  return s;
}

static void seg_close(seg_t *s) {
  if (s->h) munmap(s->h, VS_GROUP_SIZE);
  if (s->fd >= 0) close(s->fd);
  s->h = NULL;
  s->fd = -1;
}

static void seg_lock(seg_t *s) { flock(s->fd, LOCK_EX); }
static void seg_unlock(seg_t *s) { flock(s->fd, LOCK_UN); }
static uint64_t ld64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* The member slot of pid, or NULL. */
static vs_group_member_t *seg_member(seg_t *s, pid_t pid) {
  vs_group_member_t *m = vs_group_members(s->h);
  for (int i = 0; i < VS_GROUP_MEMBERS; i++)
    if (m[i].pid == (uint32_t)pid) return &m[i];
  return NULL;
}

/* Under the lock: the totals are the sums of the member slots. */
static int seg_consistent(seg_t *s) {
  uint64_t all = 0, dev0 = 0;
  uint32_t n = 0;
  vs_group_member_t *m = vs_group_members(s->h);
  for (int i = 0; i < VS_GROUP_MEMBERS; i++)
    if (m[i].pid) {
      n++;
      all += m[i].mapped_all;
      dev0 += m[i].mapped[0];
    }
  return all == s->h->total_all && dev0 == s->h->total[0] && n == s->h->members && s->h->busy == 0;
}

static uint32_t crc32_of(const void *data, size_t n) {
  const unsigned char *p = data;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

/* Start time of a process (field 22 of /proc/PID/stat). */
static uint64_t start_of(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!check_read_file(path, buf, sizeof buf)) return 0;
  char *p = strrchr(buf, ')');
  unsigned long long v = 0;
  for (int field = 2; p && *p; field++) {
    p = strchr(p + 1, ' ');
    if (p && field + 1 == 22) {
      sscanf(p + 1, "%llu", &v);
      break;
    }
  }
  return v;
}

/* CPU time (utime + stime, clock ticks) of a process. */
static unsigned long long cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (!check_read_file(path, buf, sizeof buf)) return 0;
  char *p = strrchr(buf, ')');
  unsigned long long ut = 0, st = 0;
  for (int field = 2; p && *p; field++) {
    p = strchr(p + 1, ' ');
    if (p && field + 1 == 14) sscanf(p + 1, "%llu %llu", &ut, &st);
  }
  return ut + st;
}

/* ------------------------------------------------------------------ agents */

typedef struct msg_s {
  int32_t op, res;
  uint64_t a, b, c, d;
} msg_t;

enum {
  A_READY = 1, /* at start: a = pid */
  A_MALLOC,    /* a bytes -> res error, a pointer, b ns taken */
  A_FREE,      /* a -> res */
  A_MARK,      /* a, b, c: marks [a, a+b) with seed c */
  A_MARKED,    /* a, b, c: res 1 when the marks are there */
  A_INFO,      /* -> a free, b total (cudaMemGetInfo), res its error */
  A_MAPPED,    /* -> a the shim's bytes_mapped, b violations */
  A_PROMOTE,   /* -> res vmmshim_promote, a restored, b skipped, c released */
  A_TAG,       /* -> a host_mapped, b device, c asleep (tag "untagged") */
  A_KIND,      /* a -> res emu_host_mapped, b cudaPointerGetAttributes type */
  A_RACE,      /* a seed, b largest -> random sizes until refused: res last error, a count, b last size,
                  c bytes served, d bytes_mapped */
  A_FREE_ALL,  /* frees what A_MALLOC and A_RACE allocated, then trims: res failures */
  A_TRIM,      /* -> a vmmshim_trim's bytes */
  A_HOST_USED, /* -> a emu_host_used */
  A_FREE_LATER, /* a, b: a thread of the agent allocates a bytes (answered once it has: a the
                   pointer, res the error), then frees them after b ms */
  A_JOIN_LATER, /* waits until A_FREE_LATER's thread has exited */
  A_IDLE,       /* starts a thread that never allocates nor frees (like the driver's helpers) */
  A_EXIT
};

static int msg_send(int fd, const msg_t *m) {
  const char *p = (const char *)m;
  size_t off = 0;
  while (off < sizeof *m) {
    ssize_t w = write(fd, p + off, sizeof *m - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    off += (size_t)w;
  }
  return 0;
}

/* -1 on end of file or after timeout_ms (-1: 60 s). */
static int msg_recv_within(int fd, msg_t *m, int timeout_ms) {
  char *p = (char *)m;
  size_t off = 0;
  while (off < sizeof *m) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, timeout_ms < 0 ? 60000 : timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t n = read(fd, p + off, sizeof *m - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  return 0;
}

typedef struct agent_s {
  pid_t pid;
  int to, from;
  int dead;
  char log[128];
} agent_t;

/* Starts an agent with the extra "NAME=value" settings (NULL-terminated); its shim logs to
 * ag.log. */
static agent_t agent_start(const char *env0, ...) {
  agent_t ag = {-1, -1, -1, 0, ""};
  static int n;
  snprintf(ag.log, sizeof ag.log, "/tmp/vmmshim-group-test-%d-%d.log", (int)getpid(), n++);
  unlink(ag.log);
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) {
    CHECK(0, "pipe");
    ag.dead = 1;
    return ag;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    va_list ap;
    va_start(ap, env0);
    for (const char *kv = env0; kv; kv = va_arg(ap, const char *)) putenv((char *)kv);
    va_end(ap);
    static char fds[64], logenv[200];
    snprintf(fds, sizeof fds, "AGENT_FDS=%d,%d", down[0], up[1]);
    snprintf(logenv, sizeof logenv, "VMMSHIM_LOG=warn:%s", ag.log);
    putenv(fds);
    putenv(logenv);
    close(down[1]);
    close(up[0]);
    char *args[] = {(char *)"agent", (char *)"agent", NULL};
    extern char **environ;
    execve("/proc/self/exe", args, environ);
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  ag.pid = pid;
  ag.to = down[1];
  ag.from = up[0];
  msg_t m;
  if (pid < 0 || msg_recv_within(ag.from, &m, -1) != 0 || m.op != A_READY) {
    CHECK(0, "the agent did not start");
    ag.dead = 1;
  }
  return ag;
}

static int ask_send(agent_t *ag, int op, uint64_t a, uint64_t b, uint64_t c) {
  msg_t m = {op, 0, a, b, c, 0};
  if (ag->dead) return -1;
  if (msg_send(ag->to, &m) != 0) {
    CHECK(0, "agent %d: cannot send request %d", (int)ag->pid, op);
    ag->dead = 1;
    return -1;
  }
  return 0;
}

static msg_t ask_reply(agent_t *ag, int op) {
  msg_t m = {0, 0, 0, 0, 0, 0};
  if (ag->dead) return m;
  if (msg_recv_within(ag->from, &m, -1) != 0) {
    CHECK(0, "agent %d: no answer to request %d", (int)ag->pid, op);
    ag->dead = 1;
    return (msg_t){0, 0, 0, 0, 0, 0};
  }
  return m;
}

static msg_t ask(agent_t *ag, int op, uint64_t a, uint64_t b, uint64_t c) {
  if (ask_send(ag, op, a, b, c) != 0) return (msg_t){0, 0, 0, 0, 0, 0};
  return ask_reply(ag, op);
}

static void agent_end(agent_t *ag) {
  int hung = ag->dead;
  if (!ag->dead) ask(ag, A_EXIT, 0, 0, 0);
  close(ag->to);
  close(ag->from);
  int st = 0;
  if (hung && ag->pid > 0) kill(ag->pid, SIGKILL);
  if (ag->pid > 0 && waitpid(ag->pid, &st, 0) == ag->pid && !hung)
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "agent %d ended with status 0x%x", (int)ag->pid, st);
  ag->pid = -1;
  unlink(ag->log);
}

static void agent_kill(agent_t *ag) {
  kill(ag->pid, SIGKILL);
  int st = 0;
  waitpid(ag->pid, &st, 0);
  close(ag->to);
  close(ag->from);
  ag->pid = -1;
  ag->dead = 1;
  unlink(ag->log);
}

static const char *agent_log(const agent_t *ag) {
  static char buf[1 << 16];
  check_read_file(ag->log, buf, sizeof buf);
  return buf;
}

/* Marks a few places of a block (the first and last bytes, every 16 MiB): enough to see that the
 * bytes stayed, without touching every page of gigabytes of emulated memory. */
static void mark(unsigned char *p, size_t n, unsigned long long seed) {
  for (size_t off = 0; off < n; off += 16 * MiB) pat_fill(p + off, n - off < 64 ? n - off : 64, seed + off);
  if (n >= 64) pat_fill(p + n - 64, 64, seed + n);
}

static int marked(const unsigned char *p, size_t n, unsigned long long seed) {
  for (size_t off = 0; off < n; off += 16 * MiB) {
    size_t len = n - off < 64 ? n - off : 64;
    if (pat_check(p + off, len, seed + off) != (size_t)-1) return 0;
  }
  return n < 64 || pat_check(p + n - 64, 64, seed + n) == (size_t)-1;
}

#define MAX_HELD 4096
static void *g_held[MAX_HELD];
static int g_nheld;

/* A_FREE_LATER's thread: a second thread of the program that allocates, so a wait for memory
 * counts on it, and frees after a while. */
typedef struct later_s {
  uint64_t bytes, ms;
  void *p;
  cudaError_t res;
  pthread_t t;
  int running;
  atomic_int allocated;
} later_t;
static later_t g_later;

static void *free_later(void *arg) {
  later_t *l = arg;
  l->res = cudaMalloc(&l->p, l->bytes);
  atomic_store(&l->allocated, 1);
  sleep_ms((int)l->ms);
  if (l->res == cudaSuccess) cudaFree(l->p);
  return NULL;
}

/* An unnamed-by-CUDA thread that never calls the shim: what the real driver and runtime start. */
static void *idle_thread(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static void agent_threads(msg_t *r) {
  if (r->op == A_FREE_LATER) {
    later_t *l = &g_later;
    l->bytes = r->a;
    l->ms = r->b;
    atomic_store(&l->allocated, 0);
    r->res = pthread_create(&l->t, NULL, free_later, l);
    l->running = r->res == 0;
    while (l->running && !atomic_load(&l->allocated)) sleep_ms(1);
    if (l->running) r->res = (int32_t)l->res;
    r->a = (uint64_t)(uintptr_t)l->p;
  } else if (r->op == A_JOIN_LATER) {
    r->res = g_later.running ? pthread_join(g_later.t, NULL) : -1;
    g_later.running = 0;
  } else {
    pthread_t t;
    r->res = pthread_create(&t, NULL, idle_thread, NULL);
    if (!r->res) pthread_setname_np(t, "helper");
    if (!r->res) pthread_detach(t);
  }
}

static int agent_main(void) {
  const char *fds = getenv("AGENT_FDS");
  int in = -1, out = -1;
  if (!fds || sscanf(fds, "%d,%d", &in, &out) != 2) return 2;
  const char *uid = getenv("AGENT_SETUID");
  if (uid && setuid((uid_t)atoi(uid)) != 0) {
    printf("agent: setuid(%s): %s\n", uid, strerror(errno));
    return 3;
  }
  emu_set_device_memory(0, 64 * GiB);
  emu_set_host_memory(16 * GiB);
  msg_t m = {A_READY, 0, (uint64_t)getpid(), 0, 0, 0};
  cudaSetDevice(0);
  msg_send(out, &m);
  while (msg_recv_within(in, &m, 600000) == 0) {
    msg_t r = m;
    r.res = 0;
    void *p = (void *)(uintptr_t)m.a;
    switch (m.op) {
    case A_MALLOC: {
      void *q = NULL;
      double t0 = now_s();
      r.res = (int32_t)cudaMalloc(&q, m.a);
      r.b = (uint64_t)((now_s() - t0) * 1e9);
      r.a = (uint64_t)(uintptr_t)q;
      if (r.res == cudaSuccess && g_nheld < MAX_HELD) g_held[g_nheld++] = q;
      cudaGetLastError();
      break;
    }
    case A_FREE:
      r.res = (int32_t)cudaFree(p);
      for (int i = 0; i < g_nheld; i++)
        if (g_held[i] == p) g_held[i--] = g_held[--g_nheld];
      break;
    case A_MARK: mark(p, m.b, m.c); break;
    case A_MARKED: r.res = marked(p, m.b, m.c); break;
    case A_INFO: {
      size_t f = 0, t = 0;
      r.res = (int32_t)cudaMemGetInfo(&f, &t);
      r.a = f;
      r.b = t;
      break;
    }
    case A_MAPPED: {
      vmmshim_stats_t st = shim_stats();
      r.a = st.bytes_mapped;
      r.b = (uint64_t)emu_violations();
      break;
    }
    case A_PROMOTE: {
      vmmshim_sleep_result_t res;
      memset(&res, 0, sizeof res);
      r.res = vmmshim_promote ? vmmshim_promote(&res, sizeof res) : -999;
      r.a = res.restored;
      r.b = res.skipped;
      r.c = res.released;
      break;
    }
    case A_TAG: {
      vmmshim_tag_stats_t ts[VMMSHIM_MAX_TAGS];
      int n = vmmshim_tag_stats ? vmmshim_tag_stats(ts, VMMSHIM_MAX_TAGS, sizeof ts[0]) : 0;
      for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++)
        if (!strcmp(ts[i].name, "untagged")) {
          r.a = ts[i].host_mapped;
          r.b = ts[i].device;
          r.c = (uint64_t)ts[i].asleep;
        }
      break;
    }
    case A_KIND: {
      r.res = emu_host_mapped(m.a);
      struct cudaPointerAttributes at;
      memset(&at, 0, sizeof at);
      r.b = cudaPointerGetAttributes(&at, p) == cudaSuccess ? (uint64_t)at.type : 99;
      break;
    }
    case A_RACE: {
      unsigned long long seed = m.a;
      size_t largest = m.b;
      r.a = 0;
      r.c = 0;
      for (;;) {
        size_t n = rnd_size(&seed, largest);
        void *q = NULL;
        cudaError_t e = cudaMalloc(&q, n);
        r.b = n;
        if (e != cudaSuccess) {
          r.res = (int32_t)e;
          cudaGetLastError();
          break;
        }
        if (g_nheld < MAX_HELD) g_held[g_nheld++] = q;
        r.a++;
        r.c += n;
      }
      r.d = shim_stats().bytes_mapped;
      break;
    }
    case A_FREE_ALL:
      for (int i = 0; i < g_nheld; i++) r.res += cudaFree(g_held[i]) != cudaSuccess;
      g_nheld = 0;
      shim_trim();
      break;
    case A_TRIM: r.a = shim_trim(); break;
    case A_HOST_USED: r.a = emu_host_used(); break;
    case A_FREE_LATER:
    case A_JOIN_LATER:
    case A_IDLE: agent_threads(&r); break;
    case A_EXIT: msg_send(out, &r); return 0;
    default: r.res = -1;
    }
    msg_send(out, &r);
  }
  return 0;
}

/* scripts/vmmshim ctl --group ARGS > out (ARGS: NAME VERB ...); returns the exit status. */
static int group_tool(const char *args, char *out, size_t n) {
  char cmd[512];
  /* The client is no CUDA program: it runs without the shim (and without a sanitizer's runtime). */
  /* Bounded: a client that hangs fails the check rather than the whole scenario. */
  snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD timeout 30 sh scripts/vmmshim ctl --group %s 2>&1", args);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  size_t used = fread(out, 1, n - 1, f);
  out[used] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ------------------------------------------------------------------ four */

typedef struct reader_s {
  volatile int stop;
  const vs_group_header_t *h;
  long reads, over;
  uint64_t max_seen;
} reader_t;

static void *reader_main(void *arg) {
  reader_t *r = arg;
  while (!r->stop) {
    uint64_t t = ld64(&r->h->total_all);
    __atomic_store_n(&r->reads, r->reads + 1, __ATOMIC_RELAXED); /* the main thread waits for the first */
    if (t > 8 * GiB) r->over++;
    if (t > r->max_seen) r->max_seen = t;
  }
  return NULL;
}

static void scenario_four(void) {
  group_name("four");
  unlink(g_path);
  agent_t ag[4];
  for (int i = 0; i < 4; i++) ag[i] = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  /* A process joins at its first allocation (or cudaMemGetInfo). */
  for (int i = 0; i < 4; i++) CHECK(ask(&ag[i], A_INFO, 0, 0, 0).res == cudaSuccess, "cudaMemGetInfo");
  seg_t s = seg_open(g_path);
  CHECK(s.h != NULL, "the segment %s exists once the members asked", g_path);
  if (!s.h) return;
  struct stat st;
  CHECK(fstat(s.fd, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 0777) == 0600 &&
            st.st_size == (off_t)VS_GROUP_SIZE,
        "owned by this user, mode 0600, %u bytes: mode 0%o size %lld", VS_GROUP_SIZE, (unsigned)(st.st_mode & 0777),
        (long long)st.st_size);
  CHECK(!memcmp(s.h->magic, VS_GROUP_MAGIC, 8) && s.h->version == VS_GROUP_VERSION && s.h->members == 4 &&
            s.h->limit_all == 8 * GiB,
        "header: version %u, %u members, limit %llu", s.h->version, s.h->members, (unsigned long long)s.h->limit_all);

  /* One step at a time, the segment read after each. */
  unsigned long long seed = 0x5eed;
  int refused[4] = {0}, steps = 0, bad_steps = 0, unclean = 0, mismatched = 0, unexplained = 0;
  while (!(refused[0] && refused[1] && refused[2] && refused[3]) && steps < 2000) {
    int i = (int)(rnd_next(&seed) % 4);
    if (refused[i]) continue;
    size_t n = rnd_size(&seed, 1 * GiB);
    msg_t r = ask(&ag[i], A_MALLOC, n, 0, 0);
    steps++;
    seg_lock(&s);
    uint64_t total = s.h->total_all;
    int ok = total <= 8 * GiB && seg_consistent(&s);
    vs_group_member_t *me = seg_member(&s, ag[i].pid);
    uint64_t mine = me ? me->mapped_all : 0;
    seg_unlock(&s);
    bad_steps += !ok;
    msg_t mm = ask(&ag[i], A_MAPPED, 0, 0, 0);
    mismatched += mm.a != mine;
    if (r.res != cudaSuccess) {
      refused[i] = 1;
      unclean += r.res != cudaErrorMemoryAllocation;
      /* The budget explains it: what the others and it map, plus the growth, passes the limit. */
      unexplained += total + ((n + 2 * MiB - 1) / (2 * MiB)) * (2 * MiB) + 2 * MiB <= 8 * GiB; /* + alignment */
    }
  }
  CHECK(refused[0] && refused[1] && refused[2] && refused[3], "every member was refused in %d steps", steps);
  CHECK(bad_steps == 0, "%d of %d steps left the segment over the limit or inconsistent", bad_steps, steps);
  CHECK(mismatched == 0, "%d steps where a member's slot was not what its shim maps", mismatched);
  CHECK(unclean == 0, "%d refusals were not cudaErrorMemoryAllocation", unclean);
  CHECK(unexplained == 0, "%d refusals with room under the limit", unexplained);
  CHECK(strstr(agent_log(&ag[0]), "VMMSHIM_LIMIT_GROUP=") && strstr(agent_log(&ag[0]), "the group's limit is reached"),
        "the out-of-memory report names the group and says its limit is reached");

  /* All four at once, racing for the last bytes, a reader beside them. */
  for (int i = 0; i < 4; i++) CHECK(ask(&ag[i], A_FREE_ALL, 0, 0, 0).res == 0, "free all");
  seg_lock(&s);
  CHECK(s.h->total_all == 0 && seg_consistent(&s), "after the frees and trims the group maps %llu",
        (unsigned long long)s.h->total_all);
  seg_unlock(&s);
  reader_t rd = {0, s.h, 0, 0, 0};
  pthread_t th;
  pthread_create(&th, NULL, reader_main, &rd);
  /* The race starts once the reader reads: on a busy machine the thread may otherwise not run
   * before the race is over, and a reader that never read checks nothing. */
  for (int i = 0; i < 5000 && __atomic_load_n(&rd.reads, __ATOMIC_RELAXED) == 0; i++) sleep_ms(1);
  for (int i = 0; i < 4; i++) ask_send(&ag[i], A_RACE, 1000 + (uint64_t)i, 512 * MiB, 0);
  msg_t race[4];
  for (int i = 0; i < 4; i++) race[i] = ask_reply(&ag[i], A_RACE);
  rd.stop = 1;
  pthread_join(th, NULL);
  CHECK(rd.reads > 0 && rd.over == 0, "the reader saw the total over 8 GiB %ld times in %ld reads (max %llu)", rd.over,
        rd.reads, (unsigned long long)rd.max_seen);
  seg_lock(&s);
  uint64_t total = s.h->total_all;
  CHECK(total <= 8 * GiB && seg_consistent(&s), "after the race: %llu mapped, consistent", (unsigned long long)total);
  uint64_t sum = 0;
  for (int i = 0; i < 4; i++) {
    vs_group_member_t *me = seg_member(&s, ag[i].pid);
    CHECK(me && me->mapped_all == race[i].d, "member %d: its slot %llu, its shim %llu", i,
          (unsigned long long)(me ? me->mapped_all : 0), (unsigned long long)race[i].d);
    sum += race[i].d;
  }
  seg_unlock(&s);
  CHECK(sum == total, "the members' own counts add up to the group's total");
  unsigned long long served = 0;
  for (int i = 0; i < 4; i++) served += race[i].a;
  CHECK(served > 0, "the racers were served %llu allocations", served);
  for (int i = 0; i < 4; i++) {
    /* Which racer gets how much is the race's: one may take it all before the others start. */
    CHECK(race[i].res == cudaErrorMemoryAllocation, "racer %d: %llu served, then refused with %d", i,
          (unsigned long long)race[i].a, race[i].res);
    /* The others' idle memory given back after this refusal may have lowered the total since:
     * a growth step (64 MiB) each at most. */
    CHECK(total + ((race[i].b + 2 * MiB - 1) / (2 * MiB)) * (2 * MiB) + 2 * MiB + 4 * 64 * MiB > 8 * GiB,
          "racer %d's refusal of %llu bytes is the limit's (total %llu)", i, (unsigned long long)race[i].b,
          (unsigned long long)total);
  }
  for (int i = 0; i < 4; i++) {
    msg_t mm = ask(&ag[i], A_MAPPED, 0, 0, 0);
    CHECK(mm.b == 0, "member %d: %llu contract violations", i, (unsigned long long)mm.b);
    agent_end(&ag[i]);
  }
  seg_lock(&s);
  CHECK(s.h->members == 0 && s.h->total_all == 0 && seg_consistent(&s), "clean exits leave the group empty: %u members, %llu",
        s.h->members, (unsigned long long)s.h->total_all);
  seg_unlock(&s);
  seg_close(&s);
  unlink(g_path);
}

/* ------------------------------------------------------------------ kill */

/* A member slot planted by hand (as a process of the group would hold it), under the lock. */
static void plant(seg_t *s, pid_t pid, uint64_t start, uint64_t bytes) {
  seg_lock(s);
  vs_group_member_t *m = vs_group_members(s->h);
  for (int i = 0; i < VS_GROUP_MEMBERS; i++) {
    if (m[i].pid) continue;
    s->h->busy = (uint32_t)getpid();
    m[i].pid = (uint32_t)pid;
    m[i].start = start;
    snprintf(m[i].comm, sizeof m[i].comm, "planted");
    m[i].mapped_all = bytes;
    m[i].mapped[0] = bytes;
    s->h->total_all += bytes;
    s->h->total[0] += bytes;
    s->h->members++;
    s->h->busy = 0;
    break;
  }
  seg_unlock(s);
}

static void scenario_kill(void) {
  group_name("kill");
  unlink(g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  agent_t b = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  CHECK(ask(&b, A_INFO, 0, 0, 0).res == cudaSuccess, "b joins before a dies");
  for (int i = 0; i < 3; i++) CHECK(ask(&a, A_MALLOC, 2 * GiB, 0, 0).res == cudaSuccess, "a: 2 GiB");
  seg_t s = seg_open(g_path);
  if (!s.h) {
    CHECK(0, "no segment");
    return;
  }
  CHECK(s.h->total_all == 6 * GiB, "6 GiB counted: %llu", (unsigned long long)s.h->total_all);
  pid_t apid = a.pid;
  agent_kill(&a);
  CHECK(seg_member(&s, apid) != NULL && s.h->total_all == 6 * GiB, "the dead member's bytes stay until they are needed");
  msg_t r = ask(&b, A_MALLOC, 4 * GiB, 0, 0);
  CHECK(r.res == cudaSuccess, "b: 4 GiB fit once the dead member's 6 GiB are returned: %d", r.res);
  seg_lock(&s);
  CHECK(seg_member(&s, apid) == NULL && s.h->members == 1 && s.h->reclaimed >= 6 * GiB && s.h->total_all == 4 * GiB &&
            seg_consistent(&s),
        "the dead member is gone: %u members, reclaimed %llu, total %llu", s.h->members,
        (unsigned long long)s.h->reclaimed, (unsigned long long)s.h->total_all);
  seg_unlock(&s);

  /* A slot whose pid lives but started at another time: a recycled pid, not the member. */
  plant(&s, getpid(), start_of(getpid()) + 12345, 3 * GiB);
  r = ask(&b, A_MALLOC, 2 * GiB, 0, 0);
  CHECK(r.res == cudaSuccess, "b: 2 GiB more fit: the slot of a recycled pid was returned (%d)", r.res);
  CHECK(seg_member(&s, getpid()) == NULL, "the recycled pid's slot is gone");
  /* A slot of a live member (this process, its true start time): kept. */
  plant(&s, getpid(), start_of(getpid()), 2 * GiB);
  r = ask(&b, A_MALLOC, 1 * GiB, 0, 0);
  CHECK(r.res == cudaErrorMemoryAllocation, "b: 1 GiB more is refused: the live member's 2 GiB stay (%d)", r.res);
  CHECK(seg_member(&s, getpid()) != NULL, "the live member's slot stays");
  agent_end(&b);
  seg_close(&s);
  unlink(g_path);
}

/* ------------------------------------------------------------------ sequential */

static void scenario_sequential(void) {
  group_name("seq");
  unlink(g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  CHECK(ask(&a, A_MALLOC, 5 * GiB, 0, 0).res == cudaSuccess, "a: 5 GiB");
  struct stat st1, st2;
  CHECK(stat(g_path, &st1) == 0, "the segment exists");
  agent_end(&a);
  agent_t b = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  CHECK(stat(g_path, &st2) == 0 && st2.st_ino == st1.st_ino, "the next member reuses the segment");
  msg_t r = ask(&b, A_MALLOC, 7 * GiB, 0, 0);
  CHECK(r.res == cudaSuccess, "b: 7 GiB fit (the first member's bytes went back at its exit): %d", r.res);
  seg_t s = seg_open(g_path);
  CHECK(s.h && s.h->members == 1 && s.h->total_all == 7 * GiB, "b is counted: %u members, %llu", s.h ? s.h->members : 0,
        (unsigned long long)(s.h ? s.h->total_all : 0));
  /* A member without VMMSHIM_LIMIT of its own leaves the group's limit alone (not 0). */
  agent_t c = agent_start(env_group(), NULL);
  CHECK(s.h && s.h->limit_all == 8 * GiB, "an unconfigured member keeps the limit: %llu", (unsigned long long)s.h->limit_all);
  CHECK(ask(&c, A_MALLOC, 2 * GiB, 0, 0).res == cudaErrorMemoryAllocation, "and is held to it");
  msg_t inf = ask(&c, A_INFO, 0, 0, 0);
  CHECK(inf.res == cudaSuccess && inf.b == 8 * GiB && inf.a <= 1 * GiB, "its cudaMemGetInfo: %llu free of %llu",
        (unsigned long long)inf.a, (unsigned long long)inf.b);
  /* Another member with another VMMSHIM_LIMIT while members live: not taken, said. */
  agent_t d = agent_start(env_group(), "VMMSHIM_LIMIT=2G", NULL);
  CHECK(ask(&d, A_MALLOC, 512 * MiB, 0, 0).res == cudaSuccess, "d allocates under the group's limit");
  CHECK(s.h && s.h->limit_all == 8 * GiB && strstr(agent_log(&d), "is not taken"),
        "a member's other VMMSHIM_LIMIT is not taken while others live, and it says so");
  agent_end(&c);
  agent_end(&d);
  agent_end(&b);
  /* No member left: the next one's VMMSHIM_LIMIT is the group's. */
  agent_t e = agent_start(env_group(), "VMMSHIM_LIMIT=4G", NULL);
  CHECK(ask(&e, A_MALLOC, 1 * GiB, 0, 0).res == cudaSuccess, "e: 1 GiB");
  CHECK(s.h && s.h->limit_all == 4 * GiB, "alone, its VMMSHIM_LIMIT=4G is taken: %llu", (unsigned long long)s.h->limit_all);
  CHECK(ask(&e, A_MALLOC, 4 * GiB, 0, 0).res == cudaErrorMemoryAllocation, "and holds");
  agent_end(&e);
  /* A limit set with the client stays, whoever joins. */
  char out[4096];
  char args[128];
  snprintf(args, sizeof args, "%s limit 3G", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0, "limit 3G: %s", out);
  agent_t f = agent_start(env_group(), "VMMSHIM_LIMIT=6G", NULL);
  CHECK(ask(&f, A_MALLOC, 4 * GiB, 0, 0).res == cudaErrorMemoryAllocation, "the client's 3G holds against VMMSHIM_LIMIT=6G");
  CHECK(s.h && s.h->limit_all == 3 * GiB && s.h->limit_source == VS_GROUP_LIMIT_CTL, "limit %llu, source %u",
        (unsigned long long)s.h->limit_all, s.h->limit_source);
  agent_end(&f);
  seg_close(&s);
  unlink(g_path);
}

/* ------------------------------------------------------------------ user */

static void scenario_user(void) {
  if (geteuid() != 0) {
    printf("note: not root: no process of another user can be made, the other-user checks cannot run\n");
    const char *ci = getenv("CI");
    CHECK(!(ci && !strcmp(ci, "true")), "the other-user scenario must run in CI (run the tests as root)");
    return;
  }
  group_name("user");
  char other[128];
  snprintf(other, sizeof other, "/dev/shm/vmmshim-65534-%s", g_group);
  unlink(g_path);
  unlink(other);
  agent_t r = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  CHECK(ask(&r, A_MALLOC, 1 * GiB, 0, 0).res == cudaSuccess, "root member: 1 GiB");
  agent_t n = agent_start(env_group(), "VMMSHIM_LIMIT=8G", "AGENT_SETUID=65534", NULL);
  CHECK(ask(&n, A_MALLOC, 2 * GiB, 0, 0).res == cudaSuccess, "nobody's member: 2 GiB");
  struct stat st;
  CHECK(stat(other, &st) == 0 && st.st_uid == 65534 && (st.st_mode & 0777) == 0600, "nobody has its own segment %s", other);
  seg_t s = seg_open(g_path), o = seg_open(other);
  CHECK(s.h && s.h->members == 1 && s.h->total_all == 1 * GiB, "root's segment holds root's member only");
  CHECK(o.h && o.h->members == 1 && o.h->total_all == 2 * GiB && o.h->uid == 65534, "nobody's holds nobody's");
  seg_close(&s);
  seg_close(&o);
  agent_end(&n);
  agent_end(&r);
  unlink(g_path);
  unlink(other);

  /* A segment of nobody's name that root made: not nobody's own, refused; runs capped alone. */
  group_name("planted");
  snprintf(other, sizeof other, "/dev/shm/vmmshim-65534-%s", g_group);
  int fd = open(other, O_RDWR | O_CREAT | O_EXCL, 0666);
  CHECK(fd >= 0 && fchmod(fd, 0666) == 0 && ftruncate(fd, VS_GROUP_SIZE) == 0, "planted %s", other);
  static unsigned char before[VS_GROUP_SIZE], after[VS_GROUP_SIZE];
  vs_group_header_t *h = (vs_group_header_t *)before;
  memcpy(h->magic, VS_GROUP_MAGIC, 8);
  h->version = VS_GROUP_VERSION;
  h->header_size = VS_GROUP_HEADER;
  h->member_size = VS_GROUP_MEMBER;
  h->max_members = VS_GROUP_MEMBERS;
  h->max_devices = VS_GROUP_DEVICES;
  h->uid = 65534;
  struct stat ns;
  h->pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
  snprintf(h->name, sizeof h->name, "%.31s", g_group);
  h->crc = crc32_of(h, VS_GROUP_CRC_BYTES);
  h->limit_all = 64 * GiB;
  CHECK(pwrite(fd, before, sizeof before, 0) == (ssize_t)sizeof before, "write");
  /* The limit was only ever set through the group: refused, the process must not run uncapped. */
  agent_t p = agent_start(env_group(), "AGENT_SETUID=65534", NULL);
  CHECK(ask(&p, A_MALLOC, 2 * GiB, 0, 0).res == cudaErrorMemoryAllocation, "2 GiB refused: not run uncapped");
  CHECK(ask(&p, A_MALLOC, 1 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "nor 1 MiB");
  const char *log = agent_log(&p);
  CHECK(strstr(log, "not this user's own") && strstr(log, "owned by uid 0 with mode 0666") &&
            strstr(log, "every device allocation of this process fails"),
        "the member says why: %.400s", log);
  CHECK(pread(fd, after, sizeof after, 0) == (ssize_t)sizeof after && !memcmp(before, after, sizeof after),
        "the planted segment is untouched");
  agent_end(&p);
  /* The same file, its lock held by its owner: refused before any lock, at once. */
  CHECK(flock(fd, LOCK_EX | LOCK_NB) == 0, "the owner holds the lock");
  agent_t q = agent_start(env_group(), "VMMSHIM_LIMIT=1G", "AGENT_SETUID=65534", NULL);
  msg_t m = {0, 0, 0, 0, 0, 0};
  double t0 = now_s();
  int answered = ask_send(&q, A_MALLOC, 64 * MiB, 0, 0) == 0 && msg_recv_within(q.from, &m, 15000) == 0;
  double took = now_s() - t0;
  if (!answered) q.dead = 1;
  CHECK(answered && m.res == cudaErrorMemoryAllocation && took < 3.0,
        "with the lock held, the allocation does not hang: %s, %d after %.2f s", answered ? "answered" : "no answer", m.res,
        took);
  CHECK(strstr(agent_log(&q), "not this user's own"), "and says why: %.300s", agent_log(&q));
  /* The client, run as that user: refused at once, exit 1. */
  char out[4096], cmd[512];
  snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD timeout 30 setpriv --reuid=65534 --regid=65534 --clear-groups sh scripts/vmmshim ctl "
           "--group %s status 2>&1", g_group);
  t0 = now_s();
  FILE *f = popen(cmd, "r");
  size_t used = f ? fread(out, 1, sizeof out - 1, f) : 0;
  out[used] = 0;
  int status = f ? pclose(f) : -1;
  took = now_s() - t0;
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(out, "not this user's own") && took < 10.0,
        "the client as nobody: exit 1 at once (%.2f s): %s", took, out);
  flock(fd, LOCK_UN);
  agent_end(&q);
  close(fd);
  unlink(other);
}

/* ------------------------------------------------------------------ locked */

static void scenario_locked(void) {
  group_name("locked");
  unlink(g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=1G", NULL);
  CHECK(ask(&a, A_MALLOC, 256 * MiB, 0, 0).res == cudaSuccess, "a member made the segment");
  agent_end(&a);
  seg_t s = seg_open(g_path);
  CHECK(s.h != NULL, "the segment exists");
  if (!s.h) return;
  seg_lock(&s); /* as a member stopped in the middle of a change would hold it */
  agent_t b = agent_start(env_group(), NULL);
  msg_t m = {0, 0, 0, 0, 0, 0};
  double t0 = now_s();
  int answered = ask_send(&b, A_MALLOC, 64 * MiB, 0, 0) == 0 && msg_recv_within(b.from, &m, 30000) == 0;
  double took = now_s() - t0;
  if (!answered) b.dead = 1;
  CHECK(answered && m.res == cudaErrorMemoryAllocation && took >= 4.0 && took < 15.0,
        "the join gives up after its bound and the allocation fails: %s, %d after %.2f s",
        answered ? "answered" : "no answer", m.res, took);
  CHECK(strstr(agent_log(&b), "stayed locked by another process") && strstr(agent_log(&b), g_path) &&
            strstr(agent_log(&b), "every device allocation of this process fails"),
        "it names the file and says what to do: %.400s", agent_log(&b));
  CHECK(ask(&b, A_MALLOC, 1 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "and does not run uncapped after");
  char out[4096], args[128];
  snprintf(args, sizeof args, "%s status", g_group);
  t0 = now_s();
  int rc = group_tool(args, out, sizeof out);
  took = now_s() - t0;
  CHECK(rc == 1 && strstr(out, "stayed locked") && took < 15.0, "the client gives up too: exit %d after %.2f s: %s", rc,
        took, out);
  seg_unlock(&s);
  agent_t c = agent_start(env_group(), NULL);
  CHECK(ask(&c, A_MALLOC, 512 * MiB, 0, 0).res == cudaSuccess, "the lock let go: the next process joins");
  CHECK(ask(&c, A_MALLOC, 768 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "under the group's 1G");
  agent_end(&c);
  agent_end(&b);
  seg_close(&s);
  unlink(g_path);
}

/* ------------------------------------------------------------------ hopeless */

/* A_MALLOC answered within timeout_ms (the agent is marked dead otherwise); took in s. */
static msg_t malloc_within(agent_t *ag, uint64_t bytes, int timeout_ms, double *took) {
  msg_t m = {0, -1, 0, 0, 0, 0};
  double t0 = now_s();
  if (ask_send(ag, A_MALLOC, bytes, 0, 0) != 0 || msg_recv_within(ag->from, &m, timeout_ms) != 0) {
    ag->dead = 1;
    m.res = -1;
  }
  *took = now_s() - t0;
  return m;
}

static void scenario_hopeless(void) {
  group_name("hopeless");
  unlink(g_path);
  double took = 0;
  /* More than the group's limit itself: nothing any member frees can make it fit. */
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=1G", "VMMSHIM_ON_LIMIT=wait:30", NULL);
  msg_t m = malloc_within(&a, 2 * GiB, 10000, &took);
  CHECK(m.res == cudaErrorMemoryAllocation && took < 2.0, "2 GiB over a 1 GiB group limit: %d after %.2f s", m.res, took);
  CHECK(strstr(agent_log(&a), "fails at once (CUDA_ERROR_OUT_OF_MEMORY)") && strstr(agent_log(&a), "more than the limit itself") &&
            strstr(agent_log(&a), g_group),
        "with the reason: %.400s", agent_log(&a));
  agent_end(&a);
  unlink(g_path);
  /* No group, one thread of the program: the only thread that could free is the one waiting. A
   * thread that never allocates nor frees (the driver's and the runtime's helpers, not named
   * cuda-... on a real driver) cannot end the wait either. */
  agent_t b = agent_start("VMMSHIM_LIMIT=1G", "VMMSHIM_ON_LIMIT=wait", NULL);
  CHECK(ask(&b, A_MALLOC, 768 * MiB, 0, 0).res == cudaSuccess, "768 MiB");
  CHECK(ask(&b, A_IDLE, 0, 0, 0).res == 0, "a helper thread that never allocates");
  m = malloc_within(&b, 512 * MiB, 10000, &took);
  CHECK(m.res == cudaErrorMemoryAllocation && took < 2.0, "512 MiB more, alone beside a helper: %d after %.2f s", m.res,
        took);
  CHECK(strstr(agent_log(&b), "fails at once") && strstr(agent_log(&b), "no other thread"), "with the reason: %.400s",
        agent_log(&b));
  CHECK(ask(&b, A_MALLOC, 3 * GiB, 0, 0).res == cudaErrorMemoryAllocation && strstr(agent_log(&b), "more than the limit"),
        "alone, more than the limit itself fails at once too");
  /* A second thread of the program that allocated frees a second later: the wait waits, then
   * proceeds. */
  msg_t r = ask(&b, A_FREE_LATER, 128 * MiB, 1000, 0);
  CHECK(r.res == cudaSuccess, "a thread that allocates 128 MiB and frees them in a second");
  m = malloc_within(&b, 256 * MiB, 20000, &took);
  CHECK(m.res == cudaSuccess && took >= 0.5, "with another thread, the wait proceeds once it freed: %d after %.2f s", m.res,
        took);
  /* That thread has exited: alone again, the wait fails at once. */
  CHECK(ask(&b, A_JOIN_LATER, 0, 0, 0).res == 0, "the thread exited");
  m = malloc_within(&b, 512 * MiB, 10000, &took);
  CHECK(m.res == cudaErrorMemoryAllocation && took < 2.0, "once the other thread exited, alone: %d after %.2f s", m.res,
        took);
  agent_end(&b);
}

/* ------------------------------------------------------------------ live */

static void scenario_live(void) {
  group_name("live");
  unlink(g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  msg_t r1 = ask(&a, A_MALLOC, 3 * GiB, 0, 0), r2 = ask(&a, A_MALLOC, 3 * GiB, 0, 0);
  CHECK(r1.res == cudaSuccess && r2.res == cudaSuccess, "6 GiB");
  ask(&a, A_MARK, r1.a, 3 * GiB, 1);
  ask(&a, A_MARK, r2.a, 3 * GiB, 2);
  char out[8192], args[256];
  snprintf(args, sizeof args, "%s limit 4G", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0 && strstr(out, "4.00 GiB"), "limit 4G: %s", out);
  CHECK(ask(&a, A_MALLOC, 64 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "a growth under the lowered limit is refused");
  CHECK(ask(&a, A_MARKED, r1.a, 3 * GiB, 1).res == 1 && ask(&a, A_MARKED, r2.a, 3 * GiB, 2).res == 1,
        "what it held is untouched");
  msg_t inf = ask(&a, A_INFO, 0, 0, 0);
  CHECK(inf.res == cudaSuccess && inf.a == 0 && inf.b == 4 * GiB, "cudaMemGetInfo: %llu free (0, never below), %llu total",
        (unsigned long long)inf.a, (unsigned long long)inf.b);
  snprintf(args, sizeof args, "%s status", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0, "status: %s", out);
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)a.pid);
  CHECK(strstr(out, pid) && strstr(out, "6.00 GiB") && strstr(out, "100.0%") && strstr(out, "1 member") &&
            strstr(out, "set by vmmshim ctl"),
        "status shows the member, its share and the limit's source: %s", out);
  snprintf(args, sizeof args, "%s status --json", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0 && strstr(out, "\"total_all\": 6442450944") && strstr(out, pid),
        "status --json: %.400s", out);
  snprintf(args, sizeof args, "%s limit 16G", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0, "limit 16G");
  msg_t r3 = ask(&a, A_MALLOC, 2 * GiB, 0, 0);
  CHECK(r3.res == cudaSuccess, "raised: it grows again (%d)", r3.res);
  inf = ask(&a, A_INFO, 0, 0, 0);
  CHECK(inf.b == 16 * GiB && inf.a <= 8 * GiB + 64 * MiB && inf.a >= 8 * GiB - 64 * MiB, "cudaMemGetInfo: %llu of %llu",
        (unsigned long long)inf.a, (unsigned long long)inf.b);
  snprintf(args, sizeof args, "%s limit 0:1G", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0, "a per-device limit");
  CHECK(ask(&a, A_MALLOC, 64 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "device 0's limit holds");
  snprintf(args, sizeof args, "%s limit none", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0, "no limit");
  CHECK(ask(&a, A_MALLOC, 64 * MiB, 0, 0).res == cudaSuccess, "grows with no limit");
  /* The client refuses what it cannot do. */
  snprintf(args, sizeof args, "%s limit 3Q", g_group);
  CHECK(group_tool(args, out, sizeof out) == 2 && strstr(out, "not a limit"), "a bad size: %s", out);
  snprintf(args, sizeof args, "%s limit 99:1G", g_group);
  CHECK(group_tool(args, out, sizeof out) == 2, "a device out of range");
  CHECK(group_tool("no-such-group-here status", out, sizeof out) == 1 && strstr(out, "error: no group"), "no group: %s", out);
  CHECK(group_tool("bad/name status", out, sizeof out) == 1 && strstr(out, "not a group name"), "a bad name: %s", out);
  agent_end(&a);
  unlink(g_path);
}

/* ------------------------------------------------------------------ wait */

static void scenario_wait(void) {
  group_name("wait");
  unlink(g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=8G", NULL);
  msg_t r1 = ask(&a, A_MALLOC, 3584 * MiB, 0, 0), r2 = ask(&a, A_MALLOC, 3584 * MiB, 0, 0);
  CHECK(r1.res == cudaSuccess && r2.res == cudaSuccess, "a holds 7 GiB");
  agent_t b = agent_start(env_group(), "VMMSHIM_ON_LIMIT=wait:30", NULL);
  CHECK(ask_send(&b, A_MALLOC, 2 * GiB, 0, 0) == 0, "b asks for 2 GiB");
  msg_t m;
  CHECK(msg_recv_within(b.from, &m, 400) != 0, "b's allocation blocks");
  seg_t s = seg_open(g_path);
  CHECK(s.h && s.h->waiters == 1, "the group counts one waiter: %u", s.h ? s.h->waiters : 0);
  unsigned long long c0 = cpu_ticks(b.pid);
  uint64_t tries0 = s.h ? ld64(&s.h->refused) : 0;
  double t0 = now_s();
  CHECK(msg_recv_within(b.from, &m, 1000) != 0, "still blocked a second later");
  unsigned long long used = cpu_ticks(b.pid) - c0;
  uint64_t tries = s.h ? ld64(&s.h->refused) - tries0 : 0;
  double waited = now_s() - t0;
  CHECK(used <= 3 && tries <= 12, "b used %llu clock ticks of CPU and tried %llu times in %.2f s of waiting: no polling",
        used, (unsigned long long)tries, waited);
  /* Right after one of b's tries (it looks again on its own half a second later at the
   * soonest), a frees 3.5 GiB: its free gives the idle memory back while a member waits, and the
   * release wakes b at once. */
  uint64_t seen = s.h ? ld64(&s.h->refused) : 0;
  for (int i = 0; i < 2000 && s.h && ld64(&s.h->refused) == seen; i++) sleep_ms(1);
  sleep_ms(20);
  double t1 = now_s();
  CHECK(ask(&a, A_FREE, r1.a, 0, 0).res == cudaSuccess, "a frees 3.5 GiB");
  CHECK(msg_recv_within(b.from, &m, 5000) == 0 && m.res == cudaSuccess, "b's allocation proceeds (%d)", m.res);
  double late = now_s() - t1;
  CHECK(late < 0.3, "woken by the release, %.3f s after it (not by its own timer)", late);
  CHECK(m.b >= 1400000000ull, "b waited %.2f s in all", (double)m.b / 1e9);
  char said[200];
  snprintf(said, sizeof said, "2147483648 bytes do not fit under group '%s''s limit of 8589934592 bytes", g_group);
  CHECK(strstr(agent_log(&b), said) && strstr(agent_log(&b), "waiting for memory to come back (at most 30 s"),
        "at the default log level, b said what it waited for: %.400s", agent_log(&b));
  CHECK(s.h && s.h->waiters == 0 && s.h->total_all <= 8 * GiB, "no waiter left; %llu mapped",
        (unsigned long long)(s.h ? s.h->total_all : 0));
  /* wait:1 gives up after a second, as fail does. */
  agent_t c = agent_start(env_group(), "VMMSHIM_ON_LIMIT=wait:1", NULL);
  msg_t rc = ask(&c, A_MALLOC, 4 * GiB, 0, 0);
  CHECK(rc.res == cudaErrorMemoryAllocation && rc.b >= 900000000ull && rc.b < 4000000000ull,
        "wait:1 times out: %d after %.2f s", rc.res, (double)rc.b / 1e9);
  CHECK(strstr(agent_log(&c), "did not fit") && strstr(agent_log(&c), "out of memory"),
        "it says so, and writes the report");
  agent_end(&c);
  agent_end(&b);
  agent_end(&a);
  seg_close(&s);
  unlink(g_path);
}

/* ------------------------------------------------------------------ host */

static void scenario_host(void) {
  group_name("host");
  unlink(g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=512M", "VMMSHIM_ON_LIMIT=host", NULL);
  uint64_t p[4];
  for (int i = 0; i < 4; i++) {
    msg_t r = ask(&a, A_MALLOC, 256 * MiB, 0, 0);
    CHECK(r.res == cudaSuccess, "block %d of 256 MiB (%d)", i, r.res);
    p[i] = r.a;
    ask(&a, A_MARK, p[i], 256 * MiB, 10 + (uint64_t)i);
  }
  int on_host = 0;
  for (int i = 0; i < 4; i++) {
    msg_t k = ask(&a, A_KIND, p[i], 0, 0);
    on_host += k.res == 1;
    CHECK(k.b == cudaMemoryTypeDevice, "block %d: pointer queries say device memory (%llu)", i, (unsigned long long)k.b);
  }
  CHECK(on_host == 2, "two blocks past the limit are on host memory: %d", on_host);
  msg_t t = ask(&a, A_TAG, 0, 0, 0);
  CHECK(t.a == 512 * MiB && t.c == 0, "the tag counts 512 MiB host_mapped (%llu), not asleep", (unsigned long long)t.a);
  seg_t s = seg_open(g_path);
  CHECK(s.h && s.h->total_all == 512 * MiB && s.h->host_all == 512 * MiB, "the group: %llu mapped, %llu on the host",
        (unsigned long long)(s.h ? s.h->total_all : 0), (unsigned long long)(s.h ? s.h->host_all : 0));
  for (int i = 0; i < 4; i++) CHECK(ask(&a, A_MARKED, p[i], 256 * MiB, 10 + (uint64_t)i).res == 1, "block %d intact", i);
  /* No room: promote leaves them on the host, bytes intact. */
  msg_t pr = ask(&a, A_PROMOTE, 0, 0, 0);
  CHECK(pr.res == -ENOMEM && pr.a == 0 && pr.b == 512 * MiB, "promote without room: %d, %llu moved, %llu left", pr.res,
        (unsigned long long)pr.a, (unsigned long long)pr.b);
  /* Written while on the host, kept after the move. */
  ask(&a, A_MARK, p[3], 256 * MiB, 99);
  char out[4096], args[256];
  snprintf(args, sizeof args, "%s limit 2G", g_group);
  CHECK(group_tool(args, out, sizeof out) == 0, "limit 2G");
  pr = ask(&a, A_PROMOTE, 0, 0, 0);
  CHECK(pr.res == 0 && pr.a == 512 * MiB && pr.b == 0, "promote: %d, %llu moved, %llu left", pr.res,
        (unsigned long long)pr.a, (unsigned long long)pr.b);
  on_host = 0;
  for (int i = 0; i < 4; i++) on_host += ask(&a, A_KIND, p[i], 0, 0).res != 0;
  CHECK(on_host == 0, "every block on device memory again, at the same address");
  for (int i = 0; i < 3; i++) CHECK(ask(&a, A_MARKED, p[i], 256 * MiB, 10 + (uint64_t)i).res == 1, "block %d intact", i);
  CHECK(ask(&a, A_MARKED, p[3], 256 * MiB, 99).res == 1, "what was written on the host came along");
  t = ask(&a, A_TAG, 0, 0, 0);
  CHECK(t.a == 0 && t.b >= 1 * GiB, "the tag: %llu host_mapped, %llu on the device", (unsigned long long)t.a,
        (unsigned long long)t.b);
  CHECK(s.h && s.h->total_all >= 1 * GiB && s.h->host_all == 0, "the group: %llu mapped, %llu on the host",
        (unsigned long long)(s.h ? s.h->total_all : 0), (unsigned long long)(s.h ? s.h->host_all : 0));
  CHECK(ask(&a, A_PROMOTE, 0, 0, 0).res == -EALREADY, "nothing left to promote");
  CHECK(ask(&a, A_MAPPED, 0, 0, 0).b == 0, "no contract violation");
  agent_end(&a);
  seg_close(&s);
  unlink(g_path);

  /* host:SIZE caps what goes to the host; freed host memory goes back at a trim. */
  agent_t b = agent_start("VMMSHIM_LIMIT=512M", "VMMSHIM_ON_LIMIT=host:256M", NULL);
  uint64_t q[3];
  for (int i = 0; i < 3; i++) {
    msg_t r = ask(&b, A_MALLOC, 256 * MiB, 0, 0);
    CHECK(r.res == cudaSuccess, "b: block %d (%d)", i, r.res);
    q[i] = r.a;
  }
  CHECK(ask(&b, A_KIND, q[2], 0, 0).res == 1, "the third block is on the host");
  CHECK(ask(&b, A_MALLOC, 256 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "a fourth passes host:256M: refused");
  CHECK(strstr(agent_log(&b), "cannot be served from host memory"), "and says why");
  uint64_t used0 = ask(&b, A_HOST_USED, 0, 0, 0).a;
  CHECK(ask(&b, A_FREE, q[2], 0, 0).res == cudaSuccess, "free the block on the host");
  ask(&b, A_TRIM, 0, 0, 0);
  msg_t tb = ask(&b, A_TAG, 0, 0, 0);
  CHECK(tb.a == 0, "a trim gives the unused host memory back: %llu host_mapped", (unsigned long long)tb.a);
  CHECK(ask(&b, A_MALLOC, 256 * MiB, 0, 0).res == cudaSuccess, "and host:256M has room again");
  CHECK(used0 >= 256 * MiB, "host memory was in use: %llu", (unsigned long long)used0);
  agent_end(&b);
}

/* ------------------------------------------------------------------ corrupt */

static void corrupt_case(const char *what, void (*spoil)(vs_group_header_t *), const char *expect) {
  group_name(what);
  unlink(g_path);
  int fd = open(g_path, O_RDWR | O_CREAT | O_EXCL, 0600);
  static unsigned char before[VS_GROUP_SIZE], after[VS_GROUP_SIZE];
  memset(before, 0, sizeof before);
  vs_group_header_t *h = (vs_group_header_t *)before;
  memcpy(h->magic, VS_GROUP_MAGIC, 8);
  h->version = VS_GROUP_VERSION;
  h->header_size = VS_GROUP_HEADER;
  h->member_size = VS_GROUP_MEMBER;
  h->max_members = VS_GROUP_MEMBERS;
  h->max_devices = VS_GROUP_DEVICES;
  h->uid = (uint32_t)geteuid();
  struct stat ns;
  h->pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
  snprintf(h->name, sizeof h->name, "%.31s", g_group);
  spoil(h);
  CHECK(fd >= 0 && pwrite(fd, before, sizeof before, 0) == (ssize_t)sizeof before, "planted %s", g_path);
  agent_t a = agent_start(env_group(), "VMMSHIM_LIMIT=1G", NULL);
  CHECK(ask(&a, A_MALLOC, 64 * MiB, 0, 0).res == cudaErrorMemoryAllocation,
        "%s: without its group, not even 64 MiB under its own 1G", what);
  CHECK(ask(&a, A_MALLOC, 1 * MiB, 0, 0).res == cudaErrorMemoryAllocation, "%s: nor 1 MiB", what);
  const char *log = agent_log(&a);
  CHECK(strstr(log, expect) && strstr(log, "every device allocation of this process fails (out of memory, "
                                          "CUDA_ERROR_OUT_OF_MEMORY)"),
        "%s: says %s: %.400s", what, expect, log);
  CHECK(pread(fd, after, sizeof after, 0) == (ssize_t)sizeof after && !memcmp(before, after, sizeof after),
        "%s: the segment is untouched", what);
  char out[4096], args[128];
  snprintf(args, sizeof args, "%s status", g_group);
  CHECK(group_tool(args, out, sizeof out) == 1 && strstr(out, expect), "%s: the client refuses it too: %s", what, out);
  agent_end(&a);
  close(fd);
  unlink(g_path);
}

static void spoil_crc(vs_group_header_t *h) { h->crc = crc32_of(h, VS_GROUP_CRC_BYTES) ^ 0x1234; }
static void spoil_version(vs_group_header_t *h) {
  h->version = 7;
  h->crc = crc32_of(h, VS_GROUP_CRC_BYTES);
}
static void spoil_magic(vs_group_header_t *h) { memcpy(h->magic, "NOTOURS!", 8); }
static void spoil_totals(vs_group_header_t *h) {
  h->crc = crc32_of(h, VS_GROUP_CRC_BYTES);
  h->total_all = 5 * GiB; /* no member holds it */
}

static void scenario_corrupt(void) {
  corrupt_case("crc", spoil_crc, "is corrupt (header checksum");
  corrupt_case("version", spoil_version, "has layout version 7");
  corrupt_case("magic", spoil_magic, "is corrupt (no vmmshim group header)");
  corrupt_case("totals", spoil_totals, "is corrupt (its totals are not the sums of its members)");
}

/* ------------------------------------------------------------------ scattered */

static void scenario_scattered(void) {
  /* This process is the member (VMMSHIM_LIMIT_GROUP and VMMSHIM_LIMIT=1G from the runner). */
  CHECK(cudaSetDevice(1) == cudaSuccess, "device 1");
  void *idle = must_malloc(768 * MiB);
  CHECK(cudaFree(idle) == cudaSuccess, "device 1: 768 MiB freed, kept idle in its pool");
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  void *p = NULL;
  CHECK(cudaMalloc(&p, 512 * MiB) == cudaSuccess, "device 0: 512 MiB fit once device 1's idle memory went back");
  /* Idle and live memory on device 1; what goes back is still not enough: the report says so. */
  CHECK(cudaSetDevice(1) == cudaSuccess, "device 1");
  void *live = must_malloc(256 * MiB), *idle2 = must_malloc(128 * MiB);
  CHECK(cudaFree(idle2) == cudaSuccess, "free");
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  void *q = NULL;
  CHECK(cudaMalloc(&q, 384 * MiB) == cudaErrorMemoryAllocation, "384 MiB more do not fit");
  const char *log = getenv("GROUP_LOG");
  static char buf[1 << 16];
  check_read_file(log, buf, sizeof buf);
  CHECK(strstr(buf, "scattered: 128.00 MiB (134217728 B) idle in the process's other pools") &&
            strstr(buf, "the request still did not fit"),
        "the report says what was scattered: %.600s", strstr(buf, "scattered") ? strstr(buf, "scattered") : buf);
  cudaFree(p);
  cudaSetDevice(1);
  cudaFree(live);
}

/* ------------------------------------------------------------------ perdevice */

static void scenario_perdevice(void) {
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  void *a = must_malloc(256 * MiB), *b = NULL;
  CHECK(cudaMalloc(&b, 64 * MiB) == cudaErrorMemoryAllocation, "device 0 is capped at 256 MiB");
  size_t f = 0, t = 0;
  CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && t == 256 * MiB && f == 0, "device 0: %zu free of %zu", f, t);
  CHECK(cudaSetDevice(1) == cudaSuccess, "device 1");
  void *c = must_malloc(512 * MiB);
  CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && t == 512 * MiB, "device 1: total %zu", t);
  CHECK(cudaMalloc(&b, 64 * MiB) == cudaErrorMemoryAllocation, "device 1 is capped at 512 MiB");
  cudaFree(c);
  cudaSetDevice(0);
  cudaFree(a);
}

/* ------------------------------------------------------------------ cleanup, watchdog */

/* The segments of this run (every group name carries the test's pid: t<pid>-...), of any user,
 * go when the test ends, also when a scenario failed half-way or the runner stopped it. */
static pid_t g_main_pid;
static void remove_segments(void) {
  if (getpid() != g_main_pid) return; /* not in the scenario processes and agents it starts */
  char pattern[96];
  snprintf(pattern, sizeof pattern, "/dev/shm/vmmshim-*-t%d-*", (int)g_main_pid);
  glob_t g;
  if (glob(pattern, 0, NULL, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
    globfree(&g);
  }
}
static void stopped(int sig) {
  remove_segments();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* A scenario that does not end in time (a group lock held by a member that is gone, a member
 * that never answers) fails with a message instead of running into the runner's timeout. */
#define GROUP_WATCHDOG_S 180
static const char *g_scenario = "";
static int g_watchdog_s = GROUP_WATCHDOG_S; /* GROUP_WATCHDOG=seconds changes it (to see it fire) */
static void watchdog(int sig) {
  (void)sig;
  char msg[256];
  int n = snprintf(msg, sizeof msg,
                   "FAIL %s: watchdog: scenario %s still running after %d s (a group lock held, or a member that "
                   "does not answer)\n%s: %d passed, %d failed\n",
                   __FILE__, g_scenario, g_watchdog_s, g_scenario, check_passed, check_failed + 1);
  if (n > 0 && write(1, msg, (size_t)n) < 0) _exit(3);
  _exit(1);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc && !strcmp(sc, "agent")) return agent_main();
  if (sc) {
    signal(SIGPIPE, SIG_IGN);
    g_scenario = sc;
    signal(SIGALRM, watchdog);
    if (getenv("GROUP_WATCHDOG")) g_watchdog_s = atoi(getenv("GROUP_WATCHDOG"));
    alarm((unsigned)g_watchdog_s);
    if (!strcmp(sc, "scattered") || !strcmp(sc, "perdevice")) {
      emu_set_device_count(2);
      emu_set_device_memory(0, 16 * GiB);
      emu_set_device_memory(1, 16 * GiB);
    }
    if (!strcmp(sc, "four")) scenario_four();
    else if (!strcmp(sc, "kill")) scenario_kill();
    else if (!strcmp(sc, "sequential")) scenario_sequential();
    else if (!strcmp(sc, "user")) scenario_user();
    else if (!strcmp(sc, "locked")) scenario_locked();
    else if (!strcmp(sc, "hopeless")) scenario_hopeless();
    else if (!strcmp(sc, "live")) scenario_live();
    else if (!strcmp(sc, "wait")) scenario_wait();
    else if (!strcmp(sc, "host")) scenario_host();
    else if (!strcmp(sc, "corrupt")) scenario_corrupt();
    else if (!strcmp(sc, "scattered")) scenario_scattered();
    else if (!strcmp(sc, "perdevice")) scenario_perdevice();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  g_main_pid = getpid();
  atexit(remove_segments);
  signal(SIGTERM, stopped);
  signal(SIGINT, stopped);
  check_run_child("four", NULL);
  check_run_child("kill", NULL);
  check_run_child("sequential", NULL);
  check_run_child("user", NULL);
  check_run_child("locked", NULL);
  check_run_child("hopeless", NULL);
  check_run_child("live", NULL);
  check_run_child("wait", NULL);
  check_run_child("host", NULL);
  check_run_child("corrupt", NULL);
  static char group[96], log[128], logenv[160];
  snprintf(group, sizeof group, "VMMSHIM_LIMIT_GROUP=t%d-scattered", (int)getpid());
  snprintf(log, sizeof log, "/tmp/vmmshim-group-test-%d-scattered.log", (int)getpid());
  snprintf(logenv, sizeof logenv, "VMMSHIM_LOG=warn:%s", log);
  static char logpath[160];
  snprintf(logpath, sizeof logpath, "GROUP_LOG=%s", log);
  unlink(log);
  check_run_child("scattered", group, "VMMSHIM_LIMIT=1G", logenv, logpath, NULL);
  unlink(log);
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/vmmshim-%u-t%d-scattered", (unsigned)geteuid(), (int)getpid());
  unlink(path);
  check_run_child("perdevice", "VMMSHIM_LIMIT=0:256M,1:512M", NULL);
  return check_summary();
}
