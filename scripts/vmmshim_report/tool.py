"""What the command lines of vmmshim-report and vmmshim-replay share: the argument parser (one-line
errors, a help text that scripts/gen-man.sh makes the man page from), checked numbers, and
output files opened before the trace is read."""

import argparse
import math
import os
import stat
import textwrap

VERSION = "0.1.0"  # VMMSHIM_VERSION of include/vmmshim.h (test_install checks that they agree)
WIDTH = 80  # of the help text, whatever the terminal: the man page is made from it


class ToolParser(argparse.ArgumentParser):
    """argparse with a one-line error ("PROG: error: ... (see --help)", exit status 2) and a help
    text in the launcher's shape: "Usage: PROG SYNOPSIS", a one-line summary, paragraphs,
    "Options:" (a list), "Environment:" (a list), "Exit status:" and "See also:"."""

    def __init__(self, prog, synopsis, summary, paragraphs, environment=(), exit_status="", see_also=""):
        super().__init__(prog=prog, add_help=False, usage="%s %s" % (prog, synopsis))
        self.synopsis = synopsis
        self.summary = summary
        self.paragraphs = paragraphs
        self.environment = environment
        self.exit_status = exit_status
        self.see_also = see_also

    def add_help_and_version(self):
        """-h/--help and --version, listed last as the launcher lists them."""
        self.add_argument("-h", "--help", action="help", help="print this help and exit")
        self.add_argument("--version", action="version", version="%s %s" % (self.prog, VERSION),
                          help="print the version and exit")

    def error(self, message):
        self.exit(2, "%s: error: %s (see --help)\n" % (self.prog, message))

    def format_help(self):
        out = ["Usage: %s %s" % (self.prog, self.synopsis), self.summary, ""]
        for p in self.paragraphs:
            out += textwrap.wrap(p, WIDTH) + [""]
        fmt = argparse.HelpFormatter(self.prog, max_help_position=30, width=WIDTH)
        fmt.start_section("Options")
        fmt.add_arguments([a for a in self._actions if a.option_strings])
        fmt.end_section()
        out += [fmt.format_help().strip("\n"), ""]
        if self.environment:
            out.append("Environment:")
            for name, text in self.environment:
                lines = textwrap.wrap(text, WIDTH - 27)
                out.append("  %-25s%s" % (name, lines[0]) if len(name) < 24 else "  " + name)
                out += [" " * 27 + line for line in (lines[1:] if len(name) < 24 else lines)]
            out.append("")
        if self.exit_status:
            out += ["Exit status:"] + textwrap.wrap(self.exit_status, WIDTH, initial_indent="  ",
                                                    subsequent_indent="  ") + [""]
        out.append("See also: " + self.see_also)
        return "\n".join(out) + "\n"


def whole_number(text):
    """An argparse type: a whole number, 0 or more."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number" % text)
    if v < 0:
        raise argparse.ArgumentTypeError("%s is below 0" % text)
    return v


def positive_number(text):
    """An argparse type: a whole number, 1 or more."""
    v = whole_number(text)
    if v < 1:
        raise argparse.ArgumentTypeError("%s is below 1" % text)
    return v


def milliseconds(text):
    """An argparse type: a finite number of milliseconds, 0 or more (no nan, no inf)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError("%s is not a finite number of 0 or more" % text)
    return v


class OutputError(Exception):
    pass


class Output:
    """An output file, opened before the trace is read so that a path that cannot be written
    fails at once rather than after minutes of reading. What the file held is kept until
    write() (the open does not truncate), and a file the run created is removed by discard()
    when the run fails."""

    def __init__(self, option, path):
        self.option = option
        self.path = path
        existed = os.path.lexists(path)
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise OutputError("%s %s: cannot write: %s" % (option, path, e.strerror))
        self.created = not existed

    def open(self, mode):
        """The file as a file object (mode "w" or "wb"), emptied first when it is a regular file."""
        try:
            if stat.S_ISREG(os.fstat(self.fd).st_mode):
                os.ftruncate(self.fd, 0)
        except OSError as e:
            raise OutputError("%s %s: cannot write: %s" % (self.option, self.path, e.strerror))
        fd, self.fd = self.fd, None
        return os.fdopen(fd, mode, encoding="utf-8" if "b" not in mode else None)

    def failed(self, e):
        """The error for an OSError met while writing; a file the run created is removed."""
        if self.created:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        return OutputError("%s %s: cannot write: %s" % (self.option, self.path, e.strerror or e))

    def discard(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            if self.created:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
