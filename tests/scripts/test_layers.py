#!/usr/bin/env python3
"""The layers of src/ call one way: every call and every include goes to the file's own layer
or a lower one (docs/design.md "Layers"). A call is a use of a name defined at file level in
another file of src/; an include is a vmmshim/*.h header. Within src/alloc/ and src/pool/ the
files descend too (ORDER below).

Run without arguments it checks src/ and then checks that it would catch a planted upward call
and a planted upward include (so a broken checker fails too). Prints `N passed, N failed`."""
import os
import re
import shutil
import sys
import tempfile

LAYERS = ["hook", "alloc", "share", "pool", "handle", "vmm", "base"]  # top first
ORDER = {  # within a layer, files that call each other: top first
    "alloc": ["sleep.c", "mempool.c", "alloc.c", "limit.c", "tags.c"],
    "pool": ["pool.c", "reclaim.c", "asleep.c", "space.c", "pool_streams.c", "pool_blocks.c"],
}
HEADERS = {  # vmmshim/<header>: the layer it belongs to
    "alloc.h": "alloc", "share.h": "share", "pool.h": "pool", "pool_internal.h": "pool",
    "handles.h": "handle", "group.h": "handle", "vmm.h": "vmm", "base.h": "base", "policy.h": "base",
    "clock.h": "base", "stacks.h": "base", "trace.h": "base", "lock.h": "base",
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


def rank(rel):
    """(layer index, index within the layer) of a source file; lower is higher up."""
    folder, name = rel.split("/")[-2:]
    order = ORDER.get(folder, [])
    inner = order.index(name) if name in order else 0
    return LAYERS.index(folder), inner


def check(src):
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
        if rel.split("/")[0] not in LAYERS:
            problems.append("%s: its folder is not a layer (%s)" % (rel, ", ".join(LAYERS)))
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
        for name in sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", text))):
            owner = defined.get(name)
            if not owner or owner == rel:
                continue
            if not name.startswith(("_vs_", "vmmshim_")) and not rel.startswith("pool/"):
                continue  # a static of pool.c's unit is visible inside that unit only
            if rank(owner) < me:
                problems.append("%s uses %s of %s, a layer above it" % (rel, name, owner))
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
    # The checker itself must catch what it is for: a copy of src/ with an upward call, then
    # with an upward include.
    tmp = tempfile.mkdtemp(prefix="vmmshim-layers-")
    try:
        for plant, what in (("void _vs_planted(void) { _vs_alloc(0, 0, 0, 0, 0); }\n", "an upward call"),
                            ('#include "vmmshim/share.h"\n', "an upward include")):
            copy = os.path.join(tmp, "src")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(src, copy)
            with open(os.path.join(copy, "handle", "handles.c"), "a") as f:
                f.write(plant)
            found = check(copy)
            report(any("handle/handles.c" in p for p in found), "a planted %s in handles.c is caught" % what, found[:3])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
