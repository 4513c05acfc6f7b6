// Pipeline parallelism: the runtime that executes a PipelinePlan over the
// group's point-to-point sends and receives (see pipeline.h).
//
// Messages. A forward message is two: the activation's shape and dtype
// (int64 [kHeader]: dtype, ndim, sizes) under tag 2t, then its values under
// tag 2t + 1, where t = message_tag(plan, action) is shared by the SEND and
// its RECV; a gradient message is its values under tag 2t + 1 (the receiver
// knows the shape: that of its own output). Tied gradients use tags from
// 4 S m up, one per (tied parameter, sender). Every send is posted
// asynchronously (the plans are validated for async sends) and waited for:
// a forward send at that microbatch's backward (its gradient has come back,
// so the receiver has long had it), the others at the end of the step.
#include "ember/dist/pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/check.h"
#include "dist/dropout_key.h"
#include "ember/core/activation_checkpoint.h"
#include "ember/dist/parallel_layout.h"
#include "ember/optim/optimizer.h"

namespace ember::dist {

namespace {

constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeader = 2 + kMaxDims;  // dtype, ndim, sizes

torch::Tensor shape_header(const torch::Tensor& t) {
  EMBER_CHECK(t.dim() <= kMaxDims,
              "[dist::PipelineRunner] an activation of {} dimensions (at most {} are sent)", t.dim(),
              kMaxDims);
  torch::Tensor h = torch::zeros({kHeader}, torch::kInt64);
  auto a = h.accessor<int64_t, 1>();
  a[0] = static_cast<int64_t>(t.scalar_type());
  a[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) a[2 + d] = t.size(d);
  return h;
}

torch::Tensor from_header(const torch::Tensor& h, const torch::Device& device) {
  auto a = h.accessor<int64_t, 1>();
  std::vector<int64_t> sizes(static_cast<size_t>(a[1]));
  for (int64_t d = 0; d < a[1]; ++d) sizes[static_cast<size_t>(d)] = a[2 + d];
  return torch::empty(sizes, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(a[0])).device(device));
}

using Key = std::pair<int, int>;  // (stage, microbatch)

torch::Tensor take(std::map<Key, torch::Tensor>& box, const Key& k, const char* what) {
  auto it = box.find(k);
  EMBER_CHECK(it != box.end(), "[dist::PipelineRunner] internal: no {} for stage {} microbatch {}", what,
              k.first, k.second);
  torch::Tensor t = std::move(it->second);
  box.erase(it);
  return t;
}

}  // namespace

PipelineRunner::PipelineRunner(std::shared_ptr<ProcessGroup> group, std::vector<core::PipelinePiece> pieces,
                               const PipelineOptions& options)
    : group_(std::move(group)),
      pieces_(std::move(pieces)),
      tied_in_step_(options.tied_gradients_in_step()),
      dropout_seed_(options.dropout_seed()),
      checkpoint_pieces_(options.checkpoint_pieces()) {
  EMBER_CHECK(group_ != nullptr, "[dist::PipelineRunner] needs a process group (one rank per stage group)");
  EMBER_CHECK_KIND(kConfig, !pieces_.empty(), "[dist::PipelineRunner] the model has no pieces to pipeline");
  PipelinePlanOptions po(options.schedule(), static_cast<int>(group_->size()),
                         static_cast<int>(options.microbatches()));
  if (options.stages_per_rank() > 0) po.stages_per_rank(static_cast<int>(options.stages_per_rank()));
  const int stages = static_cast<int>(group_->size()) * po.stages_per_rank();
  EMBER_CHECK_KIND(
      kConfig, static_cast<int>(pieces_.size()) >= stages,
      "[dist::PipelineRunner] {} stages ({} ranks x {} per rank) need at least {} pieces, the model "
      "has {} (embedding, blocks, head): use fewer ranks or stages per rank",
      stages, group_->size(), po.stages_per_rank(), stages, pieces_.size());
  plan_ = make_pipeline_plan(po);  // refuses too few microbatches, with the reason
  validate_pipeline_plan(plan_);
  if (options.split().empty()) {
    std::vector<double> costs;
    for (const auto& p : pieces_) costs.push_back(p.cost);
    split_ = balance_stages(costs, stages);
  } else {
    split_ = options.split();
    EMBER_CHECK_KIND(kConfig, static_cast<int>(split_.size()) == stages,
                     "[dist::PipelineRunner] the split has {} stages, the plan {}", split_.size(), stages);
  }
  check_stage_split(split_, static_cast<int>(pieces_.size()));

  // Which ranks read each parameter (by tensor identity, in piece order).
  const int64_t rank = group_->rank();
  std::vector<const torch::TensorImpl*> order;
  std::unordered_map<const torch::TensorImpl*, std::pair<std::string, torch::Tensor>> named;
  std::unordered_map<const torch::TensorImpl*, std::vector<int64_t>> readers;
  for (int s = 0; s < stages; ++s)
    for (int i = split_[s].first; i < split_[s].second; ++i)
      for (const auto& [name, t] : pieces_[i].parameters) {
        const torch::TensorImpl* key = t.unsafeGetTensorImpl();
        if (!named.count(key)) {
          order.push_back(key);
          named.emplace(key, std::make_pair(name, t));
        }
        std::vector<int64_t>& r = readers[key];
        const int64_t owner = plan_.rank_of_stage(s);
        if (std::find(r.begin(), r.end(), owner) == r.end()) r.push_back(owner);
      }
  for (const torch::TensorImpl* key : order) {
    std::vector<int64_t> r = readers[key];
    std::sort(r.begin(), r.end());
    if (std::find(r.begin(), r.end(), rank) == r.end()) continue;
    local_parameters_.push_back(named[key]);
    counts_in_norm_.push_back(r.front() == rank);  // a tied parameter counts once, at its lowest rank
    if (r.size() > 1) tied_.push_back({named[key].second, r});
  }
  for (const torch::TensorImpl* key : order) {
    const std::vector<int64_t>& r = readers[key];
    const torch::Tensor& t = named[key].second;
    whole_.push_back({t, t.sizes().vec(), *std::min_element(r.begin(), r.end()),
                      std::find(r.begin(), r.end(), rank) != r.end()});
  }
  if (options.release_other_stages()) cut(nullptr);
}

void PipelineRunner::cut(torch::optim::Optimizer* optimizer) {
  if (released_) return;
  if (optimizer) optim::settle_state(*optimizer);
  torch::NoGradGuard no_grad;
  for (Whole& w : whole_) {
    if (w.here) continue;
    if (optimizer) optimizer->state().erase(w.tensor.unsafeGetTensorImpl());
    w.tensor.set_data(torch::empty({0}, w.tensor.options()));  // the model object's tensor, emptied in place
    w.tensor.mutable_grad() = torch::Tensor();
  }
  released_ = true;
}

void PipelineRunner::make_whole(torch::optim::Optimizer* optimizer) {
  if (!released_) return;
  std::unique_ptr<torch::optim::OptimizerParamState> like;  // this rank's kind of state, if it has any yet
  if (optimizer) {
    optim::settle_state(*optimizer);
    for (const auto& [name, t] : local_parameters_)
      if (auto it = optimizer->state().find(t.unsafeGetTensorImpl()); it != optimizer->state().end()) {
        like = it->second->clone();
        break;
      }
  }
  torch::NoGradGuard no_grad;
  const int64_t rank = group_->rank();
  for (Whole& w : whole_) {
    torch::Tensor p = w.tensor;
    if (!w.here) p.set_data(torch::empty(w.shape, p.options()));
    torch::Tensor data = p.detach();
    group_->broadcast_(data, w.owner);
    if (!optimizer) continue;
    // Whether the owner has state for it (a frozen parameter has none): its word, so that every rank
    // makes the same broadcasts.
    auto& states = optimizer->state();
    auto it = states.find(p.unsafeGetTensorImpl());
    torch::Tensor has = torch::full({1}, w.owner == rank && it != states.end() ? 1.0 : 0.0,
                                    torch::TensorOptions(torch::kFloat32).device(group_->device()));
    group_->broadcast_(has, w.owner);
    if (has.item<float>() == 0) {
      if (it != states.end() && !w.here) states.erase(it);
      continue;
    }
    const bool made = it == states.end();  // made here like this rank's own, then the owner's tensors
    if (made) {
      EMBER_CHECK(like != nullptr,
                  "[dist::PipelineRunner] rank {} holds no optimizer state of its own to make the state of "
                  "another stage's parameter from (are all its parameters frozen?)",
                  rank);
      states[p.unsafeGetTensorImpl()] = like->clone();
    }
    optim::for_each_state_tensor_of(*optimizer, p, [&](torch::Tensor& t) {
      if (!t.defined()) return;
      if (made || !w.here) t = torch::empty(w.shape, t.options());  // never write into `like`'s tensors
      group_->broadcast_(t, w.owner);
    });
  }
  released_ = false;
}

std::vector<int> PipelineRunner::local_stages() const {
  std::vector<int> out;
  for (int s = 0; s < plan_.stages; ++s)
    if (plan_.rank_of_stage(s) == group_->rank()) out.push_back(s);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> PipelineRunner::named_parameters() const {
  return local_parameters_;
}

std::vector<torch::Tensor> PipelineRunner::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : local_parameters_) out.push_back(p.second);
  return out;
}

namespace {

/// Held while a piece runs under its own seed: the default generators are
/// the process's (ranks as threads of one process take turns).
std::mutex& keyed_rng_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

torch::Tensor PipelineRunner::run_piece(int piece, int microbatch, const torch::Tensor& x) {
  const core::PipelinePiece& p = pieces_[static_cast<size_t>(piece)];
  core::TensorFn forward = p.forward;
  if (dropout_seed_) {
    const uint64_t key = detail::dropout_key(*dropout_seed_, static_cast<uint64_t>(steps_),
                                             static_cast<uint64_t>(microbatch), static_cast<uint64_t>(piece));
    forward = [inner = std::move(forward), key](const torch::Tensor& in) {
      std::lock_guard<std::mutex> lock(keyed_rng_mutex());
      std::vector<at::Generator> gens = {at::detail::getDefaultCPUGenerator()};
      // The piece computes where its input is (the first piece's tokens are on the model's device).
      if (in.is_cuda()) gens.push_back(at::globalContext().defaultGenerator(in.device()));
      std::vector<at::Tensor> saved;
      for (auto& g : gens) {
        std::lock_guard<std::mutex> g_lock(g.mutex());
        saved.push_back(g.get_state());
        g.set_current_seed(key);
      }
      // Put back even when the forward throws.
      struct Restore {
        std::vector<at::Generator>& gens;
        std::vector<at::Tensor>& saved;
        ~Restore() {
          for (size_t i = 0; i < gens.size(); ++i) {
            std::lock_guard<std::mutex> g_lock(gens[i].mutex());
            gens[i].set_state(saved[i]);
          }
        }
      } restore{gens, saved};
      return inner(in);
    };
  }
  if (!checkpoint_pieces_) return forward(x);
  core::Recomputed fn;
  fn.forward = std::move(forward);
  for (const auto& named : p.parameters) fn.params.push_back(named.second);
  fn.options.name("pipeline piece " + p.name);
  // Keyed: the recompute seeds its own generators as the forward did, so the
  // checkpoint need not capture and restore them (which, outside the key's
  // lock, would race with ranks that are threads of one process).
  fn.options.preserve_rng_state(!dropout_seed_);
  return core::checkpoint(std::move(fn), x);
}

torch::Tensor PipelineRunner::step(const torch::Tensor& input, const torch::Tensor& target,
                                   const PipelineLoss& loss_fn, const torch::Tensor& loss_scale) {
  const int m = plan_.microbatches, S = plan_.stages;
  const int64_t rank = group_->rank();
  EMBER_CHECK_KIND(kConfig, input.dim() >= 1 && target.dim() >= 1 && target.size(0) == input.size(0),
                   "[dist::PipelineRunner] a batch of {} samples with {} targets",
                   input.dim() >= 1 ? input.size(0) : 0, target.dim() >= 1 ? target.size(0) : 0);
  const auto step_start = std::chrono::steady_clock::now();
  // m microbatches whose sizes differ by one at most (an epoch's short last
  // batch; some may be empty); each microbatch's mean loss weighs its share
  // of the batch, n_i / N, which is 1 / m when m divides N (computed as / m:
  // what one process accumulating the m microbatches computes).
  const int64_t N = input.size(0);
  const bool even = N % m == 0;
  const std::vector<torch::Tensor> xs = input.tensor_split(m), ys = target.tensor_split(m);
  stats_ = PipelineStepStats{};
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  stats_.peak_live_microbatches.assign(static_cast<size_t>(S), -1);
  for (const int s : local_stages()) stats_.peak_live_microbatches[static_cast<size_t>(s)] = 0;
  std::vector<int> live_count(static_cast<size_t>(S), 0);

  struct Slot {
    torch::Tensor in, out, loss;
  };
  std::map<Key, Slot> live;
  std::map<Key, torch::Tensor> activations, gradients, outgoing;  // received / passed in memory / to send
  // A send and the tensor it reads, released together: an activation's memory
  // goes when its forward send is dropped at that microbatch's backward.
  struct Sent {
    torch::Tensor buffer;
    ProcessGroup::Pending pending;
  };
  std::map<Key, std::vector<Sent>> forward_sends;
  std::vector<Sent> other_sends;
  // On the group's device, added to there: no host sync per microbatch.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(group_->device()));

  const auto send = [&](torch::Tensor t, int64_t dst, int64_t tag) {
    stats_.messages_sent += 1;
    stats_.bytes_sent += t.numel() * static_cast<int64_t>(t.element_size());
    Sent sent{std::move(t), {}};
    sent.pending = group_->start_send(sent.buffer, dst, tag);
    return sent;
  };
  for (const Action& a : plan_.actions[static_cast<size_t>(rank)]) {
    const Key k{a.stage, a.microbatch};
    const int s = a.stage;
    switch (a.kind) {
      case ActionKind::kRecvForward: {
        const int64_t t = message_tag(plan_, a), src = plan_.rank_of_stage(s - 1);
        // The shape travels on the group's device (NCCL sends CUDA tensors only).
        torch::Tensor header =
            torch::empty({kHeader}, torch::TensorOptions(torch::kInt64).device(group_->device()));
        group_->start_recv(header, src, 2 * t).wait();
        torch::Tensor x = from_header(header.cpu(), group_->device());
        group_->start_recv(x, src, 2 * t + 1).wait();
        activations[k] = x;
        break;
      }
      case ActionKind::kForward: {
        const auto compute_start = std::chrono::steady_clock::now();
        torch::Tensor x = s == 0 ? xs[static_cast<size_t>(a.microbatch)] : take(activations, k, "activation");
        if (s > 0 && x.is_floating_point()) x = x.detach().requires_grad_(true);
        torch::Tensor y = x;
        for (int i = split_[s].first; i < split_[s].second; ++i) y = run_piece(i, a.microbatch, y);
        Slot slot{x, y, {}};
        if (s == S - 1) {
          const torch::Tensor& target_i = ys[static_cast<size_t>(a.microbatch)];
          const int64_t n = target_i.size(0);
          if (n == 0) {  // an empty microbatch: no loss, zero gradients through the stages
            slot.loss = y.sum() * 0.0;
          } else {
            const torch::Tensor l = loss_fn(y, target_i);
            slot.loss = even ? l / m : l * (static_cast<double>(n) / static_cast<double>(N));
            const torch::Tensor ld = l.detach().to(loss_sum.options());
            loss_sum += even ? ld : ld * (static_cast<double>(n * m) / static_cast<double>(N));
          }
        } else if (plan_.rank_of_stage(s + 1) == rank) {
          activations[{s + 1, a.microbatch}] = y.detach();  // the next stage is here: passed in memory
        }
        live[k] = std::move(slot);
        int& n = live_count[static_cast<size_t>(s)];
        ++n;
        int& peak = stats_.peak_live_microbatches[static_cast<size_t>(s)];
        peak = std::max(peak, n);
        stats_.compute_seconds += seconds_since(compute_start);
        break;
      }
      case ActionKind::kSendForward: {
        const int64_t t = message_tag(plan_, a), dst = plan_.rank_of_stage(s + 1);
        const torch::Tensor y = live.at(k).out.detach().contiguous();
        std::vector<Sent>& pending = forward_sends[k];
        pending.push_back(send(shape_header(y).to(group_->device()), dst, 2 * t));
        pending.push_back(send(y, dst, 2 * t + 1));
        break;
      }
      case ActionKind::kRecvBackward: {
        const int64_t t = message_tag(plan_, a), src = plan_.rank_of_stage(s + 1);
        torch::Tensor g = torch::empty_like(live.at(k).out, at::MemoryFormat::Contiguous);
        group_->start_recv(g, src, 2 * t + 1).wait();
        gradients[k] = g;
        break;
      }
      case ActionKind::kBackward: {
        auto it = live.find(k);
        EMBER_CHECK(it != live.end(), "[dist::PipelineRunner] internal: B before F at stage {} microbatch {}",
                    s, a.microbatch);
        const auto compute_start = std::chrono::steady_clock::now();
        Slot slot = std::move(it->second);
        live.erase(it);
        --live_count[static_cast<size_t>(s)];
        if (s == S - 1)
          (loss_scale.defined() ? slot.loss * loss_scale : slot.loss).backward();
        else
          slot.out.backward(take(gradients, k, "output gradient"));
        if (s > 0) {
          torch::Tensor g = slot.in.grad();
          EMBER_CHECK(g.defined(),
                      "[dist::PipelineRunner] stage {}'s input got no gradient: its pieces do not "
                      "use their input differentiably",
                      s);
          if (plan_.rank_of_stage(s - 1) == rank)
            gradients[{s - 1, a.microbatch}] = g;
          else
            outgoing[k] = g;
        }
        stats_.compute_seconds += seconds_since(compute_start);
        // The activation sent forward is free once its gradient is back.
        if (auto f = forward_sends.find(k); f != forward_sends.end()) {
          for (auto& sent : f->second) sent.pending.wait();
          forward_sends.erase(f);
        }
        break;
      }
      case ActionKind::kSendBackward: {
        const int64_t t = message_tag(plan_, a), dst = plan_.rank_of_stage(s - 1);
        other_sends.push_back(send(take(outgoing, k, "input gradient").contiguous(), dst, 2 * t + 1));
        break;
      }
    }
  }
  for (auto& [key, sends] : forward_sends)
    for (auto& sent : sends) sent.pending.wait();
  for (auto& sent : other_sends) sent.pending.wait();
  EMBER_CHECK(live.empty() && activations.empty() && gradients.empty() && outgoing.empty(),
              "[dist::PipelineRunner] internal: the plan left {} microbatches live", live.size());
  if (tied_in_step_) exchange_tied_gradients();
  // The batch's mean loss on every rank: the last stage's sum over microbatches / m.
  torch::Tensor mean = loss_sum / m;
  group_->all_reduce_sum_(mean);
  ++steps_;
  torch::Tensor out = mean.cpu();
  stats_.step_seconds = seconds_since(step_start);
  return out;
}

void PipelineRunner::finish_gradients() {
  if (!tied_in_step_) exchange_tied_gradients();
}

torch::Tensor PipelineRunner::evaluate(const torch::Tensor& input, const torch::Tensor& target,
                                       const PipelineLoss& loss_fn) {
  torch::NoGradGuard no_grad;
  const int S = plan_.stages;
  const int64_t rank = group_->rank();
  // Tags above every step's (4 S m, then the tied gradients' k p + rank with k below the model's
  // parameter count: the same bound on every rank, which tied_ is not): a pair per stage boundary.
  const int64_t base = 4 * static_cast<int64_t>(S) * plan_.microbatches +
                       static_cast<int64_t>(whole_.size() + 1) * group_->size();
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(group_->device()));
  torch::Tensor x;
  for (int s = 0; s < S; ++s) {
    if (plan_.rank_of_stage(s) != rank) continue;
    const int64_t tag = base + 2 * static_cast<int64_t>(s);
    if (s == 0) {
      x = input;
    } else if (const int64_t src = plan_.rank_of_stage(s - 1); src != rank) {
      torch::Tensor header =
          torch::empty({kHeader}, torch::TensorOptions(torch::kInt64).device(group_->device()));
      group_->start_recv(header, src, tag).wait();
      x = from_header(header.cpu(), group_->device());
      group_->start_recv(x, src, tag + 1).wait();
    }
    for (int i = split_[s].first; i < split_[s].second; ++i) x = pieces_[static_cast<size_t>(i)].forward(x);
    if (s == S - 1) {
      loss = loss_fn(x, target).to(loss.options());
    } else if (const int64_t dst = plan_.rank_of_stage(s + 1); dst != rank) {
      torch::Tensor header = shape_header(x).to(group_->device()), values = x.contiguous();
      auto a = group_->start_send(header, dst, tag + 2);
      auto b = group_->start_send(values, dst, tag + 3);
      a.wait();
      b.wait();
    }
  }
  group_->all_reduce_sum_(loss);  // the last stage's; zeros elsewhere
  return loss.cpu();
}

void PipelineRunner::exchange_tied_gradients() {
  const int64_t rank = group_->rank(), p = group_->size();
  const int64_t base = 4 * static_cast<int64_t>(plan_.stages) * plan_.microbatches;
  for (size_t k = 0; k < tied_.size(); ++k) {
    const Tied& tied = tied_[k];
    torch::Tensor mine = tied.parameter.grad();
    if (!mine.defined()) mine = torch::zeros_like(tied.parameter);
    mine = mine.contiguous();
    std::vector<ProcessGroup::Pending> sends;
    std::map<int64_t, torch::Tensor> got;
    const int64_t tag_of = base + static_cast<int64_t>(k) * p;  // + the sender's rank
    for (const int64_t r : tied.ranks)
      if (r != rank) {
        stats_.messages_sent += 1;
        stats_.bytes_sent += mine.numel() * static_cast<int64_t>(mine.element_size());
        sends.push_back(group_->start_send(mine, r, tag_of + rank));
      }
    for (const int64_t r : tied.ranks)
      if (r != rank) {
        got[r] = torch::empty_like(mine);
        group_->start_recv(got[r], r, tag_of + r).wait();
      }
    for (auto& s : sends) s.wait();
    // The same additions in the same order on every holder: equal sums.
    torch::Tensor sum;
    for (const int64_t r : tied.ranks) {
      const torch::Tensor& g = r == rank ? mine : got[r];
      sum = sum.defined() ? sum + g : g.clone();
    }
    torch::NoGradGuard no_grad;
    if (tied.parameter.grad().defined())
      tied.parameter.mutable_grad().copy_(sum);
    else
      tied.parameter.mutable_grad() = sum;
  }
}

void PipelineRunner::agree_found_inf(amp::GradScaler& scaler, const torch::optim::Optimizer& optimizer) {
  dist::agree_found_inf(scaler, optimizer, *group_);
}

double PipelineRunner::clip_grad_norm_(double max_norm) {
  // Squares of per-tensor norms, summed in float64: per rank, then over ranks.
  // On the group's device (NCCL reduces CUDA tensors only); one host read, at the end.
  torch::Tensor total = torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(group_->device()));
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < local_parameters_.size(); ++i) {
    const torch::Tensor& g = local_parameters_[i].second.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (counts_in_norm_[i]) total += g.norm().to(total.options()).square();
  }
  group_->all_reduce_sum_(total);
  const double norm = std::sqrt(total.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(coef);
  }
  return norm;
}

}  // namespace ember::dist
