#!/bin/sh
# The launcher's checks of values against the shim's parsers (src/base/config.c): the launcher
# knows the same variables, of the same kinds, as the shim's option table (VS_OPTIONS in
# include/vmmshim/base.h), and on a table of values, each marked well-formed or not, the
# launcher (through the option, and through the variable already set) and the shim (a CUDA
# program on the host emulation, which warns about a malformed value and uses the default)
# all agree with the mark. Needs make test's build (the library and tests/emu).
# Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) B=$BUILD ;; *) B=$ROOT/$BUILD ;; esac
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CC=${CC:-cc}
L="$ROOT/scripts/vmmshim"
. "$(dirname "$0")/harness.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-values-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
unset VMMSHIM_LIB VMMSHIM_TRACE
for v in $(env | sed -n 's/^\(VMMSHIM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done

# ---- the same variables, of the same kinds ----
table=$(sed -n 's/^ *X(\([A-Z0-9_]*\), VS_KIND_\([A-Z_]*\),.*/\1 \2/p' "$ROOT/include/vmmshim/base.h" |
  tr 'A-Z' 'a-z' | LC_ALL=C sort)
launcher=$(sed -n "/^shim_variables='/,/'\$/p" "$L" | sed "s/^shim_variables='//; s/'\$//" | tr 'A-Z' 'a-z' | LC_ALL=C sort)
check "the option table has its variables ($(echo "$table" | wc -l))" test "$(echo "$table" | wc -l)" -ge 20
check "the launcher knows the variables of the option table, of the same kinds" test "$launcher" = "$table"
[ "$launcher" = "$table" ] || { echo "table:"; echo "$table"; echo "launcher:"; echo "$launcher"; }

# ---- a CUDA program on the emulation, for the shim's side ----
cat > prog.c <<'EOF'
#include <cuda_runtime_api.h>
int main(void) { /* reaches the shim (which then reads its variables); a small cap may refuse it */
  void *p = 0;
  if (cudaMalloc(&p, 1 << 20) == cudaSuccess) cudaFree(p);
  return 0;
}
EOF
if ! $CC -I"$CUDA_HOME/include" -o prog prog.c -L"$B/emu" -Wl,-rpath,"$B/emu" -lcudart 2>cc.log; then
  cat cc.log
  ko "a CUDA program builds against the emulation"
  summary
  exit
fi

# VARIABLE|OPTION (- for none: the variable alone)|VALUE|ok or bad. A value keeps its blanks.
# Sizes, then whole numbers, words, signals, log levels, booleans.
tab=$(printf '\t')
values="LIMIT|--limit|0|ok
LIMIT|--limit|64M|ok
LIMIT|--limit|2GiB|ok
LIMIT|--limit|1k|ok
LIMIT|--limit| 5 G|ok
LIMIT|--limit|${tab}64M|ok
LIMIT|--limit|7MB|ok
LIMIT|--limit|8mib|ok
LIMIT|--limit|12 |ok
LIMIT|--limit|100B|ok
LIMIT|--limit|5 MiB |ok
LIMIT|--limit|00064M|ok
LIMIT|--limit|18446744073709551615|ok
LIMIT|--limit|018446744073709551615|ok
LIMIT|--limit|18446744073709551616|bad
LIMIT|--limit|99999999999999999999999|bad
LIMIT|--limit|16777215T|ok
LIMIT|--limit|16777216T|bad
LIMIT|--limit|17179869183G|ok
LIMIT|--limit|17179869184G|bad
LIMIT|--limit|17592186044415M|ok
LIMIT|--limit|17592186044416M|bad
LIMIT|--limit|18014398509481983K|ok
LIMIT|--limit|18014398509481984K|bad
LIMIT|--limit|-5|bad
LIMIT|--limit|+1|bad
LIMIT|--limit|1.5G|bad
LIMIT|--limit||bad
LIMIT|--limit|   |bad
LIMIT|--limit|12Q|bad
LIMIT|--limit|M|bad
LIMIT|--limit|1MM|bad
LIMIT|--limit|1 M B x|bad
LIMIT|--limit|5 Mi B|bad
LIMIT|--limit|100iB|bad
LIMIT|--limit|0x10|bad
LIMIT|--limit|1e3|bad
LIMIT|--limit|0:8G,1:4G|ok
LIMIT|--limit|12G,3:2G|ok
LIMIT|--limit|3:2G, 12G|ok
LIMIT|--limit| 15 :1M|ok
LIMIT|--limit|007:1M|ok
LIMIT|--limit|0:0|ok
LIMIT|--limit|8G,9G|bad
LIMIT|--limit|0:1G,0:2G|bad
LIMIT|--limit|0:1G,00:2G|bad
LIMIT|--limit|16:1G|bad
LIMIT|--limit|-1:1G|bad
LIMIT|--limit|+1:1G|bad
LIMIT|--limit|x:1G|bad
LIMIT|--limit|:1G|bad
LIMIT|--limit|0:|bad
LIMIT|--limit|0:1:1G|bad
LIMIT|--limit|8G,|bad
LIMIT|--limit|,8G|bad
LIMIT|--limit|8G,,1:1G|bad
LIMIT|--limit|99999999999999999999:1G|bad
LIMIT_GROUP|--limit-group|jobs|ok
LIMIT_GROUP|--limit-group|a.b-c_9|ok
LIMIT_GROUP|--limit-group|0123456789012345678901234567890|ok
LIMIT_GROUP|--limit-group|01234567890123456789012345678901|bad
LIMIT_GROUP|--limit-group|no/slash|bad
LIMIT_GROUP|--limit-group||bad
TAG_RULES|-|kv=py:*/kv_cache.py;weights=phase:before-launch|ok
TAG_RULES|-||bad
ON_LIMIT|--on-limit|fail|ok
ON_LIMIT|--on-limit|WAIT|ok
ON_LIMIT|--on-limit|wait:30|ok
ON_LIMIT|--on-limit|wait: 30 |ok
ON_LIMIT|--on-limit|wait:1000000000|ok
ON_LIMIT|--on-limit|host|ok
ON_LIMIT|--on-limit|Host:4G|ok
ON_LIMIT|--on-limit|balloon|ok
ON_LIMIT|--on-limit|Balloon:5|ok
ON_LIMIT|--on-limit|balloon:3600|ok
ON_LIMIT|--on-limit|balloon:0|bad
ON_LIMIT|--on-limit|balloon:3601|bad
ON_LIMIT|--on-limit|balloon:2s|bad
PRIORITY|-|0|ok
PRIORITY|-|1000|ok
PRIORITY|-|1001|bad
PRIORITY|-|-1|bad
PRIORITY|-|high|bad
COLD_TAGS|-|kv|ok
COLD_TAGS|-|kv:host,cache:discard,x.y-z:mapped|ok
COLD_TAGS|-|kv:warm|bad
COLD_TAGS|-|kv:Host|bad
COLD_TAGS|-|kv,|bad
COLD_TAGS|-|,kv|bad
COLD_TAGS|-|kv,,a|bad
COLD_TAGS|-|no/slash|bad
COLD_TAGS|-|01234567890123456789012345678901|bad
ON_LIMIT|--on-limit|wait:0|bad
ON_LIMIT|--on-limit|wait:1000000001|bad
ON_LIMIT|--on-limit|wait:1G|bad
ON_LIMIT|--on-limit|wait:|bad
ON_LIMIT|--on-limit|host:0|bad
ON_LIMIT|--on-limit|host:0K|bad
ON_LIMIT|--on-limit|host:x|bad
ON_LIMIT|--on-limit|fail:1|bad
ON_LIMIT|--on-limit| fail|bad
ON_LIMIT|--on-limit|spill|bad
ON_LIMIT|--on-limit||bad
GRANULARITY|--granularity|2M|ok
GRANULARITY|--granularity|0|bad
GRANULARITY|--granularity|0M|bad
GRANULARITY|--granularity|000|bad
GRANULARITY|--granularity|banana|bad
MAX_HANDLE|--max-handle|16M|ok
MAX_HANDLE|--max-handle|1.5G|bad
RESERVE|--reserve|1T|ok
RESERVE|--reserve|1P|bad
TRACE_MAX|--trace-max|64K|ok
TRACE_MAX|--trace-max|0|ok
TRACE_MAX|--trace-max|64 KiB|ok
TRACE_MAX|--trace-max|64X|bad
TRACE_STACKS_MIN|--stacks-min|1M|ok
TRACE_STACKS_MIN|--stacks-min|-1|bad
RELEASE_THRESHOLD|--release-threshold|unlimited|ok
RELEASE_THRESHOLD|--release-threshold|UNLIMITED|ok
RELEASE_THRESHOLD|--release-threshold|256M|ok
RELEASE_THRESHOLD|--release-threshold| unlimited|bad
RELEASE_THRESHOLD|--release-threshold|lots|bad
ARENAS|--arenas|1|ok
ARENAS|--arenas|64|ok
ARENAS|--arenas| 8 |ok
ARENAS|--arenas|08|ok
ARENAS|--arenas|0|bad
ARENAS|--arenas|65|bad
ARENAS|--arenas|8K|bad
ARENAS|--arenas|8b|bad
ARENAS|--arenas|-1|bad
ARENAS|--arenas|99999999999999999999|bad
TRACE_STACKS|--stacks|0|ok
TRACE_STACKS|--stacks|64|ok
TRACE_STACKS|--stacks|65|bad
TRACE_STACKS_SAMPLE|--stacks-sample|1|ok
TRACE_STACKS_SAMPLE|--stacks-sample|1000000000|ok
TRACE_STACKS_SAMPLE|--stacks-sample|1000000001|bad
TRACE_STACKS_SAMPLE|--stacks-sample|0|bad
FREE_MODE|--free-mode|sync|ok
FREE_MODE|--free-mode|Deferred|ok
FREE_MODE|--free-mode|lazy|bad
FREE_MODE|--free-mode| sync|bad
FREE_MODE|--free-mode||bad
TRACE_FORMAT|--trace-format|native|ok
TRACE_FORMAT|--trace-format|RMM|ok
TRACE_FORMAT|--trace-format|csv|bad
TRACE_UNWIND|--unwind|auto|ok
TRACE_UNWIND|--unwind|libunwind|ok
TRACE_UNWIND|--unwind|dwarf|ok
TRACE_UNWIND|--unwind|FP|ok
TRACE_UNWIND|--unwind|gdb|bad
TRACE_PYTHON|-|on|ok
TRACE_PYTHON|-|held|ok
TRACE_PYTHON|-|OFF|ok
TRACE_PYTHON|-|1|ok
TRACE_PYTHON|-|no|ok
TRACE_PYTHON|-|maybe|bad
PEER_ACCESS|-|auto|ok
PEER_ACCESS|-|ALL|ok
PEER_ACCESS|-|none|ok
PEER_ACCESS|-|some|bad
DUMP_SIGNAL|--dump-signal|USR2|ok
DUMP_SIGNAL|--dump-signal|usr1|ok
DUMP_SIGNAL|--dump-signal|SIGUSR1|ok
DUMP_SIGNAL|--dump-signal|sigHup|bad
DUMP_SIGNAL|--dump-signal|QUIT|bad
DUMP_SIGNAL|--dump-signal|PWR|ok
DUMP_SIGNAL|--dump-signal|WINCH|ok
DUMP_SIGNAL|--dump-signal|URG|ok
DUMP_SIGNAL|--dump-signal|0|ok
DUMP_SIGNAL|--dump-signal|off|ok
DUMP_SIGNAL|--dump-signal|OFF|ok
DUMP_SIGNAL|--dump-signal|1|bad
DUMP_SIGNAL|--dump-signal|12|ok
DUMP_SIGNAL|--dump-signal|15|bad
DUMP_SIGNAL|--dump-signal|33|bad
DUMP_SIGNAL|--dump-signal|34|ok
DUMP_SIGNAL|--dump-signal|30|ok
DUMP_SIGNAL|--dump-signal|40|ok
DUMP_SIGNAL|--dump-signal|64|ok
DUMP_SIGNAL|--dump-signal|+12|ok
DUMP_SIGNAL|--dump-signal| 12|ok
DUMP_SIGNAL|--dump-signal|012|ok
DUMP_SIGNAL|--dump-signal|65|bad
DUMP_SIGNAL|--dump-signal|999|bad
DUMP_SIGNAL|--dump-signal|KILL|bad
DUMP_SIGNAL|--dump-signal|STOP|bad
DUMP_SIGNAL|--dump-signal|SEGV|bad
DUMP_SIGNAL|--dump-signal|TERM|bad
DUMP_SIGNAL|--dump-signal|4|bad
DUMP_SIGNAL|--dump-signal|6|bad
DUMP_SIGNAL|--dump-signal|7|bad
DUMP_SIGNAL|--dump-signal|8|bad
DUMP_SIGNAL|--dump-signal|9|bad
DUMP_SIGNAL|--dump-signal|11|bad
DUMP_SIGNAL|--dump-signal|19|bad
DUMP_SIGNAL|--dump-signal|-1|bad
DUMP_SIGNAL|--dump-signal|-0|bad
DUMP_SIGNAL|--dump-signal|00|bad
DUMP_SIGNAL|--dump-signal|12x|bad
DUMP_SIGNAL|--dump-signal|SIG|bad
DUMP_SIGNAL|--dump-signal|SIG12|bad
DUMP_SIGNAL|--dump-signal||bad
LOG|--log|error|ok
LOG|--log|WARN|ok
LOG|--log|warning|ok
LOG|--log|info|ok
LOG|--log|debug|ok
LOG|--log|0|ok
LOG|--log|3|ok
LOG|--log|warn:|ok
LOG|--log|4|bad
LOG|--log|loud|bad
LOG|--log|warnings|bad
LOG|--log|:x|bad
LOG|--log||bad
STATS|-|1|ok
STATS|-|TRUE|ok
STATS|-|yes|ok
STATS|-|On|ok
STATS|-|0|ok
STATS|-|false|ok
STATS|-|No|ok
STATS|-|off|ok
STATS|-|2|bad
STATS|-|maybe|bad
STATS|-|1 |bad
STATS|-||bad
VERBOSE|-|yes|ok
VERBOSE|-|y|bad
DISABLE|-|on|ok
DISABLE|-|enable|bad"

verdict() { [ "$1" = 0 ] && echo ok || echo bad; }
n_ok=0
n_bad=0
rows=$(printf '%s\n' "$values" | wc -l)
i=0
while [ "$i" -lt "$rows" ]; do
  i=$((i + 1))
  row=$(printf '%s\n' "$values" | sed -n "${i}p")
  var=VMMSHIM_${row%%|*}; rest=${row#*|}
  opt=${rest%%|*}; rest=${rest#*|}
  val=${rest%|*}; want=${rest##*|}
  [ "$want" = ok ] && n_ok=$((n_ok + 1)) || n_bad=$((n_bad + 1))
  got=launcher:
  # the launcher, through the option
  if [ "$opt" != - ]; then
    VMMSHIM_LIB="$B/libvmmshim.so" "$L" -q --no-trace "$opt" "$val" true >/dev/null 2>&1
    got="$got option $(verdict $?)"
  fi
  # the launcher, the variable already set
  env "$var=$val" VMMSHIM_LIB="$B/libvmmshim.so" "$L" -q --no-trace true >/dev/null 2>&1
  got="$got variable $(verdict $?)"
  # the shim: a malformed value gets a warning naming the variable
  out=$(env "$var=$val" LD_LIBRARY_PATH="$B/emu" LD_PRELOAD="$B/libvmmshim.so" ./prog 2>&1)
  rc=$?
  case $out in *"vmmshim: warning: $var="*) s=bad ;; *) s=ok ;; esac
  [ "$rc" = 0 ] || s="failed ($rc: $out)"
  got="$got; shim: $s"
  wanted=launcher:
  [ "$opt" = - ] || wanted="$wanted option $want"
  wanted="$wanted variable $want; shim: $want"
  check "$var='$val' ($want): $got" test "$got" = "$wanted"
  if [ "$var" = VMMSHIM_DUMP_SIGNAL ] && [ "$val" = KILL ]; then
    check "the shim's message names the default signal USR2 [$out]" has "$out" "using the default USR2"
  fi
done
check "the table holds well-formed ($n_ok) and malformed ($n_bad) values" test "$n_ok" -ge 50 -a "$n_bad" -ge 50
# A well-formed VMMSHIM_LIMIT_GROUP made its group's segment (it outlives its members): removed.
printf '%s\n' "$values" | sed -n 's/^LIMIT_GROUP|[^|]*|\([A-Za-z0-9_.-]*\)|ok$/\1/p' | while read -r g; do
  rm -f "/dev/shm/vmmshim-$(id -u)-$g"
done

summary
