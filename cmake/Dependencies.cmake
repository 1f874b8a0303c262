# Finds every external dependency and exposes it as an imported target:
#   MPI::MPI_CXX, mgbench::hdf5 (parallel HDF5, C API), Boost::program_options, ZLIB::ZLIB,
#   spdlog::spdlog, fmt::fmt, nlohmann_json::nlohmann_json, mgbench::torch (LibTorch),
#   PkgConfig::PCRE2, GTest::gtest_main, benchmark::benchmark; with a CUDA toolkit also mgbench::nccl,
#   mgbench::cupti and mgbench::nvtx (MGBENCH_HAVE_CUDA / _NCCL / _CUPTI / _NVTX).

# The libraries without LibTorch (also the fuzz targets' build, tests/fuzz).
include("${CMAKE_CURRENT_LIST_DIR}/LibraryDependencies.cmake")

# --- LibTorch -----------------------------------------------------------------------------
# The PyPI torch wheel carries LibTorch; torch.utils.cmake_prefix_path points at its CMake
# package. Its TorchConfig.cmake insists on a CUDA toolkit (the wheel is a CUDA build), so
# without one we link the wheel's CPU-facing libraries directly.
set(MGBENCH_PYTHON "" CACHE FILEPATH "Python interpreter whose torch package provides LibTorch")
if(NOT MGBENCH_PYTHON)
  find_program(MGBENCH_PYTHON NAMES python3 python)
endif()
if(NOT Torch_DIR AND MGBENCH_PYTHON)
  execute_process(COMMAND "${MGBENCH_PYTHON}" -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _torch_prefix RESULT_VARIABLE _torch_rc ERROR_QUIET)
  if(_torch_rc EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    set(Torch_DIR "${_torch_prefix}/Torch" CACHE PATH "LibTorch CMake package" FORCE)
  endif()
endif()
if(NOT Torch_DIR OR NOT EXISTS "${Torch_DIR}/TorchConfig.cmake")
  message(FATAL_ERROR "LibTorch not found: run scripts/install-deps.sh, or pass -DMGBENCH_PYTHON=<python with torch> "
                      "or -DTorch_DIR=<libtorch>/share/cmake/Torch.")
endif()

get_filename_component(_torch_root "${Torch_DIR}/../../.." ABSOLUTE)

# LibTorch's include/ carries its own copy of fmt (v12), which would shadow the system fmt that
# spdlog is built against. The LibTorch headers mgbench uses do not include fmt, so mgbench sees
# LibTorch's include/ through a view without fmt/.
set(MGBENCH_TORCH_INCLUDE "${CMAKE_BINARY_DIR}/torch-include")
file(MAKE_DIRECTORY "${MGBENCH_TORCH_INCLUDE}")
file(GLOB _torch_include_entries RELATIVE "${_torch_root}/include" "${_torch_root}/include/*")
foreach(_entry IN LISTS _torch_include_entries)
  if(NOT _entry STREQUAL "fmt" AND NOT EXISTS "${MGBENCH_TORCH_INCLUDE}/${_entry}")
    file(CREATE_LINK "${_torch_root}/include/${_entry}" "${MGBENCH_TORCH_INCLUDE}/${_entry}" SYMBOLIC)
  endif()
endforeach()
function(mgbench_redirect_torch_includes target)
  if(NOT TARGET ${target})
    return()
  endif()
  get_target_property(_dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(_dirs)
    string(REPLACE "${_torch_root}/include" "${MGBENCH_TORCH_INCLUDE}" _dirs "${_dirs}")
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
  endif()
endfunction()

find_package(CUDAToolkit QUIET)
add_library(mgbench_torch INTERFACE)
if(CUDAToolkit_FOUND)
  # Without an explicit list, Caffe2's config try_runs a CUDA program to detect local GPUs,
  # which fails on build machines without one. H100/H200 = sm_90.
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for LibTorch's CMake config")
  find_package(Torch REQUIRED)
  foreach(_t torch torch_library torch_cpu torch_cuda c10 c10_cuda)
    mgbench_redirect_torch_includes(${_t})
  endforeach()
  target_link_libraries(mgbench_torch INTERFACE ${TORCH_LIBRARIES})
  set(MGBENCH_HAVE_CUDA ON)
else()
  message(STATUS "No CUDA toolkit: using LibTorch from ${_torch_root} for CPU only")
  foreach(_lib torch torch_cpu c10)
    find_library(MGBENCH_TORCH_${_lib} NAMES ${_lib} PATHS "${_torch_root}/lib" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(mgbench_torch INTERFACE "${MGBENCH_TORCH_${_lib}}")
  endforeach()
  target_include_directories(mgbench_torch SYSTEM INTERFACE "${MGBENCH_TORCH_INCLUDE}"
                                                          "${MGBENCH_TORCH_INCLUDE}/torch/csrc/api/include")
  target_link_options(mgbench_torch INTERFACE "-Wl,--no-as-needed" "-Wl,-rpath,${_torch_root}/lib")
  set(MGBENCH_HAVE_CUDA OFF)
endif()
# The pip wheel's libtorch.so exports a statically linked copy of std::filesystem (remove_all,
# create_directory, ...) that crashes when called from outside. Listing libstdc++ before
# libtorch in DT_NEEDED makes the dynamic linker bind those symbols to libstdc++.
target_link_options(mgbench_torch INTERFACE "SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
add_library(mgbench::torch ALIAS mgbench_torch)
message(STATUS "mgbench: CUDA toolkit ${CUDAToolkit_VERSION} found: ${MGBENCH_HAVE_CUDA}")

# --- NCCL, CUPTI, NVTX (CUDA builds) -------------------------------------------------------
# One copy of each library per process: NCCL and CUPTI are the very files LibTorch loads. The pip
# wheel takes them from the nvidia-* packages beside torch/ (site-packages/nvidia/nccl,
# nvidia/cu13); a standalone LibTorch, or a cluster module, gives them through
# MGBENCH_NCCL_ROOT / the CUDA toolkit.
set(MGBENCH_HAVE_NCCL OFF)
set(MGBENCH_HAVE_CUPTI OFF)
set(MGBENCH_HAVE_NVTX OFF)
set(MGBENCH_HAVE_NVJPEG OFF)
if(MGBENCH_HAVE_CUDA)
  get_filename_component(_site "${_torch_root}/.." ABSOLUTE)
  set(MGBENCH_NCCL_ROOT "${_site}/nvidia/nccl" CACHE PATH "NCCL (include/nccl.h, lib/libnccl.so*) that LibTorch uses")
  find_path(MGBENCH_NCCL_INCLUDE_DIR nccl.h PATHS "${MGBENCH_NCCL_ROOT}/include" NO_DEFAULT_PATH)
  find_path(MGBENCH_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(MGBENCH_NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS "${MGBENCH_NCCL_ROOT}/lib" NO_DEFAULT_PATH)
  find_library(MGBENCH_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR})
  # The wheel's CUDA libraries first in the run path: the toolkit's lib/ holds the same sonames
  # (libcupti.so.13, libnccl.so.2), and one process must load LibTorch's copies only.
  target_link_options(mgbench_torch INTERFACE "-Wl,-rpath,${_site}/nvidia/cu13/lib:${MGBENCH_NCCL_ROOT}/lib"
                                              # DT_RPATH, not DT_RUNPATH: searched before LD_LIBRARY_PATH
                                              # and for LibTorch's own dependencies too, so a `module
                                              # load cuda` cannot swap the NCCL under torch.
                                              "-Wl,--disable-new-dtags")
  if(MGBENCH_NCCL_INCLUDE_DIR AND MGBENCH_NCCL_LIBRARY)
    mgbench_imported_library(nccl "${MGBENCH_NCCL_INCLUDE_DIR}" "${MGBENCH_NCCL_LIBRARY}")
    set(MGBENCH_HAVE_NCCL ON)
    message(STATUS "mgbench: NCCL ${MGBENCH_NCCL_LIBRARY}")
  else()
    message(WARNING "mgbench: no NCCL found (MGBENCH_NCCL_ROOT=${MGBENCH_NCCL_ROOT}); --backend nccl unavailable")
  endif()

  find_path(MGBENCH_CUPTI_INCLUDE_DIR cupti_activity.h PATHS "${_site}/nvidia/cu13/include" NO_DEFAULT_PATH)
  find_library(MGBENCH_CUPTI_LIBRARY NAMES cupti libcupti.so.13 PATHS "${_site}/nvidia/cu13/lib" NO_DEFAULT_PATH)
  if(NOT MGBENCH_CUPTI_LIBRARY AND TARGET CUDA::cupti)
    get_target_property(MGBENCH_CUPTI_LIBRARY CUDA::cupti IMPORTED_LOCATION)
    get_target_property(MGBENCH_CUPTI_INCLUDE_DIR CUDA::cupti INTERFACE_INCLUDE_DIRECTORIES)
  endif()
  if(MGBENCH_CUPTI_INCLUDE_DIR AND MGBENCH_CUPTI_LIBRARY)
    mgbench_imported_library(cupti "${MGBENCH_CUPTI_INCLUDE_DIR}" "${MGBENCH_CUPTI_LIBRARY}")
    set(MGBENCH_HAVE_CUPTI ON)
    message(STATUS "mgbench: CUPTI ${MGBENCH_CUPTI_LIBRARY}")
  endif()

  # nvJPEG (--decode device): the wheel's (pip nvidia-nvjpeg, beside CUPTI in nvidia/cu13), or the
  # toolkit's, or MGBENCH_NVJPEG_ROOT's (include/nvjpeg.h, lib/libnvjpeg.so*).
  set(MGBENCH_NVJPEG_ROOT "" CACHE PATH "nvJPEG (include/nvjpeg.h, lib/libnvjpeg.so*), if not the wheel's or the toolkit's")
  find_path(MGBENCH_NVJPEG_INCLUDE_DIR nvjpeg.h PATHS "${MGBENCH_NVJPEG_ROOT}/include" "${_site}/nvidia/cu13/include"
            NO_DEFAULT_PATH)
  find_path(MGBENCH_NVJPEG_INCLUDE_DIR nvjpeg.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(MGBENCH_NVJPEG_LIBRARY NAMES nvjpeg libnvjpeg.so.13 PATHS "${MGBENCH_NVJPEG_ROOT}/lib"
               "${_site}/nvidia/cu13/lib" NO_DEFAULT_PATH)
  find_library(MGBENCH_NVJPEG_LIBRARY NAMES nvjpeg libnvjpeg.so.13 HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(MGBENCH_NVJPEG_INCLUDE_DIR AND MGBENCH_NVJPEG_LIBRARY)
    mgbench_imported_library(nvjpeg "${MGBENCH_NVJPEG_INCLUDE_DIR}" "${MGBENCH_NVJPEG_LIBRARY}")
    get_filename_component(_nvjpeg_dir "${MGBENCH_NVJPEG_LIBRARY}" DIRECTORY)
    target_link_options(mgbench_nvjpeg INTERFACE "-Wl,-rpath,${_nvjpeg_dir}")
    set(MGBENCH_HAVE_NVJPEG ON)
    message(STATUS "mgbench: nvJPEG ${MGBENCH_NVJPEG_LIBRARY}")
  else()
    message(STATUS "mgbench: no nvJPEG (pip install nvidia-nvjpeg, or MGBENCH_NVJPEG_ROOT): --decode device unavailable")
  endif()

  # NVTX 3 is header-only (a tool such as Nsight Systems injects itself at run time).
  find_path(MGBENCH_NVTX_INCLUDE_DIR nvtx3/nvToolsExt.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(MGBENCH_NVTX_INCLUDE_DIR)
    mgbench_imported_library(nvtx "${MGBENCH_NVTX_INCLUDE_DIR}" "${CMAKE_DL_LIBS}")
    set(MGBENCH_HAVE_NVTX ON)
  endif()
endif()

# --- The host allocator of the mgbench executable ----------------------------------------------
# MGBENCH_MALLOC: glibc (default), tcmalloc (gperftools' tcmalloc_minimal, required: Debian's
# libgoogle-perftools-dev), or auto (TCMalloc when found). TCMalloc is linked first and kept though
# nothing names it (--no-as-needed), so its malloc is the whole process's; its MallocExtension header
# lets --malloc-reuse set its release rate (core/host_memory.cpp). It is not the default: measured
# (docs/design.md, "The host allocator"), it runs a 64 px CPU step 5-10 % faster, but holds ~100 MiB
# more at a bf16 step's peak on a 128k-vocabulary model (its page heap's freed large spans). glibc's
# heap reuses LibTorch's freed blocks through runtime/cpu_allocator.
set(MGBENCH_MALLOC "glibc" CACHE STRING "The mgbench executable's malloc: glibc, tcmalloc or auto")
set_property(CACHE MGBENCH_MALLOC PROPERTY STRINGS glibc tcmalloc auto)
if(NOT MGBENCH_MALLOC MATCHES "^(auto|tcmalloc|glibc)$")
  message(FATAL_ERROR "MGBENCH_MALLOC=${MGBENCH_MALLOC}: expected glibc, tcmalloc or auto")
endif()
add_library(mgbench_malloc INTERFACE)
add_library(mgbench::malloc ALIAS mgbench_malloc)
set(MGBENCH_HAVE_TCMALLOC OFF)
if(NOT MGBENCH_MALLOC STREQUAL "glibc")
  find_library(MGBENCH_TCMALLOC_LIBRARY NAMES tcmalloc_minimal)
  find_path(MGBENCH_GPERFTOOLS_INCLUDE_DIR gperftools/malloc_extension.h)
  if(MGBENCH_TCMALLOC_LIBRARY AND MGBENCH_GPERFTOOLS_INCLUDE_DIR)
    target_link_libraries(mgbench_malloc INTERFACE "-Wl,--push-state,--no-as-needed" "${MGBENCH_TCMALLOC_LIBRARY}"
                          "-Wl,--pop-state")
    set(MGBENCH_HAVE_TCMALLOC ON)
    message(STATUS "mgbench: host malloc TCMalloc ${MGBENCH_TCMALLOC_LIBRARY}")
  elseif(MGBENCH_MALLOC STREQUAL "tcmalloc")
    message(FATAL_ERROR "MGBENCH_MALLOC=tcmalloc: no libtcmalloc_minimal with gperftools/malloc_extension.h (Debian: "
                        "libgoogle-perftools-dev; or a gperftools module; or -DMGBENCH_TCMALLOC_LIBRARY=<path> "
                        "-DMGBENCH_GPERFTOOLS_INCLUDE_DIR=<dir>)")
  else()
    message(STATUS "mgbench: MGBENCH_MALLOC=auto found no TCMalloc (Debian: libgoogle-perftools-dev): glibc malloc")
  endif()
endif()

if(MGBENCH_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(MGBENCH_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
