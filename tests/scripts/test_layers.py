#!/usr/bin/env python3
"""The layers of src/ call one way: every call and every include goes to the file's own layer
or a lower one (docs/design.md "Layers"). A call is a use of a name defined at file level in
another file of src/, written out or through a macro of include/vmmshim/ (VS_POOL_CHECK calls
the invariant check); an include is a vmmshim/*.h header. Within src/alloc/ and src/pool/ the
files descend too (ORDER below, which must name every file of those folders): a call from a
file to one above it in the order is a circle.

Run without arguments it checks src/ and then checks that it would catch planted faults: an
upward call and an upward include between layers, an upward call between two pool files
written out and through a header's macro, and a pool file missing from ORDER (so a broken
checker fails too). Prints `N passed, N failed`."""
import os
import re
import shutil
import sys
import tempfile

LAYERS = ["hook", "alloc", "share", "pool", "handle", "vmm", "base"]  # top first
ORDER = {  # within a layer, files that call each other: top first
    "alloc": ["sleep.c", "mempool.c", "alloc.c", "limit.c", "tags.c"],
    "pool": ["pool.c", "reclaim.c", "sleep.c", "wake.c", "asleep.c", "copier.c", "space.c", "check.c",
             "pool_streams.c", "pool_blocks.c"],
}
HEADERS = {  # vmmshim/<header>: the layer it belongs to
    "alloc.h": "alloc", "share.h": "share", "pool.h": "pool", "pool_internal.h": "pool",
    "handles.h": "handle", "group.h": "handle", "vmm.h": "vmm", "base.h": "base", "policy.h": "base",
    "clock.h": "base", "stacks.h": "base", "trace.h": "base",
}


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


def macros(include):
    """name -> the identifiers its body names, for every function-like or object-like macro of
    include/vmmshim/*.h (every definition of a name, under any #if, counts)."""
    found = {}
    folder = os.path.join(include, "vmmshim")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".h"):
            continue
        text = strip(open(os.path.join(folder, name)).read()).replace("\\\n", " ")
        for m in re.finditer(r"^\s*#\s*define\s+([A-Za-z_]\w*)(\([^)]*\))?(.*)$", text, re.M):
            found.setdefault(m.group(1), set()).update(re.findall(r"\b[A-Za-z_]\w*\b", m.group(3)))
    return found


def uses(text, macro):
    """The identifiers a file names, and through which macro it names each one that only a
    macro's body names (followed through macros within macros)."""
    names = set(re.findall(r"\b[A-Za-z_]\w*\b", text))
    via = {}
    todo = [(n, n) for n in names if n in macro]
    while todo:
        name, outer = todo.pop()
        for n in macro[name]:
            if n not in names and n not in via:
                via[n] = outer
                if n in macro:
                    todo.append((n, outer))
    return names | set(via), via


def rank(rel):
    """(layer index, index within the layer) of a source file; lower is higher up."""
    folder, name = rel.split("/")[-2:]
    order = ORDER.get(folder, [])
    inner = order.index(name) if name in order else 0
    return LAYERS.index(folder), inner


def check(src, include=None):
    macro = macros(include or os.path.join(src, "..", "include"))
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
            problems.append("%s: not in ORDER[%r] of tests/scripts/test_layers.py: place it in the order" % (rel, folder))
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
        names, via = uses(text, macro)
        for name in sorted(names):
            owner = defined.get(name)
            if not owner or owner == rel:
                continue
            if not name.startswith(("_vs_", "vmmshim_")) and not rel.startswith("pool/"):
                continue  # a static of pool.c's unit is visible inside that unit only
            if rank(owner) < me:
                how = " (through %s)" % via[name] if name in via else ""
                above = "a layer above it" if rank(owner)[0] < me[0] else "above it in ORDER: a circle"
                problems.append("%s uses %s of %s%s, %s" % (rel, name, owner, how, above))
        for h in re.findall(r'^\s*#\s*include\s*"vmmshim/([\w.]+)"', raw[rel], re.M):
            layer = HEADERS.get(h)
            if h == "internal.h":
                problems.append("%s includes vmmshim/internal.h (every layer): include its own layer's header" % rel)
            elif h == "pool_internal.h" and not rel.startswith("pool/"):
                problems.append("%s includes vmmshim/pool_internal.h, the pool's own types" % rel)
            elif layer and LAYERS.index(layer) < me[0]:
                problems.append("%s includes vmmshim/%s of the %s layer, above it" % (rel, h, layer))
    return problems


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    src = os.path.join(root, "src")
    passed = failed = 0

    def report(ok, what, detail=()):
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + what)
        for d in detail:
            print("  " + d)
        passed += ok
        failed += not ok

    problems = check(src)
    report(not problems, "src/: every call and include goes down the layers", problems)
    # The checker itself must catch what it is for: a copy of src/ and include/ with one planted
    # fault each (the file it goes in, what it appends there, an addition to pool_internal.h,
    # what a problem must name).
    call_up = "void _vs_planted(vs_pool_t *p) { _vs_pool_destroy(p); }\n"
    plants = (
        ("handle/handles.c", "void _vs_planted(void) { _vs_alloc(0, 0, 0, 0, 0); }\n", "",
         "handle/handles.c uses _vs_alloc", "upward call in handles.c"),
        ("handle/handles.c", '#include "vmmshim/share.h"\n', "", "handle/handles.c includes vmmshim/share.h",
         "upward include in handles.c"),
        ("pool/space.c", call_up, "", "pool/space.c uses _vs_pool_destroy of pool/pool.c",
         "call from space.c up to pool.c"),
        ("pool/check.c", "void _vs_planted(vs_pool_t *p) { VS_PLANTED(p); }\n",
         "#define VS_PLANTED(p) _vs_pool_forget_asleep(p)\n",
         "pool/check.c uses _vs_pool_forget_asleep of pool/asleep.c (through VS_PLANTED)",
         "call from check.c up to asleep.c through a header's macro"),
        ("pool/planted.c", call_up, "", "pool/planted.c: not in ORDER", "pool file missing from ORDER"),
    )
    tmp = tempfile.mkdtemp(prefix="vmmshim-layers-")
    try:
        for where, plant, header, expect, what in plants:
            copy, inc = os.path.join(tmp, "src"), os.path.join(tmp, "include")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.rmtree(inc, ignore_errors=True)
            shutil.copytree(src, copy)
            shutil.copytree(os.path.join(root, "include"), inc)
            with open(os.path.join(copy, where), "a") as f:
                f.write(plant)
            with open(os.path.join(inc, "vmmshim", "pool_internal.h"), "a") as f:
                f.write(header)
            found = check(copy, inc)
            report(any(p.startswith(expect) for p in found), "a planted %s is caught" % what, found[:3])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
