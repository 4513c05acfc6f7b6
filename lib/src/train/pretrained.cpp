#include "ember/train/pretrained.h"

#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "core/check.h"
#include "core/edit_distance.h"
#include "ember/core/file.h"
#include "ember/train/safetensors.h"

namespace ember::train {
namespace {

constexpr size_t kSuggestedFor = 20;  // missing names given their closest file names

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Hugging Face's sharded checkpoint: {"metadata": {...}, "weight_map": {"name": "file", ...}}.
struct Index {
  std::vector<std::string> files;               // in order of first mention
  std::map<std::string, std::string> location;  // tensor name -> its file (a path)
};

Index read_index(const std::string& path) {
  std::ifstream in(path);
  EMBER_CHECK(in.good(), "[train::load_pretrained] cannot open the index {}", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    ember::detail::fail("[train::load_pretrained] {}: not valid JSON: {}", path, e.what());
  }
  EMBER_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              "[train::load_pretrained] {}: no \"weight_map\" object (a sharded checkpoint's index maps each "
              "tensor name to its file)",
              path);
  Index index;
  std::set<std::string> seen;
  for (const auto& [name, file] : j["weight_map"].items()) {
    EMBER_CHECK(file.is_string(), "[train::load_pretrained] {}: weight_map[\"{}\"] is not a file name", path,
                name);
    const std::string f = file.get<std::string>();
    // Shards lie beside their index: a name with a directory in it could point anywhere.
    EMBER_CHECK(
        !f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
        "[train::load_pretrained] {}: weight_map[\"{}\"] = \"{}\" is not a file name beside the index", path,
        name, f);
    const std::string full = dir_of(path) + "/" + f;
    if (seen.insert(full).second) index.files.push_back(full);
    index.location[name] = full;
  }
  EMBER_CHECK(!index.files.empty(), "[train::load_pretrained] {}: the weight_map names no file", path);
  for (const std::string& f : index.files)
    EMBER_CHECK(core::is_file(f), "[train::load_pretrained] {}: shard {} is missing", path, f);
  return index;
}

// Up to 3 of `candidates` closest to `name` (edit distance, then order).
std::vector<std::string> closest(const std::string& name, const std::vector<std::string>& candidates) {
  std::vector<std::pair<size_t, size_t>> scored;  // distance, index
  for (size_t i = 0; i < candidates.size(); ++i)
    scored.emplace_back(core::edit_distance(name, candidates[i]), i);
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t k = 0; k < scored.size() && k < 3; ++k) out.push_back(candidates[scored[k].second]);
  return out;
}

// One tensor of the checkpoint, under the model's name.
struct FileTensor {
  std::string file, name;  // where it is, and its name there
  TensorInfo info;
};

// A model tensor and every name it is registered under (tied weights share one).
struct ModelTensor {
  std::vector<std::string> names;
  torch::Tensor tensor;
};

std::vector<ModelTensor> model_tensors(torch::nn::Module& model) {
  std::vector<ModelTensor> out;
  std::unordered_map<const c10::TensorImpl*, size_t> at;
  const auto add = [&](const std::string& name, const torch::Tensor& t) {
    if (!t.defined()) return;
    const auto [it, fresh] = at.emplace(t.unsafeGetTensorImpl(), out.size());
    if (fresh)
      out.push_back({{name}, t});
    else
      out[it->second].names.push_back(name);
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) add(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) add(b.key(), b.value());
  return out;
}

// The checkpoint's files and, for a sharded one, its index's tensor -> file map.
Index resolve(const std::string& path) {
  if (core::is_dir(path)) {
    for (const char* name : {"model.safetensors.index.json", "model.safetensors"}) {
      const std::string p = path + "/" + name;
      if (core::is_file(p)) return resolve(p);
    }
    ember::detail::fail(
        "[train::load_pretrained] {} has neither model.safetensors.index.json nor model.safetensors; give "
        "the "
        "file itself",
        path);
  }
  EMBER_CHECK(core::is_file(path), "[train::load_pretrained] {}: no such file", path);
  if (ends_with(path, ".json")) return read_index(path);
  return {{path}, {}};
}

}  // namespace

std::string LoadReport::describe() const {
  std::string out;
  for (size_t i = 0; i < missing.size(); ++i) {
    out += fmt::format("  missing: {}", missing[i]);
    if (i < missing_closest.size() && !missing_closest[i].empty())
      out += fmt::format(" (closest in the file: {})", missing_closest[i]);
    out += "\n";
  }
  for (const std::string& n : unexpected) out += fmt::format("  unexpected: {}\n", n);
  for (const std::string& n : mismatched) out += fmt::format("  wrong shape: {}\n", n);
  return out;
}

std::vector<std::string> checkpoint_files(const std::string& path) {
  return resolve(path).files;
}

LoadReport load_pretrained(torch::nn::Module& model, const std::string& path, const PretrainedOptions& o) {
  const std::string where = fmt::format("[train::load_pretrained] {}", path);
  LoadReport report;
  Index checkpoint = resolve(path);
  report.files = checkpoint.files;
  std::map<std::string, std::string>& weight_map = checkpoint.location;  // each entry checked, then erased
  const bool indexed = !weight_map.empty();

  // The checkpoint's tensors under the model's names, from the headers alone.
  std::map<std::string, FileTensor> in_file;
  std::vector<std::string> file_names;  // after renaming, for suggestions
  for (const std::string& file : report.files) {
    for (train::TensorInfo& info : read_safetensors_header(file)) {
      if (indexed) {
        const auto w = weight_map.find(info.name);
        EMBER_CHECK(w != weight_map.end() && w->second == file, "{}: {} holds '{}', which the index {}",
                    where, file, info.name,
                    w == weight_map.end() ? "does not list" : "places in " + w->second);
        weight_map.erase(w);
      }
      const std::string name = o.map().rename ? o.map().rename(info.name) : info.name;
      if (name.empty()) continue;
      const std::string file_name = info.name;
      const auto [it, fresh] = in_file.emplace(name, FileTensor{file, file_name, std::move(info)});
      EMBER_CHECK(fresh, "{}: two tensors of the checkpoint are the model's '{}': '{}' ({}) and '{}' ({})",
                  where, name, it->second.name, it->second.file, file_name, file);
      file_names.push_back(name);
    }
  }
  EMBER_CHECK(weight_map.empty(), "{}: the index lists '{}' in {}, which does not hold it", where,
              weight_map.empty() ? "" : weight_map.begin()->first,
              weight_map.empty() ? "" : weight_map.begin()->second);

  const auto reinit = [&](const std::string& name) {
    return std::any_of(o.reinit().begin(), o.reinit().end(),
                       [&](const std::string& prefix) { return name.rfind(prefix, 0) == 0; });
  };
  // What each model tensor takes, decided before anything is read.
  struct Plan {
    torch::Tensor target;
    const FileTensor* source;
    bool transpose;
    bool resize;
    std::string name;  // the model's
  };
  std::map<std::string, std::vector<Plan>> by_file;
  std::set<std::string> used;
  for (const ModelTensor& m : model_tensors(model)) {
    if (std::any_of(m.names.begin(), m.names.end(), reinit)) {
      report.reinitialised.insert(report.reinitialised.end(), m.names.begin(), m.names.end());
      continue;
    }
    const FileTensor* source = nullptr;
    std::string as;
    for (const std::string& n : m.names) {
      const auto it = in_file.find(n);
      if (it == in_file.end()) continue;
      used.insert(n);
      if (source == nullptr) source = &it->second, as = n;
    }
    if (source == nullptr) {
      report.missing.push_back(m.names.size() == 1
                                   ? m.names[0]
                                   : fmt::format("{} (tied: {})", m.names[0], fmt::join(m.names, ", ")));
      continue;
    }
    const bool transpose = o.map().transposed && o.map().transposed(as);
    std::vector<int64_t> shape = source->info.shape;
    if (transpose) {
      EMBER_CHECK(shape.size() == 2, "{}: '{}' is marked transposed but is {}-D in the file", where, as,
                  shape.size());
      std::swap(shape[0], shape[1]);
    }
    const std::vector<int64_t> model_shape = m.tensor.sizes().vec();
    const bool resize = shape != model_shape && o.map().resize.accepts && o.map().resize.apply &&
                        o.map().resize.accepts(as, shape, model_shape);
    if (shape != model_shape && !resize) {
      report.mismatched.push_back(fmt::format("{}: the file's {} is {}{}, the model's {}", as, source->name,
                                              shape_str(source->info.shape), transpose ? " (transposed)" : "",
                                              shape_str(m.tensor.sizes().vec())));
      continue;
    }
    by_file[source->file].push_back({m.tensor, source, transpose, resize, as});
    report.loaded.push_back(as);
    if (resize) report.resized.push_back(as);
  }
  for (const auto& [name, t] : in_file)
    if (used.count(name) == 0 && !reinit(name)) report.unexpected.push_back(name);
  // Suggestions among the file's unused names (all of them when every one was used).
  const std::vector<std::string>& candidates = report.unexpected.empty() ? file_names : report.unexpected;
  for (size_t i = 0; i < report.missing.size() && i < kSuggestedFor; ++i)
    report.missing_closest.push_back(
        fmt::format("{}", fmt::join(closest(report.missing[i], candidates), ", ")));

  if (o.strict() && !report.ok())
    ember::detail::fail(
        "{}: {} missing, {} unexpected, {} of another shape; nothing was loaded (strict: "
        "PretrainedOptions::strict(false) loads what matches; reinit leaves a new head as initialised):\n{}",
        where, report.missing.size(), report.unexpected.size(), report.mismatched.size(), report.describe());

  // One tensor at a time, straight into the model's.
  torch::NoGradGuard no_grad;
  for (const auto& file_plans : by_file) {
    const std::string& file = file_plans.first;  // a structured binding cannot be captured in C++17
    const auto& plans = file_plans.second;
    std::map<std::string, const Plan*> wanted;
    for (const Plan& p : plans) wanted[p.source->name] = &p;
    read_safetensors(
        file,
        [&](const TensorInfo& info) {
          const auto it = wanted.find(info.name);
          if (it == wanted.end()) return false;
          // The file read now must be the one planned from (not replaced in between).
          EMBER_CHECK(
              info.dtype == it->second->source->info.dtype && info.shape == it->second->source->info.shape,
              "{}: {} changed while it was being read ('{}' is now {})", where, file, info.name,
              shape_str(info.shape));
          return true;
        },
        [&](const std::string& name, torch::Tensor t) {
          const Plan& p = *wanted.at(name);
          if (p.transpose) t = t.t();
          if (p.resize) {
            t = o.map().resize.apply(p.name, t, p.target.sizes().vec());
            EMBER_CHECK(t.sizes() == p.target.sizes(),
                        "{}: resizing '{}' gave {}, the model's is {} (a bug of WeightMap::resize; the "
                        "tensors read before it are loaded: rebuild the model before using it)",
                        where, p.name, shape_str(t.sizes().vec()), shape_str(p.target.sizes().vec()));
          }
          p.target.copy_(t);
        });
  }
  return report;
}

void save_pretrained(const std::string& path, torch::nn::Module& model, const WeightMap& to_file) {
  NamedTensors out;
  std::set<std::string> written;
  for (const ModelTensor& m : model_tensors(model)) {  // a tied tensor once, under its first name
    const std::string& name = m.names.front();
    const std::string file_name = to_file.rename ? to_file.rename(name) : name;
    if (file_name.empty()) continue;
    EMBER_CHECK(written.insert(file_name).second,
                "[train::save_pretrained] {}: two model tensors are mapped to the file name '{}'", path,
                file_name);
    const bool transpose = to_file.transposed && to_file.transposed(name);
    EMBER_CHECK(!transpose || m.tensor.dim() == 2,
                "[train::save_pretrained] {}: '{}' is to be written transposed but has {} dimensions", path,
                name, m.tensor.dim());
    out.emplace_back(file_name, transpose ? m.tensor.detach().t() : m.tensor.detach());
  }
  save_safetensors(path, out, {{"format", "pt"}});
}

void save_for_pytorch(const std::string& dir, torch::nn::Module& model, const PytorchBuilder& builder,
                      const WeightMap& to_file) {
  EMBER_CHECK(
      !builder.name.empty() && builder.name.find('.') != std::string::npos,
      "[train::save_for_pytorch] {}: the builder must be a dotted Python path (torchvision.models.resnet50), "
      "got '{}'",
      dir, builder.name);
  nlohmann::json kwargs;
  try {
    kwargs = nlohmann::json::parse(builder.kwargs_json.empty() ? std::string("{}") : builder.kwargs_json);
  } catch (const nlohmann::json::exception& e) {
    EMBER_CHECK(false, "[train::save_for_pytorch] {}: the builder's kwargs are not JSON ({}): {}", dir,
                e.what(), builder.kwargs_json);
  }
  EMBER_CHECK(kwargs.is_object(),
              "[train::save_for_pytorch] {}: the builder's kwargs must be a JSON object, got {}", dir,
              builder.kwargs_json);
  nlohmann::json spec = {{"format", "ember-pytorch-v1"}, {"builder", builder.name}, {"kwargs", kwargs}};
  if (!builder.example_input.empty()) spec["example_input"] = builder.example_input;
  core::make_dirs(dir);
  save_pretrained(dir + "/model.safetensors", model, to_file);
  core::write_file_atomic(dir + "/model.json", spec.dump(2) + "\n");
}

}  // namespace ember::train
