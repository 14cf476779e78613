# A two-rank job put to sleep and woken as one group with `vmmshim ctl --group NAME sleep|wake`
# (docs/control.md, "A whole group"). Sourced by tests/gpu/run.sh (uses its say/pass/fail, LOGDIR,
# LIB, BIN, PYTHON, t0, TEST_BUDGET, and cd_ctl of ctl_drive.sh); not run on its own.
#
#   group-sleep/*  two ranks of tests/gpu/t_gsleep.cu (2 GiB of tag weights each; one per GPU, both
#                  on GPU 0 when there is one) in one group, each summing its buffer step after step;
#                  the group sleeps in mapped mode (both members moved, status shows weights asleep
#                  on both), then wakes (both moved); the ranks' own checks (every step's sum equal
#                  to the first, the bytes intact) are relayed. INFO: the command's time against the
#                  slowest member's own move.

gs_json() { # RUN NAME JSON PYTHON_CONDITION (r bound to the JSON)
  if printf '%s' "$3" | "$PYTHON" -c "
import json, sys
r = json.load(sys.stdin)
sys.exit(0 if ($4) else 1)" 2>/dev/null; then
    pass "$1/$2"
  else
    fail "$1/$2: $(printf '%s' "$3" | cut -c1-600)"
  fi
}

gs_info() { # RUN JSON: the command's time and its members' own
  printf '%s' "$2" | "$PYTHON" -c "
import json, sys
r = json.load(sys.stdin)
own = [m['reply'].get('ms', 0) for m in r['members'] if m.get('reply')]
print('INFO %s/%s: %.1f ms for the group, the slowest member moved in %.1f ms (+%.1f ms), quiesce %s ms' % (
    sys.argv[1], r['cmd'], r['ms'], max(own or [0]), r['ms'] - max(own or [0]),
    [m.get('quiesce_ms') for m in r['members']]))
print('INFO %s/%s: phases %s ms' % (sys.argv[1], r['cmd'], json.dumps(r.get('phases_ms'), sort_keys=True)))
for m in r['members']:
    print('INFO %s/%s: pid %d: round trips %s ms, its move %s ms' % (
        sys.argv[1], r['cmd'], m['pid'], json.dumps(m.get('rt_ms'), sort_keys=True), (m.get('reply') or {}).get('ms')))
" "$1" 2>&1 |
    tee -a "$MAIN_LOG"
}

gs_program() {
  run="group-sleep"
  bin="$BIN/t_gsleep.shared"
  dir="$LOGDIR/$run.dir"
  if [ ! -x "$bin" ]; then
    fail "$run: not built (see $LOGDIR/build-t_gsleep.shared.log)"
    return
  fi
  # shellcheck disable=SC2154 # t0, TEST_BUDGET: run.sh's
  left=$((TEST_BUDGET - ($(date +%s) - t0)))
  if [ "$left" -le 30 ]; then
    fail "$run: not run, the time budget of $TEST_BUDGET s is spent"
    return
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  group="gpu-gsleep-$$"
  jobs=""
  for r in 0 1; do
    env -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY GPU_TEST_SHIM=1 GSLEEP_DIR="$dir" GSLEEP_RANK=$r GSLEEP_MB=2048 \
      VMMSHIM_LIMIT_GROUP="$group" LD_PRELOAD="$LIB" timeout 90 "$bin" \
      >"$LOGDIR/$run.rank$r.log" 2>&1 &
    jobs="$jobs $!"
  done
  i=0
  while [ $i -lt 600 ] && ! { [ -e "$dir/ready.0" ] && [ -e "$dir/ready.1" ]; }; do
    sleep 0.1
    i=$((i + 1))
  done
  if [ -e "$dir/ready.0" ] && [ -e "$dir/ready.1" ]; then
    sleep 1
    out=$(cd_ctl --group "$group" sleep --mode mapped --json 2>&1)
    echo "$out" >"$LOGDIR/$run.sleep.json"
    gs_json "$run" sleep "$out" "r['ok'] and len(r['members']) == 2 and all(m['result'] == 'moved' for m in r['members'])"
    gs_info "$run" "$out"
    st=$(cd_ctl --group "$group" status --json 2>&1)
    gs_json "$run" status-asleep "$st" "all(any(t['name'] == 'weights' and t['asleep'] for t in m['control']['tags'])
           for m in r['members_list'] if m['alive'])"
    sleep 1
    out=$(cd_ctl --group "$group" wake --json 2>&1)
    echo "$out" >"$LOGDIR/$run.wake.json"
    gs_json "$run" wake "$out" "r['ok'] and all(m['result'] == 'moved' for m in r['members'])"
    gs_info "$run" "$out"
    sleep 1
  else
    fail "$run: the ranks did not start (see $LOGDIR/$run.rank0.log)"
  fi
  : >"$dir/stop"
  for j in $jobs; do wait "$j"; done
  for r in 0 1; do
    log="$LOGDIR/$run.rank$r.log"
    sed -n 's#^\(PASS\|FAIL\) #\1 '"$run"'/rank'"$r"'/#p; /^INFO /p' "$log" | tee -a "$MAIN_LOG"
    npass=$((npass + $(grep -c '^PASS ' "$log")))
    nfail=$((nfail + $(grep -c '^FAIL ' "$log")))
    grep -q '^gsleep: [0-9]* passed' "$log" || fail "$run/rank$r: no summary line; last lines: $(tail -n 3 "$log")"
  done
  rm -f "/dev/shm/vmmshim-$(id -u)-$group"
}

gs_program
