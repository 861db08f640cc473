#!/bin/bash
# Builds one image as an OCI archive without a container engine or a registry
# (make images): a Debian root file system made by debootstrap from Debian's
# packages, holding the minimal base and exactly the runtime packages that the
# staged programs need, committed by buildah with the image configuration of
# the Dockerfile's runtime stage (USER, EXPOSE, ENTRYPOINT, CMD).
#
#   docker/oci-image.sh IMAGE STAGED OUT.tar TAG WORK
#
# IMAGE    server, server-cuda, router or controller (docker/IMAGE.Dockerfile)
# STAGED   the files `make image IMAGE=...` staged (bin/, lib/): /usr/local/
# OUT.tar  the OCI archive written (buildah's oci-archive: format)
# TAG      the name:tag the archive's index names
# WORK     a folder for debootstrap's package cache, the root file systems
#          made (kept per package set: a second build reuses them) and
#          buildah's storage
#
# The packages: each shared library a staged ELF file needs (readelf's NEEDED,
# resolved by ldd) maps to the Debian package that owns it on this machine
# (dpkg -S), which must be the suite the image is made from (bookworm): a
# library no package owns is copied from where ldd found it when it is
# CUDA's (cuBLAS, NCCL: NVIDIA's toolkit here, not Debian's), and refused
# otherwise. ca-certificates is added: llm-fetch and the controller speak
# TLS. Runs as root (debootstrap and chroot need it); nothing is started
# from the image.
set -euo pipefail

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
EXTRA_PACKAGES="ca-certificates"
CUDA_LIB_DIR_RE='^/usr/local/cuda[^/]*/'

die() { echo "oci-image: $*" >&2; exit 1; }

[ $# -eq 5 ] || die "usage: $0 IMAGE STAGED OUT.tar TAG WORK"
image=$1 staged=$(realpath "$2") out=$(realpath -m "$3") tag=$4 work=$(realpath -m "$5")
here=$(cd "$(dirname "$0")" && pwd)
dockerfile=$here/$image.Dockerfile
[ -f "$dockerfile" ] || die "no $dockerfile"
[ -d "$staged/bin" ] || die "$staged has no bin/: run make image IMAGE=$image first"
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot)"
for t in debootstrap buildah readelf ldd dpkg; do
	command -v "$t" >/dev/null || die "$t not found (apt-get install buildah debootstrap binutils)"
done
. /etc/os-release
[ "${VERSION_CODENAME:-}" = "$SUITE" ] ||
	die "this machine is ${PRETTY_NAME:-unknown}: the packages are read off a Debian $SUITE machine's dpkg"

# ---- what the staged files need ----------------------------------------------
elves=$(find "$staged" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print | sort)
[ -n "$elves" ] || die "no ELF file in $staged"
packages=$EXTRA_PACKAGES
copied=""
for f in $elves; do
	for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		[[ $so == ld-linux-* ]] && continue  # the dynamic loader: libc6's
		path=$(ldd "$f" | awk -v so="$so" '$1 == so && $2 == "=>" {print $3}')
		if [ -z "$path" ] || [ "$path" = "not" ]; then die "$f needs $so, which ldd does not find here"; fi
		owner=$(dpkg -S "*/$so" 2>/dev/null | awk -F': ' '$1 ~ /:amd64$/ && $2 ~ /x86_64-linux-gnu/ {print $1; exit}' || true)
		if [ -n "$owner" ]; then
			packages="$packages ${owner%:amd64}"
		elif [[ $(realpath "$path") =~ $CUDA_LIB_DIR_RE ]]; then
			# with what it needs in turn from the toolkit (cuBLAS needs cuBLASLt)
			for dep in $path $(ldd "$path" | awk '$2 == "=>" {print $3}'); do
				[[ $(realpath "$dep") =~ $CUDA_LIB_DIR_RE ]] && copied="$copied $(realpath "$dep")"
			done
		else
			die "$f needs $path, which no Debian package owns and which is not CUDA's"
		fi
	done
done
packages=$(echo "$packages" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
copied=$(echo "$copied" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
echo "oci-image $image: packages: $packages"
[ -z "$copied" ] || echo "oci-image $image: copied from the CUDA toolkit: $copied"

# ---- the root file system (debootstrap's minbase + those packages) ------------
mkdir -p "$work/debs" "$work/roots"
key=$(echo "$SUITE $MIRROR $packages" | sha256sum | cut -c1-16)
base=$work/roots/$key.tar
if [ ! -f "$base" ]; then
	tmp=$work/roots/$key.tmp
	rm -rf "$tmp" && mkdir -p "$tmp"
	echo "oci-image $image: debootstrap $SUITE (minbase) into $tmp"
	debootstrap --variant=minbase --include="$(echo $packages | tr ' ' ',')" --cache-dir="$work/debs" \
		"$SUITE" "$tmp" "$MIRROR" >"$work/roots/$key.log" 2>&1 ||
		{ tail -20 "$work/roots/$key.log" >&2; die "debootstrap failed (log: $work/roots/$key.log)"; }
	# the image's user, as the Dockerfiles make it; then nothing apt or a boot would need
	chroot "$tmp" useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin llm
	rm -rf "${tmp:?}"/var/lib/apt/lists/* "${tmp:?}"/var/cache/apt/* "${tmp:?}"/var/log/*.log \
		"${tmp:?}"/dev/* "${tmp:?}"/proc/* "${tmp:?}"/sys/* "${tmp:?}"/tmp/* "${tmp:?}"/run/*
	tar --numeric-owner --xattrs -C "$tmp" -cf "$base.tmp" . && mv "$base.tmp" "$base"
	rm -rf "$tmp"
fi

# ---- this image's root: the base, the staged files, CUDA's libraries ----------
root=$work/root-$image
rm -rf "$root" && mkdir -p "$root"
tar --numeric-owner --xattrs -C "$root" -xf "$base"
mkdir -p "$root/usr/local/bin" "$root/usr/local/lib"
cp -a "$staged/." "$root/usr/local/"
for lib in $copied; do cp -L "$lib" "$root/usr/local/lib/"; done
chown -R 0:0 "$root/usr/local"
chroot "$root" ldconfig
layer=$work/layer-$image.tar
tar --numeric-owner --xattrs --sort=name -C "$root" -cf "$layer" .
rm -rf "$root"

# ---- the image: one layer, the Dockerfile's runtime configuration ------------
# (the last stage's USER, EXPOSE, ENTRYPOINT and CMD; JSON forms only)
stage=$(awk '/^FROM /{s=""} {s = s $0 "\n"} END {printf "%s", s}' "$dockerfile")
field() { echo "$stage" | sed -n "s/^$1 //p" | tail -1; }
user=$(field USER) entry=$(field ENTRYPOINT) cmd=$(field CMD) port=$(field EXPOSE)
[ -n "$user" ] && [[ $entry == \[* ]] || die "$dockerfile: its runtime stage needs USER and an ENTRYPOINT [...]"
B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
ctr=$("${B[@]}" from --name "oci-$image-$$" scratch)
trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
"${B[@]}" add "$ctr" "$layer" / >/dev/null
cfg=(--user "$user" --entrypoint "$entry" --workingdir / --os linux --arch amd64
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	--label "org.opencontainers.image.title=llm-$image" --label "org.opencontainers.image.base.name=debian:$SUITE")
[ -z "$cmd" ] || cfg+=(--cmd "$cmd")
[ -z "$port" ] || cfg+=(--port "${port%/*}/tcp")  # as Docker writes it: 8080/tcp
"${B[@]}" config "${cfg[@]}" "$ctr"
mkdir -p "$(dirname "$out")" && rm -f "$out"
"${B[@]}" commit --quiet --format oci --disable-compression=false "$ctr" "oci-archive:$out:$tag" >/dev/null
"${B[@]}" rm "$ctr" >/dev/null && trap - EXIT
"${B[@]}" rmi --all --force >/dev/null 2>&1 || true
rm -f "$layer"
echo "oci-image $image: $out ($(du -h "$out" | cut -f1)), $tag"
