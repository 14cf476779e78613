"""The vmmshim Python module (scripts/python/vmmshim) imported without the shim in the process:
every function that needs the library raises the same NotPreloaded, with one line saying how to
run under the shim and no chained traceback behind it, region(), pause() and resume() alike;
control() needs no shim here. Also: __version__ is the header's VMMSHIM_VERSION. No GPU, no
preload: each check runs a fresh python3 with LD_PRELOAD removed from its environment."""
import json
import os
import re
import subprocess
import sys

from harness import ROOT, check, summary

PYDIR = os.path.join(ROOT, "scripts", "python")
ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("VMMSHIM_")}
ONE_LINE = "vmmshim: the shim is not preloaded: run under `vmmshim` or LD_PRELOAD=.../libvmmshim.so"


def py(code):
    """Runs code with the module on the path and no shim; its CompletedProcess."""
    return subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import vmmshim\n%s"
                           % (PYDIR, code)], capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)


# Every call of the public API that goes to the library, each from a fresh module state; what
# it raised: [type, message, whether a traceback would show another exception behind it].
CALLS = {
    "region": "with vmmshim.region('kv'): pass",
    "region with backup": "with vmmshim.region('w', enable_cpu_backup=True): pass",
    "pause()": "vmmshim.pause()",
    "pause('kv')": "vmmshim.pause('kv')",
    "resume()": "vmmshim.resume()",
    "resume('kv')": "vmmshim.resume('kv')",
    "set_tag": "vmmshim.set_tag('kv')",
    "get_tag": "vmmshim.get_tag()",
    "set_process_tag": "vmmshim.set_process_tag('kv')",
    "set_tag_keep": "vmmshim.set_tag_keep('kv')",
    "sleep": "vmmshim.sleep('kv', 'discard')",
    "wake": "vmmshim.wake('kv')",
    "sleep_level": "vmmshim.sleep_level(1)",
    "promote": "vmmshim.promote()",
    "tag_stats": "vmmshim.tag_stats()",
    "host_memory": "vmmshim.host_memory()",
    "release_host": "vmmshim.release_host()",
    "stats": "vmmshim.stats()",
    "trim": "vmmshim.trim()",
    "dump": "vmmshim.dump()",
}
probe = """
import json
out = {}
for name, code in json.loads(sys.argv[1]).items():
    try:
        exec(code)
        out[name] = None
    except BaseException as e:
        chained = e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__)
        out[name] = [type(e).__name__, str(e), chained]
print(json.dumps(out))
"""
r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import vmmshim\n%s" % (PYDIR, probe),
                    json.dumps(CALLS)], capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
got = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}
check(len(got) == len(CALLS), "the probe ran every call (%d of %d) %s" % (len(got), len(CALLS), r.stderr[-300:]))
for name in CALLS:
    g = got.get(name)
    check(g is not None and g[0] == "NotPreloaded" and g[1] == ONE_LINE,
          "without the shim, %s raises NotPreloaded with the one line [%r]" % (name, g))
    check(g is not None and not g[2], "without the shim, %s's NotPreloaded has no exception chained behind it" % name)

# What a user sees: the traceback of region() names one exception, and its last line is the
# message; no "During handling of the above exception" block.
r = py("with vmmshim.region('kv'):\n    pass")
err = r.stderr.strip().splitlines()
check(r.returncode == 1 and err and err[-1] == "vmmshim.NotPreloaded: " + ONE_LINE,
      "region() without the shim ends its traceback with the one line [%s]" % (err[-1] if err else ""))
check(r.stderr.count("Traceback") == 1 and "During handling" not in r.stderr and "AttributeError" not in r.stderr,
      "region() without the shim shows one traceback, no chained AttributeError (%d lines)" % len(err))

# pause() with no tag seen must not pass silently (it did nothing before, hiding the mistake).
r = py("vmmshim.pause()\nprint('paused')")
check(r.returncode == 1 and "paused" not in r.stdout, "pause() without the shim does not return as if it had paused")

# control(), reachable() and the error types need no shim in this process.
r = py("import os\nprint(callable(vmmshim.control), issubclass(vmmshim.NotPreloaded, RuntimeError), "
       "os.getpid() in vmmshim.reachable())")
check(r.returncode == 0 and r.stdout.split() == ["True", "True", "False"],
      "the module imports without the shim; control() is there, reachable() answers (without this process), "
      "NotPreloaded is a RuntimeError [%s]" % (r.stdout + r.stderr).strip()[-200:])

# __version__: the header's VMMSHIM_VERSION.
header = open(os.path.join(ROOT, "include", "vmmshim.h")).read()
m = re.search(r'^#define VMMSHIM_VERSION "([^"]+)"$', header, re.M)
r = py("print(vmmshim.__version__)")
check(m is not None and r.returncode == 0 and r.stdout.strip() == m.group(1),
      "vmmshim.__version__ (%s) is VMMSHIM_VERSION (%s)" % (r.stdout.strip(), m.group(1) if m else None))

sys.exit(summary())
