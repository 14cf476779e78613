/* outside.c: memory the process makes outside the shim's pools, and who made it.
 *
 * The shim serves cudaMalloc and friends from its pools; libraries also make memory of their own
 * (NCCL's and JAX's cuMemCreate, managed memory, pinned host buffers). The hooks of
 * src/hook/hook_outside.c pass those calls to the driver untouched and, when the driver agreed,
 * note here what was made or freed: its kind, size and device, the shared object that asked for
 * it (the caller's return address, looked up once per address with dladdr, frames of the shim and
 * of the CUDA runtime and driver passed over) and its call site (that address, and the trace's
 * stack id when stacks are on). The residue (residue.c) sums them by owner.
 *
 * These calls are rare (a library makes its buffers once, at start or per cycle): one lock, a
 * leaf of the lock order, guards the tables; no driver call is made under it. */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/alloc.h"
#include "vmmshim/stacks.h"

#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#define VS_OUT_FRAMES 24 /* frames looked at for the first caller outside CUDA */

typedef struct vs_out_entry_s {
  uint64_t key; /* the handle (VMM), the address (managed, host) */
  size_t size;
  int kind, dev, lib, site;
  unsigned flags;
  CUmemAllocationProp prop; /* VMM: as made (a foreign sleep makes it again so) */
  int maps;                 /* VMM: live mappings of it */
  bool pieces;              /* VMM: mapped or opened in pieces (a foreign sleep leaves it) */
  CUdeviceptr va;           /* VMM: its mapping when maps == 1 */
  CUmemAccessDesc access[VS_FOREIGN_ACCESS];
  int naccess;
  void *asleep;             /* a foreign sleep's copy (or (void *)1 when discarded); NULL: awake */
  UT_hash_handle hh;
} vs_out_entry_t;

typedef struct vs_out_map_s { /* a mapping of a VMM handle made outside the pools: va -> handle */
  CUdeviceptr va;
  size_t size;
  uint64_t handle;
  UT_hash_handle hh;
} vs_out_map_t;

typedef struct vs_out_alias_s { /* a handle a foreign wake made again: the program's value -> the new */
  uint64_t old, now;
  UT_hash_handle hh;
} vs_out_alias_t;

typedef struct vs_out_addr_s { /* a return address -> its call site, or its library (dladdr's cache) */
  uintptr_t addr;
  int index;
  UT_hash_handle hh;
} vs_out_addr_t;

static vs_lock_t vs_out_lock = VS_LOCK_INITIALIZER(VS_RANK_OUTSIDE, "outside");
static vs_out_entry_t *vs_out_entries[VS_OUTSIDE_KINDS]; /* one table per kind: keys of kinds may meet */
static vs_out_addr_t *vs_out_site_map;
static vs_out_addr_t *vs_out_lib_cache;
static vs_outside_lib_t vs_out_libs[VS_OUTSIDE_LIBS];
static int vs_out_nlibs;
static vs_outside_site_t vs_out_sites[VS_OUTSIDE_SITES];
static int vs_out_nsites;
static uint64_t vs_out_untracked; /* bytes made while a table had no room */
static vs_out_map_t *vs_out_maps;
static vs_out_alias_t *vs_out_aliases;

/* ------------------------------------------------------------------ who asked */

static uintptr_t vs_own_base; /* the shim's own load address */

/* Whether a shared object is the CUDA runtime or driver: the library that called it is named
 * instead. */
static bool cuda_itself(const char *path) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  return !strncmp(b, "libcudart", 9) || !strncmp(b, "libcuda.so", 10);
}

uintptr_t _vs_outside_caller(void) {
  void *frames[VS_OUT_FRAMES];
  int n = backtrace(frames, VS_OUT_FRAMES);
  if (!vs_own_base) {
    Dl_info self;
    if (dladdr((void *)_vs_outside_caller, &self)) vs_own_base = (uintptr_t)self.dli_fbase;
  }
  uintptr_t first = 0;
  bool in_shim = false; /* frames before the shim's own (a sanitizer's backtrace) are passed over too */
  for (int i = 0; i < n; i++) {
    Dl_info di;
    if (!dladdr(frames[i], &di) || !di.dli_fname) continue;
    if ((uintptr_t)di.dli_fbase == vs_own_base) in_shim = true;
    if ((uintptr_t)di.dli_fbase == vs_own_base || !in_shim) continue;
    if (!first) first = (uintptr_t)frames[i];
    if (!cuda_itself(di.dli_fname)) return (uintptr_t)frames[i];
  }
  return first; /* only CUDA's own frames: the runtime asked for itself */
}

/* Notes a return address's index in a table of them. Lock held. With no room in the table it is
 * not noted: looked up again next time. */
static void addr_note(vs_out_addr_t **table, uintptr_t addr, int index) {
  vs_out_addr_t *a = calloc(1, sizeof *a), *in;
  if (!a) return;
  a->addr = addr;
  a->index = index;
  HASH_ADD(hh, *table, addr, sizeof a->addr, a);
  HASH_FIND(hh, *table, &addr, sizeof addr, in);
  if (!in) free(a);
}

/* The library of a return address: its index, the name looked up once per address. Lock held. */
static int lib_of(uintptr_t addr) {
  vs_out_addr_t *c;
  HASH_FIND(hh, vs_out_lib_cache, &addr, sizeof addr, c);
  if (c) return c->index;
  Dl_info di;
  const char *path = addr && dladdr((void *)addr, &di) && di.dli_fname && di.dli_fname[0] ? di.dli_fname : "(unknown)";
  char exe[256];
  if (!strcmp(path, program_invocation_name)) { /* glibc names the program by its argv[0]: its file instead */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = 0;
      path = exe;
    }
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  int lib = 0;
  while (lib < vs_out_nlibs && strcmp(vs_out_libs[lib].name, base) != 0) lib++;
  if (lib == vs_out_nlibs) {
    if (vs_out_nlibs == VS_OUTSIDE_LIBS) {
      lib = VS_OUTSIDE_LIBS - 1; /* the last one stands for the rest */
      snprintf(vs_out_libs[lib].name, sizeof vs_out_libs[lib].name, "(other libraries)");
    } else {
      snprintf(vs_out_libs[lib].name, sizeof vs_out_libs[lib].name, "%.63s", base);
      vs_out_nlibs++;
    }
  }
  addr_note(&vs_out_lib_cache, addr, lib);
  return lib;
}

/* The call site of a return address: its index (the last one stands for the rest). Lock held. */
static int site_of(uintptr_t addr, int lib, uint32_t stack) {
  vs_out_addr_t *s;
  HASH_FIND(hh, vs_out_site_map, &addr, sizeof addr, s);
  if (s) {
    if (!vs_out_sites[s->index].stack) vs_out_sites[s->index].stack = stack;
    return s->index;
  }
  int i = vs_out_nsites < VS_OUTSIDE_SITES ? vs_out_nsites : VS_OUTSIDE_SITES - 1;
  if (i == vs_out_nsites) {
    vs_out_sites[i].addr = addr;
    vs_out_sites[i].lib = lib;
    vs_out_sites[i].stack = stack;
    vs_out_nsites++;
    addr_note(&vs_out_site_map, addr, i);
  } else {
    vs_out_sites[i].addr = 0; /* "other sites" */
    vs_out_sites[i].lib = -1;
  }
  return i;
}

/* ------------------------------------------------------------------ made and freed */

/* An entry's bytes leave its library's and its site's figures. Lock held. */
static void uncount(const vs_out_entry_t *e) {
  vs_out_libs[e->lib].bytes[e->kind] -= e->size;
  vs_out_sites[e->site].bytes -= e->size;
}

void _vs_outside_made(int kind, uint64_t key, size_t size, int dev, unsigned flags, uintptr_t caller,
                      const CUmemAllocationProp *prop) {
  if (kind < 0 || kind >= VS_OUTSIDE_KINDS || (!size && !(flags & VS_OUTSIDE_IMPORTED))) return;
  uint32_t stack = _vs_stacks_on ? _vs_stack_capture(size) : 0; /* before the lock: it takes the stacks lock */
  vs_out_entry_t *e = calloc(1, sizeof *e);
  char who[sizeof vs_out_libs[0].name];
  _vs_lock_take(&vs_out_lock);
  int lib = lib_of(caller), site = site_of(caller, lib, stack);
  memcpy(who, vs_out_libs[lib].name, sizeof who);
  if (e) {
    *e = (vs_out_entry_t){.key = key, .size = size, .kind = kind, .dev = dev, .lib = lib, .site = site, .flags = flags};
    if (prop) e->prop = *prop;
    vs_out_entry_t *old;
    HASH_FIND(hh, vs_out_entries[kind], &key, sizeof key, old);
    if (old) { /* the driver gave a key back that we missed the free of: the new one counts */
      uncount(old);
      HASH_DEL(vs_out_entries[kind], old);
      free(old);
    }
    HASH_ADD(hh, vs_out_entries[kind], key, sizeof e->key, e);
    HASH_FIND(hh, vs_out_entries[kind], &key, sizeof key, old);
    if (!old) {
      free(e);
      e = NULL;
    }
  }
  if (e) {
    vs_out_libs[lib].bytes[kind] += size;
    vs_out_sites[site].bytes += size;
    vs_out_sites[site].kind = kind;
  } else {
    vs_out_untracked += size;
  }
  _vs_lock_release(&vs_out_lock);
  if (vs_unlikely(_vs_trace_on)) _vs_trace_outside(kind, 0, dev, key, size, caller, stack);
  _vs_debug("outside: %s of %zu bytes (0x%llx) on device %d by %s", kind == VS_OUTSIDE_HOST ? "pinned host memory"
            : kind == VS_OUTSIDE_MANAGED ? "managed memory" : kind == VS_OUTSIDE_ARRAY ? "an array" : "a VMM handle",
            size, (unsigned long long)key, dev,
            who);
}

bool _vs_outside_freed(int kind, uint64_t key) {
  if (kind < 0 || kind >= VS_OUTSIDE_KINDS) return false;
  _vs_lock_take(&vs_out_lock);
  vs_out_entry_t *e;
  HASH_FIND(hh, vs_out_entries[kind], &key, sizeof key, e);
  if (e) {
    HASH_DEL(vs_out_entries[kind], e);
    uncount(e);
  }
  _vs_lock_release(&vs_out_lock);
  if (!e) return false;
  if (vs_unlikely(_vs_trace_on)) _vs_trace_outside(kind, 1, e->dev, key, e->size, 0, 0);
  free(e);
  return true;
}

unsigned _vs_outside_flags(uint64_t handle) {
  _vs_lock_take(&vs_out_lock);
  vs_out_entry_t *e;
  HASH_FIND(hh, vs_out_entries[VS_OUTSIDE_VMM], &handle, sizeof handle, e);
  unsigned f = e ? e->flags | VS_OUTSIDE_KNOWN : 0;
  _vs_lock_release(&vs_out_lock);
  return f;
}

/* ------------------------------------------------------------------ figures */

void _vs_outside_figures(vs_outside_figures_t *out) {
  memset(out, 0, sizeof *out);
  _vs_lock_take(&vs_out_lock);
  for (int k = 0; k < VS_OUTSIDE_KINDS; k++)
    for (vs_out_entry_t *e = vs_out_entries[k]; e; e = e->hh.next) {
      int d = e->dev >= 0 && e->dev < VS_OUTSIDE_DEVICES ? e->dev : 0;
      if (e->asleep) {
        out->asleep += e->size;
        continue;
      }
      if (k == VS_OUTSIDE_HOST) out->host += e->size;
      else out->dev[d][k] += e->size;
      if (k == VS_OUTSIDE_VMM && (e->flags & (VS_OUTSIDE_EXPORTABLE | VS_OUTSIDE_IMPORTED))) out->shared += e->size;
    }
  out->nlibs = vs_out_nlibs;
  memcpy(out->libs, vs_out_libs, sizeof vs_out_libs);
  out->nsites = vs_out_nsites;
  memcpy(out->sites, vs_out_sites, sizeof vs_out_sites);
  out->untracked = vs_out_untracked;
  _vs_lock_release(&vs_out_lock);
}

/* ------------------------------------------------------------------ mappings, for a foreign sleep */

/* The entry of a VMM handle. Lock held. */
static vs_out_entry_t *vmm_entry(uint64_t handle) {
  vs_out_entry_t *e;
  HASH_FIND(hh, vs_out_entries[VS_OUTSIDE_VMM], &handle, sizeof handle, e);
  return e;
}

uint64_t _vs_outside_current(uint64_t handle) {
  _vs_lock_take(&vs_out_lock);
  vs_out_alias_t *a;
  HASH_FIND(hh, vs_out_aliases, &handle, sizeof handle, a);
  uint64_t now = a ? a->now : handle;
  _vs_lock_release(&vs_out_lock);
  return now;
}

void _vs_outside_mapped(CUdeviceptr va, size_t size, size_t offset, uint64_t handle) {
  vs_out_map_t *m = calloc(1, sizeof *m);
  _vs_lock_take(&vs_out_lock);
  vs_out_entry_t *e = vmm_entry(handle);
  if (e) {
    e->maps++;
    e->va = va;
    e->pieces |= offset != 0 || size != e->size || e->maps > 1;
  }
  if (m) {
    *m = (vs_out_map_t){.va = va, .size = size, .handle = handle};
    vs_out_map_t *old;
    HASH_FIND(hh, vs_out_maps, &va, sizeof va, old);
    if (old) {
      HASH_DEL(vs_out_maps, old);
      free(old);
    }
    HASH_ADD(hh, vs_out_maps, va, sizeof m->va, m);
    HASH_FIND(hh, vs_out_maps, &va, sizeof va, old);
    if (!old) free(m);
  }
  _vs_lock_release(&vs_out_lock);
}

/* A mapping of e's handle (NULL: none known) goes. Lock held. */
static void forget_map(vs_out_map_t *m, vs_out_entry_t *e) {
  if (e && e->maps > 0) e->maps--;
  if (e && e->asleep) e->pieces = true; /* no longer mapped where it slept: the wake leaves it */
  HASH_DEL(vs_out_maps, m);
  free(m);
}

/* Unmapped [va, va + size) (whole mappings, as the driver requires): 1 when every mapping there is
 * asleep (a foreign sleep unmapped them already: the wake will not map them again, and the
 * program's unmap is done); asleep_only: forget them only then. */
int _vs_outside_unmapped(CUdeviceptr va, size_t size, bool asleep_only) {
  int n = 0, asleep = 0;
  _vs_lock_take(&vs_out_lock);
  vs_out_map_t *one;
  HASH_FIND(hh, vs_out_maps, &va, sizeof va, one);
  if (one && one->size == size) { /* one mapping, the usual case: no walk over the table */
    vs_out_entry_t *e = vmm_entry(one->handle);
    int was = e && e->asleep;
    if (!asleep_only || was) forget_map(one, e);
    _vs_lock_release(&vs_out_lock);
    return was;
  }
  for (vs_out_map_t *m = vs_out_maps; m; m = m->hh.next) {
    if (m->va < va || m->va - va >= size) continue;
    vs_out_entry_t *e = vmm_entry(m->handle);
    n++;
    asleep += e && e->asleep;
  }
  int was_asleep = n && asleep == n; /* some awake too: the driver unmaps (and refuses the range) */
  vs_out_map_t *m, *next;
  for (m = vs_out_maps; m && (!asleep_only || was_asleep); m = next) {
    next = m->hh.next;
    if (m->va < va || m->va - va >= size) continue;
    forget_map(m, vmm_entry(m->handle));
  }
  _vs_lock_release(&vs_out_lock);
  return was_asleep;
}

/* Access given to [va, va + size): kept for each whole mapping inside it, per location (the
 * latest flags); a mapping it covers in part is marked in pieces. */
/* One whole mapping's entry gets the descriptors. Lock held. */
static void give_access(vs_out_entry_t *e, const CUmemAccessDesc *desc, size_t count) {
  for (size_t i = 0; i < count && !e->pieces; i++) {
    int j = 0;
    while (j < e->naccess && (e->access[j].location.type != desc[i].location.type ||
                              e->access[j].location.id != desc[i].location.id))
      j++;
    if (j == VS_FOREIGN_ACCESS) {
      e->pieces = true;
      break;
    }
    e->access[j] = desc[i];
    if (j == e->naccess) e->naccess++;
  }
}

void _vs_outside_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count) {
  _vs_lock_take(&vs_out_lock);
  vs_out_map_t *one;
  HASH_FIND(hh, vs_out_maps, &va, sizeof va, one);
  if (one && one->size == size) { /* one mapping, the usual case: no walk over the table */
    vs_out_entry_t *e = vmm_entry(one->handle);
    if (e) give_access(e, desc, count);
    _vs_lock_release(&vs_out_lock);
    return;
  }
  for (vs_out_map_t *m = vs_out_maps; m; m = m->hh.next) {
    if (m->va + m->size <= va || m->va >= va + size) continue;
    vs_out_entry_t *e = vmm_entry(m->handle);
    if (!e) continue;
    if (m->va < va || m->va + m->size > va + size) {
      e->pieces = true;
      continue;
    }
    give_access(e, desc, count);
  }
  _vs_lock_release(&vs_out_lock);
}

/* A VMM handle's figures, for a foreign sleep or wake. Lock held. */
static void to_foreign(vs_foreign_t *f, const vs_out_entry_t *e) {
  memset(f, 0, sizeof *f);
  f->handle = e->key, f->va = e->va, f->size = e->size, f->dev = e->dev, f->prop = e->prop;
  memcpy(f->access, e->access, sizeof f->access);
  f->naccess = e->naccess;
  snprintf(f->lib, sizeof f->lib, "%s", vs_out_libs[e->lib].name);
}

/* A foreign sleep's candidates: every awake VMM handle of a library that matches (lib_ok) with
 * the reason it cannot sleep, or NULL. */
int _vs_outside_foreign(vs_foreign_t *out, int max, bool (*lib_ok)(const char *name)) {
  int n = 0;
  _vs_lock_take(&vs_out_lock);
  for (vs_out_entry_t *e = vs_out_entries[VS_OUTSIDE_VMM]; e && n < max; e = e->hh.next) {
    if (e->asleep || !lib_ok(vs_out_libs[e->lib].name)) continue;
    vs_foreign_t *f = &out[n++];
    to_foreign(f, e);
    if (e->flags & VS_OUTSIDE_IMPORTED) f->skip = "imported, stays";
    else if (e->flags & VS_OUTSIDE_EXPORTABLE) f->skip = "exportable, stays";
    else if (!e->maps) f->skip = "not mapped, stays";
    else if (e->pieces) f->skip = "mapped in pieces, stays";
    else if (!e->naccess) f->skip = "no access set, stays";
  }
  _vs_lock_release(&vs_out_lock);
  return n;
}

void _vs_outside_set_asleep(uint64_t handle, void *copy) {
  _vs_lock_take(&vs_out_lock);
  vs_out_entry_t *e = vmm_entry(handle);
  if (e) e->asleep = copy;
  _vs_lock_release(&vs_out_lock);
}

/* The handles asleep: their figures and copies (out[i].copy). */
int _vs_outside_asleep_list(vs_foreign_t *out, int max) {
  int n = 0;
  _vs_lock_take(&vs_out_lock);
  for (vs_out_entry_t *e = vs_out_entries[VS_OUTSIDE_VMM]; e && n < max; e = e->hh.next) {
    if (!e->asleep) continue;
    vs_foreign_t *f = &out[n++];
    to_foreign(f, e);
    f->copy = e->asleep;
    f->skip = e->pieces ? "unmapped by the program while asleep" : NULL;
  }
  _vs_lock_release(&vs_out_lock);
  return n;
}

/* Woken as handle now (0: dropped, the program unmapped it meanwhile): the entry takes the new
 * value, the program's old one is translated from now on. */
void _vs_outside_woken(uint64_t old, uint64_t now) {
  vs_out_alias_t *a = now ? calloc(1, sizeof *a) : NULL;
  _vs_lock_take(&vs_out_lock);
  vs_out_entry_t *e = vmm_entry(old);
  if (e) {
    HASH_DEL(vs_out_entries[VS_OUTSIDE_VMM], e);
    e->asleep = NULL;
    e->key = now;
    if (now) HASH_ADD(hh, vs_out_entries[VS_OUTSIDE_VMM], key, sizeof e->key, e);
    if (!now) {
      uncount(e);
      free(e);
    }
  }
  for (vs_out_map_t *m = vs_out_maps; m && now; m = m->hh.next)
    if (m->handle == old) m->handle = now;
  if (a) {
    /* The program knows the handle by its first value: an alias of an alias points at the first. */
    uint64_t first = old;
    for (vs_out_alias_t *x = vs_out_aliases; x; x = x->hh.next)
      if (x->now == old) first = x->old, x->now = now;
    vs_out_alias_t *in;
    HASH_FIND(hh, vs_out_aliases, &first, sizeof first, in);
    if (!in) {
      a->old = first, a->now = now;
      HASH_ADD(hh, vs_out_aliases, old, sizeof a->old, a);
      a = NULL;
    }
  }
  _vs_lock_release(&vs_out_lock);
  free(a);
}

/* The program releases a handle: its value translated (an alias dropped); *asleep_copy the copy
 * of a handle asleep (the release is then the shim's to finish: nothing is on the device). */
uint64_t _vs_outside_release_begin(uint64_t handle, void **asleep_copy) {
  *asleep_copy = NULL;
  _vs_lock_take(&vs_out_lock);
  vs_out_alias_t *a;
  HASH_FIND(hh, vs_out_aliases, &handle, sizeof handle, a);
  uint64_t now = handle;
  if (a) {
    now = a->now;
    HASH_DEL(vs_out_aliases, a);
    free(a);
  }
  vs_out_entry_t *e = vmm_entry(now);
  if (e && e->asleep) *asleep_copy = e->asleep;
  _vs_lock_release(&vs_out_lock);
  return now;
}
