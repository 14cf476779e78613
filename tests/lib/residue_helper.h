/* residue_helper.h: libresidue_helper.so, a library that makes its own device memory (tests). */
#ifndef VMMSHIM_TEST_RESIDUE_HELPER_H
#define VMMSHIM_TEST_RESIDUE_HELPER_H

#include <cuda.h>
#include <stddef.h>

typedef struct helper_vmm_s {
  CUdeviceptr va;
  size_t size;
  CUmemGenericAllocationHandle handle;
} helper_vmm_t;

/* Reserves, creates (exportable: a POSIX fd handle type), maps and opens size bytes on dev: 0 or < 0. */
int helper_vmm_make(size_t size, int dev, int exportable, helper_vmm_t *out);
int helper_vmm_free(helper_vmm_t *v);
void *helper_pinned(size_t size);       /* cuMemAllocHost */
void *helper_pinned_flags(size_t size); /* cuMemHostAlloc */
int helper_pinned_free(void *p);
CUdeviceptr helper_managed(size_t size);
int helper_managed_free(CUdeviceptr p);
CUgraph helper_graph(size_t size); /* a captured graph holding size bytes of graph memory */
CUarray helper_array(size_t width, size_t height); /* width x height floats */
int helper_array_free(CUarray a);
int helper_vmm_make_halves(size_t size, int dev, helper_vmm_t *out); /* one handle, two mappings */
int helper_vmm_free_halves(helper_vmm_t *v);
/* Two handles back to back, opened by one cuMemSetAccess and unmapped by one cuMemUnmap. */
int helper_vmm_make_pair(size_t size, int dev, helper_vmm_t out[2]);
int helper_vmm_free_pair(helper_vmm_t v[2]);

#endif
