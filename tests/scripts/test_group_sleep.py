#!/usr/bin/env python3
"""`vmmshim ctl --group NAME sleep|wake|status` and vmmshim.control_group, on the host emulation.

The members are build/tests/test_shim_control's serve mode under the shim, each in one group
(VMMSHIM_LIMIT_GROUP): tags weights (8 MiB) and kv (4 MiB) filled with patterns, checked when
asked ("check"); "touch" makes a copy on the device, which waits while the member's gate is closed.
  - four members: a group sleep (host) moves every member's tags off the device, status shows
    them asleep per member; a group wake brings them back, every byte checked in every member;
  - a fifth member whose host memory cannot hold its tags (VMMSHIM_HOST_LIMIT) fails its move:
    the group rolls back, no tag of any member is left asleep, bytes intact;
  - a member killed between the phases (after every member quiesced, before the move): it is
    "gone", the others roll back, bytes intact;
  - a member stopped (SIGSTOP) does not answer its quiesce: the command fails by --timeout, no
    member moved, and every member's gate is open again (its copies run);
  - a failed wake (the group's limit lowered under the members' bytes) names the members still
    asleep; once the limit is raised, the same wake wakes only those;
  - the member's side alone: a quiesce holds the gate, a second quiesce is refused (EBUSY), the
    lease reopens the gate when no release comes, and so does the close of the connection; a
    release after the lease ran out is ESRCH;
  - the trace of a member (VMMSHIM_TRACE, format version 4) has its `b` records: quiesced, and
    ended by a release, by the lease and by a closed connection; vmmshim-report reads it without
    a warning.
Ends with "N passed, N failed"."""
import json
import os
import signal
import socket
import sys
import threading
import time

from harness import BUILD_DIR, EMU, LIB, PYDIR, ServeProcess, check, ctl, report, scratch, summary

sys.path.insert(0, PYDIR)

SERVE = os.path.join(BUILD_DIR, "tests", "test_shim_control")
GROUP = "vs-test-gsleep-%d" % os.getpid()


class Member(ServeProcess):
    def __init__(self, **env):
        super().__init__(dict(os.environ, LD_PRELOAD=LIB, LD_LIBRARY_PATH=EMU, VMMSHIM_LIMIT_GROUP=GROUP,
                              VMMSHIM_LIMIT="1G", **env))

    def touch_s(self):
        """Seconds a copy on the device took (it waits while the gate is closed)."""
        t = time.monotonic()
        ok = self.ask("touch") == "touch ok"
        return time.monotonic() - t if ok else -1.0


def group_json(*args):
    rc, out = ctl("--group", GROUP, *(list(args) + ["--json"]))
    try:
        return rc, json.loads(out)
    except ValueError:
        return rc, {"raw": out}


def asleep_tags(pid):
    """The member's tags asleep, of weights and kv (touch's byte lands in untagged)."""
    rc, out = ctl(pid, "status", "--json")
    try:
        return sorted(t["name"] for t in json.loads(out)["tags"] if t["asleep"] and t["name"] != "untagged")
    except (ValueError, KeyError):
        return ["?" + out[:100]]


def results(out):
    return {m["pid"]: m["result"] for m in out.get("members", [])}


def all_intact(ms):
    return all(m.ask("check") == "weights ok kv ok" for m in ms)


def sleep_and_wake(ms):
    rc, out = group_json("sleep")
    check(rc == 0 and out.get("ok") and out.get("outcome") == "done"
          and results(out) == {m.pid: "moved" for m in ms},
          "group sleep of 4 members: every member moved [%s]" % json.dumps(out)[:300])
    check(all(asleep_tags(m.pid) == ["kv", "weights"] for m in ms),
          "after the group sleep every member's weights and kv are asleep")
    check(all(r["lease"] == "released" for r in out.get("members", [])),
          "every member's quiesce was released by the command (not by its lease)")
    check(all(sorted(r.get("rt_ms") or {}) == ["quiesce", "release", "sleep"] for r in out.get("members", []))
          and sorted(out.get("phases_ms") or {}) == ["members", "move", "quiesce", "release"],
          "the sleep's round trips: quiesce, sleep, release, no status (the quiesce lists the tags); its "
          "phases timed [%s]" % json.dumps([out.get("phases_ms")] + [r.get("rt_ms") for r in out.get("members", [])]))
    rc, text = ctl("--group", GROUP, "status")
    check(rc == 0 and all("pid %d: on the device" % m.pid in text for m in ms) and "weights 8.00 MiB (asleep)" in text,
          "group status: each member's tags, asleep [%s]" % text[-400:])
    rc, out = group_json("wake")
    check(rc == 0 and out.get("ok") and results(out) == {m.pid: "moved" for m in ms},
          "group wake: every member woke [%s]" % json.dumps(out)[:300])
    check(all((r.get("rt_ms") or {}).keys() == {"wake"} and r.get("quiesce_ms") is None for r in out.get("members", []))
          and "quiesce" not in (out.get("phases_ms") or {"quiesce": 1}),
          "a group wake sends each member only its wake: no quiesce, no release [%s]" % json.dumps(
              [out.get("phases_ms")] + [r.get("rt_ms") for r in out.get("members", [])]))
    check(all(asleep_tags(m.pid) == [] for m in ms) and all_intact(ms),
          "after the group wake: nothing asleep, every member's bytes intact")
    for verb in ("sleep", "wake"):
        rc, out = group_json(verb, "nosuch")
        check(rc == 1 and not out.get("ok") and set(results(out).values()) == {"failed"}
              and all("ENOENT" in r["reason"] for r in out.get("members", [])),
              "group %s of a tag no member has: every member failed, ENOENT [%s]" % (verb, json.dumps(out)[:300]))
    check(all(asleep_tags(m.pid) == [] for m in ms), "after them nothing is asleep")
    rc, text = ctl("--group", GROUP, "sleep", "kv", "--mode", "mapped")
    check(rc == 0 and "sleep kv (mapped): done on 4 members" in text and text.count(" moved ") == 4,
          "group sleep of one tag in mapped mode, text answer [%s]" % text.strip()[:400])
    rc, text = ctl("--group", GROUP, "wake", "kv")
    check(rc == 0 and all(asleep_tags(m.pid) == [] for m in ms) and all_intact(ms),
          "group wake kv: bytes intact [%s]" % text.strip()[:200])


def failed_move(ms):
    bad = Member(VMMSHIM_HOST_LIMIT="6M")  # kv (4 MiB) fits, weights (8 MiB) does not
    try:
        rc, out = group_json("sleep")
        res = results(out)
        others = {m.pid: res.get(m.pid) for m in ms}
        check(rc == 1 and not out.get("ok") and out.get("outcome") == "rolled back" and res.get(bad.pid) == "failed"
              and set(others.values()) == {"rolled back"},
              "a member that cannot move (host limit) makes the group roll back [%s]" % json.dumps(out)[:600])
        check(all(asleep_tags(m.pid) == [] for m in ms + [bad]) and all_intact(ms + [bad]),
              "after the rollback no member has a tag asleep, every byte intact (the failing member's too)")
    finally:
        bad.stop()


def killed_member(ms):
    from vmmshim import control_group
    victim = Member()
    g = control_group(GROUP, timeout=20)
    g.between = lambda members: (os.kill(victim.pid, signal.SIGKILL), victim.p.wait())
    out = g.sleep()
    res = results(out)
    check(not out["ok"] and res.get(victim.pid) == "gone" and set(res[m.pid] for m in ms) == {"rolled back"},
          "a member killed after the quiesce: it is gone, the others roll back [%s]" % json.dumps(res))
    check(all(asleep_tags(m.pid) == [] for m in ms) and all_intact(ms),
          "after a member died mid-way the others are awake, bytes intact")


def stopped_member(ms):
    frozen = Member()
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        t = time.monotonic()
        rc, out = group_json("sleep", "--timeout", "2")
        took = time.monotonic() - t
        res = results(out)
        check(rc == 1 and res.get(frozen.pid) == "timed out" and set(res[m.pid] for m in ms) == {"released"}
              and took < 8,
              "a stopped member: timed out by --timeout 2 (%.1f s), the others released, not moved [%s]"
              % (took, json.dumps(res)))
        check(all(asleep_tags(m.pid) == [] for m in ms) and all(0 <= m.touch_s() < 1.0 for m in ms),
              "the others' gates are open again: their copies run at once")
        os.kill(frozen.pid, signal.SIGCONT)
        took = frozen.touch_s()
        check(0 <= took < 3.0 and asleep_tags(frozen.pid) == [],
              "the stopped member, resumed: its late quiesce ended with its closed connection (copy in %.2f s)" % took)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        frozen.stop()


def failed_wake(ms):
    rc, out = group_json("sleep")
    check(rc == 0, "group sleep before the wake that fails")
    ctl("--group", GROUP, "limit", "30M")  # 4 members of 12 MiB cannot all wake
    rc, out = group_json("wake")
    res = results(out)
    still = [p for p, r in res.items() if r == "still asleep"]
    check(rc == 1 and not out.get("ok") and out.get("outcome") == "failed" and still
          and set(res.values()) <= {"moved", "still asleep"}
          and all(("kv" in asleep_tags(p) or "weights" in asleep_tags(p)) == (p in still) for p in res),
          "a wake past the group's limit: the members still asleep are named, the others awake [%s]"
          % json.dumps(res))
    ctl("--group", GROUP, "limit", "1G")
    rc, out = group_json("wake")
    res = results(out)
    check(rc == 0 and out.get("ok") and sorted(p for p, r in res.items() if r == "moved") == sorted(still)
          and all(asleep_tags(m.pid) == [] for m in ms) and all_intact(ms),
          "the same wake once the limit is raised: only those still asleep move, bytes intact [%s]" % json.dumps(res))


def raw(pid, req):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect("\0vmmshim-ctl-%d-%d" % (os.geteuid(), pid))
    f = s.makefile("rwb")

    def ask(r):
        f.write((json.dumps(dict({"v": 1}, **r)) + "\n").encode())
        f.flush()
        return json.loads(f.readline())
    return s, f, ask(req), ask


def member_side(m):
    s, f, q, ask = raw(m.pid, {"cmd": "quiesce", "lease_ms": 700})
    check(q.get("ok") and q.get("token", 0) > 0 and q.get("lease_ms") == 700, "quiesce: a token and its lease [%s]" % q)
    tags = {t.get("name"): t.get("asleep") for t in q.get("tags") or []}
    check(tags.get("weights") is False and tags.get("kv") is False,
          "the quiesce's answer lists the member's tags, none asleep [%s]" % q.get("tags"))
    s2, f2, q2, _ = raw(m.pid, {"cmd": "quiesce"})
    check(not q2.get("ok") and q2.get("error") == "EBUSY", "a second quiesce meanwhile: EBUSY [%s]" % q2)
    f2.close()
    s2.close()
    took = m.touch_s()
    check(0.4 < took < 5.0, "the member's copy waits at the held gate until the lease runs out (%.2f s)" % took)
    r = ask({"cmd": "release", "token": q.get("token")})
    check(not r.get("ok") and r.get("error") == "ESRCH", "a release after the lease ran out: ESRCH [%s]" % r)
    f.close()
    s.close()
    s, f, q, ask = raw(m.pid, {"cmd": "quiesce", "lease_ms": 60000})
    threading.Timer(0.5, lambda: (f.close(), s.close())).start()
    took = m.touch_s()
    check(q.get("ok") and 0.3 < took < 5.0, "closing the connection that quiesced reopens the gate (%.2f s)" % took)
    s, f, q, ask = raw(m.pid, {"cmd": "quiesce", "lease_ms": 60000})
    r = ask({"cmd": "release", "token": q.get("token")})
    check(q.get("ok") and r.get("ok") and 0 <= m.touch_s() < 1.0, "release ends the hold at once [%s]" % r)
    r = ask({"cmd": "quiesce", "lease_ms": 0})
    check(not r.get("ok") and r.get("error") == "EINVAL", "a lease of 0 ms is refused [%s]" % r)
    f.close()
    s.close()


def main():
    if not os.path.exists(SERVE) or not os.path.exists(LIB):
        print("FAIL %s or %s is missing: build them first" % (SERVE, LIB))
        print("0 passed, 1 failed")
        return 1
    ms = []
    with scratch("vmmshim-gsleep-test-") as tmp:
        trace = os.path.join(tmp, "member.trace")
        try:
            ms = [Member(VMMSHIM_TRACE=trace)] + [Member() for _ in range(3)]
            run_all(ms)
        finally:
            for m in ms:
                m.stop()
            try:
                os.unlink("/dev/shm/vmmshim-%d-%s" % (os.geteuid(), GROUP))
            except OSError:
                pass
        traced(trace)
    return summary()


def traced(trace):
    kinds = set()
    try:
        with open(trace) as f:
            for line in f:
                w = line.split()
                if w and w[0] == "b" and len(w) == 9:
                    kinds.add(int(w[3], 16))
            f.seek(0)
            head = f.readline()
    except OSError:
        head = ""
    check(head.startswith("v 4 ") and {0, 1, 2, 3} <= kinds,
          "the member's trace (version 4) has b records: quiesced, released, lease ran out, connection "
          "closed (%s)" % sorted(kinds))
    r = report(trace)
    check(r.returncode == 0 and "unknown record" not in r.stderr, "vmmshim-report reads it without a warning [%s]"
          % r.stderr.strip()[:200])


def run_all(ms):
    check(all(m.pid for m in ms), "four members started in group %s" % GROUP)
    member_side(ms[0])
    sleep_and_wake(ms)
    failed_move(ms)
    killed_member(ms)
    stopped_member(ms)
    failed_wake(ms)


if __name__ == "__main__":
    sys.exit(main())
