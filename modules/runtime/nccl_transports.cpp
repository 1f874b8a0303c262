#include "runtime/nccl_transports.h"

#include <algorithm>
#include <regex>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace mgbench::runtime {
namespace {

/// "<name>/<device>[(<proxy rank>)][/GDRDMA][(PCI)][/Shared]" -> "<name>[/GDRDMA][/Shared]".
std::string net_transport(const std::string& after_net) {
  static const std::regex kNet(R"(^([^/]+)/\d+(\(\d+\))?(/GDRDMA)?(\(PCI\))?(/Shared)?)");
  std::smatch m;
  if (!std::regex_search(after_net, m, kNet)) return "NET/" + after_net;
  return "NET/" + m[1].str() + m[3].str() + m[5].str();
}

}  // namespace

std::string nccl_line_transport(std::string_view line) {
  // "Channel 00/0 : 0[0] -> 1[1] " or "Channel 00 : 0[1b000] -> 1[1c000] " (bus ids, older) or
  // "Ring 00 : 0 -> 1 ", then an optional "[send] " / "[receive] ", then "via <transport>".
  static const std::regex kConnection(
      R"((?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[[0-9a-fA-Fx]+\])? -> \d+(?:\[[0-9a-fA-Fx]+\])? (\[(send|receive)\] )?via (.+?)\s*$)");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_search(line.begin(), line.end(), m, kConnection)) return "";
  if (m[2].matched && m[2].str() == "receive") return "";
  const std::string via = m[3].str();
  if (via.rfind("NET/", 0) == 0) return net_transport(via.substr(4));
  static const std::regex kIndirect(R"(^P2P/indirect/\d+\[[0-9a-fA-Fx]+\])");
  return std::regex_replace(via, kIndirect, "P2P/indirect");
}

TransportCounts parse_nccl_transports(std::istream& log) {
  TransportCounts counts;
  std::string line;
  while (std::getline(log, line)) {
    if (line.find(" via ") == std::string::npos) continue;  // the regex only where it can match
    if (std::string t = nccl_line_transport(line); !t.empty()) ++counts[std::move(t)];
  }
  return counts;
}

std::string format_transports(const TransportCounts& counts) {
  if (counts.empty()) return "none";
  std::vector<std::pair<std::string, std::int64_t>> rows(counts.begin(), counts.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [name, n] : rows) out += fmt::format("{}{} x{}", out.empty() ? "" : ", ", name, n);
  return out;
}

TransportCounts parse_transports(std::string_view text) {
  TransportCounts counts;
  if (text.empty() || text == "none") return counts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(", ", start), text.size());
    const std::string_view item = text.substr(start, end - start);
    const std::size_t x = item.rfind(" x");
    std::int64_t n = 0;
    const bool digits = x != std::string_view::npos && x + 2 < item.size() &&
                        std::all_of(item.begin() + static_cast<std::ptrdiff_t>(x + 2), item.end(),
                                    [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) throw std::invalid_argument(fmt::format("not a transport count '<name> x<n>': '{}'", item));
    for (char c : item.substr(x + 2)) n = n * 10 + (c - '0');
    counts[std::string(item.substr(0, x))] += n;
    start = end + 2;
  }
  return counts;
}

}  // namespace mgbench::runtime
