#pragma once
// Resolved configuration of `mgbench llm` (TorchTune lora_finetune recipe semantics; defaults are
// TorchTune's llama3 8B LoRA config and the paper's settings: batch 2, lr 3e-4, 100 warm-up
// steps, 1 epoch). No torch or MPI here.
#include <cstdint>
#include <string>
#include <vector>

#include "train/checkpoint_options.h"

namespace mgbench::train {

struct LlmConfig {
  // model
  std::string model = "llama3-8b";  // preset name or a directory with config.json + safetensors
  std::string init = "checkpoint";  // checkpoint | random (random: benchmark shapes without weights)
  std::string tokenizer;            // tiktoken file; default: <model dir>/original/tokenizer.model or tokenizer.model
  // data
  std::string dataset = "alpaca";  // alpaca | grammar | samsum | slimorca | text
  std::string data;                // local file (.json, .jsonl, .csv, .tsv[.gz])
  std::int64_t max_seq_len = 0;    // 0: no truncation (TorchTune's default)
  bool train_on_input = false;
  bool pin_memory = false;  // page-locked token batches, copied asynchronously (GPU)
  std::int64_t limit = 0;   // use the first N rows (0: all)
  bool shuffle = true;
  std::uint64_t seed = 42;
  // optimisation
  std::int64_t batch_size = 2;  // per rank, sequences per micro-batch
  std::int64_t grad_accum = 1;  // micro-batches per optimizer step
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;  // optimizer steps per epoch (0: all); TorchTune's max_steps_per_epoch
  double lr = 3e-4;
  double weight_decay = 0.01;
  std::int64_t warmup_steps = 100;
  double clip_grad_norm = 0;  // 0: no clipping
  // LoRA
  std::int64_t lora_rank = 8;
  double lora_alpha = 16;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_targets{"q_proj", "v_proj", "output_proj", "mlp"};
  // compute
  std::string device = "auto";
  std::string backend = "auto";
  std::string precision = "bf16";  // bf16 | fp32 (the whole model, as TorchTune's dtype)
  bool activation_checkpointing = false;
  double comm_timeout_s = 600;
  double peak_tflops = 0;  // per device, for MFU; 0: from the device (H100/H200 bf16 dense 989), NaN on CPU
  // modes and output
  bool eval_only = false;
  std::string adapter;     // --eval-only: a PEFT adapter directory to load
  std::string output_dir;  // adapters written here at the end (PEFT format); "" = none
  std::string results = "outputs/results.h5";
  CheckpointOptions checkpoint;  // --checkpoint-dir, --checkpoint-every, --resume
  std::string run_name;
  double progress_interval_s = 10.0;

  /// Throws ConfigError naming the first invalid option and what it expects.
  void validate() const;
};

}  // namespace mgbench::train
