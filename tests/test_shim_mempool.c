/* test_shim_mempool: the stream-ordered allocator's pool, as a program sees it under the shim
 * (cuMemPoolGetAttribute / SetAttribute / TrimTo on a device's default pool, through the shared
 * runtime and the driver API).
 *
 * The sequences of tests/mempool_checks.h (CuPy's TestMemoryAsyncPool tests among them) run
 * here under the shim, and in a child without it (`plain`): the emulation's pools keep freed
 * memory as the driver's do, so the same checks, written from the driver's documentation,
 * must hold in both. Then what is the shim's own:
 *   served    the allocations of the sequences were the shim's (none reached the driver), so
 *             the figures were its own;
 *   reserve   the reserve is what the shim maps less what live cudaMalloc blocks hold: a
 *             cudaMalloc takes from it, a cudaFree gives to it, and a cudaMalloc that grows the
 *             pool does not raise its high watermark;
 *   driver    the driver API's stream-ordered allocations count too, and cuGetProcAddress
 *             hands out the shim's pool functions (how the runtime reaches them);
 * and in scenarios of their own:
 *   mgpu, mgpu-plain  two devices: each default pool its own figures and threshold;
 *   env       VMMSHIM_RELEASE_THRESHOLD=2M with the program's threshold: the lower binds;
 *   disable   VMMSHIM_DISABLE=1: the queries reach the driver alone, the sequences hold. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "mempool_checks.h"

static void shim_served(void) {
  emu_counters_t e0 = emu_now();
  vmmshim_stats_t s0 = shim_stats();
  mempool_sequences();
  emu_counters_t e1 = emu_now();
  vmmshim_stats_t s1 = shim_stats();
  unsigned long long served = s1.allocs[VMMSHIM_API_RUNTIME_ASYNC] - s0.allocs[VMMSHIM_API_RUNTIME_ASYNC];
  CHECK(mp_allocs > 20 && served == mp_allocs - mp_captured, "the shim served %llu of the %llu stream-ordered allocations",
        served, mp_allocs);
  /* the allocations made during a capture are graphs' */
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync + mp_captured, "%llu reached the driver",
        e1.n_cuMemAllocAsync - e0.n_cuMemAllocAsync);
  CHECK(e1.n_cuMemPoolGetAttribute > e0.n_cuMemPoolGetAttribute, "the driver was asked too");
}

static void shim_reserve(void) {
  cudaMemPool_t pool = mp_pool(0);
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess && RESERVED(pool) == 0, "trimmed: %llu", RESERVED(pool));
  shim_trim();
  CHECK(emu_now().mapped_bytes == 0, "nothing mapped: %llu", emu_now().mapped_bytes);
  void *m = must_malloc(1 * MiB);
  unsigned long long mapped = emu_now().mapped_bytes;
  CHECK(mapped >= 2 * MiB && RESERVED(pool) == mapped - 1 * MiB && USED(pool) == 0,
        "a live cudaMalloc block is not in the reserve: mapped %llu, reserved %llu", mapped, RESERVED(pool));
  void *a = mp_alloc(1 * MiB, 0);
  CHECK(USED(pool) == 1 * MiB && RESERVED(pool) == mapped - 1 * MiB && emu_now().mapped_bytes == mapped,
        "served from the idle memory: used %llu reserved %llu", USED(pool), RESERVED(pool));
  CHECK(cudaFree(m) == cudaSuccess && RESERVED(pool) == mapped, "a cudaFree gives to the reserve: %llu",
        RESERVED(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReservedMemHigh, 0) == cudaSuccess, "reset");
  unsigned long long high = RESERVED_HIGH(pool);
  CHECK(high == RESERVED(pool), "high %llu", high);
  void *big = must_malloc(64 * MiB);
  CHECK(emu_now().mapped_bytes >= mapped + 64 * MiB && RESERVED_HIGH(pool) == high,
        "a cudaMalloc that grows the pool: mapped %llu, reserved high %llu (was %llu)", emu_now().mapped_bytes,
        RESERVED_HIGH(pool), high);
  CHECK(cudaFree(big) == cudaSuccess && RESERVED(pool) >= 64 * MiB && RESERVED_HIGH(pool) == RESERVED(pool),
        "freed: reserved %llu high %llu", RESERVED(pool), RESERVED_HIGH(pool));
  mp_free(a, 0);
  mp_free_all(pool, 0);
  CHECK(RESERVED(pool) == 0 && USED(pool) == 0, "at the end: reserved %llu", RESERVED(pool));
}

static void shim_driver(void) {
  static const char *const names[] = {"cuMemPoolGetAttribute", "cuMemPoolSetAttribute", "cuMemPoolTrimTo"};
  for (int i = 0; i < 3; i++) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress_v2(names[i], &fn, 12000, 0, &st) == CUDA_SUCCESS && in_shim(fn),
          "cuGetProcAddress(%s) answers %s", names[i], lib_of(fn));
  }
  CUmemoryPool pool = NULL;
  CUstream s = NULL;
  CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS && cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS,
        "pool and stream");
  cuuint64_t used = 1, reserved = 0;
  CUdeviceptr d = 0;
  CHECK(cuMemAllocAsync(&d, 5 * MiB, s) == CUDA_SUCCESS, "cuMemAllocAsync");
  CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == CUDA_SUCCESS && used == 5 * MiB,
        "used %llu", (unsigned long long)used);
  CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS, "free");
  CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS, "trim");
  CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS && reserved == 0,
        "reserved %llu", (unsigned long long)reserved);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS, "stream destroyed");
}

/* VMMSHIM_RELEASE_THRESHOLD=2M: idle memory above 2 MiB goes back at the frees even when the
 * program's threshold keeps everything; a program's threshold of 0 gives back the rest. */
static void scenario_env(void) {
  cudaMemPool_t pool = mp_pool(0);
  CHECK(mp_set(pool, cudaMemPoolAttrReleaseThreshold, UINT64_MAX) == cudaSuccess, "keep all");
  void *q[4];
  for (int i = 0; i < 4; i++) q[i] = mp_alloc(GRANULE, 0);
  for (int i = 0; i < 4; i++) CHECK(cudaFree(q[i]) == cudaSuccess, "free");
  CHECK(USED(pool) == 0 && RESERVED(pool) == 2 * MiB, "VMMSHIM_RELEASE_THRESHOLD binds: reserved %llu",
        RESERVED(pool));
  CHECK(THRESHOLD(pool) == UINT64_MAX, "the program's threshold is what it set: %llu", THRESHOLD(pool));
  CHECK(mp_set(pool, cudaMemPoolAttrReleaseThreshold, 0) == cudaSuccess, "keep none");
  CHECK(RESERVED(pool) == 0, "the program's threshold binds: reserved %llu", RESERVED(pool));
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120);
  const char *scenario = check_child_main(argc, argv);
  if (scenario) {
    if (!strcmp(scenario, "plain") || !strcmp(scenario, "disable")) {
      mempool_sequences();
    } else if (!strncmp(scenario, "mgpu", 4)) {
      emu_set_device_count(2);
      mempool_devices();
    } else if (!strcmp(scenario, "env")) {
      scenario_env();
    } else {
      CHECK(0, "unknown scenario %s", scenario);
    }
    int deliberate = !strcmp(scenario, "plain") || !strcmp(scenario, "disable") ? 2 : 0;
    CHECK(emu_violations() == deliberate, "%d contract violations (%d made on purpose)", emu_violations(), deliberate);
    if (!strcmp(scenario, "plain") || !strcmp(scenario, "mgpu-plain"))
      CHECK(shim_active() == -1, "the shim is not loaded in %s", scenario);
    return check_child_summary(scenario);
  }
  CHECK(shim_active() == 1, "the shim is loaded and active");
  shim_served();
  shim_reserve();
  shim_driver();
  CHECK(emu_violations() == 2, "%d contract violations (2 made on purpose)", emu_violations());
  check_run_child("plain", "LD_PRELOAD=", NULL);
  check_run_child("mgpu", NULL);
  check_run_child("mgpu-plain", "LD_PRELOAD=", NULL);
  check_run_child("env", "VMMSHIM_RELEASE_THRESHOLD=2M", NULL);
  check_run_child("disable", "VMMSHIM_DISABLE=1", NULL);
  return check_summary();
}
