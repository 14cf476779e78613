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


BINARY_UNITS = (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def fmt_bytes(n):
    for unit, div in BINARY_UNITS:
        if n >= div:
            return "%.2f %s" % (n / div, unit)
    return "%d B" % n


def fmt_size(n):
    """Bytes for a reader: three significant digits in the largest binary unit that keeps the
    number at 1 or more, no trailing zeros ("19.8 TiB", "512 MiB", "1.5 KiB", "100 B")."""
    for unit, div in BINARY_UNITS:
        if n >= div:
            v = n / div
            s = "%.0f" % v if v >= 99.95 else "%.1f" % v if v >= 9.995 else "%.2f" % v
            if "." in s:
                s = s.rstrip("0").rstrip(".")
            return "%s %s" % (s, unit)
    return "%d B" % n


def plural(n, word):
    """'1 site', '2 sites'."""
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def fmt_pow2(k):
    n = 1 << k
    for unit, div in BINARY_UNITS:
        if n >= div:
            return "%d %s" % (n // div, unit)
    return "%d B" % n
