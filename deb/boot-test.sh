#!/bin/bash
# Boot test of the packages in real systemd guests:
#
#   bash deb/boot-test.sh [PACKAGE.deb]      (default: the one deb/build.sh made)
#
# For each Debian release of BOOT_TEST_SUITES (default: bookworm, systemd 252, and bullseye,
# systemd 247, the oldest the portable binary is tested on): debootstrap
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
# guests: each release of BOOT_TEST_SUITES by its name, the cloud-init guests by their
# user-data (write-files, runcmd, kubevirt-token-source), and the GPU Operator node
# (gpu-operator, from bookworm's tree: deb/boot-test/gpu-operator.sh), and the vGPU host
# (vgpu-host, from bookworm's tree: deb/boot-test/host.sh); BOOT_TEST_ONLY="NAME..."
# boots those alone, in this run. Each kind of guest is a file of deb/boot-test/, beside
# lib.sh, what they share. `bash deb/boot-test.sh --fill-cache` only makes the cached trees
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

# One file per kind of guest, and what they share.
BOOT_TEST_LIB=$ROOT/deb/boot-test
# shellcheck source=deb/boot-test/lib.sh
. "$BOOT_TEST_LIB/lib.sh"
# shellcheck source=deb/boot-test/release.sh
. "$BOOT_TEST_LIB/release.sh"
# shellcheck source=deb/boot-test/cloud-init.sh
. "$BOOT_TEST_LIB/cloud-init.sh"
# shellcheck source=deb/boot-test/golden.sh
. "$BOOT_TEST_LIB/golden.sh"
# shellcheck source=deb/boot-test/gpu-operator.sh
. "$BOOT_TEST_LIB/gpu-operator.sh"
# shellcheck source=deb/boot-test/host.sh
. "$BOOT_TEST_LIB/host.sh"

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
	[[ " ${SUITES[*]} " != *" $GO_SUITE "* ]] || echo "$GO_GUEST"
	[[ " ${SUITES[*]} " != *" $HO_SUITE "* ]] || echo "$HO_GUEST"
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
! go_wanted || go_checks
! ho_wanted || ho_checks
echo
echo "time per guest (debootstrap, boot, checks; a cloud-init guest: its three boots): ${TIMES[*]}"
echo "boot test: $SECONDS s in all"
summary
