#!/usr/bin/env python3
"""The residue from outside and from Python, on the host emulation.

The target is a python3 under the shim with the emulated runtime: it loads
build/tests/libresidue_helper.so (a library that makes its own device memory), makes 6 MiB of VMM
memory and 2 MiB of pinned host memory with it, allocates 8 MiB through the shim in tag weights,
sleeps weights and calls vmmshim.residue() itself; then it waits on its standard input. From
outside, through scripts/vmmshim:
  - `ctl PID residue`: the table (the helper's 6 MiB under LIBS, nothing unexplained), the helper's
    line, its site, exit 0; --json: the reply's members and figures; an argument is a usage error;
  - `ctl PID status` says what was made outside the pools; `top --once` has the process's
    "(outside)" line;
  - in the target, vmmshim.residue() gave the same figures;
  - with stacks on (VMMSHIM_TRACE_STACKS), the helper's site names the target's Python line;
  - vmmshim-report on the target's trace lists the helper's site by its offset in the helper.
Ends with "N passed, N failed"."""
import json
import os
import re
import subprocess
import sys

from harness import BUILD_DIR, EMU, LIB, PYDIR, check, ctl, launcher, report, summary

HELPER = os.path.join(BUILD_DIR, "tests", "libresidue_helper.so")
MiB = 1 << 20
TARGET = r"""
import ctypes, json, sys
sys.path.insert(0, %(pydir)r)
import vmmshim
rt = ctypes.CDLL("libcudart.so")
rt.cudaFree(None)
h = ctypes.CDLL(%(helper)r)
class V(ctypes.Structure):
    _fields_ = [("va", ctypes.c_uint64), ("size", ctypes.c_size_t), ("handle", ctypes.c_uint64)]
v = V()
assert h.helper_vmm_make(ctypes.c_size_t(6 << 20), 0, 0, ctypes.byref(v)) == 0
h.helper_pinned.restype = ctypes.c_void_p
assert h.helper_pinned(ctypes.c_size_t(2 << 20))
vmmshim.set_tag("weights")
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(8 << 20)) == 0
vmmshim.set_tag(None)
vmmshim.sleep("weights")
print(json.dumps(vmmshim.residue()), flush=True)
sys.stdin.readline()
"""


def main():
    trace = "/tmp/vmmshim-ctl-residue-%d.trace" % os.getpid()
    env = dict(os.environ, LD_PRELOAD=LIB, LD_LIBRARY_PATH=EMU, VMMSHIM_TRACE=trace, VMMSHIM_TRACE_STACKS="16")
    target = subprocess.Popen([sys.executable, "-c", TARGET % {"pydir": PYDIR, "helper": HELPER}], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = target.stdout.readline()
        try:
            own = json.loads(line)
        except ValueError:
            own = None
        check(own is not None, "the target's own vmmshim.residue(): %s %s" % (line[:200], "" if own else
                                                                              target.stderr.read()[-500:]))
        if own:
            d = own["devices"][0] if own["devices"] else {}
            check(d.get("owners", {}).get("libraries") == 6 * MiB and d["owners"]["unexplained"] == 0
                  and own["host_pinned"] == 2 * MiB and own["sleeps"] == 1,
                  "vmmshim.residue(): 6 MiB of the helper, 2 MiB pinned, nothing unexplained %s" % d)
            check(any(lb["name"] == "libresidue_helper.so" and lb["vmm"] == 6 * MiB for lb in own["libraries"]),
                  "vmmshim.residue() names the helper %s" % own["libraries"])
        pid = target.pid
        rc, out = ctl(pid, "residue")
        check(rc == 0 and "residue after 1 sleep" in out, "ctl residue (exit %d): %s" % (rc, out[:300]))
        rows = [ln.split() for ln in out.splitlines() if ln.startswith("0 ")]
        check(len(rows) == 1 and rows[0][3] == "6.00M" and rows[0][11] == "0", "the device row: libs 6.00M, "
              "unexplained 0 %s" % rows)
        check("library libresidue_helper.so: VMM 6.00 MiB, managed 0 B, pinned host 2.00 MiB, arrays 0 B" in out,
              "the helper's line")
        check("site libresidue_helper.so+0x" in out, "the helper's site")
        check(re.search(r"site libresidue_helper\.so\+0x[0-9a-f]{1,5} \(helper_vmm_make\+0x[0-9a-f]+\) "
                        r"\(<string>:1[0-9] <module>\): 6\.00 MiB vmm", out) is not None,
              "the site: its offset in the helper (not the address), the symbol, and with stacks the Python line "
              "(the target's helper_vmm_make call)")
        rc, out = ctl(pid, "residue", "--json")
        try:
            r = json.loads(out)
        except ValueError:
            r = {}
        check(rc == 0 and r.get("ok") is True and r["devices"][0]["owners"]["libraries"] == 6 * MiB
              and r["devices"][0]["owners"]["unexplained"] == 0 and r["host_pinned"] == 2 * MiB,
              "ctl residue --json: %s" % out[:300])
        site = (r.get("sites") or [{}])[0]
        check(int(site.get("offset", "0x0"), 16) < 1 << 20 and int(site.get("address", "0x0"), 16) > 1 << 20
              and int(site["address"], 16) - int(site["offset"], 16) > 0
              and site.get("symbol", "").startswith("helper_vmm_make+0x"),
              "the JSON site: the absolute address, its offset in the helper, the symbol %s" % site)
        rc, out = ctl(pid, "residue", "x")
        check(rc == 2 and "residue takes no argument" in out, "an argument is a usage error (exit %d)" % rc)
        rc, out = ctl(pid, "status")
        check(rc == 0 and "made outside the pools: VMM 6.00 MiB, managed 0 B, pinned host 2.00 MiB" in out,
              "status says what was made outside the pools: %s" % out[-400:])
        rc, out = launcher("top", "--once", "--pid", pid)
        check(rc == 0 and any(ln.split()[:1] == ["(outside)"] and "6.00M" in ln and "libs" in ln
                              for ln in out.splitlines()), "top --once has the (outside) line:\n%s" % out)
    finally:
        target.stdin.close()
        target.wait(timeout=30)
        # The trace keeps the absolute caller; the report names it by the helper's `l` record.
        r = report(trace) if os.path.exists(trace) else None
        check(r is not None and re.search(r"\n    libresidue_helper\.so\+0x[0-9a-f]{1,5}: 6 MiB VMM\n", r.stdout)
              is not None, "the report: the helper's site by its offset in the helper, still holding 6 MiB:\n%s" % (
                  r.stdout[-600:] if r else "no trace"))
        if os.path.exists(trace):
            os.unlink(trace)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
