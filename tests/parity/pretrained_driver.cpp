// Driver of tests/parity/pretrained_parity.py: a model built by Ember, its
// weights loaded from a checkpoint PyTorch saved (train::load_pretrained),
// run in eval mode on the input tensor "x" of a safetensors file; writes the
// output as "y", and with --export the model's tensors under their names.
//
//   ember_pretrained_driver --model resnet18|resnet34|resnet50|resnet101 --weights PATH
//       --input X.safetensors --out Y.safetensors [--export E.safetensors] [--num-classes N]
//       [--reinit PREFIX] [--lenient]
//
// Exit 0 with the load report's counts on stdout; exit 1 with the error on
// stderr (strict loading refused).
#include <ember/ember.h>

#include <iostream>

using namespace ember;

int main(int argc, char** argv) {
  std::string model_name, weights, input, out, export_path, reinit;
  int64_t num_classes = 1000;
  bool strict = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--model" && has) {
      model_name = argv[++i];
    } else if (a == "--weights" && has) {
      weights = argv[++i];
    } else if (a == "--input" && has) {
      input = argv[++i];
    } else if (a == "--out" && has) {
      out = argv[++i];
    } else if (a == "--export" && has) {
      export_path = argv[++i];
    } else if (a == "--num-classes" && has) {
      num_classes = std::stoll(argv[++i]);
    } else if (a == "--reinit" && has) {
      reinit = argv[++i];
    } else if (a == "--lenient") {
      strict = false;
    } else {
      std::cerr
          << "usage: ember_pretrained_driver --model NAME --weights PATH --input X --out Y [--export E] "
             "[--num-classes N] [--reinit PREFIX] [--lenient]\n";
      return 2;
    }
  }
  try {
    torch::set_num_threads(1);
    if (model_name.rfind("resnet", 0) != 0) throw Error("unknown model " + model_name);
    models::ResNet model(
        models::ResNetOptions().depth(std::stoll(model_name.substr(6))).num_classes(num_classes));
    train::PretrainedOptions o;
    o.strict(strict);
    if (!reinit.empty()) o.reinit({reinit});
    const train::LoadReport r = train::load_pretrained(*model, weights, o);
    std::cout << "loaded " << r.loaded.size() << " reinitialised " << r.reinitialised.size() << " missing "
              << r.missing.size() << " unexpected " << r.unexpected.size() << " mismatched "
              << r.mismatched.size() << " files " << r.files.size() << "\n";
    model->eval();
    torch::NoGradGuard no_grad;
    const train::NamedTensors x = train::load_safetensors(input);
    if (x.size() != 1 || x[0].first != "x") throw Error(input + ": expected one tensor named x");
    train::save_safetensors(out, {{"y", model->forward(x[0].second)}});
    if (!export_path.empty()) train::save_safetensors(export_path, *model);
  } catch (const std::exception& e) {
    std::cerr << "ember_pretrained_driver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
