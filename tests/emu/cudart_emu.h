/* Prototypes of the emulated CUDA runtime (tests/emu/cudart_emu.c).
 *
 * The real cuda_runtime_api.h compiles as C11 with -Wall -Wextra -Werror, so it is used
 * for every type and for the standard prototypes; this header adds the per-thread
 * default stream (_ptsz) entry points the real libcudart exports but cuda_runtime_api.h
 * only declares under CUDA_API_PER_THREAD_DEFAULT_STREAM. The emulation also exports the
 * standard functions listed in the comment below; nothing else of the runtime exists.
 *
 *   cudaMalloc cudaFree cudaMallocAsync cudaFreeAsync cudaMemGetInfo cudaPointerGetAttributes
 *   cudaGetLastError cudaPeekAtLastError cudaGetErrorName cudaGetErrorString
 *   cudaSetDevice cudaGetDevice cudaGetDeviceCount cudaDeviceSynchronize cudaDeviceReset
 *   cudaStreamCreate cudaStreamCreateWithFlags cudaStreamDestroy cudaStreamSynchronize
 *   cudaStreamQuery cudaStreamWaitEvent cudaStreamBeginCapture cudaStreamEndCapture
 *   cudaStreamIsCapturing cudaThreadExchangeStreamCaptureMode cudaGraphDestroy
 *   cudaEventCreate cudaEventCreateWithFlags cudaEventRecord cudaEventQuery
 *   cudaEventSynchronize cudaEventDestroy cudaDriverGetVersion cudaRuntimeGetVersion
 *   cudaDeviceCanAccessPeer cudaDeviceEnablePeerAccess cudaDeviceDisablePeerAccess
 *   cudaDeviceGetDefaultMemPool cudaDeviceGetMemPool cudaMemPoolSetAccess cudaMemPoolGetAccess
 *   cudaMemPoolGetAttribute cudaMemPoolSetAttribute cudaMemPoolTrimTo
 *   cudaIpcGetMemHandle cudaIpcOpenMemHandle cudaIpcCloseMemHandle
 *   cudaLaunchKernel (a launch that runs nothing: the function's address is its CUfunction)
 */
#ifndef VMMSHIM_CUDART_EMU_H
#define VMMSHIM_CUDART_EMU_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus);

#ifdef __cplusplus
}
#endif
#endif
