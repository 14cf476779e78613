/* stats.c: process-wide counters (include/vmmshim.h) and the report printed at exit
 * when VMMSHIM_STATS=1. Counters are relaxed atomics: exact totals, no lock. */
#include <string.h>

#include "vmmshim/internal.h"

vmmshim_stats_t _vs_stats_data;

void _vs_stat_peak(uint64_t *peak, uint64_t value) {
  uint64_t cur = __atomic_load_n(peak, __ATOMIC_RELAXED);
  while (value > cur && !__atomic_compare_exchange_n(peak, &cur, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

VS_API int vmmshim_get_stats(vmmshim_stats_t *out, size_t size) {
  if (!out || size != sizeof *out) return -1;
  uint64_t *dst = (uint64_t *)out;
  const uint64_t *src = (const uint64_t *)&_vs_stats_data;
  for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
  return 0;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

void _vs_stats_print(void) {
  vmmshim_stats_t s;
  vmmshim_get_stats(&s, sizeof s);
  _vs_note("stats: mode %s, granularity %llu MiB, free mode %s",
           atomic_load(&_vs_state) == 1 ? "pool" : "pass-through",
           (unsigned long long)(_vs_option(VS_OPT_GRANULARITY) >> 20),
           _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED ? "deferred" : "sync");
  _vs_note("stats: allocations served: cudaMalloc %llu, cudaMallocAsync %llu, cuMemAlloc %llu, cuMemAllocAsync %llu",
           (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME], (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME_ASYNC],
           (unsigned long long)s.allocs[VMMSHIM_API_DRIVER], (unsigned long long)s.allocs[VMMSHIM_API_DRIVER_ASYNC]);
  _vs_note("stats: frees: cudaFree %llu, cudaFreeAsync %llu, cuMemFree %llu, cuMemFreeAsync %llu",
           (unsigned long long)s.frees[VMMSHIM_API_RUNTIME], (unsigned long long)s.frees[VMMSHIM_API_RUNTIME_ASYNC],
           (unsigned long long)s.frees[VMMSHIM_API_DRIVER], (unsigned long long)s.frees[VMMSHIM_API_DRIVER_ASYNC]);
  _vs_note("stats: failed allocations %llu, passed to the real driver %llu",
           (unsigned long long)s.alloc_failures, (unsigned long long)s.passthrough_allocs);
  _vs_note("stats: in use %.1f MiB (peak %.1f MiB), mapped %.1f MiB (peak %.1f MiB)", mib(s.bytes_in_use),
           mib(s.peak_bytes_in_use), mib(s.bytes_mapped), mib(s.peak_bytes_mapped));
  _vs_note("stats: VMM calls %llu taking %.3f ms, synchronisations for frees %llu, handles released when idle %llu",
           (unsigned long long)s.vmm_calls, (double)s.vmm_ns / 1e6, (unsigned long long)s.syncs,
           (unsigned long long)s.trims);
}
