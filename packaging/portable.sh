# shellcheck shell=bash
# Sourced by the scripts that build binaries for guests other than this machine (the release
# binary of packaging/build-release.sh, the simulator of deb/boot-test.sh): one toolchain, one
# glibc floor.
#
# The binaries link against glibc (not musl: tokio, getaddrinfo and anything that may later
# dlopen a system library stay on the guest's own libc), but only against the symbols of glibc
# 2.17: zig's linker stubs for that version stand in for this machine's glibc. 2.17 costs
# nothing: linked against 2.28 instead, the binary is byte for byte the same size (Rust's std
# supports 2.17 and looks up what is newer at run time), so the floor is the lowest one Rust
# supports rather than 2.28 (RHEL 8), which would leave out SLES 15 SP2 and older (glibc
# 2.26). (zig's toolchain itself makes the binary 25 KB larger than this machine's gcc and ld.)
#
# Needs: cargo (rustup, the host's toolchain: the target triple is the host's, so no
# `rustup target add`), python3 with venv and pip (PyPI for cargo-zigbuild and ziglang).

PORTABLE_TARGET=x86_64-unknown-linux-gnu
PORTABLE_GLIBC=2.17
# cargo-zigbuild's spelling: the target triple with the glibc version to link against.
# shellcheck disable=SC2034 # used by the scripts that source this file
PORTABLE_ZIG_TARGET=$PORTABLE_TARGET.$PORTABLE_GLIBC
# Pinned: a new zig may change the code it builds (ring's C and assembly) or its glibc stubs.
PORTABLE_PIP_PACKAGES=(cargo-zigbuild==0.24.1 ziglang==0.17.1)

# portable_toolchain TARGET_DIR: installs cargo-zigbuild and zig into TARGET_DIR/zigbuild (a
# Python venv, reused while its pins are the same) and puts them first on PATH.
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
	# cargo-zigbuild runs zig as `python3 -m ziglang`: the venv's python3 must come first.
	PATH=$venv/bin:$PATH
	export PATH
}

# portable_rustflags: the target's rustflags, for `env` before cargo zigbuild. zig's linker
# writes no build ID by default; rpm and debuggers use it to match a binary to its symbols.
portable_rustflags() {
	echo "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS=-C link-arg=-Wl,--build-id=sha1"
}

# glibc_needed BINARY: the highest GLIBC_ symbol version BINARY needs (e.g. 2.17).
glibc_needed() {
	objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/^GLIBC_//' | sort -V | tail -1
}

# check_glibc_floor BINARY: fails when BINARY needs a glibc newer than PORTABLE_GLIBC.
check_glibc_floor() {
	local needed
	needed=$(glibc_needed "$1")
	[ -n "$needed" ] || {
		echo "$1: no GLIBC_ symbol versions found (not a glibc binary?)" >&2
		return 1
	}
	if [ "$(printf '%s\n%s\n' "$needed" "$PORTABLE_GLIBC" | sort -V | tail -1)" != "$PORTABLE_GLIBC" ]; then
		echo "$1 needs GLIBC_$needed, above the floor $PORTABLE_GLIBC" >&2
		return 1
	fi
	echo "$1: needs glibc $needed (floor $PORTABLE_GLIBC)"
}
