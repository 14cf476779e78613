#!/usr/bin/env python3
"""Tag rules by Python file and function (py:), on the emulation (no GPU): a program under the
shim allocates through the emulated runtime with ctypes from two Python files of its own,
kv_cache.py and model.py, each calling cudaMalloc itself (the innermost Python frame is theirs),
every allocation through the same C call (ctypes), so one C call site serves several Python
sites:
  - VMMSHIM_TAG_RULES="kv=py:*/kv_cache.py;fwd=py:*/model.py:Model.forward": kv_cache.py's
    allocations go to kv, Model.forward's to fwd, model.py's other functions' and the main
    script's to the process's tag (untagged), in any order (the decision is kept per Python code
    object, not per C return address);
  - vmmshim.set_tag_rules at run time: a new rule applies at once; a malformed spec raises
    vmmshim.Error (EINVAL) with the rule and the character, and the rules in force stay;
  - `vmmshim ctl PID rules [SPEC|--clear]` from outside, and the rules in `ctl PID status`.
Ends with "N passed, N failed"."""
import json
import os
import subprocess
import sys

from harness import EMU, LAUNCHER, LIB, PYDIR, check, scratch, summary

# Each file calls cudaMalloc itself: a py: rule looks at the innermost Python frame.
KV = r'''
import ctypes
from alloc import rt
def grow(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
'''
MODEL = r'''
import ctypes
from alloc import rt
class Model:
    def __init__(self):
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(3 << 20)) == 0
    def forward(self, n):
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
def helper(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
'''
ALLOC = r'''
import ctypes
ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.CDLL(None)
rt.cudaSetDevice(0)
def malloc(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p.value
'''
MAIN = r'''
import json, sys
import vmmshim
from alloc import malloc
import kv_cache, model
MiB = 1 << 20
def tag_of(fn, *args):
    before = {k: v["live"] for k, v in vmmshim.tag_stats().items()}
    fn(*args)
    grown = [k for k, v in vmmshim.tag_stats().items() if v["live"] > before.get(k, 0)]
    return grown[0] if len(grown) == 1 else "?%s" % grown
out = {}
m = model.Model()
out["init"] = tag_of(model.Model)
for i in range(2):  # the same C site, Python sites in turn: each keeps its own decision
    out["kv%d" % i] = tag_of(kv_cache.grow, 2 * MiB)
    out["fwd%d" % i] = tag_of(m.forward, 2 * MiB)
    out["helper%d" % i] = tag_of(model.helper, 2 * MiB)
    out["main%d" % i] = tag_of(malloc, 2 * MiB)
vmmshim.set_tag_rules("big=size:>=1M")
out["api"] = [tag_of(kv_cache.grow, 2 * MiB), tag_of(kv_cache.grow, 4096)]
try:
    vmmshim.set_tag_rules("ok=capture;kv=py:")
    out["bad"] = "no error"
except vmmshim.Error as e:
    out["bad"] = [e.errno, str(e)]
out["kept"] = tag_of(malloc, 2 * MiB)
print("PID %d" % __import__("os").getpid(), flush=True)
sys.stdin.readline()  # the test changes the rules from outside meanwhile
out["ctl"] = tag_of(malloc, 2 * MiB)
print(json.dumps(out), flush=True)
sys.stdin.readline()
'''


def ctl(*args):
    return subprocess.run(["sh", LAUNCHER, "ctl"] + list(args), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=PYDIR), timeout=60)


def run(tmp):
    for name, text in (("kv_cache.py", KV), ("model.py", MODEL), ("alloc.py", ALLOC), ("main.py", MAIN)):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    env = dict(os.environ, LD_PRELOAD=LIB, LD_LIBRARY_PATH=EMU, PYTHONPATH=PYDIR + os.pathsep + tmp,
               VMMSHIM_TAG_RULES="kv=py:*/kv_cache.py;fwd=py:*/model.py:Model.forward")
    p = subprocess.Popen([sys.executable, os.path.join(tmp, "main.py")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    try:
        line = p.stdout.readline()
        check(line.startswith("PID "), "the program runs to its pause (%r)" % line)
        pid = line.split()[1] if line.startswith("PID ") else "0"
        r = ctl(pid, "rules")
        check(r.returncode == 0 and "1. big=size:>=1M (" in r.stdout, "ctl rules shows the rule: %r" % r.stdout)
        r = ctl(pid, "rules", "late=size:>=1M;x=phase:soon")
        check(r.returncode == 1 and "rule 2 ('x=phase:soon'), at character 18: a phase is before-launch or "
              "after-launch" in r.stderr, "ctl rules with a bad spec: the message (%r)" % r.stderr)
        r = ctl(pid, "rules", "late=size:>=1M")
        check(r.returncode == 0 and "1. late=size:>=1M (0 allocations)" in r.stdout, "ctl rules SPEC: %r" % r.stdout)
        r = ctl(pid, "status")
        check(r.returncode == 0 and "tag rules" in r.stdout and "late=size:>=1M" in r.stdout,
              "ctl status lists the rules: %r" % r.stdout[-400:])
        p.stdin.write("\n")
        p.stdin.flush()
        line = p.stdout.readline()
        out = json.loads(line) if line.startswith("{") else {}
        r = ctl(pid, "rules", "--clear")
        check(r.returncode == 0 and "no tag rules" in r.stdout, "ctl rules --clear: %r" % r.stdout)
        p.stdin.write("\n")
        p.stdin.flush()
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 0, "the program exits cleanly (%s): %s" % (p.returncode, err[-500:]))
    check(out.get("init") == "untagged", "Model.__init__ (model.py, not forward): untagged %s" % out.get("init"))
    for i in range(2):
        got = [out.get(k + str(i)) for k in ("kv", "fwd", "helper", "main")]
        check(got == ["kv", "fwd", "untagged", "untagged"],
              "round %d: kv_cache.py -> kv, Model.forward -> fwd, model.helper and main -> untagged %s" % (i, got))
    check(out.get("api") == ["big", "untagged"], "set_tag_rules: the new rule at once %s" % out.get("api"))
    bad = out.get("bad")
    check(isinstance(bad, list) and bad[0] == 22 and "rule 2 ('kv=py:'), at character 15: the glob is empty" in bad[1],
          "a malformed spec: vmmshim.Error EINVAL naming rule and character %s" % bad)
    check(out.get("kept") == "big", "the rules in force stay after a malformed spec %s" % out.get("kept"))
    check(out.get("ctl") == "late", "the rules set from outside apply %s" % out.get("ctl"))


def main():
    with scratch("rules-py") as tmp:
        run(tmp)
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
