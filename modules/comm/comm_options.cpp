// `mgbench comm`'s options (comm_benchmark.h): their table rows, the byte sizes they are written
// in, the sweep of sizes they resolve to.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_benchmark.h"
#include "core/error.h"
#include "session/session.h"

namespace mgbench::comm {
namespace {

using runtime::ReduceOp;

constexpr options::Choice<ReduceOp> kOps[] = {
    {"sum", ReduceOp::kSum, "elementwise sum"},
    {"max", ReduceOp::kMax, "elementwise maximum"},
    {"min", ReduceOp::kMin, "elementwise minimum"},
};

/// The collectives --collective names ("all": every one), in order. Throws ConfigError naming an
/// unknown name or an empty list.
std::vector<Collective> resolve_collectives(const std::vector<std::string>& names) {
  std::vector<Collective> resolved;
  for (const std::string& name : names) {
    if (name == "all") {
      for (const auto& c : collective_choices()) resolved.push_back(c.value);
    } else {
      resolved.push_back(options::parse_choice(collective_choices(), "collective", name));
    }
  }
  if (resolved.empty()) options::fail("collective", "", "all-reduce, all-gather, reduce-scatter, broadcast or all");
  return resolved;
}

/// Whether any collective of --collective has `property` (CollectiveInfo::reduces: takes --op;
/// ::rooted: takes --root). Throws as resolve_collectives.
bool any_takes(const std::vector<std::string>& names, bool CollectiveInfo::*property) {
  const std::vector<Collective> resolved = resolve_collectives(names);
  return std::any_of(resolved.begin(), resolved.end(),
                     [property](Collective c) { return collective_info(c).*property; });
}

}  // namespace

std::span<const options::Choice<ReduceOp>> reduce_op_choices() { return kOps; }

std::int64_t parse_bytes(std::string_view option, const std::string& text) {
  std::size_t used = 0;
  long double value = 0;
  try {
    value = std::stold(text, &used);
  } catch (const std::exception&) {
    options::fail(option, text, "a size in bytes (8, 4K, 64M, 1G)");
  }
  const std::string suffix = text.substr(used);
  long double scale = 1;
  if (suffix == "K" || suffix == "k") {
    scale = 1024.0L;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1024.0L * 1024.0L;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1024.0L * 1024.0L * 1024.0L;
  } else if (!suffix.empty()) {
    options::fail(option, text, "a size in bytes (8, 4K, 64M, 1G)");
  }
  const long double bytes = value * scale;
  if (!(bytes >= 1)) options::fail(option, text, "a size of at least 1 byte");
  // Half of int64: a sweep's next size (x --step-factor) is computed without overflow.
  constexpr std::int64_t kMostBytes = std::numeric_limits<std::int64_t>::max() / 2;
  if (bytes > static_cast<long double>(kMostBytes)) {
    options::fail(option, text, fmt::format("a size of at most {} bytes (4 EiB)", kMostBytes));
  }
  return static_cast<std::int64_t>(bytes);
}

std::vector<std::int64_t> sweep_sizes(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = min_bytes; s <= max_bytes; s *= factor) {
    sizes.push_back(s);
    if (s > max_bytes / factor) break;  // the next would pass max (or overflow)
  }
  return sizes;
}

void CommOptions::declare(options::OptionTable& t) {
  t.section("Collectives (nccl-tests' flags in parentheses)");
  t.add("collective", collectives,
        "what to measure, comma-separated: all-reduce, all-gather, reduce-scatter, broadcast, or all");
  t.add("min-bytes", min_bytes, "smallest message [bytes; suffixes K, M, G: powers of 1024] (-b)");
  t.add("max-bytes", max_bytes, "largest message [bytes; K, M, G] (-e)");
  t.add("step-factor", step_factor, "size multiplier from one row to the next (-f)").at_least(2);
  // Bounded: each launch's handle is kept until the size's wait (~140 bytes a launch).
  t.add("warmup-iters", warmup_iters, "untimed launches before each size's timing (-w)")
      .at_least(0)
      .at_most(1000000)
      .same_workload();
  t.add("iters", iters, "timed launches per size and placement (-n)").at_least(1).at_most(1000000).same_workload();
  t.add("check", check, "check each size's result against the expected values: the #wrong column (-c)").same_workload();
  t.add("dtype", dtype, axes::dtype_choices(), "element type (-d)");
  t.add("op", op, reduce_op_choices(), "reduction of all-reduce and reduce-scatter (-o)")
      .only_with([this] { return any_takes(collectives, &CollectiveInfo::reduces); },
                 "--collective all-reduce, reduce-scatter or all");
  t.add("root", root, "root rank of broadcast (-r)")
      .at_least(0)
      .only_with([this] { return any_takes(collectives, &CollectiveInfo::rooted); }, "--collective broadcast or all");
  t.section("Devices");
  t.add("device", device, runtime::device_choices(), "where each rank's buffers live");
  t.add("backend", backend, runtime::backend_choices(), "the communication library measured").same_workload();
  session::declare_comm_timeout(t, comm_timeout_s);
  t.section("Results");
  session::declare_results(t, results, run_name);
  t.add("check-perturb-rank", perturb_rank,
        "testing: this rank's input gets one wrong element (100; -100 with --op min) before each check, which must "
        "then report it (-1: none; with broadcast, only the root)")
      .at_least(-1)
      .same_workload()
      .only_with([this] { return check; }, "--check true");
}

void CommOptions::validate() {
  // A backend's row says whether this benchmark measures it (auto takes rows that it does).
  if (!runtime::backend_info(backend).in_comm && backend != runtime::Backend::kAuto) {
    std::vector<std::string_view> measured;
    for (const auto& b : runtime::backend_choices()) {
      if (b.in_comm || b.value == runtime::Backend::kAuto) measured.push_back(b.name);
    }
    options::fail("backend", runtime::backend_name(backend), options::join_names(measured));
  }
  resolved_collectives = resolve_collectives(collectives);
  const std::int64_t lo = parse_bytes("min-bytes", min_bytes);
  const std::int64_t hi = parse_bytes("max-bytes", max_bytes);
  if (hi < lo) {
    throw ConfigError(fmt::format("--max-bytes {} is below --min-bytes {}", max_bytes, min_bytes));
  }
  sizes = sweep_sizes(lo, hi, step_factor);
}

}  // namespace mgbench::comm
