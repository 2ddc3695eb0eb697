#!/bin/bash
# Builds the Debian package target/debian/vgpu-license-agent_<version>_<arch>.deb, with plain
# dpkg-deb, from what packaging/build-release.sh makes (the portable binary, man pages and
# completions), laid out by packaging/install.sh as packaging/install-map.txt says.
#
#   bash deb/build.sh            (needs: cargo, python3 with venv, dpkg-dev, binutils, gzip)
#
# The package's version is Cargo.toml's, and deb/changelog's first entry must say the same.
# Builds are reproducible: file dates come from SOURCE_DATE_EPOCH (default: the changelog's
# date). Set VGPU_DEB_SKIP_CARGO_BUILD=1 to package target/dist/ as it is.
set -euo pipefail
umask 022

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT_DIR=$TARGET_DIR/debian

die() {
	echo "deb/build.sh: error: $*" >&2
	exit 1
}

for tool in cargo dpkg-deb dpkg-parsechangelog gzip readelf; do
	command -v "$tool" >/dev/null || die "$tool not found (apt-get install dpkg-dev binutils; cargo from rustup)"
done

VERSION=$(cargo pkgid --quiet | sed 's/.*[#@]//')
CHANGELOG_VERSION=$(dpkg-parsechangelog -l deb/changelog -S Version)
[ "$VERSION" = "$CHANGELOG_VERSION" ] ||
	die "Cargo.toml says version $VERSION but deb/changelog says $CHANGELOG_VERSION: add a changelog entry"
ARCH=$(dpkg --print-architecture)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(dpkg-parsechangelog -l deb/changelog -S Timestamp)}
export SOURCE_DATE_EPOCH
# shellcheck source=packaging/portable.sh
. packaging/portable.sh

if [ "${VGPU_DEB_SKIP_CARGO_BUILD:-0}" != 1 ]; then
	bash packaging/build-release.sh
fi
BIN=$TARGET_DIR/dist/$NAME
[ -x "$BIN" ] || die "$BIN is missing"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PKG=$WORK/pkg

echo "==> staging"
# Debian's zsh reads vendor completions from its own directory; Debian's documentation of the
# license is the copyright file below.
bash packaging/install.sh --destdir "$PKG" --prefix /usr \
	--set zshcompdir=/usr/share/zsh/vendor-completions --set licensedir=- >/dev/null
DOC=$PKG/usr/share/doc/$NAME
install -d "$DOC"
# A native package (no Debian revision): the changelog is changelog.gz.
gzip -9nc deb/changelog >"$DOC/changelog.gz"
CRATES=$(cargo tree --quiet --locked -e normal,no-proc-macro --prefix none -f '{p} {l}' \
	--target "$PORTABLE_TARGET" --package "$NAME" |
	sed 's/ (\*)$//' | grep -v -e "^$NAME " -e "^vgpu-license-model " | sort -u | sed 's/^/ /')
[ -n "$CRATES" ] || die "cargo tree listed no crates"
awk -v crates="$CRATES" '$0 == "@CRATES@" { print crates; next } { print }' deb/copyright.in >"$DOC/copyright"
chmod 0644 "$DOC/copyright" "$DOC/changelog.gz"

echo "==> control"
install -d "$PKG/DEBIAN"
for script in postinst prerm postrm; do
	install -m 0755 "deb/$script" "$PKG/DEBIAN/$script"
done
(cd "$PKG" && find etc -type f -printf '/%p\n' | sort) >"$PKG/DEBIAN/conffiles"
chmod 0644 "$PKG/DEBIAN/conffiles"

# The binary is a static-pie (packaging/portable.sh): it needs no library, so no libc6 in
# Depends. lintian takes an ELF file of type DYN without a program interpreter for a shared
# library, and one that needs no libc for a mistake: the package says why it is neither.
check_static "$PKG/usr/bin/$NAME" >/dev/null || die "the binary is not a static-pie"
install -d "$PKG/usr/share/lintian/overrides"
cat >"$PKG/usr/share/lintian/overrides/$NAME" <<OVERRIDES
# A static-pie executable, not a shared library: static on purpose, against musl, so that one
# binary runs on every guest's libc and the service's RSS holds no shared library's pages.
$NAME: shared-library-lacks-prerequisites [usr/bin/$NAME]
# No libyaml inside: the kubeconfig's YAML is read by yaml-rust2, a pure Rust parser whose
# error messages are libyaml's words, which is what lintian matches.
$NAME: embedded-library libyaml [usr/bin/$NAME]
OVERRIDES
chmod 0644 "$PKG/usr/share/lintian/overrides/$NAME"

INSTALLED_SIZE=$(du -sk --apparent-size --exclude=DEBIAN "$PKG" | cut -f1)
cat >"$PKG/DEBIAN/control" <<CONTROL
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: vgpu-license-agent maintainers <maintainers@users.noreply.a-seed-ec241003.example>
Installed-Size: $INSTALLED_SIZE
Depends: ca-certificates, systemd
Section: admin
Priority: optional
Description: keeps NVIDIA vGPU guests licensed
 vgpu-license-agent installs the client configuration token and gridd.conf of
 an NVIDIA vGPU guest, watches nvidia-gridd and nvidia-smi, restarts
 nvidia-gridd when a restart can help, and explains what it cannot fix: a
 wrong clock, a missing or broken token, an unreachable license service, an
 edition the license service does not hold.
 .
 It reports the license state as JSON, as Prometheus metrics (alert rules for
 fleets included) and in the journal with explanations (journalctl -x), and
 readies golden images so that clones start clean.
CONTROL
chmod 0644 "$PKG/DEBIAN/control"
(cd "$PKG" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
	xargs -0 md5sum) >"$PKG/DEBIAN/md5sums"
chmod 0644 "$PKG/DEBIAN/md5sums"

find "$PKG" -type d -exec chmod 0755 {} +
find "$PKG" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$OUT_DIR"
DEB=$OUT_DIR/${NAME}_${VERSION}_${ARCH}.deb
echo "==> dpkg-deb"
dpkg-deb --root-owner-group -Zxz --build "$PKG" "$DEB" >/dev/null
echo "binary:  $(stat -c %s "$BIN") bytes  $BIN"
echo "package: $(stat -c %s "$DEB") bytes  $DEB"
