/* mempool_checks.h: sequences of stream-ordered allocations with the driver's documented pool
 * semantics as the oracle (cuMemPoolGetAttribute, cuMemPoolSetAttribute, cuMemPoolTrimTo on a
 * device's default pool), for test_shim_mempool (shared runtime) and test_static_mempool
 * (static runtime). Each program runs them under the shim and, in a child without it, on the
 * emulation alone (whose pools keep freed memory as the driver's do, tests/emu/emu.h): the same
 * checks must hold in both, so they assert what the driver promises, not what the shim does.
 * Where the driver leaves room (memory is held in granules: the reserve may exceed what is in
 * use, a trim may keep up to a granule more than asked), the checks allow it.
 *
 * The first sequences are CuPy's TestMemoryAsyncPool tests (used_bytes, free_bytes,
 * total_bytes, free_all_blocks) as our own checks: allocations of 1, 2 and 4 units on the
 * legacy stream and a second stream, frees, a trim. */
#ifndef VMMSHIM_TEST_MEMPOOL_CHECKS_H
#define VMMSHIM_TEST_MEMPOOL_CHECKS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "check.h"
#include "emu.h"

#define MiB (1ull << 20)
#define UNIT 1024ull      /* CuPy's tests allocate multiples of a unit */
#define GRANULE (2 * MiB) /* the emulated device's granularity, and what a trim may keep over */

static cudaMemPool_t mp_pool(int dev) {
  cudaMemPool_t p = NULL;
  CHECK(cudaDeviceGetDefaultMemPool(&p, dev) == cudaSuccess && p, "default pool of device %d", dev);
  return p;
}

static unsigned long long mp_attr(cudaMemPool_t pool, enum cudaMemPoolAttr a) {
  cuuint64_t v = 0xdeadull;
  cudaError_t e = cudaMemPoolGetAttribute(pool, a, &v);
  CHECK(e == cudaSuccess, "cudaMemPoolGetAttribute(%d): %s", (int)a, cudaGetErrorName(e));
  return (unsigned long long)v;
}
#define RESERVED(p) mp_attr(p, cudaMemPoolAttrReservedMemCurrent)
#define RESERVED_HIGH(p) mp_attr(p, cudaMemPoolAttrReservedMemHigh)
#define USED(p) mp_attr(p, cudaMemPoolAttrUsedMemCurrent)
#define USED_HIGH(p) mp_attr(p, cudaMemPoolAttrUsedMemHigh)
#define THRESHOLD(p) mp_attr(p, cudaMemPoolAttrReleaseThreshold)

static cudaError_t mp_set(cudaMemPool_t pool, enum cudaMemPoolAttr a, cuuint64_t v) {
  return cudaMemPoolSetAttribute(pool, a, &v);
}

static unsigned long long mp_allocs, mp_captured; /* made by mp_alloc; of which in a capture */

static void *mp_alloc(size_t n, cudaStream_t s) {
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, n, s);
  CHECK(e == cudaSuccess && p, "cudaMallocAsync(%zu): %s", n, cudaGetErrorName(e));
  mp_allocs += e == cudaSuccess;
  return p;
}
static void mp_free(void *p, cudaStream_t s) {
  cudaError_t e = cudaFreeAsync(p, s);
  CHECK(e == cudaSuccess, "cudaFreeAsync: %s", cudaGetErrorName(e));
}

/* CuPy's free_all_blocks: the stream synchronised, then the pool trimmed to nothing. With
 * nothing live, nothing is reserved after it. */
static void mp_free_all(cudaMemPool_t pool, cudaStream_t s) {
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess, "trim");
}

/* test_used_bytes, test_used_bytes2 (1 KiB, then 3 KiB, live together): the use follows every
 * allocation and free at once. */
static void seq_used_bytes(cudaMemPool_t pool) {
  CHECK(USED(pool) == 0 && RESERVED(pool) == 0, "clean start: used %llu reserved %llu", USED(pool), RESERVED(pool));
  void *p1 = mp_alloc(2 * UNIT, 0);
  CHECK(USED(pool) == 2 * UNIT, "used %llu after 2 units", USED(pool));
  void *p2 = mp_alloc(4 * UNIT, 0);
  CHECK(USED(pool) == 6 * UNIT, "used %llu after 6 units", USED(pool));
  CHECK(RESERVED(pool) >= USED(pool), "reserved %llu below used %llu", RESERVED(pool), USED(pool));
  mp_free(p2, 0);
  CHECK(USED(pool) == 2 * UNIT, "used %llu after freeing 4 units", USED(pool));
  mp_free(p1, 0);
  CHECK(USED(pool) == 0, "used %llu after freeing all", USED(pool));
  void *p3 = mp_alloc(1 * UNIT, 0);
  CHECK(USED(pool) == 1 * UNIT, "used %llu after 1 unit", USED(pool));
  mp_free(p3, 0);
  CHECK(USED(pool) == 0, "used %llu at the end", USED(pool));
  void *a = mp_alloc(1 * UNIT, 0), *b = mp_alloc(3 * UNIT, 0);
  CHECK(USED(pool) == 4 * UNIT, "used %llu with 1 KiB and 3 KiB live", USED(pool));
  /* the driver counts the bytes asked for, unrounded */
  void *c = mp_alloc(1, 0), *d = mp_alloc(1000, 0), *e = mp_alloc(1 * MiB + 1, 0);
  CHECK(USED(pool) == 4 * UNIT + 1 + 1000 + 1 * MiB + 1, "used %llu with odd sizes live", USED(pool));
  mp_free(c, 0);
  mp_free(d, 0);
  mp_free(e, 0);
  mp_free(a, 0);
  mp_free(b, 0);
  mp_free_all(pool, 0);
  CHECK(USED(pool) == 0 && RESERVED(pool) == 0, "after free_all_blocks: used %llu reserved %llu", USED(pool),
        RESERVED(pool));
}

/* test_used_bytes_stream, test_total_bytes_stream, test_free_bytes_stream: 4 units freed on
 * the legacy stream stay reserved while 2 units live on another stream. */
static void seq_stream(cudaMemPool_t pool, cudaStream_t s) {
  void *p1 = mp_alloc(4 * UNIT, 0);
  mp_free(p1, 0);
  void *p2 = mp_alloc(2 * UNIT, s);
  unsigned long long used = USED(pool), total = RESERVED(pool);
  CHECK(used == 2 * UNIT, "used %llu with 2 units live on the second stream", used);
  CHECK(total >= 6 * UNIT, "total %llu: the freed 4 units are still the pool's", total);
  CHECK(total - used >= 4 * UNIT, "free %llu", total - used);
  mp_free(p2, s);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  mp_free_all(pool, 0);
  CHECK(USED(pool) == 0 && RESERVED(pool) == 0, "after free_all_blocks: used %llu reserved %llu", USED(pool),
        RESERVED(pool));
}

/* test_free_bytes2, test_total_bytes: what is freed stays reserved (free) until a trim. */
static void seq_free_bytes(cudaMemPool_t pool) {
  void *p1 = mp_alloc(2 * UNIT, 0);
  CHECK(RESERVED(pool) >= 2 * UNIT && RESERVED(pool) >= USED(pool), "total %llu with 2 units", RESERVED(pool));
  void *p2 = mp_alloc(4 * UNIT, 0);
  unsigned long long total = RESERVED(pool);
  CHECK(total >= 6 * UNIT, "total %llu with 6 units", total);
  mp_free(p2, 0);
  CHECK(RESERVED(pool) - USED(pool) >= 4 * UNIT, "free %llu after freeing 4 units", RESERVED(pool) - USED(pool));
  mp_free(p1, 0);
  CHECK(RESERVED(pool) - USED(pool) >= 6 * UNIT && USED(pool) == 0, "free %llu after freeing all",
        RESERVED(pool) - USED(pool));
  void *p3 = mp_alloc(1 * UNIT, 0);
  CHECK(RESERVED(pool) >= 6 * UNIT && RESERVED(pool) - USED(pool) >= 5 * UNIT, "total %llu free %llu with 1 unit",
        RESERVED(pool), RESERVED(pool) - USED(pool));
  mp_free(p3, 0);
  mp_free_all(pool, 0);
  CHECK(RESERVED(pool) == 0, "total %llu after free_all_blocks", RESERVED(pool));
}

/* Four blocks of a granule, all freed: trims keep at least what they are asked to keep, at most a
 * granule more, and never more than there was. The release threshold keeps everything (the
 * driver's default, 0, would give the memory back at the synchronisation already). */
static void seq_trim(cudaMemPool_t pool, cudaStream_t s) {
  CHECK(THRESHOLD(pool) == UINT64_MAX, "threshold %llu", THRESHOLD(pool));
  void *p[4];
  for (int i = 0; i < 4; i++) p[i] = mp_alloc(GRANULE, s);
  CHECK(USED(pool) == 4 * GRANULE && RESERVED(pool) >= 4 * GRANULE, "used %llu reserved %llu", USED(pool),
        RESERVED(pool));
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess, "trim");
  CHECK(USED(pool) == 4 * GRANULE && RESERVED(pool) >= 4 * GRANULE, "a trim keeps what is live: reserved %llu",
        RESERVED(pool));
  for (int i = 0; i < 4; i++) mp_free(p[i], s);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  unsigned long long before = RESERVED(pool);
  CHECK(cudaMemPoolTrimTo(pool, 3 * MiB) == cudaSuccess, "trim to 3 MiB");
  unsigned long long after = RESERVED(pool);
  CHECK(after >= 3 * MiB && after < 3 * MiB + GRANULE, "trimmed to 3 MiB: %llu (was %llu)", after, before);
  CHECK(cudaMemPoolTrimTo(pool, 16 * MiB) == cudaSuccess && RESERVED(pool) == after, "trim above: %llu",
        RESERVED(pool));
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess && RESERVED(pool) == 0, "trim to 0: %llu", RESERVED(pool));
}

/* The high watermarks: they keep the peak, and setting 0 resets them to the current value
 * (another value is refused). */
static void seq_high(cudaMemPool_t pool, cudaStream_t s) {
  CHECK(mp_set(pool, cudaMemPoolAttrUsedMemHigh, 0) == cudaSuccess, "reset used high");
  CHECK(mp_set(pool, cudaMemPoolAttrReservedMemHigh, 0) == cudaSuccess, "reset reserved high");
  CHECK(USED_HIGH(pool) == 0 && RESERVED_HIGH(pool) == RESERVED(pool), "after reset: used high %llu, reserved high %llu",
        USED_HIGH(pool), RESERVED_HIGH(pool));
  void *a = mp_alloc(3 * MiB, s), *b = mp_alloc(1 * MiB, s);
  CHECK(USED_HIGH(pool) == 4 * MiB && RESERVED_HIGH(pool) >= 4 * MiB, "high: used %llu reserved %llu",
        USED_HIGH(pool), RESERVED_HIGH(pool));
  mp_free(a, s);
  CHECK(USED(pool) == 1 * MiB && USED_HIGH(pool) == 4 * MiB, "used %llu, high %llu", USED(pool), USED_HIGH(pool));
  int v0 = emu_violations();
  CHECK(mp_set(pool, cudaMemPoolAttrUsedMemHigh, 1) == cudaErrorInvalidValue, "a high watermark resets to 0 only");
  cudaGetLastError();
  CHECK(USED_HIGH(pool) == 4 * MiB, "high %llu after a refused reset", USED_HIGH(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrUsedMemHigh, 0) == cudaSuccess && USED_HIGH(pool) == 1 * MiB,
        "used high reset to the current use: %llu", USED_HIGH(pool));
  CHECK(RESERVED_HIGH(pool) >= RESERVED(pool) && RESERVED_HIGH(pool) >= 4 * MiB, "reserved high %llu",
        RESERVED_HIGH(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReservedMemHigh, 0) == cudaSuccess && RESERVED_HIGH(pool) == RESERVED(pool),
        "reserved high reset to the current reserve: %llu vs %llu", RESERVED_HIGH(pool), RESERVED(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrUsedMemCurrent, 0) == cudaErrorInvalidValue, "the use is read-only");
  cudaGetLastError();
  CHECK(emu_violations() == v0 + 2, "the driver saw the two refused calls: %d", emu_violations() - v0);
  mp_free(b, s);
  mp_free_all(pool, s);
  CHECK(USED(pool) == 0 && USED_HIGH(pool) == 1 * MiB, "used %llu high %llu", USED(pool), USED_HIGH(pool));
}

/* The release threshold: what was set is answered; memory freed above it is given back (by the
 * next synchronisation, at the latest) in whole granules while the reserve is above it (the
 * driver gives back a granule that takes the reserve below it: on an H100, 32 MiB ones with a
 * threshold of 3 MiB leave nothing). Frees here are cudaFree, which synchronises (the shim
 * gives memory back at frees, and learns of a stream's frees later). Left at UINT64_MAX (keep
 * everything), as CuPy and PyTorch set it. */
static void seq_threshold(cudaMemPool_t pool, cudaStream_t s) {
  CHECK(THRESHOLD(pool) == 0, "default release threshold %llu", THRESHOLD(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReleaseThreshold, UINT64_MAX) == cudaSuccess, "set");
  CHECK(THRESHOLD(pool) == UINT64_MAX, "threshold %llu", THRESHOLD(pool));
  void *p = mp_alloc(4 * MiB, s);
  CHECK(cudaFree(p) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "free");
  CHECK(USED(pool) == 0 && RESERVED(pool) >= 4 * MiB, "kept: reserved %llu", RESERVED(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReleaseThreshold, 0) == cudaSuccess && THRESHOLD(pool) == 0, "set 0");
  CHECK(cudaDeviceSynchronize() == cudaSuccess && RESERVED(pool) == 0, "given back: reserved %llu", RESERVED(pool));
  p = mp_alloc(2 * MiB, s);
  CHECK(cudaFree(p) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "free");
  CHECK(RESERVED(pool) == 0, "threshold 0: reserved %llu", RESERVED(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReleaseThreshold, 3 * MiB) == cudaSuccess, "set 3 MiB");
  void *q[4];
  for (int i = 0; i < 4; i++) q[i] = mp_alloc(GRANULE, s);
  for (int i = 0; i < 4; i++) CHECK(cudaFree(q[i]) == cudaSuccess, "free");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
  CHECK(USED(pool) == 0 && RESERVED(pool) <= 3 * MiB, "threshold 3 MiB: reserved %llu", RESERVED(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReleaseThreshold, UINT64_MAX) == cudaSuccess, "set");
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess && RESERVED(pool) == 0, "trim: %llu", RESERVED(pool));
}

/* An allocation made while a stream is captured is the graph's, not the pool's. */
static void seq_capture(cudaMemPool_t pool) {
  cudaStream_t cs;
  cudaGraph_t g = NULL;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) == cudaSuccess, "stream");
  unsigned long long used = USED(pool), reserved = RESERVED(pool);
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed) == cudaSuccess, "begin capture");
  void *ga = mp_alloc(8 * MiB, cs);
  mp_captured++;
  CHECK(cudaStreamEndCapture(cs, &g) == cudaSuccess, "end capture");
  CHECK(USED(pool) == used && RESERVED(pool) == reserved, "a graph allocation counted: used %llu reserved %llu",
        USED(pool), RESERVED(pool));
  CHECK(cudaGraphDestroy(g) == cudaSuccess && cudaFree(ga) == cudaSuccess, "graph destroyed");
  CHECK(cudaStreamDestroy(cs) == cudaSuccess, "stream destroyed");
}

/* Every sequence, in order, on device 0's default pool. */
static void mempool_sequences(void) {
  cudaMemPool_t pool = mp_pool(0);
  cudaMemPool_t cur = NULL;
  CHECK(cudaDeviceGetMemPool(&cur, 0) == cudaSuccess && cur == pool, "the current pool is the default");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  seq_used_bytes(pool);
  seq_stream(pool, s);
  seq_free_bytes(pool);
  seq_threshold(pool, s);
  seq_trim(pool, s);
  seq_high(pool, s);
  seq_capture(pool);
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroyed");
}

/* Two devices (emu_set_device_count(2) made before): each default pool counts its device's
 * allocations alone, and keeps its own release threshold. */
static void mempool_devices(void) {
  cudaMemPool_t p0 = mp_pool(0), p1 = mp_pool(1);
  CHECK(p0 && p1 && p0 != p1, "two pools");
  CHECK(cudaSetDevice(1) == cudaSuccess, "device 1");
  void *a = mp_alloc(3 * MiB, 0);
  CHECK(USED(p1) == 3 * MiB && USED(p0) == 0, "device 1's allocation: pools %llu and %llu", USED(p0), USED(p1));
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  void *b = mp_alloc(1 * MiB, 0);
  CHECK(USED(p0) == 1 * MiB && USED(p1) == 3 * MiB, "pools %llu and %llu", USED(p0), USED(p1));
  CHECK(RESERVED(p0) >= 1 * MiB && RESERVED(p1) >= 3 * MiB, "reserves %llu and %llu", RESERVED(p0), RESERVED(p1));
  CHECK(mp_set(p0, cudaMemPoolAttrReleaseThreshold, UINT64_MAX) == cudaSuccess, "device 0 keeps all");
  CHECK(mp_set(p1, cudaMemPoolAttrReleaseThreshold, 0) == cudaSuccess, "device 1 keeps nothing");
  CHECK(THRESHOLD(p0) == UINT64_MAX && THRESHOLD(p1) == 0, "thresholds");
  CHECK(cudaFree(b) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "free on device 0");
  CHECK(USED(p0) == 0 && RESERVED(p0) >= 1 * MiB, "device 0 keeps %llu", RESERVED(p0));
  CHECK(cudaSetDevice(1) == cudaSuccess, "device 1");
  CHECK(cudaFree(a) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "free on device 1");
  CHECK(USED(p1) == 0 && RESERVED(p1) == 0, "device 1 keeps %llu", RESERVED(p1));
  CHECK(RESERVED(p0) >= 1 * MiB, "device 0 still keeps %llu", RESERVED(p0));
  CHECK(cudaMemPoolTrimTo(p0, 0) == cudaSuccess && RESERVED(p0) == 0, "device 0 trimmed: %llu", RESERVED(p0));
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
}

#endif
