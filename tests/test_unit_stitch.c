/* test_unit_stitch: the stitch (space.c, VMMSHIM_STITCH) on one pool of the host emulation. A
 * request that fits no free block, while idle whole handles lie elsewhere in the pool, is served
 * by a new range made of those handles (unmapped where they were, mapped side by side) and a new
 * handle for the rest: no handle is released and only the rest is created, where without the
 * stitch the idle handle is kept (the idle budget) and the whole request created anew. At most
 * VS_STITCH_PIECES handles go into one range, none larger than the growth needs. The stitched
 * block frees and trims as any other.
 * The pool's invariant check (check.c) catches a handle recorded at two places. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim/internal.h"
#include "vmmshim/pool_internal.h"
#define CHECK_UNIT_HELPERS
#include "check.h"

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

static vs_pool_t *pool;
static bool g_contended;

static CUdeviceptr palloc(size_t n) {
  CUdeviceptr p = 0;
  CUresult err;
  size_t got = 0;
  if (_vs_pool_alloc(pool, n, VS_NO_STREAM, VMMSHIM_API_DRIVER, &p, &got, &err, &g_contended) != VS_POOL_OK) return 0;
  return p;
}

static bool pfree(CUdeviceptr p) {
  size_t sz, req;
  CUresult err;
  return _vs_pool_free(pool, p, VS_FREE_KIND_SYNC, VS_NO_STREAM, VMMSHIM_API_DRIVER, &sz, &req, &err) == VS_POOL_OK;
}

static emu_counters_t now(void) {
  emu_counters_t e;
  emu_get_counters(&e);
  return e;
}

static vs_stitch_stats_t stitch_now(void) {
  vs_stitch_stats_t s;
  s.stitches = __atomic_load_n(&_vs_stitch_stats.stitches, __ATOMIC_RELAXED);
  s.handles = __atomic_load_n(&_vs_stitch_stats.handles, __ATOMIC_RELAXED);
  s.bytes = __atomic_load_n(&_vs_stitch_stats.bytes, __ATOMIC_RELAXED);
  return s;
}

/* Two 64 MiB blocks (a handle each), the first freed: a whole idle handle, kept by the idle
 * budget. 96 MiB fits no free block. Returns the handle bytes mapped after that request. */
static unsigned long long grow_past_idle(bool stitch, CUdeviceptr *b_out, CUdeviceptr *c_out) {
  _vs_pool_trim(pool, 0);
  pool->stitch = stitch;
  CUdeviceptr a = palloc(64 * MiB), b = palloc(64 * MiB);
  CHECK(a && b && now().handle_bytes == 128 * MiB, "two 64 MiB handles (%llu MiB)", now().handle_bytes / MiB);
  CHECK(pfree(a), "free a: a whole idle handle");
  CUdeviceptr c = palloc(96 * MiB);
  CHECK(c != 0, "96 MiB");
  CHECK(_vs_pool_check(pool) == 0, "pool consistent (stitch %d)", stitch);
  *b_out = b;
  *c_out = c;
  return now().handle_bytes;
}

static void test_stitch_reuses_idle_handle(void) {
  CUdeviceptr b, c;
  unsigned long long c0 = now().n_cuMemCreate;
  unsigned long long off = grow_past_idle(false, &b, &c);
  CHECK(off == 224 * MiB && now().n_cuMemCreate == c0 + 3,
        "stitch off: the idle handle stays, 96 MiB created anew: %llu MiB mapped", off / MiB);
  CHECK(pfree(b) && pfree(c), "free");

  _vs_pool_trim(pool, 0);
  vs_stitch_stats_t s0 = stitch_now();
  unsigned long long r0 = now().n_cuMemRelease;
  c0 = now().n_cuMemCreate;
  unsigned long long m0 = now().n_cuMemMap;
  unsigned long long on = grow_past_idle(true, &b, &c);
  vs_stitch_stats_t s1 = stitch_now();
  CHECK(on == 160 * MiB, "stitch on: the idle 64 MiB handle serves most of it: %llu MiB mapped", on / MiB);
  /* a, b, then c's new 32 MiB piece: three creates; the idle handle is not released */
  CHECK(now().n_cuMemCreate == c0 + 3 && now().n_cuMemRelease == r0,
        "creates %llu, releases %llu (none)", now().n_cuMemCreate - c0,
        now().n_cuMemRelease - r0);
  CHECK(now().n_cuMemMap == m0 + 4, "maps: a, b, then the idle handle and the new one (%llu)",
        now().n_cuMemMap - m0);
  CHECK(s1.stitches == s0.stitches + 1 && s1.handles == s0.handles + 1 && s1.bytes == s0.bytes + 64 * MiB,
        "stitch counters: %llu stitches, %llu handles, %llu MiB", (unsigned long long)(s1.stitches - s0.stitches),
        (unsigned long long)(s1.handles - s0.handles), (unsigned long long)((s1.bytes - s0.bytes) / MiB));
  /* c lies on two handles, the stitched one first: a block as any other */
  CUmemGenericAllocationHandle h[4];
  size_t sizes[4], offset = 0;
  int n = 0;
  CHECK(_vs_pool_handles_of(pool, c, &offset, h, sizes, 4, &n) == VS_POOL_OK && n == 2 && offset == 0 &&
            sizes[0] == 64 * MiB && sizes[1] == 32 * MiB,
        "c on 2 handles (%d: %zu + %zu MiB)", n, (size_t)(sizes[0] / MiB), (size_t)(n > 1 ? sizes[1] / MiB : 0));
  CHECK(pfree(c) && pfree(b), "free the stitched block and b");
  CHECK(_vs_pool_trim(pool, 0) == 160 * MiB && now().handle_bytes == 0, "a trim gives back all (%llu MiB left)",
        now().handle_bytes / MiB);
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
}

/* Ten idle 64 MiB handles, each between live 2 MiB-aligned blocks, and a request of 640 MiB: at
 * most VS_STITCH_PIECES of them go into the new range. */
static void test_stitch_bounded(void) {
  _vs_pool_trim(pool, 0);
  pool->stitch = true;
  enum { N = 10 };
  CUdeviceptr idle[N], live[N];
  for (int i = 0; i < N; i++) {
    idle[i] = palloc(64 * MiB);
    live[i] = palloc(64 * MiB);
  }
  for (int i = 0; i < N; i++) CHECK(idle[i] && pfree(idle[i]), "free idle %d", i);
  vs_stitch_stats_t s0 = stitch_now();
  CUdeviceptr big = palloc(N * 64 * MiB);
  vs_stitch_stats_t s1 = stitch_now();
  CHECK(big != 0, "640 MiB");
  CHECK(s1.stitches == s0.stitches + 1 && s1.handles - s0.handles == VS_STITCH_PIECES,
        "one stitch of %d handles (%llu)", VS_STITCH_PIECES, (unsigned long long)(s1.handles - s0.handles));
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
  CHECK(pfree(big), "free");
  for (int i = 0; i < N; i++) CHECK(pfree(live[i]), "free live %d", i);
  _vs_pool_trim(pool, 0);
  CHECK(now().handle_bytes == 0, "all given back (%llu MiB)", now().handle_bytes / MiB);
}

/* An idle handle larger than the growth needs is not taken: a 4 KiB request grows the small
 * heap by a new handle while a 64 MiB one lies idle. */
static void test_stitch_too_large(void) {
  _vs_pool_trim(pool, 0);
  pool->stitch = true;
  vs_stitch_stats_t s0 = stitch_now();
  CUdeviceptr a = palloc(64 * MiB);
  CHECK(a && pfree(a), "an idle 64 MiB handle");
  CUdeviceptr s = palloc(4096);
  CHECK(s != 0 && stitch_now().stitches == s0.stitches, "4 KiB grows the small heap without a stitch");
  CHECK(pfree(s), "free");
  _vs_pool_trim(pool, 0);
}

/* The invariant check finds a handle recorded at two places of the pool. */
static void test_check_catches_double_mapping(void) {
  _vs_pool_trim(pool, 0);
  CUdeviceptr a = palloc(64 * MiB), b = palloc(64 * MiB);
  CHECK(a && b && _vs_pool_check(pool) == 0, "two handles, consistent");
  pool_lock(pool);
  bool two = pool->segs.n >= 2;
  CUmemGenericAllocationHandle keep = two ? pool->segs.v[1].handle : 0;
  if (two) pool->segs.v[1].handle = pool->segs.v[0].handle; /* planted: one handle at two places */
  int bad = _vs_pool_check_locked(pool);
  if (two) pool->segs.v[1].handle = keep;
  int good = _vs_pool_check_locked(pool);
  pool_unlock(pool);
  CHECK(two && bad == 1, "the planted double mapping is found (%d problems)", bad);
  CHECK(good == 0, "and the restored table is clean (%d)", good);
  CHECK(pfree(a) && pfree(b), "free");
  _vs_pool_trim(pool, 0);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  pool = check_unit_pool();
  if (!pool) return check_summary();
  test_stitch_reuses_idle_handle();
  test_stitch_bounded();
  test_stitch_too_large();
  test_check_catches_double_mapping();
  _vs_pool_destroy(pool);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
