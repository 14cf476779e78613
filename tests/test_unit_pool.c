/* test_unit_pool: src/pool.c (with vmm.c, cuda.c, config.c ...) linked straight in and
 * driven on the emulated driver: 200000 random operations (synchronous, and stream-
 * ordered on 3 streams with work pending on them), sizes log-uniform 1 B .. 64 MiB.
 * Every 1000 operations: _vs_pool_check finds no inconsistency and no two live blocks
 * overlap; every live block keeps its tag; no contract violation. Then trim with nothing
 * live leaves nothing mapped, and destroy leaves nothing in the emulation. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "vmmshim/internal.h"
#define CHECK_UNIT_HELPERS
#include "check.h"

#define MiB (1ull << 20)
#define NOPS 200000
#define MAXLIVE 96
#define MAXBYTES (1536ull * MiB)

typedef struct {
  CUdeviceptr p;
  size_t n, served;
  unsigned long long tag;
} live_t;

static live_t live[MAXLIVE];
static int nlive;
static size_t live_bytes;
static bool g_contended; /* out-parameters the tests do not look at */
static size_t g_freq;

static int cmp_live(const void *a, const void *b) {
  CUdeviceptr x = ((const live_t *)a)->p, y = ((const live_t *)b)->p;
  return x < y ? -1 : x > y;
}

static void put_tag(const live_t *b) {
  size_t k = b->n < 8 ? b->n : 8;
  memcpy((void *)(uintptr_t)b->p, &b->tag, k);
  if (b->n >= 16) memcpy((void *)(uintptr_t)(b->p + b->n - 8), &b->tag, 8);
}
static int tag_ok(const live_t *b) {
  unsigned long long t = 0, u = 0;
  size_t k = b->n < 8 ? b->n : 8;
  memcpy(&t, (void *)(uintptr_t)b->p, k);
  unsigned long long want = 0;
  memcpy(&want, &b->tag, k);
  if (t != want) return 0;
  if (b->n >= 16) {
    memcpy(&u, (void *)(uintptr_t)(b->p + b->n - 8), 8);
    if (u != b->tag) return 0;
  }
  return 1;
}

static void noop(void *arg) { (void)arg; }

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  vs_device_caps_t caps;
  CUcontext ctx = check_unit_context(&caps);
  CHECK(caps.vmm_supported && caps.min_granularity == 2 * MiB, "caps: vmm %d gran %zu", caps.vmm_supported,
        caps.min_granularity);
  vs_pool_t *pool = _vs_pool_create(ctx, &caps, _vs_peer_state(ctx, (int)caps.device));
  CHECK(pool != NULL, "pool");
  if (!pool) return check_summary();
  CHECK(_vs_pool_context(pool) == ctx && _vs_pool_device(pool) == 0, "pool identity");
  CUstream st[3];
  for (int i = 0; i < 3; i++) CHECK(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");

  unsigned long long rs = 0xC0FFEEull, serial = 0;
  int alloc_fail = 0, free_fail = 0, misaligned = 0, bad_tag = 0, check_bad = 0, overlaps = 0, range_bad = 0;
  int oom = 0;
  double t0 = now_s();
  for (int op = 0; op < NOPS; op++) {
    unsigned long long r = rnd_next(&rs);
    int want_alloc = nlive == 0 || (nlive < MAXLIVE && (r & 1));
    if (want_alloc) {
      size_t n = rnd_size(&rs, 64 * MiB);
      if (live_bytes + n > MAXBYTES) want_alloc = 0;
      else {
        int si = (int)((r >> 8) % 4); /* 3: synchronous */
        CUstream s = si == 3 ? VS_NO_STREAM : st[si];
        live_t *b = &live[nlive];
        CUresult err = CUDA_SUCCESS;
        vs_pool_status_t ps = _vs_pool_alloc(pool, n, s, VMMSHIM_API_DRIVER, &b->p, &b->served, &err, &g_contended);
        if (ps != VS_POOL_OK) {
          if (ps == VS_POOL_OOM) oom++;
          else alloc_fail++;
        } else {
          b->n = n;
          b->tag = ++serial * 0x9E3779B97F4A7C15ull;
          if (b->p % 256) misaligned++;
          if (b->served < n) alloc_fail++;
          put_tag(b);
          live_bytes += n;
          nlive++;
        }
      }
    }
    if (!want_alloc && nlive) {
      int i = (int)((r >> 16) % (unsigned)nlive);
      live_t b = live[i];
      live[i] = live[--nlive];
      live_bytes -= b.n;
      if (!tag_ok(&b)) bad_tag++;
      /* an interior pointer finds the block */
      CUdeviceptr base = 0;
      size_t sz = 0;
      if (b.n > 1 && (r >> 40) % 16 == 0) {
        if (!_vs_pool_range(pool, b.p + b.n / 2, &base, &sz) || base != b.p || sz != b.n) range_bad++;
      }
      int si = (int)((r >> 24) % 4);
      CUstream s = si == 3 ? VS_NO_STREAM : st[si];
      if (si != 3 && (r >> 32) % 4 == 0) emu_launch(s, noop, NULL); /* work before the free */
      size_t fsz = 0;
      CUresult err = CUDA_SUCCESS;
      vs_free_kind_t kind = s == VS_NO_STREAM ? VS_FREE_KIND_SYNC : VS_FREE_KIND_STREAM;
      if (_vs_pool_free(pool, b.p, kind, s, VMMSHIM_API_DRIVER, &fsz, &g_freq, &err) != VS_POOL_OK ||
          err != CUDA_SUCCESS || fsz != b.served)
        free_fail++;
      /* freeing it again is refused */
      if ((r >> 44) % 64 == 0 &&
          _vs_pool_free(pool, b.p, VS_FREE_KIND_SYNC, VS_NO_STREAM, VMMSHIM_API_DRIVER, &fsz, &g_freq, &err) !=
              VS_POOL_NOT_OWNED)
        free_fail++;
    }
    if (op % 97 == 0) emu_complete(st[op % 3], -1); /* the device makes progress */
    if (op % 1000 == 999) {
      int c = _vs_pool_check(pool);
      if (c) {
        if (check_bad++ < 3) printf("op %d: _vs_pool_check found %d problems\n", op, c);
      }
      qsort(live, (size_t)nlive, sizeof *live, cmp_live);
      for (int i = 1; i < nlive; i++)
        if (live[i - 1].p + live[i - 1].served > live[i].p) overlaps++;
      for (int i = 0; i < nlive; i++)
        if (!tag_ok(&live[i])) bad_tag++;
    }
  }
  printf("pool: %d operations in %.2f s, %d live, %zu MiB mapped\n", NOPS, now_s() - t0, nlive,
         _vs_mapped_total() >> 20);
  CHECK(alloc_fail == 0, "%d allocations failed", alloc_fail);
  CHECK(oom == 0, "%d allocations out of memory (at most %llu MiB live on a 4 GiB device)", oom, MAXBYTES >> 20);
  CHECK(free_fail == 0, "%d frees failed", free_fail);
  CHECK(misaligned == 0, "%d misaligned", misaligned);
  CHECK(bad_tag == 0, "%d blocks lost their tag", bad_tag);
  CHECK(check_bad == 0, "_vs_pool_check failed %d times", check_bad);
  CHECK(overlaps == 0, "%d overlaps", overlaps);
  CHECK(range_bad == 0, "%d wrong ranges", range_bad);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());

  /* free everything (stream-ordered frees stay pending until the device catches up) */
  while (nlive) {
    live_t b = live[--nlive];
    size_t fsz;
    CUresult err;
    CHECK(_vs_pool_free(pool, b.p, VS_FREE_KIND_STREAM, st[nlive % 3], VMMSHIM_API_DRIVER, &fsz, &g_freq, &err) ==
              VS_POOL_OK,
          "final free");
  }
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "sync");
  /* one synchronous free lets the pool know the device is idle */
  CUdeviceptr p;
  size_t served, fsz;
  CUresult err;
  CHECK(_vs_pool_alloc(pool, 1, VS_NO_STREAM, VMMSHIM_API_DRIVER, &p, &served, &err, &g_contended) == VS_POOL_OK, "alloc");
  CHECK(_vs_pool_free(pool, p, VS_FREE_KIND_SYNC, VS_NO_STREAM, VMMSHIM_API_DRIVER, &fsz, &g_freq, &err) == VS_POOL_OK,
        "free");
  CHECK(_vs_pool_check(pool) == 0, "check before trim");
  size_t idle = _vs_pool_idle_bytes(pool);
  size_t released = _vs_pool_trim(pool, 0);
  emu_counters_t e;
  emu_get_counters(&e);
  CHECK(released == idle, "trim released %zu of %zu idle bytes", released, idle);
  CHECK(e.mapped_bytes == 0 && e.live_mappings == 0 && e.live_handles == 0,
        "after trim: %llu bytes mapped, %ld mappings, %ld handles", e.mapped_bytes, e.live_mappings, e.live_handles);
  CHECK(_vs_mapped_total() == 0, "_vs_mapped_total %zu", _vs_mapped_total());
  CHECK(_vs_pool_check(pool) == 0, "check after trim");
  /* the pool grows again after a trim */
  CHECK(_vs_pool_alloc(pool, 3 * MiB, VS_NO_STREAM, VMMSHIM_API_DRIVER, &p, &served, &err, &g_contended) == VS_POOL_OK, "regrow");
  memset((void *)(uintptr_t)p, 0x5a, 3 * MiB);
  CHECK(_vs_pool_check(pool) == 0, "check after regrow");
  /* destroy with a live block: everything goes */
  _vs_pool_destroy(pool);
  emu_get_counters(&e);
  CHECK(e.live_handles == 0 && e.live_mappings == 0 && e.live_reservations == 0,
        "after destroy: %ld handles, %ld mappings, %ld reservations", e.live_handles, e.live_mappings,
        e.live_reservations);
  CHECK(_vs_mapped_total() == 0, "_vs_mapped_total %zu after destroy", _vs_mapped_total());
  for (int i = 0; i < 3; i++) CHECK(cuStreamDestroy(st[i]) == CUDA_SUCCESS, "stream destroy");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
