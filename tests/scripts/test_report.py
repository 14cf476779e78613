#!/usr/bin/env python3
"""Tests of scripts/vmmshim-report: golden text on hand-built traces (native and rmm) and on
examples/sample.trace (version 3, made by the shim on the emulation), the by-tag table on a
hand-built version-3 trace, format-version refusal, partial last line, memory_viz pickle, Perfetto JSON, a 100k
event synthetic trace, and the HTML page rendered by headless chromium (each chart
screenshotted on its own and checked for drawn pixels). Ends with "N passed, N failed"."""
import json
import os
import pickle
import pickletools
import random
import re
import subprocess
import sys
import time

from harness import REPORT, ROOT, browser, check, colored_pixels, report, scratch, screenshot, summary

DATA = os.path.join("tests", "data")


def golden(trace, expected):
    r = report(trace)
    want = open(os.path.join(ROOT, expected)).read()
    if r.stdout != want:
        import difflib
        sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), r.stdout.splitlines(True), expected, "got"))
    check(r.returncode == 0 and r.stdout == want, "golden output for %s" % trace)
    return r


def test_golden():
    r = golden(os.path.join(DATA, "small.trace"), os.path.join(DATA, "small.expected"))
    check(r.stderr.count("unknown record type 'z'") == 1, "unknown record type: one warning")
    golden(os.path.join(DATA, "small.csv"), os.path.join(DATA, "small-csv.expected"))
    r = golden(os.path.join("examples", "sample.trace"), os.path.join(DATA, "sample.expected"))
    check(r.stderr == "", "examples/sample.trace: read without a warning %r" % r.stderr[:200])


def test_gpu_sample():
    """examples/sample-h100.trace, the same program's trace made on an H100: read without a warning,
    kv's sleep and wake in the by-tag table."""
    r = report(os.path.join("examples", "sample-h100.trace"))
    rows = [l.split() for l in r.stdout.splitlines() if l.startswith("  kv ")]
    check(r.returncode == 0 and r.stderr == "", "examples/sample-h100.trace: read without a warning %r" % r.stderr[:200])
    check(len(rows) == 1 and rows[0][1] == "12" and rows[0][-1] == "awake",
          "examples/sample-h100.trace: kv's 12 allocations, slept and woken, in the by-tag table %s" % rows)


def test_sleep_slices(tmp):
    """The Perfetto trace of examples/sample.trace: kv asleep as an async slice, the sleep and the
    wake calls as slices of the thread that made them."""
    pf = os.path.join(tmp, "sample.json")
    r = report(os.path.join("examples", "sample.trace"), "--perfetto", pf)
    ev = json.load(open(pf))["traceEvents"] if r.returncode == 0 else []
    asleep = [(e["ph"], e["name"]) for e in ev if e.get("cat") == "sleep" and e["ph"] in "be"]
    calls = [e for e in ev if e.get("cat") == "sleep" and e["ph"] == "X"]
    check(asleep == [("b", "kv asleep (host)"), ("e", "kv asleep (host)")],
          "perfetto: kv's time asleep is one slice %s" % asleep)
    check([e["name"] for e in calls] == ["sleep kv (host)", "wake kv"] and all(e["dur"] > 0 for e in calls)
          and calls[0]["args"]["host_bytes"] == 24 << 20 and calls[0]["tid"] == 0x128e,
          "perfetto: the sleep and the wake calls, with what they moved %s" % [(e["name"], e["args"]) for e in calls])


# Two tags and one that never sleeps, in reservations of their own (times are hexadecimal ns).
# Thread 2 unmaps in the third reservation (a trim) during kv's sleep, and thread 1 unmaps a
# mapping of it before its sleep starts (0x2000 - 0x800): neither makes it kv's. kv sleeps in
# mapped mode (copies from an alias, flag 40, in a range reserved and freed by the sleep; host
# memory, flag 80, mapped at its blocks' addresses), weights in discard mode and stays asleep; a
# wake of kv fails (-ENOMEM), the next one succeeds.
TAGS_TRACE = """v 3 vmmshim 0.1.0
p 1 0 0
s 0 0
m 10 1 0 0 7e0000000000 40000000 0 0 0 10
m 20 1 0 0 7f0000000000 40000000 0 0 0 10
m 30 1 0 0 7d0000000000 40000000 0 0 0 10
m 40 1 2 0 7e0000000000 4000000 1 0 0 10
m 50 1 2 0 7f0000000000 4000000 2 0 0 10
m 60 1 2 0 7d0000000000 4000000 3 0 0 10
m 70 1 2 0 7d0004000000 4000000 4 0 0 10
a 100 1 0 0 - 7e0000000000 1000000 1000000 0
a 110 1 0 0 - 7f0000000000 800000 800000 0
a 120 1 0 0 - 7f0000800000 800000 800000 0
a 130 1 0 0 - 7d0000000000 100000 100000 0
f 140 1 0 0 - 7f0000800000 800000
m 900 1 4 0 7d0004000000 4000000 0 0 0 10
m 1900 1 4 0 7f0000000000 4000000 0 0 0 10
m 1950 2 4 0 7d0000000000 4000000 0 0 0 10
m 1960 1 0 0 7f8000000000 4000000 0 0 0 10
m 1970 1 2 0 7f8000000000 4000000 2 40 0 10
m 1980 1 4 0 7f8000000000 4000000 0 40 0 10
m 1990 1 6 0 7f8000000000 4000000 0 0 0 10
m 1a00 1 2 0 7f0000000000 4000000 9 80 0 10
g 2000 1 0 - 1 kv
w 2000 1 0 - 1 2 4000000 4000000 0 800
m 3050 1 4 0 7e0000000000 4000000 0 0 0 10
g 3100 1 0 - 0 weights
w 3100 1 0 - 0 0 4000000 0 0 100
g 4000 1 0 - 1 kv
w 4000 1 1 - 1 0 0 0 fffffff4 10
m 5900 1 2 0 7f0000000000 4000000 5 0 0 10
g 6000 1 0 - 1 kv
w 6000 1 1 - 1 0 4000000 4000000 0 800
a 6100 1 0 0 - 7f0000800000 400000 400000 0
e 10000
"""


def tag_table(out):
    """The by-tag table of a text report: {tag: [cells after the name]}, in order."""
    lines = out.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith("by tag")), None)
    rows = {}
    if at is not None:
        head = lines[at + 1].split()
        check(head[:5] == ["tag", "allocs", "requested", "peak", "live"], "by tag: the column heads %s" % head)
        for ln in lines[at + 2:]:
            if not ln.startswith("  "):
                break
            m = re.match(r"  (\S+(?: \S+)*?)  +(\d+) +(.*)$", ln)
            if m:
                rows[m.group(1)] = [m.group(2)] + re.split(r"  +", m.group(3).strip())
    return rows


def test_by_tag(tmp):
    path = os.path.join(tmp, "tags.trace")
    with open(path, "w") as f:
        f.write(TAGS_TRACE)
    r = report(path)
    rows = tag_table(r.stdout)
    check(list(rows) == ["kv", "weights", "(not put down to a tag)"], "by tag: kv, weights, then the rest %s"
          % list(rows))
    # allocs, requested, peak live, live at end, live at sleep, sleeps, wakes, failed, to sleep, to host,
    # woken, asleep, at end
    check(rows.get("kv") == ["3", "20 MiB", "16 MiB", "12 MiB", "8 MiB", "1", "1", "1", "64 MiB", "64 MiB",
                             "64 MiB", "0.000016 s", "awake"], "by tag: kv's row %s" % rows.get("kv"))
    check(rows.get("weights") == ["1", "16 MiB", "16 MiB", "16 MiB", "16 MiB", "1", "0", "0", "64 MiB", "0 B",
                                  "0 B", "0.000053 s", "asleep"], "by tag: weights' row %s" % rows.get("weights"))
    check(rows.get("(not put down to a tag)") == ["1", "1 MiB", "-", "1 MiB"] + ["-"] * 9,
          "by tag: the allocations of ranges no sleep touched, on their own row %s"
          % rows.get("(not put down to a tag)"))
    check(r.returncode == 0 and r.stderr == "", "by tag: no warning %r" % r.stderr[:200])
    # From a pipe, the trace cannot be read twice: no peak per tag, the rest as from the file.
    cat = subprocess.Popen(["cat", path], stdout=subprocess.PIPE)
    piped = subprocess.run([sys.executable, REPORT, "-"], stdin=cat.stdout, cwd=ROOT, capture_output=True, text=True)
    cat.stdout.close()
    cat.wait()
    prow, frow = tag_table(piped.stdout).get("kv"), rows.get("kv") or []
    check(prow is not None and len(prow) > 3 and prow[2] == "-" and prow[:2] + prow[3:] == frow[:2] + frow[3:],
          "by tag: read from a pipe, no peak, the same other figures %s" % prow)
    check(re.search(r"^ +0\.000 s  wake +kv +device 0 B, 0\.0 ms, error -12 \(ENOMEM\)$", r.stdout, re.M),
          "sleeps and wakes: the failed wake's error is named %s" % re.findall(r".*error.*", r.stdout))
    # A wake of every tag (vmmshim_wake(NULL)) ends weights' sleep, and has a row of its own, last.
    every = os.path.join(tmp, "every.trace")
    with open(every, "w") as f:
        f.write(TAGS_TRACE.replace("e 10000\n", "w 8000 1 1 - ffffffffffffffff 0 4000000 0 0 100\ne 10000\n"))
    r = report(every)
    table = r.stdout[r.stdout.find("\nby tag"):]
    got = [(m.group(1), m.group(2).split()) for m in re.finditer(r"^  (kv|weights|every tag) +(.*)$", table, re.M)]
    check([g[0] for g in got] == ["kv", "weights", "every tag"] and got[1][1][-3:] == ["0.000020", "s", "awake"]
          and got[2][1][:10] == ["0", "0", "B", "-", "0", "B", "0", "B", "0", "1"],
          "by tag: a wake of every tag ends weights' sleep and has its own row %s" % got)


def test_refusals(tmp):
    newer = os.path.join(tmp, "newer.trace")
    with open(newer, "w") as f:
        f.write("v 5 vmmshim 9.9.9\na 0 1 0 0 - 1000 10 10 0\n")
    r = report(newer)
    check(r.returncode == 2 and "newer" in r.stderr, "a newer format version is refused with a clear message")
    junk = os.path.join(tmp, "junk.trace")
    with open(junk, "w") as f:
        f.write("hello\n")
    r = report(junk)
    check(r.returncode == 2 and "not a vmmshim trace" in r.stderr, "a file that is no trace is refused")
    # A trace cut mid-line (kill -9 during a write): the fragment is ignored.
    lines = open(os.path.join(ROOT, DATA, "small.trace")).read().splitlines(True)
    cut = os.path.join(tmp, "cut.trace")
    with open(cut, "w") as f:
        f.writelines(lines[:10])
        f.write(lines[10][:9])
    r = report(cut)
    check(r.returncode == 0 and "cut short" in r.stdout and "no end record" in r.stdout
          and "5 events" in r.stdout, "partial last line ignored, missing end record reported")


def test_exports(tmp):
    pk, pf, ht = (os.path.join(tmp, n) for n in ("s.pickle", "s.json", "s.html"))
    r = report(os.path.join(DATA, "small.trace"), "--memory-viz", pk, "--perfetto", pf, "--html", ht)
    check(r.returncode == 0, "exports written")
    snap = pickle.load(open(pk, "rb"))
    check(set(snap) >= {"segments", "device_traces"}, "memory_viz: segments and device_traces")
    segs = snap["segments"]
    # At the end 4 MiB stay mapped at 0x7f0000000000 holding the two leaked blocks.
    ok = len(segs) == 1 and segs[0]["address"] == 0x7f0000000000 and segs[0]["total_size"] == 4 << 20
    if ok:
        blocks = segs[0]["blocks"]
        at = segs[0]["address"]
        for b in blocks:  # memory_viz places blocks one after the other: they must tile the segment
            ok = ok and b["address"] == at
            at += b["size"]
        ok = ok and at == segs[0]["address"] + segs[0]["total_size"]
        active = [b for b in blocks if b["state"] == "active_allocated"]
        ok = ok and len(active) == 2 and segs[0]["allocated_size"] == (1 << 20) + (3 << 19)
    check(ok, "memory_viz: the mapped segment is tiled by its blocks, two active")
    actions = [e["action"] for e in snap["device_traces"][0]]
    check(actions.count("alloc") == 5 and actions.count("free_completed") == 3 and actions.count("segment_map") == 2
          and actions.count("segment_unmap") == 1 and actions.count("oom") == 1, "memory_viz: trace events")
    # memory_viz decodes pickles itself and knows only protocols 2-4 and a subset of opcodes.
    known = {"PROTO", "FRAME", "EMPTY_DICT", "EMPTY_LIST", "MEMOIZE", "MARK", "SHORT_BINUNICODE", "BINUNICODE",
             "BININT", "BININT1", "BININT2", "LONG1", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "BINGET",
             "LONG_BINGET", "BINPUT", "LONG_BINPUT", "STOP", "NONE", "NEWTRUE", "NEWFALSE", "BINFLOAT",
             "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "DICT", "LIST"}
    used = {op.name for op, arg, pos in pickletools.genops(open(pk, "rb").read())}
    check(used <= known, "memory_viz: only opcodes its decoder knows (extra: %s)" % sorted(used - known))
    pj = json.load(open(pf))
    live = [e["args"]["live"] for e in pj["traceEvents"] if e.get("ph") == "C" and e["name"] == "live bytes"]
    mapped = [e["args"]["mapped"] for e in pj["traceEvents"] if e.get("ph") == "C" and e["name"] == "mapped bytes"]
    check(live and max(live) == 6 << 20 and max(mapped) == 8 << 20, "perfetto: counter tracks peak at 6 and 8 MiB")
    page = open(ht).read()
    check(all('id="%s"' % c in page for c in ("chart-timeline", "chart-sizes", "chart-lifetimes"))
          and "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page,
          "html: three charts, no external resources")
    return ht


def synth(path, n, seed=1):
    """A native trace of about n events: random allocations and frees, pool growth."""
    rnd = random.Random(seed)
    live = {}
    peak = cur = 0
    t = 0
    next_ptr = 0x7f0000000000
    mapped = 0
    with open(path, "w") as f:
        f.write("v 1 vmmshim 0.1.0\nx /synthetic\nc synthetic\np 1 0 0\ns 0 0\n")
        for i in range(n):
            t += rnd.randint(100, 5000)
            if live and (rnd.random() < 0.48 or len(live) > 500):
                ptr = rnd.choice(list(live)) if len(live) < 64 else next(iter(live))
                size = live.pop(ptr)
                cur -= size
                f.write("f %x 1 1 0 5 %x %x\n" % (t, ptr, size))
            else:
                size = 1 << rnd.randint(8, 22)
                if cur + size > mapped:
                    f.write("m %x 1 2 0 %x 4000000 1 0 0 1000\n" % (t, 0x7e0000000000 + mapped))
                    mapped += 64 << 20
                ptr = next_ptr
                next_ptr += size
                live[ptr] = size
                cur += size
                peak = max(peak, cur)
                f.write("a %x 1 1 0 5 %x %x %x\n" % (t, ptr, size, size))
        f.write("e %x\n" % (t + 1))
    return peak, len(live)


def test_synthetic(tmp):
    path = os.path.join(tmp, "synth.trace")
    peak, leaks = synth(path, 100000)
    t0 = time.time()
    r = report(path)
    dt = time.time() - t0
    m = re.search(r"peak live: .*\((\d+) B\)", r.stdout)
    ml = re.search(r"leaks \(never freed\): (\d+) allocations", r.stdout)
    check(r.returncode == 0 and m and int(m.group(1)) == peak and ml and int(ml.group(1)) == leaks,
          "100k synthetic events: peak and leaks match the generator")
    check(dt < 30, "100k events read in %.2f s" % dt)


def test_not_device_memory(tmp):
    """A second mapping of a device handle (flag 40: a mapped sleep's copy source) and host memory
    mapped at a device address (flag 80) are not device memory: the peak mapped counts neither."""
    path = os.path.join(tmp, "alias.trace")
    with open(path, "w") as f:
        f.write("v 1 vmmshim 0.1.0\nx /synthetic\nc synthetic\np 1 0 0\ns 0 0\n")
        f.write("m 10 1 2 0 7e0000000000 4000000 1 0 0 1000\n")   # the device handle, 64 MiB
        f.write("m 20 1 2 0 7f0000000000 4000000 1 40 0 1000\n")  # its alias
        f.write("m 30 1 2 0 7e0004000000 4000000 2 80 0 1000\n")  # host memory at a device address
        f.write("m 40 1 4 0 7f0000000000 4000000 0 40 0 1000\n")
        f.write("m 50 1 4 0 7e0004000000 4000000 0 80 0 1000\n")
    r = report(path)
    m = re.search(r"peak mapped: .*\((\d+) B\)", r.stdout)
    check(r.returncode == 0 and m and int(m.group(1)) == 64 << 20,
          "alias and host mappings not counted as device memory (peak mapped %s)" % (m and m.group(1)))


def test_stitches(tmp):
    """Version 4: a stitch (h record) is counted with what it saved, and held / live is shown for
    each tenth of the run; a malformed h record is counted as malformed, not read."""
    path = os.path.join(tmp, "stitch.trace")
    with open(path, "w") as f:
        f.write("v 4 vmmshim 0.1.0\nx /synthetic\nc synthetic\np 1 0 0\ns 0 0\n")
        f.write("m 10 1 2 0 7e0000000000 4000000 1 0 0 1000\n")   # 64 MiB
        f.write("a 20 1 0 0 - 7e0000000000 4000000 4000000 0\n")
        f.write("f 30 1 0 0 - 7e0000000000 4000000\n")
        f.write("m 40 1 4 0 7e0000000000 4000000 0 0 0 1000\n")   # the idle handle leaves its place
        f.write("m 50 1 2 0 7f0000000000 4000000 1 0 0 1000\n")   # ... for the new range
        f.write("m 60 1 2 0 7f0004000000 2000000 2 0 0 1000\n")   # and a new 32 MiB handle
        f.write("h 70 1 0 0 7f0000000000 6000000 2 2000000 5000\n")
        f.write("a 80 1 0 0 - 7f0000000000 6000000 6000000 0\n")
        f.write("h 90 1 0 0 7f0000000000 6000000 2\n")             # malformed: cut short
        f.write("e 100\n")
    r = report(path)
    check(r.returncode == 0 and "stitches: 1 growths mapped idle handles again (2 handles in their ranges), "
          "64.00 MiB not created anew" in r.stdout, "the stitch and what it saved %r" % r.stdout[-600:])
    m = re.search(r"held / live over time \(the peak of each tenth of the run\): (.*)", r.stdout)
    check(m and m.group(1).split() == ["-", "1.000", "-", "-", "-", "1.000", "-", "-", "-", "-"],
          "held / live over the run: %s" % (m and m.group(1)))
    check("malformed" in r.stdout + r.stderr, "the cut h record is malformed")


def test_html_render(page, tmp):
    """Each chart of the page on its own (the page's only=SECTION parameter hides the rest),
    screenshotted by headless chromium: the timeline is drawn by the page's script."""
    b = browser()
    if not b:
        return
    text = open(page).read()
    for cid, size in (("chart-timeline", (1040, 420)), ("chart-sizes", (1040, 400)), ("chart-lifetimes", (1040, 400))):
        if 'id="%s"' % cid not in text:
            check(False, "html: %s present" % cid)
            continue
        png = os.path.join(tmp, cid + ".png")
        if not screenshot(b, "file://%s?only=%s-section" % (page, cid), png, size, tmp):
            check(False, "html: chromium screenshot of %s" % cid)
            continue
        n = colored_pixels(png)
        check(n > 2000, "html: %s rendered by chromium shows data (%d coloured pixels)" % (cid, n))


def main():
    with scratch("vmmshim-report-test-") as tmp:
        test_golden()
        test_gpu_sample()
        test_by_tag(tmp)
        test_sleep_slices(tmp)
        test_refusals(tmp)
        page = test_exports(tmp)
        test_synthetic(tmp)
        test_not_device_memory(tmp)
        test_stitches(tmp)
        test_html_render(page, tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
