#include "mpi_start.h"

#include <iostream>

#include "core/error.h"

namespace mgbench::app {

std::unique_ptr<runtime::MpiEnvironment> start_mpi(const std::string& command, int& argc, char**& argv) {
  try {
    return std::make_unique<runtime::MpiEnvironment>(&argc, &argv);
  } catch (const CommError& e) {  // every rank alike (an MPI without thread support)
    std::cerr << "mgbench " << command << ": " << e.what() << "\n";
    return nullptr;
  }
}

}  // namespace mgbench::app
