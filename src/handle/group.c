/* group.c: the budget. VMMSHIM_LIMIT shared by the processes of a group, or per device.
 *
 * With VMMSHIM_LIMIT_GROUP=NAME, every process of that name and user counts the device bytes it
 * maps, per device, in one shared-memory segment, /dev/shm/vmmshim-<uid>-<NAME> (the layout is
 * in vmmshim/group.h), and every growth and every wake is admitted against the group's totals:
 * _vs_mapped_admit (handles.c) asks here after its own count, _vs_mapped_return gives back.
 * Without a group, a per-device cap (VMMSHIM_LIMIT=0:8G) or VMMSHIM_ON_LIMIT=wait gives the
 * process a budget of its own, in anonymous memory of the same layout, through the same code.
 * A group whose segment cannot be used (another user's, locked past a bound, another version,
 * corrupt, full) is refused with one error line saying why, and every device allocation of the
 * process then fails: a process told to share a budget never runs without one (its limit may
 * only ever have been set through the group).
 *
 * The segment's file is checked (regular, this user's, no access for others) on the opened
 * descriptor before any lock: another user's file could be held locked by that user. The join
 * waits for the lock a few seconds at most (VS_GROUP_LOCK_WAIT_NS); once joined, only this
 * user's processes can open the file, and the lock is taken without a bound.
 *
 * Why a lock (flock on the segment) rather than an atomic add-then-check-then-undo: the kernel
 * lets go of a flock when its holder dies, kill -9 included, so no death leaves the group locked;
 * every change is made under it with `busy` naming the writer, so a change cut short by a death
 * is seen by the next holder, which counts the totals again from the member slots (an atomic
 * add whose process died before its undo would stay counted with nobody to return it); the
 * Python client (vmmshim ctl --group, scripts/python/vmmshim/group_shm.py) takes the same lock with fcntl.flock, where a robust
 * pthread mutex would put glibc's mutex layout into the file format. Its cost, two system calls,
 * is paid at a growth (which makes driver calls of tens of microseconds), never per allocation.
 * A flock does not exclude the threads of one process (they share the descriptor): a mutex of
 * the process is taken first.
 *
 * A member is its pid and its start time (/proc/PID/stat field 22): a dead member (or one whose
 * pid now names another process) is found when an admission does not fit, and its bytes go back
 * before that admission is decided. Members must share a pid namespace (checked at the join). */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "vmmshim/handles.h"

#define WAIT_SLICE_NS 500000000ull /* a waiter tries again at least this often */
#define VS_GROUP_LOCK_WAIT_NS 5000000000ull /* the join waits this long at most for the segment's lock */
#define FLAG_WAITING 0xffffu      /* member flags: threads of the member waiting for bytes */

typedef struct vs_budget_s {
  vs_group_header_t *h;
  vs_group_member_t *me;
  int fd;          /* the segment's descriptor; -1: this process's own budget */
  bool shared;     /* a group's segment */
  bool left;       /* at exit: the member has left, nothing is counted any more */
  bool closed;     /* a group is named and cannot be joined: every growth is refused */
  char shm[80];    /* the segment's name under /dev/shm */
  char name[32];
  uint64_t start;  /* this process's start time */
} vs_budget_t;

static vs_budget_t vs_b = {.fd = -1};
static atomic_int vs_budget_state; /* 0 not yet known, 1 on, 2 off */
static pthread_once_t vs_budget_once = PTHREAD_ONCE_INIT;
static vs_lock_t vs_budget_mutex = VS_LOCK_INITIALIZER(VS_RANK_BUDGET, "budget");
static atomic_bool vs_budget_forked; /* a fork child that has not joined as itself yet */
static atomic_size_t vs_spilled;     /* bytes served from host memory past the limit */
const uint32_t *_Atomic _vs_budget_waiters;

/* The release_seq seen by this thread's last refused admission: a wait sleeps until it moves. */
static _Thread_local uint32_t tl_refused_seq;
static _Thread_local bool tl_refused;

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ helpers */

/* zlib's CRC-32 (Python's zlib.crc32 computes the same). */
static uint32_t crc32_of(const void *data, size_t n) {
  const unsigned char *p = data;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

int _vs_proc_start(pid_t pid, uint64_t *start, char *state) {
  char path[40], buf[1024];
  if (pid) snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  else snprintf(path, sizeof path, "/proc/self/stat");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? -ENOENT : -errno;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int err = errno;
  close(fd);
  if (n <= 0) return n == 0 || err == ESRCH ? -ENOENT : -err;
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses: the fields follow the last ')' */
  if (!p) return -EIO;
  p++;
  /* Field 3 is the state; field 22 the start time. */
  int field = 2;
  char *tok, *save = NULL;
  for (tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
    field++;
    if (field == 3 && state) *state = tok[0];
    if (field == 22) {
      *start = strtoull(tok, NULL, 10);
      return 0;
    }
  }
  return -EIO;
}

/* The member is the process it names, alive (a zombie has given its GPU memory back). */
static bool member_alive(const vs_group_member_t *m) {
  uint64_t start = 0;
  char state = 0;
  int r = _vs_proc_start((pid_t)m->pid, &start, &state);
  if (r == -ENOENT) return false;
  if (r != 0) return true; /* cannot be told: kept */
  return start == m->start && state != 'Z' && state != 'X';
}

static uint64_t pidns_inode(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void header_init(vs_group_header_t *h, const char *name) {
  memset(h, 0, VS_GROUP_SIZE);
  memcpy(h->magic, VS_GROUP_MAGIC, 8);
  h->version = VS_GROUP_VERSION;
  h->header_size = VS_GROUP_HEADER;
  h->member_size = VS_GROUP_MEMBER;
  h->max_members = VS_GROUP_MEMBERS;
  h->max_devices = VS_GROUP_DEVICES;
  h->uid = (uint32_t)geteuid();
  h->pidns = pidns_inode();
  snprintf(h->name, sizeof h->name, "%s", name);
  h->crc = crc32_of(h, VS_GROUP_CRC_BYTES);
}

/* ------------------------------------------------------------------ the lock */

static void lock_fd(int fd, int op) {
  if (fd >= 0)
    while (flock(fd, op) != 0 && errno == EINTR) {
    }
}

/* What the member slots add up to. */
typedef struct vs_sums_s {
  uint64_t all, host, dev[VS_GROUP_DEVICES];
  uint32_t members, waiters;
} vs_sums_t;

static void sum_members(vs_group_header_t *h, vs_sums_t *s) {
  memset(s, 0, sizeof *s);
  const vs_group_member_t *m = vs_group_members(h);
  for (unsigned i = 0; i < VS_GROUP_MEMBERS; i++) {
    if (!m[i].pid) continue;
    s->members++;
    s->waiters += m[i].flags & FLAG_WAITING;
    s->all += m[i].mapped_all;
    s->host += m[i].host_all;
    for (int d = 0; d < VS_GROUP_DEVICES; d++) s->dev[d] += m[i].mapped[d];
  }
}

/* The totals counted again from the member slots: after a change cut short by a death. */
static void recount(vs_group_header_t *h) {
  vs_sums_t s;
  sum_members(h, &s);
  ST(h->total_all, s.all);
  ST(h->host_all, s.host);
  for (int d = 0; d < VS_GROUP_DEVICES; d++) ST(h->total[d], s.dev[d]);
  ST(h->members, s.members);
  ST(h->waiters, s.waiters);
}

static void begin_change(vs_group_header_t *h) { __atomic_store_n(&h->busy, (uint32_t)getpid(), __ATOMIC_SEQ_CST); }
static void end_change(vs_group_header_t *h) { __atomic_store_n(&h->busy, 0, __ATOMIC_RELEASE); }

static void budget_rejoin(void);

/* The process's mutex, then the segment's flock; a change left half done by a death is mended. */
static void budget_lock(void) {
  _vs_lock_take(&vs_budget_mutex);
  if (vs_unlikely(atomic_load_explicit(&vs_budget_forked, memory_order_relaxed))) budget_rejoin();
  lock_fd(vs_b.fd, LOCK_EX);
  if (vs_unlikely(vs_b.h && LD(vs_b.h->busy) != 0)) {
    recount(vs_b.h);
    end_change(vs_b.h);
  }
}

static void budget_unlock(void) {
  lock_fd(vs_b.fd, LOCK_UN);
  _vs_lock_release(&vs_budget_mutex);
}

static void futex_wake_all(uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0); }

/* ------------------------------------------------------------------ counting (lock held) */

static void count_mapped(vs_group_header_t *h, vs_group_member_t *m, int dev, uint64_t len, bool add) {
  bool one = dev >= 0 && dev < VS_GROUP_DEVICES;
  if (!add) { /* never more than the member has: a fork child returns its parent's bytes */
    if (len > m->mapped_all) len = m->mapped_all;
    if (one && len > m->mapped[dev]) len = m->mapped[dev];
  }
  uint64_t sign = add ? len : 0 - len;
  m->mapped_all += sign;
  ST(h->total_all, LD(h->total_all) + sign);
  if (one) {
    m->mapped[dev] += sign;
    ST(h->total[dev], LD(h->total[dev]) + sign);
  }
}

static void count_host(vs_group_header_t *h, vs_group_member_t *m, int dev, uint64_t len, bool add) {
  bool one = dev >= 0 && dev < VS_GROUP_DEVICES;
  if (!add) {
    if (len > m->host_all) len = m->host_all;
    if (one && len > m->host[dev]) len = m->host[dev];
  }
  uint64_t sign = add ? len : 0 - len;
  m->host_all += sign;
  ST(h->host_all, LD(h->host_all) + sign);
  if (one) m->host[dev] += sign;
}

/* Whether len more bytes on dev fit under the limits (values read once each). */
static bool fits(const vs_group_header_t *h, int dev, uint64_t len) {
  uint64_t la = LD(h->limit_all), ta = LD(h->total_all);
  if (la && (ta > la || len > la - ta)) return false;
  if (dev >= 0 && dev < VS_GROUP_DEVICES) {
    uint64_t ld = LD(h->limit[dev]), td = LD(h->total[dev]);
    if (ld && (td > ld || len > ld - td)) return false;
  }
  return true;
}

/* Members that died (or whose pid names another process now): their bytes go back. Returns
 * whether any was found. */
static bool reclaim_dead(vs_group_header_t *h, const vs_group_member_t *self) {
  vs_group_member_t *m = vs_group_members(h);
  bool any = false;
  for (unsigned i = 0; i < VS_GROUP_MEMBERS; i++) {
    if (!m[i].pid || &m[i] == self || member_alive(&m[i])) continue;
    begin_change(h);
    uint64_t bytes = m[i].mapped_all;
    memset(&m[i], 0, sizeof m[i]);
    recount(h);
    ST(h->reclaimed, LD(h->reclaimed) + bytes);
    ST(h->release_seq, LD(h->release_seq) + 1);
    end_change(h);
    _vs_info("group '%s': a member that died held %llu bytes: returned", h->name, (unsigned long long)bytes);
    any = true;
  }
  return any;
}

static bool live_others(const vs_group_header_t *h, const vs_group_member_t *self) {
  const vs_group_member_t *m = vs_group_members((vs_group_header_t *)h);
  for (unsigned i = 0; i < VS_GROUP_MEMBERS; i++)
    if (m[i].pid && &m[i] != self) return true;
  return false;
}

/* VMMSHIM_LIMIT into the segment: when no limit was ever set, or the last one came from a
 * member's environment and no other member lives. An unconfigured process never sets one. */
static void take_limits(vs_group_header_t *h, const vs_group_member_t *self) {
  uint64_t all = _vs_limit_setting(-1), dev[VS_GROUP_DEVICES];
  bool any = all != 0, differs = LD(h->limit_all) != all;
  for (int d = 0; d < VS_GROUP_DEVICES; d++) {
    dev[d] = _vs_limit_setting(d);
    any |= dev[d] != 0;
    differs |= LD(h->limit[d]) != dev[d];
  }
  if (!any || !differs) return;
  uint32_t src = LD(h->limit_source);
  if (src == VS_GROUP_LIMIT_UNSET || (src == VS_GROUP_LIMIT_ENV && !live_others(h, self))) {
    begin_change(h);
    ST(h->limit_all, all);
    for (int d = 0; d < VS_GROUP_DEVICES; d++) ST(h->limit[d], dev[d]);
    ST(h->limit_source, (uint32_t)VS_GROUP_LIMIT_ENV);
    ST(h->limit_gen, LD(h->limit_gen) + 1);
    ST(h->release_seq, LD(h->release_seq) + 1);
    end_change(h);
  } else {
    _vs_warn("group '%s' keeps the limit %s set (every device: %llu bytes); this process's VMMSHIM_LIMIT=%s is not "
             "taken (vmmshim ctl --group %s limit SIZE changes it)",
             h->name, src == VS_GROUP_LIMIT_CTL ? "vmmshim ctl" : "its first member", (unsigned long long)LD(h->limit_all),
             _vs_option_string(VS_OPT_LIMIT) ? _vs_option_string(VS_OPT_LIMIT) : "", h->name);
  }
}

/* A member slot for this process, counters at zero (after the dead are returned); NULL when
 * every slot is taken. */
static vs_group_member_t *join(vs_group_header_t *h) {
  reclaim_dead(h, NULL);
  vs_group_member_t *m = vs_group_members(h);
  for (unsigned i = 0; i < VS_GROUP_MEMBERS; i++) {
    if (m[i].pid) continue;
    begin_change(h);
    memset(&m[i], 0, sizeof m[i]);
    m[i].pid = (uint32_t)getpid();
    m[i].start = vs_b.start;
    char comm[32] = "";
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t n = read(fd, comm, sizeof comm - 1);
      close(fd);
      comm[n > 0 ? n : 0] = 0;
      comm[strcspn(comm, "\n")] = 0;
    }
    snprintf(m[i].comm, sizeof m[i].comm, "%.15s", comm);
    m[i].priority = (int32_t)_vs_option(VS_OPT_PRIORITY);
    ST(h->members, LD(h->members) + 1);
    end_change(h);
    return &m[i];
  }
  return NULL;
}

/* ------------------------------------------------------------------ the segment */

/* The segment's descriptor, the existing file first: creating over another user's file in
 * /dev/shm (sticky) may be refused before its owner can be told (fs.protected_regular). No
 * symbolic link is followed (O_NOFOLLOW), no FIFO waited on (O_NONBLOCK). -1 with why[] filled. */
static int seg_open_fd(const char *path, char *why, size_t n) {
  const int flags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  int fd = open(path, flags);
  if (fd < 0 && errno == ENOENT) {
    fd = open(path, flags | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) fchmod(fd, 0600); /* whatever the umask */
    else if (errno == EEXIST) fd = open(path, flags);
  }
  if (fd < 0)
    snprintf(why, n, "cannot open %s: %s", path, errno == ELOOP ? "it is a symbolic link" : strerror(errno));
  return fd;
}

/* Before any lock: only a regular file of this user that no one else can write is used. Another
 * user's file could be held locked by that user, and hang whoever waits for its lock. */
static bool seg_file_ours(int fd, const char *path, struct stat *st, char *why, size_t n) {
  if (fstat(fd, st) != 0) {
    snprintf(why, n, "cannot stat %s: %s", path, strerror(errno));
    return false;
  }
  if (S_ISREG(st->st_mode) && st->st_uid == geteuid() && !(st->st_mode & 077)) return true;
  snprintf(why, n,
           "%s is owned by uid %u with mode 0%o: not this user's own (uid %u, 0600); it is not used: its owner or root "
           "can remove it, or choose another VMMSHIM_LIMIT_GROUP name",
           path, (unsigned)st->st_uid, (unsigned)(st->st_mode & 0777), (unsigned)geteuid());
  return false;
}

/* flock(LOCK_EX) within VS_GROUP_LOCK_WAIT_NS: a holder that never lets go (a member stopped in
 * the middle of a change) must not hang the join. Tries a little further apart each time. */
static bool seg_lock_bounded(int fd, const char *path, char *why, size_t n) {
  uint64_t end = _vs_now_ns() + VS_GROUP_LOCK_WAIT_NS;
  unsigned us = 100;
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      snprintf(why, n, "cannot lock %s: %s", path, strerror(errno));
      return false;
    }
    if (_vs_now_ns() >= end) break;
    _vs_sleep_us(us);
    if (us < 50000) us *= 2;
  }
  snprintf(why, n,
           "%s (uid %u) stayed locked by another process for %llu s: a member of the group is stopped or hung in the "
           "middle of a change; resume or end it (fuser -v %s lists the processes that have it open)",
           path, (unsigned)geteuid(), (unsigned long long)(VS_GROUP_LOCK_WAIT_NS / 1000000000ull), path);
  return false;
}

static vs_group_header_t *seg_map(int fd, const char *path, char *why, size_t n) {
  vs_group_header_t *h = mmap(NULL, VS_GROUP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (h != MAP_FAILED) return h;
  snprintf(why, n, "cannot map %s: %s", path, strerror(errno));
  return NULL;
}

/* A new segment (size 0: made here, or by a process that has not sized it yet), lock held. */
static vs_group_header_t *seg_create(int fd, const char *path, const char *name, char *why, size_t n) {
  if (ftruncate(fd, VS_GROUP_SIZE) != 0) {
    snprintf(why, n, "cannot size %s: %s", path, strerror(errno));
    return NULL;
  }
  vs_group_header_t *h = seg_map(fd, path, why, n);
  if (h) header_init(h, name);
  return h;
}

/* The fixed header of an existing segment, read under the lock (its creator writes it there). */
static bool seg_header_ok(int fd, off_t size, const char *path, const char *name, char *why, size_t n) {
  vs_group_header_t head;
  memset(&head, 0, sizeof head);
  ssize_t got = pread(fd, &head, sizeof head, 0);
  uint32_t crc = crc32_of(&head, VS_GROUP_CRC_BYTES);
  if (got < (ssize_t)sizeof head || memcmp(head.magic, VS_GROUP_MAGIC, 8))
    snprintf(why, n, "%s is corrupt (no vmmshim group header)", path);
  else if (head.crc != crc)
    snprintf(why, n, "%s is corrupt (header checksum 0x%08x, the header sums to 0x%08x)", path, head.crc, crc);
  else if (head.version != VS_GROUP_VERSION)
    snprintf(why, n, "%s has layout version %u, this vmmshim reads version %u (another release made it)", path,
             head.version, VS_GROUP_VERSION);
  else if (size != VS_GROUP_SIZE || head.header_size != VS_GROUP_HEADER || head.member_size != VS_GROUP_MEMBER ||
           head.max_members != VS_GROUP_MEMBERS || head.max_devices != VS_GROUP_DEVICES)
    snprintf(why, n, "%s is corrupt (its sizes are not those of version %u)", path, VS_GROUP_VERSION);
  else if (head.uid != geteuid() || strncmp(head.name, name, sizeof head.name))
    snprintf(why, n, "%s is corrupt (it names uid %u, group '%.31s')", path, head.uid, head.name);
  else if (head.pidns != pidns_inode())
    snprintf(why, n, "%s belongs to processes of another pid namespace (their pids mean nothing here)", path);
  else
    return true;
  return false;
}

/* The totals must be the members' sums (a change cut short by a death says so in busy). */
static bool seg_totals_ok(vs_group_header_t *h, const char *path, char *why, size_t n) {
  if (LD(h->busy)) {
    recount(h);
    end_change(h);
  }
  vs_sums_t sums;
  sum_members(h, &sums);
  bool ok = sums.all == h->total_all && sums.host == h->host_all && sums.members == h->members;
  for (int d = 0; d < VS_GROUP_DEVICES; d++) ok &= sums.dev[d] == h->total[d];
  if (!ok) snprintf(why, n, "%s is corrupt (its totals are not the sums of its members)", path);
  return ok;
}

/* Opens the group's segment (made, under the lock, by whichever process comes first), checks
 * it and returns it locked; NULL with why[] filled when it must not be used. */
static vs_group_header_t *open_segment(const char *name, int *fd_out, char *why, size_t n) {
  char path[96];
  snprintf(path, sizeof path, "/dev/shm%s", vs_b.shm);
  int fd = seg_open_fd(path, why, n);
  if (fd < 0) return NULL;
  struct stat st;
  vs_group_header_t *h = NULL;
  if (!seg_file_ours(fd, path, &st, why, n) || !seg_lock_bounded(fd, path, why, n)) {
    close(fd);
    return NULL;
  }
  if (fstat(fd, &st) != 0) /* again under the lock: the size its creator gave it */
    snprintf(why, n, "cannot stat %s: %s", path, strerror(errno));
  else if (st.st_size == 0)
    h = seg_create(fd, path, name, why, n);
  else if (seg_header_ok(fd, st.st_size, path, name, why, n) && (h = seg_map(fd, path, why, n)) &&
           !seg_totals_ok(h, path, why, n)) {
    munmap(h, VS_GROUP_SIZE);
    h = NULL;
  }
  if (!h) {
    lock_fd(fd, LOCK_UN);
    close(fd);
    return NULL;
  }
  *fd_out = fd;
  return h;
}

static vs_group_header_t *private_segment(void) {
  vs_group_header_t *h = mmap(NULL, VS_GROUP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (h == MAP_FAILED) return NULL;
  header_init(h, "");
  return h;
}

static void budget_leave(void);
static void atfork_prepare(void) { _vs_lock_take_at_fork(&vs_budget_mutex); }
static void atfork_parent(void) { _vs_lock_release(&vs_budget_mutex); }
static void atfork_child(void) {
  atomic_store(&vs_budget_forked, true);
  _vs_lock_release(&vs_budget_mutex);
}

/* Joins the group, or makes the process's own budget. Returns false when neither can be had. */
static bool budget_open(bool announce) {
  const char *name = _vs_option_string(VS_OPT_LIMIT_GROUP);
  char why[400] = "";
  vs_group_header_t *h = NULL;
  int fd = -1;
  vs_b.me = NULL;
  if (name) {
    snprintf(vs_b.name, sizeof vs_b.name, "%s", name);
    snprintf(vs_b.shm, sizeof vs_b.shm, "/vmmshim-%u-%s", (unsigned)geteuid(), name);
    h = open_segment(name, &fd, why, sizeof why);
    if (h) {
      vs_b.h = h;
      vs_b.me = join(h);
      if (vs_b.me) take_limits(h, vs_b.me);
      else snprintf(why, sizeof why, "/dev/shm%s has no free member slot (%u processes)", vs_b.shm, VS_GROUP_MEMBERS);
      lock_fd(fd, LOCK_UN);
      if (!vs_b.me) {
        munmap(h, VS_GROUP_SIZE);
        close(fd);
        h = NULL;
        fd = -1;
      }
    }
    if (!h)
      _vs_error("group '%s': %s; without its group's budget, every device allocation of this process fails "
                "(out of memory, %s)",
                name, why, _vs_cu_error_name(CUDA_ERROR_OUT_OF_MEMORY));
  }
  vs_b.shared = h != NULL;
  vs_b.closed = name && !h;
  if (!h) {
    h = private_segment();
    if (!h) {
      _vs_warn("no memory for the budget of VMMSHIM_LIMIT (%s): the limit is not applied", strerror(errno));
      return false;
    }
    vs_b.h = h;
    vs_b.me = join(h);
    take_limits(h, vs_b.me);
  }
  vs_b.fd = fd;
  atomic_store(&_vs_budget_waiters, &h->waiters);
  if (announce && vs_b.shared)
    _vs_info("group '%s': joined /dev/shm%s (%u members, limit %llu bytes every device)", vs_b.name, vs_b.shm,
             (unsigned)LD(h->members), (unsigned long long)LD(h->limit_all));
  return true;
}

static void budget_init(void) {
  if (!_vs_limit_in_budget()) {
    atomic_store(&vs_budget_state, 2);
    return;
  }
  uint64_t start = 0;
  _vs_proc_start(getpid(), &start, NULL);
  vs_b.start = start;
  if (!budget_open(true)) {
    atomic_store(&vs_budget_state, 2);
    return;
  }
  atexit(budget_leave);
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  atomic_store(&vs_budget_state, 1);
}

/* A fork child: the descriptor it inherited shares its parent's flock (and a private budget its
 * parent's memory): it joins again as itself. Under the process's mutex. */
static void budget_rejoin(void) {
  atomic_store(&vs_budget_forked, false);
  atomic_store(&_vs_budget_waiters, NULL);
  if (vs_b.fd >= 0) close(vs_b.fd);
  vs_b.fd = -1;
  if (vs_b.h) munmap(vs_b.h, VS_GROUP_SIZE);
  vs_b.h = NULL;
  uint64_t start = 0;
  _vs_proc_start(getpid(), &start, NULL);
  vs_b.start = start;
  if (!budget_open(false)) vs_b.left = true;
}

static bool budget_on(void) {
  pthread_once(&vs_budget_once, budget_init);
  return atomic_load_explicit(&vs_budget_state, memory_order_relaxed) == 1 && !vs_b.left;
}

/* At exit: the member's bytes go back to the group (the driver frees them with the process). */
static void budget_leave(void) {
  /* A fork child that never joined as itself has nothing counted (its parent's slot is not its). */
  if (atomic_load(&vs_budget_state) != 1 || atomic_load(&vs_budget_forked)) return;
  budget_lock();
  if (!vs_b.h) {
    budget_unlock();
    return;
  }
  if (!vs_b.left && vs_b.me) {
    vs_group_header_t *h = vs_b.h;
    begin_change(h);
    memset(vs_b.me, 0, sizeof *vs_b.me);
    recount(h);
    ST(h->release_seq, LD(h->release_seq) + 1);
    end_change(h);
    vs_b.left = true;
  }
  uint32_t waiters = LD(vs_b.h->waiters);
  budget_unlock();
  if (waiters) futex_wake_all(&vs_b.h->release_seq);
}

/* ------------------------------------------------------------------ admissions */

void _vs_group_join(void) { (void)budget_on(); }

bool _vs_group_admit(int dev, size_t len) {
  if (vs_likely(!budget_on())) return !vs_b.closed; /* refused even with no memory for a budget */
  if (vs_unlikely(vs_b.closed)) return false;
  budget_lock();
  vs_group_header_t *h = vs_b.h;
  bool ok = fits(h, dev, len);
  if (!ok && reclaim_dead(h, vs_b.me)) ok = fits(h, dev, len);
  begin_change(h);
  if (ok) {
    count_mapped(h, vs_b.me, dev, len, true);
    ST(h->admitted, LD(h->admitted) + 1);
  } else {
    ST(h->refused, LD(h->refused) + 1);
    tl_refused_seq = LD(h->release_seq);
    tl_refused = true;
  }
  end_change(h);
  budget_unlock();
  return ok;
}

void _vs_group_return(int dev, size_t len) {
  if (vs_likely(!budget_on())) return;
  budget_lock();
  vs_group_header_t *h = vs_b.h;
  begin_change(h);
  count_mapped(h, vs_b.me, dev, len, false);
  ST(h->release_seq, LD(h->release_seq) + 1);
  end_change(h);
  uint32_t waiters = LD(h->waiters);
  budget_unlock();
  if (waiters) futex_wake_all(&h->release_seq);
}

bool _vs_group_over(int dev, size_t len) { return budget_on() ? vs_b.closed || !fits(vs_b.h, dev, len) : vs_b.closed; }

bool _vs_group_headroom(int dev, size_t *left, size_t *cap) {
  if (!budget_on()) return false;
  if (vs_b.closed) { /* nothing is left; the device's size stays what it is */
    *left = 0;
    *cap = SIZE_MAX;
    return true;
  }
  const vs_group_header_t *h = vs_b.h;
  uint64_t c = UINT64_MAX, l = UINT64_MAX;
  uint64_t la = LD(h->limit_all), ta = LD(h->total_all);
  if (la) {
    c = la;
    l = ta >= la ? 0 : la - ta; /* never below zero, whatever a lowered limit left */
  }
  if (dev >= 0 && dev < VS_GROUP_DEVICES) {
    uint64_t ld = LD(h->limit[dev]), td = LD(h->total[dev]);
    if (ld) {
      if (ld < c) c = ld;
      uint64_t ldl = td >= ld ? 0 : ld - td;
      if (ldl < l) l = ldl;
    }
  }
  if (c == UINT64_MAX) return false;
  *left = (size_t)l;
  *cap = (size_t)c;
  return true;
}

bool _vs_group_wait(uint64_t deadline_ns) {
  if (!budget_on()) return false;
  vs_group_header_t *h = vs_b.h;
  budget_lock();
  uint32_t seen = tl_refused ? tl_refused_seq : LD(h->release_seq);
  tl_refused = false;
  begin_change(h);
  vs_b.me->flags++;
  ST(h->waiters, LD(h->waiters) + 1);
  end_change(h);
  budget_unlock();

  uint64_t now = _vs_now_ns();
  if (LD(h->release_seq) == seen && now < deadline_ns) {
    uint64_t ns = deadline_ns - now < WAIT_SLICE_NS ? deadline_ns - now : WAIT_SLICE_NS;
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, &h->release_seq, FUTEX_WAIT, seen, &ts, NULL, 0);
  }

  budget_lock();
  begin_change(h);
  if (vs_b.me->flags & FLAG_WAITING) vs_b.me->flags--;
  if (LD(h->waiters)) ST(h->waiters, LD(h->waiters) - 1);
  end_change(h);
  budget_unlock();
  return _vs_now_ns() < deadline_ns;
}

bool _vs_group_hopeless(int dev, size_t len, char *why, size_t n) {
  if (!budget_on()) return false;
  if (vs_b.closed) {
    snprintf(why, n, "group '%s' could not be joined (said when the process first used a device)", vs_b.name);
    return true;
  }
  size_t left = 0, cap = 0;
  if (_vs_group_headroom(dev, &left, &cap) && len > cap) {
    snprintf(why, n, "%zu bytes are more than the limit itself (%zu bytes%s%s%s)", len, cap,
             vs_b.shared ? " of group '" : "", vs_b.shared ? vs_b.name : "", vs_b.shared ? "'" : "");
    return true;
  }
  /* Only threads that allocated or freed through the shim count (stats.c): the process's thread
   * list also holds the driver's and the runtime's helpers, which never free the program's. */
  if (!vs_b.shared && _vs_stat_threads_others() == 0) {
    snprintf(why, n, "no group, and no other thread of this process could free memory meanwhile");
    return true;
  }
  return false;
}

/* This member's host bytes in the segment (what the group's status shows). */
static void share_host(int dev, size_t len, bool add) {
  if (!budget_on()) return;
  budget_lock();
  begin_change(vs_b.h);
  count_host(vs_b.h, vs_b.me, dev, len, add);
  end_change(vs_b.h);
  budget_unlock();
}

bool _vs_group_spill_admit(int dev, size_t len) {
  (void)budget_on(); /* the join tells whether the group was refused */
  if (vs_b.closed) return false; /* no host memory past a budget that is not there */
  uint64_t cap = _vs_option(VS_OPT_ON_LIMIT) == VS_ON_LIMIT_HOST ? _vs_option_arg(VS_OPT_ON_LIMIT) : 0;
  size_t cur = atomic_load(&vs_spilled);
  do {
    if (cap && (cur > cap || len > cap - cur)) return false;
  } while (!atomic_compare_exchange_weak(&vs_spilled, &cur, cur + len));
  share_host(dev, len, true);
  return true;
}

void _vs_group_spill_return(int dev, size_t len) {
  atomic_fetch_sub(&vs_spilled, len);
  share_host(dev, len, false);
}

bool _vs_group_view(int dev, vs_group_view_t *v) {
  memset(v, 0, sizeof *v);
  if (!budget_on() || vs_b.closed) return false; /* no budget to show: the join said why */
  const vs_group_header_t *h = vs_b.h;
  snprintf(v->name, sizeof v->name, "%s", vs_b.shared ? vs_b.name : "");
  v->shared = vs_b.shared;
  v->members = LD(h->members);
  v->limit_source = LD(h->limit_source);
  v->limit_all = LD(h->limit_all);
  v->total_all = LD(h->total_all);
  v->mine_all = LD(vs_b.me->mapped_all);
  v->host_all = LD(h->host_all);
  v->mine_host = LD(vs_b.me->host_all);
  v->refused = LD(h->refused);
  v->reclaimed = LD(h->reclaimed);
  if (dev >= 0 && dev < VS_GROUP_DEVICES) {
    v->limit_dev = LD(h->limit[dev]);
    v->total_dev = LD(h->total[dev]);
    v->mine_dev = LD(vs_b.me->mapped[dev]);
  }
  return true;
}

/* group_members.c's way into the segment: fn runs under the group's lock, inside a change. */
bool _vs_group_with(void (*fn)(vs_group_header_t *h, vs_group_member_t *me, void *arg), void *arg) {
  if (!budget_on() || vs_b.closed || !vs_b.shared) return false;
  budget_lock();
  begin_change(vs_b.h);
  fn(vs_b.h, vs_b.me, arg);
  end_change(vs_b.h);
  budget_unlock();
  return true;
}
