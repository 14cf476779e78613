/* test_shim_control: the control channel (src/hook/control.c, docs/control.md) of a program on the
 * emulation, driven from outside while 8 of its threads allocate and free (one process per
 * scenario: the shim reads its options once).
 *
 *   verbs    every verb round-trips over the raw socket and through the Python client
 *            (scripts/python/vmmshim_ctl.py) while 8 threads allocate in their tags and check their
 *            bytes: status (pid, program, devices, tags), tag (the threads without a tag of their
 *            own follow it; a bad name changes nothing), sleep and wake of a tag in host, discard
 *            and mapped modes (bytes kept, zeros, served from host memory), asleep/awake answers,
 *            trim, limit (a limit below what is mapped refuses growth and touches nothing live;
 *            none lifts it), dump (the report comes back), release-host, sleep --all and levels
 *            once the threads are done; two controllers at once; the threads' bytes intact.
 *   fuzz     10,000 malformed and truncated requests (random bytes, huge lines, bad JSON, wrong
 *            types, versions, verbs, arguments), a connection per 50 and others cut mid-request:
 *            each gets an error reply and changes nothing (process tag, limit, tags, nothing
 *            asleep); a silent client, a client that never reads its replies and a full set of
 *            connections never delay the others or the threads; descriptors and heap back to
 *            where they were.
 *   users    as root: a process of user nobody is refused (one error line, then closed) and its
 *            client exits 5; root controls a program of user nobody. Not root: not counted, or a
 *            failure when CI=true.
 *   gone     a dead pid (exit 3), a process not under the shim (exit 4); a sleep asked for during a
 *            stream capture is refused after VMMSHIM_SLEEP_WAIT with EBUSY and the reason (exit 1);
 *            the program exits while a sleep it was asked for waits on a capture: the raw
 *            connection sees the end at once, the client exits 7.
 *   off      VMMSHIM_CONTROL=0: the process uses CUDA, yet no socket listens (none in
 *            /proc/net/unix either), and the client exits 4 naming the variable.
 *   conns    exactly 8 controllers at once are each served, and still are once all 8 are open; a
 *            9th is refused (EBUSY) or served in an idle one's place; after one leaves, a new one
 *            is served.
 *   wakeone  two tags asleep: a wake of one wakes that one only, bytes intact.
 *   serve    not a test: a program for tests/scripts/test_ctl.py (weights and kv tags filled with
 *            patterns; reads commands on standard input: check, bytes (the patterns, kv wherever it
 *            is), alloc [MiB], free (the last allocated), touch (a copy, which waits at the gate),
 *            quit; also for tests/scripts/test_group_sleep.py and test_balloon.py).
 * test_static_control.c builds the verbs scenario with the runtime linked statically. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)
#define NWORKERS 8
#define SLOTS 12

/* ------------------------------------------------------------------ the shim's API, found at run time */

static int (*p_set_tag)(const char *);
static int (*p_tag_stats)(vmmshim_tag_stats_t *, int, size_t);
static int (*p_host_memory)(uint64_t *, uint64_t *);

static int find_api(void) {
  *(void **)&p_set_tag = dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  *(void **)&p_tag_stats = dlsym(RTLD_DEFAULT, "vmmshim_tag_stats");
  *(void **)&p_host_memory = dlsym(RTLD_DEFAULT, "vmmshim_host_memory");
  return p_set_tag && p_tag_stats && p_host_memory;
}

static vmmshim_tag_stats_t tag_stats(const char *name, int *ntags) {
  vmmshim_tag_stats_t all[VMMSHIM_MAX_TAGS], none;
  memset(&none, 0, sizeof none);
  int n = p_tag_stats(all, VMMSHIM_MAX_TAGS, sizeof all[0]);
  if (ntags) *ntags = n;
  for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++)
    if (!strcmp(all[i].name, name)) return all[i];
  return none;
}

static int any_asleep(void) {
  vmmshim_tag_stats_t all[VMMSHIM_MAX_TAGS];
  int n = p_tag_stats(all, VMMSHIM_MAX_TAGS, sizeof all[0]), asleep = 0;
  for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++) asleep += all[i].asleep;
  return asleep;
}

static void *tagged_malloc(const char *tag, size_t n) {
  p_set_tag(tag);
  void *p = must_malloc(n);
  p_set_tag(NULL);
  return p;
}

static int mapped_as(const void *p, size_t n) {
  int kind = emu_host_mapped((CUdeviceptr)(uintptr_t)p);
  for (size_t off = 0; off < n; off += 2 * MiB)
    if (emu_host_mapped((CUdeviceptr)(uintptr_t)p + off) != kind) return -2;
  return kind;
}

/* Open sockets of this process (the emulation's device memory is descriptors too: not those). */
static int open_sockets(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[300], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, target, sizeof target - 1);
    n += k > 7 && !strncmp(target, "socket:", 7);
  }
  closedir(d);
  return n;
}

/* ------------------------------------------------------------------ the raw socket */

/* One reply line into buf (no newline); its length, or -1 when the connection ended first. */
static int read_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = recv(fd, buf + n, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (buf[n] == '\n') {
      buf[n] = 0;
      return (int)n;
    }
    n++;
  }
  buf[n] = 0;
  return -1;
}

static int send_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

static _Thread_local char tl_reply[1 << 17];

/* A request (one JSON object, no newline) to this process; its reply ("" when none came). */
static const char *ctl(const char *req) {
  tl_reply[0] = 0;
  int fd = ctl_connect(getpid(), geteuid());
  if (fd < 0) return tl_reply;
  char line[4200];
  int n = snprintf(line, sizeof line, "%s\n", req);
  if (send_all(fd, line, (size_t)n) == 0) read_line(fd, tl_reply, sizeof tl_reply);
  close(fd);
  return tl_reply;
}

static int is_ok(const char *reply) { return strncmp(reply, "{\"v\":1,\"ok\":true", 16) == 0; }
static int is_error(const char *reply, const char *name) {
  char want[64];
  snprintf(want, sizeof want, "\"error\":\"%s\"", name);
  return strncmp(reply, "{\"v\":1,\"ok\":false", 17) == 0 && strstr(reply, want) != NULL;
}

/* The number after "key": in a reply (the first one), or -1. */
static long long json_num(const char *reply, const char *key) {
  char want[64];
  snprintf(want, sizeof want, "\"%s\":", key);
  const char *p = strstr(reply, want);
  return p ? strtoll(p + strlen(want), NULL, 10) : -1;
}

/* ------------------------------------------------------------------ the Python client */

static char g_client[4096];

static int find_client(void) {
  char *slash;
  char cwd[2048], exe[2048];
  if (getcwd(cwd, sizeof cwd)) {
    snprintf(g_client, sizeof g_client, "%s/scripts/python/vmmshim_ctl.py", cwd);
    if (access(g_client, R_OK) == 0) return 1;
  }
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    if ((slash = strrchr(exe, '/')) != NULL) *slash = 0;
    snprintf(g_client, sizeof g_client, "%s/../../scripts/python/vmmshim_ctl.py", exe);
    if (access(g_client, R_OK) == 0) return 1;
  }
  g_client[0] = 0;
  return 0;
}

static char g_client_out[1 << 16];

/* Runs the client with the words given (NULL-terminated) as user `as` (-1: this one), without the
 * shim (or a sanitizer) preloaded; its exit status, its output (both streams) in g_client_out.
 * background: returns the pid at once (wait with client_wait). */
static int workers_pause(void);
static void workers_resume(void);
static atomic_int g_workers_running, g_stop, g_pause, g_paused;

static int client_spawn(int out_fd, uid_t as, gid_t as_gid, char **words) {
  /* No thread of ours allocates while we fork (a child forked then can find its allocator locked
   * under AddressSanitizer). */
  int paused = atomic_load(&g_workers_running) && !atomic_load(&g_pause) && workers_pause();
  pid_t pid = fork();
  if (paused && pid != 0) workers_resume();
  if (pid == 0) {
    if (out_fd >= 0) {
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      close(out_fd);
    }
    unsetenv("LD_PRELOAD");
    if (as != (uid_t)-1 && (setgroups(0, NULL) != 0 || setgid(as_gid) != 0 || setuid(as) != 0)) _exit(120);
    char *argv[32];
    int k = 0;
    const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
    argv[k++] = (char *)py;
    argv[k++] = (char *)"-S"; /* as scripts/vmmshim runs it: no site-packages to import */
    argv[k++] = g_client;
    for (int i = 0; words[i] && k < 31; i++) argv[k++] = words[i];
    argv[k] = NULL;
    execvp(py, argv);
    _exit(127);
  }
  return pid;
}

static int client_wait(pid_t pid, int read_fd) {
  size_t used = 0;
  g_client_out[0] = 0;
  if (read_fd >= 0) {
    ssize_t r;
    while ((r = read(read_fd, g_client_out + used, sizeof g_client_out - 1 - used)) > 0) used += (size_t)r;
    g_client_out[used] = 0;
    close(read_fd);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int client_as(uid_t as, gid_t gid, char **words) {
  if (!g_client[0]) return -1;
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = client_spawn(fds[1], as, gid, words);
  close(fds[1]);
  return client_wait(pid, fds[0]);
}

static int client(char **words) { return client_as((uid_t)-1, (gid_t)-1, words); }

#define WORDS(...) ((char *[]){__VA_ARGS__, NULL})

/* ------------------------------------------------------------------ the threads that allocate */

typedef struct worker_s {
  int idx;
  const char *tag;
  atomic_ullong allocs, bad, failed;
} worker_t;

static worker_t g_workers[NWORKERS];
static pthread_t g_threads[NWORKERS];

/* Allocates, fills, checks and frees blocks of up to 2 MiB, SLOTS at a time, until g_stop; while
 * g_pause, holds them and waits. */
static void *worker(void *arg) {
  worker_t *w = arg;
  cudaSetDevice(0);
  if (w->tag) p_set_tag(w->tag);
  unsigned long long seed = 0x9e3779b9u * (unsigned)(w->idx + 1), seq = 0, ops = 0;
  void *ptr[SLOTS] = {0};
  size_t len[SLOTS] = {0};
  unsigned long long key[SLOTS] = {0};
  while (!atomic_load(&g_stop)) {
    if (atomic_load(&g_pause)) {
      atomic_fetch_add(&g_paused, 1);
      while (atomic_load(&g_pause) && !atomic_load(&g_stop)) sleep_ms(1);
      atomic_fetch_sub(&g_paused, 1);
      continue;
    }
    if (++ops % 4 == 0) sleep_ms(1); /* leave the two cores of a CI machine to the controllers too */
    int i = (int)(rnd_next(&seed) % SLOTS);
    if (ptr[i]) {
      if (pat_check_sparse(ptr[i], len[i], key[i]) != (size_t)-1) atomic_fetch_add(&w->bad, 1);
      if (cudaFree(ptr[i]) != cudaSuccess) atomic_fetch_add(&w->bad, 1);
      ptr[i] = NULL;
      continue;
    }
    len[i] = rnd_size(&seed, 2 * MiB);
    key[i] = ((unsigned long long)w->idx << 40) + seq++;
    if (cudaMalloc(&ptr[i], len[i]) != cudaSuccess) {
      atomic_fetch_add(&w->failed, 1);
      ptr[i] = NULL;
      continue;
    }
    pat_fill_sparse(ptr[i], len[i], key[i]);
    atomic_fetch_add(&w->allocs, 1);
  }
  for (int i = 0; i < SLOTS; i++)
    if (ptr[i]) {
      if (pat_check_sparse(ptr[i], len[i], key[i]) != (size_t)-1) atomic_fetch_add(&w->bad, 1);
      cudaFree(ptr[i]);
    }
  return NULL;
}

static const char *const g_worker_tags[NWORKERS] = {"weights", "weights", "kv", "kv", NULL, NULL, NULL, NULL};

static void workers_start(void) {
  atomic_store(&g_stop, 0);
  atomic_store(&g_pause, 0);
  atomic_store(&g_workers_running, 1);
  for (int i = 0; i < NWORKERS; i++) {
    memset(&g_workers[i], 0, sizeof g_workers[i]);
    g_workers[i].idx = i;
    g_workers[i].tag = g_worker_tags[i];
    pthread_create(&g_threads[i], NULL, worker, &g_workers[i]);
  }
}

static unsigned long long workers_allocs(void) {
  unsigned long long n = 0;
  for (int i = 0; i < NWORKERS; i++) n += atomic_load(&g_workers[i].allocs);
  return n;
}

/* Waits until every thread holds still (or 5 s). */
static int workers_pause(void) {
  atomic_store(&g_pause, 1);
  double t0 = now_s();
  while (atomic_load(&g_paused) < NWORKERS && now_s() - t0 < 5) sleep_ms(1);
  return atomic_load(&g_paused) == NWORKERS;
}

static void workers_resume(void) { atomic_store(&g_pause, 0); }

static void workers_stop(const char *what) {
  atomic_store(&g_stop, 1);
  atomic_store(&g_workers_running, 0);
  unsigned long long bad = 0, failed = 0;
  for (int i = 0; i < NWORKERS; i++) {
    pthread_join(g_threads[i], NULL);
    bad += atomic_load(&g_workers[i].bad);
    failed += atomic_load(&g_workers[i].failed);
  }
  CHECK(bad == 0 && failed == 0, "%s: the threads' blocks kept their bytes (%llu bad) and every allocation was served "
        "(%llu failed), %llu allocations", what, bad, failed, workers_allocs());
}

/* Lets the threads make n more allocations (or 5 s go by). */
static void workers_progress(unsigned long long n) {
  unsigned long long a0 = workers_allocs();
  double t0 = now_s();
  while (workers_allocs() < a0 + n && now_s() - t0 < 5) sleep_ms(1);
}

/* ------------------------------------------------------------------ verbs */

/* Two controllers at once: one asks for the status, the other sleeps and wakes a tag. */
static atomic_int g_two_bad;
static void two_check(const char *req) {
  const char *r = ctl(req);
  if (is_ok(r)) return;
  atomic_fetch_add(&g_two_bad, 1);
  printf("two controllers: %s -> %.300s\n", req, r[0] ? r : "(no reply)");
}
static void *controller_status(void *arg) {
  (void)arg;
  for (int i = 0; i < 150; i++) two_check("{\"v\":1,\"cmd\":\"status\"}");
  return NULL;
}
static void *controller_sleep(void *arg) {
  (void)arg;
  for (int i = 0; i < 25; i++) {
    two_check("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"idle\",\"mode\":\"host\"}");
    two_check("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"idle\"}");
  }
  return NULL;
}

static void scenario_verbs(void) {
  const size_t in = 16 * MiB;
  char *idle = tagged_malloc("idle", in);
  if (!idle) return;
  pat_fill_sparse(idle, in, 77);
  const char *r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  CHECK(is_ok(r), "the channel answers once the shim is active: %.200s", r);
  workers_start();
  workers_progress(2000);

  /* status */
  r = ctl("{\"v\":1,\"cmd\":\"status\",\"id\":7}");
  char want[64];
  snprintf(want, sizeof want, "\"pid\":%d,", (int)getpid());
  CHECK(is_ok(r) && strstr(r, want) && strstr(r, "\"id\":7,"), "status: ok, our pid, the id back: %.200s", r);
  CHECK(strstr(r, "\"program\":\"test_s") != NULL, "status names the program: %.300s", r);
  CHECK(strstr(r, "\"devices\":[{\"device\":0,") != NULL, "status lists device 0: %.300s", strstr(r, "devices"));
  CHECK(strstr(r, "\"name\":\"weights\"") && strstr(r, "\"name\":\"kv\"") && strstr(r, "\"name\":\"idle\""),
        "status lists the tags");
  CHECK(strstr(r, "\"allocs\":[") && json_num(strstr(r, "\"stats\""), "pools") > 0,
        "status has the stats of vmmshim_get_stats");

  /* tag: the threads without a tag of their own follow it */
  r = ctl("{\"v\":1,\"cmd\":\"tag\",\"tag\":\"phase2\"}");
  CHECK(is_ok(r) && strstr(r, "\"previous\":\"untagged\""), "tag phase2: %s", r);
  workers_progress(2000);
  CHECK(tag_stats("phase2", NULL).live > 0, "the threads without a tag allocate in phase2 now");
  r = ctl("{\"v\":1,\"cmd\":\"tag\",\"tag\":\"bad name!\"}");
  CHECK(is_error(r, "EINVAL"), "a bad tag name is refused: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  CHECK(strstr(r, "\"process_tag\":\"phase2\"") != NULL, "and changes nothing");

  /* sleep and wake a tag the threads do not use, while they run */
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"idle\",\"mode\":\"host\"}");
  CHECK(is_ok(r) && json_num(r, "released") >= (long long)in && json_num(r, "to_host") >= (long long)in,
        "sleep idle host: %s", r);
  CHECK(mapped_as(idle, in) == -1, "idle is off the device");
  vmmshim_tag_stats_t ts = tag_stats("idle", NULL);
  CHECK(ts.asleep && ts.host_copied >= in, "idle asleep, copied to the host");
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"idle\"}");
  CHECK(is_error(r, "EALREADY"), "sleeping it again: EALREADY: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"idle\"}");
  CHECK(is_ok(r) && json_num(r, "restored") >= (long long)in, "wake idle: %s", r);
  CHECK(mapped_as(idle, in) == 0 && pat_check_sparse(idle, in, 77) == (size_t)-1, "idle back, bytes intact");
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"idle\"}");
  CHECK(is_error(r, "EALREADY"), "waking it again: EALREADY: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"idle\",\"mode\":\"discard\"}");
  CHECK(is_ok(r) && json_num(r, "discarded") >= (long long)in, "sleep idle discard: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"idle\",\"zero\":true}");
  int zeros = is_ok(r);
  for (size_t i = 0; zeros && i < in; i += 4096) zeros = idle[i] == 0;
  CHECK(zeros, "wake zero: discarded bytes are zeros: %s", r);
  pat_fill_sparse(idle, in, 78);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"idle\",\"mode\":\"mapped\"}");
  CHECK(is_ok(r) && json_num(r, "host_mapped") >= (long long)in && mapped_as(idle, in) == 1 &&
            pat_check_sparse(idle, in, 78) == (size_t)-1,
        "sleep idle mapped: served from host memory at the same address: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"idle\"}");
  CHECK(is_ok(r) && mapped_as(idle, in) == 0 && pat_check_sparse(idle, in, 78) == (size_t)-1, "wake: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"nosuch\"}");
  CHECK(is_error(r, "ENOENT"), "an unknown tag: ENOENT: %s", r);

  /* trim */
  r = ctl("{\"v\":1,\"cmd\":\"trim\"}");
  CHECK(is_ok(r) && json_num(r, "released") >= 0, "trim: %s", r);

  /* limit: below what is mapped, growth is refused and nothing live moves; none lifts it */
  CHECK(workers_pause(), "the threads hold still");
  r = ctl("{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"1G\"}");
  CHECK(is_ok(r) && json_num(r, "limit") == 1ll << 30 && json_num(r, "previous") == 0, "limit 1G: %s", r);
  size_t fr = 0, tot = 0;
  CHECK(cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot == 1ull << 30 && fr <= tot,
        "cudaMemGetInfo answers the new limit: total %zu", tot);
  r = ctl("{\"v\":1,\"cmd\":\"limit\",\"bytes\":1048576}");
  CHECK(is_ok(r) && json_num(r, "limit") == 1 << 20 && strstr(r, "\"note\":"), "limit 1M, below what is mapped: %s",
        r);
  void *big = NULL;
  CHECK(cudaMalloc(&big, 256 * MiB) == cudaErrorMemoryAllocation, "growth past the limit is refused");
  CHECK(mapped_as(idle, in) == 0 && pat_check_sparse(idle, in, 78) == (size_t)-1, "live memory untouched");
  r = ctl("{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"none\"}");
  CHECK(is_ok(r) && json_num(r, "limit") == 0 && json_num(r, "previous") == 1 << 20, "limit none: %s", r);
  big = NULL;
  CHECK(cudaMalloc(&big, 256 * MiB) == cudaSuccess && big, "growth works again");
  if (big) cudaFree(big);
  workers_resume();

  /* dump and release-host */
  r = ctl("{\"v\":1,\"cmd\":\"dump\"}");
  CHECK(is_ok(r) && strstr(r, "memory report") && strstr(r, "device 0: live"), "dump brings the report back: %.200s",
        r);
  uint64_t in_use = 0, cached = 0;
  p_host_memory(&in_use, &cached);
  r = ctl("{\"v\":1,\"cmd\":\"release-host\",\"keep\":0}");
  CHECK(is_ok(r) && cached > 0 && json_num(r, "released") == (long long)cached && json_num(r, "cached") == 0,
        "release-host gives back the %llu bytes kept: %s", (unsigned long long)cached, r);

  /* the Python client, the same verbs */
  char pid[16];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  if (!g_client[0]) {
    CHECK(0, "scripts/python/vmmshim_ctl.py not found from the working directory or the test's path");
  } else {
    int rc = client(WORDS(pid, "status", "--json"));
    CHECK(rc == 0 && strstr(g_client_out, want), "client status --json: exit %d: %.200s", rc, g_client_out);
    rc = client(WORDS(pid, "status"));
    CHECK(rc == 0 && strstr(g_client_out, "idle") && strstr(g_client_out, "device 0: live"), "client status: %d: %.300s",
          rc, g_client_out);
    rc = client(WORDS("list"));
    CHECK(rc == 0 && strstr(g_client_out, pid), "client list names us: %d: %s", rc, g_client_out);
    rc = client(WORDS(pid, "tag", "phase3"));
    CHECK(rc == 0 && strstr(g_client_out, "'phase3' (was 'phase2')"), "client tag: %d: %s", rc, g_client_out);
    rc = client(WORDS(pid, "sleep", "idle", "--mode", "host"));
    CHECK(rc == 0 && strstr(g_client_out, "sleep idle (host): released "), "client sleep: %d: %s", rc,
          g_client_out);
    CHECK(mapped_as(idle, in) == -1, "asleep");
    rc = client(WORDS(pid, "sleep", "idle"));
    CHECK(rc == 0 && strstr(g_client_out, "nothing to do"), "client sleep again: nothing to do, exit 0: %d: %s", rc,
          g_client_out);
    rc = client(WORDS(pid, "wake", "idle"));
    CHECK(rc == 0 && strstr(g_client_out, "restored ") && pat_check_sparse(idle, in, 78) == (size_t)-1,
          "client wake: %d: %s", rc, g_client_out);
    rc = client(WORDS(pid, "sleep", "nosuch"));
    CHECK(rc == 1 && strstr(g_client_out, "ENOENT"), "client sleep of an unknown tag: exit 1: %d: %s", rc,
          g_client_out);
    rc = client(WORDS(pid, "trim"));
    CHECK(rc == 0 && strstr(g_client_out, "trim: gave back"), "client trim: %d: %s", rc, g_client_out);
    rc = client(WORDS(pid, "limit", "2G"));
    CHECK(rc == 0 && strstr(g_client_out, "limit 2.00 GiB (was none)"), "client limit: %d: %s", rc, g_client_out);
    rc = client(WORDS(pid, "limit", "none"));
    CHECK(rc == 0 && strstr(g_client_out, "limit none (was 2.00 GiB)"), "client limit none: %d: %s", rc,
          g_client_out);
    rc = client(WORDS(pid, "dump"));
    CHECK(rc == 0 && strstr(g_client_out, "memory report"), "client dump: %d: %.200s", rc, g_client_out);
    rc = client(WORDS(pid, "release-host"));
    CHECK(rc == 0 && strstr(g_client_out, "release-host: gave back"), "client release-host: %d: %s", rc,
          g_client_out);
  }

  /* two controllers at once */
  pthread_t a, b;
  pthread_create(&a, NULL, controller_status, NULL);
  pthread_create(&b, NULL, controller_sleep, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  CHECK(atomic_load(&g_two_bad) == 0, "two controllers at once: every reply ok (%d not)", atomic_load(&g_two_bad));
  CHECK(pat_check_sparse(idle, in, 78) == (size_t)-1, "idle intact after 25 cycles from the second controller");
  workers_stop("verbs");

  /* every tag, and the levels, once the threads are done */
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"mode\":\"host\"}");
  CHECK(is_ok(r) && mapped_as(idle, in) == -1, "sleep --all: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"all\":true}");
  CHECK(is_ok(r) && pat_check_sparse(idle, in, 78) == (size_t)-1, "wake --all: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"level\":1,\"mode\":\"mapped\"}");
  CHECK(is_ok(r) && mapped_as(idle, in) == 1 && strstr(r, "\"level\":1"), "sleep level 1 mapped: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"all\":true}");
  CHECK(is_ok(r) && mapped_as(idle, in) == 0 && pat_check_sparse(idle, in, 78) == (size_t)-1, "wake: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"level\":0}");
  CHECK(is_ok(r), "sleep level 0 (idle memory only): %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"idle\",\"level\":2}");
  CHECK(is_error(r, "EINVAL"), "a level with a tag is refused: %s", r);
  cudaFree(idle);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

/* ------------------------------------------------------------------ fuzz */

static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/* A malformed request of kind k into buf (no newline); its length. Each kind is refused. */
static size_t malformed(unsigned long long *seed, char *buf, size_t cap) {
  static const char *const fixed[] = {
      "",
      "   ",
      "{",
      "}",
      "[]",
      "null",
      "\"status\"",
      "{\"v\":1}",
      "{\"cmd\":\"status\"}",
      "{\"v\":\"1\",\"cmd\":\"status\"}",
      "{\"v\":2,\"cmd\":\"status\"}",
      "{\"v\":0,\"cmd\":\"status\"}",
      "{\"v\":-1,\"cmd\":\"status\"}",
      "{\"v\":1.0,\"cmd\":\"status\"}",
      "{\"v\":1,\"cmd\":7}",
      "{\"v\":1,\"cmd\":null}",
      "{\"v\":1,\"cmd\":\"stat\"}",
      "{\"v\":1,\"cmd\":\"STATUS\"}",
      "{\"v\":1,\"cmd\":\"status\"} x",
      "{\"v\":1,\"cmd\":\"status\"}}",
      "{\"v\":1,\"cmd\":\"status\",}",
      "{\"v\":1,,\"cmd\":\"status\"}",
      "{\"v\":1 \"cmd\":\"status\"}",
      "{\"v\":1,\"cmd\":\"status\",\"v\":1}",
      "{\"v\":1,\"cmd\":\"tag\"}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":7}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":true}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"\"}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"a b\"}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"0123456789012345678901234567890123\"}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":[\"kv\"]}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":{\"name\":\"kv\"}}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"k\\u0000v\"}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"kv\\q\"}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"kv}",
      "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"\xc3\xa9t\xc3\xa9\"}",
      "{\"v\":1,\"cmd\":\"sleep\"}",
      "{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"weights\",\"all\":true}",
      "{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"weights\",\"mode\":\"bogus\"}",
      "{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"weights\",\"mode\":1}",
      "{\"v\":1,\"cmd\":\"sleep\",\"all\":\"yes\"}",
      "{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"level\":3}",
      "{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"level\":\"1\"}",
      "{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"level\":2,\"mode\":\"host\"}",
      "{\"v\":1,\"cmd\":\"sleep\",\"all\":true,\"level\":1,\"mode\":\"discard\"}",
      "{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"kv\",\"level\":1}",
      "{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"nosuchtag\"}",
      "{\"v\":1,\"cmd\":\"wake\",\"tag\":\"weights\",\"zero\":1}",
      "{\"v\":1,\"cmd\":\"wake\",\"tag\":\"nosuchtag\"}",
      "{\"v\":1,\"cmd\":\"wake\"}",
      "{\"v\":1,\"cmd\":\"limit\"}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":-5}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"-5\"}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"1.5G\"}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"lots\"}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":true}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":99999999999999999999999}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":1e9}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":007}",
      "{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"99999999999T\"}",
      "{\"v\":1,\"cmd\":\"release-host\",\"keep\":\"x\"}",
      "{\"v\":1,\"cmd\":\"release-host\",\"keep\":-1}",
      "{\"v\":1,\"cmd\":\"status\",\"a\":1,\"b\":1,\"c\":1,\"d\":1,\"e\":1,\"f\":1,\"g\":1,\"h\":1,\"i\":1,\"j\":1,"
      "\"k\":1,\"l\":1,\"m\":1,\"n\":1,\"o\":1}",
      "{\"v\":1,\"cmd\":\"status\",\"a_key_that_is_far_too_long_to_be_a_key\":1}",
      "{\"v\":1,\"cmd\":\"status\",\"x\":tru}",
      "{\"v\":1,\"cmd\":\"status\",\"x\":-}",
      "{\"v\":1,\"cmd\":\"status\",\"x\":\"\\u12\"}",
      "{\"v\":1,\"cmd\":\"status\",\"x\":\"\\u00e9\"}",
      "{\"v\":1,\"cmd\":\"status\",\"x\":\"tab\there\"}",
      "{\"v\":1,\"cmd\":\"status\"\x01}",
  };
  const size_t nfixed = sizeof fixed / sizeof fixed[0];
  unsigned kind = (unsigned)(rnd_next(seed) % 8);
  if (kind < 4) { /* a fixed one */
    const char *s = fixed[rnd_next(seed) % nfixed];
    size_t n = strlen(s);
    memcpy(buf, s, n);
    return n;
  }
  if (kind == 4) { /* random bytes, no newline */
    size_t n = 1 + rnd_next(seed) % 200;
    for (size_t i = 0; i < n; i++) {
      buf[i] = (char)(rnd_next(seed) & 0xff);
      if (buf[i] == '\n') buf[i] = ' ';
    }
    if (buf[0] == '{') buf[0] = '(';
    return n;
  }
  if (kind == 5) { /* a valid request cut short */
    const char *s = "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"fuzzed\"}";
    size_t n = 1 + rnd_next(seed) % (strlen(s) - 1);
    memcpy(buf, s, n);
    return n;
  }
  if (kind == 6) { /* nesting */
    size_t depth = 1 + rnd_next(seed) % 1000, n = 0;
    n += (size_t)snprintf(buf, cap, "{\"v\":1,\"cmd\":\"status\",\"x\":");
    for (size_t i = 0; i < depth && n + 2 < cap; i++) buf[n++] = '[';
    return n;
  }
  /* a valid request with one byte changed into a quote, brace, bracket, colon, comma or backslash:
   * none of them is valid in a tag name, and every other change breaks the JSON or the verb */
  const char *s = "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"k-v\"}";
  size_t n = strlen(s);
  memcpy(buf, s, n);
  size_t at = rnd_next(seed) % n;
  static const char junk[] = "\"{}[]:,\\";
  char c = junk[rnd_next(seed) % (sizeof junk - 1)];
  if (buf[at] == c) c = buf[at] == '"' ? '{' : '"';
  buf[at] = c;
  return n;
}

typedef struct fuzz_tally_s {
  int sent, refused, accepted, no_reply;
} fuzz_tally_t;

/* One connection: `count` malformed lines, then (for some) a last one cut off by the end of the
 * connection. Every line must get an error reply. */
static void fuzz_connection(unsigned long long *seed, int count, bool cut, fuzz_tally_t *t) {
  int fd = ctl_connect(getpid(), geteuid());
  if (fd < 0) {
    t->no_reply += count;
    return;
  }
  char req[8192], reply[4096];
  for (int i = 0; i < count + (cut ? 1 : 0); i++) {
    size_t n = malformed(seed, req, sizeof req - 1);
    bool last_cut = cut && i == count;
    if (last_cut && n == 0) req[n++] = '{'; /* an empty cut request would be no request at all */
    if (!last_cut) req[n++] = '\n';
    t->sent++;
    if (send_all(fd, req, n) != 0) {
      t->no_reply++;
      break;
    }
    if (last_cut) shutdown(fd, SHUT_WR);
    if (read_line(fd, reply, sizeof reply) < 0) {
      t->no_reply++;
      break;
    }
    if (strncmp(reply, "{\"v\":1,\"ok\":false", 17) == 0) {
      t->refused++;
    } else {
      t->accepted++;
      if (t->accepted < 5) printf("accepted: %.*s -> %s\n", (int)(n > 200 ? 200 : n), req, reply);
    }
  }
  close(fd);
}

/* A line longer than the server takes: refused, then closed. */
static int fuzz_huge(size_t len) {
  int fd = ctl_connect(getpid(), geteuid());
  if (fd < 0) return 0;
  char *big = malloc(len + 1);
  memset(big, 'x', len);
  big[0] = '{';
  big[len] = '\n';
  send_all(fd, big, len + 1); /* may fail once the server has closed: what it sent is still there */
  char reply[4096];
  int ok = read_line(fd, reply, sizeof reply) > 0 && strstr(reply, "\"error\":\"E2BIG\"") != NULL &&
           read_line(fd, reply, sizeof reply) < 0;
  free(big);
  close(fd);
  return ok;
}

static void scenario_fuzz(void) {
  cudaSetDevice(0);
  char *w = tagged_malloc("weights", 8 * MiB);
  if (!w) return;
  pat_fill_sparse(w, 8 * MiB, 5);
  const char *r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  CHECK(is_ok(r), "status before: %.100s", r);
  workers_start();
  workers_progress(1000);
  int ntags0 = 0;
  tag_stats("untagged", &ntags0);
  /* The baseline after a first round (the server's first connection, the log, stdio buffers). */
  unsigned long long seed = 12345;
  fuzz_tally_t t = {0, 0, 0, 0};
  fuzz_connection(&seed, 20, true, &t);
  CHECK(workers_pause(), "the threads hold still");
  sleep_ms(50);
  int fds0 = open_sockets();
  size_t heap0 = heap_in_use();
  workers_resume();

  double t0 = now_s();
  memset(&t, 0, sizeof t);
  int ok_between = 0, checks = 0;
  while (t.sent < 10000) {
    fuzz_connection(&seed, 50, (t.sent / 50) % 3 == 0, &t);
    if ((t.sent / 50) % 20 == 0) {
      checks++;
      ok_between += is_ok(ctl("{\"v\":1,\"cmd\":\"status\"}"));
    }
  }
  double took = now_s() - t0;
  CHECK(t.refused == t.sent && t.accepted == 0 && t.no_reply == 0,
        "%d malformed requests: %d refused with an error reply, %d accepted, %d without a reply (%.2f s)", t.sent,
        t.refused, t.accepted, t.no_reply, took);
  CHECK(ok_between == checks, "valid requests in between are answered (%d of %d)", ok_between, checks);
  int huge = fuzz_huge(5000) + fuzz_huge(1 << 20);
  CHECK(huge == 2, "a line over 4096 bytes (5000, 1 MiB): E2BIG, then closed (%d of 2)", huge);

  /* A silent client, one that stops inside a request, and one that never reads its replies: the
   * others and the threads go on at once. */
  int silent = ctl_connect(getpid(), geteuid());
  int partial = ctl_connect(getpid(), geteuid());
  int deaf = ctl_connect(getpid(), geteuid());
  send_all(partial, "{\"v\":1,\"cmd\":", 13);
  int one = 1;
  setsockopt(deaf, SOL_SOCKET, SO_RCVBUF, &one, sizeof one);
  fcntl(deaf, F_SETFL, O_NONBLOCK);
  int deaf_sent = 0;
  for (int i = 0; i < 4000; i++) {
    if (send(deaf, "{\"v\":1,\"cmd\":\"status\"}\n", 23, MSG_NOSIGNAL) != 23) break;
    deaf_sent++;
  }
  unsigned long long a0 = workers_allocs();
  t0 = now_s();
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  double answered = now_s() - t0;
  CHECK(is_ok(r) && answered < 1.0, "beside a silent, a half-sent and a deaf client: answered in %.3f s (deaf client "
        "sent %d requests)", answered, deaf_sent);
  workers_progress(500);
  CHECK(workers_allocs() > a0 + 100, "the threads allocate meanwhile");
  /* A full house: a new connection takes the slot of the oldest one idle between requests (the
   * silent one); when every slot holds a request begun, the next is refused with a reason. */
  int extra[8], nextra = 0;
  for (int i = 0; i < 5; i++) extra[nextra++] = ctl_connect(getpid(), geteuid());
  sleep_ms(100);
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  char reply[512];
  struct timeval tmo = {5, 0};
  setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo);
  CHECK(is_ok(r) && read_line(silent, reply, sizeof reply) < 0,
        "a 9th connection at once is served; the oldest idle one is closed for it: %.80s", r);
  for (int i = 0; i < nextra; i++)
    if (extra[i] >= 0) close(extra[i]);
  close(silent);
  close(partial);
  close(deaf);
  sleep_ms(200);
  int busy[8];
  for (int i = 0; i < 8; i++) {
    busy[i] = ctl_connect(getpid(), geteuid());
    if (busy[i] >= 0) send_all(busy[i], "{\"v\":1,", 7);
  }
  sleep_ms(200);
  int over = ctl_connect(getpid(), geteuid());
  reply[0] = 0;
  CHECK(over >= 0 && read_line(over, reply, sizeof reply) > 0 && strstr(reply, "\"error\":\"EBUSY\""),
        "with 8 requests begun, a 9th connection is refused: %s", reply);
  if (over >= 0) close(over);
  for (int i = 0; i < 8; i++)
    if (busy[i] >= 0) close(busy[i]);

  /* Nothing changed, nothing leaked (once the server has seen the busy ones close). */
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  for (int i = 0; i < 100 && is_error(r, "EBUSY"); i++, sleep_ms(50)) r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  int ntags = 0;
  tag_stats("untagged", &ntags);
  CHECK(is_ok(r) && strstr(r, "\"process_tag\":\"untagged\"") && json_num(r, "limit") == 0 && ntags == ntags0 &&
            !any_asleep(),
        "nothing changed: process tag, limit, %d tags (%d before), nothing asleep: %.300s", ntags, ntags0, r);
  CHECK(pat_check_sparse(w, 8 * MiB, 5) == (size_t)-1, "the weights are intact");
  CHECK(workers_pause(), "the threads hold still");
  int fds = -1;
  for (int i = 0; i < 200 && (fds = open_sockets()) != fds0; i++) sleep_ms(10); /* the server closes its ends */
  size_t heap = heap_in_use();
  CHECK(fds == fds0, "sockets: %d before, %d after", fds0, fds);
  CHECK(heap <= heap0 + (256 << 10), "heap in use: %zu before, %zu after 10,000 requests", heap0, heap);
  workers_resume();
  workers_stop("fuzz");
  cudaFree(w);
}

/* ------------------------------------------------------------------ other users */

static bool nobody(uid_t *uid, gid_t *gid) {
  struct passwd *pw = getpwnam("nobody");
  if (!pw) return false;
  *uid = pw->pw_uid;
  *gid = pw->pw_gid;
  return true;
}

static void scenario_users(void) {
  uid_t nb;
  gid_t ng;
  if (geteuid() != 0 || !nobody(&nb, &ng)) {
    if (getenv("CI") && !strcmp(getenv("CI"), "true"))
      CHECK(0, "the check of other users needs root and a user nobody (CI=true: counted as a failure)");
    else
      printf("SKIP users: needs root and a user nobody; not counted\n");
    return;
  }
  cudaSetDevice(0);
  void *w = tagged_malloc("weights", 4 * MiB);
  const char *r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  CHECK(is_ok(r), "root controls its own process");
  /* a process of user nobody connects: one error line, then the end */
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe");
  pid_t me = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char verdict = 'x';
    if (setgroups(0, NULL) == 0 && setgid(ng) == 0 && setuid(nb) == 0) {
      int fd = ctl_connect(me, 0);
      char line[512] = "";
      if (fd >= 0) send_all(fd, "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"stolen\"}\n", 35); /* refused before it is read */
      if (fd < 0) verdict = 'c';
      else if (read_line(fd, line, sizeof line) > 0 && strstr(line, "\"error\":\"EPERM\"") &&
               read_line(fd, line, sizeof line) < 0)
        verdict = 'r';
      else verdict = 'a';
    }
    if (write(fds[1], &verdict, 1) != 1) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  char verdict = 0;
  if (read(fds[0], &verdict, 1) != 1) verdict = 0;
  close(fds[0]);
  waitpid(pid, NULL, 0);
  CHECK(verdict == 'r', "user nobody is refused: EPERM, then closed (%c)", verdict ? verdict : '?');
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  CHECK(strstr(r, "\"process_tag\":\"untagged\"") && !strstr(r, "stolen"), "and changed nothing");
  char spid[16];
  snprintf(spid, sizeof spid, "%d", (int)me);
  if (g_client[0]) {
    int rc = client_as(nb, ng, WORDS(spid, "status"));
    CHECK(rc == 5 && strstr(g_client_out, "belongs to user 0"), "the client run by nobody: exit 5: %d: %s", rc,
          g_client_out);
    /* root controls a program of user nobody */
    int sync[2], hold[2];
    CHECK(pipe(sync) == 0 && pipe(hold) == 0, "pipes");
    pid_t prog = fork();
    if (prog == 0) {
      close(sync[0]);
      close(hold[1]);
      dup2(sync[1], 1);
      dup2(hold[0], 0); /* it serves until its input ends */
      if (setgroups(0, NULL) != 0 || setgid(ng) != 0 || setuid(nb) != 0) _exit(120);
      char *args[] = {(char *)"child", (char *)"serve", NULL};
      execv("/proc/self/exe", args);
      _exit(127);
    }
    close(sync[1]);
    close(hold[0]);
    char line[256] = "";
    FILE *in = fdopen(sync[0], "r");
    int got = in && fgets(line, sizeof line, in) && !strncmp(line, "ready ", 6);
    CHECK(got, "a program of user nobody runs under the shim: %s", line);
    snprintf(spid, sizeof spid, "%d", (int)prog);
    rc = got ? client(WORDS(spid, "status", "--json")) : -1;
    CHECK(rc == 0 && strstr(g_client_out, "\"uid\":"), "root controls it: %d: %.200s", rc, g_client_out);
    rc = got ? client(WORDS(spid, "sleep", "weights")) : -1;
    CHECK(rc == 0 && strstr(g_client_out, "released"), "root sleeps its tag: %d: %s", rc, g_client_out);
    close(hold[1]);
    waitpid(prog, NULL, 0);
    if (in) fclose(in);
  }
  cudaFree(w);
}

/* ------------------------------------------------------------------ the server */

/* Whether s (n bytes) is valid UTF-8: no overlong form, surrogate or code point past U+10FFFF. */
static bool valid_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    unsigned len = c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
    if (!len || i + len > n) return false;
    unsigned cp = len == 1 ? c : c & (0x7fu >> len);
    for (unsigned k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = cp << 6 | (s[i + k] & 0x3fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

/* A client that sends a request one byte every 0.2 s: whether the server closed it (an error
 * line, then the end) within `bound` seconds. */
static bool trickle_closed(double bound) {
  int fd = ctl_connect(getpid(), geteuid());
  if (fd < 0) return false;
  const char *req = "{\"v\":1,\"cmd\":\"status\"                                                            ";
  bool closed = false;
  double t0 = now_s();
  for (size_t i = 0; !closed && now_s() - t0 < bound; i = (i + 1) % strlen(req)) {
    closed = send(fd, req + i, 1, MSG_NOSIGNAL) != 1;
    struct pollfd p = {fd, POLLIN, 0};
    if (!closed && poll(&p, 1, 200) == 1) {
      char line[512];
      closed = read_line(fd, line, sizeof line) < 0 ||
               (strstr(line, "\"error\":\"ETIMEDOUT\"") && read_line(fd, line, sizeof line) < 0);
    }
  }
  close(fd);
  return closed;
}

static atomic_int g_flood_stop;

/* Connections of this user, opened in a loop (one a millisecond) and kept idle (the 40 newest). */
static void *flood_idle(void *arg) {
  int *opened = arg, keep[40];
  for (int i = 0; i < 40; i++) keep[i] = -1;
  for (int i = 0; !atomic_load(&g_flood_stop); i = (i + 1) % 40) {
    if (keep[i] >= 0) close(keep[i]);
    keep[i] = ctl_connect(getpid(), geteuid());
    *opened += keep[i] >= 0;
    sleep_ms(1);
  }
  for (int i = 0; i < 40; i++)
    if (keep[i] >= 0) close(keep[i]);
  return NULL;
}

/* A process of user nobody connecting in a loop until stopped (SIGTERM). */
static pid_t flood_foreign(void) {
  uid_t nb;
  gid_t ng;
  if (geteuid() != 0 || !nobody(&nb, &ng)) return -1;
  pid_t me = getpid(), pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(ng) != 0 || setuid(nb) != 0) _exit(120);
    for (;;) {
      int fd = ctl_connect(me, 0);
      if (fd >= 0) close(fd);
    }
  }
  return pid;
}

static void scenario_server(void) {
  cudaSetDevice(0);
  void *w = tagged_malloc("weights", 4 * MiB);
  CHECK(is_ok(ctl("{\"v\":1,\"cmd\":\"status\"}")), "status");
  /* a trickle does not extend the deadline of its request (5 s from its first byte) */
  double t0 = now_s();
  CHECK(trickle_closed(20), "a client sending one byte every 0.2 s is closed by its deadline (%.1f s)", now_s() - t0);
  /* the owner's requests succeed while connections of its own user pile up idle, and while
   * another user connects in a loop */
  pthread_t t;
  int opened = 0, ok = 0;
  atomic_store(&g_flood_stop, 0);
  pid_t foreign = flood_foreign();
  pthread_create(&t, NULL, flood_idle, &opened);
  sleep_ms(300);
  for (int i = 0; i < 60; i++) ok += is_ok(ctl("{\"v\":1,\"cmd\":\"status\"}"));
  atomic_store(&g_flood_stop, 1);
  pthread_join(t, NULL);
  if (foreign > 0) {
    kill(foreign, SIGTERM);
    waitpid(foreign, NULL, 0);
  }
  printf("the flood: %d idle connections of this user%s\n", opened, foreign > 0 ? ", user nobody in a loop" : "");
  CHECK(ok == 60, "60 requests of the owner beside %d idle connections of its user%s: %d answered", opened,
        foreign > 0 ? " and a user connecting in a loop" : "", ok);
  /* replies are UTF-8, whatever bytes the request has */
  const char *bad[] = {"{\"v\":1,\"cmd\":\"caf\xe9\xff\xc0\xaf\"}",
                       "{\"v\":1,\"cmd\":\"tag\",\"tag\":\"\xc3\x28\xed\xa0\x80\"}",
                       "{\"v\":1,\"id\":\"\xf4\x90\x80\x80\xe2\x82\",\"cmd\":\"status\"}"};
  for (int i = 0; i < 3; i++) {
    const char *r = ctl(bad[i]);
    CHECK(r[0] && valid_utf8((const unsigned char *)r, strlen(r)) && strstr(r, "\\ufffd"),
          "a request with bytes that are not UTF-8 (%d): the reply is UTF-8: %.200s", i, r);
  }
  const char *r = ctl("{\"v\":1,\"id\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\",\"cmd\":\"status\"}");
  CHECK(is_ok(r) && strstr(r, "\"id\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""),
        "UTF-8 is quoted as it is: %.80s", r);
  /* a limit of 2^64-1 is stored and reported as given */
  r = ctl("{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"18446744073709551615\"}");
  CHECK(is_ok(r) && strstr(r, "\"limit\":18446744073709551615,"), "limit 2^64-1: %.120s", r);
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  CHECK(strstr(r, "\"limit\":18446744073709551615,") != NULL, "status reports the limit 2^64-1");
  r = ctl("{\"v\":1,\"cmd\":\"limit\",\"bytes\":\"none\"}");
  CHECK(is_ok(r) && strstr(r, "\"previous\":18446744073709551615,") &&
            json_num(ctl("{\"v\":1,\"cmd\":\"status\"}"), "limit") == 0,
        "and none lifts it: %.120s", r);
  cudaFree(w);
}

#ifndef CONTROL_STATIC
/* The server scenario's log (VMMSHIM_LOG=info): refusals said a bounded number of times. */
static void server_output(void) {
  int said = check_count(check_child_output, "asked to control this process");
  int shown = check_count(check_child_output, "control: ");
  CHECK(said <= 10 && shown <= 40, "refusals at VMMSHIM_LOG=info: %d lines of another user's, %d of the channel's",
        said, shown);
}
#endif

/* ------------------------------------------------------------------ dead, foreign, exiting */

/* The program of the exit scenario: a tag, a capture in progress (a sleep waits for it), then it
 * says ready and exits when told. */
static int run_exiter(void) {
  cudaSetDevice(0);
  void *w = tagged_malloc("weights", 4 * MiB);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  const char *r = ctl("{\"v\":1,\"cmd\":\"status\"}"); /* the channel is up */
  printf("%s %d\n", is_ok(r) && w ? "ready" : "broken", (int)getpid());
  fflush(stdout);
  char c;
  if (read(0, &c, 1) < 0) return 1;
  exit(0); /* at once, with a sleep of ours in progress */
}

typedef struct exiter_s {
  pid_t pid;
  int to, from; /* its standard input and output */
} exiter_t;

static bool exiter_start(exiter_t *x, const char *sleep_wait) {
  int in[2], out[2];
  if (pipe(in) || pipe(out)) return false;
  x->pid = fork();
  if (x->pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    setenv("VMMSHIM_SLEEP_WAIT", sleep_wait, 1);
    char *args[] = {(char *)"child", (char *)"exiter", NULL};
    execv("/proc/self/exe", args);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  x->to = in[1];
  x->from = out[0];
  char line[64] = "";
  ssize_t n = read(x->from, line, sizeof line - 1);
  line[n > 0 ? n : 0] = 0;
  return !strncmp(line, "ready ", 6);
}

static int exiter_end(exiter_t *x) {
  if (write(x->to, "q", 1) != 1) return -1;
  int st = 0;
  waitpid(x->pid, &st, 0);
  close(x->to);
  close(x->from);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Waits until the program's server is in the middle of a request (answers one at a time: a status
 * asked on another connection gets no reply within 200 ms), for up to 20 s. Rather than a fixed
 * pause: a client started under load may take long to send its request. */
static bool server_busy(pid_t pid) {
  double until = now_s() + 20;
  while (now_s() < until) {
    int fd = ctl_connect(pid, geteuid());
    if (fd < 0) return false;
    struct pollfd p = {fd, POLLIN, 0};
    bool answered = send_all(fd, "{\"v\":1,\"cmd\":\"status\"}\n", 23) == 0 && poll(&p, 1, 200) > 0;
    close(fd);
    if (!answered) return true;
    sleep_ms(50);
  }
  return false;
}

static void scenario_gone(void) {
  if (!g_client[0]) {
    CHECK(0, "scripts/python/vmmshim_ctl.py not found");
    return;
  }
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  char spid[16];
  snprintf(spid, sizeof spid, "%d", (int)dead);
  int rc = client(WORDS(spid, "status"));
  CHECK(rc == 3 && strstr(g_client_out, "no process"), "a dead pid: exit 3: %d: %s", rc, g_client_out);
  CHECK(ctl_connect(dead, geteuid()) < 0, "nothing listens for it");
  /* this process has not used CUDA: not under the shim for the client */
  snprintf(spid, sizeof spid, "%d", (int)getpid());
  rc = client(WORDS(spid, "status"));
  CHECK(rc == 4 && strstr(g_client_out, "not under vmmshim"), "a process that has not used CUDA: exit 4: %d: %s", rc,
        g_client_out);

  /* a sleep during a stream capture: refused after VMMSHIM_SLEEP_WAIT, and said why */
  exiter_t x;
  CHECK(exiter_start(&x, "300"), "the program is ready (a capture in progress)");
  snprintf(spid, sizeof spid, "%d", (int)x.pid);
  double t0 = now_s();
  rc = client(WORDS(spid, "sleep", "weights"));
  double took = now_s() - t0;
  CHECK(rc == 1 && strstr(g_client_out, "EBUSY") && strstr(g_client_out, "stream capture is in progress") &&
            took >= 0.3,
        "a sleep during a capture: exit 1 after %.2f s, EBUSY and why: %s", took, g_client_out);
  CHECK(exiter_end(&x) == 0, "the program exits cleanly");

  /* the program exits while our request waits in it: the end is seen at once */
  CHECK(exiter_start(&x, "8000"), "the program is ready");
  int fd = ctl_connect(x.pid, geteuid());
  const char *req = "{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"weights\"}\n";
  CHECK(fd >= 0 && send_all(fd, req, strlen(req)) == 0, "request sent");
  CHECK(server_busy(x.pid), "the sleep waits for the capture (up to 8 s)");
  t0 = now_s();
  int st = exiter_end(&x);
  char reply[512];
  int n = fd >= 0 ? read_line(fd, reply, sizeof reply) : 0;
  took = now_s() - t0;
  CHECK(st == 0 && n < 0 && took < 3, "the program exits mid-request (status %d): the connection ends in %.2f s, no "
        "reply (%d)", st, took, n);
  if (fd >= 0) close(fd);

  CHECK(exiter_start(&x, "8000"), "the program is ready again");
  snprintf(spid, sizeof spid, "%d", (int)x.pid);
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe");
  pid_t c = client_spawn(fds[1], (uid_t)-1, (gid_t)-1, WORDS(spid, "sleep", "weights"));
  close(fds[1]);
  CHECK(server_busy(x.pid), "the client's sleep waits for the capture (up to 8 s)");
  t0 = now_s();
  st = exiter_end(&x);
  rc = client_wait(c, fds[0]);
  took = now_s() - t0;
  CHECK(st == 0 && rc == 7 && strstr(g_client_out, "exited before answering") && took < 3,
        "the client's program exits mid-request: exit 7 in %.2f s: %d: %s", took, rc, g_client_out);
}

/* VMMSHIM_CONTROL=0: CUDA in use, yet nothing listens and the client says so; the API works. */
static void scenario_off(void) {
  void *p = NULL;
  CHECK(cudaSetDevice(0) == cudaSuccess && cudaMalloc(&p, MiB) == cudaSuccess, "the shim serves an allocation");
  sleep_ms(100); /* a channel would be listening by now */
  CHECK(ctl_connect(getpid(), geteuid()) < 0, "no control socket");
  if (g_client[0]) {
    char spid[16];
    snprintf(spid, sizeof spid, "%d", (int)getpid());
    int rc = client(WORDS(spid, "status"));
    CHECK(rc == 4 && strstr(g_client_out, "VMMSHIM_CONTROL=0"), "the client: exit 4, and why: %d: %s", rc, g_client_out);
  }
  /* Where `vmmshim ctl list` looks: no name of this process there. */
  char name[64], line[512];
  snprintf(name, sizeof name, "@vmmshim-ctl-%u-%d\n", (unsigned)geteuid(), (int)getpid());
  FILE *f = fopen("/proc/net/unix", "r");
  bool listed = false, read_any = false;
  while (f && fgets(line, sizeof line, f)) {
    read_any = true;
    size_t n = strlen(line), m = strlen(name);
    listed |= n >= m && !strcmp(line + n - m, name);
  }
  if (f) fclose(f);
  CHECK(read_any && !listed, "not in /proc/net/unix (read %d)", read_any);
  cudaFree(p);
}

/* ------------------------------------------------------------------ serve */

static int run_serve(void) {
  cudaSetDevice(0);
  const size_t wn = 8 * MiB, kn = 4 * MiB;
  char *w = tagged_malloc("weights", wn), *k = tagged_malloc("kv", kn);
  if (!w || !k) return 1;
  pat_fill_sparse(w, wn, 1);
  pat_fill_sparse(k, kn, 2);
  void *extra[64];
  int nextra = 0;
  const char *r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  printf("%s %d\n", is_ok(r) ? "ready" : "broken", (int)getpid());
  fflush(stdout);
  char line[128];
  while (fgets(line, sizeof line, stdin)) {
    if (!strncmp(line, "check", 5)) {
      printf("weights %s kv %s\n", pat_check_sparse(w, wn, 1) == (size_t)-1 ? "ok" : "bad",
             mapped_as(k, kn) == 0 && pat_check_sparse(k, kn, 2) == (size_t)-1 ? "ok" : "bad");
    } else if (!strncmp(line, "alloc", 5) && nextra < 64) { /* "alloc [MiB]" */
      size_t mib = strtoul(line + 5, NULL, 10);
      printf("alloc %s\n", cudaMalloc(&extra[nextra], (mib ? mib : 1) * MiB) == cudaSuccess && ++nextra ? "ok" : "failed");
    } else if (!strncmp(line, "bytes", 5)) { /* the patterns alone, wherever kv is (device or host memory) */
      int kind = mapped_as(k, kn);
      printf("weights %s kv %s on %s\n", pat_check_sparse(w, wn, 1) == (size_t)-1 ? "ok" : "bad",
             kind >= 0 && pat_check_sparse(k, kn, 2) == (size_t)-1 ? "ok" : "bad",
             kind == 0 ? "device" : kind == 1 ? "host" : "nothing");
    } else if (!strncmp(line, "free", 4)) {
      printf("free %s\n", nextra > 0 && cudaFree(extra[--nextra]) == cudaSuccess ? "ok" : "failed");
    } else if (!strncmp(line, "touch", 5)) { /* a copy: GPU work, which waits at a closed gate */
      static CUdeviceptr scratch; /* made at the first touch: the tags' figures stay as they were */
      bool ok = scratch || cudaMalloc((void **)&scratch, 1) == cudaSuccess;
      printf("touch %s\n", ok && cuMemcpyDtoD_v2(scratch, (CUdeviceptr)w, 1) == CUDA_SUCCESS ? "ok" : "failed");
    } else if (!strncmp(line, "quit", 4)) {
      break;
    }
    fflush(stdout);
  }
  for (int i = 0; i < nextra; i++) cudaFree(extra[i]);
  cudaFree(w);
  cudaFree(k);
  return 0;
}

/* ------------------------------------------------------------------ conns, wakeone */

/* Exactly VS_CTL_MAX_CONNS (8) controllers at once: each of the 8 is served, and each is still
 * served once all 8 are open (none was closed to make room for a later one). A 9th is refused
 * with EBUSY, or served in the place of an idle one; after one leaves, a new one is served. */
static void scenario_conns(void) {
  cudaSetDevice(0);
  void *x = must_malloc(MiB); /* the shim starts its server as it first serves CUDA */
  int fd[9];
  static char reply[1 << 17]; /* a whole status reply */
  int served = 0, again = 0;
  for (int i = 0; i < 8; i++) {
    fd[i] = ctl_connect(getpid(), geteuid());
    reply[0] = 0;
    if (fd[i] >= 0 && send_all(fd[i], "{\"v\":1,\"cmd\":\"status\"}\n", 23) == 0) read_line(fd[i], reply, sizeof reply);
    if (is_ok(reply)) served++;
    else CHECK(0, "connection %d of 8 at once not served: %.200s", i + 1, reply);
  }
  CHECK(served == 8, "8 controllers at once served (%d)", served);
  for (int i = 0; i < 8; i++) {
    reply[0] = 0;
    if (fd[i] >= 0 && send_all(fd[i], "{\"v\":1,\"cmd\":\"status\"}\n", 23) == 0) read_line(fd[i], reply, sizeof reply);
    if (is_ok(reply)) again++;
    else CHECK(0, "connection %d of 8 no longer served once all 8 are open: %.200s", i + 1, reply);
  }
  CHECK(again == 8, "all 8 still served together (%d)", again);
  fd[8] = ctl_connect(getpid(), geteuid());
  reply[0] = 0;
  if (fd[8] >= 0) { /* a refusal comes unasked; a connection served answers its request */
    struct pollfd p = {fd[8], POLLIN, 0};
    if (poll(&p, 1, 500) <= 0) send_all(fd[8], "{\"v\":1,\"cmd\":\"status\"}\n", 23);
    read_line(fd[8], reply, sizeof reply);
  }
  CHECK(fd[8] >= 0 && (strstr(reply, "\"error\":\"EBUSY\"") || is_ok(reply)),
        "the 9th is refused with EBUSY or served in an idle one's place: %s", reply);
  if (fd[8] >= 0) close(fd[8]);
  close(fd[0]);
  /* the server sees the close when it polls next: a new controller is served once it has */
  const char *r = "";
  for (int tries = 0; tries < 100 && !is_ok(r); tries++) {
    r = ctl("{\"v\":1,\"cmd\":\"status\"}");
    if (!is_ok(r)) sleep_ms(20);
  }
  CHECK(is_ok(r), "a controller after one left is served: %.200s", r);
  for (int i = 1; i < 8; i++)
    if (fd[i] >= 0) close(fd[i]);
  cudaFree(x);
}

/* A wake of one tag wakes that tag only. */
static void scenario_wakeone(void) {
  cudaSetDevice(0);
  size_t n = 8 * MiB;
  char *a = tagged_malloc("first", n), *b = tagged_malloc("second", n);
  if (!a || !b) return;
  pat_fill_sparse(a, n, 81);
  pat_fill_sparse(b, n, 82);
  const char *r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"first\",\"mode\":\"host\"}");
  CHECK(is_ok(r), "sleep first: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"sleep\",\"tag\":\"second\",\"mode\":\"host\"}");
  CHECK(is_ok(r), "sleep second: %s", r);
  CHECK(mapped_as(a, n) == -1 && mapped_as(b, n) == -1, "both asleep");
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"first\"}");
  CHECK(is_ok(r) && json_num(r, "restored") >= (long long)n, "wake first: %s", r);
  CHECK(mapped_as(a, n) == 0 && pat_check_sparse(a, n, 81) == (size_t)-1, "first awake and intact");
  CHECK(mapped_as(b, n) == -1 && tag_stats("second", NULL).asleep, "the wake of first left second asleep");
  r = ctl("{\"v\":1,\"cmd\":\"wake\",\"tag\":\"second\"}");
  CHECK(is_ok(r) && mapped_as(b, n) == 0 && pat_check_sparse(b, n, 82) == (size_t)-1, "wake second: %s", r);
  cudaFree(a);
  cudaFree(b);
}

/* ------------------------------------------------------------------ main */

static void run_scenario(const char *name) {
  if (!strcmp(name, "verbs")) scenario_verbs();
  else if (!strcmp(name, "fuzz")) scenario_fuzz();
  else if (!strcmp(name, "users")) scenario_users();
  else if (!strcmp(name, "gone")) scenario_gone();
  else if (!strcmp(name, "off")) scenario_off();
  else if (!strcmp(name, "server")) scenario_server();
  else if (!strcmp(name, "conns")) scenario_conns();
  else if (!strcmp(name, "wakeone")) scenario_wakeone();
  else CHECK(0, "unknown scenario %s", name);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *child = check_child_main(argc, argv);
  int api = find_api();
  find_client();
  if (child && !strcmp(child, "serve")) return api ? run_serve() : 1;
  if (child && !strcmp(child, "exiter")) return api ? run_exiter() : 1;
  if (child) {
    alarm(300);
    CHECK(api, "the shim's API is there (preloaded)");
    if (api) run_scenario(child);
    return check_child_summary(child);
  }
  CHECK(api, "the shim is preloaded");
  if (!api) return check_summary();
#ifdef CONTROL_STATIC
  check_run_child("verbs", NULL);
#else
  check_run_child("verbs", NULL);
  check_run_child("fuzz", NULL);
  check_run_child("users", NULL);
  check_run_child("gone", NULL);
  check_run_child("off", "VMMSHIM_CONTROL=0", NULL);
  check_run_child("server", "VMMSHIM_LOG=info", NULL);
  server_output();
  check_run_child("conns", NULL);
  check_run_child("wakeone", NULL);
#endif
  return check_summary();
}
