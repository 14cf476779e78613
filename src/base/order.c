/* order.c: whether every piece of GPU work of the process has gone to one stream.
 *
 * In deferred mode a block freed with cudaFree is reused only after a context synchronisation
 * (reclaim.c): work queued before the free may still touch it. While all of the program's
 * launches, copies and memsets have gone to one stream S, that wait buys nothing: whatever the
 * block's next owner does with it goes to S too, behind the work queued before the free, as
 * with a free on S (cudaFreeAsync). So the block is reused at once (alloc.c reads _vs_order_view
 * and tells the pool the free is ordered).
 *
 * The submission hooks (hook_drv.c) name each stream they are given. The first fixes S. The
 * first submission to another stream, a capture, an IPC export, S destroyed, or a submission
 * path the shim cannot see ends it: an event is recorded on S, and until it has passed every
 * submission to another stream first waits for it on the GPU (cuStreamWaitEvent; the host
 * never waits, so work on S that waits for the host cannot deadlock), and uses that cannot
 * wait on a stream (an export, a capture, a path the shim cannot see) wait on the host. From
 * then on deferred frees wait for a synchronisation again. Work on S that waits for later work
 * of another stream (cuStreamWaitValue) ends it before it is queued, the event recorded and
 * waited for on the host first: nothing elsewhere may wait for the wait itself, which could be
 * for that very submission. */
#include <pthread.h>
#include <stdio.h>

#include "vmmshim/base.h"

/* Read by other files only through _vs_order_view. */
static atomic_int vs_order_state; /* vs_order_state_t; VS_ORDER_UNSEEN until the first submission */
static CUstream vs_order_stream;  /* S as the program names it by handle (else VS_NO_STREAM): written
                                     once, before the state is ONE */

static CUcontext vs_one_ctx;   /* S's context */
static CUstream vs_one_key;    /* S's key (_vs_stream_key): its handle, NULL (legacy), or a thread's number */
static bool vs_one_implicit;   /* S is a context's legacy stream or a thread's per-thread stream */
static CUevent vs_leave_event; /* recorded on S as the stream order ended; kept for the process's life */
static const char *vs_leave_why;
static vs_lock_t vs_order_lock = VS_LOCK_INITIALIZER(VS_RANK_ORDER, "one-stream order");

/* S's context made current for a driver call on S (its legacy stream is the current
 * context's). Returns whether one was pushed. */
static bool push_one_ctx(void) { return _vs_cu.cuCtxPushCurrent(vs_one_ctx) == CUDA_SUCCESS; }
static void pop_ctx(bool pushed) {
  CUcontext popped;
  if (pushed) _vs_cu.cuCtxPopCurrent(&popped);
}

/* Waits on the host for the work S had when the order ended. Lock held. */
static void wait_on_host_locked(void) {
  CUresult r = CUDA_SUCCESS;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  _vs_cu.cuThreadExchangeStreamCaptureMode(&mode); /* never counted against another thread's capture */
  if (vs_leave_event && _vs_cu.cuEventSynchronize) {
    r = _vs_cu.cuEventSynchronize(vs_leave_event);
  } else {
    bool pushed = push_one_ctx(); /* no event (S per-thread, or recording failed): the whole context */
    r = _vs_cu.cuCtxSynchronize();
    pop_ctx(pushed);
  }
  _vs_cu.cuThreadExchangeStreamCaptureMode(&mode);
  if (r != CUDA_SUCCESS)
    _vs_warn("deferred frees: waiting for the work of the one stream: %s", _vs_cu_error_name(r));
  atomic_store(&vs_order_state, VS_ORDER_OFF);
}

void _vs_order_leave(const char *why, bool host) {
  if (atomic_load(&vs_order_state) == VS_ORDER_OFF) return;
  _vs_lock_take(&vs_order_lock);
  int st = atomic_load(&vs_order_state);
  if (st == VS_ORDER_UNSEEN) { /* nothing was reused early: nothing to wait for */
    vs_leave_why = why;
    _vs_info("deferred frees: %s before any GPU work: freed blocks wait for a synchronisation", why);
    atomic_store(&vs_order_state, VS_ORDER_OFF);
  } else if (st == VS_ORDER_ONE) {
    vs_leave_why = why;
    if (!vs_one_implicit || !vs_one_key) { /* another thread's per-thread stream cannot be named */
      bool pushed = vs_one_implicit && push_one_ctx();
      CUresult r = _vs_cu.cuEventCreate(&vs_leave_event, CU_EVENT_DISABLE_TIMING);
      if (r == CUDA_SUCCESS &&
          (r = _vs_cu.cuEventRecord(vs_leave_event, vs_one_implicit ? CU_STREAM_LEGACY : vs_one_key)) != CUDA_SUCCESS) {
        _vs_cu.cuEventDestroy(vs_leave_event);
        vs_leave_event = NULL;
      }
      pop_ctx(pushed);
    }
    atomic_store(&vs_order_state, VS_ORDER_LEAVING);
    _vs_info("deferred frees: the program's work no longer goes to one stream (%s): freed blocks wait for a "
             "synchronisation from now on",
             why);
    if (host || !vs_leave_event) wait_on_host_locked();
  } else if (st == VS_ORDER_LEAVING && host) {
    wait_on_host_locked();
  }
  _vs_lock_release(&vs_order_lock);
}

/* A submission to stream `named` (not S) while the order ends: it waits for S's earlier work on
 * the GPU, until that work is seen done. In a capture a wait would join the captured graph, and
 * a stream may refuse it: either waits on the host instead. Lock held. */
static void wait_for_one_locked(CUstream named) {
  if (!vs_leave_event) return; /* (a leave without an event waits on the host before it unlocks) */
  if (_vs_cu.cuEventQuery(vs_leave_event) == CUDA_SUCCESS) {
    atomic_store(&vs_order_state, VS_ORDER_OFF);
    return;
  }
  if (atomic_load(&_vs_captures_active) || !_vs_cu.cuStreamWaitEvent ||
      _vs_cu.cuStreamWaitEvent(named, vs_leave_event, 0) != CUDA_SUCCESS)
    wait_on_host_locked();
}

/* The first submission of the process names S. */
static void fix_one(CUstream named, CUstream key, bool implicit, CUcontext ctx) {
  _vs_lock_take(&vs_order_lock);
  if (atomic_load(&vs_order_state) == VS_ORDER_UNSEEN &&
      (implicit || _vs_cu.cuStreamGetCtx(named, &ctx) == CUDA_SUCCESS) && ctx) {
    vs_one_ctx = ctx;
    vs_one_key = key;
    vs_one_implicit = implicit;
    vs_order_stream = implicit ? VS_NO_STREAM : named; /* the quick check takes handles only */
    atomic_store(&vs_order_state, VS_ORDER_ONE);
    _vs_info("deferred frees: the program's work goes to one stream (%s %p) so far: freed blocks are reused "
             "at once, in that stream's order",
             implicit ? (key ? "a per-thread stream of context" : "the legacy stream of context") : "stream",
             implicit ? (void *)ctx : (void *)named);
  }
  _vs_lock_release(&vs_order_lock);
}

static void see_slow(CUstream s, int ptsz) {
  if (_vs_guard) return; /* the shim's own calls */
  if (atomic_load(&vs_order_state) == VS_ORDER_UNSEEN && atomic_load(&_vs_state) != 1) return; /* no pool yet */
  if (atomic_load(&vs_order_state) == VS_ORDER_OFF) return;
  if (s == VS_ORDER_ELSEWHERE) {
    _vs_order_leave("work that spans contexts, or waits on another stream's", true);
    return;
  }
  CUstream named = _vs_stream_named(s, ptsz);
  bool implicit = named == CU_STREAM_LEGACY || named == CU_STREAM_PER_THREAD;
  const void *owner;
  CUstream key = _vs_stream_key(named, &owner);
  CUcontext ctx = NULL;
  if (implicit && (_vs_cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) return; /* the driver refuses it */
  if (atomic_load(&vs_order_state) == VS_ORDER_UNSEEN) fix_one(named, key, implicit, ctx);
  int st = atomic_load(&vs_order_state);
  if (st == VS_ORDER_UNSEEN || st == VS_ORDER_OFF) return; /* (UNSEEN: a handle the driver does not know) */
  if (key == vs_one_key && (!implicit || ctx == vs_one_ctx)) return; /* S itself */
  if (st == VS_ORDER_ONE) _vs_order_leave("a second stream", false);
  _vs_lock_take(&vs_order_lock); /* a leave in progress is made before this submission */
  if (atomic_load(&vs_order_state) == VS_ORDER_LEAVING) wait_for_one_locked(named);
  _vs_lock_release(&vs_order_lock);
}

void _vs_order_see(CUstream s, int ptsz) {
  int st = atomic_load_explicit(&vs_order_state, memory_order_acquire);
  if (vs_likely(st == VS_ORDER_OFF)) return;
  if (st == VS_ORDER_ONE && s == vs_order_stream) return;
  see_slow(s, ptsz);
}

/* S's context is written before the state first leaves UNSEEN and never after, so the state
 * read first (acquire) vouches for it. */
vs_order_view_t _vs_order_view(void) {
  vs_order_view_t v = {(vs_order_state_t)atomic_load_explicit(&vs_order_state, memory_order_acquire), NULL};
  if (v.state != VS_ORDER_UNSEEN) v.ctx = vs_one_ctx;
  return v;
}

void _vs_order_stream_destroyed(CUstream s) {
  if (atomic_load(&vs_order_state) == VS_ORDER_ONE && s && s == vs_one_key) _vs_order_leave("its stream destroyed", false);
}

void _vs_order_context_gone(CUcontext ctx) {
  if (atomic_load(&vs_order_state) != VS_ORDER_OFF && ctx == vs_one_ctx) _vs_order_leave("its context destroyed", true);
}

/* At start (init.c): off unless deferred mode and VMMSHIM_ONE_STREAM; on, it waits for the
 * first submission (or stays off when a lookup before the start already ended it). */
void _vs_order_configure(bool on) {
  if (!on) atomic_store(&vs_order_state, VS_ORDER_OFF);
}

const char *_vs_order_describe(void) {
  static char line[160]; /* the stats at exit: one caller */
  switch (atomic_load(&vs_order_state)) {
  case VS_ORDER_ONE: return "yes, all work so far on one stream";
  case VS_ORDER_UNSEEN: return "no GPU work seen";
  default:
    if (!vs_leave_why) return "no (VMMSHIM_ONE_STREAM=0)";
    snprintf(line, sizeof line, "no longer, since %s", vs_leave_why);
    return line;
  }
}
