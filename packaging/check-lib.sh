# shellcheck shell=bash
# What deb/check.sh and rpm/check.sh share: running named checks that each may fail without
# stopping the others, the Debian packages they need, and the summary. Sourced; the caller
# sets APT_PACKAGES first.

FAILED=()

banner() { printf '\n======== %s ========\n' "$*"; }
fail() {
	echo "FAILED: $*" >&2
	FAILED+=("$*")
}
# check NAME COMMAND...: runs COMMAND, records NAME as failed when it fails.
check() {
	local name=$1
	shift
	banner "$name"
	if "$@"; then
		echo "ok: $name"
	else
		fail "$name"
	fi
}

# Installs the missing ones of APT_PACKAGES (as root).
install_missing_packages() {
	local missing=() p
	for p in "${APT_PACKAGES[@]}"; do
		[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] ||
			missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	echo "installing: ${missing[*]}"
	[ "$(id -u)" = 0 ] || {
		echo "need root to install ${missing[*]}" >&2
		return 1
	}
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The end: every failed check by name, exit 1 if any failed.
summary() {
	banner "summary"
	if [ ${#FAILED[@]} -gt 0 ]; then
		for f in "${FAILED[@]}"; do echo "FAILED: $f"; done
		exit 1
	fi
	echo "all checks passed"
}
