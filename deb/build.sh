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

for tool in cargo dpkg-deb dpkg-parsechangelog gzip objdump; do
	command -v "$tool" >/dev/null || die "$tool not found (apt-get install dpkg-dev binutils; cargo from rustup)"
done

VERSION=$(cargo pkgid --quiet | sed 's/.*[#@]//')
CHANGELOG_VERSION=$(dpkg-parsechangelog -l deb/changelog -S Version)
[ "$VERSION" = "$CHANGELOG_VERSION" ] ||
	die "Cargo.toml says version $VERSION but deb/changelog says $CHANGELOG_VERSION: add a changelog entry"
ARCH=$(dpkg --print-architecture)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(dpkg-parsechangelog -l deb/changelog -S Timestamp)}
export SOURCE_DATE_EPOCH

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
	--target "$(rustc -vV | sed -n 's/^host: //p')" --package "$NAME" |
	sed 's/ (\*)$//' | grep -v "^$NAME " | sort -u | sed 's/^/ /')
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

# Shared-library dependencies of the binary. Not dpkg-shlibdeps: it reads this machine's libc6
# symbols file, where libpthread.so.0 and libdl.so.2 are stubs since glibc 2.34, and would ask
# for libc6 (>= 2.34) although the binary links against glibc 2.17's symbols (and runs on
# bullseye's 2.31: deb/boot-test.sh). Every library it needs is libc6's, and Debian's libc6
# version is glibc's: the dependency is the highest GLIBC_ symbol version the binary needs.
# shellcheck source=packaging/portable.sh
. packaging/portable.sh
while read -r lib; do
	case $lib in
	libc.so.6 | libpthread.so.0 | libdl.so.2 | libm.so.6 | librt.so.1 | ld-linux-x86-64.so.2) ;;
	*) die "the binary needs $lib, which is not libc6's: add its package to Depends" ;;
	esac
done < <(objdump -p "$PKG/usr/bin/$NAME" | sed -n 's/^ *NEEDED *//p')
GLIBC=$(glibc_needed "$PKG/usr/bin/$NAME")
[ -n "$GLIBC" ] || die "no GLIBC_ symbol versions in the binary"
SHLIBS="libc6 (>= $GLIBC)"

INSTALLED_SIZE=$(du -sk --apparent-size --exclude=DEBIAN "$PKG" | cut -f1)
cat >"$PKG/DEBIAN/control" <<CONTROL
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: vgpu-license-agent maintainers <maintainers@users.noreply.a-seed-ec241003.example>
Installed-Size: $INSTALLED_SIZE
Depends: $SHLIBS, ca-certificates, systemd
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
