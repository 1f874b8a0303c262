#pragma once
// Numeric precision of a training run (--precision), one descriptor row each with its dtypes and
// switches (torch-free: dtypes as Dtype, turned into torch's by runtime/scalar_type.h).
//
//   fp64, fp32   the model, data and arithmetic in that dtype (fp32 = strict IEEE fp32:
//                TF32 disabled in cuBLAS and cuDNN, unlike PyTorch's default for cuDNN).
//   tf32         fp32 tensors, matrix products and convolutions on TF32 tensor cores.
//   fp16, bf16   the whole model and its data in that dtype (the paper's "half": model.half();
//                TorchTune's dtype), no loss scaling, no fp32 master weights.
//   amp-fp16,    fp32 master weights, forward under autocast to that dtype (torch.autocast);
//   amp-bf16     amp-fp16 adds dynamic loss scaling (GradScaler, train/optim/grad_scaler.h).
// Follows torch.autocast / torch.amp (PyTorch 2.x) and torch.backends.{cuda.matmul,cudnn}.allow_tf32.
// The gradients are in the parameters' dtype: what the all-reduce moves (the run attribute
// gradient_dtype; `mgbench predict` prices the all-reduce of that dtype).
// Adding a precision: its enum value and row here.
#include <span>
#include <string_view>

namespace mgbench::axes {

/// Floating-point element types, named as the results files name them (comm rows, gradient_dtype).
enum class Dtype { kFloat32, kBFloat16, kFloat16, kFloat64 };

struct DtypeInfo {
  std::string_view name;  // fp32, bf16, fp16, fp64
  Dtype value;
  std::string_view help;
  int bytes;  // per element
};

std::span<const DtypeInfo> dtype_choices();
const DtypeInfo& dtype_info(Dtype d);

enum class Precision { kFp64, kFp32, kTf32, kFp16, kBf16, kAmpFp16, kAmpBf16 };

/// A row of the precision table: what --precision <name> means.
struct PrecisionInfo {
  std::string_view name;
  Precision value;
  std::string_view help;
  Dtype param_dtype = Dtype::kFloat32;     // parameters, gradients, inputs and optimizer state
  bool autocast = false;                   // forward under autocast
  Dtype autocast_dtype = Dtype::kFloat32;  // lower-precision dtype of autocast regions
  bool tf32 = false;                       // TF32 allowed in cuBLAS and cuDNN
  bool loss_scaling = false;               // dynamic loss scaling (amp-fp16)

  /// The gradients' dtype: the parameters' (amp keeps fp32 master weights and gradients).
  Dtype gradient_dtype() const { return param_dtype; }
};

std::span<const PrecisionInfo> precision_choices();
const PrecisionInfo& precision_info(Precision p);
/// The row named name; throws ConfigError naming `option` and the precisions.
const PrecisionInfo& find_precision(std::string_view option, std::string_view name);

}  // namespace mgbench::axes
