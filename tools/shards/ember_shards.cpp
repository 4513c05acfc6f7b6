// ember_shards: WebDataset shards listed, indexed and verified.
//
//   ember_shards [--retries N] [--backoff S] [--stall S] COMMAND ...
//
//   ember_shards list SHARD...                  every member: key, extension, bytes, CRC-32
//   ember_shards index SPEC --out FILE [--name NAME]
//                                               scans the shards SPEC names (data::shard_list),
//                                               writes their manifest (wids JSON + crc32)
//   ember_shards verify MANIFEST                rereads every shard against its manifest entry
//
// A SHARD is a path, an http(s):// URL or pipe:COMMAND (data::open_shard);
// --retries, --backoff and --stall set how HTTP is retried (data::HttpOptions).
// Exit status: 0 done (verify: every shard agrees), 1 a shard is damaged,
// unreadable or disagrees with the manifest, 2 a usage error.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ember/core/error.h"
#include "ember/data/byte_source.h"
#include "ember/data/shard_loader.h"
#include "ember/data/shards.h"

using namespace ember;

namespace {

int usage(const std::string& why) {
  std::cerr << "ember_shards: " << why << "\n"
            << "usage: ember_shards [--retries N] [--backoff S] [--stall S] COMMAND ...\n"
               "       ember_shards list SHARD...\n"
               "       ember_shards index SPEC --out FILE [--name NAME]\n"
               "       ember_shards verify MANIFEST\n";
  return 2;
}

/// Reads a whole local shard: its samples, bytes and CRC-32.
struct Scan {
  int64_t samples = 0;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};
data::HttpOptions http;

Scan scan(const std::string& url, bool print) {
  data::ShardInfo info;
  info.url = url;
  const std::unique_ptr<data::ByteSource> opened = data::open_shard(info, http);
  data::ChecksumSource source(*opened);
  data::ShardSampleReader reader(source);
  while (auto sample = reader.next(true)) {
    if (!print) continue;
    for (const auto& [ext, bytes] : sample->members)
      std::printf("%s\t%s\t%zu\t%08x\n", sample->key.c_str(), ext.c_str(), bytes.size(),
                  data::crc32_update(0, bytes.data(), bytes.size()));
  }
  source.drain();
  return {reader.samples(), source.bytes(), source.crc32()};
}

std::string local_path(const data::ShardInfo& s) {
  if (s.url.rfind("http://", 0) == 0 || s.url.rfind("https://", 0) == 0 || s.url.rfind("pipe:", 0) == 0)
    throw Error(ErrorKind::kConfig,
                fmt::format("[shards] {}: index and verify read local shards only", s.url));
  return s.url;
}

int list(const std::vector<std::string>& shards) {
  if (shards.empty()) return usage("list: name at least one shard");
  for (const std::string& path : shards) {
    const Scan s = scan(path, true);
    std::printf("# %s: %lld samples, %lld bytes, crc32 %08x\n", path.c_str(),
                static_cast<long long>(s.samples), static_cast<long long>(s.bytes), s.crc32);
  }
  return 0;
}

int index(const std::vector<std::string>& args) {
  std::string spec, out, name = "shards";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--name" && i + 1 < args.size()) {
      name = args[++i];
    } else if (spec.empty()) {
      spec = args[i];
    } else {
      return usage("index: unexpected argument " + args[i]);
    }
  }
  if (spec.empty() || out.empty()) return usage("index: give SPEC and --out FILE");
  std::vector<data::ShardInfo> shards = data::shard_list(spec);
  int64_t total = 0;
  for (data::ShardInfo& s : shards) {
    const Scan scanned = scan(s.url, false);
    s.samples = scanned.samples;
    s.bytes = scanned.bytes;
    s.crc32 = scanned.crc32;
    total += scanned.samples;
  }
  data::write_manifest(out, shards, name);
  std::fprintf(stderr, "[shards] %s: %zu shards, %lld samples\n", out.c_str(), shards.size(),
               static_cast<long long>(total));
  return 0;
}

int verify(const std::vector<std::string>& args) {
  if (args.size() != 1) return usage("verify: give one manifest");
  int bad = 0;
  int64_t total = 0;
  const std::vector<data::ShardInfo> shards = data::read_manifest(args[0]);
  for (const data::ShardInfo& s : shards) {
    std::string problem;
    try {
      const Scan got = scan(s.url, false);
      total += got.samples;
      if (s.bytes >= 0 && got.bytes != s.bytes)
        problem += fmt::format(" {} bytes, the manifest says {};", got.bytes, s.bytes);
      if (s.crc32 && got.crc32 != *s.crc32)
        problem += fmt::format(" crc32 {:08x}, the manifest says {:08x};", got.crc32, *s.crc32);
      if (s.samples >= 0 && got.samples != s.samples)
        problem += fmt::format(" {} samples, the manifest says {};", got.samples, s.samples);
    } catch (const Error& e) {
      problem = std::string(" ") + e.what();
    }
    if (!problem.empty()) {
      ++bad;
      std::fprintf(stderr, "[shards] %s:%s\n", s.url.c_str(), problem.c_str());
    }
  }
  std::fprintf(stderr, "[shards] %s: %zu shards, %lld samples read, %d disagree\n", args[0].c_str(),
               shards.size(), static_cast<long long>(total), bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> all(argv + 1, argv + argc);
  size_t i = 0;
  try {
    for (; i + 1 < all.size() && all[i].rfind("--", 0) == 0; i += 2) {
      if (all[i] == "--retries") {
        http.retries = std::stoi(all[i + 1]);
      } else if (all[i] == "--backoff") {
        http.backoff_seconds = std::stod(all[i + 1]);
      } else if (all[i] == "--stall") {
        http.stall_seconds = std::stoi(all[i + 1]);
      } else {
        return usage("unknown option " + all[i]);
      }
    }
  } catch (const std::exception&) {
    return usage("a number is expected after " + all[i]);
  }
  if (i >= all.size()) return usage("name a command");
  const std::string command = all[i];
  const std::vector<std::string> args(all.begin() + static_cast<std::ptrdiff_t>(i) + 1, all.end());
  try {
    if (command == "list") return list(args);
    if (command == "index") return index(args);
    if (command == "verify") return verify(args);
    return usage("unknown command " + command);
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    return e.kind() == ErrorKind::kConfig ? 2 : 1;
  }
}
