/* test_unit_whole: blocks of at least the granularity (the whole heap), on the host
 * emulation: each is exactly its own handle, is reused only by a request of about its size,
 * is never split for a smaller one, and is given back when the pool grows, except when it
 * was freed within the last few allocations (a program cycling through a few sizes finds
 * them again) or when its size recurs (a training loop's tensors). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim/internal.h"
#define CHECK_UNIT_HELPERS
#include "check.h"

#define MiB (1024ull * 1024)

static vs_pool_t *pool;
static bool g_contended;

static CUdeviceptr palloc(size_t n, size_t *served) {
  CUdeviceptr p = 0;
  CUresult err;
  size_t s = 0;
  if (_vs_pool_alloc(pool, n, VS_NO_STREAM, VMMSHIM_API_DRIVER, &p, &s, &err, &g_contended) != VS_POOL_OK) return 0;
  if (served) *served = s;
  return p;
}

static bool pfree(CUdeviceptr p) {
  size_t sz, req;
  CUresult err;
  return _vs_pool_free(pool, p, VS_NO_STREAM, VMMSHIM_API_DRIVER, &sz, &req, &err) == VS_POOL_OK;
}

static unsigned long long creates(void) {
  emu_counters_t e;
  emu_get_counters(&e);
  return e.n_cuMemCreate;
}

static unsigned long long handle_bytes(void) {
  emu_counters_t e;
  emu_get_counters(&e);
  return e.handle_bytes;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  vs_device_caps_t caps;
  CUcontext ctx = check_unit_context(&caps);
  pool = _vs_pool_create(ctx, &caps); /* granularity 64 MiB: the whole heap starts there */
  CHECK(pool != NULL, "pool");
  if (!pool) return check_summary();

  /* exactly its own handle: 2 MiB rounding, no share of the granularity */
  size_t served = 0;
  unsigned long long c0 = creates();
  CUdeviceptr a = palloc(200 * MiB + 1, &served);
  CHECK(a && served == 202 * MiB, "200 MiB + 1 served as %zu", served);
  CHECK(creates() == c0 + 1 && handle_bytes() == 202 * MiB, "one handle of 202 MiB (%llu creates, %llu bytes)",
        creates() - c0, handle_bytes());
  CHECK(a % (2 * MiB) == 0, "starts on a handle boundary");
  memset((void *)(uintptr_t)a, 0x11, served);

  /* reused by a request of about its size, without a driver call */
  CHECK(pfree(a), "free a");
  c0 = creates();
  CUdeviceptr a2 = palloc(192 * MiB, &served);
  CHECK(a2 == a && served == 202 * MiB, "192 MiB reuses the 202 MiB block (%s, served %zu)", a2 == a ? "same" : "other",
        served);
  CHECK(creates() == c0, "no handle created for the reuse");
  CHECK(pfree(a2), "free a2");

  /* a much smaller request does not split it; the young idle block is kept */
  c0 = creates();
  CUdeviceptr b = palloc(100 * MiB, &served);
  CHECK(b && b != a && served == 100 * MiB, "100 MiB gets a handle of its own (served %zu)", served);
  CHECK(creates() == c0 + 1, "one new handle");
  CHECK(handle_bytes() == 302 * MiB, "a's idle block, freed just now, is kept: %llu MiB of handles",
        handle_bytes() / MiB);
  CHECK(pfree(b), "free b");
  /* cycling between the two sizes makes no driver call */
  c0 = creates();
  for (int i = 0; i < 10; i++) {
    CUdeviceptr x = palloc(200 * MiB, NULL), y;
    CHECK(x == a, "round %d: 200 MiB finds its block", i);
    CHECK(pfree(x), "free x");
    y = palloc(100 * MiB, NULL);
    CHECK(y == b, "round %d: 100 MiB finds its block", i);
    CHECK(pfree(y), "free y");
  }
  CHECK(creates() == c0, "no handle created while cycling (%llu)", creates() - c0);

  /* once aged, idle whole blocks are given back when the pool grows, except those whose size
   * recurs (200 and 100 MiB were each asked for ten times above: a training loop's tensors) */
  CUdeviceptr big = palloc(3072 * MiB, NULL); /* live: idle recurring blocks stay under mapped/8 */
  CHECK(big != 0, "3 GiB live");
  CUdeviceptr small[16];
  for (int i = 0; i < 16; i++) small[i] = palloc(4096, NULL);
  for (int i = 0; i < 16; i++) CHECK(pfree(small[i]), "free small %d", i);
  CHECK(handle_bytes() == 3072 * MiB + 302 * MiB + 2 * MiB,
        "the live 3 GiB, the two idle whole blocks and a first small-heap handle of 2 MiB");
  CUdeviceptr c = palloc(400 * MiB, &served);
  CHECK(c && served == 400 * MiB, "400 MiB");
  CHECK(handle_bytes() == 3072 * MiB + 302 * MiB + 400 * MiB, "the recurring sizes stay mapped: %llu MiB of handles",
        handle_bytes() / MiB);
  CHECK(palloc(200 * MiB, NULL) == a && pfree(a), "and 200 MiB finds its block again");
  CHECK(pfree(c), "free c");
  /* a size asked for once: its idle block goes back at the next growth once aged */
  for (int i = 0; i < 16; i++) small[i] = palloc(4096, NULL);
  for (int i = 0; i < 16; i++) CHECK(pfree(small[i]), "free small %d", i);
  unsigned long long h1 = handle_bytes();
  CUdeviceptr u = palloc(300 * MiB + 12345, &served);
  CHECK(u && served == 302 * MiB && handle_bytes() == h1 + 302 * MiB - 400 * MiB - 2 * MiB,
        "the aged 400 MiB block (asked for once) and the idle 2 MiB went back: %llu MiB of handles, %llu before", handle_bytes() / MiB,
        h1 / MiB);
  CHECK(_vs_pool_check(pool) == 0, "pool consistent");
  CHECK(pfree(u), "free u");
  CHECK(pfree(big), "free big");
  /* recurring blocks are kept only while idle memory stays under mapped/8: here they are
   * the whole pool, and go back like any other */
  _vs_pool_trim(pool, 0);
  for (int i = 0; i < 3; i++) {
    CUdeviceptr x = palloc(200 * MiB, NULL), y = palloc(100 * MiB, NULL);
    CHECK(x && y && pfree(x) && pfree(y), "recurring round %d", i);
  }
  for (int i = 0; i < 16; i++) small[i] = palloc(4096, NULL);
  for (int i = 0; i < 16; i++) CHECK(pfree(small[i]), "free small %d", i);
  CUdeviceptr v = palloc(400 * MiB, NULL);
  CHECK(v && handle_bytes() == 400 * MiB, "idle recurring blocks over mapped/8 went back: %llu MiB of handles",
        handle_bytes() / MiB);
  CHECK(pfree(v), "free v");

  /* below the granularity: shared handles, 1/8 of what the heap maps (at most the
   * granularity), so a small heap maps little more than it uses and a big one few handles */
  _vs_pool_trim(pool, 0);
  CHECK(handle_bytes() == 0, "nothing mapped after a trim (%llu MiB)", handle_bytes() / MiB);
  c0 = creates();
  unsigned long long h0 = handle_bytes();
  CUdeviceptr d[100];
  int ok = 0;
  for (int i = 0; i < 100; i++) ok += (d[i] = palloc(8 * MiB, NULL)) != 0;
  unsigned long long grown = handle_bytes() - h0, made = creates() - c0;
  CHECK(ok == 100, "100 blocks of 8 MiB");
  CHECK(grown >= 800 * MiB && grown <= 800 * MiB + 100 * MiB, "mapped %llu MiB for 800 MiB: at most 1/8 more",
        grown / MiB);
  CHECK(made >= 15 && made <= 40, "%llu handles for 800 MiB (8 MiB each at first, growing towards 64 MiB)", made);
  for (int i = 0; i < 100; i++) CHECK(pfree(d[i]), "free d%d", i);
  CHECK(_vs_pool_check(pool) == 0, "pool consistent at the end");
  _vs_pool_destroy(pool);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
