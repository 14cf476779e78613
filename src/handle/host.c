/* host.c: host memory that sleeping pools keep their bytes in.
 *
 * A host buffer is a host-location handle (cuMemCreate on the host NUMA node nearest the
 * device) mapped at a "home" address of its own reservation, with access for one device, so
 * that the device copies into it and out of it at the link's speed, far faster than new host
 * memory is pinned (docs/sleep.md has the figures); and for the CPU as well where the driver
 * grants it, so that a sleeping tag's bytes can be read in place. A sleeping segment of S
 * bytes is backed by S / VS_HOST_CHUNK buffers of VS_HOST_CHUNK bytes and one of the rest. In the
 * `mapped` mode the buffers are mapped at the segment's own address as well, and leave it at the
 * wake; the copies always go through home.
 *
 * Obtaining host memory costs far more than filling it, so buffers are kept across cycles
 * in a cache (given back by _vs_host_trim, on request) and can be made ahead
 * (VMMSHIM_HOST_RESERVE); VMMSHIM_HOST_LIMIT caps them all, cached and lent. The cache lock is
 * never held across a driver call. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/handles.h"

typedef struct vs_host_node_s {
  vs_host_buf_t buf;
  struct vs_host_node_s *next;
} vs_host_node_t;

static vs_lock_t vs_host_lock = VS_LOCK_INITIALIZER(VS_RANK_HOST, "host buffers");
static vs_host_node_t *vs_host_cache; /* buffers at home, free */
static size_t vs_host_cached, vs_host_lent;

static void host_lock(void) { _vs_lock_take(&vs_host_lock); }
static void host_unlock(void) { _vs_lock_release(&vs_host_lock); }

/* Unmaps a buffer from home, releases it and its reservation. */
static void destroy(const vs_device_caps_t *caps, const vs_host_buf_t *b) {
  _vs_vmm_unmap_host(caps, b->home, b->size);
  _vs_vmm_release(caps, b->handle, b->size);
  _vs_vmm_address_free(caps, b->home, b->size);
}

/* Caps of the device a cached buffer was made for (only the device and granularity are used). */
static vs_device_caps_t caps_of(const vs_device_caps_t *like, int dev) {
  vs_device_caps_t c = *like;
  c.device = dev;
  return c;
}

/* Releases cached buffers (any device) until `need` more bytes fit under VMMSHIM_HOST_LIMIT, or
 * none is left. Returns whether they fit. */
static bool make_room(const vs_device_caps_t *caps, size_t need) {
  uint64_t limit = _vs_option(VS_OPT_HOST_LIMIT);
  for (;;) {
    host_lock();
    bool fits = !limit || (vs_host_cached + vs_host_lent <= limit && need <= limit - vs_host_cached - vs_host_lent);
    vs_host_node_t *victim = NULL;
    if (!fits && vs_host_cache) {
      victim = vs_host_cache;
      vs_host_cache = victim->next;
      vs_host_cached -= victim->buf.size;
    }
    host_unlock();
    if (fits) return true;
    if (!victim) return false;
    vs_device_caps_t c = caps_of(caps, victim->buf.dev);
    destroy(&c, &victim->buf);
    free(victim);
  }
}

/* Whether the driver refused CPU access to host-location memory: asked once, then not again
 * (each refusal would cost a driver call per buffer). */
static atomic_bool vs_host_cpu_refused;

/* Access at home: the device's, and the CPU's in the same call where the driver grants it (the
 * CPU then reads a sleeping tag's bytes in place: vmmshim_host_view). */
static CUresult give_access(const vs_device_caps_t *caps, vs_host_buf_t *b, int numa) {
  if (!atomic_load_explicit(&vs_host_cpu_refused, memory_order_relaxed)) {
    CUresult r = _vs_vmm_set_access_cpu(caps, b->home, b->size, numa);
    if (r == CUDA_SUCCESS) {
      b->cpu = true;
      return r;
    }
    if (!atomic_exchange(&vs_host_cpu_refused, true))
      _vs_info("host buffers: the driver refuses CPU access to host-location memory (%s): they are mapped for the "
               "device only, and vmmshim_host_view answers -ENOTSUP",
               _vs_cu_error_name(r));
  }
  return _vs_vmm_set_access(caps, b->home, b->size);
}

/* A new buffer of size bytes for caps->device, at home. */
static CUresult create(const vs_device_caps_t *caps, size_t size, vs_host_buf_t *out) {
  *out = (vs_host_buf_t){0, 0, size, (int)caps->device, false};
  CUresult r = _vs_vmm_reserve(caps, size, 0, &out->home);
  if (r != CUDA_SUCCESS) return r;
  int numa = -1;
  r = _vs_vmm_create_host(caps, size, &out->handle, &numa);
  if (r == CUDA_SUCCESS) {
    r = _vs_vmm_map_host(caps, out->home, size, out->handle);
    if (r == CUDA_SUCCESS) {
      r = give_access(caps, out, numa);
      if (r != CUDA_SUCCESS) _vs_vmm_unmap_host(caps, out->home, size);
    }
    if (r != CUDA_SUCCESS) _vs_vmm_release(caps, out->handle, size);
  }
  if (r != CUDA_SUCCESS) _vs_vmm_address_free(caps, out->home, size);
  return r;
}

CUresult _vs_host_take(const vs_device_caps_t *caps, size_t size, vs_host_buf_t *out) {
  if (!caps->host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
  host_lock();
  vs_host_node_t **pp = &vs_host_cache;
  while (*pp && ((*pp)->buf.size != size || (*pp)->buf.dev != (int)caps->device)) pp = &(*pp)->next;
  vs_host_node_t *hit = *pp;
  if (hit) {
    *pp = hit->next;
    vs_host_cached -= size;
    vs_host_lent += size;
  }
  host_unlock();
  if (hit) {
    *out = hit->buf;
    free(hit);
    return CUDA_SUCCESS;
  }
  if (!make_room(caps, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = create(caps, size, out);
  if (r != CUDA_SUCCESS) return r;
  host_lock();
  vs_host_lent += size;
  host_unlock();
  return CUDA_SUCCESS;
}

void _vs_host_give(const vs_device_caps_t *caps, const vs_host_buf_t *buf) {
  vs_host_node_t *n = malloc(sizeof *n);
  host_lock();
  vs_host_lent -= buf->size;
  if (n) {
    n->buf = *buf;
    n->next = vs_host_cache;
    vs_host_cache = n;
    vs_host_cached += buf->size;
  }
  host_unlock();
  if (!n) destroy(caps, buf); /* no host memory for the list node: the buffer goes back now */
}

void _vs_host_drop(const vs_device_caps_t *caps, const vs_host_buf_t *buf, bool at_home) {
  host_lock();
  vs_host_lent -= buf->size;
  host_unlock();
  if (at_home) _vs_vmm_unmap_host(caps, buf->home, buf->size);
  _vs_vmm_release(caps, buf->handle, buf->size);
  _vs_vmm_address_free(caps, buf->home, buf->size);
}

size_t _vs_host_trim(const vs_device_caps_t *caps, size_t keep) {
  size_t released = 0;
  for (;;) {
    host_lock();
    vs_host_node_t *victim = NULL;
    if (vs_host_cached > keep && vs_host_cache) {
      victim = vs_host_cache;
      vs_host_cache = victim->next;
      vs_host_cached -= victim->buf.size;
    }
    host_unlock();
    if (!victim) return released + (keep ? 0 : _vs_host_staging_trim());
    vs_device_caps_t c = caps_of(caps, victim->buf.dev);
    destroy(&c, &victim->buf);
    released += victim->buf.size;
    free(victim);
  }
}

CUresult _vs_host_reserve(const vs_device_caps_t *caps, size_t bytes) {
  if (!caps->host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
  size_t chunk = VS_HOST_CHUNK;
  for (size_t made = 0; made < bytes; made += chunk) {
    if (!make_room(caps, chunk)) return CUDA_ERROR_OUT_OF_MEMORY;
    vs_host_buf_t b;
    CUresult r = create(caps, chunk, &b);
    if (r != CUDA_SUCCESS) return r;
    host_lock();
    vs_host_lent += chunk; /* _vs_host_give moves it to the cache */
    host_unlock();
    _vs_host_give(caps, &b);
  }
  return CUDA_SUCCESS;
}

void _vs_host_counts(size_t *cached, size_t *lent) {
  host_lock();
  if (cached) *cached = vs_host_cached;
  if (lent) *lent = vs_host_lent;
  host_unlock();
}

/* ---- staging buffers of disk mode ----
 * VS_DISK_BUFS pinned host buffers (cuMemHostAlloc, portable: any context copies through them)
 * that the CPU reads and writes: the bytes of a disk-mode sleep pass through them on their way
 * to the files, one filling from the device while another is written; a wake keeps reads in
 * flight into several while the ones read are copied to the device. Pinning costs far more than
 * filling, so they are kept across cycles, as the host buffers are, until the kept host memory is
 * given back (_vs_host_trim to 0). They hold no tag's bytes between cycles and are not counted
 * under VMMSHIM_HOST_LIMIT. One disk sleep or wake at a time uses them (taken, then given). */
static void *vs_staging[VS_DISK_BUFS];
static bool vs_staging_lent;

CUresult _vs_host_staging_take(void *bufs[VS_DISK_BUFS]) {
  if (!_vs_cu.cuMemHostAlloc || !_vs_cu.cuMemFreeHost) return CUDA_ERROR_NOT_SUPPORTED;
  void *have[VS_DISK_BUFS];
  host_lock();
  bool busy = vs_staging_lent;
  vs_staging_lent = true;
  memcpy(have, vs_staging, sizeof have);
  host_unlock();
  if (busy) return CUDA_ERROR_NOT_READY;
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < VS_DISK_BUFS && r == CUDA_SUCCESS; i++)
    if (!have[i]) r = _vs_cu.cuMemHostAlloc(&have[i], VS_DISK_PIECE, CU_MEMHOSTALLOC_PORTABLE);
  host_lock();
  memcpy(vs_staging, have, sizeof have);
  if (r != CUDA_SUCCESS) vs_staging_lent = false;
  host_unlock();
  memcpy(bufs, have, sizeof have);
  return r;
}

void _vs_host_staging_give(void) {
  host_lock();
  vs_staging_lent = false;
  host_unlock();
}

size_t _vs_host_staging_trim(void) {
  void *have[VS_DISK_BUFS] = {NULL};
  host_lock();
  if (!vs_staging_lent) {
    memcpy(have, vs_staging, sizeof have);
    memset(vs_staging, 0, sizeof vs_staging);
  }
  host_unlock();
  size_t released = 0;
  for (int i = 0; i < VS_DISK_BUFS; i++) {
    if (have[i] && _vs_cu.cuMemFreeHost(have[i]) == CUDA_SUCCESS) {
      released += VS_DISK_PIECE;
      have[i] = NULL;
    }
  }
  host_lock(); /* one that could not be freed (no context now) is kept for the next time */
  for (int i = 0; i < VS_DISK_BUFS; i++)
    if (have[i] && !vs_staging[i]) vs_staging[i] = have[i];
  host_unlock();
  return released;
}
