#pragma once
// Where the tests find their inputs, as configured by CMake (tests/test_paths.cpp.in). The environment
// variables MGBENCH_ORACLE_DIR / MGBENCH_SHARED_DATA override the first two (test_support.h).

namespace mgbench::test::paths {

/// Default directory of tests/python/make_oracles.py's files: <build>/tests/oracles.
const char* default_oracle_dir();
/// Default shared data directory (MNIST, the Llama 3 tokenizer, ...): ../shared/data of the checkout.
const char* default_shared_data();
/// The MPI launcher CMake found (mpiexec), absolute.
const char* mpiexec();
/// The checkout: its inputs/ and python/ hold shipped files the tests check.
const char* source_dir();
/// tests/ of the build directory: the test libraries (e.g. the stand-in libnvidia-ml).
const char* test_binary_dir();

}  // namespace mgbench::test::paths
