#!/usr/bin/env bash
# The demo (`make demo`): what fogdeploy is for, on a PoP of pop-agents
# (DEMO_NODES, default 3) against the dev etcd, Ceph and dockerd.
#
#  1. Environments as RBD layers: import a Debian root filesystem, build the
#     environments of two catalog apps on it layer by layer, show the chain.
#  2. The main app, codesearch (configs/apps/codesearch.yaml), whose boot does
#     real work: it indexes Python's standard library, about 5 s of CPU,
#     before it serves. Deployed three times: a plain boot (--mode boot, the
#     baseline), the first deploy (boot, checkpoint, seal, then restore), and
#     a restore from clones of the checkpoint. Then the same for redis, which
#     boots in a fraction of a second: restoring it does not pay off.
#  3. One redis deployment reached at its endpoint (the PoP's port of it, on
#     every node's front end) before and after a migration to another node.
#  4. One table with a row per deployment, labelled by what its agent reports
#     it did (status mode, booted, boot_reason), with the per-phase timings,
#     and per app the speedup of a restore over a plain boot.
#
# Checkpoints need DMTCP. If it is not installed, the demo builds it with
# scripts/install-engines.sh when release sources are at hand (a few minutes,
# once; DEMO_ENGINES=0 skips that); otherwise it says how to provide them and
# runs the boot path only. `demo.sh down` removes what the demo made: both
# apps' deployments, checkpoints, app records and environments.
set -euo pipefail
FD_PROG=demo
# shellcheck source=scripts/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
DEV=$(fd_dev_dir)
FOGCTL=${FOGCTL:-bin/fogctl}
MAIN=codesearch # boots slowly: what fogdeploy is for
FAST=redis      # boots fast: restoring it does not pay off
APPS=("$MAIN" "$FAST")
DMTCP_PREFIX=${DMTCP_PREFIX:-${FOGDEPLOY_DMTCP_PREFIX:-/opt/dmtcp}}

if [[ ${1:-} == down ]]; then
	bash scripts/dev-agents.sh down || true # undeploys every deployment first
	for app in "${APPS[@]}"; do
		for g in $("$FOGCTL" checkpoint ls "$app" -o json 2>/dev/null | jq -r '.[].gen' 2>/dev/null); do
			"$FOGCTL" checkpoint rm "$app" "$g" >/dev/null 2>&1 || fd_warn "checkpoint rm $app $g failed"
		done
		"$FOGCTL" app rm "$app" >/dev/null 2>&1 || true
		"$FOGCTL" env rm "$app" >/dev/null 2>&1 || true
	done
	"$FOGCTL" env rm debian-bookworm >/dev/null 2>&1 || true # refused while other environments use it
	"$FOGCTL" env prune >/dev/null 2>&1 || true
	fd_info "demo deployments, checkpoints, apps and environments removed"
	exit 0
fi

fd_is_root || fd_die "the demo mounts filesystems: run it as root"
command -v jq >/dev/null || fd_die "jq is missing: run \`make deps\`"
t0=$(fd_now_us)
REC=$(mktemp -d "${TMPDIR:-/tmp}/fogdeploy-demo.XXXXXX")
trap 'rm -rf -- "$REC"' EXIT

# --- 1. environments -----------------------------------------------------
fd_base_env "$FOGCTL"
echo
for app in "${APPS[@]}"; do
	t=$(fd_now_us)
	fd_info "building the $app environment from configs/envs/$app.build: the first time, apt-get installs its" \
		"packages in a chroot of a clone (10-30 s); later runs reuse the cached layers (under a second)"
	"$FOGCTL" env build "$app" -f "configs/envs/$app.build" -q
	fd_info "$app environment ready in $(fd_since "$t") s"
done
echo
"$FOGCTL" env ls
echo
fd_info "the chain in Ceph: rbd children of the base snapshot"
base=$("$FOGCTL" env inspect debian-bookworm -o json | jq -r '.ref.image + "@" + .ref.snap')
rbd -c "$DEV/ceph/ceph.conf" -p fogdeploy children "$base"
echo
fd_info "throwaway clones of the environments, mapped, mounted and run:"
"$FOGCTL" env exec "$FAST" -- redis-server --version
"$FOGCTL" env exec "$MAIN" -- python3 --version
echo

# --- 2. the checkpoint engine and the PoP ---------------------------------
# dmtcp_needs_more_than_glibc: the installed DMTCP's tools need libraries that
# an environment without libatomic1 and libstdc++6 (codesearch's) lacks.
dmtcp_needs_more_than_glibc() {
	ldd "$DMTCP_PREFIX/bin/dmtcp_launch" "$DMTCP_PREFIX"/lib/dmtcp/libdmtcp.so 2>/dev/null |
		grep -Eq '^\s*lib(stdc\+\+|atomic|gcc_s)\.so'
}
# image ARG...: dmtcp-image/build.sh ARG..., its output shown only if it fails.
image() {
	local tag
	tag=$(bash dmtcp-image/build.sh "$@" 2>"$REC/image.log") || { cat "$REC/image.log" >&2 && fd_die "dmtcp-image/build.sh $* failed"; }
	fd_info "  $tag"
}
if [[ ! -x $DMTCP_PREFIX/bin/dmtcp_launch && ${DEMO_ENGINES:-1} != 0 ]]; then
	fd_info "DMTCP is not installed at $DMTCP_PREFIX: scripts/install-engines.sh builds it if its source is at hand" \
		"(about 2-3 minutes on 2 cores, once; DEMO_ENGINES=0 skips this)"
	FOGDEPLOY_DMTCP_PREFIX=$DMTCP_PREFIX FOGDEPLOY_ENGINES_OPTIONAL=1 bash scripts/install-engines.sh dmtcp ||
		fd_warn "scripts/install-engines.sh dmtcp failed (above); going on without DMTCP"
fi
engine=true
if [[ ! -x $DMTCP_PREFIX/bin/dmtcp_launch ]]; then
	engine=false
	fd_warn "no checkpoint engine: DMTCP is not installed at $DMTCP_PREFIX (no package registry here carries it)."
	fd_warn "To add it, give scripts/install-engines.sh its release source, then run \`make demo\` again:"
	fd_warn "  FOGDEPLOY_DMTCP_SRC=/path/to/dmtcp-4.2.0.tar.gz (or an unpacked source directory), or"
	fd_warn "  FOGDEPLOY_ENGINES_DIR=/dir/holding/dmtcp-4.2.0.tar.gz (and criu-4.2.tar.gz for CRIU), or"
	fd_warn "  network access to github.com/dmtcp/dmtcp (it fetches tag v4.2.0);"
	fd_warn "  e.g. FOGDEPLOY_ENGINES_DIR=~/engines bash scripts/install-engines.sh dmtcp   (prefix $DMTCP_PREFIX)"
	fd_warn "Meanwhile the PoP boots apps normally, from clones of their environment, without checkpoints."
else
	if dmtcp_needs_more_than_glibc; then
		fd_warn "the DMTCP in $DMTCP_PREFIX needs libstdc++/libatomic, which the $MAIN environment does not have;"
		fd_warn "  rebuild it statically linked: FOGDEPLOY_ENGINES_REBUILD=1 bash scripts/install-engines.sh dmtcp"
	fi
	fd_info "the DMTCP container image, from $DMTCP_PREFIX (docker build, a few seconds)"
	image "$DMTCP_PREFIX"
fi
fd_info "the boot image (runs apps without a checkpoint engine)"
image -b
# One spare slot per engine on each node (agent.spare_slots): a restore
# that finds no warm-pool slot of its app takes one.
FOGDEPLOY_SPARE_SLOTS=${FOGDEPLOY_SPARE_SLOTS:-1} bash scripts/dev-agents.sh up "${DEMO_NODES:-3}"
fd_info "the PoP's nodes (ENGINES: what each can checkpoint and restore with)"
"$FOGCTL" node ls
if $engine && [[ $("$FOGCTL" node ls -o json |
	jq '[.[] | select(.ready != false and ((.engines // ["dmtcp"]) | index("dmtcp")))] | length') == 0 ]]; then
	engine=false
	fd_warn "DMTCP is installed in $DMTCP_PREFIX, but no ready node reports it among its ENGINES (see the agents'"
	fd_warn "  logs in $DEV/agents): the nodes boot apps without checkpoints."
fi
echo

# --- 3. deployments --------------------------------------------------------
n=0
# deploy_one APP DESCRIPTION [FLAG...]: deploy APP, wait until it runs, and
# keep its record (fogctl's JSON of the deployment and its status) in $REC.
deploy_one() {
	local app=$1 what=$2 out id
	shift 2
	n=$((n + 1))
	fd_info "deploy $n: $what"
	out=$REC/$(printf '%02d' "$n").json
	if ! "$FOGCTL" deploy "$app" --wait -o json "$@" >"$out"; then
		# Keep the failed deployment's record for the table: the newest of
		# the app that has no record yet.
		id=$("$FOGCTL" ps -o json | jq -r --arg app "$app" --slurpfile seen <(cat "$REC"/*.json 2>/dev/null | jq -s 'map(.id)') '
			[.[] | select(.app == $app and ((.id | IN($seen[0][])) | not))] | sort_by(.created) | last | .id // empty')
		if [[ -n $id ]]; then
			"$FOGCTL" ps -o json | jq --arg id "$id" '.[] | select(.id == $id)' >"$out"
		else
			rm -f -- "$out"
		fi
		fd_warn "deploy $n of $app failed (above); the demo goes on"
	fi
	echo
}

# wait_spares: wait until every agent has an idle DMTCP spare slot (its
# /metrics say so; at most 60 s). A restore took one moments ago, and the
# agent makes another in the background once no deploy is under way.
wait_spares() {
	local i port n t0
	t0=$(fd_now_us)
	for ((i = 1; i <= ${DEMO_NODES:-3}; i++)); do
		port=$((7480 + i))
		for _ in $(seq 300); do
			n=$(curl -fsS --max-time 2 "http://127.0.0.1:$port/metrics" 2>/dev/null |
				awk '$1 == "fogdeploy_spare_slots_idle{engine=\"dmtcp\"}" {print int($2)}')
			((${n:-0} >= 1)) && break
			sleep 0.2
		done
		((${n:-0} >= 1)) || fd_warn "node$i has no idle spare slot after 60 s (its log: $DEV/agents/node$i.log)"
	done
	fd_info "an idle spare slot on each node after $(fd_since "$t0") s"
}

# wait_pool APP: wait until every node that runs APP's engine has an idle
# warm-pool slot of it (at most 120 s).
wait_pool() {
	local app=$1 nodes idle t0
	t0=$(fd_now_us)
	nodes=$("$FOGCTL" node ls -o json | jq '[.[] | select(.ready != false and ((.engines // ["dmtcp"]) | index("dmtcp")))] | length')
	for _ in $(seq 600); do
		idle=$("$FOGCTL" pool ls "$app" -o json | jq '[.[] | select(.idle >= 1)] | length')
		if ((idle >= nodes)); then
			fd_info "$app: an idle slot on each of the $nodes nodes after $(fd_since "$t0") s"
			return 0
		fi
		sleep 0.2
	done
	fd_warn "$app: the warm pool is not full after 120 s (fogctl pool ls $app; the agents' logs in $DEV/agents)"
}

# recycle_one APP: one more pool-hit deploy of APP, then its undeploy: the
# agent recycles the instance into its node's pool (its container kept, its
# root reset) instead of removing it and provisioning a new slot.
recycle_one() {
	local app=$1 dep id slot node t0
	fd_info "$app: undeploying a pool-hit instance recycles it into its node's pool (agent.recycle): the container is" \
		"kept, the app ended, its root reset to the checkpoint's, instead of a removal and a new slot's clone, map, mount and container"
	if ! dep=$("$FOGCTL" deploy "$app" --wait -o json); then
		fd_warn "$app: the deploy to recycle failed; the demo goes on"
		return 0
	fi
	id=$(jq -r '.id' <<<"$dep")
	slot=$(jq -r '.status.slot // empty' <<<"$dep")
	node=$(jq -r '.node' <<<"$dep")
	t0=$(fd_now_us)
	"$FOGCTL" undeploy --wait --timeout 60s "$id" >/dev/null
	fd_info "$app: $id (slot $slot on $node) undeployed in $(fd_since "$t0") s"
	for _ in $(seq 50); do
		if "$FOGCTL" pool ls "$app" --node "$node" -o json | jq -e --arg s "$slot" '[.[].slots[]?] | index($s)' >/dev/null; then
			fd_info "$app: slot $slot is idle again in $node's pool, in the same container:"
			"$FOGCTL" pool ls "$app"
			echo
			return 0
		fi
		sleep 0.2
	done
	fd_warn "$app: slot $slot did not come back to $node's pool (fogctl pool ls $app)"
}

for app in "${APPS[@]}"; do
	"$FOGCTL" app create -f "configs/apps/$app.yaml" --replace >/dev/null
	# Start from a cold PoP: no instance and no checkpoint of the app.
	for id in $("$FOGCTL" ps -o json | jq -r --arg app "$app" '.[] | select(.app == $app) | .id'); do
		"$FOGCTL" undeploy --wait --timeout 60s "$id"
	done
	for g in $("$FOGCTL" checkpoint ls "$app" -o json | jq -r '.[].gen'); do
		"$FOGCTL" checkpoint rm "$app" "$g" >/dev/null 2>&1 || true
	done
done

for app in "${APPS[@]}"; do
	if [[ $app == "$MAIN" ]]; then
		fd_info "$MAIN: a code search service whose boot indexes Python's standard library (about 5 s of CPU)" \
			"before it listens; its readiness probe is GET /healthz"
	else
		fd_info "$FAST: boots in a fraction of a second"
	fi
	deploy_one "$app" "$app, a plain boot (--mode boot): the baseline, without a checkpoint engine" --mode boot
	if $engine; then
		deploy_one "$app" "$app, the first deploy: no checkpoint yet, so the agent boots it, checkpoints it, seals both images and restores"
		wait_spares
		deploy_one "$app" "$app, a deploy in the default mode (auto), placed where a node holds the checkpoint: the agent restores it\
 (in one of the node's spare slots, made for no app: only the app's root, checkpoint, ports and limits are attached) or boots it,\
 whichever it measured faster, and says why"
		if [[ $(jq -r '.status.mode // empty' "$REC/$(printf '%02d' "$n").json" 2>/dev/null) == boot ]]; then
			fd_info "$app: mode auto booted it (above, with the medians it compared); for the table, one restore on request"
			deploy_one "$app" "$app, restored from the checkpoint on request (--mode restore)" --mode restore
		fi
		fd_info "$app: a warm pool of one slot per node (fogctl app pool $app 1): each agent provisions it in the background" \
			"at the lowest CPU weight (clone, map, mount, a container) and restores the app in it ahead, at that weight (agent.pool_ahead)"
		"$FOGCTL" app pool "$app" 1 >/dev/null
		wait_pool "$app"
		"$FOGCTL" pool ls "$app"
		deploy_one "$app" "$app, in the default mode (auto) with a slot waiting: mode auto takes it, a restore ahead in a warm-pool slot:\
 only raise (to the normal CPU weight), ready and bind are left for the deploy"
		if [[ $app == "$MAIN" ]]; then
			recycle_one "$app"
		fi
	else
		deploy_one "$app" "$app, a deploy in the default mode (auto): without an engine on the node, the agent boots it (if_no_engine: boot)"
	fi
done
"$FOGCTL" ps
echo

# What a restored codesearch serves is the index its checkpointed boot built.
recs=$(cat "$REC"/*.json 2>/dev/null | jq -s '.')
if [[ $(jq --arg a "$MAIN" '[.[] | select(.app == $a and .status.phase == "Running")] | length' <<<"$recs") -gt 0 ]]; then
	fd_info "$MAIN: each instance's GET /healthz, and when its index was built"
	jq -r --arg a "$MAIN" '.[] | select(.app == $a and .status.phase == "Running") |
		[.id, (if .status.booted then "boot+checkpoint+restore" else .status.mode end), (.status.ports["8080/tcp"] // "")] | @tsv' <<<"$recs" |
		while IFS=$'\t' read -r id mode addr; do
			h=$(curl -fsS --max-time 5 "http://$addr/healthz" 2>/dev/null) || h='{}'
			jq -r --arg id "$id" --arg m "$mode" \
				'"  \($id)  \($m)\t index of \(.files // "?") files, \(.lines // "?") lines built at \(.built_at // "?") in \(.build_seconds // "?") s"' <<<"$h"
		done | column -t -s $'\t'
	restored=$(jq -r --arg a "$MAIN" '[.[] | select(.app == $a and .status.phase == "Running" and .status.mode == "restore" and (.status.booted | not))] | last | .status.ports["8080/tcp"] // empty' <<<"$recs")
	if [[ -n $restored ]]; then
		fd_info "(the restored instance reports the build time of the instance that was checkpointed: it did not index again)"
		fd_info "$MAIN restored, GET /search?q=socket+timeout (the index lives in the restored memory):"
		curl -fsS --max-time 5 "http://$restored/search?q=socket+timeout&n=3" |
			jq -r '"  \(.matches) matching line(s) in \(.ms) ms; best:", (.hits[] | "  \(.path | sub("^/usr/lib/python3[.0-9]*/"; "")):\(.line)  \(.text)")' ||
			fd_warn "the restored $MAIN did not answer"
	fi
	echo
fi

# --- the PoP's endpoint: one address for a user, through a migration ---------
# resp ADDR CMD...: one RESP command to ADDR (host:port), its first line.
resp() {
	local addr=$1 line
	shift
	exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}" || return 1
	printf '%s\r\n' "$*" >&3
	IFS= read -r -t 10 line <&3 || line="(no answer)"
	# A bulk string: its length, then the string.
	case $line in
	'$-1'*) line="(nil)" ;;
	'$'[0-9]*) IFS= read -r -t 10 line <&3 || line="(no answer)" ;;
	esac
	exec 3<&-
	printf '%s' "${line%$'\r'}" | sed 's/^[+$:]//'
}
endpoint_demo() {
	local id port node ep1 ep2 wrote got after moved
	id=$(jq -r --arg a "$FAST" '[.[] | select(.app == $a and .status.phase == "Running" and .status.mode == "restore")] | last | .id // empty' <<<"$recs")
	[[ -n $id ]] || return 0
	port=$("$FOGCTL" ps -o json | jq -r --arg id "$id" '.[] | select(.id == $id) | .endpoint["6379/tcp"] // empty')
	[[ -n $port ]] || {
		fd_warn "$id has no endpoint (pop.frontend.ports off?)"
		return 0
	}
	node=$("$FOGCTL" ps -o json | jq -r --arg id "$id" '.[] | select(.id == $id) | .status.node')
	# Through the front ends of nodes other than the one it runs on.
	ep1=127.0.0.$((1 + ${node#node} % ${DEMO_NODES:-3} + 1)):$port
	fd_info "$FAST $id: its endpoint, port $port on every node's front end, before and after a migration"
	wrote=$(resp "$ep1" SET user alice) || wrote="(refused)"
	moved=$("$FOGCTL" migrate "$id" -o json 2>/dev/null) || moved='{}'
	after=$(jq -r '.to // "?"' <<<"$moved")
	ep2=127.0.0.$((1 + ${node#node})):$port
	got=$(resp "$ep2" GET user) || got="(refused)"
	{
		printf 'WHEN\tRUNS ON\tCLIENT CONNECTS TO\tREQUEST\tANSWER\n'
		printf 'before the migration\t%s\t%s\tSET user alice\t%s\n' "$node" "$ep1" "$wrote"
		printf 'after the migration\t%s\t%s\tGET user\t%s\n' "$after" "$ep2" "$got"
	} | column -t -s $'\t'
	fd_info "(the migration stopped it for $(jq -r '(.downtime_ns // 0) / 1e6 | floor' <<<"$moved") ms; the endpoint stayed port $port, and a connection made meanwhile waits instead of being refused)"
	echo
}
if $engine; then
	endpoint_demo
fi

# --- 4. the table ----------------------------------------------------------
fd_info "boot vs restore: one row per deployment, labelled by what its agent reports it did (per-phase timings in ms; TOTAL sums the row)"
jq -r '
	def ms($p): [.status.timings[]? | select(.name == $p) | .duration_ns / 1e6] | add // 0 | floor;
	def sum(f): [.status.timings[]? | select(.name | f) | .duration_ns / 1e6] | add // 0 | floor;
	def what:
		if .status.phase == "Failed" then "failed: " + ((.status.error // "")[:60])
		elif .status.mode == "boot" then
			if .status.boot_reason == "requested" then "plain boot (requested: --mode boot)"
			else "boot (" + (.status.boot_reason // "reason not given") + ")" end
		elif .status.mode == "restore" and .status.booted then "boot + checkpoint as gen \(.status.gen)"
		elif .status.mode == "restore" and .status.pool == "hit" and .status.ahead then "restore from gen \(.status.gen), warm-pool hit (restored ahead)"
		elif .status.mode == "restore" and .status.pool == "hit" then "restore from gen \(.status.gen), warm-pool hit"
		elif .status.mode == "restore" and .status.pool == "spare" then "restore from gen \(.status.gen), in a spare slot"
		elif .status.mode == "restore" then "restore from gen \(.status.gen)"
		elif .status.mode == "checkpoint" then "checkpoint (gen \(.status.gen))"
		else "? mode \(.status.mode // "none"), phase \(.status.phase)" end;
	# row(LABEL; PREFIX; TOTAL): the phases named PREFIX+clone etc., and TOTAL.
	def row($lbl; $pre; $total):
		[.app, .id, .node, $lbl, ms($pre + "clone"), ms($pre + "map"), ms($pre + "mount"), ms($pre + "container"),
		 ms($pre + "ready"), (if $pre == "boot." then ms("boot.checkpoint"), ms("boot.seal") else "-", "-" end), $total];
	(["APP", "DEPLOYMENT", "NODE", "WHAT HAPPENED", "CLONE", "MAP", "MOUNT", "CONTAINER", "READY", "CHECKPOINT", "SEAL", "TOTAL"] | @tsv),
	(.[] |
		if .status.booted then
			# The first deploy: its boot.* phases, then those of its restore.
			row(what; "boot."; sum(startswith("boot."))),
			(["", "", "", "  then restore from gen \(.status.gen)"] + (row(""; ""; sum(startswith("boot.") | not))[4:]))
		else row(what; ""; sum(true)) end | @tsv)' <<<"$recs" | column -t -s $'\t'
echo
if $engine; then
	fd_info "a restore against a plain boot of the same app (plain boot -> restore), in seconds:"
	fd_info "  ready:  from the started container to the readiness probe's first success (the app's own boot, or DMTCP's restart of its image)"
	fd_info "  deploy: the whole deploy, clone to ready (for the first deploy, boot + checkpoint + restore)"
	jq -r '
		def s: . / 1e7 | round | "\(. / 100 | floor).\(. % 100 | if . < 10 then "0\(.)" else tostring end)";
		def ready: [.status.timings[] | select(.name == "ready") | .duration_ns] | add // 0;
		def total: [.status.timings[] | select(.name | startswith("boot.") | not) | .duration_ns] | add // 0;
		def x: . * 10 | round | "\(. / 10 | floor).\(. % 10)x";
		def ratio($a; $b): if $b > 0 and $a >= $b then "\($a / $b | x) faster"
			elif $a > 0 and $b > 0 then "\($b / $a | x) SLOWER" else "-" end;
		group_by(.app) | .[] | select(length > 0) | .[0].app as $app |
		map(select(.status.phase == "Running")) as $r |
		($r | map(select(.status.mode == "boot" and .status.boot_reason == "requested")) | first) as $b |
		($r | map(select(.status.mode == "restore" and (.status.booted | not) and .status.pool != "hit")) | last) as $x |
		($r | map(select(.status.mode == "restore" and .status.pool == "hit")) | last) as $p |
		($r | map(select(.status.booted)) | first) as $f |
		if $b == null or $x == null then "  \($app): no plain boot and restore to compare (a deploy failed)"
		else
			"  \($app)\tready \($b | ready | s) -> \($x | ready | s)\t\(ratio($b | ready; $x | ready))" +
			"\tdeploy \($b | total | s) -> \($x | total | s)\t\(ratio($b | total; $x | total))" +
			(if $f then "\t(first deploy \([$f.status.timings[].duration_ns] | add | s))" else "" end),
			(if $p then "  \($app), warm-pool hit\tready \($b | ready | s) -> \($p | ready | s)\t\(ratio($b | ready; $p | ready))" +
				"\tdeploy \($b | total | s) -> \($p | total | s)\t\(ratio($b | total; $p | total))" else empty end)
		end' <<<"$recs" | column -t -s $'\t'
	# The sentence under the numbers, from the numbers.
	jq -r --arg main "$MAIN" '
		def ready: [.status.timings[] | select(.name == "ready") | .duration_ns] | add // 0;
		def total: [.status.timings[] | select(.name | startswith("boot.") | not) | .duration_ns] | add // 0;
		def s: . / 1e7 | round | "\(. / 100 | floor).\(. % 100 | if . < 10 then "0\(.)" else tostring end)";
		group_by(.app) | .[] | .[0].app as $app | map(select(.status.phase == "Running")) as $r |
		($r | map(select(.status.mode == "boot" and .status.boot_reason == "requested")) | first) as $b |
		($r | map(select(.status.mode == "restore" and (.status.booted | not) and .status.pool != "hit")) | last) as $x |
		($r | map(select(.status.mode == "restore" and .status.pool == "hit")) | last) as $p |
		select($b != null and $x != null) |
		if ($x | total) < ($b | total) then
			"demo: restoring \($app) saves \((($b | total) - ($x | total)) | s) s per deploy: the restore skips the \($b | ready | s) s boot."
		else
			"demo: restoring \($app) costs \((($x | total) - ($b | total)) | s) s more than booting it: its \($b | ready | s) s boot is quicker than the restart of its checkpoint."
		end,
		(if $p and $p.status.ahead then "demo: in a warm-pool slot restored ahead, deploying \($app) takes \($p | total | s) s: the slot was restored before the request, and the deploy raised it to the normal CPU weight (\($x | total | s) s without the pool)."
		elif $p then "demo: in a warm-pool slot, restoring \($app) takes \($p | total | s) s: \(($p | total) - ($p | ready) | s) s beyond the \($p | ready | s) s restart of its checkpoint (\(($x | total) - ($x | ready) | s) s without the pool)." else empty end)' <<<"$recs"
	echo
	fd_info "the checkpoints (each sealed as protected RBD snapshots; restores clone the environment's and read a node's copy of the checkpoint):"
	"$FOGCTL" checkpoint ls | awk -v apps=" ${APPS[*]} " 'NR == 1 || index(apps, " " $1 " ")'
else
	fd_warn "no checkpoint was made, so there is no restore to compare: every row above is a boot."
	fd_warn "Install DMTCP with scripts/install-engines.sh (see above) to see the restore path."
fi
echo
fd_info "demo done in $(fd_since "$t0") s; the instances keep running (\`bin/fogctl ps\`); \`make demo-down\` removes everything"
