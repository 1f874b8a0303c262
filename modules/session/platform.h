#pragma once
// The platform a run ran on, as run attributes (docs/results-schema.md, "Platform"): what a centre
// needs to compare one machine's results with another's -- the SLURM allocation (partition,
// cluster, node list, nodes, tasks per node, CPUs and GPUs per task, from the environment SLURM
// sets), the CPU model and cores, the GPUs of a node (model, memory, count) and the interconnect
// devices present. Read on the calling rank's node (rank 0's for the run attributes).
#include <string>

#include "results/hdf5.h"

namespace mgbench::session {

/// The platform attributes: slurm_job_id, slurm_partition, slurm_cluster, slurm_nodelist, slurm_nnodes,
/// slurm_tasks_per_node, slurm_cpus_per_task, slurm_gpus_per_task ("" outside SLURM or where it did
/// not set them), nodes (the distinct hosts of `hosts`, a comma-separated list), cpu_model
/// (/proc/cpuinfo's first "model name"; "" where absent), cpu_cores (the machine's), gpus_per_node
/// (CUDA devices visible to this process), gpu_model ("NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90", the
/// first visible device; "" without one), interconnect (the RDMA devices of
/// /sys/class/infiniband, comma-separated: mlx5_0, efa_0, ...; "" without any).
h5::Attributes platform_attributes(const std::string& hosts);

/// The first "model name" of a /proc/cpuinfo text; "" where there is none.
std::string cpu_model_of(const std::string& cpuinfo);

}  // namespace mgbench::session
