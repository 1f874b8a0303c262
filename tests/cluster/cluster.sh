#!/usr/bin/env bash
# A simulated cluster for tests: N network namespaces as nodes, each with its own host name (a UTS
# namespace), loopback and one address on a shared bridge; the bridge lives in a namespace of its
# own (the "switch"), so nothing is added to the host's network. Open MPI reaches a node through an
# rsh agent that enters its namespaces; the file system is shared, as a parallel file system would be.
#
#   tests/cluster/cluster.sh start DIR [N]   # N nodes (default 2): node1..nodeN at 10.77.0.1..N
#                                            # exit 77 (skip) with "SKIPPED: reason" on stderr when it
#                                            # cannot run (not root, no ip / nsenter / unshare)
#   tests/cluster/cluster.sh stop DIR        # removes what start made (names in DIR/state)
#   DIR/run NODE CMD...                      # runs CMD on a node (inside its namespaces)
#   DIR/rsh                                  # Open MPI's plm_rsh_agent: rsh HOST CMD...
#   DIR/hostfile                             # the nodes' addresses, one slot each (edit slots= as needed)
#   DIR/mpirun ARGS...                       # mpirun on node1 over the nodes' network (TCP), the agent
#                                            # and the addresses set: DIR/mpirun -np 2 --hostfile ...
# Names: namespaces mgbc<id>-node<i> and mgbc<id>-switch, <id> from DIR's path, so that two clusters
# (two test runs) do not meet.
set -uo pipefail

skip() {
  echo "SKIPPED: $*" >&2
  exit 77
}

cluster_id() { printf '%s' "$(cd "$1" && pwd)" | cksum | cut -c1-6; }

start() {
  local dir=$1 n=${2:-2}
  [[ $(id -u) -eq 0 ]] || skip "a simulated cluster needs root (network and UTS namespaces)"
  for b in ip nsenter unshare mount; do command -v "$b" >/dev/null || skip "$b not installed"; done
  mkdir -p "$dir/uts"
  dir=$(cd "$dir" && pwd)
  local id
  id=$(cluster_id "$dir")
  local switch="mgbc$id-switch"
  echo "switch=$switch" >"$dir/state"
  ip netns add "$switch" || { echo "cluster: cannot create network namespaces" >&2; exit 1; }
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  ip -n "$switch" link set lo up
  # The UTS namespaces are kept by bind mounts on files in DIR/uts (a private mount of its own).
  mount --bind "$dir/uts" "$dir/uts" && mount --make-private "$dir/uts" || { stop "$dir"; exit 1; }
  echo "uts_mount=$dir/uts" >>"$dir/state"
  : >"$dir/hostfile"
  local i
  for ((i = 1; i <= n; ++i)); do
    local ns="mgbc$id-node$i" veth="mgbc$id-v$i"
    ip netns add "$ns" && echo "node=$ns" >>"$dir/state"
    ip -n "$ns" link set lo up
    ip link add "$veth" netns "$switch" type veth peer name eth0 netns "$ns"
    ip -n "$switch" link set "$veth" master br0 up
    ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    touch "$dir/uts/node$i"
    unshare --uts="$dir/uts/node$i" hostname "node$i" || { stop "$dir"; exit 1; }
    echo "10.77.0.$i slots=1" >>"$dir/hostfile"
  done
  cat >"$dir/run" <<RUN
#!/usr/bin/env bash
# run NODE CMD...: NODE is node<i> or its address 10.77.0.<i>.
node=\$1; shift
case \$node in 10.77.0.*) node=node\${node##*.} ;; esac
exec nsenter --net=/run/netns/mgbc$id-\$node --uts=$dir/uts/\$node -- "\$@"
RUN
  cat >"$dir/rsh" <<RSH
#!/usr/bin/env bash
# Open MPI's plm_rsh_agent: rsh [options] HOST CMD... (options, such as -x, ignored).
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
exec "$dir/run" "\$host" /bin/sh -c "\$*"
RSH
  cat >"$dir/mpirun" <<MPIRUN
#!/usr/bin/env bash
# mpirun on node1, its daemons on the other nodes through DIR/rsh, over the nodes' network only.
exec "$dir/run" node1 mpirun --mca plm_rsh_agent "$dir/rsh" --mca btl tcp,self \\
  --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "\$@"
MPIRUN
  chmod +x "$dir/run" "$dir/rsh" "$dir/mpirun"
  # The nodes answer each other.
  "$dir/run" node1 ping -c 1 -W 2 "10.77.0.$n" >/dev/null 2>&1 || command -v ping >/dev/null ||
    true  # ping may be absent; mpirun itself is the test
}

stop() {
  local dir=$1
  [[ -f "$dir/state" ]] || return 0
  local line
  while read -r line; do
    case $line in
      node=*) ip netns del "${line#node=}" 2>/dev/null ;;
    esac
  done <"$dir/state"
  while read -r line; do
    case $line in
      switch=*) ip netns del "${line#switch=}" 2>/dev/null ;;
      uts_mount=*)
        local f
        for f in "${line#uts_mount=}"/*; do umount "$f" 2>/dev/null; done
        umount "${line#uts_mount=}" 2>/dev/null
        ;;
    esac
  done <"$dir/state"
  rm -f "$dir/state"
}

case ${1:-} in
  start) start "$2" "${3:-2}" ;;
  stop) stop "$2" ;;
  *)
    echo "usage: $0 start DIR [N] | stop DIR" >&2
    exit 2
    ;;
esac
