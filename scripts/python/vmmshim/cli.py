"""`vmmshim ctl` and `vmmshim top`: the command lines (scripts/vmmshim hands them here)."""
import difflib
import json
import os
import signal
import sys

from . import client, groups, text
from .client import (EXIT_GONE, EXIT_NOT_SHIM, EXIT_OK, EXIT_OTHER_USER, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_USAGE,
                      Control, ControlError)

USAGE = """\
Usage: vmmshim ctl list [--json] [--pid PID[,PID...]]
       vmmshim ctl PID status [--json]
       vmmshim ctl PID tag NAME
       vmmshim ctl PID sleep TAG|--all [--mode discard|host|mapped|disk] [--level N]
       vmmshim ctl PID wake TAG|--all [--zero]
       vmmshim ctl PID trim
       vmmshim ctl PID limit SIZE
       vmmshim ctl PID dump
       vmmshim ctl PID release-host [--keep SIZE]
       vmmshim ctl PID promote
       vmmshim ctl PID rules [SPEC|--clear]
       vmmshim ctl PID priority [N]
       vmmshim ctl PID cold TAG [--mode mapped|host|discard|off]
"""

ABOUT = """\
       vmmshim top [--once] [--interval SECONDS] [--pid PID[,PID...]] [--sort KEY]
See and steer a program running under vmmshim, from outside (docs/control.md).

  list          the processes under vmmshim this user can reach (root: all);
                --pid: only those
  status        statistics, per device and per tag
  tag NAME      new allocations of the program go to tag NAME from now on
  sleep         give a tag's device memory back, keeping its addresses; --mode
                host (the default: the bytes are kept in host memory), discard,
                or mapped (the program runs on, over the link); --all: every tag,
                untagged included (memory allocated with no tag set);
                --level N: the whole process (0 idle memory, 1 host, 2 discard)
  wake          bring it back at the same addresses (--zero: discarded bytes
                wake as zeros)
  trim          give idle device memory back
  limit SIZE    cap on mapped bytes from now on (K, M, G suffixes; none: no cap)
  dump          the memory report (also written to the program's log)
  release-host  give back host memory kept for the next sleep
  promote       memory served from host memory past a limit (VMMSHIM_ON_LIMIT=
                host) back to the device, as far as the limit allows now
  rules         the tag rules and what each tagged; SPEC replaces them
                ("TAG=MATCHER;...", docs/tag-rules.md), --clear removes them
  priority      the process's priority in its group (0-1000; VMMSHIM_ON_LIMIT=
                balloon borrows from lower ones); no N: show it
  cold TAG      lend TAG first when a higher member needs room (--mode mapped,
                the default, host or discard; off: no longer)
  --group NAME  the limit and status of a group of processes (VMMSHIM_LIMIT_GROUP)
Options: --json (the reply as JSON), --timeout SECONDS (default 10; 300 for sleep,
wake and trim). SIZE takes K, M, G suffixes. PID: a process id, a number above 0.
Exit status: 0 done (or nothing to do), 1 the process refused (the message says
why: ENOENT no such tag, EBUSY, ENOMEM, EINVAL, ENOSPC), or a group command
failed, 2 bad usage (a PID that is not a number above 0 included), 3 no such
process, 4 not under vmmshim (or no CUDA use yet, or VMMSHIM_CONTROL=0), 5
another user's process, 6 no answer in time, 7 the process exited or closed the
connection before answering (or sent a bad reply).
"""

SHORT = "vmmshim ctl list | PID VERB [ARGS...] | --group NAME VERB [ARGS...]"
VERBS = ("status", "tag", "sleep", "wake", "trim", "limit", "dump", "release-host", "promote", "rules", "priority", "cold")


def help_text():
    """The whole help: the usage lines (the group verbs' too) first, then the verbs, then the
    exit statuses."""
    return USAGE + "".join("       %s\n" % line for line in groups.usage_lines()) + ABOUT


def usage_of(verb):
    """The usage line of a verb, for the line after a usage error; the short one for None."""
    for line in USAGE.splitlines():
        words = line.replace("Usage:", "").split()
        if verb and verb in words[2:4]:
            return " ".join(words)
    return SHORT


def suggest(word, choices):
    """'; did you mean X?' for a near miss of one of choices, else ''."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return "; did you mean %s?" % near[0] if near else ""


def is_pid(word):
    """A process id as the command line takes it: decimal digits, above 0."""
    return word.isdigit() and word.isascii() and int(word) > 0


def _err(msg):
    # The message may quote the process (its name, its refusal): printed with its controls escaped.
    print("vmmshim: error: %s" % text.clean(msg), file=sys.stderr)


class Usage(Exception):
    """A bad command line; verb: whose usage line to print after the message (None: the short one)."""

    def __init__(self, message, verb=None):
        Exception.__init__(self, message)
        self.verb = verb


def _take(args, flag, has_value):
    """Removes flag (and its value) from args; returns the value, True, or None when absent."""
    for i, a in enumerate(args):
        if a == flag:
            if not has_value:
                del args[i]
                return True
            if i + 1 >= len(args):
                raise Usage("%s needs a value" % flag)
            v = args[i + 1]
            del args[i:i + 2]
            return v
        if has_value and a.startswith(flag + "="):
            del args[i]
            return a.split("=", 1)[1]
    return None


def _pids_arg(v):
    pids = text.parse_pids(v)
    if pids is None:
        raise Usage("--pid: '%s' is not a list of process ids" % v)
    return pids


def _size_arg(v, what):
    n = text.parse_size(v)
    if n is None:
        raise Usage("%s: '%s' is not a size (bytes, with K, M, G or T; none)" % (what, v))
    return n


def _moved(pid, r):
    """A sleep or wake reply, for people."""
    c = text.clean
    what = "%s %s" % (c(r.get("cmd") or "?"), c(r.get("tag") or "?"))
    if r.get("cmd") == "promote":
        what = "promote"
    if r.get("level") is not None:
        what = "sleep level %d" % r["level"]
    if r.get("mode"):
        what += " (%s)" % c(r["mode"])
    if not r["ok"] and r.get("error") == "EALREADY":
        return "pid %d: %s: nothing to do (%s)" % (pid, what, c(r.get("reason") or "asleep or awake already"))
    parts = []
    if r.get("cmd") in ("wake", "promote"):
        how = [text.size(r[key]) + label for key, label in (("to_host", " copied back from the host"),
                                                             ("discarded", " had been discarded"))
               if r.get(key)]
        if r.get("restored"):
            parts.append("restored %s%s" % (text.size(r["restored"]), " (%s)" % ", ".join(how) if how else ""))
        if r.get("skipped"):
            parts.append("%s still asleep" % text.size(r["skipped"]))
    else:
        for key, label in (("released", "released"),
                           ("to_host", "written to disk" if r.get("mode") == "disk" else "copied to the host"),
                           ("host_mapped", "served from host memory"), ("discarded", "discarded"),
                           ("skipped", "skipped")):
            if r.get(key):
                parts.append("%s %s" % (label, text.size(r[key])))
    line = "pid %d: %s: %s in %.1f ms" % (pid, what, ", ".join(parts) or "nothing moved", r.get("ms") or 0.0)
    if r.get("reason"):
        line += "; %s" % c(r["reason"])
    return line


def _rules_lines(rules):
    """The tag rules of a reply, one line each, with the allocations each tagged."""
    return ["  %d. %s (%d allocations)" % (i + 1, text.clean(r["rule"]), r["matched"]) for i, r in enumerate(rules)]


def _status_text(st):
    """A status reply (checked by the client against client.STATUS), for people."""
    c = text.clean
    lines = []
    limit = "none" if not st["limit"] else text.size(st["limit"])
    lines.append("pid %d %s: vmmshim %s (api %d), user %d" % (st["pid"], c(st["program"]), c(st["version"]),
                                                            st["api"], st["uid"]))
    lines.append("new allocations go to tag '%s'; limit %s, %s mapped" % (c(st["process_tag"]), limit,
                                                                         text.size(st["mapped"])))
    for d in st["devices"]:
        lines.append("device %d: live %s in %d blocks; mapped %s in %d handles (idle %s, pending %s), %d pools"
                     % (d["device"], text.size(d["live"]), d["blocks"], text.size(d["mapped"]), d["handles"],
                        text.size(d["idle"]), text.size(d["pending"]), d["pools"]))
        asleep = client.asleep(d)
        if asleep:
            lines.append("device %d: asleep %s (host copy %s, served from host %s, discarded %s)"
                         % (d["device"], text.size(asleep), text.size(d["host_copied"]), text.size(d["host_mapped"]),
                            text.size(d["discarded"])))
    if not st["devices"]:
        lines.append("no pool yet: the shim has served no allocation")
    lines.append("%-16s %10s %10s %10s %10s %10s %10s  %s" % ("TAG", "LIVE", "DEVICE", "HOST-COPY", "HOST-MAP",
                                                             "DISCARDED", "DISK", "STATE"))
    for t in st["tags"]:
        state = "asleep" if t["asleep"] else "awake"
        if t["keep"]:
            state += ", keep"
        lines.append("%-16s %10s %10s %10s %10s %10s %10s  %s" % (c(t["name"]), text.short(t["live"]),
                                                                 text.short(t["device"]), text.short(t["host_copied"]),
                                                                 text.short(t["host_mapped"]),
                                                                 text.short(t["discarded"]),
                                                                 text.short(t.get("disk", 0)), state))
    if st.get("rules"):
        lines.append("tag rules (the first that matches tags an allocation of a thread with no tag of its own):")
        lines.extend(_rules_lines(st["rules"]))
    h = st["host"]
    lines.append("host memory: in use %s, kept %s%s" % (text.size(h["in_use"]), text.size(h["cached"]),
                                                        ", limit %s" % text.size(h["limit"]) if h["limit"] else ""))
    s = st["stats"]
    names = ("cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemAllocAsync")
    lines.append("allocations: %d served (%s), %d failed, %d passed to the driver"
                 % (sum(s["allocs"]), ", ".join("%s %d" % (n, c) for n, c in zip(names, s["allocs"])),
                    s["alloc_failures"], s["passthrough_allocs"]))
    lines.append("frees %d; VMM calls %d (%.1f ms); synchronisations %d; idle handles given back %d"
                 % (sum(s["frees"]), s["vmm_calls"], s["vmm_ns"] / 1e6, s["syncs"], s["trims"]))
    return "\n".join(lines)


def _list(args):
    as_json = bool(_take(args, "--json", False))
    t = _take(args, "--timeout", True)
    p = _take(args, "--pid", True)
    try:
        timeout = float(t) if t is not None else 2.0
    except ValueError:
        raise Usage("--timeout: '%s' is not a number of seconds" % t)
    if args:
        raise Usage("list takes no argument but --json, --timeout and --pid (got %s)" % " ".join(args))
    rows = client.statuses(timeout, _pids_arg(p) if p is not None else None)
    if as_json:
        print(json.dumps([r if r else {"pid": pid, "ok": False, "message": why} for pid, r, why in rows],
                         separators=(",", ":")))
        return EXIT_OK
    if not rows:
        print("no process under vmmshim that this user can reach")
        return EXIT_OK
    print("%7s  %-15s %-7s %10s %10s %10s  %s" % ("PID", "PROGRAM", "DEVICES", "LIVE", "MAPPED", "ASLEEP", "TAG"))
    c = text.clean
    for pid, st, why in rows:
        if not st or not st["ok"]:
            # A row for every process, with the reason it has no figures: a refusal, no answer in
            # time, or a reply that is not what the shim sends (client.STATUS).
            why = why or "%s: %s" % ((st or {}).get("error") or "refused", (st or {}).get("message") or "")
            print("%7d  %-15s %s" % (pid, c(client.program_of(pid))[:15], c(why)))
            continue
        devs = ",".join(str(d["device"]) for d in st["devices"]) or "-"
        live = sum(d["live"] for d in st["devices"])
        asleep = sum(client.asleep(t) for t in st["tags"])
        print("%7d  %-15s %-7s %10s %10s %10s  %s" % (pid, c(st["program"])[:15], devs, text.size(live),
                                                      text.size(st["mapped"]), text.size(asleep),
                                                      c(st["process_tag"])))
    return EXIT_OK


def _pid_command(pid, args):
    as_json = bool(_take(args, "--json", False))
    t = _take(args, "--timeout", True)
    try:
        timeout = float(t) if t is not None else None
    except ValueError:
        raise Usage("--timeout: '%s' is not a number of seconds" % t)
    if not args:
        raise Usage("a verb is missing after the pid")
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        raise Usage("unknown verb '%s'%s" % (verb, suggest(verb, VERBS) or " (%s)" % ", ".join(VERBS)), "")
    try:
        return _verb(pid, verb, rest, as_json, timeout)
    except Usage as e:
        e.verb = verb if e.verb is None else e.verb
        raise


def _verb(pid, verb, rest, as_json, timeout):
    ctl = Control(pid, timeout or client.TIMEOUT, timeout or client.MOVE_TIMEOUT)
    if verb == "status":
        if rest:
            raise Usage("status takes no argument")
        r = ctl.status()
        out = _status_text(r)
    elif verb == "tag":
        if len(rest) != 1:
            raise Usage("tag takes one NAME")
        r = ctl.tag(rest[0])
        out = "pid %d: new allocations go to tag '%s' (was '%s')" % (pid, text.clean(r["tag"]),
                                                                     text.clean(r["previous"]))
    elif verb in ("sleep", "wake"):
        everything = bool(_take(rest, "--all", False))
        mode = _take(rest, "--mode", True) if verb == "sleep" else None
        level = _take(rest, "--level", True) if verb == "sleep" else None
        zero = bool(_take(rest, "--zero", False)) if verb == "wake" else False
        if mode is not None and mode not in ("discard", "host", "mapped", "disk"):
            raise Usage("--mode: discard, host, mapped or disk (got '%s')" % mode)
        if level is not None:
            if level not in ("0", "1", "2"):
                raise Usage("--level: 0, 1 or 2 (got '%s')" % level)
            level = int(level)
            if rest:
                raise Usage("--level applies to every tag: give no TAG")
            everything = True
        if len(rest) > 1 or (rest and rest[0].startswith("-")):
            raise Usage("%s: unexpected %s" % (verb, " ".join(rest)))
        if everything == bool(rest):
            raise Usage("%s takes a TAG or --all" % verb)
        tag = rest[0] if rest else None
        r = ctl.sleep(tag, mode, level) if verb == "sleep" else ctl.wake(tag, zero)
        out = _moved(pid, r)
    elif verb == "trim":
        if rest:
            raise Usage("trim takes no argument")
        r = ctl.trim()
        out = "pid %d: trim: gave back %s; %s mapped" % (pid, text.size(r["released"]), text.size(r["mapped"]))
    elif verb == "limit":
        if len(rest) != 1:
            raise Usage("limit takes one SIZE (none: no limit)")
        r = ctl.limit(_size_arg(rest[0], "limit"))
        show = lambda n: text.size(n) if n else "none"  # noqa: E731
        out = "pid %d: limit %s (was %s); %s mapped" % (pid, show(r["limit"]), show(r["previous"]),
                                                        text.size(r["mapped"]))
        if r.get("note"):
            out += "\npid %d: %s" % (pid, text.clean(r["note"]))
    elif verb == "dump":
        if rest:
            raise Usage("dump takes no argument")
        r = ctl.dump()
        out = (text.clean(r["report"], keep="\n\t").rstrip("\n")
               + ("\n(the report was cut short)" if r.get("truncated") else ""))
    elif verb == "release-host":
        keep = _take(rest, "--keep", True)
        if rest:
            raise Usage("release-host takes only --keep SIZE")
        r = ctl.release_host(_size_arg(keep, "--keep") if keep is not None else 0)
        out = "pid %d: release-host: gave back %s of host memory; in use %s, kept %s" % (
            pid, text.size(r["released"]), text.size(r["in_use"]), text.size(r["cached"]))
    elif verb == "promote":
        if rest:
            raise Usage("promote takes no argument")
        r = ctl.promote()
        out = _moved(pid, r)
    elif verb == "rules":
        clear = bool(_take(rest, "--clear", False))
        if len(rest) > 1 or (clear and rest):
            raise Usage("rules takes one SPEC (quote it) or --clear")
        r = ctl.rules(rest[0] if rest else None, clear)
        out = "\n".join(["pid %d: %s" % (pid, "tag rules:" if r["rules"] else "no tag rules")]
                        + _rules_lines(r["rules"]))
    elif verb == "priority":
        if len(rest) > 1 or (rest and not (rest[0].isdigit() and int(rest[0]) <= 1000)):
            raise Usage("priority takes at most one N, a whole number from 0 to 1000")
        r = ctl.call("priority", priority=int(rest[0]) if rest else None)
        out = "pid %d: priority %d (was %d)" % (pid, r["priority"], r["previous"])
    elif verb == "cold":
        mode = _take(rest, "--mode", True)
        if mode is not None and mode not in ("mapped", "host", "discard", "off"):
            raise Usage("--mode: mapped, host, discard or off (got '%s')" % mode)
        if len(rest) != 1 or rest[0].startswith("-"):
            raise Usage("cold takes one TAG")
        r = ctl.call("cold", tag=rest[0], mode=mode)
        out = "pid %d: tag '%s' cold: %s (was %s)" % (pid, text.clean(r["tag"]), r["mode"], r["previous"])
    print(json.dumps(r, separators=(",", ":")) if as_json else out)
    return EXIT_OK


def ctl_main(args):
    args = list(args)
    if args and args[0] in ("-h", "--help", "help"):
        sys.stdout.write(help_text())
        return EXIT_OK
    if args and args[0] == "--python-path":
        print(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return EXIT_OK
    try:
        if not args:
            raise Usage("no command")
        if args[0] == "--group":
            if len(args) < 3:
                raise Usage("--group needs a NAME and a verb", "--group")
            return groups.dispatch(args[1], args[2], args[3:])
        if args[0] == "list":
            try:
                return _list(args[1:])
            except Usage as e:
                e.verb = "list"
                raise
        if not is_pid(args[0]):
            word = args[0]
            if word in VERBS:
                why = "'%s' needs a process first: vmmshim ctl PID %s" % (word, word)
            elif word.lstrip("-+").isdigit():
                why = "'%s' is not a process id (a number above 0)" % word
            else:
                why = "'%s' is neither list nor a process id%s" % (
                    word, suggest(word, ("list", "--group", "--help", "--python-path")))
            raise Usage(why)
        return _pid_command(int(args[0]), args[1:])
    except Usage as e:
        # The reason, then the usage of what was asked: standard error only, standard output
        # stays empty for whoever reads it.
        _err(str(e))
        usage = usage_of(e.verb) if e.verb != "--group" else "vmmshim ctl --group NAME VERB [ARGS...]"
        print("usage: %s (vmmshim ctl --help: the verbs)" % usage, file=sys.stderr)
        return EXIT_USAGE
    except ControlError as e:
        _err(str(e))
        return e.status


def _run(argv):
    if argv and argv[0] == "top":
        from . import top
        return top.main(argv[1:])
    return ctl_main(argv)


def main(argv):
    """argv without the program name: ["top", ...] for vmmshim top, else vmmshim ctl's words.
    Output into a pipe its reader closed (`vmmshim ctl list | head -1`) ends the command as it
    ends cat: quietly, by SIGPIPE. Python ignores the signal, so that a control socket's peer
    that goes away is an error to report (client.request), not the end of the client; standard
    output's BrokenPipeError is the one that gets here."""
    try:
        return _run(argv)
    except BrokenPipeError:
        pass
    # What is still buffered for the closed pipe would fail again at exit, loudly.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.stdout.flush()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    return 128 + signal.SIGPIPE  # where the signal could not end the process


__all__ = ["main", "ctl_main", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "EXIT_NOT_SHIM", "EXIT_OTHER_USER",
           "EXIT_TIMEOUT", "EXIT_GONE"]
