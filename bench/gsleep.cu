/* gsleep: the processes of bench/group_sleep.py (make bench, step group-sleep; docs/benchmarks.md).
 *
 *   gsleep member MIB DIR I    MIB MiB in tag weights (vmmshim_set_tag), filled; writes
 *                              DIR/ready.I, then waits for DIR/stop (at most 110 s)
 *   gsleep lender MIB DIR      MIB MiB in tag kv (VMMSHIM_COLD_TAGS=kv: lent in mapped mode), filled;
 *                              DIR/ready.lender, then waits for DIR/stop
 *   gsleep borrower MIB DIR    VMMSHIM_ON_LIMIT=balloon: one cudaMalloc of MIB MiB that does not fit
 *                              the group's limit until the lender lent; prints
 *                              "R gsleep op=balloon mib=MIB reserve_mib=R ms=... ok=0|1", then frees it */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void mark(const char *dir, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
}

static void wait_stop(const char *dir) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/stop", dir);
  double t0 = now_ms();
  while (stat(path, &st) != 0 && now_ms() - t0 < 110000) usleep(10000);
}

/* MIB MiB in tag (the shim's vmmshim_set_tag, found at run time), filled. */
static void *hold(size_t mib, const char *tag) {
  typedef int (*set_tag_fn)(const char *);
  set_tag_fn set_tag = (set_tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  void *p = NULL;
  size_t n = mib << 20;
  if (set_tag) set_tag(tag);
  cudaError_t e = cudaMalloc(&p, n);
  if (set_tag) set_tag(NULL);
  if (e != cudaSuccess) return NULL;
  cudaMemset(p, 0x5a, n);
  cudaDeviceSynchronize();
  return p;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: gsleep member|lender|borrower MIB DIR [I]\n");
    return 2;
  }
  size_t mib = strtoull(argv[2], NULL, 10);
  const char *dir = argv[3];
  if (!strcmp(argv[1], "member") || !strcmp(argv[1], "lender")) {
    void *p = hold(mib, !strcmp(argv[1], "member") ? "weights" : "kv");
    if (!p) {
      fprintf(stderr, "gsleep: %zu MiB not allocated\n", mib);
      return 1;
    }
    char name[64];
    snprintf(name, sizeof name, "ready.%s", argc > 4 ? argv[4] : "lender");
    mark(dir, name);
    wait_stop(dir);
    cudaFree(p);
    return 0;
  }
  void *p = NULL;
  cudaFree(0); /* the context first: the time below is the growth's alone */
  double t = now_ms();
  cudaError_t e = cudaMalloc(&p, mib << 20);
  double ms = now_ms() - t;
  /* BENCH_RESERVE_MIB: the lender's VMMSHIM_HOST_RESERVE (bench/group_sleep.py sets both). */
  const char *reserve = getenv("BENCH_RESERVE_MIB");
  printf("R gsleep op=balloon mib=%zu reserve_mib=%s ms=%.2f ok=%d\n", mib, reserve ? reserve : "0", ms,
         e == cudaSuccess);
  if (e == cudaSuccess) cudaFree(p);
  return e == cudaSuccess ? 0 : 1;
}
