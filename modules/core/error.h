#pragma once
// Typed errors for mgbench and the CHECK macros that raise them.
//
// Modules throw; a process ends where a command's entry point catches (app/, or the command
// function it calls: train::run_job, report::run_report, ...): a message and an exit code, a clean
// exit when every rank agrees on the failure, MPI_Abort otherwise, so no rank is left waiting in a
// collective.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace mgbench {

/// Base class of every error mgbench raises on purpose. what() is a complete, user-facing sentence.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A bad option, option value or configuration file. Exit code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Unusable input data: missing, truncated or corrupt file, wrong dimensions. Names the file.
class DataError : public Error {
 public:
  using Error::Error;
};

/// A failure in the results file (HDF5) layer. Names the file and the object.
class ResultsError : public Error {
 public:
  using Error::Error;
};

/// A failure of MPI, NCCL or a peer rank.
class CommError : public Error {
 public:
  using Error::Error;
};

/// Process exit code for an error: 2 for configuration errors, 1 for everything else.
int exit_code_for(const std::exception& e) noexcept;

/// e.what() as a user reads it: without the C++ backtrace LibTorch's c10::Error appends to its
/// message ("\nException raised from <function> at <file>:<line> (most recent call first):\nframe
/// #0: ...", or for C10_ENFORCE only "\nframe #0: ...", c10/util/Exception.cpp) -- fifty frames in
/// a log or a results file's `error` say nothing to a user. Other exceptions' text whole.
std::string error_message(const std::exception& e);

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace mgbench

/// Throws ExceptionType with a formatted message when cond is false.
#define MGBENCH_REQUIRE(cond, ExceptionType, ...)               \
  do {                                                          \
    if (!(cond)) throw ExceptionType(fmt::format(__VA_ARGS__)); \
  } while (0)

/// Checks an MPI call; throws CommError naming the call, the MPI error string and file:line.
#define MGBENCH_CHECK_MPI(call)                                                                               \
  do {                                                                                                        \
    const int mgbench_mpi_rc_ = (call);                                                                       \
    if (mgbench_mpi_rc_ != 0) ::mgbench::detail::throw_mpi_error(mgbench_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
