#pragma once
// Durable files: what must survive a node failure (checkpoints, their manifests) is flushed to
// stable storage before it takes its final name.
#include <string>

namespace mgbench {

/// fsync(2) of a file, or of a directory (which makes a rename inside it durable). Throws
/// DataError naming the path and the system's reason.
void sync_to_disk(const std::string& path);

}  // namespace mgbench
