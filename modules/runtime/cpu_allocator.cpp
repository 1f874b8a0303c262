#include "runtime/cpu_allocator.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "core/host_memory.h"

namespace mgbench::runtime {
namespace {

/// The malloc'ed block a tensor's data lies in: its address is stored in the 8 bytes before the data.
void*& block_of(void* data) { return static_cast<void**>(data)[-1]; }

/// Releases the block of data (which raw_allocate's callers hand back; the DataPtr's context is
/// the data, as c10's Allocator::raw_allocate asserts).
void release(void* data) {
  if (data == nullptr) return;
  c10::profiledCPUMemoryReporter().Delete(data);
  std::free(block_of(data));
}

}  // namespace

c10::DataPtr MallocAlignedAllocator::allocate(std::size_t nbytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (nbytes == 0) return {nullptr, nullptr, &release, cpu};
  // malloc's blocks are 16-byte aligned: the first aligned byte 8 bytes or more past the block's
  // address is at most kAlignment bytes past it.
  static_assert(alignof(std::max_align_t) >= 16 && kAlignment % 16 == 0);
  // A size near SIZE_MAX (a corrupt shape) must not wrap around to a small block.
  void* block = nbytes <= PTRDIFF_MAX - kAlignment ? std::malloc(nbytes + kAlignment) : nullptr;
  if (block == nullptr) {
    c10::profiledCPUMemoryReporter().OutOfMemory(nbytes);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "host memory: malloc of ", nbytes, " + ", kAlignment,
                     " bytes for a CPU tensor failed");
  }
  const auto after_address = reinterpret_cast<std::uintptr_t>(block) + sizeof(void*);
  void* data = reinterpret_cast<void*>((after_address + kAlignment - 1) & ~std::uintptr_t{kAlignment - 1});
  block_of(data) = block;
  c10::profiledCPUMemoryReporter().New(data, nbytes);
  return {data, data, &release, cpu};
}

c10::DeleterFnPtr MallocAlignedAllocator::raw_deleter() const { return &release; }

void MallocAlignedAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

std::string use_malloc_aligned_cpu_allocator() {
  const host_memory::Allocator process = host_memory::process_allocator();
  if (!process.glibc()) return fmt::format("CPU tensors from c10's allocator (on {})", process.name);
  // Never destroyed: tensors freed during static destruction still release through it.
  static auto* const allocator = new MallocAlignedAllocator();
  c10::SetCPUAllocator(allocator, /*priority=*/1);  // above c10's default (0)
  return "CPU tensors from malloc, aligned to 64 bytes inside their blocks (glibc's memalign does not reuse a freed "
         "block for the next of its size)";
}

}  // namespace mgbench::runtime
