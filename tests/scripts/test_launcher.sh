#!/bin/sh
# Tests of scripts/vmmshim (the launcher): --help, exit status pass-through (plain and
# death by signal), LD_PRELOAD composition, options -> VMMSHIM_ variables, the trace
# path printed first with the program's pid, -q; a malformed value of any option (or of a
# variable already set) stops it before the program starts, with one line and status 125; a
# missing program (127), a directory or a file without execute permission (126) get one line
# each; the last line says the trace's size, and that the cap cut it, or that the shim served
# no allocation and why; a misspelt option gets the nearest one; a library that cannot be
# preloaded (missing, not ELF, not shared, not the shim) stops it with 125 and its path; the
# default trace gets a default cap. Uses a dummy preload library (exporting the shim's
# vmmshim_get_stats, which the launcher looks for), so it needs neither CUDA nor a built shim
# (tests/scripts/test_launcher_values.sh checks the launcher's values against the shim's).
# Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
L="$ROOT/scripts/vmmshim"
. "$(dirname "$0")/harness.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-launcher-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo 'int vmmshim_get_stats(void) { return -1; }' > "$tmp/d.c"
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

# a program that cannot be run: one line, before anything else is printed
one_line() { # description, status wanted, the line wanted, launcher arguments...
  d=$1; want_rc=$2; want=$3; shift 3
  out=$("$L" "$@" 2>&1); rc=$?
  check "$d: status $want_rc, the one line '$want' [status $rc: $out]" test "$rc:$out" = "$want_rc:$want"
}
mkdir adir
echo 'echo ran' > noexec.sh
one_line "./nope" 127 "vmmshim: error: ./nope: no such program" ./nope
one_line "a name not in PATH" 127 "vmmshim: error: no-such-program-xyz: no such program (not found in PATH)" no-such-program-xyz
one_line "a directory" 126 "vmmshim: error: ./adir: is a directory, not a program" ./adir
one_line "a file without execute permission" 126 "vmmshim: error: ./noexec.sh: not executable (no execute permission)" ./noexec.sh
path=$PATH
PATH="$tmp:$PATH"
one_line "one in PATH without execute permission" 126 \
  "vmmshim: error: noexec.sh: $tmp/noexec.sh is not executable (no execute permission)" noexec.sh
PATH=$path
one_line "-q: the same" 127 "vmmshim: error: ./nope: no such program" -q ./nope

# values: every option's malformed value stops the launcher before the program runs
bad_value() { # option value: status 125, one line naming both, and the program did not run
  rm -f ran
  out=$("$L" -q --no-trace "$1" "$2" sh -c ': > ran' 2>&1); rc=$?
  check "$1 '$2': status 125, one line naming it, the program not run [$rc: $out]" \
    sh -c '[ "$1" = 125 ] && [ ! -e ran ] && [ "$(printf "%s\n" "$2" | wc -l)" = 1 ] &&
           case $2 in "vmmshim: error: $3: '\''"*) ;; *) exit 1 ;; esac' - "$rc" "$out" "$1"
}
bad_value --limit -5
bad_value --granularity banana
bad_value --granularity 0
bad_value --max-handle 1.5G
bad_value --reserve 12Q
bad_value --release-threshold lots
bad_value --trace-max 64X
bad_value --stacks-min -1
bad_value --arenas 0
bad_value --arenas 65
bad_value --stacks 65
bad_value --stacks-sample 0
bad_value --free-mode lazy
bad_value --trace-format csv
bad_value --unwind gdb
bad_value --dump-signal KILL
bad_value --dump-signal SEGV
bad_value --log loud
bad_value --log warn:$tmp/no-such-dir/log
bad_value --trace $tmp/no-such-dir/t.trace
out=$("$L" -q --no-trace --limit -5 true 2>&1)
check "the message for --limit -5 [$out]" test "$out" = "vmmshim: error: --limit: '-5' is not a limit: a size for every device together and/or DEVICE:SIZE items (DEVICE 0 to 15), comma-separated: 8G, 0:8G,1:4G"
out=$("$L" -q --no-trace --limit=-5 true 2>&1); rc=$?
check "--limit=-5: the same [$rc: $out]" test "$rc:$out" = "125:vmmshim: error: --limit: '-5' is not a limit: a size for every device together and/or DEVICE:SIZE items (DEVICE 0 to 15), comma-separated: 8G, 0:8G,1:4G"
rm -f ran
out=$(VMMSHIM_ARENAS=lots "$L" -q --no-trace sh -c ': > ran' 2>&1); rc=$?
check "a malformed variable already set: status 125, the variable named, the program not run [$rc: $out]" \
  test "$rc:$out:$(test -e ran && echo ran)" = "125:vmmshim: error: VMMSHIM_ARENAS='lots' (from the environment) is not a whole number from 1 to 64:"
out=$("$L" -q --no-trace --limit 5GiB --granularity 2M --max-handle 16777215T --release-threshold Unlimited \
  --trace-max 64K --stacks 0 --stacks-min 1K --stacks-sample 1000000000 --arenas 64 --free-mode SYNC \
  --trace-format RMM --unwind libunwind --dump-signal sigusr1 --log 3 -- sh -c 'echo ok' 2>&1)
check "well-formed values of every option run the program [$out]" test "$out" = ok

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
out=$("$L" -q --trace-max 64K --trace-max=1M sh -c 'echo "$VMMSHIM_TRACE_MAX"')
check "--trace-max sets VMMSHIM_TRACE_MAX (the last one given)" test "$out" = 1M
out=$("$L" -q --trace=my.%p.trace sh -c 'echo "$VMMSHIM_TRACE"')
check "--trace=PATH sets VMMSHIM_TRACE" test "$out" = "my.%p.trace"
out=$(VMMSHIM_TRACE=x "$L" -q --no-trace sh -c 'echo "[${VMMSHIM_TRACE-unset}]"')
check "--no-trace unsets VMMSHIM_TRACE" test "$out" = "[unset]"
out=$("$L" -q sh -c 'echo "$VMMSHIM_TRACE"')
check "default trace path vmmshim.<program>.%p.trace" test "$out" = "vmmshim.sh.%p.trace"

# messages: the trace path first (with the program's own pid), the next command last
"$L" -o "t.%p.trace" sh -c 'echo $$ > pid; echo "a 1 2 3 4 5" > "t.$$.trace"' 2> err
pid=$(cat pid)
first=$(head -n 1 err)
last=$(tail -n 1 err)
check "first message names the trace with the program's pid" test "$first" = "vmmshim: tracing to t.$pid.trace"
case $last in *"vmmshim-report t.$pid.trace") ok "last message is the report command" ;; *) ko "last message is the report command: $last" ;; esac
"$L" -q -o "t2.%p.trace" true 2> err
check "-q prints nothing" test ! -s err

# the trace's size at exit, and that the cap cut it (a native trace cut ends "e T MAX")
"$L" -o "t3.%p.trace" sh -c 'printf "v 2 vmmshim 0.1.0\na 1 2 3 4 5\ne 5\n" > "t3.$$.trace"' 2> err
last=$(tail -n 1 err)
case $last in "vmmshim: done (exit status 0); trace: 34 B; next: "*) ok "the last line says the trace's size" ;; *) ko "the last line says the trace's size: $last" ;; esac
"$L" --trace-max 2K -o "t4.%p.trace" sh -c 'awk "BEGIN { for (i = 0; i < 200; i++) print \"a 1 2 3 4 5\"; print \"e 5 800\" }" > "t4.$$.trace"' 2> err
last=$(tail -n 1 err)
case $last in "vmmshim: done (exit status 0); trace: 2.4 KiB, cut at --trace-max; next: "*) ok "a trace the cap cut: said so" ;; *) ko "a trace the cap cut: said so: $last" ;; esac

# The default trace gets a cap of 1G; one given with -o, or a cap given, keeps what was asked.
out=$(env -u VMMSHIM_TRACE_MAX "$L" -q sh -c 'echo "[${VMMSHIM_TRACE_MAX-unset}]"')
check "the default trace is capped at 1G [$out]" test "$out" = "[1G]"
out=$(env -u VMMSHIM_TRACE_MAX "$L" -q -o x.%p.trace sh -c 'echo "[${VMMSHIM_TRACE_MAX-unset}]"')
check "a trace path given: no default cap [$out]" test "$out" = "[unset]"
out=$(env -u VMMSHIM_TRACE_MAX "$L" -q --trace-max 0 sh -c 'echo "[${VMMSHIM_TRACE_MAX-unset}]"')
check "--trace-max 0 keeps no cap [$out]" test "$out" = "[0]"
out=$(VMMSHIM_TRACE_MAX=0 "$L" -q sh -c 'echo "[${VMMSHIM_TRACE_MAX-unset}]"')
check "VMMSHIM_TRACE_MAX=0 from the environment keeps no cap [$out]" test "$out" = "[0]"
env -u VMMSHIM_TRACE_MAX "$L" sh -c 'awk "BEGIN { for (i = 0; i < 20; i++) print \"a 1 2 3 4 5\"; print \"e 5 800\" }" > "vmmshim.sh.$$.trace"' 2> err
last=$(tail -n 1 err)
case $last in "vmmshim: done (exit status 0); trace: "*", cut at the default cap of 1G (--trace-max 0: no cap); next: "*) ok "the default cap named when it cut the trace" ;; *) ko "the default cap named when it cut the trace: $last" ;; esac
rm -f vmmshim.sh.*.trace

# A misspelt option: the nearest one named; one near none: no guess.
one_line "--limt" 125 "vmmshim: error: unknown option --limt (see --help); did you mean --limit?" --limt 1G true
one_line "--limt=1G" 125 "vmmshim: error: unknown option --limt=1G (see --help); did you mean --limit?" --limt=1G true
one_line "--stack" 125 "vmmshim: error: unknown option --stack (see --help); did you mean --stacks?" --stack 8 true
one_line "--trace-mx" 125 "vmmshim: error: unknown option --trace-mx (see --help); did you mean --trace-max?" --trace-mx 1G true
one_line "-limit" 125 "vmmshim: error: unknown option -limit (see --help); did you mean --limit?" -limit 1G true
one_line "--stast" 125 "vmmshim: error: unknown option --stast (see --help); did you mean --stats?" --stast true
one_line "--zzz" 125 "vmmshim: error: unknown option --zzz (see --help)" --zzz true

# A library the loader would skip: status 125, the path and why, and the program not run.
bad_lib() { # description, library, why
  rm -f ran
  out=$(VMMSHIM_LIB="$2" "$L" -q --no-trace sh -c ': > ran' 2>&1); rc=$?
  check "VMMSHIM_LIB $1: status 125, '$3', the program not run [$rc: $out]" \
    test "$rc:$out:$(test -e ran && echo ran)" = "125:vmmshim: error: VMMSHIM_LIB=$2: $3:"
}
printf 'root:x:0:0:root:/root:/bin/sh\n' > passwd
echo 'int main(void) { return 0; }' > m.c
${CC:-cc} -c -o m.o m.c
mkdir -p libdir
bad_lib "missing" "$tmp/no-such-lib.so" "no such file"
bad_lib "a text file" "$tmp/passwd" "not a shared library (not an ELF file: it does not start with 7f 'ELF')"
: > empty.so
bad_lib "an empty file" "$tmp/empty.so" "not a shared library (not an ELF file: it does not start with 7f 'ELF')"
bad_lib "a directory" "$tmp/libdir" "is a directory, not a library"
bad_lib "an object file" "$tmp/m.o" "an ELF file but not a shared library (an executable or object file?)"
bad_lib "another library" "$tmp/libother.so" "a shared library, but not libvmmshim.so (it does not export vmmshim_get_stats)"
if [ "$(id -u)" != 0 ]; then
  cp libdummy.so unreadable.so && chmod 000 unreadable.so
  bad_lib "unreadable" "$tmp/unreadable.so" "cannot be read (no read permission)"
fi
out=$(env -u VMMSHIM_LIB "$tmp/tree/scripts/vmmshim" -q true 2>&1); rc=$?
check "no library next to the launcher: 125 and both paths looked at [$rc: $out]" \
  test "$rc:$out" = "125:vmmshim: error: libvmmshim.so not found: neither $tmp/tree/scripts/../build/libvmmshim.so nor $tmp/tree/scripts/../lib/libvmmshim.so exists (build it with make, or set VMMSHIM_LIB)"

# The shim served nothing: said, with why, and no report suggested of an empty trace.
mkdir -p drv nodrv
: > drv/libcuda.so.1
served_nothing() { # description, the reason wanted, launcher arguments...
  d=$1; why=$2; shift 2
  "$@" 2> err
  last=$(tail -n 2 err)
  check "$d: the shim served nothing, why, no report suggested [$last]" \
    sh -c 'printf "%s\n" "$1" | head -n 1 | grep -qxF "vmmshim: the shim served no allocation: $2" && ! grep -q "next:" "$3"' - "$last" "$why" err
}
served_nothing "a header-only trace, a driver on the path" \
  "the program made none (or its framework keeps a cache of its own: see --stats and the README)" \
  env LD_LIBRARY_PATH="$tmp/drv" "$L" -o n1.%p.trace sh -c 'printf "v 3 vmmshim 0.1.0\ne 5\n" > "n1.$$.trace"'
served_nothing "no trace written, a driver on the path" "no CUDA call reached it (not a CUDA program?)" \
  env LD_LIBRARY_PATH="$tmp/drv" "$L" -o n2.%p.trace true
served_nothing "--disable" "--disable passes every call through" \
  env LD_LIBRARY_PATH="$tmp/drv" "$L" --disable -o n3.%p.trace true
served_nothing "VMMSHIM_DISABLE=yes" "VMMSHIM_DISABLE=yes passes every call through" \
  env VMMSHIM_DISABLE=yes LD_LIBRARY_PATH="$tmp/drv" "$L" -o n4.%p.trace true
if ! { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  served_nothing "no driver on the path" \
    "no CUDA driver was loaded (libcuda.so.1 is neither in LD_LIBRARY_PATH nor in ldconfig's cache; without a GPU, try make demo-emu)" \
    env LD_LIBRARY_PATH="$tmp/nodrv" "$L" -o n5.%p.trace sh -c 'printf "v 3 vmmshim 0.1.0\ne 5\n" > "n5.$$.trace"'
fi
# The first process served nothing, a child did (a wrapper, torchrun's workers): the child's
# trace is named, not the first's empty one; a trace older than the run is not counted.
echo "a 1 2 3 4 5" > w.1.trace
touch -t 200001010000 w.1.trace
"$L" -o w.%p.trace sh -c 'sh -c "echo \"a 1 2 3 4 5\" > w.\$\$.trace; echo \$\$ > child"; true' 2> err
last=$(tail -n 1 err)
child=$(cat child)
check "a child's trace with allocations: named, the first process's emptiness said [$last]" \
  sh -c 'case $1 in "vmmshim: done (exit status 0); the program'"'"'s first process served no allocation; 1 other process wrote traces (1 with allocations); next: "*"vmmshim-report w.$2.trace") ;; *) exit 1 ;; esac' - "$last" "$child"
check "a child's trace: no 'served no allocation' line" sh -c '! grep -q "^vmmshim: the shim served no allocation" err'
"$L" --trace-format rmm -o r.%p.trace sh -c 'printf "Thread,Time,Action,Pointer,Size,Stream\n12,10:00:00.000001,allocate,0x7f,256,0x0\n" > "r.$$.trace"' 2> err
check "an rmm trace with an allocation: the report suggested" grep -q "next: .*vmmshim-report r\." err
"$L" -q -o n6.%p.trace true 2> err
check "-q: nothing said when nothing was served" test ! -s err

# --help: what sizes take, the defaults as they are typed, where the rest is
out=$("$L" --help)
check "--help: sizes take K, M, G or T, and an i or a B" sh -c 'case $1 in *"K, M, G or T"*"an i, a B"*) ;; *) exit 1 ;; esac' - "$out"
check "--help: the dump signal's default is USR2" sh -c 'printf "%s\n" "$1" | grep -A1 -e "--dump-signal" | grep -q "USR2, the default"' - "$out"
check "--help: --trace-max" has "$out" "--trace-max SIZE"
check "--help: the default trace's cap" sh -c 'printf "%s\n" "$1" | grep -A2 -e "--trace-max SIZE" | grep -q "default: 1G for the default"' - "$out"
check "--help points at vmmshim(7), not at a file of the sources" sh -c 'case $1 in *README*) exit 1 ;; *"vmmshim(7)"*) ;; *) exit 1 ;; esac' - "$out"
check "--help: exit statuses 127, 126, 125" sh -c 'case $1 in *"127 when the program is not"*"126 when it cannot be run"*125*) ;; *) exit 1 ;; esac' - "$out"

summary
