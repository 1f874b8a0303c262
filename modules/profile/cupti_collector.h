#pragma once
// In-process CUDA profiling with CUPTI's activity API (the CUPTI of the CUDA toolkit, loaded
// from the same file LibTorch loads): memory copies, runtime and driver API calls, and kernels
// of this process, collected while the profile window is open and summed by ActivityAggregator.
// What Nsight Systems shows the paper's authors, without an external tool or trace files.
#include <memory>
#include <string>

#include "profile/cuda_activity.h"

namespace mgbench::profile {

/// Why another CUDA profiler holds this process's CUPTI ("Nsight Systems: NSYS_PROFILING_SESSION_ID
/// is set", "CUDA_INJECTION64_PATH=..."), or "" when none is attached. CUPTI takes one activity
/// client: under `nsys profile` mgbench's collector must stand aside (nsys records the same data).
std::string external_cuda_profiler();

/// Labels the CUDA API calls this thread makes while it lives (the copies they make) with `purpose`,
/// as CUPTI's external correlation (custom kind 0), so that the collector attributes each HtoD copy to
/// what made it: cuda_summary's htod_train_*, htod_eval_*, htod_staging_*. Only while a collector
/// records (otherwise nothing: CUPTI is not even loaded); scopes nest (the innermost labels). Put it on
/// the thread that issues the copy: CUPTI's labels are per thread.
class CopyScope {
 public:
  explicit CopyScope(CopyPurpose purpose);
  ~CopyScope();
  CopyScope(const CopyScope&) = delete;
  CopyScope& operator=(const CopyScope&) = delete;

 private:
  bool pushed_ = false;
};

class CuptiCollector {
 public:
  /// The process-wide collector (CUPTI allows one activity client; one collector may exist at a
  /// time, starting from zero totals), or nullptr when mgbench was built without CUPTI. Throws
  /// Error with CUPTI's message when CUPTI cannot be initialised (e.g. another profiler holds it).
  static std::unique_ptr<CuptiCollector> create();
  virtual ~CuptiCollector() = default;

  /// Starts recording memcpy, runtime API, driver API and kernel activity.
  virtual void start() = 0;
  /// Stops recording and flushes the buffers into the totals.
  virtual void stop() = 0;
  virtual bool running() const = 0;
  /// A gap between training steps begins / ends now (CUPTI's clock): what CUPTI records from here
  /// to the end is kept apart from the steps' totals (ActivityAggregator::begin_between_steps). The
  /// caller makes sure the step's device work is complete before the begin (the step's host sync),
  /// and the gap's before the end.
  virtual void begin_between_steps() = 0;
  virtual void end_between_steps() = 0;
  /// Totals so far (flushes completed buffers first).
  virtual const ActivityAggregator& totals() = 0;
};

}  // namespace mgbench::profile
