/* log.c: the shim's messages.
 *
 * One line per message, prefixed "vmmshim: ", "vmmshim: warning: " or "vmmshim: error: ",
 * formatted into a fixed stack buffer and written with one write(2), so messages from
 * several threads never interleave and logging never allocates. A thread-local guard
 * stops a message from recursing into itself. Warnings are capped so a program that
 * frees the same bad pointer a million times does not drown its own output; warnings that
 * other processes can cause are rated apart (_vs_warn_rated), so they never use up that cap. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmmshim/base.h"

int _vs_log_level = VS_LOG_WARN;
static int vs_log_fd = 2;
static _Thread_local int vs_log_recursing;
/* Where this thread's messages are copied besides the log (the control channel's dump). */
static _Thread_local void (*vs_log_copy)(void *arg, const char *line, size_t n);
static _Thread_local void *vs_log_copy_arg;
static atomic_uint vs_warn_count;
#define VS_MAX_WARNINGS 100u

static void log_write(const char *prefix, const char *fmt, va_list ap) {
  if (vs_log_recursing) return;
  vs_log_recursing = 1;
  char buf[1024];
  size_t n = strlen(prefix);
  memcpy(buf, prefix, n);
  int k = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  if (k < 0) k = 0;
  n += (size_t)k < sizeof buf - n - 1 ? (size_t)k : sizeof buf - n - 2;
  buf[n++] = '\n';
  if (vs_log_copy) vs_log_copy(vs_log_copy_arg, buf, n);
  ssize_t off = 0;
  while ((size_t)off < n) {
    ssize_t w = write(vs_log_fd, buf + off, n - (size_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += w;
  }
  vs_log_recursing = 0;
}

void _vs_log_copy(void (*fn)(void *arg, const char *line, size_t n), void *arg) {
  vs_log_copy = fn;
  vs_log_copy_arg = arg;
}

void _vs_log(vs_log_level_t level, const char *fmt, ...) {
  if ((int)level > _vs_log_level) return;
  const char *prefix = "vmmshim: ";
  if (level == VS_LOG_ERROR) prefix = "vmmshim: error: ";
  if (level == VS_LOG_WARN) {
    unsigned n = atomic_fetch_add_explicit(&vs_warn_count, 1, memory_order_relaxed);
    if (n == VS_MAX_WARNINGS) {
      _vs_note("warning: more than %u warnings; further warnings are not shown", VS_MAX_WARNINGS);
      return;
    }
    if (n > VS_MAX_WARNINGS) return;
    prefix = "vmmshim: warning: ";
  }
  va_list ap;
  va_start(ap, fmt);
  log_write(prefix, fmt, ap);
  va_end(ap);
}

#define VS_RATE_NS 1000000000ull /* one rated warning a second per limiter */

void _vs_warn_rated(vs_rate_t *rate, const char *fmt, ...) {
  if (_vs_log_level < VS_LOG_WARN) return;
  uint64_t now = _vs_now_ns(), next = atomic_load_explicit(&rate->next_ns, memory_order_relaxed);
  if (now < next || !atomic_compare_exchange_strong(&rate->next_ns, &next, now + VS_RATE_NS)) {
    atomic_fetch_add_explicit(&rate->hidden, 1, memory_order_relaxed);
    return;
  }
  unsigned hidden = atomic_exchange_explicit(&rate->hidden, 0, memory_order_relaxed);
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (hidden) _vs_note("warning: %s (and %u more like it since the last one shown)", msg, hidden);
  else if (!atomic_exchange(&rate->said, true)) _vs_note("warning: %s (more like it: at most one a second)", msg);
  else _vs_note("warning: %s", msg);
}

void _vs_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_write("vmmshim: ", fmt, ap);
  va_end(ap);
}

/* Opens a file the shim writes to (the log, the trace): never through a symbolic link (another
 * user's link in a world-writable directory must not make it write over a file the program may
 * write), and without waiting for a reader when it is a FIFO: a FIFO no one reads fails with
 * ENXIO instead of stopping the program at its first CUDA call. Once open, writes block as on
 * any file. `truncate`: an existing regular file is emptied. Returns the descriptor, or -1 with
 * errno set (ELOOP: a symbolic link; ENXIO: a FIFO without a reader; EINVAL: not a regular file
 * or FIFO when `any_type` is false). */
int _vs_open_output(const char *path, bool truncate, bool any_type) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (truncate ? 0 : O_APPEND), 0644);
  if (fd < 0) return -1;
  struct stat st;
  int e = 0;
  if (fstat(fd, &st) != 0) e = errno;
  else if (!any_type && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) e = EINVAL;
  else if (truncate && S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) e = errno;
  else {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) e = errno;
  }
  if (e) {
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* Why _vs_open_output failed, for a message. */
const char *_vs_open_output_error(int e) {
  if (e == ELOOP) return "it is a symbolic link, which is not followed";
  if (e == ENXIO) return "it is a FIFO with no reader yet";
  if (e == EINVAL) return "it is not a regular file or a FIFO";
  return strerror(e);
}

/* spec: "info", "debug:/path/to/file" ("%p" in the path becomes the pid). */
void _vs_log_open(const char *spec, vs_log_level_t *level_out) {
  if (level_out) _vs_log_level = (int)*level_out;
  if (!spec) return;
  const char *colon = strchr(spec, ':');
  if (!colon || !colon[1]) return;
  char path[PATH_MAX];
  size_t o = 0;
  bool whole = true;
  for (const char *s = colon + 1; *s && whole; s++) {
    char pid[24];
    const char *ins = pid;
    if (s[0] == '%' && s[1] == 'p') {
      snprintf(pid, sizeof pid, "%d", (int)getpid());
      s++;
    } else {
      pid[0] = *s;
      pid[1] = 0;
    }
    size_t n = strlen(ins);
    whole = o + n < sizeof path;
    if (whole) memcpy(path + o, ins, n);
    o += n;
  }
  if (!whole) {
    _vs_warn("VMMSHIM_LOG: the path is too long (more than %zu bytes); logging to standard error", sizeof path - 1);
    return;
  }
  path[o] = 0;
  int fd = _vs_open_output(path, false, true);
  if (fd < 0) {
    int e = errno;
    _vs_warn("VMMSHIM_LOG: cannot open '%s': %s (errno %d); logging to standard error", path, _vs_open_output_error(e),
             e);
    return;
  }
  vs_log_fd = fd;
}

#if VS_DEBUG
void _vs_assert_fail(const char *cond, const char *file, int line, const char *func) {
  _vs_error("assertion failed: %s (%s:%d, %s)", cond, file, line, func);
  abort();
}
#endif
