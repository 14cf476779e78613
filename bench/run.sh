#!/bin/sh
# Benchmarks of vmmshim (make bench). Needs an NVIDIA GPU, nvcc and build/libvmmshim.so;
# PyTorch for sections 3b and 4 (skipped without it). About 6-8 minutes on an H100.
#
#   1 pairs     alloc+free latency and 8-thread throughput: cudaMalloc, cudaMallocAsync pool
#               (both without the shim), the shim sync, deferred and async paths  (bench/pairs.cu)
#   2 growth    first-time allocation of 1/8/64 GiB in 2M/64M/1G requests, fresh process each:
#               cudaMalloc vs the shim at granularity 2M/64M/512M/2G                 (bench/growth.cu)
#   3 frag      bench/traces/synthetic.csv replayed (bench/replay.cu), the irregular churn and
#               varlen workloads with kernels (bench/churn.cu, bench/workloads.h), and PyTorch with
#               a varying sequence length (bench/torch_frag.py)
#   4 step      PyTorch training step: caching allocator, no caching, no caching under the shim
#               (sync, deferred)                                                  (bench/torch_step.py)
#     serve     PyTorch decoder generating for batches of random prompt lengths, its KV cache grown
#               by torch.cat: caching allocator, expandable segments, the cudaMallocAsync backend,
#               each without and under the shim, and no caching under the shim (sync, deferred)
#               (bench/torch_serve.py; BENCH_SERVE_ARGS: its options, e.g. "--batches 64")
#   5 overhead  a ~2 s memory-bound kernel on memory allocated once               (bench/overhead.cu)
#   6 sleep     sleep and wake of an 8 GiB tag in each mode, with and without host memory made
#               ahead; a kernel's bandwidth on memory asleep in mapped mode        (bench/sleep.cu)
#     tms       pause/resume of 8 GiB through vmmshim.torch_memory_saver in each mode (no backup,
#               CPU backup, disk backup), and the disk mode against dd's direct I/O in the same
#               directory (BENCH_DISK_DIR, else $TMPDIR, else /tmp)              (bench/tms_bench.py)
#   7 group     a group's budget: the cost of a growth (admission and return) with 1, 4 and 16
#               members against processes alone, the allocation speed beside it, and a kernel's
#               bandwidth on memory past the limit (VMMSHIM_ON_LIMIT=host), promote (bench/group.cu);
#               a whole group's sleep and wake, and a balloon's admission (bench/group_sleep.py)
#
# Each program prints "R <section> key=value ..." lines; bench/report.py turns all of them into
# one table, printed at the end and written to bench/results/<gpu>-<driver>.md (with growth.svg),
# every figure also to bench/results/<gpu>-<driver>.json with its rounds. The regression guard at
# the top of the report compares them with the committed <gpu>-<driver>.json (for BENCH_TAG=NAME,
# <gpu>-<driver>-NAME.json when there is one): each of the shim's figures that moved the wrong way
# beyond its rounds' spread (else a default tolerance per kind of figure), with both values.
# Raw logs go to $OUT when it is set (the results file and plot are copied there too), else to
# bench/out. Every step runs under a timeout; a failed step prints FAILED and the rest go on.
# BENCH_ONLY="PREFIX ...": only the steps whose names start with one of the prefixes run (say
# "pairs-stk churn-"), and the table goes to bench/results/<gpu>-<driver>-partial.md.
# BENCH_SPREAD=1 (make bench-spread): the irregular workloads again at several seeds
# (BENCH_SPREAD_SEEDS, default "1 2 3 4 5"), with default handles and VMMSHIM_MAX_HANDLE=64M and
# 32M (BENCH_SPREAD_HANDLES, default "default 64M 32M"; "default" is no VMMSHIM_MAX_HANDLE):
# how much held / live moves from one workload seed to the next. Not part of a plain run (about
# 3 minutes more). BENCH_TAG=NAME: the table goes to bench/results/<gpu>-<driver>-NAME.md.
BUILD=${BUILD:-build}
NVCC=${NVCC:-nvcc}
PYTHON=${PYTHON:-python3}
LIB="$PWD/$BUILD/libvmmshim.so"
BIN="$BUILD/bench"
if [ -n "$OUT" ]; then LOGDIR="$OUT"; else LOGDIR="bench/out"; fi
mkdir -p "$LOGDIR" "$BIN" bench/results || exit 1
for f in bench pairs growth frag churn tfrag step serve overhead sleep group tms gsleep; do rm -f "$LOGDIR/$f.log"; done
rm -f "$LOGDIR/machine.txt" "$LOGDIR/growth.csv" "$LOGDIR/growth.svg" "$LOGDIR/baseline.json"
MAIN_LOG="$LOGDIR/bench.log"
T_START=$(date +%s)
BENCH_BUDGET=${BENCH_BUDGET:-560} # seconds for all steps; what is left after it is reported FAILED
nfailed=0

say() { echo "$*" | tee -a "$MAIN_LOG"; }
die() {
  say "bench: error: $*"
  exit 1
}

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU (nvidia-smi missing or finds no device)"
NVCC_PATH=$(command -v "$NVCC" 2>/dev/null) || NVCC_PATH=
[ -n "$NVCC_PATH" ] || die "nvcc not found (NVCC=$NVCC)"
[ -f "$LIB" ] || die "$LIB missing: run make first"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (needed for the trace and the report)"

GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
CUDA_DRV=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
NVCC_VER=$("$NVCC_PATH" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
STEM=$(echo "$GPU-$DRIVER" | tr ' /' '--')
TAG=${BENCH_TAG:-${BENCH_ONLY:+partial}}
RESULT="bench/results/$STEM${TAG:+-$TAG}.md"
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
case "$CAP" in [0-9][0-9] | [0-9][0-9][0-9]) ARCH="sm_$CAP" ;; *) ARCH=sm_90 ;; esac
TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__ + (" cuda " + str(torch.version.cuda) if torch.cuda.is_available() else " NO-GPU"))' 2>/dev/null)
{
  echo "gpu=$GPU"
  echo "driver=$DRIVER"
  echo "cuda=$CUDA_DRV / nvcc $NVCC_VER"
  echo "cpu=$(sed -n 's/^model name[^:]*: *//p' /proc/cpuinfo | head -n 1) ($(nproc) CPUs)"
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  # BENCH_COMMIT names the commit when the tree was copied here without its history.
  if [ -n "$BENCH_COMMIT" ]; then
    echo "shim=$BENCH_COMMIT"
  elif rev=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- src include 2>/dev/null || rev="$rev (+ uncommitted changes in src/ or include/)"
    echo "shim=$rev"
  fi
  echo "torch=${TORCH:-not installed}"
  [ -n "$BENCH_ONLY" ] && echo "only=$BENCH_ONLY"
} >"$LOGDIR/machine.txt"
say "bench: $GPU, driver $DRIVER, CUDA $CUDA_DRV, nvcc $NVCC_VER, torch ${TORCH:-none}; logs in $LOGDIR"
nvidia-smi >"$LOGDIR/nvidia-smi.txt" 2>&1

# ---- build ----
for p in pairs growth replay overhead churn sleep group gsleep; do
  rm -f "$BIN/$p"
  "$NVCC_PATH" -O2 -arch="$ARCH" -std=c++17 -Iinclude -Ibench -o "$BIN/$p" "bench/$p.cu" -ldl -lpthread \
    >"$LOGDIR/build-$p.txt" 2>&1 &
done
wait
for p in pairs growth replay overhead churn sleep group gsleep; do
  [ -x "$BIN/$p" ] || { say "bench: build of bench/$p.cu failed:"; head -n 20 "$LOGDIR/build-$p.txt" | tee -a "$MAIN_LOG"; }
done

# step NAME LOG TIMEOUT [ENV=VALUE ...] -- COMMAND...: runs COMMAND with the given environment
# (and without any inherited LD_PRELOAD or PyTorch allocator setting), appends its output to
# $LOGDIR/LOG.log; on failure prints FAILED and records "R failed" for the report.
step() {
  name=$1
  log="$LOGDIR/$2.log"
  limit=$3
  shift 3
  envs=""
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    envs="$envs $1"
    shift
  done
  shift
  if [ -n "$BENCH_ONLY" ]; then
    want=0
    for pre in $BENCH_ONLY; do case $name in "$pre"*) want=1 ;; esac; done
    [ "$want" = 1 ] || return 0
  fi
  echo "## $name: $envs $*" >>"$log"
  left=$((BENCH_BUDGET - ($(date +%s) - T_START)))
  if [ "$left" -le 5 ]; then
    nfailed=$((nfailed + 1))
    last_rc=125
    say "FAILED $name (not run: the run's time budget of $BENCH_BUDGET s is spent)"
    echo "R failed step=$name rc=budget" >>"$log"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  # shellcheck disable=SC2086 # envs are words without spaces
  timeout "$limit" env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING -u PYTORCH_CUDA_ALLOC_CONF \
    -u VMMSHIM_FREE_MODE -u VMMSHIM_GRANULARITY $envs "$@" >>"$log" 2>&1
  rc=$?
  last_rc=$rc
  if [ "$rc" != 0 ]; then
    nfailed=$((nfailed + 1))
    if [ "$rc" = 124 ]; then why="timed out after $limit s"; else why="exit $rc"; fi
    say "FAILED $name ($why); see $log"
    tail -n 4 "$log" | sed 's/^/    /' | tee -a "$MAIN_LOG"
    echo "R failed step=$name rc=$rc" >>"$log"
  fi
  return 0
}
SHIM="LD_PRELOAD=$LIB"
section() { say "bench: $1 (at $(($(date +%s) - T_START)) s)"; }

# ---- 1. pairs ----
section "1/7 alloc+free pairs"
SIZES="256 4K 64K 1M 16M 256M 1G"
step pairs-cudaMalloc pairs 120 -- "$BIN/pairs" malloc cudaMalloc 1,8 $SIZES
step pairs-pool pairs 120 -- "$BIN/pairs" async pool 1,8 $SIZES
step pairs-shim-sync pairs 120 "$SHIM" VMMSHIM_FREE_MODE=sync -- "$BIN/pairs" malloc shim-sync 1,8 $SIZES
step pairs-shim-deferred pairs 120 "$SHIM" VMMSHIM_FREE_MODE=deferred -- "$BIN/pairs" malloc shim-deferred 1,8 $SIZES
step pairs-shim-async pairs 120 "$SHIM" -- "$BIN/pairs" async shim-async 1,8 $SIZES
# Where the time of a pair goes: the clock alone, and the shim reached through the driver API
# (no runtime in between), in both non-waiting modes.
step pairs-floor pairs 60 -- "$BIN/pairs" floor floor 1 $SIZES
step pairs-shim-drv-deferred pairs 120 "$SHIM" VMMSHIM_FREE_MODE=deferred -- "$BIN/pairs" drv shim-drv-deferred 1,8 $SIZES
step pairs-shim-drv-async pairs 120 "$SHIM" -- "$BIN/pairs" drvasync shim-drv-async 1,8 $SIZES
# Cost of tracing (VMMSHIM_TRACE): the same pairs, one thread, with every event written to a
# trace file, in seven rounds that alternate untraced and traced processes. Measured on the
# H100 machine: the median pair of one process differs from the next by up to ~200 ns,
# mostly with the address-space layout; pinned to one CPU with randomisation off, by ~10 ns.
# So these runs are pinned and unrandomised where taskset and setarch exist.
STEADY=""
if command -v taskset >/dev/null 2>&1 && command -v setarch >/dev/null 2>&1 &&
   taskset -c 2 setarch "$(uname -m)" -R true 2>/dev/null; then
  STEADY="taskset -c 2 setarch $(uname -m) -R"
fi
echo "trace_cost_runs=${STEADY:-unpinned, randomised}" >>"$LOGDIR/machine.txt"
TSIZES="256 64K 16M 1G"
for r in 1 2 3 4 5 6 7; do
  step "pairs-trace-base-deferred-$r" pairs 60 "$SHIM" VMMSHIM_FREE_MODE=deferred -- $STEADY "$BIN/pairs" malloc "trbase-deferred-$r" 1 $TSIZES
  step "pairs-trace-on-deferred-$r" pairs 60 "$SHIM" VMMSHIM_FREE_MODE=deferred "VMMSHIM_TRACE=$LOGDIR/pairs-trace.%p" -- $STEADY "$BIN/pairs" malloc "trace-deferred-$r" 1 $TSIZES
  step "pairs-trace-base-async-$r" pairs 60 "$SHIM" -- $STEADY "$BIN/pairs" async "trbase-async-$r" 1 $TSIZES
  step "pairs-trace-on-async-$r" pairs 60 "$SHIM" "VMMSHIM_TRACE=$LOGDIR/pairs-trace.%p" -- $STEADY "$BIN/pairs" async "trace-async-$r" 1 $TSIZES
  rm -f "$LOGDIR"/pairs-trace.*
done
# The cost of a traced allocation's call stack (VMMSHIM_TRACE_STACKS=16), per unwinder: traced
# async pairs of 4 KiB run 20 calls down, without stacks and with them (one stack per pair).
# Without libunwind.so.8 the shim falls back to libgcc's unwinder: that row is left out then.
if "$PYTHON" -c 'import ctypes; ctypes.CDLL("libunwind.so.8")' 2>/dev/null; then
  STK_CFGS="stk-off|stk-libunwind libunwind|stk-dwarf dwarf|stk-fp fp"
else
  STK_CFGS="stk-off|stk-dwarf dwarf|stk-fp fp"
  say "bench: libunwind.so.8 cannot be loaded here: the stack cost has no libunwind row"
  echo "R note what=no-libunwind" >>"$LOGDIR/pairs.log"
fi
IFS_SAVED=$IFS
IFS='|'
set -- $STK_CFGS
IFS=$IFS_SAVED
for cfg in "$@"; do
  set -- $cfg
  if [ -n "$2" ]; then
    step "pairs-$1" pairs 60 "$SHIM" PAIRS_DEPTH=20 "VMMSHIM_TRACE=$LOGDIR/pairs-trace.%p" VMMSHIM_TRACE_STACKS=16 \
      VMMSHIM_TRACE_UNWIND=$2 -- $STEADY "$BIN/pairs" async "$1" 1 4K
  else
    step "pairs-$1" pairs 60 "$SHIM" PAIRS_DEPTH=20 "VMMSHIM_TRACE=$LOGDIR/pairs-trace.%p" -- $STEADY "$BIN/pairs" async "$1" 1 4K
  fi
done
rm -f "$LOGDIR"/pairs-trace.*
step pairs-trace-base8-async pairs 60 "$SHIM" -- "$BIN/pairs" async trbase8-async 8 4K 1M
step pairs-trace-on8-async pairs 60 "$SHIM" "VMMSHIM_TRACE=$LOGDIR/pairs-trace.%p" -- "$BIN/pairs" async trace8-async 8 4K 1M
rm -f "$LOGDIR"/pairs-trace.*
# The cost of tag rules (VMMSHIM_TAG_RULES, docs/tag-rules.md), one thread: async pairs of 4 KiB
# 20 calls down without rules, with rules that need no stack (size, phase; the last matches), a
# lib: and a site: rule (decided once per call site); and from Python (bench/rules_py.py) without
# rules, with a py: rule that matches nothing and one that matches every pair.
for cfg in "rules-none|" "rules-size-phase|a=size:>=1T;b=phase:before-launch;c=size:<1G" \
           "rules-lib|a=lib:libnccl*;c=lib:*pairs*" "rules-site|a=site:nccl*;c=site:__libc_start*"; do
  label=${cfg%%|*}
  spec=${cfg#*|}
  step "pairs-$label" pairs 60 "$SHIM" PAIRS_DEPTH=20 ${spec:+"VMMSHIM_TAG_RULES=$spec"} -- $STEADY "$BIN/pairs" async "$label" 1 4K
done
for cfg in "rules-py-none|" "rules-py-miss|a=py:*/nothing.py" "rules-py|c=py:*/rules_py.py"; do
  label=${cfg%%|*}
  spec=${cfg#*|}
  step "pairs-$label" pairs 60 "$SHIM" ${spec:+"VMMSHIM_TAG_RULES=$spec"} -- $STEADY "$PYTHON" bench/rules_py.py "$label"
done

# ---- 2. growth ----
section "2/7 first-time growth"
for total in 1G 8G 64G; do
  for req in 2M 64M 1G; do
    step "growth-cudaMalloc-$total-$req" growth 60 -- "$BIN/growth" cudaMalloc "$total" "$req"
    for g in 2M 64M 512M 2G; do
      step "growth-shim-$g-$total-$req" growth 60 "$SHIM" "VMMSHIM_GRANULARITY=$g" -- "$BIN/growth" "shim-$g" "$total" "$req"
    done
    step "growth-shim-64M-max16M-$total-$req" growth 60 "$SHIM" VMMSHIM_MAX_HANDLE=16M -- "$BIN/growth" "shim-64M-max16M" "$total" "$req"
  done
done

# ---- 3. fragmentation ----
section "3/7 fragmentation"
TRACE=bench/traces/synthetic.csv
[ -f "$TRACE" ] || "$PYTHON" bench/gen_trace.py -o "$TRACE" | tee -a "$MAIN_LOG"
step frag-cudaMalloc frag 120 -- "$BIN/replay" "$TRACE" malloc cudaMalloc
step frag-pool frag 120 -- "$BIN/replay" "$TRACE" async pool
step frag-shim-sync frag 120 "$SHIM" VMMSHIM_FREE_MODE=sync -- "$BIN/replay" "$TRACE" malloc shim-sync
step frag-shim-sync-max64M frag 120 "$SHIM" VMMSHIM_FREE_MODE=sync VMMSHIM_MAX_HANDLE=64M -- "$BIN/replay" "$TRACE" malloc shim-sync-max64M
step frag-shim-sync-max16M frag 120 "$SHIM" VMMSHIM_FREE_MODE=sync VMMSHIM_MAX_HANDLE=16M -- "$BIN/replay" "$TRACE" malloc shim-sync-max16M
step frag-shim-deferred frag 120 "$SHIM" VMMSHIM_FREE_MODE=deferred -- "$BIN/replay" "$TRACE" malloc shim-deferred
step frag-shim-async frag 120 "$SHIM" -- "$BIN/replay" "$TRACE" async shim-async

# Irregular sizes with kernels (bench/churn.cu): cudaMalloc and the cudaMallocAsync pool without
# the shim, then the shim's three modes; churn (20000 steps) and varlen (100 steps).
for w in churn varlen; do
  step "churn-$w-cudaMalloc" churn 180 -- "$BIN/churn" "$w" malloc cudaMalloc
  step "churn-$w-pool" churn 120 -- "$BIN/churn" "$w" async pool
  step "churn-$w-shim-sync" churn 120 "$SHIM" VMMSHIM_FREE_MODE=sync -- "$BIN/churn" "$w" malloc shim-sync
  step "churn-$w-shim-deferred" churn 120 "$SHIM" VMMSHIM_FREE_MODE=deferred -- "$BIN/churn" "$w" malloc shim-deferred
  step "churn-$w-shim-async" churn 120 "$SHIM" -- "$BIN/churn" "$w" async shim-async
  # The stitch (VMMSHIM_STITCH=1, docs/design.md "Stitching"): the rows above are the stitch off.
  step "churn-$w-shim-sync-stitch" churn 120 "$SHIM" VMMSHIM_FREE_MODE=sync VMMSHIM_STITCH=1 -- \
    "$BIN/churn" "$w" malloc shim-sync-stitch
  step "churn-$w-shim-async-stitch" churn 120 "$SHIM" VMMSHIM_STITCH=1 -- "$BIN/churn" "$w" async shim-async-stitch
  step "churn-$w-shim-sync-stitch-max32M" churn 120 "$SHIM" VMMSHIM_FREE_MODE=sync VMMSHIM_STITCH=1 \
    VMMSHIM_MAX_HANDLE=32M -- "$BIN/churn" "$w" malloc shim-sync-stitch-max32M
  # 16 MiB handles with the stitch: held / live 1.04 on the host emulation, at 44 calls per 100.
  step "churn-$w-shim-async-stitch-max16M" churn 120 "$SHIM" VMMSHIM_STITCH=1 VMMSHIM_MAX_HANDLE=16M -- \
    "$BIN/churn" "$w" async shim-async-stitch-max16M
  # Bounded handles with an 8 MiB growth step, no stitch (docs/design.md "Stitching"): on the host
  # emulation, held / live 1.06 at about 4 us of driver time per step (32 MiB handles) and 1.04
  # at about 8.5 us (16 MiB), seeds 1-10.
  step "churn-$w-shim-async-g8M-max32M" churn 120 "$SHIM" VMMSHIM_GRANULARITY=8M VMMSHIM_MAX_HANDLE=32M -- \
    "$BIN/churn" "$w" async shim-async-g8M-max32M
  step "churn-$w-shim-async-g8M-max16M" churn 120 "$SHIM" VMMSHIM_GRANULARITY=8M VMMSHIM_MAX_HANDLE=16M -- \
    "$BIN/churn" "$w" async shim-async-g8M-max16M
done

# The spread over workload seeds (BENCH_SPREAD=1): each program is deterministic for its seed,
# and held / live at peak moves by up to 0.2 from one seed to the next (the README's "The pool").
# spread_step NAME LABEL MODE [ENV=VALUE ...]: workload $w at seed $seed (trace $strace).
spread_step() {
  sp_name=$1 sp_label=$2 sp_mode=$3
  shift 3
  case $w in
  replay) step "$sp_name" frag 120 "$@" -- "$BIN/replay" "$strace" "$sp_mode" "$sp_label" ;;
  churn) step "$sp_name" churn 120 "$@" -- "$BIN/churn" churn "$sp_mode" "$sp_label" 20000 "$seed" ;;
  varlen) step "$sp_name" churn 120 "$@" -- "$BIN/churn" varlen "$sp_mode" "$sp_label" 100 "$seed" ;;
  esac
}
if [ -n "$BENCH_SPREAD" ]; then
  section "3/7 fragmentation: spread over seeds ${BENCH_SPREAD_SEEDS:-1 2 3 4 5}"
  for seed in ${BENCH_SPREAD_SEEDS:-1 2 3 4 5}; do
    strace="$LOGDIR/synthetic-seed$seed.csv"
    "$PYTHON" bench/gen_trace.py -o "$strace" --seed "$seed" >/dev/null || say "bench: gen_trace.py --seed $seed failed"
    for w in churn varlen replay; do
      spread_step "spread-$w-$seed-pool" spread-pool async
      for mh in ${BENCH_SPREAD_HANDLES:-default 64M 32M}; do
        [ "$mh" = default ] && mh=
        h=${mh:+-max$mh}
        hv=${mh:+VMMSHIM_MAX_HANDLE=$mh}
        # shellcheck disable=SC2086 # hv is one word or none
        spread_step "spread-$w-$seed-sync$h" "spread-shim-sync$h" malloc "$SHIM" VMMSHIM_FREE_MODE=sync $hv
        # shellcheck disable=SC2086
        spread_step "spread-$w-$seed-deferred$h" "spread-shim-deferred$h" malloc "$SHIM" VMMSHIM_FREE_MODE=deferred $hv
        # shellcheck disable=SC2086
        spread_step "spread-$w-$seed-async$h" "spread-shim-async$h" async "$SHIM" $hv
      done
    done
    rm -f "$strace"
  done
fi

have_torch=0
case "$TORCH" in *cuda*) have_torch=1 ;; esac
if [ "$have_torch" = 1 ]; then
  step tfrag-caching tfrag 180 -- "$PYTHON" bench/torch_frag.py caching
  step tfrag-expandable tfrag 180 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "$PYTHON" bench/torch_frag.py expandable
  step tfrag-shim tfrag 180 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "$PYTHON" bench/torch_frag.py shim
else
  for c in caching expandable shim; do echo "R skip step=tfrag-$c why=no-PyTorch-with-CUDA" >>"$LOGDIR/tfrag.log"; done
  say "SKIP PyTorch fragmentation: no PyTorch with CUDA for $PYTHON"
fi

# ---- 4. real program ----
section "4/7 PyTorch training step and serving"
if [ "$have_torch" = 1 ]; then
  # The caching allocator and the shim's deferred mode are compared in three alternating
  # rounds: one run's median step moves by up to 20% from one process to the next. The
  # regression guard takes their spread as the tolerance of the step's figures.
  step step-nocache step 180 PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "$PYTHON" bench/torch_step.py nocache
  step step-shim-sync step 180 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=sync -- "$PYTHON" bench/torch_step.py shim-sync
  for r in 1 2 3; do
    step "step-caching-$r" step 180 -- "$PYTHON" bench/torch_step.py caching
    step "step-shim-deferred-$r" step 180 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=deferred -- "$PYTHON" bench/torch_step.py shim-deferred
  done
  # The same with the stitch on: no slower than (d) is the guard.
  step step-shim-deferred-stitch step 180 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=deferred \
    VMMSHIM_STITCH=1 -- "$PYTHON" bench/torch_step.py shim-deferred-stitch
else
  for c in caching nocache shim-sync shim-deferred shim-deferred-stitch; do echo "R skip step=step-$c why=no-PyTorch-with-CUDA" >>"$LOGDIR/step.log"; done
  say "SKIP PyTorch training step: no PyTorch with CUDA for $PYTHON"
fi
# The serving shape, about 10 s a configuration on an H100 (0.3 s a batch): PyTorch's three allocator
# settings as they are, then each under the shim (expandable segments map their memory through
# the VMM API themselves: the shim serves only what goes through cudaMalloc), then no caching
# under the shim in both free modes.
SERVE="bench/torch_serve.py"
EXP=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
ASYNC=PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
if [ "$have_torch" = 1 ]; then
  # shellcheck disable=SC2086 # BENCH_SERVE_ARGS: options, one word each
  {
    step serve-caching serve 120 -- "$PYTHON" "$SERVE" caching $BENCH_SERVE_ARGS
    step serve-expandable serve 120 "$EXP" -- "$PYTHON" "$SERVE" expandable $BENCH_SERVE_ARGS
    step serve-async serve 120 "$ASYNC" -- "$PYTHON" "$SERVE" async $BENCH_SERVE_ARGS
    step serve-shim-caching serve 120 "$SHIM" -- "$PYTHON" "$SERVE" shim-caching $BENCH_SERVE_ARGS
    step serve-shim-expandable serve 120 "$SHIM" "$EXP" -- "$PYTHON" "$SERVE" shim-expandable $BENCH_SERVE_ARGS
    step serve-shim-async serve 120 "$SHIM" "$ASYNC" -- "$PYTHON" "$SERVE" shim-async $BENCH_SERVE_ARGS
    step serve-shim-sync serve 120 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=sync -- \
      "$PYTHON" "$SERVE" shim-sync $BENCH_SERVE_ARGS
    step serve-shim-deferred serve 120 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=deferred -- \
      "$PYTHON" "$SERVE" shim-deferred $BENCH_SERVE_ARGS
    step serve-shim-sync-stitch serve 120 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=sync \
      VMMSHIM_STITCH=1 -- "$PYTHON" "$SERVE" shim-sync-stitch $BENCH_SERVE_ARGS
    step serve-shim-deferred-stitch serve 120 "$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=deferred \
      VMMSHIM_STITCH=1 -- "$PYTHON" "$SERVE" shim-deferred-stitch $BENCH_SERVE_ARGS
  }
else
  for c in caching expandable async shim-caching shim-expandable shim-async shim-sync shim-deferred \
    shim-sync-stitch shim-deferred-stitch; do
    echo "R skip step=serve-$c why=no-PyTorch-with-CUDA" >>"$LOGDIR/serve.log"
  done
  say "SKIP PyTorch serving: no PyTorch with CUDA for $PYTHON"
fi

# ---- 5. overhead ----
section "5/7 steady-state overhead"
for i in 1 2 3; do
  for cfg in cudaMalloc shim; do
    t0=$(date +%s%N)
    if [ "$cfg" = shim ]; then
      step "overhead-$cfg-$i" overhead 60 "$SHIM" -- "$BIN/overhead" "$cfg"
    else
      step "overhead-$cfg-$i" overhead 60 -- "$BIN/overhead" "$cfg"
    fi
    t1=$(date +%s%N)
    [ "$last_rc" = 0 ] && echo "R overhead_wall cfg=$cfg run=$i ms=$(((t1 - t0) / 1000000))" >>"$LOGDIR/overhead.log"
  done
done

# ---- 6. sleep and wake ----
section "6/7 sleep and wake of an 8 GiB tag"
step sleep-cold sleep 120 "$SHIM" -- "$BIN/sleep" cold 8
step sleep-reserved sleep 120 "$SHIM" VMMSHIM_HOST_RESERVE=8G -- "$BIN/sleep" reserved 8
if [ "$have_torch" = 1 ]; then
  step tms tms 90 "$SHIM" "PYTHONPATH=$PWD/scripts/python" -- "$PYTHON" bench/tms_bench.py
else
  echo "R tms skip=all why=no-PyTorch-with-CUDA" >>"$LOGDIR/tms.log"
  say "SKIP torch_memory_saver pause/resume: no PyTorch with CUDA for $PYTHON"
fi

# ---- 7. a group's budget ----
section "7/7 a group's budget: admission with 1, 4 and 16 members; memory past the limit"
for n in 1 4 16; do
  step "group-alone-$n" group 90 "$SHIM" -- "$BIN/group" admit alone "$n" 200
  step "group-group-$n" group 90 "$SHIM" -- "$BIN/group" admit group "$n" 200
done
step group-spill group 90 "$SHIM" VMMSHIM_LIMIT_GROUP="bench-spill-$$" VMMSHIM_LIMIT=1G VMMSHIM_ON_LIMIT=host -- \
  "$BIN/group" spill
# A whole group's sleep and wake (1, 2, 4 members of 8 GiB on GPU 0) against the slowest member's own
# move, and a balloon's admission of an 8 GiB growth (bench/group_sleep.py, bench/gsleep.cu).
step group-sleep gsleep 150 -- "$PYTHON" bench/group_sleep.py "$BIN/gsleep" "$LIB"

# ---- report ----
echo "runtime=$(($(date +%s) - T_START)) s" >>"$LOGDIR/machine.txt"
section "report"
# The regression guard's baseline: the results committed for this GPU and driver (a tagged run's
# own when there are some, else the full run's), as committed at HEAD; in a tree copied without
# its history, the file as it is. Taken before this run's figures replace the file.
BASE_JSON="bench/results/$STEM.json"
if [ -n "$BENCH_TAG" ] && { git cat-file -e "HEAD:bench/results/$STEM-$BENCH_TAG.json" 2>/dev/null ||
  [ -f "bench/results/$STEM-$BENCH_TAG.json" ]; }; then
  BASE_JSON="bench/results/$STEM-$BENCH_TAG.json"
fi
if git cat-file -e "HEAD:$BASE_JSON" 2>/dev/null; then
  git show "HEAD:$BASE_JSON" >"$LOGDIR/baseline.json" 2>/dev/null
  BASE_NAME="$BASE_JSON (as committed)"
elif [ -f "$BASE_JSON" ]; then
  cp "$BASE_JSON" "$LOGDIR/baseline.json"
  BASE_NAME="$BASE_JSON"
else
  BASE_NAME="$BASE_JSON"
fi
"$PYTHON" bench/report.py --logs "$LOGDIR" --out "$RESULT" --baseline "$LOGDIR/baseline.json" \
  --baseline-name "$BASE_NAME" >"$LOGDIR/report.txt" 2>&1
rrc=$?
cat "$LOGDIR/report.txt" | tee -a "$MAIN_LOG"
[ "$rrc" = 0 ] || say "bench: report.py exit $rrc (a loss or token mismatch, or an error above)"
RESULT_JSON="${RESULT%.md}.json"
if [ -n "$OUT" ]; then
  cp "$RESULT" "$RESULT_JSON" "$OUT/" 2>/dev/null
  cp "bench/results/$STEM-growth.svg" "$OUT/" 2>/dev/null
fi
grep -m 1 '^Regression guard:' "$LOGDIR/report.txt" | tee -a "$MAIN_LOG"
say "bench: results in $RESULT and $RESULT_JSON; raw logs in $LOGDIR; $nfailed step(s) failed; $(($(date +%s) - T_START)) s in all"
[ "$nfailed" = 0 ] && [ "$rrc" = 0 ]
