/* api.c: the front door. Every public function of include/vmmshim.h is defined here and
 * nowhere else, each a thin call into the layer that does the work (argument and size checks
 * are made here; the work stays in its layer, behind the _vs_* functions its header declares).
 *
 * A program finds these with dlsym(RTLD_DEFAULT, "vmmshim_...") at run time (vmmshim.h says
 * why): they are the only vmmshim_* symbols the library exports. */
#include <errno.h>

#include "vmmshim/alloc.h"

/* ------------------------------------------------------------------ counters and state */

VS_API int vmmshim_get_stats(vmmshim_stats_t *out, size_t size) {
  if (!out || size != sizeof *out) return -1;
  _vs_stats_get(out);
  return 0;
}

VS_API size_t vmmshim_trim(void) { return _vs_trim_all(); }

VS_API int vmmshim_active(void) { return _vs_active() ? 1 : 0; }

VS_API int vmmshim_dump(void) { return _vs_report_dump(); }

/* ------------------------------------------------------------------ tags */

VS_API int vmmshim_api_version(void) { return VMMSHIM_API_VERSION; }

VS_API int vmmshim_set_tag(const char *tag) { return _vs_set_thread_tag(tag); }

VS_API int vmmshim_set_process_tag(const char *tag) { return _vs_set_process_tag(tag); }

VS_API int vmmshim_get_tag(char *buf, size_t n) {
  if (!buf || !n) return -EINVAL;
  return _vs_get_tag(buf, n);
}

VS_API int vmmshim_set_tag_keep(const char *tag, int keep) { return _vs_set_tag_keep(tag, keep != 0); }

VS_API int vmmshim_set_tag_rules(const char *spec, char *err, size_t errlen) {
  return _vs_set_tag_rules(spec, err, errlen);
}

/* ------------------------------------------------------------------ sleep and wake */

VS_API int vmmshim_sleep(const char *tag, vmmshim_sleep_mode_t mode, vmmshim_sleep_result_t *out, size_t size) {
  if (out && size != sizeof *out) return -EINVAL;
  return _vs_sleep(tag, (int)mode, out);
}

VS_API int vmmshim_wake(const char *tag, unsigned flags, vmmshim_sleep_result_t *out, size_t size) {
  if (out && size != sizeof *out) return -EINVAL;
  return _vs_wake(tag, flags, out);
}

VS_API int vmmshim_sleep_level(int level, int mapped, vmmshim_sleep_result_t *out, size_t size) {
  if (out && size != sizeof *out) return -EINVAL;
  return _vs_sleep_level(level, mapped, out);
}

VS_API int vmmshim_promote(vmmshim_sleep_result_t *out, size_t size) {
  if (out && size != sizeof *out) return -EINVAL;
  return _vs_promote(out);
}

VS_API int vmmshim_tag_stats(vmmshim_tag_stats_t *out, int max, size_t size) {
  if (size != sizeof(vmmshim_tag_stats_t) || max < 0 || (max && !out)) return -EINVAL;
  return _vs_tag_stats(out, max);
}

VS_API int vmmshim_host_memory(uint64_t *in_use, uint64_t *cached) {
  size_t c = 0, l = 0;
  _vs_host_counts(&c, &l);
  if (in_use) *in_use = l;
  if (cached) *cached = c;
  return 0;
}

VS_API int vmmshim_host_copy(const void *addr, void **home, size_t *len) {
  if (!home || !len) return -EINVAL;
  CUdeviceptr h = 0;
  int rc = _vs_host_copy_at((CUdeviceptr)(uintptr_t)addr, &h, len);
  *home = rc ? NULL : (void *)(uintptr_t)h;
  if (rc) *len = 0;
  return rc;
}

VS_API int vmmshim_set_disk_dir(const char *dir) { return _vs_disk_set_dir(dir); }

VS_API size_t vmmshim_release_host(size_t keep) { return _vs_active() ? _vs_release_host(keep) : 0; }

/* ------------------------------------------------------------------ the residue */

VS_API int vmmshim_residue(vmmshim_residue_t *out, size_t size) {
  if (!out || size != sizeof *out) return -EINVAL;
  return _vs_residue(out);
}

VS_API int vmmshim_host_view(const void *addr, size_t size, void **host) {
  if (!host) return -EINVAL;
  *host = NULL;
  if (!size) return -EINVAL;
  CUdeviceptr h = 0;
  int rc = _vs_host_view_at((CUdeviceptr)(uintptr_t)addr, size, &h);
  if (!rc) *host = (void *)(uintptr_t)h;
  return rc;
}
