/* test_static_mempool: the sequences of tests/mempool_checks.h with the (emulated) runtime
 * linked statically, as nvcc links by default: its cudaMemPoolGetAttribute, cudaMallocAsync
 * and the rest reach the driver through cuGetProcAddress, which the shim answers with its
 * driver hooks. Under the shim, and in a child without it (`plain`), the same checks hold; and
 * on two devices (`mgpu`). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "mempool_checks.h"

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120);
  const char *scenario = check_child_main(argc, argv);
  if (scenario) {
    if (!strcmp(scenario, "plain")) {
      mempool_sequences();
      CHECK(shim_active() == -1, "the shim is not loaded");
      CHECK(emu_violations() == 2, "%d contract violations (2 made on purpose)", emu_violations());
    } else if (!strcmp(scenario, "mgpu")) {
      emu_set_device_count(2);
      mempool_devices();
      CHECK(shim_active() == 1 && emu_violations() == 0, "the shim is active, %d contract violations", emu_violations());
    } else {
      CHECK(0, "unknown scenario %s", scenario);
    }
    return check_child_summary(scenario);
  }
  CHECK(shim_active() == 1, "the shim is loaded and active");
  emu_counters_t e0 = emu_now();
  vmmshim_stats_t s0 = shim_stats();
  mempool_sequences();
  emu_counters_t e1 = emu_now();
  vmmshim_stats_t s1 = shim_stats();
  unsigned long long served = s1.allocs[VMMSHIM_API_DRIVER_ASYNC] - s0.allocs[VMMSHIM_API_DRIVER_ASYNC];
  CHECK(mp_allocs > 20 && served == mp_allocs - mp_captured,
        "the shim's driver hooks served %llu of the %llu stream-ordered allocations", served, mp_allocs);
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync + mp_captured, "%llu reached the driver",
        e1.n_cuMemAllocAsync - e0.n_cuMemAllocAsync);
  CHECK(emu_violations() == 2, "%d contract violations (2 made on purpose)", emu_violations());
  check_run_child("plain", "LD_PRELOAD=", NULL);
  check_run_child("mgpu", NULL);
  return check_summary();
}
