#!/usr/bin/env bash
# install-deps.sh [group...]: install the Debian packages fogdeploy's dev clusters, tests and demo need.
# Groups: ceph docker etcd tools (default: all), and debug (gdb: CI reads the backtrace of a test
# process that a native library crashed). Installs only what dpkg-query reports missing.
# As root it runs apt-get (update once, noninteractive); otherwise it prints the sudo line and exits 1.
set -euo pipefail
FD_PROG="install-deps"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

group_pkgs() {
	case $1 in
	ceph) echo ceph-mon ceph-osd ceph-mgr ceph-common rbd-fuse rbd-nbd librbd-dev librados-dev ;;
	docker) echo docker.io containerd runc ;;
	etcd) echo etcd-server etcd-client ;;
	tools) echo debootstrap e2fsprogs util-linux fuse3 zstd jq iproute2 apache2-utils curl ca-certificates busybox-static tar bsdextrautils slirp4netns ;;
	debug) echo gdb ;;
	*) return 1 ;;
	esac
}

usage() {
	echo "usage: ${0##*/} [ceph|docker|etcd|tools|debug|all]..." >&2
	exit 2
}

groups=("$@")
((${#groups[@]} > 0)) || groups=(all)
wanted=()
for g in "${groups[@]}"; do
	case $g in
	-h | --help) usage ;;
	all) for a in ceph docker etcd tools; do read -ra p <<<"$(group_pkgs "$a")" && wanted+=("${p[@]}"); done ;;
	*)
		pkgs=$(group_pkgs "$g") || { echo "install-deps: unknown group: $g" >&2 && usage; }
		read -ra p <<<"$pkgs"
		wanted+=("${p[@]}")
		;;
	esac
done

missing=()
for pkg in "${wanted[@]}"; do
	[[ " ${missing[*]} " == *" $pkg "* ]] && continue
	status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
	[[ $status == ii* ]] || missing+=("$pkg")
done
((${#missing[@]} == 0)) && exit 0

if ! fd_is_root; then
	fd_warn "missing packages: ${missing[*]}"
	echo "run: sudo apt-get install -y ${missing[*]}" >&2
	exit 1
fi

fd_info "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
apt_opts=(-q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
log=$(mktemp -t fogdeploy-install-deps.XXXXXX)
start=$(fd_now_us)
if ! apt-get "${apt_opts[@]}" update </dev/null >"$log" 2>&1; then
	tail -n 20 "$log" >&2
	fd_die "apt-get update failed (log: $log)"
fi
if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" </dev/null >>"$log" 2>&1; then
	tail -n 20 "$log" >&2
	fd_die "apt-get install ${missing[*]} failed (log: $log)"
fi
rm -f -- "$log"
fd_info "installed ${#missing[@]} package(s) in $(fd_since "$start")s"
