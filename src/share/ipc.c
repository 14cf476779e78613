/* ipc.c: CUDA IPC on shim memory (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle,
 * which cudaIpc* reach through the driver table).
 *
 * Pool memory is VMM memory, which has no legacy IPC handle (the driver refuses it). So the shim
 * makes its own 64-byte handle: exporter pid, a random number of the exporter process, an export
 * id, the block's size. The exporting process answers on a Unix-domain socket in the abstract
 * namespace ("\0vmmshim-ipc-<pid>-<nonce>"), served by a thread of the shim started at its first
 * export: an importer connects, the exporter checks that the peer runs as the same user
 * (SO_PEERCRED) and sends, for each physical handle under the block, its size and a POSIX file
 * descriptor (cuMemExportToShareableHandle, SCM_RIGHTS), and the block's offset in the first one.
 * The importer imports them (cuMemImportFromShareableHandle), maps them back to back into a range
 * of its own, gives its current device access, and returns the block's address in it. It keeps
 * the connection open while the handle is open: the exporter counts open handles by their
 * connections, so one that dies closes its own.
 *
 * The exporter may free the block while importers have it open (the driver calls that undefined
 * behaviour for cudaMalloc memory): its memory then stays out of the pool until the last importer
 * closes, so no new allocation can reuse it. The free counts for the program at once; the block
 * returns to the pool (and the trace shows its free) when the last importer is gone. Opening a
 * handle whose exporter has exited, or whose block was freed with no importer, fails with
 * CUDA_ERROR_MAP_FAILED, as the driver's own handles do. Handles the shim did not make pass to the
 * driver untouched; so do events.
 *
 * A fork child inherits descriptors, not the exports or imports: it closes its copies of the
 * server's sockets and of the imports' connections (an importer's fork child would otherwise keep
 * the exporter's block held after the importer closed it), and starts its own server if it
 * exports. The exports of a pool whose context goes away are forgotten with it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "vmmshim/share.h"

#define VS_IPC_MAGIC "vmmshim\x01"
#define VS_IPC_MAX_SEGS 64
#define VS_IPC_MAX_CONNS 256

/* The handle, as the 64 bytes of a CUipcMemHandle. */
typedef struct vs_ipc_handle_s {
  char magic[8];
  uint32_t pid;
  int32_t dev;
  uint64_t nonce;
  uint64_t id;
  uint64_t size;
  char note[24]; /* for a person looking at the bytes */
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

atomic_int _vs_ipc_exports; /* exports alive: frees look here only when there are any */

/* ------------------------------------------------------------------ exports */

typedef struct vs_export_s {
  uint64_t id;
  CUdeviceptr ptr;
  size_t size, requested;
  vs_pool_t *pool;
  int opens;   /* importers holding it, and requests being answered */
  bool freed;  /* the program freed it while open: the pool gets it back when opens reaches 0 */
  vmmshim_api_t free_api;
  struct vs_export_s *next;
} vs_export_t;

static vs_export_t *vs_exports;
static uint64_t vs_export_next = 1;
static uint64_t vs_nonce;
static pid_t vs_server_pid; /* the process whose server runs; 0: none */
static pthread_mutex_t vs_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

static vs_export_t *export_by_ptr(CUdeviceptr ptr) {
  for (vs_export_t *e = vs_exports; e; e = e->next)
    if (e->ptr == ptr) return e;
  return NULL;
}

static vs_export_t *export_by_id(uint64_t id) {
  for (vs_export_t *e = vs_exports; e; e = e->next)
    if (e->id == id) return e;
  return NULL;
}

static void export_remove(vs_export_t *x) {
  for (vs_export_t **pp = &vs_exports; *pp; pp = &(*pp)->next)
    if (*pp == x) {
      *pp = x->next;
      free(x);
      atomic_fetch_sub(&_vs_ipc_exports, 1);
      return;
    }
}

static void socket_name(struct sockaddr_un *a, socklen_t *len, uint32_t pid, uint64_t nonce) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "vmmshim-ipc-%u-%016llx", pid, (unsigned long long)nonce);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ------------------------------------------------------------------ the exporter's server */

typedef struct vs_conn_s {
  int fd;
  uint64_t holds; /* the export this connection holds open, 0 none */
} vs_conn_t;

/* Room for the descriptors of a reply, aligned as a cmsghdr must be. */
typedef union vs_ipc_ctrl_u {
  char buf[CMSG_SPACE(sizeof(int) * VS_IPC_MAX_SEGS)];
  struct cmsghdr align;
} vs_ipc_ctrl_t;

static int send_reply(int fd, const vs_ipc_reply_t *rep, const int *fds, unsigned nfds) {
  struct iovec iov = {(void *)rep, sizeof *rep};
  vs_ipc_ctrl_t ctrl;
  struct msghdr m = {0};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (nfds) {
    memset(&ctrl, 0, sizeof ctrl);
    m.msg_control = ctrl.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  ssize_t w;
  do w = sendmsg(fd, &m, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)sizeof *rep ? 0 : -1;
}

/* The last importer of a block the program freed is gone: the block goes back to the pool. Lock
 * held (throughout: a pool's exports are forgotten under it before the pool is destroyed). */
static void give_back(vs_export_t *x) {
  vs_pool_t *pool = x->pool;
  CUdeviceptr ptr = x->ptr;
  vmmshim_api_t api = x->free_api;
  export_remove(x);
  CUcontext popped;
  bool pushed = _vs_cu.cuCtxPushCurrent(_vs_pool_context(pool)) == CUDA_SUCCESS;
  size_t size, requested;
  CUresult err;
  _vs_pool_free(pool, ptr, VS_NO_STREAM, api, &size, &requested, &err); /* counted at the program's free */
  if (pushed) _vs_cu.cuCtxPopCurrent(&popped);
  _vs_debug("ipc: block 0x%llx, freed while open in another process, is back in the pool", (unsigned long long)ptr);
}

/* Lock held. */
static void release_hold_locked(vs_conn_t *c) {
  if (!c->holds) return;
  vs_export_t *x = export_by_id(c->holds);
  if (x && --x->opens == 0 && x->freed) give_back(x);
  c->holds = 0;
}

/* A reply that refuses the request with `status`; false, as answer() returns for it. */
static bool refuse(int fd, int32_t status) {
  vs_ipc_reply_t rep;
  memset(&rep, 0, sizeof rep);
  rep.status = status;
  send_reply(fd, &rep, NULL, 0);
  return false;
}

/* One request: the importer's credentials, the export, its handles as descriptors. Returns false
 * when the connection is to be closed (a refusal: the reply is all the importer gets). */
static bool answer(vs_conn_t *c) {
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != geteuid()) {
    _vs_warn("ipc: a process of user %d asked for a handle of this process (user %d): refused",
             cl == sizeof cred ? (int)cred.uid : -1, (int)geteuid());
    return refuse(c->fd, VS_IPC_DENIED);
  }
  vs_ipc_request_t req;
  ssize_t r;
  do r = recv(c->fd, &req, sizeof req, MSG_WAITALL); /* the socket times out: a stalled client cannot stop the server */
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)sizeof req || memcmp(req.magic, VS_IPC_MAGIC, 8) != 0 || c->holds)
    return refuse(c->fd, VS_IPC_FAILED);
  /* The lock is held while the handles are exported: the pool cannot go away meanwhile, and a
   * free of the block waits, then finds it open. */
  pthread_mutex_lock(&vs_ipc_lock);
  vs_export_t *x = export_by_id(req.id);
  if (!x || x->freed) {
    pthread_mutex_unlock(&vs_ipc_lock);
    return refuse(c->fd, VS_IPC_GONE);
  }
  CUmemGenericAllocationHandle handles[VS_IPC_MAX_SEGS];
  size_t sizes[VS_IPC_MAX_SEGS], offset = 0;
  int n = 0, fds[VS_IPC_MAX_SEGS];
  bool ok = _vs_pool_handles_of(x->pool, x->ptr, &offset, handles, sizes, VS_IPC_MAX_SEGS, &n) == VS_POOL_OK;
  if (!ok) _vs_warn("ipc: block 0x%llx lies on more than %d handles; it cannot be shared", (unsigned long long)x->ptr,
                    VS_IPC_MAX_SEGS);
  int nfds = 0;
  vs_ipc_reply_t rep;
  memset(&rep, 0, sizeof rep);
  const vs_device_caps_t *caps = _vs_pool_caps(x->pool);
  for (int i = 0; ok && i < n; i++) {
    ok = _vs_vmm_export(caps, handles[i], &fds[i]) == CUDA_SUCCESS;
    if (ok) nfds++;
  }
  if (ok) {
    rep.status = VS_IPC_OK;
    rep.nsegs = (uint32_t)n;
    rep.offset = offset;
    for (int i = 0; i < n; i++) rep.seg_size[i] = sizes[i];
    x->opens++; /* until the importer closes the connection */
    c->holds = req.id;
  } else {
    rep.status = VS_IPC_FAILED;
  }
  pthread_mutex_unlock(&vs_ipc_lock);
  bool sent = send_reply(c->fd, &rep, ok ? fds : NULL, ok ? (unsigned)nfds : 0) == 0;
  for (int i = 0; i < nfds; i++) close(fds[i]);
  return ok && sent; /* held until the importer closes the connection */
}

static int vs_listen_fd = -1;
/* The server's connections: changed under the lock, so that a fork child (whose atfork handler
 * runs with the lock taken in the parent) finds them whole and closes its copies. */
static vs_conn_t vs_conns[VS_IPC_MAX_CONNS];
static int vs_nconn;

static void *server_main(void *arg) {
  (void)arg;
  _vs_guard++; /* the driver calls made here are the shim's own */
  struct timeval tmo = {1, 0};
  for (;;) {
    struct pollfd pfd[VS_IPC_MAX_CONNS + 1];
    pfd[0] = (struct pollfd){vs_listen_fd, POLLIN, 0};
    int nconn = vs_nconn;
    for (int i = 0; i < nconn; i++) pfd[i + 1] = (struct pollfd){vs_conns[i].fd, POLLIN, 0};
    int r = poll(pfd, (nfds_t)nconn + 1, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      _vs_warn("ipc: poll: %s; this process stops answering IPC handles", strerror(errno));
      return NULL;
    }
    for (int i = nconn; i-- > 0;) {
      if (!pfd[i + 1].revents) continue;
      vs_conn_t *c = &vs_conns[i];
      char peek;
      ssize_t k = recv(c->fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT);
      if (k > 0 && !c->holds && answer(c)) continue;
      if (k > 0 && c->holds) { /* an importer sends nothing after its request: drop stray bytes */
        char junk[64];
        if (recv(c->fd, junk, sizeof junk, MSG_DONTWAIT) > 0) continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      /* Closed: the importer closed its handle or exited (or was refused). */
      pthread_mutex_lock(&vs_ipc_lock);
      release_hold_locked(c);
      close(c->fd);
      vs_conns[i] = vs_conns[--vs_nconn];
      pthread_mutex_unlock(&vs_ipc_lock);
    }
    if (pfd[0].revents & POLLIN) {
      int fd = accept4(vs_listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0 && vs_nconn < VS_IPC_MAX_CONNS) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo);
        pthread_mutex_lock(&vs_ipc_lock);
        vs_conns[vs_nconn++] = (vs_conn_t){fd, 0};
        pthread_mutex_unlock(&vs_ipc_lock);
      } else if (fd >= 0) {
        _vs_warn("ipc: more than %d handles open in other processes; a request is refused", VS_IPC_MAX_CONNS);
        close(fd);
      }
    }
  }
}

static void atfork_prepare(void);
static void atfork_parent(void);
static void atfork_child(void);
static pthread_once_t vs_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Starts this process's server on its first export. Lock held. */
static int start_server(void) {
  if (vs_server_pid == getpid()) return 0;
  pthread_once(&vs_atfork_once, atfork_register);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  vs_nonce = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&fd;
  struct sockaddr_un a;
  socklen_t len;
  socket_name(&a, &len, (uint32_t)getpid(), vs_nonce);
  if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 64) != 0) {
    _vs_warn("ipc: cannot listen on @%s: %s", a.sun_path + 1, strerror(errno));
    close(fd);
    return -1;
  }
  vs_listen_fd = fd;
  pthread_t t;
  int rc = _vs_thread_start(&t, server_main, NULL);
  if (rc != 0) {
    close(fd);
    vs_listen_fd = -1;
    return -1;
  }
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
  pthread_mutex_lock(&vs_ipc_lock);
  if (start_server() != 0) {
    pthread_mutex_unlock(&vs_ipc_lock);
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return true;
  }
  vs_export_t *x = export_by_ptr(ptr);
  if (x && x->freed) { /* freed by the program, still open elsewhere: not a live allocation */
    pthread_mutex_unlock(&vs_ipc_lock);
    *err = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (!x) {
    x = calloc(1, sizeof *x);
    if (!x) {
      pthread_mutex_unlock(&vs_ipc_lock);
      *err = CUDA_ERROR_OUT_OF_MEMORY;
      return true;
    }
    x->id = vs_export_next++;
    x->ptr = ptr;
    x->size = served;
    x->requested = size;
    x->pool = pool;
    x->next = vs_exports;
    vs_exports = x;
    atomic_fetch_add(&_vs_ipc_exports, 1);
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
  pthread_mutex_unlock(&vs_ipc_lock);
  memcpy(out, &h, sizeof h);
  _vs_debug("ipc: handle %llu for block 0x%llx (%zu bytes)", (unsigned long long)h.id, (unsigned long long)ptr, size);
  return true;
}

vs_ipc_free_t _vs_ipc_on_free(CUdeviceptr ptr, vmmshim_api_t api) {
  pthread_mutex_lock(&vs_ipc_lock);
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
  } else if (x) {
    export_remove(x); /* no importer: its handle goes stale with the free */
  }
  pthread_mutex_unlock(&vs_ipc_lock);
  return r;
}

void _vs_ipc_forget_pool(vs_pool_t *pool) {
  if (!atomic_load(&_vs_ipc_exports)) return;
  pthread_mutex_lock(&vs_ipc_lock);
  for (vs_export_t *x = vs_exports, *next; x; x = next) {
    next = x->next;
    if (x->pool == pool) export_remove(x); /* its memory goes with the context; open copies elsewhere stay */
  }
  pthread_mutex_unlock(&vs_ipc_lock);
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
static pthread_mutex_t vs_import_lock = PTHREAD_MUTEX_INITIALIZER;

static void unmap_import(vs_import_t *im, int mapped) {
  size_t off = 0;
  for (int i = 0; i < im->n; i++) {
    if (i < mapped) _vs_vmm_unmap(&im->caps, im->va + off, im->sizes[i]);
    off += im->sizes[i];
    if (im->handles[i]) _vs_vmm_release(&im->caps, im->handles[i], im->sizes[i]);
  }
  if (im->va) _vs_vmm_address_free(&im->caps, im->va, im->total);
}

/* Asks the exporter for the handles; fills im (handles imported, fds closed). */
static CUresult fetch(const vs_ipc_handle_t *h, vs_import_t *im) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct sockaddr_un a;
  socklen_t len;
  socket_name(&a, &len, h->pid, h->nonce);
  if (connect(fd, (struct sockaddr *)&a, len) != 0) {
    _vs_warn("ipc: the process that made this handle (pid %u) is gone: %s", h->pid, strerror(errno));
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != geteuid() ||
      (uint32_t)cred.pid != h->pid) {
    _vs_warn("ipc: the socket of pid %u belongs to another process or user; not opened", h->pid);
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  vs_ipc_request_t req;
  memcpy(req.magic, VS_IPC_MAGIC, 8);
  req.id = h->id;
  vs_ipc_reply_t rep;
  vs_ipc_ctrl_t ctrl;
  struct iovec iov = {&rep, sizeof rep};
  struct msghdr m = {0};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl.buf;
  m.msg_controllen = sizeof ctrl.buf;
  ssize_t r;
  if (send(fd, &req, sizeof req, MSG_NOSIGNAL) != (ssize_t)sizeof req) r = -1;
  else do r = recvmsg(fd, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
  int fds[VS_IPC_MAX_SEGS], nfds = 0;
  for (struct cmsghdr *c = r > 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      if (nfds > VS_IPC_MAX_SEGS) nfds = VS_IPC_MAX_SEGS;
      memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)nfds);
    }
  CUresult res = CUDA_SUCCESS;
  if (r != (ssize_t)sizeof rep) {
    _vs_warn("ipc: no answer from pid %u for handle %llu", h->pid, (unsigned long long)h->id);
    res = CUDA_ERROR_MAP_FAILED;
  } else if (rep.status != VS_IPC_OK) {
    _vs_warn("ipc: pid %u refused handle %llu: %s", h->pid, (unsigned long long)h->id,
             rep.status == VS_IPC_DENIED ? "this process runs as another user"
             : rep.status == VS_IPC_GONE ? "its block was freed" : "it could not export its memory");
    res = CUDA_ERROR_MAP_FAILED;
  } else if ((int)rep.nsegs != nfds || !nfds) {
    res = CUDA_ERROR_MAP_FAILED;
  }
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
  pthread_once(&vs_atfork_once, atfork_register);
  CUdevice dev = 0;
  if (_vs_cu.cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
    *err = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  pthread_mutex_lock(&vs_import_lock);
  for (vs_import_t *im = vs_imports; im; im = im->next)
    if (im->pid == h.pid && im->nonce == h.nonce && im->id == h.id && im->caps.device == dev) {
      im->refs++; /* opened again by this context: the same address, one more reference */
      *pdptr = im->ptr;
      pthread_mutex_unlock(&vs_import_lock);
      return true;
    }
  pthread_mutex_unlock(&vs_import_lock);
  /* The pid alone could be a process of another pid namespace, or an exited one whose pid was
   * reused: the nonce says whether this process made it. */
  pthread_mutex_lock(&vs_ipc_lock);
  bool own = h.pid == (uint32_t)getpid() && vs_server_pid == getpid() && h.nonce == vs_nonce;
  pthread_mutex_unlock(&vs_ipc_lock);
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
  if (r == CUDA_SUCCESS) r = fetch(&h, im);
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
  pthread_mutex_lock(&vs_import_lock);
  im->next = vs_imports;
  vs_imports = im;
  pthread_mutex_unlock(&vs_import_lock);
  *pdptr = im->ptr;
  _vs_info("ipc: opened handle %llu of pid %u at 0x%llx (%zu bytes in %d handles)", (unsigned long long)h.id, h.pid,
           (unsigned long long)im->ptr, (size_t)h.size, im->n);
  return true;
}

bool _vs_ipc_close(CUdeviceptr ptr, CUresult *err) {
  *err = CUDA_SUCCESS;
  if (_vs_guard || !ptr) return false;
  pthread_mutex_lock(&vs_import_lock);
  vs_import_t **pp = &vs_imports, *im = NULL;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) {
      im = *pp;
      break;
    }
  if (!im) {
    pthread_mutex_unlock(&vs_import_lock);
    return false; /* not a shim handle's memory: the driver's */
  }
  if (--im->refs > 0) {
    pthread_mutex_unlock(&vs_import_lock);
    return true;
  }
  *pp = im->next;
  pthread_mutex_unlock(&vs_import_lock);
  unmap_import(im, im->n);
  close(im->conn); /* the exporter sees the handle closed */
  _vs_info("ipc: closed handle %llu of pid %u", (unsigned long long)im->id, im->pid);
  free(im);
  return true;
}

/* ------------------------------------------------------------------ fork */

/* The lists are whole when the child copies them: both locks are taken around fork(). */
static void atfork_prepare(void) {
  pthread_mutex_lock(&vs_import_lock);
  pthread_mutex_lock(&vs_ipc_lock);
}

static void atfork_parent(void) {
  pthread_mutex_unlock(&vs_ipc_lock);
  pthread_mutex_unlock(&vs_import_lock);
}

/* The child has no server thread and owns neither the parent's exports nor its imports: it closes
 * its copies of their sockets (an open import's connection would keep the exporter's block held
 * after the parent closed it) and forgets them. */
static void atfork_child(void) {
  if (vs_listen_fd >= 0) close(vs_listen_fd);
  vs_listen_fd = -1;
  for (int i = 0; i < vs_nconn; i++) close(vs_conns[i].fd);
  vs_nconn = 0;
  vs_server_pid = 0;
  for (vs_export_t *x = vs_exports, *next; x; x = next) {
    next = x->next;
    free(x);
  }
  vs_exports = NULL;
  atomic_store(&_vs_ipc_exports, 0);
  for (vs_import_t *im = vs_imports, *next; im; im = next) {
    next = im->next;
    close(im->conn);
    free(im);
  }
  vs_imports = NULL;
  pthread_mutex_init(&vs_ipc_lock, NULL);
  pthread_mutex_init(&vs_import_lock, NULL);
}

/* ------------------------------------------------------------------ sleep */

int _vs_ipc_held_ranges(vs_pool_t *pool, CUdeviceptr *va, size_t *len, int max) {
  int n = 0;
  if (!atomic_load(&_vs_ipc_exports)) return 0;
  pthread_mutex_lock(&vs_ipc_lock);
  for (vs_export_t *e = vs_exports; e && n < max; e = e->next)
    if (e->pool == pool && e->opens > 0) {
      va[n] = e->ptr;
      len[n++] = e->size;
    }
  pthread_mutex_unlock(&vs_ipc_lock);
  return n;
}
