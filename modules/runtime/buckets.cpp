#include "runtime/buckets.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace mgbench::runtime {

std::vector<BucketAssignment> assign_buckets(std::span<const TensorSize> tensors, std::size_t first_bucket_bytes,
                                             std::size_t bucket_bytes) {
  if (first_bucket_bytes == 0 || bucket_bytes == 0) throw std::invalid_argument("bucket byte limits must be > 0");
  struct Open {
    BucketAssignment bucket;
    bool first = true;
  };
  std::map<int, Open> open;  // per dtype, the bucket being filled
  std::vector<BucketAssignment> done;
  for (std::size_t k = tensors.size(); k-- > 0;) {
    Open& o = open[tensors[k].dtype];
    o.bucket.dtype = tensors[k].dtype;
    o.bucket.tensors.push_back(k);
    o.bucket.bytes += tensors[k].bytes;
    if (o.bucket.bytes >= (o.first ? first_bucket_bytes : bucket_bytes)) {
      done.push_back(std::move(o.bucket));
      o.bucket = BucketAssignment{};
      o.first = false;
    }
  }
  for (auto& [dtype, o] : open) {
    if (!o.bucket.tensors.empty()) done.push_back(std::move(o.bucket));
  }
  // Ready order: a bucket is complete when its last-produced gradient (its highest position in
  // the reversed order, i.e. its smallest parameter index) arrives; sort by that.
  std::stable_sort(done.begin(), done.end(), [](const BucketAssignment& a, const BucketAssignment& b) {
    return a.tensors.back() > b.tensors.back();
  });
  return done;
}

}  // namespace mgbench::runtime
