#!/usr/bin/env python3
"""The HTML page of vmmshim-report as a reader sees it, on a version-2 trace with Python stacks
whose peak holds 19.8 TiB: size classes are labelled in binary units (16 TiB); the count axes
of the bar charts have whole, distinct ticks (not "2, 1, 1, 0, 0"); byte columns of the site
tables are in binary units (19.8 TiB, 1 GiB; the exact count in the cell's title), as are the
timeline's axis labels drawn by the page's script (distinct, under 1024 of their unit); every
chart scales with the window (a viewBox and no fixed width: rendered by headless chromium at
800 and 1600 pixels, its drawing spans twice the width at the second); a stack with no frames
is "(empty stack)" in the text and in the icicle graph, a label the package spells once; one
site or stack is counted in the singular. On examples/sample.trace (a sleep and a wake of the tag
kv, made by the shim): the by-tag table, the band of kv asleep over the timeline labelled with its
tag and mode, its sleep and wake marked, a legend, and time ticks that are round numbers in one
unit, also zoomed. Ends with "N passed, N failed"."""
import glob
import math
import os
import re
import sys

from harness import (REPORT, ROOT, browser, check, colour_mask, dump_dom, png_pixels, report, scratch, screenshot,
                     summary)
from test_report import TAGS_TRACE

TiB, MiB = 1 << 40, 1 << 20
HUGE = 21734369280000  # 19.77 TiB
TRAIN = "/home/user/project/train.py"


def write_trace(path):
    """Sites: train.py:18 forward (the 19.8 TiB block), train.py:40 load (two of 512 MiB) and a stack
    with no frames (three of 4 KiB, two freed). Size classes hold 1, 2 and 3 allocations."""
    allocs = [(1, HUGE), (2, 512 * MiB), (2, 512 * MiB), (3, 4096), (3, 4096), (3, 4096)]
    with open(path, "w") as f:
        f.write("v 2 vmmshim 0.1.0\nx /usr/bin/python3\nc python3 train.py\np 4d2 1 0\ns 17a2b3c4d5e6f700 0\n")
        f.write("t 10 0 1\nn 1 %s\nn 2 forward\nn 3 load\n" % TRAIN)
        f.write("k 1 0 1 1 2 12\nk 2 0 1 1 3 28\nk 3 0 0\n")
        f.write("m 100 4d2 2 0 7f0000000000 %x 1 0 0 3e8\n" % (32 * TiB))
        t = 1000
        for i, (sid, size) in enumerate(allocs):
            t += 1000000
            f.write("a %x 4d2 0 0 - %x %x %x %x\n" % (t, 0x7f0000000000 + i * (20 * TiB), size, size, sid))
        for i in (3, 4):  # two small ones freed: the lifetimes chart has data
            t += 2000000
            f.write("f %x 4d2 0 0 - %x %x\n" % (t, 0x7f0000000000 + i * (20 * TiB), allocs[i][1]))
        f.write("e %x\n" % (t + 1000))


def svg_of(page, cid):
    m = re.search(r'<svg id="%s"[^>]*>.*?</svg>' % cid, page, re.S)
    return m.group(0) if m else ""


def y_ticks(svg):
    """The y axis labels of a bar chart, bottom to top."""
    got = re.findall(r'<text x="[\d.]+" y="([\d.]+)" font-size="11" text-anchor="end">([^<]*)</text>', svg)
    return [label for _, label in sorted(got, key=lambda g: -float(g[0]))]


def test_static(page, counts):
    for cid, top in (("chart-sizes", max(counts)), ("chart-lifetimes", 2)):
        ticks = y_ticks(svg_of(page, cid))
        whole = all(re.fullmatch(r"\d+", t) for t in ticks)
        vals = [int(t) for t in ticks] if whole else []
        check(len(ticks) >= 2 and whole and vals == sorted(set(vals)) and vals[0] == 0 and vals[-1] >= top,
              "%s: whole, distinct, rising ticks from 0 to at least %d: %s" % (cid, top, ticks))
    labels = re.findall(r'rotate\(-35 [^>]*>([^<]*)<', svg_of(page, "chart-sizes"))
    check(labels == ["4 KiB", "512 MiB", "16 TiB"], "chart-sizes: size classes in binary units %s" % labels)
    cells = re.findall(r'<table class="sites" id="sites-(\w+)">(.*?)</table>', page, re.S)
    raw, human = [], set()
    for table, body in cells:
        for row in re.findall(r"<tr><td>\d+</td>(.*?)</tr>", body, re.S):
            tds = re.findall(r"<td[^>]*>([^<]*)</td>", row)
            for i in (0, 3, 5):  # live at peak, requested, leaked (requested)
                if re.fullmatch(r"\d+", tds[i]) and int(tds[i]) >= 1024:
                    raw.append(tds[i])
                human.add(tds[i])
    check(cells and not raw, "site tables: no byte count of 1024 or more as a raw integer %s" % raw[:5])
    check({"19.8 TiB", "1 GiB", "12 KiB", "4 KiB"} <= human, "site tables: 19.8 TiB, 1 GiB, 12 KiB, 4 KiB shown %s"
          % sorted(human))
    check('title="%d B"' % HUGE in page, "site tables: the exact byte count is the cell's title")
    for cid in ("chart-timeline", "chart-flame", "chart-sizes", "chart-lifetimes"):
        m = re.search(r'<svg id="%s"([^>]*)>' % cid, page)
        attrs = m.group(1) if m else ""
        width = re.search(r'\swidth="([^"]*)"', attrs)
        check(m and "viewBox=" in attrs and (width is None or width.group(1) == "100%"),
              "%s: a viewBox and no fixed width (%s)" % (cid, attrs.strip()))


def right_edge(b, url, width, tmp, name):
    png = os.path.join(tmp, "%s-%d.png" % (name, width))
    if not screenshot(b, url, png, (width, 700), tmp):
        return None
    xs = [x for x, y in colour_mask(png)]
    return max(xs) if xs else None


def test_rendered(page_path, tmp):
    b = browser()
    if not b:
        return
    url = "file://" + page_path
    dom = dump_dom(b, url, tmp)
    tl = re.search(r'<svg id="chart-timeline".*?</svg>', dom, re.S)
    labels = re.findall(r'font-size="11" text-anchor="end">([^<]*)<', tl.group(0) if tl else "")
    units = [re.fullmatch(r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB|PiB)", x) for x in labels]
    check(len(labels) >= 2 and all(units) and all(float(u.group(1)) < 1024 for u in units)
          and len(set(labels)) == len(labels), "timeline: byte axis in binary units, distinct: %s" % labels)
    for section, name in (("chart-sizes-section", "sizes"), ("chart-timeline-section", "timeline"),
                          ("chart-flame-section", "flame")):
        narrow = right_edge(b, url + "?only=" + section, 800, tmp, name)
        wide = right_edge(b, url + "?only=" + section, 1600, tmp, name)
        check(narrow and wide and narrow < 800 - 10 and wide / narrow > 1.8,
              "%s: the drawing fits the window and scales with it (right edge %s px at 800, %s px at 1600)"
              % (name, narrow, wide))
    check("(empty stack)" in dom, "html: the stack with no frames is '(empty stack)' in the icicle graph")


def x_ticks(dom):
    """The time axis's labels of the rendered timeline, and whether they are round numbers of one
    unit, equally spaced by 1, 2, 2.5 or 5 times a power of ten."""
    tl = re.search(r'<svg id="chart-timeline".*?</svg>', dom, re.S)
    labels = re.findall(r'class="xlabel"[^>]*>([^<]*)<', tl.group(0) if tl else "")
    m = [re.fullmatch(r"(\d+(?:\.\d+)?) (s|ms|\u00b5s|ns)", x) for x in labels]
    if len(labels) < 3 or not all(m) or len({x.group(2) for x in m}) != 1:
        return labels, False
    v = [float(x.group(1)) for x in m]
    steps = {round(b - a, 9) for a, b in zip(v, v[1:])}
    step = steps.pop() if len(steps) == 1 else 0
    mant = step / 10 ** math.floor(math.log10(step)) if step > 0 else 0
    round_ = (any(abs(mant - k) < 1e-6 for k in (1, 2, 2.5, 5))
              and all(abs(x / step - round(x / step)) < 1e-6 for x in v))
    return labels, round_


def test_sleeps(tmp):
    """The page of examples/sample.trace: kv sleeps in host mode, then wakes."""
    path = os.path.join(tmp, "sample.html")
    r = report(os.path.join("examples", "sample.trace"), "--html", path)
    page = open(path).read() if r.returncode == 0 and os.path.exists(path) else ""
    table = re.search(r'<table class="tags" id="tags">(.*?)</table>', page, re.S)
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1) if table else "", re.S)
    cells = [re.findall(r"<t[dh][^>]*>([^<]*)</t[dh]>", row) for row in rows]
    check(len(cells) == 3 and cells[0][:5] == ["tag", "allocs", "requested", "peak live", "live at end"]
          and cells[1][:4] == ["kv", "12", "24.3 MiB", "24.3 MiB"] and cells[1][6:8] == ["1", "1"]
          and cells[1][-2:] == ["0.070252 s", "awake"]
          and cells[2][:2] == ["(not put down to a tag)", "5"],
          "html: the by-tag table has kv (12 allocations, one sleep, one wake) and the rest %s" % cells[1:])
    b = browser()
    if not b:
        return
    url = "file://" + path
    dom = dump_dom(b, url, tmp, size=(1040, 800))
    bands = re.findall(r'<rect [^>]*class="sleep-band" data-tag="([^"]*)"', dom)
    check(bands == ["kv"], "html: one band of kv asleep over the timeline %s" % bands)
    labels = re.findall(r'class="sleep-label"[^>]*>([^<]*)<', dom)
    check(labels == ["kv \u00b7 host"], "html: the band is labelled with its tag and mode %s" % labels)
    marks = re.findall(r'class="sleep-marker" data-tag="kv"><title>([^<]*)</title>', dom)
    check(len(marks) == 2 and marks[0].startswith("sleep kv (host): device memory given back 26.00 MiB, copied to "
                                                  "the host 24.00 MiB") and marks[1].startswith("wake kv"),
          "html: the sleep and the wake are marked, with what moved %s" % marks)
    check(len(re.findall(r'class="sleep-move"', dom)) == 2, "html: the sleep and the wake calls are darker bands")
    legend = re.search(r'<g id="timeline-legend">(.*?)</g>', dom, re.S)
    check(legend and "kv asleep" in legend.group(1) and "wake" in legend.group(1),
          "html: the legend names kv's band and the moves")
    ticks, ok = x_ticks(dom)
    check(ok and ticks[0] == "0 ms", "html: time ticks are round numbers in one unit %s" % ticks)
    zoomed = dump_dom(b, url + "?zoom=0.07,0.09", tmp, size=(1040, 800))
    ticks, ok = x_ticks(zoomed)
    check(ok and ticks[0] == "70 ms" and ticks[-1] == "90 ms", "html: zoomed, the ticks stay round %s" % ticks)
    check('data-bands-shown="1"' in zoomed, "html: zoomed into kv's sleep, its band is drawn")
    # Two tags (test_report's hand-built trace): a band each, their labels on rows of their own, a
    # failed wake marked with its error named.
    tags_trace = os.path.join(tmp, "tags.trace")
    with open(tags_trace, "w") as f:
        f.write(TAGS_TRACE)
    tags_page = os.path.join(tmp, "tags.html")
    report(tags_trace, "--html", tags_page)
    dom2 = dump_dom(b, "file://" + tags_page, tmp, size=(1040, 800))
    bands = re.findall(r'<rect [^>]*class="sleep-band" data-tag="([^"]*)"', dom2)
    rows = re.findall(r'<text x="[\d.]+" y="([\d.]+)"[^>]*class="sleep-label"[^>]*>([^<]*)<', dom2)
    check(bands == ["kv", "weights"]
          and [t for _, t in rows] == ["kv \u00b7 mapped", "weights \u00b7 discard (still asleep)"]
          and len({y for y, _ in rows}) == 2, "html: two tags, two bands, labels on two rows %s %s" % (bands, rows))
    failed = re.findall(r'stroke="#000" class="sleep-marker" data-tag="kv"><title>([^<]*)</title>', dom2)
    check(len(failed) == 1 and failed[0].endswith("FAILED: -12 (ENOMEM)"),
          "html: the failed wake is outlined, its error named %s" % failed)
    png = os.path.join(tmp, "sleep-band.png")
    if screenshot(b, url + "?only=chart-timeline-section", png, (1040, 420), tmp):
        # kv's colour (#e15759) at 15 % (asleep) and 30 % (moving) over the page: red above green and
        # blue, which the live and mapped series never are
        w, h, bpp, rows = png_pixels(png)
        red = sum(1 for row in rows for x in range(0, w * bpp, bpp)
                  if row[x] > row[x + 1] + 12 and row[x] > row[x + 2] + 12)
        check(red > 20000, "html: chromium paints the bands (%d reddish pixels)" % red)
    else:
        check(False, "html: chromium screenshot of the timeline")


def main():
    with scratch("vmmshim-report-html-") as tmp:
        trace = os.path.join(tmp, "tib.trace")
        write_trace(trace)
        page_path = os.path.join(tmp, "tib.html")
        r = report(trace, "--html", page_path, "--by-site")
        check(r.returncode == 0 and os.path.exists(page_path), "report --html runs (%s)" % r.stderr.strip()[-200:])
        page = open(page_path).read() if os.path.exists(page_path) else ""
        test_static(page, [1, 2, 3])
        check(re.search(r"^ +3 +12288  \(empty stack\)$", r.stdout, re.M) is not None,
              "--by-site: the stack with no frames is the site '(empty stack)'")
        srcs = glob.glob(os.path.join(ROOT, "scripts", "vmmshim_report", "*.py"))
        n = sum(open(p).read().count('"(empty stack)"') for p in srcs)
        check(n == 1, "the package spells '(empty stack)' once (%d)" % n)
        test_rendered(page_path, tmp)
        test_sleeps(tmp)
        one = os.path.join(tmp, "one.trace")
        with open(one, "w") as f:
            f.write("v 2 vmmshim 0.1.0\np 1 0 0\ns 0 0\nn 1 %s\nn 2 forward\nk 1 0 1 1 2 12\n"
                    "a 10 1 0 0 - 1000 100 100 1\ne 30\n" % TRAIN)
        r = report(one, "--by-site")
        check("1 distinct stack in 1 of 1 allocations, 1 site\n" in r.stdout,
              "--by-site: one stack and one site in the singular %s" % re.findall(r".*distinct.*", r.stdout))
        r = report(one)
        check("call sites: 1 distinct stack (" in r.stdout, "summary: one stack in the singular %s"
              % re.findall(r".*distinct.*", r.stdout))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
