// Sharded data parallelism (ZeRO-1/2/3): see ember/dist/sharding.h.
#include "ember/dist/sharding.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/rmsprop.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/check.h"
#include "ember/amp/grad_scaler.h"
#include "ember/amp/precision.h"
#include "ember/core/blocks.h"
#include "ember/core/enum_names.h"
#include "ember/optim/fused.h"
#include "ember/optim/optimizer.h"
#include "ember/train/trainer.h"

namespace ember::dist {

namespace {
constexpr core::EnumNames<Sharding, 4> kShardingNames{
    "dist.sharding stage",
    {{{Sharding::kNone, "none"},
      {Sharding::kOptimizer, "optimizer"},
      {Sharding::kGradients, "gradients"},
      {Sharding::kParameters, "parameters"}}},
    "none: plain DDP; optimizer: its state, ZeRO-1; gradients: + gradients, ZeRO-2; parameters: + the "
    "blocks' parameters, ZeRO-3"};
}  // namespace

Sharding parse_sharding(const std::string& name) {
  return kShardingNames.parse(name, "dist");
}

const char* to_string(Sharding sharding) {
  return kShardingNames.name(sharding);
}

namespace {

constexpr int64_t kBytesPerMiB = 1024 * 1024;
constexpr size_t kMaxStateKinds = 8;
// Units whose reduce-scatter may run at once while backward goes on: their
// flat gradients are what a rank holds beyond its shard.
constexpr size_t kInFlight = 2;  // tensors per parameter's state (Adam: 3, RMSprop: 3)

// The elements of a dense tensor as one flat view in memory order: the order
// a unit stores its parameters in (a channels-last kernel keeps its layout).
torch::Tensor flat_memory(const torch::Tensor& t) {
  return t.as_strided({t.numel()}, {1}, t.storage_offset());
}

// `t` (a parameter's full state tensor) flattened in the memory order of `like`.
torch::Tensor flat_in_layout_of(const torch::Tensor& t, const torch::Tensor& like) {
  if (t.sizes() == like.sizes() && t.strides() == like.strides()) return flat_memory(t);
  torch::Tensor same = torch::empty_strided(like.sizes(), like.strides(), t.options());
  same.copy_(t);
  return flat_memory(same);
}

// Elements [offset, offset + length) of 1-D `base`'s memory as a tensor of
// its own: the same storage, but not an autograd view, so the optimizer may
// detach_ it (zero_grad) or step it like any parameter.
torch::Tensor alias(const torch::Tensor& base, int64_t offset, int64_t length) {
  return torch::empty({0}, base.options())
      .set_(base.storage(), base.storage_offset() + offset, {length}, {1});
}

std::optional<int64_t> step_count(const torch::optim::OptimizerParamState& s) {
  if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&s)) return a->step();
  if (auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(&s)) return a->step();
  if (auto* a = dynamic_cast<const torch::optim::RMSpropParamState*>(&s)) return a->step();
  if (auto* a = dynamic_cast<const torch::optim::AdagradParamState*>(&s)) return a->step();
  return std::nullopt;
}

void set_step_count(torch::optim::OptimizerParamState& s, int64_t step) {
  if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(&s)) a->step(step);
  if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(&s)) a->step(step);
  if (auto* a = dynamic_cast<torch::optim::RMSpropParamState*>(&s)) a->step(step);
  if (auto* a = dynamic_cast<torch::optim::AdagradParamState*>(&s)) a->step(step);
}

bool elementwise_optimizer(const torch::optim::Optimizer& o) {
  return dynamic_cast<const torch::optim::SGD*>(&o) || dynamic_cast<const torch::optim::Adam*>(&o) ||
         dynamic_cast<const torch::optim::AdamW*>(&o) || dynamic_cast<const torch::optim::RMSprop*>(&o) ||
         dynamic_cast<const torch::optim::Adagrad*>(&o);
}

void settle(torch::optim::Optimizer& o) {
  if (auto* fused = dynamic_cast<optim::FusedOptimizer*>(&o)) fused->settle_state();
}

std::vector<torch::Tensor*> state_tensors(torch::optim::OptimizerParamState& s) {
  std::vector<torch::Tensor*> out;
  optim::for_each_state_tensor(s, [&](torch::Tensor& t) { out.push_back(&t); });
  return out;
}

using StateMap = ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

}  // namespace

struct ShardedDataParallel::Impl : core::BlockHooks, std::enable_shared_from_this<Impl> {
  struct Param {
    std::string name;
    torch::Tensor tensor;  // the model's parameter (its data lives in its unit)
    size_t unit = 0;
    int64_t offset = 0;  // in the unit
    std::vector<size_t> pieces;
    std::shared_ptr<torch::autograd::Node> accumulator;
    uintptr_t hook = 0;
    // kParameters: the parameter's region of its unit's `full` buffer, and
    // (gathering in the compute dtype) of its `compute` buffer; its data is
    // one of them, as its unit's `whole` says.
    torch::Tensor full_view, compute_view;
  };
  // This rank's part of one parameter: elements [begin, end) of its memory.
  struct Piece {
    size_t param = 0;
    int64_t begin = 0, end = 0;
    int64_t at = 0;       // where it starts in its unit's shard
    torch::Tensor value;  // a 1-D view into the unit's shard: what the optimizer steps
  };
  struct Unit {
    std::vector<size_t> params;
    int64_t numel = 0, padded = 0, shard = 0;
    int64_t block = -1;          // kParameters: the block whose parameters these are
    torch::Tensor full;          // [padded]: the parameters (a block's: allocated only while gathered)
    torch::Tensor shard_params;  // [shard]: a view of `full`, or (a block's) its own storage
    torch::Tensor full_grads;    // [padded]: the gradients being reduce-scattered (only then)
    torch::Tensor shard_grads;   // [shard]: the averaged gradient of this rank's shard
    torch::Tensor incoming;      // [shard]: one micro-batch's reduce-scatter
    int64_t ready = 0;           // parameters whose gradient this backward produced
    bool gathered = true;        // the live buffer holds the block's parameters (kParameters)
    bool gathering = false;      // its all-gather is in flight (`gather`)
    bool prefetched = false;     // ... started by prefetch(), ahead of the block's turn
    // kParameters, gathering in the compute dtype: the block's parameters in
    // that dtype ([padded], allocated only while gathered), what the block
    // computes with; `whole` while they are float32 views of `full` instead
    // (around a checkpoint, after fit).
    torch::Tensor compute;
    bool whole = false;
    torch::Tensor sending;  // the shard cast to the compute dtype, while its gather is in flight
    ProcessGroup::Pending pending;
    ProcessGroup::Pending gather;
    // The buffer the block's parameters view now.
    torch::Tensor& live() { return compute.defined() && !whole ? compute : full; }
  };
  // The optimizer's state made whole (every parameter's, as without sharding).
  struct Whole {
    std::vector<std::vector<torch::Tensor>> group_params;
    StateMap state;
  };

  Impl(ProcessGroup& g, ShardingOptions o) : group(g), options(o), world(g.size()), rank(g.rank()) {}

  ProcessGroup& group;
  ShardingOptions options;
  int64_t world, rank;
  std::vector<Param> params;
  std::vector<Unit> units;
  std::vector<Piece> pieces;
  std::unordered_map<const void*, size_t> index_of;  // TensorImpl -> params
  std::vector<int64_t> unit_of_block;                // kParameters: block -> unit
  core::BlockModel* block_model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  std::vector<std::vector<torch::Tensor>> whole_group_params;  // the groups as the Trainer built them
  std::optional<Whole> set_aside;                              // the shards' state while the writer saves
  size_t next_launch = 0;
  GatherStats gather_stats;
  // kParameters under bf16-mixed/fp16-mixed (ShardingOptions::gather_in_compute_dtype):
  // the dtype the blocks' parameters are gathered and computed in.
  std::optional<torch::ScalarType> compute_dtype;
  bool armed = false, completes = false, first_micro = true, finalize_queued = false;
  bool buffers_need_sync = true;

  // kGradients and kParameters keep no whole gradient across micro-batches.
  bool reduces_every_micro_batch() const { return options.stage() != Sharding::kOptimizer; }

  // --- layout -------------------------------------------------------------

  void plan_units(torch::nn::Module& model) {
    const auto named = optim::trainable_named_parameters(model);
    EMBER_CHECK(!named.empty(), "[dist::ShardedDataParallel] the model has no trainable parameters");
    for (const auto& [name, p] : named) {
      EMBER_CHECK_KIND(kConfig, p.is_non_overlapping_and_dense(),
                       "[dist::ShardedDataParallel] parameter {} is not dense in memory (strides {}); "
                       "sharding lays parameters out flat: make it contiguous",
                       name, p.strides());
      index_of[p.unsafeGetTensorImpl()] = params.size();
      Param param;
      param.name = name;
      param.tensor = p;
      params.push_back(std::move(param));
    }
    std::vector<bool> placed(params.size(), false);
    if (options.stage() == Sharding::kParameters) {
      block_model = dynamic_cast<core::BlockModel*>(&model);
      EMBER_CHECK_KIND(
          kConfig, block_model != nullptr,
          "[dist::ShardedDataParallel] dist.sharding=parameters gathers a block's parameters just "
          "before it runs, so the model must run its blocks through core::BlockModel (as CharGpt and "
          "CifarResNet do); this model does not: use dist.sharding=gradients");
      // A parameter belongs to a block when every use of it is inside that
      // block; a shared one (tied weights) stays whole with the others.
      std::unordered_map<const void*, int64_t> uses;
      for (const auto& p : model.parameters()) ++uses[p.unsafeGetTensorImpl()];
      const auto blocks = block_model->blocks();
      for (size_t b = 0; b < blocks.size(); ++b) {
        std::unordered_map<const void*, int64_t> in_block;
        for (const auto& p : blocks[b]->parameters()) ++in_block[p.unsafeGetTensorImpl()];
        Unit u;
        u.block = static_cast<int64_t>(b);
        for (const auto& p : blocks[b]->parameters()) {
          auto it = index_of.find(p.unsafeGetTensorImpl());
          if (it == index_of.end() || placed[it->second]) continue;
          if (in_block[p.unsafeGetTensorImpl()] != uses[p.unsafeGetTensorImpl()]) continue;
          placed[it->second] = true;
          u.params.push_back(it->second);
        }
        unit_of_block.push_back(u.params.empty() ? -1 : static_cast<int64_t>(units.size()));
        if (!u.params.empty()) units.push_back(std::move(u));
      }
      // Gradients arrive in reverse forward order: reduce the last block first.
      std::reverse(units.begin(), units.end());
      for (size_t u = 0; u < units.size(); ++u) unit_of_block[units[u].block] = static_cast<int64_t>(u);
    }
    // The rest in buckets of about bucket_cap_mb, in reverse registration
    // order (roughly the order backward produces their gradients), each of one dtype.
    const auto cap = static_cast<int64_t>(options.bucket_cap_mb() * kBytesPerMiB);
    Unit bucket;
    int64_t bytes = 0;
    for (size_t k = params.size(); k-- > 0;) {
      if (placed[k]) continue;
      const torch::Tensor& p = params[k].tensor;
      if (!bucket.params.empty() && (bytes + static_cast<int64_t>(p.nbytes()) > cap ||
                                     params[bucket.params.front()].tensor.scalar_type() != p.scalar_type())) {
        units.push_back(std::move(bucket));
        bucket = Unit();
        bytes = 0;
      }
      bucket.params.push_back(k);
      bytes += static_cast<int64_t>(p.nbytes());
    }
    if (!bucket.params.empty()) units.push_back(std::move(bucket));
  }

  // Moves every parameter into its unit's flat buffer and takes this rank's pieces.
  void lay_out() {
    torch::NoGradGuard no_grad;
    for (size_t ui = 0; ui < units.size(); ++ui) {
      Unit& u = units[ui];
      const torch::Tensor& first = params[u.params.front()].tensor;
      for (size_t k : u.params) {
        EMBER_CHECK(params[k].tensor.scalar_type() == first.scalar_type() &&
                        params[k].tensor.device() == first.device(),
                    "[dist::ShardedDataParallel] block {} mixes parameter dtypes or devices ({} and {})",
                    u.block, params[k].name, params[u.params.front()].name);
        params[k].unit = ui;
        params[k].offset = u.numel;
        u.numel += params[k].tensor.numel();
      }
      u.shard = (u.numel + world - 1) / world;
      u.padded = u.shard * world;
      u.full = torch::zeros({u.padded}, first.options());
      for (size_t k : u.params) {
        torch::Tensor& p = params[k].tensor;
        torch::Tensor region = u.full.as_strided(p.sizes(), p.strides(), params[k].offset);
        region.copy_(p);
        p.set_data(region);
        if (u.block >= 0) params[k].full_view = region;
      }
      if (u.block >= 0 && compute_dtype && *compute_dtype != u.full.scalar_type()) {
        // Views made while the buffer has memory, then freed.
        u.whole = true;  // (the parameters view `full` until point_params)
        u.compute = torch::empty({u.padded}, u.full.options().dtype(*compute_dtype));
        for (size_t k : u.params) {
          const torch::Tensor& p = params[k].tensor;
          params[k].compute_view = u.compute.as_strided(p.sizes(), p.strides(), params[k].offset);
        }
      }
      const int64_t lo = rank * u.shard;
      u.shard_params = u.full.narrow(0, lo, u.shard);
      if (u.block >= 0) u.shard_params = u.shard_params.clone();  // kept; `full` only while gathered
      u.shard_grads = torch::zeros_like(u.shard_params);
      for (size_t k : u.params) {
        const int64_t begin = std::max(params[k].offset, lo),
                      end = std::min(params[k].offset + params[k].tensor.numel(), lo + u.shard);
        if (begin >= end) continue;
        params[k].pieces.push_back(pieces.size());
        pieces.push_back(Piece{k, begin - params[k].offset, end - params[k].offset, begin - lo,
                               alias(u.shard_params, begin - lo, end - begin)});
      }
      if (u.block >= 0) {
        free_params(u);
        if (u.compute.defined()) {
          release(u.compute);
          point_params(u, /*whole=*/false);
        }
      }
    }
  }

  // --- the optimizer over the pieces -----------------------------------------

  void shard_optimizer(torch::optim::Optimizer& o) {
    optimizer = &o;
    settle(o);
    whole_group_params.clear();
    size_t expected_states = 0;
    for (auto& g : o.param_groups()) {
      whole_group_params.push_back(g.params());
      std::vector<torch::Tensor> mine;
      for (const auto& p : g.params()) {
        auto it = index_of.find(p.unsafeGetTensorImpl());
        EMBER_CHECK_KIND(
            kConfig, it != index_of.end(),
            "[dist::ShardedDataParallel] the optimizer holds a tensor that is not one of the "
            "model's trainable parameters (shape {}); sharding steps the model's parameters only",
            p.sizes());
        const Param& param = params[it->second];
        // Taken out first: inserting the pieces' states may rehash the map.
        std::unique_ptr<torch::optim::OptimizerParamState> whole;
        if (auto st = o.state().find(p.unsafeGetTensorImpl()); st != o.state().end()) {
          whole = std::move(st->second);
          o.state().erase(st);
        }
        if (whole) expected_states += param.pieces.size();
        for (size_t k : param.pieces) {
          const Piece& piece = pieces[k];
          mine.push_back(piece.value);
          if (!whole) continue;
          std::unique_ptr<torch::optim::OptimizerParamState> s = whole->clone();
          for (torch::Tensor* t : state_tensors(*s))
            if (t->defined())
              *t = flat_in_layout_of(*t, p).narrow(0, piece.begin, piece.end - piece.begin).clone();
          o.state()[piece.value.unsafeGetTensorImpl()] = std::move(s);
        }
      }
      g.params() = std::move(mine);
    }
    size_t with_state = 0;
    for (const Piece& piece : pieces) with_state += o.state().count(piece.value.unsafeGetTensorImpl());
    EMBER_CHECK(with_state == 0 || with_state == pieces.size(),
                "[dist::ShardedDataParallel] rank {}: {} of its {} pieces got optimizer state", rank,
                with_state, pieces.size());
  }

  // Every parameter's whole state, assembled from every rank's pieces (a
  // collective). A rank that holds no state object at all (a model with
  // fewer elements per unit than ranks) cannot rebuild the states' class and
  // returns the groups without state.
  Whole gather_whole_state() {
    torch::optim::Optimizer& o = *optimizer;
    settle(o);
    // What state the pieces have: the same on every rank except one without
    // pieces, so take the maximum.
    torch::optim::OptimizerParamState* like = nullptr;
    for (const Piece& piece : pieces) {
      auto st = o.state().find(piece.value.unsafeGetTensorImpl());
      if (st != o.state().end()) {
        like = st->second.get();
        break;
      }
    }
    torch::Tensor kinds = torch::zeros({static_cast<int64_t>(kMaxStateKinds) + 1},
                                       torch::TensorOptions().dtype(torch::kFloat64).device(group.device()));
    if (like) {
      std::vector<double> v(kMaxStateKinds + 1, 0.0);
      v[0] = 1;
      const auto ts = state_tensors(*like);
      EMBER_CHECK(ts.size() <= kMaxStateKinds, "[dist::ShardedDataParallel] optimizer state of {} tensors",
                  ts.size());
      for (size_t k = 0; k < ts.size(); ++k) v[k + 1] = ts[k]->defined() ? 1 : 0;
      kinds.copy_(torch::tensor(v, torch::kFloat64));
    }
    group.all_reduce_max_(kinds);
    const torch::Tensor host = kinds.cpu();
    const bool any_state = host[0].item<double>() > 0;

    Whole whole;
    whole.group_params = whole_group_params;
    if (!any_state) return whole;
    std::vector<bool> defined;
    for (size_t k = 0; k < kMaxStateKinds; ++k) defined.push_back(host[k + 1].item<double>() > 0);

    torch::NoGradGuard no_grad;
    for (const Unit& u : units) {
      std::vector<torch::Tensor> whole_kinds(kMaxStateKinds);
      for (size_t k = 0; k < kMaxStateKinds; ++k) {
        if (!defined[k]) continue;
        torch::Tensor mine = torch::zeros_like(u.shard_params);
        for (size_t pi : u.params)
          for (size_t q : params[pi].pieces) {
            const Piece& piece = pieces[q];
            auto st = o.state().find(piece.value.unsafeGetTensorImpl());
            if (st == o.state().end()) continue;
            const auto ts = state_tensors(*st->second);
            if (k < ts.size() && ts[k]->defined())
              mine.narrow(0, piece.at, piece.end - piece.begin).copy_(*ts[k]);
          }
        whole_kinds[k] = torch::empty({u.padded}, mine.options());
        group.start_all_gather(whole_kinds[k], mine).wait();
      }
      // Step counts: each parameter's from the rank holding its first element.
      torch::Tensor steps =
          torch::zeros({static_cast<int64_t>(u.params.size())},
                       torch::TensorOptions().dtype(torch::kFloat64).device(group.device()));
      {
        std::vector<double> v(u.params.size(), 0.0);
        for (size_t j = 0; j < u.params.size(); ++j)
          for (size_t q : params[u.params[j]].pieces)
            if (pieces[q].begin == 0) {
              auto st = o.state().find(pieces[q].value.unsafeGetTensorImpl());
              if (st != o.state().end()) v[j] = static_cast<double>(step_count(*st->second).value_or(0));
            }
        steps.copy_(torch::tensor(v, torch::kFloat64));
      }
      group.all_reduce_sum_(steps);
      const torch::Tensor steps_host = steps.cpu();
      if (!like) continue;
      for (size_t j = 0; j < u.params.size(); ++j) {
        const Param& param = params[u.params[j]];
        std::unique_ptr<torch::optim::OptimizerParamState> s = like->clone();
        const auto ts = state_tensors(*s);
        for (size_t k = 0; k < ts.size(); ++k) {
          if (!defined[k]) {
            *ts[k] = torch::Tensor();
            continue;
          }
          torch::Tensor t =
              torch::empty_strided(param.tensor.sizes(), param.tensor.strides(), whole_kinds[k].options());
          flat_memory(t).copy_(whole_kinds[k].narrow(0, param.offset, param.tensor.numel()));
          *ts[k] = t;
        }
        set_step_count(*s, static_cast<int64_t>(steps_host[static_cast<int64_t>(j)].item<double>()));
        whole.state[param.tensor.unsafeGetTensorImpl()] = std::move(s);
      }
    }
    return whole;
  }

  // Gives the optimizer `whole`'s groups and state; returns what it had.
  Whole swap_in(Whole whole) {
    torch::optim::Optimizer& o = *optimizer;
    settle(o);
    Whole had;
    for (size_t g = 0; g < o.param_groups().size(); ++g) {
      had.group_params.push_back(o.param_groups()[g].params());
      o.param_groups()[g].params() = whole.group_params[g];
    }
    had.state = std::move(o.state());
    o.state() = std::move(whole.state);
    return had;
  }

  // --- gradients ------------------------------------------------------------

  void install_grad_hooks() {
    std::weak_ptr<Impl> weak = weak_from_this();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].accumulator = torch::autograd::impl::grad_accumulator(params[i].tensor);
      params[i].hook =
          params[i].accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [weak, i](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list&) {
                if (auto self = weak.lock()) self->grad_ready(i);
                return outputs;
              }));
    }
  }

  void remove_grad_hooks() {
    for (Param& p : params)
      if (p.accumulator) {
        p.accumulator->del_post_hook(p.hook);
        p.accumulator.reset();
      }
  }

  // A parameter's gradient for this backward is in its .grad (autograd's thread).
  void grad_ready(size_t i) {
    if (!armed) return;
    if (!finalize_queued) {
      finalize_queued = true;
      std::weak_ptr<Impl> weak = weak_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto self = weak.lock()) self->finalize();
      });
    }
    if (!reduces_every_micro_batch() && !completes)
      return;  // kOptimizer: accumulate in .grad, as DDP's no_sync
    Unit& u = units[params[i].unit];
    if (++u.ready == static_cast<int64_t>(u.params.size()) && u.block >= 0)
      free_params(u);  // the block's backward is done: its parameters go until the next forward
    // Collectives start in unit order on every rank. At most kInFlight units'
    // flat gradients are held: an older one is waited for and freed first.
    while (next_launch < units.size() &&
           units[next_launch].ready == static_cast<int64_t>(units[next_launch].params.size())) {
      launch(units[next_launch++]);
      if (next_launch > kInFlight) complete(units[next_launch - 1 - kInFlight]);
    }
  }

  void launch(Unit& u) {
    torch::NoGradGuard no_grad;
    // The unit's gradients, flat (zeros: the padding), kept only while reduced.
    torch::Tensor buf = torch::zeros({u.padded}, u.shard_params.options());
    for (size_t k : u.params) {
      torch::Tensor& p = params[k].tensor;
      torch::Tensor region = buf.as_strided(p.sizes(), p.strides(), params[k].offset);
      if (p.grad().defined())
        region.copy_(p.grad());
      else
        region.zero_();  // no gradient this time (on this rank): zero, as in DDP
      p.mutable_grad().reset();
    }
    buf.div_(static_cast<double>(world));  // as DDP: averaged by summing gradients / N
    u.full_grads = buf;
    u.incoming = torch::empty_like(u.shard_grads);
    u.pending = group.start_reduce_scatter(u.incoming, u.full_grads);
  }

  // Waits for a launched unit's reduce-scatter, adds what this rank received
  // to its shard's gradient and frees the unit's flat gradients.
  void complete(Unit& u) {
    if (!u.pending.started()) return;
    u.pending.wait();
    torch::NoGradGuard no_grad;
    if (first_micro || !reduces_every_micro_batch())  // (kOptimizer reduces once per step)
      u.shard_grads.copy_(u.incoming);
    else
      u.shard_grads.add_(u.incoming);
    u.incoming = torch::Tensor();
    u.full_grads = torch::Tensor();
  }

  // End of a backward (queued by its first gradient).
  void finalize() {
    finalize_queued = false;
    if (!armed) return;
    armed = false;
    if (!reduces_every_micro_batch() && !completes) return;
    // Parameters that got no gradient leave their units incomplete.
    for (Unit& u : units) {
      if (u.block >= 0 && u.ready < static_cast<int64_t>(u.params.size())) free_params(u);
      u.ready = static_cast<int64_t>(u.params.size());
    }
    while (next_launch < units.size()) launch(units[next_launch++]);
    next_launch = 0;
    for (Unit& u : units) {
      complete(u);
      u.ready = 0;
    }
    first_micro = false;
    if (completes)
      for (const Piece& piece : pieces) {
        const Unit& u = units[params[piece.param].unit];
        piece.value.mutable_grad() = alias(u.shard_grads, piece.at, piece.end - piece.begin);
      }
  }

  // --- a block's parameters (kParameters) ------------------------------------

  // Allocates a block's flat buffer and starts its all-gather; returns at
  // once (the collective runs on the backend's own stream or thread).
  // `counted`: a gather of the training step's (gather_stats), not a
  // checkpoint's or fit end's.
  void start_gather(Unit& u, bool counted = true) {
    if (u.gathered || u.gathering) return;
    torch::Tensor& out = u.live();
    // The caching allocator allocates on the current device: the buffer's own.
    const c10::OptionalDeviceGuard on_device(out.device());
    const c10::Storage& storage = out.storage();
    const size_t bytes = static_cast<size_t>(u.padded) * out.element_size();
    storage.set_data_ptr_noswap(storage.allocator()->allocate(bytes));
    storage.set_nbytes(bytes);
    // The float32 shard, cast to the compute dtype when the block computes in it (half the bytes sent).
    torch::Tensor& in = out.scalar_type() == u.shard_params.scalar_type()
                            ? u.shard_params
                            : (u.sending = u.shard_params.to(out.scalar_type()));
    // Writes without bumping versions: autograd's saved views stay valid.
    u.gather = group.start_all_gather(out, in);
    u.gathering = true;
    if (!counted) return;
    ++gather_stats.gathers;
    gather_stats.bytes += static_cast<int64_t>(bytes);
    int64_t held = 0;
    for (const Unit& v : units) held += (v.block >= 0 && (v.gathered || v.gathering)) ? 1 : 0;
    gather_stats.most_gathered = std::max(gather_stats.most_gathered, held);
  }

  // The block's parameters, whole, for use now: waits for its gather
  // (started here when no prefetch started it).
  void gather_params(Unit& u, bool counted = true) {
    if (u.gathered) return;
    if (u.prefetched) ++gather_stats.prefetched;
    u.prefetched = false;
    start_gather(u, counted);
    u.gather.wait();
    u.sending = torch::Tensor();
    u.gathering = false;
    u.gathered = true;
  }

  // Frees a buffer's memory; the tensor and the views into it stay (sizes, strides, storage object).
  static void release(const torch::Tensor& buffer) {
    const c10::Storage& storage = buffer.storage();
    storage.set_data_ptr_noswap(at::DataPtr(nullptr, buffer.device()));
    storage.set_nbytes(0);
  }

  void free_params(Unit& u) {
    if (u.gathering) {  // a prefetch nobody used: the collective must finish writing first
      u.gather.wait();
      u.sending = torch::Tensor();
      u.gathering = false;
      u.gathered = true;
      u.prefetched = false;
    }
    if (!u.gathered) return;
    release(u.live());
    u.gathered = false;
  }

  // A freed block's parameters view `full` (float32; whole) or `compute`.
  // Changing a parameter's dtype makes autograd drop its gradient
  // accumulator (set_data), so the caller installs the gradient hooks again.
  void point_params(Unit& u, bool whole) {
    torch::NoGradGuard no_grad;
    u.whole = whole;
    for (size_t k : u.params) params[k].tensor.set_data(whole ? params[k].full_view : params[k].compute_view);
  }

  // Every block's parameters whole, in float32 (a checkpoint's or fit's end),
  // or (false) back to what the blocks compute with, freed.
  void make_blocks_whole(bool whole) {
    bool repointed = false;
    for (Unit& u : units) {
      if (u.block < 0) continue;
      if (u.compute.defined() && u.whole != whole) {
        free_params(u);
        point_params(u, whole);
        repointed = true;
      }
      if (whole)
        gather_params(u, /*counted=*/false);
      else
        free_params(u);
    }
    if (repointed && !whole) {
      remove_grad_hooks();
      install_grad_hooks();
    }
  }

  // Starts the gather of the next block with parameters from `index` in
  // direction `step` (+1: the forward's next block, -1: the backward's), so
  // that it overlaps block `index`'s compute. Every rank runs the same blocks
  // in the same order, so the collectives start in the same order everywhere.
  void prefetch(int64_t index, int64_t step) {
    if (!options.prefetch()) return;
    for (int64_t j = index + step; j >= 0 && j < static_cast<int64_t>(unit_of_block.size()); j += step)
      if (unit_of_block[j] >= 0) {
        Unit& next = units[unit_of_block[j]];
        if (!next.gathered && !next.gathering) {
          start_gather(next);
          next.prefetched = true;
        }
        return;
      }
  }

  // Gathers block `index`'s unit for use with the next one's gather in flight.
  void gather_with_prefetch(int64_t index, int64_t step) {
    const int64_t u = unit_of_block[index];
    if (u < 0) return;
    start_gather(units[u]);
    prefetch(index, step);
    gather_params(units[u]);
  }

  void before_block(int64_t index, torch::nn::Module&) override { gather_with_prefetch(index, +1); }

  void after_block(int64_t index, torch::nn::Module&, const torch::Tensor& output) override {
    const int64_t u = unit_of_block[index];
    if (u < 0) return;
    if (output.requires_grad()) {
      std::weak_ptr<Impl> weak = weak_from_this();
      // Fires when the gradient reaches the block's output: just before its
      // backward, and before this block's reduce-scatter is queued.
      output.register_hook([weak, index](const torch::Tensor&) {
        if (auto self = weak.lock()) self->gather_with_prefetch(index, -1);
      });
    }
    free_params(units[u]);
  }

  // After the optimizer stepped the shards: every rank's whole parameters again.
  void gather_stepped_params() {
    std::vector<torch::Tensor> sent;
    std::vector<ProcessGroup::Pending> pending;
    for (Unit& u : units) {
      if (u.block >= 0) continue;              // gathered just before they are used
      sent.push_back(u.shard_params.clone());  // (input and output must not alias)
      pending.push_back(group.start_all_gather(u.full, sent.back()));
    }
    for (auto& p : pending) p.wait();
  }
};

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<ProcessGroup> group, ShardingOptions options)
    : group_(std::move(group)), options_(options) {
  EMBER_CHECK(group_ != nullptr, "[dist::ShardedDataParallel] no process group");
  EMBER_CHECK_KIND(
      kConfig, options_.stage() != Sharding::kNone,
      "[dist::ShardedDataParallel] dist.sharding=none is plain DDP: use dist::DistributedDataParallel");
  EMBER_CHECK_KIND(kConfig, options_.bucket_cap_mb() > 0,
                   "[dist::ShardedDataParallel] dist.bucket_cap_mb must be > 0, got {}",
                   options_.bucket_cap_mb());
}

ShardedDataParallel::~ShardedDataParallel() {
  if (impl_) impl_->remove_grad_hooks();
}

void ShardedDataParallel::on_fit_start(train::Trainer& trainer) {
  const train::Distribution& d = *trainer.options().distribution();
  EMBER_CHECK(d.world_size() == group_->size() && d.rank() == group_->rank(),
              "[dist::ShardedDataParallel] the Trainer's distribution is {} process(es), rank {}, but the "
              "group has {}, rank {}: give the Trainer "
              "TrainerOptions().distribution(dist::make_distribution(group))",
              d.world_size(), d.rank(), group_->size(), group_->rank());
  const std::string stage = to_string(options_.stage());
  EMBER_CHECK_KIND(kConfig, !trainer.options().cuda_graph(),
                   "[dist::ShardedDataParallel] dist.sharding={} with trainer.cuda_graph=true: the sharded "
                   "step's collectives and hooks cannot be captured; set trainer.cuda_graph=false",
                   stage);
  torch::optim::Optimizer& optimizer = *trainer.optimizer();
  EMBER_CHECK_KIND(kConfig, elementwise_optimizer(optimizer),
                   "[dist::ShardedDataParallel] dist.sharding={} needs an optimizer whose state is "
                   "elementwise (SGD, Adam, AdamW, RMSprop, Adagrad) to split it across ranks",
                   stage);
  torch::nn::Module& model = *trainer.task()->model();
  impl_.reset();
  impl_ = std::make_shared<Impl>(*group_, options_);
  {
    std::vector<torch::Tensor> ps;
    for (const auto& [name, p] : optim::trainable_named_parameters(model)) ps.push_back(p);
    c10d::verify_params_across_processes(group_->c10d(), ps, std::nullopt);  // same architecture everywhere
  }
  group_->broadcast_module_state(model, /*parameters=*/true);  // rank 0's weights
  const auto trainable = optim::trainable_named_parameters(model);
  const bool on_cuda = !trainable.empty() && trainable.front().second.is_cuda();
  if (options_.stage() == Sharding::kParameters && options_.gather_in_compute_dtype().value_or(on_cuda))
    impl_->compute_dtype = amp::autocast_dtype(trainer.options().precision());
  impl_->plan_units(model);
  impl_->lay_out();
  impl_->shard_optimizer(optimizer);
  impl_->install_grad_hooks();
  if (impl_->block_model) impl_->block_model->set_block_hooks(impl_);
}

void ShardedDataParallel::on_epoch_start(train::Trainer& trainer, int64_t) {
  // A callback registered before this one (pruning) must not have resized a
  // parameter: its data lives in this rank's units.
  for (const Impl::Param& p : impl_->params) {
    const torch::Tensor& t = p.tensor;
    Impl::Unit& u = impl_->units[p.unit];
    EMBER_CHECK_KIND(
        kConfig,
        t.defined() && t.is_alias_of(u.live()) && t.storage_offset() == u.live().storage_offset() + p.offset,
        "[dist::ShardedDataParallel] parameter {} was replaced or resized during fit (pruning?): "
        "sharding holds it in shards across ranks; prune with dist.sharding=none",
        p.name);
  }
  (void)trainer;
}

void ShardedDataParallel::on_before_forward(train::Trainer& trainer, const train::MicroBatch& micro) {
  if (micro.index == 0) {
    group_->set_progress(trainer.global_step() + 1);
    impl_->first_micro = true;
  }
  if (options_.broadcast_buffers() && impl_->buffers_need_sync) {
    group_->broadcast_module_state(*trainer.task()->model(), /*parameters=*/false);
    impl_->buffers_need_sync = false;
  }
}

void ShardedDataParallel::on_before_backward(train::Trainer&, const train::StepOutput&,
                                             const train::MicroBatch& micro) {
  impl_->armed = true;
  impl_->completes = micro.completes_step();
  impl_->next_launch = 0;
  if (micro.completes_step()) impl_->buffers_need_sync = true;
}

torch::Tensor ShardedDataParallel::clip_grad_norm(double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& u : impl_->units) grads.push_back(u.shard_grads);
  // The squares summed over this rank's shards (padding is zero), then over ranks; in float64 when
  // a unit's gradients are (optim::clip_grad_norm_ keeps each dtype's precision), float32 otherwise.
  const bool any_double = std::any_of(
      grads.begin(), grads.end(), [](const torch::Tensor& g) { return g.scalar_type() == torch::kFloat64; });
  const torch::ScalarType dtype = any_double ? torch::kFloat64 : torch::kFloat32;
  torch::Tensor sq = torch::zeros({1}, torch::TensorOptions().dtype(dtype).device(group_->device()));
  for (const torch::Tensor& n : at::_foreach_norm(grads, 2.0)) sq += n.to(dtype).square();
  group_->all_reduce_sum_(sq);
  const torch::Tensor total = sq.sqrt().reshape({});
  // As optim::clip_grad_norm_ (and PyTorch): g *= min(1, max_norm / (total + 1e-6)).
  const torch::Tensor coef = ((total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

void ShardedDataParallel::agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  // fp16-mixed: a rank that saw inf/NaN in its shard makes every rank skip.
  for (auto& [device, flag] : scaler.found_inf_per_device(optimizer)) {
    torch::Tensor f = flag;
    group_->all_reduce_max_(f);
  }
}

void ShardedDataParallel::after_step() {
  impl_->gather_stepped_params();
}

void ShardedDataParallel::on_epoch_end(train::Trainer& trainer, int64_t, const train::EvalResult&) {
  if (options_.broadcast_buffers())
    group_->broadcast_module_state(*trainer.task()->model(), /*parameters=*/false);
}

void ShardedDataParallel::on_checkpoint_gather(train::Trainer& trainer) {
  impl_->make_blocks_whole(true);  // float32, from the shards (not the compute dtype's copies)
  Impl::Whole whole = impl_->gather_whole_state();
  if (trainer.options().distribution()->is_writer()) impl_->set_aside = impl_->swap_in(std::move(whole));
}

void ShardedDataParallel::on_checkpoint_written(train::Trainer&) {
  if (impl_->set_aside) {
    impl_->swap_in(std::move(*impl_->set_aside));
    impl_->set_aside.reset();
  }
  impl_->make_blocks_whole(false);
}

void ShardedDataParallel::on_fit_end(train::Trainer&) {
  if (!impl_) return;
  last_step_bytes_ = resident_bytes();  // (the blocks are freed after each step: what a step leaves)
  impl_->remove_grad_hooks();
  if (impl_->block_model) impl_->block_model->set_block_hooks(nullptr);
  impl_->make_blocks_whole(true);
  impl_->swap_in(impl_->gather_whole_state());
  impl_->pieces.clear();
}

GatherStats ShardedDataParallel::gather_stats() const {
  return impl_ ? impl_->gather_stats : GatherStats();
}

ShardedBytes ShardedDataParallel::resident_bytes() const {
  ShardedBytes b;
  if (!impl_) return b;
  for (auto& u : impl_->units) {
    const int64_t el = u.full.element_size();
    b.parameters +=
        u.block >= 0 ? u.shard * el + (u.gathered ? u.padded * u.live().element_size() : 0) : u.padded * el;
    b.gradients += u.shard * el;
  }
  if (impl_->optimizer) b.optimizer_state = optim::optimizer_state_bytes(*impl_->optimizer);
  return b;
}

}  // namespace ember::dist
