#!/usr/bin/env bash
# A real Slurm cluster on this one Linux machine: munge, slurmctld and two slurmd "nodes"
# (node1, node2) on localhost, from Debian's slurm-wlm and munge packages.
#
#   bash cluster/local_slurm.sh up     start it (installs the packages with apt when root)
#   bash cluster/local_slurm.sh down   stop exactly what `up` started and remove its state
#
# Everything lives in one state folder (CLUSTER_DIR, default .cluster/ beside this folder):
# slurm.conf, the daemons' pid files, logs, spool and munge's socket. Slurm commands find the
# cluster through SLURM_CONF=$CLUSTER_DIR/slurm.conf, which the Makefile exports while the
# folder exists. One thing lives outside it, because JAX's processes look the node names up
# to find their coordinator: a line in /etc/hosts naming node1 and node2 as 127.0.0.1,
# marked and removed by `down`. Both commands are safe to run twice.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
STATE=${CLUSTER_DIR:-$(dirname "$here")/.cluster}
CONF=$STATE/slurm.conf
NODES=(node1 node2)
CPUS_PER_NODE=${CLUSTER_CPUS_PER_NODE:-16}  # claimed, not real: concurrent small jobs fit
CTLD_PORT=${CLUSTER_PORT:-6917}            # away from a system Slurm's 6817 and 6818
HOSTS_MARK="# Slurm nodes of cluster/local_slurm.sh in $STATE"
export SLURM_CONF=$CONF

say() { echo "cluster: $*"; }
fail() { echo "cluster: $*" >&2; exit 1; }

install_packages() {
  local missing=()
  for tool in slurmctld slurmd munged sinfo; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ]; then
    fail "Slurm is not installed (no ${missing[*]}) and installing it needs root: run 'sudo apt-get install slurm-wlm munge', then 'sudo make cluster'."
  fi
  command -v apt-get >/dev/null \
    || fail "Slurm is not installed and this is not a Debian-like system: install slurm-wlm and munge with your package manager, then run this again."
  say "installing slurm-wlm and munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

running() {  # the pid in pid file $1 names a live process
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

write_conf() {
  local memory
  memory=$(awk '/MemTotal/ {print int($2 / 1024 / 4)}' /proc/meminfo)  # a quarter, in MB
  mkdir -p "$STATE/state" "$STATE/log" "$STATE/spool/node1" "$STATE/spool/node2"
  cat >"$CONF" <<CONF
# Written by cluster/local_slurm.sh: two emulated nodes on this machine.
ClusterName=book
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=2
# Schedule a batch job when it is submitted: by default Slurm may hold it up to 3 s after
# its last scheduling pass, to batch a high rate of submissions.
SchedulerParameters=batch_sched_delay=0
MinJobAge=600
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 1)) CPUs=$CPUS_PER_NODE RealMemory=$memory State=UNKNOWN
NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 2)) CPUs=$CPUS_PER_NODE RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
  # A munge of the cluster's own: its key, socket and pid file in the state folder, run as root
  # like the Slurm daemons. --force lets it run where the state folder sits in a private
  # directory (munged would otherwise insist that every user can reach its socket).
  mkdir -p "$STATE/munge"
  chmod 755 "$STATE/munge"
  running "$STATE/munge/munged.pid" && return
  if [ ! -s "$STATE/munge/munge.key" ]; then
    head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
    chmod 400 "$STATE/munge/munge.key"
  fi
  munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" 2>/dev/null
}

add_hosts() {
  local node missing=()
  for node in "${NODES[@]}"; do
    case "$(getent ahostsv4 "$node" | awk 'NR == 1 {print $1}')" in
      "") missing+=("$node") ;;
      127.0.0.1) ;;
      *) fail "the name $node already means another machine here: remove it from /etc/hosts, then run this again." ;;
    esac
  done
  [ ${#missing[@]} -eq 0 ] && return
  printf '127.0.0.1 %s %s\n' "${missing[*]}" "$HOSTS_MARK" >>/etc/hosts
}

remove_hosts() {
  grep -qF "$HOSTS_MARK" /etc/hosts || return 0
  # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace it.
  local kept
  kept=$(grep -vF "$HOSTS_MARK" /etc/hosts)
  printf '%s\n' "$kept" >/etc/hosts
}

wait_idle() {
  local i
  for i in $(seq 1 100); do
    if [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" -eq ${#NODES[@]} ]; then
      return 0
    fi
    sleep 0.3
  done
  sinfo -N 2>&1 || true
  fail "the nodes did not become idle within 30 s: read $STATE/log/ for why, then run 'make cluster-down'."
}

start_node() {  # slurmd for node $1, seen by its jobs as a machine of its own where it can be
  # JAX tells machines apart by the kernel's boot_id: each node gets one of its own, bound over
  # /proc's in a mount namespace that slurmd and every task it starts share.
  local node=$1 boot_id="$STATE/boot_id-$1"
  cat /proc/sys/kernel/random/uuid >"$boot_id"
  if unshare --mount true 2>/dev/null; then
    unshare --mount sh -c 'mount --bind "$1" /proc/sys/kernel/random/boot_id 2>/dev/null \
      || echo "cluster: $3 shares the machine'"'"'s boot_id (no bind mount): JAX sees one machine"
      exec slurmd -f "$2" -N "$3"' start_node "$boot_id" "$CONF" "$node"
  else
    say "$node shares the machine's boot_id (no mount namespace): JAX sees one machine"
    slurmd -f "$CONF" -N "$node"
  fi
}

up() {
  [ "$(id -u)" -eq 0 ] && PATH=$PATH:/usr/sbin  # where Debian puts the daemons
  install_packages
  [ "$(id -u)" -eq 0 ] \
    || fail "starting the daemons needs root (they run jobs as any user): run 'sudo make cluster'."
  add_hosts
  [ -f "$CONF" ] || write_conf
  start_munge
  local tries
  for tries in $(seq 1 50); do
    [ -S "$STATE/munge/munge.socket" ] && break
    sleep 0.1
  done
  running "$STATE/slurmctld.pid" || slurmctld -f "$CONF" -i
  for node in "${NODES[@]}"; do
    running "$STATE/slurmd-$node.pid" || start_node "$node"
  done
  wait_idle
  say "two nodes idle; Slurm commands need SLURM_CONF=$CONF (make exports it)"
  sinfo -N
}

stop() {  # SIGTERM to the process in pid file $1, then wait for it to end
  local pidfile=$1 pid i
  running "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill -TERM "$pid"
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

down() {
  if [ -f "$CONF" ] && running "$STATE/slurmctld.pid"; then
    scancel --user="$(id -un)" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for node in "${NODES[@]}"; do stop "$STATE/slurmd-$node.pid"; done
  stop "$STATE/slurmctld.pid"
  stop "$STATE/munge/munged.pid"
  [ "$(id -u)" -eq 0 ] && remove_hosts
  rm -rf "$STATE"
  say "stopped"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) fail "say 'up' or 'down', e.g. bash cluster/local_slurm.sh up" ;;
esac
