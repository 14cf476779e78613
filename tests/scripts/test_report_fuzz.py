#!/usr/bin/env python3
"""The trace readers of vmmshim-report and vmmshim-replay on malformed input (issue 26 item 11).

First the cases seen: a device id of 0xfffffffff with --memory-viz (it made a list of that
length), an inf or nan time in an RMM log, numbers of 10,000 digits, negative sizes and times
(they were summed: "-256 B requested"), a bad version line: each line is skipped and counted
("skipped: N malformed lines"), the rest of the trace read; a bad version line is one error
line, exit 2.

Then a fuzz, deterministic (seed 26): real traces (tests/data/small.trace and small.csv, a
synthetic version-2 trace with every record type, a version-3 one that adds tag names, sleeps,
wakes and host memory mapped at device addresses, and, when the build is there, native and rmm
traces that the shim writes of test_shim_stacks with stacks) are mutated line by line (a field
replaced by a huge, negative, nan, inf, 10,000-digit, non-hex or empty value, a line truncated,
joined to the next, emptied, duplicated or replaced by binary garbage) and each mutant goes
through every output (the text, --by-site with --html, --memory-viz and --perfetto, and
vmmshim-replay --convert-only), in one child process with its address space limited to 1 GiB
(RLIMIT_AS): no exception, exit status 0 (2 only when the first line was mutated, with one
error line), no negative byte count printed, outputs that load (pickle, JSON), each run under
5 s. A few mutants also run as the commands themselves (no "Traceback" on stderr). The whole
test takes well under 20 s. Ends with "N passed, N failed"."""
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import pickle
import random
import re
import resource
import subprocess
import sys
import time
import traceback

from harness import REPLAY, REPORT, ROOT, check, scratch, summary

BUILD = os.environ.get("BUILD", "build")
MEMORY = 1 << 30  # RLIMIT_AS of the child: the readers must not need more
SEED = 26
MUTANTS = 50  # per base trace
RUN_LIMIT = 5.0  # seconds per run of a small mutant
NEG_BYTES = re.compile(r"(?<![\w.])-\d[\d.]* (?:[KMGTP]iB|B)\b")


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def tool(prog, args, timeout=60):
    """(rc, stdout, stderr, seconds) of the command itself, under the memory limit."""
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, prog] + args, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                           preexec_fn=limit_memory, errors="replace")
        return r.returncode, r.stdout, r.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, "", "timed out", time.monotonic() - t0


# ---------------------------------------------------------------- the cases seen
NATIVE = ("v 2 vmmshim 0.1.0\nx /bin/prog\nc prog\np 1 0 0\ns 0 0\n"
          "m 10 1 2 0 7f0000000000 400000 1 0 0 10\n"
          "a 100 1 0 0 - 7f0000000000 100 100 0\n"
          "%s"
          "a 300 1 0 0 - 7f0000100000 200 200 0\n"
          "f 400 1 0 0 - 7f0000000000 100\n"
          "e 500\n")
RMM = ("Thread,Time,Action,Pointer,Size,Stream\n"
       "100,10:00:00.000000,allocate,0x7f0000000000,1024,0x0\n"
       "%s"
       "100,10:00:00.000200,free,0x7f0000000000,1024,0x0\n"
       "100,10:00:00.000300,allocate,0x7f0000200000,4096,0x0\n")


def test_seen(tmp):
    cases = [  # (label, trace text, options, more checks on stdout)
        ("device id 0xfffffffff, --memory-viz", NATIVE % "a 200 1 0 fffffffff - 7f0000200000 100 100 0\n",
         ["--memory-viz", "viz"], None),
        ("device id 4096 (past MAX_DEVICE)", NATIVE % "a 200 1 0 1000 - 7f0000200000 100 100 0\n", [], None),
        ("a 10,000-digit time", NATIVE % ("a %s 1 0 0 - 7f0000200000 100 100 0\n" % ("9" * 10000)), [], None),
        ("a 10,000-digit size", NATIVE % ("a 200 1 0 0 - 7f0000200000 %s 100 0\n" % ("f" * 10000)), [], None),
        ("a 17-digit size (past 64 bits)", NATIVE % "a 200 1 0 0 - 7f0000200000 10000000000000000 100 0\n", [],
         None),
        ("a negative size", NATIVE % "a 200 1 0 0 - 7f0000200000 -100 -100 0\n", [], None),
        ("a negative time", NATIVE % "f -200 1 0 0 - 7f0000100000 200\n", [], None),
        ("an inf time", NATIVE % "a inf 1 0 0 - 7f0000200000 100 100 0\n", [], None),
        ("a negative pool event size", NATIVE % "m 200 1 2 0 7f0000400000 -400000 1 0 0 10\n", [], None),
        ("rmm: an inf time", RMM % "100,10:00:inf,allocate,0x7f0000100000,2048,0x0\n", [], None),
        ("rmm: a nan time", RMM % "100,10:00:nan,allocate,0x7f0000100000,2048,0x0\n", [], None),
        ("rmm: a negative size", RMM % "100,10:00:00.000100,allocate,0x7f0000100000,-256,0x0\n", [], None),
        ("rmm: a 10,000-digit size", RMM % ("100,10:00:00.000100,allocate,0x7f0000100000,%s,0x0\n" % ("9" * 10000)),
         [], None),
        ("rmm: hour 99", RMM % "100,99:00:00.000100,allocate,0x7f0000100000,2048,0x0\n", [], None),
    ]
    for label, text, opts, _ in cases:
        path = os.path.join(tmp, "seen.trace")
        with open(path, "w") as f:
            f.write(text)
        args = [path] + [os.path.join(tmp, o) if o == "viz" else o for o in opts]
        rc, out, err, dt = tool(REPORT, args)
        ok = rc == 0 and "Traceback" not in err and dt < 10
        check(ok and "skipped: 1 malformed lines" in out and "malformed line skipped" in err,
              "%s: the line is skipped and counted, the rest read (rc %s, %.1f s%s)"
              % (label, rc, dt, "" if ok else ": " + err.strip()[-300:]))
        check(not NEG_BYTES.search(out), "%s: no negative byte count %s" % (label, NEG_BYTES.findall(out)))
        m = re.search(r"(\d+) allocations \(", out)
        check(m and int(m.group(1)) == 2, "%s: the other allocations counted (%s)" % (label, m and m.group(1)))
        if "--memory-viz" in opts:
            try:
                snap = pickle.load(open(os.path.join(tmp, "viz"), "rb"))
                ndev = len(snap["device_traces"])
            except Exception as e:  # a missing or broken snapshot
                ndev = repr(e)
            check(ndev == 1, "%s: the snapshot has one device's trace (%s)" % (label, ndev))
    for first in ("v 0 vmmshim 0.1.0", "v -1 vmmshim 0.1.0", "v %s vmmshim 0.1.0" % ("f" * 10000), "v"):
        path = os.path.join(tmp, "version.trace")
        with open(path, "w") as f:
            f.write(first + "\na 100 1 0 0 - 7f0000000000 100 100 0\n")
        rc, out, err, dt = tool(REPORT, [path])
        lines = err.splitlines()
        check(rc == 2 and len(lines) == 1 and len(lines[0]) < 300
              and ("malformed version line" in lines[0] or "not a vmmshim trace" in lines[0]),
              "version line %r...: one short error line, exit 2 (rc %s: %r)" % (first[:12], rc, err[-200:]))
    # the boundary: device MAX_DEVICE (4095) is read
    path = os.path.join(tmp, "dev.trace")
    with open(path, "w") as f:
        f.write(NATIVE % "a 200 1 0 fff - 7f0000200000 100 100 0\n")
    rc, out, err, dt = tool(REPORT, [path])
    check(rc == 0 and "malformed" not in out + err and "3 allocations" in out, "device 4095 is read (rc %s)" % rc)


# ---------------------------------------------------------------- base traces
def synthetic_v2():
    """Every record type of version 2: modules, strings, stacks (native and Python), allocations,
    frees, failures, pool events, the stack settings."""
    out = ["v 2 vmmshim 0.1.0", "x /usr/bin/python3", "c python3 train.py", "p 4d2 1 0", "s 17a2b3c4d5e6f700 0",
           "t 10 100000 4", "l 1 400000 500000 0 0123456789abcdef0123456789abcdef01234567 /no/such/prog",
           "l 2 7f0000000000 7f0000100000 7f0000000000 - /no/such/libcudart.so.13",
           "n 1 /home/user/train.py", "n 2 forward", "n 3 <module>",
           "k 1 2 0 400123 7f0000000456", "k 2 1 2 400200 1 2 12 1 3 2a", "k 3 0 0"]
    t = 1000
    for i in range(40):
        t += 1000 + 37 * i
        if i % 7 == 3:
            out.append("m %x 4d2 %x 0 %x %x %x 0 0 %x" % (t, i % 7, 0x7e0000000000 + i * 0x1000000, 0x200000, i, 99))
        out.append("a %x 4d2 %x 0 %s %x %x %x %x" % (t, i % 4, "-" if i % 2 else "abc0", 0x7f0000000000 + i * 0x100000,
                                                    4096 << (i % 9), 4096 << (i % 9), i % 4))
        if i % 3 == 0:
            out.append("f %x 4d2 %x 0 - %x %x" % (t + 500, i % 4, 0x7f0000000000 + i * 0x100000, 4096 << (i % 9)))
        if i % 11 == 5:
            out.append("o %x 4d2 0 0 - 40000000 2" % (t + 700))
    out.append("e %x" % (t + 10000))
    return "\n".join(out) + "\n"


def synthetic_v3():
    """Version 3 adds tags and sleeps: the version-2 records, plus tag names, sleeps and wakes in
    every mode and of every tag, a failed wake, and host memory mapped at device addresses
    (map and unmap records with FLAGS 80). The allocations lie in a reserved range that the sleeps
    unmap and the wakes map (the report puts them down to a tag), and a mapped sleep copies from
    an alias (FLAGS 40) in a range it reserves and frees."""
    v2 = synthetic_v2().splitlines()
    body = [ln for ln in v2[1:] if not ln.startswith("e ")]
    first = next(i for i, ln in enumerate(body) if ln[:2] in ("a ", "m "))
    body[first:first] = ["m 10 4d2 0 0 7f0000000000 40000000 0 0 0 10"] + [
        "m %x 4d2 2 0 %x 200000 %x 0 0 10" % (20 + k, 0x7f0010000000 + k * 0x200000, 100 + k) for k in range(6)]
    end = int(v2[-1].split()[1], 16)
    t = end
    for i, (kind, tag, name, mode) in enumerate([(0, "1", "weights", 1), (0, "2", "kv", 0), (1, "2", "kv", 0),
                                                 (0, "1", "weights", 2), (1, "ffffffffffffffff", None, 0),
                                                 (1, "1", "weights", 1)]):
        t += 5000
        # a sleep unmaps a block mapped at the start, a wake maps a new one
        va = (0x7f0010000000 if kind == 0 else 0x7f0020000000) + i * 0x200000
        body.append("m %x 4d2 %x 0 %x 200000 0 0 0 10" % (t - 100, 4 if kind == 0 else 2, va))
        if mode == 2 and kind == 0:
            body.extend("m %x 4d2 %s 0 7f8000000000 200000 0 %s 0 10" % (t - 90 + k, op, fl)
                        for k, (op, fl) in enumerate([(0, 0), (2, 40), (4, 40), (6, 0)]))
        if name:
            body.append("g %x 4d2 0 - %s %s" % (t, tag, name))
        result = 2 if i == 4 else 0
        body.append("w %x 4d2 %x - %s %x %x %x %x %x" % (t + 10, kind, tag, mode, 0x4000000 * (i + 1),
                                                         0x2000000 if mode else 0, result, 123456))
        if mode == 2:
            body.append("m %x 4d2 2 0 7e0000000000 4000000 77 80 0 400" % (t + 20))
            body.append("m %x 4d2 4 0 7e0000000000 4000000 0 80 0 300" % (t + 30))
    return "\n".join(["v 3 vmmshim 0.1.0"] + body + ["e %x" % (t + 10000)]) + "\n"


def shim_traces(tmp):
    """Native (version 2, stacks) and rmm traces the shim writes of test_shim_stacks; [] without the build."""
    prog = os.path.join(ROOT, BUILD, "tests", "test_shim_stacks")
    lib = os.path.join(ROOT, BUILD, "libvmmshim.so")
    if not (os.path.exists(prog) and os.path.exists(lib)):
        if os.environ.get("CI") == "true":
            check(False, "the build (make test builds it) is there for traces of the shim")
        else:
            print("SKIP traces of the shim: no %s; not counted" % prog)
        return []
    got = []
    for fmt in ("native", "rmm"):
        path = os.path.join(tmp, "shim-%s.trace" % fmt)
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, BUILD, "emu"), LD_PRELOAD=lib, VMMSHIM_TRACE=path,
                   VMMSHIM_TRACE_STACKS="16", VMMSHIM_TRACE_FORMAT=fmt)
        r = subprocess.run([prog, "sites"], env=env, capture_output=True, text=True, timeout=60)
        ok = r.returncode == 0 and os.path.exists(path) and os.path.getsize(path) > 200
        check(ok, "the shim wrote a %s trace of test_shim_stacks" % fmt)
        if ok:
            got.append(path)
    return got


# ---------------------------------------------------------------- mutations
HUGE_VALUES = ["f" * 20, "9" * 10000, "f" * 10000, "-1", "-100", "nan", "inf", "-inf", "1e400", "", "zz", "0x",
               "+5", "1_0", "\u00e9", "\x00", "fffffffff", "ffffffffffffffff", "10000000000000000", "-", " ", "\t"]


def mutate_field(line, rnd):
    sep = "," if line.count(",") >= 3 else " "
    f = line.rstrip("\n").split(sep)
    i = rnd.randrange(len(f))
    v = rnd.choice(HUGE_VALUES)
    if rnd.random() < 0.3 and f[i]:
        v = rnd.choice(["-" + f[i], f[i] + "0" * 17, f[i][:-1], "0x" + f[i], f[i] * 3])
    f[i] = v
    return sep.join(f) + "\n"


def mutate(lines, rnd):
    """A copy of lines (bytes) with 1 to 3 of them changed; also the index of the first changed."""
    out = list(lines)
    first = len(out)
    for _ in range(rnd.randint(1, 3)):
        i = rnd.randrange(len(out))
        first = min(first, i)
        line = out[i].decode("utf-8", "replace")
        kind = rnd.randrange(8)
        if kind <= 2:
            out[i] = mutate_field(line, rnd).encode("utf-8", "surrogatepass")
        elif kind == 3:
            out[i] = line[:rnd.randrange(len(line) + 1)].rstrip("\n").encode() + b"\n"  # truncated
        elif kind == 4:
            out[i] = out[i].rstrip(b"\n")  # joined to the next line
        elif kind == 5:
            out[i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 80))) + b"\n"  # binary garbage
        elif kind == 6:
            out[i] = rnd.choice([b"\n", b"", out[i] + out[i]])  # empty, gone, doubled
        else:
            out[i] = (rnd.choice("afmokntlpsexcvz") + line[1:]).encode("utf-8", "surrogatepass")  # another type
    return out, first


# ---------------------------------------------------------------- the child: every mutant, every output
def load(path, name):
    loader = importlib.machinery.SourceFileLoader(name, path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(mod)
    return mod


def child(cases_path, results_path):
    """Runs each case [trace, first line changed?, real symboliser?] through the report (text; --by-site
    with every file output) and the replay converter in this process; writes the problems found."""
    limit_memory()
    load(REPORT, "vmmshim_report_entry")
    from vmmshim_report import cli
    replay = load(REPLAY, "vmmshim_replay")
    cases = json.load(open(cases_path))
    problems = []
    slowest = 0.0
    for n, (trace, first_changed, real_sym) in enumerate(cases):
        base = trace + ".out"
        runs = [("text", lambda: cli.main([trace])),
                ("all", lambda: cli.main([trace, "--by-site", "--top", "3", "--html", base + ".html", "--memory-viz",
                                          base + ".pickle", "--perfetto", base + ".json"] +
                                         ([] if real_sym else ["--addr2line", "/no/such/addr2line"]))),
                ("replay", lambda: replay.main(["--convert-only", "--no-progress", "-o", base + ".replay", trace]))]
        for mode, fn in runs:
            out, err = io.StringIO(), io.StringIO()
            t0 = time.monotonic()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        rc = fn()
                    except SystemExit as e:
                        rc = e.code
            except BaseException:  # what the command would have printed as a traceback
                problems.append("case %d (%s) %s: %s" % (n, os.path.basename(trace), mode,
                                                         traceback.format_exc()[-1500:]))
                continue
            dt = time.monotonic() - t0
            slowest = max(slowest, dt)
            what = "case %d (%s) %s" % (n, os.path.basename(trace), mode)
            if dt > RUN_LIMIT:
                problems.append("%s: took %.1f s" % (what, dt))
            errs = [l for l in err.getvalue().splitlines() if ": error: " in l]
            if rc == 2 and first_changed and len(errs) == 1:
                continue
            if rc != 0:
                problems.append("%s: exit %r: %r" % (what, rc, err.getvalue()[-300:]))
                continue
            if NEG_BYTES.search(out.getvalue()):
                problems.append("%s: a negative byte count: %s" % (what, NEG_BYTES.findall(out.getvalue())[:3]))
            if mode == "all":
                try:
                    pickle.load(open(base + ".pickle", "rb"))
                    json.load(open(base + ".json"))
                    if not open(base + ".html", encoding="utf-8").read().endswith("</html>\n"):
                        raise ValueError("html page cut short")
                except Exception as e:
                    problems.append("%s: an output does not load: %r" % (what, e))
    json.dump({"problems": problems, "runs": 3 * len(cases), "slowest": slowest}, open(results_path, "w"))


def test_fuzz(tmp):
    bases = [os.path.join(ROOT, "tests", "data", "small.trace"), os.path.join(ROOT, "tests", "data", "small.csv")]
    synth = os.path.join(tmp, "synthetic-v2.trace")
    with open(synth, "w") as f:
        f.write(synthetic_v2())
    bases.append(synth)
    synth3 = os.path.join(tmp, "synthetic-v3.trace")
    with open(synth3, "w") as f:
        f.write(synthetic_v3())
    bases.append(synth3)
    bases += shim_traces(tmp)
    rnd = random.Random(SEED)
    cases = []
    for b in bases:
        lines = open(b, "rb").read().splitlines(True)
        for k in range(MUTANTS):
            mutant, first = mutate(lines, rnd)
            path = os.path.join(tmp, "m%03d-%s" % (k, os.path.basename(b)))
            with open(path, "wb") as f:
                f.writelines(mutant)
            cases.append([path, first == 0, k % 25 == 0])
    cases_path, results_path = os.path.join(tmp, "cases.json"), os.path.join(tmp, "results.json")
    json.dump(cases, open(cases_path, "w"))
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", cases_path, results_path],
                           capture_output=True, text=True, timeout=300, errors="replace")
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, "timed out after 300 s"
    dt = time.monotonic() - t0
    res = json.load(open(results_path)) if rc == 0 and os.path.exists(results_path) else None
    check(dt < 60, "fuzz: the child's runs took %.1f s (a bound far above its 5 to 10 s: a reader that blows up "
          "runs into it)" % dt)
    check(res is not None, "fuzz: the child ran every mutant under a 1 GiB address space (rc %s: %s)"
          % (rc, err.strip()[-500:]))
    if res is None:
        return
    for p in res["problems"][:10]:
        print("  " + p.replace("\n", "\n    "))
    check(not res["problems"], "fuzz: %d runs of %d mutants of %d traces (text, --by-site --html --memory-viz "
          "--perfetto, replay): no exception, status 0 (2 for a bad first line), no negative bytes, outputs load, "
          "each under %g s (%d problems)" % (res["runs"], len(cases), len(bases), RUN_LIMIT, len(res["problems"])))
    print("fuzz: %d runs in %.1f s, the slowest %.2f s" % (res["runs"], dt, res["slowest"]))
    # a few mutants as the commands themselves: what a user sees
    bad = []
    for path, first_changed, _ in cases[::37]:
        for prog, args in ((REPORT, [path, "--by-site", "--html", path + ".c.html", "--memory-viz", path + ".c.pickle",
                                     "--perfetto", path + ".c.json", "--addr2line", "/no/such/addr2line"]),
                           (REPLAY, ["--convert-only", path])):
            rc, out, err, t = tool(prog, args)
            if "Traceback" in err or not (rc == 0 or rc == 2 and first_changed):
                bad.append("%s %s: rc %s %s" % (os.path.basename(prog), os.path.basename(path), rc, err[-300:]))
    check(not bad, "fuzz: the commands on %d mutants: status 0 (or 2), no traceback %s"
          % (len(cases[::37]), bad[:3]))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    t0 = time.monotonic()
    with scratch("vmmshim-report-fuzz-") as tmp:
        test_seen(tmp)
        test_fuzz(tmp)
    used = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print("the test took %.1f s (%.1f s of CPU)" % (time.monotonic() - t0, sum(u.ru_utime + u.ru_stime for u in used)))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
