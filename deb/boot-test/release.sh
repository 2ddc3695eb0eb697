# shellcheck shell=bash
# The release guests of deb/boot-test.sh (each Debian release of BOOT_TEST_SUITES), sourced by
# it: the package installed in the chroot, booted; the unit, its sandbox, the catalog; the
# agent against the simulator; reload and vgpu-licensed.target; remove, reinstall, purge; in
# RPM_SUITE's guest, the .rpm's scriptlets.

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

# gridd killed outright (SIGKILL: it logs nothing) is seen from systemd's own journal line
# about its unit (`_PID=1`), not at the next reading an hour away: the agent says
# gridd_not_running within seconds. gridd is then started again (by the agent's remedy or
# here) and licensed.
gridd_not_running_lines() {
	guest journalctl -b --no-pager -o cat _SYSTEMD_UNIT="$NAME.service" MESSAGE_ID="$(catalog_id 'gridd_not_running')" | wc -l
}
gridd_not_running_more_than() { [ "$(gridd_not_running_lines)" -gt "$1" ]; }
check_gridd_killed() {
	local before
	before=$(gridd_not_running_lines)
	# kill(2) itself: `systemctl kill` fails on systemd 247 in a container ("Failed to send
	# signal SIGKILL to auxiliary processes").
	guest sh -c 'kill -KILL "$(systemctl show -P MainPID nvidia-gridd.service)"' || {
		guest systemctl start nvidia-gridd.service
		return 1
	}
	wait_until 15 gridd_not_running_more_than "$before" || {
		agent_journal_tail
		guest systemctl start nvidia-gridd.service
		return 1
	}
	guest systemctl start nvidia-gridd.service
	wait_until 60 agent_licensed
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
	# Last of the license checks: a gridd killed outright leaves its lease in the driver (as
	# nvidia-smi shows it) with no process of gridd's to return it, which the checks above,
	# restarting gridd with the DLS down, would see.
	check "gridd killed outright: gridd_not_running within seconds, from systemd's line about its unit" check_gridd_killed
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
# admins_own_kept: purge keeps a drop-in the admin added (here the boot test's own,
# 00-sim-pci.toml) and the directories that hold it, as dpkg keeps a directory that is not
# empty, and nothing else of /etc/$NAME; removed here by hand, as an admin would, so that
# what follows finds the guest clean.
admins_own_kept() {
	local kept want
	kept=$(guest find "/etc/$NAME" -mindepth 1 2>/dev/null | sort)
	want=$(printf '%s\n' "/etc/$NAME/config.d" "/etc/$NAME/config.d/00-sim-pci.toml")
	if [ "$kept" != "$want" ]; then
		echo "purge kept in /etc/$NAME: ${kept:-nothing}; expected the admin's drop-in alone" >&2
		return 1
	fi
	guest rm -r "/etc/$NAME"
}
check_purge() {
	DEBIAN_FRONTEND=noninteractive guest apt-get purge -y -q "$NAME" || return 1
	admins_own_kept || return 1
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
