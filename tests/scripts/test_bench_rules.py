#!/usr/bin/env python3
"""bench/report.py's table of the tag rules' cost (bench/run.sh, step pairs: the rules-* rows of
bench/pairs.cu and bench/rules_py.py): each row's median and its difference from the row without
rules of its kind (C or Python), in ns; no table when the rows were not run. Ends with "N passed,
N failed"."""
import os
import subprocess
import sys

from harness import ROOT, check, scratch, summary

REPORT = os.path.join(ROOT, "bench", "report.py")
ROWS = (("rules-none", 0.250), ("rules-size-phase", 0.262), ("rules-lib", 0.270), ("rules-site", 0.265),
        ("rules-py-none", 0.900), ("rules-py-miss", 0.990), ("rules-py", 1.010))


def run(tmp, rows):
    logs = os.path.join(tmp, "logs-%d" % len(rows))
    os.makedirs(logs)
    with open(os.path.join(logs, "machine.txt"), "w") as f:
        f.write("gpu=Test GPU 80GB\ndriver=999.1\ncuda=13.0\ndate=2026-01-01 00:00 UTC\nshim=abc1234\n")
    with open(os.path.join(logs, "pairs.log"), "w") as f:
        f.write("R pairs cfg=shim-async size=4096 threads=1 pairs=100000 median_us=0.250 p99_us=0.4 "
                "pairs_per_s=4000000.0\n")
        for cfg, med in rows:
            f.write("## pairs-%s: env and command\nR pairs cfg=%s size=4096 threads=1 pairs=500000 median_us=%.3f "
                    "p99_us=%.3f pairs_per_s=%.1f\n" % (cfg, cfg, med, med * 1.5, 1e6 / med))
    out = os.path.join(tmp, "out-%d.md" % len(rows))
    r = subprocess.run([sys.executable, REPORT, "--logs", logs, "--out", out], capture_output=True, text=True)
    return r, open(out).read() if os.path.exists(out) else ""


def main():
    with scratch("vmmshim-bench-rules-") as tmp:
        r, text = run(tmp, ROWS)
        check(r.returncode == 0, "report.py on the rules rows: exit 0 (%s)" % r.stderr.strip()[-300:])
        want = ["| C, 20 calls deep: no rules | 0.250 |  |",
                "| C, 20 calls deep: size and phase rules (no stack) | 0.262 | +12 |",
                "| C, 20 calls deep: a lib: rule (once per call site) | 0.270 | +20 |",
                "| C, 20 calls deep: a site: rule (once per call site) | 0.265 | +15 |",
                "| Python (ctypes): no rules | 0.900 |  |",
                "| Python (ctypes): a py: rule that matches nothing | 0.990 | +90 |",
                "| Python (ctypes): a py: rule that matches | 1.010 | +110 |"]
        missing = [w for w in want if w not in text]
        check("### Cost of tag rules (VMMSHIM_TAG_RULES)" in text and not missing,
              "the table of the rules' cost, each row against its base (missing: %s)" % missing)
        r, text = run(tmp, ())
        check(r.returncode == 0 and "Cost of tag rules" not in text, "no rules rows: no table")
    return summary()


if __name__ == "__main__":
    raise SystemExit(main())
