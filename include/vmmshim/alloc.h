/* vmmshim alloc layer (src/alloc/): what the entry points (src/hook/) call. */
#ifndef VMMSHIM_ALLOC_H
#define VMMSHIM_ALLOC_H

#include "vmmshim/share.h"

/* ---------------------------------------------------------------- "alloc.c" */
/* Entry points shared by the runtime and driver hooks. They return CUresult values;
 * the runtime hooks translate them. A non-owned pointer is reported, not touched. */

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
void _vs_stream_destroyed(CUstream stream);
/* Drop the pools of a context that is being destroyed or reset (ctx NULL: all of device dev). */
void _vs_drop_context(CUcontext ctx, int dev);
size_t _vs_trim_all(void);
/* Calls fn for every arena of every live context on device dev (rare paths: the pool queries). */
void _vs_visit_device_arenas(int dev, void (*fn)(vs_pool_t *pool, void *arg), void *arg);
/* Moves the calling thread to arena idx (mod VMMSHIM_ARENAS); contention does it by itself. */
void _vs_arena_select(unsigned idx);

/* Pools off allocation (sleep.c): a tag's pools are parked while it sleeps. */
typedef struct vs_parked_s {
  vs_pool_t *pool;
  CUcontext ctx;
} vs_parked_t;
/* Takes every arena of tag, in every context, off allocation (new allocations of the tag get new
 * pools); returns the tag's parked pools, these and those parked before (at most max). */
int _vs_park_tag(int tag, vs_parked_t *out, int max);
/* The tag's parked pools. */
int _vs_parked_of(int tag, vs_parked_t *out, int max);
/* A woken pool back on allocation, in a free arena of its tag: false when none is free (it stays
 * parked, serving frees). */
bool _vs_unpark(vs_pool_t *pool);
/* Calls fn for every pool of tag (every tag when tag < 0), parked or not. */
void _vs_visit_tag(int tag, void (*fn)(vs_pool_t *pool, void *arg), void *arg);
/* Synchronises every context the shim serves (before memory moves). */
void _vs_sync_contexts(void);
/* Gives cached host memory back down to keep bytes; returns the bytes given back. */
size_t _vs_release_host(size_t keep);

/* ---------------------------------------------------------------- "balloon.c" */
/* Cold tags (VMMSHIM_COLD_TAGS, vmmshim ctl PID cold): the mode each leaves the device in when
 * lent (VMMSHIM_SLEEP_*), -1 for a tag that is not cold. _vs_cold_set makes the tag if needed. */
int _vs_cold_mode_of(const char *name); /* "discard", "host", "mapped": the mode, else -1 */
int _vs_cold_set(const char *tag, int mode, int *previous);
int _vs_cold_get(int tag);
/* A higher member's request (control_group.c): cold tags sleep until want bytes left the device;
 * *released says how many; -EALREADY when none could (why says why). */
int _vs_balloon_demote(uint64_t want, pid_t borrower, uint64_t *released, char *why, size_t n);
uint64_t _vs_balloon_lent(void); /* bytes lent and not back yet */

/* ---------------------------------------------------------------- "limit.c" */
/* Bytes served from host memory at their own addresses, every pool (tags asleep in mapped mode,
 * growths past the limit): pointer queries look further only when it is not 0. */
extern atomic_size_t _vs_host_mapped_bytes;
/* The limit (or the device) refused an allocation after every pool gave back its idle memory:
 * VMMSHIM_ON_LIMIT says what now (wait, host). Returns the new status (VS_POOL_OK: served). */
vs_pool_status_t _vs_on_limit(vs_pool_t *pool, vs_pool_status_t st, size_t size, CUstream stream, vmmshim_api_t api,
                              CUdeviceptr *ptr, size_t *served, CUresult *err);

/* ---------------------------------------------------------------- "sleep.c" */
/* vmmshim_sleep, _wake, _sleep_level and _promote (vmmshim.h), out's size checked by the caller
 * (out may be NULL): each timed, logged and traced, its result copied to out. */
int _vs_sleep(const char *tag, int mode, vmmshim_sleep_result_t *out);
int _vs_wake(const char *tag, unsigned flags, vmmshim_sleep_result_t *out);
int _vs_sleep_level(int level, int mapped, vmmshim_sleep_result_t *out);
int _vs_promote(vmmshim_sleep_result_t *out);
/* A group's quiesce: the gate closed (no capture in progress: -EBUSY after VMMSHIM_SLEEP_WAIT)
 * and every context synchronised, held until _vs_unquiesce; why (n bytes) says why it was not. */
int _vs_quiesce(char *why, size_t n);
void _vs_unquiesce(void);
int _vs_tag_stats(vmmshim_tag_stats_t *out, int max);
/* Whether addr is served from host memory at its own address (a tag asleep in mapped mode), and
 * its pool's device: pointer queries then answer device memory, as before the sleep. */
bool _vs_host_mapped(CUdeviceptr addr, int *dev);
/* vmmshim_host_copy (vmmshim.h): where the bytes of a sleeping address are kept. */
int _vs_host_copy_at(CUdeviceptr addr, CUdeviceptr *home, size_t *len);
/* vmmshim_host_view (vmmshim.h): the CPU address of a sleeping range's bytes, in place. */
int _vs_host_view_at(CUdeviceptr addr, size_t size, CUdeviceptr *home);

/* ---------------------------------------------------------------- "borrow.c" */
/* Asks lender (a member of lower priority) to move want bytes out of the device, by deadline_ns:
 * 0 with *got the bytes that left, or -errno with why. */
int _vs_borrow(pid_t lender, uint64_t want, uint64_t deadline_ns, uint64_t *got, double *lender_ms, char *why, size_t n);

/* ---------------------------------------------------------------- "residue.c", "nvml.c" */
/* vmmshim_residue: the residue now (out not NULL); 0, -ENODEV. */
int _vs_residue(vmmshim_residue_t *out);
/* After a sleep (sleep.c): a residue, traced, logged, compared with the first one's. */
void _vs_residue_after_sleep(void);
/* Other processes' bytes on r's devices from NVML: false when NVML could not tell (why: _vs_nvml_why). */
bool _vs_nvml_others(vmmshim_residue_t *r);
const char *_vs_nvml_why(void);
/* Device dev's free memory by NVML (no context needed): false without NVML. */
bool _vs_nvml_device_free(int dev, uint64_t *free_bytes);
/* The bytes other processes hold on device dev by NVML: false without NVML. */
bool _vs_nvml_others_on(int dev, uint64_t *bytes);

/* ---------------------------------------------------------------- "ctxmem.c" */
/* What contexts and modules take of the device, from the free memory around their creation
 * (src/hook/hook_outside.c): _vs_ctxmem_before, the driver's call, then _vs_ctxmem_after with
 * the new handle when the driver agreed. */
#define VS_CTXMEM_CONTEXT 0
#define VS_CTXMEM_MODULE 1 /* a module or library */
#define VS_CTXMEM_KINDS 2
#define VS_CTXMEM_NONE 0    /* not measured */
#define VS_CTXMEM_CURRENT 1 /* cuMemGetInfo in the current context */
#define VS_CTXMEM_NVML 2    /* NVML's free memory of the device */
typedef struct vs_ctxmem_probe_s {
  int dev, kind, source;
  bool others_known;
  uint64_t free, others;
  uintptr_t ctx; /* a module load's current context */
} vs_ctxmem_probe_t;
/* dev: the device a context is made on; -1: the current context's (a module load). */
void _vs_ctxmem_before(vs_ctxmem_probe_t *p, int dev, int kind);
/* key: the new handle; primary: it is dev's primary context (_vs_ctxmem_primary_gone ends it). */
void _vs_ctxmem_after(vs_ctxmem_probe_t *p, uintptr_t key, bool primary);
void _vs_ctxmem_gone(uintptr_t key);
void _vs_ctxmem_primary_gone(int dev);
/* Device dev's context and module bytes; returns the contexts not measured (*missed_modules:
 * the module loads not measured), of every device. */
unsigned _vs_ctxmem_figures(int dev, uint64_t *context, uint64_t *modules, unsigned *missed_modules);

/* ---------------------------------------------------------------- "outside.c" */
/* Memory made outside the shim's pools (src/hook/hook_outside.c tells): by kind, library and
 * call site. */
#define VS_OUTSIDE_VMM 0     /* cuMemCreate, cuMemImportFromShareableHandle: device memory */
#define VS_OUTSIDE_MANAGED 1 /* cuMemAllocManaged */
#define VS_OUTSIDE_HOST 2    /* cuMemAllocHost, cuMemHostAlloc: pinned host memory */
#define VS_OUTSIDE_ARRAY 3   /* cuArrayCreate, cuArray3DCreate: by the free memory their creation took */
#define VS_OUTSIDE_KINDS 4
#define VS_OUTSIDE_EXPORTABLE 1u /* a VMM handle made with requestedHandleTypes != 0 */
#define VS_OUTSIDE_IMPORTED 2u   /* a VMM handle of cuMemImportFromShareableHandle */
#define VS_OUTSIDE_KNOWN 4u      /* _vs_outside_flags: the handle is in the table */
#define VS_OUTSIDE_LIBS 32       /* libraries told apart (the last stands for the rest) */
#define VS_OUTSIDE_SITES 256     /* call sites told apart (the last stands for the rest) */
#define VS_OUTSIDE_DEVICES 16
typedef struct vs_outside_lib_s {
  char name[64]; /* the shared object's file name */
  uint64_t bytes[VS_OUTSIDE_KINDS];
} vs_outside_lib_t;
typedef struct vs_outside_site_s {
  uintptr_t addr; /* the return address into the library; 0: the other sites */
  int lib, kind;  /* lib -1: the other sites */
  uint32_t stack; /* the trace's stack id, 0 when none */
  uint64_t bytes; /* live now */
} vs_outside_site_t;
typedef struct vs_outside_figures_s {
  uint64_t dev[VS_OUTSIDE_DEVICES][VS_OUTSIDE_KINDS]; /* device memory by device and kind (HOST unused) */
  uint64_t host, shared, untracked; /* pinned host; VMM exported or imported; made while a table was full */
  uint64_t asleep;                  /* VMM memory a foreign sleep took off the device */
  int nlibs, nsites;
  vs_outside_lib_t libs[VS_OUTSIDE_LIBS];
  vs_outside_site_t sites[VS_OUTSIDE_SITES];
} vs_outside_figures_t;
/* A VMM handle a foreign sleep may take (foreign.c), as outside.c knows it. */
#define VS_FOREIGN_ACCESS 8 /* access descriptors kept per handle (more: left awake) */
typedef struct vs_foreign_s {
  uint64_t handle;
  CUdeviceptr va;
  size_t size;
  int dev;
  CUmemAllocationProp prop;
  CUmemAccessDesc access[VS_FOREIGN_ACCESS];
  int naccess;
  char lib[64];
  const char *skip; /* why it stays (or, asleep, is not mapped again), NULL: it may move */
  void *copy;       /* asleep: its bytes (VS_FOREIGN_DISCARDED: none kept) */
} vs_foreign_t;
#define VS_FOREIGN_DISCARDED ((void *)1)
/* The first return address of the calling thread's stack outside the shim and CUDA's runtime and
 * driver (where none, the first outside the shim). */
uintptr_t _vs_outside_caller(void);
/* kind (VS_OUTSIDE_*) of size bytes, known by key (handle or address), made on device dev (a VMM
 * handle: with its properties, else prop NULL). */
void _vs_outside_made(int kind, uint64_t key, size_t size, int dev, unsigned flags, uintptr_t caller,
                      const CUmemAllocationProp *prop);
/* Freed: false when key was not in the table. */
bool _vs_outside_freed(int kind, uint64_t key);
unsigned _vs_outside_flags(uint64_t handle); /* a VMM handle's VS_OUTSIDE_* flags, 0 when unknown */
void _vs_outside_figures(vs_outside_figures_t *out);
/* The mappings of VMM handles made outside the pools (the hooks tell). */
void _vs_outside_mapped(CUdeviceptr va, size_t size, size_t offset, uint64_t handle);
/* 1 when every mapping in [va, va + size) is asleep (asleep_only: forget them only then). */
int _vs_outside_unmapped(CUdeviceptr va, size_t size, bool asleep_only);
void _vs_outside_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count);
/* The handle value the driver knows for the program's (a foreign wake made it again). */
uint64_t _vs_outside_current(uint64_t handle);
/* A release by the program: the driver's value; *asleep_copy set when the handle sleeps. */
uint64_t _vs_outside_release_begin(uint64_t handle, void **asleep_copy);
/* For foreign.c: the candidates of libraries lib_ok accepts, those asleep, and the changes. */
int _vs_outside_foreign(vs_foreign_t *out, int max, bool (*lib_ok)(const char *name));
int _vs_outside_asleep_list(vs_foreign_t *out, int max);
void _vs_outside_set_asleep(uint64_t handle, void *copy);
void _vs_outside_woken(uint64_t old, uint64_t now);

/* ---------------------------------------------------------------- "foreign.c" */
/* VMMSHIM_SLEEP_FOREIGN: with every tag, the process's own VMM memory of the libraries named
 * sleeps (gate closed, contexts synchronised) and wakes; what it moved and skipped is added to res. */
int _vs_foreign_sleep(int mode, vmmshim_sleep_result_t *res); /* handles moved */
int _vs_foreign_wake(vmmshim_sleep_result_t *res);            /* handles that were asleep */
/* A copy of memory asleep, given back (its handle released by the program meanwhile). */
void _vs_foreign_drop(void *copy);

/* ---------------------------------------------------------------- "tags.c" */
#define VS_MAX_TAGS VMMSHIM_MAX_TAGS
extern atomic_int _vs_process_tag; /* the tag of threads that set none */
extern _Thread_local int _vs_tl_tag1; /* the thread's own tag + 1; 0: none */
/* The tag the calling thread's next allocation goes to: the allocation path asks every time. */
static inline int _vs_current_tag(void) {
  int t = _vs_tl_tag1;
  return vs_likely(t == 0) ? atomic_load_explicit(&_vs_process_tag, memory_order_relaxed) : t - 1;
}
void _vs_tags_init(void); /* VMMSHIM_TAG; before the first pool */
bool _vs_tag_name_ok(const char *name);
/* The index of a tag (created when create and the table has room); -EINVAL, -ENOENT, -ENOSPC. */
int _vs_tag_find(const char *name, bool create);
const char *_vs_tag_name(int id);
int _vs_tag_count(void);
bool _vs_tag_keep(int id);
/* vmmshim_set_tag (NULL: back to the process's tag), _set_process_tag, _get_tag (buf not NULL,
 * n > 0) and _set_tag_keep: 0 or a negative errno value (vmmshim.h). */
int _vs_set_thread_tag(const char *tag);
int _vs_set_process_tag(const char *tag);
int _vs_get_tag(char *buf, size_t n);
int _vs_set_tag_keep(const char *tag, bool keep);

/* ---------------------------------------------------------------- "rules.c" */
/* VMMSHIM_TAG_RULES (docs/tag-rules.md): TAG=MATCHER rules that tag allocations of threads
 * that set no tag of their own; the first that matches gives the tag. */
#define VS_RULES_SPEC_MAX 4095
typedef enum vs_match_kind_e {
  VS_MATCH_LIB, VS_MATCH_PY, VS_MATCH_SITE, VS_MATCH_CAPTURE, VS_MATCH_BEFORE, VS_MATCH_AFTER,
  VS_MATCH_SIZE_GE, VS_MATCH_SIZE_LT
} vs_match_kind_t;
typedef struct vs_matcher_s {
  vs_match_kind_t kind;
  int bit;           /* lib, py, site: its bit in the call site's decisions */
  uint64_t size;     /* size:>= and size:< */
  const char *glob;  /* lib, py, site */
} vs_matcher_t;
typedef struct vs_rule_s {
  int tag, n, index;               /* the tag's index; matchers (all must match); place in the set */
  char tag_name[VMMSHIM_TAG_MAX];
  const char *text;                /* the rule as written, spaces trimmed */
  vs_matcher_t m[8];
  atomic_ullong matched;           /* allocations it tagged */
} vs_rule_t;
typedef struct vs_ruleset_s {
  int n;
  bool need_py, need_site;         /* py: matchers; lib: or site: matchers */
  bool need_walk;                  /* site: matchers (the stack is walked for them) */
  const char *spec;
  struct vs_ruleset_s *kept;       /* the set published before (sets are kept for good) */
  vs_rule_t rules[32];
} vs_ruleset_t;
extern vs_ruleset_t *_Atomic _vs_rules;  /* NULL: no rules */
extern atomic_bool _vs_launched;         /* a kernel was launched (hook_gated.c sets it once) */
extern _Thread_local void *_vs_tl_alloc_caller; /* the allocation hook's return address */
/* The tag of an allocation of a thread with no tag of its own, and the rule that gave it
 * (NULL: none matched; the process's tag). */
int _vs_rules_tag(size_t size, const vs_rule_t **rule);
/* The tag of an allocation of size bytes: the thread's own, else the rules', else the process's. */
static inline int _vs_alloc_tag(size_t size, const vs_rule_t **rule) {
  int t = _vs_tl_tag1;
  *rule = NULL;
  if (vs_likely(t == 0)) {
    if (vs_unlikely(atomic_load_explicit(&_vs_rules, memory_order_relaxed) != NULL)) return _vs_rules_tag(size, rule);
    return atomic_load_explicit(&_vs_process_tag, memory_order_relaxed);
  }
  return t - 1;
}
/* vmmshim_set_tag_rules: spec NULL or "" clears; 0, or a negative errno value with err (n bytes)
 * saying which rule is wrong and where; the rules in force then stay. */
int _vs_set_tag_rules(const char *spec, char *err, size_t n);
void _vs_rules_init(void); /* VMMSHIM_TAG_RULES, once */
/* The set in force (NULL: none), for status: read only, valid for the life of the process. */
const vs_ruleset_t *_vs_rules_current(void);

/* ---------------------------------------------------------------- "mempool.c" */
/* The queries a program makes about the stream-ordered allocator's pool, on a pool the shim
 * stands in for: each device's default pool (its stream-ordered allocations are the shim's).
 * The driver answers first (its pool holds what passed through); these add the shim's part.
 * Any other pool (one the program created) is the driver's alone. */
/* cuMemPoolGetAttribute succeeded: the shim's figures are added to the reserve, use and their
 * high watermarks. */
void _vs_mempool_got_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
/* cuMemPoolSetAttribute succeeded: a release threshold is applied to the device's pools, a
 * reset of a high watermark resets theirs. */
void _vs_mempool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, const void *value);
/* cuMemPoolTrimTo(pool, keep): the device's pools give back idle memory down to `keep` bytes of
 * reserve (never below); returns what the driver's pool is to keep, for the reserve of both
 * to stay at or above `keep`. */
size_t _vs_mempool_trim(CUmemoryPool pool, size_t keep);

#endif
