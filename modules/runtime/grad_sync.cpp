#include "runtime/grad_sync.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"
#include "profile/nvtx.h"

namespace mgbench::runtime {
namespace {

// The C++ twin of Tensor.register_post_accumulate_grad_hook: runs once the parameter's .grad
// holds the gradient of this backward (after accumulation of every use of the parameter).
class ReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(GradSync* sync, std::size_t index) : sync_(sync), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { sync_->mark_ready(index_); }

 private:
  GradSync* sync_;
  std::size_t index_;
};

}  // namespace

std::vector<BucketAssignment> GradSync::assign(const std::vector<torch::Tensor>& params,
                                               const GradSyncOptions& options) {
  std::vector<TensorSize> sizes;
  for (const auto& p : params) {
    MGBENCH_REQUIRE(p.requires_grad(), CommError, "GradSync: a parameter does not require grad");
    sizes.push_back({static_cast<std::size_t>(p.numel()) * p.element_size(), static_cast<int>(p.scalar_type())});
  }
  return assign_buckets(sizes, options.first_bucket_bytes, options.bucket_bytes);
}

GradSync::GradSync(std::vector<torch::Tensor> params, Communicator& comm, GradSyncOptions options)
    : params_(std::move(params)),
      comm_(comm),
      as_bucket_view_(options.gradient_as_bucket_view),
      hooked_(options.launch_in_backward) {
  assignment_ = assign(params_, options);
  bucket_of_.resize(params_.size());
  slot_of_.resize(params_.size());
  ready_.assign(params_.size(), false);
  for (std::size_t b = 0; b < assignment_.size(); ++b) {
    Bucket bucket;
    std::int64_t numel = 0;
    for (std::size_t slot = 0; slot < assignment_[b].tensors.size(); ++slot) {
      const std::size_t i = assignment_[b].tensors[slot];
      bucket.params.push_back(i);
      bucket.offsets.push_back(numel);
      numel += params_[i].numel();
      bucket_of_[i] = b;
      slot_of_[i] = slot;
    }
    bucket.flat = torch::zeros({numel}, params_[bucket.params.front()].options().requires_grad(false));
    buckets_.push_back(std::move(bucket));
  }
  views_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Bucket& bucket = buckets_[bucket_of_[i]];
    const torch::Tensor& p = params_[i];
    const torch::Tensor slice = bucket.flat.narrow(0, bucket.offsets[slot_of_[i]], p.numel());
    // A dense layout (contiguous, channels_last, ...) spans exactly numel elements: the slice takes it.
    views_[i] = p.is_non_overlapping_and_dense() ? slice.as_strided(p.sizes(), p.strides()) : slice.view(p.sizes());
  }
  if (!hooked_) {
    // No hook makes the gradients the buckets' views at their first backward: they are from the
    // start, so a CUDA graph captured before the first finish() accumulates into them (it records
    // the address its AccumulateGrad adds into; a later swap would leave it adding into freed memory).
    if (as_bucket_view_) {
      for (std::size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = views_[i];
    }
    return;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<ReadyHook>(this, i));
  }
}

GradSync::~GradSync() {
  first_work_.reset();
  last_work_.reset();
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  }
  if (hooked_) {
    for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void GradSync::prepare() {
  if (hooked_) forget_step();  // without hooks finish() does (a replayed step does not call this)
}

void GradSync::forget_step() {
  first_work_.reset();
  last_work_.reset();
  for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].pending = buckets_[b].params.size();
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  launched_in_backward_ = 0;
  in_backward_ = true;
}

void GradSync::copy_in(std::size_t index) {
  torch::Tensor& grad = params_[index].mutable_grad();
  if (!grad.defined()) {
    views_[index].zero_();
  } else if (!grad.is_same(views_[index])) {
    views_[index].copy_(grad);  // same layout as the parameter's gradient: a straight copy
  }
  // DDP's gradient_as_bucket_view: from here the gradient is its bucket's view, autograd's own
  // tensor freed, so a step holds each gradient once, not in the bucket and again beside it.
  if (as_bucket_view_) grad = views_[index];
}

void GradSync::mark_ready(std::size_t index) {
  if (!in_backward_ || ready_[index]) return;  // e.g. a backward outside a training step
  // On autograd's thread, which launches the copy and the bucket's all-reduce: Nsight attributes
  // them to this range (the main thread's phase ranges do not cover that thread's launches).
  const profile::NvtxRange range("gradsync bucket");
  ready_[index] = true;
  copy_in(index);
  if (--buckets_[bucket_of_[index]].pending == 0) launch_ready_in_order();
}

namespace {

/// fp16 buckets are divided by the world size before the sum, as PyTorch's DDP divides its buckets
/// (the reducer's div_factor): n fp16 gradients may sum past 65504 where their mean does not. Other
/// dtypes sum first and divide after (fp32 / fp64 orders the tests pin bitwise).
bool divides_before_sum(const torch::Tensor& flat) { return flat.scalar_type() == torch::kHalf; }

}  // namespace

void GradSync::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    torch::Tensor& flat = buckets_[next_launch_].flat;
    if (divides_before_sum(flat)) flat.div_(comm_.world_size());
    buckets_[next_launch_].work = comm_.all_reduce(flat, ReduceOp::kSum);
    ++next_launch_;
    if (in_backward_) ++launched_in_backward_;
  }
}

void GradSync::finish() {
  const profile::NvtxRange range("gradsync finish");
  if (!hooked_) forget_step();  // no hook took any gradient in: every one is copied in below
  in_backward_ = false;
  // Parameters that got no gradient this step still take part, with zeros.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) {
      ready_[i] = true;
      copy_in(i);
      --buckets_[bucket_of_[i]].pending;
    }
  }
  launch_ready_in_order();
  const double scale = 1.0 / static_cast<double>(comm_.world_size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& bucket = buckets_[b];
    bucket.work->wait();
    if (b == 0) {
      first_work_ = std::move(bucket.work);
    } else if (b + 1 == buckets_.size()) {
      last_work_ = std::move(bucket.work);
    }
    bucket.work.reset();
    if (!divides_before_sum(bucket.flat)) bucket.flat.mul_(scale);
    if (as_bucket_view_) continue;  // the gradients are its views
    for (const std::size_t i : bucket.params) {
      auto& p = params_[i];
      if (p.grad().defined()) {
        p.mutable_grad().copy_(views_[i]);
      } else {
        p.mutable_grad() = views_[i].clone();  // keeps the parameter's layout
      }
    }
  }
}

double GradSync::window_s() {
  if (!first_work_) return 0;
  return last_work_ ? last_work_->seconds_since_start_of(*first_work_)
                    : first_work_->seconds_since_start_of(*first_work_);
}

}  // namespace mgbench::runtime
