#!/usr/bin/env python3
"""Where memory went, end to end on the host emulation: programs traced under the shim with
VMMSHIM_TRACE_STACKS, then read by vmmshim-report --by-site.

  - C: test_shim_stacks's 'sites' scenario allocates from three known functions (3, 5 and 7
    allocations through cudaMalloc, cuMemAlloc and cudaMallocAsync). The report's sites name
    those functions at the source lines of their allocation calls, with exact counts and bytes,
    and the counts add up to the shim's own counters (VMMSHIM_STATS=1).
  - Python: a script that allocates through the runtime with ctypes (the GIL held, as PyTorch
    holds it) from three functions. The report's sites name the script's lines and functions;
    Python frames are deduplicated (one stack per site), and the counts equal the shim's.
  - The same Python script with VMMSHIM_TRACE_PYTHON=0: native sites only.
Ends with "N passed, N failed"."""
import os
import re
import subprocess
import sys
import tempfile

from harness import REPORT, ROOT, check, summary

BUILD = os.environ.get("BUILD", "build")
EMU = os.path.join(ROOT, BUILD, "emu")
LIB = os.path.join(ROOT, BUILD, "libvmmshim.so")


def shim_env(trace, **extra):
    env = dict(os.environ)
    env.update(LD_LIBRARY_PATH=EMU, LD_PRELOAD=LIB, VMMSHIM_TRACE=trace, VMMSHIM_STATS="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def served(stats_text):
    """Allocations served, summed over the APIs of the shim's exit stats."""
    m = re.search(r"allocations served: cudaMalloc (\d+), cudaMallocAsync (\d+), cuMemAlloc (\d+), "
                  r"cuMemAllocAsync (\d+)", stats_text)
    return sum(int(x) for x in m.groups()) if m else -1


def by_allocations(report_text):
    """{site: (count, requested)} from the report's 'by allocations' table."""
    sites, on = {}, False
    for line in report_text.splitlines():
        if line.startswith("by allocations"):
            on = True
            continue
        if on:
            m = re.match(r"\s+(\d+)\s+(\d+)\s+(.*)$", line)
            if not m:
                if line.strip() and not line.lstrip().startswith("allocations"):
                    break
                continue
            sites[m.group(3)] = (int(m.group(1)), int(m.group(2)))
    return sites


def line_of(path, pattern, after):
    """The number of the first line matching pattern after the line matching `after`."""
    seen = False
    for i, text in enumerate(open(path), 1):
        if re.search(after, text):
            seen = True
        elif seen and re.search(pattern, text):
            return i
    return -1


def report(trace):
    r = subprocess.run([sys.executable, REPORT, "--by-site", "--top", "20", trace], capture_output=True, text=True)
    check(r.returncode == 0, "vmmshim-report --by-site %s exits 0 (%s)" % (os.path.basename(trace), r.stderr.strip()[-200:]))
    return r.stdout


def test_c(tmp):
    trace = os.path.join(tmp, "c.trace")
    prog = os.path.join(ROOT, BUILD, "tests", "test_shim_stacks")
    r = subprocess.run([prog, "sites"], env=shim_env(trace, VMMSHIM_TRACE_STACKS=16), capture_output=True, text=True)
    check(r.returncode == 0 and "sites: " in r.stdout, "the C program ran under the shim")
    n = served(r.stderr)
    sites = by_allocations(report(trace))
    src = os.path.join(ROOT, "tests", "test_shim_stacks.c")
    want = {
        "alloc_site_a": (3, 3 * 1048576, line_of(src, r"cudaMalloc\(&p, MiB\)", r"void alloc_site_a")),
        "alloc_site_b": (5, 5 * 3000, line_of(src, r"cuMemAlloc\(&d, 3000\)", r"void alloc_site_b")),
        "alloc_site_c": (7, 7 * 65536, line_of(src, r"cudaMallocAsync\(&p, 64 \* KiB", r"void alloc_site_c")),
    }
    for func, (count, size, line) in want.items():
        name = "%s:%d %s" % (src, line, func)
        check(sites.get(name) == (count, size), "C: site %s: %s allocations, %s bytes (report: %s)" %
              (name, count, size, sites.get(name)))
    check(n == 15 and sum(c for c, _ in sites.values()) == n,
          "C: the sites' counts add up to the shim's %d allocations" % n)


SCRIPT = r'''
import ctypes, sys
ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
held = ctypes.PyDLL(None)  # the GIL stays held through the call
released = ctypes.CDLL(None)  # the GIL is released around it, as PyTorch does around its operators
def alloc(n, lib=held):
    p = ctypes.c_void_p()
    assert lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p
def make_weights():
    w = []
    while len(w) < 4:
        w.append(alloc(1 << 20))  # WEIGHTS
    return w
def make_activations(k):
    out = []
    for i in range(k):
        out.append(alloc(256 * 1024))  # ACTIVATIONS
    return out
class Model:
    def workspace(self):
        return alloc(3 << 20)  # WORKSPACE
def make_cache():
    out = []
    for i in range(3):
        out.append(alloc(512 * 1024, released))  # CACHE
    return out
keep = make_weights() + make_activations(6) + [Model().workspace() for _ in range(2)] + make_cache()
print("allocated", len(keep))
'''


def test_python(tmp):
    script = os.path.join(tmp, "train.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    lines = {tag: i for i, text in enumerate(SCRIPT.splitlines(), 1) for tag in ("WEIGHTS", "ACTIVATIONS", "WORKSPACE", "CACHE")
             if "# " + tag in text}
    alloc_line = [i for i, text in enumerate(SCRIPT.splitlines(), 1) if "lib.cudaMalloc" in text][0]
    trace = os.path.join(tmp, "py.trace")
    r = subprocess.run([sys.executable, script], env=shim_env(trace, VMMSHIM_TRACE_STACKS=16), capture_output=True,
                       text=True)
    check(r.returncode == 0 and "allocated 15" in r.stdout, "the Python script ran under the shim (%s)" % r.stderr[-300:])
    n = served(r.stderr)
    text = open(trace).read()
    check(re.search(r"^n [0-9a-f]+ %s$" % re.escape(script), text, re.M) is not None,
          "Python: an 'n' record names the script")
    stacks = [l for l in text.splitlines() if l.startswith("k ")]
    check(len(stacks) == 4, "Python: 4 distinct stacks for 4 call sites (%d)" % len(stacks))
    check(all(int(s.split()[3], 16) >= 3 for s in stacks),
          "Python: each stack has its Python frames, also those allocated with the GIL released")
    # The innermost Python frame is alloc()'s call to cudaMalloc: the site is one level up.
    sites = by_allocations(subprocess.run([sys.executable, REPORT, "--by-site", "--site-depth", "1", trace],
                                          capture_output=True, text=True).stdout)
    inner = "%s:%d alloc" % (script, alloc_line)
    check(sites.get(inner) == (15, 4 * (1 << 20) + 6 * 256 * 1024 + 2 * (3 << 20) + 3 * 512 * 1024),
          "Python: every allocation's innermost frame is alloc() at line %d (%s)" % (alloc_line, sites))
    r2 = subprocess.run([sys.executable, REPORT, "--by-site", "--site-skip", r"\balloc$", trace], capture_output=True,
                        text=True)
    sites = by_allocations(r2.stdout)
    want = {
        "%s:%d make_weights" % (script, lines["WEIGHTS"]): (4, 4 << 20),
        "%s:%d make_activations" % (script, lines["ACTIVATIONS"]): (6, 6 * 256 * 1024),
        "%s:%d Model.workspace" % (script, lines["WORKSPACE"]): (2, 2 * (3 << 20)),
        "%s:%d make_cache" % (script, lines["CACHE"]): (3, 3 * 512 * 1024),
    }
    for name, v in want.items():
        check(sites.get(name) == v, "Python: site %s %s (report: %s)" % (name, v, sites.get(name)))
    check(n == 15 and sum(c for c, _ in sites.values()) == n, "Python: the sites add up to the shim's %d" % n)

    # held: the GIL is never taken back; the allocations made without it have native frames only.
    trace = os.path.join(tmp, "py-held.trace")
    r = subprocess.run([sys.executable, script], env=shim_env(trace, VMMSHIM_TRACE_STACKS=16, VMMSHIM_TRACE_PYTHON="held"),
                       capture_output=True, text=True)
    stacks = [l for l in open(trace).read().splitlines() if l.startswith("k ")]
    npy = sorted(int(s.split()[3], 16) for s in stacks)
    check(r.returncode == 0 and len(stacks) == 4 and npy[0] == 0 and all(k >= 3 for k in npy[1:]),
          "VMMSHIM_TRACE_PYTHON=held: Python frames for the 3 sites that hold the GIL, none for the one that "
          "released it (Python frames per stack: %s)" % npy)

    trace = os.path.join(tmp, "py-native.trace")
    r = subprocess.run([sys.executable, script], env=shim_env(trace, VMMSHIM_TRACE_STACKS=16, VMMSHIM_TRACE_PYTHON=0),
                       capture_output=True, text=True)
    text = open(trace).read()
    check(r.returncode == 0 and "\nn " not in text and "\nk " in text,
          "VMMSHIM_TRACE_PYTHON=0: native stacks, no Python frame strings")


def main():
    with tempfile.TemporaryDirectory(prefix="vmmshim-stacks-") as tmp:
        test_c(tmp)
        test_python(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
