# shellcheck shell=bash
# The GPU Operator node guest of deb/boot-test.sh, sourced by it: a Kubernetes GPU worker whose
# GRID driver and nvidia-gridd run in the GPU Operator's driver container, booted with the
# package installed as a node image has it (dpkg -i in the chroot, no config of its own but
# the simulated PCI bus's drop-in). The node has no nvidia-gridd unit and no nvidia-smi. The
# driver pod is stood in for by a unit, as the container runtime runs the pod's container:
#   - its root (GO_ROOTFS: the simulated gridd and nvidia-smi at the real ones' paths, with
#     the libraries they load) bind-mounted at the node's /run/nvidia/driver;
#   - the Secret's two files (GO_SECRET) copied to its /etc/nvidia by its entrypoint;
#   - the operator's .driver-ctr-ready marker in /run/nvidia/validations;
#   - nvidia-gridd started once, in a mount namespace of its own whose / is that root and whose
#     /dev/log is the node's journal socket, in the node's PID namespace (hostPID: true), so
#     that its lines reach the node's journal under the container's unit, never
#     nvidia-gridd.service;
#   - stopped (the pod deleted): gridd gone, the marker removed, the root unmounted lazily
#     (umount -l -R, as the entrypoint's _unmount_rootfs does).
# Checks, with the guest's own systemctl and journalctl: the agent finds the node on its own
# and reports it licensed, in observe mode, in status, status.json and the metrics; it follows
# gridd's lines in the node's journal; `install` is refused and changes nothing; the DLS
# down and the pod made again (as an operator does after a change to the Secret), the
# failure's advice is the operator's (kubectl), never systemctl or install; the pod deleted,
# the report says so, and once it is back the node is licensed again. Throughout, the agent
# never restarts anything, and neither the node's /etc/nvidia nor the container's changes.

GO_GUEST=gpu-operator
GO_SUITE=bookworm
GO_NODE=gpu-worker-1
GO_UNIT=sim-nvidia-driver-ctr.service
GO_CTR=/var/lib/sim-driver-ctr
GO_ROOTFS=$GO_CTR/rootfs
GO_SECRET=$GO_CTR/secret
GO_DRIVER_ROOT=/run/nvidia/driver
GO_PRINT=

# go_wanted: whether the GPU Operator node boots in this run.
go_wanted() { wanted "$GO_GUEST" && [[ " ${SUITES[*]} " == *" $GO_SUITE "* ]]; }

# go_copy_with_libraries PROGRAM AT: PROGRAM of the simulator into the container's root at
# AT, with the libraries it loads (as the guest's loader finds them) at their own paths.
go_copy_with_libraries() {
	local rootfs=$GUEST$GO_ROOTFS lib
	install -D -m 0755 "$SIM_EXAMPLES/$1" "$rootfs$2" || return 1
	for lib in $(chroot "$GUEST" ldd "$GO_ROOTFS$2" | grep -o '/[^ ]*'); do
		[ -e "$rootfs$lib" ] || install -D -m 0755 "$(chroot "$GUEST" readlink -f "$lib" | sed "s|^|$GUEST|")" "$rootfs$lib" || return 1
	done
}

# go_driver_container: the driver pod's stand-in, its root, the Secret, and its unit.
go_driver_container() {
	go_copy_with_libraries sim-nvidia-gridd /usr/bin/nvidia-gridd &&
		go_copy_with_libraries sim-nvidia-smi /usr/bin/nvidia-smi || return 1
	mkdir -p "$GUEST$GO_ROOTFS/dev" "$GUEST$GO_ROOTFS/tmp" "$GUEST$GO_ROOTFS$SIM_DIR_GUEST" \
		"$GUEST$GO_ROOTFS/etc/nvidia/ClientConfigToken" "$GUEST$GO_SECRET" || return 1
	: >"$GUEST$GO_ROOTFS/dev/log"
	# The container's gridd retries by itself, as the real one does.
	echo '{"retry_seconds": 2.0}' >"$GUEST$GO_ROOTFS$SIM_DIR_GUEST/sim.json"
	# The Secret of driver.licensingConfig.secretName: gridd.conf and the DLS's token.
	printf 'FeatureType=1\n' >"$GUEST$GO_SECRET/gridd.conf"
	"$SIM_EXAMPLES/sim-dls" --write-token "127.0.0.1:$SIM_DLS_PORT" "$GUEST$GO_SECRET/client_configuration_token.tok" || return 1
	cat >"$GUEST/usr/local/bin/sim-driver-ctr" <<SCRIPT
#!/bin/sh
# The GPU Operator's driver container (vgpu-license-agent boot test): its root shared at the
# node's $GO_DRIVER_ROOT, the Secret's files copied in, nvidia-gridd started once in it.
set -e
root=$GO_ROOTFS
mkdir -p $GO_DRIVER_ROOT /run/nvidia/validations
mountpoint -q $GO_DRIVER_ROOT || mount --bind "\$root" $GO_DRIVER_ROOT
install -m 0644 $GO_SECRET/gridd.conf "\$root/etc/nvidia/gridd.conf"
install -m 0644 $GO_SECRET/client_configuration_token.tok "\$root/etc/nvidia/ClientConfigToken/client_configuration_token.tok"
touch /run/nvidia/validations/.driver-ctr-ready
exec unshare --mount --propagation private -- /bin/sh -c \\
	'mount --bind /run/systemd/journal/dev-log "\$1/dev/log" && exec chroot "\$1" /usr/bin/nvidia-gridd' sh "\$root"
SCRIPT
	chmod 0755 "$GUEST/usr/local/bin/sim-driver-ctr"
	cat >"$GUEST/etc/systemd/system/$GO_UNIT" <<UNIT
[Unit]
Description=the GPU Operator's driver container, simulated (vgpu-license-agent boot test)
Wants=sim-dls.service
After=network-online.target sim-dls.service
[Service]
ExecStart=/usr/local/bin/sim-driver-ctr
ExecStopPost=/bin/rm -f /run/nvidia/validations/.driver-ctr-ready
# The root goes GO_UMOUNT_DELAY seconds after gridd (systemctl set-environment), as a pod
# whose containers end one by one has it.
ExecStopPost=/bin/sh -c 'sleep "\$\${GO_UMOUNT_DELAY:-0}"'
# Lazily, as the real entrypoint's _unmount_rootfs does (umount -l -R): a process still in
# the root (a reading's nvidia-smi, run chrooted there) never keeps it mounted.
ExecStopPost=-/bin/umount -l -R $GO_DRIVER_ROOT
[Install]
WantedBy=multi-user.target
UNIT
	ln -sf "/etc/systemd/system/$GO_UNIT" "$GUEST/etc/systemd/system/multi-user.target.wants/$GO_UNIT"
	ln -sf /etc/systemd/system/sim-dls.service "$GUEST/etc/systemd/system/multi-user.target.wants/sim-dls.service"
}

# go_prepare: the node image, as a node image build makes it.
go_prepare() {
	GUEST=$WORK/$GO_GUEST
	banner "[$SUITE] the GPU Operator node: debootstrap, dpkg -i in the chroot, the driver container"
	debootstrap_root "$GUEST" "$(guest_include)" || {
		tail -20 "$WORK/$SUITE-debootstrap.log" >&2
		skip "[$SUITE] debootstrap failed (no mirror reachable?)"
		return 1
	}
	echo "$GO_NODE" >"$GUEST/etc/hostname"
	cp "$DEB" "$GUEST/tmp/" && chroot "$GUEST" dpkg -i "/tmp/$(basename "$DEB")" >/dev/null || return 1
	rm -f "$GUEST/tmp/$(basename "$DEB")"
	mkdir -p "$GUEST/var/lib/prometheus/node-exporter"
	sim_bus && sim_dls && go_driver_container || return 1
	[ ! -e "$GUEST/etc/nvidia" ] && [ ! -e "$GUEST/usr/bin/nvidia-smi" ] &&
		[ ! -e "$GUEST/etc/systemd/system/nvidia-gridd.service" ]
}

# What must never change: the node's /etc/nvidia (there is none) and the container's files
# (their bytes and modes: each start of the pod copies the Secret's files in anew).
go_fingerprint() {
	guest sh -c "ls -la /etc/nvidia 2>&1; cd $GO_ROOTFS/etc/nvidia && find . -printf '%p %m %s\n' | sort && sha256sum gridd.conf ClientConfigToken/*"
}
go_nothing_changed() {
	local now
	now=$(go_fingerprint)
	[ "$now" = "$GO_PRINT" ] && return 0
	echo "changed on the node:" >&2
	diff <(echo "$GO_PRINT") <(echo "$now") >&2
	return 1
}
go_status_json() { guest cat "/run/$NAME/status.json" 2>/dev/null; }
go_report() { go_status_json | "$PYTHON" -c "import json,sys; v=json.load(sys.stdin); print($1)" 2>/dev/null; }
go_state_is() { [ "$(go_report 'v["state"]')" = "$1" ]; }
go_reason_is() { [ "$(go_report '(v["failure"] or {}).get("reason")')" = "$1" ]; }
go_agent_restarts() { sed -n 's/^vgpu_license_gridd_restarts_total //p' "$GUEST/var/lib/prometheus/node-exporter/vgpu_license_agent.prom"; }
go_tail() {
	agent_journal_tail
	echo "--- the driver container's journal:"
	guest journalctl -b --no-pager -u "$GO_UNIT" | tail -15
	echo "--- status.json:"
	go_status_json
}

go_licensed() {
	local out code rc=0
	wait_until 90 go_state_is licensed || {
		echo "the agent's report never said licensed" >&2
		go_tail
		return 1
	}
	GO_PRINT=$(go_fingerprint)
	guest vgpu-license-agent status --wait 30 >/dev/null || {
		echo "status --wait 30 did not exit 0 on the licensed node" >&2
		rc=1
	}
	out=$(guest vgpu-license-agent status)
	code=$?
	echo "$out"
	[ "$code" = 0 ] || {
		echo "status exited $code" >&2
		rc=1
	}
	[ "$(go_report 'v["mode"]')" = observe ] || rc=1
	[ "$(go_report 'v["driver_root"]')" = "$GO_DRIVER_ROOT" ] || rc=1
	[ "$(go_report 'v["gpus"][0]["profile"]')" = "NVIDIA L40S-24Q" ] || rc=1
	[ $rc = 0 ] || go_tail
	return $rc
}

go_journal() {
	local unit_lines
	guest journalctl -b --no-pager -o verbose _COMM=nvidia-gridd MESSAGE="License acquired successfully." |
		grep -E '^\s+(_COMM|_SYSTEMD_UNIT|SYSLOG_IDENTIFIER|_UID|MESSAGE)=' | head -6
	guest journalctl -b --no-pager -o cat _COMM=nvidia-gridd _SYSTEMD_UNIT="$GO_UNIT" | grep -q 'License acquired successfully' || {
		echo "no gridd line under $GO_UNIT in the node's journal" >&2
		return 1
	}
	unit_lines=$(guest journalctl -b --no-pager -o cat -u nvidia-gridd.service | grep -vc '^-- No entries --$')
	[ "$unit_lines" = 0 ] || {
		echo "journalctl -u nvidia-gridd found $unit_lines lines on a node without the unit" >&2
		return 1
	}
	wait_until 30 report_lists_acquired || {
		echo "the agent's report lists no acquisition of the container's gridd" >&2
		go_tail
		return 1
	}
}

go_metrics() {
	local prom=$GUEST/var/lib/prometheus/node-exporter/vgpu_license_agent.prom
	# What is checked, shown.
	grep -E -e '^vgpu_license_licensed ' -e '^vgpu_license_agent_info\{' "$prom"
	grep -q '^vgpu_license_licensed 1$' "$prom" &&
		grep -E '^vgpu_license_agent_info\{' "$prom" | grep -q 'mode="observe"' &&
		grep -E '^vgpu_license_agent_info\{' "$prom" | grep -q 'driver="gpu_operator"'
}

go_install_refused() {
	local out code
	out=$(guest vgpu-license-agent install --token-file "$GO_SECRET/client_configuration_token.tok" 2>&1)
	code=$?
	echo "exit $code: $out"
	[ "$code" != 0 ] && grep -q 'GPU Operator' <<<"$out" && grep -q 'kubectl' <<<"$out" && go_nothing_changed
}

# go_status_says_failure: `status` exits 1 or 2 with dls_unreachable as its failure (its
# exit code and output left in GO_CODE and GO_OUT).
go_status_says_failure() {
	GO_OUT=$(guest vgpu-license-agent status)
	GO_CODE=$?
	{ [ "$GO_CODE" = 1 ] || [ "$GO_CODE" = 2 ]; } && grep -q '^Failure:  dls_unreachable' <<<"$GO_OUT"
}

go_fixed_in_operators_terms() {
	local advice rc=0 out code
	dls_mode down
	# The driver pod made again, as after a change to the Secret.
	guest systemctl restart "$GO_UNIT" || return 1
	wait_until 90 go_reason_is dls_unreachable || {
		echo "no dls_unreachable with the DLS down" >&2
		go_tail
		dls_mode up
		return 1
	}
	advice=$(go_report 'v["failure"]["advice"]')
	echo "advice: $advice"
	out=$(guest vgpu-license-agent diagnose 2>&1)
	code=$?
	echo "$out" | tail -25
	echo "diagnose: exit $code"
	grep -q 'systemctl\|vgpu-license-agent install\|chmod' <<<"$advice$out" && {
		echo "a fix that does not work on this node" >&2
		rc=1
	}
	# The lease the old gridd could not return may still show: a warning (1) then, else
	# critical (2); either way the failure and its fix. Waited for: the old gridd's failed
	# return alone may have been the dls_unreachable seen above, and between its new
	# gridd's start line and the reading after it the report is the last reading's.
	wait_until 60 go_status_says_failure || {
		echo "status exited $GO_CODE, without the failure: $GO_OUT" >&2
		rc=1
	}
	echo "status: exit $GO_CODE"
	dls_mode up
	wait_until 60 go_state_is licensed || {
		echo "not licensed again once the DLS was up (gridd retries by itself)" >&2
		go_tail
		rc=1
	}
	return $rc
}

# The pod deleted: said; a unit after vgpu-licensed.target waits meanwhile, and starts once
# the pod is back and its gridd licensed.
go_pod_away_and_back() {
	local rc=0 advice
	guest systemctl stop "$GO_UNIT" || return 1
	wait_until 60 go_reason_is driver_unavailable || {
		echo "the driver pod's absence is not said" >&2
		go_tail
		rc=1
	}
	advice=$(go_report 'v["failure"]["advice"]')
	echo "advice: $advice"
	grep -q "kubectl -n gpu-operator get pods .*spec.nodeName=$GO_NODE" <<<"$advice" || rc=1
	gate_reset
	gate_unit
	guest systemctl daemon-reload && guest systemctl start --no-block "$NEEDS_LICENSE" || return 1
	sleep 5
	if gate_active; then
		echo "$NEEDS_LICENSE started while the driver pod was away" >&2
		rc=1
	fi
	guest systemctl start "$GO_UNIT" || return 1
	wait_until 60 go_state_is licensed || {
		echo "not licensed once the driver pod was back" >&2
		go_tail
		rc=1
	}
	wait_until 90 gate_active && gate_saw_licensed || {
		echo "$NEEDS_LICENSE did not start once licensed, or before: $(guest systemctl is-active "$NEEDS_LICENSE" "$WAIT_UNIT")" >&2
		guest journalctl -b --no-pager -u "$WAIT_UNIT" | tail -10
		rc=1
	}
	return $rc
}

# go_watch_never SECS REASON...: status.json every half second for SECS seconds, failing at
# once on a report whose failure is one of REASON.
go_watch_never() {
	local end=$((SECONDS + $1)) r bad
	shift
	while [ "$SECONDS" -lt "$end" ]; do
		r=$(go_report '(v["failure"] or {}).get("reason")')
		for bad in "$@"; do
			[ "$r" = "$bad" ] && {
				echo "the report said $r" >&2
				go_tail
				return 1
			}
		done
		sleep 0.5
	done
}

# go_until_never SECS WHAT REASON...: waits up to SECS seconds for `go_WHAT`, failing at once on
# a report whose failure is one of REASON meanwhile.
go_until_never() {
	local end=$((SECONDS + $1)) what=$2
	shift 2
	until "$what"; do
		[ "$SECONDS" -lt "$end" ] || {
			echo "waited in vain for: $what" >&2
			go_tail
			return 1
		}
		go_watch_never 1 "$@" || return 1
	done
}
go_is_driver_unavailable() { go_reason_is driver_unavailable; }
go_is_licensed_clean() { go_state_is licensed && go_reason_is None; }
go_pod_going_noted() { go_report 'v["notes"]' | grep -q 'driver pod is going'; }

# The pod deleted the way whose preStop takes the readiness marker first: the marker, gridd
# 5 s later (SIGTERM: its lease returned), the root 10 s after. Its token going away is never
# token_missing ("put the token into the Secret"); the pod gone is driver_unavailable; made
# again, licensed.
go_marker_first() {
	local rc=0
	guest rm -f /run/nvidia/validations/.driver-ctr-ready || return 1
	wait_until 30 go_pod_going_noted || {
		echo "the marker's going is not noted" >&2
		rc=1
	}
	go_watch_never 5 token_missing token_stale || rc=1
	guest systemctl set-environment GO_UMOUNT_DELAY=10 || return 1
	guest systemctl stop --no-block "$GO_UNIT" || return 1
	go_until_never 60 go_is_driver_unavailable token_missing token_stale || rc=1
	guest systemctl unset-environment GO_UMOUNT_DELAY
	go_watch_never 5 token_missing token_stale || rc=1
	guest systemctl start "$GO_UNIT" || return 1
	go_until_never 60 go_is_licensed_clean token_missing token_stale || rc=1
	return $rc
}

# The rotation docs/kubernetes.md prescribes: the Secret rotated (a new token), then the
# driver pod made again. The new pod runs the new token, licensed, with no token verdict on
# the way; the container's files are the new Secret's from then on.
go_rotation() {
	local rc=0
	"$SIM_EXAMPLES/sim-dls" --token-id rotated-in-the-secret --write-token "127.0.0.1:$SIM_DLS_PORT" \
		"$GUEST$GO_SECRET/client_configuration_token.tok" || return 1
	guest systemctl restart "$GO_UNIT" || return 1
	go_until_never 60 go_is_licensed_clean token_missing token_stale || rc=1
	cmp -s "$GUEST$GO_SECRET/client_configuration_token.tok" \
		"$GUEST$GO_ROOTFS/etc/nvidia/ClientConfigToken/client_configuration_token.tok" || {
		echo "the new pod does not run the Secret's new token" >&2
		rc=1
	}
	go_watch_never 10 token_missing token_stale || rc=1
	# What must not change from now on: the new Secret's files.
	GO_PRINT=$(go_fingerprint)
	return $rc
}

go_never_restarted() {
	local n
	n=$(go_agent_restarts)
	echo "the agent's gridd restarts: ${n:-none}; the driver container started $(guest journalctl -b --no-pager -o cat -u "$GO_UNIT" | grep -c "^Started $GO_UNIT") times (the boot's and the test's)"
	[ "$n" = 0 ] && go_nothing_changed
}

go_checks() {
	local start=$SECONDS suite=$SUITE
	SUITE=$GO_SUITE
	if [ -n "$SIM_MISSING" ]; then
		echo "[$GO_GUEST] no GPU Operator node: $SIM_MISSING (counted once, above)" >&2
		return
	fi
	if go_prepare && boot_guest; then
		SUITE="$GO_SUITE $GO_GUEST"
		check "the agent finds the GPU Operator node on its own and reports it licensed, observe mode" go_licensed
		check "gridd's lines are followed in the node's journal, under the container's unit" go_journal
		check "the metrics say observe and gpu_operator" go_metrics
		check "install is refused with the operator's fix, and changes nothing" go_install_refused
		check "the DLS down, the pod made again: every fix is the operator's" go_fixed_in_operators_terms
		check "the driver pod deleted and back: said, vgpu-licensed.target waits, then licensed again" go_pod_away_and_back
		check "the driver pod going marker first: no verdict on its token, then driver_unavailable, then licensed" go_marker_first
		check "the documented rotation (the Secret rotated, the pod made again): licensed with the new token, no token verdict" go_rotation
		check "the agent restarted nothing and changed nothing on the node" go_never_restarted
	else
		fail "[$GO_SUITE $GO_GUEST] the node could not be made or booted"
	fi
	stop_guest
	TIMES+=("$GO_GUEST: $((SECONDS - start)) s")
	SUITE=$suite
}
