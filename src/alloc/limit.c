/* limit.c: what an allocation does when the limit refuses it (VMMSHIM_ON_LIMIT), after the pool's
 * ladder and the process's other pools have given back what they held idle (alloc.c):
 *   fail  out of memory, with the memory report (alloc.c);
 *   wait  sleeps until bytes come back to the budget (another member's release, a limit raised:
 *         group.c wakes it through a futex on the segment) and tries again, until SECONDS pass;
 *         meanwhile the members' frees give their idle memory back. Each wait says what it waits
 *         for (rate-limited); one that could never end (group.c: _vs_group_hopeless) fails at once;
 *   host  the growth is served from host memory mapped at the pool's own addresses (asleep.c):
 *         the program keeps running on it, over the link, until vmmshim_promote moves it back;
 *   balloon  members of the group of lower priority, lowest first, are asked to move cold tags out
 *         of the device (borrow.c, balloon.c) until the growth fits or SECONDS (default 2) pass;
 *         then it fails as `fail` does. */
#include <errno.h>
#include <stdio.h>

#include "vmmshim/alloc.h"
#include "vmmshim/trace.h"

atomic_size_t _vs_host_mapped_bytes; /* served from host memory at their addresses, all pools */

static vs_rate_t vs_wait_said; /* a line at every wait, at most one a second */

/* What the wait is for, at the default log level: a program that stops for it says why. */
static void say_waiting(int dev, size_t size, uint64_t secs) {
  vs_group_view_t v;
  char what[160] = "the limit";
  if (_vs_group_view(dev, &v)) {
    bool per = v.limit_dev && (!v.limit_all || v.limit_dev < v.limit_all);
    uint64_t limit = per ? v.limit_dev : v.limit_all, mapped = per ? v.total_dev : v.total_all;
    snprintf(what, sizeof what, "%s%s%s's limit of %llu bytes%s (%llu mapped)", v.shared ? "group '" : "",
             v.shared ? v.name : "this process", v.shared ? "'" : "", (unsigned long long)limit,
             per ? " on this device" : "", (unsigned long long)mapped);
  }
  char until[80] = "";
  if (secs) snprintf(until, sizeof until, " (at most %llu s: VMMSHIM_ON_LIMIT=wait:%llu)", (unsigned long long)secs,
                     (unsigned long long)secs);
  _vs_warn_rated(&vs_wait_said, "device %d: %zu bytes do not fit under %s: waiting for memory to come back%s", dev, size,
                 what, until);
}

static vs_pool_status_t wait_for_room(vs_pool_t *pool, size_t size, CUstream stream, vmmshim_api_t api, CUdeviceptr *ptr,
                                      size_t *served, CUresult *err) {
  uint64_t secs = _vs_option_arg(VS_OPT_ON_LIMIT), t0 = _vs_now_ns();
  uint64_t deadline = secs ? t0 + secs * 1000000000ull : UINT64_MAX;
  int dev = _vs_pool_device(pool);
  char why[256];
  if (_vs_group_hopeless(dev, size, why, sizeof why)) {
    _vs_warn("device %d: %zu bytes: VMMSHIM_ON_LIMIT=wait fails at once (%s), the wait could never end: %s", dev, size,
             _vs_cu_error_name(CUDA_ERROR_OUT_OF_MEMORY), why);
    return VS_POOL_LIMIT;
  }
  say_waiting(dev, size, secs);
  vs_pool_status_t st = VS_POOL_LIMIT;
  bool contended = false, more = true;
  while (st == VS_POOL_LIMIT && more) {
    more = _vs_group_wait(deadline);
    st = _vs_pool_alloc(pool, size, stream, api, ptr, served, err, &contended);
  }
  double ms = (double)(_vs_now_ns() - t0) / 1e6;
  if (st == VS_POOL_OK) _vs_info("device %d: %zu bytes fit under the limit after %.1f ms", dev, size, ms);
  else _vs_warn("device %d: %zu bytes waited %.0f ms under the limit (VMMSHIM_ON_LIMIT=wait:%llu) and did not fit", dev,
                size, ms, (unsigned long long)secs);
  return st;
}

static vs_pool_status_t serve_on_host(vs_pool_t *pool, vs_pool_status_t st, size_t size, CUstream stream, CUdeviceptr *ptr,
                                      size_t *served) {
  CUresult herr = CUDA_SUCCESS;
  size_t grown = 0;
  if (_vs_pool_alloc_host(pool, size, stream, ptr, served, &herr, &grown) == VS_POOL_OK) {
    if (grown) atomic_fetch_add(&_vs_host_mapped_bytes, grown);
    return VS_POOL_OK;
  }
  static atomic_bool said;
  if (!atomic_exchange(&said, true))
    _vs_warn("device %d: %zu bytes past the limit cannot be served from host memory: %s (%s)", _vs_pool_device(pool),
             size,
             herr == CUDA_ERROR_NOT_SUPPORTED ? "the device cannot map host memory (HOST_NUMA VMM)"
                                              : "VMMSHIM_ON_LIMIT=host:SIZE or VMMSHIM_HOST_LIMIT reached, or the host has no more",
             _vs_cu_error_name(herr));
  return st;
}

#define VS_BALLOON_DEFAULT_S 2
#define VS_BALLOON_LENDERS 32

static vs_rate_t vs_borrow_said;

static vs_pool_status_t borrow_room(vs_pool_t *pool, size_t size, CUstream stream, vmmshim_api_t api, CUdeviceptr *ptr,
                                    size_t *served, CUresult *err) {
  uint64_t secs = _vs_option_arg(VS_OPT_ON_LIMIT), t0 = _vs_now_ns();
  uint64_t deadline = t0 + (secs ? secs : VS_BALLOON_DEFAULT_S) * 1000000000ull, got_all = 0;
  pid_t lenders[VS_BALLOON_LENDERS];
  int n = _vs_group_lenders(lenders, VS_BALLOON_LENDERS), asked = 0;
  vs_pool_status_t st = VS_POOL_LIMIT;
  char why[256] = "no member of the group has a lower priority (VMMSHIM_PRIORITY)";
  bool contended = false;
  double lenders_ms = 0;
  for (int i = 0; i < n && st == VS_POOL_LIMIT && _vs_now_ns() < deadline;) {
    uint64_t got = 0;
    double lender_ms = 0;
    asked++;
    int rc = _vs_borrow(lenders[i], size, deadline, &got, &lender_ms, why, sizeof why);
    lenders_ms += lender_ms;
    if (rc != 0 || !got) {
      i++; /* nothing more from this one: the next */
      continue;
    }
    got_all += got;
    st = _vs_pool_alloc(pool, size, stream, api, ptr, served, err, &contended);
  }
  double ms = (double)(_vs_now_ns() - t0) / 1e6;
  if (vs_unlikely(_vs_trace_on))
    _vs_trace_group(VS_TRACE_GROUP_BORROWED, 0, got_all, st == VS_POOL_OK ? 0 : -ENOMEM, _vs_now_ns() - t0);
  if (st == VS_POOL_OK) {
    _vs_info("device %d: %zu bytes fit after %llu bytes were lent by lower-priority members, in %.1f ms (%.1f ms "
             "of it the lenders' moves)", _vs_pool_device(pool), size, (unsigned long long)got_all, ms, lenders_ms);
    return st;
  }
  _vs_warn_rated(&vs_borrow_said, "device %d: %zu bytes did not fit under the group's limit after asking %d "
                 "lower-priority member%s (%llu bytes lent, %.0f ms; VMMSHIM_ON_LIMIT=balloon): %s (%s)",
                 _vs_pool_device(pool), size, asked, asked == 1 ? "" : "s", (unsigned long long)got_all, ms, why,
                 _vs_cu_error_name(CUDA_ERROR_OUT_OF_MEMORY));
  return st;
}

vs_pool_status_t _vs_on_limit(vs_pool_t *pool, vs_pool_status_t st, size_t size, CUstream stream, vmmshim_api_t api,
                              CUdeviceptr *ptr, size_t *served, CUresult *err) {
  uint64_t mode = _vs_option(VS_OPT_ON_LIMIT);
  if (mode == VS_ON_LIMIT_WAIT && st == VS_POOL_LIMIT) return wait_for_room(pool, size, stream, api, ptr, served, err);
  if (mode == VS_ON_LIMIT_HOST) return serve_on_host(pool, st, size, stream, ptr, served);
  if (mode == VS_ON_LIMIT_BALLOON && st == VS_POOL_LIMIT) return borrow_room(pool, size, stream, api, ptr, served, err);
  return st;
}
