/* Test-control API of the host emulation of the CUDA driver (tests/emu/cuda_emu.c).
 *
 * Everything here is exported by build/emu/libcuda.so.1 next to the emulated driver
 * entry points, and is thread safe.
 *
 * Model in one paragraph: each device has a physical budget (default 4 GiB) that
 * cuMemCreate and plain allocations (cuMemAlloc, cuMemAllocAsync) draw from. VMM memory
 * is a memfd per handle, mapped with mmap into PROT_NONE reservations; it is host-
 * accessible only after cuMemSetAccess (before that a host access faults). Work on
 * streams is enqueued by the test (emu_launch) and completes only when the test says so
 * (emu_complete) or when a synchronising call forces it (cuCtxSynchronize,
 * cuStreamSynchronize, cuEventSynchronize, cuStreamDestroy). Completing an item runs its
 * callback under the emulation's (recursive) lock: a callback may read and write device
 * memory, and should not block on other threads that call the driver. Host accesses stand for
 * no particular device (VMM memory opens to the host once any device has access); which
 * device may reach which memory (mapping, peer and pool access) is tracked, and checked by
 * emu_device_access, as described below.
 *
 * Contract violations (arguments or states the real driver rejects or that are
 * undefined behaviour) return the driver's error, print
 *   emu: contract violation: <what>
 * to stderr and increment a counter (emu_violations()). Legitimate failures (out of
 * memory, freeing an unknown pointer through cuMemFree, calls before cuInit or without a
 * current context, fault injection) are not violations.
 *
 * Capture: work, cuMemAllocAsync and cuMemFreeAsync on a capturing stream are recorded,
 * not run (allocations are plain memory made at once; frees recorded in the capture of
 * memory allocated by that same capture happen at cuGraphDestroy). Violations that also
 * invalidate the capture: cuStreamSynchronize / cuStreamQuery on a capturing stream,
 * cuCtxSynchronize while any stream of the context captures (any mode), cuMemAlloc /
 * cuMemFree when the thread's capture mode prohibits unsafe calls (global / thread-local
 * rules of cuThreadExchangeStreamCaptureMode; relaxed allows them), and any use of the
 * legacy stream (cuEventRecord, cuMemAllocAsync, emu_launch, ...) while a blocking stream
 * of its context captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; cuStreamIsCapturing on it
 * returns that error without a violation). The VMM calls are not treated as unsafe.
 * cuEventQuery / cuEventSynchronize on an event recorded in a capture:
 * CUDA_ERROR_CAPTURED_EVENT, a violation.
 *
 * Legacy-stream semantics are modelled: an item on the legacy stream first forces
 * completion of earlier items on blocking streams of its context (user streams created
 * without CU_STREAM_NON_BLOCKING, and per-thread default streams) and vice versa.
 *
 * Several devices (emu_set_device_count, up to 4): who may touch what is tracked, and
 * emu_device_access checks an access by a device's kernels or copy engines. VMM memory is
 * reached through each mapping's per-device access flags (cuMemSetAccess). cuMemAlloc
 * memory of a context C is reached by its device, and by a device with a context that
 * called cuCtxEnablePeerAccess(C) (allowed between two different devices that
 * emu_set_peer_capable has not marked incapable; destroying or resetting either context
 * drops the grant). cuMemAllocAsync memory comes from its device's default pool (also its
 * current pool; there is no cuDeviceSetMemPool) and is reached by its device and by the
 * devices the pool grants (cuMemPoolSetAccess, applied to existing and later allocations).
 * As on the real driver, peer access does not reach pool memory nor pool access cuMemAlloc
 * memory.
 *
 * Default pools keep freed memory, as the driver's do: a cuMemAllocAsync allocation's memory
 * (exact byte counts) stays the pool's after its free (cuMemFreeAsync once its stream reaches
 * it, or cuMemFree) as idle bytes, still counted in the device's physical use; the pool's next
 * allocations take idle bytes first. The pool gives idle memory back while its reserve is
 * above its release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0) at every
 * synchronisation of its device's context, streams or events (cuCtxSynchronize,
 * cuStreamSynchronize, cuEventSynchronize), and down to minBytesToKeep at cuMemPoolTrimTo
 * (never memory freed on a stream that has not reached the free); all of it when its context
 * goes away. cuMemPoolGetAttribute: RESERVED_MEM_CURRENT = allocations not yet reached by
 * their free + idle bytes; USED_MEM_CURRENT = allocations not yet freed (a cuMemFreeAsync
 * counts at once); the *_HIGH watermarks rise with them and are reset to the current value by
 * setting 0 (another value, or setting a *_CURRENT attribute: CUDA_ERROR_INVALID_VALUE, a
 * violation); RELEASE_THRESHOLD returns what was set; the three REUSE_* flags (int) are kept
 * (default 1) and change nothing. Graph allocations (cuMemAllocAsync in a capture) are not the
 * pool's. Handles imported with cuMemImportFromShareableHandle belong to device 0; the fd is
 * the exporter's memfd, so another process sees the same bytes.
 *
 * Managed, pinned host and graph memory: cuMemAllocManaged (CU_MEM_ATTACH_GLOBAL or _HOST) draws
 * from its device's budget at once (a GPU makes it resident when touched; here cuMemGetInfo moves
 * by its size), any device may reach it, and cuMemFree frees it. cuMemAllocHost and cuMemHostAlloc
 * (flags PORTABLE, DEVICEMAP, WRITECOMBINED) make host memory, never the device's, from the host
 * budget; cuMemFreeHost frees it (another pointer: CUDA_ERROR_INVALID_VALUE, not a violation).
 * cuDeviceGetGraphMemAttribute: USED_MEM_CURRENT and RESERVED_MEM_CURRENT are the graph
 * allocations of the device still alive (made at once, so the two agree), the *_HIGH watermarks
 * follow them and cuDeviceSetGraphMemAttribute resets them (to 0 only); cuDeviceGraphMemTrim has
 * nothing unused to give back. cuMemcpyDtoH and cuMemcpyHtoD (_v2) copy at once, after the legacy
 * stream's earlier work, with the device access rules of the current context's device.
 * cuArrayCreate and cuArray3DCreate (_v2) draw Width x Height x Depth elements (1, 2 or 4 channels
 * of an 8/16/32-bit integer, half or float format; others: CUDA_ERROR_NOT_SUPPORTED) from the
 * current context's device at once; cuArrayDestroy gives them back. cuMipmappedArrayCreate draws
 * the sum of its levels (each dimension halved, at least 1) the same way; cuMipmappedArrayDestroy.
 * Contexts and modules take device memory only after emu_set_context_memory: every context
 * (primary or not) its context_bytes while it lives, every cuModuleLoad* module module_bytes of
 * the current context's device until cuModuleUnload or the context's end; cuLibraryLoad* loads at
 * once into the current context (module_bytes; none without one) until cuLibraryUnload or the
 * context's end. Unloading an unknown handle is a violation (CUDA_ERROR_INVALID_HANDLE).
 *
 * Legacy IPC: cuIpcGetMemHandle gives a handle for the base of a cuMemAlloc allocation
 * (bytes "EMUIPC\0\0", the pid, the base and the size, zero-padded to 64) and refuses VMM,
 * pool and graph memory with CUDA_ERROR_INVALID_VALUE, not a violation. No handle ever
 * opens: one of this process gives CUDA_ERROR_INVALID_CONTEXT, one of a process that no
 * longer exists CUDA_ERROR_MAP_FAILED, one of a live process CUDA_ERROR_NOT_SUPPORTED (plain
 * memory is not shared between processes), other bytes CUDA_ERROR_INVALID_VALUE; and
 * cuIpcCloseMemHandle answers CUDA_ERROR_INVALID_VALUE. None of these are violations.
 */
#ifndef VMMSHIM_EMU_H
#define VMMSHIM_EMU_H

#include <stddef.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Base names of the counted driver functions (variants _v2, _ptsz ... count under the
 * base name). The counters struct has a field n_<name> for each. */
#define EMU_FUNCS(X)                                                                         \
  X(cuInit) X(cuDriverGetVersion) X(cuGetProcAddress)                                        \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)              \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)               \
  X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxGetState) X(cuDevicePrimaryCtxSetFlags)     \
  X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice)     \
  X(cuCtxSynchronize) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                                 \
  X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree)                \
  X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                 \
  X(cuMemGetAccess) X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                          \
  X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemGetInfo)            \
  X(cuMemGetAddressRange) X(cuPointerGetAttribute) X(cuPointerGetAttributes)                 \
  X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy) X(cuStreamQuery)        \
  X(cuStreamSynchronize) X(cuStreamWaitEvent) X(cuStreamGetCtx)                              \
  X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventDestroy)  \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)                       \
  X(cuStreamGetCaptureInfo) X(cuThreadExchangeStreamCaptureMode) X(cuGraphDestroy)           \
  X(cuGetErrorName) X(cuGetErrorString)                                                       \
  X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess) X(cuCtxDisablePeerAccess)                \
  X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuMemPoolSetAccess)                   \
  X(cuMemPoolGetAccess) X(cuMemPoolGetAttribute) X(cuMemPoolSetAttribute) X(cuMemPoolTrimTo)      \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)                                \
  X(cuMemcpyDtoD) X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemsetD2D8) X(cuMemsetD2D8Async) X(cuLaunchKernel) \
  X(cuMemsetD16) X(cuMemsetD16Async) X(cuMemsetD32) X(cuMemsetD32Async) X(cuStreamWaitValue32)            \
  X(cuStreamWaitValue64) X(cuStreamWriteValue32) X(cuStreamWriteValue64) X(cuStreamBatchMemOp)                \
  X(cuMemAllocManaged) X(cuMemAllocHost) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyDtoHAsync) X(cuMemcpyHtoDAsync) \
  X(cuDeviceGetGraphMemAttribute) X(cuDeviceSetGraphMemAttribute) X(cuDeviceGraphMemTrim)                  \
  X(cuMemcpyDtoH) X(cuMemcpyHtoD) X(cuArrayCreate) X(cuArray3DCreate) X(cuArrayDestroy)                  \
  X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleLoadFatBinary) X(cuModuleUnload)      \
  X(cuLibraryLoadData) X(cuLibraryLoadFromFile) X(cuLibraryUnload) X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy) \
  X(cuDeviceGetPCIBusId)

typedef struct emu_counters_s {
  /* ---- call counts (reset by emu_reset_counters) ---- */
  unsigned long long lookups;           /* cuGetProcAddress and cuGetProcAddress_v2 calls */
  unsigned long long lookups_not_found; /* of which answered CUDA_ERROR_NOT_FOUND */
#define EMU_COUNTER_FIELD(name) unsigned long long n_##name;
  EMU_FUNCS(EMU_COUNTER_FIELD)
#undef EMU_COUNTER_FIELD
  /* ---- state (never reset) ---- */
  long live_handles;       /* cuMemCreate'd handles whose physical memory still exists */
  long live_mappings;      /* cuMemMap'd ranges */
  long live_reservations;  /* cuMemAddressReserve'd ranges */
  long live_plain;         /* cuMemAlloc / cuMemAllocAsync allocations not yet freed */
  long live_streams;       /* user streams (not legacy or per-thread) */
  long live_events;
  long live_graphs;
  unsigned long long physical_bytes; /* handle_bytes + plain_bytes + pool_idle_bytes, all devices */
  unsigned long long handle_bytes;   /* physical memory of live handles */
  unsigned long long plain_bytes;    /* sizes of live plain allocations (exact byte counts) */
  unsigned long long pool_idle_bytes; /* freed memory the default pools hold */
  unsigned long long mapped_bytes;
  unsigned long long reserved_bytes;
  int violations;
} emu_counters_t;

/* ---- work and completion ---- */
/* Enqueue a work item on s (NULL or CU_STREAM_LEGACY: the legacy stream of the current
 * context; CU_STREAM_PER_THREAD: the calling thread's default stream). On a capturing
 * stream the item is recorded in the capture and never runs. fn may be NULL. */
void emu_launch(CUstream s, void (*fn)(void *), void *arg);
/* Complete up to n pending work items of s in order (n < 0: all); items the emulation
 * enqueued itself (event records, stream-ordered frees, waits) are processed as they are
 * reached. Returns how many emu_launch items completed. */
int emu_complete(CUstream s, int n);
/* emu_launch items pending on s. */
int emu_pending(CUstream s);
/* Items recorded on s by the capture in progress (0 if not capturing). */
int emu_captured(CUstream s);
/* Complete every pending item of every stream. */
void emu_complete_all(void);

/* ---- configuration (call before or after cuInit) ---- */
void emu_set_device_memory(int dev, size_t bytes); /* default 4 GiB */
void emu_set_device_count(int n);                  /* 1..4, default 1 */
void emu_set_caps(int vmm, int posix_fd, int rdma); /* all devices; default 1, 1, 1 */
void emu_set_granularity(size_t bytes);            /* power of two >= 4096; default 2 MiB */
/* Other processes' bytes on device dev (in its use; libnvidia-ml.so.1 of the emulation lists them
 * under another pid), and bytes the driver takes for itself (a kernel loaded at first launch). */
void emu_set_other_processes(int dev, size_t bytes);
size_t emu_other_processes(int dev);
void emu_take_driver_memory(int dev, size_t bytes);
size_t emu_device_total(int dev);
/* What each context and each loaded module take of their device (default 0 and 0). */
void emu_set_context_memory(size_t context_bytes, size_t module_bytes);
/* Whether device dev can access memory of device peer (cuDeviceCanAccessPeer, and what
 * cuCtxEnablePeerAccess accepts). Default: every pair of different devices can. */
void emu_set_peer_capable(int dev, int peer, int capable);
/* on: an event recorded on a stream with no pending emu_launch work completes at once, as on
 * a GPU that keeps up with the program (default off: nothing completes unless forced). */
void emu_set_eager(int on);
/* Fault injection: the next count calls of function_name (base name, e.g. "cuMemCreate";
 * a _v2/_ptsz suffix is ignored) return err. count 0 clears it. Returns silently for an
 * unknown name after printing a warning. */
void emu_fail_next(const char *function_name, CUresult err, int count);
/* The same after `skip` more calls of it have succeeded: emu_fail_after("cuMemUnmap", 2, e, 1)
 * fails the third cuMemUnmap from now. A call that fails so does nothing (the driver's state is
 * as before it). */
void emu_fail_after(const char *function_name, int skip, CUresult err, int count);
/* Injected failures still to come for function_name (0 once all were used, -1 unknown name). */
int emu_faults_left(const char *function_name);
void emu_clear_faults(void);

/* ---- observation ---- */
void emu_get_counters(emu_counters_t *out);
void emu_reset_counters(void); /* call counts only */
/* Calls of one function by base name ("cuMemMap"), -1 for an unknown name. */
long long emu_calls(const char *function_name);
/* Successful cuGetProcAddress(_v2) lookups of one symbol (base name, all versions). */
long long emu_lookup_count(const char *symbol);
/* For the VMM mapping holding addr: the handle's requestedHandleTypes, its
 * gpuDirectRDMACapable flag, and the access flags set for the handle's device
 * (CU_MEM_ACCESS_FLAGS_PROT_*; 0 before cuMemSetAccess). Returns 0 if addr is mapped,
 * -1 otherwise. Any output pointer may be NULL. */
int emu_handle_info(CUdeviceptr addr, unsigned long long *requested_handle_types, int *rdma,
                    unsigned *access_flags);
/* The contract of memory the program holds: no byte of a handle lies under two of the n live
 * ranges [va[i], va[i] + len[i]) (a handle mapped at two addresses, each under a live block).
 * Each such pair is a contract violation (printed, counted); returns how many were found. */
int emu_shared_handles(const CUdeviceptr *va, const size_t *len, int n);
int emu_violations(void);
/* A kernel or copy engine of device dev reading (write 0) or writing (write 1) [ptr, ptr+n):
 * touches no memory, checks that dev may. Returns 0 when allowed; otherwise prints
 *   emu: contract violation: device 1 wrote 0x... (4096 bytes) without access: <why>
 * counts a violation and a device fault, and returns -1. Rules:
 * - VMM memory: the whole range must be mapped, and every mapping in it must grant dev
 *   CU_MEM_ACCESS_FLAGS_PROT_READ (a read) or _READWRITE (a write) (cuMemSetAccess);
 * - plain memory of device o, context C: the range must lie in the allocation; dev == o is
 *   allowed; otherwise cuMemAlloc memory needs a live context on dev with peer access
 *   enabled to C (cuCtxEnablePeerAccess), and cuMemAllocAsync memory needs o's default pool
 *   to grant dev READ / READWRITE (cuMemPoolSetAccess) — as on the real driver, peer access
 *   does not reach pool memory and pool access does not reach cuMemAlloc memory; a graph
 *   allocation (cuMemAllocAsync in a capture) is its device's alone;
 * - an address in no allocation is refused.
 * n == 0 is allowed; a bad dev prints a message and returns -1 without counting. */
int emu_device_access(int dev, CUdeviceptr ptr, size_t n, int write);
/* Refusals of emu_device_access so far (each also counted in emu_violations()). */
long emu_device_faults(void);
/* Physical bytes in use on dev (handles + plain allocations). */
size_t emu_device_used(int dev);

/* ---- host-location handles, copies, a slow driver ----
 * cuMemCreate with CU_MEM_LOCATION_TYPE_HOST or _HOST_NUMA (node 0) makes a handle of host
 * memory, drawn from a host budget (default 16 GiB), mapped like any handle inside a device
 * reservation; cuPointerGetAttribute answers CU_MEMORYTYPE_HOST for it, as the driver does.
 * cuMemcpyDtoD(Async) and cuMemsetD8(Async) run when their stream reaches them (the device
 * access rules apply then: an address unmapped meanwhile is a device fault); cuLaunchKernel
 * enqueues a launch that does nothing (any non-NULL function). cuMemsetD16/D32(Async) fill
 * elements of 2 and 4 bytes the same way. The stream memory operations (cuStreamWaitValue32/64,
 * cuStreamWriteValue32/64, cuStreamBatchMemOp; original, _v2 and _ptsz forms) run when their
 * stream reaches them: a write stores its word, a wait holds everything behind it on its stream
 * until the word meets the condition (forcing the stream runs the other streams' work until one
 * meets it; a wait nothing pending meets is a contract violation, as it would hang a GPU). */
void emu_set_host_vmm(int on);           /* HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, default 1 */
void emu_set_host_memory(size_t bytes);  /* host budget for host-location handles */
/* cuMemSetAccess with a CPU descriptor (location HOST, or HOST_NUMA node 0): allowed on
 * host-location memory only (on device memory a violation), then the CPU's flags, read back by
 * cuMemGetAccess of that location; off (default on), the driver answers CUDA_ERROR_NOT_SUPPORTED. */
void emu_set_host_cpu_access(int on);
size_t emu_host_used(void);              /* bytes of live host-location handles */
/* 1 when addr is mapped to a host-location handle, 0 to a device handle, -1 unmapped. */
int emu_host_mapped(CUdeviceptr addr);
/* The next count calls of function_name sleep usec first (outside the emulation's lock). */
void emu_delay_next(const char *function_name, unsigned usec, int count);
/* The next call of function_name is parked on entry (outside the emulation's lock, before it
 * does anything) until emu_release_hold(); emu_wait_held waits up to timeout_ms for a call to
 * be parked there and returns 1 when one is (0 on timeout). */
void emu_hold_next(const char *function_name);
int emu_wait_held(unsigned timeout_ms);
void emu_release_hold(void);

#ifdef __cplusplus
}
#endif
#endif
