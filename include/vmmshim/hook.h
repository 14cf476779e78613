/* vmmshim hook layer (src/hook/): what its files share. The layer is the top one: no layer
 * calls it. hook_drv.c answers lookups (cuGetProcAddress, dlsym) from its own hook list and
 * from hook_gated.c's, the entry points that submit GPU work. */
#ifndef VMMSHIM_HOOK_H
#define VMMSHIM_HOOK_H

#include "vmmshim/alloc.h"

/* A hook: the base name a lookup asks for, the exported symbol, the version from which the
 * hook's ABI is the driver's, whether it is the per-thread-stream variant, its address. */
typedef struct vs_hook_desc_s {
  const char *base;
  const char *symbol;
  int min_version;
  int ptsz;
  void *(*hook)(void);
} vs_hook_desc_t;

/* The per-thread-stream variants exist from CUDA 7.0: a lookup of one at an earlier version
 * gets the legacy-stream function. */
#define VS_PTSZ_VERSION(ver, ptsz) ((ptsz) && (ver) < 7000 ? 7000 : (ver))

/* ---------------------------------------------------------------- "hook_drv.c" */
/* The real function behind hook h, kept in *real: found through the driver on first use
 * (a lookup that met it first filled it already). NULL, with an error logged, when the driver
 * has none. */
void *_vs_hook_resolve(const vs_hook_desc_t *h, void **real);
/* The same, inline for the calls after the first: one acquire load. */
static inline void *_vs_hook_real(const vs_hook_desc_t *h, void **real) {
  void *fn = __atomic_load_n(real, __ATOMIC_ACQUIRE);
  return vs_likely(fn != NULL) ? fn : _vs_hook_resolve(h, real);
}

/* ---------------------------------------------------------------- "hook_gated.c" */
/* The entry points that submit GPU work (launches, copies, memsets, stream memory operations):
 * _vs_gated_count hooks, and the real function behind each. */
extern const vs_hook_desc_t _vs_gated_hooks[];
extern void *_vs_gated_real[];
extern const int _vs_gated_count;

/* ---------------------------------------------------------------- "hook_outside.c" */
/* The entry points that make memory outside the shim's pools (cuMemCreate, managed, pinned
 * host): _vs_outside_count hooks, and the real function behind each. */
extern const vs_hook_desc_t _vs_outside_hooks[];
extern void *_vs_outside_real[];
extern const int _vs_outside_count;
/* cuMemFree of memory the shim does not serve succeeded: managed memory leaves the count. */
void _vs_hook_outside_freed(CUdeviceptr dptr);

#endif
