#pragma once
// What the Hugging Face name maps and config.json writers of models::Gpt2 and
// models::Bert share: the removed heads as transformers' `pruned_heads` (checked against
// the model they describe) and one MLP width for every layer.
//
// transformers 4 keeps `config.pruned_heads` ({"layer": [heads]}, heads
// numbered as in the unpruned model) and prunes them in from_pretrained
// before it loads the weights, so a model whose heads Ember removed
// (prune::prune_heads, prune::removed_heads) loads there as it is.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <locale>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ember/core/error.h"

namespace ember::models::hf {

/// Whether `s` ends with `suffix` (the name maps' test for a tensor's kind).
inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// removed_heads ("PREFIX{i}SUFFIX" -> heads removed, numbered in the
/// unpruned model) -> layer i -> those heads, sorted; layers without removed
/// heads left out. Refused (ember::Error naming `model`): a module that is
/// not PREFIX{i}SUFFIX for a layer i < n_layer, a repeated head or one
/// outside 0..n_head-1, and a layer whose heads left (n_head minus those
/// removed) are not heads_now(i), the heads the model has.
inline std::map<int64_t, std::vector<int64_t>> pruned_heads(
    const std::map<std::string, std::vector<int64_t>>& removed_heads, const std::string& model,
    const std::string& prefix, const std::string& suffix, int64_t n_layer, int64_t n_head,
    const std::function<int64_t(int64_t)>& heads_now) {
  std::map<int64_t, std::vector<int64_t>> by_layer;
  for (const auto& [module, heads] : removed_heads) {
    const bool named = module.size() > prefix.size() + suffix.size() && module.rfind(prefix, 0) == 0 &&
                       ends_with(module, suffix);
    const std::string index =
        named ? module.substr(prefix.size(), module.size() - prefix.size() - suffix.size()) : std::string();
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos ||
        (index.size() > 1 && index[0] == '0') || std::stoll(index) >= n_layer)
      throw Error("[" + model + "] '" + module + "' is not one of this model's attention modules (" + prefix +
                  "N" + suffix + ", N < " + std::to_string(n_layer) + ")");
    if (heads.empty()) continue;
    std::vector<int64_t>& sorted = by_layer[std::stoll(index)];
    sorted = heads;
    std::sort(sorted.begin(), sorted.end());
  }
  for (int64_t i = 0; i < n_layer; ++i) {
    const auto it = by_layer.find(i);
    const std::vector<int64_t> removed = it == by_layer.end() ? std::vector<int64_t>{} : it->second;
    const bool valid = std::adjacent_find(removed.begin(), removed.end()) == removed.end() &&
                       (removed.empty() || (removed.front() >= 0 && removed.back() < n_head));
    const int64_t left = n_head - static_cast<int64_t>(removed.size());
    if (!valid || left != heads_now(i))
      throw Error("[" + model + "] layer " + std::to_string(i) + " has " + std::to_string(heads_now(i)) +
                  " heads, but the removed heads given for it leave " + std::to_string(left) + " of " +
                  std::to_string(n_head) +
                  " (or repeat one or fall outside 0..n_head-1): pass prune::removed_heads of the plans that "
                  "pruned this model");
  }
  return by_layer;
}

/// `{"0": [1, 5], "3": [2]}`: the value of config.pruned_heads.
inline std::string pruned_heads_json(const std::map<int64_t, std::vector<int64_t>>& by_layer) {
  std::ostringstream json;
  json.imbue(std::locale::classic());
  json << "{";
  for (auto it = by_layer.begin(); it != by_layer.end(); ++it) {
    json << (it == by_layer.begin() ? "\"" : ", \"") << it->first << "\": [";
    for (size_t j = 0; j < it->second.size(); ++j) json << (j ? ", " : "") << it->second[j];
    json << "]";
  }
  return json.str() + "}";
}

/// The MLP width all n_layer layers share (width(i) of each; the config key
/// `key` holds one), or ember::Error naming the first that differs.
inline int64_t uniform_width(const std::string& model, const std::string& key, int64_t n_layer,
                             const std::function<int64_t(int64_t)>& width) {
  const int64_t first = width(0);
  for (int64_t i = 1; i < n_layer; ++i)
    if (width(i) != first)
      throw Error("[" + model + "] the MLPs have different widths (layer 0: " + std::to_string(first) +
                  ", layer " + std::to_string(i) + ": " + std::to_string(width(i)) +
                  "): transformers holds one width for every layer (" + key +
                  "), so no config.json describes this model");
  return first;
}

}  // namespace ember::models::hf
