"""What the Python tests share: the repository root, check() with its tally, printed at the
end as the "N passed, N failed" line that tests/run.sh reads, a scratch directory kept when a
check failed, and headless chromium with a PNG decoder (zlib only) for the tests that render
the HTML report; and ServeProcess, the emulated program that the control tests steer."""
import contextlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "scripts", "vmmshim-report")
REPLAY = os.path.join(ROOT, "scripts", "vmmshim-replay")
# The build the tests run against (BUILD, as make passes it), the shim in it and the emulated
# driver beside it; the Python client's sources and the launcher.
BUILD = os.environ.get("BUILD", "build")
BUILD_DIR = BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD)
LIB = os.path.join(BUILD_DIR, "libvmmshim.so")
EMU = os.path.join(BUILD_DIR, "emu")
PYDIR = os.path.join(ROOT, "scripts", "python")
LAUNCHER = os.path.join(ROOT, "scripts", "vmmshim")
PLAIN_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}  # the tools run without the shim
_tally = {"passed": 0, "failed": 0}


class ServeProcess:
    """tests/test_shim_control.c's "serve" mode (a program under the shim, on the emulation, that
    answers one command a line on stdin) started with env: its pid, ask(), stop()."""

    def __init__(self, env, keep_stderr=False):
        serve = os.path.join(BUILD_DIR, "tests", "test_shim_control")
        self.p = subprocess.Popen([serve, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE if keep_stderr else subprocess.DEVNULL, text=True, env=env)
        line = self.p.stdout.readline().split()
        self.pid = int(line[1]) if len(line) == 2 and line[0] == "ready" else 0

    def ask(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self):
        """Ends it (quit, else killed after 10 s); what it wrote to stderr when kept, else ""."""
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        return self.p.stderr.read() if self.p.stderr else ""


def check(cond, what):
    _tally["passed" if cond else "failed"] += 1
    print(("ok   " if cond else "FAIL ") + what)


def failures():
    return _tally["failed"]


def summary():
    """Prints the closing line; returns the exit status."""
    print("%d passed, %d failed" % (_tally["passed"], _tally["failed"]))
    return 1 if _tally["failed"] else 0


def report(*args, **kw):
    """vmmshim-report run from the checkout's root: its CompletedProcess, output as text."""
    return subprocess.run([sys.executable, REPORT] + list(args), cwd=ROOT, capture_output=True, text=True, **kw)


def launcher(*args, timeout=60, preexec=None):
    """`vmmshim ARGS` (the launcher's tools: ctl, top) without the shim preloaded: (exit status,
    standard output and error together)."""
    r = subprocess.run(["sh", LAUNCHER] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, env=PLAIN_ENV, preexec_fn=preexec)
    return r.returncode, r.stdout + r.stderr


def ctl(*args, timeout=60, preexec=None):
    """`vmmshim ctl ARGS`, as launcher() runs it."""
    return launcher("ctl", *args, timeout=timeout, preexec=preexec)


@contextlib.contextmanager
def scratch(prefix):
    """A new temporary directory (its path: `with scratch(prefix) as tmp:`), removed at the end
    of the with block when no check has failed, else kept and its path printed."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield tmp
    finally:
        if failures() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("files kept in " + tmp)


# ---------------------------------------------------------------- PNG (zlib only)
def png_pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        ln, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + ln]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        pos += 12 + ln
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def colored_pixels(path):
    """Pixels clearly coloured (not white, grey or black): drawn data, not axes or text."""
    w, h, bpp, rows = png_pixels(path)
    n = 0
    for row in rows:
        for x in range(0, w * bpp, bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            if max(r, g, b) - min(r, g, b) > 40:
                n += 1
    return n


def colour_mask(path):
    """The set of (x, y) of clearly coloured pixels: what a chart draws, not its text or axes."""
    w, h, bpp, rows = png_pixels(path)
    out = set()
    for y, row in enumerate(rows):
        for x in range(0, w * bpp, bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            if max(r, g, b) - min(r, g, b) > 40:
                out.add((x // bpp, y))
    return out


def browser():
    """The headless browser, or None (a check fails under CI; elsewhere the caller skips)."""
    b = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not b:
        if os.environ.get("CI") == "true":
            check(False, "chromium is needed to render the HTML report (scripts/deps.sh --test installs it)")
        else:
            print("SKIP html rendering: no chromium (scripts/deps.sh --test installs it); not counted")
    return b


def _chromium(b, args, cwd):
    cmd = [b, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"] + args
    try:
        return subprocess.run(cmd, capture_output=True, timeout=120, cwd=cwd, text=True, errors="replace")
    except subprocess.TimeoutExpired:
        return None


def screenshot(b, url, png, size, cwd):
    """Screenshot of url (a file:// URL, with parameters) into png; True if written."""
    if os.path.exists(png):
        os.unlink(png)
    _chromium(b, ["--screenshot=" + png, "--window-size=%d,%d" % size, url], cwd)
    return os.path.exists(png)


def dump_dom(b, url, cwd, size=None):
    """The page's DOM after its scripts ran ('' on failure); size: the window's (width, height)."""
    r = _chromium(b, ["--dump-dom"] + (["--window-size=%d,%d" % size] if size else []) + [url], cwd)
    return r.stdout if r is not None else ""
