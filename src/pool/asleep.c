/* asleep.c: the records of a pool's memory that is off the device, and its host memory.
 *
 * A segment whose device handle left (a sleep, sleep.c) or that was never on the device (a
 * growth past the limit served from host memory, VMMSHIM_ON_LIMIT=host) is on the pool's asleep
 * list (pool_internal.h: vs_asleep_seg_t), out of its segment table. This file owns that list
 * and its counts, the host buffers that hold such a segment's bytes (host.c, one layer down) and
 * their mappings at the segment's own address, and the questions the layer above asks about it.
 * sleep.c and wake.c move segments onto and off the list; what they share with each other is
 * here (mapping a device handle at an address) and in copier.c (the copies). */
#include <errno.h>
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

/* ------------------------------------------------------------------ host buffers */

/* Host buffers for a segment of size bytes: VS_HOST_CHUNK each, the last the rest. Returns the
 * count, or -1 (nothing kept) when host memory cannot be had. */
int _vs_asleep_take_bufs(const vs_device_caps_t *caps, size_t size, vs_host_buf_t **out, CUresult *err) {
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

void _vs_asleep_give_bufs(const vs_device_caps_t *caps, vs_asleep_seg_t *a) {
  for (int i = 0; i < a->nbufs; i++) _vs_host_give(caps, &a->bufs[i]);
  free(a->bufs);
  a->bufs = NULL;
  a->nbufs = 0;
}

/* Unmaps a segment's first n host buffers from its own address (they stay at home). */
void _vs_asleep_unmap_bufs(vs_pool_t *p, const vs_asleep_seg_t *a, int n) {
  size_t off = 0;
  for (int k = 0; k < n; off += a->bufs[k++].size) _vs_vmm_unmap_host(&p->caps, a->va + off, a->bufs[k].size);
}

/* Maps a segment's host buffers at its own address, back to back, with the access of the
 * pool's owner and peers. On failure whatever was mapped there is unmapped again. */
CUresult _vs_asleep_map_bufs(vs_pool_t *p, const vs_asleep_seg_t *a) {
  CUresult r = CUDA_SUCCESS;
  int i = 0;
  size_t off = 0;
  for (; i < a->nbufs && r == CUDA_SUCCESS; off += a->bufs[i++].size)
    r = _vs_vmm_map_host(&p->caps, a->va + off, a->bufs[i].size, a->bufs[i].handle);
  if (r == CUDA_SUCCESS) {
    uint64_t rw, ro;
    access_now(p, &rw, &ro);
    r = _vs_vmm_set_access_devices(&p->caps, a->va, a->size, rw, ro, 0);
  } else {
    i--; /* the one that failed is not mapped */
  }
  if (r != CUDA_SUCCESS) _vs_asleep_unmap_bufs(p, a, i);
  return r;
}

/* Maps a device handle at va with the access of the pool's owner and peers now; on failure
 * nothing stays mapped there. */
CUresult _vs_asleep_map_device(vs_pool_t *p, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
  uint64_t rw, ro;
  access_now(p, &rw, &ro);
  CUresult r = _vs_vmm_map(&p->caps, va, size, h);
  if (r == CUDA_SUCCESS) {
    r = _vs_vmm_set_access_devices(&p->caps, va, size, rw, ro, 0);
    if (r != CUDA_SUCCESS) _vs_vmm_unmap(&p->caps, va, size);
  }
  return r;
}

/* ------------------------------------------------------------------ the asleep list */

/* A segment's share of the asleep list's counts, added or taken off. Lock held. */
void _vs_asleep_count(vs_asleep_t *l, const vs_asleep_seg_t *s, bool add) {
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
bool _vs_asleep_append(vs_pool_t *p, const vs_asleep_seg_t *v, size_t n) {
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
    _vs_asleep_count(&p->asleep, &v[i], true);
  }
  return true;
}

/* Puts segments back on the asleep list after a wake that did not take them. Lock not held. */
void _vs_asleep_put_back(vs_pool_t *p, const vs_asleep_seg_t *v, size_t n) {
  if (!n) return;
  pool_lock(p);
  bool ok = _vs_asleep_append(p, v, n);
  pool_unlock(p);
  if (!ok)
    _vs_warn("device %d: no host memory to record %zu sleeping ranges; their bytes are lost", (int)p->caps.device, n);
}

/* ------------------------------------------------------------------ past the limit, on the host */

CUresult _vs_pool_grow_host(vs_pool_t *p, int heap_id, size_t size, size_t align, size_t *len_out) {
  *len_out = 0;
  if (!p->caps.host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
  int dev = (int)p->caps.device;
  size_t len = 0;
  vs_block_t *b = _vs_pool_claim_space(p, heap_id, size, align, p->caps.min_granularity, &len);
  if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
  vs_asleep_seg_t a = {b->addr, len, VMMSHIM_SLEEP_MAPPED, 0, NULL, true, 0};
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  bool admitted = _vs_group_spill_admit(dev, len), mapped = false;
  unsigned gen = p->access ? atomic_load(&p->access->gen) : 0;
  if (admitted) {
    a.nbufs = _vs_asleep_take_bufs(&p->caps, len, &a.bufs, &r);
    if (a.nbufs >= 0) {
      r = _vs_asleep_map_bufs(p, &a); /* they stay at home too, as a mapped sleep's do */
      mapped = r == CUDA_SUCCESS;
      if (!mapped) _vs_asleep_give_bufs(&p->caps, &a);
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
  if (mapped && !_vs_asleep_append(p, &a, 1)) r = CUDA_ERROR_OUT_OF_MEMORY;
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
    _vs_asleep_unmap_bufs(p, &a, a.nbufs);
    _vs_asleep_give_bufs(&p->caps, &a);
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
      _vs_asleep_count(&p->asleep, s, false);
      p->asleep.v[i] = p->asleep.v[--p->asleep.n];
    }
    pool_unlock(p);
    if (!mid) return dropped;
    _vs_asleep_unmap_bufs(p, &victim, victim.nbufs);
    _vs_asleep_give_bufs(&p->caps, &victim);
    _vs_group_spill_return((int)p->caps.device, victim.size);
    pool_lock(p);
    _vs_block_make_hole(p, mid);
    VS_POOL_CHECK(p);
    pool_unlock(p);
    dropped += victim.size;
  }
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

/* The host buffer of segment s that holds byte *off of it, *off then its offset in that buffer;
 * NULL past the buffers' end. */
static const vs_host_buf_t *buf_at(const vs_asleep_seg_t *s, size_t *off) {
  for (int b = 0; b < s->nbufs; *off -= s->bufs[b++].size)
    if (*off < s->bufs[b].size) return &s->bufs[b];
  return NULL;
}

bool _vs_pool_host_copy_at(vs_pool_t *p, CUdeviceptr addr, CUdeviceptr *home, size_t *len) {
  bool hit = false;
  pool_lock(p);
  for (size_t i = 0; i < p->asleep.n && !hit; i++) {
    const vs_asleep_seg_t *s = &p->asleep.v[i];
    if (s->spilled || !s->nbufs || addr < s->va || addr >= s->va + s->size) continue;
    size_t off = addr - s->va;
    const vs_host_buf_t *hb = buf_at(s, &off);
    if (hb) {
      *home = hb->home + off;
      *len = hb->size - off;
      hit = true;
    }
  }
  pool_unlock(p);
  return hit;
}

int _vs_pool_host_view(vs_pool_t *p, CUdeviceptr addr, size_t size, CUdeviceptr *home) {
  int rc = -ENOENT;
  pool_lock(p);
  for (size_t i = 0; i < p->asleep.n && rc == -ENOENT; i++) {
    const vs_asleep_seg_t *s = &p->asleep.v[i];
    if (addr < s->va || addr >= s->va + s->size) continue;
    if (s->spilled) break; /* awake memory that happens to be on the host */
    rc = -EXDEV;           /* discarded, on disk, or not in one buffer */
    if (!s->nbufs || size > s->va + s->size - addr) break;
    size_t off = addr - s->va;
    const vs_host_buf_t *hb = buf_at(s, &off);
    if (hb && size <= hb->size - off) {
      rc = hb->cpu ? 0 : -ENOTSUP;
      if (!rc) *home = hb->home + off;
    }
  }
  pool_unlock(p);
  return rc;
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
    else if (s->mode == VMMSHIM_SLEEP_DISK) f->disk += s->size;
    else f->host_mapped += s->size;
    if (s->spilled) f->spilled += s->size;
  }
  pool_unlock(p);
}

void _vs_pool_forget_asleep(vs_pool_t *p) {
  for (size_t i = 0; i < p->asleep.n; i++) {
    vs_asleep_seg_t *s = &p->asleep.v[i];
    if (s->spilled) _vs_group_spill_return((int)p->caps.device, s->size);
    if (s->mode == VMMSHIM_SLEEP_MAPPED) _vs_asleep_unmap_bufs(p, s, s->nbufs);
    for (int b = 0; b < s->nbufs; b++) _vs_host_drop(&p->caps, &s->bufs[b], true);
    free(s->bufs);
  }
  _vs_disk_forget(p, true);
  free(p->asleep.v);
  p->asleep = (vs_asleep_t){0};
}
