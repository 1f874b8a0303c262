#!/usr/bin/env bash
# A SLURM cluster for tests, from Debian's slurm-wlm and munge, in a directory of its own: one node
# (this host), or the nodes of a simulated cluster (tests/cluster/cluster.sh) with slurmctld on node1
# and one slurmd per node.
#   tests/slurm/cluster.sh start DIR [NODES]  # NODES: a started tests/cluster/cluster.sh directory.
#                                      # exit 77 (skip) with "SKIPPED: reason" on stderr when it cannot
#                                      # run; then: export SLURM_CONF=DIR/slurm.conf; sbatch --wait ...
#                                      # (with NODES, from a node: NODES/run node1 sbatch ...)
#   tests/slurm/cluster.sh stop DIR    # stops the daemons it started (pids in DIR/pids), nothing else
# Needs root (slurmd launches jobs as their user; munged runs as user munge). Ports 16817/16818 and
# the cluster's own munge socket keep it apart from any SLURM or munge already on the machine.
set -uo pipefail

SLURM_CLUSTER_PIDS=()

slurm_cluster_skip() {
  echo "SKIPPED: $*" >&2
  return 77
}

# The pid a daemon writes to FILE once it has daemonised: waited for (up to 30 s), never read early
# (a pid read before it is written would be lost, and the daemon left running by stop).
pid_from() {
  local file=$1 i
  for ((i = 0; i < 300; i++)); do
    [[ -s $file ]] && head -n 1 "$file" && return 0
    sleep 0.1
  done
  echo "tests/slurm/cluster.sh: no pid in $file after 30 s" >&2
  return 1
}

slurm_cluster_start() {
  local dir=$1 nodes=${2:-}
  [[ $(id -u) -eq 0 ]] || { slurm_cluster_skip "a test SLURM needs root (slurmd, munged as user munge)"; return; }
  local b
  for b in munged slurmctld slurmd sbatch srun sinfo; do
    command -v "$b" >/dev/null || PATH=$PATH:/usr/sbin command -v "$b" >/dev/null ||
      { slurm_cluster_skip "$b not installed (Debian: apt-get install slurm-wlm munge)"; return; }
  done
  id munge >/dev/null 2>&1 || { slurm_cluster_skip "no user munge (Debian package munge)"; return; }
  export PATH=$PATH:/usr/sbin
  local plugins
  plugins=$(dirname "$(dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep -m1 '/mpi_pmix.so$')" 2>/dev/null)
  [[ -n "$plugins" && -e "$plugins/mpi_pmix.so" ]] || { slurm_cluster_skip "SLURM's mpi/pmix plugin not found"; return; }

  mkdir -p "$dir"/{state,spool,munge,log}
  dir=$(cd "$dir" && pwd)
  local host on_node=() n_nodes=0
  host=$(hostname -s)
  if [[ -n $nodes ]]; then
    nodes=$(cd "$nodes" && pwd)
    [[ -x $nodes/run && -f $nodes/hostfile ]] || { echo "slurm fixture: $nodes is not a started simulated cluster" >&2; return 1; }
    n_nodes=$(wc -l <"$nodes/hostfile")
    host=node1
    on_node=("$nodes/run")
  fi
  # munged: its own key, socket and state, owned by munge and closed to others (munged checks).
  mkdir -p "$dir/munge/run"
  chown -R munge:munge "$dir/munge"
  chmod 711 "$dir/munge"
  chmod 755 "$dir/munge/run"
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=128 count=1 status=none
  chown munge:munge "$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  local socket="$dir/munge/run/munge.socket"
  setpriv --reuid=munge --regid=munge --init-groups munged --key-file="$dir/munge/munge.key" --socket="$socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" ||
    { cat "$dir/munge/munged.log" >&2 2>/dev/null; echo "slurm fixture: munged did not start" >&2; return 1; }
  SLURM_CLUSTER_PIDS+=("$(cat "$dir/munge/munged.pid")")
  echo "${SLURM_CLUSTER_PIDS[@]}" >"$dir/pids"

  # Two stand-in GPUs per node as GRES, so that --gpus-per-node / --gpus-per-task are allocated and
  # set CUDA_VISIBLE_DEVICES as on a GPU cluster: character devices (/dev/null's numbers) that
  # nothing opens, one gres.conf line for every node.
  mkdir -p "$dir/dev"
  local g
  for g in 0 1; do
    [[ -e "$dir/dev/gpu$g" ]] || mknod "$dir/dev/gpu$g" c 1 3 ||
      { slurm_cluster_skip "cannot make stand-in GPU devices (mknod) in $dir/dev"; return; }
  done
  echo "Name=gpu File=$dir/dev/gpu[0-1]" >"$dir/gres.conf"
  local controller=$host node_lines
  node_lines="NodeName=$host CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
  if ((n_nodes > 0)); then
    controller="node1(10.77.0.1)"
    node_lines="NodeName=node[1-$n_nodes] NodeAddr=10.77.0.[1-$n_nodes] CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=node[1-$n_nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
  fi
  mkdir -p "$dir/spool"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=mgbench-test
SlurmctldHost=$controller
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
PluginDir=$plugins
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=10
GresTypes=gpu
$node_lines
CONF
  # PMIx's per-step directories have the same names on every node: in a directory each node's
  # slurmd (and the step daemons it starts) sees as its own, DIR/node-local (DIR/nodes/<node> bound
  # there in a mount namespace of the slurmd's), as a node's local /tmp would be.
  if ((n_nodes > 0)); then
    mkdir -p "$dir/node-local"
    echo "PMIxCliTmpDirBase=$dir/node-local" >"$dir/mpi.conf"
  fi
  export SLURM_CONF="$dir/slurm.conf"
  "${on_node[@]}" ${on_node:+node1} slurmctld -f "$SLURM_CONF" -i || { cat "$dir/log/slurmctld.log" >&2; return 1; }
  local pid
  pid=$(pid_from "$dir/slurmctld.pid") || return 1
  SLURM_CLUSTER_PIDS+=("$pid")
  echo "${SLURM_CLUSTER_PIDS[@]}" >"$dir/pids"
  local i names=("$host")
  ((n_nodes > 0)) && names=($(seq -f 'node%g' 1 "$n_nodes"))
  for name in "${names[@]}"; do
    mkdir -p "$dir/spool/$name" "$dir/nodes/$name"
    if ((n_nodes > 0)); then
      "${on_node[@]}" "$name" unshare --mount --propagation private sh -c \
        "mount --bind '$dir/nodes/$name' '$dir/node-local' && exec slurmd -f '$SLURM_CONF' -N '$name'" ||
        { cat "$dir/log/slurmd-$name.log" >&2; return 1; }
    else
      slurmd -f "$SLURM_CONF" || { cat "$dir/log/slurmd-$name.log" >&2; return 1; }
    fi
    pid=$(pid_from "$dir/slurmd-$name.pid") || return 1
    SLURM_CLUSTER_PIDS+=("$pid")
    echo "${SLURM_CLUSTER_PIDS[@]}" >"$dir/pids"
  done
  for i in $(seq 60); do
    local up
    up=$("${on_node[@]}" ${on_node:+node1} sinfo -h -N -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)')
    ((up >= ${#names[@]})) && return 0
    sleep 1
  done
  echo "slurm fixture: node never became idle" >&2
  "${on_node[@]}" ${on_node:+node1} sinfo -N -l >&2 || true
  tail -n 20 "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log >&2
  return 1
}

slurm_cluster_stop() {
  local dir=$1 pid i
  [[ -f "$dir/pids" ]] || return 0
  read -r -a SLURM_CLUSTER_PIDS <"$dir/pids"
  for pid in "${SLURM_CLUSTER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for i in $(seq 20); do
    local alive=0
    for pid in "${SLURM_CLUSTER_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.5
  done
  for pid in "${SLURM_CLUSTER_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  SLURM_CLUSTER_PIDS=()
  rm -f "$dir/pids"
}

case "${1:-}" in
  start) [[ -n "${2:-}" ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
    slurm_cluster_start "$2" "${3:-}"; rc=$?
    ((rc == 0 || rc == 77)) || slurm_cluster_stop "$2"  # a half-started cluster goes away again
    exit $rc ;;
  stop) [[ -n "${2:-}" ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
    slurm_cluster_stop "$2" ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
