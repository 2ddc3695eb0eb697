#!/bin/bash
# Boot test of the packages in real systemd guests:
#
#   bash deb/boot-test.sh [PACKAGE.deb]      (default: the one deb/build.sh made)
#
# For each Debian release of BOOT_TEST_SUITES (default: bookworm, glibc 2.36, and bullseye,
# glibc 2.31 and systemd 247, the oldest the portable binary is tested on): debootstrap
# (minbase, with systemd, dbus, ca-certificates), dpkg -i of the same package in the chroot
# (no systemd runs there: the unit must be enabled, not started), then boot the tree with
# systemd-nspawn -b and check from inside with the guest's own systemctl and journalctl
# (nsenter into the guest's pid 1): every check runs in every guest. In bookworm's guest,
# once the .deb is purged, the .rpm (rpm/build.sh) is installed, upgraded and erased with
# Debian's rpm, so that its scriptlets run against a real systemd. Then, from a copy of
# bookworm's tree with cloud-init installed, one guest per user-data file of cloud-init/,
# seeded as NoCloud with a token of the test's simulated DLS and booted three times (first
# boot, same instance again, new instance with a new token): see "The cloud-init bootstrap"
# below. The guests of the user-data files that carry the token then become golden images:
# prepare-image as docs/install.md says, the whole tree searched for the tokens, and one
# clone booted: see "Golden images" below. Runs as root on a throwaway machine.
#
# Exit: 0 passed, 1 failed, 77 skipped. A skip, said loudly and never counted as passed, is
# only for a machine that cannot run the test or a part of it: not root, a tool missing, no
# mirror, a guest whose systemd never starts, no cargo to build the simulator. Once a
# guest's systemd answers, every problem is a failure: a boot that never finishes (a unit
# that hangs it) included. With VGPU_TESTS_NO_SKIP=1 (CI) a skip is a failure too.
# BOOT_TEST_KEEP=1 keeps the guest trees and their console logs. The debootstrapped trees are
# cached between runs in /var/cache/vgpu-license-agent-tests/debootstrap (BOOT_TEST_CACHE_DIR;
# empty: no cache), and made again when stale: see "The debootstrap cache" below.
#
# The guests are independent: by default they boot in BOOT_TEST_JOBS (5) runs of this script
# at once, each with a group of them and a simulated DLS port of its own (the guests share
# the host's network), each run's output shown whole when it ends, and one summary. The
# guests: each release of BOOT_TEST_SUITES by its name, and the cloud-init guests by their
# user-data (write-files, runcmd, kubevirt-token-source); BOOT_TEST_ONLY="NAME..." boots
# those alone, in this run. `bash deb/boot-test.sh --fill-cache` only makes the cached trees
# (tests/all.sh does so while the packages build).
set -uo pipefail

FILL_CACHE=0
# What the summary speaks of.
WHAT="boot test"
if [ "${1:-}" = --fill-cache ]; then
	FILL_CACHE=1
	WHAT="boot test --fill-cache"
	shift
fi
NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
read -r -a SUITES <<<"${BOOT_TEST_SUITES:-bookworm bullseye}"
# The release whose guest also runs the .rpm's scriptlets.
RPM_SUITE=bookworm
RPM_DIR=${BOOT_TEST_RPM_DIR:-$TARGET_DIR/rpm}
SUITE=
MIRROR=${BOOT_TEST_MIRROR:-http://deb.debian.org/debian}
BOOT_TIMEOUT=120
FAILED=()
SKIPPED=()

NO_SKIP=${VGPU_TESTS_NO_SKIP:-0}
# Debian's own python3: the one whose modules tests/all.sh installs (python3-yaml); a python3
# first on PATH (pyenv, a virtualenv) may lack them.
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
# shellcheck source=packaging/portable.sh
. "$ROOT/packaging/portable.sh"

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
# check NAME COMMAND...: runs COMMAND in the current guest, records NAME as failed when it fails.
check() {
	local name="[$SUITE] $1"
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
		echo "$WHAT: parts skipped (see above): not a full pass"
		return 77
	}
	echo "$WHAT passed"
}
TIMES=()

DEB=${1:-$TARGET_DIR/debian/${NAME}_$(dpkg-parsechangelog -l "$ROOT/deb/changelog" -S Version)_$(dpkg --print-architecture).deb}
[ "$FILL_CACHE" = 1 ] || [ -f "$DEB" ] || {
	echo "FAILED: no package at $DEB (run deb/build.sh)" >&2
	exit 1
}
[ "$(id -u)" = 0 ] || skip_all "needs root"
for tool in debootstrap systemd-nspawn nsenter; do
	command -v "$tool" >/dev/null || skip_all "$tool is missing (apt-get install debootstrap systemd-container util-linux)"
done

WORK=$(mktemp -d /var/tmp/$NAME-boot.XXXXXX)
GUEST=
NSPAWN_PID=
LEADER=
# halt_guest: powers the current guest off (killing nspawn if it does not stop), keeping its
# tree for another boot. Returns non-zero when the guest had to be killed.
halt_guest() {
	local rc=0
	if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
		[ -n "$LEADER" ] && nsenter -t "$LEADER" -a systemctl poweroff --no-block >/dev/null 2>&1
		for _ in $(seq 60); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.5; done
		if kill "$NSPAWN_PID" 2>/dev/null; then
			echo "the guest did not power off within 30 s: killed" >&2
			rc=1
		fi
		wait "$NSPAWN_PID" 2>/dev/null
	fi
	NSPAWN_PID=
	LEADER=
	return $rc
}
# stop_guest: powers the current guest off and removes its tree.
stop_guest() {
	halt_guest
	if [ -n "$GUEST" ] && [ "${BOOT_TEST_KEEP:-0}" != 1 ]; then
		rm -rf "$GUEST"
	fi
}
cleanup() {
	stop_guest
	if [ "${BOOT_TEST_KEEP:-0}" = 1 ]; then
		echo "kept: $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT

# guest COMMAND...: runs COMMAND inside the booted guest, in all its namespaces.
guest() { nsenter -t "$LEADER" -a "$@"; }

# ---- The debootstrap cache
#
# A debootstrapped tree depends only on the release, the package list, the mirror, the
# architecture and debootstrap's version (the key), and on the state of the archive. Each is
# kept in CACHE_DIR (one per release: a new key replaces the old one) and copied for every
# run (cp -a: seconds, against a minute or more of downloads). A tree is made again when the
# archive's Release file for its release has another Date than when the tree was made (the
# archive moved on: a point release), when that cannot be asked and the tree is older than
# CACHE_MAX_DAYS, or when the key changed. BOOT_TEST_CACHE_DIR= (empty) turns the cache off.
CACHE_DIR=${BOOT_TEST_CACHE_DIR-/var/cache/$NAME-tests/debootstrap}
CACHE_MAX_DAYS=${BOOT_TEST_CACHE_MAX_DAYS:-7}

# release_date: the Date of the mirror's Release file of SUITE; nothing when it cannot be read.
release_date() {
	"$PYTHON" - "$MIRROR/dists/$SUITE/Release" 2>/dev/null <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
    for line in r.read(65536).decode("utf-8", "replace").splitlines():
        if line.startswith("Date:"):
            print(line[5:].strip())
            break
PY
}

# debootstrap_root DIR INCLUDE: a minbase tree of SUITE with INCLUDE at DIR, copied from the
# cache when it holds one that is fresh, else debootstrapped (into the cache, then copied).
# Its log goes to $WORK/$SUITE-debootstrap.log.
debootstrap_root() {
	local dir=$1 include=$2 log=$WORK/$SUITE-debootstrap.log key entry date made lock rc=0
	if [ -n "$CACHE_DIR" ] && ! mkdir -p "$CACHE_DIR"; then
		echo "[$SUITE] cannot make $CACHE_DIR: debootstrap without the cache"
		CACHE_DIR=
	fi
	if [ -z "$CACHE_DIR" ]; then
		debootstrap --variant=minbase --include="$include" "$SUITE" "$dir" "$MIRROR" >"$log" 2>&1
		return
	fi
	key=$(printf '%s\n' "$SUITE" minbase "$include" "$MIRROR" "$(dpkg --print-architecture)" \
		"$(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null)" | sha256sum | cut -c1-16)
	entry=$CACHE_DIR/$SUITE-$key
	# One run at a time makes or reads a release's tree.
	exec {lock}>"$CACHE_DIR/.lock-$SUITE" && flock "$lock" || return 1
	date=$(release_date)
	made=
	if [ -f "$entry/complete" ]; then
		made=$(cat "$entry/complete")
		if [ -n "$date" ] && [ "$date" != "$made" ]; then
			echo "[$SUITE] the cached tree was made from the archive of $made, the archive is of $date now: made again"
			made=
		elif [ -z "$date" ] && [ -n "$(find "$entry/complete" -mtime +"$CACHE_MAX_DAYS")" ]; then
			echo "[$SUITE] the cached tree is older than $CACHE_MAX_DAYS days, and the archive cannot be asked whether it moved on: made again"
			made=
		fi
	fi
	if [ -n "$made" ]; then
		echo "[$SUITE] debootstrap: the cached tree $entry (archive of $made)"
		: >"$log"
	else
		# This release's trees of another key, or stale, or half made.
		rm -rf "$CACHE_DIR/$SUITE"-????????????????
		echo "[$SUITE] debootstrap --variant=minbase --include=$include into $entry"
		if debootstrap --variant=minbase --include="$include" "$SUITE" "$entry/root" "$MIRROR" >"$log" 2>&1; then
			# The packages debootstrap downloaded: not needed once installed.
			rm -f "$entry/root/var/cache/apt/archives/"*.deb
			printf 'suite %s\nvariant minbase\ninclude %s\nmirror %s\n' "$SUITE" "$include" "$MIRROR" >"$entry/key"
			# Without a date from the archive, the tree's age alone says when it is stale.
			echo "${date:-unknown}" >"$entry/complete"
		else
			rc=1
			rm -rf "$entry"
		fi
	fi
	# DIR empty: the cache filled, nothing copied.
	if [ "$rc" = 0 ] && [ -n "$dir" ]; then
		cp -a "$entry/root" "$dir" || rc=1
	fi
	exec {lock}>&-
	[ "$rc" = 0 ] || return 1
	[ -n "$dir" ] || return 0
	# As debootstrap does: the build machine's resolver for apt in the chroot (the cached
	# copy is of the day the tree was made).
	if [ -f /etc/resolv.conf ]; then
		rm -f "$dir/etc/resolv.conf"
		cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
	fi
}

# The packages of the current release's tree.
guest_include() {
	local include=systemd,systemd-sysv,dbus,ca-certificates
	[ "$SUITE" = "$RPM_SUITE" ] && include+=,rpm
	echo "$include"
}

# debootstrap_guest: the current release's tree at GUEST (from the cache when it is fresh),
# saved for the cloud-init guests when they are made from it and boot in this run.
debootstrap_guest() {
	banner "[$SUITE] debootstrap"
	debootstrap_root "$GUEST" "$(guest_include)" || {
		tail -20 "$WORK/$SUITE-debootstrap.log" >&2
		skip "[$SUITE] debootstrap failed (no mirror reachable?)"
		return 1
	}
	# The cloud-init guests start from this tree as debootstrap left it.
	if [ "$SUITE" = "$CLOUD_INIT_SUITE" ] && ci_wanted; then ci_save_base; fi
}

# prepare_guest: debootstraps the current release into GUEST and installs the package there
# as an image build would, in a chroot.
prepare_guest() {
	debootstrap_guest || return 1
	echo "$NAME-boot" >"$GUEST/etc/hostname"
	echo "$SUITE: libc6 $(chroot "$GUEST" dpkg-query -W -f="\${Version}" libc6), systemd $(chroot "$GUEST" dpkg-query -W -f="\${Version}" systemd)"

	banner "[$SUITE] dpkg -i in the chroot (no running systemd: enable, do not start)"
	cp "$DEB" "$GUEST/tmp/"
	chroot "$GUEST" dpkg -i "/tmp/$(basename "$DEB")" || fail "[$SUITE] dpkg -i in the chroot"
	[ -L "$GUEST/etc/systemd/system/multi-user.target.wants/$NAME.service" ] ||
		fail "[$SUITE] the unit is not enabled after dpkg -i in the chroot"

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
}

# More options of systemd-nspawn for the next boot (a bind mount, say).
NSPAWN_EXTRA=()
BOOTS=0
CONSOLE_LOG=
# boot_guest: boots GUEST and waits until its systemd has finished booting. Fails (having
# said why, as a skip or a failure) when it cannot.
boot_guest() {
	banner "[$SUITE] boot: systemd-nspawn -b --register=no --keep-unit ${NSPAWN_EXTRA[*]}"
	CONSOLE_LOG=$WORK/$(basename "$GUEST")-console-$((++BOOTS)).log
	systemd-nspawn -b -D "$GUEST" --register=no --keep-unit --console=read-only "${NSPAWN_EXTRA[@]}" \
		>"$CONSOLE_LOG" 2>&1 &
	NSPAWN_PID=$!
	# The guest's pid 1 is the child of nspawn in a pid namespace of its own (nspawn's first
	# child is a short-lived helper in ours: nsentering it races its exit).
	local host_pidns p ns
	host_pidns=$(readlink "/proc/$NSPAWN_PID/ns/pid")
	for _ in $(seq 60); do
		for p in $(ps -o pid= --ppid "$NSPAWN_PID" 2>/dev/null); do
			ns=$(readlink "/proc/$p/ns/pid" 2>/dev/null) || continue
			[ "$ns" != "$host_pidns" ] && LEADER=$p
		done
		[ -n "$LEADER" ] && break
		kill -0 "$NSPAWN_PID" 2>/dev/null || break
		sleep 0.5
	done
	if [ -z "$LEADER" ]; then
		tail -30 "$CONSOLE_LOG" >&2
		skip "[$SUITE] systemd-nspawn could not boot the guest on this machine"
		return 1
	fi
	echo "guest pid 1 is $LEADER"
	# That process is nspawn's own code until it executes the guest's systemd, and before that
	# its mounts are not the guest's yet: a systemctl entered too early answers "offline". Ask
	# again until systemd runs there and answers with a state of its boot; from then on the
	# guest's systemd is up, and the boot must finish.
	DEADLINE=$((SECONDS + BOOT_TIMEOUT))
	local state='' systemd_up=''
	while [ "$SECONDS" -lt "$DEADLINE" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; do
		if [ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" = systemd ]; then
			state=$(boot_state)
			case "$state" in
			offline | "") ;;
			*)
				systemd_up=1
				# Nothing when the wait ran out: the state the boot hangs in.
				state=$(boot_state --wait)
				[ -n "$state" ] || state=$(timeout 10 nsenter -t "$LEADER" -a systemctl is-system-running 2>/dev/null)
				break
				;;
			esac
		fi
		sleep 0.5
	done
	echo "is-system-running: $state"
	case "$state" in
	running | degraded) ;;
	*)
		tail -30 "$CONSOLE_LOG" >&2
		if [ -z "$systemd_up" ]; then
			skip "[$SUITE] the guest's systemd never answered is-system-running (got: ${state:-nothing}): this machine cannot boot a systemd guest"
			return 1
		fi
		echo "--- jobs the guest's boot still waits for:" >&2
		timeout 10 nsenter -t "$LEADER" -a systemctl list-jobs --no-pager >&2
		echo "--- failed units:" >&2
		timeout 10 nsenter -t "$LEADER" -a systemctl --failed --no-pager >&2
		fail "[$SUITE] the guest's systemd is up but did not reach running or degraded in ${BOOT_TIMEOUT}s (is-system-running: ${state:-nothing})"
		return 1
		;;
	esac
	if [ "$state" = degraded ]; then
		echo "--- failed units (degraded):"
		guest systemctl --failed --no-pager
	fi
}
# boot_state [--wait]: the guest systemd's state ("offline" or nothing while it does not answer).
boot_state() {
	local left=$((DEADLINE - SECONDS))
	# Never 0: that would be no time limit at all.
	[ "$left" -gt 0 ] || left=1
	timeout "$left" nsenter -t "$LEADER" -a systemctl is-system-running "$@" 2>/dev/null
}

check_unit_loaded() {
	guest systemctl is-enabled "$NAME.service" &&
		[ "$(guest systemctl show -P LoadState "$NAME.service")" = loaded ] &&
		[ "$(guest systemctl show -P Type "$NAME.service")" = notify ] &&
		[ "$(guest systemctl show -P ProtectSystem "$NAME.service")" = strict ]
}

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
	# RuntimeDirectoryPreserve=: the probe shares the agent's run directory, which systemd 247
	# (bullseye) would otherwise remove when the probe stops, under the running agent.
	sed -e 's#^ExecStart=.*#ExecStart=/usr/local/bin/sandbox-probe#' -e 's/^Type=notify/Type=oneshot/' \
		-e 's/^RuntimeDirectory=.*/&\nRuntimeDirectoryPreserve=yes/' \
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

# The agent itself, against the simulator of tests/sim/ (built here for glibc 2.17 like the
# release binary, so that it runs in every guest): its nvidia-gridd becomes the real nvidia-gridd.service unit, its
# nvidia-smi /usr/bin/nvidia-smi, and its fake DLS runs in the guest as sim-dls.service on a
# loopback port named by the token. Then, with the guest's own systemctl and journalctl: the
# agent is active; a token dropped as cloud-init's write_files would (wrong mode on purpose) is
# fixed to 0744 and the agent restarts the real nvidia-gridd unit; `systemctl status` shows
# the agent's state line; `vgpu-license-agent status --wait 60` exits 0 once licensed; a
# failure injected into the simulation (the DLS's clock an hour off) is explained by
# `journalctl -x` from the catalog.
# SIM_EXAMPLES: where the simulator's programs are (set SIM_EXAMPLES_PREBUILT=1 to use them
# as they are, without cargo).
SIM_EXAMPLES=${SIM_EXAMPLES:-$TARGET_DIR/$PORTABLE_TARGET/debug}
SIM_PROGRAMS=(sim-nvidia-gridd sim-nvidia-smi sim-dls)
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

# sim_files: puts the simulator's programs, its settings and its units into GUEST's tree.
sim_files() {
	install -m 0755 "$SIM_EXAMPLES/sim-nvidia-gridd" "$GUEST/usr/bin/nvidia-gridd" &&
		install -m 0755 "$SIM_EXAMPLES/sim-nvidia-smi" "$GUEST/usr/bin/nvidia-smi" &&
		install -m 0755 "$SIM_EXAMPLES/sim-dls" "$GUEST/usr/local/bin/sim-dls" || return 1
	mkdir -p "$GUEST$SIM_DIR_GUEST"
	# The vGPU on the guest's PCI bus, as sysfs shows one (the container sees the host's bus,
	# which has none): vendor 0x10de, a 3D controller, the nvidia driver bound.
	local pci="$SIM_DIR_GUEST/pci"
	mkdir -p "$GUEST$pci/devices/0000:02:01.0" "$GUEST$pci/drivers/nvidia" "$GUEST/etc/$NAME/config.d" &&
		echo 0x10de >"$GUEST$pci/devices/0000:02:01.0/vendor" &&
		echo 0x030200 >"$GUEST$pci/devices/0000:02:01.0/class" &&
		ln -sfn "$pci/drivers/nvidia" "$GUEST$pci/devices/0000:02:01.0/driver" &&
		printf '[paths]\npci_devices = "%s/devices"\n' "$pci" >"$GUEST/etc/$NAME/config.d/00-sim-pci.toml" || return 1
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
}
install_sim() {
	sim_files || return 1
	# The agent, started by the package, read its config before the simulated PCI bus's
	# drop-in was there: restarted, it takes it.
	guest systemctl daemon-reload &&
		guest systemctl restart "$NAME.service" &&
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

# Exit 0, and from the service's own report (status.json), not observed by the command.
check_status_wait() {
	local rc out
	out=$(guest vgpu-license-agent status --wait 60)
	rc=$?
	echo "$out"
	echo "exit $rc"
	grep -q "From the running service's report" <<<"$out" || {
		echo "status did not read the running service's report (/run/$NAME/status.json)" >&2
		rc=1
	}
	[ $rc = 0 ] || agent_journal_tail
	[ $rc = 0 ]
}

# The agent follows gridd's journal of this boot: its report lists gridd's lines. (In a
# container journald stamps the container's boot ID, which the agent's sandbox does not see
# in /proc: `journalctl --boot` there matched nothing, and the agent saw only nvidia-smi.)
# The service's own report (status would observe on the spot, unsandboxed, without it).
report_lists_acquired() {
	local out
	out=$(guest cat "/run/$NAME/status.json")
	grep -q '"kind": "acquired"' <<<"$out"
}
check_follows_the_journal() {
	# gridd's line comes a moment after nvidia-smi shows the license.
	wait_until 30 report_lists_acquired && return 0
	echo "the agent's report lists no acquisition of gridd's:" >&2
	guest cat "/run/$NAME/status.json" >&2
	return 1
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

# build_sim: builds the simulator's programs (once, for every guest) and says in SIM_MISSING
# why the agent checks cannot run, if they cannot.
SIM_MISSING=
build_sim() {
	local b built=
	# A build that fails is a failure; only a machine without cargo (and without
	# SIM_EXAMPLES_PREBUILT) cannot run these checks.
	if [ -z "${SIM_EXAMPLES_PREBUILT:-}" ] && command -v cargo >/dev/null; then
		banner "building the simulator for glibc $PORTABLE_GLIBC (cargo zigbuild)"
		if ! portable_toolchain "$TARGET_DIR"; then
			SIM_MISSING="cannot install the zig toolchain to build the simulator"
			skip "agent checks in the guests: $SIM_MISSING"
			return
		fi
		(cd "$ROOT" && env "$(portable_rustflags)" cargo zigbuild -p vgpu-sim --target "$PORTABLE_ZIG_TARGET" \
			"${SIM_PROGRAMS[@]/#/--bin=}") || {
			SIM_MISSING="cargo zigbuild of the simulator failed"
			fail "agent checks in the guests: $SIM_MISSING"
			return
		}
		built=1
	fi
	for b in "${SIM_PROGRAMS[@]}"; do
		[ -x "$SIM_EXAMPLES/$b" ] && continue
		if [ -n "$built" ] || [ -n "${SIM_EXAMPLES_PREBUILT:-}" ]; then
			SIM_MISSING="the simulator's $b is not at $SIM_EXAMPLES/$b"
			fail "agent checks in the guests: $SIM_MISSING"
		else
			SIM_MISSING="the simulator is not built ($SIM_EXAMPLES/$b) and there is no cargo to build it"
			skip "agent checks in the guests: $SIM_MISSING"
		fi
		return
	done
}

agent_checks() {
	if [ -n "$SIM_MISSING" ]; then
		echo "[$SUITE] no agent checks: $SIM_MISSING (counted once, above)" >&2
		return
	fi
	local failed_before=${#FAILED[@]}
	check "the simulator (nvidia-gridd unit, nvidia-smi, a DLS) runs in the guest" install_sim
	[ "${#FAILED[@]}" -eq "$failed_before" ] || return
	check "the agent is active" check_agent_active
	check "a token dropped with mode 0600 is fixed to 0744, gridd.conf's FeatureType=0 set to 1, nvidia-gridd.service restarted" check_token_dropped
	check "vgpu-license-agent status --wait 60 exits 0 once licensed, from the service's report" check_status_wait
	check "the agent follows gridd's journal of this boot (its report lists gridd's acquisition)" check_follows_the_journal
	check "systemctl status shows the agent's state line" check_systemctl_status
	check "journalctl -x explains an injected failure (clock skew) from the catalog" check_explained_failure
	license_gate_checks
	check "the agent is still active" check_agent_active
}

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

# left_in_guest: the paths in the guest named after the agent, but for logs, caches and the
# package managers' own records (the root file system and /run, a tmpfs of its own).
left_in_guest() {
	guest find / /run -xdev \( -path /proc -o -path /sys -o -path /var/log -o -path /var/cache -o -path /var/lib/dpkg \) -prune -o \
		\( -name "*vgpu-license-agent*" -o -name "*vgpu_license_agent*" \) -print 2>/dev/null
}
check_purge() {
	DEBIAN_FRONTEND=noninteractive guest apt-get purge -y -q "$NAME" || return 1
	local left
	left=$(left_in_guest)
	if [ -n "$left" ]; then
		echo "left behind after purge:" >&2
		echo "$left" >&2
		return 1
	fi
	! guest dpkg -s "$NAME" >/dev/null 2>&1
}

# The .rpm in the same guest, once the .deb is purged, with Debian's rpm (--force-debian: it
# refuses by default to install what dpkg does not track; --nodeps: the guest's rpm database
# knows none of Debian's packages): its scriptlets against the guest's running systemd.
RPM_GUEST=/var/tmp/$NAME.rpm
RPM2_GUEST=/var/tmp/$NAME-release2.rpm
grpm() { guest rpm --force-debian --nodeps "$@" 2>&1 | grep -v -e 'use Alien instead' -e 'you know what you are doing'; }
unit_state() { guest systemctl is-enabled "$NAME.service" 2>/dev/null; }

check_rpm_install() {
	local rc=0
	grpm -i "$RPM_GUEST"
	guest rpm -q "$NAME" || return 1
	[ "$(unit_state)" = enabled ] || {
		echo "not enabled by the preset: $(unit_state)" >&2
		rc=1
	}
	wait_until 30 agent_active || {
		echo "not started: $(guest systemctl is-active "$NAME.service")" >&2
		rc=1
	}
	guest test -d "/var/lib/$NAME" || {
		echo "tmpfiles.d did not create /var/lib/$NAME" >&2
		rc=1
	}
	grep -q "$NAME" <<<"$(guest journalctl --list-catalog)" || {
		echo "the catalog is not in journald's database" >&2
		rc=1
	}
	return $rc
}

check_rpm_upgrade() {
	local pid
	pid=$(guest systemctl show -P MainPID "$NAME.service")
	grpm -U "$RPM2_GUEST"
	[ "$(guest rpm -q "$NAME")" = "$(rpm -qp "$RPM2")" ] || {
		echo "not upgraded: $(guest rpm -q "$NAME")" >&2
		return 1
	}
	if ! wait_until 30 agent_active || [ "$(guest systemctl show -P MainPID "$NAME.service")" = "$pid" ]; then
		echo "the upgrade did not restart the running agent (MainPID $pid)" >&2
		return 1
	fi
	[ "$(unit_state)" = enabled ]
}

check_rpm_erase() {
	local rc=0 left
	grpm -e "$NAME"
	rm -f "$GUEST$RPM_GUEST" "$GUEST$RPM2_GUEST"
	if guest rpm -q "$NAME" >/dev/null 2>&1; then
		echo "rpm still knows $NAME after erase" >&2
		rc=1
	fi
	[ "$(guest systemctl is-active "$NAME.service")" != active ] || {
		echo "still active after rpm -e" >&2
		rc=1
	}
	[ "$(unit_state)" != enabled ] || {
		echo "still enabled after rpm -e" >&2
		rc=1
	}
	! grep -q "$NAME" <<<"$(guest journalctl --list-catalog)" || {
		echo "the catalog still lists the agent's messages" >&2
		rc=1
	}
	left=$(left_in_guest)
	if [ -n "$left" ]; then
		echo "left behind after rpm -e:" >&2
		echo "$left" >&2
		rc=1
	fi
	return $rc
}

rpm_checks() {
	local version rpm1
	version=$(dpkg-parsechangelog -l "$ROOT/deb/changelog" -S Version)
	rpm1=$RPM_DIR/$NAME-$version-1.x86_64.rpm
	[ -f "$rpm1" ] || {
		fail "[$SUITE] .rpm scriptlets: no package at $rpm1 (run rpm/build.sh)"
		return
	}
	# A second release of the same files, to upgrade to.
	banner "[$SUITE] rpm/build.sh: release 2, for the upgrade"
	VGPU_RPM_SKIP_CARGO_BUILD=1 VGPU_RPM_RELEASE=2 VGPU_RPM_OUT_DIR=$WORK/rpm2 bash "$ROOT/rpm/build.sh" || {
		fail "[$SUITE] .rpm scriptlets: rpm/build.sh of release 2 failed"
		return
	}
	RPM2=$WORK/rpm2/$NAME-$version-2.x86_64.rpm
	if ! cp "$rpm1" "$GUEST$RPM_GUEST" || ! cp "$RPM2" "$GUEST$RPM2_GUEST"; then
		fail "[$SUITE] .rpm scriptlets: cannot copy the packages into the guest"
		return
	fi
	local failed_before=${#FAILED[@]}
	check "rpm -i: the preset enables the agent, it is started, its directories made, the catalog updated" check_rpm_install
	[ "${#FAILED[@]}" -eq "$failed_before" ] || return
	check "rpm -U to release 2 restarts the running agent and keeps it enabled" check_rpm_upgrade
	check "rpm -e stops and disables the agent, drops its catalog entries, leaves nothing behind" check_rpm_erase
}

guest_checks() {
	check "the unit is enabled and loaded in the guest" check_unit_loaded
	check "the unit's sandbox allows systemctl restart, journal reads and the agent's writes" check_sandbox
	check "journalctl -x shows the catalog's explanation" check_catalog
	agent_checks
	check "apt remove stops the agent, installing again starts it" check_remove_reinstall
	check "apt-get purge in the running guest leaves nothing behind" check_purge
	[ "$SUITE" != "$RPM_SUITE" ] || rpm_checks
}

# ---- The cloud-init bootstrap, booted for real.
#
# One root per run: the debootstrapped tree of CLOUD_INIT_SUITE, copied before the main guest
# installs anything, gets cloud-init (apt-get install in the chroot: with debootstrap's
# --include, python3-cryptography's configure order breaks), the package (dpkg -i, as an
# image build does) and the simulator (nvidia-gridd and a DLS started at boot). Each user-data
# file of cloud-init/ boots a copy of that root (cp -a: under a second) from a NoCloud seed
# (/var/lib/cloud/seed/nocloud), its placeholder filled as a user would fill it: the
# simulator's token, `base64 -w0`. In each guest, three boots:
#   1. first boot: cloud-init finishes without an error of ours, its files land as the
#      user-data says, the token is adopted, gridd.conf gets FeatureType=1, nvidia-gridd is
#      restarted once, and the agent's report says licensed by the token's DLS; the boot did
#      not wait on the agent;
#   2. the same instance again: cloud-init runs none of its per-instance modules, and nothing
#      changes (the token's and gridd.conf's bytes and mtimes) or restarts;
#   3. a new instance-id with a new token: the new token is installed and licensed.
# The KubeVirt user-data's token comes from a shared Secret, not from the user-data: the
# share is stood in for (see ci_prepare_root's mount.virtiofs) and also rotated while the guest runs.
#
# Each token names a DLS host of its own (dls-N.boot-test, all 127.0.0.1 in the guest's
# /etc/hosts, all served by the one simulated DLS): the simulator writes the same bytes for
# the same node, and the report's DLS then says which token the agent is on.

CLOUD_INIT_SUITE=${BOOT_TEST_CLOUD_INIT_SUITE:-bookworm}
CI_USER_DATA=(user-data-write-files.yaml user-data-runcmd.yaml user-data-kubevirt-token-source.yaml)
# ci_kind FILE: the cloud-init guest's name, its user-data file's (user-data-KIND.yaml).
ci_kind() {
	local kind=${1#user-data-}
	echo "${kind%.yaml}"
}
# wanted NAME: whether the guest NAME boots in this run (see BOOT_TEST_ONLY above).
wanted() { [ -z "${BOOT_TEST_ONLY+x}" ] || [[ " $BOOT_TEST_ONLY " == *" $1 "* ]]; }
# ci_wanted: whether a cloud-init guest boots in this run.
ci_wanted() {
	local f
	for f in "${CI_USER_DATA[@]}"; do wanted "$(ci_kind "$f")" && return 0; done
	return 1
}
CI_PLACEHOLDER=REPLACE_WITH_BASE64_OF_YOUR_TOKEN
CI_BASE=
CI_SEED=/var/lib/cloud/seed/nocloud
# The template the driver installs: the agent sets FeatureType and keeps the rest.
CI_GRIDD_TEMPLATE=$'# gridd.conf.template of the driver\nFeatureType=0\nEnableUI=FALSE'
CI_GRIDD_SET=$'# gridd.conf.template of the driver\nFeatureType=1\nEnableUI=FALSE'
# A token counter for the whole run: token N names dls-N.boot-test.
CI_TOKENS=0
CI_TOKEN=
CI_DLS_HOST=
# The stand-in for the KubeVirt share: the host directory, the mount point in the guest.
CI_SHARE=
CI_SHARE_GUEST=
# What boot 2 must find unchanged (ci_fingerprint).
CI_PRINT=
# systemd's "Started <unit>" (SD_MESSAGE_UNIT_STARTED): one per start of nvidia-gridd.
UNIT_STARTED_ID=39f53479d3a045ac8e11786248231fbf

# ci_save_base: keeps a copy of the freshly debootstrapped tree for the cloud-init guests.
ci_save_base() {
	CI_BASE=$WORK/cloud-init-root
	cp -a "$GUEST" "$CI_BASE" || {
		fail "[$SUITE] cannot copy the debootstrapped tree for the cloud-init guests"
		CI_BASE=
	}
}

# ci_prepare_root: the image every cloud-init guest starts from.
ci_prepare_root() {
	local root=$CI_BASE
	banner "[$SUITE] cloud-init root: apt-get install cloud-init, dpkg -i the package, the simulator"
	DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends cloud-init \
		>"$WORK/cloud-init-apt.log" 2>&1 || {
		tail -20 "$WORK/cloud-init-apt.log" >&2
		echo "apt-get install cloud-init in the chroot failed (log above)" >&2
		return 1
	}
	chroot "$root" apt-get clean
	echo "cloud-init $(chroot "$root" dpkg-query -W -f="\${Version}" cloud-init)"
	cp "$DEB" "$root/tmp/" && chroot "$root" dpkg -i "/tmp/$(basename "$DEB")" >/dev/null || return 1
	rm -f "$root/tmp/$(basename "$DEB")"
	# The simulator, started at boot: its nvidia-gridd is enabled as the driver's would be.
	GUEST=$root sim_files || return 1
	ln -sf /etc/systemd/system/nvidia-gridd.service "$root/etc/systemd/system/multi-user.target.wants/nvidia-gridd.service"
	mkdir -p "$root/etc/nvidia" "$root/var/lib/prometheus/node-exporter"
	printf '%s\n' "$CI_GRIDD_TEMPLATE" >"$root/etc/nvidia/gridd.conf"
	chmod 0644 "$root/etc/nvidia/gridd.conf"
	echo "$NAME-boot" >"$root/etc/hostname"
	printf '127.0.0.1\t%s\n' dls-1.boot-test dls-2.boot-test dls-3.boot-test dls-4.boot-test dls-5.boot-test >>"$root/etc/hosts"
	# The image's cloud-init config (not the user-data under test). Each setting puts aside a
	# failure of a debootstrap minbase image that a cloud image would not have.
	cat >"$root/etc/cloud/cloud.cfg.d/90-boot-test.cfg" <<'CFG'
# The seed is NoCloud's directory (/var/lib/cloud/seed/nocloud); no other source is looked for.
datasource_list: [ NoCloud, None ]
# No locale is generated in a minbase image: the default en_US.UTF-8 fails update-locale.
# C.UTF-8 is built into glibc.
locale: C.UTF-8
# The guest shares the host's network (systemd-nspawn without --private-network): there is
# nothing for cloud-init to configure, and no network renderer in the image to do it.
network: {config: disabled}
CFG
	# The KubeVirt user-data mounts a virtiofs share; nspawn has no virtiofs device, so the
	# test binds a host directory at the mount point (--bind-ro, before the guest boots) in
	# place of the share. mount(8) runs /sbin/mount.TYPE for a type that has such a helper:
	# this one stands in for the virtiofs driver, and mounting succeeds only where the stand-in
	# is bound read-only, as the shared Secret would be. Without it, cloud-init's mounts module
	# fails its `mount -a` (unknown filesystem type 'virtiofs'), which is not what a KubeVirt
	# guest sees.
	cat >"$root/sbin/mount.virtiofs" <<'HELPER'
#!/bin/sh
# mount.virtiofs TAG DIR [-o OPTIONS]: stand-in for the virtiofs driver, see the package's
# deb/boot-test.sh (ci_prepare_root).
[ "$#" -ge 2 ] || exit 1
case ",$(findmnt -n -o OPTIONS --mountpoint "$2")," in
*,ro,*) exit 0 ;;
esac
echo "mount.virtiofs (boot test stand-in): no read-only stand-in bound at $2 for $1" >&2
exit 32
HELPER
	chmod 0755 "$root/sbin/mount.virtiofs"
}

# ci_new_token: writes the next simulator token (its own DLS host) to $WORK/token-N.
ci_new_token() {
	CI_TOKENS=$((CI_TOKENS + 1))
	CI_DLS_HOST=dls-$CI_TOKENS.boot-test
	CI_TOKEN=$WORK/token-$CI_TOKENS
	"$SIM_EXAMPLES/sim-dls" --write-token "$CI_DLS_HOST:$SIM_DLS_PORT" "$CI_TOKEN"
}

# ci_seed USER_DATA INSTANCE_ID: the NoCloud seed, the user-data's placeholder filled with the
# current token as its comments tell a user to (`base64 -w0` of the token file).
ci_seed() {
	local seed=$GUEST$CI_SEED b64
	mkdir -p "$seed"
	b64=$(base64 -w0 "$CI_TOKEN") || return 1
	(umask 077 && sed "s|$CI_PLACEHOLDER|$b64|" "$ROOT/cloud-init/$1" >"$seed/user-data") || return 1
	if grep -q REPLACE_WITH "$seed/user-data"; then
		echo "$1: a placeholder is left in the seed's user-data" >&2
		return 1
	fi
	printf 'instance-id: %s\nlocal-hostname: %s\n' "$2" "$NAME-boot" >"$seed/meta-data"
}

# ci_share_token: puts the current token into the stand-in for the shared Secret as the
# kubelet updates a Secret volume: the new file complete first, then renamed into place.
ci_share_token() {
	cp "$CI_TOKEN" "$CI_SHARE/.new.tmp" && mv -f "$CI_SHARE/.new.tmp" "$CI_SHARE/client_configuration_token.tok"
}

# ci_cloud_init_done INSTANCE_ID: `cloud-init status --long` says done, from our seed and
# instance, and cloud-init's log of this boot has no warning or error but the image's own.
ci_cloud_init_done() {
	local out rc=0 id warnings
	out=$(guest timeout 120 cloud-init status --wait --long)
	rc=$?
	echo "$out"
	if [ $rc != 0 ] || ! grep -q '^status: done' <<<"$out"; then
		echo "cloud-init status: exit $rc, not done" >&2
		return 1
	fi
	grep -qF "DataSourceNoCloud [seed=$CI_SEED]" <<<"$out" || {
		echo "cloud-init did not read the NoCloud seed" >&2
		return 1
	}
	id=$(cat "$GUEST/var/lib/cloud/data/instance-id" 2>/dev/null)
	[ "$id" = "$1" ] || {
		echo "cloud-init's instance-id is '$id', not $1" >&2
		return 1
	}
	# This boot's part of the log: from its last init-local stage on. Allowed: the image has no
	# ssh-keygen and no ssh server (cloud-init warns, and goes on).
	warnings=$(awk '/running .init-local. at/ { n = NR } { line[NR] = $0 } END { for (i = n; i <= NR; i++) print line[i] }' \
		"$GUEST/var/log/cloud-init.log" | grep -E '\[(WARNING|ERROR|CRITICAL)\]' |
		grep -vE "Failed generating key type [a-z0-9]+ to file /etc/ssh/|Ignoring config 'ssh_pwauth: [^']*'. SSH service 'ssh' is not installed")
	if [ -n "$warnings" ]; then
		echo "cloud-init warned or failed in this boot:" >&2
		echo "$warnings" >&2
		rc=1
	fi
	return $rc
}

# ci_write_files_landed: every write_files entry of the seed's user-data is in the guest with
# its bytes, mode and owner (the token's bytes are compared, never shown).
ci_write_files_landed() {
	"$PYTHON" - "$GUEST$CI_SEED/user-data" "$GUEST" <<'PY'
import base64, os, sys
import yaml

user_data, root = sys.argv[1], sys.argv[2]
ok = True
for wf in yaml.safe_load(open(user_data)).get("write_files", []):
    want = wf.get("content", "").encode()
    if wf.get("encoding") == "b64":
        want = base64.b64decode(want)
    path = root + wf["path"]
    try:
        got = open(path, "rb").read()
        st = os.stat(path)
    except OSError as e:
        print(f"{wf['path']}: {e}", file=sys.stderr)
        ok = False
        continue
    mode = "%04o" % (st.st_mode & 0o7777)
    problems = []
    if got != want:
        problems.append(f"its {len(got)} bytes differ from the user-data's {len(want)}")
    if mode != wf.get("permissions", "0644"):
        problems.append(f"mode {mode}, not {wf.get('permissions')}")
    if (st.st_uid, st.st_gid) != (0, 0):
        problems.append(f"owner {st.st_uid}:{st.st_gid}, not root:root")
    if problems:
        print(f"{wf['path']}: " + "; ".join(problems), file=sys.stderr)
        ok = False
    else:
        print(f"ok: {wf['path']}: {len(got)} bytes, mode {mode}, root:root")
sys.exit(0 if ok else 1)
PY
}

# ci_token_is FILE: the installed token is FILE's bytes, mode 0744, alone in its directory.
ci_token_is() {
	local t=$GUEST$TOKEN_GUEST
	cmp -s "$1" "$t" && [ "$(stat -c %a "$t")" = 744 ] && [ "$(stat -c %u:%g "$t")" = 0:0 ] &&
		[ "$(ls -A "${t%/*}")" = "${t##*/}" ]
}
ci_token_installed() {
	wait_until 60 ci_token_is "$CI_TOKEN" || {
		echo "the installed token is not the current one (mode $(stat -c %a "$GUEST$TOKEN_GUEST" 2>/dev/null), files: $(find "$GUEST${TOKEN_GUEST%/*}" -mindepth 1 -printf '%f ' 2>/dev/null))" >&2
		return 1
	}
	if [ "$(cat "$GUEST/etc/nvidia/gridd.conf")" != "$CI_GRIDD_SET" ] || [ "$(stat -c %a "$GUEST/etc/nvidia/gridd.conf")" != 644 ]; then
		echo "gridd.conf is not the driver's template with FeatureType=1 (mode $(stat -c %a "$GUEST/etc/nvidia/gridd.conf")):" >&2
		cat "$GUEST/etc/nvidia/gridd.conf" >&2
		return 1
	fi
	echo "the token ($CI_DLS_HOST) is installed with mode 0744, gridd.conf has FeatureType=1"
}

# Counts of this boot: starts of the nvidia-gridd unit (1 at boot, +1 per restart), the agent's
# own restarts (its journal and its metrics).
gridd_starts() { guest journalctl -b --no-pager -o cat MESSAGE_ID=$UNIT_STARTED_ID UNIT=nvidia-gridd.service | grep -c .; }
agent_restarts_logged() {
	guest journalctl -b --no-pager -o cat _SYSTEMD_UNIT="$NAME.service" MESSAGE_ID="$(catalog_id 'restarted nvidia-gridd')" | grep -c .
}
agent_metric() { sed -n "s/^$1 //p" "$GUEST/var/lib/prometheus/node-exporter/vgpu_license_agent.prom" 2>/dev/null; }
gridd_started_n() { [ "$(gridd_starts)" -ge "$1" ]; }
agent_restarted_n() { [ "$(agent_metric vgpu_license_gridd_restarts_total)" = "$1" ]; }

# ci_restarts GRIDD_STARTS AGENT_RESTARTS: this boot's counts, once the agent is licensed.
# "LE" before a number: at most that many.
ci_restarts() {
	local starts agent logged metric rc=0
	starts=$(gridd_starts)
	logged=$(agent_restarts_logged)
	metric=$(agent_metric vgpu_license_gridd_restarts_total)
	echo "this boot: nvidia-gridd started $starts time(s); the agent restarted it $logged time(s) (journal), vgpu_license_gridd_restarts_total $metric"
	case $1 in
	LE*) [ "$starts" -le "${1#LE}" ] || rc=1 ;;
	*) [ "$starts" = "$1" ] || rc=1 ;;
	esac
	[ $rc = 0 ] || echo "expected nvidia-gridd to start $1 time(s)" >&2
	case $2 in
	LE*) [ "$logged" -le "${2#LE}" ] && [ "$metric" = "$logged" ] || rc=1 ;;
	*) [ "$logged" = "$2" ] && [ "$metric" = "$2" ] || rc=1 ;;
	esac
	[ $rc = 0 ] || {
		echo "expected the agent to restart nvidia-gridd $2 time(s), in its journal and its metrics" >&2
		agent_journal_tail
	}
	return $rc
}

# ci_report: the agent's report, from the guest's own command and from the live file: licensed,
# by the DLS the current token names, no failure.
ci_report() {
	local out rc
	out=$(guest vgpu-license-agent status --json --wait 60)
	rc=$?
	echo "vgpu-license-agent status --json --wait 60: exit $rc"
	"$PYTHON" - "$CI_DLS_HOST" "$SIM_DLS_PORT" "$out" "$(guest cat "/run/$NAME/status.json")" <<'PY' || rc=1
import json, sys

host, port = sys.argv[1], int(sys.argv[2])
ok = True
for name, text in (("status --json", sys.argv[3]), ("/run/vgpu-license-agent/status.json", sys.argv[4])):
    try:
        r = json.loads(text)
    except ValueError as e:
        print(f"{name}: not JSON: {e}", file=sys.stderr)
        ok = False
        continue
    got = (r.get("state"), r.get("licensing_mode"), r.get("failure"), r.get("dls"))
    want = ("licensed", "dls", None, [{"host": host, "port": port}])
    print(f"{name}: state {got[0]}, mode {got[1]}, failure {got[2] and got[2].get('reason')}, dls {got[3]}")
    if got != want:
        print(f"{name}: expected state licensed, mode dls, no failure, dls {want[3]}", file=sys.stderr)
        ok = False
sys.exit(0 if ok else 1)
PY
	[ "$rc" = 0 ] || agent_journal_tail
	[ "$rc" = 0 ]
}

# ci_boot_order: the boot did not wait on the agent. cloud-init's first three stages are
# ordered after nothing that is ordered after the agent. cloud-final.service (Debian's
# cloud-init orders it after multi-user.target, hence after every service started for that
# target, the agent's too) never waited on the agent: the agent is not on its critical chain,
# and it was ready (Type=notify) within 5 s of starting, licensed or not.
ci_boot_order() {
	local u chain start ready rc=0
	for u in cloud-init-local.service cloud-init.service cloud-config.service; do
		if guest systemctl list-dependencies --after --plain --all --no-pager "$u" | grep -qF "$NAME.service"; then
			echo "$u is ordered after $NAME.service" >&2
			rc=1
		fi
	done
	chain=$(guest systemd-analyze critical-chain --no-pager cloud-final.service)
	echo "$chain"
	if grep -qF "$NAME.service" <<<"$chain"; then
		echo "$NAME.service is on cloud-final.service's critical chain" >&2
		rc=1
	fi
	start=$(guest systemctl show -P InactiveExitTimestampMonotonic "$NAME.service")
	ready=$(guest systemctl show -P ActiveEnterTimestampMonotonic "$NAME.service")
	if [ "${ready:-0}" -gt 0 ] && [ "$((ready - start))" -lt 5000000 ]; then
		echo "$NAME.service was ready $(((ready - start) / 1000)) ms after it started"
	else
		echo "$NAME.service was not ready within 5 s of its start (start $start, ready $ready)" >&2
		rc=1
	fi
	return $rc
}

# ci_share_mounted: the share's mount point holds the stand-in, read-only, and cloud-init's
# mounts module put the user-data's entry into fstab.
ci_share_mounted() {
	local opts
	opts=$(guest findmnt -n -o OPTIONS --mountpoint "$CI_SHARE_GUEST")
	echo "$CI_SHARE_GUEST: $opts"
	case ",$opts," in *,ro,*) ;; *) return 1 ;; esac
	grep -E "^vgpu-token[[:space:]]+${CI_SHARE_GUEST}[[:space:]]+virtiofs[[:space:]]" "$GUEST/etc/fstab" || {
		echo "no virtiofs entry for $CI_SHARE_GUEST in the guest's /etc/fstab" >&2
		return 1
	}
}

# A fingerprint of what a boot of the same instance must not change: bytes (hashed, never
# shown) and mtimes of the token, gridd.conf and the agent's drop-ins.
ci_fingerprint() {
	(cd "$GUEST" && find etc/nvidia etc/vgpu-license-agent -type f -printf '%p %s %T@ %m\n' | sort &&
		find etc/nvidia etc/vgpu-license-agent -type f -print0 | sort -z | xargs -0 sha256sum)
}
ci_nothing_changed() {
	local now
	now=$(ci_fingerprint)
	[ "$now" = "$CI_PRINT" ] || {
		echo "changed by a boot of the same instance:" >&2
		diff <(cut -c1-200 <<<"$CI_PRINT" | grep -v '^[0-9a-f]\{64\} ') <(cut -c1-200 <<<"$now" | grep -v '^[0-9a-f]\{64\} ') >&2
		[ "$(grep '^[0-9a-f]\{64\} ' <<<"$CI_PRINT")" = "$(grep '^[0-9a-f]\{64\} ' <<<"$now")" ] || echo "(and a file's bytes)" >&2
		return 1
	}
	echo "the token, gridd.conf and the agent's config are as before, bytes and mtimes"
}
# ci_settled: what the agent does at its start is done: it has been active for 5 s. (Its
# adoption runs within a second of its start; 5 s leave room on a loaded machine.)
ci_settled() {
	local t
	t=$(guest systemctl show -P ActiveEnterTimestampMonotonic "$NAME.service")
	# CLOCK_MONOTONIC, systemd's clock for that timestamp (one clock for the host and guest).
	[ "${t:-0}" -gt 0 ] && [ "$(($("$PYTHON" -c 'import time; print(time.monotonic_ns() // 1000)') - t))" -ge 5000000 ]
}

# ci_boot USER_DATA BOOT INSTANCE_ID: boots the current guest (again) and runs the checks of
# that boot.
ci_boot() {
	local file=$1 n=$2 id=$3 failed_before=${#FAILED[@]}
	boot_guest || return 1
	check "boot $n: cloud-init finished, from the seed ($id), without an error of ours" ci_cloud_init_done "$id"
	case $n in
	1 | 3)
		[ "$n" = 1 ] && check "boot $n: the boot did not wait on the agent" ci_boot_order
		[ "$n" = 3 ] && check "boot 3: the new machine-id (a cloned disk) is reported once as clone_detected" ci_clone_detected
		[ "$file" = user-data-kubevirt-token-source.yaml ] &&
			check "boot $n: the stand-in for the virtiofs share is mounted read-only, as fstab says" ci_share_mounted
		grep -q '^write_files:' "$ROOT/cloud-init/$file" &&
			check "boot $n: write_files' files are in place as the user-data says" ci_write_files_landed
		check "boot $n: the token is installed with mode 0744, gridd.conf has FeatureType=1" ci_token_installed
		local starts=2 agent=1
		case $file:$n in
		# runcmd restarts gridd itself (install --no-restart, then systemctl --no-block).
		user-data-runcmd.yaml:*) agent=0 ;;
		# The new token was in place before gridd started, gridd.conf already right: gridd
		# may license on its own, and the agent need not restart it.
		user-data-write-files.yaml:3) starts=LE2 agent=LE1 ;;
		esac
		[ "$starts" = 2 ] && wait_until 60 gridd_started_n 2
		check "boot $n: licensed, from the agent's report (status --json), by the token's DLS ($CI_DLS_HOST)" ci_report
		wait_until 30 ci_settled
		check "boot $n: nvidia-gridd started ${starts/LE/at most } times this boot (at boot, then once more), ${agent/LE/at most } of them by the agent" ci_restarts "$starts" "$agent"
		;;
	2)
		check "boot 2: licensed, from the agent's report" ci_report
		check "boot 2: the report says boot 1's gridd returned its lease as the guest powered off" ci_last_shutdown
		wait_until 30 ci_settled
		check "boot 2: nothing changed" ci_nothing_changed
		check "boot 2: nothing restarted (nvidia-gridd started once this boot, not by the agent)" ci_restarts 1 0
		;;
	esac
	check "boot $n: the agent is active" check_agent_active
	[ "${#FAILED[@]}" -eq "$failed_before" ]
}

# ci_last_shutdown: the report of a boot after a clean power-off says the previous boot's
# gridd returned its lease as it stopped (read from the previous boot's journal).
ci_last_shutdown() {
	guest vgpu-license-agent status --json | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
last = r.get("last_shutdown")
print("last_shutdown:", last)
sys.exit(0 if last and last.get("lease_returned") is True else 1)'
}

# ci_clone_detected: a boot whose machine-id changed (a cloned disk) is reported once as
# clone_detected, and gridd's client state of the old identity was moved aside, kept.
ci_clone_detected() {
	local out rc
	out=$(guest vgpu-license-agent status --json)
	rc=$?
	# The exit code says the license state (this check is about the event).
	echo "status --json: exit $rc"
	"$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
kinds = [e.get("kind") for e in r.get("events", [])]
print("events:", kinds)
sys.exit(0 if kinds.count("clone_detected") == 1 else 1)' <<<"$out" || return 1
	guest journalctl -b -u vgpu-license-agent-identity.service --no-pager -o cat | tail -n 5
}

# ci_rotate: a new token in the share while the guest runs: installed, gridd restarted once
# more by the agent, licensed by the new token's DLS.
CI_ROTATE_BACKOFF=10
ci_rotate() {
	ci_new_token && ci_share_token || return 1
	# gridd's restart for the new token waits out the backoff of the restart made for the
	# first one at boot (restart_backoff_seconds, CI_ROTATE_BACKOFF in this guest, +-20 %),
	# as every restart does.
	ci_token_installed && wait_until 120 gridd_started_n 3 && ci_report && ci_restarts 3 2
}

# ci_rotate_nvidia: NVIDIA's rotation, as an operator does it in the running guest: the DLS's
# new file copied into the token directory beside the installed token (which is still valid by
# its dates). The agent adopts it under its own name, keeps the old one in replaced/, restarts
# gridd once for it (after the backoff of the restart at boot, if there was one), and the guest
# is licensed by the new token's DLS.
CI_NVIDIA_NAME=client_configuration_token_12-01-2026-09-30-00.tok
ci_only_file() { [ "$(ls -A "$1")" = "$2" ]; }
ci_rotate_nvidia() {
	local dir=$GUEST${TOKEN_GUEST%/*} starts restarts
	starts=$(gridd_starts)
	restarts=$(agent_restarts_logged)
	ci_new_token && cp "$CI_TOKEN" "$dir/$CI_NVIDIA_NAME" || return 1
	echo "copied token $CI_TOKENS ($CI_DLS_HOST) as $CI_NVIDIA_NAME beside the installed token"
	wait_until 60 ci_only_file "$dir" "$CI_NVIDIA_NAME" || {
		echo "the new token is not alone in the token directory: $(find "$dir" -mindepth 1 -printf '%f ')" >&2
		agent_journal_tail
		return 1
	}
	cmp -s "$CI_TOKEN" "$dir/$CI_NVIDIA_NAME" || {
		echo "the new token's bytes changed" >&2
		return 1
	}
	find "$GUEST/var/lib/$NAME/replaced" -name client_configuration_token.tok | grep -q . || {
		echo "the previous token is not kept in /var/lib/$NAME/replaced/" >&2
		return 1
	}
	wait_until 120 gridd_started_n $((starts + 1)) && ci_report || return 1
	ci_restarts $((starts + 1)) $((restarts + 1))
}

# ---- Golden images: prepare-image as docs/install.md's golden-image section says (called
# from ci_guest, once a guest's three boots are done).
#
# The guests of CI_GOLDEN (their user-data carries the token) are builders: each has had its
# first boot from its user-data, and boot 3 as a new instance with a new token. Its NoCloud
# seed is taken away (a builder's seed is a cidata volume or a URL, not part of the image; one
# left in /var/lib/cloud/seed is named by prepare-image), then, as the Packer recipe does,
# `truncate -s 0 /etc/machine-id` and `prepare-image --purge-client-state --cloud-init
# --journal` run in the guest, which then powers off. Its whole tree is searched for every
# token the guest was given: the bytes, `base64 -w0` of them, and each line of them
# base64-wrapped at 76 (as a user-data may carry it). Then one copy of CI_GOLDEN_CLONE's image
# boots as a clone would: a new instance-id and a new token in its seed. It must be licensed
# by the new token, report no last shutdown (the builder's is not its own), and no
# clone_detected (the image was prepared). The copy of a disk that was not prepared is boot 3
# of every cloud-init guest (ci_clone_detected).
CI_GOLDEN=(user-data-write-files.yaml user-data-runcmd.yaml)
CI_GOLDEN_CLONE=user-data-write-files.yaml
CI_PREPARE='truncate -s 0 /etc/machine-id && rm -f /var/lib/dbus/machine-id && vgpu-license-agent prepare-image --purge-client-state --cloud-init --journal'
# Every machine-id the builder booted with (a clone must have none of them).
CI_BUILDER_MACHINE_IDS=

# ci_prepare_image: the builder's last step, in the running guest; prepare-image exits 0 and
# leaves the agent and nvidia-gridd stopped.
ci_prepare_image() {
	local out rc u
	# Its own now, those its journal holds boots of, and D-Bus's copy (which systemd takes for
	# an empty /etc/machine-id).
	CI_BUILDER_MACHINE_IDS=$({
		cat "$GUEST/etc/machine-id" "$GUEST/var/lib/dbus/machine-id" 2>/dev/null
		find "$GUEST/var/log/journal" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null
	} | grep -xE '[0-9a-f]{32}' | sort -u | paste -sd' ')
	guest rm -rf "$CI_SEED" || return 1
	echo "the seed $CI_SEED taken away (a builder's cidata volume, not part of the image)"
	echo "in the guest: $CI_PREPARE"
	out=$(guest sh -euc "$CI_PREPARE" 2>&1)
	rc=$?
	echo "$out"
	echo "exit $rc"
	[ "$rc" = 0 ] || return 1
	for u in "$NAME.service" nvidia-gridd.service; do
		if [ "$(guest systemctl is-active "$u")" = active ]; then
			echo "$u is still active after prepare-image" >&2
			rc=1
		fi
	done
	return $rc
}

# ci_prepared_as_documented: what install.md says prepare-image removes is gone, what it
# keeps is there. Lists what is left of the token's, the agent's, gridd's and cloud-init's.
ci_prepared_as_documented() {
	local rc=0 p left
	echo "left in the image:"
	(cd "$GUEST" && find etc/nvidia etc/$NAME var/lib/cloud var/lib/$NAME var/lib/$NAME.image-prepared.json \
		var/lib/nvidia var/log/journal -maxdepth 2 2>/dev/null | sort | sed 's/^/  \//')
	(cd "$GUEST" && find var/log -maxdepth 1 -name 'cloud-init*' | sed 's/^/  left: \//')
	if [ -n "$(ls -A "$GUEST${TOKEN_GUEST%/*}" 2>/dev/null)" ]; then
		echo "the token directory ${TOKEN_GUEST%/*} is not empty" >&2
		rc=1
	fi
	left=$(find "$GUEST/var/lib/cloud" -mindepth 1 -maxdepth 1 ! -name seed -printf '%f ' 2>/dev/null)
	[ -z "$left" ] || {
		echo "/var/lib/cloud still holds (but its seed): $left" >&2
		rc=1
	}
	[ -z "$(find "$GUEST/var/log" -maxdepth 1 -name 'cloud-init*.log')" ] || {
		echo "cloud-init's logs are still in /var/log" >&2
		rc=1
	}
	for p in etc/nvidia/gridd.conf etc/$NAME/config.d/50-cloud-init.toml var/lib/$NAME.image-prepared.json; do
		case "$p:$CI_GOLDEN_FILE" in
		*50-cloud-init.toml:user-data-runcmd.yaml) continue ;; # runcmd writes no drop-in
		esac
		[ -f "$GUEST/$p" ] || {
			echo "/$p is gone (prepare-image keeps it, or records it)" >&2
			rc=1
		}
	done
	[ ! -s "$GUEST/etc/machine-id" ] || {
		echo "/etc/machine-id is not empty" >&2
		rc=1
	}
	return $rc
}

# ci_token_patterns FILE TOKEN...: the strings a search for the tokens looks for, one a line:
# each token's bytes, its base64 -w0, and each whole line of its base64 wrapped at 76.
ci_token_patterns() {
	local out=$1 t
	shift
	(umask 077 && : >"$out") || return 1
	for t in "$@"; do
		{
			cat "$t"
			echo
			base64 -w0 "$t"
			echo
			base64 -w76 "$t" | awk 'length($0) == 76'
		} | awk 'length($0) >= 40' >>"$out"
	done
}

# ci_tree_holds_no_token: no file of the powered-off image's tree holds a token this guest was
# given (the search is first shown to find each form in a file that holds it).
ci_tree_holds_no_token() {
	local pats=$WORK/golden-patterns control=$WORK/golden-control tokens=() n form found rc=0
	for n in $(seq "$CI_TOKENS"); do tokens+=("$WORK/token-$n"); done
	ci_token_patterns "$pats" "${tokens[@]}" || return 1
	echo "searching for ${#tokens[@]} token(s) ($(wc -c <"${tokens[0]}") bytes each): $(grep -c . "$pats") strings (raw, base64 -w0, base64 wrapped at 76)"
	for form in raw w0 w76; do
		case $form in
		raw) cp "${tokens[0]}" "$control" ;;
		w0) { echo "content: $(base64 -w0 "${tokens[0]}")"; } >"$control" ;;
		w76) base64 -w76 "${tokens[0]}" >"$control" ;;
		esac
		LC_ALL=C grep -qF -f "$pats" "$control" || {
			echo "the search does not find a token written $form" >&2
			rc=1
		}
	done
	rm -f "$control"
	echo "the whole tree: $(find "$GUEST" -xdev -type f | wc -l) files, $(du -sxh "$GUEST" | cut -f1)"
	found=$(LC_ALL=C grep -rlF -D skip -f "$pats" "$GUEST")
	rm -f "$pats"
	if [ -n "$found" ]; then
		echo "files of the prepared image that hold a token:" >&2
		printf '%s\n' "${found//"$GUEST"/}" >&2
		rc=1
	else
		echo "no file holds a token"
	fi
	return $rc
}

# ci_no_last_shutdown: the clone's report has no last shutdown (the journal's previous boot is
# the builder's).
ci_no_last_shutdown() {
	guest vgpu-license-agent status --json | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
print("last_shutdown:", r.get("last_shutdown"))
sys.exit(0 if r.get("last_shutdown") is None else 1)' || return 1
	echo "vgpu_license_last_return_success: $(agent_metric vgpu_license_last_return_success)"
}

# ci_own_machine_id: the clone's machine-id is none that the builder had.
ci_own_machine_id() {
	local mid
	mid=$(guest cat /etc/machine-id)
	echo "machine-id: the builder's $CI_BUILDER_MACHINE_IDS; the clone's $mid"
	[ -n "$mid" ] || return 1
	case " $CI_BUILDER_MACHINE_IDS " in
	*" $mid "*)
		[ "$mid" != "$(cat "$GUEST/var/lib/dbus/machine-id" 2>/dev/null)" ] ||
			echo "the clone took /var/lib/dbus/machine-id, which truncate -s 0 /etc/machine-id leaves in the image: every clone gets that id" >&2
		return 1
		;;
	esac
}

# ci_no_clone_detected: the clone's report has no clone_detected event.
ci_no_clone_detected() {
	guest vgpu-license-agent status --json | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
kinds = [e.get("kind") for e in r.get("events", [])]
print("events:", kinds)
sys.exit(0 if "clone_detected" not in kinds else 1)'
}

# ci_golden_clone FILE: boots a copy of the prepared image with a new instance-id and a new token.
ci_golden_clone() {
	local file=$1 builder=$GUEST id start=$SECONDS kind=${1#user-data-}
	kind=${kind%.yaml}
	id=iid-$kind-clone
	GUEST=$builder-clone
	banner "[$SUITE] golden image: a copy of it (cp -a --reflink=auto), seeded with $id and a new token"
	if ! cp -a --reflink=auto "$builder" "$GUEST" || ! ci_new_token || ! ci_seed "$file" "$id"; then
		fail "[$SUITE] golden image: cannot make the clone"
	elif boot_guest; then
		check "golden clone: cloud-init finished, as the new instance ($id)" ci_cloud_init_done "$id"
		check "golden clone: the new token is installed" ci_token_installed
		check "golden clone: licensed by the new token's DLS ($CI_DLS_HOST)" ci_report
		check "golden clone: no last shutdown reported (the journal's previous boot is the builder's)" ci_no_last_shutdown
		check "golden clone: no clone_detected event (the image was prepared)" ci_no_clone_detected
		check "golden clone: a machine-id that is none of the builder's" ci_own_machine_id
		check "golden clone: the agent is active" check_agent_active
	fi
	stop_guest
	GUEST=$builder
	TIMES+=("golden clone ${kind}: $((SECONDS - start)) s")
}

# ci_golden FILE: the current guest, booted, becomes a golden image (see above).
CI_GOLDEN_FILE=
ci_golden() {
	local file=$1 start=$SECONDS g kind=${1#user-data-}
	kind=${kind%.yaml}
	CI_GOLDEN_FILE=$file
	for g in "${CI_GOLDEN[@]}"; do [ "$g" = "$file" ] && break; done
	[ "$g" = "$file" ] || return 0
	if [ -z "$LEADER" ]; then
		fail "[$SUITE] golden image: not made, boot 3 did not come up"
		return
	fi
	check "golden image: the seed taken away, prepare-image as install.md's Packer recipe runs it, exit 0, services stopped" ci_prepare_image
	if ! halt_guest; then
		fail "[$SUITE] golden image: the builder did not power off"
		return
	fi
	check "golden image: what prepare-image removes is gone, what it keeps is there" ci_prepared_as_documented
	check "golden image: no file of the whole tree holds a token the builder had (raw, base64, wrapped at 76)" ci_tree_holds_no_token
	TIMES+=("golden image ${kind}: $((SECONDS - start)) s")
	[ "$file" != "$CI_GOLDEN_CLONE" ] || ci_golden_clone "$file"
}

ci_guest() {
	local file=$1 start=$SECONDS kind=${1#user-data-}
	kind=${kind%.yaml}
	CI_TOKENS=0
	SUITE="$CLOUD_INIT_SUITE cloud-init $kind"
	GUEST=$WORK/cloud-init-$kind
	NSPAWN_EXTRA=()
	banner "[$SUITE] a copy of the cloud-init root, seeded with cloud-init/$file"
	cp -a "$CI_BASE" "$GUEST" || {
		fail "[$SUITE] cannot copy the cloud-init root"
		return
	}
	ci_new_token || {
		fail "[$SUITE] sim-dls --write-token failed"
		return
	}
	ci_seed "$file" "iid-$kind-1" || {
		fail "[$SUITE] cannot write the NoCloud seed"
		return
	}
	if [ "$file" = user-data-kubevirt-token-source.yaml ]; then
		# The mount point the user-data names, and a host directory bound there in place of
		# the shared Secret (see ci_prepare_root's mount.virtiofs).
		CI_SHARE_GUEST=$("$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["mounts"][0][1])' "$ROOT/cloud-init/$file")
		CI_SHARE=$WORK/cloud-init-share
		if ! mkdir -p "$CI_SHARE" || ! ci_share_token; then
			fail "[$SUITE] cannot fill the stand-in share"
			return
		fi
		NSPAWN_EXTRA=("--bind-ro=$CI_SHARE:$CI_SHARE_GUEST")
		# The rotation's restart waits out the backoff of the restart at boot (ci_rotate):
		# 10 s here rather than the default 60 s, a wait this test need not spend.
		if ! mkdir -p "$GUEST/etc/$NAME/config.d" ||
			! printf '[service]\nrestart_backoff_seconds = %s\n' "$CI_ROTATE_BACKOFF" \
				>"$GUEST/etc/$NAME/config.d/10-boot-test-backoff.toml"; then
			fail "[$SUITE] cannot write the backoff drop-in"
			return
		fi
	fi
	if ci_boot "$file" 1 "iid-$kind-1"; then
		if [ "$file" = user-data-kubevirt-token-source.yaml ]; then
			check "a token rotated in the share is installed, gridd restarted once more, licensed by it" ci_rotate
		fi
		if [ "$file" = user-data-write-files.yaml ]; then
			check "a token copied beside the installed one (NVIDIA's rotation) wins, gridd restarted once more, licensed by it" ci_rotate_nvidia
		fi
		CI_PRINT=$(ci_fingerprint)
		if halt_guest; then
			ci_boot "$file" 2 "iid-$kind-1"
		else
			fail "[$SUITE] the guest did not power off"
		fi
		halt_guest
		# The guest comes back as a clone would: a new machine-id on the same disk (KubeVirt
		# gives a clone a new instance-id too).
		systemd-id128 new >"$GUEST/etc/machine-id"
		ci_new_token
		if [ "$file" = user-data-kubevirt-token-source.yaml ]; then
			ci_share_token
		fi
		ci_seed "$file" "iid-$kind-2" && ci_boot "$file" 3 "iid-$kind-2"
		# The guest, booted, becomes a golden image: prepared, searched, and booted as a clone.
		ci_golden "$file"
	fi
	stop_guest
	NSPAWN_EXTRA=()
	rm -rf "$WORK/cloud-init-share"
	CI_SHARE_GUEST=
	TIMES+=("cloud-init $kind: $((SECONDS - start)) s")
}

cloud_init_checks() {
	local suite=$SUITE start=$SECONDS file
	if [ -n "$SIM_MISSING" ]; then
		echo "[$SUITE] no cloud-init guests: $SIM_MISSING (counted once, above)" >&2
		return
	fi
	[ -n "$CI_BASE" ] || return
	if ! ci_prepare_root; then
		fail "[$SUITE] the cloud-init root could not be made"
		return
	fi
	TIMES+=("cloud-init root: $((SECONDS - start)) s")
	for file in "${CI_USER_DATA[@]}"; do
		wanted "$(ci_kind "$file")" && ci_guest "$file"
	done
	rm -rf "$CI_BASE"
	SUITE=$suite
}

# ---- Reload and vgpu-licensed.target, with the real systemd (called from agent_checks, in
# a licensed guest with the simulator running).
NEEDS_LICENSE=needs-license-boot-test.service
WAIT_UNIT=$NAME-wait-licensed.service

# A bad drop-in: `systemctl reload` fails with the error in the unit's journal, and the
# running service keeps its process and its config; fixed, the reload succeeds.
check_reload_refused() {
	local pid rc=0 dropin=/etc/$NAME/config.d/90-boot-test-bad.toml
	pid=$(guest systemctl show -P MainPID "$NAME.service")
	printf '[service]\npoll_licensed_seconds = 0\n' >"$GUEST$dropin"
	if guest systemctl reload "$NAME.service"; then
		echo "systemctl reload succeeded on a bad drop-in" >&2
		rc=1
	fi
	grep -qF "service.poll_licensed_seconds = 0" <<<"$(guest journalctl -b --no-pager -o cat -u "$NAME.service")" || {
		echo "the reload's error is not in the unit's journal" >&2
		rc=1
	}
	if [ "$(guest systemctl is-active "$NAME.service")" != active ] ||
		[ "$(guest systemctl show -P MainPID "$NAME.service")" != "$pid" ]; then
		echo "the service did not keep running as it was" >&2
		rc=1
	fi
	rm -f "$GUEST$dropin"
	guest systemctl reload "$NAME.service" || {
		echo "systemctl reload failed on a good config" >&2
		rc=1
	}
	[ $rc = 0 ] || agent_journal_tail
	return $rc
}

# gate_unit: a unit ordered after vgpu-licensed.target that records the license state at
# the moment it starts.
gate_unit() {
	cat >"$GUEST/etc/systemd/system/$NEEDS_LICENSE" <<UNIT
[Unit]
Description=a workload that needs the license (vgpu-license-agent boot test)
Wants=vgpu-licensed.target
After=vgpu-licensed.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c '/usr/bin/$NAME status --json >/run/needs-license.json; true'
UNIT
}
gate_reset() {
	guest systemctl stop "$NEEDS_LICENSE" vgpu-licensed.target "$WAIT_UNIT" 2>/dev/null
	guest systemctl reset-failed "$NEEDS_LICENSE" vgpu-licensed.target "$WAIT_UNIT" 2>/dev/null
	guest rm -f /run/needs-license.json
	true
}
gate_active() { [ "$(guest systemctl is-active "$NEEDS_LICENSE")" = active ]; }
# /run is the booted guest's own tmpfs, not the tree's: read it in the guest.
gate_saw_licensed() { guest cat /run/needs-license.json 2>/dev/null | grep -q '"state": "licensed"'; }
guest_unlicensed() { guest nvidia-smi -q | grep -q 'License Status *: Unlicensed'; }
# (The report read whole first: status's exit code says more than the state, a warning too.)
agent_licensed() {
	local out
	out=$(guest /usr/bin/$NAME status --json 2>/dev/null)
	grep -q '"state": "licensed"' <<<"$out"
}
# The agent's report says a state other than licensed (unlicensed, or restricted once the
# grace is over).
agent_unlicensed() {
	local out
	out=$(guest /usr/bin/$NAME status --json 2>/dev/null)
	grep -q '"state": "' <<<"$out" && ! grep -q '"state": "licensed"' <<<"$out"
}
dls_mode() {
	echo "{\"mode\": \"$1\", \"skew_seconds\": 0}" >"$GUEST$SIM_DIR_GUEST/dls.json"
	sleep 1 # sim-dls reads its control file every 200 ms
}

# Nothing of the boot started the license wait, and nothing but a unit that asks wants it.
check_target_holds_no_boot() {
	local state wanted
	state=$(guest systemctl show -P ActiveState "$WAIT_UNIT")
	wanted=$(guest systemctl show -P WantedBy,RequiredBy vgpu-licensed.target | tr -d '\n')
	echo "$WAIT_UNIT after boot: $state; vgpu-licensed.target wanted by: '${wanted}'"
	[ "$state" = inactive ] && [ -z "$wanted" ] && [ "$(guest systemctl is-enabled vgpu-licensed.target)" = static ]
}

# Unlicensed (the DLS refuses): the unit waits; once the DLS is up and gridd licensed, it
# starts, and saw the guest licensed when it did.
check_target_waits_for_the_license() {
	local rc=0 t
	# From a license held, as a guest loses one (the check before leaves gridd retrying).
	wait_until 60 agent_licensed || {
		echo "the guest did not get licensed again once the DLS was up" >&2
		agent_journal_tail
		return 1
	}
	dls_mode down
	guest systemctl restart nvidia-gridd.service || return 1
	wait_until 60 guest_unlicensed || {
		echo "the guest did not become unlicensed with the DLS down" >&2
		return 1
	}
	# The wait reads the agent's report: it has to have seen the license go first.
	t=$SECONDS
	wait_until 60 agent_unlicensed || {
		echo "the agent's report still said licensed 60 s after nvidia-smi said unlicensed" >&2
		agent_journal_tail
		return 1
	}
	echo "the agent's report said the license was gone $((SECONDS - t)) s after nvidia-smi did"
	gate_reset
	gate_unit
	guest systemctl daemon-reload || return 1
	guest systemctl start --no-block "$NEEDS_LICENSE" || return 1
	sleep 5
	if gate_active; then
		echo "$NEEDS_LICENSE started while the guest was not licensed; the agent's report then:" >&2
		guest cat /run/needs-license.json >&2
		rc=1
	fi
	[ "$(guest systemctl show -P ActiveState "$WAIT_UNIT")" = activating ] || {
		echo "$WAIT_UNIT is not waiting: $(guest systemctl show -P ActiveState "$WAIT_UNIT")" >&2
		rc=1
	}
	dls_mode up
	wait_until 120 gate_active || {
		echo "$NEEDS_LICENSE did not start once the DLS was up" >&2
		rc=1
	}
	gate_saw_licensed || {
		echo "$NEEDS_LICENSE started before the guest was licensed:" >&2
		guest cat /run/needs-license.json >&2
		rc=1
	}
	[ "$(guest systemctl is-active vgpu-licensed.target)" = active ] || rc=1
	[ $rc = 0 ] || agent_journal_tail
	return $rc
}

license_gate_checks() {
	check "systemctl reload fails on a bad drop-in, says why, and the service keeps running" check_reload_refused
	check "boot does not start the license wait; nothing but a unit that asks wants vgpu-licensed.target" check_target_holds_no_boot
	check "a unit after vgpu-licensed.target starts only once the simulated gridd is licensed" check_target_waits_for_the_license
}

# ---- Main

if [ "$FILL_CACHE" = 1 ]; then
	[ -n "$CACHE_DIR" ] || skip_all "--fill-cache: BOOT_TEST_CACHE_DIR is empty (no cache)"
	for SUITE in "${SUITES[@]}"; do
		banner "[$SUITE] the cached tree"
		debootstrap_root "" "$(guest_include)" || {
			tail -20 "$WORK/$SUITE-debootstrap.log" >&2
			skip "[$SUITE] debootstrap failed (no mirror reachable?)"
		}
	done
	echo "cache filled in $SECONDS s"
	summary
	exit
fi

# The guests of this run: the releases, then the cloud-init guests where their release is one.
guest_names() {
	local f
	printf '%s\n' "${SUITES[@]}"
	[[ " ${SUITES[*]} " == *" $CLOUD_INIT_SUITE "* ]] || return 0
	for f in "${CI_USER_DATA[@]}"; do ci_kind "$f"; done
}

# run_jobs N: the guests in N runs of this script at once (each guest to the run with the
# least so far, by its rough length), each with a DLS port of its own; each run's output
# shown whole as it ends. Exits with the worst status of the runs.
run_jobs() {
	local jobs=$1 i n pid rc worst=0 names=() load=() groups=() pids=() est least
	mapfile -t names < <(guest_names)
	for ((i = 0; i < jobs; i++)); do
		load[i]=0
		groups[i]=
	done
	for n in "${names[@]}"; do
		case $n in bookworm | runcmd) est=70 ;; *) est=60 ;; esac
		least=0
		for ((i = 1; i < jobs; i++)); do [ "${load[i]}" -lt "${load[least]}" ] && least=$i; done
		groups[least]+=" $n"
		load[least]=$((load[least] + est))
	done
	trap 'kill "${pids[@]}" 2>/dev/null; cleanup' EXIT
	for ((i = 0; i < jobs; i++)); do
		[ -n "${groups[i]}" ] || continue
		echo "run $i:${groups[i]} (simulated DLS on port $((SIM_DLS_PORT + i)))"
		BOOT_TEST_ONLY=${groups[i]# } BOOT_TEST_JOBS=1 SIM_EXAMPLES_PREBUILT=1 SIM_DLS_PORT=$((SIM_DLS_PORT + i)) \
			bash "${BASH_SOURCE[0]}" "$DEB" >"$WORK/run-$i.log" 2>&1 &
		pids[i]=$!
	done
	while [ ${#pids[@]} -gt 0 ]; do
		wait -n -p pid "${pids[@]}"
		rc=$?
		for i in "${!pids[@]}"; do
			[ "${pids[i]}" = "$pid" ] || continue
			banner "run $i:${groups[i]}: exit $rc"
			cat "$WORK/run-$i.log"
			unset 'pids[i]'
		done
		case $rc in
		0) ;;
		77) [ "$worst" = 1 ] || worst=77 ;;
		*) worst=1 ;;
		esac
	done
	echo
	echo "boot test: $SECONDS s in all, $jobs runs at once"
	exit "$worst"
}

build_sim
if ci_wanted && [[ " ${SUITES[*]} " != *" $CLOUD_INIT_SUITE "* ]]; then
	SUITE=$CLOUD_INIT_SUITE
	skip "the cloud-init guests: they are made from $CLOUD_INIT_SUITE's tree, which BOOT_TEST_SUITES (${SUITES[*]}) leaves out"
fi
if [ -z "${BOOT_TEST_ONLY+x}" ] && [ "${BOOT_TEST_JOBS:-5}" -gt 1 ] && [ -z "$SIM_MISSING" ] &&
	[ ${#FAILED[@]} -eq 0 ] && [ ${#SKIPPED[@]} -eq 0 ]; then
	run_jobs "${BOOT_TEST_JOBS:-5}"
fi
for SUITE in "${SUITES[@]}"; do
	START=$SECONDS
	GUEST=$WORK/$SUITE
	if wanted "$SUITE"; then
		prepare_guest && boot_guest && guest_checks
		stop_guest
		TIMES+=("$SUITE: $((SECONDS - START)) s")
	elif [ "$SUITE" = "$CLOUD_INIT_SUITE" ] && ci_wanted; then
		# Only the tree, for the cloud-init guests.
		debootstrap_guest
		stop_guest
	fi
	[ "$SUITE" != "$CLOUD_INIT_SUITE" ] || cloud_init_checks
done
echo
echo "time per guest (debootstrap, boot, checks; a cloud-init guest: its three boots): ${TIMES[*]}"
echo "boot test: $SECONDS s in all"
summary
