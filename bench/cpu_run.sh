#!/bin/sh
# make bench-cpu: the shim's own cost per pair on the host emulation (bench/cpu_pairs.c),
# no GPU needed. A proxy for the pair rows of `make bench`, for before/after comparisons of
# changes to the hot path on any machine; it says nothing about driver costs.
BUILD=${BUILD:-build}
LIB="$PWD/$BUILD/libvmmshim.so"
EMU="$PWD/$BUILD/emu"
BIN="$BUILD/bench/cpu_pairs"
SIZES="256 65536 16777216 1073741824"
PIN=
command -v taskset >/dev/null 2>&1 && PIN="taskset -c 0"
run() { # label, env..., then the mode
  label=$1; shift
  env LD_LIBRARY_PATH="$EMU" LD_PRELOAD="$LIB" "$@" | sed -e "s/^R cpu-pairs /R cpu-pairs cfg=$label /" -e "s/^R cpu-frag /R cpu-frag cfg=$label /"
}
echo "bench-cpu: $(sed -n 's/^model name[^:]*: *//p' /proc/cpuinfo | head -n 1), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
run async $PIN "$BIN" async $SIZES
run deferred VMMSHIM_FREE_MODE=deferred $PIN "$BIN" malloc $SIZES

# The cost of a traced allocation's stack (VMMSHIM_TRACE_STACKS=16), per unwinder: async pairs
# 20 calls deep, traced without and with stacks (one stack per pair: its allocation). The
# trace goes to a file in /tmp (deleted): formatting and write(2) are in both.
T=$(mktemp /tmp/vmmshim-bench-XXXXXX)
for cfg in "traced" "stacks-libunwind libunwind" "stacks-dwarf dwarf" "stacks-fp fp"; do
  set -- $cfg
  label=$1
  if [ -n "$2" ]; then
    run "$label" CPU_PAIRS_DEPTH=20 VMMSHIM_TRACE="$T" VMMSHIM_TRACE_STACKS=16 VMMSHIM_TRACE_UNWIND=$2 $PIN "$BIN" async 4096
  else
    run "$label" CPU_PAIRS_DEPTH=20 VMMSHIM_TRACE="$T" $PIN "$BIN" async 4096
  fi
done
rm -f "$T"

# Tag rules (docs/tag-rules.md): async pairs of 4 KiB, 20 calls deep, without rules; with rules
# that need no stack (size, phase: the last one matches); with a lib: and a site: rule (decided
# once per call site, then found in the thread's cache); and, from Python (bench/rules_py.py),
# without rules, with a py: rule that matches nothing and with one that matches every pair.
RULES_CFGS="rules-size-phase|a=size:>=1T;b=phase:after-launch;c=size:<1G
rules-lib|a=lib:libnccl*;c=lib:*cpu_pairs*
rules-site|a=site:nccl*;c=site:__libc_start*"
run rules-none CPU_PAIRS_DEPTH=20 $PIN "$BIN" async 4096
echo "$RULES_CFGS" | while IFS='|' read -r label spec; do
  run "$label" CPU_PAIRS_DEPTH=20 "VMMSHIM_TAG_RULES=$spec" $PIN "$BIN" async 4096
done
PYTHON=${PYTHON:-python3}
for cfg in "rules-py-none|" "rules-py-miss|a=py:*/nothing.py" "rules-py|c=py:*/rules_py.py"; do
  label=${cfg%%|*}
  spec=${cfg#*|}
  if [ -n "$spec" ]; then
    run "$label" "VMMSHIM_TAG_RULES=$spec" $PIN "$PYTHON" bench/rules_py.py "$label"
  else
    run "$label" $PIN "$PYTHON" bench/rules_py.py "$label"
  fi
done

# Irregular workloads (bench/cpu_frag.c): memory held at peak over live at peak, and VMM calls per
# 100 allocations after the warm-up (live first at 90% of its peak). The deferred runs busy-wait
# 10 us between events, as a GPU program's kernels would, so that the background reclaimer runs
# as often as it would there.
FRAG="$BUILD/bench/cpu_frag"
for w in churn varlen bench/traces/synthetic.csv; do
  seeds=1
  [ "$w" = churn ] && seeds="1 2 3"
  for seed in $seeds; do
    run "frag-sync-$seed" CPU_FRAG_SEED=$seed "$FRAG" "$w" sync
    run "frag-deferred-$seed" CPU_FRAG_SEED=$seed CPU_FRAG_PAUSE_US=10 VMMSHIM_FREE_MODE=deferred "$FRAG" "$w" sync
    run "frag-async-$seed" CPU_FRAG_SEED=$seed "$FRAG" "$w" async
    # The same with the stitch on (VMMSHIM_STITCH=1, docs/design.md "Stitching").
    run "frag-sync-stitch-$seed" CPU_FRAG_SEED=$seed VMMSHIM_STITCH=1 "$FRAG" "$w" sync
    run "frag-async-stitch-$seed" CPU_FRAG_SEED=$seed VMMSHIM_STITCH=1 "$FRAG" "$w" async
    # What no allocator reaches without driver calls: the least fixed arena in which best fit
    # or first fit (one arena, or the shim's two heaps) serves the same events (bench/frag_floor.c).
    "$BUILD/bench/frag_floor" "$w" "$seed"
  done
done
