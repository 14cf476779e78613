"""The console scripts of a pip-installed vmmshim (pyproject.toml): vmmshim, vmmshim-report and
vmmshim-replay. The launcher and the replay tool are the same scripts as in the sources, shipped
in vmmshim/bin/ next to vmmshim/lib/libvmmshim.so, where they find the library by themselves."""
import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _script(name):
    path = os.path.join(BIN, name)
    if not os.path.isfile(path):
        sys.stderr.write("vmmshim: error: %s is not installed with this package (pip install the checkout)\n" % path)
        sys.exit(125)
    return path


def launcher():
    """vmmshim [options] PROGRAM...: scripts/vmmshim; `vmmshim ctl` and `vmmshim top` run here
    (the shell launcher would look for the sources' or make install's copy of the client)."""
    args = sys.argv[1:]
    if args and args[0] in ("ctl", "top"):
        from . import cli
        try:
            return cli.main(args[1:] if args[0] == "ctl" else args)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            return 0
    sh = _script("vmmshim")
    os.execv("/bin/sh", ["sh", sh] + args)


def report():
    from .report.cli import run
    return run()


def replay():
    os.execv(sys.executable, [sys.executable, _script("vmmshim-replay")] + sys.argv[1:])
