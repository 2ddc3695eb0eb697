# shellcheck shell=bash
# Sourced by the scripts that build binaries for guests other than this machine (the release
# binary of packaging/build-release.sh, the simulator of deb/boot-test.sh): one toolchain, one
# target.
#
# The binaries are static-pie executables against musl (zig's, built with zig cc): no shared
# library at all, so they run on every x86_64 Linux with no floor on the guest's libc, and
# the service's RSS holds none of libc.so's and ld.so's pages (1.4 MiB of it, linked against
# glibc: docs/benchmarks.md). What musl does otherwise: host names are looked up in
# /etc/hosts, then by DNS with /etc/resolv.conf (nameserver, search, ndots, timeout,
# attempts), without /etc/nsswitch.conf's modules; systemd-resolved's stub in resolv.conf
# and Kubernetes' search domains work as they do for glibc.
#
# Needs: cargo (rustup, the host's toolchain, and the target's standard library, which
# portable_toolchain adds with rustup), python3 with venv and pip (PyPI for cargo-zigbuild
# and ziglang).

PORTABLE_TARGET=x86_64-unknown-linux-musl
# cargo-zigbuild's spelling of the target (the same: musl has no version to link against).
# shellcheck disable=SC2034 # used by the scripts that source this file
PORTABLE_ZIG_TARGET=$PORTABLE_TARGET
# Pinned: a new zig may change the code it builds (ring's C and assembly, musl) or its libc.
PORTABLE_PIP_PACKAGES=(cargo-zigbuild==0.24.1 ziglang==0.17.1)

# portable_toolchain TARGET_DIR: installs cargo-zigbuild and zig into TARGET_DIR/zigbuild (a
# Python venv, reused while its pins are the same) and puts them first on PATH; adds the
# target's standard library to the Rust toolchain when it is missing.
portable_toolchain() {
	local venv=$1/zigbuild stamp
	stamp=$(printf '%s\n' "${PORTABLE_PIP_PACKAGES[@]}")
	if [ "$(cat "$venv/.pinned" 2>/dev/null)" != "$stamp" ]; then
		echo "==> installing ${PORTABLE_PIP_PACKAGES[*]} into $venv"
		rm -rf "$venv"
		if ! python3 -m venv "$venv" ||
			! "$venv/bin/pip" install --quiet --disable-pip-version-check "${PORTABLE_PIP_PACKAGES[@]}"; then
			echo "cannot install ${PORTABLE_PIP_PACKAGES[*]} (python3 -m venv and PyPI are needed)" >&2
			return 1
		fi
		echo "$stamp" >"$venv/.pinned"
	fi
	if ! rustup target list --installed 2>/dev/null | grep -qx "$PORTABLE_TARGET"; then
		echo "==> rustup target add $PORTABLE_TARGET"
		rustup target add "$PORTABLE_TARGET" || {
			echo "cannot add the Rust target $PORTABLE_TARGET (rustup target add $PORTABLE_TARGET)" >&2
			return 1
		}
	fi
	# cargo-zigbuild runs zig as `python3 -m ziglang`: the venv's python3 must come first.
	PATH=$venv/bin:$PATH
	export PATH
}

# portable_rustflags: the target's rustflags, for `env` before cargo zigbuild. zig cc ignores
# rustc's -static-pie and would link a static executable at a fixed address: -pie makes it a
# static-pie (loaded at a random address, as a PIE is). zig's linker writes no build ID by
# default; rpm and debuggers use it to match a binary to its symbols.
portable_rustflags() {
	echo "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS=-C link-arg=-pie -C link-arg=-Wl,--build-id=sha1"
}

# check_static BINARY: fails unless BINARY is a static-pie executable (a PIE with no program
# interpreter and no shared library).
check_static() {
	local headers
	headers=$(readelf -hld "$1") || return 1
	if ! grep -q 'Type:.*DYN' <<<"$headers" || grep -q 'INTERP' <<<"$headers" ||
		grep -q '(NEEDED)' <<<"$headers"; then
		echo "$1 is not a static-pie executable:" >&2
		grep -E 'Type:|INTERP|NEEDED' <<<"$headers" >&2
		return 1
	fi
	echo "$1: static-pie, no shared library"
}
