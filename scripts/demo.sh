#!/usr/bin/env bash
# The demo: import a Debian root filesystem as an environment, build a Redis
# environment on it layer by layer, show the chain, then clone, map and mount
# it and run the Redis binary from the mounted clone. `demo.sh down` removes
# what it made.
set -euo pipefail
FD_PROG=demo
# shellcheck source=scripts/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
DEV=$(fd_dev_dir)
FOGCTL=${FOGCTL:-bin/fogctl}
ROOTFS=$DEV/rootfs/bookworm-minbase

if [[ ${1:-} == down ]]; then
	"$FOGCTL" env rm redis debian-bookworm >/dev/null 2>&1 || true
	"$FOGCTL" env prune >/dev/null 2>&1 || true
	fd_info "demo environments removed"
	exit 0
fi

fd_is_root || fd_die "the demo mounts filesystems: run it as root"
t0=$(fd_now_us)
if [[ ! -x $ROOTFS/usr/bin/apt-get ]]; then
	fd_info "debootstrap bookworm (minbase) into $ROOTFS (about 30-60 s, once)"
	rm -rf "$ROOTFS.tmp"
	mkdir -p "$(dirname "$ROOTFS")"
	debootstrap --variant=minbase bookworm "$ROOTFS.tmp" http://deb.debian.org/debian >"$DEV/debootstrap.log" 2>&1 ||
		fd_die "debootstrap failed: see $DEV/debootstrap.log"
	mv "$ROOTFS.tmp" "$ROOTFS"
fi
if ! "$FOGCTL" env inspect debian-bookworm >/dev/null 2>&1; then
	"$FOGCTL" env import debian-bookworm --dir "$ROOTFS" --size 2G
fi
echo
fd_info "building the redis environment (cached steps are reused on a second run)"
"$FOGCTL" env build redis -f configs/envs/redis.build -q
echo
"$FOGCTL" env ls
echo
fd_info "the chain in Ceph: rbd children of the base snapshot"
base=$("$FOGCTL" env inspect debian-bookworm -o json | jq -r '.ref.image + "@" + .ref.snap')
rbd -c "$DEV/ceph/ceph.conf" -p fogdeploy children "$base"
echo
fd_info "a throwaway clone of redis, mapped, mounted and run:"
"$FOGCTL" env exec redis -- redis-server --version
fd_info "demo done in $(fd_since "$t0") s; run \`make demo-down\` to remove everything"
