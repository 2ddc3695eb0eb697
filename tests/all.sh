#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine as root (CI) or on a developer's:
#
#   bash tests/all.sh
#
# Installs the Debian packages the tests need when they are missing (as root), starts
# journald when nothing answers on its socket (the end-to-end tests read the real journal),
# then runs: cargo test (unit, samples, properties, install, the service's end-to-end
# scenarios), the cloud-init user-data check, the Debian package checks and the boot test in
# a real systemd guest. Every part runs even when an earlier one failed; the exit status is
# non-zero if any failed. A part that cannot run here says SKIPPED loudly and is not counted
# as passed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

APT_PACKAGES=(cloud-init lintian prometheus shellcheck dpkg-dev man-db binutils
  debootstrap systemd-container ca-certificates procps)

failed=()
skipped=()
part() { printf '\n######## %s ########\n' "$*"; }

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

part "cargo test"
cargo test --all-targets || failed+=("cargo test")
# Doc tests are not covered by --all-targets.
cargo test --doc || failed+=("cargo test --doc")

part "cloud-init user-data"
bash cloud-init/check.sh || failed+=("cloud-init/check.sh")

part "Debian package"
bash deb/check.sh || failed+=("deb/check.sh")

part "boot test in a systemd-nspawn guest"
bash deb/boot-test.sh
case $? in
  0) ;;
  77) skipped+=("deb/boot-test.sh") ;;
  *) failed+=("deb/boot-test.sh") ;;
esac

part "summary"
[ ${#skipped[@]} -eq 0 ] || echo "!!!!!!!! SKIPPED (not passed): ${skipped[*]} !!!!!!!!"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all tests passed"
