/* test_shim_threads: 8 threads x 20000 mixed operations under the shim: cudaMalloc /
 * cudaFree and cudaMallocAsync / cudaFreeAsync on per-thread streams (and the per-thread
 * default stream), sizes 1 B .. 4 MiB. Every block carries a thread- and block-specific
 * pattern checked before its free. No corruption, no overlap with the thread's own live
 * blocks, no deadlock (alarm), no contract violation; after everything is freed,
 * vmmshim_trim() gives every mapping back. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define NTHREADS 8
#define NOPS 20000
#define MAXLIVE 24

typedef struct {
  void *p;
  size_t n;
  unsigned long long seed;
  int kind; /* 0 sync, 1 stream, 2 per-thread default stream */
} live_t;

typedef struct {
  int id;
  int errors, corrupt, misaligned;
} targ_t;

static void *worker(void *arg) {
  targ_t *t = arg;
  unsigned long long rs = 0x1234567ull * (unsigned long long)(t->id + 1);
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    t->errors++;
    return NULL;
  }
  live_t live[MAXLIVE];
  int nlive = 0;
  unsigned long long serial = 0;
  for (int op = 0; op < NOPS; op++) {
    int do_alloc = nlive == 0 || (nlive < MAXLIVE && (rnd_next(&rs) & 1));
    if (do_alloc) {
      live_t *b = &live[nlive];
      b->n = rnd_size(&rs, 4u << 20);
      b->kind = (int)(rnd_next(&rs) % 3);
      b->seed = ((unsigned long long)t->id << 40) | ++serial;
      b->p = NULL;
      cudaError_t r = b->kind == 0 ? cudaMalloc(&b->p, b->n)
                      : b->kind == 1 ? cudaMallocAsync(&b->p, b->n, s)
                                     : cudaMallocAsync_ptsz(&b->p, b->n, 0);
      if (r != cudaSuccess || !b->p) {
        t->errors++;
        continue;
      }
      if ((uintptr_t)b->p % 256) t->misaligned++;
      pat_fill_sparse(b->p, b->n, b->seed);
      nlive++;
    } else {
      int i = (int)(rnd_next(&rs) % (unsigned)nlive);
      live_t b = live[i];
      live[i] = live[--nlive];
      if (pat_check_sparse(b.p, b.n, b.seed) != (size_t)-1) t->corrupt++;
      cudaError_t r = b.kind == 0 ? cudaFree(b.p) : b.kind == 1 ? cudaFreeAsync(b.p, s) : cudaFreeAsync_ptsz(b.p, 0);
      if (r != cudaSuccess) t->errors++;
    }
  }
  while (nlive) {
    live_t b = live[--nlive];
    if (pat_check_sparse(b.p, b.n, b.seed) != (size_t)-1) t->corrupt++;
    if ((b.kind == 0 ? cudaFree(b.p) : b.kind == 1 ? cudaFreeAsync(b.p, s) : cudaFreeAsync_ptsz(b.p, 0)) != cudaSuccess)
      t->errors++;
  }
  if (cudaStreamSynchronize(s) != cudaSuccess || cudaStreamSynchronize_ptsz(0) != cudaSuccess) t->errors++;
  if (cudaStreamDestroy(s) != cudaSuccess) t->errors++;
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(60);
  CHECK(cudaSetDevice(0) == cudaSuccess, "init");
  emu_counters_t e0 = emu_now();
  pthread_t th[NTHREADS];
  targ_t args[NTHREADS];
  double t0 = now_s();
  for (int i = 0; i < NTHREADS; i++) {
    args[i] = (targ_t){i, 0, 0, 0};
    CHECK(pthread_create(&th[i], NULL, worker, &args[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  printf("threads: %d x %d operations in %.2f s\n", NTHREADS, NOPS, now_s() - t0);
  for (int i = 0; i < NTHREADS; i++) {
    CHECK(args[i].errors == 0, "thread %d: %d failed calls", i, args[i].errors);
    CHECK(args[i].corrupt == 0, "thread %d: %d corrupted blocks", i, args[i].corrupt);
    CHECK(args[i].misaligned == 0, "thread %d: %d misaligned blocks", i, args[i].misaligned);
  }
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  vmmshim_stats_t s = shim_stats();
  CHECK(s.bytes_in_use == 0, "%llu bytes still in use", (unsigned long long)s.bytes_in_use);
  /* one stream-ordered free whose work is done on the device but that the pool has not
   * seen complete: vmmshim_trim waits for pending frees (vmmshim.h), so it goes too */
  cudaStream_t ts;
  void *x = NULL;
  CHECK(cudaStreamCreate(&ts) == cudaSuccess, "stream");
  CHECK(cudaMallocAsync(&x, 1 << 20, ts) == cudaSuccess, "alloc");
  CHECK(cudaFreeAsync(x, ts) == cudaSuccess, "free");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
  size_t released = shim_trim();
  emu_counters_t e1 = emu_now();
  printf("threads: trim released %zu bytes; emulation mapped %llu bytes (%ld mappings), %ld handles\n", released,
         e1.mapped_bytes, e1.live_mappings, e1.live_handles);
  CHECK(e1.mapped_bytes == e0.mapped_bytes, "vmmshim_trim left %llu bytes mapped (before: %llu)", e1.mapped_bytes,
        e0.mapped_bytes);
  CHECK(e1.live_handles == e0.live_handles, "%ld handles alive after trim", e1.live_handles);
  CHECK(shim_stats().bytes_mapped == 0, "stats: %llu bytes mapped after trim",
        (unsigned long long)shim_stats().bytes_mapped);
  /* still usable */
  void *p = NULL;
  CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess, "alloc after trim");
  if (p) {
    pat_fill(p, 1 << 20, 1);
    CHECK(pat_check(p, 1 << 20, 1) == (size_t)-1, "data after trim");
    cudaFree(p);
  }
  CHECK(cudaStreamDestroy(ts) == cudaSuccess, "destroy");
  return check_summary();
}
