#include "session/platform.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/device.h"

namespace mgbench::session {
namespace {

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string interconnect_devices() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

}  // namespace

std::string cpu_model_of(const std::string& cpuinfo) {
  std::istringstream in(cpuinfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "" : line.substr(first);
  }
  return "";
}

h5::Attributes platform_attributes(const std::string& hosts) {
  std::ifstream file("/proc/cpuinfo");
  std::stringstream cpuinfo;
  cpuinfo << file.rdbuf();
  const auto nodes = hosts.empty() ? 0 : 1 + std::count(hosts.begin(), hosts.end(), ',');
  const int gpus = runtime::visible_cuda_devices();
  // SLURM_TASKS_PER_NODE is set for every allocation ("2(x3)"); SLURM_NTASKS_PER_NODE only with the option.
  const std::string tasks_per_node =
      !env_text("SLURM_NTASKS_PER_NODE").empty() ? env_text("SLURM_NTASKS_PER_NODE") : env_text("SLURM_TASKS_PER_NODE");
  return {{"slurm_job_id", env_text("SLURM_JOB_ID")},
          {"slurm_partition", env_text("SLURM_JOB_PARTITION")},
          {"slurm_cluster", env_text("SLURM_CLUSTER_NAME")},
          {"slurm_nodelist", env_text("SLURM_JOB_NODELIST")},
          {"slurm_nnodes", env_text("SLURM_JOB_NUM_NODES")},
          {"slurm_tasks_per_node", tasks_per_node},
          {"slurm_cpus_per_task", env_text("SLURM_CPUS_PER_TASK")},
          {"slurm_gpus_per_task", env_text("SLURM_GPUS_PER_TASK")},
          {"nodes", static_cast<std::int64_t>(nodes)},
          {"cpu_model", cpu_model_of(cpuinfo.str())},
          {"cpu_cores", static_cast<std::int64_t>(runtime::machine_cores())},
          {"gpus_per_node", static_cast<std::int64_t>(gpus)},
          {"gpu_model", gpus > 0 ? runtime::cuda_device_description(0) : std::string()},
          {"interconnect", interconnect_devices()}};
}

}  // namespace mgbench::session
