"""The client side of the control channel (docs/control.md): find the processes under vmmshim,
send them one request each over their Unix socket, read the reply.

Every process under the shim that has used CUDA listens on the abstract Unix socket
"\\0vmmshim-ctl-<uid>-<pid>" and answers requests of one JSON line with one JSON line. This module
is what `vmmshim ctl`, `vmmshim top` and vmmshim.control(pid) use; it needs nothing but the
standard library. Failures are ControlError, whose `status` is the exit status the command line
gives them (EXIT_* below)."""
import json
import os
import re
import socket
import struct
import time

PROTOCOL = 1

# Exit statuses of `vmmshim ctl` (docs/control.md "Exit status").
EXIT_OK = 0
EXIT_REFUSED = 1      # the process answered, and refused the command (the message says why)
EXIT_USAGE = 2        # bad command line
EXIT_NO_PROCESS = 3   # no such process
EXIT_NOT_SHIM = 4     # the process exists, but is not under vmmshim (or has not used CUDA yet, or its channel is off)
EXIT_OTHER_USER = 5   # the process belongs to another user
EXIT_TIMEOUT = 6      # no answer in time
EXIT_GONE = 7         # the process exited, or closed the connection, before answering

TIMEOUT = 10.0        # seconds for an answer
MOVE_TIMEOUT = 300.0  # for sleep and wake, which copy memory (and may wait for a stream capture)


class ControlError(Exception):
    """A request that did not get done: `status` (an EXIT_* value), `error` (the process's errno
    name, such as "EBUSY", when it answered), `reply` (its reply, when it answered)."""

    def __init__(self, status, message, error=None, reply=None):
        Exception.__init__(self, message)
        self.status = status
        self.error = error
        self.reply = reply


def socket_name(uid, pid):
    return "\0vmmshim-ctl-%d-%d" % (uid, pid)


def process_uid(pid):
    """The effective uid of a process, or None when there is no such process."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None


def exited(pid):
    """True when pid is gone, or a zombie (it exited; its parent has not collected it yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def program_of(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


_LISTED = re.compile(r"@vmmshim-ctl-(\d+)-(\d+)$")


def listening():
    """(uid, pid) of every control socket in /proc/net/unix (this network namespace), sorted."""
    found = set()
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                m = _LISTED.search(line.rstrip("\n"))
                if m:
                    found.add((int(m.group(1)), int(m.group(2))))
    except OSError:
        pass
    return sorted(found, key=lambda up: up[1])


def reachable():
    """The pids this user may control: its own processes, every one for root."""
    me = os.geteuid()
    return [pid for uid, pid in listening() if (me == 0 or uid == me) and os.path.exists("/proc/%d" % pid)]


def _connect(pid, timeout):
    if pid <= 0:
        raise ControlError(EXIT_NO_PROCESS, "%d is not a process id" % pid)
    uid = process_uid(pid)
    if uid is None:
        raise ControlError(EXIT_NO_PROCESS, "no process %d" % pid)
    me = os.geteuid()
    if me != 0 and uid != me:
        raise ControlError(EXIT_OTHER_USER, "pid %d (%s) belongs to user %d: only its user and root may control it"
                           % (pid, program_of(pid), uid))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(socket_name(uid, pid))
    except OSError:
        s.close()
        if process_uid(pid) is None:
            raise ControlError(EXIT_NO_PROCESS, "no process %d" % pid)
        raise ControlError(EXIT_NOT_SHIM, "pid %d (%s) is not under vmmshim, has not used CUDA yet, or runs with "
                           "VMMSHIM_CONTROL=0" % (pid, program_of(pid)))
    # Anyone may bind an abstract name: the server must be the process asked for.
    peer_pid, peer_uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
    if peer_pid != pid or peer_uid != uid:
        s.close()
        raise ControlError(EXIT_NOT_SHIM, "the control socket of pid %d is held by pid %d (user %d): not trusted"
                           % (pid, peer_pid, peer_uid))
    return s


def _gone(pid):
    if exited(pid):
        return ControlError(EXIT_GONE, "pid %d exited before answering" % pid)
    return ControlError(EXIT_GONE, "pid %d closed the connection without answering" % pid)


def _read_line(s, pid, timeout):
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise _gone(pid)
        buf += chunk
    return buf.split(b"\n", 1)[0]


def request(pid, cmd, timeout=TIMEOUT, **args):
    """Sends {"v": 1, "cmd": cmd, **args} to pid; returns its reply (a dict, "ok" true or false).
    Raises ControlError when there is no reply, or the process refused the connection."""
    msg = {"v": PROTOCOL, "cmd": cmd}
    msg.update({k: v for k, v in args.items() if v is not None})
    s = _connect(pid, timeout)
    try:
        s.sendall((json.dumps(msg) + "\n").encode())
        line = _read_line(s, pid, timeout)
    except socket.timeout:
        raise ControlError(EXIT_TIMEOUT, "pid %d did not answer within %g s (a sleep or wake in progress delays "
                                         "other requests; --timeout S waits longer)" % (pid, timeout))
    except (BrokenPipeError, ConnectionResetError):
        raise _gone(pid)
    finally:
        s.close()
    try:
        reply = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        raise ControlError(EXIT_GONE, "pid %d sent something that is not a reply: %r" % (pid, line[:80]))
    if not isinstance(reply, dict) or "ok" not in reply:
        raise ControlError(EXIT_GONE, "pid %d sent something that is not a reply: %r" % (pid, line[:80]))
    if not reply["ok"] and reply.get("error") == "EPERM":
        raise ControlError(EXIT_OTHER_USER, "pid %d refused: %s" % (pid, reply.get("message", "")), "EPERM", reply)
    return reply


class Control:
    """The verbs of `vmmshim ctl` for one process, as methods: each returns the process's reply (a
    dict) and raises ControlError when it was not done. A sleep or wake with nothing to do (asleep
    already, awake already) is not an error: its reply has "error": "EALREADY"."""

    def __init__(self, pid, timeout=TIMEOUT, move_timeout=MOVE_TIMEOUT):
        self.pid = int(pid)
        self.timeout = timeout
        self.move_timeout = move_timeout

    def call(self, cmd, timeout=None, tolerate=(), **args):
        reply = request(self.pid, cmd, timeout or self.timeout, **args)
        if not reply["ok"] and reply.get("error") not in tolerate:
            raise ControlError(EXIT_REFUSED, "pid %d: %s: %s: %s" % (self.pid, cmd, reply.get("error", "?"),
                                                                     reply.get("message", "")),
                               reply.get("error"), reply)
        return reply

    def status(self):
        return self.call("status")

    def tag(self, name):
        """New allocations of the process's threads that set no tag of their own go to tag name."""
        return self.call("tag", tag=name)

    def sleep(self, tag=None, mode=None, level=None):
        """Sleeps tag (None: every tag) in mode "discard", "host" (the default) or "mapped"; or the
        whole process at level 0, 1 or 2 (tag None)."""
        target = {"tag": tag} if tag is not None else {"all": True}
        return self.call("sleep", self.move_timeout, ("EALREADY",), mode=mode, level=level, **target)

    def wake(self, tag=None, zero=False):
        target = {"tag": tag} if tag is not None else {"all": True}
        return self.call("wake", self.move_timeout, ("EALREADY",), zero=bool(zero), **target)

    def trim(self):
        return self.call("trim", self.move_timeout)

    def limit(self, size):
        """The process's cap on mapped bytes (VMMSHIM_LIMIT) from now on: bytes, or a string such as
        "8G"; 0 or "none": no cap."""
        return self.call("limit", bytes=size)

    def dump(self):
        """The memory report (also written to the process's log): reply["report"]."""
        return self.call("dump")

    def release_host(self, keep=0):
        return self.call("release-host", keep=keep)

    def promote(self):
        """Memory served from host memory past a limit (VMMSHIM_ON_LIMIT=host) back to the device,
        as far as the limit allows now; EALREADY when there is none."""
        return self.call("promote", self.move_timeout, ("EALREADY",))


def statuses(timeout):
    """[(pid, status reply or None, why)] for every reachable process."""
    out = []
    for pid in reachable():
        try:
            out.append((pid, request(pid, "status", timeout), None))
        except ControlError as e:
            out.append((pid, None, str(e)))
    return out


def asleep(figures):
    """Bytes of a tag's (or a device's) status figures that are not on the device."""
    return figures["host_copied"] + figures["host_mapped"] + figures["discarded"]
