# shellcheck shell=bash
# Shared helpers for scripts/dev-ceph.sh, scripts/dev-docker.sh and scripts/install-deps.sh.
# Sourced, never executed. Callers set FD_PROG (the message prefix) before sourcing.

FD_PROG=${FD_PROG:-fogdeploy}
FD_SCRIPTS_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)

# The dev state directory shared by all dev scripts and by the Go code.
fd_dev_dir() {
	printf '%s\n' "${FOGDEPLOY_DEV_DIR:-${XDG_STATE_HOME:-${HOME:?HOME is not set}/.local/state}/fogdeploy/dev}"
}

fd_info() { printf '%s: %s\n' "$FD_PROG" "$*"; }
fd_warn() { printf '%s: warning: %s\n' "$FD_PROG" "$*" >&2; }
fd_die() {
	printf '%s: error: %s\n' "$FD_PROG" "$*" >&2
	exit 1
}

# Microseconds since the epoch (bash 5 EPOCHREALTIME).
fd_now_us() { printf '%s\n' "${EPOCHREALTIME/./}"; }
# Seconds with one decimal since a fd_now_us value.
fd_since() {
	local d=$(($(fd_now_us) - $1))
	printf '%d.%d\n' $((d / 1000000)) $((d % 1000000 / 100000))
}

fd_is_root() { [[ $(id -u) -eq 0 ]]; }

# Fail early when a unix socket path would exceed the kernel limit (107 bytes).
fd_check_sock_path() {
	if ((${#1} > 107)); then
		fd_die "socket path too long (${#1} > 107 bytes): $1; set FOGDEPLOY_DEV_DIR to a shorter directory"
	fi
}

# Take an exclusive lock on a file for the rest of the script (fd 9); waits up to $2 seconds.
fd_lock() {
	mkdir -p -- "$(dirname -- "$1")"
	exec 9>"$1"
	flock -w "${2:-120}" 9 || fd_die "timed out waiting for lock $1 (another up/down running?)"
}

# Print the pid stored in a pidfile if that process is alive.
fd_pidfile_pid() {
	local pid=
	[[ -r $1 ]] || return 1
	read -r pid <"$1" 2>/dev/null || [[ -n $pid ]] || return 1 # dockerd writes no trailing newline
	[[ $pid =~ ^[0-9]+$ ]] && fd_alive "$pid" || return 1
	printf '%s\n' "$pid"
}

# Succeed if process $1 runs: it exists and is not a zombie (killed, its
# parent gone, and not reaped yet).
fd_alive() {
	local stat
	kill -0 "$1" 2>/dev/null || return 1
	read -r stat <"/proc/$1/stat" 2>/dev/null || return 1
	stat=${stat##*) }
	[[ ${stat%% *} != Z ]]
}

# Print the pids of processes whose argv[0] basename is one of the names in $1
# (space separated) and whose command line contains the string $2, or whose CEPH_CONF is $2.
fd_pids_matching() {
	local names=" $1 " needle=$2 d pid arg0 line
	local -a argv
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		[[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
		mapfile -d "" -t argv 2>/dev/null <"$d/cmdline" || continue
		((${#argv[@]} > 0)) || continue
		arg0=${argv[0]##*/}
		[[ $names == *" $arg0 "* ]] || continue
		line=${argv[*]}
		if [[ $line == *"$needle"* ]]; then
			printf '%s\n' "$pid"
			continue
		fi
		mapfile -d "" -t argv 2>/dev/null <"$d/environ" || continue
		for line in "${argv[@]}"; do
			if [[ $line == CEPH_CONF="$needle" || $line == DOCKER_HOST=*"$needle" ]]; then
				printf '%s\n' "$pid"
				break
			fi
		done
	done
	return 0
}

# fd_stop_pids BOUND_SECONDS PID...: SIGTERM, wait up to BOUND, then SIGKILL and wait 5 s more.
# Returns non-zero if a process survived SIGKILL.
fd_stop_pids() {
	local bound=$1 pid left i
	shift
	(($# > 0)) || return 0
	kill -TERM "$@" 2>/dev/null || true
	for ((i = 0; i < bound * 20; i++)); do
		left=()
		for pid in "$@"; do fd_alive "$pid" && left+=("$pid"); done
		((${#left[@]} == 0)) && return 0
		sleep 0.05
	done
	fd_warn "pid(s) ${left[*]} still running after ${bound}s; sending SIGKILL"
	kill -KILL "${left[@]}" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		local alive=0
		for pid in "${left[@]}"; do fd_alive "$pid" && alive=1; done
		((alive == 0)) && return 0
		sleep 0.05
	done
	fd_warn "pid(s) ${left[*]} survived SIGKILL (stuck in the kernel?)"
	return 1
}

# Print mounts as "MOUNTPOINT<TAB>FSTYPE<TAB>SOURCE", octal escapes decoded.
fd_mounts() {
	local line pre post mp fstype src
	while IFS= read -r line; do
		pre=${line%% - *}
		post=${line#* - }
		read -r _ _ _ _ mp _ <<<"$pre"
		read -r fstype src _ <<<"$post"
		printf '%b\t%s\t%b\n' "$mp" "$fstype" "$src"
	done </proc/self/mountinfo
}

# Unmount a path: normal unmount first, lazy unmount as a fallback.
fd_umount() {
	umount -- "$1" 2>/dev/null && return 0
	if [[ ${2:-} == fuse* ]] && command -v fusermount >/dev/null && fusermount -u -- "$1" 2>/dev/null; then
		return 0
	fi
	fd_warn "unmount of $1 failed (busy?); detaching it lazily"
	umount -l -- "$1" 2>/dev/null || { fd_warn "could not unmount $1"; return 1; }
}

# Run scripts/install-deps.sh for the given groups (it does nothing when all is installed).
fd_install_deps() {
	"$FD_SCRIPTS_DIR/install-deps.sh" "$@"
}

# fd_base_env FOGCTL: make sure the debian-bookworm environment (minbase) that the catalog's
# build files start FROM is in the pool: debootstrap once into $DEV/rootfs, then import it.
fd_base_env() {
	local fogctl=$1 dev rootfs
	dev=$(fd_dev_dir)
	rootfs=$dev/rootfs/bookworm-minbase
	if [[ ! -x $rootfs/usr/bin/apt-get ]]; then
		fd_info "debootstrap bookworm (minbase) into $rootfs (about 30-60 s, once)"
		rm -rf "$rootfs.tmp"
		mkdir -p "$(dirname "$rootfs")"
		debootstrap --variant=minbase bookworm "$rootfs.tmp" http://deb.debian.org/debian >"$dev/debootstrap.log" 2>&1 ||
			fd_die "debootstrap failed: see $dev/debootstrap.log"
		mv "$rootfs.tmp" "$rootfs"
	fi
	if ! "$fogctl" env inspect debian-bookworm >/dev/null 2>&1; then
		"$fogctl" env import debian-bookworm --dir "$rootfs" --size 2G
	fi
}
