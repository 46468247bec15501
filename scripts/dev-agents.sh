#!/usr/bin/env bash
# Several pop-agents on one machine, as separate processes with distinct
# node names (node1..nodeN), state directories, API ports (7481..) and
# front-end addresses (127.0.0.2..: each node's front end accepts every
# endpoint port of the PoP on its own address, as on separate machines),
# all against the dev etcd, Ceph and dockerd. An agent already running
# with other settings (FOGDEPLOY_* of this environment) is started again.
#   dev-agents.sh up [N] | down | status
set -euo pipefail
FD_PROG=dev-agents
# shellcheck source=scripts/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
DEV=$(fd_dev_dir)
DIR=$DEV/agents
POPAGENT=${POPAGENT:-bin/pop-agent}
FOGCTL=${FOGCTL:-bin/fogctl}

cmd_up() {
	local n=${1:-1} i name pid port frontend opts
	[[ $n =~ ^[1-9][0-9]?$ ]] || fd_die "N must be 1-99, not $n"
	[[ -x $POPAGENT ]] || fd_die "$POPAGENT is missing: run \`make build\` first"
	mkdir -p "$DIR"
	for ((i = 1; i <= n; i++)); do
		name=node$i port=$((7480 + i)) frontend=127.0.0.$((1 + i))
		# What the agent is started with: the binary and this environment's
		# settings. One running with others is started again.
		opts="$(sha256sum "$POPAGENT" | cut -c1-16) $({ env | grep '^FOGDEPLOY_' || true; } | sort | tr '\n' ' ')"
		if pid=$(fd_pidfile_pid "$DIR/$name.pid"); then
			if [[ $(cat "$DIR/$name.opts" 2>/dev/null) == "$opts" ]]; then
				fd_info "$name running (pid $pid, api 127.0.0.1:$port, front end $frontend)"
				continue
			fi
			fd_info "$name running with other settings or another build: starting it again"
			fd_stop_pids 20 "$pid"
		fi
		FOGDEPLOY_FRONTEND_LISTEN=$frontend \
			setsid "$POPAGENT" --dev --node "$name" --state-dir "$DEV/nodes/$name" --listen "127.0.0.1:$port" \
			>"$DIR/$name.log" 2>&1 </dev/null &
		echo $! >"$DIR/$name.pid"
		printf '%s' "$opts" >"$DIR/$name.opts"
	done
	for ((i = 1; i <= n; i++)); do
		port=$((7480 + i))
		for _ in $(seq 150); do
			curl -fsS --max-time 1 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
			sleep 0.2
		done
		curl -fsS --max-time 1 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 ||
			fd_die "node$i did not start: see $DIR/node$i.log"
	done
	fd_info "$n agent(s) ready; logs in $DIR"
}

cmd_down() {
	local f pid
	# Withdraw every deployment first, so that the agents remove their
	# containers, mounts, mappings and clones.
	if [[ -x $FOGCTL ]] && "$FOGCTL" ps -o json >/dev/null 2>&1; then
		for id in $("$FOGCTL" ps -o json | jq -r '.[].id'); do
			"$FOGCTL" undeploy --wait --timeout 60s "$id" >/dev/null 2>&1 || fd_warn "undeploy $id failed"
		done
	fi
	shopt -s nullglob
	for f in "$DIR"/*.pid; do
		pid=$(fd_pidfile_pid "$f" || true)
		[[ -n $pid ]] && fd_stop_pids 20 "$pid"
		rm -f "$f"
	done
	fd_info "agents stopped"
}

case ${1:-} in
up) cmd_up "${2:-1}" ;;
down) cmd_down ;;
status)
	shopt -s nullglob
	for f in "$DIR"/*.pid; do
		if pid=$(fd_pidfile_pid "$f"); then fd_info "$(basename "$f" .pid): pid $pid"; else fd_info "$(basename "$f" .pid): stopped"; fi
	done
	;;
*) fd_die "usage: $0 up [N] | down | status" ;;
esac
