#!/bin/sh
# Runs every CPU test and sums their closing lines into one: "N passed, N failed".
# Each test program prints its own "N passed, N failed" last; a program that crashes
# or prints no such line counts as one failure.
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
EMU="$PWD/$BUILD/emu"
LIB="$PWD/$BUILD/libvmmshim.so"
total_pass=0
total_fail=0
logdir="$BUILD/test-logs"
mkdir -p "$logdir"

run_one() { # name, command...
  name=$1; shift
  log="$logdir/$name.log"
  timeout 600 "$@" >"$log" 2>&1
  rc=$?
  line=$(grep -E '^([A-Za-z_-]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  p=$(echo "$line" | sed -nE 's/^([A-Za-z_-]+: )?([0-9]+) passed, ([0-9]+) failed.*/\2/p')
  f=$(echo "$line" | sed -nE 's/^([A-Za-z_-]+: )?([0-9]+) passed, ([0-9]+) failed.*/\3/p')
  if [ -z "$p" ]; then p=0; f=1; fi
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  if [ "$f" != 0 ]; then
    echo "FAIL $name (exit $rc): $line"; sed -n '/FAIL/p' "$log" | head -n 20; tail -n 5 "$log"
  else
    echo "ok   $name: $p passed"
  fi
}

for t in "$BUILD"/tests/test_emu_*; do [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
for t in "$BUILD"/tests/test_unit_*; do [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
for t in "$BUILD"/tests/test_shim_* "$BUILD"/tests/test_static_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" env LD_LIBRARY_PATH="$EMU" LD_PRELOAD="$LIB" VMMSHIM_TEST_LIB="$LIB" "$t"
done
for t in tests/scripts/test_*.sh; do
  [ -f "$t" ] || continue
  run_one "$(basename "$t" .sh)" env BUILD="$BUILD" PYTHON="$PYTHON" sh "$t"
done
for t in tests/scripts/test_*.py; do
  [ -f "$t" ] || continue
  run_one "$(basename "$t" .py)" env BUILD="$BUILD" "$PYTHON" "$t"
done

echo "logs in $logdir"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" = 0 ]
