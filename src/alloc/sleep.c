/* sleep.c: tags leave the device and come back, for the whole process.
 *
 * A sleep of tag T, in order:
 *   1. waits until no stream capture is in progress (a context synchronisation would
 *      invalidate it), up to VMMSHIM_SLEEP_WAIT ms, then refuses with -EBUSY;
 *   2. closes the gate (gate.c): new launches, copies, memsets and captures of the program wait
 *      at their driver entry until the move is done; those already submitted finish;
 *   3. takes T's pools off allocation (alloc.c parks them: allocations of T made meanwhile get
 *      new pools, which stay awake);
 *   4. synchronises every context the shim serves (work on a peer device may read T's memory),
 *      so no kernel touches what is about to be unmapped;
 *   5. moves each parked pool's memory by mode (asleep.c), leaving on the device the blocks that
 *      importers of other processes hold (they map the same handles);
 *   6. opens the gate.
 * A wake closes the gate, maps device memory at the same addresses with the access the owner and
 * every peer have now, restores the bytes, opens the gate, and puts the pools back on allocation.
 * One sleep or wake at a time (a mutex); allocations and frees of other tags go on meanwhile. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vmmshim/alloc.h"

#define VS_MAX_PARKED_ALL 512 /* parked pools of one tag, all contexts */
#define VS_MAX_HELD 64        /* ranges importers hold, per pool */

static vs_lock_t vs_sleep_lock = VS_LOCK_INITIALIZER(VS_RANK_SLEEP, "sleep");

static void result_reason(vmmshim_sleep_result_t *res, const char *fmt, const char *what) {
  if (!res->reason[0] && fmt) snprintf(res->reason, sizeof res->reason, fmt, what ? what : "");
}

static void add_move(vmmshim_sleep_result_t *res, const vs_move_t *mv) {
  res->released += mv->released;
  res->restored += mv->restored;
  res->to_host += mv->to_host;
  res->host_mapped += mv->host_mapped;
  res->discarded += mv->discarded;
  res->skipped += mv->skipped;
  if (mv->err != CUDA_SUCCESS) {
    char why[160];
    snprintf(why, sizeof why, "%s (%s)", mv->why ? mv->why : "failed",
             mv->errnum ? _vs_errno_name(mv->errnum) : _vs_cu_error_name(mv->err));
    result_reason(res, "%s", why);
  } else if (mv->skipped && mv->why_skipped) {
    result_reason(res, "%s", mv->why_skipped);
  }
}

/* Step 1: no capture in progress, or -EBUSY after VMMSHIM_SLEEP_WAIT ms. Then the gate closes;
 * a capture that began in between is waited for again (with the gate open: it may need to
 * launch to finish). */
static int quiet_and_close(vmmshim_sleep_result_t *res) {
  uint64_t deadline = _vs_now_ns() + _vs_option(VS_OPT_SLEEP_WAIT) * 1000000ull;
  for (;;) {
    while (atomic_load(&_vs_captures_active) > 0) {
      if (_vs_now_ns() >= deadline) {
        result_reason(res, "%sa stream capture is in progress (waited VMMSHIM_SLEEP_WAIT ms); nothing moved", "");
        return -EBUSY;
      }
      _vs_sleep_us(1000);
    }
    _vs_gate_close();
    if (atomic_load(&_vs_captures_active) == 0) return 0;
    _vs_gate_open();
  }
}

typedef struct vs_sleep_job_s {
  int mode;
  const char *tag; /* its name (disk mode names its files after it) */
  vmmshim_sleep_result_t *res;
  int pools, moved;
  int errnum; /* disk mode: the first file error */
} vs_sleep_job_t;

static void sleep_parked(const vs_parked_t *pk, vs_sleep_job_t *job) {
  CUcontext popped;
  if (_vs_cu.cuCtxPushCurrent(pk->ctx) != CUDA_SUCCESS) return;
  /* Frees still waiting for the GPU become free (the context was synchronised already). */
  _vs_pool_reclaim(pk->pool);
  CUdeviceptr va[VS_MAX_HELD];
  size_t len[VS_MAX_HELD];
  int nheld = _vs_ipc_held_ranges(pk->pool, va, len, VS_MAX_HELD);
  vs_move_t mv;
  _vs_pool_sleep(pk->pool, job->mode, job->tag, va, len, nheld, &mv);
  /* Disk mode is all or nothing per pool: any failure is the sleep's error (EIO for a CUDA one). */
  if (job->mode == VMMSHIM_SLEEP_DISK && mv.err != CUDA_SUCCESS && !job->errnum) job->errnum = mv.errnum ? mv.errnum : EIO;
  _vs_cu.cuCtxPopCurrent(&popped);
  if (mv.released || mv.to_host || mv.discarded) job->moved++;
  job->pools++;
  add_move(job->res, &mv);
  atomic_fetch_add(&_vs_host_mapped_bytes, mv.host_mapped);
}

static int sleep_tags(int tag, int mode, bool by_keep, vmmshim_sleep_result_t *res) {
  int rc = quiet_and_close(res);
  if (rc) return rc;
  _vs_sync_contexts();
  vs_sleep_job_t job = {mode, NULL, res, 0, 0, 0};
  static vs_parked_t parked[VS_MAX_PARKED_ALL]; /* under vs_sleep_lock */
  int n_tags = _vs_tag_count();
  for (int t = tag < 0 ? 0 : tag; t < (tag < 0 ? n_tags : tag + 1); t++) {
    if (by_keep) job.mode = _vs_tag_keep(t) ? VMMSHIM_SLEEP_HOST : VMMSHIM_SLEEP_DISCARD;
    job.tag = _vs_tag_name(t);
    int n = _vs_park_tag(t, parked, VS_MAX_PARKED_ALL);
    for (int i = 0; i < n; i++) sleep_parked(&parked[i], &job);
  }
  if (tag < 0) job.moved += _vs_foreign_sleep(by_keep ? VMMSHIM_SLEEP_HOST : job.mode, res); /* foreign.c */
  if (job.moved) _vs_residue_after_sleep(); /* what stays on the device (residue.c), before work goes on */
  _vs_gate_open();
  if (job.errnum) return -job.errnum; /* a disk write failed: what it was for stays awake, intact */
  if (!job.moved && !res->reason[0]) {
    result_reason(res, "%snothing to move: asleep already, or no memory", "");
    return res->skipped ? 0 : -EALREADY;
  }
  return 0;
}

static int wake_tags(int tag, bool zero, vmmshim_sleep_result_t *res) {
  static vs_parked_t parked[VS_MAX_PARKED_ALL]; /* under vs_sleep_lock */
  int rc = 0, woken = 0, asleep = 0;
  int n_tags = _vs_tag_count();
  _vs_gate_close(); /* nothing the program submits meets half-mapped memory */
  /* Nor does work already submitted: a kernel still running on memory asleep in mapped mode would
   * write into host buffers whose bytes were copied already, or meet an address unmapped under it
   * (pool/wake.c expects the wait done). Not while a stream capture is in progress (the gate holds
   * new ones): a synchronisation would invalidate it, and a wake has never waited for captures. */
  if (atomic_load(&_vs_captures_active) == 0) _vs_sync_contexts();
  for (int t = tag < 0 ? 0 : tag; t < (tag < 0 ? n_tags : tag + 1); t++) {
    int n = _vs_parked_of(t, parked, VS_MAX_PARKED_ALL);
    for (int i = 0; i < n; i++) {
      size_t host_mapped = 0;
      if (!_vs_pool_asleep(parked[i].pool, NULL, &host_mapped)) {
        _vs_unpark(parked[i].pool); /* awake already (parked with no arena free): try again */
        continue;
      }
      asleep++;
      CUcontext popped;
      if (_vs_cu.cuCtxPushCurrent(parked[i].ctx) != CUDA_SUCCESS) continue;
      vs_move_t mv;
      CUresult r = _vs_pool_wake(parked[i].pool, zero, &mv);
      size_t left = 0, still_mapped = 0;
      _vs_pool_asleep(parked[i].pool, &left, &still_mapped);
      atomic_fetch_sub(&_vs_host_mapped_bytes, host_mapped - still_mapped);
      if (r == CUDA_SUCCESS && !left && !_vs_unpark(parked[i].pool))
        _vs_pool_trim(parked[i].pool, 0); /* parked for good: its idle memory serves nothing */
      _vs_cu.cuCtxPopCurrent(&popped);
      mv.skipped = left;
      add_move(res, &mv);
      if (r == CUDA_SUCCESS && !left) woken++;
      else if (!rc) rc = mv.errnum ? -mv.errnum : r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
    }
  }
  if (tag < 0) asleep += _vs_foreign_wake(res); /* foreign.c */
  _vs_gate_open();
  if (!asleep) {
    result_reason(res, "%snothing asleep", "");
    return -EALREADY;
  }
  (void)woken;
  return rc;
}

/* A tag argument: NULL for every tag, else its index (-ENOENT for an unknown name). */
static int tag_arg(const char *tag) {
  if (!tag) return -1;
  int id = _vs_tag_find(tag, false);
  return id;
}

/* A call of the public API done (api.c checked out's size): its time, log line and trace record, and
 * its result copied to out (may be NULL). */
static int finish(int rc, uint64_t t0, vmmshim_sleep_result_t *res, vmmshim_sleep_result_t *out, const char *what,
                  const char *tag, int wake, int mode) {
  res->ns = _vs_now_ns() - t0;
  res->error = rc;
  if (rc && !res->reason[0]) result_reason(res, "%s", strerror(-rc));
  if (out) *out = *res;
  _vs_info("%s %s: %d (%s); released %llu, restored %llu, host %llu, discarded %llu, skipped %llu bytes, %.3f ms%s%s",
           what, tag ? tag : "(every tag)", rc, rc ? strerror(-rc) : "ok", (unsigned long long)res->released,
           (unsigned long long)res->restored, (unsigned long long)res->to_host, (unsigned long long)res->discarded,
           (unsigned long long)res->skipped, (double)res->ns / 1e6, res->reason[0] ? ": " : "", res->reason);
  int id = tag ? _vs_tag_find(tag, false) : -1;
  if (vs_unlikely(_vs_trace_on) && (!tag || id >= 0)) { /* an unknown tag: nothing happened */
    _vs_trace_sleep(wake, id, id >= 0 ? tag : NULL, mode, wake ? res->restored : res->released, res->to_host, rc,
                    res->ns);
  }
  return rc;
}

static int sleep_now(const char *tag, int mode, vmmshim_sleep_result_t *res) {
  memset(res, 0, sizeof *res);
  if (mode < VMMSHIM_SLEEP_DISCARD || mode > VMMSHIM_SLEEP_DISK) return -EINVAL;
  if (!_vs_active()) return -ENODEV;
  _vs_tags_init();
  int id = tag_arg(tag);
  if (tag && id < 0) return id;
  _vs_lock_take(&vs_sleep_lock);
  int rc = sleep_tags(id, mode, false, res);
  _vs_lock_release(&vs_sleep_lock);
  return rc;
}

static int wake_now(const char *tag, unsigned flags, vmmshim_sleep_result_t *res) {
  memset(res, 0, sizeof *res);
  if (flags & ~VMMSHIM_WAKE_ZERO) return -EINVAL;
  if (!_vs_active()) return -ENODEV;
  _vs_tags_init();
  int id = tag_arg(tag);
  if (tag && id < 0) return id;
  _vs_lock_take(&vs_sleep_lock);
  int rc = wake_tags(id, flags & VMMSHIM_WAKE_ZERO, res);
  _vs_lock_release(&vs_sleep_lock);
  return rc;
}

static int sleep_level_now(int level, int mapped, vmmshim_sleep_result_t *res) {
  memset(res, 0, sizeof *res);
  if (level < 0 || level > 2) return -EINVAL;
  if (!_vs_active()) return -ENODEV;
  if (level == 0) {
    res->released = _vs_trim_all();
    return 0;
  }
  _vs_tags_init();
  _vs_lock_take(&vs_sleep_lock);
  int rc = level == 1 ? sleep_tags(-1, mapped ? VMMSHIM_SLEEP_MAPPED : VMMSHIM_SLEEP_HOST, false, res)
                      : sleep_tags(-1, VMMSHIM_SLEEP_DISCARD, true, res);
  _vs_lock_release(&vs_sleep_lock);
  return rc;
}

int _vs_sleep(const char *tag, int mode, vmmshim_sleep_result_t *out) {
  vmmshim_sleep_result_t res;
  uint64_t t0 = _vs_now_ns();
  return finish(sleep_now(tag, mode, &res), t0, &res, out, "sleep", tag, 0, mode);
}

int _vs_wake(const char *tag, unsigned flags, vmmshim_sleep_result_t *out) {
  vmmshim_sleep_result_t res;
  uint64_t t0 = _vs_now_ns();
  return finish(wake_now(tag, flags, &res), t0, &res, out, "wake", tag, 1, 0);
}

int _vs_sleep_level(int level, int mapped, vmmshim_sleep_result_t *out) {
  vmmshim_sleep_result_t res;
  uint64_t t0 = _vs_now_ns();
  char what[24];
  snprintf(what, sizeof what, "sleep level %d", level);
  return finish(sleep_level_now(level, mapped, &res), t0, &res, out, what, NULL, 0,
                level == 1 ? (mapped ? VMMSHIM_SLEEP_MAPPED : VMMSHIM_SLEEP_HOST) : VMMSHIM_SLEEP_DISCARD);
}

/* ------------------------------------------------------------------ quiesce */

/* A group's phase 1 (control_group.c): no stream capture in progress, the gate closed, every
 * context synchronised; the gate stays closed until _vs_unquiesce, across the sleeps or wakes of
 * phase 2, which close and open it inside this hold. */
int _vs_quiesce(char *why, size_t n) {
  vmmshim_sleep_result_t res;
  memset(&res, 0, sizeof res);
  if (!_vs_active()) {
    snprintf(why, n, "the shim is not active in this process");
    return -ENODEV;
  }
  int rc = quiet_and_close(&res);
  if (rc) {
    snprintf(why, n, "%s", res.reason);
    return rc;
  }
  _vs_sync_contexts();
  return 0;
}

void _vs_unquiesce(void) { _vs_gate_open(); }

/* ------------------------------------------------------------------ promote */

typedef struct vs_promote_job_s {
  vmmshim_sleep_result_t *res;
  int pools, moved;
  CUresult err;
} vs_promote_job_t;

static void promote_pool(vs_pool_t *pool, void *arg) {
  vs_promote_job_t *job = arg;
  vs_sleep_figures_t f;
  _vs_pool_sleep_figures(pool, &f);
  if (!f.spilled) return;
  CUcontext popped;
  if (_vs_cu.cuCtxPushCurrent(_vs_pool_context(pool)) != CUDA_SUCCESS) return;
  vs_move_t mv;
  CUresult r = _vs_pool_promote(pool, &mv);
  _vs_cu.cuCtxPopCurrent(&popped);
  job->pools++;
  if (mv.restored || mv.dropped) job->moved++;
  if (r != CUDA_SUCCESS && job->err == CUDA_SUCCESS) job->err = r;
  atomic_fetch_sub(&_vs_host_mapped_bytes, mv.restored + mv.dropped);
  job->res->released += mv.dropped;
  mv.dropped = 0;
  add_move(job->res, &mv);
}

static int promote_now(vmmshim_sleep_result_t *res) {
  memset(res, 0, sizeof *res);
  if (!_vs_active()) return -ENODEV;
  _vs_lock_take(&vs_sleep_lock);
  /* As a wake of memory in mapped mode: no GPU work may touch the host memory while its bytes
   * are copied and the device memory takes its place. */
  int rc = quiet_and_close(res);
  if (!rc) {
    _vs_sync_contexts();
    vs_promote_job_t job = {res, 0, 0, CUDA_SUCCESS};
    _vs_visit_tag(-1, promote_pool, &job);
    _vs_gate_open();
    if (!job.pools) {
      result_reason(res, "%snothing is served from host memory past the limit", "");
      rc = -EALREADY;
    } else if (!job.moved) {
      rc = job.err == CUDA_ERROR_OUT_OF_MEMORY || job.err == CUDA_SUCCESS ? -ENOMEM : -EIO;
    }
  }
  _vs_lock_release(&vs_sleep_lock);
  return rc;
}

int _vs_promote(vmmshim_sleep_result_t *out) {
  vmmshim_sleep_result_t res;
  uint64_t t0 = _vs_now_ns();
  return finish(promote_now(&res), t0, &res, out, "promote", NULL, 1, 0);
}

/* ------------------------------------------------------------------ figures */

typedef struct vs_tag_sum_s {
  vmmshim_tag_stats_t *st;
  size_t spilled; /* of host_mapped: growths past the limit, awake */
} vs_tag_sum_t;

static void add_figures(vs_pool_t *pool, void *arg) {
  vs_tag_sum_t *sum = arg;
  vmmshim_tag_stats_t *st = sum->st;
  vs_sleep_figures_t f;
  _vs_pool_sleep_figures(pool, &f);
  st->live += f.live;
  st->device += f.device;
  st->host_copied += f.host_copied;
  st->host_mapped += f.host_mapped;
  st->discarded += f.discarded;
  st->disk += f.disk;
  sum->spilled += f.spilled;
}

int _vs_tag_stats(vmmshim_tag_stats_t *out, int max) {
  _vs_tags_init();
  int n = _vs_tag_count();
  for (int t = 0; t < n && t < max; t++) {
    vmmshim_tag_stats_t *st = &out[t];
    memset(st, 0, sizeof *st);
    snprintf(st->name, sizeof st->name, "%s", _vs_tag_name(t));
    vs_tag_sum_t sum = {st, 0};
    if (atomic_load(&_vs_state) == 1) _vs_visit_tag(t, add_figures, &sum);
    st->asleep = st->host_copied || st->host_mapped > sum.spilled || st->discarded || st->disk;
    st->keep = _vs_tag_keep(t);
  }
  return n;
}

/* ------------------------------------------------------------------ pointer queries */

/* Under the sleep lock: a wake (which gives the host buffers back) cannot run meanwhile; what
 * the caller then copies from the buffer is its own business, as with any address it holds. */
int _vs_host_copy_at(CUdeviceptr addr, CUdeviceptr *home, size_t *len) {
  if (!_vs_active()) return -ENODEV;
  vs_pool_t *pool = _vs_dir_lookup(addr);
  if (!pool) return -ENOENT;
  _vs_lock_take(&vs_sleep_lock);
  bool hit = _vs_pool_host_copy_at(pool, addr, home, len);
  _vs_lock_release(&vs_sleep_lock);
  return hit ? 0 : -ENOENT;
}

/* As _vs_host_copy_at: under the sleep lock, so no wake gives the buffer back during the look-up. */
int _vs_host_view_at(CUdeviceptr addr, size_t size, CUdeviceptr *home) {
  if (!_vs_active()) return -ENODEV;
  vs_pool_t *pool = _vs_dir_lookup(addr);
  if (!pool) return -ENOENT;
  _vs_lock_take(&vs_sleep_lock);
  int rc = _vs_pool_host_view(pool, addr, size, home);
  _vs_lock_release(&vs_sleep_lock);
  return rc;
}

bool _vs_host_mapped(CUdeviceptr addr, int *dev) {
  if (vs_likely(atomic_load_explicit(&_vs_host_mapped_bytes, memory_order_relaxed) == 0)) return false;
  vs_pool_t *pool = _vs_dir_lookup(addr);
  if (!pool || !_vs_pool_host_mapped_at(pool, addr)) return false;
  if (dev) *dev = _vs_pool_device(pool);
  return true;
}
