/* vmmshim base layer: what every layer of src/ may call (the files of src/base).
 *
 * The layers, top to bottom (docs/design.md; tests/scripts/test_layers.py checks that every
 * call and include goes down, never up):
 *   hook    src/hook/    the entry points a program reaches: cudaMalloc, cuMemAlloc_v2, ...
 *   alloc   src/alloc/   the current context's arena, stats and trace of each allocation
 *   share   src/share/   beside the pool: IPC, peer access, the memory report
 *   pool    src/pool/    one arena's sub-allocator (pool.c -> reclaim.c -> space.c -> streams -> blocks)
 *   handle  src/handle/  the physical handles mapped into a pool, and what they may be accessed by
 *   vmm     src/vmm/     the only caller of the driver's VMM functions
 *   base    src/base/    options, log, trace, clock, stats, the real driver's entry points, the
 *                        address directory, initialisation
 * Each layer's header: vmmshim/base.h, vmm.h, handles.h, pool.h, share.h, alloc.h.
 *
 * Vocabulary, outermost first; each name keeps this one meaning in every file:
 *   context slot  a CUDA context the shim has seen, its device's capabilities and its arenas (alloc.c)
 *   arena         one of a context's pools; threads that contend for one move to another (alloc.c)
 *   pool          an arena's sub-allocator: one lock, three heaps, a map from address to block (pool.c)
 *   heap          the part of a pool that serves one size range: small, large or whole (policy.h)
 *   reservation   a virtual address range a heap reserved (cuMemAddressReserve)
 *   handle        physical memory (cuMemCreate) mapped into a reservation; its mapping is a segment
 *   block         a range of a reservation: allocated (used), free, pending, a hole, or busy (pool_internal.h) */
#ifndef VMMSHIM_BASE_H
#define VMMSHIM_BASE_H

#include <pthread.h>
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
/* Counted locks of the shim held by this thread (lock.h: pools, context slots, IPC, the peer
 * table, ...): none may be held across a driver call (vmm.c checks). vs_lock_t counts itself
 * (lock.c). */
extern _Thread_local int _vs_locks_held;
#define VS_LOCK_HELD(delta) ((void)(_vs_locks_held += (delta)))
#else
#define vs_assert(c) ((void)0)
#define VS_LOCK_HELD(delta) ((void)0)
#endif

#include "vmmshim/lock.h" /* every mutex of src/ is a vs_lock_t, ranked in one lock order */

#define vs_likely(x) __builtin_expect(!!(x), 1)
#define vs_unlikely(x) __builtin_expect(!!(x), 0)
#define VS_API __attribute__((visibility("default")))
/* For code a sanitizer's runtime reaches before it has initialised itself (it looks up the
 * functions it intercepts with dlsym, which the shim exports): no instrumentation there. */
#define VS_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))

/* Pools are opaque outside src/pool/ (vmmshim/pool.h). */
typedef struct vs_pool_s vs_pool_t;
/* The stream of a synchronous allocation or free (cudaMalloc, cudaFree): none. */
#define VS_NO_STREAM ((CUstream)(uintptr_t)UINTPTR_MAX)

/* ---------------------------------------------------------------- "config.c" */

#define VS_MAX_ARENAS 64 /* per context: threads that contend spread over at most this many pools */
#define VS_STR_(x) #x
#define VS_STR(x) VS_STR_(x)

typedef enum vs_free_mode_e { VS_FREE_SYNC = 0, VS_FREE_DEFERRED = 1 } vs_free_mode_t;
typedef enum vs_trace_format_e { VS_TRACE_NATIVE = 0, VS_TRACE_RMM = 1 } vs_trace_format_t;
typedef enum vs_python_mode_e { VS_PYTHON_OFF = 0, VS_PYTHON_HELD = 1, VS_PYTHON_ON = 2 } vs_python_mode_t;
typedef enum vs_peer_mode_e { VS_PEER_AUTO = 0, VS_PEER_ALL = 1, VS_PEER_NONE = 2 } vs_peer_mode_t;
typedef enum vs_unwind_e { VS_UNWIND_AUTO = 0, VS_UNWIND_LIBUNWIND = 1, VS_UNWIND_DWARF = 2, VS_UNWIND_FP = 3 } vs_unwind_t;
/* VMMSHIM_ON_LIMIT: what an allocation does when the limit refuses it (docs/limits.md). */
typedef enum vs_on_limit_e {
  VS_ON_LIMIT_FAIL = 0,
  VS_ON_LIMIT_WAIT = 1,
  VS_ON_LIMIT_HOST = 2,
  VS_ON_LIMIT_BALLOON = 3 /* lower-priority members of the group move cold tags out (balloon.c) */
} vs_on_limit_t;
#define VS_LIMIT_DEVICES 16 /* devices VMMSHIM_LIMIT can name one by one (D:SIZE) */
#define VS_LIMIT_DEVICE_LAST 15 /* the last of them, as the messages write it */
_Static_assert(VS_LIMIT_DEVICE_LAST == VS_LIMIT_DEVICES - 1, "VS_LIMIT_DEVICE_LAST");

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
  X(LIMIT, VS_KIND_LIMIT, 0)                     /* cap on mapped bytes: SIZE and/or D:SIZE, 0 = none */ \
  X(LIMIT_GROUP, VS_KIND_NAME, 0)                /* processes of this name and user share VMMSHIM_LIMIT */ \
  X(ON_LIMIT, VS_KIND_ON_LIMIT, VS_ON_LIMIT_FAIL) /* fail | wait[:SECONDS] | host[:SIZE] | balloon[:SECONDS] */ \
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
  X(PEER_ACCESS, VS_KIND_PEER, VS_PEER_AUTO)     /* auto | all | none */            \
  X(TAG, VS_KIND_TAG, 0)                         /* tag of new allocations at start ("untagged") */ \
  X(HOST_LIMIT, VS_KIND_SIZE, 0)                 /* cap on host memory of sleeping tags, 0 = none */ \
  X(HOST_RESERVE, VS_KIND_SIZE, 0)               /* host memory made ahead for sleeps */ \
  X(WAKE_MERGE, VS_KIND_SIZE, 1ull << 30)         /* largest handle a wake makes of neighbouring segments */ \
  X(SLEEP_WAIT, VS_KIND_SAMPLE, 10000)           /* ms a sleep waits for a capture to end */ \
  X(IPC_TIMEOUT, VS_KIND_SECONDS, 10)            /* longest wait of an IPC open, and of a request */ \
  X(CONTROL, VS_KIND_BOOL, 1)                    /* 0: no control channel (vmmshim ctl, top) */ \
  X(ONE_STREAM, VS_KIND_BOOL, 1)                 /* deferred mode: frees reused at once while all work is on one stream */ \
  X(DISK_DIR, VS_KIND_STRING, 0)                 /* directory of disk-mode sleep files ($TMPDIR, else /tmp) */ \
  X(STITCH, VS_KIND_BOOL, 0)                     /* 1: growth maps idle handles side by side before new ones */ \
  X(TAG_RULES, VS_KIND_RULES, 0)                 /* TAG=MATCHER;...: tags by library, Python file, site, phase (rules.c) */ \
  X(PRIORITY, VS_KIND_PRIORITY, 0)               /* a group member's priority, 0 .. 1000: higher borrows from lower */ \
  X(COLD_TAGS, VS_KIND_COLD_TAGS, 0)               /* TAG[:MODE],...: tags lent first when a higher member needs room */ \
  X(SLEEP_FOREIGN, VS_KIND_LIBS, 0)              /* none | all | library globs: their own VMM memory sleeps too */

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
  VS_KIND_PEER,
  VS_KIND_TAG,      /* a tag name (vmmshim.h): 1-31 of A-Z a-z 0-9 _ . - */
  VS_KIND_SECONDS,  /* 1 .. 3600 */
  VS_KIND_LIMIT,    /* SIZE (every device together) and/or D:SIZE (device D), comma-separated */
  VS_KIND_NAME,     /* a group name: 1-31 of A-Z a-z 0-9 _ . - */
  VS_KIND_ON_LIMIT, /* fail, wait[:SECONDS], host[:SIZE], balloon[:SECONDS]: the mode, its number in _vs_option_arg */
  VS_KIND_PRIORITY, /* 0 .. 1000 */
  VS_KIND_COLD_TAGS, /* TAG[:MODE] items, comma-separated (MODE mapped, host or discard) */
  VS_KIND_RULES,     /* tag rules: non-empty text, parsed by src/alloc/rules.c at first use */
  VS_KIND_LIBS       /* none, all, or comma-separated globs of library file names */
} vs_option_kind_t;

typedef enum vs_option_e {
#define VS_OPT_ENUM(tok, kind, def) VS_OPT_##tok,
  VS_OPTIONS(VS_OPT_ENUM)
#undef VS_OPT_ENUM
  VS_OPT_COUNT
} vs_option_t;

/* The largest VMMSHIM_GRANULARITY, VMMSHIM_MAX_HANDLE and VMMSHIM_RESERVE taken (1 PiB): the pool
 * rounds them up, and nothing near 2^64 may wrap there. Larger values get the default. */
#define VS_SIZE_OPTION_MAX (1ull << 50)
/* Reads every VMMSHIM_* variable once; safe to call many times (the first call wins). */
void _vs_config_init(void);
/* Hot-path getters: no parsing, no getenv. */
uint64_t _vs_option(vs_option_t opt);
const char *_vs_option_string(vs_option_t opt); /* STRING, LOG, TAG, NAME, LIMIT, COLD_TAGS, RULES kinds: the text, or NULL */
uint64_t _vs_option_arg(vs_option_t opt);       /* ON_LIMIT: the SECONDS of wait and balloon, the SIZE of host (0: none given) */
/* What VMMSHIM_LIMIT says for device dev (dev < 0: every device together); 0 = no cap. */
uint64_t _vs_limit_setting(int dev);
/* Whether VMMSHIM_LIMIT belongs to the budget of the handle layer (src/handle/group.c): with
 * VMMSHIM_LIMIT_GROUP, a per-device cap, or VMMSHIM_ON_LIMIT=wait. _vs_option(VS_OPT_LIMIT), the
 * cap of this process alone, is then 0. */
bool _vs_limit_in_budget(void);
void _vs_config_print(void);                   /* VMMSHIM_VERBOSE */
void _vs_config_report(void);                  /* warns about malformed values, once the log is open */
/* Parsers, exposed for tests. Return 0 on success, -1 on a malformed value. */
int _vs_parse_size(const char *text, uint64_t *out);
int _vs_parse_bool(const char *text, uint64_t *out);
int _vs_parse_signal(const char *text, uint64_t *out); /* "USR2", "SIGUSR2", "12"; "0"/"off": 0 */
/* "8G" (every device together), "0:8G,1:4G" (per device), or both: "12G,0:8G". */
int _vs_parse_limit(const char *text, uint64_t *all, uint64_t dev[VS_LIMIT_DEVICES]);
/* "fail", "wait", "wait:SECONDS", "host", "host:SIZE". */
int _vs_parse_on_limit(const char *text, uint64_t *mode, uint64_t *arg);
/* A name of a tag or group: 1-31 of A-Z a-z 0-9 _ . - */
bool _vs_name_ok(const char *name);
/* A list of library globs (VS_KIND_LIBS): 1-255 of A-Z a-z 0-9 _ . - + * ? and commas between. */
bool _vs_libs_ok(const char *text);
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
/* Warnings that others can cause (requests of other users, refused): kept apart from the cap on
 * the process's warnings, so that they never hide the program's own, and shown at most once a
 * second per limiter, each shown one saying how many were not. A limiter starts zeroed. */
typedef struct vs_rate_s {
  _Atomic uint64_t next_ns; /* none shown before this */
  atomic_uint hidden;       /* not shown since the last one */
  atomic_bool said;         /* the first was shown (it says how the others are) */
} vs_rate_t;
void _vs_warn_rated(vs_rate_t *rate, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Opens the log or the trace for writing: no symbolic link followed, a FIFO without a reader
 * refused (ENXIO) rather than waited for; truncate: empties a regular file, else appends;
 * any_type false: only a regular file or a FIFO (EINVAL). -1 with errno on failure, and
 * _vs_open_output_error(errno) says why. */
int _vs_open_output(const char *path, bool truncate, bool any_type);
const char *_vs_open_output_error(int err);
/* Copies every message the calling thread writes from now on to fn (line: n bytes, its newline
 * included), besides the log; fn NULL: no more. */
void _vs_log_copy(void (*fn)(void *arg, const char *line, size_t n), void *arg);

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
    (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))                              \
  X(cuStreamCreate, 2000, CUresult, (CUstream *, unsigned int))                                       \
  X(cuStreamDestroy, 4000, CUresult, (CUstream))                                                      \
  X(cuMemcpyDtoDAsync, 3020, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                 \
  X(cuMemsetD8Async, 3020, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))                \
  X(cuEventSynchronize, 2000, CUresult, (CUevent))                                                   \
  X(cuStreamWaitEvent, 3020, CUresult, (CUstream, CUevent, unsigned int)) \
  X(cuMemHostAlloc, 3020, CUresult, (void **, size_t, unsigned int))                                 \
  X(cuMemFreeHost, 2000, CUresult, (void *))                                                          \
  X(cuMemcpyDtoHAsync, 3020, CUresult, (void *, CUdeviceptr, size_t, CUstream))                       \
  X(cuMemcpyHtoDAsync, 3020, CUresult, (CUdeviceptr, const void *, size_t, CUstream)) \
  X(cuDeviceGetGraphMemAttribute, 11040, CUresult, (CUdevice, CUgraphMem_attribute, void *))         \
  X(cuDevicePrimaryCtxGetState, 7000, CUresult, (CUdevice, unsigned int *, int *))                   \
  X(cuDeviceGetPCIBusId, 4010, CUresult, (char *, int, CUdevice))                                  \
  X(cuMemcpyDtoH, 3020, CUresult, (void *, CUdeviceptr, size_t))                                     \
  X(cuMemcpyHtoD, 3020, CUresult, (CUdeviceptr, const void *, size_t))

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
/* "CUDA_ERROR_OUT_OF_MEMORY" for 2; never NULL, works before the driver is loaded. */
const char *_vs_cu_error_name(CUresult r);

/* ---------------------------------------------------------------- "state.c", "init.c" */
/* state.c: the words every file reads (below the rest of base, so base's own files read them
 * without calling up into init.c). */
extern atomic_int _vs_state; /* 0 not initialised, 1 active, 2 pass-through (init.c decides) */
/* Thread-local guard: set while the shim calls into the real runtime or driver, so that
 * the hooks reached from there pass through. */
extern _Thread_local int _vs_guard;
/* Active stream captures in the process, kept by the cuStreamBeginCapture/EndCapture hooks. */
extern atomic_int _vs_captures_active;
/* init.c, the top of base: true when the shim serves allocations; the first call initialises
 * (options, log, trace, the driver's functions). Inline: every allocation asks. Not for the
 * files of base, which read _vs_state. */
bool _vs_activate_slow(void);
static inline bool _vs_active(void) {
  int st = atomic_load_explicit(&_vs_state, memory_order_acquire);
  if (__builtin_expect(st == 1, 1)) return true;
  return st == 2 ? false : _vs_activate_slow();
}
void _vs_init_once(void); /* config, log, trace, atexit, the dump signal; no CUDA */
/* What the dump signal's thread does (the memory report, registered by report.c). */
void _vs_set_dump_handler(void (*fn)(void));
/* Called once, by the thread that activates the shim (the control channel, registered by
 * src/hook/control.c): nothing runs in a process that never uses CUDA. */
void _vs_set_activate_handler(void (*fn)(void));
/* Starts a detached thread of the shim with every signal blocked (the program's signals stay
 * with its own threads); pthread_create's result. */
int _vs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg);
/* Whether the calling thread is one of _vs_thread_start's (stats.c leaves them out of the
 * program's threads that a wait for memory counts on). */
bool _vs_thread_own_self(void);

/* ---------------------------------------------------------------- "directory.c" */
/* Address -> owning pool, over every reservation of every pool; lock-free lookups. */
int _vs_dir_add(CUdeviceptr va, size_t size, vs_pool_t *pool); /* -1 when full */
void _vs_dir_remove_pool(vs_pool_t *pool);
vs_pool_t *_vs_dir_lookup(CUdeviceptr addr); /* NULL: no pool reserved this address */
/* Calls fn once for every pool in the directory (every arena of every live context): the
 * memory report and access changes. Rare paths; a pool dropped meanwhile (its context
 * destroyed) is the caller's race, as with any pointer to it. */
void _vs_dir_visit_pools(void (*fn)(vs_pool_t *pool, void *arg), void *arg);

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
void _vs_stats_get(vmmshim_stats_t *out); /* vmmshim_get_stats: the counters summed */
/* The program's threads alive now, besides the caller, that have allocated or freed through the
 * shim (not the shim's own): those that could free memory a wait waits for. */
int _vs_stat_threads_others(void);
void _vs_stats_print(void);
/* Growths that mapped idle handles of their pool side by side into their new range (space.c's
 * stitches): how many, the handles so reused, and their bytes (not created anew). Shared relaxed
 * atomics, as the rare counters above; not part of vmmshim_stats_t (its size is the ABI). */
typedef struct vs_stitch_stats_s {
  uint64_t stitches, handles, bytes;
} vs_stitch_stats_t;
extern vs_stitch_stats_t _vs_stitch_stats;
#define VS_STAT_ADD_STITCH(field, n) __atomic_fetch_add(&_vs_stitch_stats.field, (uint64_t)(n), __ATOMIC_RELAXED)

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
/* A sleep (wake 0) or wake of tag (its index and name; -1 and NULL: every tag), in mode: the
 * device bytes it gave back or mapped again, the bytes copied to or from host memory. */
void _vs_trace_sleep(int wake, int tag, const char *name, int mode, uint64_t device_bytes, uint64_t host_bytes,
                     int result, uint64_t duration_ns);
/* A stitch ('h'): a growth of device dev that mapped `handles` handles at [va, va+size), of
 * which `fresh` bytes in new handles and the rest idle handles of the pool moved there. */
void _vs_trace_stitch(CUdeviceptr va, size_t size, unsigned handles, size_t fresh, int device,
                      uint64_t duration_ns);
/* 'j': the tag rule (its index in its set) that tagged the allocation at ptr, written before its
 * 'a'; tag and text must stay valid for the life of the process (rule sets are kept). */
void _vs_trace_rule(CUdeviceptr ptr, int rule, int device, const char *tag, const char *text);
/* A group operation seen by this member (trace.h: VS_TRACE_GROUP_*): the other member's pid (0:
 * none), the bytes, the result (0 or a negative errno), its duration. */
void _vs_trace_group(int kind, int peer, uint64_t bytes, int result, uint64_t duration_ns);
/* Memory made (freed 0) or freed outside the shim's pools (outside.c): a 'u' record; kind is
 * outside.c's VS_OUTSIDE_*, caller the return address that asked, stack its stack id or 0. */
void _vs_trace_outside(int kind, int freed, int device, uint64_t key, size_t size, uintptr_t caller, uint32_t stack);
/* The owners of a residue's figures ('r' records, docs/trace-format.md). */
#define VS_RESIDUE_TOTAL 0       /* the device's memory */
#define VS_RESIDUE_USED 1        /* in use: total - free (cuMemGetInfo) */
#define VS_RESIDUE_TAGS 2        /* the shim's pools (awake tags, what stays of sleeping ones) */
#define VS_RESIDUE_LIBRARY 3     /* one library's own VMM memory (cuMemCreate) */
#define VS_RESIDUE_MANAGED 4     /* managed memory */
#define VS_RESIDUE_GRAPH 5       /* graph memory (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) */
#define VS_RESIDUE_CONTEXT 6     /* contexts (measured around their creation) */
#define VS_RESIDUE_OTHERS 7      /* other processes (NVML) */
#define VS_RESIDUE_UNEXPLAINED 8 /* used - every owner above (signed, two's complement) */
#define VS_RESIDUE_HOST 9        /* pinned host memory (not the device's) */
#define VS_RESIDUE_ARRAYS 10     /* CUDA arrays (by the free memory their creation took) */
#define VS_RESIDUE_MODULES 11    /* loaded modules and libraries (measured around their load) */
#define VS_RESIDUE_PROCESS 12    /* this process's bytes by NVML (written when known) */
#define VS_RESIDUE_INFERRED 13   /* PROCESS less every owner measured in it (written when known) */
#define VS_RESIDUE_NAME 15       /* a library's name */
/* One figure of a residue (residue.c): an 'r' record. owner: VS_RESIDUE_*; lib: a library's
 * index (its name in an earlier 'r' record of owner VS_RESIDUE_NAME, written by _vs_trace_residue_name). */
void _vs_trace_residue(int owner, int device, uint64_t seq, uint64_t bytes, unsigned lib);
void _vs_trace_residue_name(unsigned lib, const char *name);
void _vs_trace_flush(void);
void _vs_trace_close(void);

/* ---------------------------------------------------------------- "gate.c" */
/* The program's new GPU work (launches, copies, memsets) waits at the gate while the shim moves
 * memory under it (a sleep, a wake). A submission calls _vs_gate_enter before the driver and
 * _vs_gate_leave after it. */
typedef struct __attribute__((aligned(64))) vs_gate_line_s {
  atomic_int inside; /* submissions of its thread in progress */
  atomic_bool owned;
  struct vs_gate_line_s *next;
} vs_gate_line_t;
extern atomic_int _vs_gate_closed;
extern _Thread_local vs_gate_line_t *_vs_gate_line;
vs_gate_line_t *_vs_gate_line_slow(void);
void _vs_gate_wait(vs_gate_line_t *line);
static inline vs_gate_line_t *_vs_gate_enter(void) {
  vs_gate_line_t *l = _vs_gate_line;
  if (__builtin_expect(l == NULL, 0)) l = _vs_gate_line_slow();
  /* Dekker's handshake with _vs_gate_close: both sides' operations sequentially consistent. */
  atomic_fetch_add(&l->inside, 1);
  if (__builtin_expect(atomic_load(&_vs_gate_closed) != 0, 0)) _vs_gate_wait(l);
  return l;
}
static inline void _vs_gate_leave(vs_gate_line_t *l) { atomic_fetch_sub_explicit(&l->inside, 1, memory_order_release); }
/* Closes the gate and waits until no submission is in progress; _vs_gate_open lets them go.
 * Closes nest (a group's quiesce around a sleep): the gate opens at the last holder's open. */
void _vs_gate_close(void);
void _vs_gate_open(void);

/* ---------------------------------------------------------------- "state.c": threads */
/* A number of the calling thread's own (odd, unlike any handle or aligned address), never given
 * to another thread, even after this one has exited (a thread-local address would be). */
extern _Thread_local uintptr_t _vs_thread_no;
uintptr_t _vs_thread_no_slow(void);
static inline uintptr_t _vs_thread_id(void) {
  uintptr_t n = _vs_thread_no;
  return __builtin_expect(n != 0, 1) ? n : _vs_thread_no_slow();
}

/* The stream a submission or stream-ordered call names: a handle stands for itself; NULL is the
 * legacy stream, or in a per-thread call (_ptsz, _ptds) the calling thread's own. */
static inline CUstream _vs_stream_named(CUstream h, int ptsz) {
  return h ? h : ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}
/* A named stream's key, the same for every call that names it: the legacy stream is NULL; the
 * per-thread default streams, which share one handle value across threads, are keyed by thread
 * (*owner: the thread's tag, else NULL). */
static inline CUstream _vs_stream_key(CUstream s, const void **owner) {
  *owner = NULL;
  if (s == CU_STREAM_LEGACY) return NULL;
  if (s == CU_STREAM_PER_THREAD) {
    *owner = (const void *)_vs_thread_id();
    return (CUstream)_vs_thread_id(); /* odd: unlike any stream handle */
  }
  return s;
}

/* ---------------------------------------------------------------- "order.c" */
/* Whether all of the process's GPU work has gone to one stream (deferred mode reuses cudaFree'd
 * blocks at once while it has). Every submission hook names its stream before the driver call,
 * as _vs_stream_named reads it, or VS_ORDER_ELSEWHERE for work that spans contexts or waits for
 * another stream's. */
typedef enum vs_order_state_e { VS_ORDER_UNSEEN = 0, VS_ORDER_ONE = 1, VS_ORDER_LEAVING = 2, VS_ORDER_OFF = 3 } vs_order_state_t;
#define VS_ORDER_ELSEWHERE ((CUstream)(uintptr_t)(UINTPTR_MAX - 1))
/* A submission to stream s (ptsz: a per-thread call), before the driver call: fixes S, or ends
 * the order (its way out). Every launch makes it: an atomic load while the order is off or s is
 * S by handle. */
void _vs_order_see(CUstream s, int ptsz);
/* Ends the one-stream order (why: for the log and stats); host: the caller's use cannot wait on
 * a stream, so it returns once the one stream's earlier work is done. */
void _vs_order_leave(const char *why, bool host);
/* The order as it stands: its state and S's context (NULL until S is fixed). A free of a pool
 * of that context is ordered while the state is VS_ORDER_ONE (alloc.c); memory freed in order
 * may still be in use until it is VS_ORDER_OFF (space.c). */
typedef struct vs_order_view_s {
  vs_order_state_t state;
  CUcontext ctx;
} vs_order_view_t;
vs_order_view_t _vs_order_view(void);
void _vs_order_stream_destroyed(CUstream s);
void _vs_order_context_gone(CUcontext ctx);
void _vs_order_configure(bool on);         /* at start: off unless deferred mode and VMMSHIM_ONE_STREAM */
const char *_vs_order_describe(void);      /* for the stats */

/* ---------------------------------------------------------------- "clock.c" */
uint64_t _vs_now_ns(void); /* CLOCK_MONOTONIC ns; the trace's raw clock is in vmmshim/clock.h */
void _vs_sleep_us(unsigned us); /* nanosleep, restarted when a signal interrupts it */

#endif
