// Dataset rows: JSON arrays, JSON Lines, CSV, TSV. The first byte picks the format; every row
// read must then answer string_field lookups with a value or a DataError naming the row.
#include <array>

#include "data/text/records.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static const std::array<const char*, 4> kNames = {"input.json", "input.jsonl", "input.csv", "input.tsv"};
  const std::string path = mgbench::fuzz::write_input(data + 1, size - 1, kNames[data[0] % kNames.size()]);
  mgbench::fuzz::expect_clean_errors([&] {
    const mgbench::text::Records records = mgbench::text::read_records(path);
    for (std::size_t i = 0; i < records.rows.size(); ++i) {
      if (!records.rows[i].is_object()) __builtin_trap();  // read_records promises objects
      (void)records.where(i);
      for (const char* name : {"instruction", "input", "output", "text", ""}) {
        mgbench::fuzz::expect_clean_errors([&] { (void)mgbench::text::string_field(records, i, name, true); });
      }
    }
  });
  return 0;
}
