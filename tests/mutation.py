#!/usr/bin/env python3
"""Planted bugs (make mutation): each one applied alone to a copy of the tree, the library and the
tests that concern it rebuilt there, those tests run (tests/run.sh with ONLY), and the bug counted
as caught when one of them fails, or as survived when they all pass. The tests of a mutation are
those of the files it changes (FILE_TESTS: every test that exercises the file, not only the one
known to catch the bug; every shim and unit test for a file not listed there). The working tree is never
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
    def __init__(self, name, what, edits, tests=None):
        self.name = name
        self.what = what
        self.edits = edits  # [(snippet, replacement)]
        self.tests = tests  # names as tests/run.sh prints them; None: those of the files it changes


# The tests that exercise each file (paths as in the tree): a mutation runs those of every file it
# changes. A file not listed here gets every CPU test of the shim and the units (DEFAULT_TESTS).
FILE_TESTS = {
    "src/base/order.c": ["test_shim_env", "test_shim_api", "test_shim_reuse", "test_shim_threads"],
    "src/hook/hook_drv.c": ["test_shim_gate", "test_shim_env", "test_shim_api", "test_shim_sleep",
                            "test_shim_stats"],
    "src/alloc/sleep.c": ["test_shim_sleep", "test_shim_gate", "test_shim_control", "test_shim_group"],
    "src/pool/asleep.c": ["test_shim_sleep", "test_shim_control", "test_shim_group"],
    "src/handle/group.c": ["test_shim_group"],
    "src/hook/control.c": ["test_shim_control", "test_static_control"],
    "src/hook/control_json.c": ["test_shim_control", "test_static_control"],
    "src/base/gate.c": ["test_shim_gate", "test_shim_sleep"],
    "src/handle/host.c": ["test_shim_sleep", "test_shim_group", "test_shim_control"],
    "src/alloc/mempool.c": ["test_shim_mempool", "test_static_mempool"],
    "src/share/ipc.c": ["test_shim_ipc", "test_shim_sleep"],
    "src/handle/handles.c": ["test_shim_env", "test_shim_stats", "test_shim_api"],
    "src/pool/pool_streams.c": ["test_shim_api", "test_shim_reuse", "test_shim_env"],
    "src/pool/reclaim.c": ["test_shim_env", "test_shim_api", "test_shim_reuse", "test_shim_stats"],
    # where code of the files above is moving to (the server of control.c and ipc.c, the sleep
    # and wake halves of asleep.c, the gated hooks of hook_drv.c)
    "src/base/server.c": ["test_shim_control", "test_static_control", "test_shim_ipc"],
    "src/pool/sleep.c": ["test_shim_sleep", "test_shim_control", "test_shim_group"],
    "src/pool/wake.c": ["test_shim_sleep", "test_shim_control", "test_shim_group"],
    "src/hook/hook_gated.c": ["test_shim_gate", "test_shim_env", "test_shim_api", "test_shim_sleep",
                              "test_shim_stats"],
}
DEFAULT_TESTS = "every test_shim_*, test_static_* and test_unit_* program"

MUTATIONS = [
    # ---- the one-stream order (order.c, the hooks that feed it)
    M("waitvalue-stays-in-order", "cuStreamWaitValue32 counted as work on its own stream, not as a wait on another's",
      [("cuStreamWaitValue32_v2, VS_ORDER_ELSEWHERE", "cuStreamWaitValue32_v2, h")]),
    M("elsewhere-not-ending-order", "work that waits on another stream leaves the one-stream order on",
      [("_vs_order_leave(\"work that spans contexts, or waits on another stream's\", true);", "(void)0;")]),
    M("second-stream-kept", "a submission to a second stream does not end the one-stream order",
      [("if (st == VS_ORDER_ONE) _vs_order_leave(\"a second stream\", false);", "(void)0;")]),
    M("leave-no-host-wait", "a leave that cannot wait on a stream (a capture) does not wait on the host",
      [("if (host || !vs_leave_event) wait_on_host_locked();", "if (!vs_leave_event) wait_on_host_locked();")]),
    # ---- sleep and wake (sleep.c, asleep.c, host.c)
    M("skipped-overwritten", "the bytes a sleep skipped: each pool's overwrites the sum",
      [("res->skipped += mv->skipped;", "res->skipped = mv->skipped;")]),
    M("nohost-skip-per-segment", "a pool's skipped bytes (no host-location VMM): each segment's overwrites the sum",
      [("out->skipped += a.size;", "out->skipped = a.size;")]),
    M("wake-skipped-zero", "a wake that could not bring everything back says nothing is left asleep",
      [("mv.skipped = left;", "mv.skipped = 0;")]),
    M("capture-not-waited", "a sleep does not wait for a stream capture in progress",
      [("while (atomic_load(&_vs_captures_active) > 0) {", "while (0 && atomic_load(&_vs_captures_active) > 0) {")]),
    M("held-block-slept", "a block an importer holds open is moved by a sleep",
      [("    if (overlaps(sg.va, sg.size, skip_va, skip_len, nskip)) {\n      out->skipped += sg.size;",
        "    if (0 && overlaps(sg.va, sg.size, skip_va, skip_len, nskip)) {\n      out->skipped += sg.size;")]),
    M("host-cache-any-size", "a cached host buffer is reused for a block of another size",
      [("((*pp)->buf.size != size || (*pp)->buf.dev != (int)caps->device)", "((*pp)->buf.dev != (int)caps->device)")]),
    M("host-limit-ignores-lent", "VMMSHIM_HOST_LIMIT checked against the new buffer alone, not what is in use",
      [("(vs_host_cached + vs_host_lent <= limit && need <= limit - vs_host_cached - vs_host_lent)", "need <= limit")]),
    # ---- the gate (gate.c, the gated list of hook_gated.c)
    M("memset8-ungated", "cuMemsetD8 (cudaMemset) missing from the gated entry points",
      [("  X(MEMSET8, \"cuMemsetD8\", 3020, 0, cuMemsetD8_v2, NULL, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))    \\\n",
        "")]),
    M("gate-never-closes", "closing the gate stores 0: submissions run while memory moves",
      [("atomic_store(&_vs_gate_closed, 1);", "atomic_store(&_vs_gate_closed, 0);")]),
    # ---- the group budget (group.c)
    M("group-limit-without-growth", "the group's limit checked without the growth: one growth past it",
      [("if (la && (ta > la || len > la - ta)) return false;", "if (la && ta > la) return false;")]),
    M("group-device-limit-ignored", "a per-device group limit is never checked",
      [("if (ld && (td > ld || len > ld - td)) return false;", "if (0 && ld && (td > ld || len > ld - td)) return false;")]),
    M("group-dead-kept", "a member that died keeps its bytes counted",
      [("if (!ok && reclaim_dead(h, vs_b.me)) ok = fits(h, dev, len);", "(void)reclaim_dead;")]),
    # ---- the control channel (control.c, control_json.c)
    M("control-conns-7", "7 controllers at once instead of 8",
      [("#define VS_CTL_MAX_CONNS 8", "#define VS_CTL_MAX_CONNS 7")]),
    M("control-wake-every-tag", "the wake verb ignores its tag and wakes every tag",
      [("vmmshim_wake(tag, zero ? VMMSHIM_WAKE_ZERO : 0, &r, sizeof r);",
        "vmmshim_wake(NULL, zero ? VMMSHIM_WAKE_ZERO : 0, &r, sizeof r);")]),
    M("control-tag-and-all", "a sleep given both a tag and all: true is taken",
      [("if (*tag && *all) {", "if (0) {")]),
    # ---- the stream-ordered pool's attributes (mempool.c)
    M("mempool-used-high-current", "CU_MEMPOOL_ATTR_USED_MEM_HIGH adds the shim's current use, not its high mark",
      [("default: *v += sum.used_high; break;", "default: *v += sum.used; break;")]),
    M("mempool-used-high-reset-wrong", "resetting CU_MEMPOOL_ATTR_USED_MEM_HIGH resets the reserved high mark",
      [("_vs_pool_reset_high(pool, false, true);", "_vs_pool_reset_high(pool, true, false);")]),
    # ---- the pool (older code)
    M("deferred-never-reclaimed", "deferred frees stay pending after a synchronisation",
      [("    release_before(p, &p->deferred, done);\n", "")]),
    M("limit-one-growth-over", "VMMSHIM_LIMIT checked without the growth: one growth past the cap",
      [("if (limit && (cur + len < cur || cur + len > limit)) return false;",
        "if (limit && (cur + len < cur || cur > limit)) return false;")]),
    M("ipc-same-user-removed", "the exporter serves a process of another user",
      [("  return !*foreign || (s->ops.root_too && cred.uid == 0);",
        "  return !*foreign || (s->ops.root_too && cred.uid == 0) || 1;")]),
    M("ipc-importer-same-user-removed", "an importer takes handles from a socket of another user",
      [("(cred.uid != geteuid() || (uint32_t)cred.pid", "((uint32_t)cred.pid")]),
    M("other-stream-reused", "a request reuses the pending blocks of another stream",
      [("if (vs_likely(s && s->key == key)) return s;", "if (vs_likely(s)) return s;")]),
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


def default_tests(tree):
    """Every CPU test program of the shim and the units (no sanitizers, no scripts)."""
    d = os.path.join(tree, "build", "tests")
    return sorted(n for n in os.listdir(d) if re.match(r"^test_(shim|static|unit)_\w+$", n))


def tests_of(tree, m):
    """The tests of the files m's snippets are in (FILE_TESTS), in the order first named; every
    shim and unit test for a file FILE_TESTS does not list. [] when a snippet is not found once
    (the mutation is reported as not applied, and runs nothing)."""
    tests = []
    for snippet, _ in m.edits:
        hits = locate(tree, snippet)
        if len(hits) != 1 or hits[0][1] != 1:
            return []
        rel = os.path.relpath(hits[0][0], tree)
        for t in FILE_TESTS.get(rel) or default_tests(tree):
            if t not in tests:
                tests.append(t)
    return tests


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
        elif m.tests is None:
            m.tests = tests_of(tree, m)
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
