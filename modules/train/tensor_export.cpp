#include "train/tensor_export.h"

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "models/safetensors.h"

namespace mgbench::train {

void write_tensor_exports(const std::vector<TensorExport>& exports, FullyShardedUnits* fsdp, bool writes) {
  if (exports.empty()) return;  // the same on every rank: no rank gathers
  // Rank 0's files, laid out from the tensors' names, dtypes and shapes (known while sharded too).
  std::vector<std::unique_ptr<models::SafetensorsWriter>> files;
  struct Pending {
    std::size_t file;
    std::string name;
    torch::Tensor tensor;
  };
  std::unordered_multimap<const c10::TensorImpl*, Pending> pending;
  if (writes) {
    for (const TensorExport& e : exports) {
      if (const auto dir = std::filesystem::path(e.path).parent_path(); !dir.empty()) {
        std::filesystem::create_directories(dir);
      }
      std::vector<models::SafetensorsWriter::Entry> entries;
      for (const auto& [name, t] : e.tensors) {
        entries.push_back({name, t.scalar_type(), t.sizes().vec()});
        pending.emplace(t.unsafeGetTensorImpl(), Pending{files.size(), name, t});
      }
      files.push_back(std::make_unique<models::SafetensorsWriter>(e.path, std::move(entries), e.metadata));
    }
  }
  const auto write_held = [&](const torch::Tensor& t) {
    const auto [first, last] = pending.equal_range(t.unsafeGetTensorImpl());
    for (auto it = first; it != last; ++it) files[it->second.file]->write(it->second.name, t);
    pending.erase(first, last);
  };
  if (fsdp != nullptr) {
    fsdp->for_each_unit_gathered([&](const std::vector<torch::Tensor>& parameters) {
      for (const torch::Tensor& p : parameters) write_held(p);
    });
    MGBENCH_REQUIRE(pending.empty(), std::logic_error, "export: '{}' belongs to no FSDP unit of the model",
                    pending.empty() ? std::string() : pending.begin()->second.name);
  }
  while (!pending.empty()) write_held(pending.begin()->second.tensor);  // replicas: held whole
  for (const auto& file : files) file->commit();
}

}  // namespace mgbench::train
