#!/bin/sh
# Keeps the documents true to the code and short:
#   - every VMMSHIM_* variable the code reads has a row in docs/configuration.md's tables, and
#     every row there names a variable the code reads. The code's variables: the VS_OPTIONS(X)
#     table of include/vmmshim/base.h (src/base/config.c reads VMMSHIM_<TOKEN> for each X(TOKEN,
#     ...)), getenv("VMMSHIM_...") in src/, and in scripts/ (and its folders) the shell reads
#     ${VMMSHIM_...} and Python's os.environ.get("VMMSHIM_...") / os.environ["VMMSHIM_..."];
#   - README.md is at most 300 lines;
#   - every relative link in README.md and docs/*.md points to a file that exists, and a link's
#     #anchor into a Markdown file to one of its headings;
#   - README.md holds no commit hash (7 to 40 hex digits, letters and digits mixed).
# Each checker also runs on a copy broken on purpose, so that it is seen to fail.
# Ends with "N passed, N failed".
LC_ALL=C
export LC_ALL
. "$(dirname "$0")/harness.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmshim-docs-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# ---- the variables the code reads, one per line, sorted
code_vars() {
  {
    sed -n '/^#define VS_OPTIONS(X)/,/^$/p' include/vmmshim/base.h |
      sed -n 's/^[[:space:]]*X(\([A-Z0-9_]*\),.*/VMMSHIM_\1/p'
    grep -ho 'getenv("VMMSHIM_[A-Z0-9_]*"' src/*/*.c | sed 's/.*"\(VMMSHIM_[A-Z0-9_]*\)"/\1/'
    grep -rhoI '\${VMMSHIM_[A-Z0-9_]*' scripts | sed 's/^\${//'
    grep -rhoIE "environ(\.get\(|\[)[\"']VMMSHIM_[A-Z0-9_]*" scripts | sed 's/.*\(VMMSHIM_[A-Z0-9_]*\)$/\1/'
  } | sort -u
}

# The variables with a row in a configuration page's tables ("| `VMMSHIM_X` | ...").
doc_vars() { # configuration.md
  sed -n 's/^| `\(VMMSHIM_[A-Z0-9_]*\)` |.*/\1/p' "$1" | sort -u
}

code_vars > "$tmp/code"
doc_vars docs/configuration.md > "$tmp/doc"
n_code=$(wc -l < "$tmp/code")
n_opts=$(sed -n '/^#define VS_OPTIONS(X)/,/^$/p' include/vmmshim/base.h | grep -c 'X(')
check "the code's variables found: the $n_opts of VS_OPTIONS and the scripts' ($n_code in all)" \
  test "$n_opts" -gt 0 -a "$n_code" -gt "$n_opts"
undocumented=$(comm -23 "$tmp/code" "$tmp/doc" | tr '\n' ' ')
check "every variable the code reads has a row in docs/configuration.md (missing: ${undocumented:-none})" \
  test -z "$undocumented"
stale=$(comm -13 "$tmp/code" "$tmp/doc" | tr '\n' ' ')
check "every variable in docs/configuration.md is read by the code (not read: ${stale:-none})" test -z "$stale"

# Broken on purpose: a page with a row for every variable the code reads but one.
victim=$(sed -n 2p "$tmp/code")
grep -vx "$victim" "$tmp/code" | sed 's/.*/| `&` | default | what it does |/' > "$tmp/configuration.md"
missing=$(doc_vars "$tmp/configuration.md" | comm -23 "$tmp/code" - | tr '\n' ' ')
check "a page without the row of $victim is caught (missing: ${missing:-none})" test "$missing" = "$victim "

# ---- README.md length
lines=$(wc -l < README.md)
check "README.md is at most 300 lines ($lines)" test "$lines" -le 300

# ---- relative links
# GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
anchors() { # markdown file
  sed -n 's/^#\{1,6\} \(.*\)/\1/p' "$1" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}
# Prints "FILE: TARGET" for every relative link whose file or anchor does not exist.
broken_links() { # markdown files...
  for f in "$@"; do
    dir=$(dirname "$f")
    # Links outside fenced code blocks: ](target) or ](target "title").
    awk '/^```/ { code = !code; next } !code' "$f" | grep -o '](\([^)]*\))' |
      sed -e 's/^](//' -e 's/)$//' -e 's/ .*//' | while IFS= read -r target; do
        case $target in
          http://* | https://* | mailto:* | '') continue ;;
        esac
        path=${target%%#*}
        frag=
        case $target in *'#'*) frag=${target#*#} ;; esac
        if [ -n "$path" ]; then file="$dir/$path"; else file=$f; fi
        if [ ! -e "$file" ]; then
          echo "$f: $target"
        elif [ -n "$frag" ]; then
          case $file in
            *.md) anchors "$file" | grep -qx -- "$frag" || echo "$f: $target" ;;
          esac
        fi
      done
  done
}
n_links=$(for f in README.md docs/*.md; do awk '/^```/ { code = !code; next } !code' "$f"; done | grep -o '](' | wc -l)
check "README.md and docs/*.md hold links ($n_links)" test "$n_links" -gt 10
bad=$(broken_links README.md docs/*.md | tr '\n' ';')
check "every relative link in README.md and docs/*.md reaches an existing file and heading (broken: ${bad:-none})" \
  test -z "$bad"

# Broken on purpose: a missing file, a missing heading; a good link next to them.
mkdir -p "$tmp/docs"
printf '# A page\n\n## Some heading\n\nSee [a](nothere.md), [b](#no-such-heading), [c](#some-heading).\n' \
  > "$tmp/docs/page.md"
bad=$(broken_links "$tmp/docs/page.md" | sed 's/.*: //' | tr '\n' ' ')
check "a link to a missing file and one to a missing heading are caught, a good one is not ($bad)" \
  test "$bad" = "nothere.md #no-such-heading "

# ---- commit hashes in the README
# Runs of 7-40 hex digits standing alone (not after 0x), holding both a letter and a digit.
hashes() { # file
  grep -oE '(^|[^0-9A-Za-z_])[0-9a-f]{7,40}([^0-9A-Za-z_]|$)' "$1" | sed 's/[^0-9a-f]//g' |
    grep '[a-f]' | grep '[0-9]'
}
found=$(hashes README.md | tr '\n' ' ')
check "README.md names no commit hash (found: ${found:-none})" test -z "$found"
printf 'measured at commit 26a4c42 (see be9f315f), pointer 0x7f3a1003b2c4, 1618975744 bytes, decade\n' \
  > "$tmp/hash.md"
found=$(hashes "$tmp/hash.md" | tr '\n' ' ')
check "commit hashes are caught, addresses, numbers and words are not ($found)" \
  test "$found" = "26a4c42 be9f315f "

summary
