// runtime/nccl_transports: NCCL's connection lines as NCCL 2.19-2.28 print them (the format strings of
// src/transport/p2p.cc, shm.cc, net.cc, with the "hostname:pid:tid [dev] NCCL INFO " prefix).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/nccl_log.h"
#include "runtime/nccl_transports.h"

namespace mgbench::runtime {
namespace {

constexpr const char* kPrefix = "gpu-node07:412934:413001 [0] NCCL INFO ";

std::string line(const std::string& text) { return kPrefix + text; }

TEST(NcclTransports, EachConnectionLineFormNamesItsTransport) {
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read")), "P2P/CUMEM/read");
  EXPECT_EQ(nccl_line_transport(line("Channel 13/1 : 3[3] -> 0[0] via P2P/CUMEM")), "P2P/CUMEM");
  EXPECT_EQ(nccl_line_transport(line("Channel 02/0 : 0[0] -> 1[1] via P2P/IPC/read/CE")), "P2P/IPC/read/CE");
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read")),
            "P2P/direct pointer/read");
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 0[0] -> 1[1] via P2P/MNNVL/read")), "P2P/MNNVL/read");
  EXPECT_EQ(nccl_line_transport(line("Channel 01/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read")), "P2P/indirect/read");
  EXPECT_EQ(nccl_line_transport(line("Channel 01 : 0[0] -> 1[1] via SHM/direct/direct")), "SHM/direct/direct");
  EXPECT_EQ(nccl_line_transport(line("Channel 01 : 0[1b000] -> 1[1c000] via SHM/CE/direct")), "SHM/CE/direct");
  // NET: the device index, the proxy rank and "(PCI)" differ between connections of one kind.
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/3/GDRDMA")), "NET/IB/GDRDMA");
  EXPECT_EQ(nccl_line_transport(line("Channel 00/1 : 1[1] -> 9[1] [send] via NET/IB/0(0)/GDRDMA(PCI)/Shared")),
            "NET/IB/GDRDMA/Shared");
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 0[0] -> 2[0] [send] via NET/Socket/0")), "NET/Socket");
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 0[0] -> 2[0] [send] via NET/AWS Libfabric/1/GDRDMA")),
            "NET/AWS Libfabric/GDRDMA");
  EXPECT_EQ(nccl_line_transport(line("Ring 00 : 0 -> 1 [send] via NET/IB/0/GDRDMA")), "NET/IB/GDRDMA");
  // The receiving end of a NET connection is the same connection.
  EXPECT_EQ(nccl_line_transport(line("Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/3/GDRDMA")), "");
  // Not connection lines.
  EXPECT_EQ(nccl_line_transport(line("NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.7<0>")), "");
  EXPECT_EQ(nccl_line_transport(line("Connected all rings, use ring PXN 0 GDR 1")), "");
  EXPECT_EQ(nccl_line_transport(line("Channel 00/24 :    0   1   2   3")), "");
  EXPECT_EQ(nccl_line_transport(""), "");
}

TEST(NcclTransports, ALogIsCountedPerTransportAndFormattedMostFirst) {
  std::stringstream log;
  for (int c = 0; c < 3; ++c) log << line("Channel 0" + std::to_string(c) + "/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n");
  log << line("Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n")
      << line("Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA\n")
      << line("Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1/GDRDMA\n") << line("NCCL version 2.28.3+cuda13.0\n")
      << "a line of someone else's\n";
  const TransportCounts counts = parse_nccl_transports(log);
  EXPECT_EQ(counts, (TransportCounts{{"P2P/CUMEM/read", 3}, {"NET/IB/GDRDMA", 2}}));
  EXPECT_EQ(format_transports(counts), "P2P/CUMEM/read x3, NET/IB/GDRDMA x2");
  EXPECT_EQ(parse_transports(format_transports(counts)), counts);
  EXPECT_EQ(format_transports({}), "none");
  EXPECT_TRUE(parse_transports("none").empty());
  EXPECT_TRUE(parse_transports("").empty());
  EXPECT_EQ(parse_transports("P2P/direct pointer/read x12"), (TransportCounts{{"P2P/direct pointer/read", 12}}));
  EXPECT_THROW(parse_transports("P2P/CUMEM/read"), std::invalid_argument);
  EXPECT_THROW(parse_transports("P2P/CUMEM/read x"), std::invalid_argument);
  EXPECT_THROW(parse_transports("P2P/CUMEM/read x3, NET/IB x2b"), std::invalid_argument);
}

// A failing communicator shows NCCL's own warnings from its part of the routed log: the WARN lines
// after its offset (an earlier communicator's left out), the last ones, their prefix dropped.
TEST(NcclLog, WarningsAreTheWarnLinesAfterTheOffsetTheLastOnesKept) {
  const std::string path = testing::TempDir() + "mgbench-nccl-warnings.log";
  const std::string earlier = "gpu-node07:412934:413001 [0] NCCL WARN an earlier communicator's\n";
  {
    std::ofstream out(path);
    out << earlier << line("NCCL version 2.28.9+cuda13.0\n")
        << "gpu-node07:412934:413007 [0] NCCL WARN Cuda failure 'out of memory'\n"
        << line("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n")
        << "gpu-node07:412934:413007 [0] NCCL WARN socket.cc:428 Connection closed by remote peer\n"
        << "gpu-node07:412934:413007 [0] NCCL WARN proxy.cc:1520 NCCL WARN [Service thread] Error\n";
  }
  const NcclLog log{path, ""};
  EXPECT_EQ(nccl_log_warnings(log, earlier.size(), 8),
            (std::vector<std::string>{"Cuda failure 'out of memory'", "socket.cc:428 Connection closed by remote peer",
                                      "proxy.cc:1520 NCCL WARN [Service thread] Error"}));
  EXPECT_EQ(nccl_log_warnings(log, earlier.size(), 1),
            (std::vector<std::string>{"proxy.cc:1520 NCCL WARN [Service thread] Error"}));
  EXPECT_EQ(nccl_log_warnings(log, 0, 8).front(), "an earlier communicator's");
  EXPECT_TRUE(nccl_log_warnings(log, earlier.size(), 0).empty());
  EXPECT_TRUE(nccl_log_warnings(NcclLog{"", "unread: set outside"}, 0, 8).empty());
  EXPECT_TRUE(nccl_log_warnings(NcclLog{path + ".missing", ""}, 0, 8).empty());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mgbench::runtime
