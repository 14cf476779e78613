/* vmmshim pool layer API (src/pool/): what the layers above call. The pool's own types are in
 * vmmshim/pool_internal.h, for src/pool/ alone. */
#ifndef VMMSHIM_POOL_H
#define VMMSHIM_POOL_H

#include "vmmshim/handles.h"

/* ---------------------------------------------------------------- "pool.c" */

typedef enum vs_pool_status_e {
  VS_POOL_OK = 0,
  VS_POOL_OOM = 1,       /* the device (or VMMSHIM_LIMIT) has no room, after releasing idle memory */
  VS_POOL_LIMIT = 2,     /* over VMMSHIM_LIMIT */
  VS_POOL_NOT_OWNED = 3, /* the pointer is not the start of a live block of this pool */
  VS_POOL_ERROR = 4,     /* a driver error other than out-of-memory */
  VS_POOL_EXPORTED = 5   /* a free of a block marked exported: not freed (its sizes given) */
} vs_pool_status_t;

/* A new pool for the current context (ctx on device caps->device); access: the peers that may
 * access its memory (peer.c's state of ctx; NULL: the owner alone). NULL with a message on
 * failure. Its tag is 0 until _vs_pool_set_tag. */
vs_pool_t *_vs_pool_create(CUcontext ctx, const vs_device_caps_t *caps, const vs_access_state_t *access);
/* Unmaps, releases and frees everything (the context is going away). */
void _vs_pool_destroy(vs_pool_t *pool);
/* *contended is set when the pool's lock was held by another thread at the first try. */
vs_pool_status_t _vs_pool_alloc(vs_pool_t *pool, size_t size, CUstream stream, vmmshim_api_t api,
                                CUdeviceptr *ptr_out, size_t *served_out, CUresult *cu_err, bool *contended);
/* VMMSHIM_ON_LIMIT=host: serves the request from host memory mapped at the pool's addresses (a
 * growth past the limit: the program keeps running on it, over the link), or fails with the
 * reason in *cu_err (CUDA_ERROR_OUT_OF_MEMORY past host:SIZE or VMMSHIM_HOST_LIMIT,
 * CUDA_ERROR_NOT_SUPPORTED where the device cannot map host memory). *grown_out: the host bytes
 * mapped for it (0 when free memory served it). */
vs_pool_status_t _vs_pool_alloc_host(vs_pool_t *pool, size_t size, CUstream stream, CUdeviceptr *ptr_out,
                                     size_t *served_out, CUresult *cu_err, size_t *grown_out);
/* How a free lets its block go. The allocation layer decides it once per free (alloc.c: from
 * the stream, the free mode and the one-stream order) and tells the pool. */
typedef enum vs_free_kind_e {
  VS_FREE_KIND_SYNC = 0,     /* cudaFree, sync mode: the context is synchronised first, then the
                                block is free at once (a sync that fails or would break a capture:
                                pending until a later one) */
  VS_FREE_KIND_DEFERRED = 1, /* cudaFree, deferred mode: pending until a context synchronisation
                                that began after it completes (the reclaimer makes one) */
  VS_FREE_KIND_ORDERED = 2,  /* cudaFree, deferred mode, all GPU work on one stream (order.c): free
                                at once; its handle is unmapped only after a synchronisation that
                                began after the free */
  VS_FREE_KIND_STREAM = 3    /* cudaFreeAsync: free at once for the stream's later work, for
                                other streams after an event recorded on it */
} vs_free_kind_t;
/* Frees a block as kind says; stream: the free's stream for VS_FREE_KIND_STREAM, VS_NO_STREAM
 * for every other kind. A block marked exported is not freed: VS_POOL_EXPORTED (the caller asks
 * IPC, which unmarks it or keeps it). */
vs_pool_status_t _vs_pool_free(vs_pool_t *pool, CUdeviceptr ptr, vs_free_kind_t kind, CUstream stream,
                               vmmshim_api_t api, size_t *size_out, size_t *requested_out, CUresult *err_out);
/* The same for a block marked exported (IPC gives back a block freed while open elsewhere):
 * freed as a cudaFree of the free mode (sync or deferred), long after the program's free. */
vs_pool_status_t _vs_pool_free_exported(vs_pool_t *pool, CUdeviceptr ptr, vmmshim_api_t api, size_t *size_out,
                                        size_t *requested_out, CUresult *err_out);
/* Marks the live block starting at ptr as exported (or not): one flag, so that a free pays
 * nothing for IPC unless its block is shared. false when ptr starts no live block. */
bool _vs_pool_set_exported(vs_pool_t *pool, CUdeviceptr ptr, bool exported);
/* The live block holding addr (interior pointers too). Returns false if none. */
bool _vs_pool_range(vs_pool_t *pool, CUdeviceptr addr, CUdeviceptr *base_out, size_t *size_out);
/* The live block starting at ptr: its served and requested sizes. */
bool _vs_pool_block(vs_pool_t *pool, CUdeviceptr ptr, size_t *served_out, size_t *requested_out);
/* Bytes mapped by all pools together. */
size_t _vs_mapped_total(void);
/* Sets access on every mapping of the pool: the owner and rw read-write, ro read-only, none
 * taken away. Lock not held (snapshots the mappings, calls the driver without it). */
void _vs_pool_set_access(vs_pool_t *pool, uint64_t rw, uint64_t ro, uint64_t none);
/* The physical handles under the live block at ptr (for IPC): their handles and sizes, back to
 * back, and the block's offset in the first. VS_POOL_NOT_OWNED when ptr does not start a live
 * block (or it lies on more than max handles). */
vs_pool_status_t _vs_pool_handles_of(vs_pool_t *pool, CUdeviceptr ptr, size_t *offset_out,
                                     CUmemGenericAllocationHandle *handles, size_t *sizes, int max, int *n_out);
const vs_device_caps_t *_vs_pool_caps(const vs_pool_t *pool);
/* Called when a stream is about to be destroyed: its pending blocks get an event. */
void _vs_pool_stream_destroyed(vs_pool_t *pool, CUstream stream);
/* Idle mapped bytes (mapped but not in a live block). */
size_t _vs_pool_idle_bytes(vs_pool_t *pool);
/* Synchronises the pool's context (which must be current) so that pending frees become idle. */
CUresult _vs_pool_reclaim(vs_pool_t *pool);
/* Unmaps and releases whole idle handles until at most keep_bytes idle bytes remain; returns
 * the bytes released. */
size_t _vs_pool_trim(vs_pool_t *pool, size_t keep_bytes);
/* The same, releasing only handles that leave at least keep_bytes idle bytes (as
 * cuMemPoolTrimTo keeps at least what it is asked to keep). */
size_t _vs_pool_trim_exact(vs_pool_t *pool, size_t keep_bytes);

/* The device's stream-ordered allocator, as the driver's pool attributes describe it
 * (cuMemPoolGetAttribute on the device's default pool; the layer above sums the device's
 * pools). A pool's memory serves cudaMalloc and cudaMallocAsync alike: the "reserve" of the
 * stream-ordered allocator is what the pool maps minus what live synchronous allocations
 * (cudaMalloc, cuMemAlloc) hold, i.e. what stream-ordered allocations hold or could be given. */
typedef struct vs_pool_usage_s {
  size_t reserved, reserved_high; /* mapped minus live synchronous blocks; its high watermark */
  size_t used, used_high;         /* bytes asked for by live blocks allocated on a stream, as the
                                     driver counts them; its high watermark */
  size_t idle;                    /* free bytes (the part of the reserve trimming may give back) */
} vs_pool_usage_t;
void _vs_pool_usage(vs_pool_t *pool, vs_pool_usage_t *out);
/* Resets the high watermarks to the current values (setting them to 0, as the driver does). */
void _vs_pool_reset_high(vs_pool_t *pool, bool reserved, bool used);
/* The release threshold a program set on device dev's default pool (cuMemPoolSetAttribute,
 * CU_MEMPOOL_ATTR_RELEASE_THRESHOLD): each pool of the device gives back whole idle handles
 * while its reserve is above it, at each free as with VMMSHIM_RELEASE_THRESHOLD (the lower of
 * the two binds). UINT64_MAX (the value before any is set) holds everything. */
void _vs_pool_set_release_threshold(int dev, uint64_t bytes);
/* Gives back, now, the idle memory that the thresholds allow no more; returns the bytes released. */
size_t _vs_pool_apply_release_threshold(vs_pool_t *pool);
CUcontext _vs_pool_context(const vs_pool_t *pool);
int _vs_pool_device(const vs_pool_t *pool);
/* Debug check that map, bins and block list agree (check.c); returns the number of problems found. */
int _vs_pool_check(vs_pool_t *pool);
/* What a pool holds, per heap (small, large), for the memory report. */
typedef struct vs_pool_figures_s {
  size_t mapped[VS_NHEAPS], live[VS_NHEAPS], idle[VS_NHEAPS], pending[VS_NHEAPS];
  size_t idle_whole;  /* idle bytes in handles that no live or pending block touches */
  size_t live_blocks; /* blocks the program holds */
  size_t requested;   /* bytes it asked for in them */
  size_t handles;
} vs_pool_figures_t;
void _vs_pool_figures(vs_pool_t *pool, vs_pool_figures_t *out);
/* *sum += f, field by field: figures of several pools (a device's) added up. */
void _vs_pool_figures_add(vs_pool_figures_t *sum, const vs_pool_figures_t *f);
/* A figure's heaps added up. */
static inline size_t vs_heaps_sum(const size_t v[VS_NHEAPS]) {
  size_t n = 0;
  for (int h = 0; h < VS_NHEAPS; h++) n += v[h];
  return n;
}

/* ---------------------------------------------------------------- "sleep.c", "wake.c", "asleep.c" */
/* What a sleep or a wake moved (bytes). */
typedef struct vs_move_s {
  size_t released;    /* device memory given back */
  size_t to_host;     /* sleep: copied to host memory (host and mapped modes); wake: copied back */
  size_t host_mapped; /* of which now served from host memory at its own address (mapped mode) */
  size_t discarded;   /* not kept (discard mode) */
  size_t skipped;     /* left on the device, why_skipped says why */
  size_t restored;    /* wake: device memory mapped again */
  size_t dropped;     /* promote: host memory under no live block, given back instead of moved */
  CUresult err;       /* the first failure, why says what it stopped */
  int errnum;         /* disk mode: the errno of a file that failed (err is then CUDA_ERROR_UNKNOWN) */
  const char *why, *why_skipped;
} vs_move_t;

/* Sleeps the pool: its idle whole handles are given back, then every mapped segment that does
 * not overlap a skip range leaves the device by mode (VMMSHIM_SLEEP_DISCARD, _HOST, _MAPPED,
 * _DISK: into a file named for `tag`, all or nothing). The pool's context is current and the GPU
 * work that may touch it is done; the pool serves no allocation meanwhile. One sleep or wake at a
 * time (the caller's lock). Lock not held. */
void _vs_pool_sleep(vs_pool_t *pool, int mode, const char *tag, const CUdeviceptr *skip_va, const size_t *skip_len,
                    int nskip, vs_move_t *out);
/* Wakes every asleep segment at its address (zero: discarded bytes come back as zeros). When
 * the device has no room nothing changes: CUDA_ERROR_OUT_OF_MEMORY, the pool still asleep. */
CUresult _vs_pool_wake(vs_pool_t *pool, bool zero, vs_move_t *out);
/* Moves the growths served from host memory past the limit (VMMSHIM_ON_LIMIT=host) into device
 * memory at the same addresses, as many as the limit and the device have room for (the others
 * stay on the host, counted as skipped); those under no live block are given back instead. The
 * pool's context is current and no GPU work touches them. CUDA_ERROR_OUT_OF_MEMORY when none
 * could move. */
CUresult _vs_pool_promote(vs_pool_t *pool, vs_move_t *out);
/* Gives back the host memory of growths past the limit that no block uses; returns the bytes. */
size_t _vs_pool_drop_idle_spilled(vs_pool_t *pool);
/* Whether part of the pool is asleep (growths on the host past the limit are not asleep); its
 * bytes, and those served from host memory at their addresses. */
bool _vs_pool_asleep(vs_pool_t *pool, size_t *bytes, size_t *host_mapped);
/* Whether addr lies in host memory mapped at its own address (mapped mode). */
bool _vs_pool_host_mapped_at(vs_pool_t *pool, CUdeviceptr addr);
/* Where the bytes at addr are while its segment sleeps in host or mapped mode: the address in
 * the host buffer that holds them (its home mapping, which the device reads) and how many bytes
 * follow there, to the buffer's end. False when addr is not asleep with its bytes kept. */
bool _vs_pool_host_copy_at(vs_pool_t *pool, CUdeviceptr addr, CUdeviceptr *home, size_t *len);
/* Where the CPU reads [addr, addr + size) of memory asleep in host or mapped mode, in place:
 * 0 and *home (an address of one host buffer, CPU-accessible), -ENOENT when addr is not asleep
 * in this pool, -EXDEV when its bytes are discarded, on disk, or not in one buffer, -ENOTSUP
 * when the buffer is mapped for the device only. */
int _vs_pool_host_view(vs_pool_t *pool, CUdeviceptr addr, size_t size, CUdeviceptr *home);
typedef struct vs_sleep_figures_s {
  size_t live;        /* bytes in live blocks */
  size_t device;      /* mapped on the device */
  size_t host_copied, host_mapped, discarded; /* asleep, by mode */
  size_t spilled;     /* of host_mapped: growths past the limit, awake */
  size_t disk;        /* asleep in a file (disk mode) */
} vs_sleep_figures_t;
void _vs_pool_sleep_figures(vs_pool_t *pool, vs_sleep_figures_t *f);
/* The tag of the pool's blocks (the alloc layer's index): set once, before it serves. */
void _vs_pool_set_tag(vs_pool_t *pool, int tag);
int _vs_pool_tag(const vs_pool_t *pool);

#endif
