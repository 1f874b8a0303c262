#include "runtime/nccl_log.h"

#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "runtime/nccl_transports.h"

namespace mgbench::runtime {
namespace {

std::uintmax_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

}  // namespace

const NcclLog& nccl_log() {
  static const NcclLog log = [] {
    NcclLog l;
    if (std::getenv("NCCL_DEBUG") != nullptr || std::getenv("NCCL_DEBUG_FILE") != nullptr) {
      l.unread = "unread: NCCL_DEBUG or NCCL_DEBUG_FILE set outside mgbench (NCCL's log left as set there)";
      return l;
    }
    std::error_code ec;
    const auto dir = std::filesystem::temp_directory_path(ec);
    if (ec) {
      l.unread = "unread: no temporary directory for NCCL's log";
      return l;
    }
    l.path = (dir / fmt::format("mgbench-nccl-{}.log", ::getpid())).string();
    ::setenv("NCCL_DEBUG_FILE", l.path.c_str(), 1);
    ::setenv("NCCL_DEBUG", "INFO", 1);
    ::setenv("NCCL_DEBUG_SUBSYS", "P2P,SHM,NET", 0);
    static std::string remove_at_exit;
    remove_at_exit = l.path;
    std::atexit([] { ::unlink(remove_at_exit.c_str()); });
    return l;
  }();
  return log;
}

std::uintmax_t nccl_log_size(const NcclLog& log) { return log.path.empty() ? 0 : file_size_or_zero(log.path); }

std::string nccl_log_transports(const NcclLog& log, std::uintmax_t offset) {
  if (!log.unread.empty()) return log.unread;
  std::ifstream in(log.path);
  if (!in) return "unread: NCCL wrote no log (initialised in this process before mgbench routed it)";
  in.seekg(static_cast<std::streamoff>(offset));
  return format_transports(parse_nccl_transports(in));
}

std::vector<std::string> nccl_log_warnings(const NcclLog& log, std::uintmax_t offset, std::size_t max_lines) {
  std::vector<std::string> warnings;
  if (log.path.empty() || max_lines == 0) return warnings;
  std::ifstream in(log.path);
  if (!in) return warnings;
  in.seekg(static_cast<std::streamoff>(offset));
  constexpr std::string_view kWarn = " NCCL WARN ";
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(kWarn);
    if (at == std::string::npos) continue;
    last.push_back(line.substr(at + kWarn.size()));
    if (last.size() > max_lines) last.pop_front();
  }
  warnings.assign(last.begin(), last.end());
  return warnings;
}

}  // namespace mgbench::runtime
