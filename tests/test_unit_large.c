/* test_unit_large: the large heap (blocks of 1 MiB and more) on the host emulation: a request
 * of the granularity or more grows it by one handle of exactly its size; freed blocks serve
 * any smaller request (split) and merge with their free neighbours, across handles, so that
 * cycling and random sizes make no driver call once the pool holds enough; idle handles are
 * given back before a growth; smaller requests share handles that grow by 1/8 of the heap;
 * a stream's older freed blocks are sealed with an event and merge once it has passed. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim/internal.h"
#define CHECK_UNIT_HELPERS
#include "check.h"

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

static vs_pool_t *pool;
static bool g_contended;

static CUdeviceptr palloc_on(size_t n, size_t *served, CUstream s) {
  CUdeviceptr p = 0;
  CUresult err;
  size_t got = 0;
  if (_vs_pool_alloc(pool, n, s, VMMSHIM_API_DRIVER, &p, &got, &err, &g_contended) != VS_POOL_OK) return 0;
  if (served) *served = got;
  return p;
}
static CUdeviceptr palloc(size_t n, size_t *served) { return palloc_on(n, served, VS_NO_STREAM); }

static bool pfree_on(CUdeviceptr p, CUstream s) {
  size_t sz, req;
  CUresult err;
  vs_free_kind_t kind = s == VS_NO_STREAM ? VS_FREE_KIND_SYNC : VS_FREE_KIND_STREAM;
  return _vs_pool_free(pool, p, kind, s, VMMSHIM_API_DRIVER, &sz, &req, &err) == VS_POOL_OK;
}
static bool pfree(CUdeviceptr p) { return pfree_on(p, VS_NO_STREAM); }

static emu_counters_t now(void) {
  emu_counters_t e;
  emu_get_counters(&e);
  return e;
}

static unsigned long long vmm_calls_since(const emu_counters_t *a) {
  emu_counters_t b = now();
  return (b.n_cuMemCreate - a->n_cuMemCreate) + (b.n_cuMemMap - a->n_cuMemMap) + (b.n_cuMemUnmap - a->n_cuMemUnmap) +
         (b.n_cuMemRelease - a->n_cuMemRelease) + (b.n_cuMemSetAccess - a->n_cuMemSetAccess);
}

static void test_growth_and_reuse(void) {
  /* one handle of exactly its size, rounded to 2 MiB */
  size_t served = 0;
  emu_counters_t e0 = now();
  CUdeviceptr a = palloc(200 * MiB + 1, &served);
  CHECK(a && served == 202 * MiB, "200 MiB + 1 served as %zu", served);
  CHECK(now().n_cuMemCreate == e0.n_cuMemCreate + 1 && now().handle_bytes == 202 * MiB,
        "one handle of 202 MiB (%llu creates, %llu bytes)", now().n_cuMemCreate - e0.n_cuMemCreate, now().handle_bytes);
  CHECK(a % (2 * MiB) == 0, "starts on a 2 MiB boundary");
  memset((void *)(uintptr_t)a, 0x11, served);

  /* a smaller request splits the freed block; the rest stays free; no driver call */
  CHECK(pfree(a), "free a");
  e0 = now();
  CUdeviceptr b = palloc(100 * MiB, &served);
  CUdeviceptr c = palloc(90 * MiB, NULL);
  CHECK(b == a && served == 100 * MiB, "100 MiB from the start of the freed 202 MiB block");
  CHECK(c >= a + 100 * MiB && c + 90 * MiB <= a + 202 * MiB, "90 MiB from its rest");
  CHECK(vmm_calls_since(&e0) == 0, "no driver call for either (%llu)", vmm_calls_since(&e0));
  /* freed, the pieces merge back: 202 MiB fits again at the same place */
  CHECK(pfree(b) && pfree(c), "free b, c");
  CUdeviceptr a2 = palloc(202 * MiB, NULL);
  CHECK(a2 == a && vmm_calls_since(&e0) == 0, "the pieces merged: 202 MiB at the same address, no driver call");
  CHECK(pfree(a2), "free a2");

  /* cycling through sizes makes no driver call once the pool holds enough */
  static const size_t sizes[] = {200 * MiB, 100 * MiB, 150 * MiB, 50 * MiB, 7 * MiB, 190 * MiB};
  e0 = now();
  for (int r = 0; r < 20; r++)
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      CUdeviceptr x = palloc(sizes[i], NULL);
      CHECK(x != 0 && pfree(x), "cycle %d size %zu", r, sizes[i]);
    }
  CHECK(vmm_calls_since(&e0) == 0, "no driver call while cycling (%llu)", vmm_calls_since(&e0));
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
}

/* Blocks of two growths, side by side, merge across the handle boundary once free. */
static void test_merge_across_handles(void) {
  _vs_pool_trim(pool, 0);
  CUdeviceptr x = palloc(128 * MiB, NULL), y = palloc(128 * MiB, NULL);
  CHECK(x && y && y == x + 128 * MiB, "two growths side by side (x %llx, y %llx)", (unsigned long long)x,
        (unsigned long long)y);
  CHECK(now().live_handles >= 2, "two handles");
  CHECK(pfree(x) && pfree(y), "free both");
  emu_counters_t e0 = now();
  CUdeviceptr z = palloc(256 * MiB, NULL);
  CHECK(z == x && vmm_calls_since(&e0) == 0, "256 MiB spans both handles, no driver call");
  CHECK(pfree(z), "free z");
}

/* Before it grows, the pool gives back idle handles: as many bytes as it maps, keeping a small
 * budget (policy.h); with VMMSHIM_STITCH=1 it maps them side by side into the new
 * range instead, and creates a handle only for the rest. */
static void test_release_before_growth(void) {
  _vs_pool_trim(pool, 0);
  CHECK(now().handle_bytes == 0, "nothing mapped after a trim (%llu MiB)", now().handle_bytes / MiB);
  CUdeviceptr a = palloc(GiB, NULL), b = palloc(512 * MiB, NULL);
  CHECK(a && b, "1 GiB and 512 MiB");
  CHECK(pfree(a), "free the 1 GiB block: a whole idle handle");
  unsigned long long t0 = now().n_cuMemRelease, c0 = now().n_cuMemCreate;
  CUdeviceptr c = palloc(2 * GiB, NULL);
  CHECK(c != 0, "2 GiB does not fit in the idle 1 GiB: the pool grows");
  bool stitch = _vs_option(VS_OPT_STITCH) != 0;
  CHECK(now().n_cuMemRelease == t0 + !stitch && now().n_cuMemCreate == c0 + 1 &&
            now().handle_bytes == 512 * MiB + 2 * GiB,
        "the idle 1 GiB handle went back first, or (stitch %d) into the new range: %llu MiB of handles", stitch,
        now().handle_bytes / MiB);
  CHECK(pfree(b) && pfree(c), "free");
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
}

/* Random sizes from 1 MiB to 512 MiB with a bounded live set: after the warm-up, fewer than
 * 1 driver call per 100 allocations. */
static void test_random_sizes(void) {
  _vs_pool_trim(pool, 0);
  enum { WINDOW = 24, STEPS = 4000 };
  CUdeviceptr live[WINDOW];
  uint64_t r = 12345;
  for (int i = 0; i < WINDOW; i++) live[i] = 0;
  emu_counters_t e0 = now();
  unsigned long long warm_calls = 0;
  int failed = 0;
  for (int s = 0; s < STEPS; s++) {
    if (s == STEPS / 4) warm_calls = vmm_calls_since(&e0);
    r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
    uint64_t x = r * 0x2545F4914F6CDD1Dull;
    int k = (int)(x % WINDOW);
    if (live[k] && !pfree(live[k])) failed++;
    size_t size = (1ull << 20) << ((x >> 8) % 10); /* 1 MiB .. 512 MiB */
    size += (x >> 20) % size;
    live[k] = palloc(size, NULL);
    if (!live[k]) failed++;
  }
  unsigned long long steady = vmm_calls_since(&e0) - warm_calls;
  CHECK(failed == 0, "%d allocations or frees failed", failed);
  CHECK(steady * 100 < (unsigned long long)(STEPS - STEPS / 4), "%llu driver calls in %d allocations after the warm-up",
        steady, STEPS - STEPS / 4);
  for (int i = 0; i < WINDOW; i++)
    if (live[i]) CHECK(pfree(live[i]), "free %d", i);
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
}

/* Below the granularity: handles of 1/8 of what the heap maps (at most the granularity), so a
 * small heap maps little more than it uses and a big one few handles. */
static void test_shared_growth(void) {
  _vs_pool_trim(pool, 0);
  emu_counters_t e0 = now();
  CUdeviceptr d[100];
  int ok = 0;
  for (int i = 0; i < 100; i++) ok += (d[i] = palloc(8 * MiB, NULL)) != 0;
  unsigned long long grown = now().handle_bytes - e0.handle_bytes, made = now().n_cuMemCreate - e0.n_cuMemCreate;
  CHECK(ok == 100, "100 blocks of 8 MiB");
  CHECK(grown >= 800 * MiB && grown <= 800 * MiB + 100 * MiB, "mapped %llu MiB for 800 MiB: at most 1/8 more",
        grown / MiB);
  CHECK(made >= 15 && made <= 40, "%llu handles for 800 MiB (8 MiB each at first, growing towards 64 MiB)", made);
  for (int i = 0; i < 100; i++) CHECK(pfree(d[i]), "free d%d", i);
}

/* Neighbours freed on one stream merge at once, unsealed: the stream's own next request may
 * take the whole range. */
static void test_stream_merge(void) {
  _vs_pool_trim(pool, 0);
  CUstream s;
  CHECK(cuStreamCreate(&s, 0) == CUDA_SUCCESS, "stream");
  enum { N = 8 };
  CUdeviceptr blk[N];
  for (int i = 0; i < N; i++) blk[i] = palloc_on(2 * MiB, NULL, s);
  bool adjacent = true;
  for (int i = 1; i < N; i++) adjacent &= blk[i] == blk[i - 1] + 2 * MiB;
  CHECK(adjacent, "%d blocks of 2 MiB back to back", N);
  long long rec0 = emu_calls("cuEventRecord");
  for (int i = 0; i < N; i += 2) CHECK(pfree_on(blk[i], s), "free %d on the stream", i);
  for (int i = 1; i < N; i += 2) CHECK(pfree_on(blk[i], s), "free %d on the stream", i);
  CHECK(emu_calls("cuEventRecord") == rec0, "one merged block: nothing to seal");
  emu_counters_t e0 = now();
  CUdeviceptr all = palloc_on(N * 2 * MiB, NULL, s);
  CHECK(all == blk[0] && vmm_calls_since(&e0) == 0, "the stream takes all %d MiB at once, with no VMM call (%llu)",
        N * 2, vmm_calls_since(&e0));
  CHECK(pfree_on(all, s), "free");
  CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS, "sync");
  _vs_pool_stream_destroyed(pool, s);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS, "destroy");
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
}

/* A stream's older freed blocks are sealed with an event once there are enough of them, and
 * join the bins (merged) once the event has passed; the newest stay for the stream's own
 * next requests. Before the pool grows, the stream may also take a sealed block of its own. */
static void test_stream_seal(void) {
  _vs_pool_trim(pool, 0);
  CUstream s;
  CHECK(cuStreamCreate(&s, 0) == CUDA_SUCCESS, "stream");
  /* Every other block stays live, so the freed ones do not merge. */
  enum { N = VS_SEAL_COUNT + 4 };
  CUdeviceptr blk[2 * N];
  for (int i = 0; i < 2 * N; i++) blk[i] = palloc_on(2 * MiB, NULL, s);
  long long rec0 = emu_calls("cuEventRecord");
  for (int i = 0; i < 2 * N; i += 2) CHECK(pfree_on(blk[i], s), "free %d on the stream", i);
  CHECK(emu_calls("cuEventRecord") > rec0, "the older freed blocks were sealed with an event");
  /* the newest ones are still the stream's: it reuses one at once */
  CUdeviceptr again = palloc_on(2 * MiB, NULL, s);
  CHECK(again == blk[2 * N - 2], "the stream reuses its newest freed block at once");
  /* A request that fits no unsealed block loosely enough: before growing, the stream takes a
   * sealed one of its own (its event has not passed), the piece left over stays pending. */
  /* The heap's idle space, if any, is taken first, so that no free block can serve the request. */
  CUdeviceptr fill[8];
  int nfill = 0;
  vs_pool_figures_t f;
  for (_vs_pool_figures(pool, &f); f.idle[VS_HEAP_LARGE] >= 1 * MiB && nfill < 8; _vs_pool_figures(pool, &f))
    fill[nfill++] = palloc(f.idle[VS_HEAP_LARGE] / MiB * MiB, NULL);
  CHECK(f.idle[VS_HEAP_LARGE] < 1 * MiB, "the large heap's idle space taken (%zu bytes left)", f.idle[VS_HEAP_LARGE]);
  emu_counters_t e0 = now();
  CUdeviceptr part = palloc_on(1 * MiB + 512 * 1024, NULL, s);
  bool from_freed = false;
  for (int i = 0; i < 2 * N; i += 2) from_freed |= part == blk[i];
  CHECK(from_freed && vmm_calls_since(&e0) == 0,
        "a loose fit from one of the stream's own freed blocks, no growth (%llu calls)", vmm_calls_since(&e0));
  CHECK(pfree_on(part, s), "free the loose fit");
  /* Another stream cannot take them before the event passed: it grows instead. */
  CUstream other;
  CHECK(cuStreamCreate(&other, 0) == CUDA_SUCCESS, "another stream");
  e0 = now();
  CUdeviceptr o = palloc_on(2 * MiB, NULL, other);
  bool is_freed = false;
  for (int i = 0; i < 2 * N; i += 2) is_freed |= o == blk[i];
  CHECK(o != 0 && !is_freed, "another stream does not get a block whose event has not passed");
  /* (A free outside streams synchronises the context, in this pool's sync mode: after it, every
   * sealed block is free.) */
  for (int i = 0; i < nfill; i++) CHECK(pfree(fill[i]), "free filler %d", i);
  CHECK(pfree_on(o, other), "free on the other stream");
  CHECK(cuStreamSynchronize(other) == CUDA_SUCCESS, "sync other");
  _vs_pool_stream_destroyed(pool, other);
  CHECK(cuStreamDestroy(other) == CUDA_SUCCESS, "destroy other");
  /* Once the stream completes, the live neighbours freed, a request reclaims it all merged. */
  emu_complete(s, -1);
  for (int i = 1; i < 2 * N; i += 2) CHECK(pfree(blk[i]), "free %d", i);
  CHECK(pfree_on(again, s), "free again");
  CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS, "sync");
  e0 = now();
  CUdeviceptr big = palloc((2 * N - 2 * VS_SEAL_KEEP - 4) * 2 * MiB, NULL);
  CHECK(big != 0 && vmm_calls_since(&e0) == 0, "the sealed blocks merged and serve a request of most of them (%llu calls)",
        vmm_calls_since(&e0));
  CHECK(pfree(big), "free");
  _vs_pool_stream_destroyed(pool, s);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS, "destroy");
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  pool = check_unit_pool();
  if (!pool) return check_summary();
  test_growth_and_reuse();
  test_merge_across_handles();
  test_release_before_growth();
  test_random_sizes();
  test_shared_growth();
  test_stream_merge();
  test_stream_seal();
  _vs_pool_destroy(pool);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
