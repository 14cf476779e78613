"""Commands on a group of processes: `vmmshim ctl --group NAME VERB [ARGS...]`.

The command line hands every `--group` command to dispatch() below. Group commands register
here: a module of this package calls register(verb, handler, usage) when it is imported, and
names itself in PROVIDERS so that dispatch() imports it on first use. handler(group, args) gets
the group's NAME and the words after VERB, prints what it has to say, and returns the exit status
(vmmshim.control's EXIT_* values)."""
import difflib
import importlib
import sys

from .client import EXIT_USAGE

PROVIDERS = ["group_shm", "group_sleep"]   # modules of this package that register group verbs
COMMANDS = {}    # verb -> (handler, usage)


def register(verb, handler, usage):
    COMMANDS[verb] = (handler, usage)


def _load():
    for name in PROVIDERS:
        importlib.import_module("." + name, __package__)


def usage_lines():
    _load()
    return ["vmmshim ctl --group NAME %s" % COMMANDS[v][1] for v in sorted(COMMANDS)]


def dispatch(group, verb, args):
    _load()
    if not COMMANDS:
        print("vmmshim: error: group commands are not available in this version of vmmshim", file=sys.stderr)
        return EXIT_USAGE
    if verb not in COMMANDS:
        near = difflib.get_close_matches(verb, sorted(COMMANDS), n=1, cutoff=0.6)
        print("vmmshim: error: --group %s: unknown verb '%s' (%s)%s" % (group, verb, ", ".join(sorted(COMMANDS)),
                                                                       "; did you mean %s?" % near[0] if near else ""),
              file=sys.stderr)
        return EXIT_USAGE
    return COMMANDS[verb][0](group, args)
