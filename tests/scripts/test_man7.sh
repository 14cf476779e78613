#!/bin/sh
# vmmshim(7), the page of every VMMSHIM_* variable (build/vmmshim.7, made by make from
# man/variables.txt and the shim's option table): it is what scripts/gen-man7.sh makes from the
# sources now; it has an entry for every VMMSHIM_* variable the code reads (the option table, and
# the names in src/, scripts/, include/ and bench/) and no other; each entry of the option table
# states the default and the accepted values the shim itself states in its message about a
# malformed value; each launcher option it names is one of vmmshim --help; it renders without
# warnings; and the generator refuses a text that lacks a variable of the table or repeats what
# the table says. Needs make test's build (the page, the library, tests/emu).
# Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) B=$BUILD ;; *) B=$ROOT/$BUILD ;; esac
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CC=${CC:-cc}
PAGE="$B/vmmshim.7"
. "$(dirname "$0")/harness.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-man7-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$ROOT" || exit 1
for v in $(env | sed -n 's/^\(VMMSHIM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done

if [ ! -s "$PAGE" ]; then
  ko "make built $PAGE"
  summary
  exit
fi
version=$(sed -n 's/^#define VMMSHIM_VERSION "\(.*\)"$/\1/p' include/vmmshim.h)
"$B/vmmshim-options" > "$tmp/options"
check "the page is what scripts/gen-man7.sh makes from the sources now" \
  sh -c 'sh scripts/gen-man7.sh "$1" man/variables.txt "$2" | cmp -s - "$3"' - "$tmp/options" "$version" "$PAGE"
check "it starts with .TH VMMSHIM 7" test "$(grep -v '^\.\\"' "$PAGE" | head -n 1 | cut -d' ' -f1-3)" = ".TH VMMSHIM 7"

# ---- the variables: the page's entries, and those the code reads ----
# The page source with the roff escapes the generator makes undone: "NAME" after each .TP,
# then its lines.
plain() { sed 's/\\-/-/g; s/\\f[BIR]//g; s/\\e/\\/g; s/\\&//g' "$PAGE"; }
entries=$(plain | sed -n '/^\.TP$/{n;p;}' | LC_ALL=C sort)
# Names that are not environment variables: include guards (*_H), the public API's enum values
# and version macro, the sleep API's constants, the launcher's own version variable, the bare
# prefix in messages.
not_variables='_H$|^VMMSHIM_API_|^VMMSHIM_VERSION$|^VMMSHIM_LAUNCHER_VERSION$|^VMMSHIM_$|^VMMSHIM_SLEEP_(DISCARD|HOST|MAPPED|DISK)?$|^VMMSHIM_WAKE_ZERO$|^VMMSHIM_(MAX_TAGS|TAG_MAX)$'
files=$(git ls-files --cached --others --exclude-standard 2>/dev/null | grep -Ev '^(tests|docs|man|examples|bench/results)/|README' |
  grep -E '^(src|scripts|include|bench)/|^Makefile$')
[ -n "$files" ] || files=$(find src scripts include bench -type f ! -path 'bench/results/*')
# shellcheck disable=SC2086
named=$(grep -ohE 'VMMSHIM_[A-Z0-9_]*' $files | grep -Ev "$not_variables")
table=$(sed -n 's/^ *X(\([A-Z0-9_]*\), VS_KIND_.*/VMMSHIM_\1/p' include/vmmshim/base.h)
code=$(printf '%s\n%s\n' "$named" "$table" | LC_ALL=C sort -u)
check "the option table has its variables ($(echo "$table" | wc -l)), the code names more" \
  test "$(echo "$table" | wc -l)" -ge 20 -a "$(echo "$code" | wc -l)" -gt "$(echo "$table" | wc -l)"
missing=$(printf '%s\n' "$code" | while read -r v; do printf '%s\n' "$entries" | grep -qx "$v" || printf '%s ' "$v"; done)
check "every VMMSHIM_* variable the code reads has an entry [missing: $missing]" test -z "$missing"
stale=$(printf '%s\n' "$entries" | while read -r v; do printf '%s\n' "$code" | grep -qx "$v" || printf '%s ' "$v"; done)
check "every entry is a variable the code reads [not read: $stale]" test -z "$stale"
check "no variable has two entries" test "$(printf '%s\n' "$entries" | uniq -d)" = ""

# ---- defaults and accepted values: as the shim says them ----
cat > "$tmp/prog.c" <<'EOF'
#include <cuda_runtime_api.h>
int main(void) {
  void *p = 0;
  if (cudaMalloc(&p, 1 << 20) == cudaSuccess) cudaFree(p);
  return 0;
}
EOF
if $CC -I"$CUDA_HOME/include" -o "$tmp/prog" "$tmp/prog.c" -L"$B/emu" -Wl,-rpath,"$B/emu" -lcudart 2>"$tmp/cc.log"; then
  # Every variable of the table malformed at once ('' is the one value a path refuses; a tag
  # or group name, and a list of cold tags, has no spaces).
  set --
  for v in $table; do
    if [ "$v" = VMMSHIM_TRACE ] || [ "$v" = VMMSHIM_DISK_DIR ] || [ "$v" = VMMSHIM_TAG_RULES ]; then set -- "$@" "$v="
    elif [ "$v" = VMMSHIM_TAG ] || [ "$v" = VMMSHIM_LIMIT_GROUP ] || [ "$v" = VMMSHIM_COLD_TAGS ]; then
      set -- "$@" "$v=not a name"
    else set -- "$@" "$v=not-a-value"; fi
  done
  said=$(cd "$tmp" && env "$@" LD_LIBRARY_PATH="$B/emu" LD_PRELOAD="$B/libvmmshim.so" ./prog 2>&1)
  n=0
  for v in $table; do
    msg=$(printf '%s\n' "$said" | sed -n "s/^vmmshim: warning: $v='[^']*' is not valid (expected \(.*\)); using the default \(.*\)\$/\2|\1/p")
    page=$(plain | awk -v v="$v" '
      prev == ".TP" && $0 == v { e = 1 }
      e && /^Default: / { d = substr($0, 10) }
      e && /^Values: / { print d "|" substr($0, 9); exit }
      { prev = $0 }')
    if [ -n "$msg" ] && [ "$msg" = "$page" ]; then n=$((n + 1)); else ko "$v: the page says [$page], the shim [$msg]"; fi
  done
  check "every variable of the table: the page's default and values are the shim's ($n)" test "$n" = "$(echo "$table" | wc -l)"
  check "the dump signal's default is USR2, on the page and in the shim's message" \
    sh -c 'printf "%s\n" "$1" | grep -q "DUMP_SIGNAL=.*using the default USR2\$" && grep -q "^Default: .fBUSR2.fR\$" "$2"' - "$said" "$PAGE"
else
  cat "$tmp/cc.log"
  ko "a CUDA program builds against the emulation"
fi

# ---- the launcher options it names ----
help=$(sh scripts/vmmshim --help)
named_opts=$(plain | sed -n 's/^Launcher: //p' | grep -oE '(^|[ ,(])--?[a-z][a-z-]*' | tr -d ' ,(' | sort -u)
check "the page names launcher options ($(echo "$named_opts" | wc -w))" test "$(echo "$named_opts" | wc -w)" -ge 18
bad=
for o in $named_opts; do printf '%s\n' "$help" | grep -qE -- "(^|[ ,])$o([ ,=]|\$)" || bad="$bad $o"; done
check "every launcher option it names is in vmmshim --help [not there:$bad]" test -z "$bad"

# ---- rendering ----
if command -v groff >/dev/null 2>&1; then
  warn=$(groff -man -Tutf8 -ww -z "$PAGE" 2>&1)
  check "groff renders it without warnings [$warn]" test -z "$warn"
  text=$(groff -man -Tascii -P-cbou "$PAGE" 2>/dev/null)
  check "the rendered page has NAME, DESCRIPTION and SEE ALSO" \
    sh -c 'for s in NAME DESCRIPTION "SEE ALSO"; do printf "%s\n" "$1" | grep -q "^$s\$" || exit 1; done' - "$text"
  check "the rendered page shows --trace-max as typed" has "$text" "Launcher: --trace-max SIZE"
  if command -v man >/dev/null 2>&1; then
    out=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man -l "$PAGE" 2>&1 >/dev/null)
    check "man -l renders it without a message [$out]" test -z "$out"
  fi
else
  echo "SKIP rendering the page: no groff; not counted"
fi
if command -v mandoc >/dev/null 2>&1; then
  lint=$(mandoc -Tlint -W warning "$PAGE" 2>&1)
  check "mandoc -Tlint: no warnings [$lint]" test -z "$lint"
fi

# ---- the generator keeps the two sources apart ----
grep -v '^VMMSHIM_ARENAS$' man/variables.txt > "$tmp/no-arenas.txt"
err=$(sh scripts/gen-man7.sh "$tmp/options" "$tmp/no-arenas.txt" "$version" 2>&1 >/dev/null)
check "a text without an entry for VMMSHIM_ARENAS is refused [$err]" \
  sh -c '! sh scripts/gen-man7.sh "$1" "$2" "$3" >/dev/null 2>&1 && case $4 in *"no entry for VMMSHIM_ARENAS"*) ;; *) exit 1 ;; esac' \
  - "$tmp/options" "$tmp/no-arenas.txt" "$version" "$err"
sed 's/^  launcher: --limit SIZE$/&\n  default: 1G/' man/variables.txt > "$tmp/own-default.txt"
err=$(sh scripts/gen-man7.sh "$tmp/options" "$tmp/own-default.txt" "$version" 2>&1 >/dev/null)
check "an entry of the table with a default of its own is refused [$err]" has "$err" "VMMSHIM_LIMIT is in the shim option table"
printf 'VMMSHIM_NEW_ONE\tx\ty\n' >> "$tmp/options"
err=$(sh scripts/gen-man7.sh "$tmp/options" man/variables.txt "$version" 2>&1 >/dev/null)
check "a new variable of the table without an entry is refused [$err]" has "$err" "no entry for VMMSHIM_NEW_ONE"

summary
