#!/usr/bin/env python3
"""Tests of scripts/vmmshim-replay on the CPU: the converter on the hand-built traces
(native and rmm; golden files), ids and a missing free, and the runner with a stand-in
replayer (a shell script) in place of bench/replay.cu, and without one (an error, exit 1).
Ends with "N passed, N failed"."""
import os
import shutil
import subprocess
import sys
import tempfile

from harness import REPLAY, ROOT, check, summary


def run(*args, env=None):
    return subprocess.run([sys.executable, REPLAY] + list(args), cwd=ROOT, capture_output=True, text=True, env=env)


def main():
    tmp = tempfile.mkdtemp(prefix="vmmshim-replay-test-")
    for trace, golden in (("small.trace", "small.replay"), ("small.csv", "small-csv.replay")):
        r = run("--convert-only", os.path.join("tests", "data", trace))
        want = open(os.path.join(ROOT, "tests", "data", golden)).read()
        check(r.returncode == 0 and r.stdout == want, "converter: %s gives tests/data/%s" % (trace, golden))

    # A pointer allocated twice without a free in between, and a free of an unknown pointer.
    t = os.path.join(tmp, "odd.trace")
    with open(t, "w") as f:
        f.write("v 1 vmmshim 0.1.0\n"
                "a 1 1 0 0 - 1000 10 10\n"
                "a 2 1 0 0 - 1000 20 20\n"
                "f 3 1 0 0 - 5000 10\n"
                "o 4 1 0 0 - 99 2\n"
                "f 5 1 0 0 - 1000 20\n")
    out = os.path.join(tmp, "odd.replay")
    r = run("--convert-only", "-o", out, t)
    check(r.returncode == 0 and open(out).read() == "a 0 16\nf 0\na 1 32\nf 1\n",
          "converter: reused pointer freed first, unknown free and failure left out")
    check("1 frees of unknown pointers" in r.stderr, "converter: says what it left out")

    # The runner, with a stand-in replayer that echoes what it was given.
    fake = os.path.join(tmp, "replay")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\n"
                "n=$(grep -c '^a ' \"$1\")\n"
                "case \"$LD_PRELOAD\" in *libvmmshim*) s=shim=1;; *) s=;; esac\n"
                "echo \"R frag cfg=$3 events=$(wc -l < \"$1\") allocs=$n mode=$2 $s\"\n")
    os.chmod(fake, 0o755)
    lib = os.path.join(tmp, "libvmmshim.so")
    open(lib, "w").close()
    env = dict(os.environ, VMMSHIM_LIB=lib, LD_PRELOAD="")
    r = run("--replayer", fake, os.path.join("tests", "data", "small.trace"), env=env)
    lines = r.stdout.splitlines()
    ok = r.returncode == 0 and len(lines) == 4 and lines[0].split()[0] == "allocator"
    ok = ok and lines[1].split()[:4] == ["cudaMalloc", "8", "5", "malloc"]
    ok = ok and lines[2].split()[:4] == ["cudaMallocAsync", "8", "5", "async"]
    ok = ok and lines[3].split()[:5] == ["vmmshim", "8", "5", "malloc", "1"]
    check(ok, "runner: a table with cudaMalloc, cudaMallocAsync and the shim (preloaded)")
    if not ok:
        print(r.stdout, r.stderr)
    # No replayer anywhere: a copy of the tools in a tree with no build (a built replayer in this
    # tree's build/ would be found through the script's own location).
    alone = os.path.join(tmp, "tree")
    shutil.copytree(os.path.join(ROOT, "scripts"), os.path.join(alone, "scripts"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    trace = os.path.join(ROOT, "tests", "data", "small.trace")
    r = subprocess.run([sys.executable, os.path.join(alone, "scripts", "vmmshim-replay"), trace], cwd=alone,
                       capture_output=True, text=True, env=dict(os.environ, BUILD="build"))
    check(r.returncode == 1 and "not built" in r.stderr and "or pass --replayer" in r.stderr,
          "runner: a missing replayer is an error (exit 1) that says it is not built and how to get one "
          "(rc %d: %r)" % (r.returncode, r.stderr[-200:]))
    shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
