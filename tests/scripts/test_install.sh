#!/bin/sh
# Tests of make install / make uninstall, staged with DESTDIR=<scratch> PREFIX=/usr: every file
# in place with its mode and nothing else; the installed launcher preloads the installed library
# with no variable set (also through symlinks) and the shim serves a program on the host
# emulation; the installed vmmshim-report and vmmshim-replay work from bin/; vmmshim.pc gives
# the right prefix and compiler flags and no library to link (the shim is preloaded, never
# linked), and a program built with them finds the shim's functions at run time; the installed
# vmmshim-report loads its package from share/vmmshim/python (also through a symlink); the man
# pages of the three tools have their sections, render without warnings and list exactly the
# options --help lists; vmmshim(7) is installed as built and man finds the pages under share/man;
# the installed vmmshim ctl and top find their client in lib/vmmshim/python and reach a program
# run by the installed launcher, and the vmmshim module imports from there (under the shim, and
# says how to run under it without); uninstall removes those files and nothing else. Needs make
# test's build (the library, tests/emu and test_shim_control).
# Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) B=$BUILD ;; *) B=$ROOT/$BUILD ;; esac
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CC=${CC:-cc}
. "$(dirname "$0")/harness.sh"
skip_or_fail() { # a tool make test's dependency step installs is missing
  if [ "${CI:-}" = true ]; then ko "$1 (scripts/deps.sh --test installs it)"; else echo "SKIP $1; not counted"; fi
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tmp=$(cd "$tmp" && pwd -P)
D="$tmp/root"        # DESTDIR
P="$D/usr"           # where PREFIX=/usr lands
unset MAKEFLAGS MFLAGS MAKELEVEL VMMSHIM_LIB VMMSHIM_TRACE
cd "$ROOT" || exit 1

# ---- make install ----
make BUILD="$BUILD" DESTDIR="$D" PREFIX=/usr install >"$tmp/install.log" 2>&1
rc=$?
check "make install DESTDIR=... PREFIX=/usr exits 0" test "$rc" = 0
[ "$rc" = 0 ] || sed -n 1,20p "$tmp/install.log"
want=$( (printf '%s\n' "bin/vmmshim 755" "bin/vmmshim-replay 755" "bin/vmmshim-report 755" "include/vmmshim.h 644" \
            "lib/libvmmshim.so 644" "lib/pkgconfig/vmmshim.pc 644" "share/man/man1/vmmshim.1 644" \
            "share/man/man1/vmmshim-report.1 644" "share/man/man1/vmmshim-replay.1 644" \
            "share/man/man7/vmmshim.7 644" "lib/vmmshim/python/vmmshim_ctl.py 644"
          for f in scripts/vmmshim_report/*.py scripts/vmmshim_report/page.js; do
            echo "share/vmmshim/python/vmmshim_report/${f##*/} 644"
          done
          (cd scripts/python && find vmmshim -name '*.py' | sed 's|^|lib/vmmshim/python/|; s|$| 644|')) | LC_ALL=C sort)
got=$(cd "$P" 2>/dev/null && find . -type f -o -type l | sed 's|^\./||' | LC_ALL=C sort | while read -r f; do echo "$f $(stat -c %a "$f")"; done)
check "the installed files and their modes are exactly: $(echo $want)" test "$got" = "$want"
[ "$got" = "$want" ] || printf 'got:\n%s\n' "$got"
check "the installed library is the built one" cmp -s "$B/libvmmshim.so" "$P/lib/libvmmshim.so"
check "the installed launcher is scripts/vmmshim" cmp -s scripts/vmmshim "$P/bin/vmmshim"
check "the installed report package is scripts/vmmshim_report" \
  sh -c 'for f in scripts/vmmshim_report/*.py scripts/vmmshim_report/page.js; do
           cmp -s "$f" "$1/share/vmmshim/python/vmmshim_report/${f##*/}" || exit 1; done' - "$P"
check "nothing installed outside PREFIX" test "$(ls -A "$D")" = usr
out=$(make -n BUILD="$BUILD" DESTDIR="$tmp/d2" install 2>&1)
check "PREFIX defaults to /usr/local" has "$out" "$tmp/d2/usr/local/lib/libvmmshim.so"

# ---- the installed launcher finds the installed library ----
out=$(LD_PRELOAD= "$P/bin/vmmshim" --no-trace -q -- sh -c 'echo "$LD_PRELOAD"' 2>&1)
check "installed launcher preloads $P/lib/libvmmshim.so (no VMMSHIM_LIB)" test "$out" = "$P/lib/libvmmshim.so"
mkdir -p "$tmp/links" "$tmp/bin2"
ln -s "$P/bin/vmmshim" "$tmp/links/abs"
ln -s ../root/usr/bin/vmmshim "$tmp/links/rel"
ln -s rel "$tmp/links/rel2"
ln -s "$tmp/links/rel2" "$tmp/bin2/vmmshim"
for l in "$tmp/links/abs" "$tmp/links/rel2" "$tmp/bin2/vmmshim"; do
  out=$(LD_PRELOAD= "$l" --no-trace -q -- sh -c 'echo "$LD_PRELOAD"' 2>&1)
  check "through symlink $(basename "$(dirname "$l")")/$(basename "$l"): the installed library" test "$out" = "$P/lib/libvmmshim.so"
done
out=$(cd "$tmp" && LD_PRELOAD= PATH="$tmp/bin2:$PATH" vmmshim --no-trace -q -- sh -c 'echo "$LD_PRELOAD"' 2>&1)
check "found on PATH as a symlink: the installed library" test "$out" = "$P/lib/libvmmshim.so"

# a real program on the emulated driver, built with the installed header
cat > "$tmp/prog.c" <<'EOF'
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <vmmshim.h>
int main(void) {
  void *p = NULL;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess || cudaFree(p) != cudaSuccess) {
    printf("cuda error\n");
    return 2;
  }
  int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "vmmshim_active");
  int (*get)(vmmshim_stats_t *, size_t) = (int (*)(vmmshim_stats_t *, size_t))dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  vmmshim_stats_t s;
  unsigned long long n = get && get(&s, sizeof s) == 0 ? (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME] : 0;
  printf("active=%d allocs=%llu\n", active ? active() : -1, n);
  return 0;
}
EOF
if $CC -std=c11 -Wall -Wextra -Werror -I"$P/include" -I"$CUDA_HOME/include" -o "$tmp/prog" "$tmp/prog.c" \
     -L"$B/emu" -lcudart -ldl 2>"$tmp/cc.log"; then
  ok "a program builds with the installed vmmshim.h"
  out=$(LD_LIBRARY_PATH="$B/emu" "$tmp/prog" 2>&1)
  check "without the launcher the shim is not there [$out]" test "$out" = "active=-1 allocs=0"
  out=$(cd "$tmp" && LD_LIBRARY_PATH="$B/emu" "$P/bin/vmmshim" --stats --no-trace -- "$tmp/prog" 2>"$tmp/stats.err")
  rc=$?
  check "installed launcher: the program runs, the shim serves its cudaMalloc [$out]" test "$rc:$out" = "0:active=1 allocs=1"
  check "installed launcher --stats: the shim's stats lines" grep -q '^vmmshim: stats: allocations served: cudaMalloc 1,' "$tmp/stats.err"

  # the trace, and the report command the launcher prints, run as printed
  (cd "$tmp" && LD_LIBRARY_PATH="$B/emu" "$P/bin/vmmshim" -o "$tmp/t.%p.trace" -- "$tmp/prog" >/dev/null 2>"$tmp/trace.err")
  next=$(sed -n 's/^vmmshim: done (exit status 0); trace: [^;]*; next: //p' "$tmp/trace.err")
  case $next in
    "$P/bin/vmmshim-report $tmp/t."*.trace) ok "the launcher names the installed vmmshim-report" ;;
    *) ko "the launcher names the installed vmmshim-report: $next" ;;
  esac
  # shellcheck disable=SC2086  # the printed command, split as a user's shell would
  out=$($next 2>&1)
  rc=$?
  check "the installed vmmshim-report reads the trace" \
    sh -c '[ "$1" = 0 ] && printf "%s\n" "$2" | grep -q "^format: native 4 (vmmshim " &&
           printf "%s\n" "$2" | grep -q "^program: $3\$"' - "$rc" "$out" "$tmp/prog"
else
  ko "a program builds with the installed vmmshim.h"; cat "$tmp/cc.log"
fi

# ---- the installed vmmshim-report: its package under share/vmmshim/python, also through a symlink ----
pkg_of() { # the file the vmmshim_report package is loaded from when vmmshim-report $1 is loaded
  "${PYTHON:-python3}" -c 'import importlib.machinery as m, importlib.util as u, sys
l = m.SourceFileLoader("entry", sys.argv[1]); l.exec_module(u.module_from_spec(u.spec_from_loader("entry", l)))
print(sys.modules["vmmshim_report"].__file__)' "$1" 2>&1
}
out=$(cd "$tmp" && pkg_of "$P/bin/vmmshim-report")
check "the installed vmmshim-report loads the installed package [$out]" \
  test "$out" = "$P/share/vmmshim/python/vmmshim_report/__init__.py"
ln -s "$P/bin/vmmshim-report" "$tmp/links/report"
out=$(cd "$tmp" && pkg_of "$tmp/links/report")
check "through a symlink too [$out]" test "$out" = "$P/share/vmmshim/python/vmmshim_report/__init__.py"
out=$(cd "$ROOT" && "$tmp/links/report" tests/data/small.trace 2>/dev/null)
check "the installed vmmshim-report through a symlink gives tests/data/small.expected" \
  test "$out" = "$(cat tests/data/small.expected)"
mkdir "$tmp/alone"
cp "$P/bin/vmmshim-report" "$tmp/alone/"
err=$("$tmp/alone/vmmshim-report" "$ROOT/tests/data/small.trace" 2>&1 >/dev/null)
rc=$?
check "a vmmshim-report without its package: one error line, exit 2 [$err]" \
  sh -c '[ "$1" = 2 ] && [ "$(printf "%s\n" "$2" | wc -l)" = 1 ] && case $2 in "vmmshim-report: error: "*) ;; *) exit 1 ;; esac' - "$rc" "$err"

# ---- the installed vmmshim-replay: finds vmmshim-report and the library next to itself ----
out=$(cd "$tmp" && env -u BUILD "$P/bin/vmmshim-replay" --convert-only "$ROOT/tests/data/small.trace" 2>/dev/null)
check "installed vmmshim-replay --convert-only gives tests/data/small.replay" test "$out" = "$(cat tests/data/small.replay)"
ln -s "$P/bin/vmmshim-replay" "$tmp/links/replay"
out=$(cd "$tmp" && env -u BUILD "$tmp/links/replay" --convert-only "$ROOT/tests/data/small.trace" 2>/dev/null)
check "the same through a symlink" test "$out" = "$(cat tests/data/small.replay)"
err=$(cd "$tmp" && env -u BUILD "$P/bin/vmmshim-replay" "$ROOT/tests/data/small.trace" 2>&1 >/dev/null)
check "installed vmmshim-replay without a replayer says to pass --replayer" has "$err" "or pass --replayer"
printf '#!/bin/sh\necho "R x cfg=$3 preload=$LD_PRELOAD"\n' > "$tmp/replayer"
chmod +x "$tmp/replayer"
out=$(cd "$tmp" && env -u BUILD LD_PRELOAD= "$P/bin/vmmshim-replay" --replayer "$tmp/replayer" "$ROOT/tests/data/small.trace" 2>/dev/null)
row=$(printf '%s\n' "$out" | grep '^vmmshim ')
check "installed vmmshim-replay preloads the installed library in its shim row" has "$row" "$P/lib/libvmmshim.so"

# ---- pkg-config ----
if command -v pkg-config >/dev/null 2>&1; then
  pc() { PKG_CONFIG_LIBDIR="$P/lib/pkgconfig" PKG_CONFIG_PATH= pkg-config "$@"; }
  check "vmmshim.pc: prefix=/usr" test "$(pc --variable=prefix vmmshim)" = /usr
  check "vmmshim.pc: libdir=/usr/lib, includedir=/usr/include" \
    test "$(pc --variable=libdir vmmshim) $(pc --variable=includedir vmmshim)" = "/usr/lib /usr/include"
  check "vmmshim.pc: version is VMMSHIM_VERSION" \
    test "$(pc --modversion vmmshim)" = "$(sed -n 's/^#define VMMSHIM_VERSION "\(.*\)"$/\1/p' include/vmmshim.h)"
  flags=$(pc --define-prefix --cflags vmmshim)
  check "pkg-config --define-prefix --cflags: -I$P/include [$flags]" test "$(echo $flags)" = "-I$P/include"
  flags=$(pc --libs vmmshim); rc=$?
  check "pkg-config --libs: nothing to link, and no error [$rc: $flags]" test "$rc:$(echo $flags)" = "0:"
  check "vmmshim.pc offers no library to link" sh -c '! grep -q -e "-lvmmshim" -e "^Libs" "$1"' - "$P/lib/pkgconfig/vmmshim.pc"
  flags=$(PKG_CONFIG_SYSROOT_DIR="$D" pc --cflags --libs vmmshim)
  check "PKG_CONFIG_SYSROOT_DIR: the flags point into the staging tree [$flags]" \
    sh -c 'case " $1 " in *" -I$2/include "*) ;; *) exit 1 ;; esac' - "$flags" "$P"
  cat > "$tmp/link.c" <<'EOF'
#include <dlfcn.h>
#include <stdio.h>
#include <vmmshim.h>
int main(void) {
  int (*get)(vmmshim_stats_t *, size_t) = (int (*)(vmmshim_stats_t *, size_t))dlsym(RTLD_DEFAULT, "vmmshim_get_stats");
  vmmshim_stats_t s;
  if (!get) printf("no shim\n");
  else printf("get_stats=%d bad_size=%d\n", get(&s, sizeof s), get(&s, 1));
  return 0;
}
EOF
  # shellcheck disable=SC2046  # pkg-config's output is a word list
  if $CC -std=c11 -Wall -Werror $(pc --define-prefix --cflags vmmshim) -o "$tmp/link" "$tmp/link.c" \
       $(pc --define-prefix --libs vmmshim) -ldl 2>"$tmp/cc.log"; then
    ok "a program compiles with pkg-config's flags"
    out=$("$tmp/link" 2>&1)
    check "alone it runs without the shim [$out]" test "$out" = "no shim"
    out=$(cd "$tmp" && "$P/bin/vmmshim" -q --no-trace "$tmp/link" 2>&1)
    check "under the installed launcher it finds the shim's functions [$out]" test "$out" = "get_stats=0 bad_size=-1"
  else
    ko "a program compiles with pkg-config's flags"; cat "$tmp/cc.log"
  fi
else
  skip_or_fail "pkg-config is needed to check vmmshim.pc"
fi

# ---- the man pages: the launcher's, vmmshim-report's, vmmshim-replay's ----
# man_page TOOL MIN_OPTIONS AN_OPTION: the installed page of TOOL is what gen-man.sh makes of the
# installed TOOL's --help, with its sections, exactly the options --help lists (at least
# MIN_OPTIONS), rendered by groff without warnings and by man -l (AN_OPTION in the text).
man_page() {
  tool=$1 min=$2 sample=$3
  man1="$P/share/man/man1/$tool.1"
  upper=$(echo "$tool" | tr a-z A-Z)
  check "$tool.1 is what scripts/gen-man.sh makes from the installed $tool's --help" \
    sh -c 'sh scripts/gen-man.sh "$1" | cmp -s - "$2"' - "$P/bin/$tool" "$man1"
  check "$tool.1 starts with .TH $upper 1" test "$(grep -v '^\.\\"' "$man1" | head -n 1 | cut -d' ' -f1-3)" = ".TH $upper 1"
  secs=$(sed -n 's/^\.SH //p' "$man1" | tr -d '"' | tr '\n' '|')
  check "$tool.1: sections NAME SYNOPSIS DESCRIPTION OPTIONS ENVIRONMENT EXIT STATUS SEE ALSO, in order [$secs]" \
    test "$secs" = "NAME|SYNOPSIS|DESCRIPTION|OPTIONS|ENVIRONMENT|EXIT STATUS|SEE ALSO|"
  check "$tool.1: NAME is '$tool \\- <summary>'" \
    sh -c 'sed -n "/^\.SH NAME/{n;p;}" "$1" | grep -q "^$2 \\\\- [a-z]"' - "$man1" "$(echo "$tool" | sed 's/-/\\\\-/g')"
  # option names: from the help's option lines, and from the page's .TP terms
  help_opts=$("$P/bin/$tool" --help | grep -E '^ +-' | grep -oE '(^|[ ,])--?[a-z][a-z-]*' | tr -d ' ,' | sort -u)
  man_opts=$(sed -n '/^\.TP/{n;p;}' "$man1" | sed 's/\\-/-/g; s/\\f[BIR]//g' | grep -oE '(^|[ ,])--?[a-z][a-z-]*' | tr -d ' ,' | sort -u)
  check "$tool --help lists options (found $(echo "$help_opts" | wc -l))" test "$(echo "$help_opts" | wc -l)" -ge "$min"
  check "$tool.1 lists exactly the options --help lists" test "$man_opts" = "$help_opts"
  [ "$man_opts" = "$help_opts" ] || { echo "help: $(echo $help_opts)"; echo "man:  $(echo $man_opts)"; }
  if command -v groff >/dev/null 2>&1; then
    warn=$(groff -man -Tutf8 -ww -z "$man1" 2>&1)
    check "$tool.1: groff renders it without warnings [$warn]" test -z "$warn"
    text=$(groff -man -Tascii -P-cbou "$man1" 2>/dev/null)
    missing=
    for o in $help_opts; do printf '%s\n' "$text" | grep -q -- "$o\([^a-z-]\|$\)" || missing="$missing $o"; done
    check "$tool.1: every option appears in the rendered page [missing:$missing]" test -z "$missing"
    check "$tool.1: the rendered page has the section headings" \
      sh -c 'for s in NAME SYNOPSIS DESCRIPTION OPTIONS ENVIRONMENT "EXIT STATUS" "SEE ALSO"; do printf "%s\n" "$1" | grep -q "^$s\$" || exit 1; done' - "$text"
    if command -v man >/dev/null 2>&1; then
      out=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man -l "$man1" 2>/dev/null)
      check "man -l renders $tool.1" has "$out" "$sample"
    fi
  else
    echo "SKIP rendering $tool.1: no groff; not counted"
  fi
}
man_page vmmshim 20 --release-threshold
man_page vmmshim-report 15 --memory-viz
man_page vmmshim-replay 5 --convert-only
version=$(sed -n 's/^#define VMMSHIM_VERSION "\(.*\)"$/\1/p' include/vmmshim.h)
for t in vmmshim-report vmmshim-replay; do
  out=$("$P/bin/$t" --version 2>&1)
  check "$t --version is '$t $version' (VMMSHIM_VERSION) [$out]" test "$out" = "$t $version"
done

# ---- vmmshim(7) ----
check "vmmshim(7) is installed as built" cmp -s "$B/vmmshim.7" "$P/share/man/man7/vmmshim.7"
if command -v man >/dev/null 2>&1; then
  out=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man -M "$P/share/man" 7 vmmshim 2>/dev/null)
  check "man -M PREFIX/share/man 7 vmmshim finds it" has "$out" "VMMSHIM_TRACE_MAX"
  out=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man -M "$P/share/man" 1 vmmshim 2>/dev/null)
  check "man -M PREFIX/share/man 1 vmmshim finds the launcher's" has "$out" "--trace-max"
fi

# ---- vmmshim ctl and top, and the vmmshim module, from the install ----
out=$(env -u PYTHONPATH "$P/bin/vmmshim" ctl --python-path 2>&1)
check "installed vmmshim ctl --python-path: $P/lib/vmmshim/python [$out]" test "$out" = "$P/lib/vmmshim/python"
check "the installed client is the source's" cmp -s scripts/python/vmmshim/client.py "$P/lib/vmmshim/python/vmmshim/client.py"
out=$("$tmp/links/abs" ctl 99999999 status 2>&1)
check "installed vmmshim ctl through a symlink: a pid that does not exist, exit 3 [$out]" \
  sh -c '[ "$1" = 3 ] && [ "$2" = "vmmshim: error: no process 99999999" ]' - "$?" "$out"
serve="$B/tests/test_shim_control"
if [ -x "$serve" ]; then
  mkfifo "$tmp/serve.in"
  LD_LIBRARY_PATH="$B/emu" "$P/bin/vmmshim" --no-trace -q -- "$serve" serve <"$tmp/serve.in" >"$tmp/serve.out" 2>&1 &
  serve_pid=$!
  exec 3>"$tmp/serve.in" # its input, open until we quit it
  i=0
  while [ $i -lt 100 ] && ! grep -q '^ready ' "$tmp/serve.out"; do sleep 0.1; i=$((i + 1)); done
  pid=$(sed -n 's/^ready //p' "$tmp/serve.out")
  out=$("$P/bin/vmmshim" ctl "$pid" status --json 2>&1)
  check "installed vmmshim ctl reaches a program run by the installed launcher [$(echo "$out" | cut -c1-80)]" \
    has "$out" "\"pid\":$pid,"
  out=$("$P/bin/vmmshim" ctl "$pid" sleep weights 2>&1)
  check "installed vmmshim ctl sleeps its tag [$out]" has "$out" "sleep weights (host): released"
  out=$("$P/bin/vmmshim" top --once 2>&1)
  check "installed vmmshim top --once shows it" sh -c 'printf "%s\n" "$1" | grep -q "^ *$2 test_shim_cont"' - "$out" "$pid"
  mod=$(cd "$tmp" && LD_PRELOAD="$P/lib/libvmmshim.so" LD_LIBRARY_PATH="$B/emu" PYTHONPATH="$P/lib/vmmshim/python" \
    python3 -c 'import vmmshim, sys; print(vmmshim.__file__); print(vmmshim.control(int(sys.argv[1])).wake("weights")["ok"])' "$pid" 2>&1)
  check "the installed module imports, and its control() wakes the tag [$mod]" \
    test "$mod" = "$P/lib/vmmshim/python/vmmshim/__init__.py
True"
  echo quit >&3
  exec 3>&-
  wait "$serve_pid"
  check "the program exits cleanly" test $? = 0
else
  ko "$serve is built (make test builds it)"
fi
err=$(cd "$tmp" && env -u LD_PRELOAD PYTHONPATH="$P/lib/vmmshim/python" python3 -c 'import vmmshim; vmmshim.sleep("kv")' 2>&1 | tail -n 1)
check "the installed module without the shim: the one line [$err]" \
  test "$err" = 'vmmshim.NotPreloaded: vmmshim: the shim is not preloaded: run under `vmmshim` or LD_PRELOAD=.../libvmmshim.so'

# ---- make uninstall ----
: > "$P/bin/not-ours"
make BUILD="$BUILD" DESTDIR="$D" PREFIX=/usr uninstall >"$tmp/uninstall.log" 2>&1
rc=$?
check "make uninstall exits 0" test "$rc" = 0
left=$(cd "$P" && find . -type f -o -type l | sed 's|^\./||' | LC_ALL=C sort | tr '\n' ' ')
check "make uninstall removes every installed file and only those [left: $left]" test "$left" = "bin/not-ours "
make BUILD="$BUILD" DESTDIR="$D" PREFIX=/usr uninstall >/dev/null 2>&1
check "make uninstall again (nothing there) exits 0" test $? = 0

summary
