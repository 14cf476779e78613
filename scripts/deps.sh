#!/bin/sh
# scripts/deps.sh [--test]: what building vmmshim needs. make runs it before compiling anything;
# it returns at once, silently, when everything is there.
#   always   uthash.h (Debian package uthash-dev), included by src/pool/pool.c;
#   --test   also chromium (test_report renders the HTML report), pkg-config (test_install
#            reads the installed vmmshim.pc), libunwind8 (test_shim_stacks runs the default
#            unwinder; the shim loads it at run time when present) and tmux (test_ctl runs
#            vmmshim top in a terminal), and a Python with venv, pip, setuptools and wheel
#            (test_pip builds and installs the package offline): only `make test` needs them.
# What is missing is installed with apt-get when we are root and apt-get is on PATH. If uthash.h
# is still missing after that, prints one line naming the package and the command that installs
# it, and exits 1. A missing test tool only gets a warning line (exit 0).
# Variables:
#   UTHASH_INCLUDE        a directory holding uthash.h (make passes it to the compiler with -I).
#                         When set, only that directory is looked at and nothing is installed.
#   VMMSHIM_DEPS_APT      the command to install packages with (e.g. 'sudo apt-get'), or 'none'
#                         to never install. Default: apt-get when root and on PATH, else none.
#   VMMSHIM_DEPS_INCLUDE  ':'-separated directories searched for uthash.h when UTHASH_INCLUDE is
#                         unset. Default: $CPATH, $C_INCLUDE_PATH, /usr/local/include, /usr/include.
#   VMMSHIM_DEPS_LIBDIRS  ':'-separated directories searched for libunwind.so.8 (--test).
test_deps=0
[ "${1:-}" = --test ] && test_deps=1

have_uthash() {
  if [ -n "${UTHASH_INCLUDE:-}" ]; then
    [ -f "$UTHASH_INCLUDE/uthash.h" ]
    return
  fi
  dirs=${VMMSHIM_DEPS_INCLUDE-${CPATH:+$CPATH:}${C_INCLUDE_PATH:+$C_INCLUDE_PATH:}/usr/local/include:/usr/include}
  while [ -n "$dirs" ]; do
    d=${dirs%%:*}
    case $dirs in *:*) dirs=${dirs#*:} ;; *) dirs= ;; esac
    [ -n "$d" ] && [ -f "$d/uthash.h" ] && return 0
  done
  return 1
}
have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
    command -v google-chrome >/dev/null 2>&1
}
have_pkg_config() { command -v pkg-config >/dev/null 2>&1; }
have_tmux() { command -v tmux >/dev/null 2>&1; }
# A Python that builds and installs the package offline (tests/scripts/test_pip.sh picks it).
have_pip_build() {
  for p in python3 /usr/bin/python3; do
    "$p" -c 'import ensurepip, venv, setuptools, wheel' >/dev/null 2>&1 && return 0
  done
  return 1
}
have_libunwind() {
  dirs=${VMMSHIM_DEPS_LIBDIRS-/usr/lib/x86_64-linux-gnu:/usr/lib/aarch64-linux-gnu:/usr/lib64:/usr/lib:/usr/local/lib}
  while [ -n "$dirs" ]; do
    d=${dirs%%:*}
    case $dirs in *:*) dirs=${dirs#*:} ;; *) dirs= ;; esac
    [ -n "$d" ] && [ -e "$d/libunwind.so.8" ] && return 0
  done
  return 1
}

pkgs=""
have_uthash || { [ -n "${UTHASH_INCLUDE:-}" ] || pkgs=uthash-dev; }
if [ "$test_deps" = 1 ]; then
  have_chromium || pkgs="$pkgs chromium"
  have_pkg_config || pkgs="$pkgs pkg-config"
  have_libunwind || pkgs="$pkgs libunwind8"
  have_tmux || pkgs="$pkgs tmux"
  have_pip_build || pkgs="$pkgs python3-venv python3-pip python3-setuptools python3-wheel"
fi
if [ -z "$pkgs" ] && have_uthash; then exit 0; fi

sudo=sudo
[ "$(id -u)" = 0 ] && sudo=
apt=${VMMSHIM_DEPS_APT-}
if [ -z "$apt" ]; then
  if [ -z "$sudo" ] && command -v apt-get >/dev/null 2>&1; then apt=apt-get; else apt=none; fi
fi
apt_note=""
if [ -n "$pkgs" ] && [ "$apt" != none ]; then
  pkgs=${pkgs# }
  echo "vmmshim: installing $pkgs with $apt"
  log="${TMPDIR:-/tmp}/vmmshim-deps.$$.log"
  export DEBIAN_FRONTEND=noninteractive
  # Try without refreshing the package lists first (fast when they are there), then after
  # an update (whatever it returns: a partial update may still have what we need).
  # shellcheck disable=SC2086  # $apt and $pkgs are word lists
  if $apt install -y -qq -o DPkg::Lock::Timeout=120 $pkgs >"$log" 2>&1 ||
     { $apt update -qq >>"$log" 2>&1; $apt install -y -qq -o DPkg::Lock::Timeout=120 $pkgs >>"$log" 2>&1; }; then
    rm -f "$log"
  else
    apt_note="; $apt install failed, its output is in $log"
  fi
fi

if ! have_uthash; then
  if [ -n "${UTHASH_INCLUDE:-}" ]; then
    echo "vmmshim: missing uthash.h in UTHASH_INCLUDE=$UTHASH_INCLUDE (Debian package uthash-dev): run '${sudo:+sudo }apt-get install uthash-dev' and unset UTHASH_INCLUDE, or set UTHASH_INCLUDE to the directory that holds uthash.h" >&2
  else
    echo "vmmshim: missing uthash.h (Debian package uthash-dev$apt_note): run '${sudo:+sudo }apt-get install uthash-dev', or set UTHASH_INCLUDE=DIR" >&2
  fi
  exit 1
fi
if [ "$test_deps" = 1 ]; then
  have_chromium || echo "vmmshim: warning: chromium not found (Debian package chromium$apt_note): run '${sudo:+sudo }apt-get install chromium'; test_report renders its HTML check with it" >&2
  have_pkg_config || echo "vmmshim: warning: pkg-config not found (Debian package pkg-config$apt_note): run '${sudo:+sudo }apt-get install pkg-config'; test_install checks vmmshim.pc with it" >&2
  have_libunwind || echo "vmmshim: warning: libunwind.so.8 not found (Debian package libunwind8$apt_note): run '${sudo:+sudo }apt-get install libunwind8'; test_shim_stacks leaves out the default unwinder without it" >&2
  have_pip_build || echo "vmmshim: warning: no python3 with venv, pip, setuptools and wheel (Debian packages python3-venv python3-pip python3-setuptools python3-wheel$apt_note): run '${sudo:+sudo }apt-get install python3-venv python3-pip python3-setuptools python3-wheel'; test_pip installs the package with it" >&2
  have_tmux || echo "vmmshim: warning: tmux not found (Debian package tmux$apt_note): run '${sudo:+sudo }apt-get install tmux'; test_ctl runs vmmshim top in a terminal with it" >&2
fi
exit 0
