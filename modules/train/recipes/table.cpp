// The recipe table: one row per recipe (recipe.h). Adding a recipe: its .cpp file with a factory,
// declared and listed here, and its defaults in inputs/configs/recipes/<recipe>.ini.
#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "train/recipe.h"
#include "train/recipe_configs.h"  // generated from inputs/configs/recipes/*.ini (cmake/EmbedText.cmake)

namespace mgbench::train {

std::unique_ptr<Recipe> make_classification_recipe();  // classification.cpp
std::unique_ptr<Recipe> make_sft_recipe();             // sft.cpp
std::unique_ptr<Recipe> make_dpo_recipe();             // dpo.cpp

namespace {

/// The recipe's defaults: inputs/configs/recipes/<recipe>.ini as built in. A recipe without its file
/// does not compile (the throw is not a constant expression).
consteval std::string_view config_file(std::string_view recipe) {
  for (const auto& file : recipe_configs::kFiles) {
    if (file.name == recipe) return file.text;
  }
  throw "no inputs/configs/recipes/<recipe>.ini";
}

// Where each recipe's defaults come from: the first line of its file.
constexpr RecipeInfo kRecipes[] = {
    {"classification", "image",
     "image classification: an image model (MobileNetV2) on MNIST-format data upscaled to --image-size "
     "(Lawenda et al. 2025, sec. 3)",
     config_file("classification"), &make_classification_recipe},
    {"lora", "llm",
     "LoRA fine-tuning of Llama 3 on instruction data (TorchTune's lora_finetune_distributed; Lawenda et al. "
     "2025, sec. 4)",
     config_file("lora"), &make_sft_recipe},
    {"qlora", "llm",
     "QLoRA: LoRA over a frozen base whose projections are NF4 (TorchTune's qlora_llama3_8b with "
     "lora_finetune_distributed)",
     config_file("qlora"), &make_sft_recipe},
    {"dpo", "llm",
     "DPO preference fine-tuning of Llama 3 with LoRA, the reference the model without its adapters (TorchTune's "
     "lora_dpo_distributed)",
     config_file("dpo"), &make_dpo_recipe},
    {"full", "llm",
     "full fine-tuning: every parameter, sharded over the ranks with FSDP (TorchTune's full_finetune_distributed); "
     "QAT's baseline",
     config_file("full"), &make_sft_recipe},
    {"qat", "llm",
     "quantisation-aware full fine-tuning, 8da4w fake quantisation of every linear (TorchTune's qat_distributed "
     "with Int8DynActInt4WeightQATQuantizer); `mgbench quantize` converts the result",
     config_file("qat"), &make_sft_recipe},
    {"qat-lora", "llm",
     "LoRA with 8da4w fake quantisation of the adapted linears (TorchTune's qat_lora_finetune_distributed)",
     config_file("qat-lora"), &make_sft_recipe},
};

}  // namespace

std::span<const RecipeInfo> recipes() { return kRecipes; }

std::vector<std::string> format_memory_plan(const std::vector<MemoryPlanRow>& rows) {
  if (rows.empty()) return {};
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const auto gib = [](std::int64_t bytes) { return static_cast<double>(bytes) / kGiB; };
  std::vector<std::string> lines{
      "memory per rank: parameters (under fsdp the shards and the units gathered at once), gradients (under fsdp "
      "the shards and the whole ones being reduce-scattered, replicated over ranks DDP's buckets too), optimizer "
      "states and one micro-batch's activations (estimated from the shapes; '-': not estimated)",
      fmt::format("{:>6} {:>9} {:>12} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}", "ranks", "sharding", "parameters",
                  "gradients", "optimizer", "activations", "total", "of 80 GiB", "of 141")};
  for (const MemoryPlanRow& r : rows) {
    const std::string activations =
        r.activation_bytes < 0 ? std::string("-") : fmt::format("{:.2f} GiB", gib(r.activation_bytes));
    lines.push_back(fmt::format(
        "{:>6} {:>9} {:>8.2f} GiB {:>8.2f} GiB {:>8.2f} GiB {:>12} {:>8.2f} GiB {:>7.0f} % {:>7.0f} %", r.world_size,
        r.sharded ? "fsdp" : "none", gib(r.parameter_bytes), gib(r.gradient_bytes), gib(r.optimizer_state_bytes),
        activations, gib(r.total_bytes()), 100.0 * gib(r.total_bytes()) / kPlannedGpuGiB[0],
        100.0 * gib(r.total_bytes()) / kPlannedGpuGiB[1]));
  }
  for (const double memory : kPlannedGpuGiB) {
    const auto fits =
        std::find_if(rows.begin(), rows.end(), [&](const MemoryPlanRow& r) { return gib(r.total_bytes()) <= memory; });
    lines.push_back(
        fits == rows.end()
            ? fmt::format("{:.0f} GiB GPUs: no planned rank count fits (plan more ranks: --ranks)", memory)
            : fmt::format("{:.0f} GiB GPUs: fits from {} rank(s) of those planned", memory, fits->world_size));
  }
  return lines;
}

std::int64_t gradient_bytes_per_rank(const axes::ParallelPlan& plan, bool gradient_as_bucket_view,
                                     std::int64_t trained_bytes, std::int64_t whole_gradient_peak_bytes) {
  if (plan.fully_sharded()) return trained_bytes + whole_gradient_peak_bytes;
  return plan.replicated() && !gradient_as_bucket_view ? 2 * trained_bytes : trained_bytes;
}

std::optional<int> fewest_ranks_that_fit(const std::function<MemoryPlanRow(int world)>& plan_at, int from,
                                         double memory_bytes) {
  constexpr int kMostRanks = 4096;
  for (int world = std::max(1, from); world <= kMostRanks; world *= 2) {
    if (static_cast<double>(plan_at(world).total_bytes()) <= memory_bytes) return world;
  }
  return std::nullopt;
}

const RecipeInfo& find_recipe(std::string_view task, std::string_view name) {
  std::vector<std::string_view> names;
  for (const auto& r : kRecipes) {
    if (r.task != task) continue;
    if (name.empty() || r.name == name) return r;
    names.push_back(r.name);
  }
  MGBENCH_REQUIRE(!names.empty(), ConfigError, "no recipe for `mgbench {}`", task);
  throw ConfigError(
      fmt::format("--recipe '{}': expected {} (the recipes of mgbench {})", name, options::join_names(names), task));
}

}  // namespace mgbench::train
