#!/usr/bin/env bash
# The dev etcd of one machine: pop-agent's embedded single-node etcd, run
# as a daemon on 127.0.0.1:23790 with its data under the dev directory.
#   dev-etcd.sh up | down | status | env
set -euo pipefail
FD_PROG=dev-etcd
# shellcheck source=scripts/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
DEV=$(fd_dev_dir)
DIR=$DEV/etcd
ENDPOINT=${FOGDEPLOY_DEV_ETCD:-127.0.0.1:23790}
POPAGENT=${POPAGENT:-bin/pop-agent}

healthy() { curl -fsS --max-time 2 "http://$ENDPOINT/health" 2>/dev/null | grep -q '"health":"true"'; }

cmd_up() {
	local start pid
	start=$(fd_now_us)
	if healthy; then
		fd_info "running at $ENDPOINT"
		return 0
	fi
	[[ -x $POPAGENT ]] || fd_die "$POPAGENT is missing: run \`make build\` first"
	mkdir -p "$DIR"
	pid=$(fd_pidfile_pid "$DIR/pid" || true)
	[[ -n $pid ]] && fd_stop_pids 10 "$pid"
	setsid "$POPAGENT" etcd --data-dir "$DIR/data" --listen "$ENDPOINT" >"$DIR/etcd.log" 2>&1 </dev/null &
	echo $! >"$DIR/pid"
	for _ in $(seq 100); do
		healthy && break
		sleep 0.1
	done
	healthy || fd_die "etcd did not become healthy at $ENDPOINT: see $DIR/etcd.log"
	fd_info "running at $ENDPOINT in $(fd_since "$start")s (data $DIR/data, log $DIR/etcd.log)"
}

cmd_down() {
	local pid
	pid=$(fd_pidfile_pid "$DIR/pid" || true)
	[[ -n $pid ]] && fd_stop_pids 10 "$pid"
	rm -rf "$DIR"
	fd_info "stopped; data removed"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) if healthy; then fd_info "healthy at $ENDPOINT"; else fd_die "not running"; fi ;;
env) printf 'export FOGDEPLOY_ETCD_ENDPOINTS=%s\n' "$ENDPOINT" ;;
*) fd_die "usage: $0 up|down|status|env" ;;
esac
