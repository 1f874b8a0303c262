// The LoRA recipe (Lawenda et al. 2025, sec. 4): Llama 3 fine-tuned with LoRA adapters, with
// TorchTune 0.6's lora_finetune_distributed semantics:
//  - samples: the dataset's rows through TorchTune's templates and masks (data/text/sft.h),
//    padded per micro-batch (tokens with <|finetune_right_pad_id|>); the loss targets (the next
//    token where the label is not masked) are found on the loader thread;
//  - loss: cross-entropy of the next token, summed over the targets; the loop divides the
//    gradient by the targets of the whole step on all ranks (TorchTune's token normalisation);
//  - the adapters trained (AdamW, weight decay 0.01, cosine schedule with warm-up: the loop's
//    defaults set here), written in PEFT's format at the end (--output-dir).
// --eval-only: the token-weighted mean cross-entropy of the dataset ("eval loss: <value>"),
// with an adapter from --adapter.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/durable.h"
#include "core/error.h"
#include "core/log.h"
#include "data/text/sft.h"
#include "models/llama.h"
#include "models/log_probs.h"
#include "models/safetensors.h"
#include "train/recipe.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

enum class Init { kCheckpoint, kRandom };

constexpr options::Choice<Init> kInits[] = {
    {"checkpoint", Init::kCheckpoint, "the weights of the --model checkpoint directory"},
    {"random", Init::kRandom, "random weights (benchmarks of a preset's shapes without its weights)"},
};

struct LlmOptions {
  std::string model = "llama3-8b";  // preset name or a directory with config.json + safetensors
  Init init = Init::kCheckpoint;
  std::string tokenizer;  // tiktoken file; default: <model dir>/original/tokenizer.model or tokenizer.model
  text::DatasetKind dataset = text::DatasetKind::kAlpaca;
  std::string data;              // local file (.json, .jsonl, .csv, .tsv[.gz])
  std::int64_t max_seq_len = 0;  // 0: no truncation (TorchTune's default)
  bool train_on_input = false;
  std::int64_t limit = 0;                                                              // use the first N rows (0: all)
  models::LoraOptions lora{8, 16.0, 0.0, {"q_proj", "v_proj", "output_proj", "mlp"}};  // TorchTune's llama3 8B
  bool activation_checkpointing = false;
  bool eval_only = false;
  std::string adapter;     // --eval-only: a PEFT adapter directory to load
  std::string output_dir;  // adapters written here at the end (PEFT format); "" = none
};

class LoraRecipe final : public Recipe {
 public:
  void declare(options::OptionTable& t) override {
    auto& o = options_;
    t.section("Model");
    t.add("model", o.model,
          "preset (llama3-8b, llama3.1-8b, llama3.2-1b, tiny) or a Hugging Face checkpoint directory "
          "(config.json + model.safetensors or model.safetensors.index.json)");
    t.add("init", o.init, std::span<const options::Choice<Init>>(kInits), "the base model's weights");
    t.add("tokenizer", o.tokenizer,
          "Llama 3 tokenizer.model (default: <model>/original/tokenizer.model or <model>/tokenizer.model)");
    t.add("activation-checkpointing", o.activation_checkpointing,
          "recompute each decoder layer in backward instead of keeping its activations");
    t.section("Data");
    t.add("dataset", o.dataset, text::dataset_choices(), "the dataset's template");
    t.add("data", o.data, "dataset file: .json (array), .jsonl, .csv, .tsv, optionally .gz").required();
    t.add("max-seq-len", o.max_seq_len, "truncate samples to this many tokens (0: no truncation)").at_least(0);
    t.add("train-on-input", o.train_on_input, "also train on the prompt tokens").as_switch();
    t.add("limit", o.limit, "use the first N rows (0: all)").at_least(0);
    t.section("LoRA");
    t.add("lora-rank", o.lora.rank, "LoRA rank").at_least(1);
    t.add("lora-alpha", o.lora.alpha, "LoRA alpha (the adapter is scaled by alpha / rank)").above(0);
    t.add("lora-dropout", o.lora.dropout, "dropout before LoRA's A").at_least(0).below(1);
    t.add("lora-targets", o.lora.targets,
          "comma-separated: q_proj, k_proj, v_proj, output_proj, mlp (or gate_proj, up_proj, down_proj)");
    t.section("Evaluation and adapters");
    t.add("eval-only", o.eval_only, "print `eval loss: <value>` (token-weighted cross-entropy of --data) and exit")
        .as_switch();
    t.add("adapter", o.adapter, "--eval-only: the PEFT adapter directory to load");
    t.add("output-dir", o.output_dir, "write the trained adapters here (PEFT format); empty: none").no_effect();
  }

  void validate(const TrainOptions& train) const override {
    const auto& o = options_;
    MGBENCH_REQUIRE(!o.model.empty(), ConfigError, "--model: expected a preset name or a checkpoint directory");
    MGBENCH_REQUIRE(train.precision == Precision::kBf16 || train.precision == Precision::kFp32, ConfigError,
                    "--precision '{}': expected bf16 or fp32 (the lora recipe keeps the whole model in that dtype, "
                    "as TorchTune)",
                    precision_info(train.precision).name);
    MGBENCH_REQUIRE(!data::strategy_info(train.strategy).single_process, ConfigError,
                    "--strategy '{}': expected ddp, ddp-rr or ddp-ds (the lora recipe runs one rank per GPU)",
                    data::strategy_info(train.strategy).name);
    MGBENCH_REQUIRE(!o.lora.targets.empty(), ConfigError, "--lora-targets: expected at least one target");
    o.lora.hf_targets();  // names an unknown target
    MGBENCH_REQUIRE(o.adapter.empty() || o.eval_only, ConfigError, "--adapter: only with --eval-only");
  }

  void setup(const RecipeContext& ctx) override {
    const auto& o = options_;
    const bool is_dir = fs::is_directory(o.model);
    // The model first: a name that is neither a directory nor a preset is the error to report.
    const models::LlamaConfig model_config =
        is_dir ? models::LlamaConfig::from_hf_json((fs::path(o.model) / "config.json").string())
               : models::LlamaConfig::preset(o.model);
    MGBENCH_REQUIRE(is_dir || o.init == Init::kRandom, ConfigError,
                    "--model {} is a preset (shapes, no weights): use --init random, or --model <checkpoint dir>",
                    o.model);
    // Tokenizer: given, or the checkpoint's (Meta ships original/tokenizer.model).
    std::string tokenizer_path = o.tokenizer;
    if (tokenizer_path.empty() && is_dir) {
      for (const char* rel : {"original/tokenizer.model", "tokenizer.model"}) {
        if (fs::exists(fs::path(o.model) / rel)) {
          tokenizer_path = (fs::path(o.model) / rel).string();
          break;
        }
      }
    }
    MGBENCH_REQUIRE(!tokenizer_path.empty(), ConfigError,
                    "--tokenizer: expected the Llama 3 tokenizer.model (the checkpoint '{}' has none)", o.model);
    tokenizer_ = std::make_unique<text::Llama3Tokenizer>(tokenizer_path);

    text::SftOptions sft;
    sft.kind = o.dataset;
    sft.max_seq_len = o.max_seq_len;
    sft.train_on_input = o.train_on_input;
    samples_ = text::load_sft_dataset(o.data, *tokenizer_, sft);
    if (o.limit > 0 && static_cast<std::int64_t>(samples_.size()) > o.limit) {
      samples_.resize(static_cast<std::size_t>(o.limit));
    }
    MGBENCH_REQUIRE(!samples_.empty(), DataError, "dataset '{}': no rows", o.data);
    MGBENCH_REQUIRE(tokenizer_->vocab_size() <= model_config.vocab_size, DataError,
                    "tokenizer '{}' has {} tokens but the model's vocabulary is {}: not a Llama 3 model?",
                    tokenizer_path, tokenizer_->vocab_size(), model_config.vocab_size);
    {
      // Built directly in the run's dtype: an 8B model in bf16 needs 16 GB of host memory, not 32.
      const caffe2::TypeMeta previous = torch::get_default_dtype();
      torch::set_default_dtype(caffe2::TypeMeta::fromScalarType(ctx.precision.param_dtype));
      try {
        model_ = models::LlamaForCausalLM(model_config);
      } catch (...) {
        torch::set_default_dtype(previous);
        throw;
      }
      torch::set_default_dtype(previous);
    }
    if (o.init == Init::kCheckpoint) model_->load_hf_checkpoint(o.model);
    model_->to(ctx.device, ctx.precision.param_dtype);
    model_->set_activation_checkpointing(o.activation_checkpointing);
    trainable_ = model_->apply_lora(o.lora);
    if (o.eval_only && !o.adapter.empty()) {
      model_->load_lora_adapter((fs::path(o.adapter) / "adapter_model.safetensors").string());
    }
  }

  std::int64_t train_size() const override { return static_cast<std::int64_t>(samples_.size()); }

  /// Tensors: tokens int64 [B, T] (padded with <|finetune_right_pad_id|>); the positions with a
  /// target in the flattened [B * (T - 1)] next-token grid, int64 [N]; their targets, int64 [N].
  data::Batch assemble(const data::PlannedBatch& plan, bool pin_memory) const override {
    return collate(plan.indices, pin_memory);
  }

  torch::nn::Module& model() override { return *model_; }
  std::vector<torch::Tensor> trainable_parameters() override { return trainable_; }
  /// The adapters by name: the frozen base is rebuilt from --model / --seed.
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, torch::Tensor>> trained;
    for (const auto& p : model_->named_parameters()) {
      if (p.value().requires_grad()) trained.emplace_back(p.key(), p.value());
    }
    return trained;
  }

  LossNormalization loss_normalization() const override { return LossNormalization::kSumOverTargets; }

  MicroBatchLoss forward(const data::Batch& batch) override {
    return {loss_sum(batch), static_cast<double>(batch.loss_targets), {}};
  }

  /// 4 x (matmul parameters: all but the embedding table and the norms; a tied output counts)
  /// per padded token -- forward, and backward to the activations through the frozen weights;
  /// LoRA's own terms are negligible -- plus causal attention, 6 x layers x heads x head_dim x T
  /// per token (docs/design.md).
  double flops(const data::Batch& batch) const override {
    const auto& m = model_->config();
    const double matmul_params = static_cast<double>(m.num_parameters() - m.vocab_size * m.hidden_size -
                                                     (2 * m.num_hidden_layers + 1) * m.hidden_size) +
                                 (m.tie_word_embeddings ? static_cast<double>(m.vocab_size * m.hidden_size) : 0.0);
    const double seq_len = static_cast<double>(batch.tensors[0].size(1));
    const double attention =
        6.0 * static_cast<double>(m.num_hidden_layers * m.num_attention_heads * m.head_dim) * seq_len;
    return static_cast<double>(batch.padded_tokens) * (4.0 * matmul_params + attention);
  }
  bool counts_tokens() const override { return true; }

  std::int64_t eval_size() const override { return options_.eval_only ? train_size() : 0; }
  data::Batch assemble_eval(const std::vector<std::int64_t>& indices) const override {
    return collate(indices, /*pin_memory=*/false);
  }
  std::int64_t eval_terms() const override { return 2; }
  torch::Tensor eval_sums(const data::Batch& batch) override {
    const torch::Tensor loss = loss_sum(batch).to(torch::kFloat64);
    return torch::stack({loss, torch::full({}, static_cast<double>(batch.loss_targets), loss.options())});
  }
  EvalResult eval_result(const torch::Tensor& sums) const override {
    const double targets = sums[1].item<double>();
    MGBENCH_REQUIRE(targets > 0, DataError, "dataset '{}': no label tokens to evaluate", options_.data);
    EvalResult r;
    r.loss = sums[0].item<double>() / targets;
    return r;
  }
  bool eval_only() const override { return options_.eval_only; }

  h5::Attributes attributes() const override {
    return {{"model_parameters", model_->config().num_parameters()},
            {"train_samples", static_cast<std::int64_t>(samples_.size())}};
  }

  void finish(int rank) override {
    if (rank == 0 && !options_.output_dir.empty() && !options_.eval_only) {
      save_adapter(options_.output_dir);
      log::info("adapters: {} (PEFT format)", options_.output_dir);
    }
  }

 private:
  data::Batch collate(const std::vector<std::int64_t>& indices, bool pin_memory) const {
    std::size_t length = 0;
    for (auto i : indices) length = std::max(length, samples_[static_cast<std::size_t>(i)].tokens.size());
    const auto b = static_cast<std::int64_t>(indices.size());
    const auto t = static_cast<std::int64_t>(length);
    const auto options = torch::TensorOptions(torch::kInt64).pinned_memory(pin_memory);
    data::Batch batch;
    torch::Tensor tokens = torch::full({b, t}, tokenizer_->pad_id(), options);
    std::vector<std::int64_t> positions, targets;
    auto token_data = tokens.accessor<std::int64_t, 2>();
    for (std::int64_t r = 0; r < b; ++r) {
      const auto& s = samples_[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])];
      for (std::size_t k = 0; k < s.tokens.size(); ++k) {
        token_data[r][static_cast<std::int64_t>(k)] = s.tokens[k];
        // Position k - 1 predicts token k, where its label is not masked.
        if (k > 0 && s.labels[k] != text::kIgnoreIndex) {
          positions.push_back(r * (t - 1) + static_cast<std::int64_t>(k) - 1);
          targets.push_back(s.labels[k]);
        }
      }
      batch.tokens += static_cast<std::int64_t>(s.tokens.size());
    }
    const auto n = static_cast<std::int64_t>(positions.size());
    torch::Tensor position_tensor = torch::empty({n}, options);
    torch::Tensor target_tensor = torch::empty({n}, options);
    std::copy(positions.begin(), positions.end(), position_tensor.data_ptr<std::int64_t>());
    std::copy(targets.begin(), targets.end(), target_tensor.data_ptr<std::int64_t>());
    batch.tensors = {std::move(tokens), std::move(position_tensor), std::move(target_tensor)};
    batch.samples = b;
    batch.padded_tokens = b * t;
    batch.loss_targets = n;
    return batch;
  }

  /// Sum over the batch of the next-token cross-entropy (fp32). Only positions that have a target
  /// go through the output projection and the softmax (prompt and padding positions, 30-85 % of
  /// the tokens in alpaca / samsum, cost nothing there, forward or backward), a chunk at a time
  /// (models::target_log_probs: no [positions, vocab] logits kept for backward).
  torch::Tensor loss_sum(const data::Batch& batch) {
    const torch::Tensor h = model_->hidden_states(batch.tensors[0]);  // [B, T, H]
    const auto t = h.size(1);
    if (t < 2 || batch.loss_targets == 0) return (h.sum() * 0).to(torch::kFloat32);  // keeps the graph
    const torch::Tensor selected = h.narrow(1, 0, t - 1).reshape({-1, h.size(-1)}).index_select(0, batch.tensors[1]);
    return -models::target_log_probs(selected, model_->output_weight(), batch.tensors[2]).sum();
  }

  /// The adapters in PEFT's format (adapter_model.safetensors, adapter_config.json), fsynced.
  /// Throws DataError naming the file on I/O errors.
  void save_adapter(const std::string& dir) const {
    const auto& o = options_;
    fs::create_directories(dir);
    models::write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), model_->lora_state_dict(),
                              {{"format", "pt"}});
    const nlohmann::json config{{"peft_type", "LORA"},
                                {"task_type", "CAUSAL_LM"},
                                {"r", o.lora.rank},
                                {"lora_alpha", o.lora.alpha},
                                {"lora_dropout", o.lora.dropout},
                                {"target_modules", o.lora.hf_targets()},
                                {"bias", "none"},
                                {"fan_in_fan_out", false},
                                {"inference_mode", true},
                                {"base_model_name_or_path", o.model}};
    const std::string path = (fs::path(dir) / "adapter_config.json").string();
    {
      std::ofstream out(path);
      out << config.dump(2) << "\n";
      out.flush();
      MGBENCH_REQUIRE(out.good(), DataError, "adapter config '{}': write failed", path);
    }
    sync_to_disk(path);
  }

  LlmOptions options_;
  std::unique_ptr<text::Llama3Tokenizer> tokenizer_;
  std::vector<text::TokenizedSample> samples_;
  models::LlamaForCausalLM model_{nullptr};
  std::vector<torch::Tensor> trainable_;
};

}  // namespace

std::unique_ptr<Recipe> make_lora_recipe() { return std::make_unique<LoraRecipe>(); }

}  // namespace mgbench::train
