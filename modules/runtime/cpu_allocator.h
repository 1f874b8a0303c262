#pragma once
// Where LibTorch's CPU tensors get their memory when the process runs on glibc's malloc.
//
// c10's default CPU allocator asks posix_memalign(64) (c10/core/impl/alloc_cpu.cpp). glibc's
// memalign (2.36 here) pads the request by the alignment and a minimum chunk, cuts the aligned block
// out of it and frees the cut-off remainders, which small allocations then take. A freed block is
// then exactly its aligned size, too small for the next memalign of the same size: the heap grows by
// each such block instead of reusing it (measured in a small program: 100 rounds of a 512 KiB
// memalign, a 48-byte malloc kept and the block freed grow the heap by 50 MiB; 0.6 MiB with malloc).
// How often it happens depends on what the heap's free lists hold. glibc 2.39 changed how memalign
// merges its remainders (sourceware bug 30723); not measured here.
//
// What that cost mgbench: a 2-rank FSDP LoRA step (fp32, 90 decoder layers of 43 MiB, activation
// checkpointing) left ~290 MiB of such holes in each rank's heap in its first step (mallinfo2),
// against ~150 MiB of tensors it holds above its shards; with each rank in a cgroup of 0.6x the
// checkpoint's bytes the kernel killed a rank at 135 layers (issue 48). MallocAlignedAllocator asks
// malloc for the size plus the alignment and aligns inside the block, so a freed block serves the next
// request of its size: 20 MiB of holes, the 135-layer run inside 0.6x, the set-up's peak unchanged
// without the 1 MiB mmap threshold mgbench set while loading before, and the CPU step as fast
// (docs/design.md, "The host allocator").
#include <cstddef>
#include <string>

#include <c10/core/Allocator.h>

namespace mgbench::runtime {

/// A c10 CPU allocator: each block from malloc(nbytes + kAlignment), the tensor's data at the first
/// kAlignment-aligned byte past the block's address (c10's alignment for vectorised kernels;
/// oneDNN's), which is stored in the 8 bytes before the data; free() of the block on release. The
/// DataPtr's context is its data and raw_deleter() frees it, as c10's Allocator::raw_allocate
/// requires (LibTorch's CPU kernels allocate workspaces through it). Reports each allocation and
/// release to c10's ProfiledCPUMemoryReporter as c10's default allocator does (torch.profiler's
/// profile_memory, and mgbench's tests, read it). Throws c10::OutOfMemoryError when malloc fails,
/// naming the bytes.
class MallocAlignedAllocator final : public c10::Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;  // c10::gAlignment on servers [bytes]

  c10::DataPtr allocate(std::size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
};

/// Installs a MallocAlignedAllocator as LibTorch's CPU allocator where the process's malloc is
/// glibc's (host_memory::process_allocator); TCMalloc's and jemalloc's memalign reuse freed blocks
/// and are left to c10's. Tensors allocated before keep their own allocator's deleter. Returns one
/// line for the log. Does not throw.
std::string use_malloc_aligned_cpu_allocator();

}  // namespace mgbench::runtime
