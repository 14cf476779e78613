#!/bin/sh
# bench/ab_step.sh LIB_A LIB_B [ROUNDS]: A/B of two builds of the shim on a GPU.
#   - the PyTorch training step (bench/torch_step.py) with the caching allocator, then with
#     PYTORCH_NO_CUDA_MEMORY_CACHING=1 under LIB_A and under LIB_B in deferred mode, in ROUNDS
#     (default 5) alternating rounds: one process's median moves by up to 20% from the next, so
#     only rounds taken side by side compare;
#   - memory held at peak over live at peak (bench/churn.cu varlen, seeds 1-3, deferred mode)
#     under each build.
# Prints the "R ..." lines of every run, then one line per configuration with the median of the
# rounds' step medians and its ratio to the caching allocator's.
A=$1
B=$2
ROUNDS=${3:-5}
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-nvcc}
[ -f "$A" ] && [ -f "$B" ] || { echo "usage: bench/ab_step.sh LIB_A LIB_B [ROUNDS]" >&2; exit 2; }
out=$(mktemp)
step() { # label env...
  label=$1
  shift
  env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING "$@" VMMSHIM_STATS=1 timeout 120 "$PYTHON" bench/torch_step.py "$label" 2>&1 |
    grep -E '^R step|sync|waits|stream order|peak' | tee -a "$out"
}
for r in $(seq 1 "$ROUNDS"); do
  step caching
  step a-deferred LD_PRELOAD="$A" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=deferred
  step b-deferred LD_PRELOAD="$B" PYTORCH_NO_CUDA_MEMORY_CACHING=1 VMMSHIM_FREE_MODE=deferred
done
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
bin=$(mktemp -d)
if "$NVCC" -O2 -arch="sm_${CAP:-90}" -std=c++17 -Iinclude -Ibench -o "$bin/churn" bench/churn.cu -ldl -lpthread; then
  for seed in 1 2 3; do
    for lib in a:"$A" b:"$B"; do
      env LD_PRELOAD="${lib#*:}" VMMSHIM_FREE_MODE=deferred timeout 120 "$bin/churn" varlen malloc "${lib%%:*}-deferred-$seed" 100 "$seed" |
        grep '^R ' | tee -a "$out"
    done
  done
fi
"$PYTHON" - "$out" <<'PY'
import re, statistics, sys
med = {}
held = {}
for line in open(sys.argv[1]):
    m = re.search(r"^R step cfg=(\S+) .*median_ms=([\d.]+)", line)
    if m:
        med.setdefault(m.group(1), []).append(float(m.group(2)))
    m = re.search(r"^R churn .*cfg=([ab])-deferred-\d+ .*peak_live=(\d+) .*shim_peak_mapped=(\d+)", line)
    if m:
        held.setdefault(m.group(1), []).append(int(m.group(3)) / int(m.group(2)))
base = statistics.median(med.get("caching", [0])) or 1
for k, v in med.items():
    print("AB %s: rounds %s -> median %.2f ms, %.3fx caching" % (k, " ".join("%.2f" % x for x in v), statistics.median(v), statistics.median(v) / base))
for k, v in held.items():
    print("AB held/live varlen deferred %s: %s (median %.3f)" % (k, " ".join("%.3f" % x for x in v), statistics.median(v)))
PY
rm -rf "$out" "$bin"
