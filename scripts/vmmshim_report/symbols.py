"""Frames and the symboliser: module-relative addresses into function, file and line, with one
addr2line run per module."""

import collections
import os
import re
import shutil
import subprocess

from .common import warn


class Frame(collections.namedtuple("Frame", "py text module offset func file line lib interp")):
    """One frame of a stack, innermost first in every list. py: a Python frame. text: how the
    report shows it. module: the module path of a native frame ('' if the address is in no
    module). offset: the return address minus the module's bias. func, file, line: what the
    symboliser found (None when nothing). lib: a native frame of CUDA's libraries, the C
    library or the shim, or a Python frame of an installed package or the standard library
    (passed over when choosing a call site). interp: a frame of the Python
    interpreter itself (python3.x or libpython)."""


LIB_MODULE_RE = re.compile(r"^(libcuda\.so|libcudart\.so|libcublas(Lt)?\.so|libc\.so|libc-[0-9.]+\.so|"
                           r"ld-linux[^/]*\.so|libvmmshim\.so)")
LIB_FUNC_RE = re.compile(r"^(cuda|__cuda|cudart::|cu[A-Z_]|cublas)")
# Python files of installed packages and of the standard library (a frame of the program's own
# code names its site before them).
PY_LIB_FILE_RE = re.compile(r"(/(site|dist)-packages/|/lib/python[0-9.]+/|^<frozen )")
INTERP_MODULE_RE = re.compile(r"^(python[0-9.]*|libpython[0-9.]*\.so.*)$")
DISCRIMINATOR_RE = re.compile(r" \(discriminator \d+\)$")
LOCATION_RE = re.compile(r"^(.*?):(\d+)(?::\d+)?$")  # file:line (binutils), file:line:column (elfutils)
EU_INLINED_RE = re.compile(r" inlined at .* in .*$")  # elfutils: "f inlined at file:line:col in g"


def native_text(module, offset, func, file, line, ip):
    base = os.path.basename(module) if module else ""
    if func and file:
        return "%s:%d %s" % (file, line, func)
    if func:
        return "%s in %s" % (func, base or "?")
    if module:
        return "%s+0x%x" % (base, offset)
    return "0x%x" % ip


def native_frame(module, offset, func, file, line, ip):
    base = os.path.basename(module) if module else ""
    lib = bool(LIB_MODULE_RE.match(base) or (func and LIB_FUNC_RE.match(func)))
    return Frame(False, native_text(module, offset, func, file, line, ip), module, offset, func, file, line, lib,
                 bool(INTERP_MODULE_RE.match(base)))


class Symboliser:
    """Turns module-relative addresses into function, file and line with one addr2line run per
    module file (all its addresses on stdin). A file is used only when its GNU build-id
    (read with readelf -n) matches the one in the trace, when both are known; a debug file
    found by build-id under --debug-dir DIRs or /usr/lib/debug/.build-id is preferred, and a
    copy under --sysroot DIR comes before the path itself.
    Results are cached per (path, build-id). Problems give one warning per module and
    leave its frames as module+offset."""

    def __init__(self, addr2line=None, debug_dirs=(), sysroot=""):
        self.prog = addr2line or shutil.which("addr2line") or shutil.which("eu-addr2line")
        if addr2line and not shutil.which(addr2line):
            self.prog = None
        self.readelf = shutil.which("readelf") or shutil.which("eu-readelf")
        self.debug_dirs = list(debug_dirs) + ["/usr/lib/debug"]
        self.sysroot = sysroot or ""
        self.cache = {}  # (path, buildid) -> {offset: [(func, file, line), ...] innermost first}
        self.files = {}  # (path, buildid) -> file to give addr2line, or None
        self.ids = {}  # file -> its build-id (None if it has none)
        self.warned = set()
        self.runs = 0  # addr2line processes started (for the tests)
        self.env = dict(os.environ, LC_ALL="C")

    def _warn_once(self, key, msg):
        if key not in self.warned:
            self.warned.add(key)
            warn(msg)

    def build_id(self, path):
        if path in self.ids:
            return self.ids[path]
        bid = None
        if self.readelf:
            try:
                r = subprocess.run([self.readelf, "-n", path], capture_output=True, text=True, env=self.env,
                                   errors="replace")
                m = re.search(r"Build ID:\s*([0-9a-fA-F]+)", r.stdout)
                bid = m.group(1).lower() if m else None
            except OSError:
                bid = None
        self.ids[path] = bid
        return bid

    def _file_for(self, path, buildid):
        key = (path, buildid)
        if key in self.files:
            return self.files[key]
        f = None
        if path.startswith("[") or not path:  # [vdso] and the like: nothing on disk
            self.files[key] = None
            return None
        if buildid and len(buildid) > 2:
            for d in self.debug_dirs:
                cand = os.path.join(d, ".build-id", buildid[:2], buildid[2:] + ".debug")
                if os.path.isfile(cand):
                    f = cand
                    break
        if f is None:
            local = path
            if self.sysroot and os.path.isfile(os.path.join(self.sysroot, path.lstrip("/"))):
                local = os.path.join(self.sysroot, path.lstrip("/"))
            if not os.path.isfile(local):
                self._warn_once(key, "%s: not found; its frames are shown as module+offset" % local)
            else:
                actual = self.build_id(local) if buildid else None
                if buildid and self.readelf is None:
                    self._warn_once("readelf", "readelf not found: build-ids are not checked")
                if buildid and actual and actual != buildid:
                    self._warn_once(key, "%s: build-id %s differs from the trace's %s (rebuilt or replaced since "
                                         "the run?); its frames are shown as module+offset" % (local, actual, buildid))
                else:
                    f = local
        self.files[key] = f
        return f

    def resolve(self, wanted):
        """wanted: {(path, buildid): set(offsets)}; runs addr2line for what is not cached yet."""
        todo = []
        for key, offs in wanted.items():
            cached = self.cache.setdefault(key, {})
            need = sorted(o for o in offs if o not in cached)
            if need:
                todo.append((key, need))
        if todo and self.prog is None:
            self._warn_once("noprog", "no addr2line found (install binutils, or pass --addr2line); "
                                      "native frames are shown as module+offset")
            return
        for key, need in todo:
            f = self._file_for(*key)
            cached = self.cache[key]
            if f is None:
                for o in need:
                    cached[o] = []
                continue
            res = self._run(f, need)
            if res is None:
                self._warn_once(key, "%s: %s could not read it; its frames are shown as module+offset"
                                % (f, os.path.basename(self.prog)))
                res = {}
            for o in need:
                cached[o] = res.get(o, [])

    def _run(self, path, offsets):
        """{offset: [(func, file, line), ...]} from one addr2line run; None if it failed.
        Each offset is looked up as offset-1 (return addresses point after the call)."""
        query = [max(o - 1, 0) for o in offsets]
        self.runs += 1
        try:
            r = subprocess.run([self.prog, "-f", "-C", "-i", "-a", "-e", path],
                               input="".join("0x%x\n" % q for q in query), capture_output=True, text=True,
                               env=self.env, errors="replace")
        except OSError:
            return None
        if r.returncode != 0:
            return None
        lines = r.stdout.splitlines()
        out = {}
        pos = 0
        for k, q in enumerate(query):
            nxt = query[k + 1] if k + 1 < len(query) else None
            while pos < len(lines) and not _is_addr(lines[pos], q):
                pos += 1
            if pos >= len(lines):
                break
            pos += 1
            chain = []
            while pos < len(lines) and not (nxt is not None and _is_addr(lines[pos], nxt)):
                func = lines[pos].strip()
                loc = lines[pos + 1].strip() if pos + 1 < len(lines) else "??:0"
                pos += 2
                m = LOCATION_RE.match(DISCRIMINATOR_RE.sub("", loc))
                file, ln = (m.group(1), int(m.group(2))) if m else (None, 0)
                func = EU_INLINED_RE.sub("", func)
                if func in ("??", ""):
                    func = None
                if file in ("??", "") or ln == 0:
                    file, ln = None, 0
                chain.append((func, file, ln))
            if any(fn or fl for fn, fl, _ in chain):
                out[offsets[k]] = chain
        return out


def _is_addr(s, value):
    s = s.strip()
    if not s.startswith("0x"):
        return False
    try:
        return int(s, 16) == value
    except ValueError:
        return False
