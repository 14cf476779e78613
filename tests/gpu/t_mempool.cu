/* t_mempool: the stream-ordered allocator's default pool as programs read it
 * (cudaMemPoolGetAttribute / SetAttribute / TrimTo: CuPy's MemoryAsyncPool, PyTorch's
 * backend:cudaMallocAsync), run with and without the shim by tests/gpu/run.sh. The checks are
 * the driver's documented semantics, so both runs must pass them:
 *   1. CuPy's TestMemoryAsyncPool sequences (used_bytes, used_bytes_stream, free_bytes,
 *      total_bytes_stream, free_all_blocks): 1, 2 and 4 units of 1 KiB on the legacy stream and
 *      a second stream; the use follows every allocation and free at once, what is freed stays
 *      reserved until the pool is trimmed, a trim with nothing live leaves nothing reserved.
 *   2. High watermarks: they keep the peak; setting 0 resets them to the current value;
 *      another value is refused.
 *   3. (after 4) Trims keep at least what they are asked to keep, and what is live.
 *   4. The release threshold: what was set is answered (0 before); UINT64_MAX keeps freed
 *      memory through a synchronisation, 0 gives it back, 3 MiB leaves at most that.
 *   5. free_all_blocks_large_chunk: 70% of the device freed through the pool, then a plain
 *      cudaMalloc of 30%. Without the shim it fails until the pool is trimmed; under the shim it
 *      succeeds at once (one pool serves both), reported as INFO and checked per mode. */
#include "gpu_test.cuh"

static const size_t UNIT = 1024, MIB = 1u << 20;
static cudaMemPool_t g_pool;

static unsigned long long attr(cudaMemPoolAttr a) {
  cuuint64_t v = 0;
  CK(cudaMemPoolGetAttribute(g_pool, a, &v));
  return (unsigned long long)v;
}
static unsigned long long used(void) { return attr(cudaMemPoolAttrUsedMemCurrent); }
static unsigned long long reserved(void) { return attr(cudaMemPoolAttrReservedMemCurrent); }
static cudaError_t set(cudaMemPoolAttr a, cuuint64_t v) { return cudaMemPoolSetAttribute(g_pool, a, &v); }

static void *alloc(size_t n, cudaStream_t s) {
  void *p = NULL;
  CK(cudaMallocAsync(&p, n, s));
  return p;
}

/* CuPy's free_all_blocks: the stream synchronised, the pool trimmed to nothing. */
static void free_all(cudaStream_t s) {
  CK(cudaStreamSynchronize(s));
  CK(cudaMemPoolTrimTo(g_pool, 0));
}

static void cupy_sequences(cudaStream_t s) {
  check(used() == 0 && reserved() == 0, "clean-start", "used %llu reserved %llu", used(), reserved());
  void *p1 = alloc(2 * UNIT, 0);
  bool ok = used() == 2 * UNIT;
  void *p2 = alloc(4 * UNIT, 0);
  ok = ok && used() == 6 * UNIT && reserved() >= used();
  printf("INFO mempool: 2 and 4 KiB live: used %llu, reserved %llu\n", used(), reserved());
  CK(cudaFreeAsync(p2, 0));
  ok = ok && used() == 2 * UNIT;
  CK(cudaFreeAsync(p1, 0));
  ok = ok && used() == 0;
  void *p3 = alloc(1 * UNIT, 0);
  ok = ok && used() == 1 * UNIT;
  CK(cudaFreeAsync(p3, 0));
  void *a = alloc(1 * UNIT, 0), *b = alloc(3 * UNIT, 0);
  ok = ok && used() == 4 * UNIT;
  check(ok, "used-bytes", "the use does not follow the allocations: used %llu (1 and 3 KiB live)", used());
  void *c = alloc(1000, 0); /* the driver counts the bytes asked for, unrounded (H100, driver 580) */
  check(used() == 4 * UNIT + 1000, "used-bytes-unrounded", "used %llu with 1000 bytes more live", used());
  CK(cudaFreeAsync(c, 0));
  CK(cudaFreeAsync(a, 0));
  CK(cudaFreeAsync(b, 0));
  free_all(0);
  check(used() == 0 && reserved() == 0, "free-all-blocks", "used %llu reserved %llu after a trim", used(), reserved());

  p1 = alloc(4 * UNIT, 0);
  CK(cudaFreeAsync(p1, 0));
  p2 = alloc(2 * UNIT, s);
  unsigned long long u = used(), r = reserved();
  check(u == 2 * UNIT && r >= 6 * UNIT && r - u >= 4 * UNIT, "used-total-free-bytes-stream",
        "used %llu, total %llu (2 units live on a second stream, 4 freed on the legacy stream)", u, r);
  CK(cudaFreeAsync(p2, s));
  CK(cudaStreamSynchronize(s));
  free_all(0);

  p1 = alloc(2 * UNIT, 0);
  p2 = alloc(4 * UNIT, 0);
  CK(cudaFreeAsync(p2, 0));
  ok = reserved() - used() >= 4 * UNIT;
  CK(cudaFreeAsync(p1, 0));
  ok = ok && used() == 0 && reserved() >= 6 * UNIT;
  p3 = alloc(1 * UNIT, 0);
  ok = ok && reserved() >= 6 * UNIT && reserved() - used() >= 5 * UNIT;
  check(ok, "free-bytes", "freed memory is not kept: used %llu reserved %llu", used(), reserved());
  CK(cudaFreeAsync(p3, 0));
  free_all(0);
  check(reserved() == 0, "total-bytes-after-trim", "reserved %llu", reserved());
}

static void high_watermarks(cudaStream_t s) {
  CK(set(cudaMemPoolAttrUsedMemHigh, 0));
  CK(set(cudaMemPoolAttrReservedMemHigh, 0));
  check(attr(cudaMemPoolAttrUsedMemHigh) == used() && attr(cudaMemPoolAttrReservedMemHigh) == reserved(),
        "high-reset-to-current", "used high %llu (used %llu), reserved high %llu (reserved %llu)",
        attr(cudaMemPoolAttrUsedMemHigh), used(), attr(cudaMemPoolAttrReservedMemHigh), reserved());
  void *a = alloc(3 * MIB, s), *b = alloc(1 * MIB, s);
  check(attr(cudaMemPoolAttrUsedMemHigh) == 4 * MIB && attr(cudaMemPoolAttrReservedMemHigh) >= 4 * MIB, "high-peak",
        "used high %llu, reserved high %llu", attr(cudaMemPoolAttrUsedMemHigh), attr(cudaMemPoolAttrReservedMemHigh));
  CK(cudaFreeAsync(a, s));
  cudaError_t e = set(cudaMemPoolAttrUsedMemHigh, 1);
  cudaGetLastError();
  check(e == cudaErrorInvalidValue && attr(cudaMemPoolAttrUsedMemHigh) == 4 * MIB, "high-nonzero-refused",
        "setting 1: %s, high %llu", cudaGetErrorName(e), attr(cudaMemPoolAttrUsedMemHigh));
  CK(set(cudaMemPoolAttrUsedMemHigh, 0));
  check(used() == 1 * MIB && attr(cudaMemPoolAttrUsedMemHigh) == 1 * MIB, "high-reset-after-free",
        "used %llu, high %llu", used(), attr(cudaMemPoolAttrUsedMemHigh));
  CK(cudaFreeAsync(b, s));
  free_all(s);
}

/* After threshold(): the release threshold keeps everything through the synchronisation. The
 * use is taken relative to what it was (see threshold()). */
static void trims(cudaStream_t s) {
  unsigned long long u0 = used();
  void *p[4];
  for (int i = 0; i < 4; i++) p[i] = alloc(2 * MIB, s);
  CK(cudaMemPoolTrimTo(g_pool, 0));
  check(used() - u0 == 8 * MIB && reserved() >= 8 * MIB, "trim-keeps-live", "used %llu (%llu before) reserved %llu",
        used(), u0, reserved());
  for (int i = 0; i < 4; i++) CK(cudaFreeAsync(p[i], s));
  CK(cudaStreamSynchronize(s));
  unsigned long long before = reserved();
  CK(cudaMemPoolTrimTo(g_pool, 3 * MIB));
  unsigned long long after = reserved();
  printf("INFO mempool: trim to 3 MiB: reserved %llu -> %llu\n", before, after);
  check(after >= 3 * MIB && after <= before, "trim-keeps-at-least", "reserved %llu -> %llu", before, after);
  CK(cudaMemPoolTrimTo(g_pool, 0));
  check(reserved() == 0, "trim-to-0", "reserved %llu", reserved());
}

/* The frees here are cudaFree (it synchronises; the shim gives memory back at frees, and learns
 * of a stream's frees later). The driver does not take a pool allocation freed with cudaFree
 * off its use (measured: H100, driver 580.159: UsedMemCurrent stays), so the use is not checked
 * from here on. A threshold between 0 and what is freed: the driver gives back whole granules
 * (32 MiB there) while the reserve is above it, which may leave less than the threshold. */
static void threshold(cudaStream_t s) {
  check(attr(cudaMemPoolAttrReleaseThreshold) == 0, "threshold-default", "%llu", attr(cudaMemPoolAttrReleaseThreshold));
  CK(set(cudaMemPoolAttrReleaseThreshold, UINT64_MAX));
  check(attr(cudaMemPoolAttrReleaseThreshold) == UINT64_MAX, "threshold-set", "%llu",
        attr(cudaMemPoolAttrReleaseThreshold));
  void *p = alloc(4 * MIB, s);
  CK(cudaFree(p));
  CK(cudaDeviceSynchronize());
  check(reserved() >= 4 * MIB, "threshold-max-keeps", "reserved %llu", reserved());
  CK(set(cudaMemPoolAttrReleaseThreshold, 0));
  CK(cudaDeviceSynchronize());
  bool ok = reserved() == 0;
  p = alloc(2 * MIB, s);
  CK(cudaFree(p));
  CK(cudaDeviceSynchronize());
  check(ok && reserved() == 0, "threshold-0-gives-back", "reserved %llu", reserved());
  CK(set(cudaMemPoolAttrReleaseThreshold, 3 * MIB));
  void *q[4];
  for (int i = 0; i < 4; i++) q[i] = alloc(2 * MIB, s);
  for (int i = 0; i < 4; i++) CK(cudaFree(q[i]));
  CK(cudaDeviceSynchronize());
  check(reserved() <= 3 * MIB, "threshold-3M", "reserved %llu after 8 MiB freed", reserved());
  CK(set(cudaMemPoolAttrReleaseThreshold, UINT64_MAX));
}

static void large_chunk(bool shim) {
  size_t free_b = 0, total = 0;
  CK(cudaMemGetInfo(&free_b, &total));
  void *big = alloc((size_t)(0.7 * (double)total), 0);
  CK(cudaFreeAsync(big, 0));
  void *plain = NULL;
  cudaError_t e = cudaMalloc(&plain, (size_t)(0.3 * (double)total));
  cudaGetLastError();
  printf("INFO mempool: 70%% of the device freed through the pool, then cudaMalloc of 30%%: %s (%s the shim)\n",
         cudaGetErrorName(e), shim ? "under" : "without");
  if (e == cudaSuccess) CK(cudaFree(plain));
  if (shim)
    check(e == cudaSuccess, "large-chunk-one-pool", "cudaMalloc after the pool's free: %s", cudaGetErrorName(e));
  else
    check(e == cudaErrorMemoryAllocation, "large-chunk-driver-keeps", "cudaMalloc before the trim: %s",
          cudaGetErrorName(e));
  free_all(0);
  /* Before the next cudaMalloc: under the shim the memory its cudaFree leaves idle counts in the
   * pool's reserve (one pool serves both). */
  check(reserved() == 0, "large-chunk-trimmed", "reserved %llu", reserved());
  e = cudaMalloc(&plain, (size_t)(0.3 * (double)total));
  check(e == cudaSuccess, "large-chunk-after-trim", "%s", cudaGetErrorName(e));
  if (e == cudaSuccess) CK(cudaFree(plain));
}

int main(void) {
  g_prog = "mempool";
  bool shim = shim_as_expected();
  vmmshim_stats_t st0, st1;
  shim_stats(&st0);
  CK(cudaDeviceGetDefaultMemPool(&g_pool, 0));
  cudaMemPool_t cur;
  CK(cudaDeviceGetMemPool(&cur, 0));
  check(cur == g_pool, "current-is-default", "current %p default %p", (void *)cur, (void *)g_pool);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cupy_sequences(s);
  high_watermarks(s);
  threshold(s);
  trims(s);
  large_chunk(shim);
  if (shim) {
    shim_stats(&st1);
    check(st1.allocs[1] + st1.allocs[3] > st0.allocs[1] + st0.allocs[3], "shim-served",
          "the shim served no stream-ordered allocation");
  }
  CK(cudaStreamDestroy(s));
  return finish();
}
