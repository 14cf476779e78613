/* (s) A stitched block on the GPU (VMMSHIM_STITCH, docs/design.md "Stitching"). Two 64 MiB
 * blocks (a handle each), the first freed: an idle handle the pool keeps. Then 96 MiB, which fits
 * no free block: with VMMSHIM_STITCH=1 it is served by that handle and a new 32 MiB one mapped
 * side by side (160 MiB mapped), without it by a new 96 MiB handle (224 MiB). A kernel fills the
 * whole block and another verifies it, across the two handles; cudaMemset and cudaMemcpy over
 * it; the live neighbour's bytes stay intact; cudaPointerGetAttributes and cuMemGetAddressRange
 * on both halves are printed (INFO); the block is freed and everything trimmed. Run by
 * tests/gpu/run.sh with and without VMMSHIM_STITCH=1 (STITCH_EXPECT=1 / 0 says which). */
#include <vector>

#include "gpu_test.cuh"

static const size_t MiB = 1ull << 20;

int main() {
  g_prog = "stitch";
  const char *ex = getenv("STITCH_EXPECT");
  bool expect = ex && !strcmp(ex, "1");
  CK(cudaFree(0));
  vmmshim_stats_t s0, s1;
  bool shim = shim_stats(&s0);
  check(shim, "shim-loaded", "vmmshim_get_stats not found: the shim is not preloaded");
  if (!shim) return finish();
  unsigned long long *d_errs;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));
  void *a = NULL, *b = NULL, *c = NULL;
  CK(cudaMalloc(&a, 64 * MiB));
  CK(cudaMalloc(&b, 64 * MiB));
  fill(b, 64 * MiB, 11, 0);
  CK(cudaFree(a));
  shim_stats(&s0);
  CK(cudaMalloc(&c, 96 * MiB));
  shim_stats(&s1);
  long long grew = (long long)s1.bytes_mapped - (long long)s0.bytes_mapped;
  printf("INFO stitch: expect %d, mapped %llu -> %llu MiB (grew %lld MiB), a=%p b=%p c=%p\n", expect,
         (unsigned long long)(s0.bytes_mapped / MiB), (unsigned long long)(s1.bytes_mapped / MiB), grew / (long long)MiB,
         a, b, c);
  if (expect)
    check(grew == 32 * (long long)MiB, "stitched", "the 96 MiB block grew the pool by %lld MiB, not 32",
          grew / (long long)MiB);
  else
    check(grew == 96 * (long long)MiB, "not-stitched", "the 96 MiB block grew the pool by %lld MiB, not 96",
          grew / (long long)MiB);
  check(is_vmm(c), "vmm", "the block is not VMM memory");

  fill(c, 96 * MiB, 7, 0);
  CK(cudaDeviceSynchronize());
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(c, 96 * MiB, 7, d_errs, 0);
  unsigned long long e = 0;
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  check(e == 0, "kernel-bytes", "%llu words wrong after a kernel filled the block across its handles", e);
  CK(cudaMemset(d_errs, 0, sizeof *d_errs));
  verify(b, 64 * MiB, 11, d_errs, 0);
  CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
  check(e == 0, "neighbour-bytes", "%llu words of the live 64 MiB block changed", e);

  /* cudaMemset and cudaMemcpy across the handle boundary (64 MiB into the block when stitched). */
  std::vector<unsigned char> host(8 * MiB, 0);
  char *mid = (char *)c + 60 * MiB;
  CK(cudaMemset(mid, 0x5a, 8 * MiB));
  CK(cudaMemcpy(host.data(), mid, 8 * MiB, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < host.size(); i++) bad += host[i] != 0x5a;
  check(bad == 0, "memset-memcpy", "%zu bytes wrong over the boundary", bad);

  for (int half = 0; half < 2; half++) {
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)((char *)c + (half ? 80 * MiB : 0)), base = 0;
    size_t len = 0;
    CUresult r = cuMemGetAddressRange(&base, &len, p);
    cudaPointerAttributes at;
    cudaError_t ae = cudaPointerGetAttributes(&at, (void *)(uintptr_t)p);
    printf("INFO stitch: %s half: cuMemGetAddressRange %d base %#llx len %zu MiB; cudaPointerGetAttributes %s type %d\n",
           half ? "second" : "first", (int)r, (unsigned long long)base, len / MiB, cudaGetErrorName(ae),
           ae == cudaSuccess ? (int)at.type : -1);
    check(r == CUDA_SUCCESS && base == (CUdeviceptr)(uintptr_t)c && len >= 96 * MiB, half ? "range-second" : "range-first",
          "cuMemGetAddressRange gave %d, base %#llx, %zu bytes", (int)r, (unsigned long long)base, len);
  }

  CK(cudaFree(c));
  CK(cudaFree(b));
  CK(cudaFree(d_errs));
  size_t (*trim)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "vmmshim_trim");
  size_t given = trim ? trim() : 0;
  shim_stats(&s1);
  printf("INFO stitch: trim gave back %zu MiB, %llu MiB still mapped\n", given / MiB,
         (unsigned long long)(s1.bytes_mapped / MiB));
  check(trim && s1.bytes_mapped < 64 * MiB, "trim", "%llu MiB still mapped after the trim",
        (unsigned long long)(s1.bytes_mapped / MiB));
  return finish();
}
