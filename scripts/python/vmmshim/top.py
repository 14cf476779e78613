"""`vmmshim top`: every process under vmmshim this user can reach, refreshed every second, in a
terminal of 80 columns (curses, so it works over plain ssh); `q` quits. --once prints one frame
to standard output and exits, for scripts.

Per process: live, mapped (on the device), asleep and host bytes, allocations per second since
the last frame, VMM calls and out-of-memory answers so far; below it, one line per tag that holds
memory. A process that does not answer in time, or answers something that is not a status reply,
is a row with the reason; every name a process sent is printed with its control characters
escaped (text.clean)."""
import sys
import time

from . import client, text
from .client import EXIT_OK, EXIT_USAGE

WIDTH = 79  # of 80 columns: curses cannot write the last column of the last line
ROW = "%6s %-14s %-3s %7s %7s %7s %7s %7s %7s %4s"
HEADER = ROW % ("PID", "PROGRAM", "DEV", "LIVE", "MAPPED", "ASLEEP", "HOST", "ALLOC/s", "VMM", "OOM")
ANSWER_TIMEOUT = 1.0  # for all the processes of a frame together: they are asked at once


def sample(pids=None):
    """[(pid, status reply or None, why)] for every reachable process (of pids, when given)."""
    return client.statuses(ANSWER_TIMEOUT, pids)


def _allocs(st):
    return sum(st["stats"]["allocs"])


def frame(samples, previous, now=None, interactive=False):
    """The lines of one frame (each at most WIDTH characters). previous: {pid: status} of the last
    frame, for the rates."""
    now = now if now is not None else time.time()
    c = text.clean
    ok = [st for _, st, _ in samples if st and st["ok"]]
    live = sum(d["live"] for st in ok for d in st["devices"])
    mapped = sum(st["mapped"] for st in ok)
    asleep = sum(client.asleep(t) for st in ok for t in st["tags"])
    host = sum(st["host"]["in_use"] for st in ok)
    title = "vmmshim top - %d process%s - %s" % (len(samples), "" if len(samples) == 1 else "es",
                                                time.strftime("%H:%M:%S", time.localtime(now)))
    if interactive:
        title = title + " " * max(1, WIDTH - len(title) - len("q quits")) + "q quits"
    lines = [title,
             "live %s, mapped %s, asleep %s, host %s" % (text.size(live), text.size(mapped), text.size(asleep),
                                                         text.size(host)),
             "", HEADER]
    if not samples:
        lines.append("(no process under vmmshim that this user can reach)")
    for pid, st, why in samples:
        if not st or not st["ok"]:
            reason = why or "%s: %s" % ((st or {}).get("error") or "refused", (st or {}).get("message") or "")
            lines.append(("%6d %-14s %s" % (pid, c(client.program_of(pid))[:14], c(reason)))[:WIDTH])
            continue
        before = previous.get(pid)
        rate = "-"
        if before and st["time_ns"] > before["time_ns"]:
            rate = text.count((_allocs(st) - _allocs(before)) / ((st["time_ns"] - before["time_ns"]) / 1e9))
        devs = ",".join(str(d["device"]) for d in st["devices"]) or "-"
        p_asleep = sum(client.asleep(t) for t in st["tags"])
        lines.append(ROW % (pid, c(st["program"])[:14], devs[:3], text.short(sum(d["live"] for d in st["devices"])),
                            text.short(st["mapped"]), text.short(p_asleep), text.short(st["host"]["in_use"]), rate,
                            text.count(st["stats"]["vmm_calls"]), text.count(st["stats"]["alloc_failures"])))
        for t in st["tags"]:
            t_asleep = client.asleep(t)
            if not (t["live"] or t["device"] or t_asleep) and t["name"] != st["process_tag"]:
                continue
            name = ("*" if t["name"] == st["process_tag"] else " ") + c(t["name"])
            state = "asleep" if t["asleep"] else ""
            lines.append((ROW % ("", (" " + name)[:14], "", text.short(t["live"]), text.short(t["device"]),
                                 text.short(t_asleep), text.short(t["host_copied"] + t["host_mapped"]), state, "",
                                 "")).rstrip())
    lines.append("")
    lines.append("* the tag new allocations go to; sizes in bytes (K, M, G: powers of 1024)")
    return [line[:WIDTH] for line in lines]


def _interactive(interval, pids):
    import curses

    def loop(scr):
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        scr.timeout(int(interval * 1000))
        previous = {}
        while True:
            samples = sample(pids)
            lines = frame(samples, previous, interactive=True)
            previous = {pid: st for pid, st, _ in samples if st and st["ok"]}
            scr.erase()
            rows, cols = scr.getmaxyx()
            for y, line in enumerate(lines[:rows]):
                try:
                    scr.addnstr(y, 0, line, max(0, cols - 1), curses.A_REVERSE if y == 3 else curses.A_NORMAL)
                except curses.error:
                    pass
            scr.refresh()
            start = time.monotonic()
            while time.monotonic() - start < interval:
                ch = scr.getch()
                if ch in (ord("q"), ord("Q")):
                    return
                if ch == curses.KEY_RESIZE:
                    break

    curses.wrapper(loop)


def main(args):
    args = list(args)
    once = False
    interval = 1.0
    pids = None
    while args:
        a = args.pop(0)
        if a == "--once":
            once = True
        elif a in ("--interval", "-n") and args:
            try:
                interval = max(0.2, float(args.pop(0)))
            except ValueError:
                print("vmmshim: error: top: --interval takes seconds", file=sys.stderr)
                return EXIT_USAGE
        elif a == "--pid" and args:
            v = args.pop(0)
            pids = text.parse_pids(v)
            if pids is None:
                print("vmmshim: error: top: --pid: '%s' is not a list of process ids" % v, file=sys.stderr)
                return EXIT_USAGE
        elif a in ("-h", "--help"):
            print("Usage: vmmshim top [--once] [--interval SECONDS] [--pid PID[,PID...]]\n"
                  "Every process under vmmshim this user can reach, refreshed every second; q quits.\n"
                  "--once prints one frame and exits; --pid shows only those processes.")
            return EXIT_OK
        else:
            print("vmmshim: error: top: unknown argument '%s' (see vmmshim top --help)" % a, file=sys.stderr)
            return EXIT_USAGE
    if once:
        print("\n".join(frame(sample(pids), {})))
        return EXIT_OK
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        print("vmmshim: error: top needs a terminal; vmmshim top --once prints one frame", file=sys.stderr)
        return EXIT_USAGE
    try:
        _interactive(interval, pids)
    except KeyboardInterrupt:
        pass
    return EXIT_OK
