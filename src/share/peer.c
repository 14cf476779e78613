/* peer.c: which other devices may touch a context's pool memory.
 *
 * The driver gives a cudaMalloc allocation to a peer device when the program enables peer
 * access (cuCtxEnablePeerAccess, which cudaDeviceEnablePeerAccess reaches through the driver
 * table), and a cudaMallocAsync allocation when it grants the device's memory pool to the peer
 * (cuMemPoolSetAccess). VMM memory has no such automatic access: each mapping carries its own
 * access list (cuMemSetAccess). So the shim keeps, per context, the devices that may access its
 * memory and why, and applies them: to every existing mapping of the context's pools when they
 * change, and to every new mapping when a pool grows (handles.c reads the masks here).
 *
 *   reasons, per device d of the context's peers:
 *     links          contexts on device d that enabled peer access to this context (a link goes
 *                    when either context goes away, as the driver drops the grant)
 *     pool_rw/ro     the device's current memory pool grants d read-write / read access (kept
 *                    per device: contexts whose first allocation comes later get them too)
 *     all            VMMSHIM_PEER_ACCESS=all: every device that can access this one
 *   effective: rw = all | pool_rw | {d : a link from d};  ro = pool_ro minus rw
 * VMMSHIM_PEER_ACCESS=none keeps every reason empty (the owner alone, as before).
 *
 * Changes are rare: they take the handle layer's access lock, which serialises them (held
 * across the cuMemSetAccess calls that apply them: handles.c says why that is safe). A growth
 * takes it too, briefly, while it records its new mappings (handles.h): a change then either came
 * before, and the growth gives its mappings the new access, or comes after and finds them. No
 * other allocation or free takes it. The table's own lock is never held across a driver call
 * (VMMSHIM_PEER_ACCESS=all asks the driver which devices can reach a new entry before taking it). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/share.h"

#define VS_PEER_CONTEXTS 64
#define VS_PEER_LINKS 256

typedef struct vs_peer_entry_s {
  CUcontext ctx; /* NULL: free */
  int dev;
  vs_access_state_t st;
  uint64_t all;
} vs_peer_entry_t;

/* cuCtxEnablePeerAccess(to) made with `from` current, from on device from_dev. */
typedef struct vs_peer_link_s {
  CUcontext from, to; /* from NULL: free */
  int from_dev;
} vs_peer_link_t;

static vs_peer_entry_t vs_peer[VS_PEER_CONTEXTS];
static vs_peer_link_t vs_links[VS_PEER_LINKS];
/* Per device: the peers its memory pool grants (cuMemPoolSetAccess), for every context on it,
 * also those whose first allocation comes later. */
static uint64_t vs_pool_rw[VS_MAX_DEVICES], vs_pool_ro[VS_MAX_DEVICES];
/* Counted like the pools' locks: no driver call is made under it. */
static vs_lock_t vs_peer_mutex = VS_LOCK_INITIALIZER(VS_RANK_PEER, "peer");

static void peer_lock(void) { _vs_lock_take(&vs_peer_mutex); }
static void peer_unlock(void) { _vs_lock_release(&vs_peer_mutex); }

/* VMMSHIM_PEER_ACCESS=all: the devices that can access device dev (driver calls: asked before the
 * lock is taken). 0 otherwise. */
static uint64_t all_for(int dev) {
  uint64_t all = 0;
  if (_vs_option(VS_OPT_PEER_ACCESS) != VS_PEER_ALL || !_vs_cu.cuDeviceCanAccessPeer || !_vs_cu.cuDeviceGetCount)
    return 0;
  int n = 0;
  if (_vs_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS) n = 0;
  for (int d = 0; d < n && d < VS_MAX_DEVICES; d++) {
    int can = 0;
    if (d != dev && _vs_cu.cuDeviceCanAccessPeer(&can, d, dev) == CUDA_SUCCESS && can) all |= 1ull << d;
  }
  return all;
}

/* The entry of ctx (on device dev), created when asked (with `all`, all_for(dev)); NULL when the
 * table is full. Lock held. */
static vs_peer_entry_t *entry_of(CUcontext ctx, int dev, bool create, uint64_t all) {
  vs_peer_entry_t *free_slot = NULL;
  for (int i = 0; i < VS_PEER_CONTEXTS; i++) {
    if (vs_peer[i].ctx == ctx) return &vs_peer[i];
    if (!vs_peer[i].ctx && !free_slot) free_slot = &vs_peer[i];
  }
  if (!create || !free_slot || dev < 0 || dev >= VS_MAX_DEVICES) return NULL;
  memset(free_slot, 0, sizeof *free_slot);
  free_slot->ctx = ctx;
  free_slot->dev = dev;
  free_slot->all = all;
  atomic_store(&free_slot->st.rw, free_slot->all | vs_pool_rw[dev]);
  atomic_store(&free_slot->st.ro, vs_pool_ro[dev] & ~(free_slot->all | vs_pool_rw[dev]));
  atomic_store(&free_slot->st.ever, free_slot->all | vs_pool_rw[dev] | vs_pool_ro[dev]);
  return free_slot;
}

const vs_access_state_t *_vs_peer_state(CUcontext ctx, int dev) {
  if (_vs_option(VS_OPT_PEER_ACCESS) == VS_PEER_NONE) return NULL; /* the owner alone, nothing to follow */
  uint64_t all = all_for(dev);
  peer_lock();
  vs_peer_entry_t *e = entry_of(ctx, dev, true, all);
  peer_unlock();
  return e ? &e->st : NULL;
}

typedef struct vs_apply_s {
  CUcontext ctx;
  uint64_t rw, ro, none;
} vs_apply_t;

static void apply_pool(vs_pool_t *pool, void *arg) {
  const vs_apply_t *a = arg;
  if (_vs_pool_context(pool) == a->ctx) _vs_pool_set_access(pool, a->rw, a->ro, a->none);
}

/* Recomputes an entry's masks from its reasons; *changed when they moved (the caller applies
 * them to the context's pools after the peer lock is dropped, the apply lock still held). */
static void update(vs_peer_entry_t *e, vs_apply_t *out, bool *changed) {
  uint64_t rw = e->all | vs_pool_rw[e->dev];
  for (int i = 0; i < VS_PEER_LINKS; i++)
    if (vs_links[i].from && vs_links[i].to == e->ctx) rw |= 1ull << vs_links[i].from_dev;
  uint64_t ro = vs_pool_ro[e->dev] & ~rw;
  uint64_t old = atomic_load(&e->st.rw) | atomic_load(&e->st.ro);
  *changed = rw != atomic_load(&e->st.rw) || ro != atomic_load(&e->st.ro);
  atomic_store(&e->st.rw, rw);
  atomic_store(&e->st.ro, ro);
  atomic_fetch_or(&e->st.ever, rw | ro);
  if (*changed) atomic_fetch_add(&e->st.gen, 1);
  *out = (vs_apply_t){e->ctx, rw, ro, old & ~(rw | ro)};
}

static void apply(const vs_apply_t *a, const char *why) {
  _vs_info("context %p: access for peers now read-write 0x%llx, read 0x%llx%s (%s)", (void *)a->ctx,
           (unsigned long long)a->rw, (unsigned long long)a->ro, a->none ? ", taken from the others" : "", why);
  _vs_dir_visit_pools(apply_pool, (void *)a);
}

static int current_device(void) {
  CUdevice d = -1;
  if (_vs_cu.cuCtxGetDevice(&d) != CUDA_SUCCESS) return -1;
  return (int)d;
}

/* The device of a context that may not be current. */
static int device_of(CUcontext ctx) {
  CUcontext popped;
  if (_vs_cu.cuCtxPushCurrent(ctx) != CUDA_SUCCESS) return -1;
  int d = current_device();
  _vs_cu.cuCtxPopCurrent(&popped);
  return d;
}

void _vs_peer_access_changed(CUcontext peer, bool enabled) {
  if (_vs_guard || !_vs_active() || _vs_option(VS_OPT_PEER_ACCESS) == VS_PEER_NONE) return;
  CUcontext self = NULL;
  if (_vs_cu.cuCtxGetCurrent(&self) != CUDA_SUCCESS || !self) return;
  int from = current_device(), to = device_of(peer);
  if (from < 0 || to < 0 || from >= VS_MAX_DEVICES) return;
  uint64_t all = all_for(to);
  _vs_access_lock();
  peer_lock();
  /* The driver refuses a second enable of the same pair and a disable of none: one link each. */
  vs_peer_link_t *link = NULL, *free_link = NULL;
  for (int i = 0; i < VS_PEER_LINKS; i++) {
    if (vs_links[i].from == self && vs_links[i].to == peer) link = &vs_links[i];
    if (!vs_links[i].from && !free_link) free_link = &vs_links[i];
  }
  if (enabled && !link && free_link) *free_link = (vs_peer_link_t){self, peer, from};
  else if (enabled && !link) _vs_warn("more than %d peer-access grants; device %d gets no access to context %p's pools",
                                      VS_PEER_LINKS, from, (void *)peer);
  if (!enabled && link) link->from = NULL;
  vs_peer_entry_t *e = entry_of(peer, to, true, all);
  vs_apply_t a;
  bool changed = false;
  if (e) update(e, &a, &changed);
  peer_unlock();
  if (changed) apply(&a, enabled ? "peer access enabled" : "peer access disabled");
  _vs_access_unlock();
}

void _vs_peer_forget(CUcontext ctx) {
  if (!ctx) return;
  _vs_access_lock();
  peer_lock();
  /* Grants it made go: the contexts it had access to lose its device. */
  CUcontext gave[VS_PEER_LINKS];
  int ng = 0;
  for (int i = 0; i < VS_PEER_LINKS; i++) {
    vs_peer_link_t *l = &vs_links[i];
    if (l->from == ctx && l->to != ctx) gave[ng++] = l->to;
    if (l->from == ctx || l->to == ctx) l->from = NULL;
  }
  for (int i = 0; i < VS_PEER_CONTEXTS; i++)
    if (vs_peer[i].ctx == ctx) vs_peer[i].ctx = NULL; /* its pools are gone already */
  vs_apply_t todo[VS_PEER_CONTEXTS];
  int nt = 0;
  for (int i = 0; i < VS_PEER_CONTEXTS; i++) {
    vs_peer_entry_t *e = &vs_peer[i];
    bool touched = false;
    for (int k = 0; e->ctx && k < ng && !touched; k++) touched = gave[k] == e->ctx;
    bool changed = false;
    if (touched) update(e, &todo[nt], &changed);
    if (changed) nt++;
  }
  peer_unlock();
  for (int i = 0; i < nt; i++) apply(&todo[i], "the context that enabled peer access went away");
  _vs_access_unlock();
}

void _vs_mempool_access_changed(CUmemoryPool pool, const CUmemAccessDesc *desc, size_t count) {
  if (_vs_guard || !_vs_active() || _vs_option(VS_OPT_PEER_ACCESS) == VS_PEER_NONE || !desc) return;
  if (!_vs_cu.cuDeviceGetCount || !_vs_cu.cuDeviceGetMemPool) return;
  int n = 0;
  if (_vs_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS) return;
  /* The device whose current (or default) pool this is: its stream-ordered allocations are
   * the shim's. A pool the program created is not served by the shim. */
  int dev = -1;
  for (int d = 0; d < n && dev < 0; d++) {
    CUmemoryPool cur = NULL, def = NULL;
    if (_vs_cu.cuDeviceGetMemPool(&cur, d) == CUDA_SUCCESS && cur == pool) dev = d;
    else if (_vs_cu.cuDeviceGetDefaultMemPool && _vs_cu.cuDeviceGetDefaultMemPool(&def, d) == CUDA_SUCCESS && def == pool)
      dev = d;
  }
  if (dev < 0) return;
  _vs_access_lock();
  vs_apply_t todo[VS_PEER_CONTEXTS];
  int nt = 0;
  peer_lock();
  for (size_t k = 0; k < count; k++) {
    int d = desc[k].location.id;
    if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE || d == dev || d < 0 || d >= VS_MAX_DEVICES) continue;
    uint64_t bit = 1ull << d;
    vs_pool_rw[dev] &= ~bit;
    vs_pool_ro[dev] &= ~bit;
    if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) vs_pool_rw[dev] |= bit;
    else if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) vs_pool_ro[dev] |= bit;
  }
  for (int i = 0; i < VS_PEER_CONTEXTS; i++) {
    vs_peer_entry_t *e = &vs_peer[i];
    if (!e->ctx || e->dev != dev) continue;
    bool changed = false;
    update(e, &todo[nt], &changed);
    if (changed) nt++;
  }
  peer_unlock();
  for (int i = 0; i < nt; i++) apply(&todo[i], "memory pool access set");
  _vs_access_unlock();
}
