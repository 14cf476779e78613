#!/bin/sh
# Tests of scripts/vmmshim (the launcher): --help, exit status pass-through (plain and
# death by signal), LD_PRELOAD composition, options -> VMMSHIM_ variables, the trace
# path printed first with the program's pid, -q. Uses a dummy preload library, so it
# needs neither CUDA nor a built shim. Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
L="$ROOT/scripts/vmmshim"
. "$(dirname "$0")/harness.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-launcher-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo 'void vmmshim_launcher_test_dummy(void) {}' > "$tmp/d.c"
${CC:-cc} -shared -fPIC -o "$tmp/libdummy.so" "$tmp/d.c" || { echo "cannot build a dummy library"; echo "0 passed, 1 failed"; exit 1; }
echo 'void other_preload_dummy(void) {}' > "$tmp/o.c"
${CC:-cc} -shared -fPIC -o "$tmp/libother.so" "$tmp/o.c"
export VMMSHIM_LIB="$tmp/libdummy.so"
cd "$tmp" || exit 1

# --help
out=$("$L" --help 2>&1); rc=$?
check "--help exits 0" test "$rc" = 0
case $out in *Usage:*--trace*--trace-format*--log*--stats*--granularity*--free-mode*--limit*--release-threshold*--disable*) ok "--help lists the options" ;; *) ko "--help lists the options" ;; esac
"$L" -h >/dev/null 2>&1; check "-h exits 0" test $? = 0
"$L" --version | grep -q '^vmmshim '; check "--version prints the version" test $? = 0
"$L" --no-such-option true >/dev/null 2>&1; check "an unknown option is an error" test $? != 0
"$L" >/dev/null 2>&1; check "no program is an error" test $? != 0

# exit status
"$L" -q /bin/true; check "exit status 0 passes through" test $? = 0
"$L" -q /bin/false; check "exit status 1 passes through" test $? = 1
"$L" -q sh -c 'exit 3'; check "exit status 3 passes through" test $? = 3
"$L" -q sh -c 'kill -TERM $$' 2>/dev/null; check "death by SIGTERM gives 143" test $? = 143
"$L" -q sh -c 'kill -KILL $$' 2>/dev/null; check "death by SIGKILL gives 137" test $? = 137
"$L" -q /nonexistent/program 2>/dev/null; check "a missing program gives 127" test $? = 127

# LD_PRELOAD composition: ours first, the user's kept after it
out=$(LD_PRELOAD= "$L" -q sh -c 'echo "$LD_PRELOAD"')
check "LD_PRELOAD set to the library alone" test "$out" = "$tmp/libdummy.so"
out=$(LD_PRELOAD="$tmp/libother.so" "$L" -q sh -c 'echo "$LD_PRELOAD"')
check "LD_PRELOAD: library prepended to the user's" test "$out" = "$tmp/libdummy.so:$tmp/libother.so"
out=$(LD_PRELOAD= "$L" -q -- sh -c 'echo "$LD_PRELOAD"' 2>&1)
check "-- ends the options" test "$out" = "$tmp/libdummy.so"

# the library found relative to the script when VMMSHIM_LIB is unset
mkdir -p "$tmp/tree/scripts" "$tmp/tree/build"
cp "$L" "$tmp/tree/scripts/vmmshim"
cp "$tmp/libdummy.so" "$tmp/tree/build/libvmmshim.so"
out=$(env -u VMMSHIM_LIB LD_PRELOAD= "$tmp/tree/scripts/vmmshim" -q sh -c 'echo "$LD_PRELOAD"')
check "library found at ../build/libvmmshim.so" test "$out" = "$tmp/tree/build/libvmmshim.so"
env -u VMMSHIM_LIB "$tmp/tree/scripts/vmmshim" -q true 2>/dev/null
mv "$tmp/tree/build/libvmmshim.so" "$tmp/tree/build/x.so"
env -u VMMSHIM_LIB "$tmp/tree/scripts/vmmshim" -q true 2>/dev/null
check "a missing library is an error" test $? != 0

# options -> variables
out=$("$L" -q --trace-format rmm --log info:/tmp/x.%p --stats --granularity 2M --free-mode deferred \
  --limit 1G --release-threshold 256M --reserve 1T --arenas 3 --disable -v -- \
  sh -c 'echo "$VMMSHIM_TRACE_FORMAT|$VMMSHIM_LOG|$VMMSHIM_STATS|$VMMSHIM_GRANULARITY|$VMMSHIM_FREE_MODE|$VMMSHIM_LIMIT|$VMMSHIM_RELEASE_THRESHOLD|$VMMSHIM_RESERVE|$VMMSHIM_ARENAS|$VMMSHIM_DISABLE|$VMMSHIM_VERBOSE"')
check "every option sets its variable" test "$out" = "rmm|info:/tmp/x.%p|1|2M|deferred|1G|256M|1T|3|1|1"
out=$("$L" -q --stacks 16 --stacks-min 1M --stacks-sample 10 --unwind fp --no-python --dump-signal USR1 -- \
  sh -c 'echo "$VMMSHIM_TRACE_STACKS|$VMMSHIM_TRACE_STACKS_MIN|$VMMSHIM_TRACE_STACKS_SAMPLE|$VMMSHIM_TRACE_UNWIND|$VMMSHIM_TRACE_PYTHON|$VMMSHIM_DUMP_SIGNAL"')
check "the stack and dump-signal options set their variables" test "$out" = "16|1M|10|fp|off|USR1"
out=$("$L" -q --stacks=8 --stacks-min=2M --stacks-sample=4 --unwind=dwarf --dump-signal=0 -- \
  sh -c 'echo "$VMMSHIM_TRACE_STACKS|$VMMSHIM_TRACE_STACKS_MIN|$VMMSHIM_TRACE_STACKS_SAMPLE|$VMMSHIM_TRACE_UNWIND|$VMMSHIM_DUMP_SIGNAL"')
check "--OPTION=VALUE forms of the stack options" test "$out" = "8|2M|4|dwarf|0"
out=$("$L" -q --trace=my.%p.trace sh -c 'echo "$VMMSHIM_TRACE"')
check "--trace=PATH sets VMMSHIM_TRACE" test "$out" = "my.%p.trace"
out=$(VMMSHIM_TRACE=x "$L" -q --no-trace sh -c 'echo "[${VMMSHIM_TRACE-unset}]"')
check "--no-trace unsets VMMSHIM_TRACE" test "$out" = "[unset]"
out=$("$L" -q sh -c 'echo "$VMMSHIM_TRACE"')
check "default trace path vmmshim.<program>.%p.trace" test "$out" = "vmmshim.sh.%p.trace"

# messages: the trace path first (with the program's own pid), the next command last
"$L" -o "t.%p.trace" sh -c 'echo $$ > pid; : > "t.$$.trace"' 2> err
pid=$(cat pid)
first=$(head -n 1 err)
last=$(tail -n 1 err)
check "first message names the trace with the program's pid" test "$first" = "vmmshim: tracing to t.$pid.trace"
case $last in *"vmmshim-report t.$pid.trace") ok "last message is the report command" ;; *) ko "last message is the report command: $last" ;; esac
"$L" -q -o "t2.%p.trace" true 2> err
check "-q prints nothing" test ! -s err

summary
