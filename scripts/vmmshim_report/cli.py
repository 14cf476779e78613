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
from .tool import Output, OutputError, ToolParser, milliseconds, positive_number, whole_number

PARAGRAPHS = [
    "Reads TRACE, a trace written by vmmshim (native format, versions 1 to 4; the shim writes 4) or"
    " in RAPIDS RMM's logging_resource_adaptor CSV format (vmmshim --trace-format rmm), or - for "
    "standard input, and prints peak live and mapped bytes, fragmentation at the peak, allocations "
    "by size class, leaks, short-lived allocations, time spent growing pools and counts per API. "
    "With the call stacks of a trace of version 2 or later (vmmshim --stacks N) it lists where "
    "memory went by call site. With the sleeps and wakes of a version-3 trace it lists them, and a "
    "table by tag: allocations, live bytes, bytes put to sleep, copied to the host and woken, and "
    "the time asleep. It can also write a self-contained HTML page (where asleep tags are bands "
    "over the memory chart), a snapshot for PyTorch's memory_viz and a Chrome/Perfetto trace.",
    "The trace is streamed: traces of tens of millions of events fit in memory. A line that is "
    "malformed or holds a value out of range is skipped and counted (the first three with a warning). "
    "The output files and the numbers given are checked before the trace is read.",
]


def parser():
    ap = ToolParser(PROG, "[options] TRACE", "Summarise a vmmshim allocation trace.", PARAGRAPHS,
                    environment=[("VMMSHIM_PROGRESS_DELAY", "seconds before the progress line shows on a terminal "
                                  "(default 1)")],
                    exit_status="0 when the report is written; 2 for a bad option or number, an output that cannot "
                                "be written, or a TRACE that cannot be read (missing, not a trace, a newer format).",
                    see_also="vmmshim(1), vmmshim-replay(1).")
    ap.add_argument("trace", help=argparse.SUPPRESS)
    ap.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML page with charts")
    ap.add_argument("--memory-viz", metavar="OUT.pickle",
                    help="write a snapshot for PyTorch's memory_viz (pytorch.org/memory_viz)")
    ap.add_argument("--viz-events", type=whole_number, default=100000, metavar="N",
                    help="events kept in the memory_viz snapshot's device_traces (the last N; default 100000)")
    ap.add_argument("--perfetto", metavar="OUT.json",
                    help="write a Chrome/Perfetto trace: counter tracks, and the largest allocations and the tags' "
                         "sleeps as slices")
    ap.add_argument("--perfetto-allocs", type=whole_number, default=10000, metavar="N",
                    help="the N largest allocations go into the Perfetto trace as slices named by call site, "
                         "with the stack in their args (default 10000; 0: none)")
    ap.add_argument("--short-ms", type=milliseconds, default=1.0, metavar="MS",
                    help="allocations freed sooner than this are short-lived (default 1)")
    ap.add_argument("--top", type=whole_number, default=5, metavar="N",
                    help="rows of the largest leaks and of each call-site table (default 5; HTML: at least 25)")
    ap.add_argument("--by-site", action="store_true",
                    help="print the top call sites: by live bytes at the peak, bytes allocated, count, leaks")
    ap.add_argument("--site-skip", action="append", default=[], metavar="REGEX",
                    help="skip frames whose text matches REGEX when choosing a call site (repeatable)")
    ap.add_argument("--site-libs", action="store_true",
                    help="Python frames of installed packages and the standard library can be sites too")
    ap.add_argument("--site-depth", type=positive_number, default=1, metavar="N",
                    help="a call site is N frames: the site frame and N-1 callers (default 1)")
    ap.add_argument("--addr2line", metavar="PROG",
                    help="symboliser (default: binutils' addr2line, else elfutils' eu-addr2line)")
    ap.add_argument("--debug-dir", action="append", default=[], metavar="DIR",
                    help="look for DIR/.build-id/xx/yyyy.debug debug files (repeatable; /usr/lib/debug always)")
    ap.add_argument("--sysroot", metavar="DIR", default="",
                    help="look for the traced modules under DIR first (a copy of the traced machine's files)")
    ap.add_argument("--no-progress", action="store_true", help="no progress line on a terminal")
    ap.add_help_and_version()
    return ap


def error(msg):
    print("%s: error: %s" % (PROG, msg), file=sys.stderr)
    return 2


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        rule = SiteRule(args.site_skip, args.site_depth, args.site_libs)
    except re.error as e:
        return error("--site-skip: %s" % e)
    outputs = {}  # option -> Output, all opened before the trace is read
    try:
        for opt, path in (("--html", args.html), ("--memory-viz", args.memory_viz), ("--perfetto", args.perfetto)):
            if path:
                outputs[opt] = Output(opt, path)
        trace = Trace(args.trace)
        return report(args, rule, trace, outputs)
    except BrokenPipeError:  # stdout closed (| head): run() ends quietly
        raise
    except OSError as e:  # the trace: its path and the reason, not Python's "[Errno N]"
        return error("%s: %s" % (e.filename or args.trace, e.strerror or e))
    except (TraceError, OutputError) as e:
        return error(e)
    finally:
        for out in outputs.values():
            out.discard()


def write(out, mode, produce):
    """Writes what produce(file) writes into the Output out; its OSError becomes an OutputError."""
    try:
        with out.open(mode) as f:
            produce(f)
    except OSError as e:
        raise out.failed(e)


def report(args, rule, trace, outputs):
    progress = Progress(PROG, enabled=not args.no_progress)
    printed = []
    try:
        a = Analysis(trace, short_ns=int(args.short_ms * 1e6), viz_events=args.viz_events if args.memory_viz else 0,
                     perfetto_allocs=args.perfetto_allocs if args.perfetto else 0, progress=progress)
        if a.has_stacks() and (args.by_site or args.html or args.memory_viz or args.perfetto):
            a.symbolise(Symboliser(args.addr2line, args.debug_dir, args.sysroot), progress)
        progress.set_phase("writing")
        text = a.text(top=args.top, hint=not args.by_site)
        if args.by_site:
            text += "\n" + text_sites(a, rule, top=args.top)
        if args.html:
            write(outputs["--html"], "w", lambda f: f.write(html_page.page(a, rule, top=max(args.top, 25))))
            printed.append("html: %s" % args.html)
        if args.memory_viz:
            # memory_viz's reader knows pickle protocols 2 to 4
            write(outputs["--memory-viz"], "wb", lambda f: pickle.dump(memory_viz(a), f, protocol=4))
            printed.append("memory_viz snapshot: %s (open it at https://pytorch.org/memory_viz)" % args.memory_viz)
        if args.perfetto:
            write(outputs["--perfetto"], "w", lambda f: json.dump(perfetto(a, rule), f, separators=(",", ":")))
            printed.append("perfetto trace: %s (open it at https://ui.perfetto.dev)" % args.perfetto)
    finally:
        progress.stop()
    sys.stdout.write(text)
    for line in printed:
        print(line)
    return 0


def run():
    """The entry script's main: exit status of main(); a closed stdout (| head) is no error."""
    try:
        return main()
    except BrokenPipeError:
        return 0
