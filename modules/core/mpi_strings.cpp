#include "core/mpi_strings.h"

#include <cstdint>

#include "core/error.h"
#include "core/watchdog.h"

namespace mgbench {

std::string broadcast_string(MPI_Comm comm, std::string value) {
  const watchdog::Deadline deadline("a broadcast of a text from rank 0");
  std::int64_t size = static_cast<std::int64_t>(value.size());
  MGBENCH_CHECK_MPI(MPI_Bcast(&size, 1, MPI_INT64_T, 0, comm));
  value.resize(static_cast<std::size_t>(size));
  MGBENCH_CHECK_MPI(MPI_Bcast(value.data(), static_cast<int>(size), MPI_CHAR, 0, comm));
  return value;
}

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
  const watchdog::Deadline deadline("a gather of a text from every rank");
  int world = 0;
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm, &world));
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<std::size_t>(world));
  MGBENCH_CHECK_MPI(MPI_Allgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm));
  std::vector<int> offsets(sizes.size(), 0);
  for (std::size_t r = 1; r < sizes.size(); ++r) offsets[r] = offsets[r - 1] + sizes[r - 1];
  std::string all(static_cast<std::size_t>(offsets.back() + sizes.back()), '\0');
  MGBENCH_CHECK_MPI(
      MPI_Allgatherv(mine.data(), my_size, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  for (std::size_t r = 0; r < sizes.size(); ++r) out.push_back(all.substr(offsets[r], sizes[r]));
  return out;
}

}  // namespace mgbench
