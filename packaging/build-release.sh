#!/bin/bash
# Builds what every package and `make install` ship, into target/dist/ (or
# $CARGO_TARGET_DIR/dist/):
#   vgpu-license-agent    the portable release binary: x86_64, glibc 2.17 or newer
#                         (packaging/portable.sh), at most 6 MB
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

for tool in cargo python3 objdump objcopy; do
	command -v "$tool" >/dev/null || die "$tool not found (cargo from rustup; apt-get install python3-venv binutils)"
done

# The date of deb/changelog's first entry: ' -- Name <mail>  Sun, 29 Nov 2026 18:45:00 +0000'.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(date -d "$(sed -n 's/^ -- .*>  //p;T;q' deb/changelog)" +%s) ||
		die "no date in deb/changelog's first entry"
fi
export SOURCE_DATE_EPOCH

portable_toolchain "$TARGET_DIR" || die "cannot install the zig toolchain"
echo "==> cargo zigbuild --release --target $PORTABLE_ZIG_TARGET"
env "$(portable_rustflags)" cargo zigbuild --release --locked --bin "$NAME" --target "$PORTABLE_ZIG_TARGET"
BIN=$TARGET_DIR/$PORTABLE_TARGET/release/$NAME
[ -x "$BIN" ] || die "$BIN is missing"

rm -rf "$DIST"
mkdir -p "$DIST"
# .comment only names the compilers (lintian: binary-has-unneeded-section).
objcopy --remove-section=.comment "$BIN" "$DIST/$NAME"
check_glibc_floor "$DIST/$NAME" || die "the binary is not portable"
SIZE=$(stat -c %s "$DIST/$NAME")
[ "$SIZE" -le "$MAX_SIZE" ] || die "$DIST/$NAME is $SIZE bytes, over $MAX_SIZE"

echo "==> man pages and completions"
cargo run --quiet --locked --example gen-docs -- "$DIST" >/dev/null
echo "binary: $SIZE bytes, glibc >= $(glibc_needed "$DIST/$NAME"): $DIST/$NAME"
