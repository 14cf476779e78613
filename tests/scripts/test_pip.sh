#!/bin/sh
# pip install of the checkout, offline, into a fresh virtual environment (pyproject.toml, setup.py):
# the build makes libvmmshim.so and puts it in the package; `import vmmshim`,
# vmmshim.torch_memory_saver and vmmshim.report work from outside the checkout, library_path()
# is the bundled library, __version__ is include/vmmshim.h's; the console scripts vmmshim,
# vmmshim-report and vmmshim-replay answer --help, `vmmshim ctl --help` runs; the installed
# launcher preloads the bundled library, with --as torch_memory_saver, on the emulation; `pip
# wheel` gives a wheel that installs into a second environment.
# The Python used has venv, pip, setuptools and wheel (python3, else /usr/bin/python3: scripts/
# deps.sh --test installs them); without one the test is skipped (failed under CI=true).
# Ends with "N passed, N failed".
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) B=$BUILD ;; *) B=$ROOT/$BUILD ;; esac
. "$(dirname "$0")/harness.sh"

PY=
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import ensurepip, venv, setuptools, wheel' >/dev/null 2>&1; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  if [ "${CI:-}" = true ]; then
    ko "no python3 with venv, pip, setuptools and wheel (scripts/deps.sh --test installs them)"
  else
    echo "SKIP no python3 with venv, pip, setuptools and wheel; not counted"
  fi
  summary
  exit $?
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-pip-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tmp=$(cd "$tmp" && pwd -P)
unset MAKEFLAGS MFLAGS MAKELEVEL VMMSHIM_LIB VMMSHIM_AS PYTHONPATH LD_PRELOAD
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

# ---- pip install . into a fresh environment ----
"$PY" -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1
check "python -m venv ($PY)" test -x "$tmp/venv/bin/python"
V=$tmp/venv/bin
(cd "$ROOT" && BUILD="$BUILD" "$V/python" -m pip install --no-build-isolation . >"$tmp/install.log" 2>&1)
rc=$?
check "pip install --no-build-isolation . exits 0" test "$rc" = 0
[ "$rc" = 0 ] || tail -n 20 "$tmp/install.log"
SITE=$(cd "$tmp" && "$V/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
out=$(cd "$tmp" && "$V/python" -c 'import vmmshim, vmmshim.torch_memory_saver, vmmshim.report; print(vmmshim.library_path()); print(vmmshim.__version__); print(vmmshim.__file__)' 2>&1)
want_version=$(sed -n 's/^#define VMMSHIM_VERSION "\(.*\)"$/\1/p' "$ROOT/include/vmmshim.h")
check "import vmmshim, vmmshim.torch_memory_saver, vmmshim.report from the environment [$out]" \
  test "$(printf '%s\n' "$out" | sed -n 3p)" = "$SITE/vmmshim/__init__.py"
check "library_path() is the bundled library" test "$(printf '%s\n' "$out" | sed -n 1p)" = "$SITE/vmmshim/lib/libvmmshim.so"
check "the bundled library is make's" cmp -s "$B/libvmmshim.so" "$SITE/vmmshim/lib/libvmmshim.so"
check "__version__ is include/vmmshim.h's ($want_version)" test "$(printf '%s\n' "$out" | sed -n 2p)" = "$want_version"
for tool in vmmshim vmmshim-report vmmshim-replay; do
  h=$(cd "$tmp" && "$V/$tool" --help 2>&1)
  check "$tool --help: its usage" has "$h" "Usage: $tool"
done
h=$(cd "$tmp" && "$V/vmmshim" ctl --help 2>&1)
check "vmmshim ctl --help: the client's usage" has "$h" "vmmshim ctl list"
out=$(cd "$ROOT" && "$V/vmmshim-report" tests/data/small.trace 2>/dev/null)
check "vmmshim-report gives tests/data/small.expected" test "$out" = "$(cat "$ROOT/tests/data/small.expected")"
out=$(cd "$tmp" && "$V/python" "$SITE/vmmshim/bin/vmmshim-report" --help 2>&1 | head -n 1)
check "the shipped vmmshim-report script (vmmshim-replay loads it) finds vmmshim.report [$out]" \
  test "$out" = "Usage: vmmshim-report [options] TRACE"

# ---- the installed launcher: bundled library, --as torch_memory_saver, on the emulation ----
out=$(cd "$tmp" && LD_LIBRARY_PATH="$B/emu" "$V/vmmshim" -q --no-trace --as torch_memory_saver "$V/python" -c '
import torch_memory_saver, vmmshim
print(torch_memory_saver.torch_memory_saver.enabled, vmmshim.library_path())' 2>&1)
check "vmmshim --as torch_memory_saver: the bundled shim is loaded [$out]" \
  test "$out" = "True $SITE/vmmshim/lib/libvmmshim.so"

# ---- pip wheel, installed into a second environment ----
(cd "$ROOT" && BUILD="$BUILD" "$V/python" -m pip wheel --no-build-isolation --no-deps -w "$tmp/wheels" . \
  >"$tmp/wheel.log" 2>&1)
rc=$?
whl=$(ls "$tmp/wheels"/vmmshim-*.whl 2>/dev/null | head -n 1)
check "pip wheel --no-build-isolation . gives a wheel [${whl##*/}]" test "$rc" = 0 -a -n "$whl"
"$PY" -m venv --system-site-packages "$tmp/venv2" >>"$tmp/venv.log" 2>&1
"$tmp/venv2/bin/python" -m pip install "$whl" >"$tmp/install2.log" 2>&1
out=$(cd "$tmp" && "$tmp/venv2/bin/python" -c 'import vmmshim, os; print(os.path.isfile(vmmshim.library_path()))' 2>&1)
check "the wheel installs into a fresh environment, library included [$out]" test "$out" = True

summary
