// Fully sharded data parallelism (train/parallel/fsdp.h) under mpirun: the shards' gradients against a
// replicated model's averaged gradients, and whole recipes trained with --sharding fsdp against
// the same recipes with --sharding none at the same world size.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "models/llama.h"
#include "models/log_probs.h"
#include "models/safetensors.h"
#include "mpi_support.h"
#include "runtime/mpi_communicator.h"
#include "train/optim/grad_scaler.h"
#include "train/optim/optimizer.h"
#include "train/parallel/fsdp.h"
#include "train/tensor_export.h"

namespace mgbench {
namespace {

using test::flat;
using test::Settings;
using test::SharedDir;
using test::world_rank;
using test::world_size;

/// A cross-entropy of next tokens, summed (so the averaged gradient is the mean of the ranks'), as
/// the recipes compute it: the head's log-probabilities of the targets (models::target_log_probs,
/// which under FSDP hands an untied head's gradient over by rows, as the embedding lookup does).
torch::Tensor next_token_loss(models::LlamaForCausalLMImpl& model, const torch::Tensor& tokens) {
  const std::int64_t t = tokens.size(1) - 1;
  const torch::Tensor hidden = model.hidden_states(tokens).narrow(1, 0, t);
  const models::LlamaForCausalLMImpl::OutputProjection head =
      model.output_projection(hidden.reshape({-1, hidden.size(-1)}));
  return -models::target_log_probs(head.input, head.weight, tokens.narrow(1, 1, t).reshape({-1}), 1000,
                                   models::FrozenHeadGradient::kAuto, head.weight_gradient)
              .sum();
}

/// Tied or untied embeddings, resharded after forward or kept.
class FsdpLlama : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// Full fine-tuning of a tiny fp64 Llama, two micro-batches of different tokens on each rank: each
// rank's shard gradients are its rows (torch.chunk's) of the replicated model's gradients summed
// over the micro-batches and averaged over the ranks, and its padding rows are zero.
TEST_P(FsdpLlama, ShardGradientsAreTheAveragedReplicatedGradientsRows) {
  const auto [tied, reshard] = GetParam();
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  models::LlamaConfig c = models::LlamaConfig::preset("tiny");
  c.vocab_size = 250;  // 250 rows: uneven over 3 and 4 ranks (FSDP's padding)
  c.num_hidden_layers = 3;
  c.tie_word_embeddings = tied;
  const auto build = [&c] {
    torch::manual_seed(11);
    models::LlamaForCausalLM m(c);
    m->to(torch::kFloat64);
    return m;
  };
  models::LlamaForCausalLM sharded = build();
  models::LlamaForCausalLM replica = build();
  train::FullyShardedUnits fsdp(*sharded, comm, reshard);
  EXPECT_EQ(fsdp.num_units(), 3 + 2 + (tied ? 0 : 1));

  constexpr int kMicroBatches = 2;
  for (int k = 0; k < kMicroBatches; ++k) {
    torch::manual_seed(1000 + 10 * world_rank() + k);
    const torch::Tensor tokens = torch::randint(c.vocab_size, {2, 7}, torch::kInt64);
    next_token_loss(*sharded, tokens).backward();
    fsdp.finish_backward();
    next_token_loss(*replica, tokens).backward();
  }
  const int world = world_size();
  // The collectives issued are those micro_batch_collectives plans (what `mgbench predict` prices).
  const train::CollectiveTotals totals = fsdp.take_collectives();
  const train::MicroBatchCollectives planned =
      train::micro_batch_collectives(train::unit_shapes(sharded->parameter_units()), world, 8, reshard);
  const auto sum = [](const std::vector<std::int64_t>& v) {
    return std::accumulate(v.begin(), v.end(), std::int64_t{0});
  };
  EXPECT_EQ(totals.allgather_bytes, kMicroBatches * sum(planned.all_gather_bytes));
  EXPECT_EQ(totals.reducescatter_bytes, kMicroBatches * sum(planned.reduce_scatter_bytes));
  // An untied embedding and head whose rows the ranks divide (250 over 2) are reduce-scattered in
  // RowGradientBlocks' blocks (models/row_gradient.h), every other unit whole.
  const bool by_rows = !tied && c.vocab_size % world == 0;
  const std::int64_t blocks =
      train::RowGradientBlocks::of(train::ShardLayout::of({c.vocab_size, c.hidden_size}, world)).blocks;
  if (by_rows) {
    EXPECT_EQ(blocks, 16);  // 125 rows a rank, 8 a block
  }
  EXPECT_EQ(planned.reduce_scatter_bytes.size(),
            static_cast<std::size_t>(fsdp.num_units() + (by_rows ? 2 * (blocks - 1) : 0)));
  // Resharding, every unit but two is gathered again in backward: the root, and the head (tied: the
  // embedding, which the head uses last) are kept; and untied, the embedding, whose backward reads
  // no weights (ParameterUnit::backward_reads_parameters).
  EXPECT_EQ(planned.all_gather_bytes.size(),
            static_cast<std::size_t>(fsdp.num_units()) * (reshard ? 2 : 1) - (reshard ? (tied ? 2 : 3) : 0));
  const auto sharded_params = sharded->named_parameters();
  const auto replica_params = replica->named_parameters();
  ASSERT_EQ(sharded_params.size(), replica_params.size());
  for (std::size_t i = 0; i < sharded_params.size(); ++i) {
    const std::string& name = sharded_params[i].key();
    torch::Tensor expected = replica_params[i].value().grad().detach().clone().contiguous();
    comm.all_reduce(expected, runtime::ReduceOp::kSum)->wait();
    expected /= world;
    const torch::Tensor shard = fsdp.shard_of(sharded_params[i].value());
    ASSERT_TRUE(shard.defined()) << name;
    ASSERT_TRUE(shard.grad().defined()) << name;
    const train::ShardLayout l = train::ShardLayout::of(expected.sizes(), world);
    const std::int64_t rows = l.valid_rows(world_rank());
    const torch::Tensor grad = shard.grad().reshape({l.chunk_rows, l.row_numel});
    if (rows > 0) {
      const torch::Tensor mine = expected.reshape({l.rows, l.row_numel}).narrow(0, l.first_row(world_rank()), rows);
      const double scale = std::max(1.0, mine.abs().max().item<double>());
      EXPECT_LT((grad.narrow(0, 0, rows) - mine).abs().max().item<double>(), 1e-10 * scale)
          << name << " on rank " << world_rank() << " of " << world;
    }
    if (rows < l.chunk_rows) {
      EXPECT_EQ(grad.narrow(0, rows, l.chunk_rows - rows).abs().max().item<double>(), 0.0) << name << " padding";
    }
    // The whole parameter is freed after backward (its storage holds nothing until the next gather).
    EXPECT_EQ(sharded_params[i].value().storage().nbytes(), 0U) << name;
    EXPECT_FALSE(sharded_params[i].value().grad().defined()) << name;
  }
  // Exported a unit at a time (each tensor written by rank 0 while its unit is gathered, then freed
  // again), the file has the bytes write_safetensors writes from the whole model.
  const SharedDir dir;
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  train::write_tensor_exports({{dir.file("streamed/model.safetensors"), sharded->hf_state_dict(), metadata}}, &fsdp,
                              world_rank() == 0);
  for (const auto& p : sharded_params) EXPECT_EQ(p.value().storage().nbytes(), 0U) << p.key() << " left gathered";
  // Gathered again, the parameters are the replica's (nothing trained them).
  fsdp.gather_all();
  if (world_rank() == 0) {
    models::write_safetensors(dir.file("whole.safetensors"), sharded->hf_state_dict(), metadata);
    const auto bytes = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string streamed = bytes(dir.file("streamed/model.safetensors"));
    EXPECT_GT(streamed.size(), 1000U);
    EXPECT_TRUE(streamed == bytes(dir.file("whole.safetensors"))) << "the streamed export differs from the whole one";
  }
  for (std::size_t i = 0; i < sharded_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(sharded_params[i].value(), replica_params[i].value())) << sharded_params[i].key();
  }
  fsdp.reshard_all();
}

INSTANTIATE_TEST_SUITE_P(Units, FsdpLlama, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
                           return std::string(std::get<0>(info.param) ? "Tied" : "Untied") +
                                  (std::get<1>(info.param) ? "Reshard" : "Keep");
                         });

std::string tiny_llama() { return test::oracle_dir() + "/llama_tiny_2256"; }

/// A config.json-only Llama (--init random) whose NF4 projections hold 4 or 8 quantisation-factor
/// blocks (hidden 256, MLP 512: [256, 256] and [512, 256] weights of 16,384-element blocks), so
/// that 2 and 4 ranks shard them in whole blocks and 3 cannot. Written into dir by rank 0.
std::string nf4_shardable_llama(const SharedDir& dir) {
  const std::string path = dir.file("nf4_llama");
  if (world_rank() == 0) {
    std::filesystem::create_directories(path);
    std::ofstream(path + "/config.json")
        << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 2256, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "max_position_embeddings": 1024, "tie_word_embeddings": false,
              "torch_dtype": "float32"})";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// --eval-only over rows that do not split evenly: the ranks run as many batches as the largest
// shard (the gathers are collective) and the loss is the replicated run's.
TEST(FsdpRun, EvaluationOfAnUnevenSplitIsTheReplicatedOne) {
  MGBENCH_REQUIRE_INPUTS(test::llm_inputs(tiny_llama()));
  SharedDir dir;
  const auto eval_loss = [&](const std::string& sharding) {
    auto config = test::lora_config(
        tiny_llama(), 2, dir.file("eval.h5"),
        {{"eval-only", "true"}, {"sharding", sharding}, {"limit", std::to_string(4 * world_size() + 1)}});
    return test::train_run(MPI_COMM_WORLD, *config, dir.file(sharding + ".h5")).summary.eval_loss;
  };
  const double replicated = eval_loss("none");
  const double sharded = eval_loss("fsdp");
  EXPECT_TRUE(std::isfinite(replicated));
  EXPECT_EQ(sharded, replicated);
}

std::int64_t attribute(const train::TrainingLoop& loop, const std::string& name) {
  for (const auto& [key, value] : loop.run_attributes()) {
    if (key == name) return std::get<std::int64_t>(value);
  }
  ADD_FAILURE() << "no run attribute " << name;
  return -1;
}

// The memory attributes of full fine-tuning (fp32, AdamW) equal the sizes computed from the
// model's config.json: each parameter's rows ceil(rows / N) x 4 bytes, the two largest layers and
// the kept root and head gathered at the peak, the two largest units' whole gradients beside the
// shards' (replicated: DDP's buckets, a copy of every gradient); AdamW's two states per trained
// element.
TEST(FsdpRun, MemoryAttributesAreTheShardSizes) {
  MGBENCH_REQUIRE_INPUTS(test::llm_inputs(tiny_llama()));
  SharedDir dir;
  const models::LlamaConfig c = models::LlamaConfig::from_hf_json(tiny_llama() + "/config.json");
  ASSERT_FALSE(c.tie_word_embeddings);
  const std::int64_t n = world_size();
  const std::int64_t h = c.hidden_size;
  const auto shard = [n](std::int64_t rows, std::int64_t row_numel) { return (rows + n - 1) / n * row_numel * 4; };
  const std::int64_t q = c.num_attention_heads * c.head_dim;
  const std::int64_t kv = c.num_key_value_heads * c.head_dim;
  const std::int64_t f = c.intermediate_size;
  const std::int64_t layer_shards =
      2 * shard(h, 1) + shard(q, h) + 2 * shard(kv, h) + shard(h, q) + 2 * shard(f, h) + shard(h, f);
  const std::int64_t layer_bytes = 4 * (2 * h + q * h + 2 * kv * h + h * q + 3 * f * h);
  const std::int64_t embedding = 4 * c.vocab_size * h;
  const std::int64_t shards = 2 * shard(c.vocab_size, h) + c.num_hidden_layers * layer_shards + shard(h, 1);
  // Kept: the root (norm) and the head; the two largest others: two layers (the embedding is
  // smaller here) -- or, were it larger, the embedding and a layer.
  const std::int64_t largest_two = embedding > layer_bytes ? embedding + layer_bytes : 2 * layer_bytes;
  const std::int64_t gathered = 4 * h + embedding + largest_two;
  // The whole gradients of the two largest trained units, padded as reduce-scattered: the head
  // and the embedding ([vocab, h] each, padded alike) or a layer. Where the ranks divide the
  // vocabulary, the embedding's and the head's are reduce-scattered in blocks of a sixteenth of
  // each rank's rows (RowGradientBlocks): a block each.
  const std::int64_t vocab_rows = (c.vocab_size + n - 1) / n;
  const std::int64_t vocab_gradient =
      c.vocab_size % n == 0 ? (vocab_rows + 15) / 16 * n * h * 4 : shard(c.vocab_size, h) * n;
  std::vector<std::int64_t> trained_units(2, vocab_gradient);  // the embedding, the head
  trained_units.push_back(shard(h, 1) * n);                    // the root (norm)
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) trained_units.push_back(layer_shards * n);
  std::sort(trained_units.rbegin(), trained_units.rend());
  const std::int64_t whole_gradients = trained_units[0] + trained_units[1];

  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  auto config = test::llm_config("full", tiny_llama(), 2, dir.file("m.h5"), {{"optimizer", "adamw"}});
  config->validate();
  const train::TrainingLoop fsdp(config->train, *config->recipe, comm, {}, {});
  EXPECT_EQ(attribute(fsdp, "parameter_bytes_per_rank"), shards + gathered);
  EXPECT_EQ(attribute(fsdp, "gradient_bytes_per_rank"), shards + whole_gradients);
  EXPECT_EQ(attribute(fsdp, "optimizer_state_bytes_per_rank"), 2 * shards);
  EXPECT_EQ(attribute(fsdp, "fsdp_units"), c.num_hidden_layers + 3);

  auto replicated_config =
      test::llm_config("full", tiny_llama(), 2, dir.file("m.h5"), {{"optimizer", "adamw"}, {"sharding", "none"}});
  replicated_config->validate();
  const train::TrainingLoop none(replicated_config->train, *replicated_config->recipe, comm, {}, {});
  const std::int64_t whole = 2 * embedding + c.num_hidden_layers * layer_bytes + 4 * h;
  EXPECT_EQ(attribute(none, "parameter_bytes_per_rank"), whole);
  EXPECT_EQ(attribute(none, "gradient_bytes_per_rank"), world_size() > 1 ? 2 * whole : whole);
  EXPECT_EQ(attribute(none, "optimizer_state_bytes_per_rank"), 2 * whole);
  EXPECT_EQ(attribute(none, "fsdp_units"), 0);

  // `--dry-run`'s plan, from config.json alone, is what the runs record.
  for (const auto* c : {config.get(), replicated_config.get()}) {
    const train::TrainingLoop& loop = c == config.get() ? fsdp : none;
    const std::vector<train::MemoryPlanRow> plan = c->recipe->memory_plan(c->train, {world_size()});
    ASSERT_EQ(plan.size(), 1U);
    EXPECT_EQ(plan[0].sharded, c == config.get());
    EXPECT_EQ(plan[0].parameter_bytes, attribute(loop, "parameter_bytes_per_rank"));
    EXPECT_EQ(plan[0].gradient_bytes, attribute(loop, "gradient_bytes_per_rank"));
    EXPECT_EQ(plan[0].optimizer_state_bytes, attribute(loop, "optimizer_state_bytes_per_rank"));
  }
  // And for LoRA's adapters over a frozen base.
  auto lora = test::llm_config("lora", tiny_llama(), 2, dir.file("m.h5"));
  lora->validate();
  const train::TrainingLoop lora_loop(lora->train, *lora->recipe, comm, {}, {});
  const std::vector<train::MemoryPlanRow> lora_plan = lora->recipe->memory_plan(lora->train, {world_size()});
  EXPECT_EQ(lora_plan.at(0).parameter_bytes, attribute(lora_loop, "parameter_bytes_per_rank"));
  EXPECT_EQ(lora_plan.at(0).gradient_bytes, attribute(lora_loop, "gradient_bytes_per_rank"));
  // And QLoRA's NF4 base, packed (codes, scalers, factors: 0.5 + 1/64 + 4/16384 bytes a weight in
  // fp32), each rank holding 1/N of it and the units gathered at the peak whole.
  if (4 % world_size() != 0) return;
  // Written once: rewritten for the second case, rank 0 truncated config.json while another rank
  // still read it for the first one's memory plan (mpi_np2: "not valid JSON ... unexpected end of input").
  const std::string nf4_model = nf4_shardable_llama(dir);
  for (const char* sharding : {"fsdp", "none"}) {
    auto qlora =
        test::llm_config("qlora", nf4_model, 2, dir.file("q.h5"), {{"init", "random"}, {"sharding", sharding}});
    qlora->validate();
    const train::TrainingLoop loop(qlora->train, *qlora->recipe, comm, {}, {});
    const std::vector<train::MemoryPlanRow> plan = qlora->recipe->memory_plan(qlora->train, {world_size()});
    EXPECT_EQ(plan.at(0).parameter_bytes, attribute(loop, "parameter_bytes_per_rank")) << sharding;
    EXPECT_EQ(plan.at(0).gradient_bytes, attribute(loop, "gradient_bytes_per_rank")) << sharding;
    // Sharded, every NF4 part's storage is freed until its unit is gathered (the shards held apart).
    std::int64_t packed = 0, held = 0;
    for (const models::ParameterUnit& u : qlora->recipe->shardable_model()->parameter_units()) {
      for (const models::PackedWeight& w : u.packed) {
        for (const torch::Tensor& part : w.parts) {
          packed += static_cast<std::int64_t>(part.nbytes());
          held += static_cast<std::int64_t>(part.storage().nbytes());
        }
      }
    }
    EXPECT_GT(packed, 0);
    EXPECT_EQ(held, std::string(sharding) == "fsdp" && world_size() > 1 ? 0 : packed) << sharding;
    if (std::string(sharding) == "none") {
      const std::int64_t weights = 2 * (4 * 256 * 256 + 3 * 512 * 256);  // NF4 elements
      const std::int64_t nf4 = weights / 2 + weights / 64 + weights / 16384 * 4;
      const std::int64_t dense = 4 * (2 * 2256 * 256 + 2 * 2 * 256 + 256);
      // The adapters' gradients, counted twice over several ranks (DDP's buckets hold a copy).
      const std::int64_t adapters = attribute(loop, "gradient_bytes_per_rank") / (world_size() > 1 ? 2 : 1);
      EXPECT_EQ(attribute(loop, "parameter_bytes_per_rank"), nf4 + dense + adapters);
    }
  }
}

struct RecipeCase {
  const char* recipe;
  Settings settings;
  double tolerance;    // max |fsdp - none| of the trained parameters
  double moved = 100;  // training must move them by more than this x the tolerance
};

class FsdpRun : public ::testing::TestWithParam<RecipeCase> {};

// The recipe trained with --sharding fsdp equals it trained with --sharding none at the same
// world size: the gradients are the same averages (reduce-scattered instead of all-reduced), the
// optimizer's update is elementwise, the clipping norm the same global one. And training moved
// the parameters by far more than the tolerance (a run that trains nothing would not pass).
TEST_P(FsdpRun, TrainsWhatTheReplicatedRunTrains) {
  const RecipeCase& rc = GetParam();
  const bool qlora = std::string(rc.recipe) == "qlora";
  SharedDir dir;
  const std::string model = qlora ? nf4_shardable_llama(dir) : tiny_llama();
  MGBENCH_REQUIRE_INPUTS(test::llm_inputs(model));
  const auto trained = [&](const std::string& sharding, const Settings& extra) {
    Settings settings;
    for (const auto& setting : rc.settings) {
      // --reshard-after-forward only with --sharding fsdp: the replicated run leaves it out.
      if (setting.first != "reshard-after-forward" || sharding == "fsdp") settings.push_back(setting);
    }
    if (qlora) settings.emplace_back("init", "random");
    settings.emplace_back("sharding", sharding);
    settings.insert(settings.end(), extra.begin(), extra.end());
    auto config = test::llm_config(rc.recipe, model, 2, dir.file("run.h5"), settings);
    return test::train_run(MPI_COMM_WORLD, *config, dir.file(sharding + ".h5"));
  };
  if (qlora && 4 % world_size() != 0) {
    // NF4 is sharded in whole quantisation blocks, evenly (torchao's NF4Tensor): 4 blocks, 3 ranks.
    test::expect_error<mgbench::ConfigError>(
        [&] { trained("fsdp", {}); },
        {"--sharding fsdp over 3 ranks", "model.layers.0.self_attn.q_proj.weight [256, 256]", "4 quantisation blocks",
         "--sharding none"});
    return;
  }
  const test::Trained none = trained("none", {});
  const test::Trained fsdp = trained("fsdp", {});
  const test::Trained untrained = trained("fsdp", {{"lr", "1e-12"}});
  const torch::Tensor a = flat(fsdp.parameters);
  const torch::Tensor b = flat(none.parameters);
  ASSERT_EQ(a.numel(), b.numel());
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, rc.tolerance) << rc.recipe << ": max |fsdp - none| on rank " << world_rank();
  EXPECT_GT((flat(untrained.parameters) - b).abs().max().item<double>(), rc.moved * rc.tolerance + 1e-7)
      << rc.recipe << ": training moved nothing";
  EXPECT_NEAR(fsdp.summary.final_loss, none.summary.final_loss, 1e-5 + rc.tolerance);
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  EXPECT_EQ(test::max_difference_across_ranks(comm, a), 0.0) << "the gathered parameters differ between ranks";
}

// Loss scaling over gradient shards: one rank's non-finite shard makes every rank skip the step and
// back off the scale (torch's ShardedGradScaler); all finite, every rank steps.
TEST(FsdpGradScaler, RanksAgreeOnANonFiniteShard) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  torch::Tensor w = torch::ones({4}, torch::TensorOptions().requires_grad(true));
  torch::optim::SGD sgd(std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.1));
  train::GradScaler scaler({}, &comm);
  for (const bool poison : {false, true}) {
    w.mutable_grad() = torch::full({4}, 65536.0);  // 1.0 at the initial scale
    if (poison && world_rank() == world_size() - 1) w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(scaler.step(sgd), !poison) << "rank " << world_rank();
    scaler.update();
  }
  EXPECT_TRUE(torch::allclose(w.detach(), torch::full({4}, 0.9))) << w;  // the first step only
  EXPECT_EQ(scaler.get_scale(), 32768.0);                                // backed off once, on every rank
}

// Clipping over gradient shards where only rank 0's shard has a gradient (the others' stayed
// undefined): every rank sends its square of the norm in the parameters' float64, so the norm is
// rank 0's alone, on every rank, and rank 0's gradient is clipped by it. (The norm's dtype once came
// from the gradients: a rank without one sent a float32 zero into its peers' float64 all-reduce.)
TEST(FsdpClipGradNorm, ARankWithoutGradientsSendsThePeersDtype) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  torch::Tensor shard = torch::zeros({2}, torch::TensorOptions(torch::kFloat64).requires_grad(true));
  if (world_rank() == 0) shard.mutable_grad() = torch::tensor({3.0, 4.0}, torch::kFloat64);
  const torch::Tensor norm = train::clip_grad_norm({shard}, 1.0, &comm);
  EXPECT_EQ(norm.scalar_type(), torch::kFloat64) << "rank " << world_rank();
  EXPECT_DOUBLE_EQ(norm.item<double>(), 5.0) << "rank " << world_rank();
  if (world_rank() == 0) {
    EXPECT_TRUE(torch::allclose(shard.grad(), torch::tensor({0.6, 0.8}, torch::kFloat64), 1e-6, 0)) << shard.grad();
  } else {
    EXPECT_FALSE(shard.grad().defined());
  }
  EXPECT_THROW(train::clip_grad_norm({}, 1.0, &comm), std::invalid_argument);
}
// The image recipe's MobileNetV2 sharded in its units (the root: stem, last convolution and
// classifier; each inverted-residual block) trains what the replicated (DDP) run trains: fp64, both
// memory formats (channels_last convolution weights keep their strides and are regathered through
// them), BatchNorm in training mode, its running statistics broadcast from rank 0 in both. Three
// steps of one epoch and an evaluation: at 3 ranks FSDP2's fp64 divide (by 2 before the sum, 1.5
// after) and DDP's (the sum / 3) differ by an ulp, and training-mode BatchNorm on 8-image batches
// grows such a difference ~1000x a step (1e-15 after the second step, 1e-4 after the eighth).
// amp-fp16 (fp32 weights, loss scaling) too: its first steps overflow fp16 at the initial scale
// and are skipped on every rank alike (the scaler agrees on non-finite shards) until the scale has
// backed off; BatchNorm frozen there, ten steps.
struct ImageCase {
  bool channels_last;
  const char* precision;
  double tolerance;
  const char* steps;
  const char* freeze_batchnorm;
};
class FsdpImage : public ::testing::TestWithParam<ImageCase> {};

TEST_P(FsdpImage, TrainsWhatTheReplicatedRunTrains) {
  MGBENCH_REQUIRE_INPUTS(test::mnist_dir());
  const auto [channels_last, precision, tolerance, steps, freeze_batchnorm] = GetParam();
  SharedDir dir;
  const auto trained = [&](const std::string& sharding, const std::string& lr) {
    auto config = test::small_config("ddp-ds", 8,
                                     {{"precision", precision},
                                      {"sharding", sharding},
                                      {"lr", lr},
                                      {"channels-last", channels_last ? "true" : "false"},
                                      {"epochs", "1"},
                                      {"max-steps", steps},
                                      {"freeze-batchnorm", freeze_batchnorm}});
    return test::train_run(MPI_COMM_WORLD, *config, dir.file(sharding + ".h5"));
  };
  const test::Trained none = trained("none", "0.02");
  const test::Trained fsdp = trained("fsdp", "0.02");
  const test::Trained untrained = trained("fsdp", "1e-12");
  const torch::Tensor a = flat(fsdp.parameters);
  const torch::Tensor b = flat(none.parameters);
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_LE((a - b).abs().max().item<double>(), tolerance) << "max |fsdp - none| on rank " << world_rank();
  EXPECT_LE((flat(fsdp.buffers) - flat(none.buffers)).abs().max().item<double>(), tolerance) << "BatchNorm statistics";
  EXPECT_GT((flat(untrained.parameters) - b).abs().max().item<double>(), 100 * tolerance) << "training moved nothing";
  EXPECT_NEAR(fsdp.summary.final_loss, none.summary.final_loss, tolerance);
  // The trained model keeps the memory format it was given.
  for (const auto& p : fsdp.parameters) {
    if (p.dim() == 4 && p.size(1) > 1 && p.size(2) * p.size(3) > 1) {
      EXPECT_EQ(p.is_contiguous(torch::MemoryFormat::ChannelsLast), channels_last) << p.sizes();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Images, FsdpImage,
                         ::testing::Values(ImageCase{false, "fp64", 1e-10, "3", "false"},
                                           ImageCase{true, "fp64", 1e-10, "3", "false"},
                                           ImageCase{false, "amp-fp16", 1e-6, "10", "true"}),
                         [](const ::testing::TestParamInfo<ImageCase>& info) {
                           std::string name = std::string(info.param.channels_last ? "ChannelsLast" : "Contiguous") +
                                              info.param.precision;
                           std::erase(name, '-');
                           return name;
                         });

// One rank: --sharding fsdp shards nothing and is the replicated run, bitwise (each rank of the
// world trains alone here).
TEST(FsdpRun, OneRankIsTheReplicatedRunBitwise) {
  const std::string model = tiny_llama();
  MGBENCH_REQUIRE_INPUTS(test::llm_inputs(model));
  test::TempDir dir;
  const auto trained = [&](const std::string& sharding) {
    auto config = test::llm_config("full", model, 2, dir.file(sharding + ".h5"), {{"sharding", sharding}});
    return test::train_run(MPI_COMM_SELF, *config, dir.file(sharding + ".h5"));
  };
  const test::Trained fsdp = trained("fsdp");
  const test::Trained none = trained("none");
  EXPECT_TRUE(torch::equal(flat(fsdp.parameters), flat(none.parameters)));
  EXPECT_EQ(fsdp.summary.final_loss, none.summary.final_loss);
}

// bf16 (QLoRA as TorchTune runs it): FSDP reduce-scatters after each micro-batch and sums the
// shards' gradients, DDP sums locally then all-reduces -- another order, in 8 significant bits: the
// weights differ by a bf16 ulp or two (5e-4 at 2 ranks here), so SGD (AdamW would turn an ulp of a
// near-zero gradient into a step of lr) and a tolerance of 2 ulps at 0.25.
// fp32 sums of two ranks are order-free, of three not quite (Open MPI's all-reduce and
// reduce-scatter add in other orders): a tolerance far under one step of the learning rate.
INSTANTIATE_TEST_SUITE_P(
    Recipes, FsdpRun,
    ::testing::Values(
        RecipeCase{"lora", {}, 2e-6},
        RecipeCase{"lora", {{"optimizer", "sgd"}, {"momentum", "0"}, {"lr", "0.5"}}, 2e-6},
        RecipeCase{"full", {{"clip-grad-norm", "0.05"}, {"reshard-after-forward", "false"}}, 2e-6},
        RecipeCase{"qat", {{"qat-group-size", "32"}, {"precision", "fp64"}}, 1e-10}, RecipeCase{"qlora", {}, 2e-6},
        RecipeCase{"dpo", {}, 2e-6},
        RecipeCase{"qlora", {{"precision", "bf16"}, {"optimizer", "sgd"}, {"momentum", "0"}, {"lr", "2"}}, 2e-3, 20}),
    [](const ::testing::TestParamInfo<RecipeCase>& info) {
      std::string name = std::string(info.param.recipe) + std::to_string(info.index);
      std::erase(name, '-');
      return name;
    });

}  // namespace
}  // namespace mgbench
