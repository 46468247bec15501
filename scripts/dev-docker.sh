#!/usr/bin/env bash
# dev-docker.sh up|down|restart|status|env: a private dockerd for development, tests, the demo and CI.
# State lives under $DEV/docker; containers get their own network namespace on a dedicated bridge and
# can publish ports (-p 127.0.0.1:H:C). See docs/dev-cluster.md.
set -euo pipefail
FD_PROG="dev-docker"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

DEV=$(fd_dev_dir)
D=$DEV/docker
SOCK=$D/docker.sock
PIDFILE=$D/docker.pid
LOG=$D/dockerd.log
LOCK=$DEV/.dev-docker.lock
EXTERNAL=${FOGDEPLOY_DOCKER_HOST:-}                  # reuse an existing daemon instead of starting one
BRIDGE=${FOGDEPLOY_DOCKER_BRIDGE:-fogdeploy0}        # own bridge: no IP clash with another daemon's docker0
BRIDGE_CIDR=${FOGDEPLOY_DOCKER_BRIDGE_CIDR:-172.30.0.1/16}
IPTABLES=${FOGDEPLOY_DOCKER_IPTABLES:-true}          # NAT for egress, port DNAT, isolation rules
LIVE_RESTORE=${FOGDEPLOY_DOCKER_LIVE_RESTORE:-false} # true: containers keep running while dockerd restarts
USERLAND_PROXY=${FOGDEPLOY_DOCKER_USERLAND_PROXY:-false} # false: published ports are DNAT rules, no docker-proxy process per port
STORAGE=${FOGDEPLOY_DOCKER_STORAGE_DRIVER:-}         # empty: overlay2, falling back to vfs
START_TIMEOUT=${FOGDEPLOY_DOCKER_START_TIMEOUT:-60}
STOP_TIMEOUT=${FOGDEPLOY_DOCKER_STOP_TIMEOUT:-20}
MANAGED_LABEL=io.fogdeploy.managed=true

usage() {
	cat >&2 <<EOF
usage: ${0##*/} up|down|restart|status|env
  up      start dockerd on unix://$SOCK (idempotent; cleans stale state first)
  down    remove containers labelled $MANAGED_LABEL, then stop dockerd (images are kept)
  restart stop dockerd only (its containerd and shims stay) and start it again, as a service manager does
  status  print the daemon's state; exit 0 when it answers, 3 when not
  env     print 'export DOCKER_HOST=...'
EOF
	exit 2
}

host() { if [[ -n $EXTERNAL ]]; then printf '%s\n' "$EXTERNAL"; else printf 'unix://%s\n' "$SOCK"; fi; }
dk() { timeout "${DK_TIMEOUT:-60}" docker -H "$(host)" "$@"; }
ping_daemon() { DK_TIMEOUT=10 dk version --format '{{.Server.Version}}' 2>/dev/null; }

# ip a.b.c.d -> integer
ip2int() {
	local IFS=. a b c d
	read -r a b c d <<<"$1"
	echo $(((a << 24) | (b << 16) | (c << 8) | d))
}

# Fail when the bridge subnet overlaps a route that is not on the bridge itself.
check_subnet() {
	local ip=${BRIDGE_CIDR%/*} len=${BRIDGE_CIDR#*/} dst dev rest rip rlen m
	[[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ && $len =~ ^[0-9]+$ && $len -ge 8 && $len -le 30 ]] ||
		fd_die "FOGDEPLOY_DOCKER_BRIDGE_CIDR must look like 172.30.0.1/16, not '$BRIDGE_CIDR'"
	while read -r dst rest; do
		[[ $dst == default ]] && continue
		dev=$(sed -n 's/.*\bdev \([^ ]*\).*/\1/p' <<<"$rest")
		[[ $dev == "$BRIDGE" ]] && continue
		rip=${dst%/*}
		rlen=32
		[[ $dst == */* ]] && rlen=${dst#*/}
		m=$len
		((rlen < len)) && m=$rlen
		m=$(((0xffffffff << (32 - m)) & 0xffffffff))
		if ((($(ip2int "$ip") & m) == ($(ip2int "$rip") & m))); then
			fd_die "bridge subnet $BRIDGE_CIDR overlaps route '$dst${dev:+ dev $dev}'; set FOGDEPLOY_DOCKER_BRIDGE_CIDR"
		fi
	done < <(ip -4 route show table main)
}

# Create (or check) the bridge dockerd attaches containers to.
ensure_bridge() {
	if ! ip link show dev "$BRIDGE" >/dev/null 2>&1; then
		check_subnet
		ip link add name "$BRIDGE" type bridge || fd_die "cannot create bridge $BRIDGE"
		# down removes a bridge it made for a second daemon; the default one stays.
		[[ $BRIDGE == fogdeploy0 ]] || printf '%s\n' "$BRIDGE" >"$D/bridge"
	fi
	if ! ip -4 addr show dev "$BRIDGE" | grep -qw "inet $BRIDGE_CIDR"; then
		ip -4 addr flush dev "$BRIDGE"
		ip addr add "$BRIDGE_CIDR" dev "$BRIDGE" || fd_die "cannot give $BRIDGE the address $BRIDGE_CIDR"
	fi
	ip link set dev "$BRIDGE" up
}

dockerd_pids() {
	local pid
	if pid=$(fd_pidfile_pid "$PIDFILE"); then echo "$pid"; fi
	fd_pids_matching dockerd "$SOCK"
}

# Other dockerds on this machine (not ours): they share iptables chains with us.
foreign_dockerds() {
	local d pid
	local -a argv
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		mapfile -d "" -t argv 2>/dev/null <"$d/cmdline" || continue
		((${#argv[@]} > 0)) || continue
		[[ ${argv[0]##*/} == dockerd && " ${argv[*]} " != *" unix://$SOCK "* ]] && echo "$pid"
	done
	return 0
}

# Stop our dockerd and whatever it left behind (its containerd, shims, mounts, socket, pidfile).
stop_daemon() {
	local -a pids
	mapfile -t pids < <(dockerd_pids | sort -u)
	if ((${#pids[@]} > 0)); then
		fd_stop_pids "$STOP_TIMEOUT" "${pids[@]}" || true
	fi
	mapfile -t pids < <(fd_pids_matching "containerd containerd-shim containerd-shim-runc-v1 containerd-shim-runc-v2" "$D/")
	if ((${#pids[@]} > 0)); then
		fd_info "stopping ${#pids[@]} leftover containerd/shim process(es)"
		fd_stop_pids 10 "${pids[@]}" || true
	fi
	local mp fstype
	while IFS=$'\t' read -r mp fstype _; do
		[[ $mp == "$D"/* ]] && { fd_umount "$mp" "$fstype" || true; }
	done < <(fd_mounts | sort -r)
	rm -f -- "$SOCK" "$PIDFILE"
}

remove_managed() {
	local -a ids
	mapfile -t ids < <(dk ps -aq --filter "label=$MANAGED_LABEL" 2>/dev/null || true)
	if ((${#ids[@]} > 0)); then
		fd_info "removing ${#ids[@]} managed container(s)"
		dk rm -f -v "${ids[@]}" >/dev/null || fd_warn "could not remove all managed containers"
	fi
	# The instances' networks (fogdeploy-isolated, fogdeploy-group-*), made on first use.
	mapfile -t ids < <(dk network ls -q --filter "label=$MANAGED_LABEL" 2>/dev/null || true)
	if ((${#ids[@]} > 0)); then
		dk network rm "${ids[@]}" >/dev/null || fd_warn "could not remove all managed networks"
	fi
}

start_dockerd() {
	local driver=$1 pid i
	local -a args=(
		--data-root "$D/root" --exec-root "$D/exec" --pidfile "$PIDFILE" --host "unix://$SOCK"
		--config-file "$D/daemon.json" --storage-driver "$driver"
		--containerd-namespace fogdeploy --containerd-plugins-namespace fogdeploy-plugins
		--shutdown-timeout 5
	)
	if [[ $BRIDGE == none ]]; then
		args+=(--bridge=none --iptables=false)
	else
		args+=(--bridge="$BRIDGE" --iptables="$IPTABLES")
	fi
	# Without iptables, only docker-proxy can publish a port.
	if [[ $BRIDGE == none || $IPTABLES != true ]]; then
		args+=(--userland-proxy=true)
	else
		args+=(--userland-proxy="$USERLAND_PROXY")
	fi
	if [[ $LIVE_RESTORE == true ]]; then args+=(--live-restore); fi
	printf '\n=== %s dockerd %s\n' "$(date -Is)" "${args[*]}" >>"$LOG"
	setsid dockerd "${args[@]}" </dev/null >>"$LOG" 2>&1 9>&- &
	pid=$!
	for ((i = 0; i < START_TIMEOUT * 10; i++)); do
		if [[ -S $SOCK ]] && ping_daemon >/dev/null; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	fd_warn "dockerd did not answer within ${START_TIMEOUT}s"
	fd_stop_pids 10 "$pid" || true
	return 1
}

cmd_up() {
	local start v driver
	start=$(fd_now_us)
	if [[ -n $EXTERNAL ]]; then
		v=$(ping_daemon) || fd_die "FOGDEPLOY_DOCKER_HOST=$EXTERNAL does not answer"
		fd_info "using the existing daemon at $EXTERNAL (Docker $v); not starting one"
		return 0
	fi
	fd_is_root || fd_die "dockerd needs root (or set FOGDEPLOY_DOCKER_HOST to a daemon you can use)"
	fd_install_deps docker
	fd_check_sock_path "$D/exec/containerd/containerd-debug.sock"
	fd_lock "$LOCK"

	if fd_pidfile_pid "$PIDFILE" >/dev/null && v=$(ping_daemon); then
		fd_info "already running (Docker $v) in $(fd_since "$start")s"
		fd_info "DOCKER_HOST=$(host)"
		return 0
	fi
	if [[ -e $PIDFILE || -e $SOCK ]] || [[ -n $(dockerd_pids) ]]; then
		fd_info "cleaning stale state in $D"
		stop_daemon
	fi
	local others pid
	others=$(foreign_dockerds | tr '\n' ' ')
	for pid in $others; do
		if [[ $BRIDGE != none ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE -- "(--bridge|-b)[= ]$BRIDGE( |$)"; then
			fd_die "dockerd pid $pid already uses bridge $BRIDGE; set FOGDEPLOY_DOCKER_BRIDGE and FOGDEPLOY_DOCKER_BRIDGE_CIDR"
		fi
	done
	if [[ -n $others && $IPTABLES == true && $BRIDGE != none ]]; then
		fd_warn "another dockerd runs (pid ${others% }); it shares iptables chains with this one, and each"
		fd_warn "daemon's start rewrites them (ports published on 127.0.0.1 keep working through docker-proxy)"
	fi

	mkdir -p -- "$D/root" "$D/exec"
	chmod 0711 "$D"
	[[ -e $D/daemon.json ]] || echo '{}' >"$D/daemon.json"
	[[ $BRIDGE == none ]] || ensure_bridge

	driver=${STORAGE:-overlay2}
	if ! start_dockerd "$driver"; then
		if [[ -z $STORAGE && $driver == overlay2 ]]; then
			fd_warn "dockerd failed with overlay2; retrying with vfs (slower). Last log lines:"
			tail -n 5 "$LOG" >&2
			stop_daemon
			driver=vfs
			start_dockerd "$driver" || { tail -n 20 "$LOG" >&2; stop_daemon; fd_die "dockerd failed to start (log: $LOG)"; }
		else
			tail -n 20 "$LOG" >&2
			stop_daemon
			fd_die "dockerd failed to start (log: $LOG)"
		fi
	fi
	v=$(ping_daemon)
	fd_info "running (Docker $v, $driver, bridge $BRIDGE $BRIDGE_CIDR, iptables=$IPTABLES) in $(fd_since "$start")s"
	fd_info "DOCKER_HOST=$(host)"
	fd_info "log: $LOG"
	fd_info "use: eval \"\$($0 env)\""
}

cmd_down() {
	local start
	start=$(fd_now_us)
	if [[ -n $EXTERNAL ]]; then
		ping_daemon >/dev/null || fd_die "FOGDEPLOY_DOCKER_HOST=$EXTERNAL does not answer"
		remove_managed
		fd_info "left the daemon at $EXTERNAL running (not ours)"
		return 0
	fi
	fd_is_root || fd_die "stopping dockerd needs root"
	fd_lock "$LOCK"
	if [[ -S $SOCK ]] && ping_daemon >/dev/null; then
		remove_managed
		# dockerd would give each remaining container its own stop timeout (10 s by default) on shutdown.
		local -a ids
		mapfile -t ids < <(dk ps -q 2>/dev/null || true)
		if ((${#ids[@]} > 0)); then
			fd_info "stopping ${#ids[@]} other running container(s) (kept, not removed)"
			dk stop -t 3 "${ids[@]}" >/dev/null 2>&1 || fd_warn "could not stop all containers"
		fi
	fi
	stop_daemon
	if [[ -e $D/bridge && $(<"$D/bridge") == "$BRIDGE" ]]; then
		ip link del dev "$BRIDGE" 2>/dev/null || fd_warn "could not remove bridge $BRIDGE"
		rm -f -- "$D/bridge"
	fi
	fd_info "down in $(fd_since "$start")s"
}

# Stop dockerd alone and start it again with the same storage driver. Its containerd and the
# containers' shims are left alone, as systemd's docker.service (KillMode=process) does: with
# FOGDEPLOY_DOCKER_LIVE_RESTORE=true the containers keep running; without, dockerd stops them.
cmd_restart() {
	local start pid driver v
	start=$(fd_now_us)
	[[ -z $EXTERNAL ]] || fd_die "FOGDEPLOY_DOCKER_HOST=$EXTERNAL is not ours to restart"
	fd_is_root || fd_die "restarting dockerd needs root"
	fd_lock "$LOCK"
	pid=$(fd_pidfile_pid "$PIDFILE") || fd_die "not running (no live dockerd in $PIDFILE); use up"
	driver=$(DK_TIMEOUT=10 dk info --format '{{.Driver}}' 2>/dev/null) || driver=${STORAGE:-overlay2}
	fd_stop_pids "$STOP_TIMEOUT" "$pid" || true
	rm -f -- "$SOCK" "$PIDFILE"
	start_dockerd "$driver" || { tail -n 20 "$LOG" >&2; fd_die "dockerd failed to start again (log: $LOG)"; }
	v=$(ping_daemon)
	fd_info "restarted (Docker $v, $driver, live-restore=$LIVE_RESTORE) in $(fd_since "$start")s"
}

cmd_status() {
	local out
	if [[ -z $EXTERNAL ]] && ! fd_pidfile_pid "$PIDFILE" >/dev/null; then
		fd_info "not running (no live dockerd in $PIDFILE)"
		exit 3
	fi
	if ! out=$(DK_TIMEOUT=10 dk info --format \
		'Docker {{.ServerVersion}}, storage {{.Driver}}, {{.Containers}} containers ({{.ContainersRunning}} running), {{.Images}} images' 2>&1); then
		fd_info "not running (daemon does not answer at $(host))"
		exit 3
	fi
	fd_info "running: $out"
	fd_info "DOCKER_HOST=$(host)"
}

cmd_env() {
	printf 'export DOCKER_HOST=%q\n' "$(host)"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
restart) cmd_restart ;;
status) cmd_status ;;
env) cmd_env ;;
*) usage ;;
esac
