/* handles.c: the physical handles mapped into a pool.
 *
 * Each pool maps handles (cuMemCreate + cuMemMap + one cuMemSetAccess) back to back into its
 * reservations, so its memory is contiguous and a block may span handles; this file maps and
 * unmaps them and keeps the table of which handle is mapped where. Which addresses get memory,
 * and when memory is given back, is the pool's to decide (src/pool/space.c).
 *
 * Why large handles (VMMSHIM_GRANULARITY): cuMemSetAccess alone costs the same per handle
 * whatever its size, and far more than a reuse, so a pool that maps and unmaps in its steady
 * state loses to cudaMalloc (docs/rationale.md has the figures); freed memory stays mapped and
 * is reused without any driver call.
 *
 * Everything here runs on the slow path. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/handles.h"

/* Bytes mapped by every pool together, for VMMSHIM_LIMIT. */
static atomic_size_t vs_mapped_total;

/* The limit in force: VMMSHIM_LIMIT until the program is given another while it runs (vmmshim
 * ctl PID limit); a flag says which, so that every value (2^64-1 too) is stored as given and
 * nothing has to copy the option at start. */
static atomic_uint_least64_t vs_limit;
static atomic_bool vs_limit_set;

uint64_t _vs_limit(void) {
  if (!atomic_load_explicit(&vs_limit_set, memory_order_acquire)) return _vs_option(VS_OPT_LIMIT);
  return atomic_load_explicit(&vs_limit, memory_order_relaxed);
}

uint64_t _vs_set_limit(uint64_t bytes) {
  uint64_t before = _vs_limit();
  atomic_store_explicit(&vs_limit, bytes, memory_order_relaxed);
  atomic_store_explicit(&vs_limit_set, true, memory_order_release);
  return before;
}

size_t _vs_mapped_total(void) { return atomic_load_explicit(&vs_mapped_total, memory_order_relaxed); }

bool _vs_over_limit(size_t add) {
  uint64_t limit = _vs_limit();
  return limit && atomic_load_explicit(&vs_mapped_total, memory_order_relaxed) + add > limit;
}

bool _vs_mapped_admit(int dev, size_t len) {
  uint64_t limit = _vs_limit();
  size_t cur = atomic_load_explicit(&vs_mapped_total, memory_order_relaxed);
  do {
    if (limit && (cur + len < cur || cur + len > limit)) return false;
  } while (!atomic_compare_exchange_weak_explicit(&vs_mapped_total, &cur, cur + len, memory_order_relaxed,
                                                  memory_order_relaxed));
  if (!_vs_group_admit(dev, len)) { /* the budget (group.c) refused: undone */
    atomic_fetch_sub_explicit(&vs_mapped_total, len, memory_order_relaxed);
    return false;
  }
  return true;
}

void _vs_mapped_return(int dev, size_t len) {
  atomic_fetch_sub_explicit(&vs_mapped_total, len, memory_order_relaxed);
  _vs_group_return(dev, len);
}

/* ------------------------------------------------------------------ the segment table */

size_t _vs_segs_lower_bound(const vs_segs_t *t, CUdeviceptr va) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (t->v[mid].va < va) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int seg_add(vs_segs_t *t, vs_seg_t s) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    vs_seg_t *n = realloc(t->v, cap * sizeof *n);
    if (!n) return -1;
    t->v = n;
    t->cap = cap;
  }
  size_t i = _vs_segs_lower_bound(t, s.va);
  memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof *t->v);
  t->v[i] = s;
  t->n++;
  return 0;
}

void _vs_segs_remove_at(vs_segs_t *t, size_t i) {
  memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof *t->v);
  t->n--;
}

int _vs_segs_add(vs_segs_t *t, const vs_seg_t *segs, int n) {
  int added = 0;
  while (added < n && seg_add(t, segs[added]) == 0) added++;
  if (added == n) return 0;
  for (int i = 0; i < added; i++) _vs_segs_remove_at(t, _vs_segs_lower_bound(t, segs[i].va));
  return -1;
}

size_t _vs_segs_whole_in(const vs_segs_t *t, CUdeviceptr addr, size_t size) {
  size_t sum = 0;
  for (size_t i = _vs_segs_lower_bound(t, addr); i < t->n && t->v[i].va + t->v[i].size <= addr + size; i++)
    sum += t->v[i].size;
  return sum;
}

int _vs_segs_covering(const vs_segs_t *t, CUdeviceptr ptr, CUdeviceptr end, size_t *offset_out,
                      CUmemGenericAllocationHandle *handles, size_t *sizes, int max, int *n_out) {
  *n_out = 0;
  *offset_out = 0;
  /* The segment holding the first byte, then those after it up to the end. */
  size_t i = _vs_segs_lower_bound(t, ptr + 1);
  if (i > 0) i--;
  if (i >= t->n || t->v[i].va > ptr || t->v[i].va + t->v[i].size <= ptr) return -1;
  *offset_out = (size_t)(ptr - t->v[i].va);
  int n = 0;
  for (; i < t->n && t->v[i].va < end; i++) {
    if (n == max || (n && t->v[i].va != t->v[i - 1].va + t->v[i - 1].size))
      return -1; /* too many pieces, or a gap: cannot be shared as one range */
    handles[n] = t->v[i].handle;
    sizes[n++] = t->v[i].size;
  }
  *n_out = n;
  return 0;
}

vs_seg_t *_vs_segs_copy(const vs_segs_t *t, size_t *n_out) {
  *n_out = 0;
  vs_seg_t *copy = t->n ? malloc(t->n * sizeof *copy) : NULL;
  if (!copy) return NULL;
  memcpy(copy, t->v, t->n * sizeof *copy);
  *n_out = t->n;
  return copy;
}

void _vs_segs_clear(vs_segs_t *t) {
  free(t->v);
  t->v = NULL;
  t->n = t->cap = 0;
}

/* ------------------------------------------------------------------ mapping */

/* The largest spare handle of at most `room` bytes, taken off the list; size 0 when none. */
static vs_seg_t take_spare(vs_spares_t *sp, size_t room) {
  int best = -1;
  for (int i = 0; sp && i < sp->n; i++)
    if (sp->seg[i].size <= room && (best < 0 || sp->seg[i].size > sp->seg[best].size)) best = i;
  if (best < 0) return (vs_seg_t){0, 0, 0};
  vs_seg_t s = sp->seg[best];
  sp->seg[best] = sp->seg[--sp->n];
  return s;
}

int _vs_handles_unmap(const vs_device_caps_t *caps, vs_seg_t *segs, int n) {
  int stuck = 0;
  for (int i = n; i-- > 0;) {
    if (_vs_vmm_unmap(caps, segs[i].va, segs[i].size) != CUDA_SUCCESS) {
      /* Still mapped: its handle stays with it. Gathered at the top, where segments were done. */
      segs[n - 1 - stuck++] = segs[i];
      continue;
    }
    _vs_vmm_release(caps, segs[i].handle, segs[i].size);
  }
  memmove(segs, segs + n - stuck, (size_t)stuck * sizeof *segs);
  return stuck;
}

/* A spare handle: one cuMemMap instead of cuMemCreate + cuMemMap, and the cuMemUnmap +
 * cuMemRelease its release would have cost. */
CUresult _vs_handles_map(const vs_device_caps_t *caps, CUdeviceptr va, size_t len, size_t chunk, uint64_t rw,
                         uint64_t ro, vs_spares_t *sp, vs_seg_t *segs_out, int max, int *n_out) {
  CUresult r = CUDA_SUCCESS;
  int n = 0;
  size_t off = 0;
  while (off < len) {
    size_t piece = len - off;
    vs_seg_t spare = n < max - 1 ? take_spare(sp, piece) : (vs_seg_t){0, 0, 0};
    if (spare.size) {
      r = _vs_vmm_map(caps, va + off, spare.size, spare.handle);
      if (r != CUDA_SUCCESS) {
        _vs_vmm_release(caps, spare.handle, spare.size);
        break;
      }
      segs_out[n++] = (vs_seg_t){va + off, spare.size, spare.handle};
      off += spare.size;
      continue;
    }
    if (piece > chunk && n < max - 1) piece = chunk;
    CUmemGenericAllocationHandle h = 0;
    r = _vs_vmm_create(caps, piece, &h);
    if (r != CUDA_SUCCESS) break;
    r = _vs_vmm_map(caps, va + off, piece, h);
    if (r != CUDA_SUCCESS) {
      _vs_vmm_release(caps, h, piece);
      break;
    }
    segs_out[n++] = (vs_seg_t){va + off, piece, h};
    off += piece;
  }
  /* One access call over the whole range: its cost follows the handles, not the calls. */
  if (r == CUDA_SUCCESS) r = _vs_vmm_set_access_devices(caps, va, len, rw, ro, 0);
  if (r != CUDA_SUCCESS) n = _vs_handles_unmap(caps, segs_out, n);
  *n_out = n;
  return r;
}

size_t _vs_handles_unmap_idle(const vs_device_caps_t *caps, const vs_seg_t *segs, int n, vs_spares_t *sp,
                              bool *stuck) {
  size_t bytes = 0;
  for (int i = 0; i < n; i++) {
    stuck[i] = _vs_vmm_unmap(caps, segs[i].va, segs[i].size) != CUDA_SUCCESS;
    if (stuck[i]) continue; /* still mapped: its handle stays with it */
    if (sp && sp->n < VS_GROW_PIECES) {
      sp->seg[sp->n++] = segs[i];
    } else if (_vs_vmm_release(caps, segs[i].handle, segs[i].size) == CUDA_SUCCESS) {
      VS_STAT_ADD(trims, 1);
    }
    bytes += segs[i].size;
  }
  return bytes;
}

void _vs_handles_release_spares(const vs_device_caps_t *caps, vs_spares_t *sp) {
  for (int i = 0; i < sp->n; i++)
    if (_vs_vmm_release(caps, sp->seg[i].handle, sp->seg[i].size) == CUDA_SUCCESS) VS_STAT_ADD(trims, 1);
  sp->n = 0;
}

void _vs_handles_set_access(const vs_device_caps_t *caps, const vs_seg_t *segs, size_t n, uint64_t rw, uint64_t ro,
                            uint64_t none) {
  for (size_t i = 0; i < n; i++) _vs_vmm_set_access_devices(caps, segs[i].va, segs[i].size, rw, ro, none);
}

/* ------------------------------------------------------------------ access changes vs growths */

/* The one lock of the shim held across driver calls: an access change holds it across the
 * cuMemSetAccess calls that apply it to every mapping of a context's pools, and a growth that an
 * access change overtook holds it across its own cuMemSetAccess (and the undo of its mappings when
 * that fails), so that the two never interleave and no mapping keeps stale access. Dropping it
 * around those calls would let two changes apply out of order. It is safe there: only rare paths
 * take it (access changes, and a growth while it records its mappings), never an allocation or a
 * free that the pool serves without growing; it is taken before any other lock of the shim and
 * never with a pool's, a context slot's or IPC's held (its rank, VS_RANK_ACCESS, is below every
 * counted lock's: checked in debug builds), so whoever holds it waits for no thread that waits
 * for it. As an outer lock it is not in the count vmm.c's check reads (lock.h). */
static vs_lock_t vs_access_mutex = VS_LOCK_INITIALIZER(VS_RANK_ACCESS, "access");

void _vs_access_lock(void) { _vs_lock_take(&vs_access_mutex); }
void _vs_access_unlock(void) { _vs_lock_release(&vs_access_mutex); }
