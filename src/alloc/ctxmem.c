/* ctxmem.c: what contexts and loaded modules take of the device, for the residue.
 *
 * The driver does not say how much a context or a module takes; the change of the device's
 * free memory around its creation does (src/hook/hook_outside.c calls _vs_ctxmem_before and
 * _vs_ctxmem_after around cuCtxCreate, cuDevicePrimaryCtxRetain of an inactive primary context,
 * cuModuleLoad* and cuLibraryLoad*). The free memory is read with cuMemGetInfo in the current
 * context when it is of the same device; the first context of a device has no context to read
 * it in, so NVML's figure of the device is read before and after instead (none: not measured,
 * and the residue says so). Around a context's creation, other processes' memory (NVML, by pid)
 * is read too, and what they took meanwhile is not counted. A context destroyed or a module
 * unloaded gives its figure back. Rare paths: a leaf lock over a small table, no driver call
 * under it. */
#include <stdlib.h>
#include <uthash.h>

#include "vmmshim/alloc.h"

typedef struct vs_ctxmem_s {
  uintptr_t key; /* the context, module or library handle */
  uintptr_t ctx; /* a module's context (it ends with it), a context's own handle */
  int dev, kind;
  uint64_t bytes;
  UT_hash_handle hh;
} vs_ctxmem_t;

static vs_lock_t vs_ctxmem_lock = VS_LOCK_INITIALIZER(VS_RANK_RESIDUE, "ctxmem");
static vs_ctxmem_t *vs_ctxmem;
static uint64_t vs_ctxmem_bytes[VS_OUTSIDE_DEVICES][VS_CTXMEM_KINDS];
static unsigned vs_ctxmem_missed[VS_CTXMEM_KINDS];
static uintptr_t vs_ctxmem_primary[VS_OUTSIDE_DEVICES];

/* The device's free memory by the probe's source. */
static bool free_now(vs_ctxmem_probe_t *p, uint64_t *fr) {
  if (p->source == VS_CTXMEM_CURRENT) {
    CUdevice cur = -1;
    size_t f = 0, t = 0;
    if (_vs_cu.cuCtxGetDevice(&cur) != CUDA_SUCCESS || cur != p->dev || _vs_cu.cuMemGetInfo(&f, &t) != CUDA_SUCCESS)
      return false;
    *fr = f;
    return true;
  }
  return p->source == VS_CTXMEM_NVML && _vs_nvml_device_free(p->dev, fr);
}

void _vs_ctxmem_before(vs_ctxmem_probe_t *p, int dev, int kind) {
  p->dev = dev;
  p->kind = kind;
  p->source = VS_CTXMEM_NONE;
  p->others_known = false;
  p->ctx = 0;
  CUcontext now = NULL;
  if (kind == VS_CTXMEM_MODULE && _vs_cu.cuCtxGetCurrent(&now) == CUDA_SUCCESS) p->ctx = (uintptr_t)now;
  CUdevice cur = -1;
  if (_vs_cu.cuCtxGetDevice && _vs_cu.cuCtxGetDevice(&cur) == CUDA_SUCCESS && (dev < 0 || cur == dev)) {
    p->dev = cur;
    p->source = VS_CTXMEM_CURRENT;
  } else if (dev >= 0) {
    p->source = VS_CTXMEM_NVML;
  }
  if (p->source != VS_CTXMEM_NONE && !free_now(p, &p->free)) p->source = VS_CTXMEM_NONE;
  if (p->source != VS_CTXMEM_NONE && kind == VS_CTXMEM_CONTEXT) p->others_known = _vs_nvml_others_on(p->dev, &p->others);
}

static void record(uintptr_t key, uintptr_t ctx, int dev, int kind, uint64_t bytes) {
  vs_ctxmem_t *e = malloc(sizeof *e);
  _vs_lock_take(&vs_ctxmem_lock);
  vs_ctxmem_t *old = NULL;
  HASH_FIND(hh, vs_ctxmem, &key, sizeof key, old);
  if (old) { /* a handle the driver gave again: its old figure went with the old one */
    vs_ctxmem_bytes[old->dev][old->kind] -= old->bytes;
    HASH_DEL(vs_ctxmem, old);
    free(old);
  }
  if (e) {
    *e = (vs_ctxmem_t){.key = key, .ctx = ctx, .dev = dev, .kind = kind, .bytes = bytes};
    HASH_ADD(hh, vs_ctxmem, key, sizeof e->key, e);
    vs_ctxmem_bytes[dev][kind] += bytes;
  }
  _vs_lock_release(&vs_ctxmem_lock);
}

void _vs_ctxmem_after(vs_ctxmem_probe_t *p, uintptr_t key, bool primary) {
  uint64_t after = 0, others = 0;
  bool ok = p->source != VS_CTXMEM_NONE && p->dev >= 0 && p->dev < VS_OUTSIDE_DEVICES && free_now(p, &after);
  if (!ok) {
    _vs_lock_take(&vs_ctxmem_lock);
    vs_ctxmem_missed[p->kind]++;
    _vs_lock_release(&vs_ctxmem_lock);
    return;
  }
  uint64_t taken = p->free > after ? p->free - after : 0;
  /* Other processes' growth meanwhile is theirs (unknown without NVML: counted, docs/sleep.md). */
  if (p->others_known && _vs_nvml_others_on(p->dev, &others) && others > p->others) {
    uint64_t theirs = others - p->others;
    taken = taken > theirs ? taken - theirs : 0;
  }
  record(key, p->kind == VS_CTXMEM_MODULE ? p->ctx : key, p->dev, p->kind, taken);
  if (primary) {
    _vs_lock_take(&vs_ctxmem_lock);
    vs_ctxmem_primary[p->dev] = key;
    _vs_lock_release(&vs_ctxmem_lock);
  }
}

/* A context that ends takes its modules with it. */
void _vs_ctxmem_gone(uintptr_t key) {
  _vs_lock_take(&vs_ctxmem_lock);
  vs_ctxmem_t *e = NULL, *tmp = NULL, *gone = NULL;
  HASH_ITER(hh, vs_ctxmem, e, tmp) {
    if (e->key != key && e->ctx != key) continue; /* a context's entry has ctx == key */
    vs_ctxmem_bytes[e->dev][e->kind] -= e->bytes;
    HASH_DEL(vs_ctxmem, e);
    e->hh.next = gone; /* freed after the lock */
    gone = e;
  }
  _vs_lock_release(&vs_ctxmem_lock);
  while (gone) {
    e = gone->hh.next;
    free(gone);
    gone = e;
  }
}

void _vs_ctxmem_primary_gone(int dev) {
  if (dev < 0 || dev >= VS_OUTSIDE_DEVICES) return;
  _vs_lock_take(&vs_ctxmem_lock);
  uintptr_t key = vs_ctxmem_primary[dev];
  vs_ctxmem_primary[dev] = 0;
  _vs_lock_release(&vs_ctxmem_lock);
  if (key) _vs_ctxmem_gone(key);
}

unsigned _vs_ctxmem_figures(int dev, uint64_t *context, uint64_t *modules, unsigned *missed_modules) {
  *context = *modules = 0;
  _vs_lock_take(&vs_ctxmem_lock);
  if (dev >= 0 && dev < VS_OUTSIDE_DEVICES) {
    *context = vs_ctxmem_bytes[dev][VS_CTXMEM_CONTEXT];
    *modules = vs_ctxmem_bytes[dev][VS_CTXMEM_MODULE];
  }
  unsigned missed = vs_ctxmem_missed[VS_CTXMEM_CONTEXT];
  *missed_modules = vs_ctxmem_missed[VS_CTXMEM_MODULE];
  _vs_lock_release(&vs_ctxmem_lock);
  return missed;
}
