#!/bin/sh
# make demo: builds examples/demo.cu (a plain CUDA program; nvcc's default static runtime) and
# runs it under the shim with its mapping log and stats on, so you see what vmmshim does:
# every mapping it makes (with its access flags) and, at exit, the counters.
BUILD=${BUILD:-build}
NVCC=${NVCC:-nvcc}
LIB="$PWD/$BUILD/libvmmshim.so"
DEMO="$BUILD/demo"

die() {
  echo "demo: error: $*" >&2
  exit 1
}

NVCC_PATH=$(command -v "$NVCC" 2>/dev/null) || NVCC_PATH=
[ -n "$NVCC_PATH" ] || die "nvcc not found (NVCC=$NVCC). Install the CUDA toolkit or run: make demo NVCC=/usr/local/cuda/bin/nvcc"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this machine has no NVIDIA driver, so no GPU to run on"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || die "no NVIDIA GPU visible (nvidia-smi -L lists none)"
[ -f "$LIB" ] || die "$LIB is missing: run make first"

CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
case "$CAP" in [0-9][0-9] | [0-9][0-9][0-9]) ARCH="sm_$CAP" ;; *) ARCH=sm_90 ;; esac

mkdir -p "$BUILD" || exit 1
echo "demo: building examples/demo.cu with $NVCC_PATH (-arch=$ARCH, static CUDA runtime)"
"$NVCC_PATH" -O2 -arch="$ARCH" -Iinclude -o "$DEMO" examples/demo.cu -ldl || die "nvcc failed"

echo "demo: running LD_PRELOAD=$LIB VMMSHIM_LOG=info VMMSHIM_STATS=1 $DEMO"
echo "----------------------------------------------------------------------"
LD_PRELOAD="$LIB" VMMSHIM_LOG=info VMMSHIM_STATS=1 "$DEMO" "$@"
rc=$?
echo "----------------------------------------------------------------------"
if [ "$rc" != 0 ]; then
  echo "demo: the program failed (exit $rc)" >&2
  exit "$rc"
fi
echo "demo: lines starting 'vmmshim:' came from the shim: each mapping it made, then its stats at exit."
echo "demo: to run your own program under the shim:"
echo "    LD_PRELOAD=$LIB ./your_program [args]"
echo "demo: add VMMSHIM_STATS=1 for the counters, VMMSHIM_LOG=info for every mapping, VMMSHIM_FREE_MODE=deferred"
echo "      for frees that do not wait for the GPU; PyTorch needs PYTORCH_NO_CUDA_MEMORY_CACHING=1 to reach the shim."
