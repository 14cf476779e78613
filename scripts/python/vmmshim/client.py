"""The client side of the control channel (docs/control.md): find the processes under vmmshim,
send them one request each over their Unix socket, read the reply.

Every process under the shim that has used CUDA listens on the abstract Unix socket
"\\0vmmshim-ctl-<uid>-<pid>" and answers requests of one JSON line with one JSON line. This module
is what `vmmshim ctl`, `vmmshim top` and vmmshim.control(pid) use; it needs nothing but the
standard library. Failures are ControlError, whose `status` is the exit status the command line
gives them (EXIT_* below).

A reply is whatever the process chose to send: it is read up to MAX_REPLY bytes, parsed only when
it nests no deeper than MAX_DEPTH, and every member a verb's output uses is checked for its type
(REPLIES) before anyone reads it, so that a process that answers badly is one more failure to
report, never a crash of the client."""
import json
import math
import os
import re
import socket
import struct
import threading
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
MAX_REPLY = 1 << 20   # bytes of one reply line; a status reply of 64 tags takes a few KiB
MAX_DEPTH = 16        # nesting of a reply; the deepest the shim sends is 3
WORKERS = 16          # processes asked at once by statuses()


class ControlError(Exception):
    """A request that did not get done: `status` (an EXIT_* value), `error` (the process's errno
    name, such as "EBUSY", when it answered), `reply` (its reply, when it answered)."""

    def __init__(self, status, message, error=None, reply=None, reason=None):
        Exception.__init__(self, message)
        self.status = status
        self.error = error
        self.reply = reply
        self.reason = reason or message  # without the pid: a row of `ctl list` or `top` shows it


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
        raise ControlError(EXIT_USAGE, "%d is not a process id (a number above 0)" % pid)
    uid = process_uid(pid)
    if uid is None:
        raise ControlError(EXIT_NO_PROCESS, "no process %d" % pid, reason="exited")
    me = os.geteuid()
    if me != 0 and uid != me:
        raise ControlError(EXIT_OTHER_USER, "pid %d (%s) belongs to user %d: only its user and root may control it"
                           % (pid, program_of(pid), uid), reason="belongs to user %d" % uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(socket_name(uid, pid))
    except OSError:
        s.close()
        if process_uid(pid) is None:
            raise ControlError(EXIT_NO_PROCESS, "no process %d" % pid, reason="exited")
        raise ControlError(EXIT_NOT_SHIM, "pid %d (%s) is not under vmmshim, has not used CUDA yet, or runs with "
                           "VMMSHIM_CONTROL=0" % (pid, program_of(pid)), reason="no control channel")
    # Anyone may bind an abstract name: the server must be the process asked for.
    peer_pid, peer_uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
    if peer_pid != pid or peer_uid != uid:
        s.close()
        raise ControlError(EXIT_NOT_SHIM, "the control socket of pid %d is held by pid %d (user %d): not trusted"
                           % (pid, peer_pid, peer_uid),
                           reason="socket held by pid %d (user %d): not trusted" % (peer_pid, peer_uid))
    return s


def _gone(pid):
    if exited(pid):
        return ControlError(EXIT_GONE, "pid %d exited before answering" % pid, reason="exited before answering")
    return ControlError(EXIT_GONE, "pid %d closed the connection without answering" % pid,
                        reason="closed the connection without answering")


def _bad(pid, why):
    return ControlError(EXIT_GONE, "pid %d sent a bad reply: %s" % (pid, why), reason="bad reply: " + why)


def _read_line(s, pid, deadline, cap=MAX_REPLY):
    """The first line the server sends, without its newline: at most cap bytes, by the deadline."""
    buf = bytearray()
    while True:
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
        end = chunk.find(b"\n")  # in the new bytes only: the line so far has none
        buf += chunk if end < 0 else chunk[:end]
        if len(buf) > cap:
            raise _bad(pid, "longer than %d bytes" % cap)
        if end >= 0:
            return bytes(buf)


# Strings first (a bracket inside one does not nest), then the brackets.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _too_deep(line, limit):
    """Whether the JSON text nests arrays and objects deeper than limit. Counted before parsing,
    without recursion: the parser's own recursion would end in a RecursionError first."""
    depth = 0
    for m in _TOKEN.finditer(line):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _no_constant(name):
    raise ValueError("%s is not a JSON number" % name)


def parse_reply(pid, line):
    """The reply object of one line of bytes from pid; ControlError (EXIT_GONE) when it is none."""
    text = line.decode("utf-8", "replace")
    if _too_deep(text, MAX_DEPTH):
        raise _bad(pid, "nested deeper than %d" % MAX_DEPTH)
    try:
        reply = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise ControlError(EXIT_GONE, "pid %d sent something that is not a reply: %r" % (pid, line[:80]),
                           reason="bad reply: not JSON")
    if not isinstance(reply, dict):
        raise _bad(pid, "not an object")
    if not isinstance(reply.get("ok"), bool):
        raise _bad(pid, "missing 'ok'" if "ok" not in reply else "'ok' is not true or false")
    return reply


# ---------------------------------------------------------------- what a reply must hold
# A spec is a kind ("count": a whole number >= 0; "number"; "string"; "bool"), [spec] (a list of
# them), {member: spec} (an object with those members, and any others), or Opt(spec) (a member that
# may be missing or null). Only the members some output uses are listed.

class Opt:
    def __init__(self, spec):
        self.spec = spec


def _is(value, kind):
    if kind == "string":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "count":
        return isinstance(value, int) and value >= 0
    return math.isfinite(value)


_ARTICLE = {"count": "a count", "number": "a number", "string": "a string", "bool": "true or false"}


def problem(value, spec, path=""):
    """What is wrong with value against spec, naming the member ("missing 'devices[0].live'",
    "'mapped' is not a count"); None when nothing is. Recursion follows spec, not value, so it is as
    deep as the spec whatever the value holds."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return "'%s' is not an object" % path if path else "not an object"
        for key, sub in spec.items():
            where = "%s.%s" % (path, key) if path else key
            if isinstance(sub, Opt):
                if value.get(key) is None:
                    continue
                sub = sub.spec
            elif key not in value:
                return "missing '%s'" % where
            why = problem(value[key], sub, where)
            if why:
                return why
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return "'%s' is not a list" % path
        for i, item in enumerate(value):
            why = problem(item, spec[0], "%s[%d]" % (path, i))
            if why:
                return why
        return None
    if not _is(value, spec):
        return "'%s' is not %s" % (path, _ARTICLE[spec])
    return None


_SLEEP_FIGURES = {"host_copied": "count", "host_mapped": "count", "discarded": "count"}
STATUS = {
    "pid": "count", "uid": "count", "program": "string", "version": "string", "api": "count", "time_ns": "count",
    "process_tag": "string", "limit": "count", "mapped": "count",
    "host": {"in_use": "count", "cached": "count", "limit": "count"},
    "stats": {"allocs": ["count"], "frees": ["count"], "alloc_failures": "count", "passthrough_allocs": "count",
              "vmm_calls": "count", "vmm_ns": "count", "syncs": "count", "trims": "count"},
    "devices": [dict({"device": "count", "live": "count", "mapped": "count", "idle": "count", "pending": "count",
                      "handles": "count", "blocks": "count", "pools": "count"}, **_SLEEP_FIGURES)],
    "tags": [dict({"name": "string", "live": "count", "device": "count", "asleep": "bool", "keep": "bool",
                   "disk": Opt("count")}, **_SLEEP_FIGURES)],
}
_MOVED = {"cmd": Opt("string"), "tag": Opt("string"), "mode": Opt("string"), "level": Opt("count"),
          "released": Opt("count"), "restored": Opt("count"), "to_host": Opt("count"),
          "host_mapped": Opt("count"), "discarded": Opt("count"), "skipped": Opt("count"), "ms": Opt("number"),
          "reason": Opt("string")}
# The members each verb's reply must hold when "ok" is true (sleep, wake and promote also when
# it is false: a refusal says what moved).
REPLIES = {
    "status": STATUS,
    "tag": {"tag": "string", "previous": "string"},
    "sleep": _MOVED, "wake": _MOVED, "promote": _MOVED,
    "trim": {"released": "count", "mapped": "count"},
    "limit": {"limit": "count", "previous": "count", "mapped": "count", "note": Opt("string")},
    "dump": {"report": "string", "truncated": Opt("bool")},
    "release-host": {"released": "count", "in_use": "count", "cached": "count"},
    "rules": {"changed": "bool", "rules": [{"rule": "string", "tag": "string", "matched": "count"}]},
    "priority": {"priority": "count", "previous": "count"},
    "cold": {"tag": "string", "mode": "string", "previous": "string"},
    "residue": {"sleeps": "count", "host_pinned": "count", "shared": "count", "note": "string",
                "devices": [{"device": "count", "used": "count", "total": "count", "free": "count",
                             "owners": {"tags": "count", "libraries": "count", "managed": "count", "graphs": "count",
                                        "arrays": "count", "context": "count", "other_processes": "count",
                                        "unexplained": "number", "modules": Opt("count"), "inferred": Opt("count")},
                             "growth": "number", "process": Opt("count")}],
                "libraries": [{"name": "string", "vmm": "count", "managed": "count", "host": "count"}],
                "sites": [{"library": "string", "address": "string", "bytes": "count", "growth": "number",
                           "offset": Opt("string"), "symbol": Opt("string")}]},
}
_REFUSAL = {"error": Opt("string"), "message": Opt("string")}


def exchange(s, pid, cmd, deadline, args):
    """Sends {"v": 1, "cmd": cmd, **args} (None values left out) on the connected socket s and
    returns the reply line, by the deadline; socket errors and timeouts go to the caller."""
    msg = {"v": PROTOCOL, "cmd": cmd}
    msg.update({k: v for k, v in args.items() if v is not None})
    s.settimeout(max(0.001, deadline - time.monotonic()))
    s.sendall((json.dumps(msg) + "\n").encode())
    return _read_line(s, pid, deadline)


def request(pid, cmd, timeout=TIMEOUT, **args):
    """Sends {"v": 1, "cmd": cmd, **args} to pid; returns its reply (a dict, "ok" true or false,
    holding what REPLIES lists for cmd). Raises ControlError when there is no reply, the reply is
    malformed, or the process refused the connection. timeout bounds the whole exchange."""
    deadline = time.monotonic() + timeout
    s = _connect(pid, timeout)
    try:
        line = exchange(s, pid, cmd, deadline, args)
    except socket.timeout:
        raise ControlError(EXIT_TIMEOUT, "pid %d did not answer within %g s (a sleep or wake in progress delays "
                                         "other requests; --timeout S waits longer)" % (pid, timeout),
                           reason="no answer within %g s" % timeout)
    except (BrokenPipeError, ConnectionResetError):
        raise _gone(pid)
    finally:
        s.close()
    reply = parse_reply(pid, line)
    why = problem(reply, _REFUSAL)
    if not why and (reply["ok"] or cmd in ("sleep", "wake", "promote")):
        why = problem(reply, REPLIES.get(cmd, {}))
    if why:
        raise _bad(pid, why)
    if not reply["ok"] and reply.get("error") == "EPERM":
        raise ControlError(EXIT_OTHER_USER, "pid %d refused: %s" % (pid, reply.get("message", "")), "EPERM", reply,
                           reason="refused: EPERM")
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
            message = reply.get("message", "")
            if reply.get("error") == "ENOENT" and isinstance(args.get("tag"), str):
                # The shim answers an unknown tag with its errno's text alone, which names no tag.
                message = "no such tag: %s" % args["tag"]
            raise ControlError(EXIT_REFUSED, "pid %d: %s: %s: %s" % (self.pid, cmd, reply.get("error", "?"), message),
                               reply.get("error"), reply)
        return reply

    def status(self):
        return self.call("status")

    def tag(self, name):
        """New allocations of the process's threads that set no tag of their own go to tag name."""
        return self.call("tag", tag=name)

    def sleep(self, tag=None, mode=None, level=None):
        """Sleeps tag (None: every tag) in mode "discard", "host" (the default), "mapped" or "disk"; or the
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

    def rules(self, spec=None, clear=False):
        """The tag rules in force, with the allocations each tagged (reply["rules"]); spec replaces
        them (docs/tag-rules.md), clear removes them. A malformed spec is refused (EINVAL), its
        message naming the rule and the character; the rules in force then stay."""
        return self.call("rules", spec=spec, clear=True if clear else None)

    def residue(self):
        """What is still on each device and who owns it (docs/sleep.md, "Residue")."""
        return self.call("residue")

    def promote(self):
        """Memory served from host memory past a limit (VMMSHIM_ON_LIMIT=host) back to the device,
        as far as the limit allows now; EALREADY when there is none."""
        return self.call("promote", self.move_timeout, ("EALREADY",))


def statuses(timeout, pids=None):
    """[(pid, status reply or None, why)] for every reachable process (those of pids only, when
    given), sorted by pid. The processes are asked at once, WORKERS at a time, and timeout bounds
    the whole: a process that has not answered by then is a row "no answer within", however many
    there are. why is short (no pid): the reason a row shows."""
    targets = [pid for pid in reachable() if pids is None or pid in pids]
    deadline = time.monotonic() + timeout
    todo = list(reversed(targets))
    got = {}
    lock = threading.Lock()

    def ask():
        while True:
            with lock:
                if not todo:
                    return
                pid = todo.pop()
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise ControlError(EXIT_TIMEOUT, "no answer")
                got[pid] = (pid, request(pid, "status", left), None)
            except ControlError as e:
                # A late start had less than timeout left: the bound the caller gave is what to say.
                why = "no answer within %g s" % timeout if e.status == EXIT_TIMEOUT else e.reason
                got[pid] = (pid, None, why)

    # Daemon threads: one stuck past the deadline does not keep the command from exiting.
    threads = [threading.Thread(target=ask, daemon=True) for _ in range(min(WORKERS, len(targets)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + 0.5 - time.monotonic()))
    return [got.get(pid) or (pid, None, "no answer within %g s" % timeout) for pid in targets]


def asleep(figures):
    """Bytes of a tag's (or a device's) status figures that are not on the device."""
    return figures["host_copied"] + figures["host_mapped"] + figures["discarded"]
