/* server.c: the socket server of the shim's local channels (vmmshim/server.h): control and IPC.
 *
 * One thread per server polls the listening socket and its connections. Each time the listening
 * socket is readable, the backlog is drained (accept until EAGAIN), so that a peer connecting in
 * a loop cannot keep the others waiting in it. A peer's credentials (SO_PEERCRED) are checked at
 * once: another user's connection is told why and closed before anything of it is read, so it
 * never holds a slot. The table of slots is fixed (made at the first start, never grown): a
 * connection that finds it full takes the slot of the oldest one idle between requests; only
 * when every slot is busy with a request is it refused. Root (when allowed and not this process's
 * user) never takes the last VS_SRV_OWNER_SLOTS slots: they stay for the owner.
 *
 * Every connection has one deadline, checked on every pass of the loop whether it sent something
 * or not: the idle deadline from its accept or its last reply, cut to request_ms after a
 * request's first byte. Bytes that trickle in never move it; only a whole request answered does.
 *
 * Refusals are logged as rated warnings (at most one a second per kind, the others counted), so
 * that no level of VMMSHIM_LOG lets a peer flood the log. The thread never allocates once it
 * serves (a fork while it allocates could leave a child's allocator locked under a sanitizer). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "vmmshim/server.h"

#define VS_SRV_OWNER_SLOTS 2                 /* slots root cannot take from the owner */
#define VS_SRV_ACCEPT_BURST 4096             /* at most so many accepts before the others' turn */
#define VS_SRV_BACKOFF_NS (100 * 1000000ull) /* accept failing for want of resources: wait this long */
#define VS_SRV_REFUSAL_MAX 512
#define VS_MS 1000000ull

struct vs_srv_slot_s {
  int fd;
  bool used, held, eof, foreign;
  uint64_t deadline_ns, idle_since_ns, user;
  char *in, *out;
  size_t in_n, out_n, out_off;
};

/* ------------------------------------------------------------------ fork */

/* Every server started, for the fork handlers. No lock of its own: a channel starts its server
 * under its own lock, which a fork handler of the channel may take, so the order of the two would
 * be the handlers' registration order. */
#define VS_SRV_MAX_SERVERS 8
static vs_server_t *_Atomic vs_servers[VS_SRV_MAX_SERVERS];
static atomic_int vs_nservers;
static pthread_once_t vs_atfork_once = PTHREAD_ONCE_INIT;

static int nservers(void) {
  int n = atomic_load(&vs_nservers);
  return n < VS_SRV_MAX_SERVERS ? n : VS_SRV_MAX_SERVERS;
}

static void atfork_prepare(void) {
  for (int i = 0; i < nservers(); i++) _vs_lock_take_at_fork(&vs_servers[i]->lock);
}

static void atfork_parent(void) {
  for (int i = 0; i < nservers(); i++) _vs_lock_release(&vs_servers[i]->lock);
}

/* The child has no server thread: it closes its copies of the sockets (the parent's connections
 * stay the parent's); a channel may start its server again. */
static void atfork_child(void) {
  for (int k = 0; k < nservers(); k++) {
    vs_server_t *s = vs_servers[k];
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->spare_fd >= 0) close(s->spare_fd);
    s->listen_fd = s->spare_fd = -1;
    for (int i = 0; i < s->nlive; i++) {
      close(s->live[i]->fd);
      s->live[i]->used = false;
    }
    s->nlive = s->nforeign = 0;
    s->pid = 0;
    _vs_lock_release(&s->lock); /* taken in atfork_prepare, by this thread's copy */
  }
}

static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* ------------------------------------------------------------------ refusals */

static void log_refusal(vs_server_t *s, vs_srv_refusal_t why, int uid, int pid) {
  vs_rate_t *r = &s->rates[why];
  const char *n = s->ops.name;
  switch (why) {
  case VS_SRV_WRONG_USER:
    _vs_warn_rated(r, "%s: a process of user %d (pid %d) %s (user %d): refused", n, uid, pid, s->ops.asked,
                   (int)geteuid());
    break;
  case VS_SRV_FULL:
    _vs_warn_rated(r, "%s: all %d connections are busy with a request: one more is refused", n, s->ops.slots);
    break;
  case VS_SRV_TOO_LONG:
    _vs_warn_rated(r, "%s: a request line longer than %zu bytes: refused, connection closed", n, s->ops.line_max);
    break;
  case VS_SRV_TOO_SLOW:
    _vs_warn_rated(r, "%s: a connection did not finish its request in time: closed", n);
    break;
  case VS_SRV_CUT:
    _vs_warn_rated(r, "%s: a connection ended inside a request", n);
    break;
  default: {
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_NOFILE, &rl);
    _vs_warn_rated(r, "%s: this process has no file descriptor left (RLIMIT_NOFILE %llu): a connection is refused",
                   n, (unsigned long long)rl.rlim_cur);
  }
  }
}

/* Tells a peer why (what fits in its socket now) and closes fd. */
static void tell_and_close(vs_server_t *s, int fd, vs_srv_refusal_t why) {
  char msg[VS_SRV_REFUSAL_MAX];
  size_t n = s->ops.refusal ? s->ops.refusal(why, msg, sizeof msg) : 0;
  if (n && send(fd, msg, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    /* it gets nothing more: it is closed either way */
  }
  close(fd);
}

static void refuse_fd(vs_server_t *s, int fd, vs_srv_refusal_t why, int uid, int pid) {
  tell_and_close(s, fd, why);
  log_refusal(s, why, uid, pid);
}

/* ------------------------------------------------------------------ the table */

/* Out of the table and closed under the lock: a fork meanwhile sees it whole or not at all. The
 * channel hears of it after (no lock held). `why`: a refusal to send first, or -1. */
static void slot_close(vs_server_t *s, int i, int why) {
  vs_srv_slot_t *c = s->live[i];
  uint64_t held = c->user;
  int fd = c->fd;
  _vs_lock_take(&s->lock);
  s->live[i] = s->live[--s->nlive];
  s->nforeign -= c->foreign;
  c->used = false;
  if (why >= 0) tell_and_close(s, fd, (vs_srv_refusal_t)why);
  else close(fd);
  _vs_lock_release(&s->lock);
  if (why >= 0) log_refusal(s, (vs_srv_refusal_t)why, -1, -1);
  if (s->ops.closed) s->ops.closed(held);
}

static void set_idle(vs_server_t *s, vs_srv_slot_t *c, uint64_t now) {
  c->idle_since_ns = now;
  c->deadline_ns = now + s->ops.idle_ms * VS_MS;
}

/* The oldest connection idle between requests (of root alone when `foreign`), or -1. */
static int oldest_idle(const vs_server_t *s, bool foreign) {
  int best = -1;
  for (int i = 0; i < s->nlive; i++) {
    const vs_srv_slot_t *c = s->live[i];
    if (c->held || c->in_n || c->out_n || (foreign && !c->foreign)) continue;
    if (best < 0 || c->idle_since_ns < s->live[best]->idle_since_ns) best = i;
  }
  return best;
}

/* A slot for a new connection: a free one, else the oldest idle one's. NULL: refused (full). */
static vs_srv_slot_t *take_slot(vs_server_t *s, bool foreign) {
  bool room = s->nlive < s->ops.slots;
  if (foreign && s->nforeign >= s->ops.slots - VS_SRV_OWNER_SLOTS) room = false;
  if (!room) {
    int victim = oldest_idle(s, foreign && s->nforeign >= s->ops.slots - VS_SRV_OWNER_SLOTS);
    if (victim < 0) return NULL;
    slot_close(s, victim, -1);
  }
  for (int i = 0; i < s->ops.slots; i++)
    if (!s->slots[i].used) return &s->slots[i];
  return NULL;
}

/* ------------------------------------------------------------------ a connection's bytes */

/* Sends what it can of the reply queued. Returns false when the connection is broken. */
static bool flush(vs_server_t *s, vs_srv_slot_t *c, uint64_t now) {
  while (c->out_off < c->out_n) {
    ssize_t w = send(c->fd, c->out + c->out_off, c->out_n - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) return errno == EAGAIN || errno == EINTR;
    c->out_off += (size_t)w;
  }
  c->out_n = c->out_off = 0;
  set_idle(s, c, now);
  return true;
}

/* The next whole request the connection holds: its length (*used: the bytes it takes), or -1
 * when none is whole yet. */
static ssize_t next_request(const vs_server_t *s, const vs_srv_slot_t *c, size_t *used) {
  if (s->ops.record) {
    *used = s->ops.record;
    return c->in_n >= s->ops.record ? (ssize_t)s->ops.record : -1;
  }
  const char *nl = memchr(c->in, '\n', c->in_n);
  if (!nl) return -1;
  *used = (size_t)(nl - c->in) + 1;
  return nl - c->in;
}

/* Answers the whole requests the connection holds while their replies go out at once. Returns
 * false to close it, with *why the refusal to send first (or -1). */
static bool serve_requests(vs_server_t *s, vs_srv_slot_t *c, uint64_t now, int *why) {
  size_t used, cap = s->ops.record ? s->ops.record : s->ops.line_max;
  ssize_t len;
  while (!c->held && c->out_n == 0 && (len = next_request(s, c, &used)) >= 0) {
    size_t out_n = 0;
    vs_srv_next_t next = s->ops.answer(c->fd, &c->user, c->in, (size_t)len, c->out, &out_n);
    c->in_n -= used;
    memmove(c->in, c->in + used, c->in_n);
    c->out_n = out_n;
    c->out_off = 0;
    now = _vs_now_ns();
    if (!flush(s, c, now) || next == VS_SRV_CLOSE) return false; /* a reply not taken at once is lost */
    if (next == VS_SRV_HOLD) c->held = true;
    else if (c->out_n) c->deadline_ns = now + s->ops.send_ms * VS_MS;
    else if (c->in_n) c->deadline_ns = now + s->ops.request_ms * VS_MS;
  }
  if (c->held || c->out_n) return true;
  if (c->in_n == cap) return *why = VS_SRV_TOO_LONG, false;
  if (c->eof) return *why = c->in_n ? VS_SRV_CUT : -1, false;
  return true;
}

/* Bytes came (or the end): read them, answer what is whole. */
static bool on_readable(vs_server_t *s, vs_srv_slot_t *c, uint64_t now, int *why) {
  size_t cap = s->ops.record ? s->ops.record : s->ops.line_max;
  if (c->held) { /* it sends nothing after its request: drop stray bytes, see it close */
    char junk[64];
    ssize_t k = recv(c->fd, junk, sizeof junk, MSG_DONTWAIT);
    return k > 0 || (k < 0 && (errno == EAGAIN || errno == EINTR));
  }
  if (c->in_n == cap) return serve_requests(s, c, now, why); /* full: no recv of 0 bytes, read as an end */
  ssize_t r = recv(c->fd, c->in + c->in_n, cap - c->in_n, MSG_DONTWAIT);
  if (r < 0) return errno == EAGAIN || errno == EINTR;
  if (r == 0) c->eof = true;
  else if (c->in_n == 0 && c->deadline_ns > now + s->ops.request_ms * VS_MS)
    c->deadline_ns = now + s->ops.request_ms * VS_MS; /* a request began: never later than this */
  c->in_n += (size_t)r;
  return serve_requests(s, c, now, why);
}

static bool on_writable(vs_server_t *s, vs_srv_slot_t *c, uint64_t now, int *why) {
  if (!flush(s, c, now)) return false;
  if (c->out_n) return true;
  if (c->in_n) c->deadline_ns = now + s->ops.request_ms * VS_MS;
  return serve_requests(s, c, now, why); /* lines that came while the reply waited */
}

/* One connection's turn after poll: its events, then its deadline. False: close it (*why). */
static bool serve_slot(vs_server_t *s, vs_srv_slot_t *c, short revents, uint64_t now, int *why) {
  bool keep = true;
  if (revents & (POLLERR | POLLNVAL)) keep = false;
  else if (revents & POLLOUT) keep = on_writable(s, c, now, why);
  else if (revents & (POLLIN | POLLHUP)) keep = on_readable(s, c, now, why);
  if (keep && !c->held && _vs_now_ns() >= c->deadline_ns) {
    if (c->in_n || c->out_n) *why = VS_SRV_TOO_SLOW;
    keep = false;
  }
  return keep;
}

/* ------------------------------------------------------------------ accept */

/* accept4 failed with e. Returns until when to leave the listening socket alone (0: go on). */
static uint64_t accept_failed(vs_server_t *s, int e, uint64_t now) {
  if ((e == EMFILE || e == ENFILE) && s->spare_fd >= 0) {
    /* The spare descriptor lets the connection in only to be told, so neither the backlog nor
     * the loop stalls on it. */
    close(s->spare_fd);
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) refuse_fd(s, fd, VS_SRV_NO_FD, -1, -1);
    else log_refusal(s, VS_SRV_NO_FD, -1, -1);
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd < 0 || s->spare_fd < 0 ? now + VS_SRV_BACKOFF_NS : 0;
  }
  _vs_warn_rated(&s->rates[VS_SRV_NO_FD], "%s: accept: %s; connections wait %llu ms", s->ops.name, strerror(e),
                 (unsigned long long)(VS_SRV_BACKOFF_NS / VS_MS));
  return now + VS_SRV_BACKOFF_NS;
}

/* Whether the peer of fd may talk to this process; *foreign: it is root, not this user. */
static bool peer_allowed(vs_server_t *s, int fd, int *uid, int *pid, bool *foreign) {
  struct ucred cred;
  socklen_t cl = sizeof cred;
  *uid = *pid = -1;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cl != sizeof cred) return false;
  *uid = (int)cred.uid;
  *pid = (int)cred.pid;
  *foreign = cred.uid != geteuid();
  return !*foreign || (s->ops.root_too && cred.uid == 0);
}

/* Takes every connection waiting (until EAGAIN, or a burst's worth: the connections open get
 * their turn). Returns until when to leave the listening socket alone (0: no need). */
static uint64_t accept_all(vs_server_t *s, uint64_t now) {
  for (int burst = 0; burst < VS_SRV_ACCEPT_BURST; burst++) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int e = errno;
      if (e == EINTR || e == ECONNABORTED) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) return 0;
      uint64_t after = accept_failed(s, e, now);
      if (after) return after;
      continue;
    }
    int uid, pid;
    bool foreign = false;
    if (!peer_allowed(s, fd, &uid, &pid, &foreign)) {
      refuse_fd(s, fd, VS_SRV_WRONG_USER, uid, pid);
      continue;
    }
    vs_srv_slot_t *c = take_slot(s, foreign);
    if (!c) {
      refuse_fd(s, fd, VS_SRV_FULL, uid, pid);
      continue;
    }
    c->fd = fd;
    c->held = c->eof = false;
    c->foreign = foreign;
    c->user = 0;
    c->in_n = c->out_n = c->out_off = 0;
    now = _vs_now_ns();
    set_idle(s, c, now);
    _vs_lock_take(&s->lock);
    c->used = true;
    s->live[s->nlive++] = c;
    s->nforeign += foreign;
    _vs_lock_release(&s->lock);
    /* A request already there is served now: a connection with one is never the idle one a
     * later connection of this burst would take the slot of. */
    int why = -1;
    if (!on_readable(s, c, now, &why)) slot_close(s, s->nlive - 1, why);
  }
  return 0;
}

/* ------------------------------------------------------------------ the loop */

/* poll()'s timeout: until the nearest deadline (or the listening socket's back-off). */
static int next_timeout(const vs_server_t *s, uint64_t now, bool listening) {
  uint64_t wake = listening ? UINT64_MAX : s->listen_after;
  for (int i = 0; i < s->nlive; i++)
    if (!s->live[i]->held && s->live[i]->deadline_ns < wake) wake = s->live[i]->deadline_ns;
  if (wake == UINT64_MAX) return -1;
  uint64_t ms = wake <= now ? 0 : (wake - now) / VS_MS + 1;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void *server_main(void *arg) {
  vs_server_t *s = arg;
  if (s->ops.thread_init) s->ops.thread_init();
  for (;;) {
    int n = s->nlive;
    uint64_t now = _vs_now_ns();
    bool listening = now >= s->listen_after;
    for (int i = 0; i < n; i++) {
      vs_srv_slot_t *c = s->live[i];
      s->pfd[i] = (struct pollfd){c->fd, (short)(c->out_n ? POLLOUT : POLLIN), 0};
    }
    s->pfd[n] = (struct pollfd){listening ? s->listen_fd : -1, POLLIN, 0};
    int r = poll(s->pfd, (nfds_t)n + 1, next_timeout(s, now, listening));
    if (r < 0 && errno != EINTR) {
      _vs_warn_rated(&s->rates[VS_SRV_NO_FD], "%s: poll: %s", s->ops.name, strerror(errno));
      struct timespec ts = {0, VS_SRV_BACKOFF_NS};
      nanosleep(&ts, NULL);
      continue;
    }
    now = _vs_now_ns();
    for (int i = n; i-- > 0;) { /* from the end: a closed one's place takes the last, done already */
      int why = -1;
      if (!serve_slot(s, s->live[i], r > 0 ? s->pfd[i].revents : 0, now, &why)) slot_close(s, i, why);
    }
    if (listening && r > 0 && (s->pfd[n].revents & POLLIN)) s->listen_after = accept_all(s, now);
  }
  return NULL;
}

/* ------------------------------------------------------------------ start */

/* The table, made once (a fork child's restart reuses it). */
static int make_table(vs_server_t *s) {
  if (s->slots) return 0;
  size_t in = s->ops.record ? s->ops.record : s->ops.line_max, per = in + s->ops.reply_max;
  size_t n = (size_t)s->ops.slots;
  s->slots = calloc(n, sizeof *s->slots);
  s->live = calloc(n, sizeof *s->live);
  s->pfd = calloc(n + 1, sizeof *s->pfd);
  char *bufs = calloc(n, per);
  if (!s->slots || !s->live || !s->pfd || !bufs) {
    free(s->slots);
    free(s->live);
    free(s->pfd);
    free(bufs);
    s->slots = NULL;
    s->live = NULL;
    s->pfd = NULL;
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    s->slots[i].in = bufs + i * per;
    s->slots[i].out = bufs + i * per + in;
  }
  return 0;
}

int _vs_server_start(vs_server_t *s, const struct sockaddr_un *a, socklen_t len) {
  if (_vs_server_running(s)) return 0;
  if (!s->lock_made) {
    _vs_lock_init(&s->lock, VS_RANK_SERVER, "server");
    s->lock_made = true;
    s->listen_fd = s->spare_fd = -1;
  }
  pthread_once(&vs_atfork_once, atfork_register);
  if (make_table(s) != 0) {
    _vs_warn("%s: no memory for its table of %d connections", s->ops.name, s->ops.slots);
    errno = ENOMEM;
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || bind(fd, (const struct sockaddr *)a, len) != 0 || listen(fd, s->ops.backlog) != 0) {
    int e = errno;
    _vs_warn("%s: cannot listen on @%s: %s", s->ops.name, a->sun_path + 1, strerror(e));
    if (fd >= 0) close(fd);
    errno = e;
    return -1;
  }
  s->listen_fd = fd;
  s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  s->nlive = s->nforeign = 0;
  s->listen_after = 0;
  if (!s->listed) { /* before its thread: a fork from now on closes its sockets */
    int k = atomic_fetch_add(&vs_nservers, 1);
    if (k < VS_SRV_MAX_SERVERS) vs_servers[k] = s;
    s->listed = true;
  }
  pthread_t t;
  if (_vs_thread_start(&t, server_main, s) != 0) {
    _vs_warn("%s: cannot start its thread", s->ops.name);
    close(fd);
    if (s->spare_fd >= 0) close(s->spare_fd);
    s->listen_fd = s->spare_fd = -1;
    errno = EAGAIN;
    return -1;
  }
  s->pid = getpid();
  return 0;
}

bool _vs_server_running(const vs_server_t *s) { return s->pid != 0 && s->pid == getpid(); }

/* ------------------------------------------------------------------ the sockets' other end */

/* Room for the descriptors of a message, aligned as a cmsghdr must be. */
typedef union vs_srv_ctrl_u {
  char buf[CMSG_SPACE(sizeof(int) * VS_SRV_MAX_FDS)];
  struct cmsghdr align;
} vs_srv_ctrl_t;

bool _vs_socket_deadline(int fd, uint64_t deadline) {
  uint64_t now = _vs_now_ns();
  if (now >= deadline) return false;
  uint64_t left = deadline - now;
  struct timeval tv = {(time_t)(left / 1000000000ull), (suseconds_t)(left % 1000000000ull / 1000)};
  if (!tv.tv_sec && !tv.tv_usec) tv.tv_usec = 1;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return true;
}

int _vs_socket_connect(const struct sockaddr_un *a, socklen_t len, uint64_t deadline, struct ucred *peer) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -2;
  /* connect waits as send does (SO_SNDTIMEO) when the server's backlog is full */
  int rc = -1;
  errno = EAGAIN;
  while (_vs_socket_deadline(fd, deadline) && (rc = connect(fd, (const struct sockaddr *)a, len)) != 0 &&
         errno == EINTR) {
  }
  socklen_t cl = sizeof *peer;
  if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, peer, &cl) != 0 || cl != sizeof *peer)) {
    rc = -1;
    errno = EPERM;
  }
  if (rc != 0) {
    int e = errno == EINPROGRESS || errno == EINTR ? EAGAIN : errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int _vs_send_fds(int fd, const void *buf, size_t n, const int *fds, int nfds) {
  struct iovec iov = {(void *)buf, n};
  vs_srv_ctrl_t ctrl;
  struct msghdr m = {0};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (nfds > VS_SRV_MAX_FDS) return -1;
  if (nfds > 0) {
    memset(&ctrl, 0, sizeof ctrl);
    m.msg_control = ctrl.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t w;
  do w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)n ? 0 : -1;
}

ssize_t _vs_recv_fds(int fd, void *buf, size_t n, int *fds, int *nfds, bool *extra) {
  vs_srv_ctrl_t ctrl;
  struct iovec iov = {buf, n};
  struct msghdr m = {0};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl.buf;
  m.msg_controllen = sizeof ctrl.buf;
  ssize_t r = recvmsg(fd, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  *nfds = 0;
  *extra = (m.msg_flags & MSG_CTRUNC) != 0; /* the kernel closed those that did not fit */
  for (struct cmsghdr *c = r > 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < k; i++) {
      int f;
      memcpy(&f, CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof f);
      if (*nfds < VS_SRV_MAX_FDS) fds[(*nfds)++] = f;
      else {
        close(f);
        *extra = true;
      }
    }
  }
  return r;
}
