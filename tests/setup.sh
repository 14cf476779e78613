#!/bin/sh
# Installs what `make test` needs on a fresh Debian machine: uthash (headers) and
# chromium (renders the HTML report). Does nothing when they are already there.
need=""
[ -f /usr/include/uthash.h ] || need="$need uthash-dev"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
[ -z "$need" ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "tests/setup.sh: please install:$need" >&2
  [ -f /usr/include/uthash.h ] || exit 1
  exit 0
fi
echo "tests/setup.sh: installing$need"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq $need >/dev/null || {
  echo "tests/setup.sh: apt-get install$need failed" >&2
  [ -f /usr/include/uthash.h ] || exit 1
}
exit 0
