#!/bin/sh
# Tests of bench/frag_floor (the least fixed arena that serves a workload with no driver call)
# on hand-made traces whose answers are worked out below, and on the churn workload: exact
# arena sizes for best fit and first fit, the shim's block rounding and alignment, the two heaps,
# comments in a trace, a missing file. Ends with "N passed, N failed".
BUILD=${BUILD:-build}
FLOOR="$BUILD/bench/frag_floor"
. "$(dirname "$0")/harness.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-floor-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
field() { # policy, field name: the value on that policy's line of $out
  printf '%s\n' "$out" | sed -n "s/.* policy=$1 .*$2=\([0-9.]*\).*/\1/p"
}

# In 256-byte units: A 100, B 10, C 60, D 10 side by side (180); A and C freed; E (60) goes to
# A's place under first fit (leaving 40 there) and to C's under best fit (exact); F (100) then
# fits A's place under best fit (arena 180 = the live peak) and only above D under first fit
# (arena 180 + 100 = 280).
cat > "$tmp/fit.csv" <<'T'
# a comment line, then a blank one

a 0 25600
a 1 2560
a 2 15360
a 3 2560
f 0
f 2
a 4 15360
a 5 25600
f 1
f 3
f 4
f 5
T
out=$("$FLOOR" "$tmp/fit.csv")
check "fit: runs" test $? = 0
check "fit: live peak 46080 bytes" test "$(field best peak_live)" = 46080
check "fit: best fit arena 46080 (ratio 1.000)" test "$(field best arena)" = 46080 -a "$(field best ratio)" = 1.000
check "fit: first fit arena 71680 (ratio 1.556)" test "$(field first arena)" = 71680 -a "$(field first ratio)" = 1.556
check "fit: all small blocks, so two heaps change nothing" \
  test "$(field best-2heaps arena)" = 46080 -a "$(field first-2heaps arena)" = 71680

# A 256-byte block, then a 4 MiB one that starts on a 2 MiB boundary: one arena needs 6 MiB;
# with the heaps apart, 256 bytes + 4 MiB. A request of 64 MiB + 1 is rounded up to 2 MiB.
printf 'a 0 256\na 1 4194304\nf 0\nf 1\n' > "$tmp/align.csv"
out=$("$FLOOR" "$tmp/align.csv")
check "align: one arena 6 MiB" test "$(field best arena)" = 6291456 -a "$(field first arena)" = 6291456
check "align: two heaps 4 MiB + 256" test "$(field best-2heaps arena)" = 4194560 -a "$(field first-2heaps arena)" = 4194560
check "align: two heaps ratio 1.000" test "$(field best-2heaps ratio)" = 1.000
printf 'a 0 67108865\nf 0\n' > "$tmp/round.csv"
out=$("$FLOOR" "$tmp/round.csv")
check "round: 64 MiB + 1 holds 66 MiB" test "$(field best arena)" = 69206016

# The churn workload (bench/workloads.h), 2000 steps: no policy below the live peak, every
# arena a multiple of 256, and the same figures on a second run.
out=$("$FLOOR" churn 3 2000)
check "churn: four policies" test "$(printf '%s\n' "$out" | grep -c '^R floor work=churn seed=3 ')" = 4
bad=0
for p in best best-2heaps first first-2heaps; do
  a=$(field "$p" arena)
  l=$(field "$p" peak_live)
  [ -n "$a" ] && [ "$a" -ge "$l" ] && [ $((a % 256)) = 0 ] || bad=1
done
check "churn: arenas at least the live peak, multiples of 256" test $bad = 0
check "churn: deterministic" test "$out" = "$("$FLOOR" churn 3 2000)"

err=$("$FLOOR" "$tmp/none.csv" 2>&1 >/dev/null)
rc=$?
check "missing file: exit 1" test $rc = 1
check "missing file: says so" has "$err" "no events in $tmp/none.csv"
summary
