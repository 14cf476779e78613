/* (s) What a block on several handles costs the GPU's kernels (docs/design.md, "Against the
 * churn's target"). Run by tests/gpu/run.sh with default handles (one 512 MiB handle) and with
 * VMMSHIM_MAX_HANDLE=16M (the same block on 32 handles side by side); the two runs' INFO lines
 * are compared by eye, as the churn's rows with the stitch were slower than without it at the same
 * number of driver calls, and whether a range of several handles slows kernels is not known.
 *   - the churn's kernel (bench/churn.cu: the first and last 4 KiB of a buffer and 1 KiB every
 *     4 MiB between) over the 512 MiB block, 200 launches: us per launch (INFO);
 *   - a kernel writing the whole block, 5 times: GB/s (INFO);
 *   - a growth (cudaMalloc of 256 MiB, a new handle or 16 of them) while a 50 ms kernel runs on the
 *     first block: how long the call took, so whether mapping waits for running work (INFO);
 * and checks that every byte of both blocks is right after all of it. */
#include "gpu_test.cuh"

static const size_t MiB = 1ull << 20;

/* The churn's touch: thread t writes 1 KiB (256 words) at t * 4 MiB, and the last 4 KiB. */
__global__ void k_touch(unsigned *p, size_t words, unsigned tag) {
  size_t stride = (4 * MiB) / sizeof(unsigned);
  for (size_t base = (size_t)blockIdx.x * stride; base < words; base += (size_t)gridDim.x * stride)
    for (size_t w = base + threadIdx.x; w < base + 256 && w < words; w += blockDim.x) p[w] = tag ^ (unsigned)w;
  if (blockIdx.x == 0)
    for (size_t w = words - (words < 1024 ? words : 1024) + threadIdx.x; w < words; w += blockDim.x)
      p[w] = tag ^ (unsigned)w;
}

int main() {
  g_prog = "stitch-cost";
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  const char *mh = getenv("VMMSHIM_MAX_HANDLE");
  size_t n = 512 * MiB;
  vmmshim_stats_t s0, s1;
  shim_stats(&s0);
  void *a = NULL;
  CK(cudaMalloc(&a, n));
  shim_stats(&s1);
  printf("INFO stitch-cost: VMMSHIM_MAX_HANDLE=%s, the 512 MiB block grew the pool by %llu MiB in %llu VMM calls\n",
         mh ? mh : "(unset)", (unsigned long long)((s1.bytes_mapped - s0.bytes_mapped) / MiB),
         (unsigned long long)(s1.vmm_calls - s0.vmm_calls));
  check(is_vmm(a), "vmm", "the block is not VMM memory");

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  k_touch<<<64, 256>>>((unsigned *)a, n / 4, 1); /* warm: first touch of every page */
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(e0, 0));
  for (int i = 0; i < 200; i++) k_touch<<<64, 256>>>((unsigned *)a, n / 4, (unsigned)i);
  CK(cudaEventRecord(e1, 0));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  printf("INFO stitch-cost: churn touch over 512 MiB: %.2f us per launch (200 launches)\n", ms * 1e3 / 200);

  CK(cudaEventRecord(e0, 0));
  for (int i = 0; i < 5; i++) fill(a, n, 3, 0);
  CK(cudaEventRecord(e1, 0));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  printf("INFO stitch-cost: whole-block write: %.1f GB/s (5 x 512 MiB in %.2f ms)\n", 5.0 * n / (ms * 1e6), ms);

  /* A growth while a kernel runs on the first block. */
  spin_fill(a, n, 5, 50ull * 1000 * 1000, 0);
  void *b = NULL;
  double t0 = now_ms();
  CK(cudaMalloc(&b, 256 * MiB));
  double grow_ms = now_ms() - t0;
  CK(cudaDeviceSynchronize());
  double all_ms = now_ms() - t0;
  printf("INFO stitch-cost: a 256 MiB growth during a 50 ms kernel took %.3f ms (the kernel ended %.1f ms after "
         "the call began): %s\n",
         grow_ms, all_ms, grow_ms >= 40 ? "it waited for the kernel" : "it did not wait");
  fill(b, 256 * MiB, 9, 0);
  CK(cudaDeviceSynchronize());
  check(errors_in(a, n, 5) == 0, "first-block-bytes", "the 512 MiB block's bytes are wrong after the growth");
  check(errors_in(b, 256 * MiB, 9) == 0, "second-block-bytes", "the 256 MiB block's bytes are wrong");
  CK(cudaFree(b));
  CK(cudaFree(a));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return finish();
}
