#pragma once
// The transports NCCL chose for a communicator's connections, read from its INFO log: NCCL has no
// API that says them, and the log lines are what nccl-tests users read ("Channel 00/0 : 0[0] ->
// 1[1] via P2P/CUMEM/read"). The strings here follow NCCL 2.19-2.28's src/transport/{p2p,shm,net}.cc
// (and the older "Ring 00 : 0 -> 1 [send] via NET/..." form).
#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <string_view>

namespace mgbench::runtime {

/// Connections per transport, e.g. {"P2P/CUMEM/read": 24, "NET/IB/GDRDMA": 8}.
using TransportCounts = std::map<std::string, std::int64_t>;

/// The transport of one NCCL INFO line, or "" when the line is not a connection's. The name is the
/// text after "via " without what differs between connections of one kind: the NET device index,
/// the proxy rank, "(PCI)", the intermediate rank of P2P/indirect. Only the sending side of a NET
/// connection counts ("[receive]" lines are its other end). Examples:
///   "... Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"              -> "P2P/CUMEM/read"
///   "... Channel 01 : 0[0] -> 1[1] via SHM/direct/direct"             -> "SHM/direct/direct"
///   "... Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/3/GDRDMA/Shared" -> "NET/IB/GDRDMA/Shared"
///   "... Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read"      -> "P2P/indirect/read"
std::string nccl_line_transport(std::string_view line);

/// The connections of an NCCL INFO log (NCCL_DEBUG=INFO with the P2P, SHM or NET subsystem) by
/// transport.
TransportCounts parse_nccl_transports(std::istream& log);

/// "P2P/CUMEM/read x24, NET/IB/GDRDMA x8": most connections first, then by name; "none" for no
/// connection (one rank, or no collective yet).
std::string format_transports(const TransportCounts& counts);

/// The counts of a format_transports text (the inverse; "none" and "" give none). Throws
/// std::invalid_argument on text not of that form.
TransportCounts parse_transports(std::string_view text);

}  // namespace mgbench::runtime
