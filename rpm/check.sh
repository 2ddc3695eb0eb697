#!/bin/bash
# CI checks of the RPM package:
#
#   bash rpm/check.sh
#
# Runs as root on a Debian machine: it installs the apt packages it needs (Debian's rpm and
# rpmlint), builds the package (rpm/build.sh), and checks
#   - that it holds the files of the .deb, byte for byte and with the same modes, but for the
#     places each distribution wants (zsh completions, the license and the Debian docs);
#   - that `make install DESTDIR=... PREFIX=/usr` (for SLES, Arch, any other distribution)
#     gives the same files as the .rpm;
#   - that its binary is a static-pie (packaging/portable.sh), and its Requires name no
#     library;
#   - rpmlint: no error and no warning but those rpm/vgpu-license-agent.rpmlintrc explains;
#   - an install, an upgrade (a second release) and an erase with `rpm --root` into an empty
#     root: the files and their modes (rpm -V), a changed config.toml kept across the upgrade
#     and left as .rpmsave by the erase, and nothing else left behind.
# The scriptlets run in deb/boot-test.sh's booted guest, where systemd runs: an empty root
# has no shell to run them. Every check runs even when an earlier one failed; the script
# exits non-zero if any failed, and says which. Set VGPU_RPM_SKIP_BUILD=1 to check an already
# built package.
set -uo pipefail
# No `cmd | grep -q` below: with pipefail, grep's early exit fails cmd with SIGPIPE.

APT_PACKAGES=(rpm rpmlint cpio gnupg shellcheck dpkg-dev binutils make)

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=packaging/portable.sh
. packaging/portable.sh
# shellcheck source=packaging/check-lib.sh
. packaging/check-lib.sh

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# scriptlets: the package's scriptlets, one file each, as rpm runs them (with /bin/sh).
extract_scriptlets() {
	local tag
	mkdir -p "$WORK/scriptlets"
	for tag in PREIN POSTIN PREUN POSTUN; do
		rpm -qp --qf "%{$tag}" "$RPM" >"$WORK/scriptlets/$tag"
		[ "$(cat "$WORK/scriptlets/$tag")" = "(none)" ] && rm "$WORK/scriptlets/$tag"
	done
	true
}

check_shellcheck() {
	local scripts=(rpm/build.sh rpm/check.sh packaging/build-release.sh packaging/install.sh packaging/portable.sh packaging/check-lib.sh)
	shellcheck -x --severity=style "${scripts[@]}" || return 1
	extract_scriptlets
	echo "scriptlets: $(ls "$WORK/scriptlets")"
	shellcheck --shell=sh --severity=style "$WORK"/scriptlets/*
}

# unpack PACKAGE DIR: unpacks PACKAGE (.deb or .rpm) into DIR.
unpack() {
	mkdir -p "$2"
	case $1 in
	*.deb) dpkg-deb -x "$1" "$2" ;;
	*.rpm) rpm2cpio "$1" | (cd "$2" && cpio -idm --quiet) ;;
	esac
}
# listing DIR: "mode path" of every file and link under DIR, with the places that differ by
# distribution (and only those) written as one; the documents and the .deb's lintian
# overrides are compared on their own, or not at all.
listing() {
	(cd "$1" && find . ! -type d -printf '%M %P\n') |
		sed -e 's#usr/share/zsh/vendor-completions/#ZSH_COMPLETIONS/#' \
			-e 's#usr/share/zsh/site-functions/#ZSH_COMPLETIONS/#' |
		grep -v -e " usr/share/doc/$NAME/" -e " usr/share/licenses/$NAME/" -e " usr/share/lintian/" | LC_ALL=C sort
}

check_same_files_as_deb() {
	local deb rc=0 f
	deb=$TARGET_DIR/debian/${NAME}_$(dpkg-parsechangelog -l deb/changelog -S Version)_$(dpkg --print-architecture).deb
	# Packed from the same target/dist as the .rpm (builds are reproducible: the same bytes).
	VGPU_DEB_SKIP_CARGO_BUILD=1 bash deb/build.sh >/dev/null || return 1
	unpack "$deb" "$WORK/deb" && unpack "$RPM" "$WORK/rpm" || return 1
	diff -u <(listing "$WORK/deb") <(listing "$WORK/rpm") || {
		echo "the .deb (-) and the .rpm (+) do not hold the same files" >&2
		rc=1
	}
	while read -r _ f; do
		[[ $f == ZSH_COMPLETIONS/* ]] && continue
		cmp "$WORK/deb/$f" "$WORK/rpm/$f" || rc=1
	done < <(listing "$WORK/rpm")
	cmp "$WORK/deb/usr/share/zsh/vendor-completions/_$NAME" "$WORK/rpm/usr/share/zsh/site-functions/_$NAME" || rc=1
	# The documents (docs, dashboard, cloud-init examples) are in both, the same bytes; the
	# .deb's own changelog.gz and copyright are its alone.
	diff -u <(cd "$WORK/deb/usr/share/doc/$NAME" && find . -type f ! -name changelog.gz ! -name copyright | LC_ALL=C sort) \
		<(cd "$WORK/rpm/usr/share/doc/$NAME" && find . -type f | LC_ALL=C sort) || {
		echo "the .deb (-) and the .rpm (+) do not hold the same documents" >&2
		rc=1
	}
	for f in install.md fleet.md kubevirt.md; do
		cmp "$WORK/deb/usr/share/doc/$NAME/$f" "$WORK/rpm/usr/share/doc/$NAME/$f" || rc=1
	done
	for f in "$NAME.toml.5.gz" "$NAME-run.8.gz"; do
		[ -f "$WORK/rpm/usr/share/man/man${f: -4:1}/$f" ] || {
			echo "no man page $f" >&2
			rc=1
		}
	done
	[ -f "$WORK/rpm/usr/share/licenses/$NAME/LICENSE" ] || {
		echo "no license file" >&2
		rc=1
	}
	[ -f "$WORK/rpm/usr/share/man/man8/$NAME.8.gz" ] || {
		echo "no man page for the binary" >&2
		rc=1
	}
	[ $rc = 0 ] && echo "$(listing "$WORK/rpm" | wc -l) files, the same as the .deb's"
	return $rc
}

# `make install` for other distributions: with PREFIX=/usr, exactly the .rpm's files, modes and
# bytes; with PREFIX=/usr/local, the unit starts the binary where it went.
check_make_install() {
	local rc=0 unit
	[ -d "$WORK/rpm" ] || unpack "$RPM" "$WORK/rpm" || return 1
	make -s install DESTDIR="$WORK/make-usr" PREFIX=/usr || return 1
	diff -u <(listing "$WORK/rpm") <(listing "$WORK/make-usr") || {
		echo "make install PREFIX=/usr (+) differs from the .rpm (-)" >&2
		rc=1
	}
	diff -r "$WORK/rpm" "$WORK/make-usr" || rc=1
	make -s install DESTDIR="$WORK/make-local" PREFIX=/usr/local || return 1
	unit=$WORK/make-local/usr/local/lib/systemd/system/$NAME.service
	grep -qx "ExecStart=/usr/local/bin/$NAME run" "$unit" || {
		echo "PREFIX=/usr/local: the unit does not start /usr/local/bin/$NAME:" >&2
		grep '^ExecStart=' "$unit" >&2
		rc=1
	}
	[ -x "$WORK/make-local/usr/local/bin/$NAME" ] && [ -f "$WORK/make-local/etc/$NAME/config.toml" ] || rc=1
	return $rc
}

check_static_binary() {
	local libs
	[ -d "$WORK/rpm" ] || unpack "$RPM" "$WORK/rpm" || return 1
	check_static "$WORK/rpm/usr/bin/$NAME" || return 1
	libs=$(rpm -qp --requires "$RPM" | grep -E '\.so|GLIBC')
	echo "libraries in Requires: ${libs:-none}"
	[ -z "$libs" ]
}

# rpmlint of the package and of the spec it was built from, at once (a filter that matches
# nothing in the run is itself an error). rpmlint reports a package without a signature as an
# error: signing is the publisher's step, with the publisher's key (rpm/build.sh signs with
# $VGPU_RPM_GPG_NAME's). The package linted here is a copy signed with a key made for the
# check, which also shows that the package can be signed and the signature verified.
check_rpmlint() {
	local signed=$WORK/signed out rc
	export GNUPGHOME=$WORK/gnupg
	mkdir -p "$GNUPGHOME" "$signed" && chmod 0700 "$GNUPGHOME" || return 1
	gpg --batch --quiet --passphrase '' --quick-gen-key "$NAME check <check@invalid>" rsa3072 sign never &&
		gpg --batch --quiet --armor --export "$NAME check" >"$WORK/check.asc" || return 1
	cp "$RPM" "$signed/" || return 1
	rpmsign --addsign --define "__gpg $(command -v gpg)" --define "_gpg_name $NAME check" \
		"$signed/${RPM##*/}" </dev/null || return 1
	# Debian's rpm keeps its database in ~/.rpmdb: a HOME of the check's own keeps the key
	# out of root's.
	HOME=$WORK/home rpm --import "$WORK/check.asc" || return 1
	HOME=$WORK/home rpm -K "$signed/${RPM##*/}" || return 1
	out=$(HOME=$WORK/home rpmlint -c rpm/rpmlint.toml -r rpm/$NAME.rpmlintrc "$signed/${RPM##*/}" "$SPEC" 2>&1)
	rc=$?
	echo "$out"
	[ $rc = 0 ] || return 1
	# rpmlint exits 0 with warnings left: none may be.
	grep -q ' 0 errors, 0 warnings' <<<"$out"
}

# rpm in the empty root, with the database where RHEL and SLES keep it. Debian's rpm warns
# at every install or erase that Debian's packages are dpkg's: not so in that root.
rpmr() {
	local rc
	rpm --root "$ROOT_FS" --dbpath /var/lib/rpm "$@" 2>"$WORK/rpm.err"
	rc=$?
	grep -v -e 'use Alien instead' -e 'you know what you are doing' "$WORK/rpm.err" >&2
	return $rc
}
# leftovers: what is in the root besides the rpm database.
leftovers() { (cd "$ROOT_FS" && find . -path ./var/lib/rpm -prune -o ! -type d -printf '%P\n' | LC_ALL=C sort); }
owned_dirs_left() { (cd "$ROOT_FS" && find . -type d -name "*$NAME*" -printf '%P\n' | LC_ALL=C sort); }

check_modes() {
	local mode path rc=0
	while read -r mode path; do
		[ "$(stat -c %A "$ROOT_FS$path")" = "$mode" ] || {
			echo "$path: $(stat -c %A "$ROOT_FS$path"), not $mode" >&2
			rc=1
		}
	done < <(rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$RPM")
	return $rc
}

check_round_trip() {
	local rc=0 out left config=/etc/$NAME/config.toml admin_dir=/etc/$NAME/config.d
	ROOT_FS=$WORK/root
	mkdir -p "$ROOT_FS"
	echo "--- rpm -i into an empty root"
	rpmr -i --nodeps --noscripts "$RPM" || rc=1
	rpmr -q "$NAME" || return 1
	out=$(rpmr -V --nodeps "$NAME") || {
		echo "rpm -V after install: $out" >&2
		rc=1
	}
	check_modes || rc=1
	"$ROOT_FS/usr/bin/$NAME" --version || rc=1

	echo "--- the admin changes config.toml; rpm -U to release 2"
	echo "# changed by the admin" >>"$ROOT_FS$config"
	rpmr -U --nodeps --noscripts "$RPM2" || rc=1
	[ "$(rpmr -q "$NAME")" = "$(rpm -qp "$RPM2")" ] || {
		echo "not upgraded: $(rpmr -q "$NAME")" >&2
		rc=1
	}
	grep -q '^# changed by the admin$' "$ROOT_FS$config" || {
		echo "the upgrade replaced the admin's config.toml" >&2
		rc=1
	}
	out=$(rpmr -V --nodeps "$NAME")
	echo "rpm -V: $out"
	[ "$(tr -s ' ' <<<"$out")" = "S.5....T. c $config" ] || {
		echo "rpm -V after the upgrade should report only the changed config" >&2
		rc=1
	}
	check_modes || rc=1

	echo "--- an admin's own drop-in beside the package's files; rpm -e"
	mkdir -p "$ROOT_FS$admin_dir"
	printf '[service]\nmode = "observe"\n' >"$ROOT_FS$admin_dir/60-admin.toml"
	rpmr -e --nodeps --noscripts "$NAME" || rc=1
	left=$(leftovers)
	[ "$left" = "$(printf '%s\n%s' "${admin_dir#/}/60-admin.toml" "${config#/}.rpmsave")" ] || {
		echo "after erase, expected only the admin's drop-in and etc/$NAME/config.toml.rpmsave, found:" >&2
		echo "$left" >&2
		rc=1
	}
	[ "$(owned_dirs_left)" = "etc/$NAME" ] || {
		echo "directories of the package left: $(owned_dirs_left)" >&2
		rc=1
	}

	echo "--- rpm -i, rpm -e without a change: nothing is left"
	rm -f "$ROOT_FS$config.rpmsave" "$ROOT_FS$admin_dir/60-admin.toml"
	rmdir "$ROOT_FS$admin_dir" "$ROOT_FS/etc/$NAME"
	rpmr -i --nodeps --noscripts "$RPM" || rc=1
	rpmr -e --nodeps --noscripts "$NAME" || rc=1
	left=$(leftovers)
	[ -z "$left$(owned_dirs_left)" ] || {
		echo "left behind after erase: $left $(owned_dirs_left)" >&2
		rc=1
	}
	if rpmr -q "$NAME" >/dev/null 2>&1; then
		echo "rpm still knows $NAME after erase" >&2
		rc=1
	fi
	return $rc
}

banner "apt packages: ${APT_PACKAGES[*]}"
install_missing_packages || {
	echo "FAILED: cannot install the packages the checks need" >&2
	exit 1
}

VERSION=$(cargo pkgid --quiet | sed 's/.*[#@]//')
if [ "${VGPU_RPM_SKIP_BUILD:-0}" != 1 ]; then
	banner "build (rpm/build.sh)"
	bash rpm/build.sh || {
		echo "FAILED: rpm/build.sh" >&2
		exit 1
	}
fi
RPM=$TARGET_DIR/rpm/$NAME-$VERSION-1.x86_64.rpm
SPEC=$TARGET_DIR/rpm/$NAME.spec
for f in "$RPM" "$SPEC"; do
	[ -f "$f" ] || {
		echo "FAILED: $f is missing" >&2
		exit 1
	}
done
banner "build release 2 (for the upgrade)"
VGPU_RPM_SKIP_CARGO_BUILD=1 VGPU_RPM_RELEASE=2 VGPU_RPM_OUT_DIR=$WORK/release2 bash rpm/build.sh || {
	echo "FAILED: rpm/build.sh of release 2" >&2
	exit 1
}
RPM2=$WORK/release2/$NAME-$VERSION-2.x86_64.rpm

banner "package"
rpm -qpi "$RPM"
rpm -qp --requires "$RPM"
rpm -qplv "$RPM"

check "shellcheck (scripts and the package's scriptlets)" check_shellcheck
check "the same files as the .deb" check_same_files_as_deb
check "make install DESTDIR=... PREFIX=/usr gives the .rpm's files; PREFIX=/usr/local" check_make_install
check "a static-pie binary, no library in Requires" check_static_binary
check "rpmlint: every error and warning explained" check_rpmlint
check "rpm --root: install, upgrade, erase" check_round_trip

summary
