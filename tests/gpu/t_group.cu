/* t_group: one memory budget for a group of processes, and host memory past the limit
 * (src/handle/group.c, src/alloc/limit.c; docs/limits.md), on a GPU.
 * Runs only under the shim (its API is found with dlsym).
 *
 * GROUP_MODE=four (default): four processes (this program again, GROUP_MODE=member) in one group
 *   (VMMSHIM_LIMIT_GROUP, VMMSHIM_LIMIT=GROUP_BUDGET_MB, 8192 by default) allocate random sizes and
 *   fill them with a kernel until refused: every refusal is cudaErrorMemoryAllocation; the group's
 *   segment never holds more than the budget (read after the members stopped); what NVML says each
 *   member uses (nvmlDeviceGetComputeRunningProcesses, libnvidia-ml.so.1 opened with dlopen), less
 *   what a member that allocates nothing uses (its context), summed over the four, stays under the
 *   budget; and the device's used memory grew by no more than the budget and four contexts. Every
 *   member's data is intact before it exits.
 * GROUP_MODE=spill: run with VMMSHIM_LIMIT_GROUP, VMMSHIM_LIMIT=2G and VMMSHIM_ON_LIMIT=host: five
 *   1 GiB blocks are served, 3 GiB of them from host memory; kernels over all 5 GiB give the right
 *   results; the tag reports 3 GiB host_mapped; promote without room moves nothing; the group's
 *   limit raised (vmmshim ctl --group, scripts/python/vmmshim/group_shm.py), promote moves the 3 GiB to the device at the same
 *   addresses, data intact, and kernels run on them at device speed.
 * GROUP_MODE=hopeless: run with VMMSHIM_LIMIT=1G and VMMSHIM_ON_LIMIT=wait, no group, one thread
 *   of the program (the driver's and the runtime's helper threads never allocate: not the
 *   program's): 768 MiB fit; 512 MiB more fail at once (no other thread could free), as do 2 GiB
 *   (more than the limit itself); a second thread allocates 128 MiB and frees them a second later:
 *   256 MiB wait for that free, then fit; that thread joined, 512 MiB more fail at once again;
 *   after a free of 768 MiB, 256 MiB fit. INFO lines say each step's time and the process's
 *   threads; a helper thread that never calls CUDA (named "helper") runs throughout, like the
 *   driver's own; the mode fails itself after GROUP_HOPELESS_S (20) seconds, naming the step that
 *   hung, well before run.sh's 90 s. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test.cuh"
#include "vmmshim/group.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

typedef int (*promote_fn)(vmmshim_sleep_result_t *, size_t);
typedef int (*tag_stats_fn)(vmmshim_tag_stats_t *, int, size_t);

/* ------------------------------------------------------------------ NVML, opened at run time */

typedef struct nvml_proc_s { /* nvmlProcessInfo_v2_t (the _v2 and _v3 calls), v1 its first two */
  unsigned int pid;
  unsigned long long used;
  unsigned int gi, ci;
} nvml_proc_t;

typedef struct nvml_s {
  void *lib, *dev;
  int (*procs)(void *, unsigned int *, void *);
  size_t stride; /* bytes of one record of the call found */
} nvml_t;

static bool nvml_open(nvml_t *n) {
  memset(n, 0, sizeof *n);
  n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!n->lib) return false;
  int (*init)(void) = (int (*)(void))dlsym(n->lib, "nvmlInit_v2");
  int (*by_bus)(const char *, void **) = (int (*)(const char *, void **))dlsym(n->lib, "nvmlDeviceGetHandleByPciBusId_v2");
  static const struct {
    const char *name;
    size_t stride;
  } calls[] = {{"nvmlDeviceGetComputeRunningProcesses_v3", sizeof(nvml_proc_t)},
               {"nvmlDeviceGetComputeRunningProcesses_v2", sizeof(nvml_proc_t)},
               {"nvmlDeviceGetComputeRunningProcesses", 16}};
  for (size_t i = 0; i < 3 && !n->procs; i++)
    if ((n->procs = (int (*)(void *, unsigned int *, void *))dlsym(n->lib, calls[i].name))) n->stride = calls[i].stride;
  char bus[64];
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  return init && by_bus && n->procs && init() == 0 && by_bus(bus, &n->dev) == 0;
}

/* What NVML says pid uses on the device; -1 when it does not list pid. */
static long long nvml_used(nvml_t *n, pid_t pid) {
  static unsigned char buf[256 * sizeof(nvml_proc_t)];
  unsigned int count = 256;
  if (n->procs(n->dev, &count, buf) != 0) return -1;
  for (unsigned int i = 0; i < count; i++) {
    const unsigned char *rec = buf + i * n->stride;
    unsigned int p;
    unsigned long long used;
    memcpy(&p, rec, sizeof p);
    memcpy(&used, rec + 8, sizeof used);
    if ((pid_t)p == pid) return (long long)used;
  }
  return -1;
}

static size_t device_used(void) {
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  return t - f;
}

/* Words of [0, n) at p that differ from the pattern times mul, counted with a counter in pinned
 * host memory: at the limit, no device allocation may be needed to look. */
__global__ void k_check_scaled(const uint32_t *p, size_t words, uint32_t seed, uint32_t mul, unsigned long long *errs) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long bad = 0;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    bad += p[w] != pattern_word(seed, w) * mul;
  if (bad) atomicAdd(errs, bad);
}

static size_t scaled_errors(const void *p, size_t n, uint32_t seed, uint32_t mul) {
  unsigned long long *d, e = 0;
  CK(cudaMallocHost(&d, sizeof *d)); /* pinned: no device allocation past the limit here */
  *d = 0;
  k_check_scaled<<<sm_count() * 8, 256>>>((const uint32_t *)p, n / 4, seed, mul, d);
  CK(cudaDeviceSynchronize());
  e = *d;
  CK(cudaFreeHost(d));
  return (size_t)e;
}

/* ------------------------------------------------------------------ members */

/* A member: allocates random sizes and fills them until refused (or MEMBER_IDLE=1: nothing),
 * writes "DONE <blocks> <bytes> <error>" to fd 4, waits for a byte on fd 3, checks its data,
 * writes "OK <bad words>" and exits. */
static int mode_member(void) {
  FILE *out = fdopen(4, "w");
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  unsigned long long seed = (unsigned long long)getpid() * 0x9E3779B97F4A7C15ull;
  enum { MAX = 4096 };
  static void *blk[MAX];
  static size_t len[MAX];
  int n = 0;
  size_t bytes = 0;
  cudaError_t last = cudaSuccess;
  bool idle = getenv("MEMBER_IDLE") != NULL;
  while (!idle && n < MAX) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    size_t sz = (size_t)(1 + seed % 512) * MiB;
    void *p = NULL;
    last = cudaMalloc(&p, sz);
    if (last != cudaSuccess) {
      cudaGetLastError();
      break;
    }
    fill(p, sz, (uint32_t)n, 0);
    blk[n] = p;
    len[n++] = sz;
    bytes += sz;
  }
  CK(cudaDeviceSynchronize());
  fprintf(out, "DONE %d %zu %d\n", n, bytes, (int)last);
  fflush(out);
  char x;
  while (read(3, &x, 1) < 0 && errno == EINTR) {
  }
  size_t bad = 0;
  for (int i = 0; i < n; i++) bad += scaled_errors(blk[i], len[i], (uint32_t)i, 1);
  fprintf(out, "OK %zu\n", bad);
  fflush(out);
  return 0;
}

typedef struct member_s {
  pid_t pid;
  int to;
  FILE *from;
} member_t;

static member_t spawn_member(const char *group, const char *budget, bool idle) {
  int down[2], up[2];
  member_t m = {-1, -1, NULL};
  if (pipe(down) || pipe(up)) return m;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int in = fcntl(down[0], F_DUPFD, 20), o = fcntl(up[1], F_DUPFD, 20);
    close(down[0]), close(down[1]), close(up[0]), close(up[1]);
    dup2(in, 3), dup2(o, 4);
    close(in), close(o);
    setenv("GROUP_MODE", "member", 1);
    setenv("VMMSHIM_LIMIT_GROUP", group, 1);
    setenv("VMMSHIM_LIMIT", budget, 1);
    if (idle) setenv("MEMBER_IDLE", "1", 1);
    execl("/proc/self/exe", "t_group", (char *)NULL);
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  m.pid = pid;
  m.to = down[1];
  m.from = fdopen(up[0], "r");
  return m;
}

static int member_end(member_t *m) {
  if (write(m->to, "x", 1) != 1) return -1;
  close(m->to);
  char line[128];
  size_t bad = (size_t)-1;
  if (fgets(line, sizeof line, m->from)) sscanf(line, "OK %zu", &bad);
  fclose(m->from);
  int st = 0;
  waitpid(m->pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && bad == 0 ? 0 : 1;
}

static int mode_four(void) {
  const char *mb = getenv("GROUP_BUDGET_MB") ? getenv("GROUP_BUDGET_MB") : "8192";
  size_t budget = (size_t)strtoull(mb, NULL, 10) * MiB;
  char group[64], lim[32], path[128];
  snprintf(group, sizeof group, "gpu-test-%d", (int)getpid());
  snprintf(lim, sizeof lim, "%sM", mb);
  snprintf(path, sizeof path, "/dev/shm/vmmshim-%u-%s", (unsigned)geteuid(), group);
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  nvml_t nv;
  bool have_nvml = nvml_open(&nv);
  size_t used0 = device_used();

  /* What one member uses before it allocates: its context. */
  member_t idle = spawn_member(group, lim, true);
  char line[256];
  check(idle.from && fgets(line, sizeof line, idle.from) && !strncmp(line, "DONE 0", 6), "idle-member", "%s", line);
  long long ctx = have_nvml ? nvml_used(&nv, idle.pid) : -1;
  size_t ctx_dev = device_used() - used0;
  member_end(&idle);
  printf("INFO a member's context: NVML %lld bytes, the device %zu bytes\n", ctx, ctx_dev);

  member_t m[4];
  for (int i = 0; i < 4; i++) m[i] = spawn_member(group, lim, false);
  size_t served = 0;
  int clean = 0;
  for (int i = 0; i < 4; i++) {
    int n = -1, err = -1;
    size_t bytes = 0;
    if (m[i].from && fgets(line, sizeof line, m[i].from)) sscanf(line, "DONE %d %zu %d", &n, &bytes, &err);
    /* A member that starts late may find the budget already taken: its
       first allocation is refused, which is the limit doing its job. */
    clean += n >= 0 && err == (int)cudaErrorMemoryAllocation;
    served += bytes;
  }
  check(clean == 4, "refusals", "%d of 4 members allocated until refused with cudaErrorMemoryAllocation", clean);
  check(served <= budget && served + 4 * 512 * MiB >= budget, "served",
        "the members hold %zu MiB of the %zu MiB budget", served >> 20, budget >> 20);
  /* The segment, read from outside. */
  int fd = open(path, O_RDONLY);
  vs_group_header_t *h = fd >= 0 ? (vs_group_header_t *)mmap(NULL, VS_GROUP_SIZE, PROT_READ, MAP_SHARED, fd, 0) : NULL;
  if (h == MAP_FAILED) h = NULL;
  check(h && h->members == 4 && h->total_all <= budget && h->total_all >= served, "segment",
        "%u members map %llu MiB (budget %zu MiB)", h ? h->members : 0, h ? (unsigned long long)h->total_all >> 20 : 0ull,
        budget >> 20);
  /* NVML, per process, less each one's context. */
  if (have_nvml && ctx >= 0) {
    long long sum = 0;
    int listed = 0;
    for (int i = 0; i < 4; i++) {
      long long u = nvml_used(&nv, m[i].pid);
      if (u >= 0) listed++, sum += u - ctx;
    }
    if (listed == 4)
      check(sum <= (long long)(budget + 4 * 64 * MiB), "nvml", "NVML: the members use %lld MiB beyond their contexts, budget %zu MiB",
            sum >> 20, budget >> 20);
    else
      printf("INFO NVML lists %d of the 4 members (another pid namespace?): the device's total is checked instead\n", listed);
  } else {
    printf("INFO no NVML (libnvidia-ml.so.1) or no entry for the idle member: the device's total is checked instead\n");
  }
  size_t grown = device_used() - used0;
  check(grown <= budget + 4 * ctx_dev + 256 * MiB, "device-used",
        "the device's used memory grew by %zu MiB: the budget %zu MiB and 4 contexts of %zu MiB", grown >> 20, budget >> 20,
        ctx_dev >> 20);
  int bad = 0;
  for (int i = 0; i < 4; i++) bad += member_end(&m[i]);
  check(bad == 0, "members-data", "%d members found their data damaged or failed", bad);
  check(h && h->members == 0 && h->total_all == 0, "empty", "after the members exited: %u members, %llu bytes",
        h ? h->members : 0, h ? (unsigned long long)h->total_all : 0ull);
  if (h) munmap(h, VS_GROUP_SIZE);
  if (fd >= 0) close(fd);
  unlink(path);
  return finish();
}

/* ------------------------------------------------------------------ spill */

__global__ void k_scale(uint32_t *p, size_t words, uint32_t mul) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride) p[w] *= mul;
}

static double kernel_gbps(uint32_t *p, size_t n, uint32_t mul) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  k_scale<<<sm_count() * 8, 256>>>(p, n / 4, mul);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a), cudaEventDestroy(b);
  return 2.0 * n / (ms / 1e3) / 1e9;
}

static int mode_spill(void) {
  promote_fn promote = (promote_fn)dlsym(RTLD_DEFAULT, "vmmshim_promote");
  tag_stats_fn stats = (tag_stats_fn)dlsym(RTLD_DEFAULT, "vmmshim_tag_stats");
  const char *group = getenv("VMMSHIM_LIMIT_GROUP");
  check(promote && stats && group, "api", "vmmshim_promote, vmmshim_tag_stats and VMMSHIM_LIMIT_GROUP");
  if (!promote || !stats || !group) return finish();
  CK(cudaSetDevice(0));
  enum { N = 5 };
  void *p[N];
  for (int i = 0; i < N; i++) {
    cudaError_t e = cudaMalloc(&p[i], GiB);
    check(e == cudaSuccess, "alloc", "block %d of 1 GiB: %s", i, cudaGetErrorName(e));
    if (e != cudaSuccess) return finish();
    fill(p[i], GiB, 100 + i, 0);
  }
  CK(cudaDeviceSynchronize());
  size_t bad = 0;
  double slow = 1e30, fast = 0;
  for (int i = 0; i < N; i++) {
    double gbps = kernel_gbps((uint32_t *)p[i], GiB, 3);
    bad += scaled_errors(p[i], GiB, 100 + i, 3);
    if (gbps < slow) slow = gbps;
    if (gbps > fast) fast = gbps;
  }
  check(bad == 0, "kernels-over-5GiB", "%zu wrong words after a kernel over all 5 GiB", bad);
  printf("INFO kernel bandwidth: %.1f GB/s on device memory, %.1f GB/s on host memory past the limit\n", fast, slow);
  vmmshim_tag_stats_t ts[VMMSHIM_MAX_TAGS];
  memset(ts, 0, sizeof ts);
  int nt = stats(ts, VMMSHIM_MAX_TAGS, sizeof ts[0]);
  check(nt >= 1 && ts[0].host_mapped >= 3 * GiB && ts[0].host_mapped < 3 * GiB + 64 * MiB && !ts[0].asleep, "host-resident",
        "the tag reports %llu MiB host_mapped (3072 expected), asleep %d", (unsigned long long)ts[0].host_mapped >> 20,
        ts[0].asleep);
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  check(t <= 2 * GiB && f < 64 * MiB, "meminfo", "cudaMemGetInfo: %zu MiB free of %zu MiB", f >> 20, t >> 20);

  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  int rc = promote(&r, sizeof r);
  check(rc == -ENOMEM && r.restored == 0, "promote-no-room", "rc %d, %llu MiB moved (%s)", rc,
        (unsigned long long)r.restored >> 20, r.reason);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD sh scripts/vmmshim ctl --group %s limit 8G >/dev/null", group);
  check(system(cmd) == 0, "raise-limit", "%s", cmd);
  memset(&r, 0, sizeof r);
  rc = promote(&r, sizeof r);
  check(rc == 0 && r.restored >= 3 * GiB && r.skipped == 0, "promote", "rc %d, %llu MiB moved, %llu MiB left (%s)", rc,
        (unsigned long long)r.restored >> 20, (unsigned long long)r.skipped >> 20, r.reason);
  memset(ts, 0, sizeof ts);
  stats(ts, VMMSHIM_MAX_TAGS, sizeof ts[0]);
  check(ts[0].host_mapped == 0, "promoted", "host_mapped %llu after the promote", (unsigned long long)ts[0].host_mapped);
  bad = 0;
  double after = 1e30;
  for (int i = 0; i < N; i++) {
    bad += scaled_errors(p[i], GiB, 100 + i, 3);
    double gbps = kernel_gbps((uint32_t *)p[i], GiB, 5);
    bad += scaled_errors(p[i], GiB, 100 + i, 15);
    if (gbps < after) after = gbps;
  }
  check(bad == 0, "data-after-promote", "%zu wrong words", bad);
  check(after > slow * 2, "device-speed", "the slowest block runs at %.1f GB/s after the promote (%.1f before)", after, slow);
  for (int i = 0; i < N; i++) CK(cudaFree(p[i]));
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/vmmshim-%u-%s", (unsigned)geteuid(), group);
  unlink(path);
  return finish();
}

/* A single-threaded program waiting for itself: the wait would never end, so it fails at once. */
/* A wait that never ends would hang the run until run.sh's 90 s: the mode fails itself sooner,
 * naming the step that hung (GROUP_HOPELESS_S, 20 s by default). The main thread is stuck in the
 * shim's wait (a futex), holding no lock of stdio: a snprintf of strings and ints, write, _exit. */
static const char *volatile g_step = "start";

static void hopeless_watchdog(int sig) {
  (void)sig;
  char line[256];
  int n = snprintf(line, sizeof line,
                   "FAIL t_group/hopeless-watchdog: step '%s' still blocked after GROUP_HOPELESS_S: a wait that "
                   "could never end did not fail at once\nt_group: %d passed, %d failed\n",
                   (const char *)g_step, g_pass, g_fail + 1);
  if (n > 0 && write(1, line, (size_t)n) < 0) _exit(3);
  _exit(1);
}

/* What the next run should show: the process's threads (the driver's and the runtime's helpers,
 * their names), which the shim must not count as threads that could free. */
static void info_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return;
  char names[1024] = "";
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[64], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%.20s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (f && fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
    if (f) fclose(f);
    size_t len = strlen(names);
    snprintf(names + len, sizeof names - len, "%s%s", n ? ", " : "", comm);
    n++;
  }
  closedir(d);
  printf("INFO t_group/hopeless: %d threads in the process: %s\n", n, names);
}

/* A thread that never calls CUDA, as the runtime's and driver's helpers do not call the shim:
 * the mode fails on a shim that counts it, whatever the driver names its own threads. */
static void *idle_helper(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

/* cudaMalloc of bytes, timed; says what it saw. */
static cudaError_t timed_malloc(const char *step, void **p, size_t bytes, double *ms) {
  g_step = step;
  double t0 = now_ms();
  cudaError_t e = cudaMalloc(p, bytes);
  *ms = now_ms() - t0;
  cudaGetLastError();
  printf("INFO t_group/hopeless: %s: cudaMalloc(%zu MiB) -> %s after %.1f ms\n", step, bytes / MiB,
         cudaGetErrorName(e), *ms);
  return e;
}

/* A second thread of the program that allocates (so the shim counts it) and frees a second later. */
typedef struct later_s {
  void *p;
  cudaError_t res;
  int allocated;
} later_t;

static void *free_later(void *arg) {
  later_t *l = (later_t *)arg;
  cudaSetDevice(0);
  l->res = cudaMalloc(&l->p, 128 * MiB);
  __atomic_store_n(&l->allocated, 1, __ATOMIC_RELEASE);
  usleep(1000 * 1000);
  if (l->res == cudaSuccess) cudaFree(l->p);
  return NULL;
}

/* With another allocating thread, the wait waits for its free; once it exited, alone again. */
static void hopeless_two_threads(void) {
  later_t l = {NULL, cudaSuccess, 0};
  pthread_t t;
  if (pthread_create(&t, NULL, free_later, &l) != 0) {
    check(false, "second-thread", "pthread_create");
    return;
  }
  while (!__atomic_load_n(&l.allocated, __ATOMIC_ACQUIRE)) usleep(1000);
  check(l.res == cudaSuccess, "second-thread", "a second thread allocates 128 MiB: %s", cudaGetErrorName(l.res));
  void *b = NULL, *c = NULL;
  double ms = 0;
  cudaError_t e = timed_malloc("waits-for-other-thread", &b, 256 * MiB, &ms);
  check(l.res != cudaSuccess || (e == cudaSuccess && ms >= 500), "waits-for-other-thread",
        "256 MiB while another thread holds 128 MiB it frees after 1 s: %s after %.0f ms", cudaGetErrorName(e), ms);
  g_step = "join";
  pthread_join(t, NULL);
  e = timed_malloc("alone-again-fails-at-once", &c, 512 * MiB, &ms);
  check(e == cudaErrorMemoryAllocation && ms < 2000, "alone-again-fails-at-once",
        "512 MiB more once the other thread exited: %s after %.0f ms", cudaGetErrorName(e), ms);
  if (b) CK(cudaFree(b));
}

static int mode_hopeless(void) {
  const char *lim = getenv("GROUP_HOPELESS_S");
  signal(SIGALRM, hopeless_watchdog);
  alarm(lim && atoi(lim) > 0 ? (unsigned)atoi(lim) : 20);
  CK(cudaSetDevice(0));
  void *a = NULL, *b = NULL, *c = NULL;
  double ms = 0;
  cudaError_t e = timed_malloc("alloc", &a, 768 * MiB, &ms);
  check(e == cudaSuccess, "alloc", "768 MiB under the 1 GiB limit: %s", cudaGetErrorName(e));
  if (e != cudaSuccess) return finish();
  pthread_t idle;
  if (pthread_create(&idle, NULL, idle_helper, NULL) == 0) {
    pthread_setname_np(idle, "helper");
    pthread_detach(idle);
  }
  info_threads();
  e = timed_malloc("alone-fails-at-once", &b, 512 * MiB, &ms);
  check(e == cudaErrorMemoryAllocation && ms < 2000, "alone-fails-at-once", "512 MiB more: %s after %.0f ms",
        cudaGetErrorName(e), ms);
  e = timed_malloc("over-limit-fails-at-once", &b, 2 * GiB, &ms);
  check(e == cudaErrorMemoryAllocation && ms < 2000, "over-limit-fails-at-once", "2 GiB: %s after %.0f ms",
        cudaGetErrorName(e), ms);
  hopeless_two_threads();
  info_threads();
  CK(cudaFree(a));
  e = timed_malloc("after-free", &c, 256 * MiB, &ms);
  check(e == cudaSuccess, "after-free", "256 MiB after the free: %s", cudaGetErrorName(e));
  if (e == cudaSuccess) CK(cudaFree(c));
  alarm(0);
  return finish();
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *mode = getenv("GROUP_MODE") ? getenv("GROUP_MODE") : "four";
  g_prog = "t_group";
  if (!strcmp(mode, "member")) return mode_member();
  vmmshim_stats_t s;
  check(shim_stats(&s), "shim", "the shim is loaded");
  if (!strcmp(mode, "four")) return mode_four();
  if (!strcmp(mode, "spill")) return mode_spill();
  if (!strcmp(mode, "hopeless")) return mode_hopeless();
  check(false, "mode", "unknown GROUP_MODE %s", mode);
  return finish();
}
