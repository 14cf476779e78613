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

static _Thread_local char vs_thread_tag;

const void *_vs_thread_tag(void) { return &vs_thread_tag; }

CUstream _vs_stream_key(CUstream s, const void **owner) {
  *owner = NULL;
  if (s == CU_STREAM_LEGACY) return NULL;
  if (s == CU_STREAM_PER_THREAD) {
    *owner = &vs_thread_tag;
    return (CUstream)((uintptr_t)&vs_thread_tag | 1);
  }
  return s;
}

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

/* A freed block joins its stream's pending list. Returns whether the stream's older blocks
 * are now to be sealed (policy.h: vs_policy_seal_stream). */
static bool pend_on_stream(vs_pool_t *p, vs_block_t *b, vs_stream_t *s) {
  b->state = B_PENDING;
  b->freed_seq = p->sync_seq;
  b->stream = s;
  p->pending_bytes += b->size;
  list_push(&s->pending, b);
  if (s->pending.count <= VS_SEAL_KEEP) return false;
  size_t newest = 0;
  unsigned k = 0;
  for (const vs_block_t *c = s->pending.tail; c && k < VS_SEAL_KEEP; c = c->fprev, k++) newest += c->size;
  return vs_policy_seal_stream(s->pending.count, s->pending.bytes - newest, p->mapped);
}
