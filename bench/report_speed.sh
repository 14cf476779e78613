#!/bin/sh
# Benchmark: scripts/vmmshim-report on a synthetic native trace of N events (default
# 10 million); it must finish well under a minute. CPU only.
#   sh bench/report_speed.sh [N]
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
N=${1:-10000000}
out=${TMPDIR:-/tmp}/vmmshim-report-speed.$$
mkdir -p "$out" || exit 1
trap 'rm -rf "$out"' EXIT
"$PYTHON" - "$N" "$out/synth.trace" <<'EOF'
import random, sys
n, path = int(sys.argv[1]), sys.argv[2]
rnd = random.Random(1)
live = []  # ring of live pointers: frees mostly hit old blocks, some hit young ones
t = 0
ptr = 0x7f0000000000
mapped = 0
cur = 0
with open(path, "w", buffering=1 << 20) as f:
    f.write("v 1 vmmshim 0.1.0\nx /synthetic\nc synthetic\np 1 0 0\ns 0 0\n")
    w = f.write
    for i in range(n):
        t += rnd.randint(50, 3000)
        if live and (len(live) > 4000 or rnd.random() < 0.49):
            j = -1 if rnd.random() < 0.3 else 0
            p, s = live.pop(j)
            cur -= s
            w("f %x 1 1 0 5 %x %x\n" % (t, p, s))
        else:
            s = 512 << rnd.randint(0, 13)
            if cur + s > mapped:
                w("m %x 1 2 0 %x 4000000 1 0 0 2710\n" % (t, 0x7e0000000000 + mapped))
                mapped += 64 << 20
            live.append((ptr, s))
            w("a %x 1 1 0 5 %x %x %x\n" % (t, ptr, s, s))
            ptr += s
            cur += s
    w("e %x\n" % (t + 1))
EOF
echo "trace: $(wc -l < "$out/synth.trace") lines, $(du -m "$out/synth.trace" | cut -f1) MiB"
start=$(date +%s.%N)
"$PYTHON" "$ROOT/scripts/vmmshim-report" "$out/synth.trace" --html "$out/r.html" --perfetto "$out/r.json" >"$out/report.txt"
rc=$?
end=$(date +%s.%N)
secs=$(echo "$end - $start" | bc 2>/dev/null || "$PYTHON" -c "print($end - $start)")
head -n 12 "$out/report.txt"
echo "report_speed: $N events in $secs s (exit $rc; limit 60 s)"
"$PYTHON" -c "import sys; sys.exit(0 if float('$secs') < 60 and $rc == 0 else 1)"
