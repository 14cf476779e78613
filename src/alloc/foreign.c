/* foreign.c: the VMM memory libraries make themselves, put to sleep with every tag
 * (VMMSHIM_SLEEP_FOREIGN, docs/sleep.md "Foreign memory").
 *
 * A sleep of every tag (and of a level) takes, after the shim's own pools and still behind the
 * closed gate, every handle outside.c knows of a library the option names that is mapped whole,
 * once, with its access set on that one mapping, and neither exported nor imported: its bytes are
 * copied to the shim's host buffers (none in discard mode), it is unmapped and released. The wake of every
 * tag makes a handle of the same properties, maps it at the same address, gives every location
 * the access it had and copies the bytes back. The program keeps the handle value it had: its
 * hooks translate it (cuMemMap, cuMemRelease), and an unmap or release of memory still asleep is
 * done by the shim. Handles shared with another process stay, and so do those mapped in pieces,
 * each counted in the result's skipped bytes with the reason. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/alloc.h"

#define VS_FOREIGN_MAX 1024 /* handles a sleep looks at */

static vs_foreign_t vs_foreign[VS_FOREIGN_MAX]; /* under the sleep lock (sleep.c) */

/* Whether the option names library `name` (a file name such as libnccl.so.2). */
static bool lib_named(const char *name) {
  const char *spec = _vs_option_string(VS_OPT_SLEEP_FOREIGN);
  if (!spec || !strcmp(spec, "none")) return false;
  if (!strcmp(spec, "all")) return true;
  char glob[256];
  for (const char *p = spec; *p;) {
    size_t n = strcspn(p, ",");
    snprintf(glob, sizeof glob, "%.*s", (int)n, p);
    if (fnmatch(glob, name, 0) == 0) return true;
    p += n + (p[n] == ',');
  }
  return false;
}

/* "LIB: WHY" once each into the result's reason (as much as fits). */
static void add_reason(vmmshim_sleep_result_t *res, const char *lib, const char *why) {
  char one[96];
  snprintf(one, sizeof one, "%s: %s", lib, why);
  if (strstr(res->reason, one)) return;
  size_t used = strlen(res->reason);
  if (used + 8 < sizeof res->reason) snprintf(res->reason + used, sizeof res->reason - used, "%s%s", used ? "; " : "", one);
}

/* In a context of dev (its primary context) for the copies. */
static bool enter_device(int dev, vs_device_caps_t *caps) {
  CUcontext ctx;
  if (_vs_vmm_query(dev, caps) != CUDA_SUCCESS || _vs_cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    return false;
  if (_vs_cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS) return true;
  _vs_cu.cuDevicePrimaryCtxRelease(dev);
  return false;
}
static void leave_device(int dev) {
  CUcontext popped;
  _vs_cu.cuCtxPopCurrent(&popped);
  _vs_cu.cuDevicePrimaryCtxRelease(dev);
}

/* A sleeping handle's bytes: in the shim's host buffers (src/handle/host.c: host-location VMM
 * memory the device copies to at the link's speed, kept and reused across cycles), else, where
 * the driver has no host VMM, in pageable memory (cuMemcpyDtoH, far slower). */
typedef struct vs_fcopy_s {
  vs_device_caps_t caps;
  void *plain; /* the pageable copy, or NULL */
  int nbufs;
  vs_host_buf_t bufs[];
} vs_fcopy_t;

static size_t piece(size_t size, int i) {
  size_t left = size - (size_t)i * VS_HOST_CHUNK;
  return left < VS_HOST_CHUNK ? left : VS_HOST_CHUNK;
}

static void copy_free(vs_fcopy_t *c) {
  for (int i = 0; i < c->nbufs; i++) _vs_host_give(&c->caps, &c->bufs[i]);
  free(c->plain);
  free(c);
}

/* The copies between the handle and the host buffers, queued on the legacy stream of the device's
 * primary context (every context is idle behind the gate), then waited for at once. */
static bool copy_bufs(const vs_foreign_t *f, vs_fcopy_t *c, bool to_host) {
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < c->nbufs && r == CUDA_SUCCESS; i++) {
    CUdeviceptr dev = f->va + (CUdeviceptr)i * VS_HOST_CHUNK, host = c->bufs[i].home;
    r = _vs_cu.cuMemcpyDtoDAsync(to_host ? host : dev, to_host ? dev : host, piece(f->size, i), NULL);
  }
  CUresult s = _vs_cu.cuStreamSynchronize(NULL);
  if (r != CUDA_SUCCESS || s != CUDA_SUCCESS)
    _vs_warn("foreign %s of %s: %s", to_host ? "sleep" : "wake", f->lib, _vs_cu_error_name(r != CUDA_SUCCESS ? r : s));
  return r == CUDA_SUCCESS && s == CUDA_SUCCESS;
}

/* Copies the handle's bytes out: NULL (nothing kept) when that failed; *why says why. */
static vs_fcopy_t *copy_out(const vs_foreign_t *f, const vs_device_caps_t *caps, const char **why) {
  int n = caps->host_vmm_supported ? (int)((f->size + VS_HOST_CHUNK - 1) / VS_HOST_CHUNK) : 0;
  vs_fcopy_t *c = calloc(1, sizeof *c + (size_t)n * sizeof c->bufs[0]);
  if (!c) return NULL;
  c->caps = *caps;
  CUresult r = CUDA_SUCCESS;
  while (c->nbufs < n && (r = _vs_host_take(caps, piece(f->size, c->nbufs), &c->bufs[c->nbufs])) == CUDA_SUCCESS)
    c->nbufs++;
  if (n && r != CUDA_SUCCESS) { /* under VMMSHIM_HOST_LIMIT, the shim's pools come first: it stays */
    *why = r == CUDA_ERROR_OUT_OF_MEMORY ? "no host memory under VMMSHIM_HOST_LIMIT, stays" : "no host buffer, stays";
    copy_free(c);
    return NULL;
  }
  bool ok = n ? copy_bufs(f, c, true)
              : (c->plain = malloc(f->size)) != NULL && _vs_cu.cuMemcpyDtoH(c->plain, f->va, f->size) == CUDA_SUCCESS;
  if (!ok) {
    copy_free(c);
    return NULL;
  }
  return c;
}

/* One handle off the device: false (and nothing changed) when a step failed; *why says why. */
static bool sleep_one(const vs_foreign_t *f, int mode, vmmshim_sleep_result_t *res, const char **why) {
  vs_device_caps_t caps;
  if (!_vs_cu.cuMemcpyDtoH || !enter_device(f->dev, &caps)) return false;
  void *copy = VS_FOREIGN_DISCARDED;
  bool ok = true;
  if (mode != VMMSHIM_SLEEP_DISCARD) ok = (copy = copy_out(f, &caps, why)) != NULL;
  ok = ok && _vs_vmm_unmap(&caps, f->va, f->size) == CUDA_SUCCESS;
  if (ok && _vs_vmm_release(&caps, f->handle, f->size) != CUDA_SUCCESS) {
    /* Still the program's: map it back where it was, with its access. */
    ok = false;
    if (_vs_vmm_map(&caps, f->va, f->size, f->handle) == CUDA_SUCCESS)
      _vs_vmm_set_access_as(&caps, f->va, f->size, f->access, (size_t)f->naccess);
  }
  leave_device(f->dev);
  if (!ok) {
    _vs_foreign_drop(copy);
    return false;
  }
  _vs_outside_set_asleep(f->handle, copy);
  res->released += f->size;
  if (copy == VS_FOREIGN_DISCARDED) res->discarded += f->size;
  else res->to_host += f->size;
  return true;
}

int _vs_foreign_sleep(int mode, vmmshim_sleep_result_t *res) {
  const char *spec = _vs_option_string(VS_OPT_SLEEP_FOREIGN);
  if (!spec || !strcmp(spec, "none")) return 0;
  /* Mapped mode serves a tag from host memory at its address; a library's handle is copied
   * instead (docs/sleep.md): its kernels would run against host memory, and the handle value it
   * keeps would name host memory. */
  if (mode == VMMSHIM_SLEEP_MAPPED) mode = VMMSHIM_SLEEP_HOST;
  int n = _vs_outside_foreign(vs_foreign, VS_FOREIGN_MAX, lib_named), moved = 0;
  for (int i = 0; i < n; i++) {
    const vs_foreign_t *f = &vs_foreign[i];
    const char *why = "copying or unmapping failed, stays";
    if (!f->skip && sleep_one(f, mode, res, &why)) {
      moved++;
      continue;
    }
    res->skipped += f->size;
    add_reason(res, f->lib, f->skip ? f->skip : why);
  }
  if (n) _vs_info("foreign sleep: %d of %d handles of the libraries '%s' left the device", moved, n, spec);
  return moved;
}

/* One handle back: false (it stays asleep, its bytes kept) when a step failed. */
static bool wake_one(const vs_foreign_t *f, vmmshim_sleep_result_t *res) {
  vs_device_caps_t caps;
  if (!enter_device(f->dev, &caps)) return false;
  CUmemGenericAllocationHandle h = 0;
  bool ok = _vs_vmm_create_as(&caps, f->size, &f->prop, &h) == CUDA_SUCCESS;
  bool mapped = ok && _vs_vmm_map(&caps, f->va, f->size, h) == CUDA_SUCCESS;
  ok = mapped && _vs_vmm_set_access_as(&caps, f->va, f->size, f->access, (size_t)f->naccess) == CUDA_SUCCESS;
  const vs_fcopy_t *c = f->copy;
  if (ok && f->copy != VS_FOREIGN_DISCARDED)
    ok = c->plain ? _vs_cu.cuMemcpyHtoD(f->va, c->plain, f->size) == CUDA_SUCCESS : copy_bufs(f, (vs_fcopy_t *)c, false);
  if (!ok) {
    if (mapped) _vs_vmm_unmap(&caps, f->va, f->size);
    if (h) _vs_vmm_release(&caps, h, f->size);
  }
  leave_device(f->dev);
  if (!ok) return false;
  _vs_outside_woken(f->handle, h);
  _vs_foreign_drop(f->copy);
  res->restored += f->size;
  if (f->copy != VS_FOREIGN_DISCARDED) res->to_host += f->size;
  return true;
}

int _vs_foreign_wake(vmmshim_sleep_result_t *res) {
  int n = _vs_outside_asleep_list(vs_foreign, VS_FOREIGN_MAX);
  for (int i = 0; i < n; i++) {
    const vs_foreign_t *f = &vs_foreign[i];
    if (f->skip) { /* the program unmapped it while it slept: nothing to map again */
      _vs_outside_woken(f->handle, 0);
      _vs_foreign_drop(f->copy);
      continue;
    }
    if (wake_one(f, res)) continue;
    res->skipped += f->size;
    add_reason(res, f->lib, "still asleep (no room, or a driver call failed)");
  }
  return n;
}

void _vs_foreign_drop(void *copy) {
  if (copy && copy != VS_FOREIGN_DISCARDED) copy_free(copy);
}
