/* wake.c: a pool's memory that left the device comes back at the same addresses.
 *
 * Waking makes a device handle for every run of neighbouring asleep segments (up to
 * VMMSHIM_WAKE_MERGE) before it changes anything: when the device has no room, nothing moved
 * and the pool stays asleep with its bytes. Then each handle is mapped at its run's address with
 * the access the pool's owner and peers have now, and the bytes come back per mode (discard:
 * zeros when asked, else undefined); a run whose mapping or copies fail stays asleep with its
 * bytes. A promote is the same walk over the growths past the limit served from host memory
 * (asleep.c): it takes those that fit and leaves the others on the host.
 *
 * The caller has made the pool's context current and waited for the GPU work that may touch the
 * pool (alloc layer). Copies run on two streams of the shim's own (copier.c). The pool lock is
 * never held across a driver call: the segments being woken are in neither list. */
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

/* A wake of a mapped segment failed after its host buffers left its address: they go back
 * there, so the program runs on them as before; failing that, its bytes are kept on the host
 * (touching the address then faults, as in host mode) and the log says so. */
static void serve_from_host_again(vs_pool_t *p, vs_asleep_seg_t *s) {
  if (s->mode != VMMSHIM_SLEEP_MAPPED || _vs_asleep_map_bufs(p, s) == CUDA_SUCCESS) return;
  _vs_warn("device %d: host memory could not be mapped back at 0x%llx after a failed wake; its bytes are kept on the host",
           (int)p->caps.device, (unsigned long long)s->va);
  s->mode = VMMSHIM_SLEEP_HOST;
}

/* Segments woken by one device handle: neighbours in one reservation, of one mode. */
typedef struct vs_run_s {
  size_t first, count; /* a[first .. first + count) */
  size_t size;
} vs_run_t;

static int by_va(const void *x, const void *y) {
  CUdeviceptr a = ((const vs_asleep_seg_t *)x)->va, b = ((const vs_asleep_seg_t *)y)->va;
  return a < b ? -1 : a > b;
}

/* Sorts a[] by address and cuts it into runs of at most `merge` bytes (VMMSHIM_WAKE_MERGE, no
 * more than the largest handle): a handle's creation, mapping and access cost about as much at
 * 1 GiB as at 64 MiB, so a wake of many segments costs a handful of driver calls, not a few
 * hundred, and so does the next sleep's release. A segment larger than `merge` is a run alone.
 * Returns the count of runs. */
static size_t wake_runs(vs_pool_t *p, vs_asleep_seg_t *a, size_t n, size_t merge, vs_run_t *run) {
  if (merge > p->chunk) merge = p->chunk;
  qsort(a, n, sizeof *a, by_va);
  size_t nr = 0;
  pool_lock(p);
  for (size_t i = 0; i < n; i++) {
    vs_run_t *u = nr ? &run[nr - 1] : NULL;
    const vs_asleep_seg_t *last = u ? &a[u->first + u->count - 1] : NULL;
    if (last && last->va + last->size == a[i].va && last->mode == a[i].mode && u->size + a[i].size <= merge &&
        resv_of(p, a[i].va) == resv_of(p, last->va)) {
      u->count++;
      u->size += a[i].size;
    } else {
      run[nr++] = (vs_run_t){i, 1, a[i].size};
    }
  }
  pool_unlock(p);
  return nr;
}

/* Wakes the asleep segments of one kind: those asleep (spilled false), or the growths served
 * from host memory past the limit (spilled true, a promote). A wake is all or nothing: when one
 * device handle cannot be had, nothing moves. A promote takes the segments that fit under the
 * limit and leaves the others on the host (counted as skipped). */
static CUresult wake_segments(vs_pool_t *p, bool zero, bool spilled, vs_move_t *out) {
  *out = (vs_move_t){0};
  int dev = (int)p->caps.device;
  pool_lock(p);
  size_t total = p->asleep.n, n = 0, k = 0;
  vs_asleep_seg_t *a = total ? malloc(total * sizeof *a) : NULL;
  if (total && !a) {
    pool_unlock(p);
    move_note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* The segments to wake leave the list (nothing else moves them meanwhile); the others stay. */
  for (size_t i = 0; i < total; i++) {
    vs_asleep_seg_t s = p->asleep.v[i];
    if (s.spilled == spilled) {
      a[n++] = s;
      _vs_asleep_count(&p->asleep, &s, false);
    } else {
      p->asleep.v[k++] = s;
    }
  }
  p->asleep.n = k;
  pool_unlock(p);
  if (!n) {
    free(a);
    return CUDA_SUCCESS;
  }

  /* Runs of neighbours (wake_runs) each get one device handle, admitted under VMMSHIM_LIMIT and
   * the budget, before anything changes. */
  vs_run_t *run = malloc(n * sizeof *run);
  size_t nr = run ? wake_runs(p, a, n, spilled ? 0 : _vs_option(VS_OPT_WAKE_MERGE), run) : 0;
  CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
  vs_asleep_seg_t *later = spilled ? malloc(n * sizeof *later) : NULL;
  CUresult r = run && h && (!spilled || later) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  size_t ng = 0, nkept = 0, nl = 0; /* runs with a handle; their segments, gathered at the front */
  for (size_t k = 0; k < nr && r == CUDA_SUCCESS; k++) {
    vs_run_t u = run[k];
    CUresult c = _vs_mapped_admit(dev, u.size) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (c == CUDA_SUCCESS) {
      c = _vs_vmm_create(&p->caps, u.size, &h[ng]);
      if (c != CUDA_SUCCESS) _vs_mapped_return(dev, u.size);
    }
    if (c == CUDA_SUCCESS) {
      for (size_t j = 0; j < u.count; j++) a[nkept + j] = a[u.first + j]; /* nkept <= u.first */
      run[ng++] = (vs_run_t){nkept, u.count, u.size};
      nkept += u.count;
    } else if (spilled) {
      for (size_t j = 0; j < u.count; j++) later[nl++] = a[u.first + j]; /* stays on the host */
      out->skipped += u.size;
      if (!out->why_skipped)
        out->why_skipped = c == CUDA_ERROR_OUT_OF_MEMORY ? "no room under the limit (VMMSHIM_LIMIT, the group's) or on the device"
                                                         : "cuMemCreate failed";
    } else {
      r = c;
    }
  }
  if (r != CUDA_SUCCESS || !ng) {
    /* A wake that could not have every handle, or a promote that could have none: nothing moved
     * (a wake stops at its first failure, so a[] is as it was). */
    while (ng-- > 0) {
      _vs_vmm_release(&p->caps, h[ng], run[ng].size);
      _vs_mapped_return(dev, run[ng].size);
    }
    if (r == CUDA_SUCCESS) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (nl) _vs_asleep_put_back(p, later, nl); /* a promote: every one of them went there */
    else _vs_asleep_put_back(p, a, n);
    move_note(out, r, spilled ? "no room under the limit (VMMSHIM_LIMIT, the group's) or on the device"
                 : r == CUDA_ERROR_OUT_OF_MEMORY ? "the device has no room for the sleeping memory (or VMMSHIM_LIMIT)"
                                                 : "cuMemCreate failed");
    free(run), free(h), free(later), free(a);
    return r;
  }
  n = nkept;

  vs_copier_t cp;
  _vs_copier_open(&cp);
  vs_seg_t *woke = malloc(ng * sizeof *woke);
  vs_asleep_seg_t *still = malloc(n * sizeof *still);
  size_t nw = 0, nstill = 0;
  if (!woke || !still) {
    /* No host memory for the shim's records: undo, as for a device without room. */
    for (size_t k = 0; k < ng; k++) {
      _vs_vmm_release(&p->caps, h[k], run[k].size);
      _vs_mapped_return(dev, run[k].size);
    }
    free(run), free(h), free(woke), free(still);
    _vs_copier_close(&cp);
    _vs_asleep_put_back(p, a, n);
    _vs_asleep_put_back(p, later, nl);
    free(a), free(later);
    move_note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* Every run: its device handle is mapped at its address and its segments' bytes queued back,
   * from the host buffers' home mappings (a mapped segment's buffers leave its address first:
   * nothing runs on it now, the caller waited for the GPU and holds launches). One wait for all
   * copies. */
  CUresult *st = calloc(ng, sizeof *st);
  for (size_t k = 0; k < ng && st; k++) {
    vs_run_t u = run[k];
    vs_asleep_seg_t *s = &a[u.first];
    for (size_t j = 0; j < u.count; j++)
      if (s[j].mode == VMMSHIM_SLEEP_MAPPED) _vs_asleep_unmap_bufs(p, &s[j], s[j].nbufs);
    CUresult m = _vs_asleep_map_device(p, s->va, u.size, h[k]);
    for (size_t j = 0; j < u.count; j++) {
      if (m != CUDA_SUCCESS) {
        serve_from_host_again(p, &s[j]);
      } else if (s[j].mode != VMMSHIM_SLEEP_DISCARD) {
        size_t off = 0;
        for (int b = 0; b < s[j].nbufs; off += s[j].bufs[b++].size)
          _vs_copier_copy(&cp, s[j].va + off, s[j].bufs[b].home, s[j].bufs[b].size);
      } else if (zero) {
        _vs_copier_zero(&cp, s[j].va, s[j].size);
      }
    }
    st[k] = m;
  }
  CUresult c = _vs_copier_close(&cp);
  move_note(out, c, "copying back to the device failed");
  /* Copies that did not complete: the runs whose bytes were coming back stay asleep with them
   * (a mapped segment serves from its host buffers again); the device handles go. A run holds
   * segments of one mode. */
  for (size_t k = 0; k < ng && st && c != CUDA_SUCCESS; k++) {
    vs_asleep_seg_t *s = &a[run[k].first];
    if (s->mode == VMMSHIM_SLEEP_DISCARD || st[k] != CUDA_SUCCESS) continue;
    _vs_vmm_unmap(&p->caps, s->va, run[k].size);
    for (size_t j = 0; j < run[k].count; j++) serve_from_host_again(p, &s[j]);
    st[k] = c;
  }
  for (size_t k = 0; k < ng; k++) {
    vs_run_t u = run[k];
    vs_asleep_seg_t *s = &a[u.first];
    CUresult m = st ? st[k] : CUDA_ERROR_OUT_OF_MEMORY;
    if (m != CUDA_SUCCESS) {
      move_note(out, m, spilled ? "mapping device memory in place of host memory failed; it stays on the host"
                           : "mapping device memory at the sleeping address failed; it stays asleep");
      _vs_vmm_release(&p->caps, h[k], u.size);
      _vs_mapped_return(dev, u.size);
      for (size_t j = 0; j < u.count; j++) still[nstill++] = s[j];
      continue;
    }
    woke[nw++] = (vs_seg_t){s->va, u.size, h[k]};
    for (size_t j = 0; j < u.count; j++) {
      if (s[j].mode == VMMSHIM_SLEEP_DISCARD) out->discarded += s[j].size;
      else out->to_host += s[j].size;
      if (s[j].spilled) _vs_group_spill_return(dev, s[j].size);
      _vs_asleep_give_bufs(&p->caps, &s[j]);
      out->restored += s[j].size;
    }
  }
  free(st);
  pool_lock(p);
  if (_vs_segs_add(&p->segs, woke, (int)nw) != 0) {
    /* No host memory for the table: the segments stay mapped and counted, unlisted. */
    _vs_warn("device %d: no host memory to record %zu woken mappings", (int)p->caps.device, nw);
  }
  for (size_t i = 0; i < nw; i++) {
    p->mapped += woke[i].size;
    heap_at(p, woke[i].va)->mapped += woke[i].size;
  }
  bool kept = _vs_asleep_append(p, still, nstill) && _vs_asleep_append(p, later, nl);
  VS_POOL_CHECK(p);
  pool_unlock(p);
  if (!kept) _vs_warn("device %d: no host memory to record the ranges left on the host; their bytes are lost", dev);
  if (out->restored) {
    uint64_t m = VS_STAT_ADD(bytes_mapped, out->restored) + out->restored;
    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);
  }
  free(run), free(h), free(woke), free(still), free(later), free(a);
  return out->err;
}

CUresult _vs_pool_wake(vs_pool_t *p, bool zero, vs_move_t *out) { return wake_segments(p, zero, false, out); }

CUresult _vs_pool_promote(vs_pool_t *p, vs_move_t *out) {
  size_t dropped = _vs_pool_drop_idle_spilled(p);
  CUresult r = wake_segments(p, false, true, out);
  out->dropped += dropped;
  return r;
}
