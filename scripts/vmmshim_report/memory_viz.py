"""The PyTorch memory_viz snapshot (--memory-viz): the mapped segments at the end of the trace,
tiled by their blocks, and the last events as device traces."""

import bisect


def viz_frames(an):
    """sid -> the frames list of memory_viz (one shared list per stack, so the pickle keeps it once)."""
    cache = {0: []}
    stacks = an.symbolise() if an.has_stacks() else None

    def get(sid):
        fr = cache.get(sid)
        if fr is None:
            fr = cache[sid] = stacks.viz(sid) if stacks is not None else []
        return fr
    return get


def memory_viz(an):
    """A dict shaped like torch.cuda.memory._snapshot(): 'segments' (the mapped memory
    at the end of the trace, each tiled by its blocks) and 'device_traces'. Blocks and
    trace entries carry the frames of their allocation's stack."""
    frames = viz_frames(an)
    ranges = sorted((va, size, dev) for va, (size, dev) in an.mapped.items())
    merged = []  # contiguous mappings of one device form one segment
    for va, size, dev in ranges:
        if merged and va < merged[-1][0] + merged[-1][1]:
            # overlapping mappings (a malformed trace): one segment, so that segments stay disjoint
            # and no block is tiled twice
            merged[-1][1] = max(merged[-1][1], va + size - merged[-1][0])
        elif merged and merged[-1][2] == dev and merged[-1][0] + merged[-1][1] == va:
            merged[-1][1] += size
        else:
            merged.append([va, size, dev])
    lives = sorted(an.live.items())
    segments = []
    placed = set()
    for va, size, dev in merged:
        blocks = []
        at = va
        i = bisect.bisect_left(lives, (va,))
        while i < len(lives) and lives[i][0] < va + size:
            ptr, (srv, req, t, api, d, st, stk) = lives[i]
            if ptr + srv > va + size or ptr < at:
                i += 1
                continue
            if ptr > at:
                blocks.append({"address": at, "size": ptr - at, "requested_size": 0, "state": "inactive",
                               "frames": []})
            blocks.append({"address": ptr, "size": srv, "requested_size": req, "state": "active_allocated",
                           "frames": frames(stk)})
            placed.add(ptr)
            at = ptr + srv
            i += 1
        if at < va + size:
            blocks.append({"address": at, "size": va + size - at, "requested_size": 0, "state": "inactive",
                           "frames": []})
        active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segments.append({"device": max(dev, 0), "address": va, "total_size": size, "stream": 0,
                         "segment_type": "large", "allocated_size": active, "active_size": active,
                         "requested_size": sum(b["requested_size"] for b in blocks), "blocks": blocks})
    for ptr, (srv, req, t, api, dev, st, stk) in lives:  # rmm traces, or blocks outside any mapping
        if ptr in placed:
            continue
        segments.append({"device": max(dev, 0), "address": ptr, "total_size": srv, "stream": st or 0,
                         "segment_type": "large", "allocated_size": srv, "active_size": srv,
                         "requested_size": req,
                         "blocks": [{"address": ptr, "size": srv, "requested_size": req,
                                     "state": "active_allocated", "frames": frames(stk)}]})
    ndev = max([max(d, 0) for d in an.devices] + [s["device"] for s in segments] + [0]) + 1
    traces = [[] for _ in range(ndev)]
    for dev, stk, e in (an.viz or ()):
        if stk:
            e["frames"] = frames(stk)
        traces[max(dev, 0)].append(e)
    return {"segments": segments, "device_traces": traces, "categories": [],
            "allocator_settings": {"allocator": "vmmshim", "trace": an.trace.path}}
