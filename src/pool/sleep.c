/* sleep.c: a pool's memory leaves the device; its blocks stay at their addresses.
 *
 * Sleeping moves every mapped segment (one device handle at one address) out of the pool's
 * segment table into its asleep list (asleep.c), by mode:
 *   discard  the device handle is unmapped and released; the bytes are lost;
 *   host     the bytes are copied into host buffers (host.c), then the device handle goes;
 *   mapped   as host, but the bytes are copied from a second mapping of the device handles
 *            (an alias) while the host buffers take the segments' own addresses (they stay at
 *            home as well), so the program keeps running on that memory, over the link;
 *   disk     the bytes are written to a file (disk.c), all of them before any device handle
 *            goes: when one write fails, every segment stays on the device.
 * The blocks do not move: live blocks stay live at their addresses, free ones stay free (the
 * pool is taken off allocation while it sleeps, alloc.c). Idle whole handles are given back
 * first, as a trim does; segments the caller names (exported blocks that importers still map)
 * stay on the device. The way back is wake.c.
 *
 * The caller has made the pool's context current and waited for the GPU work that may touch the
 * pool (alloc layer). Copies run on two streams of the shim's own, in large pieces (copier.c).
 * The pool lock is never held across a driver call: the segments being moved are in neither
 * list. */
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

static bool overlaps(CUdeviceptr va, size_t size, const CUdeviceptr *skip_va, const size_t *skip_len, int nskip) {
  for (int i = 0; i < nskip; i++)
    if (skip_va[i] < va + size && va < skip_va[i] + skip_len[i]) return true;
  return false;
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
  _vs_asleep_give_bufs(&p->caps, a);
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
  CUresult m = _vs_asleep_map_bufs(p, a);
  if (m != CUDA_SUCCESS) {
    move_note(out, m, "mapping host memory at the segment's address failed; its bytes are kept on the host");
    a->mode = VMMSHIM_SLEEP_HOST;
  }
  return m == CUDA_SUCCESS;
}

/* The device handles go, each once its bytes are on the host: unmapping and (mapped mode)
 * mapping the host buffers overlap the copies of the segments after it. cp NULL: no copies. */
static void release_in_order(vs_pool_t *p, vs_copier_t *cp, vs_copy_mark_t *marks, const vs_seg_t *segs,
                             vs_asleep_seg_t *moved, int live, vs_seg_t *stay, int *ns, vs_move_t *out) {
  /* No memory for the marks: one wait for every copy. */
  CUresult copied = cp && !marks ? _vs_copier_close(cp) : CUDA_SUCCESS;
  for (int i = 0; i < live; i++) {
    vs_asleep_seg_t *a = &moved[i];
    if (marks) {
      CUresult w = _vs_copier_wait(cp, &marks[i]);
      if (copied == CUDA_SUCCESS) copied = w;
    }
    if (copied != CUDA_SUCCESS) {
      /* Its copies (or earlier ones) did not complete: it stays, as every later one does. */
      move_note(out, copied, "copying to host memory failed");
      out->why_skipped = out->why;
      stays(p, a, &segs[i], stay, ns, out);
      continue;
    }
    CUresult r = _vs_vmm_unmap(&p->caps, segs[i].va, segs[i].size);
    if (r != CUDA_SUCCESS) {
      move_note(out, r, "cuMemUnmap failed"); /* still mapped: it stays, as it was */
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
  if (host_at_va) _vs_asleep_unmap_bufs(p, a, a->nbufs);
  return _vs_asleep_map_device(p, sg->va, sg->size, sg->handle) == CUDA_SUCCESS;
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
      move_note(out, r, "cuMemUnmap failed"); /* still mapped: it stays, as it was */
      continue;
    }
    al[i].where = bufs_take_address(p, a, out) ? AT_HOST : UNMAPPED;
  }
  CUresult copied = CUDA_SUCCESS;
  for (int i = 0; i < live; i++) {
    vs_asleep_seg_t *a = &moved[i];
    CUresult w = _vs_copier_wait(cp, &marks[i]);
    if (copied == CUDA_SUCCESS) copied = w;
    if (copied == CUDA_SUCCESS) { /* its copies are over; after a failure the caller waits for all */
      _vs_vmm_unmap_alias(&p->caps, al[i].at, segs[i].size);
      al[i].at = 0;
    } else {
      move_note(out, copied, "copying to host memory failed");
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
      _vs_asleep_give_bufs(&p->caps, a);
      a->mode = VMMSHIM_SLEEP_DISCARD;
    }
    count_moved(a, out);
  }
}

/* One sleep's segments, as its steps hand them on. */
typedef struct vs_sleep_s {
  vs_seg_t *segs;         /* leaving the device: segs[0 .. nm), then those queued, [0 .. live) */
  vs_asleep_seg_t *moved; /* the records of segs[0 .. live), in the same order */
  vs_seg_t *stay;         /* staying on the device as they are: stay[0 .. ns) */
  int nm, live, ns;
} vs_sleep_t;

/* Takes the segments that leave out of the pool's table into s->segs: from now on no trim or
 * access change of another thread touches them. Those that overlap a skip range stay in the
 * table (their order kept). False when there is no host memory for the records (nothing
 * changed). Lock not held. */
static bool take_segments(vs_pool_t *p, const CUdeviceptr *skip_va, const size_t *skip_len, int nskip,
                          vs_sleep_t *s, vs_move_t *out) {
  pool_lock(p);
  size_t n = p->segs.n;
  s->segs = n ? malloc(n * sizeof *s->segs) : NULL;
  s->moved = n ? calloc(n, sizeof *s->moved) : NULL;
  s->stay = n ? malloc(n * sizeof *s->stay) : NULL;
  if (n && (!s->segs || !s->moved || !s->stay)) {
    pool_unlock(p);
    free(s->segs), free(s->moved), free(s->stay);
    move_note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    vs_seg_t sg = p->segs.v[i];
    if (overlaps(sg.va, sg.size, skip_va, skip_len, nskip)) {
      out->skipped += sg.size;
      continue;
    }
    s->segs[s->nm++] = sg;
    p->mapped -= sg.size;
    heap_at(p, sg.va)->mapped -= sg.size;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (overlaps(p->segs.v[i].va, p->segs.v[i].size, skip_va, skip_len, nskip)) p->segs.v[k++] = p->segs.v[i];
  p->segs.n = k;
  pool_unlock(p);
  if (out->skipped) out->why_skipped = "an importer of another process still maps an exported block";
  return true;
}

/* Each leaving segment gets its record; in host and mapped modes (cp not NULL) its bytes are
 * queued to host buffers, all copies in flight at once, a mark after each segment's (when there
 * are marks). A segment whose buffers cannot be had stays on the device. With an alias
 * (alias_open) the copies read the alias, and al[] says where each segment is in it. */
static void queue_segments(vs_pool_t *p, int mode, vs_copier_t *cp, vs_copy_mark_t *marks, vs_aliased_t *al,
                           CUdeviceptr alias, vs_sleep_t *s, vs_move_t *out) {
  size_t from = 0; /* segs[i]'s offset in the alias */
  for (int i = 0; i < s->nm; from += s->segs[i++].size) {
    vs_asleep_seg_t a = {s->segs[i].va, s->segs[i].size, mode, 0, NULL, false, 0};
    if (cp) {
      CUresult r = CUDA_SUCCESS;
      a.nbufs = _vs_asleep_take_bufs(&p->caps, a.size, &a.bufs, &r);
      if (a.nbufs < 0) {
        a.nbufs = 0;
        move_note(out, r, r == CUDA_ERROR_NOT_SUPPORTED ? "the device cannot map host memory (HOST_NUMA VMM)"
                                                        : "host memory (VMMSHIM_HOST_LIMIT, or the host has no more)");
        if (alias) _vs_vmm_unmap_alias(&p->caps, alias + from, s->segs[i].size); /* no copy reads it */
        s->stay[s->ns++] = s->segs[i];
        out->skipped += a.size;
        if (!out->why_skipped || r == CUDA_ERROR_NOT_SUPPORTED) out->why_skipped = out->why;
        continue;
      }
      CUdeviceptr at = alias ? alias + from : a.va;
      size_t off = 0;
      for (int b = 0; b < a.nbufs; off += a.bufs[b++].size) _vs_copier_copy(cp, a.bufs[b].home, at + off, a.bufs[b].size);
      if (marks) marks[s->live] = _vs_copier_mark(cp);
      if (alias) al[s->live].at = at;
    }
    s->segs[s->live] = s->segs[i];
    s->moved[s->live++] = a;
  }
}

/* The alias goes once no copy reads it: the pieces a failed copy kept (al[i].at), then its
 * reservation. */
static void alias_close(vs_pool_t *p, CUdeviceptr alias, size_t len, const vs_aliased_t *al, const vs_sleep_t *s) {
  for (int i = 0; i < s->live; i++)
    if (al[i].at) _vs_vmm_unmap_alias(&p->caps, al[i].at, s->segs[i].size);
  _vs_vmm_address_free(&p->caps, alias, len);
}

/* Disk mode: every leaving segment's bytes go to the pool's file first; then, and only if all
 * of them are there, the device handles go. */
static void sleep_to_disk(vs_pool_t *p, const char *tag, vs_sleep_t *s, vs_move_t *out) {
  uint64_t *offs = s->nm ? calloc((size_t)s->nm, sizeof *offs) : NULL;
  if (s->nm && !offs) move_note(out, CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the shim's records");
  bool written = offs && _vs_disk_out(p, tag, s->segs, s->nm, offs, out);
  for (int i = 0; i < s->nm; i++) {
    const vs_seg_t *sg = &s->segs[i];
    CUresult r = written ? _vs_vmm_unmap(&p->caps, sg->va, sg->size) : CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS) {
      if (written) move_note(out, r, "cuMemUnmap failed"); /* still mapped: it stays, as it was */
      s->stay[s->ns++] = *sg;
      out->skipped += sg->size;
      continue;
    }
    handle_gone(p, sg, out);
    vs_asleep_seg_t a = {sg->va, sg->size, VMMSHIM_SLEEP_DISK, 0, NULL, false, offs[i]};
    count_moved(&a, out);
    s->moved[s->live++] = a;
  }
  if (out->skipped && out->why) out->why_skipped = out->why;
  free(offs);
}

void _vs_pool_sleep(vs_pool_t *p, int mode, const char *tag, const CUdeviceptr *skip_va, const size_t *skip_len,
                    int nskip, vs_move_t *out) {
  *out = (vs_move_t){0};
  /* Whole idle handles go back as a trim gives them: nothing of theirs needs keeping. */
  out->released += _vs_pool_trim(p, 0);
  vs_sleep_t s = {0};
  if (!take_segments(p, skip_va, skip_len, nskip, &s, out)) return;
  if (mode == VMMSHIM_SLEEP_DISK) {
    sleep_to_disk(p, tag, &s, out);
    settle(p, s.moved, s.live, s.stay, s.ns);
    _vs_disk_forget(p, false); /* nothing of it asleep (every unmap failed): the file goes */
    free(s.segs), free(s.moved), free(s.stay);
    return;
  }
  /* Mapped mode reads the bytes from an alias of the segments when it can have one. */
  vs_copier_t cp;
  bool copying = mode != VMMSHIM_SLEEP_DISCARD;
  vs_copy_mark_t *marks = copying && s.nm ? calloc((size_t)s.nm, sizeof *marks) : NULL;
  vs_aliased_t *al = marks && mode == VMMSHIM_SLEEP_MAPPED ? calloc((size_t)s.nm, sizeof *al) : NULL;
  size_t alias_len = 0;
  CUdeviceptr alias = al ? alias_open(p, s.segs, s.nm, &alias_len) : 0;
  if (copying) _vs_copier_open(&cp);
  queue_segments(p, mode, copying ? &cp : NULL, marks, al, alias, &s, out);
  if (alias) release_aliased(p, &cp, marks, al, s.segs, s.moved, s.live, s.stay, &s.ns, out);
  else release_in_order(p, copying ? &cp : NULL, marks, s.segs, s.moved, s.live, s.stay, &s.ns, out);
  if (marks) _vs_copier_close(&cp); /* every copy was before the last mark: nothing new to learn */
  if (alias) alias_close(p, alias, alias_len, al, &s);
  free(marks), free(al);
  /* Unmap failures left holes in moved[]: close them. */
  int nmoved = 0;
  for (int i = 0; i < s.live; i++)
    if (s.moved[i].size) s.moved[nmoved++] = s.moved[i];
  settle(p, s.moved, nmoved, s.stay, s.ns);
  free(s.segs), free(s.moved), free(s.stay);
}
