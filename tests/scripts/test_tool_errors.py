#!/usr/bin/env python3
"""How vmmshim-report and vmmshim-replay fail: an output they cannot write (a missing
directory, a directory, a path under a file) and a bad number (negative counts, a nan, inf or
negative --short-ms, a word) are refused with one line "PROG: error: ..." and exit status 2
BEFORE the trace is read (the trace is a pipe that never delivers a byte: a tool that reads
first hangs and the check fails on its time limit); a write that fails after reading
(/dev/full) is one line and status 2 too, never a traceback; an existing output is not
truncated when the run fails and is wholly replaced when it succeeds. vmmshim-replay fails
(status 1) when it cannot replay: no replayer built (said before reading), a replayer that
fails, no libvmmshim.so for the shim's row; a --replayer that is not an executable file is a
usage error (2). A closed stdout (| head) is no error. Ends with "N passed, N failed"."""
import os
import subprocess
import sys

from harness import REPLAY, REPORT, ROOT, check, scratch, summary

SMALL = os.path.join(ROOT, "tests", "data", "small.trace")
LIMIT = 15  # seconds: a tool that waits for the trace before refusing runs into it


def run(tool, args, stdin_silent=False, env=None):
    """(rc, stdout, stderr) of the tool; with stdin_silent, its trace argument should be '-' and
    its stdin is a pipe held open with nothing written: reading it blocks. rc None: timed out."""
    cmd = [sys.executable, tool] + args
    if not stdin_silent:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        return r.returncode, r.stdout, r.stderr
    rd, wr = os.pipe()
    try:
        r = subprocess.run(cmd, stdin=rd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=LIMIT)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        return None, "", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    finally:
        os.close(rd)
        os.close(wr)


def one_line_error(prog, rc, err, want_rc=2, mention=None):
    lines = err.splitlines()
    ok = rc == want_rc and len(lines) == 1 and lines[0].startswith(prog + ": error: ") and "Traceback" not in err
    return ok and (mention is None or mention in lines[0])


def test_report_outputs(tmp):
    afile = os.path.join(tmp, "a-file")
    open(afile, "w").close()
    bad = {"missing directory": os.path.join(tmp, "no", "such", "dir", "out"), "a directory": tmp,
           "under a file": os.path.join(afile, "out")}
    for opt in ("--html", "--memory-viz", "--perfetto"):
        for what, path in bad.items():
            rc, out, err = run(REPORT, ["-", opt, path], stdin_silent=True)
            check(one_line_error("vmmshim-report", rc, err, mention=path),
                  "report %s into %s: one error line naming it, exit 2, before reading (rc %s: %r)"
                  % (opt, what, rc, err[-300:]))
    # a write that fails once the trace is read
    rc, out, err = run(REPORT, [SMALL, "--html", "/dev/full"])
    check(one_line_error("vmmshim-report", rc, err.replace(
        "vmmshim-report: warning: %s: unknown record type 'z' skipped (written by a newer vmmshim?)\n" % SMALL, ""),
        mention="/dev/full"), "report --html /dev/full: one error line, exit 2 (rc %s: %r)" % (rc, err[-300:]))
    # an existing output: kept when the run fails, replaced (not appended to, no tail left) when it succeeds
    keep = os.path.join(tmp, "keep.html")
    with open(keep, "w") as f:
        f.write("keep me\n")
    junk = os.path.join(tmp, "junk.trace")
    with open(junk, "w") as f:
        f.write("hello\n")
    rc, _, err = run(REPORT, [junk, "--html", keep])
    check(rc == 2 and open(keep).read() == "keep me\n", "report: a failed run leaves an existing output as it was")
    fresh = os.path.join(tmp, "fresh.html")
    created = os.path.join(tmp, "created.json")
    rc, out, err = run(REPORT, [SMALL, "--html", fresh])
    with open(keep, "w") as f:
        f.write("x" * 1000000)
    rc2, _, _ = run(REPORT, [SMALL, "--html", keep])
    check(rc == 0 and rc2 == 0 and open(keep, "rb").read() == open(fresh, "rb").read(),
          "report: an existing longer output is wholly replaced")
    rc, _, _ = run(REPORT, [junk, "--perfetto", created])
    check(rc == 2 and not os.path.exists(created), "report: an output it created is removed when the run fails")


def test_report_numbers():
    cases = [("--viz-events", "-1"), ("--perfetto-allocs", "-1"), ("--top", "-1"), ("--site-depth", "0"),
             ("--short-ms", "nan"), ("--short-ms", "inf"), ("--short-ms", "-inf"), ("--short-ms", "-1"),
             ("--short-ms", "1e400"), ("--viz-events", "ten"), ("--top", "1.5")]
    for opt, val in cases:
        rc, out, err = run(REPORT, ["-", opt, val], stdin_silent=True)
        check(one_line_error("vmmshim-report", rc, err, mention=opt),
              "report %s %s: one error line naming the option, exit 2, before reading (rc %s: %r)"
              % (opt, val, rc, err[-300:]))
    rc, out, err = run(REPORT, ["-", "--no-such-option"], stdin_silent=True)
    check(one_line_error("vmmshim-report", rc, err), "report: an unknown option is one error line (%r)" % err[-200:])
    rc, out, err = run(REPORT, ["no-such-dir/no.trace"])
    check(one_line_error("vmmshim-report", rc, err, mention="no-such-dir/no.trace") and "Errno" not in err
          and "No such file or directory" in err, "report: a missing trace is named with the reason, no [Errno] (%r)" % err)
    rc, out, err = run(REPORT, [SMALL, "--short-ms", "0", "--viz-events", "0", "--top", "0"])
    check(rc == 0 and "short-lived (< 0 ms): 0 of 3" in out, "report: zero is a valid count and time (rc %s)" % rc)


def test_replay(tmp):
    for what, path in (("a missing directory", os.path.join(tmp, "no", "dir", "x.replay")), ("a directory", tmp)):
        rc, out, err = run(REPLAY, ["--convert-only", "-o", path, "-"], stdin_silent=True)
        check(one_line_error("vmmshim-replay", rc, err, mention=path),
              "replay -o into %s: one error line naming it, exit 2, before reading (rc %s: %r)"
              % (what, rc, err[-300:]))
    env = dict(os.environ, BUILD=os.path.join(tmp, "no-build"))
    rc, out, err = run(REPLAY, ["-"], stdin_silent=True, env=env)
    check(rc == 1 and "not built" in err and "Traceback" not in err and len(err.splitlines()) == 1,
          "replay without a replayer: fails (exit 1) before reading, saying it is not built (rc %s: %r)"
          % (rc, err[-300:]))
    rc, out, err = run(REPLAY, ["--replayer", os.path.join(tmp, "no-such-replayer"), "-"], stdin_silent=True)
    check(one_line_error("vmmshim-replay", rc, err, mention="no-such-replayer"),
          "replay --replayer that does not exist: one error line, exit 2, before reading (rc %s: %r)"
          % (rc, err[-300:]))
    failing = os.path.join(tmp, "failing-replayer")
    with open(failing, "w") as f:
        f.write("#!/bin/sh\nexit 3\n")
    os.chmod(failing, 0o755)
    lib = os.path.join(tmp, "libvmmshim.so")
    open(lib, "w").close()
    rc, out, err = run(REPLAY, ["--replayer", failing, SMALL], env=dict(os.environ, VMMSHIM_LIB=lib))
    check(rc == 1 and "exit 3" in out and "Traceback" not in err,
          "replay with a replayer that fails: the table says so, exit 1 (rc %s: %r)" % (rc, out[-300:]))
    working = os.path.join(tmp, "working-replayer")
    with open(working, "w") as f:
        f.write("#!/bin/sh\necho \"R x cfg=$3 mode=$2\"\n")
    os.chmod(working, 0o755)
    rc, out, err = run(REPLAY, ["--replayer", working, SMALL], env=dict(os.environ, VMMSHIM_LIB=lib))
    check(rc == 0 and len(out.splitlines()) == 4, "replay with a working replayer and the library: exit 0 (rc %s)" % rc)
    rc, out, err = run(REPLAY, ["--replayer", working, SMALL],
                       env=dict(os.environ, VMMSHIM_LIB=os.path.join(tmp, "no-lib.so")))
    check(rc == 1 and "libvmmshim.so not found" in err and len(out.splitlines()) == 3,
          "replay without the library: two rows, then exit 1 (rc %s: %r)" % (rc, err[-300:]))
    rc, out, err = run(REPLAY, ["-", "--no-such-option"], stdin_silent=True)
    check(one_line_error("vmmshim-replay", rc, err), "replay: an unknown option is one error line (%r)" % err[-200:])


def test_closed_stdout():
    """stdout closed before the tools write (| head that has read enough): no error, status 0."""
    for tool, args in ((REPORT, [SMALL]), (REPLAY, ["--convert-only", SMALL])):
        p = subprocess.Popen([sys.executable, tool] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT)
        p.stdout.close()
        err = p.stderr.read()
        rc = p.wait()
        check(rc == 0 and "error" not in err and "Traceback" not in err,
              "%s with its stdout closed: status 0, no error (rc %s: %r)" % (os.path.basename(tool), rc, err[-200:]))


def main():
    with scratch("vmmshim-tool-errors-") as tmp:
        test_report_outputs(tmp)
        test_report_numbers()
        test_replay(tmp)
        test_closed_stdout()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
