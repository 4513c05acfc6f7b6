// data::write_shards and its sample sources (tensors in memory, image folders).
#include "ember/data/shard_writer.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "core/check.h"
#include "data/image_folder_internal.h"
#include "data/splitmix.h"
#include "ember/core/file.h"
#include "ember/data/npy.h"
#include "ember/data/tar.h"

namespace ember::data {
namespace {

/// A tar member's header (and pax record, rarely) on top of its bytes.
constexpr int64_t kMemberOverhead = 1024;

/// The samples' order and where each shard starts in it.
struct Plan {
  std::vector<int64_t> order;
  std::vector<int64_t> first;  // shard s holds order[first[s] .. first[s + 1])
  nlohmann::json json;         // what must match for an earlier run's shards to be kept
};

Plan make_plan(const SampleSource& source, const ShardWriterOptions& o) {
  Plan p;
  p.order.resize(static_cast<size_t>(source.size));
  std::iota(p.order.begin(), p.order.end(), int64_t{0});
  if (o.shuffle()) {
    detail::Rng rng(o.seed(), 0, /*what=*/0x7368617264ULL,
                    0);  // the same stream as shard_order.cpp's, keyed apart
    detail::shuffle(p.order.data(), source.size, rng);
  }
  p.first.push_back(0);
  int64_t bytes = 0, count = 0;
  for (int64_t k = 0; k < source.size; ++k) {
    bytes += source.bytes(p.order[k]) + kMemberOverhead;
    ++count;
    const bool full = o.samples_per_shard() > 0 ? count >= o.samples_per_shard() : bytes >= o.shard_bytes();
    if (full && k + 1 < source.size) {
      p.first.push_back(k + 1);
      bytes = count = 0;
    }
  }
  p.first.push_back(source.size);
  uint32_t order_crc = 0;
  for (const int64_t i : p.order)
    order_crc = crc32_update(order_crc, reinterpret_cast<const char*>(&i), sizeof i);
  p.json = {
      {"source", source.description}, {"samples", source.size},  {"shuffle", o.shuffle()}, {"seed", o.seed()},
      {"order_crc32", order_crc},     {"shard_starts", p.first}, {"name", o.name()}};
  return p;
}

std::string shard_name(const std::string& name, size_t s) {
  return fmt::format("{}-{:06}.tar", name, s);
}

}  // namespace

ShardWriteResult write_shards(const std::string& out_dir, const SampleSource& source,
                              const ShardWriterOptions& o) {
  EMBER_CHECK_KIND(kConfig, source.size > 0, "[data::write_shards] {} holds no sample", source.description);
  EMBER_CHECK_KIND(kConfig, o.shard_bytes() > 0 && o.samples_per_shard() >= 0,
                   "[data::write_shards] shard_bytes must be > 0 and samples_per_shard >= 0");
  EMBER_CHECK_KIND(kConfig, !o.name().empty() && o.name().find('/') == std::string::npos,
                   "[data::write_shards] name '{}' must be a file name", o.name());
  core::make_dirs(out_dir);
  const Plan plan = make_plan(source, o);
  const std::string plan_path = fmt::format("{}/.{}-plan.json", out_dir, o.name());
  if (core::is_file(plan_path)) {
    const nlohmann::json earlier = nlohmann::json::parse(core::read_file(plan_path), nullptr, false);
    EMBER_CHECK_KIND(
        kData, earlier == plan.json,
        "[data::write_shards] {} holds shards of another plan ({}): other source, seed, order or "
        "shard size; write these to another folder, or empty it",
        out_dir, plan_path);
  } else {
    core::write_file_atomic(plan_path, plan.json.dump(1) + "\n");
  }
  const size_t n_shards = plan.first.size() - 1;
  ShardWriteResult result;
  result.shards.resize(n_shards);
  result.samples = source.size;
  std::atomic<size_t> next{0};
  std::atomic<int64_t> kept{0};
  std::mutex mutex;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t s; (s = next++) < n_shards;) {
      try {
        const std::string file = shard_name(o.name(), s);
        const std::string path = out_dir + "/" + file;
        ShardInfo& info = result.shards[s];
        info.url = o.base_url().empty() ? file : o.base_url() + "/" + file;
        info.samples = plan.first[s + 1] - plan.first[s];
        if (core::is_file(path)) {  // finished by an earlier run (published by rename only when whole)
          const std::string bytes = core::read_file(path);
          info.bytes = static_cast<int64_t>(bytes.size());
          info.crc32 = crc32_update(0, bytes.data(), bytes.size());
          ++kept;
          continue;
        }
        TarWriter w(path);
        for (int64_t k = plan.first[s]; k < plan.first[s + 1]; ++k) {
          const int64_t i = plan.order[k];
          const std::string key = fmt::format("{:08}", i);
          for (const auto& [ext, bytes] : source.members(i)) w.add(key + "." + ext, bytes);
        }
        w.finish();
        info.bytes = w.bytes();
        info.crc32 = w.crc32();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        next = n_shards;  // stop taking shards; finished ones stay
      }
    }
  };
  const int64_t threads = std::clamp<int64_t>(
      o.threads() > 0 ? o.threads() : std::thread::hardware_concurrency(), 1, static_cast<int64_t>(n_shards));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  result.kept = kept;
  write_manifest(fmt::format("{}/{}.json", out_dir, o.name()), result.shards, o.name());
  return result;
}

SampleSource tensor_samples(TensorDataset dataset, std::string description) {
  EMBER_CHECK(dataset.inputs.defined() && dataset.targets.defined() &&
                  dataset.inputs.size(0) == dataset.targets.size(0),
              "[data::tensor_samples] inputs and targets of one length");
  SampleSource s;
  s.size = dataset.size();
  const int64_t per = dataset.inputs[0].numel() * dataset.inputs.element_size() + 128;
  s.bytes = [per](int64_t) { return per; };
  auto d = std::make_shared<TensorDataset>(std::move(dataset));
  s.members = [d](int64_t i) {
    return std::vector<std::pair<std::string, std::string>>{
        {"npy", write_npy(d->inputs[i])}, {"cls", std::to_string(d->targets[i].item<int64_t>())}};
  };
  s.description = std::move(description);
  return s;
}

std::pair<SampleSource, std::vector<std::string>> image_folder_samples(const std::string& root) {
  const detail::Scan scan = detail::scan_folder(root, ImageFolderOptions({1, 1}));
  EMBER_CHECK_KIND(kData, !scan.entries.empty(), "[data] {}: no images found (root/<class>/<images>)", root);
  auto entries = std::make_shared<std::vector<detail::Entry>>(scan.entries);
  auto classes = std::make_shared<std::vector<std::string>>(scan.classes);
  SampleSource s;
  s.size = static_cast<int64_t>(entries->size());
  s.bytes = [entries](int64_t i) { return (*entries)[static_cast<size_t>(i)].bytes; };
  s.members = [entries, classes, root](int64_t i) {
    const detail::Entry& e = (*entries)[static_cast<size_t>(i)];
    std::string bytes = core::read_file(detail::join_path(root, e.rel));
    const bool jpeg = bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xff &&
                      static_cast<uint8_t>(bytes[1]) == 0xd8 && static_cast<uint8_t>(bytes[2]) == 0xff;
    const bool png = bytes.size() >= 8 && bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0;
    EMBER_CHECK_KIND(
        kData, jpeg || png,
        "[data] {}/{}: not JPEG or PNG content; shards hold those two (convert it, or move it out)", root,
        e.rel);
    const nlohmann::json meta = {{"path", e.rel}, {"class", (*classes)[static_cast<size_t>(e.label)]}};
    return std::vector<std::pair<std::string, std::string>>{
        {jpeg ? "jpg" : "png", std::move(bytes)}, {"cls", std::to_string(e.label)}, {"json", meta.dump()}};
  };
  std::string listing;
  for (const detail::Entry& e : *entries) listing += fmt::format("{} {} {}\n", e.rel, e.bytes, e.mtime_ns);
  s.description = fmt::format("image folder {} ({} images, listing crc32 {:08x})", root, s.size,
                              crc32_update(0, listing.data(), listing.size()));
  return {std::move(s), scan.classes};
}

}  // namespace ember::data
