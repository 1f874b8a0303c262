#pragma once
// A recipe of the tests' own for the training loop (test_loop.cpp on one rank, the MPI tests on
// several): a linear regression whose every step is exact enough to compare runs by.
#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/progress.h"
#include "results/writer.h"
#include "runtime/mpi_communicator.h"
#include "train/loop.h"
#include "train/recipe.h"

namespace mgbench::test {

/// y = 0.5 * sum(x) + 0.1 on `samples` fixed points x [samples, 4], fitted by a Linear(4, 1) in
/// `dtype` (no randomness after the initial weights, which the loop's --seed fixes).
struct LinearRecipeOptions {
  train::LossNormalization normalization = train::LossNormalization::kMeanPerMicroBatch;
  /// The loss adds sum(sqrt(0 * error)), 0 in forward, whose backward divides by 2 sqrt(0) (torch's
  /// sqrt derivative, grad / (2 result)): gradients NaN from a finite loss, as a norm of a zero vector.
  bool sqrt_at_zero = false;
  std::int64_t samples = 32;
  torch::Dtype dtype = torch::kFloat64;
  /// Samples that are no target (a summed loss: their error is left out of the loss and the
  /// normaliser, as masked labels are): index in [masked.first, masked.second) or in `masked_too`.
  std::pair<std::int64_t, std::int64_t> masked{0, 0};
  std::vector<std::int64_t> masked_too;
};

class LinearRecipe final : public train::Recipe {
 public:
  explicit LinearRecipe(LinearRecipeOptions options) : o_(std::move(options)) {}
  explicit LinearRecipe(train::LossNormalization normalization, bool sqrt_at_zero = false)
      : LinearRecipe(with(normalization, sqrt_at_zero)) {}

  void declare(options::OptionTable&) override {}
  void validate(const train::TrainOptions&) const override {}
  void setup(const train::RecipeContext&) override {
    model_ = torch::nn::Linear(4, 1);
    model_->to(o_.dtype);
    x_ = torch::linspace(-1, 1, o_.samples * 4, o_.dtype).reshape({o_.samples, 4}).sin();
    y_ = x_.sum(1, /*keepdim=*/true) * 0.5 + 0.1;
    target_ = torch::ones({o_.samples, 1}, o_.dtype);
    if (o_.masked.second > o_.masked.first)
      target_.narrow(0, o_.masked.first, o_.masked.second - o_.masked.first).zero_();
    for (const std::int64_t i : o_.masked_too) target_[i] = 0;
  }
  std::int64_t train_size() const override { return o_.samples; }
  data::Batch assemble(const data::PlannedBatch& plan, bool) const override {
    const torch::Tensor index = torch::tensor(plan.indices, torch::kInt64);
    data::Batch batch;
    batch.tensors = {x_.index_select(0, index), y_.index_select(0, index), target_.index_select(0, index)};
    batch.samples = static_cast<std::int64_t>(plan.indices.size());
    batch.loss_targets = static_cast<std::int64_t>(batch.tensors[2].sum().item<double>());  // the unmasked samples
    return batch;
  }
  torch::nn::Module& model() override { return *model_; }
  std::vector<torch::Tensor> trainable_parameters() override { return model_->parameters(); }
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, torch::Tensor>> all;
    for (const auto& p : model_->named_parameters()) all.emplace_back(p.key(), p.value());
    return all;
  }
  train::LossNormalization loss_normalization() const override { return o_.normalization; }
  train::MicroBatchLoss forward(const data::Batch& batch) override {
    const torch::Tensor error = (model_->forward(batch.tensors[0]) - batch.tensors[1]).pow(2);
    const torch::Tensor metrics = torch::stack({error.mean().detach(), torch::full({}, 7.0, error.options())});
    const torch::Tensor extra = o_.sqrt_at_zero ? (error * 0).sqrt().sum() : torch::zeros({}, error.options());
    if (o_.normalization == train::LossNormalization::kMeanPerMicroBatch) return {error.mean() + extra, metrics};
    return {(error * batch.tensors[2]).sum() + extra, metrics};
  }
  std::vector<std::string> metric_names() const override { return {"mse", "seven"}; }
  h5::Attributes attributes() const override { return {}; }

 private:
  static LinearRecipeOptions with(train::LossNormalization normalization, bool sqrt_at_zero) {
    LinearRecipeOptions o;
    o.normalization = normalization;
    o.sqrt_at_zero = sqrt_at_zero;
    return o;
  }
  LinearRecipeOptions o_;
  torch::nn::Linear model_{nullptr};
  torch::Tensor x_, y_, target_;
};

/// The loop's options of these tests: the CPU, lr 0.1 constant, no shuffling, one thread, one
/// epoch; results into `results`.
inline train::TrainOptions linear_options(const std::string& results) {
  train::TrainOptions t;
  t.device = runtime::DeviceRequest::kCpu;
  t.optim.lr = 0.1;
  t.optim.lr_schedule = train::LrSchedule::kConstant;
  t.epochs = 1;
  t.shuffle = false;
  t.threads = 1;
  t.results = results;
  return t;
}

/// Runs recipe through the training loop with options t on the ranks of comm (every one of them
/// calls it), the run written to t.results; returns the trained parameters, flattened.
inline torch::Tensor train_linear(LinearRecipe& recipe, const train::TrainOptions& t, MPI_Comm comm) {
  runtime::MpiCommunicator communicator(comm);
  train::TrainingLoop loop(t, recipe, communicator, {}, {});
  results::ResultsWriter writer(t.results, comm, "linear", loop.run_attributes(), loop.rank_attributes(),
                                loop.layout());
  Progress quiet(false, "samples/s");
  train::RunControl control;
  loop.run(writer, quiet, control);
  writer.finish(results::kStatusCompleted);
  std::vector<torch::Tensor> flat;
  for (const auto& p : recipe.trainable_parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(flat);
}

}  // namespace mgbench::test
