/* handles.c: a pool's reservations and the physical handles mapped into them.
 *
 * Each heap reserves virtual ranges (cuMemAddressReserve) and maps handles (cuMemCreate +
 * cuMemMap + one cuMemSetAccess) into them back to back, so the memory is contiguous and a
 * block may span handles. Unmapped ranges are HOLE blocks. Growth maps what a request needs
 * right after a free block that ends at a hole (so the two join), else into the lowest hole
 * that fits; before it maps, it gives back idle handles (policy.h says which to keep), so
 * physical memory follows what is live, not the history of the address space. With handles
 * bounded (VMMSHIM_MAX_HANDLE), the handles given back are mapped again into the new range
 * where they fit, instead of being released and new ones created.
 *
 * Why large handles (VMMSHIM_GRANULARITY): cuMemSetAccess alone costs ~28 us per handle on
 * an H100 whatever its size, so a pool that maps and unmaps in its steady state loses to
 * cudaMalloc; freed memory stays mapped and is reused without any driver call.
 *
 * Everything here runs on the slow path. The pool lock is taken to edit the block lists
 * and dropped around every driver call: the blocks being mapped or unmapped are BUSY. */
#include <stdlib.h>

#include "vmmshim/pool.h"

/* Bytes mapped by every pool together, for VMMSHIM_LIMIT. */
static atomic_size_t vs_mapped_total;

size_t _vs_mapped_total(void) { return atomic_load_explicit(&vs_mapped_total, memory_order_relaxed); }

bool _vs_over_limit(size_t add) {
  uint64_t limit = _vs_option(VS_OPT_LIMIT);
  return limit && atomic_load_explicit(&vs_mapped_total, memory_order_relaxed) + add > limit;
}

/* ------------------------------------------------------------------ segments (one per handle) */

static size_t seg_lower_bound(const vs_pool_t *p, CUdeviceptr va) {
  size_t lo = 0, hi = p->n_segs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->segs[mid].va < va) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int seg_add(vs_pool_t *p, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
  if (p->n_segs == p->cap_segs) {
    size_t cap = p->cap_segs ? p->cap_segs * 2 : 64;
    vs_seg_t *n = realloc(p->segs, cap * sizeof *n);
    if (!n) return -1;
    p->segs = n;
    p->cap_segs = cap;
  }
  size_t i = seg_lower_bound(p, va);
  memmove(&p->segs[i + 1], &p->segs[i], (p->n_segs - i) * sizeof *p->segs);
  p->segs[i] = (vs_seg_t){va, size, h};
  p->n_segs++;
  return 0;
}

static void seg_remove_at(vs_pool_t *p, size_t i) {
  memmove(&p->segs[i], &p->segs[i + 1], (p->n_segs - i - 1) * sizeof *p->segs);
  p->n_segs--;
}

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
  if (b && b != &p->map_anchor && b->state == B_USED) {
    /* The segment holding the block's first byte, then those after it up to its end. */
    size_t i = seg_lower_bound(p, ptr + 1);
    if (i > 0) i--;
    CUdeviceptr end = b->addr + b->size;
    int n = 0;
    st = VS_POOL_OK;
    if (i >= p->n_segs || p->segs[i].va > ptr || p->segs[i].va + p->segs[i].size <= ptr) st = VS_POOL_NOT_OWNED;
    else *offset_out = (size_t)(ptr - p->segs[i].va);
    for (; st == VS_POOL_OK && i < p->n_segs && p->segs[i].va < end; i++) {
      if (n == max || (n && p->segs[i].va != p->segs[i - 1].va + p->segs[i - 1].size)) {
        st = VS_POOL_NOT_OWNED; /* too many pieces, or a gap: cannot be shared as one range */
        break;
      }
      handles[n] = p->segs[i].handle;
      sizes[n++] = p->segs[i].size;
    }
    if (st == VS_POOL_OK) *n_out = n;
  }
  pool_unlock(p);
  return st;
}

const vs_device_caps_t *_vs_pool_caps(const vs_pool_t *p) { return &p->caps; }

/* ------------------------------------------------------------------ access */

/* Access for a new mapping: the owner and the peers peer.c names now. */
static CUresult set_access_now(vs_pool_t *p, CUdeviceptr va, size_t len) {
  uint64_t rw = p->access ? atomic_load(&p->access->rw) : 0, ro = p->access ? atomic_load(&p->access->ro) : 0;
  return _vs_vmm_set_access_devices(&p->caps, va, len, rw, ro, 0);
}

static unsigned access_gen(const vs_pool_t *p) { return p->access ? atomic_load(&p->access->gen) : 0; }

void _vs_pool_set_access(vs_pool_t *p, uint64_t rw, uint64_t ro, uint64_t none) {
  pool_lock(p);
  p->applying_access++;
  size_t n = p->n_segs;
  vs_seg_t *copy = n ? malloc(n * sizeof *copy) : NULL;
  if (copy) memcpy(copy, p->segs, n * sizeof *copy);
  pool_unlock(p);
  if (n && !copy) _vs_warn("device %d: no host memory to change the pool's access; it stays as it was", (int)p->caps.device);
  for (size_t i = 0; copy && i < n; i++) _vs_vmm_set_access_devices(&p->caps, copy[i].va, copy[i].size, rw, ro, none);
  free(copy);
  pool_lock(p);
  p->applying_access--;
  pool_unlock(p);
}

/* ------------------------------------------------------------------ growth */

#define VS_GROW_PIECES 256 /* handles one growth maps at most, and spares it keeps */

/* Idle handles a growth unmapped to map them again at its own address (release_before_growth). */
typedef struct vs_spares_s {
  vs_seg_t seg[VS_GROW_PIECES];
  int n;
} vs_spares_t;

/* The largest spare handle of at most `room` bytes, taken off the list; size 0 when none. */
static vs_seg_t take_spare(vs_spares_t *sp, size_t room) {
  int best = -1;
  for (int i = 0; i < sp->n; i++)
    if (sp->seg[i].size <= room && (best < 0 || sp->seg[i].size > sp->seg[best].size)) best = i;
  if (best < 0) return (vs_seg_t){0, 0, 0};
  vs_seg_t s = sp->seg[best];
  sp->seg[best] = sp->seg[--sp->n];
  return s;
}

/* Unmaps and releases the handles a growth mapped (segs, n of them), the last first. */
static void unmap_pieces(vs_pool_t *p, const vs_seg_t *segs, int n) {
  for (int i = n; i-- > 0;) {
    _vs_vmm_unmap(&p->caps, segs[i].va, segs[i].size);
    _vs_vmm_release(&p->caps, segs[i].handle, segs[i].size);
  }
}

/* Maps [va, va+len) back to back: first with spare handles that fit (a cuMemMap each instead
 * of cuMemCreate + cuMemMap, and the cuMemUnmap + cuMemRelease their release would have cost),
 * then with new handles of at most `chunk` bytes each; and sets access over the whole range
 * with one call (its cost follows the handles, not the calls). Lock not held; the segments are
 * returned in segs_out (at most max) for the caller to record. On failure every handle mapped
 * here, spares included, is unmapped and released. */
static CUresult map_range(vs_pool_t *p, CUdeviceptr va, size_t len, size_t chunk, vs_spares_t *sp,
                          vs_seg_t *segs_out, int max, int *n_out) {
  CUresult r = CUDA_SUCCESS;
  int n = 0;
  size_t off = 0;
  while (off < len) {
    size_t piece = len - off;
    vs_seg_t spare = n < max - 1 ? take_spare(sp, piece) : (vs_seg_t){0, 0, 0};
    if (spare.size) {
      r = _vs_vmm_map(&p->caps, va + off, spare.size, spare.handle);
      if (r != CUDA_SUCCESS) {
        _vs_vmm_release(&p->caps, spare.handle, spare.size);
        break;
      }
      segs_out[n++] = (vs_seg_t){va + off, spare.size, spare.handle};
      off += spare.size;
      continue;
    }
    if (piece > chunk && n < max - 1) piece = chunk;
    CUmemGenericAllocationHandle h = 0;
    r = _vs_vmm_create(&p->caps, piece, &h);
    if (r != CUDA_SUCCESS) break;
    r = _vs_vmm_map(&p->caps, va + off, piece, h);
    if (r != CUDA_SUCCESS) {
      _vs_vmm_release(&p->caps, h, piece);
      break;
    }
    segs_out[n++] = (vs_seg_t){va + off, piece, h};
    off += piece;
  }
  if (r == CUDA_SUCCESS) r = set_access_now(p, va, len);
  if (r != CUDA_SUCCESS) {
    unmap_pieces(p, segs_out, n);
    n = 0;
  }
  *n_out = n;
  return r;
}

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

static size_t unmap_idle(vs_pool_t *p, size_t keep, vs_spares_t *sp);

/* Before a growth of `want` bytes, the idle handles beyond what policy.h keeps are unmapped:
 * into sp (at most its capacity), for the growth to map again at its own address, the rest
 * released. */
static void release_before_growth(vs_pool_t *p, size_t want, vs_spares_t *sp) {
  pool_lock(p);
  size_t idle = p->free_bytes, mapped = p->mapped;
  pool_unlock(p);
  size_t keep = vs_policy_keep_idle(idle, want, mapped, p->gran);
  if (idle > keep && idle >= p->caps.min_granularity) unmap_idle(p, keep, sp);
}

/* Releases the spare handles a growth did not map again (unmapped, out of the accounts). */
static void release_spares(vs_pool_t *p, vs_spares_t *sp) {
  for (int i = 0; i < sp->n; i++) {
    _vs_vmm_release(&p->caps, sp->seg[i].handle, sp->seg[i].size);
    VS_STAT_ADD(trims, 1);
  }
  sp->n = 0;
}

/* A BUSY block where `size` bytes at `align` can be mapped (its length in *len_out): from a
 * hole, or from a new reservation when no hole is large enough. NULL: no address space. */
static vs_block_t *claim_space(vs_pool_t *p, int heap_id, size_t size, size_t align, size_t handle,
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

CUresult _vs_pool_grow(vs_pool_t *p, int heap_id, size_t size, size_t align, bool exact) {
  vs_heap_t *heap = &p->heaps[heap_id];
  pool_lock(p);
  size_t handle = vs_policy_grow_step(heap->mapped, p->gran, p->caps.min_granularity, exact);
  pool_unlock(p);
  /* With VMMSHIM_MAX_HANDLE set, the idle handles given back are mapped again here when they
   * fit (H100, 5 workload seeds: 10-50% fewer VMM calls). Without it a growth stays one handle
   * of its own size: mapping spares there makes a growth several handles and the pool more of
   * them (churn, sync: 0.46 -> 1.20 calls per 100 allocations). */
  vs_spares_t spares;
  spares.n = 0;
  release_before_growth(p, round_up(size, handle), p->chunk < SIZE_MAX / 2 ? &spares : NULL);
  size_t len = 0;
  vs_block_t *b = claim_space(p, heap_id, size, align, handle, &len);
  if (!b) {
    release_spares(p, &spares);
    _vs_warn("device %d: no address space for %zu bytes", (int)p->caps.device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }

  vs_seg_t pieces[VS_GROW_PIECES];
  int np = 0;
  size_t chunk = p->chunk;
  if (len / chunk >= VS_GROW_PIECES) chunk = round_up(len / (VS_GROW_PIECES - 1), p->caps.min_granularity);
  CUresult r;
  unsigned gen = access_gen(p);
  if (_vs_over_limit(len)) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    atomic_fetch_add(&vs_mapped_total, len);
    r = map_range(p, b->addr, len, chunk, &spares, pieces, VS_GROW_PIECES, &np);
    if (r != CUDA_SUCCESS) atomic_fetch_sub(&vs_mapped_total, len);
  }
  release_spares(p, &spares);

  /* The new mappings become visible to peer.c's changes under its lock: one made since the
   * access above was set is applied here first (the block is still BUSY, so nothing unmaps it). */
  bool peers = p->access && r == CUDA_SUCCESS;
  if (peers) {
    _vs_peer_growth_begin();
    if (access_gen(p) != gen) {
      uint64_t rw = atomic_load(&p->access->rw), ro = atomic_load(&p->access->ro);
      r = _vs_vmm_set_access_devices(&p->caps, b->addr, len, rw, ro, atomic_load(&p->access->ever) & ~(rw | ro));
      if (r != CUDA_SUCCESS) {
        unmap_pieces(p, pieces, np);
        atomic_fetch_sub(&vs_mapped_total, len);
        np = 0;
      }
    }
  }
  pool_lock(p);
  int added = 0;
  while (r == CUDA_SUCCESS && added < np && seg_add(p, pieces[added].va, pieces[added].size, pieces[added].handle) == 0)
    added++;
  if (r == CUDA_SUCCESS && added < np) {
    /* No host memory for the segment table: undo the whole growth. */
    for (int i = 0; i < added; i++) seg_remove_at(p, seg_lower_bound(p, pieces[i].va));
    pool_unlock(p);
    unmap_pieces(p, pieces, np);
    atomic_fetch_sub(&vs_mapped_total, len);
    pool_lock(p);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    p->mapped += len;
    heap->mapped += len;
    _vs_block_make_free(p, b);
  } else {
    _vs_block_make_hole(p, b);
  }
  VS_POOL_CHECK(p);
  pool_unlock(p);
  if (peers) _vs_peer_growth_end();
  if (r == CUDA_SUCCESS) {
    uint64_t m = VS_STAT_ADD(bytes_mapped, len) + len;
    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);
  }
  return r;
}

/* ------------------------------------------------------------------ giving memory back */

/* Carves every whole handle lying inside free block b out of it (BUSY pieces appended to
 * out[], their segments to segs[]), until `want` bytes are collected or out[] is full.
 * Leftover free pieces go back to the bins without merging: b was maximal, so its pieces
 * have no free neighbours. Returns the bytes collected. Lock held. */
static size_t carve_idle_handles(vs_pool_t *p, vs_block_t *b, size_t want, vs_block_t **out, vs_seg_t *segs,
                                 int *n, int max) {
  size_t got = 0;
  size_t i = seg_lower_bound(p, b->addr);
  if (i == p->n_segs || p->segs[i].va + p->segs[i].size > b->addr + b->size) return 0;
  _vs_bin_remove(p, b);
  vs_block_t *rest = b; /* the part of b not yet looked at */
  while (i < p->n_segs && *n < max && got < want) {
    vs_seg_t sg = p->segs[i];
    if (sg.va + sg.size > rest->addr + rest->size) break;
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
    seg_remove_at(p, i); /* the next segment now sits at index i */
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
  size_t sum = 0;
  for (size_t i = seg_lower_bound(p, b->addr); i < p->n_segs && p->segs[i].va + p->segs[i].size <= b->addr + b->size; i++)
    sum += p->segs[i].size;
  return sum;
}

/* Unmaps whole idle handles until at most `keep` idle bytes remain: into sp while it has room
 * (sp may be NULL), else released. Returns the bytes unmapped. Lock not held. */
static size_t unmap_idle(vs_pool_t *p, size_t keep, vs_spares_t *sp) {
  enum { MAX_BATCH = 64, MAX_CAND = 64 };
  size_t released = 0;
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
    /* Candidates: free blocks at least one minimum handle large, biggest bins first. */
    unsigned lowest = _vs_bin_of(p->caps.min_granularity);
    for (int heap_id = 0; heap_id < VS_NHEAPS; heap_id++)
      for (unsigned k = VS_NBINS; k-- > lowest && nc < MAX_CAND;)
        for (vs_block_t *c = p->heaps[heap_id].bins[k]; c && nc < MAX_CAND; c = c->fnext) cand[nc++] = c;
    for (int c = 0; c < nc && n < MAX_BATCH && p->free_bytes > keep; c++)
      carve_idle_handles(p, cand[c], p->free_bytes - keep, busy, victims, &n, MAX_BATCH);
    pool_unlock(p);
    if (!n) break;
    for (int i = 0; i < n; i++) {
      _vs_vmm_unmap(&p->caps, victims[i].va, victims[i].size);
      if (sp && sp->n < VS_GROW_PIECES) {
        sp->seg[sp->n++] = victims[i];
      } else {
        _vs_vmm_release(&p->caps, victims[i].handle, victims[i].size);
        VS_STAT_ADD(trims, 1);
      }
      atomic_fetch_sub(&vs_mapped_total, victims[i].size);
      VS_STAT_SUB(bytes_mapped, victims[i].size);
      released += victims[i].size;
    }
    pool_lock(p);
    for (int i = 0; i < n; i++) _vs_block_make_hole(p, busy[i]);
    VS_POOL_CHECK(p);
    pool_unlock(p);
  }
  return released;
}

size_t _vs_pool_trim(vs_pool_t *p, size_t keep) { return unmap_idle(p, keep, NULL); }

void _vs_pool_unmap_all(vs_pool_t *p) {
  for (size_t i = 0; i < p->n_segs; i++) {
    _vs_vmm_unmap(&p->caps, p->segs[i].va, p->segs[i].size);
    _vs_vmm_release(&p->caps, p->segs[i].handle, p->segs[i].size);
    atomic_fetch_sub(&vs_mapped_total, p->segs[i].size);
    VS_STAT_SUB(bytes_mapped, p->segs[i].size);
  }
  p->n_segs = 0;
  for (int i = 0; i < p->n_resv; i++) _vs_vmm_address_free(&p->caps, p->resv[i].va, p->resv[i].size);
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
