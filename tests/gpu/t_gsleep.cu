/* t_gsleep: one rank of a job put to sleep and woken as a whole group (`vmmshim ctl --group NAME
 * sleep|wake`, docs/control.md "A whole group"); tests/gpu/group_drive.sh starts two ranks in one
 * group (one per GPU; both on GPU 0 when there is one) and drives them.
 *
 * The rank (GSLEEP_RANK) allocates GSLEEP_MB of tag weights (vmmshim_set_tag),
 * fills it with a pattern seeded by its rank, writes $GSLEEP_DIR/ready.RANK, then runs steps until
 * $GSLEEP_DIR/stop appears: each step sums the buffer on the GPU (a kernel reading every word) and
 * compares the sum with the first one. The driver sleeps the group in mapped mode (the ranks keep
 * running, on host memory at the same addresses) and wakes it: a step submitted while memory
 * moves waits at the gate, so every sum equals the first. At the end: the steps made, none wrong,
 * the bytes checked word by word. Run alone it fails (setup). */
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_test.cuh"

__global__ void k_sum_words(const uint32_t *p, size_t n, unsigned long long *out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    s += p[i] ^ (uint32_t)i;
  atomicAdd(out, s);
}

static bool exists(const char *dir, const char *name) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &st) == 0;
}

int main(void) {
  g_prog = "gsleep";
  const char *dir = getenv("GSLEEP_DIR");
  if (!dir) {
    check(false, "setup", "GSLEEP_DIR unset: tests/gpu/group_drive.sh runs this program");
    return finish();
  }
  int rank = atoi(getenv("GSLEEP_RANK") ? getenv("GSLEEP_RANK") : "0"), ndev = 0;
  size_t mb = strtoull(getenv("GSLEEP_MB") ? getenv("GSLEEP_MB") : "1024", NULL, 10);
  CK(cudaGetDeviceCount(&ndev));
  CK(cudaSetDevice(rank % ndev));
  size_t n = mb << 20;
  uint32_t seed = 0x5eed0000u + (uint32_t)rank;
  void *buf = NULL;
  unsigned long long *d_sum = NULL, first = 0, sum = 0;
  typedef int (*set_tag_fn)(const char *);
  set_tag_fn set_tag = (set_tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  check(set_tag != NULL, "shim", "vmmshim_set_tag not found: run under the shim");
  if (set_tag) set_tag("weights");
  CK(cudaMalloc(&buf, n));
  if (set_tag) set_tag(NULL);
  CK(cudaMalloc(&d_sum, sizeof *d_sum));
  fill(buf, n, seed, 0);
  CK(cudaDeviceSynchronize());
  char ready[1024];
  snprintf(ready, sizeof ready, "%s/ready.%d", dir, rank);
  FILE *f = fopen(ready, "w");
  if (f) fclose(f);
  long steps = 0, wrong = 0;
  double longest = 0, t_end = now_ms() + 80000;
  while (!exists(dir, "stop") && now_ms() < t_end) {
    double t = now_ms();
    CK(cudaMemset(d_sum, 0, sizeof *d_sum));
    k_sum_words<<<sm_count() * 4, 256>>>((const uint32_t *)buf, n / 4, d_sum);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    if (steps == 0) first = sum;
    else if (sum != first) wrong++;
    steps++;
    double took = now_ms() - t;
    if (took > longest) longest = took;
  }
  printf("INFO gsleep rank %d: %ld steps on device %d, the longest %.1f ms (a step that waited for the group's "
         "sleep and wake)\n", rank, steps, rank % ndev, longest);
  check(steps > 10, "steps", "rank %d made only %ld steps", rank, steps);
  check(wrong == 0, "sums", "rank %d: %ld of %ld steps read other bytes than the first (memory moved under a kernel)",
        rank, wrong, steps);
  size_t bad = errors_in(buf, n, seed);
  check(bad == 0, "bytes", "rank %d: %zu words differ from the pattern after the group's sleep and wake", rank, bad);
  CK(cudaFree(d_sum));
  CK(cudaFree(buf));
  return finish();
}
