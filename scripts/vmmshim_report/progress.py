"""The progress line on a terminal while a trace is read."""

import io
import os
import signal
import sys
import time

from .common import _busy, _shown, fmt_bytes


class Progress:
    """A one-line progress display on stderr, redrawn 4 times a second and erased at stop().
    It shows only when stderr is a terminal, and only once the work has taken longer than
    `delay` seconds (VMMSHIM_PROGRESS_DELAY, default 1). For a regular file it shows the
    percentage of bytes read; for a pipe the bytes read and the rate; with a counter, the
    events per second. An interval timer (SIGALRM) redraws the line: its handler runs in the
    main thread between two bytecodes, so the reading loop pays nothing per event (a
    drawing thread could wait seconds for the GIL behind a busy reading loop)."""

    def __init__(self, prog, enabled=True, stream=None):
        self.prog = prog
        self.stream = stream or sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = enabled and tty and hasattr(signal, "setitimer")
        try:
            self.delay = float(os.environ.get("VMMSHIM_PROGRESS_DELAY", "1"))
        except ValueError:
            self.delay = 1.0
        self.trace = None
        self.counter = None
        self.phase = ""
        self.t0 = time.monotonic()
        self._old = None
        self._on = False
        self._width = 0

    def start(self, trace, counter=None):
        self.trace = trace
        self.counter = counter
        if not self.enabled or self._on:
            return
        try:
            self._old = signal.signal(signal.SIGALRM, self._tick)
        except (ValueError, OSError):  # not the main thread
            self.enabled = False
            return
        self._on = True
        signal.setitimer(signal.ITIMER_REAL, 0.25, 0.25)
        self._tick()

    def set_phase(self, text):
        self.phase = text

    def _text(self):
        el = max(time.monotonic() - self.t0, 1e-6)
        if self.phase:
            return "%s: %s (%.0f s)" % (self.prog, self.phase, el)
        tr = self.trace
        got = tr.bytes_read() if tr is not None else 0
        name = "stdin" if tr is None or tr.path == "-" else os.path.basename(tr.path)
        if tr is not None and tr.size:
            s = "%s: reading %s: %3d %% (%s of %s)" % (self.prog, name, min(100, 100 * got // tr.size),
                                                      fmt_bytes(got), fmt_bytes(tr.size))
        else:
            s = "%s: reading %s: %s (%s/s)" % (self.prog, name, fmt_bytes(got), fmt_bytes(int(got / el)))
        if self.counter is not None:
            n = self.counter()
            s += ", %.1f M events (%.2f M events/s)" % (n / 1e6, n / el / 1e6)
        return s

    def _write(self, text):
        try:
            fd = self.stream.fileno()
            os.write(fd, text.encode("utf-8", "replace"))  # unbuffered: no reentry into the stream's buffer
        except (OSError, ValueError, AttributeError):
            pass

    def _tick(self, signum=None, frame=None):
        if not self._on or _busy[0] or time.monotonic() - self.t0 < self.delay:
            return
        try:
            text = self._text()
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return
        if cols > 1 and len(text) >= cols:  # a wrapped line could not be redrawn in place
            text = text[:cols - 1]
        self._write("\r" + text + "\x1b[K")
        self._width = len(text)
        _shown[0] = self

    def _erase(self):
        if self._width:
            self._write("\r\x1b[K")
            self._width = 0
        _shown[0] = None

    def stop(self):
        if not self._on:
            return
        self._on = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old if self._old is not None else signal.SIG_DFL)
        if _shown[0] is self:
            self._erase()


class _CountingReader(io.RawIOBase):
    """Raw reader of a pipe that counts the bytes it hands out (for the progress line)."""

    def __init__(self, fd):
        self.fd = fd
        self.count = 0

    def readable(self):
        return True

    def readinto(self, b):
        n = os.readv(self.fd, [b])
        self.count += n
        return n
