/* borrow.c: the borrower's side of ballooning (VMMSHIM_ON_LIMIT=balloon; balloon.c is the
 * lender's). A growth the group's limit refuses asks a member of lower priority, over that
 * member's control channel, to move memory out of the device: one request line, `demote`, with the
 * bytes wanted and this pid; the reply says how many bytes left. No lock of the shim is held
 * here: the allocating thread waits on the socket, bounded by the deadline it was given. The
 * server must be the pid asked for, of this user (its credentials, as `vmmshim ctl` checks). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vmmshim/alloc.h"
#include "vmmshim/server.h"

#define VS_BORROW_REPLY_MAX 4096

/* The whole number after "key": in a flat reply line, or false. */
static bool reply_u64(const char *line, const char *key, uint64_t *v) {
  char pat[48];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (!p) return false;
  char *end;
  *v = strtoull(p + strlen(pat), &end, 10);
  return end != p + strlen(pat);
}

int _vs_borrow(pid_t lender, uint64_t want, uint64_t deadline_ns, uint64_t *got, double *lender_ms, char *why, size_t n) {
  *got = 0;
  *lender_ms = 0;
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  int len = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "vmmshim-ctl-%u-%d", (unsigned)geteuid(), (int)lender);
  struct ucred peer;
  int fd = _vs_socket_connect(&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len), deadline_ns,
                              &peer);
  if (fd < 0) {
    snprintf(why, n, "pid %d: no control channel (%s)", (int)lender, strerror(errno));
    return -ECONNREFUSED;
  }
  if (peer.pid != lender || peer.uid != geteuid()) {
    close(fd);
    snprintf(why, n, "pid %d: its control socket is held by pid %d (user %u): not trusted", (int)lender,
             (int)peer.pid, (unsigned)peer.uid);
    return -EPERM;
  }
  char req[160], line[VS_BORROW_REPLY_MAX];
  int rn = snprintf(req, sizeof req, "{\"v\":1,\"cmd\":\"demote\",\"bytes\":%llu,\"for\":%d}\n",
                    (unsigned long long)want, (int)getpid());
  size_t have = 0;
  bool sent = _vs_socket_deadline(fd, deadline_ns) && send(fd, req, (size_t)rn, MSG_NOSIGNAL) == rn;
  while (sent && have < sizeof line - 1 && _vs_socket_deadline(fd, deadline_ns)) {
    ssize_t r = recv(fd, line + have, sizeof line - 1 - have, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    have += (size_t)r;
    line[have] = 0;
    if (memchr(line, '\n', have)) break;
  }
  close(fd);
  line[have] = 0;
  if (!memchr(line, '\n', have)) {
    snprintf(why, n, "pid %d: no answer in time", (int)lender);
    return -ETIMEDOUT;
  }
  reply_u64(line, "released", got);
  const char *ms = strstr(line, "\"ms\":");
  if (ms) *lender_ms = strtod(ms + 5, NULL);
  if (!strstr(line, "\"ok\":true")) {
    const char *msg = strstr(line, "\"message\":");
    snprintf(why, n, "pid %d: %.160s", (int)lender, msg ? msg + 10 : line);
    return *got ? 0 : -EALREADY;
  }
  return 0;
}
