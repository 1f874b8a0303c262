#include "comm/comm_benchmark.h"

#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <ctime>
#include <iostream>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "core/agreement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/scalar_type.h"
#include "runtime/stop_request.h"
#include "session/session.h"

namespace mgbench::comm {
namespace {

using runtime::ReduceOp;

template <std::size_t N>
void copy_text(char (&into)[N], std::string_view text) {
  std::memset(into, 0, N);
  std::memcpy(into, text.data(), std::min(text.size(), N - 1));
}

/// One measured case (a collective, a size, out of place or in place) on this rank.
struct Measurement {
  double time_s = 0;        // mean of one launch, over the timed iterations
  std::int64_t wrong = -1;  // -1: not checked
};

/// The buffers of one case: in place, input and output are views into one buffer (collectives.h).
struct Buffers {
  torch::Tensor input, output;
};

Buffers make_buffers(const MessageCounts& c, bool in_place, const torch::TensorOptions& to) {
  if (!in_place) return {torch::zeros({c.input}, to), torch::zeros({c.output}, to)};
  torch::Tensor whole = torch::zeros({std::max(c.input, c.output)}, to);
  return {whole.narrow(0, c.in_place_input_offset, c.input), whole.narrow(0, c.in_place_output_offset, c.output)};
}

class Bench {
 public:
  Bench(const CommOptions& o, runtime::Communicator& comm, const runtime::DevicePlacement& placement)
      : o_(o), comm_(comm), device_(placement.is_cuda() ? torch::Device(torch::kCUDA, placement.index) : torch::kCPU) {}

  Measurement run(const CollectiveInfo& c, const MessageCounts& counts, bool in_place) {
    const auto to = torch::TensorOptions().dtype(runtime::scalar_type(o_.dtype)).device(device_);
    Buffers b = make_buffers(counts, in_place, to);
    b.input.copy_(input_pattern(counts.input, comm_.rank(), to.dtype().toScalarType(), device_));
    for (std::int64_t i = 0; i < o_.warmup_iters; ++i) c.launch(comm_, b.input, b.output, o_.op, o_.root)->wait();
    synchronize();
    comm_.barrier();
    // As nccl-tests: the iterations are launched back to back, then waited for together. The MPI
    // backend stages host copies per launch (CUDA tensors, half types, in-place reduce-scatter), so
    // there at most kMpiInFlight are in flight (the queue never runs dry, the memory stays bounded);
    // an in-place reduce-scatter copies its input at launch, which the one before is still writing:
    // one at a time.
    constexpr std::size_t kMpiInFlight = 4;
    const bool mpi = comm_.backend() == "mpi";
    const std::size_t window = !mpi                                                ? static_cast<std::size_t>(o_.iters)
                               : in_place && c.value == Collective::kReduceScatter ? 1
                                                                                   : kMpiInFlight;
    const double start = now_s();
    std::vector<std::unique_ptr<runtime::Work>> works;
    works.reserve(static_cast<std::size_t>(o_.iters));
    for (std::int64_t i = 0; i < o_.iters; ++i) {
      if (works.size() >= window) works[works.size() - window]->wait();
      works.push_back(c.launch(comm_, b.input, b.output, o_.op, o_.root));
    }
    for (auto& w : works) w->wait();
    synchronize();
    Measurement m;
    m.time_s = (now_s() - start) / static_cast<double>(o_.iters);
    if (o_.check) m.wrong = check(c, counts, in_place, to);
    return m;
  }

 private:
  /// A fresh launch on fresh buffers, compared with expected_output: the elements that differ.
  std::int64_t check(const CollectiveInfo& c, const MessageCounts& counts, bool in_place,
                     const torch::TensorOptions& to) {
    Buffers b = make_buffers(counts, in_place, to);
    torch::Tensor input = input_pattern(counts.input, comm_.rank(), to.dtype().toScalarType(), torch::kCPU);
    // Outside every pattern value (1 .. 3) in the direction the reduction keeps: the check must see it.
    if (comm_.rank() == o_.perturb_rank) input[0] = o_.op == runtime::ReduceOp::kMin ? -100 : 100;
    b.input.copy_(input);
    c.launch(comm_, b.input, b.output, o_.op, o_.root)->wait();
    synchronize();
    const torch::Tensor expected = expected_output(c, counts, o_.op, o_.root, comm_.rank(), comm_.world_size());
    return b.output.to(torch::kCPU, torch::kFloat64).ne(expected).sum().item<std::int64_t>();
  }

  void synchronize() const {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  }

  const CommOptions& o_;
  runtime::Communicator& comm_;
  torch::Device device_;
};

/// Across ranks: min, mean and max of a time, sum of wrong values (over the MPI environment, not
/// the communicator under test).
struct Across {
  double min_s = 0, avg_s = 0, max_s = 0;
  std::int64_t wrong = -1;
};

Across across_ranks(runtime::MpiEnvironment& env, const Measurement& m) {
  const runtime::MpiEnvironment::Spread t = env.spread(m.time_s);
  const std::int64_t wrong = env.sum(m.wrong);
  return {t.min, t.mean, t.max, m.wrong < 0 ? -1 : wrong};
}

// The table, as nccl-tests prints it: '#' header and units rows, data rows without a prefix.
constexpr const char* kLeft = "{:>12} {:>12} {:>6} {:>6} {:>5}";
constexpr const char* kHalf = "  {:>9} {:>9} {:>9} {:>7} {:>7} {:>6}";

std::string half(const Across& a, double bytes, double factor) {
  const double algbw = bytes / a.avg_s / 1e9;
  return fmt::format(fmt::runtime(kHalf), fmt::format("{:.2f}", a.min_s * 1e6), fmt::format("{:.2f}", a.avg_s * 1e6),
                     fmt::format("{:.2f}", a.max_s * 1e6), fmt::format("{:.2f}", algbw),
                     fmt::format("{:.2f}", algbw * factor), a.wrong < 0 ? std::string("N/A") : std::to_string(a.wrong));
}

}  // namespace

namespace {

/// Why the options cannot run with world_size ranks ("": they can): a --root or perturbed rank
/// outside the world, a perturbed rank other than the root with broadcast (only the root's input is
/// read).
std::string refusal(const CommOptions& o, int world_size) {
  const bool broadcasts = std::find(o.resolved_collectives.begin(), o.resolved_collectives.end(),
                                    Collective::kBroadcast) != o.resolved_collectives.end();
  if (broadcasts && o.perturb_rank >= 0 && o.perturb_rank != o.root) {
    return fmt::format("--check-perturb-rank {} with broadcast: only the root's input ({}) is read; perturb the root",
                       o.perturb_rank, o.root);
  }
  if (o.root >= world_size || o.perturb_rank >= world_size) {
    return fmt::format("--root {} / --check-perturb-rank {}: expected a rank below {}", o.root, o.perturb_rank,
                       world_size);
  }
  return "";
}

/// Throws ConfigError naming --max-bytes when the sweep's largest case (case_bytes) would not fit
/// this rank's memory: an allocation beyond it failed with the allocator's message, or, under
/// overcommit, the kernel killed the rank.
void refuse_beyond_memory(const CommOptions& o, const session::Connection& connection, int world_size, int rank) {
  const auto element_size = static_cast<std::int64_t>(axes::dtype_info(o.dtype).bytes);
  const bool cuda = connection.placement.is_cuda();
  const int sharing = std::max(1, connection.placement.ranks_on_device);
  const double host_limit = static_cast<double>(connection.host_memory.bytes);
  const double device_limit =
      cuda ? static_cast<double>(runtime::cuda_total_memory(connection.placement.index)) / sharing : 0.0;
  const std::string host_memory = fmt::format("host memory ({})", connection.host_memory.source);
  const std::string device_memory = sharing == 1 ? "GPU" : fmt::format("share of its GPU (1 of {} ranks)", sharing);
  const auto fits = [&](const CaseBytes& b) {
    return (host_limit <= 0 || b.host <= host_limit) && (!cuda || device_limit <= 0 || b.device <= device_limit);
  };
  for (const Collective collective : o.resolved_collectives) {
    const CollectiveInfo& c = collective_info(collective);
    const MessageCounts n = c.counts(o.sizes.back(), element_size, world_size, rank);
    const CaseBytes needed = case_bytes(n, element_size, o.check, cuda);
    if (fits(needed)) continue;
    const bool device_short = cuda && device_limit > 0 && needed.device > device_limit;
    const auto gib = [](double bytes) { return bytes / (1 << 30); };
    throw ConfigError(fmt::format(
        "--max-bytes {}: its largest case ({} at {} ranks) holds about {:.1f} GiB per rank ({}), and this rank's {} "
        "has {:.1f} GiB: expected a smaller --max-bytes{}",
        o.max_bytes, c.name, world_size, gib(device_short ? needed.device : needed.host),
        o.check ? "the timed buffers and the check's" : "the timed buffers", device_short ? device_memory : host_memory,
        gib(device_short ? device_limit : host_limit),
        o.check && fits(case_bytes(n, element_size, false, cuda)) ? " (or --check false)" : ""));
  }
}

/// The '#' rows above one collective's table: its name and bus factor, the column headers of both
/// halves (out of place, in place) and their units, as nccl-tests prints them.
void print_collective_header(const CollectiveInfo& c, double factor) {
  std::cout << fmt::format("#\n# {} (bus factor {:.4g})\n", c.name, factor);
  std::cout << "# " << fmt::format(fmt::runtime(kLeft), "size", "count", "type", "redop", "root")
            << fmt::format("  {:^48}  {:^48}\n", "out-of-place", "in-place");
  const std::string units =
      fmt::format(fmt::runtime(kHalf), "time_min", "time_avg", "time_max", "algbw", "busbw", "#wrong");
  std::cout << "# " << fmt::format(fmt::runtime(kLeft), "", "", "", "", "") << units << units << "\n";
  const std::string unit_row = fmt::format(fmt::runtime(kHalf), "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "");
  std::cout << "# " << fmt::format(fmt::runtime(kLeft), "(B)", "(elements)", "", "", "") << unit_row << unit_row
            << "\n";
}

/// One message size of one collective, out of place and in place: measured, checked and summarised
/// across the ranks (collective).
struct SizeResult {
  std::string line;                          // the table's data row
  std::vector<results::CommRecord> records;  // this rank's rows of the results file
  std::int64_t wrong = 0;                    // wrong elements over the ranks
  std::array<double, 2> busbw{};             // of the two halves, out of place and in place [GB/s]
};

SizeResult measure_size(Bench& bench, runtime::MpiEnvironment& env, const CommOptions& o, const CollectiveInfo& c,
                        std::int64_t size, double factor) {
  const std::string dtype(axes::dtype_info(o.dtype).name);
  const std::string op(options::name_of(reduce_op_choices(), o.op));
  const auto element_size = static_cast<std::int64_t>(axes::dtype_info(o.dtype).bytes);
  const MessageCounts counts = c.counts(size, element_size, env.world_size(), env.rank());
  const std::int64_t count = c.value == Collective::kReduceScatter ? counts.output : counts.input;
  SizeResult out;
  out.line = "  " + fmt::format(fmt::runtime(kLeft), counts.bytes, count, dtype, c.reduces ? op : "none",
                                c.rooted ? o.root : -1);
  for (const bool in_place : {false, true}) {
    const Measurement m = bench.run(c, counts, in_place);
    const Across a = across_ranks(env, m);
    out.line += half(a, static_cast<double>(counts.bytes), factor);
    if (a.wrong > 0) out.wrong += a.wrong;
    out.busbw[in_place ? 1 : 0] = static_cast<double>(counts.bytes) / a.avg_s / 1e9 * factor;
    results::CommRecord r;
    copy_text(r.collective, c.name);
    copy_text(r.dtype, dtype);
    copy_text(r.op, c.reduces ? op : "");
    r.root = c.rooted ? o.root : -1;
    r.in_place = in_place ? 1 : 0;
    r.bytes = counts.bytes;
    r.count = count;
    r.iters = o.iters;
    r.time_s = m.time_s;
    r.algbw_gbs = static_cast<double>(counts.bytes) / m.time_s / 1e9;
    r.busbw_gbs = r.algbw_gbs * factor;
    r.wrong = m.wrong;
    out.records.push_back(r);
  }
  return out;
}

/// What a sweep over the collectives and sizes measured.
struct Sweep {
  std::int64_t wrong = 0;    // wrong elements over the ranks and sizes
  double busbw_sum = 0;      // the halves' busbw, summed in the table's order [GB/s]
  std::int64_t busbw_n = 0;  // and their number
  std::int64_t sizes = 0;    // sizes measured (two rows each: out of place, in place)
  bool stopped = false;      // the ranks agreed to stop between two sizes
};

/// Every collective at every size -- sizes below its granularity (an element, a rank's share) round
/// to one message, measured once (was: a row each, 1, 2 and 4 bytes all 4) -- each size's rows
/// written and (rank 0) printed. Between sizes `stop` is polled on every rank alike (SIGTERM,
/// SIGUSR1: runtime/stop_request.h): the sweep ends there, its rows kept. Collective.
Sweep sweep(Bench& bench, runtime::MpiEnvironment& env, const CommOptions& o, results::ResultsWriter& writer,
            runtime::StopAgreement& stop) {
  Sweep out;
  const auto element_size = static_cast<std::int64_t>(axes::dtype_info(o.dtype).bytes);
  std::int64_t row = 0;
  for (const Collective collective : o.resolved_collectives) {
    const CollectiveInfo& c = collective_info(collective);
    const double factor = c.bus_factor(env.world_size());
    if (env.rank() == 0) print_collective_header(c, factor);
    std::int64_t previous_bytes = -1;
    for (const std::int64_t size : o.sizes) {
      if ((out.stopped = stop.poll())) return out;
      const std::int64_t bytes = c.counts(size, element_size, env.world_size(), env.rank()).bytes;
      if (bytes == previous_bytes) continue;
      previous_bytes = bytes;
      const SizeResult r = measure_size(bench, env, o, c, size, factor);
      out.wrong += r.wrong;
      for (const double busbw : r.busbw) {  // one at a time: the average's sum in the table's order
        out.busbw_sum += busbw;
        ++out.busbw_n;
      }
      writer.write_comm(row, r.records);
      row += static_cast<std::int64_t>(r.records.size());
      ++out.sizes;
      if (env.rank() == 0) std::cout << r.line << "\n" << std::flush;
    }
  }
  return out;
}

}  // namespace

int run_comm_benchmark(const CommOptions& o, const options::OptionTable& table, runtime::MpiEnvironment& env,
                       const std::string& command_line) {
  const bool root_prints = env.rank() == 0;
  if (const std::string why = refusal(o, env.world_size()); !why.empty()) {
    if (root_prints) std::cerr << "mgbench comm: " << why << "\n";
    return 2;
  }
  session::Connection connection = session::connect(env, o.device, o.backend, o.comm_timeout_s);
  if (!connection.comm) return 1;
  const Agreement fits = agree(env.world(), "checking --max-bytes against memory",
                               [&] { refuse_beyond_memory(o, connection, env.world_size(), env.rank()); });
  if (!fits.ok()) {
    if (root_prints) std::cerr << "mgbench comm: " << fits.error << "\n";
    return 2;
  }
  const std::string backend(runtime::backend_name(connection.backend));
  const std::string device = connection.placement.is_cuda() ? "cuda" : "cpu";

  h5::Attributes attributes = session::common_attributes(env, table, "comm", table.identity(), command_line);
  h5::merge_attributes(attributes, {{"device", device}, {"backend", backend}, {"recipe", std::string("comm")}});
  results::RankLayout layout;
  layout.comm_rows = static_cast<std::int64_t>(o.resolved_collectives.size() * o.sizes.size() * 2);
  h5::Attributes rank_attributes{{"rank", static_cast<std::int64_t>(env.rank())},
                                 {"device", connection.placement.str()}};
  h5::merge_attributes(rank_attributes, session::gpu_attributes(connection.placement));
  runtime::defer_stops_to_step_boundaries();  // from here a stop signal is honoured between sizes
  auto writer = session::open_run(env, o.results, o.run_name, attributes, rank_attributes, layout);
  if (!writer) return 1;
  runtime::StopAgreement stop(env.world());

  const std::string hosts = env.all_hosts();
  if (root_prints) {
    std::cout << fmt::format("# mgbench comm: {} rank(s) on {}, backend {} ({}), device {}\n", env.world_size(), hosts,
                             backend, runtime::backend_info(connection.backend).version(), device);
    std::cout << fmt::format(
        "# dtype {}, op {}, root {}, sizes {} .. {} x{}, warm-up {}, iterations {}, check {}; results {} run {}\n",
        axes::dtype_info(o.dtype).name, options::name_of(reduce_op_choices(), o.op), o.root, o.sizes.front(),
        o.sizes.back(), o.step_factor, o.warmup_iters, o.iters, o.check ? "on" : "off", writer->path(),
        writer->run_id());
    std::cout << "# time: one launch, mean over the iterations, min / avg / max across ranks; algbw = size / avg "
                 "time; busbw = algbw x bus factor (nccl-tests doc/PERFORMANCE.md)\n";
  }
  Bench bench(o, *connection.comm, connection.placement);
  Sweep done;
  const double started = now_s();
  std::string failure;     // wrong values: the run ends "failed" with this message
  std::string transports;  // NCCL's, of all ranks' connections (summary.nccl_transports)
  session::run_or_abort(
      env, *writer, "the collective benchmark",
      [&] {
        done = sweep(bench, env, o, *writer, stop);
        if (done.stopped) {
          if (root_prints) {
            std::cout << fmt::format("# stopped on {} after {} measured sizes: their rows are in {} run {}\n",
                                     runtime::stop_signal_name(stop.agreed_signal()), done.sizes, writer->path(),
                                     writer->run_id());
          }
          return;
        }
        transports = runtime::gather_transports(*connection.comm,
                                                connection.placement.is_cuda()
                                                    ? torch::Device(torch::kCUDA, connection.placement.index)
                                                    : torch::Device(torch::kCPU),
                                                results::kTransportsBytes);
        if (root_prints) {
          results::RunSummary summary;
          summary.total_s = now_s() - started;
          summary.train_s = summary.total_s;
          summary.finished_unix_s = static_cast<double>(std::time(nullptr));
          summary.set_transports(transports);
          writer->write_summary(summary);
        }
        if (done.wrong > 0) {
          failure = fmt::format("correctness check: {} wrong value(s) (the #wrong columns)", done.wrong);
        }
      },
      &done.stopped, &failure);
  if (done.stopped) return runtime::kExitStopped;
  if (root_prints) {
    std::cout << fmt::format("# Out of bounds values : {} {}\n", done.wrong, done.wrong == 0 ? "OK" : "FAILED");
    std::cout << fmt::format("# Avg bus bandwidth    : {:.4g} GB/s\n",
                             done.busbw_n ? done.busbw_sum / static_cast<double>(done.busbw_n) : 0.0);
    if (!transports.empty()) std::cout << fmt::format("# NCCL transports      : {}\n", transports);
    std::cout << "#\n";
  }
  return done.wrong == 0 ? 0 : 1;
}

}  // namespace mgbench::comm
