/* report.c: the memory report, written to the log.
 *
 * What the shim holds, per device and per heap: live blocks, mapped memory, idle memory and
 * why it was not given back, pending frees, VMMSHIM_LIMIT, what the driver reports free, and
 * the settings that may help. Written
 *   - when the shim answers out-of-memory (after its own recovery ladder failed), at warn
 *     level, once per burst: out-of-memory answers less than a second apart are one burst,
 *     and the next report counts those that were not reported;
 *   - on demand: vmmshim_dump() (public API), or the signal VMMSHIM_DUMP_SIGNAL (SIGUSR2 by
 *     default) for a program that cannot call it. The handler only writes a byte to a pipe
 *     (async-signal-safe); a thread of the shim, blocked on the pipe, writes the report, so
 *     no lock or driver call ever runs inside a signal handler. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/share.h"

static const char *const vs_api_names[VMMSHIM_API_COUNT] = {"cudaMalloc", "cudaMallocAsync", "cuMemAlloc",
                                                            "cuMemAllocAsync"};
static const char *const vs_heap_names[VS_NHEAPS] = {"small heap (< 1 MiB)", "large heap"};

#define VS_REPORT_DEVICES 64

/* A size for people, with the exact bytes: "1.50 GiB (1610612736 B)". */
static const char *human(char *buf, size_t n, size_t bytes, bool exact) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0) snprintf(buf, n, "%zu B", bytes);
  else if (exact) snprintf(buf, n, "%.2f %s (%zu B)", v, units[u], bytes);
  else snprintf(buf, n, "%.2f %s", v, units[u]);
  return buf;
}
#define H(b) human((char[48]){0}, 48, (b), false)
#define HX(b) human((char[64]){0}, 64, (b), true)

typedef struct vs_device_sum_s {
  int dev;
  CUcontext ctx; /* a context of the device, to ask the driver with */
  int pools;
  vs_pool_figures_t f; /* summed over the device's pools */
} vs_device_sum_t;

typedef struct vs_sums_s {
  vs_device_sum_t d[VS_REPORT_DEVICES];
  int n;
} vs_sums_t;

static void add_pool(vs_pool_t *pool, void *arg) {
  vs_sums_t *s = arg;
  int dev = _vs_pool_device(pool);
  int i = 0;
  while (i < s->n && s->d[i].dev != dev) i++;
  if (i == s->n) {
    if (s->n == VS_REPORT_DEVICES) return;
    memset(&s->d[i], 0, sizeof s->d[i]);
    s->d[i].dev = dev;
    s->d[i].ctx = _vs_pool_context(pool);
    s->n++;
  }
  vs_pool_figures_t f;
  _vs_pool_figures(pool, &f);
  _vs_pool_figures_add(&s->d[i].f, &f);
  s->d[i].pools++;
}

/* The driver's free and total memory of a device, asked in one of its contexts. */
static bool device_free(const vs_device_sum_t *d, size_t *free_b, size_t *total_b) {
  if (!_vs_cu.cuMemGetInfo) return false;
  CUcontext popped;
  _vs_guard++;
  bool ok = _vs_cu.cuCtxPushCurrent(d->ctx) == CUDA_SUCCESS;
  if (ok) {
    ok = _vs_cu.cuMemGetInfo(free_b, total_b) == CUDA_SUCCESS;
    _vs_cu.cuCtxPopCurrent(&popped);
  }
  _vs_guard--;
  return ok;
}

/* The report's lines for one device; `need` > 0 on the device that failed a request. */
static void report_device(const vs_device_sum_t *d, size_t need, bool after_ladder, vmmshim_stats_t *st) {
  const vs_pool_figures_t *f = &d->f;
  size_t mapped = vs_heaps_sum(f->mapped), live = vs_heaps_sum(f->live), idle = vs_heaps_sum(f->idle), pending = vs_heaps_sum(f->pending);
  size_t dfree = 0, dtotal = 0;
  bool have_free = device_free(d, &dfree, &dtotal);
  if (have_free) _vs_note("  device %d: the driver reports %s free of %s", d->dev, HX(dfree), HX(dtotal));
  _vs_note("  device %d: live %s in %zu blocks (%s requested); mapped %s in %zu handles, %d pool%s", d->dev, HX(live),
           f->live_blocks, H(f->requested), HX(mapped), f->handles, d->pools, d->pools == 1 ? "" : "s (arenas)");
  for (int h = 0; h < VS_NHEAPS; h++)
    if (f->mapped[h])
      _vs_note("  device %d:   %s: mapped %s, live %s, idle %s, pending %s", d->dev, vs_heap_names[h],
               HX(f->mapped[h]), HX(f->live[h]), HX(f->idle[h]), HX(f->pending[h]));
  size_t pinned = idle > f->idle_whole ? idle - f->idle_whole : 0;
  if (idle) {
    if (after_ladder)
      _vs_note("  device %d: idle %s not given back: it lies in handles that also hold live or pending blocks "
               "(a handle goes back to the device only when nothing in it lives)",
               d->dev, HX(idle));
    else
      _vs_note("  device %d: idle %s kept mapped for reuse: %s in whole idle handles (given back before a growth, on "
               "out-of-memory and by vmmshim_trim), %s in handles that also hold live or pending blocks",
               d->dev, HX(idle), H(f->idle_whole), H(pinned));
  }
  if (pending)
    _vs_note("  device %d: pending %s: freed, waiting for GPU work queued before the free (stream-ordered or "
             "deferred frees)",
             d->dev, HX(pending));
  if (!need) return;

  /* What may help, from what the figures say. */
  uint64_t limit = _vs_limit();
  size_t total_mapped = _vs_mapped_total();
  int said = 0;
  if (limit && total_mapped + need > limit) {
    _vs_note("  what may help: VMMSHIM_LIMIT=%llu caps what the process maps (%s mapped): raise it, or unset it",
             (unsigned long long)limit, H(total_mapped));
    said++;
  }
  vs_group_view_t v;
  if (_vs_group_over(d->dev, need) && _vs_group_view(d->dev, &v)) {
    if (v.shared)
      _vs_note("  what may help: the group's limit is reached: raise it (vmmshim ctl --group %s limit SIZE), let a member "
               "give memory back, queue behind the others (VMMSHIM_ON_LIMIT=wait) or run on host memory past it "
               "(VMMSHIM_ON_LIMIT=host)",
               v.name);
    else
      _vs_note("  what may help: VMMSHIM_LIMIT is reached on device %d: raise it, or VMMSHIM_ON_LIMIT=host to run on host "
               "memory past it",
               d->dev);
    said++;
  }
  if (pinned >= need || (mapped && pinned > mapped / 8)) {
    char now[48];
    _vs_note("  what may help: %s idle is pinned by live blocks in the same handles (fragmentation): a smaller "
             "VMMSHIM_GRANULARITY (now %s) shares smaller handles%s",
             H(pinned), human(now, sizeof now, (size_t)_vs_option(VS_OPT_GRANULARITY), false),
             d->pools > 1 ? "; VMMSHIM_ARENAS=1 keeps one pool per context instead of one per contending thread" : "");
    said++;
  }
  if (pending >= need) {
    _vs_note("  what may help: %s is waiting for earlier GPU work to complete: synchronise the stream before "
             "allocating again%s",
             H(pending), atomic_load(&_vs_captures_active) ? " (a stream capture is active: no synchronisation was made)" : "");
    said++;
  }
  if (have_free && dtotal && mapped + dfree + dtotal / 20 < dtotal && dfree < need) {
    _vs_note("  what may help: %s of the device's memory is held outside this process's pools (other processes on "
             "the GPU, or the %llu allocations the shim passed through); a process under the shim gives idle memory "
             "back at each free with VMMSHIM_RELEASE_THRESHOLD=0",
             H(dtotal - dfree - mapped), (unsigned long long)st->passthrough_allocs);
    said++;
  }
  if (!said)
    _vs_note("  what may help: the live blocks take %s of the device's %s: the program must hold less at once "
             "(free what it no longer uses, smaller batches)",
             H(live), have_free ? H(dtotal) : "memory");
}

/* The budget's lines: a group's segment, or this process's own per-device caps. */
static void report_budget(int dev) {
  vs_group_view_t v;
  if (!_vs_group_view(dev, &v)) return;
  char who[80];
  if (v.shared) snprintf(who, sizeof who, "VMMSHIM_LIMIT_GROUP=%s (%u member%s)", v.name, v.members, v.members == 1 ? "" : "s");
  else snprintf(who, sizeof who, "the budget of this process alone");
  if (v.limit_all)
    _vs_note("  %s: every device: %s mapped of the limit %s (this process %s)", who, HX(v.total_all), H(v.limit_all),
             H(v.mine_all));
  if (dev >= 0 && v.limit_dev)
    _vs_note("  %s: device %d: %s mapped of the limit %s (this process %s)", who, dev, HX(v.total_dev), H(v.limit_dev),
             H(v.mine_dev));
  if (!v.limit_all && !(dev >= 0 && v.limit_dev))
    _vs_note("  %s: no limit set: %s mapped by the group (this process %s)", who, HX(v.total_all), H(v.mine_all));
  if (v.host_all) _vs_note("  %s: %s served from host memory past the limit (this process %s)", who, H(v.host_all), H(v.mine_host));
  if (v.reclaimed) _vs_note("  %s: %s of members that died was returned", who, H(v.reclaimed));
}

static void report(const char *first_line, int failed_dev, size_t need, bool after_ladder, size_t scattered) {
  _vs_note("%s", first_line);
  static vs_sums_t sums; /* one report at a time (callers hold vs_report_lock) */
  memset(&sums, 0, sizeof sums);
  _vs_dir_visit_pools(add_pool, &sums);
  vmmshim_stats_t st;
  _vs_stats_get(&st);
  if (!sums.n) _vs_note("  no pool: the shim has served no allocation in this process");
  for (int i = 0; i < sums.n; i++)
    report_device(&sums.d[i], sums.d[i].dev == failed_dev ? need : 0, after_ladder, &st);
  uint64_t limit = _vs_limit();
  if (limit)
    _vs_note("  VMMSHIM_LIMIT=%llu: the process maps %s of it", (unsigned long long)limit, HX(_vs_mapped_total()));
  report_budget(failed_dev);
  if (need)
    _vs_note("  scattered: %s idle in the process's other pools (other arenas, tags, contexts) was given back before "
             "this answer%s",
             HX(scattered), scattered ? "; the request still did not fit" : "");
  _vs_note("  process: %llu allocations served, %llu failed, %llu passed to the driver; peak live %s, peak mapped %s",
           (unsigned long long)(st.allocs[0] + st.allocs[1] + st.allocs[2] + st.allocs[3]),
           (unsigned long long)st.alloc_failures, (unsigned long long)st.passthrough_allocs, H(st.peak_bytes_in_use),
           H(st.peak_bytes_mapped));
}

static vs_lock_t vs_report_lock = VS_LOCK_INITIALIZER(VS_RANK_REPORT, "report");

/* ------------------------------------------------------------------ out of memory */

#define VS_OOM_BURST_NS 1000000000ull /* answers closer than this are one burst */
static atomic_uint_least64_t vs_last_oom_ns;
static atomic_uint_least64_t vs_oom_unreported;

void _vs_report_oom(vmmshim_api_t api, size_t size, int dev, bool limit_reached, size_t scattered) {
  uint64_t now = _vs_now_ns();
  uint64_t last = atomic_exchange(&vs_last_oom_ns, now);
  if (last && now - last < VS_OOM_BURST_NS) {
    atomic_fetch_add(&vs_oom_unreported, 1);
    _vs_info("device %d: out of memory for %zu bytes%s", dev, size, limit_reached ? " (VMMSHIM_LIMIT reached)" : "");
    return;
  }
  if (_vs_log_level < VS_LOG_WARN) return;
  uint64_t more = atomic_exchange(&vs_oom_unreported, 0);
  char line[320], extra[96] = "";
  if (more) snprintf(extra, sizeof extra, " (%llu earlier out-of-memory answers were not reported)", (unsigned long long)more);
  snprintf(line, sizeof line,
           "warning: out of memory: %s of %s on device %d: CUDA_ERROR_OUT_OF_MEMORY%s, after waiting for pending "
           "frees and giving back idle handles%s; what the shim holds:",
           (unsigned)api < VMMSHIM_API_COUNT ? vs_api_names[api] : "allocation", HX(size), dev,
           limit_reached ? " (VMMSHIM_LIMIT reached)" : "", extra);
  _vs_lock_take(&vs_report_lock);
  report(line, dev, size, true, scattered);
  _vs_lock_release(&vs_report_lock);
}

/* ------------------------------------------------------------------ on demand */

int _vs_report_dump(void) {
  if (!_vs_active()) return -1;
  _vs_lock_take(&vs_report_lock);
  report("memory report (vmmshim_dump or VMMSHIM_DUMP_SIGNAL):", -1, 0, false, 0);
  _vs_lock_release(&vs_report_lock);
  return 0;
}

/* The dump signal's thread (init.c) writes the report through this. Registered by a
 * constructor that only stores a pointer: nothing runs in a process that never sends it. */
static void dump_on_signal(void) { _vs_report_dump(); }

__attribute__((constructor)) static void register_dump_handler(void) { _vs_set_dump_handler(dump_on_signal); }
