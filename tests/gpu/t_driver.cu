/* (e) Driver API: cuMemAlloc/cuMemFree and cuMemAllocAsync/cuMemFreeAsync on the primary
 * context, data through cuMemsetD32 and cuMemcpyDtoH only (no runtime call after setup).
 * Checks: pointers are VMM; cuMemGetAddressRange on an interior pointer returns the block's
 * base and size; cuMemGetInfo's free memory grows by the freed block (the pool's idle bytes
 * count as free) after a cuMemFree; the shim counted driver allocations. */
#include <vector>

#include "gpu_test.cuh"

static bool fill_check_d32(CUdeviceptr p, size_t bytes, unsigned v, CUstream s) {
  size_t words = bytes / 4;
  if (s)
    CKD(cuMemsetD32Async(p, v, words, s));
  else
    CKD(cuMemsetD32(p, v, words));
  if (s) CKD(cuStreamSynchronize(s));
  /* Read back the first, a middle and the last 64 KiB. */
  std::vector<unsigned> h(16384);
  size_t chunk = h.size() * 4 < bytes ? h.size() * 4 : words * 4;
  size_t offs[3] = {0, (bytes / 2) & ~(size_t)3, words * 4 - chunk};
  for (int k = 0; k < 3; k++) {
    size_t o = offs[k] + chunk <= words * 4 ? offs[k] : 0;
    CKD(cuMemcpyDtoH(h.data(), p + o, chunk));
    for (size_t i = 0; i < chunk / 4; i++)
      if (h[i] != v) return false;
  }
  return true;
}

int main(void) {
  g_prog = "driver";
  CKD(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CKD(cuDeviceGet(&dev, 0));
  CKD(cuDevicePrimaryCtxRetain(&ctx, dev));
  CKD(cuCtxSetCurrent(ctx));
  if (!require_shim()) return finish();
  vmmshim_stats_t s0, s1;
  shim_stats(&s0);

  /* cuMemAlloc / cuMemFree, several sizes. */
  const size_t sizes[] = {256, 4000, 1 << 20, (64u << 20) - 4096, (64u << 20) + 4096, 200u << 20};
  const int NSZ = (int)(sizeof sizes / sizeof sizes[0]);
  CUdeviceptr p[NSZ];
  int vmm = 0, data_ok = 0, range_ok = 0;
  for (int i = 0; i < NSZ; i++) {
    CKD(cuMemAlloc(&p[i], sizes[i]));
    vmm += is_vmm((void *)p[i]);
    data_ok += fill_check_d32(p[i], sizes[i], 0xA5A50000u + i, 0);
    CUdeviceptr base = 0;
    size_t rsize = 0;
    size_t off = sizes[i] / 2 + 3;
    CKD(cuMemGetAddressRange(&base, &rsize, p[i] + off));
    bool ok = base == p[i] && rsize >= sizes[i] && rsize <= sizes[i] + sizes[i] / 8 + (2u << 20);
    if (!ok)
      printf("INFO driver: cuMemGetAddressRange(%#llx + %zu) = base %#llx size %zu; block %#llx size %zu\n",
             (unsigned long long)p[i], off, (unsigned long long)base, rsize, (unsigned long long)p[i], sizes[i]);
    range_ok += ok;
  }
  check(vmm == NSZ, "cuMemAlloc-is-vmm", "%d of %d cuMemAlloc pointers are VMM", vmm, NSZ);
  check(data_ok == NSZ, "cuMemAlloc-data", "%d of %d blocks read back the value written", data_ok, NSZ);
  check(range_ok == NSZ, "cuMemGetAddressRange-interior", "%d of %d interior lookups returned the block", range_ok,
        NSZ);
  /* The base pointer itself too, and the last byte. */
  {
    CUdeviceptr base = 0;
    size_t rsize = 0;
    CKD(cuMemGetAddressRange(&base, &rsize, p[3] + sizes[3] - 1));
    check(base == p[3] && rsize >= sizes[3], "cuMemGetAddressRange-last-byte", "base %#llx size %zu",
          (unsigned long long)base, rsize);
  }
  for (int i = 0; i < NSZ; i++) CKD(cuMemFree(p[i]));

  /* cuMemGetInfo: after freeing a 512 MiB block, free memory grows by about its size. */
  {
    const size_t big = 512u << 20;
    CUdeviceptr b;
    size_t f1, t1, f2, t2;
    CKD(cuMemAlloc(&b, big));
    CKD(cuMemsetD32(b, 1, big / 4));
    CKD(cuCtxSynchronize());
    CKD(cuMemGetInfo(&f1, &t1));
    CKD(cuMemFree(b));
    CKD(cuMemGetInfo(&f2, &t2));
    long long grew = (long long)f2 - (long long)f1;
    printf("INFO driver: cuMemGetInfo free %zu -> %zu (grew %lld), total %zu\n", f1, f2, grew, t2);
    check(grew >= (long long)big - (4ll << 20) && f2 <= t2, "cuMemGetInfo-free-grows",
          "free grew by %lld bytes after freeing %zu (free %zu, total %zu)", grew, big, f2, t2);
    /* And shrinks again when the block is taken back. */
    CKD(cuMemAlloc(&b, big));
    size_t f3, t3;
    CKD(cuMemGetInfo(&f3, &t3));
    check(f3 + big / 2 <= f2, "cuMemGetInfo-free-shrinks", "free %zu after allocating again (was %zu)", f3, f2);
    CKD(cuMemFree(b));
  }

  /* cuMemAllocAsync / cuMemFreeAsync on a stream. */
  {
    CUstream s;
    CKD(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int ok = 0, avmm = 0;
    const int N = 40;
    for (int i = 0; i < N; i++) {
      CUdeviceptr q;
      size_t n = (size_t)4096 << (i % 13);
      CKD(cuMemAllocAsync(&q, n, s));
      avmm += is_vmm((void *)q);
      ok += fill_check_d32(q, n, 0x5A000000u + i, s);
      CKD(cuMemFreeAsync(q, s));
    }
    CKD(cuStreamSynchronize(s));
    check(avmm == N, "cuMemAllocAsync-is-vmm", "%d of %d are VMM", avmm, N);
    check(ok == N, "cuMemAllocAsync-data", "%d of %d read back the value written", ok, N);
    CKD(cuStreamDestroy(s));
  }

  shim_stats(&s1);
  uint64_t drv = s1.allocs[VMMSHIM_API_DRIVER] - s0.allocs[VMMSHIM_API_DRIVER];
  uint64_t drv_async = s1.allocs[VMMSHIM_API_DRIVER_ASYNC] - s0.allocs[VMMSHIM_API_DRIVER_ASYNC];
  check(drv >= (uint64_t)NSZ + 2, "stats-driver-allocs", "shim counted %llu cuMemAlloc, expected %d",
        (unsigned long long)drv, NSZ + 2);
  check(drv_async >= 40, "stats-driver-async-allocs", "shim counted %llu cuMemAllocAsync, expected 40",
        (unsigned long long)drv_async);
  print_stats("driver at end", &s1);
  CKD(cuDevicePrimaryCtxRelease(dev));
  return finish();
}
