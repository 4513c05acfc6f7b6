// train::load_pretrained: names, shapes, dtypes, transposes, tied tensors,
// strict reports, sharded checkpoints. With torchvision's own models:
// tests/parity/pretrained_parity.py.
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/train/pretrained.h>
#include <ember/train/safetensors.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

using namespace ember;
using train::load_pretrained;
using train::PretrainedOptions;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
    out = register_module("out", torch::nn::Linear(3, 2));
  }
  torch::nn::Linear fc{nullptr}, out{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::string scratch(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "ember_pretrained_test";
  core::make_dirs(dir);
  return dir + "/" + name;
}

train::NamedTensors state_of(torch::nn::Module& m) {
  train::NamedTensors out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value().clone());
  return out;
}

bool same_state(torch::nn::Module& a, torch::nn::Module& b) {
  const auto x = state_of(a), y = state_of(b);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].first != y[i].first || !torch::equal(x[i].second, y[i].second)) return false;
  return true;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Pretrained, LoadsEveryTensorByName) {
  torch::manual_seed(1);
  Net source, target;
  source->bn->running_mean.uniform_(-1, 1);
  train::save_safetensors(scratch("net.safetensors"), *source);
  ASSERT_FALSE(same_state(*source, *target));
  const train::LoadReport r = load_pretrained(*target, scratch("net.safetensors"));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.loaded.size(), 9u);  // 6 parameters, 3 buffers
  EXPECT_TRUE(same_state(*source, *target));
}

TEST(Pretrained, CastsDtypesAndTransposesWhereTold) {
  torch::manual_seed(2);
  Net source, target;
  train::NamedTensors file;
  for (auto& [name, t] : state_of(*source)) {
    if (name == "fc.weight") t = t.t().contiguous();  // stored [in, out], as GPT-2's Conv1D
    if (t.is_floating_point()) t = t.to(torch::kBFloat16);
    file.emplace_back("model." + name, t);
  }
  train::save_safetensors(scratch("bf16.safetensors"), file);
  PretrainedOptions o;
  o.map().rename = [](const std::string& n) { return n.rfind("model.", 0) == 0 ? n.substr(6) : n; };
  o.map().transposed = [](const std::string& n) { return n == "fc.weight"; };
  ASSERT_TRUE(load_pretrained(*target, scratch("bf16.safetensors"), o).ok());
  EXPECT_EQ(target->fc->weight.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(target->fc->weight, source->fc->weight.to(torch::kBFloat16).to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(target->out->bias, source->out->bias.to(torch::kBFloat16).to(torch::kFloat32)));
  // Not told: the transposed weight is of another shape.
  o.map().transposed = nullptr;
  const std::string e = error_of([&] { load_pretrained(*target, scratch("bf16.safetensors"), o); });
  EXPECT_NE(e.find("wrong shape: fc.weight: the file's model.fc.weight is [4, 3], the model's [3, 4]"),
            std::string::npos)
      << e;
}

TEST(Pretrained, StrictNamesEveryProblemAndLoadsNothing) {
  torch::manual_seed(3);
  Net source, target;
  auto file = state_of(*source);
  file.erase(file.begin());                           // fc.weight removed
  file[0].first = "fc.bais";                          // fc.bias renamed
  file[1].second = torch::zeros({5});                 // bn.weight reshaped
  file.emplace_back("extra.weight", torch::ones(1));  // unexpected
  train::save_safetensors(scratch("bad.safetensors"), file);
  const auto before = state_of(*target);
  const std::string e = error_of([&] { load_pretrained(*target, scratch("bad.safetensors")); });
  for (const char* what : {"2 missing, 2 unexpected, 1 of another shape", "missing: fc.weight",
                           "missing: fc.bias (closest in the file: fc.bais", "unexpected: fc.bais",
                           "unexpected: extra.weight", "wrong shape: bn.weight"})
    EXPECT_NE(e.find(what), std::string::npos) << what << " not in:\n" << e;
  const auto after = state_of(*target);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i].second, after[i].second));
  // Lenient: what matches is loaded, the rest reported.
  const train::LoadReport r =
      load_pretrained(*target, scratch("bad.safetensors"), PretrainedOptions().strict(false));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.missing.size(), 2u);
  EXPECT_EQ(r.unexpected.size(), 2u);
  EXPECT_EQ(r.mismatched.size(), 1u);
  EXPECT_TRUE(torch::equal(target->out->weight, source->out->weight));
  EXPECT_FALSE(torch::equal(target->fc->bias, source->fc->bias));
}

TEST(Pretrained, ReinitLeavesAHeadAsInitialised) {
  Net source, target;
  auto file = state_of(*source);
  for (auto& [name, t] : file)
    if (name.rfind("out.", 0) == 0)
      t = torch::zeros(name == "out.weight" ? std::vector<int64_t>{7, 3} : std::vector<int64_t>{7});
  train::save_safetensors(scratch("head.safetensors"), file);
  EXPECT_THROW(load_pretrained(*target, scratch("head.safetensors")), Error);
  const torch::Tensor head = target->out->weight.clone();
  const train::LoadReport r =
      load_pretrained(*target, scratch("head.safetensors"), PretrainedOptions().reinit({"out."}));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.reinitialised, (std::vector<std::string>{"out.weight", "out.bias"}));
  EXPECT_TRUE(torch::equal(target->out->weight, head));
  EXPECT_TRUE(torch::equal(target->fc->weight, source->fc->weight));
}

TEST(Pretrained, TiedTensorsNeedOneOfTheirNames) {
  struct HeadImpl : torch::nn::Module {
    explicit HeadImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
    torch::Tensor weight;
  };
  struct TiedImpl : torch::nn::Module {  // GPT-2's lm_head is its token embedding
    TiedImpl() {
      emb = register_module("wte", torch::nn::Embedding(5, 3));
      head = register_module("lm_head", std::make_shared<HeadImpl>(emb->weight));
    }
    torch::nn::Embedding emb{nullptr};
    std::shared_ptr<HeadImpl> head;
  };
  auto source = std::make_shared<TiedImpl>(), target = std::make_shared<TiedImpl>();
  train::save_safetensors(scratch("tied.safetensors"), {{"wte.weight", source->emb->weight.detach()}});
  const train::LoadReport r = load_pretrained(*target, scratch("tied.safetensors"));
  EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_TRUE(torch::equal(target->head->weight, source->emb->weight));
}

TEST(Pretrained, ShardedCheckpointsAndTheirIndex) {
  torch::manual_seed(4);
  Net source, target;
  const auto state = state_of(*source);
  const std::string dir = scratch("sharded");
  core::make_dirs(dir);
  train::save_safetensors(dir + "/a.safetensors", train::NamedTensors(state.begin(), state.begin() + 4));
  train::save_safetensors(dir + "/b.safetensors", train::NamedTensors(state.begin() + 4, state.end()));
  const auto index = [&](const std::string& b_name, const std::string& moved) {
    std::string map;
    for (size_t i = 0; i < state.size(); ++i) {
      const std::string& n = state[i].first;
      const std::string file = n == moved ? "a.safetensors" : i < 4 ? "a.safetensors" : b_name;
      map += (map.empty() ? "" : ", ") + ("\"" + n + "\": \"" + file + "\"");
    }
    core::write_file_atomic(dir + "/model.safetensors.index.json", "{\"weight_map\": {" + map + "}}");
  };
  index("b.safetensors", "");
  const train::LoadReport r = load_pretrained(*target, dir);
  EXPECT_EQ(r.files.size(), 2u);
  EXPECT_TRUE(same_state(*source, *target));
  index("../b.safetensors", "");  // a shard outside the index's folder
  EXPECT_NE(error_of([&] { load_pretrained(*target, dir); }).find("is not a file name beside the index"),
            std::string::npos);
  index("c.safetensors", "");  // a missing shard
  EXPECT_NE(error_of([&] { load_pretrained(*target, dir); }).find("c.safetensors is missing"),
            std::string::npos);
  index("b.safetensors", "out.bias");  // the index places a tensor in the wrong file
  EXPECT_NE(
      error_of([&] { load_pretrained(*target, dir); }).find("holds 'out.bias', which the index places in"),
      std::string::npos);
  EXPECT_NE(error_of([&] { load_pretrained(*target, scratch("nowhere")); }).find("no such file"),
            std::string::npos);
}

TEST(Pretrained, ReadsOneTensorAtATimeOnlyThoseWanted) {
  Net source;
  train::save_safetensors(scratch("some.safetensors"), *source);
  const auto header = train::read_safetensors_header(scratch("some.safetensors"));
  EXPECT_EQ(header.size(), 9u);
  std::vector<std::string> read;
  train::read_safetensors(
      scratch("some.safetensors"), [](const train::TensorInfo& i) { return i.name.rfind("bn.", 0) == 0; },
      [&](const std::string& name, torch::Tensor t) {
        read.push_back(name);
        EXPECT_TRUE(t.defined());
      });
  EXPECT_EQ(read.size(), 5u);  // weight, bias, running_mean, running_var, num_batches_tracked
}
