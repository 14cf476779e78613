/* vmmshim handle layer (src/handle/handles.c): the physical handles mapped into a pool.
 *
 * A segment is one handle (cuMemCreate) mapped at one address (cuMemMap). A pool keeps its
 * segments in a table sorted by address (vs_segs_t), which the pool's own lock guards: the
 * table functions make no driver call and take no lock. The mapping functions make the
 * driver calls (through vmm.c) with no lock held. Bytes mapped by every pool together are
 * counted here, against VMMSHIM_LIMIT. */
#ifndef VMMSHIM_HANDLES_H
#define VMMSHIM_HANDLES_H

#include <linux/aio_abi.h>
#include <sys/types.h>

#include "vmmshim/group.h"
#include "vmmshim/vmm.h"

/* The devices besides its owner that may access a context's pool memory (peer.c keeps it;
 * a growth reads it for its new mappings). */
typedef struct vs_access_state_s {
  _Atomic uint64_t rw, ro; /* device bitmasks: read-write, read-only */
  _Atomic uint64_t ever;   /* every device ever given access (to take it away again) */
  atomic_uint gen;         /* bumped on every change */
} vs_access_state_t;

/* One physical handle mapped at va. */
typedef struct vs_seg_s {
  CUdeviceptr va;
  size_t size;
  CUmemGenericAllocationHandle handle;
} vs_seg_t;

/* A pool's segments, sorted by va (the pool's lock guards it). */
typedef struct vs_segs_s {
  vs_seg_t *v;
  size_t n, cap;
} vs_segs_t;

/* ---- bytes mapped by every pool, against VMMSHIM_LIMIT ---- */
/* The cap on mapped bytes in force (0: none): VMMSHIM_LIMIT, or what _vs_set_limit set since. */
uint64_t _vs_limit(void);
/* A new cap while the program runs (0: none); returns the one it replaces. Lowering it below
 * what is mapped refuses growth from then on and unmaps nothing. */
uint64_t _vs_set_limit(uint64_t bytes);
size_t _vs_mapped_total(void);
/* Would mapping `add` more bytes pass VMMSHIM_LIMIT? */
bool _vs_over_limit(size_t add);
/* Counts `len` bytes about to be mapped on device dev, unless that passes VMMSHIM_LIMIT or the
 * budget (group.c) (then false, nothing counted): two threads, or two processes of a group,
 * racing for the last bytes under the limit cannot both have them. */
bool _vs_mapped_admit(int dev, size_t len);
/* Bytes unmapped on device dev, or admitted and then not mapped. */
void _vs_mapped_return(int dev, size_t len);

/* ---- the budget (group.c): VMMSHIM_LIMIT shared by a group of processes (VMMSHIM_LIMIT_GROUP),
 * or per device; inactive (every call a no-op) when VMMSHIM_LIMIT is this process's own cap ---- */
/* Joins the group (or makes the process's own budget) now, rather than at the first growth: the
 * alloc layer calls it when the process first uses a device, so that the group lists it. */
void _vs_group_join(void);
/* Start time (clock ticks since boot, /proc/PID/stat field 22) and state (field 3; state may be
 * NULL) of process pid, 0 for this one: 0, -ENOENT when there is none, another -errno when it
 * cannot be told. */
int _vs_proc_start(pid_t pid, uint64_t *start, char *state);
/* Admits len bytes on device dev against the budget, or refuses (false, nothing counted). */
bool _vs_group_admit(int dev, size_t len);
void _vs_group_return(int dev, size_t len);
/* Would len more bytes on dev be refused now (no lock: for the status of a failure)? */
bool _vs_group_over(int dev, size_t len);
/* What is left under the budget's caps on dev, and the smallest cap; false when none applies. */
bool _vs_group_headroom(int dev, size_t *left, size_t *cap);
/* VMMSHIM_ON_LIMIT=wait: sleeps until bytes come back to the budget (a member's release, a
 * limit raised: a futex on the segment, woken by the release), or at most half a second (a
 * member that died is only found at the next admission), or until deadline_ns (_vs_now_ns).
 * While a member waits, the others' frees give their idle memory back. Returns false once the
 * deadline has passed, true when the caller should try again. */
bool _vs_group_wait(uint64_t deadline_ns);
/* Whether a wait for len bytes on dev can never end (why[] then says why): the group could not
 * be joined, len passes the limit itself, or nothing but the waiting thread could free. */
bool _vs_group_hopeless(int dev, size_t len, char *why, size_t n);
/* VMMSHIM_ON_LIMIT=host: len bytes on dev served from host memory past the limit, under
 * host:SIZE (false: over it); counted in the member's host bytes. */
bool _vs_group_spill_admit(int dev, size_t len);
void _vs_group_spill_return(int dev, size_t len);
/* The budget as it stands, for reports. */
typedef struct vs_group_view_s {
  char name[32]; /* the group's, "" for this process's own budget */
  bool shared;
  uint32_t members, limit_source;
  uint64_t limit_all, limit_dev, total_all, total_dev, mine_all, mine_dev;
  uint64_t host_all, mine_host, refused, reclaimed;
} vs_group_view_t;
bool _vs_group_view(int dev, vs_group_view_t *v);
/* group_members.c's way into the segment: fn runs under the group's lock, inside a change; false
 * when the process is in no group (or one that could not be joined). */
bool _vs_group_with(void (*fn)(vs_group_header_t *h, vs_group_member_t *me, void *arg), void *arg);

/* ---------------------------------------------------------------- "group_members.c" */
/* This member's priority (set >= 0: set it too): the one before, -1 when in no group. */
int _vs_group_priority(int set);
/* The live members a growth may borrow from (priority strictly below this member's), lowest
 * priority first: at most max pids, their count. */
int _vs_group_lenders(pid_t *pids, int max);
/* bytes this member moved out of the device for borrower (out), or that came back (!out): its
 * `lent`, the borrower's `borrowed`, the counts of demotions and promotions. */
void _vs_group_lend(uint64_t bytes, pid_t borrower, bool out);
/* Whether bytes more fit under every limit of the group with margin_pct of each left over. */
bool _vs_group_room(uint64_t bytes, unsigned margin_pct);
/* This member's priority and the bytes it lent and borrowed; false when in no group. */
bool _vs_group_balance(int *priority, uint64_t *lent, uint64_t *borrowed);
/* Whether a member waits for bytes (its frees should then give idle memory back): a load. */
extern const uint32_t *_Atomic _vs_budget_waiters;
static inline bool _vs_budget_wanted(void) {
  const uint32_t *w = atomic_load_explicit(&_vs_budget_waiters, memory_order_relaxed);
  return w && __atomic_load_n(w, __ATOMIC_RELAXED) != 0;
}

/* ---- the segment table (caller holds the pool's lock; no driver call) ---- */
/* Index of the first segment at or above va. */
size_t _vs_segs_lower_bound(const vs_segs_t *t, CUdeviceptr va);
/* Adds n segments, all or none: -1 when there is no host memory for the table. */
int _vs_segs_add(vs_segs_t *t, const vs_seg_t *segs, int n);
void _vs_segs_remove_at(vs_segs_t *t, size_t i);
/* Bytes of the segments lying wholly inside [addr, addr + size). */
size_t _vs_segs_whole_in(const vs_segs_t *t, CUdeviceptr addr, size_t size);
/* The segments under [ptr, end), back to back: their handles and sizes and ptr's offset in the
 * first. -1 when a byte of the range is not mapped, or it lies on more than max handles. */
int _vs_segs_covering(const vs_segs_t *t, CUdeviceptr ptr, CUdeviceptr end, size_t *offset_out,
                      CUmemGenericAllocationHandle *handles, size_t *sizes, int max, int *n_out);
/* A copy of the table (malloc'd, n in *n_out; NULL when empty or out of host memory). */
vs_seg_t *_vs_segs_copy(const vs_segs_t *t, size_t *n_out);
void _vs_segs_clear(vs_segs_t *t);

/* ---- mapping (no lock held) ---- */
#define VS_GROW_PIECES 256 /* handles one growth maps at most, and spares it keeps */

/* Idle handles a growth unmapped to map them again at its own address. */
typedef struct vs_spares_s {
  vs_seg_t seg[VS_GROW_PIECES];
  int n;
} vs_spares_t;

/* A failed cuMemUnmap leaves its range mapped, in a state nothing here can know: such a segment
 * keeps its handle (never released, never a spare) and is handed back to the caller, who keeps
 * the range out of use and counted as mapped ("stuck"); teardown tries to unmap it again. */

/* Maps [va, va+len) back to back: first with spare handles that fit (sp may be NULL), then with
 * new handles of at most `chunk` bytes each; and sets access over the whole range with one call:
 * the owner and rw read-write, ro read-only. The segments are returned in segs_out (at most max)
 * for the caller to record. On failure every handle mapped here, spares included, is unmapped
 * and released, and segs_out holds those that could not be unmapped (*n_out of them, stuck). */
CUresult _vs_handles_map(const vs_device_caps_t *caps, CUdeviceptr va, size_t len, size_t chunk, uint64_t rw,
                         uint64_t ro, vs_spares_t *sp, vs_seg_t *segs_out, int max, int *n_out);
/* Unmaps and releases segments, the last first. Returns how many could not be unmapped: those
 * are moved to the front of segs, in address order (stuck). */
int _vs_handles_unmap(const vs_device_caps_t *caps, vs_seg_t *segs, int n);
/* Unmaps segments: into sp while it has room (sp may be NULL), the rest released (counted as
 * trims). stuck[i] says whether segs[i] could not be unmapped. Returns the bytes unmapped. */
size_t _vs_handles_unmap_idle(const vs_device_caps_t *caps, const vs_seg_t *segs, int n, vs_spares_t *sp,
                              bool *stuck);
/* Releases the spares not mapped again. */
void _vs_handles_release_spares(const vs_device_caps_t *caps, vs_spares_t *sp);
/* Sets access on segments: the owner and rw read-write, ro read-only, none taken away. */
void _vs_handles_set_access(const vs_device_caps_t *caps, const vs_seg_t *segs, size_t n, uint64_t rw, uint64_t ro,
                            uint64_t none);

/* ---- host memory for sleeping pools (host.c) ---- */
#define VS_HOST_CHUNK (64ull << 20) /* a sleeping segment's bytes go to host buffers of this size */

/* Host memory mapped at `home` (its own reservation) with access for device `dev`, and for the
 * CPU too (`cpu`) where the driver grants it: then the CPU reads and writes its bytes at home. */
typedef struct vs_host_buf_s {
  CUmemGenericAllocationHandle handle;
  CUdeviceptr home;
  size_t size;
  int dev;
  bool cpu;
} vs_host_buf_t;

/* A buffer of exactly size bytes for caps->device: from the cache, or new (under
 * VMMSHIM_HOST_LIMIT: cached buffers of other sizes are released to make room).
 * CUDA_ERROR_OUT_OF_MEMORY past the limit, CUDA_ERROR_NOT_SUPPORTED without host VMM. */
CUresult _vs_host_take(const vs_device_caps_t *caps, size_t size, vs_host_buf_t *out);
/* Back to the cache: the buffer must be mapped at home again. */
void _vs_host_give(const vs_device_caps_t *caps, const vs_host_buf_t *buf);
/* Released at once (its bytes are not wanted, or it could not go home); at_home: it is mapped
 * at home (else mapped nowhere). */
void _vs_host_drop(const vs_device_caps_t *caps, const vs_host_buf_t *buf, bool at_home);
/* Releases cached buffers until at most keep bytes stay cached; returns the bytes released. */
size_t _vs_host_trim(const vs_device_caps_t *caps, size_t keep);
/* Makes bytes of host memory ahead, in VS_HOST_CHUNK buffers, into the cache. */
CUresult _vs_host_reserve(const vs_device_caps_t *caps, size_t bytes);
void _vs_host_counts(size_t *cached, size_t *lent);

/* Disk mode's pinned staging buffers, VS_DISK_BUFS of VS_DISK_PIECE bytes each, CPU-readable
 * (kept across cycles): CUDA_ERROR_NOT_READY while another sleep or wake holds them. */
#define VS_DISK_PIECE (32ull << 20)
#define VS_DISK_BUFS 4
CUresult _vs_host_staging_take(void *bufs[VS_DISK_BUFS]);
void _vs_host_staging_give(void);
/* Frees them when no one holds them; returns the bytes freed. */
size_t _vs_host_staging_trim(void);

/* ---- files of sleeping tags (disk.c) ---- */
#define VS_DISK_PATH 512
typedef struct vs_disk_s {
  int fd;       /* -1 when closed (between a sleep and its wake) */
  bool direct;  /* opened with O_DIRECT */
  uint64_t len; /* bytes written so far: the next segment goes there */
  char path[VS_DISK_PATH];
} vs_disk_t;
/* The directory of new files (vmmshim_set_disk_dir): -errno unless a writable directory. */
int _vs_disk_set_dir(const char *dir);
void _vs_disk_dir(char *buf, size_t n);
/* A new file for a tag's pool on dev (O_EXCL, 0600), open: 0 or -errno. */
int _vs_disk_create(vs_disk_t *d, const char *tag, int dev);
/* Opens d->path again (read and write): 0 or -errno. */
int _vs_disk_open(vs_disk_t *d);
void _vs_disk_close(vs_disk_t *d);
/* Closes and removes the file. */
void _vs_disk_remove(vs_disk_t *d);
/* All n bytes at off, or -errno (-EIO for a write that makes no progress, -ENODATA for a read
 * past the end of a truncated file). */
int _vs_disk_write(vs_disk_t *d, const void *buf, size_t n, uint64_t off);
int _vs_disk_read(vs_disk_t *d, void *buf, size_t n, uint64_t off);
int _vs_disk_sync(vs_disk_t *d);
int _vs_disk_truncate(vs_disk_t *d, uint64_t len);
/* Allocates the file's blocks for [off, off + len) ahead of the writes (fallocate), so that they
 * lie together and the writes allocate nothing: 0, 0 where the filesystem cannot (nothing done),
 * or -errno (-ENOSPC: the bytes will not fit). */
int _vs_disk_preallocate(vs_disk_t *d, uint64_t off, uint64_t len);
/* Reads in flight, up to VS_DISK_BUFS at once, one per slot (Linux native AIO, which with
 * O_DIRECT keeps the disk busy while earlier pieces are copied on; where the kernel refuses it,
 * each read is made at once, as _vs_disk_read does). */
typedef struct vs_disk_reads_s {
  aio_context_t ctx; /* 0: no AIO here */
  struct iocb cb[VS_DISK_BUFS];
  long res[VS_DISK_BUFS]; /* bytes read, or -errno */
  bool pending[VS_DISK_BUFS];
  void *buf[VS_DISK_BUFS];
  size_t n[VS_DISK_BUFS];
  uint64_t off[VS_DISK_BUFS];
} vs_disk_reads_t;
void _vs_disk_reads_open(vs_disk_reads_t *r);
/* Waits for every read still in flight, then releases r. */
void _vs_disk_reads_close(vs_disk_reads_t *r);
/* Starts reading n bytes at off into buf in slot s (which holds no read in flight). */
void _vs_disk_read_start(vs_disk_t *d, vs_disk_reads_t *r, int s, void *buf, size_t n, uint64_t off);
/* Waits for slot s's read: 0 once all its bytes are there, or -errno (as _vs_disk_read). */
int _vs_disk_read_finish(vs_disk_t *d, vs_disk_reads_t *r, int s);
/* "ENOSPC" for ENOSPC. */
const char *_vs_errno_name(int e);

/* ---- access changes and growths never overlap ----
 * An access change (peer.c) holds this lock while it applies new access to existing mappings; a
 * growth holds it while it records its new mappings, so a change either came before (and the
 * growth gives the new access) or comes after (and finds the mappings). Rare paths only. */
void _vs_access_lock(void);
void _vs_access_unlock(void);

#endif
