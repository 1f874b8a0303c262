#include "runtime/peak_flops.h"

#include <limits>

#include <fmt/format.h>

namespace mgbench::runtime {
namespace {

// FP64 is the FP64 tensor-core figure (DGEMM runs on it on Hopper and Ampere). Order matters:
// "H100 NVL" and "H100 PCIe" before "H100", "GH200" before "H200".
constexpr GpuPeak kPeaks[] = {
    {"H100 NVL",
     "H100 NVL",
     132,
     {835.5, 835.5, 417.5, 60.0, 60.0},
     "NVIDIA H100 NVL product brief (2024): BF16/FP16 1671, TF32 835 TFLOPS with sparsity; FP32 60, FP64 TC 60"},
    {"H100 PCIe",
     "H100 PCIe",
     114,
     {756.0, 756.0, 378.0, 51.0, 51.0},
     "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe: BF16/FP16 1513, TF32 756 with sparsity; FP32 51, FP64 TC 51"},
    {"H100 SXM5",
     "H100",
     132,
     {989.5, 989.5, 494.5, 67.0, 67.0},
     "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM: BF16/FP16 1979, TF32 989 with sparsity; FP32 67, FP64 TC 67"},
    {"GH200",
     "GH200",
     132,
     {989.5, 989.5, 494.5, 67.0, 67.0},
     "NVIDIA GH200 Grace Hopper Superchip datasheet (2024): the H100 SXM figures"},
    {"H200 NVL",
     "H200 NVL",
     132,
     {835.5, 835.5, 417.5, 60.0, 60.0},
     "NVIDIA H200 Tensor Core GPU datasheet (2024), NVL: BF16/FP16 1671, TF32 835 with sparsity; FP32 60, FP64 TC 60"},
    {"H200 SXM",
     "H200",
     132,
     {989.5, 989.5, 494.5, 67.0, 67.0},
     "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM: BF16/FP16 1979, TF32 989 with sparsity; FP32 67, FP64 TC 67"},
    {"A100",
     "A100",
     108,
     {312.0, 312.0, 156.0, 19.5, 19.5},
     "NVIDIA A100 Tensor Core GPU datasheet (2021): BF16/FP16 312, TF32 156 dense; FP32 19.5, FP64 TC 19.5"},
};

// Indexed by MathKind.
constexpr const char* kKindNames[] = {"bf16", "fp16", "tf32", "fp32", "fp64"};

}  // namespace

std::span<const GpuPeak> gpu_peaks() { return kPeaks; }

PeakFlops peak_flops(std::string_view device_name, int sm_count, MathKind kind, double configured_tflops) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (configured_tflops > 0) return {configured_tflops * 1e12, "--peak-tflops"};
  if (device_name.empty()) return {kNaN, "no GPU (MFU needs --peak-tflops)"};
  for (const auto& p : kPeaks) {
    if (device_name.find(p.name_contains) == std::string_view::npos) continue;
    if (p.sm_count != 0 && p.sm_count != sm_count) continue;
    const auto k = static_cast<std::size_t>(kind);
    return {p.tflops[k] * 1e12, fmt::format("{} {} dense, {}", p.model, kKindNames[k], p.source)};
  }
  return {kNaN,
          fmt::format("'{}' with {} SMs is not in the peak table (MFU needs --peak-tflops)", device_name, sm_count)};
}

}  // namespace mgbench::runtime
