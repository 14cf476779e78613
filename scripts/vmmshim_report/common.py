"""What every part of vmmshim-report shares: the program name in messages, the error for a
trace it cannot read, warnings (which erase the progress line first) and byte formats."""

import sys

PROG = "vmmshim-report"  # in warnings; vmmshim-replay, which uses the reader, sets its own name


def set_prog(name):
    global PROG
    PROG = name


class TraceError(Exception):
    pass


_shown = [None]  # the Progress whose line is on the terminal now, if any
_busy = [False]  # a warning is being written: the progress line waits


def warn(msg):
    _busy[0] = True
    try:
        if _shown[0] is not None:
            _shown[0]._erase()
        print("%s: warning: %s" % (PROG, msg), file=sys.stderr)
    finally:
        _busy[0] = False


def fmt_bytes(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return "%.2f %s" % (n / div, unit)
    return "%d B" % n


def fmt_pow2(k):
    n = 1 << k
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return "%d %s" % (n // div, unit)
    return "%d B" % n
