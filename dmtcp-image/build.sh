#!/usr/bin/env bash
# Build fogdeploy's DMTCP container image from an INSTALLED DMTCP prefix.
#
#   dmtcp-image/build.sh [-t TAG] [DMTCP_PREFIX [DOCKER_HOST]]
#   dmtcp-image/build.sh -b [-t TAG] [DOCKER_HOST]
#
# DMTCP_PREFIX defaults to $DMTCP_PREFIX, else /opt/dmtcp (it must hold
# bin/dmtcp_launch). DOCKER_HOST defaults to $DOCKER_HOST, else the dev
# dockerd of `make dev-up`. TAG defaults to fogdeploy/dmtcp:<DMTCP version>.
# The script stages a temporary build context (the prefix's bin/ and lib/,
# the shared libraries DMTCP needs copied from this host with their
# symlinks, and the static entrypoint built with CGO_ENABLED=0) and runs
# `docker build --network none`. It prints the image tag on stdout.
# It never builds DMTCP itself.
# When CRIU is installed too ($CRIU_PREFIX, else /opt/criu, holding
# sbin/criu; CRIU_PREFIX=none leaves it out), the image also carries CRIU,
# the shared libraries it needs and a static busybox for sh, mount and
# sleep, and is labelled io.fogdeploy.criu.version: the container then runs
# apps of either engine (`entrypoint launch -engine criu ...`).
# With -b it builds the boot image instead (TAG defaults to
# fogdeploy/boot:latest): the same entrypoint and no DMTCP, for nodes and
# deploys that run apps without a checkpoint engine (`entrypoint boot`).
set -euo pipefail

FD_PROG=dmtcp-image
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/.." && pwd)

die() {
	printf '%s: error: %s\n' "$FD_PROG" "$*" >&2
	exit 1
}
info() { printf '%s: %s\n' "$FD_PROG" "$*" >&2; }

tag=""
boot=false
while getopts ':t:bh' opt; do
	case $opt in
	t) tag=$OPTARG ;;
	b) boot=true ;;
	h)
		sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "usage: $0 [-t TAG] [DMTCP_PREFIX [DOCKER_HOST]] | $0 -b [-t TAG] [DOCKER_HOST]" ;;
	esac
done
shift $((OPTIND - 1))

dev_dir=${FOGDEPLOY_DEV_DIR:-${XDG_STATE_HOME:-${HOME:-/root}/.local/state}/fogdeploy/dev}
command -v docker >/dev/null || die "docker CLI not found on PATH"
# GO may be a name on PATH (make passes GO=go) or a path.
if [[ -n ${GO:-} ]]; then
	go=$(command -v "$GO") || die "GO=$GO not found; set GO=/path/to/go"
else
	go=$(command -v go || command -v /usr/local/go/bin/go) || die "go not found; set GO=/path/to/go"
fi
repo_revision() { git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown; }

# One build at a time on this machine: a build prunes the intermediate
# stage images it labels, which another build running meanwhile still needs
# ("invalid from flag value assemble: No such image").
lock=${TMPDIR:-/tmp}/fogdeploy-dmtcp-image.lock
exec 9>"$lock"
flock -w 600 9 || die "timed out after 10 minutes waiting for another image build ($lock)"

if $boot; then
	host=${1:-${DOCKER_HOST:-unix://$dev_dir/docker/docker.sock}}
	tag=${tag:-fogdeploy/boot:latest}
	ctx=$(mktemp -d "${TMPDIR:-/tmp}/fogdeploy-boot-image.XXXXXX")
	trap 'rm -rf -- "$ctx"' EXIT
	mkdir -p "$ctx/rootfs/etc" "$ctx/rootfs/tmp" "$ctx/rootfs/fog/root"
	chmod 1777 "$ctx/rootfs/tmp"
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$ctx/rootfs/etc/passwd"
	printf 'root:x:0:\n' >"$ctx/rootfs/etc/group"
	info "building the entrypoint"
	(cd "$repo" && CGO_ENABLED=0 "$go" build -trimpath -ldflags='-s -w' -o "$ctx/entrypoint" ./dmtcp-image/entrypoint)
	cp -- "$here/Dockerfile.boot" "$ctx/Dockerfile"
	old_id=$(DOCKER_HOST=$host docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
	info "docker build -t $tag (DOCKER_HOST=$host)"
	DOCKER_HOST=$host DOCKER_BUILDKIT=0 docker build --network none -q -t "$tag" \
		--build-arg "REVISION=$(repo_revision)" \
		--build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
		"$ctx" >&2
	new_id=$(DOCKER_HOST=$host docker image inspect -f '{{.Id}}' "$tag")
	if [[ -n $old_id && $old_id != "$new_id" ]]; then
		DOCKER_HOST=$host docker image rm "$old_id" >/dev/null 2>&1 || true
	fi
	printf '%s\n' "$tag"
	exit 0
fi

prefix=${1:-${DMTCP_PREFIX:-/opt/dmtcp}}
host=${2:-${DOCKER_HOST:-unix://$dev_dir/docker/docker.sock}}
[[ -x $prefix/bin/dmtcp_launch ]] || die "no DMTCP install at $prefix (want $prefix/bin/dmtcp_launch); pass the prefix DMTCP was installed to"

dmtcp_version=$("$prefix/bin/dmtcp_launch" --version 2>/dev/null | awk 'NR==1 {print $NF}')
dmtcp_version=${dmtcp_version:-unknown}
tag=${tag:-fogdeploy/dmtcp:$dmtcp_version}
# The oldest glibc DMTCP runs on: the newest GLIBC_x.y symbol version its
# tools and libraries need (they run on the environment's C library).
dmtcp_glibc=""
if command -v objdump >/dev/null; then
	dmtcp_glibc=$(objdump -T "$prefix"/bin/* "$prefix"/lib/dmtcp/*.so 2>/dev/null |
		grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -Vu | tail -n 1 || true)
fi
[[ -n $dmtcp_glibc ]] || info "objdump found no glibc symbol versions (install binutils): deploys will not check the environment's glibc version"

ctx=$(mktemp -d "${TMPDIR:-/tmp}/fogdeploy-dmtcp-image.XXXXXX")
trap 'rm -rf -- "$ctx"' EXIT
rootfs=$ctx/rootfs

# copy_with_links PATH: copy the file PATH into $rootfs at the same path,
# recreating every symlink met on the way (/lib -> usr/lib,
# libstdc++.so.6 -> libstdc++.so.6.0.30, ...) so the loader finds it by any name.
copy_with_links() {
	local path=$1 guard=0 prefix link rest target i
	local -a parts
	while :; do
		((guard++ < 64)) || die "symlink loop while copying $1"
		IFS=/ read -ra parts <<<"${path#/}"
		prefix="" link="" rest=""
		for i in "${!parts[@]}"; do
			prefix+=/${parts[$i]}
			if [[ -L $prefix ]]; then
				link=$prefix
				rest=$(IFS=/ && printf '%s' "${parts[*]:i+1}")
				break
			fi
		done
		if [[ -z $link ]]; then
			mkdir -p -- "$rootfs$(dirname -- "$path")"
			cp -p -- "$path" "$rootfs$path"
			return
		fi
		target=$(readlink -- "$link")
		if [[ ! -L $rootfs$link ]]; then
			mkdir -p -- "$rootfs$(dirname -- "$link")"
			ln -s -- "$target" "$rootfs$link"
		fi
		[[ $target == /* ]] || target=$(dirname -- "$link")/$target
		path=$(realpath -m -s -- "$target${rest:+/$rest}")
	done
}

info "staging $prefix (DMTCP $dmtcp_version) into $ctx"
mkdir -p "$ctx/dmtcp" "$rootfs/etc" "$rootfs/tmp" "$rootfs/fog/root" "$rootfs/fog/ckpt"
chmod 1777 "$rootfs/tmp"
cp -a -- "$prefix/bin" "$prefix/lib" "$ctx/dmtcp/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"

# The coordinator and dmtcp_command run in the image's own root (the app
# runs chrooted into the environment clone and loads that clone's libc).
mapfile -t libs < <(
	for f in "$prefix"/bin/* "$prefix"/lib/dmtcp/*.so; do
		ldd "$f" 2>/dev/null || true
	done | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u
)
((${#libs[@]} > 0)) || die "ldd found no shared libraries for $prefix/bin/*"
for lib in "${libs[@]}"; do
	copy_with_links "$lib"
done
info "copied ${#libs[@]} shared libraries: $(printf '%s ' "${libs[@]##*/}")"

# CRIU, when installed: dump and restore run in the image's own root.
criu_prefix=${CRIU_PREFIX:-/opt/criu}
criu_version=""
if [[ $criu_prefix != none && -x $criu_prefix/sbin/criu ]]; then
	criu_version=$("$criu_prefix/sbin/criu" --version 2>/dev/null | awk '/^Version:/ {print $2}')
	[[ -n $criu_version ]] || die "$criu_prefix/sbin/criu --version printed no version"
	command -v busybox >/dev/null || die "CRIU in the image needs a static busybox (Debian package busybox-static) for sh, mount and sleep"
	! ldd "$(command -v busybox)" >/dev/null 2>&1 || die "$(command -v busybox) is not statically linked: install busybox-static"
	info "staging $criu_prefix (CRIU $criu_version)"
	mkdir -p "$rootfs$criu_prefix" "$rootfs/bin" "$rootfs/run"
	cp -a -- "$criu_prefix/sbin" "$rootfs$criu_prefix/"
	[[ ! -d $criu_prefix/libexec ]] || cp -a -- "$criu_prefix/libexec" "$rootfs$criu_prefix/"
	mapfile -t clibs < <(ldd "$criu_prefix/sbin/criu" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
	for lib in "${clibs[@]}"; do
		copy_with_links "$lib"
	done
	cp -- "$(command -v busybox)" "$rootfs/bin/busybox.static"
	for tool in sh mount sleep; do
		ln -sf busybox.static "$rootfs/bin/$tool"
	done
	info "copied ${#clibs[@]} shared libraries for criu"
elif [[ $criu_prefix != none ]]; then
	info "no CRIU at $criu_prefix (want $criu_prefix/sbin/criu): the image runs DMTCP apps only"
fi

info "building the entrypoint"
# The engines' prefixes are written into the binary: the image's facts,
# which no variable of a container can change.
ldflags="-s -w -X main.imageDMTCPPrefix=$prefix"
[[ -z $criu_version ]] || ldflags+=" -X main.imageCRIUPrefix=$criu_prefix"
(cd "$repo" && CGO_ENABLED=0 "$go" build -trimpath -ldflags="$ldflags" -o "$ctx/entrypoint" ./dmtcp-image/entrypoint)
cp -- "$here/Dockerfile" "$ctx/Dockerfile"

revision=$(repo_revision)
old_id=$(DOCKER_HOST=$host docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
info "docker build -t $tag (DOCKER_HOST=$host)"
DOCKER_HOST=$host DOCKER_BUILDKIT=0 docker build --network none -q -t "$tag" \
	--build-arg "DMTCP_PREFIX=$prefix" \
	--build-arg "DMTCP_VERSION=$dmtcp_version" \
	--build-arg "DMTCP_GLIBC=$dmtcp_glibc" \
	--build-arg "CRIU_VERSION=$criu_version" \
	--build-arg "CRIU_PREFIX=${criu_prefix/#none/}" \
	--build-arg "REVISION=$revision" \
	--build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	"$ctx" >&2
# The legacy builder keeps the assemble stage as an untagged image; drop it.
DOCKER_HOST=$host docker image prune -f --filter label=io.fogdeploy.build-stage=dmtcp-assemble >/dev/null || true
# A rebuild moves the tag; remove the image it leaves untagged (kept if a container uses it).
new_id=$(DOCKER_HOST=$host docker image inspect -f '{{.Id}}' "$tag")
if [[ -n $old_id && $old_id != "$new_id" ]]; then
	DOCKER_HOST=$host docker image rm "$old_id" >/dev/null 2>&1 || true
fi
printf '%s\n' "$tag"
