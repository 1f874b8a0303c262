# Shared by the sbatch scripts of slurm/ (sourced from $SLURM_SUBMIT_DIR/slurm/common.sh, or from
# $MGBENCH_SHARE/slurm/common.sh where the mgbench module is loaded): checks,
# the launch of one MPI rank per task, signal forwarding and requeue on preemption.
#
# Environment (all optional):
#   MGBENCH           the binary (default: the loaded mgbench module's, $MGBENCH_ROOT/bin/mgbench; else
#                     build/app/mgbench, relative to the submit directory)
#   MGBENCH_OUTPUTS   where each job writes <job id>/results.h5 and <job id>/checkpoints (default outputs)
#   MGBENCH_JOB_DIR   this job's directory instead of $MGBENCH_OUTPUTS/<job id>: another job's, to continue
#                     its run -- with other nodes or tasks where it was given --global-batch-size
#                     (sbatch --nodes=2 --export=ALL,MGBENCH_JOB_DIR=outputs/1234 slurm/llm.sbatch ...)
#   MGBENCH_LAUNCHER  srun (default: srun --mpi=pmix) | mpirun (Open MPI's mpirun inside the allocation)
#   MGBENCH_NSYS      non-empty: wrap every rank in `nsys profile` (slurm/profile.sbatch sets it)
#   MGBENCH_REQUEUE   1 (default): requeue the job when mgbench stopped on a signal (exit 75) so that it
#                     resumes from its checkpoint; 0: just end
# GPUs: the scripts ask for `--gpus-per-node` (as many as --ntasks-per-node), so that every rank sees
# all of its node's GPUs and picks its own by local rank: NCCL finds NVLink / peer-to-peer paths only
# between GPUs a process can see (NVIDIA/nccl#1066). Per-task allocation (`--gpus-per-node=0
# --gpus-per-task=1`) still runs, but where the site confines each task to its device every rank
# sees one GPU and NCCL falls back to slower paths: mgbench warns at start and records it.
# Several nodes: `sbatch --nodes=N` (tested on a simulated 2-node cluster, docs/cluster.md).
# Preemption: the scripts ask for `--signal=B:USR1@120`, so SLURM signals this batch shell two minutes
# before the time limit; the trap below forwards SIGUSR1 (and a SIGTERM as SIGUSR1) to the launcher,
# which passes it to every rank; mgbench stops at the next step, checkpoints, marks the run preempted
# and exits 75; the job is requeued (same job id, same outputs directory) and the next start
# continues with --resume.

mgbench_fail() {
  echo "${MGBENCH_SCRIPT:-slurm}: $*" >&2
  exit 2
}

# The binary: MGBENCH, else the loaded module's, else build/app/mgbench (relative to the checkout).
mgbench_binary() {
  if [[ -n ${MGBENCH:-} ]]; then echo "$MGBENCH"
  elif [[ -n ${MGBENCH_ROOT:-} ]]; then echo "$MGBENCH_ROOT/bin/mgbench"
  else echo build/app/mgbench
  fi
}

mgbench_setup() {
  MGBENCH=$(mgbench_binary)
  [[ -x "$MGBENCH" ]] || mgbench_fail "mgbench binary '$MGBENCH' not found or not executable (build it, or set MGBENCH)"
  MGBENCH_JOB_DIR=${MGBENCH_JOB_DIR:-${MGBENCH_OUTPUTS:-outputs}/${SLURM_JOB_ID}}
  mkdir -p "$MGBENCH_JOB_DIR" || mgbench_fail "cannot create '$MGBENCH_JOB_DIR'"
  # One OpenMP / intra-op thread per allocated core of the task.
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
  # NCCL (GPU runs), as documented lines: uncomment what the cluster needs.
  # export NCCL_DEBUG=WARN                # NCCL's own diagnostics
  # export NCCL_IB_HCA=mlx5               # the InfiniBand adapters to use across nodes
  # export NCCL_SOCKET_IFNAME=ib0         # bootstrap network interface
  # export NCCL_P2P_LEVEL=NVL             # restrict peer-to-peer to NVLink
  # (hung collectives: mgbench's own watchdog aborts the job after --comm-timeout seconds)
  # Fewer GPUs per node than ranks would put two ranks on one GPU (NCCL refuses): say so before
  # launching; more leave GPUs idle. The ranks of the busiest node from SLURM_TASKS_PER_NODE
  # ("2(x3),1": what SLURM placed, with or without --ntasks-per-node). An allocation without
  # --gpus-per-node (salloc -n 2) sets no SLURM_GPUS_PER_NODE: nothing to check.
  local gpus=${SLURM_GPUS_PER_NODE:-} ranks=0 part count tasks=${SLURM_TASKS_PER_NODE:-}
  gpus=${gpus##*:}
  for part in ${tasks//,/ }; do
    count=${part%%(*}
    [[ $count =~ ^[0-9]+$ ]] && ((count > ranks)) && ranks=$count
  done
  if [[ $gpus =~ ^[0-9]+$ ]] && ((gpus > 0 && ranks > 0)); then
    ((gpus >= ranks)) || mgbench_fail "$ranks rank(s) on a node (SLURM_TASKS_PER_NODE=$tasks) but --gpus-per-node=$gpus: one rank per GPU (pass --gpus-per-node=$ranks, or fewer tasks per node)"
    ((gpus == ranks)) || echo "# note: --gpus-per-node=$gpus for $ranks rank(s) per node: $((gpus - ranks)) GPU(s) per node idle"
  fi
  echo "# job $SLURM_JOB_ID on $(hostname): ${SLURM_NTASKS:-?} task(s) on ${SLURM_JOB_NUM_NODES:-1} node(s), restart ${SLURM_RESTART_COUNT:-0}, outputs $MGBENCH_JOB_DIR"
}

# mgbench_run ARGS...: runs "$MGBENCH" ARGS... as one rank per task; returns its exit status.
mgbench_run() {
  local launcher
  if [[ "${MGBENCH_LAUNCHER:-srun}" == mpirun ]]; then
    # Open MPI reads the allocation from SLURM; one rank per task, bound to its cores. A node lost
    # while its daemon's connection is idle is noticed within ~90 s (oob TCP keepalive: 60 s idle, 3
    # probes 10 s apart; Open MPI's default waits 300 s + 9 x 20 s); mgbench's own watchdog ends every
    # rank within --comm-timeout + 18 s, and the aborting rank's launcher guard ends an mpirun still
    # waiting for a lost daemon 15 s later (docs/cluster.md).
    export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-60}
    export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-10}
    export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}
    launcher=(mpirun --map-by "ppr:${SLURM_NTASKS_PER_NODE:-1}:node:PE=${SLURM_CPUS_PER_TASK:-1}" --bind-to core)
  else
    # A rank's MPI_Abort reaches srun through PMIx and ends the step on every node; srun gives up on
    # an unreachable node after KillWait (docs/cluster.md). Since SLURM 22.05 srun no longer inherits
    # sbatch's --cpus-per-task: without it again each rank would be bound to one core (and mgbench,
    # which sizes its thread pool from the rank's CPU affinity, would run one thread).
    launcher=(srun --mpi=pmix --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" --cpu-bind=cores)
  fi
  local wrapper=()
  if [[ -n "${MGBENCH_NSYS:-}" ]]; then
    command -v nsys >/dev/null || mgbench_fail "MGBENCH_NSYS is set but nsys is not on PATH (module load nsight-systems?)"
    mkdir -p "$MGBENCH_JOB_DIR/nsys"
    # One report per rank, named by the launcher's rank variable: ranks that mpirun starts inherit the
    # batch step's SLURM_PROCID (0 on every rank), so under mpirun it is OMPI_COMM_WORLD_RANK.
    # NVTX ranges come from mgbench --nvtx true.
    local rank_variable=SLURM_PROCID
    [[ "${MGBENCH_LAUNCHER:-srun}" == mpirun ]] && rank_variable=OMPI_COMM_WORLD_RANK
    wrapper=(nsys profile --trace=cuda,nvtx,mpi,osrt --cuda-memory-usage=true --sample=none --force-overwrite=true
      --output="$MGBENCH_JOB_DIR/nsys/rank%q{$rank_variable}")
  fi
  local pid rc
  # Both launchers answer a SIGTERM of their own by ending the job: srun "forcing job termination"
  # SIGKILLs the tasks, Open MPI's mpirun kills the job (exit 1): no checkpoint, no requeue. So the
  # launcher runs in a session of its own (setsid: this non-interactive shell's background child is
  # no process group leader, so setsid execs it, $! is the launcher), out of reach of a signal SLURM
  # sends to the batch step's processes (its time limit, preemption, `scancel --full`), and the
  # traps below hand it SIGUSR1 instead, which both pass to every rank and mgbench takes as the same
  # request as SIGTERM (checkpoint, stop, exit 75). The ranks' own step may be signalled too: each
  # rank takes the first signal as the request (runtime/stop_request.h).
  setsid "${launcher[@]}" "${wrapper[@]}" "$MGBENCH" "$@" &
  pid=$!
  trap 'echo "# SIGUSR1: asking mgbench to checkpoint and stop"; kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'echo "# SIGTERM: asking mgbench to checkpoint and stop (as SIGUSR1)"; kill -USR1 "$pid" 2>/dev/null || true' TERM
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break  # wait returned because of a trapped signal: wait again
  done
  trap - USR1 TERM
  if [[ $rc -eq 75 && "${MGBENCH_REQUEUE:-1}" == 1 ]]; then
    echo "# mgbench stopped on a signal (exit 75): requeueing job $SLURM_JOB_ID to resume from its checkpoint"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$rc"
}
