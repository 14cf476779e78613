/* vmmshim socket server (src/base/server.c): what the shim's local servers share. The control
 * channel (src/hook/control.c) and IPC (src/share/ipc.c) each keep only their protocol: a
 * function that answers one request, registered with a server. The server owns the rest: the
 * listening socket, accept (drained each time it is readable), the peer's credentials, a fixed
 * table of connection slots, per-connection deadlines that trickled bytes do not extend, framing
 * (lines of at most line_max bytes, or records of a fixed size) and refusals, each logged at most
 * once a second per kind whatever the log level. One thread per server serves every connection;
 * a fork child closes its copies of the sockets and may start the server again. */
#ifndef VMMSHIM_SERVER_H
#define VMMSHIM_SERVER_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "vmmshim/base.h"
#include "vmmshim/lock.h"

/* Why a peer is turned away (it is told through the channel's `refusal`, then closed). */
typedef enum vs_srv_refusal_e {
  VS_SRV_WRONG_USER, /* it runs as another user */
  VS_SRV_FULL,       /* every slot is busy with a request, none idle to make room */
  VS_SRV_TOO_LONG,   /* a line past line_max */
  VS_SRV_TOO_SLOW,   /* a request not whole by its deadline */
  VS_SRV_CUT,        /* the peer ended its side inside a request */
  VS_SRV_NO_FD,      /* this process has no descriptor left */
  VS_SRV_REFUSALS
} vs_srv_refusal_t;

/* What becomes of a connection once its request is answered. */
typedef enum vs_srv_next_e {
  VS_SRV_NEXT,  /* its reply goes out, then it may send another request */
  VS_SRV_CLOSE, /* closed once its reply is out */
  VS_SRV_HOLD,  /* kept open, without deadline, until the peer closes (what it sends is dropped) */
} vs_srv_next_t;

typedef struct vs_server_ops_s {
  const char *name;       /* the log lines' prefix: "control", "ipc" */
  const char *asked;      /* a refused user "asked for a handle of this process", ... */
  int slots;              /* connections at once */
  int backlog;            /* listen()'s */
  size_t record;          /* requests of exactly this many bytes; 0: lines */
  size_t line_max;        /* bytes of a line, its newline included */
  size_t reply_max;       /* bytes of a reply the server sends (0: the channel sends its own) */
  bool root_too;          /* root may connect besides this process's user */
  uint64_t idle_ms;       /* a connection with no request begun is closed after this */
  uint64_t request_ms;    /* a request must be whole this long after its first byte */
  uint64_t send_ms;       /* a reply must be taken within this */
  /* Answers one request (a line without its newline, or a record): a reply of at most reply_max
   * bytes into out (*out_n), or sent by the channel on fd itself. *held is the channel's own
   * word for the connection (0 at accept); it gets it back in `closed`. */
  vs_srv_next_t (*answer)(int fd, uint64_t *held, const char *req, size_t len, char *out, size_t *out_n);
  /* What a refused peer reads before it is closed (at most cap bytes; 0: nothing). */
  size_t (*refusal)(vs_srv_refusal_t why, char *out, size_t cap);
  /* A connection is closed (lock of no server held); held: what answer left in it. */
  void (*closed)(uint64_t held);
  void (*thread_init)(void); /* on the server's thread, before it serves (may be NULL) */
} vs_server_ops_t;

typedef struct vs_srv_slot_s vs_srv_slot_t;

/* A server: ops set by its channel, the rest the server's own (zeroed before the first start). */
typedef struct vs_server_s {
  vs_server_ops_t ops;
  vs_lock_t lock; /* the table, against fork: changed under it by the server thread alone */
  bool lock_made, listed;
  int listen_fd, spare_fd;
  pid_t pid;             /* the process whose thread serves; 0: none */
  vs_srv_slot_t *slots;  /* ops.slots of them, made at the first start */
  vs_srv_slot_t **live;  /* the slots in use, packed */
  int nlive, nforeign;   /* nforeign: those of root when root is not this process's user */
  struct pollfd *pfd;    /* ops.slots + 1 */
  uint64_t listen_after; /* accept failed for want of resources: not before this */
  vs_rate_t rates[VS_SRV_REFUSALS];
} vs_server_t;

/* Listens on the abstract name `a` and starts the serving thread (once per process: 0 when it
 * runs already). -1 with errno (and a warning) when it cannot; nothing is left open then. */
int _vs_server_start(vs_server_t *s, const struct sockaddr_un *a, socklen_t len);
/* Whether this process's thread serves s. */
bool _vs_server_running(const vs_server_t *s);

/* ---------------------------------------------------------------- the sockets' other end */
#define VS_SRV_MAX_FDS 64 /* descriptors one message carries */
/* Sets fd's send and receive timeouts to what is left until deadline (_vs_now_ns); false when
 * nothing is. */
bool _vs_socket_deadline(int fd, uint64_t deadline);
/* Connects to the abstract name `a`, waiting (a full backlog too) until deadline at most. The
 * descriptor (blocking, close-on-exec), with the credentials of the process at the other end in
 * *peer; -1 with errno (EAGAIN: the deadline passed) when none; -2 when no socket can be made. */
int _vs_socket_connect(const struct sockaddr_un *a, socklen_t len, uint64_t deadline, struct ucred *peer);
/* Sends n bytes and nfds descriptors (SCM_RIGHTS) in one message, never waiting: 0 when all went. */
int _vs_send_fds(int fd, const void *buf, size_t n, const int *fds, int nfds);
/* Receives n bytes (all, within the socket's timeouts) and the descriptors with them: up to
 * VS_SRV_MAX_FDS into fds (*nfds), the others closed (*extra). recvmsg's result (one call: EINTR
 * is the caller's to retry). */
ssize_t _vs_recv_fds(int fd, void *buf, size_t n, int *fds, int *nfds, bool *extra);

#endif
