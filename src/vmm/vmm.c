/* vmm.c: the only caller of the driver's virtual memory management functions.
 *
 * One function per operation. Each checks its arguments the way the driver documents
 * them, so a bug in the pool shows up as a named error here rather than as a driver
 * failure or, worse, a silent misuse; each call is timed and counted (stats), logged
 * with its addresses, sizes, handles and access flags (VMMSHIM_LOG=info) and traced. */
#include <inttypes.h>
#include <stdio.h>

#include "vmmshim/trace.h"
#include "vmmshim/vmm.h"

static bool is_pow2(size_t x) { return x && !(x & (x - 1)); }

/* Every driver call of this file is made with none of the shim's locks held (pools, context
 * slots, IPC, the peer table; asserted in debug builds): a VMM call takes tens of microseconds to
 * milliseconds, and other threads must not wait behind it. The one exception, counted apart, is
 * handles.c's access lock, held on rare paths across cuMemSetAccess (handles.c says why it must
 * be, and why that is safe). */
#define VS_DRIVER_CALL_START() vs_assert(_vs_locks_held == 0)

static const char *flag_name(unsigned f) {
  return f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "READWRITE" : f == CU_MEM_ACCESS_FLAGS_PROT_READ ? "READ" : "NONE";
}

/* Counts a driver call that started at t0 in the stats; returns its time. */
static uint64_t count_call(uint64_t t0) {
  uint64_t dt = _vs_now_ns() - t0;
  VS_STAT_ADD(vmm_calls, 1);
  VS_STAT_ADD(vmm_ns, dt);
  return dt;
}

static CUresult finish(vs_vmm_op_t op, const char *what, CUresult r, uint64_t t0, CUdeviceptr va, size_t size,
                       uint64_t handle, unsigned flags, int dev) {
  uint64_t dt = count_call(t0);
  if (r != CUDA_SUCCESS) {
    /* Out of memory is an expected answer the pool handles; anything else is a bug or a dying context. */
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
      _vs_info("%s(size 0x%zx) on device %d: %s", what, size, dev, _vs_cu_error_name(r));
    else
      _vs_warn("%s(va 0x%llx, size 0x%zx, handle 0x%" PRIx64 ") on device %d failed: %s", what,
               (unsigned long long)va, size, handle, dev, _vs_cu_error_name(r));
  } else {
    _vs_info("%s va 0x%llx size 0x%zx handle 0x%" PRIx64 " device %d%s%s (%.1f us)", what, (unsigned long long)va,
             size, handle, dev, op == VS_VMM_SET_ACCESS ? " access " : "", op == VS_VMM_SET_ACCESS ? flag_name(flags) : "",
             (double)dt / 1000.0);
  }
  if (vs_unlikely(_vs_trace_on)) _vs_trace_vmm(op, va, size, handle, flags, dev, r, dt);
  return r;
}

static CUresult bad_arg(const char *what, const char *why, CUdeviceptr va, size_t size) {
  _vs_error("%s(va 0x%llx, size 0x%zx): %s: CUDA_ERROR_INVALID_VALUE", what, (unsigned long long)va, size, why);
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult check_range(const char *what, const vs_device_caps_t *caps, CUdeviceptr va, size_t size, bool check_va) {
  if (!caps || !caps->min_granularity) return bad_arg(what, "device not queried", va, size);
  if (size == 0) return bad_arg(what, "zero size", va, size);
  if (size % caps->min_granularity) return bad_arg(what, "size not a multiple of the granularity", va, size);
  if (check_va && (va == 0 || va % caps->min_granularity))
    return bad_arg(what, "address not aligned to the granularity", va, size);
  return CUDA_SUCCESS;
}

static void fill_prop(const vs_device_caps_t *caps, CUmemAllocationProp *prop, bool shareable) {
  *prop = (CUmemAllocationProp){0};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = caps->device;
  if (shareable && caps->posix_fd_supported) prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (shareable && caps->rdma_supported) prop->allocFlags.gpuDirectRDMACapable = 1;
}

CUresult _vs_vmm_query(CUdevice device, vs_device_caps_t *caps) {
  *caps = (vs_device_caps_t){.device = device};
  int v = 0;
  CUresult r = _vs_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  if (r != CUDA_SUCCESS) return r;
  caps->vmm_supported = v != 0;
  v = 0;
  if (_vs_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) ==
      CUDA_SUCCESS)
    caps->posix_fd_supported = v != 0;
  v = 0;
  if (_vs_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device) ==
      CUDA_SUCCESS)
    caps->rdma_supported = v != 0;
  v = 0;
  if (_vs_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) ==
      CUDA_SUCCESS)
    caps->host_vmm_supported = v != 0;
  v = -1;
  if (_vs_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device) != CUDA_SUCCESS) v = -1;
  caps->host_numa_id = v;
  r = _vs_cu.cuDeviceTotalMem(&caps->total_mem, device);
  if (r != CUDA_SUCCESS) return r;
  if (!caps->vmm_supported) return CUDA_SUCCESS;
  CUmemAllocationProp prop;
  fill_prop(caps, &prop, true);
  r = _vs_cu.cuMemGetAllocationGranularity(&caps->min_granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r == CUDA_SUCCESS && !is_pow2(caps->min_granularity)) r = CUDA_ERROR_NOT_SUPPORTED;
  return r;
}

CUresult _vs_vmm_reserve(const vs_device_caps_t *caps, size_t size, size_t align, CUdeviceptr *va_out) {
  CUresult r = check_range("cuMemAddressReserve", caps, 0, size, false);
  if (r != CUDA_SUCCESS) return r;
  if (align && !is_pow2(align)) return bad_arg("cuMemAddressReserve", "alignment not a power of two", 0, size);
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  *va_out = 0;
  r = _vs_cu.cuMemAddressReserve(va_out, size, align, 0, 0);
  return finish(VS_VMM_RESERVE, "cuMemAddressReserve", r, t0, *va_out, size, 0, 0, caps->device);
}

CUresult _vs_vmm_address_free(const vs_device_caps_t *caps, CUdeviceptr va, size_t size) {
  CUresult r = check_range("cuMemAddressFree", caps, va, size, true);
  if (r != CUDA_SUCCESS) return r;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  r = _vs_cu.cuMemAddressFree(va, size);
  return finish(VS_VMM_ADDRESS_FREE, "cuMemAddressFree", r, t0, va, size, 0, 0, caps->device);
}

CUresult _vs_vmm_create(const vs_device_caps_t *caps, size_t size, CUmemGenericAllocationHandle *handle_out) {
  CUresult r = check_range("cuMemCreate", caps, 0, size, false);
  if (r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop;
  fill_prop(caps, &prop, true);
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  *handle_out = 0;
  r = _vs_cu.cuMemCreate(handle_out, size, &prop, 0);
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) {
    /* Some platforms refuse the shareable/RDMA properties they advertise; plain memory still serves. */
    fill_prop(caps, &prop, false);
    r = _vs_cu.cuMemCreate(handle_out, size, &prop, 0);
  }
  return finish(VS_VMM_CREATE, "cuMemCreate", r, t0, 0, size, (uint64_t)*handle_out, 0, caps->device);
}

/* Host memory (pinned as it is created) that maps at device addresses like a device handle:
 * where a sleeping pool keeps its bytes. Near the device's NUMA node when the driver says
 * which one, else anywhere on the host. Not traced as device memory: the log and the stats
 * count it. */
CUresult _vs_vmm_create_host(const vs_device_caps_t *caps, size_t size, CUmemGenericAllocationHandle *handle_out,
                             int *numa_out) {
  *numa_out = -1;
  CUresult r = check_range("cuMemCreate", caps, 0, size, false);
  if (r != CUDA_SUCCESS) return r;
  if (!caps->host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = caps->host_numa_id >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
  prop.location.id = caps->host_numa_id >= 0 ? caps->host_numa_id : 0;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  *handle_out = 0;
  r = _vs_cu.cuMemCreate(handle_out, size, &prop, 0);
  if ((r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) && prop.location.type != CU_MEM_LOCATION_TYPE_HOST) {
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    prop.location.id = 0;
    r = _vs_cu.cuMemCreate(handle_out, size, &prop, 0);
  }
  uint64_t dt = count_call(t0);
  if (r == CUDA_SUCCESS && prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) *numa_out = prop.location.id;
  if (r != CUDA_SUCCESS)
    _vs_info("cuMemCreate(host, size 0x%zx) for device %d: %s", size, (int)caps->device, _vs_cu_error_name(r));
  else
    _vs_info("cuMemCreate host memory size 0x%zx handle 0x%llx for device %d (%.1f us)", size,
             (unsigned long long)*handle_out, (int)caps->device, (double)dt / 1000.0);
  return r;
}

CUresult _vs_vmm_release(const vs_device_caps_t *caps, CUmemGenericAllocationHandle handle, size_t size) {
  if (!handle) return bad_arg("cuMemRelease", "null handle", 0, size);
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  CUresult r = _vs_cu.cuMemRelease(handle);
  return finish(VS_VMM_RELEASE, "cuMemRelease", r, t0, 0, size, (uint64_t)handle, 0, caps->device);
}

/* flags: VS_TRACE_HOST_MEMORY for a host-location handle, VS_TRACE_ALIAS for a second mapping of a
 * device handle, so that a trace reader does not count either as device memory. */
static CUresult map_as(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle,
                       unsigned flags, const char *what) {
  CUresult r = check_range("cuMemMap", caps, va, size, true);
  if (r != CUDA_SUCCESS) return r;
  if (!handle) return bad_arg("cuMemMap", "null handle", va, size);
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  r = _vs_cu.cuMemMap(va, size, 0, handle, 0);
  return finish(VS_VMM_MAP, what, r, t0, va, size, (uint64_t)handle, flags, caps->device);
}

static CUresult unmap_as(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, unsigned flags, const char *what) {
  CUresult r = check_range("cuMemUnmap", caps, va, size, true);
  if (r != CUDA_SUCCESS) return r;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  r = _vs_cu.cuMemUnmap(va, size);
  return finish(VS_VMM_UNMAP, what, r, t0, va, size, 0, flags, caps->device);
}

CUresult _vs_vmm_map(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle) {
  return map_as(caps, va, size, handle, 0, "cuMemMap");
}

CUresult _vs_vmm_map_host(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle) {
  return map_as(caps, va, size, handle, VS_TRACE_HOST_MEMORY, "cuMemMap (host memory)");
}

CUresult _vs_vmm_unmap_host(const vs_device_caps_t *caps, CUdeviceptr va, size_t size) {
  return unmap_as(caps, va, size, VS_TRACE_HOST_MEMORY, "cuMemUnmap (host memory)");
}

CUresult _vs_vmm_map_alias(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle) {
  return map_as(caps, va, size, handle, VS_TRACE_ALIAS, "cuMemMap (alias)");
}

CUresult _vs_vmm_unmap_alias(const vs_device_caps_t *caps, CUdeviceptr va, size_t size) {
  return unmap_as(caps, va, size, VS_TRACE_ALIAS, "cuMemUnmap (alias)");
}

CUresult _vs_vmm_unmap(const vs_device_caps_t *caps, CUdeviceptr va, size_t size) {
  return unmap_as(caps, va, size, 0, "cuMemUnmap");
}

CUresult _vs_vmm_set_access(const vs_device_caps_t *caps, CUdeviceptr va, size_t size) {
  return _vs_vmm_set_access_devices(caps, va, size, 0, 0, 0);
}

CUresult _vs_vmm_set_access_devices(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, uint64_t rw, uint64_t ro,
                                    uint64_t none) {
  CUresult r = check_range("cuMemSetAccess", caps, va, size, true);
  if (r != CUDA_SUCCESS) return r;
  CUmemAccessDesc desc[VS_MAX_DEVICES + 1];
  size_t n = 0;
  desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc[n].location.id = caps->device;
  desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int d = 0; d < VS_MAX_DEVICES; d++) {
    if (d == caps->device) continue;
    CUmemAccess_flags f;
    if (rw >> d & 1) f = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    else if (ro >> d & 1) f = CU_MEM_ACCESS_FLAGS_PROT_READ;
    else if (none >> d & 1) f = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    else continue;
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = d;
    desc[n++].flags = f;
  }
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  r = _vs_cu.cuMemSetAccess(va, size, desc, n);
  uint64_t dt = count_call(t0);
  if (r != CUDA_SUCCESS) {
    _vs_warn("cuMemSetAccess(va 0x%llx, size 0x%zx, %zu devices) failed: %s", (unsigned long long)va, size, n,
             _vs_cu_error_name(r));
  } else if (VS_LOG_ON(VS_LOG_INFO)) {
    char list[512];
    size_t o = 0;
    for (size_t i = 0; i < n && o < sizeof list - 40; i++)
      o += (size_t)snprintf(list + o, sizeof list - o, "%s device %d access %s", i ? "," : "", desc[i].location.id,
                            flag_name(desc[i].flags));
    _vs_info("cuMemSetAccess va 0x%llx size 0x%zx handle 0x0%s (%.1f us)", (unsigned long long)va, size, list,
             (double)dt / 1000.0);
  }
  if (vs_unlikely(_vs_trace_on)) /* one record per device; the call's time on the first */
    for (size_t i = 0; i < n; i++)
      _vs_trace_vmm(VS_VMM_SET_ACCESS, va, size, 0, desc[i].flags, desc[i].location.id, r, i ? 0 : dt);
  return r;
}

CUresult _vs_vmm_set_access_cpu(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, int numa) {
  CUresult r = check_range("cuMemSetAccess", caps, va, size, true);
  if (r != CUDA_SUCCESS) return r;
  CUmemAccessDesc desc[2];
  desc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc[0].location.id = caps->device;
  desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  desc[1].location.type = numa >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
  desc[1].location.id = numa >= 0 ? numa : 0;
  desc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  r = _vs_cu.cuMemSetAccess(va, size, desc, 2);
  uint64_t dt = count_call(t0);
  /* A refusal is an answer (the caller goes on with device access only), not a fault. */
  if (r != CUDA_SUCCESS)
    _vs_info("cuMemSetAccess(va 0x%llx, size 0x%zx, device %d and the CPU (%s %d)): %s", (unsigned long long)va, size,
             (int)caps->device, numa >= 0 ? "HOST_NUMA" : "HOST", desc[1].location.id, _vs_cu_error_name(r));
  else
    _vs_info("cuMemSetAccess va 0x%llx size 0x%zx device %d access READWRITE, CPU (%s %d) access READWRITE (%.1f us)",
             (unsigned long long)va, size, (int)caps->device, numa >= 0 ? "HOST_NUMA" : "HOST", desc[1].location.id,
             (double)dt / 1000.0);
  /* One record, the device's: a reader would take a host location's id for a device. */
  if (vs_unlikely(_vs_trace_on)) _vs_trace_vmm(VS_VMM_SET_ACCESS, va, size, 0, desc[0].flags, caps->device, r, dt);
  return r;
}

CUresult _vs_vmm_export(const vs_device_caps_t *caps, CUmemGenericAllocationHandle handle, int *fd_out) {
  *fd_out = -1;
  if (!_vs_cu.cuMemExportToShareableHandle || !caps->posix_fd_supported) return CUDA_ERROR_NOT_SUPPORTED;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  int fd = -1;
  CUresult r = _vs_cu.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  uint64_t dt = count_call(t0);
  if (r != CUDA_SUCCESS) {
    _vs_warn("cuMemExportToShareableHandle(handle 0x%llx) on device %d failed: %s", (unsigned long long)handle,
             (int)caps->device, _vs_cu_error_name(r));
    return r;
  }
  _vs_info("cuMemExportToShareableHandle handle 0x%llx device %d -> fd %d (%.1f us)", (unsigned long long)handle,
           (int)caps->device, fd, (double)dt / 1000.0);
  *fd_out = fd;
  return CUDA_SUCCESS;
}

CUresult _vs_vmm_import(int fd, CUmemGenericAllocationHandle *handle_out) {
  *handle_out = 0;
  if (!_vs_cu.cuMemImportFromShareableHandle) return CUDA_ERROR_NOT_SUPPORTED;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  CUresult r = _vs_cu.cuMemImportFromShareableHandle(handle_out, (void *)(uintptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  uint64_t dt = count_call(t0);
  if (r != CUDA_SUCCESS) _vs_warn("cuMemImportFromShareableHandle(fd %d) failed: %s", fd, _vs_cu_error_name(r));
  else _vs_info("cuMemImportFromShareableHandle fd %d -> handle 0x%llx (%.1f us)", fd, (unsigned long long)*handle_out,
                (double)dt / 1000.0);
  return r;
}

/* ------------------------------------------------------------------ memory a library made (a foreign sleep) */

/* The same properties as a library's handle had, for its foreign wake (src/alloc/foreign.c). */
CUresult _vs_vmm_create_as(const vs_device_caps_t *caps, size_t size, const CUmemAllocationProp *prop,
                           CUmemGenericAllocationHandle *handle_out) {
  CUresult r = check_range("cuMemCreate", caps, 0, size, false);
  if (r != CUDA_SUCCESS) return r;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  *handle_out = 0;
  r = _vs_cu.cuMemCreate(handle_out, size, prop, 0);
  return finish(VS_VMM_CREATE, "cuMemCreate", r, t0, 0, size, (uint64_t)*handle_out, 0, caps->device);
}

/* The access a library had given its mapping, every location's, in one call. */
CUresult _vs_vmm_set_access_as(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, const CUmemAccessDesc *desc,
                               size_t n) {
  CUresult r = check_range("cuMemSetAccess", caps, va, size, true);
  if (r != CUDA_SUCCESS) return r;
  VS_DRIVER_CALL_START();
  uint64_t t0 = _vs_now_ns();
  r = _vs_cu.cuMemSetAccess(va, size, desc, n);
  return finish(VS_VMM_SET_ACCESS, "cuMemSetAccess", r, t0, va, size, 0, n ? (unsigned)desc[0].flags : 0,
                caps->device);
}
