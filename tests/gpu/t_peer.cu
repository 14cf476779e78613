/* t_peer: device 1 reads and writes device 0's memory (tests/gpu/run.sh runs it on machines with
 * two GPUs or more, with and without the shim).
 *
 *   peer access   cudaDeviceEnablePeerAccess from device 1: a kernel on device 1 checks and
 *                 rewrites a cudaMalloc block of device 0 allocated before the call, and one
 *                 allocated after it (VMMSHIM_GRANULARITY small: the pool grows for it);
 *   pool access   cudaMemPoolSetAccess on device 0's default pool: the same for a
 *                 cudaMallocAsync block;
 *   copies        cudaMemcpyPeer both ways, checked on the other side;
 *   sleep, wake   under the shim: a tagged block of device 0 is slept to host memory and woken
 *                 while device 1 has peer access; device 1 reads and writes the woken bytes
 *                 (the wake grants device 1 its access again);
 *   disable       cudaDeviceDisablePeerAccess succeeds, a later allocation still works on
 *                 device 0 and cudaMemcpyPeer still copies both ways without peer access (an
 *                 access from device 1's kernels after it would fault the context: not tried). */
#include "gpu_test.cuh"

typedef int (*sleep_fn)(const char *, vmmshim_sleep_mode_t, vmmshim_sleep_result_t *, size_t);
typedef int (*wake_fn)(const char *, unsigned, vmmshim_sleep_result_t *, size_t);
typedef int (*tag_fn)(const char *);

static size_t errors_on(int dev, const void *p, size_t n, uint32_t seed) {
  CK(cudaSetDevice(dev));
  return errors_in(p, n, seed);
}

static void fill_on(int dev, void *p, size_t n, uint32_t seed) {
  CK(cudaSetDevice(dev));
  fill(p, n, seed, 0);
  CK(cudaDeviceSynchronize());
}

/* Device 1 reads device 0's block p (written with seed), writes seed+100, device 0 checks. */
static void round_trip(const char *name, void *p, size_t n, uint32_t seed) {
  char what[96];
  size_t bad = errors_on(1, p, n, seed);
  snprintf(what, sizeof what, "%s-read-by-device1", name);
  check(bad == 0, what, "%zu words differ", bad);
  fill_on(1, p, n, seed + 100);
  bad = errors_on(0, p, n, seed + 100);
  snprintf(what, sizeof what, "%s-written-by-device1", name);
  check(bad == 0, what, "device 0 sees %zu words that differ from device 1's writes", bad);
}

int main() {
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_prog = "peer";
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    printf("INFO peer: %d GPU; nothing to test\n", n);
    return finish();
  }
  int can = 0;
  CK(cudaDeviceCanAccessPeer(&can, 1, 0));
  check(can, "can-access-peer", "device 1 cannot access device 0");
  if (!can) return finish();
  bool shim = shim_as_expected();

  CK(cudaSetDevice(0));
  size_t n_before = 64u << 20;
  void *before;
  CK(cudaMalloc(&before, n_before));
  fill_on(0, before, n_before, 1);
  if (shim) check(is_vmm(before), "block-is-vmm", "not the shim's memory");

  CK(cudaSetDevice(1));
  CK(cudaDeviceEnablePeerAccess(0, 0));
  round_trip("malloc-before-enable", before, n_before, 1);

  /* After the enable: a block the pool grows for (and a small one that shares a handle). */
  CK(cudaSetDevice(0));
  size_t n_after = 768u << 20, n_small = 3000;
  void *after, *small;
  CK(cudaMalloc(&after, n_after));
  CK(cudaMalloc(&small, n_small));
  fill_on(0, after, n_after, 2);
  fill_on(0, small, n_small, 3);
  round_trip("malloc-after-enable", after, n_after, 2);
  round_trip("malloc-small", small, n_small, 3);

  /* Stream-ordered memory follows the pool's access list. */
  CK(cudaSetDevice(0));
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaMemAccessDesc desc = {};
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = 1;
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  CK(cudaMemPoolSetAccess(pool, &desc, 1));
  cudaStream_t s0;
  CK(cudaStreamCreate(&s0));
  void *as;
  size_t n_async = 40u << 20;
  CK(cudaMallocAsync(&as, n_async, s0));
  fill(as, n_async, 4, s0);
  CK(cudaStreamSynchronize(s0));
  round_trip("mallocasync-pool-access", as, n_async, 4);

  /* Copies between the devices. */
  void *on1;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&on1, n_before));
  CK(cudaMemcpyPeer(on1, 1, before, 0, n_before));
  CK(cudaDeviceSynchronize());
  size_t bad = errors_on(1, on1, n_before, 101);
  check(bad == 0, "memcpy-peer-0-to-1", "%zu words differ", bad);
  fill_on(1, on1, n_before, 9);
  CK(cudaMemcpyPeer(before, 0, on1, 1, n_before));
  CK(cudaDeviceSynchronize());
  bad = errors_on(0, before, n_before, 9);
  check(bad == 0, "memcpy-peer-1-to-0", "%zu words differ", bad);

  /* A tag slept to host memory and woken while device 1 has peer access to it. */
  sleep_fn p_sleep = (sleep_fn)dlsym(RTLD_DEFAULT, "vmmshim_sleep");
  wake_fn p_wake = (wake_fn)dlsym(RTLD_DEFAULT, "vmmshim_wake");
  tag_fn p_tag = (tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  if (shim) check(p_sleep && p_wake && p_tag, "sleep-api", "vmmshim_sleep, vmmshim_wake or vmmshim_set_tag not found");
  if (shim && p_sleep && p_wake && p_tag) {
    CK(cudaSetDevice(0));
    size_t n_tag = 320u << 20;
    void *tagged;
    p_tag("peer");
    CK(cudaMalloc(&tagged, n_tag));
    p_tag(NULL);
    fill_on(0, tagged, n_tag, 11);
    vmmshim_sleep_result_t r;
    int rc = p_sleep("peer", VMMSHIM_SLEEP_HOST, &r, sizeof r);
    check(rc == 0 && r.to_host >= n_tag, "sleep-host", "vmmshim_sleep: %d, %llu bytes to host (%s)", rc, (unsigned long long)r.to_host, r.reason);
    rc = p_wake("peer", 0, &r, sizeof r);
    check(rc == 0, "wake", "vmmshim_wake: %d", rc);
    CK(cudaSetDevice(0));
    bad = errors_on(0, tagged, n_tag, 11);
    check(bad == 0, "woken-bytes-device0", "%zu words differ after the wake", bad);
    round_trip("woken-with-peer-access", tagged, n_tag, 11);
    CK(cudaSetDevice(0));
    CK(cudaFree(tagged));
  }

  CK(cudaSetDevice(1));
  cudaError_t e = cudaDeviceDisablePeerAccess(0);
  check(e == cudaSuccess, "disable", "cudaDeviceDisablePeerAccess: %s", cudaGetErrorName(e));
  CK(cudaSetDevice(0));
  void *later;
  CK(cudaMalloc(&later, 256u << 20));
  fill_on(0, later, 256u << 20, 6);
  bad = errors_on(0, later, 256u << 20, 6);
  check(bad == 0, "alloc-after-disable", "%zu words differ", bad);
  CK(cudaMemcpyPeer(on1, 1, later, 0, n_before));
  CK(cudaDeviceSynchronize());
  bad = errors_on(1, on1, n_before, 6);
  check(bad == 0, "memcpy-peer-0-to-1-no-access", "%zu words differ", bad);
  fill_on(1, on1, n_before, 12);
  CK(cudaMemcpyPeer(later, 0, on1, 1, n_before));
  CK(cudaDeviceSynchronize());
  bad = errors_on(0, later, n_before, 12);
  check(bad == 0, "memcpy-peer-1-to-0-no-access", "%zu words differ", bad);

  CK(cudaFree(later));
  CK(cudaFreeAsync(as, s0));
  CK(cudaStreamSynchronize(s0));
  CK(cudaFree(before));
  CK(cudaFree(after));
  CK(cudaFree(small));
  CK(cudaSetDevice(1));
  CK(cudaFree(on1));
  if (shim) {
    vmmshim_stats_t s2;
    shim_stats(&s2);
    print_stats("peer", &s2);
  }
  return finish();
}
