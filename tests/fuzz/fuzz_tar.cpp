// Tar archives (data::TarReader): ustar, GNU and pax headers, their numbers,
// checksums, long names and pax records, truncation anywhere. Then the
// members as the sharded loader groups them into samples (data/shards.h).
#include "ember/data/shards.h"
#include "ember/data/tar.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ember::fuzz::run([&] {
    ember::data::MemorySource source(std::string(ember::fuzz::bytes_of(data, size)), "input.tar");
    ember::data::TarReaderOptions o;
    o.max_member_bytes = int64_t{1} << 20;
    ember::data::TarReader reader(source, o);
    int64_t members = 0, bytes = 0;
    while (auto e = reader.next()) {
      // Accepted so far: a named member whose header lies inside the input.
      EMBER_FUZZ_ASSERT(!e->name.empty());
      EMBER_FUZZ_ASSERT(e->offset >= 0 && e->offset + 512 <= static_cast<int64_t>(size));
      EMBER_FUZZ_ASSERT(e->offset % 512 == 0);
      if (members++ % 2 == 0) {  // read every other member, skip the rest
        const std::string body = reader.read();
        EMBER_FUZZ_ASSERT(static_cast<int64_t>(body.size()) == e->size);
        bytes += e->size;
      }
      (void)ember::data::split_member_name(e->name);
    }
    // Every byte read came from the input.
    EMBER_FUZZ_ASSERT(bytes + 512 * members <= static_cast<int64_t>(size));
    EMBER_FUZZ_ASSERT(reader.position() <= static_cast<int64_t>(size));
  });
}
