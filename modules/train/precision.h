#pragma once
// Numeric precision of a training run (--precision): one row per precision in precision.cpp's
// table, with its dtypes and switches.
//
//   fp64, fp32   the model, data and arithmetic in that dtype (fp32 = strict IEEE fp32:
//                TF32 disabled in cuBLAS and cuDNN, unlike PyTorch's default for cuDNN).
//   tf32         fp32 tensors, matrix products and convolutions on TF32 tensor cores.
//   fp16, bf16   the whole model and its data in that dtype (the paper's "half": model.half();
//                TorchTune's dtype), no loss scaling, no fp32 master weights.
//   amp-fp16,    fp32 master weights, forward under autocast to that dtype (torch.autocast);
//   amp-bf16     amp-fp16 adds dynamic loss scaling (GradScaler, grad_scaler.h).
// Follows torch.autocast / torch.amp (PyTorch 2.x) and torch.backends.{cuda.matmul,cudnn}.allow_tf32.
// Adding a precision: one row in precision.cpp.
#include <span>
#include <string_view>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace mgbench::train {

enum class Precision { kFp64, kFp32, kTf32, kFp16, kBf16, kAmpFp16, kAmpBf16 };

/// A row of the precision table: what --precision <name> means.
struct PrecisionInfo {
  std::string_view name;
  Precision value;
  std::string_view help;
  c10::ScalarType param_dtype = c10::kFloat;     // parameters, inputs and optimizer state
  bool autocast = false;                         // forward under autocast
  c10::ScalarType autocast_dtype = c10::kFloat;  // lower-precision dtype of autocast regions
  bool tf32 = false;                             // TF32 allowed in cuBLAS and cuDNN
  bool loss_scaling = false;                     // dynamic loss scaling (amp-fp16)
};

std::span<const PrecisionInfo> precision_choices();
const PrecisionInfo& precision_info(Precision p);

/// Applies the process-wide math settings of p (TF32 on or off in cuBLAS and cuDNN).
void apply_math_mode(const PrecisionInfo& p);

/// Enables autocast for device_type while alive when p.autocast (else does nothing), as
/// `with torch.autocast(device_type, dtype)`; the cast cache is cleared on exit.
class AutocastScope {
 public:
  AutocastScope(const PrecisionInfo& p, c10::DeviceType device_type);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_type_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::kFloat;
};

}  // namespace mgbench::train
