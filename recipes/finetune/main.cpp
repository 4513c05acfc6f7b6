// finetune: a torchvision ResNet or a timm ViT, started from the pretrained
// weights users have (model.pretrained: a safetensors file, a sharded
// checkpoint's index or a folder; train::load_pretrained, strict), fine-tuned
// on an image folder or WebDataset shards (recipe/image_folder.h) with
// ImageNet-style augmentation, label smoothing, warm-up and cosine, and
// written back at the end in the source's own naming (<run.dir>/model.safetensors,
// which torchvision's or timm's model loads with load_state_dict strict, and
// model.json for tools/pytorch/ember_pruned.py: train::save_for_pytorch).
// A classifier for another number of classes is new only when
// model.new_head=true says so; otherwise the file's head must fit. With
// prune.ratio, prune.target_macs or prune.target=latency set, the fine-tuned
// model is then pruned and fine-tuned again (recipe::prune_and_finetune, in
// <run.dir>/finetune) and the export is the pruned model. See README.md.
#include <ember/ember.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "default_config.h"

using namespace ember;

namespace {

bool is_vit(const std::string& arch) {
  return arch.rfind("vit_", 0) == 0;
}

// The ResNet depth model.arch names ("resnet50" -> 50); ember::Error (config) for a name that is
// neither a ResNet's nor a ViT's.
int64_t resnet_depth(const std::string& arch) {
  for (const int64_t depth : {18, 34, 50, 101, 152})
    if (arch == "resnet" + std::to_string(depth)) return depth;
  throw Error(ErrorKind::kConfig,
              "[finetune] model.arch=" + arch +
                  ": resnet18, resnet34, resnet50, resnet101, resnet152 (torchvision's) or "
                  "vit_{tiny,small,base,large}_patch{P}_{size} (timm's)");
}

// The model model.arch names, for `classes` classes.
std::shared_ptr<torch::nn::Module> make_model(const core::Config& c, int64_t classes) {
  const std::string arch = c.get_string("model.arch");
  if (!is_vit(arch))
    return models::ResNet(models::ResNetOptions().depth(resnet_depth(arch)).num_classes(classes)).ptr();
  models::ViTOptions o = models::ViTOptions::preset(arch).num_classes(classes);
  if (c.get_int("model.img_size") > 0) o.img_size(c.get_int("model.img_size"));
  return models::ViT(o).ptr();
}

// Whether the prune.* keys ask for pruning after fine-tuning (prune.ratio is 0 by default here).
bool prunes(const core::Config& c) {
  return c.get_float("prune.ratio") > 0 || c.get_float("prune.target_macs") > 0 ||
         c.get_float("prune.heads") > 0 || c.get_string("prune.target") == "latency";
}

// Refuses before any work (and under --check) an architecture name that is
// none of make_model's, a ViT whose image size is not augment.size, and
// pruning under a layout it cannot run in (recipe::check_prune_finetune_launch).
void check_model(const core::Config& c, int64_t world_size) {
  if (prunes(c)) recipe::check_prune_finetune_launch(c, world_size);
  if (is_vit(c.get_string("model.arch")) && c.get_float("prune.heads") > 0 && c.get_bool("model.export"))
    throw Error(
        ErrorKind::kConfig,
        "[finetune] prune.heads on a ViT: timm builds its attention from num_heads, so an export with "
        "heads removed would not load there; prune channels (prune.ratio or prune.target_macs), or set "
        "model.export=false");
  const std::string arch = c.get_string("model.arch");
  if (c.get_bool("model.new_head") && c.get_string("model.pretrained").empty())
    throw Error(
        ErrorKind::kConfig,
        "[finetune] model.new_head=true starts the classifier new instead of reading it from "
        "model.pretrained, but model.pretrained is \"\": name the weights, or leave model.new_head false");
  if (!is_vit(arch)) {
    resnet_depth(arch);
    if (c.get_int("model.img_size") != 0)
      throw Error(ErrorKind::kConfig, "[finetune] model.img_size is a ViT's (its position table); " + arch +
                                          " takes any image size: leave model.img_size 0");
    return;
  }
  models::ViTOptions o;
  try {
    o = models::ViTOptions::preset(arch);
  } catch (const Error& e) {
    throw Error(ErrorKind::kConfig, std::string("[finetune] model.arch: ") + e.what());
  }
  const int64_t img = c.get_int("model.img_size") > 0 ? c.get_int("model.img_size") : o.img_size();
  const std::vector<double> size = c.get_float_list("augment.size");
  if (img % o.patch_size() != 0 || size.size() != 2 || size[0] != static_cast<double>(img) ||
      size[1] != static_cast<double>(img))
    throw Error(ErrorKind::kConfig,
                fmt::format("[finetune] {} takes {}x{} images (patches of {}): set augment.size=[{}, {}], or "
                            "model.img_size to a multiple of {} equal to augment.size",
                            arch, img, img, o.patch_size(), img, img, o.patch_size()));
}

// The classifier's parameter prefix: what model.new_head starts new.
std::string head_prefix(const std::string& arch) {
  return is_vit(arch) ? "head." : "fc.";
}

// model.pretrained into `model`, strict; the head new when model.new_head.
void load_weights(const core::Config& c, torch::nn::Module& model, const recipe::RunContext& ctx) {
  const std::string path = c.get_string("model.pretrained"), arch = c.get_string("model.arch");
  if (path.empty()) return;
  train::PretrainedOptions o;
  if (is_vit(arch)) o.map(models::ViTImpl::timm_map());  // a position table for another size is resampled
  if (c.get_bool("model.new_head")) o.reinit({head_prefix(arch)});
  train::LoadReport report;
  try {
    report = train::load_pretrained(model, path, o);
  } catch (const Error& e) {
    const std::string what = e.what();
    std::string hint;
    if (!c.get_bool("model.new_head") && what.find("wrong shape: " + head_prefix(arch)) != std::string::npos)
      hint = fmt::format(
          "\n[finetune] a checkpoint for another number of classes needs model.new_head=true (its "
          "{}* tensors are then not read: the classifier starts new)",
          head_prefix(arch));
    if (!c.get_string("trainer.resume").empty())
      hint +=
          "\n[finetune] resuming: the checkpoint holds the weights, so model.pretrained=\"\" skips this file";
    throw Error(e.kind(), what + hint);
  }
  if (ctx.rank() == 0)
    std::cerr << fmt::format(
        "[finetune] model.pretrained: {} tensors from {} file(s) of {}{}{}\n", report.loaded.size(),
        report.files.size(), path,
        report.reinitialised.empty() ? ""
                                     : fmt::format("; new head: {}", fmt::join(report.reinitialised, ", ")),
        report.resized.empty() ? "" : fmt::format("; resampled: {}", fmt::join(report.resized, ", ")));
}

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "finetune";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    recipe::declare_image_folder_data_keys(c, data::ImageFolderOptions({256, 256}));
    recipe::declare_classification_keys(
        c, recipe::ClassificationOptions().batch_size(64).eval_batch_size(128).augment(
               augment::AugmentOptions()
                   .crop(augment::CropMode::kRandomResized)
                   .size({224, 224})
                   .scale({0.08, 1.0})
                   .hflip(0.5)
                   .mean({0.485, 0.456, 0.406})
                   .std({0.229, 0.224, 0.225})));
    c.declare("model.arch", "resnet50",
              "resnet18 | resnet34 | resnet50 | resnet101 | resnet152 (torchvision's names) or "
              "vit_{tiny,small,base,large}_patch{P}_{size} (timm's)");
    c.declare(
        "model.pretrained", "",
        "weights to start from: a .safetensors file, a sharded checkpoint's .index.json or a folder with "
        "either (\"\": the library's initialisation; a resumed run takes its checkpoint's weights)",
        core::OnResume::kMayChange);
    c.declare("model.new_head", false,
              "start the classifier (fc. or head.) new instead of reading it from model.pretrained: for "
              "another number of classes");
    c.declare("model.img_size", 0,
              "ViT: the image size when it differs from model.arch's (the position table is resampled); 0: "
              "the name's",
              core::Bounds::between(0, 1 << 16));
    c.declare("model.export", true,
              "write <run.dir>/model.safetensors at the end, in torchvision's or timm's naming",
              core::OnResume::kMayChange);
    // Pruning after fine-tuning: off unless prune.ratio, prune.target_macs or prune.target=latency says how
    // much.
    recipe::declare_prune_finetune_keys(
        c, prune::PruningCallbackOptions().ratio(0.0).eval(prune::EvalSplit::kTest));
  };
  spec.check = check_model;
  spec.make_model = [](const core::Config& c) {
    return make_model(c, 2);
  };  // refusals before work (dist.sharding)
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    return recipe::image_folder_task(c, ctx, "finetune", [&](int64_t classes) {
      std::shared_ptr<torch::nn::Module> model = make_model(c, classes);
      load_weights(c, *model, ctx);
      if (const auto resnet = std::dynamic_pointer_cast<models::ResNetImpl>(model))
        return torch::nn::AnyModule(models::ResNet(resnet));
      return torch::nn::AnyModule(models::ViT(std::dynamic_pointer_cast<models::ViTImpl>(model)));
    });
  };
  spec.finish = [](train::Task& task, const core::Config& c, const recipe::RunContext& ctx,
                   const train::FitResult& fit, recipe::RunSummary& summary) {
    if (prunes(c)) {
      recipe::prune_and_finetune(task, c, ctx, fit, summary);  // every rank: data-parallel fine-tuning
      if (!summary.stop_reason.empty()) return;                // stopped: no half-tuned export
    }
    if (ctx.rank() != 0 || !c.get_bool("model.export") || ctx.run_dir().empty()) return;
    const std::string arch = c.get_string("model.arch");
    const int64_t classes = dynamic_cast<recipe::ClassificationTask&>(task).num_classes();
    const std::vector<double> size = c.get_float_list("augment.size");
    train::PytorchBuilder builder;
    builder.example_input = {1, 3, static_cast<int64_t>(size.at(0)), static_cast<int64_t>(size.at(1))};
    if (is_vit(arch)) {
      builder.name = "timm.create_model";
      builder.kwargs_json = fmt::format(R"({{"model_name": "{}", "num_classes": {}, "img_size": {}}})", arch,
                                        classes, builder.example_input[2]);
    } else {
      builder.name = "torchvision.models." + arch;
      builder.kwargs_json = fmt::format(R"({{"num_classes": {}}})", classes);
    }
    train::save_for_pytorch(ctx.run_dir(), *task.model(), builder);
    summary.extra["exported_tensors"] =
        static_cast<double>(task.model()->named_parameters().size() + task.model()->named_buffers().size());
    std::cerr << fmt::format(
        "[finetune] wrote {0}/model.safetensors ({1}'s naming) and {0}/model.json "
        "(tools/pytorch/ember_pruned.py builds it in PyTorch)\n",
        ctx.run_dir(), is_vit(arch) ? "timm" : "torchvision");
  };
  spec.finish_on_every_rank = true;  // pruning's fine-tuning is data-parallel; rank 0 exports
  return recipe::run_recipe(argc, argv, spec);
}
