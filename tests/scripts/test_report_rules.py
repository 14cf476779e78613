#!/usr/bin/env python3
"""Tests of vmmshim-report on tag rules (trace version 4): the 'j' records name the rule that
tagged each allocation; the report lists what each rule tagged, and its by-site tables show each
site's tag and rule (a site some of whose allocations a rule tagged says how many), in the text
and on the HTML page. A version-3
reader's rule applies: a 'j' in a version-3 trace is an unknown record, skipped with a warning.
Ends with "N passed, N failed"."""
import os

from harness import check, report, scratch, summary

# Two sites (stacks 1 and 2, frames in no module: shown by address); site 1's two allocations
# were tagged by rule 0, site 2's first of two by rule 1, its second by no rule.
TRACE = """v 4 vmmshim 0.1.0
x /bin/prog
c prog
p 10 1 0
s 0 0
t 8 0 1
k 1 1 0 401000
k 2 1 0 402000
j 100 7 0 0 7f0000000000 kv kv=py:*/kv_cache.py
a 101 7 0 0 - 7f0000000000 100000 100000 1
j 200 7 0 0 7f0000100000 kv kv=py:*/kv_cache.py
a 201 7 0 0 - 7f0000100000 100000 100000 1
j 300 7 1 0 7f0000200000 weights weights=phase:before-launch
a 301 7 0 0 - 7f0000200000 2000 2000 2
a 401 7 0 0 - 7f0000300000 1000 1000 2
e 500
"""


def main():
    with scratch("rules") as tmp:
        run(tmp)
    return summary()


def run(tmp):
    path = os.path.join(tmp, "rules.trace")
    with open(path, "w") as f:
        f.write(TRACE)
    r = report(path, "--by-site")
    out = r.stdout
    check(r.returncode == 0 and r.stderr == "", "a version-4 trace with j records is read without a warning: %r"
          % r.stderr[:300])
    check("tag rules (VMMSHIM_TAG_RULES): allocations each tagged" in out, "the tag rules section")
    check(" 2097152 B        2 allocations  tag kv: rule kv=py:*/kv_cache.py" in out,
          "kv's rule: 2 allocations, 2 MiB")
    check("    8192 B        1 allocations  tag weights: rule weights=phase:before-launch" in out,
          "weights' rule: 1 allocation, 8 KiB")
    lines = [l for l in out.splitlines() if "0x401000" in l or "0x402000" in l]
    check(lines and all(("[tag kv: rule kv=py:*/kv_cache.py]" in l) for l in lines if "0x401000" in l),
          "site 1's rows show its tag and rule %s" % lines[:2])
    check(any("[tag weights: rule weights=phase:before-launch (1 of 2)]" in l for l in lines if "0x402000" in l),
          "site 2's rows say that 1 of its 2 allocations was tagged by the rule %s" % lines)
    page = os.path.join(tmp, "rules.html")
    r = report(path, "--html", page)
    text = open(page).read() if os.path.exists(page) else ""
    check(r.returncode == 0 and "[tag kv: rule kv=py:*/kv_cache.py]" in text
          and "[tag weights: rule weights=phase:before-launch (1 of 2)]" in text,
          "the HTML page's site tables show the tags and rules too")
    # The same records in a version-3 trace: 'j' is not known there.
    v3 = os.path.join(tmp, "v3.trace")
    with open(v3, "w") as f:
        f.write(TRACE.replace("v 4 ", "v 3 ", 1))
    r = report(v3, "--by-site")
    check(r.returncode == 0 and r.stderr.count("unknown record type 'j'") == 1 and "tag rules" not in r.stdout,
          "in a version-3 trace a j record is unknown: one warning, no rules section (%r)" % r.stderr[:200])
    # A malformed j line is skipped and counted, the rest read.
    bad = os.path.join(tmp, "bad.trace")
    with open(bad, "w") as f:
        f.write(TRACE.replace("j 300 7 1 0 7f0000200000 weights", "j 300 7 1 0 7f0000200000 we!ghts", 1))
    r = report(bad, "--by-site")
    check(r.returncode == 0 and "malformed line skipped" in r.stderr and "tag weights" not in r.stdout,
          "a malformed j line is skipped (%r)" % r.stderr[:200])


if __name__ == "__main__":
    raise SystemExit(main())
