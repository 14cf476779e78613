/* vmmshim share layer (src/share/): beside the pool. IPC, peer access and the memory report
 * look at pools (vmmshim/pool.h) and are told about contexts and frees by the layers above;
 * no pool file calls them. */
#ifndef VMMSHIM_SHARE_H
#define VMMSHIM_SHARE_H

#include "vmmshim/pool.h"

/* ---------------------------------------------------------------- "peer.c" */
/* The state of a context (created on first use; NULL when the table is full, or with
 * VMMSHIM_PEER_ACCESS=none: the owner alone, nothing to follow). */
const vs_access_state_t *_vs_peer_state(CUcontext ctx, int dev);
/* The context is going away: its state, and the grants it made to others (their pools lose its
 * device, as the driver drops them). */
void _vs_peer_forget(CUcontext ctx);
/* The current context enabled (or disabled) peer access to `peer`: peer's memory gains (loses)
 * the current device. Called after the driver said yes. */
void _vs_peer_access_changed(CUcontext peer, bool enabled);
/* cuMemPoolSetAccess succeeded: when `pool` is a device's current or default pool, its peers'
 * access to the shim's memory on that device follows. */
void _vs_mempool_access_changed(CUmemoryPool pool, const CUmemAccessDesc *desc, size_t count);

/* ---------------------------------------------------------------- "ipc.c" */
/* Each returns false when the call is not the shim's to answer (the driver's then), true with
 * *err set when it is. */
bool _vs_ipc_get_handle(CUdeviceptr ptr, CUipcMemHandle *out, CUresult *err);
bool _vs_ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, CUresult *err);
bool _vs_ipc_close(CUdeviceptr ptr, CUresult *err);
/* The program frees a block of `pool` the pool marks exported (VS_POOL_EXPORTED). HELD: an
 * importer still has it open (the block stays out of the pool until the last one closes; the
 * free counts now). TWICE: it was freed already (and is still held): not a live allocation.
 * NOW: no longer marked: free it as usual (its handle is stale from now on). */
typedef enum vs_ipc_free_e { VS_IPC_FREE_NOW = 0, VS_IPC_FREE_HELD = 1, VS_IPC_FREE_TWICE = 2 } vs_ipc_free_t;
vs_ipc_free_t _vs_ipc_on_free(vs_pool_t *pool, CUdeviceptr ptr, vmmshim_api_t api);
/* The pool's context is going away: its exports are forgotten (before the pool is destroyed). */
void _vs_ipc_forget_pool(vs_pool_t *pool);
/* The blocks of pool that importers of other processes hold open (they map its handles, so its
 * memory cannot leave the device): up to max ranges; returns how many. */
int _vs_ipc_held_ranges(vs_pool_t *pool, CUdeviceptr *va, size_t *len, int max);

/* ---------------------------------------------------------------- "report.c" */
/* The shim answered out-of-memory: the memory report at warn level, once per burst. scattered:
 * the idle bytes the process's other pools gave back before the answer. */
void _vs_report_oom(vmmshim_api_t api, size_t size, int dev, bool limit_reached, size_t scattered);
/* vmmshim_dump and the dump signal: the memory report at note level. -1 when the shim is not
 * active, else 0. */
int _vs_report_dump(void);

#endif
