# Programs steered from outside through their control channel (docs/control.md). Sourced by
# tests/gpu/run.sh (uses its say/pass/fail/skip, LOGDIR, LIB, BIN, PYTHON, t0, TEST_BUDGET); not
# run on its own.
#
#   ctl-<rt>/*     tests/gpu/t_ctl.cu, static and shared runtime: a program that never calls the
#                  shim, driven phase by phase with scripts/vmmshim ctl: tag weights, then tag kv
#                  (status shows its allocations landing there); sleep kv --mode discard while a
#                  kernel still runs on it, sleep weights (host mode); status shows both off the
#                  device, list and top --once name the program; wake weights, wake kv --zero; a
#                  sleep asked for during a stream capture: exit 1, EBUSY, after VMMSHIM_SLEEP_WAIT.
#                  The program's own checks (the driver reports the memory free, bytes intact, kv
#                  zeros, the graph captured before replays, the capture ends whole) are relayed.
#   torch-sleep/*  tests/gpu/torch_sleep.py: a PyTorch training run (caching allocator on) put to
#                  sleep and woken by a driver through vmmshim.control(pid) while it waits between
#                  steps; losses bit-identical to the same run under the shim without sleeps.
#   torch-sleep-nocache/*  the same with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a shim block).
#                  PyTorch missing: SKIP; anything else missing fails.

cd_ctl() { VMMSHIM_LIB="$LIB" sh scripts/vmmshim ctl "$@"; }

# cd_wait DIR PHASE PROG_PID: waits until the program reached PHASE (60 s; false if it died first).
cd_wait() {
  i=0
  while [ $i -lt 600 ]; do
    [ "$(cat "$1/phase" 2>/dev/null)" = "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

# cd_step RUN NAME WANT_STATUS WANT_TEXT ARGS...: runs vmmshim ctl ARGS, expects its exit status and
# a piece of its output.
cd_step() {
  run=$1 name=$2 want_rc=$3 want=$4
  shift 4
  out=$(cd_ctl "$@" 2>&1)
  rc=$?
  echo "$ vmmshim ctl $*" >>"$LOGDIR/$run.ctl.log"
  echo "$out" >>"$LOGDIR/$run.ctl.log"
  case $out in
    *"$want"*) [ "$rc" = "$want_rc" ] && { pass "$run/$name"; return 0; } ;;
  esac
  fail "$run/$name: vmmshim ctl $* exited $rc (want $want_rc, with '$want'): $(echo "$out" | head -n 3)"
  return 1
}

# cd_json RUN NAME PID PYTHON_CONDITION: status --json of PID, st bound to the reply.
cd_json() {
  run=$1 name=$2 pid=$3 cond=$4
  js=$(cd_ctl "$pid" status --json 2>&1)
  if printf '%s' "$js" | "$PYTHON" -c "
import json, sys
st = json.load(sys.stdin)
tag = {t['name']: t for t in st['tags']}
G = 1 << 30
sys.exit(0 if ($cond) else 1)" 2>/dev/null; then
    pass "$run/$name"
  else
    fail "$run/$name: status does not satisfy $cond: $(printf '%s' "$js" | cut -c1-400)"
  fi
}

cd_program() { # RT
  rt=$1
  run="ctl-$rt"
  bin="$BIN/t_ctl.$rt"
  dir="$LOGDIR/$run.dir"
  log="$LOGDIR/$run.log"
  if [ ! -x "$bin" ]; then
    fail "$run: not built (see $LOGDIR/build-t_ctl.$rt.log)"
    return
  fi
  left=$((TEST_BUDGET - ($(date +%s) - t0)))
  if [ "$left" -le 20 ]; then
    fail "$run: not run, the time budget of $TEST_BUDGET s is spent"
    return
  fi
  rm -rf "$dir" "$LOGDIR/$run.ctl.log"
  mkdir -p "$dir"
  env -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY CTL_DIR="$dir" VMMSHIM_SLEEP_WAIT=500 LD_PRELOAD="$LIB" \
    timeout 150 "$bin" >"$log" 2>&1 &
  job=$!
  if ! cd_wait "$dir" started "$job"; then
    fail "$run: the program did not start (last lines of $log:)"
    tail -n 5 "$log" | tee -a "$MAIN_LOG"
    kill "$job" 2>/dev/null
    wait "$job" 2>/dev/null
    return
  fi
  pid=$(cat "$dir/pid")
  cd_step "$run" list 0 "$pid  t_ctl.$rt" list
  cd_step "$run" tag-weights 0 "new allocations go to tag 'weights' (was 'untagged')" "$pid" tag weights
  : >"$dir/go.started"
  if cd_wait "$dir" loaded "$job"; then
    cd_json "$run" weights-loaded "$pid" "tag['weights']['live'] >= 2 * G and st['process_tag'] == 'weights'"
    cd_step "$run" tag-kv 0 "(was 'weights')" "$pid" tag kv
  fi
  : >"$dir/go.loaded"
  if cd_wait "$dir" filled "$job"; then
    cd_step "$run" sleep-kv-discard 0 "sleep kv (discard): released 2.00 GiB" "$pid" sleep kv --mode discard
    cd_step "$run" sleep-weights-host 0 "copied to the host 2.00 GiB" "$pid" sleep weights
    cd_json "$run" status-asleep "$pid" "tag['kv']['discarded'] >= 2 * G and tag['kv']['device'] == 0 and \
tag['weights']['host_copied'] >= 2 * G and tag['weights']['device'] == 0 and tag['kv']['asleep']"
    out=$(VMMSHIM_LIB="$LIB" sh scripts/vmmshim top --once 2>&1)
    if printf '%s\n' "$out" | grep -q "^ *$pid t_ctl"; then pass "$run/top-once"; else fail "$run/top-once: $out"; fi
  fi
  : >"$dir/go.filled"
  cd_wait "$dir" asleep "$job" && : >"$dir/go.asleep"
  if cd_wait "$dir" checked "$job"; then
    cd_step "$run" wake-weights 0 "wake weights: restored 2.00 GiB (2.00 GiB copied back from the host)" "$pid" \
      wake weights
    cd_step "$run" wake-kv-zero 0 "wake kv: restored 2.00 GiB" "$pid" wake kv --zero
  fi
  : >"$dir/go.checked"
  if cd_wait "$dir" capturing "$job"; then
    cd_step "$run" sleep-during-capture 1 "EBUSY" "$pid" sleep weights
  fi
  : >"$dir/go.capturing"
  wait "$job"
  rc=$?
  sed -n 's#^\(PASS\|FAIL\) #\1 '"$run"'/#p' "$log" | tee -a "$MAIN_LOG"
  npass=$((npass + $(grep -c '^PASS ' "$log")))
  f=$(grep -c '^FAIL ' "$log")
  nfail=$((nfail + f))
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
    fail "$run: the program exited $rc without a FAIL line; last lines of $log:"
    tail -n 8 "$log" | tee -a "$MAIN_LOG"
  fi
}

cd_program static
cd_program shared
run_python torch-sleep tests/gpu/torch_sleep.py --dir "$LOGDIR/torch-sleep.dir"
run_python torch-sleep-nocache tests/gpu/torch_sleep.py --dir "$LOGDIR/torch-sleep-nocache.dir" --no-cache
