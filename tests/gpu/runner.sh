# The counting of tests/gpu/run.sh (sourced by it, and by tests/gpu/test_runner.sh, which checks
# it on fake programs without a GPU). Needs: LOGDIR (one log per run), MAIN_LOG (the runner's own
# log), LIB (the shim; empty: runs without it), and when run_prog is called, TEST_BUDGET (seconds
# for the whole run) and t0 (its start, date +%s).

npass=0
nfail=0
nskip=0
say() { echo "$*" | tee -a "$MAIN_LOG"; }
pass() { npass=$((npass + 1)); say "PASS $*"; }
fail() { nfail=$((nfail + 1)); say "FAIL $*"; }
skip() { nskip=$((nskip + 1)); say "SKIP $*"; }

# run_prog RUN_NAME BINARY [ENV=VALUE...]: runs BINARY under the shim (GPU_TEST_SHIM=1 tells the
# program to require it; run_plain: without it, GPU_TEST_SHIM=0) and relays its PASS/FAIL lines
# prefixed with RUN_NAME. As the CPU runner does, a run counts as one failure when it has no FAIL
# line and yet crashed, exited non-zero, timed out, printed no "prog: N passed, N failed" line,
# made no check at all, or printed counts that its PASS lines do not add up to (lines lost).
run_prog() {
  run=$1
  bin=$2
  shift 2
  log="$LOGDIR/$(echo "$run" | tr / -).log"
  if [ ! -x "$bin" ]; then
    fail "$run: not built (see $LOGDIR/build-$(basename "$bin").log)"
    sed -n '1,15p' "$LOGDIR/build-$(basename "$bin").log" 2>/dev/null | tee -a "$MAIN_LOG"
    return
  fi
  # shellcheck disable=SC2154 # t0: the caller's
  left=$((TEST_BUDGET - ($(date +%s) - t0)))
  if [ "$left" -le 5 ]; then
    fail "$run: not run, the time budget of $TEST_BUDGET s is spent"
    return
  fi
  limit=90
  [ "$limit" -gt "$left" ] && limit=$left
  if [ -n "$LIB" ]; then expect=1; else expect=0; fi
  timeout "$limit" env -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY "$@" GPU_TEST_SHIM=$expect LD_PRELOAD="$LIB" "$bin" \
    >"$log" 2>&1
  rc=$?
  p=$(grep -c '^PASS ' "$log")
  f=$(grep -c '^FAIL ' "$log")
  sed -n 's#^\(PASS\|FAIL\) #\1 '"$run"'/#p' "$log" | tee -a "$MAIN_LOG"
  npass=$((npass + p))
  nfail=$((nfail + f))
  # the closing lines, summed: a program and the helpers it starts print one each
  sums=$(awk '/^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed/ { n++; sp += $2; sf += $4 }
              END { if (n) print sp, sf; else print "none" }' "$log")
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
    if [ "$rc" = 124 ]; then why="timed out after $limit s"; else why="exit status $rc"; fi
    fail "$run: $why without a FAIL line; last lines of $log:"
    tail -n 8 "$log" | tee -a "$MAIN_LOG"
  elif [ "$f" != 0 ]; then
    grep -E '^(INFO|vmmshim: (error|warning))' "$log" | head -n 10 | tee -a "$MAIN_LOG"
  elif [ "$sums" = none ]; then
    fail "$run: exit status 0 but no 'N passed, N failed' line (the program did not finish); last lines of $log:"
    tail -n 8 "$log" | tee -a "$MAIN_LOG"
  elif [ "$p" = 0 ]; then
    fail "$run: no check was made"
  elif [ "$sums" != "$p 0" ]; then
    fail "$run: its closing lines count '$sums' (passed failed), its PASS lines $p: lines were lost"
  fi
}

# run_python NAME SCRIPT [ARGS...]: a Python test of tests/gpu that loads the shim itself (given
# --lib LIB; the runner's preload and free mode are taken away), bounded by what is left of
# TEST_BUDGET (240 s at most). Its PASS, FAIL and INFO lines are relayed prefixed with NAME and
# counted; exit 77 is a skip (its SKIP line says why); a non-zero exit without a FAIL line fails.
run_python() {
  name=$1
  script=$2
  shift 2
  left=$((TEST_BUDGET - ($(date +%s) - t0)))
  if [ "$left" -le 30 ]; then
    fail "$name: not run, the time budget of $TEST_BUDGET s is spent"
    return
  fi
  [ "$left" -gt 240 ] && left=240
  log="$LOGDIR/$name.log"
  timeout "$left" env -u LD_PRELOAD -u VMMSHIM_FREE_MODE "$PYTHON" "$script" --lib "$LIB" "$@" >"$log" 2>&1
  rc=$?
  if [ "$rc" = 77 ]; then
    skip "$name: $(sed -n 's/^SKIP //p' "$log" | head -n 1)"
    return
  fi
  sed -n "s#^\\(PASS\\|FAIL\\|INFO\\) #\\1 $name/#p" "$log" | tee -a "$MAIN_LOG"
  npass=$((npass + $(grep -c '^PASS ' "$log")))
  f=$(grep -c '^FAIL ' "$log")
  nfail=$((nfail + f))
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
    fail "$name: exit $rc without a FAIL line; last lines of $log:"
    tail -n 8 "$log" | tee -a "$MAIN_LOG"
  fi
}

# run_plain: run_prog without the shim (LD_PRELOAD empty), for reference runs.
run_plain() {
  _saved_lib=$LIB
  LIB=
  run_prog "$@"
  LIB=$_saved_lib
}

# compare_values BASE_LOG SHIM_LOG: the same "VALUE name x" lines in both, equal within 1e-6
# relative; prints the differences, and each name found in only one of them. Fails when the runs
# printed no VALUE line.
compare_values() {
  awk '
    function abs(v) { return v < 0 ? -v : v }
    FILENAME == ARGV[1] { if ($1 == "VALUE" && !($2 in base)) { base[$2] = $3; order[++nb] = $2 } next }
    $1 == "VALUE" {
      n++
      seen[$2] = 1
      if (!($2 in base)) { bad++; print "  " $2 ": missing in the run without the shim"; next }
      if (base[$2] == $3) next
      x = base[$2] + 0; y = $3 + 0
      if (abs(x - y) > 1e-6 * abs(x) + 1e-30) {
        bad++; printf "  %s: %s without the shim, %s with it\n", $2, base[$2], $3
      }
    }
    END {
      for (i = 1; i <= nb; i++)
        if (!(order[i] in seen)) { bad++; print "  " order[i] ": missing in the run with the shim" }
      if (n == 0 && nb == 0) { print "  no VALUE lines"; exit 1 }
      exit bad ? 1 : 0
    }' "$1" "$2"
}
