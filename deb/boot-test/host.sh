# shellcheck shell=bash
# The vGPU host guest of deb/boot-test.sh, sourced by it: a hypervisor (a KubeVirt or Proxmox
# node) with NVIDIA's vGPU manager, booted with the package installed as a host image has it
# (dpkg -i in the chroot, no config of its own but the simulated PCI bus's drop-in). The
# vGPU manager is the simulator's: its nvidia-smi in host mode (`-q` shows `Host VGPU`,
# `vgpu -q` lists the VMs as a real host does) and its nvidia-vgpu-mgr, which takes one VM
# through a change and logs the real manager's lines to the guest's journal. The host has no
# nvidia-gridd, no token, no DLS.
# Checks, with the guest's own systemctl and journalctl: the packaged service finds the host
# on its own (`service.role = "auto"`) and reports each VM; a tenant VM throttled reaches
# `status`, the metrics textfile and the journal within 10 s of the manager's line; a VM that
# stops leaves the report and the metrics; `diagnose` names the throttled VM; and the
# service installs, adopts and restarts nothing (there is nothing of a guest's to touch).

HO_GUEST=vgpu-host
HO_SUITE=bookworm
HO_A=(3251637554 licensed tenant-a_vm-a 6939a743-b4d3-4b8f-b917-a8f7009744ee)
HO_B=(3251637566 unlicensed tenant-b_vm-b 43f26719-90d9-4b25-80eb-040b44132eb8)

# ho_wanted: whether the vGPU host boots in this run.
ho_wanted() { wanted "$HO_GUEST" && [[ " ${SUITES[*]} " == *" $HO_SUITE "* ]]; }

# ho_prepare: the host's image, as a host image build makes it.
ho_prepare() {
	GUEST=$WORK/$HO_GUEST
	banner "[$SUITE] the vGPU host: debootstrap, dpkg -i in the chroot, the vGPU manager"
	debootstrap_root "$GUEST" "$(guest_include)" || {
		tail -20 "$WORK/$SUITE-debootstrap.log" >&2
		skip "[$SUITE] debootstrap failed (no mirror reachable?)"
		return 1
	}
	echo vgpu-host-1 >"$GUEST/etc/hostname"
	cp "$DEB" "$GUEST/tmp/" && chroot "$GUEST" dpkg -i "/tmp/$(basename "$DEB")" >/dev/null || return 1
	rm -f "$GUEST/tmp/$(basename "$DEB")"
	mkdir -p "$GUEST/var/lib/prometheus/node-exporter" "$GUEST$SIM_DIR_GUEST"
	sim_bus || return 1
	install -m 0755 "$SIM_EXAMPLES/sim-nvidia-smi" "$GUEST/usr/bin/nvidia-smi" &&
		install -m 0755 "$SIM_EXAMPLES/sim-nvidia-vgpu-mgr" "$GUEST/usr/bin/nvidia-vgpu-mgr" || return 1
	echo '{"host": true}' >"$GUEST$SIM_DIR_GUEST/sim.json"
	[ ! -e "$GUEST/etc/systemd/system/nvidia-gridd.service" ] && [ ! -e "$GUEST/etc/nvidia" ]
}

ho_report() { guest cat "/run/$NAME/status.json" 2>/dev/null | "$PYTHON" -c "import json,sys; v=json.load(sys.stdin); print($1)" 2>/dev/null; }
ho_vm_state() { ho_report "[m['state'] for m in v.get('vms') or [] if m['vgpu_id'] == '$1'][0]"; }
ho_vm_state_is() { [ "$(ho_vm_state "$1")" = "$2" ]; }
ho_vms_are() { [ "$(ho_report "len(v.get('vms') or [])")" = "$1" ]; }
ho_metric() { grep -F "$1{" "$GUEST/var/lib/prometheus/node-exporter/vgpu_license_agent.prom" 2>/dev/null | grep -F "vm=\"$2\"" | awk '{print $NF}'; }
ho_metric_is() { [ "$(ho_metric "$1" "$2")" = "$3" ]; }
ho_journal_has() { guest journalctl -b --no-pager -o cat -u "$NAME.service" | grep -qF "$1"; }
ho_tail() {
	echo "--- status.json:"
	guest cat "/run/$NAME/status.json" 2>/dev/null | head -60
	echo "--- the agent's journal:"
	guest journalctl -b --no-pager -u "$NAME.service" | tail -20
}

# The packaged service on the host, on its own: the role, both VMs, the host's state.
ho_reports_each_vm() {
	guest nvidia-vgpu-mgr "${HO_A[@]}" && guest nvidia-vgpu-mgr "${HO_B[@]}" || return 1
	wait_until 60 ho_vms_are 2 || {
		ho_tail
		return 1
	}
	local role state
	role=$(ho_report 'v["role"]')
	state=$(ho_report 'v["state"]')
	echo "role: $role, state: $state"
	[ "$role" = host ] && [ "$state" = unlicensed ] &&
		ho_vm_state_is "${HO_A[0]}" licensed && ho_vm_state_is "${HO_B[0]}" unlicensed
}

# A tenant's VM throttled: status, the metrics and the journal within 10 s of the line.
ho_vm_restricted() {
	local start=$SECONDS line
	guest nvidia-vgpu-mgr "${HO_B[0]}" restricted || return 1
	wait_until 10 ho_vm_state_is "${HO_B[0]}" restricted || {
		ho_tail
		return 1
	}
	echo "status.json: restricted after $((SECONDS - start)) s"
	wait_until 5 ho_metric_is vgpu_license_vm_restricted "${HO_B[2]}" 1 || {
		echo "the metrics textfile does not say the VM is restricted:" >&2
		grep '^vgpu_license_vm_' "$GUEST/var/lib/prometheus/node-exporter/vgpu_license_agent.prom" >&2
		return 1
	}
	line="VM tenant-b/vm-b (vGPU ${HO_B[0]}): unlicensed -> restricted"
	wait_until 10 ho_journal_has "$line" || {
		ho_tail
		return 1
	}
	local out code
	out=$(guest "$NAME" diagnose)
	code=$?
	echo "$out"
	[ "$code" = 2 ] && grep -q '^FAIL vm .*tenant-b/vm-b' <<<"$out"
}

# A VM stopped: gone from the report and the metrics at the next reading.
ho_vm_stopped() {
	guest nvidia-vgpu-mgr "${HO_B[0]}" stopped || return 1
	wait_until 30 ho_vms_are 1 || {
		ho_tail
		return 1
	}
	[ -z "$(ho_metric vgpu_license_vm_licensed "${HO_B[2]}")" ] || {
		echo "the metrics keep a series of the VM gone" >&2
		return 1
	}
}

# Nothing of a guest's was touched: no token or gridd.conf written (/etc/nvidia is the
# package's empty directory), no restart of gridd, nor any attempt.
ho_changed_nothing() {
	local files
	files=$(find "$GUEST/etc/nvidia" -mindepth 1 2>/dev/null)
	[ -z "$files" ] || {
		echo "written on the host: $files" >&2
		return 1
	}
	local said
	said=$(guest journalctl -b --no-pager -o cat -u "$NAME.service" | grep 'nvidia-gridd\|token')
	[ -z "$said" ] || {
		echo "the host's service spoke of gridd or a token:" >&2
		echo "$said" >&2
		return 1
	}
}

ho_checks() {
	local start=$SECONDS suite=$SUITE
	SUITE=$HO_SUITE
	if [ -n "$SIM_MISSING" ]; then
		echo "[$HO_GUEST] no vGPU host: $SIM_MISSING (counted once, above)" >&2
		return
	fi
	if ho_prepare && boot_guest; then
		SUITE="$HO_SUITE $HO_GUEST"
		check "the packaged service finds the host on its own and reports each VM's vGPU" ho_reports_each_vm
		check "a tenant VM throttled: status, metrics and journal within 10 s of the manager's line; diagnose names it" ho_vm_restricted
		check "a VM stopped leaves the report and the metrics" ho_vm_stopped
		check "the host's service changed nothing and restarted nothing" ho_changed_nothing
	else
		fail "[$HO_SUITE $HO_GUEST] the host could not be made or booted"
	fi
	stop_guest
	TIMES+=("$HO_GUEST: $((SECONDS - start)) s")
	SUITE=$suite
}
