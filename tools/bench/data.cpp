// ember_bench_data: images/s of Ember's streamed loader from JPEG shards into
// training batches, as the classification recipes build it (data::ShardLoader,
// recipe::classification_decoder, recipe::augment_transform): decode straight
// into a RandomResizedCrop, flip, normalise, float32 NCHW batches. Driven by
// tools/bench/data.py, which runs PyTorch's DataLoader beside it.
//
//   ember_bench_data --shards MANIFEST [--threads N] [--readers R] [--batch B] [--epochs E]
//                    [--size S] [--no-dct] [--diff-samples K] [--device cuda] [--nvjpeg]
//
// On a CUDA device the batch is copied there and normalised by the GPU
// kernel; with --nvjpeg, JPEGs are decoded there too (augment/nvjpeg.h).
//
// Prints one JSON line: the images/s of each epoch after the first (the first
// warms the page cache and starts the threads), and with --diff-samples K the
// mean and max absolute difference (of 255) between DCT-scaled and full
// decoding of the same K crops.
#include <ember/ember.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <iostream>

using namespace ember;

int main(int argc, char** argv) {
  std::string shards_spec;
  int64_t threads = 2, readers = 1, batch = 128, epochs = 3, size = 224, diff_samples = 0;
  bool dct = true, nvjpeg = false;
  std::string device_name = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--shards" && has) {
      shards_spec = argv[++i];
    } else if (a == "--threads" && has) {
      threads = std::stoll(argv[++i]);
    } else if (a == "--readers" && has) {
      readers = std::stoll(argv[++i]);
    } else if (a == "--batch" && has) {
      batch = std::stoll(argv[++i]);
    } else if (a == "--epochs" && has) {
      epochs = std::stoll(argv[++i]);
    } else if (a == "--size" && has) {
      size = std::stoll(argv[++i]);
    } else if (a == "--diff-samples" && has) {
      diff_samples = std::stoll(argv[++i]);
    } else if (a == "--device" && has) {
      device_name = argv[++i];
    } else if (a == "--nvjpeg") {
      nvjpeg = true;
    } else if (a == "--no-dct") {
      dct = false;
    } else {
      std::cerr << "usage: ember_bench_data --shards MANIFEST [--threads N] [--readers R] [--batch B] "
                   "[--epochs E] [--size S] [--no-dct] [--diff-samples K] [--device cuda] [--nvjpeg]\n";
      return 2;
    }
  }
  if (shards_spec.empty() || epochs < 2) {
    std::cerr << "ember_bench_data: give --shards, and --epochs >= 2 (the first is a warm-up)\n";
    return 2;
  }
  try {
    // The batch's normalisation (the consumer's, augment::apply) runs on the same cores as a training run's
    // intra-op threads would; the decoding on the loader's threads.
    torch::set_num_threads(static_cast<int>(threads));
    recipe::tune_host_malloc();  // as the recipes do (run.malloc_tuning)
    const uint64_t seed = 0;
    augment::AugmentOptions a;
    a.size({size, size})
        .crop(augment::CropMode::kRandomResized)
        .hflip(0.5)
        .mean({0.485, 0.456, 0.406})
        .std({0.229, 0.224, 0.225});
    const torch::Device device(device_name);
    recipe::StreamOptions stream;
    stream.decode().dct_scaling(dct);
    stream.nvjpeg(nvjpeg);
    const data::ShardOpener open = recipe::shard_opener(stream);
    const std::vector<data::ShardInfo> shards = data::count_samples(data::shard_list(shards_spec), open);
    data::ShardLoaderOptions l;
    l.batch_size(batch).readers(readers).decode_threads(threads).open(open);
    if (device.is_cpu()) {
      l.transform(recipe::augment_transform(augment::after_decode(a), seed));
    } else {
      l.device(device).device_transform(recipe::augment_transform(augment::after_decode(a), seed));
    }
    l.order().seed(seed);
    data::ShardLoader loader(shards, recipe::classification_decoder(a, seed, stream, 1 << 20, device), l);
    std::vector<double> rates;
    int64_t images = 0;
    for (int64_t e = 0; e < epochs; ++e) {
      const auto t0 = std::chrono::steady_clock::now();
      loader.start_epoch(e, 0);
      int64_t n = 0;
      while (auto b = loader.next()) n += b->size();
      if (device.is_cuda()) torch::cuda::synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (e > 0) rates.push_back(static_cast<double>(n) / s);
      images = n;
    }
    double diff_mean = 0, diff_max = 0;
    if (diff_samples > 0) {
      // The same crops decoded with and without DCT scaling.
      std::unique_ptr<data::ByteSource> source = open(shards.front());
      data::ShardSampleReader reader(*source);
      augment::DecodeOptions with, without;
      with.dct_scaling(true);
      without.dct_scaling(false);
      int64_t k = 0;
      double sum = 0;
      int64_t count = 0;
      while (k < diff_samples) {
        const std::optional<data::ShardSample> s = reader.next();
        if (!s) break;
        const std::string* jpg = s->find("jpg");
        if (jpg == nullptr) continue;
        const torch::Tensor x = augment::decode_image(*jpg, a, seed, k, 0, with).to(torch::kFloat);
        const torch::Tensor y = augment::decode_image(*jpg, a, seed, k, 0, without).to(torch::kFloat);
        const torch::Tensor d = (x - y).abs();
        sum += d.sum().item<double>();
        count += d.numel();
        diff_max = std::max(diff_max, d.max().item<double>());
        ++k;
      }
      diff_mean = count > 0 ? sum / static_cast<double>(count) : 0;
    }
    std::cout << fmt::format(
        "{{\"side\": \"{}\", \"images\": {}, \"threads\": {}, \"readers\": {}, \"images_per_second\": [{}], "
        "\"dct_diff_mean\": {:.4f}, \"dct_diff_max\": {:.0f}, \"samples_skipped\": {}, \"peak_raw_samples\": "
        "{}, "
        "\"peak_raw_bytes\": {}}}\n",
        nvjpeg ? "ember-nvjpeg"
        : dct  ? "ember"
               : "ember-nodct",
        images, threads, readers, fmt::join(rates, ", "), diff_mean, diff_max, loader.stats().samples_skipped,
        loader.stats().peak_raw_samples, loader.stats().peak_raw_bytes);
  } catch (const std::exception& e) {
    std::cerr << "ember_bench_data: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
