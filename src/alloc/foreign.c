/* foreign.c: the VMM memory libraries make themselves, put to sleep with every tag
 * (VMMSHIM_SLEEP_FOREIGN, docs/sleep.md "Foreign memory").
 *
 * A sleep of every tag (and of a level) takes, after the shim's own pools and still behind the
 * closed gate, every handle outside.c knows of a library the option names that is mapped whole,
 * once, with its access set on that one mapping, and neither exported nor imported: its bytes are
 * copied to host memory (none in discard mode), it is unmapped and released. The wake of every
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

/* One handle off the device: false (and nothing changed) when a step failed. */
static bool sleep_one(const vs_foreign_t *f, int mode, vmmshim_sleep_result_t *res) {
  vs_device_caps_t caps;
  if (!_vs_cu.cuMemcpyDtoH || !enter_device(f->dev, &caps)) return false;
  void *copy = VS_FOREIGN_DISCARDED;
  bool ok = true;
  if (mode != VMMSHIM_SLEEP_DISCARD) {
    copy = malloc(f->size);
    ok = copy && _vs_cu.cuMemcpyDtoH(copy, f->va, f->size) == CUDA_SUCCESS;
  }
  ok = ok && _vs_vmm_unmap(&caps, f->va, f->size) == CUDA_SUCCESS;
  if (ok && _vs_vmm_release(&caps, f->handle, f->size) != CUDA_SUCCESS) {
    /* Still the program's: map it back where it was, with its access. */
    ok = false;
    if (_vs_vmm_map(&caps, f->va, f->size, f->handle) == CUDA_SUCCESS)
      _vs_vmm_set_access_as(&caps, f->va, f->size, f->access, (size_t)f->naccess);
  }
  leave_device(f->dev);
  if (!ok) {
    if (copy != VS_FOREIGN_DISCARDED) free(copy);
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
  if (mode == VMMSHIM_SLEEP_MAPPED) mode = VMMSHIM_SLEEP_HOST; /* not served from host memory: copied there */
  int n = _vs_outside_foreign(vs_foreign, VS_FOREIGN_MAX, lib_named), moved = 0;
  for (int i = 0; i < n; i++) {
    const vs_foreign_t *f = &vs_foreign[i];
    if (!f->skip && sleep_one(f, mode, res)) {
      moved++;
      continue;
    }
    res->skipped += f->size;
    add_reason(res, f->lib, f->skip ? f->skip : "copying or unmapping failed, stays");
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
  if (ok && f->copy != VS_FOREIGN_DISCARDED) ok = _vs_cu.cuMemcpyHtoD(f->va, f->copy, f->size) == CUDA_SUCCESS;
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
  if (copy && copy != VS_FOREIGN_DISCARDED) free(copy);
}
