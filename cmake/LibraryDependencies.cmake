# The external libraries of mgbench's LibTorch-free parts, as imported targets: MPI::MPI_CXX,
# mgbench::hdf5 (parallel HDF5, C API), Boost::program_options, ZLIB::ZLIB, spdlog::spdlog, fmt::fmt,
# nlohmann_json::nlohmann_json, PkgConfig::PCRE2, mgbench::csv, mgbench::turbojpeg, mgbench::spng. Included by Dependencies.cmake (the
# main build) and by tests/fuzz/CMakeLists.txt (the clang build of the fuzz targets).

# mgbench_imported_library(<name> <include dir> <library>): an INTERFACE target mgbench::<name>
# for a library found by path (no CMake package of its own).
function(mgbench_imported_library name include_dir library)
  add_library(mgbench_${name} INTERFACE)
  target_include_directories(mgbench_${name} SYSTEM INTERFACE "${include_dir}")
  target_link_libraries(mgbench_${name} INTERFACE "${library}")
  add_library(mgbench::${name} ALIAS mgbench_${name})
endfunction()

find_package(MPI REQUIRED COMPONENTS C CXX)
find_package(ZLIB REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
# PCRE2 (8-bit, Unicode properties) for the tokenizer's pre-tokenisation pattern.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# libcsv (RFC 4180 CSV parsing; Debian libcsv-dev, no pkg-config file).
find_path(MGBENCH_CSV_INCLUDE_DIR csv.h REQUIRED)
find_library(MGBENCH_CSV_LIBRARY csv REQUIRED)
mgbench_imported_library(csv "${MGBENCH_CSV_INCLUDE_DIR}" "${MGBENCH_CSV_LIBRARY}")
# Image decoding on the host: libjpeg-turbo's TurboJPEG API (Debian libturbojpeg0-dev) and libspng
# (libspng-dev), found by path as libcsv (gpu-check.sh's unpacked .debs carry stale pkg-config prefixes).
find_path(MGBENCH_TURBOJPEG_INCLUDE_DIR turbojpeg.h REQUIRED)
find_library(MGBENCH_TURBOJPEG_LIBRARY turbojpeg REQUIRED)
mgbench_imported_library(turbojpeg "${MGBENCH_TURBOJPEG_INCLUDE_DIR}" "${MGBENCH_TURBOJPEG_LIBRARY}")
find_path(MGBENCH_SPNG_INCLUDE_DIR spng.h REQUIRED)
find_library(MGBENCH_SPNG_LIBRARY spng REQUIRED)
mgbench_imported_library(spng "${MGBENCH_SPNG_INCLUDE_DIR}" "${MGBENCH_SPNG_LIBRARY}")

# --- HDF5, the MPI-parallel build (Debian: libhdf5-openmpi-dev) ------------------------------
# MGBENCH_HDF5_INCLUDE_DIR + MGBENCH_HDF5_LIBRARY name a parallel HDF5 directly (a relocated or
# unusual install, e.g. scripts/gpu-check.sh's unpacked .debs, whose h5pcc points elsewhere).
set(MGBENCH_HDF5_INCLUDE_DIR "" CACHE PATH "parallel HDF5 headers (optional; default: find_package(HDF5))")
set(MGBENCH_HDF5_LIBRARY "" CACHE FILEPATH "parallel libhdf5 (optional; with MGBENCH_HDF5_INCLUDE_DIR)")
if(MGBENCH_HDF5_INCLUDE_DIR AND MGBENCH_HDF5_LIBRARY)
  set(HDF5_C_INCLUDE_DIRS "${MGBENCH_HDF5_INCLUDE_DIR}")
  set(HDF5_C_LIBRARIES "${MGBENCH_HDF5_LIBRARY}")
  set(HDF5_C_DEFINITIONS "")
  set(HDF5_IS_PARALLEL ON)
else()
  set(HDF5_PREFER_PARALLEL ON)
  find_package(HDF5 REQUIRED COMPONENTS C)
endif()
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "mgbench needs HDF5 built with MPI (found a serial HDF5 at ${HDF5_C_INCLUDE_DIRS}). "
                      "Debian/Ubuntu: apt-get install libhdf5-openmpi-dev; clusters: module load hdf5 with MPI.")
endif()
add_library(mgbench_hdf5 INTERFACE)
target_include_directories(mgbench_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_link_libraries(mgbench_hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_C)
target_compile_definitions(mgbench_hdf5 INTERFACE ${HDF5_C_DEFINITIONS} H5_USE_110_API)
add_library(mgbench::hdf5 ALIAS mgbench_hdf5)
