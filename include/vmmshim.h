/* vmmshim public API.
 *
 * A program never needs to link against libvmmshim.so: it runs unmodified under
 * LD_PRELOAD. A program that wants to look inside the shim finds these functions
 * at run time with dlsym(RTLD_DEFAULT, "vmmshim_get_stats") and friends, and
 * works on without them when the shim is not loaded. */
#ifndef VMMSHIM_H
#define VMMSHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMMSHIM_VERSION "0.1.0"

/* Which entry point an allocation or free came through. */
typedef enum vmmshim_api_e {
  VMMSHIM_API_RUNTIME = 0,       /* cudaMalloc / cudaFree */
  VMMSHIM_API_RUNTIME_ASYNC = 1, /* cudaMallocAsync / cudaFreeAsync (and _ptsz) */
  VMMSHIM_API_DRIVER = 2,        /* cuMemAlloc_v2 / cuMemFree_v2 (a static runtime's cudaMalloc lands here) */
  VMMSHIM_API_DRIVER_ASYNC = 3,  /* cuMemAllocAsync / cuMemFreeAsync (and _ptsz) */
  VMMSHIM_API_COUNT = 4
} vmmshim_api_t;

/* Process-wide counters, summed over every device and context. */
typedef struct vmmshim_stats_s {
  uint64_t allocs[VMMSHIM_API_COUNT];  /* allocations served from the pool, per API */
  uint64_t frees[VMMSHIM_API_COUNT];   /* frees of pool blocks, per API */
  uint64_t alloc_failures;             /* allocations that returned out-of-memory */
  uint64_t passthrough_allocs;         /* allocations handed to the real driver (capture, fallback) */
  uint64_t bytes_in_use;               /* bytes in live blocks (served sizes) */
  uint64_t peak_bytes_in_use;
  uint64_t bytes_requested_in_use;     /* bytes the program asked for, live */
  uint64_t bytes_mapped;               /* physical bytes mapped by all pools */
  uint64_t peak_bytes_mapped;
  uint64_t vmm_calls;                  /* cuMem{AddressReserve,Create,Map,SetAccess,Unmap,Release,AddressFree}, and for
                                          IPC cuMem{Export,Import}{To,From}ShareableHandle */
  uint64_t vmm_ns;                     /* time spent inside those calls */
  uint64_t syncs;                      /* context synchronisations made for frees */
  uint64_t trims;                      /* handles released because they were idle */
  uint64_t pools;                      /* pools alive: one per context and arena in use */
} vmmshim_stats_t;

/* Fills *out (size = sizeof(vmmshim_stats_t)); returns 0, or -1 if size is wrong. */
int vmmshim_get_stats(vmmshim_stats_t *out, size_t size);

/* Unmaps and releases every pool handle that holds no live block (after waiting
 * for pending frees). Returns the number of bytes given back to the device. */
size_t vmmshim_trim(void);

/* 1 when the shim serves allocations in this process, 0 when it passes through. */
int vmmshim_active(void);

/* Writes the memory report to the shim's log (VMMSHIM_LOG's destination): per device and
 * heap, live and mapped memory, idle memory and why it is kept, pending frees, VMMSHIM_LIMIT,
 * what the driver reports free. The same report as at out-of-memory and on the signal
 * VMMSHIM_DUMP_SIGNAL. Returns 0, or -1 when the shim is not active. */
int vmmshim_dump(void);

/* ---- tags, sleep and wake ----
 *
 * Every allocation belongs to a tag: "untagged" unless one is set (VMMSHIM_TAG at start, a
 * thread's own with vmmshim_set_tag, or the process's from outside with vmmshim ctl); "untagged"
 * is never "default", the tag of a region that names none, and no pause of regions takes it
 * (docs/sleep.md, "Untagged memory"). A tag's memory lives on physical handles of that tag only.
 * Sleeping a tag gives its device memory back and keeps its addresses: pointers held anywhere
 * and captured CUDA graphs stay valid; waking maps device memory at the same addresses again.
 *
 * VMMSHIM_API_VERSION counts changes to what follows; vmmshim_api_version() says which the
 * loaded shim implements. The functions return 0, or a negative errno value:
 *   -EINVAL bad argument (tag name: 1-31 of [A-Za-z0-9_.-]), -ENOENT no such tag,
 *   -EBUSY a stream capture is in progress (a sleep never invalidates one), -ENOMEM the device
 *   (or VMMSHIM_LIMIT) has no room to wake, -ENOTSUP the device cannot do it (mapped mode needs
 *   host-location VMM), -EALREADY nothing to do (asleep already, or awake), -ENODEV the shim
 *   is not active. A result says what moved, also when the call failed part way. */
#define VMMSHIM_API_VERSION 6
int vmmshim_api_version(void);

#define VMMSHIM_TAG_MAX 32   /* bytes of a tag name, its terminating zero included */
#define VMMSHIM_MAX_TAGS 16  /* tags in a process, "untagged" included */

/* The calling thread's allocations go to tag (created on first use) from now on; NULL: back to
 * the process's tag. */
int vmmshim_set_tag(const char *tag);
/* The process's tag: that of every thread that set none. */
int vmmshim_set_process_tag(const char *tag);
/* The tag the calling thread's next allocation goes to, into buf (n bytes). */
int vmmshim_get_tag(char *buf, size_t n);
/* A tag marked keep is copied to host memory rather than discarded by a level-2 sleep. */
int vmmshim_set_tag_keep(const char *tag, int keep);
/* Replaces the tag rules (VMMSHIM_TAG_RULES, docs/tag-rules.md: "TAG=MATCHER;..."); NULL or ""
 * clears them. -EINVAL for a malformed spec, with err (errlen bytes; may be NULL) naming the rule
 * and the character where it goes wrong; the rules in force then stay. API 5 and later. */
int vmmshim_set_tag_rules(const char *spec, char *err, size_t errlen);

typedef enum vmmshim_sleep_mode_e {
  VMMSHIM_SLEEP_DISCARD = 0, /* the bytes are not kept; device memory is given back at once */
  VMMSHIM_SLEEP_HOST = 1,    /* the bytes are copied to host memory, and back on wake */
  VMMSHIM_SLEEP_MAPPED = 2,  /* the bytes move to host memory mapped at the same addresses: the
                                program keeps running on them, over the link, until the wake */
  VMMSHIM_SLEEP_DISK = 3     /* the bytes go to files (vmmshim_set_disk_dir), and back on wake;
                                all or nothing: a failed write leaves the tag awake. Since API 5 */
} vmmshim_sleep_mode_t;

#define VMMSHIM_WAKE_ZERO 1u /* discarded bytes wake as zeros (else undefined) */

typedef struct vmmshim_sleep_result_s {
  uint64_t released;    /* device bytes given back (sleep) */
  uint64_t restored;    /* device bytes mapped again (wake) */
  uint64_t to_host;     /* bytes copied to host memory (sleep) or back from it (wake) */
  uint64_t host_mapped; /* bytes now served from host memory at their addresses (sleep, mapped) */
  uint64_t discarded;   /* bytes not kept (sleep, discard) */
  uint64_t skipped;     /* bytes left on the device (sleep), or still asleep (wake) */
  uint64_t ns;          /* time the call took */
  int error;            /* what the call returned */
  char reason[160];     /* why bytes were skipped or the call failed, "" when neither */
} vmmshim_sleep_result_t;

/* Sleeps tag (NULL: every tag, "untagged" included: the whole process) in mode. First waits
 * for the GPU work that may touch the tag (the contexts that own it are synchronised; a
 * capture in progress is waited for, up to VMMSHIM_SLEEP_WAIT milliseconds, then -EBUSY), and
 * holds new kernel launches, copies and
 * memsets of the process at their driver entry until the move is done. out may be NULL;
 * size = sizeof(vmmshim_sleep_result_t). */
int vmmshim_sleep(const char *tag, vmmshim_sleep_mode_t mode, vmmshim_sleep_result_t *out, size_t size);
/* Wakes tag (NULL: every tag). When the device has no room, nothing changes (-ENOMEM): the tag
 * stays asleep with its bytes, and a later wake can succeed. */
int vmmshim_wake(const char *tag, unsigned flags, vmmshim_sleep_result_t *out, size_t size);
/* Whole-process levels: 0 gives back idle memory only (vmmshim_trim); 1 sleeps every tag in
 * host mode (mapped when mapped != 0); 2 discards every tag but those marked keep (host). */
int vmmshim_sleep_level(int level, int mapped, vmmshim_sleep_result_t *out, size_t size);

/* Where a tag's memory is, in bytes. */
typedef struct vmmshim_tag_stats_s {
  char name[VMMSHIM_TAG_MAX];
  uint64_t live;        /* in live blocks */
  uint64_t device;      /* mapped on the device */
  uint64_t host_copied; /* asleep, copied to host memory */
  uint64_t host_mapped; /* asleep, served from host memory at its addresses */
  uint64_t discarded;   /* asleep, not kept */
  int asleep;           /* 1 when any of its memory is asleep */
  int keep;             /* marked keep (vmmshim_set_tag_keep) */
  uint64_t disk;        /* asleep, in files (disk mode). Since API version 5 */
} vmmshim_tag_stats_t;

/* Fills out[0 .. max) with every tag's figures; returns how many tags there are. */
int vmmshim_tag_stats(vmmshim_tag_stats_t *out, int max, size_t size);
/* Host memory the shim holds for sleeping tags: in use, and kept for the next sleep. */
int vmmshim_host_memory(uint64_t *in_use, uint64_t *cached);
/* Gives the kept host memory back (keep: bytes to keep); returns the bytes given back. */
size_t vmmshim_release_host(size_t keep);
/* Where the bytes at addr are while its memory sleeps in host or mapped mode: *home, the address
 * in the host buffer that holds them, and *len, the bytes that follow it there (a range longer
 * than *len continues in another buffer: ask again at addr + *len). *home is a device address,
 * in host memory, that the device reads: copy from it with cuMemcpyDtoH or cudaMemcpy; it stays
 * valid until the memory wakes. Returns 0, -ENOENT (not asleep, discarded, or not the shim's),
 * -EINVAL, -ENODEV. Since API version 4. */
int vmmshim_host_copy(const void *addr, void **home, size_t *len);
/* The CPU's address of the size bytes at addr while its memory sleeps in host or mapped mode, when
 * they lie in one host buffer (buffers hold 64 MiB each, from the start of each segment of the
 * shim's pools) that the driver let the CPU access: the bytes themselves, no copy; a write
 * there changes what the wake restores. Valid until the memory wakes (then the buffer is kept
 * for the next sleep, or given back: vmmshim_release_host, VMMSHIM_HOST_LIMIT, after which the
 * address faults). Returns 0, -ENOENT (not asleep, or not the shim's), -EXDEV (discarded, on
 * disk, or spread over two buffers: copy it with vmmshim_host_copy), -ENOTSUP (the driver
 * refused the CPU access to host buffers), -EINVAL (host NULL or size 0), -ENODEV.
 * Since API version 6. */
int vmmshim_host_view(const void *addr, size_t size, void **host);
/* The directory of the files of disk-mode sleeps made from now on (VMMSHIM_DISK_DIR at start,
 * else $TMPDIR, else /tmp). Creates nothing: returns 0, or -ENOENT, -ENOTDIR, -EACCES (not a
 * writable directory), -EINVAL. Since API version 5. */
int vmmshim_set_disk_dir(const char *dir);

/* ---- past the limit (docs/limits.md) ----
 * With VMMSHIM_ON_LIMIT=host, growths the limit (VMMSHIM_LIMIT, a group's) refuses are served
 * from host memory mapped at the device addresses: the program keeps running on them, over the
 * link; vmmshim_tag_stats counts them in host_mapped (with asleep 0). vmmshim_promote moves them
 * into device memory at the same addresses, as many as the limit and the device have room for
 * now, after waiting for the process's GPU work (and for a capture in progress, as a sleep does).
 * The result: restored, the bytes moved to the device; skipped, those left on the host (reason
 * says why); released, host memory under no live block given back instead of moved. Returns 0,
 * -ENOMEM when none could move, -EALREADY when nothing is on the host, -EBUSY, -ENODEV. */
int vmmshim_promote(vmmshim_sleep_result_t *out, size_t size);

/* ---- the residue: what is still on the device, and who owns it (docs/sleep.md) ----
 * The shim computes one after every sleep (traced, and compared with the one after the first
 * sleep: growth is logged as a warning with the call sites that grew); vmmshim_residue computes
 * one now. Since API version 5. */
#define VMMSHIM_RESIDUE_DEVICES 8
#define VMMSHIM_RESIDUE_LIBS 8
#define VMMSHIM_RESIDUE_SITES 8
typedef struct vmmshim_residue_device_s {
  int device;
  int measured;        /* 1 when the driver answered cuMemGetInfo for it */
  uint64_t total, free, used; /* used = total - free: every process's */
  uint64_t tags;       /* the shim's pools: awake tags, and what stays of sleeping ones */
  uint64_t libraries;  /* VMM memory libraries made themselves (cuMemCreate) */
  uint64_t managed;    /* managed memory (cuMemAllocManaged), as allocated */
  uint64_t graph;      /* graph memory (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) */
  uint64_t arrays;     /* CUDA arrays, by the free memory their creation took */
  uint64_t context;    /* contexts, by the free memory their creation took (0: not measured) */
  uint64_t others;     /* other processes (NVML; 0 without it) */
  int64_t unexplained; /* used - every owner (with modules and inferred below) */
  int64_t growth;      /* used now - used at the first residue after a sleep */
  uint64_t modules;    /* loaded modules and libraries, by the free memory their load took */
  uint64_t process;    /* this process's bytes by NVML (0: NVML does not list its pid) */
  uint64_t inferred;   /* process - every owner measured in it, when positive: memory the driver
                          took later (kernels loaded at first launch, its own buffers) */
} vmmshim_residue_device_t;
typedef struct vmmshim_residue_lib_s {
  char name[64];       /* the shared object that asked (file name) */
  uint64_t vmm, managed, host, arrays; /* its own VMM memory, managed memory, pinned host memory, arrays */
} vmmshim_residue_lib_t;
typedef struct vmmshim_residue_site_s {
  char lib[64];
  uint64_t addr;       /* the return address into lib (absolute); 0: every other site */
  uint32_t stack;      /* the trace's stack id (VMMSHIM_TRACE_STACKS), 0 when none */
  char python[96];     /* with stacks: the innermost Python frame, "FILE:LINE FUNCTION"; "" when none */
  int kind;            /* 0 VMM, 1 managed, 2 pinned host, 3 arrays */
  uint64_t bytes;      /* live now */
  int64_t growth;      /* bytes - bytes at the first residue after a sleep */
  uint64_t offset;     /* addr - lib's load base (dladdr's dli_fbase); addr when unknown */
  char symbol[64];     /* the symbol around addr and the offset in it, "NAME+0xOFF"; "" when none */
} vmmshim_residue_site_t;
typedef struct vmmshim_residue_s {
  uint64_t seq;        /* residues after sleeps so far (0: no sleep yet) */
  int ndevices, nlibs, nsites;
  vmmshim_residue_device_t devices[VMMSHIM_RESIDUE_DEVICES];
  vmmshim_residue_lib_t libs[VMMSHIM_RESIDUE_LIBS];    /* the largest first */
  vmmshim_residue_site_t sites[VMMSHIM_RESIDUE_SITES]; /* the largest first */
  uint64_t host_pinned; /* pinned host memory made outside the shim (not the device's) */
  uint64_t shared;      /* of libraries: VMM memory made exportable or imported */
  int others_known;     /* 1: NVML answered for other processes */
  char note[160];       /* what could not be measured, "" when all was */
} vmmshim_residue_t;
/* Fills out (size = sizeof(vmmshim_residue_t)) with the residue now: 0, -EINVAL, -ENODEV. */
int vmmshim_residue(vmmshim_residue_t *out, size_t size);

#ifdef __cplusplus
}
#endif
#endif
