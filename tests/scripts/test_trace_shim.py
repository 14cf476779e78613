#!/usr/bin/env python3
"""The trace of a real multi-threaded run under the shim (host emulation): test_shim_threads
(8 threads x 20000 mixed cudaMalloc/cudaFree and stream-ordered pairs) traced in the
default and the deferred free mode. In file order, no allocation overlaps a range still
live, every free ends a live allocation, nothing is live at the end (the program frees all),
every thread's times only go forward, and the record counts match the shim's own counters
(VMMSHIM_STATS=1). Ends with "N passed, N failed"."""
import bisect
import os
import re
import subprocess
import sys
import tempfile

from harness import ROOT, check, summary

BUILD = os.environ.get("BUILD", "build")


def verify(path, label):
    live_starts, live = [], {}  # sorted starts; start -> end
    overlaps = bad_frees = allocs = frees = back = 0
    last_t = {}
    ended = False
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            c = line.split()
            if c[0] == "e":
                ended = True
            if c[0] not in ("a", "f"):
                continue
            t, tid = int(c[1], 16), c[2]
            if t < last_t.get(tid, 0):
                back += 1
            last_t[tid] = t
            ptr = int(c[6], 16)
            if c[0] == "a":
                allocs += 1
                end = ptr + int(c[8], 16)
                i = bisect.bisect_left(live_starts, ptr)
                if (i < len(live_starts) and live_starts[i] < end) or (i > 0 and live[live_starts[i - 1]] > ptr):
                    overlaps += 1
                    continue
                live_starts.insert(i, ptr)
                live[ptr] = end
            else:
                frees += 1
                if ptr not in live:
                    bad_frees += 1
                    continue
                del live[ptr]
                live_starts.pop(bisect.bisect_left(live_starts, ptr))
    check(ended, "%s: the trace ends with its e record" % label)
    check(allocs >= 8 * 9000 and len(last_t) >= 8,
          "%s: %d allocations from %d threads" % (label, allocs, len(last_t)))
    check(overlaps == 0, "%s: no allocation overlaps a live one in file order (%d did)" % (label, overlaps))
    check(bad_frees == 0, "%s: every free ends a live allocation (%d did not)" % (label, bad_frees))
    check(not live, "%s: nothing live at the end (%d)" % (label, len(live)))
    check(back == 0, "%s: times never go back within a thread (%d did)" % (label, back))
    return allocs, frees


def main():
    tmp = tempfile.mkdtemp(prefix="vmmshim-trace-shim-")
    exe = os.path.join(ROOT, BUILD, "tests", "test_shim_threads")
    for mode in ("sync", "deferred"):
        path = os.path.join(tmp, "threads-%s.trace" % mode)
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, BUILD, "emu"),
                   LD_PRELOAD=os.path.join(ROOT, BUILD, "libvmmshim.so"), VMMSHIM_TRACE=path,
                   VMMSHIM_FREE_MODE=mode, VMMSHIM_STATS="1")
        r = subprocess.run([exe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        check(r.returncode == 0 and " 0 failed" in r.stdout, "%s: test_shim_threads passes traced" % mode)
        if not os.path.exists(path):
            check(False, "%s: trace written" % mode)
            continue
        allocs, frees = verify(path, mode)
        served = re.search(r"allocations served: cudaMalloc (\d+), cudaMallocAsync (\d+), cuMemAlloc (\d+), "
                           r"cuMemAllocAsync (\d+)", r.stderr)
        freed = re.search(r"frees: cudaFree (\d+), cudaFreeAsync (\d+), cuMemFree (\d+), cuMemFreeAsync (\d+)",
                          r.stderr)
        n_served = sum(int(x) for x in served.groups()) if served else -1
        n_freed = sum(int(x) for x in freed.groups()) if freed else -1
        check(n_served == allocs and n_freed == frees,
              "%s: the trace holds every allocation and free the shim counted (%d/%d, %d/%d)"
              % (mode, allocs, n_served, frees, n_freed))
    subprocess.run(["rm", "-rf", tmp])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
