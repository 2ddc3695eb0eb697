#!/bin/bash
# Builds the release binary, the man pages and shell completions, and the Debian package
# target/debian/vgpu-license-agent_<version>_<arch>.deb, with plain dpkg-deb.
#
#   bash deb/build.sh            (needs: cargo, dpkg-dev, binutils, gzip)
#
# The package's version is Cargo.toml's, and deb/changelog's first entry must say the same.
# Builds are reproducible: file dates come from SOURCE_DATE_EPOCH (default: the changelog's
# date). Set VGPU_DEB_SKIP_CARGO_BUILD=1 to package the release binary already in target/.
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

for tool in cargo dpkg-deb dpkg-shlibdeps dpkg-parsechangelog gzip objcopy; do
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
	echo "==> cargo build --release"
	cargo build --release --locked --bin "$NAME"
fi
BIN=$TARGET_DIR/release/$NAME
[ -x "$BIN" ] || die "$BIN is missing"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PKG=$WORK/pkg

echo "==> man pages and completions"
cargo run --quiet --locked --example gen-docs -- "$WORK/docs" >/dev/null

echo "==> staging"
# source  destination  mode
while read -r src dst mode; do
	install -D -m "$mode" "$src" "$PKG/$dst"
done <<MAP
$BIN                                      usr/bin/$NAME                                    0755
packaging/$NAME.service                   usr/lib/systemd/system/$NAME.service             0644
packaging/$NAME.tmpfiles                  usr/lib/tmpfiles.d/$NAME.conf                    0644
packaging/$NAME.catalog                   usr/lib/systemd/catalog/$NAME.catalog            0644
packaging/config.toml                     etc/$NAME/config.toml                            0644
packaging/$NAME.rules.yml                 usr/share/$NAME/$NAME.rules.yml                  0644
$WORK/docs/completions/$NAME.bash         usr/share/bash-completion/completions/$NAME      0644
$WORK/docs/completions/_$NAME             usr/share/zsh/vendor-completions/_$NAME          0644
$WORK/docs/completions/$NAME.fish         usr/share/fish/vendor_completions.d/$NAME.fish   0644
MAP
# .comment only names the compilers (lintian: binary-has-unneeded-section).
objcopy --remove-section=.comment "$PKG/usr/bin/$NAME"
for page in "$WORK"/docs/man/*.8; do
	install -D -m 0644 "$page" "$PKG/usr/share/man/man8/$(basename "$page")"
	gzip -9n "$PKG/usr/share/man/man8/$(basename "$page")"
done
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

# Shared-library dependencies of the binary, as dh_shlibdeps computes them (dpkg-shlibdeps
# wants a debian/control to exist in its working directory).
mkdir -p "$WORK/shlibs/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$NAME" "$NAME" >"$WORK/shlibs/debian/control"
SHLIBS=$(cd "$WORK/shlibs" && dpkg-shlibdeps -O "$PKG/usr/bin/$NAME" | sed -n 's/^shlibs:Depends=//p')
[ -n "$SHLIBS" ] || die "dpkg-shlibdeps found no dependencies"

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
