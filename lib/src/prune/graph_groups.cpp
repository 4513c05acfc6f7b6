// The dependency graph's groups: the union-find over channel labels, and the assembly of
// units and groups from it (Tracer::finish), and DependencyGraph::summary.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "prune/graph_internal.h"

namespace ember::prune {

namespace detail {

int64_t UnionFind::make() {
  parent_.push_back(static_cast<int64_t>(parent_.size()));
  return parent_.back();
}

int64_t UnionFind::find(int64_t x) {
  while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
  return x;
}

void UnionFind::unite(int64_t a, int64_t b) {
  a = find(a);
  b = find(b);
  if (a == b) return;
  if (a > b) std::swap(a, b);  // the smaller id wins: label 0 (frozen) stays the root
  parent_[b] = a;
}

}  // namespace detail

DependencyGraph Tracer::finish() {
  std::vector<std::string> unreached;
  for (const auto& [impl, owner] : owners_)
    if (!owner.is_buffer && !leaves_.count(impl)) unreached.push_back(owner.name);
  std::sort(unreached.begin(), unreached.end());
  if (!unreached.empty())
    warn(fmt::format(
        "[prune::trace] the example forward pass does not use {} parameter(s) ({}{}): layers used only "
        "in training, or fed through detach/argmax, are not tied to the channels they consume; add "
        "them to ignored_layers if they are",
        unreached.size(),
        fmt::join(unreached.begin(), unreached.begin() + std::min<size_t>(4, unreached.size()), ", "),
        unreached.size() > 4 ? ", ..." : ""));
  for (size_t t = 0; t < dims_.size(); ++t)
    for (const std::string& ignored : options_.ignored_layers())
      if (dims_[t].module == ignored || dims_[t].module.rfind(ignored + ".", 0) == 0) freeze(dim_labels_[t]);

  DependencyGraph g;
  g.dims_ = dims_;
  g.warnings_ = warnings_;
  // Units: label classes that are not frozen; groups: units with the same set of dimensions.
  const int64_t frozen = uf_.find(frozen_);
  std::map<int64_t, std::set<int64_t>> dims_of_root;  // root -> dims it touches
  for (size_t t = 0; t < dim_labels_.size(); ++t)
    for (int64_t l : dim_labels_[t]) {
      const int64_t r = uf_.find(l);
      if (r == frozen) continue;
      dims_of_root[r].insert(static_cast<int64_t>(t));
    }
  std::map<std::vector<int64_t>, std::unordered_set<int64_t>> roots_of_signature;
  for (const auto& [root, dset] : dims_of_root)
    roots_of_signature[std::vector<int64_t>(dset.begin(), dset.end())].insert(root);
  // Deterministic order: groups by their dimensions (trace order).
  for (const auto& [sig, roots] : roots_of_signature) {
    // Reference dimension: the first output dimension of a layer, else the first one.
    int64_t ref = sig.front();
    for (int64_t t : sig)
      if (dims_[t].role == DimRole::kOut) {
        ref = t;
        break;
      }
    // Units in the order of their first position in the reference dimension.
    std::unordered_map<int64_t, int64_t> unit_of_root;
    for (int64_t l : dim_labels_[ref]) {
      const int64_t r = uf_.find(l);
      if (roots.count(r)) unit_of_root.emplace(r, static_cast<int64_t>(unit_of_root.size()));
    }
    Group group;
    group.num_units = static_cast<int64_t>(unit_of_root.size());
    std::vector<int64_t> members{ref};
    for (int64_t t : sig)
      if (t != ref) members.push_back(t);
    for (int64_t t : members) {
      Group::Member m;
      m.dim = t;
      m.unit_of.assign(dim_labels_[t].size(), -1);
      for (size_t p = 0; p < dim_labels_[t].size(); ++p) {
        auto it = unit_of_root.find(uf_.find(dim_labels_[t][p]));
        if (it != unit_of_root.end()) m.unit_of[p] = it->second;
      }
      group.members.push_back(std::move(m));
    }
    const int64_t ref_positions = static_cast<int64_t>(std::count_if(
        group.members[0].unit_of.begin(), group.members[0].unit_of.end(), [](int64_t u) { return u >= 0; }));
    group.unit_width = group.num_units > 0 ? ref_positions / group.num_units : 1;
    group.name = fmt::format("{}[{}]", dims_[ref].name, dims_[ref].dim);
    if (group.num_units > 0) g.groups_.push_back(std::move(group));
  }
  return g;
}

std::string DependencyGraph::summary() const {
  std::string s;
  for (const Group& g : groups_) {
    s += fmt::format("{}: {} units x {} channels:", g.name, g.num_units, g.unit_width);
    for (const auto& m : g.members) s += fmt::format(" {}[{}]", dims_[m.dim].name, dims_[m.dim].dim);
    s += "\n";
  }
  return s;
}

}  // namespace ember::prune
