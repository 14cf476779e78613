"""The self-contained HTML page (--html): the timeline and the icicle graph (drawn by page.js
from the JSON in the page), the call-site tables, the bar charts (SVG made here) and the summary."""

import html
import json
import os

from .common import fmt_bytes, fmt_pow2, fmt_size, plural
from .sites import EMPTY_STACK, SiteRule, no_stack_line, site_tables, stackless_name, stacks_note, text_sites
from .summary import LIFETIME_LABELS, VMM_OPS, Analysis
from .tags import SLEEP_MODES

# The page's script: draws the zoomable timeline with the pool events and the icicle graph from
# the JSON in #vmmshim-data. URL parameters (for links and tests): zoom=T0,T1 opens the timeline
# zoomed to [T0, T1] seconds; drag=F0,F1 performs a mouse drag over that fraction of the plot's
# width; click=ID clicks the element with that id (e.g. fg-3, a frame of the icicle graph);
# reset=1 then presses the timeline's reset button; only=ID shows that section alone.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.js"), encoding="utf-8") as _f:
    PAGE_JS = "\n" + _f.read()


def flame(an, limit=30000):
    """The icicle graph's nodes, depth first: [x, width, depth, name index, kind] (x and width
    in bytes live at the peak), the names (frame texts, the hover titles) and the labels drawn in
    the boxes (source files without their directory). Root first; children by bytes, largest first.
    kind: 0 root, 1 Python, 2 native, 3 native in CUDA/C library/shim, 4 no stack."""
    stacks = an.symbolise()
    root = [0, {}, "live at the peak", 0]  # [bytes, children, name, kind]
    short = {}  # frame text -> label without the source file's directory
    for sid, s in an.per_stack.items():
        v = s[3]
        if v <= 0:
            continue
        full = stacks.full(sid) if sid != 0 and stacks.frames(sid) is not None else None
        if full is None:
            path = [(stackless_name(sid), 4)]
        elif not full:
            path = [(EMPTY_STACK, 4)]
        else:
            path = [(f.text, 1 if f.py else 3 if f.lib else 2) for f in reversed(full)]
            for f in full:
                if f.file and f.text not in short:
                    short[f.text] = "%s:%d %s" % (os.path.basename(f.file), f.line, f.func or "?")
        root[0] += v
        node = root
        for name, kind in path:
            kids = node[1]
            child = kids.get((name, kind))
            if child is None:
                child = kids[(name, kind)] = [0, {}, name, kind]
            child[0] += v
            node = child
    total = root[0]
    names, index, nodes = [], {}, []
    stack = [(root, 0, 0)]
    cut = total / 10000.0
    while stack and len(nodes) < limit:
        node, x, depth = stack.pop()
        name = node[2]
        if name not in index:
            index[name] = len(names)
            names.append(name)
        nodes.append([x, node[0], depth, index[name], node[3]])
        kids = sorted(node[1].values(), key=lambda c: (-c[0], c[2]))
        pos = x
        todo = []
        for c in kids:
            if c[0] >= cut:
                todo.append((c, pos, depth + 1))
            pos += c[0]
        stack.extend(reversed(todo))
    return {"total": total, "names": names, "labels": [short.get(n, n) for n in names], "nodes": nodes,
            "pruned": len(stack) > 0}


def page(an, rule=None, top=25):
    rule = rule or SiteRule()
    pts = an.series.points()
    native = an.trace.format == "native"
    data = {"series": pts, "native": native, "tmax": max(an.t_last, pts[-1][0] if pts else 0, 1),
            "ops": VMM_OPS, "vmm": an.vmm_events, "vmm_total": an.n_vmm, "flame": None,
            "bands": an.tags.bands, "moves": an.tags.moves, "modes": SLEEP_MODES}
    note = stacks_note(an)
    if note is None:
        data["flame"] = flame(an)
    esc = html.escape
    parts = ["<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>vmmshim report: %s</title>\n"
             "<style>body{font-family:sans-serif;margin:20px;background:#fff}"
             "pre{background:#f6f6f6;padding:10px;font-size:12px}"
             "section{margin:0 0 24px 0}h2{font-size:16px;margin:4px 0}"
             ".ctl{font-size:12px;color:#444;margin:2px 0 4px 0}.ctl button{font-size:12px;margin-right:8px}"
             "table{border-collapse:collapse;font-size:12px;margin:4px 0 12px 0}"
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}"
             "td.site,th.site{text-align:left;font-family:monospace;white-space:normal;overflow-wrap:anywhere}"
             "th.key{background:#eef}"
             "svg.chart{display:block;width:100%%;height:auto}"
             "svg text{pointer-events:none}#chart-flame g{cursor:pointer}</style></head><body>\n"
             % esc(an.trace.path),
             "<h1>vmmshim report</h1>\n"]
    parts.append(
        "<section id=\"chart-timeline-section\"><h2>Live%s bytes over time</h2>\n"
        "<div class=\"ctl\"><button id=\"timeline-reset\" type=\"button\">Reset zoom</button>"
        "<span id=\"timeline-range\"></span> &mdash; drag across the chart to zoom in%s</div>\n"
        "<svg id=\"chart-timeline\" xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 1000 270\">"
        "</svg>\n</section>\n" % (" and mapped" if native else "",
                                "; pool (VMM) events are marked below the chart, hover for details"
                                if native else ""))
    if an.sleeps:
        parts.append(html_tags(an))
    if note is None:
        parts.append(
            "<section id=\"chart-flame-section\"><h2>Where live memory was at the peak (%s at %.6f s), "
            "by call stack</h2>\n<div class=\"ctl\"><button id=\"flame-reset\" type=\"button\">Reset zoom</button>"
            "outermost frame at the top; width = live bytes; click a frame to zoom in. Python frames green, "
            "native orange, CUDA/C library frames blue</div>\n"
            "<svg id=\"chart-flame\" xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 1000 20\">"
            "</svg>\n"
            "</section>\n" % (fmt_bytes(an.peak_live), an.peak_live_t / 1e9))
        parts.append(html_sites(an, rule, top))
    else:
        parts.append("<section id=\"chart-flame-section\"><h2>Call sites</h2><p>%s</p></section>\n" % esc(note))
    charts = [
        ("chart-sizes", "Allocations by size class (count)",
         svg_bars([("%s" % fmt_pow2(k), an.classes[k][0]) for k in sorted(an.classes)], "#4e79a7")),
        ("chart-lifetimes", "Lifetimes of freed allocations (count)",
         svg_bars([(LIFETIME_LABELS[i], n) for i, n in enumerate(an.lifetimes)], "#f28e2b")),
    ]
    for cid, title, svg in charts:
        parts.append("<section id=\"%s-section\"><h2>%s</h2>\n%s\n</section>\n" % (
            cid, esc(title), svg.replace("<svg ", "<svg id=\"%s\" " % cid, 1)))
    summary = an.text(hint=False)
    if note is None:
        summary += "\n" + text_sites(an, rule, top)
    parts.append("<section id=\"summary-section\"><h2>Summary</h2><pre>%s</pre></section>\n" % esc(summary))
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    parts.append("<script type=\"application/json\" id=\"vmmshim-data\">%s</script>\n" % blob)
    parts.append("<script>%s</script>\n" % PAGE_JS)
    parts.append("</body></html>\n")
    return "".join(parts)


def html_tags(an):
    """The by-tag table (the text summary's, with exact byte counts in the cells' titles)."""
    esc = html.escape
    cells, rows = an.tag_rows()
    out = ["<section id=\"by-tag-section\"><h2>By tag</h2>\n<p class=\"ctl\">Sleeps, wakes and the time asleep of "
           "each tag the trace names; allocations are put down to a tag by the address ranges its sleeps and wakes "
           "touched (the rest: one row). Asleep tags are the bands over the chart above.</p>\n"
           "<table class=\"tags\" id=\"tags\"><tr>%s</tr>\n" % "".join(
               "<th%s>%s</th>" % (" class=\"site\"" if i == 0 else "", esc(h))
               for i, h in enumerate(Analysis.TAG_COLUMNS))]
    for c, r in zip(cells, rows):
        titles = {2: r.requested, 3: r.peak, 4: r.live, 5: r.live_at_sleep, 9: r.slept_bytes, 10: r.host_bytes,
                  11: r.woken_bytes}
        tds = []
        for i, v in enumerate(c):
            if i == 0:
                tds.append("<td class=\"site\">%s</td>" % esc(v))
            elif i in titles and v != "-":
                tds.append("<td title=\"%d B\">%s</td>" % (titles[i], esc(v)))
            else:
                tds.append("<td>%s</td>" % esc(v))
        out.append("<tr>%s</tr>\n" % "".join(tds))
    out.append("</table>\n</section>\n")
    return "".join(out)


def size_cell(n):
    """A table cell of bytes: in binary units, the exact count in its title."""
    return "<td title=\"%d B\">%s</td>" % (n, fmt_size(n))


def html_sites(an, rule, top):
    tab = site_tables(an, rule)
    stacks = an.symbolise()
    esc = html.escape
    peak = an.peak_live or 1
    cols = [("peak", "live at peak"), ("share", "share"), ("count", "allocations"), ("bytes", "requested"),
            ("leaks", "leaks"), ("leak_bytes", "leaked (requested)")]
    out = ["<section id=\"sites-section\"><h2>Top call sites</h2>\n"]
    nos = no_stack_line(an)
    if nos:
        out.append("<p class=\"ctl\">%s</p>\n" % nos)
    for key, title in (("peak", "by live bytes at the peak"), ("bytes", "by bytes allocated"),
                       ("count", "by allocations"), ("leaks", "leaks by site (still live at the end)")):
        rows = tab[key]
        out.append("<h3 style=\"font-size:14px;margin:6px 0 2px 0\">%s</h3>\n" % esc(title))
        if not rows:
            out.append("<p class=\"ctl\">none</p>\n")
            continue
        keycol = {"peak": "peak", "bytes": "bytes", "count": "count", "leaks": "leak_bytes"}[key]
        out.append("<table class=\"sites\" id=\"sites-%s\"><tr><th>#</th>%s<th class=\"site\">site</th></tr>\n" % (
            key, "".join("<th%s>%s</th>" % (" class=\"key\"" if c == keycol else "", esc(h)) for c, h in cols)))
        for i, s in enumerate(rows[:top]):
            frames = stacks.full(s.best) if s.best and stacks.frames(s.best) is not None else []
            tip = "\n".join(f.text for f in frames) or s.name
            vals = {"peak": size_cell(s.at_peak), "share": "<td>%.1f %%</td>" % (100.0 * s.at_peak / peak),
                    "count": "<td>%d</td>" % s.count, "bytes": size_cell(s.requested),
                    "leaks": "<td>%d</td>" % s.leaks, "leak_bytes": size_cell(s.leak_bytes)}
            out.append("<tr><td>%d</td>%s<td class=\"site\" title=\"%s\">%s</td></tr>\n" % (
                i + 1, "".join(vals[c] for c, _ in cols), esc(tip), esc(s.name + s.tag_text())))
        out.append("</table>\n")
        if len(rows) > top:
            out.append("<p class=\"ctl\">... %s</p>\n" % plural(len(rows) - top, "more site"))
    out.append("</section>\n")
    return "".join(out)


# The bar charts' drawing, in the units of their viewBox: the page scales them to its width.
W, H, PADL, PADB, PADT, PADR = 1000, 320, 80, 60, 20, 20


def count_ticks(vmax):
    """Whole tick values from 0 to the first at or above vmax, a round step apart (1, 2 or 5 times
    a power of ten), at most 5 steps: an axis of counts, with no value twice. page.js picks the
    byte axis's ticks the same way."""
    raw = vmax / 5.0
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale >= raw:
                step = m * scale
                break
        else:
            scale *= 10
            continue
        break
    n = max(1, -(-vmax // step))
    return [i * step for i in range(n + 1)]


def svg_axes(ticks):
    g = []
    x0, y0, x1, y1 = PADL, H - PADB, W - PADR, PADT
    g.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>' % (x0, y0, x1, y0))
    g.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>' % (x0, y0, x0, y1))
    for v in ticks:
        y = y0 - (y0 - y1) * v / ticks[-1]
        g.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (x0, y, x1, y))
        g.append('<text x="%d" y="%.1f" font-size="11" text-anchor="end">%d</text>' % (x0 - 4, y + 4, v))
    return g


def svg_bars(bars, color):
    """A bar chart of counts: bars [(label, count)]. Its width is the page's (CSS: svg.chart)."""
    x0, y0, x1, y1 = PADL, H - PADB, W - PADR, PADT
    n = max(len(bars), 1)
    ticks = count_ticks(max([b[1] for b in bars] + [1]))
    ymax = ticks[-1]
    bw = (x1 - x0) / n
    xl = [(x0 + bw * (i + 0.5), label) for i, (label, _) in enumerate(bars)]
    g = svg_axes(ticks)
    for i, (label, v) in enumerate(bars):
        h = (y0 - y1) * v / ymax
        g.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' % (
            x0 + bw * i + 2, y0 - h, max(bw - 4, 1), h, color))
    for i, (x, label) in enumerate(xl):
        if n > 16 and i % 2:
            continue
        g.append('<text x="%.1f" y="%d" font-size="10" text-anchor="end" transform="rotate(-35 %.1f %d)">%s</text>'
                 % (x, y0 + 14, x, y0 + 14, html.escape(label)))
    return '<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 %d %d">%s</svg>' % (W, H, "".join(g))
