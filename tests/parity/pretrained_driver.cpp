// Driver of tests/parity/pretrained_parity.py: a model built by Ember, its
// weights loaded from a checkpoint PyTorch saved (train::load_pretrained),
// run in eval mode on the input tensor "x" of a safetensors file; writes the
// output as "y", and with --export the model's tensors under their names.
//
//   ember_pretrained_driver --model resnet18|resnet34|resnet50|resnet101 --weights PATH
//       --input X.safetensors --out Y.safetensors [--export E.safetensors] [--num-classes N]
//       [--reinit PREFIX] [--lenient] [--prune-channels RATIO --export-pytorch DIR]
//   ember_pretrained_driver --model gpt2|gpt2:LAYERS,HEADS,EMBD,VOCAB,POSITIONS --weights PATH
//       --input X.safetensors --out Y.safetensors [--prune-heads BLOCK:H,H;BLOCK:H] [--export-hf DIR]
//   ember_pretrained_driver --model vit_small_patch16_224|vit:DEPTH,HEADS,DIM,PATCH,IMG --weights PATH
//       --input X.safetensors --out Y.safetensors [--num-classes N] [--reinit head.] [--export E.safetensors]
//   ember_pretrained_driver --model bert:LAYERS,HEADS,HIDDEN,INTERMEDIATE,VOCAB,POSITIONS,LABELS --weights
//   PATH
//       --input X.safetensors --out Y.safetensors [--reinit classifier.] [--prune-heads SPEC] [--export-hf
//       DIR]
//
// --prune-channels removes that fraction of a ResNet's channels (prune::Pruner,
// L1, multiples of 8) after loading; --export-pytorch writes DIR for
// tools/pytorch/ember_pruned.py (train::save_for_pytorch, torchvision's builder).
//
// GPT-2 (models::Gpt2) reads Hugging Face's naming (Gpt2Impl::from_hf_name,
// its Conv1D weights transposed); x holds int64 tokens [B,T], y the logits.
// --prune-heads removes heads (prune::prune_heads) after loading and before
// the forward; --export-hf writes DIR/model.safetensors in Hugging Face's
// naming and DIR/config.json with the removed heads as pruned_heads.
//
// ViT (models::ViT) reads timm's naming as it is (ViTImpl::timm_map: a
// position table made for another image size is resampled); x holds images
// [B,C,H,W], y the logits.
//
// BERT (models::Bert) reads Hugging Face's naming (BertImpl::hf_map: old
// gamma/beta names, BertModel names, pre-training heads not read); the input
// file holds int64 token ids "x" [B,T] and optionally "mask" (1 = token) and
// "types" (token types), y the logits [B,labels]. --prune-heads and
// --export-hf as for GPT-2 (DIR/config.json from BertImpl::hf_config_json).
//
// Exit 0 with the load report's counts on stdout; exit 1 with the error on
// stderr (strict loading refused).
#include <ember/ember.h>

#include <iostream>
#include <sstream>

using namespace ember;

namespace {

// "gpt2" or "gpt2:LAYERS,HEADS,EMBD,VOCAB,POSITIONS".
models::Gpt2Options gpt2_options(const std::string& name) {
  if (name == "gpt2") return models::Gpt2Options::preset("gpt2");
  std::vector<int64_t> v;
  std::stringstream in(name.substr(5));
  for (std::string part; std::getline(in, part, ',');) v.push_back(std::stoll(part));
  if (v.size() != 5) throw Error("--model gpt2:LAYERS,HEADS,EMBD,VOCAB,POSITIONS, got " + name);
  return models::Gpt2Options().n_layer(v[0]).n_head(v[1]).n_embd(v[2]).vocab_size(v[3]).n_positions(v[4]);
}

// "vit_small_patch16_224" or "vit:DEPTH,HEADS,DIM,PATCH,IMG".
models::ViTOptions vit_options(const std::string& name, int64_t num_classes) {
  if (name.rfind("vit:", 0) != 0) return models::ViTOptions::preset(name).num_classes(num_classes);
  std::vector<int64_t> v;
  std::stringstream in(name.substr(4));
  for (std::string part; std::getline(in, part, ',');) v.push_back(std::stoll(part));
  if (v.size() != 5) throw Error("--model vit:DEPTH,HEADS,DIM,PATCH,IMG, got " + name);
  return models::ViTOptions()
      .depth(v[0])
      .num_heads(v[1])
      .embed_dim(v[2])
      .patch_size(v[3])
      .img_size(v[4])
      .num_classes(num_classes);
}

// "bert:LAYERS,HEADS,HIDDEN,INTERMEDIATE,VOCAB,POSITIONS,LABELS"; dropout as transformers' defaults.
models::BertOptions bert_options(const std::string& name) {
  std::vector<int64_t> v;
  std::stringstream in(name.substr(5));
  for (std::string part; std::getline(in, part, ',');) v.push_back(std::stoll(part));
  if (v.size() != 7)
    throw Error("--model bert:LAYERS,HEADS,HIDDEN,INTERMEDIATE,VOCAB,POSITIONS,LABELS, got " + name);
  return models::BertOptions()
      .num_hidden_layers(v[0])
      .num_attention_heads(v[1])
      .hidden_size(v[2])
      .intermediate_size(v[3])
      .vocab_size(v[4])
      .max_position_embeddings(v[5])
      .num_labels(v[6]);
}

// "0:1,3;2:0" with prefix "transformer.h." and suffix ".attn" ->
// {"transformer.h.0.attn": {1, 3}, "transformer.h.2.attn": {0}}
prune::HeadSelection head_selection(const std::string& spec, const std::string& prefix,
                                    const std::string& suffix = ".attn") {
  prune::HeadSelection out;
  std::stringstream in(spec);
  for (std::string layer; std::getline(in, layer, ';');) {
    const size_t colon = layer.find(':');
    if (colon == std::string::npos) throw Error("--prune-heads BLOCK:H,H;BLOCK:H, got " + spec);
    std::vector<int64_t>& heads = out[prefix + layer.substr(0, colon) + suffix];
    std::stringstream hs(layer.substr(colon + 1));
    for (std::string h; std::getline(hs, h, ',');) heads.push_back(std::stoll(h));
  }
  return out;
}

void print(const train::LoadReport& r) {
  std::cout << "loaded " << r.loaded.size() << " reinitialised " << r.reinitialised.size() << " missing "
            << r.missing.size() << " unexpected " << r.unexpected.size() << " mismatched "
            << r.mismatched.size() << " files " << r.files.size() << "\n";
}

torch::Tensor input_x(const std::string& input) {
  const train::NamedTensors x = train::load_safetensors(input);
  if (x.size() != 1 || x[0].first != "x") throw Error(input + ": expected one tensor named x");
  return x[0].second;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name, weights, input, out, export_path, reinit, prune_spec, export_hf, export_pytorch;
  double prune_ratio = 0;
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
    } else if (a == "--prune-heads" && has) {
      prune_spec = argv[++i];
    } else if (a == "--export-hf" && has) {
      export_hf = argv[++i];
    } else if (a == "--prune-channels" && has) {
      prune_ratio = std::stod(argv[++i]);
    } else if (a == "--export-pytorch" && has) {
      export_pytorch = argv[++i];
    } else if (a == "--lenient") {
      strict = false;
    } else {
      std::cerr
          << "usage: ember_pretrained_driver --model NAME --weights PATH --input X --out Y [--export E] "
             "[--num-classes N] [--reinit PREFIX] [--lenient] [--prune-heads SPEC] [--export-hf DIR] "
             "[--prune-channels RATIO] [--export-pytorch DIR]\n";
      return 2;
    }
  }
  try {
    torch::set_num_threads(1);
    train::PretrainedOptions o;
    o.strict(strict);
    if (!reinit.empty()) o.reinit({reinit});
    if (model_name.rfind("gpt2", 0) == 0) {
      models::Gpt2 model(gpt2_options(model_name));
      o.map(models::Gpt2Impl::hf_map());
      print(train::load_pretrained(*model, weights, o));
      prune::HeadSelection pruned;
      if (!prune_spec.empty())
        pruned =
            prune::removed_heads(prune::prune_heads(*model, head_selection(prune_spec, "transformer.h.")));
      model->eval();
      torch::NoGradGuard no_grad;
      train::save_safetensors(out, {{"y", model->forward(input_x(input))}});
      if (!export_hf.empty()) {
        core::make_dirs(export_hf);
        train::save_pretrained(export_hf + "/model.safetensors", *model, models::Gpt2Impl::hf_export_map());
        core::write_file_atomic(export_hf + "/config.json", model->hf_config_json(pruned));
      }
      return 0;
    }
    if (model_name.rfind("bert:", 0) == 0) {
      models::Bert model(bert_options(model_name));
      o.map(models::BertImpl::hf_map());
      print(train::load_pretrained(*model, weights, o));
      prune::HeadSelection pruned;
      if (!prune_spec.empty())
        pruned = prune::removed_heads(
            prune::prune_heads(*model, head_selection(prune_spec, "bert.encoder.layer.", ".attention")));
      model->eval();
      torch::NoGradGuard no_grad;
      torch::Tensor ids, mask, types;
      for (const auto& [name, t] : train::load_safetensors(input)) {
        if (name != "x" && name != "mask" && name != "types")
          throw Error(input + ": unexpected tensor " + name + " (x, mask, types)");
        (name == "x" ? ids : name == "mask" ? mask : types) = t;
      }
      train::save_safetensors(out, {{"y", model->forward(ids, mask, types)}});
      if (!export_hf.empty()) {
        core::make_dirs(export_hf);
        train::save_pretrained(export_hf + "/model.safetensors", *model);
        core::write_file_atomic(export_hf + "/config.json", model->hf_config_json(pruned));
      }
      return 0;
    }
    if (model_name.rfind("vit", 0) == 0) {
      models::ViT model(vit_options(model_name, num_classes));
      o.map(models::ViTImpl::timm_map());
      const train::LoadReport report = train::load_pretrained(*model, weights, o);
      print(report);
      for (const std::string& n : report.resized) std::cout << "resized " << n << "\n";
      if (!prune_spec.empty()) prune::prune_heads(*model, head_selection(prune_spec, "blocks."));
      model->eval();
      torch::NoGradGuard no_grad;
      train::save_safetensors(out, {{"y", model->forward(input_x(input))}});
      if (!export_path.empty()) train::save_safetensors(export_path, *model);
      return 0;
    }
    if (model_name.rfind("resnet", 0) != 0) throw Error("unknown model " + model_name);
    models::ResNet model(
        models::ResNetOptions().depth(std::stoll(model_name.substr(6))).num_classes(num_classes));
    print(train::load_pretrained(*model, weights, o));
    const torch::Tensor x = input_x(input);
    model->eval();
    if (prune_ratio > 0) {  // channels by L1 group importance, multiples of 8 (the residual stages as groups)
      prune::Pruner pruner(
          *model, [&] { return std::vector<torch::Tensor>{model->forward(x)}; },
          prune::PrunerOptions().round_to(8));
      const prune::PruneResult r = pruner.step(prune_ratio);
      std::cout << "pruned macs " << r.before.macs << " -> " << r.after.macs << "\n";
    }
    torch::NoGradGuard no_grad;
    train::save_safetensors(out, {{"y", model->forward(x)}});
    if (!export_path.empty()) train::save_safetensors(export_path, *model);
    if (!export_pytorch.empty())
      train::save_for_pytorch(export_pytorch, *model,
                              {"torchvision.models." + model_name,
                               "{\"num_classes\": " + std::to_string(num_classes) + "}",
                               {1, x.size(1), x.size(2), x.size(3)}});
  } catch (const std::exception& e) {
    std::cerr << "ember_pretrained_driver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
