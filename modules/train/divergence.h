#pragma once
// Where a non-finite loss was made. On the CPU the loop reads each micro-batch's loss right after
// its forward (train/step.cpp: there is no device to wait for), so a NaN or inf loss stops the step
// before its backward and update: the weights are still those the forward used. The loop then
// checks the batch and the parameters and reruns the same forward with every ATen op observed
// (at::RecordFunction, as torch.profiler observes them), which names the first op that made a
// non-finite value from finite inputs, and reruns that one op in float64 to tell an overflow (the
// float64 result lies beyond the dtype's range), a domain error (non-finite in float64 too) and a
// defect of the kernel (finite in float64, in range): what autograd's anomaly mode does for
// backward (torch.autograd.detect_anomaly), here for forward. A finite loss whose gradients are
// non-finite (an overflow in backward: the loop checks the summed gradients before the update, one
// pass, GradScaler's check) is rerun likewise, forward and backward (torch::autograd::grad: no
// gradient is accumulated and no all-reduce hook fires). The message then names the phase and the
// op and advises a lower learning rate only where the updates are the cause.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace mgbench::train {

/// The first op of a forward whose floating-point output held NaN or +-inf while every input
/// (floating-point tensors and scalars alike) was finite.
struct NonFiniteOrigin {
  std::string op;            // the ATen operator with its overload, "aten::mul.Tensor"
  std::string inputs;        // its floating inputs: "Float[4, 8] |x|<=3e+38 (fc.weight), ..."
  std::string output_dtype;  // the non-finite output's dtype as torch names it: "Float", "BFloat16"
  bool nan = false;          // the output held NaN (else only +-inf)
  double input_max_abs = 0;  // the largest |x| over its floating inputs
  double dtype_max = 0;      // the largest finite value of output_dtype
  /// The op run again with its floating inputs in float64 (no autocast, no autograd).
  enum class InFloat64 { kFinite, kNonFinite, kNotRun } float64 = InFloat64::kNotRun;
  double float64_max_abs = 0;   // kFinite: the largest |x| of that result
  std::string not_run;          // kNotRun: why ("no float64 kernel (...)")
  bool compare_around = false;  // kNotRun for want of a float64 kernel: the op around it is compared
  /// The op around `op` (the first to end after it with a non-finite result from finite inputs)
  /// rerun in float64 where `op` has no float64 kernel (aten::_convolution around
  /// aten::mkldnn_convolution); "": `op` itself.
  std::string compared_through;
};

/// Tensors to name where an op reads them: the model's parameters and buffers by name.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Runs `run` on this thread with every ATen op observed, then returns the first op (the first to
/// end: the innermost of nested ops) that made a non-finite floating-point output from finite
/// inputs, rerun in float64 (or, where it has no float64 kernel, the op around it); nullopt when no
/// op did. Ops that return uninitialised memory (the
/// `empty` family, `resize_`, `set_`) are not judged. An input equal to one of `names` (or a dtype
/// cast of one) is named in NonFiniteOrigin::inputs. Ops on other threads (DataParallel's
/// replicas) are not observed. Rethrows what `run` throws. Costs a few passes over every op's
/// inputs and outputs: for a diagnosis, not for a step.
std::optional<NonFiniteOrigin> first_non_finite_op(const std::function<void()>& run, const NamedTensors& names);

/// What the loop found out about a micro-batch whose forward returned a non-finite loss, or about a
/// step whose gradients were non-finite after a finite loss (non_finite_gradient set).
struct DivergenceFacts {
  std::string
      non_finite_input;  // the batch's first tensor holding NaN / inf ("tensor 0 float[8, 1, 32, 32]"); "": none
  std::string non_finite_parameter;  // the first parameter holding NaN / inf; "": none
  bool parameter_trained = true;     // it is one the optimizer updates (else frozen: a LoRA base)
  std::string non_finite_buffer;     // a buffer holding NaN / inf that the rerun's ops read; "": none
  std::string not_rerun;             // why the forward was not rerun ("" : it was)
  bool rerun_finite = false;         // the rerun's loss (gradients) was finite (not reproduced)
  /// The first trained parameter whose gradient, summed over the ranks, held NaN / inf before the
  /// update ("gradient of features.0.0.weight"); "": the loss was the first non-finite value.
  std::string non_finite_gradient;
  std::optional<NonFiniteOrigin> origin;
  bool origin_in_backward = false;  // the origin's op ran in the rerun's backward (else its forward)
};

/// A tensor's dtype and shape as the divergence messages write them: "Float[8, 1, 32, 32]".
std::string dtype_and_shape(const torch::Tensor& t);

/// The first of `named` (in order) holding NaN or +-inf, as "name"; "" when all are finite. Tensors
/// of other dtypes than float64, float32, float16 and bfloat16 (integers, float8, complex) and
/// without values (meta, mkldnn) are not judged.
std::string first_non_finite(const NamedTensors& named);

/// The cause as the divergence error states it, after "training diverged: ": the phase (the batch,
/// an earlier update, or this forward and its op with the float64 verdict), and the advice that
/// follows from it. updates: optimizer steps this run took before the failing one; lr: its
/// learning rate. A lower learning rate is advised only for non-finite trained weights after
/// updates and for an overflow after updates. A float64 result in range is an overflow inside the
/// op where its inputs exceed the square root of the dtype's largest value, else a defect of the
/// kernel. A finite rerun (rerun_finite) is reported as not reproducible, before any op found; for
/// non-finite gradients as made elsewhere (another rank's gradients, which the all-reduce sums, or
/// an earlier micro-batch of the step).
std::string divergence_cause(const DivergenceFacts& facts, std::int64_t updates, double lr);

}  // namespace mgbench::train
