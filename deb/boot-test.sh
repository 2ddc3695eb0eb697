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
# Exit: 0 passed, 1 failed, 77 skipped. A skip, said loudly and never counted as passed, is
# only for a machine that cannot run the test or a part of it: not root, a tool missing, no
# mirror, a guest whose systemd never starts, no cargo to build the simulator. Once the
# guest's systemd answers, every problem is a failure: a boot that never finishes (a unit
# that hangs it) included. With VGPU_TESTS_NO_SKIP=1 (CI) a skip is a failure too.
# BOOT_TEST_KEEP=1 keeps the guest tree and its console log.
set -uo pipefail

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SUITE=bookworm
MIRROR=${BOOT_TEST_MIRROR:-http://deb.debian.org/debian}
BOOT_TIMEOUT=120
FAILED=()
SKIPPED=()

NO_SKIP=${VGPU_TESTS_NO_SKIP:-0}

banner() { printf '\n======== %s ========\n' "$*"; }
skip_all() {
	if [ "$NO_SKIP" = 1 ]; then
		echo "FAILED: boot test: cannot run here: $* (VGPU_TESTS_NO_SKIP=1: a skip is a failure)" >&2
		exit 1
	fi
	echo "!!!!!!!! SKIPPED: boot test: $* !!!!!!!!" >&2
	exit 77
}
fail() {
	echo "FAILED: $*" >&2
	FAILED+=("$*")
}
skip() {
	if [ "$NO_SKIP" = 1 ]; then
		fail "cannot run here: $* (VGPU_TESTS_NO_SKIP=1: a skip is a failure)"
		return
	fi
	echo "!!!!!!!! SKIPPED: $* !!!!!!!!" >&2
	SKIPPED+=("$*")
}
check() {
	local name=$1
	shift
	banner "$name"
	if "$@"; then echo "ok: $name"; else fail "$name"; fi
}
# summary: says what failed and what was skipped; returns the exit status of the test.
summary() {
	banner "summary"
	for s in "${SKIPPED[@]}"; do echo "SKIPPED: $s"; done
	if [ ${#FAILED[@]} -gt 0 ]; then
		for f in "${FAILED[@]}"; do echo "FAILED: $f"; done
		return 1
	fi
	[ ${#SKIPPED[@]} -eq 0 ] || {
		echo "boot test: parts skipped (see above): not a full pass"
		return 77
	}
	echo "boot test passed"
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
# The guest's pid 1 is the child of nspawn in a pid namespace of its own (nspawn's first child
# is a short-lived helper in ours: nsentering it races its exit).
HOST_PIDNS=$(readlink "/proc/$NSPAWN_PID/ns/pid")
for _ in $(seq 60); do
	for p in $(ps -o pid= --ppid "$NSPAWN_PID" 2>/dev/null); do
		ns=$(readlink "/proc/$p/ns/pid" 2>/dev/null) || continue
		[ "$ns" != "$HOST_PIDNS" ] && LEADER=$p
	done
	[ -n "$LEADER" ] && break
	kill -0 "$NSPAWN_PID" 2>/dev/null || break
	sleep 0.5
done
if [ -z "$LEADER" ]; then
	tail -30 "$WORK/console.log" >&2
	skip_all "systemd-nspawn could not boot the guest on this machine"
fi
echo "guest pid 1 is $LEADER"
# That process is nspawn's own code until it executes the guest's systemd, and before that its
# mounts are not the guest's yet: a systemctl entered too early answers "offline". Ask again
# until systemd runs there and answers with a state of its boot; from then on the guest's
# systemd is up, and the boot must finish.
# boot_state [--wait]: the guest systemd's state ("offline" or nothing while it does not answer).
boot_state() {
	local left=$((DEADLINE - SECONDS))
	# Never 0: that would be no time limit at all.
	[ "$left" -gt 0 ] || left=1
	timeout "$left" nsenter -t "$LEADER" -a systemctl is-system-running "$@" 2>/dev/null
}
DEADLINE=$((SECONDS + BOOT_TIMEOUT))
STATE=
SYSTEMD_UP=
while [ "$SECONDS" -lt "$DEADLINE" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; do
	if [ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" = systemd ]; then
		STATE=$(boot_state)
		case "$STATE" in
		offline | "") ;;
		*)
			SYSTEMD_UP=1
			# Nothing when the wait ran out: the state the boot hangs in.
			STATE=$(boot_state --wait)
			[ -n "$STATE" ] || STATE=$(timeout 10 nsenter -t "$LEADER" -a systemctl is-system-running 2>/dev/null)
			break
			;;
		esac
	fi
	sleep 0.5
done
echo "is-system-running: $STATE"
case "$STATE" in
running | degraded) ;;
*)
	tail -30 "$WORK/console.log" >&2
	[ -n "$SYSTEMD_UP" ] ||
		skip_all "the guest's systemd never answered is-system-running (got: ${STATE:-nothing}): this machine cannot boot a systemd guest"
	echo "--- jobs the guest's boot still waits for:" >&2
	timeout 10 nsenter -t "$LEADER" -a systemctl list-jobs --no-pager >&2
	echo "--- failed units:" >&2
	timeout 10 nsenter -t "$LEADER" -a systemctl --failed --no-pager >&2
	fail "the guest's systemd is up but did not reach running or degraded in ${BOOT_TIMEOUT}s (is-system-running: ${STATE:-nothing})"
	summary
	exit
	;;
esac
if [ "$STATE" = degraded ]; then
	echo "--- failed units (degraded):"
	guest systemctl --failed --no-pager
fi

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

# The agent itself, against the simulator of tests/sim/ (built by `cargo test` or
# `cargo build --examples`): its nvidia-gridd becomes the real nvidia-gridd.service unit, its
# nvidia-smi /usr/bin/nvidia-smi, and its fake DLS runs in the guest as sim-dls.service on a
# loopback port named by the token. Then, with the guest's own systemctl and journalctl: the
# agent is active; a token dropped as cloud-init's write_files would (wrong mode on purpose) is
# fixed to 0744 and the agent restarts the real nvidia-gridd unit; `systemctl status` shows
# the agent's state line; `vgpu-license-agent status --wait 60` exits 0 once licensed; a
# failure injected into the simulation (the DLS's clock an hour off) is explained by
# `journalctl -x` from the catalog.
# SIM_EXAMPLES: where the simulator's programs are (set SIM_EXAMPLES_PREBUILT=1 to use them
# as they are, without cargo).
SIM_EXAMPLES=${SIM_EXAMPLES:-$TARGET_DIR/debug/examples}
SIM_DIR_GUEST=/var/lib/vgpu-sim
SIM_DLS_PORT=${SIM_DLS_PORT:-38443}
TOKEN_GUEST=/etc/nvidia/ClientConfigToken/client_configuration_token.tok

# wait_until SECONDS COMMAND...: polls COMMAND every half second until it succeeds.
wait_until() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.5
	done
}
gridd_said() { guest journalctl -b --no-pager -o cat _COMM=nvidia-gridd | grep -qF "$1"; }
token_mode_is() { [ "$(guest stat -c %a "$TOKEN_GUEST" 2>/dev/null)" = "$1" ]; }
gridd_restarted_since() {
	local now
	now=$(guest systemctl show -P InvocationID nvidia-gridd.service)
	[ -n "$now" ] && [ "$now" != "$1" ] && [ "$(guest systemctl is-active nvidia-gridd.service)" = active ]
}
agent_logged() { [ -n "$(guest journalctl -b --no-pager -o cat _SYSTEMD_UNIT="$NAME.service" MESSAGE_ID="$1")" ]; }
catalog_id() { sed -n "/^-- /{s/^-- //;h};/^Subject: .*$1/{g;p;q}" "$ROOT/packaging/$NAME.catalog"; }
agent_journal_tail() {
	echo "--- the agent's journal:"
	guest journalctl -b --no-pager -u "$NAME.service" | tail -25
	echo "--- nvidia-gridd's journal:"
	guest journalctl -b --no-pager -u nvidia-gridd.service | tail -15
}

install_sim() {
	install -m 0755 "$SIM_EXAMPLES/sim-nvidia-gridd" "$GUEST/usr/bin/nvidia-gridd" &&
		install -m 0755 "$SIM_EXAMPLES/sim-nvidia-smi" "$GUEST/usr/bin/nvidia-smi" &&
		install -m 0755 "$SIM_EXAMPLES/sim-dls" "$GUEST/usr/local/bin/sim-dls" || return 1
	mkdir -p "$GUEST$SIM_DIR_GUEST"
	# A gridd that does not notice a new token by itself: only a restart gets it licensed.
	echo '{"retry_seconds": 2.0, "pickup_new_token": false}' >"$GUEST$SIM_DIR_GUEST/sim.json"
	echo '{"mode": "up", "skew_seconds": 0}' >"$GUEST$SIM_DIR_GUEST/dls.json"
	cat >"$GUEST/etc/systemd/system/sim-dls.service" <<UNIT
[Unit]
Description=simulated DLS (vgpu-license-agent boot test)
[Service]
ExecStart=/usr/local/bin/sim-dls --listen 127.0.0.1:$SIM_DLS_PORT --control $SIM_DIR_GUEST/dls.json
UNIT
	cat >"$GUEST/etc/systemd/system/nvidia-gridd.service" <<UNIT
[Unit]
Description=NVIDIA Grid Daemon (simulated: vgpu-license-agent boot test)
Wants=sim-dls.service
After=network-online.target sim-dls.service
[Service]
Environment=SIM_DIR=$SIM_DIR_GUEST
ExecStart=/usr/bin/nvidia-gridd
[Install]
WantedBy=multi-user.target
UNIT
	guest systemctl daemon-reload &&
		guest systemctl start sim-dls.service &&
		guest systemctl restart nvidia-gridd.service &&
		wait_until 30 gridd_said "Unable to fetch the client configuration token file" &&
		guest nvidia-smi -q | grep -q 'License Status *: Unlicensed'
}

check_agent_active() {
	local state
	state=$(guest systemctl is-active "$NAME.service")
	echo "$NAME.service: $state"
	[ "$state" = active ] || {
		agent_journal_tail
		return 1
	}
}

# cloud-init's write_files with a wrong `permissions` (0600): the agent fixes the mode and
# restarts nvidia-gridd.service through the real systemctl. The image has the driver's
# template gridd.conf (FeatureType=0): the agent rewrites it, from inside its sandbox.
check_token_dropped() {
	local before rc=0
	before=$(guest systemctl show -P InvocationID nvidia-gridd.service)
	printf '# gridd.conf.template of the driver\nFeatureType=0\nEnableUI=FALSE\n' >"$GUEST/etc/nvidia/gridd.conf"
	chmod 0644 "$GUEST/etc/nvidia/gridd.conf"
	"$SIM_EXAMPLES/sim-dls" --write-token "127.0.0.1:$SIM_DLS_PORT" "$WORK/token" || return 1
	# As write_files does it: parent directories 0755, the file with the mode it was given.
	guest sh -c "mkdir -p -m 0755 ${TOKEN_GUEST%/*} && umask 077 && cat >$TOKEN_GUEST" <"$WORK/token" || return 1
	rm -f "$WORK/token"
	wait_until 60 token_mode_is 744 || {
		echo "the token's mode is $(guest stat -c %a "$TOKEN_GUEST"), not 744" >&2
		rc=1
	}
	wait_until 60 gridd_restarted_since "$before" || {
		echo "nvidia-gridd.service was not restarted" >&2
		rc=1
	}
	[ "$(cat "$GUEST/etc/nvidia/gridd.conf")" = "$(printf '# gridd.conf.template of the driver\nFeatureType=1\nEnableUI=FALSE')" ] || {
		echo "gridd.conf was not set to FeatureType=1 with its other lines kept:" >&2
		cat "$GUEST/etc/nvidia/gridd.conf" >&2
		rc=1
	}
	wait_until 30 agent_logged "$(catalog_id 'restarted nvidia-gridd')" || {
		echo "no 'restarted nvidia-gridd' message from the agent" >&2
		rc=1
	}
	[ $rc = 0 ] || agent_journal_tail
	return $rc
}

check_status_wait() {
	local rc
	guest vgpu-license-agent status --wait 60
	rc=$?
	echo "exit $rc"
	[ $rc = 0 ] || agent_journal_tail
	[ $rc = 0 ]
}

check_systemctl_status() {
	local out
	out=$(guest systemctl status --no-pager --lines=0 "$NAME.service")
	echo "$out"
	grep -q 'Status: "licensed' <<<"$out"
}

# A failure injected into the simulation: the DLS's clock an hour ahead. gridd's next
# acquisition fails with clock windback; the agent says so with the catalog's MESSAGE_ID.
check_explained_failure() {
	local id out
	id=$(catalog_id clock_skew)
	[ -n "$id" ] || return 1
	echo '{"mode": "up", "skew_seconds": 3600}' >"$GUEST$SIM_DIR_GUEST/dls.json"
	sleep 1 # sim-dls reads its control file every 200 ms
	guest systemctl restart nvidia-gridd.service || return 1
	wait_until 90 agent_logged "$id" || {
		agent_journal_tail
		return 1
	}
	out=$(guest journalctl -b -x --no-pager _SYSTEMD_UNIT="$NAME.service" MESSAGE_ID="$id")
	echo "$out"
	echo '{"mode": "up", "skew_seconds": 0}' >"$GUEST$SIM_DIR_GUEST/dls.json"
	grep -q 'Synchronize the clock' <<<"$out"
}

agent_checks() {
	local b built=
	# Built (or brought up to date) here: `cargo test --all-targets` builds examples only as
	# test harnesses. A build that fails is a failure; only a machine without cargo (and
	# without SIM_EXAMPLES_PREBUILT) cannot run these checks.
	if [ -z "${SIM_EXAMPLES_PREBUILT:-}" ] && command -v cargo >/dev/null; then
		banner "building the simulator (cargo build --examples)"
		(cd "$ROOT" && cargo build --examples) || {
			fail "agent checks in the guest: cargo build --examples failed"
			return
		}
		built=1
	fi
	for b in sim-nvidia-gridd sim-nvidia-smi sim-dls; do
		[ -x "$SIM_EXAMPLES/$b" ] && continue
		if [ -n "$built" ] || [ -n "${SIM_EXAMPLES_PREBUILT:-}" ]; then
			fail "agent checks in the guest: the simulator's $b is not at $SIM_EXAMPLES/$b"
		else
			skip "agent checks in the guest: the simulator is not built ($SIM_EXAMPLES/$b) and there is no cargo to build it"
		fi
		return
	done
	local failed_before=${#FAILED[@]}
	check "the simulator (nvidia-gridd unit, nvidia-smi, a DLS) runs in the guest" install_sim
	[ "${#FAILED[@]}" -eq "$failed_before" ] || return
	check "the agent is active" check_agent_active
	check "a token dropped with mode 0600 is fixed to 0744, gridd.conf's FeatureType=0 set to 1, nvidia-gridd.service restarted" check_token_dropped
	check "vgpu-license-agent status --wait 60 exits 0 once licensed" check_status_wait
	check "systemctl status shows the agent's state line" check_systemctl_status
	check "journalctl -x explains an injected failure (clock skew) from the catalog" check_explained_failure
	check "the agent is still active" check_agent_active
}
agent_checks

# apt remove stops the agent; installing the package again starts it (not only try-restart,
# which would leave it stopped until the next boot), and an upgrade keeps it running.
agent_active() { [ "$(guest systemctl is-active "$NAME.service")" = active ]; }
check_remove_reinstall() {
	DEBIAN_FRONTEND=noninteractive guest apt-get remove -y -q "$NAME" || return 1
	[ "$(guest systemctl is-active "$NAME.service")" != active ] || {
		echo "still active after apt remove" >&2
		return 1
	}
	# Not /tmp: the booted guest has a tmpfs there.
	local deb_guest
	deb_guest=/var/tmp/$(basename "$DEB")
	cp "$DEB" "$GUEST$deb_guest" && guest dpkg -i "$deb_guest" || return 1
	wait_until 30 agent_active || {
		echo "not started again by the install after apt remove: $(guest systemctl is-active "$NAME.service")" >&2
		return 1
	}
	local pid
	pid=$(guest systemctl show -P MainPID "$NAME.service")
	guest dpkg -i "$deb_guest" || return 1
	rm -f "$GUEST$deb_guest"
	if ! agent_active || [ "$(guest systemctl show -P MainPID "$NAME.service")" = "$pid" ]; then
		echo "a reinstall over a running agent did not restart it" >&2
		return 1
	fi
}
check "apt remove stops the agent, installing again starts it" check_remove_reinstall

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

summary
