#!/bin/bash
# Builds what every package and `make install` ship, into target/dist/ (or
# $CARGO_TARGET_DIR/dist/):
#   vgpu-license-agent    the portable release binary: x86_64, static-pie against musl
#                         (packaging/portable.sh), at most 6 MB, the service's code laid
#                         out together (packaging/hot-functions.txt)
#   man/*.8, man/*.5,     the man pages (the commands, the service, the config file:
#   completions/          vgpu-license-agent.toml.5 from packaging/config.toml) and bash,
#                         zsh and fish completions
#
#   bash packaging/build-release.sh      (needs: cargo, python3 with venv, binutils)
#
# It installs what else it needs itself (cargo-zigbuild and zig, from PyPI, into
# target/zigbuild/). The man pages' date is the changelog's (SOURCE_DATE_EPOCH), so that
# builds are reproducible.
set -euo pipefail
umask 022

NAME=vgpu-license-agent
MAX_SIZE=6000000
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
DIST=$TARGET_DIR/dist
# shellcheck source=packaging/portable.sh
. packaging/portable.sh

die() {
	echo "packaging/build-release.sh: error: $*" >&2
	exit 1
}

for tool in cargo python3 objcopy readelf size sha256sum; do
	command -v "$tool" >/dev/null || die "$tool not found (cargo from rustup; apt-get install python3-venv binutils)"
done

# The date of deb/changelog's first entry: ' -- Name <mail>  Sun, 29 Nov 2026 18:45:00 +0000'.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(date -d "$(sed -n 's/^ -- .*>  //p;T;q' deb/changelog)" +%s) ||
		die "no date in deb/changelog's first entry"
fi
export SOURCE_DATE_EPOCH

portable_toolchain "$TARGET_DIR" || die "cannot install the zig toolchain"

# The functions the service runs go first, together, into .text.hot: a linker script made
# from packaging/hot-functions.txt, named by its content so that a new list relinks.
HOT_LIST=packaging/hot-functions.txt
mkdir -p "$TARGET_DIR"
HOT_LD=$TARGET_DIR/hot-functions-$(sha256sum "$HOT_LIST" | cut -c1-16).ld
awk 'BEGIN { print "SECTIONS\n{\n  .text.hot : {" }
	/^[^#]/ { printf "    *(.text.%s .text.unlikely.%s)\n", $1, $1 }
	END { print "  }\n}\nINSERT BEFORE .text;" }' "$HOT_LIST" >"$HOT_LD"

echo "==> cargo zigbuild --release --target $PORTABLE_ZIG_TARGET"
# Built with its symbols, as packaging/hot-functions.py builds it (the profile's strip = true
# makes other code: a list made from one build would miss functions of the other), and
# stripped below.
env "$(portable_rustflags)" CARGO_PROFILE_RELEASE_STRIP=false \
	cargo-zigbuild rustc --release --locked --bin "$NAME" --target "$PORTABLE_ZIG_TARGET" \
	-- -C link-arg=-Wl,-T,"$HOT_LD"
BIN=$TARGET_DIR/$PORTABLE_TARGET/release/$NAME
[ -x "$BIN" ] || die "$BIN is missing"

rm -rf "$DIST"
mkdir -p "$DIST"
# .comment only names the compilers (lintian: binary-has-unneeded-section).
objcopy --strip-all --remove-section=.comment "$BIN" "$DIST/$NAME"
check_static "$DIST/$NAME" || die "the binary is not portable"
SIZE=$(stat -c %s "$DIST/$NAME")
[ "$SIZE" -le "$MAX_SIZE" ] || die "$DIST/$NAME is $SIZE bytes, over $MAX_SIZE"
# A list gone stale (functions renamed or gone since it was made) lays out less: refused
# under half of what it laid out when made.
HOT=$(size -A "$DIST/$NAME" | awk '$1 == ".text.hot" { print $2 }')
HOT_MADE=$(sed -n 's/^# hot bytes when made: //p' "$HOT_LIST")
if [ -z "$HOT" ] || [ "$HOT" -lt $((HOT_MADE / 2)) ]; then
	die "$HOT_LIST laid out ${HOT:-0} bytes of code, under half of the $HOT_MADE it did when it was made: run sudo python3 packaging/hot-functions.py"
fi

echo "==> man pages and completions"
cargo run --quiet --locked --package xtask -- gen-docs "$DIST" >/dev/null
echo "binary: $SIZE bytes, static-pie, $HOT bytes of the service's code together: $DIST/$NAME"
