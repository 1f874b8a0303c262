#pragma once
// What a precision (axes/precision.h: the --precision table) switches in torch: the process-wide
// math mode (TF32) and autocast around the forward pass. Follows torch.autocast / torch.amp
// (PyTorch 2.x) and torch.backends.{cuda.matmul,cudnn}.allow_tf32.
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "axes/precision.h"

namespace mgbench::train {

/// Applies the process-wide math settings of p (TF32 on or off in cuBLAS and cuDNN).
void apply_math_mode(const axes::PrecisionInfo& p);

/// Enables autocast for device_type while alive when p.autocast (else does nothing), as
/// `with torch.autocast(device_type, dtype)`; the cast cache is cleared on exit.
class AutocastScope {
 public:
  AutocastScope(const axes::PrecisionInfo& p, c10::DeviceType device_type);
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
