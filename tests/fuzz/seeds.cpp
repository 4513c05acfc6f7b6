// ember_fuzz_replay --make-seeds DIR: writes a valid input for every target
// (DIR/TARGET/valid-*), made by Ember's own writers, as the fuzzers' starting
// corpus (its scratch files go to a temp folder, as the tests' do).
// tests/fuzz/corpus was made this way, then grown by fuzzing.
#include <torch/torch.h>

#include <cstdio>

#include "ember/core/file.h"
#include "ember/data/cifar.h"
#include "ember/data/idx.h"
#include "ember/data/shards.h"
#include "ember/data/tar.h"
#include "ember/prune/plan.h"
#include "ember/train/checkpoint.h"
#include "ember/train/safetensors.h"
#include "train/test_task.h"

#if EMBER_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#endif

namespace ember::fuzz {
namespace {

void put(const std::string& dir, const std::string& target, const std::string& name,
         const std::string& bytes) {
  core::make_dirs(dir + "/" + target);
  core::write_file_atomic(dir + "/" + target + "/" + name, bytes);
}

std::string with_pick(uint8_t pick, const std::string& bytes) {
  return std::string(1, char(pick)) + bytes;
}

}  // namespace

void make_seeds(const std::string& dir) {
  const std::string tmp = test_util::temp_dir("fuzz_seeds");
  torch::manual_seed(0);
  // IDX: uint8 images, int16 and float32 (gzip) arrays, labels.
  data::write_idx(tmp + "/a.idx", torch::randint(0, 256, {2, 3, 4}, torch::kUInt8));
  put(dir, "idx", "valid-u8-2x3x4", core::read_file(tmp + "/a.idx"));
  data::write_idx(tmp + "/b.idx", torch::arange(-5, 5, torch::kInt16));
  put(dir, "idx", "valid-i16-10", core::read_file(tmp + "/b.idx"));
  data::write_idx(tmp + "/c.idx.gz", torch::randn({3, 2}));
  put(dir, "idx", "valid-f32-3x2-gzip", core::read_file(tmp + "/c.idx.gz"));
  // CIFAR-10 and CIFAR-100 records.
  for (int variant = 0; variant < 2; ++variant) {
    data::CifarOptions o;
    o.variant(variant ? data::CifarVariant::kCifar100 : data::CifarVariant::kCifar10);
    const int64_t classes = variant ? 100 : 10;
    data::TensorDataset ds{torch::randint(0, 256, {2, 32, 32, 3}, torch::kUInt8),
                           torch::randint(0, classes, {2}, torch::kInt64)};
    data::write_cifar_bin(tmp + "/cifar.bin", ds, o);
    put(dir, "cifar", variant ? "valid-cifar100" : "valid-cifar10",
        with_pick(uint8_t(variant), core::read_file(tmp + "/cifar.bin")));
  }
#if EMBER_WITH_OPENCV
  // Images: PNG, JPEG, BMP (the first byte picks the extension).
  cv::Mat image(5, 7, CV_8UC3);
  cv::randu(image, 0, 255);
  const std::pair<const char*, uint8_t> formats[] = {{".png", 0}, {".jpg", 1}, {".bmp", 2}};
  for (const auto& [ext, pick] : formats) {
    std::vector<uchar> buf;
    cv::imencode(ext, image, buf);
    put(dir, "image", std::string("valid-5x7") + ext, with_pick(pick, std::string(buf.begin(), buf.end())));
  }
#endif
  // Config: a file and overrides.
  put(dir, "config", "valid-file-and-overrides",
      "[trainer]\nepochs = 3\nseed = 7\n\n[optim]\nlr = 0.05\nname = \"sgd\"\n\n[data]\nbatch_size = 64\n"
      "\n---\ndata.train_subset=1000\nsched.name=cosine\noptim.weight_decay=5e-4\n");
  // Safetensors: several dtypes, metadata, an empty tensor.
  train::save_safetensors(tmp + "/t.safetensors",
                          {{"w", torch::randn({2, 3})},
                           {"b", torch::arange(4, torch::kInt64)},
                           {"h", torch::randn({3}).to(torch::kHalf)},
                           {"m", torch::ones({2}, torch::kBool)},
                           {"e", torch::zeros({0, 2})}},
                          {{"format", "pt"}});
  put(dir, "safetensors", "valid-dtypes", core::read_file(tmp + "/t.safetensors"));
  // Pruning plan for fuzz_prune_plan.cpp's network: conv1's channels {0, 2, 5}
  // through bn1 and the depthwise layer into conv2.
  const std::vector<int64_t> keep{0, 2, 5};
  std::vector<prune::PlanEntry> entries;
  for (const char* name : {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean",
                           "bn1.running_var", "dw.weight", "dw.bias"})
    entries.push_back({name, 0, 8, keep});
  entries.push_back({"conv2.weight", 1, 8, keep});
  put(dir, "prune_plan", "valid-conv1-3-of-8", prune::Plan(entries).to_json());
  // ... and its attention keeping head 0 of 2 (4 wide): q, k, v rows 0..3 of each 8, proj columns 0..3.
  const std::vector<int64_t> rows{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19};
  put(dir, "prune_plan", "valid-attn-1-of-2-heads",
      prune::Plan({{"attn.proj.weight", 1, 8, {0, 1, 2, 3}},
                   {"attn.qkv.bias", 0, 24, rows},
                   {"attn.qkv.weight", 0, 24, rows}},
                  {{"attn", 2, 2, {0}}})
          .to_json());
  // Checkpoint: a real one from a short Trainer run, as an archive to seal
  // (first byte 0) and as the sealed file (first byte 1).
  {
    test_util::BlobTask::Options o;
    o.samples = 64;
    o.prefetch = 0;
    test_util::BlobTask task(o);
    train::TrainerOptions to;
    to.epochs(1).run_dir(tmp + "/run");
    train::Trainer(to).fit(task);
    const std::string sealed = core::read_file(tmp + "/run/checkpoints/last.pt");
    put(dir, "checkpoint", "valid-archive", with_pick(0, sealed.substr(0, sealed.size() - 24)));
    put(dir, "checkpoint", "valid-sealed", with_pick(1, sealed));
  }
  // Tar: a WebDataset shard of two samples, with a name ustar splits into a
  // prefix, one it holds only in a pax record, and a non-ASCII one (pax).
  {
    data::TarWriter w(tmp + "/shard.tar");
    w.add("000000.txt", "first");
    w.add("000000.cls", "3");
    w.add(std::string(120, 'd') + "/000001.txt", std::string(700, 'x'));
    w.add(std::string(130, 'n') + ".cls", "1");
    w.add("caf\xc3\xa9.txt", "");
    w.finish();
    put(dir, "tar", "valid-ustar-pax", core::read_file(tmp + "/shard.tar"));
  }
  // Manifest: wids shard-index JSON with every field, relative and absolute URLs.
  data::write_manifest(tmp + "/index.json",
                       {{"train-000000.tar", 10, 20480, 0x1234abcdu},
                        {"http://127.0.0.1:8000/train-000001.tar", 7, 10240, std::nullopt},
                        {"pipe:cat /data/train-000002.tar", -1, -1, std::nullopt}},
                       "seed");
  put(dir, "manifest", "valid-wids", core::read_file(tmp + "/index.json"));
  std::printf("seeds written under %s\n", dir.c_str());
}

}  // namespace ember::fuzz
