#!/usr/bin/env bash
# Manual pages: every page renders without warnings, every option of every tool is
# documented (and nothing else is), each SYNOPSIS is the tool's usage text, and the
# EXAMPLES run, with the output they show.  Needs man-db and groff ("make deps").
. "$(dirname "$0")/lib.sh"
PAGES=("$ROOT"/man/*.[157])

if ! command -v man >/dev/null 2>&1 || ! command -v groff >/dev/null 2>&1; then
	echo "t0100-man: error: 'man' (man-db) and 'groff' are needed to check man/*; install them (make deps)" >&2
	exit 1
fi

# The page as plain text, one line per paragraph (wide), ASCII hyphens and quotes;
# rendered once per page.
render() {
	local r="$TEST_TMP/render.$(basename "$1")"
	test -s "$r" || LC_ALL=C MANWIDTH=1000 man -l "$1" >"$r" 2>/dev/null
	cat "$r"
}
# One section of the rendered page, without its title line.
section() { render "$1" | awk -v s="$2" '/^[A-Z]/ { on = ($0 == s); next } on'; }
# The usage synopsis of a tool: "usage:" line and its continuations, one line.
usage_synopsis() {
	"$1" --help | awk '!/^(usage:| )/ { exit } { sub(/^usage:/, ""); print }' | tr -s ' \n' '  ' | sed 's/^ //; s/ $//'
}

test_expect_success 'there are pages for every tool, the format and the overview' '
	for t in "$ROOT"/cmd/bk-*.c; do
		n=$(basename "$t" .c) && test -f "$ROOT/man/$n.1" || { echo "no man/$n.1"; exit 1; }
	done &&
	test -f "$ROOT/man/bk-stream.5" && test -f "$ROOT/man/bakery.7"
'

test_expect_success 'every page renders with groff without a warning' '
	for p in "${PAGES[@]}"; do
		man --warnings=w -l "$p" 2>warn >/dev/null || { echo "$p: man failed"; cat warn; exit 1; }
		if test -s warn; then echo "$p:"; cat warn; exit 1; fi
		render "$p" >out && test $(wc -l <out) -gt 20 || { echo "$p: renders nearly empty"; exit 1; }
	done
'

if command -v mandoc >/dev/null 2>&1; then
	test_expect_success 'mandoc -T lint finds no warning or error' '
		for p in "${PAGES[@]}"; do
			mandoc -T lint -W warning "$p" >lint 2>&1
			if test -s lint; then cat lint; exit 1; fi
		done
	'
fi

test_expect_success 'every page has NAME, SYNOPSIS or DESCRIPTION, and SEE ALSO' '
	for p in "${PAGES[@]}"; do
		render "$p" >out &&
		for s in NAME DESCRIPTION "SEE ALSO"; do
			grep -qx "$s" out || { echo "$p: no $s section"; exit 1; }
		done
	done
'

test_expect_success 'tool pages have every section; ENVIRONMENT of bk-tokenize names XDG_CACHE_HOME' '
	for t in "$ROOT"/cmd/bk-*.c; do
		p="$ROOT/man/$(basename "$t" .c).1" && render "$p" >out &&
		for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLES "SEE ALSO"; do
			grep -qx "$s" out || { echo "$p: no $s section"; exit 1; }
		done &&
		section "$p" "EXIT STATUS" >st && grep -qE "^ +0 " st && grep -qE "^ +1 " st &&
		grep -qE "^ +2 " st || { echo "$p: EXIT STATUS lacks 0, 1 or 2"; exit 1; }
	done &&
	section "$ROOT/man/bk-tokenize.1" ENVIRONMENT | grep -q XDG_CACHE_HOME
'

test_expect_success 'each SYNOPSIS is the usage text of its tool' '
	for t in "$ROOT"/cmd/bk-*.c; do
		n=$(basename "$t" .c) &&
		usage_synopsis "$n" >want &&
		section "$ROOT/man/$n.1" SYNOPSIS | tr -s " \n" "  " | sed "s/^ //; s/ $//" >got &&
		test -s want && test_cmp want got || { echo "man/$n.1: SYNOPSIS differs from $n --help"; exit 1; }
	done
'

test_expect_success 'every option in a tool source is documented in its page' '
	for t in "$ROOT"/cmd/bk-*.c; do
		n=$(basename "$t" .c) && render "$ROOT/man/$n.1" | tr "\n" " " >text &&
		{ grep -oE -- "--[a-z][a-z0-9-]*" "$t"
		  sed -nE "s/.*\{\"([a-z][a-z0-9-]*)\", (0|.(.).), BK_OPT_.*/--\1 -\3/p" "$t" | tr " " "\n" | grep -v "^-$"
		  echo --help; echo --version; } | sort -u >flags &&
		test $(wc -l <flags) -gt 3 &&
		while read -r f; do
			grep -qE -- "(^|[^a-z0-9-])$f([^a-z0-9-]|\$)" text || { echo "man/$n.1 does not document $f"; exit 1; }
		done <flags
	done
'

test_expect_success 'every option a tool page documents is one the tool accepts' '
	for t in "$ROOT"/cmd/bk-*.c; do
		n=$(basename "$t" .c) &&
		sed -nE "s/.*\{\"([a-z][a-z0-9-]*)\", (0|.(.).), BK_OPT_.*/--\1 -\3/p" "$t" | tr " " "\n" >known &&
		printf "%s\n" --help --version -h >>known &&
		grep -E "^\.It Fl " "$ROOT/man/$n.1" | grep -oE "Fl [^ ]+" | sed "s/^Fl /-/" | sort -u >documented &&
		test -s documented &&
		while read -r f; do
			grep -qx -- "$f" known || { echo "man/$n.1 documents $f, which $n does not accept"; exit 1; }
		done <documented
	done
'

# EXAMPLES: in the rendered section, a display line "$ CMD" is a command and the lines
# after it, up to the next command or the end of the display, are its standard output.
# The commands of one page run in order in one scratch directory (models/ and tests/
# link to the sources) with a cache of their own; each must succeed and print that.
run_examples() { # page
	local page=$1 dir cmd n=0
	dir=$(mktemp -d "$TEST_TMP/ex.XXXXXX") && ln -s "$ROOT/models" "$ROOT/tests" "$dir"/ || return 1
	section "$page" EXAMPLES | awk '
		/^        +\$ / { if (c) print "E"; ind = index($0, "$") - 1; print "C" substr($0, ind + 3); c = 1; next }
		/^        +[^ ]/ && c { print "O" substr($0, ind + 1); next }
		{ if (c) print "E"; c = 0 }
		END { if (c) print "E" }' >"$dir/.examples"
	while IFS= read -r line; do
		case $line in
		C*) cmd=${line#C}; : >"$dir/.want" ;;
		O*) printf "%s\n" "${line#O}" >>"$dir/.want" ;;
		E)
			n=$((n + 1))
			(cd "$dir" && XDG_CACHE_HOME="$dir/.cache" bash -o pipefail -c "$cmd") >"$dir/.got" 2>"$dir/.err" || {
				echo "$(basename "$page"): example failed: \$ $cmd"; cat "$dir/.err"; return 1; }
			if test -s "$dir/.want" && ! cmp -s "$dir/.want" "$dir/.got"; then
				echo "$(basename "$page"): example prints other output: \$ $cmd"
				diff -u "$dir/.want" "$dir/.got"; return 1
			fi ;;
		esac
	done <"$dir/.examples"
	echo "$(basename "$page"): $n examples ran"
	test $n -gt 0
}

for p in "${PAGES[@]}"; do
	case $(basename "$p") in bk-*.1) ;; *) section "$p" EXAMPLES | grep -q "^ *\\$ " || continue ;; esac
	test_expect_success "the EXAMPLES of $(basename "$p") run and print what they show" "run_examples '$p'"
done

test_done
