/* test_unit_free_kind: the kind of each free (vmmshim/pool.h: sync, deferred, ordered, stream),
 * decided by alloc.c and told to the pool, seen in where the freed block is right after the free.
 * src/ is linked straight in (alloc.c's _vs_alloc and _vs_free on the host emulation); each free
 * mode is a process of its own (the options are read once).
 *
 *   sync      VMMSHIM_FREE_MODE=sync: a free synchronises the context once and its block is free
 *             at once, also after a submission was named (the order is off in sync mode).
 *   deferred  VMMSHIM_FREE_MODE=deferred, two devices:
 *             - before any submission: deferred (pending, no synchronisation), and the reclaimer
 *               frees it once it may synchronise;
 *             - all work on the legacy stream of device 0's context: ordered (free at once, no
 *               synchronisation, unmapping waits for one); device 1's pool: still deferred;
 *             - a free on a stream: pending on that stream, reused by it at once;
 *             - once the order has ended: deferred again.
 * While a deferred free is looked at, the reclaimer is held off by a capture said to be active
 * (it never synchronises during one), so that the block cannot leave PENDING meanwhile. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "vmmshim/internal.h"
#include "vmmshim/pool_internal.h"
#define CHECK_UNIT_HELPERS
#include "check.h"

#define MiB (1ull << 20)

typedef enum { AT_NONE, AT_USED, AT_FREE, AT_DEFERRED, AT_STREAM, AT_OTHER } where_t;
static const char *where_name[] = {"nowhere", "used", "free", "pending (deferred)", "pending (on a stream)", "other"};

/* Where the memory at ptr is in pool p: the block holding it (after merges) and its state. */
static where_t where(vs_pool_t *p, CUdeviceptr ptr) {
  where_t w = AT_NONE;
  pool_lock(p);
  for (int r = 0; r < p->n_resv && w == AT_NONE; r++)
    for (const vs_block_t *b = p->resv[r].first; b && w == AT_NONE; b = b->next) {
      if (ptr < b->addr || ptr >= b->addr + b->size) continue;
      if (b->state == B_USED) w = AT_USED;
      else if (b->state == B_FREE) w = AT_FREE;
      else if (b->state == B_PENDING) w = b->stream ? AT_STREAM : b->batch ? AT_OTHER : AT_DEFERRED;
      else w = AT_OTHER;
    }
  pool_unlock(p);
  return w;
}

static CUdeviceptr alloc_on(size_t n, CUstream s) {
  CUdeviceptr p = 0;
  CUresult err;
  vmmshim_api_t api = s == VS_NO_STREAM ? VMMSHIM_API_DRIVER : VMMSHIM_API_DRIVER_ASYNC;
  return _vs_alloc(api, n, s, &p, &err) == VS_ALLOC_SERVED ? p : 0;
}

static bool free_on(CUdeviceptr p, CUstream s) {
  CUresult err;
  vmmshim_api_t api = s == VS_NO_STREAM ? VMMSHIM_API_DRIVER : VMMSHIM_API_DRIVER_ASYNC;
  return _vs_free(api, p, s, &err) && err == CUDA_SUCCESS;
}

static long long syncs(void) { return emu_calls("cuCtxSynchronize"); }

static void hold_reclaimer(bool hold) { atomic_store(&_vs_captures_active, hold ? 1 : 0); }

/* A deferred free's block leaves PENDING once the reclaimer may synchronise again. */
static bool reclaimed(vs_pool_t *p, CUdeviceptr ptr) {
  for (int i = 0; i < 5000; i++) {
    if (where(p, ptr) == AT_FREE) return true;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Frees ptr without a stream, the reclaimer held off, and says where its block went. */
static where_t free_held(vs_pool_t *pool, CUdeviceptr ptr, long long *synced) {
  hold_reclaimer(true);
  long long s0 = syncs();
  CHECK(free_on(ptr, VS_NO_STREAM), "free 0x%llx", (unsigned long long)ptr);
  where_t w = where(pool, ptr);
  *synced = syncs() - s0;
  return w;
}

static void scenario_sync(void) {
  CUdeviceptr a = alloc_on(4 * MiB, VS_NO_STREAM);
  CHECK(a != 0, "alloc a");
  vs_pool_t *pool = _vs_dir_lookup(a);
  CHECK(pool != NULL, "a's pool");
  if (!pool) return;
  long long s0 = syncs();
  CHECK(free_on(a, VS_NO_STREAM), "free a");
  where_t w = where(pool, a);
  CHECK(w == AT_FREE, "sync: a's block is %s", where_name[w]);
  CHECK(syncs() - s0 == 1, "sync: %lld context synchronisations for the free", syncs() - s0);

  /* A submission named in sync mode fixes no stream: the next free is sync again. */
  _vs_order_see(NULL, 0);
  CHECK(!strncmp(_vs_order_describe(), "no", 2), "sync mode, order: %s", _vs_order_describe());
  CUdeviceptr b = alloc_on(4 * MiB, VS_NO_STREAM);
  s0 = syncs();
  CHECK(b != 0 && free_on(b, VS_NO_STREAM), "alloc and free b");
  w = where(pool, b);
  CHECK(w == AT_FREE, "sync after a submission: b's block is %s", where_name[w]);
  CHECK(syncs() - s0 == 1, "sync after a submission: %lld context synchronisations", syncs() - s0);
}

static void scenario_deferred(CUcontext ctx0) {
  CUcontext ctx1 = NULL;
  CHECK(cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS && ctx1, "device 1's context");
  CUdeviceptr a = alloc_on(4 * MiB, VS_NO_STREAM);
  CHECK(a != 0, "alloc a");
  vs_pool_t *pool = _vs_dir_lookup(a);
  CHECK(pool != NULL && _vs_pool_context(pool) == ctx0, "a's pool");
  if (!pool) return;
  long long synced;

  /* 1. No submission yet: deferred. */
  where_t w = free_held(pool, a, &synced);
  CHECK(w == AT_DEFERRED, "before any submission: a's block is %s", where_name[w]);
  CHECK(synced == 0, "deferred: %lld context synchronisations for the free", synced);
  hold_reclaimer(false);
  CHECK(reclaimed(pool, a), "the reclaimer did not free a's block");

  /* 2. All work on device 0's legacy stream: ordered. */
  _vs_order_see(NULL, 0);
  CHECK(!strncmp(_vs_order_describe(), "yes", 3), "order after one stream: %s", _vs_order_describe());
  CUdeviceptr b = alloc_on(4 * MiB, VS_NO_STREAM);
  CHECK(b != 0 && _vs_dir_lookup(b) == pool, "alloc b");
  w = free_held(pool, b, &synced);
  CHECK(w == AT_FREE, "one stream: b's block is %s", where_name[w]);
  CHECK(synced == 0, "ordered: %lld context synchronisations for the free", synced);
  pool_lock(pool);
  bool unsettled = _vs_pool_ordered_unsettled(pool);
  pool_unlock(pool);
  CHECK(unsettled, "ordered: unmapping b's memory would not wait for a synchronisation");
  hold_reclaimer(false);

  /* 3. The order is device 0's context's: device 1's pool frees as deferred. */
  CHECK(cuCtxSetCurrent(ctx1) == CUDA_SUCCESS, "device 1 current");
  CUdeviceptr c = alloc_on(4 * MiB, VS_NO_STREAM);
  CHECK(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS, "device 0 current");
  vs_pool_t *pool1 = c ? _vs_dir_lookup(c) : NULL;
  CHECK(pool1 != NULL && pool1 != pool && _vs_pool_context(pool1) == ctx1, "c's pool on device 1");
  if (pool1) {
    w = free_held(pool1, c, &synced);
    CHECK(w == AT_DEFERRED, "one stream of another context: c's block is %s", where_name[w]);
    CHECK(synced == 0, "deferred on device 1: %lld context synchronisations", synced);
    hold_reclaimer(false);
    CHECK(reclaimed(pool1, c), "the reclaimer did not free c's block");
  }

  /* 4. On a stream: pending on it, and its own next allocation takes it at once. */
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  CUdeviceptr d = alloc_on(4 * MiB, s);
  CHECK(d != 0 && _vs_dir_lookup(d) == pool, "alloc d on the stream");
  long long s0 = syncs();
  CHECK(free_on(d, s), "free d on the stream");
  w = where(pool, d);
  CHECK(w == AT_STREAM, "on a stream: d's block is %s", where_name[w]);
  CHECK(syncs() == s0, "stream: %lld context synchronisations for the free", syncs() - s0);
  CUdeviceptr e = alloc_on(4 * MiB, s);
  CHECK(e == d, "the stream's next allocation (0x%llx) did not take d (0x%llx)", (unsigned long long)e,
        (unsigned long long)d);
  CHECK(e && free_on(e, s), "free e on the stream");

  /* 5. The order ended: deferred again. */
  _vs_order_leave("a second stream, in this test", true);
  CHECK(!strncmp(_vs_order_describe(), "no longer", 9), "order after the leave: %s", _vs_order_describe());
  CUdeviceptr f = alloc_on(4 * MiB, VS_NO_STREAM);
  CHECK(f != 0 && _vs_dir_lookup(f) == pool, "alloc f");
  w = free_held(pool, f, &synced);
  CHECK(w == AT_DEFERRED, "after the order: f's block is %s", where_name[w]);
  CHECK(synced == 0, "deferred after the order: %lld context synchronisations", synced);
  hold_reclaimer(false);
  CHECK(reclaimed(pool, f), "the reclaimer did not free f's block");
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS, "stream destroyed");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  const char *sc = check_child_main(argc, argv);
  if (!sc) {
    check_run_child("sync", "VMMSHIM_FREE_MODE=sync", NULL);
    check_run_child("deferred", "VMMSHIM_FREE_MODE=deferred", NULL);
    return check_summary();
  }
  emu_set_device_count(2);
  vs_device_caps_t caps;
  CUcontext ctx = check_unit_context(&caps);
  CHECK(_vs_active(), "shim active");
  if (!strcmp(sc, "sync")) scenario_sync();
  else if (!strcmp(sc, "deferred")) scenario_deferred(ctx);
  else CHECK(0, "unknown scenario %s", sc);
  return check_child_summary(sc);
}
