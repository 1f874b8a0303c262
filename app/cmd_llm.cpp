// `mgbench llm`: option parsing and hand-over to the LLM job. No logic beyond parsing.
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "job_cli.h"
#include "runtime/mpi_env.h"
#include "train/llm_config.h"
#include "train/llm_job.h"

namespace mgbench::app {
namespace {

po::options_description llm_options(train::LlmConfig& c, std::int64_t& seed, std::string& targets,
                                    std::string& activation_checkpointing) {
  po::options_description model("Model");
  // clang-format off: one option per line
  model.add_options()("model", po::value(&c.model)->default_value(c.model),
                      "preset (llama3-8b, llama3.1-8b, llama3.2-1b, tiny) or a Hugging Face checkpoint directory "
                      "(config.json + model.safetensors or model.safetensors.index.json)")(
      "init", po::value(&c.init)->default_value(c.init), "checkpoint | random (presets: random only)")(
      "tokenizer", po::value(&c.tokenizer)->default_value(c.tokenizer),
      "Llama 3 tokenizer.model (default: <model>/original/tokenizer.model or <model>/tokenizer.model)")(
      "precision", po::value(&c.precision)->default_value(c.precision), "bf16 | fp32 (the whole model)")(
      "activation-checkpointing", po::value(&activation_checkpointing)->default_value("false"),
      "true | false: recompute each decoder layer in backward instead of keeping its activations");
  // clang-format on
  po::options_description data("Data");
  // clang-format off: one option per line
  data.add_options()("dataset", po::value(&c.dataset)->default_value(c.dataset),
                     "alpaca | grammar | samsum | slimorca | text")(
      "data", po::value(&c.data), "dataset file: .json (array), .jsonl, .csv, .tsv, optionally .gz")(
      "max-seq-len", po::value(&c.max_seq_len)->default_value(c.max_seq_len), "truncate samples (0: no truncation)")(
      "train-on-input", po::bool_switch(&c.train_on_input), "also train on the prompt tokens")(
      "pin-memory", po::value(&c.pin_memory)->default_value(c.pin_memory),
      "true | false: page-locked token batches, copied to the GPU without blocking (the papers' pin_memory)")(
      "limit", po::value(&c.limit)->default_value(c.limit), "use the first N rows (0: all)")(
      "shuffle", po::value(&c.shuffle)->default_value(c.shuffle), "reshuffle every epoch (seed + epoch)")(
      "seed", po::value(&seed)->default_value(static_cast<std::int64_t>(c.seed)), "seed of adapters and shuffling");
  // clang-format on
  po::options_description optim("Fine-tuning");
  // clang-format off: one option per line
  optim.add_options()("batch-size", po::value(&c.batch_size)->default_value(c.batch_size),
                      "sequences per micro-batch per rank")(
      "grad-accum", po::value(&c.grad_accum)->default_value(c.grad_accum), "micro-batches per optimizer step")(
      "epochs", po::value(&c.epochs)->default_value(c.epochs), "epochs")(
      "max-steps", po::value(&c.max_steps)->default_value(c.max_steps), "optimizer steps per epoch (0: all)")(
      "lr", po::value(&c.lr)->default_value(c.lr), "peak learning rate (AdamW)")(
      "weight-decay", po::value(&c.weight_decay)->default_value(c.weight_decay), "AdamW weight decay")(
      "warmup-steps", po::value(&c.warmup_steps)->default_value(c.warmup_steps), "linear warm-up, then cosine")(
      "clip-grad-norm", po::value(&c.clip_grad_norm)->default_value(c.clip_grad_norm), "max gradient norm (0: off)")(
      "lora-rank", po::value(&c.lora_rank)->default_value(c.lora_rank), "LoRA rank")(
      "lora-alpha", po::value(&c.lora_alpha)->default_value(c.lora_alpha), "LoRA alpha (scaling alpha / rank)")(
      "lora-dropout", po::value(&c.lora_dropout)->default_value(c.lora_dropout), "dropout before LoRA's A")(
      "lora-targets", po::value(&targets)->default_value("q_proj,v_proj,output_proj,mlp"),
      "comma-separated: q_proj, k_proj, v_proj, output_proj, mlp (or gate_proj, up_proj, down_proj)");
  // clang-format on
  po::options_description run("Devices, modes and results");
  // clang-format off: one option per line
  run.add_options()("device", po::value(&c.device)->default_value(c.device), "auto | cuda | cpu")(
      "backend", po::value(&c.backend)->default_value(c.backend), "auto | nccl | mpi")(
      "comm-timeout", po::value(&c.comm_timeout_s)->default_value(c.comm_timeout_s), "NCCL watchdog timeout [s]")(
      "peak-tflops", po::value(&c.peak_tflops)->default_value(c.peak_tflops),
      "device peak TFLOP/s for MFU (0: known GPUs' datasheet value)")(
      "eval-only", po::bool_switch(&c.eval_only), "print `eval loss: <value>` (token-weighted cross-entropy) and exit")(
      "adapter", po::value(&c.adapter)->default_value(c.adapter), "--eval-only: PEFT adapter directory to load")(
      "output-dir", po::value(&c.output_dir)->default_value(c.output_dir), "write the adapters here (PEFT format)")(
      "results", po::value(&c.results)->default_value(c.results), "HDF5 results file (created or appended to)")(
      "run-name", po::value(&c.run_name)->default_value(c.run_name), "name appended to the run id")(
      "progress-interval", po::value(&c.progress_interval_s)->default_value(c.progress_interval_s),
      "seconds between progress lines when stderr is not a terminal");
  // clang-format on
  po::options_description all(
      "mgbench llm: LoRA fine-tuning of Llama 3 (TorchTune recipe semantics) across MPI ranks.\n"
      "usage: mpirun -np N mgbench llm --model DIR|PRESET --data FILE [options]\n");
  all.add(model).add(data).add(optim).add(run).add(checkpoint_options(c.checkpoint)).add(job_general_options());
  return all;
}

}  // namespace

int llm_main(int argc, char** argv) {
  runtime::MpiEnvironment env(&argc, &argv);
  train::LlmConfig config;
  std::int64_t seed = 0;
  std::string targets, activation_checkpointing;
  const po::options_description options = llm_options(config, seed, targets, activation_checkpointing);
  po::variables_map vm;
  if (auto done = parse_job_options(env, "llm", argc, argv, options, vm, [&] {
        MGBENCH_REQUIRE(seed >= 0, ConfigError, "--seed {}: expected >= 0", seed);
        config.seed = static_cast<std::uint64_t>(seed);
        MGBENCH_REQUIRE(activation_checkpointing == "true" || activation_checkpointing == "false", ConfigError,
                        "--activation-checkpointing '{}': expected true or false", activation_checkpointing);
        config.activation_checkpointing = activation_checkpointing == "true";
        config.lora_targets.clear();
        std::stringstream list(targets);
        for (std::string t; std::getline(list, t, ',');) {
          if (!t.empty()) config.lora_targets.push_back(t);
        }
        config.validate();
      })) {
    return *done;
  }
  const std::string resolved = announce_job(env, "llm", vm);
  if (vm.count("dry-run") != 0) return 0;
  return train::run_llm_job(config, env, resolved, join_command_line(argc, argv));
}

}  // namespace mgbench::app
