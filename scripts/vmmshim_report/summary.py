"""The analysis of a trace in one pass (peaks, size classes, lifetimes, leaks, pool events, per
stack sums, the time series) and the text summary."""

import collections
import heapq

from .common import fmt_bytes, fmt_pow2, fmt_size, plural
from .common import TraceError
from .reading import ALIAS, HOST_MEMORY, Trace
from .residue import Residue
from .sites import NO_STACKS, Stacks
from .tags import SLEEP_MODES, Tags, result_name

API_NAMES = ["runtime", "runtime-async", "driver", "driver-async"]
VMM_OPS = ["reserve", "create", "map", "set-access", "unmap", "release", "address-free"]


class Series:
    """Time series of (t, live, mapped), at most ~2*limit points: when full, pairs of
    neighbours merge into one keeping the maxima (peaks survive downsampling)."""

    def __init__(self, limit=5000):
        self.limit = limit
        self.stride = 1
        self.pts = []
        self.n = 0
        self.cur = None

    def add(self, t, live, mapped):
        cur = self.cur
        if cur is None:
            self.cur = [t, live, mapped]
        else:
            cur[0] = t
            if live > cur[1]:
                cur[1] = live
            if mapped > cur[2]:
                cur[2] = mapped
        self.n += 1
        if self.n >= self.stride:
            self.pts.append(tuple(self.cur))
            self.cur = None
            self.n = 0
            if len(self.pts) >= 2 * self.limit:
                p = self.pts
                self.pts = [(p[i + 1][0], max(p[i][1], p[i + 1][1]), max(p[i][2], p[i + 1][2]))
                            for i in range(0, len(p) - 1, 2)]
                self.stride *= 2

    def points(self):
        return self.pts + ([tuple(self.cur)] if self.cur else [])


def held_tenths(points, t_end):
    """Mapped over live at the peak live of each tenth of the run, from the series' points
    (t, live, mapped); '-' for a tenth with nothing live."""
    if not points or t_end <= 0:
        return []
    best = [None] * 10
    for t, live, mapped in points:
        i = min(9, t * 10 // t_end)
        if live > 0 and (best[i] is None or live > best[i][0]):
            best[i] = (live, mapped)
    return ["%.3f" % (m / l) if b else "-" for b in best for l, m in [b or (1, 0)]]


def size_class(n):
    """Index k of the power-of-two class [2^k, 2^(k+1)); 0 bytes -> class 0."""
    return max(n.bit_length() - 1, 0)


LIFETIME_EDGES_US = [1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000]
LIFETIME_LABELS = ["< 1 us", "1-10 us", "10-100 us", "0.1-1 ms", "1-10 ms", "10-100 ms", "0.1-1 s", "1-10 s",
                   "10-100 s", ">= 100 s"]
VMM_EVENTS_KEPT = 20000  # pool events drawn on the HTML timeline


class Analysis:
    def __init__(self, trace, short_ns=1000000, viz_events=0, perfetto_allocs=0, progress=None):
        self.trace = trace
        self.short_ns = short_ns
        self.live = {}  # ptr -> (served, requested, t, api, dev, stream, stack)
        self.live_bytes = 0
        self.mapped_bytes = 0
        self.peak_live = 0
        self.peak_live_t = 0
        self.peak_live_mapped = 0
        self.peak_mapped = 0
        self.peak_mapped_t = 0
        self.n_alloc = 0
        self.bytes_req = 0
        self.bytes_served = 0
        self.n_free = 0
        self.n_fail = 0
        self.unknown_frees = 0
        self.double_allocs = 0
        self.short = 0
        self.short_bytes = 0
        self.classes = collections.defaultdict(lambda: [0, 0])  # k -> [count, requested bytes]
        self.lifetimes = [0] * len(LIFETIME_LABELS)
        self.per_api = collections.defaultdict(lambda: [0, 0, 0])  # api -> [allocs, frees, failures]
        self.vmm_count = [0] * len(VMM_OPS)
        self.vmm_ns = [0] * len(VMM_OPS)
        self.vmm_fail = 0
        self.sleeps = []  # (t, kind, tag, mode, device bytes, host bytes, result, duration)
        self.tags = Tags()
        self.residue = Residue()  # 'r' and 'u' records (version 4)
        self.vmm_events = []  # (t, op, size, va, duration, result, flags), the first VMM_EVENTS_KEPT
        self.n_vmm = 0
        self.stitches = [0, 0, 0, 0]  # stitches, handles mapped, of which idle ones, bytes not created anew
        self.mapped = {}  # va -> (size, dev)
        self.series = Series()
        self.t_last = 0
        self.n_events = 0
        self.devices = set()
        self.viz = collections.deque(maxlen=viz_events) if viz_events else None
        # Per stack (version 2): sid -> [allocations, requested bytes, live bytes now, live bytes at the
        # global peak, peak epoch of the last change]. The value at the peak is taken lazily: a stack's
        # first change after a new peak saves its live bytes as they were then.
        self.track_sites = trace.format == "native" and (trace.version or 0) >= 2
        self.per_stack = {}
        self.peak_epoch = 0
        self.not_sampled = 0  # allocations without a stack below the `t` record's MINSIZE
        self.pf_max = perfetto_allocs
        self.pf_heap = []  # (requested, seq, entry): the pf_max largest allocations
        self.pf_open = {}  # ptr -> entry while live: [t_alloc, t_free, ptr, requested, served, stack, tid]
        self.stacks = None  # Stacks, after symbolise()
        # Tag rules (version 4): the rule of the next allocation at a pointer ('j' comes just before its
        # 'a'), and sid -> Counter of (tag, rule text) -> allocations.
        self.rule_next = {}
        self.rules_by_stack = collections.defaultdict(collections.Counter)
        self.rule_bytes = collections.Counter()  # (tag, rule text) -> requested bytes
        if progress is not None:
            progress.start(trace, lambda: self.n_events)
        self.run()

    def held_over_time(self):
        """Mapped / live at the peak live of each tenth of the run (native traces with mappings)."""
        if self.trace.format != "native" or not self.peak_mapped:
            return []
        return held_tenths(self.series.points(), self.t_last)

    def run(self):
        live = self.live
        classes = self.classes
        per_api = self.per_api
        lifetimes = self.lifetimes
        series_add = self.series.add
        short_ns = self.short_ns
        viz = self.viz
        edges = LIFETIME_EDGES_US
        track = self.track_sites
        per_stack = self.per_stack
        epoch = 0
        pf = self.pf_max > 0
        tags = self.tags
        touched = tags.touched  # threads' mappings since their last event (a sleep's, at its w record)
        resv = tags.starts  # reservations known: only then can an allocation be a tag's
        t = 0
        for ev in self.trace.events():
            kind = ev[0]
            t = ev[1]
            self.n_events += 1
            if kind == "a":
                _, t, tid, api, dev, st, ptr, req, srv, stk = ev
                old = live.get(ptr)
                if touched:
                    touched.pop(tid, None)
                if old is not None:
                    self.double_allocs += 1
                    self.live_bytes -= old[0]
                    if resv:
                        tags.free(ptr, old[0])
                    if track:
                        s = per_stack[old[6]]
                        if s[4] != epoch:
                            s[3] = s[2]
                            s[4] = epoch
                        s[2] -= old[0]
                live[ptr] = (srv, req, t, api, dev, st, stk)
                if self.rule_next:
                    rt = self.rule_next.pop(ptr, None)
                    if rt is not None:
                        self.rules_by_stack[stk][rt] += 1
                        self.rule_bytes[rt] += req
                if resv:
                    tags.alloc(ptr, req, srv)
                self.n_alloc += 1
                self.bytes_req += req
                self.bytes_served += srv
                c = classes[size_class(req)]
                c[0] += 1
                c[1] += req
                per_api[api][0] += 1
                if track:
                    s = per_stack.get(stk)
                    if s is None:
                        s = per_stack[stk] = [0, 0, 0, 0, epoch]
                    if not stk:
                        cfg = self.trace.stack_cfg
                        if cfg and req < cfg[1]:
                            self.not_sampled += 1
                    s[0] += 1
                    s[1] += req
                    if s[4] != epoch:
                        s[3] = s[2]
                        s[4] = epoch
                    s[2] += srv
                if pf:
                    self._pf_alloc(t, ptr, req, srv, stk, tid)
                self.live_bytes += srv
                if self.live_bytes > self.peak_live:
                    self.peak_live = self.live_bytes
                    self.peak_live_t = t
                    self.peak_live_mapped = self.mapped_bytes
                    epoch += 1
                if viz is not None:
                    viz.append((dev, stk, {"action": "alloc", "addr": ptr, "size": srv, "stream": st or 0,
                                           "frames": [], "time_us": t // 1000}))
                    self.devices.add(dev)
            elif kind == "j":
                self.rule_next[ev[3]] = (ev[4], ev[5])
            elif kind == "f":
                _, t, tid, api, dev, st, ptr, srv = ev
                per_api[api][1] += 1
                self.n_free += 1
                rec = live.pop(ptr, None)
                if touched:
                    touched.pop(tid, None)
                if rec is None:
                    self.unknown_frees += 1
                else:
                    self.live_bytes -= rec[0]
                    if resv:
                        tags.free(ptr, rec[0])
                    if track:
                        s = per_stack[rec[6]]
                        if s[4] != epoch:
                            s[3] = s[2]
                            s[4] = epoch
                        s[2] -= rec[0]
                    if pf:
                        e = self.pf_open.pop(ptr, None)
                        if e is not None:
                            e[1] = t
                    life = t - rec[2]
                    if life < short_ns:
                        self.short += 1
                        self.short_bytes += rec[1]
                    us = life // 1000
                    i = 0
                    while i < 9 and us >= edges[i]:
                        i += 1
                    lifetimes[i] += 1
                    if viz is not None:
                        for action in ("free_requested", "free_completed"):
                            viz.append((dev, rec[6], {"action": action, "addr": ptr, "size": rec[0],
                                                      "stream": st or 0, "frames": [], "time_us": t // 1000}))
            elif kind == "m":
                _, t, tid, op, dev, va, size, handle, flags, res, dur = ev
                if 0 <= op < len(VMM_OPS):
                    self.vmm_count[op] += 1
                    self.vmm_ns[op] += dur
                self.n_vmm += 1
                if len(self.vmm_events) < VMM_EVENTS_KEPT:
                    self.vmm_events.append((t, op, size, va, dur, res, flags))
                if res != 0:
                    self.vmm_fail += 1
                elif op == 0:
                    tags.reserve(va, size)
                elif op == 6:
                    tags.address_free(va)
                if res == 0 and (op == 2 or op == 4):
                    tags.mapping(t, tid, va)
                if res != 0:
                    pass
                elif flags & (HOST_MEMORY | ALIAS):  # host memory, or device memory mapped twice
                    pass
                elif op == 2:  # map
                    self.mapped_bytes += size
                    self.mapped[va] = (size, dev)
                    if self.mapped_bytes > self.peak_mapped:
                        self.peak_mapped = self.mapped_bytes
                        self.peak_mapped_t = t
                    if viz is not None:
                        viz.append((dev, 0, {"action": "segment_map", "addr": va, "size": size, "stream": 0,
                                             "frames": [], "time_us": t // 1000}))
                        self.devices.add(dev)
                elif op == 4:  # unmap
                    self.mapped_bytes -= size
                    self.mapped.pop(va, None)
                    if viz is not None:
                        viz.append((dev, 0, {"action": "segment_unmap", "addr": va, "size": size, "stream": 0,
                                             "frames": [], "time_us": t // 1000}))
            elif kind == "h":
                st = self.stitches
                st[0] += 1
                st[1] += ev[6]
                st[3] += ev[5] - ev[7]
            elif kind == "w":
                self.sleeps.append(ev[1:2] + ev[3:4] + ev[5:])
                tags.sleep_or_wake(*ev[1:])
            elif kind == "u":
                t = ev[1]
                self.residue.add_outside(ev[3], ev[6], ev[5], ev[7], self.trace)
            elif kind == "r":
                t = ev[1]
                self.residue.names = self.trace.residue_names
                self.residue.add(t, ev[3], ev[4], ev[5], ev[6], ev[7])
            elif kind == "o":
                _, t, tid, api, dev, st, req, err = ev
                if touched:
                    touched.pop(tid, None)
                self.n_fail += 1
                per_api[api][2] += 1
                if viz is not None:
                    viz.append((dev, 0, {"action": "oom", "size": req, "stream": st or 0, "device_free": 0,
                                         "frames": [], "time_us": t // 1000}))
            series_add(t, self.live_bytes, self.mapped_bytes)
        self.t_last = t if self.trace.end_t is None else max(t, self.trace.end_t)
        tags.finish(self.t_last)
        if self.trace.path != "-" and self.trace.size is not None and tags.claimed():
            try:  # the tags' peaks need a second reading, which knows the tags from the start
                tags.peaks(Trace(self.trace.path, quiet=True), self.n_events)
            except (OSError, TraceError):
                pass  # the file is gone or changed: the peaks stay unknown
        for s in per_stack.values():  # stacks unchanged since the last peak: their live bytes then are now's
            if s[4] != epoch:
                s[3] = s[2]
                s[4] = epoch
        self.peak_epoch = epoch

    def _pf_alloc(self, t, ptr, req, srv, stk, tid):
        heap = self.pf_heap
        if len(heap) >= self.pf_max and req <= heap[0][0]:
            self.pf_open.pop(ptr, None)
            return
        e = [t, None, ptr, req, srv, stk, tid]
        item = (req, -self.n_alloc, e)
        if len(heap) >= self.pf_max:
            heapq.heapreplace(heap, item)
        else:
            heapq.heappush(heap, item)
        self.pf_open[ptr] = e

    def has_stacks(self):
        return self.track_sites and bool(self.trace.stacks)

    def symbolise(self, symboliser=None, progress=None):
        """The trace's stacks symbolised (Stacks), made on the first call."""
        if self.stacks is None:
            self.stacks = Stacks(self.trace, symboliser, progress)
        return self.stacks

    TAG_COLUMNS = ("tag", "allocs", "requested", "peak live", "live at end", "at sleep", "sleeps", "wakes", "failed",
                   "to sleep", "to host", "woken", "asleep", "at end")

    def tag_rows(self):
        """The by-tag table as text cells, one list a row (TAG_COLUMNS), and the rows themselves."""
        leaked = sum(v[0] for v in self.live.values())
        rows = self.tags.table(self.n_alloc, self.bytes_req, leaked)
        cells = []
        for r in rows:
            head = [r.name, "%d" % r.allocs, fmt_size(r.requested), "-" if r.peak is None else fmt_size(r.peak),
                    fmt_size(r.live)]
            if r is self.tags.others:  # no tag: nothing slept
                cells.append(head + ["-"] * (len(self.TAG_COLUMNS) - len(head)))
                continue
            cells.append(head + [fmt_size(r.live_at_sleep), "%d" % r.sleeps, "%d" % r.wakes, "%d" % r.failed,
                                 fmt_size(r.slept_bytes), fmt_size(r.host_bytes), fmt_size(r.woken_bytes),
                                 "%.6f s" % (r.asleep_ns / 1e9),
                                 "asleep" if self.tags.asleep_at_end(r) else "awake"])
        return cells, rows

    def tag_text(self):
        cells, _ = self.tag_rows()
        out = ["by tag (allocations put down to a tag by the address ranges its sleeps and wakes touched):"]
        widths = [max(len(c[i]) for c in cells + [list(self.TAG_COLUMNS)]) for i in range(len(self.TAG_COLUMNS))]
        for c in [list(self.TAG_COLUMNS)] + cells:
            out.append("  " + "  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i])
                                        for i in range(len(c))).rstrip())
        return out

    def text(self, top=5, hint=True):
        tr = self.trace
        out = []
        w = out.append
        w("vmmshim-report: %s" % tr.path)
        if tr.format == "native":
            w("format: native %d (%s), pid %s, rank %s" % (tr.version, tr.tool, tr.pid, tr.rank))
            w("program: %s" % tr.exe)
            w("command: %s" % tr.cmd)
        else:
            w("format: rmm (RMM logging_resource_adaptor CSV): no pool events, so no mapped bytes")
        w("duration: %.6f s, %d events" % (self.t_last / 1e9, self.n_events))
        if tr.format == "native":
            if tr.cut_at is not None:
                w("end: cut at %s (VMMSHIM_TRACE_MAX): later events are not in the trace; leaks and what was live at "
                  "the end are unknown" % fmt_bytes(tr.cut_at))
            elif tr.end_t is not None:
                w("end: the trace was closed at exit")
            else:
                w("end: no end record: the process crashed, was killed, or is still running")
        if tr.partial_tail:
            w("note: the last line was cut short and was ignored")
        w("")
        w("memory")
        w("  peak live:    %s (%d B) at %.6f s" % (fmt_bytes(self.peak_live), self.peak_live, self.peak_live_t / 1e9))
        if tr.format == "native":
            w("  peak mapped:  %s (%d B) at %.6f s" % (fmt_bytes(self.peak_mapped), self.peak_mapped,
                                                      self.peak_mapped_t / 1e9))
            if self.peak_live_mapped > 0:
                frag = 1.0 - self.peak_live / self.peak_live_mapped
                w("  fragmentation at peak live: %.1f %% (live %s of mapped %s)" % (
                    100.0 * frag, fmt_bytes(self.peak_live), fmt_bytes(self.peak_live_mapped)))
            else:
                w("  fragmentation at peak live: n/a (nothing mapped in the trace)")
            w("  still mapped at end: %s" % fmt_bytes(self.mapped_bytes))
        else:
            w("  peak mapped:  not recorded in rmm format")
        w("")
        w("allocations")
        w("  %d allocations (%s requested, %s served), %d frees, %d failed" % (
            self.n_alloc, fmt_bytes(self.bytes_req), fmt_bytes(self.bytes_served), self.n_free, self.n_fail))
        if self.unknown_frees:
            w("  %d frees of pointers the trace never allocated" % self.unknown_frees)
        if self.double_allocs:
            w("  %d allocations returned a pointer that was still live (a free is missing)" % self.double_allocs)
        w("  by API:           allocs      frees   failures")
        for api in sorted(self.per_api):
            a, f, o = self.per_api[api]
            name = API_NAMES[api] if 0 <= api < len(API_NAMES) else ("rmm" if api == -1 else "api %d" % api)
            w("    %-13s %9d  %9d  %9d" % (name, a, f, o))
        w("  by size class (requested):     count        bytes")
        for k in sorted(self.classes):
            c, b = self.classes[k]
            label = "[%s, %s)" % (fmt_pow2(k), fmt_pow2(k + 1)) if k > 0 else "[0 B, 2 B)"
            w("    %-22s %9d  %11d" % (label, c, b))
        w("")
        leaks = self.live
        leak_bytes = sum(v[1] for v in leaks.values())
        w("leaks (never freed): %d allocations, %s requested (%d B)" % (len(leaks), fmt_bytes(leak_bytes), leak_bytes))
        if leaks:
            biggest = sorted(leaks.items(), key=lambda kv: (-kv[1][1], kv[1][2], kv[0]))[:top]
            w("  largest:          pointer        requested     allocated at  api")
            for ptr, (srv, req, t, api, dev, st, stk) in biggest:
                name = API_NAMES[api] if 0 <= api < len(API_NAMES) else "rmm"
                w("    %#20x  %15d  %13.6f s  %s" % (ptr, req, t / 1e9, name))
        freed = sum(self.lifetimes)
        w("short-lived (< %g ms): %d of %d freed allocations (%.1f %%), %s requested" % (
            self.short_ns / 1e6, self.short, freed, 100.0 * self.short / freed if freed else 0.0,
            fmt_bytes(self.short_bytes)))
        w("  lifetimes: " + ", ".join("%s: %d" % (LIFETIME_LABELS[i], n) for i, n in enumerate(self.lifetimes) if n))
        if tr.format == "native":
            w("")
            grow = self.vmm_ns[1] + self.vmm_ns[2] + self.vmm_ns[3]
            w("pool growth (create + map + set-access): %.3f ms" % (grow / 1e6))
            w("  pool events:  " + ", ".join("%s %d (%.3f ms)" % (VMM_OPS[i], self.vmm_count[i], self.vmm_ns[i] / 1e6)
                                           for i in range(len(VMM_OPS))))
            if self.vmm_fail:
                w("  %d pool events failed" % self.vmm_fail)
            if self.stitches[0]:
                w("  stitches: %d growths mapped idle handles again (%d handles in their ranges), %s not created "
                  "anew" % (self.stitches[0], self.stitches[1], fmt_bytes(self.stitches[3])))
            held = self.held_over_time()
            if held:
                w("  held / live over time (the peak of each tenth of the run): " + " ".join(held))
            if self.sleeps:
                w("")
                w("sleeps and wakes: %d" % len(self.sleeps))
                for t, kind, tag, mode, dbytes, hbytes, res, dur in self.sleeps[:20]:
                    what = ("sleep (%s)" % SLEEP_MODES[mode]) if kind == 0 and 0 <= mode < len(SLEEP_MODES) else "wake"
                    w("  %10.3f s  %-14s %-12s device %s%s, %.1f ms%s" % (
                        t / 1e9, what, tag, fmt_bytes(dbytes), (", host %s" % fmt_bytes(hbytes)) if hbytes else "",
                        dur / 1e6, (", error %s" % result_name(res)) if res else ""))
                if len(self.sleeps) > 20:
                    w("  ... %d more" % (len(self.sleeps) - 20))
                w("")
                out.extend(self.tag_text())
        residue = self.residue.text()
        if residue:
            w("")
            out.extend(residue)
        if tr.format == "native" and (tr.version or 0) >= 2 and hint:
            w("")
            if self.has_stacks():
                w("call sites: %s (--by-site lists the top sites)" % plural(len(tr.stacks), "distinct stack"))
            else:
                w("call sites: " + NO_STACKS)
        if tr.unknown:
            w("")
            w("skipped: " + ", ".join("%d records of unknown type %r" % (n, k) for k, n in sorted(tr.unknown.items())))
        if tr.malformed:
            w("skipped: %d malformed lines" % tr.malformed)
        return "\n".join(out) + "\n"
