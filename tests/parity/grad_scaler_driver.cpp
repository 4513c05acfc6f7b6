// Parity driver: runs Ember's GradScaler over a gradient sequence written by
// grad_scaler_parity.py and prints the trajectory as JSON, which the script
// compares with torch.amp.GradScaler run over the same sequence.
//
//   grad_scaler_driver SEQ.bin STEPS MICRO INIT_SCALE GROWTH BACKOFF INTERVAL CLIP [DEVICE [fused]]
//
// SEQ.bin: float32, the 26 initial weights, then STEPS x MICRO x 26 gradients
// (inf/NaN allowed). Parameters (fixed, mirrored in the script):
//   optimizer A = SGD(momentum 0.9): group 0 lr 0.05 {w0 [4,3], b0 [3]}, group 1 lr 0.02 {w1 [5]}
//   optimizer B = Adam(lr 0.01): {w2 [6]}
// Each micro-batch: loss = sum_p (p * G_p).sum(); scaler.scale(loss).backward().
// Each step: unscale_(A); clip A's gradients if CLIP > 0; step(A); step(B); update().
// DEVICE: cpu (default) or cuda; weights, gradients and the scale live there.
// fused: Ember's FusedSGD (Nesterov, weight decay 1e-4) and FusedAdamW
// (weight decay 1e-2) instead, stepped with GradScaler::step_async (skips
// decided on the device; the script compares with torch.optim.SGD/AdamW(fused=True)).
#include <ember/amp/grad_scaler.h>
#include <ember/optim/clip_grad.h>
#include <ember/optim/fused.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 9 || argc > 11 || (argc == 11 && std::string(argv[10]) != "fused")) {
    std::cerr
        << "usage: grad_scaler_driver SEQ.bin STEPS MICRO INIT_SCALE GROWTH BACKOFF INTERVAL CLIP [DEVICE "
           "[fused]]\n";
    return 2;
  }
  const torch::Device device(argc >= 10 ? argv[9] : "cpu");
  const bool fused = argc == 11;
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "grad_scaler_driver: no CUDA device\n";
    return 1;
  }
  const int64_t steps = std::stoll(argv[2]), micro = std::stoll(argv[3]);
  const auto options = ember::amp::GradScalerOptions()
                           .init_scale(std::stod(argv[4]))
                           .growth_factor(std::stod(argv[5]))
                           .backoff_factor(std::stod(argv[6]))
                           .growth_interval(std::stoll(argv[7]));
  const double clip = std::stod(argv[8]);

  const std::vector<std::vector<int64_t>> shapes = {{4, 3}, {3}, {5}, {6}};
  int64_t total = 0;
  for (const auto& s : shapes) total += c10::multiply_integers(s);
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<float> data((1 + steps * micro) * total);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!in) {
    std::cerr << "grad_scaler_driver: " << argv[1] << " is shorter than expected\n";
    return 1;
  }
  const auto block = [&](int64_t index) {  // the index-th block of `total` floats, split per parameter
    std::vector<torch::Tensor> out;
    int64_t offset = index * total;
    for (const auto& s : shapes) {
      const int64_t n = c10::multiply_integers(s);
      out.push_back(
          torch::from_blob(data.data() + offset, s, torch::kFloat32).to(device, false, /*copy=*/true));
      offset += n;
    }
    return out;
  };

  std::vector<torch::Tensor> params = block(0);
  for (auto& p : params) p.requires_grad_(true);
  using torch::optim::OptimizerParamGroup;
  const std::vector<OptimizerParamGroup> groups_a = {OptimizerParamGroup({params[0], params[1]}),
                                                     OptimizerParamGroup({params[2]})};
  const auto sgd_options = torch::optim::SGDOptions(0.05).momentum(0.9);
  const auto adam_options = torch::optim::AdamOptions(0.01);
  std::unique_ptr<torch::optim::Optimizer> a, b;
  if (fused) {
    a = std::make_unique<ember::optim::FusedSGD>(
        groups_a, torch::optim::SGDOptions(sgd_options).nesterov(true).weight_decay(1e-4));
    b = std::make_unique<ember::optim::FusedAdamW>(std::vector<torch::Tensor>{params[3]},
                                                   torch::optim::AdamWOptions(0.01).weight_decay(1e-2));
  } else {
    a = std::make_unique<torch::optim::SGD>(groups_a, sgd_options);
    b = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{params[3]}, adam_options);
  }
  torch::optim::Optimizer& opt_a = *a;
  torch::optim::Optimizer& opt_b = *b;
  static_cast<torch::optim::SGDOptions&>(opt_a.param_groups()[1].options()).lr(0.02);
  const std::vector<torch::Tensor> params_a = {params[0], params[1], params[2]};

  ember::amp::GradScaler scaler(options);
  std::vector<double> scales;
  std::vector<int64_t> trackers;
  std::vector<int> stepped_a, stepped_b;
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t m = 0; m < micro; ++m) {
      const std::vector<torch::Tensor> g = block(1 + t * micro + m);
      torch::Tensor loss = torch::zeros({}, device);
      for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * g[i]).sum();
      scaler.scale(loss).backward();
    }
    scaler.unscale_(opt_a);
    if (clip > 0) ember::optim::clip_grad_norm_(params_a, clip);
    if (fused) {  // no host read in the step: the flags are read afterwards, for the record
      const torch::Tensor flag_a = scaler.step_async(opt_a), flag_b = scaler.step_async(opt_b);
      stepped_a.push_back(flag_a.item<float>() == 0.0f ? 1 : 0);
      stepped_b.push_back(flag_b.item<float>() == 0.0f ? 1 : 0);
    } else {
      stepped_a.push_back(scaler.step(opt_a) ? 1 : 0);
      stepped_b.push_back(scaler.step(opt_b) ? 1 : 0);
    }
    scaler.update();
    scales.push_back(scaler.get_scale());
    trackers.push_back(scaler.growth_tracker());
    opt_a.zero_grad(true);
    opt_b.zero_grad(true);
  }
  std::vector<double> weights;
  for (const auto& p : params) {
    const torch::Tensor flat = p.detach().cpu().reshape(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) weights.push_back(static_cast<double>(flat[i].item<float>()));
  }
  // {} prints the shortest text that reads back as the same double.
  std::cout
      << fmt::format(
             R"({{"scale": [{}], "tracker": [{}], "stepped_a": [{}], "stepped_b": [{}], "weights": [{}]}})",
             fmt::join(scales, ", "), fmt::join(trackers, ", "), fmt::join(stepped_a, ", "),
             fmt::join(stepped_b, ", "), fmt::join(weights, ", "))
      << "\n";
  return 0;
}
