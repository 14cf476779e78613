/* reclaim.c: when pending blocks become free.
 *
 * A freed block may still be touched by GPU work submitted before the free. It stays PENDING
 * until that work is known to be done:
 *   - a context synchronisation that started after the free completed (every pending block
 *     freed before it: the sync-mode free does one, the deferred mode's reclaimer thread
 *     does them in the background, the out-of-memory path does one);
 *   - an event recorded on the block's stream after the free completed: a stream's pending
 *     blocks are sealed into a batch with one event, queried later, never waited for;
 *   - a synchronisation of the block's stream that started after the free completed (made
 *     by a request on that stream that would otherwise grow the pool past its bound: pool.c).
 * Lock never held across a driver call: batches and events are prepared under the lock and
 * recorded or queried after it is dropped. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "vmmshim/pool_internal.h"

#ifndef VS_RECLAIM_GATHER_US
#define VS_RECLAIM_GATHER_US 100 /* the reclaimer's pause between synchronisations */
#endif

/* Moves blocks of a FIFO whose free came before sync number `done` into the bins. */
static void release_before(vs_pool_t *p, vs_list_t *l, uint64_t done) {
  while (l->head && l->head->freed_seq < done) {
    vs_block_t *b = l->head;
    list_remove(l, b);
    p->pending_bytes -= b->size;
    b->stream = NULL;
    _vs_block_make_free(p, b);
  }
}

static void release_batch(vs_pool_t *p, vs_batch_t *bt) {
  while (bt->blocks.head) {
    vs_block_t *b = bt->blocks.head;
    list_remove(&bt->blocks, b);
    p->pending_bytes -= b->size;
    b->stream = NULL;
    b->batch = NULL;
    _vs_block_make_free(p, b);
  }
}

/* After a synchronisation numbered `done` completed: everything freed before it is free, or,
 * when it synchronised one stream (key not NULL), everything freed on that stream before it:
 * its pending list and the batches sealed on it. Batches emptied that way are moved to
 * *done_batches (their events are recycled after the unlock). Lock held. */
static void after_sync_locked(vs_pool_t *p, uint64_t done, const CUstream *key, vs_batch_t **done_batches) {
  if (key) {
    vs_stream_t *s;
    HASH_FIND(hh, p->streams, key, sizeof *key, s);
    if (s) release_before(p, &s->pending, done);
  } else {
    release_before(p, &p->deferred, done);
    for (vs_stream_t *s = p->streams; s; s = s->hh.next) release_before(p, &s->pending, done);
  }
  vs_batch_t **pp = &p->batches;
  while (*pp) {
    vs_batch_t *bt = *pp;
    if (bt->max_seq < done && (!key || (bt->key == *key && bt->epoch == p->stream_epoch))) {
      release_batch(p, bt);
      *pp = bt->next;
      bt->next = *done_batches;
      *done_batches = bt;
    } else {
      pp = &bt->next;
    }
  }
}

/* Keeps up to VS_SPARE_EVENTS events of finished batches for reuse; destroys the rest.
 * Lock not held. */
static void recycle_batches(vs_pool_t *p, vs_batch_t *list) {
  while (list) {
    vs_batch_t *n = list->next;
    if (list->event) {
      pool_lock(p);
      bool kept = p->n_spare_events < VS_SPARE_EVENTS;
      if (kept) p->spare_events[p->n_spare_events++] = list->event;
      pool_unlock(p);
      if (!kept) _vs_cu.cuEventDestroy(list->event);
    }
    free(list);
    list = n;
  }
}

/* Synchronises the context (key NULL) or one stream, then frees what was freed before the
 * synchronisation started (after_sync_locked). A context sync is timed: how long the GPU lags
 * (pool.c's slow path asks). Blocks freed while it runs carry its number or a later one, and
 * stay pending. */
static CUresult sync_then_release(vs_pool_t *p, const CUstream *key, CUstream handle) {
  uint64_t t0 = key ? 0 : _vs_now_ns();
  pool_lock(p);
  uint64_t seq = ++p->sync_seq;
  if (!key && !p->syncs_running++) p->sync_since_ns = t0;
  pool_unlock(p);
  CUresult r = key ? _vs_cu.cuStreamSynchronize(handle) : _vs_cu.cuCtxSynchronize();
  VS_STAT_ADD(syncs, 1);
  uint64_t took = key ? 0 : _vs_now_ns() - t0;
  vs_batch_t *done = NULL;
  pool_lock(p);
  if (!key) {
    if (!--p->syncs_running) p->sync_since_ns = 0;
    p->last_sync_ns = took;
  }
  if (r == CUDA_SUCCESS) {
    if (!key && seq > p->sync_done) p->sync_done = seq;
    after_sync_locked(p, seq, key, &done);
    VS_POOL_CHECK(p);
  }
  pool_unlock(p);
  recycle_batches(p, done);
  return r;
}

CUresult _vs_pool_sync_and_reclaim(vs_pool_t *p) { return sync_then_release(p, NULL, NULL); }

CUresult _vs_pool_sync_stream_and_reclaim(vs_pool_t *p, CUstream key, CUstream handle) {
  return sync_then_release(p, &key, handle);
}

/* Seals the pending blocks of the streams the caller may record on into new batches, at most
 * max: all but the `keep` newest of each stream, which its next requests look at. sealed[i] is
 * to be recorded on stream on[i]. Returns their count. Lock held. */
static int seal_streams(vs_pool_t *p, const void *self, unsigned keep, vs_batch_t **sealed, CUstream *on, int max) {
  int n = 0;
  for (vs_stream_t *s = p->streams; s && n < max; s = s->hh.next) {
    if (s->pending.count <= keep || (s->owner && s->owner != self)) continue;
    vs_batch_t *bt = calloc(1, sizeof *bt);
    if (!bt) break;
    for (unsigned take = s->pending.count - keep; take; take--) {
      vs_block_t *b = s->pending.head;
      list_remove(&s->pending, b);
      list_push(&bt->blocks, b);
      b->stream = NULL;
      b->batch = bt;
      /* Not necessarily the last one's: pieces carved off a reused block go back at the end. */
      if (b->freed_seq > bt->max_seq) bt->max_seq = b->freed_seq;
    }
    if (p->n_spare_events) bt->event = p->spare_events[--p->n_spare_events];
    bt->key = s->key;
    bt->epoch = p->stream_epoch;
    on[n] = s->handle;
    sealed[n++] = bt;
  }
  return n;
}

/* The batches sealed earlier and the n new ones leave the lock while their events are queried
 * and recorded: marked out, their bytes (*out) counted as pending_out, the new ones' streams
 * held against destruction (sealers). Returns the earlier ones. Lock held. */
static vs_batch_t *take_out(vs_pool_t *p, vs_batch_t *const *sealed, int n, size_t *out) {
  vs_batch_t *check = p->batches;
  p->batches = NULL;
  for (vs_batch_t *bt = check; bt; bt = bt->next) bt->out = true;
  for (int i = 0; i < n; i++) sealed[i]->out = true;
  if (n) p->sealers++;
  *out = 0;
  for (int i = 0; i < n; i++) *out += sealed[i]->blocks.bytes;
  for (vs_batch_t *bt = check; bt; bt = bt->next) *out += bt->blocks.bytes;
  p->pending_out += *out;
  return check;
}

/* Queries the events of the batches sealed earlier: those completed go to *done, the others to
 * *still. Lock not held. */
static void query_batches(vs_batch_t *check, vs_batch_t **done, vs_batch_t **still) {
  while (check) {
    vs_batch_t *bt = check;
    check = bt->next;
    CUresult q = bt->event ? _vs_cu.cuEventQuery(bt->event) : CUDA_ERROR_NOT_READY;
    if (q == CUDA_SUCCESS) {
      bt->next = *done;
      *done = bt;
    } else {
      bt->next = *still;
      *still = bt;
    }
  }
}

/* Records each new batch's event on its stream, then to *done or *still as query_batches does.
 * Lock not held. */
static void record_batches(vs_batch_t *const *sealed, const CUstream *on, int n, vs_batch_t **done,
                           vs_batch_t **still) {
  for (int i = 0; i < n; i++) {
    vs_batch_t *bt = sealed[i];
    CUresult r = CUDA_SUCCESS;
    if (!bt->event) r = _vs_cu.cuEventCreate(&bt->event, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) r = _vs_cu.cuEventRecord(bt->event, on[i]);
    if (r != CUDA_SUCCESS && bt->event) {
      /* No event (stream gone, capture...): the batch waits for a context sync. */
      _vs_cu.cuEventDestroy(bt->event);
      bt->event = NULL;
    }
    /* An idle stream passes its event at once: one query now saves a growth. */
    if (bt->event && _vs_cu.cuEventQuery(bt->event) == CUDA_SUCCESS) {
      bt->next = *done;
      *done = bt;
      continue;
    }
    bt->next = *still;
    *still = bt;
  }
}

/* The batches come back under the lock (take_out undone): the blocks of those done are free,
 * the others wait on p->batches. Lock held. */
static void bring_back(vs_pool_t *p, vs_batch_t *done, vs_batch_t *still, size_t out, bool sealed_any) {
  p->pending_out -= out;
  if (sealed_any && --p->sealers == 0) pthread_cond_broadcast(&p->sealed);
  for (vs_batch_t *bt = done; bt; bt = bt->next) release_batch(p, bt);
  while (still) {
    vs_batch_t *bt = still;
    still = bt->next;
    bt->out = false;
    bt->next = p->batches;
    p->batches = bt;
  }
}

void _vs_pool_reclaim_by_events(vs_pool_t *p, const void *self, unsigned keep) {
  enum { MAX_SEAL = 32 };
  vs_batch_t *sealed[MAX_SEAL];
  CUstream on[MAX_SEAL];
  size_t out = 0;
  pool_lock(p);
  int n = seal_streams(p, self, keep, sealed, on, MAX_SEAL);
  vs_batch_t *check = take_out(p, sealed, n, &out);
  pool_unlock(p);
  /* The batches sealed earlier are queried first: new ones cannot have completed yet. */
  vs_batch_t *done = NULL, *still = NULL;
  query_batches(check, &done, &still);
  record_batches(sealed, on, n, &done, &still);
  pool_lock(p);
  bring_back(p, done, still, out, n > 0);
  VS_POOL_CHECK(p);
  pool_unlock(p);
  recycle_batches(p, done);
}

void _vs_pool_free_batches(vs_pool_t *p) {
  while (p->batches) {
    vs_batch_t *bt = p->batches;
    p->batches = bt->next;
    free(bt);
  }
}

/* ------------------------------------------------------------------ entry points */

void _vs_pool_stream_destroyed(vs_pool_t *p, CUstream stream) {
  const void *owner = NULL;
  CUstream key = _vs_stream_key(stream, &owner);
  pool_lock(p);
  vs_stream_t *s = _vs_stream_get(p, key, stream, owner, false);
  bool has = s && s->pending.head;
  pool_unlock(p);
  /* Seal its blocks with an event while the stream still exists; a later stream may get
   * the same handle, and must not inherit them. */
  if (has) _vs_pool_reclaim_by_events(p, owner, 0);
  pool_lock(p);
  p->stream_epoch++; /* a later stream with the same handle must not reuse the batches sealed on it */
  s = _vs_stream_get(p, key, stream, owner, false);
  if (s) {
    while (s->pending.head) { /* sealing failed: wait for a context sync instead */
      vs_block_t *b = s->pending.head;
      list_remove(&s->pending, b);
      b->stream = NULL;
      list_push(&p->deferred, b);
    }
    HASH_DEL(p->streams, s);
    if (p->last_stream == s) p->last_stream = NULL;
    free(s);
  }
  /* Another thread may have copied this stream's handle to record an event on it. */
  while (p->sealers) pool_wait(p, &p->sealed);
  pool_unlock(p);
}

CUresult _vs_pool_reclaim(vs_pool_t *p) {
  if (atomic_load(&_vs_captures_active)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  pool_lock(p);
  bool pending = p->pending_bytes != 0 || _vs_pool_ordered_unsettled(p);
  pool_unlock(p);
  return pending ? _vs_pool_sync_and_reclaim(p) : CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ deferred mode */

/* Synchronises the context in the background whenever deferred frees are pending, so the
 * program's thread never waits in free. Skips while a stream capture is active (a context
 * sync would invalidate it). */
static void *reclaimer_main(void *arg) {
  vs_pool_t *p = arg;
  _vs_guard++;
  _vs_cu.cuCtxSetCurrent(p->ctx);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  _vs_cu.cuThreadExchangeStreamCaptureMode(&mode);
  pool_lock(p);
  while (!p->stopping) {
    if (!p->deferred.head) {
      pool_wait(p, &p->wake);
      continue;
    }
    pool_unlock(p);
    if (atomic_load(&_vs_captures_active) == 0) {
      CUresult r = _vs_pool_sync_and_reclaim(p);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        /* The context failed or is being torn down: its frees can never be reused. */
        if (r != CUDA_ERROR_DEINITIALIZED && r != CUDA_ERROR_CONTEXT_IS_DESTROYED)
          _vs_warn("reclaimer: cuCtxSynchronize: %s; deferred frees stay pending", _vs_cu_error_name(r));
        pool_lock(p);
        p->stopping = true;
        break;
      }
    }
    struct timespec ts = {0, VS_RECLAIM_GATHER_US * 1000}; /* let frees gather: one sync serves many */
    nanosleep(&ts, NULL);
    pool_lock(p);
  }
  p->reclaimer_running = false;
  pthread_cond_broadcast(&p->wake);
  pool_unlock(p);
  return NULL;
}

void _vs_pool_start_reclaimer(vs_pool_t *p) {
  if (p->reclaimer_running || p->stopping) return;
  int rc = _vs_thread_start(&p->reclaimer, reclaimer_main, p);
  if (rc == 0) p->reclaimer_running = true;
  else
    _vs_warn("cannot start the reclaimer thread (%s); deferred frees wait for the next synchronisation",
             strerror(rc));
}

void _vs_pool_stop_reclaimer(vs_pool_t *p) {
  pool_lock(p);
  p->stopping = true;
  pthread_cond_broadcast(&p->wake);
  while (p->reclaimer_running) pool_wait(p, &p->wake);
  pool_unlock(p);
}
