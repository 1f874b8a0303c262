#pragma once
// One writing job per results file: the write lock ("<file>.lock", fcntl), held by the writing
// job's rank 0 for its whole run -- refused to a second job, seen by the readers, which show a run
// stored "running" whose file no job holds as aborted.
#include <string>

namespace mgbench::results {

/// Takes the exclusive write lock of `path` ("<path>.lock", created if absent; `created` says whether
/// this call made it): "" with fd set (keep it open while writing; closing it releases the lock), or
/// the problem: another job holds it (naming the holder's pid), or the file system has no POSIX locks.
std::string lock_for_writing(const std::string& path, int& fd, bool& created);

/// Removes the lock file of `path`, which this process created and holds (its release, closing the
/// descriptor, follows): a job that failed before its results file held anything leaves no
/// "<path>.lock" behind. A job that opened the file meanwhile takes the lock on the path's new file
/// (lock_for_writing checks that the file it locked is the one the path names).
void remove_lock_file(const std::string& path) noexcept;

/// Whether a job writes the results file at `path`: a ResultsWriter of this process has it open
/// (F_GETLK does not report a process's own locks), or another process holds its write lock
/// (F_GETLK, which takes no lock itself). False without a lock file.
bool being_written(const std::string& path);

/// This process's writers, for being_written(): registered while their file is open.
void register_writer(const std::string& path);
void unregister_writer(const std::string& path) noexcept;

}  // namespace mgbench::results
