#!/usr/bin/env bash
# dev-ceph.sh up|down|status|env: a one-node Ceph cluster (1 mon, 1 mgr, N OSDs) on 127.0.0.1 for
# development, tests, the demo and CI. Everything lives under $DEV/ceph; see docs/dev-cluster.md.
set -euo pipefail
FD_PROG="dev-ceph"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

DEV=$(fd_dev_dir)
C=$DEV/ceph
CONF=$C/ceph.conf
KEYRING=$C/ceph.client.admin.keyring
POOL=${FOGDEPLOY_CEPH_POOL:-fogdeploy}
STORE=${FOGDEPLOY_CEPH_STORE:-memstore}
NOSDS=${FOGDEPLOY_CEPH_OSDS:-1}
PG_NUM=${FOGDEPLOY_CEPH_PG_NUM:-32}
# A second pool for the tests that compare a whole pool before and after
# (internal/testenv.PrivatePool), made here with the cluster: a pool created
# or removed while another client unprotects a snapshot can stall it (librbd
# looks for clones in every pool).
TESTPOOL=$POOL-envtest
MEMSTORE_BYTES=${FOGDEPLOY_CEPH_MEMSTORE_BYTES:-8589934592}    # 8 GiB reported size; RAM is used as data is written
BLUESTORE_BYTES=${FOGDEPLOY_CEPH_BLUESTORE_BYTES:-21474836480} # 20 GiB sparse file per OSD
# The mgr imports every module it can see at start-up (~4 s here). It sees only the always-on ones plus these.
MGR_MODULES=${FOGDEPLOY_CEPH_MGR_MODULES:-iostat}
MGR_ALWAYS_ON="balancer crash devicehealth orchestrator pg_autoscaler progress rbd_support status telemetry volumes"
HEALTH_TIMEOUT=${FOGDEPLOY_CEPH_HEALTH_TIMEOUT:-90}
MON_PORT=${FOGDEPLOY_CEPH_MON_PORT:-3300}       # msgr2; change both ports to run a second cluster beside the default one
MON_PORT_V1=${FOGDEPLOY_CEPH_MON_PORT_V1:-6789} # msgr1 (legacy clients, e.g. kernel rbd)
MON_ADDRS="[v2:127.0.0.1:$MON_PORT,v1:127.0.0.1:$MON_PORT_V1]"
LOCK=$DEV/.dev-ceph.lock

usage() {
	cat >&2 <<EOF
usage: ${0##*/} up|down|status|env
  up      start the cluster (idempotent; recreates it from nothing when it is stale)
  down    unmount/unmap what uses it, stop mon/mgr/osd and remove its data (logs are kept)
  status  print health; exit 0 when running, 3 when not
  env     print export lines for FOGDEPLOY_CEPH_* and CEPH_CONF
EOF
	exit 2
}

# ceph CLI against the dev cluster with bounded waits.
cceph() { timeout 60 ceph -c "$CONF" --connect-timeout 30 "$@"; }
authtool() { ceph-authtool "$@" >/dev/null; }
# Quick probe: does the mon answer within a few seconds?
cceph_quick() { timeout 8 ceph -c "$CONF" --connect-timeout 5 "$@" 2>/dev/null; }

# Ready means: HEALTH_OK, an active mgr, all OSDs up and in, the pool present, all PGs active+clean.
# HEALTH_OK alone is not enough: until the mgr reports, the mon says HEALTH_OK with no PG data at all.
READY_WHY=
cluster_ready() {
	local js
	READY_WHY="mon does not answer"
	js=$(cceph_quick status -f json) || return 1
	READY_WHY="health is not HEALTH_OK"
	[[ $js == *'"health":{"status":"HEALTH_OK"'* ]] || return 1
	READY_WHY="no active mgr"
	[[ $js == *'"mgrmap":{"available":true'* ]] || return 1
	READY_WHY="not all $NOSDS OSDs up and in"
	[[ $js == *"\"num_up_osds\":$NOSDS,"* && $js == *"\"num_in_osds\":$NOSDS,"* ]] || return 1
	READY_WHY="PGs not all active+clean"
	[[ $js =~ \"pgs_by_state\":\[\{\"state_name\":\"active\+clean\",\"count\":([0-9]+)\}\],\"num_pgs\":([0-9]+), ]] || return 1
	[[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" && ${BASH_REMATCH[1]} -ge $((PG_NUM + 1)) ]] || return 1
	READY_WHY=
}

daemon_pidfiles() {
	local f
	for f in "$C"/run/ceph-osd.*.pid; do [[ -e $f ]] && printf '%s\n' "$f"; done
	printf '%s\n' "$C/run/ceph-mgr.x.pid" "$C/run/ceph-mon.a.pid"
}

# True when every daemon in the pidfiles is alive (and there is at least one OSD).
daemons_alive() {
	local f n=0
	[[ -r $CONF && -r $KEYRING ]] || return 1
	while read -r f; do
		fd_pidfile_pid "$f" >/dev/null || return 1
		[[ $f == *ceph-osd.* ]] && n=$((n + 1))
	done < <(daemon_pidfiles)
	((n > 0))
}

conf_fsid() { sed -n 's/^[[:space:]]*fsid[[:space:]]*=[[:space:]]*//p' "$CONF" 2>/dev/null | head -n1; }

# A module directory with only the modules the dev cluster uses (symlinks into the packaged directory).
link_mgr_modules() {
	local sys=/usr/share/ceph/mgr m
	mkdir -p -- "$C/mgr-modules"
	for m in "$sys"/*.py $MGR_ALWAYS_ON $MGR_MODULES; do
		[[ $m == /* ]] || m=$sys/$m
		[[ -e $m ]] || fd_die "no mgr module $m (FOGDEPLOY_CEPH_MGR_MODULES?)"
		ln -sfn -- "$m" "$C/mgr-modules/${m##*/}"
	done
}

write_conf() {
	local fsid=$1 store_conf
	if [[ $STORE == bluestore ]]; then
		store_conf="osd objectstore = bluestore
bluestore block create = true
bluestore block size = $BLUESTORE_BYTES
bluestore fsck on mount = false
bluestore fsck on mkfs = false
osd memory target = 1073741824"
	else
		# A memstore OSD's count of the bytes it holds can drop below zero
		# after many writes and removals; it then reports 16 EiB used and
		# the cluster refuses every write as full. The OSD computes its
		# fullness from its PGs' object bytes instead, up to the same size.
		store_conf="osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES
fake statfs for testing = $MEMSTORE_BYTES"
	fi
	cat >"$CONF" <<EOF
# Generated by scripts/dev-ceph.sh; recreated by every fresh 'up'. Do not edit.
[global]
fsid = $fsid
mon host = $MON_ADDRS
public addr = 127.0.0.1
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $C/run
crash dir = $C/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
mon data avail warn = 2
mon data avail crit = 1
mgr stats period = 1
mgr initial modules = $MGR_MODULES
mgr module path = $C/mgr-modules

[mon]
mon data = $C/mon/\$cluster-\$id
mon cluster log file = $C/log/\$cluster.\$channel.log
paxos propose interval = 0.05
log file = $C/log/\$cluster-\$name.log
pid file = $C/run/\$cluster-\$name.pid
admin socket = $C/run/\$cluster-\$name.asok

[mgr]
mgr data = $C/mgr/\$cluster-\$id
keyring = $C/mgr/\$cluster-\$id/keyring
log file = $C/log/\$cluster-\$name.log
pid file = $C/run/\$cluster-\$name.pid
admin socket = $C/run/\$cluster-\$name.asok

[osd]
osd data = $C/osd/\$cluster-\$id
keyring = $C/osd/\$cluster-\$id/keyring
osd fast shutdown = false
$store_conf
log file = $C/log/\$cluster-\$name.log
pid file = $C/run/\$cluster-\$name.pid
admin socket = $C/run/\$cluster-\$name.asok

[client]
keyring = $KEYRING
admin socket = $C/run/\$cluster-\$name.\$pid.asok
EOF
}

# Unmount, unmap and stop everything that uses the dev cluster from this machine:
# krbd devices of this cluster, rbd-nbd and rbd-fuse processes naming this conf, loop devices
# backed by files on those rbd-fuse mounts (and their mounts), and mounts under $DEV (except $DEV/docker).
cleanup_clients() {
	local mp fstype src fsid d id dev pid
	local -a fuse_pids=() nbd_pids=() fuse_mps=() loops=() mps=()

	# krbd (not available on the dev VM, but on real nodes): unmap this cluster's devices while the OSDs still run.
	fsid=$(conf_fsid)
	if [[ -n $fsid && -d /sys/bus/rbd/devices ]]; then
		for d in /sys/bus/rbd/devices/*; do
			[[ -r $d/cluster_fsid && $(<"$d/cluster_fsid") == "$fsid" ]] || continue
			id=${d##*/}
			while IFS=$'\t' read -r mp fstype src; do
				if [[ $src == "/dev/rbd$id" || $src == /dev/rbd$id"p"* ]]; then
					fd_umount "$mp" "$fstype" || true
				fi
			done < <(fd_mounts | sort -r)
			fd_info "unmapping /dev/rbd$id"
			echo "$id force" >/sys/bus/rbd/remove_single_major 2>/dev/null ||
				echo "$id force" >/sys/bus/rbd/remove 2>/dev/null || fd_warn "could not unmap /dev/rbd$id"
		done
	fi

	mapfile -t fuse_pids < <(fd_pids_matching "rbd-fuse" "$CONF")
	mapfile -t nbd_pids < <(fd_pids_matching "rbd-nbd" "$CONF")

	# rbd-fuse mounts that are ours: under $DEV, or named on the command line of one of our rbd-fuse processes.
	local cmd
	while IFS=$'\t' read -r mp fstype src; do
		[[ $fstype == fuse* && ($src == rbd-fuse || $fstype == *rbd-fuse*) ]] || continue
		if [[ $mp == "$DEV"/* ]]; then
			fuse_mps+=("$mp")
			continue
		fi
		for pid in "${fuse_pids[@]}"; do
			cmd=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || continue
			while IFS= read -r arg; do
				if [[ -n $arg && ($arg == "$mp" || ($arg != /* && $mp == */"${arg%/}")) ]]; then
					fuse_mps+=("$mp")
					break 2
				fi
			done <<<"$cmd"
		done
	done < <(fd_mounts)

	# Loop devices whose backing file lives on one of our rbd-fuse mounts.
	for d in /sys/block/loop*; do
		[[ -r $d/loop/backing_file ]] || continue
		src=$(<"$d/loop/backing_file")
		for mp in "${fuse_mps[@]}"; do
			if [[ $src == "$mp"/* ]]; then
				loops+=("/dev/${d##*/}")
				break
			fi
		done
	done

	# Unmount filesystems on those loop devices (wherever mounted) and mounts under $DEV, deepest first.
	while IFS=$'\t' read -r mp fstype src; do
		if [[ " ${loops[*]} " == *" $src "* ]] || [[ $mp == "$DEV"/* && $mp != "$DEV"/docker && $mp != "$DEV"/docker/* ]]; then
			mps+=("$mp"$'\t'"$fstype")
		fi
	done < <(fd_mounts | sort -r)
	for mp in "${mps[@]}"; do
		fstype=${mp#*$'\t'}
		mp=${mp%$'\t'*}
		# rbd-fuse mounts are unmounted after their loop devices are detached.
		[[ $fstype == fuse* ]] && continue
		fd_info "unmounting $mp"
		fd_umount "$mp" "$fstype" || true
	done
	for dev in "${loops[@]}"; do
		fd_info "detaching $dev"
		losetup -d "$dev" 2>/dev/null || fd_warn "could not detach $dev"
		if [[ -e /sys/block/${dev#/dev/}/loop/backing_file ]]; then
			fd_warn "$dev is still in use (a process holds its filesystem); the kernel frees it when that process exits"
		fi
	done
	for mp in "${mps[@]}" "${fuse_mps[@]/%/$'\t'fuse}"; do
		fstype=${mp#*$'\t'}
		mp=${mp%$'\t'*}
		[[ $fstype == fuse* ]] || continue
		mountpoint -q -- "$mp" 2>/dev/null || continue
		fd_info "unmounting $mp"
		fd_umount "$mp" "$fstype" || true
	done

	if ((${#fuse_pids[@]} + ${#nbd_pids[@]} > 0)); then
		fd_info "stopping ${#fuse_pids[@]} rbd-fuse and ${#nbd_pids[@]} rbd-nbd process(es)"
		fd_stop_pids 10 "${fuse_pids[@]}" "${nbd_pids[@]}" || true
	fi
}

stop_daemons() {
	local f pid
	local -a osds=() others=() mon=()
	for f in "$C"/run/ceph-osd.*.pid; do pid=$(fd_pidfile_pid "$f") && osds+=("$pid"); done
	pid=$(fd_pidfile_pid "$C/run/ceph-mgr.x.pid") && others+=("$pid")
	pid=$(fd_pidfile_pid "$C/run/ceph-mon.a.pid") && mon+=("$pid")
	# OSDs and mgr first (in parallel), the mon last.
	fd_stop_pids 15 "${osds[@]}" "${others[@]}" || true
	fd_stop_pids 10 "${mon[@]}" || true
	# Daemons not in pidfiles (stale state): anything started with this conf.
	mapfile -t others < <(fd_pids_matching "ceph-osd ceph-mgr ceph-mon" "$CONF")
	if ((${#others[@]} > 0)); then
		fd_info "stopping stray daemon(s) ${others[*]}"
		fd_stop_pids 10 "${others[@]}" || true
	fi
}

# Remove cluster state but keep logs for inspection.
remove_data() {
	[[ -d $C ]] || return 0
	find "$C" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf -- {} +
}

cmd_down() {
	local start
	start=$(fd_now_us)
	fd_lock "$LOCK"
	if [[ -e $CONF ]]; then
		# No client needs the mgr for I/O, and it takes ~2 s to stop: let it stop while clients are cleaned up.
		local mgr
		if mgr=$(fd_pidfile_pid "$C/run/ceph-mgr.x.pid"); then kill -TERM "$mgr" 2>/dev/null || true; fi
		cleanup_clients
		# The data is deleted next, so the OSDs need not save it (memstore writes all of it to disk on a clean stop).
		local asok
		for asok in "$C"/run/ceph-osd.*.asok; do
			if [[ -S $asok ]]; then
				timeout 5 ceph --admin-daemon "$asok" config set osd_fast_shutdown true >/dev/null 2>&1 || true
			fi
		done
		stop_daemons
	fi
	remove_data
	fd_info "down in $(fd_since "$start")s"
}

print_where() {
	fd_info "conf:    $CONF"
	fd_info "keyring: $KEYRING"
	fd_info "pool:    $POOL"
}

ensure_pool() {
	local pool pgs pools
	pools=$(cceph osd pool ls 2>/dev/null)
	for pool in "$POOL" "$TESTPOOL"; do
		grep -qx -- "$pool" <<<"$pools" && continue
		pgs=$PG_NUM
		[[ $pool == "$TESTPOOL" ]] && pgs=8
		fd_info "creating pool $pool"
		cceph osd pool create "$pool" "$pgs" "$pgs" replicated >>"$C/log/setup.log" 2>&1 ||
			fd_die "creating pool $pool failed (see $C/log/setup.log)"
		timeout 60 rbd -c "$CONF" pool init "$pool" >>"$C/log/setup.log" 2>&1 ||
			fd_die "rbd pool init $pool failed (see $C/log/setup.log)"
	done
}

fail_up() {
	local f
	fd_warn "$*"
	for f in "$C"/log/ceph-mon.a.log "$C"/log/ceph-mgr.x.log "$C"/log/ceph-osd.*.log; do
		[[ -s $f ]] || continue
		echo "--- last lines of $f" >&2
		tail -n 8 "$f" >&2
	done
	fd_warn "stopping the half-started cluster (logs kept in $C/log)"
	cleanup_clients >/dev/null 2>&1 || true
	stop_daemons >/dev/null 2>&1 || true
	remove_data
	exit 1
}

cmd_up() {
	local start t fsid i p
	start=$(fd_now_us)
	[[ $STORE == memstore || $STORE == bluestore ]] || fd_die "FOGDEPLOY_CEPH_STORE must be memstore or bluestore, not '$STORE'"
	[[ $NOSDS =~ ^[1-9]$ ]] || fd_die "FOGDEPLOY_CEPH_OSDS must be 1-9, not '$NOSDS'"
	fd_install_deps ceph
	fd_check_sock_path "$C/run/ceph-client.admin.4194304.asok"
	fd_lock "$LOCK"

	# Fast path: all daemons alive and the mon answers (one CLI process for both queries).
	local out
	if daemons_alive && out=$(printf 'osd pool ls\nhealth\n' | cceph_quick) && [[ $out == *HEALTH_* ]]; then
		{ grep -qx -- "$POOL" <<<"$out" && grep -qx -- "$TESTPOOL" <<<"$out"; } || ensure_pool
		fd_info "already running (${out##*$'\n'}) in $(fd_since "$start")s"
		print_where
		return 0
	fi

	if [[ -d $C ]] && find "$C" -mindepth 1 -maxdepth 1 ! -name log | grep -q .; then
		fd_info "cleaning stale state in $C"
		if [[ -e $CONF ]]; then
			cleanup_clients
			stop_daemons
		fi
		remove_data
	fi
	local port
	for port in "$MON_PORT" "$MON_PORT_V1"; do
		if command -v ss >/dev/null && ss -Hltn "sport = :$port" | grep -q .; then
			fd_die "port 127.0.0.1:$port is in use (another Ceph cluster? set FOGDEPLOY_CEPH_MON_PORT and FOGDEPLOY_CEPH_MON_PORT_V1)"
		fi
	done
	rm -rf -- "$C/log"
	umask 077
	mkdir -p -- "$C"/{run,log,crash,mon/ceph-a,mgr/ceph-x}
	fsid=$(cat /proc/sys/kernel/random/uuid)
	write_conf "$fsid"
	chmod 0644 "$CONF"
	link_mgr_modules

	# Keys for every entity go into the mon's initial keyring, so no auth commands are needed later.
	local kt=$C/run/mkfs.keyring
	authtool --create-keyring "$KEYRING" --gen-key -n client.admin \
		--cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *'
	authtool --create-keyring "$C/mgr/ceph-x/keyring" --gen-key -n mgr.x \
		--cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *'
	authtool --create-keyring "$kt" --gen-key -n mon. --cap mon 'allow *'
	authtool "$kt" --import-keyring "$KEYRING"
	authtool "$kt" --import-keyring "$C/mgr/ceph-x/keyring"
	local -a uuids=()
	for ((i = 0; i < NOSDS; i++)); do
		uuids+=("$(cat /proc/sys/kernel/random/uuid)")
		mkdir -p -- "$C/osd/ceph-$i"
		authtool --create-keyring "$C/osd/ceph-$i/keyring" --gen-key -n "osd.$i" \
			--cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *'
		authtool "$kt" --import-keyring "$C/osd/ceph-$i/keyring"
	done
	chmod 0600 "$KEYRING"

	monmaptool --create --clobber --enable-all-features --fsid "$fsid" --addv a "$MON_ADDRS" "$C/run/monmap" >/dev/null ||
		fail_up "monmaptool failed"
	ceph-mon -c "$CONF" --mkfs -i a --monmap "$C/run/monmap" --keyring "$kt" >>"$C/log/mkfs.log" 2>&1 ||
		fail_up "ceph-mon --mkfs failed (see $C/log/mkfs.log)"
	rm -f -- "$kt" "$C/run/monmap"
	ceph-mon -c "$CONF" -i a >>"$C/log/daemons.out" 2>&1 9>&- || fail_up "ceph-mon did not start"
	# The mgr is the slowest to become ready: start it right away; it waits for the mon itself.
	ceph-mgr -c "$CONF" -i x >>"$C/log/daemons.out" 2>&1 9>&- || fail_up "ceph-mgr did not start"
	# OSD mkfs needs no mon (--no-mon-config), so it overlaps with the mon start.
	for ((i = 0; i < NOSDS; i++)); do
		ceph-osd -c "$CONF" -i "$i" --mkfs --osd-uuid "${uuids[i]}" --no-mon-config >>"$C/log/mkfs.log" 2>&1 ||
			fail_up "ceph-osd --mkfs failed (see $C/log/mkfs.log)"
	done

	# One CLI process for all map changes (each ceph process costs ~0.2 s of start-up).
	{
		for ((i = 0; i < NOSDS; i++)); do echo "osd new ${uuids[i]} $i"; done
		echo "osd pool create device_health_metrics 1 1 replicated"
		echo "osd pool application enable device_health_metrics mgr_devicehealth"
		echo "osd pool create $POOL $PG_NUM $PG_NUM replicated"
		echo "osd pool create $TESTPOOL 8 8 replicated"
	} | cceph >"$C/log/setup.log" 2>&1 || fail_up "creating OSDs and pools failed (see $C/log/setup.log)"
	# In this batch mode the CLI exits 0 even when a command fails.
	if grep -q '^Error' "$C/log/setup.log"; then
		grep '^Error' "$C/log/setup.log" >&2
		fail_up "creating OSDs and pools failed (see $C/log/setup.log)"
	fi

	for ((i = 0; i < NOSDS; i++)); do
		ceph-osd -c "$CONF" -i "$i" >>"$C/log/daemons.out" 2>&1 9>&- || fail_up "ceph-osd.$i did not start"
	done
	for p in "$POOL" "$TESTPOOL"; do
		timeout 60 rbd -c "$CONF" pool init "$p" >>"$C/log/setup.log" 2>&1 ||
			fail_up "rbd pool init $p failed (see $C/log/setup.log)"
	done

	t=$(fd_now_us)
	while ! cluster_ready; do
		if (($(fd_now_us) - t > HEALTH_TIMEOUT * 1000000)); then
			cceph_quick health detail >&2 || true
			fail_up "not ready after ${HEALTH_TIMEOUT}s: $READY_WHY"
		fi
		sleep 0.2
	done
	fd_info "HEALTH_OK ($STORE, $NOSDS osd) in $(fd_since "$start")s"
	print_where
	fd_info "use: eval \"\$($0 env)\""
}

cmd_status() {
	if [[ ! -e $CONF ]]; then
		fd_info "not running (no $CONF)"
		exit 3
	fi
	if ! daemons_alive; then
		fd_info "not running (a daemon is missing; run '${0##*/} up' to recreate)"
		exit 3
	fi
	local s
	if ! s=$(cceph_quick -s); then
		fd_info "not running (mon does not answer)"
		exit 3
	fi
	printf '%s\n' "$s"
	print_where
}

cmd_env() {
	printf 'export %s=%q\n' \
		FOGDEPLOY_CEPH_CONF "$CONF" \
		FOGDEPLOY_CEPH_KEYRING "$KEYRING" \
		FOGDEPLOY_CEPH_POOL "$POOL" \
		FOGDEPLOY_CEPH_ID admin \
		CEPH_CONF "$CONF"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
env) cmd_env ;;
*) usage ;;
esac
