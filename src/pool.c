/* pool.c: one pool per CUDA context, built on the VMM layer (vmm.c).
 *
 * A pool owns virtual reservations and the physical handles mapped into them. Its
 * address space is one list of blocks in address order, each FREE (in a size bin),
 * USED (in the uthash map from address to block), PENDING (freed, but work submitted
 * before the free may still touch it), HOLE (reserved, unmapped) or BUSY (being mapped
 * or unmapped by a thread that dropped the lock for the driver call). Blocks may span
 * handle boundaries: handles are mapped back to back, so the memory is contiguous.
 *
 * Why this shape (see ../shared/notes/gpu-facts.md): a pool that maps and unmaps in its
 * steady state loses to cudaMalloc (cuMemSetAccess alone costs ~28 us a handle), so freed
 * memory stays mapped and is reused without any driver call; growth maps large handles
 * (VMMSHIM_GRANULARITY) because the cost of a handle hardly depends on its size.
 *
 * When a freed block may be reused:
 *   - sync free, default mode: the context was synchronised before the block was taken
 *     back, as cudaFree does; the block is FREE at once.
 *   - sync free, deferred mode: PENDING on the deferred list until a synchronisation
 *     that started after the free completes (background reclaimer thread).
 *   - async free on stream S: PENDING on S's list, reusable at once by allocations on
 *     S (stream order protects it), and by everyone once an event recorded on S after
 *     the free has completed (queried, never waited for) or a later context sync ended.
 * Locking: one mutex per pool, never held across a driver call. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/internal.h"

#include <string.h>
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = vs_hash_key((keyptr), (keylen)))
#define uthash_fatal(msg) vs_uthash_fatal(msg)
static void vs_uthash_fatal(const char *msg);
#include <uthash.h>

/* Keys are 8-byte addresses (multiples of 256) or stream handles: a multiply-shift mix
 * spreads them over the buckets far cheaper than uthash's byte-wise default. */
static inline unsigned vs_hash_key(const void *key, size_t len) {
  uint64_t x = 0;
  memcpy(&x, key, len < sizeof x ? len : sizeof x);
  x = (x >> 8) ^ x;
  x *= 0x9E3779B97F4A7C15ull;
  return (unsigned)(x >> 32);
}

static void vs_uthash_fatal(const char *msg) {
  _vs_error("address map: %s (out of host memory)", msg);
  abort();
}

#define VS_MIN_ALIGN 256u            /* what cudaMalloc guarantees */
#define VS_LARGE_SIZE (4ull << 20)   /* blocks this big start on a 2 MiB boundary */
#define VS_LARGE_ALIGN (2ull << 20)
#define VS_SUB_BITS 2                /* 4 bins per power of two */
#define VS_NBINS (64 << VS_SUB_BITS)
#define VS_BIN_SCAN 8                /* blocks examined in the request's own bin */
#define VS_STREAM_SCAN 16            /* blocks examined on a stream's pending list */
#define VS_MAX_RESV 32
#define VS_SEAL_COUNT 64             /* a stream's pending list is sealed beyond this */

typedef enum vs_block_state_e { B_FREE = 0, B_USED, B_PENDING, B_HOLE, B_BUSY } vs_block_state_t;

typedef struct vs_stream_s vs_stream_t;

typedef struct vs_block_s {
  CUdeviceptr addr;
  size_t size;
  struct vs_block_s *prev, *next;   /* address order */
  struct vs_block_s *fprev, *fnext; /* bin, hole list or pending list */
  size_t requested;                 /* USED: what the program asked for */
  uint64_t freed_seq;               /* PENDING: pool->sync_seq at the free */
  uint64_t idle_since;              /* FREE: pool->allocs when it became free */
  vs_stream_t *stream;              /* PENDING on a stream's list */
  uint16_t resv;                    /* reservation index: blocks never merge across */
  uint8_t state;
  uint8_t bin;
  UT_hash_handle hh; /* USED blocks, by addr */
} vs_block_t;

typedef struct vs_list_s {
  vs_block_t *head, *tail;
  size_t bytes;
  unsigned count;
} vs_list_t;

/* Blocks freed on one stream, and batches sealed by an event recorded on it. */
struct vs_stream_s {
  CUstream key;          /* normalised stream handle (per-thread streams get a private key) */
  CUstream handle;       /* what to record events on */
  const void *owner;     /* per-thread default stream: only its thread may record on it */
  vs_list_t pending;
  UT_hash_handle hh;
};

typedef struct vs_batch_s {
  CUevent event;
  vs_list_t blocks;
  uint64_t max_seq;
  struct vs_batch_s *next;
} vs_batch_t;

typedef struct vs_seg_s {
  CUdeviceptr va;
  size_t size;
  CUmemGenericAllocationHandle handle;
} vs_seg_t;

/* Requests live in three heaps by size (own reservations, bins and holes):
 *   small (< 1 MiB) and large (up to the granularity) share handles of the granularity;
 *   whole (the granularity and more): each block is exactly its own handle(s), never split
 *   for a smaller request and never merged with a free neighbour. A freed whole block is
 *   reused by a request of its size (up to 1/16 smaller); otherwise its handle is given
 *   back when memory is needed. So the physical memory of big blocks follows what is live,
 *   where a shared handle stays mapped as long as any block in it lives, and growth still
 *   costs one handle per request, as cudaMalloc does.
 * Small blocks scattered between large ones would pin partly used handles everywhere. */
#define VS_SMALL_MAX (1ull << 20)
enum { VS_HEAP_SMALL = 0, VS_HEAP_LARGE = 1, VS_HEAP_WHOLE = 2, VS_NHEAPS = 3 };
#define VS_WHOLE_SLACK 16 /* a whole block serves requests down to 1/16 smaller than it */
/* Shared heaps grow by 1/VS_GROW_FRACTION of what they map, from 2 MiB up to the granularity. */
#define VS_GROW_FRACTION 8
/* Before growing, idle handles are given back (as many bytes as the growth maps), except:
 *   - up to mapped/VS_IDLE_BUDGET idle bytes stay, plus one handle of the granularity:
 *     a pool in its steady state that grows now and then would otherwise give back the
 *     handle it maps again a moment later;
 *   - whole blocks freed within the last VS_WHOLE_AGE allocations stay: a program that
 *     cycles through a few large sizes finds them again;
 *   - whole blocks whose last request was made, to the byte, at least twice among the last
 *     VS_WHOLE_RECENT whole-heap requests stay: a training loop asks for the same tensor
 *     sizes every step (it would otherwise give back and re-create them each step), a random
 *     mix of sizes hardly ever repeats one exactly; but only while idle memory stays
 *     under mapped/VS_RECUR_BUDGET;
 * Out of memory, VMMSHIM_LIMIT and vmmshim_trim give back everything idle. */
#define VS_IDLE_BUDGET 32
#define VS_WHOLE_AGE 8
#define VS_WHOLE_RECENT 32
#define VS_RECUR_BUDGET 8
typedef struct vs_heap_s {
  vs_block_t *bins[VS_NBINS];
  uint64_t binmap[VS_NBINS / 64];
  vs_list_t holes;
  size_t free_bytes;
  size_t mapped;
} vs_heap_t;

struct vs_pool_s {
  pthread_mutex_t lock;
  CUcontext ctx;
  vs_device_caps_t caps;
  size_t gran;  /* handle size the pool grows by */
  size_t chunk; /* largest handle: bigger growths are stitched from several */
  vs_block_t *map;
  /* Always in the map (address 0, size 0): uthash frees its table when the last entry
   * goes, which would cost a malloc and a free per allocation of a pool with one block. */
  vs_block_t map_anchor;
  vs_stream_t *last_stream; /* the stream of the last lookup: most programs use one or two */
  vs_heap_t heaps[VS_NHEAPS];
  uint8_t resv_heap[VS_MAX_RESV];
  size_t heap_resv_size[VS_NHEAPS]; /* size of each heap's first reservation */
  vs_list_t deferred; /* sync frees in deferred mode */
  vs_stream_t *streams;
  vs_batch_t *batches;
  CUevent spare_events[16];
  int n_spare_events;
  struct { CUdeviceptr va; size_t size; } resv[VS_MAX_RESV];
  int n_resv;
  vs_seg_t *segs; /* sorted by va */
  size_t n_segs, cap_segs;
  size_t mapped, used, free_bytes, pending_bytes;
  size_t trim_retry_at; /* idle bytes at which the release threshold is tried again */
  uint64_t sync_seq; /* synchronisations started */
  uint64_t allocs;   /* allocations served: the clock idle whole blocks age by */
  size_t whole_recent[VS_WHOLE_RECENT]; /* sizes of the last whole-heap requests (ring) */
  unsigned whole_next;
  const void *last_allocator; /* thread tag of the last allocation */
  vs_block_t *spare_blocks;
  /* Threads recording events on streams they copied out of the lock: a stream must not be
   * destroyed under them (its destroy hook waits for sealers == 0). */
  int sealers;
  pthread_cond_t sealed;
  /* deferred-mode reclaimer */
  pthread_t reclaimer;
  pthread_cond_t wake;
  bool reclaimer_running, stopping;
};

/* Bytes mapped by every pool together, for VMMSHIM_LIMIT. */
static atomic_size_t vs_mapped_total;

/* ------------------------------------------------------------------ descriptors */

static vs_block_t *block_new(vs_pool_t *p) {
  vs_block_t *b = p->spare_blocks;
  if (vs_likely(b)) {
    p->spare_blocks = b->fnext;
  } else {
    b = malloc(sizeof *b);
    if (!b) return NULL;
  }
  memset(b, 0, sizeof *b);
  return b;
}

static void block_put(vs_pool_t *p, vs_block_t *b) {
  b->fnext = p->spare_blocks;
  p->spare_blocks = b;
}

/* ------------------------------------------------------------------ lists and bins */

static void list_push(vs_list_t *l, vs_block_t *b) {
  b->fnext = NULL;
  b->fprev = l->tail;
  if (l->tail) l->tail->fnext = b; else l->head = b;
  l->tail = b;
  l->bytes += b->size;
  l->count++;
}

static void list_remove(vs_list_t *l, vs_block_t *b) {
  if (b->fprev) b->fprev->fnext = b->fnext; else l->head = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev; else l->tail = b->fprev;
  b->fprev = b->fnext = NULL;
  l->bytes -= b->size;
  l->count--;
}

/* Bin of a size: 4 bins per power of two (floor). */
static unsigned bin_of(size_t size) {
  unsigned lg = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
  if (lg < VS_SUB_BITS) return lg << VS_SUB_BITS;
  unsigned sub = (unsigned)(size >> (lg - VS_SUB_BITS)) & ((1u << VS_SUB_BITS) - 1);
  return (lg << VS_SUB_BITS) | sub;
}

static vs_heap_t *heap_of(vs_pool_t *p, const vs_block_t *b) { return &p->heaps[p->resv_heap[b->resv]]; }

static void bin_insert(vs_pool_t *p, vs_block_t *b) {
  vs_heap_t *h = heap_of(p, b);
  unsigned i = bin_of(b->size);
  b->state = B_FREE;
  b->bin = (uint8_t)i;
  b->fprev = NULL;
  b->fnext = h->bins[i];
  if (b->fnext) b->fnext->fprev = b;
  h->bins[i] = b;
  h->binmap[i / 64] |= 1ull << (i % 64);
  h->free_bytes += b->size;
  p->free_bytes += b->size;
}

static void bin_remove(vs_pool_t *p, vs_block_t *b) {
  vs_heap_t *h = heap_of(p, b);
  unsigned i = b->bin;
  if (b->fprev) b->fprev->fnext = b->fnext; else h->bins[i] = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  if (!h->bins[i]) h->binmap[i / 64] &= ~(1ull << (i % 64));
  b->fprev = b->fnext = NULL;
  h->free_bytes -= b->size;
  p->free_bytes -= b->size;
}

static size_t align_pad(CUdeviceptr addr, size_t align) {
  return (size_t)((align - (addr & (align - 1))) & (align - 1));
}

static bool fits(const vs_block_t *b, size_t size, size_t align) {
  size_t pad = align_pad(b->addr, align);
  return b->size >= pad && b->size - pad >= size;
}

/* A free block that holds size bytes at the alignment. Bins from the request's own up to
 * that of size plus the worst alignment pad may hold blocks that fit or not: the first
 * few of each are examined (the smallest fitting one wins in the request's own bin). Any
 * block in a higher bin fits. */
static vs_block_t *whole_find(vs_heap_t *p, size_t size) {
  size_t most = size + size / (VS_WHOLE_SLACK - 1);
  vs_block_t *best = NULL;
  for (unsigned i = bin_of(size), last = bin_of(most); i <= last; i++) {
    if (!(p->binmap[i / 64] & (1ull << (i % 64)))) continue;
    int n = 0;
    for (vs_block_t *b = p->bins[i]; b && n < VS_BIN_SCAN; b = b->fnext, n++)
      if (b->size >= size && b->size <= most && (!best || b->size < best->size)) best = b;
  }
  return best;
}

static vs_block_t *bin_find(vs_heap_t *p, size_t size, size_t align) {
  size_t want = size + (align > VS_MIN_ALIGN ? align - VS_MIN_ALIGN : 0);
  unsigned first = bin_of(size), last = bin_of(want);
  for (unsigned i = first; i <= last; i++) {
    if (!(p->binmap[i / 64] & (1ull << (i % 64)))) continue;
    vs_block_t *best = NULL;
    int n = 0;
    for (vs_block_t *b = p->bins[i]; b && n < VS_BIN_SCAN; b = b->fnext, n++)
      if (fits(b, size, align) && (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)))
        best = b;
    if (best) return best;
  }
  unsigned start = last + 1;
  for (unsigned w = start / 64; w < VS_NBINS / 64; w++) {
    uint64_t bits = p->binmap[w];
    if (w == start / 64) bits &= ~0ull << (start % 64);
    if (bits) {
      /* Lowest address among the first few: memory packs low, high handles empty out. */
      vs_block_t *best = NULL;
      int n = 0;
      for (vs_block_t *b = p->bins[w * 64 + (unsigned)__builtin_ctzll(bits)]; b && n < VS_BIN_SCAN; b = b->fnext, n++)
        if (!best || b->addr < best->addr) best = b;
      return best;
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------ address-order list */

static void link_after(vs_block_t *a, vs_block_t *b) {
  b->prev = a;
  b->next = a->next;
  if (a->next) a->next->prev = b;
  a->next = b;
}

static void unlink_block(vs_block_t *b) {
  if (b->prev) b->prev->next = b->next;
  if (b->next) b->next->prev = b->prev;
}

/* Splits b at offset off: b keeps [addr, addr+off), the new block gets the rest (same state). */
static vs_block_t *split(vs_pool_t *p, vs_block_t *b, size_t off) {
  vs_block_t *r = block_new(p);
  if (!r) return NULL;
  r->addr = b->addr + off;
  r->size = b->size - off;
  r->resv = b->resv;
  r->state = b->state;
  b->size = off;
  link_after(b, r);
  return r;
}

static bool mergeable(const vs_pool_t *p, const vs_block_t *a, const vs_block_t *b, vs_block_state_t st) {
  return a && b && a->state == st && b->state == st && a->resv == b->resv && a->addr + a->size == b->addr &&
         (st != B_FREE || p->resv_heap[a->resv] != VS_HEAP_WHOLE);
}

/* Puts a block (no longer USED or PENDING) into the bins, merged with free neighbours. */
static void make_free(vs_pool_t *p, vs_block_t *b) {
  b->state = B_FREE;
  b->idle_since = p->allocs;
  if (mergeable(p, b->prev, b, B_FREE)) {
    vs_block_t *a = b->prev;
    bin_remove(p, a);
    a->size += b->size;
    unlink_block(b);
    block_put(p, b);
    b = a;
  }
  if (mergeable(p, b, b->next, B_FREE)) {
    vs_block_t *c = b->next;
    bin_remove(p, c);
    b->size += c->size;
    unlink_block(c);
    block_put(p, c);
  }
  bin_insert(p, b);
}

static void make_hole(vs_pool_t *p, vs_block_t *b) {
  vs_list_t *holes = &heap_of(p, b)->holes;
  b->state = B_HOLE;
  if (mergeable(p, b->prev, b, B_HOLE)) {
    vs_block_t *a = b->prev;
    list_remove(holes, a);
    a->size += b->size;
    unlink_block(b);
    block_put(p, b);
    b = a;
  }
  if (mergeable(p, b, b->next, B_HOLE)) {
    vs_block_t *c = b->next;
    list_remove(holes, c);
    b->size += c->size;
    unlink_block(c);
    block_put(p, c);
  }
  list_push(holes, b);
}

/* ------------------------------------------------------------------ segments */

static size_t seg_lower_bound(const vs_pool_t *p, CUdeviceptr va) {
  size_t lo = 0, hi = p->n_segs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->segs[mid].va < va) lo = mid + 1; else hi = mid;
  }
  return lo;
}

static int seg_add(vs_pool_t *p, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
  if (p->n_segs == p->cap_segs) {
    size_t cap = p->cap_segs ? p->cap_segs * 2 : 64;
    vs_seg_t *n = realloc(p->segs, cap * sizeof *n);
    if (!n) return -1;
    p->segs = n;
    p->cap_segs = cap;
  }
  size_t i = seg_lower_bound(p, va);
  memmove(&p->segs[i + 1], &p->segs[i], (p->n_segs - i) * sizeof *p->segs);
  p->segs[i] = (vs_seg_t){va, size, h};
  p->n_segs++;
  return 0;
}

static void seg_remove_at(vs_pool_t *p, size_t i) {
  memmove(&p->segs[i], &p->segs[i + 1], (p->n_segs - i - 1) * sizeof *p->segs);
  p->n_segs--;
}

/* ------------------------------------------------------------------ pool lifetime */

static void *reclaimer_main(void *arg);
static vs_stream_t *stream_get(vs_pool_t *p, CUstream key, CUstream handle, const void *owner, bool create);
static CUstream stream_key(CUstream s, const void **owner);
static void reclaim_by_events(vs_pool_t *p, const void *self);
static size_t trim_some(vs_pool_t *p, size_t keep, uint64_t young_after, bool keep_recurring);

static int add_reservation(vs_pool_t *p, int heap, size_t size) {
  if (p->n_resv == VS_MAX_RESV) return -1;
  CUdeviceptr va;
  if (_vs_vmm_reserve(&p->caps, size, p->gran, &va) != CUDA_SUCCESS) return -1;
  vs_block_t *b = block_new(p);
  if (!b || _vs_dir_add(va, size, p) != 0) {
    if (b) block_put(p, b);
    _vs_vmm_address_free(&p->caps, va, size);
    return -1;
  }
  p->resv[p->n_resv].va = va;
  p->resv[p->n_resv].size = size;
  b->addr = va;
  b->size = size;
  b->resv = (uint16_t)p->n_resv;
  p->resv_heap[p->n_resv] = (uint8_t)heap;
  if (!p->heap_resv_size[heap]) p->heap_resv_size[heap] = size;
  p->n_resv++;
  /* Each reservation has its own address-order chain: blocks never link or merge across. */
  b->state = B_HOLE;
  list_push(&p->heaps[heap].holes, b);
  return 0;
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

vs_pool_t *_vs_pool_create(CUcontext ctx, const vs_device_caps_t *caps) {
  vs_pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->sealed, NULL);
  p->ctx = ctx;
  p->caps = *caps;
  p->map_anchor.state = B_USED;
  HASH_ADD(hh, p->map, addr, sizeof p->map_anchor.addr, &p->map_anchor);
  size_t g = (size_t)_vs_option(VS_OPT_GRANULARITY);
  if (g % caps->min_granularity) {
    size_t fixed = round_up(g, caps->min_granularity);
    _vs_warn("VMMSHIM_GRANULARITY=%zu is not a multiple of device %d's minimum granularity %zu; using %zu", g,
             (int)caps->device, caps->min_granularity, fixed);
    g = fixed;
  }
  p->gran = g;
  size_t mh = (size_t)_vs_option(VS_OPT_MAX_HANDLE);
  p->chunk = mh ? round_up(mh, caps->min_granularity) : SIZE_MAX / 2;
  size_t resv = (size_t)_vs_option(VS_OPT_RESERVE);
  if (!resv) {
    /* Address space is nearly free to reserve (3-20 us for 64 TiB): room for 4x the device. */
    resv = caps->total_mem * 4;
    if (resv < (64ull << 30)) resv = 64ull << 30;
  }
  resv = round_up(resv, g);
  size_t dev_size = round_up(caps->total_mem ? caps->total_mem : resv, g);
  if (add_reservation(p, VS_HEAP_WHOLE, resv) != 0 || add_reservation(p, VS_HEAP_LARGE, dev_size) != 0 ||
      add_reservation(p, VS_HEAP_SMALL, dev_size) != 0) {
    _vs_dir_remove_pool(p);
    for (int i = 0; i < p->n_resv; i++) _vs_vmm_address_free(&p->caps, p->resv[i].va, p->resv[i].size);
    _vs_warn("device %d: cannot reserve %zu bytes of address space; this context is passed through",
             (int)caps->device, resv);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return NULL;
  }
  VS_STAT_ADD(pools, 1);
  _vs_info("pool for context %p on device %d: reserved %zu GiB, handles of %zu MiB, free mode %s", (void *)ctx,
           (int)caps->device, resv >> 30, g >> 20,
           _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED ? "deferred" : "sync");
  return p;
}

CUcontext _vs_pool_context(const vs_pool_t *p) { return p->ctx; }
int _vs_pool_device(const vs_pool_t *p) { return (int)p->caps.device; }

/* ------------------------------------------------------------------ reclaiming pending blocks */

/* Moves blocks of a FIFO whose free came before sync number `done` into the bins. */
static void release_before(vs_pool_t *p, vs_list_t *l, uint64_t done) {
  while (l->head && l->head->freed_seq < done) {
    vs_block_t *b = l->head;
    list_remove(l, b);
    p->pending_bytes -= b->size;
    b->stream = NULL;
    make_free(p, b);
  }
}

static void release_batch(vs_pool_t *p, vs_batch_t *bt) {
  while (bt->blocks.head) {
    vs_block_t *b = bt->blocks.head;
    list_remove(&bt->blocks, b);
    p->pending_bytes -= b->size;
    b->stream = NULL;
    make_free(p, b);
  }
}

/* After a synchronisation numbered `done` completed: everything freed before it is free. */
static void after_sync_locked(vs_pool_t *p, uint64_t done, vs_batch_t **done_batches) {
  release_before(p, &p->deferred, done);
  for (vs_stream_t *s = p->streams; s; s = s->hh.next) release_before(p, &s->pending, done);
  vs_batch_t **pp = &p->batches;
  while (*pp) {
    vs_batch_t *bt = *pp;
    if (bt->max_seq < done) {
      release_batch(p, bt);
      *pp = bt->next;
      bt->next = *done_batches;
      *done_batches = bt;
    } else {
      pp = &bt->next;
    }
  }
}

static void recycle_batches(vs_pool_t *p, vs_batch_t *list) {
  while (list) {
    vs_batch_t *n = list->next;
    if (list->event) {
      pthread_mutex_lock(&p->lock);
      bool kept = p->n_spare_events < 16;
      if (kept) p->spare_events[p->n_spare_events++] = list->event;
      pthread_mutex_unlock(&p->lock);
      if (!kept) _vs_cu.cuEventDestroy(list->event);
    }
    free(list);
    list = n;
  }
}

/* Synchronises the pool's context (which must be current) and frees what was pending.
 * Called without the lock. Returns the driver's answer. */
static CUresult sync_and_reclaim(vs_pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t seq = ++p->sync_seq;
  pthread_mutex_unlock(&p->lock);
  CUresult r = _vs_cu.cuCtxSynchronize();
  VS_STAT_ADD(syncs, 1);
  if (r != CUDA_SUCCESS) return r;
  vs_batch_t *done = NULL;
  pthread_mutex_lock(&p->lock);
  after_sync_locked(p, seq, &done);
  pthread_mutex_unlock(&p->lock);
  recycle_batches(p, done);
  return CUDA_SUCCESS;
}

/* Seals streams' pending lists with events and frees batches whose events completed.
 * Never waits. Called without the lock. */
static void reclaim_by_events(vs_pool_t *p, const void *self) {
  enum { MAX_SEAL = 32 };
  vs_batch_t *sealed[MAX_SEAL];
  CUstream on[MAX_SEAL];
  int n = 0;
  vs_batch_t *check = NULL;
  pthread_mutex_lock(&p->lock);
  for (vs_stream_t *s = p->streams; s && n < MAX_SEAL; s = s->hh.next) {
    if (!s->pending.head || (s->owner && s->owner != self)) continue;
    vs_batch_t *bt = calloc(1, sizeof *bt);
    if (!bt) break;
    bt->blocks = s->pending;
    /* Not necessarily the tail's: pieces carved off a reused block go back at the end. */
    for (vs_block_t *b = s->pending.head; b; b = b->fnext)
      if (b->freed_seq > bt->max_seq) bt->max_seq = b->freed_seq;
    s->pending = (vs_list_t){0};
    for (vs_block_t *b = bt->blocks.head; b; b = b->fnext) b->stream = NULL;
    if (p->n_spare_events) bt->event = p->spare_events[--p->n_spare_events];
    on[n] = s->handle;
    sealed[n++] = bt;
  }
  check = p->batches;
  p->batches = NULL;
  if (n) p->sealers++;
  pthread_mutex_unlock(&p->lock);

  /* Query the batches sealed earlier first: new ones cannot have completed yet. */
  vs_batch_t *done = NULL, *still = NULL;
  while (check) {
    vs_batch_t *bt = check;
    check = bt->next;
    CUresult q = bt->event ? _vs_cu.cuEventQuery(bt->event) : CUDA_ERROR_NOT_READY;
    if (q == CUDA_SUCCESS) { bt->next = done; done = bt; }
    else { bt->next = still; still = bt; }
  }
  for (int i = 0; i < n; i++) {
    vs_batch_t *bt = sealed[i];
    CUresult r = CUDA_SUCCESS;
    if (!bt->event) r = _vs_cu.cuEventCreate(&bt->event, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) r = _vs_cu.cuEventRecord(bt->event, on[i]);
    if (r != CUDA_SUCCESS) {
      /* No event (stream gone, capture...): the batch waits for a context sync. */
      if (bt->event) { _vs_cu.cuEventDestroy(bt->event); bt->event = NULL; }
    }
    /* An idle stream passes its event at once: one query now saves a growth. */
    if (bt->event && _vs_cu.cuEventQuery(bt->event) == CUDA_SUCCESS) {
      bt->next = done;
      done = bt;
      continue;
    }
    bt->next = still;
    still = bt;
  }
  pthread_mutex_lock(&p->lock);
  if (n && --p->sealers == 0) pthread_cond_broadcast(&p->sealed);
  for (vs_batch_t *bt = done; bt; bt = bt->next) release_batch(p, bt);
  while (still) {
    vs_batch_t *bt = still;
    still = bt->next;
    bt->next = p->batches;
    p->batches = bt;
  }
  pthread_mutex_unlock(&p->lock);
  recycle_batches(p, done);
}

/* ------------------------------------------------------------------ growth and trimming */

static bool over_limit(size_t add) {
  uint64_t limit = _vs_option(VS_OPT_LIMIT);
  return limit && atomic_load_explicit(&vs_mapped_total, memory_order_relaxed) + add > limit;
}

/* Maps [va, va+len) with handles of at most `chunk` bytes each, back to back. Bounded
 * handles keep a large block that is later partly reused from pinning all of its memory:
 * the handles it no longer touches can be released. Lock not held; segments recorded
 * by the caller through segs_out (at most max). */
static CUresult map_range(vs_pool_t *p, CUdeviceptr va, size_t len, size_t chunk, vs_seg_t *segs_out, int max,
                          int *n_out) {
  CUresult r = CUDA_SUCCESS;
  int n = 0;
  size_t off = 0;
  while (off < len) {
    size_t piece = len - off;
    if (piece > chunk && n < max - 1) piece = chunk;
    CUmemGenericAllocationHandle h = 0;
    r = _vs_vmm_create(&p->caps, piece, &h);
    if (r != CUDA_SUCCESS) break;
    r = _vs_vmm_map(&p->caps, va + off, piece, h);
    if (r != CUDA_SUCCESS) {
      _vs_vmm_release(&p->caps, h, piece);
      break;
    }
    segs_out[n++] = (vs_seg_t){va + off, piece, h};
    off += piece;
  }
  if (r == CUDA_SUCCESS) r = _vs_vmm_set_access(&p->caps, va, len); /* one call: cost follows handles */
  if (r != CUDA_SUCCESS) {
    for (int i = n; i-- > 0;) {
      _vs_vmm_unmap(&p->caps, segs_out[i].va, segs_out[i].size);
      _vs_vmm_release(&p->caps, segs_out[i].handle, segs_out[i].size);
    }
    n = 0;
  }
  *n_out = n;
  return r;
}

/* Picks where to map `len` more bytes for a request of `size`: right after a free block
 * ending at a hole (so the two join), else the lowest hole that is large enough.
 * Returns the BUSY block carved from the hole, or NULL. Called with the lock held. */
static vs_block_t *claim_hole(vs_pool_t *p, vs_heap_t *heap, size_t size, size_t align, size_t min_handle,
                              size_t *len_out) {
  vs_block_t *pick = NULL;
  size_t pick_len = 0, pick_tail = 0;
  for (vs_block_t *h = heap->holes.head; h; h = h->fnext) {
    /* The block will start at the free tail before the hole if there is one, else at the
     * hole's start (a multiple of the minimum granularity, so aligned). */
    size_t tail = 0, pad = 0;
    vs_block_t *t = h->prev;
    if (t && mergeable(p, t, &(vs_block_t){.addr = h->addr, .resv = h->resv, .state = B_FREE}, B_FREE)) {
      tail = t->size;
      pad = align_pad(t->addr, align);
    }
    size_t need = size + pad;
    size_t len = need > tail ? round_up(need - tail, p->caps.min_granularity) : p->caps.min_granularity;
    if (len < min_handle && min_handle <= h->size) len = min_handle;
    if (len > h->size) continue;
    if (!pick || (tail && !pick_tail) || (!!tail == !!pick_tail && h->addr < pick->addr)) {
      pick = h;
      pick_len = len;
      pick_tail = tail;
    }
  }
  if (!pick) return NULL;
  list_remove(&heap->holes, pick);
  if (pick_len < pick->size) {
    vs_block_t *rest = split(p, pick, pick_len);
    if (!rest) {
      list_push(&heap->holes, pick);
      return NULL;
    }
    rest->state = B_HOLE;
    list_push(&heap->holes, rest);
  }
  pick->state = B_BUSY;
  *len_out = pick_len;
  return pick;
}

/* Grows the pool so that a request of size/align fits. Called without the lock.
 * Idle handles that could not serve the request are released first, as many bytes as the
 * growth maps: physical memory follows what is live, not the history of the address space. */
static CUresult grow(vs_pool_t *p, int hi, size_t size, size_t align, bool exact) {
  vs_heap_t *heap = &p->heaps[hi];
  /* Whole-heap requests get handles of their own size, so that freeing them leaves whole
   * handles. The others share handles of the granularity, or of 1/VS_GROW_FRACTION of what
   * their heap maps while that is smaller: a small program then maps little more than it
   * uses, and a growing one reaches the granularity after a few handles. */
  pthread_mutex_lock(&p->lock);
  size_t step = round_up(heap->mapped / VS_GROW_FRACTION, p->caps.min_granularity);
  size_t idle = p->free_bytes, budget = p->mapped / VS_IDLE_BUDGET + p->gran;
  uint64_t old = p->allocs > VS_WHOLE_AGE ? p->allocs - VS_WHOLE_AGE : 0;
  pthread_mutex_unlock(&p->lock);
  size_t handle = p->gran;
  if (exact || hi == VS_HEAP_WHOLE) handle = p->caps.min_granularity;
  else if (step < handle) handle = step > p->caps.min_granularity ? step : p->caps.min_granularity;
  size_t want = round_up(size, handle);
  size_t keep = idle > want ? idle - want : 0;
  if (keep < budget) keep = budget;
  if (idle > keep && idle >= p->caps.min_granularity) {
    trim_some(p, keep, old, true);
    /* Recurring sizes are kept only up to mapped/VS_RECUR_BUDGET idle: a program whose sizes
     * vary over a wide set (a variable sequence length) must not hold them all. */
    pthread_mutex_lock(&p->lock);
    size_t cap = p->mapped / VS_RECUR_BUDGET;
    idle = p->free_bytes;
    pthread_mutex_unlock(&p->lock);
    if (keep < cap) keep = cap;
    if (idle > keep) trim_some(p, keep, old, false);
  }
  pthread_mutex_lock(&p->lock);
  size_t len = 0;
  vs_block_t *b = claim_hole(p, heap, size, align, handle, &len);
  if (!b) {
    pthread_mutex_unlock(&p->lock);
    size_t more = round_up(size + align, p->gran) * 2; /* a new reservation starts aligned */
    size_t dflt = p->heap_resv_size[hi];
    if (more < dflt) more = dflt;
    pthread_mutex_lock(&p->lock);
    int rr = add_reservation(p, hi, more);
    if (rr == 0) b = claim_hole(p, heap, size, align, handle, &len);
    if (!b) {
      pthread_mutex_unlock(&p->lock);
      _vs_warn("device %d: no address space for %zu bytes", (int)p->caps.device, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_mutex_unlock(&p->lock);

  enum { MAX_PIECES = 256 };
  vs_seg_t pieces[MAX_PIECES];
  int np = 0;
  size_t chunk = p->chunk;
  if (len / chunk >= MAX_PIECES) chunk = round_up(len / (MAX_PIECES - 1), p->caps.min_granularity);
  CUresult r;
  if (over_limit(len)) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    atomic_fetch_add(&vs_mapped_total, len);
    r = map_range(p, b->addr, len, chunk, pieces, MAX_PIECES, &np);
    if (r != CUDA_SUCCESS) atomic_fetch_sub(&vs_mapped_total, len);
  }

  pthread_mutex_lock(&p->lock);
  int added = 0;
  while (r == CUDA_SUCCESS && added < np && seg_add(p, pieces[added].va, pieces[added].size, pieces[added].handle) == 0)
    added++;
  if (r == CUDA_SUCCESS && added < np) {
    /* No host memory for the segment table: undo the whole growth. */
    for (int i = 0; i < added; i++) seg_remove_at(p, seg_lower_bound(p, pieces[i].va));
    pthread_mutex_unlock(&p->lock);
    for (int i = np; i-- > 0;) {
      _vs_vmm_unmap(&p->caps, pieces[i].va, pieces[i].size);
      _vs_vmm_release(&p->caps, pieces[i].handle, pieces[i].size);
    }
    atomic_fetch_sub(&vs_mapped_total, len);
    pthread_mutex_lock(&p->lock);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    p->mapped += len;
    heap->mapped += len;
    make_free(p, b);
  } else {
    make_hole(p, b);
  }
  pthread_mutex_unlock(&p->lock);
  if (r == CUDA_SUCCESS) {
    uint64_t m = VS_STAT_ADD(bytes_mapped, len) + len;
    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);
  }
  return r;
}

/* Carves every whole handle lying inside free block b out of it (BUSY pieces appended to
 * out[], their segments to segs[]), until `want` bytes are collected or out[] is full.
 * Leftover free pieces go back to the bins without merging: b was maximal, so its pieces
 * have no free neighbours. Returns the bytes collected. Lock held. */
static size_t carve_idle_handles(vs_pool_t *p, vs_block_t *b, size_t want, vs_block_t **out, vs_seg_t *segs,
                                 int *n, int max) {
  size_t got = 0;
  size_t i = seg_lower_bound(p, b->addr);
  if (i == p->n_segs || p->segs[i].va + p->segs[i].size > b->addr + b->size) return 0;
  bin_remove(p, b);
  vs_block_t *rest = b; /* the part of b not yet looked at */
  while (i < p->n_segs && *n < max && got < want) {
    vs_seg_t sg = p->segs[i];
    if (sg.va + sg.size > rest->addr + rest->size) break;
    vs_block_t *mid = rest;
    if (sg.va > rest->addr) {
      mid = split(p, rest, (size_t)(sg.va - rest->addr));
      if (!mid) break;
      bin_insert(p, rest);
    }
    rest = NULL;
    if (mid->size > sg.size) {
      rest = split(p, mid, sg.size);
      if (!rest) { bin_insert(p, mid); mid = NULL; break; }
    }
    mid->state = B_BUSY;
    seg_remove_at(p, i); /* the next segment now sits at index i */
    p->mapped -= sg.size;
    heap_of(p, mid)->mapped -= sg.size;
    segs[*n] = sg;
    out[(*n)++] = mid;
    got += sg.size;
    if (!rest) break;
  }
  if (rest) bin_insert(p, rest);
  return got;
}

/* Unmaps and releases whole handles that lie inside free blocks until at most `keep` idle
 * bytes remain, leaving whole-heap blocks that became idle after allocation number
 * `young_after` and, with keep_recurring, those of recurring sizes. Called without the lock. */
/* True when the last request idle whole block b served was made, to the byte, at least twice
 * among the recent whole-heap requests. */
static bool whole_recurring(const vs_pool_t *p, const vs_block_t *b) {
  int n = 0;
  for (unsigned i = 0; i < VS_WHOLE_RECENT && n < 2; i++) n += p->whole_recent[i] == b->requested;
  return n >= 2;
}

static size_t trim_some(vs_pool_t *p, size_t keep, uint64_t young_after, bool keep_recurring) {
  enum { MAX_BATCH = 64, MAX_CAND = 64 };
  size_t released = 0;
  for (;;) {
    vs_seg_t victims[MAX_BATCH];
    vs_block_t *busy[MAX_BATCH];
    vs_block_t *cand[MAX_CAND];
    int n = 0, nc = 0;
    pthread_mutex_lock(&p->lock);
    /* Candidates: free blocks at least one minimum handle large, biggest bins first. */
    unsigned lo = bin_of(p->caps.min_granularity);
    for (int hi = 0; hi < VS_NHEAPS; hi++)
      for (unsigned k = VS_NBINS; k-- > lo && nc < MAX_CAND;)
        for (vs_block_t *c = p->heaps[hi].bins[k]; c && nc < MAX_CAND; c = c->fnext)
          if (hi != VS_HEAP_WHOLE || young_after == UINT64_MAX ||
              (c->idle_since <= young_after && !(keep_recurring && whole_recurring(p, c))))
            cand[nc++] = c;
    for (int c = 0; c < nc && n < MAX_BATCH && p->free_bytes > keep; c++)
      carve_idle_handles(p, cand[c], p->free_bytes - keep, busy, victims, &n, MAX_BATCH);
    pthread_mutex_unlock(&p->lock);
    if (!n) break;
    for (int i = 0; i < n; i++) {
      _vs_vmm_unmap(&p->caps, victims[i].va, victims[i].size);
      _vs_vmm_release(&p->caps, victims[i].handle, victims[i].size);
      atomic_fetch_sub(&vs_mapped_total, victims[i].size);
      VS_STAT_SUB(bytes_mapped, victims[i].size);
      VS_STAT_ADD(trims, 1);
      released += victims[i].size;
    }
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < n; i++) make_hole(p, busy[i]);
    pthread_mutex_unlock(&p->lock);
  }
  return released;
}

size_t _vs_pool_trim(vs_pool_t *p, size_t keep) { return trim_some(p, keep, UINT64_MAX, false); }

size_t _vs_mapped_total(void) { return atomic_load_explicit(&vs_mapped_total, memory_order_relaxed); }

void _vs_pool_stream_destroyed(vs_pool_t *p, CUstream stream) {
  const void *owner = NULL;
  CUstream key = stream_key(stream, &owner);
  pthread_mutex_lock(&p->lock);
  vs_stream_t *s = stream_get(p, key, stream, owner, false);
  bool has = s && s->pending.head;
  pthread_mutex_unlock(&p->lock);
  /* Seal its blocks with an event while the stream still exists; a later stream may get
   * the same handle, and must not inherit them. */
  if (has) reclaim_by_events(p, owner);
  pthread_mutex_lock(&p->lock);
  s = stream_get(p, key, stream, owner, false);
  if (s) {
    while (s->pending.head) { /* sealing failed: wait for a context sync instead */
      vs_block_t *b = s->pending.head;
      list_remove(&s->pending, b);
      b->stream = NULL;
      list_push(&p->deferred, b);
    }
    HASH_DEL(p->streams, s);
    if (p->last_stream == s) p->last_stream = NULL;
    free(s);
  }
  /* Another thread may have copied this stream's handle to record an event on it. */
  while (p->sealers) pthread_cond_wait(&p->sealed, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

/* Waits for the pool's pending frees (synchronising its context, which must be current)
 * so that they become idle; skipped while a capture is active. */
CUresult _vs_pool_reclaim(vs_pool_t *p) {
  if (atomic_load(&_vs_captures_active)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  pthread_mutex_lock(&p->lock);
  bool pending = p->pending_bytes != 0;
  pthread_mutex_unlock(&p->lock);
  return pending ? sync_and_reclaim(p) : CUDA_SUCCESS;
}

size_t _vs_pool_idle_bytes(vs_pool_t *p) {
  pthread_mutex_lock(&p->lock);
  size_t n = p->free_bytes;
  pthread_mutex_unlock(&p->lock);
  return n;
}

/* ------------------------------------------------------------------ allocation */

static vs_stream_t *stream_get(vs_pool_t *p, CUstream key, CUstream handle, const void *owner, bool create) {
  vs_stream_t *s = p->last_stream;
  if (vs_likely(s && s->key == key)) return s;
  HASH_FIND(hh, p->streams, &key, sizeof key, s);
  if (s) p->last_stream = s;
  if (s || !create) return s;
  s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->key = key;
  s->handle = handle;
  s->owner = owner;
  HASH_ADD(hh, p->streams, key, sizeof s->key, s);
  p->last_stream = s;
  return s;
}

/* Per-thread default streams share one handle value across threads: key them by thread. */
static _Thread_local char vs_thread_tag;
static CUstream stream_key(CUstream s, const void **owner) {
  *owner = NULL;
  if (s == CU_STREAM_LEGACY) return NULL;
  if (s == CU_STREAM_PER_THREAD) {
    *owner = &vs_thread_tag;
    return (CUstream)((uintptr_t)&vs_thread_tag | 1);
  }
  return s;
}

static vs_block_t *take_from_stream(vs_pool_t *p, vs_stream_t *s, int hi, size_t size, size_t align) {
  int n = 0;
  vs_block_t *best = NULL;
  for (vs_block_t *b = s->pending.tail; b && n < VS_STREAM_SCAN; b = b->fprev, n++) {
    if (p->resv_heap[b->resv] != hi || !fits(b, size, align)) continue;
    if (hi == VS_HEAP_WHOLE && b->size > size + size / (VS_WHOLE_SLACK - 1)) continue;
    if (!best || b->size < best->size) best = b;
    if (b->size - align_pad(b->addr, align) - size < VS_MIN_ALIGN) break;
  }
  if (!best) return NULL;
  list_remove(&s->pending, best);
  p->pending_bytes -= best->size;
  best->stream = NULL;
  return best;
}

/* A piece of a carved block that is not handed out. From the bins it goes back to the bins.
 * From stream s's pending list it goes back to that list (same free sequence number): the
 * work queued on s before the free may still touch all of the block, and in the bins another
 * stream, or a trim that unmaps idle handles, could take it before that work is done. */
static void give_back_piece(vs_pool_t *p, vs_block_t *piece, vs_stream_t *s, uint64_t freed_seq) {
  if (!s) {
    make_free(p, piece);
    return;
  }
  piece->state = B_PENDING;
  piece->freed_seq = freed_seq;
  piece->stream = s;
  list_push(&s->pending, piece);
  p->pending_bytes += piece->size;
}

/* Carves [pad, pad+size) out of b (already taken off the bins, or off stream s's pending
 * list when s is not NULL) and returns it USED. The pieces are BUSY while split, so giving
 * the leftovers back never merges them into the block being handed out. */
static vs_block_t *carve(vs_pool_t *p, vs_block_t *b, size_t size, size_t align, vs_stream_t *s) {
  uint64_t seq = b->freed_seq;
  if (p->resv_heap[b->resv] == VS_HEAP_WHOLE) { /* starts on a handle; served whole */
    b->state = B_USED;
    return b;
  }
  b->state = B_BUSY;
  size_t pad = align_pad(b->addr, align);
  if (pad) {
    vs_block_t *r = split(p, b, pad);
    give_back_piece(p, b, s, seq);
    if (!r) return NULL;
    b = r;
  }
  if (b->size - size >= VS_MIN_ALIGN) {
    vs_block_t *r = split(p, b, size);
    if (r) give_back_piece(p, r, s, seq);
  }
  b->state = B_USED;
  return b;
}

static size_t request_align(size_t size) { return size >= VS_LARGE_SIZE ? VS_LARGE_ALIGN : VS_MIN_ALIGN; }

vs_pool_status_t _vs_pool_alloc(vs_pool_t *p, size_t req, CUstream stream, vmmshim_api_t api, CUdeviceptr *ptr_out,
                                size_t *served_out, CUresult *cu_err, bool *contended) {
  (void)api;
  *cu_err = CUDA_SUCCESS;
  if (req > (SIZE_MAX >> 2)) {
    *cu_err = CUDA_ERROR_OUT_OF_MEMORY;
    return VS_POOL_OOM;
  }
  size_t size = round_up(req, VS_MIN_ALIGN);
  size_t align = request_align(size);
  int hi = size < VS_SMALL_MAX ? VS_HEAP_SMALL : size < p->gran ? VS_HEAP_LARGE : VS_HEAP_WHOLE;
  if (hi == VS_HEAP_WHOLE) size = round_up(size, p->caps.min_granularity);
  bool noted = hi != VS_HEAP_WHOLE;
  const void *owner = NULL;
  CUstream key = stream == VS_NO_STREAM ? NULL : stream_key(stream, &owner);
  int attempt = 0;
  bool synced = false;
  for (;;) {
    bool waited = false;
    if (vs_unlikely(pthread_mutex_trylock(&p->lock) != 0)) {
      waited = true;
      pthread_mutex_lock(&p->lock);
    }
    /* Contention counts only against another allocating thread (the caller may then move
     * to another arena); the reclaimer and cross-thread frees take the lock too. */
    if (!noted) {
      p->whole_recent[p->whole_next++ % VS_WHOLE_RECENT] = req;
      noted = true;
    }
    if (vs_unlikely(p->last_allocator != &vs_thread_tag)) {
      *contended |= waited && p->last_allocator != NULL;
      p->last_allocator = &vs_thread_tag;
    }
    vs_block_t *b = NULL;
    if (stream != VS_NO_STREAM) {
      vs_stream_t *s = stream_get(p, key, stream, owner, false);
      if (s && s->pending.head) {
        b = take_from_stream(p, s, hi, size, align);
        if (b) b = carve(p, b, size, align, s);
      }
    }
    if (!b) {
      b = hi == VS_HEAP_WHOLE ? whole_find(&p->heaps[hi], size) : bin_find(&p->heaps[hi], size, align);
      if (b) bin_remove(p, b);
      if (b) b = carve(p, b, size, align, NULL);
    }
    if (vs_likely(b != NULL)) {
      b->requested = req;
      HASH_ADD(hh, p->map, addr, sizeof b->addr, b);
      p->used += b->size;
      p->allocs++;
      pthread_mutex_unlock(&p->lock);
      *ptr_out = b->addr;
      *served_out = b->size;
      return VS_POOL_OK;
    }
    size_t pending = p->pending_bytes, deferred = p->deferred.bytes, mapped = p->mapped;
    pthread_mutex_unlock(&p->lock);

    /* Slow path: reclaim what can be had without waiting, then grow, then wait, then trim. */
    CUresult r;
    switch (attempt++) {
    case 0:
      if (pending) {
        reclaim_by_events(p, &vs_thread_tag);
        continue;
      }
      attempt++;
      /* fall through */
    case 1:
      /* A whole-heap request while deferred frees hold half the pool or more, enough for
       * it: waiting for them (the reclaimer's synchronisation, made now: ~1 us on an idle
       * GPU) is far cheaper than mapping a large handle, and keeps a program that frees big
       * blocks faster than the reclaimer catches up from growing without bound. */
      if (!synced && hi == VS_HEAP_WHOLE && deferred >= size && deferred * 2 >= mapped &&
          !atomic_load(&_vs_captures_active)) {
        synced = true;
        if (sync_and_reclaim(p) == CUDA_SUCCESS) { attempt = 1; continue; }
      }
      r = grow(p, hi, size, align, false);
      if (r == CUDA_SUCCESS) { attempt = 1; continue; }
      if (r != CUDA_ERROR_OUT_OF_MEMORY) { *cu_err = r; return VS_POOL_ERROR; }
      continue;
    case 2:
      /* Out of memory: wait for pending frees, and give back idle handles so the retry
       * (with a handle of exactly the size needed) can use their memory. */
      if (pending && sync_and_reclaim(p) == CUDA_SUCCESS) continue;
      attempt++;
      /* fall through */
    case 3:
      _vs_pool_trim(p, 0);
      r = grow(p, hi, size, align, true);
      if (r == CUDA_SUCCESS) continue;
      if (r != CUDA_ERROR_OUT_OF_MEMORY) { *cu_err = r; return VS_POOL_ERROR; }
      *cu_err = CUDA_ERROR_OUT_OF_MEMORY;
      return over_limit(round_up(size, p->caps.min_granularity)) ? VS_POOL_LIMIT : VS_POOL_OOM;
    default:
      *cu_err = CUDA_ERROR_OUT_OF_MEMORY;
      return VS_POOL_OOM;
    }
  }
}

/* ------------------------------------------------------------------ free */

static void start_reclaimer_locked(vs_pool_t *p) {
  if (p->reclaimer_running || p->stopping) return;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the program's signals stay with its own threads */
  if (pthread_create(&p->reclaimer, &at, reclaimer_main, p) == 0) p->reclaimer_running = true;
  else _vs_warn("cannot start the reclaimer thread (%s); deferred frees wait for the next synchronisation",
                strerror(errno));
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&at);
}

vs_pool_status_t _vs_pool_free(vs_pool_t *p, CUdeviceptr ptr, CUstream stream, vmmshim_api_t api, size_t *size_out,
                               size_t *requested_out, CUresult *err_out) {
  *err_out = CUDA_SUCCESS;
  if (!ptr) return VS_POOL_NOT_OWNED; /* address 0 is the map's anchor */
  const void *owner = NULL;
  CUstream key = stream == VS_NO_STREAM ? NULL : stream_key(stream, &owner);
  bool sync_mode = stream == VS_NO_STREAM && _vs_option(VS_OPT_FREE_MODE) == VS_FREE_SYNC;
  if (sync_mode) {
    /* cudaFree waits for the device; so do we, before the block can be reused. Done
     * before the lookup so the lock is never held across it. */
    pthread_mutex_lock(&p->lock);
    vs_block_t *b;
    HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
    pthread_mutex_unlock(&p->lock);
    if (!b) return VS_POOL_NOT_OWNED;
    /* A sync while another thread captures a graph would invalidate its capture. */
    CUresult r = atomic_load(&_vs_captures_active) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : sync_and_reclaim(p);
    if (r != CUDA_SUCCESS) {
      /* Not waited for: the block is reused only after a later synchronisation succeeds. */
      _vs_debug("free 0x%llx: cuCtxSynchronize: %s; block reused after a later synchronisation",
                (unsigned long long)ptr, _vs_cu_error_name(r));
      sync_mode = false;
      if (r != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT &&
          r != CUDA_ERROR_DEINITIALIZED && r != CUDA_ERROR_CONTEXT_IS_DESTROYED)
        *err_out = r; /* a sticky context error: the real cudaFree reports it too */
    }
  }
  pthread_mutex_lock(&p->lock);
  vs_block_t *b;
  HASH_FIND(hh, p->map, &ptr, sizeof ptr, b);
  if (!b) {
    pthread_mutex_unlock(&p->lock);
    return VS_POOL_NOT_OWNED;
  }
  HASH_DELETE(hh, p->map, b);
  p->used -= b->size;
  *size_out = b->size;
  *requested_out = b->requested;
  bool wake = false;
  if (sync_mode) {
    make_free(p, b);
  } else {
    b->state = B_PENDING;
    b->freed_seq = p->sync_seq;
    p->pending_bytes += b->size;
    vs_stream_t *s = stream == VS_NO_STREAM ? NULL : stream_get(p, key, stream, owner, true);
    if (s) {
      b->stream = s;
      list_push(&s->pending, b);
    } else {
      list_push(&p->deferred, b);
      wake = true;
    }
  }
  if (wake && _vs_option(VS_OPT_FREE_MODE) == VS_FREE_DEFERRED) {
    start_reclaimer_locked(p);
    pthread_cond_signal(&p->wake);
  }
  /* VMMSHIM_RELEASE_THRESHOLD: idle memory above it goes back to the device. Retried only
   * once idle memory has grown by a handle since the last try, so a pool whose idle memory
   * sits in partly used handles does not rescan on every free. */
  uint64_t threshold = _vs_option(VS_OPT_RELEASE_THRESHOLD);
  bool trim = vs_unlikely(p->free_bytes > threshold) && p->free_bytes >= p->trim_retry_at;
  if (trim) p->trim_retry_at = p->free_bytes + p->gran;
  /* The free's record takes its place in the trace before another thread can have the
   * range, and is written after the unlock (nothing else is traced in between). */
  vs_trace_place_t at = {NULL, 0};
  if (vs_unlikely(_vs_trace_on)) at = _vs_trace_place();
  pthread_mutex_unlock(&p->lock);
  if (vs_unlikely(at.rec != NULL)) _vs_trace_free_at(at, api, ptr, *size_out, stream, (int)p->caps.device);
  if (trim) {
    _vs_pool_trim(p, (size_t)threshold);
    pthread_mutex_lock(&p->lock);
    if (p->free_bytes <= threshold) p->trim_retry_at = 0;
    pthread_mutex_unlock(&p->lock);
  }
  return VS_POOL_OK;
}

/* Deferred mode: synchronise the context in the background whenever frees are pending, so
 * the program's thread never waits in free. Skips while a stream capture is active (a
 * context sync would invalidate it). */
static void *reclaimer_main(void *arg) {
  vs_pool_t *p = arg;
  _vs_guard++;
  _vs_cu.cuCtxSetCurrent(p->ctx);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  _vs_cu.cuThreadExchangeStreamCaptureMode(&mode);
  pthread_mutex_lock(&p->lock);
  while (!p->stopping) {
    if (!p->deferred.head) {
      pthread_cond_wait(&p->wake, &p->lock);
      continue;
    }
    pthread_mutex_unlock(&p->lock);
    if (atomic_load(&_vs_captures_active) == 0) {
      CUresult r = sync_and_reclaim(p);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED &&
          r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        /* The context failed or is being torn down: its frees can never be reused. */
        if (r != CUDA_ERROR_DEINITIALIZED && r != CUDA_ERROR_CONTEXT_IS_DESTROYED)
          _vs_warn("reclaimer: cuCtxSynchronize: %s; deferred frees stay pending", _vs_cu_error_name(r));
        pthread_mutex_lock(&p->lock);
        p->stopping = true;
        break;
      }
    }
    struct timespec ts = {0, 100 * 1000}; /* let frees gather: one sync serves many */
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&p->lock);
  }
  p->reclaimer_running = false;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/* ------------------------------------------------------------------ lookups */

bool _vs_pool_range(vs_pool_t *p, CUdeviceptr addr, CUdeviceptr *base_out, size_t *size_out) {
  bool found = false;
  if (!addr) return false;
  pthread_mutex_lock(&p->lock);
  vs_block_t *b;
  HASH_FIND(hh, p->map, &addr, sizeof addr, b);
  if (!b) {
    /* Interior pointer: rare (cuMemGetAddressRange, cuPointerGetAttribute); a scan is fine. */
    for (vs_block_t *c = p->map; c; c = c->hh.next)
      if (addr >= c->addr && addr < c->addr + c->requested) { b = c; break; }
  }
  if (b) {
    *base_out = b->addr;
    *size_out = b->requested;
    found = true;
  }
  pthread_mutex_unlock(&p->lock);
  return found;
}

/* ------------------------------------------------------------------ teardown and checks */

void _vs_pool_destroy(vs_pool_t *p) {
  _vs_dir_remove_pool(p);
  VS_STAT_SUB(pools, 1);
  pthread_mutex_lock(&p->lock);
  p->stopping = true;
  pthread_cond_broadcast(&p->wake);
  while (p->reclaimer_running) pthread_cond_wait(&p->wake, &p->lock);
  pthread_mutex_unlock(&p->lock);
  for (size_t i = 0; i < p->n_segs; i++) {
    _vs_vmm_unmap(&p->caps, p->segs[i].va, p->segs[i].size);
    _vs_vmm_release(&p->caps, p->segs[i].handle, p->segs[i].size);
    atomic_fetch_sub(&vs_mapped_total, p->segs[i].size);
    VS_STAT_SUB(bytes_mapped, p->segs[i].size);
  }
  for (int i = 0; i < p->n_resv; i++) _vs_vmm_address_free(&p->caps, p->resv[i].va, p->resv[i].size);
  /* The live blocks die with the context, as cudaMalloc memory does. */
  for (vs_block_t *b = p->map; b; b = b->hh.next) _vs_stat_drop(b->size, b->requested);
  HASH_CLEAR(hh, p->map);
  vs_stream_t *s, *tmp;
  HASH_ITER(hh, p->streams, s, tmp) {
    HASH_DEL(p->streams, s);
    free(s);
  }
  while (p->batches) {
    vs_batch_t *bt = p->batches;
    p->batches = bt->next;
    free(bt);
  }
  free(p->segs);
  /* Block descriptors are not individually tracked across lists here; the pool is
   * dropped only when its context dies, which is rare: the few KiB are left. */
  pthread_mutex_destroy(&p->lock);
  free(p);
}

int _vs_pool_check(vs_pool_t *p) {
  int bad = 0;
  pthread_mutex_lock(&p->lock);
  size_t free_sum = 0;
  for (int hi = 0; hi < VS_NHEAPS; hi++) {
    size_t heap_sum = 0;
    for (unsigned i = 0; i < VS_NBINS; i++)
      for (vs_block_t *b = p->heaps[hi].bins[i]; b; b = b->fnext) {
        if (b->state != B_FREE || b->bin != i || p->resv_heap[b->resv] != hi) bad++;
        if (mergeable(p, b->prev, b, B_FREE) || mergeable(p, b, b->next, B_FREE)) bad++; /* unmerged neighbours */
        heap_sum += b->size;
      }
    if (heap_sum != p->heaps[hi].free_bytes) bad++;
    free_sum += heap_sum;
  }
  if (free_sum != p->free_bytes) bad++;
  size_t used_sum = 0;
  for (vs_block_t *b = p->map; b; b = b->hh.next) {
    if (b->state != B_USED) bad++;
    if (b->addr % VS_MIN_ALIGN) bad++;
    used_sum += b->size;
  }
  if (used_sum != p->used) bad++;
  size_t seg_sum = 0;
  for (size_t i = 0; i < p->n_segs; i++) {
    seg_sum += p->segs[i].size;
    if (i && p->segs[i - 1].va + p->segs[i - 1].size > p->segs[i].va) bad++;
  }
  if (seg_sum != p->mapped) bad++;
  if (p->mapped != p->used + p->free_bytes + p->pending_bytes) bad++;
  pthread_mutex_unlock(&p->lock);
  return bad;
}
