/* test_unit_faults: every VMM call a pool makes fails once, injected in the emulation
 * (emu_fail_after), at each place the pool makes it: the address reservation (pool creation, a
 * growth's new reservation), cuMemCreate, cuMemMap (one piece of several), cuMemSetAccess,
 * cuMemUnmap (giving idle memory back, a growth's undo, handles unmapped to be mapped again,
 * teardown), cuMemRelease and cuMemAddressFree. After each, the pool is checked whole
 * (_vs_pool_check), every live block keeps its bytes, what the shim counts as mapped equals what
 * the emulation has mapped (bytes, handles, the stats), no contract violation (nothing mapped
 * over a mapped range), and the pool goes on serving, trimming and growing. A range whose unmap
 * failed stays out of use and counted as mapped; teardown leaves exactly what it could not unmap.
 * Nothing else leaks: each case ends with the emulation holding nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim/internal.h"
#define CHECK_UNIT_HELPERS
#include "check.h"

#define MiB (1024ull * 1024)

typedef struct {
  CUdeviceptr p;
  size_t n;
  unsigned seed;
} blk_t;

static CUcontext g_ctx;
static vs_device_caps_t g_caps;
static vs_pool_t *pool;
static blk_t live[64];
static int nlive;
static unsigned g_seed;
static bool g_contended;
static const char *g_case;
/* What earlier cases had to leave in the emulation (a range teardown could not unmap, a handle
 * whose release failed, a reservation the driver would not free). */
static unsigned long long g_left_bytes;
static long g_left_handles, g_left_mappings, g_left_resv;

static emu_counters_t now(void) {
  emu_counters_t e;
  emu_get_counters(&e);
  return e;
}

/* A pool with these options ("" leaves one unset). */
static void fresh(const char *name, const char *gran, const char *max_handle, const char *reserve) {
  g_case = name;
  printf("-- %s\n", name);
  setenv("VMMSHIM_GRANULARITY", gran, 1);
  if (*max_handle) setenv("VMMSHIM_MAX_HANDLE", max_handle, 1);
  else unsetenv("VMMSHIM_MAX_HANDLE");
  if (*reserve) setenv("VMMSHIM_RESERVE", reserve, 1);
  else unsetenv("VMMSHIM_RESERVE");
  _vs_config_reload();
  nlive = 0;
  pool = _vs_pool_create(g_ctx, &g_caps, NULL);
  CHECK(pool != NULL, "%s: pool", name);
}

static vs_pool_status_t try_alloc(size_t n, CUdeviceptr *out, CUresult *err) {
  size_t served = 0;
  *out = 0;
  return _vs_pool_alloc(pool, n, VS_NO_STREAM, VMMSHIM_API_DRIVER, out, &served, err, &g_contended);
}

/* A live block of n bytes, filled with its pattern; false when the pool refused. */
static bool a(size_t n) {
  CUdeviceptr p;
  CUresult err;
  if (nlive == 64 || try_alloc(n, &p, &err) != VS_POOL_OK) return false;
  live[nlive] = (blk_t){p, n, ++g_seed};
  pat_fill_sparse((void *)(uintptr_t)p, n, g_seed);
  nlive++;
  return true;
}

static void f(int i) {
  size_t sz, req;
  CUresult err;
  CHECK(pat_check_sparse((void *)(uintptr_t)live[i].p, live[i].n, live[i].seed) == (size_t)-1, "%s: block intact",
        g_case);
  CHECK(_vs_pool_free(pool, live[i].p, VS_FREE_KIND_SYNC, VS_NO_STREAM, VMMSHIM_API_DRIVER, &sz, &req, &err) ==
            VS_POOL_OK,
        "%s: free", g_case);
  live[i] = live[--nlive];
}

/* The pool whole, every live block intact and apart, the shim's counts equal to the emulation's;
 * `leaked_handles`: handles the emulation holds that the pool may not know (a failed release). */
static void consistent(const char *when, long leaked_handles) {
  CHECK(_vs_pool_check(pool) == 0, "%s, %s: _vs_pool_check", g_case, when);
  for (int i = 0; i < nlive; i++) {
    CHECK(pat_check_sparse((void *)(uintptr_t)live[i].p, live[i].n, live[i].seed) == (size_t)-1,
          "%s, %s: block %d intact", g_case, when, i);
    for (int j = 0; j < i; j++)
      CHECK(!overlaps(live[i].p, live[i].n, live[j].p, live[j].n), "%s, %s: blocks %d and %d apart", g_case, when, i, j);
  }
  emu_counters_t e = now();
  vs_pool_figures_t fg;
  _vs_pool_figures(pool, &fg);
  unsigned long long mapped = _vs_mapped_total(), stat = __atomic_load_n(&_vs_stats_data.bytes_mapped, __ATOMIC_RELAXED);
  CHECK(mapped == e.mapped_bytes && stat == mapped && fg.mapped[0] + fg.mapped[1] + g_left_bytes == e.mapped_bytes,
        "%s, %s: mapped: shim %llu, stats %llu, pool %zu (+%llu left before), emulation %llu", g_case, when, mapped,
        stat, fg.mapped[0] + fg.mapped[1], g_left_bytes, e.mapped_bytes);
  CHECK((long)fg.handles + g_left_handles + leaked_handles == e.live_handles &&
            (long)fg.handles + g_left_mappings == e.live_mappings,
        "%s, %s: handles: pool %zu (+%ld left before, +%ld now), emulation %ld handles, %ld mappings", g_case, when,
        fg.handles, g_left_handles, leaked_handles, e.live_handles, e.live_mappings);
  CHECK(emu_violations() == 0, "%s, %s: %d contract violations", g_case, when, emu_violations());
  CHECK(emu_faults_left("cuMemAddressReserve") + emu_faults_left("cuMemCreate") + emu_faults_left("cuMemMap") +
                emu_faults_left("cuMemSetAccess") + emu_faults_left("cuMemUnmap") + emu_faults_left("cuMemRelease") +
                emu_faults_left("cuMemAddressFree") ==
            0,
        "%s, %s: every injected failure was met", g_case, when);
}

/* The pool keeps working: blocks of several sizes, freed, a trim, again. */
static void keeps_working_leaked(long leaked_handles) {
  int before = nlive;
  static const size_t sizes[] = {1000, 3 * MiB, 64 * MiB, 130 * MiB, 200 << 10};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) CHECK(a(sizes[i]), "%s: allocate %zu after", g_case, sizes[i]);
  consistent("allocating after", leaked_handles);
  while (nlive > before) f(nlive - 1);
  _vs_pool_trim(pool, 0);
  consistent("trimming after", leaked_handles);
  CHECK(a(64 * MiB) && a(64 * MiB), "%s: 2 x 64 MiB after the trim", g_case);
  consistent("growing after the trim", leaked_handles);
}
static void keeps_working(void) { keeps_working_leaked(0); }

/* Frees everything and destroys the pool: the emulation holds nothing but what earlier cases
 * left and what this one may (handles still mapped, handles, reservations), which is added to
 * what is left. */
static void finish(long mappings_left, long handles_left, long resv_left) {
  while (nlive) f(nlive - 1);
  _vs_pool_destroy(pool);
  pool = NULL;
  emu_counters_t e = now();
  g_left_mappings += mappings_left;
  g_left_handles += handles_left;
  g_left_resv += resv_left;
  CHECK(e.live_mappings == g_left_mappings && e.live_handles == g_left_handles && e.live_reservations == g_left_resv,
        "%s: after destroy: %ld mappings, %ld handles, %ld reservations; want %ld, %ld, %ld", g_case, e.live_mappings,
        e.live_handles, e.live_reservations, g_left_mappings, g_left_handles, g_left_resv);
  CHECK(mappings_left || e.mapped_bytes == g_left_bytes, "%s: %llu bytes mapped, want %llu", g_case, e.mapped_bytes,
        g_left_bytes);
  g_left_bytes = e.mapped_bytes;
  CHECK(_vs_mapped_total() == e.mapped_bytes && __atomic_load_n(&_vs_stats_data.bytes_mapped, __ATOMIC_RELAXED) ==
                                                    e.mapped_bytes,
        "%s: the shim counts %zu bytes mapped, the emulation %llu", g_case, _vs_mapped_total(), e.mapped_bytes);
  CHECK(emu_violations() == 0, "%s: %d violations", g_case, emu_violations());
}

/* ------------------------------------------------------------------ the cases */

static void reserve_faults(void) {
  /* At creation: no pool, nothing left reserved. */
  emu_fail_next("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY, 1);
  vs_pool_t *none = _vs_pool_create(g_ctx, &g_caps, NULL);
  CHECK(none == NULL && now().live_reservations == 0, "reserve at creation: no pool, %ld reservations left",
        now().live_reservations);
  emu_fail_after("cuMemAddressReserve", 1, CUDA_ERROR_OUT_OF_MEMORY, 1); /* the second (small heap) one */
  none = _vs_pool_create(g_ctx, &g_caps, NULL);
  CHECK(none == NULL && now().live_reservations == 0, "second reserve at creation: no pool, %ld reservations left",
        now().live_reservations);
  /* A growth that needs a new reservation: out of memory, then served once the driver agrees. */
  fresh("reserve at growth", "64M", "", "256M");
  CHECK(a(100 * MiB), "a block");
  CUdeviceptr p;
  CUresult err;
  emu_fail_next("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY, 2); /* the growth, and its retry */
  CHECK(try_alloc(300 * MiB, &p, &err) == VS_POOL_OOM && err == CUDA_ERROR_OUT_OF_MEMORY, "300 MiB: out of memory");
  consistent("after", 0);
  CHECK(a(300 * MiB), "300 MiB once the driver reserves");
  keeps_working();
  finish(0, 0, 0);
}

static void create_faults(void) {
  fresh("create", "64M", "", "");
  CHECK(a(10 * MiB), "a block");
  CUdeviceptr p;
  CUresult err;
  emu_fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 3); /* the growth, its retry after a trim */
  vs_pool_status_t st = try_alloc(100 * MiB, &p, &err);
  CHECK(st == VS_POOL_OOM && err == CUDA_ERROR_OUT_OF_MEMORY, "out of memory: %d %s", (int)st, _vs_cu_error_name(err));
  emu_clear_faults(); /* how many tries the ladder made is its own business */
  consistent("out of memory", 0);
  emu_fail_next("cuMemCreate", CUDA_ERROR_UNKNOWN, 1);
  st = try_alloc(100 * MiB, &p, &err);
  CHECK(st == VS_POOL_ERROR && err == CUDA_ERROR_UNKNOWN, "another error: %d %s", (int)st, _vs_cu_error_name(err));
  consistent("an error", 0);
  keeps_working();
  finish(0, 0, 0);
}

static void map_faults(void) {
  /* Handles of 8 MiB: a growth of 40 MiB is 5 pieces; the third map fails. */
  fresh("map", "64M", "8M", "");
  CHECK(a(10 * MiB), "a block");
  CUdeviceptr p;
  CUresult err;
  emu_counters_t e0 = now();
  emu_fail_after("cuMemMap", 2, CUDA_ERROR_INVALID_VALUE, 1);
  vs_pool_status_t st = try_alloc(40 * MiB, &p, &err);
  CHECK(st == VS_POOL_ERROR && err == CUDA_ERROR_INVALID_VALUE, "the growth fails: %d %s", (int)st,
        _vs_cu_error_name(err));
  CHECK(now().n_cuMemUnmap - e0.n_cuMemUnmap >= 2, "the two pieces mapped were unmapped");
  consistent("a failed map", 0);
  keeps_working();
  finish(0, 0, 0);
}

static void set_access_faults(void) {
  fresh("set access", "64M", "", "");
  CHECK(a(10 * MiB), "a block");
  CUdeviceptr p;
  CUresult err;
  emu_fail_next("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, 1);
  CHECK(try_alloc(100 * MiB, &p, &err) == VS_POOL_ERROR && err == CUDA_ERROR_INVALID_VALUE, "the growth fails");
  consistent("a failed access", 0);
  keeps_working();
  finish(0, 0, 0);
}

static void unmap_faults(void) {
  /* Giving idle memory back: the trim gives back what it could, the range stays mapped, out of
   * use; 64 MiB blocks after it never land there (a map over it would be a violation). */
  fresh("unmap in a trim", "64M", "", "");
  CHECK(a(64 * MiB) && a(64 * MiB) && a(64 * MiB), "3 x 64 MiB");
  CUdeviceptr first = live[0].p;
  f(0);
  emu_fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  size_t got = _vs_pool_trim(pool, 0);
  CHECK(got == 0, "the trim gave back %zu bytes: nothing, its unmap failed", got);
  consistent("a failed unmap in a trim", 0);
  for (int i = 0; i < 4; i++) {
    CHECK(a(64 * MiB), "64 MiB after");
    CHECK(!overlaps(live[nlive - 1].p, 64 * MiB, first, 64 * MiB), "not in the range that stayed mapped");
  }
  consistent("allocating after", 0);
  keeps_working();
  finish(0, 0, 0);

  /* A growth that fails (its access), whose undo fails to unmap one of its pieces. */
  fresh("unmap in a growth's undo", "64M", "8M", "");
  CHECK(a(10 * MiB), "a block");
  CUdeviceptr p;
  CUresult err;
  emu_fail_next("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, 1);
  emu_fail_after("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN, 1); /* undone last first: the 4th of 5 pieces */
  CHECK(try_alloc(40 * MiB, &p, &err) == VS_POOL_ERROR, "the growth fails");
  consistent("a failed unmap in a growth's undo", 0);
  keeps_working();
  finish(0, 0, 0);

  /* Handles unmapped before a growth to be mapped again (bounded handles). */
  fresh("unmap before a growth", "64M", "8M", "");
  for (int i = 0; i < 12; i++) CHECK(a(8 * MiB), "8 MiB");
  while (nlive > 1) f(nlive - 1);
  emu_fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  CHECK(a(300 * MiB), "a growth that gives idle handles back first");
  consistent("a failed unmap before a growth", 0);
  keeps_working();
  finish(0, 0, 0);

  /* Teardown: what cannot be unmapped stays, with its reservation; the rest goes. */
  fresh("unmap at teardown", "64M", "", "");
  CHECK(a(64 * MiB) && a(3 * MiB), "blocks");
  consistent("before", 0);
  emu_fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  finish(1, 1, 1); /* the range, its handle and its reservation stay; the other reservation goes */
}

static void release_faults(void) {
  /* A trim whose release fails: the handle is lost to the driver, the range is a hole again, not
   * counted as a trim, and the pool goes on. */
  fresh("release", "64M", "", "");
  CHECK(a(64 * MiB) && a(64 * MiB), "2 x 64 MiB");
  f(0);
  unsigned long long trims0 = __atomic_load_n(&_vs_stats_data.trims, __ATOMIC_RELAXED);
  emu_fail_next("cuMemRelease", CUDA_ERROR_UNKNOWN, 1);
  CHECK(_vs_pool_trim(pool, 0) == 64 * MiB, "the range was unmapped");
  CHECK(__atomic_load_n(&_vs_stats_data.trims, __ATOMIC_RELAXED) == trims0, "not counted as a trim");
  consistent("a failed release", 1);
  keeps_working_leaked(1);
  finish(0, 1, 0);
}

static void address_free_faults(void) {
  fresh("address free", "64M", "", "");
  CHECK(a(5 * MiB), "a block");
  emu_fail_next("cuMemAddressFree", CUDA_ERROR_UNKNOWN, 1);
  finish(0, 0, 1);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120);
  g_ctx = check_unit_context(&g_caps);
  reserve_faults();
  create_faults();
  map_faults();
  set_access_faults();
  unmap_faults();
  release_faults();
  address_free_faults();
  return check_summary();
}
