"""The command line of vmmshim-report."""

import argparse
import json
import pickle
import re
import sys

from . import html_page
from .common import PROG, TraceError
from .memory_viz import memory_viz
from .perfetto import perfetto
from .progress import Progress
from .reading import Trace
from .sites import SiteRule, text_sites
from .summary import Analysis
from .symbols import Symboliser

DESCRIPTION = "vmmshim-report: summarise a vmmshim allocation trace."


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    ap.add_argument("trace", help="trace file (native or rmm format), or - for stdin")
    ap.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML page with charts")
    ap.add_argument("--memory-viz", metavar="OUT.pickle",
                    help="write a snapshot for PyTorch's memory_viz (pytorch.org/memory_viz)")
    ap.add_argument("--viz-events", type=int, default=100000, metavar="N",
                    help="events kept in the memory_viz snapshot's device_traces (the last N; default 100000)")
    ap.add_argument("--perfetto", metavar="OUT.json",
                    help="write a Chrome/Perfetto trace: counter tracks and the largest allocations as slices")
    ap.add_argument("--perfetto-allocs", type=int, default=10000, metavar="N",
                    help="the N largest allocations go into the Perfetto trace as slices named by call site, "
                         "with the stack in their args (default 10000; 0: none)")
    ap.add_argument("--short-ms", type=float, default=1.0, metavar="MS",
                    help="allocations freed sooner than this are short-lived (default 1)")
    ap.add_argument("--top", type=int, default=5, metavar="N",
                    help="rows of the largest leaks and of each call-site table (default 5; HTML: at least 25)")
    ap.add_argument("--by-site", action="store_true",
                    help="print the top call sites: by live bytes at the peak, bytes allocated, count, leaks")
    ap.add_argument("--site-skip", action="append", default=[], metavar="REGEX",
                    help="skip frames whose text matches REGEX when choosing a call site (repeatable)")
    ap.add_argument("--site-libs", action="store_true",
                    help="Python frames of installed packages and the standard library can be sites too")
    ap.add_argument("--site-depth", type=int, default=1, metavar="N",
                    help="a call site is N frames: the site frame and N-1 callers (default 1)")
    ap.add_argument("--addr2line", metavar="PROG",
                    help="symboliser (default: binutils' addr2line, else elfutils' eu-addr2line)")
    ap.add_argument("--debug-dir", action="append", default=[], metavar="DIR",
                    help="look for DIR/.build-id/xx/yyyy.debug debug files (repeatable; /usr/lib/debug always)")
    ap.add_argument("--sysroot", metavar="DIR", default="",
                    help="look for the traced modules under DIR first (a copy of the traced machine's files)")
    ap.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")
    args = ap.parse_args(argv)
    try:
        rule = SiteRule(args.site_skip, args.site_depth, args.site_libs)
    except re.error as e:
        print("%s: error: --site-skip: %s" % (PROG, e), file=sys.stderr)
        return 2
    try:
        trace = Trace(args.trace)
    except (OSError, TraceError) as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2
    progress = Progress(PROG, enabled=not args.no_progress)
    try:
        a = Analysis(trace, short_ns=int(args.short_ms * 1e6), viz_events=args.viz_events if args.memory_viz else 0,
                     perfetto_allocs=args.perfetto_allocs if args.perfetto else 0, progress=progress)
        if a.has_stacks() and (args.by_site or args.html or args.memory_viz or args.perfetto):
            a.symbolise(Symboliser(args.addr2line, args.debug_dir, args.sysroot), progress)
        progress.set_phase("writing")
        text = a.text(top=args.top, hint=not args.by_site)
        if args.by_site:
            text += "\n" + text_sites(a, rule, top=args.top)
        outputs = []
        if args.html:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(html_page.page(a, rule, top=max(args.top, 25)))
            outputs.append("html: %s" % args.html)
        if args.memory_viz:
            with open(args.memory_viz, "wb") as f:
                pickle.dump(memory_viz(a), f, protocol=4)  # memory_viz's reader knows protocols 2 to 4
            outputs.append("memory_viz snapshot: %s (open it at https://pytorch.org/memory_viz)" % args.memory_viz)
        if args.perfetto:
            with open(args.perfetto, "w", encoding="utf-8") as f:
                json.dump(perfetto(a, rule), f, separators=(",", ":"))
            outputs.append("perfetto trace: %s (open it at https://ui.perfetto.dev)" % args.perfetto)
    finally:
        progress.stop()
    sys.stdout.write(text)
    for line in outputs:
        print(line)
    return 0


def run():
    """The entry script's main: exit status of main(); a closed stdout (| head) is no error."""
    try:
        return main()
    except BrokenPipeError:
        return 0
