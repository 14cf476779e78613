"""Reading a trace: the native format (versions 1 to 4) and RMM's CSV log, streamed line by
line into normalised event tuples; definitions (modules, strings, stacks) kept as read."""

import bisect
import collections
import io
import os
import re
import stat

from .common import TraceError, warn
from .progress import _CountingReader

FORMAT_VERSION = 4  # the newest native format version this reader understands
HOST_MEMORY = 0x80  # an m record's flag: host memory mapped at a device address (a sleeping tag's)
ALIAS = 0x40  # an m record's flag: a second mapping of a device handle (a sleep's copy source)
RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
READ_BUFFER = 1 << 20  # bytes per read of the trace
MAX_DEVICE = 4095  # the largest device ordinal a line may name: a bigger one is out of range
U64 = (1 << 64) - 1
# Module tables (one more each time an `l` record overlaps a module of the newest) hold at most
# this many entries together; a trace past it is malformed (thousands of dlopen/dlclose cycles of
# a thousand modules stay below).
MAX_MODULE_ENTRIES = 1 << 22

# The records of the native format, whole lines as the shim writes them: fields one space apart,
# every number hexadecimal, at most 16 digits (no sign, nothing past 64 bits); a device or a
# stream may be "-" (none). A line is matched first, then split: a match that captures nothing
# costs little.
_H = r"[0-9a-fA-F]{1,16}"
_D = r"(?:-|[0-9a-fA-F]{1,16})"


def _record(kind, *fields):
    return re.compile(r"%s %s\n\Z" % (kind, " ".join(fields)))


A_REC_V1 = _record("a", _H, _H, _H, _D, _D, _H, _H, _H)
A_REC_V2 = _record("a", _H, _H, _H, _D, _D, _H, _H, _H, _H)
F_REC = _record("f", _H, _H, _H, _D, _D, _H, _H)
M_REC = _record("m", _H, _H, _H, _D, _H, _H, _H, _H, _H, _H)
O_REC = _record("o", _H, _H, _H, _D, _D, _H, _H)
T_REC = _record("t", _H, _H, _H)
P_REC = _record("p", _H, _H, _H)
S_REC = _record("s", _H, _H)
E_REC = re.compile(r"e (%s)(?: (%s))?\n\Z" % (_H, _H))  # the cap, when VMMSHIM_TRACE_MAX cut the trace
G_REC = re.compile(r"g %s %s %s - (%s) ([A-Za-z0-9_.-]{1,31})\n\Z" % (_H, _H, _H, _H))
W_REC = _record("w", _H, _H, _H, _D, _H, _H, _H, _H, _H, _H)
H_REC = _record("h", _H, _H, _H, _D, _H, _H, _H, _H, _H)  # a stitch (version 4)
# j: the tag rule that tagged the allocation at PTR (version 4): index, device, PTR, tag, the rule's text.
J_REC = re.compile(r"j (%s) (%s) (%s) (%s) (%s) ([A-Za-z0-9_.-]{1,31}) (.*)\n\Z" % (_H, _H, _H, _D, _H))
B_REC = _record("b", _H, _H, _H, _D, _H, _H, _H, _H)
U_REC = _record("u", _H, _H, _H, _D, _H, _H, _H, _H)
R_REC = _record("r", _H, _H, _H, _D, _H, _H, _H)
RN_REC = re.compile(r"r %s %s f - (%s) ([^ \n]{1,31})\n\Z" % (_H, _H, _H))  # a library's name
K_REC = re.compile(r"k(?: %s){3,}\n\Z" % _H)
N_REC = re.compile(r"n (%s)(?: (.*))?\n\Z" % _H, re.S)  # the text: everything after one space
L_REC = re.compile(r"l (%s) (%s) (%s) (%s) (-|[0-9a-fA-F]{1,128}) (.*)\n\Z" % (_H, _H, _H, _H), re.S)
# An RMM log line: thread, HH:MM:SS.ffffff, action, pointer, size, stream.
RMM_LINE = re.compile(r"(\d{1,20}),(\d{1,2}):(\d\d):(\d\d(?:\.\d{1,9})?),([^,\n]*),((?:0[xX])?[0-9a-fA-F]{1,16}),"
                      r"(\d{1,20}),(0[xX][0-9a-fA-F]{1,16}|[1-9]\d{0,19}|0)\n\Z")


class Module(collections.namedtuple("Module", "id lo hi bias buildid path")):
    """An `l` record: a loaded executable or shared object. buildid is None for '-'."""


def _device(field):
    """A record's device field: -1 for "-", else the ordinal; ValueError past MAX_DEVICE."""
    dev = -1 if field == "-" else int(field, 16)
    if dev > MAX_DEVICE:
        raise ValueError
    return dev


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
    stack_cfg (`t`: (depth, min_size, sample) or None). A line that does not have its record's
    shape, or holds a value out of range (a number past 64 bits or negative, a device past
    MAX_DEVICE, a time of day past 23:59:60), is skipped and counted in `malformed` (the first
    three with a warning): nothing of it reaches the analysis."""

    def __init__(self, path, quiet=False):
        self.path = path
        self.quiet = quiet  # no warnings: a second reading of a file read before
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
        self.cut_at = None  # the cap in bytes, when VMMSHIM_TRACE_MAX cut the trace
        self.tag_names = {}  # tag index -> name ('g' records)
        self.group_ops = collections.Counter()  # 'b' records (version 4) by kind: read, not reported
        self.residue_names = {}  # library index -> name ('r' records of owner f)
        self.partial_tail = False
        self.malformed = 0
        self.unknown = collections.Counter()
        self.modules = {}  # id -> Module
        self.mod_tables = [[]]  # per generation: sorted [(lo, hi, Module)]; a new one when ranges overlap
        self.strings = {}  # id -> text
        self.stacks = {}  # id -> (generation, (ip, ...), ((file_id, func_id, line), ...))
        self.stack_cfg = None
        self._table_entries = 0  # of every module table: each overlap copies the newest
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
            if len(parts) < 2 or not re.fullmatch(r"[0-9a-fA-F]{1,8}", parts[1]) or int(parts[1], 16) < 1:
                raise TraceError("%s: malformed version line %r" % (path, first.strip()[:120]))
            self.version = int(parts[1], 16)
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
        if self.malformed <= 3 and not self.quiet:
            warn("%s: malformed line skipped: %r" % (self.path, line[:120]))

    def events(self):
        return self._native() if self.format == "native" else self._rmm()

    def _module(self, line):
        m = L_REC.match(line)
        if m is None:
            raise ValueError("l record")
        mid, lo, hi, bias, buildid, path = m.groups()
        m = Module(int(mid, 16), int(lo, 16), int(hi, 16), int(bias, 16), None if buildid == "-" else buildid.lower(),
                   path)
        if m.hi < m.lo:
            raise ValueError("l record: HI < LO")
        table = self.mod_tables[-1]
        i = bisect.bisect_left(table, (m.lo,))
        overlaps = (i < len(table) and table[i][0] < m.hi) or (i > 0 and table[i - 1][1] > m.lo)
        if overlaps:  # a range reused (dlclose, then dlopen): stacks read from now on use a new table
            table = [e for e in table if e[1] <= m.lo or e[0] >= m.hi]
            if self._table_entries + len(table) >= MAX_MODULE_ENTRIES:
                raise ValueError("l record: too many module tables")
            self.mod_tables.append(table)
            self._table_entries += len(table)
            i = bisect.bisect_left(table, (m.lo,))
        table.insert(i, (m.lo, m.hi, m))
        self._table_entries += 1
        self.modules[m.id] = m

    def _stack(self, line):
        if K_REC.match(line) is None:
            raise ValueError("k record")
        p = line.split()
        sid, nn, npy = int(p[1], 16), int(p[2], 16), int(p[3], 16)
        if len(p) != 4 + nn + 3 * npy or sid == 0:
            raise ValueError("k record: wrong number of frames")
        native = tuple(int(x, 16) for x in p[4:4 + nn])
        q = 4 + nn
        py = tuple((int(p[q + 3 * i], 16), int(p[q + 3 * i + 1], 16), int(p[q + 3 * i + 2], 16)) for i in range(npy))
        self.stacks[sid] = (len(self.mod_tables) - 1, native, py)

    def _native(self):
        """The events of a native trace. Each line must match its record's pattern (hexadecimal
        fields of at most 16 digits: no sign, nothing past 64 bits) and name a device below
        MAX_DEVICE; any other line is skipped and counted (malformed)."""
        unknown = self.unknown
        v2 = self.version >= 2
        a_rec = A_REC_V2 if v2 else A_REC_V1
        for line in self._f:
            if line[-1:] != "\n":
                self.partial_tail = True  # the writer died mid-line: ignore the fragment
                break
            c = line[0:1]
            try:
                if c == "a":
                    if a_rec.match(line) is None:
                        raise ValueError
                    if v2:
                        _, t, tid, api, dev, st, ptr, req, srv, stk = line.split()
                        stk = int(stk, 16)
                    else:
                        _, t, tid, api, dev, st, ptr, req, srv = line.split()
                        stk = 0
                    dev = _device(dev)
                    yield ("a", int(t, 16), int(tid, 16), int(api, 16), dev, None if st == "-" else int(st, 16),
                           int(ptr, 16), int(req, 16), int(srv, 16), stk)
                elif c == "f":
                    if F_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, api, dev, st, ptr, srv = line.split()
                    dev = _device(dev)
                    yield ("f", int(t, 16), int(tid, 16), int(api, 16), dev, None if st == "-" else int(st, 16),
                           int(ptr, 16), int(srv, 16))
                elif c == "m":
                    if M_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, op, dev, va, size, handle, flags, res, dur = line.split()
                    dev = _device(dev)
                    yield ("m", int(t, 16), int(tid, 16), int(op, 16), dev, int(va, 16), int(size, 16),
                           int(handle, 16), int(flags, 16), int(res, 16), int(dur, 16))
                elif c == "k" and v2:
                    self._stack(line)
                elif c == "o":
                    if O_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, api, dev, st, req, err = line.split()
                    dev = _device(dev)
                    yield ("o", int(t, 16), int(tid, 16), int(api, 16), dev, None if st == "-" else int(st, 16),
                           int(req, 16), int(err, 16))
                elif c == "n" and v2:
                    m = N_REC.match(line)
                    if m is None:
                        raise ValueError
                    self.strings[int(m.group(1), 16)] = m.group(2) or ""
                elif c == "l" and v2:
                    self._module(line)
                elif c == "t" and v2:
                    if T_REC.match(line) is None:
                        raise ValueError
                    self.stack_cfg = tuple(int(x, 16) for x in line.split()[1:])
                elif c == "x":
                    self.exe = line[2:].rstrip("\n")
                elif c == "c":
                    self.cmd = line[2:].rstrip("\n")
                elif c == "p":
                    if P_REC.match(line) is None:
                        raise ValueError
                    self.pid, self.ppid, self.rank = (int(x, 16) for x in line.split()[1:])
                elif c == "s":
                    if S_REC.match(line) is None:
                        raise ValueError
                    self.start_real_ns = int(line.split()[1], 16)
                elif c == "e":
                    m = E_REC.match(line)
                    if m is None:
                        raise ValueError
                    self.end_t = int(m.group(1), 16)
                    if m.group(2) is not None:
                        self.cut_at = int(m.group(2), 16)
                elif c == "g":
                    m = G_REC.match(line)
                    if m is None:
                        raise ValueError
                    self.tag_names[int(m.group(1), 16)] = m.group(2)
                elif c == "w":
                    if W_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, kind, _dev, tag, mode, dbytes, hbytes, res, dur = line.split()
                    tag, res = int(tag, 16), int(res, 16)
                    if res >= 1 << 32:
                        raise ValueError
                    yield ("w", int(t, 16), int(tid, 16), int(kind, 16), tag,
                           "every tag" if tag == (1 << 64) - 1 else self.tag_names.get(tag, "#%d" % tag),
                           int(mode, 16), int(dbytes, 16), int(hbytes, 16), res - (1 << 32) if res >= 1 << 31 else res,
                           int(dur, 16))
                elif c == "h":
                    if H_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, _sub, dev, va, size, handles, fresh, dur = line.split()
                    dev = _device(dev)
                    size, fresh = int(size, 16), int(fresh, 16)
                    if fresh > size:
                        raise ValueError
                    yield ("h", int(t, 16), int(tid, 16), dev, int(va, 16), size, int(handles, 16), fresh,
                           int(dur, 16))
                elif c == "j" and self.version >= 4:
                    m = J_REC.match(line)
                    if m is None:
                        raise ValueError
                    if m.group(4) != "-" and int(m.group(4), 16) > MAX_DEVICE:
                        raise ValueError
                    # ("j", t, tid, ptr, tag, rule text): the rule of the next allocation at ptr
                    yield ("j", int(m.group(1), 16), int(m.group(2), 16), int(m.group(5), 16), m.group(6), m.group(7))
                elif c == "b":
                    m = B_REC.match(line)
                    if m is None:
                        raise ValueError
                    self.group_ops[int(line.split()[3], 16)] += 1
                elif c == "u":
                    if U_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, op, dev, key, size, caller, stk = line.split()
                    dev = _device(dev)
                    yield ("u", int(t, 16), int(tid, 16), int(op, 16), dev, int(key, 16), int(size, 16),
                           int(caller, 16), int(stk, 16))
                elif c == "r":
                    m = RN_REC.match(line)
                    if m is not None:
                        self.residue_names[int(m.group(1), 16)] = m.group(2)
                        continue
                    if R_REC.match(line) is None:
                        raise ValueError
                    _, t, tid, owner, dev, seq, nbytes, lib = line.split()
                    dev = _device(dev)
                    yield ("r", int(t, 16), int(tid, 16), int(owner, 16), dev, int(seq, 16), int(nbytes, 16),
                           int(lib, 16))
                elif c == "v":
                    self._bad(line)
                else:
                    if c not in unknown and not self.quiet:
                        warn("%s: unknown record type %r skipped (written by a newer vmmshim?)" % (self.path, c))
                    unknown[c] += 1
            except (ValueError, IndexError):
                self._bad(line)

    def _rmm(self):
        """The events of an RMM log. Each line must match RMM_LINE (a time of day, decimal sizes
        and thread ids, hexadecimal pointers, nothing past 64 bits); any other line is skipped and
        counted (malformed), repeated headers silently."""
        origin = None
        last = 0
        wrap = 0
        for line in self._f:
            if line[-1:] != "\n":
                self.partial_tail = True
                break
            m = RMM_LINE.match(line)
            if m is None or int(m.group(1)) > U64 or int(m.group(7)) > U64 or int(m.group(8), 0) > U64 \
                    or int(m.group(2)) > 23 or int(m.group(3)) > 59 or float(m.group(4)) >= 61:
                if line.strip() != RMM_HEADER:
                    self._bad(line)
                continue
            tid, hh, mm, ss, action, ptr, size, stream = m.groups()
            tod = ((int(hh) * 60 + int(mm)) * 60) * 1000000000 + int(round(float(ss) * 1e9))
            if tod + wrap < last - 43200 * 10 ** 9:
                wrap += 86400 * 10 ** 9  # past midnight
            tod += wrap
            last = tod
            if origin is None:
                origin = tod
            t = tod - origin
            s = int(stream, 0) or None
            p = int(ptr, 16)
            n = int(size)
            tid = int(tid)
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
