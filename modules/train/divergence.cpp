#include "train/divergence.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace mgbench::train {
namespace {

/// The tensors judged: dense, with values, in a dtype torch.isfinite takes (float8 and complex are not).
bool judged(const at::Tensor& t) {
  if (!t.defined() || t.layout() != c10::kStrided || t.is_meta()) return false;
  const c10::ScalarType type = t.scalar_type();
  return type == c10::kFloat || type == c10::kDouble || type == c10::kHalf || type == c10::kBFloat16;
}

bool finite(const at::Tensor& t) { return t.numel() == 0 || torch::isfinite(t).all().item<bool>(); }

double max_abs(const at::Tensor& t) { return t.numel() == 0 ? 0.0 : t.abs().max().item<double>(); }

/// Calls f on each tensor an op argument or result holds (a tensor, a list of tensors or of
/// optional tensors).
template <class F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

/// The tensors of op arguments or results, in order.
std::vector<at::Tensor> tensors_in(const std::vector<c10::IValue>& values) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : values) for_each_tensor(v, [&](const at::Tensor& t) { out.push_back(t); });
  return out;
}

/// Ops whose result is memory not yet written: NaN there is no op's doing.
bool returns_uninitialised(const std::string& name) {
  return name.find("empty") != std::string::npos || name.find("resize") != std::string::npos || name == "aten::set_";
}

double largest_finite(c10::ScalarType type) {
  switch (type) {
    case c10::kDouble:
      return std::numeric_limits<double>::max();
    case c10::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::max());
    case c10::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
    default:
      return static_cast<double>(std::numeric_limits<float>::max());
  }
}

const void* storage_of(const at::Tensor& t) { return t.has_storage() ? t.storage().data() : nullptr; }

/// What the observer keeps of an op between its start and its end: its arguments, those it writes
/// copied as they were before it ran.
struct OpArguments : at::ObserverContext {
  std::vector<c10::IValue> inputs;
};

/// The observation of one first_non_finite_op call, on its thread.
struct Observation {
  std::unordered_map<const void*, std::string> names;  // storage -> parameter, buffer or a cast of one
  std::vector<at::Tensor> casts;  // the casts named: alive, so that no other tensor takes their storage
  std::optional<NonFiniteOrigin> found;
};
thread_local Observation* observing = nullptr;

/// No recursion into the observer, no autocast and no autograd for the observer's own ops.
struct QuietOps {
  at::DisableRecordFunctionGuard no_observer;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
  torch::NoGradGuard no_grad;
};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (observing == nullptr || observing->found || !fn.operator_name() || returns_uninitialised(fn.name())) {
    return nullptr;
  }
  const QuietOps quiet;
  const std::optional<c10::FunctionSchema> schema = fn.operator_schema();
  auto args = std::make_unique<OpArguments>();
  const c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    const c10::Argument* arg = schema && i < schema->arguments().size() ? &schema->arguments()[i] : nullptr;
    if (arg != nullptr && arg->is_out()) {  // written only (out=): what it held before is no input
      args->inputs.push_back(v);
      continue;
    }
    if (v.isDouble() && !std::isfinite(v.toDouble())) return nullptr;  // masked_fill(-inf), fill_(nan): not made
    bool all_finite = true;
    for_each_tensor(v, [&](const at::Tensor& t) { all_finite = all_finite && (!judged(t) || finite(t)); });
    if (!all_finite) return nullptr;
    const bool written = arg != nullptr && arg->alias_info() != nullptr && arg->alias_info()->isWrite();
    args->inputs.push_back(written && v.isTensor() ? c10::IValue(v.toTensor().clone()) : v);
  }
  return args;
}

std::string describe_inputs(const at::RecordFunction& fn, const std::vector<c10::IValue>& inputs,
                            const Observation& seen, double& largest) {
  const std::optional<c10::FunctionSchema> schema = fn.operator_schema();
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (schema && i < schema->arguments().size() && schema->arguments()[i].is_out()) continue;
    for_each_tensor(inputs[i], [&](const at::Tensor& t) {
      if (!judged(t)) return;
      const double m = max_abs(t);
      largest = std::max(largest, m);
      const auto name = seen.names.find(storage_of(t));
      parts.push_back(fmt::format("{} |x|<={:.3g}{}", dtype_and_shape(t), m,
                                  name == seen.names.end() ? "" : " (" + name->second + ")"));
    });
  }
  if (parts.size() > 4) {
    parts.resize(4);
    parts.emplace_back("...");
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

/// Whether an argument's type is a dtype (ScalarType or ScalarType?).
bool is_scalar_type(const c10::Type& type) {
  if (type.kind() == c10::TypeKind::ScalarTypeType) return true;
  const auto* optional = type.castRaw<c10::OptionalType>();
  return optional != nullptr && optional->getElementType()->kind() == c10::TypeKind::ScalarTypeType;
}

/// The op of fn run again on `inputs` with every floating tensor in float64; its result number
/// `result` (the tensors of its outputs in order, as on_op_end lists them) judged.
void rerun_in_float64(const at::RecordFunction& fn, const std::vector<c10::IValue>& inputs, std::size_t result,
                      NonFiniteOrigin& origin) {
  const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(*fn.operator_name());
  if (!op) {
    origin.not_run = "not in the dispatcher";
    origin.compare_around = true;
    return;
  }
  const c10::FunctionSchema& schema = op->schema();
  torch::jit::Stack stack;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    if (i < schema.arguments().size() && is_scalar_type(*schema.arguments()[i].real_type()) && v.isInt() &&
        at::isFloatingType(static_cast<c10::ScalarType>(v.toInt()))) {
      stack.emplace_back(static_cast<std::int64_t>(c10::ScalarType::Double));  // sum(dtype=float) and the like
    } else if (v.isTensor() && judged(v.toTensor())) {
      stack.emplace_back(v.toTensor().to(torch::kFloat64));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list = v.toTensorVector();
      for (at::Tensor& t : list) t = judged(t) ? t.to(torch::kFloat64) : t;
      stack.emplace_back(list);
    } else {
      stack.push_back(v);
    }
  }
  try {
    op->callBoxed(stack);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    origin.not_run = "no float64 kernel (" + what.substr(0, std::min(what.find('\n'), std::size_t{80})) + ")";
    origin.compare_around = true;
    return;
  }
  const std::vector<at::Tensor> results = tensors_in(stack);
  if (result >= results.size() || !judged(results[result])) {
    origin.not_run = "its float64 results differ in number";
    return;
  }
  const at::Tensor& t = results[result];
  if (t.scalar_type() != torch::kFloat64) {
    origin.not_run = fmt::format("its result stays {}", c10::toString(t.scalar_type()));
    return;
  }
  origin.float64 = finite(t) ? NonFiniteOrigin::InFloat64::kFinite : NonFiniteOrigin::InFloat64::kNonFinite;
  if (origin.float64 == NonFiniteOrigin::InFloat64::kFinite) origin.float64_max_abs = max_abs(t);
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* args = static_cast<OpArguments*>(context);
  if (observing == nullptr || args == nullptr) return;
  std::optional<NonFiniteOrigin>& found = observing->found;
  if (found && found->float64 != NonFiniteOrigin::InFloat64::kNotRun) return;
  const QuietOps quiet;
  const std::vector<at::Tensor> results = tensors_in(fn.outputs());
  std::size_t index = 0;
  while (index < results.size() && !(judged(results[index]) && !finite(results[index]))) ++index;
  const at::Tensor* bad = index < results.size() ? &results[index] : nullptr;
  const std::string op =
      fn.overload_name()[0] == '\0' ? fn.name() : fmt::format("{}.{}", fn.name(), fn.overload_name());
  if (bad == nullptr) {
    // A parameter cast for autocast keeps its name: "wq.weight as BFloat16".
    if (op.rfind("aten::_to_copy", 0) == 0 && !args->inputs.empty() && args->inputs[0].isTensor()) {
      const auto name = observing->names.find(storage_of(args->inputs[0].toTensor()));
      if (name != observing->names.end() && !results.empty() && results[0].defined()) {
        observing->names[storage_of(results[0])] =
            fmt::format("{} as {}", name->second, c10::toString(results[0].scalar_type()));
        observing->casts.push_back(results[0]);
      }
    }
    return;
  }
  if (found) {  // the innermost op has no float64 kernel: compare through an op around it (convolution)
    if (!found->compare_around) return;
    NonFiniteOrigin outer;
    rerun_in_float64(fn, args->inputs, index, outer);
    if (outer.float64 == NonFiniteOrigin::InFloat64::kNotRun) return;
    found->float64 = outer.float64;
    found->float64_max_abs = outer.float64_max_abs;
    found->compared_through = op;
    return;
  }
  NonFiniteOrigin origin;
  origin.op = op;
  origin.output_dtype = c10::toString(bad->scalar_type());
  origin.nan = bad->isnan().any().item<bool>();
  origin.dtype_max = largest_finite(bad->scalar_type());
  origin.inputs = describe_inputs(fn, args->inputs, *observing, origin.input_max_abs);
  if (bad->scalar_type() == torch::kFloat64) {
    origin.not_run = "it computes in float64 already";
  } else {
    rerun_in_float64(fn, args->inputs, index, origin);
  }
  found = std::move(origin);
}

/// Which observer's observation is on this thread, for the callbacks (plain function pointers).
class Observing {
 public:
  explicit Observing(Observation& seen)
      : previous_(observing),
        handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(on_op_start, on_op_end)
                                               .needsInputs(true)
                                               .needsOutputs(true)
                                               .scopes({at::RecordScope::FUNCTION}))) {
    observing = &seen;
  }
  ~Observing() {
    at::removeCallback(handle_);
    observing = previous_;
  }
  Observing(const Observing&) = delete;
  Observing& operator=(const Observing&) = delete;

 private:
  Observation* previous_;
  at::CallbackHandle handle_;
};

}  // namespace

std::optional<NonFiniteOrigin> first_non_finite_op(const std::function<void()>& run, const NamedTensors& names) {
  Observation seen;
  for (const auto& [name, t] : names) {
    if (t.defined() && storage_of(t) != nullptr) seen.names.emplace(storage_of(t), name);
  }
  {
    const at::RecordFunctionGuard enabled(true);
    const Observing observer(seen);
    run();
  }
  return std::move(seen.found);
}

std::string dtype_and_shape(const torch::Tensor& t) {
  return fmt::format("{}[{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

std::string first_non_finite(const NamedTensors& named) {
  const QuietOps quiet;
  for (const auto& [name, t] : named) {
    if (judged(t) && !finite(t)) return name;
  }
  return "";
}

std::string divergence_cause(const DivergenceFacts& facts, std::int64_t updates, double lr) {
  const std::string lower_lr =
      fmt::format("lower --lr (now {}) or clip the gradients (--clip-grad-norm)", fmt::format("{:g}", lr));
  if (!facts.non_finite_input.empty()) {
    return fmt::format("the batch holds non-finite values ({}): the data is the cause, not the learning rate",
                       facts.non_finite_input);
  }
  if (!facts.non_finite_parameter.empty()) {
    if (updates == 0 || !facts.parameter_trained) {
      return fmt::format(
          "{} held non-finite values {}: the weights it started from (initialised, loaded or resumed) are the "
          "cause, not the learning rate",
          facts.non_finite_parameter,
          facts.parameter_trained ? "before this run's first update" : "and is not trained (no update wrote it)");
    }
    return fmt::format("{} was non-finite before this step's forward: one of this run's {} update(s) made it so; {}",
                       facts.non_finite_parameter, updates, lower_lr);
  }
  if (!facts.non_finite_buffer.empty()) {
    return fmt::format(
        "buffer {} holds non-finite values that the forward read (frozen statistics, e.g. --freeze-batchnorm): the "
        "statistics the run started from, or an earlier forward in training mode, made them so",
        facts.non_finite_buffer);
  }
  const bool gradient = !facts.non_finite_gradient.empty();
  const std::string made =
      gradient ? fmt::format("the {} was non-finite after this step's backward, from a finite loss and finite weights",
                             facts.non_finite_gradient)
               : "this step's forward made it from finite weights and a finite batch";
  if (!facts.not_rerun.empty()) return fmt::format("{} (its op is not named: {})", made, facts.not_rerun);
  if (facts.rerun_finite) {
    return made + (gradient ? ", and this rank's last micro-batch run again gave finite gradients: another rank's "
                              "gradients (the all-reduce sums them) or an earlier micro-batch of the step made them, "
                              "or it is not reproducible (a race or memory not initialised)"
                            : ", and the same forward run again gave a finite loss: not reproducible (a race or "
                              "memory not initialised), not the learning rate");
  }
  if (!facts.origin) {
    return made +
           ", and no ATen op observed on this thread made a non-finite value from finite inputs when it was run "
           "again";
  }
  const NonFiniteOrigin& o = *facts.origin;
  const std::string where = fmt::format(
      "{}this step's {}: {} made {} in {} from finite inputs ({}){}",
      gradient ? fmt::format("the {} was non-finite before the update; ", facts.non_finite_gradient) : "",
      facts.origin_in_backward ? "backward" : "forward", o.op, o.nan ? "NaN" : "inf", o.output_dtype, o.inputs,
      o.compared_through.empty() ? "" : fmt::format(" (compared in float64 as {})", o.compared_through));
  const std::string when = updates == 0 ? "before this run's first update, so the learning rate is not the cause"
                                        : fmt::format("after {} update(s) of this run", updates);
  switch (o.float64) {
    case NonFiniteOrigin::InFloat64::kFinite:
      if (o.float64_max_abs > o.dtype_max) {
        return fmt::format("{}: an overflow (float64 reaches |x| {:.3g}; {}'s largest is {:.3g}), {}{}", where,
                           o.float64_max_abs, o.output_dtype, o.dtype_max, when,
                           updates == 0 ? "" : ": if the updates grew the weights, " + lower_lr);
      }
      if (o.input_max_abs > std::sqrt(o.dtype_max)) {  // a product or a square of two inputs can overflow
        return fmt::format(
            "{}: an overflow inside the op (its inputs reach |x| {:.3g}, past the square root of {}'s largest, where "
            "its products or squares overflow, although its float64 result, |x| <= {:.3g}, is in range), {}{}",
            where, o.input_max_abs, o.output_dtype, o.float64_max_abs, when,
            updates == 0 ? "" : ": if the updates grew the weights, " + lower_lr);
      }
      return fmt::format(
          "{}, where the same op in float64 gives finite values (|x| <= {:.3g}): a defect of this {} kernel, not the "
          "learning rate; another kernel or precision avoids it (e.g. --channels-last false, --precision fp64)",
          where, o.float64_max_abs, o.output_dtype);
    case NonFiniteOrigin::InFloat64::kNonFinite:
      return fmt::format(
          "{}, and in float64 too: the op's domain (a log of 0, a division by 0, a square root of a negative), {}",
          where, when);
    case NonFiniteOrigin::InFloat64::kNotRun:
      break;
  }
  return fmt::format("{} (not compared in float64: {}), {}{}", where, o.not_run, when,
                     updates == 0 ? "" : ": if the updates grew the weights, " + lower_lr);
}

}  // namespace mgbench::train
