// ember_shards: WebDataset shards listed, indexed and verified.
//
//   ember_shards [--retries N] [--backoff S] [--stall S] COMMAND ...
//
//   ember_shards list SHARD...                  every member: key, extension, bytes, CRC-32
//   ember_shards index SPEC --out FILE [--name NAME]
//                                               scans the shards SPEC names (data::shard_list),
//                                               writes their manifest (wids JSON + crc32)
//   ember_shards verify MANIFEST                rereads every shard against its manifest entry
//   ember_shards write SOURCE OUT_DIR [--from folder|idx|cifar10|cifar100] [--split train|test]
//                [--name NAME] [--shard-mb MB | --samples-per-shard N] [--seed S] [--no-shuffle]
//                [--threads N] [--base-url URL] [--verify]
//                                               shards of an image folder (the files' own JPEG/PNG
//                                               bytes), IDX or CIFAR files (.npy images), shuffled,
//                                               with their manifest OUT_DIR/NAME.json (data/shard_writer.h)
//   ember_shards write TEXT OUT_DIR --from text [--tokenizer bytes] [--tokens-per-shard N]
//                [--val-fraction F]
//                                               a text file or folder (data::read_text_corpus) as llm.c
//                                               token files OUT_DIR/train-NNNNNN.bin (and val-...: the
//                                               text's last F), one token per byte (data/tokens.h);
//                                               other tokenizers: tools/ember shards tokenize
//
// A SHARD is a path, an http(s):// URL or pipe:COMMAND (data::open_shard);
// --retries, --backoff and --stall set how HTTP is retried (data::HttpOptions).
// Exit status: 0 done (verify: every shard agrees), 1 a shard is damaged,
// unreadable or disagrees with the manifest, 2 a usage error.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ember/core/error.h"
#include "ember/core/file.h"
#include "ember/data/byte_source.h"
#include "ember/data/cifar.h"
#include "ember/data/idx.h"
#include "ember/data/shard_loader.h"
#include "ember/data/shard_writer.h"
#include "ember/data/shards.h"
#include "ember/data/text.h"
#include "ember/data/tokens.h"

using namespace ember;

namespace {

int usage(const std::string& why) {
  std::cerr
      << "ember_shards: " << why << "\n"
      << "usage: ember_shards [--retries N] [--backoff S] [--stall S] COMMAND ...\n"
         "       ember_shards list SHARD...\n"
         "       ember_shards index SPEC --out FILE [--name NAME]\n"
         "       ember_shards verify MANIFEST\n"
         "       ember_shards write SOURCE OUT_DIR [--from folder|idx|cifar10|cifar100] [--split "
         "train|test]\n"
         "                 [--name NAME] [--shard-mb MB | --samples-per-shard N] [--seed S] [--no-shuffle]\n"
         "                 [--threads N] [--base-url URL] [--verify]\n"
         "       ember_shards write TEXT OUT_DIR --from text [--tokenizer bytes] [--tokens-per-shard N]\n"
         "                 [--val-fraction F]\n";
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
  if (data::is_remote_shard(s.url))
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

/// Text as llm.c token files, one token per byte (vocabulary 256).
int write_text(const std::string& source, const std::string& out, const std::string& tokenizer,
               int64_t per_shard, double val_fraction) {
  if (tokenizer != "bytes")
    return usage(
        "write --from text: this tool's tokenizer is 'bytes'; for a tokenizer file (tokenizer.json) "
        "use tools/ember shards tokenize");
  if (!(val_fraction >= 0 && val_fraction < 1)) return usage("write: --val-fraction is in [0, 1)");
  const torch::Tensor bytes = data::read_text_corpus(source);
  const int64_t n_val = static_cast<int64_t>(std::llround(val_fraction * static_cast<double>(bytes.size(0))));
  const int64_t n_train = bytes.size(0) - n_val;
  const auto written = [&](const char* name, int64_t begin, int64_t n) {
    if (n == 0) return;
    const std::vector<std::string> paths =
        data::write_token_shards(out, name, bytes.narrow(0, begin, n), per_shard, data::TokenFormat::kGpt2);
    std::fprintf(stderr, "[shards] %s: %lld tokens in %zu token files: %s/%s-{000000..%06zu}.bin\n",
                 out.c_str(), static_cast<long long>(n), paths.size(), out.c_str(), name, paths.size() - 1);
  };
  written("train", 0, n_train);
  written("val", n_train, n_val);
  return 0;
}

int write(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  std::string from, split = "train", tokenizer = "bytes";
  int64_t tokens_per_shard = 100'000'000;  // llm.c's
  double val_fraction = 0;
  data::ShardWriterOptions o;
  bool verify_after = false, named = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--from" && has_value) {
      from = args[++i];
    } else if (a == "--split" && has_value) {
      split = args[++i];
    } else if (a == "--name" && has_value) {
      o.name(args[++i]);
      named = true;
    } else if (a == "--shard-mb" && has_value) {
      o.shard_bytes(static_cast<int64_t>(std::stod(args[++i]) * (1 << 20)));
    } else if (a == "--samples-per-shard" && has_value) {
      o.samples_per_shard(std::stoll(args[++i]));
    } else if (a == "--seed" && has_value) {
      o.seed(std::stoull(args[++i]));
    } else if (a == "--threads" && has_value) {
      o.threads(std::stoll(args[++i]));
    } else if (a == "--base-url" && has_value) {
      o.base_url(args[++i]);
    } else if (a == "--tokenizer" && has_value) {
      tokenizer = args[++i];
    } else if (a == "--tokens-per-shard" && has_value) {
      tokens_per_shard = std::stoll(args[++i]);
    } else if (a == "--val-fraction" && has_value) {
      val_fraction = std::stod(args[++i]);
    } else if (a == "--no-shuffle") {
      o.shuffle(false);
    } else if (a == "--verify") {
      verify_after = true;
    } else if (a.rfind("--", 0) == 0) {
      return usage("write: unknown option " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) return usage("write: give SOURCE and OUT_DIR");
  if (split != "train" && split != "test") return usage("write: --split is train or test");
  const std::string& source = positional[0];
  const std::string& out = positional[1];
  if (from == "text") return write_text(source, out, tokenizer, tokens_per_shard, val_fraction);
  if (from.empty()) {
    from = core::is_file(source + "/train-images-idx3-ubyte.gz") ||
                   core::is_file(source + "/train-images-idx3-ubyte")
               ? "idx"
           : core::is_file(source + "/data_batch_1.bin") ||
                   core::is_file(source + "/cifar-10-batches-bin/data_batch_1.bin")
               ? "cifar10"
           : core::is_file(source + "/train.bin") || core::is_file(source + "/cifar-100-binary/train.bin")
               ? "cifar100"
               : "folder";
  }
  const data::Split which = split == "train" ? data::Split::kTrain : data::Split::kTest;
  data::SampleSource samples;
  std::string classes;
  if (from == "folder") {
    auto [s, names] = data::image_folder_samples(source);
    samples = std::move(s);
    classes = fmt::format("{} classes", names.size());
  } else if (from == "idx") {
    samples = data::tensor_samples(data::load_mnist(source, which), fmt::format("IDX {} {}", source, split));
    classes = "10 classes";
  } else if (from == "cifar10" || from == "cifar100") {
    data::CifarOptions co;
    co.variant(data::parse_cifar_variant(from));
    samples = data::tensor_samples(data::load_cifar(source, which, co),
                                   fmt::format("{} {} {}", from, source, split));
    classes = fmt::format("{} classes", data::cifar_num_classes(co));
  } else {
    return usage("write: --from is folder, idx, cifar10, cifar100 or text");
  }
  if (!named) o.name(from == "folder" ? "shard" : split);
  const data::ShardWriteResult r = data::write_shards(out, samples, o);
  int64_t bytes = 0;
  for (const data::ShardInfo& s : r.shards) bytes += s.bytes;
  std::fprintf(stderr,
               "[shards] %s: %lld samples (%s) in %zu shards of %.1f MiB on average (%lld kept from an "
               "earlier run); manifest %s/%s.json\n",
               out.c_str(), static_cast<long long>(r.samples), classes.c_str(), r.shards.size(),
               static_cast<double>(bytes) / static_cast<double>(r.shards.size()) / (1 << 20),
               static_cast<long long>(r.kept), out.c_str(), o.name().c_str());
  if (verify_after) return verify({out + "/" + o.name() + ".json"});
  return 0;
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
  if (command == "--help" || command == "-h" || command == "help") {
    usage("WebDataset shards listed, indexed, verified and written (docs/data.md)");
    return 0;
  }
  const std::vector<std::string> args(all.begin() + static_cast<std::ptrdiff_t>(i) + 1, all.end());
  try {
    if (command == "list") return list(args);
    if (command == "index") return index(args);
    if (command == "verify") return verify(args);
    if (command == "write") return write(args);
    return usage("unknown command " + command);
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    return e.kind() == ErrorKind::kConfig ? 2 : 1;
  } catch (const std::invalid_argument&) {
    return usage("a number is expected after an option");
  } catch (const std::out_of_range&) {
    return usage("a number out of range");
  }
}
