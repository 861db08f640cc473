#!/bin/bash
# Builds one image as an OCI archive without a container engine or a registry
# (make images): a Debian root file system made by debootstrap from Debian's
# packages, holding the minimal base and exactly the runtime packages that the
# staged programs need, brought up to date from the security and updates
# suites, and committed by buildah with the image configuration of the
# Dockerfile's runtime stage (USER, EXPOSE, ENTRYPOINT, CMD).
#
#   docker/oci-image.sh IMAGE STAGED OUT.tar TAG WORK
#
# IMAGE    server, server-cuda, router or controller (docker/IMAGE.Dockerfile)
# STAGED   the files `make image IMAGE=...` staged (bin/, lib/): /usr/local/
# OUT.tar  the OCI archive written (buildah's oci-archive: format)
# TAG      the name:tag the archive's index names
# WORK     a root-owned folder for debootstrap's package cache, the base roots
#          made (kept per package set and day: a second build that day reuses
#          them) and buildah's storage; one build at a time uses it (a lock)
#
# The packages: each shared library a staged ELF file needs (readelf's NEEDED,
# resolved by ldd) maps to the Debian package that owns that file on this
# machine (dpkg -S), which must be the suite the image is made from
# (bookworm); a library no package owns is copied from where ldd found it
# when it is CUDA's (cuBLAS, NCCL: NVIDIA's toolkit here, not Debian's), and
# refused otherwise. ca-certificates is added: llm-fetch and the controller
# speak TLS. Runs as root (debootstrap and chroot need it); nothing is
# started from the image but ldconfig, useradd and apt-get while it is made.
set -euo pipefail

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
EXTRA_PACKAGES="ca-certificates"
CUDA_LIB_DIR_RE='^/usr/local/cuda[^/]*/'
LIB_DIR_RE='^(/usr)?/lib/x86_64-linux-gnu/'
# the image's apt sources: Debian's own, not the mirror it was made from (which may carry credentials)
SOURCES="deb http://deb.debian.org/debian $SUITE main
deb http://deb.debian.org/debian $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main"

die() {
	echo "oci-image: $*" >&2
	exit 1
}

# ---- what the staged files need ----------------------------------------------

# The package that owns the library file ldd resolved (by its real path; with
# Debian 12's merged /usr a package may list it under /lib, so the twin too),
# only in the system's library folders: nothing when none does.
owner_of() {
	local real cand pkg
	real=$(realpath "$1")
	for cand in "$real" "${real#/usr}" "/usr$real"; do
		[[ $cand =~ $LIB_DIR_RE ]] || continue
		pkg=$(dpkg -S "$cand" 2>/dev/null | sed -n '1s/^\([^:, ]*\)\(:[a-z0-9]*\)\{0,1\}: .*/\1/p' || true)
		[ -z "$pkg" ] || {
			echo "$pkg"
			return 0
		}
	done
	return 0
}

# Sets packages (Debian's, space-separated) and copied (CUDA toolkit files)
# for the ELF files under staged.
needs() {
	local elves f so path owner dep
	elves=$(find "$staged" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print | sort)
	[ -n "$elves" ] || die "no ELF file in $staged"
	packages=$EXTRA_PACKAGES copied=""
	for f in $elves; do
		for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			[[ $so == ld-linux-* ]] && continue # the dynamic loader: libc6's
			path=$(ldd "$f" | awk -v so="$so" '$1 == so && $2 == "=>" {print $3}')
			if [ -z "$path" ] || [ "$path" = "not" ]; then die "$f needs $so, which ldd does not find here"; fi
			owner=$(owner_of "$path")
			if [ -n "$owner" ]; then
				packages="$packages $owner"
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
}

# ---- the base root: debootstrap's minbase + the packages, up to date --------

# Empties folder (made if missing) without leaving it: mounts a killed
# debootstrap left are undone first, and nothing past them is removed.
fresh_dir() {
	mkdir -p "$1"
	umount -R "$1"/* 2>/dev/null || true
	rm -rf --one-file-system "${1:?}" && mkdir -p "$1"
}

# debootstrap into tmp, then the security and updates suites' fixes.
bootstrap() {
	local tmp=$1 log=$2
	# (the Release files' signatures checked against Debian's archive keys, or it stops: no mirror can slip
	# packages in)
	[ -f "$KEYRING" ] || die "$KEYRING missing (apt-get install debian-archive-keyring)"
	debootstrap --variant=minbase --force-check-gpg --keyring="$KEYRING" \
		--include="$(echo "$packages" | xargs | tr ' ' ',')" --cache-dir="$work/debs" \
		"$SUITE" "$tmp" "$MIRROR" >"$log" 2>&1 || {
		tail -20 "$log" >&2
		die "debootstrap failed (log: $log)"
	}
	printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' "$MIRROR" "$SUITE" "$MIRROR" \
		"$SUITE" "$SECURITY_MIRROR" "$SUITE" >"$tmp/etc/apt/sources.list"
	{ chroot "$tmp" apt-get -q update && DEBIAN_FRONTEND=noninteractive chroot "$tmp" apt-get -q -y upgrade; } \
		>>"$log" 2>&1 || {
		tail -20 "$log" >&2
		die "the security and updates suites' fixes failed (log: $log)"
	}
}

# What the image should not carry: the build host's name and resolver, apt's
# lists and caches, logs, device nodes; setuid and setgid bits (its user
# never needs to become another).
tidy() {
	local tmp=$1
	echo "$SOURCES" >"$tmp/etc/apt/sources.list"
	: >"$tmp/etc/resolv.conf"
	rm -f "$tmp/etc/hostname" "$tmp/etc/machine-id"
	rm -rf --one-file-system "${tmp:?}"/var/lib/apt/lists/* "${tmp:?}"/var/cache/apt/* "${tmp:?}"/var/log/*.log \
		"${tmp:?}"/var/log/apt/* "${tmp:?}"/dev/* "${tmp:?}"/proc/* "${tmp:?}"/sys/* "${tmp:?}"/tmp/* "${tmp:?}"/run/*
	find "$tmp" -xdev -type f -perm /6000 -exec chmod ug-s {} +
}

# The base root's tar for packages (made once a day: the day's fixes).
base_root() {
	local key tmp
	mkdir -p "$work/debs" "$work/roots"
	key=$(echo "$SUITE $MIRROR $SECURITY_MIRROR $packages $(date -u +%F)" | sha256sum | cut -c1-16)
	base=$work/roots/$key.tar
	[ -f "$base" ] && return 0
	tmp=$work/roots/$key.tmp
	fresh_dir "$tmp"
	echo "oci-image $image: debootstrap $SUITE (minbase) into $tmp"
	bootstrap "$tmp" "$work/roots/$key.log"
	chroot "$tmp" useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin llm # as the Dockerfiles
	tidy "$tmp"
	tar --numeric-owner --xattrs -C "$tmp" -cf "$base.tmp" . && mv "$base.tmp" "$base"
	rm -rf --one-file-system "$tmp"
}

# ---- this image's layer: the base, the staged files, CUDA's libraries --------
make_layer() {
	local root=$work/root-$image lib
	fresh_dir "$root"
	tar --numeric-owner --xattrs -C "$root" -xf "$base"
	mkdir -p "$root/usr/local/bin" "$root/usr/local/lib"
	cp -a "$staged/." "$root/usr/local/"
	for lib in $copied; do cp -L "$lib" "$root/usr/local/lib/"; done
	chown -R 0:0 "$root/usr/local" && chmod -R go-w "$root/usr/local"
	chroot "$root" ldconfig
	layer=$work/layer-$image.tar
	tar --numeric-owner --xattrs --sort=name -C "$root" -cf "$layer" .
	rm -rf --one-file-system "$root"
}

# ---- the image: one layer, the Dockerfile's runtime configuration ------------
# (the last stage's USER, EXPOSE, ENTRYPOINT and CMD; JSON forms only)
commit() {
	local stage user entry cmd ports other port ctr cfg title=${tag##*/}
	title=${title%%:*}
	stage=$(awk '/^FROM /{s=""} {s = s $0 "\n"} END {printf "%s", s}' "$dockerfile")
	field() { echo "$stage" | sed -n "s/^$1 //p" | tail -1; }
	user=$(field USER) entry=$(field ENTRYPOINT) cmd=$(field CMD) ports=$(field EXPOSE)
	[ -n "$user" ] && [[ $entry == \[* ]] || die "$dockerfile: its runtime stage needs USER and an ENTRYPOINT [...]"
	# what this build does not carry over must not be there to be lost
	other=$(echo "$stage" | grep -E '^(ENV|WORKDIR|VOLUME|LABEL|ARG|STOPSIGNAL|HEALTHCHECK|SHELL|ONBUILD) ' || true)
	[ -z "$other" ] || die "$dockerfile: its runtime stage has what oci-image.sh does not carry: $other"
	B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
	ctr=$("${B[@]}" from --name "oci-$image-$$" scratch)
	trap '"${B[@]}" rm "'"$ctr"'" >/dev/null 2>&1 || true' EXIT
	"${B[@]}" add "$ctr" "$layer" / >/dev/null
	cfg=(--user "$user" --entrypoint "$entry" --workingdir / --os linux --arch amd64
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
		--label "org.opencontainers.image.title=$title" --label "org.opencontainers.image.base.name=debian:$SUITE")
	[ -z "$cmd" ] || cfg+=(--cmd "$cmd")
	for port in $ports; do cfg+=(--port "${port%/*}/tcp"); done # as Docker writes it: 8080/tcp
	"${B[@]}" config "${cfg[@]}" "$ctr"
	mkdir -p "$(dirname "$out")" && rm -f "$out"
	"${B[@]}" commit --quiet --format oci --disable-compression=false "$ctr" "oci-archive:$out:$tag" >/dev/null
	"${B[@]}" rm "$ctr" >/dev/null && trap - EXIT
	"${B[@]}" rmi --all --force >/dev/null 2>&1 || true
}

# ---- main -------------------------------------------------------------------
[ $# -eq 5 ] || die "usage: $0 IMAGE STAGED OUT.tar TAG WORK"
image=$1 staged=$(realpath "$2") out=$(realpath -m "$3") tag=$4 work=$(realpath -m "$5")
dockerfile=$(cd "$(dirname "$0")" && pwd)/$image.Dockerfile
[ -f "$dockerfile" ] || die "no $dockerfile"
[ -d "$staged/bin" ] || die "$staged has no bin/: run make image IMAGE=$image first"
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot)"
for t in debootstrap buildah readelf ldd dpkg flock; do
	command -v "$t" >/dev/null || die "$t not found (apt-get install buildah debootstrap binutils)"
done
. /etc/os-release
[ "${VERSION_CODENAME:-}" = "$SUITE" ] ||
	die "this machine is ${PRETTY_NAME:-unknown}: the packages are read off a Debian $SUITE machine's dpkg"
mkdir -p "$work"
# root extracts and runs what lies here: nobody else may have put it there
[ "$(stat -c '%u' "$work")" = 0 ] && [ $(($(stat -c '0%a' "$work") & 022)) = 0 ] ||
	die "$work must be root's and writable by root alone"
exec 9>"$work/lock"
flock 9
needs
echo "oci-image $image: packages: $packages"
[ -z "$copied" ] || echo "oci-image $image: copied from the CUDA toolkit: $copied"
base_root
make_layer
commit
rm -f "$layer"
echo "oci-image $image: $out ($(du -h "$out" | cut -f1)), $tag"
