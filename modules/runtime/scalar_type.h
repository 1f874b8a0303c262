#pragma once
// torch's dtype of an axes::Dtype (axes/precision.h: the torch-free names of the precision and
// comm tables).
#include <c10/core/ScalarType.h>

#include "axes/precision.h"

namespace mgbench::runtime {

inline c10::ScalarType scalar_type(axes::Dtype d) {
  switch (d) {
    case axes::Dtype::kFloat64:
      return c10::kDouble;
    case axes::Dtype::kFloat32:
      return c10::kFloat;
    case axes::Dtype::kFloat16:
      return c10::kHalf;
    case axes::Dtype::kBFloat16:
      return c10::kBFloat16;
  }
  return c10::kFloat;
}

}  // namespace mgbench::runtime
