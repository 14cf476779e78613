#!/usr/bin/env python3
"""Collects the "R <section> key=value ..." lines that the benchmark programs printed into the
logs of one bench/run.sh run and writes the results file (Markdown), growth.csv and growth.svg.

    python3 bench/report.py --logs DIR --out bench/results/NAME.md

DIR holds the raw logs and machine.txt (key=value lines written by run.sh). The Markdown file is
also printed to stdout. A figure that is missing shows as FAILED (its step failed or timed out:
see the step's log); one the program skipped on purpose shows as skipped."""
import argparse
import csv
import glob
import json
import math
import os
import re
import statistics

GiB = float(1 << 30)
MiB = float(1 << 20)

PAIR_CFGS = [("cudaMalloc", "cudaMalloc/cudaFree"), ("pool", "cudaMallocAsync pool"),
             ("shim-sync", "shim sync"), ("shim-deferred", "shim deferred"), ("shim-async", "shim async"),
             ("shim-drv-deferred", "shim deferred, driver API"), ("shim-drv-async", "shim async, driver API")]
GRAN = ["2M", "64M", "512M", "2G"]


def parse_logs(logdir):
    recs = []
    for path in sorted(glob.glob(os.path.join(logdir, "*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"^R (\S+)(.*)$", line.rstrip("\n"))
                if not m:
                    continue
                d = {"_section": m.group(1), "_file": os.path.basename(path)}
                for kv in m.group(2).split():
                    if "=" in kv:
                        k, v = kv.split("=", 1)
                        d[k] = v
                recs.append(d)
    return recs


def median_or_none(values):
    """The median of the values that are not None; None when there is none."""
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def num(d, k):
    try:
        return float(d[k])
    except (KeyError, TypeError, ValueError):
        return None


def fsize(b):
    if b is None:
        return "FAILED"
    if b >= GiB:
        return "%.2f GiB" % (b / GiB)
    if b >= MiB:
        return "%.1f MiB" % (b / MiB)
    if b >= 1024:
        return "%.0f KiB" % (b / 1024)
    return "%d B" % b


def fnum(x, fmt="%.2f"):
    return "FAILED" if x is None else fmt % x


def ratio(a, b, fmt="%.2fx"):
    if a is None or b is None or b == 0:
        return "-"
    return fmt % (a / b)


def find(recs, section, **kw):
    out = []
    for r in recs:
        if r["_section"] != section:
            continue
        if all(r.get(k) == str(v) for k, v in kw.items()):
            out.append(r)
    return out


def one(recs, section, **kw):
    r = find(recs, section, **kw)
    return r[-1] if r else None


def size_label(b):
    b = int(b)
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return "%d %s" % (b // n, unit)
    return "%d B" % b


# ------------------------------------------------------------------ what the sections measure
# Each figure is computed once, here: the section's table (sec_*) and the JSON companion's
# figures (figs_*) both read it, so that the two cannot disagree.

def trace_sizes(recs):
    """The request sizes of the trace-cost runs."""
    return sorted({int(r["size"]) for r in find(recs, "pairs") if r.get("cfg", "").startswith("trace-")
                   and "size" in r})


def trace_rounds(recs, mode, size):
    """The trace-cost rounds of one free mode and size that ran both ways: (untraced medians (us),
    traced medians (us), each round's difference (ns), each round's difference of one over the
    pairs per second (ns))."""
    base, on, diff, mdiff = [], [], [], []
    for rnd in range(1, 10):
        a = one(recs, "pairs", cfg="trbase-%s-%d" % (mode, rnd), size=size, threads=1)
        b = one(recs, "pairs", cfg="trace-%s-%d" % (mode, rnd), size=size, threads=1)
        if a is None or b is None or a.get("skipped") or b.get("skipped"):
            continue
        base.append(num(a, "median_us"))
        on.append(num(b, "median_us"))
        diff.append((num(b, "median_us") - num(a, "median_us")) * 1000.0)
        mdiff.append((1e9 / num(b, "pairs_per_s") - 1e9 / num(a, "pairs_per_s")))
    return base, on, diff, mdiff


STACK_CFGS = ("stk-off", "stk-libunwind", "stk-dwarf", "stk-fp")


def stack_runs(recs):
    """{unwinder cfg: its traced 4 KiB pair run, or None}."""
    return {c: one(recs, "pairs", cfg=c, size=4096, threads=1) for c in STACK_CFGS}


RULE_CFGS = (("rules-none", "no rules"), ("rules-size-phase", "size and phase rules (no stack)"),
             ("rules-lib", "a lib: rule (once per call site)"), ("rules-site", "a site: rule (once per call site)"))
RULE_PY_CFGS = (("rules-py-none", "no rules"), ("rules-py-miss", "a py: rule that matches nothing"),
                ("rules-py", "a py: rule that matches"))


def rules_rows(recs):
    """The rows of the tag rules' cost (VMMSHIM_TAG_RULES): [(label, median us, + ns vs. its base)]
    for the C pairs and the Python ones, each against its row without rules; [] when not run."""
    rows = []
    for cfgs in (RULE_CFGS, RULE_PY_CFGS):
        base = one(recs, "pairs", cfg=cfgs[0][0], size=4096, threads=1)
        if not base:
            continue
        b = num(base, "median_us")
        for c, label in cfgs:
            r = one(recs, "pairs", cfg=c, size=4096, threads=1)
            if r:
                rows.append((("C, 20 calls deep: " if cfgs is RULE_CFGS else "Python (ctypes): ") + label,
                             num(r, "median_us"), None if c == cfgs[0][0] else (num(r, "median_us") - b) * 1000.0))
    return rows


def held_bytes(r, cfg):
    """Bytes held at the peak: the pool's reserved high mark, the shim's peak mapped; None for an
    allocator that reports neither."""
    if cfg == "pool":
        return num(r, "pool_reserved_high")
    return num(r, "shim_peak_mapped") if cfg.startswith("shim") else None


def held_live(r, cfg):
    live = num(r, "peak_live")
    h = held_bytes(r, cfg)
    return h / live if h and live else None


def vmm_per_100(r):
    """The shim's VMM calls after the warm-up of a churn or varlen run, and per 100 of the
    allocations made after it (None without a count of those)."""
    calls, allocs = num(r, "shim_vmm_steady"), num(r, "allocs_steady")
    return calls, (100.0 * calls / allocs if calls is not None and allocs else None)


def spread_seeds(by_seed, pool, work):
    """One allocator's runs over the seeds: (held / live, time / the pool's at the same seed, VMM
    calls per 100 allocations, each a list over the seeds that did not fail; wrong buffers in all;
    seeds that failed). The trace's replay reports its time and all its calls; churn and varlen,
    after the warm-up."""
    tk = "time_ms" if work == "replay" else "us_per_step"
    calls_key = "shim_vmm_calls" if work == "replay" else "shim_vmm_steady"
    allocs_key = "allocs" if work == "replay" else "allocs_steady"
    hl, speed, calls, bad, failed = [], [], [], 0, 0
    for seed, r in sorted(by_seed.items()):
        if r.get("failed"):
            failed += 1
            continue
        cfg = r["cfg"][len("spread-"):]
        hl.append(held_live(r, cfg))
        pr = pool.get(seed)
        t, pt = num(r, tk), num(pr, tk) if pr and not pr.get("failed") else None
        speed.append(t / pt if t and pt else None)
        n, a = num(r, calls_key), num(r, allocs_key)
        calls.append(100.0 * n / a if n is not None and a else None)
        bad += int(num(r, "bad") or 0)
    return hl, speed, calls, bad, failed


def step_rounds(recs, cfg):
    """The rounds of one training-step configuration that have a step time."""
    return [r for r in find(recs, "step", cfg=cfg) if num(r, "median_ms") is not None]


def overhead_runs(recs, cfg):
    """(kernel times (ms), whole-process times (ms)) of the overhead runs of cfg, None for a run
    without the figure."""
    return ([num(r, "kernel_ms") for r in find(recs, "overhead", cfg=cfg)],
            [num(r, "ms") for r in find(recs, "overhead_wall", cfg=cfg)])


def group_runs(recs, cfg, members, key):
    """key of every process of the group runs of cfg with that many members."""
    return [num(r, key) for r in find(recs, "group", cfg=cfg, members=members)]


def spill_runs(recs):
    """The spill run of the group benchmark: ({kernel: its record}, the promote's record)."""
    kernels, promote = {}, None
    for r in find(recs, "group", cfg="spill"):
        if r.get("kernel") in ("device", "host", "promoted"):
            kernels[r["kernel"]] = r
        if r.get("promote_ms") is not None:
            promote = r
    return kernels, promote


# ------------------------------------------------------------------ sections
def sec_pairs(recs, out):
    sizes = sorted({int(r["size"]) for r in find(recs, "pairs") if "size" in r})
    out.append("## 1. Allocation + free pair latency\n")
    out.append("Each pair timed with clock_gettime after warm-up. cudaMalloc and the pool run without the shim; "
               "\"shim async\" is cudaMallocAsync/cudaFreeAsync under the shim. Ratios compare medians.\n")
    out.append("### One thread: median / p99 (us)\n")
    hdr = "| size | " + " | ".join(n for _, n in PAIR_CFGS) + " | shim sync / cudaMalloc | shim deferred / cudaMalloc | shim async / pool |"
    out.append(hdr)
    out.append("|" + " --- |" * (len(PAIR_CFGS) + 4))
    for s in sizes:
        row, med = [], {}
        for c, _ in PAIR_CFGS:
            r = one(recs, "pairs", cfg=c, size=s, threads=1)
            if r is None:
                row.append("FAILED")
            elif r.get("skipped"):
                row.append("skipped")
            else:
                med[c] = num(r, "median_us")
                row.append("%.2f / %.2f" % (num(r, "median_us"), num(r, "p99_us")))
        out.append("| %s | %s | %s | %s | %s |" % (
            size_label(s), " | ".join(row), ratio(med.get("shim-sync"), med.get("cudaMalloc")),
            ratio(med.get("shim-deferred"), med.get("cudaMalloc")), ratio(med.get("shim-async"), med.get("pool"))))
    if any(one(recs, "pairs", cfg="trace-%s-1" % m, size=s, threads=1) for m in ("deferred", "async") for s in sizes):
        out.append("\n### Cost of tracing (VMMSHIM_TRACE on), one thread: median pair (us) without and with a trace "
                   "file, and the differences (ns)\n")
        out.append("Seven rounds alternate an untraced and a traced process. \"+ ns\" is the median over the rounds of "
                   "each round's difference of median pairs; \"best\" is the best traced round's median minus the best "
                   "untraced round's (the machine switches between a fast and a slow state from one process to the "
                   "next, which the median of differences mixes in); \"mean\" compares one over the pairs per "
                   "second, which includes the records' formatting and writing that every 96th record does for the "
                   "records before it. The processes run pinned to one CPU with address-space randomisation off "
                   "where the machine allows it (see \"trace cost runs under\" above).\n")
        out.append("| size | deferred | traced | + ns | best | mean | async | traced | + ns | best | mean |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for s in trace_sizes(recs):
            cells = []
            for m in ("deferred", "async"):
                base, on, diff, mdiff = trace_rounds(recs, m, s)
                if not diff:
                    cells += ["FAILED", "FAILED", "-", "-", "-"]
                    continue
                med = lambda v: sorted(v)[len(v) // 2]
                cells += ["%.2f" % med(base), "%.2f" % med(on), "%+.0f" % med(diff),
                          "%+.0f" % ((min(on) - min(base)) * 1000.0), "%+.0f" % med(mdiff)]
            out.append("| %s | %s |" % (size_label(s), " | ".join(cells)))
        rows8 = []
        for s in sizes:
            a = one(recs, "pairs", cfg="trbase8-async", size=s, threads=8)
            b = one(recs, "pairs", cfg="trace8-async", size=s, threads=8)
            if a is None or b is None or a.get("skipped") or b.get("skipped"):
                continue
            rows8.append("| %s | %.2f | %.2f | %.1f | %.1f |" % (
                size_label(s), num(a, "median_us"), num(b, "median_us"), num(a, "pairs_per_s") / 1e6,
                num(b, "pairs_per_s") / 1e6))
        if rows8:
            out.append("\n8 threads, async (all records go through the one ring):\n")
            out.append("| size | median us | traced | M pairs/s | traced |")
            out.append("| --- | --- | --- | --- | --- |")
            out += rows8
    stk = stack_runs(recs)
    if stk["stk-off"]:
        out.append("\n### Cost of call stacks in the trace (VMMSHIM_TRACE_STACKS=16), one thread: traced async "
                   "pairs of 4 KiB, 20 calls deep; one stack per pair (its allocation)\n")
        out.append("| unwinder (VMMSHIM_TRACE_UNWIND) | median pair (us) | + ns per traced allocation |")
        out.append("| --- | --- | --- |")
        base = num(stk["stk-off"], "median_us")
        out.append("| stacks off (traced) | %.3f | |" % base)
        for c, name in (("stk-libunwind", "libunwind"), ("stk-dwarf", "dwarf (libgcc)"), ("stk-fp", "fp")):
            if c == "stk-libunwind" and not stk[c] and find(recs, "note", what="no-libunwind"):
                out.append("| libunwind | not installed on this machine (libunwind.so.8) | |")
            elif stk[c]:
                out.append("| %s | %.3f | %+.0f |" % (name, num(stk[c], "median_us"),
                                                     (num(stk[c], "median_us") - base) * 1000.0))
    rules = rules_rows(recs)
    if rules:
        out.append("\n### Cost of tag rules (VMMSHIM_TAG_RULES), one thread: async pairs of 4 KiB\n")
        out.append("| rules | median pair (us) | + ns per allocation |")
        out.append("| --- | --- | --- |")
        for label, med, plus in rules:
            out.append("| %s | %.3f | %s |" % (label, med, "" if plus is None else "%+.0f" % plus))
    parts = [("floor", "clock reads alone"), ("shim-deferred", "cudaMalloc+cudaFree, deferred"),
             ("shim-drv-deferred", "cuMemAlloc+cuMemFree, deferred"), ("shim-async", "cudaMallocAsync+cudaFreeAsync"),
             ("shim-drv-async", "cuMemAllocAsync+cuMemFreeAsync")]
    if any(one(recs, "pairs", cfg=c, size=s, threads=1) for c, _ in parts[2:] for s in sizes):
        out.append("\n### Where a pair's time goes, one thread: median (us) under the shim, through the runtime "
                   "and straight through the driver API\n")
        out.append("The runtime's own work is the difference between a runtime row and the driver row next to it; "
                   "every median includes the clock reads of the first column.\n")
        out.append("| size | " + " | ".join(n for _, n in parts) + " |")
        out.append("|" + " --- |" * (len(parts) + 1))
        for s in sizes:
            row = []
            for c, _ in parts:
                r = one(recs, "pairs", cfg=c, size=s, threads=1)
                row.append("FAILED" if r is None else "skipped" if r.get("skipped") else "%.3f" % num(r, "median_us"))
            out.append("| %s | %s |" % (size_label(s), " | ".join(row)))
    tcounts = sorted({int(r["threads"]) for r in find(recs, "pairs") if "threads" in r and int(r["threads"]) > 1})
    for t in tcounts:
        out.append("\n### %d threads: throughput in pairs/s (%d-thread / 1-thread throughput)\n" % (t, t))
        out.append("| size | " + " | ".join(n for _, n in PAIR_CFGS) + " | shim sync / cudaMalloc | shim async / pool |")
        out.append("|" + " --- |" * (len(PAIR_CFGS) + 3))
        for s in sizes:
            row, thr = [], {}
            for c, _ in PAIR_CFGS:
                r = one(recs, "pairs", cfg=c, size=s, threads=t)
                r1 = one(recs, "pairs", cfg=c, size=s, threads=1)
                if r is None:
                    row.append("FAILED")
                elif r.get("skipped"):
                    row.append("skipped")
                else:
                    thr[c] = num(r, "pairs_per_s")
                    one_t = num(r1, "pairs_per_s") if r1 else None
                    row.append("%.0f (%s)" % (thr[c], ratio(thr[c], one_t)))
            out.append("| %s | %s | %s | %s |" % (size_label(s), " | ".join(row),
                                                  ratio(thr.get("shim-sync"), thr.get("cudaMalloc")),
                                                  ratio(thr.get("shim-async"), thr.get("pool"))))
        out.append("\nMedian / p99 latency with %d threads (us):\n" % t)
        out.append("| size | " + " | ".join(n for _, n in PAIR_CFGS) + " |")
        out.append("|" + " --- |" * (len(PAIR_CFGS) + 1))
        for s in sizes:
            row = []
            for c, _ in PAIR_CFGS:
                r = one(recs, "pairs", cfg=c, size=s, threads=t)
                row.append("FAILED" if r is None else "skipped" if r.get("skipped") else
                           "%.2f / %.2f" % (num(r, "median_us"), num(r, "p99_us")))
            out.append("| %s | %s |" % (size_label(s), " | ".join(row)))
    out.append("")


def growth_rows(recs):
    rows = []
    for r in find(recs, "growth"):
        rows.append({
            "config": r.get("cfg"), "total_bytes": int(r.get("total", 0)), "request_bytes": int(r.get("request", 0)),
            "skipped": 1 if r.get("skipped") else 0, "n": r.get("n", ""), "alloc_us": r.get("alloc_us", ""),
            "us_per_gib": r.get("us_per_gib", ""), "first_us": r.get("first_us", ""), "free_us": r.get("free_us", ""),
            "shim_vmm_calls": r.get("shim_vmm_calls", ""), "shim_peak_mapped": r.get("shim_peak_mapped", "")})
    return rows


def sec_growth(recs, out, logdir, results_dir, stem):
    rows = growth_rows(recs)
    cfgs = ["cudaMalloc"] + ["shim-" + g for g in GRAN]
    if any(r["config"] == "shim-64M-max16M" for r in rows):
        cfgs.append("shim-64M-max16M")
    totals = sorted({r["total_bytes"] for r in rows})
    reqs = sorted({r["request_bytes"] for r in rows})
    out.append("## 2. First-time growth: us per GiB allocated (ratio to cudaMalloc)\n")
    out.append("Fresh process per cell; all of <total> allocated in requests of <request>; "
               "the shim at several VMMSHIM_GRANULARITY values.\n")
    out.append("| total | request | " + " | ".join(cfgs) + " |")
    out.append("|" + " --- |" * (len(cfgs) + 2))

    def get(cfg, t, q):
        for r in rows:
            if r["config"] == cfg and r["total_bytes"] == t and r["request_bytes"] == q:
                return r
        return None

    for t in totals:
        for q in reqs:
            base = get("cudaMalloc", t, q)
            bv = float(base["us_per_gib"]) if base and base["us_per_gib"] else None
            cells = []
            for c in cfgs:
                r = get(c, t, q)
                if r is None:
                    cells.append("FAILED")
                elif r["skipped"]:
                    cells.append("skipped")
                else:
                    v = float(r["us_per_gib"])
                    cells.append("%.0f" % v if c == "cudaMalloc" else "%.0f (%s)" % (v, ratio(v, bv)))
            out.append("| %s | %s | %s |" % (size_label(t), size_label(q), " | ".join(cells)))
    out.append("\nFree time of the same allocations (ms, all of them; the shim keeps its memory mapped):\n")
    out.append("| total | request | " + " | ".join(cfgs) + " |")
    out.append("|" + " --- |" * (len(cfgs) + 2))
    for t in totals:
        for q in reqs:
            cells = []
            for c in cfgs:
                r = get(c, t, q)
                cells.append("FAILED" if r is None else "skipped" if r["skipped"] else
                             "%.1f" % (float(r["free_us"]) / 1e3))
            out.append("| %s | %s | %s |" % (size_label(t), size_label(q), " | ".join(cells)))
    csv_path = os.path.join(logdir, "growth.csv")
    if rows:
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        svg = growth_svg(rows, totals, reqs)
        for d in (logdir, results_dir):
            with open(os.path.join(d, stem + "-growth.svg" if d == results_dir else "growth.svg"), "w") as f:
                f.write(svg)
        out.append("\nData: growth.csv; plot: %s-growth.svg (us per GiB against granularity, "
                   "one line per request size; dashed: cudaMalloc).\n" % stem)
    out.append("")


def growth_svg(rows, totals, reqs):
    """Small multiples by hand: one panel per total, x = log2(granularity), y = log10(us/GiB)."""
    gx = {"2M": 21, "64M": 26, "512M": 29, "2G": 31}
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    vals = [float(r["us_per_gib"]) for r in rows if not r["skipped"] and r["us_per_gib"]]
    if not vals:
        return "<svg xmlns='http://www.w3.org/2000/svg' width='200' height='40'><text x='5' y='20'>no data</text></svg>"
    lo = math.floor(math.log10(min(vals)))
    hi = math.ceil(math.log10(max(vals)))
    if hi == lo:
        hi += 1
    pw, ph, ml, mt, mb, gap = 300, 240, 60, 40, 50, 30
    width = ml + len(totals) * (pw + gap) + 140
    height = mt + ph + mb
    s = ["<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='11'>"
         % (width, height), "<rect width='100%' height='100%' fill='white'/>",
         "<text x='%d' y='16' font-size='13'>First-time allocation cost (us per GiB, log) vs VMMSHIM_GRANULARITY</text>"
         % ml]

    def X(p, g):
        return ml + p * (pw + gap) + (gx[g] - 20) / (32 - 20) * pw

    def Y(v):
        return mt + ph - (math.log10(v) - lo) / (hi - lo) * ph

    for p, t in enumerate(totals):
        x0 = ml + p * (pw + gap)
        s.append("<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#888'/>" % (x0, mt, pw, ph))
        s.append("<text x='%d' y='%d' text-anchor='middle'>total %s</text>" % (x0 + pw / 2, mt - 6, size_label(t)))
        for e in range(lo, hi + 1):
            y = Y(10 ** e)
            s.append("<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#eee'/>" % (x0, x0 + pw, y, y))
            if p == 0:
                s.append("<text x='%d' y='%.1f' text-anchor='end'>1e%d</text>" % (x0 - 4, y + 4, e))
        for g in GRAN:
            s.append("<text x='%.1f' y='%d' text-anchor='middle'>%s</text>" % (X(p, g), mt + ph + 16, g))
        for i, q in enumerate(reqs):
            col = colors[i % len(colors)]
            pts = []
            for g in GRAN:
                for r in rows:
                    if (r["config"] == "shim-" + g and r["total_bytes"] == t and r["request_bytes"] == q
                            and not r["skipped"] and r["us_per_gib"]):
                        pts.append((X(p, g), Y(float(r["us_per_gib"]))))
            if len(pts) > 1:
                s.append("<polyline fill='none' stroke='%s' stroke-width='2' points='%s'/>"
                         % (col, " ".join("%.1f,%.1f" % xy for xy in pts)))
            for x, y in pts:
                s.append("<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>" % (x, y, col))
            for r in rows:
                if (r["config"] == "cudaMalloc" and r["total_bytes"] == t and r["request_bytes"] == q
                        and not r["skipped"] and r["us_per_gib"]):
                    y = Y(float(r["us_per_gib"]))
                    s.append("<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='%s' stroke-dasharray='5,4'/>"
                             % (x0, x0 + pw, y, y, col))
    lx = ml + len(totals) * (pw + gap)
    for i, q in enumerate(reqs):
        col = colors[i % len(colors)]
        y = mt + 20 + i * 18
        s.append("<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='%s' stroke-width='2'/>" % (lx, lx + 20, y, y, col))
        s.append("<text x='%d' y='%d'>requests of %s</text>" % (lx + 26, y + 4, size_label(q)))
    y = mt + 20 + len(reqs) * 18
    s.append("<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='#333' stroke-dasharray='5,4'/>" % (lx, lx + 20, y, y))
    s.append("<text x='%d' y='%d'>cudaMalloc</text>" % (lx + 26, y + 4))
    s.append("<text x='%d' y='%d' text-anchor='middle'>granularity</text>" % (ml + len(totals) * (pw + gap) / 2,
                                                                            mt + ph + 36))
    s.append("</svg>")
    return "\n".join(s) + "\n"


def ran(recs, partial, *sections):
    """Whether a step of these sections ran (the spread's aside): always, unless the run was
    partial (BENCH_ONLY), whose report leaves out the sections and tables none of whose steps ran."""
    return not partial or any(r["_section"] in sections and not r.get("cfg", "").startswith("spread-") for r in recs)


def sec_frag(recs, out, partial=False):
    out.append("## 3. Fragmentation\n")
    if ran(recs, partial, "frag"):
        out.append("### Synthetic trace (bench/traces/synthetic.csv) replayed\n")
        out.append("| allocator | peak live (requested) | held at peak | held / live | in use at peak (served) | replay time |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        names = [("cudaMalloc", "cudaMalloc (time only)"), ("pool", "cudaMallocAsync pool, threshold max"),
                 ("shim-sync", "shim sync"), ("shim-sync-max64M", "shim sync, VMMSHIM_MAX_HANDLE=64M"),
                 ("shim-sync-max16M", "shim sync, VMMSHIM_MAX_HANDLE=16M"), ("shim-deferred", "shim deferred"),
                 ("shim-async", "shim async path")]
        for c, label in names:
            r = one(recs, "frag", cfg=c)
            if r is None or r.get("failed"):
                why = "FAILED" if r is None else "FAILED at event %s (%s)" % (r.get("at_event"), r.get("error"))
                out.append("| %s | %s | | | | |" % (label, why))
                continue
            live, h = num(r, "peak_live"), held_bytes(r, c)
            used = (num(r, "pool_used_high") if c == "pool" else
                    num(r, "shim_peak_in_use") if c.startswith("shim") else None)
            out.append("| %s | %s | %s | %s | %s | %.0f ms |" % (
                label, fsize(live), "-" if h is None else fsize(h), ratio(h, live, "%.3f"),
                "-" if used is None else fsize(used), num(r, "time_ms")))
    for work, what in (("churn", "churn: 256 live buffers, one replaced a step, log-uniform 256 B - 512 MiB"),
                       ("varlen", "varlen: a transformer step at a random sequence length")):
        rows = {c: one(recs, "churn", work=work, cfg=c)
                for c in ("cudaMalloc", "pool", "shim-sync", "shim-deferred", "shim-async") + CHURN_STITCH_CFGS}
        if not any(rows.values()):
            continue
        out.append("\n### Irregular sizes with kernels, %s (bench/churn.cu)\n" % what)
        out.append("held / live: peak mapped (shim) or reserved high (pool) over peak live (requested). VMM calls: "
                   "the shim's after the first tenth of the events, per 100 of those allocations.\n")
        out.append("| allocator | us per step | vs pool | held / live | VMM calls per 100 allocations | bad |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        pool_us = num(rows["pool"], "us_per_step") if rows["pool"] else None
        for c, label in (("cudaMalloc", "cudaMalloc"), ("pool", "cudaMallocAsync pool, threshold max"),
                         ("shim-sync", "shim sync"), ("shim-deferred", "shim deferred"),
                         ("shim-async", "shim async path")) + CHURN_STITCH_ROWS:
            r = rows[c]
            if r is None and c in CHURN_STITCH_CFGS:
                continue
            if r is None or r.get("failed"):
                out.append("| %s | %s | | | | |" % (label, "FAILED" if r is None else "FAILED at event %s (%s)" % (
                    r.get("at_event"), r.get("error"))))
                continue
            us = num(r, "us_per_step")
            calls, per100 = vmm_per_100(r) if c.startswith("shim") else (None, None)
            vmm = "-" if calls is None else "%d calls" % calls if per100 is None else "%.2f" % per100
            out.append("| %s | %.2f | %s | %s | %s | %s |" % (label, us, ratio(us, pool_us, "%.2fx"),
                                                            ratio(held_bytes(r, c), num(r, "peak_live"), "%.3f"), vmm,
                                                            r.get("bad", "?")))
        if work == "churn":
            out.append("\n" + churn_target(rows, pool_us))
    if not ran(recs, partial, "tfrag") and not any(r.get("step", "").startswith("tfrag-") for r in find(recs, "skip")):
        return
    out.append("\n### PyTorch, variable sequence length (bench/torch_frag.py)\n")
    out.append("| configuration | held at peak | live at peak | held / live | final loss |")
    out.append("| --- | --- | --- | --- | --- |")
    for c, label, hk, lk in (("caching", "caching allocator", "torch_reserved", "torch_allocated"),
                             ("expandable", "caching, expandable_segments:True", "torch_reserved", "torch_allocated"),
                             ("shim", "shim (PYTORCH_NO_CUDA_MEMORY_CACHING=1): mapped / in use",
                              "shim_peak_mapped", "shim_peak_in_use")):
        r = one(recs, "tfrag", cfg=c)
        sk = one(recs, "skip", step="tfrag-" + c)
        if r is None:
            out.append("| %s | %s | | | |" % (label, "skipped: " + sk.get("why", "") if sk else "FAILED"))
            continue
        held, live = num(r, hk), num(r, lk)
        out.append("| %s | %s | %s | %s | %s |" % (label, fsize(held), fsize(live), ratio(held, live, "%.3f"),
                                                  r.get("loss")))
    out.append("")


SPREAD_WORK = (("churn", "churn", "us per step"), ("varlen", "varlen", "us per step"),
               ("replay", "synthetic trace (bench/gen_trace.py at each seed, replayed)", "replay time"))


def spread_runs(recs, work):
    """The spread records of one workload: {cfg: {seed: record}}."""
    runs = {}
    for r in recs:
        cfg = r.get("cfg", "")
        if not cfg.startswith("spread-"):
            continue
        if work == "replay":
            m = re.match(r"synthetic-seed(\d+)\.csv$", r.get("trace", "")) if r["_section"] == "frag" else None
            seed = m and int(m.group(1))
        else:
            seed = int(r["seed"]) if r["_section"] == "churn" and r.get("work") == work and r.get("seed") else None
        if seed:
            runs.setdefault(cfg[len("spread-"):], {})[seed] = r
    return runs


def spread_cell(values, fmt):
    """median (min - max) of the values that are not None."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return "-"
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (" + fmt + " - " + fmt + ")") % (statistics.median(v), v[0], v[-1])


def sec_spread(recs, out):
    """Held / live, time against the pool and VMM calls over several workload seeds (BENCH_SPREAD)."""
    first = True
    for work, what, time_label in SPREAD_WORK:
        runs = spread_runs(recs, work)
        if not runs:
            continue
        if first:
            out.append("## 3c. Spread over workload seeds\n")
            out.append("Each workload again at every seed, the shim with its default handles and with "
                       "VMMSHIM_MAX_HANDLE=64M and 32M. Cells: median (min - max) over the seeds. held / live: peak "
                       "mapped (shim) or reserved high (pool) over peak live (requested); time: against the "
                       "cudaMallocAsync pool's at the same seed; VMM calls per 100 allocations: after the first "
                       "tenth of the events for churn and varlen, over the whole replay for the trace.\n")
            first = False
        pool = runs.get("pool", {})
        seeds = sorted(set(s for c in runs.values() for s in c))
        out.append("### %s, seeds %s\n" % (what, " ".join(str(x) for x in seeds)))
        out.append("| allocator | runs | held / live | seeds at held <= 1.10 | %s vs pool | VMM calls per 100 allocations | bad |"
                   % time_label)
        out.append("| --- | --- | --- | --- | --- | --- | --- |")
        order = ["pool"] + ["shim-%s%s" % (m, h) for h in ("", "-max64M", "-max32M") for m in ("sync", "deferred", "async")]
        for cfg in order + sorted(c for c in runs if c not in order):
            by_seed = runs.get(cfg)
            if not by_seed:
                continue
            hl, speed, calls, bad, failed = spread_seeds(by_seed, pool, work)
            ok = sum(1 for x in hl if x is not None and x <= 1.10)
            label = "cudaMallocAsync pool, threshold max" if cfg == "pool" else "shim " + cfg[5:].replace(
                "-max", ", VMMSHIM_MAX_HANDLE=")
            out.append("| %s | %d%s | %s | %d of %d | %s | %s | %d |" % (
                label, len(by_seed), " (%d FAILED)" % failed if failed else "", spread_cell(hl, "%.3f"),
                ok, len([x for x in hl if x is not None]), "1.00x" if cfg == "pool" else spread_cell(speed, "%.2fx"),
                "-" if cfg == "pool" else spread_cell(calls, "%.2f"), bad))
        out.append("")


def sec_step(recs, out):
    out.append("## 4. Real program: transformer training step (bench/torch_step.py)\n")
    out.append("d_model 512, 4 layers, 8 heads, batch 32, sequence 128, AdamW; median of 30 steps after 5 of warm-up. "
               "(a) and (d) ran in three alternating rounds: their row is the round with the median step time, "
               "and the step medians of all rounds follow in brackets.\n")
    cfgs = [("caching", "(a) caching allocator"), ("nocache", "(b) PYTORCH_NO_CUDA_MEMORY_CACHING=1"),
            ("shim-sync", "(c) (b) under the shim, sync"), ("shim-deferred", "(d) (b) under the shim, deferred"),
            ("shim-deferred-stitch", "(e) (d) with VMMSHIM_STITCH=1")]
    got, rounds = {}, {}
    for c, _ in cfgs:
        rounds[c] = [num(r, "median_ms") for r in step_rounds(recs, c)]
        rs = sorted(step_rounds(recs, c), key=lambda r: num(r, "median_ms"))
        got[c] = rs[len(rs) // 2] if rs else None
    a = num(got["caching"], "median_ms") if got["caching"] else None
    b = num(got["nocache"], "median_ms") if got["nocache"] else None
    bloss = got["nocache"].get("loss") if got["nocache"] else None
    out.append("| configuration | step median (ms) | p90 (ms) | vs (a) | vs (b) | peak memory | final loss | loss = (b) |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    mismatch = []
    for c, label in cfgs:
        r = got[c]
        if r is None and c.endswith("-stitch") and not one(recs, "skip", step="step-" + c):
            continue  # a run from before the stitch's rows
        if r is None:
            sk = one(recs, "skip", step="step-" + c)
            out.append("| %s | %s | | | | | | |" % (label, "skipped: " + sk.get("why", "") if sk else "FAILED"))
            continue
        m = num(r, "median_ms")
        if c == "caching":
            peak = "%s reserved, %s allocated" % (fsize(num(r, "torch_reserved")), fsize(num(r, "torch_allocated")))
        elif c == "nocache":
            peak = "%s in use after forward (cudaMemGetInfo)" % fsize(num(r, "used_fwd"))
        else:
            peak = "%s mapped, %s in use" % (fsize(num(r, "shim_peak_mapped")), fsize(num(r, "shim_peak_in_use")))
            if r.get("shim_vmm_calls") is not None:
                peak += ", %s VMM calls" % r.get("shim_vmm_calls")
        same = "-"
        if c.startswith("shim"):
            if bloss is None:
                same = "no (b) to compare"
            elif r.get("loss") == bloss:
                same = "yes"
            else:
                same = "**MISMATCH**"
                mismatch.append(c)
        elif c == "caching" and bloss is not None:
            same = "yes" if r.get("loss") == bloss else "differs"
        med_cell = "%.2f" % m
        if len(rounds[c]) > 1:
            med_cell += " (%s)" % ", ".join("%.2f" % x for x in rounds[c])
        out.append("| %s | %s | %.2f | %s | %s | %s | %s | %s |" % (
            label, med_cell, num(r, "p90_ms"), ratio(m, a), ratio(m, b), peak, r.get("loss"), same))
    if mismatch:
        out.append("\n**Loss mismatch** between (b) and %s: the shim changed a result.\n" % ", ".join(mismatch))
    out.append("")
    return mismatch


def churn_target(rows, pool_us):
    """The churn's target (issue 42): held / live at peak at most 1.05, at no more than 0.8x the
    pool's time per step; which shim rows meet it."""
    met = []
    for c, r in sorted(rows.items()):
        if not c.startswith("shim") or r is None or r.get("failed") or not pool_us:
            continue
        hl = held_live(r, c)
        if hl is not None and hl <= 1.05 and num(r, "us_per_step") <= 0.8 * pool_us:
            met.append(c)
    return "Target: held / live <= 1.05 at <= 0.80x the pool's us per step: %s." % (
        "met by " + ", ".join(met) if met else "not met by any shim row")


# The stitch's rows (VMMSHIM_STITCH=1; bench/run.sh), shown where they ran.
CHURN_STITCH_CFGS = ("shim-sync-stitch", "shim-async-stitch", "shim-sync-stitch-max32M", "shim-async-stitch-max16M",
                     "shim-async-g8M-max32M", "shim-async-g8M-max16M")
CHURN_STITCH_ROWS = (("shim-sync-stitch", "shim sync, stitch"), ("shim-async-stitch", "shim async path, stitch"),
                     ("shim-sync-stitch-max32M", "shim sync, stitch, VMMSHIM_MAX_HANDLE=32M"),
                     ("shim-async-stitch-max16M", "shim async path, stitch, VMMSHIM_MAX_HANDLE=16M"),
                     ("shim-async-g8M-max32M", "shim async path, VMMSHIM_GRANULARITY=8M, VMMSHIM_MAX_HANDLE=32M"),
                     ("shim-async-g8M-max16M", "shim async path, VMMSHIM_GRANULARITY=8M, VMMSHIM_MAX_HANDLE=16M"))

SERVE_CFGS = [("caching", "caching allocator"), ("expandable", "caching, expandable_segments:True"),
              ("async", "backend:cudaMallocAsync"),
              ("shim-sync", "PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim, sync"),
              ("shim-deferred", "PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim, deferred"),
              ("shim-caching", "caching allocator under the shim"),
              ("shim-expandable", "expandable_segments:True under the shim"),
              ("shim-async", "backend:cudaMallocAsync under the shim"),
              ("shim-sync-stitch", "PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim, sync, stitch"),
              ("shim-deferred-stitch", "PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim, deferred, stitch")]


def serve_held(r):
    """Memory held at peak by one serve run and where the figure comes from: the shim's peak
    mapped or PyTorch's peak reserved, whichever is larger (under the shim, the caching allocator
    reserves from the shim's mappings; with expandable segments PyTorch maps its own memory
    through the VMM API, which the shim does not serve)."""
    mapped = num(r, "shim_peak_mapped") if r.get("shim") == "1" else None
    reserved = num(r, "peak_reserved") or None
    if mapped and (reserved is None or mapped >= reserved):
        return mapped, "mapped"
    if reserved:
        return reserved, "reserved"
    return None, "-"


def serve_same(r, ref):
    """Whether a serve run generated what the caching allocator's did (tokens and logits)."""
    if ref is None:
        return None
    return r.get("checksum") == ref.get("checksum") and r.get("logit_sum") == ref.get("logit_sum")


def sec_serve(recs, out):
    """The LLM-serving shape (bench/torch_serve.py); returns the configurations whose generated
    tokens differ from the caching allocator's."""
    rows = {c: one(recs, "serve", cfg=c) for c, _ in SERVE_CFGS}
    skipped = {c: one(recs, "skip", step="serve-" + c) for c, _ in SERVE_CFGS}
    first = next((r for r in rows.values() if r), None)
    out.append("## 4b. Real program: LLM serving, a KV cache grown by torch.cat (bench/torch_serve.py)\n")
    if first:
        out.append("bench/tfm.py's decoder (d_model %s, %s layers, vocab %s) generating %s tokens greedily for %s batches "
                   "of %s prompts of %s tokens (random lengths, seeded, left-padded): a prefill, then one token at a "
                   "time, every layer's keys and values grown by torch.cat at each token. tokens/s: generated tokens "
                   "over the time of the batches after the first %s. held at peak: the shim's peak mapped or PyTorch's "
                   "peak reserved (the cudaMallocAsync backend's: its pool's high mark), whichever is larger; in use: "
                   "cudaMemGetInfo at the batches' last tokens, the highest. same result: the generated tokens' "
                   "checksum and the last logits' sum equal the caching allocator's.\n" % (
                       first.get("d_model", "?"), first.get("layers", "?"), first.get("vocab", "?"),
                       first.get("new_tokens", "?"), first.get("batches", "?"), first.get("batch", "?"),
                       first.get("prompts", "?"), first.get("warmup", "?")))
    out.append("| configuration | tokens/s | vs caching | held at peak | allocated at peak | in use (cudaMemGetInfo) "
               "| VMM calls | same result |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    ref = rows["caching"]
    base = num(ref, "tokens_per_s") if ref else None
    differ = []
    for c, label in SERVE_CFGS:
        r = rows[c]
        if r is None and c.endswith("-stitch") and not skipped[c]:
            continue  # a run from before the stitch's rows
        if r is None:
            sk = skipped[c]
            out.append("| %s | %s | | | | | | |" % (label, "skipped: " + sk.get("why", "") if sk else "FAILED"))
            continue
        tps = num(r, "tokens_per_s")
        held, src = serve_held(r)
        same = serve_same(r, ref)
        if c == "caching":
            same_cell = "-"
        elif same is None:
            same_cell = "no caching run to compare"
        elif same:
            same_cell = "yes"
        else:
            same_cell = "**DIFFERS**"
            differ.append(c)
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label, fnum(tps, "%.0f"), ratio(tps, base), "-" if held is None else "%s (%s)" % (fsize(held), src),
            fsize(num(r, "peak_allocated")) if num(r, "peak_allocated") else "-", fsize(num(r, "used")),
            r.get("shim_vmm_calls", "-"), same_cell))
    if differ:
        out.append("\n**Different tokens** from the caching allocator's: %s.\n" % ", ".join(differ))
    out.append("")
    return differ


def sec_overhead(recs, out):
    out.append("## 5. Steady-state overhead: 1 GiB allocated once, memory-bound kernel for ~2 s\n")
    out.append("| configuration | runs | kernel time, median (ms) | whole process, median (ms) |")
    out.append("| --- | --- | --- | --- |")
    med = {}
    for c, label in (("cudaMalloc", "without the shim"), ("shim", "under the shim")):
        ks, ws = overhead_runs(recs, c)
        ks = [k for k in ks if k is not None]
        ws = [w for w in ws if w is not None]
        km = statistics.median(ks) if ks else None
        wm = statistics.median(ws) if ws else None
        med[c] = (km, wm)
        out.append("| %s | %d | %s | %s |" % (label, len(ks), fnum(km), fnum(wm, "%.0f")))
    (k0, w0), (k1, w1) = med["cudaMalloc"], med["shim"]
    out.append("\nRatio shim / without: kernel time %s, process %s.\n" % (ratio(k1, k0, "%.4f"), ratio(w1, w0, "%.4f")))


def sec_sleep(recs, out):
    out.append("## 6. Sleep and wake of an 8 GiB tag (64 MiB blocks)\n")
    out.append("Host memory obtained at the first host sleep (`cold`), or made ahead with "
               "VMMSHIM_HOST_RESERVE=8G (`reserved`). GiB/s counts the tag's bytes over the call's time. "
               "bad: words wrong after the wake (host and mapped modes keep every byte).\n")
    out.append("| run | mode | cycle | sleep (ms) | wake (ms) | sleep GiB/s | wake GiB/s | bad | rc |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg in ("cold", "reserved"):
        for mode in ("discard", "host", "mapped"):
            for r in find(recs, "sleep", cfg=cfg, mode=mode):
                out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    cfg, mode, r.get("cycle"), fnum(num(r, "sleep_ms")), fnum(num(r, "wake_ms")),
                    fnum(num(r, "sleep_gibps"), "%.1f"), fnum(num(r, "wake_gibps"), "%.1f"), r.get("bad"), r.get("rc")))
    for cfg in ("cold", "reserved"):
        d, m = one(recs, "sleep", cfg=cfg, kernel="device"), one(recs, "sleep", cfg=cfg, kernel="mapped")
        if d or m:
            out.append("\nKernel reading and writing the tag (%s run): device memory %s GB/s, asleep in mapped mode %s GB/s." % (
                cfg, fnum(num(d, "gbps") if d else None, "%.1f"), fnum(num(m, "gbps") if m else None, "%.1f")))
    out.append("")


def sec_tms(recs, out):
    out.append("### torch_memory_saver's API: pause and resume of 8 GiB (64 MiB tensors)\n")
    skip = one(recs, "tms", skip="all")
    if skip:
        out.append("Not run: %s.\n" % skip.get("why", "").replace("-", " "))
        return
    out.append("Through `vmmshim.torch_memory_saver` (bench/tms_bench.py): a region without backup (discard), "
               "with `enable_cpu_backup` (host, `retain_cpu_backup` on) and with `enable_disk_backup` (disk). "
               "Cycle 1 obtains host memory and staging buffers; the later cycles are the steady state. "
               "`raw` rows: section 6's `vmmshim_sleep` of the same size, beside them.\n")
    out.append("| mode | cycle | pause (ms) | resume (ms) | pause GiB/s | resume GiB/s | bad |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for mode in ("discard", "host", "disk"):
        for r in find(recs, "tms", mode=mode):
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                mode, r.get("cycle"), fnum(num(r, "pause_ms")), fnum(num(r, "resume_ms")),
                fnum(num(r, "pause_gibps"), "%.1f"), fnum(num(r, "resume_gibps"), "%.1f"), r.get("bad")))
        for r in find(recs, "sleep", cfg="cold", mode=mode):
            out.append("| raw %s | %s | %s | %s | %s | %s | %s |" % (
                mode, r.get("cycle"), fnum(num(r, "sleep_ms")), fnum(num(r, "wake_ms")),
                fnum(num(r, "sleep_gibps"), "%.1f"), fnum(num(r, "wake_gibps"), "%.1f"), r.get("bad")))
    skip = one(recs, "tms", skip="disk")
    if skip:
        out.append("\nDisk mode not run: %s.\n" % skip.get("why", "").replace("-", " "))
        return
    w, rd = one(recs, "tms", dd="write"), one(recs, "tms", dd="read")
    if w and rd:
        out.append("\nThe disk's own sequential speed, `dd` of the same size in the same directory (%s, %s): "
                   "write %s GiB/s, read %s GiB/s." % (w.get("fs"), "direct I/O" if w.get("direct") == "1" else
                                                        "buffered: the filesystem refuses O_DIRECT",
                                                        fnum(num(w, "gibps")), fnum(num(rd, "gibps"))))
        if w.get("bs_mib"):
            out.append("dd's block size: %s MiB (the disk mode: pieces of 32 MiB, up to 4 reads in flight at a wake)."
                       % w.get("bs_mib"))
    again = one(recs, "tms", dd="read-after")
    if again:
        out.append("dd's read again after the disk cycles: %s GiB/s." % fnum(num(again, "gibps")))
    files = find(recs, "tms", files="disk")
    if files:
        out.append("\n| disk cycle | files | bytes | allocated | extents | page cache before pause | paused |")
        out.append("| --- | --- | --- | --- | --- | --- | --- |")
        for r in files:
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                r.get("cycle"), r.get("count"), r.get("bytes"), r.get("allocated"),
                "?" if r.get("extents") == "-1" else r.get("extents"), r.get("cached_before"), r.get("cached_paused")))
        out.append("")
    for what in ("pause", "resume"):
        r = one(recs, "tms", ratio=what)
        if r:
            out.append("Disk mode, steady %s: %s GiB/s, %s of dd's (target %s)." % (
                what, fnum(num(r, "disk_gibps")), fnum(num(r, "value")), r.get("target")))
    out.append("")


def sec_group(recs, out):
    out.append("## 7. A group's budget (VMMSHIM_LIMIT_GROUP)\n")
    out.append("N processes at once, each 200 growths: cudaMalloc of 64 MiB and its cudaFree with "
               "VMMSHIM_RELEASE_THRESHOLD=0, so each maps a handle (one admission) and unmaps it (one return). "
               "`alone`: each process under a VMMSHIM_LIMIT of its own; `group`: the N share one budget. "
               "pair: cudaMalloc + cudaFree of 256 KiB on a pool that does not grow (no admission). "
               "Medians over the processes.\n")
    out.append("| members | growth alone (us) | growth in a group (us) | admission + return (us) | pair alone (us) | pair in a group (us) |")
    out.append("| --- | --- | --- | --- | --- | --- |")

    def med(cfg, n, key):
        return median_or_none(group_runs(recs, cfg, n, key))

    for n in (1, 4, 16):
        ga, gg = med("alone", n, "growth_us"), med("group", n, "growth_us")
        pa, pg = med("alone", n, "pair_us"), med("group", n, "pair_us")
        diff = fnum(gg - ga) if ga is not None and gg is not None else "-"
        out.append("| %d | %s | %s | %s | %s | %s |" % (n, fnum(ga), fnum(gg), diff, fnum(pa, "%.3f"), fnum(pg, "%.3f")))
    kernels, p = spill_runs(recs)
    d, h, pr = kernels.get("device"), kernels.get("host"), kernels.get("promoted")
    if d or h or p:
        out.append("\nVMMSHIM_LIMIT=1G, VMMSHIM_ON_LIMIT=host: a kernel reading and writing 1 GiB on device memory "
                   "%s GB/s, on host memory past the limit %s GB/s, on the same memory after vmmshim_promote %s GB/s; "
                   "the promote of 1 GiB took %s ms (%s GiB/s), %s words wrong after it." % (
                       fnum(num(d, "gbps") if d else None, "%.1f"), fnum(num(h, "gbps") if h else None, "%.1f"),
                       fnum(num(pr, "gbps") if pr else None, "%.1f"), fnum(num(p, "promote_ms") if p else None),
                       fnum(num(p, "promote_gibps") if p else None, "%.1f"), p.get("bad") if p else "-"))
    out.append("")


def gsleep_runs(recs, op, mode, members, key):
    """key of every round of a whole group's move (bench/group_sleep.py)."""
    return [num(r, key) for r in find(recs, "gsleep", op=op, mode=mode, members=members)]


def sec_gsleep(recs, out):
    out.append("### A whole group's sleep and wake\n")
    out.append("`vmmshim ctl --group NAME sleep` and `wake` (every member quiesced, then all moving at once, then "
               "released) of N members of 8 GiB each on one GPU, medians of the rounds; the slowest member's own "
               "move is the time its reply gives, in the same command; `alone`: `vmmshim ctl PID sleep` of one "
               "member, timed by the client.\n")
    out.append("| mode | op | members | group (ms) | slowest member (ms) | group - slowest (ms) | alone (ms) |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for mode in ("discard", "host"):
        for op in ("sleep", "wake"):
            for n in (1, 2, 4):
                g = median_or_none(gsleep_runs(recs, op, mode, n, "group_ms"))
                sl = median_or_none(gsleep_runs(recs, op, mode, n, "slowest_ms"))
                ov = median_or_none(gsleep_runs(recs, op, mode, n, "over_ms"))
                alone = median_or_none(gsleep_runs(recs, "single-" + op, mode, 1, "ms")) if n == 1 else None
                out.append("| %s | %s | %d | %s | %s | %s | %s |" % (mode, op, n, fnum(g), fnum(sl), fnum(ov),
                                                                     fnum(alone) if n == 1 else "-"))
    for b in find(recs, "gsleep", op="balloon"):
        out.append("\nA balloon: a growth of %s MiB past the group's limit, admitted after a lower-priority member "
                   "lent its cold tag (mapped mode; its host memory made ahead: %s MiB): %s ms (%s)." % (
                       b.get("mib"), b.get("reserve_mib", "0"), fnum(num(b, "ms")),
                       "admitted" if b.get("ok") == "1" else "FAILED"))
    for b in find(recs, "gsleep", op="balloon-split"):
        out.append("Of it (host memory made ahead: %s MiB): the lender's move %s ms, the rest %s ms." % (
            b.get("reserve_mib"), fnum(num(b, "lender_ms")), fnum(num(b, "own_ms"))))
    out.append("")


def figs_gsleep(recs, F):
    for mode in ("discard", "host"):
        for op in ("sleep", "wake"):
            for n in (1, 2, 4):
                F.add("group %s, %s, %d members: group - slowest member (ms)" % (op, mode, n),
                      gsleep_runs(recs, op, mode, n, "over_ms"), "lower", "time")
    for r in find(recs, "gsleep", op="balloon"):
        F.add("group balloon: admission of a growth (ms)", num(r, "ms"), "lower", "time")


# ------------------------------------------------------------------ figures and the regression guard
# Every figure of a run goes into a JSON file beside the Markdown one (bench/results/<stem>.json):
# its value (the median of its samples), the samples (the alternating rounds of one run, where a
# step runs in rounds; else one), which way is better and its kind. The next run on the same GPU
# and driver reads the committed file and reports, at the top of its report, each of the shim's
# figures that moved the wrong way by more than its tolerance:
#   - measured: a figure with two or more samples in either run may move by the larger of the two
#     runs' spreads (highest sample minus lowest), never less than the kind's floor;
#   - default: a figure with one sample in both runs may move by its kind's default below.
# The defaults come from the repeated runs on the H100 (docs/benchmarks.md).
GUARD_KINDS = {
    # kind: (relative default, absolute floor (the figure's unit), relative floor, why)
    "time": (0.20, 0.0, 0.0, "±20%: times on fresh machines of the same kind"),
    "pair": (0.20, 0.1, 0.0, "±20% or ±0.1 us: a pair's median from one process to the next"),
    "rate": (0.20, 0.0, 0.0, "±20%: throughput on fresh machines of the same kind"),
    "rate8": (0.50, 0.0, 0.0, "±50%: 8-thread pairs/s, which moved up to 2x between two runs"),
    "growth": (0.40, 0.0, 0.0, "±40%: growth cells on fresh machines of the same kind"),
    "memory": (0.10, 0.0, 0.02, "±10%: memory held in a mode that frees late"),
    "calls": (0.20, 2.0, 0.0, "±20% or ±2 calls"),
    "calls100": (0.20, 0.1, 0.0, "±20% or ±0.1 per 100 allocations"),
    "bad": (0.0, 0.0, 0.0, "none: a wrong word is never noise"),
    "same": (0.0, 0.0, 0.0, "none: a result that equalled the reference must still"),
}


class Figures:
    """An ordered collection of figures: key -> {value, samples, spread, better, kind, unit, guard}.
    guard: False for the figures of the reference allocators (no shim loaded), which the guard
    shows apart: they tell whether the machine, not the shim, moved."""

    def __init__(self):
        self.d = {}

    def add(self, key, samples, better, kind, guard=True, floor=None):
        if not isinstance(samples, (list, tuple)):
            samples = [samples]
        v = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
        if not v:
            return
        # A count of wrong results, or whether a result matched, is its worst round, not the median.
        value = max(v) if kind == "bad" else min(v) if kind == "same" else statistics.median(v)
        f = {"value": value, "samples": v, "spread": (max(v) - min(v)) if len(v) > 1 else None,
             "better": better, "kind": kind, "guard": bool(guard)}
        if floor is not None:
            f["floor"] = floor
        self.d[key] = f


def figs_pairs(recs, F):
    names = dict(PAIR_CFGS)
    for r in find(recs, "pairs"):
        c = r.get("cfg", "")
        if c not in names or r.get("skipped") or "size" not in r:
            continue
        s, t = size_label(r["size"]), int(r.get("threads", 1))
        if t == 1:
            F.add("pairs 1 thread, %s, %s: median pair (us)" % (names[c], s), num(r, "median_us"), "lower", "pair",
                  c.startswith("shim"))
        else:
            F.add("pairs %d threads, %s, %s: pairs/s" % (t, names[c], s), num(r, "pairs_per_s"), "higher", "rate8",
                  c.startswith("shim"))
    for m in ("deferred", "async"):
        for sz in trace_sizes(recs):
            base, on, diff, _ = trace_rounds(recs, m, sz)
            s = size_label(sz)
            F.add("pairs pinned, shim %s, %s: median pair (us)" % (m, s), base, "lower", "pair")
            F.add("pairs pinned, shim %s traced, %s: median pair (us)" % (m, s), on, "lower", "pair")
            F.add("pairs pinned, shim %s, %s: cost of tracing (ns)" % (m, s), diff, "lower", "pair", floor=100.0)
    for c, name in (("trbase8-async", "shim async"), ("trace8-async", "shim async traced")):
        for r in find(recs, "pairs", cfg=c, threads=8):
            if not r.get("skipped"):
                F.add("pairs 8 threads, %s, %s: pairs/s" % (name, size_label(r["size"])), num(r, "pairs_per_s"),
                      "higher", "rate8")
    stk = stack_runs(recs)
    for c, name in zip(STACK_CFGS, ("no stacks", "libunwind", "dwarf", "fp")):
        r = stk[c]
        if r and not r.get("skipped"):
            F.add("pairs traced async 4 KiB, 20 deep, %s: median pair (us)" % name, num(r, "median_us"), "lower", "pair")


def figs_growth(recs, F):
    for r in growth_rows(recs):
        if r["skipped"] or not r["us_per_gib"]:
            continue
        what = "growth %s, %s in %s requests" % (r["config"], size_label(r["total_bytes"]), size_label(r["request_bytes"]))
        shim = r["config"].startswith("shim")
        F.add(what + ": us per GiB", float(r["us_per_gib"]), "lower", "growth", shim)
        if r["free_us"]:
            F.add(what + ": free (ms)", float(r["free_us"]) / 1e3, "lower", "growth", shim, floor=1.0)
        if shim and r["shim_vmm_calls"]:
            F.add(what + ": VMM calls", float(r["shim_vmm_calls"]), "lower", "calls")


def figs_frag(recs, F):
    pool = one(recs, "frag", cfg="pool")
    pool_ms = num(pool, "time_ms") if pool and not pool.get("failed") else None
    for r in find(recs, "frag"):
        c = r.get("cfg", "")
        if r.get("failed") or c.startswith("spread-") or not c:
            continue
        what, shim = "replay %s, %s" % (r.get("trace", "trace"), c), c.startswith("shim")
        t = num(r, "time_ms")
        F.add(what + ": time (ms)", t, "lower", "time", shim)
        if shim and t and pool_ms:
            F.add(what + ": time / the pool's", t / pool_ms, "lower", "time")
        F.add(what + ": held / live", held_live(r, c), "lower", "memory", shim)
        if shim:
            F.add(what + ": VMM calls", num(r, "shim_vmm_calls"), "lower", "calls")
    for work in ("churn", "varlen"):
        pool = one(recs, "churn", work=work, cfg="pool")
        pool_us = num(pool, "us_per_step") if pool and not pool.get("failed") else None
        for c in ("cudaMalloc", "pool", "shim-sync", "shim-deferred", "shim-async") + CHURN_STITCH_CFGS:
            r = one(recs, "churn", work=work, cfg=c)
            if r is None or r.get("failed"):
                continue
            what, shim = "%s, %s" % (work, c), c.startswith("shim")
            us = num(r, "us_per_step")
            F.add(what + ": us per step", us, "lower", "time", shim)
            if shim and us and pool_us:
                F.add(what + ": us per step / the pool's", us / pool_us, "lower", "time")
            F.add(what + ": held / live", held_live(r, c), "lower", "memory", shim)
            F.add(what + ": wrong buffers", num(r, "bad"), "lower", "bad")
            if shim:
                calls, per100 = vmm_per_100(r)
                if per100 is not None:
                    F.add(what + ": VMM calls per 100 allocations", per100, "lower", "calls100")
                else:
                    F.add(what + ": VMM calls after the warm-up", calls, "lower", "calls")
    ref = one(recs, "tfrag", cfg="caching")
    for c, hk, lk in (("caching", "torch_reserved", "torch_allocated"), ("expandable", "torch_reserved", "torch_allocated"),
                      ("shim", "shim_peak_mapped", "shim_peak_in_use")):
        r = one(recs, "tfrag", cfg=c)
        if r is None:
            continue
        held, live = num(r, hk), num(r, lk)
        F.add("PyTorch varying length, %s: held at peak (bytes)" % c, held, "lower", "memory", c == "shim")
        F.add("PyTorch varying length, %s: held / live" % c, held / live if held and live else None, "lower", "memory",
              c == "shim")
        if c == "shim" and ref is not None:
            F.add("PyTorch varying length, shim: final loss equals the caching allocator's",
                  1.0 if r.get("loss") == ref.get("loss") else 0.0, "higher", "same")


def figs_spread(recs, F):
    for work, _, _ in SPREAD_WORK:
        runs = spread_runs(recs, work)
        pool = runs.get("pool", {})
        for cfg, by_seed in runs.items():
            hl, speed, calls, bad, _ = spread_seeds(by_seed, pool, work)
            shim = cfg != "pool"
            seeds = " ".join(str(x) for x in sorted(by_seed))
            what = "seeds %s, %s, %s" % (seeds, work, cfg)

            med = median_or_none
            # One figure per allocator: the median over the seeds (the spread over seeds is the
            # workload's, not the run's: it is no tolerance).
            F.add(what + ": held / live, median of seeds", med(hl), "lower", "memory", shim)
            if shim:
                F.add(what + ": time / the pool's, median of seeds", med(speed), "lower", "time")
                F.add(what + ": VMM calls per 100 allocations, median of seeds", med(calls), "lower", "calls100")
            F.add(what + ": wrong buffers", bad, "lower", "bad")


def figs_step(recs, F):
    a, b, c, d = (step_rounds(recs, cfg) for cfg in ("caching", "nocache", "shim-sync", "shim-deferred"))
    F.add("step (a) caching allocator: step median (ms)", [num(r, "median_ms") for r in a], "lower", "time", False)
    F.add("step (a) caching allocator: reserved at peak (bytes)", [num(r, "torch_reserved") for r in a], "lower",
          "memory", False)
    F.add("step (b) no caching: step median (ms)", [num(r, "median_ms") for r in b], "lower", "time", False)
    a_med = statistics.median([num(r, "median_ms") for r in a]) if a else None
    bloss = b[-1].get("loss") if b else None
    for rs, name in ((c, "(c) shim sync"), (d, "(d) shim deferred")):
        if not rs:
            continue
        F.add("step %s: step median (ms)" % name, [num(r, "median_ms") for r in rs], "lower", "time")
        # Against the caching allocator's round beside it when both ran in rounds (the rounds
        # alternate, so a slow spell of the machine slows both), else its median.
        if len(rs) > 1 and len(rs) == len(a):
            vs = [num(x, "median_ms") / num(y, "median_ms") for x, y in zip(rs, a) if num(y, "median_ms")]
        else:
            vs = [num(x, "median_ms") / a_med for x in rs] if a_med else []
        F.add("step %s / (a) caching allocator: step time" % name, vs, "lower", "time")
        F.add("step %s: mapped at peak (bytes)" % name, [num(r, "shim_peak_mapped") for r in rs], "lower", "memory")
        F.add("step %s: VMM calls" % name, [num(r, "shim_vmm_calls") for r in rs], "lower", "calls")
        if bloss is not None:
            F.add("step %s: final loss equals (b)'s" % name, [1.0 if r.get("loss") == bloss else 0.0 for r in rs],
                  "higher", "same")


def figs_serve(recs, F):
    ref = one(recs, "serve", cfg="caching")
    base = num(ref, "tokens_per_s") if ref else None
    for c, label in SERVE_CFGS:
        r = one(recs, "serve", cfg=c)
        if r is None:
            continue
        shim = c.startswith("shim")
        tps = num(r, "tokens_per_s")
        F.add("serve, %s: tokens/s" % label, tps, "higher", "rate", shim)
        if c != "caching" and tps and base:
            F.add("serve, %s: tokens/s / the caching allocator's" % label, tps / base, "higher", "rate", shim)
        F.add("serve, %s: held at peak (bytes)" % label, serve_held(r)[0], "lower", "memory", shim)
        if shim:
            F.add("serve, %s: VMM calls" % label, num(r, "shim_vmm_calls"), "lower", "calls")
        same = serve_same(r, ref)
        if c != "caching" and same is not None:
            F.add("serve, %s: same tokens as the caching allocator" % label, 1.0 if same else 0.0, "higher", "same",
                  shim)


def figs_overhead(recs, F):
    runs = {}
    for c in ("cudaMalloc", "shim"):
        runs[c], whole = overhead_runs(recs, c)
        F.add("overhead, %s: kernel time (ms)" % c, runs[c], "lower", "time", c == "shim")
        F.add("overhead, %s: whole process (ms)" % c, whole, "lower", "time", c == "shim")
    pairs = [(x, y) for x, y in zip(runs["shim"], runs["cudaMalloc"]) if x is not None and y]
    F.add("overhead: kernel time under the shim / without", [x / y for x, y in pairs], "lower", "time")


def figs_sleep(recs, F):
    for r in find(recs, "sleep"):
        if "mode" in r:
            what = "sleep %s, %s, cycle %s" % (r.get("cfg"), r.get("mode"), r.get("cycle"))
            F.add(what + ": sleep (ms)", num(r, "sleep_ms"), "lower", "time")
            F.add(what + ": wake (ms)", num(r, "wake_ms"), "lower", "time")
            F.add(what + ": wrong words", num(r, "bad"), "lower", "bad")
        elif r.get("kernel") == "mapped":
            F.add("sleep %s: kernel on memory asleep in mapped mode (GB/s)" % r.get("cfg"), num(r, "gbps"), "higher",
                  "rate")


def figs_tms(recs, F):
    for r in find(recs, "tms"):
        if "mode" in r:
            what = "tms %s, cycle %s" % (r.get("mode"), r.get("cycle"))
            F.add(what + ": pause (ms)", num(r, "pause_ms"), "lower", "time")
            F.add(what + ": resume (ms)", num(r, "resume_ms"), "lower", "time")
            F.add(what + ": wrong tensors", num(r, "bad"), "lower", "bad")
        elif "ratio" in r:
            F.add("tms disk: %s speed / dd's" % r.get("ratio"), num(r, "value"), "higher", "rate")


def figs_group(recs, F):
    for n in ("1", "4", "16"):
        for cfg in ("alone", "group"):
            F.add("group, %s, %s members: growth (us)" % (cfg, n), group_runs(recs, cfg, n, "growth_us"), "lower",
                  "time")
            F.add("group, %s, %s members: pair (us)" % (cfg, n), group_runs(recs, cfg, n, "pair_us"), "lower", "pair")
    kernels, p = spill_runs(recs)
    for k, r in kernels.items():
        F.add("group, spill: kernel on %s memory (GB/s)" % k, num(r, "gbps"), "higher", "rate")
    if p is not None:
        F.add("group, spill: promote of 1 GiB (ms)", num(p, "promote_ms"), "lower", "time")
        F.add("group, spill: wrong words after promote", num(p, "bad"), "lower", "bad")


def figures(recs):
    F = Figures()
    for fn in (figs_pairs, figs_growth, figs_frag, figs_spread, figs_step, figs_serve, figs_overhead, figs_sleep,
               figs_group, figs_tms, figs_gsleep):
        fn(recs, F)
    return F.d


def tolerance(b, c):
    """How far a figure may move the wrong way, and what that allowance is."""
    rel, floor, rel_floor, why = GUARD_KINDS[c["kind"]]
    if c["kind"] in ("bad", "same"):
        return 0.0, why
    floor = max(c.get("floor", floor), rel_floor * abs(b["value"]))
    spreads = [(f["spread"], len(f.get("samples", [])), who) for f, who in ((b, "committed"), (c, "this run"))
               if isinstance(f.get("spread"), (int, float))]
    if spreads:
        sp, n, who = max(spreads)
        return max(sp, floor), "spread of %d rounds (%s)" % (n, who)
    return max(rel * abs(b["value"]), floor), "default " + why


def compare(base, cur):
    """The figures of cur that moved the wrong way beyond their tolerance against base:
    (regressions of the shim's figures, those of the reference allocators, figures in common)."""
    shim, ref, common = [], [], 0
    for key, c in cur.items():
        b = base.get(key)
        if b is None or b.get("better") != c["better"] or c["kind"] not in GUARD_KINDS:
            continue
        common += 1
        worse = (c["value"] - b["value"]) if c["better"] == "lower" else (b["value"] - c["value"])
        tol, how = tolerance(b, c)
        if worse > tol:
            (shim if c["guard"] else ref).append((key, b, c, tol, how))
    return shim, ref, common


def fval(f):
    """A figure's value, with its rounds' range when it has several."""
    def g(x):
        return "%.4g" % x
    if len(f.get("samples", [])) > 1:
        return "%s (%s - %s, %d rounds)" % (g(f["value"]), g(min(f["samples"])), g(max(f["samples"])), len(f["samples"]))
    return g(f["value"])


def guard_lines(base_path, base_name, machine, cur):
    """The regression guard's text for the top of the report. Its first line starts with
    'Regression guard:' (bench/run.sh repeats it at the end of the run)."""
    where = "%s, driver %s" % (machine.get("gpu", "?"), machine.get("driver", "?"))
    name = base_name or base_path
    if not base_path or not os.path.exists(base_path):
        return ["Regression guard: no committed results for %s (%s): nothing to compare.\n" % (where, name)]
    try:
        with open(base_path, encoding="utf-8") as f:
            base = json.load(f)
        # Figures without a numeric value or a known direction are left out, not fatal.
        bfigs = {k: f for k, f in base["figures"].items() if isinstance(f, dict)
                 and isinstance(f.get("value"), (int, float)) and f.get("better") in ("lower", "higher")
                 and isinstance(f.get("samples", []), list)}
        bm = base.get("machine", {})
        bm.get("gpu")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return ["Regression guard: %s is not a results file of bench/report.py (%s): nothing compared.\n" % (name, e)]
    if (bm.get("gpu"), bm.get("driver")) != (machine.get("gpu"), machine.get("driver")):
        return ["Regression guard: %s holds results of %s, driver %s, not of %s: nothing compared.\n" % (
            name, bm.get("gpu", "?"), bm.get("driver", "?"), where)]
    shim, ref, common = compare(bfigs, cur)
    when = "run of %s, shim %s" % (bm.get("date", "?"), bm.get("shim", "?"))
    if common == 0:
        return ["Regression guard: %s (%s) has none of this run's figures: nothing compared.\n" % (name, when)]
    if not shim:
        head = "Regression guard: against %s (%s): %d figures in common, none of the shim's moved the wrong way " \
               "beyond its tolerance." % (name, when, common)
    else:
        head = "Regression guard: against %s (%s): %d figures in common, **%d of the shim's moved the wrong way** " \
               "beyond their tolerance:" % (name, when, common, len(shim))
    out = ["## Regression guard\n", head + "\n"]

    def table(rows):
        t = ["| figure | committed | this run | change | tolerance |", "| --- | --- | --- | --- | --- |"]
        for key, b, c, tol, how in rows:
            ch = "%+.1f%%" % (100.0 * (c["value"] - b["value"]) / abs(b["value"])) if b["value"] else "%+.4g" % (
                c["value"] - b["value"])
            t.append("| %s | %s | %s | %s | %.4g: %s |" % (key, fval(b), fval(c), ch, tol, how))
        return t
    if shim:
        out += table(shim) + [""]
    if ref:
        out.append("Without the shim, %d figure(s) moved the wrong way beyond their tolerance too: where the shim's "
                   "rows move with them, the machine is slower, not the shim.\n" % len(ref))
        out += table(ref) + [""]
    missing = [k for k, f in bfigs.items() if k not in cur and f.get("guard")]
    if missing and not machine.get("only"):
        out.append("%d of the shim's committed figures were not measured in this run (a step failed or was left "
                   "out).\n" % len(missing))
    return out


def write_figures(path, machine, figs):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "machine": machine, "tolerances": {k: v[3] for k, v in GUARD_KINDS.items()},
                   "figures": figs}, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", help="the committed results (JSON) of this GPU and driver to compare with; "
                    "a path that does not exist: there are none")
    ap.add_argument("--baseline-name", help="how the report names the baseline (default: its path)")
    a = ap.parse_args()
    recs = parse_logs(a.logs)
    machine = {}
    mpath = os.path.join(a.logs, "machine.txt")
    if os.path.exists(mpath):
        for line in open(mpath):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                machine[k] = v
    results_dir = os.path.dirname(os.path.abspath(a.out))
    stem = os.path.splitext(os.path.basename(a.out))[0]
    os.makedirs(results_dir, exist_ok=True)
    out = ["# vmmshim benchmarks: %s, driver %s\n" % (machine.get("gpu", "?"), machine.get("driver", "?"))]
    figs = figures(recs)
    if a.baseline is not None:
        # Read before this run's figures are written: the baseline may be the file they replace.
        out += guard_lines(a.baseline, a.baseline_name, machine, figs)
    out.append("| machine | |\n| --- | --- |")
    for k, label in (("gpu", "GPU"), ("driver", "driver"), ("cuda", "CUDA (driver / nvcc)"), ("cpu", "CPU"),
                     ("date", "date"), ("shim", "shim commit"), ("torch", "PyTorch"), ("runtime", "bench run time"),
                     ("trace_cost_runs", "trace cost runs under"), ("only", "steps run (BENCH_ONLY)")):
        if k in machine:
            out.append("| %s | %s |" % (label, machine[k]))
    out.append("")

    partial = bool(machine.get("only"))
    if ran(recs, partial, "pairs"):
        sec_pairs(recs, out)
    if ran(recs, partial, "growth"):
        sec_growth(recs, out, a.logs, results_dir, stem)
    if ran(recs, partial, "frag", "churn", "tfrag"):
        sec_frag(recs, out, partial)
    sec_spread(recs, out)
    mismatch = sec_step(recs, out) if ran(recs, partial, "step") else []
    if ran(recs, partial, "serve"):
        mismatch = mismatch + [c for c in sec_serve(recs, out) if c.startswith("shim")]
    if ran(recs, partial, "overhead"):
        sec_overhead(recs, out)
    if ran(recs, partial, "sleep"):
        sec_sleep(recs, out)
    if ran(recs, partial, "tms"):
        sec_tms(recs, out)
    if ran(recs, partial, "group"):
        sec_group(recs, out)
    if ran(recs, partial, "gsleep"):
        sec_gsleep(recs, out)
    failed = find(recs, "failed")
    if failed:
        out.append("## Steps that failed\n")
        for r in failed:
            out.append("- %s (exit %s), log %s" % (r.get("step"), r.get("rc"), r.get("_file")))
        out.append("")
    text = "\n".join(out) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    write_figures(os.path.splitext(a.out)[0] + ".json", machine, figs)
    print(text)
    return 1 if mismatch else 0


if __name__ == "__main__":
    raise SystemExit(main())
