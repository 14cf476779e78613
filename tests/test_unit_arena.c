/* test_unit_arena: arenas, the address directory and the per-thread stats, through
 * alloc.c's entry points (_vs_alloc/_vs_free) on the host emulation.
 *   - threads on different arenas get memory from different pools; frees find the owner
 *     from any thread; a pointer freed twice or an interior pointer is refused;
 *   - a thread that finds its arena's lock held by another allocating thread 4 times moves to
 *     another arena (driven step by step); threads hammering one arena at once keep it whole;
 *   - out of memory in one arena takes back what another holds idle;
 *   - bytes in use and the peak are exact for one thread and sum up across threads;
 *   - the device's default pool (cuMemPoolGetAttribute, cuMemPoolTrimTo) sums its arenas. */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim/internal.h"
#include "vmmshim/pool_internal.h"
#include "check.h"

#define MiB (1024ull * 1024)

static CUcontext g_ctx;

static vmmshim_stats_t stats(void) {
  vmmshim_stats_t s;
  _vs_stats_get(&s); /* vmmshim_get_stats lives in src/hook/api.c, which unit tests do not link */
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

/* ---- the device's default pool sums its arenas (mempool.c) ---- */
typedef struct {
  unsigned arena;
  size_t size;
  CUdeviceptr p, sync;
} stream_job_t;

static void *stream_alloc_job(void *arg) {
  stream_job_t *j = arg;
  cuCtxSetCurrent(g_ctx);
  _vs_arena_select(j->arena);
  CUresult err = CUDA_SUCCESS;
  if (_vs_alloc(VMMSHIM_API_DRIVER_ASYNC, j->size, CU_STREAM_LEGACY, &j->p, &err) != VS_ALLOC_SERVED) j->p = 0;
  j->sync = alloc_or_0(j->size); /* a synchronous block: not the stream-ordered allocator's */
  return NULL;
}

static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  _vs_mempool_got_attribute(pool, a, &v);
  return v;
}

static void test_default_pool_sums_arenas(void) {
  CUmemoryPool pool = NULL;
  CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS && pool, "default pool");
  CHECK(_vs_mempool_trim(pool, 0) == 0 && pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0,
        "nothing reserved at the start");
  cuuint64_t zero = 0;
  _vs_mempool_set_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
  stream_job_t ja = {0, 3 * MiB, 0, 0}, jb = {1, 5 * MiB, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, stream_alloc_job, &ja);
  pthread_join(t, NULL);
  pthread_create(&t, NULL, stream_alloc_job, &jb);
  pthread_join(t, NULL);
  CHECK(ja.p && jb.p && ja.sync && jb.sync, "served");
  CHECK(_vs_dir_lookup(ja.p) != _vs_dir_lookup(jb.p), "two arenas");
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 8 * MiB, "used %llu, want 8 MiB",
        (unsigned long long)pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 8 * MiB, "used high");
  cuuint64_t reserved = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  CHECK(reserved == stats().bytes_mapped - 8 * MiB, "reserve %llu: mapped %llu less the synchronous blocks",
        (unsigned long long)reserved, (unsigned long long)stats().bytes_mapped);
  CUresult err;
  CHECK(_vs_free(VMMSHIM_API_DRIVER_ASYNC, ja.p, CU_STREAM_LEGACY, &err) && free_ok(ja.sync), "free arena 0's");
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 5 * MiB, "used after a free");
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 8 * MiB, "the high watermark stays");
  CHECK(_vs_free(VMMSHIM_API_DRIVER_ASYNC, jb.p, CU_STREAM_LEGACY, &err) && free_ok(jb.sync), "free arena 1's");
  CHECK(_vs_mempool_trim(pool, 0) == 0, "the shim keeps nothing for the driver to keep");
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0 && stats().bytes_mapped == 0,
        "both arenas trimmed: reserve %llu, mapped %llu",
        (unsigned long long)pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        (unsigned long long)stats().bytes_mapped);
  CHECK(_vs_mempool_trim((CUmemoryPool)(uintptr_t)&zero, 7) == 7, "another pool is the driver's alone");
}

/* ---- contention moves a thread to another arena ----
 * Whether threads meet on a lock depends on the machine running them in parallel (a loaded
 * machine time-slices them and they rarely do), so the rule is driven step by step: a holder
 * thread takes arena 0's lock, the mover allocates behind it, the holder lets go after 20 ms.
 * After VMMSHIM's 4 contended allocations (within its last 64) the mover allocates elsewhere;
 * a lock held by a thread that does not allocate does not count. A round in which the mover
 * was not scheduled before the holder let go is simply not contended (hence up to 40). */
#define MOVE_ROUNDS 40
typedef struct {
  vs_pool_t *pool;      /* arena 0's pool */
  bool holder_allocates; /* the holder allocates before taking the lock (so it is "another allocating thread") */
  int rounds;
  sem_t held, done;
  int first_elsewhere; /* the mover's first round whose block is not in arena 0, or -1 */
  int failed;
} move_t;

static void *mover(void *arg) {
  move_t *m = arg;
  cuCtxSetCurrent(g_ctx);
  _vs_arena_select(0);
  for (int r = 0; r < m->rounds; r++) {
    sem_wait(&m->held);
    CUdeviceptr p = alloc_or_0(4096);
    if (!p) m->failed++;
    else if (m->first_elsewhere < 0 && _vs_dir_lookup(p) != m->pool) m->first_elsewhere = r;
    if (p && !free_ok(p)) m->failed++;
    sem_post(&m->done);
  }
  return NULL;
}

static int run_move(bool holder_allocates, int rounds) {
  CUdeviceptr probe = alloc_or_0(4096); /* the main thread is on arena 0 */
  move_t m = {.pool = _vs_dir_lookup(probe), .holder_allocates = holder_allocates, .rounds = rounds,
              .first_elsewhere = -1};
  CHECK(m.pool && free_ok(probe), "arena 0's pool");
  sem_init(&m.held, 0, 0);
  sem_init(&m.done, 0, 0);
  pthread_t t;
  pthread_create(&t, NULL, mover, &m);
  for (int r = 0; r < rounds; r++) {
    if (holder_allocates) {
      CUdeviceptr q = alloc_or_0(4096);
      if (!q || !free_ok(q)) m.failed++;
    }
    pool_lock(m.pool);
    sem_post(&m.held);
    usleep(20000);
    pool_unlock(m.pool);
    sem_wait(&m.done);
    if (m.first_elsewhere >= 0) break;
  }
  if (m.first_elsewhere >= 0) /* the mover has left: release its remaining rounds */
    for (int r = m.first_elsewhere + 1; r < rounds; r++) {
      sem_post(&m.held);
      sem_wait(&m.done);
    }
  pthread_join(t, NULL);
  sem_destroy(&m.held);
  sem_destroy(&m.done);
  CHECK(m.failed == 0, "%d allocations or frees failed", m.failed);
  return m.first_elsewhere;
}

static void test_contention_moves(void) {
  _vs_arena_select(0);
  int moved = run_move(true, MOVE_ROUNDS);
  CHECK(moved >= 4, "the mover left arena 0 after %d contended allocations: at least 4 are needed", moved);
  CHECK(moved >= 0 && moved < MOVE_ROUNDS, "the mover never left arena 0 in %d rounds behind an allocating holder",
        MOVE_ROUNDS);
  moved = run_move(false, 12);
  CHECK(moved < 0, "a lock held by a thread that does not allocate moved the mover (round %d)", moved);
}

/* ---- threads hammering one arena at once: every allocation and free succeeds, the pools stay whole ---- */
#define NTHREADS 4
static pthread_barrier_t g_bar;
static atomic_int g_stop, g_failed;
static vs_pool_t *g_seen[NTHREADS];

static void *hammer(void *arg) {
  int id = (int)(intptr_t)arg;
  cuCtxSetCurrent(g_ctx);
  _vs_arena_select(0);
  pthread_barrier_wait(&g_bar);
  CUdeviceptr keep[8] = {0};
  for (long i = 0; i < 200000 && !atomic_load(&g_stop); i++) {
    CUdeviceptr p = alloc_or_0(4096 + (size_t)(i % 7) * 256);
    if (!p) {
      atomic_fetch_add(&g_failed, 1);
      break;
    }
    g_seen[id] = _vs_dir_lookup(p);
    CUdeviceptr old = keep[i % 8]; /* a few blocks live at a time, freed later */
    keep[i % 8] = p;
    if (old && !free_ok(old)) atomic_fetch_add(&g_failed, 1);
  }
  for (int k = 0; k < 8; k++)
    if (keep[k] && !free_ok(keep[k])) atomic_fetch_add(&g_failed, 1);
  return NULL;
}

static void test_threads_at_once(void) {
  pthread_t t[NTHREADS];
  pthread_barrier_init(&g_bar, NULL, NTHREADS);
  for (int i = 0; i < NTHREADS; i++) pthread_create(&t[i], NULL, hammer, (void *)(intptr_t)i);
  usleep(300000);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  CHECK(atomic_load(&g_failed) == 0, "%d allocations or frees failed", atomic_load(&g_failed));
  int bad = 0, pools = 0;
  for (int i = 0; i < NTHREADS; i++) {
    bool dup = false;
    for (int k = 0; k < i; k++) dup |= g_seen[k] == g_seen[i];
    if (g_seen[i] && !dup) {
      pools++;
      bad += _vs_pool_check(g_seen[i]) != 0;
    }
  }
  printf("threads at once: %d pool(s) used at the end\n", pools);
  CHECK(pools >= 1 && bad == 0, "%d of %d pools inconsistent", bad, pools);
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
  test_default_pool_sums_arenas();
  test_contention_moves();
  test_threads_at_once();
  test_oom_takes_sibling_idle();
  CHECK(stats().bytes_in_use == 0, "nothing in use at the end (%llu)", (unsigned long long)stats().bytes_in_use);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
