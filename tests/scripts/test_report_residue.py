#!/usr/bin/env python3
"""vmmshim-report on the residue records of a version-4 trace: the memory made outside the shim's
pools ('u' records) is counted, the residue after each sleep ('r' records) is a table in the text
summary and a section of the HTML page, growth from the first sleep is said, a negative
unexplained figure (more explained than in use) reads as negative, and no record is skipped as
unknown. Prints "N passed, N failed"."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, report, scratch, summary  # noqa: E402

MiB = 1 << 20


def residue(t, seq, used, tags, libs, managed, graph, unexplained, arrays=0, modules=0, inferred=0):
    rows = [(0, 4096 * MiB), (1, used), (2, tags), (4, managed), (5, graph), (6, 0), (7, 0),
            (8, unexplained & ((1 << 64) - 1)), (10, arrays), (11, modules)]
    if inferred:  # owners c and d: written when NVML lists the process
        rows += [(12, used - unexplained), (13, inferred)]
    out = ["r %x 7 %x 0 %x %x 0\n" % (t, owner, seq, n) for owner, n in rows]
    out.append("r %x 7 f - 1 libnccl.so.2\n" % t)
    out.append("r %x 7 3 - %x %x 1\n" % (t, seq, libs))
    out.append("r %x 7 9 - %x %x 0\n" % (t, seq, 4 * MiB))
    return out


TRACE = ["v 4 vmmshim 0.1.0\n", "x /usr/bin/python3\n", "c python3 rl.py\n", "p 7 1 0\n", "s 1 1\n",
         "l 1 7fff00000000 7fff00002000 7fff00000000 - /usr/lib/libnccl.so.2\n",
         "a 10 7 0 0 - 7f0000000000 800000 800000 0\n",
         "u 20 7 0 0 1001 %x 7fff00001234 0\n" % (64 * MiB),
         "u 30 7 4 - 7e0000000000 %x 7fff00005678 0\n" % (4 * MiB),
         "g 40 7 0 - 1 weights\n",
         "w 40 7 0 - 1 1 800000 800000 0 100\n"]
TRACE += residue(0x50, 1, 70 * MiB, 0, 64 * MiB, 0, 2 * MiB, 3 * MiB, arrays=MiB, modules=5 * MiB, inferred=7 * MiB)
TRACE += ["w 60 7 1 - 1 0 800000 800000 0 100\n",
          "u 70 7 0 0 1002 %x 7fff00001234 0\n" % (16 * MiB),
          "w 80 7 0 - 1 1 800000 800000 0 100\n"]
TRACE += residue(0x90, 2, 84 * MiB, 0, 80 * MiB, 0, 2 * MiB, -(2 * MiB))
TRACE += ["u a0 7 1 0 1002 %x 0 0\n" % (16 * MiB), "e b0\n"]


def main():
    with scratch("vmmshim-residue-") as tmp:
        path = os.path.join(tmp, "rl.trace")
        with open(path, "w") as f:
            f.writelines(TRACE)
        r = report(path)
        check(r.returncode == 0, "the report reads a version-4 trace (exit %d): %s" % (r.returncode, r.stderr[-300:]))
        out = r.stdout
        check("unknown type" not in out and "unknown record" not in r.stderr and "malformed" not in out,
              "no record skipped as unknown or malformed")
        check("VMM          made 2 (80 MiB), freed 1 (16 MiB)" in out, "the VMM memory made outside the pools counted")
        check("pinned host  made 1 (4 MiB), freed 0 (0 B)" in out, "the pinned host memory counted")
        check("  libnccl.so.2+0x1234: 64 MiB VMM" in out and "+0x7fff00001234" not in out,
              "the site still holding VMM memory: its offset in the library of its `l` record, not the address")
        check("  0x7fff00005678 (no module record): 4 MiB pinned host" in out,
              "a caller without a module record: the address, said so")
        rows = [line.split() for line in out.splitlines() if line.startswith("            1 ")
                or line.startswith("            2 ")]
        check(len(rows) == 2, "one row a sleep: %s" % rows)
        if len(rows) == 2:
            check(rows[0][3:5] == ["70", "MiB"] and rows[0][7:9] == ["64", "MiB"] and rows[0][13:15] == ["1", "MiB"]
                  and rows[0][-2:] == ["3", "MiB"],
                  "after the first sleep: 70 MiB used, 64 MiB libraries, 1 MiB arrays, 3 MiB unexplained %s" % rows[0])
            check(rows[0][17:21] == ["5", "MiB", "7", "MiB"],
                  "the modules (owner b) and the inferred part (owner d) in their columns %s" % rows[0])
            check(rows[1][7:9] == ["80", "MiB"] and rows[1][-2:] == ["-2", "MiB"],
                  "after the second: 80 MiB libraries, unexplained -2 MiB (signed) %s" % rows[1])
        check("14 MiB more in use than after the first sleep" in out, "growth since the first sleep said")
        check("libraries' own VMM memory after the last sleep: libnccl.so.2 80 MiB" in out, "the library named")
        html_path = os.path.join(tmp, "rl.html")
        r = report("--html", html_path, path)
        page = open(html_path).read() if os.path.exists(html_path) else ""
        check(r.returncode == 0 and "id=\"residue-section\"" in page and "libnccl.so.2 80 MiB" in page
              and page.count("<tr><td>") >= 2, "the HTML page has the residue table (exit %d)" % r.returncode)
        with open(path, "w") as f:
            f.writelines(TRACE[:5] + ["r 50 7 1 0 1 zz 0\n", "e 60\n"])
        r = report(path)
        check(r.returncode == 0 and "1 malformed" in r.stdout, "a malformed r record is skipped and counted")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
