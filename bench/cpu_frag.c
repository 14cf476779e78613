/* Irregular workloads on the host emulation, under the shim: how much memory the shim holds
 * for them and how many driver calls it makes (`make bench-cpu`; no GPU). The driver's costs
 * are not modelled here: on a GPU each VMM call costs 1-1000 us (bench/churn.cu and
 * bench/replay.cu measure them there); this counts them.
 *
 *   cpu_frag <churn|varlen|FILE> <sync|async> [steps]
 *
 * churn, varlen: bench/workloads.h (default 20000 and 200 steps); FILE: a replay trace
 * (bench/gen_trace.py's format). sync: cudaMalloc/cudaFree; async: cudaMallocAsync/
 * cudaFreeAsync on one stream. The memory is not touched. The emulated device has 80 GiB and
 * keeps up with the program (emu_set_eager: an event recorded on an idle stream completes at
 * once, as on a GPU with no work queued).
 * CPU_FRAG_PAUSE_US=N busy-waits N us between events (a GPU program's work between them).
 * CPU_FRAG_EAGER=0: events complete only as the emulated stream advances (a GPU that lags
 * behind the program), not at once.
 * Prints one line:
 *   R cpu-frag work=.. mode=.. allocs=.. peak_live=<requested> peak_mapped=.. held_live=..
 *     vmm=<calls> warm=<events of the warm-up> vmm_steady=<calls after it>
 *     vmm_per_100=<steady calls per 100 steady allocations> creates=.. maps=.. set_access=..
 *     unmaps=.. releases=.. <kind>_100=<steady calls of that kind per 100 steady allocations>
 *     costly_100=<creates and releases> cheap_100=<maps, set-access and unmaps>
 *     est_driver_us=<estimated GPU driver time per steady allocation> ms=..
 * est_driver_us prices each steady call of a kind at an H100's median cost for a 64 MiB handle,
 * set-access per handle mapped (its cost follows the handles it covers, not the calls)
 * (docs/benchmarks.md, "CPU estimate of the driver's time"; CPU_FRAG_COSTS="create map
 * set_access unmap release" in us overrides them): the emulation counts calls, not their sizes,
 * and the churn's handles are mostly 16-512 MiB.
 * The warm-up lasts until live bytes first reach 90% of the run's peak (known in advance from
 * the events): before that the pool must grow, after it an allocator that reuses its memory
 * well needs few driver calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "emu.h"
#include "vmmshim.h"
#include "workloads.h"

#include <dlfcn.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static unsigned long long vmm_calls(void) {
  static int (*get)(vmmshim_stats_t *, size_t);
  if (!get) *(void **)&get = dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  vmmshim_stats_t s;
  if (!get || get(&s, sizeof s) != 0) return 0;
  return s.vmm_calls;
}

/* Median cost in us of cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease for a
 * 64 MiB handle on an H100 (docs/benchmarks.md), or CPU_FRAG_COSTS's five figures. */
static void costs(double c[5]) {
  static const double h100_64m[5] = {14.2, 1.0, 46.4, 27.1, 60.4};
  const char *env = getenv("CPU_FRAG_COSTS");
  memcpy(c, h100_64m, sizeof h100_64m);
  if (env && sscanf(env, "%lf %lf %lf %lf %lf", &c[0], &c[1], &c[2], &c[3], &c[4]) != 5) {
    fprintf(stderr, "cpu_frag: CPU_FRAG_COSTS wants five figures in us; using the H100's\n");
    memcpy(c, h100_64m, sizeof h100_64m);
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: cpu_frag <churn|varlen|FILE> <sync|async> [steps]\n");
    return 2;
  }
  int async = !strcmp(argv[2], "async");
  unsigned steps = argc > 3 ? (unsigned)atoi(argv[3]) : 0;
  size_t n = 0;
  wl_event_t *ev;
  const char *work = argv[1];
  if (!strcmp(work, "churn")) {
    if (!steps) steps = 20000;
    ev = malloc((WL_CHURN_WINDOW + 2 * (size_t)steps) * sizeof *ev);
    n = wl_churn(getenv("CPU_FRAG_SEED") ? strtoull(getenv("CPU_FRAG_SEED"), NULL, 0) : 1, steps, ev);
  } else if (!strcmp(work, "varlen")) {
    if (!steps) steps = 200;
    ev = malloc((WL_VARLEN_PARAM_EVENTS + (size_t)steps * WL_VARLEN_STEP_EVENTS) * sizeof *ev);
    n = wl_varlen(1, steps, ev);
  } else {
    ev = wl_read_trace(work, &n);
    if (!ev) perror(work);
    const char *slash = strrchr(work, '/');
    work = slash ? slash + 1 : work;
  }
  if (!ev || !n) return 1;
  unsigned max_id = 0;
  for (size_t i = 0; i < n; i++)
    if (ev[i].id > max_id) max_id = ev[i].id;
  void **ptr = calloc(max_id + 1, sizeof *ptr);
  size_t *size = calloc(max_id + 1, sizeof *size);
  /* The warm-up: until live bytes first reach 90% of the peak. */
  size_t warm = 0, lv = 0, pk = 0;
  for (int pass = 0; pass < 2; pass++) {
    lv = 0;
    for (size_t i = 0; i < n; i++) {
      if (ev[i].op == 'a') {
        size[ev[i].id] = ev[i].size;
        lv += ev[i].size;
      } else {
        lv -= size[ev[i].id];
        size[ev[i].id] = 0;
      }
      if (pass == 0 && lv > pk) pk = lv;
      if (pass == 1 && lv >= pk / 10 * 9) {
        warm = i + 1;
        break;
      }
    }
  }
  memset(size, 0, (max_id + 1) * sizeof *size);
  emu_set_device_memory(0, 80ull << 30);
  emu_set_eager(getenv("CPU_FRAG_EAGER") ? atoi(getenv("CPU_FRAG_EAGER")) : 1);
  cudaStream_t s = NULL;
  if (cudaFree(NULL) != cudaSuccess || (async && cudaStreamCreate(&s) != cudaSuccess)) return 1;
  size_t live = 0, peak = 0, allocs = 0, steady_allocs = 0;
  unsigned long long vmm0 = 0;
  const char *names[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"};
  long long base[5] = {0};
  /* CPU_FRAG_PAUSE_US: the time a program's GPU work takes between two events (busy wait), so
   * that the deferred mode's background reclaimer runs as often, relative to the events, as it
   * would beside a GPU program. Default 0. */
  double pause_ms = getenv("CPU_FRAG_PAUSE_US") ? atof(getenv("CPU_FRAG_PAUSE_US")) / 1e3 : 0;
  double t0 = now_ms();
  for (size_t i = 0; i < n; i++) {
    if (pause_ms > 0)
      for (double until = now_ms() + pause_ms; now_ms() < until;) {
      }
    if (i == warm) {
      vmm0 = vmm_calls();
      for (int k = 0; k < 5; k++) base[k] = emu_calls(names[k]);
    }
    const wl_event_t *e = &ev[i];
    if (e->op == 'a') {
      cudaError_t r = async ? cudaMallocAsync(&ptr[e->id], e->size, s) : cudaMalloc(&ptr[e->id], e->size);
      if (r != cudaSuccess) {
        printf("R cpu-frag work=%s failed=1 at_event=%zu size=%zu live=%zu\n", work, i, e->size, live);
        return 1;
      }
      size[e->id] = e->size;
      live += e->size;
      allocs++;
      steady_allocs += i >= warm;
      if (live > peak) peak = live;
    } else if (ptr[e->id]) {
      if ((async ? cudaFreeAsync(ptr[e->id], s) : cudaFree(ptr[e->id])) != cudaSuccess) return 1;
      ptr[e->id] = NULL;
      live -= size[e->id];
    }
  }
  double ms = now_ms() - t0;
  vmmshim_stats_t st;
  int (*get)(vmmshim_stats_t *, size_t) = NULL;
  *(void **)&get = dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  if (!get || get(&st, sizeof st) != 0) {
    fprintf(stderr, "cpu_frag: not running under the shim\n");
    return 1;
  }
  unsigned long long steady = st.vmm_calls - vmm0;
  printf("R cpu-frag work=%s mode=%s allocs=%zu peak_live=%zu peak_mapped=%llu held_live=%.3f vmm=%llu "
         "warm=%zu vmm_steady=%llu vmm_per_100=%.2f",
         work, async ? "async" : "sync", allocs, peak, (unsigned long long)st.peak_bytes_mapped,
         (double)st.peak_bytes_mapped / (double)peak, (unsigned long long)st.vmm_calls, warm, steady,
         steady_allocs ? 100.0 * (double)steady / (double)steady_allocs : 0.0);
  static const char *short_names[] = {"creates", "maps", "set_access", "unmaps", "releases"};
  long long kind[5];
  for (int k = 0; k < 5; k++) {
    kind[k] = emu_calls(names[k]) - base[k];
    printf(" %s=%lld", short_names[k], kind[k]);
  }
  double per = steady_allocs ? 100.0 / (double)steady_allocs : 0.0, cost[5];
  costs(cost);
  for (int k = 0; k < 5; k++) printf(" %s_100=%.2f", short_names[k], (double)kind[k] * per);
  /* cuMemSetAccess costs per handle it covers, however many calls cover them: priced per map. */
  double est = (double)kind[0] * cost[0] + (double)kind[1] * (cost[1] + cost[2]) + (double)kind[3] * cost[3] +
               (double)kind[4] * cost[4];
  printf(" costly_100=%.2f cheap_100=%.2f est_driver_us=%.2f", (double)(kind[0] + kind[4]) * per,
         (double)(kind[1] + kind[2] + kind[3]) * per, steady_allocs ? est / (double)steady_allocs : 0.0);
  printf(" ms=%.0f\n", ms);
  for (unsigned id = 0; id <= max_id; id++)
    if (ptr[id]) async ? cudaFreeAsync(ptr[id], s) : cudaFree(ptr[id]);
  return 0;
}
