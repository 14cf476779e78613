/* asleep.c: a pool's memory leaves the device and comes back at the same addresses.
 *
 * Sleeping moves every mapped segment (one device handle at one address) out of the pool's
 * segment table into its asleep list, by mode:
 *   discard  the device handle is unmapped and released; the bytes are lost;
 *   host     the bytes are copied into host buffers (host.c), then the device handle goes;
 *   mapped   as host, then the host buffers are mapped at the segment's own address too (they
 *            stay at home as well), so the program keeps running on that memory, over the link.
 * The blocks do not move: live blocks stay live at their addresses, free ones stay free (the
 * pool is taken off allocation while it sleeps, alloc.c). Idle whole handles are given back
 * first, as a trim does; segments the caller names (exported blocks that importers still map)
 * stay on the device.
 *
 * Waking makes a device handle for every asleep segment before it changes anything: when the
 * device has no room, nothing moved and the pool stays asleep with its bytes. Then each handle
 * is mapped at its segment's address with the access the pool's owner and peers have now, and
 * the bytes come back per mode (discard: zeros when asked, else undefined).
 *
 * The caller has made the pool's context current and waited for the GPU work that may touch the
 * pool (alloc layer). Copies run on two streams of the shim's own, in large pieces. The pool
 * lock is never held across a driver call: the segments being moved are in neither list. */
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

/* The heap whose reservation holds va. Lock held. */
static vs_heap_t *heap_at(vs_pool_t *p, CUdeviceptr va) {
  for (int i = 0; i < p->n_resv; i++)
    if (va >= p->resv[i].va && va < p->resv[i].va + p->resv[i].size) return &p->heaps[p->resv_heap[i]];
  return &p->heaps[0];
}

static bool overlaps(CUdeviceptr va, size_t size, const CUdeviceptr *skip_va, const size_t *skip_len, int nskip) {
  for (int i = 0; i < nskip; i++)
    if (skip_va[i] < va + size && va < skip_va[i] + skip_len[i]) return true;
  return false;
}

/* Two streams of the shim's own in the current context, for the copies: a copy engine each. */
typedef struct vs_copier_s {
  CUstream s[2];
  int n, next;
  CUresult err;
} vs_copier_t;

static void copier_open(vs_copier_t *c) {
  *c = (vs_copier_t){{NULL, NULL}, 0, 0, CUDA_SUCCESS};
  for (int i = 0; i < 2 && _vs_cu.cuStreamCreate; i++)
    if (_vs_cu.cuStreamCreate(&c->s[c->n], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) c->n++;
}

/* Copies in pieces of at most 256 MiB, alternating streams. */
static void copier_copy(vs_copier_t *c, CUdeviceptr dst, CUdeviceptr src, size_t n) {
  enum { PIECE = 256 << 20 };
  for (size_t off = 0; off < n && c->err == CUDA_SUCCESS; off += PIECE) {
    size_t len = n - off < PIECE ? n - off : PIECE;
    CUstream s = c->n ? c->s[c->next++ % c->n] : NULL;
    c->err = _vs_cu.cuMemcpyDtoDAsync ? _vs_cu.cuMemcpyDtoDAsync(dst + off, src + off, len, s) : CUDA_ERROR_NOT_SUPPORTED;
  }
}

static void copier_zero(vs_copier_t *c, CUdeviceptr dst, size_t n) {
  CUstream s = c->n ? c->s[c->next++ % c->n] : NULL;
  if (c->err == CUDA_SUCCESS)
    c->err = _vs_cu.cuMemsetD8Async ? _vs_cu.cuMemsetD8Async(dst, 0, n, s) : CUDA_ERROR_NOT_SUPPORTED;
}

/* Waits for every copy; returns the first error. */
static CUresult copier_close(vs_copier_t *c) {
  CUresult r = c->err;
  for (int i = 0; i < c->n; i++) {
    CUresult w = _vs_cu.cuStreamSynchronize(c->s[i]);
    if (r == CUDA_SUCCESS) r = w;
    _vs_cu.cuStreamDestroy(c->s[i]);
  }
  if (!c->n && r == CUDA_SUCCESS) r = _vs_cu.cuStreamSynchronize(NULL);
  return r;
}

/* Host buffers for a segment of size bytes: VS_HOST_CHUNK each, the last the rest. Returns the
 * count, or -1 (nothing kept) when host memory cannot be had. */
static int take_bufs(const vs_device_caps_t *caps, size_t size, vs_host_buf_t **out, CUresult *err) {
  int n = (int)((size + VS_HOST_CHUNK - 1) / VS_HOST_CHUNK);
  vs_host_buf_t *b = calloc((size_t)n, sizeof *b);
  *out = NULL;
  if (!b) {
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return -1;
  }
  for (int i = 0; i < n; i++) {
    size_t len = size - (size_t)i * VS_HOST_CHUNK < VS_HOST_CHUNK ? size - (size_t)i * VS_HOST_CHUNK : VS_HOST_CHUNK;
    CUresult r = _vs_host_take(caps, len, &b[i]);
    if (r != CUDA_SUCCESS) {
      while (i-- > 0) _vs_host_give(caps, &b[i]);
      free(b);
      *err = r;
      return -1;
    }
  }
  *out = b;
  return n;
}

static void give_bufs(const vs_device_caps_t *caps, vs_asleep_seg_t *a) {
  for (int i = 0; i < a->nbufs; i++) _vs_host_give(caps, &a->bufs[i]);
  free(a->bufs);
  a->bufs = NULL;
  a->nbufs = 0;
}

static void note(vs_move_t *out, CUresult r, const char *why) {
  if (out->err == CUDA_SUCCESS && r != CUDA_SUCCESS) {
    out->err = r;
    out->why = why;
  }
}

/* Maps a segment's host buffers at its own address, back to back, with the access of the
 * pool's owner and peers. On failure whatever was mapped there is unmapped again. */
static CUresult map_bufs_at(vs_pool_t *p, const vs_asleep_seg_t *a) {
  CUresult r = CUDA_SUCCESS;
  int i = 0;
  size_t off = 0;
  for (; i < a->nbufs && r == CUDA_SUCCESS; off += a->bufs[i++].size) r = _vs_vmm_map(&p->caps, a->va + off, a->bufs[i].size, a->bufs[i].handle);
  if (r == CUDA_SUCCESS) {
    uint64_t rw = p->access ? atomic_load(&p->access->rw) : 0, ro = p->access ? atomic_load(&p->access->ro) : 0;
    r = _vs_vmm_set_access_devices(&p->caps, a->va, a->size, rw, ro, 0);
  } else {
    i--; /* the one that failed is not mapped */
  }
  if (r != CUDA_SUCCESS) {
    off = 0;
    for (int k = 0; k < i; off += a->bufs[k++].size) _vs_vmm_unmap(&p->caps, a->va + off, a->bufs[k].size);
  }
  return r;
}

/* Records the segments that are now asleep, and gives back to the pool's table the ones
 * that stay. Lock not held. */
static void settle(vs_pool_t *p, vs_asleep_seg_t *moved, int nm, const vs_seg_t *stay, int ns) {
  pool_lock(p);
  if (ns && _vs_segs_add(&p->segs, stay, ns) != 0)
    _vs_warn("device %d: no host memory to record %d mappings; they stay mapped, unlisted", (int)p->caps.device, ns);
  for (int i = 0; i < ns; i++) {
    p->mapped += stay[i].size;
    heap_at(p, stay[i].va)->mapped += stay[i].size;
  }
  if (nm && p->asleep.n + (size_t)nm > p->asleep.cap) {
    size_t cap = p->asleep.cap ? p->asleep.cap * 2 : 16;
    while (cap < p->asleep.n + (size_t)nm) cap *= 2;
    vs_asleep_seg_t *v = realloc(p->asleep.v, cap * sizeof *v);
    if (v) {
      p->asleep.v = v;
      p->asleep.cap = cap;
    }
  }
  for (int i = 0; i < nm; i++) {
    if (p->asleep.n == p->asleep.cap) { /* no host memory for the record: its bytes are lost */
      _vs_warn("device %d: no host memory to record a sleeping range; its %zu bytes are lost", (int)p->caps.device,
               moved[i].size);
      continue;
    }
    p->asleep.v[p->asleep.n++] = moved[i];
    p->asleep.bytes += moved[i].size;
    if (moved[i].mode == VMMSHIM_SLEEP_MAPPED) p->asleep.host_mapped += moved[i].size;
  }
  VS_POOL_CHECK(p);
  pool_unlock(p);
}

void _vs_pool_sleep(vs_pool_t *p, int mode, const CUdeviceptr *skip_va, const size_t *skip_len, int nskip,
                    vs_move_t *out) {
  *out = (vs_move_t){0};
  /* Whole idle handles go back as a trim gives them: nothing of theirs needs keeping. */
  out->released += _vs_pool_trim(p, 0);

  pool_lock(p);
  size_t n = p->segs.n;
  vs_seg_t *segs = n ? malloc(n * sizeof *segs) : NULL;
  vs_asleep_seg_t *moved = n ? calloc(n, sizeof *moved) : NULL;
  vs_seg_t *stay = n ? malloc(n * sizeof *stay) : NULL;
  if (n && (!segs || !moved || !stay)) {
    pool_unlock(p);
    free(segs), free(moved), free(stay);
    note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return;
  }
  /* Out of the table: from now on no trim or access change of another thread touches them. */
  int nm = 0, ns = 0;
  for (size_t i = 0; i < n; i++) {
    vs_seg_t sg = p->segs.v[i];
    if (overlaps(sg.va, sg.size, skip_va, skip_len, nskip)) {
      out->skipped += sg.size;
      continue;
    }
    segs[nm++] = sg;
    p->mapped -= sg.size;
    heap_at(p, sg.va)->mapped -= sg.size;
  }
  /* The table keeps only the segments that stay (their order kept). */
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (overlaps(p->segs.v[i].va, p->segs.v[i].size, skip_va, skip_len, nskip)) p->segs.v[k++] = p->segs.v[i];
  p->segs.n = k;
  pool_unlock(p);
  if (out->skipped) out->why_skipped = "an importer of another process still maps an exported block";

  /* Host and mapped modes: the bytes to host buffers first, all copies in flight at once. A
   * segment whose buffers cannot be had stays on the device. */
  vs_copier_t cp;
  bool copying = mode != VMMSHIM_SLEEP_DISCARD;
  if (copying) copier_open(&cp);
  int live = 0; /* segments to release from here: moved[0 .. live) */
  for (int i = 0; i < nm; i++) {
    vs_asleep_seg_t a = {segs[i].va, segs[i].size, mode, 0, NULL};
    if (copying) {
      CUresult r = CUDA_SUCCESS;
      a.nbufs = take_bufs(&p->caps, a.size, &a.bufs, &r);
      if (a.nbufs < 0) {
        a.nbufs = 0;
        note(out, r, r == CUDA_ERROR_NOT_SUPPORTED ? "the device cannot map host memory (HOST_NUMA VMM)"
                                                   : "host memory (VMMSHIM_HOST_LIMIT, or the host has no more)");
        stay[ns++] = segs[i];
        out->skipped += a.size;
        if (!out->why_skipped || r == CUDA_ERROR_NOT_SUPPORTED) out->why_skipped = out->why;
        continue;
      }
      size_t off = 0;
      for (int b = 0; b < a.nbufs; off += a.bufs[b++].size) copier_copy(&cp, a.bufs[b].home, a.va + off, a.bufs[b].size);
    }
    segs[live] = segs[i];
    moved[live++] = a;
  }
  if (copying) {
    CUresult r = copier_close(&cp);
    if (r != CUDA_SUCCESS) {
      /* The copies did not all complete: nothing is released, every segment stays. */
      note(out, r, "copying to host memory failed");
      for (int i = 0; i < live; i++) {
        give_bufs(&p->caps, &moved[i]);
        stay[ns++] = segs[i];
        out->skipped += segs[i].size;
      }
      out->why_skipped = out->why;
      live = 0;
    }
  }

  /* The device handles go. */
  for (int i = 0; i < live; i++) {
    vs_asleep_seg_t *a = &moved[i];
    CUresult r = _vs_vmm_unmap(&p->caps, segs[i].va, segs[i].size);
    if (r != CUDA_SUCCESS) {
      /* Still mapped: it stays, as it was. */
      note(out, r, "cuMemUnmap failed");
      give_bufs(&p->caps, a);
      stay[ns++] = segs[i];
      out->skipped += segs[i].size;
      moved[i].size = 0;
      continue;
    }
    _vs_vmm_release(&p->caps, segs[i].handle, segs[i].size);
    _vs_mapped_return(segs[i].size);
    VS_STAT_SUB(bytes_mapped, segs[i].size);
    out->released += segs[i].size;
    if (a->mode == VMMSHIM_SLEEP_MAPPED) {
      /* The host buffers take the segment's address too (they stay mapped at home: mapping
       * them home again at the wake would cost as much as this): the program keeps running on
       * them. */
      CUresult m = map_bufs_at(p, a);
      if (m != CUDA_SUCCESS) {
        note(out, m, "mapping host memory at the segment's address failed; its bytes are kept on the host");
        a->mode = VMMSHIM_SLEEP_HOST;
      }
    }
    if (a->mode == VMMSHIM_SLEEP_DISCARD) out->discarded += a->size;
    else out->to_host += a->size;
    if (a->mode == VMMSHIM_SLEEP_MAPPED) out->host_mapped += a->size;
  }
  /* Unmap failures left holes in moved[]: close them. */
  int nmoved = 0;
  for (int i = 0; i < live; i++)
    if (moved[i].size) moved[nmoved++] = moved[i];
  settle(p, moved, nmoved, stay, ns);
  free(segs), free(moved), free(stay);
}

CUresult _vs_pool_wake(vs_pool_t *p, bool zero, vs_move_t *out) {
  *out = (vs_move_t){0};
  pool_lock(p);
  size_t n = p->asleep.n;
  vs_asleep_seg_t *a = p->asleep.v;
  p->asleep = (vs_asleep_t){0};
  pool_unlock(p);
  if (!n) {
    free(a);
    return CUDA_SUCCESS;
  }

  /* Every device handle first, admitted under VMMSHIM_LIMIT: if the device has no room, nothing
   * has moved and the segments go back to the asleep list as they were. */
  CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
  CUresult r = h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  size_t made = 0;
  for (; made < n && r == CUDA_SUCCESS; made++) {
    if (!_vs_mapped_admit(a[made].size)) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
      break;
    }
    r = _vs_vmm_create(&p->caps, a[made].size, &h[made]);
    if (r != CUDA_SUCCESS) {
      _vs_mapped_return(a[made].size);
      break;
    }
  }
  if (r != CUDA_SUCCESS) {
    while (made-- > 0) {
      _vs_vmm_release(&p->caps, h[made], a[made].size);
      _vs_mapped_return(a[made].size);
    }
    free(h);
    note(out, r, r == CUDA_ERROR_OUT_OF_MEMORY ? "the device has no room for the sleeping memory (or VMMSHIM_LIMIT)"
                                               : "cuMemCreate failed");
    pool_lock(p);
    vs_asleep_t now = p->asleep; /* empty: nothing sleeps this pool while it wakes */
    p->asleep.v = a;
    p->asleep.n = p->asleep.cap = n;
    for (size_t i = 0; i < n; i++) {
      p->asleep.bytes += a[i].size;
      if (a[i].mode == VMMSHIM_SLEEP_MAPPED) p->asleep.host_mapped += a[i].size;
    }
    pool_unlock(p);
    free(now.v);
    return r;
  }

  uint64_t rw = p->access ? atomic_load(&p->access->rw) : 0, ro = p->access ? atomic_load(&p->access->ro) : 0;
  vs_copier_t cp;
  copier_open(&cp);
  vs_seg_t *woke = malloc(n * sizeof *woke);
  vs_asleep_seg_t *still = malloc(n * sizeof *still);
  size_t nw = 0, nstill = 0;
  if (!woke || !still) {
    /* No host memory for the shim's records: undo, as for a device without room. */
    for (size_t i = 0; i < n; i++) {
      _vs_vmm_release(&p->caps, h[i], a[i].size);
      _vs_mapped_return(a[i].size);
    }
    free(h), free(woke), free(still);
    copier_close(&cp);
    pool_lock(p);
    p->asleep.v = a;
    p->asleep.n = p->asleep.cap = n;
    for (size_t i = 0; i < n; i++) p->asleep.bytes += a[i].size;
    pool_unlock(p);
    note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* Step 1, every segment: a discarded or host one is mapped at its address and its bytes queued
   * back; a mapped one (its address holds the host memory the program runs on) gets its device
   * handle at a staging address and the copy from its address queued. One wait for all copies. */
  CUdeviceptr *stage = calloc(n, sizeof *stage);
  bool *staged_own = calloc(n, sizeof *staged_own); /* stage was reserved (to be freed) */
  CUresult *st = calloc(n, sizeof *st);
  if (!stage || !staged_own || !st) {
    free(stage), free(staged_own), free(st);
    stage = NULL;
  }
  for (size_t i = 0; i < n && stage; i++) {
    vs_asleep_seg_t *s = &a[i];
    CUresult m;
    if (s->mode == VMMSHIM_SLEEP_MAPPED) {
      m = _vs_vmm_reserve(&p->caps, s->size, 0, &stage[i]);
      staged_own[i] = m == CUDA_SUCCESS;
      if (m == CUDA_SUCCESS) {
        m = _vs_vmm_map(&p->caps, stage[i], s->size, h[i]);
        if (m == CUDA_SUCCESS) {
          m = _vs_vmm_set_access(&p->caps, stage[i], s->size);
          if (m != CUDA_SUCCESS) _vs_vmm_unmap(&p->caps, stage[i], s->size);
        }
        if (m == CUDA_SUCCESS) copier_copy(&cp, stage[i], s->va, s->size);
        else if (staged_own[i]) _vs_vmm_address_free(&p->caps, stage[i], s->size);
      }
    } else {
      m = _vs_vmm_map(&p->caps, s->va, s->size, h[i]);
      if (m == CUDA_SUCCESS) {
        m = _vs_vmm_set_access_devices(&p->caps, s->va, s->size, rw, ro, 0);
        if (m != CUDA_SUCCESS) _vs_vmm_unmap(&p->caps, s->va, s->size);
      }
      if (m == CUDA_SUCCESS && s->mode == VMMSHIM_SLEEP_HOST) {
        size_t off = 0;
        for (int b = 0; b < s->nbufs; off += s->bufs[b++].size) copier_copy(&cp, s->va + off, s->bufs[b].home, s->bufs[b].size);
      } else if (m == CUDA_SUCCESS && zero) {
        copier_zero(&cp, s->va, s->size);
      }
    }
    st[i] = m;
  }
  CUresult c = copier_close(&cp);
  note(out, c, "copying back to the device failed");
  /* Step 2, the mapped segments: the device handle takes the host memory's place at the
   * segment's address, and the host buffers go home. A failed copy or mapping leaves the host
   * memory where it is: the program's view does not change, the segment stays asleep. */
  for (size_t i = 0; i < n && stage; i++) {
    vs_asleep_seg_t *s = &a[i];
    if (s->mode != VMMSHIM_SLEEP_MAPPED || st[i] != CUDA_SUCCESS) continue;
    _vs_vmm_unmap(&p->caps, stage[i], s->size);
    if (staged_own[i]) _vs_vmm_address_free(&p->caps, stage[i], s->size);
    CUresult m = c;
    if (m == CUDA_SUCCESS) {
      size_t off = 0;
      for (int b = 0; b < s->nbufs; off += s->bufs[b++].size) _vs_vmm_unmap(&p->caps, s->va + off, s->bufs[b].size);
      m = _vs_vmm_map(&p->caps, s->va, s->size, h[i]);
      if (m == CUDA_SUCCESS) m = _vs_vmm_set_access_devices(&p->caps, s->va, s->size, rw, ro, 0);
      if (m != CUDA_SUCCESS) {
        _vs_vmm_unmap(&p->caps, s->va, s->size);
        map_bufs_at(p, s);
      }
    }
    st[i] = m;
  }
  for (size_t i = 0; i < n; i++) {
    vs_asleep_seg_t *s = &a[i];
    CUresult m = stage ? st[i] : CUDA_ERROR_OUT_OF_MEMORY;
    if (m != CUDA_SUCCESS) {
      note(out, m, "mapping device memory at the sleeping address failed; it stays asleep");
      _vs_vmm_release(&p->caps, h[i], s->size);
      _vs_mapped_return(s->size);
      still[nstill++] = *s;
      continue;
    }
    woke[nw++] = (vs_seg_t){s->va, s->size, h[i]};
    if (s->mode == VMMSHIM_SLEEP_DISCARD) out->discarded += s->size;
    else out->to_host += s->size;
    give_bufs(&p->caps, s);
    out->restored += s->size;
  }
  free(stage), free(staged_own), free(st);
  pool_lock(p);
  if (_vs_segs_add(&p->segs, woke, (int)nw) != 0) {
    /* No host memory for the table: the segments stay mapped and counted, unlisted. */
    _vs_warn("device %d: no host memory to record %zu woken mappings", (int)p->caps.device, nw);
  }
  for (size_t i = 0; i < nw; i++) {
    p->mapped += woke[i].size;
    heap_at(p, woke[i].va)->mapped += woke[i].size;
  }
  for (size_t i = 0; i < nstill; i++) {
    p->asleep.bytes += still[i].size;
    if (still[i].mode == VMMSHIM_SLEEP_MAPPED) p->asleep.host_mapped += still[i].size;
  }
  free(p->asleep.v);
  p->asleep.v = still;
  p->asleep.n = p->asleep.cap = nstill;
  VS_POOL_CHECK(p);
  pool_unlock(p);
  if (out->restored) {
    uint64_t m = VS_STAT_ADD(bytes_mapped, out->restored) + out->restored;
    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);
  }
  free(h), free(woke), free(a);
  return out->err;
}

bool _vs_pool_asleep(vs_pool_t *p, size_t *bytes, size_t *host_mapped) {
  pool_lock(p);
  size_t b = p->asleep.bytes, hm = p->asleep.host_mapped;
  pool_unlock(p);
  if (bytes) *bytes = b;
  if (host_mapped) *host_mapped = hm;
  return b > 0;
}

bool _vs_pool_host_mapped_at(vs_pool_t *p, CUdeviceptr addr) {
  bool hit = false;
  pool_lock(p);
  for (size_t i = 0; i < p->asleep.n && !hit; i++)
    hit = p->asleep.v[i].mode == VMMSHIM_SLEEP_MAPPED && addr >= p->asleep.v[i].va &&
          addr < p->asleep.v[i].va + p->asleep.v[i].size;
  pool_unlock(p);
  return hit;
}

void _vs_pool_sleep_figures(vs_pool_t *p, vs_sleep_figures_t *f) {
  memset(f, 0, sizeof *f);
  pool_lock(p);
  f->live = p->used;
  f->device = p->mapped;
  for (size_t i = 0; i < p->asleep.n; i++) {
    const vs_asleep_seg_t *s = &p->asleep.v[i];
    if (s->mode == VMMSHIM_SLEEP_DISCARD) f->discarded += s->size;
    else if (s->mode == VMMSHIM_SLEEP_HOST) f->host_copied += s->size;
    else f->host_mapped += s->size;
  }
  pool_unlock(p);
}

void _vs_pool_forget_asleep(vs_pool_t *p) {
  for (size_t i = 0; i < p->asleep.n; i++) {
    vs_asleep_seg_t *s = &p->asleep.v[i];
    if (s->mode == VMMSHIM_SLEEP_MAPPED) {
      size_t off = 0;
      for (int b = 0; b < s->nbufs; off += s->bufs[b++].size) _vs_vmm_unmap(&p->caps, s->va + off, s->bufs[b].size);
    }
    for (int b = 0; b < s->nbufs; b++) _vs_host_drop(&p->caps, &s->bufs[b], true);
    free(s->bufs);
  }
  free(p->asleep.v);
  p->asleep = (vs_asleep_t){0};
}
