# Shared by the shell tests (sourced; tests/run.sh runs only test_*.sh): counters, one line per
# check, and the closing "N passed, N failed" line with the exit status.
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { # description, then a command whose success means pass
  d=$1
  shift
  if "$@"; then ok "$d"; else ko "$d"; fi
}
has() { case $1 in *"$2"*) return 0 ;; *) return 1 ;; esac; }
summary() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}
