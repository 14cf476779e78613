#!/usr/bin/env python3
"""Tests of vmmshim-report's call sites on version-2 traces that hold REAL return addresses.

A small C program (built here with cc -g -O0, as a PIE and as a non-PIE executable) calls
cudaMalloc in a stand-in libcudart.so.13 from three functions (one through an inlined
helper, one through a cuda-named function of the executable, as a static runtime has). The
stand-in calls back into the program, which prints the stack the way the shim captures it
(glibc's backtrace, its own frame dropped) and the loaded modules (dl_iterate_phdr: range
and load bias). The test writes a trace with those `l` records (build-ids from readelf -n),
`k` stacks, `n` strings for Python frames and allocations, and checks: the sites name the
functions at the lines marked in the source (and file:line of Python frames), exact
counts, bytes, live bytes at the peak and leaks per site, one stack shared by several
allocations, two stacks with one site, the (no stack) site and the allocations not
sampled, --site-skip, --site-depth, a build-id mismatch and a missing file (one warning,
module+offset), no symboliser, --sysroot, --debug-dir (a debug file found by build-id),
eu-addr2line when installed, one addr2line run per module, memory_viz frames,
Perfetto slices with site and stack, and the HTML page in headless chromium: the icicle
graph drawn and zoomed by a click, the timeline zoomed by a mouse drag (axis relabelled,
pool events in range) and restored by its reset button. Ends with "N passed, N failed"."""
import importlib.machinery
import importlib.util
import json
import os
import pickle
import re
import shutil
import subprocess
import sys

from harness import REPORT, ROOT, browser, check, colored_pixels, colour_mask, dump_dom, report, scratch, screenshot, summary

MiB = 1 << 20

LIB_SRC = r"""/* A stand-in for libcudart.so: its cudaMalloc calls the hook the program set, as the shim's
   hook runs inside the real call. */
#include <stddef.h>
void (*vm_hook)(void);
__attribute__((noinline)) int cudaMalloc(void **p, size_t n) {
  vm_hook(); /* LIB_CALL */
  *p = (void *)n;
  return 0;
}
"""

PROG_SRC = r"""#define _GNU_SOURCE
#include <execinfo.h>
#include <limits.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
extern void (*vm_hook)(void);
int cudaMalloc(void **p, size_t n);
static char tag;
static void hook(void) { /* plays the shim: prints the stack without its own frame */
  void *buf[32];
  int n = backtrace(buf, 32);
  printf("S %c", tag);
  for (int i = 1; i < n; i++) printf(" %lx", (unsigned long)buf[i]);
  printf("\n");
}
__attribute__((noinline)) int cudaStaticMalloc(void **p, size_t n) {
  return cudaMalloc(p, n); /* STATIC_RT */
}
__attribute__((noinline)) void alloc_a(void) {
  void *p;
  tag = 'A';
  cudaMalloc(&p, 1); /* SITE_A */
}
__attribute__((noinline)) void alloc_b(void) {
  void *p;
  tag = 'B';
  cudaStaticMalloc(&p, 2); /* SITE_B */
}
static inline __attribute__((always_inline)) void helper_c(void) {
  void *p;
  tag = 'C';
  cudaMalloc(&p, 3); /* SITE_C */
}
__attribute__((noinline)) void alloc_c(void) {
  helper_c(); /* INLINE_C */
}
static int module(struct dl_phdr_info *info, size_t size, void *data) {
  unsigned long lo = ~0ul, hi = 0;
  (void)size;
  (void)data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    unsigned long a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
    if (a < lo) lo = a;
    if (b > hi) hi = b;
  }
  char exe[PATH_MAX] = "";
  const char *name = info->dlpi_name;
  if (!name[0]) {
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) exe[k] = 0;
    name = exe;
  }
  if (lo < hi) printf("L %lx %lx %lx %s\n", lo, hi, (unsigned long)info->dlpi_addr, name);
  return 0;
}
int main(void) {
  vm_hook = hook;
  alloc_a(); /* MAIN_A */
  alloc_b(); /* MAIN_B */
  alloc_c(); /* MAIN_C */
  alloc_a(); /* MAIN_A2 */
  dl_iterate_phdr(module, NULL);
  return 0;
}
"""

PY_FILE = "/home/user/project/train.py"


def load_report():
    loader = importlib.machinery.SourceFileLoader("vmmshim_report", REPORT)
    spec = importlib.util.spec_from_loader("vmmshim_report", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def build_id(path):
    r = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    m = re.search(r"Build ID:\s*([0-9a-f]+)", r.stdout)
    return m.group(1) if m else None


def marker_lines(src):
    return {m.group(1): src[:m.start()].count("\n") + 1 for m in re.finditer(r"/\* ([A-Z_0-9]+) \*/", src)}


class Fixture:
    """The program built and run once: its stacks (by tag, in call order), modules and source lines."""

    def __init__(self, tmp, pie):
        self.dir = os.path.join(tmp, "pie" if pie else "nopie")
        os.makedirs(self.dir)
        self.src = os.path.join(self.dir, "prog.c")
        self.lib_src = os.path.join(self.dir, "fakecudart.c")
        with open(self.src, "w") as f:
            f.write(PROG_SRC)
        with open(self.lib_src, "w") as f:
            f.write(LIB_SRC)
        self.lines = marker_lines(PROG_SRC)
        self.lib_lines = marker_lines(LIB_SRC)
        self.lib = os.path.join(self.dir, "libcudart.so.13")
        self.exe = os.path.join(self.dir, "prog")
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-g", "-O0", "-fPIC", "-shared", "-Wl,--build-id", "-Wl,-soname,libcudart.so.13",
                        "-o", self.lib, self.lib_src], check=True)
        pie_flags = ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]
        subprocess.run([cc, "-g", "-O0"] + pie_flags + ["-Wl,--build-id", "-o", self.exe, self.src, "-L" + self.dir,
                        "-l:libcudart.so.13", "-Wl,-rpath," + self.dir], check=True)
        out = subprocess.run([self.exe], capture_output=True, text=True, check=True).stdout
        self.stacks = []  # (tag, [ip, ...])
        self.modules = []  # (lo, hi, bias, buildid or '-', path)
        for line in out.splitlines():
            f = line.split()
            if f[0] == "S":
                self.stacks.append((f[1], [int(x, 16) for x in f[2:]]))
            elif f[0] == "L":
                path = line.split(" ", 4)[4]
                if path.startswith("linux-vdso") or path.startswith("linux-gate"):
                    path, bid = "[vdso]", "-"
                else:
                    bid = build_id(path) or "-"
                self.modules.append((int(f[1], 16), int(f[2], 16), int(f[3], 16), bid, path))
        self.bias = next(m[2] for m in self.modules if m[4] == self.exe)

    def site(self, key, func):
        return "%s:%d %s" % (self.src, self.lines[key], func)


# The allocations of the trace: (ms, kind, stack key, name, requested, served) with kind a/f;
# stack keys: A1, B, C, A2 (the program's four stacks: A1 and A2 share a site), PY (A1's native
# frames under two Python frames), 0 (none). Pool events: (ms, op, size).
PLAN = [
    (1, "a", "A1", "p1", 8 * MiB - 100, 8 * MiB),
    (2, "a", "A1", "p2", 8 * MiB, 8 * MiB),
    (3, "a", "B", "p3", 16 * MiB, 16 * MiB),
    (4, "a", "C", "p4", 4 * MiB, 4 * MiB),
    (5, "a", "A2", "p5", 2 * MiB, 2 * MiB),
    (6, "a", "PY", "p6", 32 * MiB, 32 * MiB),
    (7, "a", "0", "p7", 512 << 10, 512 << 10),
    (8, "a", "0", "p8", 2 * MiB, 2 * MiB),
    (9, "f", None, "p1", 0, 0),
    (10, "f", None, "p3", 0, 0),
    (11, "f", None, "p6", 0, 0),
    (12, "a", "B", "p9", 1 * MiB, 1 * MiB),
    (13, "f", None, "p9", 0, 0),
    (14, "a", "C", "p10", 3 * MiB, 3 * MiB),
]
VMM = [(0.2, 0, 1 << 30, 0), (0.4, 1, 128 * MiB, 0), (0.5, 2, 128 * MiB, 0), (0.6, 3, 128 * MiB, 0),
       (8.4, 1, 64 * MiB, 0), (8.5, 2, 64 * MiB, 128 * MiB), (8.6, 3, 64 * MiB, 128 * MiB),
       (11.5, 4, 64 * MiB, 128 * MiB), (11.6, 5, 64 * MiB, 0)]  # (ms, op, size, offset of the address)
END_MS = 20
MIN_SIZE, SAMPLE = 1 * MiB, 16


def write_trace(path, fx, exe_buildid=None, exe_path=None):
    ids = {"A1": 1, "B": 2, "C": 3, "A2": 4, "PY": 5, "0": 0}
    by_tag = {}
    for tag, ips in fx.stacks:
        by_tag.setdefault(tag, []).append(ips)
    native = {"A1": by_tag["A"][0], "B": by_tag["B"][0], "C": by_tag["C"][0], "A2": by_tag["A"][1]}
    ptrs = {}
    base = 0x7f0000000000
    with open(path, "w") as f:
        f.write("v 2 vmmshim 0.2.0\nx %s\nc prog --train\np 4d2 1 0\ns 17a2b3c4d5e6f700 10000000\n" % fx.exe)
        f.write("t 40 %x %x\n" % (MIN_SIZE, SAMPLE))
        for i, (lo, hi, bias, bid, mpath) in enumerate(fx.modules):
            if mpath == fx.exe:
                bid = exe_buildid or bid
                mpath = exe_path or mpath
            f.write("l %x %x %x %x %s %s\n" % (i + 1, lo, hi, bias, bid, mpath))
        f.write("n 1 %s\nn 2 forward\nn 3 main\nn 4 <module>\n" % PY_FILE)
        for key in ("A1", "B", "C", "A2"):
            f.write("k %x %x 0 %s\n" % (ids[key], len(native[key]), " ".join("%x" % ip for ip in native[key])))
        f.write("k %x %x 3 %s 1 2 12 1 3 1e 1 4 2a\n" % (ids["PY"], len(native["A1"]),
                                                         " ".join("%x" % ip for ip in native["A1"])))
        events = [(v[0], "m", v) for v in VMM] + [(p[0], "p", p) for p in PLAN]
        for ms, kind, e in sorted(events, key=lambda x: x[0]):
            t = int(ms * 1e6)
            if kind == "m":
                _, op, size, off = e
                addr = 0 if op in (1, 5) else base + off
                f.write("m %x 4d2 %x 0 %x %x %x %x 0 %x\n" % (t, op, addr, size, 1 if op in (1, 2, 5) else 0,
                                                              3 if op == 3 else 0, 1000 + op))
            else:
                _, k, key, name, req, srv = e
                if k == "a":
                    ptrs[name] = base + len(ptrs) * 64 * MiB
                    f.write("a %x 4d2 0 0 - %x %x %x %x\n" % (t, ptrs[name], req, srv, ids[key]))
                else:
                    srv = next(p[5] for p in PLAN if p[3] == name and p[1] == "a")
                    f.write("f %x 4d2 0 0 - %x %x\n" % (t, ptrs[name], srv))
        f.write("e %x\n" % int(END_MS * 1e6))


def expected(fx, depth=1):
    """Per site: [count, requested, live at the peak (served), leaks, leaked requested], from PLAN."""
    site = {"A1": fx.site("SITE_A", "alloc_a"), "A2": fx.site("SITE_A", "alloc_a"),
            "B": fx.site("SITE_B", "alloc_b"), "C": fx.site("SITE_C", "helper_c"),
            "PY": "%s:18 forward" % PY_FILE, "0": "(no stack)"}
    if depth == 2:
        site.update({"A1": site["A1"] + " <- " + fx.site("MAIN_A", "main"),
                     "A2": site["A2"] + " <- " + fx.site("MAIN_A2", "main"),
                     "B": site["B"] + " <- " + fx.site("MAIN_B", "main"),
                     "C": site["C"] + " <- " + fx.site("INLINE_C", "alloc_c"),
                     "PY": site["PY"] + " <- %s:30 main" % PY_FILE})
    live, peak, at_peak = {}, 0, None
    out = {}
    for ms, k, key, name, req, srv in PLAN:
        if k == "a":
            live[name] = (key, req, srv)
            s = out.setdefault(site[key], [0, 0, 0, 0, 0])
            s[0] += 1
            s[1] += req
            total = sum(v[2] for v in live.values())
            if total > peak:
                peak, at_peak = total, dict(live)
        else:
            del live[name]
    for key, req, srv in at_peak.values():
        out[site[key]][2] += srv
    for key, req, srv in live.values():
        out[site[key]][3] += 1
        out[site[key]][4] += req
    return out, peak


ROW2 = re.compile(r"^\s+(\d+)\s+(\d+)  (.+)$")
ROWP = re.compile(r"^\s+(\d+)\s+([\d.]+) %  (.+)$")


def parse_sites(text):
    """{table: {site: (n1, n2)}} from the --by-site section."""
    tables = {}
    cur = None
    for line in text.splitlines():
        for key, head in (("peak", "by live bytes at the peak"), ("bytes", "by bytes allocated"),
                          ("count", "by allocations"), ("leaks", "leaks by site")):
            if line.startswith(head):
                cur = tables.setdefault(key, {})
                break
        else:
            if cur is None or not line.strip():
                continue
            m = (ROWP if cur is tables.get("peak") else ROW2).match(line)
            if m:
                cur[m.group(3)] = (int(m.group(1)), float(m.group(2)) if "." in m.group(2) else int(m.group(2)))
    return tables


def check_tables(label, got, want, peak):
    ok_peak = {s: v[0] for s, v in got.get("peak", {}).items()} == {s: v[2] for s, v in want.items() if v[2]}
    check(ok_peak, "%s: live bytes at the peak by site %s" % (label, "" if ok_peak else got.get("peak")))
    check(sum(v[0] for v in got.get("peak", {}).values()) == peak,
          "%s: live bytes at the peak add up to the peak (%d B)" % (label, peak))
    ok = {s: v for s, v in got.get("bytes", {}).items()} == {s: (v[1], v[0]) for s, v in want.items()}
    check(ok, "%s: bytes allocated (requested) and counts by site" % label)
    ok = {s: v for s, v in got.get("count", {}).items()} == {s: (v[0], v[1]) for s, v in want.items()}
    check(ok, "%s: allocations by site" % label)
    ok = {s: v for s, v in got.get("leaks", {}).items()} == {s: (v[3], v[4]) for s, v in want.items() if v[3]}
    check(ok, "%s: leaks by site" % label)
    if not ok:
        print(got.get("leaks"), want)


def order_of(table_text, head):
    """Site names of one table, in the printed order."""
    out, on = [], False
    for line in table_text.splitlines():
        if line.startswith(head):
            on = True
            continue
        if on:
            if not line.strip():
                break
            m = ROWP.match(line) or ROW2.match(line)
            if m:
                out.append(m.group(3))
    return out


def test_fixture(fx, tmp, label):
    trace = os.path.join(tmp, label + ".trace")
    write_trace(trace, fx)
    r = report(trace, "--by-site", "--top", "10")
    check(r.returncode == 0 and r.stderr == "", "%s: report runs without warnings %s" % (label, r.stderr.strip()))
    want, peak = expected(fx)
    got = parse_sites(r.stdout)
    if set(got.get("bytes", {})) != set(want):
        print(r.stdout)
    check(set(got.get("bytes", {})) == set(want),
          "%s: sites are the functions at the marked lines, the Python frame, (no stack): %s"
          % (label, sorted(got.get("bytes", {}))))
    check_tables(label, got, want, peak)
    order = order_of(r.stdout, "by live bytes at the peak")
    check(order[:2] == ["%s:18 forward" % PY_FILE, fx.site("SITE_A", "alloc_a")],
          "%s: the peak table is sorted by live bytes" % label)
    check("5 distinct stacks in 8 of 10 allocations, 5 sites" in r.stdout,
          "%s: 5 stacks (one of them shared by 2 allocations, two with one site) in 8 allocations" % label)
    check("(no stack): 2 allocations, 1 of them smaller than 1048576 B and not sampled" in r.stdout,
          "%s: (no stack) and the allocations not sampled" % label)
    check("stacks captured: up to 64 frames; every allocation of 1048576 B or more, 1 in 16 smaller ones"
          in r.stdout, "%s: the capture settings of the t record" % label)
    # --top bounds the rows
    r2 = report(trace, "--by-site", "--top", "2")
    check(len(order_of(r2.stdout, "by allocations")) == 2 and "... 3 more sites" in r2.stdout,
          "%s: --top 2 prints two rows a table" % label)
    # --site-depth 2
    r3 = report(trace, "--by-site", "--top", "10", "--site-depth", "2")
    want2, _ = expected(fx, depth=2)
    got2 = parse_sites(r3.stdout)
    check(got2.get("count") == {s: (v[0], v[1]) for s, v in want2.items()},
          "%s: --site-depth 2: site and caller (the inlined helper's caller too) %s" % (label, sorted(got2.get("count", {}))))
    # --site-skip: alloc_a's frame skipped, its two stacks split by the line in main
    r4 = report(trace, "--by-site", "--top", "10", "--site-skip", r"\balloc_a$")
    got4 = parse_sites(r4.stdout).get("count", {})
    ok = got4.get(fx.site("MAIN_A", "main")) == (2, 16 * MiB - 100) and got4.get(fx.site("MAIN_A2", "main")) == (1, 2 * MiB)
    check(ok and fx.site("SITE_A", "alloc_a") not in got4, "%s: --site-skip moves alloc_a's allocations to main's lines"
          % label)
    return trace


def test_symbolisation(fx, trace, tmp):
    rep = load_report()
    tr = rep.Trace(trace)
    a = rep.Analysis(tr)
    sym = rep.Symboliser()
    stacks = a.symbolise(sym)
    used = {m.path for m in tr.modules.values() if any(
        m.lo <= ip < m.hi for _, native, _ in tr.stacks.values() for ip in native) and os.path.isfile(m.path)}
    check(sym.runs == len(used) and len(used) >= 3,
          "one addr2line run per module with addresses (%d runs, %d modules)" % (sym.runs, len(used)))
    nat, py = stacks.frames(3)  # C: helper_c inlined into alloc_c
    texts = [f.text for f in nat]
    i = texts.index(fx.site("SITE_C", "helper_c")) if fx.site("SITE_C", "helper_c") in texts else -1
    check(i >= 0 and texts[i + 1] == fx.site("INLINE_C", "alloc_c") and texts[i + 2] == fx.site("MAIN_C", "main"),
          "an inlined frame and its caller, then main: %s" % texts)
    check(nat[0].lib and nat[0].text == "%s:%d cudaMalloc" % (fx.lib_src, fx.lib_lines["LIB_CALL"]),
          "the stand-in libcudart's frame is symbolised and marked as a CUDA library frame")
    nat_b, _ = stacks.frames(2)
    check(any(f.func == "cudaStaticMalloc" and f.lib for f in nat_b),
          "a cuda-named function of the executable counts as CUDA's (static runtime)")
    full = [f.text for f in stacks.full(5)]
    check(full[-3:] == ["%s:18 forward" % PY_FILE, "%s:30 main" % PY_FILE, "%s:42 <module>" % PY_FILE]
          and full[0] == texts[0], "full stack: native frames, then the Python frames innermost first")


def test_fallbacks(fx, tmp):
    a1 = next(ips for tag, ips in fx.stacks if tag == "A")
    off = a1[1] - fx.bias  # alloc_a's return address, relative to the executable
    fallback = "%s+0x%x" % (os.path.basename(fx.exe), off)
    # A build-id that is not the file's: one warning, the executable's frames as module+offset.
    bad = os.path.join(tmp, "mismatch.trace")
    write_trace(bad, fx, exe_buildid="0123456789abcdef0123456789abcdef01234567")
    r = report(bad, "--by-site", "--top", "10")
    warns = [l for l in r.stderr.splitlines() if "warning" in l]
    check(r.returncode == 0 and len(warns) == 1 and "build-id" in warns[0] and fx.exe in warns[0],
          "build-id mismatch: one warning naming the file: %s" % warns)
    sites = parse_sites(r.stdout).get("count", {})
    check(sites.get(fallback) == (3, 18 * MiB - 100),
          "build-id mismatch: frames fall back to module+offset (%s)" % fallback)
    check(any(s.startswith(PY_FILE) for s in sites), "build-id mismatch: Python frames still name the site")
    # A module file that is not there.
    gone = os.path.join(tmp, "missing.trace")
    write_trace(gone, fx, exe_path=os.path.join(tmp, "no-such-dir", "prog"))
    r = report(gone, "--by-site", "--top", "10")
    warns = [l for l in r.stderr.splitlines() if "warning" in l]
    check(len(warns) == 1 and "not found" in warns[0], "missing module file: one warning: %s" % warns)
    check(parse_sites(r.stdout).get("count", {}).get(fallback) == (3, 18 * MiB - 100),
          "missing module file: module+offset")
    # No symboliser at all.
    trace = os.path.join(tmp, "nosym.trace")
    write_trace(trace, fx)
    r = report(trace, "--by-site", "--top", "10", "--addr2line", os.path.join(tmp, "no-addr2line"))
    warns = [l for l in r.stderr.splitlines() if "warning" in l]
    check(len(warns) == 1 and "no addr2line" in warns[0] and fallback in r.stdout,
          "no symboliser: one warning, module+offset: %s" % warns)
    # The module file elsewhere: under --sysroot, or only its debug file under --debug-dir (by build-id).
    moved = os.path.join(tmp, "sysroot.trace")
    write_trace(moved, fx, exe_path="/" + os.path.relpath(fx.exe, tmp))
    r = report(moved, "--by-site", "--top", "10", "--sysroot", tmp)
    want, _ = expected(fx)
    sites = parse_sites(r.stdout).get("count", {})
    check(r.stderr == "" and sites == {s: (v[0], v[1]) for s, v in want.items()},
          "--sysroot: the module is read under the given root %s" % r.stderr.strip())
    bid = next(m[3] for m in fx.modules if m[4] == fx.exe)
    dbg = os.path.join(tmp, "debug", ".build-id", bid[:2], bid[2:] + ".debug")
    os.makedirs(os.path.dirname(dbg))
    subprocess.run(["objcopy", "--only-keep-debug", fx.exe, dbg], check=True)
    r = report(gone, "--by-site", "--top", "10", "--debug-dir", os.path.join(tmp, "debug"))
    sites = parse_sites(r.stdout).get("count", {})
    check(r.stderr == "" and sites == {s: (v[0], v[1]) for s, v in want.items()},
          "--debug-dir: a missing module is symbolised from its debug file found by build-id %s" % r.stderr.strip())
    # elfutils' eu-addr2line, when installed, gives the same sites.
    if shutil.which("eu-addr2line"):
        r = report(trace, "--by-site", "--top", "10", "--addr2line", "eu-addr2line")
        want, _ = expected(fx)
        got = parse_sites(r.stdout).get("count", {})
        check(got == {s: (v[0], v[1]) for s, v in want.items()}, "eu-addr2line gives the same sites: %s" % sorted(got))
    else:
        print("SKIP eu-addr2line: not installed (elfutils); not counted")


def test_python_libs(tmp):
    """A Python frame of an installed package or of the standard library names the site only when
    the stack has no frame of the program's own files (PyTorch's linear.py under train.py)."""
    lib = "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py"
    std = "/usr/lib/python3.12/threading.py"
    path = os.path.join(tmp, "pylibs.trace")
    with open(path, "w") as f:
        f.write("v 2 vmmshim 0.2.0\nx /usr/bin/python3\nc python3 train.py\np 4d2 1 0\ns 17a2b3c4d5e6f700 10000000\n")
        f.write("t 10 0 1\n")
        f.write("n 1 %s\nn 2 Linear.forward\nn 3 %s\nn 4 forward\nn 5 %s\nn 6 Thread.run\n" % (lib, PY_FILE, std))
        f.write("k 1 0 2 1 2 86 3 4 12\n")  # linear.py:134 inside train.py:18
        f.write("k 2 0 2 1 2 86 5 6 3fd\n")  # linear.py:134 inside threading.py:1021 only
        for i, (sid, size) in enumerate([(1, 1 << 20), (1, 1 << 20), (2, 4 << 20)]):
            f.write("a %x 4d2 0 0 - %x %x %x %x\n" % ((i + 1) * 1000000, 0x7f0000000000 + i * (64 << 20), size, size, sid))
        f.write("e %x\n" % 10000000)
    sites = parse_sites(report(path, "--by-site").stdout).get("count", {})
    check(sites == {"%s:18 forward" % PY_FILE: (2, 2 << 20), "%s:134 Linear.forward" % lib: (1, 4 << 20)},
          "Python frames of packages and the standard library name a site only without the program's own: %s" % sites)
    sites = parse_sites(report(path, "--by-site", "--site-libs").stdout).get("count", {})
    check(sites == {"%s:134 Linear.forward" % lib: (3, 6 << 20)}, "--site-libs: the innermost Python frame: %s" % sites)


def test_v1_and_notes(tmp):
    r = report(os.path.join("tests", "data", "small.trace"), "--by-site")
    check("call sites: no stacks in this trace (run with VMMSHIM_TRACE_STACKS=N)" in r.stdout,
          "a version-1 trace: --by-site says there are no stacks")
    v2 = os.path.join(tmp, "nostacks.trace")
    with open(v2, "w") as f:
        f.write("v 2 vmmshim 0.2.0\np 1 0 0\ns 0 0\na 10 1 0 0 - 1000 100 100 0\nf 20 1 0 0 - 1000 100\ne 30\n")
    r = report(v2)
    check(r.returncode == 0 and "call sites: no stacks in this trace" in r.stdout and "1 allocations" in r.stdout,
          "a version-2 trace without stacks reads, and says so")
    bad = os.path.join(tmp, "badk.trace")
    with open(bad, "w") as f:
        f.write("v 2 vmmshim 0.2.0\nk 1 2 0 1000\nk 2 1 0 1000\na 10 1 0 0 - 1000 100 100 1\ne 30\n")
    r = report(bad, "--by-site")
    check(r.returncode == 0 and "malformed line skipped" in r.stderr and "(unknown stack 1)" in r.stdout,
          "a k record with a wrong frame count is skipped; its allocations go to (unknown stack)")


def test_exports(fx, trace, tmp):
    pk, pf = os.path.join(tmp, "s.pickle"), os.path.join(tmp, "s.json")
    r = report(trace, "--memory-viz", pk, "--perfetto", pf, "--perfetto-allocs", "3")
    check(r.returncode == 0, "exports written")
    snap = pickle.load(open(pk, "rb"))
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    p2 = 0x7f0000000000 + 1 * 64 * MiB  # the second allocation (stack A1), never freed
    fr = blocks.get(p2, {}).get("frames", [])
    check(len(fr) >= 3 and fr[0]["name"] == "cudaMalloc" and fr[1] == {
        "filename": fx.src, "line": fx.lines["SITE_A"], "name": "alloc_a"},
        "memory_viz: a live block's frames are its symbolised stack: %s" % fr[:2])
    ev = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == 32 * MiB]
    fr = ev[0]["frames"] if ev else []
    check(len(fr) > 3 and fr[0] == {"filename": PY_FILE, "line": 18, "name": "forward"} and
          fr[2]["name"] == "<module>" and fr[3]["name"] == "cudaMalloc",
          "memory_viz: Python frames first, then native frames")
    nos = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == 512 << 10]
    check(nos and nos[0]["frames"] == [], "memory_viz: an allocation without a stack has no frames")
    pj = json.load(open(pf))
    sl = [e for e in pj["traceEvents"] if e.get("ph") == "b"]
    ends = [e for e in pj["traceEvents"] if e.get("ph") == "e"]
    want = {32 * MiB: "%s:18 forward" % PY_FILE, 16 * MiB: fx.site("SITE_B", "alloc_b"),
            8 * MiB: fx.site("SITE_A", "alloc_a")}
    got = {e["args"]["requested"]: e["args"]["site"] for e in sl}
    check(len(sl) == 3 and len(ends) == 3 and got == want,
          "perfetto: the 3 largest allocations as slices named by site: %s" % got)
    py = [e for e in sl if e["args"]["requested"] == 32 * MiB]
    check(py and py[0]["args"]["stack"][-3] == "%s:18 forward" % PY_FILE and
          any("alloc_a" in s for s in py[0]["args"]["stack"]), "perfetto: the stack is in the args")
    leaked = [e for e in sl if e["args"].get("leaked")]
    check(len(leaked) == 1 and leaked[0]["args"]["requested"] == 8 * MiB, "perfetto: a leaked allocation is marked")


def test_html(fx, trace, tmp):
    page = os.path.join(tmp, "sites.html")
    r = report(trace, "--html", page)
    text = open(page).read() if os.path.exists(page) else ""
    check(r.returncode == 0 and "chart-flame" in text and "sites-peak" in text and "https://" not in text
          and "http://" not in text.replace("http://www.w3.org/2000/svg", ""),
          "html: icicle graph and site tables, no external resources")
    m = re.search(r'<script type="application/json" id="vmmshim-data">(.*?)</script>', text, re.S)
    data = json.loads(m.group(1).replace("<\\/", "</")) if m else {}
    fl = data.get("flame") or {}
    names = fl.get("names", [])
    _, peak = expected(fx)
    check(fl.get("total") == peak and fl["nodes"][0][1] == peak, "html: the icicle graph's root is the peak")
    b = browser()
    if not b:
        return
    url = "file://" + page
    png = os.path.join(tmp, "flame.png")
    ok = screenshot(b, url + "?only=chart-flame-section", png, (1040, 600), tmp)
    n = colored_pixels(png) if ok else 0
    check(n > 20000, "html: chromium draws the icicle graph (%d coloured pixels)" % n)
    full = dump_dom(b, url, tmp)
    check(full.count('class="fg"') >= 10 and "alloc_a" in full, "html: icicle graph frames in the page's DOM")
    titles = re.findall(r'class="vmm"[^>]*><title>([^<]*)</title>', full)
    check(len(titles) == len(VMM) and any(t.startswith("map 64.00 MiB at 0x7f") for t in titles),
          "html: every pool event has a marker with a hover title")
    # One page load: a drag over 40-60 % of the timeline's plot, and a click on the frame 'forward'.
    # The window is 1040 px wide so that the timeline is drawn 1000 px wide, one pixel per unit of
    # its viewBox: the drag's mouse events (whole pixels) land on 40 and 60 % exactly.
    k = next((i for i, nd in enumerate(fl.get("nodes", [])) if names[nd[3]].endswith(" forward")), -1)
    dom = dump_dom(b, url + "?drag=0.4,0.6&click=fg-%d" % k, tmp, size=(1040, 800))
    m = re.search(r'<g id="fg-%d" class="fg"><title>[^<]*</title><rect x="([\d.]+)" y="\d+" width="([\d.]+)"' % k, dom)
    check('data-zoom="%d"' % k in dom and m and float(m.group(1)) == 0 and float(m.group(2)) > 999,
          "html: a click on a frame zooms the icicle graph to it")
    t0 = re.search(r'data-t0="(\d+)"', dom)
    t1 = re.search(r'data-t1="(\d+)"', dom)
    tmax = END_MS * 1e6
    ok = t0 and t1 and abs(int(t0.group(1)) - 0.4 * tmax) < tmax * 0.01 and abs(int(t1.group(1)) - 0.6 * tmax) < tmax * 0.01
    check(ok, "html: the drag selects 40-60 %% of the time range (%s, %s)" % (t0 and t0.group(1), t1 and t1.group(1)))
    labels = re.findall(r'class="xlabel"[^>]*>([^<]*)<', dom)
    check(labels[:1] == ["8 ms"] and labels[-1:] == ["12 ms"], "html: the x axis is relabelled: %s" % labels)
    inrange = sum(1 for v in VMM if 8 <= v[0] <= 12)
    shown = re.search(r'data-vmm-shown="(\d+)"', dom)
    check(shown and int(shown.group(1)) == inrange and dom.count('class="vmm"') == inrange,
          "html: the pool events in the zoomed range are marked (%d)" % inrange)
    # Pixels: the timeline full, zoomed by the drag, then reset by its button.
    shots = {}
    for key, q in (("full", ""), ("zoom", "&drag=0.4,0.6"), ("reset", "&drag=0.4,0.6&reset=1")):
        png = os.path.join(tmp, "timeline-%s.png" % key)
        shots[key] = colour_mask(png) if screenshot(b, url + "?only=chart-timeline-section" + q, png, (1040, 420),
                                                   tmp) else None
    check(shots["full"] and len(shots["full"]) > 2000, "html: the timeline is drawn")
    check(shots["full"] and shots["zoom"] and shots["full"] != shots["zoom"], "html: a drag zooms the timeline")
    check(shots["full"] and shots["full"] == shots["reset"], "html: the reset button restores the full timeline")


def main():
    with scratch("vmmshim-sites-test-") as tmp:
        if not (shutil.which(os.environ.get("CC", "cc")) and shutil.which("addr2line") and shutil.which("readelf")):
            check(False, "cc, addr2line and readelf (binutils) are needed")
            return summary()
        traces = {}
        for pie in (True, False):
            label = "pie" if pie else "no-pie"
            fx = Fixture(tmp, pie)
            check(len(fx.stacks) == 4 and fx.modules, "%s: the program ran and printed its stacks and modules" % label)
            traces[label] = (fx, test_fixture(fx, tmp, label))
        fx, trace = traces["pie"]
        check(fx.bias != 0 and traces["no-pie"][0].bias == 0, "the PIE has a load bias, the other none")
        test_symbolisation(fx, trace, tmp)
        test_fallbacks(fx, tmp)
        test_v1_and_notes(tmp)
        test_python_libs(tmp)
        test_exports(fx, trace, tmp)
        test_html(fx, trace, tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
