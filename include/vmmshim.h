/* vmmshim public API.
 *
 * A program never needs to link against libvmmshim.so: it runs unmodified under
 * LD_PRELOAD. A program that wants to look inside the shim finds these functions
 * at run time with dlsym(RTLD_DEFAULT, "vmmshim_get_stats") and friends, and
 * works on without them when the shim is not loaded. */
#ifndef VMMSHIM_H
#define VMMSHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMMSHIM_VERSION "0.1.0"

/* Which entry point an allocation or free came through. */
typedef enum vmmshim_api_e {
  VMMSHIM_API_RUNTIME = 0,       /* cudaMalloc / cudaFree */
  VMMSHIM_API_RUNTIME_ASYNC = 1, /* cudaMallocAsync / cudaFreeAsync (and _ptsz) */
  VMMSHIM_API_DRIVER = 2,        /* cuMemAlloc_v2 / cuMemFree_v2 (a static runtime's cudaMalloc lands here) */
  VMMSHIM_API_DRIVER_ASYNC = 3,  /* cuMemAllocAsync / cuMemFreeAsync (and _ptsz) */
  VMMSHIM_API_COUNT = 4
} vmmshim_api_t;

/* Process-wide counters, summed over every device and context. */
typedef struct vmmshim_stats_s {
  uint64_t allocs[VMMSHIM_API_COUNT];  /* allocations served from the pool, per API */
  uint64_t frees[VMMSHIM_API_COUNT];   /* frees of pool blocks, per API */
  uint64_t alloc_failures;             /* allocations that returned out-of-memory */
  uint64_t passthrough_allocs;         /* allocations handed to the real driver (capture, fallback) */
  uint64_t bytes_in_use;               /* bytes in live blocks (served sizes) */
  uint64_t peak_bytes_in_use;
  uint64_t bytes_requested_in_use;     /* bytes the program asked for, live */
  uint64_t bytes_mapped;               /* physical bytes mapped by all pools */
  uint64_t peak_bytes_mapped;
  uint64_t vmm_calls;                  /* cuMem{AddressReserve,Create,Map,SetAccess,Unmap,Release,AddressFree} */
  uint64_t vmm_ns;                     /* time spent inside those calls */
  uint64_t syncs;                      /* context synchronisations made for frees */
  uint64_t trims;                      /* handles released because they were idle */
  uint64_t pools;                      /* pools alive: one per context and arena in use */
} vmmshim_stats_t;

/* Fills *out (size = sizeof(vmmshim_stats_t)); returns 0, or -1 if size is wrong. */
int vmmshim_get_stats(vmmshim_stats_t *out, size_t size);

/* Unmaps and releases every pool handle that holds no live block (after waiting
 * for pending frees). Returns the number of bytes given back to the device. */
size_t vmmshim_trim(void);

/* 1 when the shim serves allocations in this process, 0 when it passes through. */
int vmmshim_active(void);

/* Writes the memory report to the shim's log (VMMSHIM_LOG's destination): per device and
 * heap, live and mapped memory, idle memory and why it is kept, pending frees, VMMSHIM_LIMIT,
 * what the driver reports free. The same report as at out-of-memory and on the signal
 * VMMSHIM_DUMP_SIGNAL. Returns 0, or -1 when the shim is not active. */
int vmmshim_dump(void);

#ifdef __cplusplus
}
#endif
#endif
