#!/bin/bash
# Builds the RPM package target/rpm/vgpu-license-agent-<version>-<release>.x86_64.rpm with
# rpmbuild (Debian's rpm package does), from what packaging/build-release.sh makes (the same
# portable binary, man pages and completions as the .deb), laid out by packaging/install.sh
# as packaging/install-map.txt says.
#
#   bash rpm/build.sh            (needs: cargo, python3 with venv, binutils, rpm)
#
# The version is Cargo.toml's; the release is 1, or $VGPU_RPM_RELEASE (the checks build a
# second release into $VGPU_RPM_OUT_DIR to test an upgrade). The changelog and the packager
# are deb/changelog's, in RPM's format.
# Builds are reproducible: dates come from SOURCE_DATE_EPOCH (default: the changelog's).
# Set VGPU_RPM_SKIP_CARGO_BUILD=1 to package target/dist/ as it is, VGPU_RPM_GPG_NAME to sign
# the package with that key of gpg's keyring.
set -euo pipefail
umask 022

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT_DIR=${VGPU_RPM_OUT_DIR:-$TARGET_DIR/rpm}
RELEASE=${VGPU_RPM_RELEASE:-1}

die() {
	echo "rpm/build.sh: error: $*" >&2
	exit 1
}

for tool in cargo rpmbuild awk; do
	command -v "$tool" >/dev/null || die "$tool not found (apt-get install rpm; cargo from rustup)"
done
[[ $RELEASE =~ ^[0-9]+$ ]] || die "VGPU_RPM_RELEASE must be a number, not '$RELEASE'"

VERSION=$(cargo pkgid --quiet | sed 's/.*[#@]//')
[ "$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' deb/changelog)" = "$VERSION" ] ||
	die "Cargo.toml says version $VERSION but deb/changelog's first entry does not: add one"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(date -d "$(sed -n 's/^ -- .*>  //p;T;q' deb/changelog)" +%s) ||
		die "no date in deb/changelog's first entry"
fi
export SOURCE_DATE_EPOCH

if [ "${VGPU_RPM_SKIP_CARGO_BUILD:-0}" != 1 ]; then
	bash packaging/build-release.sh
fi
DIST=$TARGET_DIR/dist
[ -x "$DIST/$NAME" ] || die "$DIST/$NAME is missing"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "==> staging"
bash packaging/install.sh --destdir "$WORK/stage" --prefix /usr --dist "$DIST" \
	--manifest "$WORK/manifest" >/dev/null
# The install map's kinds as %files entries: the config is the admin's to edit, the
# directories are the package's own, the license and the documents are marked as such.
awk '$1 == "config" { printf "%s", "%config(noreplace) " }
     $1 == "dir" { printf "%s", "%dir " }
     $1 == "license" { printf "%s", "%license " }
     $1 == "doc" { printf "%s", "%doc " }
     { printf "%s\n", "%attr(" $2 ",root,root) " $3 }' "$WORK/manifest" >"$WORK/files"
find "$WORK/stage" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

# The crates linked into the binary: Fedora's bundled(crate(...)) provides, and the license
# expression of the whole binary (the agent's own Apache-2.0 and each crate's, as declared).
# The workspace's own crates (the agent and its model, named with their paths) are not
# bundled crates.
CRATES=$(cargo tree --quiet --locked -e normal,no-proc-macro --prefix none -f '{p} {l}' \
	--target "$(rustc -vV | sed -n 's/^host: //p')" --package "$NAME" |
	sed 's/ (\*)$//' | grep -v -e "^$NAME " -e "^vgpu-license-model " | sort -u)
[ -n "$CRATES" ] || die "cargo tree listed no crates"
PROVIDES=$(awk '{ v = substr($2, 2); gsub("-", "~", v); printf "Provides:       bundled(crate(%s)) = %s\n", $1, v }' <<<"$CRATES")
LICENSE=$(awk '{ $1 = ""; $2 = ""; sub(/^ +/, ""); gsub("/", " OR "); print }' <<<"$CRATES" | awk '
	# Each AND term on a line, its OR alternatives in one order: "MIT OR Apache-2.0" is
	# "(Apache-2.0 OR MIT)".
	{
		n = split($0, all, / AND /)
		for (i = 1; i <= n; i++) {
			gsub(/[()]/, "", all[i])
			m = split(all[i], alt, / OR /)
			for (j = 2; j <= m; j++)
				for (k = j; k > 1 && alt[k - 1] > alt[k]; k--) { t = alt[k]; alt[k] = alt[k - 1]; alt[k - 1] = t }
			term = alt[1]
			for (j = 2; j <= m; j++) term = term " OR " alt[j]
			print (m > 1) ? "(" term ")" : term
		}
	}' | LC_ALL=C sort -u | grep -vx 'Apache-2.0' | awk '{ out = out " AND " $0 } END { print "Apache-2.0" out }')

# deb/changelog in RPM's format: "* Sun Nov 29 2026 Name <mail> - 0.1.0-1", then "- item".
changelog() {
	local line version='' items=()
	while IFS= read -r line; do
		case $line in
		"$NAME ("*) version=${line#*(} version=${version%%)*} items=() ;;
		"  * "*) items+=("- ${line#  \* }") ;;
		"    "*) items[${#items[@]} - 1]+=$'\n'"  ${line#    }" ;;
		" -- "*)
			line=${line# -- }
			printf '* %s %s - %s-%s\n' "$(LC_ALL=C date -u -d "${line#*>  }" '+%a %b %d %Y')" \
				"${line%%>  *}>" "$version" "$RELEASE"
			printf '%s\n' "${items[@]}"
			echo
			;;
		esac
	done <deb/changelog
}
CHANGELOG=$(changelog)
[ -n "$CHANGELOG" ] || die "no entries in deb/changelog"
# The packager is the changelog's latest signer, as the .deb's Maintainer is (a macro, not a
# tag in the spec: who packages is the build's to say).
PACKAGER=$(sed -n 's/^ -- \(.*>\)  .*/\1/p;T;q' deb/changelog)
[ -n "$PACKAGER" ] || die "no signer in deb/changelog's first entry"

fill() {
	awk -v version="$VERSION" -v release="$RELEASE" -v license="$LICENSE" -v provides="$PROVIDES" \
		-v stage="$WORK/stage" -v files="$WORK/files" -v changelog="$CHANGELOG" '
		$0 == "@PROVIDES@" { print provides; next }
		$0 == "@CHANGELOG@" { print changelog; next }
		{
			gsub("@VERSION@", version); gsub("@RELEASE@", release); gsub("@LICENSE@", license)
			gsub("@STAGE@", stage); gsub("@FILES@", files); print
		}' rpm/$NAME.spec.in
}
fill >"$WORK/$NAME.spec"
grep -q '@[A-Z]*@' "$WORK/$NAME.spec" && die "rpm/$NAME.spec.in has a field rpm/build.sh does not fill"

mkdir -p "$OUT_DIR"
echo "==> rpmbuild"
rpmbuild -bb --quiet --target x86_64-linux \
	--define "_topdir $WORK/rpmbuild" \
	--define "_rpmdir $OUT_DIR" \
	--define "packager $PACKAGER" \
	--define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
	"$WORK/$NAME.spec"
RPM=$OUT_DIR/$NAME-$VERSION-$RELEASE.x86_64.rpm
[ -f "$RPM" ] || die "rpmbuild made no $RPM"
# Signed with the publisher's key when one is named (a key in gpg's keyring).
if [ -n "${VGPU_RPM_GPG_NAME:-}" ]; then
	echo "==> rpmsign with $VGPU_RPM_GPG_NAME's key"
	rpmsign --addsign --define "__gpg $(command -v gpg)" --define "_gpg_name $VGPU_RPM_GPG_NAME" "$RPM" </dev/null ||
		die "rpmsign failed"
fi
# The spec as built, beside the package: rpm/check.sh lints it too.
cp "$WORK/$NAME.spec" "$OUT_DIR/$NAME.spec"
echo "package: $(stat -c %s "$RPM") bytes  $RPM"
