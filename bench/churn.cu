/* Irregular allocation churn on the GPU (bench/workloads.h's generators): the time per step, the
 * memory held at peak against live at peak, and the shim's VMM calls.
 *
 *   churn <churn|varlen> <malloc|async> <label> [steps] [seed]
 *
 * churn: a window of 256 live buffers, log-uniform sizes (70% 256 B - 1 MiB, 25% 1 - 64 MiB,
 * 5% 64 - 512 MiB); each step frees one at random, after a kernel checks it, and allocates a
 * new one, which a kernel writes (default 20000 steps). seed: the workload generator's (default 1;
 * bench/spread.sh runs several). varlen: a transformer training step at
 * a random sequence length (default 100 steps); each new buffer written by a kernel, each
 * checked before its free. malloc: cudaMalloc/cudaFree (run it under the shim for the shim's
 * sync or deferred mode); async: cudaMallocAsync/cudaFreeAsync on one stream (the device's
 * default pool with release threshold UINT64_MAX without the shim; the shim's async path under
 * it). The kernels touch the first and last 4 KiB of a buffer and 1 KiB every 4 MiB between, so
 * the allocator's work is what differs, not the kernels'. Prints
 *   R churn work=.. cfg=<label> seed=.. steps=.. us_per_step=.. peak_live=<requested bytes> bad=<buffers whose check failed>
 *     allocs_steady=<allocations after the warm-up>
 *     [pool_reserved_high=.. pool_used_high=..] [shim fields]
 * The first tenth of the steps warms up and is not timed; the VMM calls after it are printed
 * as shim_vmm_steady. */
#include <vector>

#include "bench.cuh"
#include "workloads.h"

__global__ void write_k(unsigned *p, size_t words, unsigned tag) {
  /* first and last 1024 words, and 256 words every 1M words */
  size_t stride = 1 << 20;
  for (size_t i = threadIdx.x; i < 1024 && i < words; i += blockDim.x) p[i] = tag ^ (unsigned)i;
  for (size_t i = threadIdx.x; i < 1024 && i < words; i += blockDim.x) p[words - 1 - i] = tag ^ (unsigned)(words - 1 - i);
  for (size_t b = stride; b + 256 < words; b += stride)
    for (size_t i = threadIdx.x; i < 256; i += blockDim.x) p[b + i] = tag ^ (unsigned)(b + i);
}

__global__ void check_k(const unsigned *p, size_t words, unsigned tag, unsigned *bad) {
  size_t stride = 1 << 20;
  unsigned wrong = 0;
  for (size_t i = threadIdx.x; i < 1024 && i < words; i += blockDim.x) wrong |= p[i] != (tag ^ (unsigned)i);
  for (size_t i = threadIdx.x; i < 1024 && i < words; i += blockDim.x)
    wrong |= p[words - 1 - i] != (tag ^ (unsigned)(words - 1 - i));
  for (size_t b = stride; b + 256 < words; b += stride)
    for (size_t i = threadIdx.x; i < 256; i += blockDim.x) wrong |= p[b + i] != (tag ^ (unsigned)(b + i));
  if (wrong) atomicAdd(bad, 1u);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: churn <churn|varlen> <malloc|async> <label> [steps] [seed]\n");
    return 2;
  }
  bool varlen = !strcmp(argv[1], "varlen");
  bool async = !strcmp(argv[2], "async");
  const char *label = argv[3];
  unsigned steps = argc > 4 ? (unsigned)atoi(argv[4]) : (varlen ? 100 : 20000);
  uint64_t seed = argc > 5 ? strtoull(argv[5], NULL, 10) : 1;
  if (!steps || !seed) {
    fprintf(stderr, "churn: steps and seed must be positive integers\n");
    return 2;
  }
  std::vector<wl_event_t> ev(varlen ? WL_VARLEN_PARAM_EVENTS + (size_t)steps * WL_VARLEN_STEP_EVENTS
                                    : WL_CHURN_WINDOW + 2 * (size_t)steps);
  size_t n = varlen ? wl_varlen(seed, steps, ev.data()) : wl_churn(seed, steps, ev.data());
  ev.resize(n);
  unsigned max_id = 0;
  for (auto &e : ev) max_id = e.id > max_id ? e.id : max_id;

  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  if (async) {
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  unsigned *bad;
  CK(cudaMalloc(&bad, sizeof *bad));
  CK(cudaMemset(bad, 0, sizeof *bad));
  std::vector<void *> ptr(max_id + 1, nullptr);
  std::vector<size_t> size(max_id + 1, 0);
  size_t live = 0, peak = 0, warm = n / 10, allocs_steady = 0;
  unsigned long long vmm_warm = 0;
  double t0 = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == warm) {
      CK(cudaStreamSynchronize(s));
      vmmshim_stats_t st;
      if (shim_stats(&st)) vmm_warm = st.vmm_calls;
      t0 = now_us();
    }
    const wl_event_t &e = ev[i];
    if (e.op == 'a') {
      cudaError_t r = async ? cudaMallocAsync(&ptr[e.id], e.size, s) : cudaMalloc(&ptr[e.id], e.size);
      if (r != cudaSuccess) {
        printf("R churn work=%s cfg=%s seed=%llu failed=1 at_event=%zu size=%zu live=%zu error=%s\n", argv[1], label,
               (unsigned long long)seed, i, e.size, live, cudaGetErrorName(r));
        return 1;
      }
      size[e.id] = e.size;
      live += e.size;
      allocs_steady += i >= warm;
      if (live > peak) peak = live;
      size_t words = e.size / sizeof(unsigned);
      if (words) write_k<<<1, 256, 0, s>>>((unsigned *)ptr[e.id], words, e.id * 2654435761u);
    } else if (ptr[e.id]) {
      size_t words = size[e.id] / sizeof(unsigned);
      if (words) check_k<<<1, 256, 0, s>>>((const unsigned *)ptr[e.id], words, e.id * 2654435761u, bad);
      CK(async ? cudaFreeAsync(ptr[e.id], s) : cudaFree(ptr[e.id]));
      ptr[e.id] = nullptr;
      live -= size[e.id];
    }
  }
  CK(cudaStreamSynchronize(s));
  double t1 = now_us();
  CK(cudaGetLastError());
  unsigned h_bad = 0;
  CK(cudaMemcpy(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost));
  unsigned timed_steps = varlen ? steps - steps / 10 : (unsigned)((n - warm) / 2);
  printf("R churn work=%s cfg=%s seed=%llu steps=%u us_per_step=%.2f peak_live=%zu bad=%u allocs_steady=%zu", argv[1],
         label, (unsigned long long)seed, timed_steps, (t1 - t0) / timed_steps, peak, h_bad, allocs_steady);
  if (async) print_pool_high(pool);
  vmmshim_stats_t st;
  if (shim_stats(&st)) printf(" shim_vmm_steady=%llu", st.vmm_calls - vmm_warm);
  print_shim_fields();
  printf("\n");
  for (unsigned id = 0; id <= max_id; id++)
    if (ptr[id]) CK(async ? cudaFreeAsync(ptr[id], s) : cudaFree(ptr[id]));
  CK(cudaStreamSynchronize(s));
  return h_bad ? 1 : 0;
}
