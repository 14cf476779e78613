#!/usr/bin/env python3
"""Planted bugs (make mutation): each one applied alone to a copy of the tree, the library and the
tests that concern it rebuilt there, those tests run (tests/run.sh with ONLY), and the bug counted
as caught when one of them fails, or as survived when they all pass. The working tree is never
touched: the copy lives in a scratch directory (MUTATION_DIR, else a new one under $TMPDIR), built
with BUILD=build there.

Each mutation names a snippet of code and its replacement. The snippet is looked for in every
.c and .h file under src/ and include/vmmshim/ (code moves between files; the snippet must not):
it must be found exactly once, or the mutation is reported as "snippet not found" / "snippet
found N times" and counts as a failure of this script, as a mutation that does not compile does
(when code changes, change the snippet here with it). First the copy is built and the tests of
every mutation run on it unchanged: they must pass.

  python3 tests/mutation.py [NAME...]   only those mutations
  MUTATION_TESTS=all                    every CPU test (no sanitizers) for each mutation
  MUTATION_JOBS=N                       make -jN (default 2)
  MUTATION_KEEP=1                       keep the scratch directory

Prints one line per mutation as it goes, then a Markdown table for docs/testing.md. Exits 0 when
every mutation was applied and caught."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class M:
    def __init__(self, name, what, edits, tests):
        self.name = name
        self.what = what
        self.edits = edits  # [(snippet, replacement)]
        self.tests = tests  # names as tests/run.sh prints them


MUTATIONS = [
    M("interior-free", "a free of a pointer inside a block frees the block",
      [("  if (!ptr) return VS_POOL_NOT_OWNED; /* address 0 is the map's anchor */\n",
        "  if (!ptr) return VS_POOL_NOT_OWNED; /* address 0 is the map's anchor */\n"
        "  CUdeviceptr mut_base;\n  size_t mut_len;\n"
        "  if (_vs_pool_range(p, ptr, &mut_base, &mut_len)) ptr = mut_base;\n")],
      ["test_shim_api"]),
    M("merges-skipped", "a freed block never merges with its free neighbours",
      [("  b->state = B_FREE;\n  if (_vs_block_mergeable(p, b->prev, b, B_FREE)) {",
        "  b->state = B_FREE;\n  if (0 && _vs_block_mergeable(p, b->prev, b, B_FREE)) {"),
       ("  if (_vs_block_mergeable(p, b, b->next, B_FREE)) {\n    vs_block_t *c = b->next;\n    _vs_bin_remove(p, c);",
        "  if (0 && _vs_block_mergeable(p, b, b->next, B_FREE)) {\n    vs_block_t *c = b->next;\n    _vs_bin_remove(p, c);")],
      ["test_unit_pool", "test_shim_api"]),
    M("limit-one-growth-over", "VMMSHIM_LIMIT checked without the growth: one growth past the cap",
      [("if (limit && (cur + len < cur || cur + len > limit)) return false;",
        "if (limit && (cur + len < cur || cur > limit)) return false;")],
      ["test_shim_env", "test_shim_stats"]),
    M("owner-access-read", "the owning device gets READ access to new mappings, not READWRITE",
      [("  desc[n].location.id = caps->device;\n  desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;",
        "  desc[n].location.id = caps->device;\n  desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;")],
      ["test_shim_api"]),
    M("trace-drops-frees", "every 100th free is left out of the trace",
      [("  if (vs_unlikely(_vs_trace_on)) at = _vs_trace_place();\n",
        "  static unsigned mut_frees;\n"
        "  if (vs_unlikely(_vs_trace_on) && ++mut_frees % 100) at = _vs_trace_place();\n")],
      ["test_trace_shim"]),
    M("align-128", "blocks rounded and aligned to 128 bytes instead of 256",
      [("size_t size = (req + 255) / 256 * 256;", "size_t size = (req + 127) / 128 * 128;"),
       ("(2ull << 20) : 256u; }", "(2ull << 20) : 128u; }")],
      ["test_shim_api"]),
    M("meminfo-ignores-limit", "cudaMemGetInfo reports the device, not VMMSHIM_LIMIT",
      [("  if (limit) {\n    size_t mapped = _vs_mapped_total();",
        "  if (0 && limit) {\n    size_t mapped = _vs_mapped_total();")],
      ["test_shim_env"]),
    M("deferred-never-reclaimed", "deferred frees stay pending after a synchronisation",
      [("    release_before(p, &p->deferred, done);\n", "")],
      ["test_shim_env"]),
    M("ipc-same-user-removed", "the exporter serves a process of another user",
      [("  return !*foreign || (s->ops.root_too && cred.uid == 0);",
        "  return !*foreign || (s->ops.root_too && cred.uid == 0) || 1;")],
      ["test_shim_ipc"]),
    M("ipc-importer-same-user-removed", "an importer takes handles from a socket of another user",
      [("(cred.uid != geteuid() || (uint32_t)cred.pid", "((uint32_t)cred.pid")],
      ["test_shim_ipc"]),
    M("other-stream-reused", "a request reuses the pending blocks of another stream",
      [("if (vs_likely(s && s->key == key)) return s;", "if (vs_likely(s)) return s;")],
      ["test_shim_api", "test_shim_reuse"]),
    M("event-not-ready-done", "an event not yet complete is taken as complete",
      [("    if (q == CUDA_SUCCESS) {\n", "    if (q == CUDA_SUCCESS || q == CUDA_ERROR_NOT_READY) {\n")],
      ["test_shim_api", "test_shim_reuse"]),
    M("sync-free-no-sync", "a sync-mode cudaFree does not synchronise",
      [("atomic_load(&_vs_captures_active) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : _vs_pool_sync_and_reclaim(p);",
        "atomic_load(&_vs_captures_active) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;")],
      ["test_shim_api", "test_shim_stats"]),
    M("wrong-address-range", "cuMemGetAddressRange gives the served size, not the requested one",
      [("    *base_out = b->addr;\n    *size_out = b->requested;", "    *base_out = b->addr;\n    *size_out = b->size;")],
      ["test_shim_api"]),
    M("peak-mapped-never-updated", "peak_bytes_mapped is not updated when the pool grows",
      [("    _vs_stat_peak(&_vs_stats_data.peak_bytes_mapped, m);\n  }\n  return r;\n}",
        "    (void)m;\n  }\n  return r;\n}")],
      ["test_shim_stats"]),
    M("vmm-calls-never-counted", "vmm_calls is never counted",
      [("  VS_STAT_ADD(vmm_calls, 1);\n", "")],
      ["test_shim_stats"]),
    M("pools-never-counted", "pools is never counted up",
      [("  VS_STAT_ADD(pools, 1);\n", "")],
      ["test_shim_stats"]),
    # The other counters of vmmshim_get_stats, each left alone once.
    M("vmm-ns-never-counted", "vmm_ns is never counted",
      [("  VS_STAT_ADD(vmm_ns, dt);\n", "")],
      ["test_shim_stats"]),
    M("syncs-never-counted", "syncs is never counted",
      [("  VS_STAT_ADD(syncs, 1);\n", "")],
      ["test_shim_stats"]),
    M("trims-never-counted", "a handle released when idle is not counted in trims",
      [("      VS_STAT_ADD(trims, 1);\n", "")],
      ["test_shim_stats"]),
    M("failures-never-counted", "alloc_failures is never counted",
      [("  VS_STAT_ADD(alloc_failures, 1);\n", "")],
      ["test_shim_stats"]),
    M("capture-passthrough-not-counted", "an allocation in a capture is not counted in passthrough_allocs",
      [("    /* Graph memory nodes: addresses fixed for the graph's life, GPU-ordered; the runtime's. */\n"
        "    VS_STAT_ADD(passthrough_allocs, 1);\n",
        "    /* Graph memory nodes: addresses fixed for the graph's life, GPU-ordered; the runtime's. */\n")],
      ["test_shim_stats"]),
    M("peak-in-use-never-updated", "peak_bytes_in_use only follows bytes_in_use",
      [("_vs_stat_peak(&_vs_stats_data.peak_bytes_in_use, (uint64_t)(folded + d));", "(void)folded;")],
      ["test_shim_stats"]),
    M("requested-never-counted", "bytes_requested_in_use does not count allocations",
      [("OWN_ADD(t->requested, (int64_t)requested);", "OWN_ADD(t->requested, 0 * (int64_t)requested);")],
      ["test_shim_stats"]),
]

ALL_TESTS = None  # every CPU test, filled in when MUTATION_TESTS=all


def log(msg):
    print(msg, flush=True)


def run(cmd, cwd, env=None, timeout=None):
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=timeout)
    return p.returncode, p.stdout


def tree_files():
    """The working tree as git sees it (tracked and untracked files, ignored ones left out)."""
    rc, out = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT)
    if rc != 0:
        return None
    return [f for f in out.split("\0") if f and os.path.lexists(os.path.join(ROOT, f))]


def copy_tree(dst):
    files = tree_files()
    if files is None:  # not a git checkout: what the build and the tests need
        files = []
        for top in ("Makefile", "include", "src", "tests", "scripts", "bench"):
            path = os.path.join(ROOT, top)
            if os.path.isfile(path):
                files.append(top)
            for d, dirs, names in os.walk(path):
                dirs[:] = [x for x in dirs if x not in ("__pycache__",)]
                files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    for f in files:
        src, out = os.path.join(ROOT, f), os.path.join(dst, f)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), out)
        else:
            shutil.copy2(src, out)


def code_files(tree):
    """Every .c and .h file under src/ and include/vmmshim/, in subfolders too."""
    out = []
    for sub in ("src", os.path.join("include", "vmmshim")):
        for d, dirs, names in os.walk(os.path.join(tree, sub)):
            dirs.sort()
            out += sorted(os.path.join(d, n) for n in names if n.endswith((".c", ".h")))
    return out


def locate(tree, snippet):
    """[(path, count)] of the files holding the snippet."""
    hits = []
    for path in code_files(tree):
        with open(path) as f:
            n = f.read().count(snippet)
        if n:
            hits.append((path, n))
    return hits


def build_targets(tests):
    """The make targets a mutation needs rebuilt: the library, and the unit tests (they compile
    src/ in); the other test programs do not link src/ and were built with the copy."""
    targets = ["build/libvmmshim.so"]
    for t in tests:
        if t.startswith("test_unit_"):
            targets.append("build/tests/" + t)
    return targets


def make(tree, targets, jobs):
    return run(["make", "-j%d" % jobs, "BUILD=build"] + targets, tree)


def run_tests(tree, tests):
    """(failed test names, missing test names, output) of tests/run.sh limited to `tests`."""
    env = dict(os.environ, BUILD="build", SANITIZE="0", ONLY=" ".join(tests), TEST_TIMEOUT="240")
    for k in [k for k in env if k.startswith("VMMSHIM_")]:
        del env[k]
    rc, out = run(["sh", "tests/run.sh"], tree, env=env)
    ran, failed = set(), []
    for line in out.splitlines():
        m = re.match(r"^(ok  |FAIL) (\S+?):? ", line)
        if m and m.group(2) in tests:  # not the FAIL lines of a test's own output, which run.sh echoes
            ran.add(m.group(2))
            if m.group(1) == "FAIL":
                failed.append(m.group(2))
    missing = [t for t in tests if t not in ran]
    return failed, missing, out


def cpu_tests(tree):
    names = []
    for d, pre in (("build/tests", "test_"),):
        p = os.path.join(tree, d)
        names += sorted(n for n in os.listdir(p) if n.startswith(pre) and "." not in n)
    for n in sorted(os.listdir(os.path.join(tree, "tests", "scripts"))):
        m = re.match(r"^(test_\w+)\.(sh|py)$", n)
        if m:
            names.append(m.group(1))
    return names + ["test_gpu_runner"]


def main(argv):
    jobs = int(os.environ.get("MUTATION_JOBS", "2"))
    chosen = MUTATIONS
    if argv:
        known = {m.name: m for m in MUTATIONS}
        unknown = [a for a in argv if a not in known]
        if unknown:
            log("mutation: unknown mutation(s): %s (known: %s)" % (" ".join(unknown), " ".join(known)))
            return 2
        chosen = [known[a] for a in argv]
    scratch = os.environ.get("MUTATION_DIR")
    if scratch:
        os.makedirs(scratch, exist_ok=True)
    else:
        scratch = tempfile.mkdtemp(prefix="vmmshim-mutation.")
    tree = os.path.join(scratch, "tree")
    if os.path.exists(tree):
        shutil.rmtree(tree)
    log("mutation: copying the tree to %s" % tree)
    copy_tree(tree)
    t_start = time.time()
    try:
        return mutate_all(tree, chosen, jobs, t_start)
    finally:
        if os.environ.get("MUTATION_KEEP") != "1" and not os.environ.get("MUTATION_DIR"):
            shutil.rmtree(scratch, ignore_errors=True)


def mutate_all(tree, chosen, jobs, t_start):
    # The copy, built: the library, the emulation, every test program.
    rc, out = make(tree, ["all", "build/bench/frag_floor"], jobs)
    if rc == 0:
        tests_dir = os.path.join(tree, "tests")
        progs = sorted("build/tests/" + n[:-2] for n in os.listdir(tests_dir)
                       if re.match(r"^test_(shim|static|unit|emu)_\w+\.c$", n))
        rc, out = make(tree, progs, jobs)
    if rc != 0:
        log("mutation: the unchanged copy does not build:\n" + out[-3000:])
        return 2
    every = cpu_tests(tree) if os.environ.get("MUTATION_TESTS") == "all" else None
    for m in chosen:
        if every:
            m.tests = every
    baseline = sorted({t for m in chosen for t in m.tests})
    log("mutation: the unchanged copy, tests: %s" % " ".join(baseline))
    failed, missing, out = run_tests(tree, baseline)
    if failed or missing:
        log("mutation: the tests fail without any mutation (failed: %s; not found: %s):\n%s" %
            (" ".join(failed) or "none", " ".join(missing) or "none", out[-3000:]))
        return 2

    results = []  # (mutation, status, where, detail)
    for m in chosen:
        t0 = time.time()
        status, where, detail = apply_and_test(tree, m, jobs)
        results.append((m, status, where, detail))
        log("mutation %s: %s%s (%.0f s)" % (m.name, status, ": " + detail if detail else "", time.time() - t0))

    caught = sum(1 for r in results if r[1] == "caught")
    survived = [r[0].name for r in results if r[1] == "survived"]
    broken = [r[0].name for r in results if r[1] not in ("caught", "survived")]
    log("")
    log("| mutation | the bug planted | in | tests run | caught by |")
    log("|---|---|---|---|---|")
    for m, status, where, detail in results:
        by = detail if status == "caught" else "**%s**" % (status.upper() if status == "survived" else status)
        log("| %s | %s | %s | %s | %s |" % (m.name, m.what, where or "-", ", ".join(m.tests), by))
    log("")
    log("%d mutations: %d caught, %d survived%s (%.0f s)" %
        (len(results), caught, len(survived), ", %d not applied" % len(broken) if broken else "",
         time.time() - t_start))
    if survived:
        log("survived: " + " ".join(survived))
    if broken:
        log("not applied: " + " ".join(broken))
    return 0 if not survived and not broken else 1


def apply_and_test(tree, m, jobs):
    """Applies m's edits in the copy, rebuilds, runs its tests, restores the files.
    Returns (status, where, detail)."""
    originals = {}
    where = []
    try:
        for snippet, repl in m.edits:
            hits = locate(tree, snippet)
            total = sum(n for _, n in hits)
            if total == 0:
                log("mutation %s: snippet not found in src/ or include/vmmshim/: %r" % (m.name, snippet))
                return "snippet not found", "", ""
            if total > 1:
                places = ", ".join("%s (%d)" % (os.path.relpath(p, tree), n) for p, n in hits)
                log("mutation %s: snippet found %d times (%s): %r" % (m.name, total, places, snippet))
                return "snippet found %d times" % total, "", ""
            path = hits[0][0]
            if path not in originals:
                with open(path) as f:
                    originals[path] = f.read()
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace(snippet, repl, 1))
            rel = os.path.relpath(path, tree)
            if rel not in where:
                where.append(rel)
        rc, out = make(tree, build_targets(m.tests), jobs)
        if rc != 0:
            log("mutation %s: does not compile:\n%s" % (m.name, out[-2000:]))
            return "does not compile", ", ".join(where), ""
        failed, missing, out = run_tests(tree, m.tests)
        if missing:
            log("mutation %s: tests not found: %s" % (m.name, " ".join(missing)))
            return "tests not found", ", ".join(where), " ".join(missing)
        if failed:
            return "caught", ", ".join(where), ", ".join(failed)
        return "survived", ", ".join(where), ""
    finally:
        for path, text in originals.items():
            with open(path, "w") as f:
                f.write(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
