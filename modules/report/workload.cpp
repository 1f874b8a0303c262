#include "report/workload.h"

#include <fmt/format.h>

#include "report/report.h"
#include "report/run_cells.h"
#include "workload_identity.h"

namespace mgbench::report {

std::span<const std::string_view> workload_attributes() { return generated::kWorkloadAttributes; }

std::string workload_value(const results::RunRecord& run, std::string_view attribute) {
  if (attribute == "recipe") return recipe_of(run);
  return run.display(std::string(attribute));
}

std::string workload_identity(const results::RunRecord& run, const std::map<std::string, std::string>& overrides) {
  std::string out;
  for (const std::string_view name : workload_attributes()) {
    const auto over = overrides.find(std::string(name));
    out += fmt::format("{}{}={}", out.empty() ? "" : ";", name,
                       over != overrides.end() ? over->second : workload_value(run, name));
  }
  return out;
}

std::vector<WorkloadDifference> workload_differences(const results::RunRecord& a, const results::RunRecord& b,
                                                     const std::map<std::string, std::string>& overrides) {
  std::vector<WorkloadDifference> out;
  for (const std::string_view name : workload_attributes()) {
    const auto over = overrides.find(std::string(name));
    std::string va = over != overrides.end() ? over->second : workload_value(a, name);
    std::string vb = workload_value(b, name);
    if (va != vb) out.push_back({std::string(name), std::move(va), std::move(vb)});
  }
  return out;
}

std::string describe(const std::vector<WorkloadDifference>& differences, std::size_t limit) {
  std::string out;
  for (std::size_t i = 0; i < differences.size() && i < limit; ++i) {
    const auto& d = differences[i];
    out += fmt::format("{}{} '{}' vs '{}'", i == 0 ? "" : ", ", d.attribute, d.a, d.b);
  }
  if (differences.size() > limit) out += ", ...";
  return out;
}

std::string hardware(const results::RunRecord& run) {
  const std::string gpu = run.display("gpu_model");
  if (!gpu.empty()) return gpu;
  const std::string device = run.display("device");
  return !device.empty() ? device : "-";
}

std::string hardware_cell(const results::RunRecord& run) {
  std::string cell = hardware(run);
  cell = cell.substr(0, cell.find(", "));  // the model; its memory and compute capability are in the CSV
  constexpr std::string_view kVendor = "NVIDIA ";
  if (cell.starts_with(kVendor)) cell.erase(0, kVendor.size());
  for (char& c : cell) {
    if (c == ' ' || c == '\t') c = '-';
  }
  return cell;
}

std::string baseline_note(const results::RunRecord& run, const std::vector<results::RunRecord>& runs) {
  if (!is_completed(run) || run.integer("world_size").value_or(1) <= 1) return {};
  const results::RunRecord* nearest = nullptr;
  std::vector<WorkloadDifference> nearest_differences;
  for (const auto& other : runs) {
    if (!is_completed(other) || other.integer("world_size") != 1 || other.display("task") != run.display("task")) {
      continue;
    }
    auto differences = workload_differences(run, other);
    // An LLM run's efficiency also times the same steps (llm_tables.cpp): a 1-rank run that left out
    // another warm-up is no baseline of it, and the note says so.
    if (is_llm_run(run) && warmup_steps_excluded(run) != warmup_steps_excluded(other)) {
      differences.push_back({"warmup_steps_excluded", std::to_string(warmup_steps_excluded(run)),
                             std::to_string(warmup_steps_excluded(other))});
    }
    if (differences.empty()) return {};
    if (nearest == nullptr || differences.size() <= nearest_differences.size()) {
      nearest = &other;
      nearest_differences = std::move(differences);
    }
  }
  if (nearest == nullptr) return {};
  return fmt::format("{}: no 1-rank run of this workload on {}; the nearest, {}, differs in {}", run.run_id,
                     hardware(run), nearest->run_id, describe(nearest_differences));
}

}  // namespace mgbench::report
