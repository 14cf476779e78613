#!/bin/sh
# make demo: builds examples/demo.cu (a plain CUDA program; nvcc's default static runtime) and
# runs it under the shim with its mapping log and stats on, so you see what vmmshim does:
# every mapping it makes (with its access flags) and, at exit, the counters.
# make demo-emu (DEMO_EMU=1): the same program in C (examples/demo_emu.c, built by make against
# the host emulation of the driver and runtime in $BUILD/emu), run under the launcher with
# LD_LIBRARY_PATH=$BUILD/emu, then a report of its trace: no GPU needed.
BUILD=${BUILD:-build}
NVCC=${NVCC:-nvcc}
PYTHON=${PYTHON:-python3}
case $BUILD in /*) B=$BUILD ;; *) B=$PWD/$BUILD ;; esac
LIB="$B/libvmmshim.so"
DEMO="$BUILD/demo"
NO_GPU="(no GPU here? make demo-emu runs the demo on the host emulation of the driver)"

die() {
  echo "demo: error: $*" >&2
  exit 1
}

if [ "${DEMO_EMU:-0}" = 1 ]; then
  EMU="$B/emu"
  TRACE="$BUILD/demo_emu.trace"
  for f in "$LIB" "$EMU/libcuda.so.1" "$EMU/libcudart.so.13" "$BUILD/demo_emu"; do
    [ -f "$f" ] || die "$f is missing: run make demo-emu"
  done
  rm -f "$TRACE"
  echo "demo: running LD_LIBRARY_PATH=$EMU scripts/vmmshim --stats --log info --stacks 8 -o $TRACE $BUILD/demo_emu"
  echo "----------------------------------------------------------------------"
  LD_LIBRARY_PATH="$EMU${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" VMMSHIM_LIB="$LIB" \
    sh scripts/vmmshim --stats --log info --stacks 8 -o "$TRACE" "$BUILD/demo_emu" "$@"
  rc=$?
  echo "----------------------------------------------------------------------"
  [ "$rc" = 0 ] || die "the program failed (exit $rc)"
  echo "demo: the report of its trace (scripts/vmmshim-report --by-site $TRACE):"
  echo "----------------------------------------------------------------------"
  "$PYTHON" scripts/vmmshim-report --by-site "$TRACE" || die "vmmshim-report failed"
  echo "----------------------------------------------------------------------"
  echo "demo: lines starting 'vmmshim:' came from the shim and the launcher: each mapping the shim made"
  echo "      on the emulated device, its stats at exit, then the report of the trace."
  echo "demo: to run a program of your own on the emulation, build it against $BUILD/emu, then:"
  echo "    cc -I${CUDA_HOME:-/usr/local/cuda}/include -o app app.c -L$BUILD/emu -lcudart"
  echo "    LD_LIBRARY_PATH=$BUILD/emu scripts/vmmshim --stats ./app"
  echo "      (the emulation runs no kernels: host code may read and write the memory it serves)"
  exit 0
fi

NVCC_PATH=$(command -v "$NVCC" 2>/dev/null) || NVCC_PATH=
[ -n "$NVCC_PATH" ] || die "nvcc not found (NVCC=$NVCC). Install the CUDA toolkit or run: make demo NVCC=/usr/local/cuda/bin/nvcc $NO_GPU"
command -v nvidia-smi >/dev/null 2>&1 ||
  die "nvidia-smi not found: this machine has no NVIDIA driver, so no GPU to run on. Without a GPU, run: make demo-emu (the demo on the host emulation of the driver)"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' ||
  die "no NVIDIA GPU visible (nvidia-smi -L lists none). Without a GPU, run: make demo-emu (the demo on the host emulation of the driver)"
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
