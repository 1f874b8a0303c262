#include "train/data_parallel.h"

#include <stdexcept>

#include <torch/nn/parallel/data_parallel.h>

namespace mgbench::train {
namespace {

/// A replica as torch::nn::parallel::parallel_apply wants it: `replica->forward(x)`.
struct Replica {
  std::shared_ptr<torch::nn::Module> module;
  const models::ImageClassifier* model;
  Replica* operator->() { return this; }
  torch::Tensor forward(const torch::Tensor& x) { return model->forward(*module, x); }
};

}  // namespace

DataParallel::DataParallel(models::ImageClassifier model, std::vector<torch::Device> devices)
    : model_(std::move(model)), devices_(std::move(devices)) {
  if (devices_.empty()) throw std::invalid_argument("DataParallel: no devices");
  const auto params = model_.module->parameters();
  if (!params.empty() && params.front().device() != devices_.front()) {
    throw std::invalid_argument("DataParallel: the module must be on devices[0] (" + devices_.front().str() +
                                "), not " + params.front().device().str());
  }
}

torch::Tensor DataParallel::forward(const torch::Tensor& x) {
  if (devices_.size() == 1) return model_.forward(*model_.module, x);
  std::vector<torch::Tensor> chunks = x.chunk(static_cast<std::int64_t>(devices_.size()), 0);
  const std::vector<torch::Device> used(devices_.begin(),
                                        devices_.begin() + static_cast<std::ptrdiff_t>(chunks.size()));
  std::vector<Replica> replicas;
  for (auto& module : torch::nn::parallel::replicate(model_.module, used)) replicas.push_back({module, &model_});
  std::vector<torch::Tensor> inputs;
  for (std::size_t i = 0; i < chunks.size(); ++i) inputs.push_back(chunks[i].to(used[i], /*non_blocking=*/true));
  // Each replica runs in its own thread and returns its output on its own device.
  std::vector<torch::Tensor> outputs = torch::nn::parallel::parallel_apply(replicas, inputs, used);
  for (auto& out : outputs) out = out.to(devices_.front());
  {
    // PyTorch's replica on devices[0] shares its buffers with the module: keep its updates.
    torch::NoGradGuard no_grad;
    const auto ours = model_.module->buffers();
    const auto theirs = replicas.front().module->buffers();
    for (std::size_t i = 0; i < ours.size(); ++i) ours[i].copy_(theirs[i]);
  }
  return torch::cat(outputs, 0);
}

}  // namespace mgbench::train
