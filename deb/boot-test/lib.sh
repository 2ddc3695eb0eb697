# shellcheck shell=bash
# What every guest of deb/boot-test.sh shares, sourced by it: its output (checks, skips,
# failures, the summary), a guest's life (the debootstrapped tree and its cache, the boot with
# systemd-nspawn, commands inside it, the stop), waiting, and the simulator's programs (built
# once, put into a guest's tree). The variables it reads are boot-test.sh's.

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
# A failure's summary line ends with the first line the check wrote to stderr (its first
# complaint), so that the summary alone says why.
check() {
	local name="[$SUITE] $1" err rc why
	shift
	banner "$name"
	err=$(mktemp)
	"$@" 2> >(tee "$err" >&2)
	rc=$?
	wait $! 2>/dev/null
	why=$(head -c 300 "$err" | head -n 1)
	rm -f "$err"
	if [ $rc = 0 ]; then echo "ok: $name"; else fail "$name${why:+ -- $why}"; fi
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
		# journald then keeps this boot's journal in /run, gone at the next boot, and with it
		# what the checks read of the previous boot (its last shutdown). A guest's journald,
		# not the agent: said with its reason, and the flush asked for once more.
		if guest systemctl is-failed --quiet systemd-journal-flush.service; then
			echo "--- why the journal was not flushed to /var/log/journal:"
			guest journalctl -b -u systemd-journal-flush.service --no-pager | tail -20
			if guest journalctl --flush; then
				echo "journalctl --flush again: the journal is in /var/log/journal now"
			else
				echo "journalctl --flush again: failed too"
			fi
		fi
	fi
}
# boot_state [--wait]: the guest systemd's state ("offline" or nothing while it does not answer).
boot_state() {
	local left=$((DEADLINE - SECONDS))
	# Never 0: that would be no time limit at all.
	[ "$left" -gt 0 ] || left=1
	timeout "$left" nsenter -t "$LEADER" -a systemctl is-system-running "$@" 2>/dev/null
}

# The agent itself, against the simulator of tests/sim/ (built here static like the release
# binary, so that it runs in every guest): its nvidia-gridd becomes the real nvidia-gridd.service unit, its
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
SIM_PROGRAMS=(sim-nvidia-gridd sim-nvidia-smi sim-dls sim-nvidia-vgpu-mgr)
SIM_DIR_GUEST=/var/lib/vgpu-sim
SIM_DLS_PORT=${SIM_DLS_PORT:-38443}
TOKEN_GUEST=/etc/nvidia/ClientConfigToken/client_configuration_token.tok

# wait_until SECONDS COMMAND...: polls COMMAND every half second until it succeeds, for at
# most SECONDS; a wait in vain says what it waited for (a failed check's summary shows it).
wait_until() {
	local secs=$1 deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || {
			echo "waited $secs s in vain for: $*" >&2
			return 1
		}
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

# sim_bus: the vGPU on GUEST's PCI bus, as sysfs shows one (the container sees the host's bus,
# which has none): vendor 0x10de, a 3D controller, the nvidia driver bound; the agent's
# drop-in points it there (the only config a guest gets: every other setting is the package's).
sim_bus() {
	local pci="$SIM_DIR_GUEST/pci"
	mkdir -p "$GUEST$pci/devices/0000:02:01.0" "$GUEST$pci/drivers/nvidia" "$GUEST/etc/$NAME/config.d" &&
		echo 0x10de >"$GUEST$pci/devices/0000:02:01.0/vendor" &&
		echo 0x030200 >"$GUEST$pci/devices/0000:02:01.0/class" &&
		ln -sfn "$pci/drivers/nvidia" "$GUEST$pci/devices/0000:02:01.0/driver" &&
		printf '[paths]\npci_devices = "%s/devices"\n' "$pci" >"$GUEST/etc/$NAME/config.d/00-sim-pci.toml"
}

# sim_dls: the simulated DLS in GUEST, as sim-dls.service on a loopback port, answering as
# $SIM_DIR_GUEST/dls.json says (dls_mode).
sim_dls() {
	install -m 0755 "$SIM_EXAMPLES/sim-dls" "$GUEST/usr/local/bin/sim-dls" || return 1
	mkdir -p "$GUEST$SIM_DIR_GUEST"
	echo '{"mode": "up", "skew_seconds": 0}' >"$GUEST$SIM_DIR_GUEST/dls.json"
	cat >"$GUEST/etc/systemd/system/sim-dls.service" <<UNIT
[Unit]
Description=simulated DLS (vgpu-license-agent boot test)
[Service]
ExecStart=/usr/local/bin/sim-dls --listen 127.0.0.1:$SIM_DLS_PORT --control $SIM_DIR_GUEST/dls.json
UNIT
}

# sim_files: puts the simulator's programs, its settings and its units into GUEST's tree.
sim_files() {
	install -m 0755 "$SIM_EXAMPLES/sim-nvidia-gridd" "$GUEST/usr/bin/nvidia-gridd" &&
		install -m 0755 "$SIM_EXAMPLES/sim-nvidia-smi" "$GUEST/usr/bin/nvidia-smi" || return 1
	sim_bus && sim_dls || return 1
	# A gridd that does not notice a new token by itself: only a restart gets it licensed.
	echo '{"retry_seconds": 2.0, "pickup_new_token": false}' >"$GUEST$SIM_DIR_GUEST/sim.json"
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


# build_sim: builds the simulator's programs (once, for every guest) and says in SIM_MISSING
# why the agent checks cannot run, if they cannot.
SIM_MISSING=
build_sim() {
	local b built=
	# A build that fails is a failure; only a machine without cargo (and without
	# SIM_EXAMPLES_PREBUILT) cannot run these checks.
	if [ -z "${SIM_EXAMPLES_PREBUILT:-}" ] && command -v cargo >/dev/null; then
		banner "building the simulator, static (cargo zigbuild --target $PORTABLE_ZIG_TARGET)"
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
