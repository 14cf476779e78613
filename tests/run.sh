#!/bin/sh
# Runs every CPU test and sums their closing lines into one: "N passed, N failed".
# Each test program prints its own "N passed, N failed" last; a program that crashes
# or prints no such line counts as one failure.
#
# SANITIZE=1 adds the sanitizer pass (make test), SANITIZE=only runs it alone (make
# test-sanitize): the unit tests built with AddressSanitizer + UndefinedBehaviorSanitizer and
# the invariant checks (build/asan/tests), every shim test's program with the instrumented
# library (build/asan/libvmmshim.so) preloaded after the ASan runtime, and the threaded tests
# under ThreadSanitizer (build/tsan). A sanitizer finding fails the test (non-zero exit).
#
# ONLY="name ..." runs only the tests of those names (as the "ok"/"FAIL" lines name them, e.g.
# test_shim_api test_trace_shim), and TEST_TIMEOUT (seconds, default 600) bounds each: what
# tests/mutation.py uses to run the tests of one planted bug.
BUILD=${BUILD:-build}
SANITIZE=${SANITIZE:-0}
PYTHON=${PYTHON:-python3}
ONLY=${ONLY:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-600}
EMU="$PWD/$BUILD/emu"
LIB="$PWD/$BUILD/libvmmshim.so"
total_pass=0
total_fail=0
logdir="$BUILD/test-logs"
mkdir -p "$logdir"

# Group segments of test processes that are gone: the tests name their groups t<pid>-... and remove
# them as they end; one a test left (killed by the timeout, crashed) goes after it. A segment whose
# process still runs (another run beside this one) stays.
sweep_segments() {
  for f in /dev/shm/vmmshim-*-t[0-9]*-*; do
    [ -e "$f" ] || continue
    pid=${f#/dev/shm/vmmshim-*-t}
    pid=${pid%%-*}
    [ -d "/proc/$pid" ] || rm -f "$f" 2>/dev/null
  done
}

run_one() { # name, command...
  name=$1; shift
  if [ -n "$ONLY" ]; then
    case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
  fi
  log="$logdir/$name.log"
  timeout "$TEST_TIMEOUT" "$@" >"$log" 2>&1
  rc=$?
  sweep_segments
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

if [ "$SANITIZE" != only ]; then
for t in "$BUILD"/tests/test_emu_*; do [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
for t in "$BUILD"/tests/test_unit_*; do [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
for t in "$BUILD"/tests/test_shim_* "$BUILD"/tests/test_static_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" env LD_LIBRARY_PATH="$EMU" LD_PRELOAD="$LIB" "$t"
done
for t in tests/scripts/test_*.sh; do
  [ -f "$t" ] || continue
  run_one "$(basename "$t" .sh)" env BUILD="$BUILD" PYTHON="$PYTHON" sh "$t"
done
for t in tests/scripts/test_*.py; do
  [ -f "$t" ] || continue
  run_one "$(basename "$t" .py)" env BUILD="$BUILD" "$PYTHON" "$t"
done
# The GPU runner's counting (tests/gpu/runner.sh) on fake programs: no GPU needed.
run_one test_gpu_runner sh tests/gpu/test_runner.sh
fi

if [ "$SANITIZE" != 0 ]; then
  CC=${CC:-cc}
  ASAN_RT=$("$CC" -print-file-name=libasan.so)
  TSAN_RT=$("$CC" -print-file-name=libtsan.so)
  SUPP="$PWD/tests/sanitize.supp"
  # Leak checking stays on; tests/sanitize.supp names what is deliberately left (and why).
  ASAN="ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:handle_segv=0:handle_sigbus=0:handle_abort=0:handle_sigfpe=0:handle_sigill=0 LSAN_OPTIONS=suppressions=$SUPP:print_suppressions=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
  TSAN="TSAN_OPTIONS=halt_on_error=1:exitcode=66:handle_segv=0:handle_sigbus=0:handle_abort=0:handle_sigfpe=0:handle_sigill=0:suppressions=$SUPP"
  for t in "$BUILD"/asan/tests/test_unit_*; do
    [ -x "$t" ] && run_one "asan-$(basename "$t")" env $ASAN "$t"
  done
  for t in "$BUILD"/tests/test_shim_* "$BUILD"/tests/test_static_*; do
    [ -x "$t" ] || continue
    run_one "asan-$(basename "$t")" env $ASAN LD_LIBRARY_PATH="$EMU" \
      LD_PRELOAD="$ASAN_RT $PWD/$BUILD/asan/libvmmshim.so" "$t"
  done
  # The tests whose threads run at once: arenas, the trace ring, the shim under 8 threads, peer
  # access changed while another thread maps and unmaps, the IPC server beside the program, the
  # control channel's server beside 8 allocating threads, tag rules replaced while 4 threads allocate.
  for n in test_unit_arena test_unit_trace test_unit_stitch; do
    [ -x "$BUILD/tsan/tests/$n" ] && run_one "tsan-$n" env $TSAN "$BUILD/tsan/tests/$n"
  done
  # Only the shim is instrumented there: what the test program and the emulation do through
  # intercepted calls (memset over gigabytes of emulated device memory) is not tracked, or its
  # shadow memory alone would take 16 GiB.
  for n in test_shim_threads test_shim_reuse test_shim_peer test_shim_ipc test_shim_control test_shim_stitch test_shim_rules; do
    [ -x "$BUILD/tests/$n" ] || continue
    run_one "tsan-$n" env $TSAN:ignore_noninstrumented_modules=1 LD_LIBRARY_PATH="$EMU" \
      LD_PRELOAD="$TSAN_RT $PWD/$BUILD/tsan/libvmmshim.so" "$BUILD/tests/$n"
  done
fi

echo "logs in $logdir"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" = 0 ]
