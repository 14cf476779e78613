/* wake.c: a pool's memory that left the device comes back at the same addresses.
 *
 * Waking makes a device handle for every run of neighbouring asleep segments (up to
 * VMMSHIM_WAKE_MERGE) before it changes anything: when the device has no room, nothing moved
 * and the pool stays asleep with its bytes. Then each handle is mapped at its run's address with
 * the access the pool's owner and peers have now, and the bytes come back per mode (discard:
 * zeros when asked, else undefined); a run whose mapping or copies fail stays asleep with its
 * bytes; disk-mode runs read their bytes from the pool's file (disk.c), and a read that fails
 * leaves its run asleep with the file. A promote is the same walk over the growths past the limit served from host memory
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

/* One wake, as its steps hand it on. */
typedef struct vs_wake_s {
  vs_pool_t *p;
  bool zero, spilled;
  vs_move_t *out;
  vs_asleep_seg_t *a; /* the segments to wake; once the handles are had, those of runs with one */
  size_t n;
  vs_run_t *run; /* runs of a[]: run[0 .. nr); once the handles are had, run[k < ng] has h[k] */
  size_t nr, ng;
  CUmemGenericAllocationHandle *h;
  vs_asleep_seg_t *later; /* a promote: the segments of runs without a handle, left on the host */
  size_t nl;
  CUresult *st;           /* each run with a handle: mapped with its bytes back, or why not */
  vs_seg_t *woke;         /* the runs on the device again: woke[0 .. nw) */
  vs_asleep_seg_t *still; /* the segments of runs that stay asleep: still[0 .. nstill) */
  size_t nw, nstill;
} vs_wake_t;

/* The segments of the wake's kind leave the asleep list for w->a (nothing else moves them
 * meanwhile); the others stay. False without host memory for the copy (nothing moved). */
static bool take_asleep(vs_wake_t *w) {
  vs_pool_t *p = w->p;
  pool_lock(p);
  size_t total = p->asleep.n, k = 0;
  w->a = total ? malloc(total * sizeof *w->a) : NULL;
  if (total && !w->a) {
    pool_unlock(p);
    move_note(w->out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return false;
  }
  for (size_t i = 0; i < total; i++) {
    vs_asleep_seg_t s = p->asleep.v[i];
    if (s.spilled == w->spilled) {
      w->a[w->n++] = s;
      _vs_asleep_count(&p->asleep, &s, false);
    } else {
      p->asleep.v[k++] = s;
    }
  }
  p->asleep.n = k;
  pool_unlock(p);
  return true;
}

/* Runs of neighbours (wake_runs) each get one device handle, admitted under VMMSHIM_LIMIT and the
 * budget, before anything changes. A wake stops at the first run that cannot have one (its
 * error returned); a promote leaves such a run on the host (w->later, counted as skipped). The
 * segments of the runs with a handle are gathered at the front of a[]. */
static CUresult create_handles(vs_wake_t *w) {
  vs_pool_t *p = w->p;
  int dev = (int)p->caps.device;
  w->run = malloc(w->n * sizeof *w->run);
  w->nr = w->run ? wake_runs(p, w->a, w->n, w->spilled ? 0 : _vs_option(VS_OPT_WAKE_MERGE), w->run) : 0;
  w->h = calloc(w->n, sizeof *w->h);
  w->later = w->spilled ? malloc(w->n * sizeof *w->later) : NULL;
  CUresult r = w->run && w->h && (!w->spilled || w->later) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  size_t nkept = 0; /* segments of the runs with a handle */
  for (size_t k = 0; k < w->nr && r == CUDA_SUCCESS; k++) {
    vs_run_t u = w->run[k];
    CUresult c = _vs_mapped_admit(dev, u.size) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (c == CUDA_SUCCESS) {
      c = _vs_vmm_create(&p->caps, u.size, &w->h[w->ng]);
      if (c != CUDA_SUCCESS) _vs_mapped_return(dev, u.size);
    }
    if (c == CUDA_SUCCESS) {
      for (size_t j = 0; j < u.count; j++) w->a[nkept + j] = w->a[u.first + j]; /* nkept <= u.first */
      w->run[w->ng++] = (vs_run_t){nkept, u.count, u.size};
      nkept += u.count;
    } else if (w->spilled) {
      for (size_t j = 0; j < u.count; j++) w->later[w->nl++] = w->a[u.first + j]; /* stays on the host */
      w->out->skipped += u.size;
      if (!w->out->why_skipped)
        w->out->why_skipped = c == CUDA_ERROR_OUT_OF_MEMORY
                                  ? "no room under the limit (VMMSHIM_LIMIT, the group's) or on the device"
                                  : "cuMemCreate failed";
    } else {
      r = c;
    }
  }
  if (r == CUDA_SUCCESS && w->ng) w->n = nkept;
  return r;
}

/* Run k's device handle goes back, and its bytes under the limit. */
static void drop_handle(vs_wake_t *w, size_t k) {
  _vs_vmm_release(&w->p->caps, w->h[k], w->run[k].size);
  _vs_mapped_return((int)w->p->caps.device, w->run[k].size);
}

static void wake_free(vs_wake_t *w) {
  free(w->run), free(w->h), free(w->woke), free(w->still), free(w->later), free(w->a);
}

/* A wake that could not have every handle, or a promote that could have none: nothing moved (a
 * wake stops at its first failure, so a[] is as it was) and every segment goes back. */
static CUresult give_up(vs_wake_t *w, CUresult r) {
  for (size_t k = w->ng; k-- > 0;) drop_handle(w, k);
  if (r == CUDA_SUCCESS) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (w->nl) _vs_asleep_put_back(w->p, w->later, w->nl); /* a promote: every one of them went there */
  else _vs_asleep_put_back(w->p, w->a, w->n);
  move_note(w->out, r,
            w->spilled                       ? "no room under the limit (VMMSHIM_LIMIT, the group's) or on the device"
            : r == CUDA_ERROR_OUT_OF_MEMORY ? "the device has no room for the sleeping memory (or VMMSHIM_LIMIT)"
                                            : "cuMemCreate failed");
  wake_free(w);
  return r;
}

/* No host memory for the records of what woke: undone, as for a device without room. */
static CUresult no_records(vs_wake_t *w, vs_copier_t *cp) {
  for (size_t k = 0; k < w->ng; k++) drop_handle(w, k);
  _vs_copier_close(cp);
  _vs_asleep_put_back(w->p, w->a, w->n);
  _vs_asleep_put_back(w->p, w->later, w->nl);
  wake_free(w);
  move_note(w->out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
  return CUDA_ERROR_OUT_OF_MEMORY;
}

/* A disk-mode run: its device handle is mapped at its address and its bytes read from the file
 * (the file opened at the first such run). A read that fails unmaps it again (once no copy
 * writes there): it stays asleep with its file. */
static CUresult disk_run(vs_wake_t *w, vs_copier_t *cp, vs_disk_in_t *in, size_t k) {
  vs_pool_t *p = w->p;
  vs_run_t u = w->run[k];
  vs_asleep_seg_t *s = &w->a[u.first];
  if (!in->open && _vs_disk_in_start(p, in, w->out) != 0) return CUDA_ERROR_UNKNOWN;
  CUresult m = _vs_asleep_map_device(p, s->va, u.size, w->h[k]);
  if (m != CUDA_SUCCESS) return m;
  int e = 0;
  for (size_t j = 0; j < u.count && !e; j++) e = _vs_disk_in_seg(p, in, cp, s[j].va, s[j].size, s[j].file_off, w->out);
  if (!e) e = _vs_disk_in_flush(p, in, cp, w->out); /* the run's last reads: a failure is this run's */
  if (!e) return CUDA_SUCCESS;
  _vs_vmm_unmap(&p->caps, s->va, u.size);
  return CUDA_ERROR_UNKNOWN;
}

/* Every run: its device handle is mapped at its address and its segments' bytes queued back,
 * from the host buffers' home mappings (a mapped segment's buffers leave its address first:
 * nothing runs on it now, the caller waited for the GPU and holds launches). A run that cannot
 * be mapped serves from its host buffers again. w->st[k]: whether run k was mapped. */
static void map_runs(vs_wake_t *w, vs_copier_t *cp, vs_disk_in_t *in) {
  vs_pool_t *p = w->p;
  for (size_t k = 0; k < w->ng && w->st; k++) {
    vs_run_t u = w->run[k];
    vs_asleep_seg_t *s = &w->a[u.first];
    if (s->mode == VMMSHIM_SLEEP_DISK) {
      w->st[k] = disk_run(w, cp, in, k);
      continue;
    }
    for (size_t j = 0; j < u.count; j++)
      if (s[j].mode == VMMSHIM_SLEEP_MAPPED) _vs_asleep_unmap_bufs(p, &s[j], s[j].nbufs);
    CUresult m = _vs_asleep_map_device(p, s->va, u.size, w->h[k]);
    for (size_t j = 0; j < u.count; j++) {
      if (m != CUDA_SUCCESS) {
        serve_from_host_again(p, &s[j]);
      } else if (s[j].mode != VMMSHIM_SLEEP_DISCARD) {
        size_t off = 0;
        for (int b = 0; b < s[j].nbufs; off += s[j].bufs[b++].size)
          _vs_copier_copy(cp, s[j].va + off, s[j].bufs[b].home, s[j].bufs[b].size);
      } else if (w->zero) {
        _vs_copier_zero(cp, s[j].va, s[j].size);
      }
    }
    w->st[k] = m;
  }
}

/* Copies that did not complete (c): the runs whose bytes were coming back stay asleep with them
 * (a mapped segment serves from its host buffers again); their device handles go after. A run
 * holds segments of one mode. */
static void unmap_uncopied(vs_wake_t *w, CUresult c) {
  for (size_t k = 0; k < w->ng && w->st; k++) {
    vs_asleep_seg_t *s = &w->a[w->run[k].first];
    if (s->mode == VMMSHIM_SLEEP_DISCARD || w->st[k] != CUDA_SUCCESS) continue;
    _vs_vmm_unmap(&w->p->caps, s->va, w->run[k].size);
    for (size_t j = 0; j < w->run[k].count; j++) serve_from_host_again(w->p, &s[j]);
    w->st[k] = c;
  }
}

/* Each run is on the device again (w->woke, its segments' host buffers given back and counted)
 * or stays asleep (w->still, its device handle given back). */
static void settle_runs(vs_wake_t *w) {
  int dev = (int)w->p->caps.device;
  vs_move_t *out = w->out;
  for (size_t k = 0; k < w->ng; k++) {
    vs_run_t u = w->run[k];
    vs_asleep_seg_t *s = &w->a[u.first];
    CUresult m = w->st ? w->st[k] : CUDA_ERROR_OUT_OF_MEMORY;
    if (m != CUDA_SUCCESS) {
      move_note(out, m, w->spilled ? "mapping device memory in place of host memory failed; it stays on the host"
                                   : "mapping device memory at the sleeping address failed; it stays asleep");
      drop_handle(w, k);
      for (size_t j = 0; j < u.count; j++) w->still[w->nstill++] = s[j];
      continue;
    }
    w->woke[w->nw++] = (vs_seg_t){s->va, u.size, w->h[k]};
    for (size_t j = 0; j < u.count; j++) {
      if (s[j].mode == VMMSHIM_SLEEP_DISCARD) out->discarded += s[j].size;
      else out->to_host += s[j].size;
      if (s[j].spilled) _vs_group_spill_return(dev, s[j].size);
      _vs_asleep_give_bufs(&w->p->caps, &s[j]);
      out->restored += s[j].size;
    }
  }
}

/* The woken runs join the pool's segment table and its mapped bytes; the others go back on the
 * asleep list. Lock not held. */
static void record_woken(vs_wake_t *w) {
  vs_pool_t *p = w->p;
  pool_lock(p);
  if (_vs_segs_add(&p->segs, w->woke, (int)w->nw) != 0) {
    /* No host memory for the table: the segments stay mapped and counted, unlisted. */
    _vs_warn("device %d: no host memory to record %zu woken mappings", (int)p->caps.device, w->nw);
  }
  for (size_t i = 0; i < w->nw; i++) {
    p->mapped += w->woke[i].size;
    heap_at(p, w->woke[i].va)->mapped += w->woke[i].size;
  }
  bool kept = _vs_asleep_append(p, w->still, w->nstill) && _vs_asleep_append(p, w->later, w->nl);
  VS_POOL_CHECK(p);
  pool_unlock(p);
  if (!kept)
    _vs_warn("device %d: no host memory to record the ranges left on the host; their bytes are lost",
             (int)p->caps.device);
  if (w->out->restored) {
    uint64_t m = VS_STAT_ADD(bytes_mapped, w->out->restored) + w->out->restored;
    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);
  }
}

/* Wakes the asleep segments of one kind: those asleep (spilled false), or the growths served
 * from host memory past the limit (spilled true, a promote). A wake is all or nothing: when one
 * device handle cannot be had, nothing moves. A promote takes the segments that fit under the
 * limit and leaves the others on the host (counted as skipped). */
static CUresult wake_segments(vs_pool_t *p, bool zero, bool spilled, vs_move_t *out) {
  *out = (vs_move_t){0};
  vs_wake_t w = {.p = p, .zero = zero, .spilled = spilled, .out = out};
  if (!take_asleep(&w)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!w.n) {
    free(w.a);
    return CUDA_SUCCESS;
  }
  CUresult r = create_handles(&w);
  if (r != CUDA_SUCCESS || !w.ng) return give_up(&w, r);
  vs_copier_t cp;
  _vs_copier_open(&cp);
  w.woke = malloc(w.ng * sizeof *w.woke);
  w.still = malloc(w.n * sizeof *w.still);
  if (!w.woke || !w.still) return no_records(&w, &cp);
  w.st = calloc(w.ng, sizeof *w.st);
  vs_disk_in_t in = {0};
  map_runs(&w, &cp, &in); /* one wait for all copies */
  _vs_disk_in_end(p, &in, &cp);
  CUresult c = _vs_copier_close(&cp);
  move_note(out, c, "copying back to the device failed");
  if (c != CUDA_SUCCESS) unmap_uncopied(&w, c);
  settle_runs(&w);
  free(w.st);
  record_woken(&w);
  wake_free(&w);
  _vs_disk_forget(p, false); /* every disk segment woke: its file goes */
  return out->err;
}

CUresult _vs_pool_wake(vs_pool_t *p, bool zero, vs_move_t *out) { return wake_segments(p, zero, false, out); }

CUresult _vs_pool_promote(vs_pool_t *p, vs_move_t *out) {
  size_t dropped = _vs_pool_drop_idle_spilled(p);
  CUresult r = wake_segments(p, false, true, out);
  out->dropped += dropped;
  return r;
}
