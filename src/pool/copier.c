/* copier.c: the copies of a sleep and a wake (sleep.c, wake.c).
 *
 * Two streams of the shim's own in the current context, a copy engine each: copies go in
 * pieces of at most 256 MiB, alternating streams. A mark is a point in both streams (an event on
 * each), so that a sleep can wait for one segment's copies alone and change its mappings while
 * later segments still copy. Disk mode copies through pinned staging buffers (disk.c). Without
 * streams or events the copies run on the default stream and
 * a wait covers them all. Every call here is a driver call: the pool lock is not held. */
#include "vmmshim/pool_internal.h"

void _vs_copier_open(vs_copier_t *c) {
  *c = (vs_copier_t){{NULL, NULL}, 0, 0, CUDA_SUCCESS};
  for (int i = 0; i < 2 && _vs_cu.cuStreamCreate; i++)
    if (_vs_cu.cuStreamCreate(&c->s[c->n], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) c->n++;
}

/* The stream of the next copy: the copier's streams in turn, else the default stream. */
static CUstream next_stream(vs_copier_t *c) { return c->n ? c->s[c->next++ % c->n] : NULL; }

void _vs_copier_copy(vs_copier_t *c, CUdeviceptr dst, CUdeviceptr src, size_t n) {
  enum { PIECE = 256 << 20 };
  for (size_t off = 0; off < n && c->err == CUDA_SUCCESS; off += PIECE) {
    size_t len = n - off < PIECE ? n - off : PIECE;
    CUstream s = next_stream(c);
    c->err = _vs_cu.cuMemcpyDtoDAsync ? _vs_cu.cuMemcpyDtoDAsync(dst + off, src + off, len, s) : CUDA_ERROR_NOT_SUPPORTED;
  }
}

/* Disk mode's pieces (disk.c): one copy between the device and a pinned staging buffer, on the
 * next stream. */
void _vs_copier_to_host(vs_copier_t *c, void *dst, CUdeviceptr src, size_t n) {
  CUstream s = next_stream(c);
  if (c->err == CUDA_SUCCESS)
    c->err = _vs_cu.cuMemcpyDtoHAsync ? _vs_cu.cuMemcpyDtoHAsync(dst, src, n, s) : CUDA_ERROR_NOT_SUPPORTED;
}

void _vs_copier_from_host(vs_copier_t *c, CUdeviceptr dst, const void *src, size_t n) {
  CUstream s = next_stream(c);
  if (c->err == CUDA_SUCCESS)
    c->err = _vs_cu.cuMemcpyHtoDAsync ? _vs_cu.cuMemcpyHtoDAsync(dst, src, n, s) : CUDA_ERROR_NOT_SUPPORTED;
}

void _vs_copier_zero(vs_copier_t *c, CUdeviceptr dst, size_t n) {
  CUstream s = next_stream(c);
  if (c->err == CUDA_SUCCESS)
    c->err = _vs_cu.cuMemsetD8Async ? _vs_cu.cuMemsetD8Async(dst, 0, n, s) : CUDA_ERROR_NOT_SUPPORTED;
}

vs_copy_mark_t _vs_copier_mark(vs_copier_t *c) {
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

CUresult _vs_copier_wait(vs_copier_t *c, vs_copy_mark_t *m) {
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

CUresult _vs_copier_close(vs_copier_t *c) {
  CUresult r = c->err;
  for (int i = 0; i < c->n; i++) {
    CUresult w = _vs_cu.cuStreamSynchronize(c->s[i]);
    if (r == CUDA_SUCCESS) r = w;
    _vs_cu.cuStreamDestroy(c->s[i]);
  }
  if (!c->n && r == CUDA_SUCCESS) r = _vs_cu.cuStreamSynchronize(NULL);
  return r;
}
