#!/bin/bash
# CI checks of the Debian package, the systemd unit and the alert rules:
#
#   bash deb/check.sh
#
# Runs as root on a throwaway Debian bookworm machine: it installs the apt packages it needs,
# builds the package (deb/build.sh), and installs and purges it on this machine. Every check
# runs even when an earlier one failed; the script exits non-zero if any failed, and says
# which. Set VGPU_DEB_SKIP_BUILD=1 to check an already built package.
set -uo pipefail
# No `cmd | grep -q` below: with pipefail, grep's early exit fails cmd with SIGPIPE.

# Debian packages the checks need (cargo/rustc come from the CI image; deb/build.sh installs
# the zig toolchain from PyPI).
APT_PACKAGES=(lintian prometheus systemd shellcheck dpkg-dev man-db binutils)
MAX_EXPOSURE=2.5

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
UNIT=packaging/$NAME.service
# Every unit of the package runs as root: each is held to MAX_EXPOSURE.
UNITS=("$UNIT" "packaging/$NAME-identity.service" "packaging/$NAME-wait-licensed.service")
# shellcheck source=packaging/portable.sh
. packaging/portable.sh
# shellcheck source=packaging/check-lib.sh
. packaging/check-lib.sh

check_shellcheck() {
	local scripts=(deb/build.sh deb/check.sh deb/boot-test.sh deb/postinst deb/prerm deb/postrm)
	# -x: the scripts source packaging/portable.sh.
	shellcheck -x --severity=style "${scripts[@]}"
}

check_rules() {
	promtool check rules packaging/$NAME.rules.yml && (cd deb && promtool test rules alert-rules.test.yml)
}

check_security() {
	local out level unit rc=0
	for unit in "${UNITS[@]}"; do
		out=$(systemd-analyze security --offline=true --no-pager "$unit") || {
			rc=1
			continue
		}
		echo "$out"
		level=$(echo "$out" | sed -n 's/^→ Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p')
		[ -n "$level" ] || {
			echo "$unit: no exposure level in the output" >&2
			rc=1
			continue
		}
		echo "$unit: exposure $level (limit $MAX_EXPOSURE)"
		awk -v l="$level" -v max="$MAX_EXPOSURE" 'BEGIN { exit !(l <= max) }' || rc=1
	done
	return $rc
}

check_catalog() {
	local tmp rc=0 id
	tmp=$(mktemp -d)
	install -D -m 0644 packaging/$NAME.catalog "$tmp/usr/lib/systemd/catalog/$NAME.catalog"
	journalctl --root="$tmp" --update-catalog || rc=1
	while read -r id; do
		grep -q "^$id " <<<"$(journalctl --root="$tmp" --list-catalog "$id")" || {
			echo "catalog entry $id did not compile" >&2
			rc=1
		}
	done < <(sed -n 's/^-- \([0-9a-f]\{32\}\)$/\1/p' packaging/$NAME.catalog)
	rm -rf "$tmp"
	return $rc
}

# The packaged binary is a static-pie (packaging/portable.sh), and Depends asks for no
# library: the binary needs none.
check_static_binary() {
	local tmp rc=0 depends
	tmp=$(mktemp -d)
	dpkg-deb --fsys-tarfile "$DEB" | tar -x -C "$tmp" ./usr/bin/$NAME || rc=1
	check_static "$tmp/usr/bin/$NAME" || rc=1
	depends=$(dpkg-deb -f "$DEB" Depends)
	echo "Depends: $depends"
	case ", $depends," in
	*", libc6"*)
		echo "Depends asks for libc6, which the binary does not use" >&2
		rc=1
		;;
	esac
	rm -rf "$tmp"
	return $rc
}

check_lintian() {
	lintian --pedantic --display-info --fail-on error,warning,pedantic "$DEB"
}

# Files and directories outside the volatile areas: before install and after purge, they must
# be the same.
snapshot() {
	find /etc /usr /var /run /opt \
		\( -path /var/lib/dpkg -o -path /var/log -o -path /var/cache -o -path /var/tmp \
		-o -path /var/lib/apt -o -path /var/lib/systemd/catalog -o -path /run/user \
		-o -path /var/lib/lintian -o -path /run/systemd/transient -o -path /run/systemd/units \
		-o -path /var/lib/systemd/timers -o -path /var/lib/systemd/coredump \
		-o -path /run/systemd/journal -o -path /var/lib/prometheus/metrics2 \) -prune -o -print 2>/dev/null |
		LC_ALL=C sort
}

check_installed() {
	local rc=0 installed=/usr/lib/systemd/system/$NAME.service verify unit doc
	[ "$(dpkg-query -W -f='${Status}' "$NAME" 2>/dev/null)" = "install ok installed" ] || {
		echo "not installed" >&2
		return 1
	}
	"/usr/bin/$NAME" --version || rc=1
	# verify needs the unit's ExecStart binary and its Documentation= man page: both come
	# from the package just installed.
	verify=$(systemd-analyze verify "$installed" 2>&1) || rc=1
	if [ -n "$verify" ]; then
		echo "systemd-analyze verify $installed:" >&2
		echo "$verify" >&2
		rc=1
	fi
	for unit in "$NAME-wait-licensed.service" vgpu-licensed.target; do
		verify=$(systemd-analyze verify "/usr/lib/systemd/system/$unit" 2>&1) || rc=1
		if [ -n "$verify" ]; then
			echo "systemd-analyze verify $unit:" >&2
			echo "$verify" >&2
			rc=1
		fi
	done
	# Nothing of the default boot waits for the license: neither the target nor its wait can
	# be enabled, and the install enabled neither.
	for unit in vgpu-licensed.target "$NAME-wait-licensed.service"; do
		if grep -q '^\[Install\]' "/usr/lib/systemd/system/$unit" ||
			[ -n "$(find /etc/systemd/system -name "$unit" 2>/dev/null)" ]; then
			echo "$unit can be, or is, enabled: the boot would wait for the license" >&2
			rc=1
		fi
	done
	man -w "$NAME" || rc=1
	man -w 8 "$NAME-run" || rc=1
	man -w 5 "$NAME.toml" || rc=1
	for doc in install.md fleet.md kubevirt.md vgpu-license-fleet.json user-data-write-files.yaml; do
		[ -f "/usr/share/doc/$NAME/$doc" ] || {
			echo "/usr/share/doc/$NAME/$doc is missing" >&2
			rc=1
		}
	done
	[ -e "/etc/systemd/system/multi-user.target.wants/$NAME.service" ] || {
		echo "the unit is not enabled" >&2
		rc=1
	}
	grep -q "$NAME" <<<"$(journalctl --list-catalog)" || {
		echo "the catalog is not in journald's database (systemd's dpkg trigger)" >&2
		rc=1
	}
	[ -d /var/lib/$NAME ] || {
		echo "tmpfiles.d did not create /var/lib/$NAME" >&2
		rc=1
	}
	return $rc
}

# dpkg -P of the installed package with config drop-ins beside it: the one the project's
# cloud-init user-data writes goes with the package, an admin's own stays (with its
# directories), as Debian keeps what the admin added. The admin's is then removed by hand, as
# an admin would, so that nothing else may be left.
purge_keeps_admin_drop_ins() {
	local rc=0 etc=/etc/$NAME admin=/etc/$NAME/config.d/60-admin.toml
	mkdir -p "$etc/config.d"
	printf '[service]\nmode = "observe"\n' >"$admin"
	printf '[gridd]\nfeature_type = 1\n' >"$etc/config.d/50-cloud-init.toml"
	dpkg -P "$NAME" || rc=1
	if [ "$(cat "$admin" 2>/dev/null)" != "$(printf '[service]\nmode = "observe"')" ]; then
		echo "dpkg -P removed or changed the admin's $admin" >&2
		rc=1
	fi
	if [ -e "$etc/config.d/50-cloud-init.toml" ] || [ -e "$etc/config.toml" ]; then
		echo "dpkg -P left the package's own config in $etc: $(ls -A "$etc" "$etc/config.d")" >&2
		rc=1
	fi
	rm -f "$admin"
	rmdir "$etc/config.d" "$etc" || rc=1
	return $rc
}

check_install_purge() {
	local before after rc=0 new_paths leftovers others
	before=$(snapshot)
	dpkg -i "$DEB" || return 1
	check_installed || rc=1
	echo "--- dpkg -i again (reinstall of the same version)"
	dpkg -i "$DEB" || rc=1
	echo "--- dpkg -r, dpkg -i, dpkg -P"
	dpkg -r "$NAME" || rc=1
	dpkg -i "$DEB" || rc=1
	check_installed || rc=1
	purge_keeps_admin_drop_ins || rc=1
	after=$(snapshot)
	# New paths of ours fail the check; others (daemons of the CI machine at work) are shown.
	new_paths=$(comm -13 <(echo "$before") <(echo "$after"))
	leftovers=$(echo "$new_paths" | grep -i -e vgpu -e "$NAME" || true)
	others=$(echo "$new_paths" | grep -v -i -e vgpu -e "$NAME" || true)
	if [ -n "$others" ]; then
		echo "note: new paths since the install that are not the package's:"
		echo "$others"
	fi
	if [ -n "$leftovers" ]; then
		echo "left behind after purge:" >&2
		echo "$leftovers" >&2
		rc=1
	fi
	if dpkg -s "$NAME" >/dev/null 2>&1; then
		echo "dpkg still knows $NAME after purge" >&2
		rc=1
	fi
	return $rc
}

metrics_pass() {
	local metrics
	metrics=$("$1" analyze --journal "$2" --metrics) || return 1
	echo "$metrics"
	promtool check metrics <<<"$metrics"
}

# The agent's own metrics output (`analyze --metrics`, the packaged release binary), checked
# by promtool.
check_metrics() {
	local bin=$TARGET_DIR/dist/$NAME sample rc=0
	[ -x "$bin" ] || {
		echo "$bin is missing (deb/build.sh builds it)" >&2
		return 1
	}
	sample=$(mktemp)
	cat >"$sample" <<'LOG'
Mar 03 10:00:01 vm nvidia-gridd[901]: Started (901)
Mar 03 10:00:02 vm nvidia-gridd[901]: Acquiring license. (Info: dls.example.com; NVIDIA Virtual Compute Server)
Mar 03 10:00:03 vm nvidia-gridd[901]: Failed to acquire license from dls.example.com (Info: NVIDIA Virtual Compute Server - Error: Clock windback has been detected)
Mar 03 10:05:03 vm nvidia-gridd[901]: License acquired successfully. (Info: dls.example.com, NVIDIA Virtual Compute Server; Expiry: 2030-3-4 10:5:3 GMT)
LOG
	metrics_pass "$bin" "$sample" || rc=1
	rm -f "$sample"
	return $rc
}

banner "apt packages: ${APT_PACKAGES[*]}"
install_missing_packages || {
	echo "FAILED: cannot install the packages the checks need" >&2
	exit 1
}

check "shellcheck" check_shellcheck

if [ "${VGPU_DEB_SKIP_BUILD:-0}" != 1 ]; then
	banner "build (deb/build.sh)"
	bash deb/build.sh || {
		echo "FAILED: deb/build.sh" >&2
		exit 1
	}
fi
VERSION=$(dpkg-parsechangelog -l deb/changelog -S Version)
DEB=$TARGET_DIR/debian/${NAME}_${VERSION}_$(dpkg --print-architecture).deb
[ -f "$DEB" ] || {
	echo "FAILED: $DEB is missing" >&2
	exit 1
}
banner "package contents"
dpkg-deb -I "$DEB"
dpkg-deb -c "$DEB"

check "a static-pie binary, no library in Depends" check_static_binary
check "lintian --pedantic" check_lintian
check "promtool check rules + test rules" check_rules
check "systemd-analyze security (exposure <= $MAX_EXPOSURE)" check_security
check "journald catalog compiles" check_catalog
check "dpkg -i / -r / -P, systemd-analyze verify, nothing left behind" check_install_purge
check "promtool check metrics (analyze --metrics)" check_metrics

summary
