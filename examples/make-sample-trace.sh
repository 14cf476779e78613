#!/bin/sh
# Makes examples/sample.trace on the host emulation of the CUDA driver (no GPU needed): builds the
# shim, the emulated driver and runtime, and examples/sample_trace.c, then runs the program under
# the shim with tracing and stacks on. Run from the repository root: sh examples/make-sample-trace.sh
set -eu
BUILD=${BUILD:-build}
OUT=${1:-examples/sample.trace}
make -s "$BUILD/libvmmshim.so" "$BUILD/emu/libcuda.so.1" "$BUILD/emu/libcudart.so.13"
mkdir -p "$BUILD/examples"
${CC:-cc} -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O1 -g -fno-omit-frame-pointer -rdynamic \
  -Iinclude -Itests/emu -I"${CUDA_HOME:-/usr/local/cuda}/include" -o "$BUILD/examples/sample_trace" \
  examples/sample_trace.c -L"$BUILD/emu" -Wl,-rpath,'$ORIGIN/../emu' -lcudart -lcuda -ldl -pthread
rm -f "$OUT"
LD_PRELOAD="$BUILD/libvmmshim.so" LD_LIBRARY_PATH="$BUILD/emu" VMMSHIM_TRACE="$OUT" VMMSHIM_TRACE_STACKS=8 \
  "$BUILD/examples/sample_trace"
# The program's path names the machine that made it: the sample names a neutral one instead.
exe=$(cd "$BUILD/examples" && pwd -P)/sample_trace
sed "s#$exe#/opt/vmmshim-example/sample_trace#g" "$OUT" > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "wrote $OUT"
