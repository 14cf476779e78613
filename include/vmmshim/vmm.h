/* vmmshim vmm layer (src/vmm/vmm.c): the only caller of the driver's VMM functions. */
#ifndef VMMSHIM_VMM_H
#define VMMSHIM_VMM_H

#include "vmmshim/base.h"

/* ---------------------------------------------------------------- "vmm.c" */
/* Contract: every function returns CUDA_SUCCESS or the driver's error (logged by name);
 * arguments the driver would reject (zero size, sizes or addresses not multiples of the
 * granularity, alignment not a power of two) return CUDA_ERROR_INVALID_VALUE before any
 * driver call. Every call is counted and timed in the stats and written to the log
 * (level info) and the trace. */
typedef struct vs_device_caps_s {
  CUdevice device;
  size_t min_granularity;   /* cuMemGetAllocationGranularity(MINIMUM) */
  size_t total_mem;
  bool vmm_supported;
  bool posix_fd_supported;
  bool rdma_supported;
  bool host_vmm_supported; /* host-location handles map at device addresses (HOST_NUMA VMM) */
  int host_numa_id;        /* the host NUMA node nearest the device, -1 when unknown */
} vs_device_caps_t;

/* Queries the device's VMM support and granularity. */
CUresult _vs_vmm_query(CUdevice device, vs_device_caps_t *caps);
/* size > 0, multiple of caps->min_granularity; align 0 or a power of two. */
CUresult _vs_vmm_reserve(const vs_device_caps_t *caps, size_t size, size_t align, CUdeviceptr *va_out);
/* va and size exactly as reserved. */
CUresult _vs_vmm_address_free(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* Physical memory on caps->device, POSIX-fd shareable and RDMA-capable where supported. */
CUresult _vs_vmm_create(const vs_device_caps_t *caps, size_t size, CUmemGenericAllocationHandle *handle_out);
/* Host memory of size bytes, to map at device addresses (CUDA_ERROR_NOT_SUPPORTED when the device
 * cannot map host-location handles). Released with _vs_vmm_release. *numa_out: its host NUMA node,
 * -1 when it was made with location HOST (no node named). */
CUresult _vs_vmm_create_host(const vs_device_caps_t *caps, size_t size, CUmemGenericAllocationHandle *handle_out,
                             int *numa_out);
CUresult _vs_vmm_release(const vs_device_caps_t *caps, CUmemGenericAllocationHandle handle, size_t size);
/* Maps the whole handle at va (aligned to min granularity, inside a reservation, unmapped). */
CUresult _vs_vmm_map(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle);
/* The same for a host-location handle (traced as host memory, not device memory). */
CUresult _vs_vmm_map_host(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle);
CUresult _vs_vmm_unmap_host(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* A second mapping of a device handle already mapped elsewhere (traced as an alias, so that a
 * trace reader does not count its memory twice). */
CUresult _vs_vmm_map_alias(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle);
CUresult _vs_vmm_unmap_alias(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* va and size cover whole mappings. */
CUresult _vs_vmm_unmap(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* Read-write access for caps->device. */
CUresult _vs_vmm_set_access(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* Access for several devices in one call: caps->device read-write, the devices of bitmask rw
 * read-write, of ro read-only, of none no access (taken away). Logged with every device's flags. */
#define VS_MAX_DEVICES 64
CUresult _vs_vmm_set_access_devices(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, uint64_t rw, uint64_t ro,
                                    uint64_t none);
/* Read-write access for caps->device and for the CPU, in one call, to host memory mapped at va:
 * the CPU location is HOST_NUMA node numa, or HOST when numa is -1. A refusal is logged at info
 * level only (the caller goes on with _vs_vmm_set_access). */
CUresult _vs_vmm_set_access_cpu(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, int numa);
/* A handle as a POSIX file descriptor (cuMemExportToShareableHandle), and back (the caller
 * closes the descriptor). CUDA_ERROR_NOT_SUPPORTED where the driver or device has no such handles. */
CUresult _vs_vmm_export(const vs_device_caps_t *caps, CUmemGenericAllocationHandle handle, int *fd_out);
CUresult _vs_vmm_import(int fd, CUmemGenericAllocationHandle *handle_out);
/* Memory a library made itself, made again by a foreign wake: a handle of the same properties,
 * and the access descriptors its mapping had (src/alloc/foreign.c). */
CUresult _vs_vmm_create_as(const vs_device_caps_t *caps, size_t size, const CUmemAllocationProp *prop,
                           CUmemGenericAllocationHandle *handle_out);
CUresult _vs_vmm_set_access_as(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, const CUmemAccessDesc *desc,
                               size_t n);

#endif
