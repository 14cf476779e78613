/* pool_streams.c: the blocks freed on each stream, as the allocation path sees them.
 *
 * A block freed with cudaFreeAsync on stream S waits on S's pending list: an allocation on S
 * may reuse it at once (stream order protects it), everyone else only once reclaim.c has
 * seen an event recorded on S after the free complete, or a context synchronisation end.
 *
 * Part of pool.c's translation unit (included there), so that the allocation path inlines
 * the lookups. */
#ifndef VS_POOL_UNIT
#error "pool_streams.c is part of pool.c: compile pool.c"
#endif

vs_stream_t *_vs_stream_get(vs_pool_t *p, CUstream key, CUstream handle, const void *owner, bool create) {
  vs_stream_t *s = p->last_stream;
  if (vs_likely(s && s->key == key)) return s;
  HASH_FIND(hh, p->streams, &key, sizeof key, s);
  if (s) p->last_stream = s;
  if (s || !create) return s;
  s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->key = key;
  s->handle = handle;
  s->owner = owner;
  HASH_ADD(hh, p->streams, key, sizeof s->key, s);
  p->last_stream = s;
  return s;
}

/* A thread's tag: its number (init.c), so that a thread started after another exited never
 * passes for it (nor its per-thread stream for the other's). */
const void *_vs_thread_tag(void) { return (const void *)_vs_thread_id(); }

/* The best block on s's pending list for the request: among the last few freed, the
 * smallest that serves it (policy.h: vs_policy_stream_fits; an exact fit ends the search).
 * Taken off the list. */
static vs_block_t *take_from_stream(vs_pool_t *p, vs_stream_t *s, int heap_id, size_t size, size_t align) {
  int n = 0;
  vs_block_t *best = NULL;
  for (vs_block_t *b = s->pending.tail; b && n < VS_STREAM_SCAN; b = b->fprev, n++) {
    if (heap_id_of(p, b) != heap_id || !fits(b, size, align)) continue;
    if (!vs_policy_stream_fits(heap_id, b->size - _vs_align_pad(b->addr, align), size)) continue;
    if (!best || b->size < best->size) best = b;
    if (b->size - _vs_align_pad(b->addr, align) - size < VS_MIN_ALIGN) break;
  }
  if (!best) return NULL;
  list_remove(&s->pending, best);
  p->pending_bytes -= best->size;
  best->stream = NULL;
  return best;
}

/* Takes a PENDING block off s's pending list, or off a batch sealed on s that no reclaim has
 * out; false when it is neither (deferred, another stream's, a batch of a stream since
 * destroyed). */
static bool take_own_pending(vs_pool_t *p, vs_block_t *b, vs_stream_t *s) {
  if (b->stream == s) {
    list_remove(&s->pending, b);
  } else if (b->batch && !b->batch->out && b->batch->key == s->key && b->batch->epoch == p->stream_epoch) {
    list_remove(&b->batch->blocks, b);
    b->batch = NULL;
  } else {
    return false;
  }
  b->stream = NULL;
  return true;
}

/* The FREE neighbours of a block (same reservation, touching it), which a pending block of a
 * stream may take in: free memory is no one's. */
static vs_block_t *free_before(const vs_block_t *b) {
  return touching(b->prev, b) && b->prev->state == B_FREE ? b->prev : NULL;
}
static vs_block_t *free_after(const vs_block_t *b) {
  return touching(b, b->next) && b->next->state == B_FREE ? b->next : NULL;
}

/* Takes b's FREE neighbours into b (off every list, PENDING): returns the block, which starts
 * at the lower neighbour when there is one. */
static vs_block_t *absorb_free_around(vs_pool_t *p, vs_block_t *b) {
  vs_block_t *a = free_before(b);
  if (a) {
    _vs_bin_remove(p, a);
    p->pending_bytes += a->size;
    a->state = B_PENDING;
    a->freed_seq = b->freed_seq;
    absorb_next(p, a, b);
    b = a;
  }
  vs_block_t *c = free_after(b);
  if (c) {
    _vs_bin_remove(p, c);
    p->pending_bytes += c->size;
    absorb_next(p, b, c);
  }
  return b;
}

/* A freed block joins its stream's pending list. Returns whether the stream's older blocks
 * are now to be sealed (policy.h: vs_policy_seal_stream). */
static bool pend_on_stream(vs_pool_t *p, vs_block_t *b, vs_stream_t *s) {
  b->state = B_PENDING;
  b->freed_seq = p->sync_seq;
  b->stream = s;
  p->pending_bytes += b->size;
  /* Neighbours freed on the same stream merge at once, also those sealed in a batch on it: the
   * stream's own later work is ordered after both frees, so it may reuse the whole range; for
   * the others the merged block waits for an event recorded after this free. */
  vs_block_t *a = b->prev;
  if (_vs_block_mergeable(p, a, b, B_PENDING) && take_own_pending(p, a, s)) {
    absorb_next(p, a, b);
    a->freed_seq = p->sync_seq;
    b = a;
  }
  vs_block_t *c = b->next;
  if (_vs_block_mergeable(p, b, c, B_PENDING) && take_own_pending(p, c, s)) absorb_next(p, b, c);
  b->stream = s;
  list_push(&s->pending, b);
  if (s->pending.count <= VS_SEAL_KEEP) return false;
  size_t newest = 0;
  unsigned k = 0;
  for (const vs_block_t *c = s->pending.tail; c && k < VS_SEAL_KEEP; c = c->fprev, k++) newest += c->size;
  return vs_policy_seal_stream(s->pending.count, s->pending.bytes - newest, p->mapped);
}

/* Makes pending block b (on list l) the best candidate of take_from_stream_loose when it serves
 * the request counted with the FREE neighbours it would take in, and is smaller than the best. */
static void consider_loose(const vs_pool_t *p, vs_block_t *b, vs_list_t *l, int heap_id, size_t size, size_t align,
                           vs_block_t **best, size_t *best_total, vs_list_t **from) {
  if (heap_id_of(p, b) != heap_id) return;
  const vs_block_t *before = free_before(b), *after = free_after(b);
  CUdeviceptr start = before ? before->addr : b->addr;
  size_t total = b->size + (before ? before->size : 0) + (after ? after->size : 0);
  if (total >= _vs_align_pad(start, align) + size && (!*best || total < *best_total)) {
    *best = b;
    *best_total = total;
    *from = l;
  }
}

/* Before the pool grows for a request on stream s: the smallest block that serves it among all
 * of s's pending blocks and the blocks of the batches sealed on s (their events may not have
 * completed, but s's own work is ordered after their frees), whatever the piece left over,
 * each counted with the FREE neighbours it takes in: else the stream's freed memory and the
 * memory its earlier batches gave back lie side by side in pieces that neither serves a large
 * request alone, and the pool grows (seen on the H100, where the GPU runs behind the program).
 * Freed memory of the stream costs no driver call; a growth does, and holds more. Taken off
 * its list; the leftover pieces go to s's pending list. Lock held. */
static vs_block_t *take_from_stream_loose(vs_pool_t *p, vs_stream_t *s, int heap_id, size_t size, size_t align) {
  vs_block_t *best = NULL;
  vs_list_t *from = NULL;
  size_t best_total = 0;
  int n = 0;
  for (vs_block_t *b = s->pending.tail; b && n < VS_STREAM_LOOSE_SCAN; b = b->fprev, n++)
    consider_loose(p, b, &s->pending, heap_id, size, align, &best, &best_total, &from);
  for (vs_batch_t *bt = p->batches; bt && n < VS_STREAM_LOOSE_SCAN; bt = bt->next) {
    if (bt->key != s->key || bt->epoch != p->stream_epoch) continue;
    for (vs_block_t *b = bt->blocks.tail; b && n < VS_STREAM_LOOSE_SCAN; b = b->fprev, n++)
      consider_loose(p, b, &bt->blocks, heap_id, size, align, &best, &best_total, &from);
  }
  if (!best) return NULL;
  list_remove(from, best);
  best->stream = NULL;
  best->batch = NULL;
  best = absorb_free_around(p, best);
  p->pending_bytes -= best->size;
  return best;
}
