#pragma once
// Inputs are read from regular files only: opening a FIFO blocks until a writer appears and a
// device can block any read, which would hold a job's set-up forever (and the stop signals with it).
#include <cstddef>
#include <string>
#include <string_view>

struct gzFile_s;  // zlib's gzFile

namespace mgbench {

/// Throws DataError "<what> '<path>': a FIFO (named pipe), not a regular file; ..." when path
/// exists and is not a regular file after following links (a FIFO, socket, character or block
/// device, directory). A missing path passes: the caller's open names it.
void require_regular_file(const std::string& path, std::string_view what);

/// Up to n bytes of `file` (zlib's gzread: gzip and plain files alike) into out; 0 at the end of
/// the file. Throws DataError "<what> '<path>': ..." for corrupt data, and for a gzip stream that
/// ends before its trailer -- a file cut short, of which gzread returns what it could and reports
/// Z_BUF_ERROR only through gzerror (zlib.h): its text would otherwise pass as the whole file.
std::size_t gz_read(gzFile_s* file, void* out, unsigned n, const std::string& path, std::string_view what);

}  // namespace mgbench
