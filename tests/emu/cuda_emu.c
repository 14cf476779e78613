/* Host emulation of the CUDA driver (libcuda.so.1) for the CPU tests of vmmshim.
 * See emu.h for the model and the test-control API.
 *
 * Every entry point is a static function e_<symbol>; the exported symbols are aliases of
 * them, and the cuGetProcAddress table holds the static addresses. Internal calls never
 * go through an exported symbol, so a preloaded library that overrides the exported
 * names (the shim) is never re-entered by the emulation. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

#include "emu.h"

#define EXPORT(sym, impl) \
  extern __typeof__(impl) emu_x_##impl __asm__(#sym) __attribute__((alias(#impl), visibility("default")));
#define API __attribute__((visibility("default")))

#define EMU_MAXDEV 4
#define MAGIC_CTX 0x43545821u
#define MAGIC_STREAM 0x53545221u
#define MAGIC_EVENT 0x45564e21u
#define MAGIC_GRAPH 0x47525021u
#define MAGIC_POOL 0x504f4c21u

/* ------------------------------------------------------------------ state */

static pthread_mutex_t g_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static _Thread_local int tl_mu_depth; /* how deep this thread holds g_mu (wait_value lets go of it) */
static void lock_mu(void) {
  pthread_mutex_lock(&g_mu);
  tl_mu_depth++;
}
static void unlock_cb(int *unused) {
  (void)unused;
  tl_mu_depth--;
  pthread_mutex_unlock(&g_mu);
}
#define LOCKED() __attribute__((cleanup(unlock_cb), unused)) int lk_ = (lock_mu(), 0)

enum {
#define EMU_ENUM(name) FN_##name,
  EMU_FUNCS(EMU_ENUM)
#undef EMU_ENUM
  FN_COUNT
};
static const char *const g_fn_names[FN_COUNT] = {
#define EMU_NAME(name) #name,
    EMU_FUNCS(EMU_NAME)
#undef EMU_NAME
};

static unsigned long long g_calls[FN_COUNT];
static unsigned long long g_lookups, g_lookups_nf;
static struct { CUresult err; int skip, count; } g_fault[FN_COUNT]; /* skip calls succeed, then count fail */
static int g_violations;
static long g_device_faults; /* emu_device_access refusals (also violations) */

static int g_inited;
static int g_devcount = 1;
static int g_eager; /* emu_set_eager: an event recorded after no pending launch completes at once */
static size_t g_gran = 2ull << 20;
static int g_cap_vmm = 1, g_cap_fd = 1, g_cap_rdma = 1;
/* Host-location handles (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST / HOST_NUMA): supported or
 * not (emu_set_host_vmm), and the host memory they draw from (emu_set_host_memory). */
static int g_cap_host_vmm = 1;
/* CPU access descriptors (location HOST / HOST_NUMA) on host-location memory: granted or answered
 * CUDA_ERROR_NOT_SUPPORTED (emu_set_host_cpu_access), as by a driver that refuses them. */
static int g_cap_host_cpu = 1;
static size_t g_host_total = 16ull << 30, g_host_used;
/* emu_delay_next: the next count calls of a function sleep this long first (a slow driver). */
static struct { unsigned us; int count; } g_delay[FN_COUNT];
/* emu_set_peer_capable: g_peer_off[dev][peer] = 1 when dev cannot access peer's memory */
static unsigned char g_peer_off[EMU_MAXDEV][EMU_MAXDEV];

struct CUctx_st;
struct CUstream_st;

typedef struct device_s {
  size_t total;
  size_t used; /* handles + plain */
  struct CUctx_st *primary;
  int primary_refs;
  unsigned primary_flags;
} device_t;
static device_t g_dev[EMU_MAXDEV] = {
    {4ull << 30, 0, NULL, 0, 0}, {4ull << 30, 0, NULL, 0, 0}, {4ull << 30, 0, NULL, 0, 0}, {4ull << 30, 0, NULL, 0, 0}};
/* Whether size more bytes fit in the device's budget. */
static int dev_fits(const device_t *d, size_t size) { return d->used <= d->total && size <= d->total - d->used; }

struct CUctx_st {
  uint32_t magic;
  int dev;
  int is_primary;
  int alive;
  size_t charged; /* the device memory the context itself takes (emu_set_context_memory) */
  struct CUstream_st *legacy;
  struct CUctx_st *next;
};
static struct CUctx_st *g_ctxs;
/* emu_set_context_memory: what a context and each loaded module take of their device. */
static size_t g_ctx_bytes, g_mod_bytes;
static void module_drop_ctx(struct CUctx_st *ctx);

/* Peer access: contexts `from` may access plain cuMemAlloc memory of context `to`
 * (cuCtxEnablePeerAccess called in `from` with peerContext `to`). */
typedef struct peer_s {
  struct CUctx_st *from, *to;
  struct peer_s *next;
} peer_t;
static peer_t *g_peers;

/* The default (and current) memory pool of each device. access[d]: what the pool grants
 * device d (cuMemPoolSetAccess); the owner always has read-write. Its memory (emu.h): the
 * cuMemAllocAsync allocations of the device (live, or freed and not yet reached by their
 * stream) and `idle` bytes freed and kept, all counted in the device's physical use. */
struct CUmemPoolHandle_st {
  uint32_t magic;
  int dev;
  unsigned long long access[EMU_MAXDEV];
  size_t idle;                     /* freed memory the pool holds on to */
  size_t used_high, reserved_high; /* CU_MEMPOOL_ATTR_*_MEM_HIGH */
  cuuint64_t threshold;            /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0) */
  int reuse_off[3];                /* the CU_MEMPOOL_ATTR_REUSE_* flags, 1 once disabled */
};
static struct CUmemPoolHandle_st g_pools[EMU_MAXDEV] = {
    {.magic = MAGIC_POOL, .dev = 0}, {.magic = MAGIC_POOL, .dev = 1}, {.magic = MAGIC_POOL, .dev = 2},
    {.magic = MAGIC_POOL, .dev = 3}};

enum { K_USER = 0, K_MARK, K_FREE, K_WAIT, K_COPY, K_SET, K_WAITVAL, K_WRITEVAL };
typedef struct item_s {
  struct item_s *next;
  int kind;
  void (*fn)(void *);
  void *arg;
  uint64_t gseq;
  CUdeviceptr ptr;             /* K_FREE */
  struct CUstream_st *wstream; /* K_WAIT */
  uint64_t wtarget;
  CUdeviceptr dst, src; /* K_COPY (src, dst), K_SET (dst), K_WAITVAL and K_WRITEVAL (dst) */
  size_t n;
  unsigned char byte; /* K_SET of 1-byte elements */
  int width;          /* K_SET: element size (0 or 1, 2, 4); K_WAITVAL, K_WRITEVAL: 4 or 8 */
  uint64_t val;       /* K_SET of 2- and 4-byte elements, K_WAITVAL, K_WRITEVAL */
  unsigned vflags;    /* K_WAITVAL: CU_STREAM_WAIT_VALUE_* */
} item_t;

enum { S_USER = 0, S_LEGACY, S_PTS };
struct CUstream_st {
  uint32_t magic;
  int kind;
  unsigned flags;
  int prio;
  int tid; /* S_PTS: owning thread */
  struct CUctx_st *ctx;
  item_t *head, *tail;
  uint64_t enq, done; /* items enqueued / completed, all kinds */
  int n_user;         /* pending emu_launch items */
  int waiting;        /* its head is being completed through its dependencies (complete_head, wait_value) */
  int waiter;         /* by this thread (my_tid) */
  /* capture */
  int cap; /* 0 none, 1 active, 2 invalidated */
  CUstreamCaptureMode cap_mode;
  int cap_tid;
  uint64_t cap_id;
  struct CUstream_st *cap_origin;
  int cap_items;
  CUdeviceptr *cap_frees;
  size_t cap_nfrees, cap_capfrees;
  struct CUstream_st *next;
};
static struct CUstream_st *g_streams;
static uint64_t g_gseq = 1;
static uint64_t g_cap_next = 1;

struct CUevent_st {
  uint32_t magic;
  unsigned flags;
  struct CUctx_st *ctx;
  struct CUstream_st *stream; /* NULL: complete */
  uint64_t target;
  int captured;
  struct CUevent_st *next;
};
static struct CUevent_st *g_events;

struct CUgraph_st {
  uint32_t magic;
  uint64_t cap_id;
  CUdeviceptr *frees;
  size_t nfrees;
  struct CUgraph_st *next;
};
static struct CUgraph_st *g_graphs;

/* Where a plain allocation came from: cuMemAlloc (legacy IPC capable, shared with peers by
 * cuCtxEnablePeerAccess), cuMemAllocAsync outside a capture (the device's default pool, shared
 * by cuMemPoolSetAccess), or a captured cuMemAllocAsync (a graph allocation: its device only). */
enum { P_ALLOC = 0, P_POOL, P_GRAPH, P_MANAGED };
typedef struct plain_s {
  CUdeviceptr base;
  size_t size, maplen;
  int dev;
  int origin; /* P_* */
  struct CUctx_st *ctx;
  uint64_t cap_id;
  int free_pending;
  struct plain_s *next;
} plain_t;
static plain_t *g_plain;

typedef struct resv_s {
  CUdeviceptr base;
  size_t size;
  struct resv_s *next;
} resv_t;
static resv_t *g_resv;

typedef struct handle_s {
  CUmemGenericAllocationHandle id;
  int fd;
  size_t size;
  int dev;
  unsigned long long req_types;
  int rdma;
  CUmemAllocationProp prop;
  int host;     /* a host-location handle: host memory, mapped at device addresses */
  int refs;     /* creation + retains - releases */
  int mapcount; /* live mappings */
  struct handle_s *next;
} handle_t;
static handle_t *g_handles;
static CUmemGenericAllocationHandle g_handle_next = 0x1000;

typedef struct mapping_s {
  CUdeviceptr va;
  size_t size;
  size_t offset;
  handle_t *h;
  unsigned long long access[EMU_MAXDEV];
  unsigned long long cpu_access; /* a HOST / HOST_NUMA descriptor's flags (host-location memory only) */
  struct mapping_s *next;
} mapping_t;
static mapping_t *g_maps;

static _Thread_local struct CUctx_st *tl_ctx;
static _Thread_local struct CUctx_st *tl_stack[32];
static _Thread_local int tl_depth;
static _Thread_local int tl_tid;
static _Thread_local CUstreamCaptureMode tl_capmode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static int g_tid_next = 1;

static int my_tid(void) {
  if (!tl_tid) tl_tid = __atomic_add_fetch(&g_tid_next, 1, __ATOMIC_RELAXED);
  return tl_tid;
}

/* ------------------------------------------------------------------ helpers */

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  __atomic_add_fetch(&g_violations, 1, __ATOMIC_RELAXED);
  fprintf(stderr, "emu: contract violation: %s\n", buf);
}

/* The injected failure of this call of fn, CUDA_SUCCESS when none (emu_fail_after). Lock held. */
static CUresult injected(int fn) {
  if (g_fault[fn].count <= 0) return CUDA_SUCCESS;
  if (g_fault[fn].skip > 0) {
    g_fault[fn].skip--;
    return CUDA_SUCCESS;
  }
  g_fault[fn].count--;
  return g_fault[fn].err;
}

/* emu_hold_next: the function whose next call is parked, and whether one is parked now. */
static pthread_mutex_t g_hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hold_cv = PTHREAD_COND_INITIALIZER;
static int g_hold_fn = -1, g_holding;

static CUresult enter(int fn) {
  unsigned delay = 0;
  {
    LOCKED();
    if (g_delay[fn].count > 0) {
      g_delay[fn].count--;
      delay = g_delay[fn].us;
    }
  }
  if (delay) usleep(delay); /* outside the lock: other threads' calls go on meanwhile */
  pthread_mutex_lock(&g_hold_mu);
  if (g_hold_fn == fn) { /* parked outside the lock too, until emu_release_hold */
    g_hold_fn = -1;
    g_holding = 1;
    pthread_cond_broadcast(&g_hold_cv);
    while (g_holding) pthread_cond_wait(&g_hold_cv, &g_hold_mu);
  }
  pthread_mutex_unlock(&g_hold_mu);
  LOCKED();
  g_calls[fn]++;
  return injected(fn);
}
#define ENTER(name)                                 \
  do {                                              \
    CUresult fault_ = enter(FN_##name);             \
    if (fault_ != CUDA_SUCCESS) return fault_;      \
  } while (0)
/* ENTER for a function whose name cuda.h defines as a macro (pasted, never expanded). */
#define ENTER_FN(fn)                                \
  do {                                              \
    CUresult fault_ = enter(fn);                    \
    if (fault_ != CUDA_SUCCESS) return fault_;      \
  } while (0)
#define NEED_INIT()                                      \
  do {                                                   \
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;    \
  } while (0)

static int fcntl_dupfd(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }
static int is_pow2(size_t x) { return x && !(x & (x - 1)); }
static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static CUresult cur_ctx(struct CUctx_st **out) {
  if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
  struct CUctx_st *c = tl_ctx;
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

static int valid_ctx(struct CUctx_st *c) {
  for (struct CUctx_st *p = g_ctxs; p; p = p->next)
    if (p == c) return 1;
  return 0;
}

static struct CUstream_st *new_stream(struct CUctx_st *ctx, int kind, unsigned flags, int prio) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->magic = MAGIC_STREAM;
  s->kind = kind;
  s->flags = flags;
  s->prio = prio;
  s->ctx = ctx;
  s->next = g_streams;
  g_streams = s;
  return s;
}

static int valid_stream(struct CUstream_st *s) {
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    if (p == s) return 1;
  return 0;
}

static struct CUstream_st *pts_stream(struct CUctx_st *ctx) {
  int tid = my_tid();
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    if (p->kind == S_PTS && p->ctx == ctx && p->tid == tid) return p;
  struct CUstream_st *s = new_stream(ctx, S_PTS, 0, 0);
  if (s) s->tid = tid;
  return s;
}

/* Resolve a stream handle. ptsz: NULL means the per-thread stream. */
static CUresult resolve_stream(CUstream h, int ptsz, struct CUstream_st **out) {
  if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    struct CUctx_st *c;
    CUresult r = cur_ctx(&c);
    if (r) return r;
    if (h == CU_STREAM_PER_THREAD || (h == NULL && ptsz)) {
      *out = pts_stream(c);
      return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = c->legacy;
    return CUDA_SUCCESS;
  }
  struct CUstream_st *s = (struct CUstream_st *)h;
  if (!valid_stream(s) || s->magic != MAGIC_STREAM) {
    violation("invalid or destroyed stream %p", (void *)h);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = s;
  return CUDA_SUCCESS;
}

static int is_blocking(const struct CUstream_st *s) {
  return s->kind == S_PTS || (s->kind == S_USER && !(s->flags & CU_STREAM_NON_BLOCKING));
}

/* A blocking stream of ctx with a capture in progress (the legacy stream is unusable). */
static struct CUstream_st *blocking_capture(struct CUctx_st *ctx) {
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    if (p->ctx == ctx && p->cap && is_blocking(p)) return p;
  return NULL;
}

static void invalidate_capture(struct CUstream_st *s) {
  struct CUstream_st *origin = s->cap_origin ? s->cap_origin : s;
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    if (p->cap && p->cap_origin == origin) p->cap = 2;
}

/* Legacy stream used while a blocking stream captures. */
static CUresult check_legacy_use(struct CUstream_st *s, const char *what) {
  if (s->kind != S_LEGACY) return CUDA_SUCCESS;
  struct CUstream_st *c = blocking_capture(s->ctx);
  if (!c) return CUDA_SUCCESS;
  violation("%s on the legacy stream while a blocking stream captures (implicit dependency)", what);
  invalidate_capture(c);
  return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

/* Is the calling thread prohibited from potentially unsafe calls (capture-mode rules)?
 * Returns the offending capture's stream. */
static struct CUstream_st *unsafe_prohibited(void) {
  if (tl_capmode == CU_STREAM_CAPTURE_MODE_RELAXED) return NULL;
  int tid = my_tid();
  for (struct CUstream_st *p = g_streams; p; p = p->next) {
    if (p->cap != 1 || p->cap_origin != p) continue;
    if (p->cap_tid == tid && p->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED) return p;
    if (tl_capmode == CU_STREAM_CAPTURE_MODE_GLOBAL && p->cap_tid != tid &&
        p->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
      return p;
  }
  return NULL;
}

static CUresult check_unsafe(const char *what) {
  struct CUstream_st *p = unsafe_prohibited();
  if (!p) return CUDA_SUCCESS;
  violation("%s while a stream capture prohibits unsafe calls (capture mode)", what);
  invalidate_capture(p);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* ------------------------------------------------------------------ plain memory */

static plain_t *find_plain_base(CUdeviceptr p) {
  for (plain_t *a = g_plain; a; a = a->next)
    if (a->base == p) return a;
  return NULL;
}
static plain_t *find_plain_in(CUdeviceptr p) {
  for (plain_t *a = g_plain; a; a = a->next)
    if (p >= a->base && p < a->base + a->size) return a;
  return NULL;
}

/* ---- the default pools' accounting (emu.h): used, reserve, release ---- */

/* Bytes of dev's live pool allocations (those freed with cuMemFreeAsync no longer count). */
static size_t pool_used(int dev) {
  size_t n = 0;
  for (plain_t *a = g_plain; a; a = a->next)
    if (a->dev == dev && a->origin == P_POOL && !a->free_pending) n += a->size;
  return n;
}
/* The pool's backing memory: its allocations (freed ones included until their stream reaches
 * the free) and what it holds idle. */
static size_t pool_reserved(int dev) {
  size_t n = g_pools[dev].idle;
  for (plain_t *a = g_plain; a; a = a->next)
    if (a->dev == dev && a->origin == P_POOL) n += a->size;
  return n;
}
static void pool_note_high(int dev) {
  struct CUmemPoolHandle_st *p = &g_pools[dev];
  size_t u = pool_used(dev), r = pool_reserved(dev);
  if (u > p->used_high) p->used_high = u;
  if (r > p->reserved_high) p->reserved_high = r;
}
/* Gives idle memory back to the device until the reserve is at most keep (or nothing idle is
 * left): at a synchronisation (down to the release threshold) and cuMemPoolTrimTo. */
static void pool_release(int dev, size_t keep) {
  struct CUmemPoolHandle_st *p = &g_pools[dev];
  size_t r = pool_reserved(dev);
  if (r <= keep || !p->idle) return;
  size_t give = r - keep < p->idle ? r - keep : p->idle;
  p->idle -= give;
  g_dev[dev].used -= give;
}

static CUresult plain_alloc(struct CUctx_st *ctx, size_t size, uint64_t cap_id, int origin, CUdeviceptr *out) {
  device_t *d = &g_dev[ctx->dev];
  /* A pool allocation takes the pool's idle memory first: only the rest is new. */
  size_t reuse = 0;
  if (origin == P_POOL) {
    reuse = g_pools[ctx->dev].idle < size ? g_pools[ctx->dev].idle : size;
    g_pools[ctx->dev].idle -= reuse;
    d->used -= reuse;
  }
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  size_t len = round_up(size, (size_t)sysconf(_SC_PAGESIZE));
  void *m = MAP_FAILED;
  plain_t *a = NULL;
  if (dev_fits(d, size))
    m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m != MAP_FAILED && (a = calloc(1, sizeof *a)) == NULL) munmap(m, len);
  if (!a) {
    g_pools[ctx->dev].idle += reuse;
    d->used += reuse;
    return r;
  }
  a->base = (CUdeviceptr)(uintptr_t)m;
  a->size = size;
  a->maplen = len;
  a->dev = ctx->dev;
  a->ctx = ctx;
  a->origin = origin;
  a->cap_id = cap_id;
  a->next = g_plain;
  g_plain = a;
  d->used += size;
  *out = a->base;
  if (origin == P_POOL) pool_note_high(ctx->dev);
  return CUDA_SUCCESS;
}

/* A pool allocation's memory stays with the pool, idle, until a release gives it back. */
static void plain_free(plain_t *a) {
  for (plain_t **pp = &g_plain; *pp; pp = &(*pp)->next)
    if (*pp == a) {
      *pp = a->next;
      break;
    }
  munmap((void *)(uintptr_t)a->base, a->maplen);
  if (a->origin == P_POOL) g_pools[a->dev].idle += a->size;
  else g_dev[a->dev].used -= a->size;
  free(a);
}

/* ------------------------------------------------------------------ work items */

static void complete_head(struct CUstream_st *s);
static int device_copy(int dev, int kind, CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned char byte);

/* Lets go of g_mu for a moment (a thread blocked in wait_value, or one waiting for it). */
static void let_go(void) {
  int depth = tl_mu_depth;
  for (int i = 0; i < depth; i++) unlock_cb(NULL);
  usleep(1000);
  for (int i = 0; i < depth; i++) lock_mu();
}

/* Whether s is being completed further up this thread's stack (then it is not forced from
 * inside); while another thread completes it (blocked in a value wait), waits for that. */
static int held_here(struct CUstream_st *s) {
  while (s->waiting && s->waiter != my_tid()) let_go();
  return s->waiting != 0;
}

static void force(struct CUstream_st *s, uint64_t target) {
  while (s && s->head && s->done < target && !held_here(s)) complete_head(s);
}
static void force_gseq(struct CUstream_st *s, uint64_t g) {
  while (s && s->head && s->head->gseq < g && !held_here(s)) complete_head(s);
}

static void wait_value(struct CUstream_st *s, item_t *it);
static void value_write(struct CUstream_st *s, item_t *it);
static void device_fill(int dev, CUdeviceptr dst, size_t n, int width, uint64_t val);

static void complete_head(struct CUstream_st *s) {
  item_t *it = s->head;
  if (!it) return;
  if (held_here(s)) return; /* being completed further up: not from inside */
  s->waiting++;
  s->waiter = my_tid();
  if (it->kind == K_WAIT && it->wstream) force(it->wstream, it->wtarget);
  s->waiting--;
  if (it->kind == K_WAITVAL) wait_value(s, it);
  if (s->kind == S_LEGACY) {
    for (struct CUstream_st *p = g_streams; p; p = p->next)
      if (p != s && p->ctx == s->ctx && is_blocking(p)) force_gseq(p, it->gseq);
  } else if (is_blocking(s)) {
    force_gseq(s->ctx->legacy, it->gseq);
  }
  if (s->head != it) return; /* completed by another thread while a value wait let go of the lock */
  s->head = it->next;
  if (!s->head) s->tail = NULL;
  s->done++;
  if (it->kind == K_USER) {
    s->n_user--;
    if (it->fn) it->fn(it->arg);
  } else if (it->kind == K_FREE) {
    plain_t *a = find_plain_base(it->ptr);
    if (a) plain_free(a);
  } else if (it->kind == K_SET && it->width > 1) {
    device_fill(s->ctx->dev, it->dst, it->n, it->width, it->val);
  } else if (it->kind == K_COPY || it->kind == K_SET) {
    device_copy(s->ctx->dev, it->kind, it->dst, it->src, it->n, it->byte);
  } else if (it->kind == K_WRITEVAL) {
    value_write(s, it);
  }
  free(it);
}

static item_t *enqueue(struct CUstream_st *s, int kind) {
  item_t *it = calloc(1, sizeof *it);
  if (!it) return NULL;
  it->kind = kind;
  it->gseq = g_gseq++;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->enq++;
  if (kind == K_USER) s->n_user++;
  return it;
}

static void drain_ctx(struct CUctx_st *ctx) {
  int again = 1;
  while (again) {
    again = 0;
    for (struct CUstream_st *p = g_streams; p; p = p->next)
      if (p->ctx == ctx && p->head) {
        force(p, p->enq);
        again = 1;
      }
  }
}

static void destroy_stream(struct CUstream_st *s) {
  force(s, s->enq);
  for (struct CUevent_st *e = g_events; e; e = e->next)
    if (e->stream == s) e->stream = NULL;
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    for (item_t *it = p->head; it; it = it->next)
      if (it->wstream == s) it->wstream = NULL;
  for (struct CUstream_st **pp = &g_streams; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  s->magic = 0;
  free(s->cap_frees);
  free(s);
}

/* Drops the peer-access records of ctx, in both directions. */
static void drop_peers(struct CUctx_st *ctx) {
  peer_t **pp = &g_peers;
  while (*pp) {
    peer_t *p = *pp;
    if (p->from == ctx || p->to == ctx) {
      *pp = p->next;
      free(p);
    } else {
      pp = &p->next;
    }
  }
}

/* Destroy everything of a context (cuCtxDestroy, cuDevicePrimaryCtxReset, the last
 * cuDevicePrimaryCtxRelease). */
static void teardown_ctx(struct CUctx_st *ctx) {
  drain_ctx(ctx);
  drop_peers(ctx);
  struct CUstream_st *p = g_streams;
  while (p) {
    struct CUstream_st *n = p->next;
    if (p->ctx == ctx) destroy_stream(p);
    p = n;
  }
  ctx->legacy = NULL;
  struct CUevent_st **ep = &g_events;
  while (*ep) {
    if ((*ep)->ctx == ctx) {
      struct CUevent_st *e = *ep;
      *ep = e->next;
      e->magic = 0;
      free(e);
    } else {
      ep = &(*ep)->next;
    }
  }
  plain_t *a = g_plain;
  while (a) {
    plain_t *n = a->next;
    if (a->ctx == ctx) plain_free(a);
    a = n;
  }
  pool_release(ctx->dev, 0); /* the context's pool memory goes with it */
  module_drop_ctx(ctx);
  g_dev[ctx->dev].used -= ctx->charged;
  ctx->charged = 0;
}

static CUresult ctx_activate(struct CUctx_st *c) {
  device_t *d = &g_dev[c->dev];
  if (!dev_fits(d, g_ctx_bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  c->alive = 1;
  c->legacy = new_stream(c, S_LEGACY, 0, 0);
  if (!c->legacy) return CUDA_ERROR_OUT_OF_MEMORY;
  c->charged = g_ctx_bytes;
  d->used += g_ctx_bytes;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ init, devices */

static CUresult e_cuInit(unsigned int flags) {
  ENTER(cuInit);
  if (flags != 0) {
    violation("cuInit flags %u (must be 0)", flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  LOCKED();
  g_inited = 1;
  return CUDA_SUCCESS;
}

static CUresult e_cuDriverGetVersion(int *v) {
  ENTER(cuDriverGetVersion);
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

static CUresult e_cuDeviceGet(CUdevice *d, int ordinal) {
  ENTER(cuDeviceGet);
  NEED_INIT();
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= g_devcount) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

static CUresult e_cuDeviceGetCount(int *n) {
  ENTER(cuDeviceGetCount);
  NEED_INIT();
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = g_devcount;
  return CUDA_SUCCESS;
}

static int valid_dev(CUdevice d) { return d >= 0 && d < g_devcount; }

static CUresult e_cuDeviceGetName(char *name, int len, CUdevice dev) {
  ENTER(cuDeviceGetName);
  NEED_INIT();
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "vmmshim emulated GPU %d", dev);
  return CUDA_SUCCESS;
}

static CUresult e_cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  ENTER(cuDeviceGetAttribute);
  NEED_INIT();
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int v = 0;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = g_cap_vmm; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = g_cap_vmm && g_cap_fd; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = g_cap_vmm && g_cap_rdma; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = dev + 1; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: v = g_cap_rdma; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = g_cap_vmm && g_cap_host_vmm; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = 0; break;
    default: v = 0; break;
  }
  *pi = v;
  return CUDA_SUCCESS;
}

static CUresult e_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  ENTER(cuDeviceTotalMem);
  NEED_INIT();
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  *bytes = g_dev[dev].total;
  return CUDA_SUCCESS;
}
static CUresult e_cuDeviceTotalMem_v1(unsigned int *bytes, CUdevice dev) {
  size_t b = 0;
  CUresult r = e_cuDeviceTotalMem_v2(&b, dev);
  if (r == CUDA_SUCCESS) *bytes = b > UINT_MAX ? UINT_MAX : (unsigned)b;
  return r;
}

/* A PCI bus id per device ("0000:0N:00.0", N the device + 1), as nvml_emu.c finds devices by. */
static CUresult e_cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
  ENTER(cuDeviceGetPCIBusId);
  NEED_INIT();
  if (!bus || len < 13) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(bus, (size_t)len, "0000:%02x:00.0", (unsigned)dev + 1);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */

static CUresult e_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  ENTER(cuDevicePrimaryCtxRetain);
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  device_t *d = &g_dev[dev];
  if (!d->primary) {
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = MAGIC_CTX;
    c->dev = dev;
    c->is_primary = 1;
    c->next = g_ctxs;
    g_ctxs = c;
    d->primary = c;
  }
  if (!d->primary->alive) {
    CUresult r = ctx_activate(d->primary);
    if (r) return r;
  }
  d->primary_refs++;
  *pctx = d->primary;
  return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev) {
  ENTER(cuDevicePrimaryCtxRelease);
  NEED_INIT();
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  device_t *d = &g_dev[dev];
  if (d->primary_refs <= 0) {
    violation("cuDevicePrimaryCtxRelease on device %d without a matching retain", dev);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (--d->primary_refs == 0 && d->primary && d->primary->alive) {
    teardown_ctx(d->primary);
    d->primary->alive = 0;
  }
  return CUDA_SUCCESS;
}
static CUresult e_cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }
static CUresult e_cuDevicePrimaryCtxRelease_v1(CUdevice dev) { return primary_release(dev); }

static CUresult primary_reset(CUdevice dev) {
  ENTER(cuDevicePrimaryCtxReset);
  NEED_INIT();
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  device_t *d = &g_dev[dev];
  if (d->primary && d->primary->alive) {
    teardown_ctx(d->primary);
    d->primary->alive = 0;
  }
  d->primary_refs = 0;
  return CUDA_SUCCESS;
}
static CUresult e_cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_reset(dev); }
static CUresult e_cuDevicePrimaryCtxReset_v1(CUdevice dev) { return primary_reset(dev); }

static CUresult e_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  ENTER(cuDevicePrimaryCtxGetState);
  NEED_INIT();
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  *flags = g_dev[dev].primary_flags;
  *active = g_dev[dev].primary && g_dev[dev].primary->alive;
  return CUDA_SUCCESS;
}

static CUresult e_cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  ENTER(cuDevicePrimaryCtxSetFlags);
  NEED_INIT();
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  g_dev[dev].primary_flags = flags;
  return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
  ENTER(cuCtxCreate);
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCKED();
  struct CUctx_st *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->magic = MAGIC_CTX;
  c->dev = dev;
  c->next = g_ctxs;
  g_ctxs = c;
  CUresult r = ctx_activate(c);
  if (r) return r;
  /* cuCtxCreate pushes the new context on the calling thread's stack. */
  if (tl_ctx && tl_depth < 32) tl_stack[tl_depth++] = tl_ctx;
  tl_ctx = c;
  *pctx = c;
  return CUDA_SUCCESS;
}
static CUresult e_cuCtxCreate_v1(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  (void)flags;
  return ctx_create(pctx, dev);
}
static CUresult e_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  (void)flags;
  return ctx_create(pctx, dev);
}
static CUresult e_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                                 CUdevice dev) {
  (void)params;
  (void)n;
  (void)flags;
  return ctx_create(pctx, dev);
}
static CUresult e_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
  (void)params;
  (void)flags;
  return ctx_create(pctx, dev);
}

static CUresult ctx_destroy(CUcontext ctx) {
  ENTER(cuCtxDestroy);
  NEED_INIT();
  LOCKED();
  struct CUctx_st *c = ctx;
  if (!c || !valid_ctx(c) || c->is_primary || !c->alive) {
    violation("cuCtxDestroy of an invalid, destroyed or primary context %p", (void *)ctx);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  teardown_ctx(c);
  c->alive = 0;
  if (tl_ctx == c) tl_ctx = tl_depth > 0 ? tl_stack[--tl_depth] : NULL;
  return CUDA_SUCCESS;
}
static CUresult e_cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(ctx); }
static CUresult e_cuCtxDestroy_v1(CUcontext ctx) { return ctx_destroy(ctx); }

static CUresult e_cuCtxGetCurrent(CUcontext *pctx) {
  ENTER(cuCtxGetCurrent);
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = tl_ctx;
  return CUDA_SUCCESS;
}

static CUresult e_cuCtxSetCurrent(CUcontext ctx) {
  ENTER(cuCtxSetCurrent);
  NEED_INIT();
  LOCKED();
  if (ctx && (!valid_ctx(ctx) || !ctx->alive)) {
    violation("cuCtxSetCurrent with an invalid or destroyed context %p", (void *)ctx);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  tl_ctx = ctx;
  return CUDA_SUCCESS;
}

static CUresult e_cuCtxGetDevice(CUdevice *dev) {
  ENTER(cuCtxGetDevice);
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  *dev = c->dev;
  return CUDA_SUCCESS;
}

static CUresult ctx_push(CUcontext ctx) {
  ENTER(cuCtxPushCurrent);
  NEED_INIT();
  LOCKED();
  if (!ctx || !valid_ctx(ctx) || !ctx->alive) {
    violation("cuCtxPushCurrent with an invalid context %p", (void *)ctx);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (tl_depth >= 32) return CUDA_ERROR_OUT_OF_MEMORY;
  tl_stack[tl_depth++] = tl_ctx;
  tl_ctx = ctx;
  return CUDA_SUCCESS;
}
static CUresult e_cuCtxPushCurrent_v2(CUcontext ctx) { return ctx_push(ctx); }
static CUresult e_cuCtxPushCurrent_v1(CUcontext ctx) { return ctx_push(ctx); }

static CUresult ctx_pop(CUcontext *pctx) {
  ENTER(cuCtxPopCurrent);
  NEED_INIT();
  if (!tl_ctx) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = tl_ctx;
  tl_ctx = tl_depth > 0 ? tl_stack[--tl_depth] : NULL;
  return CUDA_SUCCESS;
}
static CUresult e_cuCtxPopCurrent_v2(CUcontext *pctx) { return ctx_pop(pctx); }
static CUresult e_cuCtxPopCurrent_v1(CUcontext *pctx) { return ctx_pop(pctx); }

static CUresult e_cuCtxSynchronize(void) {
  ENTER(cuCtxSynchronize);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    if (p->ctx == c && p->cap) {
      violation("cuCtxSynchronize while stream %p of the context is capturing", (void *)p);
      invalidate_capture(p);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  drain_ctx(c);
  pool_release(c->dev, g_pools[c->dev].threshold);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ VMM */

static int valid_prop(const CUmemAllocationProp *prop, const char *fn) {
  if (!prop) {
    violation("%s: prop is NULL", fn);
    return 0;
  }
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    violation("%s: prop->type %d (must be CU_MEM_ALLOCATION_TYPE_PINNED)", fn, (int)prop->type);
    return 0;
  }
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST || prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
    if (!g_cap_host_vmm) {
      violation("%s: host-location memory on a device without HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", fn);
      return 0;
    }
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && prop->location.id != 0) {
      violation("%s: host NUMA node %d (the emulated host has node 0 only)", fn, prop->location.id);
      return 0;
    }
    return 1;
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(prop->location.id)) {
    violation("%s: prop->location type %d id %d (must be a valid device)", fn, (int)prop->location.type,
              prop->location.id);
    return 0;
  }
  return 1;
}

static CUresult e_cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop,
                                                CUmemAllocationGranularity_flags option) {
  ENTER(cuMemGetAllocationGranularity);
  NEED_INIT();
  if (!gran) {
    violation("cuMemGetAllocationGranularity: granularity is NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!valid_prop(prop, "cuMemGetAllocationGranularity")) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    violation("cuMemGetAllocationGranularity: option %d", (int)option);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!g_cap_vmm) return CUDA_ERROR_NOT_SUPPORTED;
  *gran = g_gran;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                      unsigned long long flags) {
  ENTER(cuMemAddressReserve);
  NEED_INIT();
  LOCKED();
  if (!g_cap_vmm) {
    violation("cuMemAddressReserve on a device without VMM support");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!ptr || size == 0 || size % g_gran || flags != 0 || (alignment && !is_pow2(alignment))) {
    violation("cuMemAddressReserve(size %zu, alignment %zu, flags %llu): size must be a nonzero multiple of "
              "the granularity %zu, alignment 0 or a power of two, flags 0",
              size, alignment, flags, g_gran);
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t al = alignment < g_gran ? g_gran : alignment;
  uintptr_t base = 0;
  if (addr && addr % al == 0) {
    void *m = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (m != MAP_FAILED) {
      if ((uintptr_t)m == addr)
        base = addr;
      else
        munmap(m, size);
    }
  }
  if (!base) {
    if (size + al < size) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = size + al;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t lo = (uintptr_t)m, a = (lo + al - 1) / al * al;
    if (a > lo) munmap(m, a - lo);
    if (lo + len > a + size) munmap((void *)(a + size), lo + len - (a + size));
    base = a;
  }
  resv_t *r = calloc(1, sizeof *r);
  if (!r) {
    munmap((void *)base, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  r->base = base;
  r->size = size;
  r->next = g_resv;
  g_resv = r;
  *ptr = base;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  ENTER(cuMemAddressFree);
  NEED_INIT();
  LOCKED();
  resv_t **pp = &g_resv;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->base == ptr) break;
  if (!*pp || (*pp)->size != size) {
    violation("cuMemAddressFree(0x%llx, %zu) does not match a reservation exactly", (unsigned long long)ptr, size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (mapping_t *m = g_maps; m; m = m->next)
    if (m->va < ptr + size && m->va + m->size > ptr) {
      violation("cuMemAddressFree(0x%llx, %zu) with a live mapping at 0x%llx", (unsigned long long)ptr, size,
                (unsigned long long)m->va);
      return CUDA_ERROR_INVALID_VALUE;
    }
  resv_t *r = *pp;
  *pp = r->next;
  munmap((void *)(uintptr_t)r->base, r->size);
  free(r);
  return CUDA_SUCCESS;
}

static handle_t *find_handle(CUmemGenericAllocationHandle id) {
  for (handle_t *h = g_handles; h; h = h->next)
    if (h->id == id) return h;
  return NULL;
}

static void handle_maybe_destroy(handle_t *h) {
  if (h->refs > 0 || h->mapcount > 0) return;
  for (handle_t **pp = &g_handles; *pp; pp = &(*pp)->next)
    if (*pp == h) {
      *pp = h->next;
      break;
    }
  close(h->fd);
  if (h->host) g_host_used -= h->size;
  else g_dev[h->dev].used -= h->size;
  free(h);
}

static CUresult new_handle(int fd, size_t size, const CUmemAllocationProp *prop, CUmemGenericAllocationHandle *out) {
  handle_t *h = calloc(1, sizeof *h);
  if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
  h->id = g_handle_next++;
  h->fd = fd;
  h->size = size;
  h->host = prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
  h->dev = h->host ? 0 : prop->location.id;
  h->req_types = (unsigned long long)prop->requestedHandleTypes;
  h->rdma = prop->allocFlags.gpuDirectRDMACapable;
  h->prop = *prop;
  h->refs = 1;
  h->next = g_handles;
  g_handles = h;
  if (h->host) g_host_used += size;
  else g_dev[h->dev].used += size;
  *out = h->id;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags) {
  ENTER(cuMemCreate);
  NEED_INIT();
  LOCKED();
  if (!handle) {
    violation("cuMemCreate: handle is NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!valid_prop(prop, "cuMemCreate")) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || size % g_gran || flags != 0) {
    violation("cuMemCreate(size %zu, flags %llu): size must be a nonzero multiple of the granularity %zu, flags 0",
              size, flags, g_gran);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!g_cap_vmm) {
    violation("cuMemCreate on a device without VMM support");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  unsigned long long types = (unsigned long long)prop->requestedHandleTypes;
  if (types & ~(unsigned long long)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    violation("cuMemCreate: requestedHandleTypes 0x%llx not supported on Linux by this device", types);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && !g_cap_fd) {
    violation("cuMemCreate: POSIX file descriptor handles requested but not supported by the device");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop->allocFlags.gpuDirectRDMACapable && !g_cap_rdma) {
    violation("cuMemCreate: gpuDirectRDMACapable requested but not supported by the device");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop->win32HandleMetaData) {
    violation("cuMemCreate: win32HandleMetaData must be NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    if (g_host_used > g_host_total || size > g_host_total - g_host_used) return CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    if (!dev_fits(&g_dev[prop->location.id], size)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  int fd = memfd_create("emu-vmm", MFD_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "emu: memfd_create failed: %s\n", strerror(errno));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult r = new_handle(fd, size, prop, handle);
  if (r) close(fd);
  return r;
}

static CUresult e_cuMemRelease(CUmemGenericAllocationHandle handle) {
  ENTER(cuMemRelease);
  NEED_INIT();
  LOCKED();
  handle_t *h = find_handle(handle);
  if (!h || h->refs <= 0) {
    violation("cuMemRelease of an unknown or already released handle 0x%llx", (unsigned long long)handle);
    return CUDA_ERROR_INVALID_VALUE;
  }
  h->refs--;
  handle_maybe_destroy(h);
  return CUDA_SUCCESS;
}

static resv_t *resv_holding(CUdeviceptr p, size_t size) {
  for (resv_t *r = g_resv; r; r = r->next)
    if (p >= r->base && p - r->base <= r->size && size <= r->size - (p - r->base)) return r;
  return NULL;
}

static mapping_t *map_holding(CUdeviceptr p) {
  for (mapping_t *m = g_maps; m; m = m->next)
    if (p >= m->va && p < m->va + m->size) return m;
  return NULL;
}
static mapping_t *map_at(CUdeviceptr p) {
  for (mapping_t *m = g_maps; m; m = m->next)
    if (m->va == p) return m;
  return NULL;
}

static CUresult e_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                           unsigned long long flags) {
  ENTER(cuMemMap);
  NEED_INIT();
  LOCKED();
  if (!ptr || size == 0 || ptr % g_gran || size % g_gran || offset % g_gran || flags != 0) {
    violation("cuMemMap(0x%llx, %zu, offset %zu, flags %llu): address, size and offset must be multiples of the "
              "granularity %zu, size nonzero, flags 0",
              (unsigned long long)ptr, size, offset, flags, g_gran);
    return CUDA_ERROR_INVALID_VALUE;
  }
  handle_t *h = find_handle(handle);
  if (!h || h->refs <= 0) {
    violation("cuMemMap with an unknown or released handle 0x%llx", (unsigned long long)handle);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (offset > h->size || size > h->size - offset) {
    violation("cuMemMap: size %zu + offset %zu exceeds the handle's %zu bytes", size, offset, h->size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!resv_holding(ptr, size)) {
    violation("cuMemMap(0x%llx, %zu) is not inside one reservation", (unsigned long long)ptr, size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (mapping_t *m = g_maps; m; m = m->next)
    if (m->va < ptr + size && m->va + m->size > ptr) {
      violation("cuMemMap(0x%llx, %zu) overlaps the mapping at 0x%llx", (unsigned long long)ptr, size,
                (unsigned long long)m->va);
      return CUDA_ERROR_INVALID_VALUE;
    }
  mapping_t *m = calloc(1, sizeof *m);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
  if (p == MAP_FAILED) {
    fprintf(stderr, "emu: mmap of handle failed: %s\n", strerror(errno));
    free(m);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->va = ptr;
  m->size = size;
  m->offset = offset;
  m->h = h;
  m->next = g_maps;
  g_maps = m;
  h->mapcount++;
  return CUDA_SUCCESS;
}

/* Checks that [ptr, ptr+size) is exactly a run of adjacent whole mappings. */
static int whole_mappings(CUdeviceptr ptr, size_t size) {
  CUdeviceptr cur = ptr, end = ptr + size;
  while (cur < end) {
    mapping_t *m = map_at(cur);
    if (!m || m->size > end - cur) return 0;
    cur += m->size;
  }
  return cur == end;
}

static CUresult e_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  ENTER(cuMemUnmap);
  NEED_INIT();
  LOCKED();
  if (!ptr || size == 0 || ptr % g_gran || size % g_gran || !whole_mappings(ptr, size)) {
    violation("cuMemUnmap(0x%llx, %zu) does not cover whole mappings", (unsigned long long)ptr, size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUdeviceptr cur = ptr, end = ptr + size;
  while (cur < end) {
    mapping_t *m = map_at(cur);
    cur += m->size;
    void *p = mmap((void *)(uintptr_t)m->va, m->size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) fprintf(stderr, "emu: remapping PROT_NONE failed: %s\n", strerror(errno));
    for (mapping_t **pp = &g_maps; *pp; pp = &(*pp)->next)
      if (*pp == m) {
        *pp = m->next;
        break;
      }
    handle_t *h = m->h;
    h->mapcount--;
    free(m);
    handle_maybe_destroy(h);
  }
  return CUDA_SUCCESS;
}

/* Whether a location is the CPU: HOST, or HOST_NUMA of node 0 (the emulated host's only one). */
static int cpu_location(const CUmemLocation *l) {
  return l->type == CU_MEM_LOCATION_TYPE_HOST || (l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA && l->id == 0);
}

static int host_prot(const mapping_t *m) {
  unsigned long long f = 0;
  for (int i = 0; i < EMU_MAXDEV; i++)
    if (m->access[i] > f) f = m->access[i];
  if (m->cpu_access > f) f = m->cpu_access;
  if (f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return PROT_READ | PROT_WRITE;
  if (f == CU_MEM_ACCESS_FLAGS_PROT_READ) return PROT_READ;
  return PROT_NONE;
}

static CUresult e_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  ENTER(cuMemSetAccess);
  NEED_INIT();
  LOCKED();
  if (!ptr || size == 0 || ptr % g_gran || size % g_gran || !desc || count == 0) {
    violation("cuMemSetAccess(0x%llx, %zu, desc %p, count %zu): bad arguments", (unsigned long long)ptr, size,
              (const void *)desc, count);
    return CUDA_ERROR_INVALID_VALUE;
  }
  int cpu = 0; /* descriptors for the CPU */
  for (size_t i = 0; i < count; i++) {
    int is_cpu = cpu_location(&desc[i].location);
    cpu |= is_cpu;
    if ((!is_cpu && (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(desc[i].location.id))) ||
        (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
         desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
      violation("cuMemSetAccess: descriptor %zu has location type %d id %d flags %d", i,
                (int)desc[i].location.type, desc[i].location.id, (int)desc[i].flags);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  /* the whole range must be mapped; CPU access only to host-location memory */
  CUdeviceptr cur = ptr, end = ptr + size;
  while (cur < end) {
    mapping_t *m = map_holding(cur);
    if (!m) {
      violation("cuMemSetAccess(0x%llx, %zu): 0x%llx is not mapped", (unsigned long long)ptr, size,
                (unsigned long long)cur);
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (cpu && !m->h->host) {
      violation("cuMemSetAccess(0x%llx, %zu): a HOST / HOST_NUMA descriptor on device memory at 0x%llx",
                (unsigned long long)ptr, size, (unsigned long long)m->va);
      return CUDA_ERROR_INVALID_VALUE;
    }
    cur = m->va + m->size;
  }
  if (cpu && !g_cap_host_cpu) return CUDA_ERROR_NOT_SUPPORTED;
  cur = ptr;
  while (cur < end) {
    mapping_t *m = map_holding(cur);
    for (size_t i = 0; i < count; i++) {
      if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE) m->access[desc[i].location.id] = desc[i].flags;
      else m->cpu_access = desc[i].flags;
    }
    CUdeviceptr lo = cur, hi = m->va + m->size < end ? m->va + m->size : end;
    if (mprotect((void *)(uintptr_t)lo, hi - lo, host_prot(m)) != 0)
      fprintf(stderr, "emu: mprotect failed: %s\n", strerror(errno));
    cur = hi;
  }
  return CUDA_SUCCESS;
}

static CUresult e_cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
  ENTER(cuMemGetAccess);
  NEED_INIT();
  LOCKED();
  int cpu = location && cpu_location(location);
  if (!flags || !location || (!cpu && (location->type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(location->id)))) {
    violation("cuMemGetAccess: bad arguments");
    return CUDA_ERROR_INVALID_VALUE;
  }
  mapping_t *m = map_holding(ptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  *flags = cpu ? m->cpu_access : m->access[location->id];
  return CUDA_SUCCESS;
}

static CUresult e_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
  ENTER(cuMemRetainAllocationHandle);
  NEED_INIT();
  LOCKED();
  if (!handle) {
    violation("cuMemRetainAllocationHandle: handle is NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  mapping_t *m = map_holding((CUdeviceptr)(uintptr_t)addr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  m->h->refs++;
  *handle = m->h->id;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                         CUmemGenericAllocationHandle handle) {
  ENTER(cuMemGetAllocationPropertiesFromHandle);
  NEED_INIT();
  LOCKED();
  handle_t *h = find_handle(handle);
  if (!prop || !h || h->refs <= 0) {
    violation("cuMemGetAllocationPropertiesFromHandle: bad prop or handle 0x%llx", (unsigned long long)handle);
    return CUDA_ERROR_INVALID_VALUE;
  }
  *prop = h->prop;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType type, unsigned long long flags) {
  ENTER(cuMemExportToShareableHandle);
  NEED_INIT();
  LOCKED();
  handle_t *h = find_handle(handle);
  if (!shareable || !h || h->refs <= 0 || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(h->req_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    violation("cuMemExportToShareableHandle: bad handle 0x%llx or a type it was not created with",
              (unsigned long long)handle);
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = fcntl_dupfd(h->fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareable = fd;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                 CUmemAllocationHandleType type) {
  ENTER(cuMemImportFromShareableHandle);
  NEED_INIT();
  LOCKED();
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    violation("cuMemImportFromShareableHandle: bad arguments");
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = (int)(intptr_t)os_handle;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  int nfd = fcntl_dupfd(fd);
  if (nfd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  /* an imported handle does not draw from this process's budget twice: count it anyway,
   * the emulation has one budget per device for the whole process */
  CUresult r = new_handle(nfd, (size_t)st.st_size, &prop, handle);
  if (r) close(nfd);
  return r;
}

/* ------------------------------------------------------------------ plain memory API */

static CUresult e_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  ENTER(cuMemAlloc);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  r = check_unsafe("cuMemAlloc");
  if (r) return r;
  return plain_alloc(c, size, 0, P_ALLOC, dptr);
}
static CUresult e_cuMemAlloc_v1(unsigned int *dptr, unsigned int size) {
  (void)dptr;
  (void)size;
  ENTER(cuMemAlloc);
  return CUDA_ERROR_NOT_SUPPORTED; /* 32-bit device pointers */
}

static CUresult e_cuMemFree_v2(CUdeviceptr p) {
  ENTER(cuMemFree);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (p == 0) return CUDA_SUCCESS;
  r = check_unsafe("cuMemFree");
  if (r) return r;
  plain_t *a = find_plain_base(p);
  if (!a || a->free_pending) return CUDA_ERROR_INVALID_VALUE;
  plain_free(a);
  return CUDA_SUCCESS;
}
static CUresult e_cuMemFree_v1(unsigned int p) {
  (void)p;
  ENTER(cuMemFree);
  return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult mem_alloc_async(CUdeviceptr *dptr, size_t size, CUstream hs, int ptsz) {
  ENTER(cuMemAllocAsync);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(hs, ptsz, &s);
  if (r) return r;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  r = check_legacy_use(s, "cuMemAllocAsync");
  if (r) return r;
  uint64_t cap_id = 0;
  if (s->cap) {
    if (s->cap == 2) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    cap_id = s->cap_origin->cap_id;
    s->cap_items++;
  }
  return plain_alloc(s->ctx, size, cap_id, cap_id ? P_GRAPH : P_POOL, dptr);
}
static CUresult e_cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return mem_alloc_async(d, n, s, 0); }
static CUresult e_cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return mem_alloc_async(d, n, s, 1); }

static CUresult mem_free_async(CUdeviceptr p, CUstream hs, int ptsz) {
  ENTER(cuMemFreeAsync);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(hs, ptsz, &s);
  if (r) return r;
  r = check_legacy_use(s, "cuMemFreeAsync");
  if (r) return r;
  plain_t *a = find_plain_base(p);
  if (!a || a->free_pending) return CUDA_ERROR_INVALID_VALUE;
  if (s->cap) {
    if (s->cap == 2) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    struct CUstream_st *o = s->cap_origin;
    if (o->cap_nfrees == o->cap_capfrees) {
      size_t n = o->cap_capfrees ? o->cap_capfrees * 2 : 16;
      CUdeviceptr *v = realloc(o->cap_frees, n * sizeof *v);
      if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
      o->cap_frees = v;
      o->cap_capfrees = n;
    }
    o->cap_frees[o->cap_nfrees++] = p;
    if (a->cap_id == o->cap_id) a->free_pending = 1;
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  item_t *it = enqueue(s, K_FREE);
  if (!it) return CUDA_ERROR_OUT_OF_MEMORY;
  it->ptr = p;
  a->free_pending = 1;
  return CUDA_SUCCESS;
}
static CUresult e_cuMemFreeAsync(CUdeviceptr p, CUstream s) { return mem_free_async(p, s, 0); }
static CUresult e_cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return mem_free_async(p, s, 1); }

static CUresult e_cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
  ENTER(cuMemGetInfo);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!free_b || !total_b) return CUDA_ERROR_INVALID_VALUE;
  device_t *d = &g_dev[c->dev];
  *total_b = d->total;
  *free_b = d->used >= d->total ? 0 : d->total - d->used;
  return CUDA_SUCCESS;
}
static CUresult e_cuMemGetInfo_v1(unsigned int *free_b, unsigned int *total_b) {
  size_t f = 0, t = 0;
  CUresult r = e_cuMemGetInfo_v2(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free_b = f > UINT_MAX ? UINT_MAX : (unsigned)f;
    *total_b = t > UINT_MAX ? UINT_MAX : (unsigned)t;
  }
  return r;
}

/* The allocation holding p: a plain allocation or a VMM mapping. *vmm: 1 for VMM memory,
 * 0 for plain memory (its P_* origin in *origin). */
static int range_of(CUdeviceptr p, CUdeviceptr *base, size_t *size, int *dev, struct CUctx_st **ctx, int *vmm,
                    int *origin) {
  plain_t *a = find_plain_in(p);
  if (a) {
    *base = a->base;
    *size = a->size;
    *dev = a->dev;
    *ctx = a->ctx;
    *vmm = 0;
    *origin = a->origin;
    return 1;
  }
  mapping_t *m = map_holding(p);
  if (m) {
    *base = m->va;
    *size = m->size;
    *dev = m->h->dev;
    *ctx = NULL;
    *vmm = 1;
    *origin = -1;
    return 1;
  }
  return 0;
}

static CUresult e_cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p) {
  ENTER(cuMemGetAddressRange);
  NEED_INIT();
  LOCKED();
  CUdeviceptr b;
  size_t n;
  int dev, vmm, origin;
  struct CUctx_st *c;
  if (!range_of(p, &b, &n, &dev, &c, &vmm, &origin)) return CUDA_ERROR_NOT_FOUND;
  if (pbase) *pbase = b;
  if (psize) *psize = n;
  return CUDA_SUCCESS;
}
static CUresult e_cuMemGetAddressRange_v1(unsigned int *pbase, unsigned int *psize, unsigned int p) {
  (void)pbase;
  (void)psize;
  (void)p;
  ENTER(cuMemGetAddressRange);
  return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult pointer_attr(void *data, CUpointer_attribute attr, CUdeviceptr p, int found, CUdeviceptr b, size_t n,
                             int dev, struct CUctx_st *c, int vmm, int origin) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = found ? c : NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {
      /* As the driver answers: host memory mapped at a device address is host memory. */
      mapping_t *m = found && vmm ? map_holding(p) : NULL;
      *(unsigned int *)data = !found ? 0 : m && m->h->host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      break;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = found ? p : 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = found && !vmm && origin == P_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = found ? dev : -2; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = found ? b : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = found ? n : 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)data = found ? 1 : 0; break;
    /* only cuMemAlloc memory: not VMM memory, not memory-pool or graph allocations */
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *(unsigned int *)data = found && !vmm && origin == P_ALLOC;
      break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *(CUmemoryPool *)data = found && !vmm && origin == P_POOL ? &g_pools[dev] : NULL;
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = found ? (unsigned long long)b : 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static CUresult e_cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
  ENTER(cuPointerGetAttribute);
  NEED_INIT();
  LOCKED();
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr b = 0;
  size_t n = 0;
  int dev = 0, vmm = 0, origin = -1;
  struct CUctx_st *c = NULL;
  if (!range_of(p, &b, &n, &dev, &c, &vmm, &origin)) return CUDA_ERROR_INVALID_VALUE;
  return pointer_attr(data, attr, p, 1, b, n, dev, c, vmm, origin);
}

static CUresult e_cuPointerGetAttributes(unsigned int num, CUpointer_attribute *attrs, void **data, CUdeviceptr p) {
  ENTER(cuPointerGetAttributes);
  NEED_INIT();
  LOCKED();
  if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr b = 0;
  size_t n = 0;
  int dev = 0, vmm = 0, origin = -1;
  struct CUctx_st *c = NULL;
  int found = range_of(p, &b, &n, &dev, &c, &vmm, &origin);
  for (unsigned i = 0; i < num; i++) {
    if (!data[i]) continue;
    CUresult r = pointer_attr(data[i], attrs[i], p, found, b, n, dev, c, vmm, origin);
    if (r) return r;
  }
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ copies, memset, launches */

/* Stream-ordered copy (K_COPY) or memset (K_SET) on stream h: checked and done when the item
 * completes, as a copy engine would run it then (an address unmapped meanwhile faults). */
static CUresult enqueue_copy(CUstream h, int ptsz, int kind, CUdeviceptr dst, CUdeviceptr src, size_t n,
                             unsigned char byte) {
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if ((r = check_legacy_use(s, kind == K_COPY ? "cuMemcpyDtoDAsync" : "cuMemsetD8Async"))) return r;
  if (s->cap) {
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  item_t *it = enqueue(s, kind);
  if (!it) return CUDA_ERROR_OUT_OF_MEMORY;
  it->dst = dst;
  it->src = src;
  it->n = n;
  it->byte = byte;
  return CUDA_SUCCESS;
}

/* Synchronous forms: ordered on the legacy stream, done before they return. */
static CUresult sync_copy(int kind, CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned char byte) {
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if ((r = check_unsafe(kind == K_COPY ? "cuMemcpyDtoD" : "cuMemsetD8"))) return r;
  if ((r = enqueue_copy(CU_STREAM_LEGACY, 0, kind, dst, src, n, byte))) return r;
  force(c->legacy, c->legacy->enq);
  return CUDA_SUCCESS;
}

static CUresult e_cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ENTER(cuMemcpyDtoD);
  NEED_INIT();
  LOCKED();
  return sync_copy(K_COPY, dst, src, n, 0);
}
static CUresult e_cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  ENTER(cuMemcpyDtoDAsync);
  NEED_INIT();
  LOCKED();
  return enqueue_copy(h, 0, K_COPY, dst, src, n, 0);
}
static CUresult e_cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  ENTER(cuMemcpyDtoDAsync);
  NEED_INIT();
  LOCKED();
  return enqueue_copy(h, 1, K_COPY, dst, src, n, 0);
}
/* Pinned host memory (cuMemAllocHost, cuMemHostAlloc): page-aligned host memory that every device reaches at
 * the same address (unified addressing), for the host side of cuMemcpyDtoHAsync and
 * cuMemcpyHtoDAsync, which take nothing else here (a pageable buffer is a violation: the real
 * driver would not overlap the copy). */
typedef struct pinned_s {
  uintptr_t base;
  size_t size, len; /* asked for; mapped (whole pages) */
  struct pinned_s *next;
} pinned_t;
static pinned_t *g_pinned;
static size_t g_pinned_bytes; /* counted against the host's memory, with host-location handles */

static pinned_t *find_pinned(uintptr_t p, size_t n) {
  for (pinned_t *h = g_pinned; h; h = h->next)
    if (p >= h->base && p - h->base < h->size && n <= h->size - (p - h->base)) return h;
  return NULL;
}

static CUresult host_alloc(void **pp, size_t size, unsigned int flags, const char *fn) {
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!pp || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)) {
    violation("%s with unknown flags 0x%x", fn, flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t len = round_up(size, (size_t)sysconf(_SC_PAGESIZE));
  if (g_host_used + g_pinned_bytes + len > g_host_total) return CUDA_ERROR_OUT_OF_MEMORY;
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  pinned_t *h = m == MAP_FAILED ? NULL : calloc(1, sizeof *h);
  if (!h) {
    if (m != MAP_FAILED) munmap(m, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *h = (pinned_t){(uintptr_t)m, size, len, g_pinned};
  g_pinned = h;
  g_pinned_bytes += len;
  *pp = m;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemAllocHost_v2(void **pp, size_t size) {
  ENTER(cuMemAllocHost);
  NEED_INIT();
  LOCKED();
  return host_alloc(pp, size, 0, "cuMemAllocHost");
}

static CUresult e_cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
  ENTER(cuMemHostAlloc);
  NEED_INIT();
  LOCKED();
  return host_alloc(pp, size, flags, "cuMemHostAlloc");
}

static CUresult e_cuMemFreeHost(void *p) {
  ENTER(cuMemFreeHost);
  NEED_INIT();
  LOCKED();
  for (pinned_t **pp = &g_pinned; *pp; pp = &(*pp)->next)
    if ((*pp)->base == (uintptr_t)p) {
      pinned_t *h = *pp;
      *pp = h->next;
      g_pinned_bytes -= h->len;
      munmap((void *)h->base, h->len);
      free(h);
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE; /* not memory of cuMemAllocHost / cuMemHostAlloc */
}

static CUresult host_side(const void *p, size_t n, const char *fn) {
  if (find_pinned((uintptr_t)p, n)) return CUDA_SUCCESS;
  violation("%s: host range %p (%zu bytes) is not in pinned memory (cuMemHostAlloc)", fn, p, n);
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult e_cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h) {
  ENTER(cuMemcpyDtoHAsync);
  NEED_INIT();
  LOCKED();
  CUresult r = host_side(dst, n, "cuMemcpyDtoHAsync");
  return r ? r : enqueue_copy(h, 0, K_COPY, (CUdeviceptr)(uintptr_t)dst, src, n, 0);
}

static CUresult e_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
  ENTER(cuMemcpyHtoDAsync);
  NEED_INIT();
  LOCKED();
  CUresult r = host_side(src, n, "cuMemcpyHtoDAsync");
  return r ? r : enqueue_copy(h, 0, K_COPY, dst, (CUdeviceptr)(uintptr_t)src, n, 0);
}

static CUresult e_cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n) {
  ENTER(cuMemsetD8);
  NEED_INIT();
  LOCKED();
  return sync_copy(K_SET, dst, 0, n, uc);
}
static CUresult e_cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream h) {
  ENTER(cuMemsetD8Async);
  NEED_INIT();
  LOCKED();
  return enqueue_copy(h, 0, K_SET, dst, 0, n, uc);
}
static CUresult e_cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char uc, size_t n, CUstream h) {
  ENTER(cuMemsetD8Async);
  NEED_INIT();
  LOCKED();
  return enqueue_copy(h, 1, K_SET, dst, 0, n, uc);
}

/* 2D memsets: one stream-ordered memset per row. */
static CUresult memset_2d(CUstream h, int ptsz, CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t rows) {
  if (rows > 1 && pitch < w) return CUDA_ERROR_INVALID_VALUE;
  for (size_t y = 0; y < rows; y++) {
    CUresult r = enqueue_copy(h, ptsz, K_SET, dst + y * pitch, 0, w, uc);
    if (r) return r;
  }
  return CUDA_SUCCESS;
}
static CUresult e_cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t rows) {
  ENTER(cuMemsetD2D8);
  NEED_INIT();
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if ((r = check_unsafe("cuMemsetD2D8"))) return r;
  if ((r = memset_2d(CU_STREAM_LEGACY, 0, dst, pitch, uc, w, rows))) return r;
  force(c->legacy, c->legacy->enq);
  return CUDA_SUCCESS;
}
static CUresult e_cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t rows, CUstream h) {
  ENTER(cuMemsetD2D8Async);
  NEED_INIT();
  LOCKED();
  return memset_2d(h, 0, dst, pitch, uc, w, rows);
}
static CUresult e_cuMemsetD2D8Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t rows,
                                         CUstream h) {
  ENTER(cuMemsetD2D8Async);
  NEED_INIT();
  LOCKED();
  return memset_2d(h, 1, dst, pitch, uc, w, rows);
}

/* A kernel launch that runs nothing (the tests' kernels are emu_launch callbacks): it is
 * there for what the driver does around a launch (ordering, capture, the shim's hooks). */
static CUresult launch(CUfunction f, CUstream h, int ptsz) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if ((r = check_legacy_use(s, "cuLaunchKernel"))) return r;
  if (s->cap) {
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  return enqueue(s, K_MARK) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult e_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shmem, CUstream h, void **params, void **extra) {
  (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
  ENTER(cuLaunchKernel);
  NEED_INIT();
  LOCKED();
  return launch(f, h, 0);
}
static CUresult e_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                      unsigned bz, unsigned shmem, CUstream h, void **params, void **extra) {
  (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
  ENTER(cuLaunchKernel);
  NEED_INIT();
  LOCKED();
  return launch(f, h, 1);
}

/* ------------------------------------------------------------------ 16- and 32-bit memsets */

/* cuMemsetD16 / cuMemsetD32 (and Async): n elements of 2 or 4 bytes, the address aligned to
 * the element as the driver requires; stream-ordered like cuMemsetD8. */
static CUresult enqueue_fill(CUstream h, int ptsz, CUdeviceptr dst, size_t n, int width, uint64_t val,
                             const char *what) {
  if (dst % (CUdeviceptr)width) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if ((r = check_legacy_use(s, what))) return r;
  if (s->cap) {
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  item_t *it = enqueue(s, K_SET);
  if (!it) return CUDA_ERROR_OUT_OF_MEMORY;
  it->dst = dst;
  it->n = n * (size_t)width;
  it->width = width;
  it->val = val;
  return CUDA_SUCCESS;
}
/* The synchronous forms: on the legacy stream (or, _ptds, the thread's own), done on return. */
static CUresult sync_fill(int ptsz, CUdeviceptr dst, size_t n, int width, uint64_t val, const char *what) {
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if ((r = check_unsafe(what))) return r;
  struct CUstream_st *s;
  if ((r = resolve_stream(NULL, ptsz, &s))) return r;
  if (width == 1) r = enqueue_copy(NULL, ptsz, K_SET, dst, 0, n, (unsigned char)val);
  else r = enqueue_fill(NULL, ptsz, dst, n, width, val, what);
  if (r) return r;
  force(s, s->enq);
  return CUDA_SUCCESS;
}
static CUresult e_cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char uc, size_t n) {
  ENTER(cuMemsetD8);
  NEED_INIT();
  LOCKED();
  return sync_fill(1, dst, n, 1, uc, "cuMemsetD8");
}
#define EMU_MEMSET(bits, T)                                                                         \
  static CUresult e_cuMemsetD##bits##_v2(CUdeviceptr dst, T v, size_t n) {                          \
    ENTER_FN(FN_cuMemsetD##bits);                                                                         \
    NEED_INIT();                                                                                    \
    LOCKED();                                                                                       \
    return sync_fill(0, dst, n, bits / 8, v, "cuMemsetD" #bits);                                    \
  }                                                                                                 \
  static CUresult e_cuMemsetD##bits##_v2_ptds(CUdeviceptr dst, T v, size_t n) {                     \
    ENTER_FN(FN_cuMemsetD##bits);                                                                         \
    NEED_INIT();                                                                                    \
    LOCKED();                                                                                       \
    return sync_fill(1, dst, n, bits / 8, v, "cuMemsetD" #bits);                                    \
  }                                                                                                 \
  static CUresult e_cuMemsetD##bits##Async(CUdeviceptr dst, T v, size_t n, CUstream h) {            \
    ENTER_FN(FN_cuMemsetD##bits##Async);                                                                  \
    NEED_INIT();                                                                                    \
    LOCKED();                                                                                       \
    return enqueue_fill(h, 0, dst, n, bits / 8, v, "cuMemsetD" #bits "Async");                      \
  }                                                                                                 \
  static CUresult e_cuMemsetD##bits##Async_ptsz(CUdeviceptr dst, T v, size_t n, CUstream h) {       \
    ENTER_FN(FN_cuMemsetD##bits##Async);                                                                  \
    NEED_INIT();                                                                                    \
    LOCKED();                                                                                       \
    return enqueue_fill(h, 1, dst, n, bits / 8, v, "cuMemsetD" #bits "Async");                      \
  }
EMU_MEMSET(16, unsigned short)
EMU_MEMSET(32, unsigned int)
#undef EMU_MEMSET

/* ------------------------------------------------------------------ stream memory operations */

/* cuStreamWaitValue32/64, cuStreamWriteValue32/64 and cuStreamBatchMemOp, in the forms the
 * driver exports (the original ones, _v2 from CUDA 11.7 with the same arguments, each with a
 * _ptsz variant). A write stores the value when its stream reaches it; a wait holds its
 * stream's queue: nothing behind it runs until the word at the address meets the condition.
 * As on a GPU, where other streams run meanwhile, forcing a stream past a wait runs the work
 * of the other streams until a write there meets it; a wait that nothing pending can meet
 * would hang a GPU for good: it is a contract violation here, and the stream goes on. */
static int valid_wait_flags(unsigned fl) {
  return (fl & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) <= CU_STREAM_WAIT_VALUE_NOR;
}

static CUresult memop_check(CUdeviceptr addr, int width, int wait, unsigned fl, const char *what) {
  if (!addr || addr % (CUdeviceptr)width) {
    violation("%s: address 0x%llx is not %d-byte aligned device memory", what, (unsigned long long)addr, width);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (wait ? !valid_wait_flags(fl) : fl > CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) {
    violation("%s: bad flags 0x%x", what, fl);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* One operation queued on s (already resolved and checked); kind K_WAITVAL, K_WRITEVAL or K_MARK. */
static CUresult memop_enqueue(struct CUstream_st *s, int kind, CUdeviceptr addr, int width, uint64_t val, unsigned fl) {
  if (s->cap) {
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  item_t *it = enqueue(s, kind);
  if (!it) return CUDA_ERROR_OUT_OF_MEMORY;
  it->dst = addr;
  it->width = width;
  it->val = val;
  it->vflags = fl;
  return CUDA_SUCCESS;
}

static CUresult stream_value(CUstream h, int ptsz, int kind, CUdeviceptr addr, int width, uint64_t val, unsigned fl,
                             const char *what) {
  CUresult r = memop_check(addr, width, kind == K_WAITVAL, fl, what);
  if (r) return r;
  struct CUstream_st *s;
  if ((r = resolve_stream(h, ptsz, &s))) return r;
  if ((r = check_legacy_use(s, what))) return r;
  return memop_enqueue(s, kind, addr, width, val, fl);
}

static CUresult batch_memop(CUstream h, int ptsz, unsigned n, CUstreamBatchMemOpParams *ops, unsigned fl) {
  if (n == 0 || n > 256 || !ops || fl) {
    violation("cuStreamBatchMemOp: bad arguments (%u operations, flags 0x%x)", n, fl);
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned i = 0; i < n; i++) { /* all checked before any is queued */
    CUresult r = CUDA_SUCCESS;
    switch (ops[i].operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      r = memop_check(ops[i].waitValue.address, ops[i].operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8, 1,
                      ops[i].waitValue.flags, "cuStreamBatchMemOp");
      break;
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      r = memop_check(ops[i].writeValue.address, ops[i].operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8, 0,
                      ops[i].writeValue.flags, "cuStreamBatchMemOp");
      break;
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
    case CU_STREAM_MEM_OP_BARRIER:
      break;
    default:
      violation("cuStreamBatchMemOp: unknown operation %d", (int)ops[i].operation);
      r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r) return r;
  }
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if ((r = check_legacy_use(s, "cuStreamBatchMemOp"))) return r;
  for (unsigned i = 0; i < n && !r; i++) {
    const CUstreamBatchMemOpParams *o = &ops[i];
    switch (o->operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      r = memop_enqueue(s, K_WAITVAL, o->waitValue.address, 4, o->waitValue.value, o->waitValue.flags);
      break;
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      r = memop_enqueue(s, K_WAITVAL, o->waitValue.address, 8, o->waitValue.value64, o->waitValue.flags);
      break;
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      r = memop_enqueue(s, K_WRITEVAL, o->writeValue.address, 4, o->writeValue.value, o->writeValue.flags);
      break;
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      r = memop_enqueue(s, K_WRITEVAL, o->writeValue.address, 8, o->writeValue.value64, o->writeValue.flags);
      break;
    default: /* a flush or a barrier: ordered on the stream, nothing to do on the host */
      r = memop_enqueue(s, K_MARK, 0, 0, 0, 0);
    }
  }
  return r;
}

#define EMU_VALUE_OP(name, counter, kind, width, T)                                               \
  static CUresult e_##name(CUstream h, CUdeviceptr a, T v, unsigned int fl) {                    \
    ENTER_FN(FN_##counter);                                                                               \
    NEED_INIT();                                                                                  \
    LOCKED();                                                                                     \
    return stream_value(h, 0, kind, a, width, v, fl, #counter);                                   \
  }                                                                                               \
  static CUresult e_##name##_ptsz(CUstream h, CUdeviceptr a, T v, unsigned int fl) {             \
    ENTER_FN(FN_##counter);                                                                               \
    NEED_INIT();                                                                                  \
    LOCKED();                                                                                     \
    return stream_value(h, 1, kind, a, width, v, fl, #counter);                                   \
  }
EMU_VALUE_OP(cuStreamWaitValue32_v1, cuStreamWaitValue32, K_WAITVAL, 4, cuuint32_t)
EMU_VALUE_OP(cuStreamWaitValue32_v2, cuStreamWaitValue32, K_WAITVAL, 4, cuuint32_t)
EMU_VALUE_OP(cuStreamWaitValue64_v1, cuStreamWaitValue64, K_WAITVAL, 8, cuuint64_t)
EMU_VALUE_OP(cuStreamWaitValue64_v2, cuStreamWaitValue64, K_WAITVAL, 8, cuuint64_t)
EMU_VALUE_OP(cuStreamWriteValue32_v1, cuStreamWriteValue32, K_WRITEVAL, 4, cuuint32_t)
EMU_VALUE_OP(cuStreamWriteValue32_v2, cuStreamWriteValue32, K_WRITEVAL, 4, cuuint32_t)
EMU_VALUE_OP(cuStreamWriteValue64_v1, cuStreamWriteValue64, K_WRITEVAL, 8, cuuint64_t)
EMU_VALUE_OP(cuStreamWriteValue64_v2, cuStreamWriteValue64, K_WRITEVAL, 8, cuuint64_t)
#undef EMU_VALUE_OP

#define EMU_BATCH_OP(name)                                                                        \
  static CUresult e_##name(CUstream h, unsigned n, CUstreamBatchMemOpParams *ops, unsigned fl) { \
    ENTER_FN(FN_cuStreamBatchMemOp);                                                                    \
    NEED_INIT();                                                                                  \
    LOCKED();                                                                                     \
    return batch_memop(h, 0, n, ops, fl);                                                         \
  }                                                                                               \
  static CUresult e_##name##_ptsz(CUstream h, unsigned n, CUstreamBatchMemOpParams *ops, unsigned fl) { \
    ENTER_FN(FN_cuStreamBatchMemOp);                                                                    \
    NEED_INIT();                                                                                  \
    LOCKED();                                                                                     \
    return batch_memop(h, 1, n, ops, fl);                                                         \
  }
EMU_BATCH_OP(cuStreamBatchMemOp_v1)
EMU_BATCH_OP(cuStreamBatchMemOp_v2)
#undef EMU_BATCH_OP

/* Whether the word at it->dst meets the wait's condition now (an address the stream's device
 * cannot read counts as met, after the device fault is counted). */
static int value_reached(struct CUstream_st *s, item_t *it) {
  if (emu_device_access(s->ctx->dev, it->dst, (size_t)it->width, 0) != 0) return 1;
  uint64_t cur, v = it->val;
  if (it->width == 4) {
    cur = *(volatile uint32_t *)(uintptr_t)it->dst;
    v = (uint32_t)v;
  } else {
    cur = *(volatile uint64_t *)(uintptr_t)it->dst;
  }
  uint64_t mask = it->width == 4 ? 0xffffffffull : ~0ull;
  switch (it->vflags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) {
  case CU_STREAM_WAIT_VALUE_GEQ: return it->width == 4 ? (int32_t)((uint32_t)cur - (uint32_t)v) >= 0 : (int64_t)(cur - v) >= 0;
  case CU_STREAM_WAIT_VALUE_EQ: return cur == v;
  case CU_STREAM_WAIT_VALUE_AND: return (cur & v) != 0;
  default: return (~(cur | v) & mask) != 0; /* NOR */
  }
}

/* How long a wait that no pending work meets blocks (letting other threads queue the work
 * that meets it, as the host would) before it counts as a hang. */
#define EMU_WAIT_VALUE_MS 10000

/* Forces the other streams, one item at a time, until the wait at the head of s is met; while
 * none has work that could meet it, blocks with the lock let go. Returns with s's head possibly
 * completed by another thread meanwhile (the caller checks). */
static void wait_value(struct CUstream_st *s, item_t *it) {
  s->waiting++;
  s->waiter = my_tid();
  int waited_ms = 0;
  while (s->head == it && !value_reached(s, it)) {
    struct CUstream_st *p;
    for (p = g_streams; p; p = p->next)
      if (p != s && p->head && !p->waiting) break; /* (one another thread completes: not ours to run) */
    if (p) {
      complete_head(p);
      continue;
    }
    if (waited_ms >= EMU_WAIT_VALUE_MS) {
      violation("a cuStreamWaitValue%d at 0x%llx that nothing met in %d ms (the stream would hang)", it->width * 8,
                (unsigned long long)it->dst, EMU_WAIT_VALUE_MS);
      break;
    }
    let_go();
    waited_ms++;
  }
  s->waiting--;
}

static void value_write(struct CUstream_st *s, item_t *it) {
  if (emu_device_access(s->ctx->dev, it->dst, (size_t)it->width, 1) != 0) return;
  if (it->width == 4) *(volatile uint32_t *)(uintptr_t)it->dst = (uint32_t)it->val;
  else *(volatile uint64_t *)(uintptr_t)it->dst = it->val;
}

/* ------------------------------------------------------------------ peer access */

static int peer_capable(int dev, int peer) {
  return valid_dev(dev) && valid_dev(peer) && dev != peer && !g_peer_off[dev][peer];
}

static peer_t *find_peer(struct CUctx_st *from, struct CUctx_st *to) {
  for (peer_t *p = g_peers; p; p = p->next)
    if (p->from == from && p->to == to) return p;
  return NULL;
}

static CUresult e_cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  ENTER(cuDeviceCanAccessPeer);
  NEED_INIT();
  LOCKED();
  if (!can) {
    violation("cuDeviceCanAccessPeer: canAccessPeer is NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!valid_dev(dev) || !valid_dev(peer)) {
    violation("cuDeviceCanAccessPeer(dev %d, peerDev %d): invalid device (%d devices)", dev, peer, g_devcount);
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *can = peer_capable(dev, peer);
  return CUDA_SUCCESS;
}

/* The peer context argument of cuCtxEnablePeerAccess / cuCtxDisablePeerAccess. */
static int valid_peer_ctx(struct CUctx_st *peer, const char *fn) {
  if (peer && valid_ctx(peer) && peer->alive) return 1;
  violation("%s with an invalid or destroyed peer context %p", fn, (void *)peer);
  return 0;
}

static CUresult e_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  ENTER(cuCtxEnablePeerAccess);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (flags != 0) {
    violation("cuCtxEnablePeerAccess: flags 0x%x (must be 0)", flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!valid_peer_ctx(peer, "cuCtxEnablePeerAccess")) return CUDA_ERROR_INVALID_CONTEXT;
  if (peer->dev == c->dev) {
    violation("cuCtxEnablePeerAccess: peer context %p is on the current context's device %d", (void *)peer, c->dev);
    return CUDA_ERROR_INVALID_DEVICE;
  }
  if (!peer_capable(c->dev, peer->dev)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (find_peer(c, peer)) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  p->from = c;
  p->to = peer;
  p->next = g_peers;
  g_peers = p;
  return CUDA_SUCCESS;
}

static CUresult e_cuCtxDisablePeerAccess(CUcontext peer) {
  ENTER(cuCtxDisablePeerAccess);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!valid_peer_ctx(peer, "cuCtxDisablePeerAccess")) return CUDA_ERROR_INVALID_CONTEXT;
  for (peer_t **pp = &g_peers; *pp; pp = &(*pp)->next)
    if ((*pp)->from == c && (*pp)->to == peer) {
      peer_t *p = *pp;
      *pp = p->next;
      free(p);
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* ------------------------------------------------------------------ default memory pools */

static struct CUmemPoolHandle_st *find_pool(CUmemoryPool pool) {
  for (int i = 0; i < g_devcount; i++)
    if (pool == &g_pools[i]) return &g_pools[i];
  return NULL;
}

static CUresult device_pool(CUmemoryPool *pool, CUdevice dev, const char *fn) {
  NEED_INIT();
  LOCKED();
  if (!pool) {
    violation("%s: pool is NULL", fn);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!valid_dev(dev)) {
    violation("%s: invalid device %d (%d devices)", fn, dev, g_devcount);
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *pool = &g_pools[dev];
  return CUDA_SUCCESS;
}
static CUresult e_cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
  ENTER(cuDeviceGetDefaultMemPool);
  return device_pool(pool, dev, "cuDeviceGetDefaultMemPool");
}
/* There is no cuDeviceSetMemPool: a device's current pool is its default pool. */
static CUresult e_cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
  ENTER(cuDeviceGetMemPool);
  return device_pool(pool, dev, "cuDeviceGetMemPool");
}

static int valid_access_flags(unsigned long long f) {
  return f == CU_MEM_ACCESS_FLAGS_PROT_NONE || f == CU_MEM_ACCESS_FLAGS_PROT_READ ||
         f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

static CUresult e_cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  ENTER(cuMemPoolSetAccess);
  NEED_INIT();
  LOCKED();
  struct CUmemPoolHandle_st *p = find_pool(pool);
  if (!p) {
    violation("cuMemPoolSetAccess on an unknown pool %p", (void *)pool);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!map || count == 0) {
    violation("cuMemPoolSetAccess(map %p, count %zu): bad arguments", (const void *)map, count);
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < count; i++) {
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(map[i].location.id) ||
        !valid_access_flags((unsigned long long)map[i].flags)) {
      violation("cuMemPoolSetAccess: descriptor %zu has location type %d id %d flags %d", i,
                (int)map[i].location.type, map[i].location.id, (int)map[i].flags);
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (map[i].location.id == p->dev && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      violation("cuMemPoolSetAccess: descriptor %zu sets flags %d for the pool's own device %d (it keeps read-write)",
                i, (int)map[i].flags, p->dev);
      return CUDA_ERROR_INVALID_DEVICE;
    }
  }
  for (size_t i = 0; i < count; i++)
    if (map[i].location.id != p->dev) p->access[map[i].location.id] = (unsigned long long)map[i].flags;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool, CUmemLocation *location) {
  ENTER(cuMemPoolGetAccess);
  NEED_INIT();
  LOCKED();
  struct CUmemPoolHandle_st *p = find_pool(pool);
  if (!p) {
    violation("cuMemPoolGetAccess on an unknown pool %p", (void *)pool);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(location->id)) {
    violation("cuMemPoolGetAccess: bad arguments (flags %p, location %p)", (void *)flags, (void *)location);
    return CUDA_ERROR_INVALID_VALUE;
  }
  *flags = location->id == p->dev ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : (CUmemAccess_flags)p->access[location->id];
  return CUDA_SUCCESS;
}

/* The attributes' value types: int for the reuse flags, cuuint64_t for the rest. */
static int pool_attr_valid(CUmemPool_attribute attr) {
  return attr >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES && attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}
static int pool_attr_is_int(CUmemPool_attribute attr) { return attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES; }

static CUresult e_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  ENTER(cuMemPoolGetAttribute);
  NEED_INIT();
  LOCKED();
  struct CUmemPoolHandle_st *p = find_pool(pool);
  if (!p || !value || !pool_attr_valid(attr)) {
    violation("cuMemPoolGetAttribute(pool %p, attribute %d, value %p): bad arguments", (void *)pool, (int)attr, value);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (pool_attr_is_int(attr)) {
    *(int *)value = !p->reuse_off[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
    return CUDA_SUCCESS;
  }
  cuuint64_t v = 0;
  switch (attr) {
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->threshold; break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = pool_reserved(p->dev); break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = p->reserved_high; break;
  case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = pool_used(p->dev); break;
  default: v = p->used_high; break;
  }
  *(cuuint64_t *)value = v;
  return CUDA_SUCCESS;
}

static CUresult e_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  ENTER(cuMemPoolSetAttribute);
  NEED_INIT();
  LOCKED();
  struct CUmemPoolHandle_st *p = find_pool(pool);
  if (!p || !value || !pool_attr_valid(attr)) {
    violation("cuMemPoolSetAttribute(pool %p, attribute %d, value %p): bad arguments", (void *)pool, (int)attr, value);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT) {
    violation("cuMemPoolSetAttribute: attribute %d is read-only", (int)attr);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (pool_attr_is_int(attr)) {
    p->reuse_off[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value == 0;
    return CUDA_SUCCESS;
  }
  cuuint64_t v = *(cuuint64_t *)value;
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
    p->threshold = v; /* applied at the next synchronisation */
    return CUDA_SUCCESS;
  }
  if (v != 0) {
    violation("cuMemPoolSetAttribute: a high watermark (attribute %d) is reset to 0 only, not %llu", (int)attr,
              (unsigned long long)v);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* Reset: the watermark starts again from the current value. */
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) p->reserved_high = pool_reserved(p->dev);
  else p->used_high = pool_used(p->dev);
  return CUDA_SUCCESS;
}

static CUresult e_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  ENTER(cuMemPoolTrimTo);
  NEED_INIT();
  LOCKED();
  struct CUmemPoolHandle_st *p = find_pool(pool);
  if (!p) {
    violation("cuMemPoolTrimTo on an unknown pool %p", (void *)pool);
    return CUDA_ERROR_INVALID_VALUE;
  }
  pool_release(p->dev, keep);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ legacy IPC
 * An emulation handle: bytes 0-7 "EMUIPC\0\0", 8-15 the exporting pid, 16-23 the allocation's
 * base, 24-31 its size (native byte order), 32-63 zero. The emulation shares no plain memory
 * between processes, so no handle ever opens. */

#define IPC_MAGIC "EMUIPC\0"

static CUresult e_cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p) {
  ENTER(cuIpcGetMemHandle);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!handle) {
    violation("cuIpcGetMemHandle: pHandle is NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* only the base of a cuMemAlloc allocation: VMM, memory-pool and graph memory are not legacy
   * IPC capable (the real driver answers CUDA_ERROR_INVALID_VALUE for VMM memory) */
  plain_t *a = find_plain_base(p);
  if (!a || a->origin != P_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  uint64_t pid = (uint64_t)getpid(), base = a->base, size = a->size;
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, IPC_MAGIC, 8);
  memcpy(handle->reserved + 8, &pid, 8);
  memcpy(handle->reserved + 16, &base, 8);
  memcpy(handle->reserved + 24, &size, 8);
  return CUDA_SUCCESS;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  ENTER(cuIpcOpenMemHandle);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    violation("cuIpcOpenMemHandle: flags 0x%x (0 or CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)", flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!pdptr) {
    violation("cuIpcOpenMemHandle: pdptr is NULL");
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t pid = 0, size = 0;
  memcpy(&pid, handle.reserved + 8, 8);
  memcpy(&size, handle.reserved + 24, 8);
  int zero = 1;
  for (size_t i = 32; i < sizeof handle.reserved; i++)
    if (handle.reserved[i]) zero = 0;
  if (memcmp(handle.reserved, IPC_MAGIC, 8) != 0 || !zero || pid == 0 || pid > INT_MAX || size == 0)
    return CUDA_ERROR_INVALID_VALUE; /* not a handle of cuIpcGetMemHandle */
  if ((pid_t)pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* as the real driver answers */
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return CUDA_ERROR_MAP_FAILED;
  return CUDA_ERROR_NOT_SUPPORTED; /* a live process: plain memory is not shared */
}
static CUresult e_cuIpcOpenMemHandle_v1(CUdeviceptr *p, CUipcMemHandle h, unsigned int f) { return ipc_open(p, h, f); }
static CUresult e_cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int f) { return ipc_open(p, h, f); }

static CUresult e_cuIpcCloseMemHandle(CUdeviceptr p) {
  ENTER(cuIpcCloseMemHandle);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  (void)p;
  return CUDA_ERROR_INVALID_VALUE; /* nothing is ever opened */
}

/* ------------------------------------------------------------------ streams */

static CUresult stream_create(CUstream *ph, unsigned flags, int prio) {
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) {
    violation("cuStreamCreate: bad arguments (flags 0x%x)", flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct CUstream_st *s = new_stream(c, S_USER, flags, prio);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  *ph = s;
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamCreate(CUstream *ph, unsigned int flags) {
  ENTER(cuStreamCreate);
  return stream_create(ph, flags, 0);
}
static CUresult e_cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int prio) {
  ENTER(cuStreamCreateWithPriority);
  return stream_create(ph, flags, prio);
}

static CUresult stream_destroy(CUstream h) {
  ENTER(cuStreamDestroy);
  LOCKED();
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    violation("cuStreamDestroy of a default stream");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, 0, &s);
  if (r) return r;
  destroy_stream(s);
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamDestroy_v2(CUstream h) { return stream_destroy(h); }
static CUresult e_cuStreamDestroy_v1(CUstream h) { return stream_destroy(h); }

static CUresult capture_sync_check(struct CUstream_st *s, const char *what) {
  if (s->cap) {
    violation("%s on a capturing stream", what);
    invalidate_capture(s);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return check_legacy_use(s, what);
}

static CUresult stream_query(CUstream h, int ptsz) {
  ENTER(cuStreamQuery);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  r = capture_sync_check(s, "cuStreamQuery");
  if (r) return r;
  if (s->head) return CUDA_ERROR_NOT_READY;
  if (s->kind == S_LEGACY)
    for (struct CUstream_st *p = g_streams; p; p = p->next)
      if (p->ctx == s->ctx && is_blocking(p) && p->head) return CUDA_ERROR_NOT_READY;
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamQuery(CUstream h) { return stream_query(h, 0); }
static CUresult e_cuStreamQuery_ptsz(CUstream h) { return stream_query(h, 1); }

static CUresult stream_sync(CUstream h, int ptsz) {
  ENTER(cuStreamSynchronize);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  r = capture_sync_check(s, "cuStreamSynchronize");
  if (r) return r;
  force(s, s->enq);
  if (s->kind == S_LEGACY) {
    uint64_t now = g_gseq;
    for (struct CUstream_st *p = g_streams; p; p = p->next)
      if (p->ctx == s->ctx && is_blocking(p)) force_gseq(p, now);
  }
  pool_release(s->ctx->dev, g_pools[s->ctx->dev].threshold);
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamSynchronize(CUstream h) { return stream_sync(h, 0); }
static CUresult e_cuStreamSynchronize_ptsz(CUstream h) { return stream_sync(h, 1); }

static int valid_event(struct CUevent_st *e) {
  for (struct CUevent_st *p = g_events; p; p = p->next)
    if (p == e) return 1;
  return 0;
}

static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned int flags, int ptsz) {
  ENTER(cuStreamWaitEvent);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if (!ev || !valid_event(ev)) {
    violation("cuStreamWaitEvent with an invalid event %p", (void *)ev);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  (void)flags;
  r = check_legacy_use(s, "cuStreamWaitEvent");
  if (r) return r;
  struct CUevent_st *e = ev;
  if (e->captured && e->stream && e->stream->cap == 1 && !s->cap) {
    /* fork into the capture */
    struct CUstream_st *o = e->stream->cap_origin;
    s->cap = 1;
    s->cap_origin = o;
    s->cap_mode = o->cap_mode;
    s->cap_tid = o->cap_tid;
    s->cap_id = o->cap_id;
    s->cap_items = 0;
    return CUDA_SUCCESS;
  }
  if (s->cap) {
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  if (e->captured) {
    violation("cuStreamWaitEvent on an event recorded in a capture that has ended");
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (e->stream && e->stream != s && e->stream->done < e->target) {
    item_t *it = enqueue(s, K_WAIT);
    if (!it) return CUDA_ERROR_OUT_OF_MEMORY;
    it->wstream = e->stream;
    it->wtarget = e->target;
  }
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamWaitEvent(CUstream h, CUevent e, unsigned int f) { return stream_wait_event(h, e, f, 0); }
static CUresult e_cuStreamWaitEvent_ptsz(CUstream h, CUevent e, unsigned int f) {
  return stream_wait_event(h, e, f, 1);
}

static CUresult stream_get_ctx(CUstream h, CUcontext *pctx, int ptsz) {
  ENTER(cuStreamGetCtx);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = s->ctx;
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamGetCtx(CUstream h, CUcontext *c) { return stream_get_ctx(h, c, 0); }
static CUresult e_cuStreamGetCtx_ptsz(CUstream h, CUcontext *c) { return stream_get_ctx(h, c, 1); }

/* ------------------------------------------------------------------ events */

static CUresult e_cuEventCreate(CUevent *ph, unsigned int flags) {
  ENTER(cuEventCreate);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!ph || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS))) {
    violation("cuEventCreate: bad arguments (flags 0x%x)", flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  e->magic = MAGIC_EVENT;
  e->flags = flags;
  e->ctx = c;
  e->next = g_events;
  g_events = e;
  *ph = e;
  return CUDA_SUCCESS;
}

static CUresult event_record(CUevent ev, CUstream h, int ptsz) {
  ENTER(cuEventRecord);
  LOCKED();
  if (!ev || !valid_event(ev)) {
    violation("cuEventRecord with an invalid event %p", (void *)ev);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  r = check_legacy_use(s, "cuEventRecord");
  if (r) return r;
  struct CUevent_st *e = ev;
  if (s->cap) {
    e->captured = 1;
    e->stream = s;
    e->target = 0;
    s->cap_items++;
    return CUDA_SUCCESS;
  }
  if (!enqueue(s, K_MARK)) return CUDA_ERROR_OUT_OF_MEMORY;
  e->captured = 0;
  e->stream = s;
  e->target = s->enq;
  if (g_eager && s->n_user == 0) force(s, e->target); /* an idle GPU passes the mark at once */
  return CUDA_SUCCESS;
}
static CUresult e_cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
static CUresult e_cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

static CUresult e_cuEventQuery(CUevent ev) {
  ENTER(cuEventQuery);
  NEED_INIT();
  LOCKED();
  if (!ev || !valid_event(ev)) {
    violation("cuEventQuery with an invalid event %p", (void *)ev);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  struct CUevent_st *e = ev;
  if (e->captured) {
    violation("cuEventQuery on an event last recorded in a capturing stream");
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (!e->stream || e->stream->done >= e->target) return CUDA_SUCCESS;
  return CUDA_ERROR_NOT_READY;
}

static CUresult e_cuEventSynchronize(CUevent ev) {
  ENTER(cuEventSynchronize);
  NEED_INIT();
  LOCKED();
  if (!ev || !valid_event(ev)) {
    violation("cuEventSynchronize with an invalid event %p", (void *)ev);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  struct CUevent_st *e = ev;
  if (e->captured) {
    violation("cuEventSynchronize on an event last recorded in a capturing stream");
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (e->stream) force(e->stream, e->target);
  if (e->ctx) pool_release(e->ctx->dev, g_pools[e->ctx->dev].threshold);
  return CUDA_SUCCESS;
}

static CUresult event_destroy(CUevent ev) {
  ENTER(cuEventDestroy);
  NEED_INIT();
  LOCKED();
  for (struct CUevent_st **pp = &g_events; *pp; pp = &(*pp)->next)
    if (*pp == ev) {
      *pp = ev->next;
      ev->magic = 0;
      free(ev);
      return CUDA_SUCCESS;
    }
  violation("cuEventDestroy of an invalid event %p", (void *)ev);
  return CUDA_ERROR_INVALID_HANDLE;
}
static CUresult e_cuEventDestroy_v2(CUevent e) { return event_destroy(e); }
static CUresult e_cuEventDestroy_v1(CUevent e) { return event_destroy(e); }

/* ------------------------------------------------------------------ capture */

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, int ptsz) {
  ENTER(cuStreamBeginCapture);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if (s->kind == S_LEGACY) {
    violation("cuStreamBeginCapture on the legacy stream");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (s->cap) {
    violation("cuStreamBeginCapture on a stream already capturing");
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    violation("cuStreamBeginCapture: mode %d", (int)mode);
    return CUDA_ERROR_INVALID_VALUE;
  }
  s->cap = 1;
  s->cap_mode = mode;
  s->cap_tid = my_tid();
  s->cap_id = g_cap_next++;
  s->cap_origin = s;
  s->cap_items = 0;
  s->cap_nfrees = 0;
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode m) { return begin_capture(h, m, 0); }
static CUresult e_cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode m) { return begin_capture(h, m, 1); }
static CUresult e_cuStreamBeginCapture_v1(CUstream h) { return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, 0); }
static CUresult e_cuStreamBeginCapture_v1_ptsz(CUstream h) {
  return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, 1);
}

static CUresult end_capture(CUstream h, CUgraph *pg, int ptsz) {
  ENTER(cuStreamEndCapture);
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if (!pg) return CUDA_ERROR_INVALID_VALUE;
  if (!s->cap) {
    violation("cuStreamEndCapture on a stream that is not capturing");
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  if (s->cap_origin != s) {
    violation("cuStreamEndCapture on a stream that did not begin the capture");
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->cap_tid != my_tid()) {
    violation("cuStreamEndCapture from another thread than the one that began the capture");
    invalidate_capture(s);
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  int status = s->cap;
  struct CUgraph_st *g = NULL;
  if (status == 1) {
    g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = MAGIC_GRAPH;
    g->cap_id = s->cap_id;
    g->frees = s->cap_frees;
    g->nfrees = s->cap_nfrees;
    g->next = g_graphs;
    g_graphs = g;
  } else {
    free(s->cap_frees);
  }
  s->cap_frees = NULL;
  s->cap_nfrees = s->cap_capfrees = 0;
  for (struct CUstream_st *p = g_streams; p; p = p->next)
    if (p->cap && p->cap_origin == s && p != s) {
      p->cap = 0;
      p->cap_origin = NULL;
      p->cap_items = 0;
    }
  s->cap = 0;
  s->cap_origin = NULL;
  s->cap_items = 0;
  *pg = g;
  return status == 1 ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}
static CUresult e_cuStreamEndCapture(CUstream h, CUgraph *g) { return end_capture(h, g, 0); }
static CUresult e_cuStreamEndCapture_ptsz(CUstream h, CUgraph *g) { return end_capture(h, g, 1); }

static CUresult capture_status(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, int ptsz) {
  LOCKED();
  struct CUstream_st *s;
  CUresult r = resolve_stream(h, ptsz, &s);
  if (r) return r;
  if (!st) return CUDA_ERROR_INVALID_VALUE;
  if (s->kind == S_LEGACY && blocking_capture(s->ctx)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *st = s->cap == 1 ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                    : s->cap == 2 ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id && s->cap) *id = s->cap_id;
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st) {
  ENTER(cuStreamIsCapturing);
  return capture_status(h, st, NULL, 0);
}
static CUresult e_cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st) {
  ENTER(cuStreamIsCapturing);
  return capture_status(h, st, NULL, 1);
}
static CUresult capture_info(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n, int ptsz) {
  ENTER(cuStreamGetCaptureInfo);
  CUresult r = capture_status(h, st, id, ptsz);
  if (r) return r;
  if (g) *g = NULL;
  if (deps) *deps = NULL;
  if (edges) *edges = NULL;
  if (n) *n = 0;
  return CUDA_SUCCESS;
}
static CUresult e_cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                            const CUgraphNode **d, size_t *n) {
  return capture_info(h, st, id, g, d, NULL, n, 0);
}
static CUresult e_cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                                 const CUgraphNode **d, size_t *n) {
  return capture_info(h, st, id, g, d, NULL, n, 1);
}
static CUresult e_cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                            const CUgraphNode **d, const CUgraphEdgeData **ed, size_t *n) {
  return capture_info(h, st, id, g, d, ed, n, 0);
}
static CUresult e_cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                                 const CUgraphNode **d, const CUgraphEdgeData **ed, size_t *n) {
  return capture_info(h, st, id, g, d, ed, n, 1);
}

static CUresult e_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  ENTER(cuThreadExchangeStreamCaptureMode);
  if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                *mode != CU_STREAM_CAPTURE_MODE_RELAXED)) {
    violation("cuThreadExchangeStreamCaptureMode: bad mode");
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUstreamCaptureMode old = tl_capmode;
  tl_capmode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

static CUresult e_cuGraphDestroy(CUgraph hg) {
  ENTER(cuGraphDestroy);
  NEED_INIT();
  LOCKED();
  struct CUgraph_st **pp = &g_graphs;
  for (; *pp; pp = &(*pp)->next)
    if (*pp == hg) break;
  if (!*pp) {
    violation("cuGraphDestroy of an invalid graph %p", (void *)hg);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct CUgraph_st *g = *pp;
  *pp = g->next;
  for (size_t i = 0; i < g->nfrees; i++) {
    plain_t *a = find_plain_base(g->frees[i]);
    if (a && a->cap_id == g->cap_id) plain_free(a);
  }
  free(g->frees);
  g->magic = 0;
  free(g);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ copies to and from host memory */

/* cuMemcpyDtoH / cuMemcpyHtoD: synchronous, after the legacy stream's earlier work (an empty item
 * queued there takes its place in the legacy order), checked as a copy engine of the current
 * context's device would be (emu_device_access: a refusal is a violation and a device fault). */
static CUresult host_copy(int to_host, void *h, CUdeviceptr d, size_t n, const char *fn) {
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!h && n) return CUDA_ERROR_INVALID_VALUE;
  if ((r = check_unsafe(fn))) return r;
  if ((r = enqueue_copy(CU_STREAM_LEGACY, 0, K_SET, d, 0, 0, 0))) return r;
  force(c->legacy, c->legacy->enq);
  if (emu_device_access(c->dev, d, n, to_host ? 0 : 1) != 0) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (n && to_host) memcpy(h, (const void *)(uintptr_t)d, n);
  else if (n) memcpy((void *)(uintptr_t)d, h, n);
  return CUDA_SUCCESS;
}
static CUresult e_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  ENTER(cuMemcpyDtoH);
  NEED_INIT();
  LOCKED();
  return host_copy(1, dst, src, n, "cuMemcpyDtoH");
}
static CUresult e_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  ENTER(cuMemcpyHtoD);
  NEED_INIT();
  LOCKED();
  return host_copy(0, (void *)(uintptr_t)src, dst, n, "cuMemcpyHtoD");
}

/* ------------------------------------------------------------------ arrays */

/* CUDA arrays (cuArrayCreate, cuArray3DCreate): memory of their device, Width x Height x Depth
 * elements of NumChannels (1, 2 or 4) channels of Format, drawn from the device's budget at once
 * and given back by cuArrayDestroy. Formats other than the 8/16/32-bit integers, half and float
 * are not emulated (CUDA_ERROR_NOT_SUPPORTED, not a violation). */
#define MAGIC_ARRAY 0x41525259u
struct CUarray_st {
  uint32_t magic;
  int dev;
  size_t size;
  struct CUarray_st *next;
};
static struct CUarray_st *g_arrays;

static size_t format_bytes(CUarray_format f) {
  switch (f) {
  case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
  case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
  case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
  default: return 0;
  }
}

/* An array (or mipmapped array) of size bytes on c's device, drawn from its budget at once. */
static CUresult array_charge(struct CUctx_st *c, uint32_t magic, size_t size, void **out) {
  device_t *dv = &g_dev[c->dev];
  struct CUarray_st *a = dev_fits(dv, size) ? calloc(1, sizeof *a) : NULL;
  if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
  *a = (struct CUarray_st){magic, c->dev, size, g_arrays};
  g_arrays = a;
  dv->used += size;
  *out = a;
  return CUDA_SUCCESS;
}

/* Frees the live array h (of that magic; 0: either kind), giving its size back: 0, or -1 when it is none. */
static int array_drop(const void *h, uint32_t magic) {
  for (struct CUarray_st **pp = &g_arrays; *pp; pp = &(*pp)->next)
    if (*pp == h && (!magic || (*pp)->magic == magic)) {
      struct CUarray_st *a = *pp;
      *pp = a->next;
      g_dev[a->dev].used -= a->size;
      a->magic = 0;
      free(a);
      return 0;
    }
  return -1;
}

static CUresult array_create(CUarray *out, size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, const char *fn) {
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!out || w == 0 || (ch != 1 && ch != 2 && ch != 4)) {
    violation("%s: width %zu, %u channels (1, 2 or 4)", fn, w, ch);
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t eb = format_bytes(f);
  if (!eb) return CUDA_ERROR_NOT_SUPPORTED;
  return array_charge(c, MAGIC_ARRAY, w * (h ? h : 1) * (d ? d : 1) * ch * eb, (void **)out);
}
static CUresult e_cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *desc) {
  ENTER(cuArrayCreate);
  NEED_INIT();
  LOCKED();
  if (!desc) return CUDA_ERROR_INVALID_VALUE;
  return array_create(out, desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, "cuArrayCreate");
}
static CUresult e_cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
  ENTER(cuArray3DCreate);
  NEED_INIT();
  LOCKED();
  if (!desc) return CUDA_ERROR_INVALID_VALUE;
  return array_create(out, desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, "cuArray3DCreate");
}
static CUresult e_cuArrayDestroy(CUarray a) {
  ENTER(cuArrayDestroy);
  NEED_INIT();
  LOCKED();
  if (array_drop(a, 0) == 0) return CUDA_SUCCESS;
  violation("cuArrayDestroy of an invalid array %p", (void *)a);
  return CUDA_ERROR_INVALID_HANDLE;
}

/* A mipmapped array: its levels (each dimension halved, at least 1) drawn at once like an array's. */
#define MAGIC_MIPMAP 0x4d49504du
static CUresult e_cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
  ENTER(cuMipmappedArrayCreate);
  NEED_INIT();
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!out || !desc || levels == 0 || desc->Width == 0 || (desc->NumChannels != 1 && desc->NumChannels != 2 &&
                                                            desc->NumChannels != 4)) {
    violation("cuMipmappedArrayCreate: %s", !out || !desc ? "NULL argument" : "width 0, no level or 3 channels");
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t eb = format_bytes(desc->Format), size = 0, w = desc->Width, h = desc->Height, d = desc->Depth;
  if (!eb) return CUDA_ERROR_NOT_SUPPORTED;
  for (unsigned l = 0; l < levels; l++) {
    size += w * (h ? h : 1) * (d ? d : 1) * desc->NumChannels * eb;
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : h;
    d = d > 1 ? d / 2 : d;
  }
  return array_charge(c, MAGIC_MIPMAP, size, (void **)out);
}
static CUresult e_cuMipmappedArrayDestroy(CUmipmappedArray m) {
  ENTER(cuMipmappedArrayDestroy);
  NEED_INIT();
  LOCKED();
  if (array_drop(m, MAGIC_MIPMAP) == 0) return CUDA_SUCCESS;
  violation("cuMipmappedArrayDestroy of an invalid mipmapped array %p", (void *)m);
  return CUDA_ERROR_INVALID_HANDLE;
}

/* ------------------------------------------------------------------ modules and libraries */
/* A module (cuModuleLoad*) is loaded into the current context and takes g_mod_bytes of its
 * device until cuModuleUnload or the context's end. A library (cuLibraryLoad*) is loaded at
 * once into the current context (as with CUDA_MODULE_LOADING=EAGER), taking as much; with no
 * context current it takes nothing. The images are not read: any non-NULL image loads. */
#define MAGIC_MODULE 0x4d4f4421u
#define MAGIC_LIBRARY 0x4c494221u
typedef struct emu_module_s {
  uint32_t magic;
  struct CUctx_st *ctx; /* NULL once the context ended (or a library loaded without one) */
  size_t charged;
  struct emu_module_s *next;
} emu_module_t;
static emu_module_t *g_modules;

static void module_drop_ctx(struct CUctx_st *ctx) {
  for (emu_module_t *m = g_modules; m; m = m->next)
    if (m->ctx == ctx) {
      g_dev[ctx->dev].used -= m->charged;
      m->charged = 0;
      m->ctx = NULL;
    }
}

static CUresult module_load(void **out, const void *image, uint32_t magic, int need_ctx, const char *fn) {
  if (!out || !image) {
    violation("%s: %s is NULL", fn, out ? "the image" : "the handle pointer");
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct CUctx_st *c = tl_ctx && tl_ctx->alive ? tl_ctx : NULL;
  if (need_ctx) {
    CUresult r = cur_ctx(&c);
    if (r) return r;
  }
  size_t size = c ? g_mod_bytes : 0;
  if (c && !dev_fits(&g_dev[c->dev], size)) return CUDA_ERROR_OUT_OF_MEMORY;
  emu_module_t *m = calloc(1, sizeof *m);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *m = (emu_module_t){magic, c, size, g_modules};
  g_modules = m;
  if (c) g_dev[c->dev].used += size;
  *out = m;
  return CUDA_SUCCESS;
}

static CUresult module_unload(void *h, uint32_t magic, const char *fn) {
  for (emu_module_t **pp = &g_modules; *pp; pp = &(*pp)->next)
    if (*pp == h && (*pp)->magic == magic) {
      emu_module_t *m = *pp;
      *pp = m->next;
      if (m->ctx) g_dev[m->ctx->dev].used -= m->charged;
      m->magic = 0;
      free(m);
      return CUDA_SUCCESS;
    }
  violation("%s of an invalid or unloaded handle %p", fn, h);
  return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult e_cuModuleLoadData(CUmodule *mod, const void *image) {
  ENTER(cuModuleLoadData);
  NEED_INIT();
  LOCKED();
  return module_load((void **)mod, image, MAGIC_MODULE, 1, "cuModuleLoadData");
}
static CUresult e_cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned n, CUjit_option *opt, void **vals) {
  ENTER(cuModuleLoadDataEx);
  NEED_INIT();
  LOCKED();
  if (n && (!opt || !vals)) return CUDA_ERROR_INVALID_VALUE;
  return module_load((void **)mod, image, MAGIC_MODULE, 1, "cuModuleLoadDataEx");
}
static CUresult e_cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin) {
  ENTER(cuModuleLoadFatBinary);
  NEED_INIT();
  LOCKED();
  return module_load((void **)mod, fatbin, MAGIC_MODULE, 1, "cuModuleLoadFatBinary");
}
static CUresult e_cuModuleLoad(CUmodule *mod, const char *fname) {
  ENTER(cuModuleLoad);
  NEED_INIT();
  LOCKED();
  if (!fname) return CUDA_ERROR_INVALID_VALUE;
  if (access(fname, R_OK) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
  return module_load((void **)mod, fname, MAGIC_MODULE, 1, "cuModuleLoad");
}
static CUresult e_cuModuleUnload(CUmodule mod) {
  ENTER(cuModuleUnload);
  NEED_INIT();
  LOCKED();
  return module_unload(mod, MAGIC_MODULE, "cuModuleUnload");
}
static CUresult e_cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned njo,
                                    CUlibraryOption *lo, void **lv, unsigned nlo) {
  ENTER(cuLibraryLoadData);
  NEED_INIT();
  LOCKED();
  if ((njo && (!jo || !jv)) || (nlo && (!lo || !lv))) return CUDA_ERROR_INVALID_VALUE;
  return module_load((void **)lib, code, MAGIC_LIBRARY, 0, "cuLibraryLoadData");
}
static CUresult e_cuLibraryLoadFromFile(CUlibrary *lib, const char *fname, CUjit_option *jo, void **jv, unsigned njo,
                                        CUlibraryOption *lo, void **lv, unsigned nlo) {
  ENTER(cuLibraryLoadFromFile);
  NEED_INIT();
  LOCKED();
  if (!fname || (njo && (!jo || !jv)) || (nlo && (!lo || !lv))) return CUDA_ERROR_INVALID_VALUE;
  if (access(fname, R_OK) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
  return module_load((void **)lib, fname, MAGIC_LIBRARY, 0, "cuLibraryLoadFromFile");
}
static CUresult e_cuLibraryUnload(CUlibrary lib) {
  ENTER(cuLibraryUnload);
  NEED_INIT();
  LOCKED();
  return module_unload(lib, MAGIC_LIBRARY, "cuLibraryUnload");
}

/* ------------------------------------------------------------------ managed, pinned host and graph memory */

/* Managed memory (cuMemAllocManaged): drawn from its device's budget at once (a GPU makes it
 * resident when touched; the emulation counts it from the start, so cuMemGetInfo moves by its
 * size), reached by every device, freed by cuMemFree. */
static CUresult e_cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
  ENTER(cuMemAllocManaged);
  LOCKED();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) return r;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
    violation("cuMemAllocManaged with flags 0x%x (CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST)", flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  r = check_unsafe("cuMemAllocManaged");
  if (r) return r;
  return plain_alloc(c, size, 0, P_MANAGED, dptr);
}

/* Graph memory: the graph allocations (cuMemAllocAsync in a capture) of a device, live until
 * their graph is destroyed; they are made at once and freed whole, so what the driver reserves
 * for graphs is what they use (USED and RESERVED agree; the high watermarks follow, reset by
 * setting 0). cuGraphMemTrim has nothing unused to give back. */
static size_t g_graph_high[EMU_MAXDEV][2];
static size_t graph_used(int dev) {
  size_t n = 0;
  for (plain_t *a = g_plain; a; a = a->next)
    if (a->dev == dev && a->origin == P_GRAPH) n += a->size;
  return n;
}
static CUresult e_cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value) {
  ENTER(cuDeviceGetGraphMemAttribute);
  NEED_INIT();
  LOCKED();
  if (!valid_dev(dev) || !value) {
    violation("cuDeviceGetGraphMemAttribute(device %d, value %p)", (int)dev, value);
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t used = graph_used(dev);
  for (int i = 0; i < 2; i++)
    if (g_graph_high[dev][i] < used) g_graph_high[dev][i] = used;
  switch (attr) {
  case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
  case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = used; break;
  case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = g_graph_high[dev][0]; break;
  case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = g_graph_high[dev][1]; break;
  default:
    violation("cuDeviceGetGraphMemAttribute of unknown attribute %d", (int)attr);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
static CUresult e_cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value) {
  ENTER(cuDeviceSetGraphMemAttribute);
  NEED_INIT();
  LOCKED();
  int i = attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH ? 0 : attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH ? 1 : -1;
  if (!valid_dev(dev) || !value || i < 0 || *(cuuint64_t *)value != 0) {
    violation("cuDeviceSetGraphMemAttribute: only a high watermark, reset to 0");
    return CUDA_ERROR_INVALID_VALUE;
  }
  g_graph_high[dev][i] = graph_used(dev);
  return CUDA_SUCCESS;
}
static CUresult e_cuDeviceGraphMemTrim(CUdevice dev) {
  ENTER(cuDeviceGraphMemTrim);
  NEED_INIT();
  LOCKED();
  if (!valid_dev(dev)) {
    violation("cuDeviceGraphMemTrim of device %d", (int)dev);
    return CUDA_ERROR_INVALID_DEVICE;
  }
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ errors */

static const struct {
  CUresult r;
  const char *name, *text;
} g_errs[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult e_cuGetErrorName(CUresult err, const char **str) {
  ENTER(cuGetErrorName);
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
    if (g_errs[i].r == err) {
      *str = g_errs[i].name;
      return CUDA_SUCCESS;
    }
  *str = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult e_cuGetErrorString(CUresult err, const char **str) {
  ENTER(cuGetErrorString);
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
    if (g_errs[i].r == err) {
      *str = g_errs[i].text;
      return CUDA_SUCCESS;
    }
  *str = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ cuGetProcAddress */

typedef struct sym_s {
  const char *name;
  int ver;
  void *fn, *fn_ptsz;
} sym_t;

#define SYM(name, ver, fn) {name, ver, (void *)fn, NULL}
#define SYMP(name, ver, fn, fnp) {name, ver, (void *)fn, (void *)fnp}
static CUresult e_cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static CUresult e_cuGetProcAddress_v1(const char *, void **, int, cuuint64_t);

static const sym_t g_syms[] = {
    SYM("cuInit", 2000, e_cuInit),
    SYM("cuDriverGetVersion", 2020, e_cuDriverGetVersion),
    SYM("cuGetProcAddress", 11030, e_cuGetProcAddress_v1),
    SYM("cuGetProcAddress", 12000, e_cuGetProcAddress_v2),
    SYM("cuDeviceGet", 2000, e_cuDeviceGet),
    SYM("cuDeviceGetCount", 2000, e_cuDeviceGetCount),
    SYM("cuDeviceGetName", 2000, e_cuDeviceGetName),
    SYM("cuDeviceGetAttribute", 2000, e_cuDeviceGetAttribute),
    SYM("cuDeviceTotalMem", 2000, e_cuDeviceTotalMem_v1),
    SYM("cuDeviceTotalMem", 3020, e_cuDeviceTotalMem_v2),
    SYM("cuDevicePrimaryCtxRetain", 7000, e_cuDevicePrimaryCtxRetain),
    SYM("cuDeviceGetPCIBusId", 4010, e_cuDeviceGetPCIBusId),
    SYM("cuDevicePrimaryCtxRelease", 7000, e_cuDevicePrimaryCtxRelease_v1),
    SYM("cuDevicePrimaryCtxRelease", 11000, e_cuDevicePrimaryCtxRelease_v2),
    SYM("cuDevicePrimaryCtxReset", 7000, e_cuDevicePrimaryCtxReset_v1),
    SYM("cuDevicePrimaryCtxReset", 11000, e_cuDevicePrimaryCtxReset_v2),
    SYM("cuDevicePrimaryCtxGetState", 7000, e_cuDevicePrimaryCtxGetState),
    SYM("cuDevicePrimaryCtxSetFlags", 11000, e_cuDevicePrimaryCtxSetFlags_v2),
    SYM("cuCtxCreate", 2000, e_cuCtxCreate_v1),
    SYM("cuCtxCreate", 3020, e_cuCtxCreate_v2),
    SYM("cuCtxCreate", 11040, e_cuCtxCreate_v3),
    SYM("cuCtxCreate", 12050, e_cuCtxCreate_v4),
    SYM("cuCtxDestroy", 2000, e_cuCtxDestroy_v1),
    SYM("cuCtxDestroy", 4000, e_cuCtxDestroy_v2),
    SYM("cuCtxGetCurrent", 4000, e_cuCtxGetCurrent),
    SYM("cuCtxSetCurrent", 4000, e_cuCtxSetCurrent),
    SYM("cuCtxGetDevice", 2000, e_cuCtxGetDevice),
    SYM("cuCtxSynchronize", 2000, e_cuCtxSynchronize),
    SYM("cuCtxPushCurrent", 2000, e_cuCtxPushCurrent_v1),
    SYM("cuCtxPushCurrent", 4000, e_cuCtxPushCurrent_v2),
    SYM("cuCtxPopCurrent", 2000, e_cuCtxPopCurrent_v1),
    SYM("cuCtxPopCurrent", 4000, e_cuCtxPopCurrent_v2),
    SYM("cuDeviceCanAccessPeer", 4000, e_cuDeviceCanAccessPeer),
    SYM("cuCtxEnablePeerAccess", 4000, e_cuCtxEnablePeerAccess),
    SYM("cuCtxDisablePeerAccess", 4000, e_cuCtxDisablePeerAccess),
    SYM("cuMemGetAllocationGranularity", 10020, e_cuMemGetAllocationGranularity),
    SYM("cuMemAddressReserve", 10020, e_cuMemAddressReserve),
    SYM("cuMemAddressFree", 10020, e_cuMemAddressFree),
    SYM("cuMemCreate", 10020, e_cuMemCreate),
    SYM("cuMemRelease", 10020, e_cuMemRelease),
    SYM("cuMemMap", 10020, e_cuMemMap),
    SYM("cuMemUnmap", 10020, e_cuMemUnmap),
    SYM("cuMemSetAccess", 10020, e_cuMemSetAccess),
    SYM("cuMemGetAccess", 10020, e_cuMemGetAccess),
    SYM("cuMemRetainAllocationHandle", 11000, e_cuMemRetainAllocationHandle),
    SYM("cuMemGetAllocationPropertiesFromHandle", 10020, e_cuMemGetAllocationPropertiesFromHandle),
    SYM("cuMemExportToShareableHandle", 10020, e_cuMemExportToShareableHandle),
    SYM("cuMemImportFromShareableHandle", 10020, e_cuMemImportFromShareableHandle),
    SYM("cuMemAlloc", 2000, e_cuMemAlloc_v1),
    SYM("cuMemAlloc", 3020, e_cuMemAlloc_v2),
    SYM("cuMemFree", 2000, e_cuMemFree_v1),
    SYM("cuMemFree", 3020, e_cuMemFree_v2),
    SYMP("cuMemAllocAsync", 11020, e_cuMemAllocAsync, e_cuMemAllocAsync_ptsz),
    SYMP("cuMemFreeAsync", 11020, e_cuMemFreeAsync, e_cuMemFreeAsync_ptsz),
    SYM("cuArrayCreate", 3020, e_cuArrayCreate_v2),
    SYM("cuArray3DCreate", 3020, e_cuArray3DCreate_v2),
    SYM("cuArrayDestroy", 2000, e_cuArrayDestroy),
    SYM("cuMipmappedArrayCreate", 5000, e_cuMipmappedArrayCreate),
    SYM("cuMipmappedArrayDestroy", 5000, e_cuMipmappedArrayDestroy),
    SYM("cuModuleLoad", 2000, e_cuModuleLoad),
    SYM("cuModuleLoadData", 2000, e_cuModuleLoadData),
    SYM("cuModuleLoadDataEx", 2010, e_cuModuleLoadDataEx),
    SYM("cuModuleLoadFatBinary", 2000, e_cuModuleLoadFatBinary),
    SYM("cuModuleUnload", 2000, e_cuModuleUnload),
    SYM("cuLibraryLoadData", 12000, e_cuLibraryLoadData),
    SYM("cuLibraryLoadFromFile", 12000, e_cuLibraryLoadFromFile),
    SYM("cuLibraryUnload", 12000, e_cuLibraryUnload),
    SYM("cuMemcpyDtoH", 3020, e_cuMemcpyDtoH_v2),
    SYM("cuMemcpyHtoD", 3020, e_cuMemcpyHtoD_v2),
    SYM("cuMemAllocManaged", 6000, e_cuMemAllocManaged),
    SYM("cuMemAllocHost", 3020, e_cuMemAllocHost_v2),
    SYM("cuMemHostAlloc", 2020, e_cuMemHostAlloc),
    SYM("cuMemFreeHost", 2000, e_cuMemFreeHost),
    SYM("cuDeviceGetGraphMemAttribute", 11040, e_cuDeviceGetGraphMemAttribute),
    SYM("cuDeviceSetGraphMemAttribute", 11040, e_cuDeviceSetGraphMemAttribute),
    SYM("cuDeviceGraphMemTrim", 11040, e_cuDeviceGraphMemTrim),
    SYM("cuMemGetInfo", 2000, e_cuMemGetInfo_v1),
    SYM("cuMemGetInfo", 3020, e_cuMemGetInfo_v2),
    SYM("cuMemGetAddressRange", 2000, e_cuMemGetAddressRange_v1),
    SYM("cuMemGetAddressRange", 3020, e_cuMemGetAddressRange_v2),
    SYM("cuPointerGetAttribute", 4000, e_cuPointerGetAttribute),
    SYM("cuPointerGetAttributes", 7000, e_cuPointerGetAttributes),
    SYM("cuDeviceGetDefaultMemPool", 11020, e_cuDeviceGetDefaultMemPool),
    SYM("cuDeviceGetMemPool", 11020, e_cuDeviceGetMemPool),
    SYM("cuMemPoolSetAccess", 11020, e_cuMemPoolSetAccess),
    SYM("cuMemPoolGetAccess", 11020, e_cuMemPoolGetAccess),
    SYM("cuMemPoolGetAttribute", 11020, e_cuMemPoolGetAttribute),
    SYM("cuMemPoolSetAttribute", 11020, e_cuMemPoolSetAttribute),
    SYM("cuMemPoolTrimTo", 11020, e_cuMemPoolTrimTo),
    SYM("cuIpcGetMemHandle", 4010, e_cuIpcGetMemHandle),
    SYM("cuIpcOpenMemHandle", 4010, e_cuIpcOpenMemHandle_v1),
    SYM("cuIpcOpenMemHandle", 11000, e_cuIpcOpenMemHandle_v2),
    SYM("cuIpcCloseMemHandle", 4010, e_cuIpcCloseMemHandle),
    SYM("cuStreamCreate", 2000, e_cuStreamCreate),
    SYM("cuStreamCreateWithPriority", 5050, e_cuStreamCreateWithPriority),
    SYM("cuStreamDestroy", 2000, e_cuStreamDestroy_v1),
    SYM("cuStreamDestroy", 4000, e_cuStreamDestroy_v2),
    SYMP("cuStreamQuery", 2000, e_cuStreamQuery, e_cuStreamQuery_ptsz),
    SYMP("cuStreamSynchronize", 2000, e_cuStreamSynchronize, e_cuStreamSynchronize_ptsz),
    SYMP("cuStreamWaitEvent", 3020, e_cuStreamWaitEvent, e_cuStreamWaitEvent_ptsz),
    SYMP("cuStreamGetCtx", 9020, e_cuStreamGetCtx, e_cuStreamGetCtx_ptsz),
    SYM("cuEventCreate", 2000, e_cuEventCreate),
    SYMP("cuEventRecord", 2000, e_cuEventRecord, e_cuEventRecord_ptsz),
    SYM("cuEventQuery", 2000, e_cuEventQuery),
    SYM("cuEventSynchronize", 2000, e_cuEventSynchronize),
    SYM("cuEventDestroy", 2000, e_cuEventDestroy_v1),
    SYM("cuEventDestroy", 4000, e_cuEventDestroy_v2),
    SYMP("cuStreamBeginCapture", 10000, e_cuStreamBeginCapture_v1, e_cuStreamBeginCapture_v1_ptsz),
    SYMP("cuStreamBeginCapture", 10010, e_cuStreamBeginCapture_v2, e_cuStreamBeginCapture_v2_ptsz),
    SYMP("cuStreamEndCapture", 10000, e_cuStreamEndCapture, e_cuStreamEndCapture_ptsz),
    SYMP("cuStreamIsCapturing", 10000, e_cuStreamIsCapturing, e_cuStreamIsCapturing_ptsz),
    SYMP("cuStreamGetCaptureInfo", 11030, e_cuStreamGetCaptureInfo_v2, e_cuStreamGetCaptureInfo_v2_ptsz),
    SYMP("cuStreamGetCaptureInfo", 12030, e_cuStreamGetCaptureInfo_v3, e_cuStreamGetCaptureInfo_v3_ptsz),
    SYM("cuThreadExchangeStreamCaptureMode", 10010, e_cuThreadExchangeStreamCaptureMode),
    SYM("cuGraphDestroy", 10000, e_cuGraphDestroy),
    SYM("cuMemcpyDtoD", 3020, e_cuMemcpyDtoD_v2),
    SYM("cuMemcpyDtoHAsync", 3020, e_cuMemcpyDtoHAsync_v2),
    SYM("cuMemcpyHtoDAsync", 3020, e_cuMemcpyHtoDAsync_v2),
    SYMP("cuMemcpyDtoDAsync", 3020, e_cuMemcpyDtoDAsync_v2, e_cuMemcpyDtoDAsync_v2_ptsz),
    SYMP("cuMemsetD8", 3020, e_cuMemsetD8_v2, e_cuMemsetD8_v2_ptds),
    SYMP("cuMemsetD8Async", 3020, e_cuMemsetD8Async, e_cuMemsetD8Async_ptsz),
    SYM("cuMemsetD2D8", 3020, e_cuMemsetD2D8_v2),
    SYMP("cuMemsetD2D8Async", 3020, e_cuMemsetD2D8Async, e_cuMemsetD2D8Async_ptsz),
    SYMP("cuMemsetD16", 3020, e_cuMemsetD16_v2, e_cuMemsetD16_v2_ptds),
    SYMP("cuMemsetD16Async", 3020, e_cuMemsetD16Async, e_cuMemsetD16Async_ptsz),
    SYMP("cuMemsetD32", 3020, e_cuMemsetD32_v2, e_cuMemsetD32_v2_ptds),
    SYMP("cuMemsetD32Async", 3020, e_cuMemsetD32Async, e_cuMemsetD32Async_ptsz),
    SYMP("cuStreamWaitValue32", 8000, e_cuStreamWaitValue32_v1, e_cuStreamWaitValue32_v1_ptsz),
    SYMP("cuStreamWaitValue32", 11070, e_cuStreamWaitValue32_v2, e_cuStreamWaitValue32_v2_ptsz),
    SYMP("cuStreamWaitValue64", 9000, e_cuStreamWaitValue64_v1, e_cuStreamWaitValue64_v1_ptsz),
    SYMP("cuStreamWaitValue64", 11070, e_cuStreamWaitValue64_v2, e_cuStreamWaitValue64_v2_ptsz),
    SYMP("cuStreamWriteValue32", 8000, e_cuStreamWriteValue32_v1, e_cuStreamWriteValue32_v1_ptsz),
    SYMP("cuStreamWriteValue32", 11070, e_cuStreamWriteValue32_v2, e_cuStreamWriteValue32_v2_ptsz),
    SYMP("cuStreamWriteValue64", 9000, e_cuStreamWriteValue64_v1, e_cuStreamWriteValue64_v1_ptsz),
    SYMP("cuStreamWriteValue64", 11070, e_cuStreamWriteValue64_v2, e_cuStreamWriteValue64_v2_ptsz),
    SYMP("cuStreamBatchMemOp", 8000, e_cuStreamBatchMemOp_v1, e_cuStreamBatchMemOp_v1_ptsz),
    SYMP("cuStreamBatchMemOp", 11070, e_cuStreamBatchMemOp_v2, e_cuStreamBatchMemOp_v2_ptsz),
    SYMP("cuLaunchKernel", 4000, e_cuLaunchKernel, e_cuLaunchKernel_ptsz),
    SYM("cuGetErrorName", 6000, e_cuGetErrorName),
    SYM("cuGetErrorString", 6000, e_cuGetErrorString),
};
#define NSYMS (sizeof g_syms / sizeof g_syms[0])
static unsigned long long g_sym_hits[NSYMS];

static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status) {
  LOCKED();
  g_calls[FN_cuGetProcAddress]++;
  g_lookups++;
  CUresult fault = injected(FN_cuGetProcAddress);
  if (fault != CUDA_SUCCESS) return fault;
  if (!symbol || !pfn ||
      (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))) {
    violation("cuGetProcAddress: bad arguments (symbol %s, flags 0x%llx)", symbol ? symbol : "(null)",
              (unsigned long long)flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  int best = -1, named = 0;
  for (size_t i = 0; i < NSYMS; i++) {
    if (strcmp(g_syms[i].name, symbol) != 0) continue;
    named = 1;
    if (g_syms[i].ver <= version && (best < 0 || g_syms[i].ver > g_syms[best].ver)) best = (int)i;
  }
  if (best < 0) {
    *pfn = NULL;
    g_lookups_nf++;
    if (status) *status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  g_sym_hits[best]++;
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && g_syms[best].fn_ptsz)
    *pfn = g_syms[best].fn_ptsz;
  else
    *pfn = g_syms[best].fn;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

static CUresult e_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *status) {
  return get_proc(symbol, pfn, version, flags, status);
}
static CUresult e_cuGetProcAddress_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return get_proc(symbol, pfn, version, flags, NULL);
}

/* ------------------------------------------------------------------ exports */

EXPORT(cuInit, e_cuInit)
EXPORT(cuMemcpyDtoD_v2, e_cuMemcpyDtoD_v2)
EXPORT(cuMemHostAlloc, e_cuMemHostAlloc)
EXPORT(cuMemFreeHost, e_cuMemFreeHost)
EXPORT(cuMemcpyDtoHAsync_v2, e_cuMemcpyDtoHAsync_v2)
EXPORT(cuMemcpyHtoDAsync_v2, e_cuMemcpyHtoDAsync_v2)
EXPORT(cuMemcpyDtoDAsync_v2, e_cuMemcpyDtoDAsync_v2)
EXPORT(cuMemcpyDtoDAsync_v2_ptsz, e_cuMemcpyDtoDAsync_v2_ptsz)
EXPORT(cuMemsetD8_v2, e_cuMemsetD8_v2)
EXPORT(cuMemsetD8Async, e_cuMemsetD8Async)
EXPORT(cuMemsetD8Async_ptsz, e_cuMemsetD8Async_ptsz)
EXPORT(cuMemsetD2D8_v2, e_cuMemsetD2D8_v2)
EXPORT(cuMemsetD2D8Async, e_cuMemsetD2D8Async)
EXPORT(cuMemsetD2D8Async_ptsz, e_cuMemsetD2D8Async_ptsz)
EXPORT(cuMemsetD8_v2_ptds, e_cuMemsetD8_v2_ptds)
EXPORT(cuMemsetD16_v2, e_cuMemsetD16_v2)
EXPORT(cuMemsetD16_v2_ptds, e_cuMemsetD16_v2_ptds)
EXPORT(cuMemsetD16Async, e_cuMemsetD16Async)
EXPORT(cuMemsetD16Async_ptsz, e_cuMemsetD16Async_ptsz)
EXPORT(cuMemsetD32_v2, e_cuMemsetD32_v2)
EXPORT(cuMemsetD32_v2_ptds, e_cuMemsetD32_v2_ptds)
EXPORT(cuMemsetD32Async, e_cuMemsetD32Async)
EXPORT(cuMemsetD32Async_ptsz, e_cuMemsetD32Async_ptsz)
EXPORT(cuStreamWaitValue32, e_cuStreamWaitValue32_v1)
EXPORT(cuStreamWaitValue32_ptsz, e_cuStreamWaitValue32_v1_ptsz)
EXPORT(cuStreamWaitValue32_v2, e_cuStreamWaitValue32_v2)
EXPORT(cuStreamWaitValue32_v2_ptsz, e_cuStreamWaitValue32_v2_ptsz)
EXPORT(cuStreamWaitValue64, e_cuStreamWaitValue64_v1)
EXPORT(cuStreamWaitValue64_ptsz, e_cuStreamWaitValue64_v1_ptsz)
EXPORT(cuStreamWaitValue64_v2, e_cuStreamWaitValue64_v2)
EXPORT(cuStreamWaitValue64_v2_ptsz, e_cuStreamWaitValue64_v2_ptsz)
EXPORT(cuStreamWriteValue32, e_cuStreamWriteValue32_v1)
EXPORT(cuStreamWriteValue32_ptsz, e_cuStreamWriteValue32_v1_ptsz)
EXPORT(cuStreamWriteValue32_v2, e_cuStreamWriteValue32_v2)
EXPORT(cuStreamWriteValue32_v2_ptsz, e_cuStreamWriteValue32_v2_ptsz)
EXPORT(cuStreamWriteValue64, e_cuStreamWriteValue64_v1)
EXPORT(cuStreamWriteValue64_ptsz, e_cuStreamWriteValue64_v1_ptsz)
EXPORT(cuStreamWriteValue64_v2, e_cuStreamWriteValue64_v2)
EXPORT(cuStreamWriteValue64_v2_ptsz, e_cuStreamWriteValue64_v2_ptsz)
EXPORT(cuStreamBatchMemOp, e_cuStreamBatchMemOp_v1)
EXPORT(cuStreamBatchMemOp_ptsz, e_cuStreamBatchMemOp_v1_ptsz)
EXPORT(cuStreamBatchMemOp_v2, e_cuStreamBatchMemOp_v2)
EXPORT(cuStreamBatchMemOp_v2_ptsz, e_cuStreamBatchMemOp_v2_ptsz)
EXPORT(cuLaunchKernel, e_cuLaunchKernel)
EXPORT(cuLaunchKernel_ptsz, e_cuLaunchKernel_ptsz)
EXPORT(cuDriverGetVersion, e_cuDriverGetVersion)
EXPORT(cuGetProcAddress, e_cuGetProcAddress_v1)
EXPORT(cuGetProcAddress_v2, e_cuGetProcAddress_v2)
EXPORT(cuDeviceGet, e_cuDeviceGet)
EXPORT(cuDeviceGetCount, e_cuDeviceGetCount)
EXPORT(cuDeviceGetName, e_cuDeviceGetName)
EXPORT(cuDeviceGetAttribute, e_cuDeviceGetAttribute)
EXPORT(cuDeviceTotalMem, e_cuDeviceTotalMem_v1)
EXPORT(cuDeviceTotalMem_v2, e_cuDeviceTotalMem_v2)
EXPORT(cuDevicePrimaryCtxRetain, e_cuDevicePrimaryCtxRetain)
EXPORT(cuDeviceGetPCIBusId, e_cuDeviceGetPCIBusId)
EXPORT(cuDevicePrimaryCtxRelease, e_cuDevicePrimaryCtxRelease_v1)
EXPORT(cuDevicePrimaryCtxRelease_v2, e_cuDevicePrimaryCtxRelease_v2)
EXPORT(cuDevicePrimaryCtxReset, e_cuDevicePrimaryCtxReset_v1)
EXPORT(cuDevicePrimaryCtxReset_v2, e_cuDevicePrimaryCtxReset_v2)
EXPORT(cuDevicePrimaryCtxGetState, e_cuDevicePrimaryCtxGetState)
EXPORT(cuDevicePrimaryCtxSetFlags_v2, e_cuDevicePrimaryCtxSetFlags_v2)
EXPORT(cuCtxCreate, e_cuCtxCreate_v1)
EXPORT(cuCtxCreate_v2, e_cuCtxCreate_v2)
EXPORT(cuCtxCreate_v3, e_cuCtxCreate_v3)
EXPORT(cuCtxCreate_v4, e_cuCtxCreate_v4)
EXPORT(cuCtxDestroy, e_cuCtxDestroy_v1)
EXPORT(cuCtxDestroy_v2, e_cuCtxDestroy_v2)
EXPORT(cuCtxGetCurrent, e_cuCtxGetCurrent)
EXPORT(cuCtxSetCurrent, e_cuCtxSetCurrent)
EXPORT(cuCtxGetDevice, e_cuCtxGetDevice)
EXPORT(cuCtxSynchronize, e_cuCtxSynchronize)
EXPORT(cuCtxPushCurrent, e_cuCtxPushCurrent_v1)
EXPORT(cuCtxPushCurrent_v2, e_cuCtxPushCurrent_v2)
EXPORT(cuCtxPopCurrent, e_cuCtxPopCurrent_v1)
EXPORT(cuCtxPopCurrent_v2, e_cuCtxPopCurrent_v2)
EXPORT(cuDeviceCanAccessPeer, e_cuDeviceCanAccessPeer)
EXPORT(cuCtxEnablePeerAccess, e_cuCtxEnablePeerAccess)
EXPORT(cuCtxDisablePeerAccess, e_cuCtxDisablePeerAccess)
EXPORT(cuMemGetAllocationGranularity, e_cuMemGetAllocationGranularity)
EXPORT(cuMemAddressReserve, e_cuMemAddressReserve)
EXPORT(cuMemAddressFree, e_cuMemAddressFree)
EXPORT(cuMemCreate, e_cuMemCreate)
EXPORT(cuMemRelease, e_cuMemRelease)
EXPORT(cuMemMap, e_cuMemMap)
EXPORT(cuMemUnmap, e_cuMemUnmap)
EXPORT(cuMemSetAccess, e_cuMemSetAccess)
EXPORT(cuMemGetAccess, e_cuMemGetAccess)
EXPORT(cuMemRetainAllocationHandle, e_cuMemRetainAllocationHandle)
EXPORT(cuMemGetAllocationPropertiesFromHandle, e_cuMemGetAllocationPropertiesFromHandle)
EXPORT(cuMemExportToShareableHandle, e_cuMemExportToShareableHandle)
EXPORT(cuMemImportFromShareableHandle, e_cuMemImportFromShareableHandle)
EXPORT(cuMemAlloc, e_cuMemAlloc_v1)
EXPORT(cuMemAlloc_v2, e_cuMemAlloc_v2)
EXPORT(cuMemFree, e_cuMemFree_v1)
EXPORT(cuMemFree_v2, e_cuMemFree_v2)
EXPORT(cuMemAllocAsync, e_cuMemAllocAsync)
EXPORT(cuMemAllocAsync_ptsz, e_cuMemAllocAsync_ptsz)
EXPORT(cuMemFreeAsync, e_cuMemFreeAsync)
EXPORT(cuMemFreeAsync_ptsz, e_cuMemFreeAsync_ptsz)
EXPORT(cuMemGetInfo, e_cuMemGetInfo_v1)
EXPORT(cuMemGetInfo_v2, e_cuMemGetInfo_v2)
EXPORT(cuMemGetAddressRange, e_cuMemGetAddressRange_v1)
EXPORT(cuMemGetAddressRange_v2, e_cuMemGetAddressRange_v2)
EXPORT(cuPointerGetAttribute, e_cuPointerGetAttribute)
EXPORT(cuPointerGetAttributes, e_cuPointerGetAttributes)
EXPORT(cuDeviceGetDefaultMemPool, e_cuDeviceGetDefaultMemPool)
EXPORT(cuDeviceGetMemPool, e_cuDeviceGetMemPool)
EXPORT(cuMemPoolSetAccess, e_cuMemPoolSetAccess)
EXPORT(cuMemPoolGetAccess, e_cuMemPoolGetAccess)
EXPORT(cuMemPoolGetAttribute, e_cuMemPoolGetAttribute)
EXPORT(cuMemPoolSetAttribute, e_cuMemPoolSetAttribute)
EXPORT(cuMemPoolTrimTo, e_cuMemPoolTrimTo)
EXPORT(cuIpcGetMemHandle, e_cuIpcGetMemHandle)
EXPORT(cuIpcOpenMemHandle, e_cuIpcOpenMemHandle_v1)
EXPORT(cuIpcOpenMemHandle_v2, e_cuIpcOpenMemHandle_v2)
EXPORT(cuIpcCloseMemHandle, e_cuIpcCloseMemHandle)
EXPORT(cuStreamCreate, e_cuStreamCreate)
EXPORT(cuStreamCreateWithPriority, e_cuStreamCreateWithPriority)
EXPORT(cuStreamDestroy, e_cuStreamDestroy_v1)
EXPORT(cuStreamDestroy_v2, e_cuStreamDestroy_v2)
EXPORT(cuStreamQuery, e_cuStreamQuery)
EXPORT(cuStreamQuery_ptsz, e_cuStreamQuery_ptsz)
EXPORT(cuStreamSynchronize, e_cuStreamSynchronize)
EXPORT(cuStreamSynchronize_ptsz, e_cuStreamSynchronize_ptsz)
EXPORT(cuStreamWaitEvent, e_cuStreamWaitEvent)
EXPORT(cuStreamWaitEvent_ptsz, e_cuStreamWaitEvent_ptsz)
EXPORT(cuStreamGetCtx, e_cuStreamGetCtx)
EXPORT(cuStreamGetCtx_ptsz, e_cuStreamGetCtx_ptsz)
EXPORT(cuEventCreate, e_cuEventCreate)
EXPORT(cuEventRecord, e_cuEventRecord)
EXPORT(cuEventRecord_ptsz, e_cuEventRecord_ptsz)
EXPORT(cuEventQuery, e_cuEventQuery)
EXPORT(cuEventSynchronize, e_cuEventSynchronize)
EXPORT(cuEventDestroy, e_cuEventDestroy_v1)
EXPORT(cuEventDestroy_v2, e_cuEventDestroy_v2)
EXPORT(cuStreamBeginCapture, e_cuStreamBeginCapture_v1)
EXPORT(cuStreamBeginCapture_ptsz, e_cuStreamBeginCapture_v1_ptsz)
EXPORT(cuStreamBeginCapture_v2, e_cuStreamBeginCapture_v2)
EXPORT(cuStreamBeginCapture_v2_ptsz, e_cuStreamBeginCapture_v2_ptsz)
EXPORT(cuStreamEndCapture, e_cuStreamEndCapture)
EXPORT(cuStreamEndCapture_ptsz, e_cuStreamEndCapture_ptsz)
EXPORT(cuStreamIsCapturing, e_cuStreamIsCapturing)
EXPORT(cuStreamIsCapturing_ptsz, e_cuStreamIsCapturing_ptsz)
EXPORT(cuStreamGetCaptureInfo_v2, e_cuStreamGetCaptureInfo_v2)
EXPORT(cuStreamGetCaptureInfo_v2_ptsz, e_cuStreamGetCaptureInfo_v2_ptsz)
EXPORT(cuStreamGetCaptureInfo_v3, e_cuStreamGetCaptureInfo_v3)
EXPORT(cuStreamGetCaptureInfo_v3_ptsz, e_cuStreamGetCaptureInfo_v3_ptsz)
EXPORT(cuThreadExchangeStreamCaptureMode, e_cuThreadExchangeStreamCaptureMode)
EXPORT(cuGraphDestroy, e_cuGraphDestroy)
EXPORT(cuArrayCreate_v2, e_cuArrayCreate_v2)
EXPORT(cuArray3DCreate_v2, e_cuArray3DCreate_v2)
EXPORT(cuArrayDestroy, e_cuArrayDestroy)
EXPORT(cuMipmappedArrayCreate, e_cuMipmappedArrayCreate)
EXPORT(cuMipmappedArrayDestroy, e_cuMipmappedArrayDestroy)
EXPORT(cuModuleLoad, e_cuModuleLoad)
EXPORT(cuModuleLoadData, e_cuModuleLoadData)
EXPORT(cuModuleLoadDataEx, e_cuModuleLoadDataEx)
EXPORT(cuModuleLoadFatBinary, e_cuModuleLoadFatBinary)
EXPORT(cuModuleUnload, e_cuModuleUnload)
EXPORT(cuLibraryLoadData, e_cuLibraryLoadData)
EXPORT(cuLibraryLoadFromFile, e_cuLibraryLoadFromFile)
EXPORT(cuLibraryUnload, e_cuLibraryUnload)
EXPORT(cuMemcpyDtoH_v2, e_cuMemcpyDtoH_v2)
EXPORT(cuMemcpyHtoD_v2, e_cuMemcpyHtoD_v2)
EXPORT(cuMemAllocManaged, e_cuMemAllocManaged)
EXPORT(cuMemAllocHost_v2, e_cuMemAllocHost_v2)
EXPORT(cuDeviceGetGraphMemAttribute, e_cuDeviceGetGraphMemAttribute)
EXPORT(cuDeviceSetGraphMemAttribute, e_cuDeviceSetGraphMemAttribute)
EXPORT(cuDeviceGraphMemTrim, e_cuDeviceGraphMemTrim)
EXPORT(cuGetErrorName, e_cuGetErrorName)
EXPORT(cuGetErrorString, e_cuGetErrorString)

/* ------------------------------------------------------------------ test-control API */

/* Stream for the control API: no violation for bad handles, a message instead. */
static struct CUstream_st *ctl_stream(CUstream h, const char *fn) {
  struct CUstream_st *s = NULL;
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    struct CUctx_st *c = tl_ctx;
    if (!c || !c->alive) {
      fprintf(stderr, "emu: %s: default stream used with no current context\n", fn);
      return NULL;
    }
    return h == CU_STREAM_PER_THREAD ? pts_stream(c) : c->legacy;
  }
  s = (struct CUstream_st *)h;
  if (!valid_stream(s)) {
    fprintf(stderr, "emu: %s: invalid stream %p\n", fn, (void *)h);
    return NULL;
  }
  return s;
}

API void emu_launch(CUstream h, void (*fn)(void *), void *arg) {
  LOCKED();
  struct CUstream_st *s = ctl_stream(h, "emu_launch");
  if (!s) return;
  if (check_legacy_use(s, "emu_launch (a kernel launch)")) return;
  if (s->cap) {
    s->cap_items++;
    return;
  }
  item_t *it = enqueue(s, K_USER);
  if (!it) return;
  it->fn = fn;
  it->arg = arg;
}

API int emu_complete(CUstream h, int n) {
  LOCKED();
  struct CUstream_st *s = ctl_stream(h, "emu_complete");
  if (!s) return 0;
  int count = 0;
  while (s->head && !held_here(s)) {
    if (s->head->kind == K_USER) {
      if (n >= 0 && count == n) break;
      count++;
    }
    complete_head(s);
  }
  return count;
}

API int emu_pending(CUstream h) {
  LOCKED();
  struct CUstream_st *s = ctl_stream(h, "emu_pending");
  return s ? s->n_user : 0;
}

API int emu_captured(CUstream h) {
  LOCKED();
  struct CUstream_st *s = ctl_stream(h, "emu_captured");
  return s && s->cap ? s->cap_items : 0;
}

API void emu_complete_all(void) {
  LOCKED();
  int again = 1;
  while (again) {
    again = 0;
    for (struct CUstream_st *p = g_streams; p; p = p->next)
      if (p->head) {
        force(p, p->enq);
        again = 1;
      }
  }
}

API void emu_set_device_memory(int dev, size_t bytes) {
  LOCKED();
  if (dev < 0 || dev >= EMU_MAXDEV) {
    fprintf(stderr, "emu: emu_set_device_memory: bad device %d\n", dev);
    return;
  }
  g_dev[dev].total = bytes;
}

API void emu_set_device_count(int n) {
  LOCKED();
  if (n < 1 || n > EMU_MAXDEV) {
    fprintf(stderr, "emu: emu_set_device_count: %d out of 1..%d\n", n, EMU_MAXDEV);
    return;
  }
  g_devcount = n;
}

API void emu_set_peer_capable(int dev, int peer, int capable) {
  LOCKED();
  if (dev < 0 || dev >= EMU_MAXDEV || peer < 0 || peer >= EMU_MAXDEV) {
    fprintf(stderr, "emu: emu_set_peer_capable: bad devices %d, %d\n", dev, peer);
    return;
  }
  g_peer_off[dev][peer] = !capable;
}

API void emu_set_caps(int vmm, int posix_fd, int rdma) {
  LOCKED();
  g_cap_vmm = !!vmm;
  g_cap_fd = !!posix_fd;
  g_cap_rdma = !!rdma;
}

API void emu_set_context_memory(size_t context_bytes, size_t module_bytes) {
  LOCKED();
  g_ctx_bytes = context_bytes;
  g_mod_bytes = module_bytes;
}

API void emu_set_eager(int on) {
  LOCKED();
  g_eager = !!on;
}

API void emu_set_granularity(size_t bytes) {
  LOCKED();
  if (!is_pow2(bytes) || bytes < 4096) {
    fprintf(stderr, "emu: emu_set_granularity: %zu is not a power of two >= 4096\n", bytes);
    return;
  }
  g_gran = bytes;
}

static int fn_index(const char *name) {
  if (!name) return -1;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", name);
  size_t n = strlen(buf);
  if (n > 5 && strcmp(buf + n - 5, "_ptsz") == 0) buf[n -= 5] = 0;
  if (n > 3 && buf[n - 3] == '_' && buf[n - 2] == 'v' && buf[n - 1] >= '1' && buf[n - 1] <= '9') buf[n - 3] = 0;
  for (int i = 0; i < FN_COUNT; i++)
    if (strcmp(g_fn_names[i], buf) == 0) return i;
  return -1;
}

API void emu_hold_next(const char *function_name) {
  int i = fn_index(function_name);
  if (i < 0) {
    fprintf(stderr, "emu: emu_hold_next: unknown function %s\n", function_name ? function_name : "(null)");
    return;
  }
  pthread_mutex_lock(&g_hold_mu);
  g_hold_fn = i;
  pthread_mutex_unlock(&g_hold_mu);
}

API int emu_wait_held(unsigned timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&g_hold_mu);
  int r = 0;
  while (!g_holding && r == 0) r = pthread_cond_timedwait(&g_hold_cv, &g_hold_mu, &until);
  int held = g_holding;
  pthread_mutex_unlock(&g_hold_mu);
  return held;
}

API void emu_release_hold(void) {
  pthread_mutex_lock(&g_hold_mu);
  g_hold_fn = -1;
  g_holding = 0;
  pthread_cond_broadcast(&g_hold_cv);
  pthread_mutex_unlock(&g_hold_mu);
}

API void emu_fail_next(const char *function_name, CUresult err, int count) {
  emu_fail_after(function_name, 0, err, count);
}

API void emu_fail_after(const char *function_name, int skip, CUresult err, int count) {
  LOCKED();
  int i = fn_index(function_name);
  if (i < 0) {
    fprintf(stderr, "emu: emu_fail_next: unknown function %s\n", function_name ? function_name : "(null)");
    return;
  }
  g_fault[i].err = err;
  g_fault[i].skip = skip > 0 && count > 0 ? skip : 0;
  g_fault[i].count = count > 0 ? count : 0;
}

API void emu_clear_faults(void) {
  LOCKED();
  memset(g_fault, 0, sizeof g_fault);
}

API void emu_get_counters(emu_counters_t *out) {
  LOCKED();
  memset(out, 0, sizeof *out);
  out->lookups = g_lookups;
  out->lookups_not_found = g_lookups_nf;
#define EMU_GET(name) out->n_##name = g_calls[FN_##name];
  EMU_FUNCS(EMU_GET)
#undef EMU_GET
  for (handle_t *h = g_handles; h; h = h->next) {
    out->live_handles++;
    out->handle_bytes += h->size;
  }
  for (mapping_t *m = g_maps; m; m = m->next) {
    out->live_mappings++;
    out->mapped_bytes += m->size;
  }
  for (resv_t *r = g_resv; r; r = r->next) {
    out->live_reservations++;
    out->reserved_bytes += r->size;
  }
  for (plain_t *a = g_plain; a; a = a->next) {
    out->live_plain++;
    out->plain_bytes += a->size;
  }
  for (int d = 0; d < EMU_MAXDEV; d++) out->pool_idle_bytes += g_pools[d].idle;
  for (struct CUstream_st *s = g_streams; s; s = s->next)
    if (s->kind == S_USER) out->live_streams++;
  for (struct CUevent_st *e = g_events; e; e = e->next) out->live_events++;
  for (struct CUgraph_st *g = g_graphs; g; g = g->next) out->live_graphs++;
  out->physical_bytes = out->handle_bytes + out->plain_bytes + out->pool_idle_bytes;
  out->violations = __atomic_load_n(&g_violations, __ATOMIC_RELAXED);
}

API void emu_reset_counters(void) {
  LOCKED();
  memset(g_calls, 0, sizeof g_calls);
  memset(g_sym_hits, 0, sizeof g_sym_hits);
  g_lookups = g_lookups_nf = 0;
}

API int emu_faults_left(const char *function_name) {
  LOCKED();
  int i = fn_index(function_name);
  return i < 0 ? -1 : g_fault[i].count;
}

API long long emu_calls(const char *function_name) {
  LOCKED();
  int i = fn_index(function_name);
  return i < 0 ? -1 : (long long)g_calls[i];
}

API long long emu_lookup_count(const char *symbol) {
  LOCKED();
  long long n = 0;
  for (size_t i = 0; i < NSYMS; i++)
    if (symbol && strcmp(g_syms[i].name, symbol) == 0) n += (long long)g_sym_hits[i];
  return n;
}

API int emu_handle_info(CUdeviceptr addr, unsigned long long *requested_handle_types, int *rdma,
                        unsigned *access_flags) {
  LOCKED();
  mapping_t *m = map_holding(addr);
  if (!m) return -1;
  if (requested_handle_types) *requested_handle_types = m->h->req_types;
  if (rdma) *rdma = m->h->rdma;
  if (access_flags) *access_flags = (unsigned)m->access[m->h->dev];
  return 0;
}

API int emu_shared_handles(const CUdeviceptr *va, const size_t *len, int n) {
  LOCKED();
  typedef struct piece_s {
    handle_t *h;
    size_t lo, hi; /* bytes of the handle under the range */
    int range;
  } piece_t;
  size_t np = 0, cap = 64;
  piece_t *v = malloc(cap * sizeof *v);
  int found = 0;
  for (int i = 0; v && i < n; i++)
    for (mapping_t *m = g_maps; v && m; m = m->next) {
      CUdeviceptr lo = m->va > va[i] ? m->va : va[i];
      CUdeviceptr hi = m->va + m->size < va[i] + len[i] ? m->va + m->size : va[i] + len[i];
      if (lo >= hi) continue;
      if (np == cap) {
        piece_t *w = realloc(v, 2 * cap * sizeof *v);
        if (!w) break;
        v = w;
        cap *= 2;
      }
      v[np++] = (piece_t){m->h, m->offset + (size_t)(lo - m->va), m->offset + (size_t)(hi - m->va), i};
    }
  for (size_t a = 0; v && a < np; a++)
    for (size_t b = a + 1; b < np; b++)
      if (v[a].h == v[b].h && v[a].range != v[b].range && v[a].lo < v[b].hi && v[b].lo < v[a].hi) {
        violation("handle 0x%llx is mapped under two live ranges: 0x%llx and 0x%llx",
                  (unsigned long long)v[a].h->id, (unsigned long long)va[v[a].range],
                  (unsigned long long)va[v[b].range]);
        found++;
      }
  free(v);
  return found;
}

API int emu_violations(void) { return __atomic_load_n(&g_violations, __ATOMIC_RELAXED); }

static const char *access_name(unsigned long long f) {
  switch (f) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE: return "NONE";
    case CU_MEM_ACCESS_FLAGS_PROT_READ: return "READ";
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: return "READWRITE";
    default: return "?";
  }
}

/* Counts a refused device access: a violation and a device fault. Returns -1. */
static int device_fault(int dev, CUdeviceptr ptr, size_t n, int write, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int device_fault(int dev, CUdeviceptr ptr, size_t n, int write, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  g_device_faults++;
  violation("device %d %s 0x%llx (%zu bytes) without access: %s", dev, write ? "wrote" : "read",
            (unsigned long long)ptr, n, why);
  return -1;
}

API int emu_device_access(int dev, CUdeviceptr ptr, size_t n, int write) {
  LOCKED();
  if (dev < 0 || dev >= g_devcount) {
    fprintf(stderr, "emu: emu_device_access: bad device %d (%d devices)\n", dev, g_devcount);
    return -1;
  }
  if (n == 0) return 0;
  if (find_pinned((uintptr_t)ptr, n)) return 0; /* pinned host memory: every device reaches it */
  unsigned long long need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  if (ptr + n < ptr) return device_fault(dev, ptr, n, write, "the range wraps around");
  plain_t *a = find_plain_in(ptr);
  if (a) {
    if (n > a->base + a->size - ptr)
      return device_fault(dev, ptr, n, write, "the range runs past the end of the allocation 0x%llx (%zu bytes)",
                          (unsigned long long)a->base, a->size);
    if (dev == a->dev || a->origin == P_MANAGED) return 0; /* managed memory: every device */
    if (a->origin == P_ALLOC) {
      for (peer_t *p = g_peers; p; p = p->next)
        if (p->to == a->ctx && p->from->alive && p->from->dev == dev) return 0;
      return device_fault(dev, ptr, n, write,
                          "cuMemAlloc memory of device %d, and no context on device %d has peer access to its context",
                          a->dev, dev);
    }
    if (a->origin == P_POOL) {
      unsigned long long f = g_pools[a->dev].access[dev];
      if ((f & need) == need) return 0;
      return device_fault(dev, ptr, n, write, "memory of device %d's pool, which grants %s (cuMemPoolSetAccess)",
                          a->dev, access_name(f));
    }
    return device_fault(dev, ptr, n, write, "a graph allocation of device %d", a->dev);
  }
  if (!map_holding(ptr)) {
    if (resv_holding(ptr, 1)) return device_fault(dev, ptr, n, write, "0x%llx is reserved but not mapped",
                                                  (unsigned long long)ptr);
    return device_fault(dev, ptr, n, write, "the address is in no allocation");
  }
  CUdeviceptr cur = ptr, end = ptr + n;
  while (cur < end) {
    mapping_t *m = map_holding(cur);
    if (!m) return device_fault(dev, ptr, n, write, "0x%llx is not mapped", (unsigned long long)cur);
    if ((m->access[dev] & need) != need)
      return device_fault(dev, ptr, n, write, "mapping 0x%llx grants %s", (unsigned long long)m->va,
                          access_name(m->access[dev]));
    cur = m->va + m->size;
  }
  return 0;
}

/* A copy engine of dev running a K_COPY or K_SET item: both ranges must be reachable by dev
 * (as emu_device_access checks); then the bytes move. Host access to VMM memory is open once
 * any device has access, so memmove reaches it. */
static int device_copy(int dev, int kind, CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned char byte) {
  if (emu_device_access(dev, dst, n, 1) != 0) return -1;
  if (kind == K_COPY && emu_device_access(dev, src, n, 0) != 0) return -1;
  if (!n) return 0;
  if (kind == K_COPY) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  else memset((void *)(uintptr_t)dst, byte, n);
  return 0;
}

/* A K_SET of 2- or 4-byte elements: the same access rule, then n bytes of the pattern. */
static void device_fill(int dev, CUdeviceptr dst, size_t n, int width, uint64_t val) {
  if (emu_device_access(dev, dst, n, 1) != 0) return;
  for (size_t i = 0; i + (size_t)width <= n; i += (size_t)width) {
    if (width == 2) *(uint16_t *)(uintptr_t)(dst + i) = (uint16_t)val;
    else *(uint32_t *)(uintptr_t)(dst + i) = (uint32_t)val;
  }
}

API void emu_set_host_vmm(int on) {
  LOCKED();
  g_cap_host_vmm = on != 0;
}

API void emu_set_host_cpu_access(int on) {
  LOCKED();
  g_cap_host_cpu = on != 0;
}

API void emu_set_host_memory(size_t bytes) {
  LOCKED();
  g_host_total = bytes;
}

API size_t emu_host_used(void) {
  LOCKED();
  return g_host_used;
}

API void emu_delay_next(const char *function_name, unsigned usec, int count) {
  LOCKED();
  int i = fn_index(function_name);
  if (i < 0) {
    fprintf(stderr, "emu: emu_delay_next: unknown function %s\n", function_name ? function_name : "(null)");
    return;
  }
  g_delay[i].us = usec;
  g_delay[i].count = count > 0 ? count : 0;
}

API int emu_host_mapped(CUdeviceptr addr) {
  LOCKED();
  mapping_t *m = map_holding(addr);
  return m ? m->h->host : -1;
}

API long emu_device_faults(void) {
  LOCKED();
  return g_device_faults;
}

/* Other processes' memory (nvml_emu.c lists it under another pid) and the driver's own buffers:
 * both in the device's use, so cuMemGetInfo's free memory moves with them. */
static size_t g_others[EMU_MAXDEV];
API void emu_set_other_processes(int dev, size_t bytes) {
  LOCKED();
  if (dev < 0 || dev >= EMU_MAXDEV) return;
  g_dev[dev].used = g_dev[dev].used - g_others[dev] + bytes;
  g_others[dev] = bytes;
}
API size_t emu_other_processes(int dev) {
  LOCKED();
  return dev >= 0 && dev < EMU_MAXDEV ? g_others[dev] : 0;
}
API void emu_take_driver_memory(int dev, size_t bytes) {
  LOCKED();
  if (dev >= 0 && dev < EMU_MAXDEV) g_dev[dev].used += bytes;
}
API size_t emu_device_total(int dev) {
  LOCKED();
  return dev >= 0 && dev < EMU_MAXDEV ? g_dev[dev].total : 0;
}

API size_t emu_device_used(int dev) {
  LOCKED();
  return dev >= 0 && dev < EMU_MAXDEV ? g_dev[dev].used : 0;
}
