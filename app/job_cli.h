#pragma once
// The command-line stages every MPI job command (image, llm) shares: parsing on every rank with
// errors reported once, and the resolved configuration echoed by rank 0.
#include <functional>
#include <optional>
#include <string>

#include "options.h"
#include "runtime/mpi_env.h"
#include "train/checkpoint_options.h"

namespace mgbench::app {

/// The options every job command has: --config, --dry-run, --verbose, --help.
po::options_description job_general_options();

/// The preemption options every job command has: --checkpoint-dir, --checkpoint-every, --resume.
po::options_description checkpoint_options(train::CheckpointOptions& options);

/// Parses argv into vm on every rank, then runs `finish` (completes and validates the config;
/// throws ConfigError). Returns the exit code when the command is already done: 0 after --help
/// (printed by rank 0), 2 for a bad option (every rank fails alike; rank 0 prints it once, naming
/// `command`). nullopt: go on.
std::optional<int> parse_job_options(const runtime::MpiEnvironment& env, const std::string& command, int argc,
                                     char** argv, const po::options_description& options, po::variables_map& vm,
                                     const std::function<void()>& finish);

/// Initialises logging (--verbose), and has rank 0 print "# mgbench <command>: N rank(s) on hosts"
/// and the resolved configuration as '#' lines. Returns that configuration as INI text (stored
/// with the run). Collective (host names).
std::string announce_job(const runtime::MpiEnvironment& env, const std::string& command, const po::variables_map& vm);

}  // namespace mgbench::app
