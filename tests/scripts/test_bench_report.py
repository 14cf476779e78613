#!/usr/bin/env python3
"""Tests of bench/report.py on the CPU: synthetic log directories ("R ..." lines as the benchmark
programs print them, machine.txt as bench/run.sh writes it) turned into the report and its JSON
companion, and the regression guard against a committed JSON: a planted regression is reported
with both values (measured by the rounds' spread where the step ran in rounds, else by the
default tolerance of its kind), an improvement and a move within the tolerance are not, the
reference allocators' moves are shown apart, a missing baseline is one line, a baseline of
another GPU is refused, and the serving table tells a changed result. Ends with "N passed,
N failed"."""
import json
import os
import subprocess
import sys

from harness import ROOT, check, scratch, summary

REPORT = os.path.join(ROOT, "bench", "report.py")
GiB = 1 << 30

# One run's figures, as knobs; a run is this dict with some values changed.
BASE = {
    "gpu": "Test GPU 80GB", "driver": "999.1",
    # PyTorch step, three alternating rounds of (a) and (d)
    "step_caching": [15.0, 15.5, 16.0], "step_deferred": [15.3, 15.8, 16.2], "step_sync": 24.0, "step_nocache": 50.0,
    "step_deferred_mapped": [1.7 * GiB, 2.4 * GiB, 1.8 * GiB], "loss": "9.091346740722656",
    # one thread pair medians (us)
    "pair_async_4k": 0.25, "pair_deferred_4k": 0.40, "pair_malloc_4k": 80.0,
    # churn us per step (one run each)
    "churn_pool": 13.0, "churn_deferred": 10.0, "churn_async": 8.7, "churn_deferred_bad": 0,
    "churn_stitch": 10.5,  # 0.81x the pool's: just misses the target's time
    "churn_g8m16": 11.0,  # bounded handles, 8 MiB growth step: 0.85x the pool's, misses it too
    # overhead kernel times, three runs each
    "ovh_base": [2341.3, 2341.2, 2341.4], "ovh_shim": [2341.3, 2341.5, 2345.0],
    # serving: tokens/s and peaks
    "serve_tps": {"caching": 9000.0, "expandable": 8800.0, "async": 8900.0, "shim-caching": 8950.0,
                  "shim-expandable": 8700.0, "shim-async": 9100.0, "shim-sync": 4000.0, "shim-deferred": 8600.0},
    "serve_mapped_deferred": 1.0 * GiB, "serve_checksum": {},
}


def write_logs(d, v, only=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "machine.txt"), "w") as f:
        f.write("gpu=%s\ndriver=%s\ncuda=13.0 / nvcc 13.0\ndate=2026-01-01 00:00 UTC\nshim=abc1234\n"
                "torch=2.11.0 cuda 13.0\n" % (v["gpu"], v["driver"]))
        if only:
            f.write("only=%s\n" % only)

    def log(name, lines):
        with open(os.path.join(d, name + ".log"), "w") as f:
            for line in lines:
                f.write("## a step: env and command\n" + line + "\nsome other output\n")

    shim = " shim=1 shim_allocs=1000 shim_peak_mapped=%d shim_peak_in_use=%d shim_vmm_calls=%d shim_vmm_ms=1.0 " \
           "shim_syncs=0 shim_passthrough=0 shim_pools=1"
    if only in (None, "step-"):
        st = ["R step cfg=nocache steps=30 median_ms=%.3f p90_ms=60.0 loss=%s torch_reserved=0 torch_allocated=0 "
              "used_fwd=1385000000 shim=0" % (v["step_nocache"], v["loss"]),
              "R step cfg=shim-sync steps=30 median_ms=%.3f p90_ms=30.0 loss=%s torch_reserved=0 torch_allocated=0 "
              "used_fwd=0 shim=1 shim_allocs=9000 shim_peak_mapped=%d shim_peak_in_use=%d shim_syncs=9000 "
              "shim_vmm_calls=151 shim_vmm_ms=3.0 shim_pools=1" % (v["step_sync"], v["loss"], int(1.7 * GiB),
                                                                    int(1.65 * GiB))]
        for a, dd, mapped in zip(v["step_caching"], v["step_deferred"], v["step_deferred_mapped"]):
            st.append("R step cfg=caching steps=30 median_ms=%.3f p90_ms=20.0 loss=%s torch_reserved=%d "
                      "torch_allocated=%d used_fwd=0 shim=0" % (a, v["loss"], int(1.66 * GiB), int(1.51 * GiB)))
            st.append("R step cfg=shim-deferred steps=30 median_ms=%.3f p90_ms=25.0 loss=%s torch_reserved=0 "
                      "torch_allocated=0 used_fwd=0 shim=1 shim_allocs=9000 shim_peak_mapped=%d "
                      "shim_peak_in_use=%d shim_syncs=3 shim_vmm_calls=154 shim_vmm_ms=3.0 shim_pools=1" % (
                          dd, v["loss"], int(mapped), int(1.65 * GiB)))
        log("step", st)
    if only is None:
        log("pairs", [
            "R pairs cfg=cudaMalloc size=4096 threads=1 pairs=1000 median_us=%.3f p99_us=140.0 pairs_per_s=12000.0"
            % v["pair_malloc_4k"],
            "R pairs cfg=shim-deferred size=4096 threads=1 pairs=100000 median_us=%.3f p99_us=0.8 "
            "pairs_per_s=2400000.0" % v["pair_deferred_4k"],
            "R pairs cfg=shim-async size=4096 threads=1 pairs=100000 median_us=%.3f p99_us=0.4 pairs_per_s=4000000.0"
            % v["pair_async_4k"]])
        churn = []
        for c, us, extra in (("pool", v["churn_pool"], " pool_reserved_high=1279000000 pool_used_high=1000000000 shim=0"),
                             ("shim-deferred", v["churn_deferred"], shim % (1159000000, 1000000000, 90)
                              + " shim_vmm_steady=77"),
                             ("shim-async", v["churn_async"], shim % (1153000000, 1000000000, 60) + " shim_vmm_steady=55"),
                             ("shim-sync-stitch", v["churn_stitch"], shim % (1040000000, 1000000000, 70)
                              + " shim_vmm_steady=60"),
                             ("shim-async-g8M-max16M", v["churn_g8m16"], shim % (1041000000, 1000000000, 2000)
                              + " shim_vmm_steady=1800")):
            bad = v["churn_deferred_bad"] if c == "shim-deferred" else 0
            churn.append("R churn work=churn cfg=%s seed=1 steps=18000 us_per_step=%.2f peak_live=1000000000 bad=%d "
                         "allocs_steady=9000%s" % (c, us, bad, extra))
        log("churn", churn)
        ov = []
        for i, (a, b) in enumerate(zip(v["ovh_base"], v["ovh_shim"]), 1):
            ov += ["R overhead cfg=cudaMalloc launches=100 kernel_ms=%.2f loop_ms=%.2f checksum=1 shim=0" % (a, a),
                   "R overhead_wall cfg=cudaMalloc run=%d ms=2674" % i,
                   "R overhead cfg=shim launches=100 kernel_ms=%.2f loop_ms=%.2f checksum=1%s" % (
                       b, b, shim % (GiB, GiB, 3)),
                   "R overhead_wall cfg=shim run=%d ms=2705" % i]
        log("overhead", ov)
    if only is None or only == "serve-":
        sv = []
        for c, tps in v["serve_tps"].items():
            mapped = v["serve_mapped_deferred"] if c == "shim-deferred" else 0.9 * GiB
            tail = " shim=0" if not c.startswith("shim") else (
                " shim=1 shim_allocs=5000 shim_peak_mapped=%d shim_peak_in_use=%d shim_syncs=0 shim_vmm_calls=40 "
                "shim_pools=1" % (int(mapped), int(0.8 * GiB)))
            reserved = 0 if c in ("shim-sync", "shim-deferred") else int(0.95 * GiB)
            sv.append("R serve cfg=%s d_model=512 layers=4 vocab=8192 batches=128 warmup=2 batch=8 new_tokens=64 "
                      "prompts=32-512 tokens=64512 seconds=7.0 tokens_per_s=%.1f batch_ms_median=55.0 peak_reserved=%d "
                      "peak_allocated=%d used=%d checksum=%s logit_sum=-1234.5%s" % (
                          c, tps, reserved, int(0.7 * GiB), int(1.0 * GiB),
                          v["serve_checksum"].get(c, "0123456789abcdef"), tail))
        log("serve", sv)


def report(logs, out, baseline=None, name=None):
    cmd = [sys.executable, REPORT, "--logs", logs, "--out", out]
    if baseline is not None:
        cmd += ["--baseline", baseline]
    if name:
        cmd += ["--baseline-name", name]
    return subprocess.run(cmd, capture_output=True, text=True)


def guard_rows(text):
    """{figure: row cells} of the guard's tables: (the shim's, the reference allocators')."""
    shim, ref, cur = {}, {}, None
    for line in text.splitlines():
        if line.startswith("Regression guard:"):
            cur = shim
        elif line.startswith("Without the shim,"):
            cur = ref
        elif line.startswith("| machine"):
            break
        elif cur is not None and line.startswith("| ") and not line.startswith("| figure") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            cur[cells[0]] = cells
    return shim, ref


def changed(**kw):
    v = json.loads(json.dumps(BASE))
    for k, x in kw.items():
        if isinstance(x, dict) and isinstance(v.get(k), dict):
            v[k].update(x)
        else:
            v[k] = x
    return v


def main():
    with scratch("vmmshim-bench-report-") as tmp:
        res = os.path.join(tmp, "results")
        # The committed run: no baseline yet.
        write_logs(os.path.join(tmp, "base"), BASE)
        out0 = os.path.join(res, "Test-GPU-80GB-999.1.md")
        r = report(os.path.join(tmp, "base"), out0, os.path.join(res, "Test-GPU-80GB-999.1.json"),
                   "bench/results/Test-GPU-80GB-999.1.json")
        check(r.returncode == 0, "report of the committed run: exit 0 (%s)" % r.stderr.strip()[-200:])
        lines = r.stdout.splitlines()
        said = [x for x in lines if "committed results" in x or x.startswith("Regression guard")]
        check(len(said) == 1 and said[0] == "Regression guard: no committed results for Test GPU 80GB, driver 999.1 "
              "(bench/results/Test-GPU-80GB-999.1.json): nothing to compare.",
              "no baseline: one line naming the GPU, the driver and the file (%r)" % said)
        check(lines[2].startswith("Regression guard:") and "## Regression guard" not in r.stdout,
              "no baseline: the line is at the top, with no guard section")
        jpath = os.path.join(res, "Test-GPU-80GB-999.1.json")
        committed = json.load(open(jpath)) if os.path.exists(jpath) else {}
        figs = committed.get("figures", {})
        d = figs.get("step (d) shim deferred / (a) caching allocator: step time", {})
        check(committed.get("machine", {}).get("gpu") == "Test GPU 80GB" and len(d.get("samples", [])) == 3
              and abs(d["value"] - 15.8 / 15.5) < 1e-9 and abs(d["spread"] - (15.3 / 15.0 - 16.2 / 16.0)) < 1e-9,
              "JSON companion: the machine, and (d)/(a) per round with its median and spread")
        check(figs.get("serve, caching allocator: tokens/s", {}).get("better") == "higher"
              and figs.get("churn, shim-deferred: us per step", {}).get("kind") == "time"
              and figs.get("churn, pool: us per step", {}).get("guard") is False,
              "JSON companion: direction, kind, and the reference allocators not guarded")
        check("| shim sync, stitch | 10.50 | 0.81x | 1.040 |" in r.stdout
              and "Target: held / live <= 1.05 at <= 0.80x the pool's us per step: not met by any shim row." in r.stdout,
              "churn: the stitch's row, and the target not met (held 1.04 at 0.81x)")
        check("| shim async path, VMMSHIM_GRANULARITY=8M, VMMSHIM_MAX_HANDLE=16M | 11.00 | 0.85x | 1.041 | 20.00 |"
              in r.stdout, "churn: the row of bounded handles with an 8 MiB growth step (held 1.041 at 0.85x)")
        serve = r.stdout[r.stdout.find("## 4b. Real program: LLM serving"):]
        serve = serve[:serve.find("\n## ")]
        check("| caching allocator under the shim | 8950 | 0.99x | 972.8 MiB (reserved) |" in serve
              and "| PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim, deferred | 8600 | 0.96x | 1.00 GiB (mapped) |"
              in serve and serve.count("| yes |") == 7, "serving table: every configuration, held, same result")

        # This run: planted regressions, improvements and moves within the tolerance.
        cur = changed(step_deferred=[18.0, 18.6, 19.2],  # (d) 1.2x (a) per round: beyond the rounds' spread
                      step_caching=[15.1, 15.5, 16.1],  # within the rounds' spread
                      # +22% (median 1.8 -> 2.2 GiB), beyond the default 10% but within the rounds' spread
                      step_deferred_mapped=[2.0 * GiB, 2.2 * GiB, 2.3 * GiB],
                      churn_deferred=14.0,  # +40%, one sample: beyond the default 20%
                      churn_async=6.0,  # faster
                      pair_async_4k=0.32,  # +28% but within the 0.1 us floor
                      pair_deferred_4k=0.60,  # +0.2 us: beyond it
                      ovh_shim=[2343.0, 2344.0, 2346.5],  # +2.5 ms, within the spread of 3.7
                      serve_tps={"caching": 5400.0, "shim-sync": 6000.0},  # the reference slower, the shim faster
                      serve_mapped_deferred=1.5 * GiB)  # +50% memory held
        write_logs(os.path.join(tmp, "cur"), cur)
        out1 = os.path.join(tmp, "cur-results", "Test-GPU-80GB-999.1.md")
        r = report(os.path.join(tmp, "cur"), out1, jpath, "bench/results/Test-GPU-80GB-999.1.json (as committed)")
        check(r.returncode == 0, "report against the baseline: exit 0")
        shim, ref = guard_rows(r.stdout)
        want = {"step (d) shim deferred: step median (ms)", "step (d) shim deferred / (a) caching allocator: step time",
                "churn, shim-deferred: us per step", "churn, shim-deferred: us per step / the pool's",
                "pairs 1 thread, shim deferred, 4 KiB: median pair (us)",
                "serve, PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim, deferred: held at peak (bytes)"}
        check(set(shim) == want, "the planted regressions and nothing else: missing %s, extra %s" % (
            sorted(want - set(shim)), sorted(set(shim) - want)))
        head = [x for x in r.stdout.splitlines() if x.startswith("Regression guard:")]
        check(len(head) == 1 and "**6 of the shim's moved the wrong way**" in head[0]
              and "bench/results/Test-GPU-80GB-999.1.json (as committed)" in head[0]
              and "run of 2026-01-01 00:00 UTC, shim abc1234" in head[0], "the guard's line: count, file, run (%r)" % head)
        row = shim.get("step (d) shim deferred / (a) caching allocator: step time", [""] * 5)
        check(row[1].startswith("1.019 (1.012 - 1.02, 3 rounds)") and row[2].startswith("1.193 (1.192 - 1.2, 3 rounds)")
              and "spread of 3 rounds" in row[4], "step (d)/(a): both values with their rounds, the rounds' spread as "
              "tolerance (%r)" % row)
        row = shim.get("churn, shim-deferred: us per step", [""] * 5)
        check(row[1] == "10" and row[2] == "14" and row[3] == "+40.0%" and row[4].startswith("2: default ±20%"),
              "churn deferred: both values, the change, the default tolerance named (%r)" % row)
        row = shim.get("pairs 1 thread, shim deferred, 4 KiB: median pair (us)", [""] * 5)
        check(row[1] == "0.4" and row[2] == "0.6" and "0.1 us" in row[4], "pair: the 0.1 us floor named (%r)" % row)
        check("churn, shim-async: us per step" not in shim and "overhead, shim: kernel time (ms)" not in shim
              and "pairs 1 thread, shim async, 4 KiB: median pair (us)" not in shim
              and "step (d) shim deferred: mapped at peak (bytes)" not in shim
              and not any("shim, sync" in k for k in shim),
              "an improvement, a move within the rounds' spread and one within the floor: not reported")
        check(set(ref) == {"serve, caching allocator: tokens/s"} and "Without the shim, 1 figure(s)" in r.stdout,
              "the reference allocator's slowdown apart, not counted as the shim's (%s)" % sorted(ref))
        top = r.stdout.find("## Regression guard")
        check(0 < top < r.stdout.find("| machine |"), "the guard comes before everything else in the report")
        check(open(out1).read() == r.stdout[:-1], "the Markdown file holds the printed report, guard included")

        # A hand-written committed JSON (the format docs/benchmarks.md describes).
        hand = os.path.join(tmp, "hand.json")
        key = "serve, caching allocator under the shim: tokens/s"
        json.dump({"format": 1, "machine": {"gpu": "Test GPU 80GB", "driver": "999.1", "date": "then", "shim": "x"},
                   "figures": {key: {"value": 12000.0, "samples": [12000.0], "spread": None, "better": "higher",
                                     "kind": "rate", "guard": True},
                               "churn, shim-async: us per step": {"value": "fast", "better": "lower"},
                               "churn, shim-deferred: us per step": [1, 2],
                               "a figure this run has not": {"value": 1.0, "samples": [1.0], "spread": None,
                                                             "better": "lower", "kind": "time", "guard": True}}},
                  open(hand, "w"))
        r = report(os.path.join(tmp, "base"), os.path.join(tmp, "hand-out", "x.md"), hand)
        shim, ref = guard_rows(r.stdout)
        row = shim.get(key, [""] * 5)
        check(list(shim) == [key] and row[1] == "1.2e+04" and row[2] == "8950" and row[3] == "-25.4%",
              "hand-written baseline: a slower rate reported with both values, malformed figures left out (%r)" % row)
        check("1 of the shim's committed figures were not measured in this run" in r.stdout,
              "a committed figure missing from a full run is counted")

        # A partial run (BENCH_ONLY) compares what it ran and says nothing of the rest.
        write_logs(os.path.join(tmp, "part"), changed(serve_checksum={"shim-async": "fedcba9876543210"}),
                   only="serve-")
        r = report(os.path.join(tmp, "part"), os.path.join(tmp, "part-out", "x-partial.md"), jpath)
        shim, ref = guard_rows(r.stdout)
        check("not measured" not in r.stdout and "## 4. Real program" not in r.stdout, "partial run: only its figures")
        check(set(shim) == {"serve, backend:cudaMallocAsync under the shim: same tokens as the caching allocator"},
              "partial run: a changed result of the shim reported (%s)" % sorted(shim))
        check(r.returncode == 1 and "| backend:cudaMallocAsync under the shim | 9100 | 1.01x |" in r.stdout
              and "**DIFFERS**" in r.stdout, "serving: different tokens under the shim: DIFFERS, exit 1")

        # A baseline of another GPU or driver is not compared.
        write_logs(os.path.join(tmp, "other"), changed(driver="1000.2"))
        r = report(os.path.join(tmp, "other"), os.path.join(tmp, "other-out", "x.md"), jpath, "the file")
        said = [x for x in r.stdout.splitlines() if x.startswith("Regression guard:")]
        check(len(said) == 1 and "holds results of Test GPU 80GB, driver 999.1, not of Test GPU 80GB, driver 1000.2"
              in said[0] and "## Regression guard" not in r.stdout, "another driver's baseline: one line, no table")
        bad = os.path.join(tmp, "bad.json")
        open(bad, "w").write("{not json")
        r = report(os.path.join(tmp, "base"), os.path.join(tmp, "bad-out", "x.md"), bad)
        check(r.returncode == 0 and "is not a results file of bench/report.py" in r.stdout,
              "an unreadable baseline: said in one line, the report still written")

        os.makedirs(os.path.join(tmp, "none"))
        with open(os.path.join(tmp, "none", "machine.txt"), "w") as f:
            f.write("gpu=Test GPU 80GB\ndriver=999.1\n")
        r = report(os.path.join(tmp, "none"), os.path.join(tmp, "none-out", "x.md"), jpath, "the file")
        check(r.returncode == 0 and "Regression guard: the file (run of 2026-01-01 00:00 UTC, shim abc1234) has none "
              "of this run's figures: nothing compared." in r.stdout, "no figure in common: said in one line")

        # The churn's target met by the stitch's row at 0.77x the pool's time.
        write_logs(os.path.join(tmp, "met"), changed(churn_stitch=10.0))
        r = report(os.path.join(tmp, "met"), os.path.join(tmp, "met-out", "x.md"), jpath)
        check("Target: held / live <= 1.05 at <= 0.80x the pool's us per step: met by shim-sync-stitch." in r.stdout,
              "churn: the target met by the stitch's row")

        # A wrong buffer counts whatever the tolerance.
        write_logs(os.path.join(tmp, "wrong"), changed(churn_deferred_bad=1))
        r = report(os.path.join(tmp, "wrong"), os.path.join(tmp, "wrong-out", "x.md"), jpath)
        shim, _ = guard_rows(r.stdout)
        check("churn, shim-deferred: wrong buffers" in shim, "one wrong buffer where there were none: reported")

        # The table and the JSON read one computation: a churn run that does not count its
        # allocations after the warm-up has its VMM calls in both, and no rate in either.
        write_logs(os.path.join(tmp, "nosteady"), BASE)
        churn_log = os.path.join(tmp, "nosteady", "churn.log")
        text = open(churn_log).read().replace(" allocs_steady=9000", "")
        open(churn_log, "w").write(text)
        out = os.path.join(tmp, "nosteady-out", "x.md")
        r = report(os.path.join(tmp, "nosteady"), out)
        figs = json.load(open(os.path.splitext(out)[0] + ".json"))["figures"] if r.returncode == 0 else {}
        row = [x for x in r.stdout.splitlines() if x.startswith("| shim deferred | 10.00 |")]
        check(row and row[0].split("|")[5].strip() == "77 calls"
              and figs.get("churn, shim-deferred: VMM calls after the warm-up", {}).get("value") == 77.0
              and "churn, shim-deferred: VMM calls per 100 allocations" not in figs,
              "churn without allocs_steady: the VMM calls in the table and the JSON, no rate (%r)" % row)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
