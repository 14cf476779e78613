"""Tags in a trace (docs/sleep.md): their sleeps and wakes, the time each spent asleep, and the
allocations that can be put down to them.

A trace names a tag only in the `g` record before a sleep or a wake of it, and an allocation's
record carries no tag. But each tag has pools of its own, each pool its own reserved address
ranges, and a sleep or a wake unmaps or maps the tag's memory from the calling thread inside
those ranges. So a reservation (a successful `m` reserve) belongs to the tag whose successful
sleep or wake is the first to map or unmap inside it, on the sleeping thread,
between that thread's previous event and the `w` record, within the call's duration; its
allocations are then counted under the tag. The rest (tags that never slept, and reservations
no sleep touched: a pool's second heap with nothing on it at the sleep) make one row. A tag's peak
of live bytes needs the tags from the start: a second reading of the file (peaks())."""

import bisect
import errno

SLEEP_MODES = ["discard", "host", "mapped", "disk"]
EVERY_TAG = (1 << 64) - 1
OTHERS = "(not put down to a tag)"  # the row of allocations in ranges no sleep or wake touched


def result_name(res):
    """A sleep's or wake's result: 0, or a negative errno value named ("-12 (ENOMEM)")."""
    name = errno.errorcode.get(-res) if res < 0 else None
    return "%d (%s)" % (res, name) if name else "%d" % res


def mode_name(mode):
    return SLEEP_MODES[mode] if 0 <= mode < len(SLEEP_MODES) else "mode %d" % mode


class TagRow:
    """One tag's figures. Allocations, requested bytes and live bytes cover the reservations put
    down to the tag (counted from the start of the trace, also before the tag's first sleep)."""

    __slots__ = ("name", "allocs", "requested", "live", "peak", "live_at_sleep", "sleeps", "wakes", "failed",
                 "slept_bytes", "host_bytes", "woken_bytes", "asleep_ns", "asleep_since", "first")

    def __init__(self, name, first):
        self.name = name
        self.first = first  # order of appearance: rows keep it
        self.allocs = self.requested = self.live = 0
        self.peak = None  # the largest live bytes, from a second reading (peaks()); None: not known
        self.live_at_sleep = 0  # the largest live bytes of the tag at one of its sleeps
        self.sleeps = self.wakes = self.failed = 0
        self.slept_bytes = self.host_bytes = self.woken_bytes = 0
        self.asleep_ns = 0
        self.asleep_since = None  # the time the current sleep ended, while asleep


class Tags:
    """Fed by the analysis's reading loop: reservations (reserve, address-free), device mappings
    (map, unmap), allocations, frees and `w` records. bands and moves are what the HTML page draws:
    bands [t_from, t_to, tag, mode, device bytes, host bytes, open at the end] from the end of a
    sleep to the end of its wake (or the trace's end); moves [t_from, t_to, kind, tag, mode, device
    bytes, host bytes, result, thread, result's name], each sleep and wake call itself."""

    def __init__(self, preset=None):
        # preset: reservation number -> row, for a second reading (peaks()) that knows the tags
        self.preset = preset
        self.n_resv = 0  # reservations taken so far: their numbers
        self.starts = []  # reservation starts, sorted
        self.resv = []  # parallel: [va, end, row or None, allocs, requested, live, number]
        self.touched = {}  # tid -> {start: t of the last map or unmap} since the thread's last event
        self.rows = {}  # tag index (EVERY_TAG too) -> TagRow
        self.others = TagRow(OTHERS, 1 << 62)
        self.open = {}  # tag index -> [band, row] while asleep
        self.bands = []
        self.moves = []

    # ---- address ranges
    def _at(self, va):
        i = bisect.bisect_right(self.starts, va) - 1
        if i >= 0 and va < self.resv[i][1]:
            return self.resv[i]
        return None

    def reserve(self, va, size):
        if size == 0 or self._at(va) is not None:
            return
        i = bisect.bisect_left(self.starts, va)
        if i < len(self.starts) and self.starts[i] < va + size:
            return  # overlaps a later one: a malformed trace
        self.starts.insert(i, va)
        self.resv.insert(i, [va, va + size, self.preset.get(self.n_resv) if self.preset else None, 0, 0, 0,
                             self.n_resv])
        self.n_resv += 1

    def address_free(self, va):
        i = bisect.bisect_left(self.starts, va)
        if i < len(self.starts) and self.starts[i] == va and self.resv[i][5] == 0:
            del self.starts[i]
            del self.resv[i]

    def mapping(self, t, tid, va):
        """A successful map or unmap. One of host memory or of an alias is in a range without
        allocations (host buffers and aliases are reserved apart), or in the sleeping tag's own."""
        r = self._at(va)
        if r is not None and r[2] is None:
            self.touched.setdefault(tid, {})[r[0]] = t

    # Called only while a reservation is known (the reading loop tests `starts`): what no tag has
    # is the analysis's totals less the tags' (table()).
    def alloc(self, ptr, req, srv):
        r = self._at(ptr)
        if r is None:
            return
        r[3] += 1
        r[4] += req
        r[5] += srv
        row = r[2]
        if row is not None:
            row.allocs += 1
            row.requested += req
            row.live += srv
            if row.peak is not None and row.live > row.peak:
                row.peak = row.live

    def free(self, ptr, srv):
        """The free of a live allocation of served bytes srv."""
        r = self._at(ptr)
        if r is None or r[5] < srv:  # allocated before its range was reserved: a malformed trace
            return
        r[5] -= srv
        if r[2] is not None:
            r[2].live -= srv

    # ---- sleeps and wakes
    def _row(self, tag, name):
        row = self.rows.get(tag)
        if row is None:
            row = self.rows[tag] = TagRow(name, len(self.rows))
        row.name = name
        return row

    def _claim(self, row, t_from, tid):
        for start, t in self.touched.pop(tid, {}).items():
            if t < t_from:
                continue
            i = bisect.bisect_left(self.starts, start)
            if i == len(self.starts) or self.starts[i] != start:
                continue  # freed since (a mapped sleep's alias)
            r = self.resv[i]
            if r[2] is not None:
                continue
            r[2] = row
            row.allocs += r[3]
            row.requested += r[4]
            row.live += r[5]

    def _close(self, tag, t):
        band, row = self.open.pop(tag)
        band[1] = t
        band[6] = False
        row.asleep_ns += max(0, t - row.asleep_since)
        row.asleep_since = None

    def sleep_or_wake(self, t, tid, kind, tag, name, mode, dbytes, hbytes, res, dur):
        row = self._row(tag, name)
        t_from = max(0, t - dur)
        if res == 0 and tag != EVERY_TAG:
            self._claim(row, t_from, tid)
        else:
            self.touched.pop(tid, None)
        self.moves.append([t_from, t, kind, name, mode, dbytes, hbytes, res, tid, result_name(res)])
        if res != 0:
            row.failed += 1
            return
        if kind == 0:
            row.sleeps += 1
            row.slept_bytes += dbytes
            row.host_bytes += hbytes
            row.live_at_sleep = max(row.live_at_sleep, row.live if tag != EVERY_TAG else 0)
            if tag not in self.open:
                band = [t, None, name, mode, dbytes, hbytes, True]
                self.bands.append(band)
                self.open[tag] = [band, row]
                row.asleep_since = t
        else:
            row.wakes += 1
            row.woken_bytes += dbytes
            for k in ([tag] if tag != EVERY_TAG else list(self.open)):
                if k in self.open:
                    self._close(k, t)

    def finish(self, t_end):
        """At the end of the trace: sleeps without a wake run to its end (still asleep)."""
        for band, row in self.open.values():
            band[1] = t_end
            row.asleep_ns += max(0, t_end - row.asleep_since)

    def table(self, allocs, requested, live):
        """The rows in order of appearance, the tags' own first, then (every tag), then the rest:
        of the trace's allocations, requested bytes and live bytes at the end, what no tag has."""
        rows = sorted(self.rows.items(), key=lambda kv: (kv[0] == EVERY_TAG, kv[1].first))
        out = [row for _, row in rows]
        o = self.others
        o.allocs = allocs - sum(r.allocs for r in out)
        o.requested = requested - sum(r.requested for r in out)
        o.live = live - sum(r.live for r in out)
        if o.allocs:
            out.append(o)
        return out

    def claimed(self):
        """Reservation number -> row, of the reservations put down to a tag."""
        return {r[6]: r[2] for r in self.resv if r[2] is not None}

    def peaks(self, trace, n_events):
        """Each tag's peak of live bytes, from a second reading of the trace's file (the first n_events
        events: a file still being written may have grown): the reservations are taken in the same
        order, so their numbers name the same ones, now put down to their tags from the start. Rows
        stay without a peak when the file cannot be read again."""
        rows = self.claimed()
        if not rows:
            return
        shadow = {id(row): TagRow(row.name, 0) for row in rows.values()}
        for s in shadow.values():
            s.peak = 0
        again = Tags({k: shadow[id(row)] for k, row in rows.items()})
        live = {}
        for n, ev in enumerate(trace.events()):
            if n >= n_events:
                break
            kind = ev[0]
            if kind == "a":
                ptr, req, srv = ev[6], ev[7], ev[8]
                if ptr in live:
                    again.free(ptr, live[ptr])
                live[ptr] = srv
                again.alloc(ptr, req, srv)
            elif kind == "f":
                srv = live.pop(ev[6], None)
                if srv is not None:
                    again.free(ev[6], srv)
            elif kind == "m" and ev[9] == 0:
                if ev[3] == 0:
                    again.reserve(ev[5], ev[6])
                elif ev[3] == 6:
                    again.address_free(ev[5])
        for row in rows.values():
            row.peak = shadow[id(row)].peak

    def asleep_at_end(self, row):
        return any(r is row for _, r in self.open.values())
