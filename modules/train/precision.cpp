#include "train/precision.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "runtime/scalar_type.h"

namespace mgbench::train {

void apply_math_mode(const axes::PrecisionInfo& p) {
  at::globalContext().setAllowTF32CuBLAS(p.tf32);
  at::globalContext().setAllowTF32CuDNN(p.tf32);
}

AutocastScope::AutocastScope(const axes::PrecisionInfo& p, c10::DeviceType device_type) : device_type_(device_type) {
  if (!p.autocast) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, true);
  at::autocast::set_autocast_dtype(device_type, runtime::scalar_type(p.autocast_dtype));
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace mgbench::train
