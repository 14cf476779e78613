/* disk.c: the files that sleeping tags keep their bytes in (disk mode).
 *
 * One file per pool that sleeps in disk mode (a tag's arena on one device, docs/sleep.md), in the
 * directory VMMSHIM_DISK_DIR (else $TMPDIR, else /tmp; vmmshim_set_disk_dir changes it at run
 * time). Its name holds the user id, the process id and the process's start time (so a file
 * left by a dead process is never taken for a live one's, and two processes never share one),
 * the tag and a counter; it is created with O_EXCL and mode 0600. Writes and reads go through
 * the pinned staging buffers of host.c, with O_DIRECT when the filesystem takes it (the buffers
 * are page-aligned, the pieces whole pages), else buffered, which the log says once. A sleep's
 * blocks are allocated before it writes (fallocate: together, and no allocation per write); a
 * wake keeps several reads in flight (Linux native AIO), so that the disk never waits for the
 * shim between two pieces.
 *
 * Every file this process made and still has is removed at exit (not at a forked child's: the
 * files stay its parent's); a file of another process is never touched. Not on the hot path: only sleeps and wakes come here. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vmmshim/handles.h"

#define VS_DISK_MAX_FILES 256

static pthread_mutex_t vs_disk_mu = PTHREAD_MUTEX_INITIALIZER;
static char vs_disk_dir[VS_DISK_PATH]; /* set at run time; "" = the option's or the default */
static char vs_disk_live[VS_DISK_MAX_FILES][VS_DISK_PATH]; /* files made and not yet removed */
static unsigned vs_disk_seq;
static pid_t vs_disk_owner; /* the process that made the files: a forked child never removes them */
static bool vs_disk_said_buffered, vs_disk_atexit;

const char *_vs_errno_name(int e) {
  const char *n = e ? strerrorname_np(e) : NULL;
  return n ? n : "EIO";
}

/* The directory in use, into buf. */
static void dir_now(char *buf, size_t n) {
  pthread_mutex_lock(&vs_disk_mu);
  const char *d = vs_disk_dir[0] ? vs_disk_dir : _vs_option_string(VS_OPT_DISK_DIR);
  if (!d || !*d) d = getenv("TMPDIR");
  if (!d || !*d) d = "/tmp";
  snprintf(buf, n, "%s", d);
  pthread_mutex_unlock(&vs_disk_mu);
}

int _vs_disk_set_dir(const char *dir) {
  if (!dir || !*dir || strlen(dir) >= VS_DISK_PATH - 64) return -EINVAL;
  struct stat st;
  if (stat(dir, &st) != 0) return -errno;
  if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
  if (access(dir, W_OK | X_OK) != 0) return -errno;
  pthread_mutex_lock(&vs_disk_mu);
  snprintf(vs_disk_dir, sizeof vs_disk_dir, "%s", dir);
  pthread_mutex_unlock(&vs_disk_mu);
  return 0;
}

void _vs_disk_dir(char *buf, size_t n) { dir_now(buf, n); }

/* The process's start time in clock ticks since boot (/proc/self/stat, field 22), 0 when unknown:
 * a pid reused after a crash gets another start time, so its names differ. */
static unsigned long long start_time(void) {
  static uint64_t t;
  if (!t) _vs_proc_start(0, &t, NULL); /* group.c's reading; t stays 0 when it fails */
  return (unsigned long long)t;
}

static void remove_all(void) {
  pthread_mutex_lock(&vs_disk_mu);
  for (int i = 0; i < VS_DISK_MAX_FILES && getpid() == vs_disk_owner; i++)
    if (vs_disk_live[i][0]) {
      unlink(vs_disk_live[i]);
      vs_disk_live[i][0] = 0;
    }
  pthread_mutex_unlock(&vs_disk_mu);
}

/* Records a file made, for removal at exit; false when the table is full (no file then). */
static bool note_live(const char *path) {
  pthread_mutex_lock(&vs_disk_mu);
  if (!vs_disk_atexit) vs_disk_atexit = atexit(remove_all) == 0;
  vs_disk_owner = getpid();
  int slot = -1;
  for (int i = 0; i < VS_DISK_MAX_FILES && slot < 0; i++)
    if (!vs_disk_live[i][0]) slot = i;
  if (slot >= 0) snprintf(vs_disk_live[slot], VS_DISK_PATH, "%s", path);
  pthread_mutex_unlock(&vs_disk_mu);
  return slot >= 0;
}

static int open_file(const char *path, int flags, bool *direct) {
  int fd = open(path, flags | O_DIRECT | O_CLOEXEC, 0600);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) { /* the filesystem refuses O_DIRECT (tmpfs) */
    fd = open(path, flags | O_CLOEXEC, 0600);
    if (fd >= 0 && !vs_disk_said_buffered) {
      vs_disk_said_buffered = true;
      _vs_info("disk sleep: %s refuses O_DIRECT; its files are written and read through the page cache", path);
    }
  }
  return fd < 0 ? -errno : fd;
}

int _vs_disk_create(vs_disk_t *d, const char *tag, int dev) {
  char dir[VS_DISK_PATH];
  dir_now(dir, sizeof dir);
  for (int tries = 0; tries < 16; tries++) {
    pthread_mutex_lock(&vs_disk_mu);
    unsigned seq = ++vs_disk_seq;
    pthread_mutex_unlock(&vs_disk_mu);
    int n = snprintf(d->path, sizeof d->path, "%s/vmmshim-u%u-p%d-s%llu-%s-d%d-%u.sleep", dir, (unsigned)getuid(),
                     (int)getpid(), start_time(), tag ? tag : "untagged", dev, seq);
    if (n < 0 || (size_t)n >= sizeof d->path) return -ENAMETOOLONG;
    int fd = open_file(d->path, O_RDWR | O_CREAT | O_EXCL, &d->direct);
    if (fd == -EEXIST) continue;
    if (fd < 0) return fd;
    if (!note_live(d->path)) {
      close(fd);
      unlink(d->path);
      return -EMFILE;
    }
    d->fd = fd;
    d->len = 0;
    return 0;
  }
  return -EEXIST;
}

int _vs_disk_open(vs_disk_t *d) {
  int fd = open_file(d->path, O_RDWR, &d->direct);
  if (fd < 0) return fd;
  d->fd = fd;
  return 0;
}

void _vs_disk_close(vs_disk_t *d) {
  if (d->fd >= 0) close(d->fd);
  d->fd = -1;
}

void _vs_disk_remove(vs_disk_t *d) {
  _vs_disk_close(d);
  unlink(d->path);
  pthread_mutex_lock(&vs_disk_mu);
  for (int i = 0; i < VS_DISK_MAX_FILES; i++)
    if (!strcmp(vs_disk_live[i], d->path)) vs_disk_live[i][0] = 0;
  pthread_mutex_unlock(&vs_disk_mu);
  d->path[0] = 0;
  d->len = 0;
}

/* O_DIRECT needs page-aligned buffers, offsets and lengths: anything else is done buffered. */
static void fit_direct(vs_disk_t *d, const void *buf, size_t n, uint64_t off) {
  if (!d->direct || (((uintptr_t)buf | n | off) & 4095) == 0) return;
  int fl = fcntl(d->fd, F_GETFL);
  if (fl >= 0) fcntl(d->fd, F_SETFL, fl & ~O_DIRECT);
  d->direct = false;
}

int _vs_disk_write(vs_disk_t *d, const void *buf, size_t n, uint64_t off) {
  fit_direct(d, buf, n, off);
  for (size_t done = 0; done < n;) {
    ssize_t w = pwrite(d->fd, (const char *)buf + done, n - done, (off_t)(off + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    if (w == 0) return -EIO; /* a short write that makes no progress */
    done += (size_t)w;
  }
  if (off + n > d->len) d->len = off + n;
  return 0;
}

int _vs_disk_read(vs_disk_t *d, void *buf, size_t n, uint64_t off) {
  fit_direct(d, buf, n, off);
  for (size_t done = 0; done < n;) {
    ssize_t r = pread(d->fd, (char *)buf + done, n - done, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -ENODATA; /* the file is shorter than what was written: truncated */
    done += (size_t)r;
  }
  return 0;
}

int _vs_disk_sync(vs_disk_t *d) { return fdatasync(d->fd) == 0 ? 0 : -errno; }

int _vs_disk_truncate(vs_disk_t *d, uint64_t len) {
  d->len = len;
  return ftruncate(d->fd, (off_t)len) == 0 ? 0 : -errno;
}

int _vs_disk_preallocate(vs_disk_t *d, uint64_t off, uint64_t len) {
  if (!len || fallocate(d->fd, 0, (off_t)off, (off_t)len) == 0) return 0;
  int e = errno;
  return e == ENOSPC || e == EDQUOT || e == EFBIG || e == EIO ? -e : 0; /* else not supported here */
}

/* ---- reads in flight (native AIO through its system calls: no library needed) ---- */

void _vs_disk_reads_open(vs_disk_reads_t *r) {
  memset(r, 0, sizeof *r);
  if (syscall(SYS_io_setup, VS_DISK_BUFS, &r->ctx) != 0) r->ctx = 0;
}

void _vs_disk_reads_close(vs_disk_reads_t *r) {
  /* io_destroy cancels what it can and waits for the rest: no read lands in a buffer after it. */
  if (r->ctx) syscall(SYS_io_destroy, r->ctx);
  memset(r, 0, sizeof *r);
}

void _vs_disk_read_start(vs_disk_t *d, vs_disk_reads_t *r, int s, void *buf, size_t n, uint64_t off) {
  fit_direct(d, buf, n, off);
  r->buf[s] = buf, r->n[s] = n, r->off[s] = off;
  if (r->ctx) {
    struct iocb *cb = &r->cb[s];
    memset(cb, 0, sizeof *cb);
    cb->aio_data = (uint64_t)s;
    cb->aio_lio_opcode = IOCB_CMD_PREAD;
    cb->aio_fildes = (uint32_t)d->fd;
    cb->aio_buf = (uint64_t)(uintptr_t)buf;
    cb->aio_nbytes = n;
    cb->aio_offset = (int64_t)off;
    struct iocb *list[1] = {cb};
    if (syscall(SYS_io_submit, r->ctx, 1, list) == 1) {
      r->pending[s] = true;
      return;
    }
  }
  int e = _vs_disk_read(d, buf, n, off); /* no AIO, or it refused this one: read now */
  r->res[s] = e ? e : (long)n;
}

int _vs_disk_read_finish(vs_disk_t *d, vs_disk_reads_t *r, int s) {
  while (r->pending[s]) {
    struct io_event ev[VS_DISK_BUFS];
    long got = syscall(SYS_io_getevents, r->ctx, 1, VS_DISK_BUFS, ev, NULL);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -errno; /* the read stays in flight: _vs_disk_reads_close waits for it */
    for (long i = 0; i < got; i++) {
      int j = (int)ev[i].data;
      if (j < 0 || j >= VS_DISK_BUFS) continue;
      r->pending[j] = false;
      r->res[j] = (long)ev[i].res;
    }
  }
  long res = r->res[s];
  if (res < 0) return (int)res;
  if ((size_t)res < r->n[s]) /* short: the rest, or -ENODATA past the end of a truncated file */
    return _vs_disk_read(d, (char *)r->buf[s] + res, r->n[s] - (size_t)res, r->off[s] + (uint64_t)res);
  return 0;
}
