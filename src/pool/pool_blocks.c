/* pool_blocks.c: blocks and bins, the pool's hot data structure.
 *
 * A heap's address space is a list of blocks in address order (one chain per reservation);
 * free blocks sit in size bins, 4 per power of two, each a LIFO with a bitmap of the
 * non-empty ones. Free neighbours merge. Carving hands out the part a request needs and gives
 * the rest back: to the bins, or to the stream's pending list it came from.
 *
 * Part of pool.c's translation unit (included there), so that the allocation path inlines
 * it; the functions with a _vs_ name are also called from handles.c and reclaim.c. */
#ifndef VS_POOL_UNIT
#error "pool_blocks.c is part of pool.c: compile pool.c"
#endif

/* ------------------------------------------------------------------ descriptors */

vs_block_t *_vs_block_new(vs_pool_t *p) {
  vs_block_t *b = p->spare_blocks;
  if (vs_likely(b)) {
    p->spare_blocks = b->fnext;
  } else {
    b = malloc(sizeof *b);
    if (!b) return NULL;
  }
  memset(b, 0, sizeof *b);
  return b;
}

void _vs_block_put(vs_pool_t *p, vs_block_t *b) {
  b->fnext = p->spare_blocks;
  p->spare_blocks = b;
}

/* ------------------------------------------------------------------ bins */

/* Bin of a size: 4 bins per power of two (floor). */
unsigned _vs_bin_of(size_t size) {
  unsigned lg = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
  if (lg < VS_SUB_BITS) return lg << VS_SUB_BITS;
  unsigned sub = (unsigned)(size >> (lg - VS_SUB_BITS)) & ((1u << VS_SUB_BITS) - 1);
  return (lg << VS_SUB_BITS) | sub;
}

void _vs_bin_insert(vs_pool_t *p, vs_block_t *b) {
  vs_heap_t *heap = heap_of(p, b);
  unsigned i = _vs_bin_of(b->size);
  b->state = B_FREE;
  b->bin = (uint8_t)i;
  b->fprev = NULL;
  b->fnext = heap->bins[i];
  if (b->fnext) b->fnext->fprev = b;
  heap->bins[i] = b;
  heap->binmap[i / 64] |= 1ull << (i % 64);
  heap->free_bytes += b->size;
  p->free_bytes += b->size;
}

void _vs_bin_remove(vs_pool_t *p, vs_block_t *b) {
  vs_heap_t *heap = heap_of(p, b);
  unsigned i = b->bin;
  vs_assert(b->state == B_FREE && heap->bins[i] != NULL);
  if (b->fprev) b->fprev->fnext = b->fnext;
  else heap->bins[i] = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  if (!heap->bins[i]) heap->binmap[i / 64] &= ~(1ull << (i % 64));
  b->fprev = b->fnext = NULL;
  heap->free_bytes -= b->size;
  p->free_bytes -= b->size;
}

size_t _vs_align_pad(CUdeviceptr addr, size_t align) {
  return (size_t)((align - (addr & (align - 1))) & (align - 1));
}

static bool fits(const vs_block_t *b, size_t size, size_t align) {
  size_t pad = _vs_align_pad(b->addr, align);
  return b->size >= pad && b->size - pad >= size;
}

/* A free block that holds size bytes at the alignment. Bins from the request's own up to
 * that of size plus the worst alignment pad may hold blocks that fit or not: the first few
 * of each are examined (the smallest fitting one wins). Any block in a higher bin fits:
 * there the lowest address among the first few wins, so memory packs low and high handles
 * empty out. */
static vs_block_t *bin_find(vs_heap_t *heap, size_t size, size_t align) {
  size_t want = size + (align > VS_MIN_ALIGN ? align - VS_MIN_ALIGN : 0);
  unsigned first = _vs_bin_of(size), last = _vs_bin_of(want);
  for (unsigned i = first; i <= last; i++) {
    if (!bin_used(heap, i)) continue;
    vs_block_t *best = NULL;
    int n = 0;
    for (vs_block_t *b = heap->bins[i]; b && n < VS_BIN_SCAN; b = b->fnext, n++)
      if (fits(b, size, align) && (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)))
        best = b;
    if (best) return best;
  }
  unsigned start = last + 1;
  for (unsigned w = start / 64; w < VS_NBINS / 64; w++) {
    uint64_t bits = heap->binmap[w];
    if (w == start / 64) bits &= ~0ull << (start % 64);
    if (bits) {
      vs_block_t *best = NULL;
      int n = 0;
      for (vs_block_t *b = heap->bins[w * 64 + (unsigned)__builtin_ctzll(bits)]; b && n < VS_BIN_SCAN;
           b = b->fnext, n++)
        if (!best || b->addr < best->addr) best = b;
      return best;
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------ address-order list */

static void link_after(vs_block_t *a, vs_block_t *b) {
  b->prev = a;
  b->next = a->next;
  if (a->next) a->next->prev = b;
  a->next = b;
}

static void unlink_block(vs_block_t *b) {
  if (b->prev) b->prev->next = b->next;
  if (b->next) b->next->prev = b->prev;
}

vs_block_t *_vs_block_split(vs_pool_t *p, vs_block_t *b, size_t off) {
  vs_assert(off > 0 && off < b->size);
  vs_block_t *r = _vs_block_new(p);
  if (!r) return NULL;
  r->addr = b->addr + off;
  r->size = b->size - off;
  r->resv = b->resv;
  r->state = b->state;
  r->freed_seq = b->freed_seq;
  b->size = off;
  link_after(b, r);
  return r;
}

/* Whether a ends where b starts, in the same reservation. */
static inline bool touching(const vs_block_t *a, const vs_block_t *b) {
  return a && b && a->resv == b->resv && a->addr + a->size == b->addr;
}

bool _vs_block_mergeable(const vs_pool_t *p, const vs_block_t *a, const vs_block_t *b, vs_block_state_t st) {
  (void)p;
  return touching(a, b) && a->state == st && b->state == st;
}

/* Absorbs the neighbour c (after b, same state, off its list already) into b. */
static void absorb_next(vs_pool_t *p, vs_block_t *b, vs_block_t *c) {
  b->size += c->size;
  unlink_block(c);
  _vs_block_put(p, c);
}

void _vs_block_make_free(vs_pool_t *p, vs_block_t *b) {
  b->state = B_FREE;
  if (_vs_block_mergeable(p, b->prev, b, B_FREE)) {
    vs_block_t *a = b->prev;
    _vs_bin_remove(p, a);
    absorb_next(p, a, b);
    b = a;
  }
  if (_vs_block_mergeable(p, b, b->next, B_FREE)) {
    vs_block_t *c = b->next;
    _vs_bin_remove(p, c);
    absorb_next(p, b, c);
  }
  _vs_bin_insert(p, b);
}

void _vs_block_make_hole(vs_pool_t *p, vs_block_t *b) {
  vs_list_t *holes = &heap_of(p, b)->holes;
  b->state = B_HOLE;
  if (_vs_block_mergeable(p, b->prev, b, B_HOLE)) {
    vs_block_t *a = b->prev;
    list_remove(holes, a);
    absorb_next(p, a, b);
    b = a;
  }
  if (_vs_block_mergeable(p, b, b->next, B_HOLE)) {
    vs_block_t *c = b->next;
    list_remove(holes, c);
    absorb_next(p, b, c);
  }
  list_push(holes, b);
}

/* ------------------------------------------------------------------ carving */

/* A piece of a carved block that is not handed out. From the bins it goes back to the bins.
 * From stream s's pending list it goes back to that list (same free sequence number): the
 * work queued on s before the free may still touch all of the block, and in the bins another
 * stream, or a trim that unmaps idle handles, could take it before that work is done. */
static void give_back_piece(vs_pool_t *p, vs_block_t *piece, vs_stream_t *s, uint64_t freed_seq) {
  if (!s) {
    _vs_block_make_free(p, piece);
    return;
  }
  piece->state = B_PENDING;
  piece->freed_seq = freed_seq;
  piece->stream = s;
  list_push(&s->pending, piece);
  p->pending_bytes += piece->size;
}

/* Carves [pad, pad+size) out of b (already taken off the bins, or off stream s's pending
 * list when s is not NULL) and returns it USED. The pieces are BUSY while split, so giving
 * the leftovers back never merges them into the block being handed out. */
static vs_block_t *carve(vs_pool_t *p, vs_block_t *b, size_t size, size_t align, vs_stream_t *s) {
  uint64_t seq = b->freed_seq;
  b->state = B_BUSY;
  size_t pad = _vs_align_pad(b->addr, align);
  if (pad) {
    vs_block_t *r = _vs_block_split(p, b, pad);
    give_back_piece(p, b, s, seq);
    if (!r) return NULL;
    b = r;
  }
  if (vs_policy_should_split(b->size, size)) {
    vs_block_t *r = _vs_block_split(p, b, size);
    if (r) give_back_piece(p, r, s, seq);
  }
  b->state = B_USED;
  return b;
}
