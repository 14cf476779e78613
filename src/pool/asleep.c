/* asleep.c: a pool's memory leaves the device and comes back at the same addresses.
 *
 * Sleeping moves every mapped segment (one device handle at one address) out of the pool's
 * segment table into its asleep list, by mode:
 *   discard  the device handle is unmapped and released; the bytes are lost;
 *   host     the bytes are copied into host buffers (host.c), then the device handle goes;
 *   mapped   as host, but the bytes are copied from a second mapping of the device handles
 *            (an alias) while the host buffers take the segments' own addresses (they stay at
 *            home as well), so the program keeps running on that memory, over the link.
 * The blocks do not move: live blocks stay live at their addresses, free ones stay free (the
 * pool is taken off allocation while it sleeps, alloc.c). Idle whole handles are given back
 * first, as a trim does; segments the caller names (exported blocks that importers still map)
 * stay on the device.
 *
 * Waking makes a device handle for every run of neighbouring asleep segments (up to
 * VMMSHIM_WAKE_MERGE) before it changes anything: when the device has no room, nothing moved
 * and the pool stays asleep with its bytes. Then each handle is mapped at its run's address with
 * the access the pool's owner and peers have now, and the bytes come back per mode (discard:
 * zeros when asked, else undefined).
 *
 * The caller has made the pool's context current and waited for the GPU work that may touch the
 * pool (alloc layer). Copies run on two streams of the shim's own, in large pieces. The pool
 * lock is never held across a driver call: the segments being moved are in neither list. */
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

/* The heap whose reservation holds va. Lock held. */
static vs_heap_t *heap_at(vs_pool_t *p, CUdeviceptr va) {
  int i = resv_of(p, va);
  return &p->heaps[i >= 0 ? p->resv_heap[i] : 0];
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

/* A point in the copier's streams, reached when every copy queued before it has completed: a
 * segment's copies are waited for alone, so its mappings change while later ones still copy. */
typedef struct vs_copy_mark_s {
  CUevent ev[2];
  int n;        /* events recorded; -1: none could be, the whole streams are waited for */
  CUresult err; /* a copy up to this point could not be queued */
} vs_copy_mark_t;

static vs_copy_mark_t copier_mark(vs_copier_t *c) {
  vs_copy_mark_t m = {{NULL, NULL}, 0, c->err};
  bool whole = !c->n || !_vs_cu.cuEventSynchronize;
  for (int i = 0; i < c->n && !whole && m.err == CUDA_SUCCESS; i++) {
    if (_vs_cu.cuEventCreate(&m.ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) break;
    m.n = i + 1;
    whole = _vs_cu.cuEventRecord(m.ev[i], c->s[i]) != CUDA_SUCCESS;
  }
  if (m.err == CUDA_SUCCESS && m.n < c->n) whole = true;
  if (whole) {
    for (int i = 0; i < m.n; i++) _vs_cu.cuEventDestroy(m.ev[i]);
    m.n = -1;
  }
  return m;
}

/* Waits for a mark (and forgets it); returns the first error of the copies before it. */
static CUresult copier_wait(vs_copier_t *c, vs_copy_mark_t *m) {
  CUresult r = m->err;
  if (m->n < 0) {
    for (int i = 0; i < c->n; i++) {
      CUresult w = _vs_cu.cuStreamSynchronize(c->s[i]);
      if (r == CUDA_SUCCESS) r = w;
    }
    if (!c->n && r == CUDA_SUCCESS) r = _vs_cu.cuStreamSynchronize(NULL);
  }
  for (int i = 0; i < m->n; i++) {
    CUresult w = _vs_cu.cuEventSynchronize(m->ev[i]);
    if (r == CUDA_SUCCESS) r = w;
    _vs_cu.cuEventDestroy(m->ev[i]);
  }
  m->n = 0;
  return r;
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

/* Unmaps a segment's first n host buffers from its own address (they stay at home). */
static void unmap_bufs_at(vs_pool_t *p, const vs_asleep_seg_t *a, int n) {
  size_t off = 0;
  for (int k = 0; k < n; off += a->bufs[k++].size) _vs_vmm_unmap_host(&p->caps, a->va + off, a->bufs[k].size);
}

/* Maps a segment's host buffers at its own address, back to back, with the access of the
 * pool's owner and peers. On failure whatever was mapped there is unmapped again. */
static CUresult map_bufs_at(vs_pool_t *p, const vs_asleep_seg_t *a) {
  CUresult r = CUDA_SUCCESS;
  int i = 0;
  size_t off = 0;
  for (; i < a->nbufs && r == CUDA_SUCCESS; off += a->bufs[i++].size) r = _vs_vmm_map_host(&p->caps, a->va + off, a->bufs[i].size, a->bufs[i].handle);
  if (r == CUDA_SUCCESS) {
    uint64_t rw, ro;
    access_now(p, &rw, &ro);
    r = _vs_vmm_set_access_devices(&p->caps, a->va, a->size, rw, ro, 0);
  } else {
    i--; /* the one that failed is not mapped */
  }
  if (r != CUDA_SUCCESS) unmap_bufs_at(p, a, i);
  return r;
}

/* Maps a device handle at va with the access of the pool's owner and peers now; on failure
 * nothing stays mapped there. */
static CUresult map_device_at(vs_pool_t *p, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
  uint64_t rw, ro;
  access_now(p, &rw, &ro);
  CUresult r = _vs_vmm_map(&p->caps, va, size, h);
  if (r == CUDA_SUCCESS) {
    r = _vs_vmm_set_access_devices(&p->caps, va, size, rw, ro, 0);
    if (r != CUDA_SUCCESS) _vs_vmm_unmap(&p->caps, va, size);
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

/* The device handle of a segment that left the device goes back, and is counted. */
static void handle_gone(vs_pool_t *p, const vs_seg_t *sg, vs_move_t *out) {
  _vs_vmm_release(&p->caps, sg->handle, sg->size);
  _vs_mapped_return((int)p->caps.device, sg->size);
  VS_STAT_SUB(bytes_mapped, sg->size);
  out->released += sg->size;
}

/* A segment that could not move stays on the device as it was; its host buffers go back and
 * its entry in moved[] becomes a hole (size 0) for the caller to close. */
static void stays(vs_pool_t *p, vs_asleep_seg_t *a, const vs_seg_t *sg, vs_seg_t *stay, int *ns, vs_move_t *out) {
  give_bufs(&p->caps, a);
  stay[(*ns)++] = *sg;
  out->skipped += sg->size;
  a->size = 0;
}

static void count_moved(const vs_asleep_seg_t *a, vs_move_t *out) {
  if (a->mode == VMMSHIM_SLEEP_DISCARD) out->discarded += a->size;
  else out->to_host += a->size;
  if (a->mode == VMMSHIM_SLEEP_MAPPED) out->host_mapped += a->size;
}

/* Mapped mode: the segment's host buffers take its address too (they stay mapped at home:
 * mapping them home again at the wake would cost as much as this), so the program keeps running
 * on them. When they cannot, the bytes are kept on the host (host mode) and the answer says so. */
static bool bufs_take_address(vs_pool_t *p, vs_asleep_seg_t *a, vs_move_t *out) {
  CUresult m = map_bufs_at(p, a);
  if (m != CUDA_SUCCESS) {
    note(out, m, "mapping host memory at the segment's address failed; its bytes are kept on the host");
    a->mode = VMMSHIM_SLEEP_HOST;
  }
  return m == CUDA_SUCCESS;
}

/* The device handles go, each once its bytes are on the host: unmapping and (mapped mode)
 * mapping the host buffers overlap the copies of the segments after it. cp NULL: no copies. */
static void release_in_order(vs_pool_t *p, vs_copier_t *cp, vs_copy_mark_t *marks, const vs_seg_t *segs,
                             vs_asleep_seg_t *moved, int live, vs_seg_t *stay, int *ns, vs_move_t *out) {
  /* No memory for the marks: one wait for every copy. */
  CUresult copied = cp && !marks ? copier_close(cp) : CUDA_SUCCESS;
  for (int i = 0; i < live; i++) {
    vs_asleep_seg_t *a = &moved[i];
    if (marks) {
      CUresult w = copier_wait(cp, &marks[i]);
      if (copied == CUDA_SUCCESS) copied = w;
    }
    if (copied != CUDA_SUCCESS) {
      /* Its copies (or earlier ones) did not complete: it stays, as every later one does. */
      note(out, copied, "copying to host memory failed");
      out->why_skipped = out->why;
      stays(p, a, &segs[i], stay, ns, out);
      continue;
    }
    CUresult r = _vs_vmm_unmap(&p->caps, segs[i].va, segs[i].size);
    if (r != CUDA_SUCCESS) {
      note(out, r, "cuMemUnmap failed"); /* still mapped: it stays, as it was */
      stays(p, a, &segs[i], stay, ns, out);
      continue;
    }
    handle_gone(p, &segs[i], out);
    if (a->mode == VMMSHIM_SLEEP_MAPPED) bufs_take_address(p, a, out);
    count_moved(a, out);
  }
}

/* A second mapping of the segments' device handles, back to back in a reservation of its own,
 * with the owner's access. Mapped mode copies from it, so each segment's address can take its
 * host buffers while the copies still run: giving host memory device access is paid by the
 * byte (about 75 ms for 8 GiB on an H100), and done after each segment's copy it followed the
 * copies (8 GiB in 64 MiB segments: 199 ms) where alongside them it hides under them (175 ms).
 * Returns 0 when it cannot be had: the segments then change mappings after their copies. */
static CUdeviceptr alias_open(vs_pool_t *p, const vs_seg_t *segs, int n, size_t *len) {
  *len = 0;
  for (int i = 0; i < n; i++) *len += segs[i].size;
  CUdeviceptr base = 0;
  if (!*len || _vs_vmm_reserve(&p->caps, *len, p->caps.min_granularity, &base) != CUDA_SUCCESS) return 0;
  size_t off = 0;
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < n && r == CUDA_SUCCESS; i++) {
    r = _vs_vmm_map_alias(&p->caps, base + off, segs[i].size, segs[i].handle);
    if (r == CUDA_SUCCESS) off += segs[i].size;
  }
  if (r == CUDA_SUCCESS) r = _vs_vmm_set_access(&p->caps, base, *len);
  if (r != CUDA_SUCCESS) {
    if (off) _vs_vmm_unmap_alias(&p->caps, base, off);
    _vs_vmm_address_free(&p->caps, base, *len);
    return 0;
  }
  return base;
}

/* Puts a segment's device handle (its bytes intact: the copies only read it) back at its
 * address in place of whatever release_aliased mapped there. */
static bool put_back(vs_pool_t *p, vs_asleep_seg_t *a, const vs_seg_t *sg, bool host_at_va) {
  if (host_at_va) unmap_bufs_at(p, a, a->nbufs);
  return map_device_at(p, sg->va, sg->size, sg->handle) == CUDA_SUCCESS;
}

/* A segment of a sleep through an alias: its place in the alias, and what its address maps. */
enum { AT_DEVICE, AT_HOST, UNMAPPED, LOST };
typedef struct vs_aliased_s {
  CUdeviceptr at;
  int where;
} vs_aliased_t;

/* Mapped mode with an alias (alias_open; al[i]: segment i's place in it). Every segment whose
 * copies were queued leaves its address to its host buffers at once, while the copies run;
 * then, as each segment's copies complete, its alias and its device handle go. A copy that
 * fails puts the device handle back at the address: the segment stays, as in release_in_order.
 * The alias of a segment whose copies failed stays (al[i].at) until the caller has waited for
 * every copy: a failed wait does not say they stopped. */
static void release_aliased(vs_pool_t *p, vs_copier_t *cp, vs_copy_mark_t *marks, vs_aliased_t *al,
                            const vs_seg_t *segs, vs_asleep_seg_t *moved, int live, vs_seg_t *stay, int *ns,
                            vs_move_t *out) {
  for (int i = 0; i < live; i++) {
    vs_asleep_seg_t *a = &moved[i];
    al[i].where = AT_DEVICE;
    if (marks[i].err != CUDA_SUCCESS) continue; /* a copy could not be queued: it stays */
    CUresult r = _vs_vmm_unmap(&p->caps, segs[i].va, segs[i].size);
    if (r != CUDA_SUCCESS) {
      note(out, r, "cuMemUnmap failed"); /* still mapped: it stays, as it was */
      continue;
    }
    al[i].where = bufs_take_address(p, a, out) ? AT_HOST : UNMAPPED;
  }
  CUresult copied = CUDA_SUCCESS;
  for (int i = 0; i < live; i++) {
    vs_asleep_seg_t *a = &moved[i];
    CUresult w = copier_wait(cp, &marks[i]);
    if (copied == CUDA_SUCCESS) copied = w;
    if (copied == CUDA_SUCCESS) { /* its copies are over; after a failure the caller waits for all */
      _vs_vmm_unmap_alias(&p->caps, al[i].at, segs[i].size);
      al[i].at = 0;
    } else {
      note(out, copied, "copying to host memory failed");
      out->why_skipped = out->why;
      if (al[i].where != AT_DEVICE) al[i].where = put_back(p, a, &segs[i], al[i].where == AT_HOST) ? AT_DEVICE : LOST;
    }
    if (al[i].where == AT_DEVICE) {
      stays(p, a, &segs[i], stay, ns, out);
      continue;
    }
    handle_gone(p, &segs[i], out);
    if (al[i].where == LOST) {
      /* Neither on the host whole nor back on the device (a context that fails every call):
       * the address wakes to new memory, as a discarded segment does. */
      _vs_warn("device %d: a sleeping range's %zu bytes are lost (copying failed, and so did mapping it back): %s",
               (int)p->caps.device, segs[i].size, _vs_cu_error_name(copied));
      give_bufs(&p->caps, a);
      a->mode = VMMSHIM_SLEEP_DISCARD;
    }
    count_moved(a, out);
  }
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

  /* Host and mapped modes: the bytes to host buffers first, all copies in flight at once, a
   * mark after each segment's. A segment whose buffers cannot be had stays on the device.
   * Mapped mode reads them from an alias of the segments when it can have one (alias_open). */
  vs_copier_t cp;
  bool copying = mode != VMMSHIM_SLEEP_DISCARD;
  vs_copy_mark_t *marks = copying && nm ? calloc((size_t)nm, sizeof *marks) : NULL;
  vs_aliased_t *al = marks && mode == VMMSHIM_SLEEP_MAPPED ? calloc((size_t)nm, sizeof *al) : NULL;
  size_t alias_len = 0;
  CUdeviceptr alias = al ? alias_open(p, segs, nm, &alias_len) : 0;
  if (copying) copier_open(&cp);
  int live = 0; /* segments to release from here: moved[0 .. live) */
  size_t from = 0; /* segs[i]'s offset in the alias */
  for (int i = 0; i < nm; from += segs[i++].size) {
    vs_asleep_seg_t a = {segs[i].va, segs[i].size, mode, 0, NULL, false};
    if (copying) {
      CUresult r = CUDA_SUCCESS;
      a.nbufs = take_bufs(&p->caps, a.size, &a.bufs, &r);
      if (a.nbufs < 0) {
        a.nbufs = 0;
        note(out, r, r == CUDA_ERROR_NOT_SUPPORTED ? "the device cannot map host memory (HOST_NUMA VMM)"
                                                   : "host memory (VMMSHIM_HOST_LIMIT, or the host has no more)");
        if (alias) _vs_vmm_unmap_alias(&p->caps, alias + from, segs[i].size); /* no copy reads it */
        stay[ns++] = segs[i];
        out->skipped += a.size;
        if (!out->why_skipped || r == CUDA_ERROR_NOT_SUPPORTED) out->why_skipped = out->why;
        continue;
      }
      CUdeviceptr at = alias ? alias + from : a.va;
      size_t off = 0;
      for (int b = 0; b < a.nbufs; off += a.bufs[b++].size) copier_copy(&cp, a.bufs[b].home, at + off, a.bufs[b].size);
      if (marks) marks[live] = copier_mark(&cp);
      if (alias) al[live].at = at;
    }
    segs[live] = segs[i];
    moved[live++] = a;
  }
  if (alias) release_aliased(p, &cp, marks, al, segs, moved, live, stay, &ns, out);
  else release_in_order(p, copying ? &cp : NULL, marks, segs, moved, live, stay, &ns, out);
  if (marks) copier_close(&cp); /* every copy was before the last mark: nothing new to learn */
  if (alias) { /* no copy reads it now */
    for (int i = 0; i < live; i++)
      if (al[i].at) _vs_vmm_unmap_alias(&p->caps, al[i].at, segs[i].size);
    _vs_vmm_address_free(&p->caps, alias, alias_len);
  }
  free(marks), free(al);
  /* Unmap failures left holes in moved[]: close them. */
  int nmoved = 0;
  for (int i = 0; i < live; i++)
    if (moved[i].size) moved[nmoved++] = moved[i];
  settle(p, moved, nmoved, stay, ns);
  free(segs), free(moved), free(stay);
}

/* A segment's share of the asleep list's counts, added or taken off. Lock held. */
static void asleep_count(vs_asleep_t *l, const vs_asleep_seg_t *s, bool add) {
  size_t mapped = s->mode == VMMSHIM_SLEEP_MAPPED ? s->size : 0, spilled = s->spilled ? s->size : 0;
  if (add) {
    l->bytes += s->size;
    l->host_mapped += mapped;
    l->spilled += spilled;
  } else {
    l->bytes -= s->size;
    l->host_mapped -= mapped;
    l->spilled -= spilled;
  }
}

/* Appends segments to the asleep list. Lock held. False when there is no host memory for the
 * list (nothing appended). */
static bool asleep_append(vs_pool_t *p, const vs_asleep_seg_t *v, size_t n) {
  if (p->asleep.n + n > p->asleep.cap) {
    size_t cap = p->asleep.cap ? p->asleep.cap * 2 : 16;
    while (cap < p->asleep.n + n) cap *= 2;
    vs_asleep_seg_t *nv = realloc(p->asleep.v, cap * sizeof *nv);
    if (!nv) return false;
    p->asleep.v = nv;
    p->asleep.cap = cap;
  }
  for (size_t i = 0; i < n; i++) {
    p->asleep.v[p->asleep.n++] = v[i];
    asleep_count(&p->asleep, &v[i], true);
  }
  return true;
}

/* Puts segments back on the asleep list after a wake that did not take them. Lock not held. */
static void asleep_put_back(vs_pool_t *p, const vs_asleep_seg_t *v, size_t n) {
  if (!n) return;
  pool_lock(p);
  bool ok = asleep_append(p, v, n);
  pool_unlock(p);
  if (!ok)
    _vs_warn("device %d: no host memory to record %zu sleeping ranges; their bytes are lost", (int)p->caps.device, n);
}

/* A wake of a mapped segment failed after its host buffers left its address: they go back
 * there, so the program runs on them as before; failing that, its bytes are kept on the host
 * (touching the address then faults, as in host mode) and the log says so. */
static void serve_from_host_again(vs_pool_t *p, vs_asleep_seg_t *s) {
  if (s->mode != VMMSHIM_SLEEP_MAPPED || map_bufs_at(p, s) == CUDA_SUCCESS) return;
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
    note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* The segments to wake leave the list (nothing else moves them meanwhile); the others stay. */
  for (size_t i = 0; i < total; i++) {
    vs_asleep_seg_t s = p->asleep.v[i];
    if (s.spilled == spilled) {
      a[n++] = s;
      asleep_count(&p->asleep, &s, false);
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
    if (nl) asleep_put_back(p, later, nl); /* a promote: every one of them went there */
    else asleep_put_back(p, a, n);
    note(out, r, spilled ? "no room under the limit (VMMSHIM_LIMIT, the group's) or on the device"
                 : r == CUDA_ERROR_OUT_OF_MEMORY ? "the device has no room for the sleeping memory (or VMMSHIM_LIMIT)"
                                                 : "cuMemCreate failed");
    free(run), free(h), free(later), free(a);
    return r;
  }
  n = nkept;

  vs_copier_t cp;
  copier_open(&cp);
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
    copier_close(&cp);
    asleep_put_back(p, a, n);
    asleep_put_back(p, later, nl);
    free(a), free(later);
    note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
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
      if (s[j].mode == VMMSHIM_SLEEP_MAPPED) unmap_bufs_at(p, &s[j], s[j].nbufs);
    CUresult m = map_device_at(p, s->va, u.size, h[k]);
    for (size_t j = 0; j < u.count; j++) {
      if (m != CUDA_SUCCESS) {
        serve_from_host_again(p, &s[j]);
      } else if (s[j].mode != VMMSHIM_SLEEP_DISCARD) {
        size_t off = 0;
        for (int b = 0; b < s[j].nbufs; off += s[j].bufs[b++].size)
          copier_copy(&cp, s[j].va + off, s[j].bufs[b].home, s[j].bufs[b].size);
      } else if (zero) {
        copier_zero(&cp, s[j].va, s[j].size);
      }
    }
    st[k] = m;
  }
  CUresult c = copier_close(&cp);
  note(out, c, "copying back to the device failed");
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
      note(out, m, spilled ? "mapping device memory in place of host memory failed; it stays on the host"
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
      give_bufs(&p->caps, &s[j]);
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
  bool kept = asleep_append(p, still, nstill) && asleep_append(p, later, nl);
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

/* ------------------------------------------------------------------ past the limit, on the host */

CUresult _vs_pool_grow_host(vs_pool_t *p, int heap_id, size_t size, size_t align, size_t *len_out) {
  *len_out = 0;
  if (!p->caps.host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
  int dev = (int)p->caps.device;
  size_t len = 0;
  vs_block_t *b = _vs_pool_claim_space(p, heap_id, size, align, p->caps.min_granularity, &len);
  if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
  vs_asleep_seg_t a = {b->addr, len, VMMSHIM_SLEEP_MAPPED, 0, NULL, true};
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  bool admitted = _vs_group_spill_admit(dev, len), mapped = false;
  unsigned gen = p->access ? atomic_load(&p->access->gen) : 0;
  if (admitted) {
    a.nbufs = take_bufs(&p->caps, len, &a.bufs, &r);
    if (a.nbufs >= 0) {
      r = map_bufs_at(p, &a); /* they stay at home too, as a mapped sleep's do */
      mapped = r == CUDA_SUCCESS;
      if (!mapped) give_bufs(&p->caps, &a);
    } else {
      a.nbufs = 0;
    }
  }
  /* The new mappings become visible to access changes under their lock, as a growth's do. */
  if (mapped && p->access) {
    _vs_access_lock();
    if (atomic_load(&p->access->gen) != gen) {
      uint64_t rw = atomic_load(&p->access->rw), ro = atomic_load(&p->access->ro);
      _vs_vmm_set_access_devices(&p->caps, a.va, a.size, rw, ro, atomic_load(&p->access->ever) & ~(rw | ro));
    }
  }
  pool_lock(p);
  if (mapped && !asleep_append(p, &a, 1)) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (mapped && r == CUDA_SUCCESS) _vs_block_make_free(p, b);
  VS_POOL_CHECK(p);
  pool_unlock(p);
  if (mapped && p->access) _vs_access_unlock();
  if (r == CUDA_SUCCESS) {
    _vs_info("device %d: %zu bytes past the limit served from host memory at 0x%llx", dev, len, (unsigned long long)a.va);
    *len_out = len;
    return CUDA_SUCCESS;
  }
  if (mapped) { /* no host memory for the record: undone */
    unmap_bufs_at(p, &a, a.nbufs);
    give_bufs(&p->caps, &a);
  }
  if (admitted) _vs_group_spill_return(dev, len);
  pool_lock(p);
  _vs_block_make_hole(p, b);
  VS_POOL_CHECK(p);
  pool_unlock(p);
  return r;
}

/* The FREE block holding [va, va + size) whole, or NULL. Lock held. */
static vs_block_t *free_block_over(vs_pool_t *p, CUdeviceptr va, size_t size) {
  int i = resv_of(p, va);
  for (vs_block_t *b = i >= 0 ? p->resv[i].first : NULL; b; b = b->next)
    if (va >= b->addr && va < b->addr + b->size) return b->state == B_FREE && va + size <= b->addr + b->size ? b : NULL;
  return NULL;
}

/* Carves [va, va + size) out of free block b: the piece BUSY, the rest back in the bins.
 * NULL (b as it was) when there is no host memory for a descriptor. Lock held. */
static vs_block_t *carve_range(vs_pool_t *p, vs_block_t *b, CUdeviceptr va, size_t size) {
  _vs_bin_remove(p, b);
  vs_block_t *mid = b;
  if (va > b->addr) {
    mid = _vs_block_split(p, b, (size_t)(va - b->addr));
    if (!mid) {
      _vs_bin_insert(p, b);
      return NULL;
    }
    _vs_bin_insert(p, b);
  }
  if (mid->size > size) {
    vs_block_t *rest = _vs_block_split(p, mid, size);
    if (!rest) {
      _vs_block_make_free(p, mid); /* merges with the front piece again */
      return NULL;
    }
    _vs_bin_insert(p, rest);
  }
  mid->state = B_BUSY;
  return mid;
}

size_t _vs_pool_drop_idle_spilled(vs_pool_t *p) {
  size_t dropped = 0;
  if (_vs_pool_settle_ordered(p) != CUDA_SUCCESS) return 0; /* blocks freed in stream order may be in use */
  for (;;) {
    vs_asleep_seg_t victim;
    vs_block_t *mid = NULL;
    pool_lock(p);
    for (size_t i = 0; i < p->asleep.n && !mid; i++) {
      vs_asleep_seg_t *s = &p->asleep.v[i];
      vs_block_t *fb = s->spilled ? free_block_over(p, s->va, s->size) : NULL;
      if (!fb || !(mid = carve_range(p, fb, s->va, s->size))) continue;
      victim = *s;
      asleep_count(&p->asleep, s, false);
      p->asleep.v[i] = p->asleep.v[--p->asleep.n];
    }
    pool_unlock(p);
    if (!mid) return dropped;
    unmap_bufs_at(p, &victim, victim.nbufs);
    give_bufs(&p->caps, &victim);
    _vs_group_spill_return((int)p->caps.device, victim.size);
    pool_lock(p);
    _vs_block_make_hole(p, mid);
    VS_POOL_CHECK(p);
    pool_unlock(p);
    dropped += victim.size;
  }
}

CUresult _vs_pool_promote(vs_pool_t *p, vs_move_t *out) {
  size_t dropped = _vs_pool_drop_idle_spilled(p);
  CUresult r = wake_segments(p, false, true, out);
  out->dropped += dropped;
  return r;
}

bool _vs_pool_asleep(vs_pool_t *p, size_t *bytes, size_t *host_mapped) {
  pool_lock(p);
  /* Spilled segments are awake memory that happens to be on the host. */
  size_t b = p->asleep.bytes - p->asleep.spilled, hm = p->asleep.host_mapped - p->asleep.spilled;
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
    if (s->spilled) f->spilled += s->size;
  }
  pool_unlock(p);
}

void _vs_pool_forget_asleep(vs_pool_t *p) {
  for (size_t i = 0; i < p->asleep.n; i++) {
    vs_asleep_seg_t *s = &p->asleep.v[i];
    if (s->spilled) _vs_group_spill_return((int)p->caps.device, s->size);
    if (s->mode == VMMSHIM_SLEEP_MAPPED) unmap_bufs_at(p, s, s->nbufs);
    for (int b = 0; b < s->nbufs; b++) _vs_host_drop(&p->caps, &s->bufs[b], true);
    free(s->bufs);
  }
  free(p->asleep.v);
  p->asleep = (vs_asleep_t){0};
}
