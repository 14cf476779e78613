#!/bin/sh
# make demo-emu: the demo without a GPU. It builds the emulated driver and runtime, the C demo
# (examples/demo_emu.c) and runs it under the launcher on the emulation: the program's own
# check passes, the shim served its allocations (stats), the launcher suggests the report, and
# the report of the trace names the demo's call sites. make demo on a machine without an NVIDIA
# driver points to it. Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
. "$(dirname "$0")/harness.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-demo-emu-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

out=$(cd "$ROOT" && env -u VMMSHIM_LIB -u LD_LIBRARY_PATH -u LD_PRELOAD make -s BUILD="$BUILD" demo-emu 2>&1); rc=$?
printf '%s\n' "$out" > "$tmp/out"
check "make demo-emu exits 0 [$rc]" test "$rc" = 0
check "the demo wrote and checked its buffers" has "$out" "demo: allocated 47.6 MiB in 300 buffers, then half of them again; wrote and checked them: all correct"
check "the shim served them (the demo asked it)" has "$out" "demo: vmmshim served 450 allocations"
check "the shim's stats at exit" has "$out" "vmmshim: stats: allocations served: cudaMalloc 450, cudaMallocAsync 0"
check "the shim's mapping log (info)" grep -q '^vmmshim: cuMemMap va ' "$tmp/out"
check "the launcher suggests the report" grep -q "^vmmshim: done (exit status 0); trace: .*; next: .*vmmshim-report $BUILD/demo_emu.trace\$" "$tmp/out"
check "the launcher did not say the shim served nothing" sh -c '! grep -q "served no allocation" "$1"' - "$tmp/out"
check "the report of the trace: the allocations" has "$out" "450 allocations"
check "the report of the trace: the demo's call sites" grep -q 'demo_emu\.c:[0-9]* main$' "$tmp/out"
check "it says how to run a program of one's own" has "$out" "LD_LIBRARY_PATH=$BUILD/emu scripts/vmmshim --stats ./app"

# make demo without an NVIDIA driver (no nvidia-smi on PATH): the error names make demo-emu.
mkdir "$tmp/empty"
out=$(cd "$ROOT" && PATH="$tmp/empty" NVCC=/bin/true /bin/sh scripts/demo.sh 2>&1); rc=$?
check "make demo without a driver: status 1, pointing to make demo-emu [$rc: $out]" \
  sh -c '[ "$1" = 1 ] && case $2 in "demo: error: nvidia-smi not found"*"make demo-emu"*) ;; *) exit 1 ;; esac' - "$rc" "$out"
summary
