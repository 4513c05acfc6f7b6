// Writes a TensorBoard run for tensorboard_read.py to read back with
// TensorBoard's own reader: scalars (several tags, large steps, values from
// 1e-8 to 1e6, given and current wall times) and histograms (dtypes, NaN/inf,
// values beyond the bucket range). Beside the run it writes what was logged:
// expected.json, and each histogram's values as raw little-endian float64 in
// hist_<i>.f64 (the reader computes the expected histogram from them with
// torch.utils.tensorboard).
//
//   tensorboard_driver OUT_DIR     exit 77 when Ember has no TensorBoard support
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <vector>

#include "ember/monitor/tensorboard.h"

using ember::monitor::TensorBoardOptions;
using ember::monitor::TensorBoardWriter;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  std::ostringstream scalars, histograms;
  scalars << std::setprecision(17);
  {
    // Default buffering (10 s): the records reach the file at destruction.
    TensorBoardWriter writer(out + "/run", TensorBoardOptions().filename_suffix(".driver"));

    const auto scalar = [&](const std::string& tag, double value, int64_t step, double wall_time) {
      if (wall_time < 0) {
        writer.add_scalar(tag, value, step);
        scalars << (scalars.tellp() > 0 ? ",\n" : "") << "{\"tag\": \"" << tag << "\", \"step\": " << step
                << ", \"value\": " << value << ", \"wall_time\": null}";
      } else {
        writer.add_scalar(tag, value, step, wall_time);
        scalars << (scalars.tellp() > 0 ? ",\n" : "") << "{\"tag\": \"" << tag << "\", \"step\": " << step
                << ", \"value\": " << value << ", \"wall_time\": " << wall_time << "}";
      }
    };
    for (int64_t step = 0; step < 50; ++step) scalar("loss/train", 2.0 / (step + 1) + 1e-3 * step, step, -1);
    for (int64_t step = 0; step < 50; step += 10) scalar("loss/val", 2.5 / (step + 1), step, -1);
    const std::vector<double> extreme = {1e-8, 1e6, -1e6, 0.0, 1.0 / 3.0, -2.5e-8, 123456.789, 3e38};
    for (size_t i = 0; i < extreme.size(); ++i)
      scalar("values/extreme", extreme[i], static_cast<int64_t>(i),
             1700000000.0 + 0.25 * static_cast<double>(i));
    for (int64_t k = 0; k < 4; ++k) scalar("lr", 3e-4 * std::pow(0.5, k), k * 10'000'000'000LL, -1);

    int index = 0;
    const auto histogram = [&](const std::string& tag, const torch::Tensor& values, int64_t step) {
      writer.add_histogram(tag, values, step);
      const auto flat = values.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape({-1});
      const std::string file = "hist_" + std::to_string(index++) + ".f64";
      std::ofstream(out + "/" + file, std::ios::binary)
          .write(reinterpret_cast<const char*>(flat.data_ptr<double>()), flat.numel() * 8);
      histograms << (histograms.tellp() > 0 ? ",\n" : "") << "{\"tag\": \"" << tag << "\", \"step\": " << step
                 << ", \"file\": \"" << file << "\"}";
    };
    torch::manual_seed(0);
    for (int64_t step = 0; step < 3; ++step)
      histogram("weights/randn", torch::randn({5000}) * static_cast<double>(step + 1), step);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    histogram(
        "weights/mixed",
        torch::cat({torch::randn({500}), torch::tensor({nan, inf, -inf, 0.0f, 1e-13f, -1e-13f, 1e-30f})}), 0);
    histogram("weights/int32", torch::arange(-100, 100, torch::kInt32).reshape({20, 10}), 0);
    histogram("weights/bool", torch::tensor({true, false, true, true}), 0);
    histogram("weights/constant", torch::full({100}, 3.0), 0);
    histogram("weights/half", torch::randn({300}).to(torch::kHalf), 0);
    histogram("weights/wide", torch::tensor({-1e19, -5e-15, 1e-15, 0.5, 7e18, 1e21, -1e30}, torch::kDouble),
              0);
    histogram("weights/all_nan", torch::full({3}, nan), 0);
  }
  std::ofstream json(out + "/expected.json");
  json << "{\"pid\": " << ::getpid() << ",\n\"scalars\": [\n"
       << scalars.str() << "],\n\"histograms\": [\n"
       << histograms.str() << "]}\n";
  return json.good() ? 0 : 1;
}
