#include "train/precision.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "core/error.h"

namespace mgbench::train {

Precision parse_precision(const std::string& name) {
  Precision p;
  p.name = name;
  if (name == "fp64") {
    p.param_dtype = c10::kDouble;
  } else if (name == "fp32") {
    p.param_dtype = c10::kFloat;
  } else if (name == "tf32") {
    p.param_dtype = c10::kFloat;
    p.tf32 = true;
  } else if (name == "fp16") {
    p.param_dtype = c10::kHalf;
  } else if (name == "bf16") {
    p.param_dtype = c10::kBFloat16;
  } else if (name == "amp-fp16") {
    p.autocast = true;
    p.autocast_dtype = c10::kHalf;
    p.loss_scaling = true;
  } else if (name == "amp-bf16") {
    p.autocast = true;
    p.autocast_dtype = c10::kBFloat16;
  } else {
    throw ConfigError(
        fmt::format("--precision '{}': expected fp64, fp32, tf32, fp16, bf16, amp-fp16 or amp-bf16", name));
  }
  return p;
}

void apply_math_mode(const Precision& p) {
  at::globalContext().setAllowTF32CuBLAS(p.tf32);
  at::globalContext().setAllowTF32CuDNN(p.tf32);
}

AutocastScope::AutocastScope(const Precision& p, c10::DeviceType device_type) : device_type_(device_type) {
  if (!p.autocast) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, true);
  at::autocast::set_autocast_dtype(device_type, p.autocast_dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace mgbench::train
