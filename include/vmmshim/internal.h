/* vmmshim internals: what the files of src/ call across each other.
 *
 * Vocabulary, outermost first; each name keeps this one meaning in every file:
 *   context slot  a CUDA context the shim has seen, its device's capabilities and its arenas (alloc.c)
 *   arena         one of a context's pools; threads that contend for one move to another (alloc.c)
 *   pool          an arena's sub-allocator: one lock, three heaps, a map from address to block (pool.c)
 *   heap          the part of a pool that serves one size range: small, large or whole (policy.h)
 *   reservation   a virtual address range a heap reserved (cuMemAddressReserve)
 *   handle        physical memory (cuMemCreate) mapped into a reservation; its mapping is a segment
 *   block         a range of a reservation: allocated (used), free, pending, a hole, or busy (pool.h)
 *
 * Data path, top to bottom:
 *   hook_rt.c  (cudaMalloc, cudaFree, cudaMallocAsync, ... exported by the shim)
 *   hook_drv.c (cuMemAlloc_v2, cuMemFree_v2, ..., cuGetProcAddress, dlsym)
 *        -> alloc.c  (entry points shared by both layers: context -> arena, errors, stats, trace)
 *        -> pool.c   (one arena; with pool_blocks.c, pool_streams.c, handles.c, reclaim.c, policy.h)
 *        -> vmm.c    (the only caller of cuMemAddressReserve/Create/Map/SetAccess/Unmap/Release/AddressFree)
 *   beside them: config.c (options), log.c (messages), trace.c with trace_format.c (allocation
 *   trace), clock.c (time), stats.c, directory.c (address -> arena, for frees), init.c, cuda.c. */
#ifndef VMMSHIM_INTERNAL_H
#define VMMSHIM_INTERNAL_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "vmmshim.h"
#include "vmmshim/policy.h"

/* Debug builds (-DVS_DEBUG=1, the CPU tests' sanitizer builds) check invariants: vs_assert
 * costs O(1); VS_DEBUG=2 adds the full pool check after every slow-path change. Release
 * builds compile them out. */
#ifndef VS_DEBUG
#define VS_DEBUG 0
#endif
#if VS_DEBUG
void _vs_assert_fail(const char *cond, const char *file, int line, const char *func) __attribute__((noreturn));
#define vs_assert(c) ((c) ? (void)0 : _vs_assert_fail(#c, __FILE__, __LINE__, __func__))
/* Locks of the shim held by this thread (pools, context slots): none may be held across a
 * driver call (vmm.c checks). */
extern _Thread_local int _vs_locks_held;
#define VS_LOCK_HELD(delta) ((void)(_vs_locks_held += (delta)))
#else
#define vs_assert(c) ((void)0)
#define VS_LOCK_HELD(delta) ((void)0)
#endif

#define vs_likely(x) __builtin_expect(!!(x), 1)
#define vs_unlikely(x) __builtin_expect(!!(x), 0)
#define VS_API __attribute__((visibility("default")))
/* For code a sanitizer's runtime reaches before it has initialised itself (it looks up the
 * functions it intercepts with dlsym, which the shim exports): no instrumentation there. */
#define VS_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))

/* ---------------------------------------------------------------- "config.c" */

#define VS_MAX_ARENAS 64 /* per context: threads that contend spread over at most this many pools */
#define VS_STR_(x) #x
#define VS_STR(x) VS_STR_(x)

typedef enum vs_free_mode_e { VS_FREE_SYNC = 0, VS_FREE_DEFERRED = 1 } vs_free_mode_t;
typedef enum vs_trace_format_e { VS_TRACE_NATIVE = 0, VS_TRACE_RMM = 1 } vs_trace_format_t;
typedef enum vs_python_mode_e { VS_PYTHON_OFF = 0, VS_PYTHON_HELD = 1, VS_PYTHON_ON = 2 } vs_python_mode_t;
typedef enum vs_peer_mode_e { VS_PEER_AUTO = 0, VS_PEER_ALL = 1, VS_PEER_NONE = 2 } vs_peer_mode_t;
typedef enum vs_unwind_e { VS_UNWIND_AUTO = 0, VS_UNWIND_LIBUNWIND = 1, VS_UNWIND_DWARF = 2, VS_UNWIND_FP = 3 } vs_unwind_t;

/* Defaults a build may override with -D. */
#ifndef VS_DEFAULT_GRANULARITY
#define VS_DEFAULT_GRANULARITY (64ull << 20)
#endif

/* One token per option: the enum name is VS_OPT_<token>, the variable VMMSHIM_<token>. */
#define VS_OPTIONS(X)                                                                       \
  X(DISABLE, VS_KIND_BOOL, 0)                    /* 1: pure pass-through */                 \
  X(GRANULARITY, VS_KIND_SIZE, VS_DEFAULT_GRANULARITY) /* largest shared handle, smallest whole request */ \
  X(MAX_HANDLE, VS_KIND_SIZE, 0)                 /* largest handle, 0 = unlimited */        \
  X(FREE_MODE, VS_KIND_FREE_MODE, VS_FREE_SYNC)  /* sync | deferred */                      \
  X(RELEASE_THRESHOLD, VS_KIND_SIZE_OR_UNLIMITED, UINT64_MAX) /* idle bytes kept mapped */  \
  X(LIMIT, VS_KIND_SIZE, 0)                      /* cap on mapped bytes, 0 = none */        \
  X(RESERVE, VS_KIND_SIZE, 0)                    /* VA per pool, 0 = auto */                \
  X(ARENAS, VS_KIND_ARENAS, 8)                   /* arenas per context (1..VS_MAX_ARENAS) */ \
  X(LOG, VS_KIND_LOG, 1)                         /* level[:file] */                         \
  X(STATS, VS_KIND_BOOL, 0)                      /* print stats at exit */                  \
  X(VERBOSE, VS_KIND_BOOL, 0)                    /* print version and options at start */   \
  X(TRACE, VS_KIND_STRING, 0)                    /* trace path, %p pid, %r rank */          \
  X(TRACE_FORMAT, VS_KIND_TRACE_FORMAT, VS_TRACE_NATIVE) /* native | rmm */                \
  X(TRACE_MAX, VS_KIND_SIZE, 0)                  /* trace file cap in bytes, 0 = none */    \
  X(DUMP_SIGNAL, VS_KIND_SIGNAL, SIGUSR2)        /* signal that writes the memory report, 0 off */ \
  X(TRACE_STACKS, VS_KIND_FRAMES, 0)             /* frames per traced allocation, 0 off */  \
  X(TRACE_STACKS_MIN, VS_KIND_SIZE, 0)           /* allocations this large always get one */ \
  X(TRACE_STACKS_SAMPLE, VS_KIND_SAMPLE, 1)      /* one in N smaller allocations gets one */ \
  X(TRACE_UNWIND, VS_KIND_UNWIND, VS_UNWIND_AUTO) /* auto | libunwind | dwarf | fp */        \
  X(TRACE_PYTHON, VS_KIND_PYTHON, VS_PYTHON_ON)  /* off | held | on: Python frames (pyframes.c) */ \
  X(PEER_ACCESS, VS_KIND_PEER, VS_PEER_AUTO)     /* auto | all | none */

typedef enum vs_option_kind_e {
  VS_KIND_BOOL,
  VS_KIND_SIZE,
  VS_KIND_SIZE_OR_UNLIMITED,
  VS_KIND_FREE_MODE,
  VS_KIND_ARENAS,
  VS_KIND_LOG,
  VS_KIND_STRING,
  VS_KIND_TRACE_FORMAT,
  VS_KIND_SIGNAL,
  VS_KIND_FRAMES, /* 0 .. 64 */
  VS_KIND_SAMPLE, /* 1 .. 1000000000 */
  VS_KIND_UNWIND,
  VS_KIND_PYTHON,
  VS_KIND_PEER
} vs_option_kind_t;

typedef enum vs_option_e {
#define VS_OPT_ENUM(tok, kind, def) VS_OPT_##tok,
  VS_OPTIONS(VS_OPT_ENUM)
#undef VS_OPT_ENUM
  VS_OPT_COUNT
} vs_option_t;

/* Reads every VMMSHIM_* variable once; safe to call many times (the first call wins). */
void _vs_config_init(void);
/* Hot-path getters: no parsing, no getenv. */
uint64_t _vs_option(vs_option_t opt);
const char *_vs_option_string(vs_option_t opt); /* STRING and LOG kinds: the text, or NULL */
void _vs_config_print(void);                   /* VMMSHIM_VERBOSE */
void _vs_config_report(void);                  /* warns about malformed values, once the log is open */
/* Parsers, exposed for tests. Return 0 on success, -1 on a malformed value. */
int _vs_parse_size(const char *text, uint64_t *out);
int _vs_parse_bool(const char *text, uint64_t *out);
int _vs_parse_signal(const char *text, uint64_t *out); /* "USR2", "SIGUSR2", "12"; "0"/"off": 0 */
/* Re-reads the environment (tests only). */
void _vs_config_reload(void);
/* Option i (0 .. VS_OPT_COUNT-1) as its messages word it, for the vmmshim(7) page: the variable,
 * the values it accepts and its default (written to buf). Returns -1 past the last option. */
int _vs_option_describe(int i, const char **name, const char **accepted, char *buf, size_t n);

/* ---------------------------------------------------------------- "log.c" */

typedef enum vs_log_level_e {
  VS_LOG_ERROR = 0,
  VS_LOG_WARN = 1,
  VS_LOG_INFO = 2, /* every mapping and access change */
  VS_LOG_DEBUG = 3 /* every allocation and free */
} vs_log_level_t;

extern int _vs_log_level; /* read without a lock on the hot path */
void _vs_log_open(const char *spec, vs_log_level_t *level_out); /* "info" or "debug:/tmp/x.log" */
void _vs_log(vs_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Always printed, prefixed "vmmshim: " (stats, verbose output, one-time notices). */
void _vs_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define VS_LOG_ON(level) vs_unlikely(_vs_log_level >= (level))
#define _vs_error(...) _vs_log(VS_LOG_ERROR, __VA_ARGS__)
#define _vs_warn(...) _vs_log(VS_LOG_WARN, __VA_ARGS__)
#define _vs_info(...) do { if (VS_LOG_ON(VS_LOG_INFO)) _vs_log(VS_LOG_INFO, __VA_ARGS__); } while (0)
#define _vs_debug(...) do { if (VS_LOG_ON(VS_LOG_DEBUG)) _vs_log(VS_LOG_DEBUG, __VA_ARGS__); } while (0)
/* "CUDA_ERROR_OUT_OF_MEMORY" for 2; never NULL, works before the driver is loaded. */
const char *_vs_cu_error_name(CUresult r);

/* ---------------------------------------------------------------- "cuda.c" */
/* The real driver entry points, resolved once through libcuda's cuGetProcAddress_v2.
 * The shim's own driver calls go through this table, never through its own hooks.
 * Each is looked up at the version whose ABI matches the prototype in cuda.h: asking
 * for a newer version can return a variant with other arguments (CUDA 13's
 * cuCtxSynchronize_v2 takes a context). */
#define VS_REAL_DRIVER(X)                                                                              \
  X(cuCtxGetCurrent, 4000, CUresult, (CUcontext *))                                                   \
  X(cuCtxSetCurrent, 4000, CUresult, (CUcontext))                                                     \
  X(cuCtxGetDevice, 2000, CUresult, (CUdevice *))                                                     \
  X(cuCtxSynchronize, 2000, CUresult, (void))                                                         \
  X(cuStreamSynchronize, 2000, CUresult, (CUstream))                                                  \
  X(cuCtxPushCurrent, 4000, CUresult, (CUcontext))                                                    \
  X(cuCtxPopCurrent, 4000, CUresult, (CUcontext *))                                                   \
  X(cuDevicePrimaryCtxRetain, 7000, CUresult, (CUcontext *, CUdevice))                                \
  X(cuDevicePrimaryCtxRelease, 11000, CUresult, (CUdevice))                                           \
  X(cuDeviceGetAttribute, 2000, CUresult, (int *, CUdevice_attribute, CUdevice))                      \
  X(cuDeviceTotalMem, 3020, CUresult, (size_t *, CUdevice))                                           \
  X(cuMemGetAllocationGranularity, 10020, CUresult,                                                   \
    (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))                        \
  X(cuMemAddressReserve, 10020, CUresult, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
  X(cuMemAddressFree, 10020, CUresult, (CUdeviceptr, size_t))                                         \
  X(cuMemCreate, 10020, CUresult,                                                                      \
    (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))         \
  X(cuMemRelease, 10020, CUresult, (CUmemGenericAllocationHandle))                                    \
  X(cuMemMap, 10020, CUresult, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
  X(cuMemUnmap, 10020, CUresult, (CUdeviceptr, size_t))                                               \
  X(cuMemSetAccess, 10020, CUresult, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))          \
  X(cuEventCreate, 2000, CUresult, (CUevent *, unsigned int))                                         \
  X(cuEventRecord, 2000, CUresult, (CUevent, CUstream))                                               \
  X(cuEventQuery, 2000, CUresult, (CUevent))                                                          \
  X(cuEventDestroy, 4000, CUresult, (CUevent))                                                        \
  X(cuStreamIsCapturing, 10000, CUresult, (CUstream, CUstreamCaptureStatus *))                        \
  X(cuStreamGetCtx, 9020, CUresult, (CUstream, CUcontext *))                                          \
  X(cuThreadExchangeStreamCaptureMode, 10010, CUresult, (CUstreamCaptureMode *))                     \
  X(cuGetErrorName, 6000, CUresult, (CUresult, const char **))                                        \
  X(cuMemGetInfo, 3020, CUresult, (size_t *, size_t *))

/* Functions the shim uses when the driver has them (multi-GPU and IPC support); NULL otherwise,
 * and what needs them is then not offered. */
#define VS_REAL_DRIVER_OPTIONAL(X)                                                                     \
  X(cuDeviceGetCount, 2000, CUresult, (int *))                                                        \
  X(cuDeviceCanAccessPeer, 4000, CUresult, (int *, CUdevice, CUdevice))                               \
  X(cuDeviceGetDefaultMemPool, 11020, CUresult, (CUmemoryPool *, CUdevice))                           \
  X(cuDeviceGetMemPool, 11020, CUresult, (CUmemoryPool *, CUdevice))                                  \
  X(cuMemExportToShareableHandle, 10020, CUresult,                                                    \
    (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))            \
  X(cuMemImportFromShareableHandle, 10020, CUresult,                                                  \
    (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))

typedef struct vs_real_driver_s {
#define VS_REAL_FIELD(name, ver, ret, args) ret(*name) args;
  VS_REAL_DRIVER(VS_REAL_FIELD)
  VS_REAL_DRIVER_OPTIONAL(VS_REAL_FIELD)
#undef VS_REAL_FIELD
} vs_real_driver_t;

extern vs_real_driver_t _vs_cu;
/* Loads libcuda.so.1 (already loaded in any CUDA program) and fills _vs_cu.
 * Returns 0, or -1 with a message when the driver or a required symbol is missing. */
int _vs_cuda_resolve(void);
/* libcuda's own cuGetProcAddress_v2 (NULL before _vs_cuda_resolve). */
typedef CUresult (*vs_get_proc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
extern vs_get_proc_v2_fn _vs_real_get_proc_v2;
/* glibc's dlsym (the shim exports its own dlsym, so a plain call would reach that). */
void *_vs_real_dlsym(void *handle, const char *symbol);

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
} vs_device_caps_t;

/* Queries the device's VMM support and granularity. */
CUresult _vs_vmm_query(CUdevice device, vs_device_caps_t *caps);
/* size > 0, multiple of caps->min_granularity; align 0 or a power of two. */
CUresult _vs_vmm_reserve(const vs_device_caps_t *caps, size_t size, size_t align, CUdeviceptr *va_out);
/* va and size exactly as reserved. */
CUresult _vs_vmm_address_free(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* Physical memory on caps->device, POSIX-fd shareable and RDMA-capable where supported. */
CUresult _vs_vmm_create(const vs_device_caps_t *caps, size_t size, CUmemGenericAllocationHandle *handle_out);
CUresult _vs_vmm_release(const vs_device_caps_t *caps, CUmemGenericAllocationHandle handle, size_t size);
/* Maps the whole handle at va (aligned to min granularity, inside a reservation, unmapped). */
CUresult _vs_vmm_map(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle);
/* va and size cover whole mappings. */
CUresult _vs_vmm_unmap(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* Read-write access for caps->device. */
CUresult _vs_vmm_set_access(const vs_device_caps_t *caps, CUdeviceptr va, size_t size);
/* Access for several devices in one call: caps->device read-write, the devices of bitmask rw
 * read-write, of ro read-only, of none no access (taken away). Logged with every device's flags. */
#define VS_MAX_DEVICES 64
CUresult _vs_vmm_set_access_devices(const vs_device_caps_t *caps, CUdeviceptr va, size_t size, uint64_t rw, uint64_t ro,
                                    uint64_t none);
/* A handle as a POSIX file descriptor (cuMemExportToShareableHandle), and back (the caller
 * closes the descriptor). CUDA_ERROR_NOT_SUPPORTED where the driver or device has no such handles. */
CUresult _vs_vmm_export(const vs_device_caps_t *caps, CUmemGenericAllocationHandle handle, int *fd_out);
CUresult _vs_vmm_import(int fd, CUmemGenericAllocationHandle *handle_out);

/* ---------------------------------------------------------------- "peer.c" */
/* The devices besides its owner that may access a context's pool memory (peer.c keeps it). */
typedef struct vs_access_state_s {
  _Atomic uint64_t rw, ro; /* device bitmasks: read-write, read-only */
  _Atomic uint64_t ever;   /* every device ever given access (to take it away again) */
  atomic_uint gen;         /* bumped on every change */
} vs_access_state_t;

typedef struct vs_pool_s vs_pool_t;

/* The state of a context (created on first use; NULL when the table is full, or with
 * VMMSHIM_PEER_ACCESS=none: the owner alone, nothing to follow). */
const vs_access_state_t *_vs_peer_state(CUcontext ctx, int dev);
/* The context is going away: its state, and the grants it made to others (their pools lose its
 * device, as the driver drops them). */
void _vs_peer_forget(CUcontext ctx);
/* The current context enabled (or disabled) peer access to `peer`: peer's memory gains (loses)
 * the current device. Called after the driver said yes. */
void _vs_peer_access_changed(CUcontext peer, bool enabled);
/* A growth records its new mappings between these (peer.c's lock: no change is being applied
 * meanwhile). Rare driver calls only, never an allocation's fast path. */
void _vs_peer_growth_begin(void);
void _vs_peer_growth_end(void);
/* cuMemPoolSetAccess succeeded: when `pool` is a device's current or default pool, its peers'
 * access to the shim's memory on that device follows. */
void _vs_mempool_access_changed(CUmemoryPool pool, const CUmemAccessDesc *desc, size_t count);

/* ---------------------------------------------------------------- "ipc.c" */
/* Each returns false when the call is not the shim's to answer (the driver's then), true with
 * *err set when it is. */
extern atomic_int _vs_ipc_exports; /* exports alive: frees look at ipc.c only when there are any */
bool _vs_ipc_get_handle(CUdeviceptr ptr, CUipcMemHandle *out, CUresult *err);
bool _vs_ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, CUresult *err);
bool _vs_ipc_close(CUdeviceptr ptr, CUresult *err);
/* The program frees an exported block. HELD: an importer still has it open (the block stays out
 * of the pool until the last one closes; the free counts now). TWICE: it was freed already (and is
 * still held): not a live allocation. NOW: free it as usual (its handle is stale from now on). */
typedef enum vs_ipc_free_e { VS_IPC_FREE_NOW = 0, VS_IPC_FREE_HELD = 1, VS_IPC_FREE_TWICE = 2 } vs_ipc_free_t;
vs_ipc_free_t _vs_ipc_on_free(CUdeviceptr ptr, vmmshim_api_t api);
/* The pool's context is going away: its exports are forgotten (before the pool is destroyed). */
void _vs_ipc_forget_pool(vs_pool_t *pool);

/* ---------------------------------------------------------------- "pool.c" */

typedef enum vs_pool_status_e {
  VS_POOL_OK = 0,
  VS_POOL_OOM = 1,       /* the device (or VMMSHIM_LIMIT) has no room, after releasing idle memory */
  VS_POOL_LIMIT = 2,     /* over VMMSHIM_LIMIT */
  VS_POOL_NOT_OWNED = 3, /* the pointer is not the start of a live block of this pool */
  VS_POOL_ERROR = 4      /* a driver error other than out-of-memory */
} vs_pool_status_t;

/* A new pool for the current context (ctx on device dev). NULL with a message on failure. */
vs_pool_t *_vs_pool_create(CUcontext ctx, const vs_device_caps_t *caps);
/* Unmaps, releases and frees everything (the context is going away). */
void _vs_pool_destroy(vs_pool_t *pool);
/* stream: CU_STREAM_LEGACY-like sentinel VS_NO_STREAM for synchronous allocations. */
#define VS_NO_STREAM ((CUstream)(uintptr_t)UINTPTR_MAX)
/* *contended is set when the pool's lock was held by another thread at the first try. */
vs_pool_status_t _vs_pool_alloc(vs_pool_t *pool, size_t size, CUstream stream, vmmshim_api_t api,
                                CUdeviceptr *ptr_out, size_t *served_out, CUresult *cu_err, bool *contended);
/* Frees a block. For VS_NO_STREAM, the free mode decides (sync: the context is synchronised
 * first; deferred: the block is reused after a later synchronisation). */
vs_pool_status_t _vs_pool_free(vs_pool_t *pool, CUdeviceptr ptr, CUstream stream, vmmshim_api_t api,
                               size_t *size_out, size_t *requested_out, CUresult *err_out);
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
CUcontext _vs_pool_context(const vs_pool_t *pool);
int _vs_pool_device(const vs_pool_t *pool);
/* Debug check that map, bins and block list agree; returns the number of problems found. */
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

/* ---------------------------------------------------------------- "directory.c" */
/* Address -> owning pool, over every reservation of every pool; lock-free lookups. */
int _vs_dir_add(CUdeviceptr va, size_t size, vs_pool_t *pool); /* -1 when full */
void _vs_dir_remove_pool(vs_pool_t *pool);
vs_pool_t *_vs_dir_lookup(CUdeviceptr addr); /* NULL: no pool reserved this address */

/* ---------------------------------------------------------------- "alloc.c" */
/* Entry points shared by the runtime and driver hooks. They return CUresult values;
 * the runtime hooks translate them. A non-owned pointer is reported, not touched. */
extern atomic_int _vs_state; /* 0 not initialised, 1 active, 2 pass-through */
bool _vs_active(void);       /* initialises on first call */
/* Thread-local guard: set while the shim calls into the real runtime or driver, so that
 * the hooks reached from there pass through. */
extern _Thread_local int _vs_guard;

typedef enum vs_alloc_result_e {
  VS_ALLOC_SERVED = 0,    /* *ptr is a pool block */
  VS_ALLOC_PASS = 1,      /* not for the shim: call the real function */
  VS_ALLOC_FAILED = 2,    /* out of memory: *err says which error to return */
  VS_ALLOC_NO_CONTEXT = 3 /* no current context: the runtime must initialise one first */
} vs_alloc_result_t;

vs_alloc_result_t _vs_alloc(vmmshim_api_t api, size_t size, CUstream stream, CUdeviceptr *ptr, CUresult *err);
/* Returns true if ptr belonged to the shim and was freed (or queued); false: pass through.
 * *err: CUDA_SUCCESS, or the error of the synchronisation a sync-mode free made. */
bool _vs_free(vmmshim_api_t api, CUdeviceptr ptr, CUstream stream, CUresult *err);
/* Lookup for cuMemGetAddressRange / cuPointerGetAttribute. */
bool _vs_lookup_range(CUdeviceptr addr, CUdeviceptr *base, size_t *size);
/* Idle bytes of the current context's pool and the cap, for cuMemGetInfo. */
void _vs_adjust_mem_info(size_t *free_bytes, size_t *total_bytes);
/* Active stream captures in the process, kept by the cuStreamBeginCapture/EndCapture hooks. */
extern atomic_int _vs_captures_active;
void _vs_stream_destroyed(CUstream stream);
/* Drop the pools of a context that is being destroyed or reset (ctx NULL: all of device dev). */
void _vs_drop_context(CUcontext ctx, int dev);
size_t _vs_trim_all(void);
/* Calls fn for every arena of every live context (rare paths: reports, trims). */
void _vs_visit_pools(void (*fn)(vs_pool_t *pool, void *arg), void *arg);
/* Moves the calling thread to arena idx (mod VMMSHIM_ARENAS); contention does it by itself. */
void _vs_arena_select(unsigned idx);

/* ---------------------------------------------------------------- "stats.c" */
/* Rare events (mappings, syncs, trims, failures): shared relaxed atomics. */
extern vmmshim_stats_t _vs_stats_data;
#define VS_STAT_ADD(field, n) __atomic_fetch_add(&_vs_stats_data.field, (uint64_t)(n), __ATOMIC_RELAXED)
#define VS_STAT_SUB(field, n) __atomic_fetch_sub(&_vs_stats_data.field, (uint64_t)(n), __ATOMIC_RELAXED)
void _vs_stat_peak(uint64_t *peak, uint64_t value);
/* Per-allocation counters: written to the calling thread's own block, no shared write. */
void _vs_stat_alloc(vmmshim_api_t api, size_t served, size_t requested);
void _vs_stat_free(vmmshim_api_t api, size_t served, size_t requested);
void _vs_stat_drop(size_t served, size_t requested); /* live blocks of a dropped pool */
void _vs_stats_print(void);

/* ---------------------------------------------------------------- "trace.c" */
typedef enum vs_vmm_op_e {
  VS_VMM_RESERVE = 0,
  VS_VMM_CREATE = 1,
  VS_VMM_MAP = 2,
  VS_VMM_SET_ACCESS = 3,
  VS_VMM_UNMAP = 4,
  VS_VMM_RELEASE = 5,
  VS_VMM_ADDRESS_FREE = 6
} vs_vmm_op_t;

extern int _vs_trace_on; /* checked inline before any trace call */
void _vs_trace_open(void); /* after config: opens VMMSHIM_TRACE, writes the header */
void _vs_trace_alloc(vmmshim_api_t api, size_t requested, size_t served, CUdeviceptr ptr, CUstream stream, int device);
void _vs_trace_free(vmmshim_api_t api, CUdeviceptr ptr, size_t served, CUstream stream, int device);
/* A free's record in two steps: its place in the file is taken under the pool lock (before
 * the block can reach another thread), the record filled in after the unlock, so the lock
 * is held for one atomic add. The thread traces nothing in between. */
typedef struct vs_trace_place_s {
  void *rec; /* NULL: tracing was off */
  uint64_t pos;
} vs_trace_place_t;
vs_trace_place_t _vs_trace_place(void);
void _vs_trace_free_at(vs_trace_place_t at, vmmshim_api_t api, CUdeviceptr ptr, size_t served, CUstream stream,
                       int device);
void _vs_trace_alloc_fail(vmmshim_api_t api, size_t requested, CUstream stream, int device, CUresult err);
void _vs_trace_vmm(vs_vmm_op_t op, CUdeviceptr va, size_t size, uint64_t handle, unsigned access_flags,
                   int device, CUresult result, uint64_t duration_ns);
void _vs_trace_flush(void);
void _vs_trace_close(void);

/* ---------------------------------------------------------------- "report.c" */
/* The shim answered out-of-memory: the memory report at warn level, once per burst. */
void _vs_report_oom(vmmshim_api_t api, size_t size, int dev, bool limit_reached);
/* Installs the VMMSHIM_DUMP_SIGNAL handler (at init; no CUDA). */
void _vs_report_init(void);

/* ---------------------------------------------------------------- "init.c" */
void _vs_init_once(void); /* config, log, trace, atexit; no CUDA */
/* Starts a detached thread of the shim with every signal blocked (the program's signals stay
 * with its own threads); pthread_create's result. */
int _vs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg);

/* ---------------------------------------------------------------- "clock.c" */
uint64_t _vs_now_ns(void); /* CLOCK_MONOTONIC ns; the trace's raw clock is in vmmshim/clock.h */

#endif
