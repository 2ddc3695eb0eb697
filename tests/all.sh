#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine as root (CI) or on a developer's:
#
#   bash tests/all.sh
#
# Installs the Debian packages the tests need when they are missing (as root), without
# starting or enabling any of their services (see install_packages), starts journald when
# nothing answers on its socket (the end-to-end tests read the real journal; it is stopped at
# the end), then runs: cargo test (unit, samples, properties, install, the service's end-to-end
# scenarios), the cloud-init user-data check, the Debian and RPM package checks, the OCI
# image (make image) and the boot test in real systemd guests. Every part runs even when an
# earlier one failed.
#
# The parts run in two lanes at once, since most of each waits (on a simulated machine, a
# guest's boot, the archive) rather than computes: the tests (cargo test, the doc tests,
# cloud-init), and the packages (the Debian and RPM checks, then the boot test, whose
# debootstrapped trees are made meanwhile). Each part's output is shown whole when it ends.
#
# A part exits 0 when it passed, 77 when something in it could not run on this machine (no
# root, no mount, no mirror: it says SKIPPED and why, loudly), anything else when it failed.
# The summary counts parts: "N passed, N skipped, N failed"; a part that skipped anything is
# not counted as passed. The exit status is non-zero if any part failed, or, with
# VGPU_TESTS_NO_SKIP=1 in the environment (.ci/run sets it), if anything was skipped: the
# parts and the tests read it too, and fail where they would have skipped.
#
#   bash tests/all.sh --install-only
#
# only installs the packages (as below) and exits: .ci/run does so while the style gates
# compile.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
INSTALL_ONLY=0
[ "${1:-}" = --install-only ] && INSTALL_ONLY=1
export PATH="$HOME/.cargo/bin:$PATH"

APT_PACKAGES=(cloud-init lintian prometheus shellcheck dpkg-dev man-db binutils openssl
  debootstrap systemd-container ca-certificates procps victoria-metrics python3-yaml
  python3-jsonschema rpm rpmlint cpio gnupg make buildah podman runc)

NO_SKIP=${VGPU_TESTS_NO_SKIP:-0}
passed=()
failed=()
skipped=()
timings=()
part() { printf '\n######## %s ########\n' "$*"; }
# count_part NAME RC SECONDS: counts the part NAME by its exit status.
count_part() {
  local name=$1 rc=$2
  timings+=("$(printf '%5d s  %s' "$3" "$name")")
  case $rc in
    0) passed+=("$name") ;;
    77)
      if [ "$NO_SKIP" = 1 ]; then
        failed+=("$name (skipped a part; VGPU_TESTS_NO_SKIP=1)")
      else
        skipped+=("$name")
      fi
      ;;
    *) failed+=("$name") ;;
  esac
}
# run_part NAME COMMAND...: runs COMMAND as the part NAME and counts it by its exit status.
run_part() {
  local name=$1
  shift
  part "$name"
  local start=$SECONDS rc
  "$@"
  rc=$?
  count_part "$name" "$rc" $((SECONDS - start))
}

# In a lane (a background shell): lane_part NAME COMMAND... runs COMMAND with its output in
# a file, then shows that output whole (one part at a time on the terminal) and records the
# result in $RESULTS for the summary.
RESULTS=$(mktemp)
OUTPUT_LOCK=$(mktemp)
lane_part() {
  local name=$1 out start=$SECONDS rc
  shift
  out=$(mktemp)
  echo "started: $name"
  "$@" >"$out" 2>&1 </dev/null
  rc=$?
  {
    flock 9
    part "$name (exit $rc, $((SECONDS - start)) s)"
    cat "$out"
    printf '%s\t%s\t%s\n' "$rc" $((SECONDS - start)) "$name" >>"$RESULTS"
  } 9>>"$OUTPUT_LOCK"
  rm -f "$out"
}

# Tests that cannot run a part of themselves here append a line to this file (and, with
# VGPU_TESTS_NO_SKIP=1, fail instead): their output is hidden when they pass.
VGPU_TESTS_SKIP_LOG=$(mktemp)
export VGPU_TESTS_SKIP_LOG

# What this script set up and must take down on its way out, whatever stops it.
POLICY_RC_D=/usr/sbin/policy-rc.d
POLICY_RC_D_OURS=0
JOURNALD_PID=
JOURNALD_DIRS_OURS=()
LANES=()
cleanup() {
  [ ${#LANES[@]} -eq 0 ] || kill "${LANES[@]}" 2>/dev/null
  rm -f "$VGPU_TESTS_SKIP_LOG" "$RESULTS" "$OUTPUT_LOCK"
  if [ "$POLICY_RC_D_OURS" = 1 ]; then
    rm -f "$POLICY_RC_D"
    POLICY_RC_D_OURS=0
  fi
  [ -z "$JOURNALD_PID" ] || stop_journald
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cargo_tests() {
  : >"$VGPU_TESTS_SKIP_LOG"
  local out rc=0
  out=$(mktemp)
  # The build yields the cores to the other lane's release build (nice): the packages and
  # the boot test after them are the longer lane. The tests then run at the usual priority.
  # The whole workspace: the model crate's tests are as much the product's as the agent's.
  nice -n 10 cargo test --workspace --all-targets --no-run 2>&1 | tee "$out" || rc=1
  # Every test binary runs even when an earlier one failed: one red run shows every failure.
  cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee -a "$out" || rc=1
  # An #[ignore]d test is a skipped one: it counts as such.
  if grep -qE '; [1-9][0-9]* ignored;' "$out"; then
    echo "!!!!!!!! ignored tests (#[ignore]): !!!!!!!!"
    grep -E '^test .* \.\.\. ignored' "$out" >>"$VGPU_TESTS_SKIP_LOG"
    grep -E '^test .* \.\.\. ignored' "$out"
  fi
  rm -f "$out"
  [ "$rc" = 0 ] || return 1
  if [ -s "$VGPU_TESTS_SKIP_LOG" ]; then
    echo "!!!!!!!! tests that skipped a part of themselves here: !!!!!!!!"
    cat "$VGPU_TESTS_SKIP_LOG"
    return 77
  fi
}

# ---- The Debian packages the tests need, installed without touching the machine's services

installed_packages() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 == "ii" { print $2 }' | sort
}
unit_links() { find /etc/systemd -type l 2>/dev/null | sort; }

# install_packages PACKAGE...: apt-get install, leaving the machine's services as they were.
# - A policy-rc.d that refuses every start (exit 101, the documented "action forbidden") is
#   in place for the install, made by this script where none existed (and removed again
#   whatever happens, see cleanup); where the machine has one already, it is the machine's
#   and it decides.
# - The units that the packages' maintainer scripts enabled (prometheus.service,
#   victoria-metrics.service, cloud-init's, those of a dependency pulled in) are disabled
#   again with deb-systemd-helper, which keeps them disabled across upgrades; any other link
#   under /etc/systemd that the install made is removed. The tests run their own instances
#   (tests/fleet.rs: Prometheus and VictoriaMetrics on loopback, in temporary directories).
# - cloud-init, when the machine did not have it, is disabled for the next boots with
#   /etc/cloud/cloud-init.disabled (cloud-init's own switch, read by its systemd generator):
#   the tests only validate user-data with `cloud-init schema`. A machine that had cloud-init
#   keeps its setting.
install_packages() {
  local before_pkgs before_links had_cloud_init=0 made_ci_disabled=0 rc=0 u link
  before_pkgs=$(installed_packages)
  before_links=$(unit_links)
  grep -qx cloud-init <<<"$before_pkgs" && had_cloud_init=1
  if [ ! -e "$POLICY_RC_D" ] && [ ! -L "$POLICY_RC_D" ]; then
    # Ours from before it is made: an interrupted run removes it all the same.
    POLICY_RC_D_OURS=1
    printf '#!/bin/sh\n# tests/all.sh: no service starts while it installs packages.\nexit 101\n' >"$POLICY_RC_D" &&
      chmod 0755 "$POLICY_RC_D"
  else
    echo "$POLICY_RC_D exists already: it decides which services the install starts"
  fi
  if [ "$had_cloud_init" = 0 ] && [ ! -e /etc/cloud/cloud-init.disabled ]; then
    mkdir -p /etc/cloud && : >/etc/cloud/cloud-init.disabled && made_ci_disabled=1
  fi
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" || rc=1
  if [ "$POLICY_RC_D_OURS" = 1 ]; then
    rm -f "$POLICY_RC_D"
    POLICY_RC_D_OURS=0
  fi
  # cloud-init.disabled stays only where cloud-init now is.
  if [ "$made_ci_disabled" = 1 ] && ! installed_packages | grep -qx cloud-init; then
    rm -f /etc/cloud/cloud-init.disabled
    rmdir /etc/cloud 2>/dev/null
  fi
  # Every unit the install enabled (a link to it under /etc/systemd that was not there
  # before), disabled again.
  local new_links units=()
  new_links=$(comm -13 <(echo "$before_links") <(unit_links))
  for link in $new_links; do
    u=$(readlink "$link")
    # A mask (a link to /dev/null) disables, it enables nothing.
    [ "$u" = /dev/null ] || units+=("$(basename "$u")")
  done
  for u in $(printf '%s\n' "${units[@]}" | sort -u); do
    echo "the install enabled $u: disabled again (the tests start their own instances)"
    if command -v deb-systemd-helper >/dev/null && deb-systemd-helper debian-installed "$u"; then
      deb-systemd-helper disable "$u"
    fi
  done
  for link in $new_links; do
    if [ ! -L "$link" ] || [ "$(readlink "$link")" = /dev/null ]; then continue; fi
    # A link a package ships is the package's.
    dpkg -S "$link" >/dev/null 2>&1 && continue
    echo "the install made $link: removed"
    rm -f "$link"
  done
  return $rc
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    part "installing ${missing[*]} (no service started or enabled)"
    install_packages "${missing[@]}" || failed+=("apt-get install ${missing[*]}")
  else
    echo "!!!!!!!! not root: cannot install ${missing[*]}; the parts that need them will fail or skip !!!!!!!!" >&2
  fi
fi
if [ "$INSTALL_ONLY" = 1 ]; then
  [ ${#failed[@]} -eq 0 ] || {
    echo "FAILED: ${failed[*]}"
    exit 1
  }
  echo "the packages the tests need are installed"
  exit 0
fi

# ---- journald: the end-to-end tests read the real journal

JOURNAL_SOCKET=/run/systemd/journal/socket
# Something answers on journald's socket (a socket file left by a journald that is gone does
# not).
journald_answers() {
  [ -S "$JOURNAL_SOCKET" ] && [ -e /run/systemd/journal/dev-log ] || return 1
  command -v python3 >/dev/null || return 0
  python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).connect(sys.argv[1])' \
    "$JOURNAL_SOCKET" 2>/dev/null
}
# stop_journald: stops the journald this script started, if it did, and removes its sockets
# and the volatile journal it wrote where those directories were not there before.
stop_journald() {
  [ -n "$JOURNALD_PID" ] || return 0
  kill -TERM "$JOURNALD_PID" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$JOURNALD_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$JOURNALD_PID" 2>/dev/null
  wait "$JOURNALD_PID" 2>/dev/null
  echo "stopped the systemd-journald this run started (pid $JOURNALD_PID)"
  JOURNALD_PID=
  local d
  for d in "${JOURNALD_DIRS_OURS[@]}"; do rm -rf "$d"; done
  JOURNALD_DIRS_OURS=()
}
if ! journald_answers; then
  journald_bin=
  for b in /lib/systemd/systemd-journald /usr/lib/systemd/systemd-journald; do
    [ -x "$b" ] && journald_bin=$b && break
  done
  if [ -n "$journald_bin" ] && [ "$(id -u)" = 0 ]; then
    part "starting systemd-journald for this run (nothing answers on $JOURNAL_SOCKET; stopped at the end)"
    for d in /run/systemd/journal /run/log/journal; do
      [ -e "$d" ] || JOURNALD_DIRS_OURS+=("$d")
    done
    # Not a service of a systemd that runs this script.
    env -u NOTIFY_SOCKET -u WATCHDOG_USEC -u WATCHDOG_PID "$journald_bin" </dev/null >/dev/null 2>&1 &
    JOURNALD_PID=$!
    for _ in $(seq 100); do journald_answers && break; sleep 0.1; done
    journald_answers || echo "!!!!!!!! started $journald_bin (pid $JOURNALD_PID), but nothing answers on $JOURNAL_SOCKET !!!!!!!!" >&2
  else
    echo "!!!!!!!! nothing answers on $JOURNAL_SOCKET and journald cannot be started here (not root, or not installed): the end-to-end tests will fail or skip !!!!!!!!" >&2
  fi
fi

# The boot test, once the debootstrap cache is filled (its output first).
boot_test() {
  local rc=0
  wait "$BOOT_CACHE_PID" || rc=$?
  cat "$RESULTS.cache"
  rm -f "$RESULTS.cache"
  case $rc in
    0) ;;
    77) echo "the debootstrap cache could not be filled here (see above)" ;;
    *) echo "!!!!!!!! filling the debootstrap cache failed (exit $rc): the boot test makes its trees itself !!!!!!!!" ;;
  esac
  bash deb/boot-test.sh
}

part "the parts, in two lanes at once"
(
  lane_part "cargo test" cargo_tests
  # Doc tests are not covered by --all-targets.
  lane_part "cargo test --doc" cargo test --workspace --doc
  lane_part "cloud-init user-data" bash cloud-init/check.sh
) &
LANES+=($!)
(
  # The boot test's trees, made (or found fresh in the cache) while the packages build.
  bash deb/boot-test.sh --fill-cache >"$RESULTS.cache" 2>&1 &
  BOOT_CACHE_PID=$!
  lane_part "Debian package" bash deb/check.sh
  lane_part "RPM package" bash rpm/check.sh
  lane_part "OCI image (make image)" bash packaging/build-image.sh
  lane_part "boot test in systemd-nspawn guests (bookworm, bullseye, cloud-init, GPU Operator node, vGPU host)" boot_test
) &
LANES+=($!)
wait "${LANES[@]}"
LANES=()
while IFS=$'\t' read -r rc secs name; do
  count_part "$name" "$rc" "$secs"
done <"$RESULTS"

stop_journald

part "summary"
echo "time of each part:"
printf '  %s\n' "${timings[@]}"
echo "  $(printf '%5d s' "$SECONDS")  in all"
for s in "${skipped[@]}"; do echo "SKIPPED (not passed): $s"; done
for f in "${failed[@]}"; do echo "FAILED: $f"; done
echo "parts: ${#passed[@]} passed, ${#skipped[@]} skipped, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ] || exit 1
if [ ${#skipped[@]} -gt 0 ]; then
  echo "!!!!!!!! not a full pass: ${#skipped[@]} part(s) skipped something (see above) !!!!!!!!"
else
  echo "all tests passed"
fi
