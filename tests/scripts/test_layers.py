#!/usr/bin/env python3
"""The layers of src/ call one way: every call and every include goes to the file's own layer
or a lower one (docs/design.md "Layers"). A call is a use of a name defined at file level in
another file of src/, directly or through an inline function or macro of include/vmmshim/ (a
use of _vs_active() is a call of _vs_activate_slow, which it calls); an include is a
vmmshim/*.h header. Within src/alloc/, src/pool/ and src/base/ the files descend too (ORDER
below), and each file of those layers has its place there.

The public API has one front door: every vmmshim_* function of include/vmmshim.h is defined
in src/hook/api.c, and no other file defines one. It also keeps the files small: no file of
src/ over FILE_LINES lines, no function over FUNCTION_LINES (from the line of its name to its
closing brace); each offender is named with its count.

Run without arguments it checks src/ and then checks that it would catch a planted upward call
(between layers, and inside base, also through an inline function of a header), a planted
upward include, a file of base missing from its order, a public function outside the front
door, and a planted long function and long file (so a broken checker fails too). Prints
`N passed, N failed`."""
import os
import re
import shutil
import sys
import tempfile

LAYERS = ["hook", "alloc", "share", "pool", "handle", "vmm", "base"]  # top first
ORDER = {  # within a layer, files that call each other: top first
    "alloc": ["balloon.c", "sleep.c", "foreign.c", "residue.c", "ctxmem.c", "nvml.c", "outside.c", "mempool.c", "alloc.c", "limit.c",
              "borrow.c", "rules.c", "tags.c"],
    "pool": ["pool.c", "reclaim.c", "sleep.c", "wake.c", "asleep.c", "disk.c", "copier.c", "space.c", "check.c",
             "pool_streams.c", "pool_blocks.c"],
}

# base, top first: init.c starts everything and nothing in base calls it back; state.c holds
# what every file reads.
ORDER["base"] = ["init.c", "stats.c", "trace.c", "trace_format.c", "stacks.c", "pyframes.c", "strings.c",
                 "order.c", "gate.c", "directory.c", "server.c", "cuda.c", "config.c", "lock.c", "log.c", "threads.c", "state.c", "clock.c"]
FILE_LINES = 800      # lines of a source file of src/, at most
FUNCTION_LINES = 80   # lines of a function, at most
HOOK_HEADERS = {"hook.h": "hook", "control.h": "hook"}  # the hook layer's own (its files share the hook table)

HEADERS = {  # vmmshim/<header>: the layer it belongs to
    "alloc.h": "alloc", "share.h": "share", "pool.h": "pool", "pool_internal.h": "pool",
    "handles.h": "handle", "group.h": "handle", "vmm.h": "vmm", "base.h": "base", "policy.h": "base",
    "clock.h": "base", "stacks.h": "base", "trace.h": "base", "server.h": "base", "lock.h": "base",
}


HEADERS.update(HOOK_HEADERS)


def strip(text):
    """Comments and string/char literals removed, line structure kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def rank(rel):
    """(layer index, index within the layer) of a source file; lower is higher up."""
    folder, name = rel.split("/")[-2:]
    order = ORDER.get(folder, [])
    inner = order.index(name) if name in order else 0
    return LAYERS.index(folder), inner


def header_uses(include):
    """Name -> the names its body uses, for every inline function and macro of include/vmmshim/:
    a file that uses one of them calls what it calls."""
    uses = {}
    for name in sorted(os.listdir(include)) if os.path.isdir(include) else []:
        if not name.endswith(".h"):
            continue
        text = strip(open(os.path.join(include, name)).read())
        for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?((?:[^\n]*\\\n)*[^\n]*)", text, re.M):
            uses[m.group(1)] = set(re.findall(r"\b[A-Za-z_]\w*\b", m.group(3)))
        for m in re.finditer(r"\bstatic\s+inline\b[^;{]*?\b(\w+)\s*\([^;{]*\)\s*\{", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            uses[m.group(1)] = set(re.findall(r"\b[A-Za-z_]\w*\b", text[m.end():i]))
    return uses


def names_used(text, through):
    """Every name text uses -> None, and each name that the headers' inline functions and macros
    it uses use -> the one of those it wrote."""
    seen = {}
    todo = [(name, None) for name in sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", text)))]
    while todo:
        name, via = todo.pop(0)
        if name not in seen:
            seen[name] = via
            todo += [(n, via or name) for n in sorted(through.get(name, ())) if n not in seen]
    return seen


def check(src, include=None):
    through = header_uses(include or os.path.join(src, "..", "include", "vmmshim"))
    files = {}
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        if not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if name.endswith(".c"):
                files[folder + "/" + name] = open(os.path.join(path, name)).read()
    problems = []
    for rel in files:
        folder, name = rel.split("/")
        if folder not in LAYERS:
            problems.append("%s: its folder is not a layer (%s)" % (rel, ", ".join(LAYERS)))
        elif folder in ORDER and name not in ORDER[folder]:
            problems.append("%s: not in ORDER[%r] (give it its place among the files of its layer)" % (rel, folder))
    raw = {k: v for k, v in files.items() if k.split("/")[0] in LAYERS}
    files = {k: strip(v) for k, v in raw.items()}
    defined = {}  # name -> file
    for rel, text in files.items():
        for line in text.split("\n"):
            if not line or line[0] in " \t#}{" or line.startswith("typedef"):
                continue
            m = re.match(r"[A-Za-z_][\w\s\*,]*?\b([A-Za-z_]\w*)\s*(\(|=|;|\[)", line)
            if not m:
                continue
            name = m.group(1)
            exported = name.startswith(("_vs_", "vmmshim_"))
            same_unit = rel.startswith("pool/pool_")  # included by pool.c: its statics count too
            if exported or same_unit:
                defined.setdefault(name, rel)
    for rel, text in files.items():
        me = rank(rel)
        for name, via in sorted(names_used(text, through).items()):
            owner = defined.get(name)
            if not owner or owner == rel:
                continue
            if not name.startswith(("_vs_", "vmmshim_")) and not rel.startswith("pool/"):
                continue  # a static of pool.c's unit is visible inside that unit only
            if rank(owner) < me:
                above = "a layer above it" if rank(owner)[0] < me[0] else "a file above it in ORDER[%r]" % owner.split("/")[0]
                problems.append("%s uses %s of %s%s, %s" % (rel, name, owner, " (through %s)" % via if via else "", above))
        for h in re.findall(r'^\s*#\s*include\s*"vmmshim/([\w.]+)"', raw[rel], re.M):
            layer = HEADERS.get(h)
            if h == "internal.h":
                problems.append("%s includes vmmshim/internal.h (every layer): include its own layer's header" % rel)
            elif h == "pool_internal.h" and not rel.startswith("pool/"):
                problems.append("%s includes vmmshim/pool_internal.h, the pool's own types" % rel)
            elif layer and LAYERS.index(layer) < me[0]:
                problems.append("%s includes vmmshim/%s of the %s layer, above it" % (rel, h, layer))
    return problems


def functions(text):
    """(name, first line, last line) of every function defined in text: from the line of its name
    to that of its closing brace. Preprocessor lines (macros that define functions) are skipped."""
    lines = strip(text).split("\n")
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("#"):
            while lines[i].endswith("\\") and i + 1 < len(lines):
                lines[i] = ""
                i += 1
            lines[i] = ""
        i += 1
    code = "\n".join(lines)
    found, depth, head, name = [], 0, 0, None
    for k, c in enumerate(code):
        if c == "{":
            if depth == 0:
                text = re.sub(r"__attribute__\s*\(\(.*?\)\)", lambda m: " " * len(m.group(0)), code[head:k], flags=re.S)
                m = re.search(r"\b([A-Za-z_]\w*)\s*\(", text)
                name = None
                if m and "=" not in text and text.rstrip().endswith(")"):
                    name = (m.group(1), code.count("\n", 0, head + m.start(1)) + 1)
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if name:
                    found.append((name[0], name[1], code.count("\n", 0, k) + 1))
                name, head = None, k + 1
        elif c == ";" and depth == 0:
            head = k + 1
    return found


def sizes(src):
    """Each file of src/ over FILE_LINES lines and each function over FUNCTION_LINES, with its count."""
    problems = []
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            if not name.endswith((".c", ".h")):
                continue
            text = open(os.path.join(path, name)).read()
            rel = folder + "/" + name
            n = text.count("\n") + (not text.endswith("\n") and text != "")
            if n > FILE_LINES:
                problems.append("%s: %d lines (at most %d)" % (rel, n, FILE_LINES))
            for fn, first, last in functions(text):
                if last - first + 1 > FUNCTION_LINES:
                    problems.append("%s: %s: %d lines (at most %d)" % (rel, fn, last - first + 1, FUNCTION_LINES))
    return problems


FRONT_DOOR = "hook/api.c"  # defines every public function of include/vmmshim.h, and only it does


def front_door(src, public_header):
    """The public API in one file: each vmmshim_* function that include/vmmshim.h declares is
    defined in FRONT_DOOR, and no other file of src/ defines one."""
    declared = set(re.findall(r"\b(vmmshim_\w+)\s*\(", strip(open(public_header).read())))
    problems, at_door = [], set()
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            if not name.endswith(".c"):
                continue
            rel = folder + "/" + name
            for fn, first, _ in functions(open(os.path.join(path, name)).read()):
                if not fn.startswith("vmmshim_"):
                    continue
                if rel != FRONT_DOOR:
                    problems.append("%s:%d defines %s: public functions live in src/%s" % (rel, first, fn, FRONT_DOOR))
                elif fn not in declared:
                    problems.append("%s:%d defines %s, which include/vmmshim.h does not declare" % (rel, first, fn))
                at_door.add(fn)
    for fn in sorted(declared - at_door):
        problems.append("%s is declared in include/vmmshim.h but not defined in src/%s" % (fn, FRONT_DOOR))
    return problems


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    src = os.path.join(root, "src")
    include = os.path.join(root, "include", "vmmshim")
    passed = failed = 0

    def report(ok, what, detail=()):
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + what)
        for d in detail:
            print("  " + d)
        passed += ok
        failed += not ok

    problems = check(src, include)
    report(not problems, "src/: every call and include goes down the layers", problems)
    public_header = os.path.join(root, "include", "vmmshim.h")
    problems = front_door(src, public_header)
    report(not problems, "src/: every public vmmshim_* function is defined in src/%s, and only there" % FRONT_DOOR,
           problems)
    problems = sizes(src)
    report(not problems, "src/: no file over %d lines, no function over %d" % (FILE_LINES, FUNCTION_LINES), problems)
    # The checker itself must catch what it is for: a copy of src/ with one thing planted each time.
    long_fn = "void _vs_planted_long(void) {\n" + "  (void)0;\n" * (FUNCTION_LINES - 1) + "}\n"
    plants = [  # file, text appended, what, the problem expected (a piece of it), checker
        ("handle/handles.c", "void _vs_planted(void) { _vs_alloc(0, 0, 0, 0, 0); }\n", "upward call",
         "handle/handles.c uses _vs_alloc", check),
        ("handle/handles.c", '#include "vmmshim/share.h"\n', "upward include",
         "handle/handles.c includes vmmshim/share.h", check),
        ("base/log.c", "void _vs_planted(void) { _vs_init_once(); }\n", "upward call inside base",
         "base/log.c uses _vs_init_once of base/init.c", check),
        ("base/clock.c", "bool _vs_planted(void) { return _vs_active(); }\n",
         "upward call inside base, through an inline function,", "base/clock.c uses _vs_activate_slow", check),
        ("base/planted.c", "int _vs_planted;\n", "file of base missing from its order", "base/planted.c: not in ORDER", check),
        ("pool/space.c", "void _vs_planted(vs_pool_t *p) { _vs_pool_destroy(p); }\n", "call from space.c up to pool.c",
         "pool/space.c uses _vs_pool_destroy of pool/pool.c", check),
        ("pool/check.c", "void _vs_planted(vs_pool_t *p) { _vs_pool_forget_asleep(p); }\n",
         "call from check.c up to asleep.c", "pool/check.c uses _vs_pool_forget_asleep of pool/asleep.c", check),
        ("pool/planted.c", "int _vs_planted;\n", "file of pool missing from its order", "pool/planted.c: not in ORDER",
         check),
        ("alloc/tags.c", "int vmmshim_planted(void) { return 0; }\n", "public function outside the front door",
         "alloc/tags.c:", lambda copy: front_door(copy, public_header)),
        ("vmm/vmm.c", long_fn, "function of %d lines" % (FUNCTION_LINES + 1), "vmm/vmm.c: _vs_planted_long: %d lines"
         % (FUNCTION_LINES + 1), sizes),
        ("vmm/vmm.c", "\n" * FILE_LINES, "file of over %d lines" % FILE_LINES, "vmm/vmm.c: ", sizes),
    ]
    tmp = tempfile.mkdtemp(prefix="vmmshim-layers-")
    try:
        for where, plant, what, expect, checker in plants:
            copy = os.path.join(tmp, "src")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(src, copy)
            with open(os.path.join(copy, where), "a") as f:
                f.write(plant)
            found = checker(copy, include) if checker is check else checker(copy)
            hits = [p for p in found if expect in p]
            report(bool(hits), "a planted %s in %s is caught" % (what, where), hits[:3] or found[:3])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
