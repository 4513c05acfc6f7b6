// Shard manifests (data::read_manifest): webdataset's wids shard-index JSON
// with Ember's crc32 field, relative and absolute URLs.
#include "ember/data/shards.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ember::fuzz::run([&] {
    const std::string path =
        ember::fuzz::write_scratch("manifest/index.json", ember::fuzz::bytes_of(data, size));
    const std::vector<ember::data::ShardInfo> shards = ember::data::read_manifest(path);
    EMBER_FUZZ_ASSERT(!shards.empty());
    // Accepted: written again (URLs now absolute) and read back, the same list.
    const std::string again = ember::fuzz::write_scratch("again/index.json", "");
    ember::data::write_manifest(again, shards, "fuzz");
    const std::vector<ember::data::ShardInfo> back = ember::data::read_manifest(again);
    EMBER_FUZZ_ASSERT(back.size() == shards.size());
    for (size_t i = 0; i < shards.size(); ++i) {
      EMBER_FUZZ_ASSERT(!shards[i].url.empty());
      EMBER_FUZZ_ASSERT(back[i].samples == shards[i].samples && back[i].bytes == shards[i].bytes);
      EMBER_FUZZ_ASSERT(back[i].crc32 == shards[i].crc32);
    }
  });
}
