/* bench/group.cu: what a group's budget costs (docs/limits.md), under the shim.
 *
 *   group admit CFG N K   N processes at once (this program again), each K growths: cudaMalloc of
 *                         64 MiB and cudaFree with VMMSHIM_RELEASE_THRESHOLD=0 (each allocation
 *                         grows the pool by one handle, each free gives it back: one admission
 *                         and one return). CFG group: the N share one budget (VMMSHIM_LIMIT_GROUP);
 *                         alone: each has VMMSHIM_LIMIT of its own (no segment). Then K pairs of
 *                         1 MiB on a pool that does not grow (no admission: the allocation speed).
 *                         Prints per process "R group cfg=CFG members=N growth_us=.. pair_us=..".
 *   group spill           VMMSHIM_LIMIT_GROUP and VMMSHIM_LIMIT=1G, VMMSHIM_ON_LIMIT=host (set by
 *                         bench/run.sh): two 1 GiB blocks, the second past the limit on host
 *                         memory; a kernel reading and writing each; then the group's limit
 *                         raised (vmmshim ctl --group, scripts/python/vmmshim/group_shm.py) and vmmshim_promote. Prints
 *                         "R group cfg=spill kernel=device|host gbps=.." and
 *                         "R group cfg=spill promote_ms=.. promote_gibps=.. bad=..". */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.cuh"

typedef int (*promote_fn)(vmmshim_sleep_result_t *, size_t);

/* One member: says it is ready (a byte to fd 4), waits for the start (a byte on fd 3), then K
 * growths and K pairs. */
static int member(const char *cfg, int n, int k) {
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  void *p = NULL;
  CK(cudaMalloc(&p, 64 << 20)); /* the pool made, the group joined */
  CK(cudaFree(p));
  char x = 'r';
  if (write(4, &x, 1) != 1) return 1;
  while (read(3, &x, 1) < 0 && errno == EINTR) {
  }
  double t0 = now_us();
  for (int i = 0; i < k; i++) {
    CK(cudaMalloc(&p, 64 << 20));
    CK(cudaFree(p));
  }
  double growth = (now_us() - t0) / k;
  /* Pairs on a warm pool: one 2 MiB handle kept live so the small heap never gives back. */
  void *keep = NULL;
  CK(cudaMalloc(&keep, 1 << 20));
  t0 = now_us();
  for (int i = 0; i < k * 10; i++) {
    CK(cudaMalloc(&p, 256 << 10));
    CK(cudaFree(p));
  }
  double pair = (now_us() - t0) / (k * 10);
  CK(cudaFree(keep));
  printf("R group cfg=%s members=%d growth_us=%.2f pair_us=%.3f\n", cfg, n, growth, pair);
  fflush(stdout);
  return 0;
}

static int admit(const char *self, const char *cfg, int n, int k) {
  signal(SIGPIPE, SIG_IGN); /* a member that failed closed its end: its exit status says so */
  int go[2], ready[2];
  if (pipe(go) || pipe(ready)) return 1;
  pid_t pid[64];
  char group[64], lim[32];
  snprintf(group, sizeof group, "bench-%d", (int)getpid());
  snprintf(lim, sizeof lim, "%dG", 2 * n + 2);
  for (int i = 0; i < n && i < 64; i++) {
    fflush(stdout);
    pid[i] = fork();
    if (pid[i] == 0) {
      /* Out of the way first: a pipe's end may itself be 3 or 4. */
      int in = fcntl(go[0], F_DUPFD, 20), out = fcntl(ready[1], F_DUPFD, 20);
      close(go[0]), close(go[1]), close(ready[0]), close(ready[1]);
      dup2(in, 3), dup2(out, 4);
      close(in), close(out);
      setenv("VMMSHIM_RELEASE_THRESHOLD", "0", 1);
      setenv("VMMSHIM_LIMIT", lim, 1);
      if (!strcmp(cfg, "group")) setenv("VMMSHIM_LIMIT_GROUP", group, 1);
      char ns[16], ks[16];
      snprintf(ns, sizeof ns, "%d", n);
      snprintf(ks, sizeof ks, "%d", k);
      execl("/proc/self/exe", self, "member", cfg, ns, ks, (char *)NULL);
      _exit(127);
    }
  }
  close(go[0]);
  close(ready[1]);
  /* Every member has its context and its pool before any starts: they run at once. */
  for (int i = 0; i < n; i++) {
    char x;
    ssize_t r;
    while ((r = read(ready[0], &x, 1)) < 0 && errno == EINTR) {
    }
    if (r != 1) break; /* a member failed: the others are released anyway */
  }
  close(ready[0]);
  for (int i = 0; i < n; i++)
    if (write(go[1], "x", 1) != 1) return 1;
  close(go[1]);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st = 0;
    waitpid(pid[i], &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/vmmshim-%u-%s", (unsigned)geteuid(), group);
  unlink(path);
  return bad ? 1 : 0;
}

static double kernel_gbps(uint32_t *p, size_t bytes) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  k_touch<<<264, 256>>>(p, bytes / 4);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return 2.0 * bytes / (ms / 1e3) / 1e9;
}

static int spill(void) {
  promote_fn promote = (promote_fn)dlsym(RTLD_DEFAULT, "vmmshim_promote");
  const char *group = getenv("VMMSHIM_LIMIT_GROUP");
  if (!promote || !group) {
    fprintf(stderr, "group spill: needs the shim and VMMSHIM_LIMIT_GROUP\n");
    return 1;
  }
  CK(cudaSetDevice(0));
  const size_t gib = 1ull << 30;
  uint32_t *d = NULL, *h = NULL;
  unsigned long long *bad = NULL;
  CK(cudaMallocHost(&bad, sizeof *bad));
  CK(cudaMalloc(&d, gib));
  CK(cudaMalloc(&h, gib)); /* past the limit: host memory */
  k_fill<<<264, 256>>>(d, gib / 4, 1);
  k_fill<<<264, 256>>>(h, gib / 4, 2);
  CK(cudaDeviceSynchronize());
  kernel_gbps(d, gib), kernel_gbps(h, gib); /* warm, and back to the pattern after two */
  printf("R group cfg=spill kernel=device gbps=%.1f\n", kernel_gbps(d, gib));
  printf("R group cfg=spill kernel=host gbps=%.1f\n", kernel_gbps(h, gib));
  /* Written by a kernel just before the promote: the pattern with every bit 0 flipped, which
   * is what the check below expects. */
  k_touch<<<264, 256>>>(d, gib / 4);
  k_touch<<<264, 256>>>(h, gib / 4);
  CK(cudaDeviceSynchronize());
  char cmd[256];
  snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD sh scripts/vmmshim ctl --group %s limit 4G >/dev/null", group);
  if (system(cmd) != 0) fprintf(stderr, "group spill: %s failed\n", cmd);
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  double t0 = now_us();
  int rc = promote(&r, sizeof r);
  double ms = (now_us() - t0) / 1e3;
  *bad = 0;
  k_bad<<<264, 256>>>(h, gib / 4, 2u ^ 1u, bad);
  CK(cudaDeviceSynchronize());
  printf("R group cfg=spill promote_ms=%.2f promote_gibps=%.1f moved=%llu bad=%llu rc=%d\n", ms,
         (double)r.restored / gib / (ms / 1e3), (unsigned long long)r.restored, *bad, rc);
  printf("R group cfg=spill kernel=promoted gbps=%.1f\n", kernel_gbps(h, gib));
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/vmmshim-%u-%s", (unsigned)geteuid(), group);
  unlink(path);
  return rc == 0 && *bad == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 5 && !strcmp(argv[1], "member")) return member(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc >= 5 && !strcmp(argv[1], "admit")) return admit(argv[0], argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc >= 2 && !strcmp(argv[1], "spill")) return spill();
  fprintf(stderr, "usage: group admit group|alone N K | group spill\n");
  return 2;
}
