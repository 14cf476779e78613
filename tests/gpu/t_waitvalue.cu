/* Deferred mode with all work on one stream (VMMSHIM_FREE_MODE=deferred), then a wait on that
 * stream for a value another stream writes later (cuStreamWaitValue32): the shim must end the
 * one-stream order before the wait is queued. Were it still on, the other stream's first
 * submission would wait on the GPU for all of the legacy stream's work, the wait included, and
 * neither stream would ever go on. The flag lives in mapped host memory, so that the host can
 * release a stuck wait.
 *
 * CUDA does not promise that a stream runs on while another waits for a value (the driver's
 * documentation warns that its scheduler may serialise them). On an H100 (driver 580.159.04) the
 * first write on a non-blocking stream stays queued while the legacy stream waits for a value
 * with a kernel behind the wait, without the shim too, and with VMMSHIM_ONE_STREAM=0; a second
 * write, once the stream has run, goes through. So the GPU cannot tell a deadlock the shim made
 * from its own scheduling: whether the write completed is an INFO line, for both phases (the
 * order on at the wait, then the same sequence with the order off), not a check. The order's
 * part is checked on the emulation (test_shim_env, one-stream-waitvalue), which runs streams
 * independently and names a wait that nothing can end. Checked here: the calls are queued, a
 * block freed behind the wait is not handed out again while its reader waits there, and the
 * reader sees its bytes intact. */
#include <stdlib.h>

#include "gpu_test.cuh"

__global__ void k_read(const uint32_t *p, size_t words, uint32_t seed, unsigned long long *errs) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long bad = 0;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    bad += p[w] != pattern_word(seed, w);
  if (bad) atomicAdd(errs, bad);
}

/* Queues the write of v on x, polls x for up to 5 s, then releases the legacy stream's wait from
 * the host whatever happened (so that the next phase starts clean). Returns whether the write
 * completed; prints what the host saw. */
static bool write_completes(const char *phase, cudaStream_t x, volatile uint32_t *flag, uint32_t *d_flag,
                            uint32_t v) {
  CUresult r = cuStreamWriteValue32((CUstream)x, (CUdeviceptr)d_flag, v, 0);
  check(r == CUDA_SUCCESS, v == 1 ? "waitvalue-write-queued" : "waitvalue-control-write-queued",
        "cuStreamWriteValue32: %d", (int)r);
  double t0 = now_ms();
  cudaError_t q;
  while ((q = cudaStreamQuery(x)) == cudaErrorNotReady && now_ms() - t0 < 5000) {
  }
  double ms = now_ms() - t0;
  uint32_t seen = *flag;
  cudaError_t legacy = cudaStreamQuery(0);
  printf("INFO waitvalue: %s: write on x %s after %.1f ms (%s); flag %u (want %u); legacy stream %s\n", phase,
         q == cudaSuccess ? "completed" : "not completed", ms, cudaGetErrorName(q), seen, v,
         cudaGetErrorName(legacy));
  if (q != cudaSuccess) *flag = v; /* let the legacy stream go */
  CK(cudaDeviceSynchronize());
  return q == cudaSuccess;
}

int main(void) {
  g_prog = "waitvalue";
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0); /* read as the context is made: before cudaFree(0) */
  printf("INFO waitvalue: CUDA_DEVICE_MAX_CONNECTIONS=%s\n", getenv("CUDA_DEVICE_MAX_CONNECTIONS"));
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  const size_t size = 4ull << 20;
  unsigned long long *d_errs;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));
  CK(cudaMemset(d_errs, 0, sizeof *d_errs)); /* on the legacy stream: it becomes the one stream */
  volatile uint32_t *flag = NULL;
  CK(cudaHostAlloc((void **)&flag, sizeof *flag, cudaHostAllocMapped));
  *flag = 0;
  uint32_t *d_flag = NULL;
  CK(cudaHostGetDevicePointer((void **)&d_flag, (void *)flag, 0));

  /* 1. With the order on: a block written on the one stream, the wait, and a reader of the block
   * behind the wait; the value, written by another stream. */
  /* x is made before the wait (making a stream is no submission: the order stays on). */
  cudaStream_t x;
  CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  void *c = NULL;
  CK(cudaMalloc(&c, size));
  fill(c, size, 0x7777u, 0);
  CUresult r = cuStreamWaitValue32(CU_STREAM_LEGACY, (CUdeviceptr)d_flag, 1, CU_STREAM_WAIT_VALUE_EQ);
  check(r == CUDA_SUCCESS, "waitvalue-queued", "cuStreamWaitValue32: %d", (int)r);
  k_read<<<sm_count(), 256, 0, 0>>>((const uint32_t *)c, size / 4, 0x7777u, d_errs);
  CK(cudaGetLastError());
  CK(cudaFree(c));
  void *d = NULL;
  CK(cudaMalloc(&d, size));
  check(d != c || cudaStreamQuery(0) == cudaSuccess, "waitvalue-free-behind-wait-not-reused",
        "%p handed out again while its reader waits behind the wait", c);
  bool first = write_completes("order on at the wait", x, flag, d_flag, 1);
  unsigned long long e = 0;
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  check(e == 0, "waitvalue-reader-intact", "the reader behind the wait saw %llu words of a later owner's", e);

  /* 2. The control: the order is off now, so neither stream gets anything from the shim; the
   * same work as in 1 (a reader queued behind the wait), since the GPU itself may hold another
   * stream's work behind a wait with a kernel queued after it (seen on an H100 without the shim). */
  fill(d, size, 0x8888u, 0);
  r = cuStreamWaitValue32(CU_STREAM_LEGACY, (CUdeviceptr)d_flag, 2, CU_STREAM_WAIT_VALUE_EQ);
  check(r == CUDA_SUCCESS, "waitvalue-control-queued", "cuStreamWaitValue32: %d", (int)r);
  k_read<<<sm_count(), 256, 0, 0>>>((const uint32_t *)d, size / 4, 0x8888u, d_errs);
  CK(cudaGetLastError());
  bool control = r == CUDA_SUCCESS && write_completes("control, order off", x, flag, d_flag, 2);
  printf("INFO waitvalue: the write on x completed with the order on at the wait: %s; with it off: %s "
         "(not judged: the GPU may hold a stream's work behind another's wait)\n",
         first ? "yes" : "no", control ? "yes" : "no");
  CK(cudaFree(d));
  CK(cudaStreamDestroy(x));
  CK(cudaFreeHost((void *)flag));
  CK(cudaFree(d_errs));
  return finish();
}
