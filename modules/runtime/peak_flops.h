#pragma once
// Peak dense matrix throughput of known GPUs, for MFU (model FLOPs utilisation = achieved FLOP/s /
// this peak). One row per GPU model, matched on the CUDA device name and its SM count (H100 SXM5,
// PCIe and NVL share a name stem and differ in SMs or suffix), each with its datasheet. Dense
// figures: the datasheets print tensor-core throughput with 2:4 sparsity; dense is half of it.
// Adding a GPU: one row in peak_flops.cpp.
#include <span>
#include <string>
#include <string_view>

namespace mgbench::runtime {

/// The arithmetic a run's matrix products use (precision and TF32 setting decide it).
enum class MathKind { kBf16, kFp16, kTf32, kFp32, kFp64 };  // also the index into GpuPeak::tflops

struct GpuPeak {
  std::string_view model;          // "H100 SXM5"
  std::string_view name_contains;  // in cudaDeviceProp::name ("H100 PCIe"); the first matching row wins
  int sm_count;                    // cudaDeviceProp::multiProcessorCount; 0 = any
  double tflops[5];                // dense TFLOP/s (10^12 / s) by MathKind: bf16, fp16, tf32, fp32, fp64
  std::string_view source;         // the datasheet
};

/// The table, most specific rows first.
std::span<const GpuPeak> gpu_peaks();

struct PeakFlops {
  double flops;        // FLOP/s; NaN when unknown
  std::string source;  // "--peak-tflops", "H100 SXM5 bf16, NVIDIA H100 datasheet ...", or why unknown
};

/// The peak for a device named `device_name` with `sm_count` SMs doing `kind` maths; configured
/// TFLOP/s (> 0, from --peak-tflops) wins. Unknown devices (and the CPU: device_name "") give NaN
/// with the reason, never a guess.
PeakFlops peak_flops(std::string_view device_name, int sm_count, MathKind kind, double configured_tflops);

}  // namespace mgbench::runtime
