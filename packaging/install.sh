#!/bin/bash
# Installs vgpu-license-agent as packaging/install-map.txt lists it: into DESTDIR (a package's
# staging tree, an image root) or, without one, into this system.
#
#   bash packaging/install.sh [--destdir DIR] [--prefix DIR] [--dist DIR]
#                             [--set NAME=VALUE]... [--manifest FILE]
#   make install DESTDIR=... PREFIX=...          (the same)
#
# --prefix   default /usr (or $PREFIX); every directory below derives from it, but for
#            sysconfdir: the agent reads /etc/vgpu-license-agent whatever the prefix
# --dist     what packaging/build-release.sh made (default target/dist, or $CARGO_TARGET_DIR/dist)
# --set      overrides one directory variable of the map; "-" leaves its entries out
# --manifest writes "kind mode path" for each installed file and owned directory (paths
#            without DESTDIR): what rpm/build.sh turns into %files
#
# It does not enable or start the unit: a package's scriptlets or the admin do
# (`systemctl daemon-reload && systemctl enable --now vgpu-license-agent`).
set -euo pipefail
umask 022

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAP=$ROOT/packaging/install-map.txt

die() {
	echo "packaging/install.sh: error: $*" >&2
	exit 1
}

DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr}
DIST=${CARGO_TARGET_DIR:-$ROOT/target}/dist
MANIFEST=
declare -A OVERRIDE=()
while [ $# -gt 0 ]; do
	case $1 in
	--destdir) DESTDIR=${2?}; shift 2 ;;
	--prefix) PREFIX=${2?}; shift 2 ;;
	--dist) DIST=${2?}; shift 2 ;;
	--manifest) MANIFEST=${2?}; shift 2 ;;
	--set)
		[[ ${2-} == *=* ]] || die "--set wants NAME=VALUE"
		OVERRIDE[${2%%=*}]=${2#*=}
		shift 2
		;;
	-h | --help)
		sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
		echo "directory variables and their defaults for this prefix:"
		HELP=1
		shift
		;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
done
[[ $PREFIX == /* ]] || die "PREFIX must be an absolute path, not '$PREFIX'"
PREFIX=${PREFIX%/}
[ -n "$PREFIX" ] || PREFIX=/usr

declare -A DIRS=(
	[bindir]=$PREFIX/bin
	[sysconfdir]=/etc
	[datadir]=$PREFIX/share
	[mandir]=$PREFIX/share/man
	[unitdir]=$PREFIX/lib/systemd/system
	[presetdir]=$PREFIX/lib/systemd/system-preset
	[tmpfilesdir]=$PREFIX/lib/tmpfiles.d
	[catalogdir]=$PREFIX/lib/systemd/catalog
	[bashcompdir]=$PREFIX/share/bash-completion/completions
	[zshcompdir]=$PREFIX/share/zsh/site-functions
	[fishcompdir]=$PREFIX/share/fish/vendor_completions.d
	[licensedir]=$PREFIX/share/licenses/$NAME
	[docdir]=$PREFIX/share/doc/$NAME
	[dist]=$DIST
)
for k in "${!OVERRIDE[@]}"; do
	[ -n "${DIRS[$k]+set}" ] || die "--set $k: no such directory variable"
	DIRS[$k]=${OVERRIDE[$k]}
done
if [ -n "${HELP:-}" ]; then
	for k in $(printf '%s\n' "${!DIRS[@]}" | sort); do printf '  %-12s %s\n' "$k" "${DIRS[$k]}"; done
	exit 0
fi

# expand TEXT: TEXT with each @name@ replaced; fails (prints nothing) when a variable is "-".
expand() {
	local text=$1 k
	for k in "${!DIRS[@]}"; do
		if [[ $text == *"@$k@"* ]]; then
			[ "${DIRS[$k]}" != - ] || return 1
			text=${text//@$k@/${DIRS[$k]}}
		fi
	done
	[[ $text != *@*@* ]] || die "install-map.txt: unknown variable in '$1'"
	echo "$text"
}

[ -x "${DIRS[dist]}/$NAME" ] ||
	die "${DIRS[dist]}/$NAME is missing: build it first (make, or bash packaging/build-release.sh)"

MANIFEST_LINES=()
record() { MANIFEST_LINES+=("$1 $2 $3"); }

cd "$ROOT"
while read -r kind src dst mode; do
	case $kind in '' | '#'*) continue ;; esac
	[ -n "$mode" ] || die "install-map.txt: incomplete line: $kind $src $dst"
	dst=$(expand "$dst") || continue
	case $kind in
	dir)
		install -d -m "$mode" "$DESTDIR$dst"
		record dir "$mode" "$dst"
		continue
		;;
	esac
	src=$(expand "$src") || continue
	case $kind in
	bin | file | license)
		[ -f "$src" ] || die "$src is missing"
		install -D -m "$mode" "$src" "$DESTDIR$dst"
		;;
	config)
		[ -f "$src" ] || die "$src is missing"
		# An admin's edited config is never overwritten (an install into a live system).
		if [ -e "$DESTDIR$dst" ] && ! cmp -s "$src" "$DESTDIR$dst"; then
			install -m "$mode" "$src" "$DESTDIR$dst.new"
			echo "kept $DESTDIR$dst (it differs from the packaged one: see $dst.new)"
		else
			install -D -m "$mode" "$src" "$DESTDIR$dst"
		fi
		;;
	unit)
		[ -f "$src" ] || die "$src is missing"
		install -d "$DESTDIR${dst%/*}"
		# The unit names the binary by its path (ExecStart=, ExecReload=): follow bindir.
		sed "s#^\(Exec[A-Za-z]*=\)/usr/bin/$NAME #\1${DIRS[bindir]}/$NAME #" "$src" >"$DESTDIR$dst"
		chmod "$mode" "$DESTDIR$dst"
		;;
	doc)
		# shellcheck disable=SC2206 # the source is a glob, expanded here on purpose
		docs=($src)
		[ -f "${docs[0]}" ] || die "no documents at $src"
		install -d "$DESTDIR$dst"
		for doc in "${docs[@]}"; do
			install -m "$mode" "$doc" "$DESTDIR$dst/"
			record doc "$mode" "$dst/${doc##*/}"
		done
		continue
		;;
	man)
		# shellcheck disable=SC2206 # the source is a glob, expanded here on purpose
		pages=($src)
		[ -f "${pages[0]}" ] || die "no man pages at $src"
		install -d "$DESTDIR$dst"
		for page in "${pages[@]}"; do
			install -m "$mode" "$page" "$DESTDIR$dst/"
			gzip -9nf "$DESTDIR$dst/${page##*/}"
			record man "$mode" "$dst/${page##*/}.gz"
		done
		continue
		;;
	*) die "install-map.txt: unknown kind '$kind'" ;;
	esac
	record "$kind" "$mode" "$dst"
done <"$MAP"

if [ -n "$MANIFEST" ]; then
	printf '%s\n' "${MANIFEST_LINES[@]}" >"$MANIFEST"
fi
echo "installed ${#MANIFEST_LINES[@]} paths into ${DESTDIR:-/}"
