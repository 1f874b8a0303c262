// mgbench: how machine-learning jobs use multi-GPU nodes.
//   mpirun -np N mgbench image [options]   image classification (MobileNetV2 on MNIST upscaled), results into HDF5
//   mpirun -np N mgbench llm [options]     LLM fine-tuning (Llama 3: LoRA, QLoRA, DPO, full, QAT), results into HDF5
//   mpirun -np N mgbench comm [options]    collective benchmark (nccl-tests style) over MPI or NCCL
//   mgbench predict FILE... [--ranks 1,2,4]   scaling prediction from measured runs and a comm run
//   mgbench quantize --model DIR --output DIR  a QAT-trained checkpoint -> int4 weights
//   mgbench report FILE...                 tables from results files
//   mgbench tokenize --tokenizer FILE      text on stdin -> Llama 3 token ids
//   mgbench data stats ...                 rows and token lengths of a fine-tuning dataset
#include <cstring>
#include <iostream>
#include <string>

#include "commands.h"
#include "core/build_info.h"

namespace {

constexpr const char* kUsage = R"(usage: mgbench <command> [options]

commands:
  image    image classification across MPI ranks: MobileNetV2 on MNIST upscaled to --image-size px
           (strategies ddp, ddp-rr, ddp-ds, dp; fp64 ... amp-bf16); per-rank timings into HDF5
  llm      LLM fine-tuning across MPI ranks: Llama 3 with TorchTune's recipe semantics (--recipe lora,
           qlora, dpo, full, qat, qat-lora), --eval-only for a loss
  comm     collective benchmark in nccl-tests' manner (all-reduce, all-gather, reduce-scatter,
           broadcast) over the Communicator training uses: MPI on CPUs, NCCL on GPUs
  predict  time, speed-up and limiting phase of measured workloads at other rank counts and strategies
           (from a 1-rank run and a comm run; written as `prediction` runs)
  quantize a QAT-trained checkpoint's fake-quantised linears -> int4 weights (torchao's convert)
  report   tables of one or more results files (paper Table 2 style; --phases, --cuda, --csv)
  tokenize UTF-8 text on stdin -> Llama 3 token ids on stdout (tiktoken BPE)
  data     `data stats`: rows and token lengths of a fine-tuning dataset

  mgbench <command> --help   options of a command
  mgbench --version          version and git commit
launch: mpirun -np N mgbench image --data DIR ...   (one rank per GPU, or per CPU slot;
        SLURM: slurm/image.sbatch, slurm/llm.sbatch)
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (command == "--version") {
    std::cout << "mgbench " << mgbench::build_info::kVersion << " (" << mgbench::build_info::kGitCommit << ", "
              << mgbench::build_info::kBuildType << ", " << mgbench::build_info::kCompiler << ")\n";
    return 0;
  }
  if (command == "image") return mgbench::app::image_main(argc - 1, argv + 1);
  if (command == "report") return mgbench::app::report_main(argc - 1, argv + 1);
  if (command == "llm") return mgbench::app::llm_main(argc - 1, argv + 1);
  if (command == "tokenize") return mgbench::app::tokenize_main(argc - 1, argv + 1);
  if (command == "data") return mgbench::app::data_main(argc - 1, argv + 1);
  if (command == "quantize") return mgbench::app::quantize_main(argc - 1, argv + 1);
  if (command == "comm") return mgbench::app::comm_main(argc - 1, argv + 1);
  if (command == "predict") return mgbench::app::predict_main(argc - 1, argv + 1);
  std::cerr << "mgbench: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
