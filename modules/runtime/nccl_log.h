#pragma once
// Where this process's NCCL INFO log goes, and the transports a communicator reads back from it.
// NCCL reads NCCL_DEBUG* once, at its first initialisation, so the first communicator routes it for
// all (a file in the temporary directory, removed at exit, holding the connection lines of the P2P,
// SHM and NET subsystems: setup-time lines only, nothing per collective). A user's own NCCL_DEBUG /
// NCCL_DEBUG_FILE is left alone. Internal to runtime/ (the NCCL backend); free of NCCL and CUDA.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mgbench::runtime {

struct NcclLog {
  std::string path;    // "" when not routed
  std::string unread;  // why not: an "unread: ..." sentence
};

/// The process's NCCL log, routed at the first call (NCCL_DEBUG_FILE, NCCL_DEBUG=INFO and, unless
/// set, NCCL_DEBUG_SUBSYS=P2P,SHM,NET): call it before NCCL's first initialisation.
const NcclLog& nccl_log();

/// The log's size now [bytes], where the lines of a communicator created next start; 0 when the log
/// is not routed or not written yet.
std::uintmax_t nccl_log_size(const NcclLog& log);

/// The transports of the connections logged from byte `offset` on, as format_transports() writes them
/// ("P2P/CUMEM/read x24"), or why they cannot be read: the log's `unread`, or "unread: NCCL wrote no
/// log ..." when the file is missing.
std::string nccl_log_transports(const NcclLog& log, std::uintmax_t offset);

/// NCCL's own warnings ("NCCL WARN" lines) logged from byte `offset` on, the last `max_lines` of
/// them, their "host:pid:tid [dev] NCCL WARN " prefix dropped: what a failing communicator's error
/// shows, since the routed log is removed at exit. Empty when the log is not routed or holds none.
std::vector<std::string> nccl_log_warnings(const NcclLog& log, std::uintmax_t offset, std::size_t max_lines);

}  // namespace mgbench::runtime
