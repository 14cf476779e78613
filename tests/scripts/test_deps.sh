#!/bin/sh
# Tests of scripts/deps.sh (the dependency step every make target runs first) in scratch
# environments: uthash.h looked for in directories of the test's choosing (VMMSHIM_DEPS_INCLUDE,
# UTHASH_INCLUDE), apt-get absent from PATH, disabled (VMMSHIM_DEPS_APT=none) or replaced by
# stand-ins that fail, succeed without installing, or install. Checks the one-line message and
# the exit status, silence when all is there, and that make stops at the step (even with -j2)
# before compiling anything for every target that builds. Never installs or removes anything
# on the machine. Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEPS="$ROOT/scripts/deps.sh"
. "$(dirname "$0")/harness.sh"
lines() { [ -z "$1" ] && echo 0 || printf '%s\n' "$1" | wc -l; }
# where the real uthash.h is (make test got here, so it is somewhere)
real_uthash=
for d in ${UTHASH_INCLUDE:-} /usr/local/include /usr/include; do
  [ -f "$d/uthash.h" ] && { real_uthash=$d/uthash.h; break; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-deps-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tmp=$(cd "$tmp" && pwd -P)
mkdir -p "$tmp/empty" "$tmp/inc" "$tmp/bin" "$tmp/logs"
: > "$tmp/inc/uthash.h"
for t in id rm; do ln -s "$(command -v $t)" "$tmp/bin/$t"; done   # a PATH without apt-get
SH=$(command -v sh)
export TMPDIR="$tmp/logs"                # where the script leaves apt-get's log

run() { # runs the script with the given environment assignments; sets out, err, rc
  env "$@" "$SH" "$DEPS" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  out=$(cat "$tmp/out")
  err=$(cat "$tmp/err")
}
run_test() { # the same with --test
  env "$@" "$SH" "$DEPS" --test >"$tmp/out" 2>"$tmp/err"
  rc=$?
  out=$(cat "$tmp/out")
  err=$(cat "$tmp/err")
}
# the one line for a missing uthash.h: package, install command, UTHASH_INCLUDE
is_missing_line() {
  [ "$(lines "$err")" = 1 ] && has "$err" "vmmshim: missing uthash.h" && has "$err" "uthash-dev" &&
    has "$err" "apt-get install uthash-dev'" && has "$err" "UTHASH_INCLUDE"
}

# ---- all there: silent, exit 0 ----
run -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty:$tmp/inc" VMMSHIM_DEPS_APT=none
check "header present (searched dirs): exit 0" test "$rc" = 0
check "header present: prints nothing" test -z "$out$err"
run UTHASH_INCLUDE="$tmp/inc" VMMSHIM_DEPS_INCLUDE="$tmp/empty" VMMSHIM_DEPS_APT=none
check "header in UTHASH_INCLUDE: exit 0, prints nothing" test "$rc:$out$err" = "0:"
run -u VMMSHIM_DEPS_INCLUDE -u VMMSHIM_DEPS_APT
check "this machine (make just ran the step): exit 0, prints nothing" test "$rc:$out$err" = "0:"
t0=$(date +%s%N)
i=0
while [ $i -lt 20 ]; do sh "$DEPS" >/dev/null 2>&1; i=$((i + 1)); done
t1=$(date +%s%N)
check "the check is fast when all is there (20 runs: $(( (t1 - t0) / 1000000 )) ms)" test $(( (t1 - t0) / 1000000 )) -lt 2000

# ---- missing, nothing can install it ----
run -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty" VMMSHIM_DEPS_APT=none
check "missing, VMMSHIM_DEPS_APT=none: non-zero exit" test "$rc" != 0
check "missing, VMMSHIM_DEPS_APT=none: one line naming uthash-dev and the command [$err]" is_missing_line
check "missing: nothing on stdout" test -z "$out"
run -u UTHASH_INCLUDE -u VMMSHIM_DEPS_APT VMMSHIM_DEPS_INCLUDE="$tmp/empty" PATH="$tmp/bin"
check "missing, no apt-get on PATH: non-zero exit" test "$rc" != 0
check "missing, no apt-get on PATH: the same one line [$err]" is_missing_line

# ---- missing, apt-get fails (no network): the same line, apt's noise kept out ----
cat > "$tmp/apt-fail" <<EOF
#!/bin/sh
echo "\$*" >> "$tmp/apt-fail.calls"
echo "Reading package lists..."
echo "E: Unable to locate package uthash-dev" >&2
exit 100
EOF
chmod +x "$tmp/apt-fail"
run -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty" VMMSHIM_DEPS_APT="$tmp/apt-fail"
calls=$(cat "$tmp/apt-fail.calls" 2>/dev/null)
check "apt-get failing: non-zero exit" test "$rc" != 0
check "apt-get failing: the same one line [$err]" is_missing_line
check "apt-get failing: the line says the install failed" has "$err" "install failed"
check "apt-get failing: its own messages are not shown" test -z "$(printf '%s\n%s' "$out" "$err" | grep -e 'E: Unable' -e 'Reading package')"
log=$(printf '%s' "$err" | sed -n 's/.*its output is in \([^ :)]*\)):.*/\1/p')
check "apt-get failing: its output kept in the log the line names" grep -q 'E: Unable' "${log:-/nonexistent}"
case $calls in
  *"install "*uthash-dev*update*"install "*uthash-dev*) ok "apt-get asked to install uthash-dev, then after an update again" ;;
  *) ko "apt-get asked to install uthash-dev, then after an update again: $calls" ;;
esac
check "apt-get failing: stdout says what was being installed" has "$out" "installing uthash-dev"

# ---- apt-get 'succeeds' but the header is still not there ----
printf '#!/bin/sh\nexit 0\n' > "$tmp/apt-noop"
chmod +x "$tmp/apt-noop"
run -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty" VMMSHIM_DEPS_APT="$tmp/apt-noop"
check "apt-get installing nothing: non-zero exit" test "$rc" != 0
check "apt-get installing nothing: the one line [$err]" is_missing_line

# ---- apt-get installs it: exit 0, no error ----
mkdir -p "$tmp/later"
cat > "$tmp/apt-ok" <<EOF
#!/bin/sh
echo "\$*" >> "$tmp/apt-ok.calls"
case "\$*" in *install*uthash-dev*) : > "$tmp/later/uthash.h" ;; esac
exit 0
EOF
chmod +x "$tmp/apt-ok"
run -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty:$tmp/later" VMMSHIM_DEPS_APT="$tmp/apt-ok"
check "apt-get installing it: exit 0, nothing on stderr" test "$rc:$err" = "0:"
check "apt-get installing it: install called once, no update needed" test "$(grep -c . "$tmp/apt-ok.calls")" = 1

# ---- UTHASH_INCLUDE naming a directory without it ----
rm -f "$tmp/apt-fail.calls"
run UTHASH_INCLUDE="$tmp/empty" VMMSHIM_DEPS_INCLUDE="$tmp/inc" VMMSHIM_DEPS_APT="$tmp/apt-fail"
check "UTHASH_INCLUDE without uthash.h: non-zero exit" test "$rc" != 0
check "UTHASH_INCLUDE without uthash.h: one line naming the directory and uthash-dev" \
  sh -c '[ "$(printf "%s\n" "$1" | wc -l)" = 1 ] && case $1 in *"UTHASH_INCLUDE=$2 "*uthash-dev*) true ;; *) false ;; esac' - "$err" "$tmp/empty"
check "UTHASH_INCLUDE set: apt-get not run (it would not install there)" test ! -e "$tmp/apt-fail.calls"

# ---- --test: chromium, pkg-config, libunwind and tmux wanted, but only warned about ----
run_test -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/inc" VMMSHIM_DEPS_LIBDIRS="$tmp/empty" VMMSHIM_DEPS_APT=none PATH="$tmp/bin"
check "--test, no chromium/pkg-config/libunwind/tmux, nothing to install with: exit 0" test "$rc" = 0
check "--test: one warning line each for chromium, pkg-config, libunwind8 and tmux" \
  sh -c '[ "$(printf "%s\n" "$1" | grep -c "^vmmshim: warning: chromium not found.*apt-get install chromium")" = 1 ] &&
         [ "$(printf "%s\n" "$1" | grep -c "^vmmshim: warning: pkg-config not found.*apt-get install pkg-config")" = 1 ] &&
         [ "$(printf "%s\n" "$1" | grep -c "^vmmshim: warning: libunwind.so.8 not found.*apt-get install libunwind8")" = 1 ] &&
         [ "$(printf "%s\n" "$1" | grep -c "^vmmshim: warning: tmux not found.*apt-get install tmux")" = 1 ] &&
         [ "$(printf "%s\n" "$1" | wc -l)" = 4 ]' - "$err"
rm -f "$tmp/apt-ok.calls"
run_test -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/inc" VMMSHIM_DEPS_LIBDIRS="$tmp/empty" VMMSHIM_DEPS_APT="$tmp/apt-ok" PATH="$tmp/bin"
check "--test: apt-get asked for chromium, pkg-config, libunwind8 and tmux, not uthash-dev" \
  sh -c 'c=$(cat "$1"); case $c in *install*chromium*pkg-config*libunwind8*tmux*) case $c in *uthash*) false ;; *) true ;; esac ;; *) false ;; esac' - "$tmp/apt-ok.calls"
run -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/inc" VMMSHIM_DEPS_APT=none PATH="$tmp/bin"
check "without --test chromium and pkg-config are not wanted" test "$rc:$out$err" = "0:"

# ---- make: every building target stops at the step, before compiling, also with -j2 ----
cd "$ROOT" || exit 1
unset MAKEFLAGS MFLAGS MAKELEVEL
for goal in all demo gpu-test bench install; do
  for j in 1 2; do
    b="$tmp/build-$goal-$j"
    env -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty" VMMSHIM_DEPS_APT=none \
      make -j$j BUILD="$b" DESTDIR="$tmp/dest" "$goal" >"$tmp/make.out" 2>&1
    mrc=$?
    mout=$(cat "$tmp/make.out")
    nobj=$(find "$b" -name '*.o' 2>/dev/null | wc -l)
    if [ "$mrc" != 0 ] && has "$mout" "vmmshim: missing uthash.h (Debian package uthash-dev)" &&
       ! has "$mout" "No such file" && ! has "$mout" "error:" && [ "$nobj" = 0 ] && [ ! -e "$tmp/dest" ]; then
      ok "make -j$j $goal without uthash.h: stops with the line, nothing compiled"
    else
      ko "make -j$j $goal without uthash.h: stops with the line, nothing compiled (exit $mrc, $nobj objects)"
      sed -n 1,10p "$tmp/make.out"
    fi
  done
done

# ---- make UTHASH_INCLUDE=DIR: checked there, passed to the compiler ----
if [ -n "$real_uthash" ]; then
  mkdir -p "$tmp/uth"
  cp "$real_uthash" "$tmp/uth/uthash.h"
  env -u UTHASH_INCLUDE VMMSHIM_DEPS_INCLUDE="$tmp/empty" VMMSHIM_DEPS_APT=none \
    make -j2 BUILD="$tmp/build-uth" UTHASH_INCLUDE="$tmp/uth" "$tmp/build-uth/libvmmshim.so" >"$tmp/make.out" 2>&1
  mrc=$?
  check "make UTHASH_INCLUDE=DIR builds the library" test "$mrc" = 0 -a -f "$tmp/build-uth/libvmmshim.so"
  check "make UTHASH_INCLUDE=DIR compiles pool.c with -IDIR" grep -q -- "-I$tmp/uth .*src/pool/pool.c" "$tmp/make.out"
else
  ko "no uthash.h found on this machine to copy"
fi

summary
