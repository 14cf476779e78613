"""Reading a trace: the native format (versions 1 and 2) and RMM's CSV log, streamed line by
line into normalised event tuples; definitions (modules, strings, stacks) kept as read."""

import bisect
import collections
import io
import os
import stat

from .common import TraceError, warn
from .progress import _CountingReader

FORMAT_VERSION = 2  # the newest native format version this reader understands
RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
READ_BUFFER = 1 << 20  # bytes per read of the trace


class Module(collections.namedtuple("Module", "id lo hi bias buildid path")):
    """An `l` record: a loaded executable or shared object. buildid is None for '-'."""


class Trace:
    """A trace file. events() yields normalised tuples, header fields fill in as read:
    ('a', t_ns, tid, api, dev, stream, ptr, requested, served, stack)   allocation
    ('f', t_ns, tid, api, dev, stream, ptr, served)              free
    ('o', t_ns, tid, api, dev, stream, requested, cuda_error)    failed allocation
    ('m', t_ns, tid, op, dev, va, size, handle, flags, result, duration_ns)  pool event
    api is -1 and dev 0 for rmm traces; stream is None for synchronous calls; stack is the
    id of a `k` record (0: none; always 0 in version-1 and rmm traces).
    Version-2 definitions are collected as read: modules (`l`), strings (`n`),
    stacks (`k`: id -> (module table generation, native IPs, Python frames)) and
    stack_cfg (`t`: (depth, min_size, sample) or None)."""

    def __init__(self, path):
        self.path = path
        self.format = None
        self.version = None
        self.tool = ""
        self.exe = ""
        self.cmd = ""
        self.pid = None
        self.ppid = None
        self.rank = None
        self.start_real_ns = None
        self.end_t = None  # 'e' record seen: the process closed the trace
        self.partial_tail = False
        self.malformed = 0
        self.unknown = collections.Counter()
        self.modules = {}  # id -> Module
        self.mod_tables = [[]]  # per generation: sorted [(lo, hi, Module)]; a new one when ranges overlap
        self.strings = {}  # id -> text
        self.stacks = {}  # id -> (generation, (ip, ...), ((file_id, func_id, line), ...))
        self.stack_cfg = None
        self.size = None  # bytes of a regular file (for the progress line)
        self._counting = None
        if path == "-":
            st = os.fstat(0)
            if stat.S_ISREG(st.st_mode):
                self._f = open(0, "r", buffering=READ_BUFFER, encoding="utf-8", errors="replace", newline="\n",
                               closefd=False)
                self.size = st.st_size
            else:
                self._counting = _CountingReader(0)
                self._f = io.TextIOWrapper(io.BufferedReader(self._counting, READ_BUFFER), encoding="utf-8",
                                           errors="replace", newline="\n")
        else:
            self._f = open(path, "r", buffering=READ_BUFFER, encoding="utf-8", errors="replace", newline="\n")
            st = os.fstat(self._f.fileno())
            if stat.S_ISREG(st.st_mode):
                self.size = st.st_size
        first = self._f.readline()
        if first.startswith("v "):
            parts = first.split()
            try:
                self.version = int(parts[1], 16)
            except (IndexError, ValueError):
                raise TraceError("%s: malformed version line %r" % (path, first.strip()))
            if self.version > FORMAT_VERSION:
                raise TraceError(
                    "%s: trace format version %d is newer than this reader understands (%d); "
                    "use the vmmshim-report of the vmmshim that wrote it" % (path, self.version, FORMAT_VERSION))
            self.format = "native"
            self.tool = " ".join(parts[2:4])
        elif first.strip() == RMM_HEADER:
            self.format = "rmm"
        else:
            raise TraceError("%s: not a vmmshim trace (no version line) nor an RMM log (no CSV header)" % path)

    def bytes_read(self):
        """Bytes of the file read so far (a little ahead of the lines handed out)."""
        if self._counting is not None:
            return self._counting.count
        try:
            return os.lseek(self._f.fileno(), 0, os.SEEK_CUR)
        except (OSError, ValueError):
            return 0

    def _bad(self, line):
        self.malformed += 1
        if self.malformed <= 3:
            warn("%s: malformed line skipped: %r" % (self.path, line[:120]))

    def events(self):
        return self._native() if self.format == "native" else self._rmm()

    def _module(self, line):
        f = line.rstrip("\n").split(" ", 6)
        if len(f) < 7:
            raise ValueError("short l record")
        m = Module(int(f[1], 16), int(f[2], 16), int(f[3], 16), int(f[4], 16),
                   None if f[5] == "-" else f[5].lower(), f[6])
        if m.hi < m.lo:
            raise ValueError("l record: HI < LO")
        self.modules[m.id] = m
        table = self.mod_tables[-1]
        i = bisect.bisect_left(table, (m.lo,))
        overlaps = (i < len(table) and table[i][0] < m.hi) or (i > 0 and table[i - 1][1] > m.lo)
        if overlaps:  # a range reused (dlclose, then dlopen): stacks read from now on use a new table
            table = [e for e in table if e[1] <= m.lo or e[0] >= m.hi]
            self.mod_tables.append(table)
            i = bisect.bisect_left(table, (m.lo,))
        table.insert(i, (m.lo, m.hi, m))

    def _stack(self, line):
        p = line.split()
        sid, nn, npy = int(p[1], 16), int(p[2], 16), int(p[3], 16)
        if len(p) != 4 + nn + 3 * npy or sid == 0:
            raise ValueError("k record: wrong number of frames")
        native = tuple(int(x, 16) for x in p[4:4 + nn])
        q = 4 + nn
        py = tuple((int(p[q + 3 * i], 16), int(p[q + 3 * i + 1], 16), int(p[q + 3 * i + 2], 16)) for i in range(npy))
        self.stacks[sid] = (len(self.mod_tables) - 1, native, py)

    def _native(self):
        unknown = self.unknown
        v2 = self.version >= 2
        for line in self._f:
            if line[-1:] != "\n":
                self.partial_tail = True  # the writer died mid-line: ignore the fragment
                break
            c = line[0:1]
            try:
                if c == "a":
                    if v2:
                        _, t, tid, api, dev, st, ptr, req, srv, stk = line.split()
                        stk = int(stk, 16)
                    else:
                        _, t, tid, api, dev, st, ptr, req, srv = line.split()
                        stk = 0
                    yield ("a", int(t, 16), int(tid, 16), int(api, 16), -1 if dev == "-" else int(dev, 16),
                           None if st == "-" else int(st, 16), int(ptr, 16), int(req, 16), int(srv, 16), stk)
                elif c == "f":
                    _, t, tid, api, dev, st, ptr, srv = line.split()
                    yield ("f", int(t, 16), int(tid, 16), int(api, 16), -1 if dev == "-" else int(dev, 16),
                           None if st == "-" else int(st, 16), int(ptr, 16), int(srv, 16))
                elif c == "m":
                    _, t, tid, op, dev, va, size, handle, flags, res, dur = line.split()
                    yield ("m", int(t, 16), int(tid, 16), int(op, 16), -1 if dev == "-" else int(dev, 16),
                           int(va, 16), int(size, 16), int(handle, 16), int(flags, 16), int(res, 16), int(dur, 16))
                elif c == "k" and v2:
                    self._stack(line)
                elif c == "o":
                    _, t, tid, api, dev, st, req, err = line.split()
                    yield ("o", int(t, 16), int(tid, 16), int(api, 16), -1 if dev == "-" else int(dev, 16),
                           None if st == "-" else int(st, 16), int(req, 16), int(err, 16))
                elif c == "n" and v2:
                    f = line.rstrip("\n").split(" ", 2)
                    self.strings[int(f[1], 16)] = f[2] if len(f) > 2 else ""
                elif c == "l" and v2:
                    self._module(line)
                elif c == "t" and v2:
                    _, depth, minsize, sample = line.split()
                    self.stack_cfg = (int(depth, 16), int(minsize, 16), int(sample, 16))
                elif c == "x":
                    self.exe = line[2:].rstrip("\n")
                elif c == "c":
                    self.cmd = line[2:].rstrip("\n")
                elif c == "p":
                    f = line.split()
                    self.pid, self.ppid, self.rank = int(f[1], 16), int(f[2], 16), int(f[3], 16)
                elif c == "s":
                    self.start_real_ns = int(line.split()[1], 16)
                elif c == "e":
                    self.end_t = int(line.split()[1], 16)
                elif c == "v":
                    self._bad(line)
                else:
                    if c not in unknown:
                        warn("%s: unknown record type %r skipped (written by a newer vmmshim?)" % (self.path, c))
                    unknown[c] += 1
            except (ValueError, IndexError):
                self._bad(line)

    def _rmm(self):
        origin = None
        last = 0
        wrap = 0
        for line in self._f:
            if line[-1:] != "\n":
                self.partial_tail = True
                break
            try:
                tid, tm, action, ptr, size, stream = line.rstrip("\n").split(",")
                hh, mm, ss = tm.split(":")
                tod = ((int(hh) * 60 + int(mm)) * 60) * 1000000000 + int(round(float(ss) * 1e9))
                if tod + wrap < last - 43200 * 10 ** 9:
                    wrap += 86400 * 10 ** 9  # past midnight
                tod += wrap
                last = tod
                if origin is None:
                    origin = tod
                t = tod - origin
                s = int(stream, 16) if stream[:2] in ("0x", "0X") else int(stream)
                s = s or None
                p = int(ptr, 16)
                n = int(size)
                tid = int(tid)
            except ValueError:
                if line.strip() == RMM_HEADER:
                    continue
                self._bad(line)
                continue
            if action == "allocate":
                yield ("a", t, tid, -1, 0, s, p, n, n, 0)
            elif action in ("free", "deallocate"):
                yield ("f", t, tid, -1, 0, s, p, n)
            elif action == "allocate failure":
                yield ("o", t, tid, -1, 0, s, n, 2)
            else:
                if action not in self.unknown:
                    warn("%s: unknown action %r skipped" % (self.path, action))
                self.unknown[action] += 1

    def module_at(self, gen, ip):
        """The Module whose [lo, hi) holds ip in the module table of a stack's generation."""
        table = self.mod_tables[gen]
        i = bisect.bisect_right(table, (ip, float("inf"))) - 1
        if i >= 0 and table[i][0] <= ip < table[i][1]:
            return table[i][2]
        return None
