/* Host emulation of the CUDA driver (libcuda.so.1) for the CPU tests of vmmshim.
 * See emu.h for the model and the test-control API.
 *
 * Every entry point is a static function e_<symbol>; the exported symbols are aliases of
 * them, and the cuGetProcAddress table holds the static addresses. Internal calls never
 * go through an exported symbol, so a preloaded library that overrides the exported
 * names (the shim) is never re-entered by the emulation. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ------------------------------------------------------------------ state */

static pthread_mutex_t g_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static void lock_mu(void) { pthread_mutex_lock(&g_mu); }
static void unlock_cb(int *unused) { (void)unused; pthread_mutex_unlock(&g_mu); }
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
static struct { CUresult err; int count; } g_fault[FN_COUNT];
static int g_violations;

static int g_inited;
static int g_devcount = 1;
static size_t g_gran = 2ull << 20;
static int g_cap_vmm = 1, g_cap_fd = 1, g_cap_rdma = 1;

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

struct CUctx_st {
  uint32_t magic;
  int dev;
  int is_primary;
  int alive;
  struct CUstream_st *legacy;
  struct CUctx_st *next;
};
static struct CUctx_st *g_ctxs;

enum { K_USER = 0, K_MARK, K_FREE, K_WAIT };
typedef struct item_s {
  struct item_s *next;
  int kind;
  void (*fn)(void *);
  void *arg;
  uint64_t gseq;
  CUdeviceptr ptr;             /* K_FREE */
  struct CUstream_st *wstream; /* K_WAIT */
  uint64_t wtarget;
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

typedef struct plain_s {
  CUdeviceptr base;
  size_t size, maplen;
  int dev;
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

static CUresult enter(int fn) {
  LOCKED();
  g_calls[fn]++;
  if (g_fault[fn].count > 0) {
    g_fault[fn].count--;
    return g_fault[fn].err;
  }
  return CUDA_SUCCESS;
}
#define ENTER(name)                                 \
  do {                                              \
    CUresult fault_ = enter(FN_##name);             \
    if (fault_ != CUDA_SUCCESS) return fault_;      \
  } while (0)
#define NEED_INIT()                                      \
  do {                                                   \
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;    \
  } while (0)

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

static CUresult plain_alloc(struct CUctx_st *ctx, size_t size, uint64_t cap_id, CUdeviceptr *out) {
  device_t *d = &g_dev[ctx->dev];
  if (d->used > d->total || size > d->total - d->used) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t len = round_up(size, (size_t)sysconf(_SC_PAGESIZE));
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  plain_t *a = calloc(1, sizeof *a);
  if (!a) {
    munmap(m, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->base = (CUdeviceptr)(uintptr_t)m;
  a->size = size;
  a->maplen = len;
  a->dev = ctx->dev;
  a->ctx = ctx;
  a->cap_id = cap_id;
  a->next = g_plain;
  g_plain = a;
  d->used += size;
  *out = a->base;
  return CUDA_SUCCESS;
}

static void plain_free(plain_t *a) {
  for (plain_t **pp = &g_plain; *pp; pp = &(*pp)->next)
    if (*pp == a) {
      *pp = a->next;
      break;
    }
  munmap((void *)(uintptr_t)a->base, a->maplen);
  g_dev[a->dev].used -= a->size;
  free(a);
}

/* ------------------------------------------------------------------ work items */

static void complete_head(struct CUstream_st *s);

static void force(struct CUstream_st *s, uint64_t target) {
  while (s && s->head && s->done < target) complete_head(s);
}
static void force_gseq(struct CUstream_st *s, uint64_t g) {
  while (s && s->head && s->head->gseq < g) complete_head(s);
}

static void complete_head(struct CUstream_st *s) {
  item_t *it = s->head;
  if (!it) return;
  if (it->kind == K_WAIT && it->wstream) force(it->wstream, it->wtarget);
  if (s->kind == S_LEGACY) {
    for (struct CUstream_st *p = g_streams; p; p = p->next)
      if (p != s && p->ctx == s->ctx && is_blocking(p)) force_gseq(p, it->gseq);
  } else if (is_blocking(s)) {
    force_gseq(s->ctx->legacy, it->gseq);
  }
  if (s->head != it) return; /* completed while forcing its dependencies (cannot happen) */
  s->head = it->next;
  if (!s->head) s->tail = NULL;
  s->done++;
  if (it->kind == K_USER) {
    s->n_user--;
    if (it->fn) it->fn(it->arg);
  } else if (it->kind == K_FREE) {
    plain_t *a = find_plain_base(it->ptr);
    if (a) plain_free(a);
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

/* Destroy everything of a context (cuCtxDestroy, cuDevicePrimaryCtxReset). */
static void teardown_ctx(struct CUctx_st *ctx) {
  drain_ctx(ctx);
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
}

static CUresult ctx_activate(struct CUctx_st *c) {
  c->alive = 1;
  c->legacy = new_stream(c, S_LEGACY, 0, 0);
  return c->legacy ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
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
  if (!ptr || size == 0 || size % g_gran || flags != 0 || (alignment && !is_pow2(alignment)) ||
      (alignment && alignment < g_gran && alignment % 4096)) {
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
  g_dev[h->dev].used -= h->size;
  free(h);
}

static CUresult new_handle(int fd, size_t size, const CUmemAllocationProp *prop, CUmemGenericAllocationHandle *out) {
  handle_t *h = calloc(1, sizeof *h);
  if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
  h->id = g_handle_next++;
  h->fd = fd;
  h->size = size;
  h->dev = prop->location.id;
  h->req_types = (unsigned long long)prop->requestedHandleTypes;
  h->rdma = prop->allocFlags.gpuDirectRDMACapable;
  h->prop = *prop;
  h->refs = 1;
  h->next = g_handles;
  g_handles = h;
  g_dev[h->dev].used += size;
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
  device_t *d = &g_dev[prop->location.id];
  if (d->used > d->total || size > d->total - d->used) return CUDA_ERROR_OUT_OF_MEMORY;
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

static int host_prot(const mapping_t *m) {
  unsigned long long f = 0;
  for (int i = 0; i < EMU_MAXDEV; i++)
    if (m->access[i] > f) f = m->access[i];
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
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(desc[i].location.id) ||
        (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
         desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
      violation("cuMemSetAccess: descriptor %zu has location type %d id %d flags %d", i,
                (int)desc[i].location.type, desc[i].location.id, (int)desc[i].flags);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  /* the whole range must be mapped */
  CUdeviceptr cur = ptr, end = ptr + size;
  while (cur < end) {
    mapping_t *m = map_holding(cur);
    if (!m) {
      violation("cuMemSetAccess(0x%llx, %zu): 0x%llx is not mapped", (unsigned long long)ptr, size,
                (unsigned long long)cur);
      return CUDA_ERROR_INVALID_VALUE;
    }
    cur = m->va + m->size;
  }
  cur = ptr;
  while (cur < end) {
    mapping_t *m = map_holding(cur);
    for (size_t i = 0; i < count; i++) m->access[desc[i].location.id] = desc[i].flags;
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
  if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(location->id)) {
    violation("cuMemGetAccess: bad arguments");
    return CUDA_ERROR_INVALID_VALUE;
  }
  mapping_t *m = map_holding(ptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  *flags = m->access[location->id];
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
