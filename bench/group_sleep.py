#!/usr/bin/env python3
"""make bench, step group-sleep: a whole group's sleep and wake, and a balloon's admission
(docs/benchmarks.md). Run by bench/run.sh:

    group_sleep.py GSLEEP_BINARY LIBVMMSHIM [--mib 8192] [--rounds 3]

For 1, 2 and 4 members of MIB MiB each (8 GiB by default) (one GPU: 4 x 8 GiB fit in 80 GB), in one group, the
command `vmmshim ctl --group NAME sleep` and `wake` (vmmshim.control_group), in discard and host
modes, ROUNDS rounds each; against it, the slowest member's own time for its move (its reply's
"ms", taken in the same command), and with one member the plain `vmmshim ctl PID sleep` of that
member (vmmshim.control). Prints per move:

    R gsleep op=sleep|wake mode=M members=N round=I group_ms=... slowest_ms=... over_ms=... ok=0|1
      quiesce_ms=... move_ms=... release_ms=... slowest_rt_ms=...
    R gsleep op=single-sleep|single-wake mode=M members=1 round=I ms=...

Then a balloon: a lender of MIB MiB with tag kv cold and a borrower (priority 10,
VMMSHIM_ON_LIMIT=balloon:10) whose growth of MIB MiB fits the group's limit only once kv is lent:
"R gsleep op=balloon ..." from the borrower, and "R gsleep op=balloon-split ..." (the borrower's wait,
the lender's share of it, the rest), once as it is and once with the lender's host memory made ahead
(VMMSHIM_HOST_RESERVE). A step that fails prints "R failed"."""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "python"))
from vmmshim import client  # noqa: E402
from vmmshim.group_sleep import GroupControl  # noqa: E402


def start(binary, lib, env, args):
    e = {k: v for k, v in os.environ.items() if not k.startswith("VMMSHIM_") and k != "LD_PRELOAD"}
    e.update(env, LD_PRELOAD=lib)
    return subprocess.Popen([binary] + [str(a) for a in args], env=e)


def wait_files(d, names, procs, seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(os.path.exists(os.path.join(d, n)) for n in names):
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.05)
    return False


def stop(d, procs):
    open(os.path.join(d, "stop"), "w").close()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def members_run(binary, lib, n, mib, rounds):
    d = tempfile.mkdtemp(prefix="vmmshim-gsleep-")
    group = "bench-gsleep-%d-%d" % (os.getpid(), n)
    procs = [start(binary, lib, {"VMMSHIM_LIMIT_GROUP": group},
                   ["member", mib, d, i]) for i in range(n)]
    try:
        if not wait_files(d, ["ready.%d" % i for i in range(n)], procs):
            print("R failed step=group-sleep-%d rc=start" % n, flush=True)
            return
        g = GroupControl(group, timeout=120)
        for mode in ("discard", "host"):
            for r in range(rounds):
                for op in ("sleep", "wake"):
                    out = g.sleep(mode=mode) if op == "sleep" else g.wake(zero=(mode == "discard"))
                    own = [m["reply"].get("ms") or 0.0 for m in out["members"] if m.get("reply")]
                    slowest = max(own) if own else 0.0
                    ph = out.get("phases_ms") or {}
                    rts = [max((m.get("rt_ms") or {}).get(op, 0.0) for m in out["members"])]
                    print("R gsleep op=%s mode=%s members=%d round=%d group_ms=%.3f slowest_ms=%.3f over_ms=%.3f "
                          "ok=%d quiesce_ms=%.3f move_ms=%.3f release_ms=%.3f slowest_rt_ms=%.3f" % (
                              op, mode, n, r, out["ms"], slowest, out["ms"] - slowest, out["ok"],
                              ph.get("quiesce", 0.0), ph.get("move", 0.0), ph.get("release", 0.0), rts[0]), flush=True)
                if n == 1:
                    c = client.Control(procs[0].pid, move_timeout=120)
                    for op in ("sleep", "wake"):
                        t = time.monotonic()
                        rep = c.sleep(mode=mode) if op == "sleep" else c.wake(zero=(mode == "discard"))
                        ms = (time.monotonic() - t) * 1000.0
                        print("R gsleep op=single-%s mode=%s members=1 round=%d ms=%.3f own_ms=%.3f" % (
                            op, mode, r, ms, rep.get("ms") or 0.0), flush=True)
    finally:
        stop(d, procs)
        try:
            os.unlink("/dev/shm/vmmshim-%d-%s" % (os.geteuid(), group))
        except OSError:
            pass


def lend_line(path):
    """The borrower shim's info line on its growth: the lenders' share of the wait, or None."""
    try:
        with open(path) as f:
            for line in f:
                m = re.search(r"in ([0-9.]+) ms \(([0-9.]+) ms of it the lenders' moves\)", line)
                if m:
                    return float(m.group(1)), float(m.group(2))
    except OSError:
        pass
    return None


def balloon_run(binary, lib, mib, reserve):
    d = tempfile.mkdtemp(prefix="vmmshim-balloon-")
    group = "bench-balloon-%d-%d" % (os.getpid(), reserve)
    # The limit: the lender's MIB and half as much again, so the borrower's MIB fits only once the
    # lender's kv is out.
    limit = "%dM" % (mib + mib // 2)
    lender = start(binary, lib, {"VMMSHIM_LIMIT_GROUP": group, "VMMSHIM_LIMIT": limit, "VMMSHIM_COLD_TAGS": "kv",
                                 "VMMSHIM_HOST_RESERVE": "%dM" % reserve}, ["lender", mib, d])
    try:
        if not wait_files(d, ["ready.lender"], [lender]):
            print("R failed step=group-sleep-balloon rc=start", flush=True)
            return
        log = os.path.join(d, "borrower.log")
        b = start(binary, lib, {"VMMSHIM_LIMIT_GROUP": group, "VMMSHIM_PRIORITY": "10",
                                "VMMSHIM_ON_LIMIT": "balloon:10", "BENCH_RESERVE_MIB": str(reserve),
                                "VMMSHIM_LOG": "info:" + log}, ["borrower", mib, d])
        try:
            b.wait(timeout=60)
        except subprocess.TimeoutExpired:
            b.kill()
            b.wait()
        if b.returncode:
            print("R failed step=group-sleep-balloon rc=%d" % b.returncode, flush=True)
        got = lend_line(log)
        if got:  # where the growth's time went, as the borrower's shim saw it
            print("R gsleep op=balloon-split mib=%d reserve_mib=%d wait_ms=%.1f lender_ms=%.1f own_ms=%.1f" % (
                mib, reserve, got[0], got[1], got[0] - got[1]), flush=True)
    finally:
        stop(d, [lender])
        try:
            os.unlink("/dev/shm/vmmshim-%d-%s" % (os.geteuid(), group))
        except OSError:
            pass


def main(argv):
    if len(argv) < 2:
        print("usage: group_sleep.py GSLEEP_BINARY LIBVMMSHIM [--mib 8192] [--rounds 3]", file=sys.stderr)
        return 2
    binary, lib = argv[0], argv[1]
    mib = int(argv[argv.index("--mib") + 1]) if "--mib" in argv else 8192
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3
    for n in (1, 2, 4):
        members_run(binary, lib, n, mib, rounds)
    balloon_run(binary, lib, mib, 0)
    balloon_run(binary, lib, mib, mib)  # the lender's host memory made ahead: the lend only copies
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
