/* check.c: the pool's invariants, counted (VS_POOL_CHECK in debug builds, _vs_pool_check for
 * the tests): the bins, holes, map and pending lists agree with the pool's byte counts, mapped
 * bytes are the sum of its handles, no handle is mapped at two places, and the asleep list's
 * counts agree with its segments. Below every file of the pool that asserts them; it only reads. */
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

/* The number of blocks of a list, and whether each is in the expected state. */
static int check_list(const vs_list_t *l, vs_block_state_t st, size_t *bytes) {
  int bad = 0;
  size_t sum = 0;
  unsigned n = 0;
  for (const vs_block_t *b = l->head; b; b = b->fnext, n++) {
    if (b->state != st) bad++;
    sum += b->size;
  }
  if (sum != l->bytes || n != l->count) bad++;
  *bytes += sum;
  return bad;
}

static int cmp_handle(const void *a, const void *b) {
  CUmemGenericAllocationHandle x = *(const CUmemGenericAllocationHandle *)a, y = *(const CUmemGenericAllocationHandle *)b;
  return x < y ? -1 : x > y;
}

/* A handle is mapped at one place of the pool at a time: a stitch unmaps it where it was before
 * it maps it into its new range. Twice in the table would put two blocks on the same memory. */
static int check_handles_once(const vs_segs_t *t) {
  if (t->n < 2) return 0;
  CUmemGenericAllocationHandle *h = malloc(t->n * sizeof *h);
  if (!h) return 0; /* no host memory to look: nothing found */
  for (size_t i = 0; i < t->n; i++) h[i] = t->v[i].handle;
  qsort(h, t->n, sizeof *h, cmp_handle);
  int bad = 0;
  for (size_t i = 1; i < t->n; i++) bad += h[i] == h[i - 1];
  free(h);
  return bad;
}

int _vs_pool_check_locked(vs_pool_t *p) {
  int bad = 0;
  size_t free_sum = 0;
  for (int heap_id = 0; heap_id < VS_NHEAPS; heap_id++) {
    vs_heap_t *heap = &p->heaps[heap_id];
    size_t heap_sum = 0, holes = 0;
    for (unsigned i = 0; i < VS_NBINS; i++) {
      if (!heap->bins[i] != !bin_used(heap, i)) bad++; /* bitmap agrees with the bins */
      for (vs_block_t *b = heap->bins[i]; b; b = b->fnext) {
        if (b->state != B_FREE || b->bin != i || _vs_bin_of(b->size) != i || heap_id_of(p, b) != heap_id) bad++;
        if (_vs_block_mergeable(p, b->prev, b, B_FREE) || _vs_block_mergeable(p, b, b->next, B_FREE))
          bad++; /* unmerged neighbours */
        heap_sum += b->size;
      }
    }
    if (heap_sum != heap->free_bytes) bad++;
    free_sum += heap_sum;
    bad += check_list(&heap->holes, B_HOLE, &holes);
    for (vs_block_t *h = heap->holes.head; h; h = h->fnext)
      if (_vs_block_mergeable(p, h->prev, h, B_HOLE) || _vs_block_mergeable(p, h, h->next, B_HOLE)) bad++;
  }
  if (free_sum != p->free_bytes) bad++;
  size_t used_sum = 0, stream_sum = 0, stream_req = 0;
  for (vs_block_t *b = p->map; b; b = b->hh.next) {
    if (b->state != B_USED) bad++;
    if (b->addr % VS_MIN_ALIGN) bad++;
    used_sum += b->size;
    if (b->stream_ordered) {
      stream_sum += b->size;
      stream_req += b->requested;
    }
  }
  if (used_sum != p->used || stream_sum != p->stream_served || stream_req != p->stream_requested) bad++;
  size_t pending_sum = 0;
  bad += check_list(&p->deferred, B_PENDING, &pending_sum);
  for (vs_stream_t *s = p->streams; s; s = s->hh.next) {
    bad += check_list(&s->pending, B_PENDING, &pending_sum);
    for (vs_block_t *b = s->pending.head; b; b = b->fnext)
      if (b->stream != s || b->batch) bad++;
  }
  for (vs_batch_t *bt = p->batches; bt; bt = bt->next) {
    bad += check_list(&bt->blocks, B_PENDING, &pending_sum);
    if (bt->out) bad++;
    for (vs_block_t *b = bt->blocks.head; b; b = b->fnext)
      if (b->batch != bt || b->stream) bad++;
  }
  /* Batches a thread took out of the lock to record or query their events are in no list. */
  if (pending_sum + p->pending_out != p->pending_bytes) bad++;
  size_t seg_sum = 0;
  for (size_t i = 0; i < p->segs.n; i++) {
    seg_sum += p->segs.v[i].size;
    if (i && p->segs.v[i - 1].va + p->segs.v[i - 1].size > p->segs.v[i].va) bad++;
  }
  bad += check_handles_once(&p->segs);
  size_t heaps_mapped = 0;
  for (int heap_id = 0; heap_id < VS_NHEAPS; heap_id++) heaps_mapped += p->heaps[heap_id].mapped;
  if (seg_sum != p->mapped || heaps_mapped != p->mapped) bad++; /* mapped bytes = the sum of handles */
  /* Asleep memory left the device; its blocks stayed. */
  if (p->mapped + p->asleep.bytes != p->used + p->free_bytes + p->pending_bytes + p->stuck_bytes) bad++;
  size_t asleep_sum = 0, host_mapped = 0;
  for (size_t i = 0; i < p->asleep.n; i++) {
    asleep_sum += p->asleep.v[i].size;
    if (p->asleep.v[i].mode == VMMSHIM_SLEEP_MAPPED) host_mapped += p->asleep.v[i].size;
  }
  size_t spilled = 0;
  for (size_t i = 0; i < p->asleep.n; i++)
    if (p->asleep.v[i].spilled) {
      spilled += p->asleep.v[i].size;
      if (p->asleep.v[i].mode != VMMSHIM_SLEEP_MAPPED) bad++; /* spilled memory is always mapped */
    }
  if (asleep_sum != p->asleep.bytes || host_mapped != p->asleep.host_mapped || spilled != p->asleep.spilled) bad++;
  return bad;
}

int _vs_pool_check(vs_pool_t *p) {
  pool_lock(p);
  int bad = _vs_pool_check_locked(p);
  pool_unlock(p);
  return bad;
}
