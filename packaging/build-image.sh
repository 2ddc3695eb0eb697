#!/bin/bash
# Builds the agent's OCI image, for the DaemonSet of deploy/kubernetes/daemonset/ (a
# Kubernetes GPU node whose image cannot be changed, such as a Cozystack tenant cluster's
# worker). No daemon and no registry: buildah (Debian's package), from scratch, with
#   /usr/bin/vgpu-license-agent    the portable binary of target/dist/ (made when missing)
#   /usr/bin/journalctl            the build machine's, with the libraries it loads, to read
#   /usr/sbin/chroot               the node's journal and run nvidia-smi in the driver root
#   /etc/vgpu-license-agent/config.toml   the DaemonSet's config (its ConfigMap overrides it)
# into target/image/vgpu-license-agent-VERSION.oci.tar (an OCI archive: `podman load -i`,
# `skopeo copy oci-archive:... docker://REGISTRY/...`), and prints its size and digest.
# buildah works in a container storage of its own, removed at the end: the archive is the
# product, and the machine's /var/lib/containers is left as it was.
#
#   make image                           (the release build first, then this)
#   bash packaging/build-image.sh        (as root; needs buildah, binutils; takes the
#                                         target/dist/ binary as it is, built when missing)
#
# Options, for tests: --binary PATH (another build of the agent), --tag NAME (the image's
# name, default localhost/vgpu-license-agent:VERSION), --output DIR (default target/image).
set -euo pipefail
umask 022

NAME=vgpu-license-agent
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET_DIR/image
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p;T;q' Cargo.toml)
TAG=localhost/$NAME:$VERSION
BINARY=$TARGET_DIR/dist/$NAME
while [ $# -gt 0 ]; do
	case $1 in
	--binary) BINARY=$2 ;;
	--tag) TAG=$2 ;;
	--output) OUT=$2 ;;
	*)
		echo "usage: build-image.sh [--binary PATH] [--tag NAME] [--output DIR]" >&2
		exit 2
		;;
	esac
	shift 2
done

die() {
	echo "packaging/build-image.sh: error: $*" >&2
	exit 1
}

command -v buildah >/dev/null || die "buildah not found (apt-get install buildah)"
for tool in journalctl chroot ldd; do
	command -v "$tool" >/dev/null || die "$tool not found on this machine, whose copy goes into the image"
done
[ -x "$BINARY" ] || [ "$BINARY" != "$TARGET_DIR/dist/$NAME" ] || bash packaging/build-release.sh
[ -x "$BINARY" ] || die "$BINARY: no such program"

ROOTFS=$(mktemp -d)
STORE=$(mktemp -d)
CTR=
cleanup() {
	[ -z "$CTR" ] || buildah rm "$CTR" >/dev/null 2>&1 || true
	rm -rf "$ROOTFS" "$STORE"
}
trap cleanup EXIT
# vfs: plain directories, no mounts to undo, wherever the temporary directory lies.
cat >"$STORE/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$STORE/graph"
runroot = "$STORE/run"
EOF
export CONTAINERS_STORAGE_CONF=$STORE/storage.conf

# Every library a program loads, at its own path (the loader included).
libraries_of() {
	local lib
	for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
		[ -e "$ROOTFS$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$ROOTFS$lib"
	done
}

# A program at its own path, and its libraries.
with_libraries() {
	install -D -m 0755 "$1" "$ROOTFS$1"
	libraries_of "$1"
}

install -D -m 0755 "$BINARY" "$ROOTFS/usr/bin/$NAME"
with_libraries "$(command -v journalctl)"
with_libraries "$(command -v chroot)"
libraries_of "$BINARY"
# journalctl at /usr/bin (where the agent's config names it) and chroot at /usr/sbin.
[ -e "$ROOTFS/usr/bin/journalctl" ] || ln -s "$(command -v journalctl)" "$ROOTFS/usr/bin/journalctl"
[ -e "$ROOTFS/usr/sbin/chroot" ] || ln -s "$(command -v chroot)" "$ROOTFS/usr/sbin/chroot"
install -D -m 0644 deploy/kubernetes/daemonset/config.toml "$ROOTFS/etc/$NAME/config.toml"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' >"$ROOTFS/etc/passwd"
printf 'root:x:0:\nsystemd-journal:x:101:\n' >"$ROOTFS/etc/group"
mkdir -p "$ROOTFS/run/$NAME" "$ROOTFS/var/lib/$NAME" "$ROOTFS/tmp"
chmod 1777 "$ROOTFS/tmp"

CTR=$(buildah from scratch)
buildah copy --quiet "$CTR" "$ROOTFS" / >/dev/null
buildah config \
	--entrypoint "[\"/usr/bin/$NAME\"]" \
	--cmd '["run", "--log-stderr"]' \
	--env PATH=/usr/bin:/usr/sbin:/bin:/sbin \
	--label "org.opencontainers.image.title=$NAME" \
	--label "org.opencontainers.image.version=$VERSION" \
	--label "org.opencontainers.image.description=vGPU license agent for Kubernetes GPU nodes: observes the GPU Operator's driver container and keeps the VgpuLicensed Node condition" \
	--label "org.opencontainers.image.licenses=Apache-2.0" \
	"$CTR"
mkdir -p "$OUT"
ARCHIVE=$OUT/$NAME-$VERSION.oci.tar
rm -f "$ARCHIVE"
buildah commit --quiet --format oci "$CTR" "$TAG" >/dev/null
buildah push --quiet --digestfile "$OUT/digest" "$TAG" "oci-archive:$ARCHIVE:$TAG"
echo "image $TAG"
echo "  digest $(cat "$OUT/digest")"
echo "  size   $(stat -c %s "$ARCHIVE") bytes ($ARCHIVE)"
