#include "train/recipes/data_parallel.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ThreadLocalState.h>
#include <torch/nn/parallel/data_parallel.h>

namespace mgbench::train {

DataParallel::DataParallel(std::shared_ptr<models::ImageClassifier> model, std::vector<torch::Device> devices)
    : model_(std::move(model)), devices_(std::move(devices)) {
  if (devices_.empty()) throw std::invalid_argument("DataParallel: no devices");
  const auto params = model_->module().parameters();
  if (!params.empty() && params.front().device() != devices_.front()) {
    throw std::invalid_argument("DataParallel: the module must be on devices[0] (" + devices_.front().str() +
                                "), not " + params.front().device().str());
  }
  // Cloning re-runs the model's initialisation, which draws from the CPU generator; Python's
  // replicate draws nothing, so neither does this: the generator's state is put back.
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  const torch::Tensor rng = [&] {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    return cpu.get_state();
  }();
  for (std::size_t i = 1; i < devices_.size(); ++i) replicas_.push_back(model_->clone_classifier(devices_[i]));
  std::lock_guard<std::mutex> lock(cpu.mutex());
  cpu.set_state(rng);
}

void DataParallel::refresh(std::size_t used) {
  {
    torch::NoGradGuard no_grad;
    torch::nn::Module& model = model_->module();
    const auto params = model.parameters();
    const auto buffers = model.buffers();
    const auto modules = model.modules();
    for (std::size_t r = 0; r < used; ++r) {
      torch::nn::Module& replica = replicas_[r]->module();
      const auto replica_params = replica.parameters();
      const auto replica_buffers = replica.buffers();
      for (std::size_t i = 0; i < params.size(); ++i) replica_params[i].copy_(params[i], /*non_blocking=*/true);
      for (std::size_t i = 0; i < buffers.size(); ++i) replica_buffers[i].copy_(buffers[i], /*non_blocking=*/true);
      // Pre-order, so a module's own train() (which may set its children) is overridden by theirs.
      const auto replica_modules = replica.modules();
      for (std::size_t i = 0; i < modules.size(); ++i) replica_modules[i]->train(modules[i]->is_training());
    }
  }
  std::vector<std::shared_ptr<torch::nn::Module>> active;
  for (std::size_t r = 0; r < used; ++r) active.push_back(replicas_[r]->module().shared_from_this());
  const std::vector<torch::Device> where(devices_.begin() + 1,
                                         devices_.begin() + 1 + static_cast<std::ptrdiff_t>(used));
  torch::nn::replicate_grad_edges(model_->module().shared_from_this(), active, where);
}

torch::Tensor DataParallel::forward(const torch::Tensor& x) {
  if (devices_.size() == 1) return model_->forward(x);
  const std::vector<torch::Tensor> chunks = x.chunk(static_cast<std::int64_t>(devices_.size()), 0);
  const std::size_t used = chunks.size() - 1;  // replicas this batch needs
  refresh(used);

  // Python's parallel_apply: each replica on its own thread, under the caller's thread-local state
  // (autocast and its dtype, grad mode) with the caller's current stream of its device.
  const at::ThreadLocalState state;
  std::vector<torch::Tensor> outputs(chunks.size());
  std::vector<std::exception_ptr> errors(chunks.size());
  std::vector<std::thread> threads;
  threads.reserve(used);
  for (std::size_t r = 0; r < used; ++r) {
    const torch::Device device = devices_[r + 1];
    std::optional<c10::Stream> stream;
    if (device.is_cuda()) stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
    threads.emplace_back([&, r, device, stream] {
      try {
        const at::ThreadLocalStateGuard guard(state);
        c10::OptionalDeviceGuard device_guard;
        c10::OptionalStreamGuard stream_guard;
        if (stream) {
          device_guard.reset_device(device);
          stream_guard.reset_stream(*stream);
        }
        outputs[r + 1] = replicas_[r]->forward(chunks[r + 1].to(device, /*non_blocking=*/true));
      } catch (...) {
        errors[r + 1] = std::current_exception();
      }
    });
  }
  try {
    outputs[0] = model_->forward(chunks[0]);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (auto& out : outputs) out = out.to(devices_.front());
  return torch::cat(outputs, 0);
}

}  // namespace mgbench::train
