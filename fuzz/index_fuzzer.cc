// Fuzzes ParseIndex, and checks that what it accepts survives a round trip:
// SerializeIndex of the parsed index must parse again and serialize to the
// same text. The same bytes go to DecodeChecksumFile (a version-3
// checksum file, format/checksum_file.h): what it accepts must encode back
// to them. Any violated property aborts (reported as a crash).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "format/checksum_file.h"
#include "format/index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardsafe;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<std::vector<ChunkChecksum>> sums = DecodeChecksumFile(text, "fuzz");
  if (sums.ok() && EncodeChecksumFile(*sums) != text) {
    std::fprintf(stderr, "checksum file changed in a round trip\n");
    std::abort();
  }
  Result<CheckpointIndex> index = ParseIndex(text, "fuzz");
  if (!index.ok()) return 0;
  const std::string once = SerializeIndex(*index);
  Result<CheckpointIndex> again = ParseIndex(once, "fuzz");
  if (!again.ok()) {
    std::fprintf(stderr, "serialized index rejected: %s\n", again.status().ToString().c_str());
    std::abort();
  }
  if (SerializeIndex(*again) != once) {
    std::fprintf(stderr, "index changed in a round trip\n");
    std::abort();
  }
  return 0;
}
