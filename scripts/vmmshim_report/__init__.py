"""vmmshim-report: summarise a vmmshim allocation trace.

Reads a trace written with VMMSHIM_TRACE (native format versions 1 to 4, docs/trace-format.md)
or with VMMSHIM_TRACE_FORMAT=rmm (RAPIDS RMM's logging_resource_adaptor CSV) and prints peak
live and mapped bytes, fragmentation at the peak, allocations by size class, leaks,
short-lived allocations, time spent growing pools and counts per API. With the call stacks of
a version-2 trace it lists where memory went by call site (--by-site); with the sleeps and
wakes of a version-3 trace, a table by tag. Optionally writes a self-contained HTML page
(--html), a PyTorch memory_viz snapshot (--memory-viz) and a Chrome/Perfetto trace
(--perfetto).

The file is streamed line by line; only live allocations, per-stack counters and a
downsampled time series are kept, so traces of tens of millions of events fit in memory.
Native frames are symbolised after reading, once per distinct address, with one addr2line
run per module. Python 3 standard library only.

The parts: reading (the trace readers), summary (the one-pass analysis and the text
summary), tags (sleeps, wakes and the by-tag table), symbols and sites (symbolisation, call
sites, --by-site), html_page (with page.js), memory_viz, perfetto, progress (the terminal's
progress line), tool (what the command lines of both tools share), cli (vmmshim-report's
command line). scripts/vmmshim-report runs cli.main; vmmshim-replay uses the reader."""

from .common import PROG, TraceError, fmt_bytes, fmt_pow2, set_prog, warn
from .progress import Progress
from .reading import FORMAT_VERSION, RMM_HEADER, Module, Trace
from .sites import NO_STACK, NO_STACKS, Site, SiteRule, Stacks, stackless_name
from .summary import API_NAMES, VMM_OPS, Analysis, Series, size_class
from .symbols import Frame, Symboliser
from .tool import VERSION, Output, OutputError, ToolParser, milliseconds, positive_number, whole_number

__all__ = ["PROG", "TraceError", "fmt_bytes", "fmt_pow2", "set_prog", "warn", "Progress", "FORMAT_VERSION",
           "RMM_HEADER", "Module", "Trace", "NO_STACK", "NO_STACKS", "Site", "SiteRule", "Stacks", "stackless_name",
           "API_NAMES", "VMM_OPS", "Analysis", "Series", "size_class", "Frame", "Symboliser", "VERSION", "Output",
           "OutputError", "ToolParser", "milliseconds", "positive_number", "whole_number"]
