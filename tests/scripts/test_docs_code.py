"""The documents say what the code does (tests/scripts/test_docs.sh checks their form: links,
the configuration table, the README's length). Over README.md, CHANGELOG.md and docs/*.md:

  - every VMMSHIM_* name quoted exists in the code: the shim's option table (VS_OPTIONS of
    include/vmmshim/base.h, read by src/base/config.c as VMMSHIM_<TOKEN>), or a name the
    sources, headers, launcher, tools or Makefile hold; configuration.md details the shim's
    variables under "Details", not under the launcher's or the build's;
  - every `vmmshim ...`, `vmmshim-report ...` and `vmmshim-replay ...` command quoted (in
    backticks or in a code block) exists: its options are in the command's --help, a `vmmshim
    ctl` verb is one the client knows, and every launcher option of the option tables too;
  - the messages docs/troubleshooting.md quotes are printed by the code;
  - the exit statuses of `vmmshim ctl` in docs/control.md (and docs/troubleshooting.md) are the
    client's EXIT_* values with their meanings, and the client gives 2, 3 and 4 when it should;
  - every trace format version quoted is the one the shim writes (VS_TRACE_FORMAT_VERSION), and
    the newest the reader accepts is the same;
  - one version everywhere: include/vmmshim.h's VMMSHIM_VERSION is what `vmmshim --version`,
    `vmmshim-report --version`, `vmmshim-replay --version` and vmmshim.__version__ say, the
    newest entry of CHANGELOG.md, and every `vmmshim X.Y.Z` the documents quote.

Each checker is a function of text, also run on a sample broken on purpose, so that it is seen
to fail. Ends with "N passed, N failed"."""
import glob
import os
import re
import subprocess
import sys

from harness import ROOT, check, summary

os.chdir(ROOT)
DOCS = ["README.md", "CHANGELOG.md"] + sorted(glob.glob("docs/*.md"))
TEXT = {f: open(f, encoding="utf-8").read() for f in DOCS if os.path.exists(f)}
LAUNCHER = ["sh", "scripts/vmmshim"]
ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=ENV)
    return r.returncode, r.stdout + r.stderr


def read(path):
    return open(path, encoding="utf-8", errors="replace").read()


def names_list(items):
    return ", ".join(items[:8]) + (" ..." if len(items) > 8 else "") if items else "none"


# ---------------------------------------------------------------- VMMSHIM_* names

def code_names():
    """Every VMMSHIM_* name the code knows."""
    base = read("include/vmmshim/base.h")
    table = base[base.index("#define VS_OPTIONS(X)"):]
    table = table[:table.index("\n\n")]
    names = {"VMMSHIM_" + t for t in re.findall(r"^\s*X\(([A-Z0-9_]+),", table, re.M)}
    files = glob.glob("src/*/*.[ch]") + glob.glob("include/*.h") + glob.glob("include/vmmshim/*.h") + \
        ["Makefile", "scripts/vmmshim", "scripts/vmmshim-report", "scripts/vmmshim-replay", "scripts/deps.sh",
         "scripts/gen-man.sh", "scripts/gen-man7.sh", "man/variables.txt"] + \
        glob.glob("scripts/python/*.py") + glob.glob("scripts/python/vmmshim/*.py") + \
        glob.glob("scripts/vmmshim_report/*.py")
    for f in files:
        names.update(re.findall(r"VMMSHIM_[A-Z0-9_]*[A-Z0-9]", read(f)))
    return names, len(table.splitlines())


def unknown_names(texts, known):
    """'FILE: NAME' for each VMMSHIM_* name of the texts the code does not know."""
    out = []
    for f, text in texts.items():
        for name in sorted(set(re.findall(r"VMMSHIM_[A-Z0-9_]*[A-Z0-9]", text))):
            if name not in known:
                out.append("%s: %s" % (f, name))
    return out


known, table_lines = code_names()
check(table_lines > 10 and len(known) > 40, "the code's VMMSHIM_* names found (%d)" % len(known))
bad = unknown_names(TEXT, known)
check(not bad, "every VMMSHIM_* name in README.md, CHANGELOG.md and docs/*.md exists in the code (unknown: %s)"
      % names_list(bad))
bad = unknown_names({"sample.md": "Set `VMMSHIM_LIMIT=8G` and `VMMSHIM_TRACE_*`, not `VMMSHIM_NO_SUCH_KNOB=1`."}, known)
check(bad == ["sample.md: VMMSHIM_NO_SUCH_KNOB"], "a name the code lacks is caught, real ones are not (%s)" % bad)

# The details of the shim's variables sit under configuration.md's "Details", not under the
# launcher's or the build's variables.
SHIM_VARS = {"VMMSHIM_" + t for t in re.findall(r"^\s*X\(([A-Z0-9_]+),", read("include/vmmshim/base.h"), re.M)}


def misfiled(text):
    out, section = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("### "):
            out += ["%s under '%s'" % (n, section) for n in re.findall(r"VMMSHIM_[A-Z0-9_]+", line)
                    if n in SHIM_VARS and section != "Details"]
    return out


bad = misfiled(TEXT["docs/configuration.md"])
check(not bad, "configuration.md: the details of the shim's variables are under Details (%s)" % names_list(bad))
bad = misfiled("## Details\n### VMMSHIM_LIMIT\n## Variables of the build\n### VMMSHIM_TAG, VMMSHIM_DEPS_APT\n")
check(bad == ["VMMSHIM_TAG under 'Variables of the build'"], "a shim variable under the build's is caught %s" % bad)

# The launcher's, tools' and build's own variables (man/variables.txt) are the shim's list of names
# that are no option (config.c): one missing there gets "is not a vmmshim variable" when set.


def tools_vars(man):
    """The variables of man/variables.txt's LAUNCHER AND TOOLS and BUILD sections."""
    out, section = set(), None
    for line in man.splitlines():
        if line.startswith("== "):
            section = line[3:].strip()
        elif section in ("LAUNCHER AND TOOLS", "BUILD") and re.match(r"VMMSHIM_[A-Z0-9_]+$", line):
            out.add(line)
    return out


def other_vars(config_c):
    """The names of config.c's vs_other_vars."""
    m = re.search(r"vs_other_vars\[\] = \{(.*?)\};", config_c, re.S)
    return set(re.findall(r'"(VMMSHIM_[A-Z0-9_]+)"', m.group(1))) if m else set()


TOOLS, OTHER = tools_vars(read("man/variables.txt")), other_vars(read("src/base/config.c"))
check(len(TOOLS) >= 6 and "VMMSHIM_AS" in TOOLS and TOOLS == OTHER,
      "config.c's list of the tools' variables is man/variables.txt's (only there: %s; only in config.c: %s)"
      % (names_list(sorted(TOOLS - OTHER)), names_list(sorted(OTHER - TOOLS))))
sample = tools_vars("== LAUNCHER AND TOOLS\nVMMSHIM_AS\n  default: unset\n== TRACE\nVMMSHIM_TRACE\n")
check(sample == {"VMMSHIM_AS"} and other_vars('vs_other_vars[] = {"VMMSHIM_LIB"};') == {"VMMSHIM_LIB"} and
      sample != other_vars('vs_other_vars[] = {"VMMSHIM_LIB"};'), "a tools' variable missing from config.c is caught")

# ---------------------------------------------------------------- commands

OPT = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)")


def help_options(text):
    return set(OPT.findall(text))


rc_l, launcher_help = run(LAUNCHER + ["--help"])
rc_c, ctl_help = run(LAUNCHER + ["ctl", "--help"])
rc_t, top_help = run(LAUNCHER + ["top", "--help"])
rc_r, report_help = run([sys.executable, "scripts/vmmshim-report", "--help"])
rc_p, replay_help = run([sys.executable, "scripts/vmmshim-replay", "--help"])
check((rc_l, rc_c, rc_t, rc_r, rc_p) == (0, 0, 0, 0, 0), "every command's --help answers")
cli_src = read("scripts/python/vmmshim/cli.py")
OPTIONS = {
    "vmmshim": help_options(launcher_help.split("Environment:")[0]),
    # ctl: its help, and the flags the client compares (--python-path, which the launcher uses).
    "ctl": help_options(ctl_help) | set(re.findall(r'"(--[a-z][a-z-]*)"', cli_src)),
    "top": help_options(top_help),
    "vmmshim-report": help_options(report_help),
    "vmmshim-replay": help_options(replay_help),
}
VERBS = set(re.findall(r"vmmshim ctl (?:PID|--group NAME) ([a-z][a-z-]*)", ctl_help)) | {"list"}
check(len(OPTIONS["vmmshim"]) > 20 and "--stacks" in OPTIONS["vmmshim"] and {"sleep", "wake", "list"} <= VERBS,
      "the launcher's options (%d) and the ctl verbs (%s) are read from the help" % (len(OPTIONS["vmmshim"]),
                                                                                  " ".join(sorted(VERBS))))

CMD = re.compile(r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\S*/)?(vmmshim(?:-report|-replay)?)(?:\s+(.*))?$")


def quoted_commands(text):
    """(line number, tool, argument string) of every command quoted in backticks or code blocks."""
    out, code = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            code = not code
            continue
        spans = [line.strip()] if code else re.findall(r"`([^`]+)`", line)
        for span in spans:
            m = CMD.match(span.strip())
            if m:
                out.append((n, m.group(1), m.group(2) or ""))
    return out


def tokens(args):
    """The words of a command, placeholders unwrapped ([--json] -> --json, TAG|--all -> TAG, --all),
    up to a comment, a pipe or a redirection."""
    out = []
    for w in args.split():
        if w.startswith("#") or w in ("|", "&&", ";", ">", "2>&1", "&"):
            break
        for part in w.strip("[](){},.;").split("|"):
            part = part.strip("[](){},.;")
            if part:
                out.append(part)
    return out


def is_option(w):
    return OPT.fullmatch(w.split("=")[0]) is not None


def command_problems(tool, args):
    """What is wrong with one quoted command: a list of strings."""
    words, bad = tokens(args), []
    if tool != "vmmshim":
        return ["unknown option %s" % w.split("=")[0] for w in words
                if is_option(w) and w.split("=")[0] not in OPTIONS[tool]]
    i = 0
    while i < len(words) and is_option(words[i]) and words[i] != "--":
        if words[i].split("=")[0] not in OPTIONS["vmmshim"]:
            bad.append("unknown launcher option %s" % words[i])
        i += 1
        # An option's value: the next word, unless it is itself an option or the program.
        if i < len(words) and not is_option(words[i]) and words[i] not in ("ctl", "top") and \
                re.fullmatch(r"[A-Z0-9_.:\[\]%/-]+|\d+[KMGT]?", words[i]):
            i += 1
    if i >= len(words) or words[i] == "--" or words[i] not in ("ctl", "top"):
        return bad  # a program runs under the shim
    sub, rest = words[i], words[i + 1:]
    bad += ["unknown %s option %s" % (sub, w.split("=")[0]) for w in rest
            if is_option(w) and w.split("=")[0] not in OPTIONS[sub]]
    if sub == "ctl" and rest and not is_option(rest[0]) and rest[0] != "list":
        # PID VERB: the PID may be a number, a placeholder (PID, <pid>) or a shell variable.
        if len(rest) > 1 and re.fullmatch(r"\d+|[A-Z]+|<\w+>|\$\w+|\$\(.*", rest[0]) and \
                not re.fullmatch(r"[A-Z]+", rest[1]) and rest[1] not in VERBS and not is_option(rest[1]):
            bad.append("unknown ctl verb %s" % rest[1])
    if sub == "ctl" and rest[:1] == ["--group"] and len(rest) > 2 and not re.fullmatch(r"[A-Z]+", rest[2]) \
            and rest[2] not in VERBS:
        bad.append("unknown ctl verb %s" % rest[2])
    return bad


def doc_command_problems(texts):
    out, n = [], 0
    for f, text in texts.items():
        for line, tool, args in quoted_commands(text):
            n += 1
            for p in command_problems(tool, args):
                out.append("%s:%d: `%s %s`: %s" % (f, line, tool, args.strip(), p))
    return out, n


bad, n_cmds = doc_command_problems(TEXT)
check(n_cmds > 50, "commands quoted in the documents found (%d)" % n_cmds)
check(not bad, "every quoted vmmshim, vmmshim-report and vmmshim-replay command exists (%s)" % names_list(bad))
sample = ("Run `vmmshim --stacks 16 --stats python3 train.py`, `vmmshim --frobnicate ./app`, `vmmshim ctl 42 sleep kv`,\n"
          "`vmmshim ctl PID hibernate`, `vmmshim top --once`, `vmmshim-report --by-site t.trace`,\n"
          "```\n$ scripts/vmmshim-report --pie out.svg t.trace   # a chart\nvmmshim ctl --group g flush\n```\n")
bad, _ = doc_command_problems({"sample.md": sample})
want = ["sample.md:1: `vmmshim --frobnicate ./app`: unknown launcher option --frobnicate",
        "sample.md:2: `vmmshim ctl PID hibernate`: unknown ctl verb hibernate",
        "sample.md:4: `vmmshim-report --pie out.svg t.trace   # a chart`: unknown option --pie",
        "sample.md:5: `vmmshim ctl --group g flush`: unknown ctl verb flush"]
check(bad == want, "an unknown option, verb and report option are caught, real commands are not %s" % bad)


def table_option_problems(text, header):
    """Options of the launcher named in the first cell of a table whose header row starts with
    header ('| launcher option |'), or in its 'launcher option' column, that it does not have."""
    out, col = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            col = None
            continue
        if header in cells:
            col = cells.index(header)
            continue
        if col is not None and col < len(cells):
            for opt in OPT.findall(" ".join(re.findall(r"`([^`]*)`", cells[col]))):
                if opt not in OPTIONS["vmmshim"]:
                    out.append(opt)
    return out


bad = table_option_problems(TEXT["README.md"], "launcher option") + \
    table_option_problems(TEXT["docs/configuration.md"], "launcher option")
check(not bad, "every launcher option in the option tables of README.md and configuration.md exists (%s)"
      % names_list(bad))
bad = table_option_problems("| launcher option | variable |\n|---|---|\n| `--stats` | x |\n| `--turbo N` | y |\n",
                            "launcher option")
check(bad == ["--turbo"], "a table row with an option the launcher lacks is caught %s" % bad)

# ---------------------------------------------------------------- exit statuses of vmmshim ctl

client = read("scripts/python/vmmshim/client.py")
EXITS = {name: int(v) for name, v in re.findall(r"^EXIT_([A-Z_]+) = (\d+)", client, re.M)}
# What each status's row must say (the client's name for it -> words of its meaning).
MEANING = {"OK": "done", "REFUSED": "refused", "USAGE": "usage", "NO_PROCESS": "no such process",
           "NOT_SHIM": "not under the shim", "OTHER_USER": "another user", "TIMEOUT": "no answer",
           "GONE": "exited"}


def exit_rows(text, heading):
    """{status: meaning} of the first table after the heading."""
    part = text[text.index(heading):] if heading in text else ""
    rows, started = {}, False
    for line in part.splitlines()[1:]:
        m = re.match(r"^\| (\d+) \| (.*) \|$", line)
        if m:
            rows[int(m.group(1))] = m.group(2)
            started = True
        elif started and not line.startswith("|"):
            break
    return rows


def exit_problems(rows):
    out = []
    for name, code in sorted(EXITS.items(), key=lambda kv: kv[1]):
        if name not in MEANING:
            out.append("EXIT_%s has no meaning in this test" % name)
        elif code not in rows:
            out.append("%d (EXIT_%s) missing" % (code, name))
        elif MEANING[name] not in rows[code]:
            out.append("%d is not EXIT_%s (%s)" % (code, name, MEANING[name]))
    out += ["%d is no status of the client" % c for c in rows if c not in EXITS.values()]
    return out


check(len(EXITS) == 8, "the client's exit statuses found: %s" % EXITS)
rows = exit_rows(TEXT["docs/control.md"], "### Exit status of `vmmshim ctl`")
bad = exit_problems(rows)
check(rows and not bad, "docs/control.md's exit statuses of vmmshim ctl are the client's (%s)" % names_list(bad))
if "docs/troubleshooting.md" in TEXT:
    rows = exit_rows(TEXT["docs/troubleshooting.md"], "## Control")
    # Its table gives the failures, 1 and up.
    check(sorted(rows) == sorted(set(EXITS.values()) - {0}) and "refused" in rows.get(1, "")
          and "usage" in rows.get(2, ""),
          "docs/troubleshooting.md's statuses of vmmshim ctl are the client's (%s)" % sorted(rows))
else:
    check(False, "docs/troubleshooting.md exists")
broken = re.sub(r"^\| 3 \| no such process[^|]*\|", "| 3 | the process belongs to another user |", TEXT["docs/control.md"],
                flags=re.M)
bad = exit_problems(exit_rows(broken, "### Exit status of `vmmshim ctl`"))
check(bad == ["3 is not EXIT_NO_PROCESS (no such process)"], "a status with another's meaning is caught %s" % bad)

# The client itself: bad usage 2, no such process 3, a process not under the shim 4 (this one).
rc2, _ = run(LAUNCHER + ["ctl", "1", "no-such-verb"])
rc3, _ = run(LAUNCHER + ["ctl", "999999999", "status"])
rc4, _ = run(LAUNCHER + ["ctl", str(os.getpid()), "status"])
check((rc2, rc3, rc4) == (EXITS["USAGE"], EXITS["NO_PROCESS"], EXITS["NOT_SHIM"]),
      "vmmshim ctl exits 2 on bad usage, 3 for no process, 4 for one not under the shim (%d %d %d)" % (rc2, rc3, rc4))

# ---------------------------------------------------------------- messages of troubleshooting.md

def message_corpus():
    """The text of every message the shim, the launcher and the tools can print: string literals
    split over lines joined again, printf directives and shell expansions taken out (${x:+TEXT}
    is TEXT, the text it may add)."""
    out = []
    for f in glob.glob("src/*/*.c") + ["scripts/vmmshim", "scripts/deps.sh"] + \
            glob.glob("scripts/python/vmmshim/*.py") + glob.glob("scripts/vmmshim_report/*.py"):
        t = re.sub(r'"\s*\n\s*"', "", read(f))
        t = re.sub(r"%[-+ #0-9.*]*(?:hh|h|ll|l|z|j|t)?[sdiuxXcpfge]", "", t)
        t = re.sub(r"\$\{\w+:\+([^}]*)\}", r"\1", t)
        out.append(re.sub(r"\$\{\w+\}|\$\w+", "", t))
    return "\n".join(out)


# In a quoted message these stand for what the program fills in.
PLACEHOLDER = r"\b(?:N|M|D|PATH|REASON|NAME|SIZE|PTR|PROGRAM|VALUE|cudaMalloc|cudaFree)\b|\.\.\.|CUDA_ERROR_\w*|'12Q'"


def unknown_messages(text, corpus):
    """The messages quoted in backticks ('vmmshim: warning: ...', 'vmmshim-report: error: ...',
    'vmmshim.NotPreloaded: ...') of which a literal part of 10 characters or more is in no source."""
    out = []
    for m in re.findall(r"`((?:vmmshim|vmmshim-report|vmmshim-replay): (?:warning|error): [^`]+|vmmshim: missing [^`]+"
                        r"|vmmshim\.NotPreloaded: [^`]+)`", re.sub(r"\s*\n\s*", " ", text)):
        body = re.sub(r"^(?:vmmshim(?:-report|-replay)?: (?:warning: |error: )?|vmmshim\.NotPreloaded: )", "", m)
        parts = [f.strip(" :;,()'") for f in re.split(PLACEHOLDER, body)]
        missing = [f for f in parts if len(f) >= 10 and f not in corpus]
        if missing:
            out.append("%s (%s)" % (m[:60], missing[0][:60]))
    return out


CORPUS = message_corpus()
n_msgs = len(re.findall(r"`vmmshim(?:-report)?: (?:warning|error): ", TEXT.get("docs/troubleshooting.md", "")))
bad = unknown_messages(TEXT.get("docs/troubleshooting.md", ""), CORPUS)
check(n_msgs > 15 and not bad, "the %d messages troubleshooting.md quotes are the ones the code prints (%s)"
      % (n_msgs, names_list(bad)))
bad = unknown_messages("`vmmshim: warning: cannot open trace file PATH: REASON (errno N); the program runs without a "
                       "trace`\n`vmmshim: error: the pool melted on device N`", CORPUS)
check(bad == ["vmmshim: error: the pool melted on device N (the pool melted on device)"],
      "a message the code never prints is caught, a real one is not %s" % bad)

# ---------------------------------------------------------------- trace format version

m = re.search(r"^#define VS_TRACE_FORMAT_VERSION (\d+)$", read("include/vmmshim/trace.h"), re.M)
TRACE_V = int(m.group(1)) if m else None
m = re.search(r"^FORMAT_VERSION = (\d+)", read("scripts/vmmshim_report/reading.py"), re.M)
READER_V = int(m.group(1)) if m else None
check(TRACE_V is not None and TRACE_V == READER_V,
      "the shim writes trace format %s; the reader reads up to %s" % (TRACE_V, READER_V))

# Statements of the trace format version, each giving the version the shim writes (or the newest
# the tools read); group 1 is that number.
VERSION_SAYINGS = [
    r"versions? \d+(?:, \d+)*,? (?:and|to) (\d+)",         # "versions 1 and 2", "versions 1 to 3"
    r"(?:the shim )?writes (?:native )?(?:format )?(?:version )?`?v? ?(\d+)`?\b(?! [a-zA-Z]*bytes)",
    r"written by the shim[^|]*?\bversion (\d+)",
    r"^v (\d+) vmmshim ",                                  # a trace's first line
    r"format version \(hex, `(\d+)`\)",
    r"^#+ Native format, version (\d+)",
]


def version_problems(texts):
    out = []
    for f, text in texts.items():
        for n, line in enumerate(text.splitlines(), 1):
            for pat in VERSION_SAYINGS:
                for v in re.findall(pat, line, re.I):
                    if int(v) != TRACE_V:
                        out.append("%s:%d: version %s" % (f, n, v))
    return out


texts = dict(TEXT)
texts["vmmshim-report --help"] = report_help
texts["vmmshim-replay --help"] = replay_help
bad = version_problems(texts)
check(not bad, "every trace format version quoted is %s, the one the shim writes (%s)" % (TRACE_V, names_list(bad)))
sample = {"sample.md": "The tools read native versions 1 and 2.\n```\nv 2 vmmshim 0.1.0\n```\n"
                       "| `v` | `v VERSION` | format version (hex, `2`) |\nThe shim writes version %d.\n"
                       "The trace format reads versions 1 to %d.\n" % (TRACE_V, TRACE_V)}
bad = version_problems(sample)
check(bad == ["sample.md:1: version 2", "sample.md:3: version 2", "sample.md:5: version 2"],
      "old trace versions are caught, the current one is not %s" % bad)

# ---------------------------------------------------------------- make install

def installed():
    """The Makefile's INSTALLED list, relative to PREFIX."""
    r = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                        "vs-print-installed: ; @printf '%s\\n' $(INSTALLED)", "vs-print-installed", "PREFIX=/P"],
                       capture_output=True, text=True, timeout=60)
    return sorted(p[3:] for p in r.stdout.split() if p.startswith("/P/"))


def install_problems(text, files):
    """The rows of building.md's install table against the installed files: a file no row covers,
    a row naming nothing installed, a count that is not the number of files."""
    part = text[text.index("## Install"):] if "## Install" in text else ""
    part = part[:part.index("\n## ", 1)] if "\n## " in part[1:] else part
    paths = []
    for line in part.splitlines():
        if line.startswith("| `"):
            paths += re.findall(r"`([^`]+)`", line.split("|")[1])
    covered = lambda f: any(f == p or (p.endswith("/") and f.startswith(p)) for p in paths)
    out = ["%s is installed, in no row" % f for f in files if not covered(f)]
    out += ["%s is in a row, not installed" % p for p in paths
            if not any(f == p or (p.endswith("/") and f.startswith(p)) for f in files)]
    for n in re.findall(r"\((\d+) today\)", part):
        if int(n) != len(files):
            out.append("says %s files, installs %d" % (n, len(files)))
    if re.search(r"pkg-config[^.]*gives[^.]*-lvmmshim", part):
        out.append("says pkg-config gives -lvmmshim")
    return out, len(paths)


FILES = installed()
check(len(FILES) > 20 and "lib/libvmmshim.so" in FILES, "the Makefile installs %d files" % len(FILES))
pc_rule = read("Makefile")
pc_rule = pc_rule[pc_rule.index("$(PC):"):]
pc_rule = pc_rule[:pc_rule.index("\n\n")]
check("Cflags:" in pc_rule and "Libs:" not in pc_rule, "vmmshim.pc has Cflags and no Libs")
bad, n_rows = install_problems(TEXT["docs/building.md"], FILES)
check(n_rows > 5 and not bad, "docs/building.md's install table is what make install installs (%s)" % names_list(bad))
bad, _ = install_problems("## Install\n\nall of it (3 today)\n\n| `lib/libvmmshim.so` | x |\n| `bin/vmmshim` | y |\n"
                          "| `bin/vmmshim-top` | z |\n\n`pkg-config --libs vmmshim` gives `-lvmmshim`.\n\n## Next\n",
                          ["bin/vmmshim", "include/vmmshim.h", "lib/libvmmshim.so"])
check(bad == ["include/vmmshim.h is installed, in no row", "bin/vmmshim-top is in a row, not installed",
              "says pkg-config gives -lvmmshim"],
      "a file left out, one not installed and a promise of -lvmmshim are caught %s" % bad)

# ---------------------------------------------------------------- one version everywhere

m = re.search(r'^#define VMMSHIM_VERSION "([^"]+)"$', read("include/vmmshim.h"), re.M)
VERSION = m.group(1) if m else None
check(VERSION is not None and re.fullmatch(r"\d+\.\d+\.\d+", VERSION), "VMMSHIM_VERSION is %s" % VERSION)
said = {
    "vmmshim --version": run(LAUNCHER + ["--version"])[1].strip(),
    "vmmshim-report --version": run([sys.executable, "scripts/vmmshim-report", "--version"])[1].strip(),
    "vmmshim-replay --version": run([sys.executable, "scripts/vmmshim-replay", "--version"])[1].strip(),
    "vmmshim.__version__": "vmmshim " + run([sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts/python'); "
                                             "import vmmshim; print(vmmshim.__version__)"])[1].strip(),
}
for what, out in said.items():
    tool = what.split()[0].split(".")[0]
    check(out == "%s %s" % (tool, VERSION), "%s says %s (VMMSHIM_VERSION: %s)" % (what, out, VERSION))


def changelog_problems(text):
    """The newest versioned entry of the changelog must be VERSION, after an Unreleased section."""
    heads = re.findall(r"^## (.+)$", text, re.M)
    versions = [h.split()[0] for h in heads if re.match(r"\d+\.\d+\.\d+", h)]
    out = []
    if not heads or heads[0] != "Unreleased":
        out.append("no Unreleased section first")
    if not versions or versions[0] != VERSION:
        out.append("newest entry %s" % (versions[0] if versions else "missing"))
    return out


bad = changelog_problems(TEXT.get("CHANGELOG.md", ""))
check("CHANGELOG.md" in TEXT and not bad, "CHANGELOG.md: Unreleased, then %s (%s)" % (VERSION, names_list(bad)))
bad = changelog_problems("# Changelog\n\n## 9.9.9\n\n- x\n\n## %s\n" % VERSION)
check(bad == ["no Unreleased section first", "newest entry 9.9.9"], "a changelog ahead of the header is caught %s" % bad)


def quoted_versions(texts):
    """'FILE:LINE: X.Y.Z' for every 'vmmshim X.Y.Z' or version example that is not VERSION."""
    out = []
    for f, text in texts.items():
        for n, line in enumerate(text.splitlines(), 1):
            for v in re.findall(r"\bvmmshim(?:-report|-replay)? (\d+\.\d+\.\d+)\b|TOOLVERSION`: [^,]*?`(\d+\.\d+\.\d+)`",
                                line):
                v = v[0] or v[1]
                if v != VERSION:
                    out.append("%s:%d: %s" % (f, n, v))
    return out


bad = quoted_versions(TEXT)
check(not bad, "every vmmshim version the documents quote is %s (%s)" % (VERSION, names_list(bad)))
bad = quoted_versions({"s.md": "v 3 vmmshim 0.0.9\n`vmmshim-report %s`\n" % VERSION})
check(bad == ["s.md:1: 0.0.9"], "another version quoted is caught %s" % bad)

sys.exit(summary())
