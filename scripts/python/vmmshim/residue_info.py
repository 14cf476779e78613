"""The residue: what is still on each device, and who owns it (docs/sleep.md, "Residue").

vmmshim.residue() asks the shim in this process (vmmshim_residue of include/vmmshim.h);
`vmmshim ctl PID residue` asks another process over the control channel, and residue_text()
writes either answer for people. Both answers have the same members."""
import ctypes
import errno

from . import text

DEVICES, LIBS, SITES = 8, 8, 8
KINDS = ("vmm", "managed", "host", "arrays")
OWNERS = ("tags", "libraries", "managed", "graphs", "arrays", "context", "modules", "inferred", "other_processes",
          "unexplained")


class _Device(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("measured", ctypes.c_int)] + [
        (n, ctypes.c_uint64) for n in ("total", "free", "used", "tags", "libraries", "managed", "graph", "arrays",
                                       "context", "others")] + [("unexplained", ctypes.c_int64), ("growth", ctypes.c_int64)] + [
        (n, ctypes.c_uint64) for n in ("modules", "process", "inferred")]


class _Lib(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("vmm", ctypes.c_uint64), ("managed", ctypes.c_uint64),
                ("host", ctypes.c_uint64), ("arrays", ctypes.c_uint64)]


class _Site(ctypes.Structure):
    _fields_ = [("lib", ctypes.c_char * 64), ("addr", ctypes.c_uint64), ("stack", ctypes.c_uint32),
                ("python", ctypes.c_char * 96), ("kind", ctypes.c_int), ("bytes", ctypes.c_uint64),
                ("growth", ctypes.c_int64), ("offset", ctypes.c_uint64), ("symbol", ctypes.c_char * 64)]


class _Residue(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_uint64), ("ndevices", ctypes.c_int), ("nlibs", ctypes.c_int),
                ("nsites", ctypes.c_int), ("devices", _Device * DEVICES), ("libs", _Lib * LIBS),
                ("sites", _Site * SITES), ("host_pinned", ctypes.c_uint64), ("shared", ctypes.c_uint64),
                ("others_known", ctypes.c_int), ("note", ctypes.c_char * 160)]


def _as_dict(r):
    """The C struct as the control verb's reply has it."""
    devs = []
    for d in r.devices[:min(r.ndevices, DEVICES)]:
        owners = {"tags": d.tags, "libraries": d.libraries, "managed": d.managed, "graphs": d.graph,
                  "arrays": d.arrays, "context": d.context, "modules": d.modules, "inferred": d.inferred,
                  "other_processes": d.others, "unexplained": d.unexplained}
        devs.append({"device": d.device, "measured": bool(d.measured), "total": d.total, "free": d.free,
                     "used": d.used, "owners": owners, "growth": d.growth, "process": d.process})
    libs = [{"name": lb.name.decode("utf-8", "replace"), "vmm": lb.vmm, "managed": lb.managed, "host": lb.host,
             "arrays": lb.arrays}
            for lb in r.libs[:min(r.nlibs, LIBS)]]
    sites = [{"library": s.lib.decode("utf-8", "replace"), "address": "0x%x" % s.addr, "offset": "0x%x" % s.offset,
              "symbol": s.symbol.decode("utf-8", "replace"),
              "kind": KINDS[s.kind] if 0 <= s.kind < len(KINDS) else "vmm", "bytes": s.bytes, "growth": s.growth,
              "stack": s.stack, "python": s.python.decode("utf-8", "replace")}
             for s in r.sites[:min(r.nsites, SITES)]]
    return {"sleeps": r.seq, "devices": devs, "libraries": libs, "sites": sites, "host_pinned": r.host_pinned,
            "shared": r.shared, "other_processes_known": bool(r.others_known),
            "note": r.note.decode("utf-8", "replace")}


def residue(lib):
    """The residue now, from the shim in this process (lib: the loaded library's handle)."""
    fn = getattr(lib, "vmmshim_residue", None)
    if fn is None:
        raise AttributeError("vmmshim_residue: the preloaded shim is older than API version 5")
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(_Residue), ctypes.c_size_t]
    r = _Residue()
    rc = fn(ctypes.byref(r), ctypes.sizeof(r))
    if rc:
        raise OSError(-rc, "vmmshim_residue: %s" % errno.errorcode.get(-rc, str(-rc)))
    return _as_dict(r)


def residue_text(pid, r):
    """A residue (either source) for people."""
    c = text.clean
    lines = ["pid %d: residue after %d sleep%s" % (pid, r["sleeps"], "" if r["sleeps"] == 1 else "s")]
    lines.append("%-6s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s" % (
        "DEVICE", "USED", "TAGS", "LIBS", "MANAGED", "GRAPHS", "ARRAYS", "CONTEXT", "MODULES", "INFERRED", "OTHERS",
        "UNEXPL", "TOTAL", "GROWTH"))
    for d in r["devices"]:
        o = d["owners"]
        signed = lambda n: ("-" + text.short(-n)) if n < 0 else text.short(n)  # noqa: E731
        lines.append("%-6d %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s" % (
            d["device"], text.short(d["used"]) if d["measured"] else "?", text.short(o["tags"]),
            text.short(o["libraries"]), text.short(o["managed"]), text.short(o["graphs"]),
            text.short(o.get("arrays", 0)), text.short(o["context"]), text.short(o.get("modules", 0)),
            text.short(o.get("inferred", 0)),
            text.short(o["other_processes"]), signed(o["unexplained"]) if d["measured"] else "?",
            text.short(d["total"]), signed(d["growth"])))
    for lb in r["libraries"]:
        lines.append("library %s: VMM %s, managed %s, pinned host %s, arrays %s" % (
            c(lb["name"]), text.size(lb["vmm"]), text.size(lb["managed"]), text.size(lb["host"]),
            text.size(lb.get("arrays", 0))))
    for s in r["sites"]:
        grew = (", grew %s since the first sleep" % text.size(s["growth"])) if s["growth"] > 0 else ""
        py = (" (%s)" % c(s["python"])) if s.get("python") else ""
        # The offset in the library (the same in every process); an older shim gives only the address.
        where = c(s.get("offset", s["address"])) + ((" (%s)" % c(s["symbol"])) if s.get("symbol") else "")
        lines.append("site %s+%s%s: %s %s%s" % (c(s["library"]), where, py, text.size(s["bytes"]), s["kind"], grew))
    if r["host_pinned"]:
        lines.append("pinned host memory made outside the pools: %s" % text.size(r["host_pinned"]))
    if r["shared"]:
        lines.append("of the libraries' VMM memory, exported or imported: %s" % text.size(r["shared"]))
    if r["note"]:
        lines.append("note: %s" % c(r["note"]))
    return "\n".join(lines)
