#!/usr/bin/env bash
# install-engines.sh [dmtcp|criu|all]...: build the checkpoint engines from their
# release sources into prefixes outside the repository.
#
# Pinned releases: DMTCP 4.2.0 (tag v4.2.0) and CRIU 4.2 (tag v4.2).
# Prefixes: $FOGDEPLOY_DMTCP_PREFIX (default /opt/dmtcp), $FOGDEPLOY_CRIU_PREFIX
# (default /opt/criu). An engine already installed there at the pinned
# version is kept (idempotent); FOGDEPLOY_ENGINES_REBUILD=1 rebuilds it.
#
# Where the sources come from, in order:
#   1. $FOGDEPLOY_DMTCP_SRC / $FOGDEPLOY_CRIU_SRC: a release tarball or an
#      unpacked source directory;
#   2. $FOGDEPLOY_ENGINES_DIR: a directory holding dmtcp-4.2.0.tar.gz and
#      criu-4.2.tar.gz (and optionally SHA256SUMS, which is then checked);
#      unset, a directory shared/engines beside the repository, if present;
#   3. the pinned tags from the upstream repositories, when reachable;
#   4. otherwise it says how to provide them and exits 3.
# With FOGDEPLOY_ENGINES_OPTIONAL=1 a missing source is a warning, not an
# error (make demo uses this: it then runs the boot path only).
#
# The patches in scripts/patches/<engine>-<version>-*.patch are applied to
# the source before the build, and named in the prefix's stamp: an install
# without them is rebuilt. (dmtcp-4.2.0-tcp-nodelay.patch: the coordinator
# protocol's sockets get TCP_NODELAY; without it every exchange of a
# restart waited for a delayed ACK, 0.37 s of redis's 0.42 s restart.
# dmtcp-4.2.0-listen-reuseaddr.patch: a restored listener is bound with
# SO_REUSEADDR, as CRIU does, so that connections of an earlier instance in
# TIME_WAIT on its port, in a recycled container, do not refuse the bind.
# dmtcp-4.2.0-restart-cwd.patch: a restarted process gets back the working
# directory it had at checkpoint time also when it was launched from "/",
# as every app is; upstream left it in "/", and a server that serves files
# from its directory, e.g. busybox httpd -h, answered 404.)
#
# As root it installs the Debian build dependencies it misses. Building both
# takes 5-6 minutes on 2 cores. Nothing is written inside the repository.
set -euo pipefail
FD_PROG="install-engines"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

DMTCP_VERSION=4.2.0
CRIU_VERSION=4.2
DMTCP_REPO=https://github.com/dmtcp/dmtcp.git
CRIU_REPO=https://github.com/checkpoint-restore/criu.git
if [[ -z ${FOGDEPLOY_ENGINES_DIR:-} && -d $FD_SCRIPTS_DIR/../../shared/engines ]]; then
	FOGDEPLOY_ENGINES_DIR=$(cd -- "$FD_SCRIPTS_DIR/../../shared/engines" && pwd)
fi
DMTCP_PREFIX=${FOGDEPLOY_DMTCP_PREFIX:-/opt/dmtcp}
CRIU_PREFIX=${FOGDEPLOY_CRIU_PREFIX:-/opt/criu}
JOBS=${FOGDEPLOY_ENGINES_JOBS:-$(nproc)}
STAMP=.fogdeploy-engine # written into a prefix after a complete install
PATCHES_DIR=$FD_SCRIPTS_DIR/patches

# Debian build dependencies (bookworm).
DMTCP_BUILD_DEPS=(build-essential patch python3)
CRIU_BUILD_DEPS=(build-essential patch pkg-config python3 libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev
	protobuf-compiler libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libaio-dev
	libnftables-dev uuid-dev iproute2)

usage() {
	sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# patches NAME VERSION: the patches of that engine release, in order.
patches() {
	local p
	for p in "$PATCHES_DIR/$1-$2"-*.patch; do
		[[ -f $p ]] && printf '%s\n' "$p"
	done
	return 0
}

# stamp_line NAME VERSION: what the prefix's stamp says of a complete
# install: the release, then the patches applied.
stamp_line() {
	local line="$1 $2" p
	while read -r p; do
		[[ -n $p ]] && line+=" +$(basename -- "$p" .patch)"
	done < <(patches "$1" "$2")
	printf '%s\n' "$line"
}

# apply_patches NAME VERSION DIR: apply the engine's patches to its source
# in DIR (a source that already has one is left as it is).
apply_patches() {
	local p
	while read -r p; do
		[[ -n $p ]] || continue
		if patch -d "$3" -p1 --force --dry-run -R <"$p" >/dev/null 2>&1; then
			fd_info "$1: $(basename -- "$p") is already in the source"
			continue
		fi
		patch -d "$3" -p1 --batch --forward <"$p" >>"$3/fogdeploy-build.log" 2>&1 ||
			fd_die "$1: $(basename -- "$p") does not apply to the source (see $3/fogdeploy-build.log)"
		fd_info "$1: applied $(basename -- "$p")"
	done < <(patches "$1" "$2")
}

# installed NAME PREFIX VERSION: the engine is installed there at VERSION,
# with the patches of this repository.
installed() {
	local stamp=$2/$STAMP
	[[ ${FOGDEPLOY_ENGINES_REBUILD:-0} == 1 ]] && return 1
	[[ -r $stamp ]] && grep -qxF "$(stamp_line "$1" "$3")" "$stamp" || return 1
	case $1 in
	dmtcp) "$2/bin/dmtcp_launch" --version 2>/dev/null | head -n1 | grep -q -- "$3" ;;
	criu) "$2/sbin/criu" --version 2>/dev/null | grep -q "Version: $3" ;;
	esac
}

install_build_deps() {
	local missing=() pkg status
	for pkg in "$@"; do
		status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
		[[ $status == ii* ]] || missing+=("$pkg")
	done
	((${#missing[@]} == 0)) && return 0
	fd_is_root || fd_die "missing build packages: ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
	fd_info "installing build dependencies: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	local log
	log=$(mktemp -t fogdeploy-engines-apt.XXXXXX)
	if ! { apt-get -q -o DPkg::Lock::Timeout=600 update && apt-get -q -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"; } </dev/null >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		fd_die "apt-get install ${missing[*]} failed (log: $log)"
	fi
	rm -f -- "$log"
}

# verify_sum FILE: check FILE against a SHA256SUMS beside it, if there is one.
verify_sum() {
	local dir sums name
	dir=$(dirname -- "$1") name=$(basename -- "$1") sums=$(dirname -- "$1")/SHA256SUMS
	[[ -r $sums ]] || return 0
	grep -q " $name\$" "$sums" || return 0
	(cd "$dir" && grep " $name\$" SHA256SUMS | sha256sum -c --quiet -) ||
		fd_die "$1 does not match its checksum in $sums; fetch the release tarball again"
}

# unpack SRC DEST: put the source tree named by SRC (tarball or directory) at DEST.
unpack() {
	local src=$1 dest=$2
	if [[ -d $src ]]; then
		cp -a -- "$src/." "$dest/"
	elif [[ -f $src ]]; then
		verify_sum "$src"
		tar -xzf "$src" -C "$dest" --strip-components=1 || fd_die "cannot unpack $src (want a .tar.gz release tarball)"
	else
		fd_die "$src: no such tarball or directory"
	fi
}

# fetch_source NAME VERSION REPO ENVVAR TARBALL DEST: fill DEST with the source; returns 3 if none is available.
fetch_source() {
	local name=$1 version=$2 repo=$3 var=$4 tarball=$5 dest=$6 src=${!4:-}
	if [[ -n $src ]]; then
		fd_info "$name: source from $var=$src"
		unpack "$src" "$dest"
		return 0
	fi
	if [[ -n ${FOGDEPLOY_ENGINES_DIR:-} && -f $FOGDEPLOY_ENGINES_DIR/$tarball ]]; then
		fd_info "$name: source from $FOGDEPLOY_ENGINES_DIR/$tarball"
		unpack "$FOGDEPLOY_ENGINES_DIR/$tarball" "$dest"
		return 0
	fi
	if command -v git >/dev/null && timeout 20 git ls-remote --exit-code --tags "$repo" "v$version" >/dev/null 2>&1; then
		fd_info "$name: source from $repo (tag v$version)"
		git -c advice.detachedHead=false clone -q --depth 1 --branch "v$version" "$repo" "$dest/git" &&
			(shopt -s dotglob && mv "$dest/git"/* "$dest/" && rmdir "$dest/git") ||
			fd_die "git clone of $repo v$version failed"
		return 0
	fi
	fd_warn "$name $version: no source available. Provide one of:"
	fd_warn "  $var=/path/to/$tarball (a release tarball) or $var=/path/to/source-dir"
	fd_warn "  FOGDEPLOY_ENGINES_DIR=/dir/holding/$tarball"
	fd_warn "  network access to $repo (tag v$version)"
	return 3
}

# check_glibc_only PREFIX: every binary and library under PREFIX needs only glibc's libraries.
check_glibc_only() {
	local f bad
	bad=$(find "$1" -type f \( -perm -u+x -o -name '*.so*' \) -print0 | xargs -0 ldd 2>/dev/null |
		awk '/=>/ {print $1}' | grep -Ev '^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil)\.' | sort -u || true)
	[[ -z $bad ]] || fd_die "$1 needs libraries beyond glibc ($(echo $bad)); an environment without them could not run it"
}

build_dmtcp() {
	local work=$1
	install_build_deps "${DMTCP_BUILD_DEPS[@]}"
	# DMTCP's tools and libdmtcp.so run on the environment's libraries when
	# the app is chrooted into it: link libstdc++, libgcc and libatomic into
	# them statically, so that an environment needs nothing but a glibc.
	local static=$work/fogdeploy-static atomic
	atomic=$(gcc -print-file-name=libatomic.a)
	[[ -f $atomic ]] || fd_die "dmtcp: gcc has no libatomic.a (install libgcc-12-dev)"
	mkdir -p "$static" && ln -sf -- "$atomic" "$static/libatomic.a"
	fd_info "dmtcp: configure (prefix $DMTCP_PREFIX)"
	(cd "$work" && ./configure --prefix="$DMTCP_PREFIX" --disable-test-suite --enable-static-libstdcxx \
		LDFLAGS="-static-libgcc -L$static -Wl,--exclude-libs,libatomic.a") >"$work/fogdeploy-build.log" 2>&1 ||
		{ tail -n 30 "$work/fogdeploy-build.log" >&2 && fd_die "dmtcp: configure failed"; }
	fd_info "dmtcp: make -j$JOBS (about 3 minutes)"
	(cd "$work" && make -j"$JOBS" && rm -rf -- "$DMTCP_PREFIX" && make install) >>"$work/fogdeploy-build.log" 2>&1 ||
		{ tail -n 30 "$work/fogdeploy-build.log" >&2 && fd_die "dmtcp: build failed"; }
	"$DMTCP_PREFIX/bin/dmtcp_launch" --version >/dev/null || fd_die "dmtcp: the installed dmtcp_launch does not run"
	check_glibc_only "$DMTCP_PREFIX"
	stamp_line dmtcp "$DMTCP_VERSION" >"$DMTCP_PREFIX/$STAMP"
}

build_criu() {
	local work=$1
	install_build_deps "${CRIU_BUILD_DEPS[@]}"
	fd_info "criu: make -j$JOBS (about 2-3 minutes)"
	# Only the criu binary (with lazy-pages); no docs, no python tools.
	(cd "$work" && make -j"$JOBS" criu && rm -rf -- "$CRIU_PREFIX" && make install-criu PREFIX="$CRIU_PREFIX") \
		>"$work/fogdeploy-build.log" 2>&1 ||
		{ tail -n 30 "$work/fogdeploy-build.log" >&2 && fd_die "criu: build failed"; }
	"$CRIU_PREFIX/sbin/criu" --version >/dev/null || fd_die "criu: the installed criu does not run"
	stamp_line criu "$CRIU_VERSION" >"$CRIU_PREFIX/$STAMP"
}

# engine NAME: make sure one engine is installed.
engine() {
	local name=$1 version prefix repo var tarball work start rc=0
	case $name in
	dmtcp) version=$DMTCP_VERSION prefix=$DMTCP_PREFIX repo=$DMTCP_REPO var=FOGDEPLOY_DMTCP_SRC tarball=dmtcp-$DMTCP_VERSION.tar.gz ;;
	criu) version=$CRIU_VERSION prefix=$CRIU_PREFIX repo=$CRIU_REPO var=FOGDEPLOY_CRIU_SRC tarball=criu-$CRIU_VERSION.tar.gz ;;
	esac
	if installed "$name" "$prefix" "$version"; then
		fd_info "$name $version is installed in $prefix"
		return 0
	fi
	start=$(fd_now_us)
	work=$(mktemp -d "${TMPDIR:-/var/tmp}/fogdeploy-$name-build.XXXXXX")
	# shellcheck disable=SC2064 # expand now: work is local
	trap "rm -rf -- '$work'" RETURN
	fetch_source "$name" "$version" "$repo" "$var" "$tarball" "$work" || rc=$?
	if ((rc != 0)); then
		[[ ${FOGDEPLOY_ENGINES_OPTIONAL:-0} == 1 ]] && return 0
		return "$rc"
	fi
	apply_patches "$name" "$version" "$work"
	"build_$name" "$work"
	fd_info "$name $version installed in $prefix in $(fd_since "$start")s"
}

names=("$@")
((${#names[@]} > 0)) || names=(all)
todo=()
for n in "${names[@]}"; do
	case $n in
	all) todo+=(dmtcp criu) ;;
	dmtcp | criu) todo+=("$n") ;;
	*) usage ;;
	esac
done
fd_lock "${TMPDIR:-/var/tmp}/fogdeploy-install-engines.lock" 1800
status=0
for n in "${todo[@]}"; do
	engine "$n" || status=$?
done
exit "$status"
