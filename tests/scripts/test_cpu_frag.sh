#!/bin/sh
# Tests of bench/cpu_frag's figures (the shim on the host emulation): the steady calls by kind
# per 100 allocations, costly (creates, releases) against cheap (maps, set-access, unmaps), and
# the driver time estimated from them, on a hand-made trace whose calls are worked out below.
# Ends with "N passed, N failed".
BUILD=${BUILD:-build}
FRAG="$BUILD/bench/cpu_frag"
LIB="$PWD/$BUILD/libvmmshim.so"
EMU="$PWD/$BUILD/emu"
. "$(dirname "$0")/harness.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-cpufrag-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
field() { # field name: its value on the R line of $out
  printf '%s\n' "$out" | sed -n "s/^R cpu-frag .* $1=\([0-9.]*\).*/\1/p"
}
frag() { env LD_LIBRARY_PATH="$EMU" LD_PRELOAD="$LIB" "$@" "$FRAG" "$tmp/t.csv" sync; }

# 128 MiB live (the peak: the warm-up ends there), freed; then two small blocks. The first
# grows the small heap by one handle (create, map, set-access), and before that the growth gives
# back the idle 128 MiB handle (unmap, release): one call of each kind over 2 steady allocations.
printf 'a 0 134217728\nf 0\na 1 256\na 2 4096\nf 1\nf 2\n' > "$tmp/t1.csv"
cp "$tmp/t1.csv" "$tmp/t.csv"
out=$(frag CPU_FRAG_COSTS="1 10 100 1000 10000")
check "runs" test $? = 0
check "one call of each kind per 2 steady allocations" \
  test "$(field creates_100)" = 50.00 -a "$(field maps_100)" = 50.00 -a "$(field set_access_100)" = 50.00 \
  -a "$(field unmaps_100)" = 50.00 -a "$(field releases_100)" = 50.00
check "costly: creates and releases, 100 per 100" test "$(field costly_100)" = 100.00
check "cheap: maps, set-access and unmaps, 150 per 100" test "$(field cheap_100)" = 150.00
check "estimate: each kind at its own cost (11111 us over 2 allocations)" test "$(field est_driver_us)" = 5555.50
out=$(frag)
check "estimate at the H100's 64 MiB costs: 149.1 us over 2 allocations" test "$(field est_driver_us)" = 74.55

# Set-access is priced per handle mapped, not per call: with handles of at most 32 MiB, 256 MiB
# is freed, then a small block and blocks of 96 and 160 MiB; the growths map 4 handles under 2
# set-access calls (and create 2, unmap 3, release 1) over 3 steady allocations.
printf 'a 0 268435456\nf 0\na 1 256\na 2 100663296\na 3 167772160\n' > "$tmp/t.csv"
out=$(frag VMMSHIM_MAX_HANDLE=32M CPU_FRAG_COSTS="1 10 100 1000 10000")
check "bounded handles: 4 maps under 2 set-access calls" test "$(field maps_100)" = 133.33 -a "$(field set_access_100)" = 66.67
check "bounded handles: set-access priced per map, (2 + 4 x 110 + 3000 + 10000) / 3 us" \
  test "$(field est_driver_us)" = 4480.67
cp "$tmp/t1.csv" "$tmp/t.csv"
err=$(frag CPU_FRAG_COSTS="1 x" 2>&1 >/dev/null)
check "bad CPU_FRAG_COSTS: says so" has "$err" "CPU_FRAG_COSTS wants five figures"
out=$(frag CPU_FRAG_COSTS="1 x" 2>/dev/null)
check "bad CPU_FRAG_COSTS: the H100's costs" test "$(field est_driver_us)" = 74.55
summary
