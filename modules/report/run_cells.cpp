#include "report/run_cells.h"

#include <fmt/format.h>

namespace mgbench::report {

std::string percent(const std::optional<double>& v) { return v ? fmt::format("{:.2f}", *v * 100.0) : "-"; }

double peak_memory_mib(const results::RunRecord& r) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return r.summary.peak_memory_bytes >= 0 ? static_cast<double>(r.summary.peak_memory_bytes) / kMiB : results::kNaN;
}

double ops_per_layer_step(const results::RunRecord& r) {
  const auto layers = r.integer("decoder_layers");
  if (r.summary.ops_per_step < 0 || !layers || *layers <= 0) return results::kNaN;
  return static_cast<double>(r.summary.ops_per_step) / static_cast<double>(*layers);
}

std::string short_model(const results::RunRecord& r) {
  std::string model = r.display("model");
  return model.size() > 16 ? "..." + model.substr(model.size() - 13) : model;
}

std::string batch_x_accum(const results::RunRecord& r) {
  return fmt::format("{}x{}", r.display("batch_size"), r.display("grad_accum"));
}

std::int64_t resumes(const results::RunRecord& r) { return r.integer("resumes").value_or(0); }

std::int64_t warmup_steps_excluded(const results::RunRecord& r) {
  return r.integer("warmup_steps_excluded").value_or(0);
}

void print_notes(std::ostream& out, const results::RunRecord& r) {
  if ((r.status == results::kStatusFailed || r.status == results::kStatusAborted) && !r.error.empty()) {
    out << fmt::format("# {} {}: {}\n", r.run_id, r.status, r.error);
  } else if (r.status == "preempted" && !r.continued_by.empty()) {
    out << fmt::format("# {} preempted: continued by run {} at another number of ranks\n", r.run_id, r.continued_by);
  } else if (r.status == "preempted") {
    out << fmt::format("# {} preempted: it continues with the same options plus --resume --checkpoint-dir\n", r.run_id);
  }
  if (const auto continued = r.text("continues_run")) {
    out << fmt::format(
        "# {} continues run {} (its {} rank(s) stopped at global step {}) at {} rank(s), the same steps: its records "
        "hold its own steps\n",
        r.run_id, *continued, r.display("continues_world_size"), r.display("continues_global_step"),
        r.display("world_size"));
  }
  if (resumes(r) > 0) {
    out << fmt::format(
        "# {} resumed {} time(s) from a checkpoint: its times leave out the time away and the "
        "checkpoint writing, and include each restart's warm-up\n",
        r.run_id, resumes(r));
  }
  if (r.summary.checkpoint_s > 0) {  // NaN before schema 14
    out << fmt::format("# {} wrote checkpoints for {:.3g} s at step boundaries, left out of its times\n", r.run_id,
                       r.summary.checkpoint_s);
  }
}

}  // namespace mgbench::report
