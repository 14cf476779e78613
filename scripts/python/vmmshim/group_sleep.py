"""A whole group's sleep and wake, all or nothing: `vmmshim ctl --group NAME sleep|wake [TAG]
[--mode M] [--level L] [--zero] [--timeout S] [--json]`, and `vmmshim.control_group(NAME)`; also
`ctl --group NAME status`, which adds each member's tags to the segment's figures.

The members are the live processes the group's segment lists (group_shm.py). The client talks to
each over its own control socket (client.py), one connection and one thread per member. A sleep:

  phase 1  `quiesce`: the member's new GPU work waits at its gate, its contexts are synchronised,
           and it holds so, with a lease (src/hook/control_group.c), until this client releases it,
           its connection closes, or the lease runs out; its reply lists its tags, asleep or not;
  phase 2  only once every member has answered quiesced: the sleep on every member at once, on
           the same connections;
  end      as soon as the last member answered its move, each member's thread releases it.

A wake has no phase 1: it is sent to every member at once, and each member's own wake closes its
gate and synchronises its contexts before anything moves. A wake cannot be rolled back (below), so
holding every member still first would buy nothing but a second wait for the kernels that run on
host-mapped memory.

The answer's "phases_ms" and each member's "rt_ms" say where the command's time went.

All or nothing, for a sleep: when a member fails its quiesce or its move, does not answer by the
deadline (--timeout, for the whole command), or dies, no member is left asleep by this command:
those that moved (the one that failed part way too) are woken back, tag by tag, with their bytes;
those that never moved are only released. A wake cannot be rolled back into a sleep: a member whose
wake failed (no room on the device, say) stays asleep, the others stay awake, and the answer names
the ones still asleep; the same command again wakes only those (the others answer that they are
awake already), once room is made. Sleeping the woken ones again would cost a copy each way and
leave the job no more runnable than it is.

Per member, the answer says what happened: moved, nothing to do, rolled back, failed (with the
reason), timed out, gone (it exited), released (quiesced, never moved), still asleep (a wake).
Exit status 0 when every member did it (or had nothing to do), 1 otherwise, 2 on a usage error."""
import json
import socket
import sys
import threading
import time

from . import client, group_shm, groups, text
from .client import ControlError

TIMEOUT = 60.0          # seconds for the whole command (--timeout)
LEASE_MARGIN_S = 5.0    # the members' lease: the command's deadline and this much more
DONE = ("moved", "nothing to do")


class GroupOpError(Exception):
    """The command could not start (no such group, no live member, another pid namespace)."""


class _Member:
    """One member's connection and what happened to it."""

    def __init__(self, m):
        self.pid, self.program = m["pid"], m["comm"]
        self.sock = None
        self.token = None
        self.asleep_before = {}   # tag -> asleep, before phase 2
        self.result = "released"
        self.reason = ""
        self.reply = None
        self.quiesce_ms = None
        self.lease = "held"
        self.rt_ms = {}           # request -> its round trip, connecting included (--json: where the time went)

    def ask(self, cmd, deadline, **args):
        """One request on the member's connection: its reply (ok or not), or ControlError."""
        t0 = time.monotonic()
        try:
            if self.sock is None:
                self.sock = client._connect(self.pid, max(0.001, deadline - time.monotonic()))
            line = client.exchange(self.sock, self.pid, cmd, deadline, args)
        except socket.timeout:
            self.close()
            raise ControlError(client.EXIT_TIMEOUT, "pid %d did not answer in time" % self.pid,
                               reason="no answer in time")
        except (BrokenPipeError, ConnectionResetError):
            self.close()
            raise client._gone(self.pid)
        except ControlError:
            self.close()
            raise
        self.rt_ms[cmd] = round(self.rt_ms.get(cmd, 0.0) + (time.monotonic() - t0) * 1000.0, 3)
        reply = client.parse_reply(self.pid, line)
        why = client.problem(reply, client.REPLIES.get(cmd, {})) if reply["ok"] or cmd in ("sleep", "wake") else None
        if why:
            self.close()
            raise client._bad(self.pid, why)
        return reply

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def fail(self, result, e):
        self.result = result
        self.reason = getattr(e, "reason", None) or str(e)

    def row(self):
        return {"pid": self.pid, "program": self.program, "result": self.result, "reason": self.reason,
                "reply": self.reply, "quiesce_ms": self.quiesce_ms, "lease": self.lease, "rt_ms": self.rt_ms}


def _classify(e):
    if e.status == client.EXIT_TIMEOUT:
        return "timed out"
    if e.status in (client.EXIT_GONE, client.EXIT_NO_PROCESS):
        return "gone"
    return "failed"


def _each(members, fn, deadline):
    """fn(member) on every member at once, one thread each; waits until all are done or the
    deadline (and a little more: each request is bounded by it) has passed."""
    threads = [threading.Thread(target=fn, args=(m,), daemon=True) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + 1.0 - time.monotonic()))
    return [m for m, t in zip(members, threads) if t.is_alive()]


def _moved_bytes(r):
    return sum(r.get(k) or 0 for k in ("released", "to_host", "host_mapped", "discarded"))


class GroupControl:
    """vmmshim.control_group(NAME): the group's live members, steered together."""

    def __init__(self, name, timeout=TIMEOUT):
        if not group_shm.name_ok(name):
            raise GroupOpError("'%s' is not a group name (1-31 of A-Z a-z 0-9 _ . -)" % name)
        self.name = name
        self.timeout = float(timeout)
        self.between = None  # tests: called with the members before the move (a sleep: after phase 1)

    def members(self):
        """The live members (dicts of group_shm's reader), refused when the segment was made in
        another pid namespace: its pids would name other processes here."""
        try:
            s = group_shm.status(self.name)
        except group_shm.GroupError as e:
            raise GroupOpError(str(e))
        if s.get("pidns") and group_shm.pidns() and s["pidns"] != group_shm.pidns():
            raise GroupOpError("group '%s' was made in another pid namespace: its pids mean nothing here; run "
                               "vmmshim ctl in the members' namespace" % self.name)
        return [m for m in s["members_list"] if m["alive"]]

    def status(self):
        """The segment's status (group_shm.status) with each live member's control status under
        "control" (or its failure under "control_error")."""
        try:
            s = group_shm.status(self.name)
        except group_shm.GroupError as e:
            raise GroupOpError(str(e))
        live = [m for m in s["members_list"] if m["alive"]]
        got = {pid: (st, why) for pid, st, why in client.statuses(min(self.timeout, client.TIMEOUT),
                                                                   set(m["pid"] for m in live))}
        for m in live:
            st, why = got.get(m["pid"], (None, "no control channel"))
            if st is not None and st.get("ok"):
                m["control"] = {"tags": st["tags"], "devices": st["devices"], "mapped": st["mapped"]}
            else:
                m["control_error"] = why or (st or {}).get("message", "refused")
        return s

    def sleep(self, tag=None, mode=None, level=None):
        """Every live member sleeps tag (None: every tag) in mode, or at level; all or nothing."""
        args = {"mode": mode, "level": level}
        args.update({"tag": tag} if tag is not None else {"all": True})
        return self._run("sleep", tag, args)

    def wake(self, tag=None, zero=False):
        args = {"zero": bool(zero)}
        args.update({"tag": tag} if tag is not None else {"all": True})
        return self._run("wake", tag, args)

    # ---- the two phases
    def _run(self, verb, tag, args):
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        ms = [_Member(m) for m in self.members()]
        out = {"group": self.name, "cmd": verb, "tag": tag or "all", "mode": args.get("mode"),
               "level": args.get("level"), "ok": False, "outcome": "", "members": []}
        if not ms:
            raise GroupOpError("group '%s' has no live member" % self.name)
        lease_ms = int((self.timeout + LEASE_MARGIN_S) * 1000)
        phases = out["phases_ms"] = {"members": (time.monotonic() - t0) * 1000.0}
        try:
            if verb == "sleep":
                self._timed(phases, "quiesce", self._quiesce, ms, deadline, lease_ms, tag)
            if verb == "wake" or all(m.token for m in ms):
                if self.between:
                    self.between(ms)
                self._timed(phases, "move", self._move, ms, verb, args, deadline)
                out["ok"] = all(m.result in DONE for m in ms)
                if not out["ok"] and verb == "sleep":
                    self._timed(phases, "rollback", self._roll_back, ms, tag)
            else:
                for m in ms:
                    if m.token and m.result == "released":
                        m.reason = "not moved: another member did not quiesce"
        finally:
            if verb == "sleep":
                self._timed(phases, "release", self._release, ms)
            else:
                for m in ms:
                    m.lease = None
                    m.close()
        out["outcome"] = "done" if out["ok"] else ("rolled back" if verb == "sleep" else "failed")
        out["ms"] = round((time.monotonic() - t0) * 1000.0, 3)
        for k in phases:
            phases[k] = round(phases[k], 3)
        out["members"] = [m.row() for m in ms]
        return out

    @staticmethod
    def _timed(phases, name, fn, *args):
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            phases[name] = (time.monotonic() - t) * 1000.0

    def _quiesce(self, ms, deadline, lease_ms, tag):
        def one(m):
            try:
                q = m.ask("quiesce", deadline, lease_ms=lease_ms)
                if not q["ok"]:
                    raise ControlError(client.EXIT_REFUSED, q.get("message", ""), reason="quiesce: %s: %s" % (
                        q.get("error", "?"), q.get("message", "")))
                if not isinstance(q.get("token"), int) or q["token"] < 1:
                    raise client._bad(m.pid, "quiesce: no token")
                m.token, m.quiesce_ms = q["token"], q.get("ms")
                tags = q.get("tags")
                if not isinstance(tags, list) or not all(isinstance(t, dict) for t in tags):
                    raise client._bad(m.pid, "quiesce: no tags")
                # Which tags slept before this command: a rollback wakes only the others.
                m.asleep_before = {t.get("name"): bool(t.get("asleep")) for t in tags}
                if tag is not None and tag not in m.asleep_before:
                    raise ControlError(client.EXIT_REFUSED, "no such tag", reason="ENOENT: no such tag: %s" % tag)
            except ControlError as e:
                m.fail(_classify(e), e)
        for m in _each(ms, one, deadline):
            m.fail("timed out", ControlError(client.EXIT_TIMEOUT, "", reason="no answer to quiesce in time"))

    def _move(self, ms, verb, args, deadline):
        left, lock, all_answered = [len(ms)], threading.Lock(), threading.Event()

        def one(m):
            try:
                move_one(m)
            finally:
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        all_answered.set()
            # A sleep every member did: each member's own thread releases it as soon as the last
            # one answered, with no thread to start and no join between the move and the release.
            if verb == "sleep" and m.token and all_answered.wait(max(0.0, deadline - time.monotonic())) \
                    and all(x.result in DONE for x in ms):
                self._release_one(m, time.monotonic() + min(self.timeout, client.TIMEOUT))

        def move_one(m):
            try:
                r = m.ask(verb, deadline, **args)
                m.reply = r
                if r["ok"] and verb == "sleep" and r.get("skipped"):
                    # Part of it stayed on the device (no room in host memory, say): not the sleep
                    # the group asked for.
                    m.result = "failed"
                    m.reason = "%s stayed on the device: %s" % (text.size(r["skipped"]), r.get("reason") or "?")
                elif r["ok"]:
                    m.result = "moved"
                elif r.get("error") == "EALREADY":
                    m.result = "nothing to do"
                elif r.get("error") == "ENOENT":
                    m.result = "failed"  # no such tag: nothing of it was asleep
                    m.reason = "ENOENT: %s" % r.get("message", "")
                else:
                    m.result = "failed" if verb == "sleep" else "still asleep"
                    m.reason = "%s: %s" % (r.get("error", "?"), r.get("message", ""))
            except ControlError as e:
                m.fail(_classify(e), e)
                if verb == "wake" and m.result != "gone":
                    m.reason = "%s; may still be asleep" % m.reason
        for m in _each(ms, one, deadline):
            m.fail("timed out", ControlError(client.EXIT_TIMEOUT, "", reason="no answer to %s in time" % verb))
            m.close()

    def _roll_back(self, ms, tag):
        """Every member that may have moved wakes the tags this command put to sleep."""
        deadline = time.monotonic() + self.timeout

        def one(m):
            if m.result == "gone" or m.token is None:
                return
            if m.result == "failed" and m.reply is not None and not _moved_bytes(m.reply):
                return  # refused before moving anything
            if m.result == "nothing to do":
                return
            names = [t for t, asleep in m.asleep_before.items() if not asleep and (tag is None or t == tag)]
            try:
                for t in names:
                    r = m.ask("wake", deadline, tag=t)
                    if not r["ok"] and r.get("error") != "EALREADY":
                        raise ControlError(client.EXIT_REFUSED, "", reason="wake %s: %s: %s" % (
                            t, r.get("error", "?"), r.get("message", "")))
                was = m.result
                m.result = "rolled back" if was == "moved" else m.result
                if was != "moved":
                    m.reason += "; rolled back"
            except ControlError as e:
                m.result = "rollback failed"
                m.reason = (m.reason + "; " if m.reason else "") + (e.reason or str(e))
        _each(ms, one, deadline)

    @staticmethod
    def _release_one(m, deadline):
        if m.token is None:
            m.lease = None
            m.close()
            return
        try:  # on its connection, or on a new one when that was closed (a timeout): same token
            r = m.ask("release", deadline, token=m.token)
            m.lease = "released" if r["ok"] else ("ran out" if r.get("error") == "ESRCH" else "refused")
        except ControlError:
            m.lease = "ended with its connection"
        m.close()

    def _release(self, ms):
        """Every member still held (not released at the end of its move) is released."""
        deadline = time.monotonic() + min(self.timeout, client.TIMEOUT)
        _each([m for m in ms if m.lease == "held"], lambda m: self._release_one(m, deadline), deadline)


# ---------------------------------------------------------------- the command line

def _what(out):
    w = "%s %s" % (out["cmd"], out["tag"])
    if out.get("level") is not None:
        w = "sleep level %d" % out["level"]
    if out.get("mode"):
        w += " (%s)" % out["mode"]
    return w


def _detail(m):
    r = m.get("reply") or {}
    parts = []
    for key, label in (("released", "released"), ("restored", "restored"), ("to_host", "host copy"),
                       ("host_mapped", "host-mapped"), ("discarded", "discarded"), ("skipped", "skipped")):
        if r.get(key):
            parts.append("%s %s" % (label, text.size(r[key])))
    line = ", ".join(parts)
    if r.get("ms") is not None and parts:
        line += " in %.1f ms" % r["ms"]
    if m.get("reason"):
        line = (line + "; " if line else "") + text.clean(m["reason"])
    if m.get("lease") == "ran out":
        line = (line + "; " if line else "") + "its quiesce lease ran out before the release"
    return line


def print_result(out):
    ms = out["members"]
    head = "group %s: %s: %s on %d member%s in %.1f ms" % (out["group"], _what(out), out["outcome"], len(ms),
                                                          "" if len(ms) == 1 else "s", out["ms"])
    if not out["ok"]:
        bad = [m for m in ms if m["result"] not in DONE + ("rolled back", "released")]
        head += " (%s)" % ", ".join("pid %d %s" % (m["pid"], m["result"]) for m in bad)
    print(head)
    print("%8s  %-16s %-15s %s" % ("PID", "PROGRAM", "RESULT", "DETAIL"))
    for m in ms:
        print("%8d  %-16s %-15s %s" % (m["pid"], text.clean(m["program"])[:16], m["result"], _detail(m)))


def print_status(s):
    group_shm.print_status(s)
    for m in s["members_list"]:
        if not m["alive"]:
            continue
        if "control" not in m:
            print("pid %d: tags unknown: %s" % (m["pid"], text.clean(m.get("control_error") or "?")))
            continue
        tags = ["%s %s%s" % (text.clean(t["name"]), text.size(t["live"]), " (asleep)" if t["asleep"] else "")
                for t in m["control"]["tags"]]
        print("pid %d: on the device %s; tags: %s" % (m["pid"], text.size(m["control"]["mapped"]),
                                                      ", ".join(tags) or "none"))


USAGE = {"sleep": "sleep [TAG] [--mode M] [--level L] [--timeout S] [--json]",
         "wake": "wake [TAG] [--zero] [--timeout S] [--json]", "status": "status [--json]"}


def _usage(verb, why):
    sys.stderr.write("vmmshim: error: %s\nusage: vmmshim ctl --group NAME %s\n" % (why, USAGE[verb]))
    return client.EXIT_USAGE


def _take(args, flag, has_value):
    if flag not in args:
        return None
    i = args.index(flag)
    if not has_value:
        del args[i]
        return True
    if i + 1 >= len(args):
        raise ValueError("%s needs a value" % flag)
    v = args[i + 1]
    del args[i:i + 2]
    return v


def main(group, verb, args):
    args = list(args)
    try:
        as_json = bool(_take(args, "--json", False))
        timeout = _take(args, "--timeout", True) if verb != "status" else None
        mode = _take(args, "--mode", True) if verb == "sleep" else None
        level = _take(args, "--level", True) if verb == "sleep" else None
        zero = bool(_take(args, "--zero", False)) if verb == "wake" else False
    except ValueError as e:
        return _usage(verb, str(e))
    try:
        timeout = float(timeout) if timeout is not None else TIMEOUT
        if not 0 < timeout <= 3600:
            raise ValueError
    except ValueError:
        return _usage(verb, "--timeout: seconds, above 0 and at most 3600 (got '%s')" % timeout)
    if mode is not None and mode not in ("discard", "host", "mapped"):
        return _usage(verb, "--mode: discard, host or mapped (got '%s')" % mode)
    if level is not None:
        if level not in ("0", "1", "2"):
            return _usage(verb, "--level: 0, 1 or 2 (got '%s')" % level)
        level = int(level)
        if args:
            return _usage(verb, "--level applies to every tag: give no TAG")
    if len(args) > (0 if verb == "status" else 1) or any(a.startswith("-") for a in args):
        return _usage(verb, "%s: unexpected %s" % (verb, " ".join(args)))
    try:
        g = GroupControl(group, timeout)
        if verb == "status":
            s = g.status()
            if as_json:
                print(json.dumps(s, indent=1, sort_keys=True))
            else:
                print_status(s)
            return client.EXIT_OK
        tag = args[0] if args else None
        out = g.sleep(tag, mode, level) if verb == "sleep" else g.wake(tag, zero)
    except GroupOpError as e:
        sys.stderr.write("vmmshim: error: %s\n" % e)
        return client.EXIT_REFUSED
    except BrokenPipeError:
        raise  # standard output closed by its reader: cli.main ends quietly
    except OSError as e:
        sys.stderr.write("vmmshim: error: %s\n" % (e.strerror or e))
        return client.EXIT_REFUSED
    if as_json:
        print(json.dumps(out, separators=(",", ":")))
    else:
        print_result(out)
    return client.EXIT_OK if out["ok"] else client.EXIT_REFUSED


groups.register("sleep", lambda group, args: main(group, "sleep", args), USAGE["sleep"])
groups.register("wake", lambda group, args: main(group, "wake", args), USAGE["wake"])
groups.register("status", lambda group, args: main(group, "status", args), USAGE["status"])
