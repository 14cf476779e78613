#!/usr/bin/env python3
"""The progress line of vmmshim-report and vmmshim-replay (issue #12): on a terminal only.
Runs both on a 400k-event trace with stderr on a pseudo-terminal (python's pty module) and
with stderr piped: on the terminal a line with the percentage read (a file) or the bytes
read and the rate (stdin from a pipe) appears and is erased at the end; piped, nothing is
written; --no-progress writes nothing; a short run with the default delay (1 s) writes
nothing; stdout is the same either way. VMMSHIM_PROGRESS_DELAY=0 makes the line show at
once (then every 0.25 s), so the test does not depend on the machine's speed.
Ends with "N passed, N failed"."""
import os
import pty
import random
import re
import select
import subprocess
import sys

from harness import REPLAY, REPORT, ROOT, check, scratch, summary

ERASE = "\r\x1b[K"


def synth(path, n):
    rnd = random.Random(2)
    live, t, ptr = [], 0, 0x7f0000000000
    with open(path, "w", buffering=1 << 20) as f:
        f.write("v 1 vmmshim 0.1.0\nx /synthetic\nc synthetic\np 1 0 0\ns 0 0\n")
        w = f.write
        for _ in range(n):
            t += rnd.randint(50, 3000)
            if live and (len(live) > 2000 or rnd.random() < 0.49):
                p, s = live.pop(0)
                w("f %x 1 1 0 5 %x %x\n" % (t, p, s))
            else:
                s = 512 << rnd.randint(0, 10)
                live.append((ptr, s))
                w("a %x 1 1 0 5 %x %x %x\n" % (t, ptr, s, s))
                ptr += s
        w("e %x\n" % (t + 1))


def run(cmd, tty, delay="0", stdin=None):
    """(rc, stdout, stderr) with stderr on a new pseudo-terminal (tty) or a pipe."""
    env = dict(os.environ)
    env.pop("VMMSHIM_PROGRESS_DELAY", None)
    if delay is not None:
        env["VMMSHIM_PROGRESS_DELAY"] = delay
    if not tty:
        r = subprocess.run(cmd, stdin=stdin, capture_output=True, env=env, cwd=ROOT)
        return r.returncode, r.stdout.decode(), r.stderr.decode()
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    got = b""
    out = b""
    fds = [master, p.stdout]
    while fds:
        ready, _, _ = select.select(fds, [], [], 60)
        if not ready:
            p.kill()
            break
        for fd in ready:
            try:
                d = os.read(fd if fd is master else fd.fileno(), 65536)
            except OSError:  # the terminal's other end closed
                d = b""
            if not d:
                fds.remove(fd)
            elif fd is master:
                got += d
            else:
                out += d
    os.close(master)
    rc = p.wait()
    return rc, out.decode(), got.decode(errors="replace")


def main():
    with scratch("vmmshim-progress-test-") as tmp:
        trace = os.path.join(tmp, "big.trace")
        synth(trace, 400000)
        rep = [sys.executable, REPORT, trace]
        rc, out_tty, err = run(rep, True)
        shown = re.findall(r"vmmshim-report: reading big\.trace: +(\d+) %", err)
        check(rc == 0 and len(shown) >= 2, "report on a terminal: the percentage read shows (%d updates)" % len(shown))
        check(len(shown) >= 2 and [int(x) for x in shown] == sorted(int(x) for x in shown) and int(shown[-1]) > 0,
              "report: the percentage grows: %s" % shown)
        check(err.endswith(ERASE) and "\n" not in err, "report: the line is redrawn in place and erased at the end")
        rc, out_pipe, err = run(rep, False)
        check(rc == 0 and err == "", "report with stderr piped: no progress (%r)" % err[:80])
        check(out_tty == out_pipe and "peak live" in out_pipe, "report: stdout is the same on a terminal and piped")
        rc, _, err = run(rep + ["--no-progress"], True)
        check(rc == 0 and err == "", "report --no-progress on a terminal: nothing (%r)" % err[:80])
        rc, _, err = run([sys.executable, REPORT, os.path.join("tests", "data", "small.trace")], True, delay=None)
        check(rc == 0 and "reading" not in err, "report: a short run shows no progress with the default delay")
        with open(trace) as f:
            cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
            rc, _, err = run([sys.executable, REPORT, "-"], True, stdin=cat.stdout)
            cat.stdout.close()
            cat.wait()
        check(rc == 0 and re.search(r"reading stdin: [\d.]+ [KMG]i?B \([\d.]+ [KMG]i?B/s\), [\d.]+ M events", err)
              and err.endswith(ERASE), "report from a pipe: bytes read, rate and events")
        out = os.path.join(tmp, "big.replay")
        rpl = [sys.executable, REPLAY, "--convert-only", "-o", out, trace]
        rc, _, err = run(rpl, True)
        lines = err.split(ERASE)
        check(rc == 0 and "vmmshim-replay: reading big.trace:" in err and lines[-1].startswith("vmmshim-replay: ")
              and "allocations" in lines[-1], "replay on a terminal: progress, erased before its summary line")
        rc, _, err = run(rpl, False)
        check(rc == 0 and "reading" not in err and err.startswith("vmmshim-replay: ") and err.count("\n") == 1,
              "replay with stderr piped: only its summary line")
        rc, _, err = run(rpl + ["--no-progress"], True)
        check(rc == 0 and "reading" not in err, "replay --no-progress: no progress")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
