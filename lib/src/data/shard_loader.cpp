// data::ShardLoader: readers, decoders and the consumer over one epoch's shard visits.
#include "ember/data/shard_loader.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "core/staging.h"
#include "ember/core/file.h"

namespace ember::data {

/// One position of the rank's epoch, from its read to its consumption.
struct ShardLoader::Slot {
  enum State { kRaw, kDecoding, kDecoded, kFailed } state = kRaw;
  std::optional<ShardSample> raw;  // kRaw: read, not yet decoded
  int64_t raw_bytes = 0;
  DecodedSample decoded;  // kDecoded
};

std::unique_ptr<ByteSource> open_shard(const ShardInfo& shard, const HttpOptions& http) {
  const std::string& url = shard.url;
  if (url.rfind("pipe:", 0) == 0) return std::make_unique<PipeSource>(url.substr(5));
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0)
    return std::make_unique<HttpSource>(url, http);
  auto file = std::make_unique<FileSource>(url);
  if (shard.bytes >= 0 && file->size() != shard.bytes)
    ember::detail::fail(
        ErrorKind::kData,
        "[data] {} is {} bytes, its manifest says {}: the shard changed (or is cut short) since the "
        "manifest was written; copy it again, or rewrite the manifest (ember_shards index)",
        url, file->size(), shard.bytes);
  return file;
}

std::vector<ShardInfo> count_samples(std::vector<ShardInfo> shards, const ShardOpener& open, int64_t threads,
                                     const std::string& cache) {
  const auto unknown = [](const ShardInfo& s) { return s.samples < 0; };
  if (std::none_of(shards.begin(), shards.end(), unknown)) return shards;
  if (!cache.empty() && core::is_file(cache)) {
    try {
      std::vector<ShardInfo> cached = read_manifest(cache);
      const bool same = cached.size() == shards.size() &&
                        std::equal(cached.begin(), cached.end(), shards.begin(),
                                   [](const ShardInfo& a, const ShardInfo& b) { return a.url == b.url; });
      if (same) return cached;
    } catch (const Error&) {
      // A damaged cache is counted again and rewritten.
    }
  }
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next++) < shards.size();) {
      if (!unknown(shards[i])) continue;
      try {
        const std::unique_ptr<ByteSource> source = open(shards[i]);
        ChecksumSource counted(*source);
        ShardSampleReader reader(counted);
        while (reader.next(false)) {
        }
        counted.drain();
        shards[i].samples = reader.samples();
        shards[i].bytes = counted.bytes();
        shards[i].crc32 = counted.crc32();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(threads, static_cast<int64_t>(shards.size())));
  for (int64_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (!cache.empty()) {
    const size_t slash = cache.rfind('/');
    if (slash != std::string::npos && slash > 0) core::make_dirs(cache.substr(0, slash));
    write_manifest(cache, shards, "sample counts");
  }
  return shards;
}

ShardLoader::ShardLoader(std::vector<ShardInfo> shards, SampleDecoder decode, ShardLoaderOptions options)
    : shards_(std::move(shards)), decode_(std::move(decode)), options_(std::move(options)) {
  const char* where = "[data::ShardLoader]";
  EMBER_CHECK(!shards_.empty(), "{} no shards", where);
  EMBER_CHECK(static_cast<bool>(decode_), "{} no sample decoder", where);
  EMBER_CHECK(static_cast<bool>(options_.open()), "{} no shard opener", where);
  for (const ShardInfo& s : shards_) {
    EMBER_CHECK(s.samples >= 0, "{} {}: its sample count is not known; read a manifest, or count_samples()",
                where, s.url);
    counts_.push_back(s.samples);
    total_ += s.samples;
  }
  EMBER_CHECK_KIND(kData, total_ > 0, "{} the {} shards hold no sample", where, shards_.size());
  EMBER_CHECK(options_.batch_size() > 0, "{} batch_size must be positive, got {}", where,
              options_.batch_size());
  EMBER_CHECK(options_.readers() >= 1 && options_.decode_threads() >= 1,
              "{} readers and decode_threads must be >= 1", where);
  EMBER_CHECK(options_.prefetch() >= 0, "{} prefetch must be >= 0, got {}", where, options_.prefetch());
  const int64_t b = options_.batch_size();
  if (options_.read_ahead() == 0) options_.read_ahead((options_.prefetch() + 2) * b);
  EMBER_CHECK(options_.read_ahead() >= (options_.prefetch() + 1) * b,
              "{} read_ahead {} is below (prefetch + 1) * batch_size = {}: the decoders would wait on shards "
              "no reader may open yet",
              where, options_.read_ahead(), (options_.prefetch() + 1) * b);
  check_shard_order_options(options_.order());
  const ShardOrderOptions& o = options_.order();
  first_.assign(1, 0);
  for (const int64_t n : counts_) first_.push_back(first_.back() + n);
  EMBER_CHECK(num_batches() > 0, "{} rank {}'s part of {} samples ({} over {} ranks) makes no batch of {}{}",
              where, o.rank(), part_size(), total_, o.num_replicas(), b,
              options_.drop_last() ? " with drop_last" : "");
  if (options_.device().is_cuda() && !options_.device().has_index())
    options_.device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(0)));
}

ShardLoader::~ShardLoader() {
  stop_threads();
  if (served_log_ != nullptr) std::fclose(served_log_);
}

int64_t ShardLoader::part_size() const {
  return rank_part_size(total_, options_.order());
}

int64_t ShardLoader::num_batches() const {
  const int64_t n = part_size(), b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

int64_t ShardLoader::num_samples() const {
  return options_.drop_last() ? num_batches() * options_.batch_size() : part_size();
}

ShardLoaderStats ShardLoader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void ShardLoader::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  slots_.clear();
  raw_samples_ = raw_bytes_ = 0;
  error_ = nullptr;
}

void ShardLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  stop_threads();
  EMBER_CHECK(skip_batches >= 0 && skip_batches <= num_batches(),
              "[data::ShardLoader] cannot skip {} of {} batches", skip_batches, num_batches());
  part_ = rank_epoch(counts_, epoch, options_.order());
  epoch_ = epoch;
  start_ = std::min(skip_batches * options_.batch_size(), part_size());
  end_ = options_.drop_last() ? num_batches() * options_.batch_size() : part_size();
  // Only what this run serves: visits (and samples of visits) outside [start_, end_) go.
  std::vector<ShardVisit> visits;
  for (ShardVisit& v : part_.visits) {
    ShardVisit kept;
    kept.shard = v.shard;
    kept.first_position = end_;
    for (size_t j = 0; j < v.samples.size(); ++j) {
      if (v.positions[j] < start_ || v.positions[j] >= end_) continue;
      kept.samples.push_back(v.samples[j]);
      kept.positions.push_back(v.positions[j]);
      kept.first_position = std::min(kept.first_position, v.positions[j]);
    }
    if (!kept.samples.empty()) visits.push_back(std::move(kept));
  }
  std::stable_sort(visits.begin(), visits.end(), [](const ShardVisit& a, const ShardVisit& b) {
    return a.first_position < b.first_position;
  });
  part_.visits = std::move(visits);
  next_visit_ = 0;
  next_decode_ = consumed_ = start_;
  last_batch_ = Batch();
  stop_ = false;
  if (start_ >= end_) return;
  for (int64_t t = 0; t < options_.readers(); ++t) threads_.emplace_back([this] { reader_loop(); });
  for (int64_t t = 0; t < options_.decode_threads(); ++t) threads_.emplace_back([this] { decoder_loop(); });
}

const ShardInfo& ShardLoader::shard_of(int64_t id) const {
  const auto i = std::upper_bound(first_.begin(), first_.end(), id) - first_.begin() - 1;
  return shards_[static_cast<size_t>(i)];
}

void ShardLoader::fail_position(int64_t position, const std::string& why) {
  Slot& slot = slots_[position];
  if (slot.raw) {
    --raw_samples_;
    raw_bytes_ -= slot.raw_bytes;
    slot.raw.reset();
  }
  slot.state = Slot::kFailed;
  ++stats_.samples_skipped;
  if (stats_.skipped.size() < 20) stats_.skipped.push_back(why);
}

void ShardLoader::reader_loop() {
  for (;;) {
    size_t v;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] {
        return stop_ || error_ || next_visit_ >= part_.visits.size() ||
               part_.visits[next_visit_].first_position < consumed_ + options_.read_ahead();
      });
      if (stop_ || error_ || next_visit_ >= part_.visits.size()) return;
      v = next_visit_++;
    }
    const ShardVisit& visit = part_.visits[v];
    try {
      read_visit(visit);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (options_.on_error() == OnError::kFail) {
        if (!error_) error_ = std::current_exception();
      } else {
        // Every sample of the visit not read yet is skipped, with the shard's error.
        // (positions below consumed_ were served; a position with a slot was read)
        for (const int64_t p : visit.positions)
          if (p >= consumed_ && !slots_.count(p)) fail_position(p, e.what());
      }
      cv_.notify_all();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      cv_.notify_all();
    }
  }
}

void ShardLoader::read_visit(const ShardVisit& visit) {
  const ShardInfo& shard = shards_[visit.shard];
  const std::unique_ptr<ByteSource> source = options_.open()(shard);
  TarReaderOptions tar;
  tar.max_member_bytes = options_.max_member_bytes();
  ShardSampleReader reader(*source, tar);
  int64_t at = 0;  // the next sample index the reader returns
  for (size_t j = 0; j < visit.samples.size(); ++j) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_ || error_) return;
    }
    while (at < visit.samples[j]) {
      if (!reader.next(false)) break;
      ++at;
    }
    std::optional<ShardSample> sample = at == visit.samples[j] ? reader.next(true) : std::nullopt;
    if (!sample)
      ember::detail::fail(
          ErrorKind::kData,
          "[data] {} ended after {} samples, its manifest says {}: the shard changed since the manifest "
          "was written; rewrite the manifest (ember_shards index)",
          shard.url, reader.samples(), shard.samples);
    ++at;
    int64_t bytes = 0;
    for (const auto& m : sample->members) bytes += static_cast<int64_t>(m.second.size());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Slot& slot = slots_[visit.positions[j]];
      slot.state = Slot::kRaw;
      slot.raw = std::move(sample);
      slot.raw_bytes = bytes;
      ++raw_samples_;
      raw_bytes_ += bytes;
      ++stats_.samples_read;
      stats_.peak_raw_samples = std::max(stats_.peak_raw_samples, raw_samples_);
      stats_.peak_raw_bytes = std::max(stats_.peak_raw_bytes, raw_bytes_);
      // Counted with its last sample, under the same lock: a consumer that has
      // taken every sample sees every visit counted (counted after the loop,
      // stats() could miss the last one: a test saw 255 of 256).
      if (j + 1 == visit.samples.size()) ++stats_.visits;
    }
    cv_.notify_all();
  }
}

void ShardLoader::decoder_loop() {
  torch::NoGradGuard no_grad;
  const int64_t ahead = (options_.prefetch() + 1) * options_.batch_size();
  for (;;) {
    int64_t p;
    ShardSample raw;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || next_decode_ >= end_ || next_decode_ < consumed_ + ahead; });
      if (stop_ || next_decode_ >= end_) return;
      p = next_decode_++;
      cv_.wait(lock, [&] { return stop_ || error_ || slots_.count(p) > 0; });
      if (stop_ || error_) return;
      Slot& slot = slots_[p];
      if (slot.state == Slot::kFailed) continue;
      raw = std::move(*slot.raw);
      slot.raw.reset();
      slot.state = Slot::kDecoding;
      --raw_samples_;
      raw_bytes_ -= slot.raw_bytes;
    }
    const int64_t id = part_.ids[p];
    try {
      DecodedSample d = decode_(raw, id, epoch_);
      EMBER_CHECK(d.input.defined() && d.target.defined(), "the decoder returned no input or no target");
      std::lock_guard<std::mutex> lock(mutex_);
      Slot& slot = slots_[p];
      slot.decoded = std::move(d);
      slot.state = Slot::kDecoded;
    } catch (const Error& e) {
      const std::string why =
          fmt::format("[data] {}: sample '{}' (id {}): {}", shard_of(id).url, raw.key, id, e.what());
      std::lock_guard<std::mutex> lock(mutex_);
      if (options_.on_error() == OnError::kFail) {
        if (!error_)
          error_ = std::make_exception_ptr(
              Error(ErrorKind::kData, why + "; data.on_error=skip leaves such samples out"));
      } else {
        fail_position(p, why);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

Batch ShardLoader::assemble(int64_t begin, int64_t end) {
  std::vector<torch::Tensor> inputs, targets;
  std::vector<int64_t> ids;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] {
      if (error_) return true;
      for (int64_t p = begin; p < end; ++p) {
        auto it = slots_.find(p);
        if (it == slots_.end() || (it->second.state != Slot::kDecoded && it->second.state != Slot::kFailed))
          return false;
      }
      return true;
    });
    if (error_) std::rethrow_exception(error_);
    for (int64_t p = begin; p < end; ++p) {
      auto it = slots_.find(p);
      if (it->second.state == Slot::kDecoded) {
        inputs.push_back(std::move(it->second.decoded.input));
        targets.push_back(std::move(it->second.decoded.target));
        ids.push_back(part_.ids[p]);
      }
      slots_.erase(it);
    }
    consumed_ = end;
  }
  cv_.notify_all();
  // Skipped samples are stood in for by the batch's decoded ones, in turn (or,
  // when none is left, by the previous batch's), so that every batch keeps its
  // size: the same steps on every rank, static shapes for CUDA graphs.
  const size_t skipped = static_cast<size_t>(end - begin) - inputs.size();
  if (skipped > 0) {
    if (inputs.empty()) {
      EMBER_CHECK_KIND(kData, last_batch_.input.defined(),
                       "[data::ShardLoader] every sample of the batch at positions [{}, {}) of epoch {} was "
                       "skipped, and no earlier batch of this epoch can stand in; the first skips: {}",
                       begin, end, epoch_, fmt::join(stats().skipped, "; "));
      inputs.push_back(last_batch_.input[0]);
      targets.push_back(last_batch_.target[0]);
      ids.push_back(last_batch_.index[0].item<int64_t>());
    }
    const size_t good = inputs.size();
    for (size_t k = 0; inputs.size() < static_cast<size_t>(end - begin); ++k) {
      inputs.push_back(inputs[k % good]);
      targets.push_back(targets[k % good]);
      ids.push_back(ids[k % good]);
    }
  }
  for (size_t i = 1; i < inputs.size(); ++i)
    EMBER_CHECK_KIND(
        kData, inputs[i].sizes() == inputs[0].sizes() && targets[i].sizes() == targets[0].sizes(),
        "[data::ShardLoader] sample {} decodes to input {} target {}, sample {} of the same batch to "
        "input {} target {}: a batch needs one shape; resize in the decoder",
        ids[i], inputs[i].sizes(), targets[i].sizes(), ids[0], inputs[0].sizes(), targets[0].sizes());
  Batch batch;
  batch.input = torch::stack(inputs);
  batch.target = torch::stack(targets);
  batch.index = torch::tensor(ids, torch::kInt64);
  batch.epoch = epoch_;
  last_batch_ = batch;
  return batch;
}

void ShardLoader::log_served(const Batch& batch, int64_t number) {
  if (served_log_ == nullptr) {
    served_log_ = std::fopen(options_.served_log().c_str(), "a");
    if (served_log_ == nullptr)
      ember::detail::fail(ErrorKind::kData, "[data] cannot append to {}: {}", options_.served_log(),
                          std::strerror(errno));
  }
  std::string line = fmt::format("{} {}", batch.epoch, number);
  const torch::Tensor ids = batch.index.contiguous();
  for (int64_t i = 0; i < ids.numel(); ++i) line += fmt::format(" {}", ids.data_ptr<int64_t>()[i]);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), served_log_);
  std::fflush(served_log_);
}

std::optional<Batch> ShardLoader::next() {
  torch::NoGradGuard no_grad;
  if (consumed_ >= end_) return std::nullopt;
  const int64_t begin = consumed_;
  const int64_t end = std::min(end_, begin + options_.batch_size());
  Batch batch = assemble(begin, end);
  if (!options_.served_log().empty()) log_served(batch, begin / options_.batch_size());
  if (options_.transform()) batch = options_.transform()(std::move(batch));
  if (!options_.device().is_cpu()) {
    batch.input = ember::detail::to_device_async(batch.input, options_.device());
    batch.target = ember::detail::to_device_async(batch.target, options_.device());
  }
  if (options_.device_transform()) batch = options_.device_transform()(std::move(batch));
  return batch;
}

}  // namespace ember::data
