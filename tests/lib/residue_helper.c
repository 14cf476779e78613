/* residue_helper.c: a library that makes device memory of its own, as NCCL or JAX's allocator
 * does (test_shim_residue loads it as libresidue_helper.so): VMM handles it maps itself, pinned
 * host memory, managed memory and a graph allocation. The residue must name it as their owner. */
#include <cuda.h>
#include <stddef.h>

#include "residue_helper.h"

#define VS_HELPER_GRAN (2ull << 20)

int helper_vmm_make(size_t size, int dev, int exportable, helper_vmm_t *out) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  size = (size + VS_HELPER_GRAN - 1) / VS_HELPER_GRAN * VS_HELPER_GRAN;
  out->size = size;
  if (cuMemAddressReserve(&out->va, size, 0, 0, 0) != CUDA_SUCCESS) return -1;
  if (cuMemCreate(&out->handle, size, &prop, 0) != CUDA_SUCCESS) return -2;
  if (cuMemMap(out->va, size, 0, out->handle, 0) != CUDA_SUCCESS) return -3;
  CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return cuMemSetAccess(out->va, size, &a, 1) == CUDA_SUCCESS ? 0 : -4;
}

int helper_vmm_free(helper_vmm_t *v) {
  int bad = cuMemUnmap(v->va, v->size) != CUDA_SUCCESS;
  bad |= cuMemRelease(v->handle) != CUDA_SUCCESS;
  bad |= cuMemAddressFree(v->va, v->size) != CUDA_SUCCESS;
  return bad ? -1 : 0;
}

void *helper_pinned(size_t size) {
  void *p = NULL;
  return cuMemAllocHost(&p, size) == CUDA_SUCCESS ? p : NULL;
}

void *helper_pinned_flags(size_t size) {
  void *p = NULL;
  return cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS ? p : NULL;
}

int helper_pinned_free(void *p) { return cuMemFreeHost(p) == CUDA_SUCCESS ? 0 : -1; }

CUdeviceptr helper_managed(size_t size) {
  CUdeviceptr p = 0;
  return cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS ? p : 0;
}

int helper_managed_free(CUdeviceptr p) { return cuMemFree(p) == CUDA_SUCCESS ? 0 : -1; }

/* A captured graph with one memory node of size bytes, freed in the graph: the graph's memory until it
 * is destroyed. */
CUgraph helper_graph(size_t size) {
  CUstream s = NULL;
  CUgraph g = NULL;
  CUdeviceptr p = 0;
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return NULL;
  if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS) {
    if (cuMemAllocAsync(&p, size, s) == CUDA_SUCCESS) cuMemFreeAsync(p, s); /* a memory node and its free */
    cuStreamEndCapture(s, &g);
  }
  cuStreamDestroy(s);
  return g;
}

/* One handle mapped in two halves (offset 0 and size/2): a foreign sleep must leave it. */
int helper_vmm_make_halves(size_t size, int dev, helper_vmm_t *out) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size = (size + 2 * VS_HELPER_GRAN - 1) / (2 * VS_HELPER_GRAN) * (2 * VS_HELPER_GRAN);
  out->size = size;
  if (cuMemAddressReserve(&out->va, size, 0, 0, 0) != CUDA_SUCCESS) return -1;
  if (cuMemCreate(&out->handle, size, &prop, 0) != CUDA_SUCCESS) return -2;
  if (cuMemMap(out->va, size / 2, 0, out->handle, 0) != CUDA_SUCCESS) return -3;
  if (cuMemMap(out->va + size / 2, size / 2, size / 2, out->handle, 0) != CUDA_SUCCESS) return -3;
  CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return cuMemSetAccess(out->va, size, &a, 1) == CUDA_SUCCESS ? 0 : -4;
}

int helper_vmm_free_halves(helper_vmm_t *v) {
  int bad = cuMemUnmap(v->va, v->size / 2) != CUDA_SUCCESS;
  bad |= cuMemUnmap(v->va + v->size / 2, v->size / 2) != CUDA_SUCCESS;
  bad |= cuMemRelease(v->handle) != CUDA_SUCCESS;
  bad |= cuMemAddressFree(v->va, v->size) != CUDA_SUCCESS;
  return bad ? -1 : 0;
}

/* Two handles back to back in one reservation, opened by one cuMemSetAccess over both (as NCCL and
 * PyTorch's expandable segments do), and unmapped by one cuMemUnmap. */
int helper_vmm_make_pair(size_t size, int dev, helper_vmm_t out[2]) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size = (size + VS_HELPER_GRAN - 1) / VS_HELPER_GRAN * VS_HELPER_GRAN;
  CUdeviceptr va;
  if (cuMemAddressReserve(&va, 2 * size, 0, 0, 0) != CUDA_SUCCESS) return -1;
  for (int i = 0; i < 2; i++) {
    out[i].va = va + (CUdeviceptr)i * size;
    out[i].size = size;
    if (cuMemCreate(&out[i].handle, size, &prop, 0) != CUDA_SUCCESS) return -2;
    if (cuMemMap(out[i].va, size, 0, out[i].handle, 0) != CUDA_SUCCESS) return -3;
  }
  CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return cuMemSetAccess(va, 2 * size, &a, 1) == CUDA_SUCCESS ? 0 : -4;
}

int helper_vmm_free_pair(helper_vmm_t v[2]) {
  int bad = cuMemUnmap(v[0].va, 2 * v[0].size) != CUDA_SUCCESS;
  bad |= cuMemRelease(v[0].handle) != CUDA_SUCCESS;
  bad |= cuMemRelease(v[1].handle) != CUDA_SUCCESS;
  bad |= cuMemAddressFree(v[0].va, 2 * v[0].size) != CUDA_SUCCESS;
  return bad ? -1 : 0;
}

/* A 2D array of width x height 32-bit floats (cuArrayCreate). */
CUarray helper_array(size_t width, size_t height) {
  CUDA_ARRAY_DESCRIPTOR d = {width, height, CU_AD_FORMAT_FLOAT, 1};
  CUarray a = NULL;
  return cuArrayCreate(&a, &d) == CUDA_SUCCESS ? a : NULL;
}

int helper_array_free(CUarray a) { return cuArrayDestroy(a) == CUDA_SUCCESS ? 0 : -1; }
