#!/usr/bin/env bash
# bench.sh: fogdeploy's evaluation (`make bench`). Builds the environments of the app catalog
# (configs/apps, configs/envs; cached in the pool after the first run), then runs tests/bench's
# TestEvaluation over them: plain boot vs first deploy vs restore per app, checkpoint size and
# time, bytes at the OSDs, restore phases, simultaneous restores, and nginx under ab with and
# without concurrent deployments; then pool hits through the hook API as a client sees them
# (tests/e2e TestRequestPathPoP: request-path.json), and migrations and a drain, and a redis with
# 256 MiB written migrated, suspended and resumed beside a restore (TestMigrateDrainPoP:
# migrate-<engine>.json); the front end (TestFrontendPoP, and with nginx TestFrontendNginxPoP:
# frontend-<engine>.json, frontend-nginx.json); and the memory of 1, 2 and 4 slots restored ahead without and with
# same-page merging (tests/bench TestPoolMemory: pool-memory.json, pool-memory.md). Results: bench/results/<timestamp>/ (JSON, CSV, Markdown, SVG),
# bench/results/latest points at the newest. Then the layering micro-benchmarks.
#   APPS=redis,nginx     a subset of the catalog (default: all of it)
#   BENCH_REPS=5         repetitions per measurement
#   BENCH_AB_SECONDS=5   seconds per ab run
set -euo pipefail
FD_PROG=bench
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
FOGCTL=${FOGCTL:-bin/fogctl}
GO=${GO:-go}
CATALOG=(redis pyhttp nginx postgres mariadb tomcat pgindex codesearch routes fleet)
DMTCP_PREFIX=${FOGDEPLOY_DMTCP_PREFIX:-${DMTCP_PREFIX:-/opt/dmtcp}}

fd_is_root || fd_die "the evaluation maps and mounts RBD images: run it as root"
[[ -x $DMTCP_PREFIX/bin/dmtcp_launch ]] || fd_die "no DMTCP at $DMTCP_PREFIX: the evaluation restores apps from DMTCP checkpoints.
  Build DMTCP 4.2 from its source outside this repository (./configure --prefix=/opt/dmtcp && make && make install),
  or set FOGDEPLOY_DMTCP_PREFIX to an installed prefix."
command -v ab >/dev/null || fd_install_deps tools

apps=()
IFS=, read -ra req <<<"${APPS:-${CATALOG[*]}}"
[[ -n ${APPS:-} ]] || read -ra req <<<"${CATALOG[*]}"
for a in "${req[@]}"; do
	a=${a// /}
	[[ -n $a ]] || continue
	[[ " ${CATALOG[*]} " == *" $a "* ]] || fd_die "APPS: unknown app '$a': pick from $(
		IFS=,
		echo "${CATALOG[*]}"
	)"
	apps+=("$a")
done
((${#apps[@]} > 0)) || fd_die "APPS is empty: pick from $(
	IFS=,
	echo "${CATALOG[*]}"
)"

t0=$(fd_now_us)
fd_base_env "$FOGCTL"
for a in "${apps[@]}"; do
	env=$(sed -n 's/^env:[[:space:]]*\([a-z0-9._-]*\).*/\1/p' "configs/apps/$a.yaml")
	[[ -n $env ]] || fd_die "configs/apps/$a.yaml has no env: line"
	fd_info "environment $env (configs/envs/$env.build; cached steps are reused)"
	"$FOGCTL" env build "$env" -f "configs/envs/$env.build" -q
done
fd_info "environments ready in $(fd_since "$t0") s"

RESULTS=${FOGDEPLOY_BENCH_RESULTS:-bench/results}
mkdir -p "$RESULTS"
log=$RESULTS/evaluation.log
fd_info "evaluation of ${apps[*]} (full log: $log)"
set +e
APPS=$(
	IFS=,
	echo "${apps[*]}"
) FOGDEPLOY_BENCH=1 FOGDEPLOY_BENCH_RESULTS=$(readlink -f "$RESULTS") FOGDEPLOY_DMTCP_PREFIX=$DMTCP_PREFIX \
	"$GO" test -tags="${CEPH_TAGS:-pacific}" -count=1 -v -run '^TestEvaluation$' -timeout 45m ./tests/bench/ 2>&1 |
	tee "$log" | grep --line-buffered -E 'eval_test\.go|^(--- |FAIL|ok |PASS)' | sed -u 's/^ *eval_test\.go:[0-9]*: //'
rc=${PIPESTATUS[0]}
set -e
((rc == 0)) || fd_die "the evaluation failed (exit $rc); see $log"
dir=$(readlink -f "$RESULTS/latest")
cp "$log" "$dir/evaluation.log"

# e2e_measure TEST LOGNAME PATTERN: runs tests/e2e's TEST with its results written into $dir,
# shows the lines that match PATTERN, and stops the evaluation if it fails.
e2e_measure() {
	local rc
	set +e
	FOGDEPLOY_BENCH_OUT=$dir FOGDEPLOY_DMTCP_PREFIX=$DMTCP_PREFIX \
		"$GO" test -tags="${CEPH_TAGS:-pacific}" -count=1 -v -run "^$1\$" -timeout 20m ./tests/e2e/ 2>&1 |
		tee "$dir/$2.log" | grep --line-buffered -E "$3|^(--- FAIL|FAIL)" | sed -u 's/^ *[a-z_]*_test\.go:[0-9]*: //'
	rc=${PIPESTATUS[0]}
	set -e
	((rc == 0)) || fd_die "$1 failed (exit $rc); see $dir/$2.log"
}

fd_info "memory of 1, 2 and 4 slots restored ahead, without and with same-page merging"
set +e
APPS=$(
	IFS=,
	echo "${apps[*]}"
) FOGDEPLOY_BENCH=1 FOGDEPLOY_BENCH_OUT=$dir FOGDEPLOY_DMTCP_PREFIX=$DMTCP_PREFIX \
	"$GO" test -tags="${CEPH_TAGS:-pacific}" -count=1 -v -run '^TestPoolMemory$' -timeout 30m ./tests/bench/ 2>&1 |
	tee "$dir/pool-memory.log" | grep --line-buffered -E 'slots restored ahead|^(--- FAIL|FAIL)' | sed -u 's/^ *[a-z_]*_test\.go:[0-9]*: //'
rc=${PIPESTATUS[0]}
set -e
((rc == 0)) || fd_die "TestPoolMemory failed (exit $rc); see $dir/pool-memory.log"

fd_info "request path: pool hits on a 3-node PoP, from a client's hook POST to the app's first answer"
e2e_measure TestRequestPathPoP request-path 'request path'
fd_info "migration under DMTCP and CRIU: a client's downtime, 256 MiB moved, suspended and resumed, and a drain of 8 instances"
e2e_measure TestMigrateDrainPoP migrate 'migrated|drained|256 MiB'

fd_info "the front end under DMTCP and CRIU: PINGs direct and through the front ends, a wake at the client, a migration and a drain under load"
e2e_measure TestFrontendPoP frontend 'front end|woken|under load'
if [[ " ${apps[*]} " == *" nginx "* ]]; then
	fd_info "the front end under nginx's load: ab -k -c 100 direct and through the front ends"
	e2e_measure TestFrontendNginxPoP frontend-nginx 'front end nginx'
fi

fd_info "layering micro-benchmarks (clone, map+mount, import)"
"$GO" test -tags="${CEPH_TAGS:-pacific}" -count=1 -run '^$' -bench . -benchtime 20x -timeout 10m ./tests/bench/ 2>&1 |
	tee "$dir/layering.txt" | grep -E '^(Benchmark|ok|FAIL)'
fd_info "done in $(fd_since "$t0") s: $dir"
ls "$dir"
