// The recipe table: one row per recipe (recipe.h). Adding a recipe: its .cpp file with a factory,
// declared and listed here.
#include <fmt/format.h>

#include "core/error.h"
#include "train/recipe.h"

namespace mgbench::train {

std::unique_ptr<Recipe> make_classification_recipe();  // classification.cpp
std::unique_ptr<Recipe> make_sft_recipe();             // sft.cpp
std::unique_ptr<Recipe> make_dpo_recipe();             // dpo.cpp

namespace {

constexpr RecipeInfo kRecipes[] = {
    {"classification", "image",
     "image classification: an image model (MobileNetV2) on MNIST-format data upscaled to --image-size "
     "(Lawenda et al. 2025, sec. 3)",
     // The paper's training of MobileNetV2 (its PyTorch peer: bench/peer_image.py).
     "epochs = 20\nbatch-size = 64\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nweight-decay = 4e-5\nprecision = "
     "fp32\n",
     &make_classification_recipe},
    {"lora", "llm",
     "LoRA fine-tuning of Llama 3 on instruction data (TorchTune's lora_finetune_distributed; Lawenda et al. "
     "2025, sec. 4)",
     // TorchTune's llama3/8B_lora config and the paper's settings (batch 2, 1 epoch).
     "epochs = 1\nbatch-size = 2\noptimizer = adamw\nlr = 3e-4\nweight-decay = 0.01\nwarmup-steps = 100\n"
     "precision = bf16\nsharding = fsdp\n",
     &make_sft_recipe},
    {"qlora", "llm",
     "QLoRA: LoRA over a frozen base whose projections are NF4 (TorchTune's qlora_llama3_8b with "
     "lora_finetune_distributed)",
     // TorchTune's llama3/8B_qlora_single_device config.
     "epochs = 1\nbatch-size = 2\ngrad-accum = 8\noptimizer = adamw\nlr = 3e-4\nweight-decay = 0.01\n"
     "warmup-steps = 100\nprecision = bf16\nactivation-checkpointing = true\nquantize-base = nf4\nsharding = fsdp\n",
     &make_sft_recipe},
    {"dpo", "llm",
     "DPO preference fine-tuning of Llama 3 with LoRA, the reference the model without its adapters (TorchTune's "
     "lora_dpo_distributed)",
     // TorchTune's llama3_1/8B_lora_dpo config (its DistributedSampler seed 0, drop_last).
     "epochs = 1\nbatch-size = 4\ngrad-accum = 8\nmax-steps = 1000\noptimizer = adamw\nlr = 5e-4\n"
     "weight-decay = 0.05\nwarmup-steps = 100\nprecision = bf16\nseed = 0\ndrop-last = true\nmax-seq-len = 1024\n"
     "activation-checkpointing = true\nsharding = fsdp\n",
     &make_dpo_recipe},
    {"full", "llm",
     "full fine-tuning: every parameter, sharded over the ranks with FSDP (TorchTune's full_finetune_distributed); "
     "QAT's baseline",
     // TorchTune's llama3/8B_full config (AdamW's default weight decay, no schedule).
     "epochs = 1\nbatch-size = 2\noptimizer = adamw\nlr = 2e-5\nweight-decay = 0.01\nlr-schedule = constant\n"
     "precision = bf16\nactivation-checkpointing = true\nfinetune = full\nsharding = fsdp\n",
     &make_sft_recipe},
    {"qat", "llm",
     "quantisation-aware full fine-tuning, 8da4w fake quantisation of every linear (TorchTune's qat_distributed "
     "with Int8DynActInt4WeightQATQuantizer); `mgbench quantize` converts the result",
     // TorchTune's llama3/8B_qat_full config.
     "epochs = 1\nbatch-size = 2\noptimizer = adamw\nlr = 2e-5\nweight-decay = 0.01\nlr-schedule = constant\n"
     "precision = bf16\nactivation-checkpointing = true\nfinetune = full\nfake-quant = 8da4w\nqat-group-size = "
     "256\nsharding = fsdp\n",
     &make_sft_recipe},
    {"qat-lora", "llm",
     "LoRA with 8da4w fake quantisation of the adapted linears (TorchTune's qat_lora_finetune_distributed)",
     // TorchTune's llama3/8B_qat_lora config.
     "epochs = 1\nbatch-size = 2\ngrad-accum = 8\noptimizer = adamw\nlr = 3e-4\nweight-decay = 0.01\n"
     "warmup-steps = 100\nprecision = bf16\nfake-quant = 8da4w\nqat-group-size = 256\nsharding = fsdp\n",
     &make_sft_recipe},
};

}  // namespace

std::span<const RecipeInfo> recipes() { return kRecipes; }

std::vector<std::string> format_memory_plan(const std::vector<MemoryPlanRow>& rows) {
  if (rows.empty()) return {};
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  constexpr double kH100GiB = 80.0;
  std::vector<std::string> lines{
      "memory per rank: parameters (under fsdp the shards and the units gathered at once), gradients and optimizer "
      "states; activations not counted",
      fmt::format("{:>6} {:>9} {:>12} {:>12} {:>12} {:>12} {:>10}", "ranks", "sharding", "parameters", "gradients",
                  "optimizer", "total", "of 80 GiB")};
  for (const MemoryPlanRow& r : rows) {
    const std::int64_t total = r.parameter_bytes + r.gradient_bytes + r.optimizer_state_bytes;
    const auto gib = [kGiB](std::int64_t bytes) { return static_cast<double>(bytes) / kGiB; };
    lines.push_back(fmt::format("{:>6} {:>9} {:>8.2f} GiB {:>8.2f} GiB {:>8.2f} GiB {:>8.2f} GiB {:>8.0f} %",
                                r.world_size, r.sharded ? "fsdp" : "none", gib(r.parameter_bytes),
                                gib(r.gradient_bytes), gib(r.optimizer_state_bytes), gib(total),
                                100.0 * gib(total) / kH100GiB));
  }
  return lines;
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
