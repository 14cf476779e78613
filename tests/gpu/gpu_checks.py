"""The checks of the Python GPU tests (tests/gpu/torch_sleep.py, tms_compat.py): one "PASS name"
or "FAIL name: why" line each, as tests/gpu/runner.sh's run_python counts them, and the closing
"PROG: N passed, N failed" line."""
import sys

_counts = {"passed": 0, "failed": 0}


def check(ok, name, why=""):
    if ok:
        _counts["passed"] += 1
        print("PASS %s" % name)
    else:
        _counts["failed"] += 1
        print("FAIL %s: %s" % (name, why))
    sys.stdout.flush()


def failures():
    return _counts["failed"]


def summary(prog):
    """Prints the closing line; the exit status: 1 when a check failed, else 0."""
    print("%s: %d passed, %d failed" % (prog, _counts["passed"], _counts["failed"]))
    return 1 if _counts["failed"] else 0
