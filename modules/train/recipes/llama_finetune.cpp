#include "train/recipes/llama_finetune.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "models/json_file.h"
#include "models/llama_checkpoint.h"
#include "models/log_probs.h"
#include "models/safetensors.h"
#include "runtime/device.h"
#include "runtime/scalar_type.h"
#include "train/optim/optimizer.h"
#include "train/parallel/fsdp.h"
#include "train/parallel/unit_sharder.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

void LlamaFinetune::declare(options::OptionTable& t) {
  static constexpr options::Choice<Init> kInits[] = {
      {"checkpoint", Init::kCheckpoint, "the weights of the --model checkpoint directory"},
      {"random", Init::kRandom, "random weights (benchmarks of a preset's shapes without its weights)"},
  };
  static constexpr options::Choice<models::BaseWeights> kBases[] = {
      {"none", models::BaseWeights::kDense, "the base weights in the run's dtype"},
      {"nf4", models::BaseWeights::kNf4,
       "the decoder layers' projections in NF4 (QLoRA; torchao's to_nf4, ~4.13 bits per parameter)"},
  };
  static constexpr options::Choice<Finetune> kFinetunes[] = {
      {"lora", Finetune::kLora, "LoRA adapters, the base frozen"},
      {"full", Finetune::kFull, "every parameter (AdamW states for all of them: 8 bytes per parameter in bf16)"},
  };
  static constexpr options::Choice<FakeQuant> kFakeQuants[] = {
      {"none", FakeQuant::kNone, "no fake quantisation"},
      {"8da4w", FakeQuant::k8da4w,
       "int8 dynamic per-token activations and int4 per-group weights (torchao's Int8DynActInt4WeightQATQuantizer)"},
  };
  t.section("Model");
  t.add("model", model_name_,
        "preset (" + models::llama_preset_names() +
            ") or a Hugging Face checkpoint directory (config.json + model.safetensors or "
            "model.safetensors.index.json)");
  t.add("init", init_, std::span<const options::Choice<Init>>(kInits), "the base model's weights").same_workload();
  t.add("tokenizer", tokenizer_path_,
        "Llama 3 tokenizer.model (default: <model>/original/tokenizer.model or <model>/tokenizer.model)")
      .same_workload();
  t.add("activation-checkpointing", activation_checkpointing_,
        "recompute each decoder layer in backward instead of keeping its activations");
  t.add("quantize-base", base_, std::span<const options::Choice<models::BaseWeights>>(kBases),
        "how the frozen base holds its q/k/v/o and MLP projections (embeddings, norms and the output head stay in "
        "the run's dtype)");
  t.add("finetune", finetune_, std::span<const options::Choice<Finetune>>(kFinetunes), "what is trained");
  t.add("output-dir", output_dir_,
        "write what was trained here: the adapters (PEFT format) or, with --finetune full, the model (Hugging Face "
        "format); empty: nothing")
      .no_effect();
  t.section("LoRA");
  const auto lora = [this] { return finetune_ == Finetune::kLora; };
  const std::string with_lora = "--finetune lora";
  t.add("lora-rank", lora_.rank, "LoRA rank").at_least(1).only_with(lora, with_lora);
  t.add("lora-alpha", lora_.alpha, "LoRA alpha (the adapter is scaled by alpha / rank)")
      .above(0)
      .only_with(lora, with_lora);
  t.add("lora-dropout", lora_.dropout, "dropout before LoRA's A")
      .at_least(0)
      .below(1)
      .same_workload()
      .only_with(lora, with_lora);
  t.add("lora-targets", lora_.targets,
        "comma-separated: q_proj, k_proj, v_proj, output_proj, mlp (or gate_proj, up_proj, down_proj)")
      .only_with(lora, with_lora);
  t.section("QAT");
  t.add("fake-quant", fake_quant_, std::span<const options::Choice<FakeQuant>>(kFakeQuants),
        "fake quantisation while training: with --finetune full every linear whose in-features the group divides "
        "(the untied output head too), with lora the adapted ones");
  const auto fake_quant = [this] { return fake_quant_ != FakeQuant::kNone; };
  const std::string with_fake_quant = "--fake-quant 8da4w";
  t.add("qat-group-size", qat_group_size_, "in-features per int4 weight scale")
      .at_least(2)
      .only_with(fake_quant, with_fake_quant);
  t.add("fake-quant-after-steps", fake_quant_after_steps_,
        "train the first N optimizer steps without fake quantisation (0: from the start)")
      .at_least(0)
      .only_with(fake_quant, with_fake_quant);
}

void LlamaFinetune::validate(const TrainOptions& train, std::string_view recipe, bool needs_adapters) const {
  MGBENCH_REQUIRE(!model_name_.empty(), ConfigError, "--model: expected a preset name or a checkpoint directory");
  // fp64 is a reference for tests and numerics studies (TorchTune offers bf16 and fp32).
  MGBENCH_REQUIRE(train.precision == axes::Precision::kBf16 || train.precision == axes::Precision::kFp32 ||
                      train.precision == axes::Precision::kFp64,
                  ConfigError,
                  "--precision '{}': expected bf16, fp32 or fp64 (the {} recipe keeps the whole model in that dtype, "
                  "as TorchTune)",
                  axes::precision_info(train.precision).name, recipe);
  MGBENCH_REQUIRE(base_ == models::BaseWeights::kDense || train.precision != axes::Precision::kFp64, ConfigError,
                  "--quantize-base nf4 with --precision fp64: expected bf16 or fp32 (torchao's NF4 dequantises to "
                  "bf16, fp16 or fp32)");
  MGBENCH_REQUIRE(!axes::strategy_info(train.strategy).single_process, ConfigError,
                  "--strategy '{}': expected ddp, ddp-rr or ddp-ds (the {} recipe runs one rank per GPU)",
                  axes::strategy_info(train.strategy).name, recipe);
  MGBENCH_REQUIRE(finetune_ == Finetune::kLora || !needs_adapters, ConfigError,
                  "--finetune full: the {} recipe needs --finetune lora (its reference model is the model without its "
                  "adapters)",
                  recipe);
  MGBENCH_REQUIRE(base_ == models::BaseWeights::kDense || finetune_ == Finetune::kLora, ConfigError,
                  "--quantize-base nf4: expected --finetune lora (QLoRA trains adapters over a frozen NF4 base)");
  MGBENCH_REQUIRE(base_ == models::BaseWeights::kDense || fake_quant_ == FakeQuant::kNone, ConfigError,
                  "--quantize-base nf4 with --fake-quant {}: expected one of them (QAT fake-quantises dense weights)",
                  fake_quant_ == FakeQuant::k8da4w ? "8da4w" : "none");
  if (finetune_ == Finetune::kLora) {
    MGBENCH_REQUIRE(!lora_.targets.empty(), ConfigError, "--lora-targets: expected at least one target");
    lora_.hf_targets();  // names an unknown target
  }
}

models::LlamaConfig LlamaFinetune::read_config() const {
  return fs::is_directory(model_name_)
             ? models::LlamaConfig::from_hf_json((fs::path(model_name_) / "config.json").string())
             : models::LlamaConfig::preset(model_name_);
}

void LlamaFinetune::load_tokenizer() {
  const bool is_dir = fs::is_directory(model_name_);
  // The model first: a name that is neither a directory nor a preset is the error to report.
  config_ = read_config();
  MGBENCH_REQUIRE(is_dir || init_ == Init::kRandom, ConfigError,
                  "--model {} is a preset (shapes, no weights): use --init random, or --model <checkpoint dir>",
                  model_name_);
  // Given, or the checkpoint's (Meta ships original/tokenizer.model).
  std::string path = tokenizer_path_;
  if (path.empty() && is_dir) {
    for (const char* rel : {"original/tokenizer.model", "tokenizer.model"}) {
      if (fs::exists(fs::path(model_name_) / rel)) {
        path = (fs::path(model_name_) / rel).string();
        break;
      }
    }
  }
  MGBENCH_REQUIRE(!path.empty(), ConfigError,
                  "--tokenizer: expected the Llama 3 tokenizer.model (the checkpoint '{}' has none)", model_name_);
  tokenizer_ = std::make_unique<text::Llama3Tokenizer>(path);
  tokenizer_file_ = path;
  MGBENCH_REQUIRE(tokenizer_->vocab_size() <= config_->vocab_size, DataError,
                  "tokenizer '{}' has {} tokens but the model's vocabulary is {}: not a Llama 3 model?", path,
                  tokenizer_->vocab_size(), config_->vocab_size);
}

std::string LlamaFinetune::special_tokens_warning() const {
  // A file smaller than Meta's puts the 256 special tokens after its last rank (TorchTune's small
  // test tokenizer and models of its size). Against trained weights of another vocabulary they are
  // ids the model learned as other tokens; against random weights (a benchmark's checkpoint shaped
  // like Llama 3) they are harmless: which one a checkpoint holds cannot be told, so a warning.
  const std::int32_t ranks = tokenizer_->bpe().base_vocab_size();
  if (init_ == Init::kRandom || ranks >= text::Llama3Tokenizer::kBaseVocab ||
      tokenizer_->vocab_size() == config_->vocab_size) {
    return "";
  }
  return fmt::format(
      "tokenizer '{}' has {} ranks, so its special tokens take ids {}-{}, but the checkpoint '{}' has a vocabulary "
      "of {}: if its weights were trained, <|begin_of_text|> and <|eot_id|> are tokens it learned as others (a "
      "tokenizer.model cut short? Meta's has {} ranks)",
      tokenizer_file_, ranks, ranks, tokenizer_->vocab_size() - 1, model_name_, config_->vocab_size,
      text::Llama3Tokenizer::kBaseVocab);
}

models::LlamaForCausalLM build_llama(const models::LlamaConfig& config, models::BaseWeights base, torch::Device device,
                                     const std::string& checkpoint, UnitSharder* sharder) {
  if (sharder == nullptr) {
    models::LlamaForCausalLM model(config, base, device, models::LlamaBodyImpl::Place(),
                                   /*draw=*/checkpoint.empty());
    if (!checkpoint.empty()) model->load_hf_checkpoint(checkpoint);  // every tensor whole, one at a time
    return model;
  }
  std::optional<models::LlamaCheckpointReader> reader;
  if (!checkpoint.empty()) reader.emplace(checkpoint, config.tie_word_embeddings);
  const RowSource rows = [&](const std::string& name, c10::IntArrayRef sizes, std::int64_t first_row,
                             const torch::Tensor& out) { reader->read_rows(name, sizes, first_row, out); };
  // Loaded: nothing drawn (every weight is read); random: drawn whole, then cut.
  models::LlamaForCausalLM model(
      config, base, device,
      [&](const std::string& name, torch::nn::Module& part) {
        if (reader) reader->load_nf4(name, part, device);
        sharder->shard(models::LlamaForCausalLMImpl::part_unit(name, part), reader ? &rows : nullptr);
      },
      /*draw=*/!reader);
  if (reader) reader->finish();
  return model;
}

void LlamaFinetune::build(const RecipeContext& ctx) {
  refuse_if_weights_do_not_fit(ctx);
  refuse_if_plan_does_not_fit(ctx);
  {
    // Built in the run's dtype, one unit at a time, each moved to the device and drawn or read there
    // before the next exists: the host holds one decoder layer (8B, bf16: 0.44 GB; the embedding
    // 1.05 GB), not the model (16 GB); NF4 projections are quantised on the device.
    const caffe2::TypeMeta previous = torch::get_default_dtype();
    torch::set_default_dtype(caffe2::TypeMeta::fromScalarType(runtime::scalar_type(ctx.precision.param_dtype)));
    try {
      model_ = build_llama(*config_, base_, ctx.device, init_ == Init::kCheckpoint ? model_name_ : std::string(),
                           ctx.sharder);
    } catch (...) {
      torch::set_default_dtype(previous);
      throw;
    }
    torch::set_default_dtype(previous);
  }
  if (finetune_ == Finetune::kLora) {
    trainable_ = model_->apply_lora(lora_);
  } else {
    trainable_ = model_->parameters();
    for (auto& p : trainable_) p.set_requires_grad(true);
  }
  if (fake_quant_ == FakeQuant::k8da4w) {
    std::vector<std::string> skipped;
    fake_quantized_ = model_->enable_fake_quant(qat_group_size_, finetune_ == Finetune::kLora, &skipped);
    // Nothing fake-quantised is plain fine-tuning under QAT's name, and a qat_config.json that
    // `mgbench quantize` refuses at the end (qat-lora refuses a group its linears do not take alike).
    MGBENCH_REQUIRE(!fake_quantized_.empty(), ConfigError,
                    "--qat-group-size {}: divides the in-features of none of the model's {} linears (hidden_size {}, "
                    "intermediate_size {}), so nothing would be fake-quantised: give a group size that divides them "
                    "(torchao's default 256; 32 for small models)",
                    qat_group_size_, skipped.size(), config_->hidden_size, config_->intermediate_size);
    log::info("QAT 8da4w: {} linears fake-quantised (groups of {})", fake_quantized_.size(), qat_group_size_);
    if (!skipped.empty()) {
      log::info("QAT 8da4w: {} linears left as they are ({} in-features not a multiple of {}, as torchao): {}",
                skipped.size(), skipped.size() == 1 ? "its" : "their", qat_group_size_, fmt::join(skipped, ", "));
    }
    begin_step(0);
  }
}

bool LlamaFinetune::begin_step(std::int64_t global_step) {
  if (fake_quant_ == FakeQuant::kNone) return false;
  const bool on = global_step >= fake_quant_after_steps_;
  if (fake_quant_on_ == on) return false;
  const bool first = !fake_quant_on_.has_value();  // the set-up's call: nothing captured to drop
  model_->set_fake_quant_enabled(on);
  fake_quant_on_ = on;
  return !first;
}

std::string LlamaFinetune::steps_warning(std::int64_t optimizer_steps) const {
  if (fake_quant_ == FakeQuant::kNone || fake_quant_after_steps_ < optimizer_steps) return {};
  return fmt::format(
      "--fake-quant-after-steps {}: the run has {} optimizer step(s), so it trains without fake "
      "quantisation throughout (as --fake-quant none)",
      fake_quant_after_steps_, optimizer_steps);
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaFinetune::checkpoint_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> trained;
  for (const auto& p : model_->named_parameters()) {
    if (p.value().requires_grad()) trained.emplace_back(p.key(), p.value());
  }
  return trained;
}

std::string LlamaFinetune::graph_blocker() const {
  if (activation_checkpointing_ && lora_.dropout > 0 && finetune_ == Finetune::kLora) {
    return fmt::format(
        "--lora-dropout {} under --activation-checkpointing: the recomputation replays the generator's "
        "state, which a capture cannot read (--lora-dropout 0, TorchTune's default, allows graphs)",
        lora_.dropout);
  }
  return "";
}

LlamaFinetune::TargetLogProbs LlamaFinetune::target_log_probs(const data::Batch& batch) {
  const std::optional<models::SequencePacking> packing = packing_of(batch);
  torch::Tensor hidden = model_->hidden_states(batch.tensors[0], packing ? &*packing : nullptr);  // [R, T, H]
  // A micro-batch without targets goes through the output projection of no rows like any other (FSDP
  // enters its unit and reduces the head's gradient on every rank alike: the same collectives in the
  // same order).
  const torch::Tensor selected = hidden.reshape({-1, hidden.size(-1)}).index_select(0, batch.tensors[1]);
  const models::LlamaForCausalLMImpl::OutputProjection head = model_->output_projection(selected);
  torch::Tensor log_probs =
      models::target_log_probs(head.input, head.weight, batch.tensors[2], models::kLogitsChunkElements,
                               models::FrozenHeadGradient::kAuto, head.weight_gradient);
  // Without targets, the empty result tied to every hidden state by a zero: backward then hands every
  // layer a defined zero gradient (every unit's hooks run on every rank), not an absent one.
  if (batch.tensors[1].size(0) == 0) log_probs = (log_probs.sum() + hidden.sum() * 0).reshape({1}).narrow(0, 0, 0);
  return {log_probs, hidden};
}

double LlamaFinetune::flops(const data::Batch& batch) const {
  // Positions computed, and the sum over them of their sequence's length (attention's work).
  double positions = static_cast<double>(batch.padded_tokens), attended = 0;
  if (const auto packing = packing_of(batch)) {
    for (const std::int64_t n : packing->runs.lengths) attended += static_cast<double>(n) * static_cast<double>(n);
  } else {
    attended = positions * static_cast<double>(batch.tensors[0].size(1));
  }
  return flops_of(model_->config(), positions, attended);
}

double LlamaFinetune::flops_of(const models::LlamaConfig& m, double positions, double attended) const {
  const double matmul_params = static_cast<double>(m.num_parameters() - m.vocab_size * m.hidden_size -
                                                   (2 * m.num_hidden_layers + 1) * m.hidden_size) +
                               (m.tie_word_embeddings ? static_cast<double>(m.vocab_size * m.hidden_size) : 0.0);
  const double per_parameter = finetune_ == Finetune::kFull ? 6.0 : 4.0;
  const double attention = 6.0 * static_cast<double>(m.num_hidden_layers * m.num_attention_heads * m.head_dim);
  return positions * per_parameter * matmul_params + attended * attention;
}

h5::Attributes LlamaFinetune::attributes() const {
  const std::int64_t parameters = model_->config().num_parameters();
  const std::int64_t bytes = model_->weight_nbytes();
  return {{"model_parameters", parameters},
          {"decoder_layers", model_->config().num_hidden_layers},
          {"weight_bytes", bytes},
          {"weight_bytes_per_parameter", static_cast<double>(bytes) / static_cast<double>(parameters)},
          {"fake_quantized_linears", static_cast<std::int64_t>(fake_quantized_.size())}};
}

}  // namespace mgbench::train
