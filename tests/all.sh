#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine as root (CI) or on a developer's:
#
#   bash tests/all.sh
#
# Installs the Debian packages the tests need when they are missing (as root), starts
# journald when nothing answers on its socket (the end-to-end tests read the real journal),
# then runs: cargo test (unit, samples, properties, install, the service's end-to-end
# scenarios), the cloud-init user-data check, the Debian and RPM package checks and the boot
# test in real systemd guests. Every part runs even when an earlier one failed.
#
# A part exits 0 when it passed, 77 when something in it could not run on this machine (no
# root, no mount, no mirror: it says SKIPPED and why, loudly), anything else when it failed.
# The summary counts parts: "N passed, N skipped, N failed"; a part that skipped anything is
# not counted as passed. The exit status is non-zero if any part failed, or, with
# VGPU_TESTS_NO_SKIP=1 in the environment (.ci/run sets it), if anything was skipped: the
# parts and the tests read it too, and fail where they would have skipped.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$HOME/.cargo/bin:$PATH"

APT_PACKAGES=(cloud-init lintian prometheus shellcheck dpkg-dev man-db binutils
  debootstrap systemd-container ca-certificates procps victoria-metrics python3-yaml
  python3-jsonschema rpm rpmlint cpio gnupg make)

NO_SKIP=${VGPU_TESTS_NO_SKIP:-0}
passed=()
failed=()
skipped=()
timings=()
part() { printf '\n######## %s ########\n' "$*"; }
# run_part NAME COMMAND...: runs COMMAND as the part NAME and counts it by its exit status.
run_part() {
  local name=$1
  shift
  part "$name"
  local start=$SECONDS rc
  "$@"
  rc=$?
  timings+=("$(printf '%5d s  %s' $((SECONDS - start)) "$name")")
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

# Tests that cannot run a part of themselves here append a line to this file (and, with
# VGPU_TESTS_NO_SKIP=1, fail instead): their output is hidden when they pass.
VGPU_TESTS_SKIP_LOG=$(mktemp)
export VGPU_TESTS_SKIP_LOG
trap 'rm -f "$VGPU_TESTS_SKIP_LOG"' EXIT
cargo_tests() {
  : >"$VGPU_TESTS_SKIP_LOG"
  local out rc=0
  out=$(mktemp)
  # Every test binary runs even when an earlier one failed: one red run shows every failure.
  cargo test --all-targets --no-fail-fast 2>&1 | tee "$out" || rc=1
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

missing=()
for p in "${APT_PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    part "installing ${missing[*]}"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
      failed+=("apt-get install ${missing[*]}")
  else
    echo "!!!!!!!! not root: cannot install ${missing[*]}; the parts that need them will fail or skip !!!!!!!!" >&2
  fi
fi

if [ ! -S /run/systemd/journal/socket ]; then
  part "starting systemd-journald (nothing answers on /run/systemd/journal/socket)"
  /lib/systemd/systemd-journald &
  for _ in $(seq 50); do [ -S /run/systemd/journal/socket ] && break; sleep 0.1; done
fi

run_part "cargo test" cargo_tests
# Doc tests are not covered by --all-targets.
run_part "cargo test --doc" cargo test --doc
run_part "cloud-init user-data" bash cloud-init/check.sh
run_part "Debian package" bash deb/check.sh
run_part "RPM package" bash rpm/check.sh
run_part "boot test in systemd-nspawn guests (bookworm, bullseye)" bash deb/boot-test.sh

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
