# shellcheck shell=bash
# The cloud-init guests of deb/boot-test.sh, one per user-data file of cloud-init/, sourced
# by it; their golden images are deb/boot-test/golden.sh's.

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
# agent_counted_n N: the agent has said its Nth restart of gridd in the journal and in its
# metrics (gridd's own start line can come before either: the agent logs the restart once
# systemctl returns, and writes the metrics with its next report).
agent_counted_n() {
	local logged
	logged=$(agent_restarts_logged)
	[ "$logged" -ge "$1" ] && [ "$(agent_metric vgpu_license_gridd_restarts_total)" = "$logged" ]
}

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
ci_report_names_dls() {
	guest cat "/run/$NAME/status.json" 2>/dev/null | grep -qE "\"host\": *\"$CI_DLS_HOST\""
}
ci_report() {
	local out rc
	# runcmd may put the new token in place after the agent has reported the old one's DLS
	# (licensed by it, until gridd restarts): the report names the new DLS once the agent
	# has adopted it.
	wait_until 30 ci_report_names_dls || true
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

# ci_boot_order: the boot waited on the agent only for its start, never for a license.
# cloud-init's first three stages are ordered after nothing that is ordered after the agent.
# cloud-final.service (Debian's cloud-init orders it after multi-user.target, hence after
# every service started for that target) waits for the agent's readiness (Type=notify) as
# for every other such service: when the agent, ordered after cloud-config.service, is the
# last of them to be ready, it is on cloud-final's critical chain, for the time from its
# start to its readiness, which must be under 5 s, licensed or not. What waits for a license
# (vgpu-licensed.target) is never on that chain.
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
	if grep -qF "vgpu-licensed.target" <<<"$chain"; then
		echo "vgpu-licensed.target is on cloud-final.service's critical chain: the boot waited for a license" >&2
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
		[ "$n" = 1 ] && check "boot $n: the boot waited on the agent only for its start, never for a license" ci_boot_order
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
	ci_token_installed && wait_until 120 gridd_started_n 3 && wait_until 30 agent_counted_n 2 &&
		ci_report && ci_restarts 3 2
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
	wait_until 120 gridd_started_n $((starts + 1)) &&
		wait_until 30 agent_counted_n $((restarts + 1)) && ci_report || return 1
	ci_restarts $((starts + 1)) $((restarts + 1))
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
