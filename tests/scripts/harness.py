"""What the Python tests share: the repository root, and check() with its tally, printed at the
end as the "N passed, N failed" line that tests/run.sh reads."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_tally = {"passed": 0, "failed": 0}


def check(cond, what):
    _tally["passed" if cond else "failed"] += 1
    print(("ok   " if cond else "FAIL ") + what)


def failures():
    return _tally["failed"]


def summary():
    """Prints the closing line; returns the exit status."""
    print("%d passed, %d failed" % (_tally["passed"], _tally["failed"]))
    return 1 if _tally["failed"] else 0
