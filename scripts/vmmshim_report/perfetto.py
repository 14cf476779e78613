"""The Chrome/Perfetto trace (--perfetto): counter tracks and the largest allocations as slices."""

from .sites import SiteRule, stackless_name


def perfetto(an, rule=None):
    """Counter tracks of live and mapped bytes, and the largest allocations (--perfetto-allocs)
    as async slices from allocation to free, named by call site, with the stack in args."""
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
    return {"traceEvents": ev, "displayTimeUnit": "ms"}
