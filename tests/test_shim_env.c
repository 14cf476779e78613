/* test_shim_env: scenarios that need their own process, because the shim reads its
 * options once and the emulation's device settings must be made before first use. The
 * parent re-executes itself once per scenario with the environment set (tests/check.h).
 *
 *   deferred  VMMSHIM_FREE_MODE=deferred: cudaFree does not wait for earlier work, the
 *             range is not reused while that work is pending, and the background
 *             reclaimer makes it reusable once the work has completed.
 *   one-stream  VMMSHIM_FREE_MODE=deferred, all work launched on the legacy stream: a freed
 *             block is reused at once while work queued before its free still reads it, and
 *             that work sees its bytes intact (the next owner's work queues behind it); a trim
 *             waits for that work before unmapping; the first launch on another stream makes
 *             that stream wait for the legacy stream's work on the GPU (the host does not
 *             wait), and later frees wait for a synchronisation again.
 *             With VMMSHIM_ONE_STREAM=0: never reused while the work is pending. With
 *             VMMSHIM_RELEASE_THRESHOLD=0 the free gives the handle back after that work. A
 *             capture waits for that work before it begins, and ends the order. Per-thread
 *             streams: a thread started after the first one exited has a stream of its own. A
 *             first launch on a destroyed stream gets the driver's error, and changes nothing.
 *             A wait on the legacy stream for a value another stream writes later
 *             (cuStreamWaitValue32/64, cuStreamBatchMemOp) ends the order before it is queued:
 *             no deadlock with the other stream, and frees behind it wait again.
 *   deferred-bound  VMMSHIM_FREE_MODE=deferred: a program that frees and allocates again
 *             while the GPU is busy (work of 300 us) keeps what the pool maps within 2 x what it
 *             has in use (4 x without waiting): once a long sync has been seen, a request that
 *             growth would take past 1.1 x waits for the deferred frees.
 *   async-bound  the same on a stream: a program that allocates on a stream the GPU has not
 *             caught up with, in sizes its own freed blocks do not fit one by one, keeps what
 *             the pool maps within 1.1 x what it has in use (plus one growth step): the
 *             request waits for that stream (only); live blocks never overlap, and the
 *             work queued on them runs.
 *   relocate  VMMSHIM_MAX_HANDLE=8M: a growth maps idle handles again at its own address
 *             instead of releasing them and creating new ones; with a failing map too. Without
 *             the variable: the growth is one new handle; with VMMSHIM_STITCH=1 the stitch maps
 *             idle handles too (at most 8).
 *   gran2m    VMMSHIM_GRANULARITY=2M: blocks spanning many handles, every byte written
 *             and read back, no overlaps.
 *   limit     VMMSHIM_LIMIT=64M: allocations beyond fail with out-of-memory,
 *             cudaMemGetInfo reports the cap.
 *   oom       a 256 MiB device: allocation failure codes, recovery by releasing idle
 *             handles.
 *   novmm     a device without VMM support: everything passes through.
 *   nofd      no POSIX-fd / RDMA support: handles are created without those properties.
 *   disable   VMMSHIM_DISABLE=1: pure pass-through.
 *   badgran   VMMSHIM_GRANULARITY=12Q: a message naming the variable and the value, the
 *             default used. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

typedef struct {
  unsigned char *p;
  size_t n;
  pthread_t main;
  volatile int ran;
  volatile int on_main;
} work_t;

static void work_fill(void *arg) {
  work_t *w = arg;
  pat_fill(w->p, w->n, 3);
  w->on_main = pthread_equal(pthread_self(), w->main);
  __atomic_store_n(&w->ran, 1, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ deferred */
/* True once no freed block is waiting (idle bytes = mapped - in use), polled up to t s. */
static int wait_reclaimed(double t) {
  double end = now_s() + t;
  for (;;) {
    size_t f = 0, tot = 0;
    cudaMemGetInfo(&f, &tot);
    vmmshim_stats_t s = shim_stats();
    size_t idle = f - (tot - emu_device_used(0));
    if (idle == s.bytes_mapped - s.bytes_in_use) return 1;
    if (now_s() > end) {
      printf("waiting: idle %zu, mapped %llu, in use %llu\n", idle, (unsigned long long)s.bytes_mapped,
             (unsigned long long)s.bytes_in_use);
      return 0;
    }
    sleep_ms(2);
  }
}

/* ------------------------------------------------------------------ one stream */

static int kernel_stub; /* the emulation's launches run nothing: any function handle does */
static CUresult launch_on(CUstream s) {
  return cuLaunchKernel((CUfunction)&kernel_stub, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
}

typedef struct {
  unsigned char *p;
  size_t n;
  unsigned long long seed;
  volatile int ran;
  volatile int intact;
} reader_t;

/* A kernel that reads its block when it runs: the bytes must still be those it was given. */
static void work_read(void *arg) {
  reader_t *r = arg;
  r->intact = emu_device_access(0, (CUdeviceptr)r->p, r->n, 0) == 0 && pat_check(r->p, r->n, r->seed) == (size_t)-1;
  __atomic_store_n(&r->ran, 1, __ATOMIC_RELEASE);
}

/* A kernel that writes its block. */
static void work_write(void *arg) {
  reader_t *r = arg;
  if (emu_device_access(0, (CUdeviceptr)r->p, r->n, 1) == 0) pat_fill(r->p, r->n, r->seed);
  __atomic_store_n(&r->ran, 1, __ATOMIC_RELEASE);
}

/* A block of n bytes filled with seed 5, and a reader of it queued on the legacy stream. */
static void *block_read_later(size_t n, reader_t *r) {
  void *p = NULL;
  CHECK(cudaMalloc(&p, n) == cudaSuccess, "alloc");
  pat_fill(p, n, 5);
  *r = (reader_t){p, n, 5, 0, 0};
  CHECK(launch_on(NULL) == CUDA_SUCCESS, "launch");
  emu_launch(NULL, work_read, r);
  return p;
}

/* VMMSHIM_RELEASE_THRESHOLD=0: the free itself gives the block's handle back, after the
 * work queued before it. */
static void scenario_one_stream_release(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  reader_t r;
  void *c = block_read_later(64 * MiB, &r);
  CHECK(cudaFree(c) == cudaSuccess, "free c");
  CHECK(r.ran && r.intact, "c was unmapped before the work reading it ran (ran %d, intact %d)", r.ran, r.intact);
  CHECK(shim_stats().bytes_mapped < 64 * MiB, "the free gave nothing back (%llu mapped)",
        (unsigned long long)shim_stats().bytes_mapped);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* The per-thread-stream launch (cuda.h declares it only in per-thread builds). */
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned shmem, CUstream s, void **params, void **extra);
static CUresult launch_ptsz(void) {
  return cuLaunchKernel_ptsz((CUfunction)&kernel_stub, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
}

/* A thread whose per-thread stream becomes the one stream: it queues a reader of a block on it,
 * frees the block and exits. */
static void *thread_read_then_free(void *arg) {
  reader_t *r = arg;
  CHECK(cudaFree(NULL) == cudaSuccess, "thread init");
  void *p = NULL;
  CHECK(cudaMalloc(&p, r->n) == cudaSuccess, "alloc");
  pat_fill(p, r->n, r->seed);
  r->p = p;
  CHECK(launch_ptsz() == CUDA_SUCCESS, "launch on the per-thread stream");
  emu_launch(CU_STREAM_PER_THREAD, work_read, r);
  CHECK(cudaFree(p) == cudaSuccess, "free");
  return NULL;
}

static void *thread_launch(void *arg) {
  (void)arg;
  CHECK(cudaFree(NULL) == cudaSuccess, "thread init");
  CHECK(launch_ptsz() == CUDA_SUCCESS, "launch on the per-thread stream");
  return NULL;
}

/* Per-thread default streams: each thread's is a stream of its own, also a thread started after
 * the first one's has exited. The second one ends the order; another thread's per-thread stream
 * cannot be waited for by an event, so the context is synchronised. */
static void scenario_one_stream_threads(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  reader_t r = {NULL, 4 * MiB, 5, 0, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_read_then_free, &r) == 0, "thread");
  pthread_join(t, NULL);
  CHECK(!r.ran, "the reader ran before the second thread's launch");
  CHECK(pthread_create(&t, NULL, thread_launch, NULL) == 0, "thread");
  pthread_join(t, NULL);
  CHECK(r.ran && r.intact, "a later thread's per-thread stream passed as the first one's (reader ran %d)", r.ran);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* The first launch names a stream the driver does not know: the driver's error comes back (the
 * shim does not take it for the one stream, nor loop on it), and the next launch fixes the
 * stream as usual. */
static void scenario_one_stream_badstream(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  cudaStream_t gone;
  CHECK(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking) == cudaSuccess && cudaStreamDestroy(gone) == cudaSuccess,
        "a destroyed stream");
  CHECK(launch_on((CUstream)gone) != CUDA_SUCCESS, "a launch on a destroyed stream succeeded");
  int v0 = emu_violations(); /* (the emulation counts that launch as a violation) */
  reader_t r;
  void *a = block_read_later(4 * MiB, &r);
  CHECK(cudaFree(a) == cudaSuccess, "free a");
  void *b = NULL;
  CHECK(cudaMalloc(&b, 4 * MiB) == cudaSuccess && b == a && !r.ran, "a not reused at once on the legacy stream");
  emu_complete(NULL, -1);
  CHECK(r.intact, "the reader of a saw other bytes");
  CHECK(cudaFree(b) == cudaSuccess, "free b");
  CHECK(emu_violations() == v0, "%d violations", emu_violations() - v0);
}

/* A capture ends the one-stream order before it begins: a sync would invalidate it later, so
 * the work queued before the frees is waited for on the host first. */
static void scenario_one_stream_capture(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  reader_t r;
  void *a = block_read_later(4 * MiB, &r);
  CHECK(cudaFree(a) == cudaSuccess, "free a");
  CHECK(!r.ran, "the free waited");
  cudaStream_t x;
  CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking) == cudaSuccess, "stream");
  CHECK(cudaStreamBeginCapture(x, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  CHECK(r.ran && r.intact, "the capture began before the work queued before the free ran");
  cudaGraph_t g = NULL;
  CHECK(cudaStreamEndCapture(x, &g) == cudaSuccess, "end capture");
  if (g) cudaGraphDestroy(g);
  reader_t r2;
  void *b = block_read_later(4 * MiB, &r2);
  CHECK(cudaFree(b) == cudaSuccess, "free b");
  void *c = NULL;
  CHECK(cudaMalloc(&c, 4 * MiB) == cudaSuccess, "alloc c");
  CHECK(r2.ran || c != b, "after the capture, b's range handed out while its reader was pending");
  emu_complete(NULL, -1);
  CHECK(cudaFree(c) == cudaSuccess && cudaStreamDestroy(x) == cudaSuccess, "free c, destroy x");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* A wait on the one stream S for a value that a later submission to another stream writes
 * (cuStreamWaitValue32/64, or a wait in cuStreamBatchMemOp; WAIT_FORM picks): the order ends
 * before the wait is queued. Were it still on, the other stream's first submission would wait on
 * the GPU for S's work, the wait included: a deadlock (the emulation's wait reports it as a
 * hang); and a block freed behind the wait would be reused at once. */
static CUresult wait_value_on(CUstream s, CUdeviceptr flag, const char *form) {
  if (!strcmp(form, "wait64")) return cuStreamWaitValue64(s, flag, 1, CU_STREAM_WAIT_VALUE_EQ);
  if (!strcmp(form, "batch")) {
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = flag;
    op.waitValue.value = 1;
    op.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    return cuStreamBatchMemOp(s, 1, &op, 0);
  }
  return cuStreamWaitValue32(s, flag, 1, CU_STREAM_WAIT_VALUE_EQ);
}

static void scenario_one_stream_waitvalue(void) {
  const char *form = getenv("WAIT_FORM") ? getenv("WAIT_FORM") : "wait32";
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  unsigned long long *flag = NULL;
  CHECK(cudaMalloc((void **)&flag, 4096) == cudaSuccess && flag, "alloc flag");
  if (!flag) return;
  *flag = 0;
  reader_t r1;
  void *a = block_read_later(4 * MiB, &r1); /* fixes S: the legacy stream */
  CHECK(cudaFree(a) == cudaSuccess, "free a");
  void *a2 = NULL;
  CHECK(cudaMalloc(&a2, 4 * MiB) == cudaSuccess && a2 == a, "one stream: a not reused at once");
  CHECK(wait_value_on(NULL, (CUdeviceptr)flag, form) == CUDA_SUCCESS, "%s on S", form);
  CHECK(r1.ran && r1.intact, "%s: the order ended without waiting for S's earlier work", form);
  reader_t r2;
  void *c = block_read_later(4 * MiB, &r2); /* behind the wait */
  CHECK(cudaFree(c) == cudaSuccess, "free c");
  void *d = NULL;
  CHECK(cudaMalloc(&d, 4 * MiB) == cudaSuccess, "alloc d");
  CHECK(d != c || __atomic_load_n(&r2.ran, __ATOMIC_ACQUIRE),
        "%s: the order did not end: c's range handed out while its reader waits behind the wait", form);
  cudaStream_t x;
  CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking) == cudaSuccess, "stream");
  /* As in tests/gpu/t_waitvalue.cu, x's first submission is the write itself; with LAUNCH_FIRST
   * set, a launch on x goes first (another path into the order's leave). */
  if (getenv("LAUNCH_FIRST")) CHECK(launch_on((CUstream)x) == CUDA_SUCCESS, "launch on x");
  CHECK(cuStreamWriteValue32((CUstream)x, (CUdeviceptr)flag, 1, 0) == CUDA_SUCCESS, "write the value on x");
  int v0 = emu_violations();
  CHECK(cudaStreamSynchronize(x) == cudaSuccess, "x completes");
  CHECK(emu_violations() == v0, "%s: x waited for S, which waits for x (%d violations)", form, emu_violations() - v0);
  CHECK(*flag == 1, "the value was written (%llu)", *flag);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
  CHECK(r2.ran && r2.intact, "the reader behind the wait ran and saw its bytes (ran %d)", r2.ran);
  CHECK(cudaFree(d) == cudaSuccess && cudaFree(a2) == cudaSuccess && cudaFree(flag) == cudaSuccess, "free");
  CHECK(cudaStreamDestroy(x) == cudaSuccess, "destroy x");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

static void scenario_one_stream(bool on) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  uint64_t syncs0 = shim_stats().syncs;
  /* 1. Freed while its reader is queued, allocated again by the same size. */
  reader_t r1;
  void *a = block_read_later(4 * MiB, &r1);
  CHECK(cudaFree(a) == cudaSuccess, "free a");
  void *b = NULL;
  CHECK(cudaMalloc(&b, 4 * MiB) == cudaSuccess, "alloc b");
  if (!on) { /* (the reclaimer may synchronise at any moment: then a is free again, rightly) */
    CHECK(b != a || __atomic_load_n(&r1.ran, __ATOMIC_ACQUIRE),
          "VMMSHIM_ONE_STREAM=0: a's range handed out while its reader was pending");
    emu_complete(NULL, -1);
    CHECK(r1.ran && r1.intact, "the reader of a saw other bytes");
    CHECK(emu_violations() == 0, "%d violations", emu_violations());
    return;
  }
  CHECK(emu_pending(NULL) == 1 && !r1.ran, "the free or the allocation waited for the queued reader");
  CHECK(b == a, "one stream: a (%p) not reused at once (got %p)", a, b);
  CHECK(shim_stats().syncs == syncs0, "one stream: %llu synchronisations for the free",
        (unsigned long long)(shim_stats().syncs - syncs0));
  reader_t w1 = {b, 4 * MiB, 7, 0, 0}; /* the new owner writes b on the same stream */
  CHECK(launch_on(NULL) == CUDA_SUCCESS, "launch");
  emu_launch(NULL, work_write, &w1);
  emu_complete(NULL, -1);
  CHECK(r1.ran && r1.intact, "the reader queued before the free saw the next owner's bytes");
  CHECK(w1.ran && pat_check(b, 4 * MiB, 7) == (size_t)-1, "the new owner's write is not there");
  CHECK(cudaFree(b) == cudaSuccess, "free b");

  /* 2. A trim waits for the work queued before a free before it unmaps the block. */
  reader_t r2;
  void *c = block_read_later(64 * MiB, &r2);
  CHECK(cudaFree(c) == cudaSuccess, "free c");
  CHECK(emu_pending(NULL) == 1, "the free waited");
  size_t trimmed = shim_trim();
  CHECK(trimmed >= 64 * MiB, "trim gave back %zu bytes", trimmed);
  CHECK(r2.ran && r2.intact, "c was unmapped before the work reading it ran (ran %d, intact %d)", r2.ran, r2.intact);

  /* 3. The first launch on another stream waits for the legacy stream on the GPU. */
  reader_t r3;
  void *d = block_read_later(4 * MiB, &r3);
  CHECK(cudaFree(d) == cudaSuccess, "free d");
  void *e = NULL;
  CHECK(cudaMalloc(&e, 4 * MiB) == cudaSuccess && e == d, "d not reused at once (%p, %p)", d, e);
  cudaStream_t x; /* non-blocking: no implicit ordering with the legacy stream */
  CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking) == cudaSuccess, "stream");
  CHECK(launch_on((CUstream)x) == CUDA_SUCCESS, "launch on x");
  CHECK(!r3.ran && emu_pending(NULL) == 1, "the launch on another stream waited on the host");
  reader_t w3 = {e, 4 * MiB, 9, 0, 0};
  emu_launch((CUstream)x, work_write, &w3);
  emu_complete((CUstream)x, -1);
  CHECK(r3.ran && r3.intact, "the other stream's write overtook the legacy stream's reader");
  CHECK(w3.ran, "the write did not run");
  CHECK(cudaFree(e) == cudaSuccess, "free e");

  /* 4. From then on a deferred free waits for a synchronisation. */
  reader_t r4;
  void *f = block_read_later(4 * MiB, &r4);
  CHECK(cudaFree(f) == cudaSuccess, "free f");
  void *g = NULL;
  CHECK(cudaMalloc(&g, 4 * MiB) == cudaSuccess, "alloc g");
  CHECK(r4.ran || g != f, "two streams: f's range handed out while its reader was pending");
  emu_complete(NULL, -1);
  CHECK(r4.intact, "the reader of f saw other bytes");
  CHECK(cudaFree(g) == cudaSuccess && cudaStreamDestroy(x) == cudaSuccess, "free g, destroy x");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* n rounds of alloc 4 MiB / launch work on it / cudaFree; every `every` rounds the work
 * completes and the reclaimer gets time to catch up. */
static void churn(cudaStream_t s, int n, int every) {
  for (int i = 0; i < n; i++) {
    void *q = NULL;
    if (cudaMalloc(&q, 4 * MiB) != cudaSuccess) {
      CHECK(0, "alloc %d", i);
      break;
    }
    static work_t wk[1024];
    wk[i % 1024] = (work_t){q, 4096, pthread_self(), 0, 0};
    emu_launch((CUstream)s, work_fill, &wk[i % 1024]);
    cudaFree(q);
    if (i % every == every - 1) {
      emu_complete((CUstream)s, -1);
      wait_reclaimed(1.0);
    }
  }
  emu_complete((CUstream)s, -1);
}

static void scenario_deferred(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *warm = NULL;
  CHECK(cudaMalloc(&warm, 8 * MiB) == cudaSuccess, "warm");
  void *a = NULL;
  CHECK(cudaMalloc(&a, MiB) == cudaSuccess, "a");
  work_t w = {a, MiB, pthread_self(), 0, 0};
  emu_launch((CUstream)s, work_fill, &w);
  size_t f0 = 0, t0 = 0;
  CHECK(cudaMemGetInfo(&f0, &t0) == cudaSuccess, "meminfo");
  CHECK(cudaFree(a) == cudaSuccess, "cudaFree");
  int pending_after_free = emu_pending((CUstream)s);
  CHECK(!(w.ran && w.on_main), "cudaFree completed the work itself in deferred mode");
  printf("deferred: pending after free %d\n", pending_after_free);
  /* allocations while the work may still be pending never overlap a */
  int early = 0;
  void *b[16];
  for (int i = 0; i < 16; i++) {
    CHECK(cudaMalloc(&b[i], MiB) == cudaSuccess, "b");
    int ran = __atomic_load_n(&w.ran, __ATOMIC_ACQUIRE);
    if (!ran && overlaps((uintptr_t)b[i], MiB, (uintptr_t)a, MiB)) early++;
  }
  CHECK(early == 0, "a's range handed out while the work writing it was pending");
  for (int i = 0; i < 16; i++) CHECK(cudaFree(b[i]) == cudaSuccess, "free b");
  emu_complete((CUstream)s, -1);
  /* the reclaimer synchronises in the background: every deferred free becomes idle */
  CHECK(wait_reclaimed(1.0), "deferred frees not reclaimed within 1 s");
  size_t f1 = 0, t1 = 0;
  cudaMemGetInfo(&f1, &t1);
  CHECK(f1 == f0 + MiB, "free %zu -> %zu after freeing a (1 MiB) and 16 later blocks", f0, f1);
  /* the steady state reuses memory: once the work is done, mapped bytes stop growing */
  churn(s, 100, 100);
  CHECK(wait_reclaimed(1.0), "not reclaimed within 1 s");
  vmmshim_stats_t s0 = shim_stats();
  churn(s, 200, 10);
  vmmshim_stats_t s1 = shim_stats();
  printf("deferred: mapped %llu -> %llu MiB, syncs %llu\n", (unsigned long long)(s0.bytes_mapped >> 20),
         (unsigned long long)(s1.bytes_mapped >> 20), (unsigned long long)s1.syncs);
  CHECK(s1.bytes_mapped <= s0.bytes_mapped, "mapped bytes kept growing: %llu -> %llu",
        (unsigned long long)s0.bytes_mapped, (unsigned long long)s1.bytes_mapped);
  CHECK(s1.syncs > 0, "no synchronisations counted");
  CHECK(cudaFree(warm) == cudaSuccess, "free warm");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ gran2m */
static void scenario_gran2m(void) {
  enum { N = 120 };
  static uintptr_t p[N];
  static size_t n[N];
  unsigned long long rs = 99;
  int bad = 0, unmapped = 0;
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  for (int i = 0; i < N; i++) {
    n[i] = i % 4 == 0 ? (size_t)(rnd_next(&rs) % (9 * MiB)) + 1 : rnd_size(&rs, 3 * MiB);
    void *v = NULL;
    if (cudaMalloc(&v, n[i]) != cudaSuccess || (uintptr_t)v % 256) {
      bad++;
      p[i] = 0;
      continue;
    }
    p[i] = (uintptr_t)v;
    for (size_t off = 0; off < n[i]; off += 64 * 1024)
      if (emu_handle_info(p[i] + off, NULL, NULL, NULL) != 0) unmapped++;
    if (emu_handle_info(p[i] + n[i] - 1, NULL, NULL, NULL) != 0) unmapped++;
    if (!unmapped) pat_fill(v, n[i], (unsigned long long)i);
    if (i % 5 == 4) { /* free one now and then, so later blocks land in gaps */
      int j = (int)(rnd_next(&rs) % (unsigned)i);
      if (p[j]) {
        if (pat_check((void *)p[j], n[j], (unsigned long long)j) != (size_t)-1) bad++;
        cudaFree((void *)p[j]);
        p[j] = 0;
      }
    }
  }
  CHECK(bad == 0, "%d failed or corrupt", bad);
  CHECK(unmapped == 0, "%d unmapped pages inside blocks", unmapped);
  int corrupt = 0, ov = 0;
  for (int i = 0; i < N; i++)
    if (p[i] && pat_check((void *)p[i], n[i], (unsigned long long)i) != (size_t)-1) corrupt++;
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      if (p[i] && p[j] && overlaps(p[i], n[i], p[j], n[j])) ov++;
  CHECK(corrupt == 0, "%d blocks corrupt", corrupt);
  CHECK(ov == 0, "%d overlaps", ov);
  emu_counters_t e = emu_now();
  CHECK(e.live_mappings > 8, "with 2 MiB handles there should be many mappings (%ld)", e.live_mappings);
  vmmshim_stats_t s = shim_stats();
  CHECK(s.bytes_mapped % (2 * MiB) == 0 && s.bytes_mapped < 1024 * MiB, "mapped %llu",
        (unsigned long long)s.bytes_mapped);
  for (int i = 0; i < N; i++)
    if (p[i]) cudaFree((void *)p[i]);
  shim_trim();
  CHECK(emu_now().mapped_bytes == 0, "trim left %llu bytes mapped", emu_now().mapped_bytes);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ threshold */
/* VMMSHIM_RELEASE_THRESHOLD=0: idle whole handles go back to the device at the free. */
static void scenario_threshold(void) {
  void *a = NULL, *b = NULL;
  CHECK(cudaMalloc(&a, 200 * MiB) == cudaSuccess && cudaMalloc(&b, 4 * MiB) == cudaSuccess, "alloc");
  unsigned long long before = emu_now().mapped_bytes;
  CHECK(cudaFree(a) == cudaSuccess, "free");
  unsigned long long after = emu_now().mapped_bytes;
  CHECK(after + 128 * MiB <= before, "mapped %llu -> %llu: idle handles not released", before, after);
  CHECK(shim_stats().trims > 0, "no trims counted");
  pat_fill(b, 4 * MiB, 5);
  CHECK(pat_check(b, 4 * MiB, 5) == (size_t)-1, "live block damaged");
  CHECK(cudaFree(b) == cudaSuccess, "free b");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* VMMSHIM_MAX_HANDLE=4M: a large block is stitched from handles of at most 4 MiB, and a
 * block placed over several handles works. The default (unlimited) maps it as one. */
static void scenario_maxhandle(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  unsigned long long c0 = emu_now().n_cuMemCreate;
  void *a = NULL;
  CHECK(cudaMalloc(&a, 100 * MiB) == cudaSuccess, "alloc");
  unsigned long long made = emu_now().n_cuMemCreate - c0;
  const char *mh = getenv("VMMSHIM_MAX_HANDLE");
  if (mh) CHECK(made >= 25, "100 MiB with 4 MiB handles made %llu handles", made);
  else CHECK(made == 1, "100 MiB with unlimited handles made %llu handles", made);
  for (size_t off = 0; off < 100 * MiB; off += 2 * MiB)
    CHECK(emu_handle_info((CUdeviceptr)(uintptr_t)a + off, NULL, NULL, NULL) == 0, "unmapped at %zu", off);
  pat_fill(a, 100 * MiB, 9);
  CHECK(pat_check(a, 100 * MiB, 9) == (size_t)-1, "data");
  CHECK(cudaFree(a) == cudaSuccess, "free");
  shim_trim();
  CHECK(emu_now().mapped_bytes == 0, "trim left %llu bytes", emu_now().mapped_bytes);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* A growth maps the idle handles it unmaps again at its own address instead of releasing them
 * and creating new ones (handles.c, release_before_growth): 12 blocks of 24 MiB on 8 MiB
 * handles, every other one freed (144 MiB idle in pieces of 24 MiB), then 96 MiB. fail_map:
 * the first cuMemMap of that growth fails (the relocated handle must be released, and the
 * request still served). Either way no handle leaks and every live block keeps its data. */
static void scenario_relocate(bool fail_map) {
  bool bounded = getenv("VMMSHIM_MAX_HANDLE") != NULL;
  enum { N = 12 };
  const size_t size = 24 * MiB, big_size = 96 * MiB;
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  void *b[N], *big = NULL;
  for (int i = 0; i < N; i++) {
    CHECK(cudaMalloc(&b[i], size) == cudaSuccess, "alloc %d", i);
    pat_fill(b[i], size, (unsigned)i + 1);
  }
  for (int i = 1; i < N; i += 2) CHECK(cudaFree(b[i]) == cudaSuccess, "free %d", i);
  emu_counters_t c0 = emu_now();
  if (fail_map) emu_fail_next("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, 1);
  CHECK(cudaMalloc(&big, big_size) == cudaSuccess, "alloc %zu MiB", big_size >> 20);
  emu_clear_faults();
  emu_counters_t c1 = emu_now();
  unsigned long long maps = c1.n_cuMemMap - c0.n_cuMemMap, creates = c1.n_cuMemCreate - c0.n_cuMemCreate,
                     releases = c1.n_cuMemRelease - c0.n_cuMemRelease;
  printf("relocate%s: growth of %zu MiB: %llu maps, %llu creates, %llu releases\n", fail_map ? " (a map fails)" : "",
         big_size >> 20, maps, creates, releases);
  const char *st = getenv("VMMSHIM_STITCH");
  if (!bounded && !(st && !strcmp(st, "1"))) {
    /* Unlimited handles: the growth is one handle of its own size (72 MiB after the free
     * 24 MiB block it extends), the idle handles released as before. */
    CHECK(creates == 1 && maps == 1, "unlimited handles: %llu creates, %llu maps for one growth", creates, maps);
  } else if (!bounded) {
    /* The stitch: the idle handles (the growth steps the blocks were served from) are mapped
     * into the new range first, a new handle only for what they leave. */
    CHECK(creates <= 1 && maps >= 2 && maps <= creates + 8, "stitch: %llu creates, %llu maps for one growth", creates,
          maps);
  } else if (!fail_map) {
    /* 12 handles of 8 MiB cover 96 MiB: creating them all (the release-and-create way) would
     * make maps == creates. */
    CHECK(maps >= 12 && creates + 4 <= maps, "%llu maps but %llu creates: idle handles were not mapped again", maps,
          creates);
    /* The release-and-create way releases about 9 (the idle bytes beyond what is kept); here
     * only a spare that fits nowhere in the new range goes. */
    CHECK(releases <= 2, "%llu handles released although the growth could map them", releases);
  } else {
    CHECK(releases >= 1, "the handle whose map failed was not released");
  }
  pat_fill(big, big_size, 77);
  CHECK(pat_check(big, big_size, 77) == (size_t)-1, "data of the new block");
  for (int i = 0; i < N; i += 2) {
    CHECK(!overlaps((uintptr_t)big, big_size, (uintptr_t)b[i], size), "block %d overlaps the new one", i);
    CHECK(pat_check(b[i], size, (unsigned)i + 1) == (size_t)-1, "data of block %d", i);
  }
  CHECK(shim_stats().bytes_mapped == emu_now().mapped_bytes, "mapped: shim %llu, driver %llu",
        (unsigned long long)shim_stats().bytes_mapped, emu_now().mapped_bytes);
  CHECK(cudaFree(big) == cudaSuccess, "free");
  for (int i = 0; i < N; i += 2) CHECK(cudaFree(b[i]) == cudaSuccess, "free %d", i);
  shim_trim();
  emu_counters_t e = emu_now();
  CHECK(e.mapped_bytes == 0 && e.live_handles == 0, "after trim: %llu bytes mapped, %ld handles", e.mapped_bytes,
        e.live_handles);
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ limit */
static void scenario_limit(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  void *p[16];
  int n = 0;
  cudaError_t last = cudaSuccess;
  while (n < 16) {
    last = cudaMalloc(&p[n], 16 * MiB);
    if (last != cudaSuccess) break;
    n++;
  }
  cudaGetLastError();
  CHECK(last == cudaErrorMemoryAllocation, "allocation beyond the limit returned %d", (int)last);
  CHECK(n >= 2 && n <= 4, "%d blocks of 16 MiB under a 64 MiB limit", n);
  vmmshim_stats_t s = shim_stats();
  CHECK(s.bytes_mapped <= 64 * MiB, "mapped %llu over the limit", (unsigned long long)s.bytes_mapped);
  CHECK(s.alloc_failures >= 1, "failure not counted");
  CUdeviceptr d = 0;
  CHECK(cuMemAlloc(&d, 64 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc beyond the limit");
  void *q = NULL;
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
  CHECK(cudaMallocAsync(&q, 64 * MiB, st) == cudaErrorMemoryAllocation, "cudaMallocAsync beyond the limit");
  cudaGetLastError();
  size_t f = 0, t = 0;
  CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess, "meminfo");
  CHECK(t == 64 * MiB, "total %zu, want the 64 MiB limit", t);
  CHECK(f <= 64 * MiB, "free %zu above the limit", f);
  size_t cf = 0, ct = 0;
  CHECK(cuMemGetInfo(&cf, &ct) == CUDA_SUCCESS && ct == 64 * MiB && cf <= 64 * MiB, "cuMemGetInfo %zu/%zu", cf, ct);
  for (int i = 0; i < n; i++) CHECK(cudaFree(p[i]) == cudaSuccess, "free");
  CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && f == 64 * MiB, "free %zu with nothing allocated", f);
  void *big = NULL;
  CHECK(cudaMalloc(&big, 60 * MiB) == cudaSuccess, "60 MiB after freeing everything");
  if (big) {
    pat_fill_sparse(big, 60 * MiB, 5);
    CHECK(pat_check_sparse(big, 60 * MiB, 5) == (size_t)-1, "data");
    cudaFree(big);
  }
  CHECK(cudaStreamDestroy(st) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ oom */
static void scenario_oom(void) {
  emu_set_device_memory(0, 256 * MiB);
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  enum { M = 64 };
  void *p[M];
  int n = 0;
  cudaError_t last = cudaSuccess;
  while (n < M) {
    last = cudaMalloc(&p[n], 8 * MiB);
    if (last != cudaSuccess) break;
    pat_fill_sparse(p[n], 8 * MiB, (unsigned long long)n);
    n++;
  }
  cudaGetLastError();
  CHECK(last == cudaErrorMemoryAllocation, "cudaMalloc on a full device returned %d", (int)last);
  CHECK(n >= 24 && n <= 32, "%d blocks of 8 MiB on a 256 MiB device", n);
  CUdeviceptr d = 0;
  CHECK(cuMemAlloc(&d, 16 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc on a full device");
  int corrupt = 0;
  for (int i = 0; i < n; i++)
    if (pat_check_sparse(p[i], 8 * MiB, (unsigned long long)i) != (size_t)-1) corrupt++;
  CHECK(corrupt == 0, "%d blocks corrupt after failures", corrupt);
  for (int i = 0; i < n; i++) CHECK(cudaFree(p[i]) == cudaSuccess, "free");
  /* many small blocks spread over every handle, freed: only a release of idle handles
   * makes room for one large block */
  enum { S = 400 };
  static void *sm[S];
  int ns = 0;
  for (; ns < S; ns++)
    if (cudaMalloc(&sm[ns], 512 * 1024) != cudaSuccess) break;
  cudaGetLastError();
  for (int i = 0; i < ns; i++) cudaFree(sm[i]);
  void *big = NULL;
  cudaError_t r = cudaMalloc(&big, 200 * MiB);
  CHECK(r == cudaSuccess, "200 MiB on an idle 256 MiB device: %d (idle handles not released?)", (int)r);
  if (r == cudaSuccess) {
    pat_fill_sparse(big, 200 * MiB, 77);
    CHECK(pat_check_sparse(big, 200 * MiB, 77) == (size_t)-1, "data");
    CHECK(cudaFree(big) == cudaSuccess, "free");
  }
  cudaGetLastError();
  /* async: the failure code, then success after the pending frees complete */
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
  void *a = NULL, *b = NULL;
  CHECK(cudaMallocAsync(&a, 150 * MiB, st) == cudaSuccess, "150 MiB async");
  CHECK(cudaMallocAsync(&b, 150 * MiB, st) == cudaErrorMemoryAllocation, "second 150 MiB async");
  cudaGetLastError();
  CHECK(cudaFreeAsync(a, st) == cudaSuccess, "free async");
  CHECK(cudaMallocAsync(&b, 150 * MiB, st) == cudaSuccess, "150 MiB again on the same stream");
  CHECK(cudaFreeAsync(b, st) == cudaSuccess, "free");
  CHECK(cudaStreamSynchronize(st) == cudaSuccess, "sync");
  CHECK(cudaMalloc(&b, 200 * MiB) == cudaSuccess, "200 MiB after async frees");
  cudaFree(b);
  cudaGetLastError();
  CHECK(cudaStreamDestroy(st) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

/* ------------------------------------------------------------------ pass-through */
static void check_passthrough(const char *what) {
  emu_counters_t e0 = emu_now();
  vmmshim_stats_t s0 = shim_stats();
  void *p = NULL;
  CHECK(cudaMalloc(&p, 3 * MiB) == cudaSuccess && p, "%s: cudaMalloc", what);
  CUdeviceptr d = 0;
  CHECK(cuMemAlloc(&d, 5000) == CUDA_SUCCESS && d, "%s: cuMemAlloc", what);
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
  void *a = NULL;
  CHECK(cudaMallocAsync(&a, 5000, st) == cudaSuccess && a, "%s: cudaMallocAsync", what);
  emu_counters_t e1 = emu_now();
  CHECK(e1.n_cuMemAlloc == e0.n_cuMemAlloc + 2, "%s: cuMemAlloc calls +%llu, want 2", what,
        e1.n_cuMemAlloc - e0.n_cuMemAlloc);
  CHECK(e1.n_cuMemAllocAsync == e0.n_cuMemAllocAsync + 1, "%s: cuMemAllocAsync calls", what);
  CHECK(e1.n_cuMemCreate == 0 && e1.n_cuMemMap == 0 && e1.n_cuMemAddressReserve == 0, "%s: VMM calls made", what);
  if (p) {
    pat_fill(p, 3 * MiB, 1);
    CHECK(pat_check(p, 3 * MiB, 1) == (size_t)-1, "%s: data", what);
  }
  vmmshim_stats_t s1 = shim_stats();
  for (int i = 0; i < VMMSHIM_API_COUNT; i++)
    CHECK(s1.allocs[i] == s0.allocs[i], "%s: allocations counted as served (api %d)", what, i);
  CHECK(cudaFree(p) == cudaSuccess && cuMemFree(d) == CUDA_SUCCESS && cudaFreeAsync(a, st) == cudaSuccess,
        "%s: frees", what);
  CHECK(cudaStreamSynchronize(st) == cudaSuccess && cudaStreamDestroy(st) == cudaSuccess, "stream");
  CHECK(emu_now().live_plain == 0, "%s: plain allocations left", what);
  CHECK(cudaFree(p) == cudaErrorInvalidValue, "%s: double free", what);
  cudaGetLastError();
  CHECK(emu_violations() == 0, "%s: %d violations", what, emu_violations());
}

static void scenario_novmm(void) {
  emu_set_caps(0, 0, 0);
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  check_passthrough("no VMM");
  CHECK(shim_stats().passthrough_allocs >= 1, "passthrough_allocs not counted");
}

static void scenario_disable(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  CHECK(shim_active() == 0, "vmmshim_active() = %d with VMMSHIM_DISABLE=1", shim_active());
  check_passthrough("disabled");
}

static void scenario_nofd(void) {
  emu_set_caps(1, 0, 0);
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  void *p = NULL;
  CHECK(cudaMalloc(&p, MiB) == cudaSuccess, "alloc");
  unsigned long long types = 99;
  int rdma = 99;
  unsigned acc = 0;
  CHECK(emu_handle_info((CUdeviceptr)(uintptr_t)p, &types, &rdma, &acc) == 0, "mapped");
  CHECK(types == 0, "requestedHandleTypes %llu without POSIX fd support", types);
  CHECK(rdma == 0, "gpuDirectRDMACapable %d without RDMA support", rdma);
  CHECK(acc == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access %u", acc);
  CHECK(cudaFree(p) == cudaSuccess, "free");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

static void scenario_badgran(void) {
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  /* 64 MiB is the smallest request with a handle of its own at the default granularity. */
  void *p = NULL, *q = NULL;
  CHECK(cudaMalloc(&p, 64 * MiB) == cudaSuccess, "alloc 64 MiB");
  CHECK(cudaMalloc(&q, 64 * MiB - 2 * MiB) == cudaSuccess, "alloc 62 MiB");
  CHECK(shim_stats().bytes_mapped == 126 * MiB, "mapped %llu MiB, want 64 + 62", shim_stats().bytes_mapped / MiB);
  cudaFree(q);
  void *r = NULL;
  CHECK(cudaMalloc(&r, 60 * MiB) == cudaSuccess, "alloc 60 MiB");
  CHECK(r == q, "60 MiB split from the freed 62 MiB block: below the default granularity, shared handles");
  cudaFree(r);
  cudaFree(p);
}

/* Work that keeps the emulated GPU busy for 300 us (longer than VS_LAG_NS), as kernels do. */
static void work_slow(void *arg) {
  usleep(300);
  work_fill(arg);
}

static void scenario_deferred_bound(void) {
  enum { N = 24, ROUNDS = 600 };
  const size_t size = 40 * MiB; /* below the granularity (64 MiB) */
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *b[N];
  static work_t wk[N];
  for (int i = 0; i < N; i++) CHECK(cudaMalloc(&b[i], size) == cudaSuccess, "alloc %d", i);
  /* The GPU is first seen busy: one block freed behind 300 us of work, and the reclaimer's
   * sync that waits for it, measured. */
  {
    static work_t first;
    first = (work_t){b[0], 4096, pthread_self(), 0, 0};
    emu_launch((CUstream)s, work_slow, &first);
    void *extra;
    CHECK(cudaMalloc(&extra, size) == cudaSuccess, "alloc");
    CHECK(cudaFree(extra) == cudaSuccess, "free");
    CHECK(wait_reclaimed(10), "the reclaimer did not take the block back");
  }
  uint64_t peak = 0, syncs0 = shim_stats().syncs;
  int bad = 0;
  for (int i = 0; i < ROUNDS && !bad; i++) {
    int k = i % N;
    /* work on the block, queued and not completed: only a synchronisation ends it */
    wk[k] = (work_t){b[k], 4096, pthread_self(), 0, 0};
    emu_launch((CUstream)s, work_slow, &wk[k]);
    if (cudaFree(b[k]) != cudaSuccess || cudaMalloc(&b[k], size) != cudaSuccess) bad = i + 1;
    vmmshim_stats_t st = shim_stats();
    if (st.bytes_mapped > peak) peak = st.bytes_mapped;
  }
  CHECK(!bad, "free and allocate again failed in round %d", bad - 1);
  vmmshim_stats_t st = shim_stats();
  /* Until the reclaimer's first long sync is seen (VS_LAG_NS) the pool grows; from then on it
   * waits. Without the rule: 4036 MiB. */
  uint64_t in_use = st.bytes_in_use, bound = 2 * in_use;
  printf("deferred-bound: in use %llu MiB, peak mapped %llu MiB (bound %llu MiB), syncs %llu\n",
         (unsigned long long)(in_use >> 20), (unsigned long long)(peak >> 20), (unsigned long long)(bound >> 20),
         (unsigned long long)(st.syncs - syncs0));
  CHECK(in_use == (uint64_t)N * size, "in use %llu", (unsigned long long)in_use);
  CHECK(peak <= bound, "peak mapped %llu MiB past 2 x in use (%llu MiB)", (unsigned long long)(peak >> 20),
        (unsigned long long)(bound >> 20));
  emu_complete((CUstream)s, -1);
  for (int i = 0; i < N; i++) CHECK(cudaFree(b[i]) == cudaSuccess, "free");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

static void scenario_async_bound(void) {
  enum { N = 32, ROUNDS = 200 };
  cudaStream_t s, other;
  CHECK(cudaStreamCreate(&s) == cudaSuccess && cudaStreamCreate(&other) == cudaSuccess, "streams");
  /* Work queued on another stream that never completes during the scenario: waiting for the
   * request's own stream must not wait for it (a context sync would end it). */
  static work_t idle_work;
  static unsigned char sink[4096];
  idle_work = (work_t){sink, sizeof sink, pthread_self(), 0, 0};
  emu_launch((CUstream)other, work_fill, &idle_work);
  void *b[N];
  static work_t wk[N];
  uint64_t peak = 0, max_in_use = 0, syncs0 = shim_stats().syncs;
  int bad = 0;
  for (int r = 0; r < ROUNDS && !bad; r++) {
    /* 4-43 MiB, a size larger by 1 MiB each round (then back to 4): the stream's freed blocks,
     * pending, serve most of a round and run short by a few blocks. 1590 MiB mapped for
     * 1376 MiB in use when the pool grows instead of waiting (1462 when it waits). */
    size_t size = (size_t)(4 + r % 40) * MiB;
    for (int i = 0; i < N && !bad; i++) {
      if (cudaMallocAsync(&b[i], size, s) != cudaSuccess) bad = r + 1;
    }
    if (bad) break;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < i; j++)
        if (overlaps((uintptr_t)b[i], size, (uintptr_t)b[j], size)) bad = r + 1;
    for (int i = 0; i < N; i++) {
      wk[i] = (work_t){b[i], 4096, pthread_self(), 0, 0};
      emu_launch((CUstream)s, work_fill, &wk[i]);
    }
    vmmshim_stats_t st = shim_stats();
    if (st.bytes_mapped > peak) peak = st.bytes_mapped;
    if (st.bytes_in_use > max_in_use) max_in_use = st.bytes_in_use;
    for (int i = 0; i < N; i++)
      if (cudaFreeAsync(b[i], s) != cudaSuccess) bad = r + 1;
  }
  CHECK(!bad, "allocation, overlap or free failed in round %d", bad - 1);
  uint64_t bound = max_in_use + max_in_use / 10 + 64 * MiB;
  printf("async-bound: max in use %llu MiB, peak mapped %llu MiB (bound %llu MiB), syncs %llu\n",
         (unsigned long long)(max_in_use >> 20), (unsigned long long)(peak >> 20), (unsigned long long)(bound >> 20),
         (unsigned long long)(shim_stats().syncs - syncs0));
  CHECK(peak <= bound, "peak mapped %llu MiB past 1.1 x in use + 64 MiB (%llu MiB)", (unsigned long long)(peak >> 20),
        (unsigned long long)(bound >> 20));
  CHECK(emu_pending((CUstream)other) == 1, "the other stream's work was waited for (%d left)", emu_pending((CUstream)other));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  for (int i = 0; i < N; i++) CHECK(wk[i].ran, "work %d of the last round did not run", i);
  emu_complete((CUstream)other, -1);
  CHECK(cudaStreamDestroy(s) == cudaSuccess && cudaStreamDestroy(other) == cudaSuccess, "destroy");
  CHECK(emu_violations() == 0, "%d violations", emu_violations());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(60);
    if (!strcmp(sc, "deferred")) scenario_deferred();
    else if (!strcmp(sc, "deferred-bound")) scenario_deferred_bound();
    else if (!strcmp(sc, "one-stream")) scenario_one_stream(true);
    else if (!strcmp(sc, "one-stream-off")) scenario_one_stream(false);
    else if (!strcmp(sc, "one-stream-release")) scenario_one_stream_release();
    else if (!strcmp(sc, "one-stream-capture")) scenario_one_stream_capture();
    else if (!strcmp(sc, "one-stream-threads")) scenario_one_stream_threads();
    else if (!strcmp(sc, "one-stream-badstream")) scenario_one_stream_badstream();
    else if (!strcmp(sc, "one-stream-waitvalue")) scenario_one_stream_waitvalue();
    else if (!strcmp(sc, "async-bound")) scenario_async_bound();
    else if (!strcmp(sc, "gran2m")) scenario_gran2m();
    else if (!strcmp(sc, "limit")) scenario_limit();
    else if (!strcmp(sc, "oom")) scenario_oom();
    else if (!strcmp(sc, "novmm")) scenario_novmm();
    else if (!strcmp(sc, "disable")) scenario_disable();
    else if (!strcmp(sc, "nofd")) scenario_nofd();
    else if (!strcmp(sc, "badgran")) scenario_badgran();
    else if (!strcmp(sc, "threshold")) scenario_threshold();
    else if (!strcmp(sc, "maxhandle")) scenario_maxhandle();
    else if (!strcmp(sc, "relocate")) scenario_relocate(false);
    else if (!strcmp(sc, "relocate-fail")) scenario_relocate(true);
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  check_run_child("deferred", "VMMSHIM_FREE_MODE=deferred", NULL);
  check_run_child("deferred-bound", "VMMSHIM_FREE_MODE=deferred", NULL);
  check_run_child("one-stream", "VMMSHIM_FREE_MODE=deferred", NULL);
  check_run_child("one-stream-off", "VMMSHIM_FREE_MODE=deferred", "VMMSHIM_ONE_STREAM=0", NULL);
  check_run_child("one-stream-release", "VMMSHIM_FREE_MODE=deferred", "VMMSHIM_RELEASE_THRESHOLD=0", NULL);
  check_run_child("one-stream-capture", "VMMSHIM_FREE_MODE=deferred", NULL);
  check_run_child("one-stream-threads", "VMMSHIM_FREE_MODE=deferred", NULL);
  check_run_child("one-stream-badstream", "VMMSHIM_FREE_MODE=deferred", NULL);
  check_run_child("one-stream-waitvalue", "VMMSHIM_FREE_MODE=deferred", "WAIT_FORM=wait32", NULL);
  check_run_child("one-stream-waitvalue", "VMMSHIM_FREE_MODE=deferred", "WAIT_FORM=wait64", NULL);
  check_run_child("one-stream-waitvalue", "VMMSHIM_FREE_MODE=deferred", "WAIT_FORM=batch", NULL);
  check_run_child("one-stream-waitvalue", "VMMSHIM_FREE_MODE=deferred", "WAIT_FORM=wait32", "LAUNCH_FIRST=1", NULL);
  check_run_child("async-bound", NULL);
  check_run_child("gran2m", "VMMSHIM_GRANULARITY=2M", NULL);
  check_run_child("limit", "VMMSHIM_LIMIT=64M", NULL);
  check_run_child("threshold", "VMMSHIM_RELEASE_THRESHOLD=0", NULL);
  check_run_child("maxhandle", "VMMSHIM_MAX_HANDLE=4M", NULL);
  check_run_child("maxhandle", NULL);
  check_run_child("relocate", "VMMSHIM_MAX_HANDLE=8M", NULL);
  check_run_child("relocate-fail", "VMMSHIM_MAX_HANDLE=8M", NULL);
  check_run_child("relocate", NULL);
  check_run_child("relocate", "VMMSHIM_STITCH=1", NULL);
  check_run_child("oom", NULL);
  check_run_child("novmm", NULL);
  check_run_child("nofd", NULL);
  check_run_child("disable", "VMMSHIM_DISABLE=1", NULL);
  check_run_child("badgran", "VMMSHIM_GRANULARITY=12Q", NULL);
  CHECK(strstr(check_child_output, "VMMSHIM_GRANULARITY") && strstr(check_child_output, "12Q"),
        "no message naming VMMSHIM_GRANULARITY and its value 12Q");
  /* Not a multiple of the driver's 2 MiB: rounded up, with a message naming both. */
  check_run_child("maxhandle", "VMMSHIM_GRANULARITY=3M", NULL);
  CHECK(strstr(check_child_output, "VMMSHIM_GRANULARITY=3145728") && strstr(check_child_output, "4194304"),
        "no message for a granularity that is not a multiple of the minimum");
  return check_summary();
}
