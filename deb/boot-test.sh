#!/bin/bash
# Boot test of the package in a real systemd guest (issue 5):
#
#   bash deb/boot-test.sh [PACKAGE.deb]      (default: the one deb/build.sh made)
#
# debootstrap (minbase bookworm, with systemd, dbus, ca-certificates), dpkg -i of the
# package in the chroot (no systemd runs there: the unit must be enabled, not started), then
# boot the tree with systemd-nspawn -b and check from inside with the guest's own systemctl
# and journalctl (nsenter into the guest's pid 1). Runs as root on a throwaway machine.
#
# Exit: 0 passed, 1 failed, 77 skipped (nspawn or debootstrap cannot run here; said loudly,
# never counted as passed). BOOT_TEST_KEEP=1 keeps the guest tree and its console log.
set -uo pipefail

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SUITE=bookworm
MIRROR=${BOOT_TEST_MIRROR:-http://deb.debian.org/debian}
BOOT_TIMEOUT=120
FAILED=()
SKIPPED=()

banner() { printf '\n======== %s ========\n' "$*"; }
skip_all() {
	echo "!!!!!!!! SKIPPED: boot test: $* !!!!!!!!" >&2
	exit 77
}
fail() {
	echo "FAILED: $*" >&2
	FAILED+=("$*")
}
skip() {
	echo "!!!!!!!! SKIPPED: $* !!!!!!!!" >&2
	SKIPPED+=("$*")
}
check() {
	local name=$1
	shift
	banner "$name"
	if "$@"; then echo "ok: $name"; else fail "$name"; fi
}

DEB=${1:-$TARGET_DIR/debian/${NAME}_$(dpkg-parsechangelog -l "$ROOT/deb/changelog" -S Version)_$(dpkg --print-architecture).deb}
[ -f "$DEB" ] || {
	echo "FAILED: no package at $DEB (run deb/build.sh)" >&2
	exit 1
}
[ "$(id -u)" = 0 ] || skip_all "needs root"
for tool in debootstrap systemd-nspawn nsenter; do
	command -v "$tool" >/dev/null || skip_all "$tool is missing (apt-get install debootstrap systemd-container util-linux)"
done

WORK=$(mktemp -d /var/tmp/$NAME-boot.XXXXXX)
GUEST=$WORK/root
NSPAWN_PID=
LEADER=
cleanup() {
	if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
		[ -n "$LEADER" ] && nsenter -t "$LEADER" -a systemctl poweroff --no-block >/dev/null 2>&1
		for _ in $(seq 30); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 1; done
		kill "$NSPAWN_PID" 2>/dev/null
		wait "$NSPAWN_PID" 2>/dev/null
	fi
	if [ "${BOOT_TEST_KEEP:-0}" = 1 ]; then
		echo "kept: $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT

# guest COMMAND...: runs COMMAND inside the booted guest, in all its namespaces.
guest() { nsenter -t "$LEADER" -a "$@"; }

banner "debootstrap $SUITE"
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,ca-certificates \
	"$SUITE" "$GUEST" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
	tail -20 "$WORK/debootstrap.log" >&2
	skip_all "debootstrap failed (no mirror reachable?)"
}
echo "$NAME-boot" >"$GUEST/etc/hostname"

banner "dpkg -i in the chroot (no running systemd: enable, do not start)"
cp "$DEB" "$GUEST/tmp/"
chroot "$GUEST" dpkg -i "/tmp/$(basename "$DEB")" || fail "dpkg -i in the chroot"
[ -L "$GUEST/etc/systemd/system/multi-user.target.wants/$NAME.service" ] ||
	fail "the unit is not enabled after dpkg -i in the chroot"

# A stand-in nvidia-gridd unit for the sandbox probe below.
# (The simulator's nvidia-gridd and nvidia-smi replace it for the agent checks.)
cat >"$GUEST/etc/systemd/system/nvidia-gridd.service" <<'UNIT'
[Unit]
Description=stand-in nvidia-gridd (boot test)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/nvidia-gridd.service "$GUEST/etc/systemd/system/multi-user.target.wants/nvidia-gridd.service"
mkdir -p "$GUEST/etc/nvidia" "$GUEST/var/lib/prometheus/node-exporter"

banner "boot: systemd-nspawn -b --register=no --keep-unit"
systemd-nspawn -b -D "$GUEST" --register=no --keep-unit --console=read-only \
	>"$WORK/console.log" 2>&1 &
NSPAWN_PID=$!
for _ in $(seq 30); do
	LEADER=$(ps -o pid= --ppid "$NSPAWN_PID" 2>/dev/null | head -1 | tr -d ' ')
	[ -n "$LEADER" ] && break
	kill -0 "$NSPAWN_PID" 2>/dev/null || break
	sleep 1
done
if [ -z "$LEADER" ]; then
	tail -30 "$WORK/console.log" >&2
	skip_all "systemd-nspawn could not boot the guest on this machine"
fi
echo "guest pid 1 is $LEADER"
STATE=$(timeout "$BOOT_TIMEOUT" nsenter -t "$LEADER" -a systemctl is-system-running --wait 2>&1)
echo "is-system-running: $STATE"
case "$STATE" in
running | degraded) ;;
*)
	tail -30 "$WORK/console.log" >&2
	skip_all "the guest's systemd did not answer is-system-running (got: ${STATE:-nothing})"
	;;
esac

check_unit_loaded() {
	guest systemctl is-enabled "$NAME.service" &&
		[ "$(guest systemctl show -P LoadState "$NAME.service")" = loaded ] &&
		[ "$(guest systemctl show -P Type "$NAME.service")" = notify ] &&
		[ "$(guest systemctl show -P ProtectSystem "$NAME.service")" = strict ]
}
check "the unit is enabled and loaded in the guest" check_unit_loaded

# The agent's sandbox lets it do its job: a copy of the unit, same hardening, runs a probe
# that restarts nvidia-gridd through systemctl, reads the journal and writes where the agent
# writes, and cannot write elsewhere.
check_sandbox() {
	cat >"$GUEST/usr/local/bin/sandbox-probe" <<'PROBE'
#!/bin/sh
set -e
before=$(systemctl show -P MainPID nvidia-gridd.service)
systemctl restart nvidia-gridd.service
after=$(systemctl show -P MainPID nvidia-gridd.service)
[ "$before" != "$after" ] && [ "$after" != 0 ]
journalctl -n 1 -u nvidia-gridd.service --no-pager >/dev/null
for d in /etc/nvidia /var/lib/prometheus/node-exporter /var/lib/vgpu-license-agent /run/vgpu-license-agent; do
	echo probe >"$d/.probe" && chmod 0744 "$d/.probe" && rm "$d/.probe"
done
if touch /etc/.probe 2>/dev/null; then echo "/etc is writable" >&2; exit 1; fi
echo SANDBOX-PROBE-OK
PROBE
	chmod 0755 "$GUEST/usr/local/bin/sandbox-probe"
	sed -e 's#^ExecStart=.*#ExecStart=/usr/local/bin/sandbox-probe#' -e 's/^Type=notify/Type=oneshot/' \
		-e '/^WatchdogSec=/d;/^Restart/d;/^ExecReload=/d;/^\[Install\]/,$d' \
		"$GUEST/usr/lib/systemd/system/$NAME.service" >"$GUEST/etc/systemd/system/sandbox-probe.service"
	guest systemctl daemon-reload &&
		guest systemctl start sandbox-probe.service &&
		grep -q SANDBOX-PROBE-OK <<<"$(guest journalctl -u sandbox-probe.service --no-pager -o cat)"
	local rc=$?
	[ $rc = 0 ] || guest journalctl -u sandbox-probe.service --no-pager -o cat | tail -20
	rm -f "$GUEST/etc/systemd/system/sandbox-probe.service" "$GUEST/usr/local/bin/sandbox-probe"
	guest systemctl daemon-reload
	return $rc
}
check "the unit's sandbox allows systemctl restart, journal reads and the agent's writes" check_sandbox

# journalctl -x explains the agent's messages: inject one with a catalog MESSAGE_ID (the one
# of clock_skew) as the agent would log it.
check_catalog() {
	local id
	id=$(sed -n '/^-- /{s/^-- //;h};/^Subject: .*clock_skew/{g;p;q}' "$ROOT/packaging/$NAME.catalog")
	[ -n "$id" ] || return 1
	printf 'MESSAGE_ID=%s\nMESSAGE=boot test: injected clock_skew failure\nSYSLOG_IDENTIFIER=%s\n' \
		"$id" "$NAME" | guest logger --journald
	sleep 1
	local out
	out=$(guest journalctl -x --no-pager MESSAGE_ID="$id")
	echo "$out"
	grep -q 'Synchronize the clock' <<<"$out"
}
check "journalctl -x shows the catalog's explanation" check_catalog

# The agent itself (needs the service `run` and the simulator's nvidia-gridd/nvidia-smi):
# active; it restarted the real nvidia-gridd unit; `systemctl status` shows its STATUS= line;
# `vgpu-license-agent status --wait 60` exits 0 once licensed; a token dropped as cloud-init's
# write_files would (wrong mode on purpose) is fixed; an injected failure is explained.
agent_checks() {
	skip "agent checks in the guest: the service (run) and the simulator are not in this build"
}
agent_checks

check_purge() {
	DEBIAN_FRONTEND=noninteractive guest apt-get purge -y -q "$NAME" || return 1
	local left
	left=$(guest find / -xdev \( -path /proc -o -path /sys -o -path /var/log -o -path /var/cache -o -path /var/lib/dpkg \) -prune -o \
		\( -name "*vgpu-license-agent*" -o -name "*vgpu_license_agent*" \) -print 2>/dev/null)
	if [ -n "$left" ]; then
		echo "left behind after purge:" >&2
		echo "$left" >&2
		return 1
	fi
	! guest dpkg -s "$NAME" >/dev/null 2>&1
}
check "apt-get purge in the running guest leaves nothing behind" check_purge

banner "summary"
for s in "${SKIPPED[@]}"; do echo "SKIPPED: $s"; done
if [ ${#FAILED[@]} -gt 0 ]; then
	for f in "${FAILED[@]}"; do echo "FAILED: $f"; done
	exit 1
fi
[ ${#SKIPPED[@]} -eq 0 ] || {
	echo "boot test: parts skipped (see above): not a full pass"
	exit 77
}
echo "boot test passed"
