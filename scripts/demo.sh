#!/usr/bin/env bash
# The demo: import a Debian root filesystem as an environment, build a Redis
# environment on it layer by layer and show the chain; then, on a PoP of
# pop-agents (DEMO_NODES, default 3) against the dev etcd, Ceph and dockerd,
# deploy redis three times: a plain boot without a checkpoint engine (the
# baseline), then a deploy that boots and checkpoints it, then one that
# restores it from clones. It prints a boot-vs-restore table with the
# per-phase timings. Without DMTCP it says how to add it and runs the boot
# path end to end. `demo.sh down` removes what it made.
set -euo pipefail
FD_PROG=demo
# shellcheck source=scripts/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
DEV=$(fd_dev_dir)
FOGCTL=${FOGCTL:-bin/fogctl}

if [[ ${1:-} == down ]]; then
	bash scripts/dev-agents.sh down || true
	"$FOGCTL" checkpoint ls redis -o json 2>/dev/null | jq -r '.[].gen' | while read -r g; do
		"$FOGCTL" checkpoint rm redis "$g" >/dev/null 2>&1 || true
	done
	"$FOGCTL" app rm redis >/dev/null 2>&1 || true
	"$FOGCTL" env rm redis debian-bookworm >/dev/null 2>&1 || true
	"$FOGCTL" env prune >/dev/null 2>&1 || true
	fd_info "demo environments removed"
	exit 0
fi

fd_is_root || fd_die "the demo mounts filesystems: run it as root"
t0=$(fd_now_us)
fd_base_env "$FOGCTL"
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
echo

DMTCP_PREFIX=${DMTCP_PREFIX:-/opt/dmtcp}
engine=true
if [[ ! -x $DMTCP_PREFIX/bin/dmtcp_launch ]]; then
	engine=false
	fd_warn "no checkpoint engine: DMTCP is not installed at $DMTCP_PREFIX (and no package registry here carries it)."
	fd_warn "To add it: build DMTCP 4.2 from its source outside this repository"
	fd_warn "  (./configure --prefix=/opt/dmtcp && make && make install), then run \`make demo\` again."
	fd_warn "Meanwhile the PoP boots apps normally, from clones of their environment, without checkpoints."
else
	fd_info "the DMTCP container image, from $DMTCP_PREFIX"
	bash dmtcp-image/build.sh "$DMTCP_PREFIX" >/dev/null
fi
fd_info "the boot image (runs apps without a checkpoint engine)"
bash dmtcp-image/build.sh -b >/dev/null
bash scripts/dev-agents.sh up "${DEMO_NODES:-3}"
"$FOGCTL" node ls
echo
"$FOGCTL" app create -f configs/apps/redis.yaml --replace >/dev/null
for id in $("$FOGCTL" ps -o json | jq -r '.[] | select(.app == "redis") | .id'); do
	"$FOGCTL" undeploy --wait --timeout 60s "$id" # start from a cold PoP
done
for g in $("$FOGCTL" checkpoint ls redis -o json | jq -r '.[].gen'); do
	"$FOGCTL" checkpoint rm redis "$g" >/dev/null 2>&1 || true # start from a cold PoP
done
fd_info "deploy 0: a plain boot (--mode boot), the baseline without a checkpoint engine"
plain=$("$FOGCTL" deploy redis --mode boot --wait -o json | jq -r .id)
echo
first="" second=""
if $engine; then
	fd_info "deploy 1: no checkpoint yet, so the agent boots redis, checkpoints it and seals both images"
	first=$("$FOGCTL" deploy redis --wait -o json | jq -r .id)
	echo
	fd_info "deploy 2: restored from the checkpoint's clones"
	second=$("$FOGCTL" deploy redis --wait -o json | jq -r .id)
else
	fd_info "deploy 1: no engine on the nodes, so the agent boots redis (if_no_engine: boot)"
	first=$("$FOGCTL" deploy redis --wait -o json | jq -r .id)
fi
echo
"$FOGCTL" ps
echo
fd_info "boot vs restore (per-phase timings, ms)"
"$FOGCTL" ps -o json | jq -r --arg p "$plain" --arg a "$first" --arg b "$second" '
	def ms(p): [.status.timings[] | select(.name == p) | .duration_ns / 1e6] | add // 0 | floor;
	def total: [.status.timings[] | .duration_ns / 1e6] | add | floor;
	def row($l): [$l, .node, ms("clone"), ms("map"), ms("mount"), ms("container"), ms("ready"), "-", "-", total] | @tsv;
	(["", "node", "clone", "map", "mount", "container", "ready", "checkpoint", "seal", "total"] | @tsv),
	(.[] | select(.id == $p) | row("plain boot (no engine)")),
	(.[] | select(.id == $a and .status.booted != true and .status.mode == "boot") | row("boot (no engine)")),
	(.[] | select(.id == $a and .status.booted == true) | ["boot+checkpoint (1st)", .node, ms("boot.clone"), ms("boot.map"),
		ms("boot.mount"), ms("boot.container"), ms("boot.ready"), ms("boot.checkpoint"), ms("boot.seal"), total] | @tsv),
	(.[] | select(.id == $b) | row("restore (2nd)"))' | column -t -s $'\t'
if $engine; then
	"$FOGCTL" checkpoint ls redis
else
	fd_warn "no checkpoint was made: install DMTCP (see above) to see the restore path"
fi
echo
fd_info "demo done in $(fd_since "$t0") s; run \`make demo-down\` to remove everything"
