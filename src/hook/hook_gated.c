/* hook_gated.c: the driver entry points that submit GPU work.
 *
 * Launches, copies, memsets, stream memory operations, batched copies and decompression: each
 * names its stream to order.c (whether all of the program's work goes to one stream), then
 * waits at the gate (gate.c) while a sleep or a wake moves memory under it, then calls the
 * driver. The hooks are generated from one list (VS_GATED below); hook_drv.c hands them out to
 * lookups (cuGetProcAddress, dlsym) after its own hooks, from the table made here. */
#include "vmmshim/hook.h"

/* cuda.h maps these to their newest ABI; the older ones are exported too (VS_GATED_MORE). */
#undef cuMemcpyBatchAsync
#undef cuMemcpy3DBatchAsync
#undef cuStreamWriteValue32
#undef cuStreamWaitValue32
#undef cuStreamWriteValue64
#undef cuStreamWaitValue64
#undef cuStreamBatchMemOp

/* The entry points that submit GPU work, which wait at the gate while the shim moves memory
 * (gate.c) and name their stream to order.c: id, base name, version, per-thread variant,
 * exported symbol, the stream (NULL: the legacy stream, or the thread's own in a per-thread
 * variant; VS_ORDER_ELSEWHERE: work across contexts, or waiting for another stream's),
 * parameters, arguments. Versions are those at which each function took the arguments written
 * here; where a function has several, the newest comes first (a lookup takes the first whose
 * version it reaches). */
#define VS_FN_LAUNCH (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                      unsigned shmem, CUstream s, void **params, void **extra)
#define VS_AR_LAUNCH (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra)
#define VS_GATED(X)                                                                                             \
  X(LAUNCH, "cuLaunchKernel", 4000, 0, cuLaunchKernel, s, VS_FN_LAUNCH, VS_AR_LAUNCH)                             \
  X(LAUNCH_PTSZ, "cuLaunchKernel", 4000, 1, cuLaunchKernel_ptsz, s, VS_FN_LAUNCH, VS_AR_LAUNCH)                   \
  X(LAUNCH_EX, "cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx, (c ? c->hStream : NULL),                                               \
    (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (c, f, params, extra))              \
  X(LAUNCH_EX_PTSZ, "cuLaunchKernelEx", 11060, 1, cuLaunchKernelEx_ptsz, (c ? c->hStream : NULL),                                     \
    (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (c, f, params, extra))              \
  X(LAUNCH_COOP, "cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel, s,                            \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem, \
     CUstream s, void **params), (f, gx, gy, gz, bx, by, bz, shmem, s, params))                              \
  X(LAUNCH_COOP_PTSZ, "cuLaunchCooperativeKernel", 9000, 1, cuLaunchCooperativeKernel_ptsz, s,                  \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem, \
     CUstream s, void **params), (f, gx, gy, gz, bx, by, bz, shmem, s, params))                              \
  X(GRAPH_LAUNCH, "cuGraphLaunch", 10000, 0, cuGraphLaunch, s, (CUgraphExec g, CUstream s), (g, s))             \
  X(GRAPH_LAUNCH_PTSZ, "cuGraphLaunch", 10000, 1, cuGraphLaunch_ptsz, s, (CUgraphExec g, CUstream s), (g, s))   \
  X(MEMCPY, "cuMemcpy", 4000, 0, cuMemcpy, NULL, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))              \
  X(MEMCPY_PTDS, "cuMemcpy", 4000, 1, cuMemcpy_ptds, NULL, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))    \
  X(MEMCPY_ASYNC, "cuMemcpyAsync", 4000, 0, cuMemcpyAsync, h, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), \
    (d, s, n, h))                                                                                              \
  X(MEMCPY_ASYNC_PTSZ, "cuMemcpyAsync", 4000, 1, cuMemcpyAsync_ptsz, h,                                          \
    (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))                                       \
  X(HTOD, "cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2, NULL, (CUdeviceptr d, const void *s, size_t n), (d, s, n))     \
  X(HTOD_PTDS, "cuMemcpyHtoD", 3020, 1, cuMemcpyHtoD_v2_ptds, NULL, (CUdeviceptr d, const void *s, size_t n), (d, s, n)) \
  X(DTOH, "cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2, NULL, (void *d, CUdeviceptr s, size_t n), (d, s, n))           \
  X(DTOH_PTDS, "cuMemcpyDtoH", 3020, 1, cuMemcpyDtoH_v2_ptds, NULL, (void *d, CUdeviceptr s, size_t n), (d, s, n)) \
  X(DTOD, "cuMemcpyDtoD", 3020, 0, cuMemcpyDtoD_v2, NULL, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))     \
  X(DTOD_PTDS, "cuMemcpyDtoD", 3020, 1, cuMemcpyDtoD_v2_ptds, NULL, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n)) \
  X(HTOD_ASYNC, "cuMemcpyHtoDAsync", 3020, 0, cuMemcpyHtoDAsync_v2, h,                                           \
    (CUdeviceptr d, const void *s, size_t n, CUstream h), (d, s, n, h))                                       \
  X(HTOD_ASYNC_PTSZ, "cuMemcpyHtoDAsync", 3020, 1, cuMemcpyHtoDAsync_v2_ptsz, h,                                 \
    (CUdeviceptr d, const void *s, size_t n, CUstream h), (d, s, n, h))                                       \
  X(DTOH_ASYNC, "cuMemcpyDtoHAsync", 3020, 0, cuMemcpyDtoHAsync_v2, h, (void *d, CUdeviceptr s, size_t n, CUstream h), \
    (d, s, n, h))                                                                                              \
  X(DTOH_ASYNC_PTSZ, "cuMemcpyDtoHAsync", 3020, 1, cuMemcpyDtoHAsync_v2_ptsz, h,                                 \
    (void *d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))                                             \
  X(DTOD_ASYNC, "cuMemcpyDtoDAsync", 3020, 0, cuMemcpyDtoDAsync_v2, h,                                           \
    (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))                                       \
  X(DTOD_ASYNC_PTSZ, "cuMemcpyDtoDAsync", 3020, 1, cuMemcpyDtoDAsync_v2_ptsz, h,                                 \
    (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))                                       \
  X(MEMCPY2D, "cuMemcpy2D", 3020, 0, cuMemcpy2D_v2, NULL, (const CUDA_MEMCPY2D *c), (c))                           \
  X(MEMCPY2D_PTDS, "cuMemcpy2D", 3020, 1, cuMemcpy2D_v2_ptds, NULL, (const CUDA_MEMCPY2D *c), (c))                 \
  X(MEMCPY2D_ASYNC, "cuMemcpy2DAsync", 3020, 0, cuMemcpy2DAsync_v2, h, (const CUDA_MEMCPY2D *c, CUstream h), (c, h)) \
  X(MEMCPY2D_ASYNC_PTSZ, "cuMemcpy2DAsync", 3020, 1, cuMemcpy2DAsync_v2_ptsz, h, (const CUDA_MEMCPY2D *c, CUstream h), \
    (c, h))                                                                                                    \
  X(MEMCPY3D, "cuMemcpy3D", 3020, 0, cuMemcpy3D_v2, NULL, (const CUDA_MEMCPY3D *c), (c))                           \
  X(MEMCPY3D_PTDS, "cuMemcpy3D", 3020, 1, cuMemcpy3D_v2_ptds, NULL, (const CUDA_MEMCPY3D *c), (c))                 \
  X(MEMCPY3D_ASYNC, "cuMemcpy3DAsync", 3020, 0, cuMemcpy3DAsync_v2, h, (const CUDA_MEMCPY3D *c, CUstream h), (c, h)) \
  X(MEMCPY3D_ASYNC_PTSZ, "cuMemcpy3DAsync", 3020, 1, cuMemcpy3DAsync_v2_ptsz, h, (const CUDA_MEMCPY3D *c, CUstream h), \
    (c, h))                                                                                                    \
  X(MEMCPY_PEER, "cuMemcpyPeer", 4000, 0, cuMemcpyPeer, VS_ORDER_ELSEWHERE,                                                      \
    (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n), (d, dc, s, sc, n))                  \
  X(MEMCPY_PEER_PTDS, "cuMemcpyPeer", 4000, 1, cuMemcpyPeer_ptds, VS_ORDER_ELSEWHERE,                                            \
    (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n), (d, dc, s, sc, n))                  \
  X(MEMCPY_PEER_ASYNC, "cuMemcpyPeerAsync", 4000, 0, cuMemcpyPeerAsync, VS_ORDER_ELSEWHERE,                                      \
    (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream h), (d, dc, s, sc, n, h))   \
  X(MEMCPY_PEER_ASYNC_PTSZ, "cuMemcpyPeerAsync", 4000, 1, cuMemcpyPeerAsync_ptsz, VS_ORDER_ELSEWHERE,                            \
    (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream h), (d, dc, s, sc, n, h))   \
  X(MEMSET8, "cuMemsetD8", 3020, 0, cuMemsetD8_v2, NULL, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))    \
  X(MEMSET8_PTDS, "cuMemsetD8", 3020, 1, cuMemsetD8_v2_ptds, NULL, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n)) \
  X(MEMSET16, "cuMemsetD16", 3020, 0, cuMemsetD16_v2, NULL, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n)) \
  X(MEMSET16_PTDS, "cuMemsetD16", 3020, 1, cuMemsetD16_v2_ptds, NULL, (CUdeviceptr d, unsigned short v, size_t n),  \
    (d, v, n))                                                                                                 \
  X(MEMSET32, "cuMemsetD32", 3020, 0, cuMemsetD32_v2, NULL, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))   \
  X(MEMSET32_PTDS, "cuMemsetD32", 3020, 1, cuMemsetD32_v2_ptds, NULL, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n)) \
  X(MEMSET8_ASYNC, "cuMemsetD8Async", 3020, 0, cuMemsetD8Async, h,                                               \
    (CUdeviceptr d, unsigned char v, size_t n, CUstream h), (d, v, n, h))                                     \
  X(MEMSET8_ASYNC_PTSZ, "cuMemsetD8Async", 3020, 1, cuMemsetD8Async_ptsz, h,                                     \
    (CUdeviceptr d, unsigned char v, size_t n, CUstream h), (d, v, n, h))                                     \
  X(MEMSET16_ASYNC, "cuMemsetD16Async", 3020, 0, cuMemsetD16Async, h,                                            \
    (CUdeviceptr d, unsigned short v, size_t n, CUstream h), (d, v, n, h))                                    \
  X(MEMSET16_ASYNC_PTSZ, "cuMemsetD16Async", 3020, 1, cuMemsetD16Async_ptsz, h,                                  \
    (CUdeviceptr d, unsigned short v, size_t n, CUstream h), (d, v, n, h))                                    \
  X(MEMSET32_ASYNC, "cuMemsetD32Async", 3020, 0, cuMemsetD32Async, h,                                            \
    (CUdeviceptr d, unsigned int v, size_t n, CUstream h), (d, v, n, h))                                      \
  X(MEMSET32_ASYNC_PTSZ, "cuMemsetD32Async", 3020, 1, cuMemsetD32Async_ptsz, h,                                  \
    (CUdeviceptr d, unsigned int v, size_t n, CUstream h), (d, v, n, h))                                      \
  VS_GATED_2D(X)                                                                                                \
  VS_GATED_MORE(X)

/* 2D memsets and 3D peer copies (the same gate; a separate list only to keep lines short). */
#define VS_FN_SET2D(T) (CUdeviceptr d, size_t pitch, T v, size_t w, size_t rows)
#define VS_FN_SET2D_ASYNC(T) (CUdeviceptr d, size_t pitch, T v, size_t w, size_t rows, CUstream h)
#define VS_AR_SET2D (d, pitch, v, w, rows)
#define VS_AR_SET2D_ASYNC (d, pitch, v, w, rows, h)
#define VS_GATED_2D(X)                                                                                          \
  X(SET2D8, "cuMemsetD2D8", 3020, 0, cuMemsetD2D8_v2, NULL, VS_FN_SET2D(unsigned char), VS_AR_SET2D)                \
  X(SET2D8_PTDS, "cuMemsetD2D8", 3020, 1, cuMemsetD2D8_v2_ptds, NULL, VS_FN_SET2D(unsigned char), VS_AR_SET2D)      \
  X(SET2D16, "cuMemsetD2D16", 3020, 0, cuMemsetD2D16_v2, NULL, VS_FN_SET2D(unsigned short), VS_AR_SET2D)            \
  X(SET2D16_PTDS, "cuMemsetD2D16", 3020, 1, cuMemsetD2D16_v2_ptds, NULL, VS_FN_SET2D(unsigned short), VS_AR_SET2D)  \
  X(SET2D32, "cuMemsetD2D32", 3020, 0, cuMemsetD2D32_v2, NULL, VS_FN_SET2D(unsigned int), VS_AR_SET2D)              \
  X(SET2D32_PTDS, "cuMemsetD2D32", 3020, 1, cuMemsetD2D32_v2_ptds, NULL, VS_FN_SET2D(unsigned int), VS_AR_SET2D)    \
  X(SET2D8_ASYNC, "cuMemsetD2D8Async", 3020, 0, cuMemsetD2D8Async, h, VS_FN_SET2D_ASYNC(unsigned char),          \
    VS_AR_SET2D_ASYNC)                                                                                         \
  X(SET2D8_ASYNC_PTSZ, "cuMemsetD2D8Async", 3020, 1, cuMemsetD2D8Async_ptsz, h, VS_FN_SET2D_ASYNC(unsigned char), \
    VS_AR_SET2D_ASYNC)                                                                                         \
  X(SET2D16_ASYNC, "cuMemsetD2D16Async", 3020, 0, cuMemsetD2D16Async, h, VS_FN_SET2D_ASYNC(unsigned short),      \
    VS_AR_SET2D_ASYNC)                                                                                         \
  X(SET2D16_ASYNC_PTSZ, "cuMemsetD2D16Async", 3020, 1, cuMemsetD2D16Async_ptsz, h,                               \
    VS_FN_SET2D_ASYNC(unsigned short), VS_AR_SET2D_ASYNC)                                                      \
  X(SET2D32_ASYNC, "cuMemsetD2D32Async", 3020, 0, cuMemsetD2D32Async, h, VS_FN_SET2D_ASYNC(unsigned int),        \
    VS_AR_SET2D_ASYNC)                                                                                         \
  X(SET2D32_ASYNC_PTSZ, "cuMemsetD2D32Async", 3020, 1, cuMemsetD2D32Async_ptsz, h, VS_FN_SET2D_ASYNC(unsigned int), \
    VS_AR_SET2D_ASYNC)                                                                                         \
  X(MEMCPY3D_PEER, "cuMemcpy3DPeer", 4000, 0, cuMemcpy3DPeer, VS_ORDER_ELSEWHERE, (const CUDA_MEMCPY3D_PEER *c), (c))             \
  X(MEMCPY3D_PEER_PTDS, "cuMemcpy3DPeer", 4000, 1, cuMemcpy3DPeer_ptds, VS_ORDER_ELSEWHERE, (const CUDA_MEMCPY3D_PEER *c), (c))   \
  X(MEMCPY3D_PEER_ASYNC, "cuMemcpy3DPeerAsync", 4000, 0, cuMemcpy3DPeerAsync, VS_ORDER_ELSEWHERE,                                 \
    (const CUDA_MEMCPY3D_PEER *c, CUstream h), (c, h))                                                         \
  X(MEMCPY3D_PEER_ASYNC_PTSZ, "cuMemcpy3DPeerAsync", 4000, 1, cuMemcpy3DPeerAsync_ptsz, VS_ORDER_ELSEWHERE,                       \
    (const CUDA_MEMCPY3D_PEER *c, CUstream h), (c, h))

/* Stream memory operations, copies to and from arrays, batched copies, decompression and the
 * old launches: each touches device memory too. A wait for a value (or a batch that may hold
 * one) waits for another stream's work. */
/* An entry and its per-thread-stream variant (exported as SYM_ptsz). */
#define VS_BOTH(X, id, base, ver, sym, on, params, args) \
  X(id, base, ver, 0, sym, on, params, args) X(id##_PTSZ, base, ver, 1, sym##_ptsz, on, params, args)
#define VS_FN_VALUE(T) (CUstream h, CUdeviceptr a, T v, unsigned int fl)
#define VS_AR_VALUE (h, a, v, fl)
#define VS_FN_MEMOP (CUstream h, unsigned int n, CUstreamBatchMemOpParams *ops, unsigned int fl)
#define VS_AR_MEMOP (h, n, ops, fl)
#define VS_FN_BATCH_COPY (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs, \
                          size_t *attr_idxs, size_t n_attrs, CUstream h)
#define VS_AR_BATCH_COPY (dsts, srcs, sizes, count, attrs, attr_idxs, n_attrs, h)
#define VS_FN_BATCH_COPY1 (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs, \
                           size_t *attr_idxs, size_t n_attrs, size_t *fail_idx, CUstream h)
#define VS_AR_BATCH_COPY1 (dsts, srcs, sizes, count, attrs, attr_idxs, n_attrs, fail_idx, h)
#define VS_FN_BATCH_3D (size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long fl, CUstream h)
#define VS_FN_BATCH_3D1 (size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail_idx, unsigned long long fl, CUstream h)
#define VS_FN_DECOMPRESS (CUmemDecompressParams *ps, size_t n, unsigned int fl, size_t *err_idx, CUstream h)
#define VS_GATED_MORE(X)                                                                                        \
  VS_BOTH(X, WRITE32, "cuStreamWriteValue32", 11070, cuStreamWriteValue32_v2, h, VS_FN_VALUE(cuuint32_t), VS_AR_VALUE) \
  VS_BOTH(X, WRITE32_V1, "cuStreamWriteValue32", 8000, cuStreamWriteValue32, h, VS_FN_VALUE(cuuint32_t), VS_AR_VALUE) \
  VS_BOTH(X, WRITE64, "cuStreamWriteValue64", 11070, cuStreamWriteValue64_v2, h, VS_FN_VALUE(cuuint64_t), VS_AR_VALUE) \
  VS_BOTH(X, WRITE64_V1, "cuStreamWriteValue64", 9000, cuStreamWriteValue64, h, VS_FN_VALUE(cuuint64_t), VS_AR_VALUE) \
  VS_BOTH(X, WAIT32, "cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2, VS_ORDER_ELSEWHERE, VS_FN_VALUE(cuuint32_t), \
          VS_AR_VALUE)                                                                                         \
  VS_BOTH(X, WAIT32_V1, "cuStreamWaitValue32", 8000, cuStreamWaitValue32, VS_ORDER_ELSEWHERE, VS_FN_VALUE(cuuint32_t), \
          VS_AR_VALUE)                                                                                         \
  VS_BOTH(X, WAIT64, "cuStreamWaitValue64", 11070, cuStreamWaitValue64_v2, VS_ORDER_ELSEWHERE, VS_FN_VALUE(cuuint64_t), \
          VS_AR_VALUE)                                                                                         \
  VS_BOTH(X, WAIT64_V1, "cuStreamWaitValue64", 9000, cuStreamWaitValue64, VS_ORDER_ELSEWHERE, VS_FN_VALUE(cuuint64_t), \
          VS_AR_VALUE)                                                                                         \
  VS_BOTH(X, MEMOP, "cuStreamBatchMemOp", 11070, cuStreamBatchMemOp_v2, VS_ORDER_ELSEWHERE, VS_FN_MEMOP, VS_AR_MEMOP) \
  VS_BOTH(X, MEMOP_V1, "cuStreamBatchMemOp", 8000, cuStreamBatchMemOp, VS_ORDER_ELSEWHERE, VS_FN_MEMOP, VS_AR_MEMOP) \
  X(DTOA, "cuMemcpyDtoA", 3020, 0, cuMemcpyDtoA_v2, NULL, (CUarray a, size_t off, CUdeviceptr d, size_t n),      \
    (a, off, d, n))                                                                                            \
  X(DTOA_PTDS, "cuMemcpyDtoA", 3020, 1, cuMemcpyDtoA_v2_ptds, NULL, (CUarray a, size_t off, CUdeviceptr d, size_t n), \
    (a, off, d, n))                                                                                            \
  X(ATOD, "cuMemcpyAtoD", 3020, 0, cuMemcpyAtoD_v2, NULL, (CUdeviceptr d, CUarray a, size_t off, size_t n),      \
    (d, a, off, n))                                                                                            \
  X(ATOD_PTDS, "cuMemcpyAtoD", 3020, 1, cuMemcpyAtoD_v2_ptds, NULL, (CUdeviceptr d, CUarray a, size_t off, size_t n), \
    (d, a, off, n))                                                                                            \
  X(COPY2D_UNALIGNED, "cuMemcpy2DUnaligned", 3020, 0, cuMemcpy2DUnaligned_v2, NULL, (const CUDA_MEMCPY2D *c), (c)) \
  X(COPY2D_UNALIGNED_PTDS, "cuMemcpy2DUnaligned", 3020, 1, cuMemcpy2DUnaligned_v2_ptds, NULL,                  \
    (const CUDA_MEMCPY2D *c), (c))                                                                             \
  X(BATCH_COPY, "cuMemcpyBatchAsync", 13000, 0, cuMemcpyBatchAsync_v2, h, VS_FN_BATCH_COPY, VS_AR_BATCH_COPY)   \
  X(BATCH_COPY_PTSZ, "cuMemcpyBatchAsync", 13000, 1, cuMemcpyBatchAsync_v2_ptsz, h, VS_FN_BATCH_COPY,           \
    VS_AR_BATCH_COPY)                                                                                          \
  X(BATCH_COPY1, "cuMemcpyBatchAsync", 12080, 0, cuMemcpyBatchAsync, h, VS_FN_BATCH_COPY1, VS_AR_BATCH_COPY1)   \
  X(BATCH_COPY1_PTSZ, "cuMemcpyBatchAsync", 12080, 1, cuMemcpyBatchAsync_ptsz, h, VS_FN_BATCH_COPY1,            \
    VS_AR_BATCH_COPY1)                                                                                         \
  X(BATCH_3D, "cuMemcpy3DBatchAsync", 13000, 0, cuMemcpy3DBatchAsync_v2, h, VS_FN_BATCH_3D, (n, ops, fl, h))    \
  X(BATCH_3D_PTSZ, "cuMemcpy3DBatchAsync", 13000, 1, cuMemcpy3DBatchAsync_v2_ptsz, h, VS_FN_BATCH_3D,           \
    (n, ops, fl, h))                                                                                           \
  X(BATCH_3D1, "cuMemcpy3DBatchAsync", 12080, 0, cuMemcpy3DBatchAsync, h, VS_FN_BATCH_3D1,                      \
    (n, ops, fail_idx, fl, h))                                                                                 \
  X(BATCH_3D1_PTSZ, "cuMemcpy3DBatchAsync", 12080, 1, cuMemcpy3DBatchAsync_ptsz, h, VS_FN_BATCH_3D1,            \
    (n, ops, fail_idx, fl, h))                                                                                 \
  X(DECOMPRESS, "cuMemBatchDecompressAsync", 12060, 0, cuMemBatchDecompressAsync, h, VS_FN_DECOMPRESS,          \
    (ps, n, fl, err_idx, h))                                                                                   \
  X(DECOMPRESS_PTSZ, "cuMemBatchDecompressAsync", 12060, 1, cuMemBatchDecompressAsync_ptsz, h, VS_FN_DECOMPRESS, \
    (ps, n, fl, err_idx, h))                                                                                   \
  X(LAUNCH_OLD, "cuLaunch", 2000, 0, cuLaunch, NULL, (CUfunction f), (f))                                       \
  X(LAUNCH_GRID, "cuLaunchGrid", 2000, 0, cuLaunchGrid, NULL, (CUfunction f, int w, int ht), (f, w, ht))          \
  X(LAUNCH_GRID_ASYNC, "cuLaunchGridAsync", 2000, 0, cuLaunchGridAsync, h, (CUfunction f, int w, int ht, CUstream h), \
    (f, w, ht, h))

typedef enum vs_gated_e {
#define VS_GATED_ENUM(id, base, ver, ptsz, sym, on, params, args) VS_GATED_##id,
  VS_GATED(VS_GATED_ENUM)
#undef VS_GATED_ENUM
  VS_GATED_COUNT
} vs_gated_t;

const int _vs_gated_count = VS_GATED_COUNT;
void *_vs_gated_real[VS_GATED_COUNT];

/* The hooks themselves (defined below under their exported names). */
#define VS_GATED_DECL(id, base, ver, ptsz, sym, on, params, args) static void *vs_gated_addr_##id(void);
VS_GATED(VS_GATED_DECL)
#undef VS_GATED_DECL

const vs_hook_desc_t _vs_gated_hooks[VS_GATED_COUNT] = {
#define VS_GATED_DESC(id, base, ver, ptsz, sym, on, params, args) \
  {base, #sym, VS_PTSZ_VERSION(ver, ptsz), ptsz, vs_gated_addr_##id},
    VS_GATED(VS_GATED_DESC)
#undef VS_GATED_DESC
};

/* The kernel launches: the first one ends the phase:before-launch of tag rules (rules.c). */
static inline bool vs_gated_launch(vs_gated_t id) {
  return id <= VS_GATED_GRAPH_LAUNCH_PTSZ || id == VS_GATED_LAUNCH_OLD || id == VS_GATED_LAUNCH_GRID ||
         id == VS_GATED_LAUNCH_GRID_ASYNC;
}

/* Each names its stream (order.c), then waits at the gate while the shim moves memory
 * (gate.c); a launch notes that the program has launched (one store, the first time). */
#define VS_GATED_DEF(id, base, ver, ptsz, sym, on, params, args)                                       \
  VS_API CUresult sym params;                                                                         \
  VS_API CUresult sym params {                                                                        \
    typedef CUresult(*fn_t) params;                                                                   \
    fn_t real = (fn_t)_vs_hook_real(&_vs_gated_hooks[VS_GATED_##id], &_vs_gated_real[VS_GATED_##id]);    \
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    _vs_order_see(on, ptsz);                                                                          \
    if (vs_gated_launch(VS_GATED_##id) &&                                                             \
        vs_unlikely(!atomic_load_explicit(&_vs_launched, memory_order_relaxed)))                      \
      atomic_store_explicit(&_vs_launched, true, memory_order_relaxed);                               \
    vs_gate_line_t *line_ = _vs_gate_enter();                                                         \
    CUresult r_ = real args;                                                                          \
    _vs_gate_leave(line_);                                                                            \
    return r_;                                                                                        \
  }
VS_GATED(VS_GATED_DEF)
#undef VS_GATED_DEF

/* Hook addresses for the table (the exported functions above). */
#define VS_GATED_ADDR(id, base, ver, ptsz, sym, on, params, args) \
  static void *vs_gated_addr_##id(void) { return (void *)(sym); }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuLaunch, cuLaunchGrid(Async): still submissions */
VS_GATED(VS_GATED_ADDR)
#pragma GCC diagnostic pop
#undef VS_GATED_ADDR
