#pragma once
// Inputs are read from regular files only: opening a FIFO blocks until a writer appears and a
// device can block any read, which would hold a job's set-up forever (and the stop signals with it).
#include <string>
#include <string_view>

namespace mgbench {

/// Throws DataError "<what> '<path>': a FIFO (named pipe), not a regular file; ..." when path
/// exists and is not a regular file after following links (a FIFO, socket, character or block
/// device, directory). A missing path passes: the caller's open names it.
void require_regular_file(const std::string& path, std::string_view what);

}  // namespace mgbench
