/* test_shim_reuse: stream-ordered reuse never hands out or unmaps memory that queued work
 * still touches. Four threads, each on its own stream, allocate blocks of 256 B .. 16 MiB
 * with cudaMallocAsync, queue work on the stream that fills each block and later checks the
 * fill (run by the emulation only when the stream's work completes), then cudaFreeAsync the
 * blocks at once and allocate again, while the streams complete their work at random
 * moments. A block (or a piece of one) reused by another stream before its work ran shows
 * as a wrong fill; one unmapped before its work ran crashes the work item. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define NTHREADS 4
#define ROUNDS 1000

typedef struct {
  unsigned char *p;
  size_t n;
  unsigned char v;
} work_t;

static atomic_long g_bad, g_checked, g_alloc_fail;

static void work_fill(void *a) {
  work_t *w = a;
  memset(w->p, w->v, w->n);
  free(w);
}

static void work_check(void *a) {
  work_t *w = a;
  for (size_t i = 0; i < w->n; i += 61)
    if (w->p[i] != w->v) {
      atomic_fetch_add(&g_bad, 1);
      break;
    }
  atomic_fetch_add(&g_checked, 1);
  free(w);
}

static void *run(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int it = 0; it < ROUNDS; it++) {
    void *p[4];
    for (int k = 0; k < 4; k++) {
      r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
      uint64_t x = r * 0x2545F4914F6CDD1Dull;
      size_t n = ((size_t)256 << (x % 17)) + (x >> 20) % 1000;
      if (cudaMallocAsync(&p[k], n, s) != cudaSuccess) {
        atomic_fetch_add(&g_alloc_fail, 1);
        p[k] = NULL;
        continue;
      }
      work_t *w = malloc(sizeof *w), *c = malloc(sizeof *c);
      *w = (work_t){p[k], n, (unsigned char)(id * 61 + it * 7 + k + 1)};
      *c = *w;
      emu_launch((CUstream)s, work_fill, w);
      emu_launch((CUstream)s, work_check, c);
    }
    for (int k = 0; k < 4; k++)
      if (p[k]) cudaFreeAsync(p[k], s);
    if (r % 3 == 0) emu_complete((CUstream)s, (int)(r % 7)); /* the stream makes some progress */
  }
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(240);
  CHECK(cudaFree(NULL) == cudaSuccess, "init");
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) pthread_create(&t[i], NULL, run, (void *)(intptr_t)i);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  emu_complete_all();
  CHECK(atomic_load(&g_alloc_fail) == 0, "%ld allocations failed", (long)atomic_load(&g_alloc_fail));
  CHECK(atomic_load(&g_checked) == NTHREADS * ROUNDS * 4, "%ld of %d fills checked", (long)atomic_load(&g_checked),
        NTHREADS * ROUNDS * 4);
  CHECK(atomic_load(&g_bad) == 0, "%ld blocks reused before their stream's work ran", (long)atomic_load(&g_bad));
  CHECK(shim_stats().allocs[VMMSHIM_API_RUNTIME_ASYNC] >= NTHREADS * ROUNDS * 4, "served by the shim");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
  return check_summary();
}
