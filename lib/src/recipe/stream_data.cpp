// Streamed classification data: the data.shards and data.stream.* keys, the
// sample decoder (image or tensor, and label), ClassificationTask's loaders
// over shards.
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "core/check.h"
#include "ember/augment/nvjpeg.h"
#include "ember/core/enum_names.h"
#include "ember/data/npy.h"
#include "ember/recipe/classification.h"

namespace ember::recipe {

using core::Bounds;
using core::OnResume;

namespace {

constexpr core::EnumNames<data::OnError, 2> kOnErrorNames{
    "data.stream.on_error", {{{data::OnError::kFail, "fail"}, {data::OnError::kSkip, "skip"}}}};

const char* const kImageExtensions[] = {"jpg", "jpeg", "png"};

/// The sample's label, as `spec` says where it is.
int64_t label_of(const data::ShardSample& s, const std::string& spec, int64_t num_classes) {
  int64_t label = -1;
  if (spec == "cls") {
    const std::string* cls = s.find("cls");
    EMBER_CHECK_KIND(kData, cls != nullptr, "no .cls member (data.stream.label=cls)");
    size_t used = 0;
    try {
      label = std::stoll(*cls, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < cls->size() && std::isspace(static_cast<unsigned char>((*cls)[used]))) ++used;
    EMBER_CHECK_KIND(kData, used > 0 && used == cls->size(), "the .cls member '{}' is not an integer",
                     cls->substr(0, 40));
  } else {
    const std::string field = spec.substr(5);
    const std::string* json = s.find("json");
    EMBER_CHECK_KIND(kData, json != nullptr, "no .json member (data.stream.label={})", spec);
    const nlohmann::json j = nlohmann::json::parse(*json, nullptr, false);
    EMBER_CHECK_KIND(kData, j.is_object() && j.contains(field) && j[field].is_number_integer(),
                     "the .json member has no integer field \"{}\" (data.stream.label={})", field, spec);
    label = j[field].get<int64_t>();
  }
  EMBER_CHECK_KIND(kData, label >= 0 && label < num_classes, "label {} is outside [0, {}) (data.num_classes)",
                   label, num_classes);
  return label;
}

/// Whether the shards hold images (else tensors): the first sample's members say.
bool holds_images(const data::ShardInfo& shard, const data::ShardOpener& open, int64_t max_member_bytes) {
  const std::unique_ptr<data::ByteSource> source = open(shard);
  data::TarReaderOptions tar;
  tar.max_member_bytes = max_member_bytes;
  data::ShardSampleReader reader(*source, tar);
  const std::optional<data::ShardSample> first = reader.next(false);
  EMBER_CHECK_KIND(kData, first.has_value(), "[recipe] {} holds no sample", shard.url);
  for (const auto& [ext, bytes] : first->members) {
    for (const char* image : kImageExtensions)
      if (ext == image) return true;
    if (ext == "npy") return false;
  }
  ember::detail::fail(ErrorKind::kData,
                      "[recipe] {}: sample '{}' has no image (.jpg, .jpeg, .png) or tensor (.npy) member; a "
                      "classification shard's samples hold one of those and a label",
                      shard.url, first->key);
}

std::vector<data::ShardInfo> shards_of(const core::Config& c, const char* key, const StreamOptions& stream) {
  const std::string spec = c.get_string(key);
  if (spec.empty()) return {};
  const data::ShardOpener open = shard_opener(stream);
  const std::string cache = c.get_string("data.stream.count_cache");
  std::string cache_file;
  if (!cache.empty()) cache_file = fmt::format("{}/{}-counts.json", cache, std::string(key).substr(5));
  return data::count_samples(data::shard_list(spec), open, 4, cache_file);
}

}  // namespace

void declare_stream_keys(core::Config& c) {
  c.declare(
      "data.shards", "",
      "training shards: a manifest (.json), a brace pattern such as train-{000000..000146}.tar, or several "
      "separated by ::; "
      "http(s):// and pipe:COMMAND URLs too (\"\" = the recipe's own dataset)",
      OnResume::kMayChange);
  c.declare("data.val_shards", "", "validation shards (\"\" = none)", OnResume::kMayChange);
  c.declare("data.test_shards", "", "test shards (required with data.shards)", OnResume::kMayChange);
  c.declare("data.num_classes", int64_t{0},
            "classes of the shards' labels (0 = the recipe's own; image_folder needs it with data.shards)",
            Bounds::at_least(0));
  const data::ShardLoaderOptions d;
  c.declare(
      "data.stream.streams", d.order().streams(),
      "streams the epoch order interleaves; a multiple of the world sizes the run may use (docs/data.md)",
      Bounds::between(1, 65536));
  c.declare("data.stream.shuffle_block", d.order().shuffle_block(), "samples of a stream shuffled together",
            Bounds::between(1, int64_t{1} << 30));
  c.declare("data.stream.readers", d.readers(), "threads reading shards", Bounds::between(1, 256),
            OnResume::kMayChange);
  c.declare("data.stream.decode_threads", int64_t{0}, "threads decoding samples (0 = every core)",
            Bounds::between(0, 1024), OnResume::kMayChange);
  c.declare("data.stream.prefetch", d.prefetch(), "batches decoded ahead", Bounds::between(0, 64),
            OnResume::kMayChange);
  c.declare("data.stream.read_ahead", d.read_ahead(),
            "samples ahead of the consumer a shard visit may start (0 = (prefetch + 2) x batch)",
            Bounds::at_least(0), OnResume::kMayChange);
  c.declare(
      "data.stream.on_error", "fail",
      "a damaged shard or sample: fail (name it) or skip (count it, another sample of the batch stands in)");
  c.declare("data.stream.label", "cls", "where a sample's label is: cls, or json:FIELD");
  c.declare("data.stream.max_member_bytes", d.max_member_bytes(), "tar members larger than this are refused",
            Bounds::between(1, int64_t{1} << 40), OnResume::kMayChange);
  // (on_error, dct_scaling and max_pixels change what the run trains on: they hold for its resumes)
  c.declare("data.stream.dct_scaling", true,
            "decode JPEG crops at 1/2, 1/4, 1/8 size in the DCT when they allow");
  c.declare("data.stream.max_pixels", int64_t{64} << 20, "images declaring more pixels are refused",
            Bounds::between(1, int64_t{1} << 34));
  c.declare("data.stream.http_retries", data::HttpOptions().retries, "retries of an http(s):// shard",
            Bounds::between(0, 100), OnResume::kMayChange);
  c.declare("data.stream.http_stall_seconds", data::HttpOptions().stall_seconds,
            "seconds under one byte a second that make a stall (retried)", Bounds::between(1, 3600),
            OnResume::kMayChange);
  c.declare("data.stream.count_cache", "",
            "folder caching the sample counts of shards named without a manifest (\"\" = count every run)",
            OnResume::kMayChange);
  c.declare("data.stream.cache_dir", "",
            "folder caching remote shards (http(s)://, pipe:) on local disk (\"\" = read them at each visit)",
            OnResume::kMayChange);
  c.declare("data.stream.cache_gib", 64.0, "the most GiB the shard cache holds (least recently used evicted)",
            Bounds::positive(), OnResume::kMayChange);
  c.declare("data.stream.cache_verify", true, "check each cached shard's CRC-32 before use (its size always)",
            OnResume::kMayChange);
  c.declare(
      "data.stream.nvjpeg", false,
      "decode JPEG images on the GPU with nvJPEG (trainer.device=cuda; not yet run on a GPU: docs/data.md)");
  c.declare("data.stream.served_log", "",
            "a file each training batch's sample ids are appended to (\"EPOCH BATCH ID...\"; {rank} = the "
            "rank): what each step trained on (\"\" = none)",
            OnResume::kMayChange);
  c.add_check([](const core::Config& config) {
    (void)stream_options_from_config(config);
    if (!streaming(config)) return;
    EMBER_CHECK_KIND(kConfig, !config.get_string("data.test_shards").empty(),
                     "[recipe] data.shards needs data.test_shards (the shards to test on)");
  });
}

bool streaming(const core::Config& c) {
  return !c.get_string("data.shards").empty();
}

StreamOptions stream_options_from_config(const core::Config& c) {
  StreamOptions s;
  data::ShardLoaderOptions& l = s.loader();
  l.order().streams(c.get_int("data.stream.streams")).shuffle_block(c.get_int("data.stream.shuffle_block"));
  const int64_t threads = c.get_int("data.stream.decode_threads");
  l.readers(c.get_int("data.stream.readers"))
      .decode_threads(threads > 0 ? threads : std::max<int64_t>(1, std::thread::hardware_concurrency()))
      .prefetch(c.get_int("data.stream.prefetch"))
      .read_ahead(c.get_int("data.stream.read_ahead"))
      .max_member_bytes(c.get_int("data.stream.max_member_bytes"))
      .on_error(kOnErrorNames.parse(c.get_string("data.stream.on_error"), "recipe"));
  s.http().retries = static_cast<int>(c.get_int("data.stream.http_retries"));
  s.http().stall_seconds = static_cast<int>(c.get_int("data.stream.http_stall_seconds"));
  s.decode()
      .dct_scaling(c.get_bool("data.stream.dct_scaling"))
      .max_pixels(c.get_int("data.stream.max_pixels"));
  s.label(c.get_string("data.stream.label"));
  s.served_log(c.get_string("data.stream.served_log"));
  s.nvjpeg(c.get_bool("data.stream.nvjpeg"));
  EMBER_CHECK_KIND(kConfig, s.label() == "cls" || (s.label().rfind("json:", 0) == 0 && s.label().size() > 5),
                   "[recipe] data.stream.label='{}': choose cls or json:FIELD", s.label());
  return s;
}

data::ShardOpener shard_opener(const StreamOptions& stream) {
  const data::HttpOptions http = stream.http();
  data::ShardOpener direct = [http](const data::ShardInfo& s) { return data::open_shard(s, http); };
  if (!stream.cache()) return direct;
  return [cache = stream.cache(), direct](const data::ShardInfo& s) { return cache->open(s, direct); };
}

ClassificationShards classification_shards_from_config(const core::Config& c, const StreamOptions& stream) {
  for (const char* key : {"data.train_subset", "data.test_subset", "data.val_size"})
    EMBER_CHECK_KIND(kConfig, c.get_int(key) == 0,
                     "[recipe] {} applies to in-memory datasets; with data.shards, name the shards to use "
                     "(data.val_shards for validation)",
                     key);
  ClassificationShards s;
  s.train = shards_of(c, "data.shards", stream);
  s.val = shards_of(c, "data.val_shards", stream);
  s.test = shards_of(c, "data.test_shards", stream);
  s.num_classes = c.get_int("data.num_classes");
  return s;
}

data::SampleDecoder classification_decoder(const augment::AugmentOptions& options, uint64_t seed,
                                           const StreamOptions& stream, int64_t num_classes,
                                           torch::Device device) {
  const bool nvjpeg = stream.nvjpeg();
  if (nvjpeg) {
    std::string why;
    EMBER_CHECK_KIND(kConfig, augment::nvjpeg_available(device, &why), "[recipe] data.stream.nvjpeg: {}",
                     why);
    if (!device.has_index()) device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(0));
  }
  return [options, seed, decode = stream.decode(), label = stream.label(), num_classes, nvjpeg, device](
             const data::ShardSample& s, int64_t id, int64_t epoch) -> data::DecodedSample {
    torch::Tensor target = torch::tensor(label_of(s, label, num_classes), torch::kInt64);
    for (const char* ext : kImageExtensions) {
      const std::string* image = s.find(ext);
      if (image == nullptr) continue;
      if (nvjpeg && std::string_view(ext) != "png") {
        // One decoder per decoder thread (its own CUDA stream), made at its first JPEG.
        thread_local std::unique_ptr<augment::NvjpegDecoder> gpu;
        if (!gpu || gpu->device() != device) gpu = std::make_unique<augment::NvjpegDecoder>(device);
        return {gpu->decode_image(*image, options, seed, id, epoch, decode), target};
      }
      torch::Tensor decoded = augment::decode_image(*image, options, seed, id, epoch, decode);
      return {nvjpeg ? decoded.to(device) : decoded, target};
    }
    if (const std::string* npy = s.find("npy")) {
      torch::Tensor t = data::read_npy(*npy, "the .npy member");
      EMBER_CHECK_KIND(kData, t.scalar_type() == torch::kUInt8 && (t.dim() == 2 || t.dim() == 3),
                       "the .npy member is {} [{}]; classification images are uint8 [H, W] or [H, W, C]",
                       c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
      return {t, target};
    }
    throw Error(ErrorKind::kData, "no image (.jpg, .jpeg, .png) or tensor (.npy) member");
  };
}

ClassificationTask::ClassificationTask(torch::nn::AnyModule model, ClassificationShards shards,
                                       const ClassificationOptions& o, const StreamOptions& stream)
    : model_(std::move(model)), num_classes_(shards.num_classes), mix_(o.mix()), seed_(o.seed()) {
  EMBER_CHECK(!model_.is_empty(), "[recipe::ClassificationTask] no model");
  EMBER_CHECK(shards.num_classes >= 1, "[recipe::ClassificationTask] num_classes must be >= 1, got {}",
              shards.num_classes);
  EMBER_CHECK(!shards.train.empty() && !shards.test.empty(),
              "[recipe::ClassificationTask] no training or test shards");
  model_.ptr()->to(o.device());
  EMBER_CHECK_KIND(kConfig, !stream.nvjpeg() || o.device().is_cuda(),
                   "[recipe] data.stream.nvjpeg decodes JPEG images on the GPU: it needs trainer.device=cuda "
                   "(this run trains on {})",
                   o.device().str());
  const data::ShardOpener open = shard_opener(stream);
  const bool images = holds_images(shards.train.front(), open, stream.loader().max_member_bytes());
  const augment::AugmentOptions eval = augment::eval_options(o.augment());
  // Images are cropped and flipped as they are decoded; tensors are augmented whole, as in memory.
  const auto batch_transform = [&](const augment::AugmentOptions& a) {
    return augment_transform(images ? augment::after_decode(a) : a, o.seed());
  };
  const auto loader = [&](const std::vector<data::ShardInfo>& list, bool training) {
    data::ShardLoaderOptions l = stream.loader();
    l.open(open).device(o.device()).batch_size(training ? o.batch_size() : o.eval_batch_size());
    if (training && !stream.served_log().empty()) {
      std::string log = stream.served_log();
      if (const size_t at = log.find("{rank}"); at != std::string::npos)
        log.replace(at, 6, std::to_string(o.rank()));
      l.served_log(log);
    }
    l.order()
        .seed(o.seed())
        .shuffle(training)
        .num_replicas(training ? o.world_size() : 1)
        .rank(training ? o.rank() : 0);
    const augment::AugmentOptions& a = training ? o.augment() : eval;
    if (o.device().is_cpu()) {
      l.transform(batch_transform(a));
    } else {
      l.device_transform(batch_transform(a));
    }
    return std::make_unique<data::ShardLoader>(
        list, classification_decoder(a, o.seed(), stream, num_classes_, o.device()), l);
  };
  train_ = loader(shards.train, true);
  if (!shards.val.empty()) val_ = loader(shards.val, false);
  test_ = loader(shards.test, false);
}

std::unique_ptr<ClassificationTask> ClassificationTask::from_shards(const core::Config& c,
                                                                    const RunContext& context,
                                                                    torch::nn::AnyModule model,
                                                                    int64_t num_classes) {
  EMBER_CHECK(streaming(c), "[recipe::ClassificationTask::from_shards] data.shards is not set");
  const int64_t keyed = c.get_int("data.num_classes");
  EMBER_CHECK_KIND(kConfig, keyed == 0 || num_classes == 0 || keyed == num_classes,
                   "[recipe] data.num_classes={}, but this recipe's model has {} classes", keyed,
                   num_classes);
  EMBER_CHECK_KIND(kConfig, keyed > 0 || num_classes > 0,
                   "[recipe] data.shards needs data.num_classes (the labels are 0..N-1)");
  StreamOptions stream = stream_options_from_config(c);
  if (const std::string dir = c.get_string("data.stream.cache_dir"); !dir.empty()) {
    data::ShardCacheOptions cache;
    cache.dir = dir;
    cache.max_bytes = static_cast<int64_t>(c.get_float("data.stream.cache_gib") * double(int64_t{1} << 30));
    cache.verify = c.get_bool("data.stream.cache_verify");
    stream.cache(std::make_shared<data::ShardCache>(cache));
  }
  ClassificationShards shards = classification_shards_from_config(c, stream);
  shards.num_classes = num_classes > 0 ? num_classes : keyed;
  return std::make_unique<ClassificationTask>(std::move(model), std::move(shards),
                                              classification_options_from_config(c, context), stream);
}

}  // namespace ember::recipe
