/* sample_trace: the program behind examples/sample.trace (examples/make-sample-trace.sh runs it
 * under the shim on the host emulation of the driver, with tracing and stacks on).
 *
 * It allocates in two tags, "weights" (a few large blocks, kept) and "kv" (many blocks, some
 * freed), puts kv to sleep in host mode, allocates a little more of weights while kv sleeps,
 * waits (another program would use the GPU then), wakes kv, frees part of it and ends with some blocks still live: the trace then holds stacks,
 * tag names, a sleep, a wake, host mappings and leaks, all that vmmshim-report shows. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "vmmshim.h"

/* The shim's API, found at run time in the preloaded library (the program does not link it). */
#pragma weak vmmshim_set_tag
#pragma weak vmmshim_sleep
#pragma weak vmmshim_wake

#define MiB (1ull << 20)

static int fail(const char *what, int rc) {
  fprintf(stderr, "sample_trace: %s failed (%d)\n", what, rc);
  return 1;
}

/* Two functions of their own, so that the stacks of the two tags differ. */
static int load_weights(void **w, int n, size_t size) {
  for (int i = 0; i < n; i++)
    if (cudaMalloc(&w[i], size) != cudaSuccess) return fail("cudaMalloc (weights)", i);
  return 0;
}

static int grow_cache(void **kv, int n, size_t size) {
  for (int i = 0; i < n; i++)
    if (cudaMalloc(&kv[i], size + (size_t)i * 4096) != cudaSuccess) return fail("cudaMalloc (kv)", i);
  return 0;
}

int main(void) {
  if (!vmmshim_set_tag || !vmmshim_sleep || !vmmshim_wake) {
    fprintf(stderr, "sample_trace: run it under LD_PRELOAD=libvmmshim.so\n");
    return 1;
  }
  void *w[4], *kv[12], *late = NULL;
  vmmshim_sleep_result_t r;
  if (vmmshim_set_tag("weights") || load_weights(w, 4, 24 * MiB)) return fail("weights", 0);
  if (vmmshim_set_tag("kv") || grow_cache(kv, 12, 2 * MiB)) return fail("kv", 0);
  for (int i = 0; i < 12; i += 3) cudaFree(kv[i]); /* a cache churns: some blocks go early */
  int rc = vmmshim_sleep("kv", VMMSHIM_SLEEP_HOST, &r, sizeof r);
  if (rc) return fail("vmmshim_sleep", rc);
  if (vmmshim_set_tag("weights") || cudaMalloc(&late, 8 * MiB) != cudaSuccess) return fail("weights while asleep", 0);
  nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  rc = vmmshim_wake("kv", 0, &r, sizeof r);
  if (rc) return fail("vmmshim_wake", rc);
  for (int i = 1; i < 12; i += 3) cudaFree(kv[i]);
  cudaFree(w[3]);
  cudaFree(late);
  /* w[0..2] and the rest of kv stay live: the report lists them as leaks. */
  return 0;
}
