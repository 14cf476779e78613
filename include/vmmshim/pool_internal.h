/* The pool's own types, shared by the files of src/pool/ only (the rest of the shim sees
 * vs_pool_t as an opaque type through vmmshim/pool.h). A request descends through them:
 *   pool.c          entry points: create, destroy, alloc with its slow-path ladder, free
 *   reclaim.c       making pending blocks free: synchronisations, events, the reclaimer thread
 *   sleep.c         the pool's memory leaving the device (a sleep, by mode)
 *   wake.c          ... and coming back at the same addresses (a wake, a promote)
 *   asleep.c        the records of memory off the device (the asleep list), its host buffers,
 *                   growths past the limit served from host memory
 *   copier.c        the copies of a sleep and a wake (two streams of the shim's own, marks)
 *   space.c         reservations, holes, growth and giving memory back (the handles themselves:
 *                   src/handle/handles.c, one layer down)
 *   check.c         the invariants (VS_POOL_CHECK), below every file that asserts them
 *   pool_streams.c  the blocks freed on each stream (by the stream keys of base.h)
 *   pool_blocks.c   blocks and bins: descriptors, size bins, split, merge, carve
 *                   (both included by pool.c: the hot path stays in one translation unit)
 *   policy.h        the decisions (how much to grow, what to keep, when to split) as pure functions
 *
 * The states of a block and the list it is on:
 *   B_FREE     in its heap's size bins (pool_blocks.c)
 *   B_USED     in the pool's uthash map from address to block
 *   B_PENDING  freed, earlier GPU work may still touch it: on a stream's pending list, on the
 *              deferred list, or in a batch sealed by an event (reclaim.c)
 *   B_HOLE     reserved, no memory mapped: on its heap's hole list (space.c)
 *   B_BUSY     on no list: being split, mapped or unmapped by a thread that dropped the lock
 *              for a driver call; or, for good, a range whose unmap failed (space.c)
 * A pool's lock is never held across a driver call (asserted in vmm.c in debug builds). */
#ifndef VMMSHIM_POOL_INTERNAL_H
#define VMMSHIM_POOL_INTERNAL_H

#include <pthread.h>
#include <string.h>

#include "vmmshim/pool.h"
#include "vmmshim/policy.h"

/* uthash with a hash made for our keys (8-byte addresses, multiples of 256, or stream
 * handles): a multiply-shift mix spreads them far cheaper than uthash's byte-wise default. */
static inline unsigned vs_hash_key(const void *key, size_t len) {
  uint64_t x = 0;
  memcpy(&x, key, len < sizeof x ? len : sizeof x);
  x = (x >> 8) ^ x;
  x *= 0x9E3779B97F4A7C15ull;
  return (unsigned)(x >> 32);
}
void _vs_uthash_fatal(const char *msg) __attribute__((noreturn));
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = vs_hash_key((keyptr), (keylen)))
#define uthash_fatal(msg) _vs_uthash_fatal(msg)
#include <uthash.h>

#define VS_MIN_ALIGN 256u          /* what cudaMalloc guarantees */
#define VS_LARGE_SIZE (4ull << 20) /* blocks this big start on a 2 MiB boundary */
#define VS_LARGE_ALIGN (2ull << 20)
#define VS_SUB_BITS 2 /* 4 bins per power of two */
#define VS_NBINS (64 << VS_SUB_BITS)
#define VS_BIN_SCAN 8     /* blocks examined in one bin */
#define VS_STREAM_SCAN 16 /* blocks examined on a stream's pending list */
#define VS_STREAM_LOOSE_SCAN 512 /* ... and among its sealed batches, before the pool grows */
#define VS_MAX_RESV 32    /* reservations per pool, all heaps together */
#define VS_SPARE_EVENTS 16

typedef enum vs_block_state_e { B_FREE = 0, B_USED, B_PENDING, B_HOLE, B_BUSY } vs_block_state_t;

typedef struct vs_stream_s vs_stream_t;

typedef struct vs_block_s {
  CUdeviceptr addr;
  size_t size;
  struct vs_block_s *prev, *next;   /* address order, within one reservation */
  struct vs_block_s *fprev, *fnext; /* bin, hole list or pending list */
  size_t requested;                 /* USED: what the program asked for */
  uint64_t freed_seq;               /* PENDING: pool->sync_seq at the free */
  vs_stream_t *stream;              /* PENDING on a stream's list */
  struct vs_batch_s *batch;         /* PENDING in a sealed batch */
  uint16_t resv;                    /* reservation index: blocks never merge across */
  uint8_t state;
  uint8_t bin;
  uint8_t stream_ordered;           /* USED: allocated on a stream (cudaMallocAsync) */
  bool exported;     /* USED: shared by IPC; its free is share/ipc.c's to decide (VS_POOL_EXPORTED) */
  UT_hash_handle hh; /* USED blocks, by addr */
} vs_block_t;

typedef struct vs_list_s {
  vs_block_t *head, *tail;
  size_t bytes;
  unsigned count;
} vs_list_t;

/* Blocks freed on one stream, not yet sealed into a batch. */
struct vs_stream_s {
  CUstream key;      /* normalised stream handle (per-thread streams get a private key) */
  CUstream handle;   /* what to record events on */
  const void *owner; /* per-thread default stream: only its thread may record on it */
  vs_list_t pending;
  UT_hash_handle hh;
};

/* Blocks sealed by an event recorded after their frees: free once the event completed. */
typedef struct vs_batch_s {
  CUevent event;
  vs_list_t blocks;
  uint64_t max_seq;
  CUstream key;   /* the stream its event is recorded on: that stream may reuse its blocks at once */
  unsigned epoch; /* pool->stream_epoch at sealing: a stream destroyed since then voids key */
  bool out;       /* off pool->batches while a reclaim queries it: its blocks stay as they are */
  struct vs_batch_s *next;
} vs_batch_t;

typedef struct vs_heap_s {
  vs_block_t *bins[VS_NBINS];
  uint64_t binmap[VS_NBINS / 64];
  vs_list_t holes;
  size_t free_bytes;
  size_t mapped;
} vs_heap_t;

/* A segment whose device memory left (sleep.c; asleep.c keeps the list): its bytes are discarded, copied to host
 * buffers, or in host buffers mapped at its own address. */
typedef struct vs_asleep_seg_s {
  CUdeviceptr va;
  size_t size;
  int mode;             /* VMMSHIM_SLEEP_* */
  int nbufs;            /* host buffers holding its bytes, back to back (host, mapped) */
  vs_host_buf_t *bufs;
  bool spilled;         /* a growth served from host memory past the limit (VMMSHIM_ON_LIMIT=host),
                           mapped mode: not asleep; a wake leaves it, a promote takes it */
  uint64_t file_off;    /* disk mode: where its bytes are in the pool's file */
} vs_asleep_seg_t;

typedef struct vs_asleep_s {
  vs_asleep_seg_t *v;
  size_t n, cap;
  size_t bytes;       /* their sizes, summed: the pool's memory that is not on the device */
  size_t host_mapped; /* of which served from host memory at its own address (mapped mode) */
  size_t spilled;     /* of which growths past the limit (spilled: awake memory on the host) */
} vs_asleep_t;

struct vs_pool_s {
  vs_lock_t lock; /* VS_RANK_POOL */
  CUcontext ctx;
  vs_device_caps_t caps;
  const vs_access_state_t *access; /* peers that may access the pool's memory (peer.c); may be NULL */
  int applying_access;             /* mappings being given new access: not trimmed meanwhile */
  size_t gran;  /* largest growth step; requests this large grow the heap by their own size */
  size_t chunk; /* largest handle: bigger growths are stitched from several */
  bool stitch;  /* VMMSHIM_STITCH: growths map idle handles side by side first (space.c) */
  vs_block_t *map;
  /* Always in the map (address 0, size 0): uthash frees its table when the last entry
   * goes, which would cost a malloc and a free per allocation of a pool with one block. */
  vs_block_t map_anchor;
  vs_stream_t *last_stream; /* the stream of the last lookup: most programs use one or two */
  vs_heap_t heaps[VS_NHEAPS];
  uint8_t resv_heap[VS_MAX_RESV];
  size_t heap_resv_size[VS_NHEAPS]; /* size of each heap's first reservation */
  vs_list_t deferred;               /* sync frees in deferred mode */
  vs_stream_t *streams;
  vs_batch_t *batches;
  CUevent spare_events[VS_SPARE_EVENTS];
  int n_spare_events;
  struct {
    CUdeviceptr va;
    size_t size;
    vs_block_t *first; /* the block at va: merges keep the lower block, so it never changes */
  } resv[VS_MAX_RESV];
  int n_resv;
  vs_segs_t segs; /* the handles mapped, sorted by va (handles.c) */
  vs_asleep_t asleep; /* segments whose memory left the device (asleep.c): not in segs */
  vs_disk_t *disk;    /* the file of its segments asleep in disk mode (disk.c); only sleeps and wakes */
  int tag;            /* the tag of every block of the pool (a handle never holds two) */
  size_t mapped, used, free_bytes, pending_bytes;
  /* The live blocks allocated on a stream: the bytes they hold (served), the bytes asked for
   * (what the driver's pool reports as used, vmmshim/pool.h) and its high watermark; the
   * reserve's high watermark. */
  size_t stream_served, stream_requested, stream_requested_high, reserved_high;
  size_t stuck_bytes; /* mapped in ranges whose unmap failed: BUSY blocks, out of use (space.c) */
  bool said_stuck;    /* that was said once */
  bool lost_stuck;    /* one such range is not even in the table (no host memory) */
  size_t trim_retry_at; /* idle bytes at which the release threshold is tried again */
  uint64_t sync_seq;    /* synchronisations started */
  uint64_t sync_done;   /* the latest context synchronisation that completed (its number) */
  uint64_t ordered_need; /* a context sync numbered this or later must complete before FREE memory is
                            unmapped: blocks freed in stream order (VS_FREE_KIND_ORDERED) may still be in use */
  unsigned syncs_running;  /* context synchronisations in flight */
  uint64_t sync_since_ns;  /* when the oldest of them started (0: none) */
  uint64_t last_sync_ns;   /* how long the last one that completed took: how far the GPU lags */
  uint64_t allocs;      /* allocations served */
  const void *last_allocator; /* thread tag of the last allocation */
  vs_block_t *spare_blocks;
  /* Threads recording events on streams they copied out of the lock: a stream must not be
   * destroyed under them (its destroy hook waits for sealers == 0). */
  int sealers;
  unsigned stream_epoch; /* streams destroyed: batches sealed before one no longer know their stream */
  pthread_cond_t sealed;
  size_t pending_out; /* pending bytes in batches a thread holds outside the lock */
  /* deferred-mode reclaimer */
  pthread_t reclaimer;
  pthread_cond_t wake;
  bool reclaimer_running, stopping;
};

/* ---- the pool lock (lock.h: counted, rank VS_RANK_POOL) ---- */
static inline void pool_lock(vs_pool_t *p) { _vs_lock_take(&p->lock); }
static inline bool pool_trylock(vs_pool_t *p) { return _vs_lock_try(&p->lock); }
static inline void pool_unlock(vs_pool_t *p) { _vs_lock_release(&p->lock); }
static inline void pool_wait(vs_pool_t *p, pthread_cond_t *cond) { _vs_lock_wait(&p->lock, cond); }

/* ---- intrusive FIFO lists (holes, pending, deferred, batches) ---- */
static inline void list_push(vs_list_t *l, vs_block_t *b) {
  b->fnext = NULL;
  b->fprev = l->tail;
  if (l->tail) l->tail->fnext = b;
  else l->head = b;
  l->tail = b;
  l->bytes += b->size;
  l->count++;
}

static inline void list_remove(vs_list_t *l, vs_block_t *b) {
  if (b->fprev) b->fprev->fnext = b->fnext;
  else l->head = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  else l->tail = b->fprev;
  b->fprev = b->fnext = NULL;
  l->bytes -= b->size;
  l->count--;
}

static inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
/* The same for sizes that come from options: 0 when the result would not fit in a size_t. */
static inline size_t round_up_checked(size_t x, size_t a) { return x > SIZE_MAX - (a - 1) ? 0 : round_up(x, a); }

static inline vs_heap_t *heap_of(vs_pool_t *p, const vs_block_t *b) { return &p->heaps[p->resv_heap[b->resv]]; }
static inline int heap_id_of(const vs_pool_t *p, const vs_block_t *b) { return p->resv_heap[b->resv]; }
/* The devices that have read-write and read-only access to the pool's memory now. */
static inline void access_now(const vs_pool_t *p, uint64_t *rw, uint64_t *ro) {
  *rw = p->access ? atomic_load(&p->access->rw) : 0;
  *ro = p->access ? atomic_load(&p->access->ro) : 0;
}

/* The reservation that holds address va, or -1. */
static inline int resv_of(const vs_pool_t *p, CUdeviceptr va) {
  for (int i = 0; i < p->n_resv; i++)
    if (va >= p->resv[i].va && va < p->resv[i].va + p->resv[i].size) return i;
  return -1;
}
/* The heap whose reservation holds va. Lock held. */
static inline vs_heap_t *heap_at(vs_pool_t *p, CUdeviceptr va) {
  int i = resv_of(p, va);
  return &p->heaps[i >= 0 ? p->resv_heap[i] : 0];
}
/* Whether size-bin i of the heap holds a block (its bit in the bin map). */
static inline bool bin_used(const vs_heap_t *heap, unsigned i) { return heap->binmap[i / 64] & (1ull << (i % 64)); }

/* ---- pool_blocks.c (in pool.c's unit; called from space.c and reclaim.c too) ---- */
vs_block_t *_vs_block_new(vs_pool_t *p);
void _vs_block_put(vs_pool_t *p, vs_block_t *b);
/* Splits b at offset off: b keeps [addr, addr+off), the new block gets the rest (same state). */
vs_block_t *_vs_block_split(vs_pool_t *p, vs_block_t *b, size_t off);
bool _vs_block_mergeable(const vs_pool_t *p, const vs_block_t *a, const vs_block_t *b, vs_block_state_t st);
/* A block no longer USED or PENDING goes to the bins, merged with free neighbours. */
void _vs_block_make_free(vs_pool_t *p, vs_block_t *b);
/* A block whose memory was unmapped (or never mapped) joins the holes, merged with neighbours. */
void _vs_block_make_hole(vs_pool_t *p, vs_block_t *b);
void _vs_bin_insert(vs_pool_t *p, vs_block_t *b);
void _vs_bin_remove(vs_pool_t *p, vs_block_t *b);
unsigned _vs_bin_of(size_t size);
size_t _vs_align_pad(CUdeviceptr addr, size_t align);

/* ---- space.c ---- */
/* Adds a reservation of `size` bytes to heap heap_id (the lock NOT held: reserving is a
 * driver call). Returns 0, or -1 when the driver or the table has no room. */
int _vs_pool_add_reservation(vs_pool_t *p, int heap_id, size_t size);
/* Maps more memory into heap heap_id so that a request of size/align fits (exact: handles
 * of exactly what is missing, for the out-of-memory retry). Lock not held. */
CUresult _vs_pool_grow(vs_pool_t *p, int heap_id, size_t size, size_t align, bool exact);
/* A BUSY block where `size` bytes at `align` can be mapped (its length in *len_out), handles of
 * at least `handle` bytes: from a hole, or from a new reservation when no hole is large enough.
 * NULL: no address space. Lock not held. */
vs_block_t *_vs_pool_claim_space(vs_pool_t *p, int heap_id, size_t size, size_t align, size_t handle,
                                 size_t *len_out);
/* Unmaps and releases every segment and reservation (the pool is being destroyed). */
void _vs_pool_unmap_all(vs_pool_t *p);
/* Idle bytes of free block b that lie in whole handles (which trimming could give back). Lock held. */
size_t _vs_pool_whole_handles_in(const vs_pool_t *p, const vs_block_t *b);
/* Frees every block descriptor of every reservation and the spare ones. */
void _vs_pool_free_blocks(vs_pool_t *p);
/* Blocks freed in stream order (VS_FREE_KIND_ORDERED) may still be in use: unmapping FREE memory
 * waits for a synchronisation of the pool's context first. The question: lock held; the
 * settling: lock not held. */
bool _vs_pool_ordered_unsettled(const vs_pool_t *p);
CUresult _vs_pool_settle_ordered(vs_pool_t *p);

/* ---- reclaim.c ---- */
/* Synchronises the pool's context (which must be current) and frees what was pending
 * before. Lock not held. */
CUresult _vs_pool_sync_and_reclaim(vs_pool_t *p);

/* Synchronises one stream, then frees every block freed on it before (its pending list and the
 * batches sealed on it). The stream is given by its key (_vs_stream_key) and handle. */
CUresult _vs_pool_sync_stream_and_reclaim(vs_pool_t *p, CUstream key, CUstream handle);
/* Seals streams' pending blocks with events (all but the `keep` newest of each stream) and
 * frees batches whose events completed; never waits. self: the calling thread's tag (only it
 * may record on its per-thread stream). Lock not held. */
void _vs_pool_reclaim_by_events(vs_pool_t *p, const void *self, unsigned keep);
/* Deferred mode: starts the pool's reclaimer thread if it is not running. Lock held. */
void _vs_pool_start_reclaimer(vs_pool_t *p);
/* Stops the reclaimer thread and waits for it (the pool is being destroyed). Lock not held. */
void _vs_pool_stop_reclaimer(vs_pool_t *p);
void _vs_pool_free_batches(vs_pool_t *p);

/* ---- pool_streams.c (in pool.c's unit) ---- */
/* The stream's entry (created when `create`), or NULL. Lock held. */
vs_stream_t *_vs_stream_get(vs_pool_t *p, CUstream key, CUstream handle, const void *owner, bool create);
/* The calling thread's tag (the owner of its per-thread default stream). */
const void *_vs_thread_tag(void);

/* ---- asleep.c ---- */
/* Frees the asleep segments' records and host buffers (the pool is being destroyed). */
void _vs_pool_forget_asleep(vs_pool_t *p);
/* Maps host memory for a request of size/align (VMMSHIM_ON_LIMIT=host): a new free range of
 * the heap (*len_out bytes), recorded as a spilled segment. Lock not held. */
CUresult _vs_pool_grow_host(vs_pool_t *p, int heap_id, size_t size, size_t align, size_t *len_out);
/* Host buffers for a segment of size bytes (VS_HOST_CHUNK each, the last the rest): their count,
 * or -1 with the reason in *err (nothing kept). */
int _vs_asleep_take_bufs(const vs_device_caps_t *caps, size_t size, vs_host_buf_t **out, CUresult *err);
/* A segment's host buffers go back to host.c. */
void _vs_asleep_give_bufs(const vs_device_caps_t *caps, vs_asleep_seg_t *a);
/* Unmaps a segment's first n host buffers from its own address (they stay at home). */
void _vs_asleep_unmap_bufs(vs_pool_t *p, const vs_asleep_seg_t *a, int n);
/* Maps a segment's host buffers at its own address with the access of the pool's owner and
 * peers now; on failure nothing stays mapped there. Lock not held. */
CUresult _vs_asleep_map_bufs(vs_pool_t *p, const vs_asleep_seg_t *a);
/* The same for a device handle at va. Lock not held. */
CUresult _vs_asleep_map_device(vs_pool_t *p, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);
/* A segment's share of the list's counts, added or taken off. Lock held. */
void _vs_asleep_count(vs_asleep_t *l, const vs_asleep_seg_t *s, bool add);
/* Appends segments to the list; false (nothing appended) without host memory for it. Lock held. */
bool _vs_asleep_append(vs_pool_t *p, const vs_asleep_seg_t *v, size_t n);
/* Puts segments back on the list after a wake that did not take them. Lock not held. */
void _vs_asleep_put_back(vs_pool_t *p, const vs_asleep_seg_t *v, size_t n);

/* What a sleep or a wake moved: the first failure is the one the answer gives. */
static inline void move_note(vs_move_t *out, CUresult r, const char *why) {
  if (out->err == CUDA_SUCCESS && r != CUDA_SUCCESS) {
    out->err = r;
    out->why = why;
  }
}

/* ---- copier.c ---- */
/* Two streams of the shim's own in the current context, for the copies: a copy engine each. */
typedef struct vs_copier_s {
  CUstream s[2];
  int n, next;
  CUresult err; /* the first copy that could not be queued */
} vs_copier_t;
/* A point in the copier's streams, reached when every copy queued before it has completed. */
typedef struct vs_copy_mark_s {
  CUevent ev[2];
  int n;        /* events recorded; -1: none could be, the whole streams are waited for */
  CUresult err; /* a copy up to this point could not be queued */
} vs_copy_mark_t;
void _vs_copier_open(vs_copier_t *c);
/* Queues a device-to-device copy of n bytes, in pieces alternating streams. */
void _vs_copier_copy(vs_copier_t *c, CUdeviceptr dst, CUdeviceptr src, size_t n);
/* Queues zeros over n bytes at dst. */
void _vs_copier_zero(vs_copier_t *c, CUdeviceptr dst, size_t n);
vs_copy_mark_t _vs_copier_mark(vs_copier_t *c);
/* Waits for a mark (and forgets it); returns the first error of the copies before it. */
CUresult _vs_copier_wait(vs_copier_t *c, vs_copy_mark_t *m);
/* Waits for every copy and destroys the streams; returns the first error. */
CUresult _vs_copier_close(vs_copier_t *c);

/* Queues a copy of n bytes (at most VS_DISK_PIECE) from the device to pinned host memory, or back. */
void _vs_copier_to_host(vs_copier_t *c, void *dst, CUdeviceptr src, size_t n);
void _vs_copier_from_host(vs_copier_t *c, CUdeviceptr dst, const void *src, size_t n);

/* ---- disk.c: disk mode (the files are handle/disk.c's) ---- */
/* A failed file operation: the answer's error and why (the first failure wins). */
static inline void disk_note(vs_move_t *out, int neg_errno, const char *why) {
  if (out->err == CUDA_SUCCESS && neg_errno) {
    out->err = CUDA_ERROR_UNKNOWN;
    out->errnum = -neg_errno;
    out->why = why;
  }
}
/* Writes segs[0 .. n)'s bytes to the pool's file (made for `tag` at its first disk sleep), back
 * to back from its end, through the staging buffers: offs[i] is where segment i went. True when
 * every byte is in the file and synced; else the file is as it was before (removed when it was
 * new) and out says why. Lock not held. */
bool _vs_disk_out(vs_pool_t *p, const char *tag, const vs_seg_t *segs, int n, uint64_t *offs, vs_move_t *out);
/* A wake's reads from the pool's file: pieces into the staging buffers, up to VS_DISK_BUFS
 * reads in flight, each piece copied to the device once read while later ones are read. */
typedef struct vs_disk_in_s {
  void *buf[VS_DISK_BUFS];
  struct {
    int state; /* 0 free, 1 being read, 2 being copied to the device */
    CUdeviceptr va;
    size_t len;
    vs_copy_mark_t mark;
  } slot[VS_DISK_BUFS];
  vs_disk_reads_t rd;
  unsigned k;
  bool open;
} vs_disk_in_t;
/* Opens the pool's file and takes the staging buffers: 0 or -errno (out says why). */
int _vs_disk_in_start(vs_pool_t *p, vs_disk_in_t *in, vs_move_t *out);
/* Starts size bytes from file offset off towards the device at va (mapped): reads that may still
 * be in flight on return (_vs_disk_in_flush). 0, or -errno after every read and copy started so
 * far has completed (out says why). */
int _vs_disk_in_seg(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp, CUdeviceptr va, size_t size, uint64_t off,
                    vs_move_t *out);
/* Waits for the reads in flight and queues their copies to the device: 0, or -errno after every
 * read and copy started so far has completed (out says why). */
int _vs_disk_in_flush(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp, vs_move_t *out);
/* Waits for the copies still reading the staging buffers, gives them back, closes the file. */
void _vs_disk_in_end(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp);
/* Removes the pool's file when no segment of it is asleep in disk mode (force: in any case, the
 * pool is going). Lock not held. */
void _vs_disk_forget(vs_pool_t *p, bool force);

/* ---- invariants (check.c) ---- */
/* Every invariant of the pool checked; returns the number of problems found. Lock held. */
int _vs_pool_check_locked(vs_pool_t *p);
#if VS_DEBUG >= 2
#define VS_POOL_CHECK(p) vs_assert(_vs_pool_check_locked(p) == 0)
#else
#define VS_POOL_CHECK(p) ((void)0)
#endif

#endif
