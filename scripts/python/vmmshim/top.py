"""`vmmshim top`: every process under vmmshim this user can reach, refreshed every second, in
the whole terminal (curses, so it works over plain ssh; the size is read again on a resize); `q`
quits, `s` or a key's first letter changes the order. --once prints one frame to standard output
and exits, for scripts: as wide as the terminal it prints to (80 columns into a pipe), every
process.

Per process: live, mapped (on the device), asleep and host bytes, allocations per second since
the last frame, VMM calls and out-of-memory answers so far; below it, a line "(outside)" for the
memory libraries made themselves outside the pools (device and pinned host), when there is any,
and one line per tag that holds memory. The name column takes the width the other columns leave. Processes come in the order of
the sort key (mapped bytes, most first, by default); those that do not fit the terminal's height
are counted on a last line, "... N more (sorted by KEY)". A process that does not answer in time,
or answers something that is not a status reply, is a row with the reason; every name a process
sent is printed with its control characters escaped (text.clean)."""
import difflib
import shutil
import sys
import time

from . import client, text
from .client import EXIT_OK, EXIT_USAGE

WIDTH = 79  # of 80 columns: curses cannot write the last column of the last line
NAME = 14   # the name column at 80 columns; wider terminals widen it
ROW = "%7s %-*s %-3s %7s %7s %7s %7s %7s %7s %4s"
COLUMNS = ("PID", "PROGRAM", "DEV", "LIVE", "MAPPED", "ASLEEP", "HOST", "ALLOC/s", "VMM", "OOM")
FIXED = len(ROW % (("", 0) + ("",) * 9))  # what the columns but the name take
ANSWER_TIMEOUT = 1.0  # for all the processes of a frame together: they are asked at once
LEGEND = "* the tag new allocations go to; sizes in bytes (K, M, G: powers of 1024)"


def _live(st):
    return sum(d["live"] for d in st["devices"])


def _asleep(st):
    return sum(client.asleep(t) for t in st["tags"])


# Sort keys: (what `--sort` and the help call it, the order it gives, the key of a process with
# figures). Numbers sort most first; processes without figures come last, by pid.
SORTS = {
    "mem": ("mapped bytes, then live, most first", lambda st: (-st["mapped"], -_live(st))),
    "live": ("live bytes, most first", lambda st: (-_live(st), -st["mapped"])),
    "asleep": ("asleep bytes, most first", lambda st: (-_asleep(st), -st["mapped"])),
    "host": ("host memory in use, most first", lambda st: (-st["host"]["in_use"], -st["mapped"])),
    "name": ("program name", lambda st: (text.clean(st["program"]),)),
    "pid": ("process id", lambda st: ()),
}
SORT_ORDER = ("mem", "live", "asleep", "host", "name", "pid")  # the order `s` goes through
DEFAULT_SORT = "mem"
SORT_KEYS = {k[0]: k for k in SORT_ORDER}  # a key's first letter picks it in the interactive view


def sample(pids=None):
    """[(pid, status reply or None, why)] for every reachable process (of pids, when given)."""
    return client.statuses(ANSWER_TIMEOUT, pids)


def ordered(samples, key=DEFAULT_SORT):
    """samples in the order of sort key `key`."""
    rank = SORTS[key][1]

    def order(sample):
        pid, st, _ = sample
        if st and st["ok"]:
            return (0,) + rank(st) + (pid,)
        return (1, pid)
    return sorted(samples, key=order)


def _allocs(st):
    return sum(st["stats"]["allocs"])


def _block(pid, st, why, previous, name):
    """The lines of one process: its row and a line per tag that holds memory."""
    c = text.clean
    if not st or not st["ok"]:
        reason = why or "%s: %s" % ((st or {}).get("error") or "refused", (st or {}).get("message") or "")
        return ["%7d %-*s %s" % (pid, name, c(client.program_of(pid))[:name], c(reason))]
    before = previous.get(pid)
    rate = "-"
    if before and st["time_ns"] > before["time_ns"]:
        rate = text.count((_allocs(st) - _allocs(before)) / ((st["time_ns"] - before["time_ns"]) / 1e9))
    devs = ",".join(str(d["device"]) for d in st["devices"]) or "-"
    lines = [ROW % (pid, name, c(st["program"])[:name], devs[:3], text.short(_live(st)), text.short(st["mapped"]),
                    text.short(_asleep(st)), text.short(st["host"]["in_use"]), rate,
                    text.count(st["stats"]["vmm_calls"]), text.count(st["stats"]["alloc_failures"]))]
    out = st.get("outside")
    out = out if isinstance(out, dict) else {}
    dev_out = out.get("vmm", 0) + out.get("managed", 0)
    if dev_out or out.get("host"):  # memory libraries made themselves
        lines.append((ROW % ("", name, " (outside)"[:name], "", text.short(dev_out), text.short(dev_out), "",
                             text.short(out.get("host", 0)), "libs", "", "")).rstrip())
    for t in st["tags"]:
        t_asleep = client.asleep(t)
        if not (t["live"] or t["device"] or t_asleep) and t["name"] != st["process_tag"]:
            continue
        tag = ("*" if t["name"] == st["process_tag"] else " ") + c(t["name"])
        state = "asleep" if t["asleep"] else ""
        lines.append((ROW % ("", name, (" " + tag)[:name], "", text.short(t["live"]), text.short(t["device"]),
                             text.short(t_asleep), text.short(t["host_copied"] + t["host_mapped"]), state, "",
                             "")).rstrip())
    g = st.get("group")
    if isinstance(g, dict) and all(isinstance(g.get(k), int) for k in ("priority", "lent", "borrowed")) and \
            (g["lent"] or g["borrowed"]):
        lines.append("%7s   priority %d: lent %s, borrowed %s (VMMSHIM_ON_LIMIT=balloon)" % (
            "", g["priority"], text.short(g["lent"]), text.short(g["borrowed"])))
    return lines


def frame(samples, previous, now=None, interactive=False, width=WIDTH, height=None, sort=DEFAULT_SORT):
    """The lines of one frame, each at most width characters; at most height lines (None: every
    process). previous: {pid: status} of the last frame, for the rates."""
    now = now if now is not None else time.time()
    ok = [st for _, st, _ in samples if st and st["ok"]]
    # The name column: as wide as the longest name, within what the other columns leave.
    names = [len(text.clean(st["program"])) for st in ok] + [len(text.clean(t["name"])) + 2 for st in ok
                                                              for t in st["tags"]]
    name = max(NAME, min(width - FIXED, max(names, default=0)))
    title = "vmmshim top - %d process%s - %s" % (len(samples), "" if len(samples) == 1 else "es",
                                                time.strftime("%H:%M:%S", time.localtime(now)))
    if interactive:
        keys = "sort %s (s)  q quits" % sort
        title = title + " " * max(1, width - len(title) - len(keys)) + keys
    lines = [title,
             "live %s, mapped %s, asleep %s, host %s" % (
                 text.size(sum(_live(st) for st in ok)), text.size(sum(st["mapped"] for st in ok)),
                 text.size(sum(_asleep(st) for st in ok)), text.size(sum(st["host"]["in_use"] for st in ok))),
             "", (ROW % (COLUMNS[:1] + (name,) + COLUMNS[1:])).rstrip()]
    if not samples:
        lines.append("(no process under vmmshim that this user can reach)")
    blocks = [_block(pid, st, why, previous, name) for pid, st, why in ordered(samples, sort)]
    body = [line for b in blocks for line in b]
    if height is None or len(lines) + len(body) + 2 <= height:
        lines += body + ["", LEGEND]
    elif len(lines) + len(body) <= height:
        lines += body
    else:
        # Whole processes, in order, as many as leave a line for the count of the others.
        room = height - len(lines) - 1
        shown = 0
        for b in blocks:
            if len(b) > room and shown:
                break
            lines += b[:max(1, room)]
            room -= len(b)
            shown += 1
        if shown < len(blocks):
            lines.append("... %d more (sorted by %s)" % (len(blocks) - shown, sort))
        lines = lines[:height]
    return [line[:width] for line in lines]


def _size(scr):
    """(width, height) a frame may take: curses cannot write the last column of the last line."""
    rows, cols = scr.getmaxyx()
    return max(20, cols - 1), max(5, rows)


def _interactive(interval, pids, sort):
    import curses

    def loop(scr):
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        scr.timeout(int(interval * 1000))
        previous = {}
        key = sort
        fresh = True
        while True:
            if fresh:
                samples = sample(pids)
                now = time.time()
            width, height = _size(scr)
            lines = frame(samples, previous, now, interactive=True, width=width, height=height, sort=key)
            if fresh:
                previous = {pid: st for pid, st, _ in samples if st and st["ok"]}
            scr.erase()
            for y, line in enumerate(lines):
                try:
                    scr.addnstr(y, 0, line, width, curses.A_REVERSE if y == 3 else curses.A_NORMAL)
                except curses.error:
                    pass
            scr.refresh()
            start = time.monotonic()
            fresh = True
            while time.monotonic() - start < interval:
                ch = scr.getch()
                if ch in (ord("q"), ord("Q")):
                    return
                if ch == curses.KEY_RESIZE:
                    # Drawn again at once, at the new size (getmaxyx has it), from the same figures.
                    fresh = False
                    break
                if ch == ord("s"):
                    key = SORT_ORDER[(SORT_ORDER.index(key) + 1) % len(SORT_ORDER)]
                    fresh = False
                    break
                if 0 <= ch < 256 and chr(ch) in SORT_KEYS:
                    key = SORT_KEYS[chr(ch)]
                    fresh = False
                    break

    curses.wrapper(loop)


HELP = """\
Usage: vmmshim top [--once] [--interval SECONDS] [--pid PID[,PID...]] [--sort KEY]
Every process under vmmshim this user can reach, refreshed every second, in the
whole terminal; processes that do not fit are counted on the last line.
  --once         print one frame (every process, as wide as the terminal; 80
                 columns into a pipe) and exit
  --interval S   seconds between frames (default 1)
  --pid LIST     only those processes
  --sort KEY     the order of the processes (default mem):
%s
Keys: q quits; s: the next sort key; m, l, a, h, n, p: sort by that key.
Exit status: 0 done, 2 bad usage or no terminal (--once needs none).
""" % "\n".join("                   %-6s %s" % (k, SORTS[k][0]) for k in SORT_ORDER)


def _usage_error(why):
    print("vmmshim: error: top: %s" % why, file=sys.stderr)
    print("usage: vmmshim top [--once] [--interval SECONDS] [--pid PID[,PID...]] [--sort KEY] "
          "(vmmshim top --help: the sort keys)", file=sys.stderr)
    return EXIT_USAGE


def main(args):
    args = list(args)
    once = False
    interval = 1.0
    pids = None
    sort = DEFAULT_SORT
    while args:
        a = args.pop(0)
        value = None
        if "=" in a and a.startswith("--"):
            a, value = a.split("=", 1)
        if a in ("--interval", "-n", "--pid", "--sort") and value is None:
            if not args:
                return _usage_error("%s needs a value" % a)
            value = args.pop(0)
        if a == "--once":
            once = True
        elif a in ("--interval", "-n"):
            try:
                interval = max(0.2, float(value))
            except ValueError:
                return _usage_error("--interval takes seconds (got '%s')" % value)
        elif a == "--pid":
            pids = text.parse_pids(value)
            if pids is None:
                return _usage_error("--pid: '%s' is not a list of process ids" % value)
        elif a == "--sort":
            if value not in SORTS:
                near = difflib.get_close_matches(value, SORT_ORDER, n=1, cutoff=0.6)
                return _usage_error("--sort: '%s' is not a sort key (%s)%s" % (
                    value, ", ".join(SORT_ORDER), "; did you mean %s?" % near[0] if near else ""))
            sort = value
        elif a in ("-h", "--help"):
            sys.stdout.write(HELP)
            return EXIT_OK
        else:
            near = difflib.get_close_matches(a, ["--once", "--interval", "--pid", "--sort", "--help"], n=1,
                                             cutoff=0.6)
            return _usage_error("unknown argument '%s'%s" % (a, "; did you mean %s?" % near[0] if near else ""))
    if once:
        # A terminal's width when printing to one (COLUMNS first, as for ls); 80 columns otherwise.
        cols = shutil.get_terminal_size((WIDTH + 1, 24)).columns
        print("\n".join(frame(sample(pids), {}, width=max(20, cols - 1), sort=sort)))
        return EXIT_OK
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        print("vmmshim: error: top needs a terminal; vmmshim top --once prints one frame", file=sys.stderr)
        return EXIT_USAGE
    try:
        _interactive(interval, pids, sort)
    except KeyboardInterrupt:
        pass
    return EXIT_OK
