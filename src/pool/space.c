/* space.c: a pool's address space and the memory mapped into it.
 *
 * Each heap reserves virtual ranges (cuMemAddressReserve); unmapped ranges are HOLE blocks.
 * Growth maps what a request needs right after a free block that ends at a hole (so the two
 * join), else into the lowest hole that fits; before it maps, it gives back idle handles
 * (policy.h says which to keep), so physical memory follows what is live, not the history of
 * the address space. With handles bounded (VMMSHIM_MAX_HANDLE), the handles given back are
 * mapped again into the new range where they fit, instead of being released and new ones
 * created. The handles themselves are mapped and unmapped by the handle layer (handles.c).
 *
 * Everything here runs on the slow path. The pool lock is taken to edit the block lists
 * and dropped around every driver call: the blocks being mapped or unmapped are BUSY. */
#include <limits.h>
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

/* ------------------------------------------------------------------ reservations */

int _vs_pool_add_reservation(vs_pool_t *p, int heap_id, size_t size) {
  CUdeviceptr va;
  if (_vs_vmm_reserve(&p->caps, size, p->gran, &va) != CUDA_SUCCESS) return -1;
  pool_lock(p);
  vs_block_t *b = p->n_resv < VS_MAX_RESV ? _vs_block_new(p) : NULL;
  if (!b || _vs_dir_add(va, size, p) != 0) {
    if (b) _vs_block_put(p, b);
    pool_unlock(p);
    _vs_vmm_address_free(&p->caps, va, size);
    return -1;
  }
  int r = p->n_resv++;
  p->resv[r].va = va;
  p->resv[r].size = size;
  p->resv[r].first = b;
  p->resv_heap[r] = (uint8_t)heap_id;
  if (!p->heap_resv_size[heap_id]) p->heap_resv_size[heap_id] = size;
  /* Each reservation has its own address-order chain: blocks never link or merge across. */
  b->addr = va;
  b->size = size;
  b->resv = (uint16_t)r;
  b->state = B_HOLE;
  list_push(&p->heaps[heap_id].holes, b);
  pool_unlock(p);
  return 0;
}

/* ------------------------------------------------------------------ IPC export */

vs_pool_status_t _vs_pool_handles_of(vs_pool_t *p, CUdeviceptr ptr, size_t *offset_out, CUmemGenericAllocationHandle *handles,
                                     size_t *sizes, int max, int *n_out) {
  *n_out = 0;
  *offset_out = 0;
  vs_pool_status_t st = VS_POOL_NOT_OWNED;
  pool_lock(p);
  vs_block_t *b;
  HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
  if (b && b != &p->map_anchor && b->state == B_USED &&
      _vs_segs_covering(&p->segs, ptr, b->addr + b->size, offset_out, handles, sizes, max, n_out) == 0)
    st = VS_POOL_OK;
  pool_unlock(p);
  return st;
}

const vs_device_caps_t *_vs_pool_caps(const vs_pool_t *p) { return &p->caps; }

/* ------------------------------------------------------------------ access */

static unsigned access_gen(const vs_pool_t *p) { return p->access ? atomic_load(&p->access->gen) : 0; }

void _vs_pool_set_access(vs_pool_t *p, uint64_t rw, uint64_t ro, uint64_t none) {
  pool_lock(p);
  p->applying_access++;
  /* The device handles, and the host memory mapped at the pool's addresses (a tag asleep in
   * mapped mode, growths served past the limit): the program reaches both. */
  size_t n = p->segs.n, nh = 0;
  for (size_t i = 0; i < p->asleep.n; i++) nh += p->asleep.v[i].mode == VMMSHIM_SLEEP_MAPPED;
  vs_seg_t *copy = n + nh ? malloc((n + nh) * sizeof *copy) : NULL;
  bool lost = n + nh && !copy;
  if (copy) {
    memcpy(copy, p->segs.v, n * sizeof *copy);
    for (size_t i = 0; i < p->asleep.n; i++)
      if (p->asleep.v[i].mode == VMMSHIM_SLEEP_MAPPED) copy[n++] = (vs_seg_t){p->asleep.v[i].va, p->asleep.v[i].size, 0};
  } else {
    n = 0;
  }
  pool_unlock(p);
  if (lost) _vs_warn("device %d: no host memory to change the pool's access; it stays as it was", (int)p->caps.device);
  _vs_handles_set_access(&p->caps, copy, n, rw, ro, none);
  free(copy);
  pool_lock(p);
  p->applying_access--;
  pool_unlock(p);
}

/* ------------------------------------------------------------------ ranges whose unmap failed */

/* A range whose cuMemUnmap failed is still mapped, in a state the pool cannot know: it stays a
 * BUSY block (out of use, and never a hole that a growth would map over), its segment stays in
 * the table (teardown tries the unmap again) and it stays counted as mapped (stuck_bytes in the
 * pool's sums). The pool says so once. */

/* Takes stuck segment sg back into the table and the sums. Lock held. */
static void keep_stuck_seg(vs_pool_t *p, int heap_id, const vs_seg_t *sg) {
  if (_vs_segs_add(&p->segs, sg, 1) != 0) {
    /* No host memory for the table: the range stays out of use, unknown to teardown. */
    p->lost_stuck = true;
    return;
  }
  p->mapped += sg->size;
  p->heaps[heap_id].mapped += sg->size;
  p->stuck_bytes += sg->size;
}

/* Whether this failure is the pool's first (to be said). Lock held. */
static bool first_stuck(vs_pool_t *p) {
  bool first = !p->said_stuck;
  p->said_stuck = true;
  return first;
}

static void say_stuck(const vs_pool_t *p, const vs_seg_t *sg, const char *when) {
  _vs_warn("device %d: cuMemUnmap failed %s: %zu bytes at 0x%llx stay mapped, out of use and counted as mapped "
           "(further such ranges of this pool are not reported)",
           (int)p->caps.device, when, sg->size, (unsigned long long)sg->va);
}

/* A growth into BUSY block b failed; stuck[] (address order) are its pieces that could not be
 * unmapped. They stay BUSY (keep_stuck_seg), the rest of b becomes holes. Lock held. */
static void growth_failed(vs_pool_t *p, vs_block_t *b, const vs_seg_t *stuck, int n) {
  int heap_id = heap_id_of(p, b);
  vs_block_t *rest = b; /* not looked at yet; NULL: left BUSY (no descriptor to split it) */
  for (int i = 0; i < n; i++) {
    keep_stuck_seg(p, heap_id, &stuck[i]);
    if (!rest) continue;
    if (stuck[i].va > rest->addr) {
      vs_block_t *piece = _vs_block_split(p, rest, (size_t)(stuck[i].va - rest->addr));
      if (!piece) {
        rest = NULL;
        continue;
      }
      _vs_block_make_hole(p, rest);
      rest = piece;
    }
    rest = rest->size > stuck[i].size ? _vs_block_split(p, rest, stuck[i].size) : NULL;
  }
  if (rest) _vs_block_make_hole(p, rest);
}

/* ------------------------------------------------------------------ growth */

/* Picks where to map more bytes for a request of `size`: right after a free block ending at
 * a hole (so the two join), else the lowest hole that is large enough. Returns the BUSY
 * block carved from the hole (its size in *len_out), or NULL. Lock held. */
static vs_block_t *claim_hole(vs_pool_t *p, vs_heap_t *heap, size_t size, size_t align, size_t min_handle,
                              size_t *len_out) {
  vs_block_t *pick = NULL;
  size_t pick_len = 0, pick_tail = 0;
  for (vs_block_t *h = heap->holes.head; h; h = h->fnext) {
    /* The block will start at the free tail before the hole if there is one, else at the
     * hole's start (a multiple of the minimum granularity, so aligned). */
    size_t tail = 0, pad = 0;
    vs_block_t *t = h->prev;
    if (t && _vs_block_mergeable(p, t, &(vs_block_t){.addr = h->addr, .resv = h->resv, .state = B_FREE}, B_FREE)) {
      tail = t->size;
      pad = _vs_align_pad(t->addr, align);
    }
    size_t need = size + pad;
    size_t len = need > tail ? round_up(need - tail, p->caps.min_granularity) : p->caps.min_granularity;
    if (len < min_handle && min_handle <= h->size) len = min_handle;
    if (len > h->size) continue;
    if (!pick || (tail && !pick_tail) || (!!tail == !!pick_tail && h->addr < pick->addr)) {
      pick = h;
      pick_len = len;
      pick_tail = tail;
    }
  }
  if (!pick) return NULL;
  list_remove(&heap->holes, pick);
  if (pick_len < pick->size) {
    vs_block_t *rest = _vs_block_split(p, pick, pick_len);
    if (!rest) {
      list_push(&heap->holes, pick);
      return NULL;
    }
    rest->state = B_HOLE;
    list_push(&heap->holes, rest);
  }
  pick->state = B_BUSY;
  *len_out = pick_len;
  return pick;
}

static size_t unmap_idle(vs_pool_t *p, size_t keep, bool exact, vs_spares_t *sp, int max_pieces);

/* Before a growth of `want` bytes, the idle handles beyond what policy.h keeps are unmapped:
 * into sp (at most its capacity), for the growth to map again at its own address, the rest
 * released. */
static void release_before_growth(vs_pool_t *p, size_t want, vs_spares_t *sp) {
  pool_lock(p);
  size_t idle = p->free_bytes, mapped = p->mapped;
  pool_unlock(p);
  size_t keep = vs_policy_keep_idle(idle, want, mapped, p->gran);
  if (idle > keep && idle >= p->caps.min_granularity) unmap_idle(p, keep, false, sp, VS_GROW_PIECES);
}

/* The stitch. Before a growth of `want` bytes, idle whole handles of the pool (each no larger
 * than what is still wanted, at most VS_STITCH_PIECES of them, the largest free blocks first)
 * are unmapped from where they sit into sp: the growth maps them side by side into its new
 * range and creates a handle only for the rest. A handle is unmapped from its old place before
 * it is mapped again, so it is never mapped at two addresses and never under two blocks; its
 * old place becomes a hole. Returns the bytes gathered. Lock not held. */
static size_t stitch_gather(vs_pool_t *p, size_t want, vs_spares_t *sp) {
  if (!p->stitch) return 0; /* off (the default): not even the lock */
  pool_lock(p);
  size_t idle = p->free_bytes;
  pool_unlock(p);
  if (idle < p->caps.min_granularity) return 0;
  return unmap_idle(p, idle > want ? idle - want : 0, true, sp, VS_STITCH_PIECES);
}

static size_t spares_bytes(const vs_spares_t *sp) {
  size_t n = 0;
  for (int i = 0; i < sp->n; i++) n += sp->seg[i].size;
  return n;
}

/* The idle handles a growth of `want` bytes maps again: the stitch's, then (handles bounded)
 * those the give-back unmaps; what is still idle beyond the budget is released. Returns their
 * bytes. Lock not held. */
static size_t gather_spares(vs_pool_t *p, size_t want, vs_spares_t *sp) {
  size_t gathered = stitch_gather(p, want, sp);
  release_before_growth(p, want - gathered, p->chunk < SIZE_MAX / 2 ? sp : NULL);
  return spares_bytes(sp);
}

vs_block_t *_vs_pool_claim_space(vs_pool_t *p, int heap_id, size_t size, size_t align, size_t handle,
                                 size_t *len_out) {
  vs_heap_t *heap = &p->heaps[heap_id];
  pool_lock(p);
  vs_block_t *b = claim_hole(p, heap, size, align, handle, len_out);
  pool_unlock(p);
  if (b) return b;
  size_t more = round_up(size + align, p->gran) * 2; /* a new reservation starts aligned */
  if (more < p->heap_resv_size[heap_id]) more = p->heap_resv_size[heap_id];
  if (_vs_pool_add_reservation(p, heap_id, more) != 0) return NULL;
  pool_lock(p);
  b = claim_hole(p, heap, size, align, handle, len_out);
  pool_unlock(p);
  return b;
}

/* Maps [va, va+len): the spares that fit first, new handles for the rest, with the access of
 * the owner and the peers now. Lock not held. */
static CUresult map_range(vs_pool_t *p, CUdeviceptr va, size_t len, size_t chunk, vs_spares_t *sp, vs_seg_t *pieces,
                          int *np) {
  uint64_t rw, ro;
  access_now(p, &rw, &ro);
  return _vs_handles_map(&p->caps, va, len, chunk, rw, ro, sp, pieces, VS_GROW_PIECES, np);
}

/* A growth that mapped idle handles again (the stitch's, and the spares of a bounded growth's
 * give-back): counted in the stitch stats (stats.c) and traced ('h'). */
static void note_stitch(const vs_pool_t *p, CUdeviceptr va, size_t len, int handles, size_t fresh, int reused_n,
                        uint64_t t0) {
  VS_STAT_ADD_STITCH(stitches, 1);
  VS_STAT_ADD_STITCH(handles, (uint64_t)reused_n);
  VS_STAT_ADD_STITCH(bytes, len - fresh);
  if (_vs_trace_on) _vs_trace_stitch(va, len, (unsigned)handles, fresh, (int)p->caps.device, _vs_now_ns() - t0);
}

CUresult _vs_pool_grow(vs_pool_t *p, int heap_id, size_t size, size_t align, bool exact) {
  vs_heap_t *heap = &p->heaps[heap_id];
  pool_lock(p);
  size_t handle = vs_policy_grow_step(heap->mapped, p->gran, p->caps.min_granularity, exact);
  pool_unlock(p);
  /* With VMMSHIM_MAX_HANDLE set, the idle handles given back are mapped again here when they
   * fit (10-50% fewer VMM calls). Without it only the stitch's are (gather_spares): mapping every
   * spare makes a growth several handles and the pool more of them (docs/design.md). */
  uint64_t t0 = _vs_now_ns();
  vs_spares_t spares = {.n = 0};
  size_t spare_bytes = gather_spares(p, round_up(size, handle), &spares);
  int spare_n = spares.n;
  size_t len = 0;
  vs_block_t *b = _vs_pool_claim_space(p, heap_id, size, align, handle, &len);
  if (!b) {
    _vs_handles_release_spares(&p->caps, &spares);
    _vs_warn("device %d: no address space for %zu bytes", (int)p->caps.device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }

  vs_seg_t pieces[VS_GROW_PIECES];
  int np = 0;
  size_t chunk = p->chunk;
  if (len / chunk >= VS_GROW_PIECES) chunk = round_up(len / (VS_GROW_PIECES - 1), p->caps.min_granularity);
  CUresult r;
  unsigned gen = access_gen(p);
  bool admitted = _vs_mapped_admit((int)p->caps.device, len);
  if (!admitted) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    r = map_range(p, b->addr, len, chunk, &spares, pieces, &np);
  }
  int reused_n = spare_n - spares.n; /* what the new range took of the idle handles */
  size_t reused = spare_bytes - spares_bytes(&spares);
  _vs_handles_release_spares(&p->caps, &spares);

  /* The new mappings become visible to access changes under their lock: one made since the
   * access above was set is applied here first (the block is still BUSY, so nothing unmaps it). */
  bool peers = p->access && r == CUDA_SUCCESS;
  if (peers) {
    _vs_access_lock();
    if (access_gen(p) != gen) {
      uint64_t rw = atomic_load(&p->access->rw), ro = atomic_load(&p->access->ro);
      r = _vs_vmm_set_access_devices(&p->caps, b->addr, len, rw, ro, atomic_load(&p->access->ever) & ~(rw | ro));
      if (r != CUDA_SUCCESS) np = _vs_handles_unmap(&p->caps, pieces, np);
    }
  }
  pool_lock(p);
  if (r == CUDA_SUCCESS && _vs_segs_add(&p->segs, pieces, np) != 0) {
    /* No host memory for the segment table: undo the whole growth. */
    pool_unlock(p);
    np = _vs_handles_unmap(&p->caps, pieces, np);
    pool_lock(p);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* On failure pieces[0..np) are those whose unmap failed (handles.h). */
  size_t stuck = 0;
  bool say = false;
  if (r == CUDA_SUCCESS) {
    p->mapped += len;
    heap->mapped += len;
    _vs_block_make_free(p, b);
  } else {
    for (int i = 0; i < np; i++) stuck += pieces[i].size;
    growth_failed(p, b, pieces, np);
    say = np && first_stuck(p);
  }
  VS_POOL_CHECK(p);
  pool_unlock(p);
  if (peers) _vs_access_unlock();
  if (r != CUDA_SUCCESS && admitted) _vs_mapped_return((int)p->caps.device, len - stuck);
  if (say) say_stuck(p, &pieces[0], "after a failed growth");
  size_t now_mapped = r == CUDA_SUCCESS ? len : stuck;
  if (now_mapped) {
    uint64_t m = VS_STAT_ADD(bytes_mapped, now_mapped) + now_mapped;
    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);
  }
  if (r == CUDA_SUCCESS && reused_n > 0) note_stitch(p, b->addr, len, np, len - reused, reused_n, t0);
  return r;
}

/* ------------------------------------------------------------------ giving memory back */

/* Carves every whole handle lying inside free block b out of it (BUSY pieces appended to
 * out[], their segments to segs[]), until `want` bytes are collected or out[] is full; exact:
 * only handles that fit in what is still wanted. Leftover free pieces go back to the bins
 * without merging: b was maximal, so its pieces have no free neighbours. Returns the bytes
 * collected. Lock held. */
static size_t carve_idle_handles(vs_pool_t *p, vs_block_t *b, size_t want, bool exact, vs_block_t **out,
                                 vs_seg_t *segs, int *n, int max) {
  size_t got = 0;
  vs_segs_t *t = &p->segs;
  size_t i = _vs_segs_lower_bound(t, b->addr);
  if (i == t->n || t->v[i].va + t->v[i].size > b->addr + b->size) return 0;
  _vs_bin_remove(p, b);
  vs_block_t *rest = b; /* the part of b not yet looked at */
  while (i < t->n && *n < max && got < want) {
    vs_seg_t sg = t->v[i];
    if (sg.va + sg.size > rest->addr + rest->size) break;
    if (exact && sg.size > want - got) { /* stays mapped, in the free piece before the next one */
      i++;
      continue;
    }
    vs_block_t *mid = rest;
    if (sg.va > rest->addr) {
      mid = _vs_block_split(p, rest, (size_t)(sg.va - rest->addr));
      if (!mid) break;
      _vs_bin_insert(p, rest);
    }
    rest = NULL;
    if (mid->size > sg.size) {
      rest = _vs_block_split(p, mid, sg.size);
      if (!rest) {
        _vs_bin_insert(p, mid);
        mid = NULL;
        break;
      }
    }
    mid->state = B_BUSY;
    _vs_segs_remove_at(t, i); /* the next segment now sits at index i */
    p->mapped -= sg.size;
    heap_of(p, mid)->mapped -= sg.size;
    segs[*n] = sg;
    out[(*n)++] = mid;
    got += sg.size;
    if (!rest) break;
  }
  if (rest) _vs_bin_insert(p, rest);
  return got;
}

size_t _vs_pool_whole_handles_in(const vs_pool_t *p, const vs_block_t *b) {
  return _vs_segs_whole_in(&p->segs, b->addr, b->size);
}

/* ------------------------------------------------------------------ blocks freed in stream order */

/* Whether FREE memory may still be in use by work queued before a free in stream order
 * (VS_FREE_KIND_ORDERED: all work on one stream, order.c), so that unmapping it must wait for a
 * synchronisation. Once the order has ended, the wait that ended it covered them. Lock held. */
bool _vs_pool_ordered_unsettled(const vs_pool_t *p) {
  return p->ordered_need > p->sync_done && _vs_order_view().state != VS_ORDER_OFF;
}

/* Synchronises the pool's context when blocks freed in stream order may still be in use (a
 * plain sync: reclaim.c's bookkeeping of pending blocks is not needed for them). */
CUresult _vs_pool_settle_ordered(vs_pool_t *p) {
  pool_lock(p);
  bool unsettled = _vs_pool_ordered_unsettled(p);
  uint64_t seq = unsettled ? ++p->sync_seq : 0;
  pool_unlock(p);
  if (!unsettled) return CUDA_SUCCESS;
  if (atomic_load(&_vs_captures_active)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  CUcontext popped;
  bool pushed = _vs_cu.cuCtxPushCurrent(p->ctx) == CUDA_SUCCESS;
  CUresult r = _vs_cu.cuCtxSynchronize();
  if (pushed) _vs_cu.cuCtxPopCurrent(&popped);
  VS_STAT_ADD(syncs, 1);
  if (r == CUDA_SUCCESS) {
    pool_lock(p);
    if (seq > p->sync_done) p->sync_done = seq;
    pool_unlock(p);
  }
  return r;
}

/* Unmaps whole idle handles until at most `keep` idle bytes remain (exact: never fewer): into
 * sp while it has room (sp may be NULL), else released. Returns the bytes unmapped. Lock not
 * held. */
static size_t unmap_idle(vs_pool_t *p, size_t keep, bool exact, vs_spares_t *sp, int max_pieces) {
  enum { MAX_BATCH = 64, MAX_CAND = 64, MAX_SETTLE = 3 };
  size_t released = 0;
  int settled = 0, taken = 0;
  for (;;) {
    vs_seg_t victims[MAX_BATCH];
    vs_block_t *busy[MAX_BATCH];
    vs_block_t *cand[MAX_CAND];
    int n = 0, nc = 0;
    pool_lock(p);
    if (p->applying_access) { /* the mappings are being given new access: not now */
      pool_unlock(p);
      break;
    }
    if (_vs_pool_ordered_unsettled(p)) {
      /* Blocks freed in stream order may still be in use by work queued before their free:
       * wait for it first (a free in the meantime asks again; a few times at most). */
      pool_unlock(p);
      if (settled++ == MAX_SETTLE || _vs_pool_settle_ordered(p) != CUDA_SUCCESS) break;
      continue;
    }
    /* Candidates: free blocks at least one minimum handle large, biggest bins first. */
    unsigned lowest = _vs_bin_of(p->caps.min_granularity);
    for (int heap_id = 0; heap_id < VS_NHEAPS; heap_id++)
      for (unsigned k = VS_NBINS; k-- > lowest && nc < MAX_CAND;)
        for (vs_block_t *c = p->heaps[heap_id].bins[k]; c && nc < MAX_CAND; c = c->fnext) cand[nc++] = c;
    int batch = max_pieces - taken < MAX_BATCH ? max_pieces - taken : MAX_BATCH;
    for (int c = 0; c < nc && n < batch && p->free_bytes > keep; c++)
      carve_idle_handles(p, cand[c], p->free_bytes - keep, exact, busy, victims, &n, batch);
    pool_unlock(p);
    if (!n) break;
    taken += n;
    bool stuck[MAX_BATCH];
    size_t bytes = _vs_handles_unmap_idle(&p->caps, victims, n, sp, stuck);
    _vs_mapped_return((int)p->caps.device, bytes);
    VS_STAT_SUB(bytes_mapped, bytes);
    released += bytes;
    int first = -1;
    bool say = false;
    pool_lock(p);
    for (int i = 0; i < n; i++) {
      if (!stuck[i]) {
        _vs_block_make_hole(p, busy[i]);
      } else {
        keep_stuck_seg(p, heap_id_of(p, busy[i]), &victims[i]); /* busy[i] is exactly that segment */
        if (first < 0) first = i;
      }
    }
    if (first >= 0) say = first_stuck(p);
    VS_POOL_CHECK(p);
    pool_unlock(p);
    if (say) say_stuck(p, &victims[first], "while giving idle memory back");
    if (first >= 0) break; /* the driver refuses: try no more now */
    if (taken >= max_pieces) break;
  }
  return released;
}

size_t _vs_pool_trim(vs_pool_t *p, size_t keep) { return unmap_idle(p, keep, false, NULL, INT_MAX); }
size_t _vs_pool_trim_exact(vs_pool_t *p, size_t keep) { return unmap_idle(p, keep, true, NULL, INT_MAX); }

void _vs_pool_unmap_all(vs_pool_t *p) {
  bool keep_resv[VS_MAX_RESV] = {false}; /* holds a range that stays mapped: cannot be freed */
  size_t stuck_bytes = 0, stuck_n = 0;
  for (size_t i = 0; i < p->segs.n; i++) {
    vs_seg_t sg = p->segs.v[i];
    if (_vs_handles_unmap(&p->caps, &sg, 1)) {
      int k = resv_of(p, sg.va);
      if (k >= 0) keep_resv[k] = true;
      stuck_bytes += sg.size;
      stuck_n++;
      continue; /* still mapped: still counted */
    }
    _vs_mapped_return((int)p->caps.device, sg.size);
    VS_STAT_SUB(bytes_mapped, sg.size);
  }
  p->segs.n = 0;
  for (int i = 0; i < p->n_resv; i++)
    if (!keep_resv[i]) _vs_vmm_address_free(&p->caps, p->resv[i].va, p->resv[i].size);
  if (stuck_n)
    _vs_warn("device %d: %zu handles (%zu bytes) could not be unmapped as the pool went away: they, and the address "
             "space around them, stay with the process",
             (int)p->caps.device, stuck_n, stuck_bytes);
}

void _vs_pool_free_blocks(vs_pool_t *p) {
  for (int i = 0; i < p->n_resv; i++) {
    vs_assert(p->resv[i].first && p->resv[i].first->addr == p->resv[i].va);
    for (vs_block_t *b = p->resv[i].first, *next; b; b = next) {
      next = b->next;
      free(b);
    }
  }
  p->n_resv = 0;
  for (vs_block_t *b = p->spare_blocks, *next; b; b = next) {
    next = b->fnext;
    free(b);
  }
  p->spare_blocks = NULL;
}
