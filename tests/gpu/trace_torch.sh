# Traces under the shim and the tools that read them. Sourced by tests/gpu/run.sh (uses its
# say/pass/fail/skip, LOGDIR, LIB, BIN, PYTHON, NVCC_PATH, t0, TEST_BUDGET); not run on its own.
#
#   trace-torch/*   a 10-step PyTorch training run of a small transformer (bench/tfm.py, fixed seed)
#                   with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under scripts/vmmshim --trace; then
#                   scripts/vmmshim-report: peak live > 0 and as many allocations as the shim's
#                   VMMSHIM_STATS say; --html written, --memory-viz unpickles with "segments" and
#                   "device_traces", --perfetto is JSON; scripts/vmmshim-replay with $BIN/replay:
#                   rows for cudaMalloc, cudaMallocAsync and vmmshim, none failed.
#   trace-torch-stacks/*  the same run with VMMSHIM_TRACE_STACKS=16: vmmshim-report --by-site names
#                   Python lines of the script or of bench/tfm.py as the top sites, its sites add
#                   up to the shim's allocation count, and the HTML page has the icicle graph
#   trace-static/*  the same count check on a static-runtime program (t_errors.static), native format
#   trace-rmm/*     the same program with VMMSHIM_TRACE_FORMAT=rmm, read by the report
# The report summary and the replay table are copied into the main log.

# tt_stats_allocs STDERR_FILE: the sum of the "allocations served" line of VMMSHIM_STATS=1.
tt_stats_allocs() {
  sed -n 's/.*stats: allocations served: cudaMalloc \([0-9]*\), cudaMallocAsync \([0-9]*\), cuMemAlloc \([0-9]*\), cuMemAllocAsync \([0-9]*\).*/\1 \2 \3 \4/p' "$1" |
    tail -n 1 | awk 'NF == 4 { print $1 + $2 + $3 + $4 }'
}

# tt_report_allocs REPORT_TXT: N of "  N allocations (..." in vmmshim-report's summary.
tt_report_allocs() {
  sed -n 's/^  \([0-9][0-9]*\) allocations (.*/\1/p' "$1" | head -n 1
}

# tt_count_check NAME TRACE STDERR: runs the report on TRACE into $LOGDIR/NAME-report.txt and
# compares its allocation count with the shim's stats in STDERR.
tt_count_check() {
  name=$1
  rep="$LOGDIR/$name-report.txt"
  if ! "$PYTHON" scripts/vmmshim-report "$2" >"$rep" 2>&1; then
    fail "$name/report: vmmshim-report failed on $2:"
    tail -n 5 "$rep" | tee -a "$MAIN_LOG"
    return 1
  fi
  pass "$name/report"
  n_rep=$(tt_report_allocs "$rep")
  n_st=$(tt_stats_allocs "$3")
  if [ -z "$n_st" ]; then
    fail "$name/alloc-count: no VMMSHIM_STATS line in $3"
  elif [ -z "$n_rep" ]; then
    fail "$name/alloc-count: no allocation count in $rep"
  elif [ "$n_rep" = "$n_st" ] && [ "$n_st" -gt 0 ]; then
    pass "$name/alloc-count ($n_rep allocations in the trace and in the shim's stats)"
  else
    fail "$name/alloc-count: the report counts $n_rep allocations, the shim's stats $n_st"
  fi
  return 0
}

tt_left() { echo $((TEST_BUDGET - ($(date +%s) - t0))); }

# ---- PyTorch ----
tt_torch() {
  if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    skip "trace-torch: no PyTorch with CUDA for $PYTHON"
    return
  fi
  left=$(tt_left)
  if [ "$left" -le 20 ]; then
    fail "trace-torch: not run, the time budget of $TEST_BUDGET s is spent"
    return
  fi
  [ "$left" -gt 150 ] && left=150
  script="$LOGDIR/trace_torch_train.py"
  cat >"$script" <<'EOF'
# Written by tests/gpu/trace_torch.sh: 10 training steps of bench/tfm.py's transformer, fixed seed.
import os
import sys

root = os.environ["TT_ROOT"]
sys.path.insert(0, os.path.join(root, "bench"))
sys.path.insert(0, os.path.join(root, "tests", "gpu"))
import tfm  # noqa: E402
import vsstats  # noqa: E402

print("PID %d" % os.getpid(), flush=True)
torch = tfm.setup()
vocab = 4096
model, opt = tfm.build(torch, d_model=256, layers=2, heads=4, vocab=vocab)
for i, tok in enumerate(tfm.batches(torch, vocab, 8, [128] * 10)):
    loss = tfm.train_step(torch, model, opt, tok, vocab)
    print("VALUE loss_step%d %r" % (i, float(loss.item())), flush=True)
torch.cuda.synchronize()
print("SHIM %s" % vsstats.summary(vsstats.get_stats()), flush=True)
EOF
  rm -f "$LOGDIR"/torch.*.trace
  out="$LOGDIR/trace-torch.log"
  err="$LOGDIR/trace-torch.stderr"
  timeout "$left" env -u LD_PRELOAD -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY -u PYTORCH_CUDA_ALLOC_CONF \
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_STATS=1 VMMSHIM_LIB="$LIB" TT_ROOT="$PWD" \
    scripts/vmmshim --trace "$LOGDIR/torch.%p.trace" -q -- "$PYTHON" "$script" >"$out" 2>"$err"
  rc=$?
  if [ "$rc" != 0 ]; then
    fail "trace-torch/run: exit $rc under scripts/vmmshim; last lines:"
    tail -n 8 "$out" "$err" | tee -a "$MAIN_LOG"
    return
  fi
  pid=$(sed -n 's/^PID //p' "$out" | head -n 1)
  trace="$LOGDIR/torch.$pid.trace"
  if [ -z "$pid" ] || [ ! -s "$trace" ]; then
    fail "trace-torch/run: no trace at $trace (files: $(ls "$LOGDIR" | grep '^torch\..*\.trace$' | tr '\n' ' '))"
    return
  fi
  pass "trace-torch/run ($(grep -c '^VALUE' "$out") steps, trace $(wc -c <"$trace") bytes)"
  rep="$LOGDIR/trace-torch-report.txt"
  html="$LOGDIR/torch-report.html"
  viz="$LOGDIR/torch-snapshot.pickle"
  pf="$LOGDIR/torch-perfetto.json"
  rm -f "$html" "$viz" "$pf"
  if ! "$PYTHON" scripts/vmmshim-report "$trace" --html "$html" --memory-viz "$viz" --perfetto "$pf" >"$rep" 2>&1; then
    fail "trace-torch/report: vmmshim-report failed:"
    tail -n 8 "$rep" | tee -a "$MAIN_LOG"
    return
  fi
  peak=$(sed -n 's/^  peak live: .*(\([0-9][0-9]*\) B).*/\1/p' "$rep" | head -n 1)
  if [ -n "$peak" ] && [ "$peak" -gt 0 ]; then
    pass "trace-torch/report-peak (peak live $peak B)"
  else
    fail "trace-torch/report-peak: no peak live > 0 in $rep"
  fi
  n_rep=$(tt_report_allocs "$rep")
  n_st=$(tt_stats_allocs "$err")
  if [ -n "$n_rep" ] && [ "$n_rep" = "$n_st" ] && [ "$n_st" -gt 0 ]; then
    pass "trace-torch/alloc-count ($n_rep allocations in the trace and in the shim's stats)"
  else
    fail "trace-torch/alloc-count: the report counts '${n_rep}' allocations, the shim's VMMSHIM_STATS '${n_st}'"
  fi
  if [ -s "$html" ] && grep -q '</html>' "$html"; then
    pass "trace-torch/html ($(wc -c <"$html") bytes)"
  else
    fail "trace-torch/html: $html missing, empty or cut short"
  fi
  if why=$("$PYTHON" -c '
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
missing = [k for k in ("segments", "device_traces") if k not in d]
if missing:
    print("no key " + ", ".join(missing)); sys.exit(1)
print("%d segments, %d events" % (len(d["segments"]), sum(len(t) for t in d["device_traces"])))
' "$viz" 2>&1); then
    pass "trace-torch/memory-viz ($why)"
  else
    fail "trace-torch/memory-viz: $viz: $(echo "$why" | tail -n 1)"
  fi
  if why=$("$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
print("%d events" % len(d["traceEvents"]))
' "$pf" 2>&1); then
    pass "trace-torch/perfetto ($why)"
  else
    fail "trace-torch/perfetto: $pf is not valid JSON with traceEvents: $(echo "$why" | tail -n 1)"
  fi
  say "vmmshim-report of the PyTorch trace ($rep):"
  sed -n '/^memory$/,/^leaks/p' "$rep" | tee -a "$MAIN_LOG"

  # Replay: the replayer was built beside the tests (run.sh), as bench/run.sh builds it.
  tab="$LOGDIR/trace-torch-replay.txt"
  if [ ! -x "$BIN/replay" ]; then
    fail "trace-torch/replay: $BIN/replay not built (see $LOGDIR/build-replay.log)"
    head -n 10 "$LOGDIR/build-replay.log" 2>/dev/null | tee -a "$MAIN_LOG"
    return
  fi
  left=$(tt_left)
  [ "$left" -gt 120 ] && left=120
  [ "$left" -lt 10 ] && left=10
  timeout "$left" env -u LD_PRELOAD VMMSHIM_LIB="$LIB" "$PYTHON" scripts/vmmshim-replay --replayer "$BIN/replay" "$trace" >"$tab" 2>"$tab.stderr"
  rc=$?
  missing=
  for row in cudaMalloc cudaMallocAsync vmmshim; do
    grep -q "^$row " "$tab" || missing="$missing $row"
  done
  if [ "$rc" != 0 ] || [ -n "$missing" ]; then
    fail "trace-torch/replay: exit $rc, rows missing:${missing:- none}; $(tail -n 2 "$tab.stderr" | tr '\n' ' ')"
  elif head -n 1 "$tab" | grep -qw error; then
    fail "trace-torch/replay: a replay failed:"
    tee -a "$MAIN_LOG" <"$tab"
  else
    pass "trace-torch/replay (rows for cudaMalloc, cudaMallocAsync, vmmshim)"
  fi
  say "vmmshim-replay of the PyTorch trace ($tab; $(cat "$tab.stderr" | head -n 1)):"
  tee -a "$MAIN_LOG" <"$tab"
}

# ---- PyTorch with call stacks (the run tt_torch wrote the script for) ----
tt_torch_stacks() {
  script="$LOGDIR/trace_torch_train.py"
  [ -f "$script" ] || return
  left=$(tt_left)
  if [ "$left" -le 20 ]; then
    fail "trace-torch-stacks: not run, the time budget of $TEST_BUDGET s is spent"
    return
  fi
  [ "$left" -gt 150 ] && left=150
  rm -f "$LOGDIR"/torchstk.*.trace
  out="$LOGDIR/trace-torch-stacks.log"
  err="$LOGDIR/trace-torch-stacks.stderr"
  timeout "$left" env -u LD_PRELOAD -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY -u PYTORCH_CUDA_ALLOC_CONF \
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_STATS=1 VMMSHIM_TRACE_STACKS=16 VMMSHIM_LOG=info VMMSHIM_LIB="$LIB" \
    TT_ROOT="$PWD" scripts/vmmshim --trace "$LOGDIR/torchstk.%p.trace" -q -- "$PYTHON" "$script" >"$out" 2>"$err"
  rc=$?
  pid=$(sed -n 's/^PID //p' "$out" | head -n 1)
  trace="$LOGDIR/torchstk.$pid.trace"
  if [ "$rc" != 0 ] || [ -z "$pid" ] || [ ! -s "$trace" ]; then
    fail "trace-torch-stacks/run: exit $rc, trace $trace"
    tail -n 8 "$out" "$err" | tee -a "$MAIN_LOG"
    return
  fi
  say "INFO trace-torch-stacks: $(grep -m1 'trace: stacks of' "$err" | sed 's/^vmmshim: //'); $(grep -c '^k ' "$trace") distinct stacks, $(grep -c '^l ' "$trace") modules, $(wc -c <"$trace") bytes"
  pass "trace-torch-stacks/run"
  rep="$LOGDIR/trace-torch-stacks-report.txt"
  html="$LOGDIR/torch-stacks-report.html"
  if ! "$PYTHON" scripts/vmmshim-report --by-site --top 10 --html "$html" "$trace" >"$rep" 2>&1; then
    fail "trace-torch-stacks/report: vmmshim-report failed:"
    tail -n 8 "$rep" | tee -a "$MAIN_LOG"
    return
  fi
  # The top sites by bytes allocated: Python lines of the script or of the model's file.
  top=$(sed -n '/^by bytes allocated/,/^$/p' "$rep" | sed -n '3,5p')
  if echo "$top" | grep -Eq '(trace_torch_train|tfm)\.py:[0-9]+'; then
    pass "trace-torch-stacks/sites (the top sites are lines of the program's Python files)"
  else
    fail "trace-torch-stacks/sites: no line of trace_torch_train.py or tfm.py among the top sites:"
    echo "$top" | tee -a "$MAIN_LOG"
  fi
  n_sites=$(sed -n '/^by allocations/,/^$/p' "$rep" | awk 'NR > 2 && $1 ~ /^[0-9]+$/ { n += $1 } END { print n + 0 }')
  n_st=$(tt_stats_allocs "$err")
  if [ -n "$n_st" ] && [ "$n_st" -gt 0 ] && grep -q "in $n_st of $n_st allocations" "$rep"; then
    pass "trace-torch-stacks/count (all $n_st allocations have a stack; the top sites hold $n_sites)"
  else
    fail "trace-torch-stacks/count: the shim served $n_st; $(grep -m1 'distinct stacks in' "$rep")"
  fi
  if grep -q 'icicle' "$html" 2>/dev/null; then pass "trace-torch-stacks/html"; else fail "trace-torch-stacks/html: no icicle graph in $html"; fi
  say "vmmshim-report --by-site of the PyTorch trace ($rep):"
  sed -n '/^call sites/,/^by allocations/p' "$rep" | tee -a "$MAIN_LOG"
}

# ---- a static-runtime program, native and rmm format ----
tt_static() {
  prog="$BIN/t_errors.static"
  if [ ! -x "$prog" ]; then
    fail "trace-static: $prog not built"
    return
  fi
  for fmt in native rmm; do
    name=trace-static
    [ "$fmt" = rmm ] && name=trace-rmm
    rm -f "$LOGDIR"/static-"$fmt".*.trace
    timeout 60 env -u LD_PRELOAD -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY VMMSHIM_STATS=1 VMMSHIM_LIB="$LIB" \
      scripts/vmmshim --trace "$LOGDIR/static-$fmt.%p.trace" --trace-format "$fmt" -q -- "$prog" \
      >"$LOGDIR/$name.log" 2>"$LOGDIR/$name.stderr"
    rc=$?
    set -- "$LOGDIR"/static-"$fmt".*.trace
    if [ "$rc" != 0 ] || [ "$#" != 1 ] || [ ! -s "$1" ]; then
      fail "$name/run: exit $rc, trace files: $*"
      tail -n 4 "$LOGDIR/$name.log" "$LOGDIR/$name.stderr" | tee -a "$MAIN_LOG"
      continue
    fi
    tt_count_check "$name" "$1" "$LOGDIR/$name.stderr" || continue
    if [ "$fmt" = rmm ]; then
      if grep -q '^format: rmm' "$LOGDIR/$name-report.txt"; then pass "$name/format"; else fail "$name/format: the report did not read it as rmm"; fi
    else
      # A static runtime's cudaMalloc reaches the shim as cuMemAlloc (api driver).
      say "INFO $name: by API: $(sed -n '/by API/,/by size class/p' "$LOGDIR/$name-report.txt" | sed -n '2,5p' | tr -s ' ' | tr '\n' ';')"
    fi
  done
}

tt_torch
tt_torch_stacks
tt_static
