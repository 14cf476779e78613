#!/usr/bin/env python3
"""Priorities and ballooning (VMMSHIM_ON_LIMIT=balloon, VMMSHIM_PRIORITY, VMMSHIM_COLD_TAGS) on the
host emulation.

Two members of build/tests/test_shim_control's serve mode share one group's limit: low (priority 0,
kv cold: it lends kv in mapped mode) and high (priority 10, VMMSHIM_ON_LIMIT=balloon:2, frees
give their memory back at once: VMMSHIM_RELEASE_THRESHOLD=0). The limit is set just above what
both map. Then:
  - high's growth of 4 MiB past the limit (3 MiB above what both map) is admitted: low's kv leaves the device (served from host memory
    at its addresses, its bytes intact), the group's status shows low lent and high borrowed the
    same bytes, and the priorities;
  - after high frees, low's kv comes back to the device by itself (not sooner than the hold),
    bytes intact, nothing lent or borrowed;
  - no flapping: twenty growths and frees of high across the limit, 50 ms apart, move kv out and
    back a few times, not twenty;
  - without a lower member to lend (low's kv no longer cold: `cold kv --mode off`), high's growth
    fails within its SECONDS;
  - the verbs: priority read and set (and refused out of 0..1000), cold refused with a bad mode,
    `ctl PID priority N` and `ctl PID cold TAG --mode M`;
  - a segment of layout version 1 is refused by a member and by ctl, naming the version;
  - the members' traces have their `b` records: lent (to the borrower's pid) and returned, and
    borrowed;
    VMMSHIM_PRIORITY and balloon:SECONDS out of range are refused at start with one warning.
Ends with "N passed, N failed"."""
import json
import os
import socket
import subprocess
import sys
import time

from harness import BUILD_DIR, EMU, LAUNCHER, LIB, PLAIN_ENV, ServeProcess, check, ctl, scratch, summary

SERVE = os.path.join(BUILD_DIR, "tests", "test_shim_control")
GROUP = "vs-test-balloon-%d" % os.getpid()
MiB = 1 << 20


class Member(ServeProcess):
    def __init__(self, **env):
        super().__init__(dict(os.environ, LD_PRELOAD=LIB, LD_LIBRARY_PATH=EMU, VMMSHIM_LIMIT_GROUP=GROUP, **env),
                         keep_stderr=True)


def raw(pid, req):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect("\0vmmshim-ctl-%d-%d" % (os.geteuid(), pid))
    s.sendall((json.dumps(dict({"v": 1}, **req)) + "\n").encode())
    line = s.makefile("rb").readline()
    s.close()
    return json.loads(line)


def group():
    rc, out = ctl("--group", GROUP, "status", "--json")
    try:
        return json.loads(out)
    except ValueError:
        return {"raw": out}


def slot(st, pid):
    for m in st.get("members_list", []):
        if m["pid"] == pid:
            return m
    return {}


def wait_for(cond, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def verbs(low):
    r = raw(low.pid, {"cmd": "priority"})
    check(r.get("ok") and r.get("priority") == 0, "priority read: 0, from VMMSHIM_PRIORITY's default [%s]" % r)
    r = raw(low.pid, {"cmd": "priority", "priority": 1001})
    check(not r.get("ok") and r.get("error") == "EINVAL", "priority 1001 refused [%s]" % r)
    r = raw(low.pid, {"cmd": "cold", "tag": "kv", "mode": "warm"})
    check(not r.get("ok") and r.get("error") == "EINVAL", "cold with a bad mode refused [%s]" % r)
    r = raw(low.pid, {"cmd": "cold", "tag": "kv"})
    check(r.get("ok") and r.get("mode") == "mapped" and r.get("previous") == "mapped",
          "cold kv: mapped, and it was already (VMMSHIM_COLD_TAGS) [%s]" % r)
    rc, out = ctl(low.pid, "priority", "7")
    rc2, out2 = ctl(low.pid, "priority", "0")
    check(rc == 0 and out.strip() == "pid %d: priority 7 (was 0)" % low.pid and rc2 == 0,
          "ctl PID priority N sets it, and back [%s]" % out.strip())
    rc, out = ctl(low.pid, "priority", "2000")
    check(rc == 2, "ctl PID priority 2000: a usage error [%s]" % out.strip())
    rc, out = ctl(low.pid, "cold", "spare", "--mode", "host")
    check(rc == 0 and out.strip() == "pid %d: tag 'spare' cold: host (was off)" % low.pid,
          "ctl PID cold TAG --mode host [%s]" % out.strip())


def lend_and_return(low, high):
    st = group()
    total = st.get("total_all", 0)
    # 3 MiB above what both map: a growth of 4 MiB needs low's kv (4 MiB); once high frees it, kv
    # fits again with 10% of the limit to spare.
    rc, out = ctl("--group", GROUP, "limit", str(total + 3 * MiB))
    check(rc == 0, "the group's limit 3 MiB above what both map (%d bytes) [%s]" % (total + 3 * MiB, out.strip()))
    t = time.monotonic()
    got = high.ask("alloc 4")
    took = time.monotonic() - t
    check(got == "alloc ok", "high's growth past the limit is admitted after low lent (%.0f ms) [%s]"
          % (took * 1000, got))
    check(low.ask("bytes") == "weights ok kv ok on host", "low's kv is served from host memory, its bytes intact")
    st = group()
    lo, hi = slot(st, low.pid), slot(st, high.pid)
    check(lo.get("lent", 0) >= 4 * MiB and hi.get("borrowed") == lo.get("lent") and lo.get("priority") == 0
          and hi.get("priority") == 10 and lo.get("demotions") == 1,
          "group status: low lent, high borrowed the same bytes, priorities 0 and 10 [%r %r]"
          % ({k: lo.get(k) for k in ("lent", "demotions", "priority")},
             {k: hi.get(k) for k in ("borrowed", "priority")}))
    rc, out = ctl("--group", GROUP, "status")
    check(rc == 0 and " lent" in out and "borrowed" in out, "group status text: the lent and borrowed columns")
    r = subprocess.run(["sh", LAUNCHER, "top", "--once", "--pid", "%d,%d" % (low.pid, high.pid)], capture_output=True,
                       text=True, timeout=60, env=PLAIN_ENV)
    check(r.returncode == 0 and "priority 0: lent 4.00M, borrowed 0" in r.stdout
          and "priority 10: lent 0, borrowed 4.00M" in r.stdout,
          "top --once: who lent and who borrowed [%s]" % r.stdout.strip()[-400:])
    t = time.monotonic()
    check(high.ask("free") == "free ok", "high frees its growth")
    back = wait_for(lambda: low.ask("bytes") == "weights ok kv ok on device", 10)
    took = time.monotonic() - t
    st = group()
    lo, hi = slot(st, low.pid), slot(st, high.pid)
    check(back and lo.get("lent") == 0 and hi.get("borrowed") == 0 and lo.get("promotions") == 1,
          "low's kv back on the device by itself after %.2f s, bytes intact, nothing lent or borrowed" % took)


def no_flapping(low, high):
    before = slot(group(), low.pid)
    for _ in range(20):
        ok = high.ask("alloc 4") == "alloc ok"
        high.ask("free")
        time.sleep(0.05)
        if not ok:
            break
    check(ok, "twenty growths of high across the limit, each admitted")
    wait_for(lambda: low.ask("bytes") == "weights ok kv ok on device", 10)
    after = slot(group(), low.pid)
    moves = after.get("demotions", 0) - before.get("demotions", 0)
    check(1 <= moves <= 4 and after.get("promotions", 0) - before.get("promotions", 0) == moves,
          "no flapping: kv moved out %d times (and back as often) for 20 growths" % moves)
    check(low.ask("bytes") == "weights ok kv ok on device", "low's bytes intact after the load")


def nothing_to_lend(low, high):
    rc, out = ctl(low.pid, "cold", "kv", "--mode", "off")
    check(rc == 0 and "cold: off (was mapped)" in out, "ctl PID cold kv --mode off [%s]" % out.strip())
    t = time.monotonic()
    got = high.ask("alloc 4")
    took = time.monotonic() - t
    check(got == "alloc failed" and took < 5, "with nothing to lend, high's growth fails (%.2f s) [%s]" % (took, got))
    r = raw(low.pid, {"cmd": "demote", "bytes": MiB, "for": high.pid})
    check(not r.get("ok") and r.get("error") == "EALREADY" and r.get("released") == 0
          and isinstance(r.get("ms"), float) and r["ms"] >= 0,
          "a demote with nothing cold: EALREADY, with the lender's time ([%s]: the borrower's share of its wait)" % r)


def old_segment():
    """A segment of layout version 1 (a release before ballooning) is refused, saying so."""
    import struct
    import zlib
    name = GROUP + "-v1"
    path = "/dev/shm/vmmshim-%d-%s" % (os.geteuid(), name)
    fixed = struct.pack("=8s6IQ32s", b"VMMSHGRP", 1, 512, 304, 256, 16, os.geteuid(),
                        os.stat("/proc/self/ns/pid").st_ino, name.encode())
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, fixed + struct.pack("=I", zlib.crc32(fixed)))
        os.ftruncate(fd, 512 + 256 * 304)
    finally:
        os.close(fd)
    try:
        e = dict(os.environ, LD_PRELOAD=LIB, LD_LIBRARY_PATH=EMU, VMMSHIM_LIMIT_GROUP=name)
        r = subprocess.run([SERVE, "serve"], input="quit\n", capture_output=True, text=True, env=e, timeout=30)
        check("layout version 1" in r.stderr and "ready" not in r.stdout,
              "a member cannot join a segment of layout version 1: refused, saying so [%s]" % r.stderr.strip()[:300])
        rc, out = ctl("--group", name, "status")
        check(rc == 1 and "version 1" in out, "ctl --group status of it says the version [%s]" % out.strip()[:200])
    finally:
        os.unlink(path)


def bad_options():
    m = Member(VMMSHIM_PRIORITY="1001", VMMSHIM_ON_LIMIT="balloon:0")
    err = m.stop()
    check("VMMSHIM_PRIORITY='1001'" in err and "VMMSHIM_ON_LIMIT='balloon:0'" in err,
          "VMMSHIM_PRIORITY=1001 and VMMSHIM_ON_LIMIT=balloon:0 each refused with a warning [%s]" % err.strip()[:300])


def main():
    if not os.path.exists(SERVE) or not os.path.exists(LIB):
        print("FAIL %s or %s is missing: build them first" % (SERVE, LIB))
        print("0 passed, 1 failed")
        return 1
    low = high = None
    tmp = scratch("vmmshim-balloon-test-")
    d = tmp.__enter__()
    low_trace, high_trace = os.path.join(d, "low.trace"), os.path.join(d, "high.trace")
    try:
        ctl("--group", GROUP, "limit", "1G")
        low = Member(VMMSHIM_COLD_TAGS="kv", VMMSHIM_TRACE=low_trace)
        high = Member(VMMSHIM_PRIORITY="10", VMMSHIM_ON_LIMIT="balloon:2", VMMSHIM_RELEASE_THRESHOLD="0",
                      VMMSHIM_TRACE=high_trace)
        check(low.pid and high.pid, "low and high started in group %s" % GROUP)
        verbs(low)
        lend_and_return(low, high)
        no_flapping(low, high)
        nothing_to_lend(low, high)
        old_segment()
        bad_options()
    finally:
        for m in (low, high):
            if m:
                m.stop()
        try:
            os.unlink("/dev/shm/vmmshim-%d-%s" % (os.geteuid(), GROUP))
        except OSError:
            pass
    lent, back, borrowed = b_kinds(low_trace, 4), b_kinds(low_trace, 5), b_kinds(high_trace, 6)
    check(lent and back and borrowed and all(w[5] == "%x" % high.pid and int(w[6], 16) >= 4 * MiB for w in lent)
          and any(int(w[6], 16) >= 4 * MiB and w[7] == "0" for w in borrowed),
          "traces: low's b records lent (kind 4, to high's pid) and returned (5), high's borrowed (6) [%d %d %d]"
          % (len(lent), len(back), len(borrowed)))
    tmp.__exit__(None, None, None)
    return summary()


def b_kinds(trace, kind):
    """The b records of a trace of that kind, as lists of fields."""
    try:
        with open(trace) as f:
            return [w for w in (line.split() for line in f) if len(w) == 9 and w[0] == "b" and int(w[3], 16) == kind]
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
