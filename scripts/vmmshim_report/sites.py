"""Call sites: the stacks of a trace symbolised, the rule that names an allocation's site,
and the per-site sums and tables (the --by-site section)."""

import collections
import re

from .common import fmt_bytes, plural
from .symbols import PY_LIB_FILE_RE, Frame, Symboliser, native_frame

NO_STACKS = "no stacks in this trace (run with VMMSHIM_TRACE_STACKS=N)"


class Stacks:
    """The stacks of a trace, symbolised: frames(sid) gives (native frames, Python frames),
    each innermost first, native frames expanded with their inlined callers."""

    def __init__(self, trace, symboliser=None, progress=None):
        self.trace = trace
        self.sym = symboliser or Symboliser()
        self.cache = {}
        self.native = {}  # (gen, ip) -> [Frame]
        self._symbolise(progress)

    def _symbolise(self, progress):
        tr = self.trace
        ips = set()
        for gen, native, py in tr.stacks.values():
            for ip in native:
                ips.add((gen, ip))
        wanted = collections.defaultdict(set)
        where = {}
        for gen, ip in ips:
            m = tr.module_at(gen, ip)
            where[(gen, ip)] = m
            if m is not None:
                wanted[(m.path, m.buildid)].add(ip - m.bias)
        if progress is not None:
            progress.set_phase("symbolising %d addresses in %d modules" % (len(ips), len(wanted)))
        self.sym.resolve(wanted)
        for (gen, ip), m in where.items():
            if m is None:
                self.native[(gen, ip)] = [native_frame("", 0, None, None, 0, ip)]
                continue
            off = ip - m.bias
            chain = self.sym.cache.get((m.path, m.buildid), {}).get(off) or [(None, None, 0)]
            self.native[(gen, ip)] = [native_frame(m.path, off, fn, fl, ln, ip) for fn, fl, ln in chain]

    def frames(self, sid):
        """(native, python) frame lists of stack sid, innermost first; None if not in the trace."""
        got = self.cache.get(sid)
        if got is not None:
            return got
        rec = self.trace.stacks.get(sid)
        if rec is None:
            return None
        gen, native, py = rec
        nat = []
        for ip in native:
            nat.extend(self.native[(gen, ip)])
        strings = self.trace.strings
        pyf = []
        for fid, nid, line in py:
            file = strings.get(fid, "?")
            func = strings.get(nid, "?")
            pyf.append(Frame(True, "%s:%d %s" % (file, line, func), "", 0, func, file, line,
                             bool(PY_LIB_FILE_RE.search(file or "")), False))
        got = (nat, pyf)
        self.cache[sid] = got
        return got

    def full(self, sid):
        """One stack, innermost first, for the flame graph and Perfetto: when there are Python
        frames, the native frames called from Python (those inner to the innermost frame of the
        interpreter), then the Python frames; the interpreter's own native frames are left out
        (the Python frames stand for them). Without Python frames: the native frames."""
        got = self.frames(sid)
        if got is None:
            return []
        nat, pyf = got
        if not pyf:
            return nat
        cut = len(nat)
        for i, f in enumerate(nat):
            if f.interp:
                cut = i
                break
        return nat[:cut] + pyf

    def viz(self, sid):
        """memory_viz frames: Python frames first (innermost first), then every native frame."""
        got = self.frames(sid)
        if got is None:
            return []
        nat, pyf = got
        out = [{"filename": f.file, "line": f.line, "name": f.func} for f in pyf]
        for f in nat:
            out.append({"filename": f.file or f.module or "??", "line": f.line or 0,
                        "name": f.func or f.text})
        return out


NO_STACK = "(no stack)"  # the site of allocations whose stack was not captured (stack id 0)
EMPTY_STACK = "(empty stack)"  # the site of a stack captured with no frame


def stackless_name(sid):
    """The site and frame name of stack sid when it has no frames to show: none captured (0),
    or an id without its `k` record."""
    return NO_STACK if sid == 0 else "(unknown stack %x)" % sid


class SiteRule:
    """Which frames name an allocation's call site (README "Call sites")."""

    def __init__(self, skip=(), depth=1, py_libs=False):
        self.skip = [re.compile(s) for s in skip]
        self.depth = max(1, depth)
        self.py_libs = py_libs  # Python frames of packages and the standard library can be sites

    def skipped(self, f, default=True):
        if default and f.lib and not (f.py and self.py_libs):
            return True
        for r in self.skip:
            if r.search(f.text) or (f.module and r.search(f.module)):
                return True
        return False

    def site(self, stacks, sid):
        got = stacks.frames(sid) if sid != 0 else None
        if got is None:
            return stackless_name(sid)
        nat, pyf = got
        chosen = [f for f in pyf if not self.skipped(f)][:self.depth]
        if not chosen:  # only frames of packages and the standard library: the innermost of them
            chosen = [f for f in pyf if not self.skipped(f, default=False)][:self.depth]
        if not chosen:
            chosen = [f for f in nat if not self.skipped(f)][:self.depth]
        if not chosen:
            if not nat and not pyf:
                return EMPTY_STACK
            chosen = (nat or pyf)[:1]  # every frame skipped: the innermost one
        return " <- ".join(f.text for f in chosen)


class Site:
    __slots__ = ("name", "count", "requested", "at_peak", "leaks", "leak_bytes", "stacks", "best", "best_v", "rules")

    def __init__(self, name):
        self.name = name
        self.count = self.requested = self.at_peak = self.leaks = self.leak_bytes = 0
        self.stacks = 0
        self.best = 0  # the stack of this site with the most live bytes at the peak (else bytes allocated)
        self.best_v = (-1, -1)
        self.rules = collections.Counter()  # (tag, rule) -> allocations a tag rule tagged (trace version 4)

    def tag_text(self):
        """'  [tag kv: rule kv=py:*/kv.py]' for the site's tag rules, most allocations first; '' when none."""
        if not self.rules:
            return ""
        parts = ["tag %s: rule %s%s" % (tag, text, "" if n == self.count else " (%d of %d)" % (n, self.count))
                 for (tag, text), n in self.rules.most_common(3)]
        return "  [%s]" % "; ".join(parts)


def sites(an, rule):
    """{site name: Site}, summed over the stacks that map to the site."""
    stacks = an.symbolise()
    names = {}
    out = {}
    for sid, (n, req, live_now, at_peak, _) in an.per_stack.items():
        name = names[sid] = rule.site(stacks, sid)
        s = out.get(name)
        if s is None:
            s = out[name] = Site(name)
        s.count += n
        s.requested += req
        s.at_peak += at_peak
        s.stacks += 1
        s.rules.update(an.rules_by_stack.get(sid, ()))
        v = (at_peak, req)
        if v > s.best_v:
            s.best_v = v
            s.best = sid
    for srv, req, t, api, dev, st, stk in an.live.values():
        s = out[names[stk]]
        s.leaks += 1
        s.leak_bytes += req
    return out


def site_tables(an, rule):
    all_sites = list(sites(an, rule).values())
    by = lambda key: sorted(all_sites, key=lambda s: (-key(s), s.name))
    return {
        "peak": [s for s in by(lambda s: s.at_peak) if s.at_peak > 0],
        "bytes": by(lambda s: s.requested),
        "count": by(lambda s: s.count),
        "leaks": [s for s in by(lambda s: s.leak_bytes) if s.leaks > 0],
        "all": all_sites,
    }


def no_stack_line(an):
    """'(no stack): N allocations', with how many of them were not sampled when the trace
    samples the small ones; None when every allocation has a stack."""
    nos = an.per_stack.get(0)
    if not (nos and nos[0]):
        return None
    cfg = an.trace.stack_cfg
    return "%s: %d allocations%s" % (NO_STACK, nos[0], ", %d of them smaller than %d B and not sampled" % (
        an.not_sampled, cfg[1]) if cfg and cfg[2] != 1 else "")


def stacks_note(an):
    """None when there are stacks; else why not."""
    tr = an.trace
    if tr.format != "native":
        return "no stacks in an rmm trace (the native format carries them: VMMSHIM_TRACE_STACKS=N)"
    if not an.has_stacks():
        return NO_STACKS
    return None


def text_sites(an, rule, top=5):
    """The --by-site section: top call sites by live bytes at the peak, by bytes allocated,
    by count, and leaks by site. Bytes at the peak are served bytes (they add up to the peak
    live figure); bytes allocated and leaked are requested bytes."""
    out = []
    w = out.append
    note = stacks_note(an)
    if an.rule_bytes:
        w("tag rules (VMMSHIM_TAG_RULES): allocations each tagged")
        for (tag, text), req in sorted(an.rule_bytes.items(), key=lambda kv: (-kv[1], kv[0])):
            n = sum(c[(tag, text)] for c in an.rules_by_stack.values())
            w("  %16d B %8d allocations  tag %s: rule %s" % (req, n, tag, text))
        w("")
    if note:
        w("call sites: " + note)
        return "\n".join(out) + "\n"
    tr = an.trace
    tab = site_tables(an, rule)
    how = ("innermost Python frame of the program's own files (else of packages and the standard library), "
           "else innermost native frame outside CUDA, the C library and the shim")
    if rule.py_libs:
        how = "innermost Python frame, else innermost native frame outside CUDA, the C library and the shim"
    if rule.skip:
        how += "; also skipping " + ", ".join(repr(r.pattern) for r in rule.skip)
    if rule.depth > 1:
        how += "; %d frames" % rule.depth
    w("call sites (%s)" % how)
    with_stack = sum(v[0] for k, v in an.per_stack.items() if k)
    w("  %s in %d of %d allocations, %s" % (
        plural(len(tr.stacks), "distinct stack"), with_stack, an.n_alloc, plural(len(tab["all"]), "site")))
    if tr.stack_cfg:
        depth, minsize, sample = tr.stack_cfg
        w("  stacks captured: up to %d frames; every allocation of %d B or more, %s smaller ones" % (
            depth, minsize, "all" if sample == 1 else "none of the" if sample == 0 else "1 in %d" % sample))
    nos = no_stack_line(an)
    if nos:
        w("  " + nos)

    def table(title, head, rows, cols):
        w("")
        w(title)
        if not rows:
            w("  (none)")
            return
        w(head)
        for s in rows[:top]:
            w(cols(s) + "  " + s.name + s.tag_text())
        if len(rows) > top:
            w("  ... %s (--top N)" % plural(len(rows) - top, "more site"))

    peak = an.peak_live or 1
    table("by live bytes at the peak (%s at %.6f s):" % (fmt_bytes(an.peak_live), an.peak_live_t / 1e9),
          "      live at peak    share  site", tab["peak"],
          lambda s: "  %16d  %5.1f %%" % (s.at_peak, 100.0 * s.at_peak / peak))
    table("by bytes allocated:", "         requested  allocations  site", tab["bytes"],
          lambda s: "  %16d %12d" % (s.requested, s.count))
    table("by allocations:", "       allocations     requested  site", tab["count"],
          lambda s: "  %16d %13d" % (s.count, s.requested))
    table("leaks by site (still live at the end): %d allocations, %d B requested" % (
        sum(s.leaks for s in tab["leaks"]), sum(s.leak_bytes for s in tab["leaks"])),
        "             leaks     requested  site", tab["leaks"],
        lambda s: "  %16d %13d" % (s.leaks, s.leak_bytes))
    return "\n".join(out) + "\n"
