"""The residue over time: what stayed on each device after each sleep, by owner (the `r` records
of a version-4 trace), and the memory made outside the shim's pools (`u` records)."""

import html

from .common import fmt_size

# The owners of `r` records (docs/trace-format.md), in the order of the table's columns.
TOTAL, USED, TAGS, LIBRARY, MANAGED, GRAPH, CONTEXT, OTHERS, UNEXPLAINED, HOST, ARRAYS, MODULES, PROCESS, INFERRED, \
    NAME = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15)
COLUMNS = ("sleep", "time", "device", "used", "tags", "libraries", "managed", "graphs", "arrays", "context", "modules",
           "inferred", "others", "unexplained")
# -1: the libraries' sum
FIGURES = (USED, TAGS, -1, MANAGED, GRAPH, ARRAYS, CONTEXT, MODULES, INFERRED, OTHERS, UNEXPLAINED)
OUTSIDE_KINDS = ("VMM", "managed", "pinned host", "arrays")
U64 = 1 << 64


SITES = 8  # call sites listed


def site_name(caller, trace):
    """A return address as LIBRARY+0xOFFSET, its offset from the load base of the module (`l` record)
    that holds it; the address itself where the trace has no module record for it (the shim writes
    them with VMMSHIM_TRACE_STACKS)."""
    for table in reversed(getattr(trace, "mod_tables", None) or []):
        for lo, hi, m in table:
            if lo <= caller < hi:
                return "%s+0x%x" % (m.path.rsplit("/", 1)[-1], caller - m.bias)
    return "0x%x (no module record)" % caller


def _signed(n):
    return ("-" + fmt_size(-n)) if n < 0 else fmt_size(n)


def _libs_text(libs):
    """The libraries' VMM bytes, largest first."""
    return ", ".join("%s %s" % (name, fmt_size(n)) for name, n in sorted(libs.items(), key=lambda x: -x[1]))


class Residue:
    """The residues of a trace, by sleep: each a dict of device -> {owner: bytes}, the libraries'
    VMM bytes and the pinned host bytes; and the outside memory's counts (made, freed by kind)."""

    def __init__(self):
        self.by_seq = {}  # seq -> {"t": t, "devices": {dev: {owner: bytes}}, "libs": {name: bytes}, "host": n}
        self.names = {}  # library index -> name (the latest `r` name record)
        self.outside = [[0, 0, 0, 0] for _ in OUTSIDE_KINDS]  # kind -> [made, bytes made, freed, bytes freed]
        self.live = {}  # (kind, key) -> site of memory made outside the pools and not freed
        self.sites = {}  # (caller, kind) -> live bytes
        self.trace = None

    def add_outside(self, op, size, key=0, caller=0, trace=None):
        kind, freed = op // 2, op % 2
        if 0 <= kind < len(OUTSIDE_KINDS):
            row = self.outside[kind]
            row[2 * freed] += 1
            row[2 * freed + 1] += size
            if freed:
                site = self.live.pop((kind, key), None)
                if site is not None:
                    self.sites[site] -= size
            elif caller:
                self.trace = trace
                site = (caller, OUTSIDE_KINDS[kind])  # named at the end, when every module is known
                self.live[(kind, key)] = site
                self.sites[site] = self.sites.get(site, 0) + size

    def site_text(self):
        """The call sites that hold the most of the memory made outside the pools at the end."""
        top = sorted(((n, s) for s, n in self.sites.items() if n > 0), key=lambda x: (-x[0], x[1]))[:SITES]
        return ["  %s: %s %s" % (site_name(caller, self.trace), fmt_size(n), kind) for n, (caller, kind) in top]

    def add(self, t, owner, dev, seq, nbytes, lib):
        r = self.by_seq.setdefault(seq, {"t": t, "devices": {}, "libs": {}, "host": 0})
        if owner == LIBRARY:
            r["libs"][self.names.get(lib, "#%d" % lib)] = nbytes
        elif owner == HOST:
            r["host"] = nbytes
        elif dev >= 0:
            if owner == UNEXPLAINED and nbytes >= U64 // 2:
                nbytes -= U64  # signed: more explained than in use
            r["devices"].setdefault(dev, {})[owner] = nbytes

    def rows(self):
        """(seq, t, dev, figures by owner) in order of sleep and device."""
        for seq in sorted(self.by_seq):
            r = self.by_seq[seq]
            for dev in sorted(r["devices"]):
                yield seq, r["t"], dev, r["devices"][dev]

    def figures(self, seq, f):
        """The FIGURES of one row (f: its device's {owner: bytes}), the libraries' summed."""
        return [sum(self.by_seq[seq]["libs"].values()) if owner == -1 else f.get(owner, 0) for owner in FIGURES]

    def text(self):
        out = []
        made = [k for k, row in enumerate(self.outside) if row[0] or row[2]]
        if made:
            out.append("memory made outside the shim's pools:")
            for k in made:
                row = self.outside[k]
                out.append("  %-12s made %d (%s), freed %d (%s)" % (OUTSIDE_KINDS[k], row[0], fmt_size(row[1]), row[2],
                                                                   fmt_size(row[3])))
            sites = self.site_text()
            if sites:
                out.append("  largest call sites still holding it at the end:")
                out.extend("  " + line for line in sites)
        if self.by_seq:
            if out:
                out.append("")
            out.append("residue after each sleep (what stayed on the device, by owner):")
            out.append("  " + " ".join("%11s" % c for c in COLUMNS))
            first = {}
            for seq, t, dev, f in self.rows():
                cells = ["%11d" % seq, "%10.3fs" % (t / 1e9), "%11d" % dev]
                cells.extend("%11s" % _signed(n) for n in self.figures(seq, f))
                out.append("  " + " ".join(cells))
                first.setdefault(dev, f.get(USED, 0))
                grew = f.get(USED, 0) - first[dev]
                if grew > 0:
                    out.append("  %11s %s more in use than after the first sleep" % ("", fmt_size(grew)))
            last = self.by_seq[max(self.by_seq)]
            if last["libs"]:
                out.append("  libraries' own VMM memory after the last sleep: " + _libs_text(last["libs"]))
            if last["host"]:
                out.append("  pinned host memory made outside the pools: %s" % fmt_size(last["host"]))
        return out

    def html(self):
        if not self.by_seq:
            return ""
        esc = html.escape
        out = ["<section id=\"residue-section\"><h2>Residue after each sleep</h2>\n<p class=\"ctl\">What stayed on "
               "each device after each sleep, by owner: the shim's pools (tags), the VMM memory libraries made "
               "themselves, managed and graph memory, arrays, contexts and loaded modules (measured around their "
               "creation), this process's memory that no measured owner explains (inferred from NVML), other "
               "processes, and what none of these explain.</p>\n<table class=\"tags\" id=\"residue\"><tr>%s</tr>\n" % "".join(
                   "<th>%s</th>" % esc(c) for c in COLUMNS)]
        for seq, t, dev, f in self.rows():
            tds = ["<td>%d</td>" % seq, "<td>%.3f s</td>" % (t / 1e9), "<td>%d</td>" % dev]
            tds.extend("<td title=\"%d B\">%s</td>" % (n, esc(_signed(n))) for n in self.figures(seq, f))
            out.append("<tr>%s</tr>\n" % "".join(tds))
        out.append("</table>\n")
        last = self.by_seq[max(self.by_seq)]
        if last["libs"]:
            out.append("<p>Libraries' own VMM memory after the last sleep: %s</p>\n" % esc(_libs_text(last["libs"])))
        out.append("</section>\n")
        return "".join(out)
