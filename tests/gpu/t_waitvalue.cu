/* Deferred mode with all work on one stream (VMMSHIM_FREE_MODE=deferred), then a wait on that
 * stream for a value another stream writes later (cuStreamWaitValue32): the shim must end the
 * one-stream order before the wait is queued. Were it still on, the other stream's first
 * submission would wait on the GPU for all of the legacy stream's work, the wait included, and
 * neither stream would ever go on. Checked: the write on the other stream completes (the flag
 * lives in mapped host memory, so that the host can release a deadlock after the check failed),
 * and a block freed behind the wait is not handed out again while its reader waits there. */
#include "gpu_test.cuh"

__global__ void k_read(const uint32_t *p, size_t words, uint32_t seed, unsigned long long *errs) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long bad = 0;
  for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
    bad += p[w] != pattern_word(seed, w);
  if (bad) atomicAdd(errs, bad);
}

int main(void) {
  g_prog = "waitvalue";
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

  /* A block written on the one stream, the wait, and a reader of the block behind the wait. */
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

  /* The value, written by another stream. */
  cudaStream_t x;
  CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  r = cuStreamWriteValue32((CUstream)x, (CUdeviceptr)d_flag, 1, 0);
  check(r == CUDA_SUCCESS, "waitvalue-write-queued", "cuStreamWriteValue32: %d", (int)r);
  double t0 = now_ms();
  cudaError_t q;
  while ((q = cudaStreamQuery(x)) == cudaErrorNotReady && now_ms() - t0 < 5000) {
  }
  check(q == cudaSuccess, "waitvalue-no-deadlock", "the write on the other stream did not complete in 5 s (%s)",
        cudaGetErrorName(q));
  if (q != cudaSuccess) *flag = 1; /* let the legacy stream go */
  CK(cudaDeviceSynchronize());
  unsigned long long e = 0;
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  check(e == 0, "waitvalue-reader-intact", "the reader behind the wait saw %llu words of a later owner's", e);
  CK(cudaFree(d));
  CK(cudaStreamDestroy(x));
  CK(cudaFreeHost((void *)flag));
  CK(cudaFree(d_errs));
  return finish();
}
