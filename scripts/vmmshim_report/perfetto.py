"""The Chrome/Perfetto trace (--perfetto): counter tracks, the largest allocations and the tags'
sleeps as slices."""

from .sites import SiteRule, stackless_name
from .tags import mode_name


def perfetto(an, rule=None):
    """Counter tracks of live and mapped bytes, the largest allocations (--perfetto-allocs) as
    async slices from allocation to free, named by call site, with the stack in args; each tag's
    time asleep as an async slice (category sleep), and each sleep and wake call as a slice on
    the thread that made it."""
    pid = an.trace.pid or 1
    ev = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
           "args": {"name": "vmmshim %s" % (an.trace.exe or an.trace.path)}}]
    for t, live, mapped in an.series.points():
        ev.append({"name": "live bytes", "ph": "C", "ts": t / 1000.0, "pid": pid, "tid": 0,
                   "args": {"live": live}})
        if an.trace.format == "native":
            ev.append({"name": "mapped bytes", "ph": "C", "ts": t / 1000.0, "pid": pid, "tid": 0,
                       "args": {"mapped": mapped}})
    rule = rule or SiteRule()
    stacks = an.symbolise() if an.has_stacks() else None
    names = {}
    entries = sorted((e for _, _, e in an.pf_heap), key=lambda e: (e[0], e[2]))
    for n, (t0, t1, ptr, req, srv, stk, tid) in enumerate(entries):
        got = names.get(stk)
        if got is None:
            if stacks is None or stk == 0:
                got = (stackless_name(stk), [])
            else:
                got = (rule.site(stacks, stk), [f.text for f in stacks.full(stk)])
            names[stk] = got
        site, frames = got
        args = {"site": site, "stack": frames, "requested": req, "served": srv, "address": "0x%x" % ptr}
        if t1 is None:
            args["leaked"] = True
        ev.append({"name": site, "cat": "allocation", "ph": "b", "id": "0x%x" % (n + 1), "ts": t0 / 1000.0,
                   "pid": pid, "tid": tid, "args": args})
        ev.append({"name": site, "cat": "allocation", "ph": "e", "id": "0x%x" % (n + 1),
                   "ts": (an.t_last if t1 is None else t1) / 1000.0, "pid": pid, "tid": tid})
    for n, (t0, t1, tag, mode, dbytes, hbytes, still) in enumerate(an.tags.bands):
        name = "%s asleep (%s)" % (tag, mode_name(mode))
        ev.append({"name": name, "cat": "sleep", "ph": "b", "id": "0x%x" % (n + 1), "ts": t0 / 1000.0, "pid": pid,
                   "tid": 0, "args": {"tag": tag, "mode": mode_name(mode), "device_bytes": dbytes,
                                      "host_bytes": hbytes, "asleep_at_end": still}})
        ev.append({"name": name, "cat": "sleep", "ph": "e", "id": "0x%x" % (n + 1), "ts": t1 / 1000.0, "pid": pid,
                   "tid": 0})
    for t0, t1, kind, tag, mode, dbytes, hbytes, res, tid, _ in an.tags.moves:
        ev.append({"name": ("sleep %s (%s)" % (tag, mode_name(mode))) if kind == 0 else "wake %s" % tag,
                   "cat": "sleep", "ph": "X", "ts": t0 / 1000.0, "dur": (t1 - t0) / 1000.0, "pid": pid, "tid": tid,
                   "args": {"device_bytes": dbytes, "host_bytes": hbytes, "result": res}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}
