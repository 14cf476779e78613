#!/bin/sh
# The counting of the GPU runner (tests/gpu/runner.sh, sourced by tests/gpu/run.sh), checked on
# the CPU: fake test programs (small shell scripts) that pass, fail, crash, hang, print nothing,
# lose lines, or print no closing line, run through run_prog and run_plain; and compare_values
# on hand-made logs (values equal, different, or missing on either side). Run by tests/run.sh
# from the repository root. Ends with "N passed, N failed".
. tests/scripts/harness.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-gpu-runner-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
LOGDIR="$tmp/logs"
MAIN_LOG="$LOGDIR/gpu-test.log"
mkdir -p "$LOGDIR" "$tmp/bin"
: >"$MAIN_LOG"
# The "shim" the fakes run under: any library the loader finds does (libc is loaded anyway).
LIB=libc.so.6
TEST_BUDGET=3600
t0=$(date +%s)
. tests/gpu/runner.sh

# fake NAME: a program from stdin (a shell script)
fake() {
  { echo '#!/bin/sh'; cat; } >"$tmp/bin/$1"
  chmod +x "$tmp/bin/$1"
}
# counted NAME WANT_PASS WANT_FAIL [run_plain]: runs the fake through the runner; checks the counts it added
counted() {
  _name=$1 _wp=$2 _wf=$3
  _p0=$npass _f0=$nfail
  if [ "${4:-}" = plain ]; then run_plain "t/$_name" "$tmp/bin/$_name" >/dev/null; else run_prog "t/$_name" "$tmp/bin/$_name" >/dev/null; fi
  _dp=$((npass - _p0)) _df=$((nfail - _f0))
  check "$_name: +$_wp passed, +$_wf failed (got +$_dp, +$_df)" test "$_dp/$_df" = "$_wp/$_wf"
}
in_log() { grep -q -- "$1" "$MAIN_LOG"; }

# ---- run_prog ----
fake good <<'P'
echo "PASS fake/a"
echo "INFO something"
echo "PASS fake/b"
echo "fake: 2 passed, 0 failed"
P
counted good 2 0
check "good: PASS lines relayed with the run's name" in_log '^PASS t/good/fake/a$'

fake silent <<'P'
exit 0
P
counted silent 0 1
check "silent: said why" in_log '^FAIL t/silent: exit status 0 but no .N passed, N failed. line'

fake nosummary <<'P'
echo "PASS fake/a"
P
counted nosummary 1 1

fake nochecks <<'P'
echo "fake: 0 passed, 0 failed"
P
counted nochecks 0 1
check "nochecks: said why" in_log '^FAIL t/nochecks: no check was made'

fake lost <<'P'
echo "PASS fake/a"
echo "PASS fake/b"
echo "fake: 3 passed, 0 failed"
P
counted lost 2 1
check "lost: said why" in_log "^FAIL t/lost: its closing lines count '3 0'"

fake failing <<'P'
echo "PASS fake/a"
echo "FAIL fake/b: wrong"
echo "fake: 1 passed, 1 failed"
exit 1
P
counted failing 1 1
check "failing: the FAIL line relayed" in_log '^FAIL t/failing/fake/b: wrong$'

fake crash <<'P'
echo "PASS fake/a"
kill -SEGV $$
P
counted crash 1 1
check "crash: said why" in_log '^FAIL t/crash: exit status 139 without a FAIL line'

fake badexit <<'P'
echo "PASS fake/a"
echo "fake: 1 passed, 0 failed"
exit 3
P
counted badexit 1 1

fake helpers <<'P'
echo "PASS fake-helper/a"
echo "fake-helper: 1 passed, 0 failed"
echo "PASS fake/b"
echo "PASS fake/c"
echo "fake: 2 passed, 0 failed"
P
counted helpers 3 0

fake env <<'P'
echo "PASS fake/expect-$GPU_TEST_SHIM"
echo "PASS fake/preload-$LD_PRELOAD"
echo "fake: 2 passed, 0 failed"
P
counted env 2 0
check "under the shim: GPU_TEST_SHIM=1, LD_PRELOAD set" in_log '^PASS t/env/fake/expect-1$'
check "under the shim: LD_PRELOAD is the library" in_log '^PASS t/env/fake/preload-libc.so.6$'
counted env 2 0 plain
check "run_plain: GPU_TEST_SHIM=0" in_log '^PASS t/env/fake/expect-0$'
check "run_plain: LD_PRELOAD empty" in_log '^PASS t/env/fake/preload-$'
check "run_plain: LIB restored after it" test "$LIB" = libc.so.6

counted none 0 1
check "missing program: said why" in_log '^FAIL t/none: not built'
fake late <<'P'
touch "$0.ran"
echo "PASS fake/a"
echo "fake: 1 passed, 0 failed"
P
t0_saved=$t0
t0=$(($(date +%s) - TEST_BUDGET + 3))
counted late 0 1
check "budget spent: not run" test ! -f "$tmp/bin/late.ran"
# a hang: stopped at the time left (6 s here), one failure
t0=$(($(date +%s) - TEST_BUDGET + 6))
fake hang <<'P'
echo "PASS fake/a"
sleep 30
P
counted hang 1 1
check "hang: said it timed out" in_log '^FAIL t/hang: timed out after'
t0=$t0_saved

# ---- compare_values ----
vals() { # FILE, then lines
  _f=$1
  shift
  printf '%s\n' "$@" >"$_f"
}
cmp_rc() { compare_values "$tmp/base" "$tmp/shim" >"$tmp/diff"; echo $?; }
vals "$tmp/base" "VALUE a 1.5" "noise" "VALUE b 2"
vals "$tmp/shim" "VALUE b 2" "VALUE a 1.5"
check "compare: same values in another order" test "$(cmp_rc)" = 0
vals "$tmp/shim" "VALUE a 1.5000000001" "VALUE b 2"
check "compare: within 1e-6 relative" test "$(cmp_rc)" = 0
vals "$tmp/shim" "VALUE a 1.6" "VALUE b 2"
check "compare: a different value fails" test "$(cmp_rc)" = 1
check "compare: names it" grep -q 'a: 1.5 without the shim, 1.6 with it' "$tmp/diff"
vals "$tmp/shim" "VALUE a 1.5"
check "compare: a value missing under the shim fails" test "$(cmp_rc)" = 1
check "compare: names it" grep -q 'b: missing in the run with the shim' "$tmp/diff"
vals "$tmp/shim" "VALUE a 1.5" "VALUE b 2" "VALUE c 3"
check "compare: a value missing without the shim fails" test "$(cmp_rc)" = 1
check "compare: names it" grep -q 'c: missing in the run without the shim' "$tmp/diff"
vals "$tmp/shim" "nothing"
check "compare: no VALUE line under the shim fails" test "$(cmp_rc)" = 1
vals "$tmp/base" "nothing"
check "compare: no VALUE line at all fails" test "$(cmp_rc)" = 1
: >"$tmp/base"
vals "$tmp/shim" "VALUE a 1"
check "compare: an empty run without the shim fails" test "$(cmp_rc)" = 1
check "compare: names the value" grep -q 'a: missing in the run without the shim' "$tmp/diff"
summary
