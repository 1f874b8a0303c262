#pragma once
// Durable files: what must survive a node failure (checkpoints, their manifests) is flushed to
// stable storage before it takes its final name; what is superseded is removed.
#include <cstdint>
#include <string>

namespace mgbench {

/// fsync(2) of a file, or of a directory (which makes a rename inside it durable). Throws
/// DataError naming the path and the system's reason.
void sync_to_disk(const std::string& path);

/// Removes a file or a directory tree (symbolic links themselves, never what they point to), as
/// std::filesystem::remove_all does; a path that does not exist removes nothing. Returns the
/// number of entries removed. Throws DataError naming the entry and the system's reason.
/// Not std::filesystem::remove_all itself: the PyTorch wheels' libtorch.so exports a statically
/// linked copy of it whose calls into libstdc++ are weak (recursive_directory_iterator::__erase),
/// and where a process binds to that copy (seen on an H200 machine, GCC 13 and LibTorch 2.11) the
/// first call jumps to address 0 (pytorch/pytorch#133437).
std::uintmax_t remove_tree(const std::string& path);

/// Makes `path` a directory this process may write into, creating it and its parents where missing
/// (concurrent creation of one path by several ranks is no error). Returns "" when it is one, else
/// why not: the system's reason (e.g. "Permission denied") or "not a directory". Throws nothing: the caller
/// names its option in the error (--output-dir, --checkpoint-dir).
std::string make_writable_directory(const std::string& path);

}  // namespace mgbench
