#pragma once
// nccl-tests' bus-bandwidth factors (nccl-tests doc/PERFORMANCE.md): busbw = algbw x factor, the
// share of the message each rank's link carries in the ring algorithm, so that busbw compares with
// the hardware's link bandwidth whatever the rank count. Torch-free: the benchmark (comm/) reports
// with them and the predictor (report/) prices collectives on an assumed link with them.
#include <string_view>

namespace mgbench::axes {

/// All-reduce: 2(n-1)/n (a reduce-scatter then an all-gather).
inline double all_reduce_bus_factor(int n) { return 2.0 * (n - 1) / n; }
/// All-gather and reduce-scatter: (n-1)/n of the whole buffer (the gathered output, the scattered input).
inline double gather_scatter_bus_factor(int n) { return static_cast<double>(n - 1) / n; }
/// Broadcast: 1.
inline double broadcast_bus_factor(int) { return 1.0; }

/// The factor of a collective by its name as `mgbench comm --collective` spells it (all-reduce,
/// all-gather, reduce-scatter, broadcast); 1 for a name it does not know.
inline double bus_factor(std::string_view collective, int n) {
  if (collective == "all-reduce") return all_reduce_bus_factor(n);
  if (collective == "all-gather" || collective == "reduce-scatter") return gather_scatter_bus_factor(n);
  return broadcast_bus_factor(n);
}

}  // namespace mgbench::axes
