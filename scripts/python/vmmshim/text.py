"""Sizes and rates for people, as `vmmshim ctl` and `vmmshim top` print them, and text from a
process made safe to print."""
import re


def size(n):
    """16.0 MiB, 1.50 GiB, 512 B."""
    n = int(n)
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / float(1 << shift)
            return "%.2f %s" % (v, unit) if v < 10 else "%.1f %s" % (v, unit)
    return "%d B" % n


def short(n):
    """A size in at most 6 characters: 16.0M, 1.50G, 512K, 0."""
    n = int(n)
    if n == 0:
        return "0"
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            v = n / float(1 << shift)
            return "%.2f%s" % (v, unit) if v < 10 else "%.1f%s" % (v, unit) if v < 100 else "%d%s" % (v, unit)
    return "%dB" % n


def count(n):
    """A count in at most 6 characters: 999, 12.3k, 4.5M."""
    n = int(n)
    if n < 100000:
        return str(n)
    if n < 10 ** 7:
        return "%.1fk" % (n / 1e3) if n < 10 ** 6 else "%.2fM" % (n / 1e6)
    return "%.1fM" % (n / 1e6) if n < 10 ** 9 else "%.1fG" % (n / 1e9)


_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)([iI]?)([bB]?)\s*$")


def parse_size(text):
    """Bytes of "8G", "512M", "1048576", "2GiB" (as VMMSHIM_LIMIT takes them); 0 for "none";
    None when malformed."""
    if text.strip().lower() == "none":
        return 0
    m = _SIZE.match(text)
    if not m or (m.group(3) and not m.group(2)):
        return None
    shift = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]
    return int(m.group(1)) << shift


def parse_pids(text):
    """The set of process ids of "12,34"; None when malformed. A process id is decimal digits
    above 0, as `vmmshim ctl PID` takes it: int() would also take "+7", "1_0" and other scripts'
    digits."""
    words = [x.strip() for x in text.split(",") if x.strip()]
    if not all(w.isascii() and w.isdigit() for w in words):
        return None
    pids = {int(w) for w in words}
    return pids if pids and min(pids) > 0 else None


# What a terminal acts on rather than shows: C0 (ESC starts every escape sequence), DEL, C1
# (U+009B is a one-character CSI), the line and paragraph separators and the bidirectional
# overrides (which reorder what follows them). The backslash too, so that an escape in the output
# always came from here.
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(m):
    c = m.group()
    if c == "\\":
        return "\\\\"
    n = ord(c)
    return "\\x%02x" % n if n < 0x100 else "\\u%04x" % n


def clean(s, keep=""):
    """s (a name, a tag, a message from a process: anything it chose) with every character a
    terminal would act on written as an escape (\\x1b, \\x9b, \\u202e, and \\\\ for a backslash),
    so that printing it cannot move the cursor, clear the screen or set the window's title.
    keep: characters left as they are (the newlines of a multi-line report)."""
    if not isinstance(s, str):
        s = str(s)
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m), s)
