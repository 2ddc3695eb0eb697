# Builds and installs vgpu-license-agent from source, for any distribution:
#
#   make                                  the portable binary, man pages, completions (target/dist/)
#   make install DESTDIR=/path PREFIX=/usr   lays them out as packaging/install-map.txt says
#   make deb | make rpm                   the packages, in target/debian/ and target/rpm/
#   make image                            the OCI image for Kubernetes nodes (buildah), in
#                                         target/image/, its size and digest printed
#
# `make install` into an image root (an Arch PKGBUILD's "$pkgdir", a SLES image) gives the
# same files as the packages; it does not enable the unit: run
# `systemctl enable vgpu-license-agent` in the image, or rely on its preset.
PREFIX ?= /usr
DESTDIR ?=

all:
	bash packaging/build-release.sh

install:
	bash packaging/install.sh --destdir "$(DESTDIR)" --prefix "$(PREFIX)"

deb:
	bash deb/build.sh

rpm:
	bash rpm/build.sh

# The release build first: an image of an old target/dist/ binary would not say so.
image: all
	bash packaging/build-image.sh

.PHONY: all install deb rpm image
