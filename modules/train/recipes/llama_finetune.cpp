#include "train/recipes/llama_finetune.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "models/json_file.h"
#include "models/log_probs.h"
#include "models/safetensors.h"
#include "runtime/device.h"
#include "runtime/scalar_type.h"
#include "train/optimizer.h"
#include "train/sharding.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

void LlamaDataOptions::declare(options::OptionTable& t, const std::string& rows) {
  t.add("data", data, "dataset file of " + rows + ": .json (array), .jsonl, .csv, .tsv, optionally .gz").required();
  t.add("max-seq-len", max_seq_len, "truncate each sequence to this many tokens (0: no truncation)").at_least(0);
  t.add("train-on-input", train_on_input, "the prompt's tokens carry loss too (TorchTune's train_on_input)")
      .as_switch();
  t.add("limit", limit, "use the first N rows (0: all)").at_least(0);
  static constexpr options::Choice<Padding> kPaddings[] = {
      {"pad", Padding::kPad, "each micro-batch right-padded to its longest sequence (TorchTune, Hugging Face)"},
      {"none", Padding::kNone,
       "each micro-batch's sequences packed without padding, attention within each sequence: the same losses "
       "and gradients, computed on the real tokens only"},
  };
  t.add("padding", padding, std::span<const options::Choice<Padding>>(kPaddings), "how sequences form a micro-batch");
}

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
  t.add("init", init_, std::span<const options::Choice<Init>>(kInits), "the base model's weights");
  t.add("tokenizer", tokenizer_path_,
        "Llama 3 tokenizer.model (default: <model>/original/tokenizer.model or <model>/tokenizer.model)");
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
  t.add("lora-rank", lora_.rank, "LoRA rank").at_least(1);
  t.add("lora-alpha", lora_.alpha, "LoRA alpha (the adapter is scaled by alpha / rank)").above(0);
  t.add("lora-dropout", lora_.dropout, "dropout before LoRA's A").at_least(0).below(1);
  t.add("lora-targets", lora_.targets,
        "comma-separated: q_proj, k_proj, v_proj, output_proj, mlp (or gate_proj, up_proj, down_proj)");
  t.section("QAT");
  t.add("fake-quant", fake_quant_, std::span<const options::Choice<FakeQuant>>(kFakeQuants),
        "fake quantisation while training: with --finetune full every linear whose in-features the group divides "
        "(the untied output head too), with lora the adapted ones");
  t.add("qat-group-size", qat_group_size_, "in-features per int4 weight scale").at_least(2);
  t.add("fake-quant-after-steps", fake_quant_after_steps_,
        "train the first N optimizer steps without fake quantisation (0: from the start)")
      .at_least(0);
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
  MGBENCH_REQUIRE(fake_quant_after_steps_ == 0 || fake_quant_ != FakeQuant::kNone, ConfigError,
                  "--fake-quant-after-steps {}: only with --fake-quant 8da4w", fake_quant_after_steps_);
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

std::vector<UnitShape> LlamaFinetune::unit_shapes(const models::LlamaConfig& c, std::int64_t element_bytes) const {
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const std::int64_t f = c.intermediate_size;
  const bool full = finetune_ == Finetune::kFull;
  const bool nf4 = base_ == models::BaseWeights::kNf4;
  std::vector<std::string> targets;
  if (!full) targets = lora_.hf_targets();
  const auto dense = [full](UnitShape& u, std::vector<std::int64_t> sizes) {
    u.sizes.push_back(std::move(sizes));
    u.trainable.push_back(full);
  };
  // A projection [out, in]: its dense weight (NF4: packed, not a parameter) and LoRA's A, B.
  const auto projection = [&](UnitShape& u, const std::string& name, std::int64_t out, std::int64_t in) {
    if (nf4) {
      u.packed_bytes += models::Nf4Weight::sharded_nbytes(out * in, element_bytes);
    } else {
      dense(u, {out, in});
    }
    if (std::find(targets.begin(), targets.end(), name) != targets.end()) {
      u.sizes.push_back({lora_.rank, in});
      u.sizes.push_back({out, lora_.rank});
      u.trainable.insert(u.trainable.end(), {true, true});
    }
  };
  std::vector<UnitShape> units;
  UnitShape embedding{{}, {}, !c.tie_word_embeddings};
  dense(embedding, {c.vocab_size, h});
  units.push_back(embedding);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    UnitShape layer;
    dense(layer, {h});
    projection(layer, "q_proj", q, h);
    projection(layer, "k_proj", kv, h);
    projection(layer, "v_proj", kv, h);
    projection(layer, "o_proj", h, q);
    dense(layer, {h});
    projection(layer, "gate_proj", f, h);
    projection(layer, "up_proj", f, h);
    projection(layer, "down_proj", h, f);
    units.push_back(std::move(layer));
  }
  UnitShape root{{}, {}, false};
  dense(root, {h});
  units.push_back(root);
  if (!c.tie_word_embeddings) {
    UnitShape head{{}, {}, false};
    dense(head, {c.vocab_size, h});
    units.push_back(head);
  }
  return units;
}

std::vector<MemoryPlanRow> LlamaFinetune::memory_plan(const TrainOptions& train,
                                                      const std::vector<int>& world_sizes) const {
  const models::LlamaConfig c = read_config();
  const auto element =
      static_cast<std::int64_t>(axes::dtype_info(axes::precision_info(train.precision).param_dtype).bytes);
  const std::vector<UnitShape> units = unit_shapes(c, element);
  const std::int64_t states = optimizer_states_per_element(train);
  std::vector<MemoryPlanRow> rows;
  for (const int world : world_sizes) {
    const bool sharded = train.sharding == Sharding::kFsdp && world > 1;
    const ShardedMemory m = sharded_memory(units, sharded ? world : 1, element, train.reshard_after_forward);
    MemoryPlanRow row{world, sharded, sharded ? m.shard_bytes + m.gathered_peak_bytes : m.shard_bytes,
                      m.trainable_shard_bytes, states * m.trainable_shard_bytes};
    rows.push_back(row);
  }
  return rows;
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
  MGBENCH_REQUIRE(tokenizer_->vocab_size() <= config_->vocab_size, DataError,
                  "tokenizer '{}' has {} tokens but the model's vocabulary is {}: not a Llama 3 model?", path,
                  tokenizer_->vocab_size(), config_->vocab_size);
}

void LlamaFinetune::build(const RecipeContext& ctx) {
  refuse_if_weights_do_not_fit(ctx);
  {
    // Built in the run's dtype, one unit at a time, each moved to the device and drawn there before
    // the next exists: the host holds one decoder layer (8B, bf16: 0.44 GB; the embedding 1.05 GB),
    // not the model (16 GB); NF4 projections are quantised on the device as they are drawn.
    const caffe2::TypeMeta previous = torch::get_default_dtype();
    torch::set_default_dtype(caffe2::TypeMeta::fromScalarType(runtime::scalar_type(ctx.precision.param_dtype)));
    try {
      model_ = models::LlamaForCausalLM(*config_, base_, ctx.device);
    } catch (...) {
      torch::set_default_dtype(previous);
      throw;
    }
    torch::set_default_dtype(previous);
  }
  // A checkpoint's tensors are copied from the file's mapping into the weights on the device, one
  // at a time, each tensor's pages released once copied (SafetensorsCheckpoint::release).
  if (init_ == Init::kCheckpoint) model_->load_hf_checkpoint(model_name_);
  model_->set_activation_checkpointing(activation_checkpointing_);
  if (finetune_ == Finetune::kLora) {
    trainable_ = model_->apply_lora(lora_);
  } else {
    trainable_ = model_->parameters();
    for (auto& p : trainable_) p.set_requires_grad(true);
    warn_if_full_replica_does_not_fit(ctx);
  }
  if (fake_quant_ == FakeQuant::k8da4w) {
    std::vector<std::string> skipped;
    fake_quantized_ = model_->enable_fake_quant(qat_group_size_, finetune_ == Finetune::kLora, &skipped);
    log::info("QAT 8da4w: {} linears fake-quantised (groups of {})", fake_quantized_.size(), qat_group_size_);
    if (!skipped.empty()) {
      log::info("QAT 8da4w: {} linears left as they are ({} in-features not a multiple of {}, as torchao): {}",
                skipped.size(), skipped.size() == 1 ? "its" : "their", qat_group_size_, fmt::join(skipped, ", "));
    }
    begin_step(0);
  }
}

void LlamaFinetune::refuse_if_weights_do_not_fit(const RecipeContext& ctx) const {
  // The weights alone (NF4 projections at their lower bound of half a byte a parameter), against
  // the device's memory: a config.json with absurd sizes is refused here, not minutes into allocating.
  const double parameters = static_cast<double>(config_->num_parameters());
  const double bytes = parameters * (base_ == models::BaseWeights::kNf4
                                         ? 0.5
                                         : static_cast<double>(axes::dtype_info(ctx.precision.param_dtype).bytes));
  const double memory = ctx.placement.is_cuda()
                            ? static_cast<double>(runtime::cuda_total_memory(ctx.placement.index))
                            : static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const fs::path where = fs::is_directory(model_name_) ? fs::path(model_name_) / "config.json" : fs::path(model_name_);
  MGBENCH_REQUIRE(memory <= 0 || bytes <= memory, DataError,
                  "model '{}' (hidden_size {}, intermediate_size {}, num_hidden_layers {}, vocab_size {}): {:.3g} "
                  "parameters need at least {:.1f} GiB for the weights alone, and this rank's {} has {:.1f} GiB",
                  where.string(), config_->hidden_size, config_->intermediate_size, config_->num_hidden_layers,
                  config_->vocab_size, parameters, bytes / (1 << 30), ctx.placement.is_cuda() ? "GPU" : "host memory",
                  memory / (1 << 30));
}

void LlamaFinetune::warn_if_full_replica_does_not_fit(const RecipeContext& ctx) const {
  if (!ctx.placement.is_cuda()) return;
  // Weights, gradients and AdamW's two states in the run's dtype: 4 copies, each rank a whole one
  // (DDP: 5, with the gradients' buckets), or 1/N of them under FSDP -- where the whole model is
  // still built on every rank before it is sharded. Activations and gathered units come on top.
  const double element = static_cast<double>(axes::dtype_info(ctx.precision.param_dtype).bytes);
  const double parameters = static_cast<double>(model_->config().num_parameters());
  const bool sharded = ctx.train.sharding == Sharding::kFsdp && ctx.world_size > 1;
  const double copies = sharded ? std::max(1.0, 4.0 / ctx.world_size) : 5.0;
  const double needed = copies * element * parameters;
  const double device = static_cast<double>(runtime::cuda_total_memory(ctx.placement.index));
  if (device > 0 && needed > 0.9 * device) {
    log::warn(
        "--finetune full of {:.2f}B parameters needs about {:.0f} GiB per rank for weights, gradients and AdamW's "
        "states ({:.2f} x {} bytes per parameter{}) before activations, and this GPU has {:.0f} GiB: it will not "
        "fit; {}",
        parameters / 1e9, needed / (1 << 30), copies, element, sharded ? ", sharded over the ranks" : ", a replica",
        device / (1 << 30),
        sharded ? "use more ranks or a smaller model"
                : "use --sharding fsdp over several GPUs, a smaller model or LoRA");
  }
}

void LlamaFinetune::begin_step(std::int64_t global_step) {
  if (fake_quant_ != FakeQuant::kNone) model_->set_fake_quant_enabled(global_step >= fake_quant_after_steps_);
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaFinetune::checkpoint_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> trained;
  for (const auto& p : model_->named_parameters()) {
    if (p.value().requires_grad()) trained.emplace_back(p.key(), p.value());
  }
  return trained;
}

data::Batch collate_sequences(const std::vector<const text::TokenizedSample*>& sequences, std::int64_t pad_id,
                              Padding padding, bool pin_memory) {
  std::int64_t longest = 0, total = 0;
  for (const auto* s : sequences) {
    longest = std::max(longest, static_cast<std::int64_t>(s->tokens.size()));
    total += static_cast<std::int64_t>(s->tokens.size());
  }
  const auto rows = static_cast<std::int64_t>(sequences.size());
  const bool packed = padding == Padding::kNone;
  const auto options = torch::TensorOptions(torch::kInt64).pinned_memory(pin_memory);
  torch::Tensor tokens = packed ? torch::empty({1, total}, options) : torch::full({rows, longest}, pad_id, options);
  torch::Tensor position_ids = packed ? torch::empty({total}, options) : torch::Tensor();
  torch::Tensor lengths = packed ? torch::empty({rows}, torch::kInt64) : torch::Tensor();
  std::vector<std::int64_t> positions, targets, owners;
  auto* token_data = tokens.data_ptr<std::int64_t>();
  auto* position_data = packed ? position_ids.data_ptr<std::int64_t>() : nullptr;
  std::int64_t start = 0;  // the sequence's first index in tokens' grid
  data::Batch batch;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto& s = *sequences[static_cast<std::size_t>(r)];
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    for (std::int64_t k = 0; k < n; ++k) {
      token_data[start + k] = s.tokens[static_cast<std::size_t>(k)];
      if (packed) position_data[start + k] = k;
      // Position k - 1 predicts token k, where its label is not masked.
      if (k > 0 && s.labels[static_cast<std::size_t>(k)] != text::kIgnoreIndex) {
        positions.push_back(start + k - 1);
        targets.push_back(s.labels[static_cast<std::size_t>(k)]);
        owners.push_back(r);
      }
    }
    if (packed) lengths.data_ptr<std::int64_t>()[r] = n;
    start += packed ? n : longest;
    batch.tokens += n;
  }
  auto to_tensor = [&](const std::vector<std::int64_t>& values) {
    torch::Tensor t = torch::empty({static_cast<std::int64_t>(values.size())}, options);
    std::copy(values.begin(), values.end(), t.data_ptr<std::int64_t>());
    return t;
  };
  batch.tensors = {std::move(tokens), to_tensor(positions), to_tensor(targets), to_tensor(owners)};
  if (packed) {
    batch.tensors.push_back(std::move(position_ids));
    batch.host_tensors = {std::move(lengths)};
  }
  batch.samples = rows;
  batch.padded_tokens = packed ? total : rows * longest;
  batch.loss_targets = static_cast<std::int64_t>(positions.size());
  return batch;
}

namespace {

// Batches collated with Padding::kNone carry a fifth tensor, the position ids (collate_sequences).
bool is_packed(const data::Batch& batch) { return batch.tensors.size() == 5; }

}  // namespace

std::optional<models::SequencePacking> packing_of(const data::Batch& batch) {
  if (!is_packed(batch)) return std::nullopt;
  const torch::Tensor& lengths = batch.host_tensors.at(0);
  const auto* n = lengths.data_ptr<std::int64_t>();
  return models::SequencePacking{batch.tensors[4], std::vector<std::int64_t>(n, n + lengths.numel())};
}

std::int64_t sequences_of(const data::Batch& batch) {
  return is_packed(batch) ? batch.host_tensors.at(0).numel() : batch.tensors[0].size(0);
}

torch::Tensor sequence_log_probs(const data::Batch& batch, const torch::Tensor& log_probs) {
  return torch::zeros({sequences_of(batch)}, log_probs.options()).index_add(0, batch.tensors[3], log_probs);
}

data::Batch LlamaFinetune::collate(const std::vector<const text::TokenizedSample*>& sequences, Padding padding,
                                   bool pin_memory) const {
  return collate_sequences(sequences, tokenizer_->pad_id(), padding, pin_memory);
}

LlamaFinetune::TargetLogProbs LlamaFinetune::target_log_probs(const data::Batch& batch) {
  const std::optional<models::SequencePacking> packing = packing_of(batch);
  torch::Tensor hidden = model_->hidden_states(batch.tensors[0], packing ? &*packing : nullptr);  // [R, T, H]
  if (batch.loss_targets == 0) {
    // No target: an empty result that still belongs to the graph (backward runs on every rank),
    // through the output projection of no rows (FSDP enters its unit on every rank alike: the
    // same collectives in the same order).
    const auto [input, weight] = model_->output_projection(hidden.reshape({-1, hidden.size(-1)}).narrow(0, 0, 0));
    const torch::Tensor none = (hidden.sum() + torch::matmul(input, weight.t()).sum()) * 0;
    return {none.to(torch::kFloat32).reshape({1}).narrow(0, 0, 0), hidden};
  }
  const torch::Tensor selected = hidden.reshape({-1, hidden.size(-1)}).index_select(0, batch.tensors[1]);
  const auto [input, weight] = model_->output_projection(selected);
  return {models::target_log_probs(input, weight, batch.tensors[2]), hidden};
}

double LlamaFinetune::flops(const data::Batch& batch) const {
  // Positions computed, and the sum over them of their sequence's length (attention's work).
  double positions = static_cast<double>(batch.padded_tokens), attended = 0;
  if (const auto packing = packing_of(batch)) {
    for (const std::int64_t n : packing->lengths) attended += static_cast<double>(n) * static_cast<double>(n);
  } else {
    attended = positions * static_cast<double>(batch.tensors[0].size(1));
  }
  const auto& m = model_->config();
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
          {"weight_bytes", bytes},
          {"weight_bytes_per_parameter", static_cast<double>(bytes) / static_cast<double>(parameters)},
          {"fake_quantized_linears", static_cast<std::int64_t>(fake_quantized_.size())}};
}

void LlamaFinetune::load_adapter(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const nlohmann::json config = models::read_json_file(config_path, "adapter configuration");
  std::vector<std::string> differ;
  std::vector<std::string> fixes;
  const auto number = [&](const char* key) -> double {
    MGBENCH_REQUIRE(config.contains(key) && config[key].is_number(), DataError, "'{}': \"{}\" missing or not a number",
                    config_path, key);
    return config[key].get<double>();
  };
  // PEFT variants mgbench's LoRA does not compute: refused rather than evaluated wrongly.
  for (const char* key : {"use_rslora", "use_dora"}) {
    MGBENCH_REQUIRE(!config.contains(key) || !config[key].is_boolean() || !config[key].get<bool>(), ConfigError,
                    "--adapter {}: adapter_config.json has \"{}\": true, which mgbench's LoRA does not compute", dir,
                    key);
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    MGBENCH_REQUIRE(!config.contains(key) || config[key].is_null() || config[key].empty(), ConfigError,
                    "--adapter {}: adapter_config.json has a per-module \"{}\", which mgbench's LoRA does not take",
                    dir, key);
  }
  const double r = number("r");
  const double alpha = number("lora_alpha");
  if (r != static_cast<double>(lora_.rank)) {
    differ.push_back(fmt::format("r {:g} (--lora-rank {})", r, lora_.rank));
    fixes.push_back(fmt::format("--lora-rank {:g}", r));
  }
  if (alpha != lora_.alpha) {
    differ.push_back(fmt::format("lora_alpha {:g} (--lora-alpha {:g})", alpha, lora_.alpha));
    fixes.push_back(fmt::format("--lora-alpha {:g}", alpha));
  }
  MGBENCH_REQUIRE(config.contains("target_modules") && config["target_modules"].is_array(), DataError,
                  "'{}': \"target_modules\" missing or not a list", config_path);
  std::vector<std::string> theirs;
  for (const auto& t : config["target_modules"]) {
    MGBENCH_REQUIRE(t.is_string(), DataError, "'{}': \"target_modules\" holds a non-string", config_path);
    theirs.push_back(t.get<std::string>());
  }
  models::LoraOptions adapter = lora_;
  adapter.targets = theirs;
  std::vector<std::string> their_targets = adapter.hf_targets();  // PEFT's names, or TorchTune's
  std::vector<std::string> our_targets = lora_.hf_targets();
  std::sort(their_targets.begin(), their_targets.end());
  std::sort(our_targets.begin(), our_targets.end());
  if (their_targets != our_targets) {
    differ.push_back(fmt::format("target_modules {} (--lora-targets {})", fmt::join(their_targets, ","),
                                 fmt::join(our_targets, ",")));
    fixes.push_back(fmt::format("--lora-targets {}", fmt::join(their_targets, ",")));
  }
  MGBENCH_REQUIRE(differ.empty(), ConfigError,
                  "--adapter {}: adapter_config.json differs from this run's adapters: {}; "
                  "give {}",
                  dir, fmt::join(differ, ", "), fmt::join(fixes, " "));
  model_->load_lora_adapter((fs::path(dir) / "adapter_model.safetensors").string());
}

void LlamaFinetune::save() const {
  if (output_dir_.empty()) return;
  const fs::path dir(output_dir_);
  fs::create_directories(dir);
  if (finetune_ == Finetune::kLora) {
    models::write_safetensors((dir / "adapter_model.safetensors").string(), model_->lora_state_dict(),
                              {{"format", "pt"}});
    models::write_json_file((dir / "adapter_config.json").string(), {{"peft_type", "LORA"},
                                                                     {"task_type", "CAUSAL_LM"},
                                                                     {"r", lora_.rank},
                                                                     {"lora_alpha", lora_.alpha},
                                                                     {"lora_dropout", lora_.dropout},
                                                                     {"target_modules", lora_.hf_targets()},
                                                                     {"bias", "none"},
                                                                     {"fan_in_fan_out", false},
                                                                     {"inference_mode", true},
                                                                     {"base_model_name_or_path", model_name_}});
    log::info("adapters: {} (PEFT format)", dir.string());
  } else {
    models::write_safetensors((dir / "model.safetensors").string(), model_->hf_state_dict(), {{"format", "pt"}});
    models::write_json_file((dir / "config.json").string(),
                            nlohmann::json::parse(model_->config().to_hf_json(model_->output_weight().scalar_type())));
    log::info("model: {} (Hugging Face format)", dir.string());
  }
  if (fake_quant_ == FakeQuant::k8da4w) {
    models::write_json_file((dir / "qat_config.json").string(),
                            {{"scheme", "8da4w"}, {"group_size", qat_group_size_}, {"linears", fake_quantized_}});
  }
}

}  // namespace mgbench::train
