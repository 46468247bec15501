#!/usr/bin/env bash
# test-fixtures.sh: make what the engine, container and deploy tests run apps in.
#
#   - redis-server and redis-cli on the host (the engine suite's host cases);
#     the package's service is not started (policy-rc.d).
#   - Debian bookworm root file systems made with debootstrap --variant=minbase:
#     with redis-server at $FOGDEPLOY_TEST_ROOTFS (default
#     /var/cache/fogdeploy/test-rootfs), and with python3 and no libstdc++6 or
#     libatomic1 at $FOGDEPLOY_TEST_PY_ROOTFS (default
#     /var/cache/fogdeploy/test-rootfs-python), which proves that DMTCP brings
#     its own libraries and an environment needs only its app and a glibc.
#
# Idempotent: a finished root file system (its stamp file) is kept. As root
# only. `make test` runs it; so does .ci/run.
set -euo pipefail
FD_PROG="test-fixtures"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

ROOTFS=${FOGDEPLOY_TEST_ROOTFS:-/var/cache/fogdeploy/test-rootfs}
PY_ROOTFS=${FOGDEPLOY_TEST_PY_ROOTFS:-/var/cache/fogdeploy/test-rootfs-python}
STAMP=.fogdeploy-test-rootfs-v1
SUITE=${FOGDEPLOY_TEST_SUITE:-bookworm}

fd_is_root || fd_die "run as root: it installs packages and runs debootstrap"
fd_lock "${TMPDIR:-/var/tmp}/fogdeploy-test-fixtures.lock" 900

# Host packages, without starting their services.
missing=()
for pkg in redis-server redis-tools debootstrap; do
	status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
	[[ $status == ii* ]] || missing+=("$pkg")
done
if ((${#missing[@]} > 0)); then
	fd_info "installing on the host: ${missing[*]} (services not started)"
	policy=/usr/sbin/policy-rc.d
	had_policy=false
	[[ -e $policy ]] && had_policy=true
	$had_policy || { printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"; }
	log=$(mktemp -t fogdeploy-fixtures-apt.XXXXXX)
	export DEBIAN_FRONTEND=noninteractive
	ok=true
	{ apt-get -q -o DPkg::Lock::Timeout=600 update && apt-get -q -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"; } \
		</dev/null >"$log" 2>&1 || ok=false
	$had_policy || rm -f -- "$policy"
	$ok || { tail -n 20 "$log" >&2 && fd_die "apt-get install ${missing[*]} failed (log: $log)"; }
	rm -f -- "$log"
fi
# A redis the package may have started before policy-rc.d existed would hold 6379.
if command -v service >/dev/null && [[ -x /etc/init.d/redis-server ]]; then
	service redis-server stop >/dev/null 2>&1 || true
fi

# build_rootfs DEST PACKAGE BINARY: a bookworm minbase root file system at
# DEST with PACKAGE, then libstdc++6 and libatomic1 purged unless BINARY links
# them: an environment with only its app and a glibc, as DMTCP now needs.
build_rootfs() {
	local dest=$1 pkg=$2 bin=$3 tmp log app_libs p lib start
	if [[ -f $dest/$STAMP ]]; then
		fd_info "test root file system ready at $dest"
		return 0
	fi
	start=$(fd_now_us)
	fd_info "building the test root file system at $dest (debootstrap $SUITE minbase + $pkg, about a minute)"
	tmp=$dest.tmp.$$
	# shellcheck disable=SC2064 # expand now
	trap "rm -rf -- '$tmp'" EXIT
	rm -rf -- "$dest" "$dest".tmp.*
	mkdir -p -- "$(dirname -- "$dest")"
	log=$(mktemp -t fogdeploy-fixtures-debootstrap.XXXXXX)
	if ! debootstrap --variant=minbase --include="$pkg" "$SUITE" "$tmp" >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		fd_die "debootstrap failed (log: $log)"
	fi
	rm -f -- "$log"
	chroot "$tmp" apt-get clean
	# apt and its tools need libstdc++6; the tests never run them.
	app_libs=$(chroot "$tmp" ldd "$bin")
	for p in libatomic1 libstdc++6; do
		chroot "$tmp" dpkg-query -W "$p" >/dev/null 2>&1 || continue
		lib=${p%[0-9]}
		[[ $app_libs == *"${lib}.so"* ]] && continue
		chroot "$tmp" dpkg --purge --force-depends "$p" >/dev/null 2>&1 || fd_die "cannot purge $p from $dest"
	done
	chroot "$tmp" "$bin" --version >/dev/null || fd_die "$bin does not run in $dest"
	rm -rf -- "$tmp"/var/lib/apt/lists/*
	touch "$tmp/$STAMP"
	mv -- "$tmp" "$dest"
	trap - EXIT
	fd_info "test root file system ready at $dest in $(fd_since "$start")s"
}

# redis-server links libstdc++ and libatomic itself (through jemalloc).
build_rootfs "$ROOTFS" redis-server /usr/bin/redis-server
# python3 links neither: this one has only the app and a glibc.
build_rootfs "$PY_ROOTFS" python3 /usr/bin/python3
