/* test_unit_arena: arenas, the address directory and the per-thread stats, through
 * alloc.c's entry points (_vs_alloc/_vs_free) on the host emulation.
 *   - threads on different arenas get memory from different pools; frees find the owner
 *     from any thread; a pointer freed twice or an interior pointer is refused;
 *   - threads that contend for one arena spread over several by themselves;
 *   - out of memory in one arena takes back what another holds idle;
 *   - bytes in use and the peak are exact for one thread and sum up across threads. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim/internal.h"
#include "check.h"

#define MiB (1024ull * 1024)

static CUcontext g_ctx;

static vmmshim_stats_t stats(void) {
  vmmshim_stats_t s;
  vmmshim_get_stats(&s, sizeof s);
  return s;
}

static CUdeviceptr alloc_or_0(size_t n) {
  CUdeviceptr p = 0;
  CUresult err = CUDA_SUCCESS;
  return _vs_alloc(VMMSHIM_API_DRIVER, n, VS_NO_STREAM, &p, &err) == VS_ALLOC_SERVED ? p : 0;
}

static bool free_ok(CUdeviceptr p) {
  CUresult err = CUDA_SUCCESS;
  return _vs_free(VMMSHIM_API_DRIVER, p, VS_NO_STREAM, &err) && err == CUDA_SUCCESS;
}

/* ---- exact counters on one thread ---- */
static void test_stats_one_thread(void) {
  vmmshim_stats_t s0 = stats();
  CUdeviceptr p[100];
  for (int i = 0; i < 100; i++) p[i] = alloc_or_0(1000); /* served 1024 each */
  vmmshim_stats_t s1 = stats();
  CHECK(s1.bytes_in_use - s0.bytes_in_use == 102400, "in use grew by %llu, want 102400",
        (unsigned long long)(s1.bytes_in_use - s0.bytes_in_use));
  CHECK(s1.bytes_requested_in_use - s0.bytes_requested_in_use == 100000, "requested grew by %llu",
        (unsigned long long)(s1.bytes_requested_in_use - s0.bytes_requested_in_use));
  CHECK(s1.peak_bytes_in_use == s0.bytes_in_use + 102400, "peak %llu, want %llu",
        (unsigned long long)s1.peak_bytes_in_use, (unsigned long long)(s0.bytes_in_use + 102400));
  CHECK(s1.allocs[VMMSHIM_API_DRIVER] - s0.allocs[VMMSHIM_API_DRIVER] == 100, "allocs counted");
  for (int i = 0; i < 50; i++) CHECK(free_ok(p[i]), "free %d", i);
  vmmshim_stats_t s2 = stats();
  CHECK(s2.bytes_in_use - s0.bytes_in_use == 51200, "in use after freeing half: %llu",
        (unsigned long long)(s2.bytes_in_use - s0.bytes_in_use));
  CHECK(s2.peak_bytes_in_use == s1.peak_bytes_in_use, "peak kept");
  CHECK(s2.frees[VMMSHIM_API_DRIVER] - s0.frees[VMMSHIM_API_DRIVER] == 50, "frees counted");
  for (int i = 50; i < 100; i++) CHECK(free_ok(p[i]), "free %d", i);
  CHECK(stats().bytes_in_use == s0.bytes_in_use, "back to the start");
}

/* ---- two arenas, frees from either thread ---- */
typedef struct {
  unsigned arena;
  size_t size;
  int count;
  CUdeviceptr *out;
} job_t;

static void *alloc_job(void *arg) {
  job_t *j = arg;
  cuCtxSetCurrent(g_ctx);
  _vs_arena_select(j->arena);
  for (int i = 0; i < j->count; i++) j->out[i] = alloc_or_0(j->size);
  return NULL;
}

static void run_job(job_t *j) {
  pthread_t t;
  pthread_create(&t, NULL, alloc_job, j);
  pthread_join(t, NULL);
}

static void test_two_arenas(void) {
  CUdeviceptr a[4], b[4];
  job_t ja = {0, 4 * MiB, 4, a}, jb = {1, 4 * MiB, 4, b};
  run_job(&ja);
  run_job(&jb);
  vs_pool_t *pa = _vs_dir_lookup(a[0]), *pb = _vs_dir_lookup(b[0]);
  CHECK(pa && pb && pa != pb, "arena 0 and arena 1 are different pools (%p, %p)", (void *)pa, (void *)pb);
  for (int i = 1; i < 4; i++) CHECK(_vs_dir_lookup(a[i]) == pa && _vs_dir_lookup(b[i]) == pb, "same arena %d", i);
  CHECK(_vs_dir_lookup(a[0] + 12345) == pa, "interior address: same owner");
  CHECK(_vs_dir_lookup(0x1000) == NULL, "an address no pool reserved has no owner");
  CUresult err;
  CHECK(!_vs_free(VMMSHIM_API_DRIVER, b[0] + 256, VS_NO_STREAM, &err), "interior pointer refused");
  for (int i = 0; i < 4; i++) CHECK(free_ok(b[i]) && free_ok(a[i]), "cross-thread free %d", i);
  CHECK(!_vs_free(VMMSHIM_API_DRIVER, b[0], VS_NO_STREAM, &err), "second free refused");
  CHECK(_vs_pool_check(pa) == 0 && _vs_pool_check(pb) == 0, "both arenas consistent");
}

/* ---- contention spreads threads ---- */
#define NTHREADS 4
static pthread_barrier_t g_bar;
static _Atomic(CUdeviceptr) g_last[NTHREADS]; /* read by the main thread while the threads run */
static atomic_int g_stop;

static void *hammer(void *arg) {
  int id = (int)(intptr_t)arg;
  cuCtxSetCurrent(g_ctx);
  _vs_arena_select(0);
  pthread_barrier_wait(&g_bar);
  for (long i = 0; i < 2000000 && !atomic_load(&g_stop); i++) {
    CUdeviceptr p = alloc_or_0(4096);
    if (!p) break;
    CUresult err;
    /* keep the last block of each round of 256 to see where this thread now allocates */
    if ((i & 255) == 255) {
      CUdeviceptr last = atomic_load(&g_last[id]);
      if (last) _vs_free(VMMSHIM_API_DRIVER, last, VS_NO_STREAM, &err);
      atomic_store(&g_last[id], p);
    } else {
      _vs_free(VMMSHIM_API_DRIVER, p, VS_NO_STREAM, &err);
    }
  }
  return NULL;
}

static int distinct_arenas(void) {
  vs_pool_t *seen[NTHREADS];
  int n = 0;
  for (int i = 0; i < NTHREADS; i++) {
    CUdeviceptr last = atomic_load(&g_last[i]);
    vs_pool_t *p = last ? _vs_dir_lookup(last) : NULL;
    bool dup = false;
    for (int k = 0; k < n; k++) dup |= seen[k] == p;
    if (p && !dup) seen[n++] = p;
  }
  return n;
}

static void test_contention_spreads(void) {
  pthread_t t[NTHREADS];
  pthread_barrier_init(&g_bar, NULL, NTHREADS);
  for (int i = 0; i < NTHREADS; i++) pthread_create(&t[i], NULL, hammer, (void *)(intptr_t)i);
  for (int ms = 0; ms < 10000 && distinct_arenas() < 2; ms += 10) usleep(10000);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  int n = distinct_arenas();
  CHECK(n >= 2, "threads contending for arena 0 ended up in %d arena(s)", n);
  for (int i = 0; i < NTHREADS; i++) {
    CUdeviceptr last = atomic_load(&g_last[i]);
    CHECK(!last || free_ok(last), "free the kept block of %d", i);
  }
}

/* ---- out of memory in one arena: another arena's idle memory is taken back ---- */
static void test_oom_takes_sibling_idle(void) {
  _vs_trim_all(); /* start with nothing idle */
  size_t dev_free = emu_device_used(0);
  CHECK(dev_free == 0, "device empty at the start (%zu used)", dev_free);
  CUdeviceptr a[48], b[40];
  job_t ja = {2, 4 * MiB, 48, a};
  run_job(&ja); /* 192 MiB in arena 2 */
  int ok = 0;
  for (int i = 0; i < 48; i++) ok += a[i] != 0 && free_ok(a[i]);
  CHECK(ok == 48, "arena 2 allocated and freed %d of 48", ok);
  CHECK(stats().bytes_mapped >= 192 * MiB, "arena 2 keeps its memory mapped (%llu)",
        (unsigned long long)stats().bytes_mapped);
  uint64_t fails0 = stats().alloc_failures;
  job_t jb = {3, 4 * MiB, 40, b};
  run_job(&jb); /* 160 MiB in arena 3: fits only if arena 2 gives its idle handles back */
  ok = 0;
  for (int i = 0; i < 40; i++) ok += b[i] != 0;
  CHECK(ok == 40, "arena 3 got %d of 40 blocks on a 256 MiB device", ok);
  CHECK(stats().alloc_failures == fails0, "no allocation failed");
  CHECK(emu_device_used(0) <= 256 * MiB, "device use %zu", emu_device_used(0));
  for (int i = 0; i < 40; i++) CHECK(!b[i] || free_ok(b[i]), "free %d", i);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120);
  setenv("VMMSHIM_ARENAS", "4", 1);
  emu_set_device_memory(0, 256 * MiB);
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  CHECK(cuDevicePrimaryCtxRetain(&g_ctx, 0) == CUDA_SUCCESS && g_ctx, "retain");
  CHECK(cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS, "set current");
  CHECK(_vs_active(), "shim active");
  test_stats_one_thread();
  test_two_arenas();
  test_contention_spreads();
  test_oom_takes_sibling_idle();
  CHECK(stats().bytes_in_use == 0, "nothing in use at the end (%llu)", (unsigned long long)stats().bytes_in_use);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
