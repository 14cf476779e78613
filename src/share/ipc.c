/* ipc.c: CUDA IPC on shim memory (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle,
 * which cudaIpc* reach through the driver table).
 *
 * Pool memory is VMM memory, which has no legacy IPC handle (the driver refuses it). So the shim
 * makes its own 64-byte handle: exporter pid, the name of the exporter's socket (64 random bits),
 * an export id (64 random bits, one per exported block), the block's size. The exporting process
 * answers on a Unix-domain socket in the abstract namespace ("\0vmmshim-ipc-<pid>-<nonce>"),
 * served by a thread of the shim started at its first export: an importer connects, and sends the
 * export id; the exporter sends, for each physical handle under the block, its size and a POSIX
 * file descriptor (cuMemExportToShareableHandle, SCM_RIGHTS), and the block's offset in the first
 * one. The importer checks the answer (counts, sizes, granularity, offset: a wrong one fails the
 * open, nothing is mapped), imports the handles (cuMemImportFromShareableHandle), maps them back
 * to back into a range of its own, gives its current device access, and returns the block's
 * address in it. It keeps the connection open while the handle is open: the exporter counts open
 * handles by their connections, so one that dies closes its own.
 *
 * Who may ask (the threat model; docs/multi-gpu.md): the server is src/base/server.c's, which
 * refuses another user when it connects (SO_PEERCRED), before it can send anything, and closes a
 * connection of this user that has not sent its whole request within VMMSHIM_IPC_TIMEOUT seconds.
 * The same user can open any handle whose bytes it has and could guess none (the export id is
 * random); it can read the program's memory anyway (ptrace), so nothing more is defended. Every
 * wait of the importer ends by VMMSHIM_IPC_TIMEOUT in all, with CUDA_ERROR_MAP_FAILED. Each open
 * handle holds one connection (a descriptor) of the exporter: the server has a slot for as many
 * as RLIMIT_NOFILE allows (1024 to 65536), fixed when it starts.
 *
 * The exporter may free the block while importers have it open (the driver calls that undefined
 * behaviour for cudaMalloc memory): its memory then stays out of the pool until the last importer
 * closes, so no new allocation can reuse it. The free counts for the program at once; the block
 * returns to the pool (and the trace shows its free) when the last importer is gone. An exported
 * block is marked in its pool, so that a free of any other block costs nothing here. Opening a
 * handle whose exporter has exited, or whose block was freed with no importer, fails with
 * CUDA_ERROR_MAP_FAILED, as the driver's own handles do. Handles the shim did not make pass to the
 * driver untouched; so do events.
 *
 * Locks: vs_ipc_lock (exports) and vs_import_lock (imports); neither is
 * held across a driver call (counted like the pools' locks: vmm.c asserts it in debug builds). An
 * export being answered or given back is pinned (busy) while the lock is dropped.
 *
 * A fork child inherits descriptors, not the exports or imports: it closes its copies of the
 * server's sockets and of the imports' connections (an importer's fork child would otherwise keep
 * the exporter's block held after the importer closed it), and starts its own server if it
 * exports. The exports of a pool whose context goes away are forgotten with it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vmmshim/lock.h"
#include "vmmshim/server.h"
#include "vmmshim/share.h"

/* uthash for the exports (by id, by address); an out-of-memory add is checked, never fatal. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#define VS_IPC_MAGIC "vmmshim\x01"
#define VS_IPC_MAX_SEGS VS_SRV_MAX_FDS
#define VS_IPC_BACKLOG 4096
#define VS_IPC_MIN_CONNS 1024
#define VS_IPC_MAX_CONNS 65536

/* The handle, as the 64 bytes of a CUipcMemHandle. */
typedef struct vs_ipc_handle_s {
  char magic[8];
  uint32_t pid;
  int32_t dev;
  uint64_t nonce; /* the exporter's socket name */
  uint64_t id;    /* the export */
  uint64_t size;  /* the block's requested size */
  char note[24];  /* for a person looking at the bytes */
} vs_ipc_handle_t;
_Static_assert(sizeof(vs_ipc_handle_t) == CU_IPC_HANDLE_SIZE, "an IPC handle is 64 bytes");

typedef struct vs_ipc_request_s {
  char magic[8];
  uint64_t id;
} vs_ipc_request_t;

enum { VS_IPC_OK = 0, VS_IPC_DENIED = 1, VS_IPC_GONE = 2, VS_IPC_FAILED = 3 };

typedef struct vs_ipc_reply_s {
  int32_t status;
  uint32_t nsegs;
  uint64_t offset; /* of the block in the first handle */
  uint64_t seg_size[VS_IPC_MAX_SEGS];
} vs_ipc_reply_t;

static uint64_t timeout_ns(void) { return _vs_option(VS_OPT_IPC_TIMEOUT) * 1000000000ull; }

/* n random bytes (getrandom, else /dev/urandom). -1 when the system gives none. */
static int random_bytes(void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    p += r;
    n -= (size_t)r;
  }
  if (!n) return 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    p += r;
    n -= (size_t)r;
  }
  close(fd);
  return n ? -1 : 0;
}

/* ------------------------------------------------------------------ locks */

static vs_lock_t vs_ipc_lock = VS_LOCK_INITIALIZER(VS_RANK_IPC, "ipc");
static pthread_cond_t vs_ipc_unpinned = PTHREAD_COND_INITIALIZER; /* an export's busy count fell */
static vs_lock_t vs_import_lock = VS_LOCK_INITIALIZER(VS_RANK_IMPORT, "import");

static void ipc_lock(void) { _vs_lock_take(&vs_ipc_lock); }
static void ipc_unlock(void) { _vs_lock_release(&vs_ipc_lock); }
static void import_lock(void) { _vs_lock_take(&vs_import_lock); }
static void import_unlock(void) { _vs_lock_release(&vs_import_lock); }

/* ------------------------------------------------------------------ exports */

typedef struct vs_export_s {
  uint64_t id;
  CUdeviceptr ptr;
  vs_pool_t *pool;
  int opens;   /* importers holding it, and requests being answered */
  int busy;    /* threads working on it with the lock dropped: it stays until they are done */
  bool freed;  /* the program freed it while open: the pool gets it back when opens reaches 0 */
  vmmshim_api_t free_api;
  UT_hash_handle by_id, by_ptr;
} vs_export_t;

static vs_export_t *vs_exports_by_id, *vs_exports_by_ptr;
static uint64_t vs_nonce;
static pid_t vs_server_pid; /* the process whose server runs; 0: none */
static vs_rate_t vs_refusals; /* warnings about requests refused, rated (log.c) */

static vs_export_t *export_by_ptr(CUdeviceptr ptr) {
  vs_export_t *x = NULL;
  HASH_FIND(by_ptr, vs_exports_by_ptr, &ptr, sizeof ptr, x);
  return x;
}

static vs_export_t *export_by_id(uint64_t id) {
  vs_export_t *x = NULL;
  HASH_FIND(by_id, vs_exports_by_id, &id, sizeof id, x);
  return x;
}

/* false when there was no host memory for the tables (nothing added). Lock held. */
static bool export_add(vs_export_t *x) {
  HASH_ADD(by_id, vs_exports_by_id, id, sizeof x->id, x);
  if (export_by_id(x->id) != x) return false;
  HASH_ADD(by_ptr, vs_exports_by_ptr, ptr, sizeof x->ptr, x);
  if (export_by_ptr(x->ptr) == x) return true;
  HASH_DELETE(by_id, vs_exports_by_id, x);
  return false;
}

static void export_remove(vs_export_t *x) {
  HASH_DELETE(by_id, vs_exports_by_id, x);
  HASH_DELETE(by_ptr, vs_exports_by_ptr, x);
  free(x);
}

/* A random export id, not 0 and not in use. 0 when the system gives no random numbers. */
static uint64_t new_export_id(void) {
  uint64_t id = 0;
  do
    if (random_bytes(&id, sizeof id) != 0) return 0;
  while (!id || export_by_id(id));
  return id;
}

static void socket_name(struct sockaddr_un *a, socklen_t *len, uint32_t pid, uint64_t nonce) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "vmmshim-ipc-%u-%016llx", pid, (unsigned long long)nonce);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* An importer let go of x (or a request for it failed): true when it was the last and the
 * program freed the block meanwhile; x is then pinned, and the caller gives it back after the
 * unlock. Lock held. */
static bool drop_open_locked(vs_export_t *x) {
  if (--x->opens > 0 || !x->freed) return false;
  x->busy++;
  return true;
}

/* The last importer of a block the program freed is gone: the block goes back to the pool (its
 * free may synchronise the context: no lock held), then the export goes. */
static void give_back(vs_export_t *x) {
  vs_pool_t *pool = x->pool;
  CUdeviceptr ptr = x->ptr;
  CUcontext popped;
  bool pushed = _vs_cu.cuCtxPushCurrent(_vs_pool_context(pool)) == CUDA_SUCCESS;
  size_t size, requested;
  CUresult err;
  _vs_pool_free_exported(pool, ptr, x->free_api, &size, &requested, &err); /* counted at the program's free */
  if (pushed) _vs_cu.cuCtxPopCurrent(&popped);
  ipc_lock();
  x->busy--;
  export_remove(x);
  pthread_cond_broadcast(&vs_ipc_unpinned);
  ipc_unlock();
  _vs_debug("ipc: block 0x%llx, freed while open in another process, is back in the pool", (unsigned long long)ptr);
}

/* ------------------------------------------------------------------ the exporter's server */

static vs_server_t vs_ipc_server;

/* Never waits: a reply always fits in the buffer of a connection that got no other. */
static int send_reply(int fd, const vs_ipc_reply_t *rep, const int *fds, unsigned nfds) {
  return _vs_send_fds(fd, rep, sizeof *rep, fds, (int)nfds);
}

static void refuse(int fd, int32_t status) {
  vs_ipc_reply_t rep;
  memset(&rep, 0, sizeof rep);
  rep.status = status;
  send_reply(fd, &rep, NULL, 0);
}

/* A connection closed (the server's thread, no lock held): the export it held is let go. */
static void ipc_closed(uint64_t holds) {
  if (!holds) return;
  vs_export_t *back = NULL;
  ipc_lock();
  vs_export_t *x = export_by_id(holds);
  if (x && drop_open_locked(x)) back = x;
  ipc_unlock();
  if (back) give_back(back);
}

static size_t ipc_refusal(vs_srv_refusal_t why, char *out, size_t cap) {
  if (why == VS_SRV_TOO_SLOW || why == VS_SRV_CUT || cap < sizeof(vs_ipc_reply_t)) return 0;
  vs_ipc_reply_t rep;
  memset(&rep, 0, sizeof rep);
  rep.status = why == VS_SRV_WRONG_USER ? VS_IPC_DENIED : VS_IPC_FAILED;
  memcpy(out, &rep, sizeof rep);
  return sizeof rep;
}

/* The export a request names, pinned (busy) with one more open, and its handles; NULL (the
 * peer refused) when it cannot be had. Lock not held. */
static vs_export_t *pin_export(int fd, const vs_ipc_request_t *req, CUmemGenericAllocationHandle *handles,
                               size_t *sizes, size_t *offset, int *n, vs_device_caps_t *caps) {
  if (memcmp(req->magic, VS_IPC_MAGIC, 8) != 0) {
    _vs_warn_rated(&vs_refusals, "ipc: a request that is not a shim's of this version: refused");
    refuse(fd, VS_IPC_FAILED);
    return NULL;
  }
  ipc_lock();
  vs_export_t *x = export_by_id(req->id);
  if (!x || x->freed) {
    ipc_unlock();
    _vs_debug("ipc: a request for an export that is gone (or never was): refused");
    refuse(fd, VS_IPC_GONE);
    return NULL;
  }
  if (_vs_pool_handles_of(x->pool, x->ptr, offset, handles, sizes, VS_IPC_MAX_SEGS, n) != VS_POOL_OK) {
    CUdeviceptr ptr = x->ptr;
    ipc_unlock();
    _vs_warn_rated(&vs_refusals, "ipc: block 0x%llx lies on more than %d handles; it cannot be shared",
                   (unsigned long long)ptr, VS_IPC_MAX_SEGS); /* asked for by others: rated */
    refuse(fd, VS_IPC_FAILED);
    return NULL;
  }
  x->opens++; /* a free now keeps the block: its handles stay valid while they are exported */
  x->busy++;
  *caps = *_vs_pool_caps(x->pool);
  ipc_unlock();
  return x;
}

/* The handles of an export as descriptors, sent on fd (with the lock dropped). Whether they went. */
static bool send_handles(int fd, const vs_device_caps_t *caps, const CUmemGenericAllocationHandle *handles,
                         const size_t *sizes, size_t offset, int n) {
  int fds[VS_IPC_MAX_SEGS], nfds = 0;
  bool ok = true;
  for (int i = 0; ok && i < n; i++) {
    ok = _vs_vmm_export(caps, handles[i], &fds[i]) == CUDA_SUCCESS;
    if (ok) nfds++;
  }
  vs_ipc_reply_t rep;
  memset(&rep, 0, sizeof rep);
  rep.status = VS_IPC_OK;
  rep.nsegs = (uint32_t)n;
  rep.offset = offset;
  for (int i = 0; i < n; i++) rep.seg_size[i] = sizes[i];
  bool sent = ok && send_reply(fd, &rep, fds, (unsigned)nfds) == 0;
  if (!ok) refuse(fd, VS_IPC_FAILED);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  return sent;
}

/* A whole request: the export's handles as descriptors. The connection then holds the export
 * open until the importer closes it; a refusal closes it (the reply is all the importer gets).
 * Server thread, lock not held; the handles are exported with it dropped, the export pinned. */
static vs_srv_next_t ipc_answer(int fd, uint64_t *holds, const char *req, size_t len, char *out, size_t *out_n) {
  (void)out;
  (void)len;
  *out_n = 0;
  vs_ipc_request_t rq;
  memcpy(&rq, req, sizeof rq);
  CUmemGenericAllocationHandle handles[VS_IPC_MAX_SEGS];
  size_t sizes[VS_IPC_MAX_SEGS], offset = 0;
  int n = 0;
  vs_device_caps_t caps;
  vs_export_t *x = pin_export(fd, &rq, handles, sizes, &offset, &n, &caps);
  if (!x) return VS_SRV_CLOSE;
  bool sent = send_handles(fd, &caps, handles, sizes, offset, n);
  vs_export_t *back = NULL;
  ipc_lock();
  x->busy--;
  if (sent) *holds = x->id; /* until the importer closes the connection */
  else if (drop_open_locked(x)) back = x;
  pthread_cond_broadcast(&vs_ipc_unpinned);
  ipc_unlock();
  if (back) give_back(back);
  return sent ? VS_SRV_HOLD : VS_SRV_CLOSE;
}

static void ipc_thread_init(void) { _vs_guard++; /* the driver calls made here are the shim's own */ }

static void atfork_prepare(void);
static void atfork_parent(void);
static void atfork_child(void);
static pthread_once_t vs_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Connections at once: one per handle open in another process, and each holds a descriptor of
 * this process, so as many as it may have (within bounds), fixed when the server starts. */
static int ipc_slots(void) {
  struct rlimit rl = {0, 0};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < VS_IPC_MIN_CONNS) return VS_IPC_MIN_CONNS;
  return rl.rlim_cur > VS_IPC_MAX_CONNS ? VS_IPC_MAX_CONNS : (int)rl.rlim_cur;
}

/* Starts this process's server on its first export. Lock held. */
static int start_server(void) {
  if (vs_server_pid == getpid()) return 0;
  pthread_once(&vs_atfork_once, atfork_register);
  uint64_t nonce;
  if (random_bytes(&nonce, sizeof nonce) != 0) {
    _vs_warn("ipc: the system gives no random numbers (getrandom: %s); no IPC handle can be made", strerror(errno));
    return -1;
  }
  struct sockaddr_un a;
  socklen_t len;
  socket_name(&a, &len, (uint32_t)getpid(), nonce);
  uint64_t ms = _vs_option(VS_OPT_IPC_TIMEOUT) * 1000;
  vs_ipc_server.ops = (vs_server_ops_t){
      .name = "ipc", .asked = "asked for a handle of this process", .slots = ipc_slots(),
      .backlog = VS_IPC_BACKLOG, .record = sizeof(vs_ipc_request_t), .idle_ms = ms, .request_ms = ms,
      .send_ms = ms, .answer = ipc_answer, .refusal = ipc_refusal, .closed = ipc_closed,
      .thread_init = ipc_thread_init};
  if (_vs_server_start(&vs_ipc_server, &a, len) != 0) return -1;
  vs_nonce = nonce;
  vs_server_pid = getpid();
  _vs_info("ipc: this process answers IPC handles of its pool memory on @%s", a.sun_path + 1);
  return 0;
}

bool _vs_ipc_get_handle(CUdeviceptr ptr, CUipcMemHandle *out, CUresult *err) {
  *err = CUDA_SUCCESS;
  if (_vs_guard || !ptr || !_vs_active()) return false;
  vs_pool_t *pool = _vs_dir_lookup(ptr);
  if (!pool) return false; /* not pool memory: the driver's answer */
  size_t served = 0, size = 0;
  if (!out || !_vs_pool_block(pool, ptr, &served, &size)) {
    *err = CUDA_ERROR_INVALID_VALUE; /* not the start of a live block, as the driver answers */
    return true;
  }
  ipc_lock();
  if (start_server() != 0) {
    ipc_unlock();
    *err = CUDA_ERROR_OPERATING_SYSTEM;
    return true;
  }
  vs_export_t *x = export_by_ptr(ptr);
  if (x && x->freed) { /* freed by the program, still open elsewhere: not a live allocation */
    ipc_unlock();
    *err = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (!x) {
    x = calloc(1, sizeof *x);
    uint64_t id = x ? new_export_id() : 0;
    if (!x || !id) {
      ipc_unlock();
      free(x);
      *err = x ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_OUT_OF_MEMORY;
      return true;
    }
    x->id = id;
    x->ptr = ptr;
    x->pool = pool;
    /* Marked in its pool: its free comes here (the block may have been freed since the check). */
    bool live = _vs_pool_set_exported(pool, ptr, true);
    if (!live || !export_add(x)) {
      if (live) _vs_pool_set_exported(pool, ptr, false);
      ipc_unlock();
      free(x);
      *err = live ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
      return true;
    }
  }
  vs_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, VS_IPC_MAGIC, 8);
  h.pid = (uint32_t)getpid();
  h.dev = _vs_pool_device(pool);
  h.nonce = vs_nonce;
  h.id = x->id;
  h.size = size;
  snprintf(h.note, sizeof h.note, "open under libvmmshim");
  ipc_unlock();
  memcpy(out, &h, sizeof h);
  _vs_debug("ipc: handle %016llx for block 0x%llx (%zu bytes)", (unsigned long long)h.id, (unsigned long long)ptr,
            size);
  return true;
}

vs_ipc_free_t _vs_ipc_on_free(vs_pool_t *pool, CUdeviceptr ptr, vmmshim_api_t api) {
  ipc_lock();
  vs_export_t *x = export_by_ptr(ptr);
  vs_ipc_free_t r = VS_IPC_FREE_NOW;
  if (x && x->freed) {
    r = VS_IPC_FREE_TWICE; /* it only looks live: the pool must not get it while it is open */
  } else if (x && x->opens > 0) {
    x->freed = true;
    x->free_api = api;
    r = VS_IPC_FREE_HELD;
    _vs_debug("ipc: block 0x%llx freed while open in another process: kept out of the pool until it is closed",
              (unsigned long long)ptr);
  } else {
    /* No importer (or an export this process no longer has: a fork child's): its handle goes
     * stale with the free. */
    _vs_pool_set_exported(pool, ptr, false);
    if (x) export_remove(x);
  }
  ipc_unlock();
  return r;
}

void _vs_ipc_forget_pool(vs_pool_t *pool) {
  ipc_lock();
  vs_export_t *x, *tmp;
  for (bool pinned = true; pinned;) { /* an export being answered or given back finishes first */
    pinned = false;
    HASH_ITER(by_id, vs_exports_by_id, x, tmp) pinned |= x->pool == pool && x->busy > 0;
    if (pinned) _vs_lock_wait(&vs_ipc_lock, &vs_ipc_unpinned);
  }
  HASH_ITER(by_id, vs_exports_by_id, x, tmp)
  if (x->pool == pool) export_remove(x); /* its memory goes with the context; open copies elsewhere stay */
  ipc_unlock();
}

/* ------------------------------------------------------------------ imports */

typedef struct vs_import_s {
  uint32_t pid;
  uint64_t nonce, id;
  CUdeviceptr va, ptr;
  size_t total;
  int n;
  CUmemGenericAllocationHandle handles[VS_IPC_MAX_SEGS];
  size_t sizes[VS_IPC_MAX_SEGS];
  vs_device_caps_t caps;
  int refs;
  int conn;
  struct vs_import_s *next;
} vs_import_t;

static vs_import_t *vs_imports;

/* Unmaps the first `mapped` handles, releases them all and frees the range. A handle whose unmap
 * fails stays (with its range): nothing can be known of it. */
static void unmap_import(vs_import_t *im, int mapped) {
  size_t off = 0, stuck = 0;
  for (int i = 0; i < im->n; i++) {
    bool kept = i < mapped && _vs_vmm_unmap(&im->caps, im->va + off, im->sizes[i]) != CUDA_SUCCESS;
    off += im->sizes[i];
    if (kept) stuck += im->sizes[i];
    else if (im->handles[i]) _vs_vmm_release(&im->caps, im->handles[i], im->sizes[i]);
  }
  if (stuck) _vs_warn("ipc: %zu bytes of an import could not be unmapped; they stay mapped at 0x%llx", stuck,
                      (unsigned long long)im->va);
  else if (im->va) _vs_vmm_address_free(&im->caps, im->va, im->total);
}

/* Why the exporter's reply cannot be right, or NULL: nothing of it is mapped unless it is. */
static const char *bad_reply(const vs_ipc_reply_t *rep, int nfds, const vs_ipc_handle_t *h, size_t gran) {
  if (rep->nsegs == 0 || rep->nsegs > VS_IPC_MAX_SEGS) return "a number of handles out of range";
  if ((int)rep->nsegs != nfds) return "not one descriptor per handle";
  size_t total = 0;
  for (uint32_t i = 0; i < rep->nsegs; i++) {
    uint64_t s = rep->seg_size[i];
    if (!s || s % gran) return "a handle size that is not a multiple of the granularity";
    if (s > VS_SIZE_OPTION_MAX || total + s > VS_SIZE_OPTION_MAX) return "handles of more than 1 PiB";
    total += s;
  }
  if (rep->offset % 256 || rep->offset >= rep->seg_size[0]) return "an offset outside its first handle";
  if (!h->size || h->size > total - rep->offset) return "a block that does not fit in its handles";
  return NULL;
}

/* A connection to the exporter of h, checked to be that process of this user; -1 (warned) when
 * there is none by `deadline`, -2 when no socket can be made. */
static int connect_exporter(const vs_ipc_handle_t *h, uint64_t deadline) {
  struct sockaddr_un a;
  socklen_t len;
  socket_name(&a, &len, h->pid, h->nonce);
  struct ucred cred;
  int fd = _vs_socket_connect(&a, len, deadline, &cred);
  if (fd == -1 && errno == EAGAIN)
    _vs_warn("ipc: the process that made this handle (pid %u) accepts no connection within %llu s "
             "(VMMSHIM_IPC_TIMEOUT)", h->pid, (unsigned long long)_vs_option(VS_OPT_IPC_TIMEOUT));
  else if (fd == -1)
    _vs_warn("ipc: the process that made this handle (pid %u) is gone: %s", h->pid, strerror(errno));
  if (fd >= 0 && (cred.uid != geteuid() || (uint32_t)cred.pid != h->pid)) {
    _vs_warn("ipc: the socket of pid %u belongs to another process or user; not opened", h->pid);
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Sends the request for h on fd and reads the reply into rep, its descriptors into fds (the
 * caller closes them, however many came). Whether a whole reply came (warned when not). */
static bool ask_exporter(int fd, const vs_ipc_handle_t *h, uint64_t deadline, vs_ipc_reply_t *rep, int *fds,
                         int *nfds, bool *extra) {
  vs_ipc_request_t req;
  memcpy(req.magic, VS_IPC_MAGIC, 8);
  req.id = h->id;
  memset(rep, 0, sizeof *rep);
  ssize_t r = -1;
  *nfds = 0;
  *extra = false;
  if (_vs_socket_deadline(fd, deadline) && send(fd, &req, sizeof req, MSG_NOSIGNAL) == (ssize_t)sizeof req) {
    do r = _vs_recv_fds(fd, rep, sizeof *rep, fds, nfds, extra);
    while (r < 0 && errno == EINTR && _vs_socket_deadline(fd, deadline));
  }
  if (r == (ssize_t)sizeof *rep) return true;
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    _vs_warn("ipc: no answer from pid %u within %llu s (VMMSHIM_IPC_TIMEOUT) for handle %016llx", h->pid,
             (unsigned long long)_vs_option(VS_OPT_IPC_TIMEOUT), (unsigned long long)h->id);
  else
    _vs_warn("ipc: no answer from pid %u for handle %016llx", h->pid, (unsigned long long)h->id);
  return false;
}

/* Whether the exporter's reply can be used (warned when not): nothing is imported unless it can. */
static bool reply_usable(const vs_ipc_reply_t *rep, int nfds, bool extra, const vs_ipc_handle_t *h, size_t gran) {
  const char *why = NULL;
  if (rep->status != VS_IPC_OK) {
    _vs_warn("ipc: pid %u refused handle %016llx: %s", h->pid, (unsigned long long)h->id,
             rep->status == VS_IPC_DENIED ? "this process runs as another user"
             : rep->status == VS_IPC_GONE ? "its block was freed"
                                          : "it could not export its memory");
    return false;
  }
  if ((why = extra ? "more descriptors than handles" : bad_reply(rep, nfds, h, gran))) {
    _vs_warn("ipc: the answer of pid %u for handle %016llx is wrong (%s); not opened", h->pid,
             (unsigned long long)h->id, why);
    return false;
  }
  return true;
}

/* Asks the exporter for the handles; fills im (handles imported, descriptors closed). Every wait
 * ends by `deadline`. */
static CUresult fetch(const vs_ipc_handle_t *h, vs_import_t *im, uint64_t deadline) {
  int fd = connect_exporter(h, deadline);
  if (fd < 0) return fd == -2 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_MAP_FAILED;
  vs_ipc_reply_t rep;
  int fds[VS_IPC_MAX_SEGS], nfds = 0;
  bool extra = false;
  CUresult res = ask_exporter(fd, h, deadline, &rep, fds, &nfds, &extra) &&
                         reply_usable(&rep, nfds, extra, h, im->caps.min_granularity)
                     ? CUDA_SUCCESS
                     : CUDA_ERROR_MAP_FAILED;
  im->n = 0;
  for (int i = 0; res == CUDA_SUCCESS && i < nfds; i++) {
    res = _vs_vmm_import(fds[i], &im->handles[i]);
    if (res == CUDA_SUCCESS) {
      im->sizes[i] = rep.seg_size[i];
      im->total += rep.seg_size[i];
      im->n = i + 1;
    }
  }
  for (int i = 0; i < nfds; i++) close(fds[i]);
  if (res != CUDA_SUCCESS) {
    close(fd);
    return res == CUDA_ERROR_OUT_OF_MEMORY ? res : CUDA_ERROR_MAP_FAILED;
  }
  im->ptr = rep.offset; /* made an address by the caller */
  im->conn = fd;
  return CUDA_SUCCESS;
}

bool _vs_ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, CUresult *err) {
  *err = CUDA_SUCCESS;
  vs_ipc_handle_t h;
  memcpy(&h, handle, sizeof h);
  if (memcmp(h.magic, VS_IPC_MAGIC, 8) != 0) return false; /* not ours: the driver's */
  if (_vs_guard) return false;
  if (!pdptr) {
    *err = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  /* Without the pools (VMMSHIM_DISABLE) the handle still opens: the driver could not. */
  if (!_vs_active() && _vs_cuda_resolve() != 0) return false;
  uint64_t deadline = _vs_now_ns() + timeout_ns();
  pthread_once(&vs_atfork_once, atfork_register);
  CUdevice dev = 0;
  if (_vs_cu.cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
    *err = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  import_lock();
  for (vs_import_t *im = vs_imports; im; im = im->next)
    if (im->pid == h.pid && im->nonce == h.nonce && im->id == h.id && im->caps.device == dev) {
      im->refs++; /* opened again by this context: the same address, one more reference */
      *pdptr = im->ptr;
      import_unlock();
      return true;
    }
  import_unlock();
  /* The pid alone could be a process of another pid namespace, or an exited one whose pid was
   * reused: the nonce says whether this process made it. */
  ipc_lock();
  bool own = h.pid == (uint32_t)getpid() && vs_server_pid == getpid() && h.nonce == vs_nonce;
  ipc_unlock();
  if (own) {
    *err = CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses a process's own handles so */
    return true;
  }
  vs_import_t *im = calloc(1, sizeof *im);
  if (!im) {
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return true;
  }
  im->pid = h.pid;
  im->nonce = h.nonce;
  im->id = h.id;
  im->conn = -1;
  CUresult r = _vs_vmm_query(dev, &im->caps);
  if (r == CUDA_SUCCESS && !im->caps.vmm_supported) r = CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_SUCCESS) r = fetch(&h, im, deadline);
  int mapped = 0;
  if (r == CUDA_SUCCESS) r = _vs_vmm_reserve(&im->caps, im->total, 0, &im->va);
  size_t off = 0;
  for (int i = 0; r == CUDA_SUCCESS && i < im->n; i++) {
    r = _vs_vmm_map(&im->caps, im->va + off, im->sizes[i], im->handles[i]);
    if (r == CUDA_SUCCESS) mapped++;
    off += im->sizes[i];
  }
  if (r == CUDA_SUCCESS) r = _vs_vmm_set_access(&im->caps, im->va, im->total);
  if (r != CUDA_SUCCESS) {
    unmap_import(im, mapped);
    if (im->conn >= 0) close(im->conn);
    free(im);
    *err = r;
    return true;
  }
  im->ptr += im->va;
  im->refs = 1;
  import_lock();
  im->next = vs_imports;
  vs_imports = im;
  import_unlock();
  *pdptr = im->ptr;
  _vs_info("ipc: opened handle %016llx of pid %u at 0x%llx (%zu bytes in %d handles)", (unsigned long long)h.id, h.pid,
           (unsigned long long)im->ptr, (size_t)h.size, im->n);
  return true;
}

bool _vs_ipc_close(CUdeviceptr ptr, CUresult *err) {
  *err = CUDA_SUCCESS;
  if (_vs_guard || !ptr) return false;
  import_lock();
  vs_import_t **pp = &vs_imports, *im = NULL;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) {
      im = *pp;
      break;
    }
  if (!im) {
    import_unlock();
    return false; /* not a shim handle's memory: the driver's */
  }
  if (--im->refs > 0) {
    import_unlock();
    return true;
  }
  *pp = im->next;
  import_unlock();
  unmap_import(im, im->n);
  close(im->conn); /* the exporter sees the handle closed */
  _vs_info("ipc: closed handle %016llx of pid %u", (unsigned long long)im->id, im->pid);
  free(im);
  return true;
}

/* ------------------------------------------------------------------ fork */

/* The lists are whole when the child copies them: both locks are taken around fork(). */
static void atfork_prepare(void) {
  _vs_lock_take_at_fork(&vs_ipc_lock);
  _vs_lock_take_at_fork(&vs_import_lock);
}

static void atfork_parent(void) {
  import_unlock();
  ipc_unlock();
}

/* The child has no server thread and owns neither the parent's exports nor its imports: it closes
 * its copies of their sockets (an open import's connection would keep the exporter's block held
 * after the parent closed it) and forgets them. Blocks its pools still mark exported are let go
 * at their free (_vs_ipc_on_free finds no export). */
static void atfork_child(void) {
  vs_server_pid = 0; /* the server closed its sockets (server.c's fork handler) */
  vs_export_t *x, *tmp;
  HASH_ITER(by_id, vs_exports_by_id, x, tmp) export_remove(x);
  for (vs_import_t *im = vs_imports, *next; im; im = next) {
    next = im->next;
    close(im->conn);
    free(im);
  }
  vs_imports = NULL;
  import_unlock(); /* the two taken in atfork_prepare, by this thread's copy */
  ipc_unlock();
  pthread_cond_init(&vs_ipc_unpinned, NULL);
}

/* ------------------------------------------------------------------ sleep */

int _vs_ipc_held_ranges(vs_pool_t *pool, CUdeviceptr *va, size_t *len, int max) {
  int n = 0;
  ipc_lock();
  vs_export_t *x, *tmp;
  HASH_ITER(by_id, vs_exports_by_id, x, tmp)
  if (n < max && x->pool == pool && x->opens > 0) va[n++] = x->ptr;
  ipc_unlock();
  /* Their sizes from the pool, with the IPC lock dropped (the pool's lock is never taken under
   * it). A block freed meanwhile keeps its range: it stays out of the pool while held. */
  int k = 0;
  for (int i = 0; i < n; i++) {
    size_t served = 0, requested = 0;
    if (_vs_pool_block(pool, va[i], &served, &requested)) {
      va[k] = va[i];
      len[k++] = served;
    }
  }
  return k;
}
