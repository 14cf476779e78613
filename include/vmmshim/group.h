/* The layout of a group's shared-memory segment (src/handle/group.c; docs/limits.md).
 *
 * /dev/shm/vmmshim-<uid>-<name>, mode 0600, owned by its user: a header of VS_GROUP_HEADER
 * bytes, then VS_GROUP_MEMBERS member slots of VS_GROUP_MEMBER bytes. Native byte order (the
 * members run on one host). scripts/python/vmmshim/group_shm.py (vmmshim ctl --group) reads and writes the same layout with
 * struct: a change here is a new VS_GROUP_VERSION, and a change there.
 *
 * Before any lock, a process checks on the opened descriptor that the file is a regular file of
 * its user with no access for others; a joining process waits for the lock a few seconds at most.
 * Locking: every change is made under flock(LOCK_EX) on the segment's descriptor (the kernel
 * lets go of it when its holder dies, kill -9 included), with `busy` set to the writer's pid
 * for the time of the change: a holder that finds `busy` set finds a change cut short by a
 * death, and counts the totals again from the member slots. The totals and limits are 8-byte
 * aligned and read without the lock (cudaMemGetInfo, the pressure on frees). */
#ifndef VMMSHIM_GROUP_H
#define VMMSHIM_GROUP_H

#include <stdint.h>

#define VS_GROUP_MAGIC "VMMSHGRP" /* 8 bytes, no terminating zero in the segment */
#define VS_GROUP_VERSION 2u
#define VS_GROUP_DEVICES 16  /* devices counted one by one (VS_LIMIT_DEVICES) */
#define VS_GROUP_MEMBERS 256 /* processes in a group at once */
#define VS_GROUP_CRC_BYTES 72 /* the header's fixed part, which `crc` covers */

/* Where the limit was set: a member's VMMSHIM_LIMIT is taken while the group has no other live
 * member, or no limit was ever set; one set by vmmshim ctl stays until ctl changes it. */
enum { VS_GROUP_LIMIT_UNSET = 0, VS_GROUP_LIMIT_ENV = 1, VS_GROUP_LIMIT_CTL = 2 };

typedef struct vs_group_member_s {
  uint32_t pid;   /* 0: a free slot */
  uint32_t flags; /* none yet */
  uint64_t start; /* the process's start time, /proc/PID/stat field 22: with pid, who it is */
  char comm[16];  /* its name, for status */
  uint64_t mapped_all;                  /* device bytes it maps, every device */
  uint64_t host_all;                    /* bytes it serves from host memory past the limit */
  uint64_t mapped[VS_GROUP_DEVICES];    /* by device */
  uint64_t host[VS_GROUP_DEVICES];
  /* ballooning (src/handle/group_members.c, src/alloc/balloon.c) */
  int32_t priority;     /* VMMSHIM_PRIORITY, or vmmshim ctl PID priority N: higher borrows from lower */
  uint32_t lending;     /* 1 while memory of it is out of the device for another member */
  uint64_t lent;        /* device bytes it moved out for higher members, still out */
  uint64_t borrowed;    /* device bytes lower members moved out for its growths, still out */
  uint32_t demotions;   /* times it lent */
  uint32_t promotions;  /* times memory it lent came back */
} vs_group_member_t;

typedef struct vs_group_header_s {
  /* fixed at creation, covered by crc */
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint32_t member_size;
  uint32_t max_members;
  uint32_t max_devices;
  uint32_t uid;
  uint64_t pidns; /* inode of the creator's /proc/self/ns/pid: members share a pid namespace */
  char name[32];
  uint32_t crc;   /* CRC-32 (zlib's) of the bytes before it */
  /* changed under the lock */
  uint32_t busy;        /* pid of the process in the middle of a change; 0: consistent */
  uint32_t release_seq; /* futex word: bumped when bytes come back or the limit changes */
  uint32_t waiters;     /* members waiting for bytes: frees give idle memory back meanwhile */
  uint32_t limit_source; /* VS_GROUP_LIMIT_* */
  uint32_t limit_gen;    /* bumped at every change of the limit */
  uint64_t limit_all;    /* every device together; 0: none */
  uint64_t limit[VS_GROUP_DEVICES];
  uint64_t total_all;    /* the members' mapped bytes, summed */
  uint64_t total[VS_GROUP_DEVICES];
  uint64_t host_all;     /* the members' host bytes, summed */
  uint64_t admitted;     /* growths admitted */
  uint64_t refused;      /* growths refused */
  uint64_t reclaimed;    /* bytes of members that died, returned */
  uint32_t members;      /* live member slots */
  uint32_t reserved0;
  uint8_t reserved[104];
} vs_group_header_t;

#define VS_GROUP_HEADER 512u
#define VS_GROUP_MEMBER 336u
#define VS_GROUP_SIZE (VS_GROUP_HEADER + VS_GROUP_MEMBERS * VS_GROUP_MEMBER)

#ifdef __cplusplus
#define VS_GROUP_ASSERT static_assert
#else
#define VS_GROUP_ASSERT _Static_assert
#endif
VS_GROUP_ASSERT(sizeof(vs_group_header_t) == VS_GROUP_HEADER, "group header layout");
VS_GROUP_ASSERT(sizeof(vs_group_member_t) == VS_GROUP_MEMBER, "group member layout");
VS_GROUP_ASSERT(__builtin_offsetof(vs_group_header_t, crc) == VS_GROUP_CRC_BYTES, "crc offset");

static inline vs_group_member_t *vs_group_members(vs_group_header_t *h) {
  return (vs_group_member_t *)((char *)h + VS_GROUP_HEADER);
}

#endif
